// Prints the replay totals tables of docs/replay.md (and the README) from one run over ../shared/corpus.
// Run: npx tsx bench/replay-docs.ts [WINDOW …]   (default 128000 32000)
import { readFileSync, readdirSync } from 'node:fs'
import { join } from 'node:path'
import { runReplay, type ReplayReport } from '../dsh.ts'

const corpus = process.env.DSH_CORPUS ?? join(import.meta.dirname, '..', '..', 'shared', 'corpus')
const files = readdirSync(corpus).filter((f) => /\.(jsonl|traj|json)$/.test(f)).sort()
const windows = process.argv.slice(2).map(Number)
const fmt = (n: number) => n.toLocaleString('en-US')
const row = (name: string, r: ReplayReport) => {
  const t = r.totals
  const fit = t.calibration.samples > 0 ? `${fmt(t.calibration.offsetTokens)} + ${t.calibration.ratio.toFixed(3)}×` : '—'
  return `| ${name} | ${t.steps} | ${fmt(t.peakRequestTokens)} (${t.peakPercent.toFixed(1)}%) | ${fmt(t.peakCalibratedRequestTokens)} | ${t.prunes} | ${fmt(t.prunedTokens)} | ${t.spills} | ${t.compactions} | ${t.summaryCalls} | ${t.requestsOverWindow} / ${t.calibratedRequestsOverWindow} | ${t.unmanagedStepsOverWindow} / ${t.calibratedUnmanagedStepsOverWindow} (${fmt(t.peakUnmanagedTokens)}) | ${fit} | ${t.figures?.rereads ?? 0} |`
}
for (const window of windows.length ? windows : [128_000, 32_000]) {
  console.log(`\n### Context window ${fmt(window)}\n`)
  console.log('| transcript | steps | peak request (tokens, % of window) | peak request, calibrated | prunes | tokens reclaimed by pruning | spills | compactions | summary calls | requests over the window, dsh (estimate / calibrated) | steps over the window, unmanaged (estimate / calibrated; unmanaged peak) | fit: offset + ratio × estimate | rereads |')
  console.log('|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|')
  for (const file of files) {
    const { report, sidechainReports } = await runReplay(readFileSync(join(corpus, file), 'utf8'), { contextWindow: window, sidechains: true })
    console.log(row(file, report))
    sidechainReports.forEach((r, k) => console.log(row(`↳ sidechain ${k + 1}`, r)))
  }
}
