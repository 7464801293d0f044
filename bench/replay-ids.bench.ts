// Benchmark 10 (issue 24, Low): replay of many tool calls that share one id. e9ce0b5 took 47.6 s for
// 50,000 such calls: matching each result to its call scanned (and spliced) the list of open calls,
// and the unmanaged floor copied the set of open calls per result, so the time grew with the square
// of the calls. Both now find a call in O(1). Each figure is a fresh process (plain node, the build
// bundled: no tsx loader), 10,000 and 50,000 calls, the commit before the fix beside the working
// tree; the figure that matters is the ratio of the two sizes' times (5 = linear, 25 = quadratic).
import { spawnSync } from 'node:child_process'
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { buildCommit, buildWorkingTree, bundleScript, type Build } from './builds.ts'
import { ROOT, fmtRatio, fmtTime, int, stats, table, type Section, type Target } from './lib.ts'

/** The commit the issue measured (before the fix). */
const BEFORE = process.env.DSH_BENCH_REPLAY_IDS_BEFORE ?? 'e9ce0b5'
const SIZES = [10_000, 50_000] as const
/** Runs per figure; the quadratic build's 50,000 calls take most of a minute, so it runs once. */
const RUNS = Number(process.env.DSH_BENCH_REPLAY_IDS_RUNS ?? 3)
/** Target: 5× the calls in at most this many times the time (linear is 5×; the quadratic build's was 25×). */
const RATIO_TARGET = 7.5

interface Run { calls: number; readMs: number; floorMs: number; replayMs: number; totalMs: number; rows: number }

function measure(script: string, build: Build, calls: number): Run {
  const r = spawnSync(process.execPath, [script, build.bundle, String(calls)], { cwd: ROOT, encoding: 'utf8', maxBuffer: 16 * 1024 * 1024, timeout: 300_000 })
  if (r.status !== 0) throw new Error(`replay-ids-child on ${build.label} with ${calls} calls failed (${r.status ?? r.signal}): ${r.stderr.slice(-2000)}`)
  return JSON.parse(r.stdout.trim().split('\n').at(-1)!) as Run
}

export default async function replayIds(): Promise<Section> {
  const dir = mkdtempSync(join(tmpdir(), 'dsh-replay-ids-'))
  try {
    const builds = [await buildCommit(BEFORE, dir), await buildWorkingTree(dir)]
    const script = await bundleScript(join(ROOT, 'bench', 'replay-ids-child.ts'), dir, 'replay-ids-child')
    const medians = new Map<string, number>()
    const rows: string[][] = []
    for (const build of builds) {
      for (const calls of SIZES) {
        const slow = build === builds[0] && calls === SIZES[SIZES.length - 1]
        const runs = Array.from({ length: slow ? 1 : RUNS }, () => measure(script, build, calls))
        const total = stats(runs.map((r) => r.totalMs))
        medians.set(`${build.label} ${calls}`, total.median)
        const median = (key: 'readMs' | 'floorMs' | 'replayMs') => fmtTime(stats(runs.map((r) => r[key])).median)
        rows.push([build.label, int(calls), median('readMs'), median('floorMs'), median('replayMs'),
          `${fmtTime(total.median)}${runs.length > 1 ? ` (${fmtTime(total.min)}–${fmtTime(total.max)})` : ''}`, String(runs.length)])
      }
    }
    const ratio = (b: Build) => medians.get(`${b.label} ${SIZES[1]}`)! / medians.get(`${b.label} ${SIZES[0]}`)!
    const [before, after] = builds
    const tables = [
      table(['build', 'tool calls (one id)', 'readTranscript', 'unmanagedSession', 'replayTranscript', 'read + replay, median (min–max)', 'runs'], rows),
      table(['build', `time at ${int(SIZES[1])} ÷ time at ${int(SIZES[0])}`, `${int(SIZES[1])} calls, after ÷ before`],
        [[before.label, fmtRatio(ratio(before)), '—'],
          [after.label, fmtRatio(ratio(after)), fmtRatio(medians.get(`${after.label} ${SIZES[1]}`)! / medians.get(`${before.label} ${SIZES[1]}`)!)]]),
    ]
    const targets: Target[] = [{
      name: `replay of ${int(SIZES[1])} tool calls with one id is linear`,
      target: `time at ${int(SIZES[1])} calls ≤ ${RATIO_TARGET}× the time at ${int(SIZES[0])} (linear 5×)`,
      measured: `${fmtRatio(ratio(after))} (${fmtTime(medians.get(`${after.label} ${SIZES[1]}`)!)}); ${before.label}: ${fmtRatio(ratio(before))} (${fmtTime(medians.get(`${before.label} ${SIZES[1]}`)!)})`,
      met: ratio(after) <= RATIO_TARGET,
    }]
    const method = `One transcript (OpenAI-style): a user message, one assistant message with N tool calls that all carry the id "call", the N results, a final answer; \`readTranscript\` then \`replayTranscript\` (context window 128,000) in a fresh \`node\` process per run, on a bundle of ${before.label} (before the fix) and of the working tree; \`unmanagedSession\` (the unmanaged floor that replay builds beside the managed run) is timed once more alone. Median of ${RUNS} runs (the quadratic build's ${int(SIZES[1])} calls: one run). Since ${before.label} the loop runs at most 1,000 calls of one message and drops the rest unrun (issue 24 item 7), so the whole replay's after ÷ before counts that too; readTranscript and unmanagedSession handle every call in both builds and show the fix alone.`
    return { id: 'replay-ids', title: 'Replay of many tool calls with one id', status: 'ran', method, tables, targets }
  } finally { rmSync(dir, { recursive: true, force: true }) }
}
