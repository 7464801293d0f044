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
/** Runs per figure; the build before the fix runs its 50,000 calls once. */
const RUNS = Number(process.env.DSH_BENCH_REPLAY_IDS_RUNS ?? 3)
/** Target: 5× the calls in at most this many times the time (linear is 5×; quadratic 25×). */
const RATIO_TARGET = 7.5

interface Run { calls: number; readMs: number; floorMs: number; replayMs?: number; rows?: number }

function measure(script: string, build: Build, calls: number, pieces: boolean): Run {
  const r = spawnSync(process.execPath, [script, build.bundle, String(calls), ...(pieces ? ['pieces'] : [])], { cwd: ROOT, encoding: 'utf8', maxBuffer: 16 * 1024 * 1024, timeout: 300_000 })
  if (r.status !== 0) throw new Error(`replay-ids-child on ${build.label} with ${calls} calls failed (${r.status ?? r.signal}): ${r.stderr.slice(-2000)}`)
  return JSON.parse(r.stdout.trim().split('\n').at(-1)!) as Run
}

export default async function replayIds(): Promise<Section> {
  const dir = mkdtempSync(join(tmpdir(), 'dsh-replay-ids-'))
  try {
    const [before, after] = [await buildCommit(BEFORE, dir), await buildWorkingTree(dir)]
    const script = await bundleScript(join(ROOT, 'bench', 'replay-ids-child.ts'), dir, 'replay-ids-child')
    /** Median ms by build, size and piece ('pieces' = read + floor; 'replay' = the whole replayTranscript). */
    const median = new Map<string, number>()
    const rows: string[][] = []
    for (const build of [before, after]) {
      for (const calls of SIZES) {
        const slow = build === before && calls === SIZES[1] // tens of seconds: once
        const runs = Array.from({ length: slow ? 1 : RUNS }, () => measure(script, build, calls, build === before))
        const m = (pick: (r: Run) => number) => stats(runs.map(pick)).median
        const pieces = stats(runs.map((r) => r.readMs + r.floorMs))
        median.set(`${build.label} ${calls} pieces`, pieces.median)
        if (build === after) median.set(`${build.label} ${calls} replay`, m((r) => r.replayMs!))
        rows.push([build.label, int(calls), fmtTime(m((r) => r.readMs)), fmtTime(m((r) => r.floorMs)), `${fmtTime(pieces.median)}${runs.length > 1 ? ` (${fmtTime(pieces.min)}–${fmtTime(pieces.max)})` : ''}`,
          build === after ? fmtTime(m((r) => r.replayMs!)) : 'not run', String(runs.length)])
      }
    }
    const ratio = (b: Build, piece: 'pieces' | 'replay') => median.get(`${b.label} ${SIZES[1]} ${piece}`)! / median.get(`${b.label} ${SIZES[0]} ${piece}`)!
    const tables = [
      table(['build', 'tool calls (one id)', 'readTranscript', 'unmanagedSession', 'both, median (min–max)', 'replayTranscript', 'runs'], rows),
      table(['build', `readTranscript + unmanagedSession: ${int(SIZES[1])} ÷ ${int(SIZES[0])}`, `replayTranscript: ${int(SIZES[1])} ÷ ${int(SIZES[0])}`],
        [[before.label, fmtRatio(ratio(before, 'pieces')), 'not run'], [after.label, fmtRatio(ratio(after, 'pieces')), fmtRatio(ratio(after, 'replay'))]]),
    ]
    const worst = Math.max(ratio(after, 'pieces'), ratio(after, 'replay'))
    const targets: Target[] = [{
      name: `replay of ${int(SIZES[1])} tool calls with one id is linear`,
      target: `time at ${int(SIZES[1])} calls ≤ ${RATIO_TARGET}× the time at ${int(SIZES[0])} (linear 5×)`,
      measured: `read + floor ${fmtRatio(ratio(after, 'pieces'))}, whole replay ${fmtRatio(ratio(after, 'replay'))} (${fmtTime(median.get(`${after.label} ${SIZES[1]} replay`)!)}); ${before.label}: read + floor ${fmtRatio(ratio(before, 'pieces'))} (${fmtTime(median.get(`${before.label} ${SIZES[1]} pieces`)!)})`,
      met: worst <= RATIO_TARGET,
    }]
    const method = `One transcript (OpenAI-style): a user message, one assistant message with N tool calls that all carry the id "call", the N results, a final answer. A fresh \`node\` process per run reads it (\`readTranscript\`: parsing and the pairing pass), builds the unmanaged floor (\`unmanagedSession\`) and, on the working tree, runs the whole \`replayTranscript\` (context window 128,000). Median of ${RUNS} runs (${before.label} at ${int(SIZES[1])} calls: one). On ${before.label} (before the fix) the whole replay is not run: its 50,000 calls took 142 s in the first run of this benchmark (the issue measured 47.6 s), over the one-minute budget; readTranscript and unmanagedSession handle every call in both builds and show the fix alone. Since ${before.label} the loop also runs at most 1,000 calls of one message and drops the rest unrun (issue 24 item 7), which is why the working tree's whole replay grows less than 5×.`
    return { id: 'replay-ids', title: 'Replay of many tool calls with one id', status: 'ran', method, tables, targets }
  } finally { rmSync(dir, { recursive: true, force: true }) }
}
