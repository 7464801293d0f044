// `npm run bench` — runs every benchmark (issues 7 and 26), each in its own Node process (fresh heap,
// fresh JIT, `--expose-gc`), and writes bench/RESULTS.md: machine facts, the targets, then one
// section per benchmark (median of several runs, min–max, ratio to the baseline of the same run).
//
//   npm run bench                 all of them, writes bench/RESULTS.md
//   npm run bench -- pruner sse   only these; prints their sections, leaves RESULTS.md alone
//   npm run bench -- --update cost   only these, and splices their sections and target rows into
//                                 the existing RESULTS.md (the other benchmarks' figures stay as they were run)
//   npm run bench -- --big        also resume logs of 1 GiB and 2 GiB (benchmark 7; minutes more)
//
// The commit measured is taken when the run starts (bench/lib.ts commitStamp: `git rev-parse
// --short HEAD`, plus "dirty" and what differs when the working tree is not that commit), and every
// section and target row carries it, so a spliced RESULTS.md says which figure comes from which code.
// To compare a figure with another commit's build in one process: `npm run bench:compare` (bench/compare.ts).
//
// A benchmark whose piece of dsh.ts has not landed yet reports itself "not yet run" with the reason.
import { spawnSync } from 'node:child_process'
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { ROOT, commitStamp, machineFacts, stampLabel, fmtTime, type Section } from './lib.ts'
import { BENCHMARKS, TITLES, render, splice, targetsOf, targetsTable } from './results.ts'

/** A benchmark process still running after this is killed and reported as failed. */
const KILL_MS = 600_000

const stamp = commitStamp()
const facts = machineFacts(stamp) // at the start: the load average and the tree are those the run began with
const at = { commit: stamp.changed.length > 0 ? `${stamp.commit}+dirty` : stamp.commit, label: stampLabel(stamp), date: new Date().toISOString().slice(0, 10) }

function runOne(name: string, dir: string): Section {
  const out = join(dir, `${name}.json`)
  const started = performance.now()
  const child = spawnSync(process.execPath, ['--expose-gc', '--import', 'tsx', join(ROOT, 'bench', 'child.ts'), name, out], {
    cwd: ROOT, stdio: ['ignore', 'inherit', 'inherit'], timeout: KILL_MS,
    env: process.argv.includes('--big') ? { ...process.env, DSH_BENCH_BIG: '1' } : process.env,
  })
  const wallMs = performance.now() - started
  let section: Section
  try {
    section = JSON.parse(readFileSync(out, 'utf8')) as Section
  } catch {
    const why = child.error ? String(child.error.message) : child.signal ? `killed by ${child.signal}` : `exit code ${child.status}`
    section = { id: name, title: TITLES[name] ?? name, status: 'failed', reason: `the benchmark process ended without a result (${why}); see its stderr`, method: '', tables: [], targets: [] }
  }
  section.wallMs = wallMs
  section.at = at
  return section
}

const HEADLINE_START = '<!-- bench:headline:start (written by npm run bench) -->'
const HEADLINE_END = '<!-- bench:headline:end -->'

/** Replaces the block between the markers of docs/bench.md with `table`, under the line `from`. */
function updateDocs(from: string, table: string): void {
  const path = join(ROOT, 'docs', 'bench.md')
  let doc: string
  try { doc = readFileSync(path, 'utf8') } catch { return }
  const a = doc.indexOf(HEADLINE_START), b = doc.indexOf(HEADLINE_END)
  if (a < 0 || b < a) return
  const block = `${HEADLINE_START}\n${from}\n\n${table}\n`
  writeFileSync(path, doc.slice(0, a) + block + doc.slice(b))
}

const asked = process.argv.slice(2).filter((a) => !a.startsWith('-'))
for (const a of asked) {
  if (!(BENCHMARKS as readonly string[]).includes(a)) {
    console.error(`unknown benchmark "${a}"; choose from: ${BENCHMARKS.join(', ')}`)
    process.exit(2)
  }
}
const names = asked.length > 0 ? asked : [...BENCHMARKS]
console.error(`── measuring ${at.label}`)
const dir = mkdtempSync(join(tmpdir(), 'dsh-bench-'))
const sections: Section[] = []
try {
  for (const name of names) {
    console.error(`── bench: ${name}`)
    const s = runOne(name, dir)
    console.error(`   ${s.status}${s.reason ? `: ${s.reason}` : ''} (${fmtTime(s.wallMs ?? 0)})`)
    sections.push(s)
  }
} finally {
  rmSync(dir, { recursive: true, force: true })
}

if (process.argv.includes('--update') && asked.length > 0) {
  const path = join(ROOT, 'bench', 'RESULTS.md')
  const results = splice(readFileSync(path, 'utf8'), sections)
  writeFileSync(path, results)
  // The headline quotes RESULTS.md as it now stands: the other rows keep the commit they measured.
  updateDocs(`From [bench/RESULTS.md](../bench/RESULTS.md), with ${asked.join(', ')} rerun at \`${at.label}\` on `
    + `${at.date} (each row names the commit it measured):`, targetsOf(results))
  console.error(`updated ${asked.join(', ')} in bench/RESULTS.md and the headline of docs/bench.md (stamped ${at.label})`)
} else if (asked.length === 0) {
  writeFileSync(join(ROOT, 'bench', 'RESULTS.md'), render(sections, facts))
  updateDocs(`From the run of ${at.date} at \`${at.label}\` in [bench/RESULTS.md](../bench/RESULTS.md):`,
    targetsTable(sections))
  console.error('wrote bench/RESULTS.md and the headline of docs/bench.md')
} else {
  process.stdout.write(render(sections, facts))
}
if (sections.some((s) => s.status === 'failed')) process.exitCode = 1
