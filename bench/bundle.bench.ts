// Benchmark 4 (issue 7): the size of `dist/dsh.mjs` minified and gzipped, and the time to import it
// in Node, Deno and Bun (whole process, several runs), beside `openai` (the npm SDK) and `ai`
// (Vercel AI SDK core) bundled the same way.
import { spawnSync } from 'node:child_process'
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { pathToFileURL } from 'node:url'
import { gzipSync } from 'node:zlib'
import * as esbuild from 'esbuild'
import { ROOT, fmtBytes, fmtRatio, fmtStats, fmtTime, nowMs, stats, table, type Section, type Target } from './lib.ts'

const RUNS = 9
/**
 * The esbuild settings of build.mjs for dist/dsh.mjs (ESM, es2022, minified, no legal comments),
 * used for every bundle here. Platform `browser` rather than build.mjs's `neutral`: `ai` needs it
 * (its @vercel/oidc dependency requires node's fs, path and os, which only the browser field maps
 * away); `node:` imports stay external (dsh loads them lazily in the CLI and file store only).
 */
const SAME_WAY: esbuild.BuildOptions = {
  bundle: true, format: 'esm', platform: 'browser', target: 'es2022', minify: true, legalComments: 'none',
  external: ['node:*'], logLevel: 'error', write: true,
}

interface Bundle { name: string; file: string; bytes: number; gzip: number; note: string }
interface Runtime { name: string; command: string; args: (entry: string) => string[]; env?: Record<string, string> }

function binary(name: string): string | undefined {
  const local = join(ROOT, 'node_modules', '.bin', name)
  if (existsSync(local)) return local
  const found = spawnSync('sh', ['-c', `command -v ${name}`], { encoding: 'utf8' })
  return found.status === 0 ? found.stdout.trim() : undefined
}

function sizes(file: string): { bytes: number; gzip: number } {
  const b = readFileSync(file)
  return { bytes: b.length, gzip: gzipSync(b, { level: 9 }).length }
}

/**
 * One process start whose entry imports `entry`'s bundle. Returns the wall time from spawn to exit
 * and the `import()` time the process measured itself (both ms), or the error text.
 */
function startOnce(rt: Runtime, entry: string): { wallMs: number; importMs: number } | string {
  const t0 = nowMs()
  const r = spawnSync(rt.command, rt.args(entry), { cwd: ROOT, encoding: 'utf8', env: { ...process.env, ...rt.env }, timeout: 60_000 })
  const wallMs = nowMs() - t0
  const importMs = Number(r.stdout.trim().split('\n').pop())
  if (r.status !== 0 || !Number.isFinite(importMs)) return (r.stderr || r.error?.message || `exit ${r.status}`).trim().split('\n').slice(0, 3).join(' ')
  return { wallMs, importMs }
}

const signed = (ms: number) => (ms < 0 ? `−${fmtTime(-ms)}` : `+${fmtTime(ms)}`)

export default async function bundle(): Promise<Section> {
  const dir = mkdtempSync(join(tmpdir(), 'dsh-bench-bundle-'))
  try {
    const bundles: Bundle[] = []
    const notes: string[] = []
    // dist/dsh.mjs exactly as build.mjs makes it (docs/design.md §0), when build.mjs has landed.
    if (existsSync(join(ROOT, 'build.mjs'))) {
      const out = join(dir, 'dist')
      const r = spawnSync(process.execPath, [join(ROOT, 'build.mjs'), '--outdir', out, '--no-dts'], { cwd: ROOT, encoding: 'utf8', timeout: 120_000 })
      if (r.status === 0 && existsSync(join(out, 'dsh.mjs'))) bundles.push({ name: 'dsh — dist/dsh.mjs (build.mjs)', file: join(out, 'dsh.mjs'), ...sizes(join(out, 'dsh.mjs')), note: 'platform neutral' })
      else notes.push(`build.mjs failed: ${(r.stderr || r.stdout).trim().split('\n').slice(-3).join(' ')}`)
    } else notes.push('build.mjs (issue 6) has not landed on this branch yet: the dist/dsh.mjs row is missing; dsh.ts is bundled here with the same settings instead.')
    const sources = [['openai', "export * from 'openai'"], ['ai', "export * from 'ai'"]]
    if (bundles.length === 0) sources.unshift(['dsh — dsh.ts', `export * from ${JSON.stringify(join(ROOT, 'dsh.ts'))}`])
    for (const [name, entry] of sources) {
      const file = join(dir, `${name.split(' ')[0]}.mjs`)
      await esbuild.build({ ...SAME_WAY, stdin: { contents: entry, resolveDir: ROOT, loader: 'js' }, outfile: file })
      bundles.push({ name: name === 'dsh — dsh.ts' ? 'dsh — dsh.ts, same settings as the others' : `${name} ${JSON.parse(readFileSync(join(ROOT, 'node_modules', name, 'package.json'), 'utf8')).version}`, file, ...sizes(file), note: 'platform browser' })
    }

    // Start-up: a process whose entry imports one bundle (and times its own import()), against one that imports nothing.
    const empty = join(dir, 'entry-empty.mjs')
    writeFileSync(empty, 'console.log(0)\n')
    const entries = bundles.map((b, i) => {
      const e = join(dir, `entry-${i}.mjs`)
      writeFileSync(e, [
        'const t0 = performance.now()',
        `const m = await import(${JSON.stringify(pathToFileURL(b.file).href)})`,
        'const ms = performance.now() - t0',
        "if (Object.keys(m).length === 0) throw new Error('no exports')",
        'console.log(ms)',
      ].join('\n'))
      return e
    })
    const runtimes: Runtime[] = [{ name: `Node ${process.version}`, command: process.execPath, args: (e) => [e] }]
    const deno = binary('deno')
    if (deno) runtimes.push({ name: 'Deno', command: deno, args: (e) => ['run', '--quiet', '--no-prompt', `--allow-read=${dir}`, e], env: { DENO_NO_UPDATE_CHECK: '1', DENO_DIR: join(dir, 'deno-cache') } })
    else notes.push('Deno is not installed here (it comes with the issue-6 dev dependencies): no Deno row.')
    const bun = binary('bun')
    if (bun) runtimes.push({ name: 'Bun', command: bun, args: (e) => [e] })
    else notes.push('Bun is not installed here (it comes with the issue-6 dev dependencies): no Bun row.')
    for (const rt of runtimes.slice(1)) {
      const v = spawnSync(rt.command, ['--version'], { encoding: 'utf8' })
      rt.name = `${rt.name} ${(v.stdout || '').trim().split('\n')[0].replace(/^(deno|bun)\s*/i, '').split(' ')[0]}`
    }

    const startRows: string[][] = []
    for (const rt of runtimes) {
      const all = [empty, ...entries]
      const wall: number[][] = all.map(() => [])
      const imp: number[][] = all.map(() => [])
      const failed: (string | undefined)[] = all.map(() => undefined)
      for (const e of all) startOnce(rt, e) // warm the file-system cache and any runtime cache once
      for (let r = 0; r < RUNS; r++) {
        all.forEach((e, i) => {
          if (failed[i]) return
          const t = startOnce(rt, e)
          if (typeof t === 'string') failed[i] = t
          else { wall[i].push(t.wallMs); imp[i].push(t.importMs) }
        })
      }
      if (failed[0]) { startRows.push([rt.name, 'nothing (empty entry)', `failed: ${failed[0]}`, '', '']); continue }
      const base = stats(wall[0])
      startRows.push([rt.name, 'nothing (empty entry)', fmtStats(base), '—', '—'])
      bundles.forEach((b, i) => {
        if (failed[i + 1]) { startRows.push([rt.name, b.name, `failed: ${failed[i + 1]!.slice(0, 160)}`, '', '']); return }
        const w = stats(wall[i + 1])
        startRows.push([rt.name, b.name, fmtStats(w), signed(w.median - base.median), fmtStats(stats(imp[i + 1]))])
      })
    }

    const dsh = bundles.find((b) => b.name.startsWith('dsh — dist')) ?? bundles.find((b) => b.name.startsWith('dsh'))!
    const openai = bundles.find((b) => b.name.startsWith('openai'))!
    const ai = bundles.find((b) => b.name.startsWith('ai'))!
    const targets: Target[] = [{
      name: 'bundle size', target: 'report (no numeric target)', met: undefined,
      measured: `${fmtBytes(dsh.gzip)} gzipped (${fmtBytes(dsh.bytes)} minified); openai ${fmtRatio(openai.gzip / dsh.gzip)}, ai ${fmtRatio(ai.gzip / dsh.gzip)} larger`,
    }]
    return {
      id: 'bundle', title: 'Bundle and start-up', status: 'ran', targets,
      reason: notes.length ? notes.join(' ') : undefined,
      method: [
        'Sizes: each bundle built with esbuild as build.mjs builds dist/dsh.mjs (ESM, es2022, minified, no legal comments;',
        'for the comparison bundles `export * from \'<package>\'` on platform `browser`, which `ai` needs) and gzipped',
        'at level 9. Start-up: a fresh process per run whose entry file imports one bundle with `import()`; the wall time from',
        `spawn to exit, and the time the process measured around its own \`import()\` (performance.now); ${RUNS} runs each,`,
        'interleaved, after one untimed run of each. "vs empty entry" = median minus the median of the same runtime running an',
        'entry that imports nothing. On a busy 2-core machine the whole-process figures are noisy; the `import()` column is not.',
        ...notes.map((n) => `*${n}*`),
      ].join('\n'),
      tables: [
        table(['bundle', 'minified', 'gzip -9', 'gzip vs dsh', 'note'], bundles.map((b) => [b.name, fmtBytes(b.bytes), fmtBytes(b.gzip), fmtRatio(b.gzip / dsh.gzip), b.note])),
        table(['runtime', 'imports', 'whole process', 'vs empty entry', '`import()` inside the process'], startRows),
      ],
    }
  } finally {
    rmSync(dir, { recursive: true, force: true })
  }
}
