// examples/durable-object (issue 6): a session whose log lives in a Cloudflare Durable Object, run
// under workerd exactly as the example's config.capnp says (dist/dsh.mjs beside it), with the fake
// OpenAI-compatible provider of test/fake-provider.ts as the model. Requests to one session id must
// see one log, in order, in storage; other ids their own.
import { after, before, test } from 'node:test'
import assert from 'node:assert/strict'
import { execFile, spawn, type ChildProcess } from 'node:child_process'
import { copyFileSync, mkdtempSync, readdirSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'
import type { SessionEvent } from '../dsh.ts'
import { startFakeProvider, type FakeProvider, type FakeRequest } from './fake-provider.ts'
import { testLogStore } from '../conformance.ts'

const ROOT = dirname(dirname(fileURLToPath(import.meta.url)))
const EXAMPLE = join(ROOT, 'examples', 'durable-object')
const TIMEOUT_MS = 30_000
const work = mkdtempSync(join(tmpdir(), 'dsh-durable-object-'))
let fake: FakeProvider
let workerd: ChildProcess | undefined
let origin = ''

/** The fake model answers every request with the start of the last user message. */
const answerTo = (input: string) => `answer to ${input.slice(0, 12)}`

before(async () => {
  const built = await new Promise<string | null>((resolve) => {
    execFile(process.execPath, [join(ROOT, 'build.mjs'), '--outdir', join(work, 'dist'), '--no-dts'], (err, stdout, stderr) => resolve(err ? stdout + stderr : null))
  })
  assert.equal(built, null, 'node build.mjs failed')
  for (const name of readdirSync(EXAMPLE)) copyFileSync(join(EXAMPLE, name), join(work, name))
  copyFileSync(join(work, 'dist', 'dsh.mjs'), join(work, 'dsh.mjs'))
  fake = await startFakeProvider({
    handler: (request: FakeRequest) => ({ text: answerTo(String(request.body.messages.at(-1).content)) }),
  })
  // The config's port 8080 is replaced by a free one, which workerd reports on its control fd.
  const env = { ...process.env, PROVIDER_URL: fake.url, MODEL: 'fake-model', API_KEY: 'sk-test', CONTEXT_WINDOW: '100000' }
  const child = spawn(join(ROOT, 'node_modules', '.bin', 'workerd'), ['serve', 'config.capnp', '--socket-addr', 'http=127.0.0.1:0', '--control-fd=3'],
    { cwd: work, env, stdio: ['ignore', 'pipe', 'pipe', 'pipe'] })
  workerd = child
  let output = ''
  child.stdout!.on('data', (d) => { output += d })
  child.stderr!.on('data', (d) => { output += d })
  origin = await new Promise<string>((resolve, reject) => {
    let announced = ''
    const timer = setTimeout(() => reject(new Error(`workerd announced no port within ${TIMEOUT_MS} ms:\n${output}`)), TIMEOUT_MS)
    child.on('exit', (code) => { clearTimeout(timer); reject(new Error(`workerd exited ${code}:\n${output}`)) })
    child.stdio[3]!.on('data', (d) => {
      announced += d
      const m = /"socket":"http","port":(\d+)/.exec(announced)
      if (m) { clearTimeout(timer); resolve(`http://127.0.0.1:${m[1]}`) }
    })
  })
})

after(async () => {
  workerd?.removeAllListeners('exit')
  workerd?.kill()
  await fake?.close()
  rmSync(work, { recursive: true, force: true })
})

interface TurnReply { turn: number; text: string; events: Array<[number, string]> }

async function post(id: string, input: string): Promise<TurnReply> {
  const res = await fetch(`${origin}/sessions/${id}`, { method: 'POST', body: JSON.stringify({ input }) })
  const text = await res.text()
  assert.equal(res.status, 200, `POST /sessions/${id}: ${text}`)
  return JSON.parse(text)
}

async function stored(id: string): Promise<SessionEvent[]> {
  const res = await fetch(`${origin}/sessions/${id}`)
  assert.equal(res.status, 200)
  return (await res.json() as { events: SessionEvent[] }).events
}

const pairs = (events: SessionEvent[]) => events.map((e) => [e.seq, e.type])
/** The events one text-only turn appends after its session's header is set. */
const TURN = ['turn/start', 'user/message', 'step/start', 'assistant/message', 'step/end', 'turn/end']
/** 70,000 units: its user/message event is stored in three slices (store.mjs PART_UNITS = 32,768). */
const LONG = 'first ' + 'long input, '.repeat(5_833) + 'end'

test('two requests to one session id continue one log, in order, and storage holds it', async () => {
  const first = await post('alpha', LONG)
  const second = await post('alpha', 'second question')
  assert.deepEqual([first.turn, first.text], [1, answerTo(LONG)])
  assert.deepEqual([second.turn, second.text], [2, answerTo('second question')])
  // One log: the second reply's events extend the first's, seq by seq.
  assert.deepEqual(second.events.slice(0, first.events.length), first.events)
  assert.deepEqual(second.events.map(([seq]) => seq), second.events.map((_, i) => i))
  assert.deepEqual(first.events.map(([, type]) => type), ['session/start', 'turn/start', 'user/message', 'request/header', 'step/start', 'assistant/message', 'step/end', 'turn/end'])
  assert.deepEqual(second.events.slice(first.events.length).map(([, type]) => type), TURN)
  // Storage (read back through the LogStore) holds exactly that log, the long input intact.
  const log = await stored('alpha')
  assert.deepEqual(pairs(log), second.events)
  const inputs = log.filter((e) => e.type === 'user/message').map((e) => (e.data as { message: { content: string } }).message.content)
  assert.deepEqual(inputs, [LONG, 'second question'])
  assert.equal((log[0].data as { id: string }).id, 'alpha')
  // The model saw one conversation: the second request carries the first turn.
  const sent = fake.requests.filter((r) => r.body.messages.some((m: { content: string }) => m.content === 'second question'))
  assert.equal(sent.length, 1)
  assert.deepEqual(sent[0].body.messages, [
    { role: 'user', content: LONG },
    { role: 'assistant', content: answerTo(LONG) },
    { role: 'user', content: 'second question' },
  ])
})

test('another session id has its own log', async () => {
  const reply = await post('beta', 'unrelated')
  assert.equal(reply.turn, 1)
  const log = await stored('beta')
  assert.deepEqual(pairs(log), reply.events)
  assert.equal((log[0].data as { id: string }).id, 'beta')
  assert.equal(log.filter((e) => e.type === 'user/message').length, 1)
})

test('two concurrent requests to one session id run as two whole turns, one after the other', async () => {
  const replies = await Promise.all([post('gamma', 'one'), post('gamma', 'two')])
  assert.deepEqual(replies.map((r) => r.turn).sort(), [1, 2])
  const log = await stored('gamma')
  const types = log.map((e) => e.type)
  assert.deepEqual(types, ['session/start', ...TURN.slice(0, 2), 'request/header', ...TURN.slice(2), ...TURN])
  // Each turn's answer follows its own input (no interleaving).
  const messages = log.filter((e) => e.type === 'user/message' || e.type === 'assistant/message').map((e) => (e.data as { message: { content: unknown } }).message.content)
  const [in1, out1, in2, out2] = messages as [string, Array<{ text: string }>, string, Array<{ text: string }>]
  assert.deepEqual([out1[0].text, out2[0].text], [answerTo(in1), answerTo(in2)])
})

/**
 * The key-value part of the Durable Object storage API in memory, with its documented limits
 * (128 keys per get/put, 128 KiB per value, values structured-cloned): for the store's artefact
 * path, which the worker above does not reach (it has no tools to spill).
 */
class StorageStandIn {
  readonly map = new Map<string, unknown>()
  calls = 0
  async get(keys: string | string[]) {
    this.calls++
    if (!Array.isArray(keys)) return structuredClone(this.map.get(keys))
    assert.ok(keys.length <= 128, `get() of ${keys.length} keys`)
    return new Map(keys.filter((k) => this.map.has(k)).map((k) => [k, structuredClone(this.map.get(k))]))
  }
  async put(entries: Record<string, unknown>) {
    this.calls++
    assert.ok(Object.keys(entries).length <= 128, `put() of ${Object.keys(entries).length} keys`)
    for (const [k, v] of Object.entries(entries)) {
      const bytes = typeof v === 'string' ? v.length * 2 : JSON.stringify(v).length
      assert.ok(bytes <= 128 * 1024, `value of ${k} is ${bytes} bytes`)
      this.map.set(k, structuredClone(v))
    }
  }
  async list({ prefix }: { prefix: string }) {
    return new Map([...this.map].filter(([k]) => k.startsWith(prefix)).sort(([a], [b]) => (a < b ? -1 : 1)))
  }
}

test('store.mjs: an artefact of 1 MB with astral characters at slice edges round-trips; a missing one is an error naming it', async () => {
  const { DurableObjectLogStore } = await import(join(EXAMPLE, 'store.mjs'))
  const storage = new StorageStandIn()
  const store = new DurableObjectLogStore(storage)
  // 'a😀' is 3 UTF-16 units, so slice ends (every 32,768 units) fall inside surrogate pairs.
  const text = 'a😀'.repeat(350_000)
  const ref = await store.putArtefact('call_1.txt', text)
  assert.equal(ref, 'durable-object:artefact:call_1.txt')
  assert.equal(await store.getArtefact(ref), text)
  const parts = [...storage.map].filter(([k]) => k.startsWith('part:artefact:call_1.txt:')).map(([, v]) => v as string)
  assert.equal(storage.map.get('artefact:call_1.txt') && (storage.map.get('artefact:call_1.txt') as { parts: number }).parts, parts.length)
  assert.ok(parts.length > 30 && parts.every((p) => p.length <= 32_768 && !/[\ud800-\udbff]$/.test(p)), 'slices of at most 32,768 units, none ending inside a pair')
  await assert.rejects(store.getArtefact('durable-object:artefact:nope'), /no artefact durable-object:artefact:nope/)
})

// The LogStore conformance suite (conformance.ts) on store.mjs, each log key its own storage stand-in.
const { DurableObjectLogStore } = await import(join(EXAMPLE, 'store.mjs'))
const storages = new Map<string, StorageStandIn>()
testLogStore('DurableObjectLogStore (storage stand-in)', (key) => {
  let storage = storages.get(key)
  if (!storage) storages.set(key, storage = new StorageStandIn())
  return new DurableObjectLogStore(storage)
}, {
  secondWriter: 'a Durable Object runs one request at a time: its single-threaded gate is the one writer',
  tear: 'an append is one batch of put() calls with no await between them, which commits atomically',
})
