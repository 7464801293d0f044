// The "Use it in …" examples of docs/runtimes.md, run as a user would run them (issue 6): each
// example file is copied into a temp dir beside dsh.ts / dist/dsh.mjs / dist/dsh.iife.js and run
// with the command the doc gives; the doc must quote each example file verbatim. The examples talk
// to a model server at 127.0.0.1:8000 (and serve on 8080); the copies use free ports instead: the
// fake OpenAI-compatible server of test/fake-provider.ts stands in for the model.
import { after, before, test } from 'node:test'
import assert from 'node:assert/strict'
import { execFile, spawn } from 'node:child_process'
import { copyFileSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
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
  writeFileSync(join(work, 'package.json'), '{"type":"module"}')
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
  ['Node: npx tsx main.ts', () => run(join(BIN, 'tsx'), ['main.ts'])],
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
