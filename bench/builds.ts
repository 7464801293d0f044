// Builds of dsh.ts for the benchmarks that compare code (bench/compare.ts) or profile it
// (bench/durable.bench.ts): the working tree's file or a commit's (`git show REV:dsh.ts`), bundled by
// esbuild into one ESM file with a linked source map (so profile frames map back to dsh.ts lines).
import { execFileSync } from 'node:child_process'
import { writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { pathToFileURL } from 'node:url'
import * as esbuild from 'esbuild'
import { ROOT } from './lib.ts'

/** A bundled build: where it is, what it was built from. */
export interface Build { label: string; commit: string; bundle: string }

/** `git rev-parse --short REV` in the repository; throws a clear error when REV is not a commit. */
export function resolveCommit(rev: string): string {
  try {
    return execFileSync('git', ['rev-parse', '--short', '--verify', `${rev}^{commit}`], { cwd: ROOT, encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] }).trim()
  } catch {
    throw new Error(`"${rev}" is not a commit of this repository (git rev-parse --verify failed); give a hash, a branch or a tag`)
  }
}

/** Bundles `source` (a dsh.ts) to `<dir>/<name>.mjs` + `.mjs.map`: ESM, platform node, `node:` imports left external. */
export async function bundleDsh(source: string, dir: string, name: string): Promise<string> {
  const outfile = join(dir, `${name}.mjs`)
  await esbuild.build({ entryPoints: [source], bundle: true, format: 'esm', platform: 'node', target: 'node20', external: ['node:*'], outfile, sourcemap: 'linked', logLevel: 'error' })
  return outfile
}

/**
 * Bundles a bench script (TypeScript, e.g. bench/durable-child.ts) to `<dir>/<name>.mjs` for plain
 * `node` — no tsx in the measured process. Under `--import tsx` every dynamic `import()` goes
 * through tsx's loader hooks on another thread, and FileStore's lazy `importNode('node:fs/promises')`
 * per call then costs a cross-thread round trip that a user running the built dsh.mjs never pays.
 * Its packages are bundled in too (the file lives in a temp dir, away from node_modules); a build of
 * dsh.ts is loaded by the script with a dynamic `import(path)`, which stays unbundled.
 */
export async function bundleScript(entry: string, dir: string, name: string): Promise<string> {
  const outfile = join(dir, `${name}.mjs`)
  await esbuild.build({ entryPoints: [entry], bundle: true, format: 'esm', platform: 'node', target: 'node20', outfile, logLevel: 'error' })
  return outfile
}

/** The working tree's dsh.ts, bundled into `dir`. */
export async function buildWorkingTree(dir: string): Promise<Build> {
  return { label: 'working tree', commit: 'working tree', bundle: await bundleDsh(join(ROOT, 'dsh.ts'), dir, 'dsh-worktree') }
}

/** dsh.ts as of commit `rev` (`git show REV:dsh.ts` into `dir`), bundled into `dir`. */
export async function buildCommit(rev: string, dir: string): Promise<Build> {
  const commit = resolveCommit(rev)
  const source = join(dir, `dsh-${commit}.ts`)
  writeFileSync(source, execFileSync('git', ['show', `${commit}:dsh.ts`], { cwd: ROOT, maxBuffer: 64 * 1024 * 1024 }))
  return { label: commit, commit, bundle: await bundleDsh(source, dir, `dsh-${commit}`) }
}

/** Imports a build's bundle (each bundle is its own module: two builds live side by side in one process). */
export async function importBuild(build: Build): Promise<Record<string, any>> {
  return (await import(pathToFileURL(build.bundle).href)) as Record<string, any>
}
