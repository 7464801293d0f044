// Benchmark 6: every transcript of the corpus replayed at windows of 16,000, 32,000 and 64,000
// tokens under four policies — dsh v2 (the ladder's defaults: prune → clear → compact),
// dsh v1 (prune + summarise: `compaction: {clear: false}`), no
// management, and observation masking (tool outputs of the newest 10 steps kept, older ones replaced
// by a one-line placeholder). Per policy: summary calls, share of pressure events relieved without a
// model call, tokens reclaimed without a model call, peak occupancy, and requests over the window. For dsh v2 also, per
// transcript: what its checkpoints kept (user messages, commands, error lines), requests over the window by dsh's
// estimate and in the transcript's own tokens (the replay's calibration: offset + ratio × estimate), the fit, rereads.
import { readFileSync } from 'node:fs'
import { basename } from 'node:path'
import * as dshModule from '../dsh.ts'
import {
  estimateMessageTokens, readTranscript, type Message, type Session, type ToolResultMessage, type Transcript,
} from '../dsh.ts'
import {
  estimateEnvelopeTokens,
} from '../test/spec.ts'
import { trueCounter, type TrueCounter } from './tokens.ts'
import { execFileSync } from 'node:child_process'
import { CORPUS_DIR, corpusFiles, fmtPct, int, nowMs, table, type Section, type Target } from './lib.ts'

const WINDOWS = [16_000, 32_000, 64_000]
/** The ladder's pressure threshold as a share of the window (DEFAULT_COMPACTION_CONFIG.thresholdRatio). */
const THRESHOLD_RATIO = 0.8
/** Observation masking keeps the tool outputs of this many newest steps (issue 7). */
const MASK_KEEP_STEPS = 10
const MASK_PLACEHOLDER = '[older tool output omitted to save context]'

/** The documented replay API (docs/design.md §8, issue 5), the part this benchmark reads. */
interface ReplayTotalsLike {
  steps: number; peakRequestTokens: number; prunedTokens: number; summaryCalls: number; requestsOverWindow: number
  calibratedRequestsOverWindow?: number; peakCalibratedRequestTokens?: number; calibration?: { ratio: number; offsetTokens: number; samples: number }
  figures?: Record<string, number>
  unmanagedStepsOverWindow: number; peakUnmanagedTokens: number; compactions: number; failedCompactions: number; spills: number
  rungReclaimedTokens?: Record<string, number>
  peakSummaryRequestTokens?: number; cost?: { dsh: { inputTokens: number } }
}
interface ReplayReportLike { totals: ReplayTotalsLike; rows: { beforeTokens: number; afterTokens: number; summaryCalls: number; events: { type: string; tokensBefore?: number; tokensAfter?: number }[] }[] }
type ReplayTranscript = (t: Transcript, options: { contextWindow: number; compaction?: Record<string, unknown>; figures?: readonly unknown[]; onStep?: (row: { kind: string; step: number }, session: Session) => void }) => Promise<ReplayReportLike>

/** One policy's figures on one transcript at one window (tokens by the §2 estimate). */
interface Outcome {
  requests: number; summaryCalls: number; reclaimed: number;
  /** Pressure checks that found the total at or over the threshold, and those that ended under it with no summary call. */
  pressure: number; relieved: number;
  /** Ladders only: the largest summary request, and every request's input tokens summed (summaries included). */
  summaryPeak: number; inputTokens: number; spilled: number; peak: number; over: number; compactions: number; failed: number
  /** The same requests counted by the DeepSeek V3 tokenizer (bench/tokens.ts): largest, and how many exceed the window. */
  truePeak: number; trueOver: number
  /** Ladders: requests over the window in the transcript's own tokens (the replay's calibration), and the largest. */
  calOver: number; calPeak: number
  /** Ladders: facts of the compacted regions (summed over compactions) and how many the checkpoints kept; rereads. */
  users: number; usersKept: number; usersPruned: number; commands: number; commandsKept: number; errors: number; errorsKept: number; rereads: number
}

const empty = (): Outcome => ({
  requests: 0, summaryCalls: 0, reclaimed: 0, pressure: 0, relieved: 0, summaryPeak: 0, inputTokens: 0, spilled: 0, peak: 0, over: 0, compactions: 0,
  failed: 0, truePeak: 0, trueOver: 0, calOver: 0, calPeak: 0, users: 0, usersKept: 0, usersPruned: 0, commands: 0, commandsKept: 0, errors: 0, errorsKept: 0, rereads: 0,
})
/** Outcome fields that add up over a file's transcripts (the rest are peaks). */
const SUMMED = ['requests', 'summaryCalls', 'pressure', 'relieved', 'inputTokens', 'reclaimed', 'spilled', 'over', 'compactions', 'failed', 'trueOver',
  'calOver', 'users', 'usersKept', 'usersPruned', 'commands', 'commandsKept', 'errors', 'errorsKept', 'rereads'] as const

function request(out: Outcome, window: number, tokens: number, trueTokens: number): void {
  out.requests++
  out.peak = Math.max(out.peak, tokens)
  if (tokens > window) out.over++
  out.truePeak = Math.max(out.truePeak, trueTokens)
  if (trueTokens > window) out.trueOver++
}

/**
 * No management: each step's request is the envelope plus every message before the step's
 * assistant message, as recorded.
 */
function unmanaged(t: Transcript, window: number, truth: TrueCounter): Outcome {
  let total = estimateEnvelopeTokens(t.envelope)
  let trueTotal = truth.envelope(t.envelope)
  const out = empty()
  for (const m of t.messages) {
    if (m.role === 'assistant') request(out, window, total, trueTotal)
    total += estimateMessageTokens(m)
    trueTotal += truth.framed(m)
  }
  return out
}

/**
 * Observation masking: before each step's request, the tool results of steps older than the newest
 * `MASK_KEEP_STEPS` are replaced by a one-line placeholder (only where that is smaller). Nothing
 * else changes; no model is called. `reclaimed` counts each masked result once.
 */
function masking(t: Transcript, window: number, truth: TrueCounter): Outcome {
  let total = estimateEnvelopeTokens(t.envelope)
  let trueTotal = truth.envelope(t.envelope)
  const out = empty()
  const steps: ToolResultMessage[][] = []
  for (const m of t.messages) {
    if (m.role === 'assistant') {
      const old = steps.length - MASK_KEEP_STEPS - 1 // the step that just left the newest MASK_KEEP_STEPS
      if (old >= 0) {
        for (const r of steps[old]) {
          const placeholder: Message = { ...r, content: [{ type: 'text', text: MASK_PLACEHOLDER }] }
          const saved = estimateMessageTokens(r) - estimateMessageTokens(placeholder)
          if (saved > 0) { total -= saved; out.reclaimed += saved; trueTotal += truth.framed(placeholder) - truth.framed(r) }
        }
      }
      request(out, window, total, trueTotal)
      steps.push([])
    } else if (m.role === 'tool' && steps.length > 0) steps[steps.length - 1].push(m)
    total += estimateMessageTokens(m)
    trueTotal += truth.framed(m)
  }
  return out
}

/**
 * dsh's ladder through `replayTranscript`. The true count of each request is taken from the session
 * after each pressure check (`onStep`): that surface is what the next request carries.
 */
async function ladder(replay: ReplayTranscript, t: Transcript, window: number, truth: TrueCounter, compaction: Record<string, unknown>): Promise<Outcome & { fit?: ReplayTotalsLike['calibration'] }> {
  let truePeak = 0, trueOver = 0
  const steps = t.messages.filter((m) => m.role === 'assistant').length
  const report = await replay(t, {
    contextWindow: window,
    compaction,
    figures: (dshModule as unknown as { FIDELITY_FIGURES?: readonly unknown[] }).FIDELITY_FIGURES ?? [],
    onStep(row, session) {
      // A row after the last step has no request after it.
      if (row.kind === 'step' && row.step >= steps) return
      let n = truth.envelope(t.envelope)
      for (const node of session.surface()) n += truth.framed(node.message)
      truePeak = Math.max(truePeak, n)
      if (n > window) trueOver++
    },
  })
  const x = report.totals
  let spilled = 0
  for (const row of report.rows) for (const e of row.events) if (e.type === 'spill') spilled += (e.tokensBefore ?? 0) - (e.tokensAfter ?? 0)
  // A pressure event: a check (turn start or after a step) that found the total at or over the
  // threshold; relieved without a model call when it ended under the threshold with no summary call.
  const threshold = Math.floor(window * THRESHOLD_RATIO)
  let pressure = 0, relieved = 0
  for (const row of report.rows) {
    if (row.beforeTokens < threshold) continue
    pressure++
    if (row.summaryCalls === 0 && row.afterTokens < threshold) relieved++
  }
  const f = (name: string) => x.figures?.[name] ?? 0
  return {
    requests: x.steps, summaryCalls: x.summaryCalls, pressure, relieved,
    summaryPeak: x.peakSummaryRequestTokens ?? 0, inputTokens: x.cost?.dsh.inputTokens ?? 0,
    reclaimed: (x.rungReclaimedTokens?.prune ?? x.prunedTokens) + (x.rungReclaimedTokens?.clear ?? 0), spilled, peak: x.peakRequestTokens, over: x.requestsOverWindow,
    compactions: x.compactions, failed: x.failedCompactions, truePeak, trueOver,
    calOver: x.calibratedRequestsOverWindow ?? x.requestsOverWindow, calPeak: x.peakCalibratedRequestTokens ?? x.peakRequestTokens,
    users: f('fidelity user messages total'), usersKept: f('fidelity user messages in checkpoint'), usersPruned: f('fidelity user messages pruned'),
    commands: f('fidelity commands total'), commandsKept: f('fidelity commands in checkpoint'),
    errors: f('fidelity error lines total'), errorsKept: f('fidelity error lines in checkpoint'), rereads: f('rereads'), fit: x.calibration,
  }
}

/** The ladder policies, by the `compaction` settings replay takes. */
const LADDERS = [
  ['dsh v2 (defaults)', {}],
  ['dsh v1 (prune + summarise)', { clear: false }],
] as const
const V2 = LADDERS[0][0], V1 = LADDERS[1][0]
const UNMANAGED = 'no management', MASKING = `observation masking (newest ${MASK_KEEP_STEPS} steps)`
const POLICIES = [...LADDERS.map((l) => l[0]), UNMANAGED, MASKING] as const
const isLadder = (p: string) => LADDERS.some((l) => l[0] === p)

/** The commit this run measures (and whether dsh.ts differs from it), for the section's text. */
function measuredAt(): string {
  const git = (args: string[]) => { try { return execFileSync('git', args, { encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] }).trim() } catch { return '?' } }
  return `${git(['rev-parse', '--short', 'HEAD'])}${git(['status', '--porcelain', '--', 'dsh.ts']) ? ' (dsh.ts modified)' : ''}`
}

export default async function ladderBench(): Promise<Section> {
  const replay = (dshModule as unknown as { replayTranscript?: ReplayTranscript }).replayTranscript
  const base = { id: 'ladder', title: 'The ladder on real sessions', method: '', tables: [] as string[] }
  if (typeof replay !== 'function') {
    return { ...base, status: 'not-run', reason: '`replayTranscript` (dsh.ts section 10) has not landed on this branch yet; bench/ladder.bench.ts is written against its documented API and runs once it does', targets: [] }
  }
  const files = corpusFiles()
  if (files.length === 0) return { ...base, status: 'not-run', reason: `no transcripts in ${CORPUS_DIR} (set DSH_CORPUS)`, targets: [] }

  // Each file's transcripts: the main chain, and Claude Code's Task-subagent runs (each had its own window).
  const groups: { file: string; transcripts: Transcript[] }[] = files.map((f) => {
    const t = readTranscript(readFileSync(f, 'utf8'), { sidechains: true })
    return { file: basename(f), transcripts: [t, ...(t.sidechains ?? [])] }
  })
  const truth = trueCounter()
  const t0 = nowMs()
  // results[window][policy][file] = Outcome summed over the file's transcripts (peak = max).
  const results = new Map<number, Map<string, Map<string, Outcome>>>()
  /** dsh v2 per transcript (main chain, sidechain k), per window: for the fidelity and calibration table. */
  const perTranscript: { name: string; window: number; x: Outcome & { fit?: ReplayTotalsLike['calibration'] } }[] = []
  for (const w of WINDOWS) {
    const byPolicy = new Map<string, Map<string, Outcome>>()
    for (const p of POLICIES) byPolicy.set(p, new Map())
    for (const g of groups) {
      const sum = (xs: Outcome[]): Outcome => {
        const out = empty()
        for (const x of xs) {
          for (const k of SUMMED) out[k] += x[k]
          out.calPeak = Math.max(out.calPeak, x.calPeak)
          out.peak = Math.max(out.peak, x.peak)
          out.summaryPeak = Math.max(out.summaryPeak, x.summaryPeak)
          out.truePeak = Math.max(out.truePeak, x.truePeak)
        }
        return out
      }
      for (const [name, compaction] of LADDERS) {
        const ls: Outcome[] = []
        for (const [k, t] of g.transcripts.entries()) {
          const x = await ladder(replay, t, w, truth, compaction)
          ls.push(x)
          if (name === V2) perTranscript.push({ name: k === 0 ? g.file : `↳ ${g.file.slice(0, 8)}… subagent run ${k}`, window: w, x })
        }
        byPolicy.get(name)!.set(g.file, sum(ls))
      }
      byPolicy.get(UNMANAGED)!.set(g.file, sum(g.transcripts.map((t) => unmanaged(t, w, truth))))
      byPolicy.get(MASKING)!.set(g.file, sum(g.transcripts.map((t) => masking(t, w, truth))))
    }
    results.set(w, byPolicy)
  }
  const replayMs = nowMs() - t0

  const summaryRows: string[][] = []
  const targets: Target[] = []
  const agg = (w: number, p: string) => {
    const xs = [...results.get(w)!.get(p)!.values()]
    const total = (k: keyof Outcome) => xs.reduce((a, x) => a + x[k], 0)
    return { total, peak: Math.max(...xs.map((x) => x.peak)), truePeak: Math.max(...xs.map((x) => x.truePeak)) }
  }
  const share = (relieved: number, pressure: number) => (pressure === 0 ? '— (no pressure)' : `${fmtPct(relieved / pressure, 0)} (${relieved} of ${pressure})`)
  for (const w of WINDOWS) {
    for (const p of POLICIES) {
      const { total, peak, truePeak } = agg(w, p)
      summaryRows.push([
        int(w), p, isLadder(p) ? int(total('summaryCalls')) : '0', isLadder(p) ? share(total('relieved'), total('pressure')) : '—',
        int(total('reclaimed')), isLadder(p) ? int(total('spilled')) : '—',
        `${int(peak)} (${fmtPct(peak / w, 0)})`, `${int(total('over'))} of ${int(total('requests'))}`,
        `${int(truePeak)} (${fmtPct(truePeak / w, 0)})`, `${int(total('trueOver'))}`,
      ])
    }
  }
  for (const w of WINDOWS) {
    const { total, peak, truePeak } = agg(w, V2)
    targets.push({ name: `dsh v2 at ${int(w)}: requests over the window`, target: '0', measured: `${int(total('over'))} of ${int(total('requests'))} by dsh's estimate (peak ${fmtPct(peak / w, 0)}); ${int(total('trueOver'))} in DeepSeek V3 tokens (peak ${fmtPct(truePeak / w, 0)})`, met: total('over') === 0 })
  }
  for (const w of WINDOWS) {
    const { total } = agg(w, V2)
    const calPeak = Math.max(...[...results.get(w)!.get(V2)!.values()].map((x) => x.calPeak))
    const over = perTranscript.filter((r) => r.window === w && r.x.calOver > 0).map((r) => `${r.name} ${r.x.calOver}/${r.x.requests}`)
    targets.push({
      name: `dsh v2 at ${int(w)}: requests over the window in the transcripts' own tokens (calibrated)`, target: '0',
      measured: `${int(total('calOver'))} of ${int(total('requests'))} (peak ${fmtPct(calPeak / w, 0)})${over.length ? `: ${over.join(', ')}` : ''}`, met: total('calOver') === 0,
    })
    const kept = (k: 'users' | 'commands' | 'errors') => `${int(total(`${k}Kept`))}/${int(total(k))}`
    targets.push({
      name: `dsh v2 at ${int(w)}: facts of the compacted regions kept in checkpoints`, target: 'every user message; commands, error lines: report',
      measured: `user messages ${kept('users')} (${int(total('usersPruned'))} cut to head + tail with their recall key), commands ${kept('commands')}, error lines ${kept('errors')}; rereads ${int(total('rereads'))}`,
      met: total('usersKept') === total('users'),
    })
  }
  {
    const { total } = agg(32_000, V2)
    const pressure = total('pressure'), relieved = total('relieved')
    targets.push({ name: 'dsh v2 at 32,000: pressure events relieved without a model call', target: '≥ 80%', measured: share(relieved, pressure), met: pressure === 0 ? undefined : relieved / pressure >= 0.8 })
  }
  for (const w of WINDOWS) {
    const v2 = agg(w, V2).total('summaryCalls'), v1 = agg(w, V1).total('summaryCalls')
    targets.push({ name: `dsh v2 vs v1 at ${int(w)}: summary calls`, target: 'at least halved (v2 ≤ v1 / 2)', measured: `${v2} vs ${v1}`, met: 2 * v2 <= v1 })
  }
  const detailRows: string[][] = []
  for (const g of groups) {
    for (const w of WINDOWS) {
      const cell = (p: string) => {
        const x = results.get(w)!.get(p)!.get(g.file)!
        const parts = [`peak ${int(x.peak)} (true ${int(x.truePeak)})`, `over ${x.over}/${x.requests}${x.trueOver ? ` (true ${x.trueOver})` : ''}`]
        if (x.summaryCalls) parts.push(`${x.summaryCalls} summary call${x.summaryCalls > 1 ? 's' : ''} (${x.compactions} compaction${x.compactions === 1 ? '' : 's'}${x.failed ? `, ${x.failed} failed` : ''})`)
        if (x.pressure) parts.push(`relieved ${x.relieved}/${x.pressure}`)
        if (x.reclaimed) parts.push(`${isLadder(p) ? 'pruned/cleared' : 'masked'} ${int(x.reclaimed)}`)
        if (x.spilled) parts.push(`spilled ${int(x.spilled)}`)
        return parts.join(', ')
      }
      detailRows.push([`${g.file}${g.transcripts.length > 1 ? ` (main + ${g.transcripts.length - 1} subagent runs)` : ''}`, int(w), ...POLICIES.map(cell)])
    }
  }
  const pct = (a: number, b: number) => (b === 0 ? '—' : `${int(a)}/${int(b)} (${fmtPct(a / b, 0)})`)
  const fidelityRows = perTranscript.map(({ name, window, x }) => [
    name, int(window), `${pct(x.usersKept, x.users)}${x.usersPruned ? `, ${x.usersPruned} cut` : ''}`, pct(x.commandsKept, x.commands), pct(x.errorsKept, x.errors),
    `${x.over} / ${x.calOver} of ${x.requests}`, `${int(x.peak)} / ${int(x.calPeak)}`, String(x.rereads),
    x.fit && x.fit.samples > 0 ? `${int(x.fit.offsetTokens)} + ${x.fit.ratio.toFixed(3)} × (${x.fit.samples} steps)` : '— (no counts)',
  ])
  return {
    ...base, status: 'ran', targets,
    method: [
      `Measured on dsh.ts at ${measuredAt()}. Every transcript of the corpus (${files.length} files read with \`readTranscript\`; Claude`,
      'Code\'s Task-subagent runs replayed as',
      'transcripts of their own, each with its own window, and summed into their file\'s row). Peaks and requests over the',
      'window are tokens by the §2 estimate, per step request (one per assistant message). **dsh v2** = `replayTranscript(t,',
      '{contextWindow})`: the Agent\'s event order, spill at write time, `ladder.relievePressure` (prune → clear → compact) at each',
      'turn start and after each step, summaries simulated at a fixed 2,000 tokens (replay\'s default; no model is called).',
      '**dsh v1** = `compaction: {clear: false}` (prune + summarise). A *pressure event* is a',
      `check that finds the total at or over the threshold (floor(window × ${THRESHOLD_RATIO})); *relieved without a model call* = it ends`,
      'under the threshold with no summary call. **No management**',
      '= every message as recorded. **Observation masking** = before each request, the tool results of steps older than the',
      `newest ${MASK_KEEP_STEPS} are replaced by the one-line "${MASK_PLACEHOLDER}" (where that is smaller); nothing else.`,
      '"Reclaimed" = tokens taken off the surface by a rung that calls no model (dsh: prunes and clears; masking: each masked result once);',
      'dsh\'s write-time spills of results over 256 KiB are listed apart (they happen at every window, and the one in this',
      'corpus is the final `git diff` of psf__requests-1142, which no later request carries).',
      'Peak = the largest step request (share of the window). The last two columns count the same requests with the DeepSeek V3',
      'tokenizer and chat-template framing (bench/tokens.ts, as in benchmark 5): another tokenizer than the transcripts\' own,',
      'so this is where the §2 estimate\'s own error shows. For the ladder the true figure is taken from the surface after each',
      'pressure check (what the next request carries); a simulated checkpoint counts at its true size (its filler text is',
      `not exactly 2,000 real tokens). Replays and counting took ${(replayMs / 1000).toFixed(1)} s (tokenizer load ${(truth.loadMs / 1000).toFixed(1)} s).`,
      '',
      'The ladder decides in the transcript\'s own tokens where the file records prompt tokens (docs/design.md §15): each step\'s',
      'recorded count is a calibration sample of the unmanaged request, fitted as offset + ratio × dsh\'s estimate by least',
      'squares over the steps so far, so pressure events and peaks are counted in those units; "requests over the window"',
      'above is by dsh\'s estimate. The third table is dsh v2 (defaults) per transcript: the facts of the compacted regions',
      '(summed over compactions: a later checkpoint counts again what it merged) and how many the checkpoints kept (a user',
      'message cut to head + tail with its recall key counts, and is counted as cut), requests over the window by dsh\'s',
      'estimate / calibrated, the peak request both ways, rereads (calls after a compaction that repeat one it replaced and',
      'get the same output back) and the final fit of the transcript\'s counts.',
    ].join('\n'),
    tables: [
      table(['window', 'policy', 'summary calls', 'pressure events relieved without a model call', 'reclaimed without a model call', 'spilled at write time', 'peak occupancy', 'requests over the window', 'true peak (DeepSeek V3)', 'truly over the window'], summaryRows),
      table(['transcript', 'window', ...POLICIES], detailRows),
      table(['transcript', 'window', 'user messages kept', 'commands kept', 'error lines kept', 'over the window (estimate / calibrated)', 'peak request (estimate / calibrated)', 'rereads', 'fit: offset + ratio × estimate'], fidelityRows),
    ],
  }
}
