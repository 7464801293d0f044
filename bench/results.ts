// Rendering of bench/RESULTS.md (used by bench/run.ts): the header of machine facts, the targets
// table, one section per benchmark, and the `--update` splice. Every section and every target row
// names the commit it was measured at, so a file spliced from several runs says which figure comes
// from which code. Pure functions of their inputs (tested in test/bench-results.test.ts).
import { fmtTime, table, type Section } from './lib.ts'

/** In RESULTS.md order (issue 7 numbering; 9 from issue 26, 10 from issue 24). */
export const BENCHMARKS = ['pruner', 'meter', 'sse', 'bundle', 'accuracy', 'ladder', 'scale', 'cost', 'durable', 'replay-ids'] as const
export const TITLES: Record<string, string> = {
  pruner: 'Pruner', meter: 'Meter', sse: 'SSE parser', bundle: 'Bundle and start-up', accuracy: 'Estimate accuracy', ladder: 'The ladder on real sessions', scale: 'Long sessions at scale',
  cost: 'Cost and the prompt cache', durable: 'Durable steps', 'replay-ids': 'Replay of many tool calls with one id',
}
/** Each benchmark is designed to finish within this (issue 7); a longer run is flagged. */
export const BUDGET_MS = 60_000

/** A section's number in RESULTS.md. */
export const number = (s: Section) => (BENCHMARKS as readonly string[]).indexOf(s.id) + 1

const TARGETS_HEADING = '## Targets'
/** The header row's fact naming the commit of a full run, and the one listing later splices. */
const COMMIT_FACT = 'commit measured'
const UPDATED_FACT = 'sections measured later (`--update`)'

/** The targets table: RESULTS.md's summary, also copied into docs/bench.md between its markers. */
export function targetsTable(sections: Section[]): string {
  const targetRows: string[][] = []
  sections.forEach((s) => {
    const at = s.at?.commit ?? '?'
    const state = s.status === 'failed' ? `failed: ${s.reason ?? ''}` : s.status === 'not-run' ? `not yet run: ${s.reason ?? ''}` : '—'
    if (s.targets.length === 0) targetRows.push([`${number(s)}. ${s.title}`, '—', state, '—', at])
    for (const t of s.targets) {
      const met = t.met !== undefined ? (t.met ? '✅ met' : '❌ not met') : s.status === 'ran' ? 'reported' : '— not yet run'
      targetRows.push([`${number(s)}. ${s.title}`, `${t.name}: ${t.target}`, t.measured, met, at])
    }
  })
  return table(['benchmark', 'target', 'measured', 'status', 'at'], targetRows)
}

/** One section: heading, status with the commit and day it was measured, method, tables. */
export function renderSection(s: Section): string {
  const lines: string[] = [`## ${number(s)}. ${s.title}`, '']
  const at = s.at ? ` at \`${s.at.label}\` on ${s.at.date}` : ''
  const wall = s.wallMs === undefined ? '' : ` Wall time ${fmtTime(s.wallMs)}${s.wallMs > BUDGET_MS ? ' — **over the one-minute budget**' : ''}.`
  if (s.status === 'not-run') lines.push(`**Not yet run**${at}: ${s.reason}${wall}`, '')
  else if (s.status === 'failed') lines.push(`**Failed**${at}: ${s.reason}${wall}`, '')
  else lines.push(`Ran${at}.${wall}`, '')
  if (s.method) lines.push(s.method.trim(), '')
  for (const t of s.tables) lines.push(t.trim(), '')
  return lines.join('\n')
}

/** The whole file: `facts` (taken when the run started), the targets, then the sections. */
export function render(sections: Section[], facts: [string, string][]): string {
  const lines: string[] = []
  lines.push('# dsh.ts benchmarks', '')
  lines.push('Written by `npm run bench` (bench/run.ts) in one run on the machine below. Each benchmark ran in its own')
  lines.push('Node process. Times are the **median** of several runs with the **min–max** in brackets; every ratio compares')
  lines.push('figures measured in the same benchmark run, interleaved where the runs are long. The machine is shared with other')
  lines.push('work (see the load average): read the min–max spreads before trusting small differences. Each section and each')
  lines.push('target row names the commit it measured (`npm run bench -- --update NAME` reruns one section and stamps it anew).')
  lines.push('Methods and findings: [docs/bench.md](../docs/bench.md).', '')
  lines.push(table(['fact', 'value'], facts), '')
  lines.push(`${TARGETS_HEADING} (issues 7 and 26)`, '')
  lines.push(targetsTable(sections), '')
  for (const s of sections) lines.push(renderSection(s))
  return lines.join('\n')
}

/**
 * `--update`: the fresh sections (`## N. Title` up to the next `## `) and their rows of the targets
 * table replace the old ones in `old`, or are added; the header's facts gain a row naming each
 * spliced section's commit and day. Everything else is left as it was.
 */
export function splice(old: string, fresh: Section[]): string {
  let out = old
  for (const s of fresh) {
    const heading = `## ${number(s)}. ${s.title}`
    const body = renderSection(s)
    const at = out.indexOf(`\n${heading}\n`)
    if (at >= 0) {
      const next = out.indexOf('\n## ', at + 1)
      out = out.slice(0, at + 1) + body.trimEnd() + '\n' + (next >= 0 ? out.slice(next) : '')
    } else out = out.trimEnd() + '\n\n' + body
    // Target rows: drop this benchmark's, add the fresh ones at the end of the targets table.
    const rowPrefix = `| ${number(s)}. ${s.title} |`
    const lines = out.split('\n').filter((l) => !l.startsWith(rowPrefix))
    const start = lines.findIndex((l) => l.startsWith(TARGETS_HEADING))
    if (start < 0) throw new Error('splice: RESULTS.md has no targets table; run `npm run bench` once without names')
    let end = start + 1
    while (end < lines.length && !lines[end].startsWith('|')) end++
    while (end < lines.length && lines[end].startsWith('|')) end++
    lines.splice(end, 0, ...targetsTable([s]).split('\n').slice(2))
    out = stampHeader(lines, s).join('\n')
  }
  return out
}

/** The targets table of a RESULTS.md (its rows as they stand, each naming the commit it measured). */
export function targetsOf(results: string): string {
  const lines = results.split('\n')
  let at = lines.findIndex((l) => l.startsWith(TARGETS_HEADING))
  if (at < 0) throw new Error('RESULTS.md has no targets table; run `npm run bench` once without names')
  while (at < lines.length && !lines[at].startsWith('|')) at++
  let end = at
  while (end < lines.length && lines[end].startsWith('|')) end++
  return lines.slice(at, end).join('\n')
}

/** Adds (or refreshes) section `s` in the header's row of later measurements. */
function stampHeader(lines: string[], s: Section): string[] {
  const entry = `${number(s)}. ${s.title} at \`${s.at?.label ?? '?'}\` on ${s.at?.date ?? '?'}`
  const prefix = `| ${UPDATED_FACT} |`
  const row = lines.findIndex((l) => l.startsWith(prefix))
  if (row >= 0) {
    const cell = lines[row].slice(prefix.length).replace(/\|\s*$/, '').trim()
    // Entries are joined by <br>; a hand-merged row may also join them with '; ' (each starts with its number).
    const kept = cell.split(/<br>|; (?=\d+\. )/).filter((e) => e && !e.startsWith(`${number(s)}. `))
    lines[row] = `${prefix} ${[...kept, entry].join('<br>')} |`
    return lines
  }
  const commitRow = lines.findIndex((l) => l.startsWith(`| ${COMMIT_FACT} |`) || l.startsWith('| dsh.ts at |'))
  if (commitRow >= 0) lines.splice(commitRow + 1, 0, `${prefix} ${entry} |`)
  return lines
}
