// Seeded tool-output texts of a given UTF-8 size, for the pruner benchmark and its memory probe.
import { rng } from './lib.ts'

export type TextKind = 'ascii' | 'emoji'

/** Sizes of issue 7, in UTF-8 bytes. */
export const PRUNE_SIZES = [
  { label: '10 KiB', bytes: 10 * 1024 },
  { label: '1 MiB', bytes: 1024 * 1024 },
  { label: '100 MiB', bytes: 100 * 1024 * 1024 },
] as const

const WORDS = ['test', 'src', 'build', 'ok', 'error', 'value', 'return', 'session', 'tokens', 'result', 'passed', 'module', 'failed', 'import', 'config', 'cache']
const EMOJI = ['✅', '🎯', '📱', '🏗️', '🚀', '❌', '🔧', '👍🏽', '🇯🇵', '—', '│', '├──', '→', 'é', '日本']

/**
 * One line of tool output. `ascii`: a pytest/grep-like line. `emoji`: a status line with astral
 * emoji (surrogate pairs, a skin-tone modifier, a flag), box drawing and accents, as in the Claude
 * Code transcript of the corpus.
 */
function line(kind: TextKind, next: () => number, n: number): string {
  const pick = <T>(xs: readonly T[]) => xs[Math.floor(next() * xs.length)]
  const words = Array.from({ length: 3 + Math.floor(next() * 6) }, () => pick(WORDS)).join(' ')
  if (kind === 'ascii') return `src/${pick(WORDS)}_${n % 97}.py:${n % 1000}: ${words} = ${Math.floor(next() * 1e6)}\n`
  return `${pick(EMOJI)} ${words} ${pick(EMOJI)} step ${n} ${pick(EMOJI)}${pick(EMOJI)}\n`
}

/**
 * A flat string of about `bytes` UTF-8 bytes (never more), ending on a line boundary when
 * possible. Large sizes repeat a 64 KiB block, then the string is flattened once here (V8 builds
 * `repeat` as a rope; reading a character flattens it), so no benchmark pays for that.
 */
export function makeText(kind: TextKind, bytes: number, seed = 7): string {
  const next = rng(seed)
  const enc = new TextEncoder()
  const block: string[] = []
  let blockBytes = 0
  const blockTarget = Math.min(bytes, 64 * 1024)
  for (let n = 0; ; n++) {
    const l = line(kind, next, n)
    const b = enc.encode(l).length
    if (blockBytes + b > blockTarget) break
    block.push(l)
    blockBytes += b
  }
  const one = block.join('')
  const reps = Math.max(1, Math.floor(bytes / blockBytes))
  const text = one.repeat(reps)
  text.charCodeAt(text.length - 1) // flatten the rope now
  return text
}

/** UTF-8 length of a string, counted without allocating (bytes). */
export function utf8Bytes(text: string): number {
  let bytes = 0
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i)
    if (c < 0x80) bytes += 1
    else if (c < 0x800) bytes += 2
    else if (c >= 0xd800 && c <= 0xdbff && i + 1 < text.length) { bytes += 4; i++ } else bytes += 3
  }
  return bytes
}
