// Approvals, diffs and undo of the CLI (issue 27, items 1–3; docs/design.md §8): the line diff
// against a reference, the builtinTools hooks, one-shot runs, and the interactive flows under a
// pseudo-terminal (cases 1 and 2 of the issue).
import { test, describe } from 'node:test'
import assert from 'node:assert/strict'
import { mkdir, readFile, realpath, symlink, writeFile, stat } from 'node:fs/promises'
import { execFileSync, spawn } from 'node:child_process'
import { writeFileSync } from 'node:fs'
import { join } from 'node:path'
import fc from 'fast-check'
import { builtinTools, diffLines, unifiedDiff, commandPrefix, commandMatches, readToolFile, restoreToolFile, type ToolChange } from '../dsh.ts'
import { CLEAN_ENV, dsh, dshPtyDriven, fake, lines, runFlags, skipWithoutPty, tempDir } from './cli-helpers.ts'

const live = () => ({ signal: new AbortController().signal, callId: 'c' })
const text = (out: unknown) => (typeof out === 'string' ? out : (out as { content: string }).content)

/** Length of a longest common subsequence, by the textbook dynamic programme: the reference for minimality. */
function lcs(a: readonly string[], b: readonly string[]): number {
  const row = new Array(b.length + 1).fill(0)
  for (let i = 1; i <= a.length; i++) {
    let diag = 0
    for (let j = 1; j <= b.length; j++) {
      const up = row[j]
      row[j] = a[i - 1] === b[j - 1] ? diag + 1 : Math.max(row[j], row[j - 1])
      diag = up
    }
  }
  return row[b.length]
}

describe('diffLines (Myers) and unifiedDiff', () => {
  test('property: the script turns a into b, and it is a shortest one (edits = n + m − 2·LCS)', () => {
    const line = fc.constantFrom('a', 'b', 'c', 'd', '')
    fc.assert(fc.property(fc.array(line, { maxLength: 30 }), fc.array(line, { maxLength: 30 }), (a, b) => {
      const ops = diffLines(a, b)
      assert.deepEqual(ops.filter(([op]) => op !== '+').map(([, l]) => l), a)
      assert.deepEqual(ops.filter(([op]) => op !== '-').map(([, l]) => l), b)
      assert.equal(ops.filter(([op]) => op !== ' ').length, a.length + b.length - 2 * lcs(a, b))
    }), { numRuns: 2000 })
  })

  const cases: [string, string | undefined, string, string[]][] = [
    ['a new file', undefined, 'one\ntwo\n', ['--- /dev/null', '+++ b/f.txt', '@@ -0,0 +1,2 @@', '+one', '+two']],
    ['one line changed in the middle, three lines of context',
      '1\n2\n3\n4\n5\n6\n7\n8\n9\n', '1\n2\n3\n4\nFIVE\n6\n7\n8\n9\n',
      ['--- a/f.txt', '+++ b/f.txt', '@@ -2,7 +2,7 @@', ' 2', ' 3', ' 4', '-5', '+FIVE', ' 6', ' 7', ' 8']],
    ['two changes far apart: two hunks', Array.from({ length: 20 }, (_, i) => `${i}\n`).join(''), Array.from({ length: 20 }, (_, i) => (i === 1 || i === 18 ? `x${i}\n` : `${i}\n`)).join(''),
      ['--- a/f.txt', '+++ b/f.txt', '@@ -1,5 +1,5 @@', ' 0', '-1', '+x1', ' 2', ' 3', ' 4', '@@ -16,5 +16,5 @@', ' 15', ' 16', ' 17', '-18', '+x18', ' 19']],
    ['a file emptied', 'gone\n', '', ['--- a/f.txt', '+++ b/f.txt', '@@ -1,1 +0,0 @@', '-gone']],
    ['the last line loses its line feed', 'a\nb\n', 'a\nb', ['--- a/f.txt', '+++ b/f.txt', '@@ -1,2 +1,2 @@', ' a', '-b', '+b', '\\ No newline at end of file']],
    ['no change', 'same\n', 'same\n', []],
  ]
  for (const [name, before, after, expected] of cases) {
    test(`unifiedDiff: ${name}`, () => assert.deepEqual(unifiedDiff(before, after, 'f.txt'), expected))
  }

  test('two unrelated 20,000-line files: the middle is one replacement, quickly (the edit limit)', () => {
    const a = Array.from({ length: 20_000 }, (_, i) => `a${i}\n`), b = Array.from({ length: 20_000 }, (_, i) => `b${i}\n`)
    const started = Date.now()
    const ops = diffLines(a, b)
    assert.equal(ops.length, 40_000)
    assert.deepEqual([ops[0][0], ops[19_999][0], ops[20_000][0]], ['-', '-', '+'])
    assert.ok(Date.now() - started < 10_000, `${Date.now() - started} ms`) // a hang guard, not a speed target
  })
})

describe('command prefixes of "always" answers', () => {
  const prefixes: [string, string][] = [['npm test -- --grep x', 'npm test'], ['ls -la', 'ls'], ['cat a.txt', 'cat'], ['git status', 'git status'], ['make', 'make']]
  for (const [command, prefix] of prefixes) test(`commandPrefix(${JSON.stringify(command)}) = ${JSON.stringify(prefix)}`, () => assert.equal(commandPrefix(command), prefix))
  const matches: [string, string, boolean][] = [
    ['npm test', 'npm test', true], ['npm test -- --grep x', 'npm test', true], ['npm testing', 'npm test', false], ['npx test', 'npm test', false],
    ['npm test; rm -rf ~', 'npm test', false], ['npm test && curl x', 'npm test', false], ['npm test | sh', 'npm test', false], ['npm test > /etc/x', 'npm test', false],
    ['npm test $(curl x)', 'npm test', false], ['npm test `curl x`', 'npm test', false], ['npm test\nrm -rf ~', 'npm test', false], ['npm test &', 'npm test', false],
  ]
  for (const [command, prefix, ok] of matches) test(`commandMatches(${JSON.stringify(command)}, ${JSON.stringify(prefix)}) = ${ok}`, () => assert.equal(commandMatches(command, prefix), ok))
})

describe('builtinTools: beforeChange and afterChange', () => {
  test('write_file and edit_file show the change (bytes before, text after) and a refusal writes nothing; shell shows its command', async () => {
    const cwd = await tempDir()
    await writeFile(join(cwd, 'a.txt'), 'alpha\nbeta\n')
    const seen: ToolChange[] = [], done: ToolChange[] = []
    let refuse = false
    const tools = Object.fromEntries((await builtinTools({ cwd, allowShell: true, beforeChange: (c) => { seen.push(c); if (refuse) throw new Error(`${c.tool}: declined by the user`) }, afterChange: (c) => { done.push(c) } })).map((t) => [t.name, t]))
    await tools.edit_file.execute({ path: 'a.txt', old_string: 'beta', new_string: 'BETA' }, live())
    await tools.write_file.execute({ path: 'sub/new.txt', content: 'fresh\n' }, live())
    assert.deepEqual(seen.map((c) => c.tool === 'shell' ? c.command : [c.tool, c.path, c.realPath, c.existed, c.before && Buffer.from(c.before).toString(), c.after]), [
      ['edit_file', 'a.txt', join(cwd, 'a.txt'), true, 'alpha\nbeta\n', 'alpha\nBETA\n'],
      ['write_file', 'sub/new.txt', join(cwd, 'sub', 'new.txt'), false, undefined, 'fresh\n'],
    ])
    assert.equal(done.length, 2)
    refuse = true
    await assert.rejects(async () => tools.write_file.execute({ path: 'a.txt', content: 'x' }, live()), { message: 'write_file: declined by the user' })
    await assert.rejects(async () => tools.edit_file.execute({ path: 'a.txt', old_string: 'alpha', new_string: 'x' }, live()), { message: 'edit_file: declined by the user' })
    await assert.rejects(async () => tools.shell.execute({ command: 'touch ran.txt' }, live()), { message: 'shell: declined by the user' })
    assert.equal(await readFile(join(cwd, 'a.txt'), 'utf8'), 'alpha\nBETA\n')
    await assert.rejects(stat(join(cwd, 'ran.txt')), { code: 'ENOENT' })
    assert.equal(done.length, 2, 'afterChange only for writes that happened')
    assert.equal((seen.at(-1) as { command: string }).command, 'touch ran.txt')
  })

  test('a file that changes while the change waits for approval is not overwritten', async () => {
    const cwd = await tempDir()
    await writeFile(join(cwd, 'a.txt'), 'one\n')
    const tools = Object.fromEntries((await builtinTools({ cwd, beforeChange: async () => { await writeFile(join(cwd, 'a.txt'), 'the user typed this meanwhile\n') } })).map((t) => [t.name, t]))
    await assert.rejects(async () => tools.edit_file.execute({ path: 'a.txt', old_string: 'one', new_string: 'two' }, live()),
      { message: 'edit_file: a.txt changed while the change waited for approval; not written: read it again and redo the change' })
    assert.equal(await readFile(join(cwd, 'a.txt'), 'utf8'), 'the user typed this meanwhile\n')
  })

  test('the write tools refuse .dsh/ (any case, also through a symlink)', async () => {
    const cwd = await tempDir()
    const tools = Object.fromEntries((await builtinTools({ cwd })).map((t) => [t.name, t]))
    for (const path of ['.dsh/config.json', '.DSH/config.json']) {
      await assert.rejects(async () => tools.write_file.execute({ path, content: '{"baseURL": "https://attacker.example/v1"}' }, live()),
        (e: Error) => /is inside \.dsh, dsh's own configuration for this directory; the tools never write it/.test(e.message), path)
    }
    await assert.rejects(stat(join(cwd, '.dsh', 'config.json')), { code: 'ENOENT' })
    assert.equal(text(await tools.write_file.execute({ path: 'docs/.dsh-notes.txt', content: 'ok' }, live())), 'wrote 2 bytes to docs/.dsh-notes.txt (new file)')
  })
})

describe('one-shot runs (-p): diffs on stderr, today\'s rules', () => {
  test('a write and an edit print their diffs; nothing is asked', async () => {
    const cwd = await tempDir()
    await writeFile(join(cwd, 'a.txt'), 'alpha\nbeta\n')
    const f = await fake([
      { toolCalls: [{ name: 'write_file', arguments: { path: 'b.txt', content: 'new\n' } }, { name: 'edit_file', arguments: { path: 'a.txt', old_string: 'beta', new_string: 'BETA' } }] },
      { text: 'done' },
    ])
    const run = await dsh(['-p', 'go', ...runFlags(f)], cwd)
    assert.equal(run.code, 0, run.stderr)
    assert.deepEqual(lines(run.stderr).filter((l) => !l.startsWith('▸')), [
      '--- /dev/null', '+++ b/b.txt', '@@ -0,0 +1,1 @@', '+new',
      '--- a/a.txt', '+++ b/a.txt', '@@ -1,2 +1,2 @@', ' alpha', '-beta', '+BETA',
    ])
    assert.equal(await readFile(join(cwd, 'a.txt'), 'utf8'), 'alpha\nBETA\n')
  })

  test('a diff over 40 lines is cut with "… N more lines"; --json prints none', async () => {
    const cwd = await tempDir()
    const content = Array.from({ length: 100 }, (_, i) => `line ${i}\n`).join('')
    const f = await fake([{ toolCalls: [{ name: 'write_file', arguments: { path: 'big.txt', content } }] }, { text: 'done' }, { toolCalls: [{ name: 'write_file', arguments: { path: 'c.txt', content } }] }, { text: 'done' }])
    const run = await dsh(['-p', 'go', ...runFlags(f)], cwd)
    const out = lines(run.stderr)
    assert.equal(out.length, 42, run.stderr) // 40 diff lines, the cut line, the activity line
    assert.equal(out[39], '+line 36')
    assert.equal(out[40], '… 63 more lines') // 3 header lines + 100 added lines = 103
    const json = await dsh(['-p', 'go', ...runFlags(f), '--json'], cwd)
    assert.equal(json.stderr, '')
  })

  test('shell: with --allow-shell every command runs; with approved prefixes in the user configuration only those, the rest declined', async () => {
    const cwd = await tempDir()
    const config = await tempDir()
    await mkdir(join(config, 'dsh'))
    await writeFile(join(config, 'dsh', 'config.json'), JSON.stringify({ approvals: { commands: ['echo hi'] } }))
    const f = await fake([
      { toolCalls: [{ name: 'shell', arguments: { command: 'echo hi there' } }, { name: 'shell', arguments: { command: 'touch not-approved.txt' } }, { name: 'shell', arguments: { command: 'echo hi; touch chained.txt' } }] },
      { text: 'done' },
    ])
    const run = await dsh(['-p', 'go', ...runFlags(f)], cwd, { ...CLEAN_ENV, XDG_CONFIG_HOME: config })
    assert.equal(run.code, 0, run.stderr)
    assert.ok(f.requests[0].body.tools.some((t: any) => t.function.name === 'shell'), 'approved prefixes offer the shell tool in -p')
    const results = f.requests[1].body.messages.filter((m: any) => m.role === 'tool').map((m: any) => m.content)
    assert.match(results[0], /^exit code 0\nstdout:\nhi there/)
    for (const r of results.slice(1)) assert.match(r, /^shell: not run: no approved prefix covers this command, and a one-shot run \(-p\) cannot ask/)
    await assert.rejects(stat(join(cwd, 'not-approved.txt')), { code: 'ENOENT' })
    await assert.rejects(stat(join(cwd, 'chained.txt')), { code: 'ENOENT' })
  })
})

const PROMPT = '› '

describe('case 1: interactive approvals (under a pseudo-terminal)', () => {
  test('a write_file call is shown with its diff and waits; n leaves the file untouched and the model reads "declined by the user"; a approves this and later writes of the turn', { skip: skipWithoutPty }, async () => {
    const cwd = await tempDir()
    const config = await tempDir()
    const f = await fake([
      { toolCalls: [{ name: 'write_file', arguments: { path: 'a.txt', content: 'alpha\n' } }] },
      { text: 'Understood, not written.' },
      { toolCalls: [{ name: 'write_file', arguments: { path: 'b.txt', content: 'beta\n' } }] },
      { toolCalls: [{ name: 'write_file', arguments: { path: 'c.txt', content: 'gamma\n' } }] },
      { text: 'Both written.' },
    ])
    const run = await dshPtyDriven([...runFlags(f), '--no-shell'], cwd, { ...CLEAN_ENV, XDG_CONFIG_HOME: config }, [
      { waitFor: PROMPT, send: 'write a\r' },
      { waitFor: 'Apply this change to a.txt? [y]es / [n]o / [a]lways for write_file: ', send: 'n\r' },
      { waitFor: 'Understood, not written.', send: '' }, { waitFor: PROMPT, send: 'write b and c\r' },
      { waitFor: 'Apply this change to b.txt?', send: 'a\r' },
      { waitFor: 'Both written.', send: '' }, { waitFor: PROMPT, send: '/exit\r' },
    ])
    assert.equal(run.code, 0, run.stdout)
    const out = run.stdout
    const question = out.indexOf('Apply this change to a.txt?')
    assert.ok(out.lastIndexOf('--- /dev/null\n+++ b/a.txt\n@@ -0,0 +1,1 @@\n+alpha\n', question) !== -1, `the diff comes before the question:\n${out}`)
    await assert.rejects(stat(join(cwd, 'a.txt')), { code: 'ENOENT' })
    assert.match(f.requests[1].body.messages.at(-1).content, /^write_file: declined by the user; a\.txt was not changed/)
    assert.equal(await readFile(join(cwd, 'b.txt'), 'utf8'), 'beta\n')
    assert.equal(await readFile(join(cwd, 'c.txt'), 'utf8'), 'gamma\n')
    assert.equal(out.split('Apply this change to').length, 3, 'asked for a.txt and b.txt, not for c.txt')
    assert.ok(out.includes('+++ b/c.txt\n@@ -0,0 +1,1 @@\n+gamma\n'), 'an approved write still shows its diff')
    assert.deepEqual(JSON.parse(await readFile(join(config, 'dsh', 'config.json'), 'utf8')), { projects: { [cwd]: { approvals: { tools: ['write_file'], commands: [] } } } })
  })

  test('shell: each command is shown and asked; p remembers its prefix; a chained command is asked again', { skip: skipWithoutPty }, async () => {
    const cwd = await tempDir()
    const config = await tempDir()
    const f = await fake([
      { toolCalls: [{ name: 'shell', arguments: { command: 'echo one' } }] },
      { toolCalls: [{ name: 'shell', arguments: { command: 'echo one two' } }] },
      { toolCalls: [{ name: 'shell', arguments: { command: 'echo one; touch x.txt' } }] },
      { text: 'Ran them.' },
    ])
    const run = await dshPtyDriven([...runFlags(f), '--allow-shell'], cwd, { ...CLEAN_ENV, XDG_CONFIG_HOME: config }, [
      { waitFor: PROMPT, send: 'run\r' },
      { waitFor: '$ echo one\n', send: '' }, { waitFor: 'Run it? [y]es / [n]o / [a]lways for shell / [p] always for "echo one …": ', send: 'p\r' },
      { waitFor: '$ echo one; touch x.txt', send: '' }, { waitFor: 'Run it?', send: 'n\r' },
      { waitFor: 'Ran them.', send: '' }, { waitFor: PROMPT, send: '/exit\r' },
    ])
    assert.equal(run.code, 0, run.stdout)
    assert.doesNotMatch(run.stdout, /\$ echo one two/, '"echo one two" is covered by the remembered prefix "echo one": not asked')
    const results = f.requests.slice(1).map((r) => r.body.messages.at(-1).content)
    assert.match(results[0], /^exit code 0\nstdout:\none/)
    assert.match(results[1], /^exit code 0\nstdout:\none two/)
    assert.match(results[2], /^shell: declined by the user; the command was not run/)
    await assert.rejects(stat(join(cwd, 'x.txt')), { code: 'ENOENT' })
    assert.deepEqual(JSON.parse(await readFile(join(config, 'dsh', 'config.json'), 'utf8')).projects[cwd].approvals, { tools: [], commands: ['echo one'] })
  })
})

describe('case 2: /undo (under a pseudo-terminal)', () => {
  test('/undo after a turn that edited two files restores both byte for byte; the model is told; again walks back a turn', { skip: skipWithoutPty }, async () => {
    const cwd = await tempDir()
    // Bytes an edit cannot keep (not UTF-8: the tool writes text), CRLF and no final line feed.
    const A = Buffer.concat([Buffer.from('keep\r\nchange me\r\n'), Buffer.from([0xff, 0xfe, 0x41]), Buffer.from('\r\nend')])
    const B = Buffer.from('b: one\nb: two\n')
    await writeFile(join(cwd, 'a.txt'), A)
    await writeFile(join(cwd, 'b.txt'), B)
    const f = await fake([
      { toolCalls: [{ name: 'write_file', arguments: { path: 'b.txt', content: 'b rewritten in turn 1\n' } }] },
      { text: 'Turn 1 done.' },
      { toolCalls: [{ name: 'edit_file', arguments: { path: 'a.txt', old_string: 'change me', new_string: 'CHANGED' } }, { name: 'write_file', arguments: { path: 'b.txt', content: 'b rewritten in turn 2\n' } }, { name: 'write_file', arguments: { path: 'new.txt', content: 'created\n' } }] },
      { text: 'Turn 2 done.' },
      { text: 'Noted.' },
    ])
    const run = await dshPtyDriven([...runFlags(f), '--no-shell', '-y'], cwd, CLEAN_ENV, [
      { waitFor: PROMPT, send: 'one\r' }, { waitFor: 'Turn 1 done.', send: '' },
      { waitFor: PROMPT, send: 'two\r' }, { waitFor: 'Turn 2 done.', send: '' },
      { waitFor: PROMPT, send: '/undo\r' }, { waitFor: '[dsh] /undo, turn 2: ', send: '' },
      { waitFor: PROMPT, send: 'what now?\r' }, { waitFor: 'Noted.', send: '' },
      { waitFor: PROMPT, send: '/undo\r' }, { waitFor: '[dsh] /undo, turn 1: ', send: '' },
      { waitFor: PROMPT, send: '/undo\r' }, { waitFor: '[dsh] /undo: nothing to undo', send: '' },
      { waitFor: PROMPT, send: '/exit\r' },
    ])
    assert.equal(run.code, 0, run.stdout)
    assert.match(run.stdout, /\[dsh\] \/undo, turn 2: restored b\.txt, a\.txt; removed new\.txt \(created in that turn\); the model is told with your next input/)
    assert.deepEqual(await readFile(join(cwd, 'a.txt')), A)
    await assert.rejects(stat(join(cwd, 'new.txt')), { code: 'ENOENT' })
    assert.match(f.requests[4].body.messages.at(-1).content, /^\[dsh note: The user ran \/undo on the file changes of turn 2: restored b\.txt, a\.txt; removed new\.txt \(created in that turn\)\. .*\]\n\nwhat now\?$/s)
    assert.deepEqual(await readFile(join(cwd, 'b.txt')), B, 'the second /undo walks back to before turn 1')
    assert.match(run.stdout, /\[dsh\] \/undo: nothing to undo: every change of this session is undone already/)
  })

  test('a file changed outside dsh since is not overwritten without asking; /diff shows the session\'s changes', { skip: skipWithoutPty }, async () => {
    const cwd = await tempDir()
    await writeFile(join(cwd, 'a.txt'), 'original\n')
    await writeFile(join(cwd, 'b.txt'), 'b original\n')
    const f = await fake((_request, index) => {
      if (index === 0) return { toolCalls: [{ name: 'edit_file', arguments: { path: 'a.txt', old_string: 'original', new_string: 'by dsh' } }, { name: 'edit_file', arguments: { path: 'b.txt', old_string: 'original', new_string: 'by dsh' } }] }
      writeFileSync(join(cwd, 'a.txt'), 'by the user\n') // someone edits a.txt after dsh did
      return { text: 'Edited.' }
    })
    const run = await dshPtyDriven([...runFlags(f), '--no-shell', '-y'], cwd, CLEAN_ENV, [
      { waitFor: PROMPT, send: 'edit\r' }, { waitFor: 'Edited.', send: '' },
      { waitFor: PROMPT, send: '/diff\r' }, { waitFor: '+b by dsh', send: '' },
      { waitFor: PROMPT, send: '/undo\r' }, { waitFor: 'a.txt changed outside dsh since turn 1 wrote it; put back its content from before that turn anyway? [y/N] ', send: 'n\r' },
      { waitFor: '[dsh] /undo, turn 1: ', send: '' }, { waitFor: PROMPT, send: '/exit\r' },
    ])
    assert.equal(run.code, 0, run.stdout)
    assert.ok(run.stdout.includes('--- a/a.txt\n+++ b/a.txt\n@@ -1,1 +1,1 @@\n-original\n+by the user\n'), `/diff compares with the file as it is now:\n${run.stdout}`)
    assert.ok(run.stdout.includes('--- a/b.txt\n+++ b/b.txt\n@@ -1,1 +1,1 @@\n-b original\n+b by dsh\n'))
    assert.match(run.stdout, /\[dsh\] \/undo, turn 1: restored b\.txt; left a\.txt as it is \(changed outside dsh since\)/)
    assert.equal(await readFile(join(cwd, 'a.txt'), 'utf8'), 'by the user\n')
    assert.equal(await readFile(join(cwd, 'b.txt'), 'utf8'), 'b original\n')
  })
})

describe('undo and /diff under a racing or hostile project (a review of round 4, session 12; each failed before)', () => {
  test('a change the user made between two of a turn\'s writes is not dropped by /undo without asking', { skip: skipWithoutPty }, async () => {
    const cwd = await tempDir()
    await writeFile(join(cwd, 'a.txt'), 'original\n')
    const f = await fake((_request, index) => {
      if (index === 1) writeFileSync(join(cwd, 'a.txt'), 'model-1\nthe user\'s line\n') // the user saves between the writes
      return [
        { toolCalls: [{ name: 'edit_file', arguments: { path: 'a.txt', old_string: 'original', new_string: 'model-1' } }] },
        { toolCalls: [{ name: 'edit_file', arguments: { path: 'a.txt', old_string: 'model-1', new_string: 'model-2' } }] },
      ][index] ?? { text: 'Edited.' }
    })
    const run = await dshPtyDriven([...runFlags(f), '--no-shell', '-y'], cwd, CLEAN_ENV, [
      { waitFor: PROMPT, send: 'edit\r' }, { waitFor: 'Edited.', send: '' },
      { waitFor: PROMPT, send: '/undo\r' }, { waitFor: 'a.txt changed outside dsh between two of turn 1\'s writes; put back its content from before that turn anyway? [y/N] ', send: 'n\r' },
      { waitFor: '[dsh] /undo, turn 1: ', send: '' }, { waitFor: PROMPT, send: '/exit\r' },
    ])
    assert.equal(run.code, 0, run.stdout)
    assert.equal(await readFile(join(cwd, 'a.txt'), 'utf8'), 'model-2\nthe user\'s line\n')
  })

  test('readToolFile (/diff, /undo) refuses a FIFO, a device link and a link out of the project, at once', async () => {
    const cwd = await realpath(await tempDir()), outside = await realpath(await tempDir())
    await writeFile(join(outside, 'secret.txt'), 'TOP-SECRET')
    execFileSync('mkfifo', [join(cwd, 'fifo.txt')])
    await symlink('/dev/zero', join(cwd, 'zero.txt'))
    await symlink(join(outside, 'secret.txt'), join(cwd, 'out.txt'))
    await writeFile(join(cwd, 'ok.txt'), 'fine')
    assert.deepEqual(await readToolFile(cwd, join(cwd, 'ok.txt')), new TextEncoder().encode('fine'))
    assert.equal(await readToolFile(cwd, join(cwd, 'gone.txt')), undefined)
    await assert.rejects(readToolFile(cwd, join(cwd, 'fifo.txt')), /not a regular file/)
    await assert.rejects(readToolFile(cwd, join(cwd, 'zero.txt')), /outside|not a regular file/)
    await assert.rejects(readToolFile(cwd, join(cwd, 'out.txt')), /outside/)
  })

  test('restoreToolFile removes a created file only inside the project, while another process swaps its directory for a link', async () => {
    const cwd = await realpath(await tempDir()), outside = await realpath(await tempDir())
    await mkdir(join(cwd, 'd'))
    await writeFile(join(outside, 'new.txt'), 'VICTIM')
    // a sandboxed command of another dsh could do this: d ⇄ a link to the outside directory, over and over
    const racer = spawn('sh', ['-c', `cd '${cwd}'; while :; do mv -T d d_real; ln -s '${outside}' d; rm -f d; mv -T d_real d; done 2>/dev/null`])
    try {
      for (let i = 0; i < 1500; i++) {
        try { writeFileSync(join(cwd, 'd_real', 'new.txt'), 'by dsh', { flag: 'wx' }) } catch { /* d is not there now */ }
        await restoreToolFile(cwd, join(cwd, 'd', 'new.txt'), undefined).catch(() => {})
      }
    } finally { racer.kill() }
    assert.equal(await readFile(join(outside, 'new.txt'), 'utf8'), 'VICTIM', 'the file outside the project was removed')
  })
})

describe('/permissions (under a pseudo-terminal)', () => {
  test('lists what runs without asking and where it comes from; removes a remembered answer; changes the shell answer', { skip: skipWithoutPty }, async () => {
    const cwd = await tempDir()
    const config = await tempDir()
    await mkdir(join(config, 'dsh'))
    await writeFile(join(config, 'dsh', 'config.json'), JSON.stringify({ approvals: { commands: ['npm test'] }, projects: { [cwd]: { shell: false, approvals: { tools: ['edit_file', 'write_file'] } } } }))
    const f = await fake([
      { text: 'I will write it.', toolCalls: [{ name: 'write_file', arguments: { path: 'a.txt', content: 'alpha\n' } }] },
      { text: 'Written.' },
    ])
    const run = await dshPtyDriven(runFlags(f), cwd, { ...CLEAN_ENV, XDG_CONFIG_HOME: config }, [
      { waitFor: PROMPT, send: '/permissions\r' }, { waitFor: '  change: /permissions remove N', send: '' },
      { waitFor: PROMPT, send: '/permissions remove 2\r' }, { waitFor: 'will be asked about again', send: '' },
      { waitFor: PROMPT, send: '/permissions shell yes\r' }, { waitFor: 'from the next start', send: '' },
      { waitFor: PROMPT, send: 'write a\r' }, { waitFor: 'Apply this change to a.txt?', send: 'y\r' },
      { waitFor: 'Written.', send: '' }, { waitFor: PROMPT, send: '/exit\r' },
    ])
    assert.equal(run.code, 0, run.stdout)
    const configFile = join(config, 'dsh', 'config.json')
    assert.ok(run.stdout.includes([
      `permissions in ${cwd}:`,
      `  shell commands: not allowed (remembered in ${configFile})`,
      '  .dsh/config.json: none',
      '  run without asking:',
      `    - commands starting with "npm test" (from ${configFile})`,
      '    1. every edit_file call (remembered for this directory)',
      '    2. every write_file call (remembered for this directory)',
    ].join('\n')), run.stdout)
    assert.ok(run.stdout.includes('[dsh] write_file will be asked about again\n'))
    assert.ok(run.stdout.includes(`[dsh] shell commands allowed in ${cwd} from the next start (remembered in ${configFile})`))
    // The live line (a spinner, between two erase-line escapes) is gone from the screen once the diff prints.
    assert.ok(run.stdout.replace(/\x1b\[K[^\n\x1b]*\x1b\[K/g, '').includes('I will write it.\n--- /dev/null\n'), 'the streamed text ends its line before the diff')
    assert.deepEqual(JSON.parse(await readFile(configFile, 'utf8')).projects[cwd], { shell: true, approvals: { tools: ['edit_file'] } })
  })
})
