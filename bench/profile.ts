// Top frames by self time of a V8 CPU profile (`node --cpu-prof`), with frames of a bundled build
// mapped back to dsh.ts lines through the bundle's source map (node:module SourceMap) and methods
// named with their class (`FileStore.append`). Used by bench/durable.bench.ts.
import { existsSync, readFileSync } from 'node:fs'
import { SourceMap } from 'node:module'
import { basename, dirname, resolve } from 'node:path'
import { fileURLToPath } from 'node:url'

interface CallFrame { functionName: string; url: string; lineNumber: number; columnNumber: number }
interface ProfileNode { id: number; callFrame: CallFrame; children?: number[] }
/** The `.cpuprofile` JSON that `node --cpu-prof` writes. Times in µs. */
export interface CpuProfile { nodes: ProfileNode[]; startTime: number; endTime: number; samples: number[]; timeDeltas: number[] }

/**
 * One frame's share of the profile: self time (ms; on top of the stack), total time (ms; on the
 * stack at all, callees included — synchronous ones only: V8 does not link an `await` back to its
 * caller) and the self time's share of all samples' time.
 */
export interface Frame { name: string; where: string; selfMs: number; totalMs: number; share: number }

/** The class (if any) whose body holds `line` (0-based) of `lines`: the last top-level `class X` not closed by a top-level `}`. */
function enclosingClass(lines: readonly string[], line: number): string | undefined {
  for (let i = Math.min(line, lines.length - 1); i >= 0; i--) {
    const m = /^(?:export\s+)?(?:abstract\s+)?class\s+(\w+)/.exec(lines[i])
    if (m) return m[1]
    if (i < line && /^}/.test(lines[i])) return undefined
  }
  return undefined
}

/** Maps bundle positions to original ones, one source map per bundle (read once). */
class Mapper {
  private maps = new Map<string, SourceMap | null>()
  private sources = new Map<string, string[]>()
  frame(cf: CallFrame): { name: string; where: string } {
    // V8's own entries ((idle), (program), (garbage collector), (root)) have no script; an anonymous
    // function has one, and is kept apart by where it is (else every arrow function is one frame).
    const name = cf.functionName || '(anonymous)'
    if (cf.functionName.startsWith('(') && !cf.url) return { name, where: '' }
    if (!cf.url.startsWith('file://')) return { name, where: cf.url ? `${cf.url}:${cf.lineNumber + 1}` : 'native' }
    const file = fileURLToPath(cf.url)
    let map = this.maps.get(file)
    if (map === undefined) {
      map = existsSync(`${file}.map`) ? new SourceMap(JSON.parse(readFileSync(`${file}.map`, 'utf8'))) : null
      this.maps.set(file, map)
    }
    const entry = map?.findEntry(cf.lineNumber, cf.columnNumber) as { originalSource?: string; originalLine?: number } | undefined
    if (!entry?.originalSource) return { name, where: `${basename(file)}:${cf.lineNumber + 1}` }
    const src = entry.originalSource.startsWith('file://') ? fileURLToPath(entry.originalSource) : resolve(dirname(file), entry.originalSource)
    const line = entry.originalLine ?? 0
    let text = this.sources.get(src)
    if (!text) { text = existsSync(src) ? readFileSync(src, 'utf8').split('\n') : []; this.sources.set(src, text) }
    const cls = /^\s/.test(text[line] ?? '') ? enclosingClass(text, line) : undefined
    const shown = /^dsh(-[0-9a-f]+)?\.ts$/.test(basename(src)) ? 'dsh.ts' : basename(src)
    return { name: cls && !name.includes('.') ? `${cls}.${name}` : name, where: `${shown}:${line + 1}` }
  }
}

/**
 * Self time per frame (function + where), largest first. A sample's time is the gap to the next
 * sample (the last one's: to the profile's end), as Chrome DevTools counts it.
 */
export function topFrames(profile: CpuProfile): Frame[] {
  const byId = new Map(profile.nodes.map((n) => [n.id, n]))
  const selfUs = new Map<number, number>()
  const { samples, timeDeltas } = profile
  let t = profile.startTime
  const stamps = timeDeltas.map((d) => (t += d))
  for (let i = 0; i < samples.length; i++) {
    const dt = (i + 1 < stamps.length ? stamps[i + 1] : profile.endTime) - stamps[i]
    selfUs.set(samples[i], (selfUs.get(samples[i]) ?? 0) + Math.max(0, dt))
  }
  const parent = new Map<number, number>()
  for (const n of profile.nodes) for (const c of n.children ?? []) parent.set(c, n.id)
  const mapper = new Mapper()
  const keyOf = new Map<number, string>()
  const frames = new Map<string, Frame>()
  const frameOf = (id: number): Frame => {
    let key = keyOf.get(id)
    if (key === undefined) {
      const { name, where } = mapper.frame(byId.get(id)!.callFrame)
      key = `${name}\u0000${where}`
      keyOf.set(id, key)
      if (!frames.has(key)) frames.set(key, { name, where, selfMs: 0, totalMs: 0, share: 0 })
    }
    return frames.get(key)!
  }
  let totalUs = 0
  for (const [id, us] of selfUs) {
    totalUs += us
    frameOf(id).selfMs += us / 1000
    const seen = new Set<Frame>()
    for (let at: number | undefined = id; at !== undefined; at = parent.get(at)) {
      const f = frameOf(at)
      if (!seen.has(f)) { seen.add(f); f.totalMs += us / 1000 }
    }
  }
  const out = [...frames.values()].filter((f) => f.selfMs > 0).sort((a, b) => b.selfMs - a.selfMs)
  for (const f of out) f.share = totalUs > 0 ? f.selfMs * 1000 / totalUs : 0
  return out
}
