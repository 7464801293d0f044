// grep under a hostile model (docs/design.md §13): catastrophic patterns, quadratic patterns on
// minified lines and exponential globs run in a worker under a deadline; abort ends it at once.
import { test, describe, after } from 'node:test'
import assert from 'node:assert/strict'
import { mkdtemp, mkdir, realpath, rm, writeFile } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { builtinTools, BUILTIN_TOOL_DEFAULTS, type Tool } from '../dsh.ts'
import { startFakeProvider } from './fake-provider.ts'
import { runDsh } from './cli-child.ts'
import { rejection } from './hostile.ts'

const temps: string[] = []
after(async () => { for (const dir of temps) await rm(dir, { recursive: true, force: true }) })
async function workdir(files: Record<string, string>): Promise<string> {
  const dir = await realpath(await mkdtemp(join(tmpdir(), 'dsh-grep-')))
  temps.push(dir)
  for (const [name, text] of Object.entries(files)) { await mkdir(join(dir, name, '..'), { recursive: true }); await writeFile(join(dir, name), text) }
  return dir
}
const live = () => ({ signal: new AbortController().signal, callId: 'c' })
async function grep(cwd: string, options: Record<string, number> = {}): Promise<Tool> {
  return (await builtinTools({ cwd, ...options })).find((t) => t.name === 'grep')!
}
const MINIFIED = 'var a=1;'.repeat(300_000 / 8) // one 300 KB line, no TODO in it

describe('grep runs where it can be stopped', () => {
  test('defaults', () => {
    assert.equal(BUILTIN_TOOL_DEFAULTS.grepTimeoutMs, 30_000)
    assert.equal(BUILTIN_TOOL_DEFAULTS.grepMaxLineUnits, 10_000)
  })

  test('(a+)+$ on a 40-character line: a clear error at the time limit, promptly', async () => {
    const cwd = await workdir({ 'x.txt': 'a'.repeat(40) + '!\n' })
    const started = Date.now()
    await assert.rejects(async () => (await grep(cwd, { grepTimeoutMs: 300 })).execute({ pattern: '(a+)+$' }, live()),
      { message: 'grep: stopped at the time limit of 300 ms (grepTimeoutMs); the pattern may backtrack without end (nested quantifiers such as (a+)+) or the search is too wide: simplify the pattern, use fixed_strings: true, or narrow path or glob' })
    assert.ok(Date.now() - started < 2_000, `${Date.now() - started} ms`)
  })

  test('.*TODO.* over a 300 KB minified line returns at once: the long line is counted, not matched', async () => {
    const cwd = await workdir({ 'app.min.js': MINIFIED + '\n// TODO: short line\n' })
    const started = Date.now()
    const out = await (await grep(cwd)).execute({ pattern: '.*TODO.*' }, live())
    assert.equal(out, 'app.min.js:2:// TODO: short line\n[1 matching line in 1 file; 1 file searched; skipped 1 line over 10000 characters (first at app.min.js:1; search them with fixed_strings: true)]')
    assert.ok(Date.now() - started < 3_000, `${Date.now() - started} ms`)
    const literal = await (await grep(cwd)).execute({ pattern: 'a=1;var', fixed_strings: true, max_matches: 1 }, live()) as string
    assert.match(literal, /^app\.min\.js:1:var a=1;/)
  })

  test('an exponential glob over a long file name is stopped by the time limit', async () => {
    const cwd = await workdir({ [`${'a'.repeat(60)}.txt`]: 'hit\n' })
    await assert.rejects(async () => (await grep(cwd, { grepTimeoutMs: 300 })).execute({ pattern: 'hit', glob: '*a*a*a*a*a*a*a*a*a*a*a*a*b' }, live()), /time limit of 300 ms/)
  })

  test('abort ends a running search at once', async () => {
    const cwd = await workdir({ 'x.txt': 'a'.repeat(40) + '!\n' })
    const controller = new AbortController()
    const started = Date.now()
    setTimeout(() => controller.abort(), 100)
    await assert.rejects(async () => (await grep(cwd)).execute({ pattern: '(a+)+$' }, { signal: controller.signal, callId: 'c' }), { message: 'grep: cancelled' })
    assert.ok(Date.now() - started < 1_500, `${Date.now() - started} ms`)
  })

  test('CLI: the model calls grep with (a+)+$ and Ctrl-C ends the turn at once', async () => {
    const cwd = await workdir({ 'x.txt': 'a'.repeat(40) + '!\n' })
    const f = await startFakeProvider({ script: [{ toolCalls: [{ id: 'g', name: 'grep', arguments: { pattern: '(a+)+$' } }] }, { text: 'never' }] })
    try {
      let sentAt = 0
      const run = await runDsh(['-p', 'find it', '--base-url', f.url, '--model', 'm', '--context-window', '16000', '--session', 's.jsonl'], cwd, undefined, (child) => {
        const poll = setInterval(() => { if (f.requests.length >= 1) { clearInterval(poll); setTimeout(() => { sentAt = Date.now(); child.kill('SIGINT') }, 300) } }, 20)
      })
      assert.equal(run.code, 130, run.stderr)
      assert.ok(Date.now() - sentAt < 3_000, `exited ${Date.now() - sentAt} ms after Ctrl-C`)
      assert.match(run.stderr, /cancelling the turn/)
    } finally { await f.close() }
  })
})

describe('a huge pattern is refused, and no error quotes a pattern whole', () => {
  const text = async (run: unknown) => { try { return JSON.stringify(await run) } catch (error) { return (error as Error).message } }
  test('5,000,000 characters: refused at once with the length and the limit (the worker failed, quoting all 5 MB back to the model)', async () => {
    const g = await grep(await workdir({ 'a.txt': 'hello\n' }))
    const said = await text(g.execute({ pattern: 'x'.repeat(5_000_000) }, live()))
    assert.equal(said, 'grep: "pattern" is 5000000 characters long; the limit is 32767: search for a shorter part of the text')
  })

  test('32,767 characters of a pattern are searched (a fixed string, a regular expression), 32,768 are refused', async () => {
    const line = 'ab'.repeat(40_000)
    const g = await grep(await workdir({ 'a.txt': `${line}\n` }), { grepMaxLineUnits: 100_000 })
    assert.match(await text(g.execute({ pattern: 'ab'.repeat(16_383) + 'a', fixed_strings: true }, live())), /^"a\.txt:1:/)
    assert.match(await text(g.execute({ pattern: '(?:ab)'.repeat(5_461) }, live())), /^"a\.txt:1:/)
    assert.match(await text(g.execute({ pattern: 'x'.repeat(32_768) }, live())), /^grep: "pattern" is 32768 characters long; the limit is 32767/)
  })

  test('an invalid pattern is quoted at most 200 code points long, without the engine quoting it again (it was quoted twice, whole)', async () => {
    const g = await grep(await workdir({ 'a.txt': 'hello\n' }))
    const said = await text(g.execute({ pattern: '(' + 'x'.repeat(30_000) }, live()))
    assert.equal(said, `grep: "(${'x'.repeat(199)}…" is not a valid JavaScript regular expression (invalid regular expression: Unterminated group); fix it, or pass fixed_strings: true to search for the text literally`)
  })
})

// From the Low breaks of the third attack table (docs/reliability.md, "Attack table (round 3)").
test('grep: an invalid glob is a grep: error that says how to fix it (it was a bare "Invalid regular expression")', async () => {
  const g = await grep(await workdir({ 'a.ts': 'x\n' }))
  assert.equal(await rejection(g.execute({ pattern: 'x', glob: '[z-a]' }, live())),
    'grep: "glob" "[z-a]" is not a valid glob (Range out of order in character class); fix it, e.g. "*.ts" or "src/**/*.{js,mjs}", or leave it out')
  const long = await rejection(g.execute({ pattern: 'x', glob: 'g'.repeat(100_000) + '[z-a]' }, live()))
  assert.equal(long, `grep: "glob" "${'g'.repeat(200)}…" is not a valid glob (Range out of order in character class); fix it, e.g. "*.ts" or "src/**/*.{js,mjs}", or leave it out`)
  assert.equal(await g.execute({ pattern: 'x', glob: '*.ts' }, live()), 'a.ts:1:x\n[1 matching line in 1 file; 1 file searched]')
})
