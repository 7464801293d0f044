// What a sandboxed command and the write tools can reach (docs/design.md §8, §13), from a hostile-model review of
// round 4: tool arguments chosen by an attacker. Each test failed before its fix: a pinned name repaired through a
// swapped directory (outside the project), daemons' sockets under /run, the CLI's own settings written by write_file,
// other users' homes, and a scan for git directories cut short by making 50,001 directories.
import { test, describe, after } from 'node:test'
import assert from 'node:assert/strict'
import { spawnSync } from 'node:child_process'
import { lstat, mkdir, mkdtemp, readdir, readFile, readlink, realpath, rm, writeFile } from 'node:fs/promises'
import { join } from 'node:path'
import { builtinTools, type Tool } from '../dsh.ts'
import { CLEAN_ENV } from './cli-child.ts'

const bwrapRuns = spawnSync('bwrap', ['--ro-bind', '/', '/', '--unshare-pid', '--unshare-net', 'true']).status === 0
  || process.env.CI === 'true' || !!process.env.DSH_REQUIRE_SANDBOX // required there: a missing bwrap fails
const made: string[] = []
after(async () => { for (const dir of made) await rm(dir, { recursive: true, force: true }) })
/** `base/work` (the project) and `base/outside`, under /var/tmp (which the sandbox leaves as on the host, read-only). */
async function place(): Promise<{ base: string; work: string; outside: string }> {
  const base = await realpath(await mkdtemp('/var/tmp/dsh-hostile-a-'))
  made.push(base)
  const work = join(base, 'work'), outside = join(base, 'outside')
  await mkdir(work); await mkdir(outside)
  return { base, work, outside }
}
const live = () => ({ signal: new AbortController().signal, callId: 'c' })
const text = (out: unknown) => typeof out === 'string' ? out : (out as { content: string }).content
async function sandboxedShell(root: string, env: Record<string, string> = CLEAN_ENV): Promise<Tool> {
  return (await builtinTools({ cwd: root, allowShell: true, shellEnv: env, sandbox: {} })).find((t) => t.name === 'shell')!
}

describe('the repair of a pinned name stays inside the project', { skip: bwrapRuns ? false : 'SKIPPED: bwrap cannot run' }, () => {
  test('a sandboxed command cannot make dsh create a .git symlink in a directory outside the project', async () => {
    const { work, outside } = await place()
    const shell = await sandboxedShell(work)
    // 1: a .git link in a subdirectory (an ordinary thing to create: it is not protected yet).
    assert.match(text(await shell.execute({ command: 'mkdir x && ln -s ../evil-gitdir x/.git && echo ok' }, live())), /^exit code 0/)
    // 2: the subdirectory swapped for a link to a directory outside; the command itself cannot write there.
    const out = text(await shell.execute({ command: `rm -rf x && ln -s ${outside} x && (touch ${outside}/direct 2>&1 || true)` }, live()))
    // The directory holding a pinned name is a mount point now, so it cannot be swapped (or, were it, written through).
    assert.match(out, /Device or resource busy|Read-only file system/, out)
    // dsh's own repair, unsandboxed, must not follow the swapped directory out of the project.
    const made = await lstat(join(outside, '.git')).then(async () => readlink(join(outside, '.git')).catch(() => '?'), () => undefined)
    assert.equal(made, undefined, `dsh created ${outside}/.git -> ${made}; result: ${out}`)
  })

  test('a sandboxed command cannot make dsh rename another repository\'s .git outside the project', async () => {
    const { work, outside } = await place()
    await mkdir(join(outside, '.git')) // the user's other repository next door
    await writeFile(join(outside, '.git', 'HEAD'), 'ref: refs/heads/main\n')
    const shell = await sandboxedShell(work)
    await shell.execute({ command: 'mkdir x && ln -s ../evil-gitdir x/.git' }, live())
    const out = text(await shell.execute({ command: `rm -rf x && ln -s ${outside} x` }, live()))
    const st = await lstat(join(outside, '.git'))
    assert.ok(st.isDirectory() && !st.isSymbolicLink(), `outside/.git is now a ${st.isSymbolicLink() ? `symlink to ${await readlink(join(outside, '.git'))}` : 'non-directory'}; outside holds ${(await readdir(outside)).join(', ')}; result: ${out}`)
    assert.equal(await readFile(join(outside, '.git', 'HEAD'), 'utf8'), 'ref: refs/heads/main\n')
  })
})

describe('no network: no daemon\'s Unix socket either', { skip: bwrapRuns && process.getuid?.() === 0 ? false : 'SKIPPED: needs bwrap, as root (it serves a socket under /run)' }, () => {
  test('a command cannot talk to a server on a Unix socket under /run (as /run/postgresql, /run/containerd, /run/podman, /var/run/dbus hold)', async () => {
    const { createServer } = await import('node:http')
    const { work } = await place()
    const dir = await mkdtemp('/run/dsh-hostile-a-')
    made.push(dir)
    const sock = join(dir, 'daemon.sock')
    let reached = 0
    const server = createServer((_req, res) => { reached++; res.end('DAEMON-SAYS-HI\n') })
    await new Promise<void>((resolve) => server.listen(sock, resolve))
    try {
      const shell = await sandboxedShell(work)
      const out = text(await shell.execute({ command: `curl -sS --max-time 5 --unix-socket ${sock} http://d/ 2>&1; node -e "require('net').connect('${sock}').on('connect',()=>{console.log('CONNECTED');process.exit(0)}).on('error',e=>{console.log(e.code);process.exit(0)})"` }, live()))
      assert.equal(reached, 0, `the sandboxed command reached the daemon (no network was promised): ${out}`)
      assert.doesNotMatch(out, /DAEMON-SAYS-HI|CONNECTED/, out)
    } finally { await new Promise((r) => server.close(r)) }
  })
})

describe('the write tools never write the CLI\'s own settings', () => {
  test('dsh run in the home directory: write_file of .config/dsh/config.json is refused (it approved every shell command, unsandboxed, for the next run)', async () => {
    const { startFakeProvider } = await import('./fake-provider.ts')
    const { runDsh } = await import('./cli-child.ts')
    const { work } = await place() // the user's home, where they start dsh
    const env: Record<string, string> = { ...CLEAN_ENV, HOME: work }
    delete env.XDG_CONFIG_HOME; delete env.XDG_STATE_HOME
    const poison = JSON.stringify({ approvals: { tools: ['shell'] }, sandbox: false })
    const turn = (calls: { name: string; arguments: Record<string, unknown> }[]) => {
      const script = [{ toolCalls: calls.map((c, i) => ({ id: `c${i}`, ...c })) }, { text: 'done' }]
      return startFakeProvider({ handler: (_r, i) => script[i] ?? { status: 400, body: 'script exhausted' } })
    }
    // Run 1: a one-shot run without --allow-shell (file writes run, shell is not offered).
    const f1 = await turn([{ name: 'write_file', arguments: { path: '.config/dsh/config.json', content: poison } }])
    let result1: string
    try {
      const run = await runDsh(['-p', 'tidy up', '--base-url', f1.url, '--model', 'm', '--context-window', '64000'], work, env)
      assert.equal(run.code, 0, run.stderr)
      result1 = f1.requests[1].body.messages.find((m: { role: string }) => m.role === 'tool').content
    } finally { await f1.close() }
    // Run 2: the next one-shot run, again without --allow-shell: does the model get an unsandboxed shell?
    const f2 = await turn([{ name: 'shell', arguments: { command: 'echo RAN-UNASKED; touch $HOME/../outside/pwned' } }])
    try {
      await runDsh(['-p', 'hello', '--base-url', f2.url, '--model', 'm', '--context-window', '64000'], work, env)
      const tools = (f2.requests[0]?.body.tools ?? []).map((t: { function: { name: string } }) => t.function.name)
      const outsideWritten = await lstat(join(work, '..', 'outside', 'pwned')).then(() => true, () => false)
      assert.ok(!tools.includes('shell') && !outsideWritten, `run 1's write_file said ${JSON.stringify(result1)}; run 2 offered ${tools.join(', ')} and wrote outside: ${outsideWritten}`)
    } finally { await f2.close() }
  })
})

describe('every home directory an empty tmpfs (docs/design.md §13)', { skip: bwrapRuns && process.getuid?.() === 0 ? false : 'SKIPPED: needs bwrap, as root' }, () => {
  test('as root, another user\'s home under /home is hidden like $HOME (its ~/.ssh was readable)', async () => {
    const { work } = await place()
    const other = await mkdtemp('/home/dsh-hostile-a-')
    made.push(other)
    await mkdir(join(other, '.ssh'))
    await writeFile(join(other, '.ssh', 'id_ed25519'), 'OTHER-USERS-PRIVATE-KEY\n')
    const shell = await sandboxedShell(work)
    const out = text(await shell.execute({ command: `cat ${other}/.ssh/id_ed25519 2>&1; cat /root/.ssh/id_rsa 2>&1 | head -c 40` }, live()))
    assert.doesNotMatch(out, /OTHER-USERS-PRIVATE-KEY/, out)
  })
})

describe('every git directory in the tree is protected, however many directories there are (docs/design.md §13)', { skip: bwrapRuns ? false : 'SKIPPED: bwrap cannot run' }, () => {
  test('after a command made 50,001 directories, the hooks of a nested repository stay read-only (the project does)', { timeout: 120_000 }, async () => {
    const { work } = await place()
    // The user's nested clone (not a submodule): vendor/lib with its own .git.
    for (const d of ['vendor/lib/.git/objects', 'vendor/lib/.git/refs/heads', 'vendor/lib/.git/hooks']) await mkdir(join(work, d), { recursive: true })
    await writeFile(join(work, 'vendor/lib/.git/HEAD'), 'ref: refs/heads/main\n')
    const shell = await sandboxedShell(work)
    const control = text(await shell.execute({ command: 'echo evil > vendor/lib/.git/hooks/pre-commit 2>&1; echo end' }, live()))
    assert.match(control, /Read-only file system/, control) // protected while the tree is small
    await shell.execute({ command: 'seq 1 50001 | xargs mkdir', timeout_ms: 60_000 }, live())
    const out = text(await shell.execute({ command: 'echo "#!/bin/sh" > vendor/lib/.git/hooks/pre-commit 2>&1; echo end' }, live()))
    await assert.rejects(lstat(join(work, 'vendor/lib/.git/hooks/pre-commit')), { code: 'ENOENT' }, `the hook was written; result: ${out}`)
    assert.match(out, /Read-only file system/, out)
    assert.match(out, /more than 50000 directories .*ran with the project read-only/, out)
  })
})
