// Reliability under faults and bad input (issue 8): crash safety with SIGKILL, a fault-injecting
// provider, bad input over HTTP, secrets, and property tests (fast-check). Seeded throughout.
// `DSH_STRESS=1` (npm run test:stress) runs the long variants.
import { test, describe, after } from 'node:test'
import assert from 'node:assert/strict'
import { spawn, spawnSync, execFileSync } from 'node:child_process'
import { appendFileSync, existsSync, mkdirSync, mkdtempSync, readFileSync, writeFileSync, statSync, statfsSync, readdirSync, rmSync, unlinkSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join, dirname } from 'node:path'
import { fileURLToPath } from 'node:url'
import fc from 'fast-check'
import {
  pruneText, codePointLength, parseSSE, classifyProviderError, PRUNE_MARKER,
  Agent, FileStore, MemoryStore, Session, SessionError, ProviderError, openAICompatible,
  type Tool, type ToolResultMessage, internals, pruneToolResult
} from '../dsh.ts'

const { stateOf } = internals
import { logEvents } from './shared.ts'
import { startFakeProvider, type FakeReply, type FakeRequest } from './fake-provider.ts'
import { rng } from './rng.ts'
import { tuned } from './tuning.ts'

const HERE = dirname(fileURLToPath(import.meta.url))
const ROOT = join(HERE, '..')
const STRESS = process.env.DSH_STRESS === '1'
/** tsx by URL: a child started in another directory cannot resolve the bare name. */
const TSX = import.meta.resolve('tsx')
const WORK = mkdtempSync(join(tmpdir(), 'dsh-reliability-'))
after(() => rmSync(WORK, { recursive: true, force: true }))

const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms))

/** Throws unless every tool call in a wire request has exactly one result, and every result its call (by id). */
function assertWirePaired(body: any, where: string): void {
  const open = new Set<string>(), seen = new Set<string>()
  for (const m of body.messages ?? []) {
    if (m.role === 'assistant') for (const c of m.tool_calls ?? []) {
      assert.ok(typeof c.id === 'string' && c.id !== '', `${where}: a tool call without an id`)
      assert.ok(!seen.has(c.id), `${where}: tool call id ${c.id} twice`)
      seen.add(c.id); open.add(c.id)
    }
    if (m.role === 'tool') {
      assert.ok(open.has(m.tool_call_id), `${where}: a result for ${m.tool_call_id} without its call`)
      open.delete(m.tool_call_id)
    }
  }
  assert.deepEqual([...open], [], `${where}: tool call(s) without a result`)
}

/** A tool with a description and an open parameter schema. */
const tool = (name: string, execute: Tool['execute']): Tool => ({ name, description: `test tool ${name}`, parameters: { type: 'object' }, execute })

/** Guards a promise against a hang. */
function within<T>(ms: number, p: Promise<T>, what: string): Promise<T> {
  let timer: NodeJS.Timeout
  return Promise.race([p, new Promise<T>((_, reject) => { timer = setTimeout(() => reject(new Error(`hang: ${what} did not end within ${ms} ms`)), ms) })]).finally(() => clearTimeout(timer))
}

// ── 1. Crash safety ────────────────────────────────────────────────────────────────────────────

describe('crash safety (SIGKILL at seeded moments)', () => {
  const LANES = 4
  const KILLS = STRESS ? 250 : 100
  test(`${KILLS} kills: the log loads, nothing synced is lost, resume repairs, the next turn is valid`, { timeout: STRESS ? 900_000 : 240_000 }, async () => {
    let callId = 0
    const pick = rng(8001)
    const handler = (req: FakeRequest): FakeReply => {
      const check = req.headers['x-lane'] === 'check'
      if (req.headers['x-dsh-purpose'] === 'compaction') {
        return { text: 'CHECKPOINT: the tasks ran the tools nap and dump; all results were fine; continue with the next task.', deltaSize: 4, delayMs: check ? 0 : 30 }
      }
      const last = req.body.messages.at(-1)
      if (last?.role === 'tool' && (check || pick() < 0.4)) return { text: 'done with this task, moving on', deltaSize: 3, delayMs: check ? 0 : Math.floor(pick() * 25) }
      const id = `c${++callId}`
      if (check) return { toolCalls: [{ id, name: 'nap', arguments: { ms: 0 } }] }
      const call = pick() < 0.4 ? { id, name: 'dump', arguments: { n: 3_000 + Math.floor(pick() * 9_000) } } : { id, name: 'nap', arguments: { ms: 20 + Math.floor(pick() * 300) } }
      return { text: 'working on it, calling a tool now', deltaSize: 3, delayMs: Math.floor(pick() * 20), toolCalls: [call] }
    }
    const fake = await startFakeProvider({ handler })
    const checkTools: Tool[] = [
      tool('nap', () => 'slept 0 ms'),
      tool('dump', () => 'dump'),
    ]
    const points = new Map<string, number>()
    const seen = new Set<string>()
    let survived = 0, torn = 0, repairedCalls = 0
    try {
      const lane = async (n: number): Promise<void> => {
        const file = join(WORK, `crash-${n}.jsonl`)
        const delay = rng(9000 + n)
        for (let k = 0; k < KILLS / LANES; k++) {
          const args = ['--import', 'tsx', join(HERE, 'crash-driver.ts'), '--session', file, '--url', fake.url, ...(n % 2 ? ['--chunky'] : [])]
          const child = spawn(process.execPath, args, { cwd: ROOT, stdio: ['ignore', 'pipe', 'pipe'] })
          let out = '', err = ''
          child.stdout.on('data', (d) => { out += d })
          child.stderr.on('data', (d) => { err += d })
          const exited = new Promise<void>((resolve) => child.on('exit', () => resolve()))
          const started = Date.now()
          while (!/^ready /m.test(out)) {
            if (child.exitCode !== null || Date.now() - started > 30_000) assert.fail(`lane ${n} kill ${k}: the driver did not start: ${err}`)
            await sleep(10)
          }
          await sleep(Math.floor(delay() * 1_200))
          child.kill('SIGKILL')
          await exited
          assert.doesNotMatch(out, /^error /m, `lane ${n} kill ${k}: a turn failed in the driver: ${out}`)
          const synced = Math.max(0, ...[...out.matchAll(/^synced (\d+)$/gm)].map((m) => Number(m[1])))

          // The log loads; a torn last line is dropped and reported.
          const raw = readFileSync(file, 'utf8')
          const lastLine = raw.slice(raw.lastIndexOf('\n') + 1)
          let tornExpected = false
          if (lastLine !== '') try { JSON.parse(lastLine) } catch { tornExpected = true }
          const loaded = await Session.open(new FileStore(file), { readOnly: true })
          if (tornExpected) {
            torn++
            assert.ok(loaded.torn, `lane ${n} kill ${k}: a torn last line must be reported`)
            assert.equal(loaded.torn!.line, raw.split('\n').length)
            assert.equal(readFileSync(loaded.torn!.savedTo!, 'utf8'), lastLine)
          } else assert.equal(loaded.torn, undefined)
          // Every event up to the last completed sync (a step boundary) is there.
          assert.ok(loaded.seq >= synced, `lane ${n} kill ${k}: ${synced} events were synced, ${loaded.seq} loaded`)
          const openCalls = [...stateOf(loaded).openCalls]
          const phase = [...out.matchAll(/^at (\w+)$/gm)].at(-1)?.[1] ?? 'idle'
          const kind = tornExpected ? 'mid-append' : phase === 'idle' ? 'between' : `mid-${phase}`
          points.set(kind, (points.get(kind) ?? 0) + 1)
          const point = `${n}:${loaded.seq}:${loaded.torn?.bytes ?? 0}`
          assert.ok(!seen.has(point), `lane ${n} kill ${k}: the same point twice (${point})`)
          seen.add(point)

          // Resume repairs the open turn.
          const store = new FileStore(file)
          const session = await Session.open(store)
          assert.equal(session.turn.open, false)
          assert.deepEqual([...stateOf(session).openCalls], [])
          assert.equal(stateOf(session).compaction, undefined)
          const resumeAt = stateOf(session).openedAt
          assert.equal((await session.readEvent(resumeAt)).type, 'session/resume')
          assert.ok(resumeAt >= loaded.seq)
          const repairs = await logEvents(session, resumeAt)
          for (const id of openCalls) {
            const r = repairs.find((e) => e.type === 'tool/result' && (e.data as any).message.toolCallId === id)!
            assert.equal((r.data as any).message.metadata.code, stateOf(loaded).dispatched.has(id) ? 'TOOL_OUTCOME_UNKNOWN' : 'TOOL_NOT_STARTED')
            repairedCalls++
          }
          // The next request is valid: a real turn with a tool call completes against the fake.
          const before = fake.requests.length
          const provider = tuned({ retryBaseMs: 1, retryMaxMs: 5 }, () => openAICompatible({ baseURL: fake.url, model: 'fake-model', apiKey: 'sk-check', contextWindow: 4_000, headers: { 'x-lane': 'check' } }))
          const agent = new Agent({ session, provider, tools: checkTools, prune: { thresholdChars: 2_000, headChars: 800, tailChars: 400 } })
          const result = await within(20_000, agent.run('check turn'), 'the check turn')
          assert.equal(result.reason, 'stop')
          const mine = fake.requests.slice(before).filter((r) => r.headers['x-lane'] === 'check')
          assert.ok(mine.length >= 2)
          for (const r of mine) assertWirePaired(r.body, `lane ${n} kill ${k}`)
          await store.close()
          const again = await Session.open(new FileStore(file), { readOnly: true })
          assert.deepEqual(again.messages(), session.messages())
          survived++
        }
      }
      await Promise.all(Array.from({ length: LANES }, (_, n) => lane(n)))
      for (const [i, r] of fake.requests.entries()) assertWirePaired(r.body, `request ${i}`)
    } finally { await fake.close() }
    console.log(`crash safety: ${survived} kills survived (${[...points].map(([k, v]) => `${k} ${v}`).join(', ')}; ${torn} torn lines dropped, ${repairedCalls} open tool calls repaired)`)
    assert.ok(survived >= KILLS, `${survived} of ${KILLS} kills survived`) // lanes round up
    for (const kind of ['mid-append', 'mid-stream', 'mid-tool']) assert.ok(points.get(kind), `no kill landed ${kind}`)
  })

  // A kill between two writes of one batch (test/crash-driver.ts --chunky) can leave a last line of
  // any length, even `{"`: shorter than `{"seq":`, it must still be taken for torn, not corrupt.
  test('a torn last line cut at every byte, even inside its first 7 (`{"`), is dropped, saved and cut; the log resumes', async () => {
    const file = join(WORK, 'torn-every-byte.jsonl')
    const first = await Session.open(new FileStore(file))
    first.append('turn/start', { turn: 1 })
    first.append('user/message', { message: { role: 'user', content: 'hello' }, surfaceOp: { op: 'append' } })
    await first.sync(); await first.store.close?.()
    const good = readFileSync(file, 'utf8')
    const whole = good.split('\n').filter((l) => l !== '')
    // The next batch: two lines written in one append, the kill lands `cut` bytes into the second.
    const next = whole.at(-1)!.replace(/^\{"seq":(\d+)/, (_, n) => `{"seq":${Number(n) + 1}`)
    assert.ok(next.startsWith('{"seq":'))
    for (let cut = 1; cut < next.length; cut++) {
      const tail = next.slice(0, cut)
      writeFileSync(file, good + tail)
      const loaded = await Session.open(new FileStore(file), { readOnly: true })
      assert.deepEqual(loaded.torn && { line: loaded.torn.line, bytes: loaded.torn.bytes }, { line: whole.length + 1, bytes: cut }, `cut ${cut} (${JSON.stringify(tail)})`)
      assert.equal(readFileSync(loaded.torn!.savedTo!, 'utf8'), tail)
      rmSync(loaded.torn!.savedTo!)
      assert.equal(readFileSync(file, 'utf8'), good, `cut ${cut}: truncated to the last whole line`)
      const resumed = await Session.open(new FileStore(file))
      assert.equal(stateOf(resumed).openedAt, whole.length, 'every whole event kept, then session/resume')
      assert.equal((await resumed.readEvent(whole.length)).type, 'session/resume')
      await resumed.store.close?.()
      const again = await Session.open(new FileStore(file), { readOnly: true })
      assert.equal(again.torn, undefined)
      assert.deepEqual(again.messages(), resumed.messages())
      writeFileSync(file, good)
    }
    // Still refused: an unterminated last line that is not the start of a dsh event.
    for (const tail of ['{"a', '{"sex', '{ "seq":', '\0\0x', 'x\0']) {
      writeFileSync(file, good + tail)
      await assert.rejects(Session.open(new FileStore(file), { readOnly: true }), (e: SessionError) => e.code === 'LOG_CORRUPT' && e.line === whole.length + 1, JSON.stringify(tail))
    }
  })

  // A power loss after the file grew (its size is on disk) but before the unsynced blocks were: they read as zeros.
  test('a last line of NUL bytes only (unsynced blocks after a power loss) is torn, not corrupt: the log resumes', async () => {
    const file = join(WORK, 'torn-nul.jsonl')
    const first = await Session.open(new FileStore(file))
    first.append('user/message', { message: { role: 'user', content: 'acknowledged' }, surfaceOp: { op: 'append' } })
    await first.sync(); await first.store.close?.()
    const good = readFileSync(file)
    for (const zeros of [1, 4096, 65_536]) {
      writeFileSync(file, Buffer.concat([good, Buffer.alloc(zeros)]))
      // What happened: "session log line 3: not valid JSON (4096 characters; not shown)": the log could not resume.
      const resumed = await Session.open(new FileStore(file))
      assert.deepEqual(resumed.torn && { line: resumed.torn.line, bytes: resumed.torn.bytes }, { line: 3, bytes: zeros })
      assert.deepEqual(readFileSync(resumed.torn!.savedTo!), Buffer.alloc(zeros))
      assert.deepEqual(resumed.messages().map((m) => m.content), ['acknowledged'])
      await resumed.store.close?.()
      writeFileSync(file, good)
    }
  })
})

// ── 1b. A full disk ────────────────────────────────────────────────────────────────────────────

/** A write error as node:fs gives it. */
const ENOSPC = (): Error => Object.assign(new Error('ENOSPC: no space left on device, write'), { code: 'ENOSPC', errno: -28 })

type AppendHandle = { write(b: Uint8Array, offset?: number, length?: number): Promise<{ bytesWritten: number }>; truncate(n: number): Promise<void> }

/**
 * Replaces a FileStore's open append handle with one that behaves like write(2) on a disk with
 * `room` bytes left: each write takes at most `perWrite` bytes and what fits, and a write with no
 * room fails with ENOSPC. `truncateFails` makes the cut back fail too. Returns a way to free space.
 */
function fillDisk(store: FileStore, room: number, options: { perWrite?: number; truncateFails?: boolean } = {}): { free(): void } {
  const internals = store as unknown as { handle: AppendHandle }
  const real = internals.handle
  assert.ok(real, 'the store has an open append handle (append once first)')
  let left = room
  internals.handle = new Proxy(real, {
    get(target, key) {
      if (key === 'write') {
        return async (b: Uint8Array, offset = 0, length = b.length - offset) => {
          const n = Math.min(length, options.perWrite ?? Infinity, left)
          if (n === 0) throw ENOSPC()
          left -= n
          return await real.write(b, offset, n)
        }
      }
      if (key === 'truncate' && options.truncateFails) return async () => { throw Object.assign(new Error('EIO: i/o error, ftruncate'), { code: 'EIO' }) }
      const value = Reflect.get(target, key)
      return typeof value === 'function' ? value.bind(target) : value
    },
  })
  return { free: () => { left = Infinity } }
}

const DISK_FULL_RE = /disk full: (\d+) of (\d+) bytes written; nothing after seq (\d+) is durable/

/** The complete lines of a log file, parsed; asserts there is no cut last line and that seqs run from 0. */
function wholeLines(file: string): { seq: number; type: string }[] {
  const text = readFileSync(file, 'utf8')
  assert.ok(text === '' || text.endsWith('\n'), `${file} ends with a cut line: ${JSON.stringify(text.slice(-80))}`)
  const events = text.split('\n').filter((l) => l !== '').map((l) => JSON.parse(l))
  events.forEach((e, i) => assert.equal(e.seq, i))
  return events
}

const bigMessage = (i: number) => ({ message: { role: 'user' as const, content: `message ${i} ` + 'x'.repeat(300) }, surfaceOp: { op: 'append' as const } })

/** A 2 MiB tmpfs at a new directory for `body` (root only: mount), unmounted after; undefined when it cannot mount. */
async function onSmallDisk(body: (dir: string) => Promise<void>): Promise<boolean> {
  const dir = mkdtempSync(join(tmpdir(), 'dsh-small-disk-'))
  const mounted = process.getuid?.() === 0
    && spawnSync('mount', ['-t', 'tmpfs', '-o', 'size=2m', 'tmpfs', dir]).status === 0
  try { if (mounted) await body(dir) } finally {
    if (mounted) spawnSync('umount', [dir])
    rmSync(dir, { recursive: true, force: true })
  }
  return mounted
}

describe('a full disk', () => {
  test('a short write is finished or fails as STORE with the numbers; nothing unwritten is acknowledged; the log resumes', async () => {
    const file = join(WORK, 'short-write.jsonl')
    const session = await Session.open(new FileStore(file))
    session.append('turn/start', { turn: 1 })
    await stateOf(session).flush()
    const before = readFileSync(file)
    const disk = fillDisk(session.store as FileStore, 700, { perWrite: 100 })
    // 500 bytes in 100-byte writes: a short write is written on, not counted as the whole buffer.
    session.append('user/message', { message: { role: 'user', content: 'short' }, surfaceOp: { op: 'append' } })
    await stateOf(session).flush()
    const afterShort = wholeLines(file)
    assert.deepEqual(afterShort.map((e) => e.type), ['session/start', 'turn/start', 'user/message'])
    const written = readFileSync(file)
    // Three events of ~370 bytes do not fit in what is left: refused whole, the file as it was.
    for (let i = 0; i < 3; i++) session.append('user/message', bigMessage(i))
    let error: unknown
    try { await stateOf(session).flush() } catch (e) { error = e }
    assert.ok(error instanceof SessionError && error.code === 'STORE', `expected SessionError STORE, got ${error}`)
    const m = DISK_FULL_RE.exec(error.message)
    assert.ok(m, error.message)
    const [n, total, lastSeq] = [Number(m[1]), Number(m[2]), Number(m[3])]
    assert.equal(n, 700 - (written.length - before.length), 'every byte that fitted was written')
    assert.ok(n < total, `${n} of ${total}`)
    assert.equal(lastSeq, 2)
    assert.match(error.message, /cut back to its last whole event: free disk space/)
    assert.deepEqual(readFileSync(file), written, 'the cut line is gone: the log ends at seq 2')
    assert.equal(session.seq, 6, 'the session keeps the three events it could not write')
    const seen = await Session.open(new FileStore(file, { readOnly: true }), { readOnly: true })
    assert.equal(seen.seq, 3)
    assert.equal(seen.torn, undefined)
    // Space again: the same events are written once, in order, by the next flush.
    disk.free()
    await stateOf(session).flush()
    assert.deepEqual(wholeLines(file).map((e) => e.type), ['session/start', 'turn/start', 'user/message', 'user/message', 'user/message', 'user/message'])
    await session.store.close?.()
    const resumed = await Session.open(new FileStore(file))
    assert.equal(stateOf(resumed).openedAt, 6)
    assert.deepEqual(resumed.messages().map((x) => typeof x.content === 'string' ? x.content.slice(0, 9) : ''), ['short', 'message 0', 'message 1', 'message 2'])
    await resumed.store.close?.()
  })

  test('a write that fails for another reason (EIO) says so and what to mend, not "free disk space"', async () => {
    const file = join(WORK, 'eio-write.jsonl')
    const session = await Session.open(new FileStore(file))
    await stateOf(session).flush()
    const store = session.store as unknown as { handle: AppendHandle }
    const real = store.handle
    store.handle = new Proxy(real, { get: (target, key) => key === 'write'
      ? async () => { throw Object.assign(new Error('EIO: i/o error, write'), { code: 'EIO' }) }
      : (typeof Reflect.get(target, key) === 'function' ? Reflect.get(target, key).bind(target) : Reflect.get(target, key)) })
    session.append('user/message', bigMessage(0))
    const err = await stateOf(session).flush().then(() => undefined, (e) => e)
    // What happened: "write failed (EIO: i/o error, write): 0 of … bytes written; …: free disk space, then flush again".
    assert.ok(err instanceof SessionError && err.code === 'STORE', `expected STORE, got ${err}`)
    assert.match(err.message, /write failed \(EIO: i\/o error, write\): 0 of \d+ bytes written; nothing after seq 0 is durable; the log was cut back to its last whole event: mend the cause \(the disk, the file's permissions\), then flush again/)
    assert.doesNotMatch(err.message, /free disk space/)
    store.handle = real
    await stateOf(session).flush()
    assert.deepEqual(wholeLines(file).map((e) => e.type), ['session/start', 'user/message'])
    await session.store.close?.()
  })

  test('when the cut back fails too, the store appends no more; the next load drops the cut line and resumes', async () => {
    const file = join(WORK, 'short-write-no-cut.jsonl')
    const session = await Session.open(new FileStore(file))
    await stateOf(session).flush()
    fillDisk(session.store as FileStore, 500, { truncateFails: true })
    for (let i = 0; i < 3; i++) session.append('user/message', bigMessage(i))
    await assert.rejects(stateOf(session).flush(), (e: SessionError) => e.code === 'STORE' && DISK_FULL_RE.test(e.message) && /nothing after seq 0 is durable/.test(e.message)
      && /appends no more/.test(e.message))
    await assert.rejects(stateOf(session).flush(), /appends no more/, 'and says so again, writing nothing')
    await session.store.close?.()
    const resumed = await Session.open(new FileStore(file))
    assert.equal(resumed.torn?.line, 3, 'the event that fitted whole is kept, the cut one dropped')
    assert.equal(stateOf(resumed).openedAt, 2)
    await resumed.store.close?.()
    wholeLines(file)
  })

  test('on a real 2 MiB tmpfs: turns until the disk is full, STORE names what is durable, every run tool was logged; resume after space is freed', { timeout: 120_000 }, async (t) => {
    const dir = mkdtempSync(join(tmpdir(), 'dsh-tmpfs-'))
    let mounted = false
    try { execFileSync('mount', ['-t', 'tmpfs', '-o', 'size=2m', 'tmpfs', dir], { stdio: 'pipe' }); mounted = true } catch (err) {
      const why = `cannot mount a tmpfs here (${process.platform}, uid ${process.getuid?.() ?? '?'}: ${String((err as Error).message).split('\n')[0]})`
      console.log(`full-disk test skipped: ${why}`)
      t.skip(why)
    }
    const fake = await startFakeProvider({
      handler: (req) => (req.body.messages.at(-1).role === 'tool' ? { text: 'done' } : { toolCalls: [{ name: 'dump', arguments: { n: 3000 } }] }),
    })
    const stores: FileStore[] = []
    try {
      if (!mounted) return
      const file = join(dir, 's.jsonl')
      const filler = join(dir, 'filler')
      writeFileSync(filler, Buffer.alloc(2 * 1024 * 1024 - 64 * 1024)) // 64 KiB left: a few turns
      const ran: string[] = []
      const dump = tool('dump', (a: { n: number }, ctx) => { ran.push(ctx.callId); return 'd'.repeat(a.n) })
      const provider = openAICompatible({ baseURL: fake.url, model: 'fake-model', apiKey: 'sk-test', contextWindow: 1_000_000 })
      const store = new FileStore(file); stores.push(store)
      const session = await Session.open(store)
      const agent = new Agent({ session, provider, tools: [dump] })
      let error: unknown, turns = 0
      for (; turns < 100 && error === undefined; turns++) { try { await agent.run(`turn ${turns}`) } catch (e) { error = e } }
      assert.ok(error instanceof SessionError && error.code === 'STORE', `expected SessionError STORE after ${turns} turns, got ${error}`)
      const m = DISK_FULL_RE.exec(error.message)
      assert.ok(m, error.message)
      const events = wholeLines(file) // no cut line: the partial write was taken back
      assert.equal(events.length, Number(m[3]) + 1, 'the file holds exactly the events up to the durable seq')
      assert.ok(session.seq > events.length, 'the events not written are not in the file')
      const logged = new Set(events.filter((e: any) => e.type === 'tool/call').map((e: any) => e.data.callId))
      assert.ok(ran.length > 0)
      for (const id of ran) assert.ok(logged.has(id), `tool call ${id} ran without its tool/call on disk`)
      console.log(`full disk: ${turns} turns, ${events.length} events on disk, ${session.seq - events.length} not written; ${error.message.slice(0, 200)}`)
      await store.close()
      // Space again: the log opens, resumes after its last whole event, and a turn completes.
      rmSync(filler)
      const again = new FileStore(file); stores.push(again)
      const resumed = await Session.open(again)
      assert.equal(resumed.torn, undefined)
      assert.equal(stateOf(resumed).openedAt, events.length)
      const result = await new Agent({ session: resumed, provider, tools: [dump] }).run('after the disk was full')
      assert.equal(result.reason, 'stop')
      await again.close()
      const reloaded = await Session.open(new FileStore(file, { readOnly: true }), { readOnly: true })
      assert.deepEqual(reloaded.messages(), resumed.messages())
    } finally {
      for (const s of stores) await s.close().catch(() => {})
      await fake.close()
      if (mounted) execFileSync('umount', [dir])
      rmSync(dir, { recursive: true, force: true })
    }
  })

  /** Fills the disk of `dir` but for `room` bytes; returns the filler's path. */
  const fillBut = (dir: string, room: number) => {
    const { bavail, bsize } = statfsSync(dir)
    writeFileSync(join(dir, 'fill'), Buffer.alloc(Number(bavail) * Number(bsize) - room))
    return join(dir, 'fill')
  }

  test('full disk: a torn last line that cannot be saved beside the log is a STORE error saying so; no part file is left', async (t) => {
    const ran = await onSmallDisk(async (dir) => {
      const log = join(dir, 's.jsonl')
      const first = await Session.open(new FileStore(log))
      first.append('user/message', { message: { role: 'user', content: 'kept' }, surfaceOp: { op: 'append' } })
      await first.sync(); await first.store.close?.()
      const torn = '{"seq":2,"type":"user/message","time":1,"data":{"message":"' + 'z'.repeat(100_000)
      appendFileSync(log, torn)
      const before = readFileSync(log)
      const fill = fillBut(dir, 16_384) // room for the lock file, not for the torn line's 100 kB
      const err = await Session.open(new FileStore(log)).then(() => undefined, (e) => e)
      // What happened: "cannot read session log …: ENOSPC: no space left on device, write", and each attempt left a
      // FILE.torn-<time> holding the first 4 KiB of the line.
      assert.ok(err instanceof SessionError && err.code === 'STORE', `expected STORE, got ${err}`)
      assert.match(err.message, /cannot write the torn last line \(line 3\) of session log .* \(disk full: ENOSPC/)
      assert.match(err.message, /the log was not changed .*: free disk space, then try again/)
      assert.deepEqual(readdirSync(dir).sort(), ['fill', 's.jsonl'])
      assert.deepEqual(readFileSync(log), before)
      unlinkSync(fill)
      const resumed = await Session.open(new FileStore(log))
      assert.equal(resumed.torn?.line, 3)
      assert.equal(readFileSync(resumed.torn!.savedTo!, 'utf8'), torn)
      assert.deepEqual(resumed.messages().map((m) => m.content), ['kept'])
      await resumed.store.close?.()
    })
    if (!ran) t.skip('needs root to mount a 2 MiB tmpfs')
  })

  test('full disk: an artefact that does not fit is a STORE error and leaves no part of itself', async (t) => {
    const ran = await onSmallDisk(async (dir) => {
      const store = new FileStore(join(dir, 's.jsonl'))
      mkdirSync(join(dir, 's.jsonl.artefacts'))
      fillBut(dir, 16_384)
      const err = await store.putArtefact('big', 'q'.repeat(300_000)).then(() => undefined, (e) => e)
      // What happened: a bare Error "ENOSPC: no space left on device, write", and s.jsonl.artefacts/big kept part
      // of the text: the little room left on the disk was taken by a file no event names.
      assert.ok(err instanceof SessionError && err.code === 'STORE', `expected STORE, got ${err}`)
      assert.match(err.message, /cannot write artefact .*big \(disk full: ENOSPC.*free disk space/)
      assert.deepEqual(readdirSync(join(dir, 's.jsonl.artefacts')), [])
    })
    if (!ran) t.skip('needs root to mount a 2 MiB tmpfs')
  })

  test('full disk: a lock file that could not be written is not left behind to lock the log out', async (t) => {
    const ran = await onSmallDisk(async (dir) => {
      const log = join(dir, 's.jsonl'), fill = join(dir, 'fill')
      assert.throws(() => writeFileSync(fill, Buffer.alloc(4 * 1024 * 1024)), { code: 'ENOSPC' }) // the disk is full
      const session = new Session({ store: new FileStore(log) })
      session.append('session/start', { id: 's', version: '0.1.0', format: 1 })
      // The first write takes the lock: creating FILE.lock works (an inode), writing its holder does not.
      await assert.rejects(session.sync(), (err: Error & { code?: string }) => err.code === 'STORE'
        && /ENOSPC/.test(err.message))
      unlinkSync(fill) // room again: the session keeps its events, and flushing again must write them
      await session.sync()
      assert.equal(readFileSync(log, 'utf8').split('\n').length, 2)
      await session.store.close?.()
      assert.equal(existsSync(`${log}.lock`), false)
    })
    if (!ran) t.skip('needs root to mount a 2 MiB tmpfs')
  })
})

// ── 2. Fault-injecting provider ────────────────────────────────────────────────────────────────

const OVERFLOW_TEXT = "This model's maximum context length is 8000 tokens. However, you requested 9100 tokens (8100 in the messages, 1000 in the completion). Please reduce the length of the messages or completion."
const HTML_502 = '<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\r\n<center><h1>502 Bad Gateway</h1></center>\r\n<hr><center>nginx/1.25.3</center>\r\n</body>\r\n</html>\r\n'
type FaultKind = 'ok-text' | 'ok-tool' | '429' | '500' | '503' | 'disconnect' | 'in-band' | 'no-done' | 'html-502' | 'overflow'
/** The code each fault must reach the caller with, and the provider text the error must carry. */
const FAULTS: Record<FaultKind, { weight: number; code?: string; text?: (n: number) => string }> = {
  'ok-text': { weight: 30 },
  'ok-tool': { weight: 22 },
  '429': { weight: 8, code: 'RATE_LIMIT', text: (n) => `Rate limit reached for requests per min (fault ${n})` },
  '500': { weight: 5, code: 'SERVER', text: (n) => `The server had an error while processing your request (fault ${n})` },
  '503': { weight: 5, code: 'SERVER', text: (n) => `Service is temporarily unavailable: overloaded (fault ${n})` },
  'disconnect': { weight: 6, code: 'TRANSPORT' },
  'in-band': { weight: 6, code: 'SERVER', text: (n) => `upstream model worker failed mid-generation (fault ${n})` },
  'no-done': { weight: 6, code: 'TRANSPORT' },
  'html-502': { weight: 6, code: 'SERVER', text: () => '502 Bad Gateway' },
  'overflow': { weight: 6, code: 'CONTEXT_WINDOW_EXCEEDED', text: () => OVERFLOW_TEXT },
}

describe('fault-injecting provider', () => {
  const TURNS = STRESS ? 2_500 : 500
  test(`${TURNS} seeded turns over a random mix of faults: every turn ends, requests stay paired, errors stay original`, { timeout: STRESS ? 900_000 : 180_000 }, async () => {
    const pick = rng(2026)
    const kinds = Object.keys(FAULTS) as FaultKind[]
    const total = kinds.reduce((s, k) => s + FAULTS[k].weight, 0)
    const choose = (): FaultKind => { let r = pick() * total; for (const k of kinds) { r -= FAULTS[k].weight; if (r < 0) return k } return 'ok-text' }
    let lastKind = 'ok-text' as FaultKind, lastN = 0, n = 0, callId = 0
    const handler = (req: FakeRequest): FakeReply => {
      n++
      if (req.headers['x-dsh-purpose'] === 'compaction') {
        return pick() < 0.8 ? { text: `CHECKPOINT ${n}: echo calls ran; continue.` } : { status: 500, body: { error: { message: `summariser failed (fault ${n})` } } }
      }
      const kind = choose()
      lastKind = kind; lastN = n
      const text = FAULTS[kind].text?.(n) ?? ''
      switch (kind) {
        case 'ok-text': return { text: `answer ${n}` }
        case 'ok-tool': return { text: 'calling', toolCalls: [{ id: `f${++callId}`, name: 'echo', arguments: { n } }] }
        case '429': return { status: 429, body: { error: { message: text, type: 'rate_limit_error', code: 'rate_limit_exceeded' } }, headers: { 'retry-after': '1' } }
        case '500': return { status: 500, body: { error: { message: text, type: 'server_error' } } }
        case '503': return { status: 503, body: { error: { message: text, type: 'server_error' } } }
        case 'disconnect': return { text: `partial ${n}`, fault: 'disconnect' }
        case 'in-band': return { fault: 'in-band-error', error: { message: text, type: 'server_error' }, text: 'so far' }
        case 'no-done': return { text: `cut ${n}`, fault: 'no-done' }
        case 'html-502': return { status: 502, body: HTML_502, headers: { 'content-type': 'text/html' } }
        case 'overflow': return { status: 400, body: { error: { message: text, type: 'invalid_request_error', code: 'context_length_exceeded' } } }
      }
    }
    const fake = await startFakeProvider({ handler })
    const tools: Tool[] = [tool('echo', (a: { n: number }) => `echo ${a.n}: ` + 'result line\n'.repeat(150))]
    const provider = tuned({ maxRetries: 2, retryBaseMs: 1, retryMaxMs: 5 }, () => openAICompatible({ baseURL: fake.url, model: 'fake-model', apiKey: 'sk-faults', contextWindow: 8_000, maxTokens: 1_000 }))
    const outcomes = new Map<string, number>()
    let retries = 0
    let session!: Session, agent!: Agent, file = ''
    try {
      for (let t = 0; t < TURNS; t++) {
        if (t % 25 === 0) {
          if (session) await session.store.close?.()
          file = join(WORK, `faults-${t}.jsonl`)
          session = await Session.open(new FileStore(file))
          agent = new Agent({ session, provider, tools, maxSteps: 8, prune: { thresholdChars: 1_000, headChars: 300, tailChars: 200 } })
        }
        const before = fake.requests.length, seqBefore = session.seq
        let outcome: string
        try {
          const r = await within(15_000, agent.run(`turn ${t}`), `turn ${t}`)
          assert.ok(['stop', 'length', 'max-steps'].includes(r.reason), `turn ${t}: reason ${r.reason}`)
          outcome = r.reason
        } catch (err) {
          assert.ok(err instanceof ProviderError, `turn ${t}: not a typed error: ${err}`)
          const expected: { code?: string; text?: (n: number) => string } = FAULTS[lastKind as FaultKind]
          assert.equal(err.code, expected.code, `turn ${t}: the last reply was ${lastKind}, the caller got ${err.code}: ${err.message}`)
          const original = expected.text?.(lastN)
          if (original) assert.ok(err.message.includes(original) || String(err.body ?? '').includes(original), `turn ${t}: ${lastKind}: the provider's text is lost: ${err.message}`)
          if (lastKind === 'html-502') assert.equal(err.status, 502)
          outcome = err.code
        }
        outcomes.set(outcome, (outcomes.get(outcome) ?? 0) + 1)
        for (const r of fake.requests.slice(before)) assertWirePaired(r.body, `turn ${t}`)
        for (const e of await logEvents(session, seqBefore)) if (e.type === 'recovery/retry') {
          const d = e.data as { generationBefore: number; generationAfter: number }
          assert.ok(d.generationAfter > d.generationBefore, `turn ${t}: an overflow retry without a generation change`)
          retries++
        }
        assert.equal(session.turn.open, false)
        assert.deepEqual((await Session.open(new FileStore(file), { readOnly: true })).messages(), session.messages(), `turn ${t}: the log does not reload to the same surface`)
      }
    } finally { await session?.store.close?.(); await fake.close() }
    console.log(`fault-injecting provider: ${TURNS} turns survived over ${fake.requests.length} requests (${[...outcomes].map(([k, v]) => `${k} ${v}`).join(', ')}; ${retries} overflow recoveries)`)
    assert.ok(retries > 0, 'no overflow recovery happened')
    for (const code of ['stop', 'RATE_LIMIT', 'SERVER', 'TRANSPORT', 'CONTEXT_WINDOW_EXCEEDED']) assert.ok(outcomes.get(code), `no turn ended with ${code}`)
  })
})

// ── 4. Bad input, over HTTP ────────────────────────────────────────────────────────────────────

/** Runs one turn on a FileStore session against a scripted fake; returns what happened. */
async function turnOverHTTP(name: string, script: FakeReply[], tools: Tool[] = []) {
  const fake = await startFakeProvider({ script })
  const file = join(WORK, `bad-${name}.jsonl`)
  const session = await Session.open(new FileStore(file))
  const provider = tuned({ maxRetries: 0 }, () => openAICompatible({ baseURL: fake.url, model: 'fake-model', apiKey: 'sk-bad', contextWindow: 64_000 }))
  const agent = new Agent({ session, provider, tools })
  let error: unknown, reason: string | undefined
  try { reason = (await within(60_000, agent.run(`bad input: ${name}`), name)).reason } catch (err) { error = err }
  await session.store.close?.()
  await fake.close()
  const log = await logEvents(session)
  const results = log.filter((e) => e.type === 'tool/result').map((e) => e.data as { message: ToolResultMessage; spilled?: { ref: string; bytes: number } })
  for (const [i, r] of fake.requests.entries()) assertWirePaired(r.body, `${name} request ${i}`)
  return { fake, session, file, error, reason, results, log }
}
const echo: Tool = tool('echo', (a: unknown) => JSON.stringify(a))

describe('bad input (over HTTP)', () => {
  const toolCases: { name: string; call: { id?: string; name: string; arguments: string | Record<string, unknown> }; tool?: Tool; code: string; text: RegExp }[] = [
    { name: 'arguments that are not JSON', call: { id: 'b1', name: 'echo', arguments: '{"path": "a.txt",,' }, code: 'TOOL_BAD_ARGUMENTS', text: /arguments of echo are not valid JSON/ },
    { name: 'a tool that throws', call: { id: 'b2', name: 'boom', arguments: {} }, tool: tool('boom', () => { throw new Error('disk on fire') }), code: 'TOOL_ERROR', text: /tool boom failed: disk on fire/ },
    { name: 'a tool that returns a non-string', call: { id: 'b3', name: 'num', arguments: {} }, tool: tool('num', () => 42 as any), code: 'TOOL_BAD_OUTPUT', text: /tool num returned number/ },
    // What happened: Session.append refused the result (the store could not write it) and the call stayed open: the
    // run threw, and every later one was PAIRING.
    { name: 'a tool that returns blocks JSON cannot hold (a BigInt)', call: { id: 'b5', name: 'big', arguments: {} }, tool: tool('big', () => [{ type: 'text', text: 'n', n: 1n }] as any), code: 'TOOL_BAD_OUTPUT', text: /tool big returned blocks that cannot be stored as JSON \(Do not know how to serialize a BigInt\)/ },
    { name: 'an unknown tool', call: { id: 'b4', name: 'rm_rf', arguments: {} }, code: 'TOOL_UNKNOWN', text: /unknown tool "rm_rf"; available tools: echo/ },
  ]
  for (const c of toolCases) test(`${c.name} → an error result (${c.code}) for the model; the turn completes`, async () => {
    const r = await turnOverHTTP(`${c.code}-${c.call.id}`, [{ toolCalls: [c.call] }, { text: 'understood' }], [echo, ...(c.tool ? [c.tool] : [])])
    assert.equal(r.error, undefined)
    assert.equal(r.reason, 'stop')
    assert.equal(r.results.length, 1)
    assert.equal(r.results[0].message.isError, true)
    assert.equal((r.results[0].message.metadata as any).code, c.code)
    const wire = r.fake.requests[1].body.messages.at(-1)
    assert.equal(wire.role, 'tool')
    assert.equal(wire.tool_call_id, c.call.id)
    assert.match(wire.content, c.text)
  })

  test('a tool call without an id gets one; its result is sent with the same id', async () => {
    const r = await turnOverHTTP('no-id', [{ toolCalls: [{ name: 'echo', arguments: { a: 1 } }] }, { text: 'ok' }], [echo])
    assert.equal(r.reason, 'stop')
    const sent = r.fake.requests[1].body.messages
    const id = sent.at(-2).tool_calls[0].id
    assert.ok(typeof id === 'string' && id.length > 0)
    assert.equal(sent.at(-1).tool_call_id, id)
    assert.equal(sent.at(-1).content, '{"a":1}')
  })

  test('lone surrogates in a tool output: U+FFFD on the wire, the original in the log', async () => {
    const text = 'left \uD800 middle \uDC00 right \uD83D\uDE00'
    const r = await turnOverHTTP('surrogates', [{ toolCalls: [{ id: 's1', name: 'raw', arguments: {} }] }, { text: 'ok' }], [tool('raw', () => text)])
    assert.equal(r.reason, 'stop')
    const wire = r.fake.requests[1]
    assert.equal(wire.body.messages.at(-1).content, 'left \uFFFD middle \uFFFD right \uD83D\uDE00')
    assert.doesNotMatch(wire.rawBody, /\\ud800|\\udc00/i)
    const reloaded = await Session.open(new FileStore(r.file), { readOnly: true })
    const logged = (await logEvents(reloaded)).find((e) => e.type === 'tool/result')!.data as { message: ToolResultMessage }
    assert.equal((logged.message.content[0] as any).text, text)
  })

  test('a 100 MB tool output is spilled to the store\'s artefacts, not held in the request', { timeout: 120_000 }, async () => {
    const SIZE = 100_000_000
    const huge = () => 'HEAD-OF-OUTPUT ' + 'x'.repeat(SIZE - 30) + ' END-OF-OUTPUT'
    const r = await turnOverHTTP('huge', [{ toolCalls: [{ id: 'h1', name: 'huge', arguments: {} }] }, { text: 'ok' }], [tool('huge', huge)])
    assert.equal(r.reason, 'stop')
    const spilled = r.results[0].spilled!
    assert.equal(spilled.bytes, SIZE - 1)
    assert.equal(statSync(spilled.ref).size, SIZE - 1)
    const body = r.fake.requests[1].rawBody
    assert.ok(body.length < 64_000, `the request body is ${body.length} chars`)
    assert.match(body, /HEAD-OF-OUTPUT/)
    assert.match(body, /END-OF-OUTPUT/)
    assert.ok(body.includes(`all ${SIZE - 1} bytes are stored at`))
    assert.ok(statSync(r.file).size < 64_000, 'the log holds the preview, not the output')
  })

  const bodyCases: { name: string; reply: FakeReply; code: string }[] = [
    { name: 'an empty 200 body', reply: { status: 200, body: '' }, code: 'EMPTY_RESPONSE' },
    { name: 'a 200 body that is not JSON', reply: { status: 200, body: 'Welcome to nginx! this is not JSON', headers: { 'content-type': 'application/json' } }, code: 'MALFORMED_RESPONSE' },
  ]
  for (const c of bodyCases) test(`${c.name} → ProviderError ${c.code}; the turn ends with reason error`, async () => {
    const r = await turnOverHTTP(c.code, [c.reply])
    assert.ok(r.error instanceof ProviderError, String(r.error))
    assert.equal(r.error.code, c.code)
    assert.equal(r.error.status, 200)
    const end = r.log.at(-1)!
    assert.deepEqual([end.type, (end.data as any).reason], ['turn/end', 'error'])
    assert.equal((r.log.find((e) => e.type === 'request/error')!.data as any).code, c.code)
  })

  const formats: [string, string][] = [
    ['an OpenAI message array', JSON.stringify([{ role: 'user', content: 'hi' }, { role: 'assistant', content: 'hello' }])],
    ['a Claude Code transcript', JSON.stringify({ type: 'user', uuid: 'u1', sessionId: 's', message: { role: 'user', content: 'hi' } }) + '\n'],
    ['a text file', 'just some notes\nnot a log\n'],
  ]
  for (const [name, text] of formats) test(`--session FILE holding ${name} → exit 2 with one clear line`, { timeout: 60_000 }, async () => {
    const file = join(WORK, `other-${name.replace(/\W+/g, '-')}.jsonl`)
    writeFileSync(file, text)
    const r = await runCli(['-p', 'hi', '--session', file, '--base-url', 'http://127.0.0.1:9', '--model', 'fake-model', '--context-window', '8000'], {})
    assert.equal(r.code, 2, r.stderr)
    assert.equal(r.stdout, '')
    const lines = r.stderr.trim().split('\n')
    assert.equal(lines.length, 1, r.stderr)
    assert.match(lines[0], new RegExp(`^dsh: --session ${file.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')}: session log line 1: (not valid JSON|not a dsh event|a JSON array, not a dsh event)`))
    assert.equal(readFileSync(file, 'utf8'), text, 'the file is left as it was')
  })
})

/** Runs the CLI (dsh.ts as the entry point) in a child process. */
function runCli(args: string[], env: Record<string, string>, cwd = WORK): Promise<{ code: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    const child = spawn(process.execPath, ['--import', TSX, join(ROOT, 'dsh.ts'), ...args], { cwd, env: { PATH: process.env.PATH ?? '', HOME: WORK, ...env }, stdio: ['ignore', 'pipe', 'pipe'] })
    let stdout = '', stderr = ''
    child.stdout.on('data', (d) => { stdout += d })
    child.stderr.on('data', (d) => { stderr += d })
    child.on('exit', (code) => resolve({ code, stdout, stderr }))
  })
}

// ── 5. Secrets ─────────────────────────────────────────────────────────────────────────────────

describe('secrets', () => {
  test('the API key never appears in the log, the events, --json output or error messages', { timeout: 90_000 }, async () => {
    const KEY = 'sk-DSH-SECRET-7f3a9c2e41b8d6055e'
    const dir = mkdtempSync(join(WORK, 'secrets-'))
    writeFileSync(join(dir, 'notes.txt'), 'the build passes\n')
    const fake = await startFakeProvider({
      script: [
        { toolCalls: [{ id: 'k1', name: 'read_file', arguments: { path: 'notes.txt' } }] },
        { text: 'The notes say the build passes.' },
        // An auth failure whose body echoes the key, as some providers do.
        { status: 401, body: { error: { message: `Incorrect API key provided: ${KEY}. You can find your API key at https://example.invalid/keys.`, type: 'invalid_request_error', code: 'invalid_api_key' } } },
        { status: 400, body: { error: { message: `Bad request (Authorization: Bearer ${KEY})`, type: 'invalid_request_error' } } },
      ],
    })
    const file = join(dir, 'session.jsonl')
    const env = { MY_FAKE_KEY: KEY }
    const base = ['--session', file, '--base-url', fake.url, '--model', 'fake-model', '--api-key-env', 'MY_FAKE_KEY', '--context-window', '16000']
    try {
      const runs = [
        await runCli(['-p', 'read notes.txt', '--json', ...base], env, dir),
        await runCli(['-p', 'again', '--json', ...base], env, dir),
        await runCli(['-p', 'and again', ...base], env, dir),
      ]
      assert.equal(runs[0].code, 0, runs[0].stderr)
      assert.match(runs[0].stdout, /The notes say the build passes/)
      assert.equal(runs[1].code, 1)
      assert.equal(runs[2].code, 1)
      assert.match(runs[1].stdout + runs[1].stderr, /AUTH/)
      assert.match(runs[2].stdout + runs[2].stderr, /INVALID_REQUEST/)
      // The key did reach the server (so the test is not vacuous) …
      assert.equal(fake.requests[0].headers.authorization, `Bearer ${KEY}`)
      // … and nowhere else.
      const outputs = runs.flatMap((r) => [r.stdout, r.stderr])
      const files = readdirSync(dir).map((f) => join(dir, f)).filter((f) => statSync(f).isFile()).map((f) => readFileSync(f, 'utf8'))
      assert.ok(files.some((f) => f.includes('request/error')), 'the log recorded the errors')
      for (const [i, text] of [...outputs, ...files].entries()) {
        assert.ok(!text.includes(KEY), `the key leaked into output/file #${i}: ${text.slice(Math.max(0, text.indexOf(KEY) - 200), text.indexOf(KEY) + 60)}`)
        assert.ok(!text.includes(KEY.slice(3, 20)), `part of the key leaked into output/file #${i}`)
      }
    } finally { await fake.close() }
  })
})

// ── 3. Property tests (fast-check, seeded) ─────────────────────────────────────────────────────

const RUNS = STRESS ? 2_000 : 200
const props: string[] = []
const check = (name: string, property: fc.IAsyncProperty<any> | fc.IProperty<any>, runs = RUNS) => {
  props.push(`${name} (${runs} runs)`)
  return fc.assert(property as any, { seed: 42, numRuns: runs })
}
after(() => console.log(`property tests: ${props.length} properties: ${props.join('; ')}`))

/** Any UTF-16 text: full Unicode incl. astral and combining marks, plus lone surrogates. */
const anyText = fc.array(fc.oneof(
  fc.string({ unit: 'grapheme', maxLength: 40 }),
  fc.string({ unit: 'binary', maxLength: 40 }),
  fc.constantFrom('\uD800', '\uDFFF', 'e\u0301', '👩‍👩‍👧', '\uD83D\uDE00', 'a'.repeat(500)),
  fc.string({ unit: fc.constantFrom('\uD800', '\uDC00', 'x', '\u0301'), maxLength: 60 }),
), { maxLength: 40 }).map((parts) => parts.join(''))
const wellFormed = (s: string) => !/[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/.test(s)
const pruneConfig = fc.record({ head: fc.integer({ min: 0, max: 300 }), tail: fc.integer({ min: 0, max: 300 }), slack: fc.integer({ min: 0, max: 300 }) })
  .map(({ head, tail, slack }) => ({ headChars: head, tailChars: tail, thresholdChars: head + tail + codePointLength(PRUNE_MARKER) + slack }))

describe('properties', () => {
  test('pruner: well-formed where the input was, within budget (code points), head and tail kept, idempotent', () => check('pruner',
    fc.property(anyText, pruneConfig, (text, config) => {
      const out = pruneText(text, config)
      const cps = [...text]
      if (cps.length <= config.thresholdChars) { assert.equal(out, text); return }
      assert.ok(codePointLength(out) <= config.thresholdChars)
      assert.equal(codePointLength(out), config.headChars + codePointLength(PRUNE_MARKER) + config.tailChars)
      assert.equal(out, cps.slice(0, config.headChars).join('') + PRUNE_MARKER + cps.slice(cps.length - config.tailChars).join(''))
      if (wellFormed(text)) assert.ok(wellFormed(out))
      assert.equal(pruneText(out, config), out)
    })))

  const sseEvent = fc.record({
    event: fc.option(fc.stringMatching(/^[a-z]{1,8}$/), { nil: undefined }),
    data: fc.array(fc.string({ unit: 'grapheme', maxLength: 20 }).map((s) => s.replace(/[\r\n]/g, ' ')), { minLength: 1, maxLength: 3 }),
    id: fc.option(fc.stringMatching(/^[a-z0-9]{1,6}$/), { nil: undefined }),
  })
  test('parseSSE: the same events however a valid stream is split into chunks', () => check('parseSSE chunking',
    fc.asyncProperty(fc.array(sseEvent, { minLength: 1, maxLength: 6 }), fc.constantFrom('\n', '\r\n', '\r'), fc.boolean(), fc.array(fc.nat(), { maxLength: 12 }), async (events, eol, bom, cuts) => {
      const text = (bom ? '\uFEFF' : '') + events.map((e) => [': comment', e.event ? `event: ${e.event}` : '', e.id ? `id: ${e.id}` : '', ...e.data.map((d) => `data: ${d}`)].filter(Boolean).join(eol) + eol + eol).join('')
      const bytes = new TextEncoder().encode(text)
      const at = [...new Set(cuts.map((c) => c % (bytes.length + 1)))].sort((a, b) => a - b)
      const chunks: Uint8Array[] = []
      let prev = 0
      for (const c of [...at, bytes.length]) { chunks.push(bytes.slice(prev, c)); prev = c }
      const collect = async (parts: Uint8Array[]) => { const out = []; for await (const e of parseSSE((async function* () { yield* parts })())) out.push({ event: e.event, data: e.data }); return out }
      const whole = await collect([bytes])
      assert.deepEqual(whole, events.map((e) => ({ event: e.event ?? 'message', data: e.data.join('\n') })))
      assert.deepEqual(await collect(chunks), whole)
    })))

  test('classifyProviderError never throws on random bytes and strings', () => check('classifier total',
    fc.property(fc.option(fc.integer({ min: -1, max: 1000 }), { nil: undefined }), fc.oneof(fc.string({ unit: 'binary' }), fc.uint8Array().map((b) => new TextDecoder().decode(b)), fc.json()), (status, body) => {
      const code = classifyProviderError(status, body)
      assert.ok(['CONTEXT_WINDOW_EXCEEDED', 'RATE_LIMIT', 'QUOTA', 'AUTH', 'INVALID_REQUEST', 'SERVER', 'TRANSPORT', 'TIMEOUT', 'ABORTED', 'EMPTY_RESPONSE', 'MALFORMED_RESPONSE'].includes(code))
    }), RUNS * 5))

  // Random operations on a session: valid ones keep every invariant; invalid ones throw SessionError and change nothing.
  const op = fc.oneof(
    fc.record({ kind: fc.constant('user'), text: fc.string({ maxLength: 30 }) }),
    fc.record({ kind: fc.constant('assistant'), calls: fc.nat({ max: 2 }), reuse: fc.boolean() }),
    fc.record({ kind: fc.constant('result'), pick: fc.nat(), bogus: fc.boolean() }),
    fc.record({ kind: fc.constant('replace'), a: fc.nat(), b: fc.nat(), stale: fc.boolean() }),
    fc.record({ kind: fc.constant('prune'), pick: fc.nat() }),
  )
  test('log: random appends and replaces keep every invariant and reload identically', () => check('log operations',
    fc.asyncProperty(fc.array(op, { maxLength: 30 }), async (ops) => {
      const store = new MemoryStore()
      const s = await Session.open(store)
      let ids = 0, rejected = 0
      for (const o of ops) {
        const before = JSON.stringify([s.events.length, s.surface(), [...stateOf(s).openCalls], s.replaceGeneration])
        try {
          if (o.kind === 'user') s.append('user/message', { message: { role: 'user', content: o.text }, surfaceOp: { op: 'append' } })
          else if (o.kind === 'assistant') {
            const content = Array.from({ length: o.calls }, () => ({ type: 'tool-call', id: o.reuse && ids > 0 ? `t${ids}` : `t${++ids}`, name: 'f', arguments: '{}' }))
            s.append('assistant/message', { message: { role: 'assistant', content: [{ type: 'text', text: 'a' }, ...content] as any }, finishReason: 'stop', surfaceOp: { op: 'append' } })
          } else if (o.kind === 'result') {
            const open = [...stateOf(s).openCalls]
            const id = o.bogus || open.length === 0 ? `nope${o.pick}` : open[o.pick % open.length]
            s.append('tool/result', { message: { role: 'tool', toolCallId: id, content: [{ type: 'text', text: 'r'.repeat(o.pick % 50_000) }] }, surfaceOp: { op: 'append' } })
          } else if (o.kind === 'replace') {
            const nodes = s.surface()
            const seqs = nodes.map((n) => n.seq)
            const a = o.stale ? o.a % (s.seq + 1) : seqs[o.a % Math.max(1, seqs.length)] ?? 0
            const b = o.stale ? o.b % (s.seq + 1) : seqs[o.b % Math.max(1, seqs.length)] ?? 0
            s.append('user/message', { message: { role: 'user', content: 'checkpoint' }, surfaceOp: { op: 'replace', start: a, end: b } })
          } else {
            const results = s.surface().filter((n) => n.message.role === 'tool')
            if (results.length) pruneToolResult(s, results[o.pick % results.length].seq)
          }
        } catch (err) {
          assert.ok(err instanceof SessionError, `not a SessionError: ${err}`)
          assert.equal(JSON.stringify([s.events.length, s.surface(), [...stateOf(s).openCalls], s.replaceGeneration]), before, 'a rejected append changed the session')
          rejected++
        }
        // Invariants: contiguous seqs; a request never has a call without its result or a result without its call.
        s.events.forEach((e, i) => assert.equal(e.seq, i))
        if ([...stateOf(s).openCalls].length === 0) {
          const calls = new Set<string>(), results: string[] = []
          for (const m of s.messages()) {
            if (m.role === 'assistant') for (const b of m.content) if (b.type === 'tool-call') calls.add((b as any).id)
            if (m.role === 'tool') results.push(m.toolCallId)
          }
          assert.deepEqual(results.slice().sort(), [...calls].sort())
        } else assert.throws(() => s.messages(), (e: any) => e instanceof SessionError && e.code === 'PAIRING')
      }
      await stateOf(s).flush()
      const again = await Session.open(store, { readOnly: true })
      assert.deepEqual(again.surface(), s.surface())
      assert.equal(again.replaceGeneration, s.replaceGeneration)
      assert.deepEqual([...stateOf(again).openCalls], [...stateOf(s).openCalls])
      assert.deepEqual(again.measure().totalTokens, s.measure().totalTokens)
      void rejected
    })))
})
