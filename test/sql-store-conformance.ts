// The LogStore conformance suite over SqlLogStore, one call for each database it runs on:
// PGlite in test/sql-store.test.ts (npm test), PostgreSQL 15 in test/real-server/postgres.test.ts.
import assert from 'node:assert/strict'
import { SessionError, SqlLogStore, type SessionEvent, type SqlQuery } from '../dsh.ts'
import { testLogStore } from '../conformance.ts'

/**
 * Registers the suite for SqlLogStore on `query`. Its torn write: the commit happens and the answer is
 * lost with the connection (`lostAnswer`, the driver's message), so the writer never hears of it.
 */
export function testSqlLogStore(name: string, query: SqlQuery, lostAnswer: string): void {
  testLogStore(name, (key) => new SqlLogStore({ query, session: key }), {
    secondWriter: 'refused',
    tear: async (key: string, events: readonly SessionEvent[]) => {
      const store = new SqlLogStore({ query: async (sql, params) => {
        const result = await query(sql, params)
        if (sql.includes('INSERT INTO dsh_events')) throw new Error(lostAnswer)
        return result
      }, session: key })
      await store.load()
      await assert.rejects(store.append(events), (err: SessionError) => err.code === 'STORE' && err.message.includes(lostAnswer))
      await store.close()
    },
  })
}
