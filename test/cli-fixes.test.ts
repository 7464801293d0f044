// The smaller fixes of issue 27 (item 8) that live in the CLI: `-p -`, the name --help shows, the 404 hint.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { existsSync, readFileSync } from 'node:fs'
import { join } from 'node:path'
import { cliHelp, parseCliArgs } from '../dsh.ts'
import { CLEAN_ENV, DSH, ROOT, TSX, dsh, fake, lines, runFlags, runProcess, tempDir } from './cli-helpers.ts'

test('-p - reads the prompt from stdin (one-shot: the answer on stdout)', async () => {
  const f = await fake([{ text: 'read from stdin' }])
  const run = await runProcess(process.execPath, ['--import', TSX, DSH, '-p', '-', ...runFlags(f), '--no-save'], await tempDir(), CLEAN_ENV, 'the task\non two lines\n')
  assert.equal(run.code, 0, run.stderr)
  assert.equal(run.stdout, 'read from stdin\n')
  assert.equal(f.requests[0].body.messages.at(-1).content, 'the task\non two lines\n')
})

test('--help shows the name it was run as: from the source `npx tsx dsh.ts`', async () => {
  const run = await dsh(['--help'], ROOT)
  assert.equal(run.code, 0, run.stderr)
  assert.equal(run.stdout, cliHelp('npx tsx dsh.ts'))
})

test('an HTTP 404 names the base URL dsh posted to and what to check', async () => {
  const f = await fake(() => ({ status: 404, body: 'Cannot POST /chat/completions' }))
  const run = await dsh(['-p', 'hi', ...runFlags(f), '--no-save'], await tempDir())
  assert.equal(run.code, 1)
  assert.ok(lines(run.stderr).at(-1)!.endsWith(` dsh posts to BASE/chat/completions with the base URL ${f.url} (--base-url, DSH_BASE_URL or "baseURL" in a configuration file): check it (most servers want it to end in /v1, e.g. http://127.0.0.1:8080/v1), and the model name`), run.stderr)
  assert.equal(f.requests.length, 1, 'a 404 is not retried')
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

/** What `npm pack` ships (package.json "files"), as path prefixes. */
const PACKAGE_FILES: string[] = JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')).files.map((f: string) => f.replace(/\*.*$/, ''))
