// The LogStore conformance suite: what every session store of dsh.ts must do, as node:test cases,
// for people who write a store (docs/design.md §4 "Stores"). It ships beside dsh.ts:
//
//   import { testLogStore } from './conformance.ts'      // from the package: 'dsh.ts/conformance.ts'
//   testLogStore('MyStore', (key) => new MyStore(key), { secondWriter: 'refused' })
//
// and runs with `node --import tsx --test my-store.test.ts`.
// `makeStore(key)` returns a store on the log named `key`: each call a new instance over the same log
// (a test closes one before it opens the next, unless it is about two writers). The cases: append/load
// round trips, streaming `scan`, `readEvent(s)`, torn or partial writes, artefacts, reopen after
// close, 10,000 events, a second writer refused, a session resumed across two store instances.
// `capabilities` says what a store cannot offer; those cases are skipped with the reason given.
import { describe, test } from 'node:test'
import assert from 'node:assert/strict'
import { Session, SessionError, type LogStore, type Message, type SessionEvent, internals } from './dsh.ts'

const { stateOf } = internals

/** What a store may not offer, and the hooks the suite needs to reach its insides. */
export interface LogStoreCapabilities {
  /**
   * `'refused'`: while one store writes a log, a second store on it is refused with
   * `SessionError('SESSION_LOCKED')` at its load or, at the latest, at one of the two writers' next append.
   * Otherwise the reason the store has no second writer to refuse (e.g. "one instance per log:
   * MemoryStore"; "the Durable Object runs one request at a time"); that case is then skipped.
   */
  secondWriter: 'refused' | string
  /**
   * Writes `events` (they continue the log's seqs) the way a crash in the middle of an append
   * leaves them: cut short, or not at all, or committed without the writer hearing of it. Must
   * leave the log openable (any lock given back). A string: why the store has no partial writes
   * (e.g. "each append is one atomic put"); the case is then skipped.
   */
  tear: ((key: string, events: readonly SessionEvent[]) => Promise<void>) | string
  /** Two `makeStore(key)` calls give one shared instance (a MemoryStore): instance-crossing checks are skipped. */
  oneInstancePerLog?: boolean
}

/** Events a store must round-trip exactly: text that tends to break encoders. */
const TRICKY = ['', 'plain', 'NUL \u0000 inside', 'lone surrogates \ud800 and \udfff', 'astral 😀👍🏽 and \u2028\u2029',
  'quotes " \\ \' and </script>', 'é'.repeat(40_000), '{"seq":1,"type":"not a real event"}\n{"seq":2']

let keys = 0
/** A fresh log key per case: one backing database or directory can serve the whole suite. */
const freshKey = (name: string, what: string) =>
  `${name.toLowerCase().replace(/[^a-z0-9]+/g, '-')}-${what}-${process.pid}-${Date.now().toString(36)}-${keys++}`

const user = (text: string): Message => ({ role: 'user', content: text })
const say = (text: string): Message => ({ role: 'assistant', content: [{ type: 'text', text }] })

/** Appends a user and an assistant message; returns the seq of the user message. */
function exchange(session: Session, question: string, answer: string): number {
  const { seq } = session.append('user/message', { message: user(question), surfaceOp: { op: 'append' } })
  session.append('assistant/message', { message: say(answer), finishReason: 'stop', surfaceOp: { op: 'append' } })
  return seq
}

/** The whole log of a store, by `load()` (plain JSON, as a store that serialises gives it back). */
async function loaded(store: LogStore): Promise<SessionEvent[]> { return (await store.load()).events }

/** JSON round trip: what a serialising store returns for `events`. */
const asStored = (events: readonly SessionEvent[]) => JSON.parse(JSON.stringify(events)) as SessionEvent[]

const isLocked = (err: unknown) => err instanceof SessionError && err.code === 'SESSION_LOCKED'

/** Contiguous seqs from 0, and the log replays through Session (every invariant re-checked). */
async function assertValidLog(store: LogStore): Promise<SessionEvent[]> {
  const events = await loaded(store)
  assert.deepEqual(events.map((e) => e.seq), events.map((_, i) => i), 'seqs are contiguous from 0')
  const replayed = await Session.open(store, { readOnly: true })
  assert.equal(replayed.seq, events.length)
  return events
}

/**
 * Registers the conformance cases for a store as one `describe(name)` of node:test cases.
 * @param makeStore a new store on the log named `key` (keys are `[a-z0-9-]`, ≤ 100 characters).
 */
export function testLogStore(name: string, makeStore: (key: string) => LogStore | Promise<LogStore>,
  capabilities: LogStoreCapabilities): void {
  const open = async (key: string) => await makeStore(key)
  const close = async (store: LogStore) => { await store.close?.() }
  /** The whole log of `key`, checked (contiguous seqs), by a store opened for it and closed again. */
  const readLog = async (key: string) => {
    const store = await open(key)
    try { return await assertValidLog(store) } finally { await close(store) }
  }
  const instanceSkip = capabilities.oneInstancePerLog ? 'one instance per log: nothing crosses instances' : false

  describe(`LogStore conformance: ${name}`, () => {
    test('append/load round trip: batches of 1, 3 and 0 events come back exactly, text of every kind intact', async () => {
      const key = freshKey(name, 'roundtrip')
      const store = await open(key)
      assert.deepEqual(await loaded(store), [], 'a new log is empty')
      const events: SessionEvent[] = [{ seq: 0, type: 'session/start', time: 1_700_000_000_000, data: { id: key, version: '0.1.0' } }]
      for (const text of TRICKY) {
        events.push({ seq: events.length, type: 'user/message', time: 1_700_000_000_001 + events.length,
          data: { message: { role: 'user', content: [{ type: 'text', text }] }, surfaceOp: { op: 'append' } } })
      }
      events.push({ seq: events.length, type: 'custom/type', time: 0, data: { nested: { list: [1, -2.5, null, true, 'x'] } } })
      await store.append(events.slice(0, 1))
      await store.append(events.slice(1, 4))
      await store.append([])
      await store.append(events.slice(4))
      await store.sync?.()
      assert.deepEqual(await loaded(store), asStored(events))
      await close(store)
      const again = await open(key)
      assert.deepEqual(await loaded(again), asStored(events), 'a store opened anew reads the same log')
      await close(again)
    })

    test('streaming scan: every event once, in seq order, the same as load(); a Session keeps only its surface', async (t) => {
      const key = freshKey(name, 'scan')
      const store = await open(key)
      if (!store.scan) { await close(store); t.skip('no scan(): a Session on this store keeps its whole log in memory'); return }
      const session = await Session.open(store, { id: key })
      for (let i = 0; i < 50; i++) exchange(session, `question ${i}`, `answer ${i}`)
      await session.sync()
      await close(store)
      const reader = await open(key)
      const seen: SessionEvent[] = []
      const { torn } = await reader.scan!((e) => { seen.push(e) })
      assert.equal(torn, undefined)
      assert.deepEqual(seen.map((e) => e.seq), Array.from({ length: 101 }, (_, i) => i))
      assert.deepEqual(seen, await loaded(reader))
      await close(reader)
      const resumed = await Session.open(await open(key))
      assert.equal((() => { try { resumed.events; return true } catch { return false } })(), !(reader.readEvent && reader.readEvents), 'readable ⇔ only the surface in memory')
      assert.equal(resumed.messages().length, 100)
      await close(resumed.store)
    })

    test('readEvent(s): any seq and range read back, ranges clipped at the end, unknown seqs refused', async (t) => {
      const key = freshKey(name, 'read')
      const store = await open(key)
      if (!store.readEvent || !store.readEvents) { await close(store); t.skip('no readEvent/readEvents'); return }
      const session = await Session.open(store, { id: key })
      for (let i = 0; i < 30; i++) exchange(session, `q${i} ${TRICKY[i % TRICKY.length]}`, `a${i}`)
      await session.sync()
      const all = await loaded(store)
      const range = async (from: number, to: number) => { const out = []; for await (const e of store.readEvents!(from, to)) out.push(e); return out }
      assert.deepEqual(await store.readEvent(0), all[0])
      assert.deepEqual(await store.readEvent(37), all[37])
      assert.deepEqual(await store.readEvent(60), all[60])
      assert.deepEqual(await range(10, 14), all.slice(10, 14))
      assert.deepEqual(await range(55, 1_000), all.slice(55), 'clipped at the end of the log')
      assert.deepEqual(await range(20, 20), [])
      assert.deepEqual(await range(0, Infinity), all)
      await assert.rejects(store.readEvent(61), SessionError, 'a seq past the end')
      await assert.rejects(store.readEvent(-1), SessionError)
      await close(store)
    })

    test('torn or partial write: a crash mid-append leaves whole events only; resume continues the seqs', { skip: typeof capabilities.tear === 'string' ? capabilities.tear : false }, async () => {
      const key = freshKey(name, 'torn')
      const first = await Session.open(await open(key), { id: key })
      exchange(first, 'before the crash', 'kept')
      await first.sync()
      await close(first.store)
      const before = await readLog(key)
      const next: SessionEvent[] = [
        { seq: before.length, type: 'user/message', time: 1, data: { message: user('cut 1'), surfaceOp: { op: 'append' } } },
        { seq: before.length + 1, type: 'assistant/message', time: 2, data: { message: say('cut 2 ' + 'x'.repeat(5_000)), finishReason: 'stop', surfaceOp: { op: 'append' } } },
        { seq: before.length + 2, type: 'user/message', time: 3, data: { message: user('cut 3'), surfaceOp: { op: 'append' } } },
      ]
      await (capabilities.tear as (key: string, events: readonly SessionEvent[]) => Promise<void>)(key, next)
      const store = await open(key)
      const session = await Session.open(store)
      const after = await loaded(store)
      const resumeAt = after.findIndex((e, i) => i >= before.length && e.type === 'session/resume')
      assert.ok(resumeAt >= before.length, 'the reopened session wrote session/resume after the old events')
      assert.deepEqual(after.slice(0, before.length), before, 'nothing written before the crash is lost')
      assert.deepEqual(after.slice(before.length, resumeAt), asStored(next).slice(0, resumeAt - before.length), 'only whole events of the torn batch, in order')
      exchange(session, 'after the crash', 'continues')
      await session.sync()
      await close(store)
      const final = await readLog(key)
      assert.deepEqual(final.slice(0, after.length), after)
      assert.deepEqual(final.slice(after.length).map((e) => e.type), ['user/message', 'assistant/message'])
    })

    test('artefacts: 300 KB with astral characters and NUL round-trip, overwrite by name, survive a reopen; an unknown ref is refused by name', async (t) => {
      const key = freshKey(name, 'artefacts')
      const store = await open(key)
      if (!store.putArtefact || !store.getArtefact) { await close(store); t.skip('no artefacts: spilled tool results stay in the log'); return }
      await Session.open(store, { id: key }) // a store may want its lease or lock before writing
      const text = 'a😀\u0000\n'.repeat(60_000)
      const ref = await store.putArtefact('tool-result-7.txt', text)
      assert.equal(typeof ref, 'string')
      assert.equal(await store.getArtefact(ref), text)
      const ref2 = await store.putArtefact('tool-result-7.txt', 'replaced')
      assert.equal(await store.getArtefact(ref2), 'replaced')
      const other = await store.putArtefact('tool-result-9.txt', 'nine')
      await close(store)
      const again = await open(key)
      await loaded(again)
      assert.equal(await again.getArtefact!(other), 'nine')
      const missing = ref.replace('tool-result-7.txt', 'tool-result-404.txt')
      await assert.rejects(again.getArtefact!(missing), (err: Error) => err.message.includes(missing))
      await close(again)
    })

    test('reopen after close: the session resumes with its id, surface and seqs', async () => {
      const key = freshKey(name, 'reopen')
      const first = await Session.open(await open(key), { id: key })
      exchange(first, 'one', 'two')
      exchange(first, 'three', 'four')
      await first.sync()
      const messages = structuredClone(first.messages())
      const seq = first.seq
      await close(first.store)
      const second = await Session.open(await open(key))
      assert.equal(((await second.readEvent(0)).data as { id: string }).id, key)
      assert.deepEqual(second.messages(), messages)
      assert.equal(stateOf(second).openedAt, seq, 'session/resume is the next seq')
      assert.equal(second.seq, seq + 1)
      exchange(second, 'five', 'six')
      await second.sync()
      await close(second.store)
      const events = await readLog(key)
      assert.deepEqual(events.map((e) => e.type), ['session/start', 'user/message', 'assistant/message', 'user/message',
        'assistant/message', 'session/resume', 'user/message', 'assistant/message'])
    })

    test('10,000 events in batches of 100: reloaded whole and contiguous, old events read back', async () => {
      const key = freshKey(name, 'ten-thousand')
      const session = await Session.open(await open(key), { id: key })
      for (let i = 0; i < 5_000; i++) {
        exchange(session, `question ${i}`, `answer ${i}`)
        if (i % 50 === 49) await stateOf(session).flush()
      }
      await session.sync()
      await close(session.store)
      const store = await open(key)
      const reopened = await Session.open(store)
      assert.equal(stateOf(reopened).openedAt, 10_001)
      assert.equal(reopened.messages().length, 10_000)
      const events = await assertValidLog(store)
      assert.equal(events.length, 10_002)
      assert.deepEqual((events[9_999].data as { message: Message }).message, user('question 4999'))
      const back = await reopened.readEvent(5_002)
      assert.deepEqual((back.data as { message: Message }).message, say('answer 2500'))
      await close(store)
    })

    test('a second writer is refused: SESSION_LOCKED at its load or at the next append, and the log holds one writer\'s events', { skip: capabilities.secondWriter === 'refused' ? instanceSkip : capabilities.secondWriter }, async () => {
      const key = freshKey(name, 'two-writers')
      const a = await Session.open(await open(key), { id: key })
      exchange(a, 'writer A', 'first')
      await a.sync()
      let b: Session | undefined
      try { b = await Session.open(await open(key)) } catch (err) {
        assert.ok(isLocked(err), `the second load failed with ${err}, not SessionError('SESSION_LOCKED')`)
      }
      if (b === undefined) {
        // Refused at load: A goes on writing; B wrote nothing.
        exchange(a, 'writer A again', 'second')
        await a.sync()
      } else {
        // B took the log over (a store that checks at append time): A's next append is refused.
        exchange(a, 'writer A refused', 'never stored')
        await assert.rejects(a.sync(), isLocked)
        exchange(b, 'writer B', 'after A')
        await b.sync()
        await close(b.store)
      }
      await close(a.store)
      const events = await readLog(key)
      const texts = events.filter((e) => e.type === 'user/message').map((e) => (e.data as { message: Message }).message.content)
      assert.deepEqual(texts, b === undefined ? ['writer A', 'writer A again'] : ['writer A', 'writer B'])
    })

    test('a session resumed across two store instances: the crashed turn is closed, the dispatched call marked unknown', { skip: instanceSkip }, async () => {
      const key = freshKey(name, 'resume')
      const first = await Session.open(await open(key), { id: key })
      first.append('turn/start', { turn: 1 })
      first.append('user/message', { message: user('run the tests'), surfaceOp: { op: 'append' } })
      first.append('step/start', { turn: 1, step: 1 })
      first.append('assistant/message', { message: { role: 'assistant', content: [{ type: 'tool-call', id: 'call_1', name: 'shell', arguments: '{}' }] },
        finishReason: 'tool_calls', surfaceOp: { op: 'append' } })
      first.append('tool/call', { callId: 'call_1', name: 'shell' })
      await stateOf(first).flush() // the dispatch record is stored; then the worker stops without a word
      const acknowledged = first.seq
      await close(first.store)
      const second = await Session.open(await open(key))
      assert.equal(stateOf(second).openedAt, acknowledged, 'every acknowledged event was there')
      const results = second.messages().filter((m) => m.role === 'tool')
      assert.equal(results.length, 1)
      assert.match(JSON.stringify(results[0].content), /TOOL_OUTCOME_UNKNOWN/)
      assert.deepEqual(second.turn, { turn: 1, open: false, step: 1, stepOpen: false })
      exchange(second, 'go on', 'done')
      await second.sync()
      await close(second.store)
      const events = await readLog(key)
      assert.deepEqual(events.slice(acknowledged).map((e) => e.type), ['session/resume', 'tool/result', 'step/end', 'turn/end', 'user/message', 'assistant/message'])
    })
  })
}
