// build.mjs: the dist files (the runtime — Part I plus the file store section of Part II — as dsh.mjs /
// dsh.iife.js / dsh.d.mts, the whole file as cli.mjs / cli.d.mts), their exports, the fence check
// (Part I must not name Part II, the file store section nothing else of Part II) and the
// edge-safety check that a static `node:` import in the core fails the platform-neutral build. Builds go to temp dirs, so
// this file never races test/runtimes.test.ts or touches the checkout's dist/.
import { after, before, test } from 'node:test'
import assert from 'node:assert/strict'
import { execFile, spawnSync } from 'node:child_process'
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { dirname, join } from 'node:path'
import { fileURLToPath, pathToFileURL } from 'node:url'
import { runInNewContext } from 'node:vm'
import * as dshSource from '../dsh.ts'
import { PART_ONE_EXPORTS, PART_TWO_EXPORTS, RUNTIME_EXPORTS, RUNTIME_SECTION_EXPORTS } from './parts.ts'

const ROOT = dirname(dirname(fileURLToPath(import.meta.url)))
const SOURCE = readFileSync(join(ROOT, 'dsh.ts'), 'utf8')
const VALUE_EXPORTS = Object.keys(dshSource).sort()
const FENCE_RE = /^\/\/ FENCE\. /m
/** `code` inserted into a copy of dsh.ts just above the fence, i.e. at the end of Part I. */
const inPartOne = (src: string, code: string) => src.replace(FENCE_RE, (fence) => `${code}\n${fence}`)
const work = mkdtempSync(join(tmpdir(), 'dsh-build-'))
after(() => rmSync(work, { recursive: true, force: true }))

interface Run { code: number | null; stdout: string; stderr: string }
function runBuild(...args: string[]): Promise<Run> {
  return new Promise((resolve) => {
    const env = { ...process.env, NO_COLOR: '1' }
    execFile(process.execPath, [join(ROOT, 'build.mjs'), ...args], { cwd: ROOT, env }, (err, stdout, stderr) => {
      resolve({ code: err ? (typeof err.code === 'number' ? err.code : null) : 0, stdout, stderr })
    })
  })
}

/** A copy of dsh.ts changed by `edit`, alone in a dir with a package.json like the repo's. */
function copyOfSource(name: string, edit: (src: string) => string): { entry: string; outdir: string } {
  const dir = join(work, name)
  mkdirSync(dir)
  writeFileSync(join(dir, 'package.json'), '{"type":"module"}')
  writeFileSync(join(dir, 'dsh.ts'), edit(SOURCE))
  return { entry: join(dir, 'dsh.ts'), outdir: join(dir, 'dist') }
}

// ── The real build ──────────────────────────────────────────────────────────────────────────────
// Every build in this file starts at load and runs concurrently (each is a short child process);
// the tests await the one they check.
const dist = join(work, 'dist')
const realBuild = runBuild('--outdir', dist)
let built: Run
before(async () => { built = await realBuild })

test('node build.mjs writes the ESM bundle, the IIFE, the CLI bundle, source maps and the declarations', () => {
  assert.equal(built.code, 0, built.stderr)
  for (const file of ['dsh.mjs', 'dsh.mjs.map', 'dsh.iife.js', 'dsh.iife.js.map', 'cli.mjs', 'dsh.d.mts', 'dsh.d.mts.map', 'cli.d.mts', 'cli.d.mts.map']) {
    assert.ok(statSync(join(dist, file)).size > 0, `${file} is empty`)
  }
  assert.match(readFileSync(join(dist, 'dsh.mjs'), 'utf8'), /\n\/\/# sourceMappingURL=dsh\.mjs\.map\n$/)
  assert.match(readFileSync(join(dist, 'dsh.iife.js'), 'utf8'), /^var DSH=\(\(\)=>\{/) // minified, global DSH
  const map = JSON.parse(readFileSync(join(dist, 'dsh.mjs.map'), 'utf8'))
  assert.deepEqual(map.sources.map((s: string) => s.split('/').pop()), ['dsh.ts'])
  // The declaration maps point at the real dsh.ts (Part I is a prefix of it, so the lines agree).
  for (const file of ['dsh.d.mts.map', 'cli.d.mts.map']) {
    const dmap = JSON.parse(readFileSync(join(dist, file), 'utf8'))
    assert.equal(join(dist, dmap.sources[0]), join(ROOT, 'dsh.ts'), file)
  }
  const cli = readFileSync(join(dist, 'cli.mjs'), 'utf8')
  assert.ok(cli.startsWith('#!/usr/bin/env node\n'), 'cli.mjs starts with a shebang')
  assert.ok((statSync(join(dist, 'cli.mjs')).mode & 0o111) !== 0, 'cli.mjs is executable')
})

test('the printed size table gives each file its raw and gzip -9 size in bytes', () => {
  const rows = new Map(built.stdout.trim().split('\n').slice(1).map((line) => {
    const [file, raw, gz] = line.trim().split(/\s+/)
    return [file.split('/').pop(), { raw: Number(raw), gz: Number(gz) }]
  }))
  assert.deepEqual([...rows.keys()], ['dsh.mjs', 'dsh.iife.js', 'cli.mjs', 'dsh.d.mts', 'cli.d.mts'])
  for (const [file, { raw, gz }] of rows) {
    assert.equal(raw, statSync(join(dist, file!)).size, `${file} raw size`)
    assert.ok(gz > 0 && gz < raw, `${file} gzip size ${gz} vs raw ${raw}`)
  }
})

test('dist/dsh.mjs exposes exactly the value exports of Part I and FileStore (the runtime), working', async () => {
  const dsh = await import(pathToFileURL(join(dist, 'dsh.mjs')).href)
  assert.deepEqual(Object.keys(dsh).sort(), RUNTIME_EXPORTS)
  assert.deepEqual(RUNTIME_SECTION_EXPORTS.filter((n) => PART_ONE_EXPORTS.includes(n) || !PART_TWO_EXPORTS.includes(n)), [], 'FileStore is declared in Part II')
  assert.ok(PART_TWO_EXPORTS.includes('runAsProgram') && PART_TWO_EXPORTS.includes('builtinTools'), 'the CLI is in Part II')
  // No Part II code is left in the runtime bundle, not even its texts.
  const bundle = readFileSync(join(dist, 'dsh.mjs'), 'utf8')
  const partTwoTexts = ['read_file', 'list_files', 'TranscriptError', 'mini-swe-agent', '--allow-shell', 'You are dsh']
  assert.deepEqual(partTwoTexts.filter((t) => bundle.includes(t)), [])
  assert.equal(dsh.VERSION, dshSource.VERSION)
  // FileStore from the bundle writes and reads a log (its node:fs is loaded lazily, where it exists).
  const file = join(work, 'bundle-store.jsonl')
  const store = new dsh.FileStore(file)
  const session = await dsh.Session.open(store)
  await session.sync()
  await store.close()
  assert.deepEqual((await new dsh.FileStore(file).load()).events.map((ev: { type: string }) => ev.type), ['session/start'])
  assert.ok(!existsSync(`${file}.lock`), 'close gave the lock back')
  const e = new dsh.ProviderError('AUTH', 'bad key', { status: 401 })
  assert.deepEqual([e.name, e.code, e.status, e.body, e instanceof Error], ['ProviderError', 'AUTH', 401, '', true])
})

test('dist/dsh.iife.js, run as a script in a bare context, defines the global DSH with the runtime exports', () => {
  const context: Record<string, unknown> = {}
  runInNewContext(readFileSync(join(dist, 'dsh.iife.js'), 'utf8'), context)
  const DSH = context.DSH as Record<string, unknown>
  assert.deepEqual(Object.keys(DSH).sort(), RUNTIME_EXPORTS)
  assert.equal(DSH.VERSION, dshSource.VERSION)
})

test('dist/cli.mjs is the whole file: every value export of dsh.ts, and importing it starts nothing', async () => {
  const cli = await import(pathToFileURL(join(dist, 'cli.mjs')).href)
  assert.deepEqual(Object.keys(cli).sort(), VALUE_EXPORTS)
  assert.equal(cli.cliHelp(), dshSource.cliHelp())
  assert.equal(await cli.isEntryPoint(), false)
})

test('dist/dsh.d.mts declares every runtime value export (Part I and FileStore), dist/cli.d.mts every value export, neither the undocumented internals', () => {
  const declared = (file: string) => {
    const dts = readFileSync(join(dist, file), 'utf8')
    const listed = [...dts.matchAll(/^export \{([^}]*)\}/gm)].flatMap((m) => m[1].split(',').map((n) => n.trim()).filter(Boolean))
    const declared = (name: string) => new RegExp(`^(?:export )?declare (?:abstract )?(?:const|let|class|function) ${name}\\b`, 'm').test(dts)
    for (const name of listed) assert.ok(declared(name), `${file} exports ${name} without declaring it`)
    return [...new Set([...dts.matchAll(/^export declare (?:abstract )?(?:const|let|class|function) (\w+)/gm)].map((m) => m[1]).concat(listed))].sort()
  }
  const documented = (names: readonly string[]) => names.filter((n) => n !== 'internals')
  assert.ok(PART_ONE_EXPORTS.includes('internals'))
  assert.deepEqual(declared('dsh.d.mts'), documented(RUNTIME_EXPORTS))
  assert.deepEqual(declared('cli.d.mts'), documented(VALUE_EXPORTS))
})

// ── The fence: Part I must not name Part II ──────────────────────────────────────────────────────
const crossing = copyOfSource('fence-crossed', (src) => inPartOne(src, 'export const helpLength = (): number => cliHelp().length'))
const crossingBuild = runBuild('--entry', crossing.entry, '--outdir', crossing.outdir)
const noFence = copyOfSource('no-fence', (src) => src.replace(FENCE_RE, '// (fence removed) '))
const noFenceBuild = runBuild('--entry', noFence.entry, '--outdir', noFence.outdir)
test('a name in Part I that only Part II declares fails the build, with the line and what to do', async () => {
  const r = await crossingBuild
  assert.equal(r.code, 1, `build exited ${r.code}:\n${r.stdout}${r.stderr}`)
  assert.match(r.stderr, /Part I names Part II/)
  const line = readFileSync(crossing.entry, 'utf8').split('\n').findIndex((l) => l.includes('helpLength')) + 1
  assert.match(r.stderr, new RegExp(`dsh\\.ts\\(${line},\\d+\\): error TS2304: Cannot find name 'cliHelp'`))
  assert.equal(existsSync(crossing.outdir), false, 'no half-built dist is left behind')
  const r2 = await noFenceBuild
  assert.equal(r2.code, 1)
  assert.match(r2.stderr, /no fence line/)
})

// ── The file store section travels with the runtime: it must name nothing else of Part II ────────
const FILE_STORE_HEADING_RE = /^\/\/ \d+\. File store\b.*$/m
const storeCrossing = copyOfSource('store-crossed', (src) => src.replace(FILE_STORE_HEADING_RE, (h) => `${h}\nexport const helpWidth = (): number => cliHelp().length`))
const storeCrossingBuild = runBuild('--entry', storeCrossing.entry, '--outdir', storeCrossing.outdir)
const noStore = copyOfSource('no-store', (src) => src.replace(FILE_STORE_HEADING_RE, '// (file store heading removed)'))
const noStoreBuild = runBuild('--entry', noStore.entry, '--outdir', noStore.outdir, '--no-dts')
test('a name of the rest of Part II in the file store section fails the build, with the line and what to do; so does a missing section', async () => {
  const r = await storeCrossingBuild
  assert.equal(r.code, 1, `build exited ${r.code}:\n${r.stdout}${r.stderr}`)
  assert.match(r.stderr, /The runtime's sections of Part II \(the file store to the end\) name the rest of Part II/)
  const line = readFileSync(storeCrossing.entry, 'utf8').split('\n').findIndex((l) => l.includes('helpWidth')) + 1
  assert.match(r.stderr, new RegExp(`dsh\\.ts\\(${line},\\d+\\): error TS2304: Cannot find name 'cliHelp'`))
  assert.equal(existsSync(storeCrossing.outdir), false, 'no half-built dist is left behind')
  const r2 = await noStoreBuild
  assert.equal(r2.code, 1)
  assert.match(r2.stderr, /no "\/\/ N\. File store" section below the fence/)
})

// ── The edge-safety check on temporary copies of dsh.ts (never the real file) ──────────────────
const STATIC_NODE_IMPORTS: Array<[label: string, line: string, module: string]> = [
  ['named import (issue 6, case 3)', "import { readFile } from 'node:fs'", 'node:fs'],
  ['side-effect import', "import 'node:process'", 'node:process'],
  ['namespace import', "import * as path from 'node:path'", 'node:path'],
  ['re-export', "export { createHash } from 'node:crypto'", 'node:crypto'],
]
for (const [label, line, module] of STATIC_NODE_IMPORTS) {
  const { entry, outdir } = copyOfSource(`static-${module.slice(5)}`, (src) => `${line}\n${src}`)
  const pending = runBuild('--entry', entry, '--outdir', outdir)
  test(`a static node: ${label} at the top of dsh.ts fails the build, naming ${module}`, async () => {
    const r = await pending
    assert.equal(r.code, 1, `build exited ${r.code}:\n${r.stdout}${r.stderr}`)
    assert.match(r.stderr, new RegExp(`static import of "${module}" in the platform-neutral core`))
    assert.match(r.stderr, /dsh\.ts:1:/) // points at the line
    assert.equal(existsSync(join(outdir, 'dsh.mjs')), false, 'no bundle is left behind')
  })
}

const dynamic = copyOfSource('dynamic', (src) => inPartOne(src, `
export async function sizeOfPackageJson(dir: string): Promise<number> {
  const { statSync } = await import('node:fs')
  return statSync(dir + '/package.json').size
}
`))
const dynamicBuild = runBuild('--entry', dynamic.entry, '--outdir', dynamic.outdir)
test("a dynamic import('node:fs') stays external in both bundles and loads when called (Node)", async () => {
  const { entry, outdir } = dynamic
  const r = await dynamicBuild
  assert.equal(r.code, 0, r.stderr)
  for (const file of ['dsh.mjs', 'dsh.iife.js', 'cli.mjs']) assert.match(readFileSync(join(outdir, file), 'utf8'), /import\("node:fs"\)/)
  const mod = await import(pathToFileURL(join(outdir, 'dsh.mjs')).href)
  assert.equal(await mod.sizeOfPackageJson(dirname(entry)), '{"type":"module"}'.length)
  assert.match(readFileSync(join(outdir, 'dsh.d.mts'), 'utf8'), /export declare function sizeOfPackageJson\(dir: string\): Promise<number>;/)
})

const typeOnly = copyOfSource('type-only', (src) => `import type { Stats } from 'node:fs'\n${src}
export function isBig(stats: Pick<Stats, 'size'>): boolean { return stats.size > 1 }
`)
const typeOnlyBuild = runBuild('--entry', typeOnly.entry, '--outdir', typeOnly.outdir, '--no-dts')
test('a type-only node: import is erased and builds', async () => {
  const { outdir } = typeOnly
  const r = await typeOnlyBuild
  assert.equal(r.code, 0, r.stderr)
  // Static forms in esbuild's minified output; the core's own dynamic import("node:…") may remain.
  assert.doesNotMatch(readFileSync(join(outdir, 'dsh.mjs'), 'utf8'), /(?:from|import)\s*["']node:/)
  assert.equal(existsSync(join(outdir, 'dsh.d.mts')), false, '--no-dts skips tsc')
})


// Users bundle dsh again for the browser or the edge (wrangler, Vercel and Vite use esbuild). esbuild
// resolves a string-literal dynamic import, so the file store's import("node:fs/promises") stops such
// a build ("Could not resolve"); a non-literal specifier (plus webpackIgnore / @vite-ignore) passes.
test('a browser-platform bundler (esbuild, as wrangler and Vercel use) can bundle dist/dsh.mjs', async () => {
  await realBuild
  const esbuild = await import('esbuild')
  const result = await esbuild.build({
    stdin: { contents: "export * from './dsh.mjs'", resolveDir: dist, loader: 'js' },
    bundle: true, format: 'esm', platform: 'browser', write: false, logLevel: 'silent',
  }).catch((err: { errors?: Array<{ text: string }> }) => err)
  assert.deepEqual('errors' in result ? result.errors?.map((e) => e.text) : 'threw', [])
})

// An app that bundles the runtime from dsh.ts itself (not dist/) must not carry Part II: its
// top-level statements are the only way in, so each must be side-effect free or name no Part II code.
test('an app bundling {Session, MemoryStore} from dsh.ts carries no Part II code (tools, replay, CLI, entry check)', async () => {
  const esbuild = await import('esbuild')
  const result = await esbuild.build({
    stdin: { contents: `import { Session, MemoryStore } from ${JSON.stringify(join(ROOT, 'dsh.ts'))}\nconsole.log(Session, MemoryStore)`,
      resolveDir: ROOT, loader: 'ts' },
    bundle: true, minify: true, format: 'esm', platform: 'neutral', external: ['node:*'], write: false, logLevel: 'silent',
  })
  const js = result.outputFiles[0].text
  // One string each of the tools' defaults, replay's fidelity figures, the CLI's entry check, the file store.
  for (const part of ['shellMaxTimeoutMs', 'fidelity user messages pruned', 'realpath', 'the cut line is dropped on load']) {
    assert.equal(js.includes(part), false, `${part} is Part II code`)
  }
  assert.match(js, /runIfProgram/, 'the entry statement itself stays (it names no Part II code)')
})

// From the hostile review rev5: the entry statement of an app that re-exports dsh.ts.
test('entry statement: an app that re-exports dsh.ts, bundled and run as the program, does not run the dsh CLI', async () => {
  const { build } = await import('esbuild')
  const dir = mkdtempSync(join(tmpdir(), 'dsh-entry-'))
  try {
    const dsh = join(ROOT, 'dsh.ts')
    // A library over dsh that re-exports it whole and is also run as a program of its own.
    writeFileSync(join(dir, 'app.ts'), `export * from ${JSON.stringify(dsh)}\nconsole.log('app')\n`)
    await build({ entryPoints: [join(dir, 'app.ts')], bundle: true, format: 'esm', platform: 'node',
      outfile: join(dir, 'app.mjs'), logLevel: 'silent' })
    const r = spawnSync(process.execPath, [join(dir, 'app.mjs'), '--version'], { encoding: 'utf8', timeout: 30_000 })
    // The program is app.mjs, not dsh.ts nor dist/cli.mjs: only the app's own line.
    assert.equal(r.stdout, 'app\n')
  } finally { rmSync(dir, { recursive: true, force: true }) }
})

// ── README's layout section describes the file as it is ─────────────────────────────────────────
test("README's layout names every section of dsh.ts, and its Part I / Part II line counts hold within a quarter", () => {
  const readme = readFileSync(join(ROOT, 'README.md'), 'utf8')
  const layout = readme.slice(readme.indexOf('## Layout'))
  const sections = [...SOURCE.matchAll(/^\/\/ (\d+)\. ([^—\n(]+?)\s*(?:—|\(|$)/gm)].map((m) => `${m[1]}. ${m[2].trim()}`)
  assert.ok(sections.length >= 10, `found ${sections.length} section headings`)
  assert.deepEqual(sections.filter((s) => !layout.includes(`| ${s} |`)), [], 'sections missing from the README layout table')
  const fenceLine = SOURCE.slice(0, SOURCE.search(FENCE_RE)).split('\n').length
  const total = SOURCE.split('\n').length
  const m = /Part I is about ([\d,]+) lines, Part II about ([\d,]+)/.exec(layout)
  assert.ok(m, 'the layout section gives both line counts')
  const [one, two] = [Number(m[1].replace(/,/g, '')), Number(m[2].replace(/,/g, ''))]
  for (const [claimed, real, part] of [[one, fenceLine, 'Part I'], [two, total - fenceLine, 'Part II']] as const) {
    assert.ok(Math.abs(claimed - real) <= real / 4, `${part}: README says about ${claimed} lines, the file has ${real}; update README's layout section`)
  }
})

// ── The header's table of contents leads a newcomer to the right place ─────────────────────────
test("the header's contents name where a provider's error wording, a transcript format and a ladder rung go, and those names are declared in the sections named", () => {
  const header = SOURCE.slice(0, SOURCE.indexOf('*/'))
  const toc = header.slice(header.indexOf('CONTENTS'), header.indexOf('UNITS'))
  /** Line ranges of the `// N. Name` sections of dsh.ts. */
  const starts = [...SOURCE.matchAll(/^\/\/ (\d+)\. /gm)].map((m) => ({ n: Number(m[1]), at: m.index! }))
  const sectionOf = (at: number) => starts.filter((s) => s.at <= at).at(-1)?.n
  for (const phrase of ["PROVIDER'S ERROR WORDING", 'TRANSCRIPT FORMAT', 'LADDER RUNG']) {
    const i = toc.indexOf(phrase)
    assert.ok(i >= 0, `the contents do not name where ${phrase.toLowerCase()} goes`)
    const before = toc.slice(0, i)
    const section = Number([...before.matchAll(/^ \*\s+(\d+)\. /gm)].at(-1)?.[1])
    // The first identifier after the phrase: an UPPER_CASE constant or a camelCase function.
    const name = /\b([A-Z][A-Z0-9]*_[A-Z0-9_]+|[a-z]+[A-Z]\w*)\b/.exec(toc.slice(i + phrase.length))?.[1]
    assert.ok(name, `no identifier named after ${phrase}`)
    const decl = new RegExp(`^(?:export )?(?:async )?(?:const|function|class) ${name}\\b`, 'm').exec(SOURCE)
    assert.ok(decl, `${name} (named for ${phrase}) is not declared in dsh.ts`)
    assert.equal(sectionOf(decl.index), section, `${name} is declared in section ${sectionOf(decl.index)}, the contents say ${section}`)
  }
})
