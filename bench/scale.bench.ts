// Long sessions at scale (docs/design.md §2, §4, §6): memory bounded by the surface, resume of any
// log size, adapter CPU per token. Each measurement runs in its own process (bench/scale-child.ts)
// so that peak RSS is its own. Generated logs (on a disk, not a tmpfs) are deleted afterwards.
// Durable steps (fsync on) are benchmark 9, bench/durable.bench.ts.
import { spawnSync } from 'node:child_process'
import { rmSync, statSync } from 'node:fs'
import { join } from 'node:path'
import * as esbuild from 'esbuild'
import { VERSION } from '../dsh.ts'
import { ROOT, diskTempDir, fmtBytes, fmtRatio, fmtTime, int, stats, table, type Section, type Target } from './lib.ts'
import { writeLog } from './logs.ts'

const MiB = 1024 * 1024
const HEAP_STEPS = Number(process.env.DSH_BENCH_HEAP_STEPS ?? 20_000)
const ADAPTER_TOKENS = 50_000
/** The 1 GiB and 2 GiB logs are opt-in (`npm run bench -- --big` sets this): minutes more on a shared machine. */
const BIG = process.env.DSH_BENCH_BIG === '1'
const SIZES = [10 * MiB, 100 * MiB, ...(BIG ? [1024 * MiB, 2048 * MiB] : [])]
/** Resume/floor pairs per log up to 128 MiB. */
const PAIRS_SMALL = 3
/**
 * Pairs per larger log: three, in alternating order, so that the median is not the mean of two. With
 * one pair the resume always read the freshly written file first and the floor second: a bias of up
 * to 2× against the resume at 1 GiB (2.12× in one run, 1.48× in the next) while the file's pages were
 * still being written back (bench/logs.ts now fsyncs the log it writes; a real log was fsynced step
 * by step).
 */
const PAIRS_BIG = 3
/** Issue 26: resume within this of the read + parse floor at 100 MiB, 1 GiB and 2 GiB. */
const RESUME_TARGET = 1.2
/** The V8 old-space cap (MB) of the second resume of each log: live memory must fit under it. */
const HEAP_CAP_MB = 32

function child(args: string[], nodeFlags: string[] = []): any {
  const r = spawnSync(process.execPath, [...nodeFlags, '--expose-gc', '--import', 'tsx', join(ROOT, 'bench', 'scale-child.ts'), ...args], { cwd: ROOT, encoding: 'utf8', maxBuffer: 64 * MiB, timeout: 280_000 })
  if (r.status !== 0) throw new Error(`scale-child ${args[0]} failed (${r.status ?? r.signal}): ${r.stderr.slice(-2000)}`)
  return JSON.parse(r.stdout.trim().split('\n').at(-1)!)
}

export default async function scale(): Promise<Section> {
  const { dir, fs } = diskTempDir('dsh-scale-')
  const tables: string[] = []
  const targets: Target[] = []
  try {
    // 1. Heap after GC per 1,000 steps, FileStore (fsync off: the disk does not change the heap).
    const heap = child(['heap', String(HEAP_STEPS), dir])
    const h: number[] = heap.heapMB
    const heapRatio = h[h.length - 1] / h[0]
    tables.push(table(['step', ...h.map((_, i) => int((i + 1) * 1000)).filter((_, i) => i === 0 || (i + 1) % 4 === 0 || i === h.length - 1)],
      [['heap after GC', ...h.filter((_, i) => i === 0 || (i + 1) % 4 === 0 || i === h.length - 1).map((mb) => `${mb.toFixed(1)} MB`)]]))
    targets.push({ name: 'heap per 1,000 steps (FileStore)', target: `flat within 2× from step 1,000 to ${int(HEAP_STEPS)}`, measured: `${h[0].toFixed(1)} → ${h[h.length - 1].toFixed(1)} MB (${fmtRatio(heapRatio)}; ${int(HEAP_STEPS)} steps in ${fmtTime(heap.ms)}, log ${fmtBytes(heap.logBytes)})`, met: heapRatio <= 2 })

    // 2. Resume against log size: resume and the floor in fresh processes, alternately, paired.
    const rows: string[][] = []
    const resumeOf = (bytes: number) => {
      const file = join(dir, `log-${bytes}.jsonl`)
      const events = writeLog(file, bytes, VERSION)
      const size = statSync(file).size
      const rs: any[] = [], bs: any[] = []
      // Untimed: one read of the whole file first, so that every timed run finds it in the page cache.
      child(['baseline', file])
      for (let i = 0; i < (size <= 128 * MiB ? PAIRS_SMALL : PAIRS_BIG); i++) {
        if (i % 2 === 0) { rs.push(child(['resume', file])); bs.push(child(['baseline', file])) } else { bs.push(child(['baseline', file])); rs.push(child(['resume', file])) }
      }
      // The same resume with V8's heap capped: it still works when only the surface and metadata are live.
      const capped = child(['resume', file], [`--max-old-space-size=${HEAP_CAP_MB}`])
      rmSync(file)
      const ratio = stats(rs.map((x, i) => x.ms / bs[i].ms))
      const cpuRatio = stats(rs.map((x, i) => x.cpuMs / bs[i].cpuMs))
      const mid = (xs: any[]) => xs.slice().sort((p, q) => p.ms - q.ms)[xs.length >> 1]
      const r = mid(rs), b = mid(bs)
      rows.push([fmtBytes(size), int(events), String(rs.length), fmtTime(r.ms), `${r.rssMB.toFixed(0)} MB (${(r.rssMB - r.startMB).toFixed(0)} over start)`, fmtTime(b.ms), `${b.rssMB.toFixed(0)} MB (${(b.rssMB - b.startMB).toFixed(0)} over start)`,
        rs.length > 1 ? `${fmtRatio(ratio.median)} (${fmtRatio(ratio.min)}–${fmtRatio(ratio.max)})` : fmtRatio(ratio.median),
        `${fmtRatio(cpuRatio.median)} (${fmtRatio(cpuRatio.min)}–${fmtRatio(cpuRatio.max)})`, `${capped.rssMB.toFixed(0)} MB, ${fmtTime(capped.ms)}`, `${r.surfaceNodes} nodes, ${fmtBytes(r.surfaceBytes)}`])
      return { size, r, b, ratio: ratio.median, capped }
    }
    const bySize = SIZES.map(resumeOf)
    tables.push(table(['log', 'events', 'pairs', 'resume (median)', 'peak RSS', 'read + JSON.parse every line (median)', 'its peak RSS', 'resume ÷ floor (paired)', 'the same in CPU time (user + system, paired)', `resume with the V8 heap capped at ${HEAP_CAP_MB} MB: peak RSS, time`, 'surface left'], rows))
    if (!BIG) tables.push(`The 1 GiB and 2 GiB logs are opt-in (\`npm run bench -- --big\`, or DSH_BENCH_BIG=1): with them this benchmark takes 2–3 minutes longer on this shared machine.`)
    const perMB = bySize.map(({ size, r }) => r.ms / (size / MiB))
    const rssSpread = Math.max(...bySize.map((x) => x.r.rssMB)) / Math.min(...bySize.map((x) => x.r.rssMB))
    const largest = bySize[bySize.length - 1]
    const rssLimit = 2 * (largest.r.surfaceBytes / MiB) + 64
    const targetSizes = bySize.filter((x) => x.size >= 100 * MiB)
    targets.push({ name: 'resume vs the read + parse floor', target: `≤ ${RESUME_TARGET}× at 100 MiB, 1 GiB and 2 GiB${BIG ? '' : ' (1 and 2 GiB not run: opt-in)'}`,
      measured: targetSizes.map((x) => `${fmtRatio(x.ratio)} at ${fmtBytes(x.size)}`).join(', '), met: targetSizes.every((x) => x.ratio <= RESUME_TARGET) })
    targets.push({ name: `resume of a ${fmtBytes(largest.size)} log (the largest run)`, target: 'works; peak RSS ≤ 2× the surface + 64 MB over the process\'s start',
      measured: `${fmtTime(largest.r.ms)}; peak RSS ${largest.r.rssMB.toFixed(0)} MB, ${(largest.r.rssMB - largest.r.startMB).toFixed(0)} MB over the process's start (limit ${rssLimit.toFixed(0)} MB; the floor itself peaks ${(largest.b.rssMB - largest.b.startMB).toFixed(0)} MB over its start); with the V8 heap capped at ${HEAP_CAP_MB} MB: ${largest.capped.rssMB.toFixed(0)} MB peak, ${fmtTime(largest.capped.ms)}`,
      met: largest.r.rssMB - largest.r.startMB <= rssLimit })
    targets.push({ name: `resume vs log size (${bySize.map((x) => fmtBytes(x.size)).join(' → ')})`, target: 'linear in the file for time, flat for memory',
      measured: `${perMB.map((x) => x.toFixed(2)).join(' / ')} ms per MiB; peak RSS ${bySize.map((x) => x.r.rssMB.toFixed(0)).join(' / ')} MB (spread ${fmtRatio(rssSpread)})`, met: Math.max(...perMB) / Math.min(...perMB) <= 1.5 && rssSpread <= 1.5 })

    // 3. Adapter CPU per streamed token against decode + split + JSON.parse of the same bytes.
    const bundle = join(dir, 'dsh.mjs')
    await esbuild.build({ entryPoints: [join(ROOT, 'dsh.ts')], bundle: true, format: 'esm', platform: 'neutral', external: ['node:*'], outfile: bundle, logLevel: 'error' })
    const a = child(['adapter', String(ADAPTER_TOKENS), bundle])
    const ratios = (a.adapterMs as number[]).map((ms, i) => ms / a.floorMs[i])
    const rs = stats(ratios)
    const usPer = (ms: number) => (ms * 1000 / ADAPTER_TOKENS).toFixed(2)
    tables.push(table(['streamed tokens', 'adapter CPU per token', 'floor (decode + split + JSON.parse) per token', 'ratio (paired median, min–max)'], [[int(ADAPTER_TOKENS), `${usPer(stats(a.adapterMs).median)} µs`, `${usPer(stats(a.floorMs).median)} µs`, `${fmtRatio(rs.median)} (${fmtRatio(rs.min)}–${fmtRatio(rs.max)})`]]))
    targets.push({ name: 'adapter CPU per token', target: '≤ 1.3× the decode + split + parse floor (issue 26)', measured: `${fmtRatio(rs.median)} (${usPer(stats(a.adapterMs).median)} vs ${usPer(stats(a.floorMs).median)} µs)`, met: rs.median <= 1.3 })
  } finally {
    rmSync(dir, { recursive: true, force: true })
  }
  return {
    id: 'scale', title: 'Long sessions at scale', status: 'ran', tables, targets,
    method: [
      `**Heap**: an Agent on a FileStore (fsync switched off: it does not change the heap) runs ${int(HEAP_STEPS)} steps of an in-process`,
      'provider (nine `read_file` calls of ~2.3 KB per turn, then an answer; window 32,000 tokens, so the ladder prunes and compacts as',
      'it goes); `heapUsed` after a forced GC every 1,000 steps.',
      `**Resume**: generated logs (bench/logs.ts, in a temp dir on the disk, ${fs}; just written, so read from the page cache; turns`,
      'of one ~96 KiB tool result, a tenth of them CJK/emoji, each turn compacted into one checkpoint so that every original is',
      'shadowed) are loaded with `Session.load` + `resume()` in a fresh process; baseline: a fresh process',
      'that reads the same file in 4 MiB chunks and `JSON.parse`s every line once (bench/logs.ts); resume and floor alternate, paired,',
      `${PAIRS_SMALL} pairs per log up to 128 MiB, ${PAIRS_BIG} above, in alternating order, after one untimed read of the file (fsynced`,
      'when written, as a session\'s log is). CPU time = `process.cpuUsage()` of the process (user + system, its GC threads included):',
      'less moved by the other work on the machine than the wall time the target is judged by. Peak RSS = `process.resourceUsage().maxRSS`.',
      'Durable steps (fsync on) are benchmark 9.',
      `**Adapter**: ${int(ADAPTER_TOKENS)} DeepSeek-shaped text chunks streamed through \`openAICompatible\` (esbuild bundle, an in-process`,
      '`fetch` answering a ReadableStream of 1 KiB chunks) against a floor that decodes the same chunks, splits lines and `JSON.parse`s',
      'each data line; CPU time (`process.cpuUsage`), 8 interleaved pairs after a warm-up.',
    ].join('\n'),
  }
}
