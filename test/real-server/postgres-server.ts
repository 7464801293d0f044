// A throwaway PostgreSQL 15 server for test/real-server/postgres.test.ts: Debian's binaries
// (/usr/lib/postgresql/15/bin, or $DSH_PG_BIN), `initdb` into a temporary directory, `postgres` on a
// free loopback port with its socket in that directory, stopped (and restarted) by its PID. initdb and
// postgres refuse to run as root: as root they run as the `postgres` user (runuser).
import { spawn, spawnSync, type ChildProcess } from 'node:child_process'
import { chownSync, existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import pg from 'pg'
import { freePort, skipVisibly } from './server.ts'

export const PG_BIN = process.env.DSH_PG_BIN ?? '/usr/lib/postgresql/15/bin'
const START_TIMEOUT_MS = 30_000

/** `false` when the binaries are there; else a visible skip message (a thrown error under CI). */
export function skipWithoutPostgres(): false | string {
  if (existsSync(join(PG_BIN, 'postgres')) && existsSync(join(PG_BIN, 'initdb'))) return false
  return skipVisibly(`PostgreSQL tests: no ${join(PG_BIN, 'postgres')} (apt-get install postgresql-15, or set DSH_PG_BIN)`)
}

const asRoot = process.getuid?.() === 0
/** The command line that runs `bin` as the postgres user when this process is root. */
const asPostgres = (bin: string, args: string[]): [string, string[]] =>
  asRoot ? ['runuser', ['-u', 'postgres', '--', join(PG_BIN, bin), ...args]] : [join(PG_BIN, bin), args]

export interface PostgresServer {
  port: number
  /** Connection settings for `new pg.Pool(...)`. */
  config: pg.PoolConfig
  /** The postmaster's PID (changes on restart). */
  pid(): number
  /** Fast shutdown (SIGINT to the postmaster), waits for it to exit. */
  stop(): Promise<void>
  /** Starts it again on the same port and data. */
  start(): Promise<void>
  /** Stops it and removes its directory. */
  destroy(): Promise<void>
}

export async function startPostgres(): Promise<PostgresServer> {
  const dir = mkdtempSync(join(tmpdir(), 'dsh-pg-'))
  if (asRoot) {
    const ids = spawnSync('id', ['-u', 'postgres'], { encoding: 'utf8' }).stdout.trim()
    const gid = spawnSync('id', ['-g', 'postgres'], { encoding: 'utf8' }).stdout.trim()
    chownSync(dir, Number(ids), Number(gid))
  }
  const data = join(dir, 'data')
  const [cmd, args] = asPostgres('initdb', ['-D', data, '-A', 'trust', '-U', 'postgres', '--no-sync', '-E', 'UTF8'])
  const init = spawnSync(cmd, args, { encoding: 'utf8' })
  if (init.status !== 0) throw new Error(`initdb failed (${init.status}): ${init.stdout}${init.stderr}`)
  const port = await freePort()
  let child: ChildProcess | undefined
  let postmaster = 0
  let log = ''
  const config: pg.PoolConfig = { host: '127.0.0.1', port, user: 'postgres', database: 'postgres' }

  const start = async () => {
    const [c, a] = asPostgres('postgres', ['-D', data, '-p', String(port), '-k', dir, '-c', 'listen_addresses=127.0.0.1',
      '-c', 'max_connections=200'])
    child = spawn(c, a, { stdio: ['ignore', 'pipe', 'pipe'] })
    child.stdout!.on('data', (d) => { log += d })
    child.stderr!.on('data', (d) => { log += d })
    const deadline = Date.now() + START_TIMEOUT_MS
    for (;;) {
      if (child.exitCode !== null) throw new Error(`postgres exited ${child.exitCode}:\n${log}`)
      const client = new pg.Client(config)
      try { await client.connect(); await client.query('SELECT 1'); await client.end(); break } catch {
        await client.end().catch(() => {})
        if (Date.now() > deadline) throw new Error(`postgres did not answer within ${START_TIMEOUT_MS} ms:\n${log}`)
        await new Promise((r) => setTimeout(r, 100))
      }
    }
    postmaster = Number(readFileSync(join(data, 'postmaster.pid'), 'utf8').split('\n')[0])
  }
  const stop = async () => {
    if (!child || child.exitCode !== null) return
    const exited = new Promise((r) => child!.once('exit', r))
    try { process.kill(postmaster, 'SIGINT') } catch { /* gone */ }
    await exited
  }
  await start()
  return {
    port, config, pid: () => postmaster, stop, start,
    destroy: async () => { await stop(); rmSync(dir, { recursive: true, force: true }) },
  }
}
