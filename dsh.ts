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

// ── 8.1 Built-in coding tools (DESIGN.md §8, issue 5) ─────────────────────────────────────────
// The file system and process code of dsh.ts. `node:` modules are loaded here through dynamic
// `import()` only, so that the core still bundles for edge runtimes (TOOLCHAIN.md).

/** Defaults of {@link builtinTools} (units in the names). */
export const BUILTIN_TOOL_DEFAULTS = Object.freeze({
  /** Cap on one tool's output in UTF-16 units. 100,000 ≈ 25,000 tokens by §2, the size of a big
   *  read in common coding agents; above it the pruner (§3) and the spill (§5) take over anyway. */
  maxOutputChars: 100_000,
  /** read_file: lines read when the model gives no `limit`. */
  readLimitLines: 2_000,
  /** list_files: entries listed at most (recursive listings stop there). */
  listMaxEntries: 1_000,
  /** grep: matches reported when the model gives no `max_matches`. */
  grepDefaultMatches: 100,
  /** grep: the most matches the model may ask for. */
  grepMaxMatches: 1_000,
  /** shell: timeout of a command when the model gives no `timeout_ms`, in ms. */
  shellTimeoutMs: 120_000,
  /** shell: the longest `timeout_ms` the model may ask for, in ms. */
  shellMaxTimeoutMs: 600_000,
})

/** Directories that list_files and grep never descend into (they may still be named as `path`). */
const TOOL_SKIP_DIRS: ReadonlySet<string> = new Set(['node_modules', '.git'])
/** Bytes sniffed for a NUL byte to call a file binary (the heuristic of git and grep). */
const TOOL_BINARY_SNIFF_BYTES = 8 * 1024
/** grep: files larger than this many bytes are skipped (and counted in the summary). */
const GREP_MAX_FILE_BYTES = 16 * 1024 * 1024
/** grep: a matching line is shown up to this many UTF-16 units. */
const GREP_LINE_CHARS = 500
/** shell: ms between SIGTERM and SIGKILL of the process group, and again before giving up on its pipes. */
const SHELL_KILL_GRACE_MS = 1_000

/** Options of {@link builtinTools}. Every number is a positive integer in the unit its name says. */
export interface BuiltinToolsOptions {
  /** Working directory. Relative paths resolve against it, and every path must stay inside it
   *  after symlinks are resolved (realpath). It must exist. */
  cwd: string
  /** Offer the `shell` tool (DESIGN.md §8: only with `--allow-shell` or an interactive yes). Default false. */
  allowShell?: boolean
  /** Cap on each tool's output in UTF-16 units; a one-line notice after the cut says what was left
   *  out and how to get it. `shell` gives each of stdout and stderr half of it (its first and last
   *  quarter), with a marker in the middle. Default {@link BUILTIN_TOOL_DEFAULTS}.maxOutputChars (100,000). */
  maxOutputChars?: number
  /** read_file: lines read when the model gives no `limit`. Default 2,000. */
  readLimitLines?: number
  /** list_files: entries listed at most. Default 1,000. */
  listMaxEntries?: number
  /** grep: the most matches the model may ask for with `max_matches`. Default 1,000. */
  grepMaxMatches?: number
  /** shell: timeout in ms when the model gives no `timeout_ms`. Default 120,000. */
  shellTimeoutMs?: number
  /** shell: the longest `timeout_ms` the model may ask for, in ms. Default 600,000. */
  shellMaxTimeoutMs?: number
}

type NodeFs = typeof import('node:fs/promises')
type NodePath = typeof import('node:path')
interface ToolHost {
  fs: NodeFs
  path: NodePath
  /** realpath of the working directory. */
  root: string
  maxOutputChars: number
}

/**
 * The built-in coding tools of the CLI (DESIGN.md §8): `read_file`, `list_files`, `grep`,
 * `write_file`, `edit_file`, and `shell` when `allowShell` is true. Plain {@link Tool} objects; any
 * agent can use them.
 *
 * Confinement: a path argument resolves against `cwd`, then through every symlink (realpath, also
 * for files that do not exist yet and for dangling links); a path that lands outside `cwd` is
 * refused with an error that names the resolved path. The `shell` tool is not confined: a command
 * can reach anything the user can, which is why it is opt-in. Checks and file operations are not
 * atomic: a process that swaps a directory for a symlink between them is out of scope.
 *
 * Output: each tool keeps at most `maxOutputChars` UTF-16 units of its own output and then adds
 * one notice line saying how much was left out and how to get more (offset, a narrower path…).
 * Failures throw an `Error` whose message starts with the tool's name and says what to do
 * instead; the loop turns it into an error result for the model (DESIGN.md §7). `shell` returns
 * `{content, isError: true}` for a non-zero exit, a timeout or a cancellation, with the output so far.
 *
 * Needs a runtime with `node:fs/promises`, `node:path` (and `node:child_process` for `shell`):
 * Node ≥ 20, Deno, Bun.
 * @throws TypeError for a bad option; Error when `cwd` does not exist or is not a directory.
 */
export async function builtinTools(options: BuiltinToolsOptions): Promise<Tool[]> {
  const known = ['cwd', 'allowShell', 'maxOutputChars', 'readLimitLines', 'listMaxEntries', 'grepMaxMatches', 'shellTimeoutMs', 'shellMaxTimeoutMs']
  for (const key of Object.keys(options)) {
    if (!known.includes(key)) throw new TypeError(`builtinTools: unknown option "${key}"; known options: ${known.join(', ')}`)
  }
  if (typeof options.cwd !== 'string' || options.cwd === '') throw new TypeError('builtinTools: options.cwd must be a non-empty directory path')
  const num = (name: keyof typeof BUILTIN_TOOL_DEFAULTS): number => {
    const value = (options as unknown as Record<string, unknown>)[name] ?? BUILTIN_TOOL_DEFAULTS[name]
    if (!Number.isSafeInteger(value) || (value as number) < 1) {
      throw new TypeError(`builtinTools: options.${name} must be a positive integer, got ${String(value)} (default ${BUILTIN_TOOL_DEFAULTS[name]})`)
    }
    return value as number
  }
  const maxOutputChars = num('maxOutputChars')
  const readLimitLines = num('readLimitLines')
  const listMaxEntries = num('listMaxEntries')
  const grepMaxMatches = num('grepMaxMatches')
  const shellTimeoutMs = num('shellTimeoutMs')
  const shellMaxTimeoutMs = num('shellMaxTimeoutMs')
  if (shellTimeoutMs > shellMaxTimeoutMs) {
    throw new TypeError(`builtinTools: options.shellTimeoutMs (${shellTimeoutMs} ms) exceeds options.shellMaxTimeoutMs (${shellMaxTimeoutMs} ms)`)
  }
  const [fs, path] = await Promise.all([import('node:fs/promises'), import('node:path')])
  let root: string
  try { root = await fs.realpath(path.resolve(options.cwd)) } catch (error) {
    throw new Error(`builtinTools: working directory ${options.cwd} is not usable (${fsErrorReason(error)})`, { cause: error })
  }
  if (!(await fs.stat(root)).isDirectory()) throw new Error(`builtinTools: working directory ${options.cwd} is not a directory`)
  const host: ToolHost = { fs, path, root, maxOutputChars }
  const tools = [
    readFileTool(host, readLimitLines),
    listFilesTool(host, listMaxEntries),
    grepTool(host, Math.min(BUILTIN_TOOL_DEFAULTS.grepDefaultMatches, grepMaxMatches), grepMaxMatches),
    writeFileTool(host),
    editFileTool(host),
  ]
  if (options.allowShell === true) tools.push(shellTool(host, shellTimeoutMs, shellMaxTimeoutMs))
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

function argString(tool: string, args: Record<string, unknown>, key: string, fallback?: string): string {
  const value = args[key] ?? fallback
  if (value === undefined) throw new Error(`${tool}: the argument "${key}" is required`)
  if (typeof value !== 'string') throw new Error(`${tool}: "${key}" must be a string, got ${JSON.stringify(value)}`)
  return value
}

/** An integer argument; a string of digits is accepted too (some models quote numbers). */
function argInt(tool: string, args: Record<string, unknown>, key: string, fallback: number, min: number, max: number, unit: string): number {
  let value = args[key]
  if (value === undefined || value === null) return fallback
  if (typeof value === 'string' && /^\d+$/.test(value.trim())) value = Number(value.trim())
  if (!Number.isSafeInteger(value) || (value as number) < min || (value as number) > max) {
    throw new Error(`${tool}: "${key}" must be an integer from ${min} to ${max} (${unit}), got ${JSON.stringify(value)}`)
  }
  return value as number
}

/** A boolean argument; the strings "true" and "false" are accepted too. */
function argBool(tool: string, args: Record<string, unknown>, key: string): boolean {
  const value = args[key]
  if (value === undefined || value === null || value === false || value === 'false') return false
  if (value === true || value === 'true') return true
  throw new Error(`${tool}: "${key}" must be true or false, got ${JSON.stringify(value)}`)
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

/** realpath that also works for paths that do not exist yet: the missing tail is re-appended to
 *  the realpath of the longest existing prefix, and a dangling symlink is followed by hand (so that
 *  writing through it cannot land outside the working directory). */
async function realpathLenient(host: ToolHost, target: string, hops = 0): Promise<string> {
  const { fs, path } = host
  try { return await fs.realpath(target) } catch (error) {
    const code = (error as { code?: unknown }).code
    if (code !== 'ENOENT' && code !== 'ENOTDIR') throw error
  }
  const parent = path.dirname(target)
  if (parent === target) return target
  const candidate = path.join(await realpathLenient(host, parent, hops), path.basename(target))
  let link: string
  try { link = await fs.readlink(candidate) } catch { return candidate }
  if (hops >= 40) throw Object.assign(new Error(`too many symbolic links at ${candidate}`), { code: 'ELOOP' })
  return realpathLenient(host, path.resolve(path.dirname(candidate), link), hops + 1)
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
async function confine(host: ToolHost, tool: string, input: string): Promise<{ real: string; shown: string }> {
  const { path, root } = host
  if (input === '') throw new Error(`${tool}: "path" is empty; give a path relative to the working directory, e.g. "."`)
  if (input.includes('\0')) throw new Error(`${tool}: "path" contains a NUL character`)
  const lexical = path.resolve(root, input)
  let real: string
  try { real = await realpathLenient(host, lexical) } catch (error) { throw fsError(tool, JSON.stringify(input), error) }
  if (!isInside(path, root, real)) {
    const how = isInside(path, root, lexical) ? 'through a symlink to' : 'to'
    throw new Error(`${tool}: ${JSON.stringify(input)} is outside the working directory ${root} ` +
      `(it resolves ${how} ${real}); these tools can only reach files inside the working directory, so use a path inside it`)
  }
  return { real, shown: shownPath(host, real) }
}

// ── output caps ──

function isHighSurrogate(unit: number): boolean { return unit >= 0xd800 && unit <= 0xdbff }
function isLowSurrogate(unit: number): boolean { return unit >= 0xdc00 && unit <= 0xdfff }

/** The first `maxUnits` UTF-16 units of `text`, one fewer when the cut would split a surrogate pair. */
function headUnits(text: string, maxUnits: number): string {
  if (text.length <= maxUnits) return text
  const end = maxUnits > 0 && isHighSurrogate(text.charCodeAt(maxUnits - 1)) ? maxUnits - 1 : maxUnits
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

function readFileTool(host: ToolHost, defaultLines: number): Tool {
  const max = host.maxOutputChars
  return {
    name: 'read_file',
    description: `Read a text file inside the working directory. Each line comes back as its 1-based line number, a tab, then the text ("     7\\tconst x = 1"); the number and tab are not part of the file. Reads up to "limit" lines (default ${defaultLines}) from line "offset" (default 1), and at most ${max} characters; a note at the end says when the file continues and which offset reads on.`,
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
      const { real, shown } = await confine(host, 'read_file', argString('read_file', args, 'path'))
      let st
      try { st = await host.fs.stat(real) } catch (error) { throw fsError('read_file', shown, error) }
      if (st.isDirectory()) throw new Error(`read_file: ${shown} is a directory; use list_files to see what is in it`)
      if (!st.isFile()) throw new Error(`read_file: ${shown} is not a regular file`)
      const size = st.size
      if (size === 0) return `(${shown} is empty: 0 bytes)`
      const handle = await host.fs.open(real, 'r').catch((error: unknown) => { throw fsError('read_file', shown, error) })
      // Streamed in chunks: reading lines 1-100 of a 1 GB log must not load the whole file.
      const lines: string[] = []
      let used = 0 // UTF-16 units in lines.join('\n')
      let lineNo = 0
      let stop: 'range' | 'cap' | 'long-line' | undefined
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
          const { bytesRead } = await handle.read(buffer, 0, buffer.length, position)
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
          if (pending.length > max + 16) { pending = pending.slice(0, max + 16); skippingLongLine = true }
        }
        if (stop === undefined) {
          pending += decoder.decode()
          if (pending.length > 0) take(pending)
        }
      } finally { await handle.close() }
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
      const { real, shown } = await confine(host, 'list_files', argString('list_files', args, 'path', '.'))
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
      const { text, count } = joinLinesCapped(entries, host.maxOutputChars)
      const notes: string[] = []
      if (count < entries.length) notes.push(`[output capped at ${host.maxOutputChars} characters: ${entries.length - count} more entries not shown; list a subdirectory to see them]`)
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

function grepTool(host: ToolHost, defaultMatches: number, maxMatches: number): Tool {
  const { fs, path } = host
  return {
    name: 'grep',
    description: `Search file contents inside the working directory, line by line, with a JavaScript regular expression (or a literal string with fixed_strings: true). Returns "path:line:text" for each matching line (text cut at ${GREP_LINE_CHARS} characters), then a summary. Skips ${[...TOOL_SKIP_DIRS].join(', ')}, symlinks, binary files and files over ${GREP_MAX_FILE_BYTES / 1024 / 1024} MiB.`,
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
      const fixed = argBool('grep', args, 'fixed_strings')
      const ignoreCase = argBool('grep', args, 'ignore_case')
      const limit = argInt('grep', args, 'max_matches', defaultMatches, 1, maxMatches, 'matching lines')
      const glob = args.glob === undefined ? undefined : argString('grep', args, 'glob')
      let regex: RegExp
      try { regex = new RegExp(fixed ? escapeRegExp(pattern) : pattern, ignoreCase ? 'i' : '') } catch (error) {
        throw new Error(`grep: ${JSON.stringify(pattern)} is not a valid JavaScript regular expression (${(error as Error).message}); fix it, or pass fixed_strings: true to search for the text literally`)
      }
      const globRegex = glob === undefined || glob === '' ? undefined : globToRegExp(glob)
      const globOnPath = glob !== undefined && glob.includes('/')
      const { real, shown } = await confine(host, 'grep', argString('grep', args, 'path', '.'))
      let st
      try { st = await fs.stat(real) } catch (error) { throw fsError('grep', shown, error) }

      const matches: string[] = []
      let filesSearched = 0
      let filesMatched = 0
      let skippedBinary = 0
      let skippedLarge = 0
      let reachedLimit = false
      const searchFile = async (file: string, size: number): Promise<void> => {
        if (size > GREP_MAX_FILE_BYTES) { skippedLarge++; return }
        let bytes: Uint8Array
        try { bytes = await fs.readFile(file) } catch { return } // vanished or unreadable: not a match
        if (hasNulByte(bytes)) { skippedBinary++; return }
        filesSearched++
        const text = new TextDecoder().decode(bytes)
        const rel = shownPath(host, file)
        let matchedHere = false
        for (let start = 0, lineNo = 1; start <= text.length; lineNo++) {
          let end = text.indexOf('\n', start)
          if (end === -1) { if (start === text.length) break; end = text.length }
          const line = text.charCodeAt(end - 1) === 13 ? text.slice(start, end - 1) : text.slice(start, end)
          start = end + 1
          if (!regex.test(line)) continue
          const cut = headUnits(line, GREP_LINE_CHARS)
          matches.push(`${rel}:${lineNo}:${cut}${cut.length < line.length ? ` [… ${line.length - cut.length} more characters]` : ''}`)
          matchedHere = true
          if (matches.length >= limit) { reachedLimit = true; break }
        }
        if (matchedHere) filesMatched++
      }
      const walk = async (dir: string): Promise<void> => {
        let dirents
        try { dirents = await fs.readdir(dir, { withFileTypes: true }) } catch (error) {
          if (dir === real) throw fsError('grep', shown, error)
          return
        }
        dirents.sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0))
        for (const dirent of dirents) {
          if (reachedLimit) return
          if (ctx.signal.aborted) throw new Error('grep: cancelled')
          const child = path.join(dir, dirent.name)
          if (dirent.isDirectory()) { if (!TOOL_SKIP_DIRS.has(dirent.name)) await walk(child); continue }
          if (!dirent.isFile()) continue // symlinks are not followed (they could lead outside)
          if (globRegex) {
            const rel = path.relative(real, child).split(path.sep).join('/')
            if (!globRegex.test(globOnPath ? rel : dirent.name)) continue
          }
          let size: number
          try { size = (await fs.stat(child)).size } catch { continue }
          await searchFile(child, size)
        }
      }
      if (st.isDirectory()) await walk(real)
      else await searchFile(real, st.size)

      const skipped = [
        skippedBinary > 0 ? plural(skippedBinary, 'binary file') : '',
        skippedLarge > 0 ? `${plural(skippedLarge, 'file')} over ${GREP_MAX_FILE_BYTES / 1024 / 1024} MiB` : '',
      ].filter(Boolean).join(' and ')
      const searched = `${plural(filesSearched, 'file')} searched${skipped ? `; skipped ${skipped}` : ''}`
      const what = `${fixed ? JSON.stringify(pattern) : `/${pattern}/`}${ignoreCase ? ' (ignoring case)' : ''}${glob ? ` in files matching ${glob}` : ''}`
      if (matches.length === 0) return `no matches for ${what} in ${shown} (${searched})`
      const { text, count } = joinLinesCapped(matches, host.maxOutputChars)
      const notes: string[] = []
      if (count < matches.length) notes.push(`[output capped at ${host.maxOutputChars} characters: ${matches.length - count} more matching lines not shown; narrow the path or glob]`)
      notes.push(reachedLimit
        ? `[stopped at max_matches=${limit}: ${plural(matches.length, 'matching line')} in ${plural(filesMatched, 'file')}; narrow the pattern, path or glob${limit < maxMatches ? `, or raise max_matches (up to ${maxMatches})` : ''}]`
        : `[${plural(matches.length, 'matching line')} in ${plural(filesMatched, 'file')}; ${searched}]`)
      return [text, ...notes].join('\n')
    },
  }
}

// ── write_file and edit_file ──

function writeFileTool(host: ToolHost): Tool {
  const { fs, path } = host
  return {
    name: 'write_file',
    description: 'Create or overwrite a file inside the working directory with the given content (UTF-8). Parent directories are created as needed. To change part of an existing file, prefer edit_file.',
    parameters: {
      type: 'object',
      properties: {
        path: { type: 'string', description: 'File path, relative to the working directory.' },
        content: { type: 'string', description: 'The complete new content of the file.' },
      },
      required: ['path', 'content'],
      additionalProperties: false,
    },
    async execute(rawArgs) {
      const args = toolArgs('write_file', rawArgs, ['path', 'content'])
      const content = argString('write_file', args, 'content')
      const { real, shown } = await confine(host, 'write_file', argString('write_file', args, 'path'))
      const st = await fs.stat(real).catch((error: unknown) => {
        if ((error as { code?: unknown }).code === 'ENOENT') return undefined
        throw fsError('write_file', shown, error)
      })
      if (st?.isDirectory()) throw new Error(`write_file: ${shown} is a directory; give a file path`)
      const previousBytes = st?.size
      try {
        await fs.mkdir(path.dirname(real), { recursive: true })
        await fs.writeFile(real, content, 'utf8')
      } catch (error) { throw fsError('write_file', shown, error) }
      const bytes = new TextEncoder().encode(content).length
      return `wrote ${plural(bytes, 'byte')} to ${shown} (${previousBytes === undefined ? 'new file' : `replaced ${plural(previousBytes, 'byte')}`})`
    },
  }
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

/** Non-overlapping occurrences of `needle` in `text`, as UTF-16 offsets. */
function occurrences(text: string, needle: string): number[] {
  const found: number[] = []
  for (let at = text.indexOf(needle); at !== -1; at = text.indexOf(needle, at + needle.length)) found.push(at)
  return found
}

function editFileTool(host: ToolHost): Tool {
  const { fs } = host
  return {
    name: 'edit_file',
    description: 'Edit a file inside the working directory by exact string replacement: old_string must appear in the file exactly once (include enough surrounding lines to make it unique), unless replace_all is true. Copy old_string from read_file output without the line-number prefix, keeping indentation and whitespace exactly.',
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
    async execute(rawArgs) {
      const args = toolArgs('edit_file', rawArgs, ['path', 'old_string', 'new_string', 'replace_all'])
      let oldString = argString('edit_file', args, 'old_string')
      let newString = argString('edit_file', args, 'new_string')
      const replaceAll = argBool('edit_file', args, 'replace_all')
      if (oldString === '') throw new Error('edit_file: old_string is empty; to create a file or replace all of it use write_file')
      if (oldString === newString) throw new Error('edit_file: old_string and new_string are the same; nothing would change')
      const { real, shown } = await confine(host, 'edit_file', argString('edit_file', args, 'path'))
      let bytes: Uint8Array
      try { bytes = await fs.readFile(real) } catch (error) {
        throw fsError('edit_file', shown, error, (error as { code?: unknown }).code === 'ENOENT' ? '; to create a new file use write_file' : '')
      }
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
      if (found.length > 1 && !replaceAll) {
        const lines = lineNumbersAt(text, found.slice(0, 10))
        throw new Error(`edit_file: old_string occurs ${found.length} times in ${shown} (at lines ${lines.join(', ')}${found.length > 10 ? ', …' : ''}); include more surrounding text to make it unique, or set replace_all: true to replace every occurrence`)
      }
      let edited = ''
      let from = 0
      for (const at of found) { edited += text.slice(from, at) + newString; from = at + oldString.length } // slices, not String.replace: "$&" in new_string stays literal
      edited += text.slice(from)
      try { await fs.writeFile(real, edited, 'utf8') } catch (error) { throw fsError('edit_file', shown, error) }
      const lines = lineNumbersAt(text, found.slice(0, 10))
      return `edited ${shown}: replaced ${plural(found.length, 'occurrence')} (at ${lines.length === 1 ? 'line' : 'lines'} ${lines.join(', ')}${found.length > 10 ? ', …' : ''})${crlf ? '; matched with CRLF line endings' : ''}`
    },
  }
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
      const room = this.headMax - this.head.length
      this.head += chunk.slice(0, room)
      chunk = chunk.slice(room)
    }
    if (chunk !== '' && this.tailMax > 0) this.tail = (this.tail + chunk).slice(-this.tailMax)
  }
  /** The kept text; when anything was dropped, a marker in the middle says how much. */
  render(label: string): string {
    if (this.total <= this.headMax + this.tailMax) return this.head + this.tail
    // Drop half of a surrogate pair at either cut.
    const head = isHighSurrogate(this.head.charCodeAt(this.head.length - 1)) ? this.head.slice(0, -1) : this.head
    const tail = isLowSurrogate(this.tail.charCodeAt(0)) ? this.tail.slice(1) : this.tail
    return `${head}\n[… ${this.total - head.length - tail.length} characters of ${label} cut here …]\n${tail}`
  }
}

function shellTool(host: ToolHost, defaultTimeoutMs: number, maxTimeoutMs: number): Tool {
  const half = Math.floor(host.maxOutputChars / 2)
  return {
    name: 'shell',
    description: `Run a shell command (sh -c; cmd.exe on Windows) in the working directory, without stdin. Returns the exit code, stdout and stderr; each stream keeps its first and last ${Math.floor(half / 2)} characters. The command is killed (with its process group) after timeout_ms (default ${defaultTimeoutMs}, at most ${maxTimeoutMs}) or when the turn is cancelled. Unlike the file tools, commands can reach outside the working directory: keep them to the task.`,
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
      const timeoutMs = argInt('shell', args, 'timeout_ms', defaultTimeoutMs, 1, maxTimeoutMs, 'milliseconds')
      if (ctx.signal.aborted) throw new Error('shell: not run, the turn was cancelled')
      const [{ spawn }, proc] = await Promise.all([import('node:child_process'), import('node:process')])
      const posix = proc.platform !== 'win32'
      // Own process group (detached) on POSIX, so that a timeout kills the command's children too.
      const child = spawn(command, { cwd: host.root, shell: true, stdio: ['ignore', 'pipe', 'pipe'], detached: posix, windowsHide: true })
      const stdout = new StreamText(Math.floor(half / 2), half - Math.floor(half / 2))
      const stderr = new StreamText(Math.floor(half / 2), half - Math.floor(half / 2))
      child.stdout.setEncoding('utf8') // decodes UTF-8 split across chunks
      child.stderr.setEncoding('utf8')
      child.stdout.on('data', (chunk: string) => stdout.push(chunk))
      child.stderr.on('data', (chunk: string) => stderr.push(chunk))
      const outcome = await new Promise<{ code: number | null; signal: string | null; why: 'exit' | 'timeout' | 'aborted' | 'error'; error?: Error }>((resolve) => {
        let why: 'exit' | 'timeout' | 'aborted' = 'exit'
        const timers: ReturnType<typeof setTimeout>[] = []
        const killGroup = (signal: 'SIGTERM' | 'SIGKILL'): void => {
          try { if (posix && child.pid !== undefined) proc.kill(-child.pid, signal); else child.kill(signal) } catch { /* already gone */ }
        }
        const finish = (result: { code: number | null; signal: string | null; error?: Error }): void => {
          for (const timer of timers) clearTimeout(timer)
          ctx.signal.removeEventListener('abort', onAbort)
          resolve({ ...result, why: result.error ? 'error' : why })
        }
        const stop = (reason: 'timeout' | 'aborted'): void => {
          if (why !== 'exit') return
          why = reason
          killGroup('SIGTERM')
          timers.push(setTimeout(() => {
            killGroup('SIGKILL')
            // A grandchild outside the group may hold the pipes open: stop waiting for them.
            timers.push(setTimeout(() => { child.stdout.destroy(); child.stderr.destroy(); finish({ code: child.exitCode, signal: child.signalCode }) }, SHELL_KILL_GRACE_MS))
          }, SHELL_KILL_GRACE_MS))
        }
        const onAbort = (): void => stop('aborted')
        ctx.signal.addEventListener('abort', onAbort, { once: true })
        timers.push(setTimeout(() => stop('timeout'), timeoutMs))
        child.once('error', (error) => finish({ code: null, signal: null, error }))
        child.once('close', (code, signal) => finish({ code, signal }))
      })
      if (outcome.why === 'error') throw new Error(`shell: could not start the command: ${outcome.error?.message}`, { cause: outcome.error })
      const status = outcome.why === 'timeout' ? `timed out after ${timeoutMs} ms; the command was killed (raise timeout_ms, up to ${maxTimeoutMs}, if it needs longer)`
        : outcome.why === 'aborted' ? 'cancelled; the command was killed'
        : outcome.code === null ? `killed by signal ${outcome.signal}`
        : `exit code ${outcome.code}`
      const parts = [status]
      if (stdout.total > 0) parts.push(`stdout:\n${stdout.render('stdout')}`)
      if (stderr.total > 0) parts.push(`stderr:\n${stderr.render('stderr')}`)
      if (stdout.total === 0 && stderr.total === 0) parts.push('(no output)')
      const content = parts.join('\n')
      return outcome.why === 'exit' && outcome.code === 0 ? content : { content, isError: true }
    },
  }
}

// (cli-replay)

// (cli-main)

// ── 8.3 Command line: arguments, configuration, entry point (DESIGN.md §8, issue 5) ──────────

/** DeepSeek defaults of the CLI (DESIGN.md §6). */
export const CLI_DEFAULTS = Object.freeze({
  baseURL: 'https://api.deepseek.com',
  model: 'deepseek-v4-flash',
  /** Environment variable read for the key when neither `--api-key-env` nor a non-DeepSeek base URL is given. */
  apiKeyEnv: 'DEEPSEEK_API_KEY',
  /** Compaction threshold as a ratio of the context window (DESIGN.md §5). */
  threshold: 0.8,
  /** replay: size of a simulated summary, in tokens (issue 5). */
  summaryTokens: 2_000,
})

/** Transcript formats `replay --format` accepts (issue 5; ../shared/corpus/FORMATS.md). `auto` detects. */
export type CliReplayFormat = 'auto' | 'dsh' | 'openai' | 'claude-code' | 'swe-agent' | 'mini-swe-agent'
const CLI_REPLAY_FORMATS: readonly CliReplayFormat[] = ['auto', 'dsh', 'openai', 'claude-code', 'swe-agent', 'mini-swe-agent']

/** A bad command line or missing configuration. The CLI prints `message` (one line) and exits with `exitCode` 2. */
export class UsageError extends Error {
  readonly exitCode = 2
  constructor(message: string) {
    super(message)
    this.name = 'UsageError'
  }
}

/** Where to send model calls, resolved from flags, environment and {@link CLI_DEFAULTS}. */
export interface CliModelOptions {
  /** Model name: `--model`, else `$DSH_MODEL`, else `deepseek-v4-flash`. */
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
  /** `--context-window N`, tokens. Absent: the provider's known window for the model (DESIGN.md §6). */
  contextWindow?: number
  /** `--max-tokens N`, completion budget per call in tokens. Absent: the provider's default. */
  maxTokens?: number
  /** `--session FILE`: JSONL session log, resumed when it exists (path as given). */
  session?: string
  /** `--threshold R`: compaction threshold, a ratio of the window in (0, 1]. Default 0.8. */
  threshold: number
  /** `--json`: every event as one JSON line on stdout. */
  json: boolean
  /** `--allow-shell`: offer the shell tool. */
  allowShell: boolean
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
  /** `--json`: machine-readable output. */
  json: boolean
  /** `--summary-tokens N`: size of a simulated summary in tokens. Default 2,000. */
  summaryTokens: number
  /** `--format F`. Default `auto`. */
  format: CliReplayFormat
  /** Present when `--base-url`, `--model` or `--api-key-env` asks for real summary calls; absent:
   *  summaries are simulated at `summaryTokens` (a key in the environment alone never costs money). */
  summarizer?: CliModelOptions
}

/** What {@link parseCliArgs} returns. */
export type CliOptions = { command: 'help' } | { command: 'version' } | CliRunOptions | CliReplayOptions

/** Flags: the value name (undefined = a switch) and the commands that accept it. */
const CLI_FLAGS: Readonly<Record<string, { value?: string; commands: readonly ('run' | 'replay')[] }>> = {
  '--print': { value: 'PROMPT', commands: ['run'] },
  '--model': { value: 'NAME', commands: ['run', 'replay'] },
  '--base-url': { value: 'URL', commands: ['run', 'replay'] },
  '--api-key-env': { value: 'NAME', commands: ['run', 'replay'] },
  '--context-window': { value: 'N', commands: ['run', 'replay'] },
  '--max-tokens': { value: 'N', commands: ['run'] },
  '--session': { value: 'FILE', commands: ['run'] },
  '--threshold': { value: 'R', commands: ['run', 'replay'] },
  '--json': { commands: ['run', 'replay'] },
  '--allow-shell': { commands: ['run'] },
  '--summary-tokens': { value: 'N', commands: ['replay'] },
  '--format': { value: 'F', commands: ['replay'] },
  '--help': { commands: ['run', 'replay'] },
  '--version': { commands: ['run', 'replay'] },
}
const CLI_SHORT_FLAGS: Readonly<Record<string, string>> = { '-p': '--print', '-h': '--help' }

/** The `--help` text (DESIGN.md §8). */
export const CLI_HELP = `dsh ${VERSION}: a coding agent that keeps long sessions inside the model's context window

Usage
  npx tsx dsh.ts                       interactive session (needs a terminal)
  npx tsx dsh.ts "PROMPT"              run one prompt, print the answer, exit
  npx tsx dsh.ts -p "PROMPT"           the same (--print)
  npx tsx dsh.ts replay FILE [...]     replay a recorded session offline (see below)

Options
  -p, --print PROMPT     run PROMPT once; the answer goes to stdout
  --model NAME           model name (default: $DSH_MODEL, else ${CLI_DEFAULTS.model})
  --base-url URL         any OpenAI-compatible server; requests go to URL/chat/completions
                         (default: $DSH_BASE_URL, else ${CLI_DEFAULTS.baseURL})
  --api-key-env NAME     read the API key from the environment variable NAME (default:
                         ${CLI_DEFAULTS.apiKeyEnv}, which is only sent to api.deepseek.com;
                         a server that needs no key, e.g. a local one, needs no flag)
  --context-window N     context window in tokens; required for models dsh does not know
                         (it knows deepseek-v4-flash and deepseek-v4-pro: 1,048,576)
  --max-tokens N         completion budget per model call, in tokens (default: the provider's;
                         always clamped to the room left in the window)
  --session FILE         keep the session in FILE (JSONL); resumes it when FILE exists
  --threshold R          compact when the context reaches R x window, 0 < R <= 1 (default ${CLI_DEFAULTS.threshold})
  --json                 print every event as one JSON object per line on stdout
  --allow-shell          let the model run shell commands in the working directory
  -h, --help             show this help
  --version              print the version

The model gets these tools: read_file, list_files, grep, write_file, edit_file (all limited to
the working directory) and, with --allow-shell, shell. Interactive commands: /compact, /usage,
/help, /exit; Ctrl-C cancels the running turn, a second Ctrl-C exits.

Replay: npx tsx dsh.ts replay FILE [options]
  Runs a recorded session (a dsh log, an OpenAI-style message array, a Claude Code session
  JSONL, a SWE-agent or mini-swe-agent trajectory) through the meter and the ladder and prints,
  per step, tokens before and after, the rung taken and tokens reclaimed, then totals.
  --context-window N     window to simulate, in tokens
  --threshold R          as above (default ${CLI_DEFAULTS.threshold})
  --summary-tokens N     size of a simulated summary, in tokens (default ${CLI_DEFAULTS.summaryTokens})
  --format F             force a format: ${CLI_REPLAY_FORMATS.slice(1).join(', ')}
                         (default auto: detected from the file)
  --json                 machine-readable output
  --base-url URL, --model NAME, --api-key-env NAME
                         summarise with a real model instead of simulating summaries

Environment
  ${CLI_DEFAULTS.apiKeyEnv}       API key for DeepSeek (https://platform.deepseek.com)
  DSH_BASE_URL           default for --base-url
  DSH_MODEL              default for --model
  NO_COLOR               plain status line

Exit codes
  0  done
  1  the provider or a tool failed (the error is on stderr)
  2  usage error: a bad flag or missing configuration (one line on stderr says what to set)

Examples
  export ${CLI_DEFAULTS.apiKeyEnv}=sk-...
  npx tsx dsh.ts -p "list the TODO comments in src/, grouped by file"
  npx tsx dsh.ts --session fix.jsonl "make the failing test in test/date.test.ts pass"
  npx tsx dsh.ts --session fix.jsonl "now add a test for leap years"   # continues the session
  npx tsx dsh.ts --base-url http://127.0.0.1:8080/v1 --model qwen3-coder --context-window 32768
  npx tsx dsh.ts replay examples/session.jsonl --context-window 32000
`

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
  if (!/^\d+$/.test(raw) || !Number.isSafeInteger(value) || value < 1) {
    throw new UsageError(`${flag} must be a positive whole number of ${unit}, got ${JSON.stringify(raw)} (e.g. ${flag} ${example})`)
  }
  return value
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
function resolveModelOptions(flags: Map<string, string>, env: Record<string, string | undefined>): CliModelOptions {
  const nonEmpty = (value: string | undefined): string | undefined => (value === undefined || value === '' ? undefined : value)
  const urlSource = flags.has('--base-url') ? '--base-url' : nonEmpty(env.DSH_BASE_URL) ? 'DSH_BASE_URL' : undefined
  const rawURL = flags.get('--base-url') ?? nonEmpty(env.DSH_BASE_URL) ?? CLI_DEFAULTS.baseURL
  let url: URL
  try { url = new URL(rawURL) } catch { url = new URL('invalid:') }
  if (url.protocol !== 'http:' && url.protocol !== 'https:') {
    throw new UsageError(`${urlSource ?? 'the base URL'} must be an http(s) URL such as http://127.0.0.1:8080/v1, got ${JSON.stringify(rawURL)}`)
  }
  const baseURL = rawURL.replace(/\/+$/, '')
  const model = flags.get('--model') ?? nonEmpty(env.DSH_MODEL) ?? CLI_DEFAULTS.model
  if (model.trim() === '') throw new UsageError('--model is empty; give a model name, e.g. --model deepseek-v4-pro')

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
  if (url.hostname !== new URL(CLI_DEFAULTS.baseURL).hostname) return { model, baseURL } // a server that needs no key, or a 401 the provider reports
  const apiKey = nonEmpty(env[CLI_DEFAULTS.apiKeyEnv])
  if (apiKey === undefined) {
    throw new UsageError(`no API key: set ${CLI_DEFAULTS.apiKeyEnv} (or --api-key-env NAME), or point --base-url at a server that needs none`)
  }
  return { model, baseURL, apiKey, apiKeyEnv: CLI_DEFAULTS.apiKeyEnv }
}

/**
 * Parses the command line (DESIGN.md §8, issue 5). Pure: reads only its arguments.
 *
 * `argv` is the arguments after the script (`process.argv.slice(2)`); `env` is the environment
 * (`DEEPSEEK_API_KEY`, `DSH_BASE_URL`, `DSH_MODEL`, and the variable named by `--api-key-env`;
 * empty values count as unset). Long flags take their value as the next argument or after `=`
 * (`--model=x`); `--` ends the flags. The first argument `replay` selects the replay command.
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
export function parseCliArgs(argv: readonly string[], env: Record<string, string | undefined>): CliOptions {
  const endOfFlags = argv.indexOf('--')
  const flagPart = endOfFlags === -1 ? argv : argv.slice(0, endOfFlags)
  if (flagPart.some((arg) => arg === '--help' || arg === '-h')) return { command: 'help' }
  if (flagPart.includes('--version')) return { command: 'version' }

  const command = argv[0] === 'replay' ? 'replay' : 'run'
  const flags = new Map<string, string>()
  const positionals: string[] = []
  for (let i = command === 'replay' ? 1 : 0; i < argv.length; i++) {
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
    flags.set(name, value)
  }

  const contextWindow = flags.has('--context-window') ? parsePositiveInt('--context-window', flags.get('--context-window')!, 'tokens', '128000') : undefined
  const threshold = flags.has('--threshold') ? parseThreshold(flags.get('--threshold')!) : CLI_DEFAULTS.threshold
  const json = flags.has('--json')

  if (command === 'replay') {
    if (positionals.length === 0) throw new UsageError('replay needs a FILE: npx tsx dsh.ts replay FILE [--context-window N]')
    if (positionals.length > 1) throw new UsageError(`replay takes one FILE, got ${positionals.length} (${positionals.map((p) => JSON.stringify(p)).join(', ')})`)
    const summaryTokens = flags.has('--summary-tokens') ? parsePositiveInt('--summary-tokens', flags.get('--summary-tokens')!, 'tokens', '2000') : CLI_DEFAULTS.summaryTokens
    const format = (flags.get('--format') ?? 'auto') as CliReplayFormat
    if (!CLI_REPLAY_FORMATS.includes(format)) throw new UsageError(`--format must be one of ${CLI_REPLAY_FORMATS.join(', ')}, got ${JSON.stringify(format)}`)
    const real = flags.has('--base-url') || flags.has('--model') || flags.has('--api-key-env')
    return {
      command, file: positionals[0], contextWindow, threshold, json, summaryTokens, format,
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
  const prompt = printed ?? positionals[0]
  if (prompt !== undefined && prompt.trim() === '') throw new UsageError('the prompt is empty; give a task, e.g. -p "explain src/main.ts"')
  const maxTokens = flags.has('--max-tokens') ? parsePositiveInt('--max-tokens', flags.get('--max-tokens')!, 'tokens', '8192') : undefined
  if (maxTokens !== undefined && contextWindow !== undefined && maxTokens >= contextWindow) {
    throw new UsageError(`--max-tokens ${maxTokens} must be below --context-window ${contextWindow}: the prompt needs room too`)
  }
  const session = flags.get('--session')
  if (session === '') throw new UsageError('--session needs a file name, e.g. --session work.jsonl')
  return {
    command, ...resolveModelOptions(flags, env), prompt, print: printed !== undefined,
    contextWindow, maxTokens, session, threshold, json, allowShell: flags.has('--allow-shell'),
  }
}

/** Where {@link runCliBasics} writes. */
export interface CliIO {
  stdout(text: string): void
  stderr(text: string): void
}

/**
 * The first part of the CLI's `main`: parses `argv`, answers `--help` and `--version` on stdout,
 * and reports a {@link UsageError} as ONE line `dsh: …` on stderr.
 * @returns `{exitCode}` when the process should exit now (0 after help/version, 2 after a usage
 *   error), or `{options}` for the run or replay command to carry out.
 * @throws only what is not a UsageError (a bug).
 */
export function runCliBasics(argv: readonly string[], env: Record<string, string | undefined>, io: CliIO): { exitCode: number } | { options: CliRunOptions | CliReplayOptions } {
  let options: CliOptions
  try { options = parseCliArgs(argv, env) } catch (error) {
    if (!(error instanceof UsageError)) throw error
    io.stderr(`dsh: ${error.message}\n`)
    return { exitCode: error.exitCode }
  }
  if (options.command === 'help') { io.stdout(CLI_HELP); return { exitCode: 0 } }
  if (options.command === 'version') { io.stdout(`dsh.ts ${VERSION}\n`); return { exitCode: 0 } }
  return { options }
}

/**
 * Whether dsh.ts (or its bundle) is the program being run, not a module being imported
 * (DESIGN.md §0, TOOLCHAIN.md). Deno and Bun: `import.meta.main`. Node: the realpath of
 * `import.meta.url` equals the realpath of `process.argv[1]` (so a symlinked bin works). A bundle
 * without `import.meta.url` (the IIFE build for edge runtimes) is never the entry point.
 *
 * `probe` is for tests; by default it is read from this module and the process. Async because the
 * realpath check loads `node:fs` lazily: call it as `isEntryPoint().then(…)`, not with a top-level
 * `await`, which the IIFE bundle does not allow. Never throws.
 */
export async function isEntryPoint(probe: { url?: string; main?: unknown; argv1?: string } = entryProbe()): Promise<boolean> {
  if (typeof probe.main === 'boolean') return probe.main
  if (typeof probe.url !== 'string' || !probe.url.startsWith('file:') || typeof probe.argv1 !== 'string' || probe.argv1 === '') return false
  try {
    const [{ realpath }, { fileURLToPath }] = await Promise.all([import('node:fs/promises'), import('node:url')])
    const [self, script] = await Promise.all([realpath(fileURLToPath(probe.url)), realpath(probe.argv1)])
    return self === script
  } catch {
    return false
  }
}

function entryProbe(): { url?: string; main?: unknown; argv1?: string } {
  const meta = import.meta as { url?: string; main?: unknown }
  return { url: meta.url, main: meta.main, argv1: (globalThis as { process?: { argv?: string[] } }).process?.argv?.[1] }
}
