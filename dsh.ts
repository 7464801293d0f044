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
