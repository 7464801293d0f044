// Cross-runtime smoke test (issue 6): the one scenario of test/runtimes/scenario.mjs runs in
// Node (dsh.ts through tsx, and dist/dsh.mjs), Deno (both), Bun (both), workerd (dist/dsh.mjs in a
// worker) and Vercel's edge-runtime (dist/dsh.iife.js as a script), each a child process against
// two HTTP servers on 127.0.0.1: a small test server (echo, stream, cancellation) and the fake
// OpenAI-compatible provider of test/fake-provider.ts, which the Agent reaches through
// openAICompatible. Every runtime must run every step and report the identical observation, and
// both servers must receive the identical requests from each. Also here: `dsh.ts --help` as the
// entry point on Node, Deno and Bun (issue 6, case 4).
// The runtimes are the exact devDependencies in package.json (TOOLCHAIN.md lists the versions).
import { after, before, test } from 'node:test'
import assert from 'node:assert/strict'
import { execFile } from 'node:child_process'
import { copyFileSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http'
import type { AddressInfo } from 'node:net'
import { availableParallelism, tmpdir } from 'node:os'
import { dirname, join } from 'node:path'
import { fileURLToPath, pathToFileURL } from 'node:url'
import * as dshSource from '../dsh.ts'
import { SUMMARY_INSTRUCTION, frameCheckpoint } from './spec.ts'
import { RUNTIME_EXPORTS } from './parts.ts'
import { startFakeProvider, type FakeProvider, type FakeReply, type FakeRequest } from './fake-provider.ts'

const ROOT = dirname(dirname(fileURLToPath(import.meta.url)))
const HERE = join(ROOT, 'test', 'runtimes')
const BIN = join(ROOT, 'node_modules', '.bin')
/** Per child process, in ms: generous, since a hung runtime should fail, not stall CI. */
const RUNNER_TIMEOUT_MS = 30_000
/** docs/design.md §9: the exports tests outside the repo call. */
const REQUIRED_EXPORTS = [
  'PRUNE_MARKER', 'DEFAULT_PRUNE_CONFIG', 'codePointLength', 'pruneText', 'pruneToolResult',
  'estimateTextTokens', 'estimateMessageTokens', 'parseSSE', 'classifyProviderError', 'ProviderError',
  'Session', 'MemoryStore', 'FileStore', 'Agent', 'openAICompatible', 'deepseek',
]
/** The body of GET /stream: an SSE stream, sent 7 bytes per write so UTF-8 characters split. */
const STREAM_BODY = ': keep-alive\n\ndata: {"delta":"héllo"}\n\ndata: a😀b\n\ndata: [DONE]\n\n'

interface Runner { id: string; runtime: RegExp; command: (baseURL: string, providerURL: string) => [file: string, args: string[]] }
interface Outcome { code: number | null; stdout: string; stderr: string; ms: number }
interface Received { method: string; path: string; contentType: string | null; body: string }

let work = ''
const srcURL = pathToFileURL(join(ROOT, 'dsh.ts')).href
const dist = () => join(work, 'dist')
const distURL = () => pathToFileURL(join(dist(), 'dsh.mjs')).href

const RUNNERS: Runner[] = [
  { id: 'node-src', runtime: /^node v/, command: (base, provider) => [process.execPath, ['--import', 'tsx', join(HERE, 'run.mjs'), srcURL, base, provider]] },
  { id: 'node-dist', runtime: /^node v/, command: (base, provider) => [process.execPath, [join(HERE, 'run.mjs'), distURL(), base, provider]] },
  // Deno: network to loopback only, and read access to the one module it imports dynamically.
  { id: 'deno-src', runtime: /^deno 2\./, command: (base, provider) => [join(BIN, 'deno'), ['run', '--no-prompt', '--allow-net=127.0.0.1', `--allow-read=${join(ROOT, 'dsh.ts')}`, join(HERE, 'run.mjs'), srcURL, base, provider]] },
  { id: 'deno-dist', runtime: /^deno 2\./, command: (base, provider) => [join(BIN, 'deno'), ['run', '--no-prompt', '--allow-net=127.0.0.1', `--allow-read=${join(dist(), 'dsh.mjs')}`, join(HERE, 'run.mjs'), distURL(), base, provider]] },
  { id: 'bun-src', runtime: /^bun 1\./, command: (base, provider) => [join(BIN, 'bun'), [join(HERE, 'run.mjs'), srcURL, base, provider]] },
  { id: 'bun-dist', runtime: /^bun 1\./, command: (base, provider) => [join(BIN, 'bun'), [join(HERE, 'run.mjs'), distURL(), base, provider]] },
  { id: 'workerd', runtime: /^workerd$/, command: (base, provider) => [join(BIN, 'workerd'), ['test', writeWorkerdConfig(base, provider)]] },
  { id: 'edge-runtime', runtime: /^edge-runtime 4\./, command: (base, provider) => [process.execPath, [join(HERE, 'run-edge.mjs'), join(dist(), 'dsh.iife.js'), base, provider]] },
]

/** Issue 6 case 4: `dsh.ts` as the entry point starts the CLI (no permissions at all on Deno). */
const CLI_HELP_RUNS: Array<[label: string, file: string, args: string[]]> = [
  ['Node: npx tsx dsh.ts --help', join(BIN, 'tsx'), [join(ROOT, 'dsh.ts'), '--help']],
  ['Deno: deno run dsh.ts --help (no permissions)', join(BIN, 'deno'), ['run', '--no-prompt', join(ROOT, 'dsh.ts'), '--help']],
  ['Bun: bun dsh.ts --help', join(BIN, 'bun'), [join(ROOT, 'dsh.ts'), '--help']],
]

// ── Test server ─────────────────────────────────────────────────────────────────────────────────
// Paths are /<runner id>/<endpoint>; requests are logged per runner id, with the prefix removed.
const received = new Map<string, Received[]>()
let server: Server
let origin = ''

async function handle(req: IncomingMessage, res: ServerResponse) {
  const [, id = '', ...rest] = (req.url ?? '').split('/')
  const path = '/' + rest.join('/')
  let body = ''
  req.setEncoding('utf8')
  for await (const chunk of req) body += chunk
  const entry = { method: req.method ?? '', path, contentType: req.headers['content-type'] ?? null, body }
  received.set(id, [...(received.get(id) ?? []), entry])
  if (req.method === 'POST' && path === '/echo') {
    res.writeHead(200, { 'content-type': 'application/json' })
    res.end(JSON.stringify({ method: entry.method, path, contentType: entry.contentType, body: JSON.parse(body) }))
  } else if (req.method === 'GET' && path === '/stream') {
    res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' })
    const bytes = Buffer.from(STREAM_BODY, 'utf8')
    for (let i = 0; i < bytes.length; i += 7) {
      res.write(bytes.subarray(i, i + 7))
      await new Promise((r) => setTimeout(r, 2))
    }
    res.end()
  } else if (req.method === 'GET' && path === '/hang') {
    // Nothing at all, not even headers: the client must abort. after() closes the connection.
  } else if (req.method === 'GET' && path === '/stall') {
    res.writeHead(200, { 'content-type': 'text/event-stream' })
    res.write('data: partial\n\n') // then nothing: the client must abort mid-body
  } else {
    res.writeHead(404).end(`no route ${req.method} ${path}`)
  }
}

/** workerd runs no files from disk: a config embeds the modules, copied beside it. */
function writeWorkerdConfig(baseURL: string, providerURL: string): string {
  const dir = join(work, 'workerd')
  mkdirSync(dir, { recursive: true })
  copyFileSync(join(dist(), 'dsh.mjs'), join(dir, 'dsh.mjs'))
  for (const name of ['scenario.mjs', 'worker.mjs']) copyFileSync(join(HERE, name), join(dir, name))
  const config = join(dir, 'config.capnp')
  writeFileSync(config, `using Workerd = import "/workerd/workerd.capnp";

const config :Workerd.Config = (
  services = [
    (name = "main", worker = .smoke),
    # workerd's default outbound refuses private and local addresses; the test server is on 127.0.0.1.
    (name = "loopback", network = (allow = ["local"])),
  ],
);

const smoke :Workerd.Worker = (
  modules = [
    (name = "worker.mjs", esModule = embed "worker.mjs"),
    (name = "dsh.mjs", esModule = embed "dsh.mjs"),
    (name = "scenario.mjs", esModule = embed "scenario.mjs"),
  ],
  bindings = [
    (name = "BASE_URL", text = ${JSON.stringify(baseURL)}),
    (name = "PROVIDER_URL", text = ${JSON.stringify(providerURL)}),
  ],
  compatibilityDate = "2025-09-01",
  globalOutbound = "loopback",
);
`)
  return config
}

function runChild(file: string, args: string[]): Promise<Outcome> {
  const started = performance.now()
  return new Promise((resolve) => {
    // DENO_NO_UPDATE_CHECK: no call to dl.deno.land; DO_NOT_TRACK: no telemetry from any runtime.
    const env = { ...process.env, DENO_NO_UPDATE_CHECK: '1', DO_NOT_TRACK: '1', NO_COLOR: '1' }
    execFile(file, args, { cwd: ROOT, env, timeout: RUNNER_TIMEOUT_MS, maxBuffer: 16 << 20 }, (err, stdout, stderr) => {
      const code = err ? (typeof err.code === 'number' ? err.code : null) : 0
      resolve({ code, stdout, stderr: stderr + (err && code === null ? `\n${err.message}` : ''), ms: Math.round(performance.now() - started) })
    })
  })
}

// ── Run every runtime once (a pool as wide as the machine), then assert per runtime ─────────────
const outcomes = new Map<string, Outcome>()
const helpOutcomes = new Map<string, Outcome>()
let STEP_NAMES: string[] = []
let PROVIDER_SCRIPT: FakeReply[] = []
let TURN_INPUTS: string[] = []
let fake: FakeProvider

before(async () => {
  work = mkdtempSync(join(tmpdir(), 'dsh-runtimes-'))
  // The scenario is plain JS without declarations: import it by URL (typed any) for its step list.
  const scenario = await import(pathToFileURL(join(HERE, 'scenario.mjs')).href)
  STEP_NAMES = scenario.STEPS.map(([name]: [string]) => name)
  PROVIDER_SCRIPT = scenario.PROVIDER_SCRIPT
  TURN_INPUTS = scenario.TURN_INPUTS

  const built = await runChild(process.execPath, [join(ROOT, 'build.mjs'), '--outdir', dist(), '--no-dts'])
  assert.equal(built.code, 0, `node build.mjs failed:\n${built.stdout}${built.stderr}`)

  server = createServer((req, res) => {
    handle(req, res).catch((err) => { res.writeHead(500).end(String(err)) })
  })
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  origin = `http://127.0.0.1:${(server.address() as AddressInfo).port}`

  // One fake provider for all runners: each sends to its own path prefix and gets its own copy of
  // the script, answered in order.
  const served = new Map<string, number>()
  fake = await startFakeProvider({
    handler: (request: FakeRequest): FakeReply => {
      const id = request.path.split('/')[1]
      const index = served.get(id) ?? 0
      served.set(id, index + 1)
      return PROVIDER_SCRIPT[index] // undefined past the end: the fake answers 400 "script exhausted"
    },
  })

  // The smoke runners first (the slow ones), then the CLI runs, one per free core.
  const queue: Array<() => Promise<void>> = [
    ...RUNNERS.map((r) => async () => {
      const [file, args] = r.command(`${origin}/${r.id}`, `${fake.url}/${r.id}`)
      outcomes.set(r.id, await runChild(file, args))
    }),
    ...CLI_HELP_RUNS.map(([label, file, args]) => async () => { helpOutcomes.set(label, await runChild(file, args)) }),
  ]
  const worker = async () => {
    for (let job = queue.shift(); job; job = queue.shift()) await job()
  }
  // One runtime per core; DSH_RUNTIMES_JOBS=1 runs them one after another (for timing one alone).
  const jobs = Number(process.env.DSH_RUNTIMES_JOBS) || availableParallelism()
  await Promise.all(Array.from({ length: Math.max(1, jobs) }, worker))
  // DSH_RUNTIMES_VERBOSE=1 prints each runtime's exit code and wall time.
  if (process.env.DSH_RUNTIMES_VERBOSE) for (const [id, o] of outcomes) console.log(`${id}: exit ${o.code} in ${o.ms} ms`)
})

after(async () => {
  await fake?.close()
  server?.closeAllConnections()
  server?.close()
  if (work) rmSync(work, { recursive: true, force: true })
})

/** The one `DSH-SMOKE {…}` line of a runner's stdout, parsed; fails with the runner's output. */
function report(id: string): { runtime: string; steps: string[]; observation: Record<string, unknown> } {
  const o = outcomes.get(id)
  assert.ok(o, `${id} did not run`)
  const lines = o.stdout.split('\n').filter((l) => l.startsWith('DSH-SMOKE '))
  assert.equal(o.code, 0, `${id} exited ${o.code}:\n${o.stderr}\n${o.stdout}`)
  assert.equal(lines.length, 1, `${id} printed ${lines.length} DSH-SMOKE lines:\n${o.stdout}\n${o.stderr}`)
  // Importing dsh must print nothing (docs/design.md §0: the CLI never runs on import).
  const other = o.stdout.split('\n').filter((l) => l.trim() !== '' && !l.startsWith('DSH-SMOKE '))
  assert.deepEqual(other, [], `${id} printed more than its report on stdout`)
  return JSON.parse(lines[0].slice('DSH-SMOKE '.length))
}

for (const r of RUNNERS) {
  test(`${r.id}: runs every scenario step and matches node-src`, () => {
    const got = report(r.id)
    assert.match(got.runtime, r.runtime, `${r.id} ran in ${got.runtime}`)
    assert.deepEqual(got.steps, STEP_NAMES, `${r.id} ran ${got.steps.length} of ${STEP_NAMES.length} steps`)
    // The bundles (dist/dsh.mjs, dsh.iife.js; workerd and edge-runtime load those) are the runtime: Part I plus FileStore.
    const reference = report('node-src').observation
    assert.deepEqual(got.observation, r.id.endsWith('-src') ? reference : { ...reference, exports: RUNTIME_EXPORTS })
    assert.deepEqual(received.get(r.id), received.get('node-src'), `requests the server received from ${r.id}`)
    assert.deepEqual(providerRequests(r.id), providerRequests('node-src'), `requests the fake provider received from ${r.id}`)
  })
}

/** What the fake provider received from one runner: path (prefix removed), the headers dsh sets, body. */
function providerRequests(id: string) {
  return fake.requests.filter((q) => q.path.startsWith(`/${id}/`)).map((q) => ({
    path: q.path.slice(id.length + 1),
    headers: Object.fromEntries(['content-type', 'accept', 'authorization', 'x-dsh-purpose'].map((h) => [h, q.headers[h] ?? null])),
    body: q.body,
  }))
}

for (const [label] of CLI_HELP_RUNS) {
  test(`${label} prints the usage (dsh.ts as the entry point starts the CLI)`, () => {
    const o = helpOutcomes.get(label)
    assert.ok(o, `${label} did not run`)
    assert.equal(o.code, 0, `${label} exited ${o.code}:\n${o.stderr}`)
    assert.equal(o.stdout.trimEnd(), dshSource.cliHelp('npx tsx dsh.ts').trimEnd()) // run as dsh.ts: the help names it so
  })
}

test('node-src: the reference observation holds the expected values', () => {
  const { observation } = report('node-src')
  const seen = received.get('node-src')
  assert.equal(observation.version, dshSource.VERSION)
  assert.deepEqual(observation.exports, Object.keys(dshSource).sort())
  // Worked by hand from docs/design.md §2–3: input = 4094 'a' + 1000 × family (8 units, 5 code points)
  // + 600 × 'é😀' (3 units, 2 code points) = 13,894 units, 10,294 code points, ⌈13894/4⌉ = 3474 tokens.
  // Pruned: 4096 head code points (4094 'a' + 👨 + ZWJ = 4097 units) + 39-unit marker + 1024 tail
  // code points (512 × 'é😀' = 1536 units) = 5672 units, 5159 code points.
  const pruner = observation['meter-pruner'] as Record<string, Record<string, unknown>>
  const unitsAndPoints = (k: string) => [pruner[k].units, pruner[k].codePoints]
  assert.deepEqual([unitsAndPoints('input'), pruner.input.tokens], [[13894, 10294], 3474])
  assert.deepEqual(unitsAndPoints('plain'), [5672, 5159])
  assert.equal(pruner.plain.aroundHead, 'aaaa👨\u200d\n\n[..')
  // 'read it' = ⌈7/4⌉ + 8 = 10; the call: name + arguments 'read{}' = ⌈6/4⌉ + 8 = 10;
  // 'x😀' × 5000 = ⌈15000/4⌉ + 8 = 3758.
  assert.deepEqual((observation['session-memory'] as Record<string, unknown>).reloadedSurface, [[1, 'user', 10], [2, 'assistant', 10], [3, 'tool', 3758]])
  checkAgentHTTP(observation['agent-http'] as AgentHTTP, providerRequests('node-src'))
  assert.deepEqual(observation['fetch-echo'], {
    method: 'POST', path: '/echo', contentType: 'application/json',
    body: { model: 'smoke', messages: [{ role: 'user', content: 'héllo 😀' }] },
  })
  assert.deepEqual(observation['fetch-stream'], { status: 200, contentType: 'text/event-stream', text: STREAM_BODY })
  assert.deepEqual(observation['fetch-abort'], {
    beforeHeaders: { rejected: true, name: 'AbortError' },
    midBody: { status: 200, first: 'data: partial\n\n', rejected: true, name: 'AbortError' },
  })
  assert.deepEqual(seen?.map((e) => `${e.method} ${e.path}`), ['POST /echo', 'GET /stream', 'GET /hang', 'GET /stall'])
  assert.equal(seen?.[0].body, JSON.stringify({ model: 'smoke', messages: [{ role: 'user', content: 'héllo 😀' }] }))
})

test('every runtime exposes the docs/design.md §9 exports', () => {
  const missing = REQUIRED_EXPORTS.filter((name) => !(report('node-src').observation.exports as string[]).includes(name))
  assert.deepEqual(missing, [])
})

interface AgentHTTP {
  turns: Array<{ text: string; steps: number; reason: string }>
  events: string[]
  log: string[]
  compactionEnds: Array<{ id: string; tokensBefore?: number; tokensAfter?: number; error?: string }>
}

/** Events of `log` from the n-th (1-based) `turn/start` up to the next one. */
function turnEvents(log: string[], n: number): string[] {
  const starts = log.flatMap((t, i) => (t === 'turn/start' ? [i] : []))
  return log.slice(starts[n - 1], starts[n])
}

/**
 * The reference values of step `agent-http` (scenario.mjs), worked from docs/design.md §§3, 5 and the
 * script: window 8000 tokens, pressure threshold floor(8000 × 0.8) = 6400 tokens.
 */
function checkAgentHTTP(agent: AgentHTTP, requests: ReturnType<typeof providerRequests>) {
  const texts = PROVIDER_SCRIPT.map((r) => ('text' in r ? r.text : undefined))
  assert.deepEqual(agent.turns, [
    { text: texts[1], steps: 2, reason: 'stop' },
    { text: texts[6], steps: 4, reason: 'stop' },
    { text: texts[9], steps: 2, reason: 'stop' }, // step 1 overflowed, step 2 is the retry
  ])
  // Ten requests, in script order; summaries carry x-dsh-purpose: compaction.
  assert.deepEqual(requests.map((q) => q.headers['x-dsh-purpose']), [null, null, null, null, null, 'compaction', null, null, 'compaction', null])
  assert.ok(requests.every((q) => q.path === '/chat/completions' && q.headers.authorization === 'Bearer sk-test' && q.body.model === 'fake-model' && q.body.stream === true))
  const contents = (i: number) => requests[i].body.messages.map((m: { content: unknown }) => String(m.content ?? ''))
  const toolText = (i: number, id: string) => requests[i].body.messages.find((m: { tool_call_id?: string }) => m.tool_call_id === id)?.content as string
  // Turn 1: the 60,006-char result (over 8192 code points) is pruned before the second request, to
  // 4096 head + 39 marker + 1024 tail code points (all ASCII here) = 5159.
  assert.equal(toolText(1, 'c1').length, 5159)
  assert.ok(toolText(1, 'c1').includes(dshSource.PRUNE_MARKER))
  assert.deepEqual(turnEvents(agent.log, 1).filter((t) => t.startsWith('compaction/')), ['compaction/prune'])
  // Turn 2: after the third 6,008-char result the surface passes 6400 tokens; turn 1 (before the
  // pinned input) is summarised once, and the next request starts with the checkpoint.
  assert.deepEqual(turnEvents(agent.log, 2).filter((t) => t.startsWith('compaction/')), ['compaction/start', 'compaction/summary', 'compaction/end'])
  assert.equal(contents(5).at(-1), SUMMARY_INSTRUCTION)
  assert.ok(contents(6)[0].startsWith(frameCheckpoint(texts[5]!) + "\n<ledger>\n"), contents(6)[0])
  const [pressure, overflow] = agent.compactionEnds
  assert.ok(pressure.tokensBefore! >= 6400 && pressure.tokensAfter! < 6400, `pressure compaction ${pressure.tokensBefore} → ${pressure.tokensAfter} tokens`)
  // Turn 3: the 400 is classified as an overflow, everything before the input is summarised, and the
  // retried request is smaller and starts with the new checkpoint.
  assert.deepEqual(turnEvents(agent.log, 3).filter((t) => /^(request|compaction|recovery|step)\//.test(t)), [
    'step/start', 'request/error', 'compaction/start', 'compaction/summary', 'compaction/end', 'step/end', 'recovery/retry',
    'step/start', 'step/end',
  ])
  assert.ok(contents(9)[0].startsWith(frameCheckpoint(texts[8]!) + "\n<ledger>\n"), contents(9)[0])
  assert.ok(JSON.stringify(requests[9].body).length < JSON.stringify(requests[7].body).length / 4)
  assert.deepEqual(requests[9].body.messages.at(-1), { role: 'user', content: TURN_INPUTS[2] })
  assert.ok(overflow.tokensAfter! < overflow.tokensBefore!)
  assert.equal(agent.events.filter((t) => t === 'warning').length, 0)
}
