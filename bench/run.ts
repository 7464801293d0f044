// `npm run bench` — runs every benchmark of issue 7, each in its own Node process (fresh heap,
// fresh JIT, `--expose-gc`), and writes bench/RESULTS.md: machine facts, the targets, then one
// section per benchmark (median of several runs, min–max, ratio to the baseline of the same run).
//
//   npm run bench                 all six, writes bench/RESULTS.md
//   npm run bench -- pruner sse   only these; prints their sections, leaves RESULTS.md alone
//   npm run bench -- --update cost   only these, and splices their sections and target rows into
//                                 the existing RESULTS.md (the other benchmarks' figures stay as they were run)
//
// A benchmark whose piece of dsh.ts has not landed yet reports itself "not yet run" with the reason.
import { spawnSync } from 'node:child_process'
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { ROOT, machineFacts, table, fmtTime, type Section } from './lib.ts'

/** In RESULTS.md order (issue 7 numbering). */
export const BENCHMARKS = ['pruner', 'meter', 'sse', 'bundle', 'accuracy', 'ladder', 'scale', 'cost'] as const
const TITLES: Record<string, string> = {
  pruner: 'Pruner', meter: 'Meter', sse: 'SSE parser', bundle: 'Bundle and start-up', accuracy: 'Estimate accuracy', ladder: 'The ladder on real sessions', scale: 'Long sessions at scale',
  cost: 'Cost and the prompt cache',
}
/** Each benchmark is designed to finish within this (issue 7); a longer run is flagged. */
const BUDGET_MS = 60_000
/** A benchmark process still running after this is killed and reported as failed. */
const KILL_MS = 300_000

function runOne(name: string, dir: string): Section {
  const out = join(dir, `${name}.json`)
  const started = performance.now()
  const child = spawnSync(process.execPath, ['--expose-gc', '--import', 'tsx', join(ROOT, 'bench', 'child.ts'), name, out], {
    cwd: ROOT, stdio: ['ignore', 'inherit', 'inherit'], timeout: KILL_MS,
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
  return section
}

/** A section's number in issue 7. */
const number = (s: Section) => (BENCHMARKS as readonly string[]).indexOf(s.id) + 1

/** The targets table: RESULTS.md's summary, also copied into docs/bench.md between its markers. */
function targetsTable(sections: Section[]): string {
  const targetRows: string[][] = []
  sections.forEach((s) => {
    const state = s.status === 'failed' ? `failed: ${s.reason ?? ''}` : s.status === 'not-run' ? `not yet run: ${s.reason ?? ''}` : '—'
    if (s.targets.length === 0) targetRows.push([`${number(s)}. ${s.title}`, '—', state, '—'])
    for (const t of s.targets) {
      const met = t.met !== undefined ? (t.met ? '✅ met' : '❌ not met') : s.status === 'ran' ? 'reported' : '— not yet run'
      targetRows.push([`${number(s)}. ${s.title}`, `${t.name}: ${t.target}`, t.measured, met])
    }
  })
  return table(['benchmark', 'target', 'measured', 'status'], targetRows)
}

const HEADLINE_START = '<!-- bench:headline:start (written by npm run bench) -->'
const HEADLINE_END = '<!-- bench:headline:end -->'

/** Replaces the block between the markers of docs/bench.md with this run's targets table. */
function updateDocs(sections: Section[]): void {
  const path = join(ROOT, 'docs', 'bench.md')
  let doc: string
  try { doc = readFileSync(path, 'utf8') } catch { return }
  const a = doc.indexOf(HEADLINE_START), b = doc.indexOf(HEADLINE_END)
  if (a < 0 || b < a) return
  const date = new Date().toISOString().slice(0, 10)
  const block = `${HEADLINE_START}\nFrom the run of ${date} in [bench/RESULTS.md](../bench/RESULTS.md):\n\n${targetsTable(sections)}\n`
  writeFileSync(path, doc.slice(0, a) + block + doc.slice(b))
}

function render(sections: Section[]): string {
  const lines: string[] = []
  lines.push('# dsh.ts benchmarks', '')
  lines.push('Written by `npm run bench` (bench/run.ts) in one run on the machine below. Each benchmark ran in its own')
  lines.push('Node process. Times are the **median** of several runs with the **min–max** in brackets; every ratio compares')
  lines.push('figures measured in the same benchmark run, interleaved where the runs are long. The machine is shared with other')
  lines.push('work (see the load average): read the min–max spreads before trusting small differences.')
  lines.push('Methods and findings: [docs/bench.md](../docs/bench.md).', '')
  lines.push(table(['fact', 'value'], machineFacts().map(([k, v]) => [k, v])), '')
  lines.push('## Targets (issue 7)', '')
  lines.push(targetsTable(sections), '')
  sections.forEach((s) => {
    lines.push(`## ${number(s)}. ${s.title}`, '')
    const wall = s.wallMs === undefined ? '' : ` Wall time ${fmtTime(s.wallMs)}${s.wallMs > BUDGET_MS ? ' — **over the one-minute budget**' : ''}.`
    if (s.status === 'not-run') lines.push(`**Not yet run:** ${s.reason}${wall}`, '')
    else if (s.status === 'failed') lines.push(`**Failed:** ${s.reason}${wall}`, '')
    else lines.push(`Ran.${wall}`, '')
    if (s.method) lines.push(s.method.trim(), '')
    for (const t of s.tables) lines.push(t.trim(), '')
  })
  return lines.join('\n')
}

const asked = process.argv.slice(2).filter((a) => !a.startsWith('-'))
for (const a of asked) {
  if (!(BENCHMARKS as readonly string[]).includes(a)) {
    console.error(`unknown benchmark "${a}"; choose from: ${BENCHMARKS.join(', ')}`)
    process.exit(2)
  }
}
const names = asked.length > 0 ? asked : [...BENCHMARKS]
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
/**
 * `--update`: the named sections (`## N. Title` up to the next `## `) and their rows of the targets
 * table replace the old ones in RESULTS.md, or are added; everything else is left as it was.
 */
function splice(old: string, fresh: Section[]): string {
  let out = old
  for (const s of fresh) {
    const heading = `## ${number(s)}. ${s.title}`
    const one = render([s])
    const body = one.slice(one.indexOf(heading))
    const at = out.indexOf(`\n${heading}\n`)
    if (at >= 0) {
      const next = out.indexOf('\n## ', at + 1)
      out = out.slice(0, at + 1) + body.trimEnd() + '\n' + (next >= 0 ? out.slice(next) : '')
    } else out = out.trimEnd() + '\n\n' + body
    // Target rows: drop this benchmark's, add the fresh ones at the end of the targets table.
    const rowPrefix = `| ${number(s)}. ${s.title} |`
    const lines = out.split('\n').filter((l) => !l.startsWith(rowPrefix))
    const start = lines.indexOf('## Targets (issue 7)')
    let end = start + 1
    while (end < lines.length && !lines[end].startsWith('|')) end++
    while (end < lines.length && lines[end].startsWith('|')) end++
    const rows = targetsTable([s]).split('\n').slice(2)
    lines.splice(end, 0, ...rows)
    out = lines.join('\n')
  }
  return out
}

const md = render(sections)
if (process.argv.includes('--update') && asked.length > 0) {
  const path = join(ROOT, 'bench', 'RESULTS.md')
  writeFileSync(path, splice(readFileSync(path, 'utf8'), sections))
  console.error(`updated ${asked.join(', ')} in bench/RESULTS.md`)
} else if (asked.length === 0) {
  writeFileSync(join(ROOT, 'bench', 'RESULTS.md'), md)
  updateDocs(sections)
  console.error('wrote bench/RESULTS.md and the headline of docs/bench.md')
} else {
  process.stdout.write(md)
}
if (sections.some((s) => s.status === 'failed')) process.exitCode = 1
