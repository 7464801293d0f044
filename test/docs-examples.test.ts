// The "Use it in …" examples of docs/runtimes.md, run as a user would run them (issue 6): each
// example file is copied into a temp dir beside dsh.ts / dist/dsh.mjs / dist/dsh.iife.js and run
// with the command the doc gives; the doc must quote each example file verbatim. The examples talk
// to a model server at 127.0.0.1:8000 (and serve on 8080); the copies use free ports instead: the
// fake OpenAI-compatible server of test/fake-provider.ts stands in for the model.
import { after, before, test } from 'node:test'
import assert from 'node:assert/strict'
import { execFile, execFileSync, spawn } from 'node:child_process'
import { copyFileSync, existsSync, lstatSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { gzipSync } from 'node:zlib'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { startFakeProvider, type FakeProvider, type FakeReply, type FakeRequest } from './fake-provider.ts'

const ROOT = dirname(dirname(fileURLToPath(import.meta.url)))
const EXAMPLES = join(ROOT, 'docs', 'examples')
const DOC = join(ROOT, 'docs', 'runtimes.md')
const BIN = join(ROOT, 'node_modules', '.bin')
const EXAMPLE_FILES = ['main.ts', 'worker.mjs', 'config.capnp', 'edge.js']
const TIMEOUT_MS = 30_000
/** The model server the examples name. */
const MODEL_HOST = '127.0.0.1:8000'
/**
 * What every example reports: the fake model calls `add` with {a: 2, b: 3}, then answers with the
 * tool result it received — so '5' proves the tool ran and its result reached the model.
 */
const EXPECTED = { text: '2 + 3 = 5', steps: 2 }

const work = mkdtempSync(join(tmpdir(), 'dsh-examples-'))
let fake: FakeProvider
after(async () => {
  await fake?.close()
  rmSync(work, { recursive: true, force: true })
})

before(async () => {
  const built = await new Promise<string | null>((resolve) => {
    execFile(process.execPath, [join(ROOT, 'build.mjs'), '--outdir', join(work, 'dist'), '--no-dts'], (err, stdout, stderr) => resolve(err ? stdout + stderr : null))
  })
  assert.equal(built, null, 'node build.mjs failed')
  // The user's project: the examples beside the files they import.
  fake = await startFakeProvider({
    handler: (request: FakeRequest): FakeReply => {
      const last = request.body.messages.at(-1)
      return last.role === 'tool' ? { text: `2 + 3 = ${last.content}` } : { toolCalls: [{ name: 'add', arguments: { a: 2, b: 3 } }] }
    },
  })
  const modelHost = new URL(fake.url).host
  for (const name of EXAMPLE_FILES) writeFileSync(join(work, name), readFileSync(join(EXAMPLES, name), 'utf8').replaceAll(MODEL_HOST, modelHost))
  copyFileSync(join(ROOT, 'dsh.ts'), join(work, 'dsh.ts'))
  for (const name of ['dsh.mjs', 'dsh.iife.js']) copyFileSync(join(work, 'dist', name), join(work, name))
})

const env = { ...process.env, DENO_NO_UPDATE_CHECK: '1', DO_NOT_TRACK: '1', NO_COLOR: '1' }

/** Runs a command to completion in the example dir; resolves with its stdout, rejects with its output. */
function run(file: string, args: string[]): Promise<string> {
  return new Promise((resolve, reject) => {
    execFile(file, args, { cwd: work, env, timeout: TIMEOUT_MS }, (err, stdout, stderr) => {
      if (err) reject(new Error(`${file} ${args.join(' ')}: ${err.message}\n${stdout}${stderr}`))
      else resolve(stdout)
    })
  })
}

/**
 * Starts a server process, waits for `ready` to find its URL in what it prints, GETs it, stops it.
 * `fd` is the stream the server announces itself on (workerd: a control fd; edge-runtime: stdout).
 */
function serveAndGet(file: string, args: string[], fd: 1 | 3, ready: (text: string) => string | undefined): Promise<string> {
  return new Promise((resolve, reject) => {
    const child = spawn(file, args, { cwd: work, env, stdio: ['ignore', 'pipe', 'pipe', 'pipe'] })
    let announced = '', output = ''
    const timer = setTimeout(() => finish(new Error(`no URL within ${TIMEOUT_MS} ms`)), TIMEOUT_MS)
    const finish = (err: Error | null, body?: string) => {
      clearTimeout(timer)
      child.kill()
      if (err) reject(new Error(`${file} ${args.join(' ')}: ${err.message}\n${output}`))
      else resolve(body!)
    }
    child.stdout!.on('data', (d) => { output += d })
    child.stderr!.on('data', (d) => { output += d })
    child.on('exit', (code) => finish(new Error(`exited ${code} before answering`)))
    child.stdio[fd]!.on('data', (d) => {
      announced += d
      const url = ready(announced)
      if (!url) return
      child.stdio[fd]!.removeAllListeners('data')
      fetch(url).then(async (res) => {
        const text = await res.text()
        child.removeAllListeners('exit')
        finish(res.ok ? null : new Error(`HTTP ${res.status}: ${text}`), text)
      }, (err) => finish(err))
    })
  })
}

const EXAMPLE_RUNS: Array<[label: string, go: () => Promise<string>]> = [
  // The doc's own first line makes the folder an ES module package (top-level await needs it).
  ['Node: echo \'{"type": "module"}\' > package.json; npx tsx main.ts', () => {
    const line = `echo '{"type": "module"}' > package.json`
    assert.ok(readFileSync(DOC, 'utf8').includes(`\n${line} `), `docs/runtimes.md gives the line ${line}`)
    return run('bash', ['-c', `${line} && ${JSON.stringify(join(BIN, 'tsx'))} main.ts`])
  }],
  ['Deno: deno run --allow-net=127.0.0.1:8000 main.ts', () => run(join(BIN, 'deno'), ['run', '--no-prompt', `--allow-net=${new URL(fake.url).host}`, 'main.ts'])],
  ['Bun: bun main.ts', () => run(join(BIN, 'bun'), ['main.ts'])],
  ['Cloudflare Worker: workerd serve config.capnp', () => serveAndGet(join(BIN, 'workerd'),
    // The doc's port 8080 is replaced by a free one, which workerd reports on its control fd.
    ['serve', 'config.capnp', '--socket-addr', 'http=127.0.0.1:0', '--control-fd=3'], 3,
    (text) => { const m = /"socket":"http","port":(\d+)/.exec(text); return m ? `http://127.0.0.1:${m[1]}/` : undefined })],
  ['Vercel edge-runtime: cat dsh.iife.js edge.js > fn.js; edge-runtime --listen fn.js', async () => {
    writeFileSync(join(work, 'fn.js'), readFileSync(join(work, 'dsh.iife.js'), 'utf8') + readFileSync(join(work, 'edge.js'), 'utf8'))
    return serveAndGet(join(BIN, 'edge-runtime'), ['--listen', '--port', '0', 'fn.js'], 1,
      (text) => /Waiting incoming requests at `(http:\/\/[^`]+)`/.exec(text)?.[1])
  }],
]

for (const [label, go] of EXAMPLE_RUNS) {
  test(`docs example — ${label}`, async () => {
    const before = fake.requests.length
    assert.deepEqual(JSON.parse(await go()), EXPECTED)
    // Two requests: the question (with the tool offered), then the same with the call and its result.
    const [first, second] = fake.requests.slice(before).map((r) => r.body)
    assert.equal(fake.requests.length - before, 2)
    assert.deepEqual(first.messages, [{ role: 'user', content: 'What is 2 + 3? Use the add tool.' }])
    assert.deepEqual(first.tools.map((t: { function: { name: string } }) => t.function.name), ['add'])
    assert.deepEqual(second.messages.map((m: { role: string }) => m.role), ['user', 'assistant', 'tool'])
    assert.equal(second.messages[2].content, '5')
  })
}

test('docs/runtimes.md quotes every example file verbatim', () => {
  const doc = readFileSync(DOC, 'utf8')
  for (const name of EXAMPLE_FILES) {
    assert.ok(doc.includes(readFileSync(join(EXAMPLES, name), 'utf8')), `docs/runtimes.md does not quote docs/examples/${name} verbatim`)
  }
})

// ── Every snippet of README.md and docs/*.md, as written (issue 16) ─────────────────────────────
// Fenced blocks are run in a fresh copy of the repository (its tracked files, with this checkout's
// node_modules linked in: `npm ci` counts as done), beside a small project `../my-project`:
// - ```ts / ```js: written to a file in the copy's root and run with `node --import tsx`;
// - ```sh: run as one bash script (set -e) with node_modules/.bin on PATH and the prompt
//   "Say hello." on stdin; `npm ci` steps are dropped.
// Every model request a snippet makes goes to a fake server (test/redirect-fetch.mjs), so
// `DEEPSEEK_API_KEY=sk-...` works as written. Blocks without a language (output, usage text) and
// ```capnp are not programs. A block that equals a docs/examples file is run by the tests above;
// a block after `<!-- docs-test: skip: REASON -->` is skipped and listed.
interface Snippet { file: string; line: number; lang: string; code: string; skip?: string }

function snippetsOf(file: string): Snippet[] {
  const out: Snippet[] = []
  const lines = readFileSync(join(ROOT, file), 'utf8').split('\n')
  let open: Snippet | undefined
  let skip: string | undefined
  lines.forEach((text, i) => {
    if (open) {
      if (text.startsWith('```')) { out.push(open); open = undefined } else open.code += text + '\n'
      return
    }
    const fence = /^```(\w*)\s*$/.exec(text)
    if (fence) { open = { file, line: i + 1, lang: fence[1], code: '', skip }; skip = undefined; return }
    const marker = /^<!-- docs-test: skip: (.+) -->$/.exec(text)
    if (marker) skip = marker[1]
    else if (text.trim() !== '') skip = undefined
  })
  return out
}

const DOC_FILES = ['README.md', ...readdirSync(join(ROOT, 'docs')).filter((n) => n.endsWith('.md')).sort().map((n) => `docs/${n}`)]
const RUNNABLE = new Set(['ts', 'js', 'sh'])
const exampleTexts = EXAMPLE_FILES.map((name) => readFileSync(join(EXAMPLES, name), 'utf8'))
const snippets = DOC_FILES.flatMap(snippetsOf).filter((s) => RUNNABLE.has(s.lang))
const skipped = snippets.filter((s) => s.skip)
if (skipped.length) console.log(`docs snippets not run: ${skipped.map((s) => `${s.file}:${s.line} (${s.skip})`).join('; ')}`)

const copyRoot = mkdtempSync(join(tmpdir(), 'dsh-snippets-'))
const copy = join(copyRoot, 'dsh.ts')
let snippetModel: FakeProvider
after(async () => {
  await snippetModel?.close()
  rmSync(copyRoot, { recursive: true, force: true })
})
before(async () => {
  const files = execFileSync('git', ['ls-files', '--cached', '--others', '--exclude-standard'], { cwd: ROOT, encoding: 'utf8' }).split('\n').filter((f) => f !== '' && existsSync(join(ROOT, f)) && lstatSync(join(ROOT, f)).isFile())
  for (const f of files) { mkdirSync(dirname(join(copy, f)), { recursive: true }); copyFileSync(join(ROOT, f), join(copy, f)) }
  symlinkSync(join(ROOT, 'node_modules'), join(copy, 'node_modules'))
  mkdirSync(join(copyRoot, 'my-project'))
  writeFileSync(join(copyRoot, 'my-project', 'README.md'), '# my-project\n\nA small project for the docs snippets.\n')
  snippetModel = await startFakeProvider({ handler: () => ({ text: 'Hello from the fake model.' }) })
})

for (const [i, s] of snippets.entries()) {
  const covered = exampleTexts.includes(s.code)
  test(`docs snippet ${s.file}:${s.line} (${s.lang}) runs as written`, { skip: s.skip ? `not run: ${s.skip}` : covered ? 'run above as a docs/examples file' : false }, async () => {
    const env = {
      ...process.env, NO_COLOR: '1', DSH_TEST_MODEL_URL: snippetModel.url, NODE_OPTIONS: `--import ${join(ROOT, 'test', 'redirect-fetch.mjs')}`,
      PATH: `${join(copy, 'node_modules', '.bin')}:${process.env.PATH}`, DENO_NO_UPDATE_CHECK: '1',
      // The CLI keeps sessions and reads its configuration there, not in the host's home.
      XDG_STATE_HOME: join(copyRoot, 'state'), XDG_CONFIG_HOME: join(copyRoot, 'config'),
      // The variables the snippets name for keys: any value, the fake server takes all.
      DEEPSEEK_API_KEY: 'sk-docs-test', OPENAI_API_KEY: 'sk-docs-test', OPENROUTER_API_KEY: 'sk-docs-test', ANTHROPIC_API_KEY: 'sk-docs-test',
    }
    delete (env as Record<string, string | undefined>).NODE_TEST_CONTEXT
    let file: string, args: string[]
    if (s.lang === 'sh') {
      file = 'bash'
      const script = s.code.split('\n').map((line) => line.replace(/^npm ci( && |$)/, '')).join('\n')
      args = ['-c', `set -euo pipefail\n${script}`]
    } else {
      const name = `snippet-${i}.${s.lang === 'ts' ? 'ts' : 'mjs'}`
      writeFileSync(join(copy, name), s.code)
      file = process.execPath
      args = ['--import', 'tsx', name]
    }
    // Asynchronously: the fake model server runs in this process.
    const run = await new Promise<{ status: number | null; output: string }>((resolve, reject) => {
      const child = spawn(file, args, { cwd: copy, env, stdio: ['pipe', 'pipe', 'pipe'] })
      let output = ''
      child.stdout!.on('data', (d) => { output += d })
      child.stderr!.on('data', (d) => { output += d })
      child.stdin!.end('Say hello.\n')
      const timer = setTimeout(() => child.kill('SIGKILL'), TIMEOUT_MS)
      child.on('error', reject)
      child.on('close', (status) => { clearTimeout(timer); resolve({ status, output }) })
    })
    assert.equal(run.status, 0, `${s.file}:${s.line} exited ${run.status}\n${run.output}`)
  })
}

// ── The bundle sizes docs/runtimes.md quotes match a build of this tree (±10%) ──────────────────
test('docs/runtimes.md: the bundle size table matches `node build.mjs` within 10%', () => {
  const rows = [...readFileSync(DOC, 'utf8').matchAll(/^\| `dist\/([\w.]+)` \| ([\d,]+) \| ([\d,]+) \|$/gm)]
  assert.ok(rows.length >= 2, 'docs/runtimes.md has a bundle size table with `dist/…` rows')
  let checked = 0
  for (const [, name, raw, gz] of rows) {
    const file = join(work, 'dist', name)
    if (!existsSync(file)) { assert.match(name, /\.d\.m?ts$/, `the build writes dist/${name}`); continue } // declarations: the test builds with --no-dts
    const bytes = readFileSync(file)
    const actual = { raw: bytes.length, gzip: gzipSync(bytes, { level: 9 }).length }
    const quoted = { raw: Number(raw.replaceAll(',', '')), gzip: Number(gz.replaceAll(',', '')) }
    for (const k of ['raw', 'gzip'] as const) {
      assert.ok(Math.abs(actual[k] - quoted[k]) <= quoted[k] * 0.1, `dist/${name} ${k}: the doc says ${quoted[k]} bytes, the build gives ${actual[k]}; update the table (npm run build prints it)`)
    }
    checked++
  }
  assert.ok(checked >= 2)
})
