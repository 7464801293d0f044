// The core's figures (docs/design.md §14; the core issue's table) of one version of dsh.ts: Part I's lines, its lines
// over 120 characters, its runtime exports, the leaf options, `class Session` (lines and public members), the longest
// Part I function, and the gzipped size of two apps bundled from the file. ../shared/tools/core-figures.sh measures
// the same way where it measures the same figure (sizes: Node's zlib at level 9, within ~0.3% of GNU gzip -9); this
// adds the three it leaves out (options, members, functions).
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { SourceMap } from 'node:module'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { pathToFileURL } from 'node:url'
import { gzipSync } from 'node:zlib'
import * as acorn from 'acorn'
import * as walk from 'acorn-walk'
import * as esbuild from 'esbuild'

/** The figures and their targets (the core issue), in the order of its table. */
export const CORE_TARGETS = {
  lines: 4_000, longLines: 0, runtimeExports: 30, leafOptions: 25, sessionLines: 300, sessionMembers: 20,
  longestFunctionLines: 60, agentAppGzipBytes: 28_000, sessionAppGzipBytes: 8_000,
} as const

export type CoreFigures = { [K in keyof typeof CORE_TARGETS]: number } & {
  /** The longest Part I function's name and first line. */
  longestFunction: string
  /** Leaf options by interface. */
  leafOptionsBy: Record<string, number>
}

/** The interfaces whose fields are the leaf options; `compaction` and `prune` hold two of them and are not leaves. */
const OPTION_INTERFACES = ['AgentOptions', 'CompactionConfig', 'PruneConfig', 'OpenAICompatibleOptions'] as const
const CONTAINERS = new Set(['compaction', 'prune'])

/** The lines of a top-level block that starts at the line matching `start` and ends at the next line `}`; throws if none. */
function block(lines: readonly string[], start: RegExp): string[] {
  const i = lines.findIndex((l) => start.test(l))
  // a figure of something absent would read as 0, a met target
  if (i < 0) throw new Error(`no line matching ${start} in this dsh.ts: its figure cannot be measured`)
  const end = lines.findIndex((l, k) => k > i && l.startsWith('}'))
  return lines.slice(i, end + 1)
}

/** Names of the fields an interface declares at its own level (two spaces in), a nested type's fields left out. */
const fieldsOf = (body: readonly string[]) =>
  body.flatMap((l) => /^ {2}(?:readonly )?(\w+)\??:/.exec(l)?.[1] ?? [])

/** Public members of a class body: its properties, accessors and methods (overloads once), not the constructor. */
function publicMembers(body: readonly string[]): string[] {
  const names = new Set<string>()
  for (const l of body.slice(1, -1)) {
    const m = /^ {2}(?!private |protected |\/|\*|constructor)(?:static |readonly |async |get |set |\*)*(\w+)[?(:<! ]/.exec(l)
    if (m) names.add(m[1])
  }
  return [...names]
}

/** The longest function of `js` (esbuild's output of Part I with an inline source map), in lines of the source. */
function longestFunction(js: string): { lines: number; name: string } {
  const map = new SourceMap(JSON.parse(Buffer.from(/sourceMappingURL=data:application\/json;base64,(.*)$/m.exec(js)![1],
    'base64').toString()))
  const sourceLine = (line: number) => map.findEntry(line - 1, 0)
  let best = { lines: 0, name: '' }
  const ast = acorn.parse(js, { ecmaVersion: 'latest', sourceType: 'module', locations: true })
  walk.fullAncestor(ast, (node, _state, ancestors) => {
    if (!/Function/.test(node.type)) return
    const fn = node as acorn.Function
    if (fn.body.type !== 'BlockStatement') return
    const a = sourceLine(fn.loc!.start.line), b = sourceLine(fn.loc!.end.line)
    if (!('originalLine' in a) || !('originalLine' in b)) return
    const lines = b.originalLine - a.originalLine + 1
    const parent = ancestors[ancestors.length - 2] as { key?: { name?: string }; id?: { name?: string } } | undefined
    const name = fn.id?.name ?? parent?.key?.name ?? parent?.id?.name ?? '(anonymous)'
    if (lines > best.lines) best = { lines, name: `${name} (line ${a.originalLine + 1})` }
  })
  return best
}

/** The gzip -9 size of an app importing `names` from `file`, bundled as core-figures.sh does. */
async function appGzipBytes(file: string, names: string, dir: string): Promise<number> {
  const entry = join(dir, `app-${names.replace(/\W+/g, '-')}.ts`)
  writeFileSync(entry, `import { ${names} } from ${JSON.stringify(file)}\nconsole.log(${names})\n`)
  const out = await esbuild.build({ entryPoints: [entry], bundle: true, minify: true, format: 'esm', platform: 'neutral',
    external: ['node:*'], write: false, logLevel: 'error' })
  return gzipSync(out.outputFiles[0].contents, { level: 9 }).length
}

/** The core's figures of `source`, the text of a dsh.ts. */
export async function coreFigures(source: string): Promise<CoreFigures> {
  const all = source.split('\n')
  const fence = all.findIndex((l) => l.startsWith('// FENCE'))
  if (fence < 0) throw new Error('no "// FENCE" line in this dsh.ts')
  const partOne = all.slice(0, fence)
  const dir = mkdtempSync(join(tmpdir(), 'dsh-core-'))
  try {
    const js = (await esbuild.transform(partOne.join('\n'), { loader: 'ts', format: 'esm', sourcemap: 'inline' })).code
    writeFileSync(join(dir, 'part1.mjs'), js)
    const runtimeExports = Object.keys(await import(pathToFileURL(join(dir, 'part1.mjs')).href)).length
    const file = join(dir, 'dsh.ts')
    writeFileSync(file, source)
    const leafOptionsBy = Object.fromEntries(OPTION_INTERFACES.map((name) => [name,
      fieldsOf(block(partOne, new RegExp(`^export interface ${name}\\b`))).filter((f) => !CONTAINERS.has(f)).length]))
    const session = block(all, /^export class Session[ <{]/)
    const longest = longestFunction(js)
    return {
      lines: partOne.length,
      longLines: partOne.filter((l) => l.length > 120).length,
      runtimeExports,
      leafOptions: Object.values(leafOptionsBy).reduce((a, b) => a + b, 0),
      leafOptionsBy,
      sessionLines: session.length,
      sessionMembers: publicMembers(session).length,
      longestFunctionLines: longest.lines,
      longestFunction: longest.name,
      agentAppGzipBytes: await appGzipBytes(file, 'Agent, Session, MemoryStore, deepseek', dir),
      sessionAppGzipBytes: await appGzipBytes(file, 'Session, MemoryStore', dir),
    }
  } finally {
    rmSync(dir, { recursive: true, force: true })
  }
}
