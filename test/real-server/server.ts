// Starts and stops a real llama.cpp `llama-server` for the real-server tests, and records what it
// is sent. The binary comes from test/real-server/setup.sh (cached in ~/.cache/dsh/llama-server/);
// the model from the shared folder ($DSH_SHARED/models, never copied into this repo).
import { spawn, type ChildProcess } from 'node:child_process'
import { existsSync, readFileSync } from 'node:fs'
import { createServer } from 'node:net'
import { homedir } from 'node:os'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { sharedPath } from '../shared.ts'

const here = dirname(fileURLToPath(import.meta.url))

/** KEY=VALUE lines of pin.env (the one place the pinned versions are written). */
export const PIN: Readonly<Record<string, string>> = Object.freeze(Object.fromEntries(
  readFileSync(join(here, 'pin.env'), 'utf8').split('\n').filter((l) => /^[A-Z_]+=/.test(l)).map((l) => [l.slice(0, l.indexOf('=')), l.slice(l.indexOf('=') + 1).trim()]),
))

/** Where setup.sh puts the binary, or $DSH_LLAMA_SERVER. */
export const SERVER_BINARY = process.env.DSH_LLAMA_SERVER
  ?? join(process.env.XDG_CACHE_HOME ?? join(homedir(), '.cache'), 'dsh', 'llama-server', PIN.LLAMA_SERVER_VERSION, 'bin', 'llama-server')

/** The tool-capable chat template setup.sh installs beside the binary, or $DSH_LLAMA_CHAT_TEMPLATE. */
export const CHAT_TEMPLATE = process.env.DSH_LLAMA_CHAT_TEMPLATE ?? join(dirname(dirname(SERVER_BINARY)), 'templates', PIN.LLAMA_CHAT_TEMPLATE)

/** The 2,048-token model and its copy whose metadata allows 8,192 (PROVENANCE.md in the shared folder). */
export const MODEL_2K = sharedPath('models', 'stories260K.gguf')
export const MODEL_8K = sharedPath('models', 'stories260K-ctx8k.gguf')

/**
 * `false` when the binary and the models are present. Otherwise a visible skip message — or, under
 * CI (`CI=true` or `DSH_REQUIRE_SHARED=1`), a thrown error: there the suite must not pass by skipping.
 */
export function skipWithoutServer(): false | string {
  const missing: string[] = []
  if (!existsSync(SERVER_BINARY)) missing.push(`${SERVER_BINARY} (run test/real-server/setup.sh, or set DSH_LLAMA_SERVER)`)
  else if (!existsSync(CHAT_TEMPLATE)) missing.push(`${CHAT_TEMPLATE} (run test/real-server/setup.sh, or set DSH_LLAMA_CHAT_TEMPLATE)`)
  for (const m of [MODEL_2K, MODEL_8K]) if (!existsSync(m)) missing.push(`${m} (set DSH_SHARED to the shared folder)`)
  return missing.length === 0 ? false : skipVisibly(`real-server tests: missing ${missing.join('; ')}`)
}

/** `msg` as a visible skip message for node:test's `{ skip }`; under CI a thrown error instead. */
export function skipVisibly(msg: string): string {
  if (process.env.CI === 'true' || process.env.DSH_REQUIRE_SHARED === '1') throw new Error(`MISSING: ${msg}`)
  console.log(`# SKIPPED: ${msg}`)
  return `SKIPPED: ${msg}`
}

/** A free loopback TCP port (the OS picks it; released just before the server binds it). */
export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = createServer()
    s.once('error', reject)
    s.listen(0, '127.0.0.1', () => {
      const port = (s.address() as { port: number }).port
      s.close(() => resolve(port))
    })
  })
}

export interface RunningServer {
  /** `http://127.0.0.1:PORT/v1`, for `openAICompatible({ baseURL })`. */
  baseURL: string
  port: number
  pid: number
  /** The slot's context window, tokens (`--ctx-size`). */
  ctxSize: number
  /** The server's stderr/stdout so far (for failure messages). */
  log(): string
  stop(): Promise<void>
}

const running = new Set<ChildProcess>()
// A test runner that exits or is interrupted mid-suite must not leave servers behind (by pid; a
// SIGKILL of the runner itself cannot be caught).
const killAll = () => { for (const child of running) try { child.kill('SIGKILL') } catch { /* gone */ } }
process.once('exit', killAll)
for (const signal of ['SIGINT', 'SIGTERM'] as const) process.once(signal, () => { killAll(); process.kill(process.pid, signal) })

/**
 * Starts `llama-server` on a random loopback port with one generation thread and one slot, and
 * waits until `GET /health` answers 200 (the model is loaded). Rejects, with the server's output,
 * when it exits or is not healthy within `timeoutMs`.
 */
export async function startServer(options: { ctxSize: number; model?: string; timeoutMs?: number }): Promise<RunningServer> {
  // The free port is released before the server binds it: if another process takes it meanwhile,
  // the server exits at once, and a new port is tried.
  for (let attempt = 1; ; attempt++) {
    try { return await startOnce(options) } catch (err) {
      if (attempt >= 3 || !/exited with|another server/.test((err as Error).message)) throw err
    }
  }
}

async function startOnce(options: { ctxSize: number; model?: string; timeoutMs?: number }): Promise<RunningServer> {
  const { ctxSize, timeoutMs = 60_000 } = options
  const model = options.model ?? (ctxSize > 2048 ? MODEL_8K : MODEL_2K)
  const port = await freePort()
  // A name only this server answers to: /health alone cannot tell it from another server that
  // holds the port (another test run on the same machine).
  const alias = `dsh-test-${process.pid}-${port}-${Math.random().toString(36).slice(2, 10)}`
  const args = ['-m', model, '--alias', alias, '--host', '127.0.0.1', '--port', String(port), '-t', '1', '-tb', '1', '--ctx-size', String(ctxSize), '-np', '1', '--seed', '1', '--no-webui']
  // The model's GGUF has no chat template; this one renders tool definitions, calls and results.
  args.push('--jinja', '--chat-template-file', CHAT_TEMPLATE)
  const child = spawn(SERVER_BINARY, args, { stdio: ['ignore', 'pipe', 'pipe'] })
  running.add(child)
  let output = ''
  const keep = (b: Buffer) => { output = (output + b.toString('utf8')).slice(-20_000) }
  child.stdout!.on('data', keep)
  child.stderr!.on('data', keep)
  let exited: string | undefined
  const exit = new Promise<void>((resolve) => child.once('exit', (code, sig) => { exited = `exited with ${sig ?? code}`; running.delete(child); resolve() }))
  const stop = async () => {
    if (exited) return
    child.kill('SIGTERM')
    const timer = setTimeout(() => child.kill('SIGKILL'), 5_000)
    await exit
    clearTimeout(timer)
  }
  const baseURL = `http://127.0.0.1:${port}/v1`
  const deadline = Date.now() + timeoutMs
  for (;;) {
    if (exited) throw new Error(`llama-server ${exited} before it was healthy:\n${output}`)
    try {
      const res = await fetch(`http://127.0.0.1:${port}/health`)
      await res.text()
      if (res.status === 200) {
        const models = await (await fetch(`http://127.0.0.1:${port}/v1/models`)).json() as { data?: { id?: string }[] }
        if (models.data?.some((m) => m.id === alias)) break
        await stop()
        throw new Error(`port ${port} is held by another server (it does not answer to ${alias})`)
      }
    } catch (err) { if (/another server/.test((err as Error).message)) throw err /* else: not listening yet */ }
    if (Date.now() > deadline) { await stop(); throw new Error(`llama-server not healthy after ${timeoutMs} ms:\n${output}`) }
    await new Promise((r) => setTimeout(r, 100))
  }
  return { baseURL, port, pid: child.pid!, ctxSize, log: () => output, stop }
}

/** One HTTP exchange as the server saw it. `body` is the parsed JSON request body. */
export interface Exchange {
  url: string
  headers: Record<string, string>
  body: any
  status: number
  /** The whole response text (the SSE stream, or the error body). */
  responseText: string
  /** From the final usage chunk of a 200 stream: the server's own count of the prompt, tokens. */
  promptTokens?: number
  /** Resolves when the whole response has been recorded (see {@link settled}). */
  done: Promise<void>
  /** Why the fetch failed before any response: its message and its cause's code (status 0 if the second try failed too). */
  failure?: string
}

/** Waits until every exchange's response is fully recorded; returns them. */
export async function settled(exchanges: Exchange[]): Promise<Exchange[]> {
  await Promise.all(exchanges.map((x) => x.done))
  return exchanges
}

/**
 * A `fetch` for `openAICompatible({ fetch })` that forwards to the real server and records every
 * exchange (request body, status, response text, the server's `prompt_tokens`). `transform`, when
 * given, may rewrite the SSE text the caller sees (the server's own stream is recorded as sent).
 */
export function recordingFetch(transform?: (sse: ReadableStream<Uint8Array>, exchange: Exchange) => ReadableStream<Uint8Array>) {
  const exchanges: Exchange[] = []
  const doFetch = async (input: string, init: RequestInit): Promise<Response> => {
    const headers = Object.fromEntries(new Headers(init.headers).entries())
    const exchange: Exchange = { url: input, headers, body: JSON.parse(String(init.body)), status: 0, responseText: '', done: Promise.resolve() }
    exchanges.push(exchange)
    // A fetch that fails before any response is sent once more, and said; a second failure is thrown.
    // The tests turn the adapter's retries off to count exchanges; once in CI a session's
    // second request failed so against a healthy server, its reason not kept: it is kept now.
    const why = (e: Error & { cause?: { code?: string; message?: string } }) =>
      `${e.message}${e.cause ? ` (${e.cause.code ?? e.cause.message})` : ''}`
    const res = await fetch(input, init).catch((e) => {
      if (init.signal?.aborted) throw e
      exchange.failure = why(e)
      console.log(`# recordingFetch: ${input} failed before a response (${exchange.failure}); sent once more`)
      return fetch(input, init)
    }).catch((e) => { exchange.failure = why(e); throw e })
    exchange.status = res.status
    if (!res.body) return res
    const [mine, theirs] = res.body.tee()
    exchange.done = (async () => {
      const decoder = new TextDecoder()
      const reader = mine.getReader()
      for (;;) {
        const { done, value } = await reader.read().catch(() => ({ done: true, value: undefined }))
        if (done) break
        exchange.responseText += decoder.decode(value, { stream: true })
      }
      for (const line of exchange.responseText.split('\n')) {
        if (!line.startsWith('data: {')) continue
        try { const u = JSON.parse(line.slice(6)).usage; if (u && typeof u.prompt_tokens === 'number') exchange.promptTokens = u.prompt_tokens } catch { /* not JSON */ }
      }
    })()
    const body = transform && res.status === 200 ? transform(theirs, exchange) : theirs
    return new Response(body, { status: res.status, statusText: res.statusText, headers: res.headers })
  }
  return { fetch: doFetch, exchanges }
}

/**
 * Asks the server to count the tokens of a request exactly as a chat completion would see them:
 * `POST /apply-template` renders the messages with the model's chat template, `POST /tokenize`
 * counts the result. Used to compare the meter with the server's own tokenizer.
 */
export async function serverPromptTokens(server: RunningServer, body: { messages: unknown[]; tools?: unknown[] }): Promise<number> {
  const root = `http://127.0.0.1:${server.port}`
  const tpl = await fetch(`${root}/apply-template`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) })
  if (tpl.status !== 200) throw new Error(`apply-template: HTTP ${tpl.status} ${await tpl.text()}`)
  const { prompt } = await tpl.json() as { prompt: string }
  const tok = await fetch(`${root}/tokenize`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ content: prompt, add_special: true }) })
  if (tok.status !== 200) throw new Error(`tokenize: HTTP ${tok.status} ${await tok.text()}`)
  return ((await tok.json()) as { tokens: unknown[] }).tokens.length
}
