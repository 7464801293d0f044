// Stores under a second writer, a failing disk, hostile log files and artefact refs (docs/design.md §4, §13), from a
// hostile-storage review of round 4. Each test failed when it was written; the TODO test states a promise that
// dsh does not keep yet (a second writer in the same process).
import { test, describe, after } from 'node:test'
import assert from 'node:assert/strict'
import fs, { mkdirSync, mkdtempSync, rmSync, writeFileSync, symlinkSync, readFileSync, readlinkSync, openSync, closeSync, constants } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { spawn, spawnSync, execFileSync } from 'node:child_process'
import { syncBuiltinESMExports } from 'node:module'
import { fileURLToPath } from 'node:url'
import { PGlite } from '@electric-sql/pglite'
import { Session, FileStore, MemoryStore, SessionError, SqlLogStore, internals, type SqlQuery } from '../dsh.ts'

const DSH = fileURLToPath(new URL('../dsh.ts', import.meta.url))
const dirs: string[] = []
const tempDir = () => { const d = mkdtempSync(join(tmpdir(), 'dsh-hostile-c-')); dirs.push(d); return d }
after(() => { for (const d of dirs) rmSync(d, { recursive: true, force: true }) })

const user = (text: string) => ({ message: { role: 'user' as const, content: [{ type: 'text' as const, text }] }, surfaceOp: { op: 'append' as const } })
const line = (seq: number, type: string, data: object) => JSON.stringify({ seq, type, time: 1_700_000_000_000, data })

/** How long an open or a sync may take here: generous, as a loaded machine (CI, parallel suites) is slow. */
const WITHIN_MS = 30_000

/** What `run` settles to within `ms`: its value, its error, or 'timeout'. */
async function within<T>(ms: number, run: Promise<T>): Promise<{ value?: T; error?: unknown; timeout?: true }> {
  let timer: NodeJS.Timeout | undefined
  const timeout = new Promise<{ timeout: true }>((r) => { timer = setTimeout(() => r({ timeout: true }), ms) })
  try { return await Promise.race([run.then((value) => ({ value }), (error) => ({ error })), timeout]) } finally { clearTimeout(timer) }
}

/** Runs the CLI with a deadline; `timedOut` when it had to be killed. */
function dsh(args: string[], ms = 15_000): Promise<{ code: number | null; stdout: string; stderr: string; timedOut: boolean }> {
  return new Promise((resolve) => {
    const child = spawn(process.execPath, ['--import', 'tsx', DSH, ...args], { stdio: ['ignore', 'pipe', 'pipe'] })
    let stdout = '', stderr = '', timedOut = false
    child.stdout.on('data', (b) => { stdout += b }); child.stderr.on('data', (b) => { stderr += b })
    const timer = setTimeout(() => { timedOut = true; child.kill('SIGKILL') }, ms)
    child.on('close', (code) => { clearTimeout(timer); resolve({ code, stdout, stderr, timedOut }) })
  })
}

/** A script that holds `log` open, and on a line of input appends and syncs once, saying whether it could. */
const holderScript = (log: string, close: boolean) => `import { Session, FileStore } from ${JSON.stringify(DSH)}
const s = await Session.open(new FileStore(${JSON.stringify(log)}))
process.stdout.write('ready\\n')
process.stdin.once('data', async () => {
  s.append('turn/start', { turn: 1 })
  try { await s.sync(); process.stdout.write('holder synced\\n') } catch (e) { process.stdout.write('holder refused: ' + e.code + '\\n') }
  ${close ? 'await s.store.close(); ' : ''}process.exit(0)
})\n`

describe('a second writer on the same log', () => {
  test('two Session objects in one process on the same log: the second open is refused, the first keeps writing', { todo: 'open: one process shares its lock (heldLogLocks counts holds); the older writer is the one refused, by the size check, and nothing acknowledged is lost' }, async () => {
    const log = join(tempDir(), 's.jsonl')
    const first = await Session.open(new FileStore(log))
    const second = await within(WITHIN_MS, Session.open(new FileStore(log)))
    // What happened: the second open succeeded (it wrote its session/resume), and the first writer's
    // next sync was refused "another process wrote to it": the older writer was locked out by the newer one.
    first.append('turn/start', { turn: 1 })
    first.append('user/message', user('from the first writer'))
    const synced = await within(WITHIN_MS, first.sync())
    assert.ok(second.error instanceof SessionError && second.error.code === 'SESSION_LOCKED',
      `the second Session on ${log} must be refused SESSION_LOCKED, but it opened (seq ${(second.value as Session | undefined)?.seq})`)
    assert.equal(synced.error, undefined, `the first writer must keep its log: ${(synced.error as Error)?.message}`)
    await first.store.close?.()
  })

  test('a second process that opens the log through a symlink is refused; the holder keeps writing', async () => {
    const dir = tempDir()
    const log = join(dir, 's.jsonl'), link = join(dir, 'alias.jsonl')
    symlinkSync(log, link)
    const holder = join(dir, 'holder.mts')
    writeFileSync(holder, holderScript(log, true))
    const child = spawn(process.execPath, ['--import', 'tsx', holder], { stdio: ['pipe', 'pipe', 'inherit'] })
    let out = ''
    child.stdout.on('data', (b) => { out += b })
    try {
      while (!out.includes('ready')) await new Promise((r) => setTimeout(r, 20))
      const intruder = await within(WITHIN_MS, Session.open(new FileStore(link)))
      if (intruder.value) await intruder.value.store.close?.()
      child.stdin.write('go\n')
      await new Promise((r) => child.once('close', r))
      // What happened: the lock is `${path}.lock` of the path as given, so alias.jsonl.lock was taken while
      // s.jsonl.lock was held; the intruder wrote session/resume and the holder was refused.
      assert.ok(intruder.error instanceof SessionError && intruder.error.code === 'SESSION_LOCKED',
        intruder.timeout ? `the intruder's open did not settle within ${WITHIN_MS} ms`
          : 'a writer reaching the held log through a symlink must be refused SESSION_LOCKED, but it opened and wrote')
      assert.match(out, /holder synced/, `the holder must keep writing its own log; it said: ${out.trim()}`)
    } finally { child.kill('SIGKILL') }
  })
})

describe('a writer in another PID namespace (same host name, shared file system)', () => {
  const bwrap = spawnSync('sh', ['-c', 'command -v bwrap'], { encoding: 'utf8' }).stdout.trim()
  test('does not judge the live holder\'s lock stale and take it over', { skip: bwrap ? false : 'no bwrap' }, async () => {
    const dir = tempDir()
    const log = join(dir, 's.jsonl')
    const holder = join(dir, 'holder.mts'), intruder = join(dir, 'intruder.mts')
    writeFileSync(holder, holderScript(log, false))
    writeFileSync(intruder, `import { Session, FileStore } from ${JSON.stringify(DSH)}
try { const s = await Session.open(new FileStore(${JSON.stringify(log)})); process.stdout.write('opened, took over ' + JSON.stringify(s.store.staleLock)); await s.store.close() }
catch (e) { process.stdout.write('refused ' + e.code) }\n`)
    const child = spawn(process.execPath, ['--import', 'tsx', holder], { stdio: ['pipe', 'pipe', 'inherit'] })
    let out = ''
    child.stdout.on('data', (b) => { out += b })
    try {
      while (!out.includes('ready')) await new Promise((r) => setTimeout(r, 20))
      // Its own PID namespace, as in a container with the host's UTS namespace or a bwrap sandbox: the holder's pid
      // does not exist there, so kill(pid, 0) says ESRCH.
      const seen = spawnSync(bwrap, ['--bind', '/', '/', '--dev', '/dev', '--proc', '/proc', '--unshare-pid', '--die-with-parent',
        process.execPath, '--import', 'tsx', intruder], { encoding: 'utf8', cwd: process.cwd(), timeout: 30_000 })
      child.stdin.write('go\n')
      await new Promise((r) => child.once('close', r))
      assert.match(seen.stdout, /^refused SESSION_LOCKED/, `the intruder ${seen.stdout || seen.stderr}: it took a live process's lock as stale`)
      assert.match(out, /holder synced/, `the holder must keep its log; it said: ${out.trim()}`)
    } finally { child.kill('SIGKILL') }
  })
})

describe('an fsync that fails (EIO)', () => {
  /** Makes node:fs's fsync fail `times` times with EIO (as a disk whose write-back failed), for `run`. */
  async function withFailingFsync<T>(times: number, run: () => Promise<T>): Promise<T> {
    const original = fs.fsync
    let left = times
    ;(fs as any).fsync = (fd: number, cb: (err: NodeJS.ErrnoException | null) => void) => {
      if (left-- > 0) return process.nextTick(cb, Object.assign(new Error('EIO: i/o error, fsync'), { code: 'EIO', errno: -5, syscall: 'fsync' }))
      return original(fd, cb)
    }
    syncBuiltinESMExports()
    try { return await run() } finally { (fs as any).fsync = original; syncBuiltinESMExports() }
  }

  test('a failed fsync is a STORE error naming the log and what is not durable (not a bare EIO)', async () => {
    const log = join(tempDir(), 's.jsonl')
    const session = await Session.open(new FileStore(log))
    session.append('turn/start', { turn: 1 })
    const err = await withFailingFsync(1, () => session.sync().then(() => undefined, (e) => e))
    assert.ok(err, 'sync must fail when fsync fails')
    assert.ok(err instanceof SessionError && err.code === 'STORE', `expected SessionError STORE, got ${err?.constructor?.name}: ${err?.message}`)
    await session.store.close?.()
  })

  test('after an fsync failed, a later sync does not acknowledge the events whose write-back failed', async () => {
    // Linux reports a write-back error to one fsync, then marks the pages clean: the next fsync succeeds
    // although the data never reached the disk. The store must not then acknowledge those events.
    const log = join(tempDir(), 's.jsonl')
    const session = await Session.open(new FileStore(log))
    session.append('turn/start', { turn: 1 })
    session.append('user/message', user('lost on a failing disk'))
    const first = await withFailingFsync(1, () => session.sync().then(() => 'ok', (e) => e))
    assert.notEqual(first, 'ok')
    const second = await withFailingFsync(0, () => session.sync().then(() => 'ok', (e) => e))
    assert.notEqual(second, 'ok', 'the second sync acknowledged events whose fsync had failed (nothing was rewritten in between)')
    await session.store.close?.()
  })
})

describe('a log path that is not a regular file', () => {
  test('Session.open on a FIFO is refused at once, never blocks', async () => {
    const fifo = join(tempDir(), 's.jsonl')
    execFileSync('mkfifo', [fifo])
    const opened = await within(3_000, Session.open(new FileStore(fifo)))
    // Unblock the open() parked in libuv's thread pool, so this process can exit.
    if (opened.timeout) { const fd = openSync(fifo, constants.O_RDWR | constants.O_NONBLOCK); setTimeout(() => closeSync(fd), 200) }
    assert.ok(!opened.timeout, 'Session.open(new FileStore(FIFO)) hung (open() for reading waits for a writer forever)')
    assert.ok(opened.error instanceof SessionError, `a FIFO must be refused with a SessionError, got ${String(opened.error ?? 'an open session')}`)
  })

  test('dsh show FIFO exits 2 at once; dsh --session FIFO too', async () => {
    const fifo = join(tempDir(), 'log.jsonl')
    execFileSync('mkfifo', [fifo])
    const show = await dsh(['show', fifo], 8_000)
    assert.ok(!show.timedOut, 'dsh show on a FIFO hung (killed after 8 s)')
    assert.equal(show.code, 2, show.stderr)
    const run = await dsh(['--session', fifo, '--base-url', 'http://127.0.0.1:9', '--model', 'm', '-p', 'hi'], 8_000)
    assert.ok(!run.timedOut, 'dsh --session FIFO hung (killed after 8 s)')
    assert.equal(run.code, 2, run.stderr)
  })
})

describe('artefacts', () => {
  /** A log whose one tool result was "spilled" to `ref`, written as a hostile or moved log would hold it. */
  function spilledLog(dir: string, ref: string): string {
    const log = join(dir, 's.jsonl')
    writeFileSync(log, [
      line(0, 'session/start', { id: 'x', version: '0.0.0', format: 1 }),
      line(1, 'turn/start', { turn: 1 }),
      line(2, 'user/message', user('read it')),
      line(3, 'assistant/message', { message: { role: 'assistant', content: [{ type: 'tool-call', id: 'c1', name: 'read_file', arguments: '{"path":"big.log"}' }] }, finishReason: 'tool_calls', surfaceOp: { op: 'append' } }),
      line(4, 'tool/call', { callId: 'c1', name: 'read_file' }),
      line(5, 'tool/result', { message: { role: 'tool', toolCallId: 'c1', content: [{ type: 'text', text: 'preview [... spilled ...]' }] }, spilled: { ref, bytes: 300_000 }, surfaceOp: { op: 'append' } }),
      line(6, 'step/end', { turn: 1, step: 1 }),
      line(7, 'turn/end', { turn: 1, reason: 'stop' }),
    ].join('\n') + '\n')
    return log
  }

  test('a spill never writes through a link planted in the log\'s artefact folder, nor into a folder it links to', async () => {
    const dir = tempDir()
    const victim = join(dir, 'bashrc'), elsewhere = join(dir, 'elsewhere')
    writeFileSync(victim, 'precious\n'); mkdirSync(elsewhere)
    mkdirSync(join(dir, 's.jsonl.artefacts'))
    symlinkSync(victim, join(dir, 's.jsonl.artefacts', 'tool-result-7.txt')) // spill names are tool-result-<seq>.txt
    const err = await new FileStore(join(dir, 's.jsonl')).putArtefact('tool-result-7.txt', 'echo pwned').then(() => undefined, (e) => e)
    // What happened: the artefact was written through the link: bashrc held the tool's output ("echo pwned").
    assert.ok(err instanceof SessionError && err.code === 'STORE', `expected STORE, got ${err}`)
    assert.match(err.message, /tool-result-7\.txt: it is a symbolic link, not written through; it was not stored: remove the link/)
    assert.equal(readFileSync(victim, 'utf8'), 'precious\n')
    assert.equal(readlinkSync(join(dir, 's.jsonl.artefacts', 'tool-result-7.txt')), victim, 'the link is reported, not removed')
    symlinkSync(elsewhere, join(dir, 't.jsonl.artefacts'))
    const linked = await new FileStore(join(dir, 't.jsonl')).putArtefact('a', 'text').then(() => undefined, (e) => e)
    // What happened: the artefact was written into the folder the link named.
    assert.ok(linked instanceof SessionError && linked.code === 'STORE', `expected STORE, got ${linked}`)
    assert.match(linked.message, /t\.jsonl\.artefacts is not a directory of this log \(a link, or missing\); artefact a not written/)
    assert.deepEqual(fs.readdirSync(elsewhere), [])
  })

  test('recall never reads a spilled ref outside the log\'s own artefact folder (a hostile log names ~/.ssh/id_rsa)', async () => {
    const dir = tempDir()
    const secret = join(dir, 'id_rsa')
    writeFileSync(secret, '-----BEGIN OPENSSH PRIVATE KEY----- hunter2\n')
    const session = await Session.open(new FileStore(spilledLog(dir, secret)))
    let answer: string
    try { answer = String(await internals.recallTool(session).execute({ key: 'c1' }, { signal: new AbortController().signal, callId: 'r1' } as any)) } catch (err) { answer = `ERROR ${(err as Error).message}` }
    await session.store.close?.()
    // What happened: FileStore.getArtefact(ref) is readFile(ref): the model was handed the file's bytes.
    assert.doesNotMatch(answer, /hunter2/, 'recall returned the content of a file outside s.jsonl.artefacts/ (it goes to the provider next)')
  })

  test('recall does not follow a FILE.artefacts that is a symlink out of the log\'s folder (a shipped log with artefacts -> ~/.ssh)', async () => {
    const dir = tempDir()
    const ssh = join(dir, 'home-ssh')
    mkdirSync(ssh)
    writeFileSync(join(ssh, 'id_rsa'), '-----BEGIN OPENSSH PRIVATE KEY----- hunter2\n')
    const log = spilledLog(dir, 's.jsonl.artefacts/id_rsa') // a ref by basename, as the fix reads it
    symlinkSync(ssh, `${log}.artefacts`) // git keeps symlinks: a repository can ship this next to a log
    const session = await Session.open(new FileStore(log))
    let answer: string
    try { answer = String(await internals.recallTool(session).execute({ key: 'c1' }, { signal: new AbortController().signal, callId: 'r1' } as any)) } catch (err) { answer = `ERROR ${(err as Error).message}` }
    await session.store.close?.()
    assert.doesNotMatch(answer, /hunter2/, `recall read through the symlinked artefact folder: ${answer.slice(0, 200)}`)
  })

  test('a spilled tool result is durable when the step that logged it is: its artefact is fsynced by the sync', async () => {
    const log = join(tempDir(), 's.jsonl')
    const session = await Session.open(new FileStore(log))
    const fsynced: string[] = []
    const record = (fd: number) => { try { fsynced.push(readlinkSync(`/proc/self/fd/${fd}`)) } catch { /* closed */ } }
    const saved = { fsync: fs.fsync, fsyncSync: fs.fsyncSync, fdatasync: fs.fdatasync, fdatasyncSync: fs.fdatasyncSync }
    Object.assign(fs, {
      fsync: (fd: number, cb: any) => { record(fd); return saved.fsync(fd, cb) },
      fsyncSync: (fd: number) => { record(fd); return saved.fsyncSync(fd) },
      fdatasync: (fd: number, cb: any) => { record(fd); return saved.fdatasync(fd, cb) },
      fdatasyncSync: (fd: number) => { record(fd); return saved.fdatasyncSync(fd) },
    })
    syncBuiltinESMExports()
    const probe = await fs.promises.open(log, 'r')
    const proto = Object.getPrototypeOf(probe)
    await probe.close()
    const savedHandle = { sync: proto.sync, datasync: proto.datasync }
    proto.sync = function (this: any) { record(this.fd); return savedHandle.sync.call(this) }
    proto.datasync = function (this: any) { record(this.fd); return savedHandle.datasync.call(this) }
    let ref: string
    try {
      // As the loop spills a 300 KB tool result: the artefact first, then the event naming it, then the step's sync.
      ref = await session.store.putArtefact!('tool-result-3.txt', 'x'.repeat(300_000))
      session.append('turn/start', { turn: 1 })
      await session.sync()
    } finally {
      Object.assign(fs, saved); syncBuiltinESMExports(); Object.assign(proto, savedHandle)
      await session.store.close?.()
    }
    assert.equal(readFileSync(ref, 'utf8').length, 300_000)
    assert.ok(fsynced.includes(ref), `the artefact ${ref} was never fsynced (fsynced: ${[...new Set(fsynced)].join(', ')}); after a power loss the `
      + 'acknowledged tool/result names an artefact that may be empty or missing')
  })
})

describe('dsh show of a hostile log', () => {
  test('a request/error without a message is shown, saying the field is missing (not "internal error", exit 1)', async () => {
    const log = join(tempDir(), 's.jsonl')
    writeFileSync(log, [
      line(0, 'session/start', { id: 'x', version: '0.0.0', format: 1 }),
      line(1, 'turn/start', { turn: 1 }),
      line(2, 'request/error', { code: 'SERVER', status: 500 }),
      line(3, 'turn/end', { turn: 1, reason: 'error' }),
    ].join('\n') + '\n')
    const show = await dsh(['show', log])
    assert.doesNotMatch(show.stderr, /internal error/, show.stderr)
    assert.equal(show.code, 0, show.stderr)
  })
})

describe('SqlLogStore with hostile rows and a second Session', () => {
  const db = new PGlite()
  after(async () => { await db.close() })
  const query: SqlQuery = (sql, params) => db.query(sql, params) as any

  test('a row whose event has no data is LOG_CORRUPT naming its seq, not a TypeError', async () => {
    const w = new SqlLogStore({ query, session: 'no-data' })
    await Session.open(w)
    await w.close()
    await db.query(`INSERT INTO dsh_events (session_id, seq, type, time_ms, event) VALUES ('no-data', 1, 'turn/start', 0, $1)`,
      [JSON.stringify({ seq: 1, type: 'turn/start', time: 0 })])
    const err = await Session.open(new SqlLogStore({ query, session: 'no-data' })).then(() => undefined, (e) => e)
    // What happened: "TypeError: Cannot read properties of undefined (reading 'turn')" (FileStore checks the shape; SqlLogStore's decode does not).
    assert.ok(err instanceof SessionError && err.code === 'LOG_CORRUPT', `expected LOG_CORRUPT, got ${err?.constructor?.name}: ${err?.message}`)
  })

  test('a batch refused because a seq holds another event writes none of its events (two Sessions on one store)', async () => {
    const store = new SqlLogStore({ query, session: 'two-sessions' })
    const a = await Session.open(store)
    await Session.open(store) // not refused either: it writes session/resume at seq 1
    a.append('user/message', user('A1'))
    a.append('user/message', user('A2'))
    const err = await a.sync().then(() => undefined, (e) => e)
    assert.match(String(err?.message), /already holds another event.*nothing of this batch was written/)
    const rows = (await db.query<{ seq: number; event: string }>(`SELECT seq, event FROM dsh_events WHERE session_id = 'two-sessions' ORDER BY seq`)).rows
    // What happened: seq 2 holds A2, written by the statement that refused the batch: A's message after B's resume.
    assert.deepEqual(rows.map((r) => JSON.parse(r.event).type), ['session/start', 'session/resume'],
      `the refused batch left ${rows.length - 2} of its events in the log: ${rows.slice(2).map((r) => r.event.slice(0, 80)).join(' | ')}`)
  })
})

describe('a hand-edited log on resume', () => {
  test('a log ending in blanks with no newline (an editor\'s trailing spaces): the events appended after it read back', async () => {
    const log = join(tempDir(), 's.jsonl')
    const first = await Session.open(new FileStore(log))
    first.append('user/message', user('before the edit'))
    await first.sync(); await first.store.close?.()
    fs.appendFileSync(log, '  \t ')
    const store = new FileStore(log)
    const resumed = await Session.open(store)
    resumed.append('user/message', user('after the edit'))
    await resumed.sync()
    const types: string[] = []
    // What happened: the appended events' line offsets were counted from the last event's end, before the blanks:
    // readEvent(2) was "session log line 3: not valid JSON" (its first bytes were the blanks, its last ones cut).
    for (let seq = 0; seq < resumed.seq; seq++) types.push((await resumed.readEvent(seq)).type)
    assert.deepEqual(types, ['session/start', 'user/message', 'session/resume', 'user/message'])
    const all: string[] = []
    for await (const e of resumed.readEvents(1, 4)) all.push(e.type)
    assert.deepEqual(all, ['user/message', 'session/resume', 'user/message'])
    await store.close()
    const again = await Session.open(new FileStore(log), { readOnly: true })
    assert.equal(again.seq, 4)
    assert.equal(((await again.readEvent(3)).data as any).message.content[0].text, 'after the edit')
  })
})

describe('an event a store cannot write', () => {
  const call = { message: { role: 'assistant' as const, content: [{ type: 'tool-call' as const, id: 'c1', name: 't', arguments: '{}' }] }, surfaceOp: { op: 'append' as const }, finishReason: 'tool-calls' }
  const cyclic: Record<string, unknown> = {}; cyclic.self = cyclic
  const cases: [string, Record<string, unknown>, RegExp][] = [
    ['a BigInt in a text block', { content: [{ type: 'text', text: 'x', n: 1n }] }, /BigInt/],
    ['a cycle in metadata', { content: [{ type: 'text', text: 'x' }], metadata: { cyclic } }, /circular/],
  ]
  for (const [name, result, why] of cases) test(`${name}: append refuses it (INVALID_EVENT), and the log keeps being written`, async () => {
    const log = join(tempDir(), 's.jsonl')
    const s = await Session.open(new FileStore(log))
    s.append('assistant/message', call)
    const refused = (() => { try { s.append('tool/result', { message: { role: 'tool', toolCallId: 'c1', ...result } as any, surfaceOp: { op: 'append' } }) } catch (e) { return e } })()
    // What happened: the append was taken, and every later flush failed on it ("could not write 3 event(s) to the
    // session store: Do not know how to serialize a BigInt"): nothing more reached the log.
    assert.ok(refused instanceof SessionError && refused.code === 'INVALID_EVENT', `expected INVALID_EVENT, got ${refused}`)
    assert.match(refused.message, why)
    assert.match(refused.message, /nothing was appended/)
    s.append('tool/result', { message: { role: 'tool', toolCallId: 'c1', content: [{ type: 'text', text: 'ok' }] }, surfaceOp: { op: 'append' } })
    await s.sync()
    await s.store.close?.()
    const lines = readFileSync(log, 'utf8').trim().split('\n').map((l) => JSON.parse(l).type)
    assert.deepEqual(lines, ['session/start', 'assistant/message', 'tool/result'])
  })

  test('a clock that gives NaN: append refuses the event (its time would be null, and the log unloadable)', async () => {
    const log = join(tempDir(), 's.jsonl')
    const s = await Session.open(new FileStore(log))
    await s.store.close?.()
    let t = NaN
    const resumed = await Session.open(new FileStore(log), { now: () => t }).then(() => undefined, (e) => e)
    // What happened: session/resume was written with "time":null, and the next open was "not a dsh event".
    assert.ok(resumed instanceof SessionError && resumed.code === 'INVALID_EVENT', `expected INVALID_EVENT, got ${resumed}`)
    assert.match(resumed.message, /time NaN is not a number of ms/)
    t = 1_700_000_000_000
    assert.equal((await Session.open(new FileStore(log), { now: () => t })).seq, 2)
  })
})

describe('two Sessions on one MemoryStore', () => {
  test('the writer that did not append last is refused SESSION_LOCKED, its batch stored not at all; the log stays contiguous', async () => {
    const store = new MemoryStore()
    const a = await Session.open(store)
    const b = await Session.open(store) // writes session/resume at seq 1
    a.append('user/message', user('from A'))
    a.append('user/message', user('from A, again'))
    const refused = await a.sync().then(() => undefined, (e) => e)
    // What happened: A's events were stored after B's resume, two events at seq 1: [0, 1, 1, 2], and the next open
    // of the store was LOG_CORRUPT "event seq 1 where 2 was expected".
    assert.ok(refused instanceof SessionError && refused.code === 'SESSION_LOCKED', `expected SESSION_LOCKED, got ${refused}`)
    assert.match(refused.message, /MemoryStore: event seq 1 where 2 was expected: another Session appended to this store; nothing of this batch was stored/)
    b.append('user/message', user('from B'))
    await b.sync()
    assert.deepEqual(store.events.map((e) => [e.seq, e.type]), [[0, 'session/start'], [1, 'session/resume'], [2, 'user/message']])
    assert.equal((await Session.open(store, { readOnly: true })).seq, 3)
  })
})
