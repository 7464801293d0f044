// SqlLogStore against FileStore on this machine (not part of `npm run bench`: it starts a PostgreSQL
// server). Run: node --expose-gc --import tsx bench/sql-store.bench.ts   (prints a RESULTS.md section)
//   1. store writes per step, one session, 300 steps one after the other: a step is written as the
//      Agent writes one (a flush before the request: 3 events; a sync at its end: 3 events);
//      FileStore fsyncs at the sync, SqlLogStore commits each write (PostgreSQL fsyncs its WAL).
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

const STEPS = 300
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

async function stepLatency(store: LogStore): Promise<number[]> {
  const session = await Session.open(store)
  const ms: number[] = []
  for (let n = 1; n <= STEPS; n++) {
    turn(session, n)
    const t0 = performance.now()
    await stateOf(session).flush()
    finish(session, n)
    await session.sync()
    ms.push(performance.now() - t0)
  }
  await store.close?.()
  return ms.sort((a, b) => a - b)
}

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
  const pgQuery: SqlQuery = (sql, params) => pool.query(sql, params)
  const lite = new PGlite()
  try {
    const rows: string[][] = []
    for (const [name, make] of [
      ['FileStore (fsync at the step end)', () => new FileStore(join(dir, 'steps.jsonl'))],
      ['SqlLogStore on PGlite (in-process WASM)', () => new SqlLogStore({ query: (s, p) => lite.query(s, p), session: 'steps' })],
      ['SqlLogStore on PostgreSQL 15 (local, pg driver)', () => new SqlLogStore({ query: pgQuery, session: 'steps' })],
    ] as const) {
      const ms = await stepLatency(make())
      rows.push([name, pct(ms, 0.5), pct(ms, 0.99), ms.at(-1)!.toFixed(2)])
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
    console.log(`Machine load average while measuring: ${load}.\n`)
    console.log('| store | writes per step, p50 | p99 | max |\n|---|---|---|---|')
    for (const r of rows) console.log(`| ${r[0]} | ${r[1]} ms | ${r[2]} ms | ${r[3]} ms |`)
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
