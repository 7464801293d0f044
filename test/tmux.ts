// dsh in a real terminal emulator for the CLI tests: a private tmux server on its own socket, keys
// typed with `send-keys`, the screen read with `capture-pane` (one copy for every tmux test).
import { after } from 'node:test'
import { execFile, spawnSync } from 'node:child_process'
import { readFile } from 'node:fs/promises'
import { join } from 'node:path'
import { CLEAN_ENV, tempDir } from './cli-helpers.ts'

const probe = spawnSync('tmux', ['-V'], { encoding: 'utf8' })
/** false, or why the tmux tests are skipped (printed once per test file). */
export const skipWithoutTmux: false | string = probe.status === 0 ? false
  : 'SKIPPED: tmux is not installed (apt-get install -y tmux; .ci/run installs it)'
if (skipWithoutTmux) console.log(`# ${skipWithoutTmux}`)

let socket: string | undefined
after(async () => { if (socket) await tmux('kill-server').catch(() => {}) })

/** Runs `tmux ARGS…` against this file's server (started by {@link startTmux}); resolves its stdout. */
export const tmux = (...args: string[]): Promise<string> => new Promise((resolve, reject) => {
  execFile('tmux', ['-S', socket!, ...args], { env: { ...CLEAN_ENV, TERM: 'xterm-256color' } }, (err, stdout) => (err ? reject(err) : resolve(stdout)))
})
/** A fresh socket for this file's tmux server; the server is killed after the file's tests. */
export async function startTmux(): Promise<void> { socket = join(await tempDir(), 'tmux.sock') }

/** Text without its colour escapes. */
export const plain = (text: string): string => text.replace(/\x1b\[[0-9;]*m/g, '')
/** The pane's text, its history included; with `escapes`, colours kept (`-e`). */
export const screen = (escapes = false): Promise<string> => tmux('capture-pane', '-p', ...(escapes ? ['-e'] : []), '-J', '-S', '-2000', '-t', 'dsh')

/** Waits until the screen (escapes aside) shows `text` at least `count` times; returns the screen (with escapes when asked). */
export async function waitFor(text: string, count = 1, timeoutMs = 20_000, escapes = false): Promise<string> {
  const started = Date.now()
  for (;;) {
    const shown = await screen(escapes)
    if (plain(shown).split(text).length > count) return shown
    if (Date.now() - started > timeoutMs) throw new Error(`the screen never showed ${JSON.stringify(text)} (${count}×):\n${plain(shown)}`)
    await new Promise((r) => setTimeout(r, 100))
  }
}
/** Types `keys` and Enter. */
export const type = async (keys: string): Promise<void> => { await tmux('send-keys', '-t', 'dsh', '-l', keys); await tmux('send-keys', '-t', 'dsh', 'Enter') }

/** The exit code a command wrote to `file` (`…; echo $? > file`), waiting up to 20 s for it. */
export async function exitCodeFrom(file: string): Promise<string | undefined> {
  const started = Date.now()
  let code: string | undefined
  while (code === undefined && Date.now() - started < 20_000) {
    code = await readFile(file, 'utf8').catch(() => undefined)
    if (code === undefined) await new Promise((r) => setTimeout(r, 100))
  }
  return code?.trim()
}
