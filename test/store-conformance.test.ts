// The LogStore conformance suite (conformance.ts, shipped for store authors) run against the
// stores of dsh.ts itself: MemoryStore and FileStore. The Durable Object store runs it in
// test/durable-object.test.ts, SqlLogStore in test/sql-store.test.ts (PGlite) and
// test/real-server/postgres.test.ts (PostgreSQL).
import { after, test } from 'node:test'
import assert from 'node:assert/strict'
import { spawnSync } from 'node:child_process'
import { appendFileSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { FileStore, MemoryStore, type SessionEvent } from '../dsh.ts'
import { testLogStore } from '../conformance.ts'

const memory = new Map<string, MemoryStore>()
testLogStore('MemoryStore', (key) => { let s = memory.get(key); if (!s) memory.set(key, s = new MemoryStore()); return s }, {
  secondWriter: 'one instance per log in one process: there is no second writer to refuse',
  tear: 'appends are in memory: there is no half-written event',
  oneInstancePerLog: true,
})

const dir = mkdtempSync(join(tmpdir(), 'dsh-conformance-'))
after(() => rmSync(dir, { recursive: true, force: true }))
testLogStore('FileStore', (key) => new FileStore(join(dir, `${key}.jsonl`)), {
  secondWriter: 'refused',
  // A crash between two writes of one batch: the first line whole, the second cut inside its JSON.
  tear: async (key: string, events: readonly SessionEvent[]) => {
    const second = JSON.stringify(events[1])
    appendFileSync(join(dir, `${key}.jsonl`), JSON.stringify(events[0]) + '\n' + second.slice(0, second.length >> 1))
  },
})

// The suite fails stores that are wrong (test/conformance-broken.ts): each defect, the cases it fails.
const FAILS: Record<string, number[]> = {
  'utf8-lossy': [1, 8], // lone surrogates lost; and it has no lock
  'loses-last-batch': [1, 6, 7, 8, 9],
  'no-second-writer-check': [8],
  'torn-line-kept': [4, 8],
}
for (const [broken, cases] of Object.entries(FAILS)) {
  test(`conformance: a store with the defect "${broken}" fails cases ${cases.join(', ')} and only those`, () => {
    const here = dirname(fileURLToPath(import.meta.url))
    const env: Record<string, string | undefined> = { ...process.env, BROKEN: broken }
    delete env.NODE_TEST_CONTEXT
    const run = spawnSync(process.execPath, ['--import', 'tsx', '--test', join(here, 'conformance-broken.ts')], { env, encoding: 'utf8' })
    const failed = [...run.stdout.matchAll(/^ {4}not ok (\d+) - /gm)].map((m) => Number(m[1]))
    assert.deepEqual(failed, cases, run.stdout.slice(-3000))
    assert.equal(run.status, 1)
  })
}

// A load reads the next 4 MiB chunk while it parses this one (FileStore's line reader reads ahead),
// and lines that span chunks arrive whole, in order, at the right offsets.
test('FileStore.scan reads the next chunk while the caller parses this one; lines across chunks are whole', async () => {
  const file = join(dir, 'read-ahead.jsonl')
  const text = 'x'.repeat(300_000) + '北京 😊'
  const events: SessionEvent[] = []
  for (let seq = 0; seq < 40; seq++) events.push({ seq, type: 'user/message', time: seq, data: { message: { role: 'user', content: `${seq}:${text}` }, surfaceOp: { op: 'append' } } } as SessionEvent)
  writeFileSync(file, events.map((e) => JSON.stringify(e) + '\n').join(''))
  const { open } = await import('node:fs/promises')
  const probe = await open(file, 'r')
  const FileHandle = probe.constructor as { prototype: { read: (...a: unknown[]) => Promise<unknown> } }
  await probe.close()
  const read = FileHandle.prototype.read
  let inFlight = 0, reads = 0
  FileHandle.prototype.read = function (this: unknown, ...a: unknown[]) {
    inFlight++; reads++
    return read.apply(this, a).finally(() => { inFlight-- })
  }
  const seen: number[] = []
  const inFlightWhileParsing: number[] = []
  try {
    await new FileStore(file, { readOnly: true }).scan((e) => {
      seen.push(e.seq)
      assert.equal((e.data as { message: { content: string } }).message.content, `${e.seq}:${text}`)
      inFlightWhileParsing.push(inFlight)
    })
  } finally { FileHandle.prototype.read = read }
  assert.deepEqual(seen, events.map((e) => e.seq))
  assert.equal(reads, 3, 'a 12 MB log is 3 reads of 4 MiB')
  assert.ok(inFlightWhileParsing.filter((n) => n > 0).length >= 20, `a read was in flight while most lines were parsed: ${inFlightWhileParsing.join(' ')}`)
})
