// The adapter's time limits and fail-fast transport errors (docs/design.md §6): only kept output
// is progress for the idle timer, every call has a total deadline by default, and a fetch failure
// no retry can mend (a blocked port, an invalid URL, a permission denial) is not retried.
import { test, mock } from 'node:test'
import assert from 'node:assert/strict'
import { openAICompatible, anthropic, ProviderError, type Message, type StreamEvent } from '../dsh.ts'
import { FETCH_BASE } from './fake-provider.ts'
import { tuned } from './tuning.ts'

const HI: Message[] = [{ role: 'user', content: 'hi' }]
const enc = new TextEncoder()

/** A fetch whose 200 event stream sends `line()` every `everyMs` (real timers) until cancelled. */
function dribble(line: () => string, everyMs: number) {
  let cancelled = false
  const fetch = async () => new Response(new ReadableStream<Uint8Array>({
    async pull(c) { await new Promise((r) => setTimeout(r, everyMs)); if (!cancelled) c.enqueue(enc.encode(line())) },
    cancel() { cancelled = true },
  }), { headers: { 'content-type': 'text/event-stream' } })
  return { fetch, cancelled: () => cancelled }
}
async function failure(p: Promise<unknown>): Promise<ProviderError> {
  try { await p } catch (e) { if (e instanceof ProviderError) return e; throw e }
  throw new Error('expected a ProviderError')
}

test('a stream of chunks that carry nothing times out: empty deltas, repeated usage and pings are not progress', { timeout: 10_000 }, async () => {
  const streams: [string, () => string, 'openai' | 'anthropic'][] = [
    ['empty deltas', () => 'data: {"choices":[{"index":0,"delta":{}}]}\n\n', 'openai'],
    ['the same usage again', () => 'data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":0}}\n\n', 'openai'],
    ['empty content strings', () => 'data: {"choices":[{"index":0,"delta":{"content":""}}]}\n\n', 'openai'],
    ['Anthropic pings', () => 'event: ping\ndata: {"type":"ping"}\n\n', 'anthropic'],
  ]
  for (const [name, line, format] of streams) {
    const d = dribble(line, 10)
    const options = { baseURL: 'http://127.0.0.1:9', model: 'm', fetch: d.fetch }
    const provider = tuned({ idleTimeoutMs: 300, maxRetries: 0 }, () => (format === 'openai' ? openAICompatible(options) : anthropic(options)))
    const started = Date.now()
    const err = await failure(provider.complete({ messages: HI }))
    assert.equal(err.code, 'TIMEOUT', name)
    assert.match(err.message, /no progress .* for 300 ms/, name)
    assert.ok(Date.now() - started < 3_000, `${name}: took ${Date.now() - started} ms`)
    assert.ok(d.cancelled(), `${name}: the stream was cancelled`)
  }
})

test('text that keeps coming is progress: a stream longer than the idle timeout completes', { timeout: 10_000 }, async () => {
  let n = 0
  const d = dribble(() => (++n < 12 ? `data: {"choices":[{"index":0,"delta":{"content":"w${n} "}}]}\n\n`
    : 'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n'), 50)
  const r = await tuned({ idleTimeoutMs: 200, maxRetries: 0 }, () => openAICompatible({ baseURL: 'http://127.0.0.1:9', model: 'm', fetch: d.fetch })).complete({ messages: HI })
  assert.equal((r.message.content[0] as { text: string }).text.split(' ').length, 12)
})

test('every call has a total deadline by default (1 hour): a stream that dribbles text forever ends as TIMEOUT, not retried', { timeout: 10_000 }, async (t) => {
  mock.timers.enable({ apis: ['setTimeout', 'Date'] })
  t.after(() => mock.timers.reset())
  let pulls = 0
  let wake: (() => void) | undefined
  const fetch = async () => new Response(new ReadableStream<Uint8Array>({
    async pull(c) {
      pulls++
      await new Promise<void>((r) => { wake = r })
      c.enqueue(enc.encode('data: {"choices":[{"index":0,"delta":{"content":"x"}}]}\n\n'))
    },
  }), { headers: { 'content-type': 'text/event-stream' } })
  const events: StreamEvent[] = []
  const done = failure(tuned({ maxRetries: 3 }, () => openAICompatible({ baseURL: 'http://127.0.0.1:9', model: 'm', fetch })).complete({ messages: HI, onEvent: (e) => events.push(e) }))
  const flush = () => new Promise((r) => setImmediate(r))
  for (let minute = 0; minute < 61; minute++) {
    for (let i = 0; i < 10 && !wake; i++) await flush()
    const w = wake; wake = undefined
    w?.()
    await flush()
    mock.timers.tick(60_000) // a delta a minute: never idle for the 300 s idle timeout
  }
  const err = await done
  assert.equal(err.code, 'TIMEOUT')
  assert.match(err.message, /deadline of 3600000 ms \(REQUEST_TIMEOUT_MS\)/)
  assert.ok(pulls >= 59, `${pulls} pulls`)
  assert.equal(events.filter((e) => e.type === 'retry').length, 0)
})

// From the hostile review rev5 of the body reader.
test('body reader: a body whose cancel never settles (a proxying fetch) does not hang complete() past its deadline', async () => {
  const provider = tuned({ maxRetries: 0, idleTimeoutMs: 200, requestTimeoutMs: 500 }, () => openAICompatible({ ...FETCH_BASE,
    fetch: async () => new Response(new ReadableStream<Uint8Array>({
      start(c) {
        c.enqueue(enc.encode('data: {"choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":"stop"}]}\n\n'
          + 'data: [DONE]\n\n'))
      },
      cancel: () => new Promise<void>(() => {}), // waits on an upstream that never answers
    }), { headers: { 'content-type': 'text/event-stream' } }) }))
  let timer: ReturnType<typeof setTimeout> | undefined
  const outcome = await Promise.race([
    provider.complete({ messages: [{ role: 'user', content: 'x' }] }).then((r) => JSON.stringify(r.message.content),
      (e: Error & { code?: string }) => String(e.code)),
    new Promise<string>((resolve) => { timer = setTimeout(() => resolve('still pending after 3 s'), 3_000) }),
  ])
  clearTimeout(timer)
  // The answer was whole at [DONE]: it is returned (or at worst a TIMEOUT at the 500 ms deadline), never a hang.
  assert.ok(outcome !== 'still pending after 3 s', outcome)
})

test('a fetch error no retry can mend fails at once: a blocked port, an invalid URL, a permission denial', async () => {
  const cases: [string, () => Promise<Response>][] = [
    // undici (Node): fetch failed, cause "bad port"; Deno: "Requests to port 1 are blocked"
    ['blocked port (undici)', () => globalThis.fetch('http://127.0.0.1:1/chat/completions', { method: 'POST' })],
    ['blocked port (Deno)', async () => { throw new TypeError('Fetch failed: Requests to port 1 are blocked') }],
    ['invalid URL (undici)', async () => { throw new TypeError('Failed to parse URL from http://[::1:80/x', { cause: Object.assign(new TypeError('Invalid URL'), { code: 'ERR_INVALID_URL' }) }) }],
    ['invalid URL (Bun)', async () => { throw Object.assign(new TypeError('fetch() URL is invalid'), { code: 'ERR_INVALID_URL' }) }],
    ['permission denial (Deno)', async () => { throw Object.assign(new Error('Requires net access to "api.example.com:443", run again with the --allow-net flag'), { name: 'NotCapable' }) }],
  ]
  for (const [name, fetch] of cases) {
    const slept: number[] = []
    const provider = tuned({ maxRetries: 5, sleep: async (ms) => { slept.push(ms) } }, () => openAICompatible({ baseURL: 'http://127.0.0.1:1', model: 'm', fetch }))
    const err = await failure(provider.complete({ messages: HI }))
    assert.equal(err.code, 'TRANSPORT', name)
    assert.deepEqual(slept, [], `${name}: retried ${slept.length} times`)
  }
  // A refused connection is still retried once, and a reset connection up to maxRetries.
  const refused = Object.assign(new Error('connect ECONNREFUSED 127.0.0.1:9'), { code: 'ECONNREFUSED' })
  const reset = Object.assign(new Error('socket hang up'), { code: 'ECONNRESET' })
  for (const [cause, retries] of [[refused, 1], [reset, 5]] as const) {
    const slept: number[] = []
    const fetch = async () => { throw new TypeError('fetch failed', { cause }) }
    await failure(tuned({ maxRetries: 5, sleep: async (ms) => { slept.push(ms) } }, () => openAICompatible({ baseURL: 'http://127.0.0.1:9', model: 'm', fetch })).complete({ messages: HI }))
    assert.equal(slept.length, retries, cause.code)
  }
})
