// review5: a hostile review of the spend cap, the provider's options and body reader, FileStore and the Agent's
// moved options. Each test here is a break found by the review (it fails on the reviewed commit, 8b3d8c1), or an
// attack that held and is kept as a guard; the report in the review lists which is which.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { spawnSync } from 'node:child_process'
import { fileURLToPath } from 'node:url'
import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import {
  Agent, Session, MemoryStore, FileStore, openAICompatible, anthropic, type Prices,
} from '../dsh.ts'
import { tuned } from './tuning.ts'
import { sseResponse } from './fake-provider.ts'

/** deepseek-flash off-peak, USD per million tokens. */
const FLASH: Prices = { cacheHitInput: 0.003, cacheMissInput: 0.15, output: 0.6 }


/** A tool call whose arguments arrive in `pieces` deltas of 10,000 code points each. */
function toolCallEvents(pieces: number): unknown[] {
  const events: unknown[] = [{ choices: [{ index: 0, delta: { tool_calls: [{ index: 0, id: 'c1', type: 'function',
    function: { name: 'read', arguments: '' } }] } }] }]
  for (let k = 0; k < pieces; k++) {
    events.push({ choices: [{ index: 0, delta: { tool_calls: [{ index: 0, function: { arguments: 'x'.repeat(10_000) } }] } }] })
  }
  return events
}

test('cap: tool-call arguments streamed before a cut or an oversized message count toward maxCostUSD', async () => {
  // Each request streams 400,000 bytes of tool-call arguments (about 100,000 tokens of output, $0.06 at FLASH's
  // output price) and then fails: past the message cap (RESPONSE_TOO_LARGE, tuned to 300,000 bytes here) or cut.
  // dsh itself received those bytes; the cap must count at least them ("never less than dsh's own estimate of
  // what it sent and received"). With a session cap of $0.05 the second turn must stop with reason budget.
  let calls = 0
  const fetch = async () => { calls++; return sseResponse(toolCallEvents(40), true) }
  const provider = tuned({ maxRetries: 0, maxMessageBytes: 300_000 }, () => openAICompatible({
    baseURL: 'http://127.0.0.1:9', model: 'deepseek-flash', apiKey: 'k', contextWindow: 1_000_000, prices: FLASH,
    fetch }))
  const session = await Session.open(new MemoryStore())
  const agent = new Agent({ session, provider, maxCostUSD: { session: 0.05 },
    tools: [{ name: 'read', description: 'read', parameters: { type: 'object', properties: {} }, execute: () => 'y' }] })
  // The turn fails with the provider's error (the Agent throws it).
  await assert.rejects(agent.run('go'), { code: 'RESPONSE_TOO_LARGE' })
  assert.equal(calls, 1)
  const second = await agent.run('again').then((r) => r.reason, (e: Error & { code?: string }) => e.code)
  assert.equal(second, 'budget', `the second turn ended ${second} after ${calls} requests`)
  assert.equal(calls, 1)
  // What the cap counts of the session so far: at least the ~75,000 tokens of arguments dsh read before the cap.
  const floor = session.cost.spendFloor()
  assert.ok(floor.conversationOutputTokens >= 70_000,
    `the cap counts ${floor.conversationOutputTokens} output tokens of a request that streamed 300,000 bytes`)
})

test('cap: a stream cut after tool-call arguments is retried past maxCostUSD (the cut request counted as nothing)', async () => {
  // 400,000 bytes of arguments (about 100,000 tokens, $0.06 of output at FLASH) and then the connection drops: a
  // break after output, which the Agent retries once as a new step. The cap of $0.05 a turn must stop that retry.
  let calls = 0
  const fetch = async () => { calls++; return sseResponse(toolCallEvents(40), true) }
  const provider = tuned({ maxRetries: 0 }, () => openAICompatible({ baseURL: 'http://127.0.0.1:9',
    model: 'deepseek-flash', apiKey: 'k', contextWindow: 1_000_000, prices: FLASH, fetch }))
  const session = await Session.open(new MemoryStore())
  const agent = new Agent({ session, provider, maxCostUSD: 0.05,
    tools: [{ name: 'read', description: 'read', parameters: { type: 'object', properties: {} }, execute: () => 'y' }] })
  const reason = await agent.run('go').then((r) => r.reason, (e: Error & { code?: string }) => e.code)
  assert.deepEqual([reason, calls], ['budget', 1])
})

/** A 2 MiB tmpfs at a new directory for `body` (root only: mount), unmounted after; undefined when it cannot mount. */
async function onSmallDisk(body: (dir: string) => Promise<void>): Promise<boolean> {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'review5-disk-'))
  const mounted = process.getuid?.() === 0
    && spawnSync('mount', ['-t', 'tmpfs', '-o', 'size=2m', 'tmpfs', dir]).status === 0
  try { if (mounted) await body(dir) } finally {
    if (mounted) spawnSync('umount', [dir])
    fs.rmSync(dir, { recursive: true, force: true })
  }
  return mounted
}

test('full disk: a lock file that could not be written is not left behind to lock the log out', async (t) => {
  const ran = await onSmallDisk(async (dir) => {
    const log = path.join(dir, 's.jsonl'), fill = path.join(dir, 'fill')
    assert.throws(() => fs.writeFileSync(fill, Buffer.alloc(4 * 1024 * 1024)), { code: 'ENOSPC' }) // the disk is full
    const session = new Session({ store: new FileStore(log) })
    session.append('session/start', { id: 's', version: '0.1.0', format: 1 })
    // The first write takes the lock: creating FILE.lock works (an inode), writing its holder does not.
    await assert.rejects(session.sync(), (err: Error & { code?: string }) => err.code === 'STORE'
      && /ENOSPC/.test(err.message))
    fs.unlinkSync(fill) // room again: the session keeps its events, and flushing again must write them
    await session.sync()
    assert.equal(fs.readFileSync(log, 'utf8').split('\n').length, 2)
    await session.store.close?.()
    assert.equal(fs.existsSync(`${log}.lock`), false)
  })
  if (!ran) t.skip('needs root to mount a 2 MiB tmpfs')
})

/** A Response of one streamed chat completion that answers `text` and stops. */
const answer = (text: string) => sseResponse([{ choices: [{ index: 0, delta: { content: text } }] },
  { choices: [{ index: 0, delta: {}, finish_reason: 'stop' }] }], false)

test('cap: the summary requests of one compaction are checked against each other, not each alone', async () => {
  // 30 exchanges of 4,000 code points each way (about 60,000 tokens): over the threshold of a 70,000-token window,
  // so the turn starts with a summary. The summarizer's window is 10,000 tokens: the region goes in several
  // requests of about 8,000 tokens each, each modelled at about $0.15 at the summarizer's prices.
  const session = await Session.open(new MemoryStore())
  for (let i = 0; i < 30; i++) {
    session.append('turn/start', { turn: i + 1 })
    session.append('user/message', { message: { role: 'user', content: `q${i} ${'u'.repeat(4_000)}` },
      surfaceOp: { op: 'append' } })
    session.append('assistant/message', { message: { role: 'assistant', content: [{ type: 'text',
      text: `a${i} ${'v'.repeat(4_000)}` }] }, finishReason: 'stop', surfaceOp: { op: 'append' } })
    session.append('turn/end', { turn: i + 1, reason: 'stop' })
  }
  let summaries = 0, conversation = 0
  const provider = tuned({ maxRetries: 0 }, () => openAICompatible({ baseURL: 'http://127.0.0.1:9', model: 'm',
    apiKey: 'k', contextWindow: 70_000, prices: FLASH, fetch: async () => (conversation++, answer('done')) }))
  const summarizer = tuned({ maxRetries: 0 }, () => openAICompatible({ baseURL: 'http://127.0.0.1:9', model: 'dear',
    apiKey: 'k', contextWindow: 10_000, prices: { cacheHitInput: 0.3, cacheMissInput: 15, output: 60 },
    fetch: async () => (summaries++, answer('s'.repeat(400))) }))
  const cap = 0.25
  const agent = new Agent({ session, provider, summarizer, maxCostUSD: { session: cap } })
  const result = await agent.run('go on')
  const spent = session.cost.spendFloor().costUSD
  // Whatever the turn did, what it spent by dsh's own count stays within the session's cap (a summary request is
  // not sent past it), give or take one request's modelling error.
  assert.ok(spent <= cap * 1.2, `spent $${spent.toFixed(4)} of a $${cap} session cap in ${summaries} summary `
    + `requests (reason ${result.reason})`)
})

test('cap: a provider made { ...provider, prices } with a price missing or NaN cannot silently turn maxCostUSD off', async () => {
  // Each answer: 8,000 code points of text and a call, so each request costs at least 2,000 tokens of output.
  let calls = 0
  const fetch = async () => (calls++, sseResponse([{ choices: [{ index: 0, delta: { content: 'z'.repeat(8_000), tool_calls: [{
    index: 0, id: `c${calls}`, type: 'function', function: { name: 'read', arguments: '{}' } }] } }] },
  { choices: [{ index: 0, delta: {}, finish_reason: 'tool_calls' }] }], false))
  const base = tuned({ maxRetries: 0 }, () => openAICompatible({ baseURL: 'http://127.0.0.1:9', model: 'm',
    apiKey: 'k', contextWindow: 1_000_000, fetch }))
  const tools = [{ name: 'read', description: 'read', parameters: { type: 'object', properties: {} },
    execute: () => 'y'.repeat(8_000) }]
  for (const prices of [{ cacheHitInput: 0.003, cacheMissInput: 0.15 }, { ...FLASH, output: Number('0,6') }]) {
    calls = 0
    const session = await Session.open(new MemoryStore())
    let outcome: string
    try {
      const agent = new Agent({ session, provider: { ...base, prices: prices as Prices }, tools, maxSteps: 20,
        maxCostUSD: 0.001 })
      outcome = (await agent.run('go')).reason
    } catch (err) { outcome = calls === 0 ? 'refused' : String(err) }
    // Refused before any request (prices that price nothing), or the cap fires: never 20 requests past a $0.001 cap.
    assert.ok(outcome === 'refused' || outcome === 'budget',
      `prices ${JSON.stringify(prices)}: the turn ended ${outcome} after ${calls} requests under a $0.001 cap`)
  }
})

const BASE = { baseURL: 'http://127.0.0.1:9', model: 'm', apiKey: 'k' }

test('provider options: NaN or Infinity is named in the error (not "got null")', () => {
  const base = BASE
  // The message must say the value given: "got null" for NaN sends the caller looking for a null.
  assert.throws(() => openAICompatible({ ...base, contextWindow: NaN }), (err: Error) => err instanceof TypeError
    && /got NaN/.test(err.message))
  assert.throws(() => openAICompatible({ ...base, maxTokens: Infinity }), (err: Error) => err instanceof TypeError
    && /got Infinity/.test(err.message))
})

test('provider options: headers and extraBody that are not plain objects fail loudly', () => {
  const base = BASE
  // A string spread as headers sends "0: a", "1: b", … and an array as extraBody sends {"0": …}: both fail loudly.
  assert.throws(() => openAICompatible({ ...base, headers: 'ab' as never }), TypeError)
  assert.throws(() => openAICompatible({ ...base, extraBody: ['temperature', 0] as never }), TypeError)
})

/** A FileStore whose next write waits `delayMs` first (FileStore documents that a subclass's write may await). */
class SlowWriteStore extends FileStore {
  delayNextMs = 0
  protected override async write(bytes: Uint8Array): Promise<void> {
    const ms = this.delayNextMs
    this.delayNextMs = 0
    if (ms > 0) await new Promise((resolve) => setTimeout(resolve, ms))
    return super.write(bytes)
  }
}

const userEvent = (seq: number) => ({ seq, time: 1, type: 'user/message', data: { message: { role: 'user',
  content: `m${seq}` }, surfaceOp: { op: 'append' } } })

test('FileStore: an append made while the previous write awaits never lands before it (the log keeps seq order)', async () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'review5-conc-'))
  try {
    const log = path.join(dir, 's.jsonl')
    const store = new SlowWriteStore(log)
    await store.append([{ seq: 0, time: 1, type: 'session/start', data: { id: 's', version: '0.1.0', format: 1 } }])
    store.delayNextMs = 30
    // LogStore: "append receives events in seq order" — these calls are made in seq order, the first one's write slow.
    const results = await Promise.allSettled([store.append([userEvent(1)]), store.append([userEvent(2)])])
    const seqs = fs.readFileSync(log, 'utf8').split('\n').filter(Boolean).map((l) => (JSON.parse(l) as { seq: number }).seq)
    await store.close()
    // Either both landed in order, or the later one was refused and the file is a prefix of the log.
    assert.deepEqual(seqs, seqs.map((_, i) => i), `the file holds seqs ${JSON.stringify(seqs)} after `
      + JSON.stringify(results.map((r) => (r.status === 'rejected' ? String(r.reason?.message).slice(0, 60) : 'ok'))))
    await Session.open(new FileStore(log), { readOnly: true }) // and the log loads
  } finally { fs.rmSync(dir, { recursive: true, force: true }) }
})

test('body writer: an extraBody field left undefined is left out, as JSON.stringify would (the body stays JSON)', async () => {
  // A caller forwarding an optional setting: extraBody: { temperature: opts.temperature } with none given.
  // openAICompatible left such a field out before the one body writer (940dcbb); both formats must send JSON.
  for (const make of [openAICompatible, anthropic]) {
    let body = ''
    const provider = tuned({ maxRetries: 0 }, () => make({ ...BASE, extraBody: { temperature: undefined, top_p: 0.5 },
      fetch: async (_url: string, init: RequestInit) => { body = String(init.body); return answer('ok') } }))
    await provider.complete({ messages: [{ role: 'user', content: 'hi' }] }).catch(() => {})
    let parsed: Record<string, unknown> | undefined
    try { parsed = JSON.parse(body) } catch { /* asserted below */ }
    assert.ok(parsed, `${make.name} sent a body that is not JSON: ${body.slice(0, 60)}…`)
    assert.deepEqual([Object.hasOwn(parsed!, 'temperature'), parsed!.top_p], [false, 0.5])
  }
})

test('entry statement: an app that re-exports dsh.ts, bundled and run as the program, does not run the dsh CLI', async () => {
  const { build } = await import('esbuild')
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'review5-entry-'))
  try {
    const dsh = fileURLToPath(new URL('../dsh.ts', import.meta.url))
    // A library over dsh that re-exports it whole and is also run as a program of its own.
    fs.writeFileSync(path.join(dir, 'app.ts'), `export * from ${JSON.stringify(dsh)}\nconsole.log('app')\n`)
    await build({ entryPoints: [path.join(dir, 'app.ts')], bundle: true, format: 'esm', platform: 'node',
      outfile: path.join(dir, 'app.mjs'), logLevel: 'silent' })
    const r = spawnSync(process.execPath, [path.join(dir, 'app.mjs'), '--version'], { encoding: 'utf8', timeout: 30_000 })
    // The program is app.mjs, not dsh.ts nor dist/cli.mjs: only the app's own line.
    assert.equal(r.stdout, 'app\n')
  } finally { fs.rmSync(dir, { recursive: true, force: true }) }
})

test('spill: a tool result whose artefact cannot be stored still gets a result, and the session goes on', async () => {
  // The artefacts directory cannot be made (a file holds its name: a full or read-only disk fails the same way).
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'review5-spill-'))
  try {
    const log = path.join(dir, 's.jsonl')
    fs.writeFileSync(`${log}.artefacts`, 'not a directory')
    let calls = 0
    const fetch = async () => (++calls === 1 ? sseResponse([{ choices: [{ index: 0, delta: { tool_calls: [{ index: 0, id: 'c1',
      type: 'function', function: { name: 'read', arguments: '{}' } }] } }] },
    { choices: [{ index: 0, delta: {}, finish_reason: 'tool_calls' }] }], false) : answer('done'))
    const provider = tuned({ maxRetries: 0 }, () => openAICompatible({ ...BASE, contextWindow: 1_000_000, fetch }))
    const session = await Session.open(new FileStore(log))
    // A result over the spill size (256 KiB) goes to the artefacts.
    const agent = new Agent({ session, provider, tools: [{ name: 'read', description: 'read',
      parameters: { type: 'object', properties: {} }, execute: () => 'z'.repeat(300 * 1024) }] })
    const first = await agent.run('go').then((r) => r.reason, (e: Error & { code?: string }) => `${e.code}: ${e.message}`)
    const second = await agent.run('again').then((r) => r.reason, (e: Error & { code?: string }) => `${e.code}: ${e.message}`)
    await session.store.close?.()
    const results = fs.readFileSync(log, 'utf8').split('\n').filter(Boolean).map((l) => JSON.parse(l) as
      { type: string; data: { message?: { toolCallId?: string } } }).filter((e) => e.type === 'tool/result')
    // The call that ran has its result in the log (whole, or an error saying why), and the next turn can be sent.
    assert.deepEqual([results.map((e) => e.data.message?.toolCallId), second], [['c1'], 'stop'],
      `first turn: ${first}; second: ${second}`)
  } finally { fs.rmSync(dir, { recursive: true, force: true }) }
})

test('body reader: a body whose cancel never settles (a proxying fetch) does not hang complete() past its deadline', async () => {
  const enc = new TextEncoder()
  const provider = tuned({ maxRetries: 0, idleTimeoutMs: 200, requestTimeoutMs: 500 }, () => openAICompatible({ ...BASE,
    fetch: async () => new Response(new ReadableStream<Uint8Array>({
      start(c) {
        c.enqueue(enc.encode('data: {"choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":"stop"}]}\n\n'
          + 'data: [DONE]\n\n'))
      },
      cancel: () => new Promise<void>(() => {}), // waits on an upstream that never answers
    }), { headers: { 'content-type': 'text/event-stream' } }) }))
  let timer: ReturnType<typeof setTimeout> | undefined
  const outcome = await Promise.race([
    provider.complete({ messages: [{ role: 'user', content: 'x' }] }).then((r) => JSON.stringify(r.message.content),
      (e: Error & { code?: string }) => String(e.code)),
    new Promise<string>((resolve) => { timer = setTimeout(() => resolve('still pending after 3 s'), 3_000) }),
  ])
  clearTimeout(timer)
  // The answer was whole at [DONE]: it is returned (or at worst a TIMEOUT at the 500 ms deadline), never a hang.
  assert.ok(outcome !== 'still pending after 3 s', outcome)
})
