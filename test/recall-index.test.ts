// recall's index of shadowed originals (docs/design.md §10, "Recall"): Session.shadowedSeqs(),
// resultOriginSeq() and shadowedCallSeq() are kept as events arrive; recall answers from them. These
// tests compare every answer with a reference computed the old way — a scan of the whole log — over
// random sessions (prune, clear, fold into a checkpoint, spill, pin, reused call ids, resume, a torn
// last line), on MemoryStore and FileStore.
import { test, describe } from 'node:test'
import assert from 'node:assert/strict'
import { appendFileSync, mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import {
  Session, MemoryStore, FileStore, type Message, internals, Pins, RecallIndex
} from '../dsh.ts'
import {
  RECALL_TOOL_NAME,
} from './spec.ts'

const { recallTool, stateOf } = internals
import { rng } from './rng.ts'
import { clearNode } from './spec.ts'

const ctx = { signal: new AbortController().signal, callId: 'r-test' }
const SURFACE = new Set(['user/message', 'assistant/message', 'tool/result'])

interface RefOriginal { key: string; seq: number; label: string; toolName?: string; text: string }

/** recall's text of a message (text blocks and tool calls only: what these sessions hold). */
function textOf(m: Message): string {
  if (typeof m.content === 'string') return m.content
  return (m.content as any[]).map((b) => b.type === 'text' ? b.text : b.type === 'tool-call' ? `[tool call ${b.name} ${b.arguments}]` : `[${b.type} block]`).join('\n')
}

/**
 * The shadowed originals, newest first, the old way: every appended surface event no longer on the
 * surface (or spilled), each result labelled by the nearest call with its id logged before it.
 */
async function reference(session: Session): Promise<RefOriginal[]> {
  const calls = new Map<string, { name: string; arguments: string }>()
  const out: RefOriginal[] = []
  for await (const e of session.readEvents()) {
    const d = e.data as any
    if (!SURFACE.has(e.type) || d.surfaceOp?.op !== 'append' || !d.message) continue
    const m = d.message as Message
    for (const b of (Array.isArray(m.content) ? m.content : []) as any[]) if (b.type === 'tool-call') calls.set(b.id, b)
    if (session.surface().node(e.seq) !== undefined && !d.spilled) continue
    if (m.role === 'tool') {
      const call = calls.get(m.toolCallId)
      const text = d.spilled ? await session.store.getArtefact!(d.spilled.ref) : textOf(m)
      out.push({ key: m.toolCallId, seq: e.seq, toolName: call?.name, label: `tool result of ${call?.name ?? 'a tool'} ${(call?.arguments ?? '').replace(/\s+/g, ' ')}`.trim(), text })
    } else out.push({ key: `seq:${e.seq}`, seq: e.seq, label: `${m.role} message`, text: textOf(m) })
  }
  return out.reverse()
}

/** recall's whole answer for a small original (one page). */
const answerOf = (o: RefOriginal, note = '') => {
  const n = o.text.split('\n').length
  return `${o.key} (${o.label}), lines 1–${n} of ${n}:\n${o.text}${note}`
}

async function ask(session: Session, args: Record<string, unknown>): Promise<string> {
  try { return await recallTool(session).execute(args, ctx) as string } catch (err) { return `ERROR ${(err as Error).message}` }
}

/** Checks the index and recall's answers against {@link reference}. */
async function compare(session: Session, ids: Iterable<string>, where: string): Promise<void> {
  const ref = await reference(session)
  assert.deepEqual([...RecallIndex.of(session).shadowedSeqs()], ref.map((o) => o.seq).reverse(), `${where}: shadowedSeqs`)
  const keys = new Set<string>([...ids, '__proto__', 'constructor', 'seq:-1', 'seq:1e3', 'seq:007', 'seq:99999999999999999999', 'seq:', 'never-called'])
  for (let seq = 0; seq < session.seq + 2; seq += 1 + (seq % 3)) keys.add(`seq:${seq}`)
  for (const key of keys) {
    const expected = ref.find((o) => o.key === key)
    const got = await ask(session, { key })
    if (expected) assert.equal(got, answerOf(expected), `${where}: key ${key}`)
    else assert.match(got, /^ERROR recall: nothing shadowed has key /, `${where}: key ${key}`)
  }
  for (const tool of ['fetch', 'grep', RECALL_TOOL_NAME, '__proto__']) {
    const matches = ref.filter((o) => o.toolName === tool).slice(0, 6)
    const got = await ask(session, { tool })
    if (matches.length === 0) assert.match(got, /^ERROR recall: no shadowed result of tool /, `${where}: tool ${tool}`)
    else assert.equal(got, answerOf(matches[0], matches.length > 1 ? `\n[older results of ${tool}: ${matches.slice(1).map((o) => o.key).join(', ')}]` : ''), `${where}: tool ${tool}`)
  }
  for (const pattern of ['alpha', 'SPILLED', '💥', 'checkpoint', 'absent-word']) {
    const searched = ref.filter((o) => o.toolName !== RECALL_TOOL_NAME)
    const hits = searched.reduce((n, o) => n + o.text.split('\n').filter((l) => l.toLowerCase().includes(pattern.toLowerCase())).length, 0)
    const got = await ask(session, { pattern })
    if (hits === 0) assert.equal(got, `recall: no shadowed original contains ${JSON.stringify(pattern)} (${searched.length} searched)`, `${where}: pattern ${pattern}`)
    else assert.ok(got.startsWith(`${hits} hit(s) for ${JSON.stringify(pattern)}`), `${where}: pattern ${pattern}: ${got.slice(0, 80)}`)
  }
}

const words = ['alpha', 'Beta', 'ÄÖÜ', '💥', 'delta', 'seq:3', 'line', 'SPILLED', 'CHECKPOINT']

/** A random session of `steps` operations; returns the call ids used. */
async function randomSession(seed: number, file: string | undefined, steps: number, check: (s: Session, ids: Set<string>, where: string) => Promise<void>): Promise<{ session: Session; ids: Set<string> }> {
  const r = rng(seed)
  const pick = <T>(a: readonly T[]): T => a[Math.floor(r() * a.length)]
  const text = () => Array.from({ length: 1 + Math.floor(r() * 12) }, () => pick(words)).join(r() < 0.3 ? '\n' : ' ')
  let store: MemoryStore | FileStore = file ? new FileStore(file) : new MemoryStore()
  let session = await Session.open(store)
  const ids = new Set<string>()
  let fresh = 0
  for (let step = 0; step < steps; step++) {
    const op = r(), surface = session.surface()
    try {
      if (op < 0.12) session.append('user/message', { message: { role: 'user', content: text() }, surfaceOp: { op: 'append' } })
      else if (op < 0.42) {
        const calls: Array<{ type: 'tool-call'; id: string; name: string; arguments: string }> = []
        for (let i = 0, n = 1 + Math.floor(r() * 3); i < n; i++) {
          let id = `c${Math.floor(r() * 5)}` // ids reused across steps, as servers that number calls per response do
          if (stateOf(session).calls.has(id) || calls.some((c) => c.id === id)) id = `u${fresh++}`
          ids.add(id)
          calls.push({ type: 'tool-call', id, name: pick(['fetch', 'grep', RECALL_TOOL_NAME]), arguments: JSON.stringify({ q: pick(words), n: step }) })
        }
        session.append('assistant/message', { message: { role: 'assistant', content: [{ type: 'text', text: text() }, ...calls] }, finishReason: 'tool_calls', surfaceOp: { op: 'append' } })
        // Now and then far more events between a call and its result than recall used to look back over.
        if (r() < 0.08) for (let i = 0; i < 1001; i++) session.append('app/progress', { i })
        for (const c of calls) {
          session.append('tool/call', { callId: c.id, name: c.name })
          const t = text()
          if (r() < 0.2 && store.putArtefact) {
            const ref = await store.putArtefact(`tool-result-${session.seq}.txt`, `${t}\nSPILLED whole`)
            session.append('tool/result', { message: { role: 'tool', toolCallId: c.id, content: [{ type: 'text', text: 'preview' }] }, spilled: { ref, bytes: 1 }, surfaceOp: { op: 'append' } })
          } else session.append('tool/result', { message: { role: 'tool', toolCallId: c.id, content: [{ type: 'text', text: t }] }, surfaceOp: { op: 'append' } })
        }
      } else if (op < 0.57) {
        const results = surface.filter((n) => n.message.role === 'tool')
        if (results.length) clearNode(session, pick(results).seq, `[cleared ${step}]`)
      } else if (op < 0.64) {
        const node = pick(surface.filter((n) => n.message.role === 'assistant'))
        if (node) {
          const m = node.message as any
          const calls = m.content.filter((b: any) => b.type === 'tool-call')
          session.append('assistant/message', { message: { role: 'assistant', content: calls.length ? calls : [{ type: 'text', text: 'pruned' }] }, finishReason: 'pruned', surfaceOp: { op: 'replace', start: node.seq, end: node.seq } })
        }
      } else if (op < 0.78) {
        if (surface.length >= 2) {
          // A checkpoint over a tool-balanced range.
          let i = Math.floor(r() * surface.length), j = Math.min(surface.length - 1, i + Math.floor(r() * 5))
          const callAt = (id: string) => surface.findIndex((n) => Array.isArray(n.message.content) && (n.message.content as any[]).some((b) => b.type === 'tool-call' && b.id === id))
          const resultAt = (id: string) => surface.findIndex((n) => n.message.role === 'tool' && n.message.toolCallId === id)
          for (let changed = true; changed;) {
            changed = false
            for (let k = i; k <= j; k++) {
              const m = surface[k].message as any
              if (m.role === 'tool' && callAt(m.toolCallId) < i) { i = callAt(m.toolCallId); changed = true }
              if (m.role === 'assistant') for (const b of m.content) if (b.type === 'tool-call' && resultAt(b.id) > j) { j = resultAt(b.id); changed = true }
            }
          }
          session.append('user/message', { message: { role: 'user', content: `CHECKPOINT ${text()}` }, surfaceOp: { op: 'replace', start: surface[i].seq, end: surface[j].seq } })
        }
      } else if (op < 0.86) {
        const node = pick(surface)
        if (node) { if (Pins.of(session).has(node.seq)) Pins.of(session).unpin(node.seq); else Pins.of(session).pin(node.seq) }
      } else if (op < 0.9 && file) {
        await stateOf(session).flush()
        await (store as FileStore).close()
        store = new FileStore(file)
        session = await Session.open(store) // resume
      } else session.append('turn/start', { turn: step })
    } catch (err) {
      if (!['PIN', 'PAIRING', 'SURFACE_OP'].includes((err as { code?: string }).code ?? '')) throw err // a pinned node in range, etc.
    }
    await check(session, ids, `seed ${seed} step ${step}`)
  }
  return { session, ids }
}

describe('recall index', () => {
  test('a result whose call is more than 1,000 events back keeps its tool name and arguments after the call is folded away (and a reused id is not mistaken for it)', async () => {
    const session = await Session.open(new MemoryStore())
    const n = 501 // one tool/call and one tool/result per call: the last result is 1,002 events after its call
    const calls = Array.from({ length: n }, (_, i) => ({ type: 'tool-call' as const, id: `call_${i}`, name: 'fetch', arguments: JSON.stringify({ url: `https://example.com/${i}` }) }))
    const first = session.append('user/message', { message: { role: 'user', content: 'fetch them all' }, surfaceOp: { op: 'append' } }).seq
    session.append('assistant/message', { message: { role: 'assistant', content: calls }, finishReason: 'tool_calls', surfaceOp: { op: 'append' } })
    let last = 0
    for (const c of calls) {
      session.append('tool/call', { callId: c.id, name: c.name })
      last = session.append('tool/result', { message: { role: 'tool', toolCallId: c.id, content: [{ type: 'text', text: `page ${c.id} body` }] }, surfaceOp: { op: 'append' } }).seq
    }
    session.append('user/message', { message: { role: 'user', content: 'CHECKPOINT: fetched 501 pages' }, surfaceOp: { op: 'replace', start: first, end: last } })
    // The next response numbers its calls from 0 again: call_500 is a new call, of another tool.
    session.append('assistant/message', { message: { role: 'assistant', content: [{ type: 'tool-call', id: 'call_500', name: 'grep', arguments: '{"q":"x"}' }] }, finishReason: 'tool_calls', surfaceOp: { op: 'append' } })
    session.append('tool/result', { message: { role: 'tool', toolCallId: 'call_500', content: [{ type: 'text', text: 'no match' }] }, surfaceOp: { op: 'append' } })
    assert.equal(await ask(session, { key: 'call_500' }), 'call_500 (tool result of fetch {"url":"https://example.com/500"}), lines 1–1 of 1:\npage call_500 body')
    const byTool = await ask(session, { tool: 'fetch', arguments: 'example.com/499' })
    assert.ok(byTool.startsWith('call_499 (tool result of fetch {"url":"https://example.com/499"})'), byTool.slice(0, 120))
    assert.equal(RecallIndex.of(session).shadowedCallSeq(last), first + 1)
    assert.equal(RecallIndex.of(session).shadowedCallSeq(first), undefined, 'a message, not a result')
  })

  test('a key that names nothing shadowed, or a call folded away, is answered from the index: no scan of the shadowed originals', async () => {
    const session = await Session.open(new MemoryStore())
    const first = session.append('user/message', { message: { role: 'user', content: 'go' }, surfaceOp: { op: 'append' } }).seq
    let last = 0
    for (let i = 0; i < 300; i++) {
      session.append('assistant/message', { message: { role: 'assistant', content: [{ type: 'tool-call', id: `k${i}`, name: 'grep', arguments: `{"q":${i}}` }] }, finishReason: 'tool_calls', surfaceOp: { op: 'append' } })
      last = session.append('tool/result', { message: { role: 'tool', toolCallId: `k${i}`, content: [{ type: 'text', text: `hit ${i}` }] }, surfaceOp: { op: 'append' } }).seq
    }
    session.append('user/message', { message: { role: 'user', content: 'CHECKPOINT: 300 greps' }, surfaceOp: { op: 'replace', start: first, end: last } })
    let reads = 0
    const readEvent = session.readEvent.bind(session)
    session.readEvent = (seq: number) => { reads++; return readEvent(seq) }
    assert.match(await ask(session, { key: 'k-unknown' }), /^ERROR recall: nothing shadowed has key "k-unknown"/)
    assert.equal(reads, 0, 'an unknown key reads no event')
    assert.equal(await ask(session, { key: 'k7' }), 'k7 (tool result of grep {"q":7}), lines 1–1 of 1:\nhit 7')
    assert.equal(reads, 2, 'a folded-away call: its result and the message holding its call')
    assert.equal(RecallIndex.of(session).shadowedResultSeq('k7'), first + 2 * 7 + 2)
    assert.equal(RecallIndex.of(session).shadowedResultSeq('k-unknown'), undefined)
  })

  test('property: the index and every answer equal a full scan of the log (MemoryStore, random sessions)', async () => {
    for (let seed = 1; seed <= 8; seed++) {
      const { session } = await randomSession(seed, undefined, 40, async (s, ids, where) => { if (s.seq % 4 === 0) await compare(s, ids, where) })
      await compare(session, [], `seed ${seed} end`)
      await stateOf(session).flush()
      const loaded = await Session.open(session.store, { readOnly: true })
      assert.deepEqual([...RecallIndex.of(loaded).shadowedSeqs()], [...RecallIndex.of(session).shadowedSeqs()], `seed ${seed}: replayed index`)
    }
  })

  test('property: the same on a FileStore across resumes; a reload after a torn last line rebuilds the same index', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'dsh-recall-index-'))
    try {
      for (let seed = 101; seed <= 104; seed++) {
        const file = join(dir, `s${seed}.jsonl`)
        const { session, ids } = await randomSession(seed, file, 40, async (s, ids, where) => { if (s.seq % 5 === 0) await compare(s, ids, where) })
        await compare(session, ids, `seed ${seed} end`)
        await stateOf(session).flush()
        const live = [...RecallIndex.of(session).shadowedSeqs()]
        const liveCalls = live.map((seq) => RecallIndex.of(session).shadowedCallSeq(seq))
        await (session.store as FileStore).close()
        appendFileSync(file, '{"seq":99999,"type":"user/mess') // a crash mid-append
        const loaded = await Session.open(new FileStore(file), { readOnly: true })
        assert.ok(loaded.torn, 'the torn line is reported')
        assert.deepEqual([...RecallIndex.of(loaded).shadowedSeqs()], live, `seed ${seed}: index after the torn line`)
        assert.deepEqual(live.map((seq) => RecallIndex.of(loaded).shadowedCallSeq(seq)), liveCalls)
        await compare(loaded, ids, `seed ${seed} reloaded`)
        await (loaded.store as FileStore).close()
      }
    } finally { rmSync(dir, { recursive: true, force: true }) }
  })

  test('a second process truncating the log under a reader: recall answers with an error, the session stays usable', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'dsh-recall-trunc-'))
    try {
      const file = join(dir, 's.jsonl')
      const session = await Session.open(new FileStore(file))
      session.append('assistant/message', { message: { role: 'assistant', content: [{ type: 'tool-call', id: 'a', name: 'fetch', arguments: '{}' }] }, finishReason: 'tool_calls', surfaceOp: { op: 'append' } })
      const seq = session.append('tool/result', { message: { role: 'tool', toolCallId: 'a', content: [{ type: 'text', text: 'original' }] }, surfaceOp: { op: 'append' } }).seq
      clearNode(session, seq, '[cleared]')
      await stateOf(session).flush()
      const { truncateSync } = await import('node:fs')
      truncateSync(file, 40) // another process cuts the log
      const got = await ask(session, { key: 'a' })
      assert.match(got, /^ERROR /)
      assert.ok(got.length < 400, got)
      await assert.rejects(async () => { session.append('user/message', { message: { role: 'user', content: 'x' }, surfaceOp: { op: 'append' } }); await stateOf(session).flush() }, /SESSION_LOCKED|changed/)
    } finally { rmSync(dir, { recursive: true, force: true }) }
  })
})


test('recall: a hostile tool name does not take an answer past its cap (the label shows at most 100 code points of it)', async () => {
  const session = await Session.open(new MemoryStore())
  const name = 'x'.repeat(20_000)
  session.append('assistant/message', { message: { role: 'assistant', content: [{ type: 'tool-call', id: 'h', name, arguments: '{}' }] }, finishReason: 'tool_calls', surfaceOp: { op: 'append' } })
  const seq = session.append('tool/result', { message: { role: 'tool', toolCallId: 'h', content: [{ type: 'text', text: 'unknown tool\nsecond line' }] }, surfaceOp: { op: 'append' } }).seq
  clearNode(session, seq, '[cleared]')
  for (const args of [{ key: 'h' }, { pattern: 'line' }, { tool: name }]) {
    const got = await ask(session, args)
    assert.ok(got.length <= 1_000, `${JSON.stringify(args).slice(0, 30)}: ${got.length} code units`)
  }
})
