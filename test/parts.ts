// The two parts of dsh.ts as the tests see them, read from the source text independently of
// build.mjs (which cuts Part I for dist/dsh.mjs at the same fence line): the tests' own oracle.
import { readFileSync } from 'node:fs'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'

const ROOT = dirname(dirname(fileURLToPath(import.meta.url)))
const SOURCE = readFileSync(join(ROOT, 'dsh.ts'), 'utf8')
const FENCE_AT = SOURCE.search(/^\/\/ FENCE\. /m)
if (FENCE_AT < 0) throw new Error('dsh.ts has no fence line ("// FENCE. …") between Part I and Part II')

/** Value exports of a text: declarations (`export const x`) and export lists (`export { a, b }`, not `export type`). */
const valueExports = (text: string): string[] => [
  ...[...text.matchAll(/^export (?:declare )?(?:async )?(?:abstract )?(?:function\*?|const|let|var|class) (\w+)/gm)].map((m) => m[1]),
  ...[...text.matchAll(/^export \{([^}]*)\}/gm)].flatMap((m) => m[1].split(',').map((n) => n.trim()).filter((n) => n !== '')),
].sort()

/** Value exports declared above the fence (Part I, the runtime), sorted. */
export const PART_ONE_EXPORTS: readonly string[] = valueExports(SOURCE.slice(0, FENCE_AT))
/** Value exports declared below the fence (Part II: tools, replay, CLI), sorted. */
export const PART_TWO_EXPORTS: readonly string[] = valueExports(SOURCE.slice(FENCE_AT))
/** The sections of Part II that the runtime bundle (dist/dsh.mjs) carries (12–14), and the names they export, sorted. */
export const RUNTIME_SECTION_EXPORTS: readonly string[] = ['FileStore', 'SessionLockedError', 'SqlLogStore', 'anthropic']
/** Value exports of the runtime bundle, dist/dsh.mjs: Part I's plus those sections', sorted. */
export const RUNTIME_EXPORTS: readonly string[] = [...PART_ONE_EXPORTS, ...RUNTIME_SECTION_EXPORTS].sort()
/** The 1-based line of the fence in dsh.ts. */
export const FENCE_LINE = SOURCE.slice(0, FENCE_AT).split('\n').length
