// Runs the CLI as a child process (`node --import tsx dsh.ts …`) for tests that drive it end to
// end against test/fake-provider.ts.
import { after } from 'node:test'
import { spawn, type ChildProcess } from 'node:child_process'
import { mkdtempSync, rmSync } from 'node:fs'
import { mkdtemp, realpath, rm } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'

export const ROOT = fileURLToPath(new URL('..', import.meta.url))
export const DSH = join(ROOT, 'dsh.ts')
/** tsx by absolute URL: the children run in temp folders, where a bare `--import tsx` resolves nothing. */
export const TSX = import.meta.resolve('tsx')

/** The children's user configuration and kept sessions: a temp directory of this test file (removed after it), never the host's. */
export const TEST_HOME = mkdtempSync(join(tmpdir(), 'dsh-home-'))
after(() => rmSync(TEST_HOME, { recursive: true, force: true }))
/** The parent's environment without the variables dsh reads, so the host's settings cannot leak in; the user configuration and state in TEST_HOME. */
export const CLEAN_ENV: Record<string, string> = { XDG_CONFIG_HOME: join(TEST_HOME, 'config'), XDG_STATE_HOME: join(TEST_HOME, 'state'), ...Object.fromEntries(Object.entries(process.env).filter(
  (entry): entry is [string, string] => entry[1] !== undefined && !['DEEPSEEK_API_KEY', 'DSH_BASE_URL', 'DSH_MODEL', 'DSH_CONTEXT_WINDOW', 'NO_COLOR', 'NODE_TEST_CONTEXT', 'NODE_OPTIONS', 'XDG_CONFIG_HOME', 'XDG_STATE_HOME'].includes(entry[0]))) }

export interface Run { code: number | null; signal: NodeJS.Signals | null; stdout: string; stderr: string; ms: number }

/** Starts dsh with `args` in `cwd`; `onStart` sees the child (to send it signals). */
export function runDsh(args: string[], cwd: string, env: Record<string, string> = CLEAN_ENV, onStart?: (child: ChildProcess) => void, guardMs = 30_000): Promise<Run> {
  return new Promise((resolve, reject) => {
    const started = Date.now()
    const child = spawn(process.execPath, ['--import', TSX, DSH, ...args], { cwd, env, stdio: ['ignore', 'pipe', 'pipe'] })
    let stdout = '', stderr = ''
    child.stdout!.setEncoding('utf8').on('data', (t: string) => { stdout += t })
    child.stderr!.setEncoding('utf8').on('data', (t: string) => { stderr += t })
    const guard = setTimeout(() => child.kill('SIGKILL'), guardMs) // a hung child fails the test instead of the suite
    child.on('error', reject)
    child.on('close', (code, signal) => { clearTimeout(guard); resolve({ code, signal, stdout, stderr, ms: Date.now() - started }) })
    onStart?.(child)
  })
}

/** A maker of fresh temp directories (realpath'd, named `prefix…`), all removed after the file's tests. */
export function tempDirs(prefix: string): () => Promise<string> {
  const made: string[] = []
  after(async () => { for (const dir of made) await rm(dir, { recursive: true, force: true }) })
  return async () => {
    const dir = await realpath(await mkdtemp(join(tmpdir(), prefix)))
    made.push(dir)
    return dir
  }
}
