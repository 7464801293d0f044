/**
 * test/fake-provider.ts — a scriptable OpenAI-compatible chat-completions server for tests.
 * A real node:http server on 127.0.0.1 (random port): clients talk to it over real HTTP.
 *
 * IN-PROCESS
 *   const fake = await startFakeProvider({ script: [{ text: 'Hello' }, { status: 429, body: '…' }] })
 *   const provider = openAICompatible({ baseURL: fake.url, model: 'fake-model', apiKey: 'sk-test' })
 *   await provider.complete({ messages: [{ role: 'user', content: 'hi' }] })
 *   fake.requests[0].body.messages      // what the client sent (parsed JSON), also .headers, .path
 *   await fake.close()
 *   Options: `script` (replies in order, one per POST …/chat/completions; when it runs out the
 *   server answers 400 "script exhausted"), or `handler(request, index)` returning a reply; `port`.
 *
 * CLI (child processes; Deno, Bun and workerd clients)
 *   node --import tsx test/fake-provider.ts --script script.json [--port N]
 *   Prints its URL as the first stdout line. script.json is a JSON array of replies (below; byte
 *   chunks as strings). GET {url}/__requests returns the recorded requests as JSON. SIGTERM or
 *   SIGINT closes it.
 *
 * REPLIES
 *   Scripted turn (SSE, `data: {chunk}` events, then `data: [DONE]`):
 *     { text?, reasoning?, toolCalls?: [{ id?, name, arguments: string | object }], finishReason?,
 *       usage?: wire usage object | null (default: estimated from the request, ceil(chars / 4)),
 *       deltaSize?: code points per delta (default 4), delayMs?: pause between writes,
 *       headers?, model? }
 *     Reasoning streams first (`reasoning_content`), then text (`content`), then each tool call
 *     (id + name, then its arguments in fragments), then a chunk with finish_reason and usage.
 *   Faults on a scripted turn (`fault` key, the deltas above are sent first):
 *     'disconnect'      the connection is dropped after the deltas (no finish reason, no [DONE]).
 *                       Bun's fetch may discard bytes that arrived just before the drop: give the
 *                       turn a delayMs when a Bun client must see the partial output.
 *     'no-done'         the response ends cleanly after the deltas, without finish reason or [DONE]
 *     'malformed-json'  after the deltas a `data:` line that is not JSON, then [DONE]
 *   Other faults:
 *     { fault: 'keep-alive', intervalMs? }                200, then only `: keep-alive` comments, forever
 *     { fault: 'in-band-error', error, event?: 'error', text? }   200, optional text deltas, then
 *                                                          `data: {"error": error}` (with `event: error` if asked); no [DONE]
 *     { fault: 'hang' }                                   reads the request, never answers
 *   HTTP answer:  { status, body?: string | object, headers?, delayMs? }  (object bodies as JSON)
 *   JSON answer:  { json, status?, headers? }             a non-streamed body with content-type application/json
 *   Raw SSE:      { rawSSE: string | Uint8Array, status?, headers? }    sent as text/event-stream, as is
 *   Byte chunks:  { chunks: (string | Uint8Array)[], delayMs?, status?, headers?, end?: 'end' | 'destroy' | 'hang' }
 *                 one network write per chunk (delayMs apart, default 10) for split tests
 * Every reply carries `x-request-id: fake-<n>` unless its headers override it.
 */
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http'
import { readFileSync } from 'node:fs'
import { pathToFileURL } from 'node:url'

export interface FakeToolCall { id?: string; name: string; arguments: string | Record<string, unknown> }
export interface FakeTurn {
  text?: string
  reasoning?: string
  toolCalls?: FakeToolCall[]
  finishReason?: string
  usage?: Record<string, unknown> | null
  deltaSize?: number
  delayMs?: number
  headers?: Record<string, string>
  model?: string
  fault?: 'disconnect' | 'no-done' | 'malformed-json'
}
export interface FakeHTTPReply { status: number; body?: string | object; headers?: Record<string, string>; delayMs?: number }
export interface FakeJSONReply { json: unknown; status?: number; headers?: Record<string, string> }
export interface FakeRawReply { rawSSE: string | Uint8Array; status?: number; headers?: Record<string, string> }
export interface FakeChunksReply { chunks: (string | Uint8Array)[]; delayMs?: number; status?: number; headers?: Record<string, string>; end?: 'end' | 'destroy' | 'hang' }
export interface FakeKeepAliveReply { fault: 'keep-alive'; intervalMs?: number }
export interface FakeInBandErrorReply { fault: 'in-band-error'; error: unknown; event?: 'error'; text?: string }
export interface FakeHangReply { fault: 'hang' }
export type FakeReply = FakeTurn | FakeHTTPReply | FakeJSONReply | FakeRawReply | FakeChunksReply | FakeKeepAliveReply | FakeInBandErrorReply | FakeHangReply

export interface FakeRequest {
  method: string
  path: string
  /** Lower-cased header names. */
  headers: Record<string, string>
  /** The body parsed as JSON (or the raw text when it is not JSON). */
  body: any
  rawBody: string
}

export interface FakeProviderOptions {
  script?: FakeReply[]
  handler?: (request: FakeRequest, index: number) => FakeReply | Promise<FakeReply>
  port?: number
}

export interface FakeProvider {
  /** `http://127.0.0.1:<port>` — use it as baseURL. */
  url: string
  port: number
  /** Every POST …/chat/completions received, in order. */
  requests: FakeRequest[]
  close(): Promise<void>
}

const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms))

/**
 * Drops the connection mid-response once everything written so far reached the kernel: a FIN
 * (half-close) first, so the client reads those bytes (a bare destroy can send a RST, and some
 * runtimes then discard bytes already received), then the socket is destroyed.
 */
function disconnect(res: ServerResponse): Promise<void> {
  return new Promise((resolve) => res.write('', () => {
    res.socket?.end()
    setTimeout(() => { res.socket?.destroy(); resolve() }, 20)
  }))
}

/** Turns a `.chunks.txt` recording (one chunk JSON per line) into the SSE body the server sent. */
export function sseFromChunkLines(text: string): string {
  return text.split('\n').filter((line) => line.trim() !== '').map((line) => `data: ${line}\n\n`).join('') + 'data: [DONE]\n\n'
}

/** Splits text into pieces of `size` code points (never inside a surrogate pair). */
function pieces(text: string, size: number): string[] {
  const points = Array.from(text)
  const out: string[] = []
  for (let i = 0; i < points.length; i += size) out.push(points.slice(i, i + size).join(''))
  return out
}

/** The SSE events of a scripted turn, without the final chunk. */
function turnDeltas(turn: FakeTurn, model: string): { deltas: object[]; finish: object; outputChars: number } {
  const size = turn.deltaSize ?? 4
  const id = 'chatcmpl-fake'
  const created = 1_700_000_000
  const chunk = (delta: object, finishReason: string | null = null, extra: object = {}): object =>
    ({ id, object: 'chat.completion.chunk', created, model, choices: [{ index: 0, delta, finish_reason: finishReason }], ...extra })
  const deltas: object[] = [chunk({ role: 'assistant', content: '' })]
  let outputChars = 0
  if (turn.reasoning) for (const p of pieces(turn.reasoning, size)) deltas.push(chunk({ reasoning_content: p }))
  if (turn.text) for (const p of pieces(turn.text, size)) deltas.push(chunk({ content: p }))
  outputChars += (turn.reasoning ?? '').length + (turn.text ?? '').length
  ;(turn.toolCalls ?? []).forEach((call, index) => {
    const args = typeof call.arguments === 'string' ? call.arguments : JSON.stringify(call.arguments)
    outputChars += call.name.length + args.length
    deltas.push(chunk({ tool_calls: [{ index, id: call.id ?? `call_fake_${index}`, type: 'function', function: { name: call.name, arguments: '' } }] }))
    for (const p of pieces(args, size)) deltas.push(chunk({ tool_calls: [{ index, function: { arguments: p } }] }))
  })
  const finishReason = turn.finishReason ?? ((turn.toolCalls ?? []).length > 0 ? 'tool_calls' : 'stop')
  return { deltas, finish: chunk({}, finishReason), outputChars }
}

function kindOf(reply: FakeReply): string {
  if ('rawSSE' in reply) return 'raw'
  if ('chunks' in reply) return 'chunks'
  if ('json' in reply) return 'json'
  if ('fault' in reply && (reply.fault === 'keep-alive' || reply.fault === 'in-band-error' || reply.fault === 'hang')) return reply.fault
  if ('status' in reply) return 'http'
  return 'turn'
}

/** Starts the server. See the top of this file for the reply shapes. */
export async function startFakeProvider(options: FakeProviderOptions = {}): Promise<FakeProvider> {
  const script = [...(options.script ?? [])]
  const requests: FakeRequest[] = []
  let served = 0

  async function reply(req: IncomingMessage, res: ServerResponse, request: FakeRequest, index: number): Promise<void> {
    let r: FakeReply | undefined
    if (options.handler) r = await options.handler(request, index)
    else r = script[index]
    const requestId = `fake-${index + 1}`
    if (r === undefined) {
      res.writeHead(400, { 'content-type': 'application/json', 'x-request-id': requestId })
      res.end(JSON.stringify({ error: { message: `fake provider: no scripted reply left for request #${index + 1} (the script has ${script.length}); add replies to the script`, type: 'fake_script_exhausted' } }))
      return
    }
    res.socket?.setNoDelay(true)
    const gone = (): boolean => res.destroyed || res.writableEnded
    const sseHeaders = (extra?: Record<string, string>): Record<string, string> =>
      ({ 'content-type': 'text/event-stream', 'cache-control': 'no-cache', 'x-request-id': requestId, ...(extra ?? {}) })
    switch (kindOf(r)) {
      case 'http': {
        const h = r as FakeHTTPReply
        if (h.delayMs) await sleep(h.delayMs)
        const isText = typeof h.body === 'string' || h.body === undefined
        res.writeHead(h.status, { 'content-type': isText ? 'text/plain; charset=utf-8' : 'application/json', 'x-request-id': requestId, ...(h.headers ?? {}) })
        res.end(h.body === undefined ? '' : isText ? (h.body as string) : JSON.stringify(h.body))
        return
      }
      case 'json': {
        const j = r as FakeJSONReply
        res.writeHead(j.status ?? 200, { 'content-type': 'application/json', 'x-request-id': requestId, ...(j.headers ?? {}) })
        res.end(typeof j.json === 'string' ? j.json : JSON.stringify(j.json))
        return
      }
      case 'raw': {
        const raw = r as FakeRawReply
        res.writeHead(raw.status ?? 200, sseHeaders(raw.headers))
        res.end(raw.rawSSE)
        return
      }
      case 'chunks': {
        const c = r as FakeChunksReply
        res.writeHead(c.status ?? 200, sseHeaders(c.headers))
        res.flushHeaders()
        for (const piece of c.chunks) {
          if (gone()) return
          res.write(piece)
          await sleep(c.delayMs ?? 10)
        }
        if (c.end === 'destroy') await disconnect(res)
        else if (c.end !== 'hang') res.end()
        return
      }
      case 'keep-alive': {
        const k = r as FakeKeepAliveReply
        res.writeHead(200, sseHeaders())
        res.flushHeaders()
        while (!gone()) {
          res.write(': keep-alive\n\n')
          await sleep(k.intervalMs ?? 20)
        }
        return
      }
      case 'in-band-error': {
        const e = r as FakeInBandErrorReply
        res.writeHead(200, sseHeaders())
        const { deltas } = turnDeltas({ text: e.text }, request.body?.model ?? 'fake-model')
        for (const d of deltas) res.write(`data: ${JSON.stringify(d)}\n\n`)
        res.end(`${e.event ? `event: ${e.event}\n` : ''}data: ${JSON.stringify({ error: e.error })}\n\n`)
        return
      }
      case 'hang':
        return
      default: {
        const turn = r as FakeTurn
        const { deltas, finish, outputChars } = turnDeltas(turn, turn.model ?? request.body?.model ?? 'fake-model')
        res.writeHead(200, sseHeaders(turn.headers))
        res.flushHeaders()
        for (const d of deltas) {
          if (gone()) return
          res.write(`data: ${JSON.stringify(d)}\n\n`)
          if (turn.delayMs) await sleep(turn.delayMs)
        }
        if (gone()) return
        if (turn.fault === 'disconnect') { await disconnect(res); return }
        if (turn.fault === 'no-done') { res.end(); return }
        if (turn.fault === 'malformed-json') res.write('data: {"choices": [{"delta": {"content": "x"\n\n')
        const usage = turn.usage === null ? undefined : turn.usage ?? {
          prompt_tokens: Math.ceil(JSON.stringify(request.body?.messages ?? '').length / 4),
          completion_tokens: Math.ceil(outputChars / 4),
        }
        res.write(`data: ${JSON.stringify(usage ? { ...finish, usage } : finish)}\n\n`)
        res.end('data: [DONE]\n\n')
      }
    }
  }

  const server = createServer((req, res) => {
    const parts: Buffer[] = []
    req.on('data', (b: Buffer) => parts.push(b))
    req.on('end', () => {
      const path = (req.url ?? '/').split('?')[0]
      if (req.method === 'GET' && path === '/__requests') {
        res.writeHead(200, { 'content-type': 'application/json' })
        res.end(JSON.stringify(requests))
        return
      }
      if (req.method !== 'POST' || !path.endsWith('/chat/completions')) {
        res.writeHead(404, { 'content-type': 'application/json' })
        res.end(JSON.stringify({ error: { message: `fake provider: no route for ${req.method} ${path}; POST {baseURL}/chat/completions`, type: 'not_found' } }))
        return
      }
      const rawBody = Buffer.concat(parts).toString('utf8')
      let body: unknown = rawBody
      try { body = JSON.parse(rawBody) } catch { /* recorded as text */ }
      const headers: Record<string, string> = {}
      for (const [k, v] of Object.entries(req.headers)) if (v !== undefined) headers[k] = Array.isArray(v) ? v.join(', ') : v
      const request: FakeRequest = { method: req.method, path, headers, body, rawBody }
      requests.push(request)
      const index = served++
      reply(req, res, request, index).catch((error: unknown) => {
        if (!res.headersSent) res.writeHead(500, { 'content-type': 'application/json' })
        res.end(JSON.stringify({ error: { message: `fake provider failed: ${String(error)}`, type: 'fake_internal' } }))
      })
    })
  })
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject)
    server.listen(options.port ?? 0, '127.0.0.1', () => resolve())
  })
  const address = server.address()
  const port = typeof address === 'object' && address ? address.port : 0
  return {
    url: `http://127.0.0.1:${port}`,
    port,
    requests,
    close: () => new Promise<void>((resolve) => {
      server.closeAllConnections()
      server.close(() => resolve())
    }),
  }
}

// CLI mode: `node --import tsx test/fake-provider.ts --script script.json [--port N]`.
if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) {
  const args = process.argv.slice(2)
  const valueOf = (flag: string): string | undefined => { const i = args.indexOf(flag); return i >= 0 ? args[i + 1] : undefined }
  const scriptFile = valueOf('--script')
  const portText = valueOf('--port')
  if (args.includes('--help') || (args.length > 0 && scriptFile === undefined)) {
    process.stderr.write('usage: node --import tsx test/fake-provider.ts --script script.json [--port N]\n')
    process.exit(2)
  }
  const script: FakeReply[] = scriptFile ? JSON.parse(readFileSync(scriptFile, 'utf8')) : []
  if (!Array.isArray(script)) {
    process.stderr.write(`fake-provider: ${scriptFile} must hold a JSON array of replies\n`)
    process.exit(2)
  }
  const fake = await startFakeProvider({ script, port: portText ? Number(portText) : 0 })
  process.stdout.write(`${fake.url}\n`)
  const stop = (): void => { fake.close().then(() => process.exit(0)) }
  process.on('SIGTERM', stop)
  process.on('SIGINT', stop)
}

/**
 * IN-PROCESS, no server: an event-stream Response of `events` (each sent as `data: …\n\n`), then a reset
 * connection when `cut`, else `[DONE]` — for a provider's `fetch` option.
 */
export function sseResponse(events: unknown[], cut: boolean): Response {
  const enc = new TextEncoder()
  let i = 0
  return new Response(new ReadableStream<Uint8Array>({
    pull(c) {
      if (i < events.length) c.enqueue(enc.encode(`data: ${JSON.stringify(events[i++])}\n\n`))
      else if (cut) c.error(new Error('connection reset'))
      else { c.enqueue(enc.encode('data: [DONE]\n\n')); c.close() }
    },
  }), { status: 200, headers: { 'content-type': 'text/event-stream' } })
}

/** A Response of one streamed chat completion that answers `text` and stops. */
export const sseAnswer = (text: string): Response => sseResponse([{ choices: [{ index: 0, delta: { content: text } }] },
  { choices: [{ index: 0, delta: {}, finish_reason: 'stop' }] }], false)

/** The options of a provider whose `fetch` the test gives: its base URL (port 9, discard) is never reached. */
export const FETCH_BASE = { baseURL: 'http://127.0.0.1:9', model: 'm', apiKey: 'k' }
