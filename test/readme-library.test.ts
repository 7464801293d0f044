// The README's first library snippet as a newcomer pastes it (issue 29 item 5): into an ESM project
// beside the bundles of `npm run build`, importing each name from the file its comment names
// (dist/dsh.mjs: the runtime; dist/cli.mjs: builtinTools), run with plain node. And what
// `console.log(session.measure())` prints: the figures, not the whole surface.
import { test, after } from 'node:test'
import assert from 'node:assert/strict'
import { execFile } from 'node:child_process'
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { inspect } from 'node:util'
import { fileURLToPath } from 'node:url'
import { startFakeProvider } from './fake-provider.ts'
import { MemoryStore, Session } from '../dsh.ts'

const ROOT = fileURLToPath(new URL('..', import.meta.url))
const work = mkdtempSync(join(tmpdir(), 'dsh-readme-'))
after(() => rmSync(work, { recursive: true, force: true }))

const run = (file: string, args: string[], env: Record<string, string | undefined> = process.env) => new Promise<{ code: number; out: string }>((resolve) => {
  execFile(file, args, { cwd: work, env, timeout: 60_000 }, (err, stdout, stderr) => resolve({ code: err ? Number((err as { code?: number }).code ?? 1) : 0, out: stdout + stderr }))
})

/** The first ```ts block of the README's "Use it as a library" section. */
function firstLibrarySnippet(): string {
  const readme = readFileSync(join(ROOT, 'README.md'), 'utf8')
  const section = readme.slice(readme.indexOf('## Use it as a library'))
  const m = /```ts\n([^]*?)```/.exec(section)
  assert.ok(m, 'the section has a ts snippet')
  return m[1]
}

test('the README\'s first library snippet runs as pasted with the bundles: each import from the file its comment names, in an ESM project', async () => {
  const snippet = firstLibrarySnippet()
  assert.match(snippet, /import \{ builtinTools \} from '\.\/dsh\.ts' \/\/ .*'\.\/dist\/cli\.mjs'/, 'the snippet says where builtinTools comes from with the bundles')
  // The newcomer's edit: each './dsh.ts' becomes the bundle its comment names.
  const pasted = snippet.replace(/from '\.\/dsh\.ts'( \/\/[^\n]*?'(\.\/dist\/[\w.]+)'[^\n]*)/g, "from '$2'$1")
  assert.doesNotMatch(pasted, /from '\.\/dsh\.ts'/)
  const built = await run(process.execPath, [join(ROOT, 'build.mjs'), '--outdir', join(work, 'dist'), '--no-dts'])
  assert.equal(built.code, 0, built.out)
  writeFileSync(join(work, 'package.json'), '{ "type": "module" }\n') // an ESM project, as the README says
  writeFileSync(join(work, 'snippet.js'), pasted)
  const fake = await startFakeProvider({ handler: () => ({ text: 'Fixed.' }) })
  try {
    const env: Record<string, string | undefined> = { ...process.env, DEEPSEEK_API_KEY: 'sk-test', DSH_TEST_MODEL_URL: fake.url, NODE_OPTIONS: `--import ${join(ROOT, 'test', 'redirect-fetch.mjs')}` }
    delete env.NODE_TEST_CONTEXT
    const r = await run(process.execPath, ['snippet.js'], env)
    assert.equal(r.code, 0, r.out)
    assert.equal(fake.requests.length, 1)
    assert.deepEqual(fake.requests[0].body.tools.map((t: any) => t.function.name), ['read_file', 'list_files', 'grep', 'write_file', 'edit_file'])
    // The answer, then the measurement as figures (nodes as a count: the input and the answer).
    assert.match(r.out, /Fixed\. \{\n  calibration: 1,\n[^]*  totalTokens: \d+,\n[^]*  anchored: true,\n[^]*  nodes: 2\n\}\n/)
    assert.doesNotMatch(r.out, /role:|You are …/, 'not the surface, not the header')
  } finally { await fake.close() }
})

test('console.log(session.measure()) prints the figures, nodes as a count; JSON.stringify the same; the fields stay as they were', async () => {
  const session = await Session.open(new MemoryStore())
  session.append('user/message', { message: { role: 'user', content: 'Why does the build fail?' }, surfaceOp: { op: 'append' } })
  const m = session.measure()
  assert.equal(inspect(m), [
    '{', '  calibration: 1,', '  calibrationOffsetTokens: 0,', '  calibrationSamples: 0,', '  totalTokens: 14,', '  envelopeTokens: 0,',
    '  surfaceTokens: 14,', '  heuristicTokens: 14,', '  anchored: false,', '  anchor: undefined,', '  nodes: 1', '}',
  ].join('\n'))
  assert.deepEqual(JSON.parse(JSON.stringify(m)), { calibration: 1, calibrationOffsetTokens: 0, calibrationSamples: 0, totalTokens: 14, envelopeTokens: 0, surfaceTokens: 14, heuristicTokens: 14, anchored: false, nodes: 1 })
  assert.equal(m.nodes.length, 1)
  assert.equal(m.nodes[0].message.role, 'user')
  assert.equal(m.totalTokens, 14)
})
