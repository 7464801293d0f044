// Benchmark "cost" (docs/design.md §11): what each context policy costs on the corpus, at windows
// of 16,000, 32,000 and 64,000 tokens, priced as deepseek-flash off-peak. One modelled cost for every
// policy: each policy's requests are fed into a Session, whose prompt-cache model (the modelled
// hit: leading messages identical to the previous request, envelope first; a summary request
// compared with the conversation request before it) and `usage({prices})` price them.
//
// Policies: the floor (no management, infinite window: appends only), observation masking (tool
// outputs of the newest 10 steps kept), dsh v1 (prune + summarise, clear off), dsh v2 (with the
// clear rung) and dsh v3 (v2 with the net-cost gate, the default), the last three through
// `replayTranscript` with simulated 2,000-token summaries (or max_tokens if smaller); the gate decides in replay as live, from
// the session so far (its pace, its cache) at the replay's prices.
// Then the measurements that chose the cost-related defaults (docs/bench.md "Cost").
import { readFileSync } from 'node:fs'
import { basename } from 'node:path'
import {
  DEFAULT_COMPACTION_CONFIG, DEEPSEEK_PRICES, internals, readTranscript, replayTranscript, unmanagedSession, estimateMessageTokens, type Session,
  type CompactionConfig, type Prices, type SessionUsage, type ToolResultMessage, type Transcript, CostLedger
} from '../dsh.ts'
import { CORPUS_DIR, corpusFiles, fmtPct, int, nowMs, table, type Section, type Target } from './lib.ts'

const WINDOWS = [16_000, 32_000, 64_000]
/** deepseek-flash, off-peak (DEEPSEEK_PRICES without its peak hours). */
const PRICES: Prices = { ...DEEPSEEK_PRICES['deepseek-flash'], peak: undefined }
/** Observation masking keeps the tool outputs of this many newest steps. */
const MASK_KEEP_STEPS = 10
const MASK_PLACEHOLDER = '[older tool output omitted to save context]'
/** Targets (issue "cost"): dsh at most this multiple of the floor. */
const FLOOR_TARGET = 1.5
/** Targets of the net-cost gate (issue "edits that pay for themselves"): dsh v3 at most this multiple of the floor. */
const GATE_FLOOR_TARGETS: Record<number, number> = { 16_000: 1.25, 32_000: 1.08 }

/** One policy on one transcript: the session's usage priced, and requests over the window. */
interface Run { usage: SessionUsage; requests: number; over: number; calibratedOver?: number; firstOver?: number; summaryHitTokens: number; summaryInputTokens: number }

/** A policy without a ladder: the transcript through `unmanagedSession`, `edit` before each request. */
function feed(t: Transcript, window: number, edit?: (session: Session, step: number) => void): Run {
  let over = 0, requests = 0
  const s = unmanagedSession(t, (session, step) => {
    edit?.(session, step)
    requests++
    if (session.measure().totalTokens > window) over++
  })
  return { usage: CostLedger.of(s).usage({ prices: PRICES }), requests, over, summaryHitTokens: 0, summaryInputTokens: 0 }
}

/** Observation masking: before each request, the results of the step that left the newest 10 become a placeholder. */
function masking(t: Transcript, window: number): Run {
  const resultsOfStep: number[][] = [] // surface seqs of each step's tool results
  return feed(t, window, (s, step) => {
    // Results appended since the last request belong to the previous step.
    if (step > 0) {
      const seqs: number[] = []
      const nodes = s.surface()
      for (let i = nodes.length - 1; i >= 0 && nodes[i].message.role !== 'assistant'; i--) if (nodes[i].message.role === 'tool') seqs.unshift(nodes[i].seq)
      resultsOfStep.push(seqs)
    }
    const old = step - MASK_KEEP_STEPS - 1
    if (old < 0) return
    for (const seq of resultsOfStep[old] ?? []) {
      const node = s.surface().node(seq)
      if (!node) continue
      const placeholder: ToolResultMessage = { ...(node.message as ToolResultMessage), content: [{ type: 'text', text: MASK_PLACEHOLDER }] }
      if (estimateMessageTokens(placeholder) >= node.tokens) continue
      s.append('tool/result', { message: placeholder, surfaceOp: { op: 'replace', start: seq, end: seq } })
    }
  })
}

/** The ladder's constants (the runtime's test seam, test/tuning.ts): the net-cost gate is one. */
const ladderSeam = (internals as { tuning?: { ladder?: { gate?: boolean } } }).tuning?.ladder
const HAS_GATE = ladderSeam?.gate !== undefined

/**
 * dsh's ladder through `replayTranscript` with `compaction` settings, the net-cost gate on or off; the replay's
 * session is priced.
 */
async function dsh(t: Transcript, window: number, compaction: Partial<CompactionConfig>, gate = true): Promise<Run> {
  let session: Session | undefined
  const saved = ladderSeam?.gate
  if (HAS_GATE) ladderSeam!.gate = gate
  const report = await replayTranscript(t, { contextWindow: window, compaction, onStep: (_row, s) => { session = s } })
    .finally(() => { if (HAS_GATE) ladderSeam!.gate = saved })
  const s = session!
  let summaryHitTokens = 0, summaryInputTokens = 0
  for (const e of s.events) {
    if (e.type !== 'compaction/end') continue
    for (const r of (e.data as { requests?: { modelledHitTokens: number; inputTokens: number }[] }).requests ?? []) { summaryHitTokens += r.modelledHitTokens; summaryInputTokens += r.inputTokens }
  }
  // A first request the file records over the window holds only the envelope and the task: no edit can fit it.
  const firstOver = report.rows.filter((r) => r.kind === 'step' && r.step === 1 && (r.recordedPromptTokens ?? 0) > window).length
  return { usage: CostLedger.of(s).usage({ prices: PRICES }), requests: report.totals.steps, over: report.totals.requestsOverWindow, calibratedOver: report.totals.calibratedRequestsOverWindow, firstOver, summaryHitTokens, summaryInputTokens }
}

/** Whether the ladder on this branch knows every key of `config` (the clear rung may not have landed). */
const supported = (config: Partial<CompactionConfig>) => Object.keys(config).every((k) => k in DEFAULT_COMPACTION_CONFIG)

/** v1 and v2 run without the gate (dsh's 4th argument false), v3 with it. */
const V1: Partial<CompactionConfig> = supported({ clear: false } as Partial<CompactionConfig>) ? ({ clear: false } as Partial<CompactionConfig>) : {}
const V2: Partial<CompactionConfig> = {}
const V3: Partial<CompactionConfig> = {}
const HAS_CLEAR = supported({ clear: true } as Partial<CompactionConfig>)

/** Sum of runs (a file's main chain and its subagent runs). */
function sum(runs: Run[]): { cost: number; input: number; cached: number; requests: number; over: number; calibratedOver: number; firstOver: number; summaryRequests: number; summaryHit: number; summaryInput: number } {
  const out = { cost: 0, input: 0, cached: 0, requests: 0, over: 0, calibratedOver: 0, firstOver: 0, summaryRequests: 0, summaryHit: 0, summaryInput: 0 }
  for (const r of runs) {
    out.cost += r.usage.costUSD ?? NaN
    out.input += r.usage.inputTokens
    out.cached += r.usage.cachedInputTokens
    out.requests += r.requests
    out.over += r.over
    out.calibratedOver += r.calibratedOver ?? 0
    out.firstOver += r.firstOver ?? 0
    out.summaryRequests += r.usage.summary.requests
    out.summaryHit += r.summaryHitTokens
    out.summaryInput += r.summaryInputTokens
  }
  return out
}
type Sum = ReturnType<typeof sum>
const total = (xs: Sum[]): Sum => {
  const out = { cost: 0, input: 0, cached: 0, requests: 0, over: 0, calibratedOver: 0, firstOver: 0, summaryRequests: 0, summaryHit: 0, summaryInput: 0 }
  for (const x of xs) for (const k of Object.keys(out) as (keyof Sum)[]) out[k] += x[k]
  return out
}

/**
 * The measurements that chose the cost-related defaults (docs/bench.md "Cost"): each row is dsh v2
 * with one setting changed. Rows whose keys this branch's ladder does not know are "not run".
 */
const EXPERIMENTS: { question: string; label: string; config: Record<string, unknown> }[] = [
  ...[0.4, 0.5, 0.6, 0.7, 0.75].map((r) => ({ question: 'relief target (reliefRatio): clear down to floor(window × r) in one batch', label: `reliefRatio ${r}${r === 0.75 ? ' (≈ clear only what pressure needs: small batches)' : ''}`, config: { reliefRatio: r } })),
  { question: 'clear before the summary when clearing alone cannot relieve', label: 'clearBeforeSummary true', config: { clearBeforeSummary: true } },
  { question: 'clear before the summary when clearing alone cannot relieve', label: 'clearBeforeSummary false', config: { clearBeforeSummary: false } },
  { question: 'the clear rung at all', label: 'clear false (= dsh v1)', config: { clear: false } },
]

const usd = (x: number) => (Number.isFinite(x) ? `$${x.toFixed(x >= 1 ? 3 : 4)}` : '—')

export default async function costBench(): Promise<Section> {
  const base = { id: 'cost', title: 'Cost and the prompt cache', method: '', tables: [] as string[] }
  const files = corpusFiles()
  if (files.length === 0) return { ...base, status: 'not-run', reason: `no transcripts in ${CORPUS_DIR} (set DSH_CORPUS)`, targets: [] }
  const groups = files.map((f) => {
    const t = readTranscript(readFileSync(f, 'utf8'), { sidechains: true })
    return { file: basename(f), transcripts: [t, ...(t.sidechains ?? [])] }
  })
  const t0 = nowMs()
  const policies: { name: string; run: (t: Transcript, w: number) => Run | Promise<Run>; ran: boolean }[] = [
    { name: 'floor (no management, infinite window)', run: (t, w) => feed(t, w), ran: true },
    { name: `observation masking (newest ${MASK_KEEP_STEPS} steps)`, run: masking, ran: true },
    { name: 'dsh v1 (prune + summarise, clear off)', run: (t, w) => dsh(t, w, V1, false), ran: true },
    { name: 'dsh v2 (prune + clear + summarise)', run: (t, w) => dsh(t, w, V2, false), ran: HAS_CLEAR },
    { name: 'dsh v3 (v2 + the net-cost gate, the default)', run: (t, w) => dsh(t, w, V3), ran: HAS_GATE },
  ]
  // results[w][policy][file]
  const results = new Map<number, Sum[][]>()
  for (const w of WINDOWS) {
    const byPolicy: Sum[][] = []
    for (const p of policies) {
      const row: Sum[] = []
      for (const g of groups) {
        const runs: Run[] = []
        if (p.ran) for (const t of g.transcripts) runs.push(await p.run(t, w))
        row.push(sum(runs))
      }
      byPolicy.push(row)
    }
    results.set(w, byPolicy)
  }
  // Experiments: the corpus total of dsh with one setting changed, per window.
  const experimentRows: string[][] = []
  for (const x of EXPERIMENTS) {
    const ok = supported(x.config as Partial<CompactionConfig>)
    const cells: string[] = []
    for (const w of WINDOWS) {
      if (!ok) { cells.push('not run (the ladder on this branch has no such setting)'); continue }
      const runs: Run[] = []
      for (const g of groups) for (const t of g.transcripts) runs.push(await dsh(t, w, x.config as Partial<CompactionConfig>, false))
      const y = sum(runs), f = total(results.get(w)![0])
      cells.push(`${usd(y.cost)} (${(y.cost / f.cost).toFixed(3)}×), hits ${fmtPct(y.cached / y.input)}, ${y.over} over, ${y.summaryRequests} summaries`)
    }
    experimentRows.push([x.question, x.label, ...cells])
  }
  // Summary requests that reuse the conversation's cached prefix: what the modelled hits saved.
  const reuseRows: string[][] = WINDOWS.map((w) => {
    const v = policies[4].ran ? 4 : policies[3].ran ? 3 : 2
    const x = total(results.get(w)![v])
    const saved = (x.summaryHit * (PRICES.cacheMissInput - PRICES.cacheHitInput)) / 1e6
    return [int(w), policies[v].name, String(x.summaryRequests), `${int(x.summaryHit)} of ${int(x.summaryInput)} (${fmtPct(x.summaryHit / x.summaryInput, 0)})`, usd(saved), fmtPct(saved / (x.cost + saved))]
  })
  const ms = nowMs() - t0

  const summaryRows: string[][] = []
  const detailRows: string[][] = []
  const targets: Target[] = []
  for (const w of WINDOWS) {
    const byPolicy = results.get(w)!
    const floorTotal = total(byPolicy[0])
    policies.forEach((p, i) => {
      if (!p.ran) { summaryRows.push([int(w), p.name, 'not yet run: the clear rung has not landed on this branch', '', '', '', '']); return }
      const x = total(byPolicy[i])
      summaryRows.push([int(w), p.name, usd(x.cost), `${(x.cost / floorTotal.cost).toFixed(3)}×`, fmtPct(x.cached / x.input), i === 0 ? '— (no window)' : `${int(x.over)} of ${int(x.requests)}${i >= 2 ? `; calibrated ${int(x.calibratedOver)}` : ''}`, x.summaryRequests ? `${x.summaryRequests} (${fmtPct(x.summaryHit / x.summaryInput, 0)} of their input cached)` : '—'])
    })
    groups.forEach((g, k) => {
      detailRows.push([g.file, int(w), ...policies.map((p, i) => {
        if (!p.ran) return 'not run'
        const x = byPolicy[i][k]
        const f = byPolicy[0][k]
        return `${usd(x.cost)}${i ? ` (${(x.cost / f.cost).toFixed(2)}×)` : ''}, hits ${fmtPct(x.cached / x.input, 0)}${i && x.over ? `, ${x.over} over` : ''}`
      })])
    })
    const v = policies[4].ran ? 4 : policies[3].ran ? 3 : 2
    const dshTotal = total(byPolicy[v]), maskTotal = total(byPolicy[1])
    const label = policies[v].name.split(' (')[0]
    const ratio = dshTotal.cost / floorTotal.cost
    targets.push({ name: `${label} at ${int(w)}: cost vs the floor`, target: `≤ ${FLOOR_TARGET}× the infinite-window floor`, measured: `${ratio.toFixed(2)}× (${usd(dshTotal.cost)} vs ${usd(floorTotal.cost)})${v === 2 ? '; v2 not run (clear rung not landed), v1 shown' : ''}`, met: ratio <= FLOOR_TARGET })
    targets.push({ name: `${label} at ${int(w)}: cost vs masking`, target: 'below observation masking', measured: `${usd(dshTotal.cost)} vs ${usd(maskTotal.cost)} (${(dshTotal.cost / maskTotal.cost).toFixed(2)}×)`, met: dshTotal.cost < maskTotal.cost })
    targets.push({ name: `${label} at ${int(w)}: requests over the window`, target: '0', measured: `${int(dshTotal.over)} of ${int(dshTotal.requests)}`, met: dshTotal.over === 0 })
    if (v !== 4) continue
    // The net-cost gate's targets: v3 against v1, v2 and the floor; summary calls; over the window in both counts.
    const v1 = total(byPolicy[2]), v2 = total(byPolicy[3])
    targets.push({ name: `${label} at ${int(w)}: cost vs dsh v1 and v2`, target: '≤ both', measured: `${usd(dshTotal.cost)} vs ${usd(v1.cost)} (v1), ${usd(v2.cost)} (v2)`, met: dshTotal.cost <= v1.cost && dshTotal.cost <= v2.cost })
    if (GATE_FLOOR_TARGETS[w] !== undefined) targets.push({ name: `${label} at ${int(w)}: cost vs the floor (net-cost gate)`, target: `≤ ${GATE_FLOOR_TARGETS[w]}× the infinite-window floor`, measured: `${ratio.toFixed(3)}× (${usd(dshTotal.cost)} vs ${usd(floorTotal.cost)})`, met: ratio <= GATE_FLOOR_TARGETS[w] })
    if (w === 16_000) targets.push({ name: `${label} at ${int(w)}: summary calls vs dsh v1`, target: '≤ half of v1\'s', measured: `${dshTotal.summaryRequests} vs ${v1.summaryRequests} (half: ${v1.summaryRequests / 2})`, met: dshTotal.summaryRequests <= v1.summaryRequests / 2 })
    targets.push({ name: `${label} at ${int(w)}: requests over the window in the transcripts' own tokens (calibrated)`, target: '0', measured: `${int(dshTotal.calibratedOver)} of ${int(dshTotal.requests)} (v2: ${int(v2.calibratedOver)}, v1: ${int(v1.calibratedOver)}); of them ${int(dshTotal.firstOver)} a transcript's first request, recorded over the window before any edit (nothing can fit it)`, met: dshTotal.calibratedOver === 0 })
  }
  return {
    ...base, status: 'ran', targets,
    method: [
      `Every transcript of the corpus (${files.length} files; Claude Code's Task-subagent runs replayed as transcripts of their own and`,
      'summed into their file\'s row), priced as deepseek-flash off-peak (USD per million tokens: cache hit 0.003, miss 0.15,',
      'output 0.60). One cost model for every policy: its requests are fed into a `Session` (one request per assistant message,',
      'carrying the surface before it) and priced by `session.usage({prices})`: per request, the modelled cache hit (the leading',
      'messages identical to the previous conversation request, envelope first, tokens by the §2 meter; a summary request is',
      'compared with the conversation request before it) at the hit price, the rest of the input at the miss price, the',
      'assistant message (or the simulated summary) at the output price. **Floor** = no management and an infinite window: appends',
      `only, so every request but the first hits the cache up to its new messages. **Masking** = before each request the tool results`,
      `of the step that left the newest ${MASK_KEEP_STEPS} are replaced by "${MASK_PLACEHOLDER}" (an edit deep in the prefix at every`,
      'step once the session is longer than 10 steps). **dsh v1 / v2 / v3** = `replayTranscript(t, {contextWindow, compaction})` (the',
      'Agent\'s event order, pressure checks at turn start and after each step, summaries simulated at 2,000 tokens or the request\'s max_tokens if smaller, no model call);',
      'v1 = `{clear: false}` without the gate, v2 = the defaults without the gate, v3 = the defaults (the net-cost gate on, docs/design.md §11; off through the test seam `internals.tuning.ladder`): it',
      'decides from the session so far — its cache model, its pace (requests per turn so far), the replay\'s prices — never from',
      'the transcript\'s later steps. "calibrated" = requests over the window in the transcript\'s own tokens (replay\'s fit, §15).',
      `Ratios (×) are to the floor of the same transcript. Replays took ${(ms / 1000).toFixed(1)} s.`,
    ].join('\n'),
    tables: [
      table(['window', 'policy', 'cost (corpus)', 'vs floor', 'cache-hit share', 'requests over the window', 'summary requests'], summaryRows),
      table(['transcript', 'window', ...policies.map((p) => p.name)], detailRows),
      'Defaults chosen by cost — corpus totals of dsh with one setting changed (× = to the floor):',
      table(['question', 'setting', ...WINDOWS.map((w) => `at ${int(w)}`)], experimentRows),
      'Summary requests that reuse the conversation\'s cached prefix (same envelope, the region\'s messages as sent, instruction last): the modelled hits and what they saved against sending the same input uncached:',
      table(['window', 'policy', 'summary requests', 'input tokens cached', 'saved', 'share of the cost without reuse'], reuseRows),
    ],
  }
}
