// The README's CLI session is a capture, not typed by hand (issue 27, "Done when"): this test runs
// the same session in tmux against test/fake-provider.ts playing the model and compares the
// screen with the README's block (paths shortened the way the README shows them). When the CLI's
// output changes on purpose, paste the screen this test prints into README.md.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { mkdir, readFile, writeFile } from 'node:fs/promises'
import { join } from 'node:path'
import { CLEAN_ENV, ROOT, TEST_HOME, dshCommand, fake, tempDir } from './cli-helpers.ts'
import { screen, skipWithoutTmux, startTmux, tmux, type, waitFor } from './tmux.ts'

const skip = skipWithoutTmux

const DATE_TS = 'export function isLeapYear(year: number): boolean {\n  return year % 4 === 0\n}\n'
const FIXED = '  return year % 4 === 0 && (year % 100 !== 0 || year % 400 === 0)'
const TEST_TS = "import assert from 'node:assert/strict'\nimport { isLeapYear } from '../src/date.ts'\n\nassert.equal(isLeapYear(2024), true)\nassert.equal(isLeapYear(1900), false)\nassert.equal(isLeapYear(2000), true)\n"

/** The README block that follows the session's introduction: its `$` lines, then the screen. */
function readmeSession(readme: string): { commands: string[]; screen: string } {
  const at = readme.indexOf('A real session, against test/fake-provider.ts playing the')
  assert.ok(at > 0, 'the README introduces the session')
  const block = /```\n([^]*?)```/.exec(readme.slice(at))![1]
  const lines = block.split('\n')
  const first = lines.findIndex((l) => l.startsWith('dsh '))
  return { commands: lines.slice(0, first), screen: lines.slice(first).join('\n') }
}

test('README: the CLI session with approvals, diffs and /undo is what dsh shows in a terminal', { skip }, async () => {
  // The system prompt names the working directory: a path of one length gives the README's token figures everywhere.
  const base = await tempDir()
  const project = join(base, 'p'.repeat(Math.max(1, 48 - base.length)), 'my-project')
  await mkdir(join(project, 'src'), { recursive: true })
  await writeFile(join(project, 'src', 'date.ts'), DATE_TS)
  await startTmux()
  const f = await fake((request, i) => {
    const last = request.body.messages.at(-1)
    if (last.role === 'user' && last.content.includes('why?')) return { text: 'Understood: both changes are undone, src/date.ts is back as it was.' }
    return [
      { toolCalls: [{ name: 'read_file', arguments: { path: 'src/date.ts' } }] },
      { toolCalls: [{ name: 'edit_file', arguments: { path: 'src/date.ts', old_string: '  return year % 4 === 0', new_string: FIXED } }] },
      { toolCalls: [{ name: 'write_file', arguments: { path: 'test/date.test.ts', content: TEST_TS } }] },
      { text: 'isLeapYear now excludes centuries unless divisible by 400 (1900 is not a leap year, 2000 is); test/date.test.ts checks 2024, 1900 and 2000.' },
    ][Math.min(i, 3)]
  })
  const home = join(TEST_HOME, 'readme')
  const env = { ...CLEAN_ENV, XDG_CONFIG_HOME: join(home, 'config'), XDG_STATE_HOME: join(home, 'state') }
  await mkdir(join(env.XDG_CONFIG_HOME, 'dsh'), { recursive: true })
  const config = { baseURL: f.url, model: 'qwen3-coder', contextWindow: 32768 }
  await writeFile(join(env.XDG_CONFIG_HOME, 'dsh', 'config.json'), JSON.stringify(config))
  const exports = Object.entries(env).map(([k, v]) => `${k}='${v.replaceAll("'", `'\\''`)}'`).join(' ')
  await tmux('new-session', '-d', '-s', 'dsh', '-x', '140', '-y', '60', `cd '${project}' && env -i ${exports} ${dshCommand(['--no-shell'])}`)
  await waitFor('› ')
  await type('isLeapYear is wrong for 1900; fix it and add a test')
  await waitFor('Apply this change to src/date.ts?')
  await type('y')
  await waitFor('Apply this change to test/date.test.ts?')
  await type('a')
  await waitFor('› ', 2)
  await type('/undo')
  await waitFor('the model is told with your next input')
  await type('why?')
  await waitFor('src/date.ts is back as it was.')
  await waitFor('› ', 4)
  assert.equal(await readFile(join(project, 'src', 'date.ts'), 'utf8'), DATE_TS, '/undo put the file back')
  const shown = (await screen()).replace(/\s+$/, '\n').replaceAll(join(env.XDG_CONFIG_HOME, 'dsh', 'config.json'), '~/.config/dsh/config.json').replace(/›\n$/, '')
  await type('/exit')
  const readme = readmeSession(await readFile(join(ROOT, 'README.md'), 'utf8'))
  assert.equal(readme.screen, shown, `the README's session differs from the screen; paste this screen into README.md:\n${shown}`)
  assert.deepEqual(readme.commands, [
    '$ cat ~/.config/dsh/config.json',
    JSON.stringify({ ...config, baseURL: 'http://127.0.0.1:8080/v1' }, null, 1).replace(/\n\s*/g, ' '),
    '$ cd my-project && npx tsx ../dsh.ts/dsh.ts --no-shell',
  ])
})
