// anthropic(): the Anthropic Messages adapter over a recorded-wire fake (docs/design.md §6). The
// streams below are the event sequences of Anthropic's Messages streaming documentation
// (docs.anthropic.com, "Streaming Messages": text, tool_use with input_json_delta, thinking with
// signature_delta, ping, error) with cache fields in usage, replayed byte for byte by a fetch.
import { test } from 'node:test'
import { tuned, type Tuning } from './tuning.ts'
import assert from 'node:assert/strict'
import {
  Agent, Session, MemoryStore, anthropic, openAICompatible, ProviderError, internals,
  type Message, type StreamEvent, type Tool, type Prices, CostLedger
} from '../dsh.ts'

interface Reply { sse?: string; json?: unknown; status?: number; headers?: Record<string, string> }
interface Sent { url: string; headers: Record<string, string>; body: any }

/** A fetch that answers each call with the next scripted reply and records what was sent. */
function wire(script: Reply[]) {
  const sent: Sent[] = []
  let i = 0
  const fetch = async (url: string, init: RequestInit): Promise<Response> => {
    sent.push({ url, headers: Object.fromEntries(new Headers(init.headers).entries()), body: JSON.parse(String(init.body)) })
    const r = script[Math.min(i++, script.length - 1)]
    if (r.sse !== undefined) return new Response(r.sse, { status: r.status ?? 200, headers: { 'content-type': 'text/event-stream', ...r.headers } })
    return new Response(JSON.stringify(r.json), { status: r.status ?? 200, headers: { 'content-type': 'application/json', ...r.headers } })
  }
  return { fetch, sent }
}

/** SSE text of Anthropic events: each `[name, data]` as `event: name` + `data: JSON` + a blank line. */
const sse = (events: [string, unknown][]) => events.map(([name, data]) => `event: ${name}\ndata: ${JSON.stringify(data)}\n\n`).join('')
const start = (usage: Record<string, number>) => ['message_start', { type: 'message_start', message: { id: 'msg_01', type: 'message', role: 'assistant', content: [], model: 'claude-x', stop_reason: null, stop_sequence: null, usage } }] as [string, unknown]
const block = (index: number, content_block: unknown) => ['content_block_start', { type: 'content_block_start', index, content_block }] as [string, unknown]
const delta = (index: number, d: unknown) => ['content_block_delta', { type: 'content_block_delta', index, delta: d }] as [string, unknown]
const stop = (index: number) => ['content_block_stop', { type: 'content_block_stop', index }] as [string, unknown]
const end = (stop_reason: string, output_tokens: number) => [
  ['message_delta', { type: 'message_delta', delta: { stop_reason, stop_sequence: null }, usage: { output_tokens } }],
  ['message_stop', { type: 'message_stop' }],
] as [string, unknown][]
/** A streamed text answer. */
const textReply = (text: string, usage = { input_tokens: 10, output_tokens: 1 }): Reply => ({
  sse: sse([start(usage), block(0, { type: 'text', text: '' }), ['ping', { type: 'ping' }], delta(0, { type: 'text_delta', text }), stop(0), ...end('end_turn', 5)]),
})
const toolReply = (id: string, name: string, args: string): Reply => ({
  sse: sse([start({ input_tokens: 10, output_tokens: 1 }), block(0, { type: 'tool_use', id, name, input: {} }),
    delta(0, { type: 'input_json_delta', partial_json: '' }), delta(0, { type: 'input_json_delta', partial_json: args.slice(0, 5) }),
    delta(0, { type: 'input_json_delta', partial_json: args.slice(5) }), stop(0), ...end('tool_use', 7)]),
})

const HI: Message[] = [{ role: 'user', content: 'hi' }]
const quick = { maxRetries: 2, retryBaseMs: 1, retryMaxMs: 1 }
const provider = (w: ReturnType<typeof wire>, extra: Record<string, unknown> = {}, tuning: Tuning = {}) => tuned({ ...quick, ...tuning }, () =>
  anthropic({ baseURL: 'http://127.0.0.1:9', model: 'claude-x', apiKey: 'sk-ant-test', contextWindow: 200_000, fetch: w.fetch, ...extra }))
async function failure(p: Promise<unknown>): Promise<ProviderError> {
  try { await p } catch (e) { if (e instanceof ProviderError) return e; throw e }
  throw new Error('expected a ProviderError')
}

test('a streamed answer: thinking (with its signature), text and a tool call in position; usage with cache writes and reads', async () => {
  const w = wire([{
    sse: sse([
      start({ input_tokens: 12, cache_creation_input_tokens: 2_000, cache_read_input_tokens: 30_000, output_tokens: 1 }),
      block(0, { type: 'thinking', thinking: '', signature: '' }),
      delta(0, { type: 'thinking_delta', thinking: 'Let me check ' }), delta(0, { type: 'thinking_delta', thinking: 'the weather.' }),
      delta(0, { type: 'signature_delta', signature: 'EqQBCgIYAhIM' }), stop(0),
      block(1, { type: 'text', text: '' }), delta(1, { type: 'text_delta', text: 'Checking ' }), delta(1, { type: 'text_delta', text: 'Paris.' }), stop(1),
      ['ping', { type: 'ping' }],
      block(2, { type: 'tool_use', id: 'toolu_01', name: 'get_weather', input: {} }),
      delta(2, { type: 'input_json_delta', partial_json: '{"city": ' }), delta(2, { type: 'input_json_delta', partial_json: '"Paris"}' }), stop(2),
      ['message_delta', { type: 'message_delta', delta: { stop_reason: 'tool_use', stop_sequence: null }, usage: { output_tokens: 89 } }],
      ['message_stop', { type: 'message_stop' }],
    ]),
    headers: { 'request-id': 'req_01' },
  }])
  const events: StreamEvent[] = []
  const r = await provider(w).complete({
    system: 'Be brief.', tools: [{ name: 'get_weather', description: 'Weather', parameters: { type: 'object', properties: { city: { type: 'string' } } } }],
    messages: HI, maxTokens: 1_000, onEvent: (e) => events.push(e),
  })
  assert.deepEqual(r.message.content, [
    { type: 'reasoning', text: 'Let me check the weather.', signature: 'EqQBCgIYAhIM' },
    { type: 'text', text: 'Checking Paris.' },
    { type: 'tool-call', id: 'toolu_01', name: 'get_weather', arguments: '{"city": "Paris"}' },
  ])
  assert.equal(r.finishReason, 'tool_calls')
  assert.deepEqual(r.usage, { promptTokens: 32_012, completionTokens: 89, cachedTokens: 30_000, cacheWriteTokens: 2_000 })
  assert.equal(r.requestId, 'req_01')
  assert.deepEqual(events.map((e) => e.type), ['reasoning-delta', 'reasoning-delta', 'text-delta', 'text-delta',
    'tool-call-delta', 'tool-call-delta', 'tool-call-delta', 'usage', 'finish'])
  // The request: its own path, headers and shape.
  const [req] = w.sent
  assert.equal(req.url, 'http://127.0.0.1:9/v1/messages')
  assert.equal(req.headers['x-api-key'], 'sk-ant-test')
  assert.equal(req.headers['anthropic-version'], '2023-06-01')
  assert.equal(req.headers.authorization, undefined)
  assert.deepEqual(Object.keys(req.body), ['model', 'tools', 'system', 'messages', 'stream', 'max_tokens'])
  assert.deepEqual(req.body.system, [{ type: 'text', text: 'Be brief.', cache_control: { type: 'ephemeral' } }])
  assert.deepEqual(req.body.tools, [{ name: 'get_weather', description: 'Weather', input_schema: { type: 'object', properties: { city: { type: 'string' } } } }])
  assert.deepEqual(req.body.messages, [{ role: 'user', content: [{ type: 'text', text: 'hi', cache_control: { type: 'ephemeral' } }] }])
  assert.equal(req.body.max_tokens, 1_000)
  assert.equal(req.body.stream, true)
})

test('a history with tool_use / tool_result (an image in a result as an image block), thinking only with its signature', async () => {
  const w = wire([textReply('done')])
  const png = 'iVBORw0KGgo='
  await provider(w).complete({
    messages: [
      { role: 'user', content: 'look at both' },
      { role: 'assistant', content: [{ type: 'reasoning', text: 'unsigned, from another provider' }, { type: 'reasoning', text: 'mine', signature: 'sig' },
        { type: 'text', text: '' }, { type: 'tool-call', id: 'a', name: 'shot', arguments: '{"n":1}' }, { type: 'tool-call', id: 'b', name: 'shot', arguments: '' }] },
      { role: 'tool', toolCallId: 'b', content: [{ type: 'text', text: 'second' }], isError: true },
      { role: 'tool', toolCallId: 'a', content: [{ type: 'text', text: 'first' }, { type: 'image', mimeType: 'image/png', data: png }] },
      { role: 'user', content: 'and?' },
    ],
  })
  const messages = w.sent[0].body.messages
  assert.deepEqual(messages, [
    { role: 'user', content: [{ type: 'text', text: 'look at both' }] },
    { role: 'assistant', content: [{ type: 'thinking', thinking: 'mine', signature: 'sig' },
      { type: 'tool_use', id: 'a', name: 'shot', input: { n: 1 } }, { type: 'tool_use', id: 'b', name: 'shot', input: {} }] },
    { role: 'user', content: [
      { type: 'tool_result', tool_use_id: 'b', content: [{ type: 'text', text: 'second' }], is_error: true },
      { type: 'tool_result', tool_use_id: 'a', content: [{ type: 'text', text: 'first' }, { type: 'image', source: { type: 'base64', media_type: 'image/png', data: png } }] },
      { type: 'text', text: 'and?', cache_control: { type: 'ephemeral' } },
    ] },
  ])
})

test('cache breakpoints: the stable prefix against the requests sent before, at most 4, a summary request in between does not reset it', async () => {
  const w = wire([textReply('a')])
  const p = provider(w)
  const u = (n: number): Message => ({ role: 'user', content: `user ${n}` })
  const a = (n: number): Message => ({ role: 'assistant', content: [{ type: 'text', text: `answer ${n}` }] })
  const marked = (body: any) => body.messages.flatMap((m: any, i: number) => (m.content.some((b: any) => b.cache_control) ? [i] : []))
  const system = 'You are terse.'
  await p.complete({ system, messages: [u(1)] })
  await p.complete({ system, messages: [u(1), a(1), u(2)] })
  await p.complete({ system: 'Summarise.', messages: [u(1), a(1), u(2), { role: 'user', content: 'summarise all that' }] })
  await p.complete({ system, messages: [u(1), a(1), u(2), a(2), u(3)] })
  await p.complete({ system, messages: [u(1), a(1), u(2), a(2), u(3), a(3), u(4)] })
  // an edit inside the history (a prune or clear of message 3): the marks before it are kept
  await p.complete({ system, messages: [u(1), a(1), u(2), { role: 'assistant', content: [{ type: 'text', text: '[cleared]' }] }, u(3), a(3), u(4), a(4), u(5)] })
  const marks = w.sent.map((s) => marked(s.body))
  assert.deepEqual(marks, [[0], [0, 2], [2], [0, 2, 4], [2, 4, 6], [2, 8]]) // the summary's last two user turns are one
  for (const s of w.sent) {
    const n = s.body.messages.flatMap((m: any) => m.content).filter((b: any) => b.cache_control).length + s.body.system.filter((b: any) => b.cache_control).length
    assert.ok(n <= 4, `${n} breakpoints`)
  }
  // with tools and no system, the envelope's breakpoint is on the last tool
  await p.complete({ tools: [{ name: 't1' }, { name: 't2' }], messages: [u(1)] })
  assert.deepEqual(w.sent.at(-1)!.body.tools.map((t: any) => t.cache_control), [undefined, { type: 'ephemeral' }])
})

test('overloaded_error (HTTP 529 or inside the stream before any output) is retried; after output it is not', async () => {
  const overloaded = { type: 'error', error: { type: 'overloaded_error', message: 'Overloaded' } }
  const w = wire([
    { status: 529, json: overloaded },
    { sse: sse([['error', overloaded]]) },
    textReply('fine'),
  ])
  const events: StreamEvent[] = []
  const r = await provider(w).complete({ messages: HI, onEvent: (e) => events.push(e) })
  assert.equal(r.message.content[0].type, 'text')
  assert.equal(w.sent.length, 3)
  assert.deepEqual(events.filter((e) => e.type === 'retry').map((e) => (e as { error: ProviderError }).error.code), ['SERVER', 'SERVER'])
  const after = wire([{ sse: sse([start({ input_tokens: 3, output_tokens: 1 }), block(0, { type: 'text', text: '' }), delta(0, { type: 'text_delta', text: 'half' }), ['error', overloaded]]) }])
  const err = await failure(provider(after).complete({ messages: HI }))
  assert.equal(err.code, 'SERVER')
  assert.match(err.message, /Overloaded/)
  assert.deepEqual(err.partial, { role: 'assistant', content: [{ type: 'text', text: 'half' }], interrupted: true })
  assert.equal(after.sent.length, 1)
})

test('"prompt is too long: N tokens > M maximum" is CONTEXT_WINDOW_EXCEEDED with both numbers; a 401 is AUTH, not retried', async () => {
  const body = { type: 'error', error: { type: 'invalid_request_error', message: 'prompt is too long: 208310 tokens > 200000 maximum' } }
  const w = wire([{ status: 400, json: body }])
  const err = await failure(provider(w).complete({ messages: HI }))
  assert.equal(err.code, 'CONTEXT_WINDOW_EXCEEDED')
  assert.equal(err.status, 400)
  assert.deepEqual(internals.overflowCounts(err.body), { promptTokens: 208_310, contextTokens: 200_000 })
  assert.equal(w.sent.length, 1)
  const auth = wire([{ status: 401, json: { type: 'error', error: { type: 'authentication_error', message: 'invalid x-api-key' } } }])
  assert.equal((await failure(provider(auth).complete({ messages: HI }))).code, 'AUTH')
  assert.equal(auth.sent.length, 1)
})

test('a non-streamed answer (a server that ignores stream: true) is read like a stream', async () => {
  const w = wire([{ json: { id: 'msg_2', type: 'message', role: 'assistant', model: 'claude-x', stop_reason: 'max_tokens',
    content: [{ type: 'text', text: 'cut' }, { type: 'tool_use', id: 'toolu_9', name: 'f', input: { a: [1] } }],
    usage: { input_tokens: 5, cache_read_input_tokens: 7, output_tokens: 2 } } }])
  const r = await provider(w).complete({ messages: HI })
  assert.deepEqual(r.message.content, [{ type: 'text', text: 'cut' }, { type: 'tool-call', id: 'toolu_9', name: 'f', arguments: '{"a":[1]}' }])
  assert.equal(r.finishReason, 'length')
  assert.deepEqual(r.usage, { promptTokens: 12, completionTokens: 2, cachedTokens: 7 })
})

test('countTokens posts the request to /v1/messages/count_tokens (no budget, no stream, no breakpoints)', async () => {
  const w = wire([{ json: { input_tokens: 1_234 } }, { status: 400, json: { type: 'error', error: { type: 'invalid_request_error', message: 'messages: field required' } } }])
  const p = provider(w, { extraBody: { temperature: 0 } })
  assert.equal(await p.countTokens!({ system: 'S', messages: HI }), 1_234)
  assert.equal(w.sent[0].url, 'http://127.0.0.1:9/v1/messages/count_tokens')
  assert.deepEqual(w.sent[0].body, { model: 'claude-x', system: [{ type: 'text', text: 'S' }], messages: [{ role: 'user', content: [{ type: 'text', text: 'hi' }] }] })
  assert.equal((await failure(p.countTokens!({ messages: HI }))).code, 'INVALID_REQUEST')
  assert.equal(openAICompatible({ baseURL: 'http://x', model: 'm' }).countTokens, undefined)
})

test('options: the key goes only where it is meant to; chat-completions options are refused', async () => {
  const saved = process.env.ANTHROPIC_API_KEY
  try {
    delete process.env.ANTHROPIC_API_KEY
    assert.throws(() => anthropic({ model: 'claude-x' }), /ANTHROPIC_API_KEY is not set/)
    process.env.ANTHROPIC_API_KEY = 'sk-ant-env'
    assert.equal(anthropic({ model: 'claude-x' }).baseURL, 'https://api.anthropic.com')
    // another host: $ANTHROPIC_API_KEY is not read (a local server needs no key)
    const w = wire([textReply('x')])
    await anthropic({ baseURL: 'http://127.0.0.1:9', model: 'm', fetch: w.fetch }).complete({ messages: HI })
    assert.equal(w.sent[0].headers['x-api-key'], undefined)
    assert.equal(w.sent[0].headers['anthropic-version'], '2023-06-01')
    // Anthropic's host over http: the key read from the environment is never sent in clear, on any port
    for (const baseURL of ['http://api.anthropic.com', 'http://api.anthropic.com:8080']) {
      const clear = wire([textReply('x')])
      assert.throws(() => anthropic({ baseURL, model: 'm', fetch: clear.fetch }), new TypeError(`anthropic: baseURL `
        + `"${baseURL}" would send the API key unencrypted; use https://${new URL(baseURL).host} ($ANTHROPIC_API_KEY `
        + 'goes only over https)'))
      assert.equal(clear.sent.length, 0)
    }
  } finally {
    if (saved === undefined) delete process.env.ANTHROPIC_API_KEY
    else process.env.ANTHROPIC_API_KEY = saved
  }
  assert.throws(() => anthropic({ model: 'm', apiKey: 'k', thinking: true } as never), /unknown option "thinking"/)
})

test('cost: Anthropic\'s price shape (cache write 1.25 ×, read 0.1 × input) from reported usage', async () => {
  const prices: Prices = { cacheMissInput: 3, cacheWriteInput: 3.75, cacheHitInput: 0.3, output: 15 }
  // 1,000,000 prompt tokens: 100,000 uncached, 200,000 written, 700,000 read; 10,000 out
  const usd = internals.requestCostUSD(prices, { cachedInputTokens: 700_000, uncachedInputTokens: 300_000, cacheWriteInputTokens: 200_000, outputTokens: 10_000 }, 0)
  assert.ok(Math.abs(usd - (0.1 * 3 + 0.2 * 3.75 + 0.7 * 0.3 + 0.01 * 15)) < 1e-9, String(usd))
  // the net-cost gate: a token moved out of the cache is written again, at the write price
  assert.ok(Math.abs(internals.cacheCostUSD(prices, 1_000_000) - 3.45) < 1e-9)
  // through a session: the reported usage is billed in that shape
  const w = wire([{ sse: sse([start({ input_tokens: 100_000, cache_creation_input_tokens: 200_000, cache_read_input_tokens: 700_000, output_tokens: 1 }),
    block(0, { type: 'text', text: '' }), delta(0, { type: 'text_delta', text: 'ok' }), stop(0), ...end('end_turn', 10_000)]) }])
  const session = await Session.open(new MemoryStore())
  await new Agent({ session, provider: provider(w, { prices, contextWindow: 2_000_000 }) }).run('go')
  const cost = CostLedger.of(session).usage()
  assert.ok(Math.abs((cost.costUSD ?? NaN) - usd) < 1e-9, `${cost.costUSD} vs ${usd}`)
})

// ── Done when: one scripted session through anthropic() and through openAICompatible() ──

/** The OpenAI chat-completions stream of the same answers. */
const chunk = (delta: unknown, finish: string | null = null, usage?: unknown) => `data: ${JSON.stringify({ id: 'c', choices: [{ index: 0, delta, finish_reason: finish }], ...(usage ? { usage } : {}) })}\n\n`
const oaText = (text: string): Reply => ({ sse: chunk({ content: text }) + chunk({}, 'stop', { prompt_tokens: 10, completion_tokens: 5 }) + 'data: [DONE]\n\n' })
const oaTool = (id: string, name: string, args: string): Reply => ({
  sse: chunk({ tool_calls: [{ index: 0, id, type: 'function', function: { name, arguments: args.slice(0, 5) } }] })
    + chunk({ tool_calls: [{ index: 0, function: { arguments: args.slice(5) } }] }) + chunk({}, 'tool_calls', { prompt_tokens: 10, completion_tokens: 7 }) + 'data: [DONE]\n\n',
})

test('one scripted session through anthropic() and openAICompatible() leaves the same surface and log, apart from provider fields', async () => {
  const echo: Tool = { name: 'echo', description: 'Echo', parameters: { type: 'object', properties: { say: { type: 'string' } } }, execute: (a: { say: string }) => `echo: ${a.say}` }
  const run = async (p: ReturnType<typeof anthropic>) => {
    const session = await Session.open(new MemoryStore())
    const agent = new Agent({ session, provider: p, tools: [echo], system: 'Be brief.' })
    await agent.run('say hi')
    await agent.run('again')
    return session
  }
  const aw = wire([toolReply('call_1', 'echo', '{"say":"hi"}'), textReply('said hi', { input_tokens: 10, output_tokens: 1 }), textReply('again done')])
  const ow = wire([oaTool('call_1', 'echo', '{"say":"hi"}'), oaText('said hi'), oaText('again done')])
  const a = await run(provider(aw, {}, { maxRetries: 0 }))
  const o = await run(tuned({ maxRetries: 0 }, () => openAICompatible({ baseURL: 'http://127.0.0.1:9', model: 'claude-x', apiKey: 'k', contextWindow: 200_000, fetch: ow.fetch })))
  assert.deepEqual(a.surface(), o.surface())
  const PROVIDER_FIELDS = new Set(['baseURL', 'requestId', 'time'])
  const strip = (v: unknown): unknown => Array.isArray(v) ? v.map(strip) : v && typeof v === 'object'
    ? Object.fromEntries(Object.entries(v).filter(([k]) => !PROVIDER_FIELDS.has(k)).map(([k, x]) => [k, strip(x)])) : v
  const log = (s: Session) => s.events.map((e) => (e.type === 'session/start' ? { ...e, data: { ...e.data, id: 'the random session id' } } : e))
  assert.deepEqual(strip(log(a)), strip(log(o)))
  assert.equal(a.events.length, o.events.length)
  assert.ok(a.events.length > 8)
})

test('hostile server fields stay data: a stop_reason named like an object property is a plain string; an absurd count_tokens answer is refused', async () => {
  for (const reason of ['constructor', 'toString', '__proto__', 'hasOwnProperty']) {
    const w = wire([{ sse: sse([start({ input_tokens: 10, output_tokens: 1 }), block(0, { type: 'text', text: '' }), delta(0, { type: 'text_delta', text: 'hi' }), stop(0), ...end(reason, 5)]) }])
    const r = await provider(w).complete({ messages: HI })
    assert.equal(r.finishReason, reason, `stop_reason ${reason}`)
  }
  // Token counts are integers from 0 to 1,000,000,000, as everywhere else usage is read.
  for (const bad of [1e308, 0.5, -1, 1e10]) {
    const w = wire([{ json: { input_tokens: bad } }])
    assert.equal((await failure(provider(w).countTokens!({ messages: HI }))).code, 'MALFORMED_RESPONSE', `input_tokens ${bad}`)
  }
})

test('a server tool block (server_tool_use, mcp_tool_use) streams its input_json_delta: it stays the block it is, no nameless call of ours is made from it', async () => {
  // Anthropic's web search stream (docs.anthropic.com, "Web search tool", streaming): the server's own tool call.
  const w = wire([{ sse: sse([start({ input_tokens: 10, output_tokens: 1 }),
    block(0, { type: 'text', text: '' }), delta(0, { type: 'text_delta', text: 'Let me look.' }), stop(0),
    block(1, { type: 'server_tool_use', id: 'srvtoolu_01', name: 'web_search', input: {} }),
    delta(1, { type: 'input_json_delta', partial_json: '{"query": "weather' }), delta(1, { type: 'input_json_delta', partial_json: ' NYC"}' }), stop(1),
    block(2, { type: 'web_search_tool_result', tool_use_id: 'srvtoolu_01', content: [] }), stop(2),
    block(3, { type: 'tool_use', id: 'toolu_01', name: 'read_file', input: {} }), delta(3, { type: 'input_json_delta', partial_json: '{"path":"a"}' }), stop(3),
    ...end('tool_use', 9)]) }])
  const r = await provider(w).complete({ messages: HI })
  assert.deepEqual(r.message.content.map((b) => b.type), ['text', 'server_tool_use', 'web_search_tool_result', 'tool-call'])
  assert.deepEqual(r.message.content[3], { type: 'tool-call', id: 'toolu_01', name: 'read_file', arguments: '{"path":"a"}' })
  // the server's query, streamed, is the kept block's input (sent back as the model wrote it, not as {})
  assert.deepEqual(r.message.content[1], { type: 'server_tool_use', id: 'srvtoolu_01', name: 'web_search', input: { query: 'weather NYC' } })
})
