// Memory probe of one pruner case, in a process of its own so that its peak RSS is its own:
//   node --expose-gc --import tsx bench/pruner-memory.ts dsh|array-from ascii|emoji BYTES
// Prints one JSON line: { inputRss, peakRss, extraPeak, retainedAfterDrop } in bytes.
// - extraPeak = peak RSS of the whole process − RSS with the input built and garbage collected: an
//   upper bound of what one prune call adds (building the input may itself have peaked higher).
// - retainedAfterDrop = heap still in use when the caller keeps only the result and drops the input
//   (after a full GC), minus the heap before the input existed.
import { pruneText } from '../dsh.ts'
import { pruneArrayFrom } from './pruner.bench.ts'
import { makeText, type TextKind } from './text-inputs.ts'

const gc = (globalThis as { gc?: () => void }).gc
if (!gc) throw new Error('run with --expose-gc')
const [impl, kind, bytesArg] = process.argv.slice(2)
const bytes = Number(bytesArg)
const prune = impl === 'dsh' ? pruneText : impl === 'array-from' ? pruneArrayFrom : undefined
if (!prune || (kind !== 'ascii' && kind !== 'emoji') || !Number.isSafeInteger(bytes)) {
  console.error('usage: pruner-memory.ts dsh|array-from ascii|emoji BYTES')
  process.exit(2)
}
gc()
const heapBefore = process.memoryUsage().heapUsed
let text: string | undefined = makeText(kind as TextKind, bytes)
gc()
const inputRss = process.memoryUsage().rss
const result = prune(text)
const peakRss = process.resourceUsage().maxRSS * 1024
text = undefined
gc()
const retainedAfterDrop = process.memoryUsage().heapUsed - heapBefore
console.log(JSON.stringify({ inputRss, peakRss, extraPeak: Math.max(0, peakRss - inputRss), retainedAfterDrop, resultLength: result.length }))
