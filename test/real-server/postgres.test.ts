// SqlLogStore against a real PostgreSQL 15 (Debian's binaries; test/real-server/postgres-server.ts
// starts a throwaway server on a free port and stops it by PID), through the `pg` driver: the LogStore
// conformance suite, then the load run — 100 sessions × 30 turns from 4 worker processes
// (test/real-server/pg-worker.ts) — and the faults: a worker SIGKILLed mid-step, whose sessions
// another worker resumes once their leases expire, and the database restarted mid-run.
// Run: npm run test:real (not part of `npm test`). Without the binaries it skips visibly; under CI it fails.
import { after, before, describe, test } from 'node:test'
import assert from 'node:assert/strict'
import { execFile, spawn, type ChildProcess } from 'node:child_process'
import { copyFileSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'
import pg from 'pg'
import { Session, SqlLogStore, type SessionEvent } from '../../dsh.ts'
import { testSqlLogStore } from '../sql-store-conformance.ts'
import { skipWithoutPostgres, startPostgres, type PostgresServer } from './postgres-server.ts'
import { startFakeProvider } from '../fake-provider.ts'

const skip = skipWithoutPostgres()
const HERE = dirname(fileURLToPath(import.meta.url))
const ROOT = join(HERE, '..', '..')
const WORKER = join(HERE, 'pg-worker.ts')
const SESSIONS = 100
const WORKERS = 4
const TURNS = 30
const RUN_TIMEOUT_MS = 300_000

let server: PostgresServer
let pool: pg.Pool
const query = (sql: string, params: unknown[]) => pool.query(sql, params)

interface Report {
  opened?: string; ack?: string; turn?: number; ms?: number; at?: number; error?: string; key?: string; phase?: string; message?: string
  expiresAtMs?: number; done?: boolean
}

/** A worker process: its reports as they arrive, and its exit. */
function startWorker(worker: string, sessions: string[], leaseMs: number, onReport: (r: Report) => void = () => {}) {
  const reports: Report[] = []
  let stderr = '', buffered = ''
  const child: ChildProcess = spawn(process.execPath, ['--import', 'tsx', WORKER], {
    env: { ...process.env, DSH_PG_WORKER: JSON.stringify({ port: server.port, worker, sessions, turns: TURNS, leaseMs }) },
    stdio: ['ignore', 'pipe', 'pipe'],
  })
  child.stdout!.on('data', (d) => {
    buffered += d
    const lines = buffered.split('\n')
    buffered = lines.pop()!
    for (const line of lines) { const r = JSON.parse(line) as Report; reports.push(r); onReport(r) }
  })
  child.stderr!.on('data', (d) => { stderr += d })
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) => {
    const timer = setTimeout(() => child.kill('SIGKILL'), RUN_TIMEOUT_MS)
    child.on('exit', (code, signal) => { clearTimeout(timer); resolve({ code, signal }) })
  })
  return { child, reports, exited, stderr: () => stderr }
}

const keysOf = (prefix: string) => Array.from({ length: SESSIONS }, (_, i) => `${prefix}-${String(i).padStart(3, '0')}`)
const shares = (keys: string[]) => Array.from({ length: WORKERS }, (_, w) => keys.filter((_, i) => i % WORKERS === w))
const percentile = (sorted: number[], p: number) => sorted[Math.min(sorted.length - 1, Math.floor(p * sorted.length))]

/**
 * Reads every session back and checks it: a valid log (Session.load re-checks every invariant), no
 * acknowledged turn missing, no turn twice, no writer interleaved (the writers of a session, in log
 * order, form runs: A…A B…B, never A B A), and every session complete to turn TURNS.
 */
async function verify(keys: string[], acks: Report[]) {
  let lost = 0, duplicated = 0, interleaved = 0, incomplete = 0, events = 0
  const writersBySession = new Map<string, string[]>()
  for (const key of keys) {
    const store = new SqlLogStore({ query, session: key, readOnly: true })
    await Session.open(store, { readOnly: true }) // throws on a log that breaks an invariant
    const log: SessionEvent[] = (await store.load()).events
    events += log.length
    const turns = new Map<number, number>()
    const writers: string[] = []
    for (const e of log) {
      const text = e.type === 'user/message' ? String((e.data as { message: { content: string } }).message.content) : ''
      const m = /^\S+ turn (\d+) by (\S+)$/.exec(text)
      if (m) { turns.set(Number(m[1]), (turns.get(Number(m[1])) ?? 0) + 1); if (writers.at(-1) !== m[2]) writers.push(m[2]) }
    }
    writersBySession.set(key, writers)
    if (new Set(writers).size !== writers.length) interleaved++
    for (const n of turns.values()) if (n > 1) duplicated += n - 1
    for (let t = 1; t <= TURNS; t++) if (!turns.has(t)) incomplete++
    for (const a of acks) if (a.ack === key && !turns.has(a.turn!)) lost++
  }
  return { lost, duplicated, interleaved, incomplete, events, writersBySession }
}

describe('SqlLogStore on PostgreSQL 15 (pg driver)', { skip }, () => {
  before(async () => {
    server = await startPostgres()
    pool = new pg.Pool({ ...server.config, max: 4 })
    pool.on('error', () => {})
  })
  after(async () => {
    await pool?.end()
    await server?.destroy()
  })

  testSqlLogStore('SqlLogStore (PostgreSQL 15)', query, 'Connection terminated unexpectedly')

  test("README's pg example runs as written against this server (the model: the fake provider)", async () => {
    const readme = readFileSync(join(ROOT, 'README.md'), 'utf8')
    const marker = readme.indexOf('<!-- docs-test: skip: needs a PostgreSQL server; test/real-server/postgres.test.ts runs it -->')
    assert.ok(marker > 0, 'the README block is marked')
    const code = /```ts\n([\s\S]*?)```/.exec(readme.slice(marker))![1]
    const dir = mkdtempSync(join(tmpdir(), 'dsh-readme-pg-'))
    const fake = await startFakeProvider({ handler: () => ({ text: 'The build fails because x is undefined.' }) })
    try {
      copyFileSync(join(ROOT, 'dsh.ts'), join(dir, 'dsh.ts'))
      symlinkSync(join(ROOT, 'node_modules'), join(dir, 'node_modules'))
      writeFileSync(join(dir, 'package.json'), '{"type":"module"}')
      writeFileSync(join(dir, 'example.ts'), code)
      const env: Record<string, string | undefined> = { ...process.env, DATABASE_URL: `postgres://postgres@127.0.0.1:${server.port}/postgres`,
        DEEPSEEK_API_KEY: 'sk-test', DSH_TEST_MODEL_URL: fake.url, NODE_OPTIONS: `--import ${join(ROOT, 'test', 'redirect-fetch.mjs')}` }
      delete env.NODE_TEST_CONTEXT
      const out = await new Promise<string>((resolve, reject) => execFile(process.execPath, ['--import', 'tsx', 'example.ts'], { cwd: dir, env, timeout: 60_000 },
        (err, stdout, stderr) => (err ? reject(new Error(`${err.message}\n${stdout}${stderr}`)) : resolve(stdout))))
      assert.equal(out, 'The build fails because x is undefined.\n')
      const log = (await new SqlLogStore({ query, session: 'ticket-42', readOnly: true }).load()).events
      assert.deepEqual(log.map((e) => e.type), ['session/start', 'turn/start', 'user/message', 'request/header', 'step/start', 'assistant/message', 'step/end', 'turn/end'])
      const lease = (await pool.query("SELECT owner, expires_ms FROM dsh_leases WHERE session_id = 'ticket-42'")).rows
      assert.deepEqual(lease, [{ owner: 'worker-1', expires_ms: '0' }], 'close gave the lease back')
    } finally {
      await fake.close()
      rmSync(dir, { recursive: true, force: true })
    }
  })

  test(`load: ${SESSIONS} sessions × ${TURNS} turns from ${WORKERS} worker processes: nothing lost, nothing twice, one writer per session`, { timeout: RUN_TIMEOUT_MS }, async () => {
    const keys = keysOf('load')
    const t0 = performance.now()
    const workers = shares(keys).map((share, w) => startWorker(`w${w}`, share, 60_000))
    const exits = await Promise.all(workers.map((w) => w.exited))
    const wallMs = performance.now() - t0
    exits.forEach((e, w) => assert.equal(e.code, 0, `worker w${w} exited ${e.code}/${e.signal}: ${workers[w].stderr()}`))
    const reports = workers.flatMap((w) => w.reports)
    assert.deepEqual(reports.filter((r) => r.error), [], 'no errors, no lease refused')
    const acks = reports.filter((r) => r.ack)
    assert.equal(acks.length, SESSIONS * TURNS)
    const v = await verify(keys, acks)
    assert.deepEqual({ lost: v.lost, duplicated: v.duplicated, interleaved: v.interleaved, incomplete: v.incomplete }, { lost: 0, duplicated: 0, interleaved: 0, incomplete: 0 })
    assert.equal(v.events, SESSIONS * (1 + TURNS * 6))
    const ms = acks.map((a) => a.ms!).sort((a, b) => a - b)
    console.log(`# figures: load run: ${acks.length} steps, ${v.events} events in ${(wallMs / 1000).toFixed(1)} s; store writes per step (2 statements, 1 fsync): p50 ${percentile(ms, 0.5).toFixed(2)} ms, p99 ${percentile(ms, 0.99).toFixed(2)} ms, max ${ms.at(-1)!.toFixed(2)} ms; lost 0, duplicated 0, interleaved 0`)
  })

  test('faults: a worker SIGKILLed mid-step is resumed by another after its leases expire; a database restart mid-run is a typed error, then success', { timeout: RUN_TIMEOUT_MS }, async () => {
    const keys = keysOf('faults')
    const leaseMs = 8_000 // longer than a worker's start (≈ 1–3 s here), so the rescuer meets every lease
    const groups = shares(keys)
    let killedAt = 0
    let restarted: Promise<void> | undefined
    const victimAcks: Report[] = []
    let othersAcks = 0
    const workers = groups.map((share, w) => startWorker(`w${w}`, share, leaseMs, (r) => {
      if (!r.ack) return
      if (w === 0) {
        victimAcks.push(r)
        if (victimAcks.length === share.length * 10) { killedAt = Date.now(); workers[0].child.kill('SIGKILL') }
      } else if (++othersAcks === (SESSIONS - share.length) * 15 && !restarted) {
        restarted = (async () => { await server.stop(); await new Promise((r) => setTimeout(r, 1_000)); await server.start() })()
      }
    }))
    const victim = await workers[0].exited
    assert.equal(victim.signal, 'SIGKILL')
    const ackedByVictim = victimAcks.length
    const rescuer = startWorker('w4', groups[0], leaseMs)
    const exits = await Promise.all([...workers.slice(1).map((w) => w.exited), rescuer.exited])
    await restarted
    exits.forEach((e, i) => assert.equal(e.code, 0, `worker exited ${e.code}/${e.signal}: ${[...workers.slice(1), rescuer][i].stderr()}`))
    assert.ok(restarted, 'the database was restarted mid-run')

    // The rescuer was refused while the dead worker's leases ran, naming it, then took every session.
    const refused = rescuer.reports.filter((r) => r.error)
    assert.ok(refused.length >= 1, 'the rescuer met the dead worker\'s leases')
    assert.ok(refused.filter((r) => r.error === 'SESSION_LOCKED').every((r) => r.phase === 'open' && /held by w0, lease token 1 until /.test(r.message!)), JSON.stringify(refused.slice(0, 3)))
    const opened = rescuer.reports.filter((r) => r.opened)
    assert.equal(opened.length, groups[0].length)
    for (const o of opened) {
      const lease = refused.filter((r) => r.key === o.opened && r.error === 'SESSION_LOCKED').at(-1)
      assert.ok(lease, `the rescuer found ${o.opened} leased to w0`)
      assert.ok(o.at! >= lease.expiresAtMs! - 50, `${o.opened} opened at ${o.at}, before w0's lease expired at ${lease.expiresAtMs}`)
      assert.ok(lease.expiresAtMs! <= killedAt + leaseMs + 50, 'the lease was the last one w0 extended')
    }
    const waitedMs = Math.max(...opened.map((r) => r.ms!))

    // The restart: typed STORE errors, every one retried to success.
    const errors = workers.slice(1).flatMap((w) => w.reports).filter((r) => r.error)
    assert.ok(errors.length >= 1, 'appends failed while the database was down')
    assert.deepEqual([...new Set(errors.map((r) => r.error))], ['STORE'])

    const acks = [...victimAcks, ...workers.slice(1).flatMap((w) => w.reports), ...rescuer.reports].filter((r) => r.ack)
    const v = await verify(keys, acks)
    assert.deepEqual({ lost: v.lost, duplicated: v.duplicated, interleaved: v.interleaved, incomplete: v.incomplete }, { lost: 0, duplicated: 0, interleaved: 0, incomplete: 0 })
    for (const key of groups[0]) assert.deepEqual(v.writersBySession.get(key), ['w0', 'w4'], key)
    // Mid-step: some of the dead worker's turns were cut after their first write; resume closed them.
    let interrupted = 0
    for (const key of groups[0]) {
      for await (const e of new SqlLogStore({ query, session: key, readOnly: true }).readEvents(0, Infinity)) {
        if (e.type === 'turn/end' && (e.data as { reason: string }).reason === 'interrupted') interrupted++
      }
    }
    assert.ok(interrupted >= 1, 'a turn was cut mid-step by the kill')
    console.log(`# figures: faults run: w0 SIGKILLed after ${ackedByVictim} acknowledged turns; ${interrupted} of its ${groups[0].length} sessions cut mid-step; w4 resumed all ${groups[0].length} after the leases expired (${leaseMs} ms leases; last open ${waitedMs} ms after w4 started, ${refused.filter((r) => r.error === 'SESSION_LOCKED').length} SESSION_LOCKED refusals); database restart: ${errors.length} typed STORE errors, all retried; lost ${v.lost}, duplicated ${v.duplicated}, interleaved ${v.interleaved}`)
  })
})
