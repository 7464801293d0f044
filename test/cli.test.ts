// End-to-end tests of the CLI (docs/design.md §8, issue 5): `node --import tsx dsh.ts …` as a child
// process against test/fake-provider.ts (real HTTP on 127.0.0.1), in temp working directories.
// The numbered describe blocks are the "cases that must hold".
import { test, describe, before } from 'node:test'
import assert from 'node:assert/strict'
import { spawnSync } from 'node:child_process'
import { mkdir, writeFile, readFile, readdir } from 'node:fs/promises'
import { join } from 'node:path'
import { type FakeProvider } from './fake-provider.ts'
import { sharedPath, skipWithoutShared } from './shared.ts'
import { CLEAN_ENV, DSH, ROOT, TSX, dsh, dshPty, fake, lines, readLog, runFlags, runProcess, skipWithoutPty, tempDir, type Run } from './cli-helpers.ts'

/** docs/design.md §3: the text put in place of a pruned tool result's middle (39 code points). */
const MARKER = '\n\n[... tool result middle pruned ...]\n\n'
const TOOLS = ['read_file', 'list_files', 'grep', 'write_file', 'edit_file']
const codePoints = (s: string): number => Array.from(s).length

// 1,000 lines of 60 bytes: a 60,000-byte file, the "60 KB file".
const BIG_LINES = Array.from({ length: 1000 }, (_, i) => `L${String(i).padStart(4, '0')}:${'abcdefghij'.repeat(6).slice(0, 53)}`)
const BIG_FILE = BIG_LINES.join('\n') + '\n'
const ANSWER_1 = 'big.txt has 1,000 lines, L0000 to L0999.'
const ANSWER_2 = 'The last line is L0999.'

describe('cases 1 and 2: one-shot run with a prune, then a resumed session', () => {
  let cwd: string
  let f: FakeProvider
  let firstLogText: string
  before(async () => {
    cwd = await tempDir()
    await writeFile(join(cwd, 'big.txt'), BIG_FILE)
    f = await fake([
      { toolCalls: [{ id: 'call_big', name: 'read_file', arguments: { path: 'big.txt' } }] },
      { text: ANSWER_1 },
      { text: ANSWER_2 },
    ])
  })

  test('case 1: exit 0, the answer on stdout, the log has the prune, the second request carries the marker', async () => {
    assert.equal(Buffer.byteLength(BIG_FILE), 60_000)
    const run = await dsh(['-p', 'How many lines has big.txt?', ...runFlags(f), '--session', 's.jsonl'], cwd)
    assert.equal(run.code, 0, run.stderr)
    assert.equal(run.stdout, ANSWER_1 + '\n')
    assert.equal(f.requests.length, 2)

    const log = await readLog(join(cwd, 's.jsonl'))
    assert.deepEqual(log.map((e) => e.seq), log.map((_, i) => i))
    const original = log.find((e) => e.type === 'tool/result')
    assert.equal(original.data.message.toolCallId, 'call_big')
    const originalText: string = original.data.message.content.map((b: any) => b.text).join('')
    for (const line of [BIG_LINES[0], BIG_LINES[999]]) assert.ok(originalText.includes(line), `read_file returned the whole file (${line})`)
    const pruneAt = log.findIndex((e) => e.type === 'compaction/prune')
    assert.ok(pruneAt > 0, 'the log has a compaction/prune event')
    const prune = log[pruneAt]
    assert.deepEqual(prune.data.shadowedSeqs, [original.seq])
    assert.equal(prune.data.trigger, 'pressure')
    const replacement = log[pruneAt + 1] // docs/design.md §3: the prune event, then the pruned tool/result replacing the original
    assert.equal(replacement.type, 'tool/result')
    assert.deepEqual(replacement.data.surfaceOp, { op: 'replace', start: original.seq, end: original.seq })
    // The activity lines name the tool, its path and the tokens (the meter's price of the result before and after).
    const [activity, pruned] = lines(run.stderr)
    const m = /^▸ read_file big\.txt \(([\d,]+) tokens\)$/.exec(activity)
    assert.ok(m, run.stderr)
    const tokens = Number(m[1].replaceAll(',', ''))
    assert.equal(tokens, prune.data.shadowedTokenCount)
    const after = Math.ceil((4096 + 39 + 1024) / 4) + 8 // the pruned result by the meter: ceil(chars / 4) + 8
    const group = (n: number) => n.toLocaleString('en-US')
    // …then the edit's cache cost (docs/design.md §11; test/cost.test.ts checks those figures).
    assert.equal(pruned.split(' · ')[0], `[dsh] pruned read_file big.txt: ${group(tokens)} → ${group(after)} tokens (${group(tokens - after)} saved)`)
    assert.match(pruned.split(' · ')[1], /^cache: /)

    // What the model saw next: head 4,096 + marker + tail 1,024 code points (docs/design.md §3).
    const toolMessage = f.requests[1].body.messages.find((m: any) => m.role === 'tool')
    assert.equal(toolMessage.tool_call_id, 'call_big')
    const sent: string = toolMessage.content
    assert.equal(sent.split(MARKER).length, 2, 'exactly one marker')
    assert.equal(codePoints(sent), 4096 + 39 + 1024)
    assert.equal(sent, Array.from(originalText).slice(0, 4096).join('') + MARKER + Array.from(originalText).slice(-1024).join(''))
    assert.equal(f.requests[0].body.messages.some((m: any) => m.role === 'tool'), false)
    firstLogText = await readFile(join(cwd, 's.jsonl'), 'utf8')
  })

  test('case 2: the same command again resumes: the third request holds the pruned history, turn 2 in the log', async () => {
    assert.ok(firstLogText, 'case 1 ran first')
    const run = await dsh(['-p', 'Which line is last?', ...runFlags(f), '--session', 's.jsonl'], cwd)
    assert.equal(run.code, 0, run.stderr)
    assert.equal(run.stdout, ANSWER_2 + '\n')
    assert.equal(f.requests.length, 3)
    const [, second, third] = f.requests.map((r) => r.body.messages)
    assert.equal(third.length, second.length + 2)
    assert.deepEqual(third.slice(0, second.length), second, 'the earlier history, as pruned, is resent unchanged')
    assert.ok(third[3].content.includes(MARKER))
    assert.deepEqual(third.slice(second.length).map((m: any) => ({ role: m.role, content: m.content })),
      [{ role: 'assistant', content: ANSWER_1 }, { role: 'user', content: 'Which line is last?' }])

    const text = await readFile(join(cwd, 's.jsonl'), 'utf8')
    assert.ok(text.startsWith(firstLogText), 'the first run\'s lines are kept as they were')
    const log = await readLog(join(cwd, 's.jsonl'))
    const firstCount = lines(firstLogText).length
    assert.deepEqual(log.map((e) => e.seq), log.map((_, i) => i))
    assert.equal(log[firstCount].type, 'session/resume')
    assert.equal(log[firstCount].data.lastSeq, firstCount - 1)
    assert.deepEqual(log.filter((e) => e.type === 'turn/start').map((e) => e.data.turn), [1, 2])
    assert.deepEqual(log.filter((e) => e.type === 'turn/end').map((e) => [e.data.turn, e.data.reason]), [[1, 'stop'], [2, 'stop']])
  })
})

describe('case 3: no key and no --base-url', () => {
  const bare: Record<string, string> = { PATH: process.env.PATH ?? '/usr/bin:/bin', HOME: process.env.HOME ?? '/tmp' }
  const cases: [string, string[], Record<string, string>, RegExp[]][] = [
    ['no DEEPSEEK_API_KEY, no --base-url', ['-p', 'hi'], bare, [/DEEPSEEK_API_KEY/, /--base-url/]],
    ['--api-key-env names an unset variable', ['-p', 'hi', '--api-key-env', 'MY_LLM_KEY'], bare, [/MY_LLM_KEY is not set/, /export MY_LLM_KEY=/]],
  ]
  for (const [name, args, env, patterns] of cases) {
    test(`${name}: exit 2, one line on stderr saying what to set`, async () => {
      const run = await dsh(args, ROOT, env)
      assert.equal(run.code, 2)
      assert.equal(run.stdout, '')
      assert.equal(lines(run.stderr).length, 1, run.stderr)
      assert.ok(run.stderr.startsWith('dsh: no API key: '), run.stderr)
      for (const p of patterns) assert.match(run.stderr, p)
    })
  }
})

describe('exit codes and prompt sources of a one-shot run', () => {
  test('a provider failure (HTTP 401) exits 1 with the provider\'s message on stderr, logged as request/error', async () => {
    const cwd = await tempDir()
    const f = await fake([{ status: 401, body: { error: { message: 'Authentication Fails, Your api key is invalid', type: 'authentication_error' } } }])
    const run = await dsh(['-p', 'hi', ...runFlags(f), '--session', 'e.jsonl'], cwd)
    assert.equal(run.code, 1)
    assert.equal(run.stdout, '')
    const last = lines(run.stderr).at(-1)!
    assert.ok(last.startsWith(`dsh: AUTH: HTTP 401 from POST ${f.url}/chat/completions (model m): Authentication Fails, Your api key is invalid`), last)
    assert.equal(f.requests.length, 1, 'a 401 is not retried')
    const log = await readLog(join(cwd, 'e.jsonl'))
    assert.deepEqual(log.filter((e) => e.type === 'request/error').map((e) => [e.data.code, e.data.status]), [['AUTH', 401]])
    assert.deepEqual(log.at(-1).data, { turn: 1, reason: 'error' })
  })

  test('without -p and without a terminal, the prompt is read from stdin', async () => {
    const cwd = await tempDir()
    const f = await fake([{ text: 'read it' }])
    const run = await runProcess(process.execPath, ['--import', TSX, DSH, ...runFlags(f)], cwd, CLEAN_ENV, 'task from stdin\n')
    assert.equal(run.code, 0, run.stderr)
    assert.equal(run.stdout, 'read it\n')
    assert.deepEqual(f.requests[0].body.messages.at(-1), { role: 'user', content: 'task from stdin\n' })
    const empty = await runProcess(process.execPath, ['--import', TSX, DSH, ...runFlags(f)], cwd, CLEAN_ENV, '  \n')
    assert.equal(empty.code, 2)
    assert.match(empty.stderr, /^dsh: no prompt: pass one as an argument or with -p/)
    assert.equal(f.requests.length, 1)
  })

  test('-p - reads the prompt from stdin (one-shot: the answer on stdout)', async () => {
    const f = await fake([{ text: 'read from stdin' }])
    const run = await runProcess(process.execPath, ['--import', TSX, DSH, '-p', '-', ...runFlags(f), '--no-save'], await tempDir(), CLEAN_ENV, 'the task\non two lines\n')
    assert.equal(run.code, 0, run.stderr)
    assert.equal(run.stdout, 'read from stdin\n')
    assert.equal(f.requests[0].body.messages.at(-1).content, 'the task\non two lines\n')
  })

  test('an HTTP 404 names the base URL dsh posted to and what to check', async () => {
    const f = await fake(() => ({ status: 404, body: 'Cannot POST /chat/completions' }))
    const run = await dsh(['-p', 'hi', ...runFlags(f), '--no-save'], await tempDir())
    assert.equal(run.code, 1)
    assert.ok(lines(run.stderr).at(-1)!.endsWith(` dsh posts to BASE/chat/completions with the base URL ${f.url} (--base-url, DSH_BASE_URL or "baseURL" in a configuration file): check it (most servers want it to end in /v1, e.g. http://127.0.0.1:8080/v1), and the model name`), run.stderr)
    assert.equal(f.requests.length, 1, 'a 404 is not retried')
  })
})

describe('case 4: replay on a file that is not a transcript', () => {
  const cases: [string, string, RegExp][] = [
    ['notes.txt', 'hello world\nsecond line\n', /: line 1: not JSON/],
    ['broken.jsonl', '{"a": 1}\n{"b": \n{"c": 3}\n', /: line 2: not valid JSON/],
    ['object.json', '{"x": 1}\n', /a JSON object that matches no format \(mini-swe-agent: .*; swe-agent: an object with "history", or a "trajectory" of steps; openai: .*\); its keys are "x"/],
    ['empty.jsonl', '', /the file is empty/],
  ]
  for (const [file, content, problem] of cases) {
    test(`${file}: exit 2, one line naming the problem and the line, no stack trace`, async () => {
      const cwd = await tempDir()
      await writeFile(join(cwd, file), content)
      const run = await dsh(['replay', file], cwd)
      assert.equal(run.code, 2)
      assert.equal(run.stdout, '')
      assert.equal(lines(run.stderr).length, 1, run.stderr)
      assert.ok(run.stderr.startsWith(`dsh: replay: ${file}: `), run.stderr)
      assert.match(run.stderr, problem)
      assert.match(run.stderr, /Accepted formats: mini-swe-agent .*--format NAME/)
      assert.doesNotMatch(run.stderr, /\n\s+at /)
    })
  }
})

describe('cases 5 and 6: tools stay in the working directory; shell only with --allow-shell; --json is JSONL', () => {
  let cwd: string
  let f: FakeProvider
  let jsonRun: Run
  const SECRET = 'root:x:0:0:not-for-the-model'
  before(async () => {
    // base/etc/passwd exists, so `../../etc/passwd` from base/a/b names a real file outside the working directory.
    const base = await tempDir()
    cwd = join(base, 'a', 'b')
    await mkdir(cwd, { recursive: true })
    await mkdir(join(base, 'etc'))
    await writeFile(join(base, 'etc', 'passwd'), SECRET + '\n')
    f = await fake([
      { toolCalls: [{ id: 'call_passwd', name: 'read_file', arguments: { path: '../../etc/passwd' } }] },
      { text: 'I cannot read that file.' },
      { text: 'shell offered' },
    ])
    jsonRun = await dsh(['-p', 'Show ../../etc/passwd', ...runFlags(f), '--json', '--session', 'j.jsonl'], cwd)
  })

  test('case 5: ../../etc/passwd is refused with a tool error the model reads in the next request', async () => {
    assert.equal(jsonRun.code, 0, jsonRun.stderr)
    assert.equal(f.requests.length >= 2, true)
    const toolMessage = f.requests[1].body.messages.at(-1)
    assert.equal(toolMessage.role, 'tool')
    assert.equal(toolMessage.tool_call_id, 'call_passwd')
    assert.match(toolMessage.content, /"\.\.\/\.\.\/etc\/passwd" is outside the working directory/)
    assert.ok(toolMessage.content.includes(cwd), 'the error names the working directory')
    assert.ok(!toolMessage.content.includes(SECRET))
    const result = (await readLog(join(cwd, 'j.jsonl'))).find((e) => e.type === 'tool/result')
    assert.equal(result.data.message.isError, true)
  })

  test('case 5: the shell tool is offered only with --allow-shell', async () => {
    assert.deepEqual(f.requests[0].body.tools.map((t: any) => t.function.name), TOOLS)
    assert.deepEqual(f.requests[1].body.tools.map((t: any) => t.function.name), TOOLS)
    const run = await dsh(['-p', 'anything', ...runFlags(f), '--allow-shell'], cwd)
    assert.equal(run.code, 0, run.stderr)
    assert.equal(run.stdout, 'shell offered\n')
    assert.deepEqual(f.requests[2].body.tools.map((t: any) => t.function.name), [...TOOLS, 'shell'])
  })

  test('case 6: --json prints every log event, one JSON object per line, the same as the session log', async () => {
    assert.ok(jsonRun.stdout.endsWith('\n'))
    const outLines = jsonRun.stdout.slice(0, -1).split('\n')
    const events = outLines.map((line, i) => {
      try { return JSON.parse(line) } catch (err) { throw new Error(`stdout line ${i + 1} is not JSON: ${JSON.stringify(line.slice(0, 80))}`) }
    })
    for (const e of events) {
      assert.equal(typeof e, 'object')
      assert.deepEqual(Object.keys(e).sort(), ['data', 'seq', 'time', 'type'])
    }
    assert.deepEqual(events, await readLog(join(cwd, 'j.jsonl')), 'every event of the log, session/start included, in order')
    assert.equal(events[0].type, 'session/start')
    assert.equal(events.at(-1).type, 'turn/end')
  })

  const jq = spawnSync('jq', ['--version'], { encoding: 'utf8' })
  const skipJq = jq.status === 0 ? false : 'SKIPPED: jq is not installed, so `jq -c .` was not run on the --json output'
  if (skipJq) console.log(`# ${skipJq}`)
  test('case 6: jq -c . accepts the --json output line by line', { skip: skipJq }, () => {
    const out = spawnSync('jq', ['-c', '.'], { input: jsonRun.stdout, encoding: 'utf8' })
    assert.equal(out.status, 0, out.stderr)
    const jqLines = lines(out.stdout)
    assert.equal(jqLines.length, lines(jsonRun.stdout).length)
    assert.deepEqual(jqLines.map((l) => JSON.parse(l)), lines(jsonRun.stdout).map((l) => JSON.parse(l)))
  })
})

describe('interactive mode under a pseudo-terminal', () => {
  test('shell question, a turn, /usage, /help, /exit', { skip: skipWithoutPty }, async () => {
    const cwd = await tempDir()
    const f = await fake([{ text: 'Hi from the fake.' }])
    // All input at once, as a paste: lines typed ahead must survive the shell question.
    const config = await tempDir() // XDG_CONFIG_HOME: the remembered shell answer stays out of the user's config
    const run = await dshPty(runFlags(f), cwd, { ...CLEAN_ENV, XDG_CONFIG_HOME: config }, 'n\nhello\n/usage\n/help\n/exit\n')
    const out = run.stdout
    assert.equal(run.code, 0, out)
    assert.ok(out.includes(`Allow the agent to run shell commands in ${cwd}? (remembered for this directory) [y/N]`), out)
    assert.match(out, /dsh \S+ · m · 16,000-token window · \/help for commands/)
    assert.match(out, /Hi from the fake\.\n/)
    assert.match(out, /\[dsh\] context [\d,]+ \/ 16,000 tokens \(\d+\.\d%\)/, 'the status line on a TTY')
    assert.match(out, /context: [\d,]+ \/ 16,000 tokens .*\(anchored on provider usage\)/, '/usage')
    assert.match(out, /provider usage over 1 calls: prompt [\d,]+/, '/usage counts the one call')
    assert.match(out, /commands: \/usage .*\/compact .*\/help, \/exit/, '/help')
    assert.ok(!out.includes('\x1b[2m'), 'NO_COLOR: no dim status line')
    assert.equal(f.requests.length, 1)
    assert.deepEqual(f.requests[0].body.tools.map((t: any) => t.function.name), TOOLS, 'answered n: no shell tool')
    assert.deepEqual(f.requests[0].body.messages.at(-1), { role: 'user', content: 'hello' })
  })
})

describe('replay of examples/session.jsonl (produced by dsh against the fake provider)', () => {
  test('exits 0 and prints the per-step table and totals', async () => {
    // Read off the file with jq: 1 user/message, 2 assistant/message, 1 tool/result (+1 replacing it),
    // 2 step/start in 1 turn, 1 compaction/prune, request/header contextWindow 4000.
    const run = await dsh(['replay', 'examples/session.jsonl'], ROOT)
    assert.equal(run.code, 0, run.stderr)
    assert.equal(run.stderr, '')
    const out = run.stdout
    assert.match(out, /^dsh replay of examples\/session\.jsonl: dsh, 4 messages \(1 user, 2 assistant, 1 tool results\), 1 turn\(s\), 2 step\(s\)\n/)
    assert.match(out, /context window 4,000 tokens; pressure threshold 3,200 \(0\.8\)/)
    assert.match(out, /\n step +turn +request +unmanaged +recorded +before +rung +after +reclaimed +rereads\n/)
    assert.match(out, /\n +1 +1 +[\d,]+ +[\d,]+ +[\d,]+ +[\d,]+ +prune +[\d,]+ +[\d,]+ +0\n/)
    assert.match(out, /↳ prune +tool result seq 7: /)
    assert.match(out, /\n  prunes +1 \(/)
    assert.match(out, /\n  requests over the window, dsh +0\n/)
  })
})

describe('replay of every transcript in ../shared/corpus at a 32,000-token window', () => {
  const skip = skipWithoutShared('corpus')
  test('each file exits 0 with the table and totals', { skip }, async () => {
    const files = (await readdir(sharedPath('corpus'))).filter((name) => !/\.md$|^LICENSE|^PROVENANCE/.test(name)).sort()
    assert.ok(files.length >= 4, `corpus files: ${files.join(', ')}`)
    const runs = await Promise.all(files.map((name) => dsh(['replay', sharedPath('corpus', name), '--context-window', '32000'], ROOT)))
    runs.forEach((run, i) => {
      assert.equal(run.code, 0, `${files[i]}: ${run.stderr}`)
      assert.ok(run.stdout.startsWith(`dsh replay of ${sharedPath('corpus', files[i])}: `), run.stdout.slice(0, 200))
      assert.match(run.stdout, /context window 32,000 tokens/)
      // By dsh's estimate and, where the file records prompt tokens, in the run's own tokens (docs/design.md §15).
      assert.match(run.stdout, /\n  requests over the window, dsh +0(?: by the estimate, 0 calibrated)?\n/)
    })
  })
})
