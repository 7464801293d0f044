// `npm run bench:compare -- --against REV [figures…] [options]` — one figure, two builds, one process.
// Builds the working tree's dsh.ts and REV's (`git show REV:dsh.ts`), each bundled by esbuild
// (bench/builds.ts), loads both into one plain `node` process (bench/compare-child.ts, bundled:
// no tsx loader there) and times each figure for both builds and its floor in interleaved
// tinybench rounds, so that a regression shows up as a ratio, measured under the same load.
//
//   figures   step     durable step: Agent on FileStore (fsync on, a temp dir on the disk) with a
//                      scripted provider, one turn of 10 steps per round, vs raw write + fsync of
//                      the same bytes per step
//             sse      parseSSE / createSSEParser / pumpSSE vs eventsource-parser's createParser on
//                      an ASCII-heavy and a CJK/emoji-heavy stream (1 MiB each by default)
//             resume   Session.load + resume() of a generated log vs read in 4 MiB chunks + JSON.parse
//             (none named: all three)
//   options   --against REV      the commit to compare with (required): hash, branch or tag
//             --rounds N         rounds of every figure (default: step 100, sse 15, resume 7)
//             --sse-kib N        size of each SSE stream (default 1024)
//             --resume-mib N     size of the resume log (default 100)
//             --json FILE        also write the raw results (samples per round) as JSON
//
// Ratios are paired: taken within each round, then their median (min–max). Time ratios "A ÷ B" are
// < 1 when A is faster. A figure a build lacks the API for (feature-detected) is reported "n/a".
import { spawnSync } from 'node:child_process'
import { rmSync, writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { buildCommit, buildWorkingTree, bundleScript } from './builds.ts'
import { ROOT, commitStamp, diskTempDir, fmtRatio, fmtTime, stampLabel, table } from './lib.ts'
import { SHARED_DIR } from '../test/shared.ts'
import type { CompareConfig, FigureResult } from './compare-child.ts'

const FIGURES = ['step', 'sse', 'resume'] as const

function usage(message: string): never {
  console.error(`${message}\nusage: npm run bench:compare -- --against REV [${FIGURES.join('|')} …] [--rounds N] [--sse-kib N] [--resume-mib N] [--json FILE]`)
  process.exit(2)
}

const argv = process.argv.slice(2)
const opts: Record<string, string> = {}
const figures: string[] = []
for (let i = 0; i < argv.length; i++) {
  const a = argv[i]
  if (a.startsWith('--')) {
    const [k, v] = a.includes('=') ? [a.slice(2, a.indexOf('=')), a.slice(a.indexOf('=') + 1)] : [a.slice(2), argv[++i]]
    if (!['against', 'rounds', 'sse-kib', 'resume-mib', 'json'].includes(k)) usage(`unknown option --${k}`)
    if (v === undefined) usage(`--${k} needs a value`)
    opts[k] = v
  } else if ((FIGURES as readonly string[]).includes(a)) figures.push(a)
  else usage(`unknown figure "${a}"; choose from ${FIGURES.join(', ')}`)
}
if (!opts.against) usage('--against REV is required')
const num = (k: string, dflt: number): number => {
  if (opts[k] === undefined) return dflt
  const n = Number(opts[k])
  if (!Number.isSafeInteger(n) || n < 1) usage(`--${k} must be a positive integer, not "${opts[k]}"`)
  return n
}
const rounds = opts.rounds === undefined ? undefined : num('rounds', 1)

const { dir, fs } = diskTempDir('dsh-compare-')
try {
  const stamp = commitStamp()
  const worktree = await buildWorkingTree(dir)
  const against = await buildCommit(opts.against, dir)
  const child = await bundleScript(join(ROOT, 'bench', 'compare-child.ts'), dir, 'compare-child')
  const cfg: CompareConfig = {
    builds: [{ label: 'working tree', bundle: worktree.bundle }, { label: against.commit, bundle: against.bundle }],
    figures: figures.length > 0 ? figures : [...FIGURES], dir,
    stepRounds: rounds ?? 100, sseRounds: rounds ?? 15, resumeRounds: rounds ?? 7,
    sseBytes: num('sse-kib', 1024) * 1024, resumeBytes: num('resume-mib', 100) * 1024 * 1024,
  }
  writeFileSync(join(dir, 'config.json'), JSON.stringify(cfg))
  console.error(`── compare: working tree (${stampLabel(stamp)}) against ${against.commit}; temp dir on ${fs}`)
  // The child bundle lives in the temp dir: tell it where the shared fixtures are.
  const r = spawnSync(process.execPath, ['--expose-gc', child, join(dir, 'config.json')], { cwd: ROOT, encoding: 'utf8', stdio: ['ignore', 'pipe', 'inherit'], env: { ...process.env, DSH_SHARED: SHARED_DIR }, maxBuffer: 256 * 1024 * 1024 })
  if (r.status !== 0) throw new Error(`compare-child failed (${r.status ?? r.signal})`)
  const results = JSON.parse(r.stdout.trim().split('\n').at(-1)!) as FigureResult[]
  if (opts.json) writeFileSync(opts.json, JSON.stringify({ worktree: stampLabel(stamp), against: against.commit, results }, null, 1))
  const out: string[] = [`# Compare: working tree (\`${stampLabel(stamp)}\`) against \`${against.commit}\``, '',
    `${new Date().toISOString()}, node ${process.version}; one process, interleaved tinybench rounds; temp dir on ${fs}. Ratios paired per round: median (min–max).`, '']
  for (const f of results) {
    out.push(`## ${f.title}`, '')
    if (f.rows.length > 0) out.push(table(['what', `median ${f.unit} (min–max)`, 'rounds'], f.rows.map((row) => [row.name, `${fmtTime(row.stats.median)} (${fmtTime(row.stats.min)}–${fmtTime(row.stats.max)})`, String(row.stats.runs)])), '')
    if (f.ratios.length > 0) out.push(table(['ratio', 'median (min–max)'], f.ratios.map((x) => [x.name, `${fmtRatio(x.stats.median)} (${fmtRatio(x.stats.min)}–${fmtRatio(x.stats.max)})`])), '')
    for (const n of f.notes) out.push(`- ${n}`)
    out.push('')
  }
  process.stdout.write(out.join('\n'))
} finally {
  rmSync(dir, { recursive: true, force: true })
}
