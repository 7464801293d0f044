// Sessions kept by default (issue 27, item 4 and cases 3 and 5; docs/design.md §8): where they go,
// their modes, --continue, --resume, --no-save, the retention, /sessions, and what a resume shows.
import { test, describe } from 'node:test'
import assert from 'node:assert/strict'
import { mkdir, readdir, stat, utimes, writeFile } from 'node:fs/promises'
import { join } from 'node:path'
import { CLEAN_ENV, dsh, dshPtyDriven, fake, lines, readLog, runFlags, skipWithoutPty, tempDir } from './cli-helpers.ts'

/** A fresh state directory per test, so that each sees only its own sessions. */
async function stateEnv(): Promise<Record<string, string>> {
  return { ...CLEAN_ENV, XDG_STATE_HOME: await tempDir() }
}
/** The kept logs of every project under a state directory: `[project dir name, log file]`. */
async function keptLogs(env: Record<string, string>): Promise<[string, string][]> {
  const root = join(env.XDG_STATE_HOME, 'dsh', 'sessions')
  const out: [string, string][] = []
  for (const project of await readdir(root).catch(() => [] as string[])) {
    for (const name of await readdir(join(root, project))) if (name.endsWith('.jsonl')) out.push([project, join(root, project, name)])
  }
  return out
}

describe('case 3: dsh -p, then dsh --continue -p in the same directory', () => {
  test('the second request carries the first turn\'s messages; --resume lists the session', async () => {
    const cwd = await tempDir()
    const env = await stateEnv()
    const f = await fake([{ text: 'The first answer.' }, { text: 'The second answer.' }])
    const first = await dsh(['-p', 'the first question', ...runFlags(f)], cwd, env)
    assert.equal(first.code, 0, first.stderr)
    assert.equal(first.stderr, '', 'a new kept session says nothing')
    const second = await dsh(['--continue', '-p', 'the second question', ...runFlags(f)], cwd, env)
    assert.equal(second.code, 0, second.stderr)
    assert.deepEqual(f.requests[1].body.messages.slice(1).map((m: any) => [m.role, m.content]),
      [['user', 'the first question'], ['assistant', 'The first answer.'], ['user', 'the second question']])
    const logs = await keptLogs(env)
    assert.equal(logs.length, 1, 'one session, continued')
    assert.match(logs[0][0], new RegExp(`^${cwd.split('/').at(-1)}-[0-9a-f]{12}$`))
    assert.match(second.stderr, new RegExp(`^\\[dsh\\] resumed ${logs[0][1].replaceAll('.', '\\.')}: 1 turn, `))
    const listed = await dsh(['--resume', ...runFlags(f)], cwd, env)
    assert.equal(listed.code, 0, listed.stderr)
    const out = lines(listed.stdout)
    assert.equal(out[0], `kept sessions of ${cwd}, newest first:`)
    assert.match(out[1], /^ {2}1\. \d{4}-\d\d-\d\d \d\d:\d\d \(\d+ s ago\) · 2 turns · "the first question" … "The second answer\."$/)
    assert.equal(out[2], `     ${logs[0][1]}`)
    assert.equal(out.at(-1), 'resume one with: --session FILE')
    // Another directory has its own sessions: --continue there finds none.
    const elsewhere = await dsh(['--continue', '-p', 'x', ...runFlags(f)], await tempDir(), env)
    assert.equal(elsewhere.code, 2)
    assert.match(elsewhere.stderr, /^dsh: --continue: no kept session for .* yet; start one without it\n$/)
  })
})

describe('case 5: kept session files are 0600, their directories 0700', () => {
  test('the log, and the undo journal beside it', async () => {
    const cwd = await tempDir()
    const env = await stateEnv()
    await writeFile(join(cwd, 'a.txt'), 'one\n')
    const f = await fake([{ toolCalls: [{ name: 'edit_file', arguments: { path: 'a.txt', old_string: 'one', new_string: 'two' } }] }, { text: 'done' }])
    const run = await dsh(['-p', 'edit', ...runFlags(f)], cwd, env)
    assert.equal(run.code, 0, run.stderr)
    const [[, log]] = await keptLogs(env)
    const mode = async (p: string) => (await stat(p)).mode & 0o777
    assert.equal(await mode(log), 0o600)
    assert.equal(await mode(join(log, '..')), 0o700)
    assert.equal(await mode(join(env.XDG_STATE_HOME, 'dsh', 'sessions')), 0o700)
    assert.equal(await mode(`${log}.undo`), 0o700)
    for (const name of await readdir(`${log}.undo`)) assert.equal(await mode(join(`${log}.undo`, name)), 0o600, name)
    assert.deepEqual((await readdir(`${log}.undo`)).sort(), ['1.before', 'journal.jsonl'])
  })

  test('--no-save keeps nothing; --session FILE still keeps it where given', async () => {
    const cwd = await tempDir()
    const env = await stateEnv()
    const f = await fake([{ text: 'a' }, { text: 'b' }])
    assert.equal((await dsh(['-p', 'x', ...runFlags(f), '--no-save'], cwd, env)).code, 0)
    assert.equal((await dsh(['-p', 'x', ...runFlags(f), '--session', 'mine.jsonl'], cwd, env)).code, 0)
    assert.deepEqual(await keptLogs(env), [])
    assert.equal((await readLog(join(cwd, 'mine.jsonl')))[0].type, 'session/start')
  })

  test('sessions older than the retention (default 30 days) are removed at start, with everything beside them', async () => {
    const cwd = await tempDir()
    const env = await stateEnv()
    const f = await fake(() => ({ text: 'ok' }))
    assert.equal((await dsh(['-p', 'x', ...runFlags(f)], cwd, env)).code, 0)
    const [[project, log]] = await keptLogs(env)
    // Another project's session, 31 days old, with its undo journal; and one 29 days old.
    const other = join(env.XDG_STATE_HOME, 'dsh', 'sessions', 'other-000000000000')
    await mkdir(join(other, 'old.jsonl.undo'), { recursive: true })
    await writeFile(join(other, 'old.jsonl'), '')
    await writeFile(join(other, 'recent.jsonl'), '')
    const days = (n: number) => (Date.now() - n * 86_400_000) / 1000
    await utimes(join(other, 'old.jsonl'), days(31), days(31))
    await utimes(join(other, 'recent.jsonl'), days(29), days(29))
    await utimes(log, days(40), days(40))
    const run = await dsh(['-p', 'y', ...runFlags(f)], cwd, env)
    assert.equal(run.code, 0, run.stderr)
    assert.equal(lines(run.stderr)[0], '[dsh] removed 2 kept sessions older than 30 days ("retentionDays" in the user configuration)')
    assert.deepEqual((await readdir(other)).sort(), ['recent.jsonl'])
    assert.equal((await keptLogs(env)).filter(([p]) => p === project).length, 1, 'the old one went, the new one of this run stays')
    // retentionDays in the user configuration: 10 days removes the 29-day-old one too.
    const config = await tempDir()
    await mkdir(join(config, 'dsh'))
    await writeFile(join(config, 'dsh', 'config.json'), JSON.stringify({ retentionDays: 10 }))
    const again = await dsh(['-p', 'z', ...runFlags(f), '--no-save'], cwd, { ...env, XDG_CONFIG_HOME: config })
    assert.equal(lines(again.stderr)[0], '[dsh] removed 1 kept session older than 10 days ("retentionDays" in the user configuration)')
  })
})

describe('interactive: /sessions, --resume, and what a resume shows (under a pseudo-terminal)', () => {
  test('/sessions lists this directory\'s sessions and deletes one (not the running one)', { skip: skipWithoutPty }, async () => {
    const cwd = await tempDir()
    const env = await stateEnv()
    const f = await fake(() => ({ text: 'ok' }))
    assert.equal((await dsh(['-p', 'an older session', ...runFlags(f)], cwd, env)).code, 0)
    const [[, older]] = await keptLogs(env)
    const run = await dshPtyDriven([...runFlags(f), '--no-shell'], cwd, env, [
      { waitFor: '› ', send: '/sessions\r' }, { waitFor: '(this session)', send: '' },
      { waitFor: '› ', send: '/sessions delete 1\r' }, { waitFor: '[dsh] /sessions: that is this session', send: '' },
      { waitFor: '› ', send: '/sessions delete 2\r' }, { waitFor: '[dsh] deleted the session', send: '' },
      { waitFor: '› ', send: '/exit\r' },
    ])
    assert.equal(run.code, 0, run.stdout)
    assert.match(run.stdout, /newest first \(delete one: \/sessions delete N\):\n {2}1\. .* · 0 turns \(this session\)\n {5}\S+\n {2}2\. .* · 1 turn · "an older session" … "ok"\n/)
    assert.ok(run.stdout.includes(`[dsh] deleted the session of `) && run.stdout.includes(older), run.stdout)
    await assert.rejects(stat(older), { code: 'ENOENT' })
    assert.deepEqual(await keptLogs(env), [], 'and the running one, in which no turn ran, is not kept either')
  })

  test('--resume lists and picks; the resume prints the last two exchanges', { skip: skipWithoutPty }, async () => {
    const cwd = await tempDir()
    const env = await stateEnv()
    const f = await fake((request) => ({ text: `answer to ${request.body.messages.at(-1).content}` }))
    for (const prompt of ['q1', 'q2', 'q3']) assert.equal((await dsh([...(prompt === 'q1' ? [] : ['-c']), '-p', prompt, ...runFlags(f)], cwd, env)).code, 0)
    assert.equal((await dsh(['-p', 'another session', ...runFlags(f)], cwd, env)).code, 0)
    const run = await dshPtyDriven([...runFlags(f), '--no-shell', '--resume'], cwd, env, [
      { waitFor: 'Resume which? [1-2, Enter = 1, n = a new session] ', send: '2\r' },
      { waitFor: '› ', send: '/exit\r' },
    ])
    assert.equal(run.code, 0, run.stdout)
    assert.match(run.stdout, / {2}1\. .* · 1 turn · "another session" … "answer to another session"\n.*\n {2}2\. .* · 3 turns · "q1" … "answer to q3"\n/)
    assert.match(run.stdout, /\[dsh\] resumed \S+: 3 turns, [\d,]+ tokens in context; last active \d+ s ago: "q3"\n\[dsh\] the last 2 exchanges:\n› q2\nanswer to q2\n› q3\nanswer to q3\n/)
  })
})
