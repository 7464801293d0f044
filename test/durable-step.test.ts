// What a durable step spends beyond its write and its fsync (bench/durable.bench.ts measures it):
// the header of the request is serialised once per step (to compare it with the one logged), not
// twice, and a header that changed is logged once and compared by its own text from then on; a
// FileStore encodes appends and reads events back into one scratch buffer, not a new one each time. And what a
// step is durable for: its appends land in seq order, its summary requests go out only once it is written.
import { describe, test } from 'node:test'
import assert from 'node:assert/strict'
import { mkdtempSync, readFileSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { Agent, FileStore, MemoryStore, Session, type ChatRequest, type Provider, type SessionEvent } from '../dsh.ts'
import { FLASH, ScriptedProvider, call, say } from './scripted-provider.ts'

const readTool = { name: 'read_file', description: 'reads a file', parameters: { type: 'object' }, execute: () => 'x'.repeat(100) }
const isHeader = (v: unknown): boolean => typeof v === 'object' && v !== null && 'baseURL' in v && 'model' in v && 'tools' in v

test('a step serialises the request header once, and logs it only when it changed', async () => {
  const session = await Session.open(new MemoryStore())
  const provider = new ScriptedProvider(32_000, [call('c1', 'read_file'), call('c2', 'read_file'), call('c3', 'read_file'), say('done'), say('again')])
  const agent = new Agent({ session, provider, tools: [readTool] })
  const stringify = JSON.stringify
  let headerStringifies = 0
  JSON.stringify = function (this: unknown, value: unknown, ...rest: unknown[]) {
    if (isHeader(value)) headerStringifies++
    return (stringify as (...a: unknown[]) => string).call(JSON, value, ...rest)
  } as typeof JSON.stringify
  let steps = 0
  try {
    steps += (await agent.run('read three files')).steps
    steps += (await agent.run('once more')).steps
  } finally { JSON.stringify = stringify }
  assert.equal(steps, 5)
  // One per step, plus one per turn start (the turn-start pressure check prices the envelope); never twice in a row.
  assert.equal(headerStringifies, steps + 2)
  let headers = 0
  for await (const e of session.readEvents()) if (e.type === 'request/header') headers++
  assert.equal(headers, 1, 'an unchanged header is logged once')
})

test('a changed header is logged once more, then compared with the new one', async () => {
  const session = await Session.open(new MemoryStore())
  const run = async (system: string) => { await new Agent({ session, provider: new ScriptedProvider(32_000, [say('ok')]), tools: [readTool], system }).run('hi') }
  await run('one'); await run('one'); await run('two'); await run('two'); await run('one')
  const systems: string[] = []
  for await (const e of session.readEvents()) if (e.type === 'request/header') systems.push((e.data as { system: string }).system)
  assert.deepEqual(systems, ['one', 'two', 'one'])
})

const event = (seq: number, text = `m${seq}`) => ({ seq, type: 'user/message', time: 1, data: { message: { role: 'user', content: text }, surfaceOp: { op: 'append' } } }) as SessionEvent

describe('FileStore encodes appends into one scratch buffer and reads events back into it', () => {
  const tempFile = () => join(mkdtempSync(join(tmpdir(), 'dsh-scratch-')), 's.jsonl')

  test('appends and read-backs after the first allocate no byte buffer of their own', async () => {
    const store = new FileStore(tempFile())
    await store.load()
    await store.append([event(0)])
    await store.readEvent(0)
    const Real = globalThis.Uint8Array
    let made = 0
    globalThis.Uint8Array = new Proxy(Real, { construct(target, args, newTarget) { made++; return Reflect.construct(target, args, newTarget) } })
    try {
      for (let seq = 1; seq <= 100; seq++) { await store.append([event(seq, '北京 😊 '.repeat(seq))]); assert.equal(((await store.readEvent(seq)).data as any).message.content, '北京 😊 '.repeat(seq)) }
    } finally { globalThis.Uint8Array = Real }
    assert.equal(made, 0)
    await store.close()
  })

  test('a write that awaits keeps its bytes: a read-back meanwhile gets a buffer of its own', async () => {
    let release!: () => void
    const gate = new Promise<void>((r) => { release = r })
    let slow = false
    class SlowStore extends FileStore {
      protected override async write(bytes: Uint8Array): Promise<void> {
        if (slow) { slow = false; const copy = bytes.slice(); await gate; assert.deepEqual(bytes, copy, 'the bytes of a write in flight are not overwritten'); return super.write(bytes) }
        return super.write(bytes)
      }
    }
    const file = tempFile()
    const store = new SlowStore(file)
    await store.load()
    await store.append([event(0, 'a'.repeat(500))])
    slow = true
    const first = store.append([event(1, 'b'.repeat(900))])
    const read = await store.readEvent(0)
    assert.equal((read.data as any).message.content, 'a'.repeat(500))
    release()
    await first
    await store.append([event(2, 'c'.repeat(100))])
    const lines = readFileSync(file, 'utf8').trim().split('\n').map((l) => JSON.parse(l).data.message.content)
    assert.deepEqual(lines, ['a'.repeat(500), 'b'.repeat(900), 'c'.repeat(100)])
    await store.close()
  })

  test('an append queued behind one that fails is refused whole; both appended again land in seq order', async () => {
    let release!: () => void
    const gate = new Promise<void>((r) => { release = r })
    let failNext = false
    class FullDiskStore extends FileStore {
      protected override async write(bytes: Uint8Array): Promise<void> {
        if (failNext) { failNext = false; await gate; throw Object.assign(new Error('no space left'), { code: 'ENOSPC' }) }
        return super.write(bytes)
      }
    }
    const file = tempFile()
    const store = new FullDiskStore(file)
    await store.load()
    await store.append([event(0, 'a')])
    failNext = true
    const first = store.append([event(1, 'b')])
    const second = store.append([event(2, 'c')]) // made while the first one's write awaits
    release()
    const outcomes = await Promise.allSettled([first, second])
    const errors = outcomes.map((o) => (o.status === 'rejected' ? [o.reason.code, /disk full|seq 2 not appended/.test(o.reason.message)] : 'ok'))
    assert.deepEqual(errors, [['STORE', true], ['STORE', true]])
    assert.equal(readFileSync(file, 'utf8').trim().split('\n').length, 1) // the second did not land after a gap
    await store.append([event(1, 'b')]) // the retry, once both settled, starts afresh
    await store.append([event(2, 'c')])
    const lines = readFileSync(file, 'utf8').trim().split('\n').map((l) => JSON.parse(l).seq)
    assert.deepEqual(lines, [0, 1, 2])
    await store.close()
  })
})

// From the hostile reviews rev5 (FileStore) and rev6 (the count near the window).
/** A FileStore whose next write waits `delayMs` first (FileStore documents that a subclass's write may await). */
class SlowWriteStore extends FileStore {
  delayNextMs = 0
  protected override async write(bytes: Uint8Array): Promise<void> {
    const ms = this.delayNextMs
    this.delayNextMs = 0
    if (ms > 0) await new Promise((resolve) => setTimeout(resolve, ms))
    return super.write(bytes)
  }
}

test('FileStore: an append made while the previous write awaits never lands before it (the log keeps seq order)', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'dsh-order-'))
  try {
    const log = join(dir, 's.jsonl')
    const store = new SlowWriteStore(log)
    await store.append([{ seq: 0, time: 1, type: 'session/start', data: { id: 's', version: '0.1.0', format: 1 } }])
    store.delayNextMs = 30
    // LogStore: "append receives events in seq order" — these calls are made in seq order, the first one's write slow.
    const results = await Promise.allSettled([store.append([event(1)]), store.append([event(2)])])
    const seqs = readFileSync(log, 'utf8').split('\n').filter(Boolean).map((l) => (JSON.parse(l) as { seq: number }).seq)
    await store.close()
    // Either both landed in order, or the later one was refused and the file is a prefix of the log.
    assert.deepEqual(seqs, seqs.map((_, i) => i), `the file holds seqs ${JSON.stringify(seqs)} after `
      + JSON.stringify(results.map((r) => (r.status === 'rejected' ? String(r.reason?.message).slice(0, 60) : 'ok'))))
    await Session.open(new FileStore(log), { readOnly: true }) // and the log loads
  } finally { rmSync(dir, { recursive: true, force: true }) }
})

test('durability: a summary the provider\'s count near the window asks for is sent after its step is written to the store', async () => {
  // A conversation request is sent only once its step/start is written ("a crash mid-request still shows the step it
  // was in"), and the post-step ladder flushes before it may call a model. The count near the window relieves
  // pressure between the step's start and its flush: its summary requests go out while the store holds nothing of
  // the step (step/start, request/header, the count's sample, compaction/start). A crash then leaves a log that never
  // shows the requests were made.
  const store = new MemoryStore()
  const seen: Array<[number, number]> = []
  const provider: Provider = { model: 'm', baseURL: 'memory://count', contextWindow: 10_000, maxTokens: 100, prices: FLASH,
    complete: async (r: ChatRequest) => {
      if (r.headers?.['x-dsh-purpose'] === 'compaction') {
        seen.push([store.events.filter((e) => e.type === 'step/start').length, session.events.filter((e) => e.type === 'step/start').length])
        return { message: { role: 'assistant', content: [{ type: 'text', text: 'summary' }] }, finishReason: 'stop' }
      }
      return { message: { role: 'assistant', content: [{ type: 'text', text: 'ok: a short reply' }] }, finishReason: 'stop' }
    },
    countTokens: async () => 12_000 } as Provider
  const session = await Session.open(store)
  const agent = new Agent({ session, provider, compaction: { thresholdRatio: 0.95 } })
  for (let i = 1; i <= 5; i++) await agent.run(`turn ${i} ` + String(i).repeat(7_200))
  assert.ok(seen.length > 0, 'the count asked for a summary')
  // Observed: [4, 5] for each: the fifth step is in memory only.
  assert.deepEqual(seen.filter(([written, appended]) => written < appended), [])
})

// Session.replaceNodes copies its seq → node index now and then (a Map with steady deletes kept
// replaced messages alive through young-generation GCs: a 1 GiB resume spent 3× the floor's GC
// time). The index and the surface's node(seq) stay right across the copies.
test('the surface index stays right across many replaces and its copies', async () => {
  const session = await Session.open(new MemoryStore())
  let head = -1
  const replaced: number[] = []
  for (let i = 0; i < 300; i++) {
    const a = session.append('user/message', { message: { role: 'user', content: `q${i}` }, surfaceOp: { op: 'append' } })
    const b = session.append('user/message', { message: { role: 'user', content: `r${i}` }, surfaceOp: { op: 'append' } })
    if (i % 10 === 9 && i < 299) continue // some turns stay on the surface until the next checkpoint replaces them
    const start = head >= 0 ? head : a.seq
    head = session.append('user/message', { message: { role: 'user', content: `checkpoint ${i}` }, surfaceOp: { op: 'replace', start, end: b.seq } }).seq
    replaced.push(a.seq, b.seq)
    assert.equal(session.surface().length, 1)
  }
  const surface = session.surface()
  for (const n of surface) assert.equal(surface.node(n.seq), n)
  assert.equal(surface.node(head)?.message.content, 'checkpoint 299')
  for (const seq of replaced) assert.equal(surface.node(seq), undefined)
  assert.equal(session.surface().length, 1)
})

// A step boundary's fsync runs while the next step is prepared (docs/design.md §4): one at a time, a failed one fails
// the step after it, and run() resolves only once the turn's own fsync is done.
describe('the fsync of a step boundary runs while the next step is prepared', () => {
  /** A store whose fsyncs take `ms` and are recorded: when each started and ended, and how many events it covered. */
  class SlowSyncStore extends MemoryStore {
    inFlight = 0
    overlapped = 0
    synced = 0
    failAt?: number
    calls = 0
    constructor(private readonly ms: number) { super() }
    async sync(): Promise<void> {
      const n = ++this.calls
      if (++this.inFlight > 1) this.overlapped++
      const covered = this.events.length
      await new Promise((resolve) => setTimeout(resolve, this.ms))
      this.inFlight--
      if (n === this.failAt) throw new Error('EIO: write-back failed')
      this.synced = covered
    }
  }
  const echo = { name: 'echo', description: 'echoes', parameters: { type: 'object' }, execute: () => 'ok' }

  test('a turn of steps: one fsync per step, never two at once, and the whole turn synced when run() resolves', async () => {
    const store = new SlowSyncStore(50)
    const session = await Session.open(store)
    const before = store.calls
    const provider = new ScriptedProvider(100_000, [call('c1', 'echo'), call('c2', 'echo'), call('c3', 'echo'), say('done')])
    let ranDuringSync = 0
    const tool = { ...echo, execute: () => { if (store.inFlight > 0) ranDuringSync++; return 'ok' } }
    const result = await new Agent({ session, provider, tools: [tool] }).run('go')
    assert.equal(result.steps, 4)
    assert.equal(ranDuringSync, 2, 'the tools of steps 2 and 3 ran while the boundary before them was fsynced')
    assert.equal(store.calls - before, 4)
    assert.equal(store.overlapped, 0, 'an fsync starts only after the last one ended')
    assert.equal(store.inFlight, 0)
    assert.equal(store.synced, store.events.length, 'the turn\'s last fsync covered every event, turn/end included')
    assert.equal(store.events.at(-1)!.type, 'turn/end')
  })

  test('a failed fsync fails the turn with the store\'s error, at the step after it at the latest', async () => {
    const store = new SlowSyncStore(2)
    const session = await Session.open(store)
    store.failAt = store.calls + 1 // the first step's boundary
    const provider = new ScriptedProvider(100_000, [call('c1', 'echo'), call('c2', 'echo'), call('c3', 'echo'), say('done')])
    await assert.rejects(new Agent({ session, provider, tools: [echo] }).run('go'), /EIO: write-back failed/)
    assert.ok(provider.requests.length <= 2, `at most one more request after the failed fsync, got ${provider.requests.length}`)
    assert.equal(store.inFlight, 0, 'no fsync is left running')
    const types = store.events.map((e) => e.type)
    assert.equal(types.at(-1), 'turn/end', 'the turn is closed in the log')
  })

  test('a failed fsync of a turn\'s end fails that turn only: the next turn on a healthy disk succeeds', async () => {
    const store = new SlowSyncStore(2)
    const session = await Session.open(store)
    store.failAt = store.calls + 2 // the first turn's steps: one call and its answer
    const provider = new ScriptedProvider(100_000, [call('c1', 'echo'), say('done'), say('again')])
    const agent = new Agent({ session, provider, tools: [echo] })
    await assert.rejects(agent.run('go'), /EIO: write-back failed/)
    const next = await agent.run('once more')
    assert.equal(next.text, 'again')
    assert.equal(store.synced, store.events.length)
  })
})
