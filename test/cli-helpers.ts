// Shared helpers of the CLI tests: dsh as a child process (`node --import tsx dsh.ts …`) in temp
// working directories, against test/fake-provider.ts, and under a pseudo-terminal (util-linux `script`).
import { after } from 'node:test'
import { spawn, spawnSync } from 'node:child_process'
import { mkdtempSync, rmSync } from 'node:fs'
import { mkdtemp, readFile, realpath, rm } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { startFakeProvider, type FakeProvider, type FakeReply } from './fake-provider.ts'

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

export interface Run { code: number | null; stdout: string; stderr: string }

/**
 * Runs `command …args` in `cwd` to its end. `input`: a string written to stdin at once, or a list of
 * `[delayMs, text]` written one after another (stdin stays open until the last); absent: /dev/null.
 */
export function runProcess(command: string, args: string[], cwd: string, env: Record<string, string>, input?: string | [number, string][]): Promise<Run> {
  return new Promise((resolve, reject) => {
    const child = spawn(command, args, { cwd, env, stdio: [input === undefined ? 'ignore' : 'pipe', 'pipe', 'pipe'] })
    let stdout = '', stderr = ''
    child.stdout!.setEncoding('utf8').on('data', (t: string) => { stdout += t })
    child.stderr!.setEncoding('utf8').on('data', (t: string) => { stderr += t })
    if (typeof input === 'string') child.stdin!.end(input)
    else if (input) {
      void (async () => {
        for (const [delayMs, text] of input) { await new Promise((r) => setTimeout(r, delayMs)); if (!child.stdin!.destroyed) child.stdin!.write(text) }
      })()
    }
    const guard = setTimeout(() => child.kill('SIGKILL'), 30_000) // a hung child fails the test instead of the suite
    child.on('error', reject)
    child.on('close', (code) => { clearTimeout(guard); child.stdin?.destroy(); resolve({ code, stdout, stderr }) })
  })
}
export const dsh = (args: string[], cwd: string, env: Record<string, string> = CLEAN_ENV, input?: string): Promise<Run> =>
  runProcess(process.execPath, ['--import', TSX, DSH, ...args], cwd, env, input)

const quote = (s: string) => `'${s.replaceAll("'", `'\\''`)}'`
/** A shell command line that runs dsh with `args`. */
export const dshCommand = (args: string[]): string => [process.execPath, '--import', TSX, DSH, ...args].map(quote).join(' ')

const probe = spawnSync('script', ['--version'], { encoding: 'utf8' })
/** `false`, or why the PTY tests are skipped. */
export const skipWithoutPty: false | string = probe.status === 0 && /util-linux/.test(probe.stdout) ? false : 'SKIPPED: `script` from util-linux is not available to give dsh a pseudo-terminal'
if (skipWithoutPty) console.log(`# ${skipWithoutPty}`)

/** Runs dsh under a pseudo-terminal (stdin, stdout and stderr all on it); the output has `\r` removed. */
export async function dshPty(args: string[], cwd: string, env: Record<string, string>, input: string | [number, string][]): Promise<Run> {
  const run = await runProcess('script', ['-qec', dshCommand(args), '/dev/null'], cwd, { NO_COLOR: '1', TERM: 'dumb', ...env }, input)
  return { ...run, stdout: run.stdout.replaceAll('\r', '') }
}

/**
 * Drives dsh under a pseudo-terminal like a user: for each step, waits until the output (after
 * where the previous step's wait matched) contains `waitFor`, then types `send`. Resolves when dsh
 * exits (killed after 30 s); the output has `\r` removed.
 */
export function dshPtyDriven(args: string[], cwd: string, env: Record<string, string>, steps: { waitFor: string | RegExp; send: string }[]): Promise<Run> {
  return new Promise((resolve, reject) => {
    const child = spawn('script', ['-qec', dshCommand(args), '/dev/null'], { cwd, env: { NO_COLOR: '1', TERM: 'dumb', ...env }, stdio: ['pipe', 'pipe', 'pipe'] })
    let stdout = '', stderr = '', from = 0, next = 0
    const advance = () => {
      while (next < steps.length) {
        const { waitFor } = steps[next]
        const found = typeof waitFor === 'string' ? { at: stdout.indexOf(waitFor, from), length: waitFor.length }
          : ((m) => ({ at: m ? from + m.index : -1, length: m ? m[0].length : 0 }))(waitFor.exec(stdout.slice(from)))
        if (found.at === -1) return
        from = found.at + found.length
        child.stdin!.write(steps[next++].send)
      }
    }
    child.stdout!.setEncoding('utf8').on('data', (t: string) => { stdout += t.replaceAll('\r', ''); advance() })
    child.stderr!.setEncoding('utf8').on('data', (t: string) => { stderr += t })
    const guard = setTimeout(() => child.kill('SIGKILL'), 30_000)
    child.on('error', reject)
    child.on('close', (code) => { clearTimeout(guard); child.stdin?.destroy(); resolve({ code, stdout, stderr }) })
  })
}

export const lines = (text: string): string[] => text.split('\n').filter((l) => l !== '')
export const readLog = async (file: string): Promise<any[]> => lines(await readFile(file, 'utf8')).map((l) => JSON.parse(l))

const temps: string[] = []
const fakes: FakeProvider[] = []
after(async () => {
  for (const f of fakes) await f.close()
  for (const dir of temps) await rm(dir, { recursive: true, force: true })
})
export async function tempDir(): Promise<string> {
  const dir = await realpath(await mkdtemp(join(tmpdir(), 'dsh-cli-')))
  temps.push(dir)
  return dir
}
/** A fake provider, closed after the test file. */
export async function fake(script: FakeReply[] | ((request: any, index: number) => FakeReply)): Promise<FakeProvider> {
  const f = await startFakeProvider(typeof script === 'function' ? { handler: script } : { script })
  fakes.push(f)
  return f
}
export const runFlags = (f: FakeProvider, window = 16000) => ['--base-url', f.url, '--model', 'm', '--context-window', String(window)]
