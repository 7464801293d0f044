// The package as a user gets it: `npm pack` (its prepack runs build.mjs) on a copy of the checkout,
// the tarball installed into a fresh project with `npm install --offline`, then `npx dsh` there,
// the runtime imported by its package name, and TypeScript resolving the shipped types, both
// through the exports map and beside a copied dist/dsh.mjs. Everything happens in a temp dir; the
// checkout's own dist/ is never touched.
import { after, before, test } from 'node:test'
import assert from 'node:assert/strict'
import { execFile, execFileSync } from 'node:child_process'
import { copyFileSync, mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'
import * as dshSource from '../dsh.ts'
import { RUNTIME_EXPORTS } from './parts.ts'

const ROOT = dirname(dirname(fileURLToPath(import.meta.url)))
const TSC = join(ROOT, 'node_modules', 'typescript', 'bin', 'tsc')
const work = mkdtempSync(join(tmpdir(), 'dsh-package-'))
after(() => rmSync(work, { recursive: true, force: true }))

interface Run { code: number | null; stdout: string; stderr: string }
function run(file: string, args: string[], cwd: string): Promise<Run> {
  // Offline and with a private npm cache: nothing here may reach a registry.
  const env = { ...process.env, NO_COLOR: '1', npm_config_offline: 'true', npm_config_cache: join(work, 'npm-cache'), npm_config_update_notifier: 'false' }
  return new Promise((resolve) => {
    execFile(file, args, { cwd, env, maxBuffer: 64 * 1024 * 1024 }, (err, stdout, stderr) => {
      resolve({ code: err ? (typeof err.code === 'number' ? err.code : null) : 0, stdout, stderr })
    })
  })
}
const npm = (args: string[], cwd: string) => run('npm', args, cwd)
const tsc = (cwd: string) => run(process.execPath, [TSC, '-p', join(cwd, 'tsconfig.json')], cwd)

/** A TypeScript consumer's config: strict, NodeNext resolution, as a user's project would have. */
const CONSUMER_TSCONFIG = JSON.stringify({
  compilerOptions: { target: 'ES2022', module: 'NodeNext', moduleResolution: 'NodeNext', strict: true, noEmit: true, skipLibCheck: false, types: [], lib: ['ES2023', 'DOM'] },
  include: ['*.ts'],
})

let packed: { files: string[]; tarball: string }
const app = join(work, 'app')
let installed: Run

before(async () => {
  // The checkout as git has it (a fresh clone), with the dev dependencies the build needs linked in.
  const pkg = join(work, 'pkg')
  for (const file of execFileSync('git', ['ls-files'], { cwd: ROOT, encoding: 'utf8' }).split('\n').filter(Boolean)) {
    mkdirSync(dirname(join(pkg, file)), { recursive: true })
    try { copyFileSync(join(ROOT, file), join(pkg, file)) } catch { /* deleted in the worktree but not yet committed */ }
  }
  symlinkSync(join(ROOT, 'node_modules'), join(pkg, 'node_modules'), 'dir')
  const p = await npm(['pack', '--json', '--pack-destination', work], pkg)
  assert.equal(p.code, 0, `npm pack failed:\n${p.stderr}`)
  const [info] = JSON.parse(p.stdout.slice(p.stdout.indexOf('[')))
  packed = { files: info.files.map((f: { path: string }) => f.path).sort(), tarball: join(work, info.filename) }

  mkdirSync(app)
  writeFileSync(join(app, 'package.json'), JSON.stringify({ name: 'app', private: true, type: 'module' }))
  installed = await npm(['install', '--no-audit', '--no-fund', packed.tarball], app)
})

test('npm pack ships the source, the bundles, their types, the docs it cites and the LICENSE; no tests', () => {
  for (const f of ['LICENSE', 'README.md', 'package.json', 'dsh.ts', 'dist/dsh.mjs', 'dist/dsh.d.mts', 'dist/dsh.iife.js', 'dist/cli.mjs', 'dist/cli.d.mts', 'docs/design.md']) {
    assert.ok(packed.files.includes(f), `${f} is missing from the tarball: ${packed.files.join(', ')}`)
  }
  assert.deepEqual(packed.files.filter((f) => /^(test|bench|node_modules|examples)\//.test(f) || f.endsWith('.test.ts')), [])
  const license = readFileSync(join(ROOT, 'LICENSE'), 'utf8')
  assert.match(license, /^MIT License\n/)
  assert.equal(JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')).license, 'MIT')
})

test('installed from the tarball, `npx dsh --help` and `npx dsh --version` work', async () => {
  assert.equal(installed.code, 0, `npm install failed:\n${installed.stderr}`)
  const help = await run('npx', ['dsh', '--help'], app)
  assert.deepEqual([help.code, help.stderr], [0, ''], help.stderr)
  assert.equal(help.stdout, dshSource.cliHelp())
  const version = await run('npx', ['dsh', '--version'], app)
  assert.deepEqual([version.code, version.stdout], [0, `dsh.ts ${dshSource.VERSION}\n`])
  const bad = await run('npx', ['dsh', '--no-such-flag'], app)
  assert.equal(bad.code, 2, 'a usage error exits 2 through the bin too')
})

test('the installed package: `dsh.ts` is the runtime (Part I + FileStore), `dsh.ts/cli` everything; importing starts nothing', async () => {
  const script = "const r = await import('dsh.ts'); const c = await import('dsh.ts/cli');" +
    'console.log(JSON.stringify([Object.keys(r).sort(), Object.keys(c).sort(), new r.MemoryStore() instanceof Object]))'
  const r = await run(process.execPath, ['--input-type=module', '-e', script], app)
  assert.equal(r.code, 0, r.stderr)
  const [runtime, cli, ok] = JSON.parse(r.stdout)
  assert.deepEqual(runtime, RUNTIME_EXPORTS)
  assert.deepEqual(cli, Object.keys(dshSource).sort())
  assert.equal(ok, true)
})

test('TypeScript finds the types through the exports map (and they are real types, not any)', async () => {
  assert.equal(installed.code, 0, installed.stderr)
  writeFileSync(join(app, 'tsconfig.json'), CONSUMER_TSCONFIG)
  writeFileSync(join(app, 'ok.ts'), [
    "import { Session, MemoryStore, pruneText, type Message } from 'dsh.ts'",
    "import { builtinTools } from 'dsh.ts/cli'",
    "const m: Message = { role: 'user', content: 'hi' }",
    'export const s: Promise<Session> = Session.open(new MemoryStore())',
    'export const t: string = pruneText(m.content as string)',
    'export const names: Promise<string[]> = builtinTools({ cwd: "." }).then((tools) => tools.map((tool) => tool.name))',
  ].join('\n'))
  const ok = await tsc(app)
  assert.equal(ok.code, 0, ok.stdout + ok.stderr)
  writeFileSync(join(app, 'bad.ts'), "import { VERSION } from 'dsh.ts'\nexport const n: number = VERSION\n")
  const bad = await tsc(app)
  assert.notEqual(bad.code, 0)
  assert.match(bad.stdout, /bad\.ts\(2,14\): error TS2322: Type 'string' is not assignable to type 'number'/)
  rmSync(join(app, 'bad.ts'))
})

test('a copied dist/dsh.mjs finds its types in the dsh.d.mts beside it', async () => {
  const copy = join(work, 'copied')
  mkdirSync(copy)
  const dist = join(app, 'node_modules', 'dsh.ts', 'dist')
  copyFileSync(join(dist, 'dsh.mjs'), join(copy, 'dsh.mjs'))
  writeFileSync(join(copy, 'package.json'), JSON.stringify({ type: 'module' }))
  writeFileSync(join(copy, 'tsconfig.json'), CONSUMER_TSCONFIG)
  writeFileSync(join(copy, 'main.ts'), "import { estimateTextTokens } from './dsh.mjs'\nexport const n: number = estimateTextTokens('four')\n")
  const without = await tsc(copy)
  assert.notEqual(without.code, 0, 'without dsh.d.mts the import has no types (strict: TS7016)')
  assert.match(without.stdout, /TS7016/)
  copyFileSync(join(dist, 'dsh.d.mts'), join(copy, 'dsh.d.mts'))
  const typed = await tsc(copy)
  assert.equal(typed.code, 0, typed.stdout + typed.stderr)
})
