// One writer per session log, and a --session path that is not a dsh log is refused untouched
// (docs/design.md §13). The CLI runs as child processes against the fake provider.
import { test, describe } from 'node:test'
import assert from 'node:assert/strict'
import { rm, readFile, writeFile, readdir } from 'node:fs/promises'
import { spawnSync } from 'node:child_process'
import { symlinkSync } from 'node:fs'
import { hostname } from 'node:os'
import { join } from 'node:path'
import { FileStore, Session, SessionError } from '../dsh.ts'
import { startFakeProvider, type FakeReply } from './fake-provider.ts'
import { runDsh, tempDirs } from './cli-child.ts'

const tempDir = tempDirs('dsh-lock-')
async function withFake<T>(script: FakeReply[], fn: (flags: string[]) => Promise<T>): Promise<T> {
  const f = await startFakeProvider({ script })
  try { return await fn(['--base-url', f.url, '--model', 'm', '--context-window', '16000']) } finally { await f.close() }
}
/** The pid of a process that has exited (so is not running on this host). */
const deadPid = (): number => spawnSync(process.execPath, ['-e', 'console.log(process.pid)'], { encoding: 'utf8' }).stdout.trim() as unknown as number

describe('one writer per session log', () => {
  test('a second dsh on the same --session exits 2 naming the holder; the first finishes and the log stays contiguous', async () => {
    const cwd = await tempDir()
    let release!: () => void
    const gate = new Promise<void>((r) => { release = r })
    const f = await startFakeProvider({ handler: async (_req, index) => { if (index === 0) await gate; return { text: index === 0 ? 'slow answer' : 'never sent' } } })
    try {
      const flags = ['--base-url', f.url, '--model', 'm', '--context-window', '16000', '--session', 's.jsonl']
      const firstRun = runDsh(['-p', 'one', ...flags], cwd)
      while (f.requests.length === 0) await new Promise((r) => setTimeout(r, 20)) // the first holds the log and waits for its answer
      const second = await runDsh(['-p', 'two', ...flags], cwd)
      release()
      const first = await firstRun
      assert.equal(first.code, 0, first.stderr)
      assert.equal(first.stdout, 'slow answer\n')
      assert.equal(second.code, 2)
      assert.match(second.stderr, new RegExp(`^dsh: --session s\\.jsonl: session log \\S*s\\.jsonl is in use by pid \\d+ on host ${hostname().replace(/\./g, '\\.')} \\(since \\d{4}-\\d\\d-\\d\\dT[^)]+\\); wait for it to finish or use another session file \\(if pid \\d+ is no dsh, its number was reused: delete the lock file\\); lock file \\S*s\\.jsonl\\.lock\\n$`))
      assert.equal(f.requests.length, 1, 'the second sent nothing')
      const log = (await readFile(join(cwd, 's.jsonl'), 'utf8')).trim().split('\n').map((l) => JSON.parse(l))
      assert.deepEqual(log.map((e) => e.seq), log.map((_, i) => i))
      assert.equal(log.filter((e) => e.type === 'turn/start').length, 1)
      assert.ok(!(await readdir(cwd)).includes('s.jsonl.lock'), 'the lock is gone after the first exits')
    } finally { release(); await f.close() }
  })

  test('a stale lock (dead pid on this host) is reported and taken over, never silently', async () => {
    const cwd = await tempDir()
    const pid = Number(deadPid())
    await writeFile(join(cwd, 's.jsonl.lock'), JSON.stringify({ pid, host: hostname(), time: 1_700_000_000_000 }) + '\n')
    await withFake([{ text: 'ok' }], async (flags) => {
      const run = await runDsh(['-p', 'hi', ...flags, '--session', 's.jsonl'], cwd)
      assert.equal(run.code, 0, run.stderr)
      assert.match(run.stderr, new RegExp(`^dsh: --session s\\.jsonl: took over the stale lock of pid ${pid} on host .* \\(since 2023-11-14T22:13:20\\.000Z\\), which is no longer running\\n`))
    })
  })

  test('a lock file that is a link is refused without reading what it points to (a planted link to a key)', async () => {
    const dir = await tempDir()
    const log = join(dir, 's.jsonl')
    await writeFile(join(dir, 'id_rsa'), '-----BEGIN OPENSSH PRIVATE KEY----- b3BlbnNzaC1rZXktdjEAAAAA')
    symlinkSync(join(dir, 'id_rsa'), `${log}.lock`)
    const err = await Session.open(new FileStore(log)).then(() => undefined, (e) => e)
    // What happened: 'has a lock file that does not name its holder ("-----BEGIN OPENSSH PRIVATE KEY----- b3Bl…")':
    // the first 80 characters of the link's target, in an error message that goes to terminals and CI logs.
    assert.ok(err instanceof SessionError && err.code === 'SESSION_LOCKED', `expected SESSION_LOCKED, got ${err}`)
    assert.doesNotMatch(err.message, /PRIVATE KEY/)
    assert.match(err.message, /has a lock file that is no regular file \(a link, folder or FIFO\); if no dsh is using this log, delete the lock file/)
  })

  test('a lock held on another host is refused (its pid cannot be checked)', async () => {
    const cwd = await tempDir()
    await writeFile(join(cwd, 's.jsonl.lock'), JSON.stringify({ pid: 1, host: 'elsewhere.example', time: 1_700_000_000_000 }))
    const run = await runDsh(['-p', 'hi', '--base-url', 'http://127.0.0.1:9', '--model', 'm', '--session', 's.jsonl'], cwd)
    assert.equal(run.code, 2)
    assert.match(run.stderr, /is in use by pid 1 on host elsewhere\.example \(since 2023-11-14T22:13:20\.000Z\), another host; if that process is gone, delete the lock file; lock file \S*s\.jsonl\.lock\n$/)
  })

  test('in one process: a FileStore on a log another process holds is refused with SESSION_LOCKED; close releases', async () => {
    const dir = await tempDir()
    const file = join(dir, 's.jsonl')
    await writeFile(`${file}.lock`, JSON.stringify({ pid: process.ppid, host: hostname(), time: Date.now() }))
    await assert.rejects(Session.open(new FileStore(file)), (e: SessionError) => e.code === 'SESSION_LOCKED' && e.message.includes(`pid ${process.ppid}`))
    await rm(`${file}.lock`)
    const store = new FileStore(file)
    await Session.open(store)
    assert.equal(JSON.parse(await readFile(`${file}.lock`, 'utf8')).pid, process.pid)
    await store.close()
    assert.ok(!(await readdir(dir)).includes('s.jsonl.lock'))
  })
})

describe('a --session file that is not a dsh log is refused, never rewritten', () => {
  for (const [name, content] of [['.env', 'API_KEY=sk-live-123'], ['notes.txt', 'hello\nworld\n'], ['data.json', '{"a":1}']] as const) {
    test(`${name} (${JSON.stringify(content)})`, async () => {
      const cwd = await tempDir()
      await writeFile(join(cwd, name), content)
      const run = await runDsh(['-p', 'hi', '--base-url', 'http://127.0.0.1:9', '--model', 'm', '--session', name], cwd)
      assert.equal(run.code, 2)
      assert.match(run.stderr, new RegExp(`^dsh: --session ${name.replace('.', '\\.')}: session log line 1: `))
      assert.equal(await readFile(join(cwd, name), 'utf8'), content, 'byte for byte unchanged')
      assert.deepEqual(await readdir(cwd), [name], 'no torn-line copy, no lock file left')
    })
  }
})

describe('a log changed by another process while this store writes it is not appended to', () => {
  const event = (seq: number) => ({ seq, type: 'user/message', time: 1, data: { message: { role: 'user', content: `m${seq}` }, surfaceOp: { op: 'append' } } }) as any
  for (const [name, meddle] of [
    ['another process appends a line', (file: string) => writeFile(file, JSON.stringify(event(2)) + '\n', { flag: 'a' })],
    ['another process truncates it', (file: string) => writeFile(file, '')],
    ['another process deletes it', (file: string) => rm(file)],
    ['another process replaces it (rename over it, as an editor saves)', async (file: string) => { await writeFile(file + '.new', JSON.stringify(event(0)) + '\n'); await import('node:fs/promises').then((fs) => fs.rename(file + '.new', file)) }],
  ] as const) {
    test(name, async () => {
      const file = join(await tempDir(), 's.jsonl')
      const store = new FileStore(file)
      await store.load()
      await store.append([event(0), event(1)])
      await meddle(file)
      const before = await readFile(file, 'utf8').catch(() => 'deleted')
      await assert.rejects(store.append([event(2)]), (err: any) => err instanceof SessionError && err.code === 'SESSION_LOCKED' && /changed while this process was writing it/.test(err.message) && err.message.includes(file))
      assert.equal(await readFile(file, 'utf8').catch(() => 'deleted'), before, 'the file is left as the other process made it')
      await store.close()
    })
  }
  test('an event read back from a log another process cut short is LOG_CORRUPT, naming the line and the bytes', async () => {
    const file = join(await tempDir(), 's.jsonl')
    const store = new FileStore(file)
    await store.load()
    await store.append([event(0), event(1)])
    assert.deepEqual((await store.readEvent(1)).data, event(1).data)
    const lines = (await readFile(file, 'utf8')).split('\n')
    await writeFile(file, `${lines[0]}\n${lines[1].slice(0, 10)}`)
    await assert.rejects(store.readEvent(1), (err: any) => err instanceof SessionError && err.code === 'LOG_CORRUPT' && err.line === 2
      && new RegExp(`the file ends inside it \\(10 of ${lines[1].length + 1} bytes\\)`).test(err.message))
    await store.close()
  })
})
