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

// ── Transcript readers: the input side of `replay` ──
// Web-standard code: the readers take the file's TEXT (never a path), so they run anywhere.
// Formats as found in real files: ../shared/corpus/FORMATS.md.

/** The transcript formats `replay` reads (the CLI's `--format` values). */
export type TranscriptFormat = 'dsh' | 'openai' | 'claude-code' | 'swe-agent' | 'mini-swe-agent'

/** Every {@link TranscriptFormat}, in the order detection and error messages list them. */
export const TRANSCRIPT_FORMATS: readonly TranscriptFormat[] = ['dsh', 'openai', 'claude-code', 'swe-agent', 'mini-swe-agent']

const ACCEPTED_FORMATS = 'Accepted formats: dsh (session log, JSONL of {seq, type, time, data}), openai ([...messages] ' +
  'or {"messages": [...]}), claude-code (Claude Code session .jsonl), swe-agent (SWE-agent .traj with "history"), ' +
  'mini-swe-agent (.traj.json with "trajectory_format": "mini-swe-agent-1"); force one with the `format` option ' +
  '(CLI: --format NAME).'

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
 */
export interface Transcript {
  format: TranscriptFormat
  envelope: Envelope
  messages: Message[]
  usage: (Usage | undefined)[]
  notes: string[]
  sidechains?: Transcript[]
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
  constructor(problem: string, at: { line?: number; field?: string } = {}) {
    const where = [at.line === undefined ? '' : `line ${at.line}`, at.field === undefined ? '' : `field ${at.field}`]
      .filter(Boolean).join(', ')
    super(`${where ? `${where}: ` : ''}${problem}. ${ACCEPTED_FORMATS}`)
    this.name = 'TranscriptError'
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
 *   content as a string or parts (`text`, `image_url` → image; other parts kept as they are);
 *   usage from a message's `usage` when present.
 * - **mini-swe-agent** — no native tool calls: an assistant message with exactly one ```` ```bash ````
 *   block (mini-swe-agent's own rule; 0 or ≥2 blocks are its format errors and ran nothing) becomes
 *   its text without the block plus a tool call `bash` with arguments `{"command": …}` and the id
 *   `mswea-call-<index in messages>`; the NEXT user message becomes that call's tool result (a
 *   "timed out" observation is `isError`), so the pruner applies. Other messages stay as they are.
 *   Usage from `extra.response.usage`. Gemini's `reasoning` is not read: mini-swe-agent never sent it back.
 * - **swe-agent** — `history` only (`trajectory[i].messages` repeats it at every step); tool results
 *   carry `tool_call_ids` (an array). No per-call usage in the file.
 * - **claude-code** — the main chain only by default: the path from the last non-sidechain line back
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
 * - **dsh** — (interim, until the Session class reads logs) the messages of `user/message`,
 *   `assistant/message` and `tool/result` events whose `surfaceOp.op` is `append`, i.e. the
 *   history before any prune or summary; the envelope from the first `request/header`.
 *
 * Every format then goes through one pairing pass: a tool call without a result gets a synthetic
 * error result right after its step, a result without a call is dropped, and a call id reused
 * by a later call (SWE-agent demonstrations do this) is renamed `<id>~<n>`; each is noted.
 * @throws {TranscriptError} for text that is no transcript or breaks its format (line / field given).
 */
export function readTranscript(text: string, options: ReadTranscriptOptions = {}): Transcript {
  if (options.format !== undefined && !TRANSCRIPT_FORMATS.includes(options.format)) {
    throw new TranscriptError(`unknown format ${JSON.stringify(options.format)}`, { field: 'format' })
  }
  const parsed = parseTranscriptText(text)
  const format = options.format ?? detectParsed(parsed)
  const notes = [...parsed.notes]
  let transcript: Transcript
  switch (format) {
    case 'openai': transcript = readOpenAITranscript(parsed); break
    case 'mini-swe-agent': transcript = readMiniSweAgent(parsed); break
    case 'swe-agent': transcript = readSweAgent(parsed); break
    case 'claude-code': transcript = readClaudeCode(parsed, options.sidechains === true); break
    case 'dsh': transcript = readDshLog(parsed); break
  }
  transcript.notes.unshift(...notes)
  return transcript
}

// ── parsing and detection ──

type JsonRecord = Record<string, unknown>
interface JsonlLine { line: number; value: JsonRecord }
type ParsedTranscript =
  | { kind: 'json'; value: unknown; notes: string[] }
  | { kind: 'jsonl'; lines: JsonlLine[]; notes: string[] }

const isRecord = (v: unknown): v is JsonRecord => typeof v === 'object' && v !== null && !Array.isArray(v)

function parseTranscriptText(text: string): ParsedTranscript {
  if (typeof text !== 'string') throw new TranscriptError(`expected the file's text (a string), got ${typeof text}`)
  if (text.charCodeAt(0) === 0xfeff) text = text.slice(1)
  const start = text.search(/\S/)
  if (start < 0) throw new TranscriptError('the file is empty')
  const firstLine = lineAt(text, start)
  const first = text[start]
  if (first !== '{' && first !== '[') {
    const head = text.slice(start, start + 40).split(/\r?\n/)[0]
    throw new TranscriptError(`not JSON: the first non-blank line starts with ${JSON.stringify(head)}`, { line: firstLine })
  }
  try {
    return { kind: 'json', value: JSON.parse(text), notes: [] }
  } catch (err) {
    // Not one JSON document: JSONL when its first line parses on its own (a pretty-printed
    // document's first line, "{", does not).
    const end = text.indexOf('\n', start)
    let firstValue: unknown
    try { firstValue = JSON.parse(text.slice(start, end < 0 ? undefined : end)) } catch { firstValue = undefined }
    if (first === '{' && isRecord(firstValue)) return parseJsonl(text)
    throw new TranscriptError(`not valid JSON (${errorText(err)})`, { line: jsonErrorLine(text, err) })
  }
}

function parseJsonl(text: string): ParsedTranscript {
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
      // A torn last line (a writer stopped mid-line: no final newline) is dropped, as DESIGN.md §4
      // tolerates it when a session log loads; a broken line anywhere else is corruption.
      if (i === last && !/\n\s*$/.test(text)) {
        notes.push(`dropped the torn last line ${i + 1} (${row.length} UTF-16 units, not valid JSON, no final newline)`)
        break
      }
      throw new TranscriptError(`not valid JSON (${errorText(err)})`, { line: i + 1 })
    }
    if (!isRecord(value)) {
      throw new TranscriptError(`a JSONL line must be a JSON object, got ${jsonType(value)}`, { line: i + 1 })
    }
    lines.push({ line: i + 1, value })
  }
  return { kind: 'jsonl', lines, notes }
}

function detectParsed(parsed: ParsedTranscript): TranscriptFormat {
  if (parsed.kind === 'jsonl') {
    const [head] = parsed.lines
    if (isDshEvent(head.value)) return 'dsh'
    if (parsed.lines.slice(0, 50).some(l => isClaudeCodeLine(l.value))) return 'claude-code'
    throw new TranscriptError(`JSONL whose first line is neither a dsh event {seq, type, time, data} nor a Claude Code ` +
      `entry {type, uuid, sessionId, message}; its keys are ${keyList(head.value)}`, { line: head.line })
  }
  const v = parsed.value
  if (Array.isArray(v)) return 'openai'
  if (!isRecord(v)) throw new TranscriptError(`a JSON ${jsonType(v)} is not a transcript`)
  if (typeof v.trajectory_format === 'string' && v.trajectory_format.startsWith('mini-swe-agent')) return 'mini-swe-agent'
  if (Array.isArray(v.messages) && isRecord(v.info) && 'mini_version' in v.info) return 'mini-swe-agent'
  if (Array.isArray(v.history)) return 'swe-agent'
  if (Array.isArray(v.messages)) return 'openai'
  if (isDshEvent(v)) return 'dsh'
  if (isClaudeCodeLine(v)) return 'claude-code'
  throw new TranscriptError(`a JSON object without "messages", "history" or "trajectory_format"; its keys are ${keyList(v)}`)
}

function isDshEvent(v: JsonRecord): boolean {
  return typeof v.seq === 'number' && typeof v.type === 'string' && 'time' in v && isRecord(v.data)
}

function isClaudeCodeLine(v: JsonRecord): boolean {
  return typeof v.type === 'string' && (typeof v.sessionId === 'string' || typeof v.uuid === 'string' ||
    (v.type === 'summary' && typeof v.leafUuid === 'string'))
}

function lineAt(text: string, index: number): number {
  let line = 1
  for (let i = text.indexOf('\n'); i >= 0 && i < index; i = text.indexOf('\n', i + 1)) line++
  return line
}

/** The line of a JSON.parse error, from V8's "position N" or a "line N column M" message; else undefined. */
function jsonErrorLine(text: string, err: unknown): number | undefined {
  const message = errorText(err)
  const lc = /line (\d+) column \d+/.exec(message)
  if (lc) return Number(lc[1])
  const pos = /position (\d+)/.exec(message)
  return pos ? lineAt(text, Number(pos[1])) : undefined
}

const errorText = (err: unknown): string => (err instanceof Error ? err.message : String(err))
const jsonType = (v: unknown): string => (v === null ? 'null' : Array.isArray(v) ? 'array' : typeof v)
const keyList = (v: JsonRecord): string => {
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
  if (isRecord(parsed.value)) return [{ line: 1, value: parsed.value }]
  throw new TranscriptError(`a ${format} transcript is JSONL (one JSON object per line), but this file is a JSON ` +
    jsonType(parsed.value))
}

// ── shared building blocks ──

/** Messages as read, before pairing; `where[i]` locates message i in the file for notes. */
interface Draft {
  envelope: Envelope
  messages: Message[]
  where: string[]
  usage: (Usage | undefined)[]
  notes: string[]
}

const newDraft = (): Draft => ({ envelope: {}, messages: [], where: [], usage: [], notes: [] })

function push(draft: Draft, message: Message, where: string, usage?: Usage): void {
  draft.messages.push(message)
  draft.where.push(where)
  if (message.role === 'assistant') draft.usage.push(usage)
}

/** Usage in the OpenAI chat-completions shape (`prompt_tokens`, …; DESIGN.md §6), else undefined. */
function openAIUsage(u: unknown): Usage | undefined {
  if (!isRecord(u) || typeof u.prompt_tokens !== 'number' || typeof u.completion_tokens !== 'number') return undefined
  const usage: Usage = { promptTokens: u.prompt_tokens, completionTokens: u.completion_tokens }
  const cached = isRecord(u.prompt_tokens_details) ? u.prompt_tokens_details.cached_tokens : u.prompt_cache_hit_tokens
  if (typeof cached === 'number') usage.cachedTokens = cached
  const reasoning = isRecord(u.completion_tokens_details) ? u.completion_tokens_details.reasoning_tokens : undefined
  if (typeof reasoning === 'number') usage.reasoningTokens = reasoning
  return usage
}

/** OpenAI message content (string, null or parts) → blocks; empty text is dropped. */
function chatBlocks(content: unknown, field: string, at: { line?: number } = {}): Block[] {
  if (content === null || content === undefined) return []
  if (typeof content === 'string') return content === '' ? [] : [{ type: 'text', text: content }]
  if (!Array.isArray(content)) {
    throw new TranscriptError(`content must be a string or an array of parts, got ${jsonType(content)}`, { ...at, field })
  }
  return content.map((part, i) => partBlock(part, `${field}[${i}]`, at))
}

/** One content part: `text` → text block, `image_url` → image block, any other part kept as it is. */
function partBlock(part: unknown, field: string, at: { line?: number }): Block {
  if (!isRecord(part) || typeof part.type !== 'string') {
    throw new TranscriptError('a content part must be an object with a string "type"', { ...at, field })
  }
  if (part.type === 'text') {
    if (typeof part.text !== 'string') {
      throw new TranscriptError('a text part needs a string "text"', { ...at, field: `${field}.text` })
    }
    return { type: 'text', text: part.text }
  }
  if (part.type === 'image_url') return { type: 'image', image_url: part.image_url }
  return { ...part, type: part.type }
}

const textOf = (blocks: Block[]): string =>
  blocks.map(b => (b.type === 'text' && typeof b.text === 'string' ? b.text : '')).join('')

/**
 * OpenAI-style chat messages → draft. `path` names the array for field paths (`messages`, `history`).
 * `usageOf` reads an assistant message's usage. SWE-agent's `tool_call_ids` (array) is accepted
 * beside `tool_call_id`.
 */
function readChatMessages(list: unknown[], path: string, draft: Draft, usageOf: (m: JsonRecord) => Usage | undefined): void {
  const system: string[] = []
  let lateSystem = 0
  list.forEach((m, i) => {
    const at = `${path}[${i}]`
    if (!isRecord(m)) throw new TranscriptError(`a message must be an object, got ${jsonType(m)}`, { field: at })
    const role = m.role
    if (role === 'system' || role === 'developer') {
      const text = textOf(chatBlocks(m.content, `${at}.content`))
      if (draft.messages.length === 0) system.push(text)
      else { lateSystem++; push(draft, { role: 'user', content: text }, at) }
    } else if (role === 'user') {
      push(draft, { role: 'user', content: typeof m.content === 'string' ? m.content : chatBlocks(m.content, `${at}.content`) }, at)
    } else if (role === 'assistant') {
      const content: Block[] = []
      const reasoning = m.reasoning_content ?? m.reasoning
      if (typeof reasoning === 'string' && reasoning !== '') content.push({ type: 'reasoning', text: reasoning })
      content.push(...chatBlocks(m.content, `${at}.content`))
      if (m.tool_calls !== undefined && m.tool_calls !== null) {
        if (!Array.isArray(m.tool_calls)) {
          throw new TranscriptError('tool_calls must be an array', { field: `${at}.tool_calls` })
        }
        m.tool_calls.forEach((c, j) => {
          const cf = `${at}.tool_calls[${j}]`
          const fn = isRecord(c) ? c.function : undefined
          if (!isRecord(c) || typeof c.id !== 'string') {
            throw new TranscriptError('a tool call needs a string "id"', { field: `${cf}.id` })
          }
          if (!isRecord(fn) || typeof fn.name !== 'string') {
            throw new TranscriptError('a tool call needs "function": {"name", "arguments"}', { field: `${cf}.function.name` })
          }
          const args = typeof fn.arguments === 'string' ? fn.arguments : JSON.stringify(fn.arguments ?? {})
          content.push({ type: 'tool-call', id: c.id, name: fn.name, arguments: args })
        })
      }
      push(draft, { role: 'assistant', content }, at, usageOf(m))
    } else if (role === 'tool') {
      const ids = typeof m.tool_call_id === 'string' ? [m.tool_call_id]
        : Array.isArray(m.tool_call_ids) && m.tool_call_ids.length > 0 && m.tool_call_ids.every(x => typeof x === 'string')
          ? m.tool_call_ids as string[] : undefined
      if (!ids) {
        throw new TranscriptError('a tool message needs "tool_call_id" (a string)', { field: `${at}.tool_call_id` })
      }
      const content = chatBlocks(m.content, `${at}.content`)
      if (content.length === 0) content.push({ type: 'text', text: '' })
      // One observation answering several calls: the text goes to the first, so it is counted once.
      ids.forEach((id, k) => push(draft, {
        role: 'tool', toolCallId: id, content: k === 0 ? content : [{ type: 'text', text: `(see the result of ${ids[0]})` }],
      }, at))
      if (ids.length > 1) {
        draft.notes.push(`${at} answers ${ids.length} tool calls; its text went to the first (${ids[0]})`)
      }
    } else {
      throw new TranscriptError(`unknown role ${JSON.stringify(role)}; accepted roles: system, developer, user, assistant, tool`,
        { field: `${at}.role` })
    }
  })
  if (system.length > 0) draft.envelope.system = system.join('\n\n')
  if (lateSystem > 0) {
    draft.notes.push(`${lateSystem} system message(s) after the conversation began kept as user messages (in place)`)
  }
}

/** The text of a synthesised result (the pairing pass), stated as what it is: not the tool's output. */
const SYNTHETIC_RESULT_TEXT = 'No result was recorded for this tool call in the transcript (synthesised by dsh replay).'

/**
 * The pairing pass (DESIGN.md §4: never a tool call without its result or a result without its
 * call, matched by id). Results are expected after their call and before the next user or
 * assistant message; a call still open at that point gets a synthetic error result there.
 */
function pairToolCalls(draft: Draft): Message[] {
  const out: Message[] = []
  const open: { id: string; original: string; name: string; where: string }[] = []
  const uses = new Map<string, number>()
  const synthesised: string[] = []
  const dropped: string[] = []
  const renamed: string[] = []
  const closeOpen = () => {
    for (const c of open.splice(0)) {
      synthesised.push(`${c.name} ${c.id} (${c.where})`)
      out.push({
        role: 'tool', toolCallId: c.id, isError: true,
        content: [{ type: 'text', text: SYNTHETIC_RESULT_TEXT }],
      })
    }
  }
  draft.messages.forEach((m, i) => {
    const where = draft.where[i]
    if (m.role === 'tool') {
      const k = open.findIndex(c => c.original === m.toolCallId)
      if (k < 0) { dropped.push(`${m.toolCallId} (${where})`); return }
      const [call] = open.splice(k, 1)
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
          for (let k = n; uses.has(id); k++) id = `${call.id}~${k}`
          uses.set(id, 1)
          renamed.push(`${call.id} → ${id} (${where})`)
        }
        open.push({ id, original: call.id, name: call.name, where })
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

function finish(format: TranscriptFormat, draft: Draft): Transcript {
  const messages = pairToolCalls(draft)
  return { format, envelope: draft.envelope, messages, usage: draft.usage, notes: draft.notes }
}

// ── openai ──

function readOpenAITranscript(parsed: ParsedTranscript): Transcript {
  const doc = expectJsonDocument(parsed, 'openai')
  const draft = newDraft()
  let list: unknown
  let path = 'messages'
  if (Array.isArray(doc)) { list = doc; path = '' } else if (isRecord(doc)) list = doc.messages
  if (!Array.isArray(list)) {
    throw new TranscriptError('an openai transcript is a JSON array of messages or an object with a "messages" array',
      { field: 'messages' })
  }
  if (list.length === 0) throw new TranscriptError('the message array is empty', { field: path || undefined })
  const head = list[0]
  if (isRecord(head) && !('role' in head) && ('action' in head || 'observation' in head)) {
    throw new TranscriptError('this looks like an OpenHands event list, which replay does not read', { field: `${path}[0].role` })
  }
  readChatMessages(list, path, draft, m => openAIUsage(m.usage))
  if (isRecord(doc)) {
    if (typeof doc.system === 'string' && draft.envelope.system === undefined) draft.envelope.system = doc.system
    if (doc.tools !== undefined) draft.envelope.tools = readToolSpecs(doc.tools, 'tools')
  }
  return finish('openai', draft)
}

/** `tools` as OpenAI sends them (`{type: "function", function: {...}}`) or bare `{name, ...}` specs. */
function readToolSpecs(tools: unknown, field: string, line?: number): ToolSpec[] {
  if (!Array.isArray(tools)) throw new TranscriptError('"tools" must be an array of function specs', { line, field })
  return tools.map((t, i) => {
    const fn = isRecord(t) && isRecord(t.function) ? t.function : t
    if (!isRecord(fn) || typeof fn.name !== 'string') {
      throw new TranscriptError('a tool spec needs a string "name"', { line, field: `${field}[${i}]` })
    }
    const spec: ToolSpec = { name: fn.name }
    if (typeof fn.description === 'string') spec.description = fn.description
    if (isRecord(fn.parameters)) spec.parameters = fn.parameters
    return spec
  })
}

// ── mini-swe-agent ──

/** mini-swe-agent 1.x's default `action_regex` (DOTALL): the command is the one ```bash block. */
const MINI_SWE_AGENT_BASH = /```bash\s*\n([\s\S]*?)\n```/g

function readMiniSweAgent(parsed: ParsedTranscript): Transcript {
  const doc = expectJsonDocument(parsed, 'mini-swe-agent')
  if (!isRecord(doc) || !Array.isArray(doc.messages)) {
    throw new TranscriptError('a mini-swe-agent trajectory is a JSON object with a "messages" array', { field: 'messages' })
  }
  const list: unknown[] = doc.messages
  const draft = newDraft()
  const usageOf = (m: JsonRecord) =>
    (isRecord(m.extra) && isRecord(m.extra.response) ? openAIUsage(m.extra.response.usage) : undefined)
  if (list.some(m => isRecord(m) && (m.role === 'tool' || Array.isArray(m.tool_calls)))) {
    readChatMessages(list, 'messages', draft, usageOf)
    draft.notes.push('mini-swe-agent trajectory with native tool calls: read as OpenAI messages')
    return finish('mini-swe-agent', draft)
  }
  let calls = 0
  let plain = 0
  let pending: string | undefined
  const system: string[] = []
  list.forEach((m, i) => {
    const at = `messages[${i}]`
    if (!isRecord(m)) throw new TranscriptError(`a message must be an object, got ${jsonType(m)}`, { field: at })
    if (typeof m.content !== 'string') {
      throw new TranscriptError('mini-swe-agent message content must be a string', { field: `${at}.content` })
    }
    const content = m.content
    const callId = pending
    pending = undefined
    if (m.role === 'system' && draft.messages.length === 0) system.push(content)
    else if (m.role === 'user' && callId !== undefined) {
      const isError = /^The last command <command>[\s\S]*?<\/command> timed out/.test(content)
      const result: ToolResultMessage = { role: 'tool', toolCallId: callId, content: [{ type: 'text', text: content }] }
      if (isError) result.isError = true
      push(draft, result, at)
    } else if (m.role === 'user' || m.role === 'system') {
      push(draft, { role: 'user', content }, at)
    } else if (m.role === 'assistant') {
      const blocks = [...content.matchAll(MINI_SWE_AGENT_BASH)]
      const out: Block[] = []
      if (blocks.length === 1) {
        const b = blocks[0]
        const text = (content.slice(0, b.index) + content.slice(b.index + b[0].length)).trim()
        if (text !== '') out.push({ type: 'text', text })
        pending = `mswea-call-${i}`
        out.push({ type: 'tool-call', id: pending, name: 'bash', arguments: JSON.stringify({ command: b[1] }) })
        calls++
      } else {
        if (content !== '') out.push({ type: 'text', text: content })
        plain++
      }
      push(draft, { role: 'assistant', content: out }, at, usageOf(m))
    } else {
      throw new TranscriptError(`unknown role ${JSON.stringify(m.role)}; mini-swe-agent has system, user, assistant`,
        { field: `${at}.role` })
    }
  })
  if (system.length > 0) draft.envelope.system = system.join('\n\n')
  draft.notes.push(`mini-swe-agent has no native tool calls: ${calls} assistant message(s) with exactly one bash block read as ` +
    'a `bash` tool call (block moved out of the text) and the next user message as its result' +
    (plain > 0 ? `; ${plain} with 0 or several bash blocks (format errors, nothing ran) kept as text` : ''))
  draft.notes.push('envelope.tools unknown: mini-swe-agent sends no tool specs')
  return finish('mini-swe-agent', draft)
}

// ── swe-agent ──

function readSweAgent(parsed: ParsedTranscript): Transcript {
  const doc = expectJsonDocument(parsed, 'swe-agent')
  if (!isRecord(doc) || !Array.isArray(doc.history)) {
    throw new TranscriptError('a SWE-agent trajectory is a JSON object with a "history" array', { field: 'history' })
  }
  if (doc.history.length === 0) throw new TranscriptError('the history is empty', { field: 'history' })
  const draft = newDraft()
  readChatMessages(doc.history, 'history', draft, () => undefined)
  draft.notes.push('read "history" only ("trajectory[].messages" repeats it at every step); no per-call usage in SWE-agent ' +
    'trajectories; envelope.tools unknown (the file names tool bundles, not specs)')
  return finish('swe-agent', draft)
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
      if (!isRecord(v.message)) {
        throw new TranscriptError(`a ${v.type} line needs a "message" object`, { line: l.line, field: 'message' })
      }
      entries.push(l)
    } else skippedTypes.set(v.type, (skippedTypes.get(v.type) ?? 0) + 1)
  }
  const main = entries.filter(l => l.value.isSidechain !== true)
  const side = entries.filter(l => l.value.isSidechain === true)
  const notes: string[] = []
  if (skippedTypes.size > 0) {
    notes.push(`skipped non-message lines: ${[...skippedTypes].map(([t, n]) => `${n} ${t}`).join(', ')}`)
  }
  // Sidechain runs: each is rooted at a line without a parent; Task subagents write them.
  const runs = new Map<string, JsonlLine[]>()
  for (const l of side) {
    const root = chainRoot(l, byUuid)
    const run = runs.get(root) ?? []
    run.push(l)
    runs.set(root, run)
  }
  let chain = main
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

/** The root uuid of a line's chain (for grouping sidechain runs); cycles end the walk. */
function chainRoot(l: JsonlLine, byUuid: Map<string, JsonlLine>): string {
  const seen = new Set<unknown>()
  let cur = l
  for (;;) {
    seen.add(cur.value.uuid)
    const parent = cur.value.parentUuid
    const next = typeof parent === 'string' ? byUuid.get(parent) : undefined
    if (!next || seen.has(parent)) return String(cur.value.uuid ?? `line ${cur.line}`)
    cur = next
  }
}

/**
 * One chain (main or one sidechain run) → transcript: the path from its last line back to its root
 * through `parentUuid`, across compaction boundaries through `logicalParentUuid`.
 */
function claudeChainTranscript(candidates: JsonlLine[], byUuid: Map<string, JsonlLine>): Transcript {
  const draft = newDraft()
  const leaf = candidates[candidates.length - 1]
  let path: JsonlLine[]
  if (candidates.every(l => typeof l.value.uuid === 'string')) {
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
    draft.notes.push('lines without "uuid": read in file order')
  }
  const assistants = new Map<string, { message: AssistantMessage; usageIndex: number; outputTokens: number }>()
  let compactSummaries = 0
  for (const l of path) {
    const v = l.value
    const msg = v.message
    if ((v.type !== 'user' && v.type !== 'assistant') || !isRecord(msg)) continue // e.g. a compaction boundary
    const at = { line: l.line }
    const where = `line ${l.line}`
    if (v.type === 'user') {
      if (v.isCompactSummary === true) { compactSummaries++; continue }
      const content = msg.content
      if (typeof content === 'string') { push(draft, { role: 'user', content }, where); continue }
      if (!Array.isArray(content)) {
        throw new TranscriptError('user content must be a string or an array of blocks', { ...at, field: 'message.content' })
      }
      const other: Block[] = []
      content.forEach((b, i) => {
        const field = `message.content[${i}]`
        if (!isRecord(b) || typeof b.type !== 'string') {
          throw new TranscriptError('a content block needs a string "type"', { ...at, field })
        }
        if (b.type === 'tool_result') {
          if (typeof b.tool_use_id !== 'string') {
            throw new TranscriptError('a tool_result needs a string "tool_use_id"', { ...at, field: `${field}.tool_use_id` })
          }
          const blocks = chatBlocks(b.content, `${field}.content`, at)
          if (blocks.length === 0) blocks.push({ type: 'text', text: '' })
          const result: ToolResultMessage = { role: 'tool', toolCallId: b.tool_use_id, content: blocks }
          if (b.is_error === true) result.isError = true
          push(draft, result, where)
        } else other.push(partBlock(b, field, at))
      })
      if (other.length > 0) push(draft, { role: 'user', content: other }, where)
    } else {
      const content = msg.content
      if (!Array.isArray(content)) {
        throw new TranscriptError('assistant content must be an array of blocks', { ...at, field: 'message.content' })
      }
      const blocks = content.map((b, i): Block => {
        const field = `message.content[${i}]`
        if (!isRecord(b) || typeof b.type !== 'string') {
          throw new TranscriptError('a content block needs a string "type"', { ...at, field })
        }
        if (b.type === 'tool_use') {
          if (typeof b.id !== 'string' || typeof b.name !== 'string') {
            throw new TranscriptError('a tool_use needs string "id" and "name"', { ...at, field: `${field}.id` })
          }
          return { type: 'tool-call', id: b.id, name: b.name, arguments: JSON.stringify(b.input ?? {}) }
        }
        if (b.type === 'thinking' && typeof b.thinking === 'string') return { type: 'reasoning', text: b.thinking }
        return partBlock(b, field, at)
      })
      const id = typeof msg.id === 'string' ? msg.id : String(v.uuid ?? `line ${l.line}`)
      const usage = claudeUsage(msg.usage)
      const group = assistants.get(id)
      if (group) {
        group.message.content.push(...blocks)
        // Later lines of one response carry the running output count: keep the largest.
        if (usage && usage.completionTokens >= group.outputTokens) {
          draft.usage[group.usageIndex] = usage
          group.outputTokens = usage.completionTokens
        }
      } else {
        const message: AssistantMessage = { role: 'assistant', content: blocks }
        assistants.set(id, { message, usageIndex: draft.usage.length, outputTokens: usage?.completionTokens ?? -1 })
        push(draft, message, where, usage)
      }
    }
  }
  if (compactSummaries > 0) {
    draft.notes.push(`dropped ${compactSummaries} compact-summary user message(s) written by Claude Code's own compaction`)
  }
  draft.notes.push('envelope unknown: Claude Code logs record neither the system prompt nor the tool specs')
  return finish('claude-code', draft)
}

/** Anthropic usage: prompt = input + cache creation + cache read tokens (all three are billed input). */
function claudeUsage(u: unknown): Usage | undefined {
  if (!isRecord(u) || typeof u.input_tokens !== 'number' || typeof u.output_tokens !== 'number') return undefined
  const created = typeof u.cache_creation_input_tokens === 'number' ? u.cache_creation_input_tokens : 0
  const read = typeof u.cache_read_input_tokens === 'number' ? u.cache_read_input_tokens : 0
  return { promptTokens: u.input_tokens + created + read, completionTokens: u.output_tokens, cachedTokens: read }
}

// ── dsh ──

const DSH_SURFACE_ROLE: Record<string, Message['role']> = {
  'user/message': 'user', 'assistant/message': 'assistant', 'tool/result': 'tool',
}

function readDshLog(parsed: ParsedTranscript): Transcript {
  const lines = expectJsonl(parsed, 'dsh')
  const draft = newDraft()
  let header: string | undefined
  let headerChanges = 0
  let replaced = 0
  for (const l of lines) {
    const v = l.value
    if (!isDshEvent(v)) {
      const field = typeof v.seq !== 'number' ? 'seq' : typeof v.type !== 'string' ? 'type' : !('time' in v) ? 'time' : 'data'
      throw new TranscriptError('a dsh log line is an event {seq: number, type: string, time, data: object}',
        { line: l.line, field })
    }
    const data = v.data as JsonRecord
    const type = v.type as string
    if (type === 'request/header') {
      const envelope: Envelope = {}
      if (typeof data.system === 'string') envelope.system = data.system
      if (data.tools !== undefined && data.tools !== null) envelope.tools = readToolSpecs(data.tools, 'data.tools', l.line)
      const key = JSON.stringify(envelope)
      if (header === undefined) { header = key; draft.envelope = envelope } else if (key !== header) headerChanges++
      continue
    }
    const role = DSH_SURFACE_ROLE[type]
    if (role === undefined) continue
    const op = isRecord(data.surfaceOp) ? data.surfaceOp.op : isRecord(v.surfaceOp) ? v.surfaceOp.op : undefined
    if (op !== 'append') { replaced++; continue }
    const m = data.message
    if (!isRecord(m) || m.role !== role) {
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
    const usage = isRecord(u) && typeof u.promptTokens === 'number' && typeof u.completionTokens === 'number'
      ? u as unknown as Usage : undefined
    push(draft, m as unknown as Message, `line ${l.line}`, usage)
  }
  if (replaced > 0) {
    draft.notes.push(`skipped ${replaced} replace event(s) (prunes and summaries of the recorded session): the history ` +
      'is replayed as first written')
  }
  if (headerChanges > 0) {
    draft.notes.push(`the request envelope changed ${headerChanges} time(s); the first one is used`)
  }
  return finish('dsh', draft)
}

// (cli-main)
