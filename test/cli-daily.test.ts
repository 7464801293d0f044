// The CLI as a daily driver (issue 16): a closed stdout, activity lines, exit codes of turns that
// give no answer, -C, the remembered shell answer, fail-fast connection errors. Each test runs dsh
// as a child process against test/fake-provider.ts; the interactive ones under a pseudo-terminal.
import { test, describe } from 'node:test'
import assert from 'node:assert/strict'
import { createServer } from 'node:net'
import { mkdir, readFile, writeFile } from 'node:fs/promises'
import { join } from 'node:path'
import { CLEAN_ENV, ROOT, dsh, dshCommand, dshPty, dshPtyDriven, fake, lines, readLog, runFlags, runProcess, skipWithoutPty, tempDir } from './cli-helpers.ts'
import type { AgentEvent, SessionEvent } from '../dsh.ts'

const group = (n: number) => n.toLocaleString('en-US')
/** A stack trace line, as Node prints one. */
const STACK = /\n\s+at /

/** Runs `dsh args | consumer` under bash; returns dsh's exit status (PIPESTATUS), stdout of the pipe, and stderr. */
async function piped(args: string[], consumer: string, cwd: string) {
  const run = await runProcess('bash', ['-c', `${dshCommand(args)} | ${consumer}; echo "dsh-exit=\${PIPESTATUS[0]}" >&2`], cwd, CLEAN_ENV)
  const status = /dsh-exit=(\d+)/.exec(run.stderr)
  assert.ok(status, run.stderr)
  return { status: Number(status[1]), stdout: run.stdout, stderr: run.stderr.replace(/dsh-exit=\d+\n/, '') }
}

describe('a closed stdout ends quietly with exit 0', () => {
  // 6,000 lines of 50 bytes: far more than a pipe buffer (64 KiB), so `head -1` closes the pipe mid-write.
  const ANSWER = Array.from({ length: 6000 }, (_, i) => `answer line ${String(i).padStart(5, '0')} ${'x'.repeat(31)}`).join('\n')

  for (const consumer of ['head -1', 'true']) {
    test(`dsh -p go | ${consumer}`, async () => {
      const cwd = await tempDir()
      const f = await fake([{ text: ANSWER, deltaSize: 100_000 }])
      const run = await piped(['-p', 'go', ...runFlags(f)], consumer, cwd)
      assert.equal(run.status, 0, run.stderr)
      assert.equal(run.stdout, consumer === 'true' ? '' : ANSWER.split('\n')[0] + '\n')
      assert.doesNotMatch(run.stderr, STACK)
      assert.doesNotMatch(run.stderr, /EPIPE|Error/)
    })
  }

  test('dsh replay FILE | true, dsh --help | true', async () => {
    for (const args of [['replay', 'examples/session.jsonl'], ['--help']]) {
      const run = await piped(args, 'true', ROOT)
      assert.equal(run.status, 0, run.stderr)
      assert.equal(run.stderr, '')
    }
  })

  test('dsh --json | head -1: the turn is cancelled (nobody reads it), the log stays balanced, exit 0', async () => {
    const cwd = await tempDir()
    await writeFile(join(cwd, 'a.txt'), 'alpha\n')
    // Slow replies: the reader is gone long before the turn could end by itself.
    const f = await fake(() => ({ toolCalls: [{ name: 'read_file', arguments: { path: 'a.txt' } }], delayMs: 50 }))
    const run = await piped(['-p', 'go', ...runFlags(f), '--json', '--session', 's.jsonl', '--max-steps', '40'], 'head -1', cwd)
    assert.equal(run.status, 0, run.stderr)
    assert.equal(JSON.parse(run.stdout).type, 'session/start')
    assert.doesNotMatch(run.stderr, STACK)
    const log = await readLog(join(cwd, 's.jsonl'))
    assert.deepEqual(log.at(-1).data, { turn: 1, reason: 'aborted' })
    assert.ok(f.requests.length < 40, `${f.requests.length} requests: the turn stopped early`)
  })
})

describe('turns without an answer exit 1 with a line saying so', () => {
  test('--max-steps 3 with a model that keeps calling tools', async () => {
    const cwd = await tempDir()
    await writeFile(join(cwd, 'a.txt'), 'alpha\n')
    const f = await fake(() => ({ text: 'let me look again', toolCalls: [{ name: 'read_file', arguments: { path: 'a.txt' } }] }))
    const run = await dsh(['-p', 'go', ...runFlags(f), '--max-steps', '3', '--session', 's.jsonl'], cwd)
    assert.equal(run.code, 1)
    assert.equal(f.requests.length, 3)
    assert.equal(run.stdout, '', 'no answer is printed as if it were one')
    assert.equal(lines(run.stderr).at(-1), 'dsh: the turn stopped at the step limit (3 steps, --max-steps) without a final answer; raise --max-steps, or continue with --session FILE')
    assert.deepEqual((await readLog(join(cwd, 's.jsonl'))).at(-1).data, { turn: 1, reason: 'max-steps' })
  })

  test('an empty final message', async () => {
    const cwd = await tempDir()
    const f = await fake([{ reasoning: 'Nothing to say.' }])
    const run = await dsh(['-p', 'go', ...runFlags(f)], cwd)
    assert.equal(run.code, 1)
    assert.equal(lines(run.stderr).at(-1), 'dsh: the model ended the turn without an answer (its last message has no text)')
  })

  test('an answer cut at the completion budget is printed, and exits 1', async () => {
    const cwd = await tempDir()
    const f = await fake([{ text: 'The first half of', finishReason: 'length' }])
    const run = await dsh(['-p', 'go', ...runFlags(f)], cwd)
    assert.equal(run.code, 1)
    assert.equal(run.stdout, 'The first half of\n')
    assert.match(lines(run.stderr).at(-1)!, /^dsh: the answer was cut at the completion budget .*raise --max-tokens$/)
  })

  test('bad --max-steps values are usage errors', async () => {
    for (const value of ['0', '-1', '2.5', 'ten']) {
      const run = await dsh(['-p', 'go', '--base-url', 'http://127.0.0.1:9/v1', '--max-steps', value], ROOT)
      assert.equal(run.code, 2, value)
      assert.match(run.stderr, /^dsh: (--max-steps must be a positive whole number of provider calls per turn|--max-steps needs a value)/, value)
    }
  })
})

describe('activity lines on stderr', () => {
  test('each tool call: name, what it worked on, tokens or outcome; the shell with its exit code', async () => {
    const cwd = await tempDir()
    await mkdir(join(cwd, 'src'))
    await writeFile(join(cwd, 'src', 'a.ts'), 'export const a = 1\n'.repeat(100))
    const f = await fake([
      { toolCalls: [
        { name: 'read_file', arguments: { path: 'src/a.ts' } },
        { name: 'shell', arguments: { command: 'echo failing; exit 1' } },
        { name: 'read_file', arguments: { path: 'missing.ts' } },
        { name: 'grep', arguments: { pattern: 'const a', path: 'src' } },
      ] },
      { text: 'done' },
    ])
    const run = await dsh(['-p', 'go', ...runFlags(f), '--allow-shell', '--session', 's.jsonl'], cwd)
    assert.equal(run.code, 0, run.stderr)
    const log = await readLog(join(cwd, 's.jsonl'))
    const tokens = log.filter((e) => e.type === 'tool/result').map((e) => Math.ceil(e.data.message.content[0].text.length / 4) + 8)
    assert.deepEqual(lines(run.stderr).filter((l) => !l.startsWith('[dsh] no shell sandbox')), [ // said where bwrap cannot run (test/sandbox.test.ts)
      `▸ read_file src/a.ts (${group(tokens[0])} tokens)`,
      '▸ shell echo failing; exit 1 → exit 1',
      `▸ read_file missing.ts → ${log.filter((e) => e.type === 'tool/result')[2].data.message.content[0].text.split('\n')[0]}`,
      `▸ grep const a src (${group(tokens[3])} tokens)`,
    ])
    assert.match(lines(run.stderr).filter((l) => l.startsWith('▸'))[2], /^▸ read_file missing\.ts → read_file: /)
  })

  test('a resumed session says so: turns, tokens, last activity', async () => {
    const cwd = await tempDir()
    const f = await fake([{ text: 'one' }, { text: 'two' }])
    const first = await dsh(['-p', 'the first question', ...runFlags(f), '--session', 's.jsonl'], cwd)
    assert.equal(first.code, 0, first.stderr)
    assert.equal(first.stderr, '', 'a new session: no resume line')
    const second = await dsh(['-p', 'next', ...runFlags(f), '--session', 's.jsonl'], cwd)
    assert.equal(second.code, 0, second.stderr)
    assert.match(second.stderr, /^\[dsh\] resumed s\.jsonl: 1 turn, [\d,]+ tokens in context; last active \d+ s ago: "the first question"\n$/)
  })

  test('--help explains the status lines and the ~ of an estimated occupancy', async () => {
    const run = await dsh(['--help'], ROOT)
    assert.equal(run.code, 0)
    assert.match(run.stdout, /▸ read_file src\/a\.ts \(2,340 tokens\)/)
    assert.match(run.stdout, /a trailing ~\s+means the figure is dsh's estimate/i)
    for (const flag of ['--max-steps N', '--no-shell', '-C, --cwd DIR']) assert.ok(run.stdout.includes(flag), flag)
  })
})

describe('-C DIR / --cwd DIR: work on another project', () => {
  test('tools, the system prompt and a relative --session are in DIR', async () => {
    const here = await tempDir()
    const project = join(here, 'project')
    await mkdir(project)
    await writeFile(join(project, 'notes.txt'), 'the project notes\n')
    const f = await fake([{ toolCalls: [{ name: 'read_file', arguments: { path: 'notes.txt' } }] }, { text: 'read' }])
    const run = await dsh(['-C', 'project', '-p', 'go', ...runFlags(f), '--session', 's.jsonl'], here)
    assert.equal(run.code, 0, run.stderr)
    assert.match(f.requests[1].body.messages.at(-1).content, /the project notes/)
    assert.ok(f.requests[0].body.messages[0].content.includes(`working in the directory ${project}`))
    assert.equal((await readLog(join(project, 's.jsonl')))[0].type, 'session/start')
    for (const args of [['replay', 's.jsonl', '-C', 'project'], ['--cwd=project', 'replay', 's.jsonl'], ['-C', 'project', 'replay', 's.jsonl']]) {
      const replay = await dsh(args, here)
      assert.equal(replay.code, 0, replay.stderr)
      assert.match(replay.stdout, /^dsh replay of s\.jsonl: dsh, /)
    }
  })

  test('a DIR that is missing or not a directory: exit 2, one line', async () => {
    const here = await tempDir()
    await writeFile(join(here, 'file.txt'), 'x')
    for (const [dir, problem] of [['nope', /cannot use .*nope \(ENOENT\)/], ['file.txt', /file\.txt is not a directory/]] as const) {
      const run = await dsh(['-C', dir, '-p', 'go', '--base-url', 'http://127.0.0.1:9/v1'], here)
      assert.equal(run.code, 2)
      assert.equal(lines(run.stderr).length, 1, run.stderr)
      assert.match(run.stderr, problem)
    }
  })
})

describe('connection refused and DNS failures fail fast', () => {
  async function closedPort(): Promise<number> {
    const server = createServer()
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
    const port = (server.address() as { port: number }).port
    await new Promise((resolve) => server.close(resolve))
    return port
  }
  const cases: [string, () => Promise<string>, RegExp][] = [
    ['connection refused', async () => `http://127.0.0.1:${await closedPort()}/v1`, /ECONNREFUSED/],
    ['DNS lookup failure', async () => 'http://dsh-test-host.invalid/v1', /ENOTFOUND|EAI_AGAIN/],
  ]
  for (const [name, url, cause] of cases) {
    test(`${name}: one retry, announced with what and why, then exit 1`, async () => {
      const baseURL = await url()
      const run = await dsh(['-p', 'go', '--base-url', baseURL, '--model', 'm', '--context-window', '16000'], ROOT)
      assert.equal(run.code, 1)
      const out = lines(run.stderr)
      assert.equal(out.length, 2, run.stderr)
      assert.match(out[0], new RegExp(`^\\[dsh\\] retry 1 of 1 in 0\\.\\d s: TRANSPORT: request to ${baseURL.replaceAll('.', '\\.')}/chat/completions failed: fetch failed \\(`))
      assert.match(out[0], cause)
      assert.match(out[1], /^dsh: TRANSPORT: /)
    })
  }
})

describe('the shell answer is remembered per directory (under a pseudo-terminal)', () => {
  test('asked once, remembered in XDG_CONFIG_HOME/dsh/config.json; --no-shell and another directory are not affected', { skip: skipWithoutPty }, async () => {
    const cwd = await tempDir()
    const other = await tempDir()
    const config = await tempDir()
    const f = await fake(() => ({ text: 'ok' }))
    const env = { ...CLEAN_ENV, XDG_CONFIG_HOME: config }
    const tools = (i: number) => f.requests[i].body.tools.map((t: any) => t.function.name)
    const PROMPT = '› '
    // Driven: an answer typed before the question is type-ahead, never an approval (so a fixed input races).
    const first = await dshPtyDriven(runFlags(f), cwd, env, [{ waitFor: `Allow the agent to run shell commands in ${cwd}? (remembered for this directory) [y/N]`, send: 'y\r' },
      { waitFor: PROMPT, send: 'hello\r' }, { waitFor: 'ok', send: '' }, { waitFor: PROMPT, send: '/exit\r' }])
    assert.equal(first.code, 0, first.stdout)
    assert.ok(first.stdout.includes(`Allow the agent to run shell commands in ${cwd}? (remembered for this directory) [y/N]`), first.stdout)
    assert.ok(tools(0).includes('shell'))
    assert.deepEqual(JSON.parse(await readFile(join(config, 'dsh', 'config.json'), 'utf8')), { projects: { [cwd]: { shell: true } } })

    const second = await dshPty(runFlags(f), cwd, env, 'hello\n/exit\n')
    assert.equal(second.code, 0, second.stdout)
    assert.doesNotMatch(second.stdout, /Allow the agent/)
    assert.ok(second.stdout.includes(`[dsh] shell commands allowed in this directory (remembered in ${join(config, 'dsh', 'config.json')}; /permissions changes it`), second.stdout)
    assert.ok(tools(1).includes('shell'))
    assert.equal(f.requests[1].body.messages.at(-1).content, 'hello', 'the first line is the prompt, not an answer to a question')

    const refused = await dshPty([...runFlags(f), '--no-shell'], cwd, env, 'hello\n/exit\n')
    assert.equal(refused.code, 0, refused.stdout)
    assert.doesNotMatch(refused.stdout, /Allow the agent|remembered/)
    assert.ok(!tools(2).includes('shell'))

    const elsewhere = await dshPtyDriven(runFlags(f), other, env, [{ waitFor: `Allow the agent to run shell commands in ${other}?`, send: 'n\r' },
      { waitFor: PROMPT, send: 'hello\r' }, { waitFor: 'ok', send: '' }, { waitFor: PROMPT, send: '/exit\r' }])
    assert.ok(elsewhere.stdout.includes(`Allow the agent to run shell commands in ${other}?`), elsewhere.stdout)
    assert.ok(!tools(3).includes('shell'))
    assert.deepEqual(JSON.parse(await readFile(join(config, 'dsh', 'config.json'), 'utf8')), { projects: { [cwd]: { shell: true }, [other]: { shell: false } } })
  })
})

describe('an overflow-recovery loop stops at the first repeat', () => {
  test('recover, then overflow again at no smaller a request: the turn stops with a clear error (exit 1)', async () => {
    const cwd = await tempDir()
    await writeFile(join(cwd, 'a.txt'), 'a line of the file\n'.repeat(100))
    // A server whose window is smaller than dsh believes: any request with two tool results overflows.
    const f = await fake((request) => {
      if (request.headers['x-dsh-purpose'] === 'compaction') return { text: 'Summary: read a.txt twice; it holds 100 identical lines.' }
      if (request.body.messages.filter((m: any) => m.role === 'tool').length >= 2) {
        return { status: 400, body: { error: { message: "This model's maximum context length is 4096 tokens. However, you requested 4500 tokens. Please reduce the length of the messages.", type: 'invalid_request_error', code: 'context_length_exceeded' } } }
      }
      return { toolCalls: [{ name: 'read_file', arguments: { path: 'a.txt' } }] }
    })
    const run = await dsh(['-p', 'go', ...runFlags(f), '--max-steps', '30', '--session', 's.jsonl'], cwd)
    assert.equal(run.code, 1, run.stderr)
    const purposes = f.requests.map((r) => r.headers['x-dsh-purpose'] === 'compaction' ? 'summary' : 'conversation')
    // c1, c2, c3 overflows, one summary, c4 (the retry), c5, c6 overflows again at a larger request: stop.
    assert.deepEqual(purposes, ['conversation', 'conversation', 'conversation', 'summary', 'conversation', 'conversation', 'conversation'])
    const out = lines(run.stderr)
    const warning = out.find((l) => l.startsWith('[dsh] warning: context overflow again'))
    assert.match(warning ?? '', /^\[dsh\] warning: context overflow again at (\d+) tokens \(dsh's estimate\) after recovering from one at (\d+) tokens in this turn: recovery makes no progress, so the turn stops\./)
    const [, again, first] = /at (\d+) tokens .* at (\d+) tokens/.exec(warning!)!
    assert.ok(Number(again) >= Number(first))
    assert.match(out.at(-1)!, /^dsh: CONTEXT_WINDOW_EXCEEDED: HTTP 400 .*maximum context length is 4096 tokens/)
    const log = await readLog(join(cwd, 's.jsonl'))
    assert.equal(log.filter((e) => e.type === 'recovery/retry').length, 1)
    assert.deepEqual(log.at(-1).data, { turn: 1, reason: 'error' })
  })
})

describe('the terminal (under a pseudo-terminal)', () => {
  const skip = skipWithoutPty
  /** The interactive prompt: dsh waits for input. */
  const PROMPT = '› '
  test('-p on a terminal streams the answer as it arrives (before the step\'s status line), printed once', { skip }, async () => {
    const cwd = await tempDir()
    const ANSWER = 'This answer arrives in small pieces.'
    const f = await fake([{ text: ANSWER, deltaSize: 3, delayMs: 10 }])
    const run = await dshPty(['-p', 'go', ...runFlags(f)], cwd, CLEAN_ENV, '')
    assert.equal(run.code, 0, run.stdout)
    assert.equal(run.stdout.split(ANSWER).length, 2, 'printed once')
    const answerAt = run.stdout.indexOf(ANSWER + '\n'), statusAt = run.stdout.indexOf('[dsh] context ')
    assert.ok(answerAt >= 0 && statusAt > answerAt, run.stdout)
  })

  test('a pasted block is one input; a trailing \\ continues the line', { skip }, async () => {
    const cwd = await tempDir()
    const f = await fake(() => ({ text: 'ok' }))
    const run = await dshPtyDriven([...runFlags(f), '--no-shell'], cwd, CLEAN_ENV, [
      { waitFor: PROMPT, send: '\x1b[200~line one\rline two\rline three\x1b[201~' }, { waitFor: 'three', send: '\r' },
      { waitFor: PROMPT, send: 'first \\\r' }, { waitFor: '… ', send: 'second\r' },
      { waitFor: PROMPT, send: '/exit\r' },
    ])
    assert.equal(run.code, 0, run.stdout)
    assert.ok(run.stdout.includes('\x1b[?2004h'), 'bracketed paste mode is switched on')
    assert.ok(run.stdout.includes('\x1b[?2004l'), 'and off at the end')
    assert.deepEqual(f.requests.map((r) => r.body.messages.at(-1).content), ['line one\nline two\nline three', 'first \nsecond'])
  })

  test('/compact shows "compacting…" while the summary runs; a cancelled /compact prints one clean line', { skip }, async () => {
    const cwd = await tempDir()
    let summaries = 0
    const f = await fake((request) => {
      if (request.headers['x-dsh-purpose'] !== 'compaction') return { text: 'ok' }
      return ++summaries === 1 ? { text: 'Summary: two long notes were given.', delayMs: 500 } : { fault: 'hang' }
    })
    const long = (tag: string) => `${tag} ${'note '.repeat(1600)}\r`
    const run = await dshPtyDriven([...runFlags(f), '--no-shell'], cwd, { ...CLEAN_ENV, TERM: 'xterm' }, [
      ...['first', 'second', 'third'].map((tag) => ({ waitFor: PROMPT, send: long(tag) })),
      { waitFor: PROMPT, send: '/compact\r' },
      // After the first compaction's line, so that the indicator awaited below is the second one's.
      { waitFor: '[dsh] compacted', send: long('fourth') }, { waitFor: PROMPT, send: long('fifth') },
      { waitFor: PROMPT, send: '/compact\r' }, { waitFor: /compacting… [1-9]\.\d s/, send: '\x03' }, // a second in: the summary request is out
      { waitFor: PROMPT, send: '/exit\r' },
    ])
    assert.equal(run.code, 0, run.stdout)
    assert.equal(summaries, 2, run.stdout)
    assert.match(run.stdout, /\[dsh\] compacting… \d+\.\d s/)
    assert.match(run.stdout, /\[dsh\] compacted \d+ messages? into a checkpoint: [\d,]+ → [\d,]+ tokens \([\d,]+ saved\)/)
    assert.equal(run.stdout.split('[dsh] /compact cancelled; the context is unchanged').length, 2, run.stdout)
    assert.doesNotMatch(run.stdout, /aborted|0 → 0 tokens|compaction failed/)
  })
})

describe('dsh from anywhere: one checkout, another project, three runtimes', () => {
  const BIN = join(ROOT, 'node_modules', '.bin')
  const runtimes: [string, string, string[]][] = [
    ['tsx', join(BIN, 'tsx'), []],
    ['Deno', join(BIN, 'deno'), ['run', '-A']],
    ['Bun', join(BIN, 'bun'), []],
  ]
  for (const [name, file, pre] of runtimes) {
    test(`${name}: ${[name === 'tsx' ? 'npx tsx' : name.toLowerCase(), ...pre].join(' ')} dsh.ts -C ../my-project -p …`, async () => {
      const base = await tempDir()
      await mkdir(join(base, 'my-project'))
      await writeFile(join(base, 'my-project', 'notes.txt'), `notes read under ${name}\n`)
      const f = await fake([{ toolCalls: [{ name: 'read_file', arguments: { path: 'notes.txt' } }] }, { text: 'read' }])
      const run = await runProcess(file, [...pre, join(ROOT, 'dsh.ts'), '-C', join(base, 'my-project'), '-p', 'go', ...runFlags(f)], ROOT,
        { ...CLEAN_ENV, DENO_NO_UPDATE_CHECK: '1' })
      assert.equal(run.code, 0, run.stderr)
      assert.equal(run.stdout, 'read\n')
      assert.match(f.requests[1].body.messages.at(-1).content, new RegExp(`notes read under ${name}`))
      assert.match(run.stderr, /^▸ read_file notes\.txt \(\d+ tokens\)$/m)
    })
  }
})

describe('context-edit lines come from the log events, whatever the rung', () => {
  test('a compaction/clear of two tool results, then its replaces: one line naming both tools and the tokens saved', async () => {
    const { Agent, MemoryStore, Session, statusReporter } = await import('../dsh.ts')
    const session = await Session.open(new MemoryStore())
    const out: string[] = []
    let agent: InstanceType<typeof Agent> | undefined
    const status = statusReporter(() => agent, (line) => out.push(line), false, false, { editNote: (edit) => `note for seq ${edit.replaceSeq}` })
    agent = new Agent({ session, provider: { model: 'm', complete: async () => { throw new Error('not called') } } as any, onEvent: status })
    const op = { op: 'append' } as const
    session.append('user/message', { message: { role: 'user', content: 'look around' }, surfaceOp: op })
    session.append('assistant/message', { message: { role: 'assistant', content: [
      { type: 'tool-call', id: 'c1', name: 'read_file', arguments: '{"path":"src/a.ts"}' },
      { type: 'tool-call', id: 'c2', name: 'grep', arguments: '{"pattern":"TODO","path":"src"}' },
    ] }, finishReason: 'tool_calls', surfaceOp: op })
    const r1 = session.append('tool/result', { message: { role: 'tool', toolCallId: 'c1', content: [{ type: 'text', text: 'a'.repeat(4000) }] }, surfaceOp: op })
    const r2 = session.append('tool/result', { message: { role: 'tool', toolCallId: 'c2', content: [{ type: 'text', text: 'b'.repeat(2000) }] }, surfaceOp: op })
    out.length = 0
    const before = session.surface().node(r1.seq)!.tokens + session.surface().node(r2.seq)!.tokens
    session.append('compaction/clear', { shadowedSeqs: [r1.seq, r2.seq], shadowedTokenCount: before })
    const placeholder = (id: string) => ({ message: { role: 'tool' as const, toolCallId: id, content: [{ type: 'text' as const, text: `[cleared ${id}]` }] } })
    session.append('tool/result', { ...placeholder('c1'), surfaceOp: { op: 'replace', start: r1.seq, end: r1.seq } })
    assert.deepEqual(out, [], 'the line waits for every replace of the edit')
    const last = session.append('tool/result', { ...placeholder('c2'), surfaceOp: { op: 'replace', start: r2.seq, end: r2.seq } })
    const after = session.surface().node(last.seq)!.tokens + session.surface().node(last.seq - 1)!.tokens
    assert.equal(before, 1008 + 508)
    assert.deepEqual(out, [`[dsh] cleared 2 tool results (read_file src/a.ts, grep TODO src): ${group(before)} → ${group(after)} tokens (${group(before - after)} saved) · note for seq ${last.seq}\n`])
  })
})

test('an AUTH failure tells the CLI user which flag names the key variable', async () => {
  const cwd = await tempDir()
  const f = await fake([{ status: 401, body: { error: { message: 'Authentication Fails', type: 'authentication_error' } } }])
  const run = await dsh(['-p', 'hi', ...runFlags(f)], cwd)
  assert.equal(run.code, 1)
  assert.match(lines(run.stderr).at(-1)!, /^dsh: AUTH: HTTP 401 .*CLI: --api-key-env NAME\)\.$/)
})

// Against a real llama-server (docs/design.md §10): what the status line says about a refused request.
test('the CLI\'s status line for an overflow says who counted, and says nothing of recovery for an input refused before the ladder', async () => {
  const { statusReporter } = await import('../dsh.ts')
  const lines: string[] = []
  const report = statusReporter(() => undefined, (l) => lines.push(l), false, false)
  const log = (data: Record<string, unknown>): AgentEvent => ({ type: 'log', event: { seq: 1, time: 0, type: 'request/error', data } as unknown as SessionEvent })
  // The CLI with its coding tools in a 2,048-token window: the envelope alone does not fit, and the
  // line said "context overflow reported by the provider; pruning and compacting to recover".
  report(log({ code: 'CONTEXT_WINDOW_EXCEEDED', trigger: 'input', message: 'CONTEXT_WINDOW_EXCEEDED: the current input alone is 19 tokens (plus 1156 of system prompt and tools, × 3.20 calibration = 3755) …; nothing was sent.' }))
  assert.deepEqual(lines, [])
  report(log({ code: 'CONTEXT_WINDOW_EXCEEDED', trigger: 'conversation', message: 'CONTEXT_WINDOW_EXCEEDED: preflight: nothing was sent. The prompt is estimated at 2162 tokens …' }))
  assert.equal(lines.length, 1)
  assert.match(lines[0], /would not fit the context window \(dsh's estimate; nothing was sent\)/)
  assert.doesNotMatch(lines[0], /reported by the provider/)
  report(log({ code: 'CONTEXT_WINDOW_EXCEEDED', trigger: 'conversation', status: 400, message: 'CONTEXT_WINDOW_EXCEEDED: HTTP 400 …' }))
  assert.match(lines[1], /context overflow reported by the provider \(400\); pruning and compacting to recover/)
})
