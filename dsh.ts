/**
 * dsh.ts — a single-file, zero-dependency TypeScript runtime for LLM agents that manages the
 * context window of long sessions. Spec: DESIGN.md (shared with the project).
 *
 * MANUAL (five lines)
 *   import { Agent, Session, deepseek } from './dsh.ts'
 *   const session = await Session.open(new MemoryStore())
 *   const agent = new Agent({ session, provider: deepseek({ apiKey }), tools: [myTool] })
 *   const answer = await agent.run('Fix the failing test')
 *   console.log(answer.text, session.measure())
 *
 * CONTENTS (sections follow the data)
 *   1. Types          messages, blocks, events, provider contract, errors
 *   2. Meter          token estimates (tokens), usage anchor
 *   3. Pruner         code-point-safe head/tail cut of tool results (code points)
 *   4. Log & surface  append-only session log, surface projection, stores, resume
 *   5. Ladder         prune → compact → spill → fail
 *   6. Provider       SSE parser, error classifier, OpenAI-compatible / DeepSeek adapter
 *   7. Loop           Agent: turns, steps, tools, hooks, cancellation
 *   8. CLI            `npx tsx dsh.ts`, `replay`
 *
 * UNITS: "tokens" are heuristic or provider-reported tokens; "code points" are Unicode scalar
 * values (a surrogate pair is one); "UTF-16 units" are JS string length; "bytes" are UTF-8 bytes;
 * times are milliseconds unless a name says otherwise.
 */

export const VERSION = '0.1.0'

// ════════════════════════════════════════════════════════════════════════════════════════════
// 1. Types
// ════════════════════════════════════════════════════════════════════════════════════════════

/** Plain text. `text` is any string; lone surrogates are tolerated and replaced only on the wire. */
export interface TextBlock { type: 'text'; text: string }
/** Model reasoning ("thinking"); DeepSeek's `reasoning_content`. */
export interface ReasoningBlock { type: 'reasoning'; text: string }
/** A tool call made by the model. `arguments` is the raw JSON string, exactly as streamed. */
export interface ToolCallBlock { type: 'tool-call'; id: string; name: string; arguments: string }
/** An image (or any other non-text block). Kept in position; priced by its JSON length. */
export interface ImageBlock { type: 'image'; [key: string]: unknown }
/** Any block a caller hands in that dsh does not interpret. Kept in position, never edited. */
export interface OtherBlock { type: string; [key: string]: unknown }
export type Block = TextBlock | ReasoningBlock | ToolCallBlock | ImageBlock | OtherBlock

/** DESIGN.md §1. `content` may be a plain string (the common case) or blocks. */
export interface UserMessage { role: 'user'; content: string | Block[] }
/** DESIGN.md §1. `interrupted` marks partial output kept after a cancellation or a cut stream. */
export interface AssistantMessage { role: 'assistant'; content: Block[]; interrupted?: boolean }
/** DESIGN.md §1. The result of the tool call whose id is `toolCallId`. */
export interface ToolResultMessage {
  role: 'tool'
  toolCallId: string
  content: Block[]
  isError?: boolean
  /** Free-form data for the caller (never sent to the provider, never edited by dsh). */
  metadata?: Record<string, unknown>
}
export type Message = UserMessage | AssistantMessage | ToolResultMessage

/** A function tool as the provider sees it (JSON-schema `parameters`), part of the envelope. */
export interface ToolSpec { name: string; description?: string; parameters?: Record<string, unknown> }

/** The request envelope (DESIGN.md §1): not messages, but priced like them (§2). */
export interface Envelope { system?: string; tools?: readonly ToolSpec[] }

/** Provider-reported usage of one call, in tokens (DESIGN.md §6). */
export interface Usage {
  promptTokens: number
  completionTokens: number
  /** Prompt tokens served from the provider's cache (`prompt_cache_hit_tokens` / `cached_tokens`). */
  cachedTokens?: number
  /** Completion tokens spent on reasoning (`completion_tokens_details.reasoning_tokens`). */
  reasoningTokens?: number
}

/** Error codes of {@link ProviderError} (DESIGN.md §6). */
export type ProviderErrorCode =
  | 'CONTEXT_WINDOW_EXCEEDED' | 'RATE_LIMIT' | 'QUOTA' | 'AUTH' | 'INVALID_REQUEST' | 'SERVER'
  | 'TRANSPORT' | 'TIMEOUT' | 'ABORTED' | 'EMPTY_RESPONSE' | 'MALFORMED_RESPONSE'

/**
 * The one error type a provider throws. `body` is the raw response text (or the in-stream error
 * payload); `status` the HTTP status when there was one; `retryAfterMs` from `Retry-After`;
 * `partial` the assistant output received before a stream broke (for an interrupted message).
 */
export class ProviderError extends Error {
  readonly code: ProviderErrorCode
  readonly status?: number
  readonly retryAfterMs?: number
  readonly requestId?: string
  readonly body: string
  partial?: AssistantMessage
  constructor(code: ProviderErrorCode, message: string, init: {
    status?: number; retryAfterMs?: number; requestId?: string; body?: string; partial?: AssistantMessage; cause?: unknown
  } = {}) {
    super(message, init.cause === undefined ? undefined : { cause: init.cause })
    this.name = 'ProviderError'
    this.code = code
    this.status = init.status
    this.retryAfterMs = init.retryAfterMs
    this.requestId = init.requestId
    this.body = init.body ?? ''
    this.partial = init.partial
  }
}

/** Streamed progress of one provider call. Deltas are UTF-16 strings as decoded. */
export type StreamEvent =
  | { type: 'text-delta'; text: string }
  | { type: 'reasoning-delta'; text: string }
  | { type: 'tool-call-delta'; index: number; id?: string; name?: string; argumentsDelta: string }
  | { type: 'usage'; usage: Usage }
  | { type: 'finish'; finishReason: string }
  | { type: 'retry'; attempt: number; delayMs: number; error: ProviderError }

/** One provider call. `maxTokens` (tokens) is clamped by the provider to the room left. */
export interface ChatRequest {
  system?: string
  tools?: readonly ToolSpec[]
  messages: readonly Message[]
  maxTokens?: number
  /**
   * The caller's estimate of the prompt (envelope + messages) in tokens, e.g. the session's
   * anchored measure; used to clamp `maxTokens` to the window. Default: the heuristic of §2.
   */
  inputTokens?: number
  signal?: AbortSignal
  /** Extra HTTP headers, e.g. `x-dsh-purpose: compaction` on summary requests (DESIGN.md §5). */
  headers?: Record<string, string>
  onEvent?: (event: StreamEvent) => void
}

/** The assembled answer of one provider call. */
export interface ChatResponse {
  message: AssistantMessage
  usage?: Usage
  /** `stop`, `tool_calls`, `length`, `content_filter`, … as the provider sent it. */
  finishReason: string
  requestId?: string
}

/** What the loop and the ladder need from a model. {@link openAICompatible} makes one. */
export interface Provider {
  readonly model: string
  readonly baseURL: string
  /** Context window in tokens, when known (DESIGN.md §6 table, or configured). */
  readonly contextWindow?: number
  /** Default completion budget in tokens (before clamping). */
  readonly maxTokens: number
  /** Streams one chat completion; throws {@link ProviderError} on any failure. */
  complete(request: ChatRequest): Promise<ChatResponse>
}

/** What a tool's `execute` receives besides its parsed arguments. */
export interface ToolContext {
  /** Aborted when the turn is cancelled; long-running tools should stop early. */
  signal: AbortSignal
  /** The id of the tool call being answered. */
  callId: string
}

/**
 * What a tool returns: a string (one text block), blocks, or an explicit result. Throwing is fine:
 * the loop turns it into an error result for the model (DESIGN.md §7).
 */
export type ToolOutput = string | Block[] | { content: string | Block[]; isError?: boolean }

/** A tool: a plain object (DESIGN.md §7). `parameters` is a JSON schema for the arguments object. */
export interface Tool<Args = any> {
  name: string
  description: string
  parameters: Record<string, unknown>
  execute(args: Args, ctx: ToolContext): ToolOutput | Promise<ToolOutput>
}

// ════════════════════════════════════════════════════════════════════════════════════════════
// 2. Meter
// ════════════════════════════════════════════════════════════════════════════════════════════

// (meter)

// ════════════════════════════════════════════════════════════════════════════════════════════
// 3. Pruner
// ════════════════════════════════════════════════════════════════════════════════════════════

// (pruner)

// ════════════════════════════════════════════════════════════════════════════════════════════
// 4. Log & surface
// ════════════════════════════════════════════════════════════════════════════════════════════

// (log)

// ════════════════════════════════════════════════════════════════════════════════════════════
// 5. Ladder
// ════════════════════════════════════════════════════════════════════════════════════════════

// (ladder)

// ════════════════════════════════════════════════════════════════════════════════════════════
// 6. Provider
// ════════════════════════════════════════════════════════════════════════════════════════════

// (provider)

// The only part of dsh.ts that talks to a model: POST {baseURL}/chat/completions with stream: true,
// parse the server-sent events, assemble the assistant message, classify failures, retry the
// transient ones. Web standards only (fetch, streams, TextDecoder, AbortController): it runs
// unchanged in Node, Deno, Bun, workerd and edge runtimes.

// ── 6.0 Configuration ─────────────────────────────────────────────────────────────────────────

/** DeepSeek's OpenAI-compatible endpoint (DESIGN.md §6; api-docs.deepseek.com). */
export const DEEPSEEK_BASE_URL = 'https://api.deepseek.com'
/** The model {@link deepseek} uses when none is given (DESIGN.md §6). */
export const DEEPSEEK_DEFAULT_MODEL = 'deepseek-v4-flash'
/** The environment variable {@link deepseek} reads the API key from when no `apiKey` is given. */
export const DEEPSEEK_API_KEY_ENV = 'DEEPSEEK_API_KEY'
/** Completion budget in tokens when neither the request nor the options set one (DESIGN.md §6). */
export const DEFAULT_MAX_TOKENS = 32_768
/** No progress (response headers or a data event) for this long ends the attempt as TIMEOUT. */
const DEFAULT_IDLE_TIMEOUT_MS = 300_000
/** Retries after the first attempt, for RATE_LIMIT, SERVER, TRANSPORT, TIMEOUT, EMPTY_RESPONSE. */
const DEFAULT_MAX_RETRIES = 5
/** First backoff delay in ms; doubles per retry up to {@link DEFAULT_RETRY_MAX_MS} (DESIGN.md §6). */
const DEFAULT_RETRY_BASE_MS = 500
/** Longest wait between attempts in ms, also the cap on a server's `Retry-After`. */
const DEFAULT_RETRY_MAX_MS = 10_000
/** Backoff delays are multiplied by a random factor in [1 − r, 1 + r] so clients do not stampede. */
const RETRY_JITTER_RATIO = 0.1
/** Largest unterminated SSE line plus event data the adapter buffers, in UTF-16 units. */
const SSE_MAX_BUFFER_UNITS = 16 * 1024 * 1024
/** Error bodies are read for classification up to this many UTF-16 units. */
const ERROR_BODY_MAX_UNITS = 64 * 1024
/** String values longer than this (UTF-16 units) are elided when a non-text block is sent as JSON text. */
const DESCRIBED_STRING_MAX_UNITS = 1024

/** What dsh knows about a model by name: its context window and output cap, in tokens. */
export interface KnownModel {
  /** Context window in tokens (prompt + completion). */
  contextWindow: number
  /** Largest `max_tokens` the model accepts, in tokens; the adapter clamps to it. */
  maxOutputTokens: number
  /** For a retired alias: the model it stands for. The name is still sent as given. */
  aliasOf?: string
  /** For a retired alias: whether it meant thinking mode (informational; nothing extra is sent). */
  thinking?: 'enabled' | 'disabled'
}

/**
 * Known models, by the exact name sent as `model` (DESIGN.md §6, public DeepSeek model cards,
 * 2026). Any other model needs `contextWindow` in the options, or the ladder reports a
 * configuration error once (DESIGN.md §5).
 */
export const KNOWN_MODELS: Readonly<Record<string, Readonly<KnownModel>>> = Object.freeze({
  'deepseek-v4-flash': { contextWindow: 1_048_576, maxOutputTokens: 384_000 },
  'deepseek-v4-pro': { contextWindow: 1_048_576, maxOutputTokens: 384_000 },
  'deepseek-chat': { contextWindow: 1_048_576, maxOutputTokens: 384_000, aliasOf: 'deepseek-v4-flash', thinking: 'disabled' },
  'deepseek-reasoner': { contextWindow: 1_048_576, maxOutputTokens: 384_000, aliasOf: 'deepseek-v4-flash', thinking: 'enabled' },
})

// ── 6.1 Server-sent events ────────────────────────────────────────────────────────────────────
// Spec: WHATWG HTML §9.2 "Server-sent events", https://html.spec.whatwg.org/multipage/server-sent-events.html
// Checked against every case of the eventsource-parser test suite (test/sse.test.ts).

/** One dispatched server-sent event. */
export interface SSEEvent {
  /** The `event` field, or `"message"` when the block had none (or an empty one). */
  event: string
  /** The `data` lines of the block joined with LF. */
  data: string
  /** The `id` field of this event's block, when it had one (as eventsource-parser reports it). */
  id?: string
}

/** Kinds of {@link SSEParseError}. Only `max-buffer-size-exceeded` stops the parser. */
export type SSEParseErrorType = 'unknown-field' | 'invalid-retry' | 'max-buffer-size-exceeded'

/** A problem in an event stream. `line` is the offending line; `field`/`value` its parts. */
export class SSEParseError extends Error {
  readonly type: SSEParseErrorType
  readonly field?: string
  readonly value?: string
  readonly line?: string
  constructor(message: string, init: { type: SSEParseErrorType; field?: string; value?: string; line?: string }) {
    super(message)
    this.name = 'SSEParseError'
    this.type = init.type
    if (init.field !== undefined) this.field = init.field
    if (init.value !== undefined) this.value = init.value
    if (init.line !== undefined) this.line = init.line
  }
}

/** Callbacks and limits of {@link createSSEParser}. */
export interface SSEParserOptions {
  onEvent?: (event: SSEEvent) => void
  /** A comment line (`: text`), with the colon and one following space removed. */
  onComment?: (comment: string) => void
  /** A valid `retry` field: the reconnection time in ms. */
  onRetry?: (ms: number) => void
  /** A block that set `id` was dispatched (called before its event, also for a block with no data). */
  onId?: (id: string) => void
  /** Unknown fields and invalid `retry` values (the line is ignored), and buffer overflow. */
  onError?: (error: SSEParseError) => void
  /**
   * Most UTF-16 units held at once (unterminated line + event data). Beyond it the parser reports
   * `max-buffer-size-exceeded` and throws on every `feed` until `reset()`. Default: unbounded.
   */
  maxBufferSize?: number
}

/** A push parser: `feed` text in any slices; callbacks fire as lines complete. */
export interface SSEParser {
  /** Parses the next slice of the stream (decoded text; chunk boundaries may fall anywhere). */
  feed(text: string): void
  /** Forgets all state. `consume: true` first processes an unterminated last line as a line. */
  reset(options?: { consume?: boolean }): void
}

const SSE_FIELD_PREFIXES = ['data:', 'event:', 'id:', 'retry:']

/**
 * Creates a WHATWG-conformant SSE line parser with eventsource-parser's callback semantics:
 * LF, CRLF and lone CR (also split across chunks) end lines; one leading BOM (decoded U+FEFF or
 * the raw bytes EF BB BF read as Latin-1) is skipped; an event whose blank line never arrives is
 * never dispatched. An unterminated line that can no longer become a valid field (or a comment
 * nobody listens to) is discarded as soon as that is known, without buffering or an error.
 * @throws TypeError when `options` is a function; RangeError for a bad `maxBufferSize`.
 */
export function createSSEParser(options: SSEParserOptions = {}): SSEParser {
  if (typeof options === 'function') {
    throw new TypeError('createSSEParser takes an options object, got a function. Did you mean createSSEParser({ onEvent: fn })?')
  }
  const { onEvent, onComment, onRetry, onId, onError, maxBufferSize } = options
  if (maxBufferSize !== undefined && !(Number.isInteger(maxBufferSize) && maxBufferSize > 0)) {
    throw new RangeError(`createSSEParser: maxBufferSize must be a positive integer (UTF-16 units), got ${String(maxBufferSize)}`)
  }
  // The unterminated line, as fragments joined once when its terminator arrives, because
  // concatenating per chunk is quadratic when one long line arrives in many small chunks.
  let pending: string[] = []
  let pendingUnits = 0
  let pendingKept = false // the pending line's first characters show it is worth keeping
  let discarding = false // skipping the rest of a line that cannot be a valid field
  let skipLF = false // the last chunk ended in CR: an LF starting the next chunk ends nothing new
  let atStart = true
  let terminated = false
  let data = ''
  let dataLines = 0
  let eventType: string | undefined
  let id: string | undefined

  const clearEvent = (): void => { data = ''; dataLines = 0; eventType = undefined; id = undefined }

  function dispatch(): void {
    if (id !== undefined) onId?.(id)
    if (dataLines > 0 && onEvent) {
      const event: SSEEvent = { event: eventType ?? 'message', data }
      if (id !== undefined) event.id = id
      clearEvent()
      onEvent(event)
      return
    }
    clearEvent()
  }

  function processLine(line: string): void {
    if (line.length === 0) return dispatch()
    const colon = line.indexOf(':')
    if (colon === 0) {
      onComment?.(line.slice(line.charCodeAt(1) === 32 ? 2 : 1))
      return
    }
    const field = colon < 0 ? line : line.slice(0, colon)
    const value = colon < 0 ? '' : line.slice(line.charCodeAt(colon + 1) === 32 ? colon + 2 : colon + 1)
    switch (field) {
      case 'data': data = dataLines === 0 ? value : `${data}\n${value}`; dataLines++; break
      case 'event': eventType = value || undefined; break
      case 'id': if (!value.includes('\0')) id = value; break // WHATWG: an id with NUL is ignored
      case 'retry':
        if (/^[0-9]+$/.test(value)) onRetry?.(parseInt(value, 10))
        else onError?.(new SSEParseError(`Invalid \`retry\` value: "${value}"`, { type: 'invalid-retry', value, line }))
        break
      default:
        onError?.(new SSEParseError(`Unknown field "${field.length > 20 ? `${field.slice(0, 20)}…` : field}"`, { type: 'unknown-field', field, value, line }))
    }
  }

  /** true: keep; false: discard; undefined: too short to tell (under 6 units, so cheap to re-check). */
  function worthKeeping(head: string): boolean | undefined {
    if (head.charCodeAt(0) === 58) return onComment !== undefined
    for (const prefix of SSE_FIELD_PREFIXES) {
      if (head.length >= prefix.length ? head.startsWith(prefix) : prefix.startsWith(head)) return head.length >= prefix.length ? true : undefined
    }
    return false
  }

  function checkBuffer(): void {
    if (maxBufferSize === undefined || pendingUnits + data.length <= maxBufferSize) return
    terminated = true
    pending = []; pendingUnits = 0; pendingKept = false; discarding = false
    clearEvent()
    onError?.(new SSEParseError(`Buffered data exceeded max buffer size of ${maxBufferSize} characters`, { type: 'max-buffer-size-exceeded' }))
  }

  function feed(chunk: string): void {
    if (terminated) throw new Error('Cannot feed parser: it was terminated after exceeding the configured max buffer size. Call `reset()` to resume parsing.')
    if (typeof chunk !== 'string') throw new TypeError(`SSEParser.feed takes decoded text, got ${typeof chunk}; decode bytes with a streaming TextDecoder first (or use parseSSE)`)
    const n = chunk.length
    if (n === 0) return
    let i = 0
    if (atStart) {
      atStart = false
      if (chunk.charCodeAt(0) === 0xfeff) i = 1
      else if (chunk.startsWith('\u00ef\u00bb\u00bf')) i = 3
    }
    if (skipLF) {
      skipLF = false
      if (chunk.charCodeAt(i) === 10) i++
    }
    // Positions of the next LF and CR, refreshed only when passed: one scan per chunk, not per line.
    let lf = chunk.indexOf('\n', i)
    let cr = chunk.indexOf('\r', i)
    const afterTerminator = (t: number): number => {
      if (chunk.charCodeAt(t) !== 13) return t + 1
      if (t + 1 < n) return chunk.charCodeAt(t + 1) === 10 ? t + 2 : t + 1
      skipLF = true
      return t + 1
    }
    if (discarding) {
      const t = lf < 0 ? cr : cr < 0 ? lf : Math.min(lf, cr)
      if (t < 0) return
      discarding = false
      i = afterTerminator(t)
    }
    while (i < n) {
      if (lf >= 0 && lf < i) lf = chunk.indexOf('\n', i)
      if (cr >= 0 && cr < i) cr = chunk.indexOf('\r', i)
      const t = lf < 0 ? cr : cr < 0 ? lf : Math.min(lf, cr)
      if (t < 0) break
      let line = chunk.slice(i, t)
      if (pending.length > 0) {
        pending.push(line)
        line = pending.join('')
        pending = []; pendingUnits = 0; pendingKept = false
      }
      i = afterTerminator(t)
      processLine(line)
    }
    if (i < n) {
      pending.push(i === 0 ? chunk : chunk.slice(i))
      pendingUnits += n - i
      if (!pendingKept) {
        const keep = worthKeeping((pending.length === 1 ? pending[0] : pending.join('')).slice(0, 6))
        if (keep === false) { pending = []; pendingUnits = 0; discarding = true }
        else if (keep === true) pendingKept = true
      }
    }
    checkBuffer()
  }

  function reset(resetOptions: { consume?: boolean } = {}): void {
    if (resetOptions.consume && pending.length > 0 && !discarding) processLine(pending.join(''))
    pending = []; pendingUnits = 0; pendingKept = false; discarding = false
    skipLF = false; atStart = true; terminated = false
    clearEvent()
  }

  return { feed, reset }
}

/**
 * Parses a server-sent event stream into its events (WHATWG rules, via {@link createSSEParser}).
 * Bytes are decoded as UTF-8 with a streaming decoder, so a character split across chunks is
 * intact; strings are taken as already decoded. Comments, `retry` and malformed lines are
 * skipped. Stopping the iteration early cancels a `ReadableStream` source.
 * @param source a `ReadableStream<Uint8Array>` (e.g. `response.body`) or an async iterable of
 *   `Uint8Array | string` chunks.
 * @param options.maxBufferSize see {@link SSEParserOptions.maxBufferSize} (UTF-16 units).
 * @throws SSEParseError (`max-buffer-size-exceeded`) when the limit is passed; TypeError for a bad source.
 */
export async function* parseSSE(
  source: ReadableStream<Uint8Array> | AsyncIterable<Uint8Array | string>,
  options: { maxBufferSize?: number } = {},
): AsyncGenerator<SSEEvent, void, undefined> {
  const ready: SSEEvent[] = []
  let overflow: SSEParseError | undefined
  const parser = createSSEParser({
    onEvent: (event) => { ready.push(event) },
    onError: (error) => { if (error.type === 'max-buffer-size-exceeded') overflow = error },
    maxBufferSize: options.maxBufferSize,
  })
  // ignoreBOM: the parser skips exactly one leading BOM itself (WHATWG); a decoder that also
  // stripped one would eat a second, which is data.
  const decoder = new TextDecoder('utf-8', { ignoreBOM: true })
  for await (const chunk of sseChunks(source)) {
    parser.feed(typeof chunk === 'string' ? chunk : decoder.decode(chunk, { stream: true }))
    if (overflow) throw overflow
    for (let k = 0; k < ready.length; k++) yield ready[k]
    ready.length = 0
  }
  parser.feed(decoder.decode())
  if (overflow) throw overflow
  yield* ready
}

async function* sseChunks(source: unknown): AsyncGenerator<Uint8Array | string, void, undefined> {
  if (source !== null && typeof source === 'object' && typeof (source as ReadableStream).getReader === 'function') {
    const reader = (source as ReadableStream<Uint8Array>).getReader()
    let finished = false
    try {
      for (;;) {
        const { done, value } = await reader.read()
        if (done) { finished = true; return }
        yield value
      }
    } finally {
      // Stopped early (consumer broke out or an error): close the connection behind the stream.
      if (!finished) reader.cancel().catch(() => {})
    }
  }
  if (source !== null && typeof source === 'object' && (Symbol.asyncIterator in source || Symbol.iterator in source)) {
    yield* source as AsyncIterable<Uint8Array | string>
    return
  }
  throw new TypeError(`parseSSE needs a ReadableStream<Uint8Array> or an AsyncIterable of Uint8Array | string, got ${source === null ? 'null' : typeof source}`)
}

// ── 6.2 Error classification ──────────────────────────────────────────────────────────────────

/** HTTP statuses and in-stream error codes are read from these keys of an error body. */
const ERROR_STATUS_KEYS = new Set(['code', 'status', 'status_code', 'statusCode'])
/** Keys whose values describe an error; everything else (e.g. Groq's `failed_generation`, model output) is not read. */
const ERROR_TEXT_KEYS = new Set([
  'error', 'errors', 'message', 'msg', 'detail', 'details', 'type', 'code', 'status', 'status_code', 'statusCode',
  'reason', 'raw', 'metadata', 'title', 'description', 'error_description',
])
/** Keys whose string value is the human-readable message, in order of preference as met. */
const ERROR_MESSAGE_KEYS = new Set(['message', 'msg', 'detail', 'error', 'raw', 'description', 'error_description'])

/**
 * Rate limits, checked BEFORE the overflow patterns: their messages talk about tokens and "reduce
 * the prompt length" too (OpenAI/Groq TPM "Request too large", Anthropic input-TPM 429), and a
 * rate limit is never an overflow (DESIGN.md §6).
 */
const RATE_LIMIT_RE = /rate[ _-]?limit|too many requests|tokens per min|requests per min|\b(?:TPM|RPM|TPD|RPD)\b|per[ -]minute|resource[_ ]exhausted/i

/** Context-window overflow wordings, one per line with the servers known to use it. */
const OVERFLOW_PATTERNS: readonly RegExp[] = [
  /context[_ ]length[_ ]exceeded/i, // OpenAI, Groq, OpenRouter code `context_length_exceeded`
  /exceed_context_size/i, // llama.cpp server `exceed_context_size_error`
  /max(?:imum)? context length/i, // DeepSeek, OpenAI, vLLM, OpenRouter, Mistral, Ollama ("exceeded max context length")
  /\bexceed(?:s|ed)?\b[^.]{0,60}?\bcontext (?:window|length|size|limit)/i, // llama.cpp, OpenAI (new), Anthropic, Ollama
  /\bcontext (?:window|length|size|limit)\b[^.]{0,40}?\bexceed/i, // MiniMax, generic "context window exceeded"
  /\b(?:prompt|input) (?:is )?too long\b/i, // Anthropic "prompt is too long", Bedrock "Input is too long", Fireworks
  /input token count[^.]{0,60}?exceeds the maximum number of tokens/i, // Gemini
  /maximum prompt length/i, // xAI
  /\btokens? \+ `?max_new_tokens`? must be <=/i, // Hugging Face TGI (Together, Inference Endpoints)
  /exceeded model token limit/i, // Moonshot / Kimi
  /greater than the context length|context the overflows|context length of only/i, // LM Studio
  /total number of tokens in the prompt cannot exceed/i, // Cohere
  /range of input length should be/i, // Alibaba DashScope / Qwen
  /prompt exceeds max length/i, // Zhipu GLM
  /reduce the length of the messages/i, // OpenAI, Groq (the "no numbers" form)
  /max_tokens must be at least 1, got -\d/i, // vLLM: a negative room means the prompt alone overflows
]

/** Out of balance or quota (not retried: only money helps). */
const QUOTA_RE = /insufficient[_ ]?(?:balance|quota|credits?|funds)|exceeded your current quota|billing|credit balance|payment required|out of credits|not enough credits/i
/** Authentication and permission wording, used when no HTTP status says so. */
const AUTH_RE = /authenticat|unauthori[sz]ed|invalid[_ ]api[_ ]key|incorrect api key|permission[_ ]denied|permission_error|forbidden/i
/** Server-side trouble, used when no HTTP status says so (errors inside a 200 stream). */
const SERVER_RE = /overloaded|server[_ ]error|internal|unavailable|bad gateway|api_error|timed? ?out/i
/** Request-side trouble, used when no HTTP status says so. */
const INVALID_RE = /invalid|bad[_ ]request|not[_ ]found|unsupported|tool_use_failed|must be|missing|not allowed/i

interface ErrorBodyInfo {
  /** The error-describing strings of the body joined by LF (or the raw text when not JSON). */
  haystack: string
  /** The first human-readable message found. */
  message?: string
  /** A numeric HTTP-like status embedded in the body (`code: 400`, `status_code: 429`, …). */
  status?: number
  /** The body held JSON (or SSE data lines with JSON). */
  parsed: boolean
  /** The body was empty or whitespace only. */
  blank: boolean
}

function isRecord(value: unknown): value is Record<string, any> {
  return value !== null && typeof value === 'object' && !Array.isArray(value)
}

function parseJSONOrUndefined(text: string): unknown {
  try { return JSON.parse(text) } catch { return undefined }
}

const isErrorStatus = (status: unknown): status is number => typeof status === 'number' && Number.isInteger(status) && status >= 400 && status <= 599

/** Reads what an error body says, whatever its shape (DESIGN.md §6). Never throws on strings. */
function inspectErrorBody(bodyText: string): ErrorBodyInfo {
  const text = bodyText.length > ERROR_BODY_MAX_UNITS ? bodyText.slice(0, ERROR_BODY_MAX_UNITS) : bodyText
  const trimmed = text.trim()
  const info: ErrorBodyInfo = { haystack: '', parsed: false, blank: trimmed === '' }
  const payloads: unknown[] = []
  if (/^(?:data|event):/m.test(trimmed) && trimmed[0] !== '{' && trimmed[0] !== '[') {
    // An SSE excerpt (e.g. `event: error` + `data: {...}`): read its data lines.
    for (const match of trimmed.matchAll(/^data:[ ]?(.*)$/gm)) {
      const value = parseJSONOrUndefined(match[1])
      if (value !== undefined) payloads.push(value)
    }
  } else if (trimmed !== '') {
    const value = parseJSONOrUndefined(trimmed)
    if (value !== undefined) payloads.push(value)
  }
  if (payloads.length === 0) {
    info.haystack = text
    const firstLine = trimmed.split(/\r\n|\r|\n/, 1)[0]
    if (firstLine) info.message = firstLine.length > 500 ? `${firstLine.slice(0, 500)}…` : firstLine
    return info
  }
  info.parsed = true
  const strings: string[] = []
  const collect = (value: unknown, depth: number, key: string | undefined): void => {
    if (depth > 8) return
    if (typeof value === 'string') {
      const start = value.trimStart()[0]
      // Wrapped errors: a proxy that puts the upstream JSON body into its message (Gemini CLI,
      // double-encoded bodies) — read the inner JSON as well.
      const nested = start === '{' || start === '[' || start === '"' ? parseJSONOrUndefined(value) : undefined
      if (nested !== undefined && typeof nested !== 'number' && typeof nested !== 'boolean') return collect(nested, depth + 1, key)
      strings.push(value)
      if (info.message === undefined && value.trim() !== '' && (key === undefined || ERROR_MESSAGE_KEYS.has(key))) info.message = value.trim()
      return
    }
    if (typeof value === 'number') {
      if (key !== undefined && ERROR_STATUS_KEYS.has(key) && info.status === undefined && isErrorStatus(value)) info.status = value
      return
    }
    if (Array.isArray(value)) {
      for (const item of value) collect(item, depth + 1, key)
      return
    }
    if (isRecord(value)) {
      for (const k of Object.keys(value)) if (ERROR_TEXT_KEYS.has(k)) collect(value[k], depth + 1, k)
    }
  }
  for (const payload of payloads) collect(payload, 0, undefined)
  info.haystack = strings.join('\n')
  if (info.message && info.message.length > 500) info.message = `${info.message.slice(0, 500)}…`
  return info
}

/**
 * Maps a failed response to a {@link ProviderErrorCode} (DESIGN.md §6). Never throws, whatever
 * it is given. The body may be JSON (`{"error":{...}}`, an array of such objects, `{"error":
 * "text"}`, a top-level `{"object":"error", …}`, a body double-encoded as a JSON string, a proxy
 * message wrapping the upstream JSON), an SSE excerpt, plain text, or empty.
 *
 * Order: 429 or rate-limit wording → RATE_LIMIT (a rate limit is never an overflow, whatever it
 * says about tokens); overflow wording of DeepSeek, OpenAI, Anthropic, OpenRouter, Gemini,
 * Mistral, Groq, vLLM, llama.cpp, LM Studio, Ollama, xAI, Cohere, Moonshot, Qwen, GLM, TGI →
 * CONTEXT_WINDOW_EXCEEDED (also on a 5xx: proxies wrap overflows); 402 or balance wording → QUOTA;
 * 401/403 → AUTH; 408 → TIMEOUT; a bare 413 → CONTEXT_WINDOW_EXCEEDED (the request is too big;
 * shrinking it is the cure); other 4xx → INVALID_REQUEST (an output-cap error like "max_tokens:
 * 300000 > 128000" lands here); 5xx → SERVER.
 *
 * Errors inside a 200 stream: pass `status` 200 (or undefined). Then a numeric `code`, `status`
 * or `status_code` in the body stands in for the HTTP status; without one the wording decides
 * (AUTH, SERVER, INVALID_REQUEST; SERVER when nothing matches), an empty body is EMPTY_RESPONSE
 * and a non-JSON body MALFORMED_RESPONSE.
 * @param status HTTP status, or 200/undefined for an in-stream error.
 * @param bodyText the response body (or the in-stream `data:` payload) as text.
 */
export function classifyProviderError(status: number | undefined, bodyText: string): ProviderErrorCode {
  try {
    const info = inspectErrorBody(typeof bodyText === 'string' ? bodyText : bodyText == null ? '' : String(bodyText))
    const s = isErrorStatus(status) ? status : info.status
    const h = info.haystack
    if (s === 429 || RATE_LIMIT_RE.test(h)) return 'RATE_LIMIT'
    if (OVERFLOW_PATTERNS.some((re) => re.test(h))) return 'CONTEXT_WINDOW_EXCEEDED'
    if (s === 402 || QUOTA_RE.test(h)) return 'QUOTA'
    if (s === 401 || s === 403) return 'AUTH'
    if (s === 408) return 'TIMEOUT'
    if (s === 413) return 'CONTEXT_WINDOW_EXCEEDED'
    if (s !== undefined) return s < 500 ? 'INVALID_REQUEST' : 'SERVER'
    if (info.blank) return 'EMPTY_RESPONSE'
    if (AUTH_RE.test(h)) return 'AUTH'
    if (SERVER_RE.test(h)) return 'SERVER'
    if (INVALID_RE.test(h)) return 'INVALID_REQUEST'
    return info.parsed ? 'SERVER' : 'MALFORMED_RESPONSE'
  } catch {
    return isErrorStatus(status) && status < 500 ? 'INVALID_REQUEST' : 'SERVER'
  }
}

/** What to do about each code, appended to error messages (DESIGN.md: name the fix). */
const ERROR_HINTS: Readonly<Record<ProviderErrorCode, string>> = {
  CONTEXT_WINDOW_EXCEEDED: 'The prompt does not fit the context window: prune or compact the session, or lower maxTokens.',
  RATE_LIMIT: 'Rate limited: wait, send fewer or smaller requests, or raise the account limits.',
  QUOTA: 'The account has no balance or quota left: top it up or use another API key.',
  AUTH: 'Check the API key (option apiKey, or the environment variable named by apiKeyEnv) and its permissions.',
  INVALID_REQUEST: 'The server rejected the request; the body above names the field.',
  SERVER: 'The server failed; try again later.',
  TRANSPORT: 'Check the network and baseURL.',
  TIMEOUT: 'Raise idleTimeoutMs if the model needs longer before its first token.',
  ABORTED: 'The caller aborted the request.',
  EMPTY_RESPONSE: 'The server answered with nothing; try again later.',
  MALFORMED_RESPONSE: 'The server does not speak the OpenAI chat-completions stream format; check baseURL.',
}

/** Seconds, an HTTP date, or OpenAI's `retry-after-ms`, in ms (RFC 9110 §10.2.3). */
function parseRetryAfterMs(headers: Headers, nowMs: number): number | undefined {
  const ms = headers.get('retry-after-ms')?.trim()
  if (ms && /^\d+(?:\.\d+)?$/.test(ms)) return Math.ceil(parseFloat(ms))
  const value = headers.get('retry-after')?.trim()
  if (!value) return undefined
  if (/^\d+(?:\.\d+)?$/.test(value)) return Math.ceil(parseFloat(value) * 1000)
  const date = Date.parse(value)
  return Number.isNaN(date) ? undefined : Math.max(0, date - nowMs)
}

/** Response headers that carry a request id support can trace, in order of preference. */
const REQUEST_ID_HEADERS = ['x-request-id', 'request-id', 'x-ds-trace-id', 'x-trace-id', 'x-amzn-requestid', 'cf-ray']

function requestIdOf(headers: Headers): string | undefined {
  for (const name of REQUEST_ID_HEADERS) {
    const value = headers.get(name)
    if (value) return value
  }
  return undefined
}

/**
 * "Request too large … tokens per minute": one request bigger than the per-minute budget, sent
 * as 413 (Groq) or 429 (OpenAI). Retrying can never succeed, so it is not retried.
 */
function requestExceedsRateLimit(body: string): boolean {
  return /request too large/i.test(body) && RATE_LIMIT_RE.test(body)
}

// ── 6.3 Messages on the wire (OpenAI chat-completions shape) ──────────────────────────────────

type WirePart = { type: 'text'; text: string } | { type: 'image_url'; image_url: { url: string } }
type WireMessage =
  | { role: 'system'; content: string }
  | { role: 'user'; content: string | WirePart[] }
  | { role: 'assistant'; content: string; reasoning_content?: string; tool_calls?: WireToolCall[] }
  | { role: 'tool'; tool_call_id: string; content: string }
interface WireToolCall { id: string; type: 'function'; function: { name: string; arguments: string } }

const LONE_SURROGATE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/
const LONE_SURROGATES = new RegExp(LONE_SURROGATE.source, 'g')

/** Lone surrogates become U+FFFD (servers reject or mangle them in UTF-8); the log keeps the original. */
function wellFormed(text: string): string {
  const s = text as string & { isWellFormed?: () => boolean; toWellFormed?: () => string }
  if (typeof s.isWellFormed === 'function') return s.isWellFormed() ? text : s.toWellFormed!()
  return LONE_SURROGATE.test(text) ? text.replace(LONE_SURROGATES, '\uFFFD') : text
}

/** JSON.stringify replacer: every outgoing string, object keys included, is sent well-formed. */
function wireReplacer(_key: string, value: unknown): unknown {
  if (typeof value === 'string') return wellFormed(value)
  if (isRecord(value)) {
    for (const k of Object.keys(value)) {
      if (wellFormed(k) !== k) return Object.fromEntries(Object.entries(value).map(([key, v]) => [wellFormed(key), v]))
    }
  }
  return value
}

/** A non-text block as JSON text; long strings (base64 images) are elided, not sent as text. */
function describeBlock(block: Block): string {
  return JSON.stringify(block, (_key, value: unknown) =>
    typeof value === 'string' && value.length > DESCRIBED_STRING_MAX_UNITS ? `[${value.length} characters omitted]` : value)
}

/** An image block's URL: `url`, `image_url`, `source.url`, or base64 `data` + MIME type → data: URL. */
function imageURLOf(block: Block): string | undefined {
  const b = block as Record<string, any>
  if (typeof b.url === 'string') return b.url
  if (typeof b.image_url === 'string') return b.image_url
  if (isRecord(b.image_url) && typeof b.image_url.url === 'string') return b.image_url.url
  const source = isRecord(b.source) ? b.source : {}
  if (typeof source.url === 'string') return source.url
  const data = b.data ?? source.data
  const mime = b.mimeType ?? b.mediaType ?? b.mime_type ?? b.media_type ?? source.media_type
  return typeof data === 'string' && typeof mime === 'string' ? `data:${mime};base64,${data}` : undefined
}

/** Text blocks as they are, anything else as JSON text, in block order, joined by LF. */
function blocksToText(blocks: readonly Block[]): string {
  return blocks.map((b) => (b.type === 'text' ? (b as TextBlock).text : describeBlock(b))).join('\n')
}

function userToWire(message: UserMessage): WireMessage {
  if (typeof message.content === 'string') return { role: 'user', content: message.content }
  const blocks = message.content
  if (!blocks.some((b) => b.type === 'image')) return { role: 'user', content: blocksToText(blocks) }
  return {
    role: 'user',
    content: blocks.map((b): WirePart => {
      if (b.type === 'text') return { type: 'text', text: (b as TextBlock).text }
      const url = b.type === 'image' ? imageURLOf(b) : undefined
      return url !== undefined ? { type: 'image_url', image_url: { url } } : { type: 'text', text: describeBlock(b) }
    }),
  }
}

/**
 * DESIGN.md §6: `content` is never null ("" when there is no text); a message with tool calls
 * carries `reasoning_content` (its reasoning, or "" — DeepSeek's thinking mode rejects it
 * otherwise). Text and reasoning blocks are concatenated as streamed; other blocks follow the
 * text as JSON.
 */
function assistantToWire(message: AssistantMessage): WireMessage {
  let text = ''
  let reasoning = ''
  const toolCalls: WireToolCall[] = []
  for (const b of message.content) {
    if (b.type === 'text') text += (b as TextBlock).text
    else if (b.type === 'reasoning') reasoning += (b as ReasoningBlock).text
    else if (b.type === 'tool-call') {
      const call = b as ToolCallBlock
      // A call streamed with no arguments at all is sent as an empty object: servers JSON-parse it.
      toolCalls.push({ id: call.id, type: 'function', function: { name: call.name, arguments: call.arguments.trim() === '' ? '{}' : call.arguments } })
    } else text += (text ? '\n' : '') + describeBlock(b)
  }
  if (toolCalls.length === 0) return { role: 'assistant', content: text }
  return { role: 'assistant', content: text, reasoning_content: reasoning, tool_calls: toolCalls }
}

function toWire(message: Message): WireMessage {
  if (message.role === 'user') return userToWire(message)
  if (message.role === 'assistant') return assistantToWire(message)
  if (message.role === 'tool') return { role: 'tool', tool_call_id: message.toolCallId, content: blocksToText(message.content) }
  throw new TypeError(`unknown message role ${JSON.stringify((message as { role?: unknown }).role)}; expected 'user', 'assistant' or 'tool'`)
}

/**
 * The request's messages in wire shape. Order is kept, except that every tool result is moved
 * right behind the nearest earlier assistant message that made its call (matched by id): the
 * session may legally hold A-call, B-call, A-result, B-result, but chat-completions servers
 * require each call's results to follow it directly. Results of the same call keep log order.
 */
function toWireMessages(system: string | undefined, messages: readonly Message[]): WireMessage[] {
  const out: WireMessage[] = []
  if (system) out.push({ role: 'system', content: system })
  const callOwner = new Map<string, number>() // call id → index of the latest assistant message that made it
  const resultsOf = new Map<number, number[]>() // assistant index → indices of its results
  const moved = new Set<number>()
  messages.forEach((m, i) => {
    if (m.role === 'assistant') {
      for (const b of m.content) if (b.type === 'tool-call') callOwner.set((b as ToolCallBlock).id, i)
    } else if (m.role === 'tool') {
      const owner = callOwner.get(m.toolCallId)
      if (owner === undefined) return
      moved.add(i)
      const list = resultsOf.get(owner)
      if (list) list.push(i)
      else resultsOf.set(owner, [i])
    }
  })
  messages.forEach((m, i) => {
    if (moved.has(i)) return
    out.push(toWire(m))
    for (const j of resultsOf.get(i) ?? []) out.push(toWire(messages[j]))
  })
  return out
}

/**
 * Heuristic prompt size in tokens (DESIGN.md §2): ceil(chars/4) + 8 per message and per envelope
 * part. Local copy of section 2's formula until estimateMessageTokens/estimateEnvelopeTokens land.
 */
function estimatePromptTokens(request: ChatRequest): number {
  const text = (s: string): number => Math.ceil(s.length / 4)
  let tokens = 0
  if (request.system) tokens += text(request.system) + 8
  if (request.tools && request.tools.length > 0) tokens += text(JSON.stringify(request.tools)) + 8
  for (const m of request.messages) {
    if (typeof m.content === 'string') { tokens += text(m.content) + 8; continue }
    let chars = 0
    for (const b of m.content) {
      if (b.type === 'text' || b.type === 'reasoning') chars += (b as TextBlock).text.length
      else if (b.type === 'tool-call') chars += (b as ToolCallBlock).name.length + (b as ToolCallBlock).arguments.length
      else tokens += text(JSON.stringify(b))
    }
    tokens += Math.ceil(chars / 4) + 8
  }
  return tokens
}

// ── 6.4 The adapter ───────────────────────────────────────────────────────────────────────────

/** Options of {@link openAICompatible}. Times in ms, budgets in tokens. */
export interface OpenAICompatibleOptions {
  /** Server root; the adapter POSTs to `{baseURL}/chat/completions`. E.g. `https://api.openai.com/v1`. */
  baseURL: string
  /** Sent as `Authorization: Bearer …`. Takes precedence over `apiKeyEnv`. Never appears in errors. */
  apiKey?: string
  /** Name of an environment variable holding the key (read once, guarded: absent or denied env is an error naming it). */
  apiKeyEnv?: string
  /** Model name sent as `model`. */
  model: string
  /** Context window in tokens. Default: {@link KNOWN_MODELS}, else unknown (no clamping, no preflight). */
  contextWindow?: number
  /** Completion budget in tokens when a request sets none. Default {@link DEFAULT_MAX_TOKENS}; always clamped. */
  maxTokens?: number
  /** Body field for the budget: `max_tokens` (default) or `max_completion_tokens` (OpenAI reasoning models). */
  maxTokensField?: 'max_tokens' | 'max_completion_tokens'
  /** Extra HTTP headers on every request (a request's own `headers` win). */
  headers?: Record<string, string>
  /** Replacement for `globalThis.fetch` (proxies, tests). */
  fetch?: (input: string, init: RequestInit) => Promise<Response>
  /** An attempt with no progress (headers or a data event; keep-alive comments do not count) for this long fails as TIMEOUT. Default 300,000. */
  idleTimeoutMs?: number
  /** Retries after the first attempt for RATE_LIMIT, SERVER, TRANSPORT, TIMEOUT, EMPTY_RESPONSE. Default 5. */
  maxRetries?: number
  /** First backoff delay; doubles per retry. Default 500. */
  retryBaseMs?: number
  /** Longest backoff delay, and the cap on `Retry-After`. Default 10,000. */
  retryMaxMs?: number
  /** Sends `thinking: {type: "enabled" | "disabled"}` (DeepSeek V4). Default: not sent (server default). */
  thinking?: boolean | 'enabled' | 'disabled'
  /** Sends `reasoning_effort` (DeepSeek V4, OpenAI reasoning models). */
  reasoningEffort?: string
  /** Extra body fields (e.g. `temperature`); the adapter's own fields win. */
  extraBody?: Record<string, unknown>
  /** Waits between retries (tests pass a fake clock). Must reject when `signal` aborts. */
  sleep?: (ms: number, signal?: AbortSignal) => Promise<void>
}

const OPTION_NAMES: readonly (keyof OpenAICompatibleOptions)[] = [
  'baseURL', 'apiKey', 'apiKeyEnv', 'model', 'contextWindow', 'maxTokens', 'maxTokensField', 'headers', 'fetch',
  'idleTimeoutMs', 'maxRetries', 'retryBaseMs', 'retryMaxMs', 'thinking', 'reasoningEffort', 'extraBody', 'sleep',
]

interface AdapterConfig {
  baseURL: string
  endpoint: string
  model: string
  apiKey?: string
  contextWindow?: number
  maxOutputTokens?: number
  maxTokens: number
  maxTokensField: 'max_tokens' | 'max_completion_tokens'
  headers: Record<string, string>
  fetch: (input: string, init: RequestInit) => Promise<Response>
  idleTimeoutMs: number
  maxRetries: number
  retryBaseMs: number
  retryMaxMs: number
  thinking?: 'enabled' | 'disabled'
  reasoningEffort?: string
  extraBody: Record<string, unknown>
  sleep: (ms: number, signal?: AbortSignal) => Promise<void>
}

/** Reads an environment variable where one exists; edge runtimes have none, Deno may deny access. */
function readEnv(name: string): string | undefined {
  try {
    const value = (globalThis as { process?: { env?: Record<string, string | undefined> } }).process?.env?.[name]
    if (typeof value === 'string') return value
  } catch { /* access denied */ }
  try {
    const value = (globalThis as { Deno?: { env?: { get(name: string): string | undefined } } }).Deno?.env?.get(name)
    if (typeof value === 'string') return value
  } catch { /* --allow-env not granted */ }
  return undefined
}

function sleepMs(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason)
    const onAbort = (): void => { clearTimeout(timer); reject(signal!.reason) }
    const timer = setTimeout(() => { signal?.removeEventListener('abort', onAbort); resolve() }, ms)
    signal?.addEventListener('abort', onAbort, { once: true })
  })
}

function positiveInteger(fn: string, name: string, value: unknown, allowZero = false): number | undefined {
  if (value === undefined) return undefined
  if (typeof value !== 'number' || !Number.isInteger(value) || value < (allowZero ? 0 : 1)) {
    throw new TypeError(`${fn}: ${name} must be ${allowZero ? 'a non-negative' : 'a positive'} integer, got ${JSON.stringify(value)}`)
  }
  return value
}

function resolveConfig(fn: string, options: OpenAICompatibleOptions, requireKeyFrom?: string): AdapterConfig {
  if (!isRecord(options)) throw new TypeError(`${fn} takes an options object, got ${options === null ? 'null' : typeof options}`)
  for (const key of Object.keys(options)) {
    if (!(OPTION_NAMES as readonly string[]).includes(key)) throw new TypeError(`${fn}: unknown option "${key}"; known options: ${OPTION_NAMES.join(', ')}`)
  }
  const { baseURL, model } = options
  let url: URL
  try { url = new URL(String(baseURL)) } catch { throw new TypeError(`${fn}: baseURL must be an absolute http(s) URL such as https://api.deepseek.com, got ${JSON.stringify(baseURL)}`) }
  if (url.protocol !== 'http:' && url.protocol !== 'https:') throw new TypeError(`${fn}: baseURL must use http or https, got ${JSON.stringify(baseURL)}`)
  if (typeof model !== 'string' || model.trim() === '') throw new TypeError(`${fn}: model must be a non-empty string, got ${JSON.stringify(model)}`)
  let apiKey = options.apiKey === '' ? undefined : options.apiKey
  if (apiKey !== undefined && typeof apiKey !== 'string') throw new TypeError(`${fn}: apiKey must be a string`)
  const envName = apiKey === undefined ? (options.apiKeyEnv ?? requireKeyFrom) : undefined
  if (envName !== undefined) {
    apiKey = readEnv(envName) || undefined
    if (apiKey === undefined) {
      throw new TypeError(`${fn}: no API key: the environment variable ${envName} is not set or not readable in this runtime (Deno needs --allow-env=${envName}); set it or pass { apiKey }`)
    }
  }
  const known = Object.prototype.hasOwnProperty.call(KNOWN_MODELS, model) ? KNOWN_MODELS[model] : undefined
  const thinking = options.thinking === undefined ? undefined : options.thinking === true || options.thinking === 'enabled' ? 'enabled' : options.thinking === false || options.thinking === 'disabled' ? 'disabled' : undefined
  if (options.thinking !== undefined && thinking === undefined) throw new TypeError(`${fn}: thinking must be true, false, 'enabled' or 'disabled', got ${JSON.stringify(options.thinking)}`)
  if (options.maxTokensField !== undefined && options.maxTokensField !== 'max_tokens' && options.maxTokensField !== 'max_completion_tokens') {
    throw new TypeError(`${fn}: maxTokensField must be 'max_tokens' or 'max_completion_tokens', got ${JSON.stringify(options.maxTokensField)}`)
  }
  const baseURLText = String(baseURL).replace(/\/+$/, '')
  const fetchImpl = options.fetch ?? ((input: string, init: RequestInit) => globalThis.fetch(input, init)) // unbound fetch throws "Illegal invocation" in workerd
  if (typeof fetchImpl !== 'function') throw new TypeError(`${fn}: fetch must be a function`)
  return {
    baseURL: baseURLText,
    endpoint: `${baseURLText}/chat/completions`,
    model,
    apiKey,
    contextWindow: positiveInteger(fn, 'contextWindow', options.contextWindow) ?? known?.contextWindow,
    maxOutputTokens: known?.maxOutputTokens,
    maxTokens: positiveInteger(fn, 'maxTokens', options.maxTokens) ?? DEFAULT_MAX_TOKENS,
    maxTokensField: options.maxTokensField ?? 'max_tokens',
    headers: { ...(options.headers ?? {}) },
    fetch: fetchImpl,
    idleTimeoutMs: positiveInteger(fn, 'idleTimeoutMs', options.idleTimeoutMs) ?? DEFAULT_IDLE_TIMEOUT_MS,
    maxRetries: positiveInteger(fn, 'maxRetries', options.maxRetries, true) ?? DEFAULT_MAX_RETRIES,
    retryBaseMs: positiveInteger(fn, 'retryBaseMs', options.retryBaseMs, true) ?? DEFAULT_RETRY_BASE_MS,
    retryMaxMs: positiveInteger(fn, 'retryMaxMs', options.retryMaxMs, true) ?? DEFAULT_RETRY_MAX_MS,
    thinking,
    reasoningEffort: options.reasoningEffort,
    extraBody: { ...(options.extraBody ?? {}) },
    sleep: options.sleep ?? sleepMs,
  }
}

/**
 * A {@link Provider} for any server that speaks OpenAI chat completions with streaming (DESIGN.md
 * §6): DeepSeek, OpenAI, OpenRouter, Ollama, vLLM, llama.cpp, LM Studio, …
 *
 * Each `complete()` streams one completion (`stream: true`, `stream_options.include_usage`),
 * reports progress through `request.onEvent` (text, reasoning and tool-call deltas — tool-call
 * `index` is the call's position in the final message — then usage, then finish) and returns the
 * assembled assistant message with usage. `max_tokens` is the smaller of the request's (or the
 * default) budget, the model's output cap, and the room the window leaves after the prompt
 * estimate; with a known window and no room left it throws CONTEXT_WINDOW_EXCEEDED before sending.
 *
 * Failures are {@link ProviderError}s. RATE_LIMIT, SERVER, TRANSPORT, TIMEOUT and EMPTY_RESPONSE
 * are retried (`maxRetries`, exponential backoff with ±10% jitter, `Retry-After` honoured up to
 * `retryMaxMs`, a `{type:'retry'}` event before each wait), but never once output was streamed —
 * then the error carries `partial` (text and reasoning so far, `interrupted: true`; tool calls
 * are dropped since their arguments may be cut). A "request too large for the per-minute
 * budget" rate limit is not retried (it can never pass). ABORTED (the request's signal) ends at
 * once, also during a backoff wait, and is never retried. The API key never appears in an error.
 * @throws TypeError for bad options (unknown keys, bad URL, missing key named by apiKeyEnv).
 */
export function openAICompatible(options: OpenAICompatibleOptions): Provider {
  return makeProvider(resolveConfig('openAICompatible', options))
}

/**
 * {@link openAICompatible} with DeepSeek's defaults: base {@link DEEPSEEK_BASE_URL}, model
 * {@link DEEPSEEK_DEFAULT_MODEL}, key from `apiKey` or else `$DEEPSEEK_API_KEY` (required).
 * Undefined option values fall back to the defaults.
 * @throws TypeError when no key can be found, or for bad options.
 */
export function deepseek(options: Partial<OpenAICompatibleOptions> = {}): Provider {
  if (!isRecord(options)) throw new TypeError(`deepseek takes an options object, got ${options === null ? 'null' : typeof options}`)
  const merged: Record<string, unknown> = { baseURL: DEEPSEEK_BASE_URL, model: DEEPSEEK_DEFAULT_MODEL }
  for (const [key, value] of Object.entries(options)) if (value !== undefined) merged[key] = value
  return makeProvider(resolveConfig('deepseek', merged as unknown as OpenAICompatibleOptions, DEEPSEEK_API_KEY_ENV))
}

function makeProvider(cfg: AdapterConfig): Provider {
  return {
    model: cfg.model,
    baseURL: cfg.baseURL,
    contextWindow: cfg.contextWindow,
    maxTokens: cfg.maxTokens,
    complete: (request) => completeWithRetries(cfg, request),
  }
}

/** Errors raised after output was streamed: retrying them would show the caller a second answer. */
const afterOutput = new WeakSet<ProviderError>()
const RETRYABLE = new Set<ProviderErrorCode>(['RATE_LIMIT', 'SERVER', 'TRANSPORT', 'TIMEOUT', 'EMPTY_RESPONSE'])

/** An exception thrown by the caller's onEvent: passed through unchanged, never retried. */
class ListenerFailure { constructor(readonly error: unknown) {} }

function redact(text: string, secret: string | undefined): string {
  return secret && secret.length >= 4 && text.includes(secret) ? text.split(secret).join('[REDACTED]') : text
}

function providerError(cfg: AdapterConfig, code: ProviderErrorCode, message: string, init: ConstructorParameters<typeof ProviderError>[2] = {}): ProviderError {
  const body = init.body === undefined ? undefined : redact(init.body, cfg.apiKey)
  return new ProviderError(code, redact(`${code}: ${message} ${ERROR_HINTS[code]}`, cfg.apiKey), { ...init, body })
}

function maxTokensFor(cfg: AdapterConfig, request: ChatRequest): number {
  const requested = positiveInteger('complete', 'request.maxTokens', request.maxTokens) ?? cfg.maxTokens
  const capped = cfg.maxOutputTokens === undefined ? requested : Math.min(requested, cfg.maxOutputTokens)
  if (cfg.contextWindow === undefined) return capped
  if (request.inputTokens !== undefined && !(typeof request.inputTokens === 'number' && Number.isFinite(request.inputTokens) && request.inputTokens >= 0)) {
    throw new TypeError(`complete: request.inputTokens must be a non-negative number of tokens, got ${JSON.stringify(request.inputTokens)}`)
  }
  const prompt = request.inputTokens ?? estimatePromptTokens(request)
  const room = cfg.contextWindow - prompt
  if (room < 1) {
    throw providerError(cfg, 'CONTEXT_WINDOW_EXCEEDED',
      `preflight: nothing was sent. The prompt is estimated at ${prompt} tokens and the context window of ${cfg.model} is ${cfg.contextWindow} tokens, leaving ${room} for the completion (at least 1 is needed); pass contextWindow if ${cfg.contextWindow} is wrong.`)
  }
  return Math.min(capped, room)
}

function requestBody(cfg: AdapterConfig, request: ChatRequest, maxTokens: number): string {
  const body: Record<string, unknown> = {
    ...cfg.extraBody,
    model: cfg.model,
    messages: toWireMessages(request.system, request.messages),
    stream: true,
    stream_options: { include_usage: true },
    [cfg.maxTokensField]: maxTokens,
  }
  if (request.tools && request.tools.length > 0) {
    body.tools = request.tools.map((t) => ({
      type: 'function',
      function: { name: t.name, ...(t.description !== undefined ? { description: t.description } : {}), parameters: t.parameters ?? { type: 'object', properties: {} } },
    }))
  }
  if (cfg.thinking) body.thinking = { type: cfg.thinking }
  if (cfg.reasoningEffort !== undefined) body.reasoning_effort = cfg.reasoningEffort
  return JSON.stringify(body, wireReplacer)
}

async function completeWithRetries(cfg: AdapterConfig, request: ChatRequest): Promise<ChatResponse> {
  if (!isRecord(request) || !Array.isArray(request.messages)) throw new TypeError('complete(request): request.messages must be an array of messages')
  const { signal } = request
  const aborted = (): ProviderError => providerError(cfg, 'ABORTED', `request to ${cfg.endpoint} aborted before it completed.`)
  if (signal?.aborted) throw aborted()
  const body = requestBody(cfg, request, maxTokensFor(cfg, request))
  const headers: Record<string, string> = { 'content-type': 'application/json', accept: 'text/event-stream' }
  if (cfg.apiKey !== undefined) headers.authorization = `Bearer ${cfg.apiKey}`
  // Lower-cased, so that a caller's `Authorization` replaces ours instead of being joined to it.
  for (const extra of [cfg.headers, request.headers ?? {}]) for (const [name, value] of Object.entries(extra)) headers[name.toLowerCase()] = value
  for (let retry = 0; ; retry++) {
    let error: ProviderError
    try {
      return await attempt(cfg, request, body, headers)
    } catch (e) {
      if (e instanceof ListenerFailure) throw e.error
      if (!(e instanceof ProviderError)) throw e
      error = e
    }
    const retryable = RETRYABLE.has(error.code) && !afterOutput.has(error) && !(error.code === 'RATE_LIMIT' && requestExceedsRateLimit(error.body))
    if (!retryable || retry >= cfg.maxRetries) throw error
    const delayMs = error.retryAfterMs !== undefined
      ? Math.min(error.retryAfterMs, cfg.retryMaxMs)
      : Math.round(Math.min(cfg.retryMaxMs, cfg.retryBaseMs * 2 ** retry * (1 + (Math.random() * 2 - 1) * RETRY_JITTER_RATIO)))
    request.onEvent?.({ type: 'retry', attempt: retry + 1, delayMs, error })
    try { await cfg.sleep(delayMs, signal) } catch (e) { if (signal?.aborted) throw aborted(); throw e }
    if (signal?.aborted) throw aborted()
  }
}

/** Collects one streamed (or non-streamed) completion; emits deltas as they arrive. */
function createAssembler(cfg: AdapterConfig, emit: (event: StreamEvent) => void) {
  let text = ''
  let reasoning = ''
  const calls: { id: string; name: string; arguments: string }[] = []
  const slotOfIndex = new Map<number, number>()
  let finishReason: string | undefined
  let usage: Usage | undefined
  let responseId: string | undefined
  let streamed = false

  function toolCallDelta(tc: unknown): void {
    if (!isRecord(tc)) return
    const fn = isRecord(tc.function) ? tc.function : {}
    const id = typeof tc.id === 'string' && tc.id !== '' ? tc.id : undefined // Qwen sends "" after the first delta
    const name = typeof fn.name === 'string' && fn.name !== '' ? fn.name : undefined // Mistral sends "" after the first delta
    const args = typeof fn.arguments === 'string' ? fn.arguments : isRecord(fn.arguments) ? JSON.stringify(fn.arguments) : ''
    const wireIndex = typeof tc.index === 'number' ? tc.index : undefined
    let slot: number | undefined
    if (wireIndex !== undefined) slot = slotOfIndex.get(wireIndex)
    else if (id !== undefined) { const k = calls.findIndex((c) => c.id === id); slot = k >= 0 ? k : undefined }
    else if (calls.length > 0) slot = calls.length - 1 // no index, no id: the continuation of the last call
    // A different id on a known index starts a new call (servers that send every call as index 0).
    if (slot !== undefined && id !== undefined && calls[slot].id !== '' && calls[slot].id !== id) slot = undefined
    if (slot === undefined) {
      slot = calls.length
      calls.push({ id: '', name: '', arguments: '' })
      if (wireIndex !== undefined) slotOfIndex.set(wireIndex, slot)
    }
    const call = calls[slot]
    const newId = id !== undefined && call.id === '' ? id : undefined
    const newName = name !== undefined && call.name === '' ? name : undefined
    if (newId) call.id = newId
    if (newName) call.name = newName
    call.arguments += args
    if (newId || newName || args) {
      streamed = true
      emit({ type: 'tool-call-delta', index: slot, ...(newId ? { id: newId } : {}), ...(newName ? { name: newName } : {}), argumentsDelta: args })
    }
  }

  return {
    get streamed() { return streamed },
    /** One chunk object (or a whole non-streamed completion). Throws the in-stream error it carries. */
    chunk(obj: unknown, requestId: string | undefined, dataText: string): void {
      if (!isRecord(obj)) throw providerError(cfg, 'MALFORMED_RESPONSE', `stream from ${cfg.endpoint} sent a data event that is not a JSON object: ${dataText.slice(0, 200)}`, { body: dataText, requestId, status: 200 })
      if (obj.error !== undefined && obj.error !== null) throw inStreamError(cfg, dataText, requestId)
      if (responseId === undefined && typeof obj.id === 'string' && obj.id !== '') responseId = obj.id
      const u = readUsage(obj.usage)
      if (u) usage = u // running totals (SiliconFlow) or a final chunk: the last one wins
      const choices: unknown[] = Array.isArray(obj.choices) ? obj.choices : []
      for (const choice of choices) {
        if (!isRecord(choice) || (typeof choice.index === 'number' && choice.index !== 0)) continue // n = 1 is requested
        const delta = isRecord(choice.delta) ? choice.delta : isRecord(choice.message) ? choice.message : undefined
        if (delta) {
          const r = typeof delta.reasoning_content === 'string' && delta.reasoning_content !== '' ? delta.reasoning_content
            : typeof delta.reasoning === 'string' ? delta.reasoning : '' // `reasoning`: OpenRouter, Groq
          if (r !== '') { reasoning += r; streamed = true; emit({ type: 'reasoning-delta', text: r }) }
          if (typeof delta.content === 'string' && delta.content !== '') { text += delta.content; streamed = true; emit({ type: 'text-delta', text: delta.content }) }
          if (Array.isArray(delta.tool_calls)) for (const tc of delta.tool_calls) toolCallDelta(tc)
        }
        if (typeof choice.finish_reason === 'string' && choice.finish_reason !== '') {
          finishReason = choice.finish_reason
          if (finishReason === 'error') throw providerError(cfg, 'SERVER', `stream from ${cfg.endpoint} ended with finish_reason "error".`, { body: dataText, requestId, status: 200 })
        }
      }
    },
    partial(): AssistantMessage | undefined {
      if (text === '' && reasoning === '') return undefined
      const content: Block[] = []
      if (reasoning !== '') content.push({ type: 'reasoning', text: reasoning })
      if (text !== '') content.push({ type: 'text', text })
      return { role: 'assistant', content, interrupted: true }
    },
    finish(sawDone: boolean, requestId: string | undefined): ChatResponse {
      if (!sawDone && finishReason === undefined) {
        throw providerError(cfg, 'TRANSPORT', `stream from ${cfg.endpoint} ended without [DONE] and without a finish reason (model ${cfg.model}).`, { requestId, status: 200 })
      }
      if (!streamed && finishReason !== 'content_filter') {
        throw providerError(cfg, 'EMPTY_RESPONSE', `${cfg.endpoint} (model ${cfg.model}) finished without any text, reasoning or tool call.`, { requestId, status: 200 })
      }
      const content: Block[] = []
      if (reasoning !== '') content.push({ type: 'reasoning', text: reasoning })
      if (text !== '') content.push({ type: 'text', text })
      calls.forEach((c, i) => {
        const id = c.id || `call_${i}_${typeof crypto !== 'undefined' && typeof crypto.randomUUID === 'function' ? crypto.randomUUID() : Math.random().toString(36).slice(2)}`
        content.push({ type: 'tool-call', id, name: c.name, arguments: c.arguments })
      })
      const reason = finishReason ?? (calls.length > 0 ? 'tool_calls' : 'stop')
      if (usage) emit({ type: 'usage', usage })
      emit({ type: 'finish', finishReason: reason })
      const response: ChatResponse = { message: { role: 'assistant', content }, finishReason: reason }
      if (usage) response.usage = usage
      const id = requestId ?? responseId
      if (id !== undefined) response.requestId = id
      return response
    },
  }
}

function readUsage(u: unknown): Usage | undefined {
  if (!isRecord(u)) return undefined
  const n = (v: unknown): number | undefined => (typeof v === 'number' && Number.isFinite(v) ? v : undefined)
  const prompt = n(u.prompt_tokens)
  const completion = n(u.completion_tokens)
  if (prompt === undefined && completion === undefined) return undefined
  const usage: Usage = { promptTokens: prompt ?? 0, completionTokens: completion ?? 0 }
  const cached = n(u.prompt_cache_hit_tokens) ?? (isRecord(u.prompt_tokens_details) ? n(u.prompt_tokens_details.cached_tokens) : undefined)
  if (cached !== undefined) usage.cachedTokens = cached
  const reasoning = (isRecord(u.completion_tokens_details) ? n(u.completion_tokens_details.reasoning_tokens) : undefined) ?? n(u.reasoning_tokens)
  if (reasoning !== undefined) usage.reasoningTokens = reasoning
  return usage
}

/**
 * An error event inside a 200 stream (`data: {"error": …}` or `event: error`), classified like an
 * HTTP error body. Its status is the numeric code the payload carries (`code`, `status`,
 * `status_code`), else the 200 the response had.
 */
function inStreamError(cfg: AdapterConfig, payload: string, requestId: string | undefined): ProviderError {
  const classified = classifyProviderError(200, payload)
  // An explicit error event whose payload says nothing readable is still the server's failure.
  const code = classified === 'MALFORMED_RESPONSE' || classified === 'EMPTY_RESPONSE' ? 'SERVER' : classified
  const info = inspectErrorBody(payload)
  return providerError(cfg, code, `error inside the stream from ${cfg.endpoint} (model ${cfg.model})${info.message ? `: ${info.message}` : ''}.`, { status: info.status ?? 200, body: payload, requestId })
}

/** The response body, with every read racing the attempt's abort signal (fetch implementations differ in how fast they honour it). */
async function* bodyChunks(body: ReadableStream<Uint8Array>, signal: AbortSignal): AsyncGenerator<Uint8Array, void, undefined> {
  const reader = body.getReader()
  const abort = new Promise<never>((_, reject) => {
    if (signal.aborted) reject(signal.reason)
    else signal.addEventListener('abort', () => reject(signal.reason), { once: true })
  })
  abort.catch(() => {})
  let finished = false
  try {
    for (;;) {
      const { done, value } = await Promise.race([reader.read(), abort])
      if (done) { finished = true; return }
      yield value
    }
  } finally {
    if (!finished) reader.cancel().catch(() => {})
  }
}

/** Splits `data` into chunk objects; a relay that joined several `data:` lines into one event gets one object per line. */
function parseChunkData(cfg: AdapterConfig, data: string, requestId: string | undefined): unknown[] {
  try {
    return [JSON.parse(data)]
  } catch (error) {
    if (data.includes('\n')) {
      try { return data.split('\n').filter((line) => line.trim() !== '').map((line) => JSON.parse(line)) } catch { /* fall through */ }
    }
    throw providerError(cfg, 'MALFORMED_RESPONSE', `stream from ${cfg.endpoint} sent a data event that is not JSON: ${data.slice(0, 200)}`, { body: data, requestId, status: 200, cause: error })
  }
}

async function attempt(cfg: AdapterConfig, request: ChatRequest, body: string, headers: Record<string, string>): Promise<ChatResponse> {
  const { signal, onEvent } = request
  const controller = new AbortController()
  let timedOut = false
  let timer: ReturnType<typeof setTimeout> | undefined
  const progress = (): void => {
    if (timer !== undefined) clearTimeout(timer)
    timer = setTimeout(() => { timedOut = true; controller.abort(new Error(`no progress for ${cfg.idleTimeoutMs} ms`)) }, cfg.idleTimeoutMs)
  }
  const forwardAbort = (): void => controller.abort(signal?.reason)
  signal?.addEventListener('abort', forwardAbort, { once: true })
  const emit = (event: StreamEvent): void => {
    if (!onEvent) return
    try { onEvent(event) } catch (error) { throw new ListenerFailure(error) }
  }
  const acc = createAssembler(cfg, emit)
  let requestId: string | undefined
  progress()
  try {
    const response = await cfg.fetch(cfg.endpoint, { method: 'POST', headers, body, signal: controller.signal })
    progress()
    requestId = requestIdOf(response.headers)
    if (!response.ok) {
      const text = await response.text()
      const code = classifyProviderError(response.status, text)
      const info = inspectErrorBody(text)
      throw providerError(cfg, code, `HTTP ${response.status} from POST ${cfg.endpoint} (model ${cfg.model})${info.message ? `: ${info.message}` : ''}.`, {
        status: response.status, body: text, requestId, retryAfterMs: parseRetryAfterMs(response.headers, Date.now()),
      })
    }
    if (/\bapplication\/json\b/i.test(response.headers.get('content-type') ?? '')) {
      // The server ignored stream: true and sent one completion (or an error) as JSON.
      const text = await response.text()
      if (text.trim() === '') throw providerError(cfg, 'EMPTY_RESPONSE', `${cfg.endpoint} answered 200 with an empty body (model ${cfg.model}).`, { status: response.status, requestId })
      acc.chunk(parseChunkData(cfg, text.trim(), requestId)[0], requestId, text)
      return acc.finish(true, requestId)
    }
    if (!response.body) throw providerError(cfg, 'EMPTY_RESPONSE', `${cfg.endpoint} answered ${response.status} without a body (model ${cfg.model}).`, { status: response.status, requestId })
    let sawDone = false
    let sawData = false
    for await (const event of parseSSE(bodyChunks(response.body, controller.signal), { maxBufferSize: SSE_MAX_BUFFER_UNITS })) {
      if (event.event === 'error') throw inStreamError(cfg, event.data, requestId)
      if (event.event !== 'message') continue
      sawData = true
      const data = event.data.trim()
      if (data === '' || data[0] === ':') continue // a relay's keep-alive inside a data line: not progress
      progress()
      if (data === '[DONE]') { sawDone = true; break }
      for (const obj of parseChunkData(cfg, data, requestId)) acc.chunk(obj, requestId, data)
    }
    const type = response.headers.get('content-type')
    if (!sawData && type && !/event-stream/i.test(type)) {
      throw providerError(cfg, 'MALFORMED_RESPONSE', `${cfg.endpoint} answered 200 with ${type}, not an event stream (model ${cfg.model}).`, { status: response.status, requestId })
    }
    return acc.finish(sawDone, requestId)
  } catch (e) {
    if (e instanceof ListenerFailure) throw e
    const partial = acc.partial()
    let error: ProviderError
    if (signal?.aborted) error = providerError(cfg, 'ABORTED', `request to ${cfg.endpoint} aborted by the caller.`, { requestId })
    else if (e instanceof ProviderError) error = e
    else if (timedOut) error = providerError(cfg, 'TIMEOUT', `no progress from ${cfg.endpoint} (model ${cfg.model}) for ${cfg.idleTimeoutMs} ms; keep-alive comments do not count.`, { requestId })
    else if (e instanceof SSEParseError) error = providerError(cfg, 'MALFORMED_RESPONSE', `stream from ${cfg.endpoint}: ${e.message}.`, { requestId, status: 200, cause: e })
    else {
      // undici says only "fetch failed"; the reason (ECONNREFUSED, ENOTFOUND, …) is in its cause.
      const reason = e instanceof Error ? e.message + (e.cause instanceof Error ? ` (${e.cause.message})` : '') : String(e)
      error = providerError(cfg, 'TRANSPORT', `request to ${cfg.endpoint} failed: ${reason}.`, { requestId, cause: e })
    }
    if (partial && !error.partial) error.partial = partial
    if (acc.streamed) afterOutput.add(error)
    throw error
  } finally {
    if (timer !== undefined) clearTimeout(timer)
    signal?.removeEventListener('abort', forwardAbort)
  }
}

// ════════════════════════════════════════════════════════════════════════════════════════════
// 7. Loop
// ════════════════════════════════════════════════════════════════════════════════════════════

// (loop)

// ════════════════════════════════════════════════════════════════════════════════════════════
// 8. CLI
// ════════════════════════════════════════════════════════════════════════════════════════════

// (cli-tools)

// (cli-replay)

// (cli-main)
