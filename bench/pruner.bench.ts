// Benchmark 1 (issue 7): pruneText on ASCII and emoji text of 10 KiB, 1 MiB and 100 MiB against the
// obvious approach, `Array.from` over the whole text. Targets: dsh flat in the size (100 MiB within
// 2× of 10 KiB) and ≥ 100× faster than the baseline at 1 MiB.
import { spawnSync } from 'node:child_process'
import { join } from 'node:path'
import { DEFAULT_PRUNE_CONFIG, PRUNE_MARKER, pruneText, type PruneConfig } from '../dsh.ts'
import { ROOT, fmtBytes, fmtRatio, fmtStats, fmtTime, gc, interleaved, nowMs, paired, stats, table, type Section, type Stats, type Target, type Task } from './lib.ts'
import { PRUNE_SIZES, makeText, utf8Bytes, type TextKind } from './text-inputs.ts'

/**
 * The baseline: the obvious code-point-safe prune. `Array.from` splits the whole text into code
 * points (so no surrogate pair is split), then slices the head and the tail. O(text length) time
 * and memory. Same output as dsh's pruneText with the same config.
 */
export function pruneArrayFrom(text: string, cfg: PruneConfig = DEFAULT_PRUNE_CONFIG): string {
  const cps = Array.from(text)
  if (cps.length <= cfg.thresholdChars) return text
  return cps.slice(0, cfg.headChars).join('') + PRUNE_MARKER + cps.slice(cps.length - cfg.tailChars).join('')
}

/** The baseline is not run above this size: its array of code points would take gigabytes. */
const BASELINE_MAX_BYTES = 16 * 1024 * 1024

interface Row { kind: TextKind; label: string; bytes: number; units: number; pruned: boolean; dsh: Stats; base?: Stats; identical?: boolean }
interface Memory { extraPeak: number; retainedAfterDrop: number }

function memoryProbe(impl: 'dsh' | 'array-from', kind: TextKind, bytes: number): Memory | string {
  const child = spawnSync(process.execPath, ['--expose-gc', '--import', 'tsx', join(ROOT, 'bench', 'pruner-memory.ts'), impl, kind, String(bytes)], {
    cwd: ROOT, encoding: 'utf8', timeout: 120_000,
  })
  if (child.status !== 0) return `probe failed: ${(child.stderr || child.error?.message || '').trim().split('\n').pop()}`
  return JSON.parse(child.stdout.trim().split('\n').pop()!) as Memory
}

/** One sample: `calls` calls of `fn`, timed together; returns ms per call. */
function batched(fn: () => number, calls: number): () => number {
  return () => {
    const t0 = nowMs()
    let n = 0
    for (let i = 0; i < calls; i++) n += fn()
    const per = (nowMs() - t0) / calls
    if (n === 0) throw new Error('nothing was pruned')
    return per
  }
}

const ROUNDS = 21

export default async function pruner(): Promise<Section> {
  // Warm up on both string representations first (one-byte ASCII, two-byte emoji), so that every
  // case is timed in the same JIT state: an agent prunes both kinds in one process.
  for (const kind of ['ascii', 'emoji'] as const) {
    for (const bytes of [10 * 1024, 1024 * 1024]) {
      const t = makeText(kind, bytes)
      for (let i = 0; i < 2000; i++) pruneText(t)
      for (let i = 0; i < (bytes > 16 * 1024 ? 3 : 200); i++) pruneArrayFrom(t)
    }
  }
  const rows: Row[] = []
  const flatness = new Map<TextKind, Stats>()
  const speedup = new Map<TextKind, Stats>()
  for (const kind of ['ascii', 'emoji'] as const) {
    // All sizes of one kind at once (≈ 100 MiB ASCII or 175 MiB of UTF-16 emoji), timed in
    // interleaved rounds so that the ratios between sizes are taken under the same load.
    const texts = PRUNE_SIZES.map((size) => makeText(kind, size.bytes))
    const tasks: Task[] = []
    PRUNE_SIZES.forEach((size, i) => tasks.push({ name: `dsh ${size.label}`, sample: batched(() => pruneText(texts[i]).length, 200) }))
    PRUNE_SIZES.forEach((size, i) => {
      if (size.bytes <= BASELINE_MAX_BYTES) tasks.push({ name: `array-from ${size.label}`, sample: batched(() => pruneArrayFrom(texts[i]).length, size.bytes > 64 * 1024 ? 1 : 50) })
    })
    const samples = interleaved(tasks, ROUNDS)
    const of = (name: string) => samples[tasks.findIndex((t) => t.name === name)]
    PRUNE_SIZES.forEach((size, i) => {
      const t = texts[i]
      const base = size.bytes <= BASELINE_MAX_BYTES ? stats(of(`array-from ${size.label}`)) : undefined
      rows.push({
        kind, label: size.label, bytes: utf8Bytes(t), units: t.length, pruned: pruneText(t) !== t,
        dsh: stats(of(`dsh ${size.label}`)), base, identical: base ? pruneText(t) === pruneArrayFrom(t) : undefined,
      })
    })
    flatness.set(kind, paired(of('dsh 100 MiB'), of('dsh 10 KiB')))
    speedup.set(kind, paired(of('array-from 1 MiB'), of('dsh 1 MiB')))
  }
  gc()
  const memory = new Map<string, Memory | string>()
  for (const kind of ['ascii', 'emoji'] as const) {
    for (const size of PRUNE_SIZES) {
      memory.set(`dsh ${kind} ${size.label}`, memoryProbe('dsh', kind, size.bytes))
      if (size.bytes <= BASELINE_MAX_BYTES) memory.set(`array-from ${kind} ${size.label}`, memoryProbe('array-from', kind, size.bytes))
    }
  }

  const timeRows = rows.map((r) => [
    r.kind, r.label, `${fmtBytes(r.bytes)} / ${r.units.toLocaleString('en-US')} units${r.pruned ? '' : ' (≤ threshold: not pruned)'}`,
    fmtStats(r.dsh), r.base ? fmtStats(r.base) : `not run (> ${fmtBytes(BASELINE_MAX_BYTES)}: an array of ~${Math.round(r.units / 1e6)}M strings)`,
    r.base ? fmtRatio(r.base.median / r.dsh.median) : '—',
    r.identical === undefined ? '—' : r.identical ? 'yes' : '**NO**',
  ])
  const mem = (key: string) => {
    const m = memory.get(key)
    if (m === undefined) return 'not run'
    if (typeof m === 'string') return m
    const small = (b: number) => (Math.abs(b) < 256 * 1024 ? '< 256 KiB' : fmtBytes(b))
    return `${small(m.extraPeak)} peak, ${small(m.retainedAfterDrop)} kept`
  }
  const memRows = rows.map((r) => [r.kind, r.label, mem(`dsh ${r.kind} ${r.label}`), mem(`array-from ${r.kind} ${r.label}`)])

  const targets: Target[] = []
  for (const kind of ['ascii', 'emoji'] as const) {
    const small = rows.find((r) => r.kind === kind && r.label === '10 KiB')!
    const big = rows.find((r) => r.kind === kind && r.label === '100 MiB')!
    const mid = rows.find((r) => r.kind === kind && r.label === '1 MiB')!
    const flat = flatness.get(kind)!
    const why = small.pruned ? '' : `; the 10 KiB text is under the threshold, so that call only counts; 100 MiB vs 1 MiB: ${fmtRatio(big.dsh.median / mid.dsh.median)}`
    targets.push({ name: `flat in size (${kind})`, target: '100 MiB within 2× of 10 KiB', measured: `${fmtRatio(flat.median)} (paired, ${fmtRatio(flat.min)}–${fmtRatio(flat.max)}; ${fmtTime(big.dsh.median)} vs ${fmtTime(small.dsh.median)} per call${why})`, met: flat.median <= 2 })
    const up = speedup.get(kind)!
    targets.push({ name: `vs Array.from at 1 MiB (${kind})`, target: '≥ 100× faster', measured: `${fmtRatio(up.median)} (paired, ${fmtRatio(up.min)}–${fmtRatio(up.max)})`, met: up.median >= 100 })
  }

  return {
    id: 'pruner', title: 'Pruner', status: 'ran', targets,
    method: [
      '`pruneText(text)` with the default config (threshold 8,192, head 4,096, tail 1,024 code points) on seeded tool output',
      '(bench/text-inputs.ts): **ascii** = pytest/grep-like lines; **emoji** = status lines with astral emoji (surrogate pairs,',
      'a skin-tone modifier, a flag), box drawing and accents. Sizes are UTF-8 bytes; "units" are UTF-16 code units (`length`).',
      'Baseline `pruneArrayFrom` (in bench/pruner.bench.ts): `Array.from(text)` then slice head and tail — the obvious',
      'code-point-safe code; its output is checked identical to dsh\'s. Both are warmed up on both kinds of text first.',
      `Time per call: median (min–max) of ${ROUNDS} interleaved rounds (bench/lib.ts \`interleaved\`: every case of one kind of text once`,
      'per round, in rotating order, garbage collected before each); one sample times a batch of calls (dsh 200, baseline 50',
      'at 10 KiB and 1 at 1 MiB) and counts the mean per call. The target ratios are paired: taken within each round, then',
      'their median (min–max), so that load from other work on the machine hits both sides of a ratio alike.',
      'Memory: each case in a fresh `node --expose-gc` process (bench/pruner-memory.ts). "peak" = peak RSS − RSS with the input',
      'built and collected (an upper bound of what one call adds); "kept" = heap still used when the caller keeps only the',
      'result and drops the input.',
    ].join('\n'),
    tables: [
      table(['text', 'size', 'input', 'dsh per call', 'Array.from per call', 'speed-up', 'same output'], timeRows),
      table(['text', 'size', 'dsh memory', 'Array.from memory'], memRows),
    ],
  }
}
