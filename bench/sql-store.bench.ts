// SqlLogStore against FileStore on this machine (not part of `npm run bench`: it starts a PostgreSQL
// server). Run: node --expose-gc --import tsx bench/sql-store.bench.ts   (prints a RESULTS.md section)
//   1. store writes per step, one session per store, 1,000 steps (DSH_BENCH_STEPS), each written as
//      the Agent writes one: a flush before the request (3 events), one before each tool call (2
//      events per call), the step's end (3 events) and a sync. Two shapes: no tool call (2 writes),
//      two tool calls (4). FileStore fsyncs at the sync; SqlLogStore commits each flush without
//      waiting for the WAL's fsync and the step's end with it. "fsync per append" is the same store
//      with every statement waiting for the WAL (as SqlLogStore did before), in the same run; the
//      stores' steps are interleaved, so every row sees the same machine.
//   2. resume of a 100,002-event session (16,667 one-step turns): Session.open in a fresh process,
//      wall time and peak RSS, FileStore against PostgreSQL.
import { spawnSync } from 'node:child_process'
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import pg from 'pg'
import { PGlite } from '@electric-sql/pglite'
import { FileStore, Session, SqlLogStore, type LogStore, type SqlQuery, internals } from '../dsh.ts'

const { stateOf } = internals
import { startPostgres } from '../test/real-server/postgres-server.ts'
import { commitStamp, stampLabel } from './lib.ts'

const STEPS = Number(process.env.DSH_BENCH_STEPS ?? 1000)
const RESUME_TURNS = 16_667

function turn(session: Session, n: number) {
  session.append('turn/start', { turn: n })
  session.append('user/message', { message: { role: 'user', content: `question ${n} ` + 'x'.repeat(200) }, surfaceOp: { op: 'append' } })
  session.append('step/start', { turn: n, step: 1 })
}
function finish(session: Session, n: number) {
  session.append('assistant/message', { message: { role: 'assistant', content: [{ type: 'text', text: `answer ${n} ` + 'y'.repeat(400) }] }, finishReason: 'stop', surfaceOp: { op: 'append' } })
  session.append('step/end', { turn: n, step: 1 })
  session.append('turn/end', { turn: n, reason: 'stop' })
}

/** Store write time of each of STEPS steps with `tools` tool calls, the stores' steps interleaved. */
async function stepLatency(stores: LogStore[], tools: number): Promise<number[][]> {
  const sessions = await Promise.all(stores.map((store) => Session.open(store)))
  const ms: number[][] = stores.map(() => [])
  for (let n = 1; n <= STEPS; n++) {
    for (const [k, session] of sessions.entries()) {
      turn(session, n)
      const t0 = performance.now()
      await stateOf(session).flush()
      for (let c = 0; c < tools; c++) {
        // Two events per call, as a dispatch record and the previous call's result are written.
        session.append('bench/tool', { call: `call_${n}_${c}`, output: 'z'.repeat(300) })
        session.append('bench/tool', { call: `call_${n}_${c}`, done: true })
        await stateOf(session).flush()
      }
      finish(session, n)
      await session.sync()
      ms[k].push(performance.now() - t0)
    }
  }
  for (const store of stores) await store.close?.()
  return ms.map((m) => m.sort((a, b) => a - b))
}

/** The same database with every statement waiting for the WAL's fsync (SqlLogStore before one fsync per step). */
const fsyncEachAppend = (query: SqlQuery): SqlQuery => (sql, params) => (/^UPDATE \w+_leases SET expires_ms = \(extract/.test(sql)
  ? Promise.resolve([{ ok: 1 }]) // its sync(): nothing left to wait for
  : query(sql.replaceAll("set_config('synchronous_commit', 'off', true)", "'on'"), params))

const pct = (sorted: number[], p: number) => sorted[Math.min(sorted.length - 1, Math.floor(p * sorted.length))].toFixed(2)

/** Child mode: open the session in `argv` and print {ms, maxRssMB, surface}. */
async function resumeChild(kind: string, where: string) {
  let store: LogStore
  let pool: pg.Pool | undefined
  if (kind === 'file') store = new FileStore(where)
  else {
    pool = new pg.Pool({ host: '127.0.0.1', port: Number(where), user: 'postgres', database: 'postgres', max: 1 })
    store = new SqlLogStore({ query: (sql, params) => pool!.query(sql, params), session: 'resume' })
    await pool.query('SELECT 1')
  }
  const t0 = performance.now()
  const session = await Session.open(store)
  const ms = performance.now() - t0
  await store.close?.()
  await pool?.end()
  console.log(JSON.stringify({ ms, maxRssMB: process.resourceUsage().maxRSS / 1024, events: session.seq, surface: session.messages().length }))
}

async function main() {
  const dir = mkdtempSync(join(tmpdir(), 'dsh-sql-bench-'))
  const server = await startPostgres()
  const pool = new pg.Pool({ ...server.config, max: 2 })
  pool.on('error', () => {}) // an idle client cut as the server stops at the end
  const pgQuery: SqlQuery = (sql, params) => pool.query(sql, params)
  const lite = new PGlite()
  try {
    const rows: string[][] = []
    const liteQuery: SqlQuery = (s, p) => lite.query(s, p)
    for (const tools of [0, 2]) {
      const stores: [string, LogStore][] = [
        ['FileStore (fsync at the step end)', new FileStore(join(dir, `steps-${tools}.jsonl`))],
        ['SqlLogStore on PGlite (in-process WASM)', new SqlLogStore({ query: liteQuery, session: `steps-${tools}` })],
        ['SqlLogStore on PostgreSQL 15 (local, pg driver)', new SqlLogStore({ query: pgQuery, session: `steps-${tools}` })],
        ['PostgreSQL 15, fsync per append (before)', new SqlLogStore({ query: fsyncEachAppend(pgQuery), session: `before-${tools}` })],
      ]
      const ms = await stepLatency(stores.map(([, store]) => store), tools)
      stores.forEach(([name], k) => rows.push([name, String(tools), pct(ms[k], 0.5), pct(ms[k], 0.99), ms[k].at(-1)!.toFixed(2)]))
    }
    // The 100,002-event session, written once into each store.
    for (const store of [new FileStore(join(dir, 'resume.jsonl')), new SqlLogStore({ query: pgQuery, session: 'resume' })]) {
      const session = await Session.open(store)
      for (let n = 1; n <= RESUME_TURNS; n++) {
        turn(session, n); finish(session, n)
        if (n % 200 === 0) await stateOf(session).flush()
      }
      await session.sync()
      await store.close?.()
    }
    const self = fileURLToPath(import.meta.url)
    const resume = (kind: string, where: string) => {
      const runs = [0, 1, 2].map(() => {
        const child = spawnSync(process.execPath, ['--import', 'tsx', self, 'resume', kind, where], { encoding: 'utf8' })
        if (child.status !== 0) throw new Error(child.stderr)
        return JSON.parse(child.stdout.trim().split('\n').at(-1)!) as { ms: number; maxRssMB: number; events: number; surface: number }
      })
      return runs.sort((a, b) => a.ms - b.ms)[1] // the median of three fresh processes
    }
    const file = resume('file', join(dir, 'resume.jsonl'))
    const sql = resume('sql', String(server.port))
    const load = spawnSync('cat', ['/proc/loadavg'], { encoding: 'utf8' }).stdout.trim()
    console.log(`Commit ${stampLabel(commitStamp())}; load average at the end: ${load}; ${STEPS} steps per row.\n`)
    console.log('| store | tool calls per step | writes per step, p50 | p99 | max |\n|---|---:|---|---|---|')
    for (const r of rows) console.log(`| ${r[0]} | ${r[1]} | ${r[2]} ms | ${r[3]} ms | ${r[4]} ms |`)
    console.log(`\n| resume of ${file.events.toLocaleString('en')} events (${file.surface.toLocaleString('en')} surface messages) | Session.open | peak RSS |\n|---|---|---|`)
    console.log(`| FileStore | ${file.ms.toFixed(0)} ms | ${file.maxRssMB.toFixed(0)} MB |`)
    console.log(`| SqlLogStore on PostgreSQL 15 | ${sql.ms.toFixed(0)} ms (${(sql.ms / file.ms).toFixed(2)}× FileStore) | ${sql.maxRssMB.toFixed(0)} MB |`)
  } finally {
    await lite.close()
    await pool.end()
    await server.destroy()
    rmSync(dir, { recursive: true, force: true })
  }
}

if (process.argv[2] === 'resume') await resumeChild(process.argv[3], process.argv[4])
else await main()
