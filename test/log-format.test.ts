// The log says its format (docs/design.md §14): `session/start {format: 1}`; a log written by dsh at
// e9ce0b5 (test/logs/e9ce0b5.jsonl, made by test/logs/record-e9ce0b5.ts: prunes, clears, a pin, an
// overflow recovered by a checkpoint, calibration samples, a tool call left open) has no format, is
// read as format 1, and resumes exactly as that commit resumed it (test/logs/e9ce0b5.expected.json,
// derived by `derive` below from e9ce0b5's own dsh.ts); a log of a newer format is refused.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { createHash } from 'node:crypto'
import { copyFileSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join, resolve } from 'node:path'
import * as dsh from '../dsh.ts'
import { FileStore, MemoryStore, Session, SessionError, Pins, CostLedger, RecallIndex } from '../dsh.ts'

const LOG = new URL('./logs/e9ce0b5.jsonl', import.meta.url)
const EXPECTED = new URL('./logs/e9ce0b5.expected.json', import.meta.url)

/** Resumes a copy of the e9ce0b5 log with `lib` (a dsh.ts module) and returns what it derives. */
async function derive(lib: typeof dsh): Promise<Record<string, unknown>> {
  const dir = mkdtempSync(join(tmpdir(), 'dsh-e9-'))
  try {
    const file = join(dir, 'log.jsonl')
    copyFileSync(LOG, file)
    const before = readFileSync(file, 'utf8').trim().split('\n').length
    const store = new lib.FileStore(file)
    const session = await lib.Session.open(store, { now: () => 1_796_000_000_000 })
    const appended: unknown[] = []
    for await (const e of session.readEvents(before)) appended.push({ type: e.type, data: e.data })
    const m = session.measure()
    const old = session as any
    // e9ce0b5 had these on Session itself, 1b39f7d as session.cost / session.recall (RECORD_E9CE0B5 runs this
    // function on that commit's code); now they are parts over the log.
    const cost = typeof old.usage === 'function' ? old : old.cost ?? CostLedger.of(session)
    const recall = typeof old.shadowedSeqs === 'function' ? old : old.recall ?? RecallIndex.of(session)
    const out = {
      appended, seq: session.seq, replaceGeneration: session.replaceGeneration, turn: session.turn,
      measure: { totalTokens: m.totalTokens, envelopeTokens: m.envelopeTokens, surfaceTokens: m.surfaceTokens, anchored: m.anchored, calibration: m.calibration, calibrationSamples: m.calibrationSamples },
      surfaceSeqs: session.surface().map((n) => n.seq),
      messagesSha256: createHash('sha256').update(JSON.stringify(session.messages())).digest('hex'),
      usage: cost.usage(),
      pinnedSeqs: typeof old.pinnedSeqs === 'function' ? old.pinnedSeqs() : (old.pins ?? Pins.of(session)).seqs(),
      shadowedSeqs: [...recall.shadowedSeqs()],
      nextRequestCache: cost.nextRequestCache(),
    }
    await store.close()
    return JSON.parse(JSON.stringify(out))
  } finally { rmSync(dir, { recursive: true, force: true }) }
}

test('a new log starts with session/start {id, version, format: 1}', async () => {
  const store = new MemoryStore()
  await Session.open(store, { id: 's1' })
  assert.deepEqual(store.events[0].data, { id: 's1', version: dsh.VERSION, format: 1 })
})

test('a log written by e9ce0b5 (no format) resumes as that commit resumed it', async () => {
  if (process.env.RECORD_E9CE0B5) {
    writeFileSync(EXPECTED, JSON.stringify(await derive(await import(resolve(process.env.RECORD_E9CE0B5))), null, 1) + '\n')
  }
  const expected = JSON.parse(readFileSync(EXPECTED, 'utf8'))
  const got = await derive(dsh)
  assert.deepEqual(got, expected)
  assert.equal((got.appended as { type: string }[])[1].type, 'tool/result') // call_5 repaired: TOOL_OUTCOME_UNKNOWN
})

test('a log of a newer format is refused on load, with both formats and the fix, and left unchanged', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'dsh-format-'))
  try {
    const file = join(dir, 'log.jsonl')
    const text = `${JSON.stringify({ seq: 0, type: 'session/start', time: 1, data: { id: 'x', version: '9.0.0', format: 2 } })}\n`
    writeFileSync(file, text)
    await assert.rejects(Session.open(new FileStore(file)), (e) => e instanceof SessionError && e.code === 'LOG_CORRUPT'
      && /format 2/.test(e.message) && /reads format 1/.test(e.message) && /newer dsh/.test(e.message))
    assert.equal(readFileSync(file, 'utf8'), text)
  } finally { rmSync(dir, { recursive: true, force: true }) }
})
