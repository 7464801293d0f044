// Builds dsh.ts into dist/ (docs/design.md §0):
//   dsh.mjs      the runtime: Part I of dsh.ts (everything above the fence) plus the sections of
//                Part II it carries, from the file store to the end of the file (FileStore: node:fs,
//                loaded lazily; SqlLogStore; the Anthropic adapter); ESM, platform-neutral,
//                minified, with a source map (Node, Deno, Bun, workerd, browsers)
//   dsh.iife.js  the same as a classic script defining the global `DSH` (script-only runtimes such
//                as Vercel's edge-runtime), minified, with a source map
//   cli.mjs      the whole file (runtime, tools, replay, CLI) with a `#!/usr/bin/env node` line: the
//                package's `bin`; not minified, so that a stack trace reads
//   dsh.d.mts    declarations of the runtime (the same text), beside dsh.mjs (a copied dsh.mjs finds
//                its types)
//   cli.d.mts    declarations of the whole file, beside cli.mjs
// Then prints each file's size: raw bytes and gzip -9 bytes.
//
// Two checks make the build fail with a message:
// - the fence: Part I is cut at the `// FENCE.` line and type-checked alone (for dsh.d.mts), so a
//   name in Part I that only Part II declares fails ("Part I names Part II");
// - edge safety: a static `import … from 'node:…'` fails the platform-neutral build, naming the
//   module; a dynamic `await import('node:…')` (the CLI and the file store load node modules
//   lazily) is left external and runs where `node:` exists.
//
// The runtime's text is dsh.ts with every line of Part II blanked but those from the file store's
// section to the end (see runtimeSource): the line numbers stay those of dsh.ts (source and
// declaration maps), and those sections, type-checked with Part I, may name nothing else of Part II.
//
// Usage: node build.mjs [--entry FILE] [--outdir DIR] [--no-dts]   (defaults: dsh.ts, dist)
// Exit code 1 on any build error. Importable too: `import { build, partOne, runtimeSource } from './build.mjs'`.
import * as esbuild from 'esbuild'
import { spawnSync } from 'node:child_process'
import { chmodSync, mkdirSync, readFileSync, renameSync, rmSync, statSync, writeFileSync } from 'node:fs'
import { basename, dirname, join, relative, resolve } from 'node:path'
import { fileURLToPath } from 'node:url'
import { parseArgs } from 'node:util'
import { gzipSync } from 'node:zlib'

const ROOT = dirname(fileURLToPath(import.meta.url))
/** Language level of the bundles: what Node 20, Deno, Bun, workerd and edge-runtime all run. */
const TARGET = 'es2022'

/**
 * esbuild plugin: `node:` imports are external when dynamic and an error when static.
 * esbuild's neutral platform would refuse both ("Could not resolve"); the dynamic ones are the
 * documented escape hatch for the CLI and the file store, so only the static ones must fail.
 */
const nodeImportsDynamicOnly = {
  name: 'node-imports-dynamic-only',
  setup(b) {
    b.onResolve({ filter: /^node:/ }, (args) => {
      if (args.kind === 'dynamic-import') return { path: args.path, external: true }
      return {
        errors: [{
          text: `static import of "${args.path}" in the platform-neutral core; ` +
            `the core must run without node: modules (Deno, Bun, workerd, edge). ` +
            `Fix: load it lazily where it is needed, e.g. \`const fs = await import('${args.path}')\`.`,
        }],
      }
    })
  },
}

/** The line of dsh.ts that ends Part I (the runtime); see the fence comment there. */
const FENCE = /^\/\/ FENCE\. /m

/**
 * Part I of a dsh.ts source text: everything before the fence line. A prefix of the file, so its
 * line numbers (source maps, tsc errors) are those of dsh.ts. Throws when there is no fence.
 * @param {string} source @param {string} [file] for the message
 */
export function partOne(source, file = 'dsh.ts') {
  const m = FENCE.exec(source)
  if (!m) throw new Error(`${file}: no fence line (a line starting "// FENCE. ") ends Part I; the build cuts the runtime bundle there. Restore the fence comment before section 9.`)
  return source.slice(0, m.index)
}

/** The heading of the first section of Part II that the runtime carries (it carries the rest of the file too). */
const RUNTIME_SECTION = /^\/\/ \d+\. File store\b/m

/**
 * The runtime's text: Part I, then Part II with every line blanked (newlines kept) before the file
 * store's heading; from there to the end of the file (the stores and the second wire format) as it is.
 * Line numbers are those of dsh.ts. Throws when there is no fence or no such section below it.
 * @param {string} source @param {string} [file] for the message
 */
export function runtimeSource(source, file = 'dsh.ts') {
  const one = partOne(source, file)
  const at = source.slice(one.length).search(RUNTIME_SECTION)
  if (at < 0) throw new Error(`${file}: no "// N. File store" section below the fence; the runtime bundle carries Part II from that section to the end (FileStore, SqlLogStore, anthropic). Restore its heading.`)
  const start = one.length + at
  return one + source.slice(one.length, start).replace(/[^\n]+/g, '') + source.slice(start)
}

/** esbuild plugin: the entry module is read as the runtime's text only (see runtimeSource). */
const runtimeOnly = (entry) => ({
  name: 'runtime-only',
  setup(b) {
    b.onLoad({ filter: /\.ts$/ }, (args) => args.path === entry
      ? { contents: runtimeSource(readFileSync(entry, 'utf8'), entry), loader: 'ts' }
      : undefined)
  },
})

/**
 * Builds the bundles and declarations. Returns the written files with their sizes (bytes).
 * Throws on an esbuild error (already printed by esbuild), a missing fence or a tsc error.
 * @param {{ entry?: string, outdir?: string, dts?: boolean, log?: (line: string) => void }} [options]
 */
export async function build({ entry = join(ROOT, 'dsh.ts'), outdir = join(ROOT, 'dist'), dts = true, log = console.log } = {}) {
  entry = resolve(entry)
  outdir = resolve(outdir)
  const source = readFileSync(entry, 'utf8')
  runtimeSource(source, entry) // fail before touching outdir
  rmSync(outdir, { recursive: true, force: true })
  mkdirSync(outdir, { recursive: true })
  try {
    return await buildInto(entry, source, outdir, dts, log)
  } catch (err) {
    rmSync(outdir, { recursive: true, force: true }) // no half-built dist/ is left behind
    throw err
  }
}

async function buildInto(entry, source, outdir, dts, log) {
  const common = {
    entryPoints: [entry],
    bundle: true,
    platform: 'neutral',
    target: TARGET,
    minify: true,
    sourcemap: true,
    legalComments: 'none',
    plugins: [nodeImportsDynamicOnly, runtimeOnly(entry)],
    // Keep every import as written: TypeScript semantics would drop an unused
    // `import { readFile } from 'node:fs'` as possibly type-only, hiding it from the check above,
    // while Deno, Bun and tsx running dsh.ts itself would still load it. (dsh.ts has no imports.)
    tsconfigRaw: { compilerOptions: { verbatimModuleSyntax: true } },
    logLevel: 'warning',
  }
  // Whitespace is kept: esbuild drops comments with it, and the `/* @__PURE__ */` marks on the
  // runtime's load-time constants are what lets an app's bundler drop the ones it does not use.
  await esbuild.build({ ...common, minify: false, minifySyntax: true, minifyIdentifiers: true, format: 'esm', outfile: join(outdir, 'dsh.mjs') })
  await esbuild.build({ ...common, format: 'iife', globalName: 'DSH', outfile: join(outdir, 'dsh.iife.js') })
  // The whole file for the command line; `import(import.meta.url)` in its entry check stays as is.
  await esbuild.build({
    ...common,
    plugins: [nodeImportsDynamicOnly],
    format: 'esm',
    minify: false,
    sourcemap: false, // not minified: its stack traces read as they are
    banner: { js: '#!/usr/bin/env node' },
    outfile: join(outdir, 'cli.mjs'),
  })
  chmodSync(join(outdir, 'cli.mjs'), 0o755)

  const files = ['dsh.mjs', 'dsh.iife.js', 'cli.mjs']
  if (dts) {
    files.push('dsh.d.mts', 'cli.d.mts')
    runTsc(entry, partOne(source, entry), outdir, 'part-one', 'partOne') // the fence: Part I alone
    runTsc(entry, runtimeSource(source, entry), outdir, 'dsh', 'runtime')
    runTsc(entry, source, outdir, 'cli', 'all')
  }

  const sizes = files.map((name) => {
    const bytes = readFileSync(join(outdir, name))
    return { file: join(outdir, name), rawBytes: bytes.length, gzipBytes: gzipSync(bytes, { level: 9 }).length }
  })
  const rel = (p) => relative(process.cwd(), p) || p
  const width = Math.max(...sizes.map((s) => rel(s.file).length))
  log(`${'file'.padEnd(width)}  ${'raw bytes'.padStart(10)}  ${'gzip -9'.padStart(10)}`)
  for (const s of sizes) log(`${rel(s.file).padEnd(width)}  ${String(s.rawBytes).padStart(10)}  ${String(s.gzipBytes).padStart(10)}`)
  return sizes
}

/**
 * Declarations through the native TypeScript 7 `tsc`, of `text` (all of `entry`, its Part I, or the
 * runtime's text: each a prefix of it or blanked in place, so the lines agree), written to
 * `outdir/NAME.d.mts` with a declaration map that points at `entry`; for `kind` 'partOne' only the
 * check, nothing written. tsc runs `-p` on a throwaway config in a scratch dir in `outdir` (a file
 * argument beside tsconfig.json fails, TS5112) that extends tsconfig.dts.json.
 * For Part I, a name declared only in Part II is an error: "Part I names Part II"; for the runtime,
 * one the sections it carries (file store to the end) take from the rest of Part II.
 * @param {string} entry @param {string} text @param {string} outdir @param {string} name
 * @param {'partOne' | 'runtime' | 'all'} kind
 */
function runTsc(entry, text, outdir, name, kind) {
  const scratch = join(outdir, `.tsc-${name}`)
  mkdirSync(scratch, { recursive: true })
  writeFileSync(join(scratch, `${name}.mts`), text)
  const project = join(scratch, 'tsconfig.json')
  writeFileSync(project, JSON.stringify({
    extends: join(ROOT, 'tsconfig.dts.json'),
    // Part I alone may leave helpers unused that Part II uses; the full type-check still sees them.
    compilerOptions: { rootDir: scratch, outDir: scratch, typeRoots: [join(ROOT, 'node_modules', '@types')], noUnusedLocals: kind === 'all' },
    files: [join(scratch, `${name}.mts`)],
  }))
  const tsc = join(ROOT, 'node_modules', 'typescript', 'bin', 'tsc')
  const r = spawnSync(process.execPath, [tsc, '-p', project], { encoding: 'utf8' })
  try {
    if (r.status !== 0) {
      const output = `${r.stdout}${r.stderr}`.replace(new RegExp(`\\S*\\.tsc-${name}[\\\\/]${name}\\.mts`, 'g'), relative(process.cwd(), entry) || entry)
      const unknownName = /error TS2304|error TS2552|error TS2749|error TS2693/.test(output)
      const why = !unknownName ? ''
        : kind === 'partOne' ? 'Part I names Part II: something above the fence in dsh.ts uses a name only Part II declares. Move that name into Part I or the use into Part II.\n'
        : kind === 'runtime' ? 'The runtime\'s sections of Part II (the file store to the end) name the rest of Part II: the runtime bundle carries only Part I and those. Move the name into them (or Part I), or the use out of them.\n'
        : ''
      const what = kind === 'partOne' ? 'Part I of ' : kind === 'runtime' ? 'the runtime (Part I + the file store to the end) of ' : ''
      throw new Error(`${why}tsc on ${what}${entry} failed (exit ${r.status}):\n${output}`)
    }
    if (kind === 'partOne') return
    const outFile = join(outdir, `${name}.d.mts`)
    const dts = join(scratch, `${name}.d.mts`)
    statSync(dts) // throws ENOENT if tsc emitted nothing
    renameSync(dts, outFile)
    const map = JSON.parse(readFileSync(`${dts}.map`, 'utf8'))
    map.file = basename(outFile)
    map.sources = [relative(outdir, entry)]
    writeFileSync(`${outFile}.map`, JSON.stringify(map))
  } finally {
    rmSync(scratch, { recursive: true, force: true })
  }
}

if (process.argv[1] && resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  const { values } = parseArgs({
    options: { entry: { type: 'string' }, outdir: { type: 'string' }, 'no-dts': { type: 'boolean' } },
  })
  try {
    await build({ entry: values.entry, outdir: values.outdir, dts: !values['no-dts'] })
  } catch (err) {
    // esbuild has already printed its errors with file:line; its message repeats them in one line.
    if (!(err && Array.isArray(err.errors))) console.error(err instanceof Error ? err.message : err)
    process.exit(1)
  }
}
