// The net-cost gate and the spend cap (docs/design.md §11 "Edits that pay for themselves"): an edit of
// the cached prefix is made below the threshold only when it pays back within the requests the
// session expects from its own pace; above the threshold it is needed and made, its payback logged.
// A turn stops before the request that would pass its spend cap.
import { test, after } from 'node:test'
import assert from 'node:assert/strict'
import {
  Agent, Session, MemoryStore, ConfigError, openAICompatible, estimateMessageTokens,
  DEFAULT_PRUNE_CONFIG, internals, parseCliArgs, type AgentEvent, type ChatRequest, type Message, type Prices,
  type Provider, type SessionEvent, CostLedger
} from '../dsh.ts'
import { logHeader } from './spec.ts'
import { sseAnswer, sseResponse, startFakeProvider } from './fake-provider.ts'
import { tuned, ladderConfig } from './tuning.ts'
import { FLASH } from './scripted-provider.ts'

const { Ladder } = internals
/** deepseek-flash off-peak, USD per million tokens. */
/** Prune results over 2,000 code points to 1,000 + marker (39) + 500. */
const PRUNE = { thresholdChars: 2_000, headChars: 1_000, tailChars: 500 }

const servers: Array<{ close(): Promise<void> }> = []
after(async () => { for (const s of servers) await s.close() })

/**
 * A session of known pace — turn 1 took 5 requests, turn 2 has made 2 — whose last request read a
 * 30,000-token surface from the cache (heuristic tokens, no envelope). Turn 1's first step read a tool
 * result of 3,540 code points that saves 500 tokens when pruned with {@link PRUNE}, near the head of
 * that prefix; everything else is under the prune threshold but turn 2's input, which is never edited.
 */
async function pacedSession(): Promise<{ session: Session; resultSeq: number }> {
  const session = await Session.open(new MemoryStore())
  logHeader(session, { model: 'm', baseURL: 'http://127.0.0.1:9', prices: FLASH })
  const append = (type: string, data: Record<string, unknown>) => session.append(type, data)
  const say = (message: Message) => append(`${message.role === 'tool' ? 'tool/result' : `${message.role}/message`}`,
    { message, surfaceOp: { op: 'append' }, ...(message.role === 'assistant' ? { finishReason: 'stop' } : {}) })
  const call = (id: string): Message => ({ role: 'assistant', content: [{ type: 'tool-call', id, name: 'read', arguments: '{}' }] })
  const ok = (id: string): Message => ({ role: 'tool', toolCallId: id, content: [{ type: 'text', text: 'ok' }] })
  append('turn/start', { turn: 1 })
  say({ role: 'user', content: 'go' })
  let result = 0
  for (let step = 1; step <= 5; step++) {
    append('step/start', { turn: 1, step })
    if (step === 1) {
      say(call('c1'))
      result = say({ role: 'tool', toolCallId: 'c1', content: [{ type: 'text', text: 'r'.repeat(3_540) }] }).seq
    } else say({ role: 'assistant', content: [{ type: 'text', text: `answer ${step}` }] })
    append('step/end', { turn: 1, step })
  }
  append('turn/end', { turn: 1, reason: 'stop' })
  append('turn/start', { turn: 2 })
  // The input pads the surface the second request of turn 2 reads to exactly 30,000 tokens.
  const rest = session.measure().surfaceTokens + estimateMessageTokens(call('c2')) + estimateMessageTokens(ok('c2'))
  say({ role: 'user', content: 'p'.repeat(4 * (30_000 - rest - 8)) })
  append('step/start', { turn: 2, step: 1 })
  say(call('c2'))
  say(ok('c2'))
  append('step/end', { turn: 2, step: 1 })
  append('step/start', { turn: 2, step: 2 })
  say(call('c3'))
  say(ok('c3'))
  return { session, resultSeq: result }
}

const host = (session: Session, contextWindow: number, gate = true, onEvent?: (e: AgentEvent) => void) => ({
  session, summarizer: tuned({ maxRetries: 0 }, () => openAICompatible({ baseURL: 'http://127.0.0.1:9', model: 'm', apiKey: 'k' })),
  envelope: {}, settings: { contextWindow, prune: { ...DEFAULT_PRUNE_CONFIG, ...PRUNE }, onEvent,
    compaction: ladderConfig({ clear: false, gate }) },
})
const prunes = (session: Session) => session.events.filter((e) => e.type === 'compaction/prune') as SessionEvent<'compaction/prune'>[]

test('case 1: a 500-token saving over 3 expected requests does not pay for a 30,000-token cached prefix; over the threshold it is made', async () => {
  const { session, resultSeq } = await pacedSession()
  const node = session.surface().node(resultSeq)!
  assert.equal(node.tokens - estimateMessageTokens({ role: 'tool', toolCallId: 'c1',
    content: [{ type: 'text', text: 'r'.repeat(1_000) + '\n\n[... tool result middle pruned ...]\n\n' + 'r'.repeat(500) }] }), 500)
  assert.equal(CostLedger.of(session).nextRequestCache().modelledHitTokens, 30_000) // no envelope: the surface the request read
  const total = session.measure().totalTokens
  // Below the threshold: the edit moves 29,500 - tokens before it to misses (USD 0.0043…) to save 500 × 3 hits.
  const below = await new Ladder(host(session, Math.ceil(total / 0.8) + 10)).relievePressure()
  assert.equal(below.action, 'none')
  assert.equal(prunes(session).length, 0)
  // Over the threshold the same edit is needed: made, with its modelled payback logged.
  const over = await new Ladder(host(session, Math.floor(total / 0.8))).relievePressure()
  assert.equal(over.action, 'pruned')
  const [event] = prunes(session)
  assert.deepEqual(event.data.shadowedSeqs, [resultSeq])
  // Moved to misses: the 30,000 cached tokens after the task (9) and the call (10), less the 500 saved: 29,481.
  // Payback: ceil(29,481 × (0.15 − 0.003) / (500 × 0.003)) = ceil(2,889.1) requests.
  assert.equal(30_000 - estimateMessageTokens({ role: 'user', content: 'go' }) - estimateMessageTokens({ role: 'assistant',
    content: [{ type: 'tool-call', id: 'c1', name: 'read', arguments: '{}' }] }) - 500, 29_481)
  assert.equal(event.data.paysBackAfterRequests, 2_890)
})

test('a small edit right after the request that read it pays back below the threshold: made, with its payback', async () => {
  const { session, resultSeq } = await pacedSession()
  // A 40,000-code-point result (10,008 tokens), read by one more request: the last thing in the cached prefix.
  session.append('step/end', { turn: 2, step: 2 })
  session.append('step/start', { turn: 2, step: 3 })
  session.append('assistant/message', { message: { role: 'assistant', content: [{ type: 'tool-call', id: 'c4', name: 'read',
    arguments: '{}' }] }, finishReason: 'stop', surfaceOp: { op: 'append' } })
  const big = session.append('tool/result', { message: { role: 'tool', toolCallId: 'c4', content: [{ type: 'text',
    text: 's'.repeat(40_000) }] }, surfaceOp: { op: 'append' } }).seq
  session.append('step/end', { turn: 2, step: 3 })
  session.append('step/start', { turn: 2, step: 4 })
  session.append('assistant/message', { message: { role: 'assistant', content: [{ type: 'text', text: 'x' }] },
    finishReason: 'stop', surfaceOp: { op: 'append' } })
  const window = Math.ceil(session.measure().totalTokens / 0.8) + 10
  const out = await new Ladder(host(session, window)).relievePressure()
  assert.equal(out.action, 'pruned')
  const events = prunes(session)
  assert.deepEqual(events.map((e) => e.data.shadowedSeqs[0]), [big]) // the old one at the head still does not pay
  assert.equal(events[0].data.trigger, 'gate')
  // Saved 10,008 − 393 = 9,615 tokens; moved: the 393 tokens of the pruned result. 4 requests are expected (turn 2
  // has made 4, turn 1 took 5): ceil(393 × 0.147 / (9,615 × 0.003)) = ceil(2.003) = 3 ≤ 4.
  assert.equal(events[0].data.paysBackAfterRequests, 3)
  assert.ok(session.surface().node(resultSeq))
  // Without the gate (or without prices) nothing is edited below the threshold.
  const { session: plain } = await pacedSession()
  assert.equal((await new Ladder(host(plain, window, false)).relievePressure()).action, 'none')
})

test('case 2: a turn with maxCostUSD 0.001 at DeepSeek prices stops with reason budget before the request that would pass it', async () => {
  let calls = 0
  const server = await startFakeProvider({ handler: () => (calls++, { toolCalls: [{ id: `c${calls}`, name: 'read',
    arguments: {} }], usage: null }) })
  servers.push(server)
  const session = await Session.open(new MemoryStore())
  const lines: string[] = []
  const agent = new Agent({
    session, provider: tuned({ maxRetries: 0 }, () => openAICompatible({ baseURL: server.url, model: 'deepseek-flash', apiKey: 'k',
      contextWindow: 1_000_000, prices: FLASH })),
    tools: [{ name: 'read', description: 'read', parameters: { type: 'object', properties: {} },
      execute: () => 'y'.repeat(8_000) }], // 2,000 tokens a result, all new to the next request
    maxCostUSD: 0.001, onEvent: (e) => { if (e.type === 'warning') lines.push(e.message) },
  })
  const result = await agent.run('go')
  assert.equal(result.reason, 'budget')
  const end = session.events.find((e) => e.type === 'turn/end') as SessionEvent<'turn/end'>
  assert.equal(end.data.reason, 'budget')
  const spent = CostLedger.of(session).usage().costUSD!
  // Four requests (2,000 new tokens each, all misses) cost $0.000956; the fifth, about $0.000327, would pass the cap.
  assert.equal(calls, 4)
  assert.equal(result.steps, 4)
  assert.equal(spent.toFixed(6), '0.000956')
  assert.equal(end.data.message, 'spend cap: this turn has spent $0.000956 of its $0.001000 cap and the next request '
    + 'would cost about $0.000327; stopped before it (maxCostUSD)')
  assert.deepEqual(lines, [end.data.message])
})

test('a server that reports tiny usage does not talk the cap down: it counts dsh\'s own estimates as floors', async () => {
  let calls = 0
  // Every answer claims 1 prompt token (1 of it cached) and 1 completion token.
  const server = await startFakeProvider({ handler: () => (calls++, { toolCalls: [{ id: `c${calls}`, name: 'read',
    arguments: {} }], usage: { prompt_tokens: 1, completion_tokens: 1, prompt_tokens_details: { cached_tokens: 1 } } }) })
  servers.push(server)
  const session = await Session.open(new MemoryStore())
  const agent = new Agent({
    session, provider: tuned({ maxRetries: 0 }, () => openAICompatible({ baseURL: server.url, model: 'deepseek-flash',
      apiKey: 'k', contextWindow: 1_000_000, prices: FLASH })), maxSteps: 20,
    tools: [{ name: 'read', description: 'read', parameters: { type: 'object', properties: {} },
      execute: () => 'y'.repeat(8_000) }],
    maxCostUSD: 0.001,
  })
  const result = await agent.run('go')
  // The reported figures price the four requests at 4 × (1 × 0.003 + 1 × 0.60) / 10⁶ USD; the cap counts what was sent.
  assert.equal(CostLedger.of(session).usage().costUSD!.toFixed(8), '0.00000241')
  assert.equal(result.reason, 'budget')
  assert.equal(calls, 4)
  const end = session.events.find((e) => e.type === 'turn/end') as SessionEvent<'turn/end'>
  assert.equal(end.data.message, 'spend cap: this turn has spent $0.000956 of its $0.001000 cap and the next request '
    + 'would cost about $0.000327; stopped before it (maxCostUSD)')
})

test('the spend cap is checked before a summary request too: unsent past the cap, the turn stops with reason budget', async () => {
  let summaries = 0, calls = 0
  // Each answer: 2,000 code points of text and a call; each result "ok". Nothing clears or prunes: pressure summarises.
  const server = await startFakeProvider({ handler: (req) => {
    if (req.headers['x-dsh-purpose'] === 'compaction') return (summaries++, { text: 'summary' })
    calls++
    return { text: 'a'.repeat(2_000), toolCalls: [{ id: `c${calls}`, name: 'read', arguments: {} }], usage: null }
  } })
  servers.push(server)
  const run = async (maxCostUSD: { session: number }) => {
    const session = await Session.open(new MemoryStore())
    const provider = tuned({ maxRetries: 0 }, () => openAICompatible({ baseURL: server.url, model: 'm', apiKey: 'k',
      contextWindow: 6_000, prices: FLASH }))
    // The summarizer's prices are 100 times the conversation model's.
    const summarizer = tuned({ maxRetries: 0 }, () => openAICompatible({ baseURL: server.url, model: 'dear', apiKey: 'k',
      contextWindow: 6_000, prices: { cacheHitInput: 0.3, cacheMissInput: 15, output: 60 } }))
    const agent = new Agent({ session, provider, summarizer, maxSteps: 30, maxCostUSD,
      tools: [{ name: 'read', description: 'read', parameters: { type: 'object', properties: {} }, execute: () => 'ok' }] })
    return { session, result: await agent.run('go') }
  }
  const { session, result } = await run({ session: 0.01 })
  assert.equal(summaries, 0) // never sent
  assert.equal(result.reason, 'budget')
  const end = session.events.find((e) => e.type === 'turn/end') as SessionEvent<'turn/end'>
  // Ten steps spent $0.003824; the summary request of the region before the retained tail, at the summarizer's
  // prices (its output modelled at half its completion budget), would pass the session's cap. The summarizer is
  // another model: no lead (it has no cached prefix to read).
  assert.equal(result.steps, 10)
  assert.equal(end.data.message, 'spend cap: this session has spent $0.003824 of its $0.010000 cap and a summary '
    + 'request would cost about $0.114120; stopped before it (maxCostUSD)')
  // The refused summary is in the log as a compaction that ended unsent, and is no failure the ladder remembers.
  const ends = session.events.filter((e) => e.type === 'compaction/end') as SessionEvent<'compaction/end'>[]
  assert.deepEqual(ends.map((e) => [e.data.error, e.data.requests]), [[end.data.message, []]])
  assert.equal(session.events.some((e) => e.type === 'ladder/state' && (e.data as { failedAtTokens?: number })
    .failedAtTokens != null), false)
  assert.equal(calls, result.steps)
  // With room for it the same session summarises and goes on.
  const before = calls
  const roomy = await run({ session: 10 })
  assert.ok(summaries >= 1, `summaries ${summaries}`)
  assert.equal(roomy.result.reason, 'max-steps')
  assert.equal(calls - before, 30)
})

test('maxCostUSD without prices, or not a number of USD, is a ConfigError that says the fix', () => {
  const session = new Session({ store: new MemoryStore() })
  const provider = openAICompatible({ baseURL: 'http://127.0.0.1:9', model: 'local', apiKey: 'k' })
  assert.throws(() => new Agent({ session, provider, maxCostUSD: 1 }), (err: unknown) => err instanceof ConfigError
    && /maxCostUSD needs the provider's prices, and model "local" has none/.test((err as Error).message))
  const priced = openAICompatible({ baseURL: 'http://127.0.0.1:9', model: 'm', apiKey: 'k', prices: FLASH })
  for (const bad of [-1, Number.NaN, '1', { turn: -2 }, { month: 3 }, [], [1]]) {
    assert.throws(() => new Agent({ session, provider: priced, maxCostUSD: bad as never }), ConfigError)
  }
  assert.doesNotThrow(() => new Agent({ session, provider: priced, maxCostUSD: { turn: 0.5, session: 5 } }))
  // A summary request is a request the cap counts: a summarizer of another model needs prices of its own.
  assert.throws(() => new Agent({ session, provider: priced, summarizer: provider, maxCostUSD: 1 }), (err: unknown) =>
    err instanceof ConfigError && /maxCostUSD needs the summarizer's prices too, and model "local" has none/
      .test((err as Error).message))
  const sameModel = openAICompatible({ baseURL: 'http://127.0.0.1:9', model: 'm', apiKey: 'k' })
  assert.doesNotThrow(() => new Agent({ session, provider: priced, summarizer: sameModel, maxCostUSD: 1 }))
})

test('no pressure summary that would leave the request above the threshold while it fits the window without it', async () => {
  // Turn 1: ten reads of 2,000 code points (508 tokens each); turn 2 just began. The system prompt is 20,000 tokens.
  const build = async () => {
    const session = await Session.open(new MemoryStore())
    logHeader(session, { model: 'm', baseURL: 'http://127.0.0.1:9', prices: FLASH })
    const say = (type: string, message: Message) => session.append(type, { message, surfaceOp: { op: 'append' },
      ...(message.role === 'assistant' ? { finishReason: 'stop' } : {}) })
    session.append('turn/start', { turn: 1 })
    say('user/message', { role: 'user', content: 'read them all' })
    for (let step = 1; step <= 10; step++) {
      session.append('step/start', { turn: 1, step })
      say('assistant/message', { role: 'assistant', content: [{ type: 'tool-call', id: `c${step}`, name: 'read', arguments: '{}' }] })
      say('tool/result', { role: 'tool', toolCallId: `c${step}`, content: [{ type: 'text', text: 'z'.repeat(2_000) }] })
      session.append('step/end', { turn: 1, step })
    }
    session.append('turn/end', { turn: 1, reason: 'stop' })
    session.append('turn/start', { turn: 2 })
    say('user/message', { role: 'user', content: 'go on' })
    return session
  }
  const envelope = { system: 's'.repeat(80_000) }
  const warnings: string[] = []
  const ladderHost = (session: Session, gate: boolean) => ({ ...host(session, 28_000, gate, (e) => {
    if (e.type === 'warning') warnings.push(e.message) }), envelope })
  const gated = await build()
  const out = await new Ladder(ladderHost(gated, true)).relievePressure()
  // 20,008 (system) + 5,202 (surface): above the threshold (22,400), under the window (28,000). The region
  // outside the retained tail (4,480) is 530 tokens; its checkpoint is modelled at 256 (half of 512): 274 saved.
  assert.equal(out.tokensBefore, 25_210)
  assert.equal(out.summaryRequests, 0)
  assert.equal(gated.events.filter((e) => e.type === 'compaction/start').length, 0)
  assert.equal(warnings[0], 'context still at 25210 of 28000 tokens (threshold 22400) after compaction: a summary of '
    + 'this 530-token region would leave about 24936 tokens, not under the threshold, and the request fits the window '
    + 'without it; not retrying until the surface grows by 4480 tokens')
  assert.equal(gated.events.filter((e) => e.type === 'compaction/warning').length, 1)
  // Without the gate the ladder starts the summary transaction, and its one retry (the summarizer is unreachable).
  const plain = await build()
  await new Ladder(ladderHost(plain, false)).relievePressure()
  assert.equal(plain.events.filter((e) => e.type === 'compaction/start').length, 2)
})

test('--max-cost USD: the spend cap of each turn; anything but a positive number of USD is a usage error', () => {
  const env = { DEEPSEEK_API_KEY: 'sk-test' }
  assert.equal((parseCliArgs(['--max-cost', '0.5', '-p', 'hi'], env) as { maxCostUSD?: number }).maxCostUSD, 0.5)
  assert.equal((parseCliArgs(['-p', 'hi'], env) as { maxCostUSD?: number }).maxCostUSD, undefined)
  for (const bad of ['0', '-1', 'abc', '1e3', '', '9'.repeat(400)]) { // 400 nines: Infinity, a usage error, not an internal one
    assert.throws(() => parseCliArgs(['--max-cost', bad, '-p', 'hi'], env), /--max-cost/)
  }
  assert.throws(() => parseCliArgs(['replay', 'f.jsonl', '--max-cost', '1'], {}), /--max-cost/)
})

/**
 * One turn of 30 steps, the request of each reading all before it (heuristic tokens, no envelope): each step an
 * assistant message of 1,600 code points of text (410 tokens with its call) and a result of 1,900 code points (483
 * tokens; step `big`'s, 12,000 code points: 3,008). A window just over what the threshold lets through.
 */
async function readsSession(big?: number): Promise<{ session: Session; results: number[]; window: number }> {
  const session = await Session.open(new MemoryStore())
  logHeader(session, { model: 'm', baseURL: 'http://127.0.0.1:9', prices: FLASH })
  const say = (type: string, message: Message) => session.append(type, { message, surfaceOp: { op: 'append' },
    ...(message.role === 'assistant' ? { finishReason: 'stop' } : {}) }).seq
  session.append('turn/start', { turn: 1 })
  say('user/message', { role: 'user', content: 'read them all' })
  const results: number[] = []
  for (let step = 1; step <= 30; step++) {
    if (step > 1) session.append('step/end', { turn: 1, step: step - 1 })
    session.append('step/start', { turn: 1, step })
    say('assistant/message', { role: 'assistant', content: [{ type: 'text', text: 't'.repeat(1_600) },
      { type: 'tool-call', id: `c${step}`, name: 'read', arguments: '{}' }] })
    results.push(say('tool/result', { role: 'tool', toolCallId: `c${step}`,
      content: [{ type: 'text', text: 'q'.repeat(step === big ? 12_000 : 1_900) }] }))
  }
  return { session, results, window: Math.floor(session.measure().totalTokens / 0.8) - 50 }
}
/** The steps (1-based) whose results the ladder cleared, in order; 0 for a result no longer at its seq. */
const clearedSteps = (session: Session, results: number[]) => session.events.filter((e) => e.type === 'compaction/clear')
  .map((e) => results.indexOf((e.data as { shadowedSeqs: number[] }).shadowedSeqs[0]) + 1)
const ladderOn = (session: Session, window: number, gate = true) => new Ladder({ ...host(session, window, gate),
  settings: { ...host(session, window, gate).settings, compaction: ladderConfig({ gate }) } })
const range = (from: number, to: number) => Array.from({ length: to - from + 1 }, (_, i) => from + i)

test('at the threshold the gate clears the newest run of candidates that reaches the relief target, not the oldest', async () => {
  const { session, results, window } = await readsSession()
  // 26,802 tokens; window 33,452: threshold 26,761, relief target 20,071; results 17–30 protected (20% of the window).
  assert.deepEqual([session.measure().totalTokens, window], [26_802, 33_452])
  const out = await ladderOn(session, window).relievePressure()
  // Each clear saves 433 tokens; 15 of the 16 candidates reach the target. The newest such run, 2–16, moves the
  // cache from step 2's result on, not from step 1's (moving one step more costs 460 tokens of misses, which 433
  // saved × 30 expected requests at the hit price do not pay back); it is made whole.
  assert.deepEqual(clearedSteps(session, results), range(2, 16))
  assert.deepEqual([out.action, out.tokensAfter], ['cleared', 20_059])
  const events = session.events.filter((e) => e.type === 'compaction/clear') as SessionEvent<'compaction/clear'>[]
  assert.deepEqual([...new Set(events.map((e) => e.data.paysBackAfterRequests))], [130])
  // Without the gate the clear rung takes the oldest first, down to the target.
  const plain = await readsSession()
  await ladderOn(plain.session, plain.window, false).relievePressure()
  assert.deepEqual(clearedSteps(plain.session, plain.results), range(1, 15))
})

test('a needed prune that gets under the threshold does not end the gate: the clears that now pay back follow', async () => {
  const { session, results, window } = await readsSession(10)
  const out = await ladderOn(session, window).relievePressure()
  // The prune of step 10's result (needed) gets under the threshold and moves the cache from there: clearing the
  // results before it now moves only steps 1–10, and pays back after 15 of the 30 requests expected; the clears go
  // down to the relief target (step 10's pruned result, at a new seq, and step 11's).
  assert.deepEqual(prunes(session).map((e) => [e.data.shadowedSeqs[0], e.data.paysBackAfterRequests]), [[results[9], 326]])
  assert.deepEqual(clearedSteps(session, results), [...range(1, 9), 0, 11])
  assert.deepEqual([out.action, out.tokensBefore, out.tokensAfter], ['cleared', 29_327, 21_854])
  // Without the gate the ladder stops at the prune.
  const plain = await readsSession(10)
  const o = await ladderOn(plain.session, plain.window, false).relievePressure()
  assert.deepEqual([o.action, o.tokensAfter, clearedSteps(plain.session, plain.results).length], ['pruned', 26_712, 0])
})

test('gate: a summary whose lead is not sent (over a quarter of the summarizer\'s room) is priced without the cache hit', async () => {
  // docs/design.md §11: a summary's input is priced "with what it sends ahead of its region, the cached part at the
  // hit price — none when the region does not start at the head and nothing is sent ahead of it". The same session
  // twice: a 2,000-token input, nine 7,000-character results, a summarizer of the same model with a window of 16,000
  // (the input is sent ahead of the region: 10,879 of 11,089 tokens hit) or of 8,000 (the input is over a quarter of
  // its room: not sent; 29 tokens hit, the envelope's). The gate's model ignores the summarizer's room, so it prices
  // both alike: the same payback, 113 requests, for a request that misses all but 29 tokens.
  async function run(summaryWindow: number) {
    let step = 0, n = 0
    const sent: ChatRequest[] = []
    const provider: Provider = { model: 'm', baseURL: 'memory://g', contextWindow: 16_000, maxTokens: 200, prices: FLASH,
      complete: async () => { const i = step++
        return i < 9 ? { message: { role: 'assistant', content: [{ type: 'tool-call', id: `a${i}`, name: 'fetch', arguments: '{}' }] }, finishReason: 'tool-calls' }
          : { message: { role: 'assistant', content: [{ type: 'text', text: 'done' }] }, finishReason: 'stop' } } } as Provider
    const summarizer: Provider = { ...provider, contextWindow: summaryWindow, complete: async (r: ChatRequest) => { sent.push(r)
      return { message: { role: 'assistant', content: [{ type: 'text', text: 'CHECKPOINT: work so far.' }] }, finishReason: 'stop' } } } as Provider
    const session = await Session.open(new MemoryStore())
    const input = 'task: ' + 'q'.repeat(8_000)
    const agent = new Agent({ session, provider, summarizer, recall: false, compaction: { clear: false },
      tools: [{ name: 'fetch', description: 't', parameters: { type: 'object', properties: {} }, execute: () => `result ${n++} `.padEnd(7_000, '.') }] })
    await agent.run(input)
    const summary = session.events.find((e) => e.type === 'compaction/summary') as SessionEvent<'compaction/summary'>
    const end = session.events.find((e) => e.type === 'compaction/end') as SessionEvent<'compaction/end'>
    return { payback: summary.data.paysBackAfterRequests, leadSent: sent[0].messages[0].content === input,
      hit: end.data.requests![0].modelledHitTokens }
  }
  const sentAhead = await run(16_000), dropped = await run(8_000)
  assert.deepEqual([sentAhead.leadSent, sentAhead.hit, dropped.leadSent, dropped.hit], [true, 10_879, false, 29])
  // Observed: 113 and 113.
  assert.ok(dropped.payback! > sentAhead.payback!, `payback ${dropped.payback} with no lead vs ${sentAhead.payback} with it`)
})

test('an overflow whose recovery needs a summary past the cap stops the turn with reason budget, not the overflow', async () => {
  let summaries = 0, calls = 0
  // Seven answers of 2,000 code points and a call; the eighth request overflows a 6,000-token window the options did
  // not state. Nothing is clearable ("ok" results): only a summary would relieve it, at 100× the prices.
  const server = await startFakeProvider({ handler: (req) => {
    if (req.headers['x-dsh-purpose'] === 'compaction') return (summaries++, { text: 'summary' })
    if (++calls === 8) return { status: 400, body: { error: { type: 'invalid_request_error', code: 'context_length_exceeded',
      message: "This model's maximum context length is 6000 tokens. However, you requested 7000 tokens." } } }
    return { text: 'a'.repeat(2_000), toolCalls: [{ id: `c${calls}`, name: 'read', arguments: {} }], usage: null }
  } })
  servers.push(server)
  const session = await Session.open(new MemoryStore())
  const make = (model: string, prices: typeof FLASH) => tuned({ maxRetries: 0 }, () => openAICompatible({
    baseURL: server.url, model, apiKey: 'k', contextWindow: 100_000, prices }))
  const agent = new Agent({ session, provider: make('m', FLASH), maxSteps: 30, maxCostUSD: { session: 0.01 },
    summarizer: make('dear', { cacheHitInput: 0.3, cacheMissInput: 15, output: 60 }),
    tools: [{ name: 'read', description: 'read', parameters: { type: 'object', properties: {} }, execute: () => 'ok' }] })
  const result = await agent.run('go')
  assert.equal(result.reason, 'budget')
  assert.equal(result.steps, 8)
  assert.equal(summaries, 0)
  const message = 'spend cap: this session has spent $0.002639 of its $0.010000 cap and a summary request would cost '
    + 'about $0.112575; stopped before it (maxCostUSD)' // another model summarises: no lead
  const end = session.events.find((e) => e.type === 'turn/end') as SessionEvent<'turn/end'>
  assert.deepEqual(end.data, { turn: 1, reason: 'budget', message })
  assert.deepEqual(session.events.filter((e) => /^(request\/error|compaction\/|step\/end)/.test(e.type)).slice(-4)
    .map((e) => e.type), ['request/error', 'compaction/start', 'compaction/end', 'step/end'])
})

test('a user abort after a tool call\'s arguments streamed counts what streamed, not only the partial\'s text', async () => {
  // The stream: 'Let me look.' then a call whose 4,000-character arguments stream; the user aborts before it ends.
  const args = JSON.stringify({ path: 'x'.repeat(3_988) }) // 4,000 UTF-16 units
  const events = [{ choices: [{ index: 0, delta: { content: 'Let me look.' } }] },
    { choices: [{ index: 0, delta: { tool_calls: [{ index: 0, id: 'call_1', type: 'function', function: { name: 'read', arguments: args } }] } }] }]
  const ctrl = new AbortController()
  const enc = new TextEncoder()
  const provider = tuned({ maxRetries: 0 }, () => openAICompatible({ baseURL: 'http://127.0.0.1:9', model: 'm', apiKey: 'k',
    contextWindow: 100_000, prices: FLASH, fetch: async (_url, init) => new Response(new ReadableStream<Uint8Array>({
      start(c) {
        for (const e of events) c.enqueue(enc.encode(`data: ${JSON.stringify(e)}\n\n`))
        init?.signal?.addEventListener('abort', () => c.error(new DOMException('aborted', 'AbortError')))
      },
    }), { status: 200, headers: { 'content-type': 'text/event-stream' } }) }))
  const session = await Session.open(new MemoryStore())
  const agent = new Agent({ session, provider, maxCostUSD: 1, tools: [{ name: 'read', description: '', parameters: {}, execute: () => 'y' }],
    onEvent: (e) => { if (e.type === 'stream' && e.event.type === 'tool-call-delta') ctrl.abort() } })
  const result = await agent.run('go', { signal: ctrl.signal })
  assert.equal(result.reason, 'aborted')
  // Streamed: 12 units of text + 4,000 of arguments + 6 of id + 4 of name = 4,022 units, 1,006 tokens by the meter.
  const error = session.events.find((e) => e.type === 'request/error') as SessionEvent<'request/error'>
  assert.deepEqual([error.data.code, error.data.trigger, error.data.spent?.outputTokens], ['ABORTED', 'conversation', 1_006])
  // The partial after it (its text only) is that same request: one request, its output what streamed.
  const partial = session.events.findLast((e) => e.type === 'assistant/message') as SessionEvent<'assistant/message'>
  assert.deepEqual(partial.data.message.content, [{ type: 'text', text: 'Let me look.' }])
  assert.ok(partial.seq > error.seq)
  assert.equal(CostLedger.of(session).usage().conversation.requests, 1)
  assert.equal(CostLedger.of(session).spendFloor().conversationOutputTokens, 1_006)
  assert.equal(CostLedger.of(session).usage().conversation.outputTokens, 1_006)
})

test('a summary the count near the window needs, refused by the cap, stops the turn with reason budget before the request', async () => {
  // Four turns of about 1,800 tokens each; the fifth input brings the estimate to 9,0xx of a 10,000-token window
  // (threshold 0.95: no pressure by the estimate), and the provider counts 12,000: pressure on the count. No result
  // to clear, no message over the prune threshold: only a summary would relieve it, at the summarizer's 100× prices.
  const sent: ChatRequest[] = []
  const provider = {
    model: 'm', baseURL: 'memory://count', contextWindow: 10_000, maxTokens: 100, prices: FLASH,
    complete: async (request: ChatRequest) => { sent.push(request)
      return { message: { role: 'assistant' as const, content: [{ type: 'text' as const, text: 'ok: a short reply' }] }, finishReason: 'stop' } },
    countTokens: async () => 12_000,
  }
  let summaries = 0
  const summarizer = { ...provider, model: 'dear', prices: { cacheHitInput: 0.3, cacheMissInput: 15, output: 60 }, countTokens: undefined,
    complete: async () => { summaries++; return { message: { role: 'assistant' as const, content: [{ type: 'text' as const, text: 'summary' }] }, finishReason: 'stop' } } }
  const session = await Session.open(new MemoryStore())
  const agent = new Agent({ session, provider, summarizer, compaction: { thresholdRatio: 0.95 }, maxCostUSD: { session: 0.01 } })
  for (let i = 1; i <= 4; i++) assert.equal((await agent.run(`turn ${i} ` + String(i).repeat(7_200))).reason, 'stop')
  assert.equal(sent.length, 4)
  const result = await agent.run('turn 5 ' + '5'.repeat(7_200))
  assert.equal(summaries, 0)
  assert.equal(sent.length, 4, 'the fifth request is not sent')
  assert.deepEqual([result.reason, result.steps], ['budget', 1])
  const end = session.events.findLast((e) => e.type === 'turn/end') as SessionEvent<'turn/end'>
  // Four requests spent $0.001156; the summary of the four turns at 100× the prices would pass the session's cap.
  assert.equal(end.data.message, 'spend cap: this session has spent $0.001156 of its $0.010000 cap and a summary '
    + 'request would cost about $0.187470; stopped before it (maxCostUSD)')
  // The step that made the count ends without a request: count sample, the refused compaction, step/end, turn/end.
  const last = session.events.slice(session.events.findLastIndex((e) => e.type === 'step/start'))
  assert.deepEqual(last.map((e) => e.type), ['step/start', 'ladder/state', 'compaction/start', 'compaction/end', 'step/end',
    'turn/end'])
})

// ── The spend cap under attack (from the hostile reviews rev5, rev6 and rev6b of the spend cap) ──

/** A tool call whose arguments arrive in `pieces` deltas of 10,000 code points each. */
function toolCallEvents(pieces: number): unknown[] {
  const events: unknown[] = [{ choices: [{ index: 0, delta: { tool_calls: [{ index: 0, id: 'c1', type: 'function',
    function: { name: 'read', arguments: '' } }] } }] }]
  for (let k = 0; k < pieces; k++) {
    events.push({ choices: [{ index: 0, delta: { tool_calls: [{ index: 0, function: { arguments: 'x'.repeat(10_000) } }] } }] })
  }
  return events
}

test('cap: tool-call arguments streamed before a cut or an oversized message count toward maxCostUSD', async () => {
  // Each request streams 400,000 bytes of tool-call arguments (about 100,000 tokens of output, $0.06 at FLASH's
  // output price) and then fails: past the message cap (RESPONSE_TOO_LARGE, tuned to 300,000 bytes here) or cut.
  // dsh itself received those bytes; the cap must count at least them ("never less than dsh's own estimate of
  // what it sent and received"). With a session cap of $0.05 the second turn must stop with reason budget.
  let calls = 0
  const fetch = async () => { calls++; return sseResponse(toolCallEvents(40), true) }
  const provider = tuned({ maxRetries: 0, maxMessageBytes: 300_000 }, () => openAICompatible({
    baseURL: 'http://127.0.0.1:9', model: 'deepseek-flash', apiKey: 'k', contextWindow: 1_000_000, prices: FLASH,
    fetch }))
  const session = await Session.open(new MemoryStore())
  const agent = new Agent({ session, provider, maxCostUSD: { session: 0.05 },
    tools: [{ name: 'read', description: 'read', parameters: { type: 'object', properties: {} }, execute: () => 'y' }] })
  // The turn fails with the provider's error (the Agent throws it).
  await assert.rejects(agent.run('go'), { code: 'RESPONSE_TOO_LARGE' })
  assert.equal(calls, 1)
  const second = await agent.run('again').then((r) => r.reason, (e: Error & { code?: string }) => e.code)
  assert.equal(second, 'budget', `the second turn ended ${second} after ${calls} requests`)
  assert.equal(calls, 1)
  // What the cap counts of the session so far: at least the ~75,000 tokens of arguments dsh read before the cap.
  const floor = CostLedger.of(session).spendFloor()
  assert.ok(floor.conversationOutputTokens >= 70_000,
    `the cap counts ${floor.conversationOutputTokens} output tokens of a request that streamed 300,000 bytes`)
})

test('cap: a stream cut after tool-call arguments is retried past maxCostUSD (the cut request counted as nothing)', async () => {
  // 400,000 bytes of arguments (about 100,000 tokens, $0.06 of output at FLASH) and then the connection drops: a
  // break after output, which the Agent retries once as a new step. The cap of $0.05 a turn must stop that retry.
  let calls = 0
  const fetch = async () => { calls++; return sseResponse(toolCallEvents(40), true) }
  const provider = tuned({ maxRetries: 0 }, () => openAICompatible({ baseURL: 'http://127.0.0.1:9',
    model: 'deepseek-flash', apiKey: 'k', contextWindow: 1_000_000, prices: FLASH, fetch }))
  const session = await Session.open(new MemoryStore())
  const agent = new Agent({ session, provider, maxCostUSD: 0.05,
    tools: [{ name: 'read', description: 'read', parameters: { type: 'object', properties: {} }, execute: () => 'y' }] })
  const reason = await agent.run('go').then((r) => r.reason, (e: Error & { code?: string }) => e.code)
  assert.deepEqual([reason, calls], ['budget', 1])
})

test('cap: the summary requests of one compaction are checked against each other, not each alone', async () => {
  // 30 exchanges of 4,000 code points each way (about 60,000 tokens): over the threshold of a 70,000-token window,
  // so the turn starts with a summary. The summarizer's window is 10,000 tokens: the region goes in several
  // requests of about 8,000 tokens each, each modelled at about $0.15 at the summarizer's prices.
  const session = await Session.open(new MemoryStore())
  for (let i = 0; i < 30; i++) {
    session.append('turn/start', { turn: i + 1 })
    session.append('user/message', { message: { role: 'user', content: `q${i} ${'u'.repeat(4_000)}` },
      surfaceOp: { op: 'append' } })
    session.append('assistant/message', { message: { role: 'assistant', content: [{ type: 'text',
      text: `a${i} ${'v'.repeat(4_000)}` }] }, finishReason: 'stop', surfaceOp: { op: 'append' } })
    session.append('turn/end', { turn: i + 1, reason: 'stop' })
  }
  let summaries = 0, conversation = 0
  const provider = tuned({ maxRetries: 0 }, () => openAICompatible({ baseURL: 'http://127.0.0.1:9', model: 'm',
    apiKey: 'k', contextWindow: 70_000, prices: FLASH, fetch: async () => (conversation++, sseAnswer('done')) }))
  const summarizer = tuned({ maxRetries: 0 }, () => openAICompatible({ baseURL: 'http://127.0.0.1:9', model: 'dear',
    apiKey: 'k', contextWindow: 10_000, prices: { cacheHitInput: 0.3, cacheMissInput: 15, output: 60 },
    fetch: async () => (summaries++, sseAnswer('s'.repeat(400))) }))
  const cap = 0.25
  const agent = new Agent({ session, provider, summarizer, maxCostUSD: { session: cap } })
  const result = await agent.run('go on')
  const spent = CostLedger.of(session).spendFloor().costUSD
  // Whatever the turn did, what it spent by dsh's own count stays within the session's cap (a summary request is
  // not sent past it), give or take one request's modelling error.
  assert.ok(spent <= cap * 1.2, `spent $${spent.toFixed(4)} of a $${cap} session cap in ${summaries} summary `
    + `requests (reason ${result.reason})`)
})

test('cap: a provider made { ...provider, prices } with a price missing or NaN cannot silently turn maxCostUSD off', async () => {
  // Each answer: 8,000 code points of text and a call, so each request costs at least 2,000 tokens of output.
  let calls = 0
  const fetch = async () => (calls++, sseResponse([{ choices: [{ index: 0, delta: { content: 'z'.repeat(8_000), tool_calls: [{
    index: 0, id: `c${calls}`, type: 'function', function: { name: 'read', arguments: '{}' } }] } }] },
  { choices: [{ index: 0, delta: {}, finish_reason: 'tool_calls' }] }], false))
  const base = tuned({ maxRetries: 0 }, () => openAICompatible({ baseURL: 'http://127.0.0.1:9', model: 'm',
    apiKey: 'k', contextWindow: 1_000_000, fetch }))
  const tools = [{ name: 'read', description: 'read', parameters: { type: 'object', properties: {} },
    execute: () => 'y'.repeat(8_000) }]
  for (const prices of [{ cacheHitInput: 0.003, cacheMissInput: 0.15 }, { ...FLASH, output: Number('0,6') }]) {
    calls = 0
    const session = await Session.open(new MemoryStore())
    let outcome: string
    try {
      const agent = new Agent({ session, provider: { ...base, prices: prices as Prices }, tools, maxSteps: 20,
        maxCostUSD: 0.001 })
      outcome = (await agent.run('go')).reason
    } catch (err) { outcome = calls === 0 ? 'refused' : String(err) }
    // Refused before any request (prices that price nothing), or the cap fires: never 20 requests past a $0.001 cap.
    assert.ok(outcome === 'refused' || outcome === 'budget',
      `prices ${JSON.stringify(prices)}: the turn ended ${outcome} after ${calls} requests under a $0.001 cap`)
  }
})

const enc = new TextEncoder()

/** A provider over `fetch` that answers 200 with an event stream of `chunks`, then keeps the body open (it ends only
 *  when the request's signal aborts it). `onServed` runs once the response is handed over. */
function stalledProvider(chunks: string[], onServed: () => void, tuning = {}) {
  return tuned({ maxRetries: 0, ...tuning }, () => openAICompatible({ baseURL: 'http://127.0.0.1:9', model: 'm', apiKey: 'k',
    contextWindow: 100_000, prices: FLASH, fetch: async (_url, init) => {
      const body = new ReadableStream<Uint8Array>({
        start(c) {
          for (const s of chunks) c.enqueue(enc.encode(s))
          init?.signal?.addEventListener('abort', () => c.error(new DOMException('aborted', 'AbortError')))
        },
      })
      setTimeout(onServed, 20)
      return new Response(body, { status: 200, headers: { 'content-type': 'text/event-stream' } })
    } }))
}

test('cap: a user abort after the server answered 200, before any output, counts the request it ran', async () => {
  // docs/design.md §11: "A request that fails after the server ran it — it streamed output … or answered 200 —
  // costs too, and is counted like an answered one". The server has read a 10,000-token prompt when the user aborts.
  const ctrl = new AbortController()
  const provider = stalledProvider([`data: ${JSON.stringify({ choices: [{ index: 0, delta: { role: 'assistant' } }] })}\n\n`],
    () => ctrl.abort())
  const session = await Session.open(new MemoryStore())
  const agent = new Agent({ session, provider, maxCostUSD: 1 })
  const result = await agent.run('x'.repeat(40_000), { signal: ctrl.signal })
  assert.equal(result.reason, 'aborted')
  const errors = session.events.filter((e) => e.type === 'request/error') as SessionEvent<'request/error'>[]
  // Observed: no request/error at all, usage().conversation.requests 0 and spendFloor().costUSD 0: a user who aborts
  // each turn after the 200 spends a full prompt per turn that no cap ever counts.
  assert.deepEqual(errors.map((e) => [e.data.code, e.data.spent?.outputTokens]), [['ABORTED', 0]])
  assert.equal(CostLedger.of(session).usage().conversation.requests, 1)
  assert.ok(CostLedger.of(session).spendFloor().costUSD >= 10_000 * 0.15 / 1e6, `spent ${CostLedger.of(session).spendFloor().costUSD}`)
})

test('cap: a server that answers 200 and then sends nothing (keep-alives only) until the idle timeout costs a request', async () => {
  // A hostile or broken server: 200, then a keep-alive comment and silence. The adapter gives up (TIMEOUT, idle) and
  // the turn fails, but the server ran the prompt: §11 counts a request that answered 200.
  const provider = stalledProvider([': keep-alive\n\n'], () => {}, { idleTimeoutMs: 100 })
  const session = await Session.open(new MemoryStore())
  const agent = new Agent({ session, provider, maxCostUSD: 1 } as ConstructorParameters<typeof Agent>[0])
  await assert.rejects(agent.run('x'.repeat(40_000)), { name: 'ProviderError', code: 'TIMEOUT' })
  const errors = session.events.filter((e) => e.type === 'request/error') as SessionEvent<'request/error'>[]
  assert.equal(errors.at(-1)?.data.code, 'TIMEOUT')
  // Observed: the TIMEOUT has no `spent` (the error carries no status 200), so the request is not counted.
  assert.deepEqual(errors.at(-1)?.data.spent && { outputTokens: errors.at(-1)!.data.spent!.outputTokens }, { outputTokens: 0 })
  assert.equal(CostLedger.of(session).usage().conversation.requests, 1)
})

test('cap: a custom provider\'s prices that cannot price a request are refused where the cap is set, not mid-turn', async () => {
  // maxCostUSD checks only that the provider has prices. A Provider object of the caller's own with NaN in its table
  // is accepted; the first run() then throws a SessionError from request/header ("…cacheHitInput … got null": the
  // NaN as JSON) after the turn and its input were logged.
  const provider: Provider = {
    model: 'm', baseURL: 'memory://x', contextWindow: 100_000, maxTokens: 100,
    prices: { cacheHitInput: Number.NaN, cacheMissInput: 1, output: 1 },
    complete: async () => ({ message: { role: 'assistant', content: [{ type: 'text', text: 'ok' }] }, finishReason: 'stop' }),
  } as Provider
  const session = await Session.open(new MemoryStore())
  assert.throws(() => new Agent({ session, provider, maxCostUSD: 1 }),
    (e: unknown) => (e as Error).name === 'ConfigError' && /prices\.cacheHitInput/.test((e as Error).message)
      && /NaN/.test((e as Error).message))
  assert.deepEqual(session.events.map((e) => e.type), ['session/start'])
})

test('cap: maxCostUSD {turn, session} is read once: a getter that passes the check and then answers NaN cannot lift it', async () => {
  // The options reader copies prices (a getter is never read again) but the spend cap keeps the caller's object and
  // reads cap.turn at every step: the check saw 1e-9 USD, every later read sees NaN, and "used + next > NaN" is false.
  let reads = 0
  const cap = { get turn() { reads++; return reads === 1 ? 1e-9 : Number.NaN } }
  let requests = 0
  const provider: Provider = {
    model: 'm', baseURL: 'memory://cap', contextWindow: 100_000, maxTokens: 100, prices: FLASH,
    complete: async () => { requests++
      return { message: { role: 'assistant', content: [{ type: 'text', text: 'ok' }] }, finishReason: 'stop' } },
  } as Provider
  const session = await Session.open(new MemoryStore())
  const agent = new Agent({ session, provider, maxCostUSD: cap } as ConstructorParameters<typeof Agent>[0])
  const result = await agent.run('x'.repeat(4_000))
  // A 1,000-token request at $0.15 per million costs $0.00015, past the $0.000000001 cap that was checked.
  assert.deepEqual([result.reason, requests], ['budget', 0])
})

test('cap: a summary request the user aborts after its 200, before output, is in compaction/end {requests}', async () => {
  // The same gap in the summary path: the summarizer answered 200 to a ~10,900-token request, then the user aborts;
  // the compaction ends "aborted" with no request recorded, so neither usage() nor the cap ever counts it.
  const ctrl = new AbortController()
  let step = 0, n = 0
  const conversation: Provider = { model: 'm', baseURL: 'memory://x', contextWindow: 16_000, maxTokens: 200, prices: FLASH,
    complete: async () => { const i = step++
      return i < 9 ? { message: { role: 'assistant', content: [{ type: 'tool-call', id: `a${i}`, name: 'fetch', arguments: '{}' }] }, finishReason: 'tool-calls' }
        : { message: { role: 'assistant', content: [{ type: 'text', text: 'done' }] }, finishReason: 'stop' } } } as Provider
  const summarizer = tuned({ maxRetries: 0 }, () => openAICompatible({ baseURL: 'http://127.0.0.1:9', model: 'm', apiKey: 'k',
    contextWindow: 16_000, prices: FLASH, fetch: async (_url, init) => new Response(new ReadableStream<Uint8Array>({
      start(c) {
        setTimeout(() => ctrl.abort(), 20)
        init?.signal?.addEventListener('abort', () => c.error(new DOMException('aborted', 'AbortError')))
      } }), { status: 200, headers: { 'content-type': 'text/event-stream' } }) }))
  const session = await Session.open(new MemoryStore())
  const agent = new Agent({ session, provider: conversation, summarizer, maxCostUSD: 1, recall: false, compaction: { clear: false },
    tools: [{ name: 'fetch', description: 't', parameters: { type: 'object', properties: {} }, execute: () => `result ${n++} `.padEnd(7_000, '.') }] })
  assert.equal((await agent.run('fetch nine', { signal: ctrl.signal })).reason, 'aborted')
  const end = session.events.find((e) => e.type === 'compaction/end') as SessionEvent<'compaction/end'>
  assert.equal(end.data.error, 'aborted')
  // Observed: requests [] and usage().summary.requests 0.
  assert.deepEqual(end.data.requests?.map((r) => r.outputTokens), [0])
  assert.equal(CostLedger.of(session).usage().summary.requests, 1)
})

/** A Provider of the caller's own whose `prices` getter answers FLASH until `state.changed`, then `later`. */
function changingPrices(state: { changed: boolean }, later: unknown): Provider {
  return { model: 'm', baseURL: 'memory://m', contextWindow: 100_000, maxTokens: 100,
    get prices() { return state.changed ? later : FLASH },
    complete: async () => ({ message: { role: 'assistant', content: [{ type: 'text', text: 'ok' }] }, finishReason: 'stop',
      usage: { promptTokens: 10_000, completionTokens: 5 } }),
  } as unknown as Provider
}

test('cap: a custom Provider whose prices getter answers zeros once maxCostUSD is checked runs past the cap', async () => {
  // 19b89c8/e7fd24e read maxCostUSD and openAICompatible's prices once into copies, and spendCap() validates a custom
  // Provider's prices where the cap is set; but that validated copy is thrown away and every request/header reads
  // provider.prices again. With the prices honest, a $0.004 session cap stops the third 10,000-token turn ('budget').
  const state = { changed: false }
  const session = await Session.open(new MemoryStore())
  const agent = new Agent({ session, provider: changingPrices(state, { cacheHitInput: 0, cacheMissInput: 0, output: 0 }),
    maxCostUSD: { session: 0.004 } } as ConstructorParameters<typeof Agent>[0])
  state.changed = true
  const reasons: string[] = []
  for (let i = 0; i < 5; i++) reasons.push((await agent.run('x'.repeat(40_000))).reason)
  // Observed: ['stop' ×5], spendFloor().costUSD 0 after five 10,000-token requests.
  assert.deepEqual(reasons, ['stop', 'stop', 'budget', 'budget', 'budget'])
})

test('cap: a custom Provider whose prices turn NaN mid-session ends the turn with a clear error, not the log\'s INVALID_EVENT', async () => {
  // The same getter answering NaN prices after the check: the next request/header is refused by the log's own event
  // check, and run() throws SessionError INVALID_EVENT "request/header: prices.cacheHitInput must be … got null"
  // after turn/start and the input were logged (the turn has no end). Expected: the prices read once where the cap is
  // set (the run goes on at them), or a ConfigError/TypeError naming the provider's prices before the turn starts.
  const state = { changed: false }
  const session = await Session.open(new MemoryStore())
  const agent = new Agent({ session, provider: changingPrices(state, { cacheHitInput: NaN, cacheMissInput: NaN, output: NaN }),
    maxCostUSD: { session: 1 } } as ConstructorParameters<typeof Agent>[0])
  state.changed = true
  let thrown: unknown
  try { await agent.run('hello') } catch (e) { thrown = e }
  assert.ok(!(thrown instanceof Error && /INVALID_EVENT/.test(`${(thrown as { code?: string }).code} ${thrown.message}`)),
    `run threw ${(thrown as Error)?.name} ${(thrown as { code?: string })?.code}: ${(thrown as Error)?.message?.slice(0, 120)}`)
  const types = session.events.map((e) => e.type)
  assert.equal(types.filter((t) => t === 'turn/start').length, types.filter((t) => t === 'turn/end').length,
    `a turn/start without its turn/end: ${types.join(', ')}`)
})
