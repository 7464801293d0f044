// SqlLogStore on PGlite (PostgreSQL compiled to WASM, in this process): the LogStore conformance
// suite, then the lease (one writer across workers, fencing), the retry of a batch whose commit was
// not acknowledged, paging, and the tables (docs/design.md §4 "SQL store"). The same store against a
// PostgreSQL 15 server is test/real-server/postgres.test.ts (npm run test:real).
import { after, before, describe, test } from 'node:test'
import assert from 'node:assert/strict'
import { PGlite } from '@electric-sql/pglite'
import { Session, SessionError, SessionLockedError, SqlLogStore, type SessionEvent, type SqlQuery, internals } from '../dsh.ts'

const { stateOf } = internals
import { testSqlLogStore } from './sql-store-conformance.ts'

const db = new PGlite()
after(async () => { await db.close() })
const query: SqlQuery = (sql, params) => db.query(sql, params)
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms))
const user = (text: string) => ({ message: { role: 'user' as const, content: text }, surfaceOp: { op: 'append' as const } })

testSqlLogStore('SqlLogStore (PGlite)', query, 'server closed the connection unexpectedly')

/** The text of the user messages of `session` key's log, read without the lease. */
async function userTexts(session: string): Promise<string[]> {
  const events = (await new SqlLogStore({ query, session, readOnly: true }).load()).events
  assert.deepEqual(events.map((e) => e.seq), events.map((_, i) => i))
  return events.filter((e) => e.type === 'user/message').map((e) => (e.data as { message: { content: string } }).message.content)
}

/** Writes `count` user messages `m0`, `m1`, … to session `key` (after its session/start) and closes it. */
async function writeMessages(key: string, count: number): Promise<void> {
  const writer = new SqlLogStore({ query, session: key })
  const session = await Session.open(writer)
  for (let i = 0; i < count; i++) session.append('user/message', user(`m${i}`))
  await session.sync()
  await writer.close()
}

describe('SqlLogStore: one writer across workers', () => {
  test('a second worker\'s load is refused with SessionLockedError naming owner, token and expiry; close gives the lease back', async () => {
    const a = new SqlLogStore({ query, session: 'lease-1', owner: 'worker-a', leaseMs: 60_000 })
    const sa = await Session.open(a)
    const before = Date.now()
    const b = new SqlLogStore({ query, session: 'lease-1', owner: 'worker-b' })
    const err = await Session.open(b).then(() => undefined, (e) => e)
    assert.ok(err instanceof SessionLockedError, String(err))
    assert.equal(err.code, 'SESSION_LOCKED')
    assert.equal(err.owner, 'worker-a')
    assert.equal(err.token, 1)
    assert.ok(err.expiresAtMs > before + 55_000 && err.expiresAtMs <= Date.now() + 60_000, `expiry ${err.expiresAtMs}`)
    assert.match(err.message, /^session "lease-1" is held by worker-a, lease token 1 until \d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z \(\d+ ms from now\); open it again after that, or once its owner closes it$/)
    assert.equal(b.token, undefined)
    sa.append('user/message', user('still mine'))
    await sa.sync()
    await a.close()
    const sb = await Session.open(b)
    assert.equal(b.token, 2, 'a takeover raises the fencing token')
    assert.equal(sb.messages().length, 1)
    await b.close()
  })

  test('a crashed worker\'s lease expires; another worker resumes with every acknowledged event', async () => {
    const a = new SqlLogStore({ query, session: 'lease-2', owner: 'worker-a', leaseMs: 400 })
    const sa = await Session.open(a)
    sa.append('turn/start', { turn: 1 })
    sa.append('user/message', user('acknowledged'))
    await sa.sync()
    const acknowledged = sa.seq
    // worker-a dies here: no close, no more appends.
    const b = new SqlLogStore({ query, session: 'lease-2', owner: 'worker-b', leaseMs: 400 })
    await assert.rejects(Session.open(b), (e: SessionLockedError) => e.owner === 'worker-a')
    await sleep(450)
    const sb = await Session.open(b)
    assert.equal(stateOf(sb).openedAt, acknowledged)
    assert.deepEqual(sb.messages().map((m) => m.content), ['acknowledged'])
    assert.deepEqual(sb.turn, { turn: 1, open: false, step: 0, stepOpen: false }, 'the crashed turn is closed')
    await b.close()
  })

  test('a paused-then-revived old owner is fenced off: its append and artefact write fail, nothing interleaves', async () => {
    const a = new SqlLogStore({ query, session: 'lease-3', owner: 'worker-a', leaseMs: 300 })
    const sa = await Session.open(a)
    sa.append('user/message', user('a before the pause'))
    await sa.sync()
    await sleep(350) // worker-a pauses (a GC stall, a frozen VM) past its lease
    const b = new SqlLogStore({ query, session: 'lease-3', owner: 'worker-b', leaseMs: 60_000 })
    const sb = await Session.open(b)
    sb.append('user/message', user('b took over'))
    await sb.sync()
    sa.append('user/message', user('a revived'))
    const err = await sa.sync().then(() => undefined, (e) => e)
    assert.ok(err instanceof SessionLockedError, String(err))
    assert.equal(err.owner, 'worker-b')
    assert.equal(err.token, 2)
    assert.match(err.message, /^session "lease-3" was taken over by worker-b \(this store's token 1 is fenced off: nothing written\), lease token 2 until /)
    await assert.rejects(a.putArtefact('tool-result-9.txt', 'stale'), SessionLockedError)
    await a.close() // gives nothing back: the lease is worker-b's
    sb.append('user/message', user('b goes on'))
    await sb.sync()
    assert.deepEqual(await userTexts('lease-3'), ['a before the pause', 'b took over', 'b goes on'])
    await b.close()
  })

  test('an expired lease no one took is renewed by its own holder (nothing else wrote: the token is unchanged)', async () => {
    const a = new SqlLogStore({ query, session: 'lease-4', owner: 'worker-a', leaseMs: 200 })
    const sa = await Session.open(a)
    await sleep(250)
    sa.append('user/message', user('late but alone'))
    await sa.sync()
    assert.equal(a.token, 1)
    await assert.rejects(Session.open(new SqlLogStore({ query, session: 'lease-4', leaseMs: 200 })), SessionLockedError, 'the append extended the lease')
    await a.close()
  })

  test('readOnly: reads a held session without its lease; writes are refused', async () => {
    const a = new SqlLogStore({ query, session: 'lease-5', owner: 'worker-a' })
    const sa = await Session.open(a)
    sa.append('user/message', user('visible'))
    await sa.sync()
    const reader = new SqlLogStore({ query, session: 'lease-5', readOnly: true })
    const view = await Session.open(reader, { readOnly: true })
    assert.deepEqual(view.messages().map((m) => m.content), ['visible'])
    await assert.rejects(reader.append([]).then(() => reader.putArtefact('x', 'y')), /opened read-only/)
    await a.close()
  })
})

describe('SqlLogStore: faults, paging and tables', () => {
  test('a database error is a typed STORE error with the driver\'s cause; the events wait and are written by the next sync', async () => {
    let failing = false
    const store = new SqlLogStore({ query: async (sql, params) => {
      if (failing) throw new Error('connect ECONNREFUSED 127.0.0.1:5432')
      return await query(sql, params)
    }, session: 'fault-1' })
    const session = await Session.open(store)
    session.append('user/message', user('during the outage'))
    failing = true
    const err = await session.sync().then(() => undefined, (e) => e)
    assert.ok(err instanceof SessionError && err.code === 'STORE', String(err))
    const direct = await store.append([{ seq: 2, type: 'x', time: 0, data: {} }]).then(() => undefined, (e) => e)
    assert.ok(direct instanceof SessionError && direct.code === 'STORE')
    assert.equal((direct.cause as Error).message, 'connect ECONNREFUSED 127.0.0.1:5432')
    assert.match(err.message, /appending 1 event\(s\) of session "fault-1" failed: connect ECONNREFUSED 127\.0\.0\.1:5432; nothing of it was written/)
    failing = false
    await session.sync()
    assert.deepEqual(await userTexts('fault-1'), ['during the outage'])
    await store.close()
  })

  test('a batch whose commit was not acknowledged is retried with later events: stored once each', async () => {
    let loseNext = false
    const store = new SqlLogStore({ query: async (sql, params) => {
      const rows = await query(sql, params)
      if (loseNext && sql.includes('INSERT INTO dsh_events')) { loseNext = false; throw new Error('Connection terminated unexpectedly') }
      return rows
    }, session: 'fault-2' })
    const session = await Session.open(store)
    session.append('user/message', user('one'))
    loseNext = true
    await assert.rejects(session.sync(), (e: SessionError) => e.code === 'STORE')
    session.append('user/message', user('two'))
    await session.sync() // the retry holds 'one' again (already stored) and 'two'
    assert.deepEqual(await userTexts('fault-2'), ['one', 'two'])
    // A different event at a stored seq is refused, not written over.
    const clash: SessionEvent = { seq: 1, type: 'user/message', time: 0, data: user('not one') }
    await assert.rejects(store.append([clash]), /seq 1 of session "fault-2" already holds another event \(user\/message\)/)
    await store.close()
  })

  test('loading 1,201 events pages through them by seq ranges of 500: 3 SELECTs, never the whole log at once', async () => {
    await writeMessages('paging', 1_200)
    const pages: number[] = []
    const reader = new SqlLogStore({ query: async (sql, params) => {
      const result = await db.query(sql, params)
      if (sql.includes('ORDER BY seq')) pages.push(result.rows.length)
      return result
    }, session: 'paging' })
    let n = 0
    await reader.scan(() => { n++ })
    assert.equal(n, 1_201)
    assert.deepEqual(pages, [500, 500, 201])
    await reader.close()
  })

  test('rows that are not a contiguous log are refused with LOG_CORRUPT naming the seq: a gap, even at a page end; a foreign row', async () => {
    await writeMessages('gap', 600)
    await db.query(`DELETE FROM dsh_events WHERE session_id = 'gap' AND seq = 499`) // the last of the first page
    const gap = await Session.open(new SqlLogStore({ query, session: 'gap' })).then(() => undefined, (e) => e)
    assert.ok(gap instanceof SessionError && gap.code === 'LOG_CORRUPT', String(gap))
    assert.match(gap.message, /row seq 500 where 499 was expected/)
    await db.query(`UPDATE dsh_events SET event = '{"seq":7}' WHERE session_id = 'gap' AND seq = 7`)
    await assert.rejects(new SqlLogStore({ query, session: 'gap', readOnly: true }).readEvent(7), /row seq 7 where 7 was expected, or its event is not a dsh event/)
  })

  test('tables: events keyed by (session_id, seq) with type, time and a version column; a prefix names them; a bad prefix is refused', async () => {
    const store = new SqlLogStore({ query, session: 'tables', tablePrefix: 'agent_logs' })
    const session = await Session.open(store, { id: 'tables' })
    session.append('user/message', user('hi'))
    await session.sync()
    const rows = (await db.query<{ seq: number; type: string; v: number; session_id: string }>(
      'SELECT session_id, seq, type, v FROM agent_logs_events ORDER BY seq')).rows
    assert.deepEqual(rows, [{ session_id: 'tables', seq: 0, type: 'session/start', v: 1 }, { session_id: 'tables', seq: 1, type: 'user/message', v: 1 }])
    const pk = (await db.query<{ def: string }>(`SELECT pg_get_constraintdef(oid) AS def FROM pg_constraint WHERE conrelid = 'agent_logs_events'::regclass AND contype = 'p'`)).rows
    assert.deepEqual(pk, [{ def: 'PRIMARY KEY (session_id, seq)' }])
    const lease = (await db.query('SELECT session_id, token FROM agent_logs_leases')).rows
    assert.deepEqual(lease, [{ session_id: 'tables', token: 1 }])
    await store.close()
    assert.throws(() => new SqlLogStore({ query, session: 's', tablePrefix: 'x; DROP TABLE y' }), /tablePrefix "x; DROP TABLE y" must match/)
    assert.throws(() => new SqlLogStore({ query, session: '' }), /session must be a non-empty string/)
    assert.throws(() => new SqlLogStore({ query, session: 's', leaseMs: 0 }), /leaseMs must be an integer ≥ 1 ms, got 0/)
    assert.equal(new SqlLogStore({ query, session: 's' }).leaseMs, 300_000, 'the default lease: 5 min')
  })

  test('a step waits for the WAL once: flushes commit with synchronous_commit off (that transaction only), the batch that ends the step waits, its sync sends nothing', async () => {
    const statements: string[] = []
    const store = new SqlLogStore({ query: (sql, params) => { statements.push(sql); return query(sql, params) }, session: 'durable' })
    const session = await Session.open(store)
    const async = "set_config('synchronous_commit', 'off', true)"
    const kind = (sql: string) => (/INSERT INTO dsh_events/.test(sql) ? (sql.includes(async) ? 'append' : 'append, waits') : /^UPDATE dsh_leases SET expires_ms = \(/.test(sql) ? 'sync' : sql.slice(0, 30))
    assert.deepEqual(statements.map(kind).filter((k) => k.startsWith('append') || k === 'sync'), ['append, waits'], 'the open: session/start waits, its sync sends nothing')
    statements.length = 0
    session.append('turn/start', { turn: 1 })
    session.append('user/message', user('before the request'))
    session.append('step/start', { turn: 1, step: 1 })
    await stateOf(session).flush()
    session.append('user/message', user('before a tool'))
    await stateOf(session).flush()
    session.append('step/end', { turn: 1, step: 1 })
    await session.sync()
    assert.deepEqual(statements.map(kind), ['append', 'append', 'append, waits'], 'two round trips and one fsync for the step')
    assert.equal((await db.query<{ synchronous_commit: string }>('SHOW synchronous_commit')).rows[0].synchronous_commit, 'on', 'the setting ends with its transaction: a pooled connection keeps the default')
    // A sync after flushes that end nothing (a tool's flush, then a sync elsewhere) is one durable statement.
    statements.length = 0
    session.append('user/message', user('no boundary'))
    await session.sync()
    assert.deepEqual(statements.map(kind), ['append', 'sync'])
    statements.length = 0
    await session.sync()
    assert.deepEqual(statements, [], 'nothing written since the last durable commit: no statement')
    await store.close()
  })

  test('a database that lost events not yet synced gets no gap: the next append is refused naming the missing seq, nothing written', async () => {
    const store = new SqlLogStore({ query, session: 'lost' })
    const session = await Session.open(store)
    for (const text of ['a', 'b', 'c']) session.append('user/message', user(text))
    await session.sync()
    await db.query(`DELETE FROM dsh_events WHERE session_id = 'lost' AND seq = 3`) // as a crash before the fsync would
    session.append('user/message', user('d'))
    await assert.rejects(session.sync(), (e: SessionError) => e.code === 'STORE'
      && /seq 3 of session "lost" is not in the database, so seq 4\.\. would leave a gap: .*nothing of this batch was written; open the session again/.test(e.message))
    const seqs = (await db.query<{ seq: number }>(`SELECT seq FROM dsh_events WHERE session_id = 'lost' ORDER BY seq`)).rows.map((r) => Number(r.seq))
    assert.deepEqual(seqs, [0, 1, 2])
    await store.close()
    assert.deepEqual(await userTexts('lost'), ['a', 'b'], 'reopened, the session resumes at its last stored event')
  })

  test('a close that fails (the database away) keeps the lease and can be retried; the next worker then opens at once', async () => {
    let down = false
    const store = new SqlLogStore({ query: (sql, params) => (down ? Promise.reject(new Error('read ECONNRESET')) : query(sql, params)), session: 'close-retry', owner: 'w1' })
    await Session.open(store)
    down = true
    await assert.rejects(store.close(), (e: SessionError) => e.code === 'STORE' && /giving the lease back of session "close-retry" failed: read ECONNRESET/.test(e.message))
    assert.equal(store.token, 1, 'the lease is still held')
    down = false
    await store.close()
    assert.equal(store.token, undefined)
    const next = new SqlLogStore({ query, session: 'close-retry', owner: 'w2' })
    await Session.open(next)
    assert.equal(next.token, 2)
    await next.close()
  })

  test('an append before any load is refused: the lease is taken by load', async () => {
    const store = new SqlLogStore({ query, session: 'no-load' })
    await assert.rejects(store.append([{ seq: 0, type: 'x', time: 0, data: {} }]), /append refused: the store holds no lease: load\(\) or scan\(\) it first/)
  })
})

before(async () => { await db.waitReady })

test('a driver that answers without rows is a STORE error that says so, not a TypeError', async () => {
  for (const answer of [{}, null, { rows: 'x' }]) {
    const store = new SqlLogStore({ query: async () => answer as any, session: 'no-rows' })
    await assert.rejects(Session.open(store), (err: any) => err instanceof SessionError && err.code === 'STORE'
      && /the driver answered without rows/.test(err.message), JSON.stringify(answer))
  }
})

test('an event type holding NUL or a lone surrogate is stored (the type column gets U+FFFD; the event keeps its type), and later events too', async () => {
  const s = await Session.open(new SqlLogStore({ query, session: 'odd-types' }))
  s.append('x/\0nul', { n: 1 })
  s.append('x/\uD800lone', { n: 2 })
  // What happened: "appending 2 event(s) … failed: unsupported Unicode escape sequence; … (retry when the database
  // answers)": no retry could help, and every later flush of the session failed on the same events.
  await s.sync()
  s.append('turn/start', { turn: 1 })
  await s.sync()
  await s.store.close?.()
  const again = await Session.open(new SqlLogStore({ query, session: 'odd-types' }), { readOnly: true })
  assert.deepEqual([(await again.readEvent(1)).type, (await again.readEvent(2)).type, (await again.readEvent(3)).type], ['x/\0nul', 'x/\uD800lone', 'turn/start'])
  const rows = (await db.query<{ type: string }>(`SELECT type FROM dsh_events WHERE session_id = 'odd-types' ORDER BY seq`)).rows
  assert.deepEqual(rows.map((r) => r.type), ['session/start', 'x/\uFFFDnul', 'x/\uFFFDlone', 'turn/start'])
})
