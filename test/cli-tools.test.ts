// Built-in coding tools (docs/design.md §8, issue 5) on real temp directories, and the CLI's argument
// parsing, help/version handling and entry-point check.
import { test, describe, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { existsSync, readFileSync } from 'node:fs'
import { mkdtemp, mkdir, writeFile, readFile, symlink, realpath, rm, stat } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import { join, resolve } from 'node:path'
import { pathToFileURL, fileURLToPath } from 'node:url'
import {
  builtinTools, parseCliArgs, runCliBasics, isEntryPoint, UsageError, cliHelp, VERSION,
  type Tool, type ToolOutput, type BuiltinToolsOptions, type CliOptions, type CliConfigFiles,
} from '../dsh.ts'
import { ROOT, dsh } from './cli-helpers.ts'

const live = () => ({ signal: new AbortController().signal, callId: 'call_1' })

/** A temp folder holding `work/` (the working directory) and `outside/` beside it. */
async function workspace(files: Record<string, string | Uint8Array> = {}): Promise<{ base: string; root: string; outside: string }> {
  const base = await realpath(await mkdtemp(join(tmpdir(), 'dsh-tools-')))
  const root = join(base, 'work')
  const outside = join(base, 'outside')
  await mkdir(root); await mkdir(outside)
  await writeFile(join(outside, 'secret.txt'), 'top secret\n')
  for (const [name, content] of Object.entries(files)) {
    await mkdir(join(root, name, '..'), { recursive: true })
    await writeFile(join(root, name), content)
  }
  return { base, root, outside }
}

async function toolsFor(root: string, options: Omit<BuiltinToolsOptions, 'cwd'> = {}): Promise<Record<string, Tool>> {
  return Object.fromEntries((await builtinTools({ cwd: root, ...options })).map((t) => [t.name, t]))
}

function text(output: ToolOutput): string {
  assert.equal(typeof output, 'string', `expected a plain string result, got ${JSON.stringify(output)}`)
  return output as string
}

const cleanup: string[] = []
after(async () => { for (const dir of cleanup) await rm(dir, { recursive: true, force: true }) })
async function ws(files: Record<string, string | Uint8Array> = {}) { const w = await workspace(files); cleanup.push(w.base); return w }

describe('builtinTools: the tool set and its options', () => {
  test('five file tools; shell only with allowShell', async () => {
    const { root } = await ws()
    assert.deepEqual((await builtinTools({ cwd: root })).map((t) => t.name), ['read_file', 'list_files', 'grep', 'write_file', 'edit_file'])
    assert.deepEqual((await builtinTools({ cwd: root, allowShell: false })).map((t) => t.name), ['read_file', 'list_files', 'grep', 'write_file', 'edit_file'])
    const withShell = await builtinTools({ cwd: root, allowShell: true })
    assert.deepEqual(withShell.map((t) => t.name), ['read_file', 'list_files', 'grep', 'write_file', 'edit_file', 'shell'])
    for (const tool of withShell) {
      assert.equal(tool.parameters.type, 'object')
      assert.equal(tool.parameters.additionalProperties, false)
      assert.ok(tool.description.length > 40)
    }
  })

  const badOptions: [Record<string, unknown>, RegExp][] = [
    [{ cwd: '' }, /options\.cwd must be a non-empty directory path/],
    [{ cwd: '.', maxOutputUnits: 0 }, /options\.maxOutputUnits must be a positive integer, got 0 \(default 100000\)/],
    [{ cwd: '.', readLimitLines: 2.5 }, /options\.readLimitLines must be a positive integer, got 2\.5/],
    [{ cwd: '.', shellTimeoutMs: 700_000 }, /options\.shellTimeoutMs \(700000 ms\) exceeds options\.shellMaxTimeoutMs \(600000 ms\)/],
    [{ cwd: '.', maxOutputChar: 5 }, /unknown option "maxOutputChar"/],
  ]
  for (const [options, message] of badOptions) {
    test(`rejects ${JSON.stringify(options)}`, async () => {
      await assert.rejects(builtinTools(options as unknown as BuiltinToolsOptions), (e: Error) => e instanceof TypeError && message.test(e.message))
    })
  }

  test('a working directory that does not exist', async () => {
    const { base } = await ws()
    await assert.rejects(builtinTools({ cwd: join(base, 'nope') }), { message: `builtinTools: working directory ${join(base, 'nope')} is not usable (it does not exist)` })
  })

  test('bad arguments are errors the model can read', async () => {
    const { root } = await ws({ 'a.txt': 'one\ntwo\n' })
    const t = await toolsFor(root)
    const cases: [string, unknown, string][] = [
      ['read_file', [], 'read_file: arguments must be a JSON object with the keys path, offset, limit'],
      ['read_file', { path: 'a.txt', lines: 3 }, 'read_file: unknown argument "lines"; the arguments are path, offset, limit'],
      ['read_file', {}, 'read_file: the argument "path" is required'],
      ['read_file', { path: 7 }, 'read_file: "path" must be a string, got 7'],
      ['read_file', { path: 'a.txt', offset: 0 }, `read_file: "offset" must be an integer from 1 to ${Number.MAX_SAFE_INTEGER} (a 1-based line number), got 0`],
      ['read_file', { path: '' }, 'read_file: "path" is empty; give a path relative to the working directory, e.g. "."'],
      ['list_files', { recursive: 'yes' }, 'list_files: "recursive" must be true or false, got "yes"'],
      ['grep', { pattern: '' }, 'grep: "pattern" is empty; give the text or regular expression to search for'],
      ['grep', { pattern: 'x', max_matches: 5000 }, 'grep: "max_matches" must be an integer from 1 to 1000 (matching lines), got 5000'],
    ]
    for (const [name, args, message] of cases) await assert.rejects(async () => t[name].execute(args, live()), { message }, `${name} ${JSON.stringify(args)}`)
    // Quoted numbers and booleans, as some models send them, are accepted.
    assert.equal(text(await t.read_file.execute({ path: 'a.txt', offset: '2', limit: '1' }, live())), '     2\ttwo')
  })
})

describe('confinement to the working directory', () => {
  let root: string, outside: string, t: Record<string, Tool>
  before(async () => {
    ({ root, outside } = await ws({ 'a.txt': 'inside\n', 'sub/b.txt': 'b\n' }))
    await symlink(join(outside, 'secret.txt'), join(root, 'link-secret'))
    await symlink(outside, join(root, 'link-dir'))
    await symlink(join(outside, 'created-through-link.txt'), join(root, 'dangling'))
    await symlink(join(root, 'a.txt'), join(root, 'link-inside'))
    t = await toolsFor(root)
  })

  test('../../etc/passwd is refused with a readable message', async () => {
    const deep = '../'.repeat(root.split('/').length) + 'etc/passwd'
    await assert.rejects(async () => t.read_file.execute({ path: deep }, live()), {
      message: `read_file: ${JSON.stringify(deep)} is outside the working directory ${root} (it resolves to /etc/passwd); these tools can only reach files inside the working directory, so use a path inside it`,
    })
    await assert.rejects(async () => t.read_file.execute({ path: '../../etc/passwd' }, live()), {
      message: `read_file: "../../etc/passwd" is outside the working directory ${root} (it resolves to ${resolve(root, '../../etc/passwd')}); these tools can only reach files inside the working directory, so use a path inside it`,
    })
  })

  test('a symlink pointing outside is refused and named as one', async () => {
    await assert.rejects(async () => t.read_file.execute({ path: 'link-secret' }, live()), {
      message: `read_file: "link-secret" is outside the working directory ${root} (it resolves through a symlink to ${join(outside, 'secret.txt')}); these tools can only reach files inside the working directory, so use a path inside it`,
    })
  })

  const escapes: [string, Record<string, unknown>][] = [
    ['read_file', { path: '/etc/passwd' }],
    ['read_file', { path: 'link-dir/secret.txt' }],
    ['read_file', { path: 'sub/../../outside/secret.txt' }],
    ['list_files', { path: '..' }],
    ['list_files', { path: 'link-dir' }],
    ['grep', { pattern: 'secret', path: 'link-dir' }],
    ['grep', { pattern: 'secret', path: '/' }],
    ['write_file', { path: 'link-secret', content: 'pwned' }],
    ['write_file', { path: 'link-dir/new.txt', content: 'pwned' }],
    ['write_file', { path: 'dangling', content: 'pwned' }],
    ['write_file', { path: '../outside/new.txt', content: 'pwned' }],
    ['edit_file', { path: 'link-secret', old_string: 'top', new_string: 'no' }],
  ]
  for (const [name, args] of escapes) {
    test(`${name} ${JSON.stringify(args)} is refused`, async () => {
      await assert.rejects(async () => t[name].execute(args, live()), (e: Error) => e.message.startsWith(`${name}: `) && e.message.includes(`is outside the working directory ${root}`))
    })
  }

  test('nothing outside was written or created', async () => {
    assert.equal(await readFile(join(outside, 'secret.txt'), 'utf8'), 'top secret\n')
    await assert.rejects(stat(join(outside, 'created-through-link.txt')), { code: 'ENOENT' })
    await assert.rejects(stat(join(outside, 'new.txt')), { code: 'ENOENT' })
  })

  test('absolute paths and symlinks that stay inside are fine', async () => {
    assert.equal(text(await t.read_file.execute({ path: join(root, 'a.txt') }, live())), '     1\tinside')
    assert.equal(text(await t.read_file.execute({ path: 'link-inside' }, live())), '     1\tinside')
    assert.equal(text(await t.read_file.execute({ path: 'sub/../a.txt' }, live())), '     1\tinside')
  })

  test('grep and list_files do not follow symlinks out', async () => {
    const out = text(await t.grep.execute({ pattern: 'secret|inside' }, live()))
    assert.equal(out, 'a.txt:1:inside\n[1 matching line in 1 file; 2 files searched]')
    const listing = text(await t.list_files.execute({ recursive: true }, live()))
    assert.equal(listing, ['a.txt', 'dangling@', 'link-dir@', 'link-inside@', 'link-secret@', 'sub/', 'sub/b.txt'].join('\n'))
  })
})

describe('read_file', () => {
  test('line numbers, offset and limit, the note that says how to read on', async () => {
    const content = 'alpha\nbeta\r\ngamma\ndelta\nepsilon\n'
    const { root } = await ws({ 'f.txt': content })
    const t = await toolsFor(root)
    assert.equal(text(await t.read_file.execute({ path: 'f.txt' }, live())), '     1\talpha\n     2\tbeta\n     3\tgamma\n     4\tdelta\n     5\tepsilon')
    assert.equal(text(await t.read_file.execute({ path: 'f.txt', offset: 2, limit: 2 }, live())),
      `     2\tbeta\n     3\tgamma\n[lines 2-3 of f.txt shown; the file continues (${Buffer.byteLength(content)} bytes in all); read more with offset=4]`)
    assert.equal(text(await t.read_file.execute({ path: 'f.txt', offset: 4, limit: 2 }, live())), '     4\tdelta\n     5\tepsilon')
    assert.equal(text(await t.read_file.execute({ path: 'f.txt', offset: 5 }, live())), '     5\tepsilon')
    await assert.rejects(async () => t.read_file.execute({ path: 'f.txt', offset: 6 }, live()), {
      message: 'read_file: offset 6 is past the end of f.txt, which has 5 lines; use an offset from 1 to 5',
    })
  })

  test('a last line without newline, blank lines, empty file, directory, binary, missing', async () => {
    const { root } = await ws({ 'g.txt': 'x\n\ny', 'empty.txt': '', 'dir/keep': '', 'bin.dat': new Uint8Array([104, 105, 0, 1, 2]) })
    const t = await toolsFor(root)
    assert.equal(text(await t.read_file.execute({ path: 'g.txt' }, live())), '     1\tx\n     2\t\n     3\ty')
    assert.equal(text(await t.read_file.execute({ path: 'empty.txt' }, live())), '(empty.txt is empty: 0 bytes)')
    await assert.rejects(async () => t.read_file.execute({ path: 'dir' }, live()), { message: 'read_file: dir is a directory; use list_files to see what is in it' })
    await assert.rejects(async () => t.read_file.execute({ path: 'bin.dat' }, live()), {
      message: 'read_file: bin.dat looks binary (a NUL byte in its first 8192 bytes); read_file shows text files only',
    })
    await assert.rejects(async () => t.read_file.execute({ path: 'nope.txt' }, live()), { message: 'read_file: cannot use nope.txt: it does not exist; check the path with list_files' })
  })

  test('reads across 64 KiB chunks, with multi-byte characters split between them', async () => {
    const rows = Array.from({ length: 20_000 }, (_, i) => `row ${i + 1} üñï€😀`)
    const { root } = await ws({ 'big.txt': rows.join('\n') + '\n' })
    const t = await toolsFor(root)
    const out = text(await t.read_file.execute({ path: 'big.txt', offset: 15_000, limit: 3 }, live()))
    const size = Buffer.byteLength(rows.join('\n') + '\n')
    assert.equal(out, ` 15000\trow 15000 üñï€😀\n 15001\trow 15001 üñï€😀\n 15002\trow 15002 üñï€😀\n[lines 15000-15002 of big.txt shown; the file continues (${size} bytes in all); read more with offset=15003]`)
    const tail = text(await t.read_file.execute({ path: 'big.txt', offset: 19_999 }, live()))
    assert.equal(tail, ' 19999\trow 19999 üñï€😀\n 20000\trow 20000 üñï€😀')
  })

  test('output cap: whole lines up to maxOutputUnits, then a note with the next offset', async () => {
    const { root } = await ws({ 'big.txt': ('x'.repeat(99) + '\n').repeat(100) })
    const t = await toolsFor(root, { maxOutputUnits: 1000 })
    const out = text(await t.read_file.execute({ path: 'big.txt' }, live()))
    const [body, note] = [out.slice(0, out.lastIndexOf('\n')), out.slice(out.lastIndexOf('\n') + 1)]
    // each line is 6 digits + tab + 99 units = 106; 9 lines and 8 newlines = 962 <= 1000 < 1069
    assert.equal(body.length, 962)
    assert.equal(body.split('\n').length, 9)
    assert.equal(note, '[output capped at 1000 characters: lines 1-9 of big.txt shown; read more with offset=10]')
    const next = text(await t.read_file.execute({ path: 'big.txt', offset: 10, limit: 2 }, live()))
    assert.equal(next.split('\n')[0], `    10\t${'x'.repeat(99)}`)
  })

  test('a single line longer than the cap is cut without splitting a surrogate pair', async () => {
    const { root } = await ws({ 'long.txt': 'a'.repeat(5000) + '\nnext\n', 'emoji.txt': '😀'.repeat(600) })
    const t = await toolsFor(root, { maxOutputUnits: 1000 })
    const out = text(await t.read_file.execute({ path: 'long.txt' }, live()))
    assert.equal(out, `     1\t${'a'.repeat(993)}\n[line 1 of long.txt is longer than the output cap of 1000 characters and was cut; the next line is at offset=2; use grep to find text inside this line]`)
    assert.equal(text(await t.read_file.execute({ path: 'long.txt', offset: 2 }, live())), '     2\tnext')
    const emoji = text(await t.read_file.execute({ path: 'emoji.txt' }, live())).split('\n')[0]
    // 7 units of prefix + 992 units = 496 whole emoji; the 1000th unit would be half a pair
    assert.equal(emoji, `     1\t${'😀'.repeat(496)}`)
    assert.equal(emoji.length, 999)
  })
})

describe('list_files', () => {
  const files = {
    'a.txt': 'a', 'src/b.ts': 'b', 'src/lib/c.ts': 'c', 'src/lib/deep/d.ts': 'd',
    'node_modules/m/index.js': 'm', '.git/HEAD': 'ref', 'docs/readme.md': 'r',
  }
  test('one level; directories end with /', async () => {
    const { root } = await ws(files)
    const t = await toolsFor(root)
    assert.equal(text(await t.list_files.execute({}, live())), ['.git/', 'a.txt', 'docs/', 'node_modules/', 'src/'].join('\n'))
    assert.equal(text(await t.list_files.execute({ path: 'src' }, live())), ['src/b.ts', 'src/lib/'].join('\n'))
    assert.equal(text(await t.list_files.execute({ path: 'node_modules', recursive: true }, live())), ['node_modules/m/', 'node_modules/m/index.js'].join('\n'))
  })

  test('recursive, without descending into node_modules and .git', async () => {
    const { root } = await ws(files)
    const t = await toolsFor(root)
    assert.equal(text(await t.list_files.execute({ recursive: true }, live())), [
      '.git/', 'a.txt', 'docs/', 'docs/readme.md', 'node_modules/', 'src/', 'src/b.ts', 'src/lib/', 'src/lib/c.ts', 'src/lib/deep/', 'src/lib/deep/d.ts',
      '[not descended into: .git/, node_modules/; list them by path to see inside]',
    ].join('\n'))
  })

  test('entry cap (breadth-first) and output cap', async () => {
    const { root } = await ws(files)
    const capped = await toolsFor(root, { listMaxEntries: 7 })
    assert.equal(text(await capped.list_files.execute({ recursive: true }, live())), [
      '.git/', 'a.txt', 'docs/', 'docs/readme.md', 'node_modules/', 'src/', 'src/b.ts',
      '[listing stopped at 7 entries; list a subdirectory, or list without recursive, to see the rest]',
      '[not descended into: .git/, node_modules/; list them by path to see inside]',
    ].join('\n'))
    const narrow = await toolsFor(root, { maxOutputUnits: 20 })
    // '.git/\na.txt\ndocs/' is 17 units; adding '\nnode_modules/' would make 31
    assert.equal(text(await narrow.list_files.execute({}, live())),
      '.git/\na.txt\ndocs/\n[output capped at 20 characters: 2 more entries not shown; list a subdirectory to see them]')
  })

  test('empty directory, a file, a missing path', async () => {
    const { root } = await ws({ 'f.txt': 'x' })
    await mkdir(join(root, 'empty'))
    const t = await toolsFor(root)
    assert.equal(text(await t.list_files.execute({ path: 'empty' }, live())), '(empty is an empty directory)')
    await assert.rejects(async () => t.list_files.execute({ path: 'f.txt' }, live()), { message: 'list_files: f.txt is a file, not a directory; use read_file to read it' })
    await assert.rejects(async () => t.list_files.execute({ path: 'gone' }, live()), { message: 'list_files: cannot use gone: it does not exist; check the path with list_files' })
  })
})

describe('grep', () => {
  const files = {
    'README.md': 'Foo bar\n',
    'bin.dat': new Uint8Array([102, 111, 111, 0]),
    'node_modules/m/index.js': 'foo\n',
    'src/a.ts': 'const foo = 1\r\nlet bar = foo + 1\n',
    'src/b.js': 'foo()\n',
    'src/deep/c.ts': 'no match here\nfoo.bar\n',
    'long.txt': 'x'.repeat(600) + 'needle\n',
  }
  let t: Record<string, Tool>
  before(async () => { t = await toolsFor((await ws(files)).root) })

  const cases: [Record<string, unknown>, string][] = [
    [{ pattern: 'foo' }, [
      'src/a.ts:1:const foo = 1', 'src/a.ts:2:let bar = foo + 1', 'src/b.js:1:foo()', 'src/deep/c.ts:2:foo.bar',
      '[4 matching lines in 3 files; 5 files searched; skipped 1 binary file]'].join('\n')],
    [{ pattern: 'foo', ignore_case: true }, [
      'README.md:1:Foo bar', 'src/a.ts:1:const foo = 1', 'src/a.ts:2:let bar = foo + 1', 'src/b.js:1:foo()', 'src/deep/c.ts:2:foo.bar',
      '[5 matching lines in 4 files; 5 files searched; skipped 1 binary file]'].join('\n')],
    [{ pattern: 'foo', glob: '*.ts' }, [
      'src/a.ts:1:const foo = 1', 'src/a.ts:2:let bar = foo + 1', 'src/deep/c.ts:2:foo.bar', '[3 matching lines in 2 files; 2 files searched]'].join('\n')],
    [{ pattern: 'foo', glob: '*.{js,md}', ignore_case: true }, ['README.md:1:Foo bar', 'src/b.js:1:foo()', '[2 matching lines in 2 files; 2 files searched]'].join('\n')],
    [{ pattern: 'foo', glob: 'src/*/*.ts' }, ['src/deep/c.ts:2:foo.bar', '[1 matching line in 1 file; 1 file searched]'].join('\n')],
    [{ pattern: 'foo', glob: 'src/**/*.ts' }, [
      'src/a.ts:1:const foo = 1', 'src/a.ts:2:let bar = foo + 1', 'src/deep/c.ts:2:foo.bar', '[3 matching lines in 2 files; 2 files searched]'].join('\n')],
    [{ pattern: 'foo', path: 'src', glob: 'deep/*' }, ['src/deep/c.ts:2:foo.bar', '[1 matching line in 1 file; 1 file searched]'].join('\n')],
    [{ pattern: 'foo.bar', fixed_strings: true }, ['src/deep/c.ts:2:foo.bar', '[1 matching line in 1 file; 5 files searched; skipped 1 binary file]'].join('\n')],
    [{ pattern: 'foo + 1', fixed_strings: true, path: 'src/a.ts' }, ['src/a.ts:2:let bar = foo + 1', '[1 matching line in 1 file; 1 file searched]'].join('\n')],
    [{ pattern: '^foo\\(\\)$' }, ['src/b.js:1:foo()', '[1 matching line in 1 file; 5 files searched; skipped 1 binary file]'].join('\n')],
    [{ pattern: 'foo', max_matches: 2 }, [
      'src/a.ts:1:const foo = 1', 'src/a.ts:2:let bar = foo + 1',
      '[stopped at max_matches=2: 2 matching lines in 1 file; narrow the pattern, path or glob, or raise max_matches (up to 1000)]'].join('\n')],
    [{ pattern: 'needle' }, [`long.txt:1:${'x'.repeat(500)} [… 106 more characters]`, '[1 matching line in 1 file; 5 files searched; skipped 1 binary file]'].join('\n')],
    [{ pattern: 'zebra', path: 'src' }, 'no matches for /zebra/ in src (3 files searched)'],
    [{ pattern: 'zebra', fixed_strings: true, glob: '*.md' }, 'no matches for "zebra" in files matching *.md in . (1 file searched)'],
    [{ pattern: 'foo', path: 'node_modules' }, ['node_modules/m/index.js:1:foo', '[1 matching line in 1 file; 1 file searched]'].join('\n')],
  ]
  for (const [args, expected] of cases) {
    test(JSON.stringify(args), async () => { assert.equal(text(await t.grep.execute(args, live())), expected) })
  }

  test('an invalid regular expression says how to search literally', async () => {
    await assert.rejects(async () => t.grep.execute({ pattern: 'foo(' }, live()), (e: Error) =>
      e.message.startsWith('grep: "foo(" is not a valid JavaScript regular expression (') &&
      e.message.endsWith('); fix it, or pass fixed_strings: true to search for the text literally'))
  })

  test('output cap keeps whole match lines', async () => {
    const capped = await toolsFor((await ws(files)).root, { maxOutputUnits: 60 })
    // 'src/a.ts:1:const foo = 1' (24) + '\n' + 'src/a.ts:2:let bar = foo + 1' (28) = 53; the next line would pass 60
    assert.equal(text(await capped.grep.execute({ pattern: 'foo' }, live())), [
      'src/a.ts:1:const foo = 1', 'src/a.ts:2:let bar = foo + 1',
      '[output capped at 60 characters: 2 more matching lines not shown; narrow the path or glob]',
      '[4 matching lines in 3 files; 5 files searched; skipped 1 binary file]'].join('\n'))
  })
})

describe('write_file and edit_file', () => {
  test('write_file creates parent directories and overwrites', async () => {
    const { root } = await ws()
    const t = await toolsFor(root)
    assert.equal(text(await t.write_file.execute({ path: 'a/b/c.txt', content: 'héllo\n' }, live())), 'wrote 7 bytes to a/b/c.txt (new file)')
    assert.equal(await readFile(join(root, 'a/b/c.txt'), 'utf8'), 'héllo\n')
    assert.equal(text(await t.write_file.execute({ path: 'a/b/c.txt', content: '' }, live())), 'wrote 0 bytes to a/b/c.txt (replaced 7 bytes)')
    assert.equal(await readFile(join(root, 'a/b/c.txt'), 'utf8'), '')
    await assert.rejects(async () => t.write_file.execute({ path: 'a', content: 'x' }, live()), { message: 'write_file: a is a directory; give a file path' })
    await assert.rejects(async () => t.write_file.execute({ path: 'x.txt' }, live()), { message: 'write_file: the argument "content" is required' })
  })

  const original = 'function add(a, b) {\n  return a + b\n}\n\nfunction sub(a, b) {\n  return a - b\n}\n'
  const edits: { name: string; args: Record<string, unknown>; result?: string; error?: string; after?: string }[] = [
    { name: 'one match', args: { old_string: 'return a + b', new_string: 'return a + b + 0' }, result: 'edited f.js: replaced 1 occurrence (at line 2)',
      after: original.replace('return a + b', 'return a + b + 0') },
    { name: 'zero matches', args: { old_string: 'return a * b', new_string: 'x' },
      error: 'edit_file: old_string was not found in f.js (0 occurrences). Read the file again and copy the exact text, including indentation and whitespace.' },
    { name: 'zero matches with read_file line numbers', args: { old_string: '     2\t  return a + b', new_string: 'x' },
      error: 'edit_file: old_string was not found in f.js (0 occurrences). old_string seems to start lines with read_file line numbers ("    12\\t"); leave them out. Read the file again and copy the exact text, including indentation and whitespace.' },
    { name: 'two matches', args: { old_string: '(a, b) {', new_string: '(a, b, c) {' },
      error: 'edit_file: old_string occurs 2 times in f.js (at lines 1, 5); include more surrounding text to make it unique, or set replace_all: true to replace every occurrence' },
    { name: 'two matches, replace_all', args: { old_string: '(a, b) {', new_string: '(a, b, c) {', replace_all: true },
      result: 'edited f.js: replaced 2 occurrences (at lines 1, 5)', after: original.split('(a, b) {').join('(a, b, c) {') },
    { name: 'a multi-line old_string', args: { old_string: '}\n\nfunction sub', new_string: '}\nfunction sub' },
      result: 'edited f.js: replaced 1 occurrence (at line 3)', after: original.replace('}\n\nfunction sub', '}\nfunction sub') },
    { name: '$ patterns in new_string stay literal', args: { old_string: 'a - b', new_string: "$& $' $1" },
      result: 'edited f.js: replaced 1 occurrence (at line 6)', after: original.replace('a - b', () => "$& $' $1") },
    { name: 'empty old_string', args: { old_string: '', new_string: 'x' }, error: 'edit_file: old_string is empty; to create a file or replace all of it use write_file' },
    { name: 'no change', args: { old_string: 'add', new_string: 'add' }, error: 'edit_file: old_string and new_string are the same; nothing would change' },
  ]
  for (const edit of edits) {
    test(`edit_file: ${edit.name}`, async () => {
      const { root } = await ws({ 'f.js': original })
      const t = await toolsFor(root)
      const run = async () => t.edit_file.execute({ path: 'f.js', ...edit.args }, live())
      if (edit.error !== undefined) {
        await assert.rejects(run, { message: edit.error })
        assert.equal(await readFile(join(root, 'f.js'), 'utf8'), original, 'a failed edit leaves the file alone')
      } else {
        assert.equal(text(await run()), edit.result)
        assert.equal(await readFile(join(root, 'f.js'), 'utf8'), edit.after)
      }
    })
  }

  test('edit_file matches LF text against CRLF lines, and keeps CRLF', async () => {
    const { root } = await ws({ 'w.txt': 'one\r\ntwo\r\nthree\r\n' })
    const t = await toolsFor(root)
    assert.equal(text(await t.edit_file.execute({ path: 'w.txt', old_string: 'one\ntwo', new_string: 'ONE\nTWO' }, live())),
      'edited w.txt: replaced 1 occurrence (at line 1); matched with CRLF line endings')
    assert.equal(await readFile(join(root, 'w.txt'), 'utf8'), 'ONE\r\nTWO\r\nthree\r\n')
  })

  test('edit_file on a missing file points to write_file', async () => {
    const { root } = await ws()
    const t = await toolsFor(root)
    await assert.rejects(async () => t.edit_file.execute({ path: 'new.ts', old_string: 'a', new_string: 'b' }, live()), {
      message: 'edit_file: cannot use new.ts: it does not exist; to create a new file use write_file',
    })
  })
})

describe('shell', () => {
  let root: string, t: Record<string, Tool>
  before(async () => { root = (await ws({ 'hello.txt': 'hi\n' })).root; t = await toolsFor(root, { allowShell: true }) })
  const node = JSON.stringify(process.execPath)

  test('exit code 0: stdout, in the working directory', async () => {
    assert.equal(text(await t.shell.execute({ command: 'cat hello.txt && pwd' }, live())), `exit code 0\nstdout:\nhi\n${root}\n`)
    assert.equal(text(await t.shell.execute({ command: 'true' }, live())), 'exit code 0\n(no output)')
  })

  test('a non-zero exit is an error result with both streams', async () => {
    assert.deepEqual(await t.shell.execute({ command: 'echo out; echo err >&2; exit 3' }, live()),
      { content: 'exit code 3\nstdout:\nout\n\nstderr:\nerr\n', isError: true })
  })

  test('a timeout kills the command and its children (the process group)', async () => {
    const out = await t.shell.execute({ command: '(sleep 1; echo late > late.txt) & sleep 30; echo never', timeout_ms: 300 }, live())
    assert.deepEqual(out, { content: 'timed out after 300 ms; the command was killed (raise timeout_ms, up to 600000, if it needs longer)\n(no output)', isError: true })
    await new Promise((done) => setTimeout(done, 1500)) // a surviving background child would write late.txt by now
    await assert.rejects(stat(join(root, 'late.txt')), { code: 'ENOENT' })
  })

  test('the abort signal kills the command and keeps its output', async () => {
    const controller = new AbortController()
    const running = t.shell.execute({ command: 'echo started; sleep 30' }, { signal: controller.signal, callId: 'c' })
    setTimeout(() => controller.abort(), 300)
    assert.deepEqual(await running, { content: 'cancelled; the command was killed\nstdout:\nstarted\n', isError: true })
    const aborted = new AbortController(); aborted.abort()
    await assert.rejects(async () => t.shell.execute({ command: 'echo no' }, { signal: aborted.signal, callId: 'd' }), { message: 'shell: not run, the turn was cancelled' })
  })

  test('each stream keeps its head and tail within half of maxOutputUnits', async () => {
    const small = await toolsFor(root, { allowShell: true, maxOutputUnits: 100 })
    const script = `process.stdout.write('a'.repeat(500) + 'b'.repeat(500)); process.stderr.write('😀'.repeat(40))`
    const out = text(await small.shell.execute({ command: `${node} -e ${JSON.stringify(script)}` }, live()))
    // half = 50 units per stream: first 25 and last 25; stderr's 80 units lose a pair at each cut
    assert.equal(out, [
      'exit code 0', 'stdout:', 'a'.repeat(25), '[… 950 characters of stdout cut here …]', 'b'.repeat(25),
      'stderr:', '😀'.repeat(12), '[… 32 characters of stderr cut here …]', '😀'.repeat(12)].join('\n'))
  })

  test('timeout_ms is checked', async () => {
    await assert.rejects(async () => t.shell.execute({ command: 'true', timeout_ms: 0 }, live()), { message: 'shell: "timeout_ms" must be an integer from 1 to 600000 (milliseconds), got 0' })
    await assert.rejects(async () => t.shell.execute({ command: '  ' }, live()), { message: 'shell: "command" is empty' })
  })
})

describe('parseCliArgs', () => {
  const key = { DEEPSEEK_API_KEY: 'sk-test' }
  const runDefaults = {
    command: 'run', model: 'deepseek-flash', baseURL: 'https://api.deepseek.com', apiKey: 'sk-test', apiKeyEnv: 'DEEPSEEK_API_KEY',
    prompt: undefined, print: false, contextWindow: undefined, maxTokens: undefined, session: undefined, threshold: 0.8, json: false, allowShell: false, noShell: false,
    projectInstructions: true, yes: false, continue: false, resume: false, noSave: false, approvals: { tools: [], commands: [] }, retentionDays: 30,
  }
  // Configuration files as main reads them (docs/design.md §8): the user's, and a trusted project's.
  const user = (config: object) => ({ user: { file: '/u/config.json', config } })
  const both = (u: object, p: object) => ({ user: { file: '/u/config.json', config: u }, project: { file: '/p/.dsh/config.json', config: p } })
  const replayDefaults = { command: 'replay', file: 's.jsonl', contextWindow: undefined, threshold: 0.8, json: false, summaryTokens: 2000, format: 'auto', sidechains: false }
  const noKey = 'no API key: set DEEPSEEK_API_KEY (or --api-key-env NAME), or point --base-url at a server that needs none'

  const rows: { argv: string[]; env?: Record<string, string | undefined>; files?: CliConfigFiles; expect: CliOptions | Record<string, unknown> | string }[] = [
    { argv: [], env: key, expect: runDefaults },
    { argv: ['--no-project-instructions', 'go'], env: key, expect: { ...runDefaults, prompt: 'go', projectInstructions: false } },
    { argv: ['show', 's.jsonl', '--checkpoints'], env: {}, expect: { command: 'show', file: 's.jsonl', checkpoints: true } },
    { argv: ['show', 's.jsonl'], env: {}, expect: { command: 'show', file: 's.jsonl', checkpoints: false } },
    { argv: ['fix the test'], env: key, expect: { ...runDefaults, prompt: 'fix the test' } },
    { argv: ['-p', 'fix the test'], env: key, expect: { ...runDefaults, prompt: 'fix the test', print: true } },
    { argv: ['--print=a=b'], env: key, expect: { ...runDefaults, prompt: 'a=b', print: true } },
    { argv: ['-p', '--json'], env: key, expect: { ...runDefaults, prompt: '--json', print: true } },
    { argv: ['--', '--json'], env: key, expect: { ...runDefaults, prompt: '--json' } },
    { argv: ['--model', 'deepseek-v4-pro', '--context-window', '1048576', '--max-tokens', '8192', '--session', 's.jsonl', '--threshold', '.5', '--json', '--allow-shell', 'go'], env: key,
      expect: { ...runDefaults, model: 'deepseek-v4-pro', contextWindow: 1048576, maxTokens: 8192, session: 's.jsonl', threshold: 0.5, json: true, allowShell: true, prompt: 'go' } },
    { argv: ['--threshold=1', '--model=a', '--model=b'], env: key, expect: { ...runDefaults, threshold: 1, model: 'b' } },
    { argv: [], env: { ...key, DSH_MODEL: 'deepseek-v4-pro', DSH_BASE_URL: 'https://api.deepseek.com/' }, expect: { ...runDefaults, model: 'deepseek-v4-pro' } },
    { argv: ['--model', 'x'], env: { ...key, DSH_MODEL: 'y' }, expect: { ...runDefaults, model: 'x' } },
    // keys
    { argv: [], env: {}, expect: noKey },
    { argv: [], env: { DEEPSEEK_API_KEY: '' }, expect: noKey },
    { argv: ['--base-url', 'https://api.deepseek.com'], env: {}, expect: noKey },
    { argv: ['--base-url', 'http://127.0.0.1:8080/v1/', '--model', 'm'], env: {},
      expect: { ...runDefaults, baseURL: 'http://127.0.0.1:8080/v1', model: 'm', apiKey: undefined, apiKeyEnv: undefined } },
    { argv: ['--base-url', 'http://localhost:11434/v1'], env: key, // the DeepSeek key is not sent elsewhere
      expect: { ...runDefaults, baseURL: 'http://localhost:11434/v1', apiKey: undefined, apiKeyEnv: undefined } },
    { argv: [], env: { DSH_BASE_URL: 'http://127.0.0.1:9/v1' }, expect: { ...runDefaults, baseURL: 'http://127.0.0.1:9/v1', apiKey: undefined, apiKeyEnv: undefined } },
    { argv: ['--base-url', 'https://openrouter.ai/api/v1', '--api-key-env', 'OR_KEY'], env: { OR_KEY: 'or-1' },
      expect: { ...runDefaults, baseURL: 'https://openrouter.ai/api/v1', apiKey: 'or-1', apiKeyEnv: 'OR_KEY' } },
    { argv: ['--api-key-env', 'MY_KEY'], env: key, expect: 'no API key: --api-key-env names MY_KEY, but MY_KEY is not set; set it (export MY_KEY=...) or drop the flag' },
    { argv: ['--api-key-env', 'sk-12345'], env: key, expect: '--api-key-env takes the NAME of an environment variable that holds the key (e.g. --api-key-env OPENROUTER_API_KEY), not the key itself' },
    { argv: ['--base-url', 'localhost:8080'], env: key, expect: '--base-url must be an http(s) URL such as http://127.0.0.1:8080/v1, got "localhost:8080"' },
    { argv: [], env: { DSH_BASE_URL: 'ftp://x' }, expect: 'DSH_BASE_URL must be an http(s) URL such as http://127.0.0.1:8080/v1, got "ftp://x"' },
    // numbers
    { argv: ['--context-window', '0'], env: key, expect: '--context-window must be a positive whole number of tokens, got "0" (e.g. --context-window 128000)' },
    { argv: ['--context-window', '-5'], env: key, expect: '--context-window must be a positive whole number of tokens, got "-5" (e.g. --context-window 128000)' },
    { argv: ['--context-window', '128k'], env: key, expect: '--context-window must be a positive whole number of tokens, got "128k" (e.g. --context-window 128000)' },
    { argv: ['--max-tokens', '1.5'], env: key, expect: '--max-tokens must be a positive whole number of tokens, got "1.5" (e.g. --max-tokens 8192)' },
    { argv: ['--max-tokens', '16000', '--context-window', '16000'], env: key, expect: '--max-tokens 16000 must be below --context-window 16000: the prompt needs room too' },
    ...['0', '1.5', '80', 'abc', ''].map((r) => ({ argv: ['--threshold', r], env: key,
      expect: `--threshold must be a ratio of the context window greater than 0 and at most 1, got ${JSON.stringify(r)} (e.g. --threshold 0.8 for 80%)` })),
    // flags
    { argv: ['--model'], env: key, expect: '--model needs a value: --model NAME' },
    { argv: ['--model', '--json'], env: key, expect: '--model needs a value: --model NAME' },
    { argv: ['-p'], env: key, expect: '-p needs a value: --print PROMPT' },
    { argv: ['--contex-window', '5'], env: key, expect: 'unknown option --contex-window (did you mean --context-window?); run with --help for the list' },
    { argv: ['--verbose'], env: key, expect: 'unknown option --verbose; run with --help for the list' },
    { argv: ['-x'], env: key, expect: 'unknown option -x; run with --help for the list' },
    { argv: ['--json=yes'], env: key, expect: '--json takes no value (got "--json=yes")' },
    { argv: ['--summary-tokens', '5'], env: key, expect: '--summary-tokens only applies to replay: npx tsx dsh.ts replay FILE --summary-tokens N' },
    { argv: ['-p', 'a', 'b'], env: key, expect: 'give the prompt once: either -p "PROMPT" or a positional "PROMPT", not both (extra: "b")' },
    { argv: ['fix', 'the', 'bug'], env: key, expect: 'the prompt must be one argument; quote it: npx tsx dsh.ts "fix the bug"' },
    { argv: ['-p', ' '], env: key, expect: 'the prompt is empty; give a task, e.g. -p "explain src/main.ts"' },
    { argv: ['--session='], env: key, expect: '--session needs a file name, e.g. --session work.jsonl' },
    // help and version work without configuration
    { argv: ['--help'], env: {}, expect: { command: 'help' } },
    { argv: ['--bogus', '-h'], env: {}, expect: { command: 'help' } },
    { argv: ['replay', '--help'], env: {}, expect: { command: 'help' } },
    { argv: ['--version'], env: {}, expect: { command: 'version' } },
    { argv: ['--', '--help'], env: key, expect: { ...runDefaults, prompt: '--help' } },
    // replay
    { argv: ['replay', 's.jsonl'], env: {}, expect: replayDefaults },
    { argv: ['replay', 's.jsonl'], env: key, expect: replayDefaults },
    { argv: ['replay', '--context-window', '32000', 's.jsonl', '--threshold', '0.9', '--json', '--summary-tokens', '500', '--format', 'claude-code'], env: {},
      expect: { ...replayDefaults, contextWindow: 32000, threshold: 0.9, json: true, summaryTokens: 500, format: 'claude-code' } },
    { argv: ['replay', 's.jsonl', '--sidechains'], env: {}, expect: { ...replayDefaults, sidechains: true } },
    { argv: ['replay', 's.jsonl', '--model', 'deepseek-v4-pro'], env: key,
      expect: { ...replayDefaults, summarizer: { model: 'deepseek-v4-pro', baseURL: 'https://api.deepseek.com', apiKey: 'sk-test', apiKeyEnv: 'DEEPSEEK_API_KEY' } } },
    { argv: ['replay', 's.jsonl', '--base-url', 'http://127.0.0.1:8080'], env: key,
      expect: { ...replayDefaults, summarizer: { model: 'deepseek-flash', baseURL: 'http://127.0.0.1:8080' } } },
    { argv: ['replay', 's.jsonl', '--model', 'deepseek-v4-pro'], env: {}, expect: noKey },
    { argv: ['replay'], env: {}, expect: 'replay needs a FILE: npx tsx dsh.ts replay FILE [--context-window N]' },
    { argv: ['replay', 'a', 'b'], env: {}, expect: 'replay takes one FILE, got 2 ("a", "b")' },
    { argv: ['replay', 's.jsonl', '--format', 'xml'], env: {}, expect: '--format must be one of auto, mini-swe-agent, swe-agent, openai, dsh, claude-code, got "xml"' },
    { argv: ['replay', 's.jsonl', '--allow-shell'], env: {},
      expect: '--allow-shell does not apply to replay; replay takes --model, --base-url, --api-key-env, --context-window, --threshold, --json, --no-clear, --cwd, --summary-tokens, --format, --sidechains, --prices' },
    // -C/--cwd, --max-steps, --no-shell
    { argv: ['-C', '../proj', '--max-steps', '7', '--no-shell'], env: key, expect: { ...runDefaults, cwd: '../proj', maxSteps: 7, noShell: true } },
    { argv: ['--cwd=/abs'], env: key, expect: { ...runDefaults, cwd: '/abs' } },
    { argv: ['replay', 's.jsonl', '-C', 'proj'], env: {}, expect: { ...replayDefaults, cwd: 'proj' } },
    { argv: ['-C'], env: key, expect: '-C needs a value: --cwd DIR' },
    { argv: ['--cwd='], env: key, expect: '-C/--cwd needs a directory, e.g. -C ../my-project' },
    { argv: ['--max-steps', '0'], env: key, expect: '--max-steps must be a positive whole number of provider calls per turn, got "0" (e.g. --max-steps 50)' },
    { argv: ['--allow-shell', '--no-shell'], env: key, expect: '--allow-shell and --no-shell contradict each other; give one' },
    { argv: ['replay', 's.jsonl', '--summary-tokens', '0'], env: {}, expect: '--summary-tokens must be a positive whole number of tokens, got "0" (e.g. --summary-tokens 2000)' },
    // sessions, approvals, -p - (issue 27)
    { argv: ['-c', '-y'], env: key, expect: { ...runDefaults, continue: true, yes: true } },
    { argv: ['--continue', '--yes', '--resume'], env: key, expect: '--continue and --resume contradict each other: each says which session to use (--session FILE, --continue the newest, --resume a listed one, --no-save none); give one' },
    { argv: ['--no-save', '--session', 's.jsonl'], env: key, expect: '--session and --no-save contradict each other: each says which session to use (--session FILE, --continue the newest, --resume a listed one, --no-save none); give one' },
    { argv: ['--resume'], env: key, expect: { ...runDefaults, resume: true } },
    { argv: ['-p', '-'], env: key, expect: { ...runDefaults, print: true } },
    // configuration: flags, then the environment, then the project's file, then the user's
    { argv: [], env: {}, files: user({ baseURL: 'http://127.0.0.1:8080/v1', model: 'u-model', contextWindow: 32768 }),
      expect: { ...runDefaults, baseURL: 'http://127.0.0.1:8080/v1', model: 'u-model', contextWindow: 32768, apiKey: undefined, apiKeyEnv: undefined } },
    { argv: [], env: {}, files: both({ baseURL: 'http://127.0.0.1:8080/v1', model: 'u-model', contextWindow: 32768 }, { model: 'p-model', contextWindow: 8192 }),
      expect: { ...runDefaults, baseURL: 'http://127.0.0.1:8080/v1', model: 'p-model', contextWindow: 8192, apiKey: undefined, apiKeyEnv: undefined } },
    { argv: [], env: { DSH_MODEL: 'e-model', DSH_CONTEXT_WINDOW: '4096', DSH_BASE_URL: 'http://127.0.0.1:9/v1' }, files: both({ model: 'u-model' }, { model: 'p-model', contextWindow: 8192, baseURL: 'http://10.0.0.1/v1' }),
      expect: { ...runDefaults, baseURL: 'http://127.0.0.1:9/v1', model: 'e-model', contextWindow: 4096, apiKey: undefined, apiKeyEnv: undefined } },
    { argv: ['--model', 'f-model', '--context-window', '2048', '--base-url', 'http://127.0.0.1:7/v1'], env: { DSH_MODEL: 'e-model', DSH_CONTEXT_WINDOW: '4096' }, files: both({}, { model: 'p-model', contextWindow: 8192 }),
      expect: { ...runDefaults, baseURL: 'http://127.0.0.1:7/v1', model: 'f-model', contextWindow: 2048, apiKey: undefined, apiKeyEnv: undefined } },
    { argv: [], env: { ...key, DSH_CONTEXT_WINDOW: '32k' }, expect: 'DSH_CONTEXT_WINDOW must be a positive whole number of tokens, got "32k" (e.g. export DSH_CONTEXT_WINDOW=128000)' },
    { argv: [], env: {}, files: user({ baseURL: 'http://api.deepseek.com' }), expect: '"baseURL" in /u/config.json "http://api.deepseek.com" would send the DeepSeek API key unencrypted; use https://api.deepseek.com' },
    { argv: [], env: key, files: both({ approvals: { tools: ['edit_file'], commands: ['npm test'] }, retentionDays: 7, sandbox: { allowNetwork: true } }, { approvals: { tools: ['write_file'], commands: ['npm test', 'git status'] }, sandbox: false, prices: { cacheHitInput: 1, cacheMissInput: 2, output: 3 } }),
      expect: { ...runDefaults, approvals: { tools: ['edit_file', 'write_file'], commands: ['npm test', 'git status'] }, retentionDays: 7, sandboxConfig: false, prices: { cacheHitInput: 1, cacheMissInput: 2, output: 3 } } },
    { argv: ['replay', 's.jsonl'], env: {}, files: user({ contextWindow: 32768, model: 'u' }), expect: replayDefaults }, // replay reads no configuration
  ]
  for (const row of rows) {
    test(`${JSON.stringify(row.argv)} ${JSON.stringify(row.env ?? {})}`, () => {
      const run = () => parseCliArgs(row.argv, row.env ?? {}, row.files)
      if (typeof row.expect === 'string') {
        assert.throws(run, (e: unknown) => e instanceof UsageError && e.exitCode === 2 && e.message === row.expect && !e.message.includes('\n'),
          `expected UsageError: ${row.expect}`)
      } else {
        // undefined fields count as absent
        const expected = Object.fromEntries(Object.entries(row.expect).filter(([, v]) => v !== undefined))
        const actual = Object.fromEntries(Object.entries(run()).filter(([, v]) => v !== undefined))
        assert.deepEqual(actual, expected)
      }
    })
  }

  test('the API key never appears in an error message', () => {
    for (const argv of [['--api-key-env', 'sk-secret-value'], ['--api-key-env=sk-secret-value']]) {
      assert.throws(() => parseCliArgs(argv, {}), (e: Error) => e instanceof UsageError && !e.message.includes('sk-secret-value'))
    }
  })
})

/** What `npm pack` ships (package.json "files"), as path prefixes. */
const PACKAGE_FILES: string[] = JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')).files.map((f: string) => f.replace(/\*.*$/, ''))

describe('runCliBasics, cliHelp(), isEntryPoint', () => {
  function capture() {
    const io = { out: '', err: '', stdout(s: string) { io.out += s }, stderr(s: string) { io.err += s } }
    return io
  }

  test('--help, --version, a usage error, and options to run', () => {
    let io = capture()
    assert.deepEqual(runCliBasics(['--help'], {}, io), { exitCode: 0 })
    assert.equal(io.out, cliHelp()); assert.equal(io.err, '')
    io = capture()
    assert.deepEqual(runCliBasics(['--version'], {}, io), { exitCode: 0 })
    assert.equal(io.out, `dsh.ts ${VERSION}\n`)
    io = capture()
    assert.deepEqual(runCliBasics(['-p', 'hi'], {}, io), { exitCode: 2 })
    assert.equal(io.err, 'dsh: no API key: set DEEPSEEK_API_KEY (or --api-key-env NAME), or point --base-url at a server that needs none\n')
    assert.equal(io.out, '')
    io = capture()
    const result = runCliBasics(['replay', 'x.json'], {}, io)
    assert.ok('options' in result && result.options.command === 'replay' && result.options.file === 'x.json')
    assert.equal(io.out + io.err, '')
  })

  test('the help names every flag, the environment, the exit codes and a replay example', () => {
    for (const word of ['-p, --print PROMPT', '--model NAME', '--base-url URL', '--api-key-env NAME', '--context-window N', '--max-tokens N',
      '--session FILE', '--threshold R', '--json', '--allow-shell', '--no-project-instructions', '-h, --help', '--version', '--summary-tokens N', '--format F',
      'DEEPSEEK_API_KEY', 'DSH_BASE_URL', 'DSH_MODEL', '0  done', '1  the provider or a tool failed', '2  usage error',
      'npx tsx dsh.ts replay examples/', 'deepseek-flash', 'https://api.deepseek.com', '(default 0.8)', '(default 2000)',
      // issue 27: every new flag, command and variable
      '-c, --continue', '--resume', '--no-save', '-y, --yes', '-p - reads PROMPT from stdin', '/diff', '/undo', '/permissions', '/sessions', 'DSH_CONTEXT_WINDOW',
      'XDG_STATE_HOME', '.dsh/config.json', 'Precedence: flags, then DSH_MODEL / DSH_BASE_URL / DSH_CONTEXT_WINDOW, then', '"retentionDays": 30',
      // issue 27 items 6–8: /model, the terminal, /compact
      '/model NAME [--context-window N]', '/compact [FOCUS]', '/context', 'a spinner names the running tool', 'at the prompt it clears what is typed', 'by 5 points']) {
      assert.ok(cliHelp('npx tsx dsh.ts').includes(word), `help lacks ${JSON.stringify(word)}`)
    }
    for (const name of ['dsh', 'npx tsx dsh.ts']) assert.ok(cliHelp(name).split('\n').every((line) => line.length <= 100), `help lines fit a terminal (${name})`)
  })

  test('--help shows the name it was run as; installed (dsh), its examples name only what the package ships', () => {
    const installed = cliHelp()
    assert.equal(installed, cliHelp('dsh'))
    assert.match(installed, /^  dsh -p "PROMPT" {22}the same \(--print\)$/m)
    assert.doesNotMatch(installed, /npx tsx|examples\//)
    assert.match(cliHelp('npx tsx dsh.ts'), /^  npx tsx dsh.ts replay examples\/session\.jsonl --context-window 32000$/m)
  })

  test('--help shows the name it was run as: from the source `npx tsx dsh.ts`', async () => {
    const run = await dsh(['--help'], ROOT)
    assert.equal(run.code, 0, run.stderr)
    assert.equal(run.stdout, cliHelp('npx tsx dsh.ts'))
  })

  test('--help examples are commands that work: each parses (installed `dsh` and from the source), and names no file the package lacks', () => {
    for (const name of ['dsh', 'npx tsx dsh.ts']) {
      const help = cliHelp(name)
      const examples = help.slice(help.indexOf('\nExamples\n') + 10).split('\n').filter((l) => l.startsWith(`  ${name} `))
      assert.ok(examples.length >= 6, help)
      for (const line of examples) {
        const command = line.slice(`  ${name} `.length).replace(/\s+#.*$/, '')
        const args = [...command.matchAll(/"([^"]*)"|(\S+)/g)].map((m) => m[1] ?? m[2])
        assert.doesNotThrow(() => parseCliArgs(args, { DEEPSEEK_API_KEY: 'sk-test' }), `${line}`)
        // Unquoted file arguments exist in what the package ships (placeholders in capitals aside).
        for (const arg of command.replace(/"[^"]*"/g, '').split(/\s+/).filter((a) => /\.(jsonl|json|ts|md)$/.test(a))) {
          assert.ok(name !== 'dsh' || PACKAGE_FILES.some((f) => arg === f || arg.startsWith(f)), `${line}: ${arg} is not in the package`)
          assert.ok(existsSync(join(ROOT, arg)), `${line}: ${arg} does not exist`)
        }
      }
    }
  })

  test('isEntryPoint: import.meta.main wins; else realpaths are compared; never true without a file URL', async () => {
    const { base } = await ws({ 'main.mjs': '' })
    const script = join(base, 'work', 'main.mjs')
    await symlink(script, join(base, 'bin-link'))
    const url = pathToFileURL(script).href
    const cases: [{ url?: string; main?: unknown; argv1?: string }, boolean][] = [
      [{ main: true }, true],
      [{ main: false, url, argv1: script }, false],
      [{ url, argv1: script }, true],
      [{ url, argv1: join(base, 'bin-link') }, true],
      [{ url, argv1: join(base, 'work', '..', 'work', 'main.mjs') }, true],
      [{ url, argv1: fileURLToPath(import.meta.url) }, false],
      [{ url, argv1: join(base, 'missing.mjs') }, false],
      [{ url }, false],
      [{ url: 'https://example.com/dsh.mjs', argv1: script }, false],
      [{}, false], // the IIFE bundle: no import.meta.url
    ]
    for (const [probe, expected] of cases) assert.equal(await isEntryPoint(probe), expected, JSON.stringify(probe))
    assert.equal(await isEntryPoint(), false, 'importing dsh.ts from a test is not running it')
  })
})
