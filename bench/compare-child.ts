// The measuring half of bench/compare.ts, bundled and run with plain `node --expose-gc` (no tsx
// loader in the measured process). Loads two builds of dsh.ts side by side and times each figure
// for both and for its floor in interleaved tinybench rounds (bench/lib.ts interleavedBench), in one
// process. Prints one JSON line: per figure, its rows (or why a build cannot run it).
//
//   node --expose-gc compare-child.mjs CONFIG.json
//   CONFIG: { builds: [{label, bundle}, {label, bundle}], figures: string[], dir, rounds?, … }
import { readFileSync, rmSync, statSync } from 'node:fs'
import { join } from 'node:path'
import { pathToFileURL } from 'node:url'
import { interleavedBench, paired, stats, type BenchTask, type Stats } from './lib.ts'
import { readAndParse, writeLog } from './logs.ts'
import { digest, makeStream, runDsh, runDshPump, runDshPush, runEventsourceParser, type Consumer, type CreateSSEParser, type ParseSSE, type PumpSSE } from './sse-streams.ts'
import { openRawFloor, stepRunner, type StepModule, type StepRunner } from './steps.ts'

export interface CompareConfig {
  builds: { label: string; bundle: string }[]
  figures: string[]
  dir: string
  stepRounds: number
  sseBytes: number
  sseRounds: number
  resumeBytes: number
  resumeRounds: number
}

/** One timed thing: its per-iteration samples (ms) by round. */
export interface Row { name: string; build?: string; stats: Stats; samples: number[] }
/** A figure's result: rows, ratios between rows (paired per round), and notes (n/a, checks). */
export interface FigureResult { figure: string; title: string; unit: string; rows: Row[]; ratios: { name: string; stats: Stats }[]; notes: string[] }

type Mod = Record<string, any>

/** Why `mod` cannot run a figure, or undefined when it can: the harness uses only what both builds export. */
function lacks(mod: Mod, needs: string[]): string | undefined {
  const missing = needs.filter((n) => {
    const [name, member] = n.split('.')
    return member ? typeof mod[name]?.[member] !== 'function' : typeof mod[name] !== 'function'
  })
  return missing.length > 0 ? `n/a: this build has no ${missing.map((m) => `\`${m}\``).join(', ')}` : undefined
}

async function measure(tasks: (BenchTask & { build?: string })[], rounds: number, iterations: number): Promise<Row[]> {
  const samples = await interleavedBench(tasks, { rounds, iterations })
  return tasks.map((t, i) => ({ name: t.name, build: t.build, stats: stats(samples[i]), samples: samples[i] }))
}

const ratio = (name: string, a: Row, b: Row) => ({ name, stats: paired(a.samples, b.samples) })

/** Durable steps: one turn (10 steps) per iteration, ms per step; the floor writes each build's bytes per step. */
async function stepFigure(mods: Mod[], labels: string[], cfg: CompareConfig): Promise<FigureResult> {
  const res: FigureResult = { figure: 'step', title: 'Durable step: Agent on FileStore (fsync on), one turn of 10 steps per iteration', unit: 'ms per step', rows: [], ratios: [], notes: [] }
  const runners: (StepRunner | undefined)[] = []
  const floors = mods.map((_, i) => openRawFloor(join(cfg.dir, `raw-${i}.jsonl`)))
  const perStep = mods.map(() => 3000)
  const tasks: (BenchTask & { build?: string })[] = []
  for (let i = 0; i < mods.length; i++) {
    const why = lacks(mods[i], ['Session.open', 'Agent', 'FileStore'])
    if (why) { res.notes.push(`${labels[i]}: ${why}`); runners.push(undefined); continue }
    const runner = await stepRunner(mods[i] as StepModule, join(cfg.dir, `steps-${i}.jsonl`))
    runners.push(runner)
    tasks.push({ name: `dsh step (${labels[i]})`, build: labels[i], fn: async () => {
      const b0 = runner.bytes(), t0 = performance.now()
      const n = await runner.run(1)
      const ms = performance.now() - t0
      perStep[i] = (runner.bytes() - b0) / n
      return { overriddenDuration: ms / n }
    } })
    tasks.push({ name: `raw write + fsync of the same bytes (${labels[i]}'s)`, build: labels[i], fn: () => ({ overriddenDuration: floors[i].run(10, 10 * perStep[i]) / 10 }) })
  }
  try {
    res.rows = await measure(tasks, cfg.stepRounds, 1)
  } finally {
    for (const r of runners) await r?.close()
    floors.forEach((f) => f.close())
  }
  const step = (l: string) => res.rows.find((r) => r.build === l && r.name.startsWith('dsh step'))
  const floor = (l: string) => res.rows.find((r) => r.build === l && r.name.startsWith('raw'))
  const [a, b] = labels
  if (step(a) && step(b)) res.ratios.push(ratio(`step time, ${a} ÷ ${b}`, step(a)!, step(b)!))
  for (const l of labels) if (step(l)) res.ratios.push(ratio(`${l}: step ÷ raw write + fsync`, step(l)!, floor(l)!))
  res.notes.push(`bytes per step: ${labels.map((l, i) => `${l} ${Math.round(perStep[i])}`).join(', ')}; ${cfg.stepRounds} rounds of one turn each`)
  return res
}

/** SSE parsers on one stream: one pass over it per iteration, ms per pass. */
async function sseFigure(mods: Mod[], labels: string[], kind: 'recorded' | 'cjk', cfg: CompareConfig): Promise<FigureResult> {
  const label = kind === 'cjk' ? 'CJK/emoji-heavy' : 'recorded (ASCII-heavy)'
  const { bytes, chunks } = makeStream(kind, cfg.sseBytes)
  const res: FigureResult = { figure: `sse-${kind === 'cjk' ? 'cjk' : 'ascii'}`, title: `SSE parsers, ${label} stream of ${(bytes.length / 1024 / 1024).toFixed(2)} MiB in ${chunks.length.toLocaleString('en-US')} network chunks`, unit: 'ms per stream', rows: [], ratios: [], notes: [] }
  const impls: { name: string; build?: string; form?: string; run: (f: Consumer) => Promise<void> }[] = [{ name: 'eventsource-parser `createParser` + TextDecoder', run: (f) => runEventsourceParser(chunks, f) }]
  const forms: [string, string, (m: Mod) => (f: Consumer) => Promise<void>][] = [
    ['parseSSE', '`parseSSE` (async iterable)', (m) => (f) => runDsh(m.parseSSE as ParseSSE, chunks, f)],
    ['createSSEParser', '`createSSEParser` + TextDecoder', (m) => (f) => runDshPush(m.createSSEParser as CreateSSEParser, chunks, f)],
    ['pumpSSE', '`pumpSSE` (callback form)', (m) => (f) => runDshPump(m.pumpSSE as PumpSSE, chunks, f)],
  ]
  for (const [fn, name, make] of forms) {
    for (let i = 0; i < mods.length; i++) {
      const why = lacks(mods[i], [fn])
      if (why) { res.notes.push(`${labels[i]} ${name}: ${why}`); continue }
      impls.push({ name: `${name} (${labels[i]})`, build: labels[i], form: fn, run: make(mods[i]) })
    }
  }
  const digests: { impl: (typeof impls)[number]; d: { events: number; sha256: string } }[] = []
  for (const impl of impls) digests.push({ impl, d: await digest(impl.run) })
  const ref = digests[0].d
  for (const { impl, d } of digests) if (d.sha256 !== ref.sha256) res.notes.push(`DIFFERENT EVENTS: ${impl.name} gave ${d.events} events ${d.sha256.slice(0, 12)}, createParser ${ref.events} ${ref.sha256.slice(0, 12)}`)
  if (!res.notes.some((n) => n.startsWith('DIFFERENT'))) res.notes.push(`same events from every parser (${ref.events.toLocaleString('en-US')} events, SHA-256 ${ref.sha256.slice(0, 12)}…)`)
  let sink = 0
  res.rows = await measure(impls.map((impl) => ({ name: impl.name, build: impl.build, fn: () => impl.run((e) => { sink += e.data.length }) })), cfg.sseRounds, 5)
  if (sink === 0) throw new Error('sse: no events')
  const base = res.rows[0]
  for (const [fn, name] of forms) {
    const rows = labels.map((l) => res.rows.find((r, k) => r.build === l && impls[k].form === fn))
    if (rows[0] && rows[1]) res.ratios.push(ratio(`${name} time, ${labels[0]} ÷ ${labels[1]}`, rows[0], rows[1]))
    rows.forEach((r, i) => { if (r) res.ratios.push({ name: `${labels[i]} ${name}: speed vs createParser (its time ÷ this one's; ≥ 1 = as fast)`, stats: paired(base.samples, r.samples) }) })
  }
  return res
}

/** Resume of one generated log: Session.load + resume() per iteration vs read + JSON.parse of every line. */
async function resumeFigure(mods: Mod[], labels: string[], cfg: CompareConfig): Promise<FigureResult> {
  const file = join(cfg.dir, 'resume.jsonl')
  writeLog(file, cfg.resumeBytes, String(mods[0].VERSION ?? '0.1.0'))
  const size = statSync(file).size
  const res: FigureResult = { figure: 'resume', title: `Resume of a ${(size / 1024 / 1024).toFixed(0)} MiB log (bench/logs.ts; in the page cache) vs chunked read + JSON.parse of every line`, unit: 'ms per resume', rows: [], ratios: [], notes: [] }
  const tasks: (BenchTask & { build?: string })[] = [{ name: 'read in 4 MiB chunks + JSON.parse every line', fn: () => { readAndParse(file) } }]
  try {
    for (let i = 0; i < mods.length; i++) {
      const m = mods[i]
      // Session.load (no lock, no writes) where the build has it; else a read-only Session.open
      // (`{ readOnly: true }`: the log is loaded and checked, no session/resume is written).
      const load = typeof m.Session?.load === 'function' ? (store: any) => m.Session.load(store)
        : typeof m.Session?.open === 'function' ? (store: any) => m.Session.open(store, { readOnly: true }) : undefined
      if (!load || typeof m.FileStore !== 'function') { res.notes.push(`${labels[i]}: n/a: no \`Session.load\` / \`Session.open\` and \`FileStore\``); continue }
      const once = async () => {
        const store = new m.FileStore(file, { readOnly: true })
        try { const s = await load(store); if (typeof s.resume === 'function') s.resume() } finally { await store.close() }
      }
      try { await once() } catch (err) { res.notes.push(`${labels[i]}: n/a: it cannot load this log (${(err as Error).message})`); continue }
      tasks.push({ name: `Session.load + resume (${labels[i]})`, build: labels[i], fn: once })
    }
    res.rows = await measure(tasks, cfg.resumeRounds, 1)
  } finally { rmSync(file, { force: true }) }
  const base = res.rows[0]
  const rows = labels.map((l) => res.rows.find((r) => r.build === l))
  if (rows[0] && rows[1]) res.ratios.push(ratio(`resume time, ${labels[0]} ÷ ${labels[1]}`, rows[0], rows[1]))
  rows.forEach((r, i) => { if (r) res.ratios.push(ratio(`${labels[i]}: resume ÷ read + parse`, r, base)) })
  return res
}

const cfg = JSON.parse(readFileSync(process.argv[2], 'utf8')) as CompareConfig
const mods: Mod[] = []
for (const b of cfg.builds) mods.push(await import(pathToFileURL(b.bundle).href))
const labels = cfg.builds.map((b) => b.label)
const results: FigureResult[] = []
for (const f of cfg.figures) {
  console.error(`── compare: ${f}`)
  if (f === 'step') results.push(await stepFigure(mods, labels, cfg))
  else if (f === 'sse') results.push(await sseFigure(mods, labels, 'recorded', cfg), await sseFigure(mods, labels, 'cjk', cfg))
  else if (f === 'resume') results.push(await resumeFigure(mods, labels, cfg))
}
process.stdout.write(JSON.stringify(results) + '\n')
