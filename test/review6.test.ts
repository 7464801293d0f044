// review6: a hostile review of the spend cap, the summary request's lead and the options reader. Each test here
// failed on the commit it was written against (the rev6 candidate, d27e1c7): it states the behaviour that
// docs/design.md (§11, §14) promises and that the candidate does not yet keep.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import {
  Agent, Session, MemoryStore, openAICompatible, type ChatRequest, type Prices, type Provider, type SessionEvent,
} from '../dsh.ts'
import { tuned } from './tuning.ts'

const FLASH: Prices = { cacheHitInput: 0.003, cacheMissInput: 0.15, output: 0.6 }
const BASE = { baseURL: 'http://127.0.0.1:1', model: 'm' }
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

// ── The spend cap: a request the server ran (it answered 200) costs, even when nothing streamed ──

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
  assert.equal(session.cost.usage().conversation.requests, 1)
  assert.ok(session.cost.spendFloor().costUSD >= 10_000 * 0.15 / 1e6, `spent ${session.cost.spendFloor().costUSD}`)
})

test('cap: a server that answers 200 and then sends nothing (keep-alives only) until the idle timeout costs a request', async () => {
  // A hostile or broken server: 200, then a keep-alive comment and silence. The adapter gives up (TIMEOUT, idle) and
  // the turn fails, but the server ran the prompt: §11 counts a request that answered 200.
  const provider = stalledProvider([': keep-alive\n\n'], () => {}, { idleTimeoutMs: 100 })
  const session = await Session.open(new MemoryStore())
  const agent = new Agent({ session, provider, maxCostUSD: 1, warn: () => {} } as ConstructorParameters<typeof Agent>[0])
  await assert.rejects(agent.run('x'.repeat(40_000)), { name: 'ProviderError', code: 'TIMEOUT' })
  const errors = session.events.filter((e) => e.type === 'request/error') as SessionEvent<'request/error'>[]
  assert.equal(errors.at(-1)?.data.code, 'TIMEOUT')
  // Observed: the TIMEOUT has no `spent` (the error carries no status 200), so the request is not counted.
  assert.deepEqual(errors.at(-1)?.data.spent && { outputTokens: errors.at(-1)!.data.spent!.outputTokens }, { outputTokens: 0 })
  assert.equal(session.cost.usage().conversation.requests, 1)
})

// ── The summary request's lead: sent to reuse the conversation's cached prefix ──

test('lead: a summarizer of another model gets no lead (it has no cached prefix to reuse, the lead is only cost)', async () => {
  // The conversation model runs nine tool calls of 7,000-character results in a 16,000-token window; the summaries
  // go to another model. The lead (the current input ahead of the region) exists only to read the conversation's
  // cache (docs/design.md §5, §11); another model has none, so every token of it is paid at that model's miss price.
  let step = 0
  const conversation: Provider = {
    model: 'conv', baseURL: 'memory://conv', contextWindow: 16_000, maxTokens: 200, prices: FLASH,
    complete: async () => {
      const i = step++
      return i < 9
        ? { message: { role: 'assistant', content: [{ type: 'tool-call', id: `a${i}`, name: 'fetch', arguments: JSON.stringify({ i }) }] }, finishReason: 'tool-calls' }
        : { message: { role: 'assistant', content: [{ type: 'text', text: 'done' }] }, finishReason: 'stop' }
    },
  } as Provider
  const sent: ChatRequest[] = []
  const summarizer: Provider = { ...conversation, model: 'other', prices: FLASH,
    complete: async (request: ChatRequest) => { sent.push(request)
      return { message: { role: 'assistant', content: [{ type: 'text', text: 'CHECKPOINT: work so far.' }] }, finishReason: 'stop' } } } as Provider
  let n = 0
  const session = await Session.open(new MemoryStore())
  const agent = new Agent({ session, provider: conversation, summarizer, system: 'sys', recall: false, compaction: { clear: false },
    tools: [{ name: 'fetch', description: 't', parameters: { type: 'object', properties: {} }, execute: () => `result ${n++} `.padEnd(7_000, '.') }] })
  await agent.run('fetch nine')
  assert.ok(sent.length > 0, 'a summary request was made')
  const record = (session.events.find((e) => e.type === 'compaction/end') as SessionEvent<'compaction/end'>).data.requests![0]
  assert.equal(record.modelledHitTokens, 0, 'another model reads no cached prefix')
  // Observed: the first message of the summary request is the input 'fetch nine' (the lead), sent uncached.
  assert.notDeepEqual(sent[0].messages[0], { role: 'user', content: 'fetch nine' })
})

// ── The options reader ──

test('options: a revoked Proxy as prices is a TypeError naming prices, like any other unreadable prices', () => {
  const { proxy, revoke } = Proxy.revocable({}, {})
  revoke()
  // Observed: "Cannot perform 'IsArray' on a proxy that has been revoked" (the Array.isArray check before the
  // reader, outside its try): the error names neither the function nor the field. headers and extraBody say it.
  assert.throws(() => openAICompatible({ ...BASE, prices: proxy as unknown as Prices }),
    (e: unknown) => e instanceof TypeError && /^openAICompatible: prices\b/.test(e.message))
  assert.throws(() => openAICompatible({ ...BASE, headers: proxy as unknown as Record<string, string> }),
    (e: unknown) => e instanceof TypeError && /^openAICompatible: headers\b/.test(e.message))
})

test('options: a configuration field that is own but not enumerable is refused or read, never read as the default', async () => {
  // Like an object that inherits its fields (refused since e7fd24e): the caller's thresholdRatio 0.1 is silently
  // replaced by the default 0.8.
  const session = await Session.open(new MemoryStore())
  const provider = openAICompatible({ ...BASE, contextWindow: 10_000 })
  const compaction = Object.defineProperty({}, 'thresholdRatio', { value: 0.1, enumerable: false })
  let agent: Agent | undefined
  try { agent = new Agent({ session, provider, compaction }) } catch (e) { assert.equal((e as Error).name, 'ConfigError'); return }
  assert.equal(agent.compaction.thresholdRatio, 0.1)
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

test('lead: a summary of the region after the current input never carries an earlier turn that stays on the surface', async () => {
  // Turn 1 is short ("hello" → "hi there"); turn 2 fetches nine results of 7,000 characters in a 16,000-token window.
  // The run before turn 2's input is too small to be the region, so the region is the one after the input, and the
  // lead is every surface message before it: turn 1 and the input. The instruction asks for a checkpoint of "the
  // conversation above … the messages it covers will be removed", so the checkpoint restates turn 1, which stays on
  // the surface next to it (the commit says the lead is the kept current input at the head).
  let step = 0
  const sent: ChatRequest[] = []
  const provider: Provider = {
    model: 'm', baseURL: 'memory://lead', contextWindow: 16_000, maxTokens: 200, prices: FLASH,
    complete: async (request: ChatRequest) => {
      if (request.headers?.['x-dsh-purpose'] === 'compaction') { sent.push(request)
        return { message: { role: 'assistant', content: [{ type: 'text', text: 'CHECKPOINT: work so far.' }] }, finishReason: 'stop' } }
      const i = step++
      if (i === 0) return { message: { role: 'assistant', content: [{ type: 'text', text: 'hi there' }] }, finishReason: 'stop' }
      return i < 10
        ? { message: { role: 'assistant', content: [{ type: 'tool-call', id: `a${i}`, name: 'fetch', arguments: JSON.stringify({ i }) }] }, finishReason: 'tool-calls' }
        : { message: { role: 'assistant', content: [{ type: 'text', text: 'done' }] }, finishReason: 'stop' }
    },
  } as Provider
  let n = 0
  const session = await Session.open(new MemoryStore())
  const agent = new Agent({ session, provider, system: 'sys', recall: false, compaction: { clear: false },
    tools: [{ name: 'fetch', description: 't', parameters: { type: 'object', properties: {} }, execute: () => `result ${n++} `.padEnd(7_000, '.') }] })
  await agent.run('hello')
  await agent.run('fetch nine')
  assert.ok(sent.length > 0, 'a summary request was made')
  const surface = session.surface().map((node) => node.message)
  assert.deepEqual(surface[0], { role: 'user', content: 'hello' }, 'turn 1 stays on the surface, outside every region')
  // Observed: the first summary request opens with 'hello', 'hi there', 'fetch nine' (the lead).
  assert.deepEqual(sent.map((r) => r.messages.findIndex((m) => m.role === 'user' && m.content === 'hello')),
    sent.map(() => -1))
})

test('lead: a checkpoint that stays at the head is not sent to the next summary, which is told to merge it in', async () => {
  // Turn 1 fetches nine results and compacts; a /compact between turns, then turn 2 fetches nine more. Its first
  // summary leaves a lone checkpoint before the input "task two" (no region: a checkpoint alone), so its second
  // summary's region follows the input and the lead (everything before the region) is that checkpoint and the input. SUMMARY_INSTRUCTION says "If an earlier checkpoint is included, merge it
  // in", so the new checkpoint restates the old one, which stays on the surface: the same facts twice, paid for twice.
  let step = 0, k = 0, n = 0
  const sent: ChatRequest[] = []
  const provider: Provider = {
    model: 'm', baseURL: 'memory://lead', contextWindow: 16_000, maxTokens: 200, prices: FLASH,
    complete: async (request: ChatRequest) => {
      if (request.headers?.['x-dsh-purpose'] === 'compaction') { sent.push(request)
        return { message: { role: 'assistant', content: [{ type: 'text', text: `CHECKPOINT ${++k}: work so far.` }] }, finishReason: 'stop' } }
      const i = step++ % 10
      return i < 9
        ? { message: { role: 'assistant', content: [{ type: 'tool-call', id: `a${step}`, name: 'fetch', arguments: JSON.stringify({ i }) }] }, finishReason: 'tool-calls' }
        : { message: { role: 'assistant', content: [{ type: 'text', text: 'done' }] }, finishReason: 'stop' }
    },
  } as Provider
  const session = await Session.open(new MemoryStore())
  const agent = new Agent({ session, provider, system: 'sys', recall: false, compaction: { clear: false },
    tools: [{ name: 'fetch', description: 't', parameters: { type: 'object', properties: {} }, execute: () => `result ${n++} `.padEnd(7_000, '.') }] })
  await agent.run('task one')
  assert.equal((await agent.compact()).action, 'compacted')
  const before = sent.length
  await agent.run('task two')
  const surface = session.surface().map((node) => node.message)
  const head = surface[0]
  assert.match(String(head.content), /^Earlier parts of this session were compacted/)
  assert.deepEqual(surface[1], { role: 'user', content: 'task two' }, 'a checkpoint at the head, then the input')
  assert.ok(sent.length - before >= 2, 'turn 2 made two summary requests')
  // Observed: turn 2's second summary request opens with that head checkpoint, then "task two" (the lead).
  assert.deepEqual(sent.slice(before).map((r) => r.messages.some((m) => m.role === 'user' && m.content === head.content)),
    sent.slice(before).map(() => false))
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
  const agent = new Agent({ session, provider, maxCostUSD: cap, warn: () => {} } as ConstructorParameters<typeof Agent>[0])
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
  assert.equal(session.cost.usage().summary.requests, 1)
})

test('options: an object that inherits its fields from a null-prototype object is refused too, never read as the defaults', async () => {
  // plainFields takes an object as plain when its prototype's prototype is null: true of Object.prototype, and also
  // of any null-prototype object used as a prototype. So Object.create(base) with base = Object.create(null) + fields
  // passes as plain, its own keys are none, and the caller's thresholdRatio 0.1 is read as the default 0.8.
  const session = await Session.open(new MemoryStore())
  const provider = openAICompatible({ ...BASE, contextWindow: 10_000 })
  const base = Object.assign(Object.create(null) as object, { thresholdRatio: 0.1 })
  let agent: Agent | undefined
  try { agent = new Agent({ session, provider, compaction: Object.create(base) }) } catch (e) {
    assert.deepEqual([(e as Error).name, (e as Error).message],
      ['ConfigError', 'compaction config must be an object, got an object that inherits fields'])
    return
  }
  assert.equal(agent.compaction.thresholdRatio, 0.1)
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

test('options: a sparse prices.peak.days of 2^27 holes is a TypeError, not an out-of-memory crash of the process', async () => {
  // validatePrices copies peak.days with Array.from before it validates it: a sparse array (a few bytes of the
  // caller's memory) becomes 2^27 undefined slots. In a process with a 64 MB heap that is a fatal V8 out-of-memory
  // crash (the caller cannot catch it); fb1e8ef took every() over the holes and accepted the list instead.
  const { spawnSync } = await import('node:child_process')
  const { fileURLToPath } = await import('node:url')
  const dsh = fileURLToPath(new URL('../dsh.ts', import.meta.url))
  const script = `const { openAICompatible } = await import(${JSON.stringify(dsh)});
    try { openAICompatible({ baseURL: 'http://127.0.0.1:1', model: 'm', prices: { cacheHitInput: 1, cacheMissInput: 1,
      output: 1, peak: { multiplier: 2, days: new Array(2 ** 27), hoursUTC: [[1, 2]] } } }); console.log('accepted') }
    catch (e) { console.log(e.name + ': ' + e.message.slice(0, 66)) }`
  const child = spawnSync(process.execPath, ['--max-old-space-size=64', '--import', 'tsx', '--input-type=module', '-e', script],
    { cwd: fileURLToPath(new URL('..', import.meta.url)), encoding: 'utf8', timeout: 120_000 })
  assert.deepEqual([child.status, child.signal, child.stdout.trim()],
    [0, null, 'TypeError: openAICompatible: prices.peak.days must be UTC weekdays 0 (Sunday)'], child.stderr.slice(0, 300))
})

test('lead: a summary request whose tool specs are dropped (they crowd the window) reads no cache, so it sends no lead', async () => {
  // One tool of a 7,000-character description: over 10% of the 16,000-token window, so the summary requests go without
  // the tool specs. Their envelope differs from the conversation's, nothing of the prefix is cached for them (the
  // modelled hit is 0), and the lead is only tokens paid at the miss price.
  let step = 0, n = 0
  const sent: ChatRequest[] = []
  const provider: Provider = { model: 'm', baseURL: 'memory://g', contextWindow: 16_000, maxTokens: 200, prices: FLASH,
    complete: async (r: ChatRequest) => {
      if (r.headers?.['x-dsh-purpose'] === 'compaction') { sent.push(r)
        return { message: { role: 'assistant', content: [{ type: 'text', text: 'CHECKPOINT: work so far.' }] }, finishReason: 'stop' } }
      const i = step++
      return i < 9 ? { message: { role: 'assistant', content: [{ type: 'tool-call', id: `a${i}`, name: 'fetch', arguments: '{}' }] }, finishReason: 'tool-calls' }
        : { message: { role: 'assistant', content: [{ type: 'text', text: 'done' }] }, finishReason: 'stop' } } } as Provider
  const session = await Session.open(new MemoryStore())
  const agent = new Agent({ session, provider, recall: false, compaction: { clear: false },
    tools: [{ name: 'fetch', description: 'd'.repeat(7_000), parameters: { type: 'object', properties: {} }, execute: () => `result ${n++} `.padEnd(6_000, '.') }] })
  await agent.run('fetch nine')
  const end = session.events.find((e) => e.type === 'compaction/end') as SessionEvent<'compaction/end'>
  assert.deepEqual(end.data.requests!.map((r) => r.modelledHitTokens), [0])
  assert.deepEqual(sent.map((r) => r.tools?.length ?? 0), [0], 'the summary request has no tool specs')
  // Observed: it opens with the input 'fetch nine' all the same.
  assert.notDeepEqual(sent[0].messages[0], { role: 'user', content: 'fetch nine' })
})

test('count: a Provider whose countTokens answers no token count (NaN, -5, "12000") logs no calibration sample of it', async () => {
  // The adapters check their server's count (an integer in [0, USAGE_MAX_TOKENS]); the loop takes any Provider's
  // answer as is and logs it: ladder/state {sample: {providerTokens: null}} (NaN as JSON), -5, "12000".
  const logged: unknown[] = []
  for (const count of [Number.NaN, -5, '12000']) {
    const provider: Provider = { model: 'm', baseURL: 'memory://count', contextWindow: 10_000, maxTokens: 100, prices: FLASH,
      complete: async () => ({ message: { role: 'assistant', content: [{ type: 'text', text: 'ok' }] }, finishReason: 'stop' }),
      countTokens: async () => count as number } as Provider
    const session = await Session.open(new MemoryStore())
    await new Agent({ session, provider, warn: () => {} } as ConstructorParameters<typeof Agent>[0]).run('x'.repeat(36_000))
    for (const e of session.events) {
      const sample = (e.data as { sample?: { providerTokens: unknown; source: string } }).sample
      if (e.type === 'ladder/state' && sample?.source === 'count') logged.push(sample.providerTokens)
    }
  }
  // Observed: [NaN, -5, '12000'] (NaN is written as null).
  assert.deepEqual(logged, [])
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
