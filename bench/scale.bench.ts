// Long sessions at scale (docs/design.md §2, §4, §6): memory bounded by the surface, resume of any
// log size, one fsync per step, adapter CPU per token. Each measurement runs in its own process
// (bench/scale-child.ts) so that peak RSS is its own. Generated logs are deleted afterwards.
import { spawnSync } from 'node:child_process'
import { closeSync, mkdtempSync, openSync, rmSync, statSync, writeSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import * as esbuild from 'esbuild'
import { VERSION } from '../dsh.ts'
import { ROOT, fmtBytes, fmtRatio, fmtTime, int, stats, table, type Section, type Target } from './lib.ts'

const MiB = 1024 * 1024
const HEAP_STEPS = Number(process.env.DSH_BENCH_HEAP_STEPS ?? 20_000)
const DURABLE_STEPS = 300
const ADAPTER_TOKENS = 50_000
const SIZES = [10 * MiB, 100 * MiB, 1024 * MiB]
const BIG = Number(process.env.DSH_BENCH_BIG_BYTES ?? 2048 * MiB)
/** The V8 old-space cap (MB) of the second resume of each log: live memory must fit under it. */
const HEAP_CAP_MB = 32

function child(args: string[], nodeFlags: string[] = []): any {
  const r = spawnSync(process.execPath, [...nodeFlags, '--expose-gc', '--import', 'tsx', join(ROOT, 'bench', 'scale-child.ts'), ...args], { cwd: ROOT, encoding: 'utf8', maxBuffer: 64 * MiB, timeout: 280_000 })
  if (r.status !== 0) throw new Error(`scale-child ${args[0]} failed (${r.status ?? r.signal}): ${r.stderr.slice(-2000)}`)
  return JSON.parse(r.stdout.trim().split('\n').at(-1)!)
}

/**
 * Writes a valid dsh log of about `bytes` bytes: turns of one tool call with a ~96 KiB result (a
 * tenth of them non-ASCII), each followed by a compaction whose checkpoint replaces the whole
 * surface — the shape of a long session whose originals are all shadowed. The surface left is one
 * checkpoint. Written with large synchronous writes; returns the event count.
 */
function writeLog(file: string, bytes: number): number {
  const fd = openSync(file, 'w')
  let seq = 0, written = 0, buf: string[] = [], bufLen = 0
  const put = (type: string, data: unknown) => {
    const line = JSON.stringify({ seq: seq++, type, time: 1_700_000_000_000 + seq, data }) + '\n'
    buf.push(line); bufLen += line.length
    if (bufLen > 8 * MiB) { const b = Buffer.from(buf.join('')); writeSync(fd, b); written += b.length; buf = []; bufLen = 0 }
  }
  put('session/start', { id: 'bench', version: VERSION })
  put('request/header', { model: 'bench', baseURL: 'memory://bench', system: 'You are a bench.', tools: [], maxTokens: 1000, contextWindow: 32_000 })
  const ascii = 'export function f(x: number): number { return x * 2 } // line of code\n'.repeat(1400)
  const mixed = '北京市 😊 données — ünïcödé text, 日本語のテキスト\n'.repeat(2200)
  let head = -1
  for (let turn = 1; written + bufLen < bytes; turn++) {
    put('turn/start', { turn })
    const user = seq; put('user/message', { message: { role: 'user', content: `task ${turn}` }, surfaceOp: { op: 'append' } })
    put('step/start', { turn, step: 1 })
    put('assistant/message', { message: { role: 'assistant', content: [{ type: 'tool-call', id: `c${turn}`, name: 'read_file', arguments: `{"path":"src/f${turn}.ts"}` }] }, finishReason: 'tool_calls', surfaceOp: { op: 'append' } })
    put('tool/call', { callId: `c${turn}`, name: 'read_file' })
    put('tool/result', { message: { role: 'tool', toolCallId: `c${turn}`, content: [{ type: 'text', text: turn % 10 === 0 ? mixed : ascii }] }, surfaceOp: { op: 'append' } })
    put('step/end', { turn, step: 1 })
    put('step/start', { turn, step: 2 })
    const last = seq; put('assistant/message', { message: { role: 'assistant', content: [{ type: 'text', text: `done ${turn}` }] }, finishReason: 'stop', surfaceOp: { op: 'append' } })
    put('step/end', { turn, step: 2 })
    put('turn/end', { turn, reason: 'stop' })
    const id = `k${turn}`
    put('compaction/start', { id, trigger: 'pressure' })
    put('compaction/summary', { id, summary: `checkpoint ${turn}`, shadowedSeqs: [], shadowedTokenCount: 0, model: 'bench' })
    const start = head >= 0 ? head : user
    head = seq; put('user/message', { message: { role: 'user', content: `<compacted-summary>checkpoint ${turn}</compacted-summary>` }, surfaceOp: { op: 'replace', start, end: last } })
    put('compaction/end', { id })
  }
  const b = Buffer.from(buf.join('')); writeSync(fd, b)
  closeSync(fd)
  return seq
}

export default async function scale(): Promise<Section> {
  const dir = mkdtempSync(join(tmpdir(), 'dsh-scale-'))
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

    // 2. Resume against log size, and one very large log.
    const rows: string[][] = []
    const resumeOf = (bytes: number) => {
      const file = join(dir, `log-${bytes}.jsonl`)
      const events = writeLog(file, bytes)
      const size = statSync(file).size
      const r = child(['resume', file])
      const b = child(['baseline', file])
      // The same resume with V8's heap capped: it still works when only the surface and metadata are live.
      const capped = child(['resume', file], [`--max-old-space-size=${HEAP_CAP_MB}`])
      rmSync(file)
      rows.push([fmtBytes(size), int(events), fmtTime(r.ms), `${r.rssMB.toFixed(0)} MB (${(r.rssMB - r.startMB).toFixed(0)} over start)`, fmtTime(b.ms), `${b.rssMB.toFixed(0)} MB (${(b.rssMB - b.startMB).toFixed(0)} over start)`, fmtRatio(r.ms / b.ms), `${capped.rssMB.toFixed(0)} MB, ${fmtTime(capped.ms)}`, `${r.surfaceNodes} nodes, ${fmtBytes(r.surfaceBytes)}`])
      return { size, r, b, capped }
    }
    const bySize = SIZES.map(resumeOf)
    const big = resumeOf(BIG)
    tables.push(table(['log', 'events', 'resume', 'peak RSS', 'read + JSON.parse every line', 'its peak RSS', 'resume ÷ baseline', `resume with the V8 heap capped at ${HEAP_CAP_MB} MB: peak RSS, time`, 'surface left'], rows))
    const perMB = bySize.map(({ size, r }) => r.ms / (size / MiB))
    const rssSpread = Math.max(...bySize.map((x) => x.r.rssMB)) / Math.min(...bySize.map((x) => x.r.rssMB))
    const rssLimit = 2 * (big.r.surfaceBytes / MiB) + 64
    targets.push({ name: `resume of a ${fmtBytes(big.size)} log`, target: 'works; peak RSS ≤ 2× the surface + 64 MB; time ≤ 1.5× reading and JSON-parsing every line once',
      measured: `${fmtTime(big.r.ms)}, ${fmtRatio(big.r.ms / big.b.ms)} of the baseline; peak RSS ${big.r.rssMB.toFixed(0)} MB, ${(big.r.rssMB - big.r.startMB).toFixed(0)} MB over the process's start (limit ${rssLimit.toFixed(0)} MB; the baseline itself peaks ${(big.b.rssMB - big.b.startMB).toFixed(0)} MB over its start); with the V8 heap capped at ${HEAP_CAP_MB} MB: ${big.capped.rssMB.toFixed(0)} MB peak, ${fmtTime(big.capped.ms)}`,
      met: big.r.rssMB - big.r.startMB <= rssLimit && big.r.ms / big.b.ms <= 1.5 })
    targets.push({ name: 'resume vs log size (10 MB → 1 GB)', target: 'linear in the file for time, flat for memory',
      measured: `${perMB.map((x) => x.toFixed(2)).join(' / ')} ms per MiB; peak RSS ${bySize.map((x) => x.r.rssMB.toFixed(0)).join(' / ')} MB (spread ${fmtRatio(rssSpread)})`, met: Math.max(...perMB) / Math.min(...perMB) <= 1.5 && rssSpread <= 1.5 })

    // 3. Durable steps: fsyncs per step, time against raw write + fsync of the same bytes.
    const d = child(['durable', String(DURABLE_STEPS), dir])
    const syncsPerStep = (d.syncs - 1) / d.steps // the first sync is Session.open's
    const durRatio = d.dshMs / d.rawMs
    tables.push(table(['steps', 'fsyncs (after open)', 'dsh steps with fsync', 'raw write + fsync (same bytes per step)', 'ratio'], [[int(d.steps), int(d.syncs - 1), `${fmtTime(d.dshMs)} (${(d.steps / (d.dshMs / 1000)).toFixed(0)} steps/s)`, `${fmtTime(d.rawMs)} (${(d.steps / (d.rawMs / 1000)).toFixed(0)} /s)`, fmtRatio(durRatio)]]))
    targets.push({ name: 'fsyncs per step', target: '= 1', measured: syncsPerStep.toFixed(2), met: syncsPerStep === 1 })
    targets.push({ name: 'durable steps/s', target: 'within 1.2× of raw write + fsync', measured: `${fmtRatio(durRatio)} (${(d.dshMs / d.steps).toFixed(2)} vs ${(d.rawMs / d.steps).toFixed(2)} ms per step)`, met: durRatio <= 1.2 })

    // 4. Adapter CPU per streamed token against decode + split + JSON.parse of the same bytes.
    const bundle = join(dir, 'dsh.mjs')
    await esbuild.build({ entryPoints: [join(ROOT, 'dsh.ts')], bundle: true, format: 'esm', platform: 'neutral', external: ['node:*'], outfile: bundle, logLevel: 'error' })
    const a = child(['adapter', String(ADAPTER_TOKENS), bundle])
    const ratios = (a.adapterMs as number[]).map((ms, i) => ms / a.floorMs[i])
    const rs = stats(ratios)
    const usPer = (ms: number) => (ms * 1000 / ADAPTER_TOKENS).toFixed(2)
    tables.push(table(['streamed tokens', 'adapter CPU per token', 'floor (decode + split + JSON.parse) per token', 'ratio (paired median, min–max)'], [[int(ADAPTER_TOKENS), `${usPer(stats(a.adapterMs).median)} µs`, `${usPer(stats(a.floorMs).median)} µs`, `${fmtRatio(rs.median)} (${fmtRatio(rs.min)}–${fmtRatio(rs.max)})`]]))
    targets.push({ name: 'adapter CPU per token', target: '≤ 1.5× the decode + split + parse floor', measured: `${fmtRatio(rs.median)} (${usPer(stats(a.adapterMs).median)} vs ${usPer(stats(a.floorMs).median)} µs)`, met: rs.median <= 1.5 })
  } finally {
    rmSync(dir, { recursive: true, force: true })
  }
  return {
    id: 'scale', title: 'Long sessions at scale', status: 'ran', tables, targets,
    method: [
      `**Heap**: an Agent on a FileStore (fsync switched off: it does not change the heap) runs ${int(HEAP_STEPS)} steps of an in-process`,
      'provider (nine `read_file` calls of ~2.3 KB per turn, then an answer; window 32,000 tokens, so the ladder prunes and compacts as',
      'it goes); `heapUsed` after a forced GC every 1,000 steps.',
      '**Resume**: generated logs (turns of one ~96 KiB tool result, a tenth of them CJK/emoji, each turn compacted into one checkpoint',
      'so that every original is shadowed) are loaded with `Session.load` + `resume()` in a fresh process; baseline: a fresh process',
      'that reads the same file in 4 MiB chunks and `JSON.parse`s every line once. Peak RSS = `process.resourceUsage().maxRSS`.',
      `**Durable steps**: ${DURABLE_STEPS} Agent steps on a real FileStore (fsync on), syncs counted; floor: the same bytes per step appended`,
      'with one `writeSync` + `fsyncSync` per step in the same process.',
      `**Adapter**: ${int(ADAPTER_TOKENS)} DeepSeek-shaped text chunks streamed through \`openAICompatible\` (esbuild bundle, an in-process`,
      '`fetch` answering a ReadableStream of 1 KiB chunks) against a floor that decodes the same chunks, splits lines and `JSON.parse`s',
      'each data line; CPU time (`process.cpuUsage`), 8 interleaved pairs after a warm-up.',
    ].join('\n'),
  }
}
