// Ladder v2 (docs/design.md §10): clear rung, recall, oversized messages, summary re-plan,
// calibration, durable ladder state, CompactionConfig validation. Mostly over HTTP against the fake provider.
import { test, after, describe } from 'node:test'
import assert from 'node:assert/strict'
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import {
  Agent, Session, MemoryStore, FileStore, openAICompatible, PRUNE_MARKER, DEFAULT_PRUNE_CONFIG,
  codePointLength, ProviderError, estimateMessageTokens,
  type Tool, type SessionEvent, estimateTextTokens, type ChatRequest, type CompactionHost, type Envelope, type Provider, type ToolSpec,
  ConfigError, internals, Pins, RecallIndex, pruneToolResult
} from '../dsh.ts'
import {
  CLEARED_RESULT_PREFIX, clearedPlaceholder, RECALL_TOOL_NAME, RECALL_MAX_CODE_POINTS,
  calibrationMinSampleTokens, CALIBRATION_MIN_SAMPLE_TOKENS, estimateEnvelopeTokens, ledgerBudget,
  SUMMARY_TOOLS_MAX_RATIO, CHECKPOINT_PREAMBLE,
} from './spec.ts'

const { Ladder, summaryMaxTokens, recallTool, summarise, stateOf } = internals
/** An onEvent that keeps the warnings' messages in `list`. */
const warningsTo = (list: string[]) => (e: { type: string; message?: string }) => { if (e.type === 'warning') list.push(e.message!) }
/** A full ladder configuration: the defaults and the ladder's constants with `config` over them. */
const compactionConfig = ladderConfig
import { startFakeProvider, type FakeReply, type FakeRequest } from './fake-provider.ts'
import { logHeader, clearNode } from './spec.ts'
import { requestTokens, resultTool, shortSummarizer, overflow } from './scripted-provider.ts'
import { tuned, ladderConfig } from './tuning.ts'

const servers: Array<{ close(): Promise<void> }> = []
after(async () => { for (const s of servers) await s.close() })

/** A fake whose conversation replies come from `script` (or a function of the request) and whose summary replies from `summaries`. */
async function fake(script: FakeReply[] | ((req: FakeRequest, i: number) => FakeReply), summaries: FakeReply[] = [{ text: 'CHECKPOINT: work so far.' }], contextWindow = 32_000) {
  let c = 0, s = 0
  const server = await startFakeProvider({
    handler: (req: FakeRequest) => {
      if (req.headers['x-dsh-purpose'] === 'compaction') return summaries[Math.min(s++, summaries.length - 1)]
      const i = c++
      return typeof script === 'function' ? script(req, i) : script[Math.min(i, script.length - 1)]
    },
  })
  servers.push(server)
  const provider = tuned({ maxRetries: 0 }, () => openAICompatible({ baseURL: server.url, model: 'fake-model', apiKey: 'sk-test', contextWindow }))
  const conversation = () => server.requests.filter((r) => r.headers['x-dsh-purpose'] !== 'compaction')
  const summary = () => server.requests.filter((r) => r.headers['x-dsh-purpose'] === 'compaction')
  return { server, provider, conversation, summary }
}

const of = (s: Session, type: string) => s.events.filter((e) => e.type === type)
/** The whole log, read back (a FileStore session keeps only its surface in memory). */
const logOf = async (s: Session) => { const out: SessionEvent[] = []; for await (const e of s.readEvents()) out.push(e); return out }
const toolMessages = (req: FakeRequest) => req.body.messages.filter((m: any) => m.role === 'tool')
/** A 3,000-code-point result made of numbered lines (`r<i> line <k>`), so that recall pages have real lines. */
const result3000 = (i: number) => {
  let text = ''
  for (let k = 0; text.length < 3_000; k++) text += `r${i} line ${k} ${'.'.repeat(20)}\n`
  return text.slice(0, 3_000)
}
const steps = (n: number, name = 'fetch') => Array.from({ length: n }, (_, i) => ({ toolCalls: [{ id: `c${i}`, name, arguments: { i } }] }))
function assertPaired(req: FakeRequest) {
  const ids = req.body.messages.flatMap((m: any) => (m.tool_calls ?? []).map((c: any) => c.id)).sort()
  const results = req.body.messages.filter((m: any) => m.role === 'tool').map((m: any) => m.tool_call_id).sort()
  assert.deepEqual(ids, results)
}

describe('clear rung', () => {
  test('case 1: 40 steps of 3,000-code-point results at 32,000 → relieved by clearing alone; placeholders for the oldest, protected results verbatim', async () => {
    const f = await fake([...steps(40), { text: 'all fetched' }])
    const session = await Session.open(new MemoryStore())
    const fetch: Tool = { name: 'fetch', description: 'fetch', parameters: { type: 'object' }, execute: (a: { i: number }) => result3000(a.i) }
    const totals: number[] = []
    // The total right after each clear's replace.
    session.subscribe((e) => { if (e.type === 'tool/result' && (e.data as any).surfaceOp.op === 'replace' && session.events[e.seq - 1].type === 'compaction/clear') totals.push(session.measure().totalTokens) })
    const r = await new Agent({ session, provider: f.provider, tools: [fetch] }).run('fetch 40')
    assert.equal(r.text, 'all fetched')
    assert.equal(f.summary().length, 0)
    assert.equal(of(session, 'compaction/summary').length, 0)
    assert.equal(of(session, 'compaction/prune').length, 0) // 3,000 code points is under the prune threshold
    const clears = of(session, 'compaction/clear')
    assert.ok(clears.length >= 1)
    // One batch: every clear of the first pressure event happened in one ladder run, oldest first.
    const cleared = clears.map((e) => (e.data as any).shadowedSeqs[0])
    const resultSeqs = of(session, 'tool/result').filter((e) => (e.data as any).surfaceOp.op === 'append').map((e) => e.seq)
    assert.deepEqual(cleared, resultSeqs.slice(0, cleared.length))
    for (const c of clears) assert.equal((c.data as any).shadowedTokenCount, estimateMessageTokens({ role: 'tool', toolCallId: 'x', content: [{ type: 'text', text: result3000(0) }] }))
    assert.equal(estimateMessageTokens({ role: 'tool', toolCallId: 'x', content: [{ type: 'text', text: result3000(0) }] }), 758)
    // The request after the clear: placeholders for the oldest results, the rest verbatim, every call with its result.
    const firstClear = session.events.indexOf(clears[0])
    const stepAfter = session.events.findIndex((e, i) => i > firstClear && e.type === 'step/start')
    const stepIndex = of(session, 'step/start').indexOf(session.events[stepAfter])
    const next = f.conversation()[stepIndex]
    const tools = toolMessages(next)
    const placeholders = tools.filter((m: any) => m.content.startsWith(CLEARED_RESULT_PREFIX))
    const firstBatch = clears.filter((e) => session.events.indexOf(e) < stepAfter)
    assert.equal(placeholders.length, firstBatch.length)
    // Down to the relief target floor(32,000 × 0.6) = 19,200, and not one clear more.
    const after = session.measure()
    const batch = totals.slice(0, firstBatch.length)
    assert.ok(batch.at(-1)! <= 19_200, `after the batch: ${batch.at(-1)}`)
    assert.ok(batch.length < 2 || batch.at(-2)! > 19_200)
    assert.ok(after.totalTokens < 25_600)
    assert.equal(placeholders[0].content, `${CLEARED_RESULT_PREFIX} fetch {"i":0} → 758 tokens; recall {"key":"c0"} returns it.`)
    assert.equal(placeholders[0].content, clearedPlaceholder('fetch', '{"i":0}', 758, 'c0'))
    assert.deepEqual(tools.slice(0, placeholders.length).map((m: any) => m.tool_call_id), placeholders.map((m: any) => m.tool_call_id))
    const verbatim = tools.slice(placeholders.length)
    // The protected recent budget floor(32,000 × 0.2) = 6,400 tokens: at least 9 results of 758.
    assert.ok(verbatim.length >= 9, `verbatim: ${verbatim.length}`)
    for (const m of verbatim) assert.equal(m.content, result3000(Number(m.tool_call_id.slice(1))))
    for (const req of f.server.requests) assertPaired(req)
    // The original stays in the log; recall is offered from then on.
    assert.equal((session.events[cleared[0]].data as any).message.content[0].text, result3000(0))
    assert.ok(next.body.tools.some((t: any) => t.function.name === RECALL_TOOL_NAME))
    assert.ok(!f.conversation()[0].body.tools.some((t: any) => t.function.name === RECALL_TOOL_NAME))
  })

  test('case 7: clearable === false: that tool\'s results are never cleared, but may be pruned', async () => {
    const script = Array.from({ length: 40 }, (_, i) => ({ toolCalls: [{ id: `c${i}`, name: i % 2 ? 'report' : 'fetch', arguments: { i } }] }))
    const f = await fake([...script, { text: 'done' }])
    const session = await Session.open(new MemoryStore())
    const fetch: Tool = { name: 'fetch', description: '', parameters: {}, execute: (a: { i: number }) => result3000(a.i) }
    const report: Tool = { name: 'report', description: '', parameters: {}, clearable: false, execute: (a: { i: number }) => a.i === 1 ? 'R'.repeat(20_000) : result3000(a.i) }
    await new Agent({ session, provider: f.provider, tools: [fetch, report] }).run('go')
    const clearedIds = of(session, 'compaction/clear').map((e) => (session.events[(e.data as any).shadowedSeqs[0]].data as any).message.toolCallId)
    assert.ok(clearedIds.length > 0)
    for (const id of clearedIds) assert.equal(Number(id.slice(1)) % 2, 0, `${id} is a report result`)
    const last = toolMessages(f.conversation().at(-1)!)
    const reports = last.filter((m: any) => Number(m.tool_call_id.slice(1)) % 2 === 1)
    assert.equal(reports.length, 20)
    for (const m of reports) assert.ok(!m.content.startsWith(CLEARED_RESULT_PREFIX))
    assert.ok(reports[0].content.includes(PRUNE_MARKER), 'the 20,000-code-point report result is pruned')
    assert.equal(codePointLength(reports[0].content), 4_096 + 39 + 1_024)
  })

  test('clear: false disables the rung: the same session summarises instead', async () => {
    const f = await fake([...steps(40), { text: 'all fetched' }])
    const session = await Session.open(new MemoryStore())
    const fetch: Tool = { name: 'fetch', description: '', parameters: {}, execute: (a: { i: number }) => result3000(a.i) }
    await new Agent({ session, provider: f.provider, tools: [fetch], compaction: { clear: false } }).run('fetch 40')
    assert.equal(of(session, 'compaction/clear').length, 0)
    assert.ok(f.summary().length >= 1)
  })
})

describe('CompactionConfig validation', () => {
  test('unknown keys, wrong types and out-of-range values are typed errors naming the value', () => {
    const agentProvider = openAICompatible({ baseURL: 'http://127.0.0.1:9', model: 'm', apiKey: 'k', contextWindow: 1000 })
    const resolveCompactionConfig = (compaction?: unknown) => new Agent({ session: new Session(), provider: agentProvider, compaction: compaction as any }).compaction
    assert.deepEqual(resolveCompactionConfig(), { thresholdRatio: 0.8, auto: true, clear: true, retainedTailRatio: 0.16, summaryMaxTokens: 8192, gate: true })
    assert.equal(resolveCompactionConfig({ thresholdRatio: 0.5 }).thresholdRatio, 0.5) // the clear rung then stops at 0.375
    const bad: Array<[unknown, RegExp]> = [
      [{ threshold: 0.8 }, /unknown key "threshold" \(known: thresholdRatio, /],
      [{ thresholdRatio: 0 }, /thresholdRatio must be a number in \(0, 1\] .*got 0/],
      [{ thresholdRatio: 1.5 }, /thresholdRatio must be a number in \(0, 1\].*got 1\.5/],
      [{ retainedTailRatio: 0.1 }, /^compaction config: the option retainedTailRatio was removed: a compaction keeps the newest floor\(window × 0\.16\) tokens/],
      [{ summaryMaxTokens: 128 }, /the option summaryMaxTokens was removed: a summary request's budget is at most 8,192 tokens/],
      [{ gate: false }, /the option gate was removed: the net-cost gate acts where the provider has prices/],
      [{ compactionRetries: 0 }, /unknown key "compactionRetries"/],
      [{ clear: 'no' }, /clear must be true or false, got "no"/],
      [{ auto: 1 }, /auto must be true or false, got 1/],
      [{ reliefRatio: 0.5 }, /unknown key "reliefRatio"/],
      [null, /compaction config must be an object, got null/],
      [[1], /compaction config must be an object, got \[1\]/],
    ]
    for (const [config, message] of bad) {
      assert.throws(() => resolveCompactionConfig(config), (e) => e instanceof ConfigError && e instanceof TypeError && message.test((e as Error).message), String(JSON.stringify(config)))
    }
    const session = new Session()
    const provider = openAICompatible({ baseURL: 'http://127.0.0.1:9', model: 'm', apiKey: 'k', contextWindow: 1000 })
    assert.throws(() => new Agent({ session, provider, compaction: { thresholdRatio: 2 } }), ConfigError)
  })

  test('the ladder is split by trigger and owns its memory: no public mutable ladder fields on the Agent', () => {
    const session = new Session()
    const provider = openAICompatible({ baseURL: 'http://127.0.0.1:9', model: 'm', apiKey: 'k', contextWindow: 1000 })
    const agent = new Agent({ session, provider })
    assert.ok(agent.ladder instanceof Ladder)
    assert.equal(typeof agent.ladder.relievePressure, 'function')
    assert.equal(typeof agent.ladder.recoverOverflow, 'function')
    assert.equal(typeof agent.ladder.compact, 'function')
    assert.equal(agent.ladder.failedAtTokens, undefined)
    assert.ok(!('ladderState' in agent) && !('pinnedSeq' in agent))
    assert.throws(() => { (agent.ladder as any).failedAtTokens = 5 }, TypeError)
  })
})


describe('recall', () => {
  test('its spec, sent in every request once something is shadowed, costs at most 160 heuristic tokens', async () => {
    const t = recallTool(await Session.open(new MemoryStore()))
    const tokens = estimateEnvelopeTokens({ tools: [{ name: t.name, description: t.description, parameters: t.parameters }] })
    assert.ok(tokens <= 160, `${tokens} tokens`)
  })

  test('by key it reads back a few events, not the log; a pattern search skips recall\'s own answers (FileStore)', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'dsh-recall-'))
    class CountingStore extends FileStore {
      reads = 0; scans = 0
      override async readEvent(seq: number) { this.reads++; return super.readEvent(seq) }
      override async *readEvents(from: number, to: number) { this.scans++; yield* super.readEvents(from, to) }
    }
    try {
      const store = new CountingStore(join(dir, 's.jsonl'))
      const session = await Session.open(store)
      session.append('user/message', { message: { role: 'user', content: 'fetch 200' }, surfaceOp: { op: 'append' } })
      const call = (id: string, name: string, args: string) => session.append('assistant/message', { message: { role: 'assistant', content: [{ type: 'tool-call', id, name, arguments: args }] }, finishReason: 'tool_calls', surfaceOp: { op: 'append' } })
      const result = (id: string, text: string) => session.append('tool/result', { message: { role: 'tool', toolCallId: id, content: [{ type: 'text', text }] }, surfaceOp: { op: 'append' } }).seq
      const resultSeqs: number[] = []
      for (let i = 0; i < 200; i++) { call(`c${i}`, 'fetch', JSON.stringify({ i })); resultSeqs.push(result(`c${i}`, result3000(i))) }
      const recall = recallTool(session)
      const ctx = { signal: new AbortController().signal, callId: 'r0' }
      resultSeqs.forEach((seq, i) => clearNode(session, seq, clearedPlaceholder('fetch', JSON.stringify({ i }), 758, `c${i}`)))
      assert.deepEqual(RecallIndex.of(session).shadowedSeqs(), resultSeqs)
      await stateOf(session).flush()
      store.reads = 0; store.scans = 0
      const byKey = await recall.execute({ key: 'c17' }, ctx) as string
      assert.ok(byKey.startsWith('c17 (tool result of fetch {"i":17}), lines 1–'), byKey.slice(0, 80))
      assert.equal(store.scans, 0)
      assert.ok(store.reads <= 3, `${store.reads} events read for one key`)
      // The answer goes into the log as a result of its own call, and is cleared in turn.
      call('r1', RECALL_TOOL_NAME, '{"key":"c17"}')
      const r1 = result('r1', byKey)
      clearNode(session, r1, clearedPlaceholder(RECALL_TOOL_NAME, '{"key":"c17"}', 758, 'r1'))
      const hits = await recall.execute({ pattern: 'r17 line 3 ' }, ctx) as string
      assert.ok(hits.startsWith('1 hit(s) for "r17 line 3 "'), hits.slice(0, 120))
      assert.match(hits, /^c17 line 4 \(tool result of fetch/m)
      assert.equal(store.scans, 0, 'a search reads the shadowed originals, not the log')
    } finally { rmSync(dir, { recursive: true, force: true }) }
  })

  test('case 2: recall by a cleared result\'s key returns the original, paged; the next request stays under the threshold', async () => {
    const session = await Session.open(new MemoryStore())
    const atRequest: number[] = []
    const replies: FakeReply[] = [
      ...steps(40),
      { toolCalls: [{ id: 'r1', name: 'recall', arguments: { key: 'c0' } }] },
      { toolCalls: [{ id: 'r2', name: 'recall', arguments: { key: 'c0', offset: 2, limit: 10 } }] },
      { toolCalls: [{ id: 'r3', name: 'recall', arguments: { tool: 'fetch', arguments: '"i":1}' } }] },
      { text: 'recalled' },
    ]
    const f = await fake((_req, i) => { atRequest.push(session.measure().totalTokens); return replies[Math.min(i, replies.length - 1)] })
    const fetch: Tool = { name: 'fetch', description: '', parameters: {}, execute: (a: { i: number }) => result3000(a.i) }
    const r = await new Agent({ session, provider: f.provider, tools: [fetch] }).run('fetch 40, then recall the first')
    assert.equal(r.text, 'recalled')
    const results = new Map(of(session, 'tool/result').map((e) => [(e.data as any).message.toolCallId, (e.data as any).message]))
    const lines = result3000(0).split('\n')
    const first = results.get('r1').content[0].text
    assert.equal(first, `c0 (tool result of fetch {"i":0}), lines 1–${lines.length} of ${lines.length}:\n${result3000(0)}`)
    assert.equal(results.get('r2').content[0].text, `c0 (tool result of fetch {"i":0}), lines 2–11 of ${lines.length}:\n${lines.slice(1, 11).join('\n')}\n[more: recall {"key":"c0","offset":12}]`)
    assert.ok(results.get('r3').content[0].text.startsWith('c1 (tool result of fetch {"i":1}), lines 1–'), results.get('r3').content[0].text.slice(0, 80))
    assert.equal(results.get('r1').isError, undefined)
    // The requests after each recall answer are under the threshold floor(32,000 × 0.8).
    for (const t of atRequest.slice(-3)) assert.ok(t < 25_600, `request of ${t} tokens`)
    for (const req of f.server.requests) assertPaired(req)
  })

  test('case 2: an answer is capped at 4,096 code points plus a how-to line; bad arguments are an error result', async () => {
    const session = await Session.open(new MemoryStore())
    const big = Array.from({ length: 10_000 }, (_, k) => `😀 row ${k}`).join('\n') // astral code points: code points ≠ UTF-16 units
    const replies: FakeReply[] = [
      { toolCalls: [{ id: 'big', name: 'dump', arguments: {} }] },
      { toolCalls: [{ id: 'q1', name: 'recall', arguments: { key: 'big', limit: 1_000 } }] },
      { toolCalls: [{ id: 'q2', name: 'recall', arguments: { key: 'nope' } }] },
      { toolCalls: [{ id: 'q3', name: 'recall', arguments: { key: 'big', offset: 0 } }] },
      { toolCalls: [{ id: 'q4', name: 'recall', arguments: { pattern: 'row 9999' } }] },
      { text: 'ok' },
    ]
    const f = await fake(replies)
    const dump: Tool = { name: 'dump', description: '', parameters: {}, execute: () => big }
    await new Agent({ session, provider: f.provider, tools: [dump] }).run('dump')
    const results = new Map(of(session, 'tool/result').map((e) => [(e.data as any).message.toolCallId, (e.data as any).message]))
    assert.ok(results.get('big').content[0].text.includes(PRUNE_MARKER)) // pruned on the surface, whole in the log
    const q1: string = results.get('q1').content[0].text
    const [body, howTo] = [q1.slice(0, q1.lastIndexOf('\n')), q1.slice(q1.lastIndexOf('\n') + 1)]
    assert.ok(codePointLength(body) <= RECALL_MAX_CODE_POINTS, `${codePointLength(body)} code points`)
    assert.ok(codePointLength(body) > RECALL_MAX_CODE_POINTS - 20, `${codePointLength(body)} code points: ${body.slice(0, 200)}`)
    const shown = body.split('\n').length - 1
    assert.ok(shown < 1_000)
    assert.match(howTo, new RegExp(`^\\[more: recall \\{"key":"big","offset":${shown + 1}\\}\\]$`))
    assert.equal(body.split('\n')[1], '😀 row 0')
    assert.equal(results.get('q2').isError, true)
    assert.match(results.get('q2').content[0].text, /^recall: nothing shadowed has key "nope"/)
    assert.match(results.get('q3').content[0].text, /^recall: offset must be an integer ≥ 1, got 0/)
    assert.equal(results.get('q4').content[0].text, '1 hit(s) for "row 9999", newest first; read one with {"key":…,"offset":line}:\nbig line 10000 (tool result of dump {}): 😀 row 9999')
  })

  test('case 2: recall with a pattern finds a line folded into a checkpoint; a session reloaded from FileStore recalls the same text', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'dsh-recall-'))
    try {
      const path = join(dir, 's.jsonl')
      const session = await Session.open(new FileStore(path))
      const needle = (i: number) => (i === 3 ? 'ERROR: NEEDLE-42 in src/parser.ts:118\n' : '')
      const replies: FakeReply[] = [...steps(12), { toolCalls: [{ id: 'p1', name: 'recall', arguments: { pattern: 'needle-42' } }] }, { text: 'found it' }]
      const f = await fake(replies, [{ text: 'CHECKPOINT: fetched results.' }], 16_000)
      const fetch: Tool = { name: 'fetch', description: '', parameters: {}, execute: (a: { i: number }) => needle(a.i) + `r${a.i} `.padEnd(6_000, '.') }
      await new Agent({ session, provider: f.provider, tools: [fetch], compaction: { clear: false } }).run('fetch')
      const log = await logOf(session)
      assert.ok(log.filter((e) => e.type === 'compaction/summary').length >= 1)
      const folded = log.filter((e) => e.type === 'compaction/summary').flatMap((e) => (e.data as any).shadowedSeqs as number[])
      const c3 = log.filter((e) => e.type === 'tool/result').find((e) => (e.data as any).message.toolCallId === 'c3')!
      assert.ok(folded.includes(c3.seq), 'c3 was folded into a checkpoint')
      const hit = log.filter((e) => e.type === 'tool/result').find((e) => (e.data as any).message.toolCallId === 'p1')!
      assert.equal((hit.data as any).message.content[0].text, '1 hit(s) for "needle-42", newest first; read one with {"key":…,"offset":line}:\nc3 line 1 (tool result of fetch {"i":3}): ERROR: NEEDLE-42 in src/parser.ts:118')
      const live = await new Agent({ session, provider: f.provider, tools: [fetch] }).tools.length
      assert.equal(live, 1)
      await session.store.close?.()
      const reloaded = await Session.open(new FileStore(path), { readOnly: true })
      const ctx = { signal: new AbortController().signal, callId: 'x' }
      const again = await recallTool(reloaded).execute({ key: 'c3', limit: 1 }, ctx)
      // Lines over 1,000 code points are paged as 1,000-code-point pieces: 1 + 6 here.
      assert.equal(again, `c3 (tool result of fetch {"i":3}), lines 1–1 of 7:\nERROR: NEEDLE-42 in src/parser.ts:118\n[more: recall {"key":"c3","offset":2}]`)
      const pieces = 'r3 '.padEnd(6_000, '.').match(/.{1,1000}/g)!
      // A page joins the pieces of one line, and says when it ends inside one.
      assert.equal(await recallTool(reloaded).execute({ key: 'c3', offset: 2 }, ctx), `c3 (tool result of fetch {"i":3}), lines 2–5 of 7:\n${pieces.slice(0, 4).join('')}\n[more: recall {"key":"c3","offset":6} — the line goes on there]`)
    } finally { rmSync(dir, { recursive: true, force: true }) }
  })

  test('a spilled result\'s note is where its cut is, though the output holds the plain marker; recall by its id returns it', async () => {
    // Was: the note replaced the first plain marker in the text: the one the output held in its head, and the real cut
    // was shown as "tool result middle pruned".
    const dir = mkdtempSync(join(tmpdir(), 'dsh-spill-'))
    try {
      const session = await Session.open(new FileStore(join(dir, 's.jsonl')))
      const f = await fake([{ toolCalls: [{ id: 'h1', name: 'huge', arguments: {} }] }, { text: 'ok' }])
      const output = 'HEAD ' + PRUNE_MARKER + 'x'.repeat(300_000) + ' END' // the plain marker in its head, where no cut is
      const huge: Tool = { name: 'huge', description: '', parameters: {}, execute: () => output }
      await new Agent({ session, provider: f.provider, tools: [huge] }).run('go')
      const sent = toolMessages(f.conversation()[1])[0].content as string
      const ref = ((await logOf(session)).find((e) => e.type === 'tool/result')!.data as any).spilled.ref
      assert.equal(sent, output.slice(0, 4_096) + `\n\n[... tool result middle spilled: all 300048 bytes are stored at ${ref}; recall {"key":"h1"} reads them ...]\n\n`
        + output.slice(-1_024))
      const page = String(await recallTool(session).execute({ key: 'h1', limit: 1 }, { signal: new AbortController().signal, callId: 'r' }))
      assert.equal(page.split('\n').slice(0, 2).join('\n'), 'h1 (tool result of huge {}), lines 1–1 of 305:\nHEAD ')
      await session.store.close?.()
    } finally { rmSync(dir, { recursive: true, force: true }) }
  })

  test('a spill note names its recall key only where recall is offered (recall: false: the reference alone)', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'dsh-spill-'))
    try {
      const session = await Session.open(new FileStore(join(dir, 's.jsonl')))
      const f = await fake([{ toolCalls: [{ id: 'h2', name: 'huge', arguments: {} }] }, { text: 'ok' }])
      const huge: Tool = { name: 'huge', description: '', parameters: {}, execute: () => 'y'.repeat(300_000) }
      await new Agent({ session, provider: f.provider, tools: [huge], recall: false }).run('go')
      const sent = toolMessages(f.conversation()[1])[0].content as string
      assert.match(sent, /\[\.\.\. tool result middle spilled: all 300000 bytes are stored at [^;\]]+ \.\.\.\]/)
      await session.store.close?.()
    } finally { rmSync(dir, { recursive: true, force: true }) }
  })

  test('a 200 KB one-line paste comes back exactly: its pieces of 1,000 code points are joined, a page ending inside the line says so', async () => {
    // Was: each piece was shown as a line of its own, so the pages read back had a line break every 1,000 code points.
    const f = await fake([{ text: 'one' }, { text: 'two' }], undefined, 72_000)
    const session = await Session.open(new MemoryStore())
    const agent = new Agent({ session, provider: f.provider })
    const paste = '{"data":"' + 'a🙂b'.repeat(50_000) + '"}\n{"tail":1}' // 200,022 units, two lines
    await agent.run(paste)
    await agent.run('w'.repeat(40_000))
    const seq = of(session, 'user/message')[0].seq
    assert.ok(String(f.conversation().at(-1)!.body.messages[0].content).includes(`recall {"key":"seq:${seq}"}`), JSON.stringify(f.conversation().at(-1)!.body.messages).slice(0, 300) + f.conversation().length)
    const recall = recallTool(session)
    let whole = '', pages = 0
    for (let offset: number | undefined = 1; offset !== undefined; pages++) {
      const answer = String(await recall.execute({ key: `seq:${seq}`, offset }, { signal: new AbortController().signal, callId: 'r' }))
      const head = answer.split('\n', 1)[0]
      assert.match(head, new RegExp(`^seq:${seq} \\(user message\\), lines ${offset}–\\d+ of 152:$`))
      const more = /\n\[more: recall \{"key":"[^"]+","offset":(\d+)\}( — the line goes on there)?\]$/.exec(answer)
      whole += (more ? answer.slice(0, more.index) : answer).slice(head.length + 1) + (more && !more[2] ? '\n' : '')
      offset = more ? Number(more[1]) : undefined
    }
    assert.equal(pages, 38)
    assert.equal(whole, paste)
  })

  test('recall: false offers no recall tool; a caller tool named recall needs recall: false', async () => {
    const f = await fake([{ toolCalls: [{ id: 'c0', name: 'big', arguments: {} }] }, { text: 'ok' }], undefined, 16_000)
    const session = await Session.open(new MemoryStore())
    const big: Tool = { name: 'big', description: '', parameters: {}, execute: () => 'B'.repeat(60_000) }
    await new Agent({ session, provider: f.provider, tools: [big], recall: false }).run('go')
    assert.equal(of(session, 'compaction/prune').length, 1)
    assert.ok(!f.conversation()[1].body.tools.some((t: any) => t.function.name === 'recall'))
    const mine: Tool = { name: 'recall', description: '', parameters: {}, execute: () => 'mine' }
    assert.throws(() => new Agent({ session, provider: f.provider, tools: [mine] }), /a tool is named "recall".*pass recall: false/)
    assert.doesNotThrow(() => new Agent({ session, provider: f.provider, tools: [mine], recall: false }))
  })
})

describe('oversized non-tool messages', () => {
  test('case 3: a 200,000-character assistant reply at window 32,000 is pruned after its step; the original stays in the log; the next request fits', async () => {
    const huge = Array.from({ length: 20_000 }, (_, k) => `line ${k} `.padEnd(9, '.')).join('\n').slice(0, 200_000)
    assert.equal(huge.length, 200_000)
    const session = await Session.open(new MemoryStore())
    const atRequest: number[] = []
    const replies: FakeReply[] = [{ text: huge, toolCalls: [{ id: 'c0', name: 'fetch', arguments: { path: 'x'.repeat(12_000) } }] }, { text: 'done' }]
    const f = await fake((_req, i) => { atRequest.push(session.measure().totalTokens); return replies[Math.min(i, 1)] })
    let after = 0
    const fetch: Tool = { name: 'fetch', description: '', parameters: {}, execute: () => 'ok' }
    const agent = new Agent({ session, provider: f.provider, tools: [fetch] })
    session.subscribe((e) => { if (e.type === 'step/end' && !after) after = session.measure().totalTokens })
    const r = await agent.run('write it all')
    assert.equal(r.text, 'done')
    assert.ok(after > 0 && after < 25_600, `after the step: ${after}`)
    const log = await logOf(session)
    const original = log.find((e) => e.type === 'assistant/message' && (e.data as any).surfaceOp.op === 'append')!
    assert.equal((original.data as any).message.content[0].text, huge)
    const prune = log.find((e) => e.type === 'compaction/prune')!
    assert.deepEqual((prune.data as any).shadowedSeqs, [original.seq])
    const replaced = log[prune.seq + 1]
    assert.equal(replaced.type, 'assistant/message')
    assert.deepEqual((replaced.data as any).surfaceOp, { op: 'replace', start: original.seq, end: original.seq })
    // The next request: the reply cut to 4,096 + 39 + 1,024 code points; the call kept, its arguments still JSON; under the window.
    const sent = f.conversation()[1].body.messages.find((m: any) => m.role === 'assistant')
    assert.equal(sent.content, huge.slice(0, 4_096) + PRUNE_MARKER + huge.slice(-1_024))
    assert.equal(sent.tool_calls[0].id, 'c0')
    const args = JSON.parse(sent.tool_calls[0].function.arguments)
    assert.equal(args.path, 'x'.repeat(4_096) + PRUNE_MARKER + 'x'.repeat(1_024))
    assert.ok(atRequest[1] < 32_000, `next request: ${atRequest[1]}`)
    assert.equal(sent.tool_calls.length, 1)
    for (const req of f.server.requests) assertPaired(req)
  })

  test('the current input is never edited: an input that cannot fit is refused before sending, with the numbers; earlier user messages may be cut', async () => {
    const f = await fake([{ text: 'first' }, { text: 'second' }], undefined, 16_000)
    const session = await Session.open(new MemoryStore())
    const agent = new Agent({ session, provider: f.provider })
    await assert.rejects(agent.run('y'.repeat(70_000)), (e) => e instanceof ProviderError && e.code === 'CONTEXT_WINDOW_EXCEEDED' && e.status === undefined
      && /the current input alone is 17508 tokens \(plus 0 of system prompt and tools = 17508\) and the context window of fake-model is 16000 tokens; nothing was sent/.test(e.message))
    assert.equal(f.server.requests.length, 0)
    const last = of(session, 'turn/end').at(-1)!
    assert.equal((last.data as any).reason, 'error')
    assert.equal((of(session, 'request/error').at(-1)!.data as any).trigger, 'input')
    // A big earlier input is pruned once it is no longer the current one; the current one is sent whole.
    const s2 = await Session.open(new MemoryStore())
    const a2 = new Agent({ session: s2, provider: f.provider })
    await a2.run('z'.repeat(40_000) + 'END')
    const current = 'w'.repeat(12_000)
    await a2.run(current)
    const req = f.conversation().at(-1)!.body.messages
    assert.equal(req.at(-1).content, current)
    const seq = of(s2, 'user/message')[0].seq
    assert.equal(req[0].content, 'z'.repeat(4_096) + `\n\n[... middle of this user message cut; recall {"key":"seq:${seq}"} returns it whole ...]\n\n` + 'z'.repeat(1_021) + 'END')
  })

  test('an earlier user message cut by the prune rung says so and names the recall key that returns it whole', async () => {
    // Was: "[... tool result middle pruned ...]" in the user's own message, and no key: the model could not read it back.
    const f = await fake([{ text: 'first' }, { text: 'second' }, { text: 'third' }], undefined, 16_000)
    const session = await Session.open(new MemoryStore())
    const agent = new Agent({ session, provider: f.provider })
    await agent.run('the task')
    // Lines of 80 units; the hostile paste holds the plain marker itself in its head, where no cut is.
    const paste = 'x' + PRUNE_MARKER + Array.from({ length: 300 }, (_, i) => `paste line ${i} `.padEnd(79, '.')).join('\n')
    await agent.run(paste)
    await agent.run('w'.repeat(40_000))
    const seq = of(session, 'user/message').find((e) => (e.data as any).message.content === paste)!.seq
    const sent = f.conversation().at(-1)!.body.messages.find((m: any) => m.role === 'user' && m.content.startsWith('x'))
    const marker = `\n\n[... middle of this user message cut; recall {"key":"seq:${seq}"} returns it whole ...]\n\n`
    assert.equal(sent.content, paste.slice(0, 4_096) + marker + paste.slice(-1_024))
    const answer = String(await recallTool(session).execute({ key: `seq:${seq}`, offset: 304 }, { signal: new AbortController().signal, callId: 'r' }))
    assert.equal(answer, `seq:${seq} (user message), lines 304–304 of 304:\n${paste.split('\n').at(-1)}`)
  })

  test('under a small prune config a user message is cut only where the cut with its key is shorter, and never recut without it', async () => {
    // Was: where the keyed cut was not shorter, the plain marker was used (no key), and a cut message was cut again
    // to the plain marker at the next prune: its key was lost.
    const ok = { message: { role: 'assistant', content: [{ type: 'text', text: 'ok' }] }, finishReason: 'stop' }
    const provider = { model: 'm', baseURL: 'memory://m', contextWindow: 16_000, maxTokens: 100, complete: async () => ok } as any
    const summarizer = { ...provider, model: 's', complete: async () => { throw new Error('summarizer down') } }
    const session = await Session.open(new MemoryStore())
    const agent = new Agent({ session, provider, summarizer, prune: { thresholdChars: 200, headChars: 100, tailChars: 61 }, compaction: { auto: false } })
    const a = 'a'.repeat(210), b = 'b'.repeat(400)
    for (const input of ['the task', a, b, 'now']) await agent.run(input)
    // The second run finds nothing to cut (the cut one is not cut again), and the summary fails: 'failed'.
    assert.deepEqual([(await agent.compactNow()).action, (await agent.compactNow()).action], ['pruned', 'failed'])
    const shown = session.surface().map((n) => String(n.message.content))
    const bSeq = of(session, 'user/message').find((e) => (e.data as any).message.content === b)!.seq
    assert.deepEqual(shown.filter((c) => c.startsWith('a') || c.startsWith('b')), [a, 'b'.repeat(100)
      + `\n\n[... middle of this user message cut; recall {"key":"seq:${bSeq}"} returns it whole ...]\n\n` + 'b'.repeat(61)])
  })

  test('a steering message the model has not read is not summarised by an overflow\'s recovery: the retry carries it as sent', async () => {
    // Was: recovery takes a region with no retained tail, and it ran to the end of the surface, over the steering
    // message: the model first met the user's newest words as a line of a checkpoint's history.
    let k = 0, overflowed = false
    const STEER = 'STEER: stop, use yarn instead of npm'
    const sent: ChatRequest[] = []
    const provider = { model: 'm', baseURL: 'memory://m', contextWindow: 10_000, maxTokens: 100,
      complete: async (r: ChatRequest) => {
        sent.push(r)
        if (r.headers?.['x-dsh-purpose'] === 'compaction') return { message: { role: 'assistant', content: [{ type: 'text', text: 'S' }] }, finishReason: 'stop' }
        if (!overflowed && r.messages.some((m) => m.content === STEER)) { overflowed = true; throw overflow() }
        return k < 3 ? { message: { role: 'assistant', content: [{ type: 'tool-call', id: `c${k++}`, name: 't', arguments: '{}' }] }, finishReason: 'tool-calls' }
          : { message: { role: 'assistant', content: [{ type: 'text', text: 'done' }] }, finishReason: 'stop' }
      } } as unknown as Provider
    const session = await Session.open(new MemoryStore())
    const agent: Agent = new Agent({ session, provider, tools: [{ ...resultTool(2_000), execute: () => { if (k === 2) agent.steer(STEER)
      return 'r'.repeat(2_000) } }] })
    assert.equal((await agent.run('the task')).text, 'done')
    assert.equal(of(session, 'compaction/summary').length, 1)
    const summaries = sent.filter((r) => r.headers?.['x-dsh-purpose'] === 'compaction')
    assert.ok(summaries.length > 0 && summaries.every((r) => !JSON.stringify(r.messages).includes('STEER')))
    const retry = sent[sent.findIndex((r) => r === summaries.at(-1)) + 1]
    assert.deepEqual(retry.messages.at(-1), { role: 'user', content: STEER })
  })

  // From the hostile review rev6b of the room rule: a steering message is the current input.
  test('input: a steering message is cut by the prune rung before the model has read it once, though it fits the window', async () => {
    // docs/design.md §3 "Oversized messages": "Earlier user messages may be cut likewise; the current input never is".
    // `steer(text)` queues the user's newest words for the next step: they are that step's current input. Window 10,000,
    // system prompt 6,000 (kept window 6,400), a 9,006-character steering message (~2,250 tokens) queued while a tool
    // runs: the request carrying it whole is ~9,000 tokens (over the 8,000 threshold, within the window).
    let k = 0
    const seen: { tokens: number; steer?: string }[] = []
    const provider = { model: 'm', baseURL: 'memory://m', contextWindow: 10_000, maxTokens: 100,
      complete: async (r: ChatRequest) => {
        const steer = r.messages.map((m) => (typeof m.content === 'string' ? m.content : ''))
          .find((c) => c.startsWith('STEER '))
        seen.push({ tokens: requestTokens(r), steer })
        return k < 3 ? { message: { role: 'assistant', content: [{ type: 'tool-call', id: `c${k++}`, name: 't', arguments: '{}' }] },
          finishReason: 'tool-calls' } : { message: { role: 'assistant', content: [{ type: 'text', text: 'ok' }] }, finishReason: 'stop' }
      } } as unknown as Provider
    const session = await Session.open(new MemoryStore())
    const steering = 'STEER ' + 'x'.repeat(9_000)
    const agent: Agent = new Agent({ session, provider, summarizer: shortSummarizer(10_000), system: 's'.repeat(24_000),
      recall: false, tools: [{ ...resultTool(1_200), execute: () => { if (k === 1) agent.steer(steering)
        return 'r'.repeat(1_200) } }] } as ConstructorParameters<typeof Agent>[0])
    await agent.run('task')
    const first = seen.find((s) => s.steer !== undefined)
    assert.ok(first, 'a request carried the steering message')
    const whole = first.tokens - estimateTextTokens(first.steer!) + estimateTextTokens(steering)
    assert.ok(whole < 10_000, `the request with it whole would be ${whole} tokens`)
    // Observed: the first request that carries it has 5,250 characters of the 9,006 (head + marker + tail).
    assert.equal(first.steer!.length, steering.length)
  })
})

describe('summary overflow, calibration, durable state', () => {
  const LLAMA = { error: { code: 400, message: 'request (4191 tokens) exceeds the available context size (4096 tokens), try increasing it', type: 'exceed_context_size_error', n_prompt_tokens: 4191, n_ctx: 4096 } }

  test('case 4: the first summary request overflows with the llama.cpp body: the next one is smaller, none is resent, the turn completes', async () => {
    let s = 0
    const server = await startFakeProvider({
      handler: (req) => req.headers['x-dsh-purpose'] === 'compaction' ? (s++ === 0 ? { status: 400, body: LLAMA } : { text: 'CHECKPOINT: part done.' }) : conv[Math.min(c++, conv.length - 1)],
    })
    servers.push(server)
    let c = 0, n = 0
    const conv: FakeReply[] = [...steps(7).map((r) => ({ ...r, usage: null })), { text: 'done', usage: null }]
    const provider = tuned({ maxRetries: 0 }, () => openAICompatible({ baseURL: server.url, model: 'fake-model', apiKey: 'k', contextWindow: 4_096 }))
    const session = await Session.open(new MemoryStore())
    const fetch: Tool = { name: 'fetch', description: '', parameters: {}, execute: () => `r${n++} `.padEnd(2_000, '.') }
    const r = await new Agent({ session, provider, tools: [fetch], compaction: { clear: false } }).run('go')
    assert.equal(r.text, 'done')
    const sums = server.requests.filter((q) => q.headers['x-dsh-purpose'] === 'compaction')
    assert.ok(sums.length >= 2, `${sums.length} summary requests`)
    assert.ok(sums[1].rawBody.length < sums[0].rawBody.length)
    const est = (q: FakeRequest) => JSON.stringify(q.body.messages).length
    assert.ok(est(sums[1]) < est(sums[0]))
    assert.equal(new Set(sums.map((q) => q.rawBody)).size, sums.length, 'no two summary requests are identical')
    for (const q of sums) assert.ok(q.body.max_tokens <= 4_096 / 2, `max_tokens ${q.body.max_tokens}`)
    const sample = of(session, 'ladder/state').find((e) => (e.data as any).sample)
    assert.equal((sample!.data as any).sample.providerTokens, 4_191)
  })

  test('summary max_tokens = min(summaryMaxTokens, max(512, floor(region / 2))), clamped to the room', () => {
    assert.equal(summaryMaxTokens(231, ladderConfig()), 512)
    assert.equal(summaryMaxTokens(10_000, ladderConfig()), 5_000)
    assert.equal(summaryMaxTokens(40_000, ladderConfig()), 8_192)
    assert.equal(summaryMaxTokens(10_000, ladderConfig(), 700), 700)
  })

  test('case 5: usage 1.3× the heuristic → calibration ≈ 1.3, and pressure fires on the calibrated total; no usage → the seed formula exactly', async () => {
    const session = await Session.open(new MemoryStore())
    logHeader(session, { model: 'm', baseURL: 'http://x' })
    for (let i = 0; i < 3; i++) {
      session.append('user/message', { message: { role: 'user', content: 'u'.repeat(8_000) }, surfaceOp: { op: 'append' } })
      const h = session.measure().heuristicTokens
      session.append('assistant/message', { message: { role: 'assistant', content: [{ type: 'text', text: 'ok' }] }, finishReason: 'stop', usage: { promptTokens: Math.round(h * 1.3), completionTokens: 1 }, surfaceOp: { op: 'append' } })
    }
    const m = session.measure()
    assert.equal(m.calibrationSamples, 3)
    assert.ok(Math.abs(m.calibration - 1.3) < 0.001, `calibration ${m.calibration}`)
    const before = m.totalTokens
    session.append('user/message', { message: { role: 'user', content: 'v'.repeat(4_000) }, surfaceOp: { op: 'append' } })
    assert.equal(session.measure().totalTokens, before + Math.ceil(1_008 * m.calibration))
    // A window whose threshold lies between the uncalibrated and the calibrated total: the ladder acts.
    const calibrated = session.measure().totalTokens, plain = before + 1_008
    const window = Math.ceil((plain + calibrated) / 2 / 0.8)
    assert.ok(plain < Math.floor(window * 0.8) && calibrated >= Math.floor(window * 0.8))
    const host = { session, summarizer: openAICompatible({ baseURL: 'http://127.0.0.1:9', model: 'm', apiKey: 'k' }), envelope: {}, settings: { contextWindow: window, compaction: compactionConfig(), prune: DEFAULT_PRUNE_CONFIG } }
    const out = await new Ladder(host).relievePressure()
    assert.notEqual(out.action, 'none')
    // No usage: the seed's formula.
    const plainSession = await Session.open(new MemoryStore())
    plainSession.append('user/message', { message: { role: 'user', content: 'u'.repeat(8_000) }, surfaceOp: { op: 'append' } })
    const pm = plainSession.measure()
    assert.deepEqual([pm.calibration, pm.calibrationSamples, pm.totalTokens], [1, 0, 2_008])
  })

  test('case 6: a failed pressure compaction, then a restart on the same FileStore: no summary request until the surface grows by the retained tail', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'dsh-guard-'))
    try {
      const path = join(dir, 's.jsonl')
      let n = 0
      const f = await fake((_req, i) => (i < 9 ? { toolCalls: [{ id: `g${i}`, name: 'fetch', arguments: { i } }], usage: null } : { text: `answer ${i}`, usage: null }), [{ status: 500, body: { error: { message: 'summariser down' } } }], 16_000)
      const fetch: Tool = { name: 'fetch', description: '', parameters: {}, execute: () => `r${n++} `.padEnd(7_000, '.') }
      const s1 = await Session.open(new FileStore(path))
      const a1 = new Agent({ session: s1, provider: f.provider, tools: [fetch], compaction: { clear: false } })
      await a1.run('fill')
      const failedAt = a1.ladder.failedAtTokens
      assert.ok(failedAt !== undefined, 'the pressure compaction failed and is remembered')
      const before = f.summary().length
      assert.ok(before >= 1)
      await s1.sync(); await s1.store.close?.()
      // Restart: a new process reads the guard back from the log.
      const s2 = await Session.open(new FileStore(path))
      const a2 = new Agent({ session: s2, provider: f.provider, tools: [fetch], compaction: { clear: false } })
      assert.equal(a2.ladder.failedAtTokens, failedAt)
      await a2.run('small follow-up')
      assert.equal(f.summary().length, before, 'no summary request after the restart while the surface has not grown by the retained tail')
      assert.ok(s2.measure().totalTokens >= 12_800, 'still over the threshold: only the guard holds the summary back')
      await s2.store.close?.()
    } finally { rmSync(dir, { recursive: true, force: true }) }
  })
})

// A small window and a tokenizer that counts three times the heuristic (as llama-server's
// 512-token vocabulary does): every figure the ladder compares with the window must be in the
// window's tokens, and the envelope the next request will carry must be priced (docs/design.md §10).
describe('small windows and a tokenizer that counts more than the heuristic', () => {
  const user = (text: string) => ({ message: { role: 'user' as const, content: text }, surfaceOp: { op: 'append' as const } })
  const assistant = (text: string, usage?: { promptTokens: number; completionTokens: number }) =>
    ({ message: { role: 'assistant' as const, content: [{ type: 'text' as const, text }] }, finishReason: 'stop' as const, ...(usage ? { usage } : {}), surfaceOp: { op: 'append' as const } })
  /** `n` heuristic tokens of text in one message (ceil(chars / 4) + 8). */
  const text = (tokens: number, c = 'x') => c.repeat((tokens - 8) * 4)
  const bigTool = (chars: number): ToolSpec => ({ name: 'big', description: 'd'.repeat(chars), parameters: { type: 'object' } })
  const host = (session: Session, contextWindow: number, envelope: () => Envelope, summarizer = tuned({ maxRetries: 0 }, () => openAICompatible({ baseURL: 'http://127.0.0.1:9', model: 'm', apiKey: 'k' })), compaction = {}): CompactionHost => ({
    session, summarizer, get envelope() { return envelope() }, settings: { contextWindow, compaction: compactionConfig(compaction), prune: DEFAULT_PRUNE_CONFIG },
  })
  /** Three calibration samples at 3 provider tokens per heuristic token (no anchor). */
  const calibrateAt3 = (session: Session) => { for (let i = 0; i < 3; i++) session.append('ladder/state', { sample: { providerTokens: 3_000, heuristicTokens: 1_000, source: 'summary' } }) }

  test('the smallest calibration sample is 1,000 heuristic tokens, or an eighth of a smaller window', async () => {
    assert.deepEqual([calibrationMinSampleTokens(), calibrationMinSampleTokens(128_000), calibrationMinSampleTokens(8_000), calibrationMinSampleTokens(2_048)], [CALIBRATION_MIN_SAMPLE_TOKENS, 1_000, 1_000, 256])
    const samples = async (contextWindow: number) => {
      const session = await Session.open(new MemoryStore())
      logHeader(session, { model: 'm', baseURL: 'http://x', contextWindow })
      session.append('user/message', user(text(400)))
      session.append('assistant/message', assistant('ok', { promptTokens: 1_000, completionTokens: 1 }))
      return session.measure()
    }
    const small = await samples(2_048)
    assert.equal(small.calibrationSamples, 1)
    assert.equal(small.calibration, 1_000 / 400)
    assert.equal((await samples(128_000)).calibrationSamples, 0)
  })

  test('an overflow count of a request too small to be a calibration sample still anchors the total', async () => {
    const session = await Session.open(new MemoryStore())
    logHeader(session, { model: 'm', baseURL: 'http://x' })
    session.append('user/message', user(text(500)))
    session.append('ladder/state', { sample: { providerTokens: 1_500, heuristicTokens: 500, source: 'overflow' } })
    const m = session.measure()
    assert.deepEqual([m.anchored, m.totalTokens, m.calibrationSamples, m.calibration], [true, 1_500, 0, 1])
    // An implausible count (over 4× the heuristic) anchors nothing.
    session.append('ladder/state', { sample: { providerTokens: 5_000, heuristicTokens: 500, source: 'overflow' } })
    assert.equal(session.measure().totalTokens, 1_500)
  })

  test('pressure: a prune that makes the host offer a tool is not enough when that tool pushes the next request back over the threshold', async () => {
    const session = await Session.open(new MemoryStore())
    logHeader(session, { model: 'm', baseURL: 'http://x' })
    session.append('user/message', user('go'))
    for (const [id, chars] of [['c1', 20_000], ['c2', 20_000], ['c3', 1_300]] as const) {
      session.append('assistant/message', { message: { role: 'assistant', content: [{ type: 'tool-call', id, name: 'read', arguments: '{}' }] }, finishReason: 'tool_calls', surfaceOp: { op: 'append' } })
      session.append('tool/result', { message: { role: 'tool', toolCallId: id, content: [{ type: 'text', text: 'r'.repeat(chars) }] }, surfaceOp: { op: 'append' } })
    }
    session.append('assistant/message', assistant('ok'))
    session.append('user/message', user(text(2_000))) // under the pruner's 8,192 code points
    // The host offers a 2,5xx-token tool once something is shadowed (as the Agent offers recall).
    const tool = bigTool(10_000)
    const toolTokens = estimateEnvelopeTokens({ tools: [tool] })
    // The newest 1,600 tokens of results are protected (c3, 333 tokens, and the pruned c2), the oldest clearable.
    const h = host(session, 8_000, () => (RecallIndex.of(session).hasShadowedContent ? { tools: [tool] } : {}))
    const before = session.measure().totalTokens
    assert.ok(before >= 6_400, `${before}`)
    const out = await new Ladder(h).relievePressure()
    // The prunes alone take the session's own total under 6,400, but not the next request.
    assert.equal(session.events.filter((e) => e.type === 'compaction/prune').length, 2)
    assert.equal(out.action, 'cleared', `${out.action} ${out.reason ?? ''}`)
    assert.ok(session.events.some((e) => e.type === 'compaction/clear'))
    assert.equal(out.tokensAfter, session.measure().totalTokens + toolTokens)
    assert.ok(out.tokensAfter < 6_400, `${out.tokensAfter}`)
  })

  test('a summary request leaves out tool specs that would take more than a tenth of the window at the calibration; smaller ones are kept', async () => {
    const bodies: any[] = []
    const server = await startFakeProvider({ handler: (req) => { bodies.push(req.body); return { text: 'CHECKPOINT: part done.' } } })
    servers.push(server)
    const summarizer = tuned({ maxRetries: 0 }, () => openAICompatible({ baseURL: server.url, model: 'm', apiKey: 'k', contextWindow: 8_000 }))
    const messages = [{ role: 'user' as const, content: text(300) }, { role: 'assistant' as const, content: [{ type: 'text' as const, text: text(300) }] }]
    for (const [chars, kept] of [[4_000, false], [400, true]] as const) {
      const session = await Session.open(new MemoryStore())
      const tools = [bigTool(chars)]
      assert.equal(estimateEnvelopeTokens({ tools }) > 8_000 * SUMMARY_TOOLS_MAX_RATIO, !kept)
      await summarise(host(session, 8_000, () => ({ system: 'be brief', tools }), summarizer), messages)
      const body = bodies.at(-1)
      assert.equal(body.messages[0].content, 'be brief')
      assert.equal(body.tools !== undefined, kept, `tools of ${chars} characters`)
    }
    // The calibration counts: 300 characters of spec at 3× is over a tenth of a 2,000-token window.
    const session = await Session.open(new MemoryStore())
    calibrateAt3(session)
    const tools = [bigTool(600)]
    const tokens = estimateEnvelopeTokens({ tools })
    assert.ok(tokens <= 200 && tokens * 3 > 200)
    await summarise(host(session, 2_000, () => ({ tools }), tuned({ maxRetries: 0 }, () => openAICompatible({ baseURL: server.url, model: 'm', apiKey: 'k' }))), [messages[0]])
    assert.equal(bodies.at(-1).tools, undefined)
  })

  const summarizerAt = async (text: string) => {
    const server = await startFakeProvider({ handler: () => ({ text, usage: null }) }) // no usage: the calibration stays at 3
    servers.push(server)
    return tuned({ maxRetries: 0 }, () => openAICompatible({ baseURL: server.url, model: 'm', apiKey: 'k' }))
  }

  test('pressure at calibration 3: the retained tail is measured tokens of the window (1,120 tokens = 374 heuristic), not heuristic ones', async () => {
    const session = await Session.open(new MemoryStore())
    logHeader(session, { model: 'm', baseURL: 'http://x' })
    calibrateAt3(session)
    const seqs = [
      session.append('user/message', user(text(500, 'a'))).seq,
      session.append('assistant/message', assistant(text(500, 'b'))).seq,
      session.append('user/message', user(text(500, 'c'))).seq,
      session.append('assistant/message', assistant(text(500, 'd'))).seq,
    ]
    assert.equal(session.measure().totalTokens, 6_000)
    const out = await new Ladder(host(session, 7_000, () => ({}), await summarizerAt('CHECKPOINT: short.'))).relievePressure() // threshold 5,600
    assert.equal(out.action, 'compacted', out.reason)
    const summary = session.events.find((e) => e.type === 'compaction/summary')!
    assert.deepEqual((summary.data as any).shadowedSeqs, seqs.slice(0, 3), 'only the newest message (500 heuristic = 1,500 tokens) is the retained tail')
  })

  test('pressure at calibration 3: the checkpoint\'s ledger fits its budget in measured tokens of the window (a third in heuristic ones)', async () => {
    const session = await Session.open(new MemoryStore())
    logHeader(session, { model: 'm', baseURL: 'http://x' })
    calibrateAt3(session)
    for (let i = 0; i < 20; i++) {
      session.append('user/message', user(`question ${String(i).padStart(2, '0')} `.padEnd(300, 'q')))
      session.append('assistant/message', assistant(text(250, 'b')))
    }
    const window = 20_000 // threshold 16,000; the ledger budget 1,000 tokens = 333 heuristic at 3×
    assert.ok(session.measure().totalTokens >= 16_000)
    const out = await new Ladder(host(session, window, () => ({}), await summarizerAt('CHECKPOINT: short.'))).relievePressure()
    assert.equal(out.action, 'compacted', out.reason)
    const summary = session.events.find((e) => e.type === 'compaction/summary')!.data as any
    assert.ok(summary.shadowedSeqs.length >= 20, `${summary.shadowedSeqs.length} messages summarised`)
    const checkpoint = session.messages()[0].content as string
    assert.ok(checkpoint.startsWith(CHECKPOINT_PREAMBLE))
    const ledgerText = checkpoint.slice(checkpoint.indexOf('</compacted-summary>') + '</compacted-summary>'.length)
    assert.ok(ledgerText.includes('question '), `the ledger quotes the user: ${ledgerText}`)
    // The user's messages have their own budget, 15% of the window: 3,000 tokens = 1,000 heuristic at 3×
    // (4,000 UTF-16 units). The questions (332 units each as lines) do not fit whole: all are there, cut alike.
    // The task (the first question, under 10% of the window) whole (332 units); the other 16 need at least 232
    // units each (200 + tags): one, the oldest, is left out, its recall key named (a line of 101 units), the other 15
    // are cut alike to 205.
    const users = summary.ledger.userMessages as Array<{ text: string; pruned?: boolean }>
    assert.equal(summary.shadowedSeqs.filter((seq: number) => session.events[seq].type === 'user/message').length, 17)
    const [task, ...rest] = users
    assert.equal(task.text, `question 00 `.padEnd(300, 'q'), 'the task whole')
    assert.deepEqual(rest.map((u) => [u.text.length, u.pruned]), Array.from({ length: 15 }, () => [205, true]))
    assert.ok(rest[0].text.startsWith('question 02 '), rest[0].text.slice(0, 20))
    const oldest = session.events.find((e) => e.type === 'user/message' && (e.data as any).message.content.startsWith('question 01 '))!.seq
    assert.deepEqual([summary.ledger.trimmed, summary.ledger.leftOut], [0, [oldest]], 'the oldest later question left out')
    const line = `(1 older user messages left out to fit their budget; recall {"key":"seq:N"} returns one whole: seq:${oldest})`
    assert.ok(ledgerText.includes(`\n${line}\n`) && line.length === 101)
    assert.equal(users.reduce((n, u) => n + u.text.length + 32, 0), 332 + 15 * 237)
    const budget = Math.floor(ledgerBudget(window) / 3) + Math.floor((window * 0.15) / 3)
    assert.ok(estimateTextTokens(ledgerText) <= budget, `ledger ${estimateTextTokens(ledgerText)} heuristic tokens; budget ${budget} at 3×`)
  })
})

describe('small windows against a dense tokenizer (attack3)', () => {
  const bigResult = (i: number) => `result ${i} `.padEnd(2_400, 'z')
  test('recall is not offered once its spec would take more than a tenth of the window (1,024 tokens: 150 > 102); a recall call is still answered; one warning', async () => {
    // Against llama-server's 512-token vocabulary the recall spec costs 721 tokens: in a 1,024-token
    // window every request after the first compaction overflowed and the session could not go on.
    const f = await fake([
      { toolCalls: [{ id: 'k1', name: 'recall', arguments: { key: 'c0' } }] },
      { text: 'done' },
    ], [{ text: 'CHECKPOINT' }], 1_024)
    const session = await Session.open(new MemoryStore())
    session.append('assistant/message', { message: { role: 'assistant', content: [{ type: 'tool-call', id: 'c0', name: 'fetch', arguments: '{}' }] }, finishReason: 'tool_calls', surfaceOp: { op: 'append' } })
    session.append('tool/result', { message: { role: 'tool', toolCallId: 'c0', content: [{ type: 'text', text: bigResult(0) }] }, surfaceOp: { op: 'append' } })
    const seq = session.events.at(-1)!.seq
    assert.ok(pruneToolResult(session, seq, { thresholdChars: 1_000, headChars: 100, tailChars: 50 }, 'manual') > 0)
    assert.equal(RecallIndex.of(session).hasShadowedContent, true)
    const warnings: string[] = []
    const agent = new Agent({ session, provider: f.provider, compaction: { auto: false }, onEvent: (e) => { if (e.type === 'warning') warnings.push(e.message) } })
    const r = await agent.run('go')
    assert.equal(r.text, 'done')
    for (const req of f.conversation()) assert.ok(!(req.body.tools ?? []).some((t: any) => t.function.name === RECALL_TOOL_NAME), 'recall offered in a 1,024-token window')
    const answer = session.events.filter((e) => e.type === 'tool/result').at(-1)!.data as any
    assert.equal(answer.message.toolCallId, 'k1')
    assert.ok(answer.message.content[0].text.includes('result 0 zzz'), `recall answered: ${answer.message.content[0].text.slice(0, 200)}`)
    assert.equal(warnings.filter((w) => w.includes('recall tool is not offered')).length, 1, warnings.join('\n'))
  })

  test('recall is offered in a window that affords it (2,048 at calibration 1), and dropped for good once the calibration makes it too dear', async () => {
    const f = await fake([{ text: 'ok' }], [{ text: 'CHECKPOINT' }], 2_048)
    const session = await Session.open(new MemoryStore())
    logHeader(session, { model: 'fake-model', baseURL: f.server.url, contextWindow: 2_048 })
    session.append('assistant/message', { message: { role: 'assistant', content: [{ type: 'tool-call', id: 'c0', name: 'fetch', arguments: '{}' }] }, finishReason: 'tool_calls', surfaceOp: { op: 'append' } })
    session.append('tool/result', { message: { role: 'tool', toolCallId: 'c0', content: [{ type: 'text', text: bigResult(0) }] }, surfaceOp: { op: 'append' } })
    pruneToolResult(session, session.events.at(-1)!.seq, { thresholdChars: 1_000, headChars: 100, tailChars: 50 }, 'manual')
    const agent = new Agent({ session, provider: f.provider, compaction: { auto: false } })
    const offered = (i: number) => (f.conversation()[i].body.tools ?? []).some((t: any) => t.function.name === RECALL_TOOL_NAME)
    await agent.run('one')
    assert.equal(offered(0), true, 'at calibration 1 the spec (150) is under 204')
    // The server counts 3 tokens per heuristic one (e.g. summary requests' usage): 150 × 3 = 450 > 204.
    for (let i = 0; i < 3; i++) session.append('ladder/state', { sample: { providerTokens: 3_000, heuristicTokens: 1_000, source: 'summary' } })
    await agent.run('two')
    await agent.run('three')
    assert.equal(offered(1), false)
    assert.equal(offered(2), false)
  })

  test('an input that cannot fit beside the envelope is refused before the ladder spends a summary on the history', async () => {
    const f = await fake([{ text: 'never' }], [{ text: 'CHECKPOINT' }], 1_000)
    const session = await Session.open(new MemoryStore())
    for (let i = 0; i < 6; i++) {
      session.append('user/message', { message: { role: 'user', content: `q${i} `.padEnd(400, 'q') }, surfaceOp: { op: 'append' } })
      session.append('assistant/message', { message: { role: 'assistant', content: [{ type: 'text', text: `a${i} `.padEnd(400, 'a') }] }, finishReason: 'stop', surfaceOp: { op: 'append' } })
    }
    const huge: Tool = { name: 'huge', description: 'd'.repeat(4_000), parameters: { type: 'object' }, execute: () => 'x' }
    const agent = new Agent({ session, provider: f.provider, tools: [huge] })
    await assert.rejects(agent.run('go'), (e: unknown) => e instanceof ProviderError && e.code === 'CONTEXT_WINDOW_EXCEEDED' && /nothing was sent/.test(e.message))
    assert.equal(f.summary().length, 0, 'a summary was requested for a turn that could not be sent')
    assert.equal(f.conversation().length, 0)
    assert.equal(of(session, 'compaction/summary').length, 0, 'history was summarised away for nothing')
  })
})

describe('window figures in window tokens at calibration 3 (attack3)', () => {
  const at3 = (session: Session) => { for (let i = 0; i < 3; i++) session.append('ladder/state', { sample: { providerTokens: 3_000, heuristicTokens: 1_000, source: 'summary' } }) }
  const unreachable = tuned({ maxRetries: 0 }, () => openAICompatible({ baseURL: 'http://127.0.0.1:9', model: 'm', apiKey: 'k' }))
  const hostOf = (session: Session, contextWindow: number, summarizer = unreachable, compaction = {}): CompactionHost => ({
    session, summarizer, envelope: {}, settings: { contextWindow, compaction: compactionConfig(compaction), prune: DEFAULT_PRUNE_CONFIG },
  })
  const toolStep = (session: Session, id: string, tokens: number) => {
    session.append('assistant/message', { message: { role: 'assistant', content: [{ type: 'tool-call', id, name: 'fetch', arguments: '{}' }] }, finishReason: 'tool_calls', surfaceOp: { op: 'append' } })
    session.append('tool/result', { message: { role: 'tool', toolCallId: id, content: [{ type: 'text', text: `${id} `.padEnd((tokens - 8) * 4, 'r') }] }, surfaceOp: { op: 'append' } })
    return session.events.at(-1)!.seq
  }

  test('clear: the protected recent budget is floor(window × 0.2) measured tokens, so a third of it in heuristic ones', async () => {
    const session = await Session.open(new MemoryStore())
    logHeader(session, { model: 'm', baseURL: 'http://x' })
    at3(session)
    const results = Array.from({ length: 8 }, (_, i) => toolStep(session, `c${i}`, 500))
    // Window 10,000: protected 2,000 tokens = 667 heuristic = the newest two results (not four).
    assert.ok(session.measure().totalTokens >= 8_000, `${session.measure().totalTokens}`)
    await new Ladder(hostOf(session, 10_000, unreachable, { thresholdRatio: 0.1 })).relievePressure() // clear down to 750: every candidate
    const cleared = new Set(session.events.filter((e) => e.type === 'compaction/clear').flatMap((e) => (e.data as any).shadowedSeqs))
    assert.ok(!cleared.has(results[7]) && !cleared.has(results[6]), 'the newest two results are protected')
    assert.equal(cleared.size, 6, `the third-newest and older results (beyond 667 heuristic tokens) are cleared; cleared ${[...cleared].join(',')} of ${results.join(',')}`)
    assert.ok(cleared.has(results[5]), `the third-newest result (beyond 667 heuristic tokens) is clearable; cleared ${[...cleared].join(',')} of ${results.join(',')}`)
  })

  test('pin: the limit (the compaction threshold, in tokens of the window) is compared with the pinned prices at the calibration', async () => {
    const session = await Session.open(new MemoryStore())
    logHeader(session, { model: 'm', baseURL: 'http://x', contextWindow: 2_000 })
    at3(session)
    session.append('user/message', { message: { role: 'user', content: 'p'.repeat((600 - 8) * 4) }, surfaceOp: { op: 'append' } })
    // 600 heuristic tokens = 1,800 tokens of the window at 3×: over the 1,600-token limit.
    assert.throws(() => Pins.of(session).pin(session.events.at(-1)!.seq), (e: unknown) => (e as { code?: string }).code === 'PIN' && /at × 3\.00 calibration \(1800 tokens\)/.test((e as Error).message))
  })

  test('a successful overflow compaction clears the failed-pressure guard (durably), so pressure summarises again before the next overflow', async () => {
    const down = { status: 500, body: { error: { message: 'summariser down' } } }
    const f = await fake([{ text: 'x' }], [down, down, { text: 'CHECKPOINT: ok.' }], 10_000) // pressure tries twice
    const session = await Session.open(new MemoryStore())
    logHeader(session, { model: 'm', baseURL: 'http://x' })
    for (let i = 0; i < 10; i++) {
      session.append('user/message', { message: { role: 'user', content: `q${i} `.padEnd(2_000, 'q') }, surfaceOp: { op: 'append' } })
      session.append('assistant/message', { message: { role: 'assistant', content: [{ type: 'text', text: `a${i} `.padEnd(1_400, 'a') }] }, finishReason: 'stop', surfaceOp: { op: 'append' } })
    }
    const ladder = new Ladder(hostOf(session, 10_000, f.provider))
    const failed = await ladder.relievePressure()
    assert.equal(failed.action, 'failed')
    assert.ok(ladder.failedAtTokens !== undefined)
    const recovered = await ladder.recoverOverflow(undefined)
    assert.equal(recovered.action, 'compacted', recovered.reason)
    assert.equal(ladder.failedAtTokens, undefined)
    assert.equal(new Ladder(hostOf(session, 10_000)).failedAtTokens, undefined, 'a resumed ladder does not restore the stale guard')
  })
})

describe('summary of a wide tool step (attack3)', () => {
  test('one assistant message with 12 parallel calls and their results, larger than the summarizer\'s window at calibration 3: shortened until it fits, then summarised', async () => {
    // Against llama-server (2,048 tokens) this group made every compaction fail with "a summary
    // request of 2360 tokens would not fit": the even share let the 12 short tool-call arguments be
    // "cut" into longer ones, and what the calls cannot give up was not taken from the results.
    const bodies: any[] = []
    const server = await startFakeProvider({ handler: (req) => { bodies.push(req.body); return { text: 'CHECKPOINT: read twelve files.', usage: null } } })
    servers.push(server)
    const summarizer = tuned({ maxRetries: 0 }, () => openAICompatible({ baseURL: server.url, model: 'm', apiKey: 'k' }))
    const session = await Session.open(new MemoryStore())
    for (let i = 0; i < 3; i++) session.append('ladder/state', { sample: { providerTokens: 3_000, heuristicTokens: 1_000, source: 'summary' } })
    const calls = Array.from({ length: 12 }, (_, k) => ({ type: 'tool-call' as const, id: `t${k}`, name: 'read_file', arguments: JSON.stringify({ path: `f${k}.txt` }) }))
    const messages = [
      { role: 'assistant' as const, content: calls },
      ...calls.map((c, k) => ({ role: 'tool' as const, toolCallId: c.id, content: [{ type: 'text' as const, text: `file ${k} `.padEnd(400, 'w') }] })),
    ]
    const host: CompactionHost = { session, summarizer, envelope: {}, settings: { contextWindow: 2_048, compaction: compactionConfig({ summaryMaxTokens: 128 }), prune: DEFAULT_PRUNE_CONFIG } }
    assert.ok(messages.reduce((t, m) => t + estimateMessageTokens(m), 0) * 3 > 2_048)
    const r = await summarise(host, messages)
    assert.equal(r.summary, 'CHECKPOINT: read twelve files.')
    assert.equal(bodies.length, 1)
    const sent = bodies[0].messages
    // Every call keeps its id and name; no argument grew; the request fits the window at 3×.
    const assistantSent = sent.find((m: any) => m.role === 'assistant')
    assert.equal(assistantSent.tool_calls.length, 12)
    for (const [k, c] of assistantSent.tool_calls.entries()) assert.ok(c.function.arguments.length <= calls[k].arguments.length, c.function.arguments)
    const results = sent.filter((m: any) => m.role === 'tool')
    assert.equal(results.length, 12)
    for (const m of results) assert.ok(m.content.length < 400, `a result of ${m.content.length} characters was not shortened`)
  })
})

describe('no summary request is sent twice after it overflowed (attack3)', () => {
  test('pressure (2 attempts) against a summarizer that always overflows (no counts): the second attempt does not resend the first attempt\'s requests', async () => {
    // Against llama-server the second attempt re-planned from the calibration the first one learnt
    // and sent, byte for byte, the request the server had just refused.
    const bodies: string[] = []
    const server = await startFakeProvider({ handler: (req) => { bodies.push(JSON.stringify(req.body.messages) + req.body.max_tokens); return { status: 400, body: { error: { code: 400, message: 'the request exceeds the available context size, try increasing it', type: 'exceed_context_size_error' } } } } })
    servers.push(server)
    const summarizer = tuned({ maxRetries: 0 }, () => openAICompatible({ baseURL: server.url, model: 'm', apiKey: 'k' }))
    const session = await Session.open(new MemoryStore())
    logHeader(session, { model: 'm', baseURL: 'http://x' })
    for (let i = 0; i < 10; i++) {
      session.append('user/message', { message: { role: 'user', content: `q${i} `.padEnd(2_000, 'q') }, surfaceOp: { op: 'append' } })
      session.append('assistant/message', { message: { role: 'assistant', content: [{ type: 'text', text: `a${i} `.padEnd(1_400, 'a') }] }, finishReason: 'stop', surfaceOp: { op: 'append' } })
    }
    const host: CompactionHost = { session, summarizer, envelope: {}, settings: { contextWindow: 10_000, compaction: compactionConfig(), prune: DEFAULT_PRUNE_CONFIG } }
    const out = await new Ladder(host).relievePressure()
    assert.equal(out.action, 'failed')
    assert.ok(bodies.length >= 2)
    assert.equal(new Set(bodies).size, bodies.length, `${bodies.length} summary requests, ${bodies.length - new Set(bodies).size} of them repeats`)
    // And the overflow rung after it does not resend them either.
    await new Ladder(host).recoverOverflow(undefined)
    assert.equal(new Set(bodies).size, bodies.length, `${bodies.length} summary requests, ${bodies.length - new Set(bodies).size} of them repeats`)
  })
})

describe('a server whose window is smaller than the configured one (attack3)', () => {
  test('an overflow whose count puts the system prompt and tool specs alone over the threshold says so once: no rung can make room', async () => {
    const session = await Session.open(new MemoryStore())
    const tools = [{ name: 'big', description: 'd'.repeat(3_000), parameters: { type: 'object' } }]
    logHeader(session, { model: 'm', baseURL: 'http://x', contextWindow: 2_048, system: 's'.repeat(400), tools })
    session.append('user/message', { message: { role: 'user', content: 'Say hello.' }, surfaceOp: { op: 'append' } })
    const m = session.measure()
    const warnings: string[] = []
    const host: CompactionHost = { session, summarizer: tuned({ maxRetries: 0 }, () => openAICompatible({ baseURL: 'http://127.0.0.1:9', model: 'm', apiKey: 'k' })), envelope: { system: 's'.repeat(400), tools }, settings: { contextWindow: 2_048, compaction: compactionConfig(), prune: DEFAULT_PRUNE_CONFIG, onEvent: warningsTo(warnings) } }
    const body = JSON.stringify({ error: { code: 400, message: 'request (3728 tokens) exceeds the available context size (2048 tokens), try increasing it', type: 'exceed_context_size_error', n_prompt_tokens: 3728, n_ctx: 2048 } })
    const ladder = new Ladder(host)
    const out = await ladder.recoverOverflow(new ProviderError('CONTEXT_WINDOW_EXCEEDED', 'overflow', { status: 400, body }))
    assert.equal(out.generationAfter, out.generationBefore, 'nothing to prune or summarise: no retry')
    await ladder.recoverOverflow(new ProviderError('CONTEXT_WINDOW_EXCEEDED', 'overflow', { status: 400, body }))
    const w = warnings.filter((x) => x.includes('tool specs alone'))
    assert.equal(w.length, 1, warnings.join('\n'))
    const expected = Math.round((3_728 * m.envelopeTokens) / m.heuristicTokens)
    assert.ok(expected >= 1_638 && expected < 3_728)
    assert.ok(w[0].startsWith(`the system prompt and tool specs alone are about ${expected} tokens by the provider's count (${m.envelopeTokens} of the request's ${m.heuristicTokens} heuristic tokens; it counted 3728), at or above the compaction threshold of 1638 of the 2048-token window`), w[0])
    // A request whose envelope is small says nothing of the kind.
    const small = await Session.open(new MemoryStore())
    logHeader(small, { model: 'm', baseURL: 'http://x', contextWindow: 2_048 })
    small.append('user/message', { message: { role: 'user', content: 'x'.repeat(6_000) }, surfaceOp: { op: 'append' } })
    const quiet: string[] = []
    await new Ladder({ ...host, session: small, envelope: {}, settings: { ...host.settings, onEvent: warningsTo(quiet) } }).recoverOverflow(new ProviderError('CONTEXT_WINDOW_EXCEEDED', 'overflow', { status: 400, body }))
    assert.equal(quiet.filter((x) => x.includes('tool specs alone')).length, 0, quiet.join('\n'))
  })

  test('an input refused because the system prompt and tool specs crowd the window says that, not "shorten the input"', async () => {
    const f = await fake([{ text: 'never' }], undefined, 2_048)
    const session = await Session.open(new MemoryStore())
    const big: Tool = { name: 'big', description: 'd'.repeat(9_000), parameters: { type: 'object' }, execute: () => '' }
    const agent = new Agent({ session, provider: f.provider, tools: [big], system: 'You are terse.' })
    await assert.rejects(agent.run('Say hello.'), (e: Error) => {
      assert.match(e.message, /^CONTEXT_WINDOW_EXCEEDED: the system prompt and tool specs alone are \d+ tokens, and with the \d+-token input \(\d+ in all\) they do not fit the context window of fake-model, 2048 tokens; nothing was sent\. Use a model with a larger window, or fewer or shorter tools and system prompt\.$/)
      return true
    })
    assert.equal(f.server.requests.length, 0)
  })

  test('a region no larger than its checkpoint\'s frame and ledger is refused before any summary request', async () => {
    const f = await fake([{ text: 'never' }], [{ text: 'CHECKPOINT: x' }], 2_048)
    const session = await Session.open(new MemoryStore())
    logHeader(session, { model: 'fake-model', baseURL: f.server.url, contextWindow: 2_048 })
    session.append('user/message', { message: { role: 'user', content: 'hi' }, surfaceOp: { op: 'append' } })
    session.append('assistant/message', { message: { role: 'assistant', content: [{ type: 'text', text: 'hello' }] }, finishReason: 'stop', surfaceOp: { op: 'append' } })
    const warnings: string[] = []
    const host: CompactionHost = { session, summarizer: f.provider, envelope: {}, settings: { contextWindow: 2_048, compaction: compactionConfig(), prune: DEFAULT_PRUNE_CONFIG, onEvent: warningsTo(warnings) } }
    const out = await new Ladder(host).recoverOverflow(new ProviderError('CONTEXT_WINDOW_EXCEEDED', 'overflow', { status: 400, body: '{}' }))
    assert.equal(out.summaryRequests, 0)
    assert.equal(f.summary().length, 0)
    const end = session.events.find((e) => e.type === 'compaction/end')!.data as any
    assert.match(end.error, /^the region \(\d+ tokens\) is not larger than its checkpoint's frame and ledger alone \(\d+ tokens\); nothing was sent$/)
  })

  test('a pressure compaction refused before any model call is not attempted again (of its 2 attempts)', async () => {
    const f = await fake([{ text: 'never' }], [{ text: 'CHECKPOINT: x' }], 30)
    const session = await Session.open(new MemoryStore())
    logHeader(session, { model: 'fake-model', baseURL: f.server.url, contextWindow: 30 })
    for (const [role, text] of [['user', 'hi'], ['assistant', 'hello'], ['user', 'ok']] as const) {
      session.append(role === 'user' ? 'user/message' : 'assistant/message', role === 'user'
        ? { message: { role, content: text }, surfaceOp: { op: 'append' } }
        : { message: { role, content: [{ type: 'text', text }] }, finishReason: 'stop', surfaceOp: { op: 'append' } })
    }
    const host: CompactionHost = { session, summarizer: f.provider, envelope: {}, settings: { contextWindow: 30, compaction: compactionConfig(), prune: DEFAULT_PRUNE_CONFIG } }
    const out = await new Ladder(host).relievePressure()
    assert.equal(out.summaryRequests, 0)
    assert.equal(f.summary().length, 0)
    const starts = session.events.filter((e) => e.type === 'compaction/start')
    assert.equal(starts.length, 1, 'one refusal, not one per retry')
    assert.match(out.reason ?? '', /not larger than its checkpoint's frame and ledger alone/)
  })

  test('an overflow error with n_ctx under the configured window warns once, with both numbers and the fix', async () => {
    const session = await Session.open(new MemoryStore())
    logHeader(session, { model: 'm', baseURL: 'http://x', contextWindow: 2_048 })
    session.append('user/message', { message: { role: 'user', content: 'hello' }, surfaceOp: { op: 'append' } })
    const warnings: string[] = []
    const host: CompactionHost = { session, summarizer: tuned({ maxRetries: 0 }, () => openAICompatible({ baseURL: 'http://127.0.0.1:9', model: 'm', apiKey: 'k' })), envelope: {}, settings: { contextWindow: 2_048, compaction: compactionConfig(), prune: DEFAULT_PRUNE_CONFIG, onEvent: warningsTo(warnings) } }
    const body = JSON.stringify({ error: { code: 400, message: 'request (1122 tokens) exceeds the available context size (1024 tokens), try increasing it', type: 'exceed_context_size_error', n_prompt_tokens: 1122, n_ctx: 1024 } })
    const error = new ProviderError('CONTEXT_WINDOW_EXCEEDED', 'overflow', { status: 400, body })
    const ladder = new Ladder(host)
    await ladder.recoverOverflow(error)
    await ladder.recoverOverflow(error)
    const w = warnings.filter((m) => m.includes('reports a context window'))
    assert.equal(w.length, 1, warnings.join('\n'))
    assert.match(w[0], /1024 tokens, smaller than the configured 2048.*--context-window 1024/)
  })
})
