// Runs the CLI as a child process (`node --import tsx dsh.ts …`) for tests that drive it end to
// end against test/fake-provider.ts.
import { after } from 'node:test'
import { spawn, type ChildProcess } from 'node:child_process'
import { mkdtemp, realpath, rm } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { CLEAN_ENV, DSH, TSX } from './cli-helpers.ts'

// One set of paths, one test home and one clean environment for every CLI test (test/cli-helpers.ts).
export { CLEAN_ENV, DSH, ROOT, TEST_HOME, TSX } from './cli-helpers.ts'

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
