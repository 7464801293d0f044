// The CLI in a real terminal emulator (issue 27, items 1–3): dsh runs inside tmux (a private
// server on its own socket), keys are typed with `send-keys` and the screen is read with
// `capture-pane`, as a user would see it: an approval with its coloured diff, then /undo.
import { test, after } from 'node:test'
import assert from 'node:assert/strict'
import { execFile, spawnSync } from 'node:child_process'
import { readFile, writeFile } from 'node:fs/promises'
import { join } from 'node:path'
import { CLEAN_ENV, dshCommand, fake, runFlags, tempDir } from './cli-helpers.ts'

const probe = spawnSync('tmux', ['-V'], { encoding: 'utf8' })
const skip = probe.status === 0 ? false : 'SKIPPED: tmux is not installed (apt-get install -y tmux; .ci/run installs it)'
if (skip) console.log(`# ${skip}`)

let socket: string | undefined
const tmux = (...args: string[]): Promise<string> => new Promise((resolve, reject) => {
  execFile('tmux', ['-S', socket!, ...args], { env: { ...CLEAN_ENV, TERM: 'xterm-256color' } }, (err, stdout) => (err ? reject(err) : resolve(stdout)))
})
after(async () => { if (socket) await tmux('kill-server').catch(() => {}) })

/** The pane's text with its escapes (`-e`: colours), its history included. */
const screen = () => tmux('capture-pane', '-p', '-e', '-J', '-S', '-2000', '-t', 'dsh')
const plain = (text: string) => text.replace(/\x1b\[[0-9;]*m/g, '')

/** Waits until the screen (escapes aside) shows `text` at least `count` times; returns the screen with its escapes. */
async function waitFor(text: string, count = 1, timeoutMs = 20_000): Promise<string> {
  const started = Date.now()
  for (;;) {
    const shown = await screen()
    if (plain(shown).split(text).length > count) return shown
    if (Date.now() - started > timeoutMs) throw new Error(`the screen never showed ${JSON.stringify(text)} (${count}×):\n${plain(shown)}`)
    await new Promise((r) => setTimeout(r, 100))
  }
}
const type = async (keys: string) => { await tmux('send-keys', '-t', 'dsh', '-l', keys); await tmux('send-keys', '-t', 'dsh', 'Enter') }

test('in tmux: an edit and a new file, each shown as a coloured diff and approved; /undo puts both back', { skip }, async () => {
  const cwd = await tempDir()
  socket = join(await tempDir(), 'tmux.sock')
  await writeFile(join(cwd, 'a.txt'), 'first line\nsecond line\n')
  const f = await fake([
    { toolCalls: [{ name: 'edit_file', arguments: { path: 'a.txt', old_string: 'second line', new_string: 'SECOND LINE' } }, { name: 'write_file', arguments: { path: 'b.txt', content: 'a new file\n' } }] },
    { text: 'Edited a.txt and created b.txt.' },
  ])
  const exitFile = join(await tempDir(), 'exit-code')
  const command = `cd '${cwd}' && ${dshCommand([...runFlags(f), '--no-shell'])}; echo $? > '${exitFile}'`
  await tmux('new-session', '-d', '-s', 'dsh', '-x', '120', '-y', '40', command)
  await waitFor('› ')
  await type('change a.txt and add b.txt')
  const asked = await waitFor('Apply this change to a.txt? [y]es / [n]o / [a]lways for edit_file:')
  assert.ok(asked.includes('\x1b[31m-second line'), `the removed line in red:\n${asked}`)
  assert.ok(asked.includes('\x1b[32m+SECOND LINE'), 'the added line in green')
  assert.ok(plain(asked).includes('--- a/a.txt\n+++ b/a.txt\n@@ -1,2 +1,2 @@\n first line\n-second line\n+SECOND LINE\n'))
  await type('y')
  await waitFor('Apply this change to b.txt?')
  await type('y')
  await waitFor('Edited a.txt and created b.txt.')
  assert.equal(await readFile(join(cwd, 'a.txt'), 'utf8'), 'first line\nSECOND LINE\n')
  await waitFor('› ', 2)
  await type('/undo')
  const undone = plain(await waitFor('[dsh] /undo, turn 1: '))
  assert.match(undone, /\[dsh\] \/undo, turn 1: restored a\.txt; removed b\.txt \(created in that turn\); the model is told with your next input/)
  assert.equal(await readFile(join(cwd, 'a.txt'), 'utf8'), 'first line\nsecond line\n')
  await assert.rejects(readFile(join(cwd, 'b.txt')), { code: 'ENOENT' })
  await type('/exit')
  const started = Date.now()
  let code: string | undefined
  while (code === undefined && Date.now() - started < 20_000) {
    code = await readFile(exitFile, 'utf8').catch(() => undefined)
    if (code === undefined) await new Promise((r) => setTimeout(r, 100))
  }
  assert.equal(code?.trim(), '0')
})
