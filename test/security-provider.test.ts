// What a hostile or broken server can make the provider adapter read (docs/design.md §13): byte
// caps on error, non-stream and streamed bodies, an overall deadline, no cross-origin redirects.
import { test, describe, after } from 'node:test'
import assert from 'node:assert/strict'
import { createServer, type Server, type IncomingMessage, type ServerResponse } from 'node:http'
import { gzipSync } from 'node:zlib'
import {
  openAICompatible, anthropic, ProviderError, Agent, Session, type Message,
} from '../dsh.ts'
import {
  RESPONSE_BODY_MAX_BYTES, MAX_MESSAGE_BYTES,
} from './spec.ts'
import { startFakeProvider } from './fake-provider.ts'
import { tuned } from './tuning.ts'

const HI: Message[] = [{ role: 'user', content: 'hi' }]
const servers: Server[] = []
after(async () => { for (const s of servers) { s.closeAllConnections(); await new Promise((r) => s.close(r)) } })

/** A raw HTTP server; `handler` gets every request. Returns its base URL. */
async function serve(handler: (req: IncomingMessage, res: ServerResponse) => void): Promise<string> {
  const server = createServer(handler)
  servers.push(server)
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r))
  return `http://127.0.0.1:${(server.address() as { port: number }).port}`
}

/** Writes `chunk` `times` times with backpressure; resolves with the bytes written before the client went away. */
function pump(res: ServerResponse, chunk: Uint8Array | string, times: number): Promise<number> {
  return new Promise((resolve) => {
    let written = 0, i = 0
    res.on('close', () => resolve(written))
    const more = (): void => {
      while (i < times) {
        i++
        written += typeof chunk === 'string' ? Buffer.byteLength(chunk) : chunk.byteLength
        if (!res.write(chunk)) { res.once('drain', more); return }
      }
      res.end()
    }
    more()
  })
}

const rejectsWith = async (p: Promise<unknown>, check: (e: ProviderError) => void): Promise<void> => {
  let error: unknown
  try { await p } catch (e) { error = e }
  assert.ok(error instanceof ProviderError, `expected a ProviderError, got ${error}`)
  check(error)
}

describe('error and non-stream bodies are read up to 64 KiB, then cancelled', () => {
  test('a 3 MB gzip body (3 GB inflated) is not inflated: 64 KiB read, the rest cancelled', async () => {
    const member = gzipSync(Buffer.alloc(1024 * 1024, 0x61), { level: 9 }) // 1 MiB of "a" → ~1 KB
    const members = Math.ceil((3 * 1024 * 1024) / member.byteLength) // ≈ 3 MB of gzip, ≈ 3 GB of text
    let sent: Promise<number> | undefined
    const url = await serve((req, res) => {
      req.resume()
      res.writeHead(400, { 'content-type': 'text/plain', 'content-encoding': 'gzip' })
      sent = pump(res, member, members)
    })
    const started = Date.now()
    await rejectsWith(openAICompatible({ baseURL: url, model: 'm' }).complete({ messages: HI }), (e) => {
      assert.equal(e.code, 'INVALID_REQUEST')
      assert.equal(e.status, 400)
      assert.equal(e.body.length, RESPONSE_BODY_MAX_BYTES)
      assert.match(e.message, /error body cut at 65536 bytes, the rest not read/)
    })
    assert.ok(Date.now() - started < 5_000) // inflating 3 GB takes longer, and then fails on V8's string limit
    await sent! // the client closed the connection (the server's write loop ended)
  })

  test('a huge plain 500 body is read only 64 KiB per attempt, on each of the retries', async () => {
    const sent: Promise<number>[] = []
    const url = await serve((req, res) => {
      req.resume()
      res.writeHead(500, { 'content-type': 'text/plain' })
      sent.push(pump(res, 'x'.repeat(64 * 1024), 16 * 1024)) // 1 GiB offered per attempt
    })
    await rejectsWith(tuned({ maxRetries: 2, retryBaseMs: 1, retryMaxMs: 1 }, () => openAICompatible({ baseURL: url, model: 'm' })).complete({ messages: HI }), (e) => {
      assert.equal(e.code, 'SERVER')
      assert.equal(e.body, 'x'.repeat(RESPONSE_BODY_MAX_BYTES))
    })
    assert.equal(sent.length, 3)
    for (const n of await Promise.all(sent)) assert.ok(n < 64 * 1024 * 1024, `one attempt took ${n} bytes`)
  })

  test('one cap for streamed and non-streamed answers: a 64 KiB non-streamed answer is kept, one over the message cap is RESPONSE_TOO_LARGE', async () => {
    const answer = (n: number) => ({ json: { choices: [{ index: 0, message: { role: 'assistant', content: 'y'.repeat(n) }, finish_reason: 'stop' }] } })
    const f = await startFakeProvider({ script: [answer(RESPONSE_BODY_MAX_BYTES), answer(100_001), answer(300_000)] })
    try {
      const ok = await tuned({ maxRetries: 0 }, () => openAICompatible({ baseURL: f.url, model: 'm' })).complete({ messages: HI })
      assert.deepEqual(ok.message.content, [{ type: 'text', text: 'y'.repeat(RESPONSE_BODY_MAX_BYTES) }]) // refused at 64 KiB before
      const small = tuned({ maxRetries: 0, maxMessageBytes: 100_000 }, () => openAICompatible({ baseURL: f.url, model: 'm' }))
      await rejectsWith(small.complete({ messages: HI }), (e) => {
        assert.equal(e.code, 'RESPONSE_TOO_LARGE') // the message cap, as for a stream
        assert.match(e.message, /passed MAX_MESSAGE_BYTES, 100000 bytes/)
      })
      await rejectsWith(small.complete({ messages: HI }), (e) => {
        assert.equal(e.code, 'RESPONSE_TOO_LARGE') // the body is not even read past 2 × 100,000 + 65,536 bytes
        assert.match(e.message, /non-streamed body over 265536 bytes/)
      })
    } finally { await f.close() }
  })
})

describe('one assistant message is capped (default 8 MiB of everything it keeps, 1,000 tool calls)', () => {
  test('the default is 8 MiB', () => assert.equal(MAX_MESSAGE_BYTES, 8 * 1024 * 1024))

  test('an endless stream ends with RESPONSE_TOO_LARGE and the partial text kept; the loop logs it as interrupted', async () => {
    let sent: Promise<number> | undefined
    const delta = `data: ${JSON.stringify({ choices: [{ index: 0, delta: { content: 'z'.repeat(1000) } }] })}\n\n`
    const url = await serve((req, res) => {
      req.resume()
      res.writeHead(200, { 'content-type': 'text/event-stream' })
      sent = pump(res, delta, 1_000_000) // ≈ 1 GB, endless for the client
    })
    const provider = tuned({ maxMessageBytes: 64 * 1024 }, () => openAICompatible({ baseURL: url, model: 'm' }))
    await rejectsWith(provider.complete({ messages: HI }), (e) => {
      assert.equal(e.code, 'RESPONSE_TOO_LARGE')
      assert.match(e.message, /passed MAX_MESSAGE_BYTES, 65536 bytes of text, reasoning and tool-call ids, names and arguments/)
      const text = (e.partial!.content[0] as { text: string }).text
      assert.equal(text, 'z'.repeat(65_000))
      assert.equal(e.partial!.interrupted, true)
    })
    assert.ok((await sent!) < 64 * 1024 * 1024)

    const session = await Session.open()
    const agent = new Agent({ session, provider: { ...provider, contextWindow: 1_000_000, maxTokens: 1000 } })
    await assert.rejects(agent.run('go'), (e: ProviderError) => e.code === 'RESPONSE_TOO_LARGE')
    const logged = session.events.find((e) => e.type === 'assistant/message')!.data as any
    assert.equal(logged.finishReason, 'error')
    assert.equal(logged.message.interrupted, true)
    assert.equal(logged.message.content[0].text.length, 65_000)
  })

  // Every byte the message keeps counts: a server can grow a message through any of its fields.
  const fieldCases: { field: string; call: { id: string; name: string; arguments: string } }[] = [
    { field: 'arguments', call: { id: 'c', name: 't', arguments: 'a'.repeat(3000) } },
    { field: 'names', call: { id: 'c', name: 'n'.repeat(3000), arguments: '{}' } },
    { field: 'ids', call: { id: 'i'.repeat(3000), name: 't', arguments: '{}' } },
  ]
  for (const c of fieldCases) test(`tool-call ${c.field} count too`, async () => {
    const f = await startFakeProvider({ script: [{ text: 'ok', toolCalls: [c.call], deltaSize: 500 }, { text: 'ok', toolCalls: [c.call], deltaSize: 500 }] })
    try {
      const provider = tuned({ maxMessageBytes: 2000 }, () => openAICompatible({ baseURL: f.url, model: 'm' }))
      await rejectsWith(provider.complete({ messages: HI }), (e) => {
        assert.equal(e.code, 'RESPONSE_TOO_LARGE')
        assert.deepEqual(e.partial?.content, [{ type: 'text', text: 'ok' }])
      })
      const roomy = await tuned({ maxMessageBytes: 4000 }, () => openAICompatible({ baseURL: f.url, model: 'm' })).complete({ messages: HI })
      assert.deepEqual(roomy.message.content.at(-1), { type: 'tool-call', ...c.call })
    } finally { await f.close() }
  })

  test('40 calls with 8 MB names are refused at the second (not a 320 MB message); what was sent is bounded', { timeout: 60_000 }, async () => {
    const name = 'n'.repeat(8_000_000)
    let sent: Promise<number> | undefined
    const url = await serve((req, res) => {
      req.resume()
      res.writeHead(200, { 'content-type': 'text/event-stream' })
      // One event per call, made only when the client reads on (backpressure), so the test holds one at a time.
      sent = new Promise((resolve) => {
        let written = 0, i = 0
        res.on('close', () => resolve(written))
        const more = (): void => {
          while (i < 40) {
            const event = `data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":${i},"id":"c${i}","type":"function","function":{"name":"${name}","arguments":"{}"}}]}}]}\n\n`
            i++
            written += event.length
            if (!res.write(event)) { res.once('drain', more); return }
          }
          res.end('data: {"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}\n\ndata: [DONE]\n\n')
        }
        more()
      })
    })
    let deltas = 0
    await rejectsWith(openAICompatible({ baseURL: url, model: 'm' }).complete({ messages: HI, onEvent: (e) => { if (e.type === 'tool-call-delta') deltas++ } }), (e) => {
      assert.equal(e.code, 'RESPONSE_TOO_LARGE')
      assert.match(e.message, /passed MAX_MESSAGE_BYTES, 8388608 bytes of text, reasoning and tool-call ids, names and arguments/)
      assert.equal(e.partial, undefined, 'no text: nothing to keep')
    })
    assert.equal(deltas, 1, 'the second name is refused before it is kept or shown')
    const bytes = await sent!
    assert.ok(bytes < 10 * 8_000_000, `${bytes} bytes sent before the client cancelled`)
  })

  const manyCalls = (n: number) => Array.from({ length: n }, (_, i) => ({ id: `c${i}`, name: 't', arguments: '{}' }))
  test('1,001 tool calls are refused with the partial text kept; 1,000 are taken; the loop runs none of the 1,001', { timeout: 60_000 }, async () => {
    const f = await startFakeProvider({ script: [{ text: 'many', toolCalls: manyCalls(1001) }, { text: 'many', toolCalls: manyCalls(1000) }, { text: 'many', toolCalls: manyCalls(1001) }] })
    try {
      const provider = tuned({ maxRetries: 0 }, () => openAICompatible({ baseURL: f.url, model: 'm' }))
      await rejectsWith(provider.complete({ messages: HI }), (e) => {
        assert.equal(e.code, 'RESPONSE_TOO_LARGE')
        assert.match(e.message, /has more than 1000 tool calls, the most dsh takes in one message/)
        assert.deepEqual(e.partial, { role: 'assistant', content: [{ type: 'text', text: 'many' }], interrupted: true })
      })
      const ok = await provider.complete({ messages: HI })
      assert.equal(ok.message.content.filter((b) => b.type === 'tool-call').length, 1000)

      const session = await Session.open()
      let ran = 0
      const agent = new Agent({ session, provider: { ...provider, contextWindow: 1_000_000, maxTokens: 1000 }, tools: [{ name: 't', description: 't', parameters: { type: 'object' }, execute: () => { ran++; return 'ran' } }] })
      await assert.rejects(agent.run('go'), (e: ProviderError) => e.code === 'RESPONSE_TOO_LARGE')
      assert.equal(ran, 0)
      const logged = session.events.filter((e) => e.type === 'assistant/message').map((e) => (e.data as any).message)
      assert.deepEqual(logged, [{ role: 'assistant', content: [{ type: 'text', text: 'many' }], interrupted: true }])
    } finally { await f.close() }
  })

  test('the non-streamed path has the same call cap: 1,001 small calls in a 64 KiB body are refused', async () => {
    const tool_calls = Array.from({ length: 1001 }, (_, i) => ({ id: `${i}`, function: { name: 't' } }))
    const json = { choices: [{ index: 0, message: { role: 'assistant', content: 'many', tool_calls }, finish_reason: 'tool_calls' }] }
    assert.ok(JSON.stringify(json).length < RESPONSE_BODY_MAX_BYTES)
    const f = await startFakeProvider({ script: [{ json }] })
    try {
      await rejectsWith(tuned({ maxRetries: 0 }, () => openAICompatible({ baseURL: f.url, model: 'm' })).complete({ messages: HI }), (e) => {
        assert.equal(e.code, 'RESPONSE_TOO_LARGE')
        assert.match(e.message, /has more than 1000 tool calls/)
        assert.deepEqual(e.partial?.content, [{ type: 'text', text: 'many' }])
      })
    } finally { await f.close() }
  })

  test('the message cap and the deadline are constants: options of those names are refused (CHANGELOG.md)', () => {
    for (const name of ['maxMessageBytes', 'requestTimeoutMs', 'idleTimeoutMs', 'maxRetries', 'retryBaseMs', 'retryMaxMs', 'sleep']) {
      assert.throws(() => openAICompatible({ baseURL: 'http://127.0.0.1:1', model: 'm', [name]: 1 } as never), new RegExp(`unknown option "${name}"`))
    }
  })
})

describe('an overall request deadline', () => {
  test('keep-alive comments forever: TIMEOUT at the request deadline, not retried', async () => {
    const f = await startFakeProvider({ script: [{ fault: 'keep-alive', intervalMs: 20 }, { text: 'never' }] })
    try {
      const started = Date.now()
      await rejectsWith(tuned({ requestTimeoutMs: 300 }, () => openAICompatible({ baseURL: f.url, model: 'm' })).complete({ messages: HI }), (e) => {
        assert.equal(e.code, 'TIMEOUT')
        assert.match(e.message, /the request deadline of 300 ms \(REQUEST_TIMEOUT_MS\) passed/)
      })
      const ms = Date.now() - started
      assert.ok(ms >= 290 && ms < 3_000, `${ms} ms`)
      assert.equal(f.requests.length, 1)
    } finally { await f.close() }
  })
})

describe('POST redirects are not followed across origins', () => {
  test('307 to another origin: refused, nothing reaches it', async () => {
    const other = await startFakeProvider({ script: [{ text: 'stolen' }] })
    try {
      const url = await serve((req, res) => { req.resume(); res.writeHead(307, { location: `${other.url}/chat/completions` }).end() })
      await rejectsWith(openAICompatible({ baseURL: url, model: 'm', apiKey: 'sk-secret-key' }).complete({ messages: HI }), (e) => {
        assert.equal(e.code, 'INVALID_REQUEST')
        assert.equal(e.status, 307)
        assert.ok(e.message.includes(`redirects to ${other.url}/chat/completions: another origin than ${url}; the conversation and the key are not re-sent there`), e.message)
      })
      assert.equal(other.requests.length, 0)
    } finally { await other.close() }
  })

  test('308 to the same origin is followed with the body; 302 is refused', async () => {
    const seen: string[] = []
    const url = await serve((req, res) => {
      let body = ''
      req.on('data', (c) => { body += c })
      req.on('end', () => {
        seen.push(`${req.url} ${JSON.parse(body).messages[0].content}`)
        if (req.url === '/v1/chat/completions') return void res.writeHead(308, { location: '/v2/chat/completions' }).end()
        if (req.url === '/old/chat/completions') return void res.writeHead(302, { location: '/v2/chat/completions' }).end()
        res.writeHead(200, { 'content-type': 'text/event-stream' })
        res.end(`data: ${JSON.stringify({ choices: [{ index: 0, delta: { content: 'moved' }, finish_reason: 'stop' }] })}\n\ndata: [DONE]\n\n`)
      })
    })
    const answer = await openAICompatible({ baseURL: `${url}/v1`, model: 'm' }).complete({ messages: HI })
    assert.deepEqual(answer.message.content, [{ type: 'text', text: 'moved' }])
    assert.deepEqual(seen, ['/v1/chat/completions hi', '/v2/chat/completions hi'])
    await rejectsWith(openAICompatible({ baseURL: `${url}/old`, model: 'm' }).complete({ messages: HI }), (e) => assert.match(e.message, /HTTP 302 would turn the POST into a GET/))
  })
})

test('a key or header fetch cannot send (a line break, a typographic quote copied with it) is a TypeError at construction that does not show it; a bad request header is not retried', async () => {
  const secret = 'sk-live-5f3c9a1e77'
  // Before: each complete() went out, fetch threw a TypeError quoting "Bearer sk-live…", retried 5 times as TRANSPORT
  // ("check the network"), and the ProviderError's cause kept the key in its message.
  const made = [
    () => openAICompatible({ baseURL: 'http://127.0.0.1:1', model: 'm', apiKey: `${secret}\nsk-other` }),
    () => openAICompatible({ baseURL: 'http://127.0.0.1:1', model: 'm', apiKey: `\u201c${secret}\u201d` }),
    () => openAICompatible({ baseURL: 'http://127.0.0.1:1', model: 'm', apiKey: 'k', headers: { 'api-key': `${secret}\r\nx: y` } }),
    () => openAICompatible({ baseURL: 'http://127.0.0.1:1', model: 'm', apiKey: 'k', headers: { 'bad name': 'v' } }),
  ]
  for (const make of made) {
    assert.throws(make, (e: unknown) => e instanceof TypeError && /cannot be sent as HTTP headers/.test(e.message)
      && !e.message.includes(secret) && (e as Error).cause === undefined)
  }
  let hits = 0
  const url = await serve((_q, res) => { hits++; res.writeHead(200, { 'content-type': 'text/event-stream' }); res.end('data: [DONE]\n\n') })
  const sleeps: number[] = []
  const p = tuned({ sleep: async (ms) => { sleeps.push(ms) } }, () => openAICompatible({ baseURL: url, model: 'm', apiKey: 'k' }))
  const e = await p.complete({ messages: HI, headers: { 'x-trace': 'a\nb' } }).then(() => undefined, (err) => err as Error)
  assert.ok(e instanceof TypeError && /request.headers cannot be sent/.test(e.message), String(e))
  assert.deepEqual(sleeps, [], 'not retried: the same header fails the same way')
  assert.equal(hits, 0)
})

test('a request header fetch cannot send (complete or countTokens) is a TypeError that does not show it, sent never', async () => {
  // Before: the line break case was TRANSPORT ('check the network') quoting "Bearer sk-…" in its message, and a
  // character past U+00FF (a typographic quote) matched no fail-fast wording: retried 5 times as TRANSPORT.
  const secret = 'sk-live-5f3c9a1e77'
  let hits = 0
  const url = await serve((_q, res) => { hits++; res.writeHead(200, { 'content-type': 'text/event-stream' }); res.end('data: [DONE]\n\n') })
  const sleeps: number[] = []
  const p = tuned({ sleep: async (ms) => { sleeps.push(ms) } }, () => anthropic({ baseURL: url, model: 'm', apiKey: 'k' }))
  for (const value of [`Bearer ${secret}\nx`, `Bearer ${secret}\u201d`]) {
    for (const call of [() => p.complete({ messages: HI, headers: { authorization: value } }),
      () => p.countTokens!({ messages: HI, headers: { authorization: value } })]) {
      const e = await call().then(() => undefined, (err) => err as Error)
      assert.ok(e instanceof TypeError && /cannot be sent as HTTP headers/.test(e.message), String(e))
      assert.ok(!e.message.includes(secret) && e.cause === undefined)
    }
  }
  assert.deepEqual(sleeps, [])
  assert.equal(hits, 0)
})
