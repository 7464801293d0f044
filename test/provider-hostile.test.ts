// The adapters (openAICompatible, anthropic) against a broken or hostile server (docs/design.md §6, §13), from a review
// of round 4, each against a local node:http server: JSON nested past the stack, a fetch that ignores the signal, an
// answer whose connection stays open, tool calls without ids or interleaved on one index. Tests that failed before
// their fix, and ones that held (marked "holds"), which keep it so.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http'
import type { AddressInfo } from 'node:net'
import {
  openAICompatible, anthropic, ProviderError, Agent, Session, MemoryStore, type Message,
} from '../dsh.ts'
import { tuned, type Tuning } from './tuning.ts'

const KEY = 'sk-test-0123456789abcdef'
const HI: Message[] = [{ role: 'user', content: 'hi' }]

type Handler = (req: IncomingMessage, res: ServerResponse, n: number, body: string) => void
interface Srv { url: string; hits: number; bodies: string[]; headers: IncomingMessage['headers'][]; close(): Promise<void> }

async function serve(handler: Handler): Promise<Srv> {
  const s: Srv = { url: '', hits: 0, bodies: [], headers: [], close: async () => {} }
  const server = createServer((req, res) => {
    let body = ''
    req.on('data', (c) => { body += c })
    req.on('end', () => {
      const n = s.hits++
      s.bodies.push(body); s.headers.push(req.headers)
      try { handler(req, res, n, body) } catch { res.destroy() }
    })
  })
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r))
  s.url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`
  s.close = () => new Promise((r) => { server.closeAllConnections(); server.close(() => r()) })
  return s
}

const sse = (res: ServerResponse, events: unknown[], done = true) => {
  res.writeHead(200, { 'content-type': 'text/event-stream' })
  for (const e of events) res.write(`data: ${typeof e === 'string' ? e : JSON.stringify(e)}\n\n`)
  if (done) res.write('data: [DONE]\n\n')
  res.end()
}
const fast: Tuning = { sleep: async () => {}, retryBaseMs: 1, retryMaxMs: 5 }
const oa = (url: string, t: Tuning = fast) => tuned(t, () => openAICompatible({ baseURL: url, model: 'm', apiKey: KEY }))
const an = (url: string, t: Tuning = fast) => tuned(t, () => anthropic({ baseURL: url, model: 'claude-x', apiKey: KEY }))

async function failure(p: Promise<unknown>): Promise<ProviderError> {
  try { await p } catch (e) { return e as ProviderError }
  assert.fail('expected a failure')
}

/** `{"a":{"a":…1…}}` nested `depth` deep: JSON.parse takes it, JSON.stringify overflows the stack. */
const deepObject = (depth: number) => '{"a":'.repeat(depth) + '1' + '}'.repeat(depth)

// ── 1. Deeply nested JSON inside a chunk ────────────────────────────────────────────────
test('B1 openAI: tool-call arguments sent as a deeply nested object are a typed, non-retried error (not TRANSPORT x6)', async () => {
  const srv = await serve((_q, res) => {
    res.writeHead(200, { 'content-type': 'text/event-stream' })
    res.write(`data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"c1","type":"function","function":{"name":"f","arguments":${deepObject(100_000)}}}]}}]}\n\n`)
    res.write('data: {"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}\n\ndata: [DONE]\n\n')
    res.end()
  })
  try {
    const e = await failure(oa(srv.url).complete({ messages: HI }))
    assert.ok(e instanceof ProviderError, `a ProviderError, got ${e}`)
    // A deterministic bad payload: the same bytes come back on every retry, each one a billed completion.
    assert.equal(e.code, 'MALFORMED_RESPONSE', e.message)
    assert.equal(srv.hits, 1, 'not retried')
  } finally { await srv.close() }
})

for (const [name, block, stop] of [
  ['B2 anthropic: a tool_use block whose input is deeply nested', `{"type":"tool_use","id":"t","name":"f","input":${deepObject(100_000)}}`, 'tool_use'],
  ['B3 anthropic: an unknown content block nested deeply', `{"type":"server_thing","x":${deepObject(100_000)}}`, 'end_turn'],
]) {
  test(`${name} is a typed, non-retried error (not TRANSPORT x6)`, async () => {
    const srv = await serve((_q, res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' })
      res.write('event: message_start\ndata: {"type":"message_start","message":{"id":"m","usage":{"input_tokens":5}}}\n\n')
      res.write(`event: content_block_start\ndata: {"type":"content_block_start","index":0,"content_block":${block}}\n\n`)
      res.write(`event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":"${stop}"},"usage":{"output_tokens":3}}\n\n`)
      res.write('event: message_stop\ndata: {"type":"message_stop"}\n\n')
      res.end()
    })
    try {
      const e = await failure(an(srv.url).complete({ messages: HI }))
      assert.ok(e instanceof ProviderError)
      assert.equal(e.code, 'MALFORMED_RESPONSE', e.message)
      assert.equal(srv.hits, 1, 'not retried')
    } finally { await srv.close() }
  })
}

// ── 2. A moderately deep block (stringifies, but cannot be cloned) poisons the session ──
const anthropicTurn = (res: ServerResponse, block: string) => {
  res.writeHead(200, { 'content-type': 'text/event-stream' })
  res.write('event: message_start\ndata: {"type":"message_start","message":{"id":"m","usage":{"input_tokens":5}}}\n\n')
  res.write(`event: content_block_start\ndata: {"type":"content_block_start","index":0,"content_block":${block}}\n\n`)
  res.write('event: content_block_stop\ndata: {"type":"content_block_stop","index":0}\n\n')
  res.write('event: content_block_start\ndata: {"type":"content_block_start","index":1,"content_block":{"type":"text","text":""}}\n\n')
  res.write('event: content_block_delta\ndata: {"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":"ok"}}\n\n')
  res.write('event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":3}}\n\n')
  res.write('event: message_stop\ndata: {"type":"message_stop"}\n\n')
  res.end()
}

test('B4 anthropic: a server block nested 3,000 deep, once kept, does not break every later turn of the session', async () => {
  const srv = await serve((_q, res, n) => anthropicTurn(res, n === 0
    ? `{"type":"server_thing","x":${deepObject(3_000)}}` : '{"type":"text","text":"fine"}'))
  try {
    const session = await Session.open(new MemoryStore())
    const agent = new Agent({ session, provider: an(srv.url) })
    agent.on('agent/request', () => {}) // any request hook: the Agent hands it a structuredClone of the messages
    const first = await agent.run('one').catch((e) => e)
    const second = await agent.run('two').catch((e) => e)
    assert.ok(!(second instanceof Error), `turn 2 threw: ${String((second as Error)?.message).slice(0, 200)}`)
    assert.notEqual((second as { reason?: string }).reason, 'error', `turn 2 failed: ${JSON.stringify(second).slice(0, 300)}`)
    void first
  } finally { await srv.close() }
})

// ── 3. Redirects, abort, countTokens ───────────────────────────────────────────────────
test('B5 anthropic: a 307 to another origin does not carry x-api-key there (holds)', async () => {
  const evil = await serve((_q, res) => { res.writeHead(200); res.end('{}') })
  const srv = await serve((_q, res) => { res.writeHead(307, { location: `${evil.url}/v1/messages` }); res.end() })
  try {
    const e = await failure(an(srv.url).complete({ messages: HI }))
    assert.equal(e.code, 'INVALID_REQUEST')
    const e2 = await failure(an(srv.url).countTokens!({ messages: HI }))
    assert.equal(e2.code, 'INVALID_REQUEST')
    assert.equal(evil.hits, 0)
  } finally { await srv.close(); await evil.close() }
})

test('B6 a fetch option that ignores the signal (a proxying fetch): abort still settles complete() at once', async () => {
  // The server never sends headers; the caller's fetch (a proxy wrapper) does not forward the signal.
  const srv = await serve(() => {})
  const proxyFetch = (input: string, init: RequestInit) => globalThis.fetch(input, { ...init, signal: undefined })
  try {
    const provider = tuned(fast, () => openAICompatible({ baseURL: srv.url, model: 'm', apiKey: KEY, fetch: proxyFetch }))
    const ac = new AbortController()
    const started = Date.now()
    setTimeout(() => ac.abort(), 50)
    const outcome = await Promise.race([
      provider.complete({ messages: HI, signal: ac.signal }).then(() => 'resolved', (e) => (e as ProviderError).code),
      new Promise((r) => setTimeout(() => r('still pending after 2 s'), 2_000)),
    ])
    assert.equal(outcome, 'ABORTED', `after ${Date.now() - started} ms`)
  } finally { await srv.close() }
})

test('B7 a fetch option that ignores the signal: the idle timeout still ends an attempt whose headers never come', async () => {
  const srv = await serve(() => {})
  const proxyFetch = (input: string, init: RequestInit) => globalThis.fetch(input, { ...init, signal: undefined })
  try {
    const provider = tuned({ ...fast, idleTimeoutMs: 200, maxRetries: 0 },
      () => openAICompatible({ baseURL: srv.url, model: 'm', apiKey: KEY, fetch: proxyFetch }))
    const outcome = await Promise.race([
      provider.complete({ messages: HI }).then(() => 'resolved', (e) => (e as ProviderError).code),
      new Promise((r) => setTimeout(() => r('still pending after 3 s'), 3_000)),
    ])
    assert.equal(outcome, 'TIMEOUT')
  } finally { await srv.close() }
})

test('B8 anthropic countTokens: an abort while the server sits on the request settles at once with ABORTED (holds)', async () => {
  const srv = await serve(() => {})
  try {
    const ac = new AbortController()
    setTimeout(() => ac.abort(), 50)
    const t = Date.now()
    const e = await failure(an(srv.url).countTokens!({ messages: HI, signal: ac.signal }))
    assert.equal(e.code, 'ABORTED')
    assert.ok(Date.now() - t < 1_000)
  } finally { await srv.close() }
})

// ── 4. Tool-call assembly ────────────────────────────────────────────────────────────
test('B9 openAI: two calls interleaved on index 0, each delta carrying its id, assemble into two whole calls', async () => {
  const d = (id: string, name: string | undefined, args: string) => ({ choices: [{ index: 0, delta: { tool_calls: [
    { index: 0, id, type: 'function', function: { ...(name ? { name } : {}), arguments: args } }] } }] })
  const srv = await serve((_q, res) => sse(res, [
    d('A', 'f', '{"x"'), d('B', 'g', '{"y"'), d('A', undefined, ':1}'), d('B', undefined, ':2}'),
    { choices: [{ index: 0, delta: {}, finish_reason: 'tool_calls' }] },
  ]))
  try {
    const r = await oa(srv.url).complete({ messages: HI })
    const calls = r.message.content.filter((b) => b.type === 'tool-call') as { id: string; name: string; arguments: string }[]
    assert.deepEqual(calls.map((c) => [c.id, c.name, c.arguments]), [['A', 'f', '{"x":1}'], ['B', 'g', '{"y":2}']])
  } finally { await srv.close() }
})

test('B10 a non-streamed answer (server ignored stream: true) with two tool calls that carry no id keeps two calls', async () => {
  const srv = await serve((_q, res) => {
    res.writeHead(200, { 'content-type': 'application/json' })
    res.end(JSON.stringify({ id: 'x', choices: [{ index: 0, finish_reason: 'tool_calls', message: { role: 'assistant', content: null,
      tool_calls: [{ type: 'function', function: { name: 'f', arguments: '{"a":1}' } },
        { type: 'function', function: { name: 'g', arguments: '{"b":2}' } }] } }], usage: { prompt_tokens: 3, completion_tokens: 4 } }))
  })
  try {
    const r = await oa(srv.url).complete({ messages: HI })
    const calls = r.message.content.filter((b) => b.type === 'tool-call') as { name: string; arguments: string }[]
    assert.deepEqual(calls.map((c) => [c.name, c.arguments]), [['f', '{"a":1}'], ['g', '{"b":2}']])
  } finally { await srv.close() }
})

// ── 5. A whole answer, then the connection is held open ─────────────────────────────────
// B11 (OpenAI) and B12 (Anthropic): the answer and its finish reason arrive, then neither the end marker (`[DONE]`,
// `message_stop`) nor the end of the stream: the relay keeps the socket. The whole answer is returned, not TIMEOUT.
const HELD_OPEN: [string, typeof oa, string[]][] = [
  ['B11 openAI: text, finish_reason and usage arrive', oa, [
    'data: {"choices":[{"index":0,"delta":{"content":"done."}}]}',
    'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":2}}']],
  ['B12 anthropic: message_delta with stop_reason arrives, message_stop never does', an, [
    'event: message_start\ndata: {"type":"message_start","message":{"id":"m","usage":{"input_tokens":5}}}',
    'event: content_block_start\ndata: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":"done."}}',
    'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":3}}']],
]
for (const [name, make, events] of HELD_OPEN) {
  test(`${name}, then the server holds the connection open: the whole answer is returned, not TIMEOUT`, async () => {
    const srv = await serve((_q, res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' })
      for (const e of events) res.write(`${e}\n\n`)
    })
    try {
      const r = await make(srv.url, { ...fast, idleTimeoutMs: 300, maxRetries: 0 }).complete({ messages: HI }).catch((e) => e)
      assert.ok(!(r instanceof Error), `failed: ${(r as Error).message}`)
      assert.equal((r as { finishReason: string }).finishReason, 'stop') // end_turn is the adapter's stop
    } finally { await srv.close() }
  })
}

// ── 6. Retry-After and resets (these held) ────────────────────────────────────────────
test('B13 Retry-After: 99999999 and retry-after-ms: 1e30-ish are capped at the backoff cap; a 429 loop ends after 5 retries (holds)', async () => {
  const srv = await serve((_q, res, n) => {
    res.writeHead(429, n % 2 ? { 'retry-after': '99999999' } : { 'retry-after-ms': '9'.repeat(40) })
    res.end('{"error":{"message":"slow down"}}')
  })
  try {
    const sleeps: number[] = []
    const p = tuned({ sleep: async (ms) => { sleeps.push(ms) } }, () => openAICompatible({ baseURL: srv.url, model: 'm', apiKey: KEY }))
    const e = await failure(p.complete({ messages: HI }))
    assert.equal(e.code, 'RATE_LIMIT')
    assert.equal(srv.hits, 6)
    assert.ok(sleeps.every((ms) => ms <= 10_000), JSON.stringify(sleeps))
  } finally { await srv.close() }
})

test('B14 a reset after some text: TRANSPORT with the partial, not retried by the adapter (holds)', async () => {
  const srv = await serve((_q, res) => {
    res.writeHead(200, { 'content-type': 'text/event-stream' })
    res.write('data: {"choices":[{"index":0,"delta":{"content":"half an"}}]}\n\n', () => setTimeout(() => res.destroy(), 20))
  })
  try {
    const e = await failure(oa(srv.url).complete({ messages: HI }))
    assert.equal(e.code, 'TRANSPORT')
    assert.deepEqual(e.partial?.content, [{ type: 'text', text: 'half an' }])
    assert.equal(srv.hits, 1)
  } finally { await srv.close() }
})

// ── 7. Wordings never seen, and broken servers (hostile review A) ───────────────────────
test('C1 OpenAI 429 insufficient_quota is QUOTA, sent once (not 6 billed-nothing retries); a 429 in rate-limit words stays RATE_LIMIT', async () => {
  // OpenAI's real body (langchain-ai/langchainjs#1929): the account has no money, waiting never helps.
  const quota = '{"error":{"message":"You exceeded your current quota, please check your plan and billing details.","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}'
  // Gemini's free tier says "quota" too, but it is a per-minute limit: RESOURCE_EXHAUSTED, retried.
  const perMinute = '[{"error":{"code":429,"message":"You exceeded your current quota, please check your plan and billing details. See https://ai.google.dev/gemini-api/docs/rate-limits.","status":"RESOURCE_EXHAUSTED"}}]'
  // xAI's 429 when a team's credits or spending limit are used up (no 'billing', no 'insufficient'): was RATE_LIMIT
  const xai = '{"code":"Some resource has been exhausted","error":"Your team 0b1c has either used all available credits or reached its monthly spending limit. To continue making API requests, please purchase more credits or raise your spending limit."}'
  for (const [body, code, hits] of [[quota, 'QUOTA', 1], [perMinute, 'RATE_LIMIT', 6], [xai, 'QUOTA', 1]] as const) {
    const srv = await serve((_q, res) => { res.writeHead(429, { 'content-type': 'application/json' }); res.end(body) })
    try {
      const e = await failure(oa(srv.url).complete({ messages: HI }))
      assert.equal(e.code, code, e.message)
      assert.equal(srv.hits, hits)
    } finally { await srv.close() }
  }
})

test('C2 Retry-After garbage ("-1", "1 2", "2, 3") waits the backoff, not 0 ms; a repeated header "30, 30" is 30 s (capped); an HTTP date still counts', async () => {
  const cases: [string, (ms: number) => boolean][] = [
    ['-1', (ms) => ms >= 900 && ms <= 1100], // Date.parse('-1') is 2001-01-01: a date long past, so no wait at all
    ['1 2', (ms) => ms >= 900 && ms <= 1100],
    ['2, 3', (ms) => ms === 2000], // two Retry-After headers, joined by fetch: the first one
    ['30, 30', (ms) => ms === 10_000],
    ['Wed, 21 Oct 2015 07:28:00 GMT', (ms) => ms === 0], // a date past: at once (holds)
    [new Date(Date.now() + 4_000).toUTCString(), (ms) => ms > 2_000 && ms <= 4_000], // holds
  ]
  for (const [value, ok] of cases) {
    const srv = await serve((_q, res, n) => {
      if (n === 0) { res.writeHead(429, { 'retry-after': value }); res.end('{"error":{"message":"slow down"}}'); return }
      sse(res, [{ choices: [{ index: 0, delta: { content: 'ok' }, finish_reason: 'stop' }] }])
    })
    try {
      const sleeps: number[] = []
      const p = tuned({ sleep: async (ms) => { sleeps.push(ms) }, retryBaseMs: 1_000, retryMaxMs: 10_000 },
        () => openAICompatible({ baseURL: srv.url, model: 'm', apiKey: KEY }))
      await p.complete({ messages: HI })
      assert.equal(sleeps.length, 1)
      assert.ok(ok(sleeps[0]), `Retry-After ${JSON.stringify(value)}: waited ${sleeps[0]} ms`)
    } finally { await srv.close() }
  }
})

test('C3 a 200 with no content type: an HTML page is MALFORMED_RESPONSE sent once (was TRANSPORT x6); an empty one EMPTY_RESPONSE; SSE without a type still reads', async () => {
  const cases: [string, string, number][] = [
    ['<!DOCTYPE html><html><body>Sign in to the Wi-Fi</body></html>', 'MALFORMED_RESPONSE', 1],
    ['', 'EMPTY_RESPONSE', 6],
  ]
  for (const [body, code, hits] of cases) {
    const srv = await serve((_q, res) => { res.writeHead(200); res.end(body) })
    try {
      const e = await failure(oa(srv.url).complete({ messages: HI }))
      assert.equal(e.code, code, e.message)
      assert.equal(srv.hits, hits)
    } finally { await srv.close() }
  }
  const srv = await serve((_q, res) => { res.writeHead(200); res.end('data: {"choices":[{"index":0,"delta":{"content":"ok"},"finish_reason":"stop"}]}\n\n') })
  try {
    const r = await oa(srv.url).complete({ messages: HI })
    assert.deepEqual(r.message.content, [{ type: 'text', text: 'ok' }])
  } finally { await srv.close() }
})

test('C4 a 200 "text/event-stream" whose body is one JSON value is read as one: an overflow error is CONTEXT_WINDOW_EXCEEDED, a whole answer an answer; an HTML page MALFORMED_RESPONSE (each was TRANSPORT x6)', async () => {
  // A relay (one-api / new-api style) that sets the stream's type and writes the upstream's error body as it came.
  const overflow = '{"error":{"message":"This model\'s maximum context length is 8192 tokens. However, your messages resulted in 9000 tokens.","type":"invalid_request_error","code":"context_length_exceeded"}}'
  const whole = JSON.stringify({ id: 'x', choices: [{ index: 0, message: { role: 'assistant', content: 'whole' }, finish_reason: 'stop' }] })
  for (const [body, code, hits] of [[overflow, 'CONTEXT_WINDOW_EXCEEDED', 1], ['<html><body>502 Bad Gateway</body></html>', 'MALFORMED_RESPONSE', 1], [whole, 'answer', 1]] as const) {
    const srv = await serve((_q, res) => { res.writeHead(200, { 'content-type': 'text/event-stream' }); res.end(body) })
    try {
      const r = await oa(srv.url).complete({ messages: HI }).catch((e: ProviderError) => e)
      if (code === 'answer') assert.deepEqual((r as { message: Message }).message.content, [{ type: 'text', text: 'whole' }])
      else assert.equal((r as ProviderError).code, code, (r as ProviderError).message)
      assert.equal(srv.hits, hits)
    } finally { await srv.close() }
  }
  // A stream that is one only by its type and carried nothing readable before it was cut is still TRANSPORT (holds)
  const cut = await serve((_q, res) => { res.writeHead(200, { 'content-type': 'text/event-stream' }); res.end(': keep-alive\n\n') })
  try { assert.equal((await failure(oa(cut.url).complete({ messages: HI }))).code, 'TRANSPORT') } finally { await cut.close() }
})

test('C5 Mistral Magistral streams content as parts (thinking, then text): reasoning and text are kept, not an empty answer retried 5 times', async () => {
  // The chunks as Mistral sends them (BerriAI/litellm#16272), then the answer as a text part and as a string.
  const chunk = (content: unknown, finish?: string) => ({ id: 'c', object: 'chat.completion.chunk', model: 'magistral-medium-2509',
    choices: [{ index: 0, delta: { content }, finish_reason: finish ?? null }] })
  const srv = await serve((_q, res) => sse(res, [
    chunk([{ type: 'thinking', thinking: [{ type: 'text', text: "'s a greeting" }] }]),
    chunk([{ type: 'thinking', thinking: [{ type: 'text', text: ', I should return one' }] }]),
    chunk([{ type: 'text', text: 'Hello' }]), chunk('!', 'stop'),
  ]))
  try {
    const r = await oa(srv.url).complete({ messages: HI })
    assert.deepEqual(r.message.content, [{ type: 'reasoning', text: "'s a greeting, I should return one" }, { type: 'text', text: 'Hello!' }])
    assert.equal(srv.hits, 1)
  } finally { await srv.close() }
})
