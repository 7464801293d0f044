/**
 * dsh.ts — a single-file, zero-dependency TypeScript runtime for LLM agents that manages the
 * context window of long sessions. Spec: docs/design.md (the behaviour this file implements; the
 * `§N` citations below and in the tests point into it).
 *
 * MANUAL (five lines)
 *   import { Agent, Session, FileStore, deepseek } from './dsh.ts'
 *   const session = await Session.open(new FileStore('s.jsonl'))  // or new MemoryStore(); resumes
 *   const agent = new Agent({ session, provider: deepseek({ apiKey }), tools: [myTool] })
 *   const answer = await agent.run('Fix the failing test', { signal })
 *   console.log(answer.text, session.measure().totalTokens)
 * CLI: `npx tsx dsh.ts --help` (one-shot, interactive, `replay FILE`); installed: `dsh --help`.
 *
 * PUBLIC API (the one export list below this header; types are exported where they are declared)
 *   Agent                  the loop: turns, steps, tools, hooks, the ladder, cancellation (§7)
 *   Session                the append-only log, its one writer, its surface and measure() (§4)
 *   CostLedger             a part over the log: CostLedger.of(session).usage(), the prompt-cache model (§11)
 *   RecallIndex            a part over the log: the originals the surface no longer shows (§10)
 *   Pins                   a part over the log: Pins.of(session).pin(seq), never compacted (§12)
 *   MemoryStore            where a session's events live by default: in memory (anywhere)
 *   openAICompatible       a Provider for any OpenAI-compatible chat-completions server (§6)
 *   deepseek               openAICompatible with DeepSeek's base URL, model, key variable and prices
 *   parseSSE               a server-sent event stream as an async iterable of {event, data, id?}
 *   classifyProviderError  an HTTP status and error body → a ProviderErrorCode
 *   ProviderError          the one error a provider throws ({code, status?, body, partial?})
 *   SessionError           an append that would break the log, or a bad log file ({code, line?})
 *   ConfigError            an option that cannot work (prune or ladder configuration); a TypeError
 *   estimateTextTokens     ceil(UTF-16 units / 4), the meter's text price (§2)
 *   estimateMessageTokens  one message's heuristic price in tokens (§2)
 *   estimateRequestTokens  envelope + messages, heuristic tokens (§2)
 *   codePointLength        Unicode code points of a text (a surrogate pair is one)
 *   pruneText              head + PRUNE_MARKER + tail of a text over the threshold (§3)
 *   pruneToolResult        the same cut over a tool result's text blocks, other blocks kept (§3);
 *                          (session, seq) logs it as a replace of surface node seq
 *   PRUNE_MARKER           the 39-code-point text put where a pruned middle was
 *   DEFAULT_PRUNE_CONFIG   {thresholdChars: 8192, headChars: 4096, tailChars: 1024}, code points
 *   DEFAULT_COMPACTION_CONFIG  the ladder's defaults (below, and docs/design.md §5, §10)
 *   KNOWN_MODELS           context window and output cap by model name (DeepSeek's)
 *   DEEPSEEK_PRICES        DeepSeek's prices, USD per million tokens, with peak hours (§11)
 *   VERSION                this file's version
 * and, exported from Part II's sections 12–14 (carried into dist/dsh.mjs too):
 *   FileStore              a session in a JSONL file (node:fs)
 *   SqlLogStore            a session in PostgreSQL, one writer across machines (SessionLockedError: held elsewhere)
 *   anthropic              a Provider for the Anthropic Messages API, cache breakpoints placed by dsh (§6)
 *
 * OPTIONS AND DEFAULTS (docs/design.md; all overridable per Agent / provider)
 *   pruner     DEFAULT_PRUNE_CONFIG        prune tool results over 8,192 code points to
 *                                          head 4,096 + marker (39) + tail 1,024 code points
 *   ladder     DEFAULT_COMPACTION_CONFIG   threshold 0.8 × window, auto on, clear rung on;
 *                                          constants: retained tail 0.16 × window, summary max 8,192
 *                                          tokens, 1 compaction and 1 overflow retry, spill over
 *                                          256 KiB, clear down to 0.6 × window, newest 0.2 kept; `recall` tool
 *                                          offered once content is shadowed (recall: false = off);
 *                                          the net-cost gate acts where prices are known
 *   provider   openAICompatible / deepseek max_tokens 32,768 (clamped to the window), 5 retries
 *              / anthropic                 500 ms → 10 s, idle timeout 300 s, a call's deadline 1 h;
 *                                          prices: DEEPSEEK_PRICES for deepseek(), none otherwise
 *                                          (cost unknown) unless given
 *   loop       Agent                       200 steps per turn; tools run one at a time; no spend cap
 *                                          unless maxCostUSD (per turn, or {turn, session})
 *
 * LIMITS: token counts are a heuristic (UTF-16 units / 4 + 8 per message) until a provider reports
 * usage; chat-completions tool results cannot carry images (sent as JSON text; Anthropic's can); the CLI's file tools
 * stay inside the working directory (the CLI's shell runs in a bubblewrap sandbox where one can start,
 * else unconfined); FileStore needs node:fs (Node, Deno, Bun), MemoryStore runs anywhere.
 *
 * CONTENTS (sections follow the path of a tool result, docs/design.md §14; `§N` cites docs/design.md)
 *   PART I — THE RUNTIME (web standards only; `dist/dsh.mjs` is this part plus sections 12–14)
 *   1. Types          messages, blocks, events, provider contract, errors
 *   2. Stream in      2.1 SSE parser (parseSSE and the adapter's one parser), 2.2 error classifier — a
 *                     PROVIDER'S ERROR WORDING of an overflow goes into OVERFLOW_PATTERNS only if it
 *                     states no numbers (one that states a size and its limit is read by shape,
 *                     overflowCounts); RATE_LIMIT_RE, QUOTA_RE and the other *_RE beside it for the rest —
 *                     2.3 reply assembly: a wire format's events → the assistant message
 *   3. Meter          token estimates (tokens), usage anchor; 3.1 cost: prices applied to tokens (USD)
 *   4. Log & surface  append-only session log (Session, the one writer), surface projection, the
 *                     store contract and MemoryStore, resume; 4.1 the log protocol of a
 *                     prune or clear; 4.2 parts over the log: the ladder's memory, cost and cache
 *                     (CostLedger.of(session)), recall index, pins
 *   5. Pruner         code-point-safe head/tail cut of tool results (code points)
 *   6. Ladder         prune → clear → compact → fail, spill at write time; ledger. 6.1 A LADDER RUNG
 *                     is a function from the ladder's view to the edits it would log (like clearRung)
 *                     plus one line in Ladder.relievePressure (and recoverOverflow); Ladder.apply logs
 *                     them as `compaction/*` events (§5, §10, §14); 6.1a the net-cost gate; 6.2 recall
 *   7. Stream out     7.0 configuration (DeepSeek defaults, KNOWN_MODELS, the adapter's constants),
 *                     7.1 messages on the wire (chat completions), 7.3 the adapter: a WIRE FORMAT
 *                     is one WireFormat table (body writer + event mapper; section 14 is the second)
 *   8. Loop           Agent: turns, steps, tools, hooks, cancellation
 *   ── fence: nothing in Part I names anything in Part II ──
 *   PART II — THE EXTRAS (may use `node:` modules, only through dynamic import; `dist/cli.mjs`)
 *   9. Tools          built-in coding tools of the CLI (read_file, list_files, grep, write/edit, shell)
 *   10. Replay        10.1 transcript readers — a TRANSCRIPT FORMAT is one entry of
 *                     TRANSCRIPT_READERS (detect + read); 10.2 the replay runner: an Agent with a
 *                     recorded provider and tools — a REPORT COLUMN is one entry of REPLAY_FIGURES
 *   11. CLI           arguments, terminal output, entry point; 11.1 configuration files and trust,
 *                     11.2 approvals, diffs and undo, 11.3 kept sessions, 11.4 fidelity views
 *   12. File store    FileStore and its lock file (node:fs)   ┐ capabilities a session opts into;
 *   13. SQL store     SqlLogStore and its lease               │ build.mjs carries 12–14 into
 *   14. Anthropic     anthropic(): the Messages wire format   ┘ dist/dsh.mjs (they name no 9–11)
 *
 * UNITS (one word, one unit, everywhere in this file):
 *   tokens       heuristic (§2) or provider-reported tokens; `budget` and `room` are always tokens
 *   code points  Unicode scalar values (a surrogate pair is one); "chars" in a name means code points
 *   UTF-16 units JS string `.length`; "units" in a name (`maxOutputUnits`, UNITS_PER_TOKEN: the
 *                meter's `/ 4` counts these)
 *   bytes        UTF-8 bytes unless a name says otherwise
 *   ms           milliseconds; every time is in ms unless a name says otherwise (`…S` = seconds)
 */
// The public API (docs/design.md §14): the runtime names below, each described in PUBLIC API above.
// Everything else in Part I is private to the file; types are exported where they are declared, and so
// is the undocumented `internals` object at the end of Part I (docs/design.md §14). `Session` is exported at its
// declaration in section 4 (the figures of the core count its class there).
export {
  VERSION, Agent, MemoryStore, SessionError, ProviderError, ConfigError,
  openAICompatible, deepseek, parseSSE, classifyProviderError,
  estimateTextTokens, estimateMessageTokens, estimateRequestTokens,
  codePointLength, pruneText, pruneToolResult, PRUNE_MARKER, DEFAULT_PRUNE_CONFIG,
  DEFAULT_COMPACTION_CONFIG, KNOWN_MODELS, DEEPSEEK_PRICES, CostLedger, RecallIndex, Pins,
}
export type { Ladder }

// ═══════════════════════════════════════
// PART I — THE RUNTIME: sections 1–8, web standards only (the fence before section 9 says more)
// ═══════════════════════════════════════

const VERSION = '0.1.0'
/** The log layout in `session/start {format}` (docs/design.md §14); a log without one is format 1. */
const LOG_FORMAT = 1

// ═══════════════════════════════════════
// 1. Types
// ═══════════════════════════════════════

/** Plain text. `text` is any string; lone surrogates are tolerated and replaced only on the wire. */
export interface TextBlock { type: 'text'; text: string }
/** Model reasoning ("thinking"); DeepSeek's `reasoning_content`. `signature`: Anthropic's, sent back with it. */
export interface ReasoningBlock { type: 'reasoning'; text: string; signature?: string }
/** A tool call made by the model. `arguments` is the raw JSON string, exactly as streamed. */
export interface ToolCallBlock { type: 'tool-call'; id: string; name: string; arguments: string }
/** An image (or any other non-text block). Kept in position; priced by its JSON length. */
export interface ImageBlock { type: 'image'; [key: string]: unknown }
/** Any block a caller hands in that dsh does not interpret. Kept in position, never edited. */
export interface OtherBlock { type: string; [key: string]: unknown }
/** Any block of message content (docs/design.md §1); non-text blocks keep their positions. */
export type Block = TextBlock | ReasoningBlock | ToolCallBlock | ImageBlock | OtherBlock

/** docs/design.md §1. `content` may be a plain string (the common case) or blocks. */
export interface UserMessage { role: 'user'; content: string | Block[] }
/** docs/design.md §1. `interrupted` marks partial output kept after a cancellation or a cut stream. */
export interface AssistantMessage { role: 'assistant'; content: Block[]; interrupted?: boolean }
/** docs/design.md §1. The result of the tool call whose id is `toolCallId`. */
export interface ToolResultMessage {
  role: 'tool'
  toolCallId: string
  content: Block[]
  isError?: boolean
  /** Free-form data for the caller (never sent to the provider, never edited by dsh). */
  metadata?: Record<string, unknown>
}
/** A provider-neutral message (docs/design.md §1); the envelope (system, tools) is not a message. */
export type Message = UserMessage | AssistantMessage | ToolResultMessage

/** A message's text: a string as it is, else its text blocks joined by `separator`. The one block-text join. */
function contentText(content: string | readonly Block[], separator = ''): string {
  if (typeof content === 'string') return content
  return content.filter((b) => b.type === 'text').map((b) => (b as TextBlock).text).join(separator)
}

/** Whether `value` is a safe integer ≥ `min`: the one check behind every count, size and limit option. */
function isIntegerAtLeast(value: unknown, min: number): value is number {
  return Number.isSafeInteger(value) && (value as number) >= min
}

/** A function tool as the provider sees it (JSON-schema `parameters`), part of the envelope. */
export interface ToolSpec { name: string; description?: string; parameters?: Record<string, unknown> }

/** The request envelope (docs/design.md §1): not messages, but priced like them (§2). */
export interface Envelope { system?: string; tools?: readonly ToolSpec[] }

/** Provider-reported usage of one call, in tokens (docs/design.md §6). */
export interface Usage {
  promptTokens: number
  completionTokens: number
  /** Prompt tokens served from the provider's cache (`prompt_cache_hit_tokens` / `cached_tokens`). */
  cachedTokens?: number
  /** Prompt tokens written to the provider's cache (Anthropic's `cache_creation_input_tokens`), not cached ones. */
  cacheWriteTokens?: number
  /** Completion tokens spent on reasoning (`completion_tokens_details.reasoning_tokens`). */
  reasoningTokens?: number
}

/**
 * Prices of one model in USD per million tokens (docs/design.md §11): input served from the
 * provider's prompt cache, input not in the cache, and completion tokens (reasoning included).
 * `peak`, when given, multiplies all three inside its UTC windows. Give it to a provider as the
 * `prices` option; {@link DEEPSEEK_PRICES} holds DeepSeek's. A model without prices has cost
 * "unknown": dsh never invents one.
 */
export interface Prices {
  /** USD per million input tokens that hit the prompt cache. */
  cacheHitInput: number
  /** USD per million input tokens that miss the prompt cache. */
  cacheMissInput: number
  /** USD per million input tokens written to the cache (Anthropic: 1.25 × input); default cacheMissInput. */
  cacheWriteInput?: number
  /** USD per million completion tokens. */
  output: number
  /** Peak hours, when every price above is multiplied by `multiplier`. */
  peak?: PeakHours
}

/**
 * Peak hours of a price table: on the UTC `days` (0 = Sunday … 6 = Saturday, as
 * `Date#getUTCDay`), inside each `[startHour, endHour)` of `hoursUTC` (UTC hours, 0–24), prices are
 * multiplied by `multiplier` (e.g. 2 for double).
 */
export interface PeakHours {
  multiplier: number
  days: readonly number[]
  hoursUTC: readonly (readonly [number, number])[]
}

/**
 * Thrown for an option or configuration that cannot work (prune config, ladder config): the message
 * names the key, the value, the range and the fix. A TypeError, like the other option errors.
 */
class ConfigError extends TypeError {
  constructor(message: string, options?: ErrorOptions) { super(message, options); this.name = 'ConfigError' }
}

/** A value as an option error shows it, as given: NaN, Infinity, -0, 1n, strings quoted, short arrays item by item,
 *  other objects by kind (`a Headers`). Never throws (a Proxy's trap that throws shows it by kind). */
function shown(value: unknown, depth = 0): string {
  if (typeof value === 'string') return JSON.stringify(value)
  if (typeof value === 'number') return Object.is(value, -0) ? '-0' : String(value)
  if (typeof value === 'bigint') return `${value}n`
  if (typeof value === 'function') return 'a function'
  if (value === null || typeof value !== 'object') return String(value)
  try {
    if (Array.isArray(value)) {
      return depth > 1 || value.length > 8 ? `an array of ${value.length}`
        : `[${Array.from(value, (v) => shown(v, depth + 1)).join(', ')}]`
    }
    const proto: unknown = Object.getPrototypeOf(value)
    const name: unknown = (proto as { constructor?: { name?: unknown } } | null)?.constructor?.name
    const bare = typeof name !== 'string' || name === '' || name === 'Object'
    if (bare && proto !== null && !isObjectPrototype(proto as object)) return 'an object that inherits fields'
    if (bare) return 'an object'
    return `${/^[AEIOU]/.test(name) ? 'an' : 'a'} ${name}`
  } catch { return 'an object' } // a revoked Proxy, a throwing trap
}

/** The one shape of an option error: `${what} must be ${limit}, got ${value}; ${fix}` (value, limit, fix). */
function configError(what: string, limit: string, value: unknown, fix?: string): ConfigError {
  return new ConfigError(`${what} must be ${limit}, got ${shown(value)}${fix ? `; ${fix}` : ''}`)
}

/** Whether `proto` is `Object.prototype` of some realm (null above it, and its own methods), not a bag of fields. */
function isObjectPrototype(proto: object): boolean {
  return Object.getPrototypeOf(proto) === null
    && ['hasOwnProperty', 'isPrototypeOf'].every((k) => typeof Object.getOwnPropertyDescriptor(proto, k)?.value
      === 'function')
}

/**
 * The own fields of `value` (enumerable or not), each read once, those whose value is undefined left out (as
 * JSON.stringify leaves them): the one reader of an options object (the provider's options, `headers`, `extraBody`,
 * `prices`, `maxCostUSD`, the prune and ladder configurations). Throws `Err` (TypeError; {@link ConfigError} for a
 * configuration) naming `what` unless `value` is a plain object (`{…}` or `Object.create(null)`, of any realm: a
 * string, an array or a Map would be read item by item, a class instance's inherited fields missed), or when reading
 * it throws (a getter, a Proxy trap).
 */
function plainFields(what: string, value: unknown, expected = 'a plain object',
  Err: new (message: string, options?: ErrorOptions) => Error = TypeError): [string, unknown][] {
  const fields: [string, unknown][] = []
  let key: string | undefined
  let plain = false
  try {
    const proto: unknown = isRecord(value) ? Object.getPrototypeOf(value) : undefined
    plain = proto === null || (proto !== undefined && isObjectPrototype(proto))
    if (plain) {
      for (key of Object.getOwnPropertyNames(value)) fields.push([key, (value as Record<string, unknown>)[key]])
    }
  } catch (err) {
    throw new Err(`${key === undefined ? what : `${what}.${key}`} could not be read: `
      + `${(err as Error)?.message ?? err}`, { cause: err })
  }
  if (!plain) throw new Err(`${what} must be ${expected}, got ${shown(value)}`)
  return fields.filter(([, v]) => v !== undefined)
}

/**
 * Options of earlier releases that are gone, by where they were given, and what to do instead (CHANGELOG.md):
 * a ConfigError says so rather than ignore them or call them unknown.
 */
const REMOVED_OPTIONS: Readonly<Record<'agent' | 'compaction' | 'provider', Readonly<Record<string, string>>>> = {
  agent: {
    contextWindow: "moved; use the provider's contextWindow (openAICompatible({ contextWindow }) or "
      + '{ ...provider, contextWindow })',
    maxTokens: "moved; use the provider's maxTokens (openAICompatible({ maxTokens }), or { ...provider, maxTokens })",
    instructions: 'moved; use system: append them to the system prompt',
  },
  compaction: {
    retainedTailRatio: 'was removed: a compaction keeps the newest floor(window × 0.16) tokens (docs/design.md §5)',
    summaryMaxTokens: "was removed: a summary request's budget is at most 8,192 tokens (docs/design.md §5)",
    gate: 'was removed: the net-cost gate acts where the provider has prices (docs/design.md §11)',
  },
  provider: { apiKeyEnv: 'was removed; pass apiKey, read from the environment yourself (apiKey: process.env.NAME)' },
}

/** The error for the option `key` given to `where`, if `removed` (a part of {@link REMOVED_OPTIONS}) has it. */
function removedOption(removed: Readonly<Record<string, string>>, where: string, key: string): ConfigError | undefined {
  return Object.hasOwn(removed, key) ? new ConfigError(`${where}: the option ${key} ${removed[key]}`) : undefined
}

/**
 * `config` over `defaults` (undefined values skipped). Throws {@link ConfigError} for a non-object, an unknown key
 * (one that `removed` holds says what to do instead).
 */
function withDefaults<T extends object>(where: string, config: unknown, defaults: Readonly<T>,
  removed: Readonly<Record<string, string>> = {}): T {
  const known = Object.keys(defaults)
  const full: Record<string, unknown> = { ...defaults }
  for (const [key, value] of plainFields(where, config, 'an object', ConfigError)) {
    if (!known.includes(key)) {
      throw removedOption(removed, where, key)
        ?? new ConfigError(`${where}: unknown key "${key}" (known: ${known.join(', ')})`)
    }
    full[key] = value
  }
  return full as T
}

/** Error codes of {@link ProviderError} (docs/design.md §6). */
export type ProviderErrorCode =
  | 'CONTEXT_WINDOW_EXCEEDED' | 'RATE_LIMIT' | 'QUOTA' | 'AUTH' | 'INVALID_REQUEST' | 'SERVER'
  | 'TRANSPORT' | 'TIMEOUT' | 'ABORTED' | 'EMPTY_RESPONSE' | 'MALFORMED_RESPONSE' | 'RESPONSE_TOO_LARGE'

/**
 * The one error type a provider throws. `body` is the raw response text (or the in-stream error
 * payload); `status` the HTTP status when there was one; `retryAfterMs` from `Retry-After`;
 * `partial` the assistant output received before a stream broke (for an interrupted message).
 */
class ProviderError extends Error {
  declare readonly code: ProviderErrorCode
  declare readonly status?: number
  declare readonly retryAfterMs?: number
  declare readonly requestId?: string
  declare readonly body: string
  declare partial?: AssistantMessage
  constructor(code: ProviderErrorCode, message: string, init: {
    status?: number; retryAfterMs?: number; requestId?: string; body?: string; partial?: AssistantMessage;
    cause?: unknown
  } = {}) {
    super(message, init.cause === undefined ? undefined : { cause: init.cause })
    const { status, retryAfterMs, requestId, partial } = init
    Object.assign(this, { code, status, retryAfterMs, requestId, body: init.body ?? '', partial })
    this.name = 'ProviderError'
  }
}

/** Streamed progress of one provider call. Deltas are UTF-16 strings as decoded. */
export type StreamEvent =
  | { type: 'text-delta'; text: string }
  | { type: 'reasoning-delta'; text: string }
  | { type: 'tool-call-delta'; index: number; id?: string; name?: string; argumentsDelta: string }
  | { type: 'usage'; usage: Usage }
  | { type: 'finish'; finishReason: string }
  /** Before each backoff wait: `attempt` counts retries from 1, `maxRetries` is how many this error gets, `error` is
   *  why. */
  | { type: 'retry'; attempt: number; delayMs: number; error: ProviderError; maxRetries?: number }

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
  /** Extra HTTP headers, e.g. `x-dsh-purpose: compaction` on summary requests (docs/design.md §5). */
  headers?: Record<string, string>
  onEvent?: (event: StreamEvent) => void
}

/** The assembled answer of one provider call. */
export interface ChatResponse {
  /** Tool-call ids are the server's; '' where it sent none (the {@link Agent} gives those an id). */
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
  /** Context window in tokens, when known (docs/design.md §6 table, or configured). */
  readonly contextWindow?: number
  /** Default completion budget in tokens (before clamping). */
  readonly maxTokens: number
  /** The model's price table, USD per million tokens, when known (docs/design.md §11); else cost is "unknown". */
  readonly prices?: Prices
  /** Streams one chat completion; throws {@link ProviderError} on any failure. */
  complete(request: ChatRequest): Promise<ChatResponse>
  /** The server's own count of the request's prompt, tokens, where it has an endpoint for it ({@link anthropic}). */
  countTokens?(request: ChatRequest): Promise<number>
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
 * the loop turns it into an error result for the model (docs/design.md §7).
 */
export type ToolOutput = string | Block[] | { content: string | Block[]; isError?: boolean }

/** A tool: a plain object (docs/design.md §7). `parameters` is a JSON schema for the arguments object. */
export interface Tool<Args = any> {
  name: string
  description: string
  parameters: Record<string, unknown>
  execute(args: Args, ctx: ToolContext): ToolOutput | Promise<ToolOutput>
  /**
   * `false`: the ladder's clear rung never replaces this tool's results by a placeholder (e.g. a
   * tool whose output is the deliverable); they may still be pruned (docs/design.md §10).
   */
  clearable?: boolean
}

// ═══════════════════════════════════════
// 2. Stream in — the reply's bytes to an assistant message
// ═══════════════════════════════════════

// A reply arrives as bytes on a response body: the one SSE parser splits them into events (2.1), a
// failure is classified into a ProviderError (2.2), and each event's JSON is assembled into the
// assistant message with its tool calls (2.3). The adapter that sends the request and composes these
// is section 7. Web standards only (fetch, streams, TextDecoder).

// ── 2.1 Server-sent events ────────────────────────────
// Spec: WHATWG HTML §9.2 "Server-sent events", https://html.spec.whatwg.org/multipage/server-sent-events.html
// One parser (SSEParser) serves parseSSE and the adapter. A network chunk is decoded once, its
// whole lines are parsed in place, and its events are handed on as one batch: no promise per event.
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

/** UTF-16 units an unterminated line may hold before the parser reads whether it ignores that line. */
const SSE_UNCHECKED_UNITS = 4096

/** More than `maxBufferSize` UTF-16 units held at once; {@link parseSSE} documents it as a RangeError. */
class SSEOverflowError extends RangeError {}

/**
 * Whether the unterminated line `head` can still become a field this parser reads: 1 yes, 0 no
 * (a comment, or an unknown field: the rest of the line is skipped unbuffered), -1 too short to tell.
 */
function sseFieldStart(head: string): number {
  const c = head.charCodeAt(0)
  const field = c === 100 ? 'data:' : c === 101 ? 'event:' : c === 105 ? 'id:' : c === 114 ? 'retry:' : ''
  return field === '' ? 0 : head.startsWith(field) ? 1 : field.startsWith(head) ? -1 : 0
}

/**
 * The WHATWG event-stream parser over decoded text: LF, CRLF and lone CR end lines (also split
 * across chunks); one leading BOM (U+FEFF, or EF BB BF read as Latin-1) is skipped; comments,
 * `retry` and unknown fields are ignored; an event whose blank line never arrives is never
 * dispatched. Throws {@link SSEOverflowError} once the unterminated line plus the event's data
 * hold more than `maxBufferSize` UTF-16 units.
 */
class SSEParser {
  /** The unterminated line, in pieces joined once its end arrives: joining per chunk is quadratic. */
  private readonly pending: string[] = []
  private pendingUnits = 0
  private pendingKept = false
  private discarding = false
  /** The last chunk ended in CR: an LF starting the next one ends no second line. */
  private skipLF = false
  private atStart = true
  private data = ''
  private dataLines = 0
  private eventType: string | undefined = undefined
  private id: string | undefined = undefined
  /** `onEvent` gets each event's fields (no object is made for it: the adapter needs only `event` and `data`). */
  constructor(private readonly onEvent: (event: string, data: string, id: string | undefined) => void,
    private readonly maxBufferSize = Infinity) {}

  feed(text: string): void {
    let i = 0
    if (text.length === 0) return
    if (this.atStart) {
      this.atStart = false
      if (text.charCodeAt(0) === 0xfeff) i = 1
      else if (text.startsWith('\u00ef\u00bb\u00bf')) i = 3
    }
    if (this.skipLF) { this.skipLF = false; if (text.charCodeAt(i) === 10) i++ }
    const cr = text.indexOf('\r', i) // the chunk's first CR, if any: looked for once
    if (this.discarding) {
      const end = this.lineEnd(text, i, cr)
      if (end < 0) return
      this.discarding = false
      i = this.afterLine(text, end)
    } else if (this.pending.length > 0) {
      // A held line ends in this chunk: only that line is joined, so the rest of the chunk is read where it lies
      // (joining the whole chunk to it would copy every chunk that a line straddles).
      const held = this.pending
      const end = this.lineEnd(text, i, cr)
      if (end < 0) {
        held.push(i === 0 ? text : text.slice(i))
        return this.held(text.length - i)
      }
      const line = (held.length === 1 ? held.pop()! : held.splice(0).join('')) + text.slice(i, end)
      this.pendingUnits = 0; this.pendingKept = false
      i = this.afterLine(text, end)
      this.line(line, 0, line.length)
    }
    const rest = cr < 0 || (cr < i && text.indexOf('\r', i) < 0) ? this.linesLF(text, i) : this.linesCR(text, i)
    if (rest < text.length) this.pending.push(rest === 0 ? text : text.slice(rest))
    this.held(text.length - rest)
  }

  /**
   * `units` more were just held. Whether the line is one this parser ignores is read from its start only once it
   * holds more than SSE_UNCHECKED_UNITS (or would overflow): an ignored line is then dropped, so it holds little.
   */
  private held(units: number): void {
    const pending = this.pending
    if ((this.pendingUnits += units) + this.data.length <= Math.min(this.maxBufferSize, SSE_UNCHECKED_UNITS)) return
    if (!this.pendingKept && pending.length > 0) {
      const keep = sseFieldStart(pending.length === 1 ? pending[0] : pending.join(''))
      if (keep === 1) this.pendingKept = true
      else if (keep === 0) { pending.length = 0; this.pendingUnits = 0; this.discarding = true }
    }
    if (this.pendingUnits + this.data.length > this.maxBufferSize) {
      throw new SSEOverflowError(`the event stream held more than maxBufferSize = ${this.maxBufferSize} UTF-16 units`
        + ' in one line and event; raise maxBufferSize, or check that the source is an event stream')
    }
  }

  /** Where the line from `i` ends in `text` (its LF or CR), -1 if it does not; `cr`: the first CR at or after `i`. */
  private lineEnd(text: string, i: number, cr: number): number {
    const lf = text.indexOf('\n', i)
    return lf < 0 ? cr : cr < 0 ? lf : Math.min(lf, cr)
  }

  /** Where the next line begins after the line end at `end` (CRLF is one end; a CR last in the chunk may be). */
  private afterLine(text: string, end: number): number {
    if (text.charCodeAt(end) === 13) {
      if (end + 1 === text.length) this.skipLF = true
      else if (text.charCodeAt(end + 1) === 10) return end + 2
    }
    return end + 1
  }

  /**
   * The hot path, whole lines of a chunk with no CR: an empty line, `data:` and a one-line event
   * (`data: …` then a blank line) are read in place; anything else goes through {@link line}.
   * Returns where the unterminated rest begins.
   */
  private linesLF(text: string, pos: number): number {
    for (let lf = text.indexOf('\n', pos); lf >= 0; lf = text.indexOf('\n', pos)) {
      if (lf === pos) { this.dispatch(); pos++; continue }
      // `data:`, compared by char code: startsWith is a slower builtin call, more so on two-byte text.
      if (text.charCodeAt(pos) === 100 && text.charCodeAt(pos + 4) === 58 && text.charCodeAt(pos + 1) === 97
        && text.charCodeAt(pos + 2) === 116 && text.charCodeAt(pos + 3) === 97) {
        const value = text.slice(text.charCodeAt(pos + 5) === 32 ? pos + 6 : pos + 5, lf)
        if (this.dataLines === 0 && text.charCodeAt(lf + 1) === 10) { this.emit(value); pos = lf + 2; continue }
        this.data = this.dataLines++ === 0 ? value : `${this.data}\n${value}`
      } else this.line(text, pos, lf)
      pos = lf + 1
    }
    return pos
  }

  /** Whole lines of a chunk that holds a CR (LF, CRLF or CR end a line). Returns where the rest begins. */
  private linesCR(text: string, pos: number): number {
    const n = text.length
    while (pos < n) {
      let end = pos
      for (let c = text.charCodeAt(end); end < n && c !== 10 && c !== 13; c = text.charCodeAt(++end));
      if (end === n) break
      if (text.charCodeAt(end) === 13 && end + 1 === n) this.skipLF = true
      this.line(text, pos, end)
      pos = text.charCodeAt(end) === 13 && text.charCodeAt(end + 1) === 10 ? end + 2 : end + 1
    }
    return pos
  }

  /** One line `text[start, end)`: a blank line dispatches; `data`, `event` and `id` are read. */
  private line(text: string, start: number, end: number): void {
    if (start === end) return this.dispatch()
    if (text.charCodeAt(start) === 58) return
    let colon = text.indexOf(':', start)
    if (colon < 0 || colon > end) colon = end
    const valueStart = colon === end ? end : text.charCodeAt(colon + 1) === 32 ? colon + 2 : colon + 1
    const name = colon - start
    if (name === 4 && text.startsWith('data', start)) {
      const value = text.slice(valueStart, end)
      this.data = this.dataLines++ === 0 ? value : `${this.data}\n${value}`
    } else if (name === 5 && text.startsWith('event', start)) this.eventType = text.slice(valueStart, end) || undefined
    else if (name === 2 && text.startsWith('id', start)) {
      const value = text.slice(valueStart, end)
      if (!value.includes('\0')) this.id = value // WHATWG: an id holding NUL is ignored
    }
  }

  private dispatch(): void {
    if (this.dataLines === 0) { this.eventType = undefined; this.id = undefined; return }
    const data = this.data
    this.data = ''; this.dataLines = 0
    this.emit(data)
  }

  private emit(data: string): void {
    const event = this.eventType ?? 'message', id = this.id
    this.eventType = undefined; this.id = undefined
    this.onEvent(event, data, id)
  }
}

/** UTF-8 bytes of the sequence a lead byte starts. */
const utf8Needed = (lead: number): number => (lead >= 0xf0 ? 4 : lead >= 0xe0 ? 3 : 2)

/**
 * Decodes a stream of UTF-8 chunks (strings are passed through as decoded). V8's non-streaming
 * decoder is several times faster on text that is almost all ASCII and slower on other text, so
 * while the recent chunks held few non-ASCII bytes (under 1 in 256: (bytes − UTF-16 units) of a
 * decay-weighted count) a chunk is cut before a character split at its end and decoded whole; the
 * split bytes go to the streaming decoder, which ends that character at the start of the next chunk.
 * Otherwise the streaming decoder takes the chunk. Either way every character is intact and invalid
 * bytes give U+FFFD as the streaming decoder alone would. `ignoreBOM`: the parser skips exactly one
 * leading BOM itself (WHATWG). `undefined` ends the stream.
 */
function utf8Decoder(): (chunk: Uint8Array | string | undefined) => string {
  const streaming = new TextDecoder('utf-8', { ignoreBOM: true })
  const whole = new TextDecoder('utf-8', { ignoreBOM: true })
  let pending = false // the streaming decoder may hold the start of a character
  let units = 1, bytes = 1
  return (c) => {
    if (c === undefined) return streaming.decode()
    if (typeof c === 'string') return c
    const n = c.length
    let text: string, j = n - 1
    if ((bytes - units) * 256 > bytes) {
      text = streaming.decode(c, { stream: true })
      while (j > 0 && j > n - 4 && (c[j] & 0xc0) === 0x80) j--
      pending = j >= 0 && c[j] >= 0xc2 && c[j] <= 0xf4 && utf8Needed(c[j]) > n - j
    } else {
      let start = 0, head = ''
      if (pending) { // the end of a character split at the last chunk's end
        while (start < n && start < 3 && (c[start] & 0xc0) === 0x80) start++
        if (start === n) return streaming.decode(c, { stream: true })
        head = streaming.decode(c.subarray(0, start))
        pending = false
      }
      while (j > start && j > n - 4 && (c[j] & 0xc0) === 0x80) j--
      const cut = j >= start && c[j] >= 0xc2 && c[j] <= 0xf4 && utf8Needed(c[j]) > n - j ? j : n
      text = whole.decode(start === 0 && cut === n ? c : c.subarray(start, cut))
      if (head !== '') text = head + text
      if (cut < n) { streaming.decode(c.subarray(cut), { stream: true }); pending = true }
    }
    units = units / 2 + text.length
    bytes = bytes / 2 + n
    return text
  }
}

/**
 * Parses a server-sent event stream into its events (WHATWG rules): bytes are decoded as UTF-8 with
 * a streaming decoder, strings are taken as decoded; comments, `retry` and malformed lines are
 * skipped. The events of one chunk are parsed together and handed out from an array. Stopping the
 * iteration early cancels a `ReadableStream` source.
 * @param source a `ReadableStream<Uint8Array>` (e.g. `response.body`) or an async iterable of
 *   `Uint8Array | string` chunks.
 * @param options.maxBufferSize most UTF-16 units one unterminated line plus its event's data may
 *   hold (default: unbounded).
 * @throws RangeError past `maxBufferSize`; TypeError for a source that is not a stream.
 */
function parseSSE(
  source: ReadableStream<Uint8Array> | AsyncIterable<Uint8Array | string>,
  options: { maxBufferSize?: number } = {},
): AsyncIterableIterator<SSEEvent> {
  const pull = chunkPuller(source)
  let batch: SSEEvent[] = []
  let head = 0
  let ended = false
  const parser = new SSEParser((event, data, id) => {
    batch.push(id === undefined ? { event, data } : { event, data, id })
  }, sseBufferLimit(options.maxBufferSize))
  const decode = utf8Decoder()
  const done: IteratorResult<SSEEvent> = { value: undefined, done: true }
  async function fill(): Promise<IteratorResult<SSEEvent>> {
    while (head >= batch.length) {
      batch = []; head = 0
      if (ended) return done
      let r: IteratorResult<Uint8Array | string>
      try { r = await pull.next() } catch (err) { ended = true; pull.finished = true; throw err }
      if (r.done) { ended = true; pull.finished = true }
      try { parser.feed(decode(r.done ? undefined : r.value)) } catch (err) {
        ended = true
        await pull.close()
        throw err
      }
    }
    return { value: batch[head++], done: false }
  }
  return {
    next: () => (head < batch.length ? Promise.resolve({ value: batch[head++], done: false }) : fill()),
    async return(): Promise<IteratorResult<SSEEvent>> {
      ended = true; batch = []; head = 0
      await pull.close()
      return done
    },
    [Symbol.asyncIterator]() { return this },
  }
}

/** A `maxBufferSize` option: a positive integer of UTF-16 units, or undefined for no limit. */
function sseBufferLimit(maxBufferSize: unknown): number {
  if (maxBufferSize === undefined) return Infinity
  if (isIntegerAtLeast(maxBufferSize, 1)) return maxBufferSize
  throw new RangeError(`parseSSE: maxBufferSize must be a positive integer (UTF-16 units), `
    + `got ${shown(maxBufferSize)}`)
}

/**
 * The adapter's one body reader, for event streams and whole bodies alike: hands each chunk of `body` to `onChunk`
 * (`undefined` once it ended) until `onChunk` returns true; the rest is cancelled unread (closing the connection).
 * `signal` aborting cancels the body and rejects with its reason; rejects with what `onChunk` or the body threw.
 */
async function eachChunk(body: ReadableStream<Uint8Array>, signal: AbortSignal,
  onChunk: (chunk: Uint8Array | undefined) => boolean | void): Promise<void> {
  const pull = chunkPuller(body)
  const onAbort = (): void => { pull.close().catch(() => {}) } // settles a pending read at once (WHATWG streams)
  signal.addEventListener('abort', onAbort, { once: true })
  try {
    for (;;) {
      if (signal.aborted) throw signal.reason
      let r: IteratorResult<Uint8Array | string>
      try { r = await pull.next() } catch (err) { pull.finished = true; throw err }
      if (signal.aborted) throw signal.reason
      if (r.done) pull.finished = true
      if (onChunk(r.done ? undefined : r.value as Uint8Array) === true || r.done) return
    }
  } finally {
    signal.removeEventListener('abort', onAbort)
    await pull.close()
  }
}

/**
 * Reads chunks from a `ReadableStream` or an (async) iterable: `next()` is the source's own read (one
 * promise per chunk, no wrapper of ours around it); `close()` stops early and cancels the stream
 * behind it (closing the connection) unless the reader set `finished` (the source ended or threw).
 */
interface ChunkSource {
  next(): Promise<IteratorResult<Uint8Array | string>>
  close(): Promise<void>
  finished: boolean
}

function chunkPuller(source: unknown): ChunkSource {
  if (source !== null && typeof source === 'object' && typeof (source as ReadableStream).getReader === 'function') {
    const reader = (source as ReadableStream<Uint8Array>).getReader()
    return {
      finished: false,
      next: () => reader.read() as Promise<IteratorResult<Uint8Array>>,
      // not awaited: a proxying source's cancel may never settle, and nothing waits on a server (docs/design.md §13)
      async close() { if (!this.finished) { this.finished = true; reader.cancel().catch(() => {}) } },
    }
  }
  if (source !== null && typeof source === 'object' && (Symbol.asyncIterator in source || Symbol.iterator in source)) {
    const async = Symbol.asyncIterator in source
    const it: AsyncIterator<Uint8Array | string> | Iterator<Uint8Array | string> = async
      ? (source as AsyncIterable<Uint8Array | string>)[Symbol.asyncIterator]()
      : (source as Iterable<Uint8Array | string>)[Symbol.iterator]()
    return {
      finished: false,
      next: async ? () => it.next() as Promise<IteratorResult<Uint8Array | string>> : async () => it.next(),
      async close() { if (!this.finished) { this.finished = true; await it.return?.() } },
    }
  }
  throw new TypeError(`parseSSE needs a ReadableStream<Uint8Array> or an AsyncIterable of Uint8Array | string, `
    + `got ${source === null ? 'null' : typeof source}`)
}

// ── 2.2 Error classification ────────────────────────────

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
 * rate limit is never an overflow (docs/design.md §6).
 */
const RATE_LIMIT_RE = /* @__PURE__ */ anyOf(['rate[ _-]?limit', 'too many requests', 'tokens per min',
  'requests per min', '\\b(?:TPM|RPM|TPD|RPD)\\b', 'per[ -]minute', 'resource[_ ]exhausted'])

/**
 * Context-window overflow wordings that state no counts, one per line with the servers known to use it. A
 * message that states a prompt size and the limit it exceeds needs no line here ({@link overflowCounts}).
 */
const OVERFLOW_PATTERNS: readonly RegExp[] = [
  /context[_ ]length[_ ]exceeded/i, // OpenAI, Groq, OpenRouter code `context_length_exceeded`
  /exceed_context_size/i, // llama.cpp server `exceed_context_size_error`
  /\bexceed(?:s|ed)?\b[^.]{0,60}?\bcontext (?:window|length|size|limit)/i, // llama.cpp, OpenAI (new), Anthropic, Ollama
  /\bcontext (?:window|length|size|limit)\b[^.]{0,40}?\bexceed/i, // MiniMax, generic "context window exceeded"
  /\b(?:prompt|input) (?:is )?too long\b/i, // Anthropic "prompt is too long", Bedrock "Input is too long", Fireworks
  /\btokens? \+ `?max_new_tokens`? must be <=/i, // Hugging Face TGI (Together, Inference Endpoints)
  /exceeded model token limit/i, // Moonshot / Kimi
  /greater than the context length|context the overflows|context length of only/i, // LM Studio
  /range of input length should be/i, // Alibaba DashScope / Qwen
  /prompt exceeds max length/i, // Zhipu GLM
  /reduce the length of the messages/i, // OpenAI, Groq (the "no numbers" form)
  /max_tokens must be at least 1, got -\d/i, // vLLM: a negative room means the prompt alone overflows
  /\binput token count exceeds\b/i, // Gemini 2.5 "The input token count exceeds the maximum number of tokens allowed"
  /\bsize limit exceeded by\b/i, // Cohere "too many tokens: size limit exceeded by 1502 tokens"
  /ContextWindowExceededError/i, // LiteLLM proxy, its class name for any upstream's overflow
]

/** Out of balance or quota (not retried: only money helps). */
const QUOTA_RE = /* @__PURE__ */ anyOf(['insufficient[_ ]?(?:balance|quota|credits?|funds)',
  'exceeded your current quota', 'billing', 'credit balance', 'payment required', 'out of credits',
  'not enough credits', 'spending limit', 'purchase more credits'])
/** A key the server does not take, whatever the status says (Gemini: 400 INVALID_ARGUMENT, reason API_KEY_INVALID). */
const BAD_KEY_RE = /invalid[_ ]api[_ ]key|incorrect api key|api[_ ]key not valid|api_key_invalid/i
/** Authentication and permission wording, used when no HTTP status says so. */
const AUTH_RE = /authenticat|unauthori[sz]ed|permission[_ ]denied|permission_error|forbidden/i
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

const isErrorStatus = (status: unknown): status is number => typeof status === 'number' && Number.isInteger(status)
  && status >= 400 && status <= 599

/** Reads what an error body says, whatever its shape (docs/design.md §6). Never throws on strings. */
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
      if (nested !== undefined && typeof nested !== 'number' && typeof nested !== 'boolean')
        return collect(nested, depth + 1, key)
      strings.push(value)
      if (info.message === undefined && value.trim() !== ''
        && (key === undefined || ERROR_MESSAGE_KEYS.has(key))) info.message = value.trim()
      return
    }
    if (typeof value === 'number') {
      if (key !== undefined && ERROR_STATUS_KEYS.has(key) && info.status === undefined
        && isErrorStatus(value)) info.status = value
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
  // no known key (`errorMessage` of a Lambda, `error_msg`, `status_msg`): the text as it is, as when it is not JSON
  info.haystack = strings.length > 0 ? strings.join('\n') : text
  if (info.message && info.message.length > 500) info.message = `${info.message.slice(0, 500)}…`
  return info
}

/**
 * Maps a failed response to a {@link ProviderErrorCode} (docs/design.md §6). Never throws, whatever
 * it is given. The body may be JSON (`{"error":{...}}`, an array of such objects, `{"error":
 * "text"}`, a top-level `{"object":"error", …}`, a body double-encoded as a JSON string, a proxy
 * message wrapping the upstream JSON), an SSE excerpt, plain text, or empty.
 *
 * Order: 429 or rate-limit wording → RATE_LIMIT (a rate limit is never an overflow, whatever it
 * says about tokens; a 429 in balance or quota wording and none of a rate limit is QUOTA); a message
 * that states a prompt or input size in tokens above a limit it names, in any wording (the shape of
 * {@link overflowCounts}: Gemini, xAI, Cohere, DeepSeek, OpenAI, Anthropic …), or an overflow wording
 * without counts (Groq, llama.cpp, LM Studio, Ollama, Moonshot, Qwen, GLM, TGI, LiteLLM) →
 * CONTEXT_WINDOW_EXCEEDED (also on a 5xx: proxies wrap overflows); 402 or balance wording → QUOTA;
 * 401/403 or a key refused in words (Gemini's 400) → AUTH; 408 → TIMEOUT; a bare 413 →
 * CONTEXT_WINDOW_EXCEEDED (the request is too big; shrinking it is the cure); other 4xx → INVALID_REQUEST (an
 * output-cap error like "max_tokens: 300000 > 128000" lands here); 5xx → SERVER.
 *
 * Errors inside a 200 stream: pass `status` 200 (or undefined). Then a numeric `code`, `status`
 * or `status_code` in the body stands in for the HTTP status; without one the wording decides
 * (AUTH, SERVER, INVALID_REQUEST; SERVER when nothing matches), an empty body is EMPTY_RESPONSE
 * and a non-JSON body MALFORMED_RESPONSE.
 * @param status HTTP status, or 200/undefined for an in-stream error.
 * @param bodyText the response body (or the in-stream `data:` payload) as text.
 */
function classifyProviderError(status: number | undefined, bodyText: string): ProviderErrorCode {
  return readErrorBody(status, bodyText).code
}

/**
 * An error body read once: its code (the rules of {@link classifyProviderError}) and what it says
 * (`info`, for the error's message and in-stream status). Never throws.
 */
function readErrorBody(status: number | undefined, bodyText: unknown): { code: ProviderErrorCode;
  info?: ErrorBodyInfo } {
  let info: ErrorBodyInfo | undefined
  try {
    info = inspectErrorBody(typeof bodyText === 'string' ? bodyText : bodyText == null ? '' : String(bodyText))
    return { code: codeOfErrorBody(status, info), info }
  } catch {
    return { code: isErrorStatus(status) && status < 500 ? 'INVALID_REQUEST' : 'SERVER', info }
  }
}

/** A count in an error text (thousands commas allowed); not a piece of a word, an id, a version or a date. */
const COUNT_RE = /(?<![\w.,-])(\d{1,3}(?:,\d{3})+|\d+)(?!\w|[.,]\d)/g
/** What may stand between a cue word and its count: quotes, `(`, `:`, `=`, small words ("is", "of", "about"). */
const glue = (): string =>
  String.raw`(?:[\s"'\\:=(\[~]|\b(?:is|of|to|be|was|about|approximately|least|the|only|just|an?)\b)*$`
/** Words right before a count that make it a limit (maximum, limit, allowed, at most, less than, context size,
 *  `n_ctx`) … */
const LIMIT_BEFORE = /* @__PURE__ */ (() => new RegExp(String.raw`(?:(?<![a-z])(?:max(?:imum)?(?:[ _-]+[a-z]+){0,3}`
  + String.raw`|limit(?:ed)?|allow(?:s|ed)?|most|up|capacity|context(?:[ _-]+(?:window|length|size))?`
  + String.raw`|exceed(?:s|ed|ing)?|ctx|(?:less|fewer) than)|<=|≤)${glue()}`, 'i'))()
/** … or the size of what was sent (prompt, input, request, messages, count, got, contains, `n_prompt_tokens`). */
const SIZE_BEFORE = /* @__PURE__ */ (() => new RegExp(String.raw`(?<![a-z])(?:prompt|inputs?|request(?:ed)?|messages?`
  + String.raw`|got|contains?|count|received|given|provided|resulted in|sent|uses?|needs?|has|have|total|length)`
  + String.raw`(?:[ _-]+(?:tokens?|length|size|count))*${glue()}`, 'i'))()
/** Words right after a count that make it a limit ("200000 maximum", "8,000-token window") or a part of the prompt. */
const LIMIT_AFTER = /^[\s)-]*(?:tokens?[\s)-]*)?,?\s*(?:max(?:imum)?|limit|window|context)\b/i
const PART_AFTER = /* @__PURE__ */ (() => new RegExp(String.raw`^\s*(?:tokens?\s+)?(?:in (?:the|your) (?:messages`
  + String.raw`|prompt|functions|tools|input)|of (?:text |tool )?input|(?:prompt|input) tokens)`, 'i'))()
/** `A > B`, "A exceeds B": a size, then its limit. */
const COMPARE_RE = /^\s*(?:tokens?)?\s*\)?\s*(?:>|exceeds?|is (?:more|greater|larger) than)\s*\(?\s*$/i
/** A count near these words is about the output (max_tokens, the completion), not the prompt. */
const OUTPUT_NEAR = /max_(?:new_|completion_|output_)?tokens|completion|output|generat/i

/**
 * Token counts an overflow error states (docs/design.md §6, §10), read from the body text (JSON or not) by
 * shape, not by phrase. A count is a limit when a word right before it says so (maximum, limit, allowed, at
 * most, up to, context size, exceeds, `<=`, `n_ctx`) or one right after it does ("200000 maximum", "8,000-token
 * window"); a size when a word before it names what was sent (prompt, input, request, messages, count, got,
 * received, `n_prompt_tokens`) or one after it names a part of the prompt ("62219 in the messages"); `A > B`
 * and `A + B > C` compare sizes with a limit. A count near output words (max_tokens, completion, output) is
 * skipped, except the C of `A + B > C` (the whole request against the window). `contextTokens`: the first
 * limit; `promptTokens`: the parts of the prompt summed, else the largest size; `requestedTokens`: a size that
 * holds the completion too ("requested N tokens", "a total of N", the `A + B`). What the text does not state is
 * absent. Never throws.
 */
function overflowCounts(bodyText: string): { promptTokens?: number; contextTokens?: number; requestedTokens?: number } {
  const text = typeof bodyText === 'string' ? bodyText.slice(0, ERROR_BODY_MAX_UNITS) : ''
  const found = [...text.matchAll(COUNT_RE)]
  const at = (i: number) => Number(found[i][1].replace(/,/g, ''))
  const gap = (i: number) => text.slice(found[i].index + found[i][0].length, found[i + 1]?.index ?? text.length)
  const before = (i: number) => (i > 0 ? gap(i - 1) : text.slice(0, found[0].index)).slice(-80)
  const output = (i: number) => OUTPUT_NEAR.test(before(i).slice(-30) + gap(i).slice(0, 80))
  let context: number | undefined, prompt = 0, parts = 0, requested = 0
  const size = (n: number) => { prompt = Math.max(prompt, n) }
  for (let i = 0; i < found.length; i++) {
    if (output(i)) continue
    const after = gap(i).slice(0, 80)
    if (i + 2 < found.length && /^\s*(?:tokens?)?\s*\+\s*$/.test(after) && COMPARE_RE.test(gap(i + 1))) {
      size(at(i)); requested = Math.max(requested, at(i) + at(i + 1)); context ??= at(i + 2); i += 2
    } else if (i + 1 < found.length && COMPARE_RE.test(after) && !output(i + 1)) { size(at(i)); context ??= at(++i) }
    else if (LIMIT_AFTER.test(after) || LIMIT_BEFORE.test(before(i))) context ??= at(i)
    else if (PART_AFTER.test(after)) parts += at(i)
    else if (/(?:requested|\ba total of)\W*(?:about|at least)?\W*$/i.test(before(i))) {
      requested = Math.max(requested, at(i))
    } else if (SIZE_BEFORE.test(before(i))) size(at(i))
  }
  const out: { promptTokens?: number; contextTokens?: number; requestedTokens?: number } = {}
  if (parts > 0 || prompt > 0) out.promptTokens = parts > 0 ? parts : prompt
  if (context !== undefined && context > 0) out.contextTokens = context
  if (requested > 0) out.requestedTokens = requested
  return out
}

/**
 * Whether an error text states a prompt (or request) in tokens larger than a limit it names, in any
 * wording and order ({@link overflowCounts}), and is not about a quota of a day or an hour.
 */
function statesOverflow(text: string): boolean {
  // in tokens, or in the length of a prompt, input or sequence (TensorRT-LLM, TabbyAPI), not of a string or image
  if (!/\btokens?\b|\b(?:prompt|input|sequence) length\b/i.test(text)
    || !/prompt|input|context|request|message|sequence/i.test(text)) return false
  if (/\b(?:daily|monthly|per (?:day|hour|month)|today)\b/i.test(text)) return false
  const c = overflowCounts(text)
  return c.contextTokens !== undefined && Math.max(c.promptTokens ?? 0, c.requestedTokens ?? 0) > c.contextTokens
}

function codeOfErrorBody(status: number | undefined, info: ErrorBodyInfo): ProviderErrorCode {
  const s = isErrorStatus(status) ? status : info.status
  const h = info.haystack
  // OpenAI's 429 `insufficient_quota` ("check your plan and billing details") is no rate limit: waiting never helps
  if (s === 429 || RATE_LIMIT_RE.test(h)) return s === 429 && QUOTA_RE.test(h) && !RATE_LIMIT_RE.test(h) ? 'QUOTA'
    : 'RATE_LIMIT'
  if (OVERFLOW_PATTERNS.some((re) => re.test(h)) || statesOverflow(h)) return 'CONTEXT_WINDOW_EXCEEDED'
  if (s === 402 || QUOTA_RE.test(h)) return 'QUOTA'
  if (s === 401 || s === 403 || BAD_KEY_RE.test(h)) return 'AUTH'
  if (s === 408) return 'TIMEOUT'
  if (s === 413) return 'CONTEXT_WINDOW_EXCEEDED'
  if (s !== undefined) return s < 500 ? 'INVALID_REQUEST' : 'SERVER'
  if (info.blank) return 'EMPTY_RESPONSE'
  if (AUTH_RE.test(h)) return 'AUTH'
  if (SERVER_RE.test(h)) return 'SERVER'
  if (INVALID_RE.test(h)) return 'INVALID_REQUEST'
  return info.parsed ? 'SERVER' : 'MALFORMED_RESPONSE'
}

/** What to do about each code, appended to error messages (docs/design.md §0: an error names the fix). */
const ERROR_HINTS: Readonly<Record<ProviderErrorCode, string>> = {
  CONTEXT_WINDOW_EXCEEDED: 'The prompt does not fit the context window: prune or compact the session, '
    + 'or lower maxTokens.',
  RATE_LIMIT: 'Rate limited: wait, send fewer or smaller requests, or raise the account limits.',
  QUOTA: 'The account has no balance or quota left: top it up or use another API key.',
  AUTH: 'Check the API key and its permissions (option apiKey; CLI: --api-key-env NAME).',
  INVALID_REQUEST: 'The server rejected the request; the body above names the field.',
  SERVER: 'The server failed; try again later.',
  TRANSPORT: 'Check the network and baseURL.',
  TIMEOUT: 'The server made no progress for IDLE_TIMEOUT_MS (5 minutes), or the call passed REQUEST_TIMEOUT_MS '
    + '(1 hour); try again later.',
  ABORTED: 'The caller aborted the request.',
  EMPTY_RESPONSE: 'The server answered with nothing; try again later.',
  MALFORMED_RESPONSE: 'The server does not speak the stream format of this adapter (OpenAI chat completions for '
    + 'openAICompatible, Anthropic Messages for anthropic); check baseURL.',
  RESPONSE_TOO_LARGE: 'The server sent more than dsh reads (MAX_MESSAGE_BYTES, 8 MiB of one message); lower '
    + 'maxTokens.',
}

/** Seconds, an HTTP date, or OpenAI's `retry-after-ms`, in ms (RFC 9110 §10.2.3). */
function parseRetryAfterMs(headers: Headers, nowMs: number): number | undefined {
  const ms = headers.get('retry-after-ms')?.trim()
  if (ms && /^\d+(?:\.\d+)?$/.test(ms)) return Math.ceil(parseFloat(ms))
  const value = headers.get('retry-after')?.trim()
  if (!value) return undefined
  // A repeated header comes joined by ", " (the first counts). A date only as HTTP writes one, from its day's name:
  // Date.parse reads "-1", "1 2" or "2, 3" as dates in 2001, which would retry at once.
  const seconds = /^(\d+(?:\.\d+)?)\s*(?:,|$)/.exec(value)
  if (seconds) return Math.ceil(parseFloat(seconds[1]) * 1000)
  const date = /^[a-z]{3,9},? /i.test(value) ? Date.parse(value) : NaN
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

// ── 2.3 Reply assembly: events of both wire formats → the assistant message ──

/** Collects one streamed (or non-streamed) completion in block order; emits deltas as they arrive. */
class ReplyAssembler {
  private readonly blocks: Block[] = []
  private readonly calls: ToolCallBlock[] = []
  private readonly slotOfIndex = new Map<number, number>()
  /** The next text or reasoning starts a block of its own (a format's new content block). */
  fresh = false
  finishReason: string | undefined
  usage: Usage | undefined
  /** The format's own usage fields so far (Anthropic sends them in two events). */
  wireUsage: Record<string, unknown> = {}
  responseId: string | undefined
  requestId: string | undefined
  /** Whether any text, reasoning or tool-call delta arrived (the adapter never retries after one). */
  streamed = false
  private messageBytes = 0 // text, reasoning and tool-call ids, names and arguments so far, UTF-8 bytes
  private readonly emit: (event: StreamEvent) => void
  /** Whether anyone listens: deltas are built as events only then. */
  private readonly listening: boolean
  constructor(readonly cfg: AdapterConfig, emit: ((event: StreamEvent) => void) | undefined,
    private readonly progress: () => void = () => {}) {
    this.emit = emit ?? (() => {})
    this.listening = emit !== undefined
  }

  /** RESPONSE_TOO_LARGE for a message past one of its caps (`why`); `partial()` keeps its text. */
  private tooLarge(why: string): ProviderError {
    const { cfg } = this
    return providerError(cfg, 'RESPONSE_TOO_LARGE', `the assistant message from ${cfg.endpoint} (model ${cfg.model}) `
      + `${why}; the stream was cancelled and the text so far kept as an interrupted message (none of its tool calls `
      + 'runs).', { status: 200 })
  }

  /** Counts a delta against the message cap before it is kept, so nothing past the cap is held; it is progress. */
  admit(delta: string): void {
    const cap = this.cfg.maxMessageBytes
    this.messageBytes += utf8Length(delta, cap)
    if (this.messageBytes > cap) {
      throw this.tooLarge(`passed MAX_MESSAGE_BYTES, ${cap} bytes of text, reasoning and tool-call ids, names and `
        + 'arguments')
    }
    this.progress()
  }

  /** Text or reasoning: appended to the last block when it is of the same kind and no new block began. */
  add(kind: 'text' | 'reasoning', delta: string): void {
    if (delta === '') return
    this.admit(delta)
    const last = this.blocks.length > 0 ? this.blocks[this.blocks.length - 1] : undefined
    if (!this.fresh && last !== undefined && last.type === kind) (last as TextBlock).text += delta
    else this.blocks.push({ type: kind, text: delta })
    this.fresh = false
    this.streamed = true
    if (this.listening) {
      this.emit(kind === 'text' ? { type: 'text-delta', text: delta } : { type: 'reasoning-delta', text: delta })
    }
  }

  /** A signature of the reasoning block just streamed (sent back with it). */
  sign(signature: string): void {
    const last = this.blocks[this.blocks.length - 1] as ReasoningBlock | undefined
    if (signature === '' || last?.type !== 'reasoning') return
    this.admit(signature)
    last.signature = (last.signature ?? '') + signature
  }

  /** A block dsh does not interpret (e.g. `redacted_thinking`), kept in position as it came. */
  keep(block: OtherBlock): void {
    this.admit(this.json(block))
    this.blocks.push(block)
    this.fresh = false
    this.streamed = true
  }

  /** Usage so far; progress only when a figure changed. */
  setUsage(usage: Usage): void {
    const u = this.usage
    if (!u || u.promptTokens !== usage.promptTokens || u.completionTokens !== usage.completionTokens) this.progress()
    this.usage = usage
  }

  /** The slot of a tool-call delta: by `index`, else by id, else the last call; a new slot when none fits. */
  private slotOf(wireIndex: number | undefined, id: string | undefined, name: string | undefined): number {
    const calls = this.calls
    const byId = (): number | undefined => {
      const k = calls.findIndex((c) => c.id === id)
      return k >= 0 ? k : undefined
    }
    let slot: number | undefined
    if (wireIndex !== undefined) {
      slot = this.slotOfIndex.get(wireIndex)
      // A different id on a known index: that id's own call (calls interleaved on one index), else a new call
      // (servers that send every call as index 0). A new index is a new call, whatever its id.
      if (slot !== undefined && id !== undefined && calls[slot].id !== '' && calls[slot].id !== id) slot = byId()
    } else if (id !== undefined) slot = byId()
    // No index, no id: the continuation of the last call, unless it names a call once the last one has its name
    // (a name comes once, on a call's first delta: servers that send each whole call so are sending a new one).
    else if (calls.length > 0 && !(name !== undefined && calls[calls.length - 1].name !== '')) slot = calls.length - 1
    if (slot !== undefined) return slot
    const max = MAX_TOOL_CALLS_PER_MESSAGE
    if (calls.length >= max) throw this.tooLarge(`has more than ${max} tool calls, the most dsh takes in one message`)
    const call: ToolCallBlock = { type: 'tool-call', id: '', name: '', arguments: '' }
    calls.push(call)
    this.blocks.push(call)
    this.fresh = false
    if (wireIndex !== undefined) this.slotOfIndex.set(wireIndex, calls.length - 1)
    return calls.length - 1
  }

  /** A piece of a tool call: its id and name (kept once, from the first delta that has them) and arguments. */
  tool(wireIndex: number | undefined, id: string | undefined, name: string | undefined, args: string): void {
    const slot = this.slotOf(wireIndex, id, name)
    const call = this.calls[slot]
    const newId = id !== undefined && call.id === '' ? id : undefined
    const newName = name !== undefined && call.name === '' ? name : undefined
    for (const kept of [newId, newName, args]) if (kept) this.admit(kept)
    if (newId) call.id = newId
    if (newName) call.name = newName
    call.arguments += args
    if (newId || newName || args) {
      this.streamed = true
      if (this.listening) this.emit({ type: 'tool-call-delta', index: slot, ...(newId ? { id: newId } : {}),
        ...(newName ? { name: newName } : {}), argumentsDelta: args })
    }
  }

  /** MALFORMED_RESPONSE: what the server sent cannot be read (`why`); not retried, the same bytes would come back. */
  malformed(why: string, cause?: unknown): ProviderError {
    const { endpoint, model } = this.cfg
    return providerError(this.cfg, 'MALFORMED_RESPONSE', `the reply from ${endpoint} (model ${model}) ${why}`,
      { requestId: this.requestId, status: 200, ...(cause === undefined ? {} : { cause }) })
  }

  /** A server's object as JSON text (a tool call's arguments, a kept block); refused past MAX_NESTING_LEVELS. */
  json(value: object): string {
    if (nestedDeeperThan(value)) throw this.malformed(`nests an object more than ${MAX_NESTING_LEVELS} levels deep`)
    return JSON.stringify(value)
  }

  /** MALFORMED_RESPONSE for a data event that is not a JSON object. */
  notAnObject(dataText: string): ProviderError {
    return providerError(this.cfg, 'MALFORMED_RESPONSE', `stream from ${this.cfg.endpoint} sent a data event that is `
      + `not a JSON object: ${dataText.slice(0, 200)}`, { body: dataText, requestId: this.requestId, status: 200 })
  }

  /** The text and reasoning so far as an interrupted message (tool calls dropped: their arguments may be cut). */
  partial(): AssistantMessage | undefined {
    const content = this.blocks.filter((b) => b.type === 'text' || b.type === 'reasoning')
    return content.length === 0 ? undefined : { role: 'assistant', content, interrupted: true }
  }

  /** The assembled answer; TRANSPORT for a stream that ended with no end marker nor finish reason, EMPTY_RESPONSE. */
  finish(sawDone: boolean): ChatResponse {
    const { cfg, usage, requestId } = this
    if (!sawDone && this.finishReason === undefined) {
      throw providerError(cfg, 'TRANSPORT', `stream from ${cfg.endpoint} ended without its end marker and without a `
        + `finish reason (model ${cfg.model}).`, { requestId, status: 200 })
    }
    if (!this.streamed && this.finishReason === 'length') {
      // The output budget ran out before anything was said: the same request would spend it the same way.
      const error = providerError(cfg, 'EMPTY_RESPONSE', `${cfg.endpoint} (model ${cfg.model}) reached its output `
        + `limit (finish reason length) before any text, reasoning or tool call; not retried, since the same request `
        + `would spend its budget the same way: raise the provider's maxTokens`, { requestId, status: 200 })
      notRetried.add(error)
      throw error
    }
    if (!this.streamed && this.finishReason !== 'content_filter') {
      throw providerError(cfg, 'EMPTY_RESPONSE', `${cfg.endpoint} (model ${cfg.model}) finished without any text, `
        + `reasoning or tool call.`, { requestId, status: 200 })
    }
    // The ids as the server sent them ('' when it sent none): the Agent repairs missing and repeated
    // ids in one place (withCallIds), where it knows the log's seq and the ids already used.
    const reason = this.finishReason ?? (this.calls.length > 0 ? 'tool_calls' : 'stop')
    if (usage) this.emit({ type: 'usage', usage })
    this.emit({ type: 'finish', finishReason: reason })
    const response: ChatResponse = { message: { role: 'assistant', content: this.blocks }, finishReason: reason }
    if (usage) response.usage = usage
    const id = requestId ?? this.responseId
    if (id !== undefined) response.requestId = id
    return response
  }
}

/** Deepest nesting of arrays and objects dsh keeps from outside (a server's block, a transcript): JSON.parse
 *  takes 100,000 levels, JSON.stringify and structuredClone overflow the stack on a few thousand later. */
const MAX_NESTING_LEVELS = 1_000

/** Whether `value` nests arrays and objects more than `max` levels deep (an explicit stack: no overflow). */
function nestedDeeperThan(value: unknown, max = MAX_NESTING_LEVELS): boolean {
  const stack: Array<[unknown, number]> = [[value, 1]]
  while (stack.length > 0) {
    const [v, depth] = stack.pop()!
    if (depth > max) return true
    for (const child of Object.values(v as object)) {
      if (typeof child === 'object' && child !== null) stack.push([child, depth + 1])
    }
  }
  return false
}

/** One chat-completions chunk object (or a whole non-streamed completion). Throws the in-stream error it carries. */
function openAIChunk(acc: ReplyAssembler, obj: unknown, dataText: string): boolean {
  if (!isRecord(obj)) throw acc.notAnObject(dataText)
  const { cfg, requestId } = acc
  if (obj.error !== undefined && obj.error !== null) throw inStreamError(cfg, dataText, requestId)
  if (acc.responseId === undefined && typeof obj.id === 'string' && obj.id !== '') acc.responseId = obj.id
  const u = readUsage(obj.usage)
  if (u) acc.setUsage(u) // running totals (SiliconFlow) or a final chunk: the last one wins
  const choices: unknown[] = Array.isArray(obj.choices) ? obj.choices : []
  for (const choice of choices) {
    // n = 1 is requested
    if (!isRecord(choice) || (typeof choice.index === 'number' && choice.index !== 0)) continue
    const delta = isRecord(choice.delta) ? choice.delta : isRecord(choice.message) ? choice.message : undefined
    if (delta) {
      const r = typeof delta.reasoning_content === 'string' && delta.reasoning_content !== ''
        ? delta.reasoning_content
        : typeof delta.reasoning === 'string' ? delta.reasoning : '' // `reasoning`: OpenRouter, Groq
      acc.add('reasoning', r)
      if (typeof delta.content === 'string') acc.add('text', delta.content)
      else if (Array.isArray(delta.content)) contentParts(acc, delta.content)
      // A whole message's calls are whole: each element is a call of its own, also without an id or index.
      const whole = delta === choice.message
      const calls: unknown[] = Array.isArray(delta.tool_calls) ? delta.tool_calls : []
      calls.forEach((tc, i) => openAIToolCall(acc, tc, whole ? i : undefined))
    }
    if (typeof choice.finish_reason === 'string' && choice.finish_reason !== '') {
      acc.finishReason = choice.finish_reason
      if (acc.finishReason === 'error') {
        throw providerError(cfg, 'SERVER', `stream from ${cfg.endpoint} ended with finish_reason "error".`,
          { body: dataText, requestId, status: 200 })
      }
    }
  }
  return false
}

/** `content` sent as parts: text, and Mistral Magistral's `{type: 'thinking', thinking: [text parts]}` as reasoning. */
function contentParts(acc: ReplyAssembler, parts: unknown[]): void {
  for (const p of parts) {
    if (!isRecord(p)) continue
    if (p.type === 'text' && typeof p.text === 'string') acc.add('text', p.text)
    else if (p.type === 'thinking' && Array.isArray(p.thinking)) {
      for (const t of p.thinking) if (isRecord(t) && typeof t.text === 'string') acc.add('reasoning', t.text)
    }
  }
}

function openAIToolCall(acc: ReplyAssembler, tc: unknown, position?: number): void {
  if (!isRecord(tc)) return
  const fn = isRecord(tc.function) ? tc.function : {}
  const id = typeof tc.id === 'string' && tc.id !== '' ? tc.id : undefined // Qwen sends "" after the first delta
  // Mistral sends "" after the first delta
  const name = typeof fn.name === 'string' && fn.name !== '' ? fn.name : undefined
  const args = typeof fn.arguments === 'string' ? fn.arguments : isRecord(fn.arguments) ? acc.json(fn.arguments) : ''
  acc.tool(typeof tc.index === 'number' ? tc.index : position, id, name, args)
}

/** A count field: a non-negative finite number; anything else (negative, NaN as a string, …) is absent. */
const tokenCount = (v: unknown): number | undefined => (typeof v === 'number' && Number.isFinite(v) && v >= 0
  ? v : undefined)

function readUsage(u: unknown): Usage | undefined {
  if (!isRecord(u)) return undefined
  const n = tokenCount
  const prompt = n(u.prompt_tokens)
  const completion = n(u.completion_tokens)
  if (prompt === undefined && completion === undefined) return undefined
  const usage: Usage = { promptTokens: prompt ?? 0, completionTokens: completion ?? 0 }
  const cached = n(u.prompt_cache_hit_tokens) ?? (isRecord(u.prompt_tokens_details)
    ? n(u.prompt_tokens_details.cached_tokens) : undefined)
  if (cached !== undefined) usage.cachedTokens = cached
  const reasoning = (isRecord(u.completion_tokens_details) ? n(u.completion_tokens_details.reasoning_tokens)
    : undefined) ?? n(u.reasoning_tokens)
  if (reasoning !== undefined) usage.reasoningTokens = reasoning
  return usage
}

/**
 * An error event inside a 200 stream (`data: {"error": …}` or `event: error`), classified like an
 * HTTP error body. Its status is the numeric code the payload carries (`code`, `status`,
 * `status_code`), else the 200 the response had.
 */
function inStreamError(cfg: AdapterConfig, payload: string, requestId: string | undefined): ProviderError {
  const { code: classified, info } = readErrorBody(200, payload)
  // An explicit error event whose payload says nothing readable is still the server's failure.
  const code = classified === 'MALFORMED_RESPONSE' || classified === 'EMPTY_RESPONSE' ? 'SERVER' : classified
  return providerError(cfg, code, `error inside the stream from ${cfg.endpoint} (model `
    + `${cfg.model})${info?.message ? `: ${info.message}` : ''}.`, { status: info?.status ?? 200, body: payload,
    requestId })
}

/** The objects of a data event that a relay joined from several `data:` lines (one JSON value per line). */
class ChunkList { constructor(readonly list: unknown[]) {} }

/** A data event that is not JSON: a relay's joined `data:` lines as a {@link ChunkList}, else MALFORMED_RESPONSE. */
function relayChunks(cfg: AdapterConfig, data: string, requestId: string | undefined, error: unknown): ChunkList {
  if (data.includes('\n')) {
    const lines = data.split('\n').filter((line) => line.trim() !== '')
    try { return new ChunkList(lines.map((line) => JSON.parse(line))) } catch { /* fall through */ }
  }
  throw providerError(cfg, 'MALFORMED_RESPONSE', `stream from ${cfg.endpoint} sent a data event that is not JSON: `
    + `${data.slice(0, 200)}`, { body: data, requestId, status: 200, cause: error })
}

/**
 * Reads at most `maxBytes` of a response body (bytes after content decoding: fetch inflates gzip
 * as it is read), then cancels the rest unread. `cut` says whether anything was left.
 */
async function readBodyCapped(response: Response, maxBytes: number, signal: AbortSignal): Promise<{ text: string;
  cut: boolean }> {
  const decoder = new TextDecoder()
  let text = '', bytes = 0, cut = false
  if (response.body) {
    await eachChunk(response.body, signal, (chunk) => {
      if (chunk === undefined) { text += decoder.decode(); return }
      cut = bytes + chunk.byteLength > maxBytes
      text += decoder.decode(cut ? chunk.subarray(0, maxBytes - bytes) : chunk, { stream: !cut })
      bytes += chunk.byteLength
      return cut
    })
  }
  return { text, cut }
}

/** A non-streamed answer (the server ignored stream: true), read up to twice the message cap; its message is
 *  then capped like a streamed one. */
async function readWhole(cfg: AdapterConfig, response: Response, acc: ReplyAssembler,
  signal: AbortSignal): Promise<ChatResponse> {
  const { status } = response
  const { requestId } = acc
  const maxBytes = 2 * cfg.maxMessageBytes + RESPONSE_BODY_MAX_BYTES
  const { text, cut } = await readBodyCapped(response, maxBytes, signal)
  if (cut) {
    throw providerError(cfg, 'RESPONSE_TOO_LARGE', `${cfg.endpoint} (model ${cfg.model}) answered with a `
      + `non-streamed body over ${maxBytes} bytes (2 × MAX_MESSAGE_BYTES + ${RESPONSE_BODY_MAX_BYTES}); it was cut `
      + `there and not used (dsh asks for stream: true).`, { status, requestId })
  }
  const data = text.trim()
  if (data === '') {
    throw providerError(cfg, 'EMPTY_RESPONSE', `${cfg.endpoint} answered 200 with an empty body (model `
      + `${cfg.model}).`, { status, requestId })
  }
  return wholeAnswer(acc, data)
}

/** A body read whole (one JSON value, or a relay's lines of them) through the format's reader of a whole answer. */
function wholeAnswer(acc: ReplyAssembler, data: string): ChatResponse {
  let parsed: unknown
  try { parsed = JSON.parse(data) } catch (error) { parsed = relayChunks(acc.cfg, data, acc.requestId, error) }
  for (const obj of parsed instanceof ChunkList ? parsed.list : [parsed]) {
    mapped(acc, () => acc.cfg.format.whole(acc, obj, data))
  }
  return acc.finish(true)
}

/** The wire format's reading of one server object: what it throws that is no ProviderError (a RangeError of JSON nested
 *  past the stack) is the server's malformed reply, not a transport failure to retry. */
function mapped<T>(acc: ReplyAssembler, read: () => T): T {
  try { return read() } catch (err) {
    if (err instanceof ProviderError || err instanceof ListenerFailure) throw err
    throw acc.malformed(`could not be read (${(err as Error)?.message ?? err})`, err)
  }
}

/**
 * Reads a response into the assembler: an error status as a classified error (its body capped), a
 * non-streamed JSON answer ({@link readWhole}), or the event stream through the format's event mapper.
 */
async function readReply(response: Response, acc: ReplyAssembler, signal: AbortSignal): Promise<ChatResponse> {
  const { status } = response
  const { cfg, requestId } = acc
  if (!response.ok) {
    const { text, cut } = await readBodyCapped(response, RESPONSE_BODY_MAX_BYTES, signal)
    throw httpError(cfg, response, text, cut, requestId)
  }
  if (/\bapplication\/json\b/i.test(response.headers.get('content-type') ?? '')) {
    return readWhole(cfg, response, acc, signal)
  }
  if (!response.body) {
    throw providerError(cfg, 'EMPTY_RESPONSE', `${cfg.endpoint} answered ${status} without a body (model `
      + `${cfg.model}).`, { status, requestId })
  }
  let sawDone = false, sawData = false, bytes = 0, head = ''
  const { format } = cfg
  const parser = new SSEParser((event, data) => {
    if (sawDone) return // after the end marker: dropped
    if (event !== 'message') {
      if (event === 'error') throw inStreamError(cfg, data, requestId)
      if (!format.namedEvents) return
    }
    sawData = true
    if (data.charCodeAt(0) !== 123) { // not `{`: the rare shapes
      data = data.trim()
      if (data === '' || data[0] === ':') return // a relay's keep-alive inside a data line
      if (data === '[DONE]') { sawDone = true; return }
    }
    let obj: unknown
    try { obj = JSON.parse(data) } catch (error) {
      sawDone = relayChunks(cfg, data, requestId, error).list.some((o) => mapped(acc, () => format.event(acc, o, data)))
      return
    }
    if (mapped(acc, () => format.event(acc, obj, data))) sawDone = true
  }, SSE_MAX_BUFFER_UNITS)
  const decode = utf8Decoder()
  await eachChunk(response.body, signal, (chunk) => {
    if (chunk !== undefined) bytes += chunk.byteLength
    const text = decode(chunk)
    if (!sawData && head.length < ERROR_BODY_MAX_UNITS) head += text // what it is, if no event comes
    parser.feed(text)
    return sawDone
  })
  // No data event: one JSON value (a relay's error body, a whole answer) is read as one, whatever the type says; no
  // content type is no event stream (a captive portal's page), nor is one whose lines are none: not retried as broken.
  const type = response.headers.get('content-type') || 'no content type', body = head.trim()
  if (!sawData && (body[0] === '{' || body[0] === '[')) return wholeAnswer(acc, body)
  if (!sawData && (!/event-stream/i.test(type) || (body !== '' && !/^(?:data|event|id|retry)?:/m.test(body)))) {
    throw bytes === 0
      ? providerError(cfg, 'EMPTY_RESPONSE', `${cfg.endpoint} answered ${status} with an empty body (${type}, `
        + `model ${cfg.model}).`, { status, requestId })
      : providerError(cfg, 'MALFORMED_RESPONSE', `${cfg.endpoint} answered ${status} with ${type}, `
        + `not an event stream (model ${cfg.model}).`, { status, requestId })
  }
  return acc.finish(sawDone)
}

// ═══════════════════════════════════════
// 3. Meter
// ═══════════════════════════════════════

/** Tokens are estimated as one per four UTF-16 units (docs/design.md §2). */
const UNITS_PER_TOKEN = 4
/** Fixed per-message overhead in tokens (role, separators), docs/design.md §2. */
const MESSAGE_OVERHEAD_TOKENS = 8

/** `ceil(text.length / 4)` tokens; `text.length` is UTF-16 units, so this is O(1). docs/design.md §2. */
function estimateTextTokens(text: string): number {
  return Math.ceil(text.length / UNITS_PER_TOKEN)
}

/**
 * Heuristic price of one message in tokens: `ceil(C / 4) + 8`, where C is the UTF-16 length of its
 * text-bearing fields (text, reasoning, tool-call name + arguments, tool-result text); each
 * non-text block (image, unknown) adds `ceil(JSON.stringify(block).length / 4)`. docs/design.md §2.
 * Worked check: a 200,000-char tool result costs 50,008.
 */
function estimateMessageTokens(message: Message): number {
  const content = message.content
  if (typeof content === 'string') return estimateTextTokens(content) + MESSAGE_OVERHEAD_TOKENS
  let units = 0
  let other = 0
  for (const block of content) {
    if (block.type === 'text' || block.type === 'reasoning') units += (block as TextBlock).text.length
    else if (block.type === 'tool-call') units += (block as ToolCallBlock).name.length
      + (block as ToolCallBlock).arguments.length
    else other += estimateTextTokens(JSON.stringify(block))
  }
  return Math.ceil(units / UNITS_PER_TOKEN) + MESSAGE_OVERHEAD_TOKENS + other
}

/** Heuristic price of the envelope in tokens (docs/design.md §2); an empty system or tool list costs 0. */
function estimateEnvelopeTokens(envelope: Envelope): number {
  let tokens = 0
  if (envelope.system) tokens += estimateTextTokens(envelope.system) + MESSAGE_OVERHEAD_TOKENS
  if (envelope.tools && envelope.tools.length > 0) tokens += estimateTextTokens(JSON.stringify(envelope.tools))
    + MESSAGE_OVERHEAD_TOKENS
  return tokens
}

/** Heuristic price of a whole request (envelope + messages) in tokens. O(messages). */
function estimateRequestTokens(envelope: Envelope, messages: readonly Message[]): number {
  let tokens = estimateEnvelopeTokens(envelope)
  for (const m of messages) tokens += estimateMessageTokens(m)
  return tokens
}

/**
 * Where a measurement is anchored: the provider-reported size of the last call
 * (`promptTokens + completionTokens`, tokens) and the heuristic size of the same content right
 * after that call's assistant message was logged (tokens). docs/design.md §2 "Usage anchor".
 */
export interface UsageAnchor { providerTokens: number; heuristicTokens: number; seq: number }

/**
 * The size of what the next request would carry, in tokens. docs/design.md §2.
 * `totalTokens` = `envelopeTokens + surfaceTokens` when not anchored; when anchored it is
 * `max(provider, heuristic at anchor) + (heuristic now − heuristic at anchor)`: the provider's
 * figure plus the signed heuristic price of every surface change since (a low provider figure
 * never undercounts). A later call that reports no usage does not void the anchor: its assistant
 * message is one more surface change, priced by the heuristic. An envelope or model change does.
 */
export interface Measurement {
  /** The size of the next request: `heuristicTokens` until a provider reports usage; once
   *  anchored, the provider's count for the last request plus the heuristic price of what changed
   *  since (docs/design.md §2). So when anchored it differs from `envelopeTokens + surfaceTokens`,
   *  which are always the chars/4 heuristic. */
  totalTokens: number
  /** Heuristic tokens of system prompt + tool specs. */
  envelopeTokens: number
  /** Heuristic tokens of all surface messages (sum of `nodes[i].tokens`). */
  surfaceTokens: number
  /** `envelopeTokens + surfaceTokens`. */
  heuristicTokens: number
  /** True when `totalTokens` stands on provider-reported usage. */
  anchored: boolean
  anchor?: UsageAnchor
  /** Per-node prices, oldest first (live view: do not keep across appends). */
  nodes: readonly SurfaceNode[]
  /**
   * Provider tokens per heuristic token learned from reported usage and overflow errors that carry
   * a count (docs/design.md §10 "Calibration"), clamped to [0.5, 4]; exactly 1 before any sample.
   * `totalTokens` prices what changed since the anchor (or, unanchored, everything) at this rate.
   */
  calibration: number
  /**
   * Tokens the provider counts beyond `calibration ×` the heuristic, unanchored: fitted (least squares)
   * from the counts a replayed transcript records (docs/design.md §15: a harness's hidden system prompt
   * and tools); 0 otherwise (an anchor carries them).
   */
  calibrationOffsetTokens: number
  /** How many samples `calibration` stands on (0: none; the total is then the §2 heuristic). */
  calibrationSamples: number
  /** The `request/header` the next request carries (model, envelope, budget, window, prices), as last logged. */
  header?: RequestHeader
}

/** The prototype of `measure()`'s results: `console.log` (Node, Bun, Deno: the inspect symbol) and `JSON.stringify`
 *  show the figures and `nodes` as a count, not the whole surface nor the header's system prompt and tools. */
const MEASUREMENT_VIEW = /* @__PURE__ */ (() => {
  function figures(this: Measurement) {
    const { nodes, header: _, ...rest } = this
    return { ...rest, nodes: nodes.length }
  }
  return { toJSON: figures, [Symbol.for('nodejs.util.inspect.custom')]: figures }
})()

/** Bounds of the calibration ratio (provider tokens per heuristic token), docs/design.md §10. */
const CALIBRATION_RANGE: readonly [min: number, max: number] =
  Object.freeze([0.5, 4]) as readonly [number, number]
/** How many recent calibration samples the ratio averages (Σ provider ÷ Σ heuristic). */
const CALIBRATION_SAMPLES = 8
/** Requests under this many heuristic tokens give no calibration sample (framing, not the tokenizer, decides). */
const CALIBRATION_MIN_SAMPLE_TOKENS = 1000

/** The smallest request that gives a calibration sample: 1,000 tokens, or an eighth of a smaller window (§10). */
function calibrationMinSampleTokens(contextWindow?: number): number {
  return contextWindow === undefined || !(contextWindow > 0) ? CALIBRATION_MIN_SAMPLE_TOKENS
    : Math.min(CALIBRATION_MIN_SAMPLE_TOKENS, Math.floor(contextWindow / 8))
}

/** The index of `target` in `items`, sorted ascending by `key`, or -1 (binary search). */
function binarySearch<T>(items: readonly T[], target: number, key: (item: T) => number): number {
  let lo = 0, hi = items.length - 1
  while (lo <= hi) {
    const mid = (lo + hi) >> 1
    const k = key(items[mid])
    if (k === target) return mid
    if (k < target) lo = mid + 1
    else hi = mid - 1
  }
  return -1
}

/** Whether `providerTokens` counted for a request of `heuristicTokens` is a ratio within {@link CALIBRATION_RANGE}. */
function plausibleRatio(providerTokens: number, heuristicTokens: number): boolean {
  if (!(Number.isFinite(providerTokens) && Number.isFinite(heuristicTokens) && heuristicTokens > 0)) return false
  const ratio = providerTokens / heuristicTokens
  return ratio >= CALIBRATION_RANGE[0] && ratio <= CALIBRATION_RANGE[1]
}

/**
 * The logged envelope as measured, for the room (docs/design.md §5 "Room", §10): the calibration offset (a replayed
 * transcript's hidden prompt included, §15) plus the calibration × its heuristic tokens; tokens.
 */
function measuredEnvelopeTokens(m: Measurement): number {
  return Math.ceil(m.calibrationOffsetTokens + m.calibration * m.envelopeTokens)
}

/**
 * An envelope of `envelopeTokens` heuristic tokens (default: the logged one) as the session itself sends it: at the
 * envelope's own ratio (the calibration, and the envelope-heavy fit's offset in proportion), without a replayed
 * transcript's hidden prompt (its fitted offset, docs/design.md §15), which the replay reports in its over-window
 * counts instead of refusing the inputs the transcript sent. The input check, the pin limit and the ladder's price of
 * an envelope part the next request adds (the recall tool) price the envelope so.
 */
function sentEnvelopeTokens(session: Session, envelopeTokens?: number): number {
  const m = session.measure(), tokens = envelopeTokens ?? m.envelopeTokens
  const offset = ladderStateOf(session).replayed || m.envelopeTokens <= 0 ? 0
    : (m.calibrationOffsetTokens * tokens) / m.envelopeTokens
  return Math.ceil(offset + m.calibration * tokens)
}

/** The usage anchor rule (docs/design.md §2, §10, §15) applied to a heuristic total; tokens. */
function anchoredTotal(
  heuristicTokens: number, anchor: UsageAnchor | undefined, calibration = 1, offsetTokens = 0,
): number {
  if (!anchor) return offsetTokens + (calibration === 1 ? heuristicTokens : Math.ceil(heuristicTokens * calibration))
  const base = Math.max(anchor.providerTokens, anchor.heuristicTokens)
  const delta = heuristicTokens - anchor.heuristicTokens
  if (calibration === 1) return base + delta
  // Added content is priced at the calibration; removed content at the anchor's own rate (what it
  // was counted at), so that removing everything can never take the total below zero.
  const rate = delta >= 0 || anchor.heuristicTokens <= 0 ? calibration
    : Math.min(CALIBRATION_RANGE[1], base / anchor.heuristicTokens)
  return base + Math.ceil(delta * rate)
}

/** More tokens than any request and answer hold (no window is near it): a usage count past it is of something else. */
const USAGE_MAX_TOKENS = 1e9

/** Usage as dsh reads it (docs/design.md §13): counts outside [0, USAGE_MAX_TOKENS] refused or dropped. */
function checkedUsage(u: unknown): Usage | undefined {
  const count = (v: unknown): v is number => typeof v === 'number' && v >= 0 && v <= USAGE_MAX_TOKENS
  if (typeof u !== 'object' || u === null) return undefined
  const { promptTokens, completionTokens, cachedTokens, cacheWriteTokens, reasoningTokens } =
    u as Record<string, unknown>
  if (!count(promptTokens) || !count(completionTokens)) return undefined
  const usage: Usage = { promptTokens, completionTokens }
  if (count(cachedTokens)) usage.cachedTokens = Math.min(cachedTokens, promptTokens)
  // a write is part of the prompt, not of its cached tokens
  const uncached = promptTokens - (usage.cachedTokens ?? 0)
  if (count(cacheWriteTokens)) usage.cacheWriteTokens = Math.min(cacheWriteTokens, uncached)
  if (count(reasoningTokens)) usage.reasoningTokens = Math.min(reasoningTokens, completionTokens)
  return usage
}

/** An answer's usage as the new anchor (§2); undefined when over 4× a heuristic count of ≥ 1,000 (bogus). */
function usageAnchor(u: Usage, heuristicTokens: number, seq: number): UsageAnchor | undefined {
  const providerTokens = u.promptTokens + u.completionTokens
  const ceiling = CALIBRATION_RANGE[1] * Math.max(heuristicTokens, CALIBRATION_MIN_SAMPLE_TOKENS)
  const plausible = Number.isFinite(providerTokens) && providerTokens >= 0 && providerTokens <= ceiling
  return plausible ? { providerTokens, heuristicTokens, seq } : undefined
}

// ── 3.1 Cost: prices applied to tokens (docs/design.md §11) ──

/** Throws a TypeError naming the field unless `prices` is a well-formed {@link Prices}; returns a copy of its fields,
 *  each read once (a getter is never read again). */
function validatePrices(prices: unknown, where = 'prices'): Prices {
  const fail = (what: string): never => { throw new TypeError(`${where}${what}; e.g. { cacheHitInput: 0.003, `
    + `cacheMissInput: 0.15, output: 0.6 } (USD per million tokens)`) }
  if (typeof prices !== 'object' || prices === null) fail(` must be an object, got ${shown(prices)}`)
  // One read of each field, into a copy that is what the provider keeps: a getter is never read again.
  const p: Record<string, unknown> = Object.fromEntries(plainFields(where, prices, 'a plain object'))
  const keys = ['cacheHitInput', 'cacheMissInput', 'output', 'peak', 'cacheWriteInput']
  for (const key of Object.keys(p)) if (!keys.includes(key)) fail(`: unknown key "${key}" (${keys.join(', ')})`)
  for (const key of ['cacheHitInput', 'cacheMissInput', 'output', 'cacheWriteInput']) {
    const v = p[key]
    if (key === 'cacheWriteInput' && v === undefined) continue
    if (typeof v !== 'number' || !Number.isFinite(v) || v < 0) fail(`.${key} must be a non-negative number of USD per `
      + `million tokens, got ${shown(v)}`)
  }
  if (p.peak !== undefined) {
    if (typeof p.peak !== 'object' || p.peak === null) fail(`.peak must be an object {multiplier, days, hoursUTC}, `
      + `got ${shown(p.peak)}`)
    const peak: Record<string, unknown> = Object.fromEntries(plainFields(`${where}.peak`, p.peak))
    // Copied once their lengths are checked: a sparse array of 2^27 holes is a few bytes until it is copied.
    const copied = (list: unknown, max: number) => (!Array.isArray(list) || list.length > max ? list
      : Array.from(list, (x) => (Array.isArray(x) && x.length === 2 ? [x[0], x[1]] : x)))
    peak.days = copied(peak.days, 7)
    peak.hoursUTC = copied(peak.hoursUTC, 24)
    if (typeof peak.multiplier !== 'number' || !Number.isFinite(peak.multiplier)
      || peak.multiplier < 0) fail(`.peak.multiplier must be a non-negative number, `
      + `got ${shown(peak.multiplier)}`)
    if (!Array.isArray(peak.days) || peak.days.length > 7 || !peak.days.every((d) => Number.isInteger(d) && d >= 0
      && d <= 6)) fail(`.peak.days must be UTC weekdays 0 (Sunday) … 6 (Saturday), got ${shown(peak.days)}`)
    if (!Array.isArray(peak.hoursUTC) || peak.hoursUTC.length > 24 || !peak.hoursUTC.every((h) => Array.isArray(h)
      && h.length === 2
      && h.every((x) => typeof x === 'number' && x >= 0 && x <= 24) && h[0] < h[1])) {
      fail(`.peak.hoursUTC must be at most 24 [startHour, endHour) pairs with 0 ≤ start < end ≤ 24, `
        + `got ${shown(peak.hoursUTC)}`)
    }
    p.peak = peak
  }
  return p as unknown as Prices
}

/** Whether `timeMs` (ms since the epoch) lies in a peak window of `prices`. */
function isPeakTime(prices: Prices, timeMs: number): boolean {
  const peak = prices.peak
  if (!peak) return false
  const d = new Date(timeMs)
  if (!peak.days.includes(d.getUTCDay())) return false
  const hour = d.getUTCHours() + d.getUTCMinutes() / 60 + d.getUTCSeconds() / 3600
  return peak.hoursUTC.some(([start, end]) => hour >= start && hour < end)
}

/** The tokens of one request as billed: input split by the prompt cache (writes are part of uncached), and output. */
export interface BilledTokens {
  cachedInputTokens: number; uncachedInputTokens: number; outputTokens: number; cacheWriteInputTokens?: number
}

/** USD of one request (docs/design.md §11), peak multiplier applied at `timeMs`. */
function requestCostUSD(prices: Prices, tokens: BilledTokens, timeMs: number): number {
  const writeExtra = ((prices.cacheWriteInput ?? prices.cacheMissInput) - prices.cacheMissInput)
    * (tokens.cacheWriteInputTokens ?? 0)
  const usd = (tokens.cachedInputTokens * prices.cacheHitInput + tokens.uncachedInputTokens * prices.cacheMissInput
    + writeExtra + tokens.outputTokens * prices.output) / 1_000_000
  return isPeakTime(prices, timeMs) ? usd * prices.peak!.multiplier : usd
}

/** USD an edit adds to the next request: moved tokens × (miss − hit price) (docs/design.md §11). */
function cacheCostUSD(prices: Prices, movedTokens: number, timeMs?: number): number {
  const usd = (movedTokens * ((prices.cacheWriteInput ?? prices.cacheMissInput) - prices.cacheHitInput)) / 1_000_000
  return timeMs !== undefined && isPeakTime(prices, timeMs) ? usd * prices.peak!.multiplier : usd
}

// ═══════════════════════════════════════
// 4. Log & surface
// ═══════════════════════════════════════

/** How a surface event changes the surface (docs/design.md §4). `start`/`end` are seqs of surface nodes. */
export type SurfaceOp = { op: 'append' } | { op: 'replace'; start: number; end: number }

/** The request envelope and model as logged by `request/header` (written when it changes). */
export interface RequestHeader {
  model: string
  baseURL: string
  system?: string
  tools?: readonly ToolSpec[]
  /** Completion budget, tokens. */
  maxTokens?: number
  /** Context window, tokens. */
  contextWindow?: number
  /** The conversation model's price table (USD per million tokens), when it has one (docs/design.md §11). */
  prices?: Prices
}

/**
 * The prompt-cache figures of one conversation request, logged on its `assistant/message` as
 * `cache` (docs/design.md §11). Tokens by the meter (§2): `inputTokens` is the heuristic size of
 * what was sent (envelope + messages); `modelledHitTokens` the leading part identical to the
 * previous conversation request (envelope first). The provider's own figure, when reported, is
 * `usage.cachedTokens` on the same event and wins for billing.
 */
export interface RequestCache { inputTokens: number; modelledHitTokens: number }

/**
 * One summary request, logged in `compaction/end {requests}` (docs/design.md §11). `inputTokens`
 * and `modelledHitTokens` as in {@link RequestCache} (a summary request is compared with the
 * conversation request before it); `outputTokens` is the meter's price of the answer, used when the
 * provider reported no usage; `prices` the summarizer's table when its model is not the
 * conversation model.
 */
export interface SummaryRequestRecord extends RequestCache {
  model: string
  outputTokens: number
  usage?: Usage
  prices?: Prices
}

/**
 * Tokens and cost of a set of requests (units in the names). Input is the provider-reported prompt
 * size when given, else the meter's estimate; `cachedInputTokens` is the reported `cachedTokens`
 * when given, else the modelled hit (scaled to the reported prompt size when only that is known).
 * `costUSD` is undefined ("unknown") when any request has no price; `unpricedRequests` says how many.
 */
export interface TokenTally {
  requests: number
  inputTokens: number
  cachedInputTokens: number
  uncachedInputTokens: number
  outputTokens: number
  costUSD?: number
  unpricedRequests: number
}

/**
 * What a session has used so far ({@link CostLedger.usage}): conversation and summary requests apart
 * and together. `cacheHitShare` = cached ÷ input tokens over all requests (0 … 1; 0 with no input);
 * `modelledHitTokens` the meter's modelled cache hits summed (tokens); `reportedCacheRequests` how
 * many requests carried a provider-reported `cachedTokens`.
 */
export interface SessionUsage extends TokenTally {
  conversation: TokenTally
  summary: TokenTally
  cacheHitShare: number
  modelledHitTokens: number
  reportedCacheRequests: number
}

/**
 * The prompt-cache effect of one surface edit (a prune, clear or compaction replace), tokens by
 * the meter: `movedTokens` — tokens at and after the edit point that the previous conversation
 * request sent and that the next one sends as cache misses instead of hits (0 when the cache was
 * already broken before that point); `savedTokens` — tokens removed from every later request.
 */
export interface EditCache { seq: number; movedTokens: number; savedTokens: number }

/**
 * {@link EditCache} priced (docs/design.md §11), USD at the prices of the edit's time (peak hours
 * included): `cacheCostUSD` = moved tokens × (miss − hit price), paid once on the next request;
 * `savedUSDPerRequest` = saved tokens × hit price, saved on every later request (they were cached).
 * Both undefined when the model has no price.
 */
export interface EditCost extends EditCache { cacheCostUSD?: number; savedUSDPerRequest?: number }

/** The `data` of each event type dsh writes (docs/design.md §4). Callers may log other types too. */
export interface EventDataMap {
  /** `format`: the log's layout ({@link VERSION} says which dsh wrote it); absent in logs of dsh 0.1.0, read as 1. */
  'session/start': { id: string; version: string; format?: number }
  /** `lastSeq`: the last seq before the resume; `repaired`: how many synthetic tool results follow. */
  'session/resume': { lastSeq: number; torn?: TornLine; repaired: number }
  'turn/start': { turn: number }
  /** `message`: why a turn ended early, e.g. what was spent when it stopped at its spend cap (reason `budget`). */
  'turn/end': { turn: number; reason: string; message?: string }
  'step/start': { turn: number; step: number }
  'step/end': { turn: number; step: number }
  'request/header': RequestHeader
  'user/message': { message: UserMessage; surfaceOp: SurfaceOp; compactionId?: string }
  'assistant/message': { message: AssistantMessage; surfaceOp: SurfaceOp; usage?: Usage; finishReason: string;
    cache?: RequestCache }
  /** The dispatch record of a tool call. Its arguments are logged once, in the `tool-call` block of
   *  the assistant message that holds `callId` (logs written by dsh 0.1 repeat them here). */
  'tool/call': { callId: string; name: string; arguments?: string }
  'tool/result': { message: ToolResultMessage; surfaceOp: SurfaceOp; spilled?: { ref: string; bytes: number } }
  /** `spent`: a request the server ran before it failed (a cut stream, an oversized message; `trigger: 'retry'`: an
   *  empty 200 the adapter retried), tokens by the meter: what was sent and the output received; the spend cap
   *  counts it (docs/design.md §11). Absent in older logs. */
  'request/error': { code: string; status?: number; message: string; trigger?: string;
    spent?: RequestCache & { outputTokens: number } }
  'compaction/prune': { shadowedSeqs: number[]; shadowedTokenCount: number; trigger?: string;
    paysBackAfterRequests?: number }
  /** A tool result replaced by a placeholder (the clear rung, docs/design.md §10); the replace follows. */
  'compaction/clear': { shadowedSeqs: number[]; shadowedTokenCount: number; trigger?: string;
    paysBackAfterRequests?: number }
  'ladder/state': LadderStateData
  'compaction/start': { id: string; trigger: string }
  /** `ledger`: the facts ledger framed into the checkpoint; `fidelity`: what the checkpoint kept (docs/design.md
   *  §12); `focus`: the focus the summary was asked for. */
  'compaction/summary': { id: string; summary: string; shadowedSeqs: number[]; shadowedTokenCount: number;
    model: string; usage?: Usage; ledger?: Ledger; fidelity?: Fidelity; focus?: string; paysBackAfterRequests?: number }
  'compaction/end': { id: string; error?: string; tokensBefore?: number; tokensAfter?: number;
    requests?: SummaryRequestRecord[] }
  'compaction/warning': { trigger: string; message: string; totalTokens: number; thresholdTokens: number }
  'recovery/retry': { generationBefore: number; generationAfter: number }
  /** A stream that broke after output (`code`, e.g. SERVER or TRANSPORT) is retried once as step `step + 1`; its
   *  partial output precedes this event as an interrupted message. */
  'step/retry': { turn: number; step: number; code: ProviderErrorCode }
  /** A surface message pinned: never pruned, cleared or summarised (docs/design.md §12). */
  'surface/pin': { seq: number }
  'surface/unpin': { seq: number }
}
/**
 * The ladder's durable memory (docs/design.md §10 "Durable ladder state"), one `ladder/state` event
 * per change; {@link Session.open} replays them, so a resumed session keeps them.
 * - `failedAtTokens`: heuristic tokens (envelope + surface) when a pressure compaction failed; no
 *   new summary is tried until the surface has grown by the retained tail. `null`: cleared by a success.
 * - `sample`: a calibration sample, the prompt tokens a provider counted for one request
 *   (`providerTokens`) and the meter's heuristic estimate of the same request (`heuristicTokens`).
 *   `source` `'overflow'`: a conversation request refused with a count — that count also becomes
 *   the usage anchor (the surface is what was sent); `'summary'`: a summary request's usage or
 *   overflow count (a sample only); `'transcript'`: the prompt count a replayed transcript records
 *   for a request of `heuristicTokens` (replay's; fitted as offset + ratio, docs/design.md §15). `envelopeTokens`:
 *   the heuristic tokens of that request's envelope when it is not the session's (a summary request's); a sample
 *   whose envelope outweighs its messages goes to the envelope-heavy fit (docs/design.md §10).
 * - `calibration`: the ratio after this event (for readers; the session recomputes it).
 */
export interface LadderStateData {
  failedAtTokens?: number | null
  sample?: { providerTokens: number; heuristicTokens: number; envelopeTokens?: number
    source: 'overflow' | 'count' | 'summary' | 'transcript' }
  calibration?: number
}

/** The event types dsh itself writes (see {@link EventDataMap}). */
export type EventType = keyof EventDataMap

/**
 * One log entry. `seq` is contiguous from 0; `time` is ms since the epoch. Events are shared by
 * reference with stores and listeners: treat them as immutable.
 */
export interface SessionEvent<T extends string = string> {
  seq: number
  type: T
  time: number
  data: T extends EventType ? EventDataMap[T] : Record<string, unknown>
}

/** A message on the surface, with its heuristic price in tokens and the seq of the event that put it there. */
export interface SurfaceNode {
  readonly seq: number
  readonly message: Message
  readonly tokens: number
  /** Position key: strictly increasing along the surface (a replacement inherits its range's first key). */
  readonly key: number
  /** A compaction's checkpoint (its event has a `compactionId`): known by the log, never by its text. */
  readonly checkpoint?: true
}

/**
 * Why an append or a load failed: a malformed message or event, a bad surface op, a break of tool
 * call/result pairing, a corrupt log file (with its line), a store that could not be read or written,
 * or a pin that is refused (it would not fit, or an edit would touch a pinned message).
 */
export type SessionErrorCode = 'INVALID_MESSAGE' | 'INVALID_EVENT' | 'SURFACE_OP' | 'PAIRING' | 'LOG_CORRUPT'
  | 'STORE' | 'PIN' | 'SESSION_LOCKED'

/** Thrown for an append that would break a log invariant (state is left unchanged) or a bad log. */
class SessionError extends Error {
  readonly code: SessionErrorCode
  /** 1-based line of a log file, for `LOG_CORRUPT`. */
  readonly line?: number
  constructor(code: SessionErrorCode, message: string, line?: number) {
    super(message)
    this.name = 'SessionError'
    this.code = code
    this.line = line
  }
}

/**
 * A last log line cut short by a crash: dropped on load and reported (docs/design.md §4). `line` is
 * 1-based, `bytes` its UTF-8 length, `savedTo` where FileStore kept its bytes.
 */
export interface TornLine { line: number; bytes: number; savedTo?: string }

/** Who holds a session log's lock file (`FILE.lock`): process id, host name, and when it took the lock (ms since the
 *  epoch). */
export interface LogLockHolder { pid: number; host: string; time: number }

/** What a store returns on load. */
export interface LoadedLog { events: SessionEvent[]; torn?: TornLine }

/**
 * Where a session's events live. `append` receives events in seq order; `sync` is the durability
 * point (fsync for files), called at step boundaries. Artefacts hold spilled tool results.
 */
export interface LogStore {
  load(): Promise<LoadedLog>
  append(events: readonly SessionEvent[]): Promise<void>
  /**
   * Optional streaming load: calls `onEvent` with each event in seq order (only checked for its
   * shape and seq), and returns the torn last line if one was dropped. A store that implements
   * `scan` and `readEvent` is *readable*: a {@link Session} on it keeps only the surface and small
   * metadata in memory and reads old events back on demand (docs/design.md §4).
   */
  scan?(onEvent: (event: SessionEvent) => void): Promise<{ torn?: TornLine }>
  /** Reads back event `seq` (loaded or appended earlier). */
  readEvent?(seq: number): Promise<SessionEvent>
  /** Reads back the events with `fromSeq <= seq < toSeq`, oldest first. */
  readEvents?(fromSeq: number, toSeq: number): AsyncIterable<SessionEvent>
  sync?(): Promise<void>
  /** Stores `text` (e.g. a spilled tool result) and returns a reference a human can follow. */
  putArtefact?(name: string, text: string): Promise<string>
  getArtefact?(ref: string): Promise<string>
  close?(): Promise<void>
}

/** Keeps the log in memory (the default; edge-safe). Artefacts live in a Map. One writer: a batch that does not
 *  continue the log (a second Session on this store appended first) is refused whole, `SESSION_LOCKED`. */
class MemoryStore implements LogStore {
  readonly events: SessionEvent[] = []
  readonly artefacts = new Map<string, string>()
  async load(): Promise<LoadedLog> { return { events: this.events.slice() } }
  async append(events: readonly SessionEvent[]): Promise<void> {
    const at = events.findIndex((e, i) => e.seq !== this.events.length + i)
    if (at >= 0) {
      throw new SessionError('SESSION_LOCKED', `MemoryStore: event seq ${events[at].seq} where `
        + `${this.events.length + at} was expected: another Session appended to this store; nothing of this batch `
        + `was stored (one Session per store: open it again)`)
    }
    for (const e of events) this.events.push(e)
  }
  async putArtefact(name: string, text: string): Promise<string> { this.artefacts.set(name, text);
    return `memory:${name}` }
  async getArtefact(ref: string): Promise<string> {
    const text = this.artefacts.get(ref.replace(/^memory:/, ''))
    if (text === undefined) throw new SessionError('STORE', `no artefact ${ref} in this MemoryStore`)
    return text
  }
}

/** Checks the shape of one decoded log line; returns an error message or undefined. */
function eventShapeProblem(e: unknown, expectedSeq: number): string | undefined {
  if (Array.isArray(e)) return 'a JSON array, not a dsh event {seq, type, time, data} (is this a transcript? use `dsh '
    + 'replay FILE`)'
  if (typeof e !== 'object' || e === null) return 'not a JSON object'
  const { seq, type, time, data } = e as Record<string, unknown>
  if (typeof seq !== 'number' || typeof type !== 'string' || typeof time !== 'number' || typeof data !== 'object'
    || data === null) {
    return 'not a dsh event {seq, type, time, data} (is this a transcript? use `dsh replay FILE`)'
  }
  if (seq !== expectedSeq) return `seq ${seq} where ${expectedSeq} was expected (events must be contiguous)`
  return undefined
}

/** How every line dsh writes to a log begins (`JSON.stringify` of an event, `seq` first). */
const EVENT_LINE_START = '{"seq":'

/** One log line → its event, `'torn'` (a cut last line), `'blank'`; else throws `SessionError('LOG_CORRUPT')`. */
function parseLogLine(raw: string, line: number, expectedSeq: number, terminated: boolean): SessionEvent
  | 'torn' | 'blank' {
  if (raw.trim() === '') {
    if (!terminated) return 'blank'
    throw new SessionError('LOG_CORRUPT', `session log line ${line}: empty line inside the log`, line)
  }
  let value: unknown
  try { value = JSON.parse(raw) } catch {
    // Torn: the start of an event dsh wrote ({"seq":…), cut short — anywhere, even inside its first
    // 7 bytes (`{"`: a crash between two writes of one batch) — or NUL bytes only: a power loss after the
    // file grew but before its unsynced blocks were written (XFS, ext4 data=writeback). Else it is no dsh log.
    if (!terminated && (raw.startsWith(EVENT_LINE_START) || EVENT_LINE_START.startsWith(raw) || /^\0+$/.test(raw)))
      return 'torn'
    // The line itself is not echoed: a file given by mistake (an .env) may hold secrets.
    throw new SessionError('LOG_CORRUPT', `session log line ${line}: not valid JSON (${raw.length} characters; `
      + `not shown)`, line)
  }
  const problem = eventShapeProblem(value, expectedSeq)
  if (problem) throw new SessionError('LOG_CORRUPT', `session log line ${line}: ${problem}`, line)
  return value as SessionEvent
}

function validateBlocks(blocks: unknown, where: string): void {
  if (!Array.isArray(blocks)) throw new SessionError('INVALID_MESSAGE', `${where}.content must be an array of blocks`)
  blocks.forEach((b, i) => {
    if (typeof b !== 'object' || b === null || typeof (b as Block).type !== 'string')
      throw new SessionError('INVALID_MESSAGE', `${where}.content[${i}] must be an object with a string "type"`)
    const t = (b as Block).type
    if ((t === 'text' || t === 'reasoning') && typeof (b as TextBlock).text !== 'string')
      throw new SessionError('INVALID_MESSAGE', `${where}.content[${i}].text must be a string`)
    if (t !== 'text' && t !== 'reasoning' && t !== 'tool-call') {
      try { JSON.stringify(b) } catch (err) { throw new SessionError('INVALID_MESSAGE', `${where}.content[${i}] (${t}) `
        + `cannot be stored as JSON: ${(err as Error).message}`) }
    }
    if (t === 'tool-call') {
      const c = b as ToolCallBlock
      if (typeof c.id !== 'string' || c.id === '')
        throw new SessionError('INVALID_MESSAGE', `${where}.content[${i}] (tool-call) needs a non-empty string id`)
      if (typeof c.name !== 'string' || typeof c.arguments !== 'string')
        throw new SessionError('INVALID_MESSAGE', `${where}.content[${i}] (tool-call) needs string name and arguments `
          + `(raw JSON text)`)
    }
  })
}

/** Throws `SessionError('INVALID_MESSAGE')` unless `m` is a well-formed message of `role`. */
function validateMessage(m: unknown, role?: Message['role']): asserts m is Message {
  if (typeof m !== 'object' || m === null) throw new SessionError('INVALID_MESSAGE', 'message must be an object')
  const msg = m as Message
  if (role && msg.role !== role)
    throw new SessionError('INVALID_MESSAGE', `expected a ${role} message, got role ${JSON.stringify(msg.role)}`)
  if (msg.role === 'user') { if (typeof msg.content !== 'string') validateBlocks(msg.content, 'user message') }
  else if (msg.role === 'assistant') validateBlocks(msg.content, 'assistant message')
  else if (msg.role === 'tool') {
    if (typeof msg.toolCallId !== 'string' || msg.toolCallId === '')
      throw new SessionError('INVALID_MESSAGE', 'tool result needs a non-empty string toolCallId')
    validateBlocks(msg.content, 'tool result')
    if ((msg.content as Block[]).some((b) => b.type === 'tool-call'))
      throw new SessionError('INVALID_MESSAGE', 'a tool result cannot contain tool-call blocks')
  } else throw new SessionError('INVALID_MESSAGE', `unknown role ${JSON.stringify((msg as { role: unknown }).role)} `
    + `(user, assistant or tool)`)
}

const toolCalls = (m: Message): ToolCallBlock[] =>
  m.role === 'assistant' ? (m.content.filter((b) => b.type === 'tool-call') as ToolCallBlock[]) : []

/** The surface event types and the role of their message; null prototype, so `toString` is not one. */
const SURFACE_TYPES: Readonly<Record<string, Message['role'] | undefined>> =
  /* @__PURE__ */ Object.freeze(Object.assign(Object.create(null), {
  'user/message': 'user', 'assistant/message': 'assistant', 'tool/result': 'tool',
}))

/** Options for {@link Session}. */
export interface SessionOptions {
  store?: LogStore
  /** Session id for `session/start` (default: a random UUID). */
  id?: string
  /** Clock for event `time` in ms (default `Date.now`). */
  now?: () => number
}

/** The surface, oldest first, with a lookup by the seq of the event that put a node there. */
export interface Surface extends ReadonlyArray<SurfaceNode> {
  /** The surface node put there by event `seq`, while it is still on the surface. */
  node(seq: number): SurfaceNode | undefined
}

/**
 * Surface nodes by seq. V8 rehashes a Map with steady deletes into new tables that its dead old ones
 * still point to, so replaced nodes outlived young-generation GCs (a 1 GiB resume spent 3× the floor's
 * GC time): after as many deletes as it holds, the map is copied (amortised O(1) per delete).
 */
class SeqIndex {
  private map = new Map<number, SurfaceNode>()
  private deletes = 0
  get(seq: number): SurfaceNode | undefined { return this.map.get(seq) }
  has(seq: number): boolean { return this.map.has(seq) }
  set(seq: number, node: SurfaceNode): void { this.map.set(seq, node) }
  delete(seq: number): void {
    this.map.delete(seq)
    if (++this.deletes > 2 * this.map.size + 16) { this.map = new Map(this.map); this.deletes = 0 }
  }
}

/** What the loop, the ladder and the CLI read of a session beyond its public API (docs/design.md §14). */
interface SessionState {
  /** callId → seq of the surface node holding the call, and of its result once logged. */
  readonly calls: Map<string, { callSeq: number; resultSeq?: number }>
  /** Ids of tool calls on the surface that have no result yet. */
  readonly openCalls: Set<string>
  /** Ids of surface tool calls whose `tool/call` dispatch record was logged. */
  readonly dispatched: Set<string>
  readonly bySeq: SeqIndex
  turn: { last: number; open: boolean; step: number; stepOpen: boolean }
  /** Seq of the open turn's input (the first user message after `turn/start`), never edited. */
  input?: number
  awaitingInput: boolean
  /** Id of a `compaction/start` with no `compaction/end` yet (the compaction lock). */
  compaction?: string
  /** Seq of the last `session/start` or `session/resume`. */
  openedAt: number
  /** Seqs of pinned surface nodes, in the order they were pinned (docs/design.md §12): a replace never covers one. */
  readonly pinned: Set<number>
  /** The session's parts over the log (section 4.2), one per {@link definePart}, in definition order. */
  readonly parts: Part[]
  /** The surface (the array `Session.surface()` returns) and the meter's sums over it, as the log made them. */
  readonly nodes: SurfaceNode[] & Surface
  /** Heuristic tokens of the surface's messages and of the last logged envelope (§2). */
  surfaceTokens: number
  envelopeTokens: number
  /** The last `request/header`. */
  header?: RequestHeader
  /** The calibration `measure()` applies (the ladder's part, when it is in the bundle); none: ratio 1, offset 0. */
  calibrator?: { fit(envelopeTokens: number, surfaceTokens: number): { ratio: number; offset: number }; count: number }
  /** The session's {@link Pins} view, once asked for. */
  pins?: Pins
  /** Writes queued events to the store, without fsync. */
  flush(): Promise<void>
  /** Checks an event against the current state without appending it (throws like `append`). */
  check(type: string, data: Record<string, unknown>): void
  /** Applies a checked event to the derived state: the same code for live appends and for a loaded log. */
  apply(event: SessionEvent): void
}

/**
 * What a surface event changes, as its parts see it before the session applies it: the nodes it
 * removes from index `at` (none for an append) and what they cost, the new node's price (tokens, §2
 * heuristic) and an answer's checked usage.
 */
interface SurfaceChange {
  at: number; removed: readonly SurfaceNode[]; removedTokens: number; tokens: number; usage?: Usage
}

/** The `removed` of every append (nothing leaves the surface). */
const NO_NODES: readonly SurfaceNode[] = Object.freeze([])

/**
 * A part over the log (section 4.2): cost, recall, pins, the ladder's memory. Each session builds one of
 * every defined part, and shows it each event before applying it (with the surface the event applies to).
 */
interface Part { observe?(event: SessionEvent, change?: SurfaceChange): void }

/** The factories of the defined parts, in definition order; Session's constructor calls each. */
const PART_FACTORIES: ((session: Session, st: SessionState) => Part)[] = []

/**
 * Defines a part and returns the reader of a session's instance. Call it as `/* @__PURE__ *\/ definePart(…)` at
 * top level: a bundle that never reads a part drops it, and a part that is kept is defined before any session
 * opens, so it sees every event of the log, the loaded ones too.
 */
function definePart<P extends Part>(make: (session: Session, st: SessionState) => P): (session: Session) => P {
  const index = PART_FACTORIES.push(make) - 1
  return (session) => sessionState(session).parts[index] as P
}

/** The state of `session`, or a TypeError when it is no {@link Session} (a part read of another object). */
function sessionState(session: Session): SessionState {
  const st = SESSION_STATE.get(session)
  if (!st) {
    throw new TypeError(`${shown(session)} is not a Session of this copy of dsh.ts: pass the Session whose log the `
      + 'part reads (a session opened by another copy of dsh.ts in the process, or a Proxy of one, has no state here)')
  }
  return st
}

const SESSION_STATE = new WeakMap<Session, SessionState>()
/** The module-private state of `session` (see {@link SessionState}). */
function stateOf(session: Session): SessionState { return SESSION_STATE.get(session)! }

/**
 * The append-only session log, its one writer, and the surface projected from it (docs/design.md §4):
 * `append` checks every invariant first (else throws {@link SessionError}, changing nothing), shows the event to
 * the parts over the log ({@link CostLedger.of}, {@link RecallIndex.of}, {@link Pins.of}), updates the surface,
 * prices and usage anchor, and queues the event for {@link Session.sync}.
 */
export class Session {
  readonly store: LogStore
  /** The torn last line dropped when this session was loaded, if any. */
  torn?: TornLine
  private readonly st: SessionState
  private retained?: SessionEvent[] // the whole log, when the store cannot read events back
  private nextSeq = 0
  private readonly now: () => number
  private readonly nodes: SurfaceNode[] & Surface
  private anchorState?: UsageAnchor
  private generation = 0
  private readonly queue: EventQueue
  private listeners = new Set<(e: SessionEvent) => void>()

  constructor(options: SessionOptions = {}) {
    this.store = options.store ?? new MemoryStore()
    this.now = options.now ?? Date.now
    this.queue = new EventQueue(this.store)
    if (!readsBack(this.store)) this.retained = []
    this.nodes = Object.defineProperty([] as SurfaceNode[], 'node',
      { value: (seq: number) => this.st.bySeq.get(seq) }) as SurfaceNode[] & Surface
    this.st = {
      calls: new Map(), openCalls: new Set(), dispatched: new Set(), bySeq: new SeqIndex(),
      turn: { last: 0, open: false, step: 0, stepOpen: false }, awaitingInput: false, openedAt: 0,
      pinned: new Set(), parts: [], nodes: this.nodes, surfaceTokens: 0, envelopeTokens: 0,
      flush: () => this.queue.flush(),
      check: (type, data) => checkEvent(this.st, this.nodes, type, data), apply: (e) => this.apply(e),
    }
    SESSION_STATE.set(this, this.st)
    for (const make of PART_FACTORIES) this.st.parts.push(make(this, this.st))
  }

  /**
   * The whole log, oldest first (read-only), when the store cannot read events back (a {@link MemoryStore});
   * else throws `SessionError('STORE')`: use {@link Session.readEvent} / {@link Session.readEvents}.
   */
  get events(): SessionEvent[] {
    if (!this.retained)
      throw new SessionError('STORE', 'this session keeps only its surface in memory (its store reads events back); '
        + 'use await session.readEvent(seq) or session.readEvents(fromSeq, toSeq)')
    return this.retained
  }

  /**
   * Opens the session in `store`: a new one (`session/start`) when it is empty, else the loaded log resumed
   * (docs/design.md §4): `session/resume`, a stale compaction lock closed, every call without a result given
   * an error result (`TOOL_OUTCOME_UNKNOWN` when its `tool/call` was logged, else `TOOL_NOT_STARTED`), an
   * open step and turn closed. `readOnly`: loaded and checked, nothing written. A corrupt log throws
   * `SessionError('LOG_CORRUPT')` with the line number.
   */
  static async open(store: LogStore = new MemoryStore(),
    options: Omit<SessionOptions, 'store'> & { readOnly?: boolean } = {}): Promise<Session> {
    const session = new Session({ ...options, store })
    await loadLog(session, session.st)
    if (options.readOnly) return session
    if (session.seq === 0) {
      session.append('session/start', { id: options.id ?? randomId(), version: VERSION, format: LOG_FORMAT })
    } else resumeLog(session, session.st)
    await session.sync()
    return session
  }

  /** Number of events; also the seq of the next event. */
  get seq(): number { return this.nextSeq }
  /** Increases by exactly one on every committed replace (docs/design.md §4). */
  get replaceGeneration(): number { return this.generation }
  /** The current surface, oldest first, with `node(seq)`. A live view: do not keep it across appends. */
  surface(): Surface { return this.nodes }
  /** The open turn's number, the last step number in it, and whether a step is open. */
  get turn(): { turn: number; open: boolean; step: number; stepOpen: boolean } {
    const t = this.st.turn
    return { turn: t.last, open: t.open, step: t.step, stepOpen: t.stepOpen }
  }

  /**
   * Reads back the logged event `seq` (e.g. the original of a pruned message), from the store when the
   * session keeps only its surface. Throws `SessionError('STORE')` for a seq that is not in the log.
   */
  async readEvent(seq: number): Promise<SessionEvent> {
    if (!Number.isInteger(seq) || seq < 0 || seq >= this.nextSeq)
      throw new SessionError('STORE', `no event with seq ${seq} in this session log (0..${this.nextSeq - 1})`)
    if (this.retained) return this.retained[seq]
    await this.queue.flush() // the store reads back only what it has been given
    return await this.store.readEvent!(seq)
  }

  /**
   * The logged events with `fromSeq <= seq < toSeq`, oldest first (defaults: the whole log), read
   * back like {@link Session.readEvent}. For scans such as a recall search or `dsh show`.
   */
  async *readEvents(fromSeq = 0, toSeq = this.seq): AsyncGenerator<SessionEvent> {
    const from = Math.max(0, fromSeq), to = Math.min(toSeq, this.nextSeq)
    if (this.retained) return yield* this.retained.slice(from, to)
    await this.queue.flush()
    yield* this.store.readEvents!(from, to)
  }

  /** Calls `listener` with every event appended from now on; returns an unsubscribe function. */
  subscribe(listener: (event: SessionEvent) => void): () => void {
    this.listeners.add(listener)
    return () => this.listeners.delete(listener)
  }

  /**
   * Appends one event. Throws {@link SessionError} (and changes nothing) for a malformed message, a replace
   * whose start/end are not on the surface or out of order, a `tool/result` replace that changes more than
   * content, a replace that separates a call from its result, a result for an unknown or answered call.
   */
  append<T extends EventType>(type: T, data: EventDataMap[T]): SessionEvent<T>
  append(type: string, data: Record<string, unknown>): SessionEvent
  append(type: string, data: any): SessionEvent {
    if (typeof type !== 'string' || type === '')
      throw new SessionError('INVALID_EVENT', 'event type must be a non-empty string')
    if (typeof data !== 'object' || data === null || Array.isArray(data))
      throw new SessionError('INVALID_EVENT', `event ${type}: data must be an object`)
    this.st.check(type, data)
    const event = { seq: this.nextSeq, type, time: this.now(), data } as SessionEvent
    EVENT_JSON.set(event, storableJSON(event))
    this.apply(event)
    this.queue.push(event)
    for (const l of this.listeners) l(event)
    return event
  }

  /** Applies a checked event to the derived state. The same code serves live appends and replay. */
  private apply(event: SessionEvent): void {
    this.retained?.push(event)
    this.nextSeq = event.seq + 1
    const data = event.data as any
    const st = this.st
    const change = SURFACE_TYPES[event.type] ? this.surfaceChange(event) : undefined
    for (const part of st.parts) part.observe?.(event, change)
    switch (event.type) {
      case 'session/start': case 'session/resume': st.openedAt = event.seq; break
      case 'request/header':
        this.st.header = data
        this.st.envelopeTokens = estimateEnvelopeTokens(data)
        this.anchorState = undefined // an envelope or model change voids the usage anchor (docs/design.md §2)
        break
      case 'turn/start':
        st.turn = { last: data.turn, open: true, step: 0, stepOpen: false }
        st.input = undefined; st.awaitingInput = true
        break
      case 'turn/end':
        st.turn.open = false; st.turn.stepOpen = false; st.input = undefined; st.awaitingInput = false
        break
      case 'ladder/state': {
        // An overflow's count and the provider's own count of the request are exact: the anchor, when plausible.
        const sample = data.sample
        if ((sample?.source === 'overflow' || sample?.source === 'count')
          && plausibleRatio(sample.providerTokens, sample.heuristicTokens)) {
          this.anchorState = { providerTokens: sample.providerTokens,
            heuristicTokens: st.envelopeTokens + st.surfaceTokens, seq: event.seq }
        }
        break
      }
      case 'step/start': st.turn.step = data.step; st.turn.stepOpen = true; break
      case 'step/end': st.turn.stepOpen = false; break
      case 'tool/call': st.dispatched.add(data.callId); break
      case 'compaction/start': st.compaction = data.id; break
      case 'surface/pin': st.pinned.add(data.seq); break
      case 'surface/unpin': st.pinned.delete(data.seq); break
      case 'compaction/end': if (st.compaction === data.id) st.compaction = undefined
    }
    if (change) this.applySurface(event, change)
  }

  /** What checked surface event `event` changes on the surface (see {@link SurfaceChange}). */
  private surfaceChange(event: SessionEvent): SurfaceChange {
    const data = event.data as unknown as SessionEvent<'assistant/message'>['data']
    const { message, surfaceOp: op } = data
    const tokens = estimateMessageTokens(message)
    if (op.op === 'append') {
      const usage = event.type === 'assistant/message' ? checkedUsage(data.usage) : undefined
      return { at: this.nodes.length, removed: NO_NODES, removedTokens: 0, tokens, ...(usage ? { usage } : {}) }
    }
    const indexOf = (seq: number) => binarySearch(this.nodes, this.st.bySeq.get(seq)!.key, (n) => n.key)
    const at = indexOf(op.start), removed = this.nodes.slice(at, indexOf(op.end) + 1)
    let removedTokens = 0
    for (const n of removed) removedTokens += n.tokens
    return { at, removed, removedTokens, tokens }
  }

  /** A checked surface event: an append or a replace on the surface, its calls and the usage anchor. */
  private applySurface(event: SessionEvent, change: SurfaceChange): void {
    const { message } = event.data as { message: Message }
    const { tokens, usage } = change
    if (change.removed.length === 0) this.appendNode(event, message, tokens)
    else this.replaceNodes(event, change, message, tokens)
    if (usage) {
      const heuristicTokens = this.st.envelopeTokens + this.st.surfaceTokens
      this.anchorState = usageAnchor(usage, heuristicTokens, event.seq) ?? this.anchorState
    }
  }

  /** Appends a node to the surface. */
  private appendNode(event: SessionEvent, message: Message, tokens: number): void {
    const st = this.st
    if (message.role === 'user' && st.awaitingInput) { st.input = event.seq; st.awaitingInput = false }
    const node: SurfaceNode = { seq: event.seq, message, tokens, key: event.seq }
    this.nodes.push(node)
    st.bySeq.set(event.seq, node)
    this.st.surfaceTokens += tokens
    for (const c of toolCalls(message)) { st.calls.set(c.id, { callSeq: event.seq }); st.openCalls.add(c.id) }
    if (message.role === 'tool') {
      st.calls.get(message.toolCallId)!.resultSeq = event.seq
      st.openCalls.delete(message.toolCallId)
    }
  }

  /** Replaces the surface nodes `change.removed` by one node; what they held stays in the log. */
  private replaceNodes(event: SessionEvent, change: SurfaceChange, message: Message, tokens: number) {
    const st = this.st
    const node: SurfaceNode = { seq: event.seq, message, tokens, key: change.removed[0].key,
      ...((event.data as { compactionId?: string }).compactionId !== undefined ? { checkpoint: true } : {}) }
    for (const old of change.removed) {
      st.bySeq.delete(old.seq)
      if (message.role === 'tool' && old.message.role === 'tool') continue // same call, new content
      if (message.role === 'assistant' && toolCalls(message).length > 0) continue // a pruned one keeps its calls
      for (const c of toolCalls(old.message)) { st.calls.delete(c.id); st.openCalls.delete(c.id);
        st.dispatched.delete(c.id) }
    }
    if (message.role === 'tool') st.calls.get(message.toolCallId)!.resultSeq = event.seq
    for (const c of toolCalls(message)) st.calls.get(c.id)!.callSeq = event.seq
    this.nodes.splice(change.at, change.removed.length, node)
    st.bySeq.set(event.seq, node)
    this.st.surfaceTokens += tokens - change.removedTokens
    this.generation++
  }

  /**
   * The size of the next request, in tokens, O(1) (docs/design.md §2; calibrated as in docs/design.md
   * §10), and the `request/header` it carries (model, envelope, window, prices) as last logged.
   */
  measure(): Measurement {
    const heuristicTokens = this.st.envelopeTokens + this.st.surfaceTokens
    const calibrator = this.st.calibrator
    const { ratio: calibration, offset } = calibrator?.fit(this.st.envelopeTokens, this.st.surfaceTokens)
      ?? { ratio: 1, offset: 0 }
    const m: Measurement = Object.create(MEASUREMENT_VIEW) // MEASUREMENT_VIEW: what console.log shows
    m.calibration = calibration
    m.calibrationOffsetTokens = offset
    m.calibrationSamples = calibrator?.count ?? 0
    m.totalTokens = anchoredTotal(heuristicTokens, this.anchorState, calibration, offset)
    m.envelopeTokens = this.st.envelopeTokens
    m.surfaceTokens = this.st.surfaceTokens
    m.heuristicTokens = heuristicTokens
    m.anchored = this.anchorState !== undefined
    m.anchor = this.anchorState
    m.nodes = this.nodes
    m.header = this.st.header
    return m
  }

  /**
   * The surface as provider messages, in surface order (docs/design.md §4 "Projection"). Throws
   * `SessionError('PAIRING')` while a tool call has no result: such a request must never be sent.
   */
  messages(): Message[] {
    const open = this.st.openCalls
    if (open.size > 0)
      throw new SessionError('PAIRING', `cannot build a request: tool call(s) ${[...open].join(', ')} have `
        + 'no result yet')
    return this.nodes.map((n) => n.message)
  }

  /** Writes the queued events to the store, then makes the log durable (fsync for {@link FileStore}). */
  async sync(): Promise<void> {
    await this.queue.flush()
    await this.store.sync?.()
  }
}

/** Each appended event's JSON text, from Session.append's check until its store has taken it ({@link eventJSON}). */
const EVENT_JSON = new WeakMap<SessionEvent, string>()

/** The JSON text a store writes for `event`: the text Session.append checked, else `JSON.stringify`'s. */
const eventJSON = (event: SessionEvent): string => EVENT_JSON.get(event) ?? JSON.stringify(event)

/**
 * `event` as JSON text, or `SessionError('INVALID_EVENT')`: an event a store cannot write (a BigInt, a cycle, nesting
 * past the stack, a time that is no number) would stay queued, and every later flush of the session would fail on it.
 */
function storableJSON(event: SessionEvent): string {
  const fail = (why: string): never => {
    throw new SessionError('INVALID_EVENT', `event ${event.type}: ${why}; nothing was appended: give data that JSON `
      + `holds as it is (strings, finite numbers, booleans, null, arrays, plain objects)`)
  }
  if (!Number.isFinite(event.time)) fail(`its time ${String(event.time)} is not a number of ms (the session's now())`)
  let text: string | undefined
  try { text = JSON.stringify(event) } catch (err) { fail(`it cannot be stored as JSON (${(err as Error)?.message})`) }
  return text!
}

/** A session's appended events not yet written to its store, written in order (one write at a time). */
class EventQueue {
  private pending: SessionEvent[] = []
  private writing: Promise<void> = Promise.resolve()
  constructor(private readonly store: LogStore) {}

  push(event: SessionEvent): void { this.pending.push(event) }

  /** Writes the queued events; a batch the store refuses stays queued for the next attempt (nothing is lost). */
  flush(): Promise<void> {
    const run = async () => {
      if (this.pending.length === 0) return
      const batch = this.pending
      this.pending = []
      try { await this.store.append(batch); for (const e of batch) EVENT_JSON.delete(e) } catch (err) {
        this.pending = batch.concat(this.pending)
        if (err instanceof SessionError && err.code === 'SESSION_LOCKED') throw err // another writer: say who
        throw new SessionError('STORE', `could not write ${batch.length} event(s) to the session store: `
          + `${(err as Error)?.message ?? err}`)
      }
    }
    this.writing = this.writing.then(run, run)
    return this.writing
  }
}

/** Whether `store` reads events back, so that a session on it keeps only its surface in memory. */
const readsBack = (s: LogStore): boolean =>
  typeof s.scan === 'function' && typeof s.readEvent === 'function' && typeof s.readEvents === 'function'

/** Reads the store's log into `session`, checking every event as if it were appended. */
async function loadLog(session: Session, st: SessionState): Promise<void> {
  const replay = (e: SessionEvent) => {
    if (e.seq !== session.seq)
      throw new SessionError('LOG_CORRUPT', `event seq ${e.seq} where ${session.seq} was expected`, e.seq + 1)
    try { st.check(e.type, e.data) } catch (err) {
      throw new SessionError('LOG_CORRUPT', `session log line ${e.seq + 1}: ${(err as Error).message}`, e.seq + 1)
    }
    st.apply(e)
  }
  const store = session.store
  if (readsBack(store)) session.torn = (await store.scan!(replay)).torn // line by line: only the surface stays
  else {
    const loaded = await store.load()
    session.torn = loaded.torn
    for (const e of loaded.events) replay(e)
  }
}

/** Resumes a loaded session (see {@link Session.open}): closes what the stopped process left open. */
function resumeLog(session: Session, st: SessionState): void {
  const open = [...st.openCalls]
  session.append('session/resume', { lastSeq: session.seq - 1, torn: session.torn, repaired: open.length })
  if (st.compaction) {
    session.append('compaction/end', { id: st.compaction, error: 'stale: the process stopped during this compaction' })
  }
  for (const id of open) {
    const code = st.dispatched.has(id) ? 'TOOL_OUTCOME_UNKNOWN' : 'TOOL_NOT_STARTED'
    const text = code === 'TOOL_OUTCOME_UNKNOWN'
      ? `${code}: the process stopped while this tool call was running; its effects are unknown. Check the current `
        + `state before repeating it.`
      : `${code}: the process stopped before this tool call was started; call it again if it is still needed.`
    session.append('tool/result', { message: { role: 'tool', toolCallId: id, content: [{ type: 'text', text }],
      isError: true, metadata: { code } }, surfaceOp: { op: 'append' } })
  }
  const t = st.turn
  if (t.stepOpen) session.append('step/end', { turn: t.last, step: t.step })
  if (t.open) session.append('turn/end', { turn: t.last, reason: 'interrupted' })
}

/** Validates an event against the session's state without changing anything (throws like `append`). */
function checkEvent(st: SessionState, nodes: readonly SurfaceNode[], type: string, data: any): void {
  if (type === 'session/start' && data.format !== undefined && data.format !== LOG_FORMAT) {
    const newer = Number.isSafeInteger(data.format) && data.format > LOG_FORMAT
    throw new SessionError('INVALID_EVENT', `session/start: the log is format ${JSON.stringify(data.format)}`
      + `${newer ? ', written by a newer dsh' : ''}; this dsh (${VERSION}) reads format ${LOG_FORMAT}`
      + (newer ? ': open it with the dsh that wrote it, or a newer one' : ': a format is a positive integer'))
  }
  // the meter prices the envelope from these: a system that is no text was NaN tokens from then on
  if (type === 'request/header' && ((data.system !== undefined && typeof data.system !== 'string')
    || (data.tools !== undefined && !Array.isArray(data.tools))
    || (data.contextWindow !== undefined && !isIntegerAtLeast(data.contextWindow, 1)))) {
    throw new SessionError('INVALID_EVENT', 'request/header: system must be a string, tools an array and '
      + 'contextWindow a positive whole number of tokens, when given')
  }
  if (type === 'request/header' && data.prices !== undefined) {
    try { validatePrices(data.prices, 'request/header: prices') } catch (err) {
      throw new SessionError('INVALID_EVENT', (err as Error).message)
    }
  }
  if (type === 'compaction/end' && data.requests !== undefined) checkSummaryRequests(data.requests)
  if (type === 'request/error' && data.spent !== undefined)
    checkSummaryRequests([{ model: '', ...data.spent }], 'request/error: spent')
  if (type === 'surface/pin' || type === 'surface/unpin') return checkPin(st, type, data.seq)
  const role = SURFACE_TYPES[type]
  if (role) checkSurfaceEvent(st, nodes, type, role, data)
}

/** Checks a `surface/pin` or `surface/unpin` of `seq` (throws `SessionError('PIN')`). */
function checkPin(st: SessionState, type: string, seq: unknown): void {
  if (!Number.isInteger(seq) || !st.bySeq.has(seq as number)) {
    throw new SessionError('PIN', `${type}: seq ${JSON.stringify(seq)} is not a message on the current surface`)
  }
  const pinned = st.pinned.has(seq as number)
  if ((type === 'surface/pin') === pinned)
    throw new SessionError('PIN', `${type}: seq ${seq} is ${pinned ? 'already' : 'not'} pinned`)
}

/** Checks a surface event's message, op, call ids and replace range against the surface; throws SessionError. */
function checkSurfaceEvent(st: SessionState, nodes: readonly SurfaceNode[], type: string,
  role: Message['role'], data: any): void {
  validateMessage(data.message, role)
  const op = data.surfaceOp as SurfaceOp
  const message = data.message as Message
  if (!op || (op.op !== 'append' && op.op !== 'replace'))
    throw new SessionError('SURFACE_OP', `${type}: surfaceOp must be {op:'append'} or {op:'replace', start, end}`)
  const newCalls = toolCalls(message)
  if (op.op === 'replace' && role === 'assistant' && newCalls.length > 0) {
    // A pruned assistant message keeps its tool calls: same ids and names, in order, one node.
    const old = st.bySeq.get(op.start)?.message
    const oldCalls = old ? toolCalls(old) : []
    if (op.start !== op.end || oldCalls.length !== newCalls.length
      || oldCalls.some((c, i) => c.id !== newCalls[i].id || c.name !== newCalls[i].name)) {
      throw new SessionError('SURFACE_OP', `${type}: a replacement that carries tool calls must replace exactly the `
        + `one assistant message with the same calls (seq ${op.start})`)
    }
    if (st.pinned.has(op.start)) throw pinnedError(type, op, op.start)
    return
  }
  const seen = new Set<string>()
  for (const c of newCalls) {
    if (seen.has(c.id) || st.calls.has(c.id))
      throw new SessionError('PAIRING', `tool call id ${JSON.stringify(c.id)} is not unique on the surface`)
    seen.add(c.id)
  }
  if (op.op === 'replace') return checkReplace(st, nodes, type, role, op, message, newCalls.length)
  if (role !== 'tool') return
  const id = (message as ToolResultMessage).toolCallId
  const call = st.calls.get(id)
  if (!call) throw new SessionError('PAIRING', `tool result for unknown tool call id ${JSON.stringify(id)}`)
  if (call.resultSeq !== undefined)
    throw new SessionError('PAIRING', `tool call ${JSON.stringify(id)} already has a result (seq ${call.resultSeq})`)
}

/** The refusal of a replace `op` that would change pinned message `seq`. */
const pinnedError = (type: string, op: { start: number; end: number }, seq: number): SessionError =>
  new SessionError('PIN', `${type}: replace ${op.start}..${op.end} would change pinned message seq ${seq}; pinned `
    + 'messages are never pruned, cleared or summarised (unpin it first)')

/** Checks a replace against the surface, pins and call pairing (docs/design.md §4). */
function checkReplace(st: SessionState, nodes: readonly SurfaceNode[], type: string,
  role: Message['role'], op: { start: number; end: number }, message: Message, newCalls: number): void {
  const { start, end } = op
  const first = st.bySeq.get(start)
  const last = st.bySeq.get(end)
  if (!Number.isInteger(start) || !Number.isInteger(end) || !first || !last) {
    throw new SessionError('SURFACE_OP', `${type}: replace range ${start}..${end} must name seqs of nodes on the `
      + `current surface`)
  }
  if (first.key > last.key)
    throw new SessionError('SURFACE_OP', `${type}: replace start ${start} comes after end ${end} on the surface`)
  const lo = binarySearch(nodes, first.key, (n) => n.key), hi = binarySearch(nodes, last.key, (n) => n.key)
  for (let i = lo; i <= hi && st.pinned.size > 0; i++) {
    if (st.pinned.has(nodes[i].seq)) throw pinnedError(type, op, nodes[i].seq)
  }
  if (newCalls > 0) throw new SessionError('SURFACE_OP', `${type}: a replacement cannot carry tool calls`)
  if (role === 'tool') {
    const old = first.message
    if (start !== end || old.role !== 'tool') {
      throw new SessionError('SURFACE_OP', `tool/result: a replace must cover exactly one tool result (got `
        + `${start}..${end})`)
    }
    const { content: _a, ...restOld } = old
    const { content: _b, ...restNew } = message as ToolResultMessage
    if (JSON.stringify(restOld) !== JSON.stringify(restNew))
      throw new SessionError('SURFACE_OP', `tool/result: a replacement may change only content (seq ${start})`)
    return
  }
  const inRange = new Set<number>()
  for (let i = lo; i <= hi; i++) inRange.add(nodes[i].seq)
  for (let i = lo; i <= hi; i++) {
    const m = nodes[i].message
    for (const c of toolCalls(m)) {
      const entry = st.calls.get(c.id)!
      if (entry.resultSeq === undefined) {
        throw new SessionError('PAIRING', `replace ${start}..${end} would remove tool call ${c.id}, which has no `
          + `result yet`)
      }
      if (!inRange.has(entry.resultSeq)) {
        throw new SessionError('PAIRING', `replace ${start}..${end} would remove tool call ${c.id} but keep its `
          + `result (seq ${entry.resultSeq})`)
      }
    }
    if (m.role === 'tool' && !inRange.has(st.calls.get(m.toolCallId)!.callSeq)) {
      throw new SessionError('PAIRING', `replace ${start}..${end} would remove the result of tool call `
        + `${m.toolCallId} but keep the call (seq ${st.calls.get(m.toolCallId)!.callSeq})`)
    }
  }
}

// ── 4.1 Edits of the surface: the log protocol of a prune or a clear (docs/design.md §3, §10) ─────

/** An edit's event data for the payback (requests) the net-cost gate modelled (section 6.1a): only a finite one. */
const paybackData = (payback?: number) => Number.isFinite(payback) ? { paysBackAfterRequests: payback } : {}

/** Logs `type {shadowedSeqs:[seq], shadowedTokenCount}` and the replacing surface event: both or neither. */
function replaceNode(session: Session, node: SurfaceNode, type: 'compaction/prune' | 'compaction/clear',
  message: Message, trigger?: string, payback?: number): number {
  const seq = node.seq
  const eventType = message.role === 'tool' ? 'tool/result' : message.role === 'assistant' ? 'assistant/message'
    : 'user/message'
  const data: Record<string, unknown> = { message, surfaceOp: { op: 'replace', start: seq, end: seq } }
  if (eventType === 'assistant/message') data.finishReason = 'pruned'
  stateOf(session).check(eventType, data) // both events or neither
  session.append(type, { shadowedSeqs: [seq], shadowedTokenCount: node.tokens, ...(trigger ? { trigger } : {}),
    ...paybackData(payback) })
  const after = session.append(eventType, data)
  return node.tokens - session.surface().node(after.seq)!.tokens
}

/** Prunes a message on the surface (docs/design.md §10); tokens reclaimed, 0 when nothing is over. */
function pruneNode(session: Session, seq: number, config?: Partial<PruneConfig>, trigger?: string,
  payback?: number): number {
  const node = session.surface().node(seq)
  if (!node) throw new SessionError('SURFACE_OP', `seq ${seq} is not on the surface`)
  if (node.message.role !== 'tool' && seq === stateOf(session).input)
    throw new SessionError('SURFACE_OP', `seq ${seq} is the current turn's input, which is never edited`)
  // A user message's cut names the recall key of its original, as a checkpoint's does (docs/design.md §12).
  const m = node.message, pruned = m.role === 'tool' ? pruneResultMessage(m, config)
    : pruneMessage(m, config, m.role === 'user' ? userCutMarker(node.key) : undefined)
  return pruned === m ? 0 : replaceNode(session, node, 'compaction/prune', pruned, trigger, payback)
}

/** Clears a tool result to `placeholder` (docs/design.md §10); tokens reclaimed (callers check the sign). */
function clearNode(session: Session, seq: number, placeholder: string, trigger?: string, payback?: number): number {
  const node = session.surface().node(seq)
  if (!node || node.message.role !== 'tool')
    throw new SessionError('SURFACE_OP', `seq ${seq} is not a tool result on the surface`)
  return replaceNode(session, node, 'compaction/clear',
    { ...node.message, content: [{ type: 'text', text: placeholder }] }, trigger, payback)
}

/** Logs `request/header` when model, base URL, envelope, budget or window changed; returns whether it did. */
function logHeader(session: Session, header: RequestHeader): boolean {
  const text = JSON.stringify(header) // also drops undefined fields, so equal headers compare equal
  const last = session.measure().header, memo = headerTexts.get(session)
  const lastText = !last ? undefined : memo?.header === last ? memo.text : JSON.stringify(last)
  if (lastText === text) { if (memo?.header !== last) headerTexts.set(session, { header: last!, text }); return false }
  const logged = session.append('request/header', JSON.parse(text) as RequestHeader).data
  headerTexts.set(session, { header: logged, text })
  return true
}
/** The JSON of each session's last `request/header` (by its data object): a step stringifies one header, not two. */
const headerTexts = /* @__PURE__ */ new WeakMap<Session, { header: RequestHeader; text: string }>()

/** The tool-call block of `callId` on the surface (name and raw arguments), if any. */
function surfaceToolCall(session: Session, callId: string): ToolCallBlock | undefined {
  const st = stateOf(session)
  const entry = st.calls.get(callId)
  const node = entry && st.bySeq.get(entry.callSeq)
  return node ? toolCalls(node.message).find((c) => c.id === callId) : undefined
}

// ── 4.2 Parts over the log: the ladder's memory, cost and cache, recall index, pins ─────────
// Each part is defined once (definePart, section 4) and built with every session, which shows it each
// event before applying it (Session.apply is the one place that derives state; Session.append is the
// one writer of the log). A part answers questions about the log; a bundle that never asks drops it.

/**
 * The ladder's durable memory as `ladder/state` logs it (docs/design.md §10 "Durable ladder state"), and
 * the calibration of {@link Session.measure} it keeps (without this part in a bundle, `measure()` is
 * uncalibrated).
 */
class LadderState {
  /** Heuristic tokens when a pressure compaction last failed; undefined when none is pending. */
  failedAtTokens?: number
  /** Calibration samples (provider, heuristic tokens), newest last, for the model `model`. */
  private samples: { provider: number; heuristic: number }[] = []
  private model?: string
  /** Least-squares sums (count, Σh, Σp, Σh², Σhp) of the transcript samples, for the model `model`. */
  private transcriptFit?: { n: number; h: number; p: number; hh: number; hp: number }
  /** Samples of requests whose envelope outweighed their messages (provider; envelope and surface heuristic). */
  private heavySamples: { provider: number; envelope: number; surface: number }[] = []

  constructor(private readonly st: SessionState) { st.calibrator = this }

  /** Calibration is per model; a `ladder/state` is applied; an answer's reported prompt size is a sample. */
  observe(event: SessionEvent, change?: SurfaceChange): void {
    const data = event.data as any, st = this.st, window = st.header?.contextWindow
    if (event.type === 'request/header') this.header(data.model)
    else if (event.type === 'ladder/state') this.apply(data)
    else if (change?.usage) this.take(change.usage.promptTokens, st.envelopeTokens, st.surfaceTokens, window)
  }

  /** A `ladder/state` event: the pending failure, and its sample (the session anchors an exact count itself). */
  private apply(data: LadderStateData): void {
    const { sample, failedAtTokens } = data
    if (failedAtTokens !== undefined) this.failedAtTokens = failedAtTokens ?? undefined
    if (!sample) return
    // A replayed transcript's count is of a request this session did not send: a sample, never an anchor.
    if (sample.source === 'transcript') return this.transcript(sample.providerTokens, sample.heuristicTokens)
    const envelope = typeof sample.envelopeTokens === 'number' ? sample.envelopeTokens : this.st.envelopeTokens
    this.take(sample.providerTokens, envelope, sample.heuristicTokens - envelope, this.st.header?.contextWindow)
  }

  /** A `request/header`: calibration is per model. */
  header(model: string): void {
    if (model === this.model) return
    this.model = model; this.samples = []; this.heavySamples = []; this.transcriptFit = undefined
  }

  /**
   * Adds the count of a request of `envelope` + `messages` heuristic tokens (docs/design.md §10): a ratio sample when
   * the messages are at least half of it, else a sample of the envelope-heavy fit; returns whether it was taken.
   */
  take(provider: number, envelope: number, messages: number, contextWindow?: number): boolean {
    return messages >= envelope ? this.sample(provider, envelope + messages, contextWindow)
      : this.heavy(provider, envelope, messages, contextWindow)
  }

  /** Adds a calibration sample, the newest 8 count (docs/design.md §10); returns whether it was taken. */
  private sample(provider: number, heuristic: number, contextWindow?: number): boolean {
    if (!(heuristic >= calibrationMinSampleTokens(contextWindow)) || !plausibleRatio(provider, heuristic)) return false
    this.samples.push({ provider, heuristic })
    if (this.samples.length > CALIBRATION_SAMPLES) this.samples.shift()
    return true
  }

  /** Adds a sample of a request whose envelope outweighed its messages (docs/design.md §10), the newest 8 count. */
  private heavy(provider: number, envelope: number, surface: number, contextWindow?: number): boolean {
    if (!(surface >= 0 && envelope + surface >= calibrationMinSampleTokens(contextWindow))
      || !plausibleRatio(provider, envelope + surface)) return false
    this.heavySamples.push({ provider, envelope, surface })
    if (this.heavySamples.length > CALIBRATION_SAMPLES) this.heavySamples.shift()
    return true
  }

  /** Adds a count a replayed transcript records for a request of `heuristic` tokens (docs/design.md §15). */
  transcript(provider: number, heuristic: number): void {
    if (!(Number.isFinite(provider) && provider > 0 && Number.isFinite(heuristic) && heuristic > 0)) return
    const f = (this.transcriptFit ??= { n: 0, h: 0, p: 0, hh: 0, hp: 0 })
    f.n++; f.h += heuristic; f.p += provider; f.hh += heuristic * heuristic; f.hp += heuristic * provider
  }

  /** Whether the fit is of a replayed transcript's counts (an offset that is its harness's hidden prompt). */
  get replayed(): boolean { return this.transcriptFit !== undefined }

  /** How many samples the ratio stands on. */
  get count(): number {
    return this.transcriptFit?.n ?? (this.samples.length + this.heavySamples.length)
  }

  /** `provider ≈ offset + ratio × heuristic`: least squares over the transcript samples (docs/design.md §15), else,
   *  for a request of `envelopeTokens` + `surfaceTokens`: while the envelope outweighs the messages (or only such
   *  samples exist), the envelope-heavy fit ({@link LadderState.heavyFit}), otherwise Σ provider ÷ Σ heuristic of
   *  the newest samples (offset 0); clamped to [0.5, 4], 1 without samples. */
  fit(envelopeTokens = 0, surfaceTokens = 0): { ratio: number; offset: number } {
    const f = this.transcriptFit
    const clamp = (r: number) => Math.min(CALIBRATION_RANGE[1], Math.max(CALIBRATION_RANGE[0], r))
    if (!f) {
      const heavy = this.heavySamples.length > 0 && (surfaceTokens < envelopeTokens || this.samples.length === 0)
      if (heavy) {
        const { messages, envelope } = this.heavyFit(clamp)
        return { ratio: messages, offset: Math.round((envelope - messages) * envelopeTokens) }
      }
      // Σ provider ÷ Σ heuristic over the samples, clamped to [0.5, 4]; 1 without samples
      let p = 0, h = 0
      for (const s of this.samples) { p += s.provider; h += s.heuristic }
      return { ratio: h > 0 ? clamp(p / h) : 1, offset: 0 }
    }
    const spread = f.n * f.hh - f.h * f.h
    const fitted = spread > 1e-9 * f.n * f.hh ? (f.n * f.hp - f.h * f.p) / spread : 1
    const ratio = clamp(fitted)
    return { ratio, offset: Math.max(0, Math.round((f.p - ratio * f.h) / f.n)) }
  }

  /**
   * The ratios of the messages and of the envelope, `provider ≈ messages × surface + envelope × envelope`, by least
   * squares over the envelope-heavy samples when their shares differ enough to tell the two apart and the fit, its
   * ratios clamped, errs less than the fallback: the messages at the heuristic and the envelope taking the rest (an
   * input is then never priced at the envelope's ratio).
   */
  private heavyFit(clamp: (r: number) => number): { messages: number; envelope: number } {
    let ss = 0, se = 0, ee = 0, ps = 0, pe = 0, p = 0, e = 0, s = 0
    for (const x of this.heavySamples) {
      ss += x.surface * x.surface; se += x.surface * x.envelope; ee += x.envelope * x.envelope
      ps += x.provider * x.surface; pe += x.provider * x.envelope; p += x.provider; e += x.envelope; s += x.surface
    }
    const fallback = { messages: 1, envelope: clamp((p - s) / e) }
    const det = ss * ee - se * se
    if (!(det > HEAVY_FIT_CONDITION * ss * ee)) return fallback
    const fit = { messages: clamp((ps * ee - pe * se) / det), envelope: clamp((pe * ss - ps * se) / det) }
    const error = (f: typeof fit) => this.heavySamples.reduce((sum, x) =>
      sum + (x.provider - f.messages * x.surface - f.envelope * x.envelope) ** 2, 0)
    return error(fit) <= error(fallback) ? fit : fallback
  }
}

/** The ladder's memory of `session` (see {@link LadderState}). */
const ladderStateOf = /* @__PURE__ */ definePart((_, st) => new LadderState(st))

/** How far apart (1 − cos² of the surface and envelope columns) envelope-heavy samples must be to fit two ratios. */
const HEAVY_FIT_CONDITION = 0.01

/** How many recent surface edits keep their cache figures for {@link CostLedger.editCache}. */
const RECENT_EDITS = 64

/** The cost ledger of `session` (see {@link CostLedger.of}). */
const costLedgerOf = /* @__PURE__ */ definePart((_, st) => CostLedger['part'](st))

/**
 * Tokens and cost of a session's requests and its prompt-cache model (docs/design.md §11), kept as
 * events arrive (O(1) per append, O(edit span) per replace) so that they survive resume. Read a
 * session's with {@link CostLedger.of}.
 */
class CostLedger {
  private cacheNodes = -1
  private cachePrefixTokens = 0
  private envelopeKey = ''
  private readonly edits = new Map<number, EditCache & { time: number }>()
  private readonly buckets = new Map<string, RequestBucket>()
  /** A `request/error` of this step counted its request: the interrupted message after it is that request's. */
  private failedCounted = false
  /** @internal The summary requests of the compaction now running, counted by the cap before its `compaction/end`. */
  running: SummaryRequestRecord[] = []
  private readonly nodes: readonly SurfaceNode[]
  private constructor(private readonly st: SessionState) { this.nodes = st.nodes }
  /** @internal The part's factory ({@link definePart}): a ledger is built only with its session. */
  private static part(st: SessionState): CostLedger { return new CostLedger(st) }

  /** The cost ledger of `session`, kept since it opened (the loaded log included); a TypeError for no Session. */
  static of(session: Session): CostLedger { return costLedgerOf(session) }

  /** @internal A `request/header`: a new envelope or model caches nothing. */
  header(h: RequestHeader): void {
    const key = cacheKey(h.model, h)
    if (key !== this.envelopeKey) { this.envelopeKey = key; this.cacheNodes = -1; this.cachePrefixTokens = 0 }
  }

  /** @internal One conversation request, answered by an appended assistant message (before it is on the surface). */
  request(time: number, outputTokens: number, usage: Usage | undefined, header: RequestHeader | undefined,
    surfaceTokens: number, interrupted = false): void {
    const { inputTokens, modelledHitTokens } = this.nextRequestCache()
    if (!(interrupted && this.failedCounted)) this.add({ time, summary: false, model: header?.model ?? '', inputTokens,
      modelledHitTokens, outputTokens, usage, prices: header?.prices })
    this.failedCounted = false
    this.cacheNodes = this.nodes.length // the request sent the whole surface before this message
    this.cachePrefixTokens = surfaceTokens
  }

  /** @internal The summary requests of a `compaction/end`. */
  summaries(time: number, requests: readonly SummaryRequestRecord[], header: RequestHeader | undefined): void {
    this.running = []
    for (const r of requests) {
      const prices = r.prices ?? (r.model === header?.model ? header?.prices : undefined)
      this.add({ time, summary: true, model: r.model, inputTokens: r.inputTokens,
        modelledHitTokens: r.modelledHitTokens,
        outputTokens: r.outputTokens, usage: checkedUsage(r.usage), prices })
    }
  }

  /** @internal Each event, before the session applies it: requests, their answers and the edits of the surface. */
  observe(event: SessionEvent, change?: SurfaceChange): void {
    const data = event.data as any, header = this.st.header
    if (change && change.removed.length > 0) {
      return this.replaced(event, change.at, change.at + change.removed.length - 1, change.tokens,
        change.removedTokens)
    }
    switch (event.type) {
      case 'request/header': this.header(data); break
      case 'step/end': this.failed(); break // a failed request's partial came before
      case 'compaction/end': if (Array.isArray(data.requests)) this.summaries(event.time, data.requests, header); break
      case 'request/error': if (data.spent) this.failed(event.time, data.spent, header); break
      case 'assistant/message':
        this.request(event.time, change!.tokens, change!.usage, header, this.st.surfaceTokens,
          data.message.interrupted === true)
    }
  }

  /** @internal A `request/error` whose request the server ran (`spent`); without it, the end of a step. */
  failed(time = 0, spent?: RequestCache & { outputTokens: number }, header?: RequestHeader): void {
    this.failedCounted = spent !== undefined
    if (spent) this.add({ time, summary: false, model: header?.model ?? '', inputTokens: spent.inputTokens,
      modelledHitTokens: spent.modelledHitTokens, outputTokens: spent.outputTokens, prices: header?.prices })
  }

  /**
   * @internal A replace of surface nodes `lo..hi` (read before the splice) by a node of `tokens`:
   * everything from the edit point to the end of the cached prefix now misses.
   */
  replaced(event: SessionEvent, lo: number, hi: number, tokens: number, shadowedTokens: number): void {
    let movedTokens = 0
    if (lo < this.cacheNodes) {
      let after = 0 // old tokens in [lo, cacheNodes)
      for (let i = lo; i < this.cacheNodes; i++) after += this.nodes[i].tokens
      let kept = 0 // old tokens in (hi, cacheNodes): unchanged, but no longer in the prefix
      for (let i = hi + 1; i < this.cacheNodes; i++) kept += this.nodes[i].tokens
      movedTokens = tokens + kept
      this.cachePrefixTokens -= after
      this.cacheNodes = lo
    }
    this.edits.set(event.seq, { seq: event.seq, movedTokens, savedTokens: shadowedTokens - tokens, time: event.time })
    // asked right after the edit: keep the newest only
    if (this.edits.size > RECENT_EDITS) this.edits.delete(this.edits.keys().next().value!)
  }

  /** Folds one request into its bucket. */
  private add(r: RequestEntry): void {
    const minuteOfWeek = Math.floor(r.time / 60_000) % (7 * 24 * 60)
    const key = `${r.summary ? 1 : 0}\u0000${r.model}\u0000${r.prices ? JSON.stringify(r.prices) : ''}`
      + `\u0000${minuteOfWeek}`
    let b = this.buckets.get(key)
    if (!b) {
      this.buckets.set(key, b = { time: r.time, summary: r.summary, model: r.model, prices: r.prices,
        requests: 0, cachedInputTokens: 0, uncachedInputTokens: 0, outputTokens: 0, modelledHitTokens: 0,
        reportedCacheRequests: 0, floor: { cachedInputTokens: 0, uncachedInputTokens: 0, outputTokens: 0 } })
    }
    const billed = billedTokens(r), floor = spendFloorTokens(r, billed)
    b.floor.cachedInputTokens += floor.cachedInputTokens
    b.floor.uncachedInputTokens += floor.uncachedInputTokens
    b.floor.outputTokens += floor.outputTokens
    b.floor.cacheWriteInputTokens = (b.floor.cacheWriteInputTokens ?? 0) + (floor.cacheWriteInputTokens ?? 0)
    b.requests++
    b.cachedInputTokens += billed.cachedInputTokens
    b.uncachedInputTokens += billed.uncachedInputTokens
    b.outputTokens += billed.outputTokens
    if (billed.cacheWriteInputTokens) b.cacheWriteInputTokens = (b.cacheWriteInputTokens ?? 0)
      + billed.cacheWriteInputTokens
    b.modelledHitTokens += r.modelledHitTokens
    if (r.usage?.cachedTokens !== undefined) b.reportedCacheRequests++
  }

  /**
   * The prompt-cache figures the next conversation request would have if it were sent now
   * (docs/design.md §11), tokens by the meter: its heuristic input (envelope + surface) and the
   * modelled hit — the envelope plus the leading surface messages the previous conversation
   * request sent that no edit has touched since (0 after an envelope or model change, or before
   * the first request). O(1). Derived from the log, so it survives resume.
   */
  nextRequestCache(): RequestCache {
    const { envelopeTokens, surfaceTokens } = this.st
    return {
      inputTokens: envelopeTokens + surfaceTokens,
      modelledHitTokens: this.cacheNodes < 0 ? 0 : envelopeTokens + this.cachePrefixTokens,
    }
  }

  /**
   * The modelled cache hit of a summary request (docs/design.md §11), tokens by the meter: compared
   * with the conversation request before it, the envelope (same model and envelope only) plus the
   * leading `messages` that are the very surface messages that request sent, unedited since. 0 for
   * another model or envelope. O(messages compared).
   */
  summaryRequestHit(model: string, envelope: Envelope, messages: readonly Message[]): number {
    const st = this.st
    if (this.cacheNodes < 0 || cacheKey(model, { ...envelope, baseURL: st.header?.baseURL }) !== this.envelopeKey) {
      return 0
    }
    let tokens = st.envelopeTokens
    const n = Math.min(this.cacheNodes, messages.length)
    for (let i = 0; i < n && messages[i] === this.nodes[i].message; i++) tokens += this.nodes[i].tokens
    return tokens
  }

  /** @internal What the spend cap counts (docs/design.md §11): USD of the priced requests at their floors, the
   *  running compaction's summary requests too, and the conversation and summary requests' output tokens. */
  spendFloor(): { costUSD: number; conversationOutputTokens: number; summaryOutputTokens: number } {
    let costUSD = 0, conversationOutputTokens = 0, summaryOutputTokens = 0
    for (const b of this.buckets.values()) {
      if (b.prices) costUSD += requestCostUSD(b.prices, b.floor, b.time)
      if (b.summary) summaryOutputTokens += b.floor.outputTokens
      else conversationOutputTokens += b.floor.outputTokens
    }
    const header = this.st.header, now = Date.now()
    for (const r of this.running) {
      const prices = r.prices ?? (r.model === header?.model ? header?.prices : undefined)
      const floor = spendFloorTokens(r, billedTokens({ ...r, usage: checkedUsage(r.usage) }))
      if (prices) costUSD += requestCostUSD(prices, floor, now)
      summaryOutputTokens += floor.outputTokens
    }
    return { costUSD, conversationOutputTokens, summaryOutputTokens }
  }

  /** The prompt-cache effect of the surface edit logged as event `seq` (a replace), if it was one. */
  editCache(seq: number): EditCache | undefined {
    const e = this.edits.get(seq)
    return e && { seq: e.seq, movedTokens: e.movedTokens, savedTokens: e.savedTokens }
  }

  /**
   * {@link CostLedger.editCache} priced with `prices` (default: the table of the current
   * `request/header`) at the edit's time; undefined when `seq` was no surface edit.
   */
  editCost(seq: number, prices: Prices | undefined = this.st.header?.prices): EditCost | undefined {
    const e = this.edits.get(seq), cost: EditCost | undefined = this.editCache(seq)
    if (e && cost && prices) {
      cost.cacheCostUSD = cacheCostUSD(prices, e.movedTokens, e.time)
      const peak = isPeakTime(prices, e.time) ? prices.peak!.multiplier : 1
      cost.savedUSDPerRequest = (e.savedTokens * prices.cacheHitInput * peak) / 1_000_000
    }
    return cost
  }

  /**
   * Tokens and cost so far (docs/design.md §11), conversation and summary requests apart and
   * together; O(buckets). Per request: input = the reported prompt tokens, else the meter's
   * estimate; cached = the reported `cachedTokens` (the report wins), else the modelled hit (scaled
   * by reported ÷ estimated input when only the prompt size was reported); output = the reported
   * completion tokens, else the meter's price of the answer. Cost uses the price table logged with
   * the request's `request/header` (the provider's `prices`), peak hours by the event's time;
   * `options.prices` re-prices every request instead (a table, or a function of the model name). A
   * request with no price makes `costUSD` undefined ("unknown"); tokens are still reported.
   */
  usage(options: { prices?: Prices | ((model: string) => Prices | undefined) } = {}): SessionUsage {
    const tally = (): TokenTally => ({ requests: 0, inputTokens: 0, cachedInputTokens: 0, uncachedInputTokens: 0,
      outputTokens: 0, costUSD: 0, unpricedRequests: 0 })
    const conversation = tally(), summary = tally(), total = tally()
    let modelledHitTokens = 0, reportedCacheRequests = 0
    const override = options.prices
    for (const b of this.buckets.values()) {
      reportedCacheRequests += b.reportedCacheRequests
      modelledHitTokens += b.modelledHitTokens
      const prices = override === undefined ? b.prices : typeof override === 'function' ? override(b.model) : override
      for (const t of b.summary ? [summary, total] : [conversation, total]) {
        t.requests += b.requests
        t.inputTokens += b.cachedInputTokens + b.uncachedInputTokens
        t.cachedInputTokens += b.cachedInputTokens
        t.uncachedInputTokens += b.uncachedInputTokens
        t.outputTokens += b.outputTokens
        if (!prices) t.unpricedRequests += b.requests
        else if (t !== total) t.costUSD! += requestCostUSD(prices, b, b.time) // linear in tokens: one call per bucket
      }
    }
    for (const t of [conversation, summary]) if (t.unpricedRequests > 0) t.costUSD = undefined
    // The total's cost as the sum of the two parts' (one rounding, as callers add them).
    total.costUSD = conversation.costUSD === undefined || summary.costUSD === undefined ? undefined
      : conversation.costUSD + summary.costUSD
    const cacheHitShare = total.inputTokens > 0 ? total.cachedInputTokens / total.inputTokens : 0
    return { ...total, conversation, summary, cacheHitShare, modelledHitTokens, reportedCacheRequests }
  }
}

/**
 * The originals the surface no longer shows as logged (docs/design.md §10 "Recall"), indexed as
 * events arrive so that `recall` reads a few events instead of scanning the log. Read a session's
 * with {@link RecallIndex.of}.
 */
class RecallIndex {
  /** Append seqs of the shadowed originals; sorted lazily. */
  private readonly shadowed: number[] = []
  private sorted = true
  /** Seqs of spilled tool results (listed in `shadowed` when appended). */
  private readonly spilledSeqs = new Set<number>()
  /** Shadowed result seq → append seq of the assistant message holding its call. */
  private readonly calls = new Map<number, number>()
  /** callId → seq of its newest shadowed result (an id may be reused once its call is off the surface). */
  private readonly resultsByCall = new Map<string, number>()
  /** callId → heuristic price (tokens) of its result as first logged. */
  private readonly firstResultTokens = new Map<string, number>()
  private constructor(private readonly session: Session, private readonly st: SessionState) {}
  /** @internal The part's factory ({@link definePart}): an index is built only with its session. */
  private static part(session: Session, st: SessionState): RecallIndex { return new RecallIndex(session, st) }

  /** The recall index of `session`, kept since it opened (the loaded log included); a TypeError for no Session. */
  static of(session: Session): RecallIndex { return recallIndexOf(session) }

  /** @internal Each surface event, before the session applies it: spills, first results, shadowed originals. */
  observe(event: SessionEvent, change?: SurfaceChange): void {
    if (!change) return
    const { message, spilled } = event.data as { message: Message; spilled?: unknown }
    if (change.removed.length === 0) {
      if (message.role !== 'tool') return
      if (spilled) this.spilled(event.seq, message)
      return this.result(message.toolCallId, change.tokens)
    }
    // An appended node's seq is its key; a replacement's seq is later than its key.
    for (const old of change.removed) {
      if (old.seq === old.key && !this.isSpilled(old.seq)) this.shadow(old.seq, old.message)
    }
  }

  /** @internal The original at `seq` is no longer shown as logged; a result remembers its call. */
  shadow(seq: number, message: Message): void {
    if (this.shadowed.length > 0 && seq < this.shadowed[this.shadowed.length - 1]) this.sorted = false
    this.shadowed.push(seq)
    if (message.role !== 'tool') return
    const newest = this.resultsByCall.get(message.toolCallId)
    if (newest === undefined || seq > newest) this.resultsByCall.set(message.toolCallId, seq)
    // The call's node key is the append seq of the assistant message as the model sent it.
    const entry = this.st.calls.get(message.toolCallId)
    const callKey = entry && this.st.bySeq.get(entry.callSeq)?.key
    if (callKey !== undefined) this.calls.set(seq, callKey)
  }
  /** @internal A spilled tool result: the surface shows a preview of the original. */
  spilled(seq: number, message: Message): void { this.spilledSeqs.add(seq); this.shadow(seq, message) }
  /** @internal Whether the result at `seq` was spilled. */
  isSpilled(seq: number): boolean { return this.spilledSeqs.has(seq) }
  /** @internal The first result of `callId` was logged at this price. */
  result(callId: string, tokens: number): void { this.firstResultTokens.set(callId, tokens) }

  /**
   * The seqs of the logged originals the surface no longer shows as logged (pruned, cleared, summarised or
   * spilled), oldest first; read each with {@link Session.readEvent}. A live view: do not keep it across appends.
   */
  shadowedSeqs(): readonly number[] {
    if (!this.sorted) { this.shadowed.sort((a, b) => a - b); this.sorted = true }
    return this.shadowed
  }
  /**
   * For a shadowed tool result, the append seq of the assistant message holding its call as the model sent
   * it, even once that call is off the surface or its id reused; undefined otherwise.
   */
  shadowedCallSeq(resultSeq: number): number | undefined { return this.calls.get(resultSeq) }
  /** The seq of the newest shadowed original result of tool call `callId` (whatever it became since), if any. */
  shadowedResultSeq(callId: string): number | undefined { return this.resultsByCall.get(callId) }
  /** The seq of the first logged result of tool call `callId` while the call is on the surface, else undefined. */
  resultOriginSeq(callId: string): number | undefined {
    const entry = this.st.calls.get(callId)
    return entry?.resultSeq === undefined ? undefined : this.st.bySeq.get(entry.resultSeq)?.key
  }
  /** Whether the log holds originals the surface no longer shows (a replace or a spill happened). */
  get hasShadowedContent(): boolean { return this.session.replaceGeneration > 0 || this.spilledSeqs.size > 0 }
  /** The heuristic price in tokens of the original of surface node `seq` (a tool result: as first logged). */
  originalTokens(seq: number): number {
    const node = this.st.bySeq.get(seq)
    if (!node) throw new SessionError('SURFACE_OP', `seq ${seq} is not on the surface`)
    const first = node.message.role === 'tool' ? this.firstResultTokens.get(node.message.toolCallId) : undefined
    return first ?? node.tokens
  }
}

/**
 * Pinned surface messages (docs/design.md §12): never pruned, cleared or summarised; region
 * selection treats them like the current input. Logged (`surface/pin`, `surface/unpin`), so they
 * survive resume, and priced against the window like any message. The session keeps the set (its
 * replace check reads it); this view of it pins, unpins and prices. Read a session's with {@link Pins.of}.
 */
class Pins {
  private readonly pinned: Set<number>
  private constructor(private readonly session: Session, private readonly st: SessionState) { this.pinned = st.pinned }

  /** The pins of `session` (one view of the set the session keeps). Throws a TypeError for no Session. */
  static of(session: Session): Pins {
    const st = sessionState(session)
    return st.pins ??= new Pins(session, st)
  }

  /** Whether the surface node `seq` is pinned. */
  has(seq: number): boolean { return this.pinned.has(seq) }
  /** Seqs of the pinned surface nodes, in the order they were pinned. */
  seqs(): number[] { return [...this.pinned] }
  /** What the pinned messages cost, in tokens (§2 heuristic); they count against the window like any message. */
  tokens(): number {
    let tokens = 0
    for (const seq of this.pinned) tokens += this.st.bySeq.get(seq)!.tokens
    return tokens
  }

  /**
   * Throws `SessionError('PIN')` unless envelope + pinned messages + `extraTokens` (tokens, at the calibration)
   * stay within `limitTokens` (default: the compaction threshold of the logged window; none while it is unknown).
   */
  checkFits(extraTokens: number, what: string, limitTokens?: number): void {
    const m = this.session.measure()
    const window = m.header?.contextWindow
    const limit = limitTokens ?? (window === undefined ? Infinity
      : Math.floor(window * DEFAULT_COMPACTION_CONFIG.thresholdRatio))
    const pinned = this.tokens() + extraTokens
    const rate = m.calibration // the limit is measured tokens, the prices heuristic ones (docs/design.md §10)
    const envelope = sentEnvelopeTokens(this.session), measured = envelope + Math.ceil(pinned * rate)
    if (measured <= limit) return
    const counted = envelope === m.envelopeTokens ? '' : ` (${envelope} as the provider counts it)`
    const how = measured === m.envelopeTokens + pinned ? ''
      : `${rate === 1 ? '' : ` at × ${rate.toFixed(2)} calibration`} (${measured} tokens)`
    throw new SessionError('PIN', `cannot pin ${what} (${extraTokens} tokens): pinned messages would hold ${pinned} `
      + `tokens, which with the ${m.envelopeTokens}-token envelope${counted} exceeds the ${limit}-token limit for `
      + `pins${window === undefined ? '' : ` (the compaction threshold of the ${window}-token window)`}${how}; `
      + 'pinned messages are never compacted, so unpin one (Pins.of(session).unpin(seq), CLI /unpin) or pin a shorter '
      + 'message')
  }

  /**
   * Pins surface node `seq` (logs `surface/pin {seq}`): never pruned, cleared or summarised from now on.
   * @throws SessionError `PIN` when `seq` is not on the surface, is already pinned, or would not fit
   *   ({@link Pins.checkFits} with `options.limitTokens`).
   */
  pin(seq: number, options: { limitTokens?: number } = {}): void {
    const node = this.st.bySeq.get(seq)
    if (node && !this.pinned.has(seq)) this.checkFits(node.tokens, `seq ${seq}`, options.limitTokens)
    this.session.append('surface/pin', { seq })
  }

  /** Removes a pin (logs `surface/unpin {seq}`). Throws `SessionError('PIN')` when `seq` is not pinned. */
  unpin(seq: number): void { this.session.append('surface/unpin', { seq }) }
}

/** The recall index of `session` (see {@link RecallIndex.of}). */
const recallIndexOf = /* @__PURE__ */ definePart((session, st) => RecallIndex['part'](session, st))

interface RequestBucket extends BilledTokens {
  /** Time of the bucket's first request (ms): its minute decides the peak window. */
  time: number
  summary: boolean
  model: string
  prices?: Prices
  requests: number
  modelledHitTokens: number
  reportedCacheRequests: number
  /** What the spend cap counts of the bucket's requests (section 8, {@link spendFloorTokens}). */
  floor: BilledTokens
}

interface RequestEntry {
  time: number
  summary: boolean
  model: string
  inputTokens: number
  modelledHitTokens: number
  outputTokens: number
  usage?: Usage
  prices?: Prices
}

/** Throws `SessionError('INVALID_EVENT')` unless `requests` is a list of {@link SummaryRequestRecord}s (cost figures
 *  stay numbers). */
function checkSummaryRequests(requests: unknown, where = 'compaction/end: requests'): void {
  const count = (v: unknown) => typeof v === 'number' && Number.isFinite(v) && v >= 0
  if (!Array.isArray(requests))
    throw new SessionError('INVALID_EVENT', 'compaction/end: requests must be an array of summary request records')
  requests.forEach((r, i) => {
    const ok = typeof r === 'object' && r !== null && typeof r.model === 'string' && count(r.inputTokens)
      && count(r.modelledHitTokens) && count(r.outputTokens)
      && (r.usage === undefined || (typeof r.usage === 'object' && r.usage !== null && count(r.usage.promptTokens)
        && count(r.usage.completionTokens)))
    if (!ok) throw new SessionError('INVALID_EVENT', `${where}[${i}] must be {model, inputTokens, `
      + `modelledHitTokens, outputTokens, usage?} with token counts as non-negative numbers, `
      + `got ${JSON.stringify(r)?.slice(0, 120)}`)
    if (r.prices !== undefined) {
      try { validatePrices(r.prices, `${where}[${i}].prices`) }
      catch (err) { throw new SessionError('INVALID_EVENT', (err as Error).message) }
    }
  })
}

/** What the prompt cache is keyed on besides the messages: model, base URL, system prompt, tools. */
function cacheKey(model: string, h: { baseURL?: string; system?: string; tools?: readonly ToolSpec[] }): string {
  return JSON.stringify([model, h.baseURL ?? '', h.system ?? '', h.tools ?? []])
}

/** The billed split of one request (docs/design.md §11): reported figures, else the meter's. */
function billedTokens(r: { inputTokens: number; modelledHitTokens: number; outputTokens: number;
  usage?: Usage }): BilledTokens {
  // a prompt is never 0 tokens: 0 means "not reported"
  const u = r.usage && r.usage.promptTokens > 0 ? r.usage : undefined
  const input = u ? u.promptTokens : r.inputTokens
  const share = r.inputTokens > 0 ? Math.min(1, r.modelledHitTokens / r.inputTokens) : 0
  const cached = Math.min(input, Math.max(0, u?.cachedTokens ?? (u ? Math.round(input * share) : r.modelledHitTokens)))
  const writes = Math.min(input - cached, Math.max(0, u?.cacheWriteTokens ?? 0))
  return { cachedInputTokens: cached, uncachedInputTokens: input - cached, outputTokens: r.usage
    ? r.usage.completionTokens : r.outputTokens, ...(writes > 0 ? { cacheWriteInputTokens: writes } : {}) }
}

function randomId(): string {
  const c = (globalThis as any).crypto
  if (c?.randomUUID) return c.randomUUID()
  return `s-${Date.now().toString(36)}-${Math.random().toString(36).slice(2, 10)}`
}

// ═══════════════════════════════════════
// 5. Pruner
// ═══════════════════════════════════════

/** The text put where the middle of a pruned tool result was (39 code points). docs/design.md §3. */
const PRUNE_MARKER = '\n\n[... tool result middle pruned ...]\n\n'
const MARKER_CODE_POINTS = 39

/** Pruner configuration, all lengths in Unicode code points (docs/design.md §3). */
export interface PruneConfig {
  thresholdChars: number
  headChars: number
  tailChars: number
}

/** `{thresholdChars: 8192, headChars: 4096, tailChars: 1024}` code points. docs/design.md §3. */
const DEFAULT_PRUNE_CONFIG: Readonly<PruneConfig> =
  /* @__PURE__ */ Object.freeze({ thresholdChars: 8192, headChars: 4096, tailChars: 1024 })

const validatedConfigs = new WeakSet<object>()

/** The full prune configuration; throws {@link ConfigError} for bad keys or values (docs/design.md §3). */
function resolvePruneConfig(config?: Partial<PruneConfig>): PruneConfig {
  if (config === undefined || config === DEFAULT_PRUNE_CONFIG) return DEFAULT_PRUNE_CONFIG
  if (validatedConfigs.has(config)) return config as PruneConfig
  const full = withDefaults('prune config', config, DEFAULT_PRUNE_CONFIG)
  for (const key of ['thresholdChars', 'headChars', 'tailChars'] as const) {
    if (!isIntegerAtLeast(full[key], 0))
      throw configError(`prune config: ${key}`, 'a non-negative integer number of code points', full[key])
  }
  const { headChars: head, tailChars: tail, thresholdChars: threshold } = full
  if (head + MARKER_CODE_POINTS + tail > threshold) {
    throw configError(`prune config: headChars (${head}) + marker (${MARKER_CODE_POINTS}) + tailChars (${tail})`,
      `at most thresholdChars (${threshold})`, head + MARKER_CODE_POINTS + tail,
      'lower headChars or tailChars, or raise thresholdChars')
  }
  validatedConfigs.add(full)
  return full
}

const isHigh = (c: number) => c >= 0xd800 && c <= 0xdbff
const isLow = (c: number) => c >= 0xdc00 && c <= 0xdfff

/** UTF-16 index just after the first `n` code points of `text` (or `text.length`). O(n). */
function indexAfterCodePoints(text: string, n: number): number {
  let i = 0
  for (let k = 0; k < n && i < text.length; k++) i += isHigh(text.charCodeAt(i))
    && isLow(text.charCodeAt(i + 1)) ? 2 : 1
  return i
}

/** UTF-16 index where the last `n` code points of `text` start (or 0). O(n). */
function indexBeforeLastCodePoints(text: string, n: number): number {
  let i = text.length
  for (let k = 0; k < n && i > 0; k++) i -= isLow(text.charCodeAt(i - 1)) && isHigh(text.charCodeAt(i - 2)) ? 2 : 1
  return i
}

/**
 * Number of Unicode code points in `text` (a surrogate pair counts once; a lone surrogate counts
 * once). O(length). Stops early and returns `limit + 1` when `limit` is given and exceeded, so a
 * "more than N?" question costs O(N) whatever the text's size.
 */
function codePointLength(text: string, limit = Infinity): number {
  if (text.length <= limit) {
    // Fast path: no astral characters means one code point per UTF-16 unit.
    let n = 0
    for (let i = 0; i < text.length; i++, n++) if (isHigh(text.charCodeAt(i)) && isLow(text.charCodeAt(i + 1))) i++
    return n
  }
  let n = 0
  for (let i = 0; i < text.length; i++) {
    if (isHigh(text.charCodeAt(i)) && isLow(text.charCodeAt(i + 1))) i++
    if (++n > limit) return n
  }
  return n
}

/**
 * Prunes one text: unchanged when it holds ≤ `thresholdChars` code points, else the first
 * `headChars` code points + {@link PRUNE_MARKER} + the last `tailChars` code points. Never splits a
 * surrogate pair. O(head + tail + threshold) whatever the text's length. Idempotent.
 * Throws {@link ConfigError} for a bad config. docs/design.md §3.
 */
function pruneText(text: string, config?: Partial<PruneConfig>): string {
  if (typeof text !== 'string')
    throw new TypeError(`pruneText: text must be a string, got ${text === null ? 'null' : typeof text}`)
  const cut = pruneResultMessage({ role: 'tool', toolCallId: '', content: [{ type: 'text', text }] }, config)
  return (cut.content[0] as TextBlock).text
}

/** Whether `text` holds more than `threshold` code points; counts only inside (threshold, 2 × threshold] units. */
function overThreshold(text: string, threshold: number): boolean {
  if (text.length <= threshold) return false
  if (text.length > 2 * threshold) return true
  return codePointLength(text, threshold) > threshold
}

/** A copy of a slice of `source`: V8 keeps a slice as a view of its parent (a 5 KB cut would pin 100 MB). */
function detach(result: string, source: string): string {
  return source.length > 65_536 ? JSON.parse(JSON.stringify(result)) : result
}

/**
 * Prunes a tool result (docs/design.md §3). Its text blocks are treated as one joined text (no
 * separator): when that holds ≤ `thresholdChars` code points the same object is returned.
 * Otherwise the first `headChars` and last `tailChars` code points are kept, the marker goes into
 * the first text block the cut touches, text blocks wholly inside the cut are dropped, non-text
 * blocks keep their order among the kept blocks, and every other field (toolCallId, isError,
 * metadata) is unchanged. Work is O(head + tail + threshold + blocks). Idempotent.
 */
function pruneToolResult(message: ToolResultMessage, config?: Partial<PruneConfig>): ToolResultMessage
/**
 * Prunes the tool result at surface node `seq` of `session` (docs/design.md §3): logs `compaction/prune` and
 * the pruned `tool/result` as a replace of `seq` (the original stays in the log). Returns the tokens
 * reclaimed (0, nothing logged, when it is within the threshold). Throws `SessionError('SURFACE_OP')` for a seq
 * that is no tool result on the surface.
 */
function pruneToolResult(session: Session, seq: number, config?: Partial<PruneConfig>, trigger?: string): number
function pruneToolResult(target: ToolResultMessage | Session, configOrSeq?: Partial<PruneConfig> | number,
  config?: Partial<PruneConfig>, trigger?: string): ToolResultMessage | number {
  if (typeof configOrSeq !== 'number' && !SESSION_STATE.has(target as Session)) {
    return pruneResultMessage(target as ToolResultMessage, configOrSeq as Partial<PruneConfig> | undefined)
  }
  sessionState(target as Session) // a TypeError for anything else
  const seq = configOrSeq as number
  if ((target as Session).surface().node(seq)?.message.role !== 'tool')
    throw new SessionError('SURFACE_OP', `seq ${seq} is not a tool result on the surface`)
  return pruneNode(target as Session, seq, config, trigger)
}

/** {@link pruneToolResult} of a message. */
function pruneResultMessage(message: ToolResultMessage, config?: Partial<PruneConfig>): ToolResultMessage {
  const cfg = resolvePruneConfig(config)
  const blocks = message.content
  // Count code points of the joined text, stopping past the threshold.
  let leftChars = cfg.thresholdChars
  for (const b of blocks) {
    if (b.type !== 'text') continue
    const t = (b as TextBlock).text
    leftChars -= overThreshold(t, leftChars) ? leftChars + 1 : codePointLength(t, leftChars)
    if (leftChars < 0) break
  }
  if (leftChars >= 0) return message

  // The head cut: walk forward through text blocks until `headChars` code points are kept.
  const texts = blocks.map((b, i) => (b.type === 'text' ? i : -1)).filter((i) => i >= 0)
  let left = cfg.headChars
  let headBlock = -1, headEnd = 0 // block index (into `blocks`) and UTF-16 index where the cut starts
  for (const i of texts) {
    const t = (blocks[i] as TextBlock).text
    const end = indexAfterCodePoints(t, left)
    if (end < t.length) { headBlock = i; headEnd = end; break }
    left -= codePointLength(t, left) // the whole block is kept
  }
  // The tail cut: walk backward.
  left = cfg.tailChars
  let tailBlock = -1, tailStart = 0
  for (let k = texts.length - 1; k >= 0; k--) {
    const i = texts[k]
    const t = (blocks[i] as TextBlock).text
    const start = indexBeforeLastCodePoints(t, left)
    if (start > 0) { tailBlock = i; tailStart = start; break }
    left -= codePointLength(t, left)
  }
  const out: Block[] = []
  for (let i = 0; i < blocks.length; i++) {
    const b = blocks[i]
    if (b.type !== 'text' || i < headBlock || i > tailBlock) { out.push(b); continue }
    const t = (b as TextBlock).text
    if (i === headBlock) {
      const rest = i === tailBlock ? t.slice(tailStart) : ''
      out.push({ ...b, text: detach(t.slice(0, headEnd) + PRUNE_MARKER + rest, t) } as TextBlock)
    } else if (i === tailBlock) {
      out.push({ ...b, text: detach(t.slice(tailStart), t) } as TextBlock)
    } // else: wholly inside the cut, dropped
  }
  return { ...message, content: out }
}

/** The smaller cut for the string values of tool-call arguments still over the threshold. */
const ARGUMENT_VALUE_CUT: Readonly<PruneConfig> =
  /* @__PURE__ */ Object.freeze({ thresholdChars: 1024, headChars: 512, tailChars: 256 })

/** Tool-call arguments (JSON text) cut to the threshold and kept valid JSON (docs/design.md §10). */
function pruneToolArguments(args: string, config?: Partial<PruneConfig>): string {
  const cfg = resolvePruneConfig(config)
  if (!overThreshold(args, cfg.thresholdChars)) return args
  let value: unknown
  try { value = JSON.parse(args) } catch { return pruneText(args, cfg) }
  // a model's arguments nested deeper than dsh keeps are cut as text: `cut` below would overflow the stack
  if (nestedDeeperThan(value)) return pruneText(args, cfg)
  const cut = (v: unknown, c: PruneConfig): unknown =>
    typeof v === 'string' ? pruneText(v, c)
      : Array.isArray(v) ? v.map((x) => cut(x, c))
        : v !== null && typeof v === 'object'
          ? Object.fromEntries(Object.entries(v).map(([k, x]) => [k, cut(x, c)])) : v
  let out = JSON.stringify(cut(value, cfg))
  if (overThreshold(out, cfg.thresholdChars)) out = JSON.stringify(cut(JSON.parse(out),
    resolvePruneConfig(ARGUMENT_VALUE_CUT)))
  return out.length < args.length ? out : args
}

/** `text` pruned (§3), `marker` (if any) where {@link PRUNE_MARKER} went: found by place (the text may hold one). */
function markedCut(text: string, cfg: PruneConfig, marker?: string): string {
  const cut = pruneText(text, cfg), at = indexAfterCodePoints(cut, cfg.headChars)
  return marker === undefined || cut === text ? cut : cut.slice(0, at) + marker + cut.slice(at + PRUNE_MARKER.length)
}

/** A message's oversized text, reasoning and call arguments pruned (docs/design.md §10); the same object if none.
 *  `marker` takes the place of {@link PRUNE_MARKER} in its texts, cut only where that makes them shorter. */
function pruneMessage<M extends Message>(message: M, config?: Partial<PruneConfig>, marker?: string): M {
  const cfg = resolvePruneConfig(config)
  if (message.role === 'tool') return pruneResultMessage(message, cfg) as M
  // A cut that names its key and is no shorter is no cut: the text stays whole (a plain marker would lose the key).
  const cut = (t: string) => { const out = markedCut(t, cfg, marker); return out.length < t.length ? out : t }
  if (typeof message.content === 'string') {
    const text = cut(message.content)
    return (text === message.content ? message : { ...message, content: text })
  }
  let changed = false
  const content = message.content.map((b): Block => {
    if (b.type === 'text' || b.type === 'reasoning') {
      const text = cut((b as TextBlock).text)
      if (text === (b as TextBlock).text) return b
      changed = true
      return { ...b, text } as Block
    }
    if (b.type === 'tool-call') {
      const args = pruneToolArguments((b as ToolCallBlock).arguments, cfg)
      if (args === (b as ToolCallBlock).arguments) return b
      changed = true
      return { ...b, arguments: args } as Block
    }
    return b
  })
  return changed ? { ...message, content } : message
}

// ═══════════════════════════════════════
// 6. Ladder
// ═══════════════════════════════════════

// prune → clear → compact → fail, plus spill at write time (docs/design.md §§5, 10). Each rung runs
// only when the one before did not bring the total under the threshold. A new rung is a function
// here plus one line in Ladder.relievePressure (and Ladder.recoverOverflow if it helps there).

/**
 * The ladder's options (docs/design.md §§5, 10). Ratios are of the context window.
 * - `thresholdRatio` 0.8: pressure starts at `floor(window × 0.8)` tokens.
 * - `auto` true: the Agent runs the ladder itself; false disables pressure and overflow handling.
 * - `clear` true: the clear rung (old tool results → one-line placeholders, no model call).
 */
export interface CompactionConfig {
  thresholdRatio: number
  auto: boolean
  clear: boolean
}

/** The defaults of docs/design.md §§5, 10. */
const DEFAULT_COMPACTION_CONFIG: Readonly<CompactionConfig> = /* @__PURE__ */ Object.freeze({
  thresholdRatio: 0.8, auto: true, clear: true,
})

/** A pressure compaction keeps the newest `floor(window × 0.16)` tokens verbatim (docs/design.md §5). */
const RETAINED_TAIL_RATIO = 0.16
/** Cap on a summary request's completion budget, tokens; see {@link summaryMaxTokens} (docs/design.md §5). */
const SUMMARY_MAX_TOKENS = 8192

/**
 * The ladder's configuration as it runs: the options over their defaults, and the constants a user does not
 * set. `gate`: the net-cost gate (docs/design.md §11), which acts where prices are known — below the threshold
 * an edit is made only when it pays back within the requests expected, and at pressure the clear rung takes the
 * protected results too when that is cheaper than a summary. Benchmarks and tests turn it off, or change the
 * other two, through the one test seam (`internals.tuning.ladder`), read when an Agent is made.
 */
export interface LadderConfig extends CompactionConfig {
  /** Share of the kept window a pressure compaction leaves verbatim ({@link RETAINED_TAIL_RATIO}). */
  readonly retainedTailRatio: number
  /** Cap on a summary request's completion budget, tokens ({@link SUMMARY_MAX_TOKENS}). */
  readonly summaryMaxTokens: number
  /** Whether the net-cost gate acts (where prices are known). */
  readonly gate: boolean
}

/** The ladder's test seam (`internals.tuning.ladder`, docs/design.md §14): the constants above. */
const ladderTuning = { retainedTailRatio: RETAINED_TAIL_RATIO, summaryMaxTokens: SUMMARY_MAX_TOKENS, gate: true }

/** Extra summary attempts under pressure (docs/design.md §5). */
const COMPACTION_RETRIES = 1
/** Consecutive overflow recoveries per step, reset by a successful response (docs/design.md §5). */
const MAX_OVERFLOW_RETRIES = 1
/** A compaction that saves less than this share of the total counts as failed. */
const MIN_SAVINGS_RATIO = 0.05
/** Tool results over this many UTF-8 bytes are spilled at write time (256 KiB; docs/design.md §5). */
const SPILL_BYTES = 262_144 // 256 KiB
/** The clear rung clears down to `floor(window × 0.6)` tokens (docs/bench.md measured 0.4–0.75). */
const RELIEF_RATIO = 0.6
/** Under a threshold at or below RELIEF_RATIO, the clear rung clears down to this share of the threshold. */
const RELIEF_SHARE_OF_THRESHOLD = 0.75
/** The share of the window the clear rung clears down to under `cfg`. */
const reliefRatio = (cfg: CompactionConfig) =>
  cfg.thresholdRatio > RELIEF_RATIO ? RELIEF_RATIO : cfg.thresholdRatio * RELIEF_SHARE_OF_THRESHOLD
/** The newest tool results worth `floor(window × 0.2)` tokens (and always the newest step's) are never cleared. */
const PROTECTED_RATIO = 0.2

/** The full ladder configuration; throws {@link ConfigError} for bad keys or values. */
function resolveCompactionConfig(config?: Partial<CompactionConfig>): LadderConfig {
  const full = config === undefined ? { ...DEFAULT_COMPACTION_CONFIG }
    : withDefaults('compaction config', config, DEFAULT_COMPACTION_CONFIG, REMOVED_OPTIONS.compaction)
  const v = full.thresholdRatio
  if (!(typeof v === 'number' && v > 0 && v <= 1))
    throw configError('compaction config: thresholdRatio', 'a number in (0, 1] (a share of the context window)', v)
  for (const key of ['auto', 'clear'] as const) {
    if (typeof full[key] !== 'boolean') throw configError(`compaction config: ${key}`, 'true or false', full[key])
  }
  return { ...full, ...ladderTuning }
}

/** The one-line preamble in front of a summary checkpoint (docs/design.md §4 "Projection"). */
const CHECKPOINT_PREAMBLE = 'Earlier parts of this session were compacted into the checkpoint below; continue the '
  + 'work from it.'

/** The instruction that ends every summary request (docs/design.md §5 "Summary transaction"). */
const SUMMARY_INSTRUCTION = /* @__PURE__ */ [
  'Write a checkpoint of the conversation above so that the work can continue from it alone; the messages it covers '
    + 'will be removed.',
  'Do not call any tool. Answer with the checkpoint only, under these headings:',
  '1. Request — what the user asked for, in their words where it matters.',
  '2. Key facts — decisions, constraints and findings.',
  '3. Files — every path read, created or changed, and what changed.',
  '4. Errors and fixes — what failed, the exact messages, and what fixed them.',
  '5. Pending work — what was asked or promised and is not done.',
  '6. Current work — what was being done right before this checkpoint.',
  '7. Next step — the single next action.',
  'Keep exact paths, commands, identifiers, numbers and error texts verbatim. If an earlier checkpoint is included, '
    + 'merge it in; drop nothing from it that still matters.',
].join('\n')

/** The checkpoint's own tags, where a text inside it opens or closes one. */
const CHECKPOINT_TAG = /<(?=\/?(?:compacted-summary|ledger|user-message)\b)/gi
/** `text` with the checkpoint's tags neutralised (`<` as `&lt;`): a summary or a tool's error line could otherwise
 *  close its block and forge a ledger, with user messages "recorded by dsh, verbatim". */
const neutralTags = (text: string): string => text.replace(CHECKPOINT_TAG, '&lt;')

/** Pins are never summarised: when they hold a quarter of the window or more, the truth names them and the way out. */
function pinsNote(session: Session, window: number): string {
  const pinned = Pins.of(session).tokens()
  return pinned * 4 >= window ? `; pinned messages hold ${pinned} tokens, which are never summarised: unpin some `
    + '(Pins.of(session).unpin(seq), CLI /unpin)' : ''
}

/** A summary framed as a checkpoint text with its ledger (docs/design.md §4, §12). */
function frameCheckpoint(summary: string, ledger?: Ledger): string {
  const framed = `${CHECKPOINT_PREAMBLE}\n<compacted-summary>\n${neutralTags(summary.trim())}\n</compacted-summary>`
  return ledger && ledgerEntries(ledger) > 0 ? `${framed}\n${renderLedger(ledger)}` : framed
}

// ── Facts ledger and fidelity figures (docs/design.md §12) ──
// What summarisers keep worst (paths, commands, error texts, the user's own words) is carried into
// every checkpoint by dsh itself, read from the log with no model, so it survives every compaction.

/** A path in a {@link Ledger}: how many tool calls touched it, and the newest log seq that did. */
export interface LedgerPath { path: string; count: number; seq: number }
/** A command a tool ran: `exitCode` when its result states one; `failed` when the result was an error. */
export interface LedgerCommand { command: string; exitCode?: number; failed: boolean; count: number; seq: number }
/**
 * A tool error's first line, or a user message; `seq` is the newest log seq it came from. `pruned`: a user
 * message cut to head + tail to fit its budget, whose marker names the recall key of the original (`seq:N`).
 */
export interface LedgerText { text: string; count: number; seq: number; pruned?: true }

/**
 * The facts of a compacted region (docs/design.md §12), lists oldest first. Paths and commands are
 * read from tool-call arguments by key (`path`, `file`, `file_path`, `filename`, `paths`, `files`;
 * `command`, `cmd`, `script`), whatever the tool; a tool whose name (or one-word `command`
 * sub-command, as in `str_replace_based_edit_tool`) says edit/patch/replace/insert edits its paths,
 * write/create/save/append writes them, anything else reads them. A call whose result is an error
 * touches no path (its error is listed instead).
 */
export interface Ledger {
  read: LedgerPath[]
  written: LedgerPath[]
  edited: LedgerPath[]
  commands: LedgerCommand[]
  errors: LedgerText[]
  userMessages: LedgerText[]
  /** Seqs of the user messages (oldest first) left out of `userMessages` for their budget: their recall keys. */
  leftOut?: number[]
  /** Entries left out (here and in merged earlier ledgers) to stay within the ledger budget. */
  trimmed: number
}

/** Ledger budget of the facts but user messages: `min(2000, floor(window × 0.05))` tokens (§12). */
const LEDGER_MAX_TOKENS = 2000
/** See {@link LEDGER_MAX_TOKENS}. */
const LEDGER_WINDOW_RATIO = 0.05
/** Longest tool-error line a ledger keeps, in code points (a longer one is cut and marked with `…`). */
const LEDGER_ERROR_LINE_CODE_POINTS = 300

/** The ledger budget in tokens for a context window in tokens ({@link LEDGER_MAX_TOKENS} when unknown). */
function ledgerBudget(contextWindow?: number): number {
  return contextWindow === undefined ? LEDGER_MAX_TOKENS
    : Math.min(LEDGER_MAX_TOKENS, Math.floor(contextWindow * LEDGER_WINDOW_RATIO))
}

/**
 * The window (tokens) the ladder sizes what it keeps by (docs/design.md §5 "Room"): `window × f²`, f = min(1,
 * 2 × room ÷ window), the room being `window` less the envelope as measured (`offset + calibration ×` its
 * heuristic price): `window` while the envelope takes at most half of it; 0 when it fills it (or no window).
 */
function keptWindowTokens(session: Session, window: number, power = 2): number {
  if (!(window > 0)) return 0
  const m = session.measure()
  const roomTokens = window - measuredEnvelopeTokens(m)
  const f = Math.max(0, Math.min(1, (2 * roomTokens) / window))
  return f === 1 ? window : Math.floor(window * f ** power)
}

/**
 * The window (tokens) the user's words are budgeted by (docs/design.md §5 "Room", §12): `window × f`, linear in the
 * room where the rest of what the ladder keeps is quadratic. The user's messages are what a checkpoint must not lose:
 * at f = 0.4 their share is 6% of the window (2.5 × the kept window's 2.4%), still 30% of the room at most.
 */
const userWindowTokens = (session: Session, window: number): number => keptWindowTokens(session, window, 1)
/** Steps of the search for the widest user-message budget a checkpoint can hold (1/256 of the range at most). */
const USER_WINDOW_BISECTIONS = 8

// The user's own words (docs/design.md §12): every user message of a region is in its checkpoint, within
// a share of the window of their own; the session's first message (the task) first, up to a smaller share.
const USER_MESSAGES_WINDOW_RATIO = 0.15
const TASK_WINDOW_RATIO = 0.1
/** The window (tokens) the user-message budgets are shares of when the context window is unknown. */
const USER_MESSAGES_DEFAULT_WINDOW = 100_000
/** A user message is cut to no fewer UTF-16 units than this (head, marker, tail) before older ones are left out. */
const USER_MESSAGE_MIN_UNITS = 200
/** UTF-16 units a ledger line adds to a user message: its `<user-message>` tags and line ends. */
const USER_LINE_UNITS = 32

/** The `recall` call that returns the message logged at `seq` (the key of a cut user message's marker). */
const recallOfSeq = (seq: number) => `${RECALL_TOOL_NAME} {"key":"seq:${seq}"}`

/** What takes the place of a cut user message's middle: the recall key of its original, logged at `seq`. */
const userCutMarker = (seq: number) =>
  `\n\n[... middle of this user message cut; ${recallOfSeq(seq)} returns it whole ...]\n\n`

/** A user message cut to `maxUnits` UTF-16 units, head and tail, with the recall key of `seq` (§3). */
function cutUserMessage(text: string, seq: number, maxUnits: number): string {
  const marker = userCutMarker(seq)
  for (let keep = Math.max(0, maxUnits - marker.length); ;) {
    const head = Math.floor(keep * 0.75)
    const out = markedCut(text, { thresholdChars: keep + MARKER_CODE_POINTS, headChars: head, tailChars: keep - head },
      marker)
    const units = neutralTags(out).length // as the checkpoint shows it
    if (units <= maxUnits || keep === 0) return out
    keep = Math.max(0, keep - (units - maxUnits)) // astral text: more units than code points; tags: 3 more each
  }
}

/** The line naming the recall keys of the user messages left out of a checkpoint (`seqs`, oldest first). */
const leftOutLine = (seqs: readonly number[]) => `(${seqs.length} older user messages left out to fit their budget; `
  + `${RECALL_TOOL_NAME} {"key":"seq:N"} returns one whole: ${seqs.map((seq) => `seq:${seq}`).join(' ')})`

/** The user messages of a region within `budgetTokens` (docs/design.md §12); those left out keep their recall keys
 *  (`leftOut`, with those of earlier checkpoints) while the keys fit, and are counted (`left`) beyond. */
function fitUserMessages(entries: readonly LedgerText[], budgetTokens: number, taskTokens: number, taskSeq?: number,
  leftBefore: readonly number[] = []): { kept: LedgerText[]; leftOut: number[]; left: number } {
  const shown = (e: LedgerText) => neutralTags(e.text).length // UTF-16 units, as the checkpoint shows it
  const cut = (e: LedgerText, units: number): LedgerText =>
    (shown(e) <= units ? e : { ...e, text: cutUserMessage(e.text, e.seq, units), pruned: true })
  let room = budgetTokens * UNITS_PER_TOKEN
  const kept: LedgerText[] = []
  const task = entries.find((e) => e.seq === taskSeq)
  if (task) {
    kept.push(cut(task, Math.min(room, taskTokens * UNITS_PER_TOKEN) - USER_LINE_UNITS))
    room -= shown(kept[0]) + USER_LINE_UNITS
  }
  const others = entries.filter((e) => e !== task).sort((a, b) => a.seq - b.seq)
  const least = (e: LedgerText) => Math.min(shown(e), USER_MESSAGE_MIN_UNITS) + USER_LINE_UNITS
  // The oldest go first, to their keys; the keys take at most half the room (the oldest of them go first).
  const leftOut = [...leftBefore], keyUnits = (seq: number) => String(seq).length + 5
  const line = () => (leftOut.length > 0 ? leftOutLine([]).length : 0)
  let left = 0, keys = leftOut.reduce((u, seq) => u + keyUnits(seq), 0), need = others.reduce((u, e) => u + least(e), 0)
  while (need + keys + line() > room && (others.length > 0 || leftOut.length > 0)) {
    if (leftOut.length > 0 && (others.length === 0 || (keys + line()) * 2 > room)) {
      keys -= keyUnits(leftOut.shift()!)
      left++
      continue
    }
    const e = others.shift()!
    need -= least(e)
    keys += keyUnits(e.seq)
    leftOut.push(e.seq)
  }
  room -= leftOut.length > 0 ? leftOutLine(leftOut).length : 0
  // The most units each message may keep so that all fit: shorter ones whole, the rest cut to it.
  let cap = Infinity, rest = room - others.length * USER_LINE_UNITS
  const lengths = others.map(shown).sort((a, b) => a - b)
  for (let i = 0; i < lengths.length; rest -= lengths[i++]) {
    if (lengths[i] * (lengths.length - i) > rest) { cap = Math.floor(rest / (lengths.length - i)); break }
  }
  for (const e of others) kept.push(cut(e, cap))
  return { kept, leftOut, left }
}

const emptyLedger = (): Ledger => ({ read: [], written: [], edited: [], commands: [], errors: [], userMessages: [],
  trimmed: 0 })
const ledgerEntries = (l: Ledger) => l.read.length + l.written.length + l.edited.length + l.commands.length
  + l.errors.length + l.userMessages.length

const PATH_KEY = /^(path|file|file_?path|file_?name|target_?file|notebook_?path)$/i
const PATHS_KEY = /^(paths|files)$/i
const COMMAND_KEY = /^(command|cmd|script)$/i
const EDIT_WORD = /edit|patch|replace|insert|modify/i
const WRITE_WORD = /write|create|save|append/i
const EXIT_CODE =
  /\bexit(?:ed with)?(?:[ _]?(?:code|status))?[:= ]\s*(-?\d+)\b|<returncode>\s*(-?\d+)\s*<\/returncode>/i
const ERROR_WORD = /error|fail|fatal|exception|denied|not found|no such|cannot|can't|invalid|refused|panic|traceback/i

const messageText = (m: Message): string => contentText(m.content, '\n')

/** What one tool call says about files and commands, read from its arguments (see {@link Ledger}). */
function callFacts(call: ToolCallBlock): { kind: 'read' | 'written' | 'edited'; paths: string[]; command?: string } {
  let args: unknown
  try { args = JSON.parse(call.arguments) } catch { args = undefined }
  const paths: string[] = []
  let command: string | undefined
  if (typeof args === 'object' && args !== null && !Array.isArray(args)) {
    for (const [key, value] of Object.entries(args)) {
      if (PATH_KEY.test(key) && typeof value === 'string' && value !== '') paths.push(value)
      else if (PATHS_KEY.test(key) && Array.isArray(value)) for (const v of value) { if (typeof v === 'string'
        && v !== '') paths.push(v) }
      else if (COMMAND_KEY.test(key)) {
        const text = typeof value === 'string' ? value
          : Array.isArray(value) && value.every((v) => typeof v === 'string') ? value.join(' ') : undefined
        if (text && text.trim() !== '') command = text
      }
    }
  }
  // A one-word `command` beside a path is a sub-command of a file tool (view, create, str_replace), not a shell
  // command.
  const sub = command !== undefined && paths.length > 0 && /^\w+$/.test(command) ? command : undefined
  if (sub !== undefined) command = undefined
  const verb = sub ?? call.name
  return { kind: EDIT_WORD.test(verb) ? 'edited' : WRITE_WORD.test(verb) ? 'written' : 'read', paths, command }
}

/** The first line of an error text that reads as an error and is not an echoed command (else the first non-empty
 *  line), cut to {@link LEDGER_ERROR_LINE_CODE_POINTS}. */
function errorLine(text: string): string | undefined {
  const lines = text.split(/\r\n|\r|\n/).map((l) => l.trim()).filter((l) => l !== '')
  // An echoed command (`> node -e …` from npm, `$ cmd`, `+ cmd` from sh -x) quotes the error it prints: skip it.
  const line = lines.find((l) => ERROR_WORD.test(l) && !/^(> |\$ |\+ )/.test(l)) ?? lines[0]
  if (line === undefined) return undefined
  const end = indexAfterCodePoints(line, LEDGER_ERROR_LINE_CODE_POINTS)
  return end < line.length ? line.slice(0, end) + '…' : line
}

/** The original of surface node `seq`: follows single-node replaces (prune, clear, cut) back through the log. */
async function originalEvent(session: Session, seq: number): Promise<{ seq: number; message: Message }> {
  let event = await session.readEvent(seq)
  for (;;) {
    const op = (event.data as any).surfaceOp as SurfaceOp
    if (op?.op !== 'replace' || op.start !== op.end || (event.data as any).compactionId !== undefined) break
    const before = await session.readEvent(op.start)
    if (before.type !== event.type) break
    event = before
  }
  return { seq: event.seq, message: (event.data as any).message as Message }
}

/** The ledger logged with the checkpoint at `seq`, its cut user messages read back whole. */
async function checkpointLedger(session: Session, seq: number): Promise<Ledger | undefined> {
  const id = ((await session.readEvent(seq)).data as any).compactionId
  if (id === undefined || seq === 0) return undefined
  const summary = await session.readEvent(seq - 1)
  const d = summary.data as { id?: string; ledger?: Ledger }
  const ledger = summary.type === 'compaction/summary' && d.id === id ? d.ledger : undefined
  if (!ledger?.userMessages?.some((e) => e.pruned)) return ledger
  const whole = async (e: LedgerText) => {
    const message = (await session.readEvent(e.seq)).data.message as Message
    return { text: messageText(message), count: e.count, seq: e.seq }
  }
  return { ...ledger, userMessages: await Promise.all(ledger.userMessages.map((e) => (e.pruned ? whole(e) : e))) }
}

/** Adds `entry` to `list`, or its count to the entry there that is the `same`, keeping the newest seq. */
function addEntry<E extends { count: number; seq: number }>(list: E[], entry: E, same: (e: E) => boolean): void {
  const found = list.find(same)
  if (!found) return void list.push(entry)
  found.count += entry.count
  found.seq = Math.max(found.seq, entry.seq)
}
const addPath = (list: LedgerPath[], path: string, seq: number, count = 1) =>
  addEntry(list, { path, count, seq }, (e) => e.path === path)
const addText = (list: LedgerText[], text: string, seq: number, count = 1) =>
  addEntry(list, { text, count, seq }, (e) => e.text === text)
const addCommand = (list: LedgerCommand[], c: Omit<LedgerCommand, 'count'> & { count?: number }) =>
  addEntry(list, { command: c.command, exitCode: c.exitCode, failed: c.failed, count: c.count ?? 1, seq: c.seq },
    (e) => e.command === c.command && e.exitCode === c.exitCode && e.failed === c.failed)

/** Merges `from` (an earlier ledger) into `into`: entries deduplicated, counts added. */
function mergeLedger(into: Ledger, from: Ledger): void {
  for (const k of ['read', 'written', 'edited'] as const) for (const e of from[k] ?? []) addPath(into[k], e.path,
    e.seq, e.count)
  for (const e of from.commands ?? []) addCommand(into.commands, e)
  for (const e of from.errors ?? []) addText(into.errors, e.text, e.seq, e.count)
  for (const e of from.userMessages ?? []) addText(into.userMessages, e.text, e.seq, e.count)
  if (from.leftOut?.length) into.leftOut = [...(into.leftOut ?? []), ...from.leftOut]
  into.trimmed += from.trimmed ?? 0
}

/** The full ledger of a region, earlier checkpoints' ledgers merged in (docs/design.md §12). */
async function regionLedger(session: Session, nodes: readonly SurfaceNode[]): Promise<Ledger> {
  const ledger = emptyLedger()
  const results = new Map<string, { seq: number; message: ToolResultMessage }>()
  const originals: Array<{ seq: number; message: Message } | Ledger | undefined> = []
  for (const n of nodes) originals.push(isCheckpoint(n) ? await checkpointLedger(session, n.seq)
    : await originalEvent(session, n.seq))
  for (const o of originals) if (o && 'message' in o && o.message.role === 'tool') results.set(o.message.toolCallId,
    o as { seq: number; message: ToolResultMessage })
  for (const o of originals) {
    if (!o) continue
    if (!('message' in o)) { mergeLedger(ledger, o); continue }
    const m = o.message
    if (m.role === 'user') { const text = messageText(m); if (text.trim() !== '') addText(ledger.userMessages,
      text, o.seq) }
    else if (m.role === 'tool') { if (m.isError) { const line = errorLine(messageText(m));
      if (line) addText(ledger.errors, line, o.seq) } }
    else for (const call of toolCalls(m)) {
      const result = results.get(call.id)
      const facts = callFacts(call)
      const failed = result?.message.isError === true
      const seq = result?.seq ?? o.seq
      if (!failed) for (const p of facts.paths) addPath(ledger[facts.kind], p, seq)
      if (facts.command !== undefined) {
        const meta = (result?.message.metadata ?? {}) as Record<string, unknown>
        const stated = typeof meta.exitCode === 'number' ? meta.exitCode : typeof meta.exit_code === 'number'
          ? meta.exit_code : undefined
        const match = stated === undefined && result ? EXIT_CODE.exec(messageText(result.message).slice(0, 500)) : null
        const exitCode = stated ?? (match ? Number(match[1] ?? match[2]) : undefined)
        addCommand(ledger.commands, { command: facts.command, exitCode, failed, seq })
      }
    }
  }
  return ledger
}

const LEDGER_OPEN = '<ledger>\nRecorded by dsh from the session log, verbatim (not summarised):'
const LEDGER_CLOSE = '</ledger>'
const LEDGER_HEADINGS = {
  read: 'files read:', written: 'files written:', edited: 'files edited:', commands: 'commands run:',
  errors: 'tool errors (first line):', userMessages: 'user messages (newest first):',
} as const
type LedgerList = keyof typeof LEDGER_HEADINGS
const LEDGER_ORDER: readonly LedgerList[] = ['read', 'written', 'edited', 'commands', 'errors', 'userMessages']
const trimmedLine =
  (n: number) => `(${n} older ledger entries left out to fit the ledger budget; the session log keeps them)`
const times = (n: number) => (n > 1 ? ` (${n}×)` : '')

/** One entry as the ledger prints it (`- ` lines; user messages between `<user-message>` tags, so multi-line text
 *  stays verbatim). */
function ledgerLine(list: LedgerList, e: LedgerPath | LedgerCommand | LedgerText): string {
  if (list === 'userMessages') return `<user-message>\n${neutralTags((e as LedgerText).text)}\n</user-message>`
  if (list === 'errors') return `- ${neutralTags((e as LedgerText).text)}${times(e.count)}`
  if (list === 'commands') {
    const c = e as LedgerCommand
    return `- ${neutralTags(c.command)} → `
      + `${c.exitCode !== undefined ? `exit ${c.exitCode}` : c.failed ? 'failed' : 'ok'}${times(c.count)}`
  }
  return `- ${neutralTags((e as LedgerPath).path)}${times(e.count)}`
}

/** The `<ledger>` block of a checkpoint: lists oldest first, user messages newest first. */
function renderLedger(ledger: Ledger): string {
  const lines = [LEDGER_OPEN]
  for (const list of LEDGER_ORDER) {
    const entries = [...(ledger[list] as Array<LedgerPath | LedgerText>)].sort((a, b) => (list === 'userMessages'
      ? b.seq - a.seq : a.seq - b.seq))
    if (entries.length === 0) continue
    lines.push(LEDGER_HEADINGS[list])
    for (const e of entries) lines.push(ledgerLine(list, e))
  }
  if (ledger.leftOut?.length) lines.push(leftOutLine(ledger.leftOut))
  if (ledger.trimmed > 0) lines.push(trimmedLine(ledger.trimmed))
  lines.push(LEDGER_CLOSE)
  return lines.join('\n')
}

/** `ledger`'s facts but user messages cut to `budgetTokens` (docs/design.md §12). */
function trimLedger(ledger: Ledger, budgetTokens: number): Ledger {
  const lists = LEDGER_ORDER.filter((l) => l !== 'userMessages')
  const all = lists.flatMap((list) => (ledger[list] as Array<LedgerPath | LedgerText>)
    .map((entry) => ({ list, entry, units: ledgerLine(list, entry).length })))
  const maxUnits = budgetTokens * UNITS_PER_TOKEN
  const fixed = LEDGER_OPEN.length + 1 + LEDGER_CLOSE.length + trimmedLine(all.length + ledger.trimmed).length + 1
  if (estimateTextTokens(renderLedger({ ...ledger, userMessages: [] })) <= budgetTokens) return ledger
  const out: Ledger = { ...emptyLedger(), userMessages: ledger.userMessages }
  let units = fixed
  // Newest first, but an entry over a tenth of the budget (a long script) after the others: one must not crowd out ten.
  const large = (e: { units: number }) => Number(e.units * 10 > maxUnits)
  for (const { list, entry, units: line } of all.sort((a, b) => large(a) - large(b) || b.entry.seq - a.entry.seq)) {
    const cost = line + 1 + (out[list].length === 0 ? LEDGER_HEADINGS[list].length + 1 : 0)
    if (units + cost > maxUnits) { out.trimmed++; continue }
    units += cost
    ;(out[list] as Array<typeof entry>).push(entry)
  }
  for (const list of lists) (out[list] as Array<{ seq: number }>).sort((a, b) => a.seq - b.seq)
  out.trimmed += ledger.trimmed
  return out
}

/** The ledger a checkpoint carries, within its budgets (docs/design.md §12). */
function checkpointFacts(full: Ledger, contextWindow: number | undefined, rate: number, regionTokens: number,
  taskSeq?: number, userWindow = contextWindow): Ledger {
  const ledger = trimLedger(full, Math.floor(ledgerBudget(contextWindow) / rate))
  const window = userWindow ?? USER_MESSAGES_DEFAULT_WINDOW
  const share = (ratio: number) => Math.min(Math.floor((window * ratio) / rate), Math.floor(regionTokens / 2))
  const users = fitUserMessages(full.userMessages, share(USER_MESSAGES_WINDOW_RATIO), share(TASK_WINDOW_RATIO), taskSeq,
    full.leftOut)
  const out: Ledger = { ...ledger, userMessages: users.kept, leftOut: users.leftOut,
    trimmed: ledger.trimmed + users.left }
  if (users.leftOut.length === 0) delete out.leftOut
  return out
}

/**
 * How many of a region's facts of one kind appear verbatim in the checkpoint, and in the model's summary
 * alone. `pruned` (user messages): of `inCheckpoint`, those kept as head + tail with the original's recall key.
 */
export interface FidelityShare { total: number; inCheckpoint: number; inSummary: number; pruned?: number }
/**
 * Fidelity figures of one compaction (docs/design.md §12): of the region's paths, commands, tool
 * error first lines and user messages (its full ledger, before the budget), how many appear verbatim
 * in the framed checkpoint (summary + ledger), and in the model's summary alone; a user message cut to
 * head + tail with its recall key counts as in the checkpoint, and is counted in `pruned`.
 */
export interface Fidelity { paths: FidelityShare; commands: FidelityShare; errors: FidelityShare;
  userMessages: FidelityShare }

/** Measures {@link Fidelity}: `ledger` is the region's full ledger, `checkpoint` the framed text, `summary` the
 *  model's text. */
function measureFidelity(ledger: Ledger, checkpoint: string, summary: string): Fidelity {
  const share = (items: readonly string[]): FidelityShare => {
    const unique = [...new Set(items)]
    return { total: unique.length, inCheckpoint: unique.filter((t) => checkpoint.includes(neutralTags(t))).length,
      inSummary: unique.filter((t) => summary.includes(t)).length }
  }
  // A user message cut to head + tail counts as kept when its marker's recall key is in the ledger (a key that the
  // summary writes does not keep the message).
  const ledgerPart = checkpoint.slice(checkpoint.lastIndexOf('</compacted-summary>'))
  const users = (entries: readonly LedgerText[]): FidelityShare => {
    const s = share(entries.map((e) => e.text))
    const pruned = entries.filter((e) => !checkpoint.includes(neutralTags(e.text))
      && ledgerPart.includes(recallOfSeq(e.seq))).length
    return { ...s, inCheckpoint: s.inCheckpoint + pruned, pruned }
  }
  return {
    paths: share([...ledger.read, ...ledger.written, ...ledger.edited].map((e) => e.path)),
    commands: share(ledger.commands.map((e) => e.command)),
    errors: share(ledger.errors.map((e) => e.text)),
    userMessages: users(ledger.userMessages),
  }
}

/**
 * What the ladder works on (docs/design.md §14): the session, the summarizer, the envelope of the next
 * request and the ladder's settings, all data. The ladder calls no method of its owner: hooks and warnings
 * go to the caller's own functions in `settings`.
 */
export interface CompactionHost {
  readonly session: Session
  /** The model that writes summaries. */
  readonly summarizer: Provider
  /** The envelope of the next request. A changed envelope is a new object (the ladder keeps its price per object). */
  readonly envelope: Envelope
  readonly settings: LadderSettings
}

/** The ladder's settings (an {@link Agent} derives them from its options and tools). */
export interface LadderSettings {
  /** Context window of the conversation model, tokens; undefined when unknown. */
  readonly contextWindow?: number
  /** A resolved configuration (defaults filled in). */
  readonly compaction: LadderConfig
  readonly prune: PruneConfig
  /** Replaces the default summary instruction (a non-empty string). */
  readonly summaryInstruction?: string
  /** The conversation model's name, for messages (default: the summarizer's). */
  readonly modelName?: string
  /** Tools whose results the clear rung never replaces (`clearable: false`). */
  readonly unclearable?: ReadonlySet<string>
  /** The `compaction/before` and `compaction/after` hooks by name, and the `agent` their context names. */
  readonly hooks?: { readonly agent: Agent; readonly byName: ReadonlyMap<HookName, readonly Hook[]> }
  /** Gets the ladder's warnings as `{type: 'warning'}` events, like {@link AgentOptions.onEvent}. */
  readonly onEvent?: (event: AgentEvent) => void
}

/** Reports a ladder warning to the host's `onEvent`. */
function warn(host: CompactionHost, message: string): void { host.settings.onEvent?.({ type: 'warning', message }) }

/** Runs the host's compaction hooks of `name` (docs/design.md §12), if it has any. */
async function compactionHooks(host: CompactionHost, name: 'compaction/before' | 'compaction/after',
  extra: Partial<HookContext>, signal?: AbortSignal): Promise<HookResult> {
  const hooks = host.settings.hooks
  if (!hooks) return {}
  const t = host.session.turn
  const ctx = { agent: hooks.agent, turn: t.turn, step: t.step, signal: signal ?? new AbortController().signal }
  return collectHooks(hooks.byName, name, { ...ctx, ...extra })
}

/** A summary transaction about to start: its id, trigger, focus so far and region (seqs, tokens). */
export interface CompactionInfo { id: string; trigger: string; focus?: string; shadowedSeqs: number[];
  regionTokens: number }
/** What a `compaction/before` hook may answer: a focus to add, or `cancel` (true or a reason). */
export interface CompactionVerdict { focus?: string; cancel?: boolean | string }
/** A committed checkpoint: the seq of its `user/message`, its framed text and price (tokens), the model's summary,
 *  ledger and fidelity. */
export interface CheckpointInfo { seq: number; text: string; tokens: number; summary: string; ledger: Ledger;
  fidelity: Fidelity }

/** The result of one ladder run. Token figures are measured totals, in tokens. */
export interface CompactionOutcome {
  trigger: 'pressure' | 'context-overflow' | 'manual'
  /** The last rung that changed the surface (`pruned`, `cleared`, `compacted`), or why nothing did. */
  action: 'none' | 'skipped' | 'pruned' | 'cleared' | 'compacted' | 'failed'
  tokensBefore: number
  tokensAfter: number
  /** Tokens reclaimed by pruning (no model call). */
  prunedTokens: number
  /** Tokens reclaimed by the clear rung (no model call). */
  clearedTokens: number
  summaryRequests: number
  generationBefore: number
  generationAfter: number
  reason?: string
}

/** Seqs of the tool results logged after the newest assistant message (not yet seen by the model). */
function unseenResults(session: Session): Set<number> {
  const nodes = session.surface()
  const unseen = new Set<number>()
  for (let i = nodes.length - 1; i >= 0 && nodes[i].message.role !== 'assistant';
    i--) if (nodes[i].message.role === 'tool') unseen.add(nodes[i].seq)
  return unseen
}

/** Smallest heuristic price of a message holding more than `thresholdChars` code points (≥ that many UTF-16 units).
 *  */
const minPrunableTokens = (config: PruneConfig) => Math.ceil(config.thresholdChars / UNITS_PER_TOKEN)

// ── 6.1 The rungs as planning (docs/design.md §14) ───────────────────
// A rung is a function from the ladder's view of the session to the edits it would log; the
// ladder's `apply` is the one place that logs them, through the session (the one writer).

/** One edit a rung would log: prune the message at `seq`, or clear the tool result at `seq` to `placeholder`. */
type LadderOp = { op: 'prune'; seq: number } | { op: 'clear'; seq: number; placeholder: string }

/** A rung's edits, applied in order; skipped below `onlyIfAtLeast`, stopped at `stopAtOrBelow` tokens. */
interface LadderBatch { ops: LadderOp[]; onlyIfAtLeast?: number; stopAtOrBelow?: number }

/** What a rung reads: the session, the configuration, the window and the size of the next request. */
interface LadderView {
  readonly session: Session
  readonly prune: PruneConfig
  readonly compaction: LadderConfig
  /** Context window, tokens; undefined when unknown. */
  readonly window?: number
  /** The threshold of this ladder run, tokens. */
  readonly threshold: number
  /** Under overflow the newest step's results are pruned with the rest, unconditionally. */
  readonly includeNewest: boolean
  /** How large the task may be and stay whole on the surface, heuristic tokens (docs/design.md §12). */
  readonly taskTokens: number
  /** Whether results of the tool `name` may be cleared. */
  clearable(name: string): boolean
  /** The size of the next request, tokens (the envelope it will carry included). */
  nextRequestTokens(): number
  /** How a summary of `region` would read the conversation's cache (docs/design.md §5, §11). */
  summaryCacheRead(region: Region): SummaryCacheRead
}

/** A rung: the batches of edits it would log for the view as it is now. */
type Rung = (view: LadderView) => LadderBatch[]

/** Prunes tool results over the threshold (docs/design.md §3 recency rule). */
const pruneResultsRung: Rung = (v) => {
  const { session } = v
  const unseen = unseenResults(session)
  const seqs = session.surface().filter((n) => n.message.role === 'tool' && n.tokens >= minPrunableTokens(v.prune)
    && !Pins.of(session).has(n.seq)).map((n) => n.seq)
  const prune = (seq: number): LadderOp => ({ op: 'prune', seq })
  return [
    { ops: seqs.filter((seq) => !unseen.has(seq)).map(prune) },
    { ops: seqs.filter((seq) => unseen.has(seq)).map(prune), onlyIfAtLeast: v.includeNewest ? undefined : v.threshold },
  ]
}

/** Prunes oversized non-tool messages (docs/design.md §10, §12). */
const pruneMessagesRung: Rung = (v) => {
  const { session } = v
  const input = stateOf(session).input
  // The surface head is the session's first message until a checkpoint replaces it (regions start at the head).
  const head = session.surface()[0]
  const task = head?.message.role === 'user' && !isCheckpoint(head) && head.tokens <= v.taskTokens ? head.seq : input
  // A user message after the newest assistant message is one the model has not read (a steering message): as the
  // current input, never cut (docs/design.md §3).
  const nodes = session.surface()
  let read = nodes.length
  while (read > 0 && nodes[read - 1].message.role !== 'assistant') read--
  const seqs = nodes.filter((n, i) => n.message.role !== 'tool' && n.seq !== input && n.seq !== task
    && !(i >= read && n.message.role === 'user') && !isCheckpoint(n) && !Pins.of(session).has(n.seq)
    && n.tokens >= minPrunableTokens(v.prune)).map((n) => n.seq)
  return [{ ops: seqs.map((seq): LadderOp => ({ op: 'prune', seq })) }]
}

/** The clear rung (docs/design.md §10): old tool results to placeholders, down to the relief target. */
const clearRung: Rung = (v) => {
  const cfg = v.compaction
  if (!cfg.clear || v.window === undefined) return []
  // The protected budget is measured tokens of the window; node prices are heuristic tokens.
  const rate = v.session.measure().calibration
  const ops = clearCandidates(v.session, Math.floor((v.window * PROTECTED_RATIO) / rate), v.clearable)
  return [{ ops, stopAtOrBelow: Math.floor(v.window * reliefRatio(cfg)) }]
}

/** The fixed start of every cleared tool result's placeholder (docs/design.md §10). */
const CLEARED_RESULT_PREFIX = '[dsh cleared this tool result to save context]'
/** Tool-call arguments in a placeholder are cut to this many code points. */
const PLACEHOLDER_ARGUMENT_CODE_POINTS = 200

/** Text cut to `max` code points (never inside a surrogate pair), with `…` when cut. */
function headCodePoints(text: string, max: number): string {
  const end = indexAfterCodePoints(text, max)
  return end >= text.length ? text : text.slice(0, end) + '…'
}

/** The one-line placeholder of a cleared tool result, with the `recall` call that returns it. */
function clearedPlaceholder(toolName: string, args: string, originalTokens: number, key: string): string {
  const shown = headCodePoints(args.replace(/\s+/g, ' ').trim(), PLACEHOLDER_ARGUMENT_CODE_POINTS)
  return `${CLEARED_RESULT_PREFIX} ${toolName} ${shown || '{}'} → ${originalTokens} tokens; ${RECALL_TOOL_NAME} `
    + `{"key":${JSON.stringify(key)}} returns it.`
}

const isCleared = (m: Message) => m.role === 'tool' && m.content.length === 1 && m.content[0].type === 'text'
  && (m.content[0] as TextBlock).text.startsWith(CLEARED_RESULT_PREFIX)

/** The clear rung's candidates as its ops, oldest first (docs/design.md §10): each saves tokens (§2). */
function clearCandidates(session: Session, protectedTokens: number, clearable: (name: string) => boolean): LadderOp[] {
  const nodes = session.surface()
  const keep = unseenResults(session)
  let kept = 0
  for (let i = nodes.length - 1; i >= 0 && kept < protectedTokens;
    i--) if (nodes[i].message.role === 'tool') { keep.add(nodes[i].seq); kept += nodes[i].tokens }
  const out: LadderOp[] = []
  for (const n of nodes) {
    const m = n.message
    if (m.role !== 'tool' || keep.has(n.seq) || isCleared(m) || Pins.of(session).has(n.seq)) continue
    const call = surfaceToolCall(session, m.toolCallId)
    const name = call?.name ?? 'tool'
    if (!clearable(name)) continue
    const placeholder = clearedPlaceholder(name, call?.arguments ?? '', RecallIndex.of(session).originalTokens(n.seq),
      m.toolCallId)
    const savedTokens = n.tokens - estimateMessageTokens({ ...m, content: [{ type: 'text', text: placeholder }] })
    if (savedTokens > 0) out.push({ op: 'clear', seq: n.seq, placeholder })
  }
  return out
}

/** A contiguous run of surface nodes chosen for summary: indices `[start, end)` of the surface. */
export interface Region { start: number; end: number; tokens: number }

/** The region to summarise (docs/design.md §5 "Region selection", §12); undefined when none is safe. */
function selectRegion(nodes: readonly SurfaceNode[], retainedTokens: number, keep?: number | Iterable<number>,
  minTokens = 0): Region | undefined {
  let cut = nodes.length
  let kept = 0
  while (cut > 0 && kept < retainedTokens) kept += nodes[--cut].tokens
  const keepSet = new Set(typeof keep === 'number' ? [keep] : keep ?? [])
  const runs: Region[] = []
  for (let i = 0, start = 0; i <= cut; i++) {
    if (i < cut && !keepSet.has(nodes[i].seq)) continue
    const run = i > start ? balancedRegion(nodes, start, i) : undefined
    if (run) runs.push(run)
    start = i + 1
  }
  const fresh = (r: Region) => nodes.slice(r.start, r.end).reduce((t, n) => t + (isCheckpoint(n) ? 0 : n.tokens), 0)
  return runs.find((r) => fresh(r) >= minTokens) ?? runs.at(-1)
}

/** A user who pastes a checkpoint's text writes a user message, not a checkpoint. */
const isCheckpoint = (n: SurfaceNode) => n.checkpoint === true

/** `[start, cut)` shrunk until tool-balanced by id; undefined when only a checkpoint or nothing is left. */
function balancedRegion(nodes: readonly SurfaceNode[], start: number, cut: number): Region | undefined {
  const callAt = new Map<string, number>()
  const resultAt = new Map<string, number>()
  nodes.forEach((n, i) => {
    for (const c of toolCalls(n.message)) callAt.set(c.id, i)
    if (n.message.role === 'tool') resultAt.set(n.message.toolCallId, i)
  })
  for (let changed = true; changed && start < cut;) {
    changed = false
    for (let i = start; i < cut && !changed; i++) {
      const m = nodes[i].message
      if (m.role === 'tool') {
        if ((callAt.get(m.toolCallId) ?? -1) < start) { start = i + 1; changed = true }
      } else if (toolCalls(m).some((c) => (resultAt.get(c.id) ?? Infinity) >= cut)) {
        cut = i
        changed = true
      }
    }
  }
  if (start >= cut || (cut - start === 1 && isCheckpoint(nodes[start]))) return undefined
  let tokens = 0
  for (let i = start; i < cut; i++) tokens += nodes[i].tokens
  return { start, end: cut, tokens }
}

/** Seqs region selection keeps out of every summary: the session's pins and the current input (steering too). */
function keptOutOfSummary(session: Session): number[] {
  const seqs = Pins.of(session).seqs()
  const input = stateOf(session).input
  if (input !== undefined) seqs.push(input)
  // A user message after the newest assistant message (steering) is input the model has not read yet.
  const nodes = session.surface()
  for (let i = nodes.length - 1; i >= 0 && nodes[i].message.role !== 'assistant'; i--)
    if (nodes[i].message.role === 'user' && !isCheckpoint(nodes[i])) seqs.push(nodes[i].seq)
  return seqs
}

/** Thrown inside a compaction transaction; logged as `compaction/end {error}`. */
class CompactionError extends Error {
  constructor(message: string) { super(message); this.name = 'CompactionError' }
}

/** Groups messages so that an assistant message with calls stays with its results. */
function balancedGroups(messages: readonly Message[]): Message[][] {
  const groups: Message[][] = []
  let open = new Set<string>()
  for (const m of messages) {
    if (open.size === 0) groups.push([])
    groups[groups.length - 1].push(m)
    for (const c of toolCalls(m)) open.add(c.id)
    if (m.role === 'tool') open.delete(m.toolCallId)
  }
  return groups
}

const SHRINK_MARKER = '\n[... cut for the summary request ...]\n'

/** Keeps head (70%) and tail of `text` within `maxUnits` UTF-16 units, never splitting a surrogate pair. */
function cutToUnits(text: string, maxUnits: number): string {
  if (text.length <= maxUnits) return text
  if (maxUnits <= SHRINK_MARKER.length) {
    // No room for the marker: the head alone (the marker would make a short text longer).
    let end = Math.max(0, maxUnits)
    if (end > 0 && isHigh(text.charCodeAt(end - 1))) end--
    return text.slice(0, end)
  }
  const spareUnits = Math.max(0, maxUnits - SHRINK_MARKER.length)
  let head = Math.floor(spareUnits * 0.7), tail = text.length - (spareUnits - head)
  if (head > 0 && isHigh(text.charCodeAt(head - 1))) head--
  if (tail < text.length && isLow(text.charCodeAt(tail))) tail++
  return text.slice(0, head) + SHRINK_MARKER + text.slice(tail)
}

/** A message cut to at most `tokens` for a summary request only, in proportion (the log is untouched). */
function shrinkMessage(m: Message, tokens: number): Message {
  const blocks: Block[] = typeof m.content === 'string' ? [{ type: 'text', text: m.content }] : m.content
  let units = 0
  for (const b of blocks) units += b.type === 'tool-call' ? (b as ToolCallBlock).arguments.length
    + (b as ToolCallBlock).name.length : b.type === 'text' || b.type === 'reasoning' ? (b as TextBlock).text.length : 0
  const placeholders = blocks.filter((b) => b.type !== 'text' && b.type !== 'reasoning'
    && b.type !== 'tool-call').length * 8
  const keepUnits = Math.max(0, (tokens - MESSAGE_OVERHEAD_TOKENS - placeholders) * UNITS_PER_TOKEN)
  const ratio = units > 0 ? Math.min(1, keepUnits / units) : 1
  const out = blocks.map((b): Block => {
    if (b.type === 'text' || b.type === 'reasoning')
      return { ...b, text: cutToUnits((b as TextBlock).text,
        Math.floor((b as TextBlock).text.length * ratio)) } as Block
    if (b.type === 'tool-call') {
      const c = b as ToolCallBlock
      const max = Math.floor(c.arguments.length * ratio)
      if (c.arguments.length <= max) return c
      const cut = JSON.stringify({ cut: cutToUnits(c.arguments, Math.max(0, max - 12)) })
      return cut.length < c.arguments.length ? { ...c, arguments: cut } : c // never longer than the original
    }
    return { type: 'text', text: `[${b.type} omitted]` }
  })
  return (typeof m.content === 'string' ? { ...m, content: (out[0] as TextBlock).text }
    : { ...m, content: out }) as Message
}

/** How many fingerprints of refused summary requests (overflowed, or counted over the window) a session remembers
 * (in memory, not logged: after a resume such a request may be tried once more). */
const FAILED_SUMMARY_MEMORY = 32
const failedSummaries = new WeakMap<Session, Set<number>>()
/** Fingerprints of the session's summary requests that overflowed or were counted over the window, oldest first. */
function overflowedSummaryRequests(session: Session): Set<number> {
  let set = failedSummaries.get(session)
  if (!set) failedSummaries.set(session, set = new Set())
  return set
}
/** A 53-bit FNV-1a-style hash of `text` (a summary request's fingerprint: its wire content can be large). */
function fingerprintOf(text: string): number {
  let h1 = 0x811c9dc5, h2 = 0x01000193
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i)
    h1 = Math.imul(h1 ^ c, 0x01000193)
    h2 = Math.imul(h2 ^ c, 0x5bd1e995)
  }
  return (h2 >>> 0) * 0x200000 + ((h1 >>> 0) & 0x1fffff)
}

/** Re-plans of one summary job after the summary request itself overflowed (docs/design.md §10). */
const MAX_SUMMARY_REPLANS = 3
/** Share of the room a re-plan aims at when the error carried counts (the counts are of one request). */
const REPLAN_MARGIN = 0.95
/** Without counts, a re-planned request is at most this share of the one that failed (by the §2 estimate). */
const REPLAN_SHRINK = 0.7
/** Over this share of the window, a summary request leaves the tool specs out (docs/design.md §10). */
const SUMMARY_TOOLS_MAX_RATIO = 0.1

/** The completion budget of a summary request (docs/design.md §10), scaled by `keptShare` (§5 "Room"). */
function summaryMaxTokens(regionTokens: number, config: Pick<LadderConfig, 'summaryMaxTokens'>,
  roomTokens = Infinity, keptShare = 1): number {
  const budget = Math.min(config.summaryMaxTokens, Math.max(512, Math.floor(regionTokens / 2)))
  return Math.max(1, Math.min(Math.floor(budget * keptShare), roomTokens))
}

/** The share of its window the ladder sizes what a session keeps by: {@link keptWindowTokens} ÷ the window. */
function keptShare(session: Session, window: number | undefined): number {
  return window === undefined || window <= 0 ? 1 : keptWindowTokens(session, window) / window
}

/** The instruction that ends a summary request, with a paragraph for the focus when given. */
function summaryInstructionText(instruction = SUMMARY_INSTRUCTION, focus?: string): string {
  return focus === undefined || focus.trim() === '' ? instruction
    : `${instruction}\n\nFocus of this checkpoint, as asked for: ${focus.trim()}\nGive it the most detail; `
      + `keep everything else that still matters.`
}

/**
 * Summarises `messages` in chunks that fit (docs/design.md §5, §10), each answered request added to `records`
 * (for `compaction/end {requests}`, §11); throws {@link CompactionError}.
 */
async function summarise(host: CompactionHost, messages: readonly Message[], signal?: AbortSignal,
  focus?: string, records: SummaryRequestRecord[] = [], lead: readonly Message[] = []):
  Promise<{ summary: string; usage?: Usage; requests: number }> {
  return await new SummaryJob(host, messages, focus, records, lead).run(signal)
}

/** The one surface message before `region` when it is the kept current input at the head (a user message, neither
 *  a checkpoint nor a pin), sent ahead of the summary so that the request reads the conversation's cached prefix
 *  (docs/design.md §5, §11); none otherwise: an earlier turn or checkpoint there would be restated in the new one. */
function summaryLead(session: Session, region: Region): Message[] {
  const head = region.start === 1 ? session.surface()[0] : undefined
  return head && head.message.role === 'user' && !isCheckpoint(head) && !Pins.of(session).has(head.seq)
    ? [head.message] : []
}

/** One run of {@link summarise}: its window, calibration and budget as they are learned, and its progress. */
class SummaryJob {
  private readonly provider: Provider
  private readonly session: Session
  private window: number
  private readonly sameModel: boolean
  private rate: number
  /** Tokens the server counts beyond the priced content (a replayed harness's hidden prompt, docs/design.md §15). */
  private readonly offset: number
  /** The conversation's envelope as the job started (the host's may change as calibration samples arrive). */
  private readonly fullEnvelope: Envelope
  private readonly toolsTokens: number
  private readonly instruction: UserMessage
  private readonly reserve: number
  /** The conversation's kept share of its window (docs/design.md §5 "Room"): scales the completion budget. */
  private readonly keptShare: number
  /** What a request's input may cost by the §2 estimate (heuristic tokens); the output is reserved already. */
  private inputBudget: number
  private summary = ''
  /** Summary requests sent (answered or not). */
  requests = 0
  private readonly usage: Usage = { promptTokens: 0, completionTokens: 0 }
  private readonly groups: Message[][]
  /** This session's summary requests that overflowed: a later re-plan can arrive at one of them again. */
  private readonly failed: Set<number>

  constructor(private readonly host: CompactionHost, messages: readonly Message[], focus: string | undefined,
    private readonly records: SummaryRequestRecord[], private readonly lead: readonly Message[]) {
    this.provider = host.summarizer
    this.session = host.session
    const m = this.session.measure()
    this.window = this.provider.contextWindow ?? host.settings.contextWindow ?? Infinity
    this.sameModel = this.provider.model === (m.header?.model ?? this.provider.model)
    this.rate = this.sameModel ? m.calibration : 1
    this.offset = this.sameModel ? m.calibrationOffsetTokens : 0
    this.fullEnvelope = host.envelope
    const tools = this.fullEnvelope.tools
    this.toolsTokens = tools?.length ? estimateEnvelopeTokens({ tools }) : 0
    this.instruction = { role: 'user', content: summaryInstructionText(host.settings.summaryInstruction, focus) }
    this.keptShare = keptShare(this.session, host.settings.contextWindow)
    this.reserve = Math.floor(Math.min(host.settings.compaction.summaryMaxTokens, this.window * 0.1) * this.keptShare)
    this.inputBudget = Math.floor((this.window - this.reserve - this.offset) / this.rate)
    this.failed = overflowedSummaryRequests(this.session)
    this.groups = balancedGroups(messages)
  }

  /** The next request's envelope: the conversation's, without its tool specs once they crowd the window. */
  private envelope(): Envelope {
    const full = this.fullEnvelope
    const crowded = this.toolsTokens > 0 && this.toolsTokens * this.rate > this.window * SUMMARY_TOOLS_MAX_RATIO
    return crowded ? { system: full.system } : full
  }
  private fixed(): number { return estimateEnvelopeTokens(this.envelope()) + estimateMessageTokens(this.instruction) }
  /** What this request sends of the lead: all with the first chunk while within a quarter of the room, else none;
   *  none to a summarizer of another model, nor without the tool specs (neither reads the cached prefix). */
  leadSent(): readonly Message[] {
    return this.summary || !this.readsCache() || estimateRequestTokens({}, this.lead) * 4 > this.inputBudget
      - this.fixed() ? [] : this.lead
  }
  /** Whether this job's requests can read the conversation's cached prefix: the same model, the tool specs kept. */
  readsCache(): boolean {
    return this.sameModel && this.envelope() === this.fullEnvelope
  }
  private prior(s: string): UserMessage {
    return { role: 'user', content: `Checkpoint of the earlier part:\n<compacted-summary>\n${s}\n</compacted-summary>` }
  }
  /** The room left for a chunk: the budget minus the envelope, instruction and running summary (or lead). */
  private budget(): number {
    return this.inputBudget - this.fixed() - estimateRequestTokens({}, this.summary ? [this.prior(this.summary)]
      : this.leadSent())
  }
  private sample(providerTokens: number, heuristicTokens: number): void {
    if (this.sameModel) this.session.append('ladder/state', { sample: { providerTokens, heuristicTokens,
      envelopeTokens: estimateEnvelopeTokens(this.envelope()), source: 'summary' } })
  }
  private windowNote(): string {
    return `the summarizer's window (${this.window} `
      + `tokens${this.rate === 1 ? '' : `, × ${this.rate.toFixed(2)} calibration`})`
  }

  /** Sends requests chunk by chunk, each merged into the running summary, re-planning after an overflow. */
  async run(signal?: AbortSignal): Promise<{ summary: string; usage?: Usage; requests: number }> {
    for (let next = 0, replans = 0; ;) {
      const { chunk, to } = this.plan(next)
      const answer = await this.request(chunk, signal, replans)
      if (answer === undefined) { replans++; continue }
      this.summary = answer
      next = to
      if (next >= this.groups.length) break
    }
    return { summary: this.summary, usage: this.usage, requests: this.requests }
  }

  /** The next chunk from `groups[from]` within the budget; oversized groups are shortened for this request only. */
  private plan(from: number): { chunk: Message[]; to: number } {
    const chunk: Message[] = []
    let chunkTokens = 0
    let i = from
    for (; i < this.groups.length; i++) {
      const group = this.groups[i]
      const b = this.budget()
      const groupTokens = group.reduce((t, m) => t + estimateMessageTokens(m), 0)
      // A group larger than a whole request is shortened anyway; it shares the request with the
      // current chunk when that leaves it at least a quarter of the room.
      const oversized = groupTokens > b
      if (chunk.length > 0 && chunkTokens + groupTokens > b && !(oversized && b - chunkTokens >= b / 4)) break
      const kept = oversized ? this.shrinkGroup(group, b - chunkTokens) : { messages: group, tokens: groupTokens }
      for (const m of kept.messages) chunk.push(m)
      chunkTokens += kept.tokens
    }
    return { chunk, to: i }
  }

  /** A tool-balanced group shortened to `room` tokens: an even share first, then what others can give up. */
  private shrinkGroup(group: Message[], room: number): { messages: Message[]; tokens: number } {
    if (room <= MESSAGE_OVERHEAD_TOKENS * group.length * 2) {
      const s = this.summary
      throw new CompactionError(`${this.windowNote()} leaves ${Math.max(0, Math.floor(room))} tokens for a `
        + `tool-balanced group of ${group.length} messages after the envelope, `
          + `instruction${s ? ' and running summary' : ''} `
        + `(${this.fixed()}${s ? ` + ${estimateMessageTokens(this.prior(s))}` : ''} tokens)`)
    }
    let each = Math.floor(room / group.length)
    let shrunk = group
    let tokens = 0
    for (let pass = 0; pass < 8; pass++) {
      shrunk = group.map((m) => (estimateMessageTokens(m) > each ? shrinkMessage(m, each) : m))
      tokens = shrunk.reduce((t, m) => t + estimateMessageTokens(m), 0)
      if (tokens <= room || each <= MESSAGE_OVERHEAD_TOKENS) break
      each = Math.max(MESSAGE_OVERHEAD_TOKENS, Math.floor(each * (room / tokens)) - 1)
    }
    if (tokens > room) {
      throw new CompactionError(`a tool-balanced group of ${group.length} messages cannot be shortened below `
        + `${tokens} tokens, and ${this.windowNote()} leaves ${Math.floor(room)} for it; nothing was sent`)
    }
    return { messages: shrunk, tokens }
  }

  /**
   * The summary request of `chunk` as it would be sent: its messages, envelope, heuristic and calibrated input
   * tokens, completion budget and fingerprint. Throws {@link CompactionError}, sending nothing, when it would not
   * fit the summarizer's window or is identical to one that overflowed.
   */
  private requestOf(chunk: Message[]) {
    const { provider, instruction } = this
    const lead = this.leadSent()
    const msgs = this.summary ? [this.prior(this.summary), ...chunk, instruction] : [...lead, ...chunk, instruction]
    const env = this.envelope()
    const inputTokens = estimateRequestTokens(env, msgs)
    const calibrated = Math.ceil(inputTokens * this.rate) + this.offset
    if (calibrated >= this.window) {
      throw new CompactionError(`a summary request of ${calibrated} tokens would not fit the summarizer's window `
        + `(${this.window} tokens); nothing was sent`)
    }
    const maxTokens = summaryMaxTokens(inputTokens - this.fixed() - estimateRequestTokens({}, lead),
      this.host.settings.compaction, this.window - calibrated, this.keptShare)
    const fingerprint =
      fingerprintOf(JSON.stringify([provider.model, maxTokens, env.system ?? '', env.tools?.length ?? 0, msgs]))
    if (this.failed.has(fingerprint)) {
      throw new CompactionError(`re-planning gave a summary request identical to one that overflowed or that the `
        + `server counted over the window (${calibrated} tokens); nothing was sent`)
    }
    return { msgs, env, inputTokens, calibrated, maxTokens, fingerprint }
  }

  /** Remembers a summary request that overflowed, or that the server counted over the window: never sent again. */
  private refused(fingerprint: number): void {
    this.failed.add(fingerprint)
    if (this.failed.size > FAILED_SUMMARY_MEMORY) this.failed.delete(this.failed.values().next().value!)
  }

  /** One summary request of `chunk`; its text, or undefined after an overflow that re-planned the budget. */
  private async request(chunk: Message[], signal: AbortSignal | undefined, replans: number): Promise<string
    | undefined> {
    const { provider } = this
    const { msgs, env, inputTokens, calibrated, maxTokens, fingerprint } = this.requestOf(chunk)
    // The server's own count, where it has one (docs/design.md §6.1): over the window, plan smaller unsent.
    const counted = provider.countTokens
      ? await providerCount(provider, { system: env.system, tools: env.tools, messages: msgs, signal })
        .catch(() => undefined) : undefined
    if (counted !== undefined && counted + maxTokens > this.window && replans < MAX_SUMMARY_REPLANS) {
      this.refused(fingerprint)
      this.replan({ promptTokens: counted }, inputTokens, maxTokens)
      return undefined
    }
    this.requests++
    const modelledHitTokens = CostLedger.of(this.session).summaryRequestHit(provider.model, env, msgs)
    const prices = provider.model === this.session.measure().header?.model ? undefined : provider.prices
    const seen: SeenOutput = { units: 0, retried: [] }
    // A request the server ran costs, failed or not (docs/design.md §11): the attempts retried after a 200 too.
    const ran = (outputTokens: number) => this.records.push({ model: provider.model, inputTokens, modelledHitTokens,
      outputTokens, ...(prices ? { prices } : {}) })
    let res: ChatResponse
    try {
      res = await provider.complete({ system: env.system, tools: env.tools, messages: msgs, maxTokens,
        inputTokens: calibrated, signal, headers: { 'x-dsh-purpose': 'compaction' }, onEvent: countingOutput(seen) })
    } catch (err) {
      const e = err as ProviderError
      for (const _ of seen.retried) ran(0)
      const outputTokens = failedOutputTokens(e, seen)
      if (outputTokens !== undefined) ran(outputTokens)
      const overflow = e?.code === 'CONTEXT_WINDOW_EXCEEDED'
      if (overflow) this.refused(fingerprint)
      if (!overflow || signal?.aborted || replans >= MAX_SUMMARY_REPLANS) {
        throw Object.assign(err as object, { summaryRequests: this.requests })
      }
      this.replan(overflowCounts(e.body || e.message), inputTokens, maxTokens)
      return undefined
    }
    for (const _ of seen.retried) ran(0)
    const usage = checkedUsage(res.usage)
    this.records.push({ model: provider.model, inputTokens, modelledHitTokens,
      outputTokens: estimateMessageTokens(res.message), ...(usage ? { usage } : {}), ...(prices ? { prices } : {}) })
    if (usage) {
      this.usage.promptTokens += usage.promptTokens
      this.usage.completionTokens += usage.completionTokens
      if (usage.promptTokens > 0) this.sample(usage.promptTokens, inputTokens)
    }
    const text = contentText(res.message.content).trim()
    if (!text) {
      throw Object.assign(new CompactionError(`the summarizer (${provider.model}) returned no text (finish `
        + `reason ${res.finishReason})`), { summaryRequests: this.requests })
    }
    return text
  }

  /** The server counts the last request as too long (an overflow, or its own count): learn its rate and limit. */
  private replan(counts: ReturnType<typeof overflowCounts>, inputTokens: number, maxTokens: number): void {
    if (counts.contextTokens !== undefined) this.window = Math.min(this.window, counts.contextTokens)
    const requested = counts.requestedTokens
    const promptTokens = counts.promptTokens
      ?? (requested !== undefined && requested > maxTokens ? requested - maxTokens : undefined)
    let planned = Math.floor(inputTokens * REPLAN_SHRINK)
    if (promptTokens !== undefined && promptTokens > 0) {
      this.sample(promptTokens, inputTokens)
      this.rate = Math.min(CALIBRATION_RANGE[1], Math.max(this.rate, promptTokens / inputTokens))
      const room = Math.min(this.window, counts.contextTokens ?? this.window) - Math.min(maxTokens, this.reserve)
      planned = Math.min(Math.floor(inputTokens * 0.9), Math.floor((room * REPLAN_MARGIN) / this.rate))
    }
    this.inputBudget = Math.min(this.inputBudget - 1, planned)
  }
}

/** Seq of the session's first user message (its task), from the head of the log; undefined when none is there. */
async function firstUserSeq(session: Session): Promise<number | undefined> {
  for await (const e of session.readEvents(0, 100)) {
    if (e.type === 'user/message' && (e.data as { surfaceOp?: SurfaceOp }).surfaceOp?.op === 'append') return e.seq
  }
  return undefined
}

/** A `compaction/before` verdict: cancel (throws, marked `cancelled`), or a focus joined to the one asked for. */
function applyVerdict(info: CompactionInfo, verdict: CompactionVerdict | void): void {
  if (verdict?.cancel) {
    const why = typeof verdict.cancel === 'string' ? `: ${verdict.cancel}` : ''
    throw Object.assign(new CompactionError(`cancelled by a compaction/before hook${why}`), { cancelled: true })
  }
  const add = verdict?.focus?.trim()
  if (add) info.focus = info.focus?.trim() ? `${info.focus.trim()}; ${add}` : add
}

/** The summary framed with the region's facts; throws when that is not strictly smaller than the region. */
function framedCheckpoint(summary: string, ledger: Ledger, regionTokens: number):
  { checkpoint: UserMessage; text: string; checkpointTokens: number } {
  const text = frameCheckpoint(summary, ledger)
  const checkpoint: UserMessage = { role: 'user', content: text }
  const checkpointTokens = estimateMessageTokens(checkpoint)
  if (checkpointTokens >= regionTokens)
    throw new CompactionError(`summary rejected: ${checkpointTokens} tokens is not smaller than the ${regionTokens} `
      + `tokens it would replace (the checkpoint counts its summary and its ledger)`)
  return { checkpoint, text, checkpointTokens }
}

/**
 * The ledger of a checkpoint of `region` with `summary`, from the region's `full` ledger (docs/design.md §12). The
 * budgets are measured tokens of the window, the ledger priced by the heuristic. The user's words get the widest
 * budget between the kept window's and their own (§5 "Room") with which the checkpoint stays smaller than the region
 * it replaces: a bisection, a few ledgers of one region, no model call.
 */
function regionFacts(session: Session, window: number | undefined, region: Region, full: Ledger,
  taskSeq: number | undefined): (summary?: string) => Ledger {
  const kept = window === undefined ? undefined : keptWindowTokens(session, window)
  const users = window === undefined ? undefined : userWindowTokens(session, window)
  const factsBy = (userWindow?: number) => checkpointFacts(full, kept, session.measure().calibration,
    region.tokens, taskSeq, userWindow)
  return (summary = '') => {
    const fits = (l: Ledger) => estimateMessageTokens({ role: 'user', content: frameCheckpoint(summary, l) })
      < region.tokens
    const wide = factsBy(users)
    if (users === undefined || kept === undefined || users === kept || fits(wide)) return wide
    let lo = kept, hi = users
    for (let i = 0; i < USER_WINDOW_BISECTIONS && hi - lo > 1; i++) {
      const mid = Math.floor((lo + hi) / 2)
      if (fits(factsBy(mid))) lo = mid; else hi = mid
    }
    return factsBy(lo)
  }
}

/** One summary transaction (docs/design.md §5, §12); returns the summary requests made, throws on failure. */
async function compactRegion(host: CompactionHost, region: Region, trigger: string, signal?: AbortSignal,
  focus?: string, payback?: number): Promise<number> {
  const session = host.session
  const records: SummaryRequestRecord[] = CostLedger.of(session).running = [] // the cap counts them as they are made
  const nodes = session.surface().slice(region.start, region.end)
  const first = nodes[0].seq, last = nodes[nodes.length - 1].seq
  const generation = session.replaceGeneration
  const id = `k${session.seq}`
  const tokensBefore = session.measure().totalTokens
  const info: CompactionInfo = { id, trigger, focus, shadowedSeqs: nodes.map((n) => n.seq),
    regionTokens: region.tokens }
  session.append('compaction/start', { id, trigger })
  let requests = 0
  try {
    applyVerdict(info, await compactionHooks(host, 'compaction/before', { compaction: info }, signal))
    const fullLedger = await regionLedger(session, nodes)
    const facts = regionFacts(session, host.settings.contextWindow, region, fullLedger, await firstUserSeq(session))
    // A region no larger than its checkpoint's frame and ledger could only be rejected after the model call.
    const frameTokens = estimateMessageTokens({ role: 'user', content: frameCheckpoint('', facts()) })
    if (frameTokens >= region.tokens)
      throw new CompactionError(`the region (${region.tokens} tokens) is not larger than its checkpoint's frame and `
        + `ledger alone (${frameTokens} tokens); nothing was sent`)
    const result = await summarise(host, nodes.map((n) => n.message), signal, info.focus, records,
      summaryLead(session, region))
    requests = result.requests
    if (signal?.aborted) throw new CompactionError('aborted')
    const ledger = facts(result.summary)
    const { checkpoint, text, checkpointTokens } = framedCheckpoint(result.summary, ledger, region.tokens)
    if (session.replaceGeneration !== generation || !session.surface().node(first) || !session.surface().node(last))
      throw new CompactionError('the surface changed during compaction')
    const fidelity = measureFidelity(fullLedger, text, result.summary)
    session.append('compaction/summary', {
      id, summary: result.summary, shadowedSeqs: info.shadowedSeqs, shadowedTokenCount: region.tokens,
      model: host.summarizer.model, usage: result.usage,
      ledger, fidelity, ...(info.focus ? { focus: info.focus } : {}), ...paybackData(payback),
    })
    const seq = session.append('user/message',
      { message: checkpoint, surfaceOp: { op: 'replace', start: first, end: last }, compactionId: id }).seq
    session.append('compaction/end', { id, tokensBefore, tokensAfter: session.measure().totalTokens,
      requests: records })
    const checkpointInfo = { seq, text, tokens: checkpointTokens, summary: result.summary, ledger, fidelity }
    try { await compactionHooks(host, 'compaction/after', { compaction: info, checkpoint: checkpointInfo }, signal) }
    catch (err) { warn(host, `a compaction/after hook failed: ${(err as Error)?.message ?? err}`) }
    return requests
  } catch (err) {
    if (stateOf(session).compaction !== id) throw err // committed: only the after hook can get here, and it is caught
    const aborted = signal?.aborted || (err as ProviderError)?.code === 'ABORTED'
    session.append('compaction/end', { id, error: aborted ? 'aborted' : String((err as Error)?.message ?? err),
      requests: records })
    throw Object.assign(err as object, { summaryRequests: requests + summaryRequestsOf(err) })
  }
}

/** The action of an outcome that called no model: what its rungs did, else `otherwise`. */
const modelFreeAction = (o: CompactionOutcome, otherwise: CompactionOutcome['action']): CompactionOutcome['action'] =>
  o.clearedTokens > 0 ? 'cleared' : o.prunedTokens > 0 ? 'pruned' : otherwise
/** The summary requests a failed compaction made (compactRegion sets them on what it throws). */
const summaryRequestsOf = (err: unknown): number => (err as { summaryRequests?: number })?.summaryRequests ?? 0

/** Ends a ladder run: its outcome with `action`, `reason` and the figures after it. */
type LadderDone = (action: CompactionOutcome['action'], reason?: string) => CompactionOutcome

/**
 * The escalation ladder of one session (docs/design.md §§5, 10): {@link Ladder.relievePressure},
 * {@link Ladder.recoverOverflow}, {@link Ladder.compact}. Its memory is logged as `ladder/state`, so a
 * restart does not repeat a failed compaction. No method throws for a ladder failure (a warning);
 * only cancellation is rethrown.
 */
class Ladder {
  private readonly host: CompactionHost
  private warnedNoWindow = false
  private warnedServerWindow = false
  private warnedEnvelope = false
  /** The host's envelope and its heuristic price, kept while the host returns the same object. */
  private envelopePrice?: { envelope: Envelope; tokens: number }
  /** When this ladder began watching the session's step rate (ms) and its conversation requests then. */
  private readonly watch: { ms: number; requests: number }

  constructor(host: CompactionHost) {
    this.host = host
    this.watch = { ms: Date.now(), requests: CostLedger.of(host.session).usage().conversation.requests }
  }

  /** Heuristic tokens (envelope + surface) at the last failed pressure compaction; undefined when none is pending. */
  get failedAtTokens(): number | undefined { return this.guard }
  /** The guard is the log's (`ladder/state`): every ladder of the session, and a resumed one, sees the same. */
  private get guard(): number | undefined { return ladderStateOf(this.host.session).failedAtTokens }

  private outcome(trigger: CompactionOutcome['trigger']): { outcome: CompactionOutcome; done: LadderDone } {
    const session = this.host.session
    const before = this.nextRequestTokens()
    const outcome: CompactionOutcome = {
      trigger, action: 'none', tokensBefore: before, tokensAfter: before, prunedTokens: 0, clearedTokens: 0,
      summaryRequests: 0, generationBefore: session.replaceGeneration, generationAfter: session.replaceGeneration,
    }
    const done = (action: CompactionOutcome['action'], reason?: string) => {
      outcome.action = action
      outcome.reason = reason
      outcome.tokensAfter = this.nextRequestTokens()
      outcome.generationAfter = session.replaceGeneration
      return outcome
    }
    return { outcome, done }
  }

  /** Threshold in tokens, or undefined (after one configuration warning) when the window is unknown. */
  private threshold(): number | undefined {
    const { contextWindow: window, compaction, modelName } = this.host.settings
    if (window !== undefined) return Math.floor(window * compaction.thresholdRatio)
    if (!this.warnedNoWindow) {
      this.warnedNoWindow = true
      warn(this.host, `configuration error: the context window of model `
        + `"${modelName ?? this.host.summarizer.model}" is unknown, so pressure compaction is off; `
        + `set contextWindow (CLI: --context-window N)`)
    }
    return undefined
  }

  /** How large the task may be and stay whole on the surface: 10% of the window in heuristic tokens (design §12). */
  private taskTokens(): number {
    const window = this.host.settings.contextWindow, session = this.host.session
    return window === undefined ? 0
      : Math.floor((userWindowTokens(session, window) * TASK_WINDOW_RATIO) / session.measure().calibration)
  }

  private setGuard(tokens: number | undefined): void {
    if (tokens === this.guard) return
    this.host.session.append('ladder/state',
      { failedAtTokens: tokens ?? null, calibration: this.host.session.measure().calibration })
  }

  /** The ladder's view of its session for a run at `threshold` (see {@link LadderView}). */
  private view(threshold: number, includeNewest = false): LadderView {
    const s = this.host.settings
    return {
      session: this.host.session, prune: s.prune, compaction: s.compaction, window: s.contextWindow, threshold,
      includeNewest, clearable: (name) => !s.unclearable?.has(name), taskTokens: this.taskTokens(),
      nextRequestTokens: () => this.nextRequestTokens(), summaryCacheRead: (r) => summaryCacheRead(this.host, r),
    }
  }

  /** Runs `rung` and logs its edits (the one place that does); returns tokens reclaimed. */
  private apply(rung: Rung, view: LadderView, trigger: string, gate?: Gate, needed = true): number {
    const session = view.session
    let reclaimed = 0
    for (const batch of rung(view)) {
      if (batch.onlyIfAtLeast !== undefined && view.nextRequestTokens() < batch.onlyIfAtLeast) continue
      const gated = gatedOps(view, batch, gate, needed) // the net-cost gate (5.1a)
      for (const op of gated.ops) {
        if (gated.stopAtOrBelow !== undefined && view.nextRequestTokens() <= gated.stopAtOrBelow) break
        reclaimed += op.op === 'prune' ? pruneNode(session, op.seq, view.prune, trigger, gated.payback)
          : clearNode(session, op.seq, op.placeholder, trigger, gated.payback)
      }
    }
    return reclaimed
  }

  /**
   * Pressure (`trigger: 'pressure'`, docs/design.md §§5, 10): over `floor(window × thresholdRatio)` tokens,
   * the rungs in order, remeasuring between them; a failed summary is remembered durably.
   */
  async relievePressure(signal?: AbortSignal): Promise<CompactionOutcome> {
    const { session, settings: { compaction: cfg, contextWindow: window } } = this.host
    const { outcome, done } = this.outcome('pressure')
    const threshold = this.threshold()
    if (threshold === undefined) return done('skipped', 'no context window')
    if (stateOf(session).compaction) return done('skipped', 'a compaction is already running')
    const gate = gateOf(session, cfg, this.watch), view = this.view(threshold)
    const needed = outcome.tokensBefore >= threshold
    if (!needed && !gate) return done('none')
    if (signal?.aborted) return done('skipped', 'aborted')
    const below = () => this.nextRequestTokens() < threshold, trigger = needed ? 'pressure' : 'gate'
    outcome.prunedTokens = this.apply(pruneResultsRung, view, trigger, gate, needed)
      + this.apply(pruneMessagesRung, view, trigger, gate, needed)
    if (needed && below() && !gate) return done('pruned') // the gate goes on with the clears that pay back
    outcome.clearedTokens = this.apply(clearRung, view, trigger, gate, needed && !below())
    if (!needed) return done(modelFreeAction(outcome, 'none'))
    const next = this.nextRequestTokens() // the gate: clear more (the protected results too) rather than summarise
    const more = gate && next > Math.floor(view.window! * reliefRatio(cfg)) && clearMore(view, gate, next)
    if (more) outcome.clearedTokens += this.apply(() => [more.batch], view, 'pressure', gate, more.needed)
    if (below()) return done(modelFreeAction(outcome, 'cleared'))
    // The guard and node prices are heuristic tokens; the retained tail is measured tokens of the window.
    const retained = Math.floor((keptWindowTokens(session, window!) * cfg.retainedTailRatio)
      / session.measure().calibration)
    // The guard holds off a summary for the threshold, never one the next request needs to fit the window.
    if (this.guard !== undefined && session.measure().heuristicTokens < this.guard + retained
      && this.nextRequestTokens() <= window!) {
      return done(modelFreeAction(outcome, 'skipped'), 'an earlier compaction failed and the surface has not grown '
        + 'enough since')
    }
    return this.summariseUnder('pressure', threshold, outcome, done, signal)
  }

  /** Rung 3 under pressure or by hand: summary attempts, then success, or a remembered failure. */
  private async summariseUnder(trigger: 'pressure' | 'manual', threshold: number, outcome: CompactionOutcome,
    done: LadderDone, signal?: AbortSignal, focus?: string): Promise<CompactionOutcome> {
    const { session, settings: { compaction: cfg, contextWindow: window = 0 } } = this.host
    const retained = Math.floor(keptWindowTokens(session, window) * cfg.retainedTailRatio)
    const minSaving = Math.ceil(outcome.tokensBefore * MIN_SAVINGS_RATIO)
    let lastError = '', committed = 0
    for (let attempt = 0; attempt <= COMPACTION_RETRIES; attempt++) {
      // Node prices are heuristic tokens: the measured retained tail and saving are divided by the calibration.
      const rate = session.measure().calibration, next = this.nextRequestTokens(), over = window > 0 && next > window
      const pick = (tailTokens: number) => selectRegion(session.surface(), Math.floor(tailTokens / rate),
        keptOutOfSummary(session), Math.ceil(minSaving / rate))
      // The gate: no summary that cannot save a token, nor one that leaves the request above the threshold
      // when it fits the window without it or would not fit with it either (the checkpoint as the gate models it).
      const gate = trigger === 'pressure' && gateOf(session, cfg, this.watch)
      const modelOf = (r: Region) => (gate ? summaryModel(session, r, cfg, gate.prices, summaryCacheRead(this.host, r),
        window) : undefined)
      // A request that would not fit the window keeps no tail (as an overflow's recovery) on a retry, or when the
      // tail leaves no region or one whose summary would not make it fit.
      let region = pick(over && attempt > 0 ? 0 : retained)
      if (over && (!region || (gate && next - (modelOf(region)?.savedTokens ?? 0) * rate >= window)))
        region = pick(0) ?? region
      if (!region) { lastError = 'no region can be summarised without separating a tool call from its result or '
        + 'touching the current input'; break }
      const model = modelOf(region), saved = model?.savedTokens ?? 0, left = Math.ceil(next - saved * rate)
      if (gate && (saved <= 0 || (left >= threshold && (next <= window || left >= window)))) {
        lastError = `a summary of this ${region.tokens}-token region would leave about ${left} tokens, not under the `
          + `threshold, and the request ${next <= window ? 'fits the window without it' : 'would not fit it either'}`
        break
      }
      try { outcome.summaryRequests += await compactRegion(this.host, region, trigger, signal, focus,
        gate ? paybackRequests(gate.prices, model!) : undefined); committed++ } catch (err) {
        // The host's spend cap refused the request unsent: no failure to remember (docs/design.md §11).
        if ((err as { budget?: boolean })?.budget) return done(modelFreeAction(outcome, 'skipped'),
          (err as Error).message)
        outcome.summaryRequests += summaryRequestsOf(err)
        if (signal?.aborted) throw err
        lastError = (err as Error).message
        // a hook said no: asking again would only repeat the question
        if ((err as { cancelled?: boolean })?.cancelled) break
        // Refused before any model call: the same surface and calibration give the same region and the same refusal.
        if (summaryRequestsOf(err) === 0) break
        continue
      }
      if (trigger === 'manual' || this.nextRequestTokens() < threshold) break
    }
    const after = this.nextRequestTokens()
    const saved = outcome.tokensBefore - after
    if (trigger === 'manual' && committed > 0) { this.setGuard(undefined); return done('compacted') }
    if (committed > 0 && after < threshold && saved >= minSaving) { this.setGuard(undefined); return done('compacted') }
    const why = (lastError || (saved < minSaving
      ? `it saved only ${saved} tokens (< ${Math.round(MIN_SAVINGS_RATIO * 100)}%)`
      : 'the retained tail and envelope alone are above it')) + pinsNote(session, window)
    warn(this.host, `context still at ${after} of ${window} tokens (threshold ${threshold}) after compaction: ${why}; `
      + `not retrying until the surface grows by ${retained} tokens`)
    session.append('compaction/warning', { trigger, message: why, totalTokens: after, thresholdTokens: threshold })
    this.setGuard(session.measure().heuristicTokens)
    return done(committed > 0 ? 'compacted' : modelFreeAction(outcome, 'failed'), why)
  }

  /** The next request in tokens: the measured total plus what the host's envelope adds (the recall tool). */
  private nextRequestTokens(): number {
    const m = this.host.session.measure()
    const envelope = this.host.envelope
    if (this.envelopePrice?.envelope !== envelope) this.envelopePrice = { envelope,
      tokens: estimateEnvelopeTokens(envelope) }
    const added = this.envelopePrice.tokens - m.envelopeTokens
    if (added <= 0) return m.totalTokens
    const session = this.host.session // the added part at the envelope's own ratio (docs/design.md §10)
    return m.totalTokens + sentEnvelopeTokens(session, this.envelopePrice.tokens) - sentEnvelopeTokens(session)
  }

  /**
   * Overflow (`trigger: 'context-overflow'`, docs/design.md §§5, 10), after the provider refused a request
   * as too long (`error`; its count is a calibration sample). The caller retries only if
   * `generationAfter > generationBefore`.
   */
  async recoverOverflow(error: ProviderError | undefined, signal?: AbortSignal): Promise<CompactionOutcome> {
    const { session } = this.host
    const { outcome, done } = this.outcome('context-overflow')
    if (stateOf(session).compaction) return done('skipped', 'a compaction is already running')
    if (signal?.aborted) return done('skipped', 'aborted')
    const counts = error ? overflowCounts(error.body || error.message) : {}
    const counted = counts.promptTokens !== undefined && counts.promptTokens > 0
    if (counted) session.append('ladder/state',
      { sample: { providerTokens: counts.promptTokens!, heuristicTokens: session.measure().heuristicTokens,
      source: 'overflow' } })
    const window = this.host.settings.contextWindow
    if (counts.contextTokens !== undefined && window !== undefined && counts.contextTokens < window
      && !this.warnedServerWindow) {
      // Pressure compares with the configured window, so every cycle would overflow again first.
      this.warnedServerWindow = true
      warn(this.host, `the provider reports a context window of ${counts.contextTokens} tokens, smaller than the `
        + `configured ${window}: compaction starts too late and requests overflow; set contextWindow to `
        + `${counts.contextTokens} (CLI: --context-window ${counts.contextTokens})`)
    }
    const threshold = window === undefined ? 0 : Math.floor(window * this.host.settings.compaction.thresholdRatio)
    if (counted && window !== undefined && !this.warnedEnvelope) {
      // The provider's count shared out by heuristic price: the envelope's part of the refused request.
      const m = session.measure()
      const envelopeCounted = Math.round((counts.promptTokens! * m.envelopeTokens) / Math.max(1, m.heuristicTokens))
      if (envelopeCounted >= threshold) {
        this.warnedEnvelope = true
        warn(this.host, `the system prompt and tool specs alone are about ${envelopeCounted} tokens by the provider's `
          + `count (${m.envelopeTokens} of the request's ${m.heuristicTokens} heuristic tokens; it counted `
          + `${counts.promptTokens}), at or above the compaction threshold of ${threshold} of the ${window}-token `
          + `window: no prune or summary can make room; use a model with a larger context window, or fewer or shorter `
          + `tools and system prompt`)
      }
    }
    const view = this.view(threshold, true)
    outcome.prunedTokens = this.apply(pruneResultsRung, view, 'context-overflow')
      + this.apply(pruneMessagesRung, view, 'context-overflow')
    outcome.clearedTokens = this.apply(clearRung, view, 'context-overflow')
    const modelFree = modelFreeAction(outcome, 'failed')
    if (counted && window !== undefined && session.replaceGeneration > outcome.generationBefore
      && this.nextRequestTokens() < threshold) return done(modelFree)
    const region = selectRegion(session.surface(), 0, keptOutOfSummary(session))
    let compacted = false
    if (region) {
      try { outcome.summaryRequests += await compactRegion(this.host, region, 'context-overflow', signal);
        compacted = true } catch (err) {
        outcome.summaryRequests += summaryRequestsOf(err)
        if (signal?.aborted) throw err
        warn(this.host, `overflow compaction failed: ${(err as Error).message}`)
      }
    }
    // The surface the guard remembered is gone: pressure may summarise again as soon as it needs to.
    if (compacted) { this.setGuard(undefined); return done('compacted') }
    return done(modelFree, modelFree === 'failed' && !region ? 'no region to summarise' : undefined)
  }

  /** Manual compaction (`/compact [FOCUS]`): prune, then summarise; `focus` goes into the summary instruction. */
  async compact(signal?: AbortSignal, options: { focus?: string } = {}): Promise<CompactionOutcome> {
    const { session } = this.host
    const { outcome, done } = this.outcome('manual')
    const threshold = this.threshold()
    if (threshold === undefined) return done('skipped', 'no context window')
    if (stateOf(session).compaction) return done('skipped', 'a compaction is already running')
    if (signal?.aborted) return done('skipped', 'aborted')
    const view = this.view(threshold)
    outcome.prunedTokens = this.apply(pruneResultsRung, view, 'manual')
      + this.apply(pruneMessagesRung, view, 'manual')
    return this.summariseUnder('manual', threshold, outcome, done, signal, options.focus)
  }
}

// ── 6.1a The net-cost gate (docs/design.md §11 "Edits that pay for themselves") ──
// An edit of the cached prefix costs the cache misses it causes now (and a summary request's own
// price); it saves its tokens on every later request. The gate makes it when it pays back within
// the requests the session can expect (its own pace so far, never a transcript's future), or when
// it is needed to stay under the threshold. The model is pure; the planners below read the session.

/** A prompt cache unused this long is taken as gone, ms: DeepSeek keeps one for hours, others for minutes. */
const CACHE_LIFETIME_MS = 3_600_000
/** A summary's checkpoint is priced at this share of its completion budget: the model rarely writes all of it. */
const SUMMARY_OUTPUT_SHARE = 0.5

/** An edit as the gate prices it: tokens moved from hit to miss now, saved on every later request; a summary's USD. */
interface EditModel { movedTokens: number; savedTokens: number; summaryUSD?: number }

/** USD an edit costs now (off-peak): its cache misses plus a summary request's own price. */
const editNowUSD = (prices: Prices, e: EditModel) => cacheCostUSD(prices, e.movedTokens) + (e.summaryUSD ?? 0)

/** Later requests after which an edit has paid for itself: 0 when free, Infinity when it saves nothing. */
function paybackRequests(prices: Prices, e: EditModel): number {
  const cost = editNowUSD(prices, e), perRequest = (e.savedTokens * prices.cacheHitInput) / 1_000_000
  if (cost <= 0) return 0
  return perRequest > 0 ? Math.ceil(cost / perRequest - 1e-9) : Infinity // 1e-9: float noise, not a request
}

/** USD an edit costs over `requests` later requests, its saving taken off (below 0: it pays). */
const netEditUSD = (prices: Prices, e: EditModel, requests: number) =>
  editNowUSD(prices, e) - (e.savedTokens * prices.cacheHitInput * requests) / 1_000_000

/** What the ladder's gate decides with: the prices of the next request and the requests expected. */
interface Gate { prices: Prices; requests: number }

/**
 * The gate of a session now, or undefined when it is off (the test seam's `gate: false`) or the prices are unknown.
 * The requests it expects before the session ends or its cache expires (docs/design.md §11; at least 1): the current
 * turn as long as the completed ones on average, or as long again as it has been, and no more than the pace since
 * `watch` (its start, ms, and the requests then) fits into the cache's lifetime.
 */
function gateOf(session: Session, cfg: LadderConfig, watch: { ms: number; requests: number }): Gate | undefined {
  const prices = session.measure().header?.prices
  if (!cfg.gate || !prices) return undefined
  const requests = CostLedger.of(session).usage().conversation.requests
  const t = stateOf(session).turn, now = t.open ? t.step : 0
  const turns = Math.max(0, t.last - (t.open ? 1 : 0)), watched = requests - watch.requests, ms = Date.now() - watch.ms
  const n = Math.max(1, Math.round(turns > 0 ? (requests - now) / turns : 0) - now, now)
  return { prices, requests: ms > 0 && watched > 0 ? Math.min(n, Math.max(1, Math.floor(CACHE_LIFETIME_MS * watched
    / ms))) : n }
}

/** Surface tokens the next request would read from the cache (heuristic tokens). */
function cachedSurfaceTokens(session: Session): number {
  const c = CostLedger.of(session).nextRequestCache()
  return c.modelledHitTokens > 0 ? Math.max(0, c.modelledHitTokens - session.measure().envelopeTokens) : 0
}

/** The model of each run of the newest ops applied now, oldest start first. O(surface + ops). */
function suffixModels(session: Session, ops: readonly LadderOp[], prune: PruneConfig): EditModel[] {
  const before = new Map<number, number>(), at = new Set(ops.map((o) => o.seq))
  let tokens = 0
  for (const n of session.surface()) { if (at.has(n.seq)) before.set(n.seq, tokens); tokens += n.tokens }
  const cached = cachedSurfaceTokens(session), out: EditModel[] = new Array(ops.length)
  let saved = 0
  for (let k = ops.length - 1; k >= 0; k--) {
    const op = ops[k], n = session.surface().node(op.seq)
    if (n) {
      const m = n.message
      const after = op.op === 'clear' ? { ...m, content: [{ type: 'text', text: op.placeholder }] } as Message
        : m.role === 'tool' ? pruneResultMessage(m, prune) : pruneMessage(m, prune)
      saved += Math.max(0, n.tokens - estimateMessageTokens(after))
    }
    out[k] = { movedTokens: Math.max(0, cached - (before.get(op.seq) ?? tokens) - saved), savedTokens: saved }
  }
  return out
}

/**
 * The ops of a batch the gate lets through, with their payback in requests (docs/design.md §11). Below the
 * threshold: the longest run of newest edits that pays back. Needed: of the runs that bring the next request to
 * the batch's stop, the one of least net cost, else the whole batch (a batch without a stop: whole); made whole,
 * since every edit after the run's oldest moves no cached token of its own.
 */
function gatedOps(v: LadderView, batch: LadderBatch, gate: Gate | undefined,
  needed: boolean): { ops: readonly LadderOp[]; stopAtOrBelow?: number; payback?: number } {
  if (!gate) return batch
  const models = suffixModels(v.session, batch.ops, v.prune), stop = batch.stopAtOrBelow
  let k = needed ? 0 : models.findIndex((m) => paybackRequests(gate.prices, m) <= gate.requests), least = Infinity
  // A prune batch is made whole (under pressure every seen result over the threshold is pruned, docs/design.md §3).
  const next = v.nextRequestTokens(), rate = v.session.measure().calibration
  if (needed && stop !== undefined) models.forEach((m, j) => {
    const net = netEditUSD(gate.prices, m, gate.requests)
    if (next - m.savedTokens * rate <= stop && net < least) { least = net; k = j }
  })
  return !models[k] ? { ops: [] } : { ops: batch.ops.slice(k), stopAtOrBelow: needed ? undefined : stop,
    payback: paybackRequests(gate.prices, models[k]) }
}

/** How a summary of `region` would read the conversation's cache, as its {@link SummaryJob} decides (docs/design.md
 *  §5, §11): what it sends ahead of the region, and whether it reads the cache at all (the same model, and the tool
 *  specs kept). */
function summaryCacheRead(host: CompactionHost, region: Region): SummaryCacheRead {
  const job = new SummaryJob(host, [], undefined, [], summaryLead(host.session, region))
  return { lead: job.leadSent(), reads: job.readsCache() }
}
interface SummaryCacheRead { lead: readonly Message[]; reads: boolean }

/** The model of a summary of `region` (docs/design.md §11): its request reads the cache through `lead`, if any. */
function summaryModel(session: Session, region: Region, cfg: LadderConfig, prices: Prices,
  { lead, reads }: SummaryCacheRead, window?: number): EditModel {
  const cached = cachedSurfaceTokens(session), done = CostLedger.of(session).usage().summary
  const output = done.requests > 0 ? Math.ceil(done.outputTokens / done.requests)
    : Math.ceil(SUMMARY_OUTPUT_SHARE * summaryMaxTokens(region.tokens, cfg, Infinity, keptShare(session, window)))
  const input = estimateRequestTokens({}, lead) + region.tokens
  const hit = !reads || (region.start > 0 && lead.length === 0) ? 0 : Math.min(input, cached)
  const saved = Math.max(0, region.tokens - output)
  const summaryUSD = requestCostUSD(prices, { cachedInputTokens: hit, uncachedInputTokens: input - hit,
    outputTokens: output }, 0)
  return { movedTokens: Math.max(0, cached - saved), savedTokens: saved, summaryUSD }
}

/** Clear-more, the gate at pressure (docs/design.md §11); undefined when there is nothing to clear. */
function clearMore(v: LadderView, gate: Gate, nextTokens: number): { batch: LadderBatch; needed: boolean } | undefined {
  if (!v.compaction.clear || v.window === undefined) return undefined
  const rate = v.session.measure().calibration
  const ops = clearCandidates(v.session, 0, v.clearable)
  if (ops.length === 0) return undefined
  const [clear] = suffixModels(v.session, ops, v.prune)
  // The region a pressure summary would take now (as the ladder selects it, before the minimum saving).
  const tail = keptWindowTokens(v.session, v.window) * v.compaction.retainedTailRatio
  const region = selectRegion(v.session.surface(), Math.floor(tail / rate),
    keptOutOfSummary(v.session))
  const cheaper = !region || netEditUSD(gate.prices, clear, gate.requests)
    <= netEditUSD(gate.prices, summaryModel(v.session, region, v.compaction, gate.prices, v.summaryCacheRead(region),
      v.window), gate.requests)
  return { batch: { ops, stopAtOrBelow: Math.floor(v.window * reliefRatio(v.compaction)) },
    needed: nextTokens - clear.savedTokens * rate >= v.threshold || cheaper }
}

// ── 6.2 Recall: the model reads back what the ladder shadowed (docs/design.md §10) ──────────

/** The name of the tool {@link recallTool} makes. */
const RECALL_TOOL_NAME = 'recall'
/** `recall` is offered while its spec takes at most this share of the window (docs/design.md §10). */
const RECALL_MAX_WINDOW_RATIO = 0.1
/** Cap on one recall answer, code points, before the line that says how to get more. */
const RECALL_MAX_CODE_POINTS = 4096
/** Lines per recall page unless `limit` says otherwise. */
const RECALL_DEFAULT_LINES = 200
/** Lines longer than this many code points are paged as pieces of this length. */
const RECALL_LINE_CODE_POINTS = 1000
/** A pattern hit shows at most this many code points of its line. */
const RECALL_HIT_CODE_POINTS = 200

/** One original the surface no longer shows (or shows as a spill preview), as recall finds it. */
interface ShadowedOriginal {
  /** What the model passes as `key`: a tool result's tool-call id, else `seq:N`. */
  key: string
  seq: number
  /** e.g. `tool result of read_file {"path":"a.ts"}` or `assistant message`. */
  label: string
  toolName?: string
  toolArguments?: string
  /** The original text (a spilled result's is read from the artefact area). */
  text(): Promise<string>
}

/** The text of a logged message, as recall shows it: blocks joined, non-text blocks named. */
function recallText(m: Message): string {
  if (typeof m.content === 'string') return m.content
  return m.content.map((b) => {
    if (b.type === 'text') return (b as TextBlock).text
    if (b.type === 'reasoning') return `[reasoning]\n${(b as ReasoningBlock).text}\n[/reasoning]`
    if (b.type === 'tool-call') return `[tool call ${(b as ToolCallBlock).name} ${(b as ToolCallBlock).arguments}]`
    return `[${b.type} block]`
  }).join('\n')
}

/** The shadowed originals, newest first, each read only when reached (recall costs what it reads). */
async function* shadowedOriginals(session: Session): AsyncGenerator<ShadowedOriginal> {
  const seqs = RecallIndex.of(session).shadowedSeqs().slice()
  for (let i = seqs.length - 1; i >= 0; i--) {
    const o = await shadowedOriginal(session, seqs[i])
    if (o) yield o
  }
}

/** The original logged at `seq` as recall shows it (undefined when that event is no appended message). */
async function shadowedOriginal(session: Session, seq: number): Promise<ShadowedOriginal | undefined> {
  const e = await session.readEvent(seq)
  const d = e.data as { message?: Message; surfaceOp?: SurfaceOp; spilled?: { ref: string; bytes: number } }
  if (!SURFACE_TYPES[e.type] || d.surfaceOp?.op !== 'append' || !d.message) return undefined
  const m = d.message
  if (m.role !== 'tool') return { key: `seq:${seq}`, seq, label: `${m.role} message`, text: async () => recallText(m) }
  const call = await originalCall(session, m.toolCallId, seq)
  const spilled = d.spilled
  return {
    key: m.toolCallId, seq, toolName: call?.name, toolArguments: call?.arguments,
    // The name is the model's text too: bounded, like the arguments, so a label cannot take an answer past its cap.
    label: (`tool result of ${call ? headCodePoints(call.name, 100) : 'a tool'} `
      + `${headCodePoints((call?.arguments ?? '').replace(/\s+/g, ' '), 100)}`).trim(),
    text: async () => {
      if (!spilled) return recallText(m)
      if (!session.store.getArtefact)
        throw new Error(`${RECALL_TOOL_NAME}: the original of ${m.toolCallId} was spilled to ${spilled.ref}, `
          + `which this store cannot read back`)
      return await session.store.getArtefact(spilled.ref)
    },
  }
}

/** Tool call `callId` as the model sent it, read from its assistant message: one event. */
async function originalCall(session: Session, callId: string, resultSeq: number): Promise<ToolCallBlock | undefined> {
  const callSeq = RecallIndex.of(session).shadowedCallSeq(resultSeq)
  if (callSeq === undefined) return undefined
  const d = (await session.readEvent(callSeq)).data as { message?: Message }
  return d.message ? toolCalls(d.message).find((c) => c.id === callId) : undefined
}

/** The original recall answers for `key` (a tool-call id or `seq:N`): the first result of a call on the surface,
 *  else the newest shadowed original with that key; each found by the session's index (one event read). */
async function recallByKey(session: Session, key: string): Promise<ShadowedOriginal | undefined> {
  const index = RecallIndex.of(session), bySeq = /^seq:\d+$/.test(key)
  const direct = bySeq ? Number(key.slice(4)) : index.resultOriginSeq(key)
  if (direct !== undefined && binarySearch(index.shadowedSeqs(), direct,
    (seq) => seq) >= 0) { const o = await shadowedOriginal(session, direct); if (o?.key === key) return o }
  const newest = bySeq ? undefined : index.shadowedResultSeq(key)
  return newest === undefined ? undefined : await shadowedOriginal(session, newest)
}

/** The text's lines for paging, one at a time (a search holds no array of them); lines over 1,000 code points become
 *  pieces of 1,000, each but the last with `goesOn` (no line break after it). */
function* recallLineIter(text: string): Generator<[line: string, goesOn: boolean]> {
  for (let start = 0; start <= text.length;) {
    const lf = text.indexOf('\n', start), end = lf < 0 ? text.length : lf
    let rest = text.slice(start, end)
    start = end + 1
    while (rest.length > RECALL_LINE_CODE_POINTS
      && codePointLength(rest, RECALL_LINE_CODE_POINTS) > RECALL_LINE_CODE_POINTS) {
      const cut = indexAfterCodePoints(rest, RECALL_LINE_CODE_POINTS)
      yield [rest.slice(0, cut), true]
      rest = rest.slice(cut)
    }
    yield [rest, false]
  }
}

/** Whole lines from `lines[from]` while they fit the answer and `limit`; `to` is the end (exclusive). A piece of a
 *  longer line is joined to the next one with no line break. */
function pageOf(lines: ReadonlyArray<string | [string, boolean]>, from: number, limit: number, reserved: number):
  { text: string; to: number } {
  let text = '', used = reserved, to = from
  while (to < lines.length && to - from < limit) {
    const [line, goesOn] = typeof lines[to] === 'string' ? [lines[to] as string, false] : lines[to] as [string, boolean]
    const cost = codePointLength(line) + 1
    if (used + cost > RECALL_MAX_CODE_POINTS && to > from) break
    text += line + (goesOn ? '' : '\n')
    used += cost
    to++
  }
  return { text: text.endsWith('\n') ? text.slice(0, -1) : text, to }
}

/** Reads a positive integer argument of recall (1-based), with a default. */
function recallInt(args: Record<string, unknown>, key: string, fallback: number): number {
  const v = args[key]
  if (v === undefined) return fallback
  if (!Number.isSafeInteger(v) || (v as number) < 1)
    throw new Error(`${RECALL_TOOL_NAME}: ${key} must be an integer ≥ 1, got ${JSON.stringify(v)}`)
  return v as number
}

const RECALL_KEYS = ['key', 'tool', 'arguments', 'pattern', 'offset', 'limit']
/** Hits a search counts past its page before it stops counting ("more than N hits"). */
const RECALL_COUNTED_HITS = 1_000
/** A model's argument as an answer quotes it: JSON, at most {@link RECALL_HIT_CODE_POINTS} code points of it (so an
 *  answer stays capped). */
const echo = (v: string): string => JSON.stringify(headCodePoints(v, RECALL_HIT_CODE_POINTS))

/** The `recall` tool (docs/design.md §10): reads shadowed originals back from the log, a page at a time. */
function recallTool(session: Session): Tool {
  return {
    name: RECALL_TOOL_NAME,
    // Short on purpose: the spec rides in every request once something is shadowed.
    description: 'Read back a tool result or message that was pruned, cleared or summarised. By key (tool-call id or '
      + 'seq:N, as a placeholder names it), by tool (+ arguments: a substring of its arguments), or search all by '
      + 'pattern (plain text). Paged: offset, limit (lines or hits, from 1).',
    parameters: {
      type: 'object',
      properties: {
        key: { type: 'string' }, tool: { type: 'string' }, arguments: { type: 'string' }, pattern: { type: 'string' },
        offset: { type: 'integer', minimum: 1 }, limit: { type: 'integer', minimum: 1 },
      },
      additionalProperties: false,
    },
    async execute(raw: unknown) {
      if (typeof raw !== 'object' || raw === null || Array.isArray(raw)) {
        throw new Error(`${RECALL_TOOL_NAME}: arguments must be a JSON object such as {"key":"call_1"}`)
      }
      const args = raw as Record<string, unknown>
      for (const k of Object.keys(args)) {
        if (!RECALL_KEYS.includes(k))
          throw new Error(`${RECALL_TOOL_NAME}: unknown argument ${echo(k)} (known: ${RECALL_KEYS.join(', ')})`)
      }
      for (const k of ['key', 'tool', 'arguments', 'pattern']) {
        if (args[k] !== undefined && typeof args[k] !== 'string')
          throw new Error(`${RECALL_TOOL_NAME}: ${k} must be a string`)
      }
      const offset = recallInt(args, 'offset', 1)
      const limit = recallInt(args, 'limit', RECALL_DEFAULT_LINES)
      if (typeof args.pattern === 'string') return await recallSearch(session, args.pattern, offset, limit)
      return await recallRead(session, args, offset, limit)
    },
  }
}

/** recall `{pattern}`: one line per hit over every shadowed original, newest first, paged by hits. */
async function recallSearch(session: Session, pattern: string, offset: number, limit: number): Promise<string> {
  const needle = pattern.toLowerCase()
  if (needle === '') throw new Error(`${RECALL_TOOL_NAME}: pattern must not be empty`)
  // Only the hits of the page asked for are written out, and the count stops at RECALL_COUNTED_HITS past them: a
  // pattern in every line of a 16 MB original built 8 million hit lines (2 GB) for one answer.
  const first = offset - 1, countTo = first + limit + RECALL_COUNTED_HITS
  const hits: string[] = []
  let searched = 0, total = 0
  for await (const o of shadowedOriginals(session)) {
    // A recall answer repeats other originals: searching it would find each hit twice.
    if (o.toolName === RECALL_TOOL_NAME) continue
    searched++
    let i = 0
    for (const [line] of recallLineIter(await o.text())) {
      i++
      if (!line.toLowerCase().includes(needle)) continue
      if (total >= first && total < first + limit) hits.push(`${headCodePoints(o.key, RECALL_HIT_CODE_POINTS)} `
        + `line ${i} (${o.label}): ${headCodePoints(line.trim(), RECALL_HIT_CODE_POINTS)}`)
      if (++total >= countTo) break
    }
    if (total >= countTo) break
  }
  const counted = total >= countTo ? `more than ${total - 1}` : String(total)
  if (total === 0)
    return `${RECALL_TOOL_NAME}: no shadowed original contains ${echo(pattern)} (${searched} searched)`
  if (offset > total) throw new Error(`${RECALL_TOOL_NAME}: offset ${offset} is past the last hit (${total})`)
  const header = headCodePoints(`${counted} hit(s) for ${JSON.stringify(pattern)}, newest first; read one with `
    + '{"key":…,"offset":line}:', 400)
  const page = pageOf(hits, 0, limit, codePointLength(header) + 1)
  const to = first + page.to
  const next = JSON.stringify({ pattern, offset: to + 1 })
  const more = to < total ? `\n[hits ${offset}–${to} of ${counted}; more: ${RECALL_TOOL_NAME} ${next}]` : ''
  return `${header}\n${page.text}${more}`
}

/** recall `{key}` or `{tool, arguments?}`: one original, paged by lines (older results of the tool named). */
async function recallRead(session: Session, args: Record<string, unknown>, offset: number,
  limit: number): Promise<string> {
  let found: ShadowedOriginal | undefined
  let others: string[] = []
  if (typeof args.key === 'string') {
    found = await recallByKey(session, args.key)
    if (!found) {
      throw new Error(`${RECALL_TOOL_NAME}: nothing shadowed has key ${echo(args.key)}; keys are tool-call ids or `
        + 'seq:N as placeholders name them (search with pattern)')
    }
  } else if (typeof args.tool === 'string') {
    const sub = typeof args.arguments === 'string' ? args.arguments : ''
    const matches: ShadowedOriginal[] = [] // the newest, then up to 5 older ones to name
    for await (const o of shadowedOriginals(session)) {
      if (o.toolName === args.tool && (o.toolArguments ?? '').includes(sub) && matches.push(o) >= 6) break
    }
    if (matches.length === 0) {
      throw new Error(`${RECALL_TOOL_NAME}: no shadowed result of tool ${echo(args.tool)}`
        + `${sub ? ` with arguments containing ${echo(sub)}` : ''}`)
    }
    found = matches[0]
    others = matches.slice(1, 6).map((o) => headCodePoints(o.key, RECALL_HIT_CODE_POINTS))
  } else throw new Error(`${RECALL_TOOL_NAME}: pass key, tool or pattern, e.g. {"key":"call_1"} or `
    + `{"pattern":"TypeError"}`)
  const lines = [...recallLineIter(await found.text())]
  if (offset > lines.length) {
    throw new Error(`${RECALL_TOOL_NAME}: offset ${offset} is past the end of ${found.key} (${lines.length} lines)`)
  }
  // a key is the model's own call id, of any length: the answer quotes at most RECALL_HIT_CODE_POINTS of it
  const key = headCodePoints(found.key, RECALL_HIT_CODE_POINTS), whole = key === found.key
  const head = (to: number) => `${key}${whole ? '' : '…'} (${found!.label}), lines ${offset}–${to} of `
    + `${lines.length}:`
  const page = pageOf(lines, offset - 1, limit, codePointLength(head(lines.length)) + 1)
  const notes: string[] = []
  if (page.to < lines.length) notes.push(`more: ${RECALL_TOOL_NAME} `
    + `${whole ? JSON.stringify({ key, offset: page.to + 1 }) : `with the same key and "offset": ${page.to + 1}`}`
    + `${lines[page.to - 1][1] ? ' — the line goes on there' : ''}`)
  if (others.length) notes.push(`older results of ${args.tool}: ${others.join(', ')}`)
  return `${head(page.to)}\n${page.text}${notes.length ? `\n[${notes.join('; ')}]` : ''}`
}

/** UTF-8 byte length of `text`, counting only up to `limit + 1` (O(min(length, limit))). */
function utf8Length(text: string, limit = Infinity): number {
  let bytes = 0
  for (let i = 0; i < text.length && bytes <= limit; i++) {
    const c = text.charCodeAt(i)
    if (c < 0x80) bytes += 1
    else if (c < 0x800) bytes += 2
    else if (isHigh(c) && isLow(text.charCodeAt(i + 1))) { bytes += 4; i++ }
    else bytes += 3
  }
  return bytes
}

/** A spill's artefact name, from the event seq, never a server-chosen call id (docs/design.md §13). */
function spillName(seq: number): string { return `tool-result-${seq}.txt` }

/**
 * Spill (docs/design.md §5): a result over `spillBytes` goes whole to the artefacts, a preview stays. When the
 * store cannot take the artefact, the result stays inline whole, with a `warning` saying why.
 */
/** The longest call id (UTF-16 units) a spill note repeats as its recall key. */
const RECALL_KEY_MAX_UNITS = 200

async function spillToolResult(message: ToolResultMessage, store: LogStore, spillBytes: number, name: string,
  recall = false): Promise<{ message: ToolResultMessage; spilled?: { ref: string; bytes: number }; warning?: string }> {
  if (!store.putArtefact) return { message }
  const texts = message.content.filter((b) => b.type === 'text') as TextBlock[]
  // Length first: a UTF-16 unit is 1 to 3 UTF-8 bytes, so most results are decided without a walk.
  let units = 0
  for (const t of texts) units += t.text.length
  if (units * 3 <= spillBytes) return { message }
  if (units <= spillBytes) {
    let bytes = 0
    for (const t of texts) { bytes += utf8Length(t.text, spillBytes - bytes); if (bytes > spillBytes) break }
    if (bytes <= spillBytes) return { message }
  }
  const whole = texts.map((t) => t.text).join('')
  const fullBytes = utf8Length(whole)
  let ref: string
  try { ref = await store.putArtefact(name, whole) } catch (err) {
    return { message, warning: `a tool result of ${fullBytes} bytes (call ${echo(message.toolCallId)}) is kept inline, `
      + `not spilled: storing it as artefact ${name} failed (${(err as Error)?.message ?? err}); the ladder prunes it `
      + `like any other result. Free disk space or fix the store's artefact area to spill the next ones` }
  }
  // The note goes where the cut is (an output may hold the plain marker itself), with the call that reads it back
  // when the agent offers recall (and the call's id is short enough to be worth repeating: a model chose it).
  const read = recall && message.toolCallId.length <= RECALL_KEY_MAX_UNITS
    ? `; ${RECALL_TOOL_NAME} ${JSON.stringify({ key: message.toolCallId })} reads them` : ''
  const preview = markedCut(whole, DEFAULT_PRUNE_CONFIG, `\n\n[... tool result middle spilled: all ${fullBytes} bytes `
    + `are stored at ${ref}${read} ...]\n\n`)
  const content: Block[] = [{ type: 'text', text: preview }, ...message.content.filter((b) => b.type !== 'text')]
  return { message: { ...message, content }, spilled: { ref, bytes: fullBytes } }
}

// ═══════════════════════════════════════
// 7. Stream out — the surface to a request body, and the adapter
// ═══════════════════════════════════════

// The only part of dsh.ts that talks to a model. A wire format is a WireFormat: a body writer (7.1 for
// OpenAI chat completions; section 14 holds Anthropic Messages) and an event mapper into section 2's
// reply assembler. The adapter (7.3) POSTs with stream: true, reads the reply through section 2 and
// retries the transient failures. Web standards only (fetch, streams, TextDecoder, AbortController).

// ── 7.0 Configuration ─────────────────────────────

/** DeepSeek's OpenAI-compatible endpoint (docs/design.md §6; api-docs.deepseek.com). */
const DEEPSEEK_BASE_URL = 'https://api.deepseek.com'
/** The model {@link deepseek} uses when none is given (docs/design.md §6). */
const DEEPSEEK_DEFAULT_MODEL = 'deepseek-flash'
/** The environment variable {@link deepseek} reads the API key from when no `apiKey` is given. */
const DEEPSEEK_API_KEY_ENV = 'DEEPSEEK_API_KEY'
/** Deadline of one `complete()` call, retries and backoff included: 1 hour; past it TIMEOUT, not retried. */
const REQUEST_TIMEOUT_MS = 3_600_000
/** Completion budget in tokens when neither the request nor the options set one (docs/design.md §6). */
const DEFAULT_MAX_TOKENS = 32_768
/** No progress (response headers or a data event; keep-alive comments do not count) for this long: TIMEOUT. */
const IDLE_TIMEOUT_MS = 300_000
/** Retries after the first attempt, for RATE_LIMIT, SERVER, TRANSPORT, TIMEOUT, EMPTY_RESPONSE. */
const MAX_RETRIES = 5
/** Retries of a refused connection or a failed DNS lookup (at most):
 *  no server is listening there, so five backoffs (~16 s) only make the user wait. */
const CONNECT_FAILURE_RETRIES = 1
/** A case-insensitive RegExp of any of `sources`; called pure, so a bundle without the provider drops the table. */
function anyOf(sources: readonly string[]): RegExp {
  return new RegExp(sources.join('|'), 'i')
}
/** Error codes and wordings of a refused connection or a failed DNS lookup (Node's undici, Deno, Bun). */
const CONNECT_FAILURE_CODES =
  new Set(['ECONNREFUSED', 'ENOTFOUND', 'EAI_AGAIN', 'EAI_NONAME', 'EAI_FAIL', 'ConnectionRefused'])
const CONNECT_FAILURE_RE = /* @__PURE__ */ anyOf(['ECONNREFUSED', 'ENOTFOUND', 'EAI_AGAIN', 'connection refused',
  'failed to lookup address', 'dns error', 'name or service not known', 'unable to connect'])
/** Fetch failures no retry can mend, so none is made: a port fetch blocks (undici "bad port", Deno), an invalid
 *  URL, a header fetch refuses (a request's), a runtime's permission denial (Deno's NotCapable / PermissionDenied).
 *  Matched on a cause's name, code, text. */
const FAIL_FAST_RE = /* @__PURE__ */ anyOf(['bad port', 'port \\d+ (?:is|are) blocked', 'ERR_INVALID_URL',
  'invalid url', 'failed to parse url', 'url is invalid', 'invalid header', 'NotCapable', 'PermissionDenied',
  'requires net access'])
/** First backoff delay in ms; doubles per retry up to {@link RETRY_MAX_MS} (docs/design.md §6). */
const RETRY_BASE_MS = 500
/** Longest wait between attempts in ms, also the cap on a server's `Retry-After`. */
const RETRY_MAX_MS = 10_000
/** Backoff delays are multiplied by a random factor in [1 − r, 1 + r] so clients do not stampede. */
const RETRY_JITTER_RATIO = 0.1
/** Largest unterminated SSE line plus event data the adapter buffers, in UTF-16 units. */
const SSE_MAX_BUFFER_UNITS = 16 * 1024 * 1024
/** Error bodies are read for classification up to this many UTF-16 units. */
const ERROR_BODY_MAX_UNITS = 64 * 1024
/** An error body is read up to this many bytes (after content decoding), then the rest is cancelled
 *  unread: a gzip bomb is never inflated (docs/design.md §13). A non-streamed answer may take
 *  `2 × MAX_MESSAGE_BYTES` more (JSON escapes), its message then capped like a streamed one. */
const RESPONSE_BODY_MAX_BYTES = 64 * 1024
/** Cap on one assistant message: text, reasoning, tool-call ids, names and arguments, UTF-8 bytes (§13). */
const MAX_MESSAGE_BYTES = 8 * 1024 * 1024
/** Tool calls one assistant message may hold; past it RESPONSE_TOO_LARGE (each call costs memory and a result). */
const MAX_TOOL_CALLS_PER_MESSAGE = 1_000
/** Same-origin 307/308 redirects followed per attempt, at most. */
const MAX_REDIRECTS = 5
/** String values longer than this (UTF-16 units) are elided when a non-text block is sent as JSON text. */
const DESCRIBED_STRING_MAX_UNITS = 1024

/** What dsh knows about a model by name: its context window and output cap, in tokens. */
export interface KnownModel {
  /** Context window in tokens (prompt + completion). */
  contextWindow: number
  /** Largest `max_tokens` the model accepts, in tokens; the adapter clamps to it. */
  maxOutputTokens: number
  /** For an older name or a retired alias: the model it stands for. The name is still sent as given. */
  aliasOf?: string
  /** For a retired alias: whether it meant thinking mode (informational; nothing extra is sent). */
  thinking?: 'enabled' | 'disabled'
}

/**
 * Known models, by the exact name sent as `model` (docs/design.md §6, public DeepSeek model cards,
 * 2026). Any other model needs `contextWindow` in the options, or the ladder reports a
 * configuration error once (docs/design.md §5).
 */
const KNOWN_MODELS: Readonly<Record<string, Readonly<KnownModel>>> = /* @__PURE__ */ Object.freeze({
  // DeepSeek-V4.1-Flash (accepts image input); its older name deepseek-v4-flash is served by it.
  'deepseek-flash': /* @__PURE__ */ Object.freeze({ contextWindow: 1_048_576, maxOutputTokens: 384_000 }),
  'deepseek-v4-pro': /* @__PURE__ */ Object.freeze({ contextWindow: 1_048_576, maxOutputTokens: 384_000 }),
  'deepseek-v4-flash': /* @__PURE__ */ Object.freeze({ contextWindow: 1_048_576, maxOutputTokens: 384_000,
    aliasOf: 'deepseek-flash' }),
  'deepseek-chat': /* @__PURE__ */ Object.freeze({ contextWindow: 1_048_576, maxOutputTokens: 384_000,
    aliasOf: 'deepseek-flash', thinking: 'disabled' as const }),
  'deepseek-reasoner': /* @__PURE__ */ Object.freeze({ contextWindow: 1_048_576, maxOutputTokens: 384_000,
    aliasOf: 'deepseek-flash', thinking: 'enabled' as const }),
})

/**
 * DeepSeek's peak hours: Monday to Friday, UTC 01:00–04:00 and 06:00–10:00, every price doubled
 * (DeepSeek, "Models & Pricing", api-docs.deepseek.com/quick_start/pricing, autumn 2026).
 */
const DEEPSEEK_PEAK_HOURS: Readonly<PeakHours> = /* @__PURE__ */ Object.freeze({
  multiplier: 2, days: /* @__PURE__ */ Object.freeze([1, 2, 3, 4,
    5]), hoursUTC: /* @__PURE__ */ Object.freeze([/* @__PURE__ */ Object.freeze([1,
    4] as const), /* @__PURE__ */ Object.freeze([6, 10] as const)]),
})

/**
 * DeepSeek's prices in USD per million tokens, off-peak, with {@link DEEPSEEK_PEAK_HOURS}
 * (DeepSeek, "Models & Pricing", api-docs.deepseek.com/quick_start/pricing, autumn 2026; docs/design.md §11):
 * `deepseek-flash` (and its older name `deepseek-v4-flash`) cache hit 0.003, cache miss 0.15,
 * output 0.60; `deepseek-v4-pro` 0.022 / 0.66 / 1.98. {@link deepseek} uses them by default;
 * {@link pricesOf} also resolves the retired aliases of {@link KNOWN_MODELS}. Every other model
 * has no price unless one is given.
 */
const DEEPSEEK_PRICES: Readonly<Record<string, Readonly<Prices>>> = /* @__PURE__ */ Object.freeze({
  'deepseek-flash': /* @__PURE__ */ Object.freeze({ cacheHitInput: 0.003, cacheMissInput: 0.15, output: 0.6,
    peak: DEEPSEEK_PEAK_HOURS }),
  'deepseek-v4-flash': /* @__PURE__ */ Object.freeze({ cacheHitInput: 0.003, cacheMissInput: 0.15, output: 0.6,
    peak: DEEPSEEK_PEAK_HOURS }),
  'deepseek-v4-pro': /* @__PURE__ */ Object.freeze({ cacheHitInput: 0.022, cacheMissInput: 0.66, output: 1.98,
    peak: DEEPSEEK_PEAK_HOURS }),
})

/** DeepSeek's price table for `model` (a retired alias resolves to the model it stands for); undefined for any other
 *  model. */
function pricesOf(model: string): Readonly<Prices> | undefined {
  const own = Object.prototype.hasOwnProperty.call(DEEPSEEK_PRICES, model) ? DEEPSEEK_PRICES[model] : undefined
  const alias = Object.prototype.hasOwnProperty.call(KNOWN_MODELS, model) ? KNOWN_MODELS[model].aliasOf : undefined
  return own ?? (alias !== undefined ? pricesOf(alias) : undefined)
}

// ── 7.1 Messages on the wire (OpenAI chat-completions shape) ────────────────

type WirePart = { type: 'text'; text: string } | { type: 'image_url'; image_url: { url: string } }
type WireMessage =
  | { role: 'system'; content: string }
  | { role: 'user'; content: string | WirePart[] }
  | { role: 'assistant'; content: string; reasoning_content?: string; tool_calls?: WireToolCall[] }
  | { role: 'tool'; tool_call_id: string; content: string }
interface WireToolCall { id: string; type: 'function'; function: { name: string; arguments: string } }

const LONE_SURROGATE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/
const LONE_SURROGATES = /* @__PURE__ */ new RegExp(LONE_SURROGATE.source, 'g')

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

/** A value as JSON text on the wire: every string well-formed ({@link wireReplacer}). */
const wireJSON = (value: unknown): string => JSON.stringify(value, wireReplacer)

/** A tool's parameters as sent: an empty object schema when it has none. */
const schemaOf = (t: ToolSpec): Record<string, unknown> => t.parameters ?? { type: 'object', properties: {} }

/**
 * A request body of both formats from its `fields` in order (a value is JSON text; undefined leaves it out), after
 * the extra body fields it does not set, each left out as JSON.stringify would leave it (undefined, a function, a
 * symbol) (docs/design.md §11: the fixed order keeps one request's body
 * a byte prefix of the next one's up to its last message).
 */
function bodyOf(extraBody: Record<string, unknown> | undefined, fields: [string, string | undefined][]): string {
  const own = new Set(fields.filter(([, value]) => value !== undefined).map(([key]) => key))
  const out: string[] = []
  for (const [key, value] of Object.entries(extraBody ?? {})) {
    const text = own.has(key) ? undefined : wireJSON(value) // undefined (as JSON.stringify): a field left out
    if (text !== undefined) out.push(`${wireJSON(key)}:${text}`)
  }
  for (const [key, value] of fields) if (value !== undefined) out.push(`${wireJSON(key)}:${value}`)
  return `{${out.join(',')}}`
}

/** A non-text block as JSON text; long strings (base64 images) are elided, not sent as text. */
function describeBlock(block: Block): string {
  return JSON.stringify(block, (_key, value: unknown) =>
    typeof value === 'string' && value.length > DESCRIBED_STRING_MAX_UNITS
      ? `[${value.length} characters omitted]` : value)
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
 * docs/design.md §6: `content` is never null ("" when there is no text); a message with tool calls
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
      toolCalls.push({ id: call.id, type: 'function',
        function: { name: call.name, arguments: call.arguments.trim() === '' ? '{}' : call.arguments } })
    } else text += (text ? '\n' : '') + describeBlock(b)
  }
  if (toolCalls.length === 0) return { role: 'assistant', content: text }
  return { role: 'assistant', content: text, reasoning_content: reasoning, tool_calls: toolCalls }
}

function toWire(message: Message): WireMessage {
  if (message.role === 'user') return userToWire(message)
  if (message.role === 'assistant') return assistantToWire(message)
  if (message.role === 'tool')
    return { role: 'tool', tool_call_id: message.toolCallId, content: blocksToText(message.content) }
  throw new TypeError(`unknown message role ${JSON.stringify((message as { role?: unknown }).role)}; expected 'user', `
    + `'assistant' or 'tool'`)
}

/** The request's messages in chat-completions shape, in {@link wireOrder}. */
function toWireMessages(system: string | undefined, messages: readonly Message[]): WireMessage[] {
  const out: WireMessage[] = system ? [{ role: 'system', content: system }] : []
  for (const m of wireOrder(messages)) out.push(toWire(m))
  return out
}

/**
 * The messages in the order both wire formats need: as logged, except that every tool result is
 * moved right behind the nearest earlier assistant message that made its call (matched by id): the
 * session may legally hold A-call, B-call, A-result, B-result, but servers require each call's
 * results to follow it directly. Results of the same call keep log order.
 */
function wireOrder(messages: readonly Message[]): readonly Message[] {
  if (!messages.some((m) => m.role === 'tool')) return messages
  const out: Message[] = []
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
    out.push(m)
    for (const j of resultsOf.get(i) ?? []) out.push(messages[j])
  })
  return out
}

// ── 7.3 The adapter ──────────────────────────────

/** Options of {@link openAICompatible}. Times in ms, budgets in tokens. */
export interface OpenAICompatibleOptions {
  /** Server root; the adapter POSTs to `{baseURL}/chat/completions`. E.g. `https://api.openai.com/v1`. */
  baseURL: string
  /**
   * Sent as `Authorization: Bearer …`; never appears in errors. A key in the environment is passed as read there
   * (`apiKey: process.env.OPENAI_API_KEY`, Deno's `Deno.env.get(…)`, a Worker's `env` binding).
   */
  apiKey?: string
  /** Model name sent as `model`. */
  model: string
  /** Context window in tokens. Default: {@link KNOWN_MODELS}, else unknown (no clamping, no preflight). */
  contextWindow?: number
  /** Completion budget in tokens when a request sets none. Default {@link DEFAULT_MAX_TOKENS}; always clamped. */
  maxTokens?: number
  /** Extra HTTP headers on every request, a plain object of strings (a request's own `headers` win). */
  headers?: Record<string, string>
  /** Replacement for `globalThis.fetch` (proxies, tests). */
  fetch?: (input: string, init: RequestInit) => Promise<Response>
  /** Extra body fields (a plain object), e.g. `temperature`, or DeepSeek's `thinking: {type: 'enabled'}` and
   *  `reasoning_effort`; one left undefined is not sent; the adapter's own fields win. A `max_completion_tokens`
   *  key (any value but undefined; OpenAI's reasoning models refuse `max_tokens`) makes the clamped budget go under
   *  that name. */
  extraBody?: Record<string, unknown>
  /**
   * The model's price table, USD per million tokens (docs/design.md §11). Default: none for
   * {@link openAICompatible} (cost "unknown"); {@link deepseek} uses {@link pricesOf} the model.
   * @throws TypeError at construction for a malformed table (the message names the field).
   */
  prices?: Prices
}

const OPTION_NAMES: readonly (keyof OpenAICompatibleOptions)[] = [
  'baseURL', 'apiKey', 'model', 'contextWindow', 'maxTokens', 'headers', 'fetch', 'extraBody', 'prices',
]

/**
 * The adapter's times, retries and message cap: the constants above, read when a provider is made. Its test seam
 * (`internals.tuning.adapter`, docs/design.md §14): a test sets a field, makes its provider, and sets it back.
 */
const adapterTuning = { idleTimeoutMs: IDLE_TIMEOUT_MS, requestTimeoutMs: REQUEST_TIMEOUT_MS, maxRetries: MAX_RETRIES,
  retryBaseMs: RETRY_BASE_MS, retryMaxMs: RETRY_MAX_MS, maxMessageBytes: MAX_MESSAGE_BYTES, sleep: sleepMs }

/**
 * What differs between the wire formats; everything else (retries, SSE, errors, the assembler) is
 * shared. `event` maps one parsed data event into the assembler and says whether the stream ended;
 * `whole` maps a non-streamed answer.
 */
interface WireFormat {
  path: string
  /** The path and the body of a token count, where the format has one. */
  count?: { path: string; body(cfg: AdapterConfig, request: ChatRequest): string }
  /** Events of other names than `message` carry data (Anthropic names every event). */
  namedEvents: boolean
  authHeaders(apiKey: string | undefined): Record<string, string>
  body(cfg: AdapterConfig, request: ChatRequest, maxTokens: number): string
  event(acc: ReplyAssembler, obj: unknown, data: string): boolean
  whole(acc: ReplyAssembler, obj: unknown, data: string): void
}

interface AdapterConfig extends Readonly<typeof adapterTuning> {
  format: WireFormat
  /** What the format keeps of the requests sent, newest first (Anthropic's: their prefixes, for cache breakpoints). */
  sent: unknown[]
  baseURL: string
  endpoint: string
  model: string
  apiKey?: string
  contextWindow?: number
  maxOutputTokens?: number
  maxTokens: number
  headers: Record<string, string>
  fetch: (input: string, init: RequestInit) => Promise<Response>
  extraBody: Record<string, unknown>
  prices?: Prices
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

/** The `headers` option: a plain object of header names to strings (undefined values left out). */
function headersOf(fn: string, headers: unknown): Record<string, string> {
  if (headers === undefined) return {}
  const fields = plainFields(`${fn}: headers`, headers,
    "a plain object of header names to strings, e.g. { 'x-id': 'a' }")
  for (const [name, value] of fields) {
    if (typeof value !== 'string') throw new TypeError(`${fn}: headers[${JSON.stringify(name)}] must be a string, `
      + `got ${shown(value)}`)
  }
  return Object.fromEntries(fields) as Record<string, string>
}

function positiveInteger(fn: string, name: string, value: unknown, allowZero = false): number | undefined {
  if (value === undefined) return undefined
  if (!isIntegerAtLeast(value, allowZero ? 0 : 1)) {
    throw new TypeError(`${fn}: ${name} must be ${allowZero ? 'a non-negative' : 'a positive'} integer, `
      + `got ${shown(value)}`)
  }
  return value
}

/**
 * The API key of `fn` from the environment variable `name`, for a request to `url` (`baseURL` as given). Throws
 * TypeError when it is not set, and for an `http:` URL: a key read from the environment goes only over https
 * (docs/design.md §13), whichever adapter reads it.
 */
function keyFromEnv(fn: string, name: string, url: URL, baseURL: string): string {
  if (url.protocol !== 'https:') {
    throw new TypeError(`${fn}: baseURL ${JSON.stringify(baseURL)} would send the API key unencrypted; use `
      + `https://${url.host} ($${name} goes only over https)`)
  }
  const key = readEnv(name)
  if (!key) {
    throw new TypeError(`${fn}: no API key: the environment variable ${name} is not set or not readable in this `
      + `runtime (Deno needs --allow-env=${name}); set it or pass { apiKey }`)
  }
  return key
}

/**
 * A provider from the options of `fn` over `defaults` (of the options given; an undefined value keeps the default):
 * a plain object of known keys, an absolute http(s) `baseURL`, a `model`; the API key from `apiKey`, else the
 * variable named by `keyEnv(host)` (then required, and sent only over `https:`). `check` sees the URL and
 * whether the caller named a key. Throws TypeError naming the option and the fix.
 */
function makeProvider(fn: string, options: unknown,
  defaults: (given: Record<string, unknown>) => Partial<OpenAICompatibleOptions>, format: WireFormat,
  keyEnv: (host: string) => string | undefined = () => undefined,
  check?: (url: URL, explicitKey: boolean, base: string) => void): Provider {
  const given: Record<string, any> = Object.fromEntries(plainFields(`${fn}: options`, options,
    'a plain object of options'))
  for (const key of Object.keys(given)) {
    if (!OPTION_NAMES.includes(key as keyof OpenAICompatibleOptions)) {
      throw removedOption(REMOVED_OPTIONS.provider, fn, key) ?? new TypeError(`${fn}: unknown option "${key}"; `
        + `known options: ${OPTION_NAMES.join(', ')} (a field of the server's API, e.g. thinking or reasoning_effort, `
        + 'goes in extraBody)')
    }
  }
  const o: Record<string, any> = { ...defaults(given), ...given }
  const { baseURL, model } = o
  let url: URL
  try { url = new URL(String(baseURL)) } catch {
    throw new TypeError(`${fn}: baseURL must be an absolute http(s) URL such as https://api.deepseek.com, `
      + `got ${shown(baseURL)}`)
  }
  if (url.protocol !== 'http:' && url.protocol !== 'https:')
    throw new TypeError(`${fn}: baseURL must use http or https, got ${shown(baseURL)}`)
  if (typeof model !== 'string' || model.trim() === '')
    throw new TypeError(`${fn}: model must be a non-empty string, got ${shown(model)}`)
  let apiKey = o.apiKey === '' ? undefined : o.apiKey
  if (apiKey !== undefined && typeof apiKey !== 'string') throw new TypeError(`${fn}: apiKey must be a string`)
  const explicitKey = apiKey !== undefined, envName = explicitKey ? undefined : keyEnv(url.hostname)
  if (envName !== undefined) apiKey = keyFromEnv(fn, envName, url, String(baseURL))
  const base = String(baseURL).replace(/\/+$/, '')
  check?.(url, explicitKey, base)
  const known = Object.hasOwn(KNOWN_MODELS, model) ? KNOWN_MODELS[model] : undefined
  // unbound fetch throws "Illegal invocation" in workerd
  const fetchImpl = o.fetch ?? ((input: string, init: RequestInit) => globalThis.fetch(input, init))
  if (typeof fetchImpl !== 'function') throw new TypeError(`${fn}: fetch must be a function`)
  const cfg: AdapterConfig = {
    ...adapterTuning, format, sent: [], baseURL: base, endpoint: `${base}${format.path}`, model, apiKey,
    contextWindow: positiveInteger(fn, 'contextWindow', o.contextWindow) ?? known?.contextWindow,
    maxOutputTokens: known?.maxOutputTokens,
    maxTokens: positiveInteger(fn, 'maxTokens', o.maxTokens) ?? DEFAULT_MAX_TOKENS,
    headers: headersOf(fn, o.headers), fetch: fetchImpl, extraBody: Object.fromEntries(o.extraBody === undefined ? []
      : plainFields(`${fn}: extraBody`, o.extraBody, 'a plain object of body fields, e.g. { temperature: 0 }')),
    // a default is one of dsh's own frozen tables
    prices: given.prices === undefined ? o.prices : validatePrices(o.prices, `${fn}: prices`),
  }
  requestHeaders(cfg, { messages: [] }, `${fn}: apiKey or headers`) // once here, not by each complete()
  return {
    model, baseURL: base, contextWindow: cfg.contextWindow, maxTokens: cfg.maxTokens,
    ...(cfg.prices ? { prices: cfg.prices } : {}),
    complete: (request) => completeWithRetries(cfg, request),
    ...(format.count ? { countTokens: (request: ChatRequest) => countTokens(cfg, request) } : {}),
  }
}

/**
 * A {@link Provider} for any server that speaks OpenAI chat completions with streaming (docs/design.md
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
 * are retried ({@link MAX_RETRIES} times; a refused connection or failed DNS lookup at most once; backoff from
 * {@link RETRY_BASE_MS} doubling, ±10% jitter, `Retry-After` honoured up to {@link RETRY_MAX_MS}, a `{type:'retry'}`
 * event before each wait), but never once output
 * was streamed — then the error carries `partial` (text and reasoning so far, `interrupted: true`; tool calls are
 * dropped since their arguments may be cut). A "request too large for the per-minute budget" rate limit is not retried
 * (it can never pass). ABORTED (the request's signal) ends at once, also during a backoff wait, and is never retried.
 * The API key never appears in an error.
 *
 * Limits on what a server can make the adapter read (docs/design.md §13): an error body or a
 * non-streamed body is read up to {@link RESPONSE_BODY_MAX_BYTES} (64 KiB, after gzip decoding)
 * and the rest cancelled unread; one assistant message up to {@link MAX_MESSAGE_BYTES} (8 MiB of text,
 * reasoning and tool-call ids, names and arguments, counted as they arrive) and 1,000 tool calls, past
 * which RESPONSE_TOO_LARGE carries the partial; {@link IDLE_TIMEOUT_MS} (5 minutes) without progress ends an
 * attempt, {@link REQUEST_TIMEOUT_MS} (1 hour) the whole call. Redirects are not followed across origins (only a
 * same-origin 307/308).
 * @throws TypeError for bad options (unknown keys, bad URL, missing key, `headers` or `extraBody`
 *   not a plain object, an option whose getter throws), naming the option and the value as given.
 */
function openAICompatible(options: OpenAICompatibleOptions): Provider {
  return makeProvider('openAICompatible', options, () => ({}), OPENAI_FORMAT)
}

/**
 * {@link openAICompatible} with DeepSeek's defaults: base {@link DEEPSEEK_BASE_URL}, model
 * {@link DEEPSEEK_DEFAULT_MODEL}, key from `apiKey` or else `$DEEPSEEK_API_KEY` (required).
 * Undefined option values fall back to the defaults. The key is sent only over `https:`, and
 * `$DEEPSEEK_API_KEY` only to DeepSeek's host (docs/design.md §13).
 * @throws TypeError when no key can be found, for a non-https `baseURL`, for another host without
 *   an explicit `apiKey`, or for bad options.
 */
function deepseek(options: Partial<OpenAICompatibleOptions> = {}): Provider {
  const host = new URL(DEEPSEEK_BASE_URL).hostname
  const defaults = (given: Record<string, unknown>): Partial<OpenAICompatibleOptions> => {
    const model = typeof given.model === 'string' ? given.model : DEEPSEEK_DEFAULT_MODEL
    return { baseURL: DEEPSEEK_BASE_URL, model, prices: pricesOf(model) }
  }
  // $DEEPSEEK_API_KEY is read for DeepSeek's own host only: another host gets the host rule below, not "set it"
  const keyEnv = (h: string) => (h === host ? DEEPSEEK_API_KEY_ENV : undefined)
  return makeProvider('deepseek', options, defaults, OPENAI_FORMAT, keyEnv,
    (url, explicitKey, base) => {
      // The key goes only over https: (docs/design.md §13); $DEEPSEEK_API_KEY only to DeepSeek's own host.
      if (url.protocol !== 'https:') {
        throw new TypeError(`deepseek: baseURL ${JSON.stringify(base)} would send the API key unencrypted; use `
          + `https:// (or openAICompatible for a local server)`)
      }
      if (!explicitKey && url.hostname !== host) {
        throw new TypeError(`deepseek: $${DEEPSEEK_API_KEY_ENV} is only sent to ${host}, not to ${url.hostname}; `
          + `pass that server's apiKey`)
      }
    })
}

/**
 * How many retries a TRANSPORT error may get, by its cause's name, code or wording: none when no
 * retry can succeed ({@link FAIL_FAST_RE}), {@link CONNECT_FAILURE_RETRIES} for a refused connection
 * or a failed DNS lookup; otherwise `maxRetries`.
 */
function transportRetries(error: ProviderError, maxRetries: number): number {
  if (error.code !== 'TRANSPORT') return maxRetries
  let e: unknown = error.cause
  let retries = maxRetries
  for (let depth = 0; e !== null && typeof e === 'object' && depth < 4; depth++, e = (e as { cause?: unknown }).cause) {
    const { code, message, name } = e as { code?: unknown; message?: unknown; name?: unknown }
    const text = `${String(name ?? '')} ${String(code ?? '')} ${String(message ?? '')}`
    if (FAIL_FAST_RE.test(text)) return 0
    if ((typeof code === 'string' && CONNECT_FAILURE_CODES.has(code))
      || CONNECT_FAILURE_RE.test(String(message ?? ''))) retries = Math.min(maxRetries, CONNECT_FAILURE_RETRIES)
  }
  return retries
}

/** Errors never retried: raised after output was streamed (a retry would show the caller a second
 *  answer), or past the request deadline. */
const notRetried = new WeakSet<ProviderError>()
/** Errors of a stream that broke after output (not past the deadline): the loop retries those once as a new step. */
const afterOutput = new WeakSet<ProviderError>()
const RETRYABLE = new Set<ProviderErrorCode>(['RATE_LIMIT', 'SERVER', 'TRANSPORT', 'TIMEOUT', 'EMPTY_RESPONSE'])

/** An exception thrown by the caller's onEvent: passed through unchanged, never retried. */
class ListenerFailure { constructor(readonly error: unknown) {} }

function redact(text: string, secret: string | undefined): string {
  return secret && secret.length >= 4 && text.includes(secret) ? text.split(secret).join('[REDACTED]') : text
}

function providerError(cfg: AdapterConfig, code: ProviderErrorCode, message: string,
  init: ConstructorParameters<typeof ProviderError>[2] = {}): ProviderError {
  const body = init.body === undefined ? undefined : redact(init.body, cfg.apiKey)
  return new ProviderError(code, redact(`${code}: ${message} ${ERROR_HINTS[code]}`, cfg.apiKey), { ...init, body })
}

function maxTokensFor(cfg: AdapterConfig, request: ChatRequest): number {
  const requested = positiveInteger('complete', 'request.maxTokens', request.maxTokens) ?? cfg.maxTokens
  const capped = cfg.maxOutputTokens === undefined ? requested : Math.min(requested, cfg.maxOutputTokens)
  const window = cfg.contextWindow
  if (window === undefined) return capped
  if (request.inputTokens !== undefined && !(typeof request.inputTokens === 'number'
    && Number.isFinite(request.inputTokens) && request.inputTokens >= 0)) {
    throw new TypeError(`complete: request.inputTokens must be a non-negative number of tokens, `
      + `got ${shown(request.inputTokens)}`)
  }
  const prompt = request.inputTokens ?? estimateRequestTokens({ system: request.system, tools: request.tools },
    request.messages)
  const room = window - prompt
  if (room < 1) {
    throw providerError(cfg, 'CONTEXT_WINDOW_EXCEEDED',
      `preflight: nothing was sent. The prompt is estimated at ${prompt} tokens and the context window of ${cfg.model} `
        + `is ${window} tokens, leaving ${room} for the completion (at least 1 is needed); `
        + `pass contextWindow if ${window} is wrong.`)
  }
  return Math.min(capped, room)
}

/**
 * The budget a refusal says fits (tokens): its window minus its prompt, when it refused the `budget` sent as too
 * large for them (vLLM: "'max_tokens' … is too large: 32768. This model's maximum context length is 4096 tokens and
 * your request has 100 input tokens"); else undefined. The body must name that budget and output words.
 */
function budgetThatFits(error: ProviderError, budget: number): { budget: number } | undefined {
  if (error.code !== 'INVALID_REQUEST' && error.code !== 'CONTEXT_WINDOW_EXCEEDED') return undefined
  const text = error.body || error.message
  if (!OUTPUT_NEAR.test(text) || !new RegExp(`(?<![\\d,.])${budget}(?![\\d,]|\\.\\d)`).test(text)) return undefined
  const { promptTokens: prompt, contextTokens: window } = overflowCounts(text)
  if (prompt === undefined || window === undefined) return undefined
  const room = window - prompt
  return room >= 1 && room < budget ? { budget: room } : undefined
}

/** The tool specs of an envelope as wire JSON, serialised once per tools array (the Agent keeps one per envelope). */
const toolsJSON = new WeakMap<readonly ToolSpec[], string>()

/**
 * The request body (docs/design.md §11 "byte stability"). Keys in a fixed order — extra body fields,
 * model, tools, messages, then the per-request fields (stream,
 * stream_options, the budget) — and nothing per-request inside a message, so for unchanged
 * history the body of one request is a byte prefix of the next one's up to the end of its last
 * message. The tools are serialised once per tools array: do not mutate one after sending it.
 */
function requestBody(cfg: AdapterConfig, request: ChatRequest, maxTokens: number): string {
  const budgetField = Object.hasOwn(cfg.extraBody, 'max_completion_tokens') ? 'max_completion_tokens' : 'max_tokens'
  const tools = request.tools && request.tools.length > 0 ? request.tools : undefined
  let toolsText = tools && toolsJSON.get(tools)
  if (tools && toolsText === undefined) {
    toolsText = wireJSON(tools.map((t) => ({ type: 'function', function: { name: t.name,
      ...(t.description !== undefined ? { description: t.description } : {}), parameters: schemaOf(t) } })))
    toolsJSON.set(tools, toolsText)
  }
  return bodyOf(cfg.extraBody, [['model', wireJSON(cfg.model)], ['tools', toolsText],
    ['messages', `[${toWireMessages(request.system, request.messages).map(wireJSON).join(',')}]`],
    ['stream', 'true'], ['stream_options', '{"include_usage":true}'], [budgetField, String(maxTokens)]])
}

/** The headers of a request: JSON, SSE, the format's key and version headers, then the caller's (lower-cased, so
 *  that a caller's `Authorization` replaces ours instead of being joined to it). */
function requestHeaders(cfg: AdapterConfig, request: ChatRequest, what = 'request.headers'): Record<string, string> {
  const headers: Record<string, string> = { 'content-type': 'application/json', accept: 'text/event-stream',
    ...cfg.format.authHeaders(cfg.apiKey) }
  for (const extra of [cfg.headers, request.headers ?? {}]) {
    for (const [name, value] of Object.entries(extra)) if (value !== undefined) headers[name.toLowerCase()] = value
  }
  // Checked before any fetch: its TypeError would be retried as TRANSPORT, the key in its message
  try { new Headers(headers) } catch {
    throw new TypeError(`${what} cannot be sent as HTTP headers (a line break, or a character past U+00FF such `
      + 'as a typographic quote or a zero-width space, copied with the key?); the value is not shown')
  }
  return headers
}

/**
 * The server's count of a request's prompt, in tokens (Anthropic's `count_tokens`, which llama.cpp's
 * server serves too): one attempt, its errors classified like those of `complete()`.
 */
async function countTokens(cfg: AdapterConfig, request: ChatRequest): Promise<number> {
  if (!isRecord(request) || !Array.isArray(request.messages))
    throw new TypeError('countTokens(request): request.messages must be an array of messages')
  const count = cfg.format.count!
  const at = { ...cfg, endpoint: `${cfg.baseURL}${count.path}` }
  return attempt(at, request, count.body(cfg, request), requestHeaders(cfg, request), Date.now() + cfg.requestTimeoutMs,
    async (response, acc, signal) => {
      const { text, cut } = await readBodyCapped(response, RESPONSE_BODY_MAX_BYTES, signal)
      if (!response.ok) throw httpError(at, response, text, cut, acc.requestId)
      const tokens = tokenCount((parseJSONOrUndefined(text) as { input_tokens?: unknown } | undefined)?.input_tokens)
      // a count, as usage is one (checkedUsage): an integer from 0 to USAGE_MAX_TOKENS
      if (tokens !== undefined && Number.isInteger(tokens) && tokens <= USAGE_MAX_TOKENS) return tokens
      throw providerError(at, 'MALFORMED_RESPONSE', `${at.endpoint} answered without input_tokens: `
        + `${text.slice(0, 200)}`, { status: response.status, body: text, requestId: acc.requestId })
    })
}

async function completeWithRetries(cfg: AdapterConfig, request: ChatRequest): Promise<ChatResponse> {
  if (!isRecord(request) || !Array.isArray(request.messages))
    throw new TypeError('complete(request): request.messages must be an array of messages')
  const { signal } = request
  const aborted = (): ProviderError => providerError(cfg, 'ABORTED', `request to ${cfg.endpoint} aborted before it `
    + `completed.`)
  if (signal?.aborted) throw aborted()
  let budget = maxTokensFor(cfg, request), refitted = false
  let body = cfg.format.body(cfg, request, budget)
  const headers = requestHeaders(cfg, request)
  const deadlineAt = Date.now() + cfg.requestTimeoutMs
  for (let retry = 0; ; retry++) {
    let error: ProviderError
    try {
      return await attempt(cfg, request, body, headers, deadlineAt)
    } catch (e) {
      if (e instanceof ListenerFailure) throw e.error
      if (!(e instanceof ProviderError)) throw e
      error = e
    }
    // A budget the server's window cannot hold with this prompt: sent again at once with the room it stated, the one
    // retry of its kind.
    // Not after output was streamed (a second answer) nor past the deadline; it spends none of the retries.
    // Per request: a statement is not kept for later ones, so a server that misstated its window once (a proxy's
    // error) cannot shrink every later budget.
    const fits = refitted || signal?.aborted || notRetried.has(error) ? undefined : budgetThatFits(error, budget)
    if (fits) {
      refitted = true
      budget = fits.budget
      body = cfg.format.body(cfg, request, budget)
      retry--
      continue
    }
    const retryable = RETRYABLE.has(error.code) && !notRetried.has(error)
      && !(error.code === 'RATE_LIMIT' && requestExceedsRateLimit(error.body))
    const maxRetries = transportRetries(error, cfg.maxRetries)
    if (!retryable || retry >= maxRetries) throw error
    const delayMs = error.retryAfterMs !== undefined
      ? Math.min(error.retryAfterMs, cfg.retryMaxMs)
      : Math.round(Math.min(cfg.retryMaxMs,
        cfg.retryBaseMs * 2 ** retry * (1 + (Math.random() * 2 - 1) * RETRY_JITTER_RATIO)))
    // no retry could start before the deadline
    if (Date.now() + delayMs >= deadlineAt) throw error
    request.onEvent?.({ type: 'retry', attempt: retry + 1, delayMs, error, maxRetries })
    try { await cfg.sleep(delayMs, signal) } catch (e) { if (signal?.aborted) throw aborted(); throw e }
    if (signal?.aborted) throw aborted()
  }
}

const OPENAI_FORMAT: WireFormat = {
  path: '/chat/completions',
  namedEvents: false,
  authHeaders: (apiKey): Record<string, string> => (apiKey === undefined ? {} : { authorization: `Bearer ${apiKey}` }),
  body: requestBody,
  event: openAIChunk,
  whole: openAIChunk,
}

const REDIRECT_STATUSES: ReadonlySet<number> = new Set([301, 302, 303, 307, 308])

/**
 * POSTs with `redirect: 'manual'` (docs/design.md §13): a 307/308 to the same origin is followed
 * (up to {@link MAX_REDIRECTS} times, the body re-sent); any other redirect — another origin, or
 * one that would turn the POST into a GET — is refused, so the conversation and the key never go
 * to a host the caller did not name.
 */
async function postFollowingSameOrigin(cfg: AdapterConfig, init: RequestInit, first = cfg.endpoint): Promise<Response> {
  const origin = new URL(first).origin
  let url = first
  for (let hops = 0; ; hops++) {
    const response = await fetchUnder(cfg, url, { ...init, redirect: 'manual' })
    if (response.type !== 'opaqueredirect' && !REDIRECT_STATUSES.has(response.status)) return response
    response.body?.cancel().catch(() => {})
    let target: URL | undefined
    try { target = new URL(response.headers.get('location') ?? '', url) } catch { target = undefined }
    const where = target && response.headers.get('location') ? target.href : 'an address the runtime does not show'
    const why = !target || response.type === 'opaqueredirect' ? 'a redirect without a usable Location'
      : target.origin !== origin ? `another origin than ${origin}; the conversation and the key are not re-sent there`
      : response.status !== 307 && response.status !== 308 ? `HTTP ${response.status} would turn the POST into a GET`
      : hops >= MAX_REDIRECTS ? `more than ${MAX_REDIRECTS} redirects` : undefined
    if (why === undefined) { url = target!.href; continue }
    throw providerError(cfg, 'INVALID_REQUEST', `HTTP ${response.status} from POST ${url} redirects to ${where}: `
      + `${why}. Set baseURL to the server's real address if you trust it.`, {
      status: response.status || undefined, requestId: requestIdOf(response.headers),
    })
  }
}

/** `cfg.fetch`, settled by the init's signal too: a fetch that does not pass the signal on (a proxy's) cannot hold
 *  a call past an abort, the idle timer or the deadline (docs/design.md §13); a later response is cancelled. */
function fetchUnder(cfg: AdapterConfig, url: string, init: RequestInit): Promise<Response> {
  const sent = cfg.fetch(url, init), signal = init.signal
  if (!signal) return sent
  return new Promise((resolve, reject) => {
    const onAbort = (): void => { reject(signal.reason); sent.then((r) => r.body?.cancel().catch(() => {}), () => {}) }
    if (signal.aborted) return onAbort()
    signal.addEventListener('abort', onAbort, { once: true })
    const settled = (): void => signal.removeEventListener('abort', onAbort)
    sent.then((r) => { settled(); resolve(r) }, (e) => { settled(); reject(e) })
  })
}

/** After a finish reason, ms without progress that end the answer (usage may follow it; the end marker should). */
const FINISHED_IDLE_MS = 10_000

/** What one attempt learned that its error needs: the response's request id, and which timer ended it. */
interface AttemptState { requestId?: string; status?: number; timedOut: boolean; pastDeadline: boolean }

/**
 * One POST of `body` to `cfg.endpoint` under the request's signal, the idle timer and the deadline; `read` reads the
 * response (a reply by default, or a count). Its failures are classified by {@link attemptError}.
 */
async function attempt<T = ChatResponse>(cfg: AdapterConfig, request: ChatRequest, body: string,
  headers: Record<string, string>, deadlineAt: number,
  read: (response: Response, acc: ReplyAssembler, signal: AbortSignal) => Promise<T> = readReply as never,
): Promise<T> {
  const { signal, onEvent } = request
  const controller = new AbortController()
  const st: AttemptState = { timedOut: false, pastDeadline: false }
  const deadline = setTimeout(() => {
    st.pastDeadline = true
    controller.abort(new Error(`deadline of ${cfg.requestTimeoutMs} ms passed`))
  }, Math.max(0, deadlineAt - Date.now()))
  // One idle timer per request: progress only counts; the timer looks every quarter of
  // the idle timeout and aborts once the count stood still that long (so within 1.25 × of it;
  // re-arming or reading the clock per event cost 10–12%). Progress is the response headers, then
  // only what the assembler keeps (text, reasoning, tool calls, changed usage): empty chunks, pings
  // and keep-alives are not (docs/design.md §6).
  let timer: ReturnType<typeof setTimeout> | undefined
  let progressCount = 0, seenCount = 0, seenAt = Date.now()
  const progress = (): void => { progressCount++ }
  const idleCheck = (): void => {
    const now = Date.now()
    if (progressCount !== seenCount) { seenCount = progressCount; seenAt = now }
    const idleMs = now - seenAt
    const limitMs = acc.finishReason === undefined ? cfg.idleTimeoutMs : Math.min(cfg.idleTimeoutMs, FINISHED_IDLE_MS)
    if (idleMs < limitMs) {
      timer = setTimeout(idleCheck, Math.max(1, Math.min(limitMs / 4, limitMs - idleMs)))
      return
    }
    st.timedOut = true
    controller.abort(new Error(`no progress for ${limitMs} ms`))
  }
  const forwardAbort = (): void => controller.abort(signal?.reason)
  signal?.addEventListener('abort', forwardAbort, { once: true })
  const emit = (event: StreamEvent): void => {
    if (!onEvent) return
    try { onEvent(event) } catch (error) { throw new ListenerFailure(error) }
  }
  const acc = new ReplyAssembler(cfg, onEvent ? emit : undefined, progress)
  timer = setTimeout(idleCheck, cfg.idleTimeoutMs / 4)
  try {
    const response = await postFollowingSameOrigin(cfg, { method: 'POST', headers, body, signal: controller.signal })
    progress()
    st.status = response.status
    st.requestId = acc.requestId = requestIdOf(response.headers)
    return await read(response, acc, controller.signal)
  } catch (e) {
    if (e instanceof ListenerFailure) throw e
    // A finished answer whose server held the connection open: the answer stands (the abort closed the connection).
    const finished = st.timedOut && !st.pastDeadline && !signal?.aborted && acc.finishReason !== undefined
    if (finished) return acc.finish(false) as T
    throw attemptError(cfg, e, acc, signal?.aborted === true, st)
  } finally {
    if (timer !== undefined) clearTimeout(timer)
    clearTimeout(deadline)
    signal?.removeEventListener('abort', forwardAbort)
  }
}

/** The classified error of an HTTP error status (its body read capped: `cut` says whether the rest was left). */
function httpError(cfg: AdapterConfig, response: Response, text: string, cut: boolean, requestId: string | undefined,
  url = cfg.endpoint): ProviderError {
  const { status } = response
  const { code, info } = readErrorBody(status, text)
  const cutNote = cut ? ` (error body cut at ${RESPONSE_BODY_MAX_BYTES} bytes, the rest not read)` : ''
  return providerError(cfg, code, `HTTP ${status} from POST ${url} (model `
    + `${cfg.model})${info?.message ? `: ${info.message}` : ''}${cutNote}.`, {
    status, body: text, requestId, retryAfterMs: parseRetryAfterMs(response.headers, Date.now()),
  })
}

/**
 * The ProviderError of a failed attempt: ABORTED (the caller), TIMEOUT past the deadline (never
 * retried) or when idle, the classified error itself, MALFORMED_RESPONSE past the SSE buffer, else
 * TRANSPORT. It carries the partial text; one raised after output is never retried by the adapter.
 */
function attemptError(cfg: AdapterConfig, e: unknown, acc: ReplyAssembler, aborted: boolean,
  st: AttemptState): ProviderError {
  // After a 200 the server ran the request: the error carries that status, so the spend cap counts it (§11).
  const { requestId } = st, ran = { requestId, ...(st.status === 200 ? { status: 200 } : {}) }
  let error: ProviderError
  if (aborted) error = providerError(cfg, 'ABORTED', `request to ${cfg.endpoint} aborted by the caller.`, ran)
  else if (st.pastDeadline) {
    error = providerError(cfg, 'TIMEOUT', `the request deadline of ${cfg.requestTimeoutMs} ms (REQUEST_TIMEOUT_MS) `
      + `passed before ${cfg.endpoint} (model ${cfg.model}) finished; not retried.`, ran)
    notRetried.add(error)
  } else if (e instanceof ProviderError) error = e
  else if (st.timedOut) {
    error = providerError(cfg, 'TIMEOUT', `no progress from ${cfg.endpoint} (model ${cfg.model}) `
      + `for ${cfg.idleTimeoutMs} ms; keep-alive comments do not count.`, ran)
  } else if (e instanceof SSEOverflowError) {
    error = providerError(cfg, 'MALFORMED_RESPONSE', `stream from ${cfg.endpoint}: ${e.message}.`,
      { requestId, status: 200, cause: e })
  } else {
    // undici says only "fetch failed"; the reason (ECONNREFUSED, ENOTFOUND, …) is in its cause.
    const reason = e instanceof Error ? e.message + (e.cause instanceof Error ? ` (${e.cause.message})`
      : '') : String(e)
    error = providerError(cfg, 'TRANSPORT', `request to ${cfg.endpoint} failed: ${reason}.`, { ...ran, cause: e })
  }
  const partial = acc.partial()
  if (partial && !error.partial) error.partial = partial
  if (acc.streamed) notRetried.add(error)
  if (acc.streamed && !st.pastDeadline) afterOutput.add(error)
  return error
}

// ═══════════════════════════════════════
// 8. Loop
// ═══════════════════════════════════════

/**
 * Hook names: the step hooks in the order they run in a step (docs/design.md §7), and the compaction
 * hooks around each summary transaction (docs/design.md §12): `compaction/before` may return
 * `{focus}` (added to the summary instruction) or `{cancel: true | reason}`; `compaction/after`
 * sees the committed checkpoint.
 */
export type HookName = 'agent/pre-step' | 'agent/request' | 'agent/request-error' | 'agent/post-step'
  | 'compaction/before' | 'compaction/after'

/** What a hook receives. `request` only for `agent/request` (mutable); `error` only for `agent/request-error`. */
export interface HookContext {
  agent: Agent
  /** Turn number, from 1 for the session's first turn. */
  turn: number
  /** Step number within the turn, from 1. */
  step: number
  signal: AbortSignal
  request?: ChatRequest
  error?: ProviderError
  /** `compaction/before` and `compaction/after`: the summary transaction. */
  compaction?: CompactionInfo
  /** `compaction/after` only: the committed checkpoint. */
  checkpoint?: CheckpointInfo
}

/** What a hook may return: `retry` (`agent/request-error`), `focus` and `cancel` (`compaction/before`). */
export interface HookResult { retry?: boolean; focus?: string; cancel?: boolean | string }
/** A hook. An `agent/request-error` hook returns `{retry: true}` to have the step retried. */
export type Hook = (ctx: HookContext) => void | HookResult | Promise<void | HookResult>

/** Everything a UI can follow: every log event, every streamed delta, every warning. */
export type AgentEvent =
  | { type: 'log'; event: SessionEvent }
  | { type: 'stream'; event: StreamEvent }
  | { type: 'warning'; message: string }

/** Options of {@link Agent}. Token counts are tokens; `maxSteps` is provider calls per turn. */
export interface AgentOptions {
  session: Session
  provider: Provider
  tools?: readonly Tool[]
  /**
   * The system prompt, part of the envelope that compaction never touches (docs/design.md §12): project
   * instructions (e.g. the text of AGENTS.md) go here too. The context window (tokens) and the completion
   * budget per step (tokens, clamped to the room left) are the provider's `contextWindow` and `maxTokens`.
   */
  system?: string
  /** Replaces {@link SUMMARY_INSTRUCTION} in summary requests; a non-empty string. */
  summaryInstruction?: string
  /** Model for summaries (default: `provider`). */
  summarizer?: Provider
  compaction?: Partial<CompactionConfig>
  prune?: Partial<PruneConfig>
  /** Steps per turn before the turn ends with reason `max-steps` (default 200). */
  maxSteps?: number
  /**
   * Offer the {@link recallTool} (named `recall`) once the session holds shadowed content (default
   * true; docs/design.md §10). `false` never offers it. A tool of your own named `recall` needs `recall: false`.
   */
  recall?: boolean
  /**
   * Spend cap, USD (docs/design.md §11): a number caps each turn; `{turn, session}` caps a turn, the
   * session (all its requests so far, summaries included), or both. Before a request whose modelled
   * cost (its input at the modelled cache hit, its output at the session's mean so far) would pass a
   * cap, the turn ends with reason `budget` and a message saying what was spent; a summary request is
   * checked too, and not sent past a cap. What is spent counts each request at no less than dsh's own
   * estimate of it, whatever the server reports. Needs the provider's `prices` (and a summarizer of another
   * model its own): without them the Agent throws {@link ConfigError}.
   */
  maxCostUSD?: number | { turn?: number; session?: number }
  onEvent?: (event: AgentEvent) => void
}

/** How a turn ended. `text` is the final assistant text. */
export interface TurnResult {
  turn: number
  steps: number
  reason: 'stop' | 'length' | 'aborted' | 'max-steps' | 'budget' | string
  text: string
  message?: AssistantMessage
}

/** Consecutive retries of a step whose stream broke after output (see {@link Agent}). */
const MAX_STREAM_RETRIES = 1

/** Window tokens per tool call one message may keep (docs/design.md §7): a call and even an empty result
 *  take about 30 tokens on the wire (id, name, arguments, roles), so the group stays near half the window. */
const WINDOW_TOKENS_PER_TOOL_CALL = 64
/** Tool calls one step runs (as many as the adapter passes); a message's other calls get TOOL_LIMIT error results. */
const MAX_TOOL_CALLS_PER_STEP = MAX_TOOL_CALLS_PER_MESSAGE

/**
 * What the spend cap counts of one request (docs/design.md §11): never less than dsh's own estimate of what it
 * sent and received, whatever the server reports. Input: the larger of the reported and the meter's count; of it
 * uncached, the larger of the reported and the modelled miss; output: the larger of the reported and the meter's
 * count of the answer. The cost of this split is at least that of either.
 */
function spendFloorTokens(r: { inputTokens: number; modelledHitTokens: number; outputTokens: number },
  billed: BilledTokens): BilledTokens {
  const input = Math.max(billed.cachedInputTokens + billed.uncachedInputTokens, r.inputTokens)
  const uncached = Math.min(input, Math.max(billed.uncachedInputTokens, r.inputTokens - Math.min(r.inputTokens,
    r.modelledHitTokens)))
  return { cachedInputTokens: input - uncached, uncachedInputTokens: uncached,
    outputTokens: Math.max(billed.outputTokens, r.outputTokens),
    ...(billed.cacheWriteInputTokens ? { cacheWriteInputTokens: billed.cacheWriteInputTokens } : {}) }
}

/** What a request's stream showed of its cost: output received and the attempts the adapter retried after a 200. */
interface SeenOutput { units: number; retried: ProviderError[] }

/** A stream listener that adds the output received (UTF-16 units of text, reasoning and tool-call ids, names and
 *  arguments) to `seen.units` and each attempt the server ran before a retry (it answered 200, e.g. empty) to
 *  `seen.retried`, then passes the event on to `next`. */
function countingOutput(seen: SeenOutput, next?: (event: StreamEvent) => void): (event: StreamEvent) => void {
  return (event) => {
    if (event.type === 'text-delta' || event.type === 'reasoning-delta') seen.units += event.text.length
    else if (event.type === 'tool-call-delta')
      seen.units += event.argumentsDelta.length + (event.id?.length ?? 0) + (event.name?.length ?? 0)
    else if (event.type === 'retry' && event.error.status === 200) seen.retried.push(event.error)
    next?.(event)
  }
}

/** A provider's count of `request`, checked as usage is (docs/design.md §13): an integer in [0, USAGE_MAX_TOKENS].
 *  A Provider of the caller's own may answer anything, a plain value, or throw at once: all reject here. */
async function providerCount(provider: Provider, request: ChatRequest): Promise<number> {
  const tokens: unknown = await provider.countTokens!(request)
  if (typeof tokens !== 'number' || !Number.isInteger(tokens) || tokens < 0 || tokens > USAGE_MAX_TOKENS)
    throw new Error(`its count ${shown(tokens)} is not a token count in [0, ${USAGE_MAX_TOKENS}]`)
  return tokens
}

/** The output tokens (by the meter) of a failed request the server ran — it streamed output (`seen`, or the error's
 *  partial) or answered 200 — which the spend cap counts (docs/design.md §11); undefined when it did not run. */
function failedOutputTokens(error: ProviderError | undefined, seen: SeenOutput): number | undefined {
  const partial = error?.partial ? estimateMessageTokens(error.partial) : 0
  const tokens = Math.max(Math.ceil(seen.units / UNITS_PER_TOKEN), partial)
  return tokens > 0 || error?.status === 200 ? tokens : undefined
}

/** The spend caps of {@link AgentOptions.maxCostUSD}, checked; ConfigError for a bad value or unknown prices. */
function spendCap(cap: AgentOptions['maxCostUSD'], provider: Provider, summarizer: Provider, prices: AgentPrices):
  { turn?: number; session?: number } | undefined {
  if (cap === undefined) return undefined
  const limit = 'a non-negative number of USD or {turn, session} of them'
  // Read once, into a copy (a getter is never read again, docs/design.md §14).
  const caps: Record<string, unknown> = typeof cap === 'number' ? { turn: cap }
    : Object.fromEntries(plainFields('maxCostUSD', cap, limit, ConfigError))
  const ok = (x: unknown) => x === undefined || (typeof x === 'number' && Number.isFinite(x) && x >= 0)
  if (!ok(caps.turn) || !ok(caps.session) || Object.keys(caps).some((k) => k !== 'turn' && k !== 'session'))
    throw configError('maxCostUSD', limit, cap, 'e.g. maxCostUSD: 0.5 (each turn) or { session: 5 }')
  if (!prices.conversation) throw new ConfigError(`maxCostUSD needs the provider's prices, and model `
    + `"${provider.model}" has none (cost unknown); give the provider prices: { cacheHitInput, cacheMissInput, `
    + `output } (USD per million tokens), or leave maxCostUSD out`)
  if (!prices.summary) throw new ConfigError(`maxCostUSD needs the summarizer's prices too, and `
    + `model "${summarizer.model}" has none (cost unknown); give the summarizer prices, or leave maxCostUSD out`)
  return caps as { turn?: number; session?: number }
}

/** The prices an Agent counts at, read once where it is made (docs/design.md §11, §14): a Provider of the caller's
 *  own is not checked where it was made, and its `prices` may be a getter. A summary request is counted at the
 *  summarizer's, or the conversation's for the same model. Throws {@link ConfigError} for prices that cannot price. */
interface AgentPrices { conversation?: Prices; summary?: Prices }
function agentPrices(provider: Provider, summarizer: Provider): AgentPrices {
  const read = (p: Provider): Prices | undefined => {
    try {
      const prices = p.prices
      return prices === undefined ? undefined : validatePrices(prices, `${p.model}: prices`)
    } catch (e) { throw new ConfigError(`new Agent: the provider's ${(e as Error).message}`, { cause: e }) }
  }
  const conversation = read(provider)
  const own = summarizer === provider ? conversation : read(summarizer)
  return { conversation, summary: own ?? (summarizer.model === provider.model ? conversation : undefined) }
}

/** `summarizer`, with each request first put to `refuse` (a reason, or undefined to send it). */
function refusingProvider(summarizer: Provider, refuse: (request: ChatRequest) => string | undefined): Provider {
  return new Proxy(summarizer, {
    get(target, key) {
      if (key === 'complete') return async (request: ChatRequest) => {
        const why = refuse(request)
        if (why) throw Object.assign(new CompactionError(why), { budget: true, cancelled: true })
        return await target.complete(request)
      }
      const v = Reflect.get(target, key, target)
      return typeof v === 'function' ? v.bind(target) : v
    },
  })
}


/** Turns whatever a tool returned into result content; anything else is an error for the model. */
function toolOutputToResult(callId: string, name: string, out: unknown): ToolResultMessage {
  if (typeof out === 'string') return { role: 'tool', toolCallId: callId, content: [{ type: 'text', text: out }] }
  if (Array.isArray(out)) {
    validateMessage({ role: 'tool', toolCallId: callId, content: out }, 'tool')
    return { role: 'tool', toolCallId: callId, content: out as Block[] }
  }
  if (out && typeof out === 'object' && 'content' in out) {
    const o = out as { content: unknown; isError?: unknown }
    const r = toolOutputToResult(callId, name, o.content)
    return o.isError ? { ...r, isError: true } : r
  }
  const kind = out === null ? 'null' : typeof out
  return errorResult(callId, `tool ${name} returned ${kind}; a tool must return a string, an array of blocks or `
    + `{content, isError}`, 'TOOL_BAD_OUTPUT')
}

/** Every tool call with a usable id: a missing or repeated one becomes `call_dsh_<seq>_<n>`. */
function withCallIds(message: AssistantMessage, seq: number, session: Session): AssistantMessage {
  const seen = new Set<string>()
  const usable = (b: Block) => {
    const id = (b as ToolCallBlock).id
    const ok = typeof id === 'string' && id !== '' && !seen.has(id) && !stateOf(session).calls.has(id)
    seen.add(id)
    return ok
  }
  if (message.content.every((b) => b.type !== 'tool-call' || usable(b))) return message
  seen.clear()
  let n = 0
  return { ...message, content: message.content.map((b) => (b.type === 'tool-call' && !usable(b)
    ? { ...b, id: `call_dsh_${seq}_${n++}` } : b)) }
}

function errorResult(callId: string, text: string, code: string): ToolResultMessage {
  return { role: 'tool', toolCallId: callId, content: [{ type: 'text', text }], isError: true, metadata: { code } }
}

/** One turn's progress, shared by {@link Agent.run} and its steps. */
interface Turn {
  readonly turn: number
  step: number
  readonly signal: AbortSignal
  /** The session's cost when the turn began, USD (for the turn's spend cap). */
  startUSD?: number
  /** Why the spend cap refused a summary request in this turn: the turn stops before its next step. */
  budget?: string
  /** The last assistant message: the turn's answer. */
  last?: AssistantMessage
  /** Set once `turn/end` is logged. */
  ended: boolean
  /** The smallest request (tokens, by the meter) that overflowed and was recovered from in this turn. */
  recoveredOverflowTokens?: number
}

/** What a step asks of the loop: the next step, or the end of the turn with a reason (and an error to throw). */
type StepOutcome = typeof NEXT_STEP | { reason: string; error?: unknown; message?: string }
const NEXT_STEP = Symbol('next step')

/** A failed provider call: the error as a ProviderError, the raw throw, the partial text output. */
interface StepFailure { error: ProviderError; raw: unknown; partial?: AssistantMessage; inputTokens: number;
  ctx: HookContext; spent?: RequestCache & { outputTokens: number } }

function stepFailure(raw: unknown, inputTokens: number, ctx: HookContext): StepFailure {
  const error = raw instanceof ProviderError ? raw
    : new ProviderError('TRANSPORT', String((raw as Error)?.message ?? raw), { cause: raw })
  const text = error.partial?.content.filter((b) => b.type === 'text' || b.type === 'reasoning') ?? []
  const partial = text.length > 0 ? { role: 'assistant' as const, content: text, interrupted: true } : undefined
  return { error, raw, partial, inputTokens, ctx }
}

/** What a failed step does next (docs/design.md §5, §7): the first recovery that returns an outcome decides. */
const RECOVERIES = ['abortedStep', 'recoveredStep', 'retriedStream', 'failedTurn'] as const

/** The names of `tools`; throws a TypeError for a tool without a name or `execute`, or a name used twice. */
function toolNames(tools: readonly Tool[]): Set<string> {
  const names = new Set<string>()
  for (const t of tools) {
    if (!t || typeof t.name !== 'string' || typeof t.execute !== 'function')
      throw new TypeError('every tool needs a string name and an execute(args, ctx) function')
    if (names.has(t.name))
      throw new TypeError(`two tools are named ${JSON.stringify(t.name)}; tool names must be unique`)
    names.add(t.name)
  }
  return names
}

/** Runs the hooks of `name` in order; `retry` and `cancel` if any asked, focuses joined with "; ". */
async function collectHooks(hooks: ReadonlyMap<HookName, readonly Hook[]>, name: HookName,
  ctx: HookContext): Promise<HookResult> {
  const out: HookResult = {}
  for (const hook of hooks.get(name) ?? []) {
    const r = await hook(ctx)
    if (!r) continue
    if (r.retry) out.retry = true
    if (r.cancel) out.cancel = r.cancel
    const focus = typeof r.focus === 'string' ? r.focus.trim() : ''
    if (focus) out.focus = out.focus ? `${out.focus}; ${focus}` : focus
  }
  return out
}

/** The part of a tool the model sees: name, description, parameters schema. */
const toolSpec = (t: Tool): ToolSpec => ({ name: t.name, description: t.description, parameters: t.parameters })

/** The Agent asks the provider's own count when the measured request is within this share of the window (§6.1). */
const COUNT_NEAR_WINDOW_RATIO = 0.1

/**
 * `new Agent`'s options, each read once: TypeError without `session` and `provider`; {@link ConfigError} for an
 * options object that is not a plain one, a getter that throws, or an option of 0.1 that moved.
 */
function agentOptions(given: AgentOptions): AgentOptions {
  const object = typeof given === 'function' || isRecord(given)
  const options = (object ? Object.fromEntries(plainFields('new Agent: options', given, 'a plain object of options',
    ConfigError)) : given) as unknown as AgentOptions
  if (!options?.session || !options.provider)
    throw new TypeError('new Agent({session, provider, …}): session and provider are required')
  for (const k in REMOVED_OPTIONS.agent) {
    if ((options as unknown as Record<string, unknown>)[k] !== undefined)
      throw removedOption(REMOVED_OPTIONS.agent, 'new Agent', k)
  }
  // a misspelt or invented option is refused, as the providers refuse theirs: ignored, it changed nothing silently
  const unknown = Object.keys(options).find((k) => !AGENT_OPTION_NAMES.includes(k as keyof AgentOptions))
  if (unknown !== undefined) throw new ConfigError(`new Agent: unknown option "${unknown}"; known options: `
    + `${AGENT_OPTION_NAMES.join(', ')} (warnings arrive through onEvent as {type: 'warning'})`)
  return options
}
/** The keys of {@link AgentOptions}. */
const AGENT_OPTION_NAMES: readonly (keyof AgentOptions)[] = ['session', 'provider', 'tools', 'system',
  'summaryInstruction', 'summarizer', 'compaction', 'prune', 'maxSteps', 'recall', 'maxCostUSD', 'onEvent']

/**
 * The agent loop (docs/design.md §7). A turn is one user input until the model stops calling tools; a
 * step is one provider call plus its tool calls. Every state change is a log event (see
 * {@link Session}); {@link AgentOptions.onEvent} also gets streamed deltas and warnings. The ladder
 * runs through the `agent/post-step` and `agent/request-error` hooks unless `compaction.auto` is false.
 * Cancellation, interrupted streams and their one retry: docs/design.md §7.
 * `new Agent` throws TypeError without `session` and `provider`, {@link ConfigError} for a bad, removed or
 * unreadable option (an options object that is not a plain one, a getter that throws).
 */
class Agent {
  readonly session: Session
  readonly provider: Provider
  readonly summarizer: Provider
  readonly tools: readonly Tool[]
  /** The ladder's configuration: {@link AgentOptions.compaction} over the defaults, with the constants it runs with. */
  readonly compaction: LadderConfig
  readonly pruneConfig: PruneConfig
  readonly maxSteps: number
  readonly system?: string
  readonly summaryInstruction?: string
  /** This agent's ladder (prune → clear → compact); its memory is in the session log. */
  readonly ladder: Ladder
  /** The `recall` tool, offered once the session holds shadowed content; undefined with `recall: false`. */
  private readonly recall?: Tool
  private readonly window?: number
  private readonly maxTokens: number
  private readonly hooks = new Map<HookName, Hook[]>()
  private readonly steering: (string | UserMessage)[] = []
  private running = false
  private overflowRetries = 0
  private streamRetries = 0
  /** Set once the provider's `countTokens` failed: the estimate is used from then on. */
  private countFailed = false
  private onEvent?: (e: AgentEvent) => void
  private envelopeMemo?: Envelope
  private envelopeMemoTools = 0
  /** Heuristic tokens of the recall tool's spec (0 without it). */
  private readonly recallSpecTokens: number = 0
  /** Set once the recall spec was found too big for the window ({@link RECALL_MAX_WINDOW_RATIO}). */
  private recallDropped = false
  /** The prices of the provider and the summarizer, read once ({@link agentPrices}). */
  private readonly prices: AgentPrices
  /** The spend caps, USD ({@link AgentOptions.maxCostUSD}). */
  private readonly maxCost?: { turn?: number; session?: number }
  /** The turn running now, for the spend cap of its summary requests. */
  private turnNow?: Turn
  /** The fsync of the last step boundary, running while the next step is prepared ({@link Agent.boundary}). */
  private syncing: Promise<void> = Promise.resolve()

  constructor(given: AgentOptions) {
    const options = agentOptions(given)
    this.session = options.session
    this.provider = options.provider
    this.summarizer = options.summarizer ?? options.provider
    this.tools = options.tools ?? []
    const names = toolNames(this.tools)
    this.system = options.system
    const { summaryInstruction, maxSteps = 200, recall } = options
    if (summaryInstruction !== undefined && (typeof summaryInstruction !== 'string' || !summaryInstruction.trim()))
      throw configError('summaryInstruction', 'a non-empty string', summaryInstruction, 'leave it out for the default')
    this.summaryInstruction = summaryInstruction
    this.window = options.provider.contextWindow
    if (this.window !== undefined && !isIntegerAtLeast(this.window, 1))
      throw new RangeError(`contextWindow must be a positive integer number of tokens, got ${this.window}`)
    this.maxTokens = options.provider.maxTokens
    this.compaction = resolveCompactionConfig(options.compaction)
    this.pruneConfig = resolvePruneConfig(options.prune)
    if (!isIntegerAtLeast(maxSteps, 1))
      throw configError('maxSteps', 'an integer ≥ 1 (provider calls per turn)', maxSteps)
    this.maxSteps = maxSteps
    if (recall !== undefined && typeof recall !== 'boolean') throw configError('recall', 'true or false', recall)
    if (recall !== false) {
      if (names.has(RECALL_TOOL_NAME))
        throw new TypeError(`a tool is named ${JSON.stringify(RECALL_TOOL_NAME)}, which dsh offers itself to read back `
          + `shadowed content; rename your tool or pass recall: false`)
      this.recall = recallTool(this.session)
      this.recallSpecTokens = estimateEnvelopeTokens({ tools: [toolSpec(this.recall)] })
    }
    this.prices = agentPrices(this.provider, this.summarizer)
    this.maxCost = spendCap(options.maxCostUSD, options.provider, this.summarizer, this.prices)
    this.onEvent = options.onEvent
    const agent = this
    this.ladder = new Ladder({
      session: this.session, get envelope() { return agent.envelope },
      summarizer: this.maxCost ? refusingProvider(this.summarizer, (r) => this.summaryOverBudget(r)) : this.summarizer,
      settings: { contextWindow: this.window, compaction: this.compaction, prune: this.pruneConfig,
        summaryInstruction: this.summaryInstruction, modelName: this.provider.model, onEvent: this.onEvent,
        unclearable: new Set(this.tools.filter((t) => t.clearable === false).map((t) => t.name)),
        hooks: { agent: this, byName: this.hooks } } })
    if (this.onEvent) { const cb = this.onEvent; this.session.subscribe((event) => cb({ type: 'log', event })) }
    if (this.compaction.auto) {
      this.on('agent/post-step', async ({ signal }) => { await this.ladder.relievePressure(signal) })
      this.on('agent/request-error', async ({ error, signal }) => {
        if (error?.code !== 'CONTEXT_WINDOW_EXCEEDED' || signal.aborted) return
        if (this.overflowRetries >= MAX_OVERFLOW_RETRIES) return
        const outcome = await this.ladder.recoverOverflow(error, signal)
        // Never retry an unchanged request, nor one the provider's own count says cannot fit
        // (`tokensAfter` is the next request's size, the envelope it will carry included).
        const fits = this.window === undefined || outcome.tokensAfter < this.window
        if (outcome.generationAfter > outcome.generationBefore && fits) return { retry: true }
      })
    }
  }

  /** The tools offered in the next request: the caller's, plus `recall` once something is shadowed. */
  private offeredTools(): readonly Tool[] {
    return this.recall && RecallIndex.of(this.session).hasShadowedContent && this.recallAffordable()
      ? [...this.tools, this.recall]
      : this.tools
  }

  /** Whether the recall spec fits {@link RECALL_MAX_WINDOW_RATIO} of the window; once not, never (one warning). */
  private recallAffordable(): boolean {
    if (this.recallDropped) return false
    if (this.window === undefined) return true
    // A share of what the window keeps for the history (docs/design.md §5 "Room"), as the ladder sizes its parts.
    const m = this.session.measure(), kept = keptWindowTokens(this.session, this.window)
    if (this.recallSpecTokens * m.calibration <= kept * RECALL_MAX_WINDOW_RATIO) return true
    this.recallDropped = true
    this.warn(`the ${RECALL_TOOL_NAME} tool is not offered: its spec (${this.recallSpecTokens} `
      + `tokens${m.calibration === 1 ? '' : ` × ${m.calibration.toFixed(2)} calibration`}) would take more than `
      + `${Math.round(RECALL_MAX_WINDOW_RATIO * 100)}% of the ${kept === this.window ? `${this.window}-token window`
        : `${kept} tokens the ${this.window}-token window keeps for the history`}; shadowed content stays in `
      + `the log (a ${RECALL_TOOL_NAME} call is still answered)`)
    return false
  }

  /** Context window in tokens, if known. */
  get contextWindow(): number | undefined { return this.window }
  /** The conversation model's name. */
  get modelName(): string { return this.provider.model }
  /** The request envelope: system prompt and tool specs. */
  get envelope(): Envelope {
    // One object per agent and tool set: the adapter serialises its tools once (docs/design.md §11
    // byte stability); the set changes once, when `recall` is first offered.
    const tools = this.offeredTools()
    if (this.envelopeMemo && this.envelopeMemoTools === tools.length) return this.envelopeMemo
    this.envelopeMemoTools = tools.length
    this.envelopeMemo = { system: this.system, tools: tools.length ? tools.map(toolSpec) : undefined }
    return this.envelopeMemo
  }

  /** Registers a hook; returns a function that removes it. */
  on(name: HookName, hook: Hook): () => void {
    const list = this.hooks.get(name) ?? []
    list.push(hook)
    this.hooks.set(name, list)
    return () => { const l = this.hooks.get(name)!; l.splice(l.indexOf(hook), 1) }
  }

  /**
   * Queues a user message (text, or a whole message with blocks) for the running turn: it is
   * appended after the current step's tool results (or before the next request), and a step
   * that made no tool call then does not end the turn. Queued between turns, it follows the next input.
   */
  steer(input: string | UserMessage): void {
    if (typeof input !== 'string') validateMessage(input, 'user')
    this.steering.push(input)
  }

  /** Reports a warning to `onEvent`. */
  warn(message: string): void { this.onEvent?.({ type: 'warning', message }) }

  private async runHooks(name: HookName, ctx: HookContext): Promise<boolean> {
    return (await collectHooks(this.hooks, name, ctx)).retry === true
  }

  /** Runs `fn`; a failure caused by cancellation becomes `undefined` (the caller ends the turn). */
  private async unlessAborted<T>(fn: () => Promise<T>, signal: AbortSignal): Promise<T | undefined> {
    try { return await fn() } catch (err) {
      if (signal.aborted) return undefined
      throw err
    }
  }

  private drainSteering(): boolean {
    if (this.steering.length === 0) return false
    for (const input of this.steering.splice(0)) {
      const message: UserMessage = typeof input === 'string' ? { role: 'user', content: input } : input
      this.session.append('user/message', { message, surfaceOp: { op: 'append' } })
    }
    return true
  }

  /**
   * The most pinned tokens (envelope included) this agent accepts: its compaction threshold,
   * `floor(window × thresholdRatio)` (no limit while the window is unknown).
   */
  get pinLimitTokens(): number | undefined {
    return this.window === undefined ? undefined : Math.floor(this.window * this.compaction.thresholdRatio)
  }

  /**
   * Pins surface message `seq` (see {@link Pins.pin}) within {@link Agent.pinLimitTokens}.
   * @throws SessionError `PIN` with the numbers when it would not fit, or `seq` is not on the surface.
   */
  pin(seq: number): void {
    this.writeHeader() // the envelope the limit is checked with
    Pins.of(this.session).pin(seq, { limitTokens: this.pinLimitTokens })
  }

  /**
   * Runs one turn. Resolves with how it ended (an abort resolves with reason `aborted`); rejects
   * with the provider's original {@link ProviderError} when a step fails and the ladder cannot
   * recover, or with a {@link SessionError} if the store fails. `pin: true` pins the input (see
   * {@link Agent.pin}); a pin that would not fit is refused (`SessionError('PIN')`) before anything is logged.
   */
  async run(input: string | UserMessage, options: { signal?: AbortSignal; pin?: boolean } = {}): Promise<TurnResult> {
    if (this.running) throw new Error('a turn is already running on this agent; wait for it or use steer(text)')
    const message: UserMessage = typeof input === 'string' ? { role: 'user', content: input } : input
    if (options.pin) {
      validateMessage(message, 'user')
      this.writeHeader()
      Pins.of(this.session).checkFits(estimateMessageTokens(message), 'the input', this.pinLimitTokens)
    }
    this.running = true
    const session = this.session
    const t: Turn = { turn: session.turn.turn + 1, step: 0, ended: false, signal: options.signal
      ?? new AbortController().signal }
    this.turnNow = t
    try {
      let outcome = await this.startTurn(t, message, options.pin === true)
      while (outcome === NEXT_STEP) outcome = await this.step(t)
      t.ended = true
      const why = outcome.message ? { message: outcome.message } : {}
      session.append('turn/end', { turn: t.turn, reason: outcome.reason, ...why })
      await this.boundary()
      await this.synced() // a turn is on disk when run() resolves
      if (outcome.error !== undefined) throw outcome.error
      return { turn: t.turn, steps: t.step, reason: outcome.reason, text: t.last ? contentText(t.last.content) : '',
        message: t.last }
    } catch (err) {
      // An unexpected failure (a store error, a bug): close what is open so the log stays balanced.
      if (!t.ended && session.turn.open && session.turn.turn === t.turn) {
        try {
          if (session.turn.stepOpen) session.append('step/end', { turn: t.turn, step: t.step })
          session.append('turn/end', { turn: t.turn, reason: 'error' })
          await this.synced().catch(() => {})
          await session.sync()
        } catch { /* the original error matters more */ }
      }
      throw err
    } finally {
      this.running = false
      this.turnNow = undefined
    }
  }

  /** Logs the turn and its input, refuses an input that cannot fit, relieves pressure once (docs/design.md §5). */
  private async startTurn(t: Turn, message: UserMessage, pin: boolean): Promise<StepOutcome> {
    const session = this.session
    session.append('turn/start', { turn: t.turn })
    const inputSeq = session.append('user/message', { message, surfaceOp: { op: 'append' } }).seq
    if (pin) Pins.of(session).pin(inputSeq, { limitTokens: this.pinLimitTokens })
    this.writeHeader() // so the turn-start pressure check prices this agent's envelope (docs/design.md §2)
    await stateOf(session).flush() // the input is written at once and fsynced with the first step's boundary
    // Before the ladder: no rung edits the input or the caller's envelope, so a summary spent on a
    // request that cannot be sent anyway would only cost a model call and lose history.
    const tooBig = this.inputTooBig(message)
    if (tooBig) {
      session.append('request/error', { code: tooBig.code, message: tooBig.message, trigger: 'input' })
      return { reason: 'error', error: tooBig }
    }
    if (this.compaction.auto && !(await this.unlessAborted(() => this.ladder.relievePressure(t.signal), t.signal))) {
      return { reason: 'aborted' }
    }
    this.overflowRetries = 0
    this.streamRetries = 0
    return NEXT_STEP
  }

  /** One step: a provider call and its tool calls; a failed call goes to the first {@link RECOVERIES} that applies. */
  private async step(t: Turn): Promise<StepOutcome> {
    const session = this.session
    if (t.signal.aborted) return { reason: 'aborted' }
    if (t.step >= this.maxSteps) return { reason: 'max-steps' }
    const budget = this.maxCost && (t.budget ?? this.overBudget(t))
    if (budget) { this.warn(budget); return { reason: 'budget', message: budget } }
    t.step++
    session.append('step/start', { turn: t.turn, step: t.step })
    const ctx: HookContext = { agent: this, turn: t.turn, step: t.step, signal: t.signal }
    await this.runHooks('agent/pre-step', ctx)
    this.drainSteering()
    const envelope = this.writeHeader()
    await this.countNearWindow(envelope, t.signal)
    // The spend cap refused the summary this count needed: stop before the request it was to make room for.
    if (t.budget) { session.append('step/end', { turn: t.turn, step: t.step }); this.warn(t.budget)
      return { reason: 'budget', message: t.budget } }
    // Hooks may edit the request; they get copies, so the surface always matches the log.
    const editable = (this.hooks.get('agent/request')?.length ?? 0) > 0
    const inputTokens = session.measure().totalTokens
    const seen: SeenOutput = { units: 0, retried: [] } // what the request cost, if it fails (docs/design.md §11)
    const request: ChatRequest = {
      system: envelope.system, tools: envelope.tools, maxTokens: this.maxTokens, inputTokens, signal: t.signal,
      messages: editable ? structuredClone(session.messages()) : session.messages(),
      onEvent: countingOutput(seen, (event) => this.onEvent?.({ type: 'stream', event })),
    }
    await this.runHooks('agent/request', { ...ctx, request })
    await stateOf(session).flush() // written, not fsynced: a crash mid-request still shows the step it was in
    const cache = CostLedger.of(session).nextRequestCache()
    let response: ChatResponse
    // Each attempt the adapter retried after the server ran it is a request that cost (docs/design.md §11).
    const retried = () => { for (const e of seen.retried) session.append('request/error', { code: e.code,
      status: e.status, message: e.message, trigger: 'retry', spent: { ...cache, outputTokens: 0 } }) }
    try { response = await this.provider.complete(request) } catch (raw) {
      retried()
      const failure = stepFailure(raw, inputTokens, ctx)
      const outputTokens = failedOutputTokens(failure.error, seen)
      if (outputTokens !== undefined) failure.spent = { ...cache, outputTokens }
      for (const recovery of RECOVERIES) {
        const outcome = await this[recovery](t, failure)
        if (outcome) return outcome
      }
      throw raw // unreachable: the last recovery always decides
    }
    retried()
    return await this.answered(t, ctx, response, cache)
  }

  /**
   * Near the window (the measured request within {@link COUNT_NEAR_WINDOW_RATIO} of it), the
   * provider's own count of the request, where it has one, is logged as an exact calibration sample
   * and the ladder relieves pressure on it before the request is sent (docs/design.md §6.1). A count
   * that fails is warned about once and not asked for again.
   */
  private async countNearWindow(envelope: Envelope, signal: AbortSignal): Promise<void> {
    const session = this.session, window = this.window, m = session.measure()
    if (!this.provider.countTokens || this.countFailed || window === undefined || signal.aborted
      || m.totalTokens < window * (1 - COUNT_NEAR_WINDOW_RATIO)) return
    let tokens: number
    try {
      tokens = await providerCount(this.provider, { system: envelope.system, tools: envelope.tools,
        messages: session.messages(), signal })
    } catch (err) {
      if (signal.aborted) return
      this.countFailed = true
      this.warn(`the provider could not count the request (${(err as Error)?.message ?? err}); the estimate stands`)
      return
    }
    session.append('ladder/state', { sample: { providerTokens: tokens, heuristicTokens: m.heuristicTokens,
      source: 'count' } })
    // written before the ladder may call a model, as before the step's own request
    if (this.compaction.auto) await stateOf(session).flush()
    if (this.compaction.auto) await this.unlessAborted(() => this.ladder.relievePressure(signal), signal)
  }

  /** A step answered: the message (ids repaired), its tool calls run, steering, then the post-step ladder. */
  private async answered(t: Turn, ctx: HookContext, response: ChatResponse, cache: RequestCache): Promise<StepOutcome> {
    const session = this.session
    this.overflowRetries = 0
    this.streamRetries = 0
    t.last = withCallIds(this.boundToolCalls(response.message), session.seq, session)
    const usage = checkedUsage(response.usage)
    if (response.usage !== undefined && !usage) this.warn(`usage ignored: ${JSON.stringify(response.usage)} is not `
      + `token counts in [0, ${USAGE_MAX_TOKENS}]`)
    session.append('assistant/message', { message: t.last, ...(usage ? { usage } : {}),
      finishReason: response.finishReason, surfaceOp: { op: 'append' }, cache })
    const calls = toolCalls(t.last)
    await this.runTools(calls, t.signal)
    const steered = this.drainSteering()
    await stateOf(session).flush() // written before the post-step ladder may call a model; fsynced once, below
    if (!t.signal.aborted) await this.unlessAborted(() => this.runHooks('agent/post-step', ctx), t.signal)
    session.append('step/end', { turn: t.turn, step: t.step })
    // One fsync per step: at its boundary, together with the turn's end when this step ends it.
    if (t.signal.aborted) return { reason: 'aborted' }
    if (calls.length === 0 && !steered) return { reason: response.finishReason === 'length' ? 'length' : 'stop' }
    await this.boundary()
    return NEXT_STEP
  }

  /**
   * A step boundary (docs/design.md §4): the log so far is written and its fsync started, to run while the next step
   * is prepared. The last boundary's fsync is awaited first, so one runs at a time (the kernel reports a failed
   * write-back to one fsync only) and its failure fails the step after it; {@link Agent.run} awaits the turn's own.
   */
  private async boundary(): Promise<void> {
    await this.synced()
    await stateOf(this.session).flush()
    this.syncing = this.session.sync()
    this.syncing.catch(() => {}) // awaited by the next boundary or by the turn's end
  }

  /** The last boundary's fsync; its failure is thrown once, never again into a later turn. */
  private synced(): Promise<void> {
    const last = this.syncing
    this.syncing = Promise.resolve()
    return last
  }

  /** The spend cap (docs/design.md §11): what was spent when the next request would pass a cap, else undefined. */
  private overBudget(t: Turn | undefined, next?: { usd: number; what: string }): string | undefined {
    // Counted at the floors of dsh's own estimates: a server's small usage figures cannot talk the cap down.
    const cost = CostLedger.of(this.session), floor = cost.spendFloor(), spent = floor.costUSD
    if (t) t.startUSD ??= spent
    if (!next) {
      const c = cost.nextRequestCache(), n = cost.usage().conversation.requests
      next = { what: 'the next request', usd: requestCostUSD(this.prices.conversation!, { cachedInputTokens:
        c.modelledHitTokens, uncachedInputTokens: c.inputTokens - c.modelledHitTokens,
      outputTokens: n > 0 ? floor.conversationOutputTokens / n : 0 }, Date.now()) }
    }
    const usd = (x: number) => `$${x.toFixed(6)}`
    const cap = this.maxCost!, scopes = [['turn', t && cap.turn, spent - (t?.startUSD ?? 0)], ['session', cap.session,
      spent]] as const
    for (const [scope, limit, used] of scopes) {
      if (limit !== undefined && used + next.usd > limit) return `spend cap: this ${scope} has spent ${usd(used)} of `
        + `its ${usd(limit)} cap and ${next.what} would cost about ${usd(next.usd)}; stopped before it (maxCostUSD)`
    }
    return undefined
  }

  /**
   * The spend cap before a summary request (docs/design.md §11): its input at the modelled hit, its output at the
   * mean of the session's summaries so far, else half its budget. Past a cap the request is not sent, and the
   * turn stops with reason `budget` before its next step.
   */
  private summaryOverBudget(request: ChatRequest): string | undefined {
    const s = this.summarizer, cost = CostLedger.of(this.session)
    const envelope = { system: request.system, tools: request.tools }
    const input = estimateRequestTokens(envelope, request.messages)
    const hit = Math.min(input, cost.summaryRequestHit(s.model, envelope, request.messages))
    const n = cost.usage().summary.requests + cost.running.length
    const output = n > 0 ? cost.spendFloor().summaryOutputTokens / n : SUMMARY_OUTPUT_SHARE * (request.maxTokens ?? 0)
    const usd = requestCostUSD(this.prices.summary!, { cachedInputTokens: hit,
      uncachedInputTokens: input - hit, outputTokens: output }, Date.now())
    const why = this.overBudget(this.turnNow, { usd, what: 'a summary request' })
    if (why && this.turnNow) this.turnNow.budget = why
    return why
  }

  /** Recovery 1: an aborted call keeps its partial output (text only) and ends the turn; all that streamed (tool-call
   *  arguments too) is counted as `request/error {spent}`, the partial after it being the same request (§11). */
  private async abortedStep(t: Turn, f: StepFailure): Promise<StepOutcome | undefined> {
    if (!t.signal.aborted && f.error.code !== 'ABORTED') return undefined
    if (f.spent) this.session.append('request/error', { code: f.error.code, message: f.error.message,
      trigger: 'conversation', spent: f.spent })
    if (f.partial) {
      this.session.append('assistant/message', { message: f.partial, finishReason: 'aborted',
        surfaceOp: { op: 'append' } })
    }
    this.session.append('step/end', { turn: t.turn, step: t.step })
    return { reason: 'aborted' }
  }

  /** Recovery 2: the error logged, the `agent/request-error` hooks run; a changed surface: retry next step. */
  private async recoveredStep(t: Turn, f: StepFailure): Promise<StepOutcome | undefined> {
    const { session } = this, { error, inputTokens } = f
    session.append('request/error', { code: error.code, status: error.status, message: error.message,
      trigger: 'conversation', ...(f.spent ? { spent: f.spent } : {}) })
    const generationBefore = session.replaceGeneration
    const overflow = error.code === 'CONTEXT_WINDOW_EXCEEDED'
    const noProgress = overflow && t.recoveredOverflowTokens !== undefined && inputTokens >= t.recoveredOverflowTokens
    if (noProgress) {
      this.warn(`context overflow again at ${inputTokens} tokens (dsh's estimate) after recovering from one at `
        + `${t.recoveredOverflowTokens} tokens in this turn: recovery makes no progress, so the turn stops. `
        + `The provider counts more tokens than dsh estimates: lower the compaction threshold or the context `
        + `window (CLI: --threshold, --context-window)`)
    }
    const retry = !noProgress
      && await this.unlessAborted(() => this.runHooks('agent/request-error', { ...f.ctx, error }), t.signal)
    if (t.signal.aborted) { session.append('step/end', { turn: t.turn, step: t.step }); return { reason: 'aborted' } }
    // The spend cap refused the recovery's summary: the turn stops at the cap, not with the overflow it could not fix.
    if (t.budget) { session.append('step/end', { turn: t.turn, step: t.step }); this.warn(t.budget)
      return { reason: 'budget', message: t.budget } }
    if (!retry || session.replaceGeneration <= generationBefore) return undefined
    if (overflow) t.recoveredOverflowTokens = Math.min(t.recoveredOverflowTokens ?? Infinity, inputTokens)
    this.overflowRetries++
    session.append('step/end', { turn: t.turn, step: t.step })
    session.append('recovery/retry', { generationBefore, generationAfter: session.replaceGeneration })
    await this.boundary()
    return NEXT_STEP
  }

  /** Recovery 3: the partial output kept; a retryable break after output is retried once as a new step. */
  private async retriedStream(t: Turn, f: StepFailure): Promise<StepOutcome | undefined> {
    const session = this.session, { error } = f
    if (f.partial) session.append('assistant/message', { message: f.partial, finishReason: 'error',
      surfaceOp: { op: 'append' } })
    session.append('step/end', { turn: t.turn, step: t.step })
    if (!afterOutput.has(error) || !RETRYABLE.has(error.code) || this.streamRetries >= MAX_STREAM_RETRIES)
      return undefined
    this.streamRetries++
    session.append('step/retry', { turn: t.turn, step: t.step, code: error.code })
    await this.boundary()
    return NEXT_STEP
  }

  /** Recovery 4: nothing helped; the turn ends with the provider's own error. */
  private async failedTurn(_t: Turn, f: StepFailure): Promise<StepOutcome> {
    return { reason: 'error', error: f.error } // the provider's own error: stepFailure wraps only other throws
  }

  /** The error for an input that cannot fit with the envelope alone (docs/design.md §10), else undefined. */
  private inputTooBig(message: UserMessage): ProviderError | undefined {
    const window = this.window
    if (window === undefined) return undefined
    const calibration = this.session.measure().calibration
    const envelope = estimateEnvelopeTokens(this.envelope)
    const input = estimateMessageTokens(message)
    const envelopeAlone = sentEnvelopeTokens(this.session, envelope) // as the room prices it (docs/design.md §5, §10)
    const inputAlone = Math.ceil(input * calibration)
    const tokens = envelopeAlone + inputAlone
    if (tokens < window) return undefined
    const envelopeCounted = envelopeAlone === envelope ? '' : `${envelopeAlone} as the provider counts them`
    if (envelopeAlone >= inputAlone) {
      return new ProviderError('CONTEXT_WINDOW_EXCEEDED',
        `CONTEXT_WINDOW_EXCEEDED: the system prompt and tool specs alone are ${envelope} `
          + `tokens${envelopeCounted && ` (${envelopeCounted})`}, `
          + `and with the ${input}-token input (${tokens} in all) they do not fit the context window of `
          + `${this.provider.model}, ${window} tokens; nothing was sent. Use a model with a larger window, or fewer or `
          + `shorter tools and system prompt.`)
    }
    return new ProviderError('CONTEXT_WINDOW_EXCEEDED',
      `CONTEXT_WINDOW_EXCEEDED: the current input alone is ${input} tokens`
        + `${inputAlone === input ? '' : ` (${inputAlone} at × ${calibration.toFixed(2)} calibration)`} (plus `
        + `${envelope} of system prompt and tools${envelopeCounted && `, ${envelopeCounted}`} = ${tokens}) and the `
        + `context window of ${this.provider.model} is ${window} tokens; nothing was sent. The input is never cut: `
        + `shorten it, or use a model with a larger window.`)
  }

  /** Logs `request/header` when model, envelope, budget or window changed; returns the envelope. Public so that a
   *  caller that switched to a new Agent between turns (the CLI's `/model`) can log the new model at once. */
  writeHeader(): Envelope {
    const envelope = this.envelope
    logHeader(this.session, { model: this.provider.model, baseURL: this.provider.baseURL, system: envelope.system,
      tools: envelope.tools, maxTokens: this.maxTokens, contextWindow: this.window, prices: this.prices.conversation })
    return envelope
  }

  /** The reply with at most window / 64 tool calls (more could not fit even cleared); a warning says so. */
  private boundToolCalls(message: AssistantMessage): AssistantMessage {
    const max = Math.floor((this.window ?? Infinity) / WINDOW_TOKENS_PER_TOOL_CALL)
    let calls = 0
    const content = message.content.filter((b) => b.type !== 'tool-call' || ++calls <= max)
    const kept = Math.min(calls, max), ran = Math.min(kept, MAX_TOOL_CALLS_PER_STEP)
    const dropped = calls - kept
    const why = `one message may make at most ${max} tool calls in a ${this.window}-token context window`
    if (kept > ran || dropped > 0) {
      this.warn(`the model made ${calls} tool calls in one message; the first ${ran} run, `
        + (kept > ran ? `${kept - ran} were answered with TOOL_LIMIT errors (a step runs at most `
          + `${MAX_TOOL_CALLS_PER_STEP})${dropped > 0 ? ', ' : ''}` : '')
        + (dropped > 0 ? `${dropped} were dropped (${why})` : ''))
    }
    if (dropped === 0) return message
    const text = `[dsh: ${dropped} more tool calls of this message were dropped without running: ${why}; `
      + `make fewer at a time]`
    return { ...message, content: [...content, { type: 'text', text }] }
  }

  /** Runs tool calls in order; after an abort, or past MAX_TOOL_CALLS_PER_STEP, the rest get error results unrun. */
  private async runTools(calls: ToolCallBlock[], signal: AbortSignal): Promise<void> {
    const session = this.session
    for (const [i, call] of calls.entries()) {
      if (signal.aborted || i >= MAX_TOOL_CALLS_PER_STEP) {
        const result = signal.aborted
          ? errorResult(call.id, 'TOOL_ABORTED: the turn was cancelled before this tool call started.', 'TOOL_ABORTED')
          : errorResult(call.id, `TOOL_LIMIT: not run: a step runs at most ${MAX_TOOL_CALLS_PER_STEP} tool calls; `
            + 'call it again if it is still needed', 'TOOL_LIMIT')
        session.append('tool/result', { message: result, surfaceOp: { op: 'append' } })
        continue
      }
      session.append('tool/call', { callId: call.id, name: call.name })
      // the dispatch record reaches the store before the tool runs (resume tells UNKNOWN from NOT_STARTED)
      await stateOf(session).flush()
      let result: ToolResultMessage
      const offered = this.offeredTools()
      // recall is answered even when its spec is not offered: the placeholders name it.
      const tool = offered.find((t) => t.name === call.name)
        ?? (call.name === RECALL_TOOL_NAME && RecallIndex.of(this.session).hasShadowedContent ? this.recall : undefined)
      if (!tool) {
        result = errorResult(call.id, `unknown tool ${echo(call.name)}; available tools: `
          + `${offered.map((t) => t.name).join(', ') || 'none'}`, 'TOOL_UNKNOWN')
      } else {
        let args: unknown
        try { args = call.arguments.trim() === '' ? {} : JSON.parse(call.arguments) } catch (err) {
          args = undefined
          result = errorResult(call.id, `the arguments of ${call.name} are not valid JSON (${(err as Error).message}); `
            + `send one JSON object matching the tool's parameters`, 'TOOL_BAD_ARGUMENTS')
        }
        if (args !== undefined) {
          try { result = toolOutputToResult(call.id, call.name,
            await tool.execute(args, { signal, callId: call.id })) } catch (err) {
            const text = String((err as Error)?.message ?? err)
            result = errorResult(call.id, text.startsWith(`${call.name}:`) ? text
              : `tool ${call.name} failed: ${text}`, 'TOOL_ERROR')
          }
        }
      }
      const { message, spilled, warning } = await spillToolResult(result!, session.store, SPILL_BYTES,
        spillName(session.seq), this.recall !== undefined)
      if (warning) this.warn(warning)
      try { session.append('tool/result', { message, ...(spilled ? { spilled } : {}), surfaceOp: { op: 'append' } }) }
      catch (err) { // blocks JSON cannot hold (a BigInt, a cycle; Session.append's check): an error result instead
        if (!(err instanceof SessionError) || err.code !== 'INVALID_EVENT') throw err
        let why = err.message
        try { JSON.stringify(message) } catch (e) { why = String((e as Error)?.message ?? e) }
        session.append('tool/result', { message: errorResult(call.id, `tool ${call.name} returned blocks that cannot `
          + `be stored as JSON (${why}); a tool must return plain data: strings, finite numbers, arrays, plain `
          + 'objects', 'TOOL_BAD_OUTPUT'), surfaceOp: { op: 'append' } })
      }
    }
  }

  /** Tokens and cost of the session so far ({@link CostLedger.usage}), priced with the provider's table as logged. */
  usage(): SessionUsage { return CostLedger.of(this.session).usage() }

  /** The prompt-cache cost of the edit logged as event `seq`, at the provider's prices ({@link CostLedger.editCost}) */
  editCost(seq: number): EditCost | undefined {
    return CostLedger.of(this.session).editCost(seq, this.prices.conversation)
  }

  /** Runs the ladder now with trigger `manual` (the CLI's `/compact`). */
  compact(signal?: AbortSignal): Promise<CompactionOutcome> { return this.ladder.compact(signal) }

  /**
   * Runs the ladder now with trigger `manual`; `focus` (e.g. "the parser bug") is passed into the
   * summary instruction (the CLI's `/compact FOCUS`). Throws TypeError for a focus that is not a string.
   */
  compactNow(options: { focus?: string; signal?: AbortSignal } = {}): Promise<CompactionOutcome> {
    if (options.focus !== undefined && typeof options.focus !== 'string')
      throw new TypeError(`focus must be a string, got ${typeof options.focus}`)
    return this.ladder.compact(options.signal, { focus: options.focus })
  }
}

/**
 * Module-private helpers that tests and benchmarks reach (docs/design.md §14): not part of the
 * public API, may change in any release, left out of dsh.d.mts.
 * @internal
 */
export const internals = /* @__PURE__ */ Object.freeze({
  tuning: { adapter: adapterTuning, ladder: ladderTuning }, selectRegion, summarise, summaryMaxTokens, recallTool,
  regionLedger, trimLedger, renderLedger, spillToolResult, isPeakTime, requestCostUSD, cacheCostUSD, Ladder, stateOf,
  overflowCounts,
})

// ═══════════════════════════════════════
// ═══════════════════════════════════════
// FENCE. Above: Part I, the runtime (web standards only). Below: Part II, the extras (tools,
// replay, CLI). Nothing in Part I names anything in Part II: the build cuts the file here to make
// `dist/dsh.mjs` and type-checks that part alone, so a reference across the fence fails the build.
// Part II may name Part I freely. Its top level holds only declarations and literals (no calls),
// so a bundler importing the runtime from this file drops Part II entirely.
// ═══════════════════════════════════════
// ═══════════════════════════════════════

// ════════════════════════════════════════════════════════════════════════════════════════════
// 9. Tools — the CLI's built-in coding tools (docs/design.md §8, §13)
// ════════════════════════════════════════════════════════════════════════════════════════════

// The file system and process code of dsh.ts. `node:` modules are loaded here through dynamic
// `import()` only, so that the core still bundles for edge runtimes (docs/runtimes.md).

/** Defaults of {@link builtinTools} (units in the names). */
export const BUILTIN_TOOL_DEFAULTS = /* @__PURE__ */ Object.freeze({
  /** Cap on one tool's output in UTF-16 units. 100,000 ≈ 25,000 tokens by §2, the size of a big
   *  read in common coding agents; above it the pruner (§3) and the spill (§5) take over anyway. */
  maxOutputUnits: 100_000,
  /** read_file: lines read when the model gives no `limit`. */
  readLimitLines: 2_000,
  /** list_files: entries listed at most (recursive listings stop there). */
  listMaxEntries: 1_000,
  /** grep: matches reported when the model gives no `max_matches`. */
  grepDefaultMatches: 100,
  /** grep: the most matches the model may ask for. */
  grepMaxMatches: 1_000,
  /** grep: time limit of one search (walk, glob and regex matching, in a worker), in ms. */
  grepTimeoutMs: 30_000,
  /** grep: lines longer than this (UTF-16 units) are not matched against a regular expression
   *  (a quadratic pattern on a minified line never ends); they are counted, and fixed_strings searches them. */
  grepMaxLineUnits: 10_000,
  /** write_file and edit_file: the largest file they write, and the largest file edit_file reads, in bytes. */
  maxWriteBytes: 16_777_216, // 16 MiB
  /** shell: timeout of a command when the model gives no `timeout_ms`, in ms. */
  shellTimeoutMs: 120_000,
  /** shell: the longest `timeout_ms` the model may ask for, in ms. */
  shellMaxTimeoutMs: 600_000,
})

/** Directories that list_files and grep never descend into (they may still be named as `path`). */
const TOOL_SKIP_DIRS: ReadonlySet<string> = new Set(['node_modules', '.git'])
/** Bytes sniffed for a NUL byte to call a file binary (the heuristic of git and grep). */
const TOOL_BINARY_SNIFF_BYTES = 8_192 // 8 KiB
/** grep: files larger than this many bytes are skipped (and counted in the summary). */
const GREP_MAX_FILE_BYTES = 16_777_216 // 16 MiB
/** grep: a matching line is shown up to this many UTF-16 units. */
const GREP_LINE_UNITS = 500
/** shell: ms between SIGTERM and SIGKILL of the process group, and again before giving up on its pipes. */
const SHELL_KILL_GRACE_MS = 1_000

/** Options of {@link builtinTools}. Every number is a positive integer in the unit its name says. */
export interface BuiltinToolsOptions {
  /** Working directory. Relative paths resolve against it, and every path must stay inside it
   *  after symlinks are resolved (realpath). It must exist. */
  cwd: string
  /** Offer the `shell` tool (docs/design.md §8: only with `--allow-shell` or an interactive yes). Default false. */
  allowShell?: boolean
  /** Cap on each tool's output in UTF-16 units; a one-line notice after the cut says what was left
   *  out and how to get it. `shell` gives each of stdout and stderr half of it (its first and last
   *  quarter), with a marker in the middle. Default {@link BUILTIN_TOOL_DEFAULTS}.maxOutputUnits (100,000). */
  maxOutputUnits?: number
  /** read_file: lines read when the model gives no `limit`. Default 2,000. */
  readLimitLines?: number
  /** list_files: entries listed at most. Default 1,000. */
  listMaxEntries?: number
  /** grep: the most matches the model may ask for with `max_matches`. Default 1,000. */
  grepMaxMatches?: number
  /** grep: time limit of one search in ms; past it the worker is stopped and the tool fails naming the limit. Default 30,000. */
  grepTimeoutMs?: number
  /** grep: longest line (UTF-16 units) matched against a regular expression. Default 10,000. */
  grepMaxLineUnits?: number
  /** shell: timeout in ms when the model gives no `timeout_ms`. Default 120,000. */
  shellTimeoutMs?: number
  /** shell: the longest `timeout_ms` the model may ask for, in ms. Default 600,000. */
  shellMaxTimeoutMs?: number
  /** shell: the environment commands start from. Default: this process's environment. Either way
   *  it is scrubbed by {@link shellEnvironment} with `shellEnvKeep` and `shellEnvDrop`. */
  shellEnv?: Record<string, string | undefined>
  /** write_file and edit_file: the largest file they write (and edit_file reads), in bytes. Default 16 MiB. */
  maxWriteBytes?: number
  /** The session log's path (the CLI's `--session`): the write tools refuse it, its lock file, its
   *  artefacts and its torn-line copies (every `FILE.*`), wherever it lies. */
  sessionLog?: string
  /** More paths (files or directories) the write tools refuse and a sandboxed command sees read-only, wherever they
   *  lie: the CLI gives its own settings and kept sessions (`$XDG_CONFIG_HOME/dsh`, `$XDG_STATE_HOME/dsh`), which a
   *  model that could write them could use to approve its own commands in the next run. One inside `cwd` that does
   *  not exist yet is made as an empty directory (mode 0700), so that the sandbox can hold it read-only. */
  protectedPaths?: readonly string[]
  /** Called with each change `write_file`, `edit_file` and `shell` are about to make, after every
   *  check passed and before anything is written or run (the CLI's approvals, diffs and undo). A
   *  throw refuses the change: its message becomes the tool's error result, nothing is changed. */
  beforeChange?: (change: ToolChange, signal: AbortSignal) => void | Promise<void>
  /** Called once a file change of `write_file` or `edit_file` is on disk (not for `shell`). */
  afterChange?: (change: ToolChange) => void | Promise<void>
  /** shell: names of variables kept although they look secret (`--shell-env NAME`). */
  shellEnvKeep?: readonly string[]
  /** shell: names of variables always dropped, e.g. the API key variables; a variable holding the
   *  same value as one of them (or, for values of 8 characters or more, containing it) is dropped too. */
  shellEnvDrop?: readonly string[]
  /** shell: run every command in a bubblewrap sandbox (Linux; {@link ShellSandboxOptions}). Absent: commands
   *  run unconfined, with the scrubbed environment above. */
  sandbox?: ShellSandboxOptions
}

/**
 * The shell tool's sandbox (docs/design.md §13): each command runs under bubblewrap (`bwrap`) with
 * the working directory writable except the protected set (every git directory, the project
 * instructions and what they resolve to, `.dsh/`, the session log and its files: read-only), the
 * rest of the file system read-only, the home directory replaced by an empty one, a private
 * `/tmp`, its own PID namespace (every process it started dies with it), no network, and an
 * environment built from an allow-list (PATH, LANG, LC_*, TERM, HOME, USER… plus `shellEnvKeep`).
 */
export interface ShellSandboxOptions {
  /** Share the host's network (else the command has only a loopback of its own). Default false. */
  allowNetwork?: boolean
  /** Paths outside the working directory that commands may read (bound read-only at the same
   *  path, e.g. `~/.gitconfig`); relative ones resolve against `cwd`; missing ones are skipped. */
  readPaths?: readonly string[]
  /** Called once by {@link builtinTools} with the reason when bwrap is missing or cannot start
   *  here (not Linux, not installed, user namespaces refused); commands then run unconfined.
   *  Without it, builtinTools throws instead. */
  onUnavailable?: (reason: string) => void
  /** The bwrap executable. Default `bwrap` (found on PATH). */
  bwrap?: string
}

/**
 * A change a built-in tool is about to make ({@link BuiltinToolsOptions.beforeChange}): a file
 * write with the file's bytes before (`before` absent when `existed` is false, or when the old file
 * is over `maxWriteBytes`) and its text after; or a shell command line. `path` is relative to the
 * working directory (`/`-separated), `realPath` absolute with symlinks resolved.
 */
export type ToolChange =
  | { tool: 'write_file' | 'edit_file'; path: string; realPath: string; existed: boolean; before?: Uint8Array; after: string }
  | { tool: 'shell'; command: string }
/** The option names of {@link BuiltinToolsOptions} that are hooks (functions), not numbers or lists. */
const BUILTIN_TOOL_HOOKS: readonly string[] = ['beforeChange', 'afterChange']

type NodeFs = typeof import('node:fs/promises')
type NodePath = typeof import('node:path')
interface ToolHost {
  fs: NodeFs
  path: NodePath
  /** realpath of the working directory. */
  root: string
  maxOutputUnits: number
  maxWriteBytes: number
  /** {@link BuiltinToolsOptions.beforeChange} and `afterChange`. */
  hooks: Pick<BuiltinToolsOptions, 'beforeChange' | 'afterChange'>
  /** Real paths the write tools refuse: the session log (with everything named `P.*` beside it), the embedder's. */
  protectedPaths: ProtectedPath[]
  /** The shell sandbox, when it runs (bwrap started at the probe). */
  sandbox?: SandboxRuntime
}

/**
 * The built-in coding tools of the CLI (docs/design.md §8): `read_file`, `list_files`, `grep`,
 * `write_file`, `edit_file`, and `shell` when `allowShell` is true. Plain {@link Tool} objects; any
 * agent can use them.
 *
 * Confinement: a path argument resolves against `cwd`, then through every symlink (realpath, also
 * for files that do not exist yet and for dangling links); a path that lands outside `cwd` is
 * refused with an error that names the resolved path. The write tools also refuse the protected
 * set (every git directory however named or reached, what the project instructions resolve to,
 * `.dsh/`, the session log). With `sandbox` (Linux, bubblewrap), each `shell` command runs with
 * that same set bound read-only, the rest of the file system read-only, an empty home, no network
 * and an allow-list environment ({@link ShellSandboxOptions}); without it a command can reach
 * anything the user can, which is why the shell is opt-in, and its environment is only scrubbed
 * ({@link shellEnvironment}). Either way it runs in its own process group, and when it exits, times
 * out or is cancelled — and when this process exits — the group and every process carrying one of
 * its job marks (the environment variable, or the descriptor inherited as fd 3: also those that
 * left the group with setsid and cleared their environment) are killed; in the sandbox its PID
 * namespace ends every process it started (docs/design.md §13). Unconfined, a process that drops
 * every mark escapes; a result never calls it killed (its output left open says it may still run).
 * Checks and file operations are not
 * atomic: a process that swaps a directory for a symlink between them is out of scope.
 *
 * Output: each tool keeps at most `maxOutputUnits` UTF-16 units of its own output and then adds
 * one notice line saying how much was left out and how to get more (offset, a narrower path…).
 * Failures throw an `Error` whose message starts with the tool's name and says what to do
 * instead; the loop turns it into an error result for the model (docs/design.md §7). `shell` returns
 * `{content, isError: true}` for a non-zero exit, a timeout or a cancellation, with the output so far.
 *
 * Needs a runtime with `node:fs/promises`, `node:path` (and `node:child_process` for `shell`):
 * Node ≥ 20, Deno, Bun.
 * @throws TypeError for a bad option; Error when `cwd` does not exist or is not a directory, and
 * when `sandbox` is given without `onUnavailable` but bwrap cannot start.
 */
export async function builtinTools(options: BuiltinToolsOptions): Promise<Tool[]> {
  const known = ['cwd', 'allowShell', 'maxOutputUnits', 'readLimitLines', 'listMaxEntries', 'grepMaxMatches', 'grepTimeoutMs', 'grepMaxLineUnits', 'shellTimeoutMs', 'shellMaxTimeoutMs', 'shellEnv', 'shellEnvKeep', 'shellEnvDrop', 'maxWriteBytes', 'sessionLog', 'protectedPaths', 'sandbox']
  for (const key of Object.keys(options)) {
    if (!known.includes(key) && !BUILTIN_TOOL_HOOKS.includes(key)) throw new TypeError(`builtinTools: unknown option "${key}"; known options: ${[...known, ...BUILTIN_TOOL_HOOKS].join(', ')}`)
  }
  if (typeof options.cwd !== 'string' || options.cwd === '') throw new TypeError('builtinTools: options.cwd must be a non-empty directory path')
  const num = (name: keyof typeof BUILTIN_TOOL_DEFAULTS): number => {
    const value = (options as unknown as Record<string, unknown>)[name] ?? BUILTIN_TOOL_DEFAULTS[name]
    if (!isIntegerAtLeast(value, 1)) {
      throw new TypeError(`builtinTools: options.${name} must be a positive integer, got ${String(value)} (default ${BUILTIN_TOOL_DEFAULTS[name]})`)
    }
    return value
  }
  const maxOutputUnits = num('maxOutputUnits')
  const readLimitLines = num('readLimitLines')
  const listMaxEntries = num('listMaxEntries')
  const grepMaxMatches = num('grepMaxMatches')
  const grepLimits = { timeoutMs: num('grepTimeoutMs'), maxLineUnits: num('grepMaxLineUnits') }
  const shellTimeoutMs = num('shellTimeoutMs')
  const shellMaxTimeoutMs = num('shellMaxTimeoutMs')
  if (shellTimeoutMs > shellMaxTimeoutMs) {
    throw new TypeError(`builtinTools: options.shellTimeoutMs (${shellTimeoutMs} ms) exceeds options.shellMaxTimeoutMs (${shellMaxTimeoutMs} ms)`)
  }
  const [fs, path] = await Promise.all([importNode<NodeFs>('node:fs/promises'), importNode<NodePath>('node:path')])
  let root: string
  try { root = await fs.realpath(path.resolve(options.cwd)) } catch (error) {
    throw new Error(`builtinTools: working directory ${options.cwd} is not usable (${fsErrorReason(error)})`, { cause: error })
  }
  if (!(await fs.stat(root)).isDirectory()) throw new Error(`builtinTools: working directory ${options.cwd} is not a directory`)
  if (options.sessionLog !== undefined && (typeof options.sessionLog !== 'string' || options.sessionLog === '')) throw new TypeError('builtinTools: options.sessionLog must be a file path')
  const guarded = options.protectedPaths ?? []
  if (!Array.isArray(guarded) || !guarded.every((p) => typeof p === 'string' && p !== '')) throw new TypeError('builtinTools: options.protectedPaths must be an array of paths')
  for (const name of BUILTIN_TOOL_HOOKS) {
    const hook = (options as unknown as Record<string, unknown>)[name]
    if (hook !== undefined && typeof hook !== 'function') throw new TypeError(`builtinTools: options.${name} must be a function`)
  }
  const hooks = { beforeChange: options.beforeChange, afterChange: options.afterChange }
  const host: ToolHost = { fs, path, root, maxOutputUnits, maxWriteBytes: num('maxWriteBytes'), hooks, protectedPaths: [] }
  if (options.sessionLog !== undefined) host.protectedPaths.push({ real: await realpathLenient(host, path.resolve(root, options.sessionLog)), kind: 'session', siblings: true })
  for (const p of guarded) {
    // One inside the working directory that is not there yet is made (an empty directory): a sandboxed command could
    // otherwise create it, since no mount can hold a name that does not exist.
    const abs = path.resolve(root, p)
    if (isInside(path, root, abs) && !(await fs.lstat(abs).catch(() => undefined))) await fs.mkdir(abs, { recursive: true, mode: 0o700 }).catch(() => {})
    host.protectedPaths.push({ real: await realpathLenient(host, abs), kind: 'settings' })
  }
  const tools = [
    readFileTool(host, readLimitLines),
    listFilesTool(host, listMaxEntries),
    grepTool(host, Math.min(BUILTIN_TOOL_DEFAULTS.grepDefaultMatches, grepMaxMatches), grepMaxMatches, grepLimits),
    writeFileTool(host),
    editFileTool(host),
  ]
  if (options.allowShell === true) {
    for (const key of ['shellEnvKeep', 'shellEnvDrop'] as const) {
      const list = options[key]
      if (list !== undefined && !(Array.isArray(list) && list.every((n) => typeof n === 'string'))) throw new TypeError(`builtinTools: options.${key} must be an array of variable names`)
    }
    const base = options.shellEnv ?? (await importNode<any>('node:process')).default.env
    const lists = { keep: options.shellEnvKeep, drop: options.shellEnvDrop }
    if (options.sandbox !== undefined) host.sandbox = await startSandbox(host, options.sandbox, base)
    const env = host.sandbox ? sandboxEnvironment(base, lists) : shellEnvironment(base, lists)
    tools.push(shellTool(host, shellTimeoutMs, shellMaxTimeoutMs, env))
  }
  return tools
}

// ── argument checks: a wrong argument is an error the model can read and fix ──

function toolArgs(tool: string, args: unknown, keys: readonly string[]): Record<string, unknown> {
  if (args === null || typeof args !== 'object' || Array.isArray(args)) {
    throw new Error(`${tool}: arguments must be a JSON object with the keys ${keys.join(', ')}`)
  }
  for (const key of Object.keys(args)) {
    if (!keys.includes(key)) throw new Error(`${tool}: unknown argument "${key}"; the arguments are ${keys.join(', ')}`)
  }
  return args as Record<string, unknown>
}

/** A model's argument value as an error quotes it: JSON capped like recall's quotes ({@link echo}); a
 *  value nested too deeply for JSON.stringify (a stack overflow) is named, not printed. */
function quoteArgument(value: unknown): string {
  let json: string | undefined
  try { json = JSON.stringify(value) } catch { return `${Array.isArray(value) ? 'an array' : 'an object'} nested too deeply to print` }
  return json === undefined ? String(value) : headCodePoints(json, RECALL_HIT_CODE_POINTS)
}

function argString(tool: string, args: Record<string, unknown>, key: string, fallback?: string): string {
  const value = args[key] ?? fallback
  if (value === undefined) throw new Error(`${tool}: the argument "${key}" is required`)
  if (typeof value !== 'string') throw new Error(`${tool}: "${key}" must be a string, got ${quoteArgument(value)}`)
  return value
}

/** An integer argument; a string of digits is accepted too (some models quote numbers). */
function argInt(tool: string, args: Record<string, unknown>, key: string, fallback: number, min: number, max: number, unit: string): number {
  let value = args[key]
  if (value === undefined || value === null) return fallback
  if (typeof value === 'string' && /^\d+$/.test(value.trim())) value = Number(value.trim())
  if (!isIntegerAtLeast(value, min) || value > max) {
    throw new Error(`${tool}: "${key}" must be an integer from ${min} to ${max} (${unit}), got ${quoteArgument(value)}`)
  }
  return value as number
}

/** A boolean argument; the strings "true" and "false" are accepted too. */
function argBool(tool: string, args: Record<string, unknown>, key: string): boolean {
  const value = args[key]
  if (value === undefined || value === null || value === false || value === 'false') return false
  if (value === true || value === 'true') return true
  throw new Error(`${tool}: "${key}" must be true or false, got ${quoteArgument(value)}`)
}

// ── paths ──

function fsErrorReason(error: unknown): string {
  const code = (error as { code?: unknown } | null)?.code
  switch (code) {
    case 'ENOENT': return 'it does not exist'
    case 'EACCES': case 'EPERM': return 'permission denied'
    case 'ENOTDIR': return 'a part of the path is a file, not a directory'
    case 'EISDIR': return 'it is a directory'
    case 'ELOOP': return 'too many symbolic links (a symlink loop)'
    default: return error instanceof Error ? error.message : String(error)
  }
}

/** `error` rethrown as an Error naming the tool and the path; `hint` says what to do about it. */
function fsError(tool: string, shown: string, error: unknown, hint = ''): Error {
  const missing = (error as { code?: unknown } | null)?.code === 'ENOENT'
  const fix = hint || (missing ? '; check the path with list_files' : '')
  return new Error(`${tool}: cannot use ${shown}: ${fsErrorReason(error)}${fix}`, { cause: error })
}

/** Longest path argument accepted, in UTF-16 units (Linux PATH_MAX is 4,096 bytes). */
const TOOL_MAX_PATH_UNITS = 4096
/** Symlinks followed while resolving one path before it counts as a loop (as Linux's 40). */
const TOOL_MAX_SYMLINK_HOPS = 40

/**
 * realpath that also works for paths that do not exist yet (a new file's path is checked too): one `realpath` when the path exists; otherwise a walk from the file-system root, one
 * `lstat` per component, following symlinks by hand (also dangling ones, so that writing through
 * one cannot land outside) and keeping the missing tail as written. Cost linear in the number of
 * components (plus the links followed, at most {@link TOOL_MAX_SYMLINK_HOPS}); checks `signal`
 * between steps.
 */
async function realpathLenient(host: ToolHost, target: string, signal?: AbortSignal): Promise<string> {
  const { fs, path } = host
  try { return await fs.realpath(target) } catch (error) {
    const code = (error as { code?: unknown }).code
    if (code !== 'ENOENT' && code !== 'ENOTDIR') throw error
  }
  const { root } = path.parse(target)
  const rest = target.slice(root.length).split(path.sep).filter((c) => c !== '' && c !== '.')
  let real = root
  let hops = 0
  while (rest.length > 0) {
    if (signal?.aborted) throw Object.assign(new Error('cancelled'), { code: 'ABORT_ERR' })
    const part = rest.shift()!
    if (part === '..') { real = path.dirname(real); continue }
    const next = path.join(real, part)
    let st
    try { st = await fs.lstat(next) } catch (error) {
      const code = (error as { code?: unknown }).code
      if (code === 'ENOENT' || code === 'ENOTDIR') return path.resolve(next, ...rest) // missing from here on: the rest as written
      throw error
    }
    if (!st.isSymbolicLink()) { real = next; continue }
    if (++hops > TOOL_MAX_SYMLINK_HOPS) throw Object.assign(new Error(`too many symbolic links at ${next}`), { code: 'ELOOP' })
    const link = await fs.readlink(next)
    const linkRoot = path.parse(link).root
    if (linkRoot !== '') real = linkRoot
    rest.unshift(...link.slice(linkRoot.length).split(path.sep).filter((c) => c !== '' && c !== '.'))
  }
  return real
}

function isInside(path: NodePath, root: string, target: string): boolean {
  const rel = path.relative(root, target)
  return rel === '' || !(rel === '..' || rel.startsWith('..' + path.sep) || path.isAbsolute(rel))
}

/** A path as the model sees it: relative to the working directory, `/`-separated, `.` for the root. */
function shownPath(host: ToolHost, real: string): string {
  const rel = host.path.relative(host.root, real)
  return rel === '' ? '.' : rel.split(host.path.sep).join('/')
}

/** Resolves a path argument and refuses it when it leaves the working directory. */
async function confine(host: ToolHost, tool: string, input: string, signal?: AbortSignal): Promise<{ real: string; shown: string }> {
  const { path, root } = host
  if (input === '') throw new Error(`${tool}: "path" is empty; give a path relative to the working directory, e.g. "."`)
  if (input.includes('\0')) throw new Error(`${tool}: "path" contains a NUL character`)
  if (input.length > TOOL_MAX_PATH_UNITS) throw new Error(`${tool}: "path" is ${input.length} characters long; the limit is ${TOOL_MAX_PATH_UNITS}`)
  const lexical = path.resolve(root, input)
  let real: string
  try { real = await realpathLenient(host, lexical, signal) } catch (error) {
    if (signal?.aborted) throw new Error(`${tool}: cancelled`)
    throw fsError(tool, JSON.stringify(input), error)
  }
  if (!isInside(path, root, real)) {
    const how = isInside(path, root, lexical) ? 'through a symlink to' : 'to'
    throw new Error(`${tool}: ${JSON.stringify(input)} is outside the working directory ${root} ` +
      `(it resolves ${how} ${real}); these tools can only reach files inside the working directory, so use a path inside it`)
  }
  return { real, shown: shownPath(host, real) }
}

// ── opening without a check-then-use gap (docs/design.md §13) ──

/** The path the kernel gives for an open handle (Linux /proc/self/fd), or undefined where there is none. */
async function handlePath(host: ToolHost, handle: { fd: number }): Promise<string | undefined> {
  try { return await host.fs.readlink(`/proc/self/fd/${handle.fd}`) } catch { return undefined }
}

/**
 * Opens `real` for reading without following a symlink at its end (O_NOFOLLOW) and without
 * blocking on a FIFO (O_NONBLOCK), then checks the handle: a regular file, and — where the kernel
 * tells (Linux) — at `real` itself, so a directory swapped for a symlink after {@link confine}
 * is caught. The caller closes the handle.
 */
async function openVerified(host: ToolHost, tool: string, real: string, shown: string, missingHint = ''): Promise<{ handle: import('node:fs/promises').FileHandle; size: number; nlink: number }> {
  const { O_RDONLY, O_NOFOLLOW = 0, O_NONBLOCK = 0 } = host.fs.constants
  let handle: import('node:fs/promises').FileHandle
  try { handle = await host.fs.open(real, O_RDONLY | O_NOFOLLOW | O_NONBLOCK) } catch (error) {
    const code = (error as { code?: unknown }).code
    if (code === 'ELOOP') throw new Error(`${tool}: ${shown} became a symbolic link after it was checked; not opened`)
    throw fsError(tool, shown, error, code === 'ENOENT' ? missingHint : '')
  }
  try {
    const st = await handle.stat()
    if (st.isDirectory()) throw new Error(`${tool}: ${shown} is a directory; use list_files to see what is in it`)
    if (!st.isFile()) throw new Error(`${tool}: ${shown} is not a regular file (a FIFO, socket or device); these tools read and write regular files only`)
    const opened = await handlePath(host, handle)
    if (opened !== undefined && opened !== real) throw new Error(`${tool}: ${shown} resolved to ${opened} when opened, not ${real} (a path changed after it was checked); not used`)
    return { handle, size: st.size, nlink: st.nlink }
  } catch (error) { await handle.close(); throw error }
}

// ── the protected set: what neither the write tools nor a sandboxed command may change ──

/** dsh's own configuration of a project: this directory at the root of the working directory. */
const DSH_CONFIG_DIR = '.dsh'
/** The sandbox's scan for git directories stops after this many directories (it skips node_modules). */
const SANDBOX_SCAN_MAX_DIRS = 50_000
/** Bytes of a `.git` file (or a `commondir` file) read for its pointer. */
const GIT_POINTER_MAX_BYTES = 4096

/** What a protected path is (the refusal says it): a git directory, the project instructions, dsh's config, the session
 *  log, or one of {@link BuiltinToolsOptions.protectedPaths} (the CLI's own settings and kept sessions). */
type ProtectedKind = 'git' | 'instructions' | 'config' | 'session' | 'settings'
/** A protected real path and everything below it; `siblings`: also every `real.*` beside it (the session log's files). */
interface ProtectedPath { real: string; kind: ProtectedKind; siblings?: boolean; via?: string }
/** A name no bind mount can hold still (a symlink, or nothing yet): the sandbox puts it back after each command. */
interface PinnedName { path: string; link?: string; kind: ProtectedKind }
interface ProtectedSet { paths: ProtectedPath[]; pinned: PinnedName[]; scanStopped: boolean }

/** Whether a directory is a git repository by what it holds, as git decides: a HEAD, and an objects/ and a refs/ (or a
 *  `commondir` file naming where they are, as a worktree's git directory has). */
function holdsGitRepository(has: (name: string, dir: boolean) => boolean): boolean {
  return has('HEAD', false) && ((has('objects', true) && has('refs', true)) || has('commondir', false))
}

/**
 * The protected set (docs/design.md §13), the one rule behind both the write tools' refusals and
 * the sandbox's read-only binds: the session log and its `LOG.*` files; the project instructions
 * (AGENTS.md, CLAUDE.md at the root) and whatever they resolve to; `.dsh/` and what it resolves to;
 * every git directory — one named `.git` (any case), one that holds HEAD + objects/ + refs/ under
 * any name, and the targets of `.git` links and of `.git` files' `gitdir:` (and `commondir`)
 * pointers. `scope` is the one path a write tool is about to write (only its ancestors are looked
 * at, and a write that would complete a repository counts) or `'project'` for the sandbox (a scan
 * of the tree, not entering node_modules or symlinks, at most {@link SANDBOX_SCAN_MAX_DIRS} directories).
 */
async function protectedSet(host: ToolHost, scope: string | 'project'): Promise<ProtectedSet> {
  const { fs, path, root } = host
  const set: ProtectedSet = { paths: [...host.protectedPaths], pinned: [], scanStopped: false }
  const lstat = (p: string) => fs.lstat(p).catch(() => undefined)
  const resolve = (p: string) => realpathLenient(host, p).catch(() => p)
  // A `.git` entry: the directory itself, a link's target (and the link), a file's pointers.
  const gitEntry = async (entry: string, st: { isDirectory(): boolean; isSymbolicLink(): boolean; isFile(): boolean }): Promise<void> => {
    set.paths.push({ real: entry, kind: 'git' })
    if (st.isSymbolicLink()) {
      set.pinned.push({ path: entry, link: await fs.readlink(entry).catch(() => ''), kind: 'git' })
      set.paths.push({ real: await resolve(entry), kind: 'git', via: entry })
    } else if (st.isFile()) {
      const pointer = /^gitdir:\s*(.+?)\s*$/m.exec(await readHead(host, entry))
      if (!pointer) return
      const gitdir = await resolve(path.resolve(path.dirname(entry), pointer[1]))
      set.paths.push({ real: gitdir, kind: 'git', via: entry })
      const common = (await readHead(host, path.join(gitdir, 'commondir'))).trim()
      if (common !== '') set.paths.push({ real: await resolve(path.resolve(gitdir, common)), kind: 'git', via: entry })
    }
  }
  for (const [names, kind] of [[PROJECT_INSTRUCTION_FILES, 'instructions'], [[DSH_CONFIG_DIR], 'config']] as const) {
    for (const name of names) {
      const entry = path.join(root, name)
      const st = await lstat(entry)
      set.paths.push({ real: entry, kind })
      if (st === undefined) set.pinned.push({ path: entry, kind })
      else if (st.isSymbolicLink()) {
        set.pinned.push({ path: entry, link: await fs.readlink(entry).catch(() => ''), kind })
        set.paths.push({ real: await resolve(entry), kind, via: name })
      }
    }
  }
  if (scope !== 'project') {
    // The target's ancestors, root first: each may be a repository (counting what this write would create) or hold a .git entry.
    const rel = path.relative(root, scope).split(path.sep)
    for (let depth = 0; depth < rel.length; depth++) {
      const dir = path.join(root, ...rel.slice(0, depth))
      const child = rel[depth], leaf = depth === rel.length - 1
      const has = async (name: string, asDir: boolean): Promise<boolean> => {
        if (child.toLowerCase() === name.toLowerCase() && leaf !== asDir) return true
        const st = await lstat(path.join(dir, name))
        return st !== undefined && (asDir ? st.isDirectory() : !st.isDirectory())
      }
      const markers = ['HEAD', 'objects', 'refs', 'commondir'] as const
      const [dotGit, ...present] = await Promise.all([lstat(path.join(dir, '.git')), ...markers.map((m) => has(m, m === 'objects' || m === 'refs'))])
      if (holdsGitRepository((name) => present[markers.indexOf(name as typeof markers[number])])) set.paths.push({ real: dir, kind: 'git' })
      if (dotGit) await gitEntry(path.join(dir, '.git'), dotGit)
    }
    return set
  }
  const queue = [root]
  let scanned = 0
  while (queue.length > 0) {
    if (++scanned > SANDBOX_SCAN_MAX_DIRS) { set.scanStopped = true; break }
    const dir = queue.shift()!
    const dirents = await fs.readdir(dir, { withFileTypes: true }).catch(() => [])
    const types = new Map(dirents.map((d) => [d.name, d]))
    if (holdsGitRepository((name, asDir) => { const d = types.get(name); return d !== undefined && (asDir ? d.isDirectory() : !d.isDirectory()) })) {
      set.paths.push({ real: dir, kind: 'git' })
      continue
    }
    for (const d of dirents) {
      const entry = path.join(dir, d.name)
      if (d.name.toLowerCase() === '.git') await gitEntry(entry, d)
      else if (d.isDirectory() && d.name !== 'node_modules') queue.push(entry)
    }
  }
  return set
}

/** The first {@link GIT_POINTER_MAX_BYTES} bytes of a small file as text ('' when it cannot be read). */
async function readHead(host: ToolHost, file: string): Promise<string> {
  const handle = await host.fs.open(file, host.fs.constants.O_RDONLY | (host.fs.constants.O_NONBLOCK ?? 0)).catch(() => undefined)
  if (!handle) return ''
  try {
    if (!(await handle.stat()).isFile()) return ''
    const buffer = new Uint8Array(GIT_POINTER_MAX_BYTES)
    const { bytesRead } = await handle.read(buffer, 0, buffer.length, 0)
    return new TextDecoder().decode(buffer.subarray(0, bytesRead))
  } catch { return '' } finally { await handle.close() }
}

/** The protected path `real` falls under, if any: one of the set, a component named `.git` (any case), or an instruction file's name at the root (any case). */
function protectionOf(host: ToolHost, set: ProtectedSet, real: string): ProtectedPath | undefined {
  const { path, root } = host
  const rel = path.relative(root, real).split(path.sep)
  const dotGit = rel.findIndex((c) => c.toLowerCase() === '.git')
  if (dotGit !== -1) return { real: path.join(root, ...rel.slice(0, dotGit + 1)), kind: 'git' }
  if (rel.length === 1 && PROJECT_INSTRUCTION_FILES.some((f) => f.toLowerCase() === rel[0].toLowerCase())) return { real, kind: 'instructions' }
  return set.paths.find((p) => real === p.real || isInside(path, p.real, real) || (p.siblings === true && real.startsWith(p.real + '.')))
}

/**
 * Refuses a write the tools must never make (docs/design.md §13): into the protected set
 * ({@link protectedSet}: git directories however named or reached, the project instructions and
 * what they resolve to, `.dsh/`, the session log and its `LOG.*` files), to a file with more than
 * one hard link (its other names may lie outside), or to anything but a regular file.
 */
async function refuseWrite(host: ToolHost, tool: string, real: string, shown: string): Promise<{ mode?: number; bytes?: number }> {
  const hit = protectionOf(host, await protectedSet(host, real), real)
  if (hit?.kind === 'git') {
    const where = host.path.basename(hit.real).toLowerCase() === '.git' ? '.git' : `the git directory ${shownPath(host, hit.real)}${hit.via ? ` (${shownPath(host, hit.via)} points to it)` : ' (it holds HEAD with objects/ and refs/, or a commondir: git uses it as a repository)'}`
    throw new Error(`${tool}: ${shown} is inside ${where}; the tools never write git's own files (its config and hooks can run commands); change the working tree instead`)
  }
  if (hit?.kind === 'session') throw new Error(`${tool}: ${shown} is the session log or one of its files (${shownPath(host, hit.real)}.*); the tools never write the log of the session they run in`)
  // The project instructions go into the system prompt of every later session here: a model that
  // could write them could make an injected instruction permanent.
  if (hit?.kind === 'instructions') {
    throw new Error(`${tool}: ${shown} holds the project instructions${hit.via ? ` (${hit.via} resolves to it)` : ''} that dsh puts into the system prompt of every session in this directory; the tools never write it: tell the user what to change and let them edit it`)
  }
  if (hit?.kind === 'settings') throw new Error(`${tool}: ${shown} is inside ${shownPath(host, hit.real)}, which the tools never write (dsh's own settings and kept sessions: a change there could approve commands for later runs); tell the user what to change`)
  if (hit?.kind === 'config') throw new Error(`${tool}: ${shown} is inside ${DSH_CONFIG_DIR}${hit.via ? ` (what ${hit.via} resolves to)` : ''}, dsh's own configuration for this directory; the tools never write it: tell the user what to change`)
  let st
  try { st = await host.fs.lstat(real) } catch (error) {
    if ((error as { code?: unknown }).code === 'ENOENT') return {}
    throw fsError(tool, shown, error)
  }
  if (st.isDirectory()) throw new Error(`${tool}: ${shown} is a directory; give a file path`)
  if (st.isSymbolicLink()) throw new Error(`${tool}: ${shown} became a symbolic link after it was checked; not written`)
  if (!st.isFile()) throw new Error(`${tool}: ${shown} is not a regular file (a FIFO, socket or device); these tools write regular files only`)
  if (st.nlink > 1) throw new Error(`${tool}: ${shown} has ${st.nlink} hard links; writing it would change its other names too, which may lie outside the working directory; not written`)
  return { mode: st.mode & 0o7777, bytes: st.size }
}

/**
 * Writes `content` to `real` as a new file beside it (created exclusively, so no symlink is
 * followed; its directory checked through the open handle, Linux), then renamed over `real`: the
 * write lands whole or not at all, and never outside. A directory swapped for a symlink in between
 * can make the empty temp file appear outside for a moment; it is found through its handle and
 * removed. Keeps the old file's mode.
 */
async function writeReplacing(host: ToolHost, tool: string, real: string, shown: string, content: string | Uint8Array, mode: number | undefined): Promise<void> {
  const { fs, path } = host
  const dir = path.dirname(real)
  try { await fs.mkdir(dir, { recursive: true }) } catch (error) { throw fsError(tool, shown, error) }
  const temp = path.join(dir, `.${path.basename(real)}.dsh-${randomId()}.tmp`)
  let handle
  try { handle = await fs.open(temp, 'wx', mode ?? 0o666) } catch (error) { throw fsError(tool, shown, error) }
  let renamed = false
  let tempReal = temp // where the temp file really is: its cleanup must not follow a swapped path
  try {
    const opened = await handlePath(host, handle)
    if (opened !== undefined) tempReal = opened
    if (opened !== undefined && path.dirname(opened) !== dir) throw new Error(`${tool}: the directory of ${shown} resolved to ${path.dirname(opened)} when written, not ${dir} (a path changed after it was checked); not written`)
    await handle.writeFile(content, 'utf8')
    if (mode !== undefined) await handle.chmod(mode)
    await handle.close()
    handle = undefined
    await fs.rename(temp, real)
    renamed = true
  } catch (error) {
    throw error instanceof Error && error.message.startsWith(`${tool}:`) ? error : fsError(tool, shown, error)
  } finally {
    await handle?.close().catch(() => {})
    if (!renamed) await fs.unlink(tempReal).catch(() => {})
  }
}

// ── output caps ──

/** The first `maxUnits` UTF-16 units of `text`, one fewer when the cut would split a surrogate pair. */
function headUnits(text: string, maxUnits: number): string {
  if (text.length <= maxUnits) return text
  const end = maxUnits > 0 && isHigh(text.charCodeAt(maxUnits - 1)) ? maxUnits - 1 : maxUnits
  return text.slice(0, end)
}

/** Joins whole lines with `\n` while they fit in `maxUnits`; a first line longer than that is cut. */
function joinLinesCapped(lines: readonly string[], maxUnits: number): { text: string; count: number; firstCut: boolean } {
  let used = 0
  let count = 0
  for (const line of lines) {
    const cost = (count > 0 ? 1 : 0) + line.length
    if (used + cost > maxUnits) break
    used += cost
    count++
  }
  if (count === 0 && lines.length > 0) return { text: headUnits(lines[0], maxUnits), count: 1, firstCut: true }
  return { text: lines.slice(0, count).join('\n'), count, firstCut: false }
}

function hasNulByte(bytes: Uint8Array): boolean {
  return bytes.subarray(0, TOOL_BINARY_SNIFF_BYTES).includes(0)
}

function plural(n: number, word: string): string { return `${n} ${word}${n === 1 ? '' : 's'}` }

// ── read_file ──

/** read_file: the most bytes of a file one call reads (skipped lines and the unread rest of a long
 *  line count too), so that an offset far into a huge file, or a line without end (a 4 GiB sparse
 *  file), cannot keep a call reading toward EOF. 64 MiB is four times the largest file grep searches. */
const READ_FILE_MAX_SCAN_BYTES = 67_108_864 // 64 MiB

function readFileTool(host: ToolHost, defaultLines: number): Tool {
  const max = host.maxOutputUnits
  const scanMiB = READ_FILE_MAX_SCAN_BYTES / 1024 / 1024
  /** What to do about lines past the scan cap: only the shell reaches them. */
  const beyond = (shown: string) => `the shell tool, where offered, reads further (e.g. tail -c +${READ_FILE_MAX_SCAN_BYTES + 1} '${shown}' | head -c ${max})`
  return {
    name: 'read_file',
    description: `Read a text file inside the working directory. Each line comes back as its 1-based line number, a tab, then the text ("     7\\tconst x = 1"); the number and tab are not part of the file. Reads up to "limit" lines (default ${defaultLines}) from line "offset" (default 1), and at most ${max} characters, within the first ${scanMiB} MiB of the file; a note at the end says when the file continues and which offset reads on.`,
    parameters: {
      type: 'object',
      properties: {
        path: { type: 'string', description: 'File path, relative to the working directory.' },
        offset: { type: 'integer', minimum: 1, description: 'First line to read, 1-based. Default 1.' },
        limit: { type: 'integer', minimum: 1, description: `Number of lines to read. Default ${defaultLines}.` },
      },
      required: ['path'],
      additionalProperties: false,
    },
    async execute(rawArgs, ctx) {
      const args = toolArgs('read_file', rawArgs, ['path', 'offset', 'limit'])
      const offset = argInt('read_file', args, 'offset', 1, 1, Number.MAX_SAFE_INTEGER, 'a 1-based line number')
      const limit = argInt('read_file', args, 'limit', defaultLines, 1, Number.MAX_SAFE_INTEGER, 'lines')
      const { real, shown } = await confine(host, 'read_file', argString('read_file', args, 'path'), ctx.signal)
      const { handle, size } = await openVerified(host, 'read_file', real, shown)
      if (size === 0) { await handle.close(); return `(${shown} is empty: 0 bytes)` }
      // Streamed in chunks: reading lines 1-100 of a 1 GB log must not load the whole file.
      const lines: string[] = []
      let used = 0 // UTF-16 units in lines.join('\n')
      let lineNo = 0
      let stop: 'range' | 'cap' | 'long-line' | 'bytes' | undefined
      let reachableLines = 0 // lines that start within the scan cap, when it was reached
      let lastLineCut = false // the last line shown goes on past the scan cap
      const take = (raw: string): boolean => { // true = stop reading
        lineNo++
        if (lineNo < offset) return false
        if (lineNo >= offset + limit) { stop = 'range'; return true }
        const text = `${String(lineNo).padStart(6)}\t${raw.endsWith('\r') ? raw.slice(0, -1) : raw}`
        const cost = (lines.length > 0 ? 1 : 0) + text.length
        if (used + cost <= max) { lines.push(text); used += cost; return false }
        if (lines.length === 0) { lines.push(headUnits(text, max)); stop = 'long-line' } else stop = 'cap'
        return true
      }
      try {
        const decoder = new TextDecoder()
        const buffer = new Uint8Array(64 * 1024)
        let position = 0
        let pending = ''
        let skippingLongLine = false // the rest of a line longer than any output could show is dropped unread
        reading: for (;;) {
          if (ctx.signal.aborted) throw new Error('read_file: cancelled')
          if (position >= READ_FILE_MAX_SCAN_BYTES && position < size) {
            reachableLines = lineNo + (pending !== '' || skippingLongLine ? 1 : 0)
            // The line the cap came inside is shown as far as it was read, if it is wanted.
            if (!skippingLongLine && pending !== '' && lineNo + 1 >= offset) { if (take(pending)) break; lastLineCut = true }
            stop = 'bytes'
            break
          }
          const { bytesRead } = await handle.read(buffer, 0, Math.min(buffer.length, READ_FILE_MAX_SCAN_BYTES - position), position)
          if (bytesRead === 0) break
          if (position === 0 && hasNulByte(buffer.subarray(0, bytesRead))) {
            throw new Error(`read_file: ${shown} looks binary (a NUL byte in its first ${TOOL_BINARY_SNIFF_BYTES} bytes); read_file shows text files only`)
          }
          position += bytesRead
          let chunk = decoder.decode(buffer.subarray(0, bytesRead), { stream: true })
          if (skippingLongLine) {
            const newline = chunk.indexOf('\n')
            if (newline === -1) continue
            chunk = chunk.slice(newline)
            skippingLongLine = false
          }
          pending += chunk
          let start = 0
          for (let newline = pending.indexOf('\n'); newline !== -1; newline = pending.indexOf('\n', start)) {
            if (take(pending.slice(start, newline))) break reading
            start = newline + 1
          }
          pending = pending.slice(start)
          if (pending.length > max + 16) {
            // A line to show that cannot fit is shown cut (or left for the next call) without reading to its end.
            if (lineNo + 1 >= offset) { take(pending); break }
            pending = pending.slice(0, max + 16)
            skippingLongLine = true
          }
        }
        if (stop === undefined) {
          pending += decoder.decode()
          if (pending.length > 0) take(pending)
        }
      } finally { await handle.close() }
      if (lines.length === 0 && stop === 'bytes') {
        throw new Error(`read_file: line ${offset} of ${shown} (${size} bytes) does not start within its first ${READ_FILE_MAX_SCAN_BYTES} bytes, the most read_file reads per call; use an offset from 1 to ${reachableLines}, or ${beyond(shown)}`)
      }
      if (lines.length === 0) {
        throw new Error(`read_file: offset ${offset} is past the end of ${shown}, which has ${plural(lineNo, 'line')}; use an offset from 1 to ${lineNo}`)
      }
      const last = offset + lines.length - 1
      const body = lines.join('\n')
      switch (stop) {
        case undefined: return body
        case 'range': return `${body}\n[lines ${offset}-${last} of ${shown} shown; the file continues (${size} bytes in all); read more with offset=${last + 1}]`
        case 'cap': return `${body}\n[output capped at ${max} characters: lines ${offset}-${last} of ${shown} shown; read more with offset=${last + 1}]`
        case 'long-line': return `${body}\n[line ${last} of ${shown} is longer than the output cap of ${max} characters and was cut; the next line is at offset=${last + 1}; use grep to find text inside this line]`
        case 'bytes': return `${body}\n[lines ${offset}-${last} of ${shown} shown${lastLineCut ? ` (line ${last} up to byte ${READ_FILE_MAX_SCAN_BYTES})` : ''}; read_file reads at most ${READ_FILE_MAX_SCAN_BYTES} bytes of a file per call and stopped there (${size} bytes in all), so what follows is out of its reach; ${beyond(shown)}]`
      }
    },
  }
}

// ── list_files ──

function listFilesTool(host: ToolHost, maxEntries: number): Tool {
  const { fs, path } = host
  return {
    name: 'list_files',
    description: `List a directory inside the working directory. Paths come back relative to the working directory; directories end with "/", symlinks with "@". With recursive: true, lists subdirectories too (breadth-first, at most ${maxEntries} entries) but never descends into ${[...TOOL_SKIP_DIRS].join(' or ')} (list them by path to see inside).`,
    parameters: {
      type: 'object',
      properties: {
        path: { type: 'string', description: 'Directory, relative to the working directory. Default ".".' },
        recursive: { type: 'boolean', description: 'Also list subdirectories. Default false.' },
      },
      additionalProperties: false,
    },
    async execute(rawArgs, ctx) {
      const args = toolArgs('list_files', rawArgs, ['path', 'recursive'])
      const recursive = argBool('list_files', args, 'recursive')
      const { real, shown } = await confine(host, 'list_files', argString('list_files', args, 'path', '.'), ctx.signal)
      let st
      try { st = await fs.stat(real) } catch (error) { throw fsError('list_files', shown, error) }
      if (!st.isDirectory()) throw new Error(`list_files: ${shown} is a file, not a directory; use read_file to read it`)
      const entries: string[] = []
      const notDescended: string[] = []
      const queue = [real]
      let full = false
      for (let next = 0; next < queue.length && !full; next++) {
        if (ctx.signal.aborted) throw new Error('list_files: cancelled')
        const dir = queue[next]
        let dirents
        try { dirents = await fs.readdir(dir, { withFileTypes: true }) } catch (error) {
          if (dir === real) throw fsError('list_files', shown, error)
          entries.push(`${shownPath(host, dir)}/ (not listed: ${fsErrorReason(error)})`)
          continue
        }
        dirents.sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0))
        for (const dirent of dirents) {
          if (entries.length >= maxEntries) { full = true; break }
          const child = path.join(dir, dirent.name)
          const rel = shownPath(host, child)
          if (dirent.isDirectory()) {
            entries.push(`${rel}/`)
            if (!recursive) continue
            if (TOOL_SKIP_DIRS.has(dirent.name)) notDescended.push(`${rel}/`)
            else queue.push(child)
          } else entries.push(dirent.isSymbolicLink() ? `${rel}@` : rel)
        }
      }
      if (entries.length === 0) return `(${shown} is an empty directory)`
      entries.sort() // breadth-first keeps the shallow levels under the cap; sorted, they read as a tree
      const { text, count } = joinLinesCapped(entries, host.maxOutputUnits)
      const notes: string[] = []
      if (count < entries.length) notes.push(`[output capped at ${host.maxOutputUnits} characters: ${entries.length - count} more entries not shown; list a subdirectory to see them]`)
      if (full) notes.push(`[listing stopped at ${maxEntries} entries; list a subdirectory${recursive ? ', or list without recursive,' : ''} to see the rest]`)
      if (notDescended.length > 0) notes.push(`[not descended into: ${notDescended.join(', ')}; list them by path to see inside]`)
      return [text, ...notes].join('\n')
    },
  }
}

// ── grep ──

/** A glob as a RegExp over `/`-separated paths: `*` and `?` stay within a segment, `**` crosses
 *  segments (`**\/` also matches no directory), `[...]`/`[!...]` are classes, `{a,b}` alternatives. */
function globToRegExp(glob: string): RegExp {
  let out = ''
  let braces = 0
  for (let i = 0; i < glob.length; i++) {
    const c = glob[i]
    if (c === '*') {
      if (glob[i + 1] === '*') {
        const slash = glob[i + 2] === '/'
        out += slash ? '(?:.*/)?' : '.*'
        i += slash ? 2 : 1
      } else out += '[^/]*'
    } else if (c === '?') out += '[^/]'
    else if (c === '[') {
      const close = glob.indexOf(']', i + 2)
      if (close === -1) { out += '\\['; continue }
      const body = glob.slice(i + 1, close)
      out += `[${body.startsWith('!') ? '^' + body.slice(1) : body}]`
      i = close
    } else if (c === '{') { out += '(?:'; braces++ }
    else if (c === '}' && braces > 0) { out += ')'; braces-- }
    else if (c === ',' && braces > 0) out += '|'
    else out += c.replace(/[.*+?^${}()|[\]\\/]/g, '\\$&')
  }
  return new RegExp(`^${out}${')'.repeat(braces)}$`)
}

function escapeRegExp(text: string): string { return text.replace(/[.*+?^${}()|[\]\\]/g, '\\$&') }

/**
 * The search itself, as plain JavaScript for a worker thread (docs/design.md §13): walks `real`
 * (symlinks not followed, `skipDirs` not entered), filters files by the glob, matches each line,
 * and posts the result. A pattern that backtracks forever blocks only the worker, which the main
 * thread terminates at the deadline or on abort.
 */
const GREP_WORKER_SOURCE = `
const { parentPort, workerData: w } = require('node:worker_threads')
const fs = require('node:fs'), path = require('node:path')
const regex = new RegExp(w.source, w.flags)
const globRegex = w.glob === null ? undefined : new RegExp(w.glob)
const skip = new Set(w.skipDirs)
const out = { matches: [], filesSearched: 0, filesMatched: 0, skippedBinary: 0, skippedLarge: 0, longLines: 0, firstLongLine: undefined, reachedLimit: false }
const shown = (p) => { const rel = path.relative(w.root, p); return rel === '' ? '.' : rel.split(path.sep).join('/') }
const head = (t, n) => t.length <= n ? t : t.slice(0, n > 0 && (t.charCodeAt(n - 1) & 0xfc00) === 0xd800 ? n - 1 : n)
const { O_RDONLY, O_NOFOLLOW = 0, O_NONBLOCK = 0 } = fs.constants
/** The file's bytes, opened without following a symlink or blocking on a FIFO, and only if the
 *  handle is a regular file at this very path (Linux tells through /proc/self/fd). */
function readChecked(file) {
  let fd
  try { fd = fs.openSync(file, O_RDONLY | O_NOFOLLOW | O_NONBLOCK) } catch { return undefined }
  try {
    const st = fs.fstatSync(fd)
    if (!st.isFile()) return undefined
    let opened
    try { opened = fs.readlinkSync('/proc/self/fd/' + fd) } catch { opened = undefined }
    if (opened !== undefined && opened !== file) return undefined
    if (st.size > w.maxFileBytes) { out.skippedLarge++; return undefined }
    return fs.readFileSync(fd)
  } catch { return undefined } finally { fs.closeSync(fd) }
}
function searchFile(file) {
  const bytes = readChecked(file)
  if (bytes === undefined) return
  if (bytes.subarray(0, w.sniffBytes).includes(0)) { out.skippedBinary++; return }
  out.filesSearched++
  const text = new TextDecoder().decode(bytes)
  const rel = shown(file)
  let matched = false
  for (let start = 0, lineNo = 1; start <= text.length; lineNo++) {
    let end = text.indexOf('\\n', start)
    if (end === -1) { if (start === text.length) break; end = text.length }
    const line = text.charCodeAt(end - 1) === 13 ? text.slice(start, end - 1) : text.slice(start, end)
    start = end + 1
    if (line.length > w.maxLineUnits) { out.longLines++; out.firstLongLine ??= rel + ':' + lineNo; continue }
    if (!regex.test(line)) continue
    const cut = head(line, w.lineUnits)
    out.matches.push(rel + ':' + lineNo + ':' + cut + (cut.length < line.length ? ' [… ' + (line.length - cut.length) + ' more characters]' : ''))
    matched = true
    if (out.matches.length >= w.limit) { out.reachedLimit = true; break }
  }
  if (matched) out.filesMatched++
}
function walk(dir) {
  let dirents
  try { dirents = fs.readdirSync(dir, { withFileTypes: true }) } catch (error) { if (dir === w.real) throw error; return }
  dirents.sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0))
  for (const dirent of dirents) {
    if (out.reachedLimit) return
    const child = path.join(dir, dirent.name)
    if (dirent.isDirectory()) { if (!skip.has(dirent.name)) walk(child); continue }
    if (!dirent.isFile()) continue
    if (globRegex && !globRegex.test(w.globOnPath ? path.relative(w.real, child).split(path.sep).join('/') : dirent.name)) continue
    searchFile(child)
  }
}
if (w.isDir) walk(w.real)
else searchFile(w.real)
parentPort.postMessage(out)
`

interface GrepWorkerResult {
  matches: string[]; filesSearched: number; filesMatched: number; skippedBinary: number; skippedLarge: number
  longLines: number; firstLongLine?: string; reachedLimit: boolean
}

/** Runs {@link GREP_WORKER_SOURCE}; rejects naming the limit at `timeoutMs`, and at once on abort (the worker is terminated either way). */
async function runGrepWorker(data: Record<string, unknown>, timeoutMs: number, signal: AbortSignal): Promise<GrepWorkerResult> {
  if (signal.aborted) throw new Error('grep: cancelled')
  const { Worker } = await importNode<typeof import('node:worker_threads')>('node:worker_threads')
  const worker = new Worker(GREP_WORKER_SOURCE, { eval: true, workerData: data })
  return await new Promise<GrepWorkerResult>((resolve, reject) => {
    let settled = false
    const settle = (fn: () => void): void => {
      if (settled) return
      settled = true
      clearTimeout(timer)
      signal.removeEventListener('abort', onAbort)
      void worker.terminate()
      fn()
    }
    const onAbort = (): void => settle(() => reject(new Error('grep: cancelled')))
    const timer = setTimeout(() => settle(() => reject(new Error(
      `grep: stopped at the time limit of ${timeoutMs} ms (grepTimeoutMs); the pattern may backtrack without end (nested quantifiers such as (a+)+) or the search is too wide: simplify the pattern, use fixed_strings: true, or narrow path or glob`))), timeoutMs)
    signal.addEventListener('abort', onAbort, { once: true })
    worker.once('message', (result: GrepWorkerResult) => settle(() => resolve(result)))
    worker.once('error', (error: Error) => settle(() => reject(new Error(`grep: the search failed: ${headCodePoints(withoutRegExpEcho(fsErrorReason(error)), RECALL_HIT_CODE_POINTS)}`, { cause: error }))))
    worker.once('exit', (code: number) => settle(() => reject(new Error(`grep: the search worker stopped (exit code ${code}) before it answered`))))
  })
}

/** grep: the longest pattern, UTF-16 units: V8's longest run of literal characters (a fixed string of
 *  32,768 fails as "Regular expression too large" only when the search runs, quoting all of it). */
const GREP_MAX_PATTERN_UNITS = 32_767

/** An engine's regular-expression error without the pattern it quotes whole (a model's may be megabytes). */
const withoutRegExpEcho = (message: string): string => message.replace(/^Invalid regular expression: \/.*\/\w*: /s, 'invalid regular expression: ')

function grepTool(host: ToolHost, defaultMatches: number, maxMatches: number, limits: { timeoutMs: number; maxLineUnits: number }): Tool {
  const { fs } = host
  return {
    name: 'grep',
    description: `Search file contents inside the working directory, line by line, with a JavaScript regular expression (or a literal string with fixed_strings: true). Returns "path:line:text" for each matching line (text cut at ${GREP_LINE_UNITS} characters), then a summary. Skips ${[...TOOL_SKIP_DIRS].join(', ')}, symlinks, binary files and files over ${GREP_MAX_FILE_BYTES / 1024 / 1024} MiB; a regular expression is not tried on lines over ${limits.maxLineUnits} characters (they are counted; fixed_strings searches them), and a search stops after ${limits.timeoutMs} ms.`,
    parameters: {
      type: 'object',
      properties: {
        pattern: { type: 'string', description: 'JavaScript regular expression (no slashes or flags), or literal text with fixed_strings: true.' },
        path: { type: 'string', description: 'File or directory to search, relative to the working directory. Default ".".' },
        glob: { type: 'string', description: 'Only search files whose path matches this glob, e.g. "*.ts", "src/**/*.{js,mjs}". Without a "/" it matches the file name; with one, the path below "path".' },
        fixed_strings: { type: 'boolean', description: 'Treat pattern as literal text. Default false.' },
        ignore_case: { type: 'boolean', description: 'Case-insensitive search. Default false.' },
        max_matches: { type: 'integer', minimum: 1, maximum: maxMatches, description: `Stop after this many matching lines. Default ${defaultMatches}.` },
      },
      required: ['pattern'],
      additionalProperties: false,
    },
    async execute(rawArgs, ctx) {
      const args = toolArgs('grep', rawArgs, ['pattern', 'path', 'glob', 'fixed_strings', 'ignore_case', 'max_matches'])
      const pattern = argString('grep', args, 'pattern')
      if (pattern === '') throw new Error('grep: "pattern" is empty; give the text or regular expression to search for')
      if (pattern.length > GREP_MAX_PATTERN_UNITS) {
        throw new Error(`grep: "pattern" is ${pattern.length} characters long; the limit is ${GREP_MAX_PATTERN_UNITS}: search for a shorter part of the text`)
      }
      const fixed = argBool('grep', args, 'fixed_strings')
      const ignoreCase = argBool('grep', args, 'ignore_case')
      const limit = argInt('grep', args, 'max_matches', defaultMatches, 1, maxMatches, 'matching lines')
      const glob = args.glob === undefined ? undefined : argString('grep', args, 'glob')
      let regex: RegExp
      try { regex = new RegExp(fixed ? escapeRegExp(pattern) : pattern, ignoreCase ? 'i' : '') } catch (error) {
        throw new Error(`grep: ${echo(pattern)} is not a valid JavaScript regular expression (${withoutRegExpEcho((error as Error).message)}); fix it, or pass fixed_strings: true to search for the text literally`)
      }
      let globRegex: RegExp | undefined
      try { globRegex = glob === undefined || glob === '' ? undefined : globToRegExp(glob) } catch (error) {
        throw new Error(`grep: "glob" ${echo(glob!)} is not a valid glob (${withoutRegExpEcho((error as Error).message).replace(/^invalid regular expression: /, '')}); fix it, e.g. "*.ts" or "src/**/*.{js,mjs}", or leave it out`)
      }
      const globOnPath = glob !== undefined && glob.includes('/')
      const { real, shown } = await confine(host, 'grep', argString('grep', args, 'path', '.'), ctx.signal)
      let st
      try { st = await fs.stat(real) } catch (error) { throw fsError('grep', shown, error) }

      const { matches, filesSearched, filesMatched, skippedBinary, skippedLarge, longLines, firstLongLine, reachedLimit } = await runGrepWorker({
        root: host.root, real, isDir: st.isDirectory(), source: regex.source, flags: regex.flags, fixed,
        glob: globRegex?.source ?? null, globOnPath, limit, maxFileBytes: GREP_MAX_FILE_BYTES, maxLineUnits: fixed ? Infinity : limits.maxLineUnits,
        lineUnits: GREP_LINE_UNITS, skipDirs: [...TOOL_SKIP_DIRS], sniffBytes: TOOL_BINARY_SNIFF_BYTES,
      }, limits.timeoutMs, ctx.signal)

      const skipped = [
        skippedBinary > 0 ? plural(skippedBinary, 'binary file') : '',
        skippedLarge > 0 ? `${plural(skippedLarge, 'file')} over ${GREP_MAX_FILE_BYTES / 1024 / 1024} MiB` : '',
        longLines > 0 ? `${plural(longLines, 'line')} over ${limits.maxLineUnits} characters (first at ${firstLongLine}; search them with fixed_strings: true)` : '',
      ].filter(Boolean).join(' and ')
      const searched = `${plural(filesSearched, 'file')} searched${skipped ? `; skipped ${skipped}` : ''}`
      const what = `${fixed ? JSON.stringify(pattern) : `/${pattern}/`}${ignoreCase ? ' (ignoring case)' : ''}${glob ? ` in files matching ${glob}` : ''}`
      if (matches.length === 0) return `no matches for ${what} in ${shown} (${searched})`
      const { text, count } = joinLinesCapped(matches, host.maxOutputUnits)
      const notes: string[] = []
      if (count < matches.length) notes.push(`[output capped at ${host.maxOutputUnits} characters: ${matches.length - count} more matching lines not shown; narrow the path or glob]`)
      notes.push(reachedLimit
        ? `[stopped at max_matches=${limit}: ${plural(matches.length, 'matching line')} in ${plural(filesMatched, 'file')}; narrow the pattern, path or glob${limit < maxMatches ? `, or raise max_matches (up to ${maxMatches})` : ''}]`
        : `[${plural(matches.length, 'matching line')} in ${plural(filesMatched, 'file')}; ${searched}]`)
      return [text, ...notes].join('\n')
    },
  }
}

// ── write_file and edit_file ──

function writeFileTool(host: ToolHost): Tool {
  return {
    name: 'write_file',
    description: `Create or overwrite a file inside the working directory with the given content (UTF-8, at most ${host.maxWriteBytes} bytes). Parent directories are created as needed. Never writes inside a git directory, the project instructions (AGENTS.md, CLAUDE.md), .dsh, the session log, or a file with several hard links. To change part of an existing file, prefer edit_file.`,
    parameters: {
      type: 'object',
      properties: {
        path: { type: 'string', description: 'File path, relative to the working directory.' },
        content: { type: 'string', description: 'The complete new content of the file.' },
      },
      required: ['path', 'content'],
      additionalProperties: false,
    },
    async execute(rawArgs, ctx) {
      const args = toolArgs('write_file', rawArgs, ['path', 'content'])
      const content = argString('write_file', args, 'content')
      const bytes = utf8Length(content, host.maxWriteBytes)
      if (bytes > host.maxWriteBytes) throw new Error(`write_file: content is over ${host.maxWriteBytes} bytes, the most write_file writes; write the file in parts (write_file, then edit_file to add)`)
      const { real, shown } = await confine(host, 'write_file', argString('write_file', args, 'path'), ctx.signal)
      const { mode, bytes: previousBytes } = await refuseWrite(host, 'write_file', real, shown)
      refuseProjectConfig(host, 'write_file', real, shown)
      const change = await announceWrite(host, 'write_file', real, shown, content, ctx.signal, previousBytes)
      await writeReplacing(host, 'write_file', real, shown, content, mode)
      if (change) await host.hooks.afterChange?.(change)
      return `wrote ${plural(bytes, 'byte')} to ${shown} (${previousBytes === undefined ? 'new file' : `replaced ${plural(previousBytes, 'byte')}`})`
    },
  }
}

/**
 * Refuses a write into the project's `.dsh/` (any case; `real` has its symlinks resolved): dsh's
 * configuration of the directory, which can name the base URL and approve tools (docs/design.md §8).
 */
function refuseProjectConfig(host: ToolHost, tool: string, real: string, shown: string): void {
  const first = host.path.relative(host.root, real).split(host.path.sep)[0]
  const dir = PROJECT_CONFIG_FILE.split('/')[0]
  if (first.toLowerCase() === dir) throw new Error(`${tool}: ${shown} is inside ${dir}, dsh's own configuration for this directory; the tools never write it: tell the user what to change`)
}

/** The file's bytes now (undefined when it does not exist), for a write's {@link ToolChange}. */
async function currentBytes(host: ToolHost, tool: string, real: string, shown: string): Promise<Uint8Array | undefined> {
  try { await host.fs.lstat(real) } catch (error) { if ((error as { code?: unknown }).code === 'ENOENT') return undefined; throw fsError(tool, shown, error) }
  const { handle } = await openVerified(host, tool, real, shown)
  try { return new Uint8Array(await handle.readFile()) } finally { await handle.close() }
}

/**
 * Shows a file write to {@link BuiltinToolsOptions.beforeChange} (nothing to do without hooks).
 * `previousBytes`: the size of the file now (undefined: a new file); `known`: its bytes when the
 * tool read them already. The hook may wait for a person: when it returns, the file must still be
 * as it was shown, else the write is refused (it would overwrite a change made meanwhile).
 */
async function announceWrite(host: ToolHost, tool: 'write_file' | 'edit_file', real: string, shown: string, after: string, signal: AbortSignal, previousBytes?: number, known?: Uint8Array): Promise<ToolChange | undefined> {
  const { beforeChange, afterChange } = host.hooks
  if (!beforeChange && !afterChange) return undefined
  const readable = previousBytes !== undefined && previousBytes <= host.maxWriteBytes
  const before = known ?? (readable ? await currentBytes(host, tool, real, shown) : undefined)
  const change: ToolChange = { tool, path: shown, realPath: real, existed: previousBytes !== undefined, ...(before ? { before } : {}), after }
  if (!beforeChange) return change
  await beforeChange(change, signal)
  if (signal.aborted) throw new Error(`${tool}: cancelled; ${shown} was not changed`)
  const now = readable || previousBytes === undefined ? await currentBytes(host, tool, real, shown) : before
  const same = now === undefined ? before === undefined : before !== undefined && now.length === before.length && now.every((b, i) => b === before[i])
  if (!same) throw new Error(`${tool}: ${shown} changed while the change waited for approval; not written: read it again and redo the change`)
  return change
}

/** 1-based line numbers of the given offsets (UTF-16 units, ascending) in `text`. */
function lineNumbersAt(text: string, offsets: readonly number[]): number[] {
  const out: number[] = []
  let line = 1
  let from = 0
  for (const offset of offsets) {
    for (let nl = text.indexOf('\n', from); nl !== -1 && nl < offset; nl = text.indexOf('\n', nl + 1)) { line++; from = nl + 1 }
    out.push(line)
  }
  return out
}

/** edit_file: the most occurrences one call replaces. Each costs a step and a string piece: 16 MiB
 *  of one-character matches held the event loop 2.9 s and took 648 MB; 10,000 take milliseconds. */
const EDIT_MAX_REPLACEMENTS = 10_000

/** Non-overlapping occurrences of `needle` in `text`, as UTF-16 offsets; at most `max` + 1 (the search stops there). */
function occurrences(text: string, needle: string, max = EDIT_MAX_REPLACEMENTS): number[] {
  const found: number[] = []
  for (let at = text.indexOf(needle); at !== -1 && found.length <= max; at = text.indexOf(needle, at + needle.length)) found.push(at)
  return found
}

function editFileTool(host: ToolHost): Tool {
  return {
    name: 'edit_file',
    description: `Edit a file inside the working directory (at most ${host.maxWriteBytes} bytes before and after) by exact string replacement: old_string must appear in the file exactly once (include enough surrounding lines to make it unique), unless replace_all is true. Copy old_string from read_file output without the line-number prefix, keeping indentation and whitespace exactly.`,
    parameters: {
      type: 'object',
      properties: {
        path: { type: 'string', description: 'File path, relative to the working directory.' },
        old_string: { type: 'string', description: 'The exact text to replace.' },
        new_string: { type: 'string', description: 'The text to put in its place.' },
        replace_all: { type: 'boolean', description: 'Replace every occurrence. Default false.' },
      },
      required: ['path', 'old_string', 'new_string'],
      additionalProperties: false,
    },
    async execute(rawArgs, ctx) {
      const args = toolArgs('edit_file', rawArgs, ['path', 'old_string', 'new_string', 'replace_all'])
      let oldString = argString('edit_file', args, 'old_string')
      let newString = argString('edit_file', args, 'new_string')
      const replaceAll = argBool('edit_file', args, 'replace_all')
      if (oldString === '') throw new Error('edit_file: old_string is empty; to create a file or replace all of it use write_file')
      if (oldString === newString) throw new Error('edit_file: old_string and new_string are the same; nothing would change')
      const { real, shown } = await confine(host, 'edit_file', argString('edit_file', args, 'path'), ctx.signal)
      const { mode } = await refuseWrite(host, 'edit_file', real, shown)
      refuseProjectConfig(host, 'edit_file', real, shown)
      const { handle, size } = await openVerified(host, 'edit_file', real, shown, '; to create a new file use write_file')
      let bytes: Uint8Array
      try {
        if (size > host.maxWriteBytes) throw new Error(`edit_file: ${shown} is ${size} bytes, over the ${host.maxWriteBytes} bytes edit_file edits; change it with the shell, or split it`)
        bytes = await handle.readFile()
      } catch (error) { throw error instanceof Error && error.message.startsWith('edit_file:') ? error : fsError('edit_file', shown, error) } finally { await handle.close() }
      if (hasNulByte(bytes)) throw new Error(`edit_file: ${shown} looks binary (a NUL byte in its first ${TOOL_BINARY_SNIFF_BYTES} bytes); edit_file edits text files only`)
      const text = new TextDecoder().decode(bytes)
      let found = occurrences(text, oldString)
      let crlf = false
      if (found.length === 0 && text.includes('\r\n') && oldString.includes('\n') && !oldString.includes('\r')) {
        // read_file shows CRLF lines without their \r; match the model's LF text against them.
        const converted = occurrences(text, oldString.replace(/\n/g, '\r\n'))
        if (converted.length > 0) {
          found = converted
          oldString = oldString.replace(/\n/g, '\r\n')
          newString = newString.replace(/\r?\n/g, '\r\n')
          crlf = true
        }
      }
      if (found.length === 0) {
        const prefixed = /^ *\d+\t/m.test(oldString) ? ' old_string seems to start lines with read_file line numbers ("    12\\t"); leave them out.' : ''
        throw new Error(`edit_file: old_string was not found in ${shown} (0 occurrences).${prefixed} Read the file again and copy the exact text, including indentation and whitespace.`)
      }
      const times = found.length > EDIT_MAX_REPLACEMENTS ? `more than ${EDIT_MAX_REPLACEMENTS}` : String(found.length)
      if (found.length > 1 && !replaceAll) {
        const lines = lineNumbersAt(text, found.slice(0, 10))
        throw new Error(`edit_file: old_string occurs ${times} times in ${shown} (at lines ${lines.join(', ')}${found.length > 10 ? ', …' : ''}); include more surrounding text to make it unique${found.length > EDIT_MAX_REPLACEMENTS ? '' : ', or set replace_all: true to replace every occurrence'}`)
      }
      if (found.length > EDIT_MAX_REPLACEMENTS) {
        throw new Error(`edit_file: old_string occurs ${times} times in ${shown} (${bytes.length} bytes); replace_all replaces at most ${EDIT_MAX_REPLACEMENTS} occurrences per call: give old_string more surrounding text so that it matches fewer places, use the shell (e.g. sed) where offered, or write the new content whole with write_file`)
      }
      if (bytes.length + found.length * (utf8Length(newString) - utf8Length(oldString)) > host.maxWriteBytes) {
        throw new Error(`edit_file: the edited ${shown} would be over ${host.maxWriteBytes} bytes, the most edit_file writes; replace fewer occurrences or shorten new_string`)
      }
      let edited = ''
      let from = 0
      for (const at of found) { edited += text.slice(from, at) + newString; from = at + oldString.length } // slices, not String.replace: "$&" in new_string stays literal
      edited += text.slice(from)
      const change = await announceWrite(host, 'edit_file', real, shown, edited, ctx.signal, bytes.length, bytes)
      await writeReplacing(host, 'edit_file', real, shown, edited, mode)
      if (change) await host.hooks.afterChange?.(change)
      const lines = lineNumbersAt(text, found.slice(0, 10))
      return `edited ${shown}: replaced ${plural(found.length, 'occurrence')} (at ${lines.length === 1 ? 'line' : 'lines'} ${lines.join(', ')}${found.length > 10 ? ', …' : ''})${crlf ? '; matched with CRLF line endings' : ''}`
    },
  }
}

/**
 * Puts a file back as a write tool found it (the CLI's `/undo`): `bytes`, or removed when
 * undefined (the tool created it). The write tools' own checks apply (inside `cwd`, not a protected
 * path, a regular file with one link; `sessionLog` as in {@link BuiltinToolsOptions}), and the same
 * whole-or-nothing write. Returns the path as shown to the model. Throws an Error naming the refusal.
 */
export async function restoreToolFile(cwd: string, realPath: string, bytes: Uint8Array | undefined,
  sessionLog?: string): Promise<string> {
  const host = await undoHost(cwd)
  if (sessionLog !== undefined) host.protectedPaths.push({ real: await realpathLenient(host, host.path.resolve(host.root, sessionLog)), kind: 'session', siblings: true })
  const { real, shown } = await confine(host, 'undo', realPath)
  const { mode, bytes: now } = await refuseWrite(host, 'undo', real, shown)
  refuseProjectConfig(host, 'undo', real, shown)
  if (bytes !== undefined) await writeReplacing(host, 'undo', real, shown, bytes, mode)
  else if (now !== undefined) await unlinkVerified(host, 'undo', real, shown)
  return shown
}

/** A tool host for undo at `cwd`: no hooks, no output or write cap. */
async function undoHost(cwd: string): Promise<ToolHost> {
  const [fs, path] = await Promise.all([importNode<NodeFs>('node:fs/promises'), importNode<NodePath>('node:path')])
  return { fs, path, root: await fs.realpath(cwd), maxOutputUnits: 1, maxWriteBytes: Infinity, hooks: {}, protectedPaths: [] }
}

/**
 * A file as a write tool left it, read back the way the tools read (for `/diff` and `/undo`): inside `cwd`, no link
 * followed at its end, a regular file only (a FIFO or a device put there meanwhile is refused, never waited on).
 * Undefined when it is gone. Throws an Error naming the refusal.
 */
export async function readToolFile(cwd: string, realPath: string): Promise<Uint8Array | undefined> {
  const host = await undoHost(cwd)
  const { real, shown } = await confine(host, 'undo', realPath)
  return await currentBytes(host, 'undo', real, shown)
}

/**
 * Removes `real` inside the directory it was checked in: the directory is opened and checked where the kernel tells
 * (Linux), and the name removed through that handle, so a directory swapped for a link meanwhile (by a command running
 * at the same time) cannot turn the removal onto a file outside the project. Elsewhere the directory's real path is
 * checked again just before.
 */
async function unlinkVerified(host: ToolHost, tool: string, real: string, shown: string): Promise<void> {
  const { fs, path } = host, dir = path.dirname(real)
  const moved = (now: string | undefined) => new Error(`${tool}: the directory of ${shown} resolved to ${now} when `
    + `removed, not ${dir} (a path changed after it was checked); not removed`)
  let handle: import('node:fs/promises').FileHandle | undefined
  try {
    handle = await fs.open(dir, fs.constants.O_RDONLY | (fs.constants.O_DIRECTORY ?? 0))
    const opened = await handlePath(host, handle)
    if (opened !== undefined && opened !== dir) throw moved(opened)
    const through = opened !== undefined ? `/proc/self/fd/${handle.fd}/${path.basename(real)}` : real
    if (opened === undefined && await fs.realpath(dir) !== dir) throw moved(await fs.realpath(dir))
    await fs.unlink(through)
  } catch (error) {
    throw error instanceof Error && error.message.startsWith(`${tool}:`) ? error : fsError(tool, shown, error)
  } finally { await handle?.close().catch(() => {}) }
}

// ── shell ──

/** Keeps the first and last units of a stream that may be endless, in bounded memory. */
class StreamText {
  private head = ''
  private tail = ''
  total = 0 // UTF-16 units seen
  constructor(private readonly headMax: number, private readonly tailMax: number) {}
  push(chunk: string): void {
    this.total += chunk.length
    if (this.head.length < this.headMax) {
      const spaceUnits = this.headMax - this.head.length
      this.head += chunk.slice(0, spaceUnits)
      chunk = chunk.slice(spaceUnits)
    }
    if (chunk !== '' && this.tailMax > 0) this.tail = (this.tail + chunk).slice(-this.tailMax)
  }
  /** The kept text; when anything was dropped, a marker in the middle says how much. */
  render(label: string): string {
    if (this.total <= this.headMax + this.tailMax) return this.head + this.tail
    // Drop half of a surrogate pair at either cut.
    const head = isHigh(this.head.charCodeAt(this.head.length - 1)) ? this.head.slice(0, -1) : this.head
    const tail = isLow(this.tail.charCodeAt(0)) ? this.tail.slice(1) : this.tail
    return `${head}\n[… ${this.total - head.length - tail.length} characters of ${label} cut here …]\n${tail}`
  }
}

/** Variable names that look like they hold a secret: dropped from a shell command's environment. */
export const SECRET_ENV_NAME = /KEY|TOKEN|SECRET|PASSWORD/i

/**
 * The environment a shell command gets outside the sandbox (docs/design.md §13): `env` without the
 * names in `drop` (the API key variables), without any variable whose value equals one of theirs
 * or (for key values of 8 characters or more) contains one, and without names matching
 * {@link SECRET_ENV_NAME} unless listed in `keep`. `drop` wins over `keep`.
 */
export function shellEnvironment(env: Record<string, string | undefined>, lists: { keep?: readonly string[]; drop?: readonly string[] } = {}): Record<string, string> {
  return scrubEnvironment(env, lists, (name) => !SECRET_ENV_NAME.test(name))
}

/** `env` keeping the names `allowed` passes or `lists.keep` lists, never those in `lists.drop` nor a value that holds one of theirs. */
function scrubEnvironment(env: Record<string, string | undefined>, lists: { keep?: readonly string[]; drop?: readonly string[] }, allowed: (name: string) => boolean): Record<string, string> {
  const keep = new Set(lists.keep ?? [])
  const drop = new Set(lists.drop ?? [])
  const secretValues = [...drop].map((name) => env[name]).filter((v): v is string => typeof v === 'string' && v.length >= 4)
  const holdsSecret = (value: string): boolean => secretValues.some((secret) => value === secret || (secret.length >= 8 && value.includes(secret)))
  const out: Record<string, string> = {}
  for (const [name, value] of Object.entries(env)) {
    if (value === undefined || drop.has(name) || holdsSecret(value)) continue
    if (!allowed(name) && !keep.has(name)) continue
    out[name] = value
  }
  return out
}

// ── the sandbox (bubblewrap, Linux): docs/design.md §13 ──

/** Variables a sandboxed command gets from dsh's environment (besides LC_* and the names the user lists); HOME is the empty one. */
const SANDBOX_ENV_NAMES: ReadonlySet<string> = new Set(['PATH', 'LANG', 'LANGUAGE', 'TERM', 'COLORTERM', 'NO_COLOR', 'TZ', 'USER', 'LOGNAME', 'SHELL', 'HOME'])
/** Entries of a home directory hidden from a sandboxed command when the home lies inside the working directory (else the whole home is). */
const SANDBOX_HOME_SECRETS = ['.ssh', '.aws', '.config', '.gnupg', '.netrc', '.docker', '.kube', '.npmrc', '.pgpass', '.git-credentials', '.azure', '.password-store']
/** Sockets outside the project a sandboxed command with the network must not reach (per-user agents and D-Bus, the
 *  Docker daemon); without the network every daemon's directory is hidden ({@link SANDBOX_DAEMON_DIRS}). */
const SANDBOX_HIDDEN_SOCKETS = ['/run/user', '/run/docker.sock', '/var/run/docker.sock']
/** Where daemons keep their Unix sockets (containerd, podman, the D-Bus system bus, PostgreSQL): each an empty tmpfs in a
 *  sandbox without the network, since no network namespace fences a socket's path. */
const SANDBOX_DAEMON_DIRS = ['/run', '/var/run']
/** Directories that hold other users' homes, each an empty tmpfs in the sandbox like the user's own. */
const SANDBOX_HOME_ROOTS = ['/home', '/root']
/** The namespaces every sandboxed command gets (the network too unless allowed); the probe starts bwrap with the same. */
const SANDBOX_NAMESPACE_FLAGS = ['--unshare-pid', '--unshare-ipc', '--unshare-uts', '--unshare-cgroup-try', '--die-with-parent', '--cap-drop', 'ALL']
/** How long the probe may take to start bwrap once, in ms. */
const SANDBOX_PROBE_TIMEOUT_MS = 10_000

/** The sandbox as it runs: the bwrap to start, the network switch, the paths made readable, the homes hidden. */
interface SandboxRuntime { bwrap: string; allowNetwork: boolean; readPaths: string[]; homes: string[]; runPaths: string[] }

/**
 * Checks the options and starts bwrap once (`bwrap --ro-bind / / … true`, the namespaces every
 * command gets). Returns the runtime, or undefined after `onUnavailable(reason)` when bwrap is
 * missing or cannot start; without `onUnavailable`, throws naming the reason and the fix.
 */
async function startSandbox(host: ToolHost, options: ShellSandboxOptions, env: Record<string, string | undefined>): Promise<SandboxRuntime | undefined> {
  if (options === null || typeof options !== 'object') throw new TypeError('builtinTools: options.sandbox must be an object, e.g. {} or { allowNetwork: true }')
  const known = ['allowNetwork', 'readPaths', 'onUnavailable', 'bwrap']
  for (const key of Object.keys(options)) if (!known.includes(key)) throw new TypeError(`builtinTools: unknown option "sandbox.${key}"; known: ${known.join(', ')}`)
  if (options.readPaths !== undefined && !(Array.isArray(options.readPaths) && options.readPaths.every((p) => typeof p === 'string' && p !== ''))) throw new TypeError('builtinTools: options.sandbox.readPaths must be an array of paths')
  if (options.onUnavailable !== undefined && typeof options.onUnavailable !== 'function') throw new TypeError('builtinTools: options.sandbox.onUnavailable must be a function')
  const [{ execFile }, { default: proc }, os] = await Promise.all([
    importNode<typeof import('node:child_process')>('node:child_process'), importNode<any>('node:process'), importNode<typeof import('node:os')>('node:os'),
  ])
  // Found once, on PATH's absolute directories outside the project: a project's own `bwrap`
  // (`./node_modules/.bin` on PATH) would run outside any sandbox.
  const name = options.bwrap ?? 'bwrap'
  let bwrap = name.includes('/') ? host.path.resolve(host.root, name) : undefined
  for (const dir of bwrap ? [] : (env.PATH ?? '').split(':')) {
    if (!host.path.isAbsolute(dir) || isInside(host.path, host.root, dir)) continue
    if (await host.fs.access(host.path.join(dir, name), host.fs.constants.X_OK).then(() => true, () => false)) { bwrap = host.path.join(dir, name); break }
  }
  const missing = `${name} is not installed (Debian/Ubuntu: apt-get install bubblewrap; Fedora: dnf install bubblewrap)`
  const reason = proc.platform !== 'linux'
    ? `bubblewrap runs on Linux only, not on ${proc.platform} (docs/design.md §13 describes what macOS's sandbox-exec would take)`
    : bwrap === undefined ? missing : await new Promise<string | undefined>((resolve) => {
      const args = ['--ro-bind', '/', '/', '--dev', '/dev', '--proc', '/proc', '--tmpfs', '/tmp', ...SANDBOX_NAMESPACE_FLAGS, '--unshare-net', '--', 'true']
      execFile(bwrap, args, { timeout: SANDBOX_PROBE_TIMEOUT_MS, env: {} }, (error, _stdout, stderr) => {
        if (!error) return resolve(undefined)
        if ((error as { code?: unknown }).code === 'ENOENT') return resolve(missing)
        resolve(`${bwrap} cannot start here: ${String(stderr).trim().split('\n')[0] || error.message} (user namespaces may be turned off)`)
      })
    })
  if (reason !== undefined || bwrap === undefined) {
    const why = reason ?? missing
    if (!options.onUnavailable) throw new Error(`builtinTools: options.sandbox: ${why}; install bubblewrap, or leave out options.sandbox to run shell commands unconfined`)
    options.onUnavailable(why)
    return undefined
  }
  const { path } = host
  const homes = new Set<string>()
  const own = [env.HOME, (() => { try { return os.userInfo().homedir } catch { return undefined } })()]
  for (const home of [...SANDBOX_HOME_ROOTS, ...own]) { // outer first: a tmpfs mounted later would cover the user's
    if (typeof home === 'string' && path.isAbsolute(home) && home !== '/') homes.add(await host.fs.realpath(home).catch(() => home))
  }
  // Programs installed in the home (~/.cargo/bin, ~/.local/bin) stay runnable: PATH's directories inside a hidden home are readable.
  const readPaths = new Set((options.readPaths ?? []).map((p) => path.resolve(host.root, p)))
  for (const dir of (env.PATH ?? '').split(':')) {
    if (!path.isAbsolute(dir) || ![...homes].some((home) => dir !== home && isInside(path, home, dir))) continue
    // one this user can enter (bwrap cannot bind another's: /root/.cargo/bin on an unprivileged user's PATH)
    if (await host.fs.access(dir, host.fs.constants.X_OK).then(() => true, () => false)) readPaths.add(await host.fs.realpath(dir).catch(() => dir))
  }
  const runPaths = (env.PATH ?? '').split(':').filter((dir) => SANDBOX_DAEMON_DIRS.some((d) => isInside(path, d, dir)))
  return { bwrap, allowNetwork: options.allowNetwork === true, readPaths: [...readPaths], homes: [...homes], runPaths }
}

/** The environment of a sandboxed command: {@link SANDBOX_ENV_NAMES}, LC_* and `lists.keep`, scrubbed as {@link shellEnvironment} scrubs, and TMPDIR=/tmp. */
function sandboxEnvironment(env: Record<string, string | undefined>, lists: { keep?: readonly string[]; drop?: readonly string[] }): Record<string, string> {
  return { ...scrubEnvironment(env, lists, (name) => SANDBOX_ENV_NAMES.has(name) || name.startsWith('LC_')), TMPDIR: '/tmp' }
}

/**
 * The bwrap arguments for one command (before `--`): the file system read-only, private /tmp and
 * /dev, /proc of its own PID namespace, every home replaced by an empty tmpfs, the read paths, the
 * project read-write, then the protected set read-only — each protected path's directories between
 * the root and it bound onto themselves first, so that they cannot be renamed away (a mount point
 * cannot be moved). Paths that do not exist are skipped.
 */
async function sandboxArgs(host: ToolHost, sandbox: SandboxRuntime, set: ProtectedSet): Promise<string[]> {
  const { fs, path, root } = host
  const exists = async (p: string) => (await fs.lstat(p).catch(() => undefined)) !== undefined
  const args = ['--ro-bind', '/', '/', '--dev', '/dev', '--proc', '/proc', '--tmpfs', '/tmp']
  for (const dir of sandbox.allowNetwork ? [] : SANDBOX_DAEMON_DIRS) {
    if ((await fs.lstat(dir).catch(() => undefined))?.isDirectory()) args.push('--tmpfs', dir) // not /var/run → /run
  }
  // PATH's directories there stay runnable (NixOS: /run/current-system/sw/bin, /run/wrappers/bin); a source is
  // resolved outside the sandbox, so a link under /run still reaches its program
  for (const dir of sandbox.allowNetwork ? [] : sandbox.runPaths) args.push('--ro-bind-try', dir, dir)
  for (const socket of sandbox.allowNetwork ? SANDBOX_HIDDEN_SOCKETS : []) {
    const st = await fs.stat(socket).catch(() => undefined)
    if (st?.isDirectory()) args.push('--tmpfs', socket)
    else if (st) args.push('--ro-bind', '/dev/null', socket)
  }
  for (const home of sandbox.homes) if (!isInside(path, '/tmp', home) && !isInside(path, root, home) && await exists(home)) args.push('--tmpfs', home)
  for (const p of sandbox.readPaths) args.push('--ro-bind-try', p, p)
  // A scan that stopped may have missed a repository: the command then gets no writable project (fail closed), so that
  // making many directories cannot switch the protection off.
  args.push(set.scanStopped ? '--ro-bind' : '--bind', root, root)
  for (const home of sandbox.homes.filter((h) => isInside(path, root, h))) {
    for (const name of SANDBOX_HOME_SECRETS) {
      const st = await fs.stat(path.join(home, name)).catch(() => undefined) // through a link: what a mount would cover
      if (st?.isDirectory()) args.push('--tmpfs', path.join(home, name))
      else if (st) args.push('--ro-bind', '/dev/null', path.join(home, name))
    }
  }
  // The protected paths inside the project that exist (the session log's files found beside it).
  const readOnly = new Set<string>()
  for (const p of set.paths) {
    if (p.siblings) {
      const dir = path.dirname(p.real), base = path.basename(p.real)
      for (const name of await fs.readdir(dir).catch(() => [] as string[])) if (name === base || name.startsWith(base + '.')) readOnly.add(path.join(dir, name))
    } else readOnly.add(p.real)
  }
  const binds: [string, 'rw' | 'ro'][] = []
  const pinned = new Set<string>()
  const pinAncestors = (p: string): void => {
    for (let dir = path.dirname(p); dir !== root && isInside(path, root, dir); dir = path.dirname(dir)) pinned.add(dir)
  }
  for (const p of readOnly) {
    if (!isInside(path, root, p) || !(await exists(p)) || (await fs.lstat(p)).isSymbolicLink()) continue
    if ([...readOnly].some((q) => q !== p && isInside(path, q, p))) continue // inside another read-only one
    binds.push([p, 'ro'])
    pinAncestors(p)
  }
  // A pinned name is put back after the command, outside the sandbox: the directories above it must stay where they
  // are, or a command that swapped one for a link would have that repair made wherever the link points.
  for (const pin of set.pinned) pinAncestors(pin.path)
  // (a project bound read-only after a stopped scan holds its directories still itself: none is bound writable again)
  for (const dir of set.scanStopped ? [] : pinned) if (![...readOnly].some((q) => isInside(path, q, dir))) binds.push([dir, 'rw'])
  binds.sort((a, b) => a[0].split(path.sep).length - b[0].split(path.sep).length)
  for (const [p, mode] of binds) args.push(mode === 'ro' ? '--ro-bind' : '--bind', p, p)
  args.push('--chdir', root, ...SANDBOX_NAMESPACE_FLAGS)
  if (!sandbox.allowNetwork) args.push('--unshare-net')
  return args
}

/**
 * After a sandboxed command: puts back every pinned name it changed (a protected symlink replaced
 * or removed, an instruction file or `.dsh` created where there was none). What the command left
 * there is moved aside to `NAME.dsh-displaced-ID`, never deleted. Returns one line per repair.
 */
async function restorePinned(host: ToolHost, pinned: readonly PinnedName[]): Promise<string[]> {
  const { fs } = host
  const notes: string[] = []
  for (const pin of pinned) {
    const st = await fs.lstat(pin.path).catch(() => undefined)
    const now = st?.isSymbolicLink() ? await fs.readlink(pin.path).catch(() => undefined) : undefined
    if (pin.link === undefined ? st === undefined : now === pin.link) continue
    let aside = ''
    try {
      // Not through a directory the command replaced by a link (the sandbox binds them in place; this is the second
      // guard): the repair would land outside the project.
      const dir = host.path.dirname(pin.path)
      if (await fs.realpath(dir) !== dir) throw new Error(`${shownPath(host, dir)} is no longer the directory it was`)
      if (st !== undefined) { aside = `${pin.path}.dsh-displaced-${randomId().slice(0, 8)}`; await fs.rename(pin.path, aside) }
      if (pin.link !== undefined) await fs.symlink(pin.link, pin.path)
      const what = pin.kind === 'git' ? 'a git directory' : pin.kind === 'config' ? "dsh's configuration" : 'the project instructions'
      notes.push(pin.link === undefined
        ? `[dsh: the command created ${shownPath(host, pin.path)}, which shell commands may not create (${what}); it was moved to ${shownPath(host, aside)}]`
        : `[dsh: the command replaced ${shownPath(host, pin.path)} (a link to ${pin.link}), which shell commands may not change (${what}); it was put back${aside ? `, and what the command left there moved to ${shownPath(host, aside)}` : ''}]`)
    } catch (error) {
      notes.push(`[dsh: the command changed ${shownPath(host, pin.path)}, which shell commands may not change, and it could not be put back (${fsErrorReason(error)}); check it before the next session]`)
    }
  }
  return notes
}

/** The variable that marks every process a shell command starts (inherited through setsid, nohup, double forks). */
const SHELL_JOB_ENV = 'DSH_SHELL_JOB'

/**
 * A running shell command: its process group, the mark its descendants inherit in their environment,
 * and `holds`, the file they inherit as fd 3 (a deleted temp file of this job, named as /proc/PID/fd
 * links read): a descriptor that `env -i`, `unset`, `setsid` and redirecting output leave open, so
 * that a process that clears its environment and leaves the group is still found (docs/design.md §13).
 * `seen`: every process found so far (pid → start time), found again while it lives, marked or not.
 */
interface ShellJob { pid: number; mark: string; holds: ReadonlySet<string>; self: number; seen: Map<number, string> }
/** Jobs not yet reaped, killed whole when the process exits (also on SIGTERM and SIGHUP). */
const liveShellJobs = new Set<ShellJob>()
let shellExitHooked = false

/**
 * The live processes of `job` (Linux /proc; undefined elsewhere): those in its process group, those
 * whose environment carries the job's mark although they left the group (`setsid`), and those that
 * hold one of the job's inherited descriptors although they cleared their environment too
 * (`env -i setsid …`), and every process found before (it may have dropped its marks since).
 * Zombies are not counted (they are dead; bwrap leaves its init as one for a moment). A process that
 * drops every mark before it is first looked for — clears its environment, leaves the group and
 * closes every descriptor it inherited, like a daemon — escapes this; the sandbox's PID namespace fences that.
 */
function jobProcesses(fsSync: typeof import('node:fs'), job: ShellJob): number[] | undefined {
  let names: string[]
  try { names = fsSync.readdirSync('/proc') } catch { return undefined }
  const needle = `${SHELL_JOB_ENV}=${job.mark}`
  const found: number[] = []
  for (const name of names) {
    if (!/^\d+$/.test(name)) continue
    try {
      const stat = fsSync.readFileSync(`/proc/${name}/stat`, 'latin1')
      const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ') // state, ppid, pgrp, … (field 3 of stat on)
      if (fields[0] === 'Z') continue
      const pid = Number(name)
      const started = fields[19] // field 22, the start time: a pid reused by another process is not the one seen
      if (job.seen.get(pid) === started || Number(fields[2]) === job.pid
        || fsSync.readFileSync(`/proc/${name}/environ`, 'latin1').split('\0').includes(needle)
        || (pid !== job.self && holdsAny(fsSync, name, job.holds))) { found.push(pid); job.seen.set(pid, started) }
    } catch { /* gone, or not ours */ }
  }
  return found
}

/** Whether process `pid` has one of `holds` open (names as /proc/PID/fd links read them: `/tmp/dsh-shell-… (deleted)`). */
function holdsAny(fsSync: typeof import('node:fs'), pid: string, holds: ReadonlySet<string>): boolean {
  if (holds.size === 0) return false
  for (const fd of fsSync.readdirSync(`/proc/${pid}/fd`)) {
    try { if (holds.has(fsSync.readlinkSync(`/proc/${pid}/fd/${fd}`))) return true } catch { /* closed meanwhile */ }
  }
  return false
}

/**
 * Opens the fd-3 mark of a job (see {@link ShellJob}): a new temp file, unlinked at once, and the
 * name its descriptor has in /proc. Undefined where there is no /proc to find it by.
 */
function openJobMark(fsSync: typeof import('node:fs'), dir: string, mark: string): { fd: number; link: string } | undefined {
  let fd: number | undefined
  const path = `${dir.replace(/\/+$/, '')}/dsh-shell-${mark}`
  try {
    fd = fsSync.openSync(path, 'wx', 0o600)
    fsSync.unlinkSync(path)
    return { fd, link: fsSync.readlinkSync(`/proc/self/fd/${fd}`) }
  } catch {
    if (fd !== undefined) { fsSync.closeSync(fd); try { fsSync.unlinkSync(path) } catch { /* unlinked already */ } }
    return undefined
  }
}

/** Sends `signal` to the job's process group and to every process of it; returns whether any live one was there. */
function signalShellJob(proc: any, fsSync: typeof import('node:fs'), job: ShellJob, signal: 'SIGTERM' | 'SIGKILL' | 0): boolean {
  const pids = jobProcesses(fsSync, job)
  let group = false
  if (signal !== 0 || pids === undefined) { try { proc.kill(-job.pid, signal); group = true } catch { /* the group is empty */ } }
  if (signal !== 0) for (const pid of pids ?? []) { try { proc.kill(pid, signal) } catch { /* already gone */ } }
  return pids === undefined ? group : pids.length > 0
}

/** Kills every live job at exit: 'exit' listeners run on `process.exit` and a normal end; SIGTERM
 *  and SIGHUP (which end Node without 'exit') are caught only when nobody else handles them, and re-raised. */
function hookShellExit(proc: any, fsSync: typeof import('node:fs')): void {
  if (shellExitHooked) return
  shellExitHooked = true
  const killAll = (): void => { for (const job of liveShellJobs) signalShellJob(proc, fsSync, job, 'SIGKILL') }
  proc.on('exit', killAll)
  for (const signal of ['SIGTERM', 'SIGHUP']) {
    if (proc.listenerCount(signal) > 0) continue
    const onSignal = (): void => { killAll(); proc.off(signal, onSignal); proc.kill(proc.pid, signal) }
    proc.on(signal, onSignal)
  }
}

/** Why a command could not start, and what to do: E2BIG (a command line past the system's limit) says its size. */
function shellStartFailure(error: unknown, command: string): string {
  const e = error as NodeJS.ErrnoException | undefined
  if (e?.code === 'E2BIG') {
    return `the command line is ${utf8Length(command)} bytes, more than the system passes to a program (E2BIG); `
      + 'write the long part to a file with write_file and read it from there'
  }
  return e?.message ?? String(error)
}

function shellTool(host: ToolHost, defaultTimeoutMs: number, maxTimeoutMs: number, env: Record<string, string>): Tool {
  const half = Math.floor(host.maxOutputUnits / 2)
  const { sandbox } = host
  const where = sandbox
    ? `It runs in a sandbox: the working directory is writable except git directories, AGENTS.md/CLAUDE.md, .dsh and the session log (read-only, so git commands that write fail); the rest of the file system is read-only, the home directory is empty, /tmp is private to each command, ${sandbox.allowNetwork ? 'the network is available' : 'there is no network (only a loopback of its own)'}, and the environment holds only PATH, LANG, TERM and a few more (${Object.keys(env).filter((n) => n !== 'TMPDIR').sort().join(', ')}).`
    : 'Variables that look secret (names with KEY, TOKEN, SECRET, PASSWORD) are not in its environment. Unlike the file tools, commands can reach outside the working directory: keep them to the task.'
  return {
    name: 'shell',
    description: `Run a shell command (sh -c; cmd.exe on Windows) in the working directory, without stdin. Returns the exit code, stdout and stderr; each stream keeps its first and last ${Math.floor(half / 2)} characters. The command is killed (with everything it started) after timeout_ms (default ${defaultTimeoutMs}, at most ${maxTimeoutMs}) or when the turn is cancelled; background jobs do not outlive the call. ${where}`,
    parameters: {
      type: 'object',
      properties: {
        command: { type: 'string', description: 'The command line to run.' },
        timeout_ms: { type: 'integer', minimum: 1, maximum: maxTimeoutMs, description: `Timeout in milliseconds. Default ${defaultTimeoutMs}.` },
      },
      required: ['command'],
      additionalProperties: false,
    },
    async execute(rawArgs, ctx) {
      const args = toolArgs('shell', rawArgs, ['command', 'timeout_ms'])
      const command = argString('shell', args, 'command')
      if (command.trim() === '') throw new Error('shell: "command" is empty')
      if (command.includes('\0')) throw new Error('shell: "command" contains a NUL character, which no command line can hold; remove it (printf \'\\0\' writes one)')
      const timeoutMs = argInt('shell', args, 'timeout_ms', defaultTimeoutMs, 1, maxTimeoutMs, 'milliseconds')
      if (ctx.signal.aborted) throw new Error('shell: not run, the turn was cancelled')
      await host.hooks.beforeChange?.({ tool: 'shell', command }, ctx.signal)
      if (ctx.signal.aborted) throw new Error('shell: not run, the turn was cancelled')
      const [{ spawn }, { default: proc }, fsSync] = await Promise.all([
        importNode<typeof import('node:child_process')>('node:child_process'), importNode<any>('node:process'), importNode<typeof import('node:fs')>('node:fs'),
      ])
      const posix = proc.platform !== 'win32'
      const mark = `${proc.pid}-${randomId()}`
      // In the sandbox the protected set is bound read-only; it is computed afresh for every command (the last one may have made a repository).
      const guarded = sandbox ? await protectedSet(host, 'project') : undefined
      const sandboxed = sandbox && guarded ? [...await sandboxArgs(host, sandbox, guarded), '--', '/bin/sh', '-c', command] : undefined
      // Own process group (detached) on POSIX, so that the whole group can be killed; the mark in
      // the environment finds the processes that left the group (setsid). In the sandbox, its PID
      // namespace ends every process the command started when the command ends.
      // Unconfined, fd 3 is one more mark (see ShellJob); the command gets the only descriptor of it left.
      const fdMark = posix && !sandboxed ? openJobMark(fsSync, (await importNode<typeof import('node:os')>('node:os')).tmpdir(), mark) : undefined
      const stdio = (fdMark ? ['ignore', 'pipe', 'pipe', fdMark.fd] : ['ignore', 'pipe', 'pipe']) as ['ignore', 'pipe', 'pipe']
      const spawnOptions = { cwd: host.root, stdio, detached: posix, windowsHide: true, env: { ...env, [SHELL_JOB_ENV]: mark } }
      let child
      try { child = sandboxed ? spawn(sandbox!.bwrap, sandboxed, spawnOptions) : spawn(command, { ...spawnOptions, shell: true }) }
      catch (error) { throw new Error(`shell: could not start the command: ${shellStartFailure(error, command)}`, { cause: error }) }
      finally { if (fdMark) fsSync.closeSync(fdMark.fd) }
      const job: ShellJob | undefined = posix && child.pid !== undefined
        ? { pid: child.pid, mark, holds: new Set(fdMark ? [fdMark.link] : []), self: proc.pid, seen: new Map() } : undefined
      if (job) { liveShellJobs.add(job); hookShellExit(proc, fsSync) }
      const stdout = new StreamText(Math.floor(half / 2), half - Math.floor(half / 2))
      const stderr = new StreamText(Math.floor(half / 2), half - Math.floor(half / 2))
      child.stdout.setEncoding('utf8') // decodes UTF-8 split across chunks
      child.stderr.setEncoding('utf8')
      child.stdout.on('data', (chunk: string) => stdout.push(chunk))
      child.stderr.on('data', (chunk: string) => stderr.push(chunk))
      let strays = false // the command left processes running when it exited
      let heldOpen = false // its output was still open after every process found was killed: an unseen one holds it
      const outcome = await new Promise<{ code: number | null; signal: string | null; why: 'exit' | 'timeout' | 'aborted' | 'error'; error?: Error }>((resolve) => {
        let why: 'exit' | 'timeout' | 'aborted' = 'exit'
        const timers: ReturnType<typeof setTimeout>[] = []
        let killing = false
        const signalAll = (signal: 'SIGTERM' | 'SIGKILL' | 0): boolean => {
          if (job) return signalShellJob(proc, fsSync, job, signal)
          try { child.kill(signal || undefined) } catch { /* already gone */ }
          return child.exitCode === null
        }
        const finish = (result: { code: number | null; signal: string | null; error?: Error }): void => {
          for (const timer of timers) clearTimeout(timer)
          ctx.signal.removeEventListener('abort', onAbort)
          // Nothing it started outlives the call: SIGKILL until a scan finds none (a process forking
          // while we look appears in the next scan), at most 50 rounds 20 ms apart.
          const reap = async (): Promise<void> => {
            if (!job) return
            for (let round = 0; round < 50 && !sandboxed && signalAll('SIGKILL'); round++) await new Promise((r) => setTimeout(r, 20))
            liveShellJobs.delete(job)
          }
          void reap().then(() => resolve({ ...result, why: result.error ? 'error' : why }))
        }
        /** SIGTERM to everything the command started, SIGKILL after a grace period; then stop waiting for pipes a stray process may hold. */
        const killAll = (): void => {
          if (killing) return
          killing = true
          // Even when none is found, the pipes may be held by a process that was not: stop waiting for them.
          const found = signalAll('SIGTERM')
          timers.push(setTimeout(() => {
            if (found) signalAll('SIGKILL')
            timers.push(setTimeout(() => {
              heldOpen = true
              child.stdout.destroy(); child.stderr.destroy(); finish({ code: child.exitCode, signal: child.signalCode })
            }, SHELL_KILL_GRACE_MS))
          }, SHELL_KILL_GRACE_MS))
        }
        const stop = (reason: 'timeout' | 'aborted'): void => {
          if (why !== 'exit') return
          why = reason
          killAll()
        }
        const onAbort = (): void => stop('aborted')
        ctx.signal.addEventListener('abort', onAbort, { once: true })
        timers.push(setTimeout(() => stop('timeout'), timeoutMs))
        child.once('error', (error) => finish({ code: null, signal: null, error }))
        // The shell is done: background jobs (`&`, nohup, setsid) must not outlive the call. In the
        // sandbox the kernel has ended them with the PID namespace (its init, a zombie for a moment, is not one).
        child.once('exit', () => { if (job && !sandboxed && signalAll(0)) { strays = true; killAll() } })
        child.once('close', (code, signal) => finish({ code, signal }))
      })
      const repairs = guarded ? await restorePinned(host, guarded.pinned) : []
      if (guarded?.scanStopped) repairs.push(`[dsh: the project holds more than ${SANDBOX_SCAN_MAX_DIRS} directories (node_modules aside), more than the sandbox looks through for git directories, so this command ran with the project read-only; commands may write again once there are fewer]`)
      if (outcome.why === 'error') throw new Error(`shell: could not start the command: ${shellStartFailure(outcome.error, command)}`, { cause: outcome.error })
      const status = outcome.why === 'timeout' ? `timed out after ${timeoutMs} ms; the command was killed (raise timeout_ms, up to ${maxTimeoutMs}, if it needs longer)`
        : outcome.why === 'aborted' ? 'cancelled; the command was killed'
        : outcome.code === null ? `killed by signal ${outcome.signal}`
        : `exit code ${outcome.code}`
      const parts = [(strays && outcome.why === 'exit' ? `${status} (processes it left running in the background were killed)` : status)
        + (heldOpen ? '; but its output stayed open after every process of it that dsh could find was killed: a process it'
          + ' started may still be running (one that left the process group and dropped dsh\'s marks; only the sandbox ends those)' : '')]
      if (stdout.total > 0) parts.push(`stdout:\n${stdout.render('stdout')}`)
      if (stderr.total > 0) parts.push(`stderr:\n${stderr.render('stderr')}`)
      if (stdout.total === 0 && stderr.total === 0) parts.push('(no output)')
      const content = [...parts, ...repairs].join('\n')
      return outcome.why === 'exit' && outcome.code === 0 ? content : { content, isError: true }
    },
  }
}

// ════════════════════════════════════════════════════════════════════════════════════════════
// 10. Replay — a recorded transcript through the meter and the ladder (docs/design.md §8)
// ════════════════════════════════════════════════════════════════════════════════════════════

// ── 10.1 Transcript readers: the input side of `replay` ─────────────────────────────────────────
// Web-standard code: the readers take the file's TEXT (never a path), so they run anywhere.
// Formats as found in real files: docs/replay.md.

/**
 * One transcript format. Adding a format is one entry of {@link TRANSCRIPT_READERS}: the key is its
 * name (the `format` option, the CLI's `--format NAME`); the format type, the accepted list in
 * errors, detection and the CLI help all derive from the table.
 */
interface TranscriptReader {
  /** What such a file is, for the help text and the accepted list. */
  describe: string
  /** What detection looks for in a JSON document / in JSONL, for the error when no format matches. */
  looksFor: { json?: string; jsonl?: string }
  /** Whether the parsed text is this format. */
  detect(parsed: ParsedTranscript): boolean
  /** Reads it; throws {@link TranscriptError} (line / field) for a file that breaks the format. */
  read(parsed: ParsedTranscript, options: ReadTranscriptOptions): Transcript
}

/**
 * The transcript readers, in DETECTION order: the first entry whose `detect` says yes reads the
 * file, so more specific shapes come first (mini-swe-agent's `messages` before openai's).
 */
const TRANSCRIPT_READERS = {
  'mini-swe-agent': {
    describe: 'mini-swe-agent trajectory (.traj.json, "trajectory_format": "mini-swe-agent-1")',
    looksFor: { json: 'an object with "trajectory_format": "mini-swe-agent…", or with "messages" and "info.mini_version"' },
    detect: (p) => p.kind === 'json' && isJsonRecord(p.value) && ((typeof p.value.trajectory_format === 'string' && p.value.trajectory_format.startsWith('mini-swe-agent')) ||
      (Array.isArray(p.value.messages) && isJsonRecord(p.value.info) && 'mini_version' in p.value.info)),
    read: (p) => readMiniSweAgent(p),
  },
  'swe-agent': {
    describe: 'SWE-agent trajectory (.traj with "history")',
    looksFor: { json: 'an object with "history", or a "trajectory" of steps' },
    detect: (p) => p.kind === 'json' && isJsonRecord(p.value) && (Array.isArray(p.value.history) ||
      (Array.isArray(p.value.trajectory) && p.value.trajectory.length > 0 && isSweAgentStep(p.value.trajectory[0]))),
    read: (p) => readSweAgent(p),
  },
  openai: {
    describe: 'OpenAI-style messages ([...] or {"messages": [...]}) or a request/response log',
    looksFor: { json: 'an array of messages, or an object with "messages"', jsonl: 'request/response lines {request: {messages}, response}' },
    detect: (p) => (p.kind === 'json' ? Array.isArray(p.value) || (isJsonRecord(p.value) && (Array.isArray(p.value.messages) || isChatCallRecord(p.value)))
      : isChatCallRecord(p.lines[0].value)),
    read: (p) => readOpenAITranscript(p),
  },
  dsh: {
    describe: 'dsh session log (JSONL of {seq, type, time, data})',
    looksFor: { json: 'one dsh event {seq, type, time, data}', jsonl: 'a first line that is a dsh event {seq, type, time, data}' },
    detect: (p) => (p.kind === 'jsonl' ? isDshEvent(p.lines[0].value) : isJsonRecord(p.value) && isDshEvent(p.value)),
    read: (p) => readDshLog(p),
  },
  'claude-code': {
    describe: 'Claude Code session (.jsonl)',
    looksFor: { json: 'one Claude Code entry {type, uuid or sessionId, message}', jsonl: 'Claude Code entries {type, uuid or sessionId, message} among the first 50 lines' },
    detect: (p) => (p.kind === 'jsonl' ? p.lines.slice(0, 50).some((l) => isClaudeCodeLine(l.value)) : isJsonRecord(p.value) && isClaudeCodeLine(p.value)),
    read: (p, options) => readClaudeCode(p, options.sidechains === true),
  },
} satisfies Record<string, TranscriptReader>

/** The transcript formats `replay` reads (the CLI's `--format` values): the names of {@link TRANSCRIPT_READERS}. */
export type TranscriptFormat = keyof typeof TRANSCRIPT_READERS

/** Every {@link TranscriptFormat}, in the order detection tries them and messages list them. */
export const TRANSCRIPT_FORMATS: readonly TranscriptFormat[] = /* @__PURE__ */ Object.keys(TRANSCRIPT_READERS) as TranscriptFormat[]

const isTranscriptFormat = (name: unknown): name is TranscriptFormat => typeof name === 'string' && Object.hasOwn(TRANSCRIPT_READERS, name)

/** One line per format (`name  description`), for the CLI help. */
function describeTranscriptFormats(indent = ''): string {
  const width = TRANSCRIPT_FORMATS.reduce((w, f) => Math.max(w, f.length), 0)
  return TRANSCRIPT_FORMATS.map((f) => `${indent}${f.padEnd(width)}  ${TRANSCRIPT_READERS[f].describe}`).join('\n')
}

const acceptedFormats = (): string =>
  `Accepted formats: ${TRANSCRIPT_FORMATS.map((f) => `${f} (${TRANSCRIPT_READERS[f].describe})`).join(', ')}; force one with the \`format\` option (CLI: --format NAME).`

/**
 * A recorded session as provider-neutral messages.
 * - `envelope`: the system prompt and tool specs when the file records them (`{}` when it does not).
 * - `messages`: in request order; every tool call is paired with exactly one tool result by id
 *   (the readers synthesise or drop results to make it so, and say so in `notes`).
 * - `usage`: one entry per assistant message, in order: the provider-reported usage of the call
 *   that produced it (tokens), or `undefined` when the file has none.
 * - `notes`: human-readable lines on what was skipped, renamed or synthesised.
 * - `sidechains`: Claude Code only, with `{sidechains: true}`: each Task-subagent run as its own
 *   transcript (each had its own context window).
 * - `turnStarts`: dsh logs only: indices into `messages` of the user messages that opened a turn
 *   (after a `turn/start`); the others were steering. Without it, replay opens a turn at every user
 *   message that does not follow another user message.
 * - `contextWindow`: dsh logs only: the window (tokens) of the first `request/header` that names one.
 */
export interface Transcript {
  format: TranscriptFormat
  envelope: Envelope
  messages: Message[]
  usage: (Usage | undefined)[]
  notes: string[]
  sidechains?: Transcript[]
  turnStarts?: number[]
  contextWindow?: number
}

/** Options of {@link readTranscript}. */
export interface ReadTranscriptOptions {
  /** Skip detection and read the text as this format (errors then describe that format's shape). */
  format?: TranscriptFormat
  /** Claude Code: also read each sidechain (Task-subagent run) into `Transcript.sidechains`. Default false. */
  sidechains?: boolean
}

/**
 * A file that is not a transcript, or a transcript that breaks its format. `line` is 1-based (JSONL
 * files, or a JSON syntax error whose position the engine reports); `field` is a JSON path inside
 * the document or the line (`messages[3].tool_calls[0].id`, `message.content`). The message says
 * what is wrong and lists the accepted formats.
 */
export class TranscriptError extends Error {
  readonly line?: number
  readonly field?: string
  /** What is wrong, without the place and the accepted formats. */
  readonly problem: string
  constructor(problem: string, at: { line?: number; field?: string } = {}) {
    const where = [at.line === undefined ? '' : `line ${at.line}`, at.field === undefined ? '' : `field ${at.field}`]
      .filter(Boolean).join(', ')
    super(`${where ? `${where}: ` : ''}${problem}. ${acceptedFormats()}`)
    this.name = 'TranscriptError'
    this.problem = problem
    this.line = at.line
    this.field = at.field
  }
}

/**
 * Detects the format of a transcript's text: a JSON document (`[...]` → openai; an object with
 * `trajectory_format: "mini-swe-agent…"` → mini-swe-agent, with `history` → swe-agent, with
 * `messages` → openai) or JSONL (`{seq, type, time, data}` lines → dsh; lines with `type` and
 * `uuid`/`sessionId` → claude-code). Parses the whole text, so a broken line is reported here.
 * @throws {TranscriptError} when the text matches no format, with the line or field at fault.
 */
export function detectTranscriptFormat(text: string): TranscriptFormat {
  return detectParsed(parseTranscriptText(text))
}

/**
 * Reads a transcript's text into {@link Transcript}. Mapping per format:
 * - **openai** — `[...]` or `{messages, tools?}`: leading `system`/`developer` messages → `envelope.system`
 *   (a later one becomes a user message, noted); `tool_calls[].function{name, arguments}` → tool-call
 *   blocks; `tool_call_id` → `toolCallId`; `reasoning_content` (or `reasoning`) → a reasoning block;
 *   content as a string or parts (`text`, `input_text`, `output_text` → text, `image_url` → image; other parts
 *   kept as they are); a `refusal` with no content is the text; the legacy `function_call` is a tool call
 *   `function-call-<index>` answered by the `function` message after it; usage from a message's `usage` when present.
 *   A request/response log (JSONL or a JSON array of `{request: {messages, tools?}, response: {choices, usage}}`,
 *   `body` inside either as in OpenAI's batch files, or one object with `messages` and `choices`): the longest
 *   request's messages and its response's message, each call's usage on the answer it produced. Responses API
 *   items (`message`, `reasoning`, `function_call`, `function_call_output`, or a whole `response` object) are
 *   read as the chat messages they stand for (here, and in mini-swe-agent's and SWE-agent's files).
 * - **mini-swe-agent** — text-based actions (v1, and v2's text-based models): an assistant message with
 *   exactly one action (mini-swe-agent's own rule; 0 or ≥2 are its format errors and ran nothing; v2's
 *   `extra.actions` say which when present) becomes its text without the block plus a tool call `bash`
 *   with arguments `{"command": …}` and the id `mswea-call-<index in messages>`; the action syntax is the
 *   file's `action_regex` (a ```` ```WORD ```` fence or a `<WORD>` tag), else ```` ```bash ```` (v1) or
 *   ```` ```mswea_bash_command ```` (v2). The NEXT user message becomes that call's tool result (a
 *   "timed out" observation or v2's `extra.exception_info` is `isError`), so the pruner applies. Content
 *   is a string or a list of parts. v2's native tool calls are read as openai; v2's `exit` message
 *   (exit status, submission) is skipped.
 *   Usage from `extra.response.usage`. Gemini's `reasoning` is not read: mini-swe-agent never sent it back.
 * - **swe-agent** — `history` only (`trajectory[i].messages` repeats it at every step; without `history`,
 *   the last step's `messages`, else the steps' response, action and observation); tool results carry
 *   `tool_call_ids` (an array). Without native tool calls an answer's `action` is a `bash` tool call
 *   `swe-call-<index>` and the observation after it its result. No per-call usage in the file.
 * - **claude-code** — session files, and the lines of `claude -p --output-format stream-json` (`session_id`,
 *   no `parentUuid`: read in file order; `parent_tool_use_id` marks a subagent's lines, as `isSidechain` does).
 *   The main chain only by default: the path from the last non-sidechain line back
 *   through `parentUuid` (abandoned branches of a rewind are skipped; compaction boundaries are
 *   crossed through `logicalParentUuid` and Claude Code's own summary dropped, so the raw history is
 *   replayed). `isSidechain` lines are Task-subagent traffic with their own context windows: skipped
 *   and counted in `notes`, or each run read into `sidechains` with `{sidechains: true}`. Assistant
 *   lines are grouped by `message.id` (one API response is split over several lines); `tool_use` →
 *   tool call (arguments = `JSON.stringify(input)`), `thinking` → reasoning; each `tool_result`
 *   block → a tool result (`is_error` → `isError`), followed by one user message for the line's other
 *   blocks; `isMeta` lines are kept (Claude Code sends them to the model, it only hides them from the
 *   user); `toolUseResult` is ignored (it duplicates the result). Usage: prompt tokens =
 *   `input_tokens + cache_creation_input_tokens + cache_read_input_tokens`.
 * - **dsh** — the surface-forming events as first written: the messages of `user/message`,
 *   `assistant/message` and `tool/result` events whose `surfaceOp.op` is `append` (the history before
 *   any prune or summary), in log order; the envelope and context window from the first
 *   `request/header`; `turnStarts` from `turn/start` (a user message after it opened a turn, any other
 *   was steering).
 *
 * Every format then goes through one pairing pass: a tool call without a result gets a synthetic
 * error result right after its step, a result without a call is dropped, and a call id reused
 * by a later call (SWE-agent demonstrations do this) is renamed `<id>~<n>`; each is noted.
 * @throws {TranscriptError} for text that is no transcript or breaks its format (line / field given).
 */
export function readTranscript(text: string, options: ReadTranscriptOptions = {}): Transcript {
  if (options.format !== undefined && !isTranscriptFormat(options.format)) {
    throw new TranscriptError(`unknown format ${JSON.stringify(options.format)}`, { field: 'format' })
  }
  const parsed = parseTranscriptText(text)
  const format = options.format ?? detectParsed(parsed)
  const transcript = TRANSCRIPT_READERS[format].read(parsed, options)
  transcript.notes.unshift(...parsed.notes)
  return transcript
}

// ── parsing and detection ──

type TranscriptRecord = Record<string, unknown>
interface JsonlLine { line: number; value: TranscriptRecord }
type ParsedTranscript =
  | { kind: 'json'; value: unknown; notes: string[] }
  | { kind: 'jsonl'; lines: JsonlLine[]; notes: string[] }

const isJsonRecord = (v: unknown): v is TranscriptRecord => typeof v === 'object' && v !== null && !Array.isArray(v)

/** Refuses a parsed value nested deeper than {@link MAX_NESTING_LEVELS} (an explicit stack: the
 *  walk itself cannot overflow). `text` is what was parsed, `line` its first line (to name the deep one). */
function refuseDeepNesting(value: unknown, text: string, line = 1): void {
  if (typeof value === 'object' && value !== null && nestedDeeperThan(value, MAX_NESTING_LEVELS)) {
    let at = 0 // the bracket that opens level MAX_NESTING_LEVELS + 1, outside strings
    for (let d = 0, i = 0; i < text.length; i++) {
      const c = text[i]
      if (c === '"') { for (i++; i < text.length && text[i] !== '"'; i++) if (text[i] === '\\') i++ }
      else if (c === '[' || c === '{') { if (++d > MAX_NESTING_LEVELS) { at = i; break } }
      else if (c === ']' || c === '}') d--
    }
    throw new TranscriptError(`arrays and objects nested more than ${MAX_NESTING_LEVELS} levels deep; replay reads at most ${MAX_NESTING_LEVELS} levels (transcripts nest a few dozen): flatten that value or remove it`, { line: line + lineNumberAt(text, at) - 1 })
  }
}

function parseTranscriptText(text: string): ParsedTranscript {
  if (typeof text !== 'string') throw new TranscriptError(`expected the file's text (a string), got ${typeof text}`)
  if (text.charCodeAt(0) === 0xfeff) text = text.slice(1)
  const start = text.search(/\S/)
  if (start < 0) throw new TranscriptError('the file is empty')
  const firstLine = lineNumberAt(text, start)
  const first = text[start]
  if (first !== '{' && first !== '[') {
    let scalar: unknown
    try { scalar = JSON.parse(text) } catch { scalar = undefined }
    if (scalar !== undefined) throw new TranscriptError(`a JSON ${jsonTypeName(scalar)} is not a transcript (a transcript is a JSON object or array, or JSONL)`)
    const head = text.slice(start, start + 40).split(/\r?\n/)[0]
    throw new TranscriptError(`not JSON: the first non-blank line starts with ${JSON.stringify(head)}`, { line: firstLine })
  }
  let value: unknown
  try {
    value = JSON.parse(text)
  } catch (err) {
    // Not one JSON document: JSONL when its first line parses on its own (a pretty-printed
    // document's first line, "{", does not).
    const end = text.indexOf('\n', start)
    let firstValue: unknown
    try { firstValue = JSON.parse(text.slice(start, end < 0 ? undefined : end)) } catch { firstValue = undefined }
    if (first === '{' && isJsonRecord(firstValue)) return parseJsonl(text)
    throw new TranscriptError(`not valid JSON (${errorMessageOf(err)})`, { line: jsonErrorLine(text, err) })
  }
  refuseDeepNesting(value, text)
  return { kind: 'json', value, notes: [] }
}

/** The most lines a JSONL transcript may have: the size cap alone let 87 million tiny lines through, whose parsed
 *  objects outgrew the heap (the process was killed, with no error). */
const TRANSCRIPT_MAX_LINES = 2_000_000

function parseJsonl(text: string): ParsedTranscript {
  let count = 0 // counted before the split, which alone would hold a string per line
  for (let at = text.indexOf('\n'); at >= 0 && count <= TRANSCRIPT_MAX_LINES; at = text.indexOf('\n', at + 1)) count++
  if (count > TRANSCRIPT_MAX_LINES) {
    throw new TranscriptError(`it has more than ${groupDigits(TRANSCRIPT_MAX_LINES)} lines, the most replay reads `
      + `(TRANSCRIPT_MAX_LINES): split it, or replay one session of it`)
  }
  const rows = text.split('\n')
  const lines: JsonlLine[] = []
  const notes: string[] = []
  let last = rows.length - 1
  while (last >= 0 && rows[last].trim() === '') last--
  for (let i = 0; i <= last; i++) {
    const row = rows[i].trim()
    if (row === '') continue
    let value: unknown
    try {
      value = JSON.parse(row)
    } catch (err) {
      // A torn last line (a writer stopped mid-line: no final newline) is dropped, as docs/design.md §4
      // tolerates it when a session log loads; a broken line anywhere else is corruption.
      if (i === last && !text.slice(text.trimEnd().length).includes('\n')) { // /\n\s*$/, which is quadratic
        notes.push(`dropped the torn last line ${i + 1} (${row.length} UTF-16 units, not valid JSON, no final newline)`)
        break
      }
      throw new TranscriptError(`not valid JSON (${errorMessageOf(err)})`, { line: i + 1 })
    }
    if (!isJsonRecord(value)) {
      throw new TranscriptError(`a JSONL line must be a JSON object, got ${jsonTypeName(value)}`, { line: i + 1 })
    }
    refuseDeepNesting(value, row, i + 1)
    lines.push({ line: i + 1, value })
  }
  return { kind: 'jsonl', lines, notes }
}

/** The first format of {@link TRANSCRIPT_READERS} that detects the text; else an error listing what each looks for. */
function detectParsed(parsed: ParsedTranscript): TranscriptFormat {
  const format = TRANSCRIPT_FORMATS.find((f) => TRANSCRIPT_READERS[f].detect(parsed))
  if (format !== undefined) return format
  const container = parsed.kind
  const wanted = TRANSCRIPT_FORMATS.flatMap((f) => {
    const looksFor = (TRANSCRIPT_READERS[f].looksFor as TranscriptReader['looksFor'])[container]
    return looksFor === undefined ? [] : [`${f}: ${looksFor}`]
  }).join('; ')
  if (parsed.kind === 'jsonl') {
    const [head] = parsed.lines
    throw new TranscriptError(`JSONL that matches no format (${wanted}); its first line's keys are ${jsonKeyList(head.value)}`, { line: head.line })
  }
  const v = parsed.value
  if (!isJsonRecord(v)) throw new TranscriptError(`a JSON ${jsonTypeName(v)} is not a transcript`)
  throw new TranscriptError(`a JSON object that matches no format (${wanted}); its keys are ${jsonKeyList(v)}`)
}

function isDshEvent(v: TranscriptRecord): boolean {
  return typeof v.seq === 'number' && typeof v.type === 'string' && 'time' in v && isJsonRecord(v.data)
}

function isClaudeCodeLine(v: TranscriptRecord): boolean {
  // `session_id`: the lines of `claude -p --output-format stream-json`
  return typeof v.type === 'string' && (typeof v.sessionId === 'string' || typeof v.session_id === 'string' || typeof v.uuid === 'string' ||
    (v.type === 'summary' && typeof v.leafUuid === 'string'))
}

function lineNumberAt(text: string, index: number): number {
  let line = 1
  for (let i = text.indexOf('\n'); i >= 0 && i < index; i = text.indexOf('\n', i + 1)) line++
  return line
}

/** The line of a JSON.parse error, from V8's "position N" or a "line N column M" message; else undefined. */
function jsonErrorLine(text: string, err: unknown): number | undefined {
  const message = errorMessageOf(err)
  const lc = /line (\d+) column \d+/.exec(message)
  if (lc) return Number(lc[1])
  const pos = /position (\d+)/.exec(message)
  return pos ? lineNumberAt(text, Number(pos[1])) : undefined
}

const errorMessageOf = (err: unknown): string => (err instanceof Error ? err.message : String(err))
const jsonTypeName = (v: unknown): string => (v === null ? 'null' : Array.isArray(v) ? 'array' : typeof v)
const jsonKeyList = (v: TranscriptRecord): string => {
  const keys = Object.keys(v)
  return keys.length === 0 ? '(none)' : keys.slice(0, 8).map(k => JSON.stringify(k)).join(', ') + (keys.length > 8 ? ', …' : '')
}

function expectJsonDocument(parsed: ParsedTranscript, format: TranscriptFormat): unknown {
  if (parsed.kind === 'json') return parsed.value
  throw new TranscriptError(`a ${format} transcript is one JSON document, but this file is JSONL`, { line: parsed.lines[0].line })
}

function expectJsonl(parsed: ParsedTranscript, format: TranscriptFormat): JsonlLine[] {
  if (parsed.kind === 'jsonl') return parsed.lines
  // One JSONL line is also one JSON document.
  if (isJsonRecord(parsed.value)) return [{ line: 1, value: parsed.value }]
  throw new TranscriptError(`a ${format} transcript is JSONL (one JSON object per line), but this file is a JSON ` +
    jsonTypeName(parsed.value))
}

// ── shared building blocks ──

/** Messages as read, before pairing; `where[i]` locates message i in the file for notes. */
interface TranscriptDraft {
  envelope: Envelope
  messages: Message[]
  where: string[]
  usage: (Usage | undefined)[]
  notes: string[]
}

const newTranscriptDraft = (): TranscriptDraft => ({ envelope: {}, messages: [], where: [], usage: [], notes: [] })

function pushDraft(draft: TranscriptDraft, message: Message, where: string, usage?: Usage): void {
  // every reader's message is checked as Session.append checks it: a bad block is the transcript's error, at its place
  // (it had reached the replay's provider as a TypeError, reported as "the summarizer failed"). An empty call id is
  // not: the replay's loop repairs it, as it would a model's.
  const checked: Message = message.role === 'assistant' && Array.isArray(message.content) ? { ...message, content: message.content.map((b) =>
    (isRecord(b) && b.type === 'tool-call' && b.id === '' ? { ...b, id: '-' } : b)) }
    : message.role === 'tool' && message.toolCallId === '' ? { ...message, toolCallId: '-' } : message
  try { validateMessage(checked) } catch (err) {
    if (!(err instanceof SessionError)) throw err
    const line = /^line (\d+)$/.exec(where)
    throw new TranscriptError(err.message.replace(/^INVALID_MESSAGE: /, ''), line ? { line: Number(line[1]) } : { field: where })
  }
  draft.messages.push(message)
  draft.where.push(where)
  if (message.role === 'assistant') draft.usage.push(usage)
}

/** Usage in the OpenAI chat-completions shape (`prompt_tokens`, …; docs/design.md §6), else undefined. */
function chatCompletionUsage(u: unknown): Usage | undefined {
  if (!isJsonRecord(u) || typeof u.prompt_tokens !== 'number' || typeof u.completion_tokens !== 'number') return undefined
  const usage: Usage = { promptTokens: u.prompt_tokens, completionTokens: u.completion_tokens }
  const cached = isJsonRecord(u.prompt_tokens_details) ? u.prompt_tokens_details.cached_tokens : u.prompt_cache_hit_tokens
  if (typeof cached === 'number') usage.cachedTokens = cached
  const reasoning = isJsonRecord(u.completion_tokens_details) ? u.completion_tokens_details.reasoning_tokens : undefined
  if (typeof reasoning === 'number') usage.reasoningTokens = reasoning
  return usage
}

/** OpenAI message content (string, null or parts) → blocks; empty text is dropped. */
function chatContentBlocks(content: unknown, field: string, at: { line?: number } = {}): Block[] {
  if (content === null || content === undefined) return []
  if (typeof content === 'string') return content === '' ? [] : [{ type: 'text', text: content }]
  if (!Array.isArray(content)) {
    throw new TranscriptError(`content must be a string or an array of parts, got ${jsonTypeName(content)}`, { ...at, field })
  }
  return content.map((part, i) => chatPartBlock(part, `${field}[${i}]`, at))
}

/** One content part: `text` → text block, `image_url` → image block, any other part kept as it is. */
function chatPartBlock(part: unknown, field: string, at: { line?: number }): Block {
  if (!isJsonRecord(part) || typeof part.type !== 'string') {
    throw new TranscriptError('a content part must be an object with a string "type"', { ...at, field })
  }
  if (part.type === 'text') {
    if (typeof part.text !== 'string') {
      throw new TranscriptError('a text part needs a string "text"', { ...at, field: `${field}.text` })
    }
    return { type: 'text', text: part.text }
  }
  if (part.type === 'image_url') return { type: 'image', image_url: part.image_url }
  // the Responses API's text parts (`input_text`, `output_text`), as some chat logs keep them
  if ((part.type === 'input_text' || part.type === 'output_text') && typeof part.text === 'string') return { type: 'text', text: part.text }
  return { ...part, type: part.type }
}

const blocksText = (blocks: Block[]): string =>
  blocks.map(b => (b.type === 'text' && typeof b.text === 'string' ? b.text : '')).join('')

/**
 * OpenAI-style chat messages → draft. `path` names the array for field paths (`messages`, `history`).
 * `usageOf` reads an assistant message's usage. SWE-agent's `tool_call_ids` (array) is accepted
 * beside `tool_call_id`.
 */
function readChatMessages(
  list: unknown[], path: string, draft: TranscriptDraft, usageOf: (m: TranscriptRecord) => Usage | undefined,
  skip: (m: TranscriptRecord) => boolean = () => false,
): void {
  const system: string[] = []
  let lateSystem = 0
  let functionCall: string | undefined // the id given to the last legacy `function_call`, which a `function` message answers
  let functionCalls = 0
  const entries = responsesItemsAsChat(list, path, skip)
  if (entries.length !== list.length) draft.notes.push(`OpenAI Responses API items read as chat messages (${list.length} item(s) → ${entries.length} message(s))`)
  entries.forEach(({ value: m, index: i }) => {
    const at = `${path}[${i}]`
    if (!isJsonRecord(m)) throw new TranscriptError(`a message must be an object, got ${jsonTypeName(m)}`, { field: at })
    if (skip(m)) return
    if (m.role !== 'function' && m.role !== 'tool') functionCall = undefined
    const role = m.role
    if (role === 'system' || role === 'developer') {
      const text = blocksText(chatContentBlocks(m.content, `${at}.content`))
      if (draft.messages.length === 0) system.push(text)
      else { lateSystem++; pushDraft(draft, { role: 'user', content: text }, at) }
    } else if (role === 'user') {
      const content = typeof m.content === 'string' ? m.content : chatContentBlocks(m.content, `${at}.content`)
      pushDraft(draft, { role: 'user', content }, at)
    } else if (role === 'assistant') {
      const content: Block[] = []
      const reasoning = m.reasoning_content ?? m.reasoning
      if (typeof reasoning === 'string' && reasoning !== '') content.push({ type: 'reasoning', text: reasoning })
      for (const b of chatContentBlocks(m.content, `${at}.content`)) content.push(b) // not push(...): 200,000 parts overflowed the stack
      // a refusal is the answer's text (the API takes it back as the message's refusal)
      if (content.length === 0 && typeof m.refusal === 'string' && m.refusal !== '') content.push({ type: 'text', text: m.refusal })
      // the legacy `function_call` (before `tool_calls`): one call without an id; the next `function` message is its result
      if (isJsonRecord(m.function_call) && !(Array.isArray(m.tool_calls) && m.tool_calls.length > 0)) {
        const fn = m.function_call
        if (typeof fn.name !== 'string') {
          throw new TranscriptError('a function_call needs a string "name"', { field: `${at}.function_call.name` })
        }
        functionCall = `function-call-${i}`
        functionCalls++
        const args = typeof fn.arguments === 'string' ? fn.arguments : JSON.stringify(fn.arguments ?? {})
        content.push({ type: 'tool-call', id: functionCall, name: fn.name, arguments: args })
      }
      if (m.tool_calls !== undefined && m.tool_calls !== null) {
        if (!Array.isArray(m.tool_calls)) {
          throw new TranscriptError('tool_calls must be an array', { field: `${at}.tool_calls` })
        }
        m.tool_calls.forEach((c, j) => {
          const cf = `${at}.tool_calls[${j}]`
          // a custom tool's call (`type: "custom"`, free-form `input`) is a call with that input as its arguments
          const fn = !isJsonRecord(c) ? undefined : c.type === 'custom' && isJsonRecord(c.custom) && c.function === undefined
            ? { name: c.custom.name, arguments: typeof c.custom.input === 'string' ? c.custom.input : JSON.stringify(c.custom.input ?? '') } : c.function
          if (!isJsonRecord(c) || typeof c.id !== 'string') {
            throw new TranscriptError('a tool call needs a string "id"', { field: `${cf}.id` })
          }
          if (!isJsonRecord(fn) || typeof fn.name !== 'string') {
            throw new TranscriptError('a tool call needs "function": {"name", "arguments"}', { field: `${cf}.function.name` })
          }
          const args = typeof fn.arguments === 'string' ? fn.arguments : JSON.stringify(fn.arguments ?? {})
          content.push({ type: 'tool-call', id: c.id, name: fn.name, arguments: args })
        })
      }
      pushDraft(draft, { role: 'assistant', content }, at, usageOf(m))
    } else if (role === 'tool') {
      const ids = typeof m.tool_call_id === 'string' ? [m.tool_call_id]
        : Array.isArray(m.tool_call_ids) && m.tool_call_ids.length > 0 && m.tool_call_ids.every(x => typeof x === 'string')
          ? m.tool_call_ids as string[] : undefined
      if (!ids) {
        throw new TranscriptError('a tool message needs "tool_call_id" (a string)', { field: `${at}.tool_call_id` })
      }
      const content = chatContentBlocks(m.content, `${at}.content`)
      if (content.length === 0) content.push({ type: 'text', text: '' })
      // One observation answering several calls: the text goes to the first, so it is counted once.
      ids.forEach((id, k) => pushDraft(draft, {
        role: 'tool', toolCallId: id, content: k === 0 ? content : [{ type: 'text', text: `(see the result of ${ids[0]})` }],
      }, at))
      if (ids.length > 1) {
        draft.notes.push(`${at} answers ${ids.length} tool calls; its text went to the first (${ids[0]})`)
      }
    } else if (role === 'function') {
      const content = chatContentBlocks(m.content, `${at}.content`)
      if (content.length === 0) content.push({ type: 'text', text: '' })
      // with no function_call open, an id no call has: the pairing pass drops it and says so
      pushDraft(draft, { role: 'tool', toolCallId: functionCall ?? `function ${typeof m.name === 'string' ? m.name : '?'}`, content }, at)
      functionCall = undefined
    } else {
      throw new TranscriptError(`unknown role ${JSON.stringify(role)}; accepted roles: system, developer, user, assistant, tool, function`,
        { field: `${at}.role` })
    }
  })
  if (functionCalls > 0) {
    draft.notes.push(`${functionCalls} legacy function_call(s) read as tool calls with the ids function-call-<index>, each answered by the "function" message after it`)
  }
  if (system.length > 0) draft.envelope.system = system.join('\n\n')
  if (lateSystem > 0) {
    draft.notes.push(`${lateSystem} system message(s) after the conversation began kept as user messages (in place)`)
  }
}

const isResponsesItem = (m: unknown): m is TranscriptRecord => isJsonRecord(m) && m.role === undefined && (typeof m.type === 'string' || m.object === 'response')

/** Responses API usage (`input_tokens`, `output_tokens`, `input_tokens_details.cached_tokens`) in the chat-completions shape. */
function responsesUsageAsChat(u: unknown): TranscriptRecord | undefined {
  if (!isJsonRecord(u) || typeof u.input_tokens !== 'number' || typeof u.output_tokens !== 'number') return undefined
  const usage: TranscriptRecord = { prompt_tokens: u.input_tokens, completion_tokens: u.output_tokens }
  if (isJsonRecord(u.input_tokens_details)) usage.prompt_tokens_details = { cached_tokens: u.input_tokens_details.cached_tokens }
  if (isJsonRecord(u.output_tokens_details)) usage.completion_tokens_details = { reasoning_tokens: u.output_tokens_details.reasoning_tokens }
  return usage
}

/**
 * OpenAI Responses API items among chat messages (its logs; mini-swe-agent v2's response models, which record each
 * answer as the whole `response` object) → chat messages, each with the index of the item it starts at (for field
 * paths): a run of `reasoning`, `function_call` and assistant `message` items, or one `response` object's `output`,
 * is one assistant message (its usage the response's); `function_call_output` is a tool message; an item with a
 * role (`{type: "message", role: "user", …}`) passes as a message. Without such items the list is as it was.
 */
function responsesItemsAsChat(list: unknown[], path: string, skip: (m: TranscriptRecord) => boolean): { value: unknown; index: number }[] {
  if (!list.some(isResponsesItem)) return list.map((value, index) => ({ value, index }))
  const out: { value: unknown; index: number }[] = []
  let open: { role: 'assistant'; content: unknown[]; tool_calls: unknown[]; reasoning_content?: string; usage?: unknown } | undefined
  const assistant = (index: number) => {
    if (!open) { open = { role: 'assistant', content: [], tool_calls: [] }; out.push({ value: open, index }) }
    return open
  }
  list.forEach((m, index) => {
    if (!isResponsesItem(m) || skip(m)) { open = undefined; out.push({ value: m, index }); return }
    const whole = m.object === 'response'
    if (whole) open = undefined // each recorded response is one answer
    const items: unknown[] = whole ? (Array.isArray(m.output) ? m.output : []) : [m]
    items.forEach((item, k) => {
      const field = whole ? `${path}[${index}].output[${k}]` : `${path}[${index}]`
      if (!isJsonRecord(item)) throw new TranscriptError(`a Responses API item must be an object, got ${jsonTypeName(item)}`, { field })
      if (item.type === 'function_call') {
        assistant(index).tool_calls.push({ id: item.call_id ?? item.id, type: 'function', function: { name: item.name, arguments: item.arguments } })
      } else if (item.type === 'reasoning') {
        const text = Array.isArray(item.summary) ? item.summary.map(p => (isJsonRecord(p) && typeof p.text === 'string' ? p.text : '')).join('\n') : ''
        const a = assistant(index)
        if (text !== '') a.reasoning_content = a.reasoning_content === undefined ? text : `${a.reasoning_content}\n${text}`
      } else if (item.type === 'message' && (item.role === 'assistant' || item.role === undefined)) {
        const parts = typeof item.content === 'string' ? [{ type: 'text', text: item.content }] : Array.isArray(item.content) ? item.content : []
        for (const part of parts) assistant(index).content.push(part)
      } else if (item.type === 'function_call_output') {
        open = undefined
        out.push({ value: { role: 'tool', tool_call_id: item.call_id, content: item.output ?? null }, index })
      } else if (typeof item.role === 'string') {
        open = undefined
        out.push({ value: item, index })
      } else {
        throw new TranscriptError(`a Responses API item of type ${JSON.stringify(item.type)}, which replay does not read (it reads message, reasoning, function_call and function_call_output)`, { field: `${field}.type` })
      }
    })
    if (whole) {
      const a = assistant(index)
      const usage = responsesUsageAsChat(m.usage)
      if (usage) a.usage = usage
      open = undefined
    }
  })
  return out
}

/** The text of a synthesised result (the pairing pass), stated as what it is: not the tool's output. */
const SYNTHETIC_RESULT_TEXT = 'No result was recorded for this tool call in the transcript (synthesised by dsh replay).'

/**
 * The pairing pass (docs/design.md §4: never a tool call without its result or a result without its
 * call, matched by id). Results are expected after their call and before the next user or
 * assistant message; a call still open at that point gets a synthetic error result there.
 */
function pairToolCalls(draft: TranscriptDraft): Message[] {
  const out: Message[] = []
  // The open calls of the last step in order, and by recorded id the queue of those not yet answered:
  // a result finds its call in O(1), so that a step of many calls (one id or many) stays linear.
  type OpenCall = { id: string; original: string; name: string; where: string; answered: boolean }
  let open: OpenCall[] = []
  let waiting = new Map<string, { calls: OpenCall[]; next: number }>()
  const uses = new Map<string, number>(), nextSuffix = new Map<string, number>()
  const synthesised: string[] = []
  const dropped: string[] = []
  const renamed: string[] = []
  const closeOpen = () => {
    for (const c of open) {
      if (c.answered) continue
      synthesised.push(`${c.name} ${c.id} (${c.where})`)
      out.push({
        role: 'tool', toolCallId: c.id, isError: true,
        content: [{ type: 'text', text: SYNTHETIC_RESULT_TEXT }],
      })
    }
    if (open.length > 0) { open = []; waiting = new Map() }
  }
  draft.messages.forEach((m, i) => {
    const where = draft.where[i]
    if (m.role === 'tool') {
      const queue = waiting.get(m.toolCallId)
      if (!queue || queue.next === queue.calls.length) { dropped.push(`${m.toolCallId} (${where})`); return }
      const call = queue.calls[queue.next++]
      call.answered = true
      out.push(call.id === m.toolCallId ? m : { ...m, toolCallId: call.id })
      return
    }
    closeOpen()
    if (m.role === 'assistant' && m.content.some(b => b.type === 'tool-call')) {
      const content = m.content.map((b): Block => {
        if (b.type !== 'tool-call') return b
        const call = b as ToolCallBlock
        const n = (uses.get(call.id) ?? 0) + 1
        uses.set(call.id, n)
        let id = call.id
        if (n > 1) {
          // the first free `id~k`, from where the last search for this id stopped (from n each time: quadratic)
          let k = Math.max(n, nextSuffix.get(call.id) ?? 0)
          for (id = `${call.id}~${k}`; uses.has(id); id = `${call.id}~${++k}`);
          nextSuffix.set(call.id, k + 1)
          uses.set(id, 1)
          renamed.push(`${call.id} → ${id} (${where})`)
        }
        const entry: OpenCall = { id, original: call.id, name: call.name, where, answered: false }
        open.push(entry)
        const queue = waiting.get(call.id)
        if (queue) queue.calls.push(entry); else waiting.set(call.id, { calls: [entry], next: 0 })
        return id === call.id ? call : { ...call, id }
      })
      out.push({ ...m, content })
      return
    }
    out.push(m)
  })
  closeOpen()
  const list = (items: string[]) => items.slice(0, 5).join(', ') + (items.length > 5 ? `, … (${items.length - 5} more)` : '')
  if (synthesised.length) {
    draft.notes.push(`synthesised an error result for ${synthesised.length} tool call(s) the transcript never answered: ` +
      list(synthesised))
  }
  if (dropped.length) {
    draft.notes.push(`dropped ${dropped.length} tool result(s) with no open tool call of that id: ${list(dropped)}`)
  }
  if (renamed.length) {
    draft.notes.push(`renamed ${renamed.length} reused tool-call id(s) so that ids are unique: ${list(renamed)}`)
  }
  if (!out.some(m => m.role === 'tool')) {
    draft.notes.push('no tool calls: there are no tool results for the pruner to act on')
  }
  return out
}

function finishTranscript(format: TranscriptFormat, draft: TranscriptDraft): Transcript {
  if (draft.messages.length === 0) {
    // a report of 0 steps would look like a replay of nothing; say what the file held instead
    const said = draft.notes.length > 0 ? ` (${draft.notes.join('; ')})` : ''
    throw new TranscriptError(`no conversation to replay: the ${format} file holds no user, assistant or tool message${said}`)
  }
  const messages = pairToolCalls(draft)
  const refused: string[] = []
  let k = 0 // the assistant message's index in draft.usage
  draft.messages.forEach((m, i) => {
    if (m.role !== 'assistant') return
    const recorded = draft.usage[k]
    const usage = recorded && recordedUsage(recorded)
    if (usage !== recorded) { refused.push(draft.where[i]); draft.usage[k] = usage }
    k++
  })
  if (refused.length > 0) {
    draft.notes.push(`ignored ${refused.length} usage figure(s) that are no token count from 0 to ${TRANSCRIPT_MAX_USAGE_TOKENS} `
      + `(negative, not finite or absurd): ${refused.slice(0, 5).join(', ')}${refused.length > 5 ? `, … (${refused.length - 5} more)` : ''}`)
  }
  return { format, envelope: draft.envelope, messages, usage: draft.usage, notes: draft.notes }
}

/** The most tokens one recorded figure may count: a thousand times the largest context windows. A
 *  larger one (1e308), a negative or a non-finite one is a broken recorder's; calibrating on it would
 *  put every calibrated figure and cost of the report at that size. */
const TRANSCRIPT_MAX_USAGE_TOKENS = 1_000_000_000
const isRecordedTokenCount = (v: unknown): v is number =>
  typeof v === 'number' && Number.isFinite(v) && v >= 0 && v <= TRANSCRIPT_MAX_USAGE_TOKENS

/** `usage` itself when every figure is a token count; without a bad optional figure; undefined when a
 *  prompt or completion count is bad (see {@link TRANSCRIPT_MAX_USAGE_TOKENS}). */
function recordedUsage(usage: Usage): Usage | undefined {
  if (!isRecordedTokenCount(usage.promptTokens) || !isRecordedTokenCount(usage.completionTokens)) return undefined
  const cachedOk = usage.cachedTokens === undefined || (isRecordedTokenCount(usage.cachedTokens) && usage.cachedTokens <= usage.promptTokens)
  const reasoningOk = usage.reasoningTokens === undefined || isRecordedTokenCount(usage.reasoningTokens)
  if (cachedOk && reasoningOk) return usage
  const kept: Usage = { ...usage }
  if (!cachedOk) delete kept.cachedTokens
  if (!reasoningOk) delete kept.reasoningTokens
  return kept
}

// ── openai ──

function readOpenAITranscript(parsed: ParsedTranscript): Transcript {
  const calls = chatCallRecords(parsed)
  if (calls) return readChatCallLog(calls)
  const doc = expectJsonDocument(parsed, 'openai')
  const draft = newTranscriptDraft()
  let list: unknown
  let path = 'messages'
  if (Array.isArray(doc)) { list = doc; path = '' } else if (isJsonRecord(doc)) list = doc.messages
  if (!Array.isArray(list)) {
    throw new TranscriptError('an openai transcript is a JSON array of messages or an object with a "messages" array',
      { field: 'messages' })
  }
  if (list.length === 0) throw new TranscriptError('the message array is empty', { field: path || undefined })
  const head = list[0]
  if (isJsonRecord(head) && !('role' in head) && ('action' in head || 'observation' in head)) {
    throw new TranscriptError('this looks like an OpenHands event list, which replay does not read', { field: `${path}[0].role` })
  }
  readChatMessages(list, path, draft, m => chatCompletionUsage(m.usage))
  if (isJsonRecord(doc)) {
    if (typeof doc.system === 'string' && draft.envelope.system === undefined) draft.envelope.system = doc.system
    if (doc.tools !== undefined) draft.envelope.tools = readToolSpecs(doc.tools, 'tools')
  }
  return finishTranscript('openai', draft)
}

// A request/response log: one entry per API call, `{request: {messages, tools?}, response: {choices: [{message}], usage}}`
// (either may wrap its body in `body`, as OpenAI's batch files do), or one object holding the request's `messages` and
// the response's `choices` side by side.

const chatCallRequest = (v: TranscriptRecord): TranscriptRecord | undefined => {
  const r = isJsonRecord(v.request) ? (isJsonRecord(v.request.body) ? v.request.body : v.request) : Array.isArray(v.choices) ? v : undefined
  return r && Array.isArray(r.messages) ? r : undefined
}
const chatCallResponse = (v: TranscriptRecord): TranscriptRecord | undefined => {
  const r = isJsonRecord(v.response) ? (isJsonRecord(v.response.body) ? v.response.body : v.response) : Array.isArray(v.choices) ? v : undefined
  return r && Array.isArray(r.choices) ? r : undefined
}
function isChatCallRecord(v: unknown): v is TranscriptRecord {
  return isJsonRecord(v) && chatCallRequest(v) !== undefined && ('response' in v || Array.isArray(v.choices))
}

interface ChatCall { value: TranscriptRecord; line?: number; field: string }

/** The entries of a request/response log (JSONL, a JSON array of them, or one), else undefined (plain messages). */
function chatCallRecords(parsed: ParsedTranscript): ChatCall[] | undefined {
  if (parsed.kind === 'jsonl') return isChatCallRecord(parsed.lines[0].value) ? parsed.lines.map(l => ({ value: l.value, line: l.line, field: '' })) : undefined
  const doc = parsed.value
  if (isChatCallRecord(doc)) return [{ value: doc, field: '' }]
  if (Array.isArray(doc) && doc.length > 0 && isChatCallRecord(doc[0])) {
    return doc.map((v, i) => {
      if (!isJsonRecord(v)) throw new TranscriptError(`a log entry must be an object, got ${jsonTypeName(v)}`, { field: `[${i}]` })
      return { value: v, field: `[${i}].` }
    })
  }
  return undefined
}

/** Runs `read`; a TranscriptError it throws without a line gets `line` (a JSONL entry's). */
function atLine<T>(line: number | undefined, read: () => T): T {
  try { return read() } catch (err) {
    if (line === undefined || !(err instanceof TranscriptError) || err.line !== undefined) throw err
    throw new TranscriptError(err.problem, { line, field: err.field })
  }
}

/**
 * A request/response log → transcript: the conversation is the longest request's messages (the last of the longest) and
 * the message of its response;
 * each call's usage goes to the answer it produced, the message right after its request's (when that request is the
 * same conversation: its last message is the conversation's at that place). A call that is not is counted in a note.
 */
function readChatCallLog(calls: ChatCall[]): Transcript {
  const draft = newTranscriptDraft()
  const entries = calls.map(c => {
    const request = chatCallRequest(c.value), response = chatCallResponse(c.value)
    if (!request) {
      throw new TranscriptError('a request/response log entry needs "request": {"messages": [...]}', { line: c.line, field: `${c.field}request.messages` })
    }
    return { ...c, request, response, messages: request.messages as unknown[] }
  })
  // the conversation is the longest request's (the last of the longest): a side call logged after it (a title, a
  // summary, a probe of another conversation) must not stand for the session
  let last = entries[0]
  for (const e of entries) if (e.messages.length >= last.messages.length) last = e
  const conversation: unknown[] = [...last.messages]
  const answerOf = (r: TranscriptRecord | undefined) => (r && Array.isArray(r.choices) && isJsonRecord(r.choices[0]) && isJsonRecord(r.choices[0].message) ? r.choices[0].message : undefined)
  const answer = answerOf(last.response)
  if (answer) conversation.push({ role: 'assistant', ...answer })
  let placed = 0, unplaced = 0
  const sameJson = (a: unknown, b: unknown) => JSON.stringify(a) === JSON.stringify(b)
  for (const e of entries) {
    const n = e.messages.length, at = conversation[n]
    const usage = e.response?.usage
    if (usage === undefined) continue
    if (isJsonRecord(at) && at.role === 'assistant' && at.usage === undefined && (n === 0 || sameJson(e.messages[n - 1], conversation[n - 1]))) {
      conversation[n] = { ...at, usage }
      placed++
    } else unplaced++
  }
  if (conversation.length === 0) throw new TranscriptError('the last request has no messages and its response no message', { line: last.line, field: `${last.field}request.messages` })
  atLine(last.line, () => readChatMessages(conversation, `${last.field}request.messages`, draft, m => chatCompletionUsage(m.usage)))
  if (last.request.tools !== undefined) draft.envelope.tools = atLine(last.line, () => readToolSpecs(last.request.tools, `${last.field}request.tools`))
  draft.notes.push(`a request/response log of ${calls.length} call(s): the longest request's messages (${last.line !== undefined ? `line ${last.line}` : `entry ${entries.indexOf(last) + 1}`}) and its response replayed; ` +
    `usage of ${placed} call(s) on the answers they produced` + (unplaced > 0 ? `; ${unplaced} call(s) with usage are of another conversation or a changed one (not placed)` : ''))
  return finishTranscript('openai', draft)
}

/** `tools` as OpenAI sends them (`{type: "function", function: {...}}`) or bare `{name, ...}` specs. */
function readToolSpecs(tools: unknown, field: string, line?: number): ToolSpec[] {
  if (!Array.isArray(tools)) throw new TranscriptError('"tools" must be an array of function specs', { line, field })
  return tools.map((t, i) => {
    const fn = isJsonRecord(t) && isJsonRecord(t.function) ? t.function : t
    if (!isJsonRecord(fn) || typeof fn.name !== 'string') {
      throw new TranscriptError('a tool spec needs a string "name"', { line, field: `${field}[${i}]` })
    }
    const spec: ToolSpec = { name: fn.name }
    if (typeof fn.description === 'string') spec.description = fn.description
    if (isJsonRecord(fn.parameters)) spec.parameters = fn.parameters
    return spec
  })
}

// ── mini-swe-agent ──

/**
 * How a mini-swe-agent answer states its command, read off the file: `info.config.model.action_regex` (v2) or
 * `info.config.agent.action_regex` (v1) when it is one of the two shapes its configurations use, a fence
 * ```` ```WORD\s*\n(.*?)\n``` ```` or a tag `<WORD>(.*?)</WORD>`; else the default of its trajectory format: the
 * ```` ```bash ```` fence of v1 (`mini-swe-agent-1`), the ```` ```mswea_bash_command ```` fence of v2's text-based models.
 */
type MiniActionSyntax = { kind: 'fence' | 'tag'; word: string }

function miniActionSyntax(doc: TranscriptRecord): MiniActionSyntax {
  const config = isJsonRecord(doc.info) && isJsonRecord(doc.info.config) ? doc.info.config : {}
  for (const part of [config.model, config.agent]) {
    const regex = isJsonRecord(part) ? part.action_regex : undefined
    if (typeof regex !== 'string') continue
    const fence = /^```([\w-]+)\\s\*\\n\((?:\.\*\?|\[\\s\\S\]\*\?)\)\\n```$/.exec(regex)
    if (fence) return { kind: 'fence', word: fence[1] }
    const tag = /^<([\w-]+)>\((?:\.\*\?|\[\\s\\S\]\*\?)\)<\/([\w-]+)>$/.exec(regex)
    if (tag && tag[1] === tag[2]) return { kind: 'tag', word: tag[1] }
  }
  const format = typeof doc.trajectory_format === 'string' ? doc.trajectory_format : 'mini-swe-agent-1'
  return { kind: 'fence', word: format === 'mini-swe-agent-1' ? 'bash' : 'mswea_bash_command' }
}

/**
 * The action blocks of a mini-swe-agent answer (its command is the one block), at most `max`, as mini-swe-agent's
 * `action_regex` finds them with `re.DOTALL`: for a fence ```` ```bash ```` 1.x's default ``/```bash\s*\n([\s\S]*?)\n```/g``
 * (test/replay-formats.test.ts checks that), for a tag `/<WORD>([\s\S]*?)<\/WORD>/g`, but in linear time: that RegExp, on
 * an answer of many unclosed fences, searched to the end from each one (a 900 KB answer took 15 s).
 */
function actionBlocks(content: string, max: number, syntax: MiniActionSyntax = { kind: 'fence', word: 'bash' }): { index: number; end: number; command: string }[] {
  const out: { index: number; end: number; command: string }[] = []
  if (syntax.kind === 'tag') {
    const open = `<${syntax.word}>`, close = `</${syntax.word}>`
    for (let at = content.indexOf(open); at >= 0 && out.length < max; at = content.indexOf(open, at)) {
      const shut = content.indexOf(close, at + open.length)
      if (shut < 0) break // no close after this tag, so none after a later one either
      out.push({ index: at, end: shut + close.length, command: content.slice(at + open.length, shut) })
      at = shut + close.length
    }
    return out
  }
  const FENCE = '```' + syntax.word
  for (let at = content.indexOf(FENCE); at >= 0 && out.length < max; at = content.indexOf(FENCE, at + 1)) {
    let b = at + FENCE.length, lastLF = -1, prevLF = -1
    for (; b < content.length && /\s/.test(content[b]); b++) if (content[b] === '\n') { prevLF = lastLF; lastLF = b }
    if (lastLF < 0) continue
    const close = content.indexOf('\n```', lastLF + 1)
    if (close >= 0) {
      out.push({ index: at, end: close + 4, command: content.slice(lastLF + 1, close) })
      at = close + 3 // the next search starts after this block (at + 1)
    } else if (prevLF >= 0 && content.startsWith('```', lastLF + 1)) {
      out.push({ index: at, end: lastLF + 4, command: content.slice(prevLF + 1, lastLF) })
      at = lastLF + 3
    } else break // no close after this fence, so none after a later one either
  }
  return out
}

/** mini-swe-agent v2's `extra.actions` of an answer (`[{command, tool_call_id?}]`: the commands it ran), else undefined (v1). */
function miniRecordedActions(m: TranscriptRecord): string[] | undefined {
  const actions = isJsonRecord(m.extra) ? m.extra.actions : undefined
  if (!Array.isArray(actions) || !actions.every(a => isJsonRecord(a) && typeof a.command === 'string')) return undefined
  return actions.map(a => (a as TranscriptRecord).command as string)
}

function readMiniSweAgent(parsed: ParsedTranscript): Transcript {
  const doc = expectJsonDocument(parsed, 'mini-swe-agent')
  if (!isJsonRecord(doc) || !Array.isArray(doc.messages)) {
    throw new TranscriptError('a mini-swe-agent trajectory is a JSON object with a "messages" array', { field: 'messages' })
  }
  const list: unknown[] = doc.messages
  const draft = newTranscriptDraft()
  const usageOf = (m: TranscriptRecord) =>
    (isJsonRecord(m.extra) && isJsonRecord(m.extra.response) ? chatCompletionUsage(m.extra.response.usage) : undefined) ?? chatCompletionUsage(m.usage)
  // v2 (`mini-swe-agent-1.1`) ends a run with a `role: "exit"` message (exit status, submission): the loop stops there,
  // so no model ever read it.
  const isExit = (m: unknown) => isJsonRecord(m) && m.role === 'exit'
  const exits = list.filter(isExit).length
  const exitNote = () => { if (exits > 0) draft.notes.push(`skipped ${exits} "exit" message(s) (mini-swe-agent's exit status and submission; no model read them)`) }
  if (list.some(m => isJsonRecord(m) && (m.role === 'tool' || Array.isArray(m.tool_calls) || (isResponsesItem(m) && !isExit(m))))) {
    readChatMessages(list, 'messages', draft, usageOf, isExit)
    draft.notes.push('mini-swe-agent trajectory with native tool calls: read as OpenAI messages')
    exitNote()
    return finishTranscript('mini-swe-agent', draft)
  }
  const syntax = miniActionSyntax(doc)
  const syntaxName = syntax.kind === 'fence' ? `\`\`\`${syntax.word}` : `<${syntax.word}>`
  let calls = 0
  let plain = 0
  let pending: string | undefined
  const system: string[] = []
  list.forEach((m, i) => {
    const at = `messages[${i}]`
    if (!isJsonRecord(m)) throw new TranscriptError(`a message must be an object, got ${jsonTypeName(m)}`, { field: at })
    if (isExit(m)) return
    // a string, or (v2 with multimodal content, or any content part list) parts as OpenAI's
    const blocks = typeof m.content === 'string' ? undefined : chatContentBlocks(m.content, `${at}.content`)
    if (blocks === undefined && typeof m.content !== 'string') {
      throw new TranscriptError('mini-swe-agent message content must be a string or an array of parts', { field: `${at}.content` })
    }
    const content = blocks === undefined ? m.content as string : blocksText(blocks)
    const callId = pending
    pending = undefined
    if (m.role === 'system' && draft.messages.length === 0) system.push(content)
    else if (m.role === 'user' && callId !== undefined) {
      // v1's timeout template; v2 renders an exception of the command (a timeout among them) as <exception> and keeps it in extra
      const exception = isJsonRecord(m.extra) && typeof m.extra.exception_info === 'string' && m.extra.exception_info !== ''
      const isError = exception || /^The last command <command>[\s\S]*?<\/command> timed out/.test(content)
      const result: ToolResultMessage = { role: 'tool', toolCallId: callId, content: blocks ?? [{ type: 'text', text: content }] }
      if (result.content.length === 0) result.content = [{ type: 'text', text: '' }]
      if (isError) result.isError = true
      pushDraft(draft, result, at)
    } else if (m.role === 'user' || m.role === 'system') {
      pushDraft(draft, { role: 'user', content: blocks ?? content }, at)
    } else if (m.role === 'assistant') {
      const found = actionBlocks(content, 2, syntax)
      const recorded = miniRecordedActions(m) // v2: what it ran, whatever the syntax
      const out: Block[] = []
      const command = recorded ? (recorded.length === 1 ? recorded[0] : undefined) : found.length === 1 ? found[0].command : undefined
      if (command !== undefined) {
        const b = found.length === 1 ? found[0] : undefined
        const text = b ? (content.slice(0, b.index) + content.slice(b.end)).trim() : content.trim()
        if (text !== '') out.push({ type: 'text', text })
        pending = `mswea-call-${i}`
        out.push({ type: 'tool-call', id: pending, name: 'bash', arguments: JSON.stringify({ command }) })
        calls++
      } else {
        if (content !== '') out.push({ type: 'text', text: content })
        plain++
      }
      pushDraft(draft, { role: 'assistant', content: out }, at, usageOf(m))
    } else {
      throw new TranscriptError(`unknown role ${JSON.stringify(m.role)}; mini-swe-agent has system, user, assistant, exit`,
        { field: `${at}.role` })
    }
  })
  if (system.length > 0) draft.envelope.system = system.join('\n\n')
  draft.notes.push(`mini-swe-agent has no native tool calls: ${calls} assistant message(s) with exactly one ${syntaxName} action read as ` +
    'a `bash` tool call (block moved out of the text) and the next user message as its result' +
    (plain > 0 ? `; ${plain} with 0 or several actions (format errors, nothing ran) kept as text` : ''))
  exitNote()
  draft.notes.push('envelope.tools unknown: mini-swe-agent sends no tool specs')
  return finishTranscript('mini-swe-agent', draft)
}

// ── swe-agent ──

const isSweAgentStep = (v: unknown): boolean => isJsonRecord(v) && ('action' in v || 'observation' in v || Array.isArray(v.messages))

/**
 * A SWE-agent history as chat messages. Without native tool calls (its thought-action parsers, SWE-agent 0.x
 * and 1.x), an answer (`message_type: "action"` with a string `action`) becomes a `bash` tool call with
 * `{"command": action}` (the fenced action moved out of the text) and the observation after it
 * (`role: "user"`, `message_type: "observation"`) its result, as mini-swe-agent's are read.
 */
function sweAgentToolCalls(history: unknown[]): { list: unknown[]; calls: number } {
  let calls = 0
  const list = history.map((m, i): unknown => {
    if (!isJsonRecord(m) || m.role !== 'user' || m.message_type !== 'observation') return m
    const prev = history[i - 1]
    if (!isJsonRecord(prev) || prev.role !== 'assistant' || typeof prev.action !== 'string' || (Array.isArray(prev.tool_calls) && prev.tool_calls.length > 0)) return m
    return { ...m, role: 'tool', tool_call_id: `swe-call-${i - 1}` }
  })
  list.forEach((m, i) => {
    const next = list[i + 1]
    if (!isJsonRecord(m) || m.role !== 'assistant' || !isJsonRecord(next) || next.tool_call_id !== `swe-call-${i}`) return
    const action = m.action as string, trimmed = action.trim()
    let content = typeof m.content === 'string' ? m.content : ''
    const at = trimmed === '' ? -1 : content.lastIndexOf(trimmed)
    if (at >= 0) { // the action's fence (```, a line before and after it) goes with it; an action not fenced stays in the text
      const open = content.lastIndexOf('\n', at - 2) + 1, close = content.indexOf('\n', at + trimmed.length + 1)
      const fenced = content.startsWith('```', open) && content.slice(at + trimmed.length).trimStart().startsWith('```')
      if (fenced) content = (content.slice(0, open) + content.slice(close < 0 ? content.length : close)).trim()
    }
    calls++
    list[i] = { ...m, content, tool_calls: [{ id: `swe-call-${i}`, type: 'function', function: { name: 'bash', arguments: JSON.stringify({ command: action }) } }] }
  })
  return { list, calls }
}

function readSweAgent(parsed: ParsedTranscript): Transcript {
  const doc = expectJsonDocument(parsed, 'swe-agent')
  if (!isJsonRecord(doc) || (!Array.isArray(doc.history) && !Array.isArray(doc.trajectory))) {
    throw new TranscriptError('a SWE-agent trajectory is a JSON object with a "history" (or "trajectory") array', { field: 'history' })
  }
  const draft = newTranscriptDraft()
  let history: unknown[], path = 'history'
  if (Array.isArray(doc.history)) {
    history = doc.history
    draft.notes.push('read "history" only ("trajectory[].messages" repeats it at every step)')
  } else {
    // no "history" (an older or trimmed file): the last step's messages, else the steps themselves
    const steps = doc.trajectory as unknown[]
    const last = steps[steps.length - 1]
    if (isJsonRecord(last) && Array.isArray(last.messages)) {
      history = last.messages
      path = `trajectory[${steps.length - 1}].messages`
      draft.notes.push(`no "history": read the last step's messages (${path})`)
    } else {
      history = []
      steps.forEach((st, i) => {
        if (!isJsonRecord(st) || (typeof st.action !== 'string' && typeof st.observation !== 'string')) {
          throw new TranscriptError('a trajectory step needs a string "action" or "observation"', { field: `trajectory[${i}]` })
        }
        const said = typeof st.response === 'string' ? st.response : typeof st.thought === 'string' ? st.thought : ''
        history.push({ role: 'assistant', content: said, action: typeof st.action === 'string' ? st.action : '', message_type: 'action' })
        history.push({ role: 'user', content: typeof st.observation === 'string' ? st.observation : '', message_type: 'observation' })
      })
      path = 'trajectory(steps)'
      draft.notes.push(`no "history": rebuilt from the ${steps.length} trajectory steps (response, action, observation); the system prompt and the task are not in them`)
    }
  }
  if (history.length === 0) throw new TranscriptError(`the ${path === 'history' ? 'history' : 'trajectory'} is empty`, { field: path === 'history' ? 'history' : 'trajectory' })
  const { list, calls } = sweAgentToolCalls(history)
  readChatMessages(list, path, draft, () => undefined)
  if (calls > 0) {
    draft.notes.push(`${calls} action(s) without native tool calls read as \`bash\` tool calls (swe-call-<index>), each answered by the observation after it`)
  }
  draft.notes.push('no per-call usage in SWE-agent trajectories; envelope.tools unknown (the file names tool bundles, not specs)')
  return finishTranscript('swe-agent', draft)
}

// ── claude-code ──

function readClaudeCode(parsed: ParsedTranscript, withSidechains: boolean): Transcript {
  const lines = expectJsonl(parsed, 'claude-code')
  const byUuid = new Map<string, JsonlLine>()
  const entries: JsonlLine[] = []
  const skippedTypes = new Map<string, number>()
  for (const l of lines) {
    const v = l.value
    if (typeof v.type !== 'string') {
      throw new TranscriptError('a Claude Code line needs a string "type"', { line: l.line, field: 'type' })
    }
    if (typeof v.uuid === 'string') byUuid.set(v.uuid, l)
    if (v.type === 'user' || v.type === 'assistant') {
      if (!isJsonRecord(v.message)) {
        throw new TranscriptError(`a ${v.type} line needs a "message" object`, { line: l.line, field: 'message' })
      }
      entries.push(l)
    } else skippedTypes.set(v.type, (skippedTypes.get(v.type) ?? 0) + 1)
  }
  // a sidechain line: a session file's isSidechain, or stream-json's parent_tool_use_id (the Task call it runs under)
  const subagentOf = (l: JsonlLine) => (typeof l.value.parent_tool_use_id === 'string' ? l.value.parent_tool_use_id : undefined)
  const isSide = (l: JsonlLine) => l.value.isSidechain === true || subagentOf(l) !== undefined
  const main = entries.filter(l => !isSide(l))
  const side = entries.filter(isSide)
  const notes: string[] = []
  if (skippedTypes.size > 0) {
    notes.push(`skipped non-message lines: ${[...skippedTypes].map(([t, n]) => `${n} ${t}`).join(', ')}`)
  }
  // Sidechain runs: each is rooted at a line without a parent; Task subagents write them.
  const runs = new Map<string, JsonlLine[]>(), roots = new Map<unknown, string>()
  for (const l of side) {
    const task = subagentOf(l)
    const root = task !== undefined ? `task ${task}` : chainRoot(l, byUuid, roots)
    const run = runs.get(root) ?? []
    run.push(l)
    runs.set(root, run)
  }
  let chain = main
  if (entries.length === 0) {
    const only = skippedTypes.size > 0 ? `only ${[...skippedTypes].map(([t, n]) => `${n} ${t}`).join(', ')} line(s)` : 'no lines'
    throw new TranscriptError(`no conversation to replay: no "user" or "assistant" line, ${only}`)
  }
  if (main.length === 0) {
    chain = entries
    notes.push('every line is a sidechain (a subagent file): read the run that ends the file')
  } else if (side.length > 0) {
    notes.push(`${side.length} sidechain line(s) (isSidechain: Task-subagent traffic, ${runs.size} run(s), each with its own ` +
      'context window) ' + (withSidechains ? 'read into `sidechains`, one transcript per run'
      : 'skipped; pass {sidechains: true} to read each run as its own transcript'))
  }
  const transcript = claudeChainTranscript(chain, byUuid)
  transcript.notes.unshift(...notes)
  if (withSidechains && main.length > 0) transcript.sidechains = [...runs.values()].map(run => claudeChainTranscript(run, byUuid))
  return transcript
}

/** The root uuid of a line's chain (for grouping sidechain runs); cycles end the walk. `roots` keeps each walked line's
 *  root, so that every line is walked once (a chain of n lines walked from each line took n² steps: 25 s at 20,000). */
function chainRoot(l: JsonlLine, byUuid: Map<string, JsonlLine>, roots: Map<unknown, string>): string {
  const seen = new Set<unknown>(), path: unknown[] = []
  let cur = l, root: string | undefined
  for (;;) {
    const uuid = cur.value.uuid
    root = uuid === undefined ? undefined : roots.get(uuid)
    if (root !== undefined) break
    seen.add(uuid); path.push(uuid)
    const parent = cur.value.parentUuid
    const next = typeof parent === 'string' ? byUuid.get(parent) : undefined
    if (!next || seen.has(parent)) { root = String(uuid ?? `line ${cur.line}`); break }
    cur = next
  }
  for (const uuid of path) if (uuid !== undefined) roots.set(uuid, root)
  return root
}

/**
 * One chain (main or one sidechain run) → transcript: the path from its last line back to its root
 * through `parentUuid`, across compaction boundaries through `logicalParentUuid`.
 */
function claudeChainTranscript(candidates: JsonlLine[], byUuid: Map<string, JsonlLine>): Transcript {
  const draft = newTranscriptDraft()
  const leaf = candidates[candidates.length - 1]
  let path: JsonlLine[]
  if (candidates.every(l => typeof l.value.uuid === 'string' && 'parentUuid' in l.value)) {
    path = []
    const seen = new Set<string>()
    let boundaries = 0
    for (let cur: JsonlLine | undefined = leaf; cur;) {
      const uuid = cur.value.uuid as string
      if (seen.has(uuid)) {
        throw new TranscriptError(`the parentUuid links form a cycle at ${uuid}`, { line: cur.line, field: 'parentUuid' })
      }
      seen.add(uuid)
      path.push(cur)
      let parent = cur.value.parentUuid
      const boundary = cur.value.subtype === 'compact_boundary' && typeof cur.value.logicalParentUuid === 'string'
      if ((parent === null || parent === undefined) && boundary) {
        parent = cur.value.logicalParentUuid
        boundaries++
      }
      if (typeof parent !== 'string') break
      cur = byUuid.get(parent)
      if (!cur) {
        draft.notes.push(`the chain starts at a line whose parent ${parent} is not in this file (a continued session?)`)
      }
    }
    path.reverse()
    const onPath = new Set(path)
    const off = candidates.filter(l => !onPath.has(l)).length
    if (off > 0) {
      draft.notes.push(`${off} line(s) off the path from the last line back to the root (abandoned branches) skipped`)
    }
    if (boundaries > 0) {
      draft.notes.push(`crossed ${boundaries} Claude Code compaction boundary(ies); their summaries dropped so the raw ` +
        'history is replayed')
    }
  } else {
    path = candidates
    draft.notes.push(candidates.some(l => 'parentUuid' in l.value) ? 'lines without "uuid": read in file order'
      : 'lines without "parentUuid" (Claude Code\'s stream-json output): read in file order')
  }
  // one API response's lines, by message.id; `seen`: its blocks as JSON (a line written twice adds nothing)
  const assistants = new Map<string, { message: AssistantMessage; usageIndex: number; outputTokens: number; requestId?: string; seen: Set<string> }>()
  let compactSummaries = 0, rewritten = 0, reusedIds = 0
  for (const l of path) {
    const v = l.value
    const msg = v.message
    if ((v.type !== 'user' && v.type !== 'assistant') || !isJsonRecord(msg)) continue // e.g. a compaction boundary
    const at = { line: l.line }
    const where = `line ${l.line}`
    if (v.type === 'user') {
      if (v.isCompactSummary === true) { compactSummaries++; continue }
      const content = msg.content
      if (typeof content === 'string') { pushDraft(draft, { role: 'user', content }, where); continue }
      if (!Array.isArray(content)) {
        throw new TranscriptError('user content must be a string or an array of blocks', { ...at, field: 'message.content' })
      }
      const other: Block[] = []
      content.forEach((b, i) => {
        const field = `message.content[${i}]`
        if (!isJsonRecord(b) || typeof b.type !== 'string') {
          throw new TranscriptError('a content block needs a string "type"', { ...at, field })
        }
        if (b.type === 'tool_result') {
          if (typeof b.tool_use_id !== 'string') {
            throw new TranscriptError('a tool_result needs a string "tool_use_id"', { ...at, field: `${field}.tool_use_id` })
          }
          const blocks = chatContentBlocks(b.content, `${field}.content`, at)
          if (blocks.length === 0) blocks.push({ type: 'text', text: '' })
          const result: ToolResultMessage = { role: 'tool', toolCallId: b.tool_use_id, content: blocks }
          if (b.is_error === true) result.isError = true
          pushDraft(draft, result, where)
        } else other.push(chatPartBlock(b, field, at))
      })
      if (other.length > 0) pushDraft(draft, { role: 'user', content: other }, where)
    } else {
      const content = msg.content
      if (!Array.isArray(content)) {
        throw new TranscriptError('assistant content must be an array of blocks', { ...at, field: 'message.content' })
      }
      const blocks = content.map((b, i): Block => {
        const field = `message.content[${i}]`
        if (!isJsonRecord(b) || typeof b.type !== 'string') {
          throw new TranscriptError('a content block needs a string "type"', { ...at, field })
        }
        if (b.type === 'tool_use') {
          if (typeof b.id !== 'string' || typeof b.name !== 'string') {
            throw new TranscriptError('a tool_use needs string "id" and "name"', { ...at, field: `${field}.id` })
          }
          return { type: 'tool-call', id: b.id, name: b.name, arguments: JSON.stringify(b.input ?? {}) }
        }
        if (b.type === 'thinking' && typeof b.thinking === 'string') return { type: 'reasoning', text: b.thinking }
        return chatPartBlock(b, field, at)
      })
      const id = typeof msg.id === 'string' ? msg.id : String(v.uuid ?? `line ${l.line}`)
      const requestId = typeof v.requestId === 'string' && v.requestId !== '' ? v.requestId : undefined
      const usage = claudeUsage(msg.usage)
      const found = assistants.get(id)
      // A line continues the response of its message.id when nothing came between them, or when both name the same
      // requestId; else it is a new response that reuses the id (a gateway or relay that answers every request with one
      // message id merged a whole session into one message).
      const group = found && (draft.messages[draft.messages.length - 1] === found.message ||
        (requestId !== undefined && found.requestId === requestId)) ? found : undefined
      if (group) {
        for (const b of blocks) { // not push(...blocks): a large group overflowed the stack
          const key = JSON.stringify(b)
          if (group.seen.has(key)) { rewritten++; continue } // the same block again: a rewritten line (streaming updates)
          group.seen.add(key)
          group.message.content.push(b)
        }
        // Later lines of one response carry the running output count: keep the largest.
        if (usage && usage.completionTokens >= group.outputTokens) {
          draft.usage[group.usageIndex] = usage
          group.outputTokens = usage.completionTokens
        }
      } else {
        const message: AssistantMessage = { role: 'assistant', content: blocks }
        if (found) reusedIds++
        assistants.set(id, { message, usageIndex: draft.usage.length, outputTokens: usage?.completionTokens ?? -1, requestId, seen: new Set(blocks.map(b => JSON.stringify(b))) })
        pushDraft(draft, message, where, usage)
      }
    }
  }
  if (compactSummaries > 0) {
    draft.notes.push(`dropped ${compactSummaries} compact-summary user message(s) written by Claude Code's own compaction`)
  }
  if (rewritten > 0) draft.notes.push(`skipped ${rewritten} content block(s) written again by a later line of the same response (same message.id)`)
  if (reusedIds > 0) {
    draft.notes.push(`${reusedIds} response(s) reuse an earlier response's message.id after other messages (a gateway's fixed id?): read as responses of their own`)
  }
  draft.notes.push('envelope unknown: Claude Code logs record neither the system prompt nor the tool specs')
  return finishTranscript('claude-code', draft)
}

/** Anthropic usage: prompt = input + cache creation + cache read tokens (all three are billed input). */
function claudeUsage(u: unknown): Usage | undefined {
  if (!isJsonRecord(u) || typeof u.input_tokens !== 'number' || typeof u.output_tokens !== 'number') return undefined
  const created = typeof u.cache_creation_input_tokens === 'number' ? u.cache_creation_input_tokens : 0
  const read = typeof u.cache_read_input_tokens === 'number' ? u.cache_read_input_tokens : 0
  return { promptTokens: u.input_tokens + created + read, completionTokens: u.output_tokens, cachedTokens: read }
}

// ── dsh ──

function readDshLog(parsed: ParsedTranscript): Transcript {
  const lines = expectJsonl(parsed, 'dsh')
  const draft = newTranscriptDraft()
  let header: string | undefined
  let headerChanges = 0
  let replaced = 0
  let contextWindow: number | undefined
  let turnOpen = false // a turn/start with no surface message after it yet
  const opensTurn = new Set<Message>()
  for (const [index, l] of lines.entries()) {
    const v = l.value
    if (!isDshEvent(v) || typeof v.time !== 'number') {
      const field = typeof v.seq !== 'number' ? 'seq' : typeof v.type !== 'string' ? 'type' : typeof v.time !== 'number' ? 'time' : 'data'
      throw new TranscriptError('a dsh log line is an event {seq: number, type: string, time: number, data: object}',
        { line: l.line, field })
    }
    // One rule with resume: the check a store applies to each line it loads (contiguous seqs from 0),
    // so that replay never reports on a log that dsh itself refuses to open (docs/design.md §13).
    const problem = eventShapeProblem(v, index)
    if (problem) throw new TranscriptError(`${problem}; dsh would not resume this log either: replay the part before this line (head -n ${l.line - 1})`, { line: l.line, field: 'seq' })
    const data = v.data as TranscriptRecord
    const type = v.type as string
    if (type === 'request/header') {
      const envelope: Envelope = {}
      if (typeof data.system === 'string') envelope.system = data.system
      if (data.tools !== undefined && data.tools !== null) envelope.tools = readToolSpecs(data.tools, 'data.tools', l.line)
      const key = JSON.stringify(envelope)
      if (header === undefined) { header = key; draft.envelope = envelope } else if (key !== header) headerChanges++
      if (contextWindow === undefined && Number.isSafeInteger(data.contextWindow) && (data.contextWindow as number) > 0) contextWindow = data.contextWindow as number
      continue
    }
    if (type === 'turn/start') { turnOpen = true; continue }
    const role = SURFACE_TYPES[type]
    if (role === undefined) continue
    const op = isJsonRecord(data.surfaceOp) ? data.surfaceOp.op : isJsonRecord(v.surfaceOp) ? v.surfaceOp.op : undefined
    if (op !== 'append') { replaced++; continue }
    const m = data.message
    if (!isJsonRecord(m) || m.role !== role) {
      throw new TranscriptError(`a ${type} event needs data.message with role "${role}"`,
        { line: l.line, field: 'data.message.role' })
    }
    const contentOk = Array.isArray(m.content) || (role === 'user' && typeof m.content === 'string')
    if (!contentOk) {
      throw new TranscriptError(`data.message.content must be ${role === 'user' ? 'a string or ' : ''}an array of blocks`,
        { line: l.line, field: 'data.message.content' })
    }
    if (role === 'tool' && typeof m.toolCallId !== 'string') {
      throw new TranscriptError('a tool result needs a string toolCallId', { line: l.line, field: 'data.message.toolCallId' })
    }
    const u = data.usage
    const usage = isJsonRecord(u) && typeof u.promptTokens === 'number' && typeof u.completionTokens === 'number'
      ? u as unknown as Usage : undefined
    if (role === 'user' && turnOpen) opensTurn.add(m as unknown as Message)
    turnOpen = false
    pushDraft(draft, m as unknown as Message, `line ${l.line}`, usage)
  }
  if (replaced > 0) {
    draft.notes.push(`skipped ${replaced} replace event(s) (prunes and summaries of the recorded session): the history ` +
      'is replayed as first written')
  }
  if (headerChanges > 0) {
    draft.notes.push(`the request envelope changed ${headerChanges} time(s); the first one is used`)
  }
  const transcript = finishTranscript('dsh', draft)
  // The pairing pass keeps user messages as the same objects, so identity finds them again.
  transcript.turnStarts = transcript.messages.flatMap((m, i) => (opensTurn.has(m) ? [i] : []))
  if (contextWindow !== undefined) transcript.contextWindow = contextWindow
  return transcript
}

/** The largest transcript file replay reads: JSON.parse of one takes several times its size in heap,
 *  and the engine's longest string is 512 MiB. */
const REPLAY_MAX_FILE_BYTES = 268_435_456 // 256 MiB

/**
 * A transcript file's text, for the CLI (the readers above take text). Opened without blocking and
 * checked on the open handle: a FIFO, a device (`/dev/zero`) or a directory is refused instead of
 * waited on or read without end, and so is a file over {@link REPLAY_MAX_FILE_BYTES}.
 * @throws {Error} saying which, with the size and the limit.
 */
async function readTranscriptFile(fs: typeof import('node:fs/promises'), path: string): Promise<string> {
  const handle = await fs.open(path, fs.constants.O_RDONLY | fs.constants.O_NONBLOCK)
  try {
    const st = await handle.stat()
    if (!st.isFile()) {
      const kind = st.isFIFO() ? 'a FIFO' : st.isDirectory() ? 'a directory' : st.isCharacterDevice() || st.isBlockDevice() ? 'a device' : 'a socket'
      throw new Error(`it is ${kind}, not a regular file; give the transcript file itself`)
    }
    if (st.size > REPLAY_MAX_FILE_BYTES) {
      throw new Error(`it is ${st.size} bytes; replay reads transcripts of at most ${REPLAY_MAX_FILE_BYTES} bytes (256 MiB): split it, or replay one session of it`)
    }
    return await handle.readFile('utf8')
  } finally { await handle.close() }
}

// ── 10.2 Replay runner: a transcript through the real Agent, offline (docs/design.md §8) ──
// Web-standard like the readers: it takes a Transcript (or the file's text); the CLI reads files.
// Replay IS an Agent: a recorded provider answers each step with the transcript's assistant message,
// recorded tools answer each call with the transcript's result, and the report is read off the
// Agent's events. Turns, steps, steering, spill and the ladder are the loop's own; nothing here
// re-implements them. To add a figure (a column), see REPLAY_FIGURES; a new `compaction/*` event
// type is a rung of its own without any change here.

/**
 * What the ladder did at one check: the name of the last rung taken (`prune`, `compact` — the
 * `compaction/summary` rung —, or the suffix of any other `compaction/*` event type, e.g. `clear`),
 * `none`, or `failed` (the ladder logged `compaction/warning`, still over the threshold, and changed nothing).
 */
export type ReplayRung = 'none' | 'prune' | 'compact' | 'failed' | (string & {})

/**
 * One thing the replay did to the surface, read off the log. Token figures are dsh's heuristic (docs/design.md §2):
 * - `spill`: a tool result over the spill limit (UTF-8 `bytes`) replaced at write time by a preview;
 * - `prune` / `clear`: the surface node at `seq` (a tool result; `role` names an assistant or user
 *   message) replaced by that rung — cut to head + tail, or a placeholder — priced before → after;
 * - `compaction`: `messages` surface messages (seqs `firstSeq`..`lastSeq`, priced `tokensBefore`)
 *   replaced by a checkpoint priced `tokensAfter`; `totalBefore`/`totalAfter` are the request totals;
 * - `compaction-failed`: a summary transaction that committed nothing, with its error;
 * - `rung`: any other ladder event (`compaction/<rung>`): its `seq` and `data` as logged, and, for a
 *   rung that replaces one node (`shadowedSeqs: [seq]` then the replace), that node's price before → after.
 * Any rung logged as `compaction/<rung> {shadowedSeqs: [seq], shadowedTokenCount}` followed by the
 * replace of `seq` is paired the same way, whatever its name.
 */
export type ReplayEvent =
  | { type: 'spill'; seq: number; bytes: number; tokensBefore: number; tokensAfter: number }
  | { type: 'prune' | 'clear'; seq: number; tokensBefore: number; tokensAfter: number; role?: 'assistant' | 'user' }
  | { type: 'compaction'; id: string; messages: number; firstSeq: number; lastSeq: number; tokensBefore: number; tokensAfter: number; totalBefore: number; totalAfter: number }
  | { type: 'compaction-failed'; id: string; error: string }
  | { type: 'rung'; rung: string; seq: number; data: Record<string, unknown>; tokensBefore?: number; tokensAfter?: number }

/**
 * One row of a replay: a pressure check, at a turn start (`kind: 'turn-start'`, after the user input
 * is appended) or after a step (`kind: 'step'`, after its assistant message, tool results and any
 * steering). Tokens are dsh's §2 estimate unless named calibrated: those are in the transcript's own
 * tokens (docs/design.md §15), offset + ratio × the estimate, fitted on the prompt tokens the file
 * records for this step and the ones before it (the §2 estimate itself where it records none).
 * - `step`: 1-based over the whole transcript (one per assistant message); on a turn-start row, the
 *   number of the step that follows. `turn`: 1-based.
 * - `requestTokens` (steps): the request the loop sent for this step, by the §2 estimate — what dsh
 *   would have sent; `calibratedRequestTokens`: the same, calibrated. `unmanagedTokens` (and
 *   `calibratedUnmanagedTokens`): the same point with no management (envelope + every message so
 *   far, as recorded). `recordedPromptTokens`: the prompt tokens the original run reported for this
 *   call, when the file has them (what the calibration is fitted on).
 * - `beforeTokens` → `afterTokens`: the ladder's measured total around the rung (calibrated, as
 *   every ladder decision is); `reclaimedTokens` = their difference. `prunes`/`prunedTokens`: prune events and tokens they reclaimed; `summaryCalls`:
 *   summary requests made; `events`: spills, prunes, compactions and other rungs in order;
 *   `warnings`: ladder warnings.
 * - `figures`: the values of the extra figures ({@link REPLAY_FIGURES}, {@link ReplayOptions.figures}),
 *   by name; present only when there are any.
 */
export interface ReplayStep {
  kind: 'turn-start' | 'step'
  step: number
  turn: number
  requestTokens?: number
  calibratedRequestTokens?: number
  unmanagedTokens: number
  calibratedUnmanagedTokens?: number
  recordedPromptTokens?: number
  beforeTokens: number
  rung: ReplayRung
  afterTokens: number
  reclaimedTokens: number
  prunes: number
  prunedTokens: number
  summaryCalls: number
  events: ReplayEvent[]
  warnings: string[]
  figures?: Record<string, number>
}

/**
 * Totals of a replay (tokens unless named otherwise).
 * - `peakRequestTokens` / `peakPercent`: the largest step request, and its share of the window (%, one decimal).
 * - `requestsOverWindow`: step requests larger than the window with dsh managing the context, by the
 *   §2 estimate; `calibratedRequestsOverWindow`: by their calibrated size; `unmanagedStepsOverWindow`
 *   (`calibratedUnmanagedStepsOverWindow`): steps whose unmanaged request would have been larger.
 * - `calibration`: the final fit, `offsetTokens + ratio × estimate` over `samples` recorded steps
 *   (`{ratio: 1, offsetTokens: 0, samples: 0}` when the file records no prompt tokens).
 * - `summaryRequestsOverWindow`: summary requests larger than the summarizer's window (by §2).
 * - `resultsOverPruneThreshold`: tool results of the transcript over the prune threshold (code points).
 * - `rungs`: how many times each rung acted (rung name → events), e.g. `{prune: 4, compact: 1}`;
 *   `rungReclaimedTokens`: tokens each rung that replaces single nodes took off (e.g. `{prune: 5454}`).
 * - `figures`: each extra figure totalled as it says (`sum` or `max`); present only when there are any.
 */
export interface ReplayTotals {
  steps: number
  turns: number
  peakRequestTokens: number
  peakPercent: number
  prunes: number
  prunedTokens: number
  spills: number
  compactions: number
  failedCompactions: number
  summaryCalls: number
  requestsOverWindow: number
  calibratedRequestsOverWindow: number
  peakCalibratedRequestTokens: number
  unmanagedStepsOverWindow: number
  calibratedUnmanagedStepsOverWindow: number
  peakUnmanagedTokens: number
  calibration: { ratio: number; offsetTokens: number; samples: number }
  peakRecordedPromptTokens?: number
  peakSummaryRequestTokens: number
  summaryRequestsOverWindow: number
  resultsOverPruneThreshold: number
  /** Ladder warnings (their texts are in {@link ReplayReport.warnings}). */
  ladderWarnings: number
  /**
   * What the session would cost (docs/design.md §11), priced by {@link ReplayReport.prices} with
   * modelled cache hits and no model called: under dsh's policy (every request the replay made,
   * summaries included) and with no management in an infinite window (appends only: the floor).
   * `calibrated` (when the file records prompt tokens): the same requests in the transcript's tokens,
   * priced with the final fit: input and cache hit `offset + ratio × estimate` (the hidden prompt
   * leads every request, so a hit keeps it), output `ratio × estimate`, off-peak.
   */
  cost: { dsh: ReplayCost; unmanaged: ReplayCost; calibrated?: { dsh: ReplayCost; unmanaged: ReplayCost } }
  rungs: Record<string, number>
  rungReclaimedTokens: Record<string, number>
  figures?: Record<string, number>
}

/**
 * One policy's cost in a replay: requests (conversation and summary), input tokens and the share
 * served from the prompt cache (modelled, tokens by the meter), output tokens, and USD.
 */
export interface ReplayCost {
  requests: number
  summaryRequests: number
  inputTokens: number
  cachedInputTokens: number
  /** cached ÷ input, 0 … 1. */
  cacheHitShare: number
  outputTokens: number
  /** USD; undefined when the prices are unknown. */
  costUSD?: number
}

/** One request as the cost model sees it: heuristic input, modelled hit and output (tokens). */
type PricedRequest = RequestCache & { outputTokens: number }

/** `requests` priced in the transcript's tokens (see {@link ReplayTotals.cost}). */
function calibratedCost(
  requests: readonly PricedRequest[], summaryRequests: number, fit: ReplayTotals['calibration'], prices: Prices,
): ReplayCost {
  let input = 0, cached = 0, output = 0, usd = 0
  const calibrated = (tokens: number) => fit.offsetTokens + Math.ceil(tokens * fit.ratio)
  for (const r of requests) {
    const i = calibrated(r.inputTokens), h = r.modelledHitTokens > 0 ? Math.min(i, calibrated(r.modelledHitTokens)) : 0
    const o = Math.ceil(r.outputTokens * fit.ratio)
    input += i; cached += h; output += o
    usd += requestCostUSD(prices, { cachedInputTokens: h, uncachedInputTokens: i - h, outputTokens: o }, 0)
  }
  return {
    requests: requests.length, summaryRequests, inputTokens: input, cachedInputTokens: cached,
    cacheHitShare: input > 0 ? cached / input : 0, outputTokens: output, costUSD: usd,
  }
}

const replayCost = (u: SessionUsage): ReplayCost => ({
  requests: u.requests, summaryRequests: u.summary.requests, inputTokens: u.inputTokens, cachedInputTokens: u.cachedInputTokens,
  cacheHitShare: u.cacheHitShare, outputTokens: u.outputTokens, ...(u.costUSD !== undefined ? { costUSD: u.costUSD } : {}),
})

/** The prices replay totals use unless told otherwise: deepseek-flash without peak hours (a replay has no time of day). */
export const REPLAY_PRICES: Readonly<Prices> = /* @__PURE__ */ Object.freeze({ cacheHitInput: 0.003, cacheMissInput: 0.15, output: 0.6 })

/**
 * A transcript fed into a fresh {@link Session} as a client without any context management sends
 * it (the floor of docs/design.md §11: appends only, an infinite window): one request per
 * assistant message, carrying the surface before it. `beforeRequest(session, step)` (0-based
 * step) may edit the surface first, e.g. to model another policy. Price it with `usage({prices})`.
 */
export function unmanagedSession(transcript: Transcript, beforeRequest?: (session: Session, step: number) => void): Session {
  const s = new Session()
  s.append('session/start', { id: `unmanaged-${transcript.format}`, version: VERSION })
  logHeader(s, { model: `recorded-${transcript.format}`, baseURL: 'replay://transcript', system: transcript.envelope.system, tools: transcript.envelope.tools })
  let step = 0
  // Call ids as the loop repairs them (missing or repeated ids renamed), results matched to the
  // recorded calls by position, as replayTranscript does.
  // Each lookup is O(1) (a queue per recorded id), so that a message of many calls stays linear.
  let idOf = new Map<string, { ids: string[]; next: number }>()
  for (const m of transcript.messages) {
    if (m.role === 'assistant') {
      beforeRequest?.(s, step++)
      const sent = withCallIds(m, s.seq, s)
      const recorded = m.content.filter((b) => b.type === 'tool-call') as ToolCallBlock[]
      const logged = sent.content.filter((b) => b.type === 'tool-call') as ToolCallBlock[]
      idOf = new Map()
      recorded.forEach((c, k) => {
        const queue = idOf.get(c.id)
        if (queue) queue.ids.push(logged[k].id); else idOf.set(c.id, { ids: [logged[k].id], next: 0 })
      })
      s.append('assistant/message', { message: sent, finishReason: 'replay', surfaceOp: { op: 'append' } })
    } else if (m.role === 'tool') {
      const queue = idOf.get(m.toolCallId)
      const id = queue && queue.next < queue.ids.length ? queue.ids[queue.next++] : m.toolCallId
      if (stateOf(s).openCalls.has(id)) s.append('tool/result', { message: id === m.toolCallId ? m : { ...m, toolCallId: id }, surfaceOp: { op: 'append' } })
    } else s.append('user/message', { message: m, surfaceOp: { op: 'append' } })
  }
  return s
}

/** The outcome of {@link replayTranscript}: the settings used, one row per pressure check, totals. */
export interface ReplayReport {
  format: TranscriptFormat
  messages: { user: number; assistant: number; tool: number }
  /** Tokens. */
  contextWindow: number
  thresholdRatio: number
  /** `floor(contextWindow × thresholdRatio)`, tokens. */
  thresholdTokens: number
  /** `{simulated: true, tokens}` (fixed-size summaries, no model) or the model that wrote them. */
  summaries: { simulated: true; tokens: number } | { simulated: false; model: string }
  /** The prices of `totals.cost` (USD per million tokens). */
  prices: Prices
  rows: ReplayStep[]
  totals: ReplayTotals
  /** The reader's notes on the transcript (skipped, synthesised, renamed), then the replay's own. */
  notes: string[]
  warnings: string[]
}

/** What a {@link ReplayFigure} sees besides the event: the replay's session and the step's request. */
export interface ReplayFigureContext {
  /** The replay's session (read it, do not append). */
  session: Session
  /** Context window of the replay, tokens. */
  contextWindow: number
  /** The request the loop sent for the current step (absent on a turn-start row). */
  request?: ChatRequest
  /** The usage the transcript records for the current step, when it has one (tokens). */
  recordedUsage?: Usage
}

/**
 * An extra figure of the replay report, computed from the Agent's events of each row: `add` is
 * called with every event of the row in order (log events, the recorded usage as a `stream` `usage`
 * event, warnings), starting from 0, and returns the new value. Rows carry it in `figures[name]`,
 * the totals combine rows by `total`, and with `cell` it is a column of the text table (header `name`).
 */
export interface ReplayFigure {
  name: string
  add(event: AgentEvent, value: number, context: ReplayFigureContext): number
  total: 'sum' | 'max'
  cell?: (value: number) => string
  /** True: no totals line of its own (a combined line shows it, e.g. the fidelity line). */
  hideTotal?: boolean
}

const FIDELITY_KINDS: ReadonlyArray<[keyof Fidelity, string]> = [['paths', 'paths'], ['commands', 'commands'], ['errors', 'error lines'], ['userMessages', 'user messages']]
const FIDELITY_COUNTS: ReadonlyArray<[keyof FidelityShare, string]> = [['total', 'total'], ['inCheckpoint', 'in checkpoint'], ['inSummary', 'in summary']]

const fidelityFigure = (kind: keyof Fidelity, count: keyof FidelityShare, name: string): ReplayFigure => ({
  name, total: 'sum', hideTotal: true,
  add: (e, v) => (e.type === 'log' && e.event.type === 'compaction/summary'
    ? v + (((e.event.data as { fidelity?: Fidelity }).fidelity)?.[kind]?.[count] ?? 0) : v),
})

/**
 * The fidelity figures of the compactions (docs/design.md §12), summed over the rows: for each kind
 * (paths, commands, error lines, user messages) how many the compacted regions held, how many
 * are in the checkpoints (a user message cut to head + tail with its recall key counts, and is
 * counted again in `fidelity user messages pruned`), and how many in the model's summaries alone.
 * Named `fidelity <kind> <count>`; JSON per row, one combined totals line in the text report. The
 * CLI's `replay` passes them ({@link ReplayOptions.figures}); a library replay adds them when asked.
 */
export const FIDELITY_FIGURES: readonly ReplayFigure[] = /* @__PURE__ */ (() => [ // a call: a bundle without replay drops it
  ...FIDELITY_KINDS.flatMap(([kind, label]) => FIDELITY_COUNTS.map(([count, countLabel]) =>
    fidelityFigure(kind, count, `fidelity ${label} ${countLabel}`))),
  fidelityFigure('userMessages', 'pruned', 'fidelity user messages pruned'),
])()

/**
 * The totals line of {@link FIDELITY_FIGURES}: `in checkpoints: paths 12/12, …; in the summaries alone: 1/12, …`,
 * or undefined without compactions.
 */
function fidelityTotalsLine(figures: Readonly<Record<string, number>>): string | undefined {
  const get = (label: string, count: string) => figures[`fidelity ${label} ${count}`] ?? 0
  if (FIDELITY_KINDS.every(([, label]) => get(label, 'total') === 0)) return undefined
  const pruned = figures['fidelity user messages pruned'] ?? 0
  const kept = FIDELITY_KINDS.map(([, l]) => `${l} ${get(l, 'in checkpoint')}/${get(l, 'total')}`).join(', ')
  const cut = pruned > 0 ? ` (${pruned} user message(s) cut to head + tail with their recall key)` : ''
  const alone = FIDELITY_KINDS.map(([, l]) => `${get(l, 'in summary')}/${get(l, 'total')}`).join(', ')
  return `in checkpoints: ${kept}${cut}; in the summaries alone: ${alone}`
}

/** A shell command that only prints one file (`cat F`, `sed -n 1,80p F`, `head -n 50 F`, `tail F`): group 2 is F. */
const SHELL_READ = /^\s*(?:cat|head|tail|nl|less|more|sed\s+-n\s+(?:'[^']*'|"[^"]*"|\S+))(?:\s+-{1,2}[\w-]+(?:[\s=]\d+)?)*\s+(['"]?)([^\s|;&<>'"]+)\1\s*$/

/**
 * What a tool call asks for, for {@link REREADS_FIGURE}: a shell read of one file is `read F` (whichever
 * command prints it); any other call is its tool name and its arguments, whitespace folded.
 */
function callIdentity(call: ToolCallBlock): string {
  let command: unknown
  try { const args = JSON.parse(call.arguments); command = args?.command ?? args?.cmd } catch { command = undefined }
  const read = typeof command === 'string' ? SHELL_READ.exec(command) : null
  return read ? `read ${read[2]}` : `${call.name} ${call.arguments.replace(/\s+/g, ' ').trim()}`
}

/** Per replay session: call id → identity, surface seq → identity + output hash, and what checkpoints replaced. */
type RereadState = { calls: Map<string, string>; results: Map<number, string>; compacted: Set<string> }
const rereadState = new WeakMap<Session, RereadState>()

/**
 * `rereads` (docs/design.md §15): tool calls after a compaction that repeat a call whose result a
 * checkpoint replaced — the same call ({@link callIdentity}) — and get the same output back (by hash):
 * work the checkpoint made the model redo. Counted once per replaced result (a repeat brings it back).
 */
const REREADS_FIGURE: ReplayFigure = {
  name: 'rereads', total: 'sum', cell: (v) => String(v),
  add(e, v, { session }) {
    if (e.type !== 'log') return v
    let state = rereadState.get(session)
    if (!state) rereadState.set(session, state = { calls: new Map(), results: new Map(), compacted: new Set() })
    const d = e.event.data as { message?: Message; surfaceOp?: SurfaceOp; shadowedSeqs?: number[] }
    if (e.event.type === 'assistant/message' && d.surfaceOp?.op === 'append') {
      for (const c of toolCalls(d.message!)) state.calls.set(c.id, callIdentity(c))
    } else if (e.event.type === 'tool/result' && d.surfaceOp?.op === 'replace') {
      const was = state.results.get(d.surfaceOp.start) // a prune or clear: the same original
      if (was !== undefined) state.results.set(e.event.seq, was)
    } else if (e.event.type === 'tool/result' && d.message?.role === 'tool') {
      const r = d.message
      const output = `${r.isError ? 1 : 0}${fingerprintOf(contentText(r.content, '\n'))}`
      const key = `${state.calls.get(r.toolCallId) ?? r.toolCallId}\u0000${output}`
      state.results.set(e.event.seq, key)
      if (state.compacted.delete(key)) return v + 1
    } else if (e.event.type === 'compaction/summary') {
      for (const seq of d.shadowedSeqs ?? []) {
        const key = state.results.get(seq)
        if (key !== undefined) state.compacted.add(key)
      }
    }
    return v
  },
}

/**
 * Figures every replay computes besides the built-in ones (see {@link ReplayFigure}); add an entry
 * here to give the report a column or a totals line. The CLI adds {@link FIDELITY_FIGURES}.
 */
export const REPLAY_FIGURES: readonly ReplayFigure[] = [REREADS_FIGURE]

/** Options of {@link replayTranscript}. */
export interface ReplayOptions {
  /** Context window to replay at, tokens (positive integer). Default: the transcript's (dsh logs), else the summarizer's. */
  contextWindow?: number
  /** Pressure threshold as a share of the window, 0 < r ≤ 1. Default 0.8 (docs/design.md §5). */
  thresholdRatio?: number
  /** Size of each simulated summary, tokens by the §2 estimate. Default 2,000. Ignored with `summarizer`. */
  summaryTokens?: number
  /** A real model to write the summaries (the CLI passes one with --base-url/--model or a key). */
  summarizer?: Provider
  /** Ladder settings to replay with (default {@link DEFAULT_COMPACTION_CONFIG}; `thresholdRatio` above wins when given). */
  compaction?: Partial<CompactionConfig>
  /** Prices for the cost totals (default {@link REPLAY_PRICES}: deepseek-flash, off-peak). */
  prices?: Prices
  signal?: AbortSignal
  /** Called with each row as it is made, with the replay's session (read it, do not append). */
  onStep?: (step: ReplayStep, session: Session) => void
  /** Called with every event of the replay's Agent (log events, stream events, warnings). */
  onEvent?: (event: AgentEvent) => void
  /** Extra figures, after {@link REPLAY_FIGURES}. Names must be unique. */
  figures?: readonly ReplayFigure[]
  /**
   * Offer the `recall` tool as the Agent does once content is shadowed (default false: a recorded
   * model never calls it; true prices its spec into every later request, as a live session would).
   */
  recall?: boolean
}

/** Default size of a simulated summary, tokens (the CLI's `--summary-tokens`, default 2,000). */
export const DEFAULT_REPLAY_SUMMARY_TOKENS = 2000

/**
 * A text of exactly `tokens` tokens by the §2 estimate (`4 × tokens` UTF-16 units, no outer
 * whitespace, since `summarise` trims what the model returns).
 */
function simulatedSummaryText(tokens: number, messages: number): string {
  const head = `[simulated checkpoint of ${messages} message(s): fixed size, no model was called] `
  const chars = tokens * UNITS_PER_TOKEN
  let text = head
  while (text.length < chars) text += 'summary text '
  text = text.slice(0, chars)
  return text.replace(/\s/g, (c, i: number) => (i === 0 || i === chars - 1 ? '.' : c))
}

/**
 * A Provider that answers every summary request with a fixed-size text (no network): `tokens`, or the
 * request's `maxTokens` when that is smaller (finish reason `length`), as a server never answers past it.
 */
function simulatedSummarizer(tokens: number, contextWindow: number): Provider {
  return {
    model: 'simulated-summarizer', baseURL: 'replay://simulated', contextWindow, maxTokens: tokens,
    async complete(request: ChatRequest): Promise<ChatResponse> {
      const capped = request.maxTokens !== undefined && request.maxTokens < tokens
      const size = capped ? Math.max(1, Math.floor(request.maxTokens!)) : tokens
      const text = simulatedSummaryText(size, request.messages.length)
      return { message: { role: 'assistant', content: [{ type: 'text', text }] }, finishReason: capped ? 'length' : 'stop' }
    },
  }
}

const countRoles = (messages: readonly Message[]) => {
  const n = { user: 0, assistant: 0, tool: 0 }
  for (const m of messages) n[m.role]++
  return n
}

/** Code points of a tool result's text blocks, counted only up to `limit + 1`. */
function resultCodePoints(m: ToolResultMessage, limit: number): number {
  let n = 0
  for (const b of m.content) if (b.type === 'text') { n += codePointLength((b as TextBlock).text, limit - n); if (n > limit) break }
  return n
}

function replayPositiveInteger(name: string, value: unknown, fix: string): number {
  if (!Number.isSafeInteger(value) || (value as number) <= 0) throw new RangeError(`replay: ${name} must be a positive integer number of tokens, got ${String(value)}; ${fix}`)
  return value as number
}

/** One step of a transcript as the recorded provider and tools answer it. */
interface ReplayScriptStep {
  message: AssistantMessage
  usage?: Usage
  /** The recorded results of the message's tool calls, in call order. */
  results: ToolResultMessage[]
  /** User messages after this step's results: steering, queued while the step is answered. */
  steerAfter: UserMessage[]
}

/**
 * One turn: the input `Agent.run` gets, steering queued before it, and the steps the transcript
 * records. `synthetic`: the input is not the transcript's (it opens with an assistant message).
 */
interface ReplayScriptTurn { input: UserMessage; synthetic?: boolean; steerBefore: UserMessage[]; steps: ReplayScriptStep[] }

/**
 * Cuts a transcript into the turns the loop would run. A user message opens a turn where the loop
 * would be idle: at the start, and after a step that called no tool and was not steered — or,
 * when the transcript records turn starts (dsh logs), exactly there. Any other user message is
 * steering: before the turn's first step, or after the results of the step it follows.
 */
function replayScript(transcript: Transcript, notes: string[]): ReplayScriptTurn[] {
  const turns: ReplayScriptTurn[] = []
  const starts = transcript.turnStarts ? new Set(transcript.turnStarts) : undefined
  let assistants = 0
  transcript.messages.forEach((m, i) => {
    const turn = turns.at(-1)
    const step = turn?.steps.at(-1)
    if (m.role === 'user') {
      const idle = !turn || (starts ? starts.has(i) : step !== undefined && !step.message.content.some((b) => b.type === 'tool-call') && step.steerAfter.length === 0)
      if (idle) turns.push({ input: m, steerBefore: [], steps: [] })
      else if (step) step.steerAfter.push(m)
      else turn!.steerBefore.push(m)
    } else if (m.role === 'assistant') {
      if (!turn) {
        turns.push({ input: { role: 'user', content: '' }, synthetic: true, steerBefore: [], steps: [] })
        notes.push('the transcript opens with an assistant message: replay opened the first turn with an empty user input')
      }
      turns.at(-1)!.steps.push({ message: m, usage: transcript.usage[assistants++], results: [], steerAfter: [] })
    } else step?.results.push(m) // the pairing pass put every result right after its step
  })
  return turns
}

/**
 * An Agent whose envelope is the transcript's (system prompt and tool specs as recorded, even where
 * the file records no specs for the tools it calls), plus any tool the Agent offers of itself beyond
 * the recorded ones (as a live run would send it).
 */
class ReplayAgent extends Agent {
  readonly recordedEnvelope: Envelope
  private readonly recordedToolNames: ReadonlySet<string>
  constructor(options: AgentOptions, envelope: Envelope) {
    super(options)
    this.recordedEnvelope = envelope
    this.recordedToolNames = new Set((options.tools ?? []).map((t) => t.name))
  }
  private extended?: { own: readonly ToolSpec[]; envelope: Envelope }
  override get envelope(): Envelope {
    const own = (super.envelope.tools ?? []).filter((t) => !this.recordedToolNames.has(t.name))
    if (own.length === 0) return this.recordedEnvelope
    // One object per tool set, as the Agent keeps its own (the adapter serialises the tools once per object).
    if (this.extended?.own.length !== own.length || this.extended.own.some((t, i) => t.name !== own[i].name)) {
      this.extended = { own, envelope: { system: this.recordedEnvelope.system, tools: [...(this.recordedEnvelope.tools ?? []), ...own] } }
    }
    return this.extended.envelope
  }
}

/** A row while its events arrive. */
interface OpenReplayRow {
  kind: ReplayStep['kind']
  step: number
  turn: number
  requestTokens?: number
  calibratedRequestTokens?: number
  unmanagedTokens?: number
  calibratedUnmanagedTokens?: number
  recordedPromptTokens?: number
  beforeTokens?: number
  hasMessage: boolean
  rung?: string
  ladderWarned: boolean
  summaryCalls: number
  events: ReplayEvent[]
  warnings: string[]
  figures: number[]
  context: ReplayFigureContext
}

/** The rung a `compaction/*` event type names; undefined for the ladder's bookkeeping events. */
function rungOfEvent(type: string): string | undefined {
  if (!type.startsWith('compaction/')) return undefined
  const name = type.slice('compaction/'.length)
  if (name === 'start' || name === 'end' || name === 'warning') return undefined
  return name === 'summary' ? 'compact' : name
}

/**
 * Replays a transcript offline through the real {@link Agent} (docs/design.md §8): a fresh
 * {@link Session} ({@link MemoryStore}), the transcript's envelope, a recorded provider that answers
 * each step with the transcript's assistant message (and streams its recorded usage as a `usage`
 * event, never as the response's usage: the transcript's counts describe the original, unmanaged
 * prompts, not dsh's, so they never anchor the meter; each recorded prompt count is logged instead
 * as a calibration sample of dsh's estimate of that unmanaged prompt, and the session fits offset +
 * ratio from the steps so far, docs/design.md §15), and recorded tools that answer each call with the
 * transcript's result. The loop does the rest as in a live session: turn starts and the pinned
 * input, steering, spill at write time, the ladder's pressure checks at the turn start and after
 * every step. Turns are cut where the loop would be idle (see the readers' `turnStarts` for dsh
 * logs); a turn the transcript ends while the loop would go on (its last step called tools) ends
 * as cancelled. The rows are read off the Agent's events.
 * Without `summarizer`, summaries are simulated at exactly `summaryTokens` tokens each.
 * @throws {RangeError} for a missing or bad `contextWindow`, `thresholdRatio`, `summaryTokens` or
 *   figure names (the message names the value and the fix); {@link ConfigError} for options that are not a plain
 *   object or an option whose getter throws, and for a bad or removed `compaction` key, as `new Agent` gives.
 *   Cancellation through `signal` rejects with its reason.
 */
export async function replayTranscript(transcript: Transcript, given: ReplayOptions = {}): Promise<ReplayReport> {
  // each option read once, as new Agent reads its own: a getter that throws or another kind of object is a ConfigError
  const options = Object.fromEntries(plainFields('replay: options', given, 'a plain object of options', ConfigError)) as
    ReplayOptions
  const windowGiven = options.contextWindow ?? transcript.contextWindow ?? options.summarizer?.contextWindow
  if (windowGiven === undefined) throw new RangeError(`replay: this ${transcript.format} file does not say its context window; pass contextWindow (CLI: --context-window N, e.g. 128000)`)
  const window = replayPositiveInteger('contextWindow', windowGiven, 'pass contextWindow (CLI: --context-window N)')
  // read like new Agent's (a removed or bad key is a ConfigError); thresholdRatio, when given, wins over its own
  const { auto, clear, thresholdRatio: ladderRatio } = resolveCompactionConfig(options.compaction)
  const thresholdRatio = options.thresholdRatio ?? ladderRatio
  if (typeof thresholdRatio !== 'number' || !(thresholdRatio > 0 && thresholdRatio <= 1)) {
    throw new RangeError(`replay: thresholdRatio must be a number in (0, 1], got ${String(thresholdRatio)}; e.g. 0.8 (CLI: --threshold 0.8)`)
  }
  const summaryTokens = replayPositiveInteger('summaryTokens', options.summaryTokens ?? DEFAULT_REPLAY_SUMMARY_TOKENS, 'e.g. 2000 (CLI: --summary-tokens N)')
  const figures = [...REPLAY_FIGURES, ...(options.figures ?? [])]
  const figureNames = new Set<string>()
  for (const f of figures) {
    if (typeof f?.name !== 'string' || f.name === '' || figureNames.has(f.name)) throw new RangeError(`replay: every figure needs a unique non-empty name, got ${JSON.stringify(f?.name)}`)
    figureNames.add(f.name)
  }
  const signal = options.signal
  signal?.throwIfAborted()
  const notes = [...transcript.notes]
  const script = replayScript(transcript, notes)
  const pruneConfig = resolvePruneConfig()
  const session = new Session({ store: new MemoryStore() })
  session.append('session/start', { id: `replay-${transcript.format}`, version: VERSION })

  let open: OpenReplayRow | undefined
  const rows: ReplayStep[] = []
  const warnings: string[] = []

  // Every summary request passes here, so its size (the estimate summarise() hands over) is recorded.
  // A simulated summary stands for the conversation model (as in a live session, where the summarizer
  // defaults to the provider): the prompt-cache model compares its requests with the conversation's.
  const base = options.summarizer ?? { ...simulatedSummarizer(summaryTokens, window), model: `recorded-${transcript.format}` }
  const summaryWindow = base.contextWindow ?? window
  let peakSummaryRequestTokens = 0
  let summaryRequestsOverWindow = 0
  const summarizer: Provider = {
    model: base.model, baseURL: base.baseURL, contextWindow: base.contextWindow, maxTokens: base.maxTokens,
    complete(request) {
      const tokens = request.inputTokens ?? estimateRequestTokens({ system: request.system, tools: request.tools }, request.messages)
      peakSummaryRequestTokens = Math.max(peakSummaryRequestTokens, tokens)
      if (tokens > summaryWindow) summaryRequestsOverWindow++
      if (open) open.summaryCalls++
      return base.complete(request)
    },
  }

  // A dsh log's counts are of the managed requests it sent, not of the unmanaged prompt replay rebuilds.
  const calibrates = transcript.format !== 'dsh'
  if (!calibrates && transcript.usage.some((u) => u !== undefined)) {
    notes.push('the prompt tokens a dsh log records are of its own managed requests: not used for calibration')
  }
  /** Every request the replay made (conversation, then summary), for the calibrated cost. */
  const priced: PricedRequest[] = [], pricedSummaries: PricedRequest[] = []

  // The recorded provider: the turn's next recorded step, or — when the transcript records none
  // while the loop would go on — the turn ends as cancelled.
  let turn: ReplayScriptTurn | undefined
  let stepIndex = 0
  let current: ReplayScriptStep | undefined
  let stop: AbortController | undefined
  const provider: Provider = {
    model: `recorded-${transcript.format}`, baseURL: 'replay://transcript', contextWindow: window, maxTokens: window,
    prices: options.prices ?? REPLAY_PRICES, // the net-cost gate decides at the prices the totals use
    async complete(request) {
      current = turn?.steps[stepIndex++]
      if (!current) {
        stop?.abort(new Error('the transcript records no further step in this turn'))
        throw new ProviderError('ABORTED', 'the transcript records no further step in this turn')
      }
      if (open) {
        open.requestTokens = session.measure().heuristicTokens
        open.context.request = request
        open.context.recordedUsage = current.usage
      }
      // The recorded count comes with the response, as a live provider's usage does: a calibration sample
      // of the unmanaged prompt it counted (docs/design.md §15), in the log before the step's pressure check.
      const recorded = current.usage?.promptTokens
      if (calibrates && recorded !== undefined && recorded > 0) {
        session.append('ladder/state', { sample: { providerTokens: recorded, heuristicTokens: unmanaged, source: 'transcript' } })
      }
      const m = session.measure()
      if (open) {
        open.calibratedRequestTokens = m.totalTokens
        open.calibratedUnmanagedTokens = anchoredTotal(unmanaged, undefined, m.calibration, m.calibrationOffsetTokens)
      }
      priced.push({ ...CostLedger.of(session).nextRequestCache(), outputTokens: estimateMessageTokens(current.message) })
      if (current.usage) request.onEvent?.({ type: 'usage', usage: current.usage })
      for (const m of current.steerAfter) agent.steer(m)
      return { message: current.message, finishReason: 'replay' }
    },
  }

  // The recorded tools: each call's result from the transcript, found by the id the loop logged.
  const recordedResults = new Map<string, ToolResultMessage>()
  const answered = new Set<string>()
  const toolNames = new Set<string>()
  for (const m of transcript.messages) for (const b of m.role === 'assistant' ? m.content : []) if (b.type === 'tool-call') toolNames.add((b as ToolCallBlock).name)
  const tools: Tool[] = [...toolNames].map((name) => ({
    name, description: '', parameters: {},
    execute(_args: unknown, ctx: ToolContext): ToolOutput {
      const result = recordedResults.get(ctx.callId)
      if (!result) throw new Error(`the transcript records no result for tool call ${ctx.callId}`)
      answered.add(ctx.callId)
      return { content: result.content, isError: result.isError }
    },
  }))

  // Rows, read off the Agent's events.
  let unmanaged = estimateEnvelopeTokens(transcript.envelope)
  let steps = 0
  let turns = 0
  let answeredByLoop = 0
  // A rung that replaces one node logs `compaction/<rung> {shadowedSeqs: [seq], shadowedTokenCount}`, then the replace.
  let pendingShadow: { rung: string; logSeq: number; seq: number; tokens: number; data: Record<string, unknown> } | undefined
  let pendingSummary: { id: string; seqs: number[]; tokens: number; checkpointTokens?: number } | undefined
  const openRow = (kind: ReplayStep['kind'], turnNumber: number) => {
    open = {
      kind, step: steps + 1, turn: turnNumber, hasMessage: false, ladderWarned: false, summaryCalls: 0, events: [], warnings: [],
      figures: figures.map(() => 0), context: { session, contextWindow: window },
    }
  }
  const closeRow = () => {
    const r = open
    open = undefined
    if (!r || (r.kind === 'step' && !r.hasMessage)) return // a step the transcript does not record (the turn ended there)
    const afterTokens = session.measure().totalTokens
    const beforeTokens = r.beforeTokens ?? afterTokens
    const prunes = r.events.filter((e): e is Extract<ReplayEvent, { type: 'prune' | 'clear' }> => e.type === 'prune')
    const row: ReplayStep = {
      kind: r.kind, step: r.step, turn: r.turn,
      ...(r.requestTokens !== undefined ? { requestTokens: r.requestTokens } : {}),
      ...(r.calibratedRequestTokens !== undefined ? { calibratedRequestTokens: r.calibratedRequestTokens } : {}),
      unmanagedTokens: r.unmanagedTokens ?? unmanaged,
      ...(r.calibratedUnmanagedTokens !== undefined ? { calibratedUnmanagedTokens: r.calibratedUnmanagedTokens } : {}),
      ...(r.recordedPromptTokens !== undefined ? { recordedPromptTokens: r.recordedPromptTokens } : {}),
      beforeTokens, rung: r.rung ?? (r.ladderWarned ? 'failed' : 'none'), afterTokens, reclaimedTokens: beforeTokens - afterTokens,
      prunes: prunes.length, prunedTokens: prunes.reduce((t, e) => t + e.tokensBefore - e.tokensAfter, 0),
      summaryCalls: r.summaryCalls, events: r.events, warnings: r.warnings,
      ...(figures.length > 0 ? { figures: Object.fromEntries(figures.map((f, k) => [f.name, r.figures[k]])) } : {}),
    }
    rows.push(row)
    options.onStep?.(row, session)
  }
  const observe = (ae: AgentEvent) => {
    options.onEvent?.(ae)
    if (ae.type === 'warning') { warnings.push(ae.message); open?.warnings.push(ae.message) }
    if (ae.type === 'stream' && ae.event.type === 'usage' && open) open.recordedPromptTokens = ae.event.usage.promptTokens
    if (ae.type === 'log') {
      const e = ae.event
      const d = e.data as any
      const appended = d?.surfaceOp?.op === 'append'
      const rung = rungOfEvent(e.type)
      if (e.type.startsWith('compaction/') && open && open.beforeTokens === undefined) open.beforeTokens = session.measure().totalTokens
      if (rung && open) open.rung = rung
      const op = d?.surfaceOp
      if (op?.op === 'replace' && pendingShadow && op.start === pendingShadow.seq && op.end === pendingShadow.seq && open) {
        const p = pendingShadow
        const role = (d.message as Message).role
        const priced = { seq: p.seq, tokensBefore: p.tokens, tokensAfter: estimateMessageTokens(d.message) }
        open.events.push(p.rung === 'prune' || p.rung === 'clear' ? { type: p.rung, ...priced, ...(role === 'tool' ? {} : { role }) }
          : { type: 'rung', rung: p.rung, ...priced, seq: p.logSeq, data: p.data })
        pendingShadow = undefined
      }
      if (rung && rung !== 'compact') {
        if (Array.isArray(d?.shadowedSeqs) && d.shadowedSeqs.length === 1 && typeof d.shadowedTokenCount === 'number') {
          pendingShadow = { rung, logSeq: e.seq, seq: d.shadowedSeqs[0], tokens: d.shadowedTokenCount, data: d }
        } else if (open) open.events.push({ type: 'rung', rung, seq: e.seq, data: d })
      }
      switch (e.type) {
        case 'turn/start': closeRow(); turns = d.turn; openRow('turn-start', d.turn); break
        case 'step/start': closeRow(); openRow('step', turns); break
        case 'step/end': case 'turn/end': closeRow(); break
        case 'user/message':
          if (appended && !(turn?.synthetic && d.message === turn.input)) unmanaged += estimateMessageTokens(d.message) // the transcript's messages only
          else if (pendingSummary && d.compactionId === pendingSummary.id) pendingSummary.checkpointTokens = estimateMessageTokens(d.message)
          break
        case 'assistant/message': {
          if (!appended || !open || !current) break
          open.hasMessage = true
          open.step = ++steps
          open.unmanagedTokens = unmanaged
          unmanaged += estimateMessageTokens(current.message)
          // The logged calls (ids as the loop kept or repaired them) in order, matched to the recorded results.
          const logged = (d.message as AssistantMessage).content.filter((b) => b.type === 'tool-call') as ToolCallBlock[]
          const recorded = current.message.content.filter((b) => b.type === 'tool-call') as ToolCallBlock[]
          logged.forEach((c, k) => {
            const result = current!.results.find((r) => r.toolCallId === recorded[k]?.id)
            if (result) recordedResults.set(c.id, result)
          })
          break
        }
        case 'tool/result': {
          if (appended) {
            const original = recordedResults.get(d.message.toolCallId) ?? d.message
            if (!answered.has(d.message.toolCallId)) answeredByLoop++
            unmanaged += estimateMessageTokens(original)
            if (d.spilled && open) open.events.push({ type: 'spill', seq: e.seq, bytes: d.spilled.bytes, tokensBefore: estimateMessageTokens(original), tokensAfter: estimateMessageTokens(d.message) })
          }
          break
        }
        case 'compaction/summary': pendingSummary = { id: d.id, seqs: d.shadowedSeqs, tokens: d.shadowedTokenCount }; break
        case 'compaction/warning': if (open) open.ladderWarned = true; break
        case 'compaction/end':
          for (const q of (d.requests ?? []) as SummaryRequestRecord[]) pricedSummaries.push(q)
          if (!open) break
          if (d.error !== undefined) open.events.push({ type: 'compaction-failed', id: d.id, error: d.error })
          else {
            const s = pendingSummary
            if (s !== undefined && s.id === d.id && s.checkpointTokens !== undefined) open.events.push({
              type: 'compaction', id: s.id, messages: s.seqs.length, firstSeq: s.seqs[0], lastSeq: s.seqs[s.seqs.length - 1],
              tokensBefore: s.tokens, tokensAfter: s.checkpointTokens, totalBefore: d.tokensBefore, totalAfter: d.tokensAfter,
            })
          }
          pendingSummary = undefined
          break
      }
    }
    if (open) figures.forEach((f, k) => { open!.figures[k] = f.add(ae, open!.figures[k], open!.context) })
  }

  const maxSteps = script.reduce((m, t) => Math.max(m, t.steps.length), 0) + 1
  const agentOptions: AgentOptions = {
    session, provider, tools, summarizer, system: transcript.envelope.system,
    compaction: { auto, clear, thresholdRatio }, prune: pruneConfig, maxSteps, onEvent: observe, recall: options.recall ?? false,
  }
  // The transcript's own `recall` tool keeps its name: the Agent then offers no recall tool of its own.
  if (toolNames.has(RECALL_TOOL_NAME) && agentOptions.recall) {
    agentOptions.recall = false
    notes.push(`the transcript has a tool of its own named "${RECALL_TOOL_NAME}": replayed without dsh's recall tool`)
  }
  const agent: Agent = new ReplayAgent(agentOptions, transcript.envelope)
  for (const t of script) {
    turn = t
    stepIndex = 0
    stop = new AbortController()
    const onAbort = () => stop!.abort(signal!.reason)
    signal?.addEventListener('abort', onAbort, { once: true })
    try {
      for (const m of t.steerBefore) agent.steer(m)
      await agent.run(t.input, { signal: stop.signal })
    } finally { signal?.removeEventListener('abort', onAbort) }
    signal?.throwIfAborted()
  }
  closeRow()
  if (answeredByLoop > 0) notes.push(`${answeredByLoop} tool call(s) answered by the loop itself, not with the recorded result (e.g. arguments that are not JSON), as a live run would`)

  const stepRows = rows.filter((r) => r.kind === 'step')
  const peakRequestTokens = stepRows.reduce((p, r) => Math.max(p, r.requestTokens!), 0)
  const recordedPeak = stepRows.reduce((p, r) => Math.max(p, r.recordedPromptTokens ?? -1), -1)
  const all = rows.flatMap((r) => r.events)
  const rungs: Record<string, number> = {}
  const rungReclaimedTokens: Record<string, number> = {}
  for (const e of all) {
    const name = e.type === 'prune' || e.type === 'clear' ? e.type : e.type === 'compaction' ? 'compact' : e.type === 'rung' ? e.rung : undefined
    if (!name) continue
    rungs[name] = (rungs[name] ?? 0) + 1
    const before = 'tokensBefore' in e ? e.tokensBefore : undefined
    const after = 'tokensAfter' in e ? e.tokensAfter : undefined
    if (name !== 'compact' && before !== undefined && after !== undefined) rungReclaimedTokens[name] = (rungReclaimedTokens[name] ?? 0) + before - after
  }
  const pruneThreshold = pruneConfig.thresholdChars
  const prices = options.prices ?? REPLAY_PRICES
  const fitted = session.measure()
  const calibration = { ratio: fitted.calibration, offsetTokens: fitted.calibrationOffsetTokens, samples: fitted.calibrationSamples }
  // The floor's requests, as the cost model sees them (beforeRequest runs before each assistant message is logged).
  const assistants = transcript.messages.filter((m) => m.role === 'assistant')
  const floor: PricedRequest[] = []
  const floorSession = unmanagedSession(transcript, (s, k) => {
    floor.push({ ...CostLedger.of(s).nextRequestCache(), outputTokens: estimateMessageTokens(assistants[k]) })
  })
  const calibrated = (r: ReplayStep) => r.calibratedRequestTokens ?? r.requestTokens!
  const totals: ReplayTotals = {
    steps: stepRows.length,
    turns,
    peakRequestTokens,
    peakPercent: Math.round((peakRequestTokens / window) * 1000) / 10,
    prunes: rungs.prune ?? 0,
    prunedTokens: rows.reduce((t, r) => t + r.prunedTokens, 0),
    spills: all.filter((e) => e.type === 'spill').length,
    compactions: rungs.compact ?? 0,
    failedCompactions: all.filter((e) => e.type === 'compaction-failed').length,
    summaryCalls: rows.reduce((t, r) => t + r.summaryCalls, 0),
    requestsOverWindow: stepRows.filter((r) => r.requestTokens! > window).length,
    calibratedRequestsOverWindow: stepRows.filter((r) => calibrated(r) > window).length,
    peakCalibratedRequestTokens: stepRows.reduce((p, r) => Math.max(p, calibrated(r)), 0),
    unmanagedStepsOverWindow: stepRows.filter((r) => r.unmanagedTokens > window).length,
    calibratedUnmanagedStepsOverWindow: stepRows.filter((r) => (r.calibratedUnmanagedTokens ?? r.unmanagedTokens) > window)
      .length,
    peakUnmanagedTokens: stepRows.reduce((p, r) => Math.max(p, r.unmanagedTokens), 0),
    calibration,
    ...(recordedPeak >= 0 ? { peakRecordedPromptTokens: recordedPeak } : {}),
    peakSummaryRequestTokens,
    summaryRequestsOverWindow,
    resultsOverPruneThreshold: transcript.messages.filter((m) => m.role === 'tool' && resultCodePoints(m, pruneThreshold) > pruneThreshold).length,
    ladderWarnings: warnings.length,
    cost: {
      dsh: replayCost(CostLedger.of(session).usage({ prices })),
      unmanaged: replayCost(CostLedger.of(floorSession).usage({ prices })),
      ...(calibration.samples > 0 ? {
        calibrated: {
          dsh: calibratedCost([...priced, ...pricedSummaries], pricedSummaries.length, calibration, prices),
          unmanaged: calibratedCost(floor, 0, calibration, prices),
        },
      } : {}),
    },
    rungs,
    rungReclaimedTokens,
    ...(figures.length > 0 ? {
      figures: Object.fromEntries(figures.map((f) => {
        const values = rows.map((r) => r.figures![f.name])
        return [f.name, f.total === 'max' ? values.reduce((a, b) => Math.max(a, b), 0) : values.reduce((a, b) => a + b, 0)]
      })),
    } : {}),
  }
  return {
    format: transcript.format, messages: countRoles(transcript.messages), contextWindow: window, thresholdRatio,
    thresholdTokens: Math.floor(window * thresholdRatio),
    summaries: options.summarizer ? { simulated: false, model: options.summarizer.model } : { simulated: true, tokens: summaryTokens },
    prices, rows, totals, notes, warnings,
  }
}

/** Options of {@link formatReplay}. */
export interface FormatReplayOptions {
  /** JSONL instead of a table: one object per row (`kind` 'turn-start' | 'step'), then one `kind: 'totals'`. */
  json?: boolean
  /** A name for the header line (e.g. the file name). */
  name?: string
  /** Added to every JSON object as `chain` (e.g. 'main', 'sidechain 2'); a heading in the table. */
  chain?: string
  /** Extra figures passed to the replay besides {@link REPLAY_FIGURES}, for their cells (a figure the report has but neither names is shown with digit grouping). */
  figures?: readonly ReplayFigure[]
}

const groupDigits = (n: number): string => String(n).replace(/\B(?=(\d{3})+(?!\d))/g, ',')

/** One line for an event a rung logged: its seq and the event's scalar fields (numbers grouped). */
function describeRungData(data: Record<string, unknown>): string {
  const show = (v: unknown): string | undefined =>
    typeof v === 'number' ? groupDigits(v) : typeof v === 'string' ? (v.length > 40 ? JSON.stringify(v.slice(0, 40) + '…') : JSON.stringify(v))
      : Array.isArray(v) && v.every((x) => typeof x === 'number') ? (v.length > 2 ? `${v[0]}..${v[v.length - 1]} (${v.length})` : v.join(', ')) : undefined
  return Object.entries(data).flatMap(([k, v]) => { const s = show(v); return s === undefined ? [] : [`${k} ${s}`] }).join(', ')
}

function describeReplayEvent(e: ReplayEvent): string {
  switch (e.type) {
    case 'spill': return `spill    tool result seq ${e.seq}: ${groupDigits(e.bytes)} bytes stored aside, ${groupDigits(e.tokensBefore)} → ${groupDigits(e.tokensAfter)} tokens`
    case 'prune': case 'clear': return `${e.type.padEnd(8)} ${e.role ? `${e.role} message` : 'tool result'} seq ${e.seq}: ${groupDigits(e.tokensBefore)} → ${groupDigits(e.tokensAfter)} tokens`
    case 'compaction': return `compact  ${e.id}: ${e.messages} messages (seq ${e.firstSeq}..${e.lastSeq}) ${groupDigits(e.tokensBefore)} → checkpoint ${groupDigits(e.tokensAfter)} tokens; total ${groupDigits(e.totalBefore)} → ${groupDigits(e.totalAfter)}`
    case 'compaction-failed': return `failed   ${e.id}: ${e.error}`
    case 'rung': return `${e.rung.padEnd(8)} seq ${e.seq}: ${e.tokensBefore !== undefined && e.tokensAfter !== undefined ? `${groupDigits(e.tokensBefore)} → ${groupDigits(e.tokensAfter)} tokens; ` : ''}${describeRungData(e.data)}`
  }
}

/** A column of the replay table: header, cell, whether it is left-aligned (else right), shown only when calibrated. */
interface ReplayColumn { header: string; cell: (r: ReplayStep) => string; left?: boolean; calibrated?: boolean }

const tokensCell = (n: number | undefined): string => (n === undefined ? '-' : groupDigits(n))

/** The built-in columns of the text table, in order; extra figures with a `cell` follow. */
const REPLAY_COLUMNS: readonly ReplayColumn[] = [
  { header: 'step', cell: (r) => (r.kind === 'step' ? String(r.step) : 'input') },
  { header: 'turn', cell: (r) => String(r.turn) },
  { header: 'request', cell: (r) => tokensCell(r.requestTokens) },
  { header: 'calibrated', cell: (r) => tokensCell(r.calibratedRequestTokens), calibrated: true },
  { header: 'unmanaged', cell: (r) => tokensCell(r.unmanagedTokens) },
  { header: 'recorded', cell: (r) => tokensCell(r.recordedPromptTokens) },
  { header: 'before', cell: (r) => tokensCell(r.beforeTokens) },
  { header: 'rung', cell: (r) => r.rung, left: true },
  { header: 'after', cell: (r) => tokensCell(r.afterTokens) },
  { header: 'reclaimed', cell: (r) => tokensCell(r.reclaimedTokens) },
]

/**
 * Renders a {@link ReplayReport}: a header (settings, how summaries were made, what the token figures
 * are), one aligned table row per pressure check with its events indented below, and a totals block —
 * or, with `json`, JSONL (one object per row, then the totals with the settings). O(rows + events).
 */
export function formatReplay(report: ReplayReport, options: FormatReplayOptions = {}): string {
  const chain = options.chain === undefined ? {} : { chain: options.chain }
  if (options.json) {
    // jsonLine: a transcript's C1 characters in a note are escaped (printed raw, the terminal guard deleted them)
    const lines = report.rows.map((r) => jsonLine({ ...chain, ...r }))
    const { rows: _rows, totals, ...settings } = report
    lines.push(jsonLine({ ...chain, kind: 'totals', ...settings, ...totals }))
    return lines.join('') // each line ends in its LF
  }
  const t = report.totals
  const n = report.messages
  const out: string[] = []
  if (options.chain !== undefined) out.push(`── ${options.chain} ──`)
  out.push(`dsh replay${options.name ? ` of ${options.name}` : ''}: ${report.format}, ${n.user + n.assistant + n.tool} messages (${n.user} user, ${n.assistant} assistant, ${n.tool} tool results), ${t.turns} turn(s), ${t.steps} step(s)`)
  out.push(`context window ${groupDigits(report.contextWindow)} tokens; pressure threshold ${groupDigits(report.thresholdTokens)} (${report.thresholdRatio}); above the threshold, tool results over ${groupDigits(DEFAULT_PRUNE_CONFIG.thresholdChars)} code points are pruned first`)
  out.push(report.summaries.simulated
    ? `summaries simulated at ${groupDigits(report.summaries.tokens)} tokens each (no model was called)`
    : `summaries written by the model ${report.summaries.model}`)
  const fit = t.calibration
  out.push(fit.samples > 0
    ? `tokens: dsh's estimate (docs/design.md §2); "calibrated", and the ladder's before → after, are in the transcript's own tokens: offset + ratio × the estimate, fitted by least squares on the "recorded" prompt tokens of the steps so far (docs/design.md §15; finally ${groupDigits(fit.offsetTokens)} + ${fit.ratio.toFixed(3)} × the estimate, on ${fit.samples} steps)`
    : report.format === 'dsh'
      ? 'tokens: dsh\'s own estimate (docs/design.md §2); "recorded" is the prompt size the recorded run reported for its own managed requests, for comparison'
      : 'tokens: dsh\'s own estimate (docs/design.md §2): the transcript records no prompt tokens to calibrate it on')
  // a note may quote a transcript's ids and names: one line each, so that it cannot fake a row of the table
  for (const note of report.notes) out.push(`note: ${oneLine(note, 2000)}`)
  out.push('request = what dsh would send for the step; unmanaged = the same with no management; before → after = around the rung at the pressure check')
  out.push('')
  // Extra figures: a column each, rendered by the figure's `cell` (a figure without one is JSON only).
  const known = new Map([...REPLAY_FIGURES, ...(options.figures ?? [])].map((f) => [f.name, f]))
  const figureCell = (name: string, v: number) => { const f = known.get(name); return f ? f.cell?.(v) : groupDigits(v) }
  const figureNames = Object.keys(t.figures ?? {}).filter((name) => figureCell(name, 0) !== undefined)
  const builtIn = REPLAY_COLUMNS.filter((c) => !c.calibrated || fit.samples > 0)
  const columns: ReplayColumn[] = [...builtIn, ...figureNames.map((name) => ({
    header: name, cell: (r: ReplayStep) => (r.figures?.[name] === undefined ? '-' : figureCell(name, r.figures[name])!),
  }))]
  const cells = report.rows.map((r) => columns.map((c) => c.cell(r)))
  const widths = columns.map((c, k) => cells.reduce((w, row) => Math.max(w, row[k].length), c.header.length))
  const line = (row: string[]) => row.map((s, k) => (columns[k].left ? s.padEnd(widths[k]) : s.padStart(widths[k]))).join('  ').trimEnd()
  const indent = ' '.repeat(widths[0] + 2) + '↳ '
  out.push(line(columns.map((c) => c.header)))
  report.rows.forEach((r, k) => {
    out.push(line(cells[k]))
    for (const e of r.events) out.push(indent + describeReplayEvent(e))
    for (const w of r.warnings) out.push(indent + `warning  ${w}`)
  })
  out.push('')
  const pct = (tokens: number) => `${((tokens / report.contextWindow) * 100).toFixed(1)}%`
  const totals: [string, string][] = [
    ['steps', `${groupDigits(t.steps)} in ${t.turns} turn(s)`],
    ['peak request', `${groupDigits(t.peakRequestTokens)} tokens (${t.peakPercent.toFixed(1)}% of ${groupDigits(report.contextWindow)})`],
    ['prunes', `${t.prunes} (${groupDigits(t.prunedTokens)} tokens reclaimed by pruning)`],
    ['spills', String(t.spills)],
    ['compactions', `${t.compactions}${t.failedCompactions ? ` (+${t.failedCompactions} failed)` : ''}, ${t.summaryCalls} summary call(s)`],
  ]
  for (const [rung, count] of Object.entries(t.rungs ?? {})) {
    const reclaimed = t.rungReclaimedTokens?.[rung]
    if (rung !== 'prune' && rung !== 'compact') totals.push([`rung ${rung}`, `${count}${reclaimed === undefined ? '' : ` (${groupDigits(reclaimed)} tokens reclaimed)`}`])
  }
  const calibratedToo = (n: number) => (fit.samples > 0 ? `, ${n} calibrated` : '')
  totals.push(
    ['requests over the window, dsh',
      `${t.requestsOverWindow}${fit.samples > 0 ? ' by the estimate' : ''}${calibratedToo(t.calibratedRequestsOverWindow)}`],
    ['steps over the window, unmanaged', `${t.unmanagedStepsOverWindow}${calibratedToo(t.calibratedUnmanagedStepsOverWindow)}`
      + ` (unmanaged peak ${groupDigits(t.peakUnmanagedTokens)} tokens, ${pct(t.peakUnmanagedTokens)})`],
  )
  if (fit.samples > 0) {
    totals.push(['peak request, calibrated', `${groupDigits(t.peakCalibratedRequestTokens)} tokens (${pct(t.peakCalibratedRequestTokens)})`])
    const fitted = `${groupDigits(fit.offsetTokens)} tokens + ${fit.ratio.toFixed(3)} × dsh's estimate`
    totals.push(['calibration', `${fitted} (least squares on ${fit.samples} recorded steps)`])
  }
  if (t.peakRecordedPromptTokens !== undefined) totals.push(['recorded peak prompt', `${groupDigits(t.peakRecordedPromptTokens)} tokens (as reported by the original run)`])
  if (t.summaryCalls > 0) totals.push(['largest summary request', `${groupDigits(t.peakSummaryRequestTokens)} tokens (${t.summaryRequestsOverWindow} over the summarizer's window)`])
  if (t.ladderWarnings > 0) totals.push(['ladder warnings', String(t.ladderWarnings)])
  const p = report.prices
  const costCell = (c: ReplayCost) => `${c.costUSD === undefined ? 'cost unknown' : formatUSD(c.costUSD)}, cache hits ${(c.cacheHitShare * 100).toFixed(1)}% of ${groupDigits(c.inputTokens)} input tokens, ${c.requests} request(s)${c.summaryRequests ? ` (${c.summaryRequests} summary)` : ''}`
  const vsFloor = (c: { dsh: ReplayCost; unmanaged: ReplayCost }) =>
    (c.dsh.costUSD !== undefined && c.unmanaged.costUSD ? ` = ${(c.dsh.costUSD / c.unmanaged.costUSD).toFixed(2)}× the floor` : '')
  totals.push(
    ['cost, dsh', `${costCell(t.cost.dsh)}${vsFloor(t.cost)}`],
    ['cost, unmanaged (infinite window)', costCell(t.cost.unmanaged)],
  )
  if (t.cost.calibrated) {
    totals.push(
      ['cost, dsh, calibrated', `${costCell(t.cost.calibrated.dsh)}${vsFloor(t.cost.calibrated)}`],
      ['cost, unmanaged, calibrated', costCell(t.cost.calibrated.unmanaged)],
    )
  }
  totals.push(
    ['prices (USD per million tokens)', `cache hit ${p.cacheHitInput}, miss ${p.cacheMissInput}, output ${p.output}${p.peak ? ', with peak hours' : ''}; modelled cache hits, no model called`],
  )
  for (const [name, v] of Object.entries(t.figures ?? {})) if (!known.get(name)?.hideTotal) totals.push([name, figureCell(name, v) ?? groupDigits(v)])
  const fidelity = fidelityTotalsLine(t.figures ?? {})
  if (fidelity) totals.push(['fidelity', fidelity])
  const labelWidth = totals.reduce((w, [l]) => Math.max(w, l.length), 0)
  out.push('totals')
  for (const [label, value] of totals) out.push(`  ${label.padEnd(labelWidth)}  ${value}`)
  return out.join('\n') + '\n'
}

/** Options of {@link runReplay}: reading, replaying and rendering in one. */
export interface RunReplayOptions extends ReplayOptions, ReadTranscriptOptions, Omit<FormatReplayOptions, 'chain'> {}

/**
 * The `replay` command without its file system: reads `text` ({@link readTranscript}), replays it
 * ({@link replayTranscript}) and renders it ({@link formatReplay}). With `sidechains` (Claude Code),
 * each Task-subagent run is replayed too, as its own session with the same settings, and rendered
 * after the main chain (`sidechainReports`, in file order).
 * @throws {TranscriptError} for a file that is no transcript; {@link RangeError} for bad options.
 */
export async function runReplay(text: string, options: RunReplayOptions = {}): Promise<{ report: ReplayReport; sidechainReports: ReplayReport[]; output: string }> {
  const transcript = readTranscript(text, { format: options.format, sidechains: options.sidechains })
  const report = await replayTranscript(transcript, options)
  const sidechainReports: ReplayReport[] = []
  for (const side of transcript.sidechains ?? []) {
    sidechainReports.push(await replayTranscript(side, { ...options, contextWindow: report.contextWindow }))
  }
  const chains = sidechainReports.length > 0
  const figures = options.figures
  let output = formatReplay(report, { json: options.json, name: options.name, chain: chains ? 'main chain' : undefined, figures })
  sidechainReports.forEach((r, k) => {
    output += (options.json ? '' : '\n') + formatReplay(r, { json: options.json, name: options.name, chain: `sidechain ${k + 1} of ${sidechainReports.length}`, figures })
  })
  return { report, sidechainReports, output }
}

// ════════════════════════════════════════════════════════════════════════════════════════════
// 11. CLI — arguments, configuration, terminal output, entry point (docs/design.md §8)
// ════════════════════════════════════════════════════════════════════════════════════════════

/** DeepSeek defaults of the CLI (docs/design.md §6). */
export const CLI_DEFAULTS = /* @__PURE__ */ Object.freeze({
  baseURL: DEEPSEEK_BASE_URL,
  model: DEEPSEEK_DEFAULT_MODEL,
  /** Environment variable read for the key when neither `--api-key-env` nor a non-DeepSeek base URL is given. */
  apiKeyEnv: DEEPSEEK_API_KEY_ENV,
  /** Compaction threshold as a ratio of the context window (docs/design.md §5); the ladder's own default. */
  get threshold(): number { return DEFAULT_COMPACTION_CONFIG.thresholdRatio },
  /** replay: size of a simulated summary, in tokens; the replay runner's own default. */
  get summaryTokens(): number { return DEFAULT_REPLAY_SUMMARY_TOKENS },
})

/** Transcript formats `replay --format` accepts (docs/replay.md). `auto` detects. */
export type CliReplayFormat = 'auto' | TranscriptFormat
const cliReplayFormats = (): readonly CliReplayFormat[] => ['auto', ...TRANSCRIPT_FORMATS]

/** A bad command line or missing configuration. The CLI prints `message` (one line) and exits with `exitCode` 2. */
export class UsageError extends Error {
  /** 2, or 130 for a question answered with Ctrl-C (the shell's code for an interrupt). */
  readonly exitCode: number
  constructor(message: string, exitCode = 2) {
    super(message)
    this.exitCode = exitCode
    this.name = 'UsageError'
  }
}

/** Where to send model calls, resolved from flags, environment and {@link CLI_DEFAULTS}. */
export interface CliModelOptions {
  /** Model name: `--model`, else `$DSH_MODEL`, else {@link DEEPSEEK_DEFAULT_MODEL}. */
  model: string
  /** Base URL without a trailing slash: `--base-url`, else `$DSH_BASE_URL`, else `https://api.deepseek.com`. */
  baseURL: string
  /** The API key, absent for a server that needs none. Never printed. */
  apiKey?: string
  /** The environment variable `apiKey` came from, for messages. */
  apiKeyEnv?: string
}

/** `dsh [prompt]` / `dsh -p PROMPT`: run the agent. */
export interface CliRunOptions extends CliModelOptions {
  command: 'run'
  /** The prompt (`-p/--print PROMPT` or the positional argument). Absent: interactive on a TTY, else the caller decides (e.g. read stdin). */
  prompt?: string
  /** True when the prompt came with `-p/--print` (one-shot, answer on stdout). */
  print: boolean
  /** `--context-window N`, tokens. Absent: the provider's known window for the model (docs/design.md §6). */
  contextWindow?: number
  /** `--max-tokens N`, completion budget per call in tokens. Absent: the provider's default. */
  maxTokens?: number
  /** `--session FILE`: JSONL session log, resumed when it exists (path as given). */
  session?: string
  /** `--threshold R`: compaction threshold, a ratio of the window in (0, 1]. Default 0.8. */
  threshold: number
  /** `false` with `--no-clear` (absent otherwise): the ladder never clears old tool results (prune, then summarise; docs/design.md §10). */
  clear?: false
  /** `--json`: every log event as one JSON line on stdout (the session log's lines; stream deltas are not log events). */
  json: boolean
  /** `--allow-shell`: offer the shell tool. */
  allowShell: boolean
  /** `--prices P`: the model's price table (default: DeepSeek's for its models, else none: cost unknown). */
  prices?: Prices
  /** False with `--no-project-instructions`: AGENTS.md / CLAUDE.md of the working directory stay out of the system prompt. */
  projectInstructions: boolean
  /** `--shell-env NAME[,NAME…]` (repeatable): variables the shell tool keeps although they look secret. Absent when not given. */
  shellEnv?: string[]
  /** `-y/--yes`: approve every write, edit and shell command of the run without asking. */
  yes: boolean
  /** `-c/--continue`: resume the newest kept session of this directory. */
  continue: boolean
  /** `--resume`: list this directory's kept sessions and pick one (without a terminal: print the list). */
  resume: boolean
  /** `--no-save`: keep no session log (the session lives in memory). */
  noSave: boolean
  /** Approvals of the configuration files (user and trusted project), joined; the remembered answers are read at start. */
  approvals: CliApprovals
  /** The `sandbox` setting of the configuration files (the project's over the user's), as written; absent when none sets it. */
  sandboxConfig?: boolean | Record<string, unknown>
  /** Days kept sessions are kept after their last change (`retentionDays` of the user configuration, default 30). */
  retentionDays: number
  /** `--no-shell`: never offer the shell tool and do not ask (wins over a remembered answer). */
  noShell: boolean
  /** `--max-steps N`: provider calls per turn before the turn ends with reason `max-steps` (default 200). */
  maxSteps?: number
  /** `--max-cost USD`: the spend cap of each turn, USD (the Agent's `maxCostUSD`); absent when not given. */
  maxCostUSD?: number
  /** `-C DIR` / `--cwd DIR`: the project to work on, as if dsh were started there (path as given). */
  cwd?: string
  /** `false` with `--no-sandbox` (absent otherwise): shell commands run unconfined, not under bubblewrap. */
  sandbox?: false
  /** `true` with `--allow-network` (absent otherwise): sandboxed shell commands may use the network. */
  allowNetwork?: true
  /** `--sandbox-read PATH` (repeatable): paths sandboxed shell commands may read (path as given). Absent when not given. */
  sandboxRead?: string[]
}

/** `dsh replay FILE`: run a recorded session through the meter and the ladder offline. */
export interface CliReplayOptions {
  command: 'replay'
  /** The transcript to replay (path as given). */
  file: string
  /** `--context-window N`, tokens. Absent: the replay decides (e.g. from the log's `request/header`). */
  contextWindow?: number
  /** `--threshold R` in (0, 1]. Default 0.8. */
  threshold: number
  /** `false` with `--no-clear` (absent otherwise): replay the ladder without the clear rung. */
  clear?: false
  /** `--json`: machine-readable output. */
  json: boolean
  /** `--summary-tokens N`: size of a simulated summary in tokens. Default 2,000. */
  summaryTokens: number
  /** `--format F`. Default `auto`. */
  format: CliReplayFormat
  /** `--sidechains`: Claude Code, also replay each Task-subagent run (its own window) after the main chain. */
  sidechains: boolean
  /** `-C DIR` / `--cwd DIR`: resolve FILE from DIR, as if dsh were started there. */
  cwd?: string
  /** Present when `--base-url`, `--model` or `--api-key-env` asks for real summary calls; absent:
   *  summaries are simulated at `summaryTokens` (a key in the environment alone never costs money). */
  summarizer?: CliModelOptions
  /** `--prices P`: prices for the replay's cost totals (default: deepseek-flash, off-peak). */
  prices?: Prices
}

/** What {@link parseCliArgs} returns. */
export type CliOptions = { command: 'help' } | { command: 'version' } | CliRunOptions | CliReplayOptions | CliShowOptions

/** Flags: the value name (undefined = a switch) and the commands that accept it. */
const CLI_FLAGS: Readonly<Record<string, { value?: string; commands: readonly ('run' | 'replay')[] }>> = {
  '--print': { value: 'PROMPT', commands: ['run'] },
  '--model': { value: 'NAME', commands: ['run', 'replay'] },
  '--base-url': { value: 'URL', commands: ['run', 'replay'] },
  '--api-key-env': { value: 'NAME', commands: ['run', 'replay'] },
  '--context-window': { value: 'N', commands: ['run', 'replay'] },
  '--max-tokens': { value: 'N', commands: ['run'] },
  '--session': { value: 'FILE', commands: ['run'] },
  '--continue': { commands: ['run'] },
  '--resume': { commands: ['run'] },
  '--no-save': { commands: ['run'] },
  '--yes': { commands: ['run'] },
  '--threshold': { value: 'R', commands: ['run', 'replay'] },
  '--json': { commands: ['run', 'replay'] },
  '--allow-shell': { commands: ['run'] },
  '--no-project-instructions': { commands: ['run'] },
  '--shell-env': { value: 'NAME', commands: ['run'] },
  '--no-shell': { commands: ['run'] },
  '--no-sandbox': { commands: ['run'] },
  '--allow-network': { commands: ['run'] },
  '--sandbox-read': { value: 'PATH', commands: ['run'] },
  '--no-clear': { commands: ['run', 'replay'] },
  '--max-steps': { value: 'N', commands: ['run'] },
  '--max-cost': { value: 'USD', commands: ['run'] },
  '--cwd': { value: 'DIR', commands: ['run', 'replay'] },
  '--summary-tokens': { value: 'N', commands: ['replay'] },
  '--format': { value: 'F', commands: ['replay'] },
  '--sidechains': { commands: ['replay'] },
  '--prices': { value: 'P', commands: ['run', 'replay'] },
  '--help': { commands: ['run', 'replay'] },
  '--version': { commands: ['run', 'replay'] },
}
const CLI_SHORT_FLAGS: Readonly<Record<string, string>> = { '-p': '--print', '-h': '--help', '-C': '--cwd', '-c': '--continue', '-y': '--yes' }

/** The `--help` text (docs/design.md §8). A function, so that nothing is computed at load time. */
export function cliHelp(name = 'dsh'): string {
  const usage = (args: string, what: string) => `  ${`${name}${args}`.padEnd(36)} ${what}`
  return `dsh ${VERSION}: a coding agent that keeps long sessions inside the model's context window

Usage
${usage('', 'interactive session (needs a terminal)')}
${usage(' "PROMPT"', 'run one prompt, print the answer, exit')}
${usage(' -p "PROMPT"', 'the same (--print)')}
${usage(' replay FILE [...]', 'replay a recorded session offline (see below)')}
  ${name} show FILE [--checkpoints]
                                       print a session log as a transcript, every prune, clear
                                       and compaction marked; --checkpoints: each in full

Options
  -p, --print PROMPT     run PROMPT once; the answer goes to stdout (-p - reads PROMPT from stdin)
  --model NAME           model name (default: $DSH_MODEL, else ${CLI_DEFAULTS.model})
  --base-url URL         any OpenAI-compatible server; requests go to URL/chat/completions
                         (default: $DSH_BASE_URL, else ${CLI_DEFAULTS.baseURL})
  --api-key-env NAME     read the API key from the environment variable NAME (default:
                         ${CLI_DEFAULTS.apiKeyEnv}, which is only sent to api.deepseek.com;
                         a server that needs no key, e.g. a local one, needs no flag)
  --context-window N     context window in tokens; required for models dsh does not know
                         (it knows deepseek-flash and deepseek-v4-pro: 1,048,576)
  --max-tokens N         completion budget per model call, in tokens (default: the provider's;
                         always clamped to the room left in the window)
  --session FILE         keep the session in FILE (JSONL); resumes it when FILE exists
                         (without it, every session is kept for you: see Sessions below)
  -c, --continue         resume the newest kept session of this directory
  --resume               list this directory's kept sessions (when, turns, first and last
                         message) and pick one; without a terminal: print the list
  --no-save              keep no session log (nothing to continue or undo after exit)
  -y, --yes              approve every write, edit and shell command of the run without asking
  --threshold R          compact when the context reaches R x window, 0 < R <= 1 (default ${CLI_DEFAULTS.threshold})
  --max-steps N          provider calls per turn before the turn stops (default 200); a turn
                         that stops there without an answer exits 1
  --max-cost USD         spend cap of each turn: stop before a request whose modelled cost
                         would pass USD (e.g. --max-cost 0.5; needs prices, see --prices)
  -C, --cwd DIR          work on the project in DIR, as if dsh were started there (the tools,
                         a relative --session FILE and replay FILE are in DIR)
  --prices P             prices for the cost shown: a DeepSeek model (e.g. deepseek-v4-pro) or
                         HIT,MISS,OUTPUT in USD per million tokens (e.g. 0.003,0.15,0.6);
                         default: DeepSeek's for its models, else none (cost shown as unknown)
  --json                 print every log event as one JSON object per line on stdout
  --allow-shell          let the model run shell commands in the working directory
  --no-shell             never offer shell commands, and do not ask (interactive mode asks once
                         per directory and remembers the answer in the user configuration)
  --no-project-instructions
                         leave AGENTS.md (else CLAUDE.md) of the working directory out of
                         the system prompt (by default it is in every request)
  --no-clear             never replace old tool results by recallable placeholders (the clear
                         rung): prune, then summarise
  --shell-env NAME       give shell commands this variable (in the sandbox only PATH, LANG, LC_*,
                         TERM, HOME, USER and a few more reach them; without it, every variable
                         but secret-looking ones: KEY, TOKEN, SECRET, PASSWORD); repeatable.
                         The API key never is.
  --no-sandbox           run shell commands unconfined (by default, on Linux with bubblewrap,
                         each runs in a sandbox: the project writable but its git directories,
                         AGENTS.md/CLAUDE.md, .dsh and the session log; the rest read-only, an
                         empty home, a private /tmp, its own processes, no network)
  --allow-network        let sandboxed shell commands use the network
  --sandbox-read PATH    let sandboxed shell commands read PATH (e.g. ~/.gitconfig); repeatable
  -h, --help             show this help
  --version              print the version

The model gets these tools: read_file, list_files, grep, write_file, edit_file (their paths are
limited to the working directory) and, with --allow-shell or an interactive yes, shell (in the
sandbox above where bubblewrap runs; without it, a command can reach anything you can).
Interactive commands
  /model NAME [--context-window N]
                         the model for the next request (same server and key); N: its window,
                         else the one dsh knows for NAME; the context is measured against it at
                         once (compacted now if it must be). /model alone: the current one
  /compact [FOCUS]       summarise what is older than the recent tail compaction keeps (FOCUS:
                         what the summary should detail); when there is none, a line says why
  /context               a bar of the next request (envelope, pinned, checkpoints, recent, free),
                         its parts in tokens, the newest checkpoint in full
  /usage                 every figure: context, provider usage, cost
  /pin, /unpin           pin your last input (never compacted); remove the newest pin
  /diff, /undo, /permissions, /sessions   see below
  /help, /exit
  While a turn runs, a spinner names the running tool (or the model awaited) and its seconds; what
  you type meanwhile is not mixed into the answer: an entered line is queued and runs after the
  turn. Ctrl-C cancels the running turn (a second exits); at the prompt it clears what is typed (a
  second exits). A pasted block is one input; a line that ends in \\ continues on the next.

Status lines (stderr)
  ▸ read_file src/a.ts (2,340 tokens)    a tool ran; its result takes 2,340 tokens of context
  ▸ shell npm test → exit 1              a command and its exit code (errors: their first line)
  [dsh] pruned read_file big.log: 16,549 → 1,298 tokens (15,251 saved)
                                         a context edit: what was cut and the tokens it saved
  [dsh] context 12,034 / 128,000 tokens (9.4%) ~ · $0.0123 so far, cache hits 87%
                                         occupancy and cost (on a terminal), after a step that
                                         moved the occupancy or the cache hits by 5 points, or
                                         after a context edit (/usage has every figure).
                                         A trailing ~ means the figure is dsh's estimate
                                         (chars/4), not yet anchored on the tokens the provider
                                         reported. The cost is "unknown" for the whole session
                                         when the model has no price (--prices sets one)

Approvals, diffs and undo
  Interactive mode asks before each write_file, edit_file and shell command, showing the diff
  (colour on a terminal, at most 40 lines) or the command: [y]es, [n]o (the model is told you
  declined), [a]lways for this tool, or for shell [p] always for commands starting with the same
  words (a command with ; & | > < \` or $( is always asked about). "Always" is remembered for the
  directory in the user configuration, never in the project's. -y/--yes approves all for the run.
  A one-shot run (-p) asks nothing: writes and edits run (their diffs on stderr), shell commands
  only with --allow-shell or when the configuration approves them.
  /diff                  this session's changes, file by file
  /undo                  put back the files the last turn changed (again: the turn before); a
                         file changed outside dsh since is asked about; the model is told
  /permissions           what runs without asking; /permissions remove N, shell yes|no, trust yes|no
  /sessions              this directory's kept sessions; /sessions delete N

Configuration
  $XDG_CONFIG_HOME/dsh/config.json (default ~/.config/dsh/config.json), and .dsh/config.json in
  the project, e.g. {"model": "qwen3-coder", "baseURL": "http://127.0.0.1:8080/v1",
  "contextWindow": 32768, "prices": "0.003,0.15,0.6", "sandbox": {"allowNetwork": true},
  "approvals": {"tools": ["edit_file"], "commands": ["npm test"]}} and, in the user's file only,
  "retentionDays": 30. Precedence: flags, then DSH_MODEL / DSH_BASE_URL / DSH_CONTEXT_WINDOW, then
  the project's file, then the user's. A project's file is used only once you trust its directory
  (asked once on a terminal, remembered in the user's file): a cloned repository could otherwise
  send your requests, and your key, elsewhere. -p ignores an untrusted one and says so. The file
  tools never write .dsh/. A bad file stops dsh with one line naming the file and the key.

Sessions
  Every session is kept in $XDG_STATE_HOME/dsh/sessions/<project>/ (default ~/.local/state; files
  0600, directories 0700: logs hold tool output) and removed retentionDays after its last change
  (default 30), at start. -c resumes the newest, --resume picks one (a resume shows the last two
  exchanges), --session FILE keeps one where you say, --no-save keeps none.

Replay: ${name} replay FILE [options]
  Runs a recorded session through the real agent loop (recorded answers and tool results, the
  meter and the ladder live) and prints, per step, tokens before and after, the rung taken and
  tokens reclaimed, then totals. Formats (detected in this order):
${describeTranscriptFormats('    ')}
  --context-window N     window to simulate, in tokens
  --threshold R          as above (default ${CLI_DEFAULTS.threshold})
  --summary-tokens N     size of a simulated summary, in tokens (default ${CLI_DEFAULTS.summaryTokens})
  --prices P             price the totals with P (as above, off-peak; default deepseek-flash)
  --format F             force a format: ${TRANSCRIPT_FORMATS.join(', ')}
                         (default auto: detected from the file)
  --sidechains           Claude Code: also replay each Task-subagent run (sidechain), each in
                         its own window, after the main chain (default: skipped, counted in a note)
  --json                 machine-readable output
  --base-url URL, --model NAME, --api-key-env NAME
                         summarise with a real model instead of simulating summaries

Environment
  ${CLI_DEFAULTS.apiKeyEnv}       API key for DeepSeek (https://platform.deepseek.com)
  DSH_BASE_URL           default for --base-url
  DSH_MODEL              default for --model
  DSH_CONTEXT_WINDOW     default for --context-window
  NO_COLOR               plain status line
  XDG_CONFIG_HOME        where the user configuration is (default ~/.config)
  XDG_STATE_HOME         where sessions are kept (default ~/.local/state)

Exit codes
  0  done
  1  the provider or a tool failed (the error is on stderr)
  2  usage error: a bad flag or missing configuration (one line on stderr says what to set)

Examples
  export ${CLI_DEFAULTS.apiKeyEnv}=sk-...
  ${name} -p "list the TODO comments in src/, grouped by file"
  ${name} "make the failing test in test/date.test.ts pass"
  ${name} -c -p "now add a test for leap years"     # continues the newest session here
  ${name} --resume                                  # pick a kept session
  ${name} --base-url http://127.0.0.1:8080/v1 --model qwen3-coder --context-window 32768
  ${name} replay FILE --context-window 32000        # FILE: a kept session (--resume)
${name === 'dsh' ? '' : `  ${name} replay examples/session.jsonl --context-window 32000\n`}`
}

/** Edit distance, for "did you mean" on a mistyped flag. */
function editDistance(a: string, b: string): number {
  let previous = Array.from({ length: b.length + 1 }, (_, j) => j)
  for (let i = 1; i <= a.length; i++) {
    const current = [i]
    for (let j = 1; j <= b.length; j++) {
      current[j] = Math.min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (a[i - 1] === b[j - 1] ? 0 : 1))
    }
    previous = current
  }
  return previous[b.length]
}

function parsePositiveInt(flag: string, raw: string, unit: string, example: string): number {
  const value = Number(raw)
  if (!/^\d+$/.test(raw) || !isIntegerAtLeast(value, 1)) {
    throw new UsageError(`${flag} must be a positive whole number of ${unit}, got ${JSON.stringify(raw)} (e.g. ${flag} ${example})`)
  }
  return value
}

/**
 * `--prices P`: a DeepSeek model name (its table, peak hours included) or `HIT,MISS,OUTPUT` in USD
 * per million tokens (no peak hours). @throws UsageError naming the value and the forms accepted.
 */
function parsePrices(raw: string): Prices {
  const named = pricesOf(raw)
  if (named) return named
  const parts = raw.split(',')
  const numbers = parts.map((x) => (/^\s*(?:\d+(?:\.\d*)?|\.\d+)\s*$/.test(x) ? Number(x) : NaN))
  if (parts.length !== 3 || numbers.some((n) => !Number.isFinite(n))) {
    throw new UsageError(`--prices must be a DeepSeek model name (${Object.keys(DEEPSEEK_PRICES).join(', ')}) or HIT,MISS,OUTPUT in USD per million tokens (e.g. --prices 0.003,0.15,0.6), got ${JSON.stringify(raw)}`)
  }
  return { cacheHitInput: numbers[0], cacheMissInput: numbers[1], output: numbers[2] }
}

function parseThreshold(raw: string): number {
  const value = Number(raw)
  if (!/^(?:\d+(?:\.\d*)?|\.\d+)$/.test(raw) || !(value > 0 && value <= 1)) {
    throw new UsageError(`--threshold must be a ratio of the context window greater than 0 and at most 1, got ${JSON.stringify(raw)} (e.g. --threshold 0.8 for 80%)`)
  }
  return value
}

/** Base URL, model and key from flags, environment and defaults. The DeepSeek key is only ever
 *  paired with a DeepSeek base URL, so that pointing dsh at another server cannot leak it. */
function resolveModelOptions(flags: Map<string, string>, env: Record<string, string | undefined>, files: CliConfigFiles = {}): CliModelOptions {
  const nonEmpty = (value: string | undefined): string | undefined => (value === undefined || value === '' ? undefined : value)
  const fromFiles = configValue(files, 'baseURL')
  const urlSource = flags.has('--base-url') ? '--base-url' : nonEmpty(env.DSH_BASE_URL) ? 'DSH_BASE_URL' : fromFiles ? `"baseURL" in ${fromFiles.file}` : undefined
  const rawURL = flags.get('--base-url') ?? nonEmpty(env.DSH_BASE_URL) ?? fromFiles?.value ?? CLI_DEFAULTS.baseURL
  let url: URL
  try { url = new URL(rawURL) } catch { url = new URL('invalid:') }
  if (url.protocol !== 'http:' && url.protocol !== 'https:') {
    throw new UsageError(`${urlSource ?? 'the base URL'} must be an http(s) URL such as http://127.0.0.1:8080/v1, got ${JSON.stringify(rawURL)}`)
  }
  const baseURL = rawURL.replace(/\/+$/, '')
  const model = flags.get('--model') ?? nonEmpty(env.DSH_MODEL) ?? configValue(files, 'model')?.value ?? CLI_DEFAULTS.model
  if (model.trim() === '') throw new UsageError('--model is empty; give a model name, e.g. --model deepseek-v4-pro')

  const deepseekHost = url.hostname === new URL(CLI_DEFAULTS.baseURL).hostname
  if (deepseekHost && url.protocol !== 'https:') {
    throw new UsageError(`${urlSource ?? 'the base URL'} ${JSON.stringify(rawURL)} would send the DeepSeek API key unencrypted; use https://${url.host}`)
  }
  const keyEnv = flags.get('--api-key-env')
  if (keyEnv !== undefined) {
    if (!/^[A-Za-z_][A-Za-z0-9_]*$/.test(keyEnv)) {
      // Not echoed: a common slip is to pass the key itself.
      throw new UsageError('--api-key-env takes the NAME of an environment variable that holds the key (e.g. --api-key-env OPENROUTER_API_KEY), not the key itself')
    }
    const apiKey = nonEmpty(env[keyEnv])
    if (apiKey === undefined) throw new UsageError(`no API key: --api-key-env names ${keyEnv}, but ${keyEnv} is not set; set it (export ${keyEnv}=...) or drop the flag`)
    return { model, baseURL, apiKey, apiKeyEnv: keyEnv }
  }
  if (!deepseekHost) return { model, baseURL } // a server that needs no key, or a 401 the provider reports
  const apiKey = nonEmpty(env[CLI_DEFAULTS.apiKeyEnv])
  if (apiKey === undefined) {
    throw new UsageError(`no API key: set ${CLI_DEFAULTS.apiKeyEnv} (or --api-key-env NAME), or point --base-url at a server that needs none`)
  }
  return { model, baseURL, apiKey, apiKeyEnv: CLI_DEFAULTS.apiKeyEnv }
}

/** A setting of the configuration files and the file it comes from: the project's wins over the user's (docs/design.md §8). */
function configValue<K extends keyof CliConfig>(files: CliConfigFiles, key: K): { value: NonNullable<CliConfig[K]>; file: string } | undefined {
  for (const f of [files.project, files.user]) if (f && f.config[key] !== undefined) return { value: f.config[key]!, file: f.file }
  return undefined
}

/** `--context-window N`, else `$DSH_CONTEXT_WINDOW`, else `contextWindow` of the configuration files (docs/design.md §8). */
function runContextWindow(flags: Map<string, string>, env: Record<string, string | undefined>, files: CliConfigFiles): number | undefined {
  if (flags.has('--context-window')) return parsePositiveInt('--context-window', flags.get('--context-window')!, 'tokens', '128000')
  const raw = env.DSH_CONTEXT_WINDOW
  if (raw !== undefined && raw !== '') {
    if (!/^\d+$/.test(raw) || !isIntegerAtLeast(Number(raw), 1)) throw new UsageError(`DSH_CONTEXT_WINDOW must be a positive whole number of tokens, got ${JSON.stringify(raw)} (e.g. export DSH_CONTEXT_WINDOW=128000)`)
    return Number(raw)
  }
  return configValue(files, 'contextWindow')?.value
}

/**
 * Parses the command line (docs/design.md §8). Pure: reads only its arguments.
 *
 * `argv` is the arguments after the script (`process.argv.slice(2)`); `env` is the environment
 * (`DEEPSEEK_API_KEY`, `DSH_BASE_URL`, `DSH_MODEL`, and the variable named by `--api-key-env`;
 * empty values count as unset). Long flags take their value as the next argument or after `=`
 * (`--model=x`); `--` ends the flags. The first argument `replay` (after a leading `-C DIR`) selects the replay command.
 * A flag given twice keeps the last value. `--help`/`-h` and `--version` win over everything else,
 * so they work without any configuration.
 *
 * Key rules: `--api-key-env NAME` reads `env[NAME]`; otherwise `DEEPSEEK_API_KEY` is used, and
 * required, only when the base URL is DeepSeek's; any other base URL (e.g. a local server) gets
 * no key unless `--api-key-env` names one.
 *
 * @returns {@link CliOptions}; numbers are validated (`--context-window`, `--max-tokens`,
 *   `--summary-tokens`: positive integers, tokens; `--threshold`: a ratio in (0, 1]).
 * @throws UsageError (exit code 2) whose one-line message names the flag or variable and what to set.
 */
export function parseCliArgs(argv: readonly string[], env: Record<string, string | undefined>, files: CliConfigFiles = {}): CliOptions {
  const endOfFlags = argv.indexOf('--')
  const flagPart = endOfFlags === -1 ? argv : argv.slice(0, endOfFlags)
  if (flagPart.some((arg) => arg === '--help' || arg === '-h')) return { command: 'help' }
  if (flagPart.includes('--version')) return { command: 'version' }
  if (argv[0] === 'show') return parseShowArgs(argv.slice(1))

  // `replay` is the first argument, or follows a leading `-C DIR` (as in `git -C DIR cmd`).
  let lead = 0
  while (lead < argv.length && (argv[lead] === '-C' || argv[lead] === '--cwd' || argv[lead].startsWith('--cwd='))) lead += argv[lead].startsWith('--cwd=') ? 1 : 2
  const command = argv[lead] === 'replay' ? 'replay' : 'run'
  const flags = new Map<string, string>()
  const positionals: string[] = []
  for (let i = 0; i < argv.length; i++) {
    if (command === 'replay' && i === lead) continue
    const arg = argv[i]
    if (arg === '--') { positionals.push(...argv.slice(i + 1)); break }
    if (!arg.startsWith('-') || arg === '-') { positionals.push(arg); continue }
    const eq = arg.startsWith('--') ? arg.indexOf('=') : -1
    const name = CLI_SHORT_FLAGS[arg] ?? (eq === -1 ? arg : arg.slice(0, eq))
    const spec = CLI_FLAGS[name]
    if (spec === undefined) {
      const guess = Object.keys(CLI_FLAGS).find((known) => editDistance(name, known) <= 2)
      throw new UsageError(`unknown option ${name}${guess ? ` (did you mean ${guess}?)` : ''}; run with --help for the list`)
    }
    if (!spec.commands.includes(command)) {
      const replayFlags = Object.keys(CLI_FLAGS).filter((flag) => CLI_FLAGS[flag].commands.includes('replay') && flag !== '--help' && flag !== '--version')
      throw new UsageError(command === 'replay'
        ? `${name} does not apply to replay; replay takes ${replayFlags.join(', ')}`
        : `${name} only applies to replay: npx tsx dsh.ts replay FILE ${name} ${spec.value}`)
    }
    if (spec.value === undefined) {
      if (eq !== -1) throw new UsageError(`${name} takes no value (got ${JSON.stringify(arg)})`)
      flags.set(name, '')
      continue
    }
    let value: string | undefined
    if (eq !== -1) value = arg.slice(eq + 1)
    else {
      value = argv[i + 1]
      // A value that looks like a flag is taken as a missing value, except for a prompt.
      if (value !== undefined && name !== '--print' && value.startsWith('--')) value = undefined
      if (value !== undefined) i++
    }
    if (value === undefined) throw new UsageError(`${arg} needs a value: ${name} ${spec.value}`)
    const repeated = name === '--shell-env' ? ',' : name === '--sandbox-read' ? '\0' : undefined // these add up
    flags.set(name, repeated !== undefined && flags.has(name) ? `${flags.get(name)}${repeated}${value}` : value)
  }

  const contextWindow = command === 'run' ? runContextWindow(flags, env, files) : flags.has('--context-window') ? parsePositiveInt('--context-window', flags.get('--context-window')!, 'tokens', '128000') : undefined
  const cwd = flags.get('--cwd')
  if (cwd === '') throw new UsageError('-C/--cwd needs a directory, e.g. -C ../my-project')
  const threshold = flags.has('--threshold') ? parseThreshold(flags.get('--threshold')!) : CLI_DEFAULTS.threshold
  const json = flags.has('--json')
  const prices = flags.has('--prices') ? parsePrices(flags.get('--prices')!) : command === 'run' ? configValue(files, 'prices')?.value : undefined

  if (command === 'replay') {
    if (positionals.length === 0) throw new UsageError('replay needs a FILE: npx tsx dsh.ts replay FILE [--context-window N]')
    if (positionals.length > 1) throw new UsageError(`replay takes one FILE, got ${positionals.length} (${positionals.map((p) => JSON.stringify(p)).join(', ')})`)
    const summaryTokens = flags.has('--summary-tokens') ? parsePositiveInt('--summary-tokens', flags.get('--summary-tokens')!, 'tokens', '2000') : CLI_DEFAULTS.summaryTokens
    const format = (flags.get('--format') ?? 'auto') as CliReplayFormat
    if (!cliReplayFormats().includes(format)) throw new UsageError(`--format must be one of ${cliReplayFormats().join(', ')}, got ${JSON.stringify(format)}`)
    const real = flags.has('--base-url') || flags.has('--model') || flags.has('--api-key-env')
    return {
      command, file: positionals[0], contextWindow, threshold, json, summaryTokens, format, sidechains: flags.has('--sidechains'), ...(flags.has('--no-clear') ? { clear: false as const } : {}), ...(cwd !== undefined ? { cwd } : {}), ...(prices ? { prices } : {}),
      ...(real ? { summarizer: resolveModelOptions(flags, env) } : {}),
    }
  }

  const printed = flags.get('--print')
  if (printed !== undefined && positionals.length > 0) {
    throw new UsageError(`give the prompt once: either -p "PROMPT" or a positional "PROMPT", not both (extra: ${JSON.stringify(positionals[0])})`)
  }
  if (positionals.length > 1) {
    throw new UsageError(`the prompt must be one argument; quote it: npx tsx dsh.ts ${JSON.stringify(positionals.join(' '))}`)
  }
  const prompt = printed === '-' ? undefined : printed ?? positionals[0] // `-p -`: the prompt is read from stdin
  if (prompt !== undefined && prompt.trim() === '') throw new UsageError('the prompt is empty; give a task, e.g. -p "explain src/main.ts"')
  const maxTokens = flags.has('--max-tokens') ? parsePositiveInt('--max-tokens', flags.get('--max-tokens')!, 'tokens', '8192') : undefined
  if (maxTokens !== undefined && contextWindow !== undefined && maxTokens >= contextWindow) {
    throw new UsageError(`--max-tokens ${maxTokens} must be below --context-window ${contextWindow}: the prompt needs room too`)
  }
  const session = flags.get('--session')
  if (session === '') throw new UsageError('--session needs a file name, e.g. --session work.jsonl')
  if (flags.has('--allow-shell') && flags.has('--no-shell')) throw new UsageError('--allow-shell and --no-shell contradict each other; give one')
  const sources = ['--session', '--continue', '--resume', '--no-save'].filter((f) => flags.has(f))
  if (sources.length > 1) throw new UsageError(`${sources.join(' and ')} contradict each other: each says which session to use (--session FILE, --continue the newest, --resume a listed one, --no-save none); give one`)
  const maxSteps = flags.has('--max-steps') ? parsePositiveInt('--max-steps', flags.get('--max-steps')!, 'provider calls per turn', '50') : undefined
  const maxCost = flags.get('--max-cost'), maxCostUSD = maxCost === undefined ? undefined : Number(maxCost)
  if (maxCost !== undefined && !(/^(?:\d+(?:\.\d*)?|\.\d+)$/.test(maxCost) && maxCostUSD! > 0 && Number.isFinite(maxCostUSD))) throw new UsageError(`--max-cost must be a positive number of USD, got ${JSON.stringify(maxCost)} (e.g. --max-cost 0.5)`)
  const model = resolveModelOptions(flags, env, files)
  const shellEnv = flags.has('--shell-env') ? flags.get('--shell-env')!.split(',').filter((n) => n !== '') : undefined
  for (const name of shellEnv ?? []) {
    if (!/^[A-Za-z_][A-Za-z0-9_]*$/.test(name)) throw new UsageError(`--shell-env takes variable names (e.g. --shell-env GITHUB_TOKEN), got ${JSON.stringify(name)}`)
    if (name === model.apiKeyEnv || name === CLI_DEFAULTS.apiKeyEnv) throw new UsageError(`--shell-env ${name}: the API key variable is never given to shell commands`)
  }
  return {
    yes: flags.has('--yes'), continue: flags.has('--continue'), resume: flags.has('--resume'), noSave: flags.has('--no-save'), approvals: mergeApprovals([files.user?.config.approvals, files.project?.config.approvals]), retentionDays: files.user?.config.retentionDays ?? DEFAULT_RETENTION_DAYS, ...(configValue(files, 'sandbox') ? { sandboxConfig: configValue(files, 'sandbox')!.value } : {}),
    command, ...model, prompt, print: printed !== undefined,
    contextWindow, maxTokens, session, threshold, json, allowShell: flags.has('--allow-shell'), noShell: flags.has('--no-shell'), ...(shellEnv ? { shellEnv } : {}),
    ...(maxSteps !== undefined ? { maxSteps } : {}), ...(maxCostUSD !== undefined ? { maxCostUSD } : {}), ...(cwd !== undefined ? { cwd } : {}), ...(prices ? { prices } : {}),
    projectInstructions: !flags.has('--no-project-instructions'), ...(flags.has('--no-clear') ? { clear: false as const } : {}),
    ...(flags.has('--no-sandbox') ? { sandbox: false as const } : {}), ...(flags.has('--allow-network') ? { allowNetwork: true as const } : {}),
    ...(flags.has('--sandbox-read') ? { sandboxRead: flags.get('--sandbox-read')!.split('\0') } : {}),
  }
}

/** Where {@link runCliBasics} writes. */
export interface CliIO {
  stdout(text: string): void
  stderr(text: string): void
}

/**
 * The first part of the CLI's `main`: parses `argv` (with the settings of `context.files`), answers
 * `--help` (naming the program `context.name`) and `--version` on stdout, and reports a
 * {@link UsageError} as ONE line `dsh: …` on stderr.
 * @returns `{exitCode}` when the process should exit now (0 after help/version, 2 after a usage
 *   error), or `{options}` for the run or replay command to carry out.
 * @throws only what is not a UsageError (a bug).
 */
export function runCliBasics(argv: readonly string[], env: Record<string, string | undefined>, io: CliIO, context: { files?: CliConfigFiles; name?: string } = {}): { exitCode: number } | { options: CliRunOptions | CliReplayOptions | CliShowOptions } {
  let options: CliOptions
  try { options = parseCliArgs(argv, env, context.files) } catch (error) {
    if (!(error instanceof UsageError)) throw error
    io.stderr(`dsh: ${error.message}\n`)
    return { exitCode: error.exitCode }
  }
  if (options.command === 'help') { io.stdout(cliHelp(context.name)); return { exitCode: 0 } }
  if (options.command === 'version') { io.stdout(`dsh.ts ${VERSION}\n`); return { exitCode: 0 } }
  return { options }
}

/**
 * Whether dsh.ts (or its bundle) is the program being run, not a module being imported
 * (docs/design.md §0, docs/runtimes.md). Deno and Bun: `import.meta.main`. Node: the realpath of
 * `import.meta.url` equals the realpath of `process.argv[1]` (so a symlinked bin works). A bundle
 * without `import.meta.url` (the IIFE build for edge runtimes) is never the entry point.
 *
 * `probe` is for tests; by default it is read from this module, and `process.argv` is read only
 * when `import.meta.main` does not answer (Deno builds its Node `process` on first access, ~40 ms).
 * Async because the realpath check loads `node:fs` lazily: call it as `isEntryPoint().then(…)`,
 * not with a top-level `await`, which the IIFE bundle does not allow. Never throws.
 */
export async function isEntryPoint(probe?: { url?: string; main?: unknown; argv1?: string }): Promise<boolean> {
  const meta = import.meta as { url?: string; main?: unknown }
  const main = probe ? probe.main : meta.main
  if (typeof main === 'boolean') return main
  const url = probe ? probe.url : meta.url
  if (typeof url !== 'string' || !url.startsWith('file:')) return false
  const argv1 = probe ? probe.argv1 : (globalThis as { process?: { argv?: string[] } }).process?.argv?.[1]
  if (typeof argv1 !== 'string' || argv1 === '') return false
  try {
    const [{ realpath }, { fileURLToPath }] = await Promise.all([importNode<typeof import('node:fs/promises')>('node:fs/promises'), importNode<typeof import('node:url')>('node:url')])
    const [self, script] = await Promise.all([realpath(fileURLToPath(url)), realpath(argv1)])
    return self === script
  } catch {
    return false
  }
}

/** The CLI agent's system prompt; `{cwd}` is filled in at start. */
export const CLI_SYSTEM_PROMPT = /* @__PURE__ */ [
  'You are dsh, a careful coding agent working in the directory {cwd}.',
  'Use the tools to read, search and change files there; paths are relative to that directory.',
  'Read before you edit. Make the smallest change that does the job, and say what you changed.',
  'When you are done, answer with a short summary for the user and stop calling tools.',
].join('\n')

type NodeStream = { write(s: string, done?: () => void): boolean; isTTY?: boolean; on?(event: string, fn: (...a: any[]) => void): unknown }
type NodeProcess = {
  argv: string[]; env: Record<string, string | undefined>; cwd(): string; exitCode?: number
  stdin: any; stdout: NodeStream; stderr: NodeStream
  on(event: string, fn: (...a: any[]) => void): unknown; off(event: string, fn: (...a: any[]) => void): unknown
}

// ── terminal output: a closed reader, status and activity lines ──

/** The CLI's output streams, safe against a reader that went away (`dsh … | head -1`, `| true`). */
interface CliOutput extends CliIO {
  /** True once stdout's reader closed (EPIPE) or a write to it failed: nothing more is written there. */
  readonly stdoutClosed: boolean
  /** Why a write to stdout failed other than its reader closing (a full disk: ENOSPC), if one did. */
  readonly stdoutFailed?: string
  /** Resolves once what was written to stdout so far has been taken (or has failed). */
  flushed(): Promise<void>
  /** Called once when stdout's reader closes (the CLI cancels the running turn: nobody reads its output). */
  onStdoutClosed?: () => void
  /** Writes dsh's own terminal escapes (colour, line clearing) to stderr as they are: the caller
   *  strips whatever model or server text it puts inside. */
  stderrRaw(text: string): void
  /** Shows `text` (one row, dsh's own: not stripped) as the live line at the bottom of stderr, replacing
   *  the one shown; `undefined` removes it. Any other write removes it first, so it never mixes with output. */
  live(text: string | undefined): void
}

/**
 * Terminal control sequences and control characters, as text from a model or a server may carry
 * them (ECMA-48): ESC sequences — CSI `ESC [ … final`, OSC `ESC ] … BEL|ST` (clipboard OSC 52,
 * window title), DCS/SOS/PM/APC `ESC P|X|^|_ … ST`, and two-character escapes — their 8-bit C1
 * forms (U+0080–U+009F), every other C0 control but tab and line feed (a CR not before LF
 * included), and DEL. An unterminated string sequence is removed to the end of its line.
 */
const TERMINAL_CONTROL = /\x1b\[[\x30-\x3f]*[\x20-\x2f]*[\x40-\x7e]?|\x1b[\]PX^_][^\x07\x1b\x9c\n]*(?:\x07|\x1b\\|\x9c)?|\x1b[\x20-\x2f]*[\x30-\x7e]?|\x9b[\x30-\x3f]*[\x20-\x2f]*[\x40-\x7e]?|[\x90\x98\x9d\x9e\x9f][^\x07\x1b\x9c\n]*(?:\x07|\x1b\\|\x9c)?|\r(?!\n)|[\x00-\x08\x0b\x0c\x0e-\x1a\x1c-\x1f\x7f-\x9f]/g

/**
 * `text` without terminal control sequences (see above), for printing text a model or a server
 * chose (docs/design.md §13): what is left can neither move the cursor, set the title, write the
 * clipboard nor reprogram the terminal. Tab, line feed and CRLF stay. Works on any split of a
 * stream: every sequence needs an ESC or a C1 character, and each of those is removed.
 */
export function stripControls(text: string): string {
  return text.replace(TERMINAL_CONTROL, '')
}

/** What an approval shows as an escape: C0 but tab and LF, DEL, C1, the bidi controls, the Unicode line separators,
 *  the zero-width and invisible characters (soft hyphen, BOM, word joiners, tag characters), so that nothing shown
 *  can be hidden, reordered or drawn on a line of its own, nor break a run of blanks into short ones. */
const APPROVAL_HIDDEN = /[\u0000-\u0008\u000b-\u001f\u007f-\u009f\u00ad\u061c\u180e\u200b-\u200f\u2028\u2029\u202a-\u202e\u2060-\u2064\u2066-\u2069\ufeff\u{e0000}-\u{e007f}]/gu

/**
 * `text` as an approval or a diff must show it, every character accounted for: each control character, bidi control or
 * line separator as a visible escape (`\x1b`, `\u202e`). Unlike {@link stripControls}, which deletes them (right for
 * what is only read), nothing that then runs or is written is left out of view.
 */
function shownExactly(text: string): string {
  return text.replace(APPROVAL_HIDDEN, (c) => {
    const code = c.codePointAt(0)!
    return code <= 0xff ? `\\x${code.toString(16).padStart(2, '0')}`
      : code <= 0xffff ? `\\u${code.toString(16).padStart(4, '0')}` : `\\u{${code.toString(16)}}`
  })
}

/** One JSON line whose DEL and C1 characters are escaped as `\u00XX` (JSON.stringify escapes only
 *  C0), so that printing it cannot control a terminal; it parses to the same value. */
function jsonLine(value: unknown): string {
  return JSON.stringify(value).replace(/[\x7f-\x9f]/g, (c) => `\\u00${c.charCodeAt(0).toString(16)}`) + '\n'
}

/**
 * Wraps the process's stdout and stderr. Everything printed through `stdout` and `stderr` may hold
 * model or server text, so it is stripped of terminal controls (docs/design.md §13); `stderrRaw`
 * is for dsh's own escapes. An error on either stream (EPIPE when the reader closed, or any other
 * write error) is not thrown as an unhandled `error` event; writes to a closed stream are dropped.
 * A closed stdout calls `onStdoutClosed` once.
 */
function cliOutput(p: NodeProcess): CliOutput {
  let stdoutClosed = false, stderrClosed = false, liveShown = false
  let stdoutFailed: string | undefined
  const hide = () => { if (liveShown) { liveShown = false; if (!stderrClosed) p.stderr.write('\r\x1b[K') } }
  const out: CliOutput = {
    get stdoutClosed() { return stdoutClosed },
    get stdoutFailed() { return stdoutFailed },
    // a stream's write calls back once what came before it is taken (a stand-in without that: the next turn)
    flushed: () => new Promise((resolve) => {
      if (stdoutClosed || p.stdout.write.length < 2) setImmediate(resolve); else p.stdout.write('', () => resolve())
    }),
    stdout: (text) => { hide(); if (!stdoutClosed) p.stdout.write(stripControls(text)) },
    stderr: (text) => { hide(); if (!stderrClosed) p.stderr.write(stripControls(text)) },
    stderrRaw: (text) => { hide(); if (!stderrClosed) p.stderr.write(text) },
    live: (text) => {
      if (text === undefined) return hide()
      if (!stderrClosed) { p.stderr.write('\r\x1b[K' + text); liveShown = true }
    },
  }
  p.stdout.on?.('error', (err: any) => {
    if (stdoutClosed) return
    stdoutClosed = true
    if (err?.code !== 'EPIPE') stdoutFailed = `${err?.code ?? 'error'}: ${err?.message ?? err}` // not a reader gone
    out.onStdoutClosed?.()
  })
  p.stderr.on?.('error', () => { stderrClosed = true })
  return out
}

/** A context edit as the status line reports it: one prune, clear or compaction, with its tokens. */
export interface ContextEdit {
  /** The event that shadowed the content: `compaction/prune`, `compaction/clear`, `compaction/summary`, … */
  event: SessionEvent
  /** What the edit did, as a past-tense verb: `pruned`, `cleared`, `compacted`. */
  verb: string
  /** What was edited, e.g. `read_file big.txt` or `3 tool results (read_file a.ts, grep TODO, …)`. */
  subject: string
  /** Tokens of the shadowed content, and of what replaced it. */
  tokensBefore: number
  tokensAfter: number
  /** Seq of the (last) event that replaced the content: the pruned or cleared `tool/result`, the checkpoint. */
  replaceSeq: number
}

/** Options of {@link statusReporter}. */
export interface StatusReporterOptions {
  /** Text appended to the line of each context edit after ` · `; `undefined` or `''` for none.
   *  Default: the edit's cache cost ({@link Agent.editCost}, docs/design.md §11). */
  editNote?: (edit: ContextEdit, agent: Agent | undefined) => string | undefined
  /** ms between redraws of the live "compacting…" indicator on a TTY. Default 250. */
  indicatorIntervalMs?: number
  /**
   * The terminal's live line ({@link CliOutput.live}): given, the reporter also shows a spinner with the
   * running tool (or the model being waited for) and its elapsed time there, and draws "compacting…"
   * there too; absent, "compacting…" is written with `write` and no spinner is shown.
   */
  live?: (text: string | undefined) => void
  /** True while the live line must not be drawn (a question is asked on the terminal). */
  paused?: () => boolean
  /** What the user has typed ahead during the turn (shown on the live line), '' for nothing. */
  typed?: () => string
  /** Width of the terminal in columns: the live line is cut to fit one row. Default 80. */
  columns?: () => number | undefined
}

/** The spinner of the live line (braille dots), and ms between its frames. */
const SPINNER_FRAMES = '⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏'
const SPINNER_INTERVAL_MS = 125
/** Percentage points the occupancy or the cache-hit share must move before the status line is printed again. */
const STATUS_CHANGE_POINTS = 5
/** Verbs of the shadowing events, by event type (`compaction/<rung>`); other rungs use the rung's name. */
const EDIT_VERBS: Readonly<Record<string, string>> = { 'compaction/prune': 'pruned', 'compaction/clear': 'cleared', 'compaction/summary': 'compacted' }
/** Arguments that name what a tool call works on, in the order the activity line shows them. */
const ACTIVITY_ARGS = ['command', 'pattern', 'path', 'query', 'url', 'key']
/** Code points of a tool call's subject shown in an activity line. */
const ACTIVITY_SUBJECT_CODE_POINTS = 80
/** Code points of an error's first line shown in an activity line. */
const ACTIVITY_ERROR_CODE_POINTS = 160

/** `read_file src/a.ts`: the tool's name and the arguments that say what it works on, on one line. */
function toolSubject(name: string, rawArguments: string): string {
  let args: unknown
  try { args = JSON.parse(rawArguments) } catch { args = undefined }
  let parts: string[] = []
  if (args && typeof args === 'object' && !Array.isArray(args)) {
    const record = args as Record<string, unknown>
    parts = ACTIVITY_ARGS.filter((key) => typeof record[key] === 'string').map((key) => record[key] as string)
    if (parts.length === 0) {
      const first = Object.values(record).find((v) => typeof v === 'string' || typeof v === 'number')
      if (first !== undefined) parts = [String(first)]
    }
  }
  // At most 4 UTF-16 units per shown code point are looked at: a model's argument may be megabytes.
  const text = parts.join(' ').slice(0, 4 * ACTIVITY_SUBJECT_CODE_POINTS).replace(/\r?\n/g, '⏎').replace(/[\x00-\x1f\x7f-\x9f]/g, '')
  const points = Array.from(text)
  const label = headCodePoints(name, RECALL_HIT_CODE_POINTS) // a model's tool name may be megabytes too
  return points.length === 0 ? label : `${label} ${points.length > ACTIVITY_SUBJECT_CODE_POINTS ? points.slice(0, ACTIVITY_SUBJECT_CODE_POINTS - 1).join('') + '…' : text}`
}

/** What a tool result says about its outcome in a few words, for the activity line: `exit 1`,
 *  or the first line of an error. `undefined` for a plain success. */
function toolOutcome(result: ToolResultMessage): string | undefined {
  const text = contentText(result.content)
  const first = text.slice(0, 2 * ACTIVITY_ERROR_CODE_POINTS).split('\n')[0].replace(/[\x00-\x1f\x7f-\x9f]/g, '')
  const exit = /^exit code (\d+)$/.exec(first) // the shell tool's status line
  if (exit) return `exit ${exit[1]}`
  if (!result.isError) return undefined
  const points = Array.from(first)
  return points.length > ACTIVITY_ERROR_CODE_POINTS ? points.slice(0, ACTIVITY_ERROR_CODE_POINTS - 1).join('') + '…' : first
}

/**
 * Turns agent events into terminal output on stderr, each line starting `[dsh]` or `▸`:
 * - `▸ read_file src/a.ts (2,340 tokens)` for each tool result (its size in the context), or
 *   `▸ shell npm test → exit 1` / `▸ NAME ARGS → first line of the error`;
 * - one line per context edit, derived from any `compaction/*` event that carries `shadowedSeqs`
 *   and the replaces that follow it: `pruned read_file big.txt: 16,549 → 1,298 tokens (15,251
 *   saved)` (plus {@link StatusReporterOptions.editNote});
 * - failed compactions, overflow recoveries, provider retries (what is retried and why) and warnings;
 * - on a TTY only: a live `compacting… 2.1 s` indicator while a summary runs; with
 *   {@link StatusReporterOptions.live}, a spinner with the running tool (`⠹ shell npm test · 3.2 s`)
 *   or the model awaited, and what was typed ahead; after a step, the context occupancy
 *   `context 12,034 / 128,000 tokens (9.4%) · cost…`, with a trailing ` ~` while the figure is the
 *   chars/4 estimate rather than anchored on provider-reported usage — after the first step, then
 *   only when the occupancy or the cache-hit share moved {@link STATUS_CHANGE_POINTS} points or a
 *   context edit was reported since (docs/design.md §8).
 * Colour (dim) only on a TTY and without `NO_COLOR`.
 */
export function statusReporter(agent: () => Agent | undefined, write: (line: string) => void, tty: boolean, color: boolean, options: StatusReporterOptions = {}): (e: AgentEvent) => void {
  const paint = (s: string) => (color ? `\x1b[2m${s}\x1b[0m` : s)
  let live: { timer: ReturnType<typeof setInterval>; startedMs: number; kind: 'compaction' | 'tool' | 'model'; label: string } | undefined
  let frame = 0
  const clearLive = () => { if (live) options.live ? options.live(undefined) : write('\r\x1b[K') }
  const say = (s: string) => { clearLive(); write(paint(stripControls(s)) + '\n') } // model or server text inside, our colour around
  const stopLive = () => { if (live) { clearInterval(live.timer); clearLive(); live = undefined } }
  const drawLive = () => {
    if (!live) return
    const seconds = `${((Date.now() - live.startedMs) / 1000).toFixed(1)} s`
    if (live.kind === 'compaction' && !options.live) return write('\r\x1b[K' + paint(`[dsh] compacting… ${seconds}`))
    if (options.paused?.()) return options.live!(undefined)
    const typed = options.typed?.() ?? ''
    const text = live.kind === 'compaction' ? `[dsh] compacting… ${seconds}`
      : `${SPINNER_FRAMES[frame++ % SPINNER_FRAMES.length]} ${live.label} · ${seconds}`
    const row = Array.from(stripControls(typed ? `${text}   (typed ahead, runs after this turn: ${typed})` : text))
    const width = Math.max(40, (options.columns?.() || 80) - 1) // 0 or undefined: not known (a pipe, some PTYs)
    options.live!(paint(row.length > width ? row.slice(0, width - 1).join('') + '…' : row.join('')))
  }
  const startLive = (kind: 'compaction' | 'tool' | 'model', label: string, intervalMs: number) => {
    stopLive()
    live = { timer: setInterval(drawLive, intervalMs), startedMs: Date.now(), kind, label };
    (live.timer as any).unref?.()
    drawLive()
  }
  /** The tool call `callId` answers, from the assistant message on the surface (newest first: usually the last one). */
  const callOf = (callId: string): ToolCallBlock | undefined => {
    const nodes = agent()?.session.surface() ?? []
    for (let i = nodes.length - 1; i >= 0; i--) {
      const m = nodes[i].message
      const block = m.role === 'assistant' ? m.content.find((b) => b.type === 'tool-call' && b.id === callId) as ToolCallBlock | undefined : undefined
      if (block) return block
    }
    return undefined
  }
  const editNote = options.editNote ?? ((edit: ContextEdit, a: Agent | undefined) => {
    const cost = a?.editCost(edit.replaceSeq)
    return cost ? describeEditCost(cost) : undefined
  })
  let pending: { event: SessionEvent; seqs: number; subjects: string[]; replaced: number; tokensAfter: number; replaceSeq: number } | undefined
  /** The figures of the last status line (percentage points), and whether a rung acted since. */
  let shown: { context: number; cache: number } | undefined
  let acted = false
  const finishEdit = () => {
    const p = pending!
    pending = undefined
    const d = p.event.data as { shadowedSeqs: number[]; shadowedTokenCount: number }
    const rung = p.event.type.slice('compaction/'.length)
    const verb = EDIT_VERBS[p.event.type] ?? rung
    const n = d.shadowedSeqs.length
    const subject = p.event.type === 'compaction/summary' ? `${n} message${n === 1 ? '' : 's'} into a checkpoint`
      : n === 1 ? p.subjects[0]
      : `${n} tool results (${p.subjects.slice(0, 3).join(', ')}${n > 3 ? ', …' : ''})`
    const edit: ContextEdit = { event: p.event, verb, subject, tokensBefore: d.shadowedTokenCount, tokensAfter: p.tokensAfter, replaceSeq: p.replaceSeq }
    const note = editNote(edit, agent())
    acted = true
    const payback = (p.event.data as { paysBackAfterRequests?: number }).paysBackAfterRequests
    const pays = payback === undefined ? '' : ` · pays back after ${groupDigits(payback)} request${payback === 1 ? '' : 's'}`
    say(`[dsh] ${verb} ${subject}: ${groupDigits(edit.tokensBefore)} → ${groupDigits(edit.tokensAfter)} tokens (${groupDigits(edit.tokensBefore - edit.tokensAfter)} saved)${pays}${note ? ` · ${note}` : ''}`)
  }
  return (e) => {
    const a = agent()
    if (e.type === 'warning') return say(`[dsh] warning: ${e.message}`)
    if (e.type === 'stream') {
      // the answer streams on this line now; reasoning and a tool call's arguments are not shown: the count goes on
      if (live?.kind === 'model' && e.event.type === 'text-delta' && e.event.text !== '') stopLive()
      if (e.event.type === 'retry') {
        const { attempt, delayMs, error, maxRetries } = e.event
        const why = Array.from(error.message.slice(0, 2 * ACTIVITY_ERROR_CODE_POINTS).split('\n')[0])
        say(`[dsh] retry ${attempt}${maxRetries ? ` of ${maxRetries}` : ''} in ${(delayMs / 1000).toFixed(1)} s: ${why.length > ACTIVITY_ERROR_CODE_POINTS ? why.slice(0, ACTIVITY_ERROR_CODE_POINTS - 1).join('') + '…' : why.join('')}`)
      }
      return
    }
    const ev = e.event
    const d = ev.data as any
    // A context edit: the shadowing event, then the replace(s) that cover its seqs.
    if (ev.type.startsWith('compaction/') && Array.isArray(d.shadowedSeqs) && d.shadowedSeqs.length > 0) {
      if (pending) finishEdit()
      const subjects = (d.shadowedSeqs as number[]).map((seq) => {
        const message = a?.session.surface().node(seq)?.message
        const call = message?.role === 'tool' ? callOf(message.toolCallId) : undefined
        return call ? toolSubject(call.name, call.arguments) : `seq ${seq}`
      })
      pending = { event: ev, seqs: d.shadowedSeqs.length, subjects, replaced: 0, tokensAfter: 0, replaceSeq: ev.seq }
      return
    }
    if (pending && d?.surfaceOp?.op === 'replace') {
      pending.replaced += d.surfaceOp.end - d.surfaceOp.start + 1
      pending.tokensAfter += a?.session.surface().node(ev.seq)?.tokens ?? 0
      pending.replaceSeq = ev.seq
      if (pending.replaced >= pending.seqs) finishEdit()
      return
    }
    if (pending) finishEdit()
    const spinner = tty && options.live !== undefined
    if (live?.kind === 'model' && (ev.type === 'assistant/message' || ev.type === 'request/error' || ev.type === 'step/end')) stopLive()
    switch (ev.type) {
      case 'step/start':
        if (spinner) startLive('model', `waiting for ${a?.provider.model ?? 'the model'}`, SPINNER_INTERVAL_MS)
        return
      case 'tool/call': {
        if (!spinner) return
        const call = callOf(d.callId)
        startLive('tool', call ? toolSubject(call.name, call.arguments) : String(d.name), SPINNER_INTERVAL_MS)
        return
      }
      case 'tool/result': {
        if (live?.kind === 'tool') stopLive()
        const message = d.message as ToolResultMessage
        const call = callOf(message.toolCallId)
        const outcome = toolOutcome(message)
        const tokens = a?.session.surface().node(ev.seq)?.tokens
        const size = tokens === undefined ? '' : ` (${groupDigits(tokens)} tokens)`
        return say(`▸ ${call ? toolSubject(call.name, call.arguments) : `tool call ${message.toolCallId}`}${outcome ? ` → ${outcome}` : ''}${outcome && message.isError ? '' : size}`)
      }
      case 'compaction/start':
        if (tty && live?.kind !== 'compaction') startLive('compaction', '', options.indicatorIntervalMs ?? 250)
        return
      case 'compaction/end':
        stopLive()
        // A success was reported with its compaction/summary; a cancellation by whoever cancelled (one line).
        return d.error && d.error !== 'aborted' ? say(`[dsh] compaction failed: ${d.error}`) : undefined
      case 'recovery/retry': return say(`[dsh] context overflow recovered (replace generation ${d.generationBefore} → ${d.generationAfter}); retrying`)
      case 'step/retry': return say(`[dsh] the stream broke after output (${d.code}); the partial answer is kept, retrying the step once`)
      // Other provider errors end the turn and are reported once, by the caller's last line.
      // An input refused before sending is reported by the error itself: nothing is pruned or compacted for it.
      case 'request/error': return d.code !== 'CONTEXT_WINDOW_EXCEEDED' || d.trigger === 'input' ? undefined
        : say(/preflight: nothing was sent/.test(String(d.message)) ? `[dsh] the next request would not fit the context window (dsh's estimate; nothing was sent); pruning and compacting to recover`
          : `[dsh] context overflow reported by the provider${d.status ? ` (${d.status})` : ''}; pruning and compacting to recover`)
      case 'turn/end': stopLive(); return
      case 'step/end': {
        if (!tty || !a) return
        // Only news (docs/design.md §8): the first step, a figure moved by STATUS_CHANGE_POINTS, or a rung acted.
        const u = a.usage(), w = a.contextWindow
        const figures = { context: w ? (a.session.measure().totalTokens / w) * 100 : 0, cache: u.cacheHitShare * 100 }
        const moved = !shown || Math.abs(figures.context - shown.context) >= STATUS_CHANGE_POINTS
          || Math.abs(figures.cache - shown.cache) >= STATUS_CHANGE_POINTS
        if (!moved && !acted) return
        shown = figures
        acted = false
        return say(`[dsh] ${occupancy(a)} · ${describeSessionCost(u, costKnown(a))}`)
      }
    }
  }
}

/** `context 12,034 / 128,000 tokens (9.4%)`, ` ~` appended while the figure is an estimate (not anchored on provider usage). */
function occupancy(agent: Agent): string {
  const m = agent.session.measure(), w = agent.contextWindow
  return `context ${groupDigits(m.totalTokens)}${w ? ` / ${groupDigits(w)} tokens (${((m.totalTokens / w) * 100).toFixed(1)}%)` : ' tokens (window unknown)'}${m.anchored ? '' : ' ~'}`
}

/** USD with the digits that matter for per-request amounts: `$1.23`, `$0.0123`, `$0.000123`. */
export function formatUSD(usd: number): string {
  return `$${usd.toFixed(usd >= 1 ? 2 : usd >= 0.01 ? 4 : 6)}`
}

/**
 * Whether the CLI shows this session's cost as a number: the model has prices and every request
 * so far was priced. Otherwise every cost figure of the session says "unknown", never a number
 * beside it (a `$0` before the first request of a model without prices included).
 */
function costKnown(agent: Agent): boolean {
  return agent.provider.prices !== undefined && agent.usage().costUSD !== undefined
}

/** The status line's cost part: `$0.0123 so far, cache hits 87%` (or `cost unknown, …` when `known` is false:
 *  by default, when `u.costUSD` is undefined). */
export function describeSessionCost(u: SessionUsage, known = u.costUSD !== undefined): string {
  const cost = !known || u.costUSD === undefined ? 'cost unknown (no price for this model; --prices sets one)' : `${formatUSD(u.costUSD)} so far`
  return `${cost}, cache hits ${(u.cacheHitShare * 100).toFixed(0)}%`
}

/** The cache part of a prune / clear / compaction line: what the edit costs once and saves per request. */
export function describeEditCost(c: EditCost): string {
  const once = c.cacheCostUSD === undefined ? '' : ` (+${formatUSD(c.cacheCostUSD)} once)`
  const each = c.savedUSDPerRequest === undefined ? '' : ` (${formatUSD(c.savedUSDPerRequest)} per request)`
  const moved = c.movedTokens > 0 ? `cache: ${groupDigits(c.movedTokens)} tokens move from hit to miss${once}` : 'cache: no hit lost'
  return `${moved}; saves ${groupDigits(c.savedTokens)} tokens${each}`
}

/** `/usage`: occupancy, envelope and surface sizes, provider-reported usage so far. */
async function usageReport(agent: Agent): Promise<string> {
  const m = agent.session.measure(), w = agent.contextWindow
  let prompt = 0, completion = 0, cached = 0, calls = 0
  for await (const e of agent.session.readEvents()) {
    const u = e.type === 'assistant/message' ? (e.data as any).usage as Usage | undefined : undefined
    if (u) { calls++; prompt += u.promptTokens; completion += u.completionTokens; cached += u.cachedTokens ?? 0 }
  }
  return [
    `context: ${groupDigits(m.totalTokens)}${w ? ` / ${groupDigits(w)} tokens (${((m.totalTokens / w) * 100).toFixed(1)}%)` : ' tokens'} ${m.anchored ? '(anchored on provider usage)' : '(heuristic)'}`,
    `envelope ${groupDigits(m.envelopeTokens)} + surface ${groupDigits(m.surfaceTokens)} tokens in ${m.nodes.length} messages; ${agent.session.seq} log events; replace generation ${agent.session.replaceGeneration}`,
    `provider usage over ${calls} calls: prompt ${groupDigits(prompt)} (cached ${groupDigits(cached)}), completion ${groupDigits(completion)} tokens`,
    ...costReport(agent.usage(), costKnown(agent)),
  ].join('\n') + '\n'
}

/** The cost lines of `/usage` (docs/design.md §11). */
function costReport(u: SessionUsage, known: boolean): string[] {
  const usd = (t: TokenTally) => (!known || t.costUSD === undefined ? 'cost unknown' : formatUSD(t.costUSD))
  const line = (name: string, t: TokenTally) =>
    `${name}: ${t.requests} request(s), input ${groupDigits(t.inputTokens)} tokens (${groupDigits(t.cachedInputTokens)} cache hits, ${groupDigits(t.uncachedInputTokens)} misses), output ${groupDigits(t.outputTokens)} tokens, ${usd(t)}`
  return [
    `cost: ${describeSessionCost(u, known)}${u.reportedCacheRequests < u.requests ? ` (cache hits: provider-reported for ${u.reportedCacheRequests} of ${u.requests} requests, modelled for the rest)` : ' (cache hits as reported by the provider)'}`,
    line('  conversation', u.conversation),
    line('  summaries', u.summary),
  ]
}

/** `resumed s.jsonl: 3 turns, 12,034 tokens in context; last active 5 min ago: "fix the test"`, or
 *  `undefined` when this open did not resume a session (a new one, or a turn already ran). */
async function resumeLine(session: Session, name: string, nowMs: number): Promise<string | undefined> {
  // Session.open appends session/resume and its repairs last: walk back to it (a few events).
  let at = session.seq - 1
  for (; at >= 0; at--) {
    const e = await session.readEvent(at)
    if (e.type === 'session/resume') break
    if (e.type === 'turn/start' || e.type === 'session/start') return undefined
  }
  if (at <= 0) return undefined
  const last = await session.readEvent(at - 1)
  const input = session.surface().findLast((n) => n.message.role === 'user')
  const text = input ? contentText(input.message.content).slice(0, 1000).replace(/\s+/g, ' ').trim() : ''
  const points = Array.from(text)
  const quoted = text === '' ? '' : `: "${points.length > 60 ? points.slice(0, 59).join('') + '…' : text}"`
  const turns = session.turn.turn
  return `[dsh] resumed ${name}: ${turns} turn${turns === 1 ? '' : 's'}, ${groupDigits(session.measure().totalTokens)} tokens in context; last active ${agoText(nowMs - last.time)}${quoted}`
}

function agoText(ms: number): string {
  const s = Math.max(0, Math.round(ms / 1000))
  if (s < 60) return `${s} s ago`
  if (s < 3600) return `${Math.round(s / 60)} min ago`
  if (s < 86_400) return `${Math.round(s / 3600)} h ago`
  return `${Math.round(s / 86_400)} days ago`
}

// ── 11.1 Configuration files and trust (docs/design.md §8 "Configuration") ──

/** The project's own configuration, relative to its directory. Untrusted until the user trusts the directory. */
export const PROJECT_CONFIG_FILE = '.dsh/config.json'
/** Largest configuration file read, in bytes (a config is a few hundred; this stops a link to a device or a huge file). */
const CONFIG_MAX_BYTES = 262_144 // 256 KiB
/** Kept sessions older than this many days are removed when dsh starts (config `retentionDays`). */
const DEFAULT_RETENTION_DAYS = 30
/** The tools whose calls are approved in interactive mode: those that change files or run commands. */
const APPROVAL_TOOLS: readonly string[] = ['write_file', 'edit_file', 'shell']

/** What runs without asking: every call of `tools`, and shell commands starting with one of `commands` (prefixes). */
export interface CliApprovals { tools: string[]; commands: string[] }

/** What the user's configuration remembers for one directory (keyed by its real path). */
export interface CliProjectMemory {
  /** The user trusts the directory's `.dsh/config.json`, as it was then: see {@link CliProjectMemory.trustedSha256}. */
  trusted?: boolean
  /** SHA-256 (hex) of the `.dsh/config.json` the user trusted. A file that changed since (a `git pull` could turn the
   *  sandbox off or approve the shell) is asked about again; without a terminal it is ignored, with one line. */
  trustedSha256?: string
  /** The answer to "allow shell commands here?". */
  shell?: boolean
  /** "Always" answers given at approval questions. */
  approvals?: CliApprovals
}

/**
 * A configuration file, checked (docs/design.md §8): the user's `$XDG_CONFIG_HOME/dsh/config.json`
 * (else `~/.config/dsh/config.json`) or a project's `.dsh/config.json`. `retentionDays` and
 * `projects` are read from the user's file only.
 */
export interface CliConfig {
  model?: string
  /** An http(s) URL; the same rules as `--base-url`. */
  baseURL?: string
  /** Tokens. */
  contextWindow?: number
  /** As `--prices`: a DeepSeek model name or `HIT,MISS,OUTPUT` in USD per million tokens. */
  prices?: Prices
  approvals?: CliApprovals
  /** The shell sandbox's settings (`false` turns it off), carried as they are written. */
  sandbox?: boolean | Record<string, unknown>
  /** Days a kept session stays after its last change. Default 30. */
  retentionDays?: number
  /** What dsh remembers per directory; written by dsh (trust, the shell answer, "always" answers). */
  projects?: Record<string, CliProjectMemory>
}

/** One configuration file: where it is and what it sets. */
export interface CliConfigFile {
  file: string
  config: CliConfig
  /** SHA-256 (hex) of the file's bytes as they were read. */
  sha256?: string
}
/** The files settings come from: the user's, and the project's once its directory is trusted (it wins over the user's). */
export interface CliConfigFiles { user?: CliConfigFile; project?: CliConfigFile }

const PROJECT_CONFIG_KEYS: readonly string[] = ['model', 'baseURL', 'contextWindow', 'prices', 'approvals', 'sandbox']
const USER_CONFIG_KEYS: readonly string[] = ['model', 'baseURL', 'contextWindow', 'prices', 'approvals', 'sandbox', 'retentionDays', 'projects']

/** A value as an error message shows it: JSON, at most 60 code points. */
function shownValue(value: unknown): string {
  const text = JSON.stringify(value) ?? String(value)
  const points = Array.from(text)
  return points.length > 60 ? points.slice(0, 59).join('') + '…' : text
}

/** `approvals` of a config: `{tools: [...], commands: [...]}`, both optional. `where` names the key for errors. */
/** Control characters (C0 with line breaks and NUL, DEL, C1, Unicode line separators and bidi controls): a setting that
 *  holds one could draw lines of its own into the trust question, reorder what it shows, or end a path early. */
const CONTROL_CHARS = /[\u0000-\u001f\u007f-\u009f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]/
/** The most entries an approvals list or `sandbox.read` may have, so that the trust question can still show them. */
const APPROVALS_MAX_ITEMS = 50
/** A list setting of `count` entries (`what`) over {@link APPROVALS_MAX_ITEMS} is a UsageError naming `where`. */
function refuseLongList(where: string, count: number, what: string): void {
  if (count > APPROVALS_MAX_ITEMS) throw new UsageError(`${where} holds ${count} ${what}, over the ${APPROVALS_MAX_ITEMS} a list may have (a question about them would not fit a screen)`)
}
/** The longest text setting, UTF-16 units: a longer one would scroll the rest of the trust question off the screen. */
const SETTING_MAX_UNITS = 300

/** A setting's text: a non-empty string on one line of at most {@link SETTING_MAX_UNITS}, without control characters. */
const settingText = (v: unknown): v is string => typeof v === 'string' && v.trim() !== '' && v.length <= SETTING_MAX_UNITS
  && !CONTROL_CHARS.test(v)

function configApprovals(value: unknown, where: string): CliApprovals {
  if (!isRecord(value)) throw new UsageError(`${where} must be an object such as {"tools": ["edit_file"], "commands": ["npm test"]}, got ${shownValue(value)}`)
  for (const key of Object.keys(value)) if (key !== 'tools' && key !== 'commands') throw new UsageError(`${where}: unknown key "${key}"; the keys are tools, commands`)
  const list = (key: 'tools' | 'commands'): string[] => {
    const items = value[key] ?? []
    if (!Array.isArray(items) || !items.every(settingText)) throw new UsageError(`${where}.${key} must be a list of ${key === 'tools' ? 'tool names' : 'command prefixes'}, got ${shownValue(items)}`)
    const distinct = [...new Set(items)]
    refuseLongList(`${where}.${key}`, distinct.length, `different ${key === 'tools' ? 'tool names' : 'command prefixes'}`)
    return distinct
  }
  const tools = list('tools')
  for (const tool of tools) if (!APPROVAL_TOOLS.includes(tool)) throw new UsageError(`${where}.tools: ${JSON.stringify(tool)} is not a tool that asks; the tools are ${APPROVAL_TOOLS.join(', ')}`)
  return { tools, commands: list('commands').map((c) => c.trim()) }
}

/**
 * Checks the text of a configuration file (`scope`: the user's or a project's). Pure.
 * @throws UsageError naming `file`, the key and what it must be (bad JSON: the parser's message).
 */
export function parseCliConfig(text: string, file: string, scope: 'user' | 'project'): CliConfig {
  let raw: unknown
  try { raw = JSON.parse(text) } catch (err) { throw new UsageError(`${file}: not valid JSON (${(err as Error).message}); fix it, or move it away to start without it`) }
  if (!isRecord(raw)) throw new UsageError(`${file}: must hold a JSON object such as {"model": "deepseek-v4-pro"}, got ${shownValue(raw)}`)
  const keys = scope === 'user' ? USER_CONFIG_KEYS : PROJECT_CONFIG_KEYS
  const bad = (key: string, what: string, value: unknown) => new UsageError(`${file}: "${key}" must be ${what}, got ${shownValue(value)}`)
  const out: CliConfig = {}
  for (const [key, value] of Object.entries(raw)) {
    if (!keys.includes(key)) {
      const guess = keys.find((k) => editDistance(k.toLowerCase(), key.toLowerCase()) <= 2)
      const why = guess ? ` (did you mean "${guess}"?)` : USER_CONFIG_KEYS.includes(key) ? ' (it is read from the user configuration only)' : ''
      throw new UsageError(`${file}: unknown key "${key}"${why}; the keys are ${keys.join(', ')}`)
    }
    if (key === 'model') {
      if (!settingText(value)) throw bad(key, 'a model name such as "deepseek-v4-pro"', value)
      out.model = value
    } else if (key === 'baseURL') {
      let ok = settingText(value) && /^https?:\/\//i.test(value) // the URL parser drops a line break: the text must not
      try { if (ok) new URL(value as string) } catch { ok = false }
      if (!ok) throw bad(key, 'an http(s) URL such as "http://127.0.0.1:8080/v1"', value)
      out.baseURL = value as string
    } else if (key === 'contextWindow' || key === 'retentionDays') {
      if (!isIntegerAtLeast(value, 1)) throw bad(key, key === 'contextWindow' ? 'a positive whole number of tokens such as 131072' : 'a positive whole number of days such as 30', value)
      out[key] = value
    } else if (key === 'prices') {
      if (typeof value !== 'string') throw bad(key, `a DeepSeek model name or "HIT,MISS,OUTPUT" in USD per million tokens such as "0.003,0.15,0.6"`, value)
      try { out.prices = parsePrices(value) } catch (err) { throw new UsageError(`${file}: "prices" ${(err as Error).message.replace(/^--prices /, '').replace(/\(e\.g\. --prices /, '(e.g. ')}`) }
    } else if (key === 'approvals') out.approvals = configApprovals(value, `${file}: "approvals"`)
    else if (key === 'sandbox') {
      if (typeof value !== 'boolean' && !isRecord(value)) throw bad(key, 'true, false or {"allowNetwork": false, "read": ["~/.npmrc"]}', value)
      if (isRecord(value)) {
        for (const k of Object.keys(value)) {
          if (k !== 'allowNetwork' && k !== 'read') throw new UsageError(`${file}: "sandbox"."${k}" is not a sandbox setting; known: allowNetwork, read`)
        }
        if (value.allowNetwork !== undefined && typeof value.allowNetwork !== 'boolean') throw bad('sandbox.allowNetwork', 'true or false', value.allowNetwork)
        if (value.read !== undefined && !(Array.isArray(value.read) && value.read.every(settingText))) throw bad('sandbox.read', 'an array of paths', value.read)
        if (Array.isArray(value.read)) refuseLongList(`${file}: "sandbox".read`, value.read.length, 'paths')
      }
      out.sandbox = value
    } else if (key === 'projects') {
      if (!isRecord(value)) throw bad(key, 'an object keyed by directory (dsh writes it)', value)
      out.projects = {}
      for (const [dir, memory] of Object.entries(value)) {
        const where = `${file}: "projects"[${JSON.stringify(dir)}]`
        if (!isRecord(memory)) throw new UsageError(`${where} must be an object such as {"trusted": true}, got ${shownValue(memory)}`)
        const entry: CliProjectMemory = {}
        for (const [k, v] of Object.entries(memory)) {
          if (k === 'trusted' || k === 'shell') {
            if (typeof v !== 'boolean') throw new UsageError(`${where}.${k} must be true or false, got ${shownValue(v)}`)
            entry[k] = v
          } else if (k === 'trustedSha256') {
            if (typeof v !== 'string' || !/^[0-9a-f]{64}$/.test(v)) throw new UsageError(`${where}.${k} must be the SHA-256 of the trusted file in hex (dsh writes it), got ${shownValue(v)}`)
            entry[k] = v
          } else if (k === 'approvals') entry.approvals = configApprovals(v, `${where}.approvals`)
          else throw new UsageError(`${where}: unknown key "${k}"; the keys are trusted, trustedSha256, shell, approvals`)
        }
        out.projects[dir] = entry
      }
    }
  }
  return out
}

/** Where the CLI keeps the user's settings: `$XDG_CONFIG_HOME/dsh/NAME`, else `~/.config/dsh/NAME` (undefined without either). */
function cliConfigFile(env: Record<string, string | undefined>, name: string): string | undefined {
  const base = env.XDG_CONFIG_HOME || (env.HOME ? `${env.HOME}/.config` : env.APPDATA)
  return base ? `${base}/dsh/${name}` : undefined
}

/** The CLI's own directories, which its tools never write: its settings (`$XDG_CONFIG_HOME/dsh`) and kept sessions. */
function cliOwnDirs(env: Record<string, string | undefined>): string[] {
  const settings = cliConfigFile(env, 'config.json'), sessions = sessionsRoot(env)
  return [settings?.slice(0, -'/config.json'.length), sessions?.slice(0, -'/sessions'.length)]
    .filter((d): d is string => d !== undefined)
}

/** Reads and checks a configuration file; undefined when there is none. @throws UsageError for one that is unreadable, too big or wrong. */
async function readCliConfig(file: string, scope: 'user' | 'project'): Promise<CliConfigFile | undefined> {
  const fs = await importNode<typeof import('node:fs/promises')>('node:fs/promises')
  let bytes: Uint8Array
  try {
    const stat = await fs.stat(file)
    if (!stat.isFile()) throw new UsageError(`${file} is not a regular file; a configuration file holds JSON`)
    if (stat.size > CONFIG_MAX_BYTES) throw new UsageError(`${file} is ${groupDigits(stat.size)} bytes, over the ${groupDigits(CONFIG_MAX_BYTES)} bytes a configuration file may have`)
    bytes = await fs.readFile(file)
  } catch (err: any) {
    if (err instanceof UsageError) throw err
    if (err?.code === 'ENOENT' || err?.code === 'ENOTDIR') return undefined
    throw new UsageError(`cannot read ${file}: ${err?.message ?? err}; fix its permissions or move it away`)
  }
  const { createHash } = await importNode<typeof import('node:crypto')>('node:crypto')
  const sha256 = createHash('sha256').update(bytes).digest('hex')
  return { file, config: parseCliConfig(new TextDecoder().decode(bytes), file, scope), sha256 }
}

/**
 * Changes the user's configuration file (what dsh remembers): reads it as JSON, lets `edit` change
 * it, writes it back whole (a temp file renamed over it, mode 0600, its directory 0700); the user's
 * own keys stay as they are. Returns an error message instead of throwing.
 */
async function editUserConfig(file: string, edit: (raw: Record<string, any>) => void): Promise<string | undefined> {
  const fs = await importNode<typeof import('node:fs/promises')>('node:fs/promises')
  try {
    let raw: Record<string, any> = {}
    try {
      const parsed = JSON.parse(await fs.readFile(file, 'utf8'))
      if (isRecord(parsed)) raw = parsed
    } catch (err: any) { if (err?.code !== 'ENOENT') throw err }
    edit(raw)
    await fs.mkdir(file.slice(0, file.lastIndexOf('/')), { recursive: true, mode: 0o700 })
    const temp = `${file}.${Date.now()}-${randomId()}.tmp`
    await fs.writeFile(temp, JSON.stringify(raw, null, 2) + '\n', { mode: 0o600 })
    await fs.rename(temp, file)
    return undefined
  } catch (err) { return `could not write ${file}: ${(err as Error).message}` }
}

/** The memory of `dir` in a raw user configuration, created when missing. */
function projectMemory(raw: Record<string, any>, dir: string): Record<string, any> {
  if (!isRecord(raw.projects)) raw.projects = {}
  if (!isRecord(raw.projects[dir])) raw.projects[dir] = {}
  return raw.projects[dir]
}

/** The settings of a project config in a few lines, for the trust question. */
function describeConfig(config: CliConfig): string {
  const lines: string[] = []
  if (config.model) lines.push(`  model ${shownExactly(config.model)}`)
  if (config.contextWindow) lines.push(`  contextWindow ${groupDigits(config.contextWindow)} tokens`)
  if (config.prices) lines.push(`  prices ${config.prices.cacheHitInput},${config.prices.cacheMissInput},${config.prices.output} USD per million tokens`)
  // the long lists first, then what matters most nearest the question: a long list cannot scroll those away
  if (isRecord(config.sandbox)) lines.push(`  sandbox ${shownExactly(JSON.stringify(config.sandbox))}`)
  if (config.approvals?.commands.length) lines.push(`  approvals: commands run without asking when they start with ${config.approvals.commands.map((c) => `"${shownExactly(c)}"`).join(', ')}`)
  if (config.approvals) lines.push(`  approvals: tools that run without asking: ${config.approvals.tools.join(', ') || 'none'}`)
  if (typeof config.sandbox === 'boolean') lines.push(`  sandbox ${config.sandbox}`)
  // last, right above the question: where the conversation and the key go
  if (config.baseURL) lines.push(`  baseURL ${shownExactly(config.baseURL)}  (model requests, with your API key if one is set, go there)`)
  return lines.join('\n') || '  (no settings)'
}

/**
 * The project's `.dsh/config.json`, when its directory is trusted (docs/design.md §8): a cloned
 * repository could point the base URL — and the API key — at an attacker, pre-approve tools or turn
 * the sandbox off, so the file applies only once the user trusts the directory. Trust is asked on a
 * terminal (and remembered in the user's file); without one the file is ignored with one line.
 * @throws UsageError for a bad file in a trusted directory (or one the user is asked about).
 */
async function projectConfig(dir: string, user: CliConfigFile | undefined, userFile: string | undefined, terminal: Terminal | undefined, io: CliIO): Promise<{ exists: boolean; used?: CliConfigFile }> {
  const file = `${dir}/${PROJECT_CONFIG_FILE}`
  const fs = await importNode<typeof import('node:fs/promises')>('node:fs/promises')
  if (!(await fs.lstat(file).then(() => true, () => false))) return { exists: false }
  const memory = user?.config.projects?.[dir]
  // a trusted directory's file is read (a bad one stops the run) and used while it is the file the user trusted
  const found = memory?.trusted === true || terminal ? await readCliConfig(file, 'project') : undefined
  if (memory?.trusted === true && found?.sha256 !== undefined && found.sha256 === memory.trustedSha256) return { exists: true, used: found }
  const changed = memory?.trusted === true ? `it changed since you trusted ${dir}` : `${dir} is not trusted`
  if (!terminal) {
    io.stderr(`[dsh] ignoring ${PROJECT_CONFIG_FILE}: ${changed}, so none of its settings (its baseURL included) are used; run dsh here interactively once to ${memory?.trusted === true ? 'look at it again' : 'trust it'}\n`)
    return { exists: true }
  }
  if (!found) return { exists: false }
  io.stderr(`This directory has its own dsh configuration, ${PROJECT_CONFIG_FILE}${memory?.trusted === true ? ` (${changed})` : ''}:\n${describeConfig(found.config)}\n`)
  const trusted = await terminal.askYesNo(`Trust ${dir} and use it? (remembered${userFile ? ` in ${userFile}` : ''}) [y/N] `)
  if (terminal.interrupted) throw new UsageError('interrupted at the question: nothing was remembered', 130)
  if (!trusted) { io.stderr(`[dsh] ${PROJECT_CONFIG_FILE} ignored for this run\n`); return { exists: true } }
  const problem = userFile ? await editUserConfig(userFile, (raw) => {
    Object.assign(projectMemory(raw, dir), { trusted: true, trustedSha256: found.sha256 })
  }) : 'no configuration directory ($XDG_CONFIG_HOME or $HOME)'
  if (problem) io.stderr(`[dsh] trusted for this run only: ${problem}\n`)
  return { exists: true, used: found }
}

/** What {@link main} learns before it parses the arguments for a run: the directory, the configuration files, the terminal. */
interface RunPreparation {
  /** The working directory, real path (as given when it cannot be resolved: main reports that). */
  dir: string
  files: CliConfigFiles
  userFile?: string
  /** Whether the directory has a `.dsh/config.json` (used or not). */
  projectExists: boolean
  terminal?: Terminal
}

/**
 * What main needs before the configuration is read: the directory (`-C`) and whether the run is
 * one-shot (a prompt, `-p`, `--json`). Undefined for help, version, `show` and `replay`, which
 * read no configuration. Lenient: {@link parseCliArgs} reports bad arguments.
 */
function cliRunHints(argv: readonly string[]): { cwd?: string; oneShot: boolean } | undefined {
  const end = argv.indexOf('--')
  const flagPart = end === -1 ? argv : argv.slice(0, end)
  if (flagPart.some((a) => a === '--help' || a === '-h' || a === '--version') || argv[0] === 'show') return undefined
  let lead = 0
  while (lead < argv.length && (argv[lead] === '-C' || argv[lead] === '--cwd' || argv[lead].startsWith('--cwd='))) lead += argv[lead].startsWith('--cwd=') ? 1 : 2
  if (argv[lead] === 'replay') return undefined
  let cwd: string | undefined
  let oneShot = end !== -1 && argv.length > end + 1
  for (let i = 0; i < flagPart.length; i++) {
    const arg = flagPart[i]
    if (!arg.startsWith('-') || arg === '-') { oneShot = true; continue }
    const eq = arg.startsWith('--') ? arg.indexOf('=') : -1
    const name = CLI_SHORT_FLAGS[arg] ?? (eq === -1 ? arg : arg.slice(0, eq))
    const value = CLI_FLAGS[name]?.value === undefined ? undefined : eq !== -1 ? arg.slice(eq + 1) : flagPart[++i]
    if (name === '--cwd') cwd = value
    if (name === '--print' || name === '--json') oneShot = true
  }
  return { cwd, oneShot }
}

/**
 * Reads the configuration of a run (docs/design.md §8): the user's file, then the project's, whose
 * trust may be asked on the terminal — which opens here, once, for the whole run (a second
 * readline would lose lines the first had read). A bad file: one line, exit code 2.
 */
async function prepareRun(hints: { cwd?: string; oneShot: boolean }, p: NodeProcess, io: CliOutput): Promise<RunPreparation | { exitCode: number }> {
  const [path, fs] = await Promise.all([importNode<typeof import('node:path')>('node:path'), importNode<typeof import('node:fs/promises')>('node:fs/promises')])
  const cwd = path.resolve(p.cwd(), hints.cwd ?? '.')
  const dir = await fs.realpath(cwd).catch(() => undefined)
  if (dir === undefined || !(await fs.stat(dir)).isDirectory()) return { dir: cwd, files: {}, projectExists: false } // main says what is wrong with it
  const userFile = cliConfigFile(p.env, 'config.json')
  let terminal: Terminal | undefined
  try {
    const user = userFile ? await readCliConfig(userFile, 'user') : undefined
    terminal = !hints.oneShot && p.stdin.isTTY ? await openTerminal(p, io) : undefined
    const project = await projectConfig(dir, user, userFile, terminal, io)
    return { dir, files: { ...(user ? { user } : {}), ...(project.used ? { project: project.used } : {}) }, userFile, projectExists: project.exists, terminal }
  } catch (err) {
    terminal?.close()
    if (err instanceof UsageError) { io.stderr(`dsh: ${err.message}\n`); return { exitCode: err.exitCode } }
    throw err
  }
}

/**
 * Whether the shell tool is offered (docs/design.md §8). `--allow-shell` / `--no-shell` decide for
 * this run. Otherwise, interactively: the answer remembered for this directory in the user's
 * configuration, else shell approvals of the configuration files, else the question (whose answer
 * is remembered there). One-shot runs: only when the configuration approves shell commands.
 */
async function shellPermission(options: CliRunOptions, cwd: string, env: Record<string, string | undefined>, terminal: Terminal | undefined, io: CliIO): Promise<boolean> {
  if (options.allowShell) return true
  if (options.noShell) return false
  cwd = await (await importNode<typeof import('node:fs/promises')>('node:fs/promises')).realpath(cwd).catch(() => cwd)
  const file = cliConfigFile(env, 'config.json')
  const user = file ? await readCliConfig(file, 'user').catch(() => undefined) : undefined
  const approvals = mergeApprovals([options.approvals, user?.config.projects?.[cwd]?.approvals])
  const approved = approvals.tools.includes('shell') || approvals.commands.length > 0
  if (!terminal) return approved
  const remembered = user?.config.projects?.[cwd]?.shell // cwd: the real path (main's)
  if (typeof remembered === 'boolean') {
    io.stderr(`[dsh] shell commands ${remembered ? 'allowed' : 'not allowed'} in this directory (remembered in ${file}; /permissions changes it; --allow-shell or --no-shell decide for one run)\n`)
    return remembered
  }
  if (approved) return true
  const allowed = await terminal.askYesNo(`Allow the agent to run shell commands in ${cwd}? (remembered for this directory) [y/N] `)
  if (terminal.interrupted) throw new UsageError('interrupted at the question: nothing was remembered', 130)
  const problem = file ? await editUserConfig(file, (raw) => { projectMemory(raw, cwd).shell = allowed }) : 'no configuration directory ($XDG_CONFIG_HOME or $HOME)'
  if (problem) io.stderr(`[dsh] could not remember the answer: ${problem}\n`)
  return allowed
}

/** Blanks (spaces, tabs, any Unicode space) in a row beyond which a command's approval shows their count instead (a
 *  run pushes the rest away); in a diff, where indentation is legitimate, beyond {@link DIFF_BLANK_RUN}. */
const APPROVAL_BLANK_RUN = 16
const DIFF_BLANK_RUN = 80
/** A run of more than `max` blanks (no line feed), compiled once per limit. */
const blankRun = (max: number): RegExp => new RegExp(`[^\\S\\n]{${max + 1},}`, 'g')
const APPROVAL_BLANKS = /* @__PURE__ */ blankRun(APPROVAL_BLANK_RUN), DIFF_BLANKS = /* @__PURE__ */ blankRun(DIFF_BLANK_RUN)

/** `text` with each run that `blanks` matches as `⟨N blanks⟩`. */
const collapseBlanks = (text: string, blanks: RegExp): string =>
  text.replace(blanks, (run) => ` ⟨${groupDigits(run.length)} blanks⟩ `)

/** A shell command's lines as its approval shows them: {@link shownExactly}, a long run of blanks as `⟨N blanks⟩`. */
const commandLines = (command: string): string[] =>
  shownExactly(command).split('\n').map((line) => collapseBlanks(line, APPROVAL_BLANKS))

/**
 * A shell command as its approval shows it ({@link commandLines}): one line as it is; more with their numbers, a run of
 * blank lines as one line, so that a command cannot scroll its first lines out of view above the question unnoticed.
 */
function shownCommand(lines: readonly string[]): string {
  if (lines.length === 1) return `$ ${lines[0]}\n`
  const out = [`$ (a command of ${lines.length} lines)`]
  for (let i = 0; i < lines.length; i++) {
    let j = i
    while (lines[i].trim() === '' && j + 1 < lines.length && lines[j + 1].trim() === '') j++
    out.push(j > i ? `  ${i + 1}–${j + 1}│ (${j - i + 1} blank lines)` : `  ${String(i + 1).padStart(3)}│ ${lines[i]}`)
    i = j
  }
  return out.join('\n') + '\n'
}

/** The union of approvals (each tool and prefix once). */
function mergeApprovals(list: readonly (CliApprovals | undefined)[]): CliApprovals {
  const tools = new Set<string>(), commands = new Set<string>()
  for (const a of list) { for (const t of a?.tools ?? []) tools.add(t); for (const c of a?.commands ?? []) commands.add(c) }
  return { tools: [...tools], commands: [...commands] }
}

// ── 11.2 Approvals, diffs and undo (docs/design.md §8 "Approvals, diffs and undo") ──

/** Lines of the diff printed with each write and edit; the rest is counted in one line. */
const DIFF_SHOWN_LINES = 40
/** Lines of one file's diff `/diff` prints. */
const DIFF_COMMAND_LINES = 400
/** Unchanged lines shown around each change (as `diff -u`). */
const DIFF_CONTEXT_LINES = 3
/** Myers' search stops after this many edits, or after about this many steps (edits × lines): the
 *  middle is then shown as one deletion and one insertion, so two big unrelated files diff fast. */
const DIFF_MAX_EDITS = 2_000
const DIFF_MAX_STEPS = 20_000_000

/** One line of a diff: kept (' '), removed ('-') or added ('+'), with its line feed if it has one. */
export type DiffLine = [' ' | '-' | '+', string]

/** The lines of `text`, each with its line feed (the last may have none). */
function textLines(text: string): string[] {
  const out = text.split('\n').map((line, i, all) => (i < all.length - 1 ? line + '\n' : line))
  if (out.at(-1) === '') out.pop()
  return out
}

/**
 * The line edits that turn `a` into `b`: the common head and tail kept, then Myers' greedy
 * algorithm ("An O(ND) Difference Algorithm and Its Variations", 1986) on the middle, which finds
 * a shortest edit script in O((N+M)·D) time and O(D²) memory; past {@link DIFF_MAX_EDITS} edits
 * the middle is one deletion and one insertion.
 */
export function diffLines(a: readonly string[], b: readonly string[]): DiffLine[] {
  let head = 0
  while (head < a.length && head < b.length && a[head] === b[head]) head++
  let tail = 0
  while (tail < a.length - head && tail < b.length - head && a[a.length - 1 - tail] === b[b.length - 1 - tail]) tail++
  const A = a.slice(head, a.length - tail), B = b.slice(head, b.length - tail)
  const n = A.length, m = B.length
  const limit = Math.min(n + m, DIFF_MAX_EDITS, Math.floor(DIFF_MAX_STEPS / (n + m + 1)) + 1)
  const off = limit + 1
  const v = new Int32Array(2 * limit + 3) // v[off + k]: the furthest x reached on diagonal k
  const trace: Int32Array[] = [] // v around diagonals -d-1 … d+1 before round d, for the walk back
  let edits = -1
  search: for (let d = 0; d <= limit; d++) {
    trace.push(v.slice(off - d - 1, off + d + 2))
    for (let k = -d; k <= d; k += 2) {
      let x = k === -d || (k !== d && v[off + k - 1] < v[off + k + 1]) ? v[off + k + 1] : v[off + k - 1] + 1
      let y = x - k
      while (x < n && y < m && A[x] === B[y]) { x++; y++ }
      v[off + k] = x
      if (x >= n && y >= m) { edits = d; break search }
    }
  }
  const middle: DiffLine[] = []
  if (edits === -1) {
    for (let i = m - 1; i >= 0; i--) middle.push(['+', B[i]])
    for (let i = n - 1; i >= 0; i--) middle.push(['-', A[i]])
  } else {
    let x = n, y = m
    for (let d = edits; d >= 0; d--) {
      const saved = trace[d]
      const at = (k: number): number => saved[k + d + 1]
      const k = x - y
      const prevK = k === -d || (k !== d && at(k - 1) < at(k + 1)) ? k + 1 : k - 1
      const prevX = at(prevK), prevY = prevX - prevK
      while (x > prevX && y > prevY) { x--; y--; middle.push([' ', A[x]]) }
      if (d > 0) middle.push(x === prevX ? ['+', B[--y]] : ['-', A[--x]])
    }
  }
  middle.reverse()
  return [...a.slice(0, head).map((l): DiffLine => [' ', l]), ...middle, ...a.slice(a.length - tail).map((l): DiffLine => [' ', l])]
}

/**
 * A unified diff (`diff -u`, three lines of context) of `before` → `after` for the file `name`,
 * as lines without line feeds; `before` undefined: a new file. A last line without a line feed is
 * followed by `\ No newline at end of file`. An empty list when nothing changed.
 */
export function unifiedDiff(before: string | undefined, after: string, name: string): string[] {
  const ops = diffLines(before === undefined ? [] : textLines(before), textLines(after))
  const changes = ops.flatMap((op, i) => (op[0] === ' ' ? [] : [i]))
  if (changes.length === 0 && before !== undefined) return []
  const startA: number[] = [], startB: number[] = []
  let lineA = 0, lineB = 0
  for (const [op] of ops) { startA.push(lineA); startB.push(lineB); if (op !== '+') lineA++; if (op !== '-') lineB++ }
  const out = [before === undefined ? '--- /dev/null' : `--- a/${name}`, `+++ b/${name}`]
  for (let c = 0; c < changes.length;) {
    let last = c
    while (last + 1 < changes.length && changes[last + 1] - changes[last] <= 2 * DIFF_CONTEXT_LINES + 1) last++
    const from = Math.max(0, changes[c] - DIFF_CONTEXT_LINES), to = Math.min(ops.length, changes[last] + DIFF_CONTEXT_LINES + 1)
    const hunk = ops.slice(from, to)
    const countA = hunk.filter(([op]) => op !== '+').length, countB = hunk.filter(([op]) => op !== '-').length
    out.push(`@@ -${startA[from] + (countA > 0 ? 1 : 0)},${countA} +${startB[from] + (countB > 0 ? 1 : 0)},${countB} @@`)
    for (const [op, line] of hunk) {
      out.push(op + line.replace(/\r?\n$/, ''))
      if (!line.endsWith('\n')) out.push('\\ No newline at end of file')
    }
    c = last + 1
  }
  return out
}

/** Diff lines for the terminal: model text with its controls shown as escapes, at most `maxLines`, then `… N more
 *  lines`; coloured when asked. */
function renderDiff(lines: readonly string[], color: boolean, maxLines: number): string {
  const paint = (line: string): string => {
    const text = collapseBlanks(shownExactly(line), DIFF_BLANKS)
    if (!color) return text
    const code = line.startsWith('+++') || line.startsWith('---') ? '1' : line[0] === '+' ? '32' : line[0] === '-' ? '31' : line.startsWith('@@') ? '36' : ''
    return code ? `\x1b[${code}m${text}\x1b[0m` : text
  }
  const shown = lines.slice(0, maxLines).map(paint)
  if (lines.length > maxLines) shown.push(`… ${groupDigits(lines.length - maxLines)} more lines`)
  return shown.length ? shown.join('\n') + '\n' : ''
}

/**
 * What a file change does, as the terminal shows it: its diff (at most `maxLines`), or one line for a binary file or one
 * too large to show; and `whole`, when that leaves part of it out: the whole diff, or the new content with its controls
 * as escapes (an approval offers it: a payload past the shown lines was approved unseen).
 */
function fileChangeViews(path: string, before: Uint8Array | undefined, existed: boolean, after: string, color: boolean,
  maxLines: number): { shown: string; whole?: () => string } {
  const content = (): string => `${shownExactly(path)}, its new content:\n${shownExactly(after)}\n`
  if (existed && before === undefined) return { shown: `${shownExactly(path)}: replaces a file too large to show (${groupDigits(utf8Length(after))} bytes after)\n`, whole: content }
  if ((before && hasNulByte(before)) || after.slice(0, TOOL_BINARY_SNIFF_BYTES).includes('\0')) {
    return { shown: `${shownExactly(path)}: binary content, ${existed ? `${groupDigits(before!.length)} → ` : 'new, '}${groupDigits(utf8Length(after))} bytes\n`, whole: content }
  }
  const lines = unifiedDiff(existed ? new TextDecoder().decode(before) : undefined, after, path)
  if (lines.length === 0) return { shown: `${shownExactly(path)}: no change\n` }
  return { shown: renderDiff(lines, color, maxLines), ...(lines.length > maxLines ? { whole: () => renderDiff(lines, color, Infinity) } : {}) }
}

/**
 * The prefix an "always for this command prefix" answer remembers: the command's first two words,
 * or only the first when the second looks like an option, a path or a value (`ls -la`, `cat a.txt`).
 */
export function commandPrefix(command: string): string {
  const words = command.trim().split(/\s+/)
  return words.length > 1 && /^[A-Za-z][\w:@-]*$/.test(words[1]) ? `${words[0]} ${words[1]}` : words[0]
}

/**
 * Whether an approved `prefix` covers `command`: it starts with the prefix's words, and holds no
 * shell operator that could add another command or redirect output (`; & | \` $( < >` or a line
 * break), so that `npm test; rm -rf ~` is asked about even when `npm test` is approved.
 */
export function commandMatches(command: string, prefix: string): boolean {
  const c = command.trim()
  if (/[;&|`<>\n\r]|\$\(/.test(c)) return false
  return c === prefix || c.startsWith(prefix + ' ')
}

/** One file change as the undo journal keeps it: the content before (its bytes; none when `existed` is false) and a hash of the content after. */
interface ChangeRecord {
  id: number
  turn: number
  realPath: string
  path: string
  existed: boolean
  before?: Uint8Array
  /** SHA-256 (hex) of the UTF-8 content the tool wrote. */
  afterHash: string
  undone: boolean
}

/** Where approvals come from, for `/permissions`: a configuration file's `approvals`, or the answers remembered for this directory. */
interface ApprovalSource { label: string; approvals: CliApprovals; remembered: boolean }

/** What the CLI's approvals, diffs and undo need from the rest of the CLI. */
interface ChangeDeskOptions {
  /** The real path of the working directory (the key of the remembered answers). */
  dir: string
  io: CliOutput
  color: boolean
  /** Interactive: questions are asked here. Absent: a one-shot run (docs/design.md §8: today's rules). */
  terminal?: Terminal
  /** `--yes`: everything is approved for the run. */
  yes: boolean
  /** `--allow-shell` in a one-shot run: every command runs. */
  allowShell: boolean
  /** `--json`: no diffs on stderr. */
  quiet: boolean
  /** Approvals of the configuration files (user, project). */
  configured: ApprovalSource[]
  userFile?: string
  /** The answers the user's file remembers for this directory. */
  memory?: CliProjectMemory
  /** Whether the project's config applies (for `/permissions`), and the file. */
  projectConfig?: { file: string; trusted: boolean }
  /** The turn a change belongs to (the session's current turn). */
  turn: () => number
  /** Where contents before each change are kept (`LOG.undo/`); absent: in memory (`--no-save`). */
  journalDir?: string
  /** The session log, which a restore must not write either. */
  sessionLog?: string
  /** Ends a streamed answer's line before a diff or a question is printed. */
  endLine?: () => void
}

/**
 * The CLI's approvals, diffs and undo (docs/design.md §8): the `beforeChange` / `afterChange`
 * hooks of {@link builtinTools}, and the `/diff`, `/undo` and `/permissions` commands.
 */
async function changeDesk(o: ChangeDeskOptions): Promise<{
  beforeChange: (change: ToolChange, signal: AbortSignal) => Promise<void>
  afterChange: (change: ToolChange) => Promise<void>
  command: (line: string, signal: AbortSignal) => Promise<void>
  /** The note about an `/undo` for the model, once, to go with the next input. */
  takeNote: () => string | undefined
}> {
  const [fs, { createHash }] = await Promise.all([importNode<typeof import('node:fs/promises')>('node:fs/promises'), importNode<typeof import('node:crypto')>('node:crypto')])
  const sha = (data: string | Uint8Array): string => createHash('sha256').update(data).digest('hex')
  const remembered: CliApprovals = { tools: [...(o.memory?.approvals?.tools ?? [])], commands: [...(o.memory?.approvals?.commands ?? [])] }
  const sources = (): ApprovalSource[] => [...o.configured, { label: 'remembered for this directory', approvals: remembered, remembered: true }]
  const records: ChangeRecord[] = []
  let note: string | undefined
  const say = (text: string) => o.io.stderr(text)

  // The journal: one JSON line per change ({id, turn, realPath, path, existed, afterHash}) with the
  // content before in ID.before, and {undone: [ids]} lines; read back when a session resumes.
  if (o.journalDir) {
    try {
      for (const line of (await fs.readFile(`${o.journalDir}/journal.jsonl`, 'utf8')).split('\n')) {
        if (line.trim() === '') continue
        const e = JSON.parse(line)
        if (Array.isArray(e.undone)) { for (const r of records) if (e.undone.includes(r.id)) r.undone = true; continue }
        const before = e.existed ? await fs.readFile(`${o.journalDir}/${e.id}.before`).then((b) => new Uint8Array(b), () => undefined) : undefined
        records.push({ ...e, ...(before ? { before } : {}), undone: false })
      }
    } catch (err: any) { if (err?.code !== 'ENOENT') say(`[dsh] the undo journal ${o.journalDir} cannot be read (${err?.message ?? err}); earlier changes cannot be undone\n`) }
  }
  const journal = async (line: object, blob?: { id: number; bytes: Uint8Array }): Promise<void> => {
    if (!o.journalDir) return
    try {
      await fs.mkdir(o.journalDir, { recursive: true, mode: 0o700 })
      if (blob) await fs.writeFile(`${o.journalDir}/${blob.id}.before`, blob.bytes, { mode: 0o600 })
      await fs.appendFile(`${o.journalDir}/journal.jsonl`, JSON.stringify(line) + '\n', { mode: 0o600 })
    } catch (err) { say(`[dsh] could not keep the content for /undo in ${o.journalDir}: ${(err as Error).message}\n`) }
  }
  const remember = async (kind: 'tools' | 'commands', value: string): Promise<void> => {
    if (!remembered[kind].includes(value)) remembered[kind].push(value)
    // what the config could not read back (parseCliConfig refuses it) is kept for this run only, never written
    const problem = !settingText(value) ? `the prefix holds a control character or is over ${SETTING_MAX_UNITS} units`
      : o.userFile ? await editUserConfig(o.userFile, (raw) => {
      const memory = projectMemory(raw, o.dir)
      if (!isRecord(memory.approvals)) memory.approvals = { tools: [], commands: [] }
      const list: string[] = Array.isArray(memory.approvals[kind]) ? memory.approvals[kind] : (memory.approvals[kind] = [])
      if (!list.includes(value)) list.push(value)
    }) : 'no configuration directory ($XDG_CONFIG_HOME or $HOME)'
    say(problem ? `[dsh] approved for this run only: ${problem}\n` : `[dsh] ${kind === 'tools' ? value : `commands starting with "${shownExactly(value)}"`} will run without asking in this directory (remembered in ${o.userFile}; /permissions changes it)\n`)
  }
  const approved = (change: ToolChange): boolean => sources().some(({ approvals }) => approvals.tools.includes(change.tool)
    || (change.tool === 'shell' && approvals.commands.some((prefix) => commandMatches(change.command, prefix))))
  /** Asks until the answer is one of the choices; Enter is no. */
  const ask = async (question: string, shell: boolean, signal: AbortSignal, view?: () => string): Promise<'yes' | 'no' | 'tool' | 'prefix'> => {
    for (;;) {
      const answer = await o.terminal!.ask(question, signal)
      if (answer === undefined) throw new Error('cancelled')
      const a = answer.trim().toLowerCase()
      if (a === 'y' || a === 'yes') return 'yes'
      if (a === '' || a === 'n' || a === 'no') return 'no'
      if (a === 'a' || a === 'always') return 'tool'
      if (shell && (a === 'p' || a === 'prefix')) return 'prefix'
      if (view !== undefined && (a === 'v' || a === 'view')) { o.io.stderrRaw(view()); continue }
      say(`answer y (yes), n (no) or a (always for this tool)${shell ? ', or p (always for commands starting with the same words)' : ''}${view !== undefined ? ', or v (view all of it)' : ''}\n`)
    }
  }

  const beforeChange = async (change: ToolChange, signal: AbortSignal): Promise<void> => {
    const shell = change.tool === 'shell'
    o.endLine?.()
    const views = change.tool === 'shell' ? undefined : fileChangeViews(change.path, change.before, change.existed, change.after, o.color, DIFF_SHOWN_LINES)
    if (views && !o.quiet) o.io.stderrRaw(views.shown)
    if (o.yes || approved(change)) return
    if (!o.terminal) {
      if (!shell || o.allowShell) return // a one-shot run: today's rules (file tools inside the project; shell with --allow-shell)
      throw new Error(`shell: not run: no approved prefix covers this command, and a one-shot run (-p) cannot ask; ${o.userFile ? `approve it in ${o.userFile} ("approvals": {"commands": [...]}), ` : ''}or pass --allow-shell to run every command`)
    }
    const lines = shell ? commandLines(change.command) : []
    if (shell) say(shownCommand(lines))
    const prefix = shell ? commandPrefix(change.command) : ''
    // what the diff above left out (lines past its cap, a binary or too large file's content) is one answer away
    const view = views?.whole
    const question = shell ? `Run it${lines.length > 1 ? ` (all ${lines.length} lines above)` : ''}? [y]es / [n]o / [a]lways for shell / [p] always for "${shownExactly(prefix)} …": ` : `Apply this change to ${shownExactly(change.path)}${view !== undefined ? ' (not all of it is shown above)' : ''}? [y]es / [n]o / [a]lways for ${change.tool}${view !== undefined ? ' / [v]iew all of it' : ''}: `
    let answer: Awaited<ReturnType<typeof ask>>
    try { answer = await ask(question, shell, signal, view) } catch { throw new Error(`${change.tool}: cancelled; ${shell ? 'the command was not run' : `${change.path} was not changed`}`) }
    if (answer === 'no') throw new Error(`${change.tool}: declined by the user; ${shell ? 'the command was not run' : `${change.path} was not changed`}. Do not retry it as it is: ask the user what they want instead`)
    if (answer === 'tool') await remember('tools', change.tool)
    if (answer === 'prefix') await remember('commands', prefix)
  }

  const afterChange = async (change: ToolChange): Promise<void> => {
    if (change.tool === 'shell') return
    const record: ChangeRecord = { id: (records.at(-1)?.id ?? 0) + 1, turn: o.turn(), realPath: change.realPath, path: change.path, existed: change.existed, afterHash: sha(change.after), undone: false }
    if (change.before) record.before = change.before
    records.push(record)
    const { before: _before, undone: _undone, ...line } = record
    await journal(line, record.before ? { id: record.id, bytes: record.before } : undefined)
  }

  const currentBytes = (file: string): Promise<Uint8Array | undefined> => readToolFile(o.dir, file)

  /** `/undo`: the newest turn with changes not undone yet, each file put back as that turn found it. */
  const undo = async (signal: AbortSignal): Promise<string> => {
    const open = records.filter((r) => !r.undone)
    if (open.length === 0) return `[dsh] /undo: nothing to undo: ${records.length ? 'every change of this session is undone already' : 'no file was changed in this session'}\n`
    const turn = Math.max(...open.map((r) => r.turn))
    const batch = open.filter((r) => r.turn === turn)
    const files = [...new Set(batch.map((r) => r.realPath))].reverse()
    const restored: string[] = [], removed: string[] = [], kept: string[] = [], failed: string[] = []
    const done: number[] = []
    for (const file of files) {
      const mine = batch.filter((r) => r.realPath === file)
      const first = mine[0], last = mine.at(-1)!
      if (first.existed && first.before === undefined) { failed.push(`${first.path} (its content before was too large to keep)`); done.push(...mine.map((r) => r.id)); continue }
      let now: Uint8Array | undefined
      try { now = await currentBytes(file) } catch (err) { failed.push(`${first.path} (${(err as Error).message})`); continue }
      // a change made between two of the turn's writes (the next write found other bytes than the last one left)
      const between = mine.slice(1).some((r, i) => !r.existed || (r.before !== undefined && sha(r.before) !== mine[i].afterHash))
      if (now === undefined || sha(now) !== last.afterHash || between) {
        const how = now === undefined ? `was deleted outside dsh since turn ${turn} wrote it`
          : between ? `changed outside dsh between two of turn ${turn}'s writes` : `changed outside dsh since turn ${turn} wrote it`
        const overwrite = o.terminal ? await o.terminal.askYesNo(`${shownExactly(first.path)} ${how}; ${first.existed ? 'put back its content from before that turn' : 'remove it'} anyway? [y/N] `, signal) : false
        if (!overwrite) { kept.push(first.path); done.push(...mine.map((r) => r.id)); continue }
      }
      try {
        await restoreToolFile(o.dir, file, first.existed ? first.before : undefined, o.sessionLog)
        ;(first.existed ? restored : removed).push(first.path)
        done.push(...mine.map((r) => r.id))
      } catch (err) { failed.push(`${first.path} (${(err as Error).message})`) }
    }
    for (const r of records) if (done.includes(r.id)) r.undone = true
    if (done.length) await journal({ undone: done })
    const parts = [
      restored.length ? `restored ${restored.join(', ')}` : '',
      removed.length ? `removed ${removed.join(', ')} (created in that turn)` : '',
      kept.length ? `left ${kept.join(', ')} as ${kept.length === 1 ? 'it is' : 'they are'} (changed outside dsh since)` : '',
      failed.length ? `could not undo ${failed.join(', ')}` : '',
    ].filter(Boolean)
    if (restored.length || removed.length) {
      const told = `The user ran /undo on the file changes of turn ${turn}: ${parts.join('; ')}. Those files are back as they were before that turn; read them again before changing them.`
      note = note ? `${note}\n${told}` : told
    }
    return `[dsh] /undo, turn ${turn}: ${parts.join('; ')}${restored.length || removed.length ? '; the model is told with your next input' : ''}\n`
  }

  /** `/diff`: every file this session changed (changes not undone), from its content before the first change to its content now. */
  const diff = async (): Promise<string> => {
    const open = records.filter((r) => !r.undone)
    if (open.length === 0) return `[dsh] /diff: ${records.length ? 'every change of this session is undone' : 'no file was changed in this session'}\n`
    const out: string[] = []
    for (const file of new Set(open.map((r) => r.realPath))) {
      const first = open.find((r) => r.realPath === file)!
      let now: Uint8Array | undefined
      try { now = await currentBytes(file) } catch (err) { out.push(`${stripControls(first.path)}: cannot be read (${(err as Error).message})\n`); continue }
      if (now === undefined) { out.push(`${stripControls(first.path)}: deleted since\n`); continue }
      out.push(fileChangeViews(first.path, first.before, first.existed, new TextDecoder().decode(now), o.color, DIFF_COMMAND_LINES).shown)
    }
    return out.join('')
  }

  /** `/permissions [remove N | shell yes|no | trust yes|no]`: what runs without asking, and the remembered answers. */
  const permissions = async (args: string[]): Promise<string> => {
    const entries = sources().flatMap((s) => [...s.approvals.tools.map((t) => ({ s, kind: 'tools' as const, value: t })), ...s.approvals.commands.map((c) => ({ s, kind: 'commands' as const, value: c }))])
    const rememberedOnes = entries.filter((e) => e.s.remembered)
    const [verb, value] = args
    if (verb === 'remove') {
      const n = Number(value)
      const entry = rememberedOnes[n - 1]
      if (!entry) return `[dsh] /permissions remove N: N is the number of a remembered answer (1–${rememberedOnes.length}); approvals in a configuration file are changed in that file\n`
      remembered[entry.kind] = remembered[entry.kind].filter((x) => x !== entry.value)
      const problem = o.userFile ? await editUserConfig(o.userFile, (raw) => {
        const memory = projectMemory(raw, o.dir)
        if (isRecord(memory.approvals) && Array.isArray(memory.approvals[entry.kind])) memory.approvals[entry.kind] = memory.approvals[entry.kind].filter((x: unknown) => x !== entry.value)
      }) : undefined
      return `[dsh] ${entry.kind === 'tools' ? entry.value : `commands starting with "${shownExactly(entry.value)}"`} will be asked about again${problem ? ` (for this run only: ${problem})` : ''}\n`
    }
    if ((verb === 'shell' || verb === 'trust') && (value === 'yes' || value === 'no')) {
      // trust is of the file as it is now (CliProjectMemory.trustedSha256)
      let sha256: string | undefined
      if (verb === 'trust' && value === 'yes') {
        let found: CliConfigFile | undefined
        try { found = await readCliConfig(`${o.dir}/${PROJECT_CONFIG_FILE}`, 'project') } catch (err) { return `[dsh] /permissions: ${(err as Error).message}\n` }
        if (found?.sha256 === undefined) return `[dsh] /permissions: ${o.dir} has no ${PROJECT_CONFIG_FILE} to trust\n`
        // the file as it is now is what gets trusted: it is shown and asked about, as at start
        say(`${PROJECT_CONFIG_FILE} now sets:\n${describeConfig(found.config)}\n`)
        if (!o.terminal || !(await o.terminal.askYesNo(`Trust it? [y/N] `))) return `[dsh] /permissions: ${PROJECT_CONFIG_FILE} not trusted\n`
        sha256 = found.sha256
      }
      const problem = o.userFile ? await editUserConfig(o.userFile, (raw) => {
        const memory = projectMemory(raw, o.dir)
        if (verb === 'shell') memory.shell = value === 'yes'
        else { memory.trusted = value === 'yes'; if (sha256) memory.trustedSha256 = sha256; else delete memory.trustedSha256 }
      }) : 'no configuration directory ($XDG_CONFIG_HOME or $HOME)'
      if (problem) return `[dsh] /permissions: ${problem}\n`
      return `[dsh] ${verb === 'shell' ? `shell commands ${value === 'yes' ? 'allowed' : 'not allowed'}` : `${PROJECT_CONFIG_FILE} ${value === 'yes' ? 'trusted' : 'not trusted'}`} in ${o.dir} from the next start (remembered in ${o.userFile})\n`
    }
    if (verb !== undefined) return `[dsh] /permissions takes: remove N, shell yes|no, trust yes|no (got ${stripControls(args.join(' '))})\n`
    const shellAnswer = o.memory?.shell
    const lines = [
      `permissions in ${o.dir}${o.yes ? ' (--yes: everything is approved for this run)' : ''}:`,
      `  shell commands: ${shellAnswer === undefined ? 'not asked yet' : shellAnswer ? 'allowed' : 'not allowed'}${o.userFile ? ` (remembered in ${o.userFile})` : ''}`,
      `  ${PROJECT_CONFIG_FILE}: ${!o.projectConfig ? 'none' : o.projectConfig.trusted ? 'trusted, in use' : 'not trusted, ignored'}`,
      entries.length ? '  run without asking:' : '  run without asking: nothing (every write, edit and command is asked about)',
      ...entries.map((e) => `    ${e.s.remembered ? `${rememberedOnes.indexOf(e) + 1}.` : '-'} ${e.kind === 'tools' ? `every ${e.value} call` : `commands starting with "${shownExactly(e.value)}"`} (${e.s.label})`),
      '  change: /permissions remove N · /permissions shell yes|no · /permissions trust yes|no',
    ]
    return lines.join('\n') + '\n'
  }

  return {
    beforeChange, afterChange,
    takeNote: () => { const n = note; note = undefined; return n },
    command: async (line, signal) => {
      const [name, ...args] = line.trim().split(/\s+/)
      if (name === '/diff') o.io.stderrRaw(await diff())
      else if (name === '/undo') say(await undo(signal))
      else if (name === '/permissions') say(await permissions(args))
    },
  }
}

// ── 11.3 Kept sessions (docs/design.md §8 "Sessions are kept by default") ──

/** Sessions `--resume` and `/sessions` list, newest first. */
const SESSIONS_LISTED = 20
/** Bytes read from each end of a kept log to describe it (its first input; its last message and turn). */
const SESSION_PEEK_BYTES = 262_144 // 256 KiB
/** Days in ms. */
const DAY_MS = 86_400_000

/** Where kept sessions live: `$XDG_STATE_HOME/dsh/sessions`, else `~/.local/state/dsh/sessions` (undefined without either). */
function sessionsRoot(env: Record<string, string | undefined>): string | undefined {
  const base = env.XDG_STATE_HOME || (env.HOME ? `${env.HOME}/.local/state` : env.LOCALAPPDATA)
  return base ? `${base}/dsh/sessions` : undefined
}

/** The directory of one project's kept sessions: its name and a hash of its real path, e.g. `my-app-3f2a9c1b04de`. */
async function projectSessionsDir(root: string, dir: string): Promise<string> {
  const { createHash } = await importNode<typeof import('node:crypto')>('node:crypto')
  const name = (dir.split(/[\\/]/).filter(Boolean).at(-1) ?? 'root').replace(/[^A-Za-z0-9._-]/g, '_').slice(0, 40)
  return `${root}/${name}-${createHash('sha256').update(dir).digest('hex').slice(0, 12)}`
}

/** One kept session as `--resume` and `/sessions` list it. `first` and `last`: the first input and the last message, one line each. */
export interface KeptSession { file: string; modifiedMs: number; turns: number; first?: string; last?: string }

/** The text of a logged message worth listing (an input or an answer, not a checkpoint), or undefined. */
function listedText(e: any): string | undefined {
  if ((e?.type !== 'user/message' && e?.type !== 'assistant/message') || e.data?.surfaceOp?.op !== 'append' || e.data.compactionId !== undefined) return undefined
  const text = contentText(e.data.message?.content ?? '').trim()
  return text === '' ? undefined : oneLine(text, 60)
}

/** Turns, first input and last message of a kept log, from its two ends (the whole file only when its last turn is longer than an end). */
async function describeKeptSession(file: string): Promise<KeptSession> {
  const fs = await importNode<typeof import('node:fs/promises')>('node:fs/promises')
  const handle = await fs.open(file, 'r')
  try {
    const { size, mtimeMs } = await handle.stat()
    const read = async (at: number, bytes: number): Promise<string[]> => {
      const buffer = new Uint8Array(bytes)
      const { bytesRead } = await handle.read(buffer, 0, bytes, at)
      const lines = new TextDecoder().decode(buffer.subarray(0, bytesRead)).split('\n')
      if (at > 0) lines.shift() // cut mid-line
      if (at + bytesRead < size) lines.pop()
      return lines
    }
    const parse = (line: string): any => { try { return JSON.parse(line) } catch { return undefined } }
    const out: KeptSession = { file, modifiedMs: mtimeMs, turns: 0 }
    for (const line of await read(0, Math.min(size, SESSION_PEEK_BYTES))) {
      const e = parse(line)
      if (e?.type === 'user/message' && (out.first = listedText(e)) !== undefined) break
    }
    let turnSeen = false
    for (const line of await read(Math.max(0, size - SESSION_PEEK_BYTES), Math.min(size, SESSION_PEEK_BYTES))) {
      const e = parse(line)
      if (e?.type === 'turn/start') { out.turns = isIntegerAtLeast(e.data?.turn, 0) ? e.data.turn : out.turns + 1; turnSeen = true }
      out.last = listedText(e) ?? out.last
    }
    if (!turnSeen && size > SESSION_PEEK_BYTES) {
      for await (const line of handle.readLines({ start: 0 })) if (line.includes('"type":"turn/start"')) out.turns++
    }
    return out
  } finally { await handle.close().catch(() => {}) }
}

/** The kept sessions in `dir`, newest first, at most `max` described. */
async function listKeptSessions(dir: string, max = SESSIONS_LISTED): Promise<KeptSession[]> {
  const fs = await importNode<typeof import('node:fs/promises')>('node:fs/promises')
  const names = await fs.readdir(dir).catch(() => [] as string[])
  const logs = await Promise.all(names.filter((n) => n.endsWith('.jsonl')).map(async (n) => ({ file: `${dir}/${n}`, mtimeMs: await fs.stat(`${dir}/${n}`).then((s) => s.mtimeMs, () => -1) })))
  const newest = logs.filter((l) => l.mtimeMs >= 0).sort((a, b) => b.mtimeMs - a.mtimeMs).slice(0, max)
  return (await Promise.all(newest.map((l) => describeKeptSession(l.file).catch(() => undefined)))).filter((s): s is KeptSession => s !== undefined)
}

/** A kept session as one numbered entry of a list (two lines: when, turns, first and last message; the file). */
function keptSessionEntry(s: KeptSession, n: number, nowMs: number, current?: string): string {
  const when = new Date(s.modifiedMs)
  const pad = (x: number) => String(x).padStart(2, '0')
  const stamp = `${when.getFullYear()}-${pad(when.getMonth() + 1)}-${pad(when.getDate())} ${pad(when.getHours())}:${pad(when.getMinutes())}`
  const said = [s.first ? `"${s.first}"` : '', s.last && s.last !== s.first ? `… "${s.last}"` : ''].filter(Boolean).join(' ')
  return `${String(n).padStart(3)}. ${stamp} (${agoText(nowMs - s.modifiedMs)}) · ${plural(s.turns, 'turn')}${said ? ` · ${said}` : ''}${s.file === current ? ' (this session)' : ''}\n     ${s.file}\n`
}

/** Removes a kept log and everything named `LOG.*` beside it (lock, artefacts, undo journal, torn lines). */
async function deleteKeptSession(file: string): Promise<void> {
  const fs = await importNode<typeof import('node:fs/promises')>('node:fs/promises')
  const dir = file.slice(0, file.lastIndexOf('/')), base = file.slice(dir.length + 1)
  for (const name of await fs.readdir(dir).catch(() => [] as string[])) {
    if (name === base || name.startsWith(base + '.')) await fs.rm(`${dir}/${name}`, { recursive: true, force: true })
  }
}

/** Whether a log's lock names a live process on this host (then its session is open: never removed). */
async function lockHeld(file: string): Promise<boolean> {
  const [fs, os] = await Promise.all([importNode<typeof import('node:fs/promises')>('node:fs/promises'), importNode<typeof import('node:os')>('node:os')])
  let holder: any
  try { holder = JSON.parse(await fs.readFile(`${file}.lock`, 'utf8')) } catch (err: any) { return err?.code !== 'ENOENT' }
  if (holder?.host !== os.hostname()) return true
  const proc = (await importNode<any>('node:process')).default
  try { proc.kill(holder.pid, 0); return true } catch (err: any) { return err?.code === 'EPERM' }
}

/** Removes kept sessions (of every project) last changed more than `days` ago; returns how many. Never throws. */
async function pruneKeptSessions(root: string, days: number, nowMs: number): Promise<number> {
  const fs = await importNode<typeof import('node:fs/promises')>('node:fs/promises')
  let removed = 0
  for (const project of await fs.readdir(root).catch(() => [] as string[])) {
    const dir = `${root}/${project}`
    for (const name of await fs.readdir(dir).catch(() => [] as string[])) {
      if (!name.endsWith('.jsonl')) continue
      const file = `${dir}/${name}`
      const stat = await fs.stat(file).catch(() => undefined)
      if (!stat || nowMs - stat.mtimeMs <= days * DAY_MS || await lockHeld(file)) continue
      try { await deleteKeptSession(file); removed++ } catch { /* in use, or gone: next start */ }
    }
    await fs.rmdir(dir).catch(() => {}) // only when empty
  }
  return removed
}

/** A new, empty kept log in `dir` (mode 0600, its directories 0700: a log holds tool output, secrets included). */
async function newKeptSession(dir: string, nowMs: number): Promise<string> {
  const fs = await importNode<typeof import('node:fs/promises')>('node:fs/promises')
  await fs.mkdir(dir, { recursive: true, mode: 0o700 })
  await fs.chmod(dir, 0o700)
  const stamp = new Date(nowMs).toISOString().replace(/[-:]/g, '').replace('T', '-').slice(0, 15)
  const file = `${dir}/${stamp}-${randomId().slice(0, 6)}.jsonl`
  await (await fs.open(file, 'wx', 0o600)).close()
  return file
}

/**
 * Which log this run keeps its session in (docs/design.md §8): `--session FILE` as given; none
 * with `--no-save` (or without a state directory); with `--continue` the newest kept session of
 * this directory; with `--resume` one picked from the list (without a terminal the list is
 * printed and the run ends); else a new kept log. Kept sessions past the retention are removed first.
 * @returns the log's path (undefined: in memory; `created`: a new kept log), or an exit code.
 */
async function chooseSessionLog(options: CliRunOptions, dir: string, env: Record<string, string | undefined>, terminal: Terminal | undefined, io: CliOutput): Promise<{ file?: string; created?: boolean } | { exitCode: number }> {
  const root = sessionsRoot(env)
  const now = Date.now()
  const removed = root ? await pruneKeptSessions(root, options.retentionDays, now) : 0
  if (removed > 0) io.stderr(`[dsh] removed ${plural(removed, 'kept session')} older than ${options.retentionDays} days ("retentionDays" in the user configuration)\n`)
  if (options.session !== undefined || options.noSave) return { file: options.session }
  if (!root) {
    io.stderr('[dsh] this session is not kept: set XDG_STATE_HOME or HOME (or give --session FILE)\n')
    return {}
  }
  const projectDir = await projectSessionsDir(root, dir)
  if (!options.continue && !options.resume) return { file: await newKeptSession(projectDir, now), created: true }
  const kept = await listKeptSessions(projectDir)
  if (kept.length === 0) {
    io.stderr(`dsh: ${options.continue ? '--continue' : '--resume'}: no kept session for ${dir} yet; start one without it\n`)
    return { exitCode: 2 }
  }
  if (options.continue) return { file: kept[0].file }
  const list = `kept sessions of ${dir}, newest first:\n${kept.map((s, i) => keptSessionEntry(s, i + 1, now)).join('')}`
  if (!terminal) {
    io.stdout(`${list}resume one with: --session FILE\n`)
    return { exitCode: 0 }
  }
  io.stderr(list)
  for (;;) {
    const answer = await terminal.ask(`Resume which? [1-${kept.length}, Enter = 1, n = a new session] `)
    if (answer === undefined) return { exitCode: 0 }
    const a = answer.trim().toLowerCase()
    if (a === 'n') return { file: await newKeptSession(projectDir, now), created: true }
    const n = a === '' ? 1 : Number(a)
    if (Number.isInteger(n) && n >= 1 && n <= kept.length) return { file: kept[n - 1].file }
    io.stderr(`answer a number from 1 to ${kept.length}, or n\n`)
  }
}

/** The last `count` exchanges of a resumed session: each input and the answer that followed, a few lines each. */
function lastExchanges(session: Session, count = 2): string {
  const nodes = session.surface().filter((n) => !isCheckpoint(n) && (n.message.role === 'user' || n.message.role === 'assistant'))
  const inputs = nodes.flatMap((n, i) => (n.message.role === 'user' ? [i] : []))
  const shown = inputs.slice(-count)
  if (shown.length === 0) return ''
  const clip = (text: string, maxLines: number, maxPoints: number): string => {
    const lines = text.trim().split('\n')
    let out = lines.slice(0, maxLines).join('\n')
    const end = indexAfterCodePoints(out, maxPoints)
    if (end < out.length || lines.length > maxLines) out = out.slice(0, end).trimEnd() + ' …'
    return out
  }
  const parts = shown.map((at, j) => {
    const until = j + 1 < shown.length ? shown[j + 1] : nodes.length
    const answer = nodes.slice(at + 1, until).map((n) => contentText(n.message.content)).filter((t) => t.trim() !== '').at(-1)
    return `› ${clip(contentText(nodes[at].message.content), 3, 300)}\n${answer ? clip(answer, 6, 600) : '(no answer)'}\n`
  })
  return `[dsh] the last ${plural(shown.length, 'exchange')}:\n${parts.join('')}`
}

/** `/sessions [delete N]`: this directory's kept sessions (newest first), and deleting one. */
async function sessionsCommand(line: string, dir: string, env: Record<string, string | undefined>, current: string | undefined): Promise<string> {
  const root = sessionsRoot(env)
  if (!root) return '[dsh] /sessions: no state directory (set XDG_STATE_HOME or HOME), so no session is kept\n'
  const kept = await listKeptSessions(await projectSessionsDir(root, dir))
  const [, verb, value] = line.trim().split(/\s+/)
  if (verb === 'delete') {
    const s = kept[Number(value) - 1]
    if (!s) return `[dsh] /sessions delete N: N is a number from the list (1–${kept.length}); /sessions shows it\n`
    if (s.file === current) return '[dsh] /sessions: that is this session; it can be deleted from another one (or start with --no-save)\n'
    if (await lockHeld(s.file)) return `[dsh] /sessions: that session is open in another dsh process (${s.file}.lock is held); end it there first\n`
    await deleteKeptSession(s.file)
    return `[dsh] deleted the session of ${agoText(Date.now() - s.modifiedMs)} (${plural(s.turns, 'turn')}): ${s.file}\n`
  }
  if (verb !== undefined) return `[dsh] /sessions takes: delete N (got ${stripControls(verb)})\n`
  if (kept.length === 0) return `[dsh] no kept session for ${dir}${current ? '' : ' (this one is not kept)'}\n`
  return `kept sessions of ${dir}, newest first (delete one: /sessions delete N):\n${kept.map((s, i) => keptSessionEntry(s, i + 1, Date.now(), current)).join('')}`
}

// ── main ──

/**
 * The CLI (docs/design.md §8). Returns the exit code: 0 done, 1 provider or tool failure (or a turn
 * that ended without an answer), 2 usage error. Node, Deno and Bun (node: modules loaded lazily).
 * `argv` excludes the runtime and script. A closed stdout (`| head`) ends quietly with 0.
 */
export async function main(argv: readonly string[], proc?: NodeProcess): Promise<number> {
  const p: NodeProcess = proc ?? (await importNode<any>('node:process')).default
  const io = cliOutput(p)
  // A run reads the configuration files first: they hold settings the arguments are checked with.
  const hints = cliRunHints(argv)
  const prep = hints ? await prepareRun(hints, p, io) : undefined
  if (prep && 'exitCode' in prep) return prep.exitCode
  try { return await mainWith(argv, p, io, prep) } finally { prep?.terminal?.close() }
}

/** {@link main} once the configuration of a run is read (`prep`; undefined for help, show, replay). */
async function mainWith(argv: readonly string[], p: NodeProcess, io: CliOutput, prep: RunPreparation | undefined): Promise<number> {
  const basics = runCliBasics(argv, p.env, io, { files: prep?.files, name: cliName(p.argv?.[1]) })
  if ('exitCode' in basics) return basics.exitCode
  let options = basics.options
  const path = await importNode<typeof import('node:path')>('node:path')
  const cwd = path.resolve(p.cwd(), options.cwd ?? '.')
  if (options.cwd !== undefined) {
    const fs = await importNode<typeof import('node:fs/promises')>('node:fs/promises')
    const stat = await fs.stat(cwd).catch((err: Error) => err)
    if (stat instanceof Error || !stat.isDirectory()) {
      io.stderr(`dsh: -C ${options.cwd}: ${stat instanceof Error ? `cannot use ${cwd} (${(stat as { code?: string }).code ?? stat.message})` : `${cwd} is not a directory`}; give the project's directory\n`)
      return 2
    }
  }
  if (options.command === 'replay') return await replayCommand({ ...options, file: path.resolve(cwd, options.file) }, p, io, options.file)
  if (options.command === 'show') return await showCommand({ ...options, file: path.resolve(cwd, options.file) }, io, options.file)
  let instructions: ProjectInstructions | undefined
  try { instructions = options.projectInstructions ? await readProjectInstructions(cwd) : undefined } catch (err) {
    if (err instanceof UsageError) { io.stderr(`dsh: ${err.message}\n`); return err.exitCode }
    throw err
  }
  if (instructions) io.stderr(`[dsh] project instructions: ${instructions.file} (${groupDigits(instructions.bytes)} bytes) is in the system prompt of every request; --no-project-instructions leaves it out\n`)
  const dir = prep?.dir ?? cwd
  const terminal = prep?.terminal
  // Kept by default (docs/design.md §8): the log dsh picks is then used as a --session FILE would be.
  const chosen = await chooseSessionLog(options, dir, p.env, terminal, io)
  if ('exitCode' in chosen) return chosen.exitCode
  const kept = chosen.file !== undefined && options.session === undefined
  if (kept) options = { ...options, session: chosen.file }

  const run = options
  // `/model` makes another provider the same way: only the model, its window and its prices differ.
  const providerFor = (model: string, contextWindow: number | undefined, prices: Prices | undefined) => run.baseURL === CLI_DEFAULTS.baseURL
    ? deepseek({ model, apiKey: run.apiKey, contextWindow, maxTokens: run.maxTokens, prices })
    : openAICompatible({ baseURL: run.baseURL, model, apiKey: run.apiKey, contextWindow, maxTokens: run.maxTokens, prices })
  const provider = providerFor(options.model, options.contextWindow, options.prices)
  if (options.maxCostUSD !== undefined && !provider.prices) { io.stderr(`dsh: --max-cost needs the model's prices and ${options.model} has none: give them with --prices HIT,MISS,OUTPUT (USD per million tokens)\n`); return 2 }
  let session: Session
  try {
    session = await Session.open(options.session ? new FileStore(path.resolve(cwd, options.session)) : new MemoryStore())
  } catch (err) {
    // A corrupt log, a file of another format, a directory or an unwritable path: say which, exit 2.
    if (err instanceof SessionError) { io.stderr(`dsh: --session ${options.session}: ${err.message}\n`); return 2 }
    throw err
  }
  const staleLock = session.store instanceof FileStore ? session.store.staleLock : undefined
  if (staleLock) {
    const h = staleLock
    io.stderr(`dsh: --session ${options.session}: took over the stale lock of pid ${h.pid} on host ${h.host} (since ${new Date(h.time).toISOString()}), which is no longer running\n`)
  }
  if (session.torn) io.stderr(`dsh: the session log's last line (line ${session.torn.line}, ${session.torn.bytes} bytes) was cut short by a crash; dropped and saved to ${session.torn.savedTo}\n`)
  const tty = !!p.stderr.isTTY
  const interactive = terminal !== undefined // prepareRun opened it: no prompt, no -p, no --json, and stdin is a terminal
  if (options.json) {
    // The events Session.open wrote (session/start, or session/resume and its repairs) came before the Agent's onEvent existed.
    for await (const e of session.readEvents(stateOf(session).openedAt)) io.stdout(jsonLine(e))
  } else {
    const resumed = await resumeLine(session, options.session!, Date.now())
    if (resumed) io.stderr(resumed + '\n')
    if (resumed && interactive) io.stderr(lastExchanges(session))
    // A resumed session keeps its log, not its model: say when the model or its window changed (the ladder sizes by it).
    const was = session.measure().header, window = provider.contextWindow
    if (resumed && was && (was.model !== options.model || was.contextWindow !== window)) {
      const named = (model: string, w?: number) => `${stripControls(model)}${w ? ` (window ${groupDigits(w)} tokens)` : ''}`
      io.stderr(`[dsh] this session ran on ${named(was.model, was.contextWindow)}; it goes on with ${named(options.model, window)}`
        + `${was.contextWindow ? `: --model ${stripControls(was.model)} --context-window ${was.contextWindow} keeps them` : ''}\n`)
    }
  }
  const allowShell = await shellPermission(options, cwd, p.env, terminal, io)
  // Flags win over the config's `sandbox` (false turns it off; {allowNetwork, read} sets its parts).
  const sandboxConf = typeof options.sandboxConfig === 'object' ? options.sandboxConfig : {}
  const sandboxOff = options.sandbox === false || (options.sandbox === undefined && options.sandboxConfig === false)
  const allowNetwork = options.allowNetwork === true || (options.allowNetwork === undefined && sandboxConf.allowNetwork === true)
  const confRead = (Array.isArray(sandboxConf.read) ? sandboxConf.read as string[] : [])
    .map((r) => (r.startsWith('~/') && p.env.HOME ? path.join(p.env.HOME, r.slice(2)) : r))
  const sandbox: ShellSandboxOptions | undefined = sandboxOff ? undefined : {
    allowNetwork, readPaths: [...confRead, ...(options.sandboxRead ?? [])].map((r) => path.resolve(cwd, r)),
    onUnavailable: (reason) => io.stderr(`[dsh] no shell sandbox: ${reason}; shell commands run unconfined, reaching what you can (README: Security); --no-sandbox skips this check\n`),
  }
  const desk = await cliChangeDesk(options, dir, prep, session, path.resolve(cwd, options.session ?? '.'), io, terminal, tty && !p.env.NO_COLOR, () => endLine())
  const tools = await builtinTools({
    cwd, allowShell, shellEnv: p.env, shellEnvKeep: options.shellEnv, ...(options.session ? { sessionLog: path.resolve(cwd, options.session) } : {}),
    protectedPaths: cliOwnDirs(p.env),
    shellEnvDrop: [CLI_DEFAULTS.apiKeyEnv, ...(options.apiKeyEnv ? [options.apiKeyEnv] : [])], ...(sandbox ? { sandbox } : {}),
    beforeChange: desk.beforeChange, afterChange: desk.afterChange,
  })
  let agent: Agent | undefined
  // The answer streams to stdout on a terminal (interactive, or -p on a TTY); it has no final newline:
  // end its line before a status line or the next prompt (which clears its line).
  const streamAnswer = interactive || (!!p.stdout.isTTY && !options.json)
  let midLine = false
  const endLine = () => { if (midLine) { io.stdout('\n'); midLine = false } }
  const status = statusReporter(() => agent, (t) => { endLine(); io.stderrRaw(t) }, tty, tty && !p.env.NO_COLOR, {
    // The live line (a spinner) starts on a line of its own: it redraws its row (not on a terminal without cursor control).
    ...(p.env.TERM === 'dumb' ? {} : { live: (text: string | undefined) => { if (text !== undefined) endLine(); io.live(text) } }),
    paused: () => terminal?.asking ?? false, typed: () => terminal?.typedAhead() ?? '', columns: () => (p.stderr as { columns?: number }).columns,
  })
  const onEvent = (e: AgentEvent) => {
    if (options.json) { if (e.type === 'log') io.stdout(jsonLine(e.event)); else if (e.type === 'warning') io.stderr(`[dsh] warning: ${e.message}\n`); return }
    if (streamAnswer && e.type === 'stream' && e.event.type === 'text-delta' && e.event.text !== '') { io.stdout(e.event.text); midLine = !e.event.text.endsWith('\n') }
    status(e)
  }
  // One Agent per model: `/model` starts another over the same session (the log is the state); the
  // events of an agent that was replaced are ignored (its session subscription stays).
  let agents = 0
  const newAgent = (p: Provider): Agent => {
    const mine = agents + 1
    const made = new Agent({
      session, provider: p, tools, system: [CLI_SYSTEM_PROMPT.replace('{cwd}', cwd), instructions?.text].filter((t) => t?.trim()).join('\n\n'),
      compaction: { thresholdRatio: run.threshold, ...(run.clear === false ? { clear: false } : {}) }, maxSteps: run.maxSteps,
      ...(run.maxCostUSD !== undefined ? { maxCostUSD: run.maxCostUSD } : {}),
      onEvent: (e) => { if (mine === agents) onEvent(e) },
    })
    agents = mine // from here on, only this agent's events are shown
    return made
  }
  agent = newAgent(provider)
  const switchModel = async (line: string, signal: AbortSignal): Promise<string> => {
    const next = parseModelCommand(line, agent!)
    if (typeof next === 'string') return next
    // Prices are a model's: DeepSeek's for its models, else none (cost unknown) — never the last model's.
    let made: Agent
    try { made = newAgent(providerFor(next.model, next.contextWindow, pricesOf(next.model))) } catch (err) {
      return `[dsh] /model: ${(err as Error).message}; the model stays ${stripControls(agent!.provider.model)}\n`
    }
    const hadCost = costKnown(agent!)
    agent = made
    const said = await modelSwitched(agent, signal)
    return hadCost && !costKnown(agent) ? `${said}[dsh] this session's cost is unknown from now on: ${stripControls(next.model)} has no price (dsh knows DeepSeek's)\n` : said
  }

  let prompt = options.prompt
  if (prompt === undefined && !interactive) {
    prompt = await readAll(p.stdin)
    if (!prompt.trim()) { io.stderr('dsh: no prompt: pass one as an argument or with -p "…", pipe it on stdin, or run in a terminal for interactive mode\n'); return 2 }
  }
  try {
    if (!interactive) return await oneTurn(agent, prompt!, p, io, { json: options.json, streamed: streamAnswer, endLine })
    return await interactiveLoop(() => agent!, terminal!, io, endLine, {
      command: async (line, signal) => {
        if (/^\/sessions(\s|$)/.test(line)) io.stderr(await sessionsCommand(line, dir, p.env, kept ? options.session : undefined))
        else if (/^\/model(\s|$)/.test(line)) io.stderr(await switchModel(line, signal))
        else if (/^\/(diff|undo|permissions)(\s|$)/.test(line)) await desk.command(line, signal)
        else return false
        return true
      },
      input: (line) => { const note = desk.takeNote(); return note ? `[dsh note: ${note}]\n\n${line}` : line },
    })
  } finally {
    await session.sync().catch(() => {})
    await session.store.close?.()
    // A new kept session in which no turn ran holds nothing worth resuming: not kept.
    if (kept && chosen.created && session.turn.turn === 0) await deleteKeptSession(options.session!).catch(() => {})
  }
}

/** The name `--help` shows: `dsh` when run as the installed command (its bundle), `npx tsx dsh.ts` when run from the source. */
function cliName(script: string | undefined): string {
  return script !== undefined && /\.ts$/.test(script) ? 'npx tsx dsh.ts' : 'dsh'
}

/** The approvals, diffs and undo of a run ({@link changeDesk}) from its options and configuration; `logPath`: the session log (resolved), when it has one. */
async function cliChangeDesk(options: CliRunOptions, dir: string, prep: RunPreparation | undefined, session: Session, logPath: string, io: CliOutput, terminal: Terminal | undefined, color: boolean, endLine: () => void): ReturnType<typeof changeDesk> {
  const userFile = prep?.userFile
  // Read again: the trust and shell questions may have just added to it.
  const user = userFile ? await readCliConfig(userFile, 'user').catch(() => undefined) : undefined
  const configured: ApprovalSource[] = []
  for (const f of [prep?.files.user, prep?.files.project]) if (f?.config.approvals) configured.push({ label: `from ${f.file}`, approvals: f.config.approvals, remembered: false })
  return await changeDesk({
    dir, io, color, terminal, yes: options.yes, allowShell: options.allowShell, quiet: options.json, configured, userFile, memory: user?.config.projects?.[dir],
    projectConfig: prep?.projectExists ? { file: `${dir}/${PROJECT_CONFIG_FILE}`, trusted: prep.files.project !== undefined } : undefined,
    turn: () => session.turn.turn, endLine, ...(options.session ? { journalDir: `${logPath}.undo`, sessionLog: logPath } : {}),
  })
}

/** Why a turn gave no usable answer, in one line, or `undefined` when it did (docs/design.md §8 exit codes). */
function turnProblem(agent: Agent, result: TurnResult): string | undefined {
  if (result.reason === 'max-steps') return `the turn stopped at the step limit (${agent.maxSteps} steps, --max-steps) without a final answer; raise --max-steps, or continue with --session FILE`
  if (result.reason === 'budget') return `the turn stopped at its spend cap (--max-cost) before its next request; raise --max-cost, or continue with --session FILE`
  if (result.reason === 'length') return `the answer was cut at the completion budget (finish reason "length"); raise --max-tokens`
  if (result.reason === 'stop' && result.text.trim() === '') return 'the model ended the turn without an answer (its last message has no text)'
  if (result.reason !== 'stop' && result.reason !== 'aborted') return `the turn ended with reason "${result.reason}"`
  return undefined
}

/** Runs one turn; the first Ctrl-C cancels it, a second exits (130). A closed stdout cancels it too and exits 0. */
async function oneTurn(agent: Agent, prompt: string, p: NodeProcess, io: CliOutput, how: { json: boolean; streamed: boolean; endLine: () => void }): Promise<number> {
  const ctrl = new AbortController()
  const onSigint = () => {
    if (ctrl.signal.aborted) { io.stderr('\n[dsh] interrupted twice: exiting\n'); (p as any).exit(130) }
    ctrl.abort(); io.stderr('\n[dsh] cancelling the turn (Ctrl-C again to exit)\n')
  }
  p.on('SIGINT', onSigint)
  io.onStdoutClosed = () => ctrl.abort() // nobody reads the answer: stop spending on it
  try {
    const result = await agent.run(prompt, { signal: ctrl.signal })
    const problem = turnProblem(agent, result)
    if (!io.stdoutClosed && how.streamed) how.endLine()
    else if (!io.stdoutClosed && !how.json && result.reason !== 'max-steps') io.stdout(result.text.endsWith('\n') || result.text === '' ? result.text : result.text + '\n')
    await io.flushed()
    if (io.stdoutFailed) { io.stderr(`dsh: the answer could not be written to stdout (${io.stdoutFailed})\n`); return 1 }
    if (io.stdoutClosed) return 0
    if (result.reason === 'aborted') { io.stderr('dsh: turn cancelled\n'); return 130 }
    if (problem) { io.stderr(`dsh: ${problem}\n`); return 1 }
    return 0
  } catch (err) {
    how.endLine()
    io.stderr(`dsh: ${failureText(err)}\n`)
    return 1
  } finally { p.off('SIGINT', onSigint); io.onStdoutClosed = undefined }
}

/** A failed turn in one line; the adapter's messages already start with the code (`AUTH: HTTP 401 from …`). */
function failureText(err: unknown): string {
  const message = String((err as Error)?.message ?? err)
  if (!(err instanceof ProviderError)) return message
  const text = message.startsWith(`${err.code}:`) ? message : `${err.code}${err.status ? ` (HTTP ${err.status})` : ''}: ${message}`
  // A 404 is a wrong base URL (or model name) far more often than anything else: say which URL was used.
  const base = err.status === 404 ? /from POST (\S+)\/chat\/completions/.exec(message)?.[1] : undefined
  return base ? `${text} dsh posts to BASE/chat/completions with the base URL ${base} (--base-url, DSH_BASE_URL or "baseURL" in a configuration file): check it (most servers want it to end in /v1, e.g. http://127.0.0.1:8080/v1), and the model name` : text
}

async function readAll(stream: any): Promise<string> {
  let text = ''
  const decoder = new TextDecoder()
  for await (const chunk of stream) text += typeof chunk === 'string' ? chunk : decoder.decode(chunk, { stream: true })
  return text + decoder.decode()
}

interface Terminal {
  rl: import('node:readline').Interface
  /** Every input, buffered from the start (inputs typed ahead are kept): one line, or a pasted
   *  block (bracketed paste) or `\`-continued lines joined with `\n`. */
  lines: AsyncIterator<string>
  /** Shows the prompt, unless the input has ended: `rl.prompt()` resumes a closed input, which keeps the process alive. */
  prompt(): void
  /** Shows `question` and resolves with the next input typed for it (never one typed ahead during a turn);
   *  undefined when the input ends or `signal` aborts (the input is not taken then). */
  ask(question: string, signal?: AbortSignal): Promise<string | undefined>
  /** `ask`, true for y/yes; anything else (and an abort) is no. */
  askYesNo(question: string, signal?: AbortSignal): Promise<boolean>
  /** True when the last question was answered with Ctrl-C: no answer, and nothing to remember. */
  readonly interrupted: boolean
  /** True while a question of {@link Terminal.ask} waits for its answer. */
  readonly asking: boolean
  /**
   * Marks a turn running (true) or ended (false). While it runs and no question is asked, what is
   * typed is not echoed into the answer: it is shown on the live line, and each finished input is
   * queued (`onTypedAhead` says so) to run after the turn, in order.
   */
  turn(running: boolean): void
  /** What has been typed ahead and not yet entered, while a turn runs ('' otherwise). */
  typedAhead(): string
  /** True when the input {@link Terminal.lines} gave last was typed ahead during a turn (it was not echoed at its prompt). */
  readonly lastTypedAhead: boolean
  /** Called with each input entered during a turn. */
  onTypedAhead?: (input: string) => void
  /** Closes the input and ends bracketed paste mode (once; main calls it last). */
  close(): void
}

/** Terminal modes (xterm, and every terminal that supports them): a paste arrives between
 *  `ESC [200~` and `ESC [201~`, which Node's readline reports as `paste-start` / `paste-end` keys. */
const BRACKETED_PASTE_ON = '\x1b[?2004h'
const BRACKETED_PASTE_OFF = '\x1b[?2004l'
const PROMPT = '› '
const CONTINUATION_PROMPT = '… '

/**
 * The interactive input: readline on the TTY, with bracketed paste switched on, so that a pasted
 * multi-line block is one input (its lines are held until Enter after the paste), and a line
 * ending in a single `\` continues on the next line (the `\` is dropped). During a turn readline's
 * echo is held back (its `_writeToOutput`, where a runtime has it), so type-ahead never lands in
 * the streamed answer.
 */
async function openTerminal(p: NodeProcess, io: CliOutput): Promise<Terminal> {
  const readline = await importNode<typeof import('node:readline')>('node:readline')
  const rl = readline.createInterface({ input: p.stdin, output: p.stderr as any, terminal: true, prompt: PROMPT })
  io.stderrRaw(BRACKETED_PASTE_ON)
  /** Inputs not yet taken; `ahead`: entered during a turn (only the loop takes those, never a question). */
  const queue: { text: string; ahead: boolean }[] = []
  const waiting: { resolve: (r: IteratorResult<string>) => void; question: boolean }[] = []
  let closed = false
  let pasting = false
  let pasteOff = false
  let held: string[] = []
  let running = false, asking = false, lastAhead = false, interrupted = false
  const muted = () => running && !asking
  const rlAny = rl as any
  if (typeof rlAny._writeToOutput === 'function') {
    const write = rlAny._writeToOutput
    rlAny._writeToOutput = function (text: string) { if (!muted()) write.call(this, text) }
  }
  const take = (question: boolean): { text: string; ahead: boolean } | undefined => {
    const i = question ? queue.findIndex((q) => !q.ahead) : 0
    return i === -1 || i >= queue.length ? undefined : queue.splice(i, 1)[0]
  }
  const deliver = (text: string) => {
    const ahead = muted()
    const w = waiting.findIndex((x) => !ahead || !x.question)
    if (w !== -1) { lastAhead = ahead; waiting.splice(w, 1)[0].resolve({ value: text, done: false }); return }
    queue.push({ text, ahead })
    if (ahead) terminal.onTypedAhead?.(text)
  }
  p.stdin.on('keypress', (_s: unknown, key: { name?: string } | undefined) => {
    if (key?.name === 'paste-start') pasting = true
    else if (key?.name === 'paste-end') pasting = false
  })
  rl.on('line', (line: string) => {
    if (pasting) { held.push(line); return }
    if (/(?<!\\)\\$/.test(line)) { held.push(line.slice(0, -1)); rl.setPrompt(CONTINUATION_PROMPT); if (!closed && !muted()) rl.prompt(); return }
    const input = [...held, line].join('\n')
    held = []
    rl.setPrompt(PROMPT)
    deliver(input)
  })
  rl.once('close', () => {
    closed = true
    if (held.length) { deliver(held.join('\n')); held = [] }
    for (const w of waiting.splice(0)) w.resolve({ value: undefined, done: true })
  })
  const next = (question: boolean): Promise<IteratorResult<string>> => {
    const queued = take(question)
    if (queued) { lastAhead = queued.ahead; return Promise.resolve({ value: queued.text, done: false }) }
    if (closed) return Promise.resolve({ value: undefined, done: true })
    return new Promise((resolve) => waiting.push({ resolve, question }))
  }
  const lines: AsyncIterator<string> = { next: () => next(false) }
  const prompt = () => { if (!closed) rl.prompt() }
  const ask = async (question: string, signal?: AbortSignal): Promise<string | undefined> => {
    if (signal?.aborted) return undefined
    io.live(undefined)
    asking = true
    interrupted = false
    // A question names paths and settings: what it shows cannot control the terminal (a directory named with OSC 52).
    question = stripControls(question)
    // Input that ended before the question (a paste, then end of input) still answers it: the question is shown.
    rl.setPrompt(question)
    if (closed) io.stderrRaw(question); else prompt()
    let stop: ((why: 'abort' | 'interrupt') => void) | undefined
    const onAbort = () => stop?.('abort'), onInterrupt = () => stop?.('interrupt')
    const answer = await new Promise<IteratorResult<string>>((resolve) => {
      const queued = take(true)
      if (queued) lastAhead = queued.ahead
      if (queued || closed) { resolve(queued ? { value: queued.text, done: false } : { value: undefined, done: true }); return }
      const entry = { resolve, question: true }
      waiting.push(entry)
      stop = (why) => {
        const i = waiting.indexOf(entry)
        if (i !== -1) waiting.splice(i, 1)
        if (why === 'interrupt') interrupted = true
        resolve({ value: undefined, done: true })
      }
      signal?.addEventListener('abort', onAbort, { once: true })
      rl.once('SIGINT', onInterrupt) // Ctrl-C: no answer (with no listener readline would close the input)
    })
    signal?.removeEventListener('abort', onAbort)
    rl.off('SIGINT', onInterrupt)
    asking = false
    rl.setPrompt(PROMPT)
    return answer.done ? undefined : answer.value
  }
  const terminal: Terminal = {
    rl, lines, prompt, ask,
    async askYesNo(question, signal) {
      const answer = await ask(question, signal)
      return answer !== undefined && /^y(es)?$/i.test(answer.trim())
    },
    get interrupted() { return interrupted },
    get asking() { return asking },
    turn(on) { running = on },
    typedAhead: () => (muted() ? String(rlAny.line ?? '') : ''),
    get lastTypedAhead() { return lastAhead },
    // Bracketed paste goes off here, at the end, not when the input ends: an input that ends
    // mid-turn (a pasted script) must not write into the answer being streamed.
    close: () => { rl.close(); if (!pasteOff) { pasteOff = true; io.stderrRaw(BRACKETED_PASTE_OFF) } },
  }
  return terminal
}

const INTERACTIVE_HELP = `commands: /usage (context and token use), /compact [FOCUS] (compact now), /context (what the next request holds, the newest checkpoint), /model NAME [--context-window N] (switch the model), /pin (pin your last input), /unpin, /diff (this session's changes), /undo (put back the files the last turn changed), /permissions (what runs without asking), /sessions (kept sessions), /help, /exit; Ctrl-C cancels a running turn, twice exits\n`

/**
 * Why `/compact` has nothing to summarise, as one plain sentence, or undefined when something older
 * than the tail compaction keeps exists. The rule is the ladder's own (docs/design.md §5 "Region"):
 * its region selection with the retained tail (`retainedTailRatio` × what the window keeps for the history)
 * and what it keeps out of every summary (pins, the current input).
 */
function nothingToCompact(agent: Agent): string | undefined {
  const window = agent.contextWindow
  if (window === undefined) return 'nothing was compacted: the context window is unknown, so dsh cannot tell what to keep; give --context-window N (or "contextWindow" in a configuration file)'
  const session = agent.session, nodes = session.surface()
  if (nodes.length === 0) return 'nothing to compact yet: the conversation is empty'
  // The ladder's own tail: a share of what the window keeps for the history (docs/design.md §5 "Room").
  const kept = keptWindowTokens(session, window), tailTokens = Math.floor(kept * agent.compaction.retainedTailRatio)
  const calibration = session.measure().calibration
  if (selectRegion(nodes, Math.floor(tailTokens / calibration), keptOutOfSummary(session))) return undefined
  const open = nodes.filter((n) => !isCheckpoint(n) && !Pins.of(session).has(n.seq))
  if (open.length === 0) return 'nothing to compact: everything is already a checkpoint or pinned'
  const tokens = Math.ceil(open.reduce((sum, n) => sum + n.tokens, 0) * calibration)
  const pinned = Pins.of(session).seqs().length > 0 ? ' (pinned messages aside)' : ''
  if (tokens > tailTokens) return `nothing to compact yet: what comes before the newest ${groupDigits(tailTokens)} tokens (the tail compaction keeps word for word) is one tool call with its result, which are summarised together or not at all`
  return `nothing to compact yet: the conversation${pinned} is ${groupDigits(tokens)} tokens, all within the newest ${groupDigits(tailTokens)} tokens (${Math.round(agent.compaction.retainedTailRatio * 100)}% of ${kept === window ? 'the window' : `the ${groupDigits(kept)} tokens the window keeps for the history past its large envelope`}) that compaction always keeps word for word`
}

/** `/compact`: runs the ladder now; one line says what happened (or that it was cancelled, or why there is nothing to do). */
async function compactCommand(agent: Agent, signal: AbortSignal, focus?: string): Promise<string> {
  const nothing = nothingToCompact(agent)
  if (nothing) return `[dsh] /compact: ${nothing}`
  try {
    const o = await agent.compactNow({ signal, focus })
    if (signal.aborted) return '[dsh] /compact cancelled; the context is unchanged'
    const tokens = o.tokensBefore === o.tokensAfter ? `${groupDigits(o.tokensAfter)} tokens` : `${groupDigits(o.tokensBefore)} → ${groupDigits(o.tokensAfter)} tokens`
    return `[dsh] /compact${focus ? ` (focus: ${focus})` : ''}: ${o.action}${o.reason ? ` (${o.reason})` : ''}; ${tokens}`
  } catch (err) {
    if (signal.aborted) return '[dsh] /compact cancelled; the context is unchanged'
    return `[dsh] /compact failed: ${failureText(err)}`
  }
}

/**
 * `/model NAME [--context-window N]` (docs/design.md §8): the model and window to switch to, or the
 * line to print instead (`/model` alone: the current model; a bad argument: what to type). The
 * window is N, else the one dsh knows for NAME, else unknown.
 */
function parseModelCommand(line: string, agent: Agent): { model: string; contextWindow?: number } | string {
  const words = line.trim().split(/\s+/).slice(1)
  const usage = 'type /model NAME [--context-window N], e.g. /model qwen3-coder --context-window 32768'
  if (words.length === 0) {
    const w = agent.contextWindow
    return `[dsh] model ${stripControls(agent.provider.model)} at ${agent.provider.baseURL}, ${w ? `${groupDigits(w)}-token window` : 'window unknown'}; to switch, ${usage}\n`
  }
  let model: string | undefined, contextWindow: number | undefined
  for (let i = 0; i < words.length; i++) {
    const word = words[i]
    if (word === '--context-window' || word.startsWith('--context-window=')) {
      const raw = word.includes('=') ? word.slice(word.indexOf('=') + 1) : words[++i]
      if (raw === undefined) return `[dsh] /model: --context-window needs a number of tokens; ${usage}\n`
      try { contextWindow = parsePositiveInt('--context-window', raw, 'tokens', '32768') } catch (err) { return `[dsh] /model: ${(err as Error).message}\n` }
    } else if (word.startsWith('-') || model !== undefined) return `[dsh] /model: unexpected ${JSON.stringify(stripControls(word))}; ${usage}\n`
    else model = word
  }
  if (model === undefined) return `[dsh] /model: no model name; ${usage}\n`
  return { model, ...(contextWindow !== undefined ? { contextWindow } : {}) }
}

/**
 * After `/model` made `agent` (a new Agent over the same session): logs its `request/header` at once,
 * so that the meter and the ladder measure against the new model and window (docs/design.md §8),
 * relieves pressure now if the new window needs it, and returns the line saying where it stands.
 */
async function modelSwitched(agent: Agent, signal: AbortSignal): Promise<string> {
  agent.writeHeader()
  const w = agent.contextWindow
  const name = stripControls(agent.provider.model)
  const head = `[dsh] model ${name}, ${w ? `${groupDigits(w)}-token window` : 'window unknown'}, from the next request`
  if (w === undefined) return `${head}; dsh does not know its window, so compaction is off: /model ${name} --context-window N sets it\n`
  let note = ''
  try {
    const o = await agent.ladder.relievePressure(signal)
    if (o.action !== 'none' && o.action !== 'skipped') note = ` after dsh ${o.action === 'failed' ? 'failed to compact' : o.action} for the new window (${groupDigits(o.tokensBefore)} tokens before)`
  } catch (err) { note = signal.aborted ? '; making room was cancelled' : `; making room failed: ${failureText(err)}` }
  return `${head}; ${occupancy(agent)}${note}\n`
}

/** Commands the interactive loop hands on (`/diff`, `/undo`, `/permissions`, `/sessions`: true when handled), and what goes with an input. */
interface InteractiveExtras {
  command(line: string, signal: AbortSignal): Promise<boolean>
  input(line: string): string
}

/** The interactive loop: a prompt per turn, slash commands, Ctrl-C cancels the running turn. */
async function interactiveLoop(current: () => Agent, terminal: Terminal, io: CliOutput, endLine: () => void, extras?: InteractiveExtras): Promise<number> {
  const rl = terminal.rl
  let agent = current()
  let running: AbortController | undefined
  let exitCode = 0
  io.stderr(`dsh ${VERSION} · ${agent.provider.model} · ${agent.contextWindow ? `${groupDigits(agent.contextWindow)}-token window` : 'window unknown'} · /help for commands\n`)
  // At the prompt a Ctrl-C clears what is typed; a second one in a row (no other key between) exits.
  let armed = false
  ;(rl as any).input?.on?.('keypress', (_s: unknown, key: { ctrl?: boolean; name?: string } | undefined) => { if (!(key?.ctrl && key.name === 'c')) armed = false })
  rl.on('SIGINT', () => {
    if (running && !running.signal.aborted) { running.abort(); io.stderr('\n[dsh] cancelling (Ctrl-C again to exit)\n'); return }
    if (running || armed) { rl.close(); return }
    armed = true
    const typed = rl.line !== ''
    if (typed) { rl.write(null, { ctrl: true, name: 'e' }); rl.write(null, { ctrl: true, name: 'u' }) }
    io.stderr(`\n[dsh] ${typed ? 'input cleared; ' : ''}Ctrl-C again exits (so does /exit)\n`)
    terminal.prompt()
  })
  terminal.onTypedAhead = (text) => { endLine(); io.stderr(`[dsh] queued, runs after this turn: ${oneLine(text, 100)}\n`) }
  terminal.prompt()
  for (let next = await terminal.lines.next(); !next.done; next = await terminal.lines.next()) {
    agent = current() // `/model` may have made another
    const raw = next.value
    if (terminal.lastTypedAhead) { io.stderrRaw('\r\x1b[K'); io.stderr(`${PROMPT}${raw}\n`) } // it was not echoed when typed
    const line = raw.trim()
    if (line === '') { terminal.prompt(); continue }
    if (line === '/exit' || line === '/quit') break
    if (line === '/help') io.stderr(INTERACTIVE_HELP)
    else if (line === '/usage') io.stderr(await usageReport(agent))
    else if (isFidelityCommand(line)) {
      running = new AbortController()
      io.stderr(await fidelityCommand(agent, line, running.signal))
    } else if (extras && line.startsWith('/') && await extras.command(line, (running = new AbortController()).signal)) { /* done */ }
    else if (line.startsWith('/')) io.stderr(`unknown command ${line}; ${INTERACTIVE_HELP}`)
    else {
      running = new AbortController()
      terminal.turn(true)
      try {
        const result = await agent.run(extras ? extras.input(line) : line, { signal: running.signal })
        endLine()
        const problem = turnProblem(agent, result)
        if (result.reason === 'aborted') io.stderr('[dsh] turn cancelled\n')
        else if (problem) io.stderr(`[dsh] ${problem}\n`)
        exitCode = 0
      } catch (err) {
        endLine()
        io.stderr(`dsh: ${failureText(err)}\n`)
        exitCode = 1
      } finally { terminal.turn(false) }
    }
    running = undefined
    terminal.prompt()
  }
  rl.close()
  return exitCode
}

// ── 11.4 Fidelity views: project instructions, /pin, /compact FOCUS, /context, `dsh show` (docs/design.md §12) ──

/** Files the CLI reads project instructions from, in order: the first that exists in the working directory wins. */
export const PROJECT_INSTRUCTION_FILES: readonly string[] = ['AGENTS.md', 'CLAUDE.md']
/** Largest project-instructions file the CLI accepts, in UTF-8 bytes (64 KiB ≈ 16,000 tokens, all of it in every request). */
export const PROJECT_INSTRUCTIONS_MAX_BYTES = 65_536 // 64 KiB

/** Project instructions read by {@link readProjectInstructions}: the file name, its size in bytes, and the text for the envelope. */
export interface ProjectInstructions { file: string; bytes: number; text: string }

/**
 * Reads `AGENTS.md`, else `CLAUDE.md`, from `cwd` (node:fs) and frames it for the system prompt
 * (the envelope, which compaction never touches). Undefined when neither exists (or is not a
 * file). Throws {@link UsageError} for a file it cannot read or one over
 * {@link PROJECT_INSTRUCTIONS_MAX_BYTES}, naming the fix.
 */
export async function readProjectInstructions(cwd: string): Promise<ProjectInstructions | undefined> {
  const fs = await importNode<typeof import('node:fs/promises')>('node:fs/promises')
  for (const file of PROJECT_INSTRUCTION_FILES) {
    const path = `${cwd.replace(/[\\/]+$/, '')}/${file}`
    let bytes: Uint8Array
    try {
      const stat = await fs.stat(path)
      if (!stat.isFile()) continue
      // A symlink may point anywhere (a cloned repo's AGENTS.md → ~/.aws/credentials): only a file
      // inside the working directory is read, as the tools would.
      const [real, root] = await Promise.all([fs.realpath(path), fs.realpath(cwd)])
      if (real !== root && !real.startsWith(root.endsWith('/') ? root : root + '/')) {
        throw new UsageError(`${file} in ${cwd} links to ${real}, outside the working directory; it is not read into the system prompt. Replace the link with the file, or pass --no-project-instructions`)
      }
      const tooLarge = (size: number) => new UsageError(`${file} is ${groupDigits(size)} bytes, over the ${groupDigits(PROJECT_INSTRUCTIONS_MAX_BYTES)}-byte limit for project instructions (they go into every request); shorten it or pass --no-project-instructions`)
      if (stat.size > PROJECT_INSTRUCTIONS_MAX_BYTES) throw tooLarge(stat.size)
      bytes = await fs.readFile(path)
      if (bytes.length > PROJECT_INSTRUCTIONS_MAX_BYTES) throw tooLarge(bytes.length) // it grew after the stat
    } catch (err: any) {
      if (err instanceof UsageError) throw err
      if (err?.code === 'ENOENT' || err?.code === 'ENOTDIR') continue
      throw new UsageError(`cannot read ${file} in ${cwd}: ${err?.message ?? err}; fix its permissions or pass --no-project-instructions`)
    }
    const body = new TextDecoder().decode(bytes).trim()
    if (body === '') continue
    return { file, bytes: bytes.length, text: `Project instructions from ${file} in the working directory; follow them throughout the session:\n\n${body}` }
  }
  return undefined
}

/** The seq of the user's last input still on the surface (not a checkpoint), if any: what `/pin` pins. */
function lastInputSeq(session: Session): number | undefined {
  const nodes = session.surface()
  for (let i = nodes.length - 1; i >= 0; i--) if (nodes[i].message.role === 'user' && !isCheckpoint(nodes[i])) return nodes[i].seq
  return undefined
}

/** Token and message counts of one part of a request. */
export interface ContextPart { tokens: number; messages: number }

/**
 * What the next request holds, by the §2 estimate, in tokens (the CLI's `/context`): the envelope,
 * pinned messages, checkpoints, other messages and tool results (with how many are pruned or
 * cleared placeholders), and the originals kept out of it (pruned, cleared, summarised), read from
 * the log; plus the newest checkpoint with its fidelity figures.
 */
export interface ContextBreakdown {
  /** The measured total (anchored on provider usage when `anchored`), tokens. */
  totalTokens: number
  anchored: boolean
  contextWindow?: number
  envelopeTokens: number
  pinned: ContextPart
  checkpoints: ContextPart
  messages: ContextPart
  toolResults: ContextPart & { pruned: number; cleared: number }
  /** Originals out of the request, kept in the log: pruned and cleared tool results, messages folded into checkpoints (tokens = their price when they were shadowed). */
  shadowed: { pruned: ContextPart; cleared: ContextPart; summarised: ContextPart & { compactions: number } }
  newestCheckpoint?: { seq: number; tokens: number; text: string; fidelity?: Fidelity }
}

/** Computes the {@link ContextBreakdown} of `session` (reads the log back: O(log) — a command, not a hot path). */
export async function contextBreakdown(session: Session, contextWindow?: number): Promise<ContextBreakdown> {
  const m = session.measure()
  const part = (): ContextPart => ({ tokens: 0, messages: 0 })
  const out: ContextBreakdown = {
    totalTokens: m.totalTokens, anchored: m.anchored, contextWindow, envelopeTokens: m.envelopeTokens,
    pinned: part(), checkpoints: part(), messages: part(), toolResults: { ...part(), pruned: 0, cleared: 0 },
    shadowed: { pruned: part(), cleared: part(), summarised: { ...part(), compactions: 0 } },
  }
  const add = (p: ContextPart, tokens: number) => { p.tokens += tokens; p.messages++ }
  for (const n of session.surface()) {
    if (Pins.of(session).has(n.seq)) add(out.pinned, n.tokens)
    else if (isCheckpoint(n)) { add(out.checkpoints, n.tokens); out.newestCheckpoint = { seq: n.seq, tokens: n.tokens, text: messageText(n.message) } }
    else if (n.message.role === 'tool') {
      add(out.toolResults, n.tokens)
      const op = ((await session.readEvent(n.seq)).data as any).surfaceOp as SurfaceOp
      if (op.op === 'replace' && n.seq > 0) {
        const before = (await session.readEvent(n.seq - 1)).type
        if (before === 'compaction/prune') out.toolResults.pruned++
        else if (before === 'compaction/clear') out.toolResults.cleared++
      }
    } else add(out.messages, n.tokens)
  }
  for await (const e of session.readEvents()) {
    const d = e.data as any
    const tokens = typeof d.shadowedTokenCount === 'number' ? d.shadowedTokenCount : 0 // a log written by other code may lack them
    const messages = Array.isArray(d.shadowedSeqs) ? d.shadowedSeqs.length : 0
    if (e.type === 'compaction/prune') { out.shadowed.pruned.tokens += tokens; out.shadowed.pruned.messages += messages }
    else if (e.type === 'compaction/clear') { out.shadowed.cleared.tokens += tokens; out.shadowed.cleared.messages += messages }
    else if (e.type === 'compaction/summary') {
      const s = out.shadowed.summarised
      s.tokens += tokens; s.messages += messages; s.compactions++
      if (out.newestCheckpoint && e.seq === out.newestCheckpoint.seq - 1) out.newestCheckpoint.fidelity = d.fidelity
    }
  }
  return out
}

/** "kept/total" per kind, for the checkpoint and for the model's summary alone. */
function fidelityText(f: Fidelity): string {
  const kinds: Array<[keyof Fidelity, string]> = [['paths', 'paths'], ['commands', 'commands'], ['errors', 'error lines'], ['userMessages', 'user messages']]
  const counts = (v: unknown) => isRecord(v) && ['inCheckpoint', 'inSummary', 'total'].every((k) => Number.isSafeInteger(v[k]))
  if (!isRecord(f) || !kinds.every(([k]) => counts(f[k]))) return 'fidelity figures not in the shape dsh writes (not shown)'
  return `verbatim in it: ${kinds.map(([k, name]) => `${name} ${f[k].inCheckpoint}/${f[k].total}`).join(', ')} (in the model's summary alone: ${kinds.map(([k]) => `${f[k].inSummary}/${f[k].total}`).join(', ')})`
}

/** Cells of the `/context` bar. */
const CONTEXT_BAR_CELLS = 40

/**
 * The first line of `/context`: a bar of {@link CONTEXT_BAR_CELLS} cells over the window, one glyph per
 * part (envelope █, pinned ▓, checkpoints ▒, recent messages and tool results ░, free ·), then each
 * part's share of the window. The parts are heuristic prices, scaled to the measured total (which is
 * anchored on provider usage when it can be); without a window, shares of the total and no free part.
 */
export function contextBar(b: ContextBreakdown): string {
  const parts = [
    { glyph: '█', name: 'envelope', tokens: b.envelopeTokens }, { glyph: '▓', name: 'pinned', tokens: b.pinned.tokens },
    { glyph: '▒', name: 'checkpoints', tokens: b.checkpoints.tokens }, { glyph: '░', name: 'recent', tokens: b.messages.tokens + b.toolResults.tokens },
  ]
  const priced = parts.reduce((sum, p) => sum + p.tokens, 0)
  const scale = priced > 0 ? b.totalTokens / priced : 0
  for (const p of parts) p.tokens *= scale
  const whole = b.contextWindow ?? Math.max(1, b.totalTokens)
  if (b.contextWindow !== undefined) parts.push({ glyph: '·', name: 'free', tokens: Math.max(0, whole - b.totalTokens) })
  // Largest remainder: the cells add up to the bar, each part as near its share as whole cells allow.
  const exact = parts.map((p) => (Math.min(p.tokens, whole) / Math.max(whole, b.totalTokens)) * CONTEXT_BAR_CELLS)
  const cells = exact.map(Math.floor)
  const order = exact.map((x, i) => [x - Math.floor(x), i]).sort((x, y) => y[0] - x[0])
  for (let k = 0, left = CONTEXT_BAR_CELLS - cells.reduce((a, c) => a + c, 0); k < left && k < order.length; k++) cells[order[k][1]]++
  const bar = parts.map((p, i) => p.glyph.repeat(cells[i])).join('')
  const share = (tokens: number) => { const pct = (tokens / whole) * 100; return pct > 0 && pct < 1 ? '<1%' : `${Math.round(pct)}%` }
  return `${bar} ${parts.map((p) => `${p.glyph} ${p.name} ${share(p.tokens)}`).join('  ')}${b.contextWindow === undefined ? ' (of the total: window unknown)' : ''}`
}

/** The `/context` report: its bar, the breakdown of the next request, then the newest checkpoint in full. */
export function formatContext(b: ContextBreakdown, options: { recall?: boolean } = {}): string {
  const w = b.contextWindow
  const row = (name: string, tokens: number, what: string) => `  ${name.padEnd(14)}${groupDigits(tokens).padStart(9)} tokens  ${what}`
  const n = (k: number, word: string) => `${groupDigits(k)} ${word}${k === 1 ? '' : 's'}`
  const t = b.toolResults
  const lines = [
    contextBar(b),
    `next request: ${groupDigits(b.totalTokens)}${w ? ` / ${groupDigits(w)} tokens (${((b.totalTokens / w) * 100).toFixed(1)}%)` : ' tokens (window unknown)'}, ${b.anchored ? 'anchored on provider usage' : 'heuristic estimate'}`,
    row('envelope', b.envelopeTokens, 'system prompt (with project instructions, if any) and tool specs'),
    row('pinned', b.pinned.tokens, n(b.pinned.messages, 'message')),
    row('checkpoints', b.checkpoints.tokens, n(b.checkpoints.messages, 'checkpoint')),
    row('messages', b.messages.tokens, n(b.messages.messages, 'message')),
    row('tool results', t.tokens, `${n(t.messages, 'result')}${t.pruned || t.cleared ? ` (${t.pruned} pruned, ${t.cleared} cleared)` : ''}`),
    `originals kept in the log, out of the request${options.recall ? ' (the recall tool returns them)' : ''}:`,
    row('pruned', b.shadowed.pruned.tokens, n(b.shadowed.pruned.messages, 'tool result')),
    row('cleared', b.shadowed.cleared.tokens, n(b.shadowed.cleared.messages, 'tool result')),
    row('summarised', b.shadowed.summarised.tokens, `${n(b.shadowed.summarised.messages, 'message')} in ${n(b.shadowed.summarised.compactions, 'compaction')}`),
  ]
  const c = b.newestCheckpoint
  if (!c) lines.push('no checkpoint yet')
  else lines.push(`newest checkpoint: seq ${c.seq}, ${groupDigits(c.tokens)} tokens${c.fidelity ? `; ${fidelityText(c.fidelity)}` : ''}`, c.text)
  return lines.join('\n') + '\n'
}

/** True for the interactive commands of this section: `/pin`, `/unpin`, `/context`, `/compact [FOCUS]`. */
export function isFidelityCommand(line: string): boolean { return /^\/(pin|unpin|context|compact)(\s|$)/.test(line) }

/**
 * Runs `/pin` (pins the last input), `/unpin` (removes the newest pin), `/context`, or
 * `/compact [FOCUS]` (compacts now, FOCUS into the summary instruction) on `agent`; returns what to print.
 */
export async function fidelityCommand(agent: Agent, line: string, signal?: AbortSignal): Promise<string> {
  const command = line.trim().split(/\s+/)[0]
  const session = agent.session
  if (command === '/pin') {
    const seq = lastInputSeq(session)
    if (seq === undefined) return '[dsh] /pin: nothing to pin yet: type an input first; /pin pins the last one\n'
    if (Pins.of(session).has(seq)) return `[dsh] /pin: your last input (seq ${seq}) is already pinned\n`
    try { agent.pin(seq) } catch (err) { return `[dsh] /pin: ${(err as Error).message}\n` }
    return `[dsh] pinned your last input (seq ${seq}, ${groupDigits(session.surface().node(seq)!.tokens)} tokens): it is never pruned, cleared or summarised; pinned messages hold ${groupDigits(Pins.of(session).tokens())} tokens\n`
  }
  if (command === '/unpin') {
    const seq = Pins.of(session).seqs().at(-1)
    if (seq === undefined) return '[dsh] /unpin: nothing is pinned\n'
    Pins.of(session).unpin(seq)
    return `[dsh] unpinned seq ${seq}; ${Pins.of(session).seqs().length} pinned message(s) left\n`
  }
  if (command === '/context') return formatContext(await contextBreakdown(session, agent.contextWindow), { recall: agent.tools.some((t) => t.name === 'recall') })
  return await compactCommand(agent, signal ?? new AbortController().signal, line.trim().slice(command.length).trim() || undefined) + '\n'
}

/** `dsh show FILE`: print a session log as a readable transcript. */
export interface CliShowOptions {
  command: 'show'
  /** The session log (path as given). */
  file: string
  /** `--checkpoints`: print every checkpoint in full. */
  checkpoints: boolean
  /** `-C DIR` / `--cwd DIR`: resolve FILE from DIR. */
  cwd?: string
}

/** One line of text for a transcript: newlines shown as `⏎`, cut to `max` code points with `…`; a value that is no text
 *  (a field a hostile or older log lacks) is said to be missing, so that `dsh show` prints every event. */
function oneLine(text: unknown, max = 120): string {
  if (typeof text !== 'string') return `(no text: the event holds ${text === undefined ? 'none' : typeof text} here)`
  const flat = text.replace(/\r\n|\r|\n/g, ' ⏎ ').replace(/\t/g, ' ')
  const end = indexAfterCodePoints(flat, max)
  return end < flat.length ? flat.slice(0, end) + '…' : flat
}

/**
 * A session log as a readable transcript (`dsh show`): turns, user inputs, assistant text and
 * tool calls, tool results with their price, and every prune, clear and compaction marked with its
 * token figures (original → replacement; context before → after); `checkpoints` prints each
 * checkpoint in full. Pins, resumes, overflow errors, retries and warnings are marked too.
 */
export async function showSession(session: Session, options: { checkpoints?: boolean; name?: string } = {}): Promise<string> {
  const out: string[] = []
  const names = new Map<string, string>()
  // every field is printed through these: a hostile or older log's value cannot draw lines of its own (a model name
  // with line breaks faked a turn) or be what it is not (NaN, an object)
  const t = (n: unknown) => (typeof n === 'number' && Number.isFinite(n) ? `${groupDigits(n)} tokens` : '? tokens')
  const f = (v: unknown) => (typeof v === 'number' && Number.isFinite(v) ? String(v) : typeof v === 'string' ? oneLine(v) : '?')
  let turns = 0, steps = 0, prunes = 0, clears = 0, compactions = 0
  let pending: { id: string; summary?: any } | undefined
  for await (const e of session.readEvents()) {
    const d = e.data as any
    const at = `#${e.seq}`
    switch (e.type) {
      case 'session/start': out.push(`session ${f(d.id)} (dsh ${f(d.version)})`); break
      case 'session/resume': out.push(`— resumed after seq ${f(d.lastSeq)}${d.repaired ? `; ${f(d.repaired)} tool call(s) without a result closed` : ''}`); break
      case 'request/header': out.push(`— model ${f(d.model)} at ${f(d.baseURL)}${d.contextWindow ? `, ${t(d.contextWindow).replace(' tokens', '')}-token window` : ''}; envelope ${t(estimateEnvelopeTokens(d))}`); break
      case 'turn/start': turns++; out.push('', `turn ${f(d.turn)}`); break
      case 'turn/end': out.push(`  (turn ${f(d.turn)} ended: ${f(d.reason)})`); break
      case 'step/start': steps++; break
      case 'user/message': {
        if (d.compactionId !== undefined) {
          const tokens = estimateMessageTokens(d.message)
          const s = pending && pending.id === d.compactionId ? pending.summary : undefined
          const folded = !s ? '' : Array.isArray(s.shadowedSeqs) ? `${s.shadowedSeqs.length} messages (seq ${f(s.shadowedSeqs[0])}..${f(s.shadowedSeqs.at(-1))}), ` : 'messages (the summary event has no shadowedSeqs), '
          out.push(`  ${at} checkpoint ${f(d.compactionId)}: ${s ? `${folded}${t(s.shadowedTokenCount)} → ${t(tokens)}` : t(tokens)}`)
          if (s?.fidelity) out.push(`      ${fidelityText(s.fidelity)}`)
          if (options.checkpoints) for (const l of messageText(d.message).split('\n')) out.push(`      | ${l}`)
        } else if (d.surfaceOp.op === 'replace') out.push(`  ${at} user message ${f(d.surfaceOp.start)} cut to ${t(estimateMessageTokens(d.message))}`)
        else out.push(`  ${at} user: ${oneLine(messageText(d.message))}`)
        break
      }
      case 'assistant/message': {
        const m = d.message as AssistantMessage
        if (d.surfaceOp.op === 'replace') { out.push(`  ${at} assistant message ${f(d.surfaceOp.start)} cut to ${t(estimateMessageTokens(m))}`); break }
        const text = contentText(m.content)
        if (text.trim()) out.push(`  ${at} assistant${m.interrupted ? ' (interrupted)' : ''}: ${oneLine(text)}`)
        for (const c of toolCalls(m)) { names.set(c.id, oneLine(c.name, 100)); out.push(`  ${at} → ${oneLine(c.name, 100)} ${oneLine(c.arguments, 100)}`) }
        break
      }
      case 'tool/result': {
        if (d.surfaceOp.op === 'replace') break // the prune or clear line above says it
        const r = d.message as ToolResultMessage
        out.push(`  ${at} ${names.get(r.toolCallId) ?? 'tool'} result${r.isError ? ' (error)' : ''}, ${t(estimateMessageTokens(r))}${d.spilled ? `, spilled ${groupDigits(d.spilled.bytes)} bytes to ${d.spilled.ref}` : ''}: ${oneLine(messageText(r), 80)}`)
        break
      }
      case 'compaction/prune':
      case 'compaction/clear': {
        e.type === 'compaction/prune' ? prunes++ : clears++
        const next = e.seq + 1 < session.seq ? await session.readEvent(e.seq + 1) : undefined
        const after = next?.type === 'tool/result' ? estimateMessageTokens((next.data as any).message) : undefined
        // A log written by other code may lack a field: shown, and said to be missing.
        const seqs = Array.isArray(d.shadowedSeqs) ? `#${d.shadowedSeqs.map(f).join(', #')}` : '(the event has no shadowedSeqs)'
        const before = typeof d.shadowedTokenCount === 'number' ? d.shadowedTokenCount : undefined
        const figures = before === undefined ? `? tokens (the event has no shadowedTokenCount)${after === undefined ? '' : ` → ${t(after)}`}`
          : `${t(before)}${after === undefined ? '' : ` → ${t(after)} (${t(before - after)} reclaimed)`}`
        out.push(`  [${e.type === 'compaction/prune' ? 'prune' : 'clear'}] ${at} tool result ${seqs}: ${figures}${d.trigger ? `, ${f(d.trigger)}` : ''}`)
        break
      }
      case 'compaction/start': pending = { id: d.id }; out.push(`  [compaction ${f(d.id)}] ${at} started (${f(d.trigger)})`); break
      case 'compaction/summary': if (pending && pending.id === d.id) pending.summary = d; compactions++; break
      case 'compaction/end': out.push(`  [compaction ${f(d.id)}] ${d.error ? `failed: ${f(d.error)}` : `context ${t(d.tokensBefore)} → ${t(d.tokensAfter)}`}`); pending = undefined; break
      case 'compaction/warning': out.push(`  [warning] ${f(d.message)} (context ${t(d.totalTokens)}, threshold ${t(d.thresholdTokens)})`); break
      case 'request/error': out.push(`  ${at} request failed: ${f(d.code)}${d.status ? ` (HTTP ${f(d.status)})` : ''}: ${oneLine(d.message)}`); break
      case 'recovery/retry': out.push(`  ${at} overflow recovered (replace generation ${f(d.generationBefore)} → ${f(d.generationAfter)}); step retried`); break
      case 'surface/pin': out.push(`  [pin] ${at} message #${f(d.seq)} pinned`); break
      case 'surface/unpin': out.push(`  [unpin] ${at} message #${f(d.seq)}`); break
    }
  }
  const m = session.measure()
  const head = `dsh show ${options.name ?? 'session'}: ${session.seq} events, ${turns} turn(s), ${steps} step(s), ${prunes} prune(s), ${clears} clear(s), ${compactions} compaction(s); surface now ${m.nodes.length} messages, ${t(m.heuristicTokens)}`
  return [head, ...out].join('\n') + '\n'
}

/** Parses `dsh show FILE [--checkpoints]`. Throws {@link UsageError}. */
function parseShowArgs(args: readonly string[]): CliShowOptions {
  const files: string[] = []
  let checkpoints = false
  let cwd: string | undefined
  for (let i = 0; i < args.length; i++) {
    const a = args[i]
    if (a === '--checkpoints') checkpoints = true
    else if (a === '-C' || a === '--cwd' || a.startsWith('--cwd=')) {
      cwd = a.startsWith('--cwd=') ? a.slice(6) : args[++i]
      if (!cwd) throw new UsageError('-C/--cwd needs a directory, e.g. -C ../my-project')
    } else if (a.startsWith('-')) throw new UsageError(`show takes FILE, --checkpoints and -C DIR, got ${JSON.stringify(a)}: npx tsx dsh.ts show FILE [--checkpoints]`)
    else files.push(a)
  }
  if (files.length !== 1) throw new UsageError(`show needs one session log FILE, got ${files.length}: npx tsx dsh.ts show FILE [--checkpoints]`)
  return { command: 'show', file: files[0], checkpoints, ...(cwd !== undefined ? { cwd } : {}) }
}

/**
 * `dsh show FILE`: reads the log (never writes to it: a torn last line is reported, not cut) and
 * prints {@link showSession}. A file that is not a dsh log is a usage error (exit 2).
 */
async function showCommand(options: CliShowOptions, io: CliIO, name = options.file): Promise<number> {
  let session: Session
  try {
    // Streamed and read-only: only the surface is kept in memory; old events are read back as shown.
    const fs = await importNode<typeof import('node:fs/promises')>('node:fs/promises')
    try { await fs.access(options.file) } catch (err) { io.stderr(`dsh: show: cannot read ${name}: ${(err as Error).message}\n`); return 2 }
    session = await Session.open(new FileStore(options.file, { readOnly: true }), { readOnly: true })
    const parsed = session
    if (parsed.torn) io.stderr(`dsh: show: ${name}: the last line (line ${parsed.torn.line}, ${parsed.torn.bytes} bytes) is incomplete (a crash, or a writer still running); shown without it\n`)
  } catch (err) {
    if (err instanceof SessionError) { io.stderr(`dsh: show: ${name}: ${err.message}\n`); return 2 }
    throw err
  }
  io.stdout(await showSession(session, { checkpoints: options.checkpoints, name }))
  return 0
}

/**
 * `dsh replay FILE`: reads the file (node:fs) and runs {@link runReplay}; a file that is not a
 * transcript, or a bad option, is a usage error (exit 2). With `--base-url`/`--model`/`--api-key-env`
 * the summaries come from that model; otherwise they are simulated. `name` is FILE as given.
 */
async function replayCommand(options: CliReplayOptions, _p: NodeProcess, io: CliIO, name = options.file): Promise<number> {
  const fs = await importNode<typeof import('node:fs/promises')>('node:fs/promises')
  let text: string
  try { text = await readTranscriptFile(fs, options.file) } catch (err) { io.stderr(`dsh: replay: cannot read ${name}: ${(err as Error).message}\n`); return 2 }
  const s = options.summarizer
  const summarizer = s ? openAICompatible({ baseURL: s.baseURL, model: s.model, apiKey: s.apiKey, contextWindow: options.contextWindow }) : undefined
  try {
    const { output } = await runReplay(text, {
      format: options.format === 'auto' ? undefined : options.format, contextWindow: options.contextWindow, thresholdRatio: options.threshold,
      summaryTokens: options.summaryTokens, summarizer, json: options.json, name, sidechains: options.sidechains, figures: FIDELITY_FIGURES,
      ...(options.clear === false ? { compaction: { clear: false } } : {}),
      ...(options.prices ? { prices: { ...options.prices, peak: undefined } } : {}),
    })
    io.stdout(output.endsWith('\n') ? output : output + '\n')
    return 0
  } catch (err) {
    if (err instanceof TranscriptError || err instanceof RangeError || err instanceof SessionError) { io.stderr(`dsh: replay: ${name}: ${err.message.replace(/^replay: /, '')}\n`); return 2 }
    // the transcript's own input over the window is the input's problem, not the summarizer's
    if (err instanceof ProviderError && err.code === 'CONTEXT_WINDOW_EXCEEDED' && !s) {
      io.stderr(`dsh: replay: ${name}: the transcript does not fit the window: ${err.message} `
        + `(for replay: a larger --context-window)\n`)
      return 2
    }
    if (err instanceof ProviderError) { io.stderr(`dsh: replay: ${s ? 'the summarizer failed' : 'failed'}: ${err.code}: ${err.message}\n`); return 1 }
    throw err
  }
}

/**
 * Runs the CLI as this process's program: {@link main} on `process.argv`, its result as the exit
 * code; an unexpected throw is printed as `dsh: internal error: …` with exit code 1. {@link runIfProgram}
 * calls it; call it yourself from a wrapper script that should behave like `dsh`.
 */
export async function runAsProgram(): Promise<void> {
  const p = (await importNode<any>('node:process')).default
  try { p.exitCode = await main(p.argv.slice(2), p) } catch (err) {
    p.stderr.write(`dsh: internal error: ${(err as Error)?.stack ?? err}\n`)
    p.exitCode = 1
  }
}

/**
 * Runs the CLI ({@link runAsProgram}) when this module is the program ({@link isEntryPoint}) and its file
 * has one of dsh's names (dsh.ts, dsh.js, dsh.mjs, cli.mjs), else does nothing; the entry statement below
 * calls it through this module's own namespace.
 */
export async function runIfProgram(): Promise<void> {
  // An app that bundles dsh.ts whole (`export * from`) and is run itself holds this code too, and is the
  // program: only a file of dsh's own names starts the CLI (docs/design.md §0).
  const file = decodeURIComponent(new URL(import.meta.url).pathname.split('/').pop() ?? '')
  if (DSH_ENTRY_FILES.test(file) && await isEntryPoint()) await runAsProgram()
}

/** The file names the CLI runs from: a copy of this file (dsh.ts, or as .js/.mjs) and the package's dist/cli.mjs. */
const DSH_ENTRY_FILES = /^(?:dsh\.(?:ts|js|mjs)|cli\.mjs)$/

// The entry statement: runs the CLI when this file (or dist/cli.mjs) is the program, never on import.
// It names no Part II code — it reaches runIfProgram through a dynamic import of this module itself —
// so an app that bundles only the runtime from this file keeps this one line and drops Part II (a
// statement that named isEntryPoint kept it and every Part II constant before it). An app's bundle
// has its own URL and exports no runIfProgram, so there the import finds nothing to run.
if (import.meta.url?.startsWith('file:')) {
  import(import.meta.url).then((self: { runIfProgram?: () => Promise<void> }) => self.runIfProgram?.(), () => {})
}

// ════════════════════════════════════════════════════════════════════════════════════════════
// 12. File store — FileStore, a session log in a JSONL file (node:fs); dist/dsh.mjs carries it too
// ════════════════════════════════════════════════════════════════════════════════════════════
// The one store that needs `node:fs` (Node, Deno, Bun), so it lives below the fence; build.mjs adds
// this section (and only this one of Part II) to the runtime bundle `dist/dsh.mjs` and its types,
// so it names nothing of Part II and holds only declarations (docs/design.md §0, §4, §13).
// `importNode` is here too: the other sections of Part II load their `node:` modules through it.

export { FileStore }

/**
 * The `node:` modules loaded so far, by specifier (see {@link importNode}). A `var`, created by
 * the first call: the entry check (the end of section 11) calls importNode while the module is
 * still being evaluated, before this line would have run.
 */
var nodeModules: Map<string, Promise<any>> | undefined

/**
 * Loads a `node:` module lazily (file store, CLI), once per process: later calls get the same
 * promise (a dynamic `import()` per call costs a trip through the module loader — under tsx, to
 * its loader thread and back). The specifier is computed, so that a user's bundler (esbuild, Vite,
 * webpack) leaves it alone when it bundles dsh.ts for an edge or browser target, where these
 * parts never run.
 */
function importNode<T = any>(specifier: `node:${string}`): Promise<T> {
  const loaded = nodeModules ??= new Map()
  let loading = loaded.get(specifier)
  if (!loading) {
    loading = import(/* webpackIgnore: true */ /* @vite-ignore */ specifier)
    loading.catch(() => loaded.delete(specifier)) // a failed load is tried again next time
    loaded.set(specifier, loading)
  }
  return loading
}

/**
 * The file a FileStore appends to, written with synchronous calls: an append is one `write` to the
 * page cache (microseconds, no trip to libuv's thread pool and back); only `sync` (fsync, which
 * waits for the disk) runs off the main thread. The file is opened for appending (O_APPEND).
 */
interface AppendHandle {
  write(bytes: Uint8Array, offset: number, length: number): { bytesWritten: number }
  truncate(bytes: number): void
  stat(): { size: number; dev: number; ino: number }
  sync(): Promise<void>
  close(): void
}

function appendHandle(fs: typeof import('node:fs'), fd: number): AppendHandle {
  return {
    write: (bytes, offset, length) => ({ bytesWritten: fs.writeSync(fd, bytes, offset, length) }),
    truncate: (bytes) => fs.ftruncateSync(fd, bytes),
    stat: () => fs.fstatSync(fd),
    sync: () => new Promise((resolve, reject) => fs.fsync(fd, (err) => { if (err) reject(err); else resolve() })),
    close: () => fs.closeSync(fd),
  }
}

/** Whether two stats name the same file (device and inode). */
function sameFile(a: { dev: number; ino: number }, b: { dev: number; ino: number }): boolean { return a.dev === b.dev
  && a.ino === b.ino }

/** Bytes read from a log file per `read` call while loading or scanning (4 MiB). */
const LOG_READ_CHUNK_BYTES = 4_194_304 // 4 MiB
/** A FileStore's scratch buffer: at least 64 KiB, grown by doubling; a batch over 1 MiB gets its own buffer. */
const SCRATCH_MIN_BYTES = 65_536, SCRATCH_MAX_BYTES = 1_048_576

/**
 * A JSONL file store for Node, Deno and Bun (node:fs, loaded lazily). One event per line.
 * One writer per log (docs/design.md §13): the first write takes `FILE.lock` (see
 * {@link acquireLogLock}) and `close()` gives it back; reading takes no lock.
 * `sync()` fsyncs. Loading streams the file line by line (no whole-file string, no size ceiling),
 * drops a torn last line — its bytes are saved beside the log as `FILE.torn-<time>` and the file is
 * truncated to its last whole line — and refuses any other corruption with the line number.
 * The store is *readable* (see {@link LogStore.scan}): it keeps the byte offset of every event's
 * line (8 bytes per event) and reads events back from the file on demand, so a {@link Session} on
 * it holds only its surface in memory. Spilled tool results go to `FILE.artefacts/`.
 * An append costs one `stat` (the check that no other process changed the log) and one synchronous
 * `write` to the page cache; `sync()`'s fsync runs off the main thread (docs/design.md §4).
 */
class FileStore implements LogStore {
  readonly path: string
  /** The lock file, `FILE.lock`; once locked, beside the log's real path (so that a link to the log shares its lock). */
  lockPath: string
  private handle?: AppendHandle
  /** Device and inode of the file `handle` appends to (fstat once, when it is opened). */
  private handleFile?: { dev: number; ino: number }
  /** File descriptor for reading events back ({@link FileStore.readEvent}). */
  private reader?: number
  private needsNewline = false
  private locked = false
  private repairOnly = false
  /** The file's size in bytes as this store last saw it (-1: absent); a first write refuses a log that changed since.
   *  */
  private seenBytes?: number
  /** The lock of a dead process this store took over, if any: for the caller to report (docs/design.md §13). */
  staleLock?: LogLockHolder
  /** Byte offset of each event's line by seq, then the end of the file: `lineStarts.length` = events + 1. */
  private lineStarts?: number[]
  /** Why this store appends no more: a failed write left a cut line it could not remove (see writeFailed). */
  private failed?: string
  /** `readOnly`: never writes — a torn last line is reported, not cut; appends throw `SessionError('STORE')`. */
  readonly readOnly: boolean
  constructor(path: string, options: { readOnly?: boolean } = {}) { this.path = path; this.lockPath = `${path}.lock`;
    this.readOnly = options.readOnly === true }

  private fs(): Promise<typeof import('node:fs/promises')> { return importNode('node:fs/promises') }
  private fsSync?: typeof import('node:fs')
  private readonly encoder = new TextEncoder()
  private readonly decoder = new TextDecoder()
  /** The buffer appends encode into and events are read back into (see append); `scratchBusy` while a write awaits. */
  private scratch?: Uint8Array
  private scratchBusy = false

  /** Takes the lock for writing (see {@link acquireLogLock}); throws `SessionError('SESSION_LOCKED')`. */
  private async lock(): Promise<void> {
    if (this.locked) return
    const fs = await this.fs()
    const real = await fs.realpath(this.path).catch(() => realTarget(fs, this.path))
    if (real !== undefined) this.lockPath = `${real}.lock`
    if (real !== undefined && ((await fs.stat(real).catch(() => undefined))?.nlink ?? 1) > 1) {
      throw new SessionError('SESSION_LOCKED', `session log ${this.path} has more than one name (a hard link): `
        + `another name would take a lock of its own; give the log one name`)
    }
    const stale = await acquireLogLock(this.path, this.lockPath)
    this.locked = true
    if (stale) this.staleLock = stale
  }

  private async unlock(): Promise<void> {
    if (!this.locked) return
    this.locked = false
    await releaseLogLock(this.lockPath)
  }

  /** node:fs, loaded once for this store's synchronous calls. */
  private async syncFs(): Promise<typeof import('node:fs')> {
    return this.fsSync ??= await importNode<typeof import('node:fs')>('node:fs')
  }

  /** The log's stat now (one synchronous stat), or undefined when it is gone. */
  private statPath(fs: typeof import('node:fs')): { size: number; dev: number; ino: number } | undefined {
    try { return fs.statSync(this.path, { throwIfNoEntry: false }) } catch (err: any) {
      throw new SessionError('STORE', `cannot read session log ${this.path}: ${err?.message ?? err}`)
    }
  }

  private async sizeNow(): Promise<number> {
    try { return (await (await this.fs()).stat(this.path)).size } catch (err: any) {
      if (err?.code === 'ENOENT') return -1
      throw new SessionError('STORE', `cannot read session log ${this.path}: ${err?.message ?? err}`)
    }
  }

  /** Takes the lock for a torn-line repair; false when another live process holds it. */
  private async lockForRepair(): Promise<boolean> {
    if (this.locked) return true
    try { await this.lock() } catch (err) {
      if (err instanceof SessionError && err.code === 'SESSION_LOCKED') return false
      throw err
    }
    this.repairOnly = true
    return true
  }

  /**
   * Reads the log (see {@link FileStore.scan}). Reading takes no lock; repairing a torn last line
   * does (for the repair only).
   */
  async load(): Promise<LoadedLog> {
    const events: SessionEvent[] = []
    const { torn } = await this.scan((e) => { events.push(e) })
    return { events, torn }
  }

  async scan(onEvent: (event: SessionEvent) => void): Promise<{ torn?: TornLine }> {
    const fs = await this.fs()
    let fh: any
    const { O_RDONLY, O_NONBLOCK = 0 } = (await this.syncFs()).constants
    try { fh = await fs.open(this.path, O_RDONLY | O_NONBLOCK) } catch (err: any) { // a FIFO must not block the open
      if (err?.code === 'ENOENT') { this.lineStarts = [0]; this.seenBytes = -1; return {} }
      throw new SessionError('STORE', `cannot read session log ${this.path}: ${err?.message ?? err}`)
    }
    if (!(await fh.stat()).isFile()) {
      await fh.close()
      throw new SessionError('STORE', `session log ${this.path} is not a regular file (a directory, FIFO, socket or `
        + `device); a session log is a file: give the path of one`)
    }
    const starts: number[] = [0]
    const decoder = new TextDecoder()
    let torn: TornLine | undefined
    let tornAt = -1
    try {
      const size: number = (await fh.stat()).size
      this.seenBytes = size
      for await (const lines of lineChunks(fh, 0, size)) {
        for (const { bytes, at, terminated } of lines) {
          const line = starts.length
          const parsed = parseLogLine(decoder.decode(bytes), line, starts.length - 1, terminated)
          if (parsed === 'blank') continue
          if (parsed === 'torn') { torn = { line, bytes: bytes.length }; tornAt = at; continue }
          onEvent(parsed)
          starts.push(at + bytes.length + (terminated ? 1 : 0))
          if (!terminated) this.needsNewline = true
        }
      }
      // The repair is a write: it takes the lock for its duration. A live holder's torn-looking
      // last line may be its append in flight: reported, not repaired (and this store cannot write).
      // not repaired: this store must not append
      if (torn && (this.readOnly || !(await this.lockForRepair()))) this.seenBytes = undefined
      else if (torn) {
        try {
          if ((await this.sizeNow()) !== size)
            throw new SessionError('SESSION_LOCKED', `session log ${this.path} changed while it was being loaded `
              + `(another process writes to it); open it again`)
          const savedTo = `${this.path}.torn-${Date.now()}`
          const tail = new Uint8Array(size - tornAt)
          await fh.read(tail, 0, tail.length, tornAt)
          await writeFileDurably(fs, savedTo, tail, `the torn last line (line ${torn.line}) of session log `
            + `${this.path} to`, 'the log was not changed (open it read-only to read it as it is)')
          await fs.truncate(this.path, tornAt)
          this.seenBytes = tornAt
          torn.savedTo = savedTo
        } finally { if (this.repairOnly) { this.repairOnly = false; await this.unlock() } }
      }
    } catch (err) {
      if (err instanceof SessionError) throw err
      throw new SessionError('STORE', `cannot read session log ${this.path}: ${(err as Error)?.message ?? err}`)
    } finally { await fh.close() }
    this.lineStarts = starts
    return { torn }
  }

  /**
   * Appends events. The first write takes the lock, and refuses (`SessionError('SESSION_LOCKED')`) when
   * another live process holds it or when the file changed since this store loaded it. A batch the
   * disk cannot take whole throws `SessionError('STORE')` ("disk full: N of M bytes written; nothing
   * after seq S is durable") with none of it in the log (docs/design.md §4).
   * Appends run one at a time in call order, even when a write awaits: an append made while earlier
   * ones are pending waits for them, and is refused (`SessionError('STORE')`, nothing written) when
   * one of them failed, so that the file never holds a later batch without an earlier one.
   */
  append(events: readonly SessionEvent[]): Promise<void> {
    const prior = this.appending > 0 ? this.appendQueue : undefined
    this.appending++
    let failed: string | undefined
    const run = (async () => {
      try {
        failed = prior && await prior
        if (failed) throw new SessionError('STORE', `session log ${this.path}: events from seq ${events[0]?.seq} `
          + `not appended: an append made before them failed (${failed}); append them again once it has settled`)
        try { await this.appendNow(events) } catch (err) { failed = String((err as Error)?.message ?? err); throw err }
      } finally { this.appending-- } // before `run` settles: a caller's retry after it starts a new queue
    })()
    this.appendQueue = run.then(() => undefined, () => failed)
    return run
  }

  /** Appends in flight or queued, and the last one's outcome: why it (or one before it) failed, if one did. */
  private appending = 0
  private appendQueue: Promise<string | undefined> = Promise.resolve(undefined)

  private async appendNow(events: readonly SessionEvent[]): Promise<void> {
    if (events.length === 0) return
    if (this.readOnly)
      throw new SessionError('STORE', `session log ${this.path} was opened read-only; nothing is written to it`)
    if (this.failed) throw new SessionError('STORE', this.failed)
    if (!this.lineStarts) await this.scan(() => {}) // appending to a file this store has not read: index it first
    if (!this.locked) {
      await this.lock()
      const size = await this.sizeNow()
      if (size !== this.seenBytes) {
        await this.unlock()
        throw new SessionError('SESSION_LOCKED', this.seenBytes === undefined
          ? `session log ${this.path} ends with a torn line that another process held it during; open it again`
          : `session log ${this.path} changed since it was loaded `
            + `(${this.seenBytes < 0 ? 'it did not exist' : `${this.seenBytes} bytes`}, now ${size} bytes): `
            + `another process wrote to it; open it again`)
      }
      this.seenBytes = Math.max(size, 0) // an absent log is created by the first write
    } else {
      // Every later write checks again, with one stat of the path against what this store wrote
      // and the file its handle appends to: a line another process appended, a truncation or a
      // file renamed over the log would otherwise leave duplicate seqs, a log without its start,
      // or writes to an unlinked file.
      const now = this.statPath(this.fsSync ?? await this.syncFs())
      const size = now ? now.size : -1
      const replaced = now !== undefined && this.handleFile !== undefined && !sameFile(now, this.handleFile)
      if (size !== this.seenBytes || replaced) {
        throw new SessionError('SESSION_LOCKED', `session log ${this.path} changed while this process was writing it `
          + `(${this.seenBytes} bytes written, `
          + `now ${size < 0 ? 'deleted' : replaced ? `another file of ${size} bytes` : `${size} bytes`}): `
          + `another process wrote to it; nothing more was appended, so the events of this step are not in it; `
          + `see what changed it, then open it again`)
      }
    }
    const starts = this.lineStarts!
    // The batch's lines are encoded into one buffer (UTF-8 takes at most 3 bytes per UTF-16 unit),
    // recording where each line ends: no buffer per line, no copy. The buffer is this store's scratch
    // when it is free and large enough (one allocation per store, not per append; it is kept up to
    // SCRATCH_MAX_BYTES), else a new one.
    const lines = events.map(eventJSON)
    let units = 1
    for (const line of lines) units += line.length + 1
    const free = this.scratch && !this.scratchBusy ? this.scratch : undefined
    const keep = !this.scratchBusy && units * 3 <= SCRATCH_MAX_BYTES
    const into = free && free.length >= units * 3 ? free
      : new Uint8Array(keep ? Math.max(units * 3, SCRATCH_MIN_BYTES, 2 * (free?.length ?? 0)) : units * 3)
    if (keep && into !== free) this.scratch = into
    const encoder = this.encoder
    const lead = this.needsNewline ? 1 : 0
    const first = this.seenBytes! + lead // the file's end (after a blank unterminated tail, not the last event's)
    const added: number[] = []
    let pos = 0
    if (lead) into[pos++] = 10
    for (const line of lines) {
      pos += encoder.encodeInto(line, into.subarray(pos)).written
      into[pos++] = 10
      added.push(first + pos - lead)
    }
    const buffer = into.subarray(0, pos)
    const owns = into === this.scratch
    if (owns) this.scratchBusy = true // a write may await (a subclass's, a short write): no other append uses it
    try { await this.write(buffer) } catch (err) { throw await this.writeFailed(err, buffer.length, events[0].seq) }
    finally { if (owns) this.scratchBusy = false }
    this.seenBytes! += buffer.length
    this.needsNewline = false
    starts[starts.length - 1] = first
    for (const a of added) starts.push(a)
  }

  /**
   * Appends whole lines to the file (one call per batch; a subclass may split it, e.g. to test torn
   * lines). A write may take fewer bytes than it is given (a full disk takes what fits, then fails
   * with ENOSPC): the rest is written until every byte is in the file or a write fails.
   */
  protected async write(bytes: Uint8Array): Promise<void> {
    if (!this.handle) {
      const fs = await this.syncFs()
      const handle = appendHandle(fs, fs.openSync(this.path, 'a'))
      this.handleFile = handle.stat()
      this.handle = handle
    }
    for (let done = 0; done < bytes.length;) {
      const { bytesWritten } = await this.handle.write(bytes, done, bytes.length - done)
      if (!(bytesWritten > 0)) throw new Error(`a write took none of the last ${bytes.length - done} bytes`)
      done += bytesWritten
    }
  }

  /**
   * The error of a batch that did not reach the file whole. No event of it is acknowledged: the file
   * is cut back to where the batch began (the caller may append the same batch again once there is
   * room), or, where that cut fails, left with a cut last line that the next load drops, and this
   * store refuses to append more.
   */
  private async writeFailed(err: unknown, totalBytes: number, firstSeq: number): Promise<SessionError> {
    const before = this.seenBytes!
    let written = 0, restored = this.handle === undefined
    if (this.handle) {
      try { written = Math.max(0, (await this.handle.stat()).size - before) } catch { /* unknown: say 0 */ }
      try { await this.handle.truncate(before); restored = true } catch { /* reported below */ }
    }
    const full = diskFull(err)
    const what = full ?? `write failed (${(err as Error)?.message ?? err})`
    const mend = full ? 'free disk space' : 'mend the cause (the disk, the file\'s permissions)'
    const durable = firstSeq > 0 ? `nothing after seq ${firstSeq - 1} is durable` : 'no event is durable'
    const message = `session log ${this.path}: ${what}: ${written} of ${totalBytes} bytes written; ${durable}`
    if (restored) {
      const fix = `${mend}, then flush again (the session keeps the events it could not write) or resume`
      return new SessionError('STORE', `${message}; the log was cut back to its last whole event: ${fix}`)
    }
    this.failed = `${message}; its cut last line could not be removed, so this store appends no more: ${mend}, `
      + 'then open the log again (the cut line is dropped on load)'
    return new SessionError('STORE', this.failed)
  }

  async readEvent(seq: number): Promise<SessionEvent> {
    const starts = await this.index()
    if (!Number.isInteger(seq) || seq < 0 || seq >= starts.length - 1)
      throw new SessionError('STORE', `no event with seq ${seq} in ${this.path} (0..${starts.length - 2})`)
    // One line, read with a synchronous pread (it was written or scanned by this store, so it is
    // in the page cache as a rule): no trip through the thread pool per event read back. Into the
    // scratch buffer when it is free: from the read to the decode nothing awaits.
    const fs = this.fsSync ?? await this.syncFs()
    this.reader ??= fs.openSync(this.path, 'r')
    const length = starts[seq + 1] - starts[seq]
    const free = this.scratch && !this.scratchBusy && this.scratch.length >= length ? this.scratch : undefined
    const bytes = free ? free.subarray(0, length) : new Uint8Array(length)
    for (let done = 0; done < bytes.length;) {
      const n = fs.readSync(this.reader, bytes, done, bytes.length - done, starts[seq] + done)
      if (n === 0) throw new SessionError('LOG_CORRUPT', `session log line ${seq + 1}: the file ends inside it `
        + `(${done} of ${bytes.length} bytes); another process cut the log: open it again`, seq + 1)
      done += n
    }
    return this.decodeEvent(bytes, seq)
  }

  async *readEvents(fromSeq: number, toSeq: number): AsyncGenerator<SessionEvent> {
    const starts = await this.index()
    const from = Math.max(0, fromSeq), to = Math.min(toSeq, starts.length - 1)
    if (from >= to) return
    const fh = await (await this.fs()).open(this.path, 'r')
    try {
      let seq = from
      for await (const lines of lineChunks(fh, starts[from], starts[to])) {
        for (const { bytes } of lines) yield this.decodeEvent(bytes, seq++)
      }
    } finally { await fh.close() }
  }

  private decodeEvent(bytes: Uint8Array, seq: number): SessionEvent {
    let text = this.decoder.decode(bytes)
    if (text.endsWith('\n')) text = text.slice(0, -1)
    const parsed = parseLogLine(text, seq + 1, seq, true)
    if (typeof parsed === 'string')
      throw new SessionError('LOG_CORRUPT', `session log line ${seq + 1}: empty or cut short when read back`, seq + 1)
    return parsed
  }

  private async index(): Promise<number[]> {
    if (!this.lineStarts) await this.scan(() => {})
    return this.lineStarts!
  }

  /**
   * fsyncs the log. A failed fsync fails the store for good: the kernel reports a lost write-back to one fsync only
   * and then marks the pages clean, so a later fsync that succeeds would acknowledge events that are not on disk.
   * @throws SessionError('STORE') naming the log, then for every later append and sync.
   */
  async sync(): Promise<void> {
    if (this.failed) throw new SessionError('STORE', this.failed)
    if (!this.handle) return
    try { await this.handle.sync() } catch (err: any) {
      this.failed = `session log ${this.path}: fsync failed (${err?.message ?? err}); what was appended since the last `
        + `sync may not be on disk: nothing more is written to this log; open it again to see what it holds`
      throw new SessionError('STORE', this.failed)
    }
  }

  /** Writes a spilled tool result to `FILE.artefacts/NAME` and fsyncs it (and its directory) before the event naming
   *  it is logged: durable before the step that spilled it. Returns the ref the event records. */
  async putArtefact(name: string, text: string): Promise<string> {
    const fs = await this.fs()
    const dir = `${this.path}.artefacts`
    await fs.mkdir(dir, { recursive: true })
    if (!(await fs.lstat(dir).catch(() => undefined))?.isDirectory()) { // not a link to a folder elsewhere
      throw new SessionError('STORE', `${dir} is not a directory of this log (a link, or missing); artefact ${name} `
        + `not written: remove the link`)
    }
    const file = `${dir}/${artefactName(name)}`
    await writeFileDurably(fs, file, text, 'artefact', 'it was not stored')
    const dirHandle = await fs.open(dir, 'r')
    try { await dirHandle.sync() } finally { await dirHandle.close() }
    return file
  }

  /**
   * Reads a spilled tool result back. Only a file in this log's own `FILE.artefacts/` is read, by the ref's last name
   * (a log names its artefacts; a hostile or edited one must not make recall read `~/.ssh/id_rsa`), and only a regular
   * file (O_NOFOLLOW, O_NONBLOCK: no link, FIFO or device). @throws Error naming the ref.
   */
  async getArtefact(ref: string): Promise<string> {
    const fs = await this.fs()
    const name = String(ref).slice(String(ref).lastIndexOf('/') + 1)
    if (artefactName(name) !== name || name === '.' || name === '..')
      throw new Error(`artefact ${JSON.stringify(ref)} is not a name this store writes; not read`)
    const { O_RDONLY, O_NOFOLLOW = 0, O_NONBLOCK = 0 } = (await this.syncFs()).constants
    const dir = `${this.path}.artefacts`
    if (!(await fs.lstat(dir).catch(() => undefined))?.isDirectory()) // not a link to a folder elsewhere
      throw new Error(`${dir} is not a directory of this log (a link, or missing); artefact ${name} not read`)
    const handle = await fs.open(`${dir}/${name}`, O_RDONLY | O_NOFOLLOW | O_NONBLOCK)
    try {
      if (!(await handle.stat()).isFile()) throw new Error(`artefact ${name} is not a regular file; not read`)
      return await handle.readFile('utf8')
    } finally { await handle.close() }
  }

  /** Closes the file and gives the lock back. */
  async close(): Promise<void> {
    await this.appendQueue // an append in flight ends before its file closes
    const h = this.handle, r = this.reader
    this.handle = undefined; this.handleFile = undefined; this.reader = undefined
    try {
      if (h) h.close()
      if (r !== undefined) this.fsSync!.closeSync(r)
    } finally { await this.unlock() }
  }
}

/** The real path a log not made yet will have: the end of its chain of links (a dangling link names it), in its
 *  directory's real path; undefined when that directory cannot be resolved. */
async function realTarget(fs: typeof import('node:fs/promises'), file: string): Promise<string | undefined> {
  const path = await importNode<typeof import('node:path')>('node:path')
  let at = path.resolve(file)
  for (let hops = 0; hops < 40; hops++) {
    const link = await fs.readlink(at).catch(() => undefined)
    if (link === undefined) break
    at = path.resolve(path.dirname(at), link)
  }
  const dir = await fs.realpath(path.dirname(at)).catch(() => undefined)
  return dir === undefined ? undefined : path.join(dir, path.basename(at))
}

/** The file name an artefact is stored under: `name` with every character but letters, digits, `_`, `.`, `-` as `_`. */
const artefactName = (name: string): string => name.replace(/[^\w.-]/g, '_')

/** A write's error as words: 'disk full' (ENOSPC), 'disk quota exceeded' (EDQUOT), else undefined. */
const diskFull = (err: unknown): string | undefined => {
  const code = (err as { code?: unknown })?.code
  return code === 'ENOSPC' ? 'disk full' : code === 'EDQUOT' ? 'disk quota exceeded' : undefined
}

/**
 * Writes `file` whole and fsyncs it, or removes what was written of it and throws `SessionError('STORE')` naming
 * `what` it is and the cause (a full disk: free disk space), followed by `after` (what the caller did not do). A
 * link at `file` is not written through (O_NOFOLLOW): a log's folder from elsewhere may hold one to ~/.bashrc.
 */
async function writeFileDurably(fs: typeof import('node:fs/promises'), file: string, data: string | Uint8Array,
  what: string, after: string): Promise<void> {
  const { O_WRONLY, O_CREAT, O_TRUNC, O_NOFOLLOW = 0 } = (await importNode<typeof import('node:fs')>('node:fs'))
    .constants
  let handle: Awaited<ReturnType<typeof fs.open>> | undefined
  try {
    handle = await fs.open(file, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW)
    await handle.writeFile(data)
    await handle.sync()
  } catch (err) {
    await handle?.close().catch(() => {})
    if ((err as { code?: unknown })?.code === 'ELOOP') {
      throw new SessionError('STORE', `cannot write ${what} ${file}: it is a symbolic link, not written through; `
        + `${after}: remove the link (nothing in a log's folder is a link dsh made)`)
    }
    handle = undefined
    await fs.unlink(file).catch(() => {})
    const full = diskFull(err)
    throw new SessionError('STORE', `cannot write ${what} ${file} (${full ? `${full}: ` : ''}`
      + `${(err as Error)?.message ?? err}); what was written of it was removed; ${after}: `
      + `${full ? 'free disk space' : 'mend the cause'}, then try again`)
  } finally { await handle?.close() }
}

/** One line of a log file: its bytes without the newline, its byte offset, whether a newline ended it. */
interface LogLine { bytes: Uint8Array; at: number; terminated: boolean }

/**
 * The lines of the open file `fh` between byte offsets `start` and `end`, one array per read of
 * {@link LOG_READ_CHUNK_BYTES} (one promise per chunk, not per line). Only a last line with no
 * newline has `terminated: false`. A line that spans reads is joined once, not per read. The
 * arrays' `bytes` are views of a buffer reused by the read after next: decode them before asking
 * for more. The next chunk is read (on libuv's thread pool) while the caller parses this one, so
 * a load waits for the disk only where the disk is slower than parsing; two buffers take turns.
 * Newlines are found by node:buffer's `indexOf` (a native memchr; it takes any Uint8Array), not by
 * the Uint8Array's own, which walks the bytes one by one: a tenth of a 100 MiB resume's time.
 */
async function* lineChunks(fh: any, start: number, end: number): AsyncGenerator<LogLine[]> {
  const { Buffer } = await importNode<typeof import('node:buffer')>('node:buffer')
  const indexOf = Buffer.prototype.indexOf as (this: Uint8Array, byte: number, from?: number) => number
  const size = Math.min(LOG_READ_CHUNK_BYTES, Math.max(1, end - start))
  const buffers: Uint8Array[] = [new Uint8Array(size)] // the second one on the first read ahead
  const read = (turn: number, at: number): Promise<{ bytesRead: number }> => {
    const into = buffers[turn] ??= new Uint8Array(size)
    return fh.read(into, 0, Math.min(size, end - at), at)
  }
  let carry: Uint8Array[] = []
  let carryAt = start
  let pos = start
  let turn = 0
  let next: Promise<{ bytesRead: number }> | undefined = pos < end ? read(0, pos) : undefined
  try {
    while (next) {
      const { bytesRead } = await next
      next = undefined
      if (bytesRead === 0) break
      const view = buffers[turn].subarray(0, bytesRead)
      turn ^= 1
      if (pos + bytesRead < end) next = read(turn, pos + bytesRead) // read ahead while this one is parsed
      const lines: LogLine[] = []
      let from = 0
      for (let nl = indexOf.call(view, 10, 0); nl >= 0; nl = indexOf.call(view, 10, from)) {
        let bytes: Uint8Array = view.subarray(from, nl)
        if (carry.length > 0) { carry.push(bytes); bytes = concatBytes(carry); carry = [] }
        lines.push({ bytes, at: carryAt, terminated: true })
        from = nl + 1
        carryAt = pos + from
      }
      if (from < bytesRead) carry.push(view.slice(from))
      pos += bytesRead
      if (lines.length > 0) yield lines
    }
  } finally {
    if (next) await next.catch(() => {}) // a caller that stops early: the read in flight ends before fh closes
  }
  if (carry.length > 0) yield [{ bytes: concatBytes(carry), at: carryAt, terminated: false }]
}

function concatBytes(parts: Uint8Array[]): Uint8Array {
  if (parts.length === 1) return parts[0]
  let n = 0
  for (const p of parts) n += p.length
  const out = new Uint8Array(n)
  let at = 0
  for (const p of parts) { out.set(p, at); at += p.length }
  return out
}

/** Locks this process holds: lock path → how many FileStores share it (one process, one holder). */
const heldLogLocks = new Map<string, number>()
let logLockExitHooked = false

/** The holder recorded in a lock file, or undefined when the file does not say. */
/** A lock file's holder, and the PID namespace its pid is in (Linux `/proc/self/ns/pid`), where it was written. */
type LockRecord = LogLockHolder & { pidns?: string }

function parseLockHolder(text: string): LockRecord | undefined {
  const v = parseJSONOrUndefined(text)
  if (!isRecord(v) || !Number.isSafeInteger(v.pid) || typeof v.host !== 'string' || typeof v.time !== 'number')
    return undefined
  return { pid: v.pid, host: v.host, time: v.time, ...(typeof v.pidns === 'string' ? { pidns: v.pidns } : {}) }
}

const describeHolder = (h: LogLockHolder): string => `pid ${h.pid} on host ${h.host} (since `
  + `${new Date(h.time).toISOString()})`

/**
 * One writer per session log (docs/design.md §13). Creates `lockPath` exclusively (O_EXCL) holding
 * `{pid, host, time}`. When it exists: a holder that is this process shares it; a live holder, a
 * holder on another host (whose pid cannot be checked) or an unreadable lock file is refused with
 * `SessionError('SESSION_LOCKED')` naming the holder and the lock file; the lock of a dead process on this
 * host is stale: taken over (by rename, so two processes cannot both take it) and returned, for the
 * caller to report. The lock is removed by {@link releaseLogLock}, and at process exit.
 * @returns the stale holder taken over, if any.
 */
async function acquireLogLock(logPath: string, lockPath: string): Promise<LogLockHolder | undefined> {
  const [fs, os, { default: proc }] =
    await Promise.all([importNode<typeof import('node:fs/promises')>('node:fs/promises'),
    importNode<typeof import('node:os')>('node:os'), importNode<any>('node:process')])
  const host = os.hostname()
  const { O_RDONLY, O_NOFOLLOW = 0, O_NONBLOCK = 0 } = (await importNode<typeof import('node:fs')>('node:fs')).constants
  // A pid means something only in its PID namespace: another one's (a container, a sandbox) cannot be checked.
  const pidns = await fs.readlink('/proc/self/ns/pid').catch(() => undefined)
  const me: LockRecord = { pid: proc.pid, host, time: Date.now(), ...(pidns ? { pidns } : {}) }
  const held = heldLogLocks.get(lockPath)
  if (held !== undefined) { heldLogLocks.set(lockPath, held + 1); return undefined }
  const refuse =
    (why: string): never => {
      throw new SessionError('SESSION_LOCKED', `session log ${logPath} ${why}; lock file ${lockPath}`)
    }
  let stale: LogLockHolder | undefined
  for (let round = 0; ; round++) {
    try {
      const handle = await fs.open(lockPath, 'wx')
      try { await handle.writeFile(JSON.stringify(me) + '\n') } catch (err: any) {
        // Created but not written whole (a full disk takes the inode, not the bytes): the file is ours (O_EXCL, and
        // one that names no holder is never taken over), so it goes, and a retry once there is room takes the lock.
        await handle.close().catch(() => {})
        await fs.unlink(lockPath).catch(() => {})
        const what = diskFull(err)
        throw new SessionError('STORE', `cannot write the lock file ${lockPath} (${what ?? 'failed'}: `
          + `${err?.message ?? err}); it was removed and nothing was written to session log ${logPath}: `
          + `${what ? 'free disk space' : 'mend the cause'}, then try again`)
      }
      await handle.close()
      break
    } catch (err: any) {
      if (err instanceof SessionError) throw err
      if (err?.code !== 'EEXIST')
        throw new SessionError('STORE', `cannot create the lock file ${lockPath}: ${err?.message ?? err}`)
    }
    let text: string
    const flag = O_RDONLY | O_NOFOLLOW | O_NONBLOCK
    try { text = await fs.readFile(lockPath, { encoding: 'utf8', flag }) } catch (err: any) {
      if (err?.code === 'ENOENT' && round < 3) continue // released meanwhile: try again
      // A link (its target's text would be echoed below: a planted one to ~/.ssh/id_rsa), a FIFO, a folder.
      if (err?.code === 'ELOOP' || err?.code === 'EISDIR' || err?.code === 'EAGAIN') refuse('has a lock file that is '
        + 'no regular file (a link, folder or FIFO); if no dsh is using this log, delete the lock file')
      throw new SessionError('STORE', `cannot read the lock file ${lockPath}: ${err?.message ?? err}`)
    }
    const holder = parseLockHolder(text)
    if (!holder) refuse(`has a lock file that does not name its holder (${JSON.stringify(text.slice(0, 80))}); `
      + `if no dsh is using this log, delete the lock file`)
    const sameNs = holder!.pidns === undefined || pidns === undefined || holder!.pidns === pidns // a lock of 0.1 has none
    // ours, from before a close we skipped
    if (holder!.pid === proc.pid && holder!.host === host && sameNs) { heldLogLocks.set(lockPath, 1); return undefined }
    if (holder!.host !== host) refuse(`is in use by ${describeHolder(holder!)}, another host; if that process is gone, `
      + `delete the lock file`)
    if (!sameNs) refuse(`is in use by ${describeHolder(holder!)} in another PID namespace (a container or `
      + `a sandbox), which this process cannot check; if that process is gone, delete the lock file`)
    let alive = true
    try { proc.kill(holder!.pid, 0) } catch (err: any) { alive = err?.code !== 'ESRCH' }
    if (alive) refuse(`is in use by ${describeHolder(holder!)}; wait for it to finish or use another session file (if `
      + `pid ${holder!.pid} is no dsh, its number was reused: delete the lock file)`)
    if (round >= 3) refuse(`is being taken over by another process (the lock of ${describeHolder(holder!)} was stale)`)
    // Stale: move it aside, check that what moved is what we judged stale, then create ours.
    const aside = `${lockPath}.stale-${proc.pid}-${Date.now()}`
    try { await fs.rename(lockPath, aside) } catch { continue }
    const moved = await fs.readFile(aside, 'utf8').catch(() => '')
    // a live lock: put it back
    if (moved !== text) { await fs.link(aside, lockPath).catch(() => {});
      await fs.unlink(aside).catch(() => {}); continue }
    await fs.unlink(aside).catch(() => {})
    stale = holder
  }
  heldLogLocks.set(lockPath, 1)
  if (!logLockExitHooked) {
    logLockExitHooked = true
    const fsSync = await importNode<typeof import('node:fs')>('node:fs')
    proc.on('exit',
      () => { for (const path of heldLogLocks.keys()) { try { fsSync.unlinkSync(path) } catch { /* gone */ } } })
  }
  return stale
}

/** Gives back one hold of a lock taken by {@link acquireLogLock}; the last one removes the file. */
async function releaseLogLock(lockPath: string): Promise<void> {
  const held = heldLogLocks.get(lockPath)
  if (held === undefined) return
  if (held > 1) { heldLogLocks.set(lockPath, held - 1); return }
  heldLogLocks.delete(lockPath)
  await (await importNode<typeof import('node:fs/promises')>('node:fs/promises')).unlink(lockPath).catch(() => {})
}

// ════════════════════════════════════════════════════════════════════════════════════════════
// 13. SQL store — SqlLogStore, a session in PostgreSQL, one writer across machines (also in dist/dsh.mjs)
// ════════════════════════════════════════════════════════════════════════════════════════════
// A store a session opts into (docs/design.md §4 "SQL store"), so it lives below the fence with the
// file store; it needs no `node:` module and runs wherever `fetch` does (an HTTP driver such as Neon's).
// Every write is ONE statement, so one transaction on any driver (a pool, an HTTP driver); a lease
// row per session is checked and extended by each, with no renewal timer (edge workers keep none).

export { SqlLogStore, SessionLockedError }


/**
 * Runs one SQL statement with `$1…$n` parameters; resolves with its rows, or with an object holding
 * them as `rows` (pg, PGlite): `(sql, params) => pool.query(sql, params)`; postgres.js
 * `(sql, params) => db.unsafe(sql, params)`; Neon `neon(url).query`.
 */
export type SqlQuery = (sql: string, params: unknown[]) => Promise<readonly unknown[] | { rows: readonly unknown[] }>

/** Options of {@link SqlLogStore}. */
export interface SqlLogStoreOptions {
  query: SqlQuery
  /** The session's key in the tables (a non-empty string; one log per key). */
  session: string
  /** Who holds the lease, named in refusals (default `worker-` + a random UUID). */
  owner?: string
  /** Lease length, ms (default 300,000: 5 min); longer than a worker's longest step. */
  leaseMs?: number
  /** Table name prefix: `PREFIX_events`, `PREFIX_artefacts`, `PREFIX_leases` (default `dsh`). */
  tablePrefix?: string
  /** Reads without taking the lease (e.g. to show a live session); writes are refused. */
  readOnly?: boolean
}

/** The database's clock in ms since the epoch: one clock for every worker, whatever their skew. */
const SQL_NOW_MS = '(extract(epoch from clock_timestamp()) * 1000)::bigint'
/** In a statement: its transaction commits without waiting for the WAL's fsync (a `sync` waits). */
const SQL_NO_FSYNC = "set_config('synchronous_commit', 'off', true)"
/** What PostgreSQL's `text` cannot hold: NUL and lone surrogates. */
const SQL_UNSTORABLE_TEXT = /\0|[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/g
/** Events a session syncs right after (a step's or turn's end, an open): their batch waits for the fsync itself. */
const SQL_SYNC_POINTS = new Set<string>(
  ['step/end', 'turn/end', 'session/start', 'session/resume'] satisfies (keyof EventDataMap)[])

/**
 * A session another writer holds (`code` `'SESSION_LOCKED'`): its `owner`, until `expiresAtMs` (ms
 * since the epoch, by the database's clock), and the lease's fencing `token`.
 */
class SessionLockedError extends SessionError {
  declare readonly owner: string
  declare readonly expiresAtMs: number
  declare readonly token: number
  constructor(message: string, lease: { owner: string; expiresAtMs: number; token: number }) {
    super('SESSION_LOCKED', message)
    this.name = 'SessionLockedError'
    Object.assign(this, lease)
  }
}

/**
 * A {@link LogStore} in PostgreSQL through one {@link SqlQuery} function (pg, postgres.js, PGlite,
 * Neon; no dependency). Tables, created on first use: `PREFIX_events (session_id, seq)` → type,
 * time_ms, the event's JSON and a row version `v`; `PREFIX_artefacts (session_id, name)`;
 * `PREFIX_leases (session_id)` → owner, token, expires_ms.
 * - `load`/`scan` take the lease (a free or expired one; a takeover raises the token by one) or throw
 *   {@link SessionLockedError}. Every write checks the token and extends the lease in its statement,
 *   so a holder whose lease was taken over (paused, then revived) is refused, never interleaved.
 *   `close` gives the lease back.
 * - `append` (one flush of the session) is one statement; it commits without waiting for the WAL's
 *   fsync unless its batch ends a step or a turn (the session syncs next). `sync` waits if anything
 *   was written since: one fsync per step. An append whose previous seq is not stored (a database
 *   that crashed before a sync lost it) is refused: no gap. A batch retried after a lost
 *   acknowledgement finds its rows and succeeds; another event at a stored seq is refused.
 * - Readable (see {@link LogStore.scan}): loads and reads back by seq ranges of 500 events, so a
 *   Session on it keeps only its surface in memory.
 * Errors: `SessionError('STORE')` for a failed query (the driver's error as `cause`) or a refused
 * write, `'LOG_CORRUPT'` for rows that are not a contiguous log, {@link SessionLockedError}.
 */
class SqlLogStore implements LogStore {
  readonly session: string
  readonly owner: string
  readonly leaseMs: number
  readonly readOnly: boolean
  /** The fencing token of the lease this store holds (undefined: none). */
  token?: number
  private readonly query: SqlQuery
  private readonly t: string
  private schema?: Promise<void>
  /** Whether writes were committed since the last durable commit. */
  private unsynced = false
  constructor(options: SqlLogStoreOptions) {
    const { query, session, owner, leaseMs = 300_000, tablePrefix = 'dsh', readOnly = false } = options
    const bad = (what: string) => new TypeError(`SqlLogStore: ${what}`)
    if (typeof query !== 'function') throw bad('query must be a function (sql, params) → rows')
    if (typeof session !== 'string' || session === '') throw bad('session must be a non-empty string')
    if (!isIntegerAtLeast(leaseMs, 1)) throw bad(`leaseMs must be an integer ≥ 1 ms, got ${shown(leaseMs)}`)
    if (!/^[a-z_][a-z0-9_]{0,40}$/.test(tablePrefix)) {
      throw bad(`tablePrefix ${JSON.stringify(tablePrefix)} must match [a-z_][a-z0-9_]{0,40}: it names tables`)
    }
    this.query = query
    this.session = session
    this.owner = owner ?? `worker-${crypto.randomUUID()}`
    this.leaseMs = leaseMs
    this.t = tablePrefix
    this.readOnly = readOnly
  }

  /** Runs one statement; a failure is `SessionError('STORE')` naming what was being done. */
  private async run(what: string, sql: string, params: unknown[] = []): Promise<any[]> {
    try {
      const result = await this.query(sql, params)
      const rows = Array.isArray(result) ? result : (result as { rows?: unknown } | null)?.rows
      if (!Array.isArray(rows)) throw new Error('the driver answered without rows (query must return rows or {rows})')
      return rows
    } catch (err) {
      if (err instanceof SessionError) throw err
      throw Object.assign(new SessionError('STORE', `SqlLogStore: ${what} of session ${JSON.stringify(this.session)} `
        + `failed: ${(err as Error)?.message ?? err}; nothing of it was written (retry when the database answers)`),
      { cause: err })
    }
  }

  /** Creates the tables once per store (one statement; a racing creator's error is retried once). */
  private ensureSchema(): Promise<void> {
    const t = this.t
    const sql = `DO $$ BEGIN
      CREATE TABLE IF NOT EXISTS ${t}_events (session_id text NOT NULL, seq bigint NOT NULL, type text NOT NULL,
        time_ms bigint NOT NULL, event text NOT NULL, v smallint NOT NULL DEFAULT 1, PRIMARY KEY (session_id, seq));
      CREATE TABLE IF NOT EXISTS ${t}_artefacts (session_id text NOT NULL, name text NOT NULL, body text NOT NULL,
        v smallint NOT NULL DEFAULT 1, PRIMARY KEY (session_id, name));
      CREATE TABLE IF NOT EXISTS ${t}_leases (session_id text PRIMARY KEY, owner text NOT NULL, token bigint NOT NULL,
        expires_ms bigint NOT NULL);
    END $$`
    this.schema ??= this.run('creating the tables', sql).catch(() => this.run('creating the tables', sql)).then(
      () => {}, (err) => { this.schema = undefined; throw err })
    return this.schema
  }

  /** Takes (or renews) the lease, durably; throws {@link SessionLockedError} when another's is live. */
  private async acquire(): Promise<void> {
    await this.ensureSchema()
    if (this.readOnly) return
    const rows = await this.run('taking the lease', `INSERT INTO ${this.t}_leases AS l
      VALUES ($1, $2, 1, ${SQL_NOW_MS} + $3::bigint)
      ON CONFLICT (session_id) DO UPDATE SET owner = EXCLUDED.owner, expires_ms = EXCLUDED.expires_ms,
        token = CASE WHEN l.token = $4::bigint THEN l.token ELSE l.token + 1 END
      WHERE l.expires_ms <= ${SQL_NOW_MS} OR l.token = $4::bigint RETURNING token`,
    [this.session, this.owner, this.leaseMs, this.token ?? 0])
    if (rows.length !== 1) throw await this.locked('is held by')
    this.token = Number(rows[0].token)
  }

  /** The refusal naming the lease's current holder. */
  private async locked(how: string): Promise<SessionLockedError> {
    const [r = { owner: '(nobody)', token: 0, expires_ms: 0, now_ms: 0 }] = await this.run('reading the lease',
      `SELECT owner, token, expires_ms, ${SQL_NOW_MS} AS now_ms FROM ${this.t}_leases WHERE session_id = $1`,
      [this.session])
    const lease = { owner: String(r.owner), token: Number(r.token), expiresAtMs: Number(r.expires_ms) }
    const mine = this.token === undefined ? '' : ` (this store's token ${this.token} is fenced off: nothing written)`
    return new SessionLockedError(`session ${JSON.stringify(this.session)} ${how} ${lease.owner}${mine}, lease `
      + `token ${lease.token} until ${new Date(lease.expiresAtMs).toISOString()} (${Math.max(0, lease.expiresAtMs
        - Number(r.now_ms))} ms from now); open it again after that, or once its owner closes it`, lease)
  }

  async load(): Promise<LoadedLog> {
    const events: SessionEvent[] = []
    return { ...await this.scan((e) => { events.push(e) }), events }
  }

  /** Takes the lease, then streams the log by seq ranges. */
  async scan(onEvent: (event: SessionEvent) => void): Promise<{ torn?: TornLine }> {
    await this.acquire()
    for await (const e of this.readEvents(0, Infinity)) onEvent(e)
    return {}
  }

  async *readEvents(fromSeq: number, toSeq: number): AsyncGenerator<SessionEvent> {
    await this.ensureSchema()
    const where = `FROM ${this.t}_events WHERE session_id = $1 AND seq >= $2::bigint`
    for (let next = Math.max(0, fromSeq); next < toSeq;) {
      // A seq range, not `LIMIT`: the index scan then reads one page, whatever the planner's statistics.
      const count = Math.min(500, toSeq - next)
      const rows = await this.run('reading events', `SELECT seq, event ${where} AND seq < $2::bigint + $3::int
        ORDER BY seq`, [this.session, next, count])
      for (const row of rows) yield this.decode(row, next++)
      if (rows.length === count) continue
      // A short page is the end of the log, unless rows follow a gap (never written by this store).
      const [end] = await this.run('reading events', `SELECT min(seq) AS seq ${where}`, [this.session, next])
      if (end?.seq !== null && end?.seq !== undefined) this.decode({ seq: end.seq, event: 'null' }, next)
      return
    }
  }

  async readEvent(seq: number): Promise<SessionEvent> {
    if (Number.isSafeInteger(seq) && seq >= 0) for await (const e of this.readEvents(seq, seq + 1)) return e
    throw new SessionError('STORE', `no event with seq ${seq} in SQL session ${JSON.stringify(this.session)}`)
  }

  private decode(row: { seq: unknown; event: string }, expectedSeq: number): SessionEvent {
    let e: unknown
    try { e = JSON.parse(row.event) } catch { e = undefined }
    // the file store's rule for a line, for a row: {seq, type, time, data} at the expected seq
    const problem = Number(row.seq) === expectedSeq ? eventShapeProblem(e, expectedSeq) : 'not the expected seq'
    if (problem === undefined) return e as SessionEvent
    throw new SessionError('LOG_CORRUPT', `SQL session ${JSON.stringify(this.session)}: row seq ${row.seq} where `
      + `${expectedSeq} was expected, or its event is not a dsh event of that seq (${problem}; events must be `
      + `contiguous)`, expectedSeq + 1)
  }

  /** `[session, token, leaseMs]`, the first parameters of every write; refuses without a lease. */
  private writable(what: string): [string, number, number] {
    const refuse = (why: string) => new SessionError('STORE', `SqlLogStore: ${what} refused: ${why}`)
    if (this.readOnly) throw refuse(`session ${JSON.stringify(this.session)} was opened read-only`)
    if (this.token === undefined) throw refuse('the store holds no lease: load() or scan() it first (that takes it)')
    return [this.session, this.token, this.leaseMs]
  }

  /** The lease check and extension of every write (`$1` session, `$2` token, `$3` lease ms). */
  private extendLease(): string {
    return `UPDATE ${this.t}_leases SET expires_ms = ${SQL_NOW_MS} + $3::bigint
      WHERE session_id = $1 AND token = $2::bigint RETURNING 1`
  }

  async append(events: readonly SessionEvent[]): Promise<void> {
    if (events.length === 0) return
    const texts = events.map(eventJSON)
    const time = (e: SessionEvent) => (Number.isSafeInteger(e.time) ? e.time : 0) // a column for queries only
    // so is `type`: PostgreSQL's text holds no NUL or lone surrogate (the event's JSON text keeps the type as it is)
    const type = (e: SessionEvent) => e.type.replace(SQL_UNSTORABLE_TEXT, '\uFFFD')
    const first = events[0].seq
    const durable = events.some((e) => SQL_SYNC_POINTS.has(e.type)) // so the sync after it sends nothing
    const [row] = await this.run(`appending ${events.length} event(s)`, `WITH lease AS (${this.extendLease()}),
      prev AS (SELECT 1 WHERE $5::bigint = 0 OR EXISTS (SELECT 1 FROM ${this.t}_events
        WHERE session_id = $1 AND seq = $5::bigint - 1)),
      batch AS (SELECT (r->>0)::bigint AS seq, r->>1 AS type, (r->>2)::bigint AS time_ms, r->>3 AS event
        FROM json_array_elements($4::json) r),
      ins AS (INSERT INTO ${this.t}_events (session_id, seq, type, time_ms, event)
        SELECT $1, b.seq, b.type, b.time_ms, b.event FROM lease, prev, batch b
        WHERE NOT EXISTS (SELECT 1 FROM batch o JOIN ${this.t}_events e ON e.session_id = $1 AND e.seq = o.seq
          WHERE e.event <> o.event)
        ON CONFLICT (session_id, seq) DO NOTHING RETURNING 1)
      SELECT (SELECT count(*) FROM lease)::int AS leased, (SELECT count(*) FROM prev)::int AS follows,
        (SELECT count(*) FROM ins)::int AS inserted${durable ? '' : `, ${SQL_NO_FSYNC}`}`,
    [...this.writable('append'), JSON.stringify(events.map((e, i) => [e.seq, type(e), time(e), texts[i]])), first])
    if (Number(row?.leased) !== 1) throw await this.locked('was taken over by')
    const where = `seq ${first - 1} of session ${JSON.stringify(this.session)}`
    if (Number(row.follows) !== 1) {
      throw new SessionError('STORE', `SqlLogStore: ${where} is not in the database, so seq ${first}.. would leave a `
        + 'gap: it lost events written since the last sync (a crash or a restore); nothing of this batch was '
        + 'written; open the session again (it resumes at its last stored event)')
    }
    this.unsynced = !durable // a durable commit covers every earlier one (the WAL is one sequence)
    if (Number(row.inserted) === events.length) return
    // Some seqs were there: a retry of a batch whose commit was not acknowledged finds its own rows. A seq that
    // holds another event inserted none of the batch (the NOT EXISTS above): the check below names it.
    let i = 0
    for await (const e of this.readEvents(first, events[events.length - 1].seq + 1)) {
      if (JSON.stringify(e) === texts[i++]) continue
      throw new SessionError('STORE', `SqlLogStore: seq ${e.seq} of session ${JSON.stringify(this.session)} already `
        + `holds another event (${e.type}); nothing of this batch was written over it; open the session again`)
    }
  }

  async putArtefact(name: string, text: string): Promise<string> {
    // JSON text: a tool's output may hold NUL or lone surrogates, which PostgreSQL's text refuses.
    const rows = await this.run(`storing artefact ${name}`, `WITH lease AS (${this.extendLease()})
      INSERT INTO ${this.t}_artefacts (session_id, name, body) SELECT $1, $4, $5 FROM lease
      ON CONFLICT (session_id, name) DO UPDATE SET body = EXCLUDED.body RETURNING ${SQL_NO_FSYNC}`,
    [...this.writable('putArtefact'), name, JSON.stringify(text)])
    if (rows.length !== 1) throw await this.locked('was taken over by')
    this.unsynced = true
    return `sql:${this.session}/${name}`
  }

  async getArtefact(ref: string): Promise<string> {
    const prefix = `sql:${this.session}/`
    const name = ref.startsWith(prefix) ? ref.slice(prefix.length) : undefined
    const rows = name === undefined ? [] : await this.run(`reading artefact ${name}`,
      `SELECT body FROM ${this.t}_artefacts WHERE session_id = $1 AND name = $2`, [this.session, name])
    if (rows.length === 1) return JSON.parse(rows[0].body)
    throw new SessionError('STORE', `no artefact ${ref} in SQL session ${JSON.stringify(this.session)} `
      + `(references look like ${prefix}NAME)`)
  }

  /**
   * Makes every write so far durable: one statement that extends the lease and waits for the WAL's
   * fsync, which covers every earlier commit; none when nothing was written since the last one.
   */
  async sync(): Promise<void> {
    if (!this.unsynced || this.token === undefined) return
    this.unsynced = false // before the statement: a write committed while it runs is not covered by it
    let rows: unknown[]
    try { rows = await this.run('syncing', this.extendLease(), this.writable('sync')) } catch (err) {
      this.unsynced = true
      throw err
    }
    if (rows.length !== 1) { this.unsynced = true; throw await this.locked('was taken over by') }
  }

  /** Gives the lease back (its token stays, so a fenced-off writer stays fenced off); a failed close can be retried. */
  async close(): Promise<void> {
    if (this.token === undefined || this.readOnly) return
    await this.run('giving the lease back', `UPDATE ${this.t}_leases SET expires_ms = 0
      WHERE session_id = $1 AND token = $2::bigint`, [this.session, this.token])
    this.token = undefined
  }
}

// ════════════════════════════════════════════════════════════════════════════════════════════
// 14. Anthropic Messages — the second wire format, anthropic() (also in dist/dsh.mjs)
// ════════════════════════════════════════════════════════════════════════════════════════════
// A provider a session opts into (docs/design.md §6), so it lives below the fence. It is one
// WireFormat (section 7.3): a body writer (14.1, with dsh's own cache breakpoints) and an event mapper
// into section 2.3's reply assembler; the adapter, its retries and its errors are section 7's.

export { anthropic }

/** Anthropic's API root (docs.anthropic.com): {@link anthropic} POSTs to `{baseURL}/v1/messages`. */
const ANTHROPIC_BASE_URL = 'https://api.anthropic.com'
/** Read by {@link anthropic} when no key is given, and sent only to Anthropic's own host. */
const ANTHROPIC_API_KEY_ENV = 'ANTHROPIC_API_KEY'
/** The `anthropic-version` header every Messages request carries. */
const ANTHROPIC_VERSION = '2023-06-01'
/** `cache_control` breakpoints one Messages request may carry (Anthropic's limit). */
const MAX_CACHE_BREAKPOINTS = 4

/** Options of {@link anthropic}: those of {@link openAICompatible}, with a default `baseURL`. */
export interface AnthropicOptions extends Omit<OpenAICompatibleOptions, 'baseURL'> {
  /** Server root; the adapter POSTs to `{baseURL}/v1/messages`. Default `https://api.anthropic.com`. */
  baseURL?: string
}


/**
 * A {@link Provider} for the Anthropic Messages API (docs/design.md §6): Anthropic, and servers that
 * serve `/v1/messages` (DeepSeek's Anthropic endpoint, llama.cpp's server). The same contract,
 * options, limits and retries as {@link openAICompatible}; what differs is the wire: `system` as its
 * own field, tool calls as `tool_use` blocks and results as `tool_result` blocks (images in them as
 * image blocks), reasoning as `thinking` blocks kept in position with their signature, `stop_reason`
 * mapped to the finish reasons of chat completions (`end_turn` → `stop`, `tool_use` → `tool_calls`,
 * `max_tokens` → `length`, `refusal` → `content_filter`), usage with cache writes and reads
 * (`promptTokens` = input + cache writes + cache reads). dsh places the `cache_control` breakpoints
 * itself (at most 4: the envelope, and the stable prefix it finds by comparing with the requests sent
 * before); give `prices` a `cacheWriteInput` for Anthropic's price shape. `countTokens` asks
 * `/v1/messages/count_tokens`. The key goes as `x-api-key`: `apiKey`, else `$ANTHROPIC_API_KEY`, which is read
 * (and required) only for Anthropic's own host and sent only over `https:`.
 * @throws TypeError for bad options (unknown keys, bad URL, missing key, `$ANTHROPIC_API_KEY` for an `http:` URL).
 */
function anthropic(options: AnthropicOptions): Provider {
  const host = new URL(ANTHROPIC_BASE_URL).hostname
  return makeProvider('anthropic', options, () => ({ baseURL: ANTHROPIC_BASE_URL }), ANTHROPIC_FORMAT,
    (h) => (h === host ? ANTHROPIC_API_KEY_ENV : undefined))
}


const ANTHROPIC_FORMAT: WireFormat = {
  path: '/v1/messages',
  count: { path: '/v1/messages/count_tokens', body: (cfg, request) => anthropicBody(cfg, request) },
  namedEvents: true,
  authHeaders: (apiKey) => ({ 'anthropic-version': ANTHROPIC_VERSION, ...(apiKey === undefined ? {}
    : { 'x-api-key': apiKey }) }),
  body: anthropicBody,
  event: anthropicEvent,
  whole(acc, obj, data) {
    if (!isRecord(obj)) throw acc.notAnObject(data)
    if (obj.type === 'error' || (obj.error !== undefined && obj.error !== null)) {
      throw inStreamError(acc.cfg, data, acc.requestId)
    }
    anthropicEvent(acc, { type: 'message_start', message: obj }, data)
    if (Array.isArray(obj.content)) obj.content.forEach((b, i) => anthropicBlock(acc, i, b))
  },
}


/** Anthropic's `stop_reason` → the finish reasons of chat completions (others pass as sent). */
const STOP_REASONS: Readonly<Record<string, string>> = {
  end_turn: 'stop', stop_sequence: 'stop', max_tokens: 'length', tool_use: 'tool_calls', refusal: 'content_filter',
  model_context_window_exceeded: 'length',
}

/** One Messages stream event; true at `message_stop`. Throws the in-stream error it carries. */
function anthropicEvent(acc: ReplyAssembler, obj: unknown, dataText: string): boolean {
  if (!isRecord(obj)) throw acc.notAnObject(dataText)
  const type = obj.type
  if (type === 'content_block_delta') {
    const d = isRecord(obj.delta) ? obj.delta : {}
    const text = (v: unknown) => (typeof v === 'string' ? v : '')
    if (d.type === 'text_delta') acc.add('text', text(d.text))
    else if (d.type === 'thinking_delta') acc.add('reasoning', text(d.thinking))
    else if (d.type === 'input_json_delta') {
      // a server tool's block (server_tool_use, mcp_tool_use), kept as it came, streams its input too: no call of ours
      const index = Number(obj.index)
      const kept = keptInputs.get(acc)?.get(index)
      if (toolBlocks.get(acc)?.has(index)) acc.tool(index, undefined, undefined, text(d.partial_json))
      else if (kept) { acc.admit(text(d.partial_json)); kept.json += text(d.partial_json) }
    }
    else if (d.type === 'signature_delta') acc.sign(text(d.signature))
  } else if (type === 'content_block_start') anthropicBlock(acc, Number(obj.index), obj.content_block)
  else if (type === 'content_block_stop') {
    // a server tool's streamed input (its web search query) goes into its kept block, which started with input {}
    const kept = keptInputs.get(acc)?.get(Number(obj.index))
    keptInputs.get(acc)?.delete(Number(obj.index))
    try { const input = kept?.json ? JSON.parse(kept.json) : undefined; if (isRecord(input)) kept!.block.input = input }
    catch { /* not JSON: the block keeps the input it started with */ }
  }
  else if (type === 'message_start' || type === 'message_delta') {
    const m = type === 'message_start' ? (isRecord(obj.message) ? obj.message : {}) : obj
    if (acc.responseId === undefined && typeof m.id === 'string' && m.id !== '') acc.responseId = m.id
    const reason = isRecord(obj.delta) ? obj.delta.stop_reason : m.stop_reason
    // own keys only: a stop_reason of "constructor" or "__proto__" is a string like any other
    if (typeof reason === 'string' && reason !== '') {
      acc.finishReason = Object.hasOwn(STOP_REASONS, reason) ? STOP_REASONS[reason] : reason
    }
    const u = anthropicUsage(acc, m.usage)
    if (u) acc.setUsage(u)
  } else if (type === 'message_stop') return true
  else if (type === 'error' || (obj.error !== undefined && obj.error !== null)) {
    throw inStreamError(acc.cfg, dataText, acc.requestId)
  }
  return false
}

/** The content-block indices of each reply's `tool_use` blocks, the only ones whose `input_json_delta` is a call's. */
const toolBlocks = new WeakMap<ReplyAssembler, Set<number>>()

/** Each reply's kept blocks (server tools) that started with an empty input, by index, and their streamed JSON. */
const keptInputs = new WeakMap<ReplyAssembler, Map<number, { block: Record<string, unknown>; json: string }>>()

/** A content block as it starts (streamed: empty; non-streamed: whole). */
function anthropicBlock(acc: ReplyAssembler, index: number, b: unknown): void {
  if (!isRecord(b)) return
  acc.fresh = true
  if (b.type === 'text') acc.add('text', typeof b.text === 'string' ? b.text : '')
  else if (b.type === 'thinking') {
    acc.add('reasoning', typeof b.thinking === 'string' ? b.thinking : '')
    if (typeof b.signature === 'string') acc.sign(b.signature)
  } else if (b.type === 'tool_use') {
    toolBlocks.set(acc, (toolBlocks.get(acc) ?? new Set()).add(index))
    const input = isRecord(b.input) && Object.keys(b.input).length > 0 ? acc.json(b.input) : ''
    acc.tool(index, typeof b.id === 'string' && b.id !== '' ? b.id : undefined,
      typeof b.name === 'string' && b.name !== '' ? b.name : undefined, input)
  } else if (typeof b.type === 'string' && b.type !== 'image') {
    acc.keep(b as OtherBlock)
    if (isRecord(b.input) && Object.keys(b.input).length === 0) {
      keptInputs.set(acc, (keptInputs.get(acc) ?? new Map()).set(index, { block: b, json: '' }))
    }
  }
}

/** Usage from Anthropic's fields, merged over those seen before: prompt = input + cache writes + cache reads. */
function anthropicUsage(acc: ReplyAssembler, u: unknown): Usage | undefined {
  if (!isRecord(u)) return undefined
  const w = acc.wireUsage
  for (const key of ['input_tokens', 'cache_creation_input_tokens', 'cache_read_input_tokens', 'output_tokens']) {
    const v = tokenCount(u[key])
    if (v !== undefined) w[key] = v
  }
  const n = (key: string) => (w[key] as number | undefined) ?? 0
  if (w.input_tokens === undefined && w.output_tokens === undefined) return undefined
  const usage: Usage = { promptTokens: n('input_tokens') + n('cache_creation_input_tokens')
    + n('cache_read_input_tokens'), completionTokens: n('output_tokens') }
  if (w.cache_read_input_tokens !== undefined) usage.cachedTokens = n('cache_read_input_tokens')
  if (w.cache_creation_input_tokens !== undefined) usage.cacheWriteTokens = n('cache_creation_input_tokens')
  return usage
}


// ── 14.1 Messages on the wire (Anthropic Messages shape, docs/design.md §6) ──────

type AnthropicBlock = Record<string, unknown>
interface AnthropicMessage { role: 'user' | 'assistant'; content: AnthropicBlock[] }

/** A text block as it is; an image (data: URL → base64 source, else a URL source); anything else as JSON text. */
function anthropicPart(b: Block): AnthropicBlock {
  if (b.type === 'text') return { type: 'text', text: (b as TextBlock).text }
  const url = b.type === 'image' ? imageURLOf(b) : undefined
  const data = url === undefined ? undefined : /^data:([^;,]+);base64,/.exec(url)
  if (data) return { type: 'image', source: { type: 'base64', media_type: data[1], data: url!.slice(data[0].length) } }
  if (url !== undefined) return { type: 'image', source: { type: 'url', url } }
  return { type: 'text', text: describeBlock(b) }
}

/** Empty text blocks are refused by the format: left out. */
const isSent = (b: AnthropicBlock): boolean => b.type !== 'text' || b.text !== ''

/** A tool call's `input`: its arguments parsed when they are a JSON object, else `{}`. */
function toolInput(args: string): unknown {
  const value = args.trim() === '' ? undefined : parseJSONOrUndefined(args)
  return isRecord(value) ? value : {}
}

/**
 * One message's content blocks: a tool result is a `tool_result` block (its images as image
 * blocks) of a user message; reasoning goes back as `thinking` only with its signature (a server
 * refuses unsigned thinking); a `redacted_thinking` block goes back as it came.
 */
function anthropicContent(m: Message): AnthropicBlock[] {
  if (m.role === 'tool') {
    const content = m.content.map(anthropicPart).filter(isSent)
    return [{ type: 'tool_result', tool_use_id: m.toolCallId, ...(content.length > 0 ? { content } : {}),
      ...(m.isError ? { is_error: true } : {}) }]
  }
  if (m.role === 'user') {
    return (typeof m.content === 'string' ? [{ type: 'text', text: m.content }] : m.content.map(anthropicPart))
      .filter(isSent)
  }
  const out: AnthropicBlock[] = []
  for (const b of m.content) {
    if (b.type === 'tool-call') {
      const c = b as ToolCallBlock
      out.push({ type: 'tool_use', id: c.id, name: c.name, input: toolInput(c.arguments) })
    } else if (b.type === 'reasoning') {
      const r = b as ReasoningBlock
      if (r.signature) out.push({ type: 'thinking', thinking: r.text, signature: r.signature })
    } else if (b.type === 'redacted_thinking') out.push(b)
    else if (b.type === 'text' ? (b as TextBlock).text !== '' : true) out.push(anthropicPart(b))
  }
  return out
}

/** The messages in {@link wireOrder} as user / assistant turns; neighbours of one role are merged into one. */
function anthropicMessages(messages: readonly Message[]): AnthropicMessage[] {
  const out: AnthropicMessage[] = []
  for (const m of wireOrder(messages)) {
    const content = anthropicContent(m)
    if (content.length === 0) continue
    const role = m.role === 'assistant' ? 'assistant' : 'user'
    const last = out[out.length - 1]
    if (last?.role === role) { for (const b of content) last.content.push(b) } else out.push({ role, content })
  }
  return out
}

/** What one Messages request sent, for the cache breakpoints of the next ones. */
interface SentPrefix { envelope: string; keys: readonly string[]; marks: readonly number[] }

/**
 * The messages that get a `cache_control` breakpoint (docs/design.md §6): the stable prefix is the
 * longest run of leading messages equal to those of one of the two requests sent before (a summary
 * request in between does not reset it); the breakpoints are the earlier ones still inside it (their
 * cache entries exist), its last message, and the request's last message (written for the next
 * request) — the newest {@link MAX_CACHE_BREAKPOINTS} − 1 of them; the envelope takes the other.
 */
function cacheMarks(sent: SentPrefix[], envelope: string, keys: readonly string[]): number[] {
  let stable = 0, best: SentPrefix | undefined
  for (const s of sent) {
    if (s.envelope !== envelope) continue
    let i = 0
    while (i < s.keys.length && i < keys.length && s.keys[i] === keys[i]) i++
    if (best === undefined || i > stable) { best = s; stable = i }
  }
  const marks = new Set((best?.marks ?? []).filter((m) => m < stable))
  if (stable > 0) marks.add(stable - 1)
  if (keys.length > 0) marks.add(keys.length - 1)
  const kept = [...marks].sort((a, b) => a - b).slice(-(MAX_CACHE_BREAKPOINTS - 1))
  sent.unshift({ envelope, keys, marks: kept })
  if (sent.length > 2) sent.length = 2
  return kept
}

/** A message with a breakpoint on its last block that can carry one (not thinking); unchanged when none can. */
function withCacheMark(m: AnthropicMessage): AnthropicMessage {
  const at = m.content.findLastIndex((b) => b.type !== 'thinking' && b.type !== 'redacted_thinking')
  if (at < 0) return m
  const content = m.content.slice()
  content[at] = { ...content[at], cache_control: { type: 'ephemeral' } }
  return { role: m.role, content }
}

/**
 * A Messages request body (docs/design.md §6): extra body fields, model, tools (`input_schema`),
 * system (its own field), messages, then stream and max_tokens; with the cache breakpoints of
 * {@link cacheMarks}. Without `maxTokens` it is the body of `count_tokens` (no extras, stream,
 * budget nor breakpoints).
 */
function anthropicBody(cfg: AdapterConfig, request: ChatRequest, maxTokens?: number): string {
  const messages = anthropicMessages(request.messages)
  const keys = messages.map(wireJSON)
  const tools = (request.tools ?? []).map((t) => ({ name: t.name, ...(t.description !== undefined
    ? { description: t.description } : {}), input_schema: schemaOf(t) }))
  const envelope = wireJSON([request.system ?? '', tools])
  const marks = maxTokens === undefined ? [] : cacheMarks(cfg.sent as SentPrefix[], envelope, keys)
  const mark = maxTokens === undefined ? undefined : { cache_control: { type: 'ephemeral' } }
  if (mark && tools.length > 0 && !request.system) tools[tools.length - 1] = { ...tools[tools.length - 1], ...mark }
  const sent = (m: AnthropicMessage, i: number) => (marks.includes(i) ? wireJSON(withCacheMark(m)) : keys[i])
  return bodyOf(maxTokens === undefined ? undefined : cfg.extraBody, [['model', wireJSON(cfg.model)],
    ['tools', tools.length > 0 ? wireJSON(tools) : undefined],
    ['system', request.system ? wireJSON([{ type: 'text', text: request.system, ...mark }]) : undefined],
    ['messages', `[${messages.map(sent).join(',')}]`],
    ['stream', maxTokens === undefined ? undefined : 'true'], ['max_tokens', maxTokens?.toString()]])
}
