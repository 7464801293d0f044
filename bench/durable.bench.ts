// Benchmark 9 (issue 26): the durable step. An Agent on a FileStore (fsync on) on the machine's disk,
// 20,000 steps of an in-process scripted provider, timed in blocks of 1,000 steps, each block paired
// with the floor — raw writeSync + fsyncSync of the same bytes, one write and one fsync per step —
// in the same process, the floor alternately before and after the block. Then a CPU profile of the
// steps, top frames by self time, so that whoever speeds FileStore.append up sees where a step goes.
import { spawnSync } from 'node:child_process'
import { readFileSync, rmSync } from 'node:fs'
import { join } from 'node:path'
import { buildWorkingTree, bundleScript } from './builds.ts'
import { ROOT, diskTempDir, fmtPct, fmtRatio, fmtTime, int, stats, table, type Section, type Target } from './lib.ts'
import { topFrames, type CpuProfile } from './profile.ts'

const STEPS = Number(process.env.DSH_BENCH_DURABLE_STEPS ?? 20_000)
const BLOCK = Math.min(1000, STEPS)
const PROFILE_STEPS = Number(process.env.DSH_BENCH_PROFILE_STEPS ?? 2_000)
const TOP_FRAMES = 15, TOP_DSH = 10
/** Targets of issue 26: the step within this of the floor, and flat (last block's ratio within FLAT of the first's). */
const STEP_TARGET = 1.5, FLAT = 1.2

/** Runs the child script (bundled: plain node, no tsx loader in the measured process). */
function child(script: string, args: string[]): any {
  const r = spawnSync(process.execPath, ['--expose-gc', script, ...args], { cwd: ROOT, encoding: 'utf8', maxBuffer: 64 * 1024 * 1024, timeout: 550_000 })
  if (r.status !== 0) throw new Error(`durable-child ${args[0]} failed (${r.status ?? r.signal}): ${r.stderr.slice(-2000)}`)
  return JSON.parse(r.stdout.trim().split('\n').at(-1)!)
}

interface Block { steps: number; bytes: number; syncs: number; dshMs: number; rawMs: number }

export default async function durable(): Promise<Section> {
  const { dir, fs } = diskTempDir('dsh-durable-')
  const tables: string[] = []
  const targets: Target[] = []
  try {
    const build = await buildWorkingTree(dir)
    const script = await bundleScript(join(ROOT, 'bench', 'durable-child.ts'), dir, 'durable-child')
    const { blocks } = child(script, ['run', String(STEPS), String(BLOCK), dir, build.bundle]) as { blocks: Block[] }
    const ratios = blocks.map((b) => b.dshMs / b.rawMs)
    const at = (i: number) => {
      const b = blocks[i], from = blocks.slice(0, i).reduce((n, x) => n + x.steps, 0)
      return [`${int(from + 1)}–${int(from + b.steps)}`, `${(b.dshMs / b.steps).toFixed(3)} ms`, `${(b.rawMs / b.steps).toFixed(3)} ms`, fmtRatio(b.dshMs / b.rawMs), `${int(b.bytes / b.steps)} B`, (b.syncs / b.steps).toFixed(2)]
    }
    const picks = [...new Set([0, Math.floor((blocks.length - 1) / 2), blocks.length - 1])]
    const steps = blocks.reduce((n, b) => n + b.steps, 0)
    const syncs = blocks.reduce((n, b) => n + b.syncs, 0)
    const r = stats(ratios)
    tables.push(table(['steps', 'dsh per step', 'floor per step (write + fsync)', 'ratio', 'bytes per step', 'fsyncs per step'],
      [...picks.map((i) => at(i)), [`all ${int(steps)} (${blocks.length} block${blocks.length === 1 ? '' : 's'})`, `${(blocks.reduce((n, b) => n + b.dshMs, 0) / steps).toFixed(3)} ms`, `${(blocks.reduce((n, b) => n + b.rawMs, 0) / steps).toFixed(3)} ms`, `${fmtRatio(r.median)} median of blocks (${fmtRatio(r.min)}–${fmtRatio(r.max)})`, `${int(blocks.reduce((n, b) => n + b.bytes, 0) / steps)} B`, (syncs / steps).toFixed(2)]]))
    const flat = ratios[ratios.length - 1] / ratios[0]
    targets.push({ name: 'durable step vs raw write + fsync of the same bytes', target: `≤ ${STEP_TARGET}× (median over blocks of ${int(BLOCK)} steps)`, measured: `${fmtRatio(r.median)} (${fmtRatio(r.min)}–${fmtRatio(r.max)}); ${(blocks.reduce((n, b) => n + b.dshMs, 0) / steps).toFixed(2)} vs ${(blocks.reduce((n, b) => n + b.rawMs, 0) / steps).toFixed(2)} ms per step`, met: r.median <= STEP_TARGET })
    targets.push({ name: `flat over ${int(steps)} steps`, target: `ratio in the last ${int(BLOCK)} steps within ${FLAT}× of the first ${int(BLOCK)}`, measured: `${fmtRatio(ratios[ratios.length - 1])} vs ${fmtRatio(ratios[0])} (${fmtRatio(flat)}); middle ${fmtRatio(ratios[Math.floor((ratios.length - 1) / 2)])}`, met: flat <= FLAT })
    targets.push({ name: 'fsyncs per step', target: '= 1', measured: (syncs / steps).toFixed(2), met: syncs === steps })

    // The profile of the steps: where a step's time goes.
    const p = child(script, ['profile', String(PROFILE_STEPS), dir, build.bundle])
    const frames = topFrames(JSON.parse(readFileSync(join(dir, 'steps.cpuprofile'), 'utf8')) as CpuProfile)
    const busy = frames.filter((f) => f.name !== '(idle)').reduce((n, f) => n + f.selfMs, 0)
    const idle = frames.find((f) => f.name === '(idle)')
    tables.push(`**Profile** of ${int(p.steps)} steps (${(p.ms / p.steps).toFixed(3)} ms per step under the profiler, after ${int(p.warmupSteps)} warm-up steps; sampled every ${p.intervalUs} µs). ` +
      `The main thread was idle ${fmtPct(idle?.share ?? 0)} of the time (waiting for the disk: fsync and the writes run on libuv's thread pool) and busy ${fmtTime(busy / p.steps)} per step. Top ${TOP_FRAMES} frames by self time:\n\n` +
      table(['#', 'frame', 'where', 'self time', 'self per step', 'total per step (sync callees)', 'share of the profile', 'share of busy time'],
        frames.slice(0, TOP_FRAMES).map((f, i) => [String(i + 1), `\`${f.name}\``, f.where || '—', fmtTime(f.selfMs), fmtTime(f.selfMs / p.steps), !f.where ? '—' : fmtTime(f.totalMs / p.steps), fmtPct(f.share), f.name === '(idle)' ? '—' : fmtPct(f.selfMs / busy)])))
    const dsh = frames.filter((f) => f.where.startsWith('dsh.ts:')).sort((a, b) => b.totalMs - a.totalMs).slice(0, TOP_DSH)
    tables.push(`dsh.ts frames of the same profile by total time (the frame and its synchronous callees; time after an \`await\` is not linked back to the caller):\n\n` +
      table(['frame', 'where', 'total per step', 'self per step'], dsh.map((f) => [`\`${f.name}\``, f.where, fmtTime(f.totalMs / p.steps), fmtTime(f.selfMs / p.steps)])))
  } finally {
    rmSync(dir, { recursive: true, force: true })
  }
  return {
    id: 'durable', title: 'Durable steps', status: 'ran', tables, targets,
    method: [
      `An Agent on a \`FileStore\` (fsync on) in a temp dir on the disk (${fs}; never a tmpfs, where fsync is free) runs ${int(STEPS)} steps`,
      'of an in-process scripted provider (bench/steps.ts: nine `read_file` calls of ~2.3 KB per turn, then an answer; window 32,000',
      'tokens, so the ladder prunes and compacts as it goes), the esbuild bundle of dsh.ts, in a fresh plain `node` process',
      '(bench/durable-child.ts, bundled too: under tsx every dynamic `import()` would go through its loader thread).',
      'Each turn (10 steps) is paired with the **floor**: the turn\'s bytes written as one equal line per step, one `writeSync` +',
      '`fsyncSync` each, in the same process, alternately after and before the turn — per turn, because this disk\'s fsync latency',
      `moves within a second (0.2–3 ms per fsync). Sums per block of ${int(BLOCK)} steps; rows: the first, middle and last block, then all.`,
      `**Profile**: a second process runs ${int(PROFILE_STEPS)} steps under V8's sampling CPU profiler (the profiler of \`node --cpu-prof\`,`,
      'started through node:inspector after the warm-up so that only steps are sampled); frames of the bundle are mapped back to',
      'dsh.ts lines through its source map (bench/profile.ts). Self time = time the frame itself was on top of the stack.',
    ].join('\n'),
  }
}
