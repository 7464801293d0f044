// The CLI in a real terminal emulator (issue 27, items 1–3): dsh runs inside tmux (a private
// server on its own socket), keys are typed with `send-keys` and the screen is read with
// `capture-pane`, as a user would see it: an approval with its coloured diff, then /undo.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { readFile, writeFile } from 'node:fs/promises'
import { join } from 'node:path'
import { dshCommand, fake, runFlags, tempDir } from './cli-helpers.ts'
import { exitCodeFrom, plain, skipWithoutTmux, startTmux, tmux, type, waitFor as waitForText } from './tmux.ts'

const skip = skipWithoutTmux
/** The screen with its colour escapes: the diff's colours are what this file checks. */
const waitFor = (text: string, count = 1, timeoutMs = 20_000) => waitForText(text, count, timeoutMs, true)

test('in tmux: an edit and a new file, each shown as a coloured diff and approved; /undo puts both back', { skip }, async () => {
  const cwd = await tempDir()
  await startTmux()
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
  assert.equal(await exitCodeFrom(exitFile), '0')
})

// Issue 27 item 7: what a terminal must show while a turn runs and at the prompt.
test('in tmux: a spinner names the running tool with its elapsed time; input typed meanwhile is shown apart and runs after the turn; Ctrl-C clears a half-typed line, a second exits', { skip }, async () => {
  const cwd = await tempDir()
  await startTmux()
  const f = await fake((request) => {
    const last = request.body.messages.at(-1)
    if (last.role === 'tool') return { text: 'Slept well.' }
    if (last.content === 'take a nap') return { toolCalls: [{ name: 'shell', arguments: { command: 'sleep 3' } }] }
    return { text: `You said: ${last.content}` }
  })
  const exitFile = join(await tempDir(), 'exit-code')
  const command = `cd '${cwd}' && ${dshCommand([...runFlags(f), '--allow-shell', '--no-sandbox', '-y'])}; echo $? > '${exitFile}'`
  await tmux('new-session', '-d', '-s', 'dsh', '-x', '120', '-y', '40', command)
  await waitFor('› ')
  await type('take a nap')
  // The live line: a spinner frame, the tool and what it runs, the seconds so far.
  const spinning = plain(await waitFor('shell sleep 3 · 1.'))
  assert.match(spinning, /[⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏] shell sleep 3 · 1\.\d s/)
  // Typed during the turn: not echoed into the output, shown on the live line; entered: queued with a line of its own.
  await tmux('send-keys', '-t', 'dsh', '-l', 'and then')
  await waitFor('(typed ahead, runs after this turn: and then)')
  await tmux('send-keys', '-t', 'dsh', '-l', ' wake up')
  await tmux('send-keys', '-t', 'dsh', 'Enter')
  await waitFor('[dsh] queued, runs after this turn: and then wake up')
  const after = plain(await waitFor('You said: and then wake up'))
  assert.match(after, /▸ shell sleep 3 → exit 0 \(\d+ tokens\)\n[^]*Slept well\.\n[^]*› and then wake up\n[^]*You said: and then wake up/, after)
  assert.doesNotMatch(after, /Slept[^\n]*and then|and then[^\n]*Slept/, 'the typed text never lands in the answer')
  assert.deepEqual(f.requests.map((r) => r.body.messages.at(-1)).filter((m: any) => m.role === 'user').map((m: any) => m.content), ['take a nap', 'and then wake up'])
  // Ctrl-C at the prompt: a half-typed line is cleared (not sent); a second Ctrl-C exits.
  await waitFor('› ', 3)
  await tmux('send-keys', '-t', 'dsh', '-l', 'half a thought')
  await waitFor('› half a thought')
  await tmux('send-keys', '-t', 'dsh', 'C-c')
  const cleared = plain(await waitFor('[dsh] input cleared; Ctrl-C again exits'))
  assert.ok(cleared.trimEnd().endsWith('›'), `an empty prompt after the line:\n${cleared}`)
  await tmux('send-keys', '-t', 'dsh', 'C-c')
  assert.equal(await exitCodeFrom(exitFile), '0')
  assert.equal(f.requests.length, 3, 'the cleared line was never sent')
})
