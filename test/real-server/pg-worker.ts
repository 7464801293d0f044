// One worker process of the PostgreSQL load run (test/real-server/postgres.test.ts): opens its
// sessions through SqlLogStore over a pg.Pool and runs every session concurrently to `turns` turns,
// each turn a one-step exchange written the way the Agent writes a step (a flush before the request,
// a sync at its end: two statements, the second waiting for the fsync). Reports on stdout, one JSON object per line:
//   {"opened": KEY, "ms": …, "at": …}   the session's lease taken (after waiting out another holder's)
//   {"ack": KEY, "turn": N, "ms": …}   turn N is stored (the sync returned); ms = its writes
//   {"error": CODE, "key": KEY, "phase": …, "expiresAtMs"?: …}   a typed SessionError met and retried
//   {"done": true}
// Input: env DSH_PG_WORKER = {"port", "worker", "sessions": [...], "turns", "leaseMs"}.
import pg from 'pg'
import { Session, SessionError, SessionLockedError, SqlLogStore, internals } from '../../dsh.ts'

const { stateOf } = internals

const { port, worker, sessions, turns, leaseMs } = JSON.parse(process.env.DSH_PG_WORKER!) as {
  port: number; worker: string; sessions: string[]; turns: number; leaseMs: number
}
const pool = new pg.Pool({ host: '127.0.0.1', port, user: 'postgres', database: 'postgres', max: sessions.length })
pool.on('error', () => {}) // an idle client cut by a server restart: the next query reports it
const report = (o: object) => process.stdout.write(JSON.stringify(o) + '\n')
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms))

/** Runs `fn` until it succeeds, reporting each typed error; a lease held by another waits for its expiry. */
async function retrying<T>(key: string, phase: string, fn: () => Promise<T>): Promise<T> {
  for (;;) {
    try { return await fn() } catch (err) {
      if (!(err instanceof SessionError)) throw err
      const expiresAtMs = err instanceof SessionLockedError ? err.expiresAtMs : undefined
      report({ error: err.code, key, phase, message: err.message.slice(0, 200), expiresAtMs })
      if (err instanceof SessionLockedError && phase !== 'open') throw err // fenced off: never write again
      await sleep(err instanceof SessionLockedError ? Math.min(1_000, Math.max(50, err.expiresAtMs - Date.now() + 20)) : 200)
    }
  }
}

async function run(key: string): Promise<void> {
  const t0 = performance.now()
  const store = new SqlLogStore({ query: (sql, params) => pool.query(sql, params), session: key, owner: worker, leaseMs })
  const session = await retrying(key, 'open', () => Session.open(store, { id: key }))
  report({ opened: key, ms: Math.round(performance.now() - t0), at: Date.now() })
  for (let turn = session.turn.turn + 1; turn <= turns; turn++) {
    session.append('turn/start', { turn })
    session.append('user/message', { message: { role: 'user', content: `${key} turn ${turn} by ${worker}` }, surfaceOp: { op: 'append' } })
    session.append('step/start', { turn, step: 1 })
    const start = performance.now()
    await retrying(key, 'flush', () => stateOf(session).flush())
    const flushed = performance.now()
    await sleep(5 + Math.random() * 10) // the model's answer
    const answer = `answer ${turn} by ${worker}`
    session.append('assistant/message', { message: { role: 'assistant', content: [{ type: 'text', text: answer }] }, finishReason: 'stop', surfaceOp: { op: 'append' } })
    session.append('step/end', { turn, step: 1 })
    session.append('turn/end', { turn, reason: 'stop' })
    const before = performance.now()
    await retrying(key, 'sync', () => session.sync())
    report({ ack: key, turn, ms: Number((flushed - start + performance.now() - before).toFixed(3)) })
  }
  await retrying(key, 'close', () => store.close())
}

await Promise.all(sessions.map(run))
report({ done: true })
await pool.end()
