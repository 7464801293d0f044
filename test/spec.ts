// Values and texts that docs/design.md and dsh's documented behaviour fix, stated by the tests.
// dsh.ts keeps them private (docs/design.md §14: one export list); a test states them here, so a
// change to any of them shows up as a failing test rather than passing silently.
import { estimateRequestTokens, internals, type Envelope, type Ledger, type RequestHeader, type Session } from '../dsh.ts'

/** The one-line preamble of a summary checkpoint (docs/design.md §4). */
export const CHECKPOINT_PREAMBLE =
  'Earlier parts of this session were compacted into the checkpoint below; continue the work from it.'

/** The instruction that ends every summary request (docs/design.md §5 "Summary transaction"). */
export const SUMMARY_INSTRUCTION = [
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

/** The summary instruction with a focus paragraph (docs/design.md §12, `/compact FOCUS`). */
export function summaryInstructionText(instruction = SUMMARY_INSTRUCTION, focus?: string): string {
  return focus === undefined || focus.trim() === '' ? instruction
    : `${instruction}\n\nFocus of this checkpoint, as asked for: ${focus.trim()}\n`
      + 'Give it the most detail; keep everything else that still matters.'
}

/** A framed checkpoint: preamble, the summary in `<compacted-summary>`, then the ledger when it holds anything. */
export function frameCheckpoint(summary: string, ledger?: Ledger): string {
  const framed = `${CHECKPOINT_PREAMBLE}\n<compacted-summary>\n${summary.trim()}\n</compacted-summary>`
  const entries = ledger ? ['read', 'written', 'edited', 'commands', 'errors', 'userMessages']
    .reduce((n, k) => n + (ledger[k as keyof Ledger] as unknown[]).length, 0) : 0
  return ledger && entries > 0 ? `${framed}\n${internals.renderLedger(ledger)}` : framed
}

/** The fixed start of a cleared tool result's placeholder (docs/design.md §10). */
export const CLEARED_RESULT_PREFIX = '[dsh cleared this tool result to save context]'
/** The name of the tool that reads back shadowed originals (docs/design.md §10). */
export const RECALL_TOOL_NAME = 'recall'
/** Cap on one recall answer, code points (docs/design.md §10). */
export const RECALL_MAX_CODE_POINTS = 4096

/** A cleared result's placeholder: prefix, tool name, arguments (≤ 200 code points), price and recall key. */
export function clearedPlaceholder(toolName: string, args: string, originalTokens: number, key: string): string {
  const folded = [...args.replace(/\s+/g, ' ').trim()]
  const shown = folded.length > 200 ? `${folded.slice(0, 200).join('')}…` : folded.join('')
  return `${CLEARED_RESULT_PREFIX} ${toolName} ${shown || '{}'} → ${originalTokens} tokens; `
    + `${RECALL_TOOL_NAME} {"key":${JSON.stringify(key)}} returns it.`
}

/** A summary request carries the tool specs unless they take more than this share of the window (§10). */
export const SUMMARY_TOOLS_MAX_RATIO = 0.1
/** The smallest request (heuristic tokens) that gives a calibration sample (docs/design.md §10)… */
export const CALIBRATION_MIN_SAMPLE_TOKENS = 1000
/** …or an eighth of a smaller window. */
export const calibrationMinSampleTokens = (contextWindow?: number): number =>
  contextWindow === undefined || !(contextWindow > 0) ? CALIBRATION_MIN_SAMPLE_TOKENS
    : Math.min(CALIBRATION_MIN_SAMPLE_TOKENS, Math.floor(contextWindow / 8))
/** The ledger budget: min(2,000 tokens, floor(window × 0.05)) (docs/design.md §12). */
export const ledgerBudget = (contextWindow?: number): number =>
  contextWindow === undefined ? 2000 : Math.min(2000, Math.floor(contextWindow * 0.05))

/** Default completion budget, tokens (docs/design.md §6). */
export const DEFAULT_MAX_TOKENS = 32_768
/** An error body or a non-streamed body is read up to this many bytes (docs/design.md §13). */
export const RESPONSE_BODY_MAX_BYTES = 64 * 1024
/** The cap on one assistant message, UTF-8 bytes (docs/design.md §13). */
export const MAX_MESSAGE_BYTES = 8 * 1024 * 1024

/** The artefact name of the spilled result logged at `seq` (docs/design.md §13: named from the event seq). */
export const spillName = (seq: number): string => `tool-result-${seq}.txt`

/** The heuristic price of an envelope alone (docs/design.md §2): a request with no messages. */
export const estimateEnvelopeTokens = (envelope: Envelope): number => estimateRequestTokens(envelope, [])

/** Logs `request/header` when it differs from the last one (what the Agent does before each request). */
export function logHeader(session: Session, header: RequestHeader): boolean {
  const text = JSON.stringify(header) // drops undefined fields, so equal headers compare equal
  const last = session.measure().header
  if (last && JSON.stringify(last) === text) return false
  session.append('request/header', JSON.parse(text) as RequestHeader)
  return true
}

/**
 * Clears the tool result at surface node `seq` as the ladder's clear rung logs it (docs/design.md §10):
 * `compaction/clear {shadowedSeqs, shadowedTokenCount}`, then the result with one text block as a replace.
 */
export function clearNode(session: Session, seq: number, placeholder: string, trigger?: string): number {
  const node = session.surface().node(seq)
  if (!node || node.message.role !== 'tool') throw new Error(`seq ${seq} is not a tool result on the surface`)
  const clear = { shadowedSeqs: [seq], shadowedTokenCount: node.tokens }
  session.append('compaction/clear', trigger ? { ...clear, trigger } : clear)
  const message = { ...node.message, content: [{ type: 'text' as const, text: placeholder }] }
  const after = session.append('tool/result', { message, surfaceOp: { op: 'replace', start: seq, end: seq } })
  return node.tokens - session.surface().node(after.seq)!.tokens
}
