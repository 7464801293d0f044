// Cost and the prompt cache (docs/design.md §11): byte-stable requests, the modelled cache hit,
// reported cached tokens, the price table, the cost of an edit. Over real HTTP against the fake
// provider where a request is involved.
import { test, after } from 'node:test'
import assert from 'node:assert/strict'
import {
  Agent, Session, MemoryStore, openAICompatible, deepseek, DEEPSEEK_PRICES, estimateMessageTokens, statusReporter,
  formatUSD, type ChatRequest, type Prices, type Provider, type Tool, type SessionEvent, type AgentEvent, internals, CostLedger
} from '../dsh.ts'
import {
  estimateEnvelopeTokens, SUMMARY_INSTRUCTION,
} from './spec.ts'

const { isPeakTime, requestCostUSD, cacheCostUSD } = internals
/** Prices are validated where they are given: as a provider's `prices` option. */
const validatePrices = (prices: unknown) => openAICompatible({ baseURL: 'http://127.0.0.1:1', model: 'm', prices: prices as Prices }).prices
/** DeepSeek's table for a model name, aliases resolved, as deepseek() picks it. */
const pricesOf = (model: string) => deepseek({ apiKey: 'sk-test', model }).prices
import { sseResponse, startFakeProvider, type FakeReply, type FakeRequest } from './fake-provider.ts'
import { logHeader } from './spec.ts'
import { tuned } from './tuning.ts'
import { FLASH } from './scripted-provider.ts'

const servers: Array<{ close(): Promise<void> }> = []
after(async () => { for (const s of servers) await s.close() })

/** deepseek-flash without its peak hours: results do not depend on the clock. */
/** A Saturday, 12:00 UTC (off-peak) and a Monday, 02:30 UTC (peak), in ms. */
const SATURDAY_NOON = Date.UTC(2026, 10, 28, 12, 0, 0)
const MONDAY_PEAK = Date.UTC(2026, 10, 30, 2, 30, 0)

async function fake(script: FakeReply[], summaries: FakeReply[] = [{ text: 'CHECKPOINT: work so far.', usage: null }]) {
  let c = 0, s = 0
  const server = await startFakeProvider({
    handler: (req: FakeRequest) => req.headers['x-dsh-purpose'] === 'compaction' ? summaries[Math.min(s++, summaries.length - 1)] : script[Math.min(c++, script.length - 1)],
  })
  servers.push(server)
  return server
}
const provider = (url: string, extra: Record<string, unknown> = {}) => tuned({ maxRetries: 0 }, () => openAICompatible({ baseURL: url, model: 'fake-model', apiKey: 'sk-test', contextWindow: 16_000, ...extra }))
const tool = (name: string, out: (args: any) => string): Tool => ({ name, description: 'test tool', parameters: { type: 'object', properties: {} }, execute: out })
const assistants = (s: Session) => s.events.filter((e) => e.type === 'assistant/message') as SessionEvent<'assistant/message'>[]
/** Where the messages array of a raw body ends (the per-request fields follow it). */
const messagesEnd = (raw: string) => raw.lastIndexOf('],"stream":true')

test('prices: validation names the field; DeepSeek table and aliases; peak hours; exact request cost', () => {
  assert.throws(() => validatePrices({ cacheHitInput: 0.1, cacheMissInput: -1, output: 1 }), /prices\.cacheMissInput must be a non-negative number of USD per million tokens, got -1/)
  assert.throws(() => validatePrices({ cacheHitInput: 0.1, cacheMissInput: 1, output: 1, currency: 'EUR' }), /unknown key "currency"/)
  assert.throws(() => validatePrices({ cacheHitInput: 0.1, cacheMissInput: 1, output: 1, peak: { multiplier: 2, days: [7], hoursUTC: [[1, 4]] } }), /peak\.days/)
  assert.throws(() => validatePrices({ cacheHitInput: 0.1, cacheMissInput: 1, output: 1, peak: { multiplier: 2, days: [1], hoursUTC: [[4, 1]] } }), /peak\.hoursUTC/)
  assert.throws(() => openAICompatible({ baseURL: 'http://127.0.0.1:1', model: 'm', prices: { output: 1 } as any }), /openAICompatible: prices\.cacheHitInput/)
  assert.deepEqual({ ...DEEPSEEK_PRICES['deepseek-flash'], peak: undefined }, { cacheHitInput: 0.003, cacheMissInput: 0.15, output: 0.6, peak: undefined })
  assert.deepEqual({ ...DEEPSEEK_PRICES['deepseek-v4-pro'], peak: undefined }, { cacheHitInput: 0.022, cacheMissInput: 0.66, output: 1.98, peak: undefined })
  assert.equal(pricesOf('deepseek-chat'), DEEPSEEK_PRICES['deepseek-flash'])
  assert.equal(pricesOf('gpt-4o'), undefined)
  assert.equal(deepseek({ apiKey: 'sk-test', model: 'deepseek-v4-pro' }).prices, DEEPSEEK_PRICES['deepseek-v4-pro'])
  assert.equal(openAICompatible({ baseURL: 'http://127.0.0.1:1', model: 'deepseek-flash' }).prices, undefined) // another server: no price unless given
  const flash = DEEPSEEK_PRICES['deepseek-flash']
  // Weekdays 01:00–04:00 and 06:00–10:00 UTC are peak; the edges are [start, end).
  assert.equal(isPeakTime(flash, Date.UTC(2026, 10, 30, 0, 59, 59)), false)
  assert.equal(isPeakTime(flash, Date.UTC(2026, 10, 30, 1, 0, 0)), true)
  assert.equal(isPeakTime(flash, Date.UTC(2026, 10, 30, 4, 0, 0)), false)
  assert.equal(isPeakTime(flash, Date.UTC(2026, 10, 30, 9, 59, 0)), true)
  assert.equal(isPeakTime(flash, Date.UTC(2026, 10, 28, 2, 0, 0)), false) // Saturday
  const tokens = { cachedInputTokens: 1_000_000, uncachedInputTokens: 2_000_000, outputTokens: 500_000 }
  assert.equal(requestCostUSD(flash, tokens, SATURDAY_NOON), 0.003 + 0.3 + 0.3)
  assert.equal(requestCostUSD(flash, tokens, MONDAY_PEAK), 2 * (0.003 + 0.3 + 0.3))
  assert.equal(cacheCostUSD(flash, 1_000_000), 0.147)
})

test('case 1: two requests of one turn: the first body is a byte prefix of the second up to its last message; hit = first input', async () => {
  const server = await fake([{ toolCalls: [{ id: 'c1', name: 'look', arguments: { path: 'a.txt' } }], usage: null }, { text: 'done', usage: null }])
  const session = await Session.open(new MemoryStore())
  const agent = new Agent({ session, provider: provider(server.url, { prices: FLASH, extraBody: { temperature: 0 } }), system: 'You are a test.', tools: [tool('look', () => 'file contents here')] })
  await agent.run('look at a.txt')
  const [first, second] = server.requests.map((r) => r.rawBody)
  const end = messagesEnd(first)
  assert.ok(end > 0)
  assert.equal(second.slice(0, end), first.slice(0, end), 'byte prefix up to the end of the first request\'s last message')
  assert.equal(second[end], ',', 'the second request continues the same messages array')
  // Key order: extra fields, model, tools, messages, then the per-request fields.
  assert.deepEqual(Object.keys(JSON.parse(first)), ['temperature', 'model', 'tools', 'messages', 'stream', 'stream_options', 'max_tokens'])
  const [a1, a2] = assistants(session)
  const input1 = estimateEnvelopeTokens(agent.envelope) + estimateMessageTokens({ role: 'user', content: 'look at a.txt' })
  assert.equal(input1, 12 + 31 + 12) // system "You are a test." 4 + 8; tools JSON 92 chars → 23 + 8; the input 4 + 8
  assert.deepEqual(a1.data.cache, { inputTokens: input1, modelledHitTokens: 0 })
  assert.equal(a2.data.cache!.modelledHitTokens, input1)
  const input2 = input1 + estimateMessageTokens(a1.data.message) + estimateMessageTokens(session.surface()[2].message)
  assert.equal(a2.data.cache!.inputTokens, input2)
  const u = CostLedger.of(session).usage()
  assert.deepEqual(u.conversation, {
    requests: 2, inputTokens: input1 + input2, cachedInputTokens: input1, uncachedInputTokens: input2, unpricedRequests: 0,
    outputTokens: estimateMessageTokens(a1.data.message) + estimateMessageTokens(a2.data.message),
    costUSD: (input1 * 0.003 + input2 * 0.15 + (estimateMessageTokens(a1.data.message) + estimateMessageTokens(a2.data.message)) * 0.6) / 1e6,
  })
  assert.equal(u.cacheHitShare, input1 / (input1 + input2))
})

test('case 2: a prune at position k: the next hit is the prefix before k; the prune costs (tokens from k) × (miss − hit)', async () => {
  const script: FakeReply[] = [
    { toolCalls: [{ id: 'c1', name: 'read', arguments: { n: 1 } }], usage: null },
    { toolCalls: [{ id: 'c2', name: 'read', arguments: { n: 2 } }], usage: null },
    { toolCalls: [{ id: 'c3', name: 'read', arguments: { n: 3 } }], usage: null },
    { text: 'done', usage: null },
  ]
  const server = await fake(script)
  const sizes: Record<number, number> = { 1: 40_000, 2: 4_000, 3: 8_000 }
  const session = await Session.open(new MemoryStore())
  const lines: string[] = []
  let agent: Agent | undefined
  const status = statusReporter(() => agent, (line) => lines.push(line), true, false)
  // recall: false — offering recall after the first prune changes the envelope (one full miss); this case is the prune's own cost.
  agent = new Agent({ session, provider: provider(server.url, { prices: FLASH }), tools: [tool('read', (a) => 'x'.repeat(sizes[a.n]))], onEvent: (e: AgentEvent) => status(e), recall: false })
  await agent.run('read three')
  const prunes = session.events.filter((e) => e.type === 'compaction/prune')
  assert.equal(prunes.length, 1, 'the 40,000-char result, seen by the model, is pruned after step 3')
  const replace = session.events[prunes[0].seq + 1] as SessionEvent<'tool/result'>
  const surface = session.surface()
  const k = surface.findIndex((n) => n.seq === replace.seq)
  assert.equal(k, 2) // user, assistant (call 1), the pruned result
  assert.equal(surface[k].tokens, 1_298)
  // The request before the prune sent: user, A1, result 1, A2, result 2. From k on: result 1 (pruned), A2, result 2.
  const movedTokens = surface[k].tokens + surface[k + 1].tokens + surface[k + 2].tokens
  assert.deepEqual(CostLedger.of(session).editCache(replace.seq), { seq: replace.seq, movedTokens, savedTokens: 10_008 - 1_298 })
  assert.equal(movedTokens, 1_298 + surface[3].tokens + 1_008)
  assert.equal(agent.editCost(replace.seq)!.cacheCostUSD, movedTokens * (0.15 - 0.003) / 1e6)
  // The CLI's prune line carries the same figures.
  const cost = movedTokens * (0.15 - 0.003) / 1e6, saved = (10_008 - 1_298) * 0.003 / 1e6
  // The net-cost gate's payback: ceil(2,317 × (0.15 − 0.003) / (8,710 × 0.003)) = ceil(13.03) = 14 requests.
  assert.equal(movedTokens, 2_317)
  assert.equal((prunes[0].data as { paysBackAfterRequests?: number }).paysBackAfterRequests, 14)
  assert.ok(lines.includes(`[dsh] pruned read 1: 10,008 → 1,298 tokens (8,710 saved) · pays back after 14 requests · cache: ${movedTokens.toLocaleString('en-US')} tokens move from hit to miss (+${formatUSD(cost)} once); saves 8,710 tokens (${formatUSD(saved)} per request)\n`), lines.join(''))
  assert.equal(formatUSD(cost), '$0.000341')
  const u = CostLedger.of(session).usage()
  assert.match(lines.at(-1)!, new RegExp(`· \\${formatUSD(u.costUSD!)} so far, cache hits ${Math.round(u.cacheHitShare * 100)}%\n$`))
  const last = assistants(session).at(-1)!
  assert.equal(last.data.cache!.modelledHitTokens, estimateEnvelopeTokens(agent.envelope) + surface[0].tokens + surface[1].tokens, 'the next request hits only the envelope and the prefix before k')
})

test('case 3: reported cached tokens win; the split and the cost are the price table applied to them; usage survives resume', async () => {
  const server = await fake([
    { toolCalls: [{ id: 'c1', name: 'look', arguments: {} }], usage: { prompt_tokens: 1000, completion_tokens: 50, prompt_cache_hit_tokens: 0, prompt_cache_miss_tokens: 1000 } },
    { text: 'done', usage: { prompt_tokens: 1500, completion_tokens: 20, prompt_tokens_details: { cached_tokens: 1000 } } },
  ])
  const store = new MemoryStore()
  let clock = SATURDAY_NOON
  const session = await Session.open(store, { now: () => clock })
  await new Agent({ session, provider: provider(server.url, { prices: DEEPSEEK_PRICES['deepseek-flash'] }), tools: [tool('look', () => 'ok')] }).run('go')
  const u = CostLedger.of(session).usage()
  assert.deepEqual(
    [u.inputTokens, u.cachedInputTokens, u.uncachedInputTokens, u.outputTokens, u.requests, u.reportedCacheRequests],
    [2500, 1000, 1500, 70, 2, 2])
  assert.equal(u.costUSD, (1000 * 0.003 + 1500 * 0.15 + 70 * 0.6) / 1e6) // $0.00027 off-peak
  assert.equal(u.cacheHitShare, 0.4)
  // Re-priced as if at a peak hour: double.
  const reloaded = await Session.open(store, { now: () => clock })
  assert.deepEqual(CostLedger.of(reloaded).usage(), u, 'derived from the log: the same after resume')
  clock = MONDAY_PEAK
  const peak = new Session({ now: () => clock })
  for (const e of session.events) peak.append(e.type, e.data as any)
  assert.equal(CostLedger.of(peak).usage().costUSD, 2 * (1000 * 0.003 + 1500 * 0.15 + 70 * 0.6) / 1e6)
})

test('case 4: a summary request shares its bytes with the conversation request before it up to the region\'s end', async () => {
  const calls = (k: number, p: string) => Array.from({ length: k }, (_, i) => ({ toolCalls: [{ id: `${p}${i}`, name: 'fetch', arguments: { i } }], usage: null }))
  const server = await fake([...calls(5, 'a'), { text: 'turn 1 done', usage: null }, ...calls(4, 'b'), { text: 'turn 2 done', usage: null }])
  let n = 0
  const session = await Session.open(new MemoryStore())
  const agent = new Agent({ session, provider: provider(server.url, { prices: FLASH }), system: 'sys', tools: [tool('fetch', () => `result ${n++} `.padEnd(7_000, '.'))], compaction: { clear: false }, recall: false })
  await agent.run('fetch five')
  await agent.run('fetch four more')
  const at = server.requests.findIndex((r) => r.headers['x-dsh-purpose'] === 'compaction')
  assert.ok(at > 0, 'one summary request was made')
  const summary = server.requests[at].rawBody, before = server.requests[at - 1].rawBody
  const instruction = summary.lastIndexOf(`,{"role":"user","content":${JSON.stringify(SUMMARY_INSTRUCTION)}}`)
  assert.ok(instruction > 0, 'instruction last')
  assert.equal(summary.slice(0, instruction), before.slice(0, instruction), 'byte prefix up to the end of the region')
  assert.equal(before[instruction], ',', 'the conversation request goes on past the region')
  const end = session.events.find((e) => e.type === 'compaction/end') as SessionEvent<'compaction/end'>
  const record = end.data.requests![0]
  const summarised = (session.events.find((e) => e.type === 'compaction/summary') as SessionEvent<'compaction/summary'>).data
  assert.equal(record.modelledHitTokens, estimateEnvelopeTokens(agent.envelope) + summarised.shadowedTokenCount, 'the whole region hits the cache')
  assert.equal(record.inputTokens, record.modelledHitTokens + estimateMessageTokens({ role: 'user', content: SUMMARY_INSTRUCTION }))
  const u = CostLedger.of(session).usage()
  assert.equal(u.summary.requests, 1)
  assert.equal(u.summary.cachedInputTokens, record.modelledHitTokens)
  assert.ok(typeof u.summary.costUSD === 'number' && u.summary.costUSD > 0)
})

test('a summary request of a region after the kept current input sends that input first: it reuses the cached prefix', async () => {
  // One turn: its input heads the surface and is never summarised, so the region starts after it. The summary request
  // sends it ahead of the region (the conversation's leading message), so the bytes and the modelled hit cover both.
  const calls = Array.from({ length: 9 }, (_, i) => ({ toolCalls: [{ id: `a${i}`, name: 'fetch', arguments: { i } }], usage: null }))
  const server = await fake([...calls, { text: 'done', usage: null }])
  let n = 0
  const session = await Session.open(new MemoryStore())
  const agent = new Agent({ session, provider: provider(server.url, { prices: FLASH }), system: 'sys', tools: [tool('fetch', () => `result ${n++} `.padEnd(7_000, '.'))], compaction: { clear: false }, recall: false })
  await agent.run('fetch nine')
  const at = server.requests.findIndex((r) => r.headers['x-dsh-purpose'] === 'compaction')
  assert.ok(at > 0, 'one summary request was made')
  const summary = server.requests[at].rawBody, before = server.requests[at - 1].rawBody
  assert.deepEqual(JSON.parse(summary).messages[1], { role: 'user', content: 'fetch nine' }, 'the input first, after the system prompt')
  const instruction = summary.lastIndexOf(`,{"role":"user","content":${JSON.stringify(SUMMARY_INSTRUCTION)}}`)
  assert.equal(summary.slice(0, instruction), before.slice(0, instruction), 'byte prefix up to the end of the region')
  const record = (session.events.find((e) => e.type === 'compaction/end') as SessionEvent<'compaction/end'>).data.requests![0]
  const summarised = (session.events.find((e) => e.type === 'compaction/summary') as SessionEvent<'compaction/summary'>).data
  const input = estimateMessageTokens({ role: 'user', content: 'fetch nine' })
  assert.equal(record.modelledHitTokens, estimateEnvelopeTokens(agent.envelope) + input + summarised.shadowedTokenCount)
  assert.equal(record.inputTokens, record.modelledHitTokens + estimateMessageTokens({ role: 'user', content: SUMMARY_INSTRUCTION }))
  // The checkpoint replaces the region only: the input stays on the surface, ahead of it.
  assert.deepEqual(session.surface().slice(0, 1).map((node) => node.message), [{ role: 'user', content: 'fetch nine' }])
})

// The lead (what a summary request sends ahead of its region) under the hostile review rev6: sent only where it reads the cache.
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

test('case 5: a model without a price: cost unknown, tokens still reported', async () => {
  const server = await fake([{ text: 'hello', usage: { prompt_tokens: 300, completion_tokens: 5, prompt_cache_hit_tokens: 100 } }])
  const session = await Session.open(new MemoryStore())
  const agent = new Agent({ session, provider: provider(server.url) })
  await agent.run('hi')
  const u = agent.usage()
  assert.equal(u.costUSD, undefined)
  assert.equal(u.unpricedRequests, 1)
  const lines: string[] = []
  statusReporter(() => agent, (line) => lines.push(line), true, false)({ type: 'log', event: session.events.at(-2)! })
  assert.match(lines[0], /· cost unknown \(no price for this model; --prices sets one\), cache hits 33%\n$/)
  assert.deepEqual([u.inputTokens, u.cachedInputTokens, u.uncachedInputTokens, u.outputTokens], [300, 100, 200, 5])
  assert.equal(CostLedger.of(session).usage({ prices: FLASH }).costUSD, (100 * 0.003 + 200 * 0.15 + 5 * 0.6) / 1e6, 're-priced on request')
})

test('modelled hit: an envelope change caches nothing; a reported prompt size without cached tokens takes the modelled share', () => {
  const s = new Session()
  s.append('session/start', { id: 't', version: 'x' })
  logHeader(s, { model: 'm', baseURL: 'u', system: 'x'.repeat(40), prices: FLASH })
  const user = (text: string) => s.append('user/message', { message: { role: 'user', content: text }, surfaceOp: { op: 'append' } })
  const answer = (usage?: { promptTokens: number; completionTokens: number }) => s.append('assistant/message', { message: { role: 'assistant', content: [{ type: 'text', text: 'ok' }] }, finishReason: 'stop', surfaceOp: { op: 'append' }, usage })
  user('a'.repeat(400)) // 108 tokens; envelope 18
  assert.deepEqual(CostLedger.of(s).nextRequestCache(), { inputTokens: 126, modelledHitTokens: 0 })
  answer()
  user('b'.repeat(40)) // 18
  assert.deepEqual(CostLedger.of(s).nextRequestCache(), { inputTokens: 126 + 9 + 18, modelledHitTokens: 126 })
  answer({ promptTokens: 306, completionTokens: 3 }) // reported 2× the estimate, no cached figure: 126/153 of 306 = 252
  assert.equal(CostLedger.of(s).usage().conversation.cachedInputTokens, 0 + 252)
  logHeader(s, { model: 'm', baseURL: 'u', system: 'y'.repeat(40), prices: FLASH })
  assert.equal(CostLedger.of(s).nextRequestCache().modelledHitTokens, 0, 'a new system prompt: nothing cached')
  logHeader(s, { model: 'm', baseURL: 'u', system: 'y'.repeat(40), maxTokens: 10, prices: FLASH })
  answer()
  logHeader(s, { model: 'm', baseURL: 'u', system: 'y'.repeat(40), maxTokens: 20, prices: FLASH })
  assert.equal(CostLedger.of(s).nextRequestCache().modelledHitTokens, 18 + 108 + 9 + 18 + 9, 'a new budget does not touch the cache')
})

test('--prices: a DeepSeek model name or HIT,MISS,OUTPUT; a bad value is a usage error naming both forms', async () => {
  const { parseCliArgs, UsageError } = await import('../dsh.ts')
  const run = parseCliArgs(['--prices', '0.01,0.5,2', '-p', 'hi'], { DEEPSEEK_API_KEY: 'sk-test' })
  assert.deepEqual((run as { prices?: Prices }).prices, { cacheHitInput: 0.01, cacheMissInput: 0.5, output: 2 })
  const replay = parseCliArgs(['replay', 'f.jsonl', '--prices', 'deepseek-v4-pro'], {})
  assert.equal((replay as { prices?: Prices }).prices, DEEPSEEK_PRICES['deepseek-v4-pro'])
  assert.throws(() => parseCliArgs(['--prices', '0.01,x,2', '-p', 'hi'], { DEEPSEEK_API_KEY: 'sk-test' }),
    (e: unknown) => e instanceof UsageError && /--prices must be a DeepSeek model name \(deepseek-flash, deepseek-v4-flash, deepseek-v4-pro\) or HIT,MISS,OUTPUT .* got "0.01,x,2"/.test(e.message))
})

test('a hostile log: malformed prices or summary request records are refused with the field named; nothing changes', async () => {
  const { SessionError } = await import('../dsh.ts')
  const s = new Session()
  s.append('session/start', { id: 't', version: 'x' })
  assert.throws(() => logHeader(s, { model: 'm', baseURL: 'u', prices: { cacheHitInput: 'free' } as any }),
    (e: unknown) => e instanceof SessionError && e.code === 'INVALID_EVENT' && /request\/header: prices\.cacheHitInput must be a non-negative number/.test(e.message))
  assert.throws(() => s.append('compaction/end', { id: 'k1', requests: [{ model: 'm', inputTokens: -1, modelledHitTokens: 0, outputTokens: 0 }] }),
    (e: unknown) => e instanceof SessionError && e.code === 'INVALID_EVENT' && /requests\[0\] must be/.test(e.message))
  assert.equal(s.seq, 1)
  assert.deepEqual([CostLedger.of(s).usage().requests, CostLedger.of(s).usage().costUSD], [0, 0])
})

test('usage() memory is bounded: requests are added up in buckets, and re-pricing a bucket equals pricing its requests one by one', async () => {
  const { Session, MemoryStore, DEEPSEEK_PRICES } = await import('../dsh.ts')
  let now = Date.UTC(2026, 11, 1, 0, 0, 0) // a Tuesday, 00:00 UTC: off-peak, then peak from 01:00
  const session = await Session.open(new MemoryStore(), { now: () => now })
  logHeader(session, { model: 'deepseek-flash', baseURL: 'https://api.deepseek.com', prices: DEEPSEEK_PRICES['deepseek-flash'], maxTokens: 100, contextWindow: 100_000 } as any)
  for (let i = 0; i < 200; i++) {
    now += 30_000 // 200 requests over 100 minutes: across the 01:00 peak boundary
    session.append('user/message', { message: { role: 'user', content: `q${i}` }, surfaceOp: { op: 'append' } })
    session.append('assistant/message', { message: { role: 'assistant', content: [{ type: 'text', text: 'a' }] }, usage: { promptTokens: 1000 + i, completionTokens: 10, cachedTokens: 500 }, finishReason: 'stop', surfaceOp: { op: 'append' } })
  }
  const buckets = (CostLedger.of(session) as any).buckets as Map<string, unknown>
  assert.ok(buckets.size <= 101, `${buckets.size} buckets for 200 requests`)
  const u = CostLedger.of(session).usage()
  assert.equal(u.conversation.requests, 200)
  assert.equal(u.conversation.cachedInputTokens, 200 * 500)
  assert.equal(u.conversation.inputTokens, 200 * 1000 + (199 * 200) / 2)
  // By hand: off-peak before 01:00 UTC (the first 119 requests end at 00:59:30), peak (×2) after.
  const p = DEEPSEEK_PRICES['deepseek-flash']
  let usd = 0
  for (let i = 0; i < 200; i++) {
    const t = Date.UTC(2026, 11, 1, 0, 0, 0) + (i + 1) * 30_000
    const one = (500 * p.cacheHitInput + (500 + i) * p.cacheMissInput + 10 * p.output) / 1e6
    usd += new Date(t).getUTCHours() >= 1 ? one * 2 : one
  }
  assert.ok(Math.abs(u.costUSD! - usd) < 1e-12, `${u.costUSD} vs ${usd}`)
})


test('a failed request the server ran is counted from its request/error {spent}, also after resume; its partial is the same request; older logs load', async () => {
  const { SessionError } = await import('../dsh.ts')
  const store = new MemoryStore()
  const s = await Session.open(store, { now: () => SATURDAY_NOON })
  logHeader(s, { model: 'm', baseURL: 'u', prices: FLASH })
  s.append('turn/start', { turn: 1 })
  s.append('user/message', { message: { role: 'user', content: 'go' }, surfaceOp: { op: 'append' } })
  s.append('step/start', { turn: 1, step: 1 })
  s.append('request/error', { code: 'TRANSPORT', message: 'cut', trigger: 'conversation',
    spent: { inputTokens: 1_000, modelledHitTokens: 0, outputTokens: 100_000 } })
  s.append('assistant/message', { message: { role: 'assistant', content: [{ type: 'text', text: 'partial' }], interrupted: true },
    finishReason: 'error', surfaceOp: { op: 'append' } })
  s.append('step/end', { turn: 1, step: 1 })
  // A request/error as older logs have it (no spent): nothing counted for it; its partial counts as before.
  s.append('step/start', { turn: 1, step: 2 })
  s.append('request/error', { code: 'TRANSPORT', message: 'cut', trigger: 'conversation' })
  s.append('assistant/message', { message: { role: 'assistant', content: [{ type: 'text', text: 'again' }], interrupted: true },
    finishReason: 'error', surfaceOp: { op: 'append' } })
  s.append('step/end', { turn: 1, step: 2 })
  assert.throws(() => s.append('request/error', { code: 'X', message: 'm', spent: { inputTokens: 1, modelledHitTokens: 0 } as any }),
    (e: unknown) => e instanceof SessionError && e.code === 'INVALID_EVENT' && /request\/error: spent\[0\] must be/.test(e.message))
  await s.sync()
  const partialTokens = estimateMessageTokens({ role: 'assistant', content: [{ type: 'text', text: 'again' }] })
  for (const session of [s, await Session.open(store, { now: () => SATURDAY_NOON })]) {
    const floor = CostLedger.of(session).spendFloor()
    assert.equal(CostLedger.of(session).usage().conversation.requests, 2)
    assert.equal(floor.conversationOutputTokens, 100_000 + partialTokens)
    // No usage reported: the floor is the ledger's cost, the failed request's 1,000 input tokens at the miss price
    // and 100,000 output tokens ($0.06015) plus the second partial's request (a few tokens).
    assert.ok(Math.abs(floor.costUSD - CostLedger.of(session).usage().conversation.costUSD!) < 1e-12)
    assert.ok(floor.costUSD > 0.06015 && floor.costUSD < 0.0602, `${floor.costUSD}`)
  }
})

test('a summary request cut after output is counted: it is in its compaction/end {requests} with the output received', async () => {
  const session = await Session.open(new MemoryStore())
  for (let i = 0; i < 30; i++) {
    session.append('turn/start', { turn: i + 1 })
    session.append('user/message', { message: { role: 'user', content: `q${i} ${'u'.repeat(4_000)}` }, surfaceOp: { op: 'append' } })
    session.append('assistant/message', { message: { role: 'assistant', content: [{ type: 'text', text: `a${i} ${'v'.repeat(4_000)}` }] },
      finishReason: 'stop', surfaceOp: { op: 'append' } })
    session.append('turn/end', { turn: i + 1, reason: 'stop' })
  }
  const text = 's'.repeat(4_000)
  const done = [{ choices: [{ index: 0, delta: { content: 'done' } }] }, { choices: [{ index: 0, delta: {}, finish_reason: 'stop' }] }]
  const provider = tuned({ maxRetries: 0 }, () => openAICompatible({ baseURL: 'http://127.0.0.1:9', model: 'm', apiKey: 'k',
    contextWindow: 70_000, prices: FLASH, fetch: async () => sseResponse(done, false) }))
  const summarizer = tuned({ maxRetries: 0 }, () => openAICompatible({ baseURL: 'http://127.0.0.1:9', model: 'sum', apiKey: 'k',
    contextWindow: 1_000_000, prices: FLASH, fetch: async () => sseResponse([{ choices: [{ index: 0, delta: { content: text } }] }], true) }))
  await new Agent({ session, provider, summarizer, maxCostUSD: { session: 10 } }).run('go on')
  const end = session.events.find((e) => e.type === 'compaction/end') as SessionEvent<'compaction/end'>
  assert.match(end.data.error ?? '', /connection reset/)
  assert.equal(end.data.requests?.length, 1)
  const received = estimateMessageTokens({ role: 'assistant', content: [{ type: 'text', text }] })
  assert.deepEqual([end.data.requests![0].model, end.data.requests![0].outputTokens, end.data.requests![0].prices], ['sum', received, FLASH])
  // Each failed compaction (here at the turn's start and after its step) counted its one request.
  const ends = session.events.filter((e) => e.type === 'compaction/end')
  assert.equal(ends.length, 2)
  assert.equal(CostLedger.of(session).usage().summary.requests, 2)
  assert.equal(CostLedger.of(session).spendFloor().summaryOutputTokens, 2 * received)
})

test('an attempt the adapter retried after an empty 200 is a request that cost: logged as request/error {trigger: retry, spent}', async () => {
  const done = [{ choices: [{ index: 0, delta: { content: 'done' } }] }, { choices: [{ index: 0, delta: {}, finish_reason: 'stop' }] }]
  let calls = 0
  const provider = tuned({ maxRetries: 2, sleep: async () => {} }, () => openAICompatible({ baseURL: 'http://127.0.0.1:9',
    model: 'm', apiKey: 'k', contextWindow: 100_000, prices: FLASH, fetch: async () => sseResponse(calls++ < 2 ? [] : done, false) }))
  const session = await Session.open(new MemoryStore())
  const r = await new Agent({ session, provider, maxCostUSD: 1 }).run('hello')
  assert.deepEqual([r.reason, r.text, calls], ['stop', 'done', 3])
  const errors = session.events.filter((e) => e.type === 'request/error') as SessionEvent<'request/error'>[]
  assert.deepEqual(errors.map((e) => [e.data.code, e.data.status, e.data.trigger, e.data.spent?.outputTokens]),
    [['EMPTY_RESPONSE', 200, 'retry', 0], ['EMPTY_RESPONSE', 200, 'retry', 0]])
  // The two empty attempts and the answer: three requests of the same input.
  const usage = CostLedger.of(session).usage().conversation
  assert.equal(usage.requests, 3)
  assert.equal(usage.inputTokens, 3 * errors[0].data.spent!.inputTokens)
})
