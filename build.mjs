// Builds dsh.ts into dist/ (docs/design.md §0, issue 6):
//   dsh.mjs      ESM, platform-neutral, minified, with a source map (Node, Deno, Bun, workerd, bundlers)
//   dsh.iife.js  the same as a classic script defining the global `DSH` (script-only runtimes such
//                as Vercel's edge-runtime), minified, with a source map
//   dsh.d.ts     declarations from TypeScript's `tsc -p tsconfig.dts.json` (emitDeclarationOnly)
// Then prints each file's size: raw bytes and gzip -9 bytes.
//
// The neutral build is the edge-safety check: a static `import … from 'node:…'` in the core fails
// the build with a message naming the module; a dynamic `await import('node:…')` (the CLI and the
// file store load node modules lazily) is left external and runs where `node:` exists.
//
// Usage: node build.mjs [--entry FILE] [--outdir DIR] [--no-dts]   (defaults: dsh.ts, dist)
// Exit code 1 on any build error. Importable too: `import { build } from './build.mjs'`.
import * as esbuild from 'esbuild'
import { spawnSync } from 'node:child_process'
import { mkdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs'
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

/**
 * Builds the bundles and declarations. Returns the written files with their sizes (bytes).
 * Throws on an esbuild error (already printed by esbuild) or a tsc error.
 * @param {{ entry?: string, outdir?: string, dts?: boolean, log?: (line: string) => void }} [options]
 */
export async function build({ entry = join(ROOT, 'dsh.ts'), outdir = join(ROOT, 'dist'), dts = true, log = console.log } = {}) {
  entry = resolve(entry)
  outdir = resolve(outdir)
  rmSync(outdir, { recursive: true, force: true })
  mkdirSync(outdir, { recursive: true })

  const common = {
    entryPoints: [entry],
    bundle: true,
    platform: 'neutral',
    target: TARGET,
    minify: true,
    sourcemap: true,
    legalComments: 'none',
    plugins: [nodeImportsDynamicOnly],
    // Keep every import as written: TypeScript semantics would drop an unused
    // `import { readFile } from 'node:fs'` as possibly type-only, hiding it from the check above,
    // while Deno, Bun and tsx running dsh.ts itself would still load it. (dsh.ts has no imports.)
    tsconfigRaw: { compilerOptions: { verbatimModuleSyntax: true } },
    logLevel: 'warning',
  }
  await esbuild.build({ ...common, format: 'esm', outfile: join(outdir, 'dsh.mjs') })
  await esbuild.build({
    ...common,
    format: 'iife',
    globalName: 'DSH',
    outfile: join(outdir, 'dsh.iife.js'),
    // A script has no import.meta; esbuild turns it into `{}`, and the CLI's entry-point check
    // treats a missing import.meta.url as "not the entry point" (TOOLCHAIN.md, edge-runtime).
    logOverride: { 'empty-import-meta': 'silent' },
  })

  const files = ['dsh.mjs', 'dsh.iife.js']
  if (dts) {
    files.push('dsh.d.ts')
    runTsc(entry, outdir)
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
 * Declarations through the native TypeScript 7 `tsc`. A file argument beside tsconfig.json fails
 * (TS5112), so it always runs `-p` on a config: tsconfig.dts.json for dsh.ts, or for another entry
 * (tests build temporary copies) a throwaway config in outdir that extends it.
 */
function runTsc(entry, outdir) {
  let project = join(ROOT, 'tsconfig.dts.json')
  if (entry !== join(ROOT, 'dsh.ts')) {
    project = join(outdir, 'tsconfig.dts.json')
    writeFileSync(project, JSON.stringify({
      extends: join(ROOT, 'tsconfig.dts.json'),
      compilerOptions: { rootDir: dirname(entry), typeRoots: [join(ROOT, 'node_modules', '@types')] },
      files: [entry],
    }))
  }
  const tsc = join(ROOT, 'node_modules', 'typescript', 'bin', 'tsc')
  const r = spawnSync(process.execPath, [tsc, '-p', project, '--outDir', outdir], { encoding: 'utf8' })
  if (project.startsWith(outdir)) rmSync(project)
  if (r.status !== 0) throw new Error(`tsc -p ${project} failed (exit ${r.status}):\n${r.stdout}${r.stderr}`)
  const produced = join(outdir, basename(entry).replace(/\.ts$/, '.d.ts'))
  if (produced !== join(outdir, 'dsh.d.ts')) throw new Error(`tsc wrote ${produced}; expected an entry named dsh.ts`)
  statSync(produced) // throws ENOENT if tsc emitted nothing
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
