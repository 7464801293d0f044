// The Low breaks of the third attack table that live in Part II (docs/reliability.md, "Attack table
// (round 3)"): a hostile model's arguments, a bad input file, a log written by other code. Each
// test fails on e9ce0b5.
import { test, describe } from 'node:test'
import assert from 'node:assert/strict'
import { spawnSync } from 'node:child_process'
import { appendFile, readFile, stat, writeFile } from 'node:fs/promises'
import { join } from 'node:path'
import {
  Agent, Session, MemoryStore, FileStore, SessionError, builtinTools, contextBreakdown, readTranscript, showSession,
  TranscriptError, type Tool,
} from '../dsh.ts'
import { ScriptedProvider, say } from './scripted-provider.ts'
import { startFakeProvider } from './fake-provider.ts'
import { runDsh, CLEAN_ENV, tempDirs } from './cli-child.ts'

const tempDir = tempDirs('dsh-low-')
const live = () => ({ signal: new AbortController().signal, callId: 'c' })
async function tools(cwd: string): Promise<Record<string, Tool>> {
  return Object.fromEntries((await builtinTools({ cwd })).map((t) => [t.name, t]))
}
/** The message of what `run` rejects with (a test fails when it resolves). */
async function rejection(run: unknown): Promise<string> {
  try { await run } catch (error) { return (error as Error).message }
  assert.fail('expected the call to fail')
}
const MiB = 1024 * 1024
const SCAN = 64 * MiB // read_file's READ_FILE_MAX_SCAN_BYTES
/** `value` nested in `depth` arrays, as JSON text (JSON.parse takes it; JSON.stringify would overflow the stack). */
const nested = (depth: number, value = '0') => '['.repeat(depth) + value + ']'.repeat(depth)

describe('read_file reads at most 64 MiB of a file per call', () => {
  const truncate = (file: string, bytes: number) => {
    const r = spawnSync('truncate', ['-s', String(bytes), file], { encoding: 'utf8' })
    assert.equal(r.status, 0, r.stderr)
  }

  test('a 4 GiB sparse file without a newline: line 1 is shown cut at once, line 2 is refused after 64 MiB (it read toward EOF)', async () => {
    const dir = await tempDir()
    const file = join(dir, 'big')
    await writeFile(file, 'x'.repeat(10_000)) // text first: a NUL in the first 8 KiB would make it "binary"
    truncate(file, 4 * 1024 * MiB)
    assert.equal((await stat(file)).size, 4294967296)
    const { read_file } = await tools(dir)
    const first = await read_file.execute({ path: 'big' }, live()) as string
    assert.equal(first, `     1\t${'x'.repeat(10_000)}${'\0'.repeat(100_000 - 7 - 10_000)}\n[line 1 of big is longer than the output cap of 100000 characters and was cut; the next line is at offset=2; use grep to find text inside this line]`)
    assert.equal(await rejection(read_file.execute({ path: 'big', offset: 2 }, live())),
      `read_file: line 2 of big (4294967296 bytes) does not start within its first ${SCAN} bytes, the most read_file reads per call; use an offset from 1 to 1, or the shell tool, where offered, reads further (e.g. tail -c +${SCAN + 1} 'big' | head -c 100000)`)
  })

  test('lines that cross the 64 MiB mark: those before it are shown, the one it cuts as far as it was read, and the note says how to read on', async () => {
    const dir = await tempDir()
    const file = join(dir, 'log.txt')
    await writeFile(file, 'x'.repeat(10_000) + '\n') // line 1; line 2 is the sparse run of NULs
    truncate(file, SCAN - 1000)
    await appendFile(file, '\n' + Array.from({ length: 400 }, (_, k) => `r${String(k).padStart(4, '0')}\n`).join(''))
    // Row k (line 3 + k) starts at byte SCAN - 999 + 6k: rows 0..165 end before SCAN, row 166 is cut after "r01".
    const { read_file } = await tools(dir)
    const out = await read_file.execute({ path: 'log.txt', offset: 3 }, live()) as string
    const lines = out.split('\n')
    assert.equal(lines.length, 168)
    assert.equal(lines[0], '     3\tr0000')
    assert.equal(lines[165], '   168\tr0165')
    assert.equal(lines[166], '   169\tr01')
    assert.equal(lines[167], `[lines 3-169 of log.txt shown (line 169 up to byte ${SCAN}); read_file reads at most ${SCAN} bytes of a file per call and stopped there (${SCAN + 1401} bytes in all), so what follows is out of its reach; the shell tool, where offered, reads further (e.g. tail -c +${SCAN + 1} 'log.txt' | head -c 100000)]`)
    assert.match(await rejection(read_file.execute({ path: 'log.txt', offset: 200 }, live())), /^read_file: line 200 of log\.txt \(67110265 bytes\) does not start within its first 67108864 bytes, the most read_file reads per call; use an offset from 1 to 169, or /)
    // Within the cap nothing changed: the range note as before.
    assert.equal(await read_file.execute({ path: 'log.txt', offset: 3, limit: 2 }, live()), `     3\tr0000\n     4\tr0001\n[lines 3-4 of log.txt shown; the file continues (${SCAN + 1401} bytes in all); read more with offset=5]`)
  })
})

describe('edit_file replaces at most 10,000 occurrences per call', () => {
  test('replace_all of "a" in 16 MiB of "a" is refused with the count, the size, the limit and the fix; the file is unchanged (it took 2.9 s and +648 MB)', async () => {
    const dir = await tempDir()
    const text = 'a'.repeat(16 * MiB)
    await writeFile(join(dir, 'a.txt'), text)
    const { edit_file } = await tools(dir)
    assert.equal(await rejection(edit_file.execute({ path: 'a.txt', old_string: 'a', new_string: 'b', replace_all: true }, live())),
      'edit_file: old_string occurs more than 10000 times in a.txt (16777216 bytes); replace_all replaces at most 10000 occurrences per call: give old_string more surrounding text so that it matches fewer places, use the shell (e.g. sed) where offered, or write the new content whole with write_file')
    assert.equal(await rejection(edit_file.execute({ path: 'a.txt', old_string: 'a', new_string: 'b' }, live())),
      'edit_file: old_string occurs more than 10000 times in a.txt (at lines 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, …); include more surrounding text to make it unique')
    assert.ok((await readFile(join(dir, 'a.txt'), 'utf8')) === text, 'the file is unchanged')
  })

  test('10,000 occurrences are replaced; 10,001 are refused', async () => {
    const dir = await tempDir()
    await writeFile(join(dir, 'ok.txt'), 'k\n'.repeat(10_000))
    await writeFile(join(dir, 'over.txt'), 'k\n'.repeat(10_001))
    const { edit_file } = await tools(dir)
    assert.match(await edit_file.execute({ path: 'ok.txt', old_string: 'k', new_string: 'v', replace_all: true }, live()) as string, /^edited ok\.txt: replaced 10000 occurrences \(at lines 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, …\)$/)
    assert.equal(await readFile(join(dir, 'ok.txt'), 'utf8'), 'v\n'.repeat(10_000))
    assert.match(await rejection(edit_file.execute({ path: 'over.txt', old_string: 'k', new_string: 'v', replace_all: true }, live())), /^edit_file: old_string occurs more than 10000 times in over\.txt \(20002 bytes\); replace_all replaces at most 10000/)
    assert.equal(await readFile(join(dir, 'over.txt'), 'utf8'), 'k\n'.repeat(10_001))
  })
})

describe('a 100,000-character tool name is quoted at most 200 code points long', () => {
  const name = 'n'.repeat(100_000)

  test('the unknown-tool result quotes 200 code points and "…" (it held the whole name)', async () => {
    const provider = new ScriptedProvider(100_000, [{ message: { role: 'assistant', content: [{ type: 'tool-call', id: 'c1', name, arguments: '{}' }] }, finishReason: 'tool_calls' }, say('done')])
    const agent = new Agent({ session: await Session.open(new MemoryStore()), provider, tools: [] })
    assert.equal((await agent.run('go')).reason, 'stop')
    const result = agent.session.surface().find((n) => n.message.role === 'tool')!.message
    assert.equal((result.content[0] as { text: string }).text, `unknown tool "${'n'.repeat(200)}…"; available tools: none`)
  })

  test('the CLI: no stderr line holds it whole, nor the result sent back (both held all 100,000)', async () => {
    const dir = await tempDir()
    let turn = 0
    const fake = await startFakeProvider({ handler: () => turn++ === 0 ? { toolCalls: [{ id: 'c1', name, arguments: {} }] } : { text: 'done' } })
    try {
      const run = await runDsh(['-p', 'go', '--base-url', fake.url, '--model', 'm', '--context-window', '100000'], dir, { ...CLEAN_ENV, DEEPSEEK_API_KEY: 'k' })
      assert.equal(run.code, 0, run.stderr.slice(0, 500))
      assert.equal(run.stdout, 'done\n')
      const activity = run.stderr.split('\n').find((l) => l.startsWith('▸ '))!
      assert.match(activity, /^▸ n{200}… → unknown tool "n{145}…$/)
      assert.ok(run.stderr.length < 2_000, `stderr is ${run.stderr.length} characters`)
      const result = (fake.requests[1].body as any).messages.find((m: any) => m.role === 'tool')
      assert.ok(result.content.length < 400 && result.content.startsWith(`unknown tool "${'n'.repeat(200)}…"`), `the result is ${result.content.length} characters`)
    } finally { await fake.close() }
  })
})

describe('a 200,000-deep nesting is a clear typed error, never a stack overflow', () => {
  test('dsh replay of a transcript with such a block: exit 2 naming the line and the limit (it printed "internal error", exit 1)', async () => {
    const dir = await tempDir()
    await writeFile(join(dir, 'msgs.json'), `[{"role":"user","content":[{"type":"text","text":"hi"},{"type":"x","v":${nested(200_000)}}]},{"role":"assistant","content":"ok"}]`)
    await writeFile(join(dir, 'cc.jsonl'), '{"type":"user","uuid":"u0","sessionId":"s","message":{"role":"user","content":"hi"}}\n' +
      `{"type":"user","uuid":"u1","parentUuid":"u0","sessionId":"s","message":{"role":"user","content":[{"type":"text","text":"hi"},{"type":"weird","v":${nested(200_000)}}]}}\n`)
    for (const [file, line] of [['msgs.json', 1], ['cc.jsonl', 2]] as const) {
      const run = await runDsh(['replay', file, '--context-window', '100000'], dir)
      assert.equal(run.code, 2, run.stderr.slice(0, 300))
      assert.ok(run.stderr.startsWith(`dsh: replay: ${file}: line ${line}: arrays and objects nested more than 1000 levels deep; replay reads at most 1000 levels (transcripts nest a few dozen): flatten that value or remove it. Accepted formats: `), run.stderr.slice(0, 300))
      assert.equal(run.stderr.split('\n').length, 2, 'one line')
      assert.equal(run.stdout, '')
    }
  })

  test('readTranscript: 1,000 levels in all are read, 1,001 throw TranscriptError with the line of the deep value', () => {
    // The document, its message and its content array are 3 levels; the part object 1 more.
    const doc = (depth: number) => `[{"role":"user","content":[{"type":"x","v":${nested(depth - 4)}}]},\n{"role":"assistant","content":"ok"}]`
    assert.equal(readTranscript(doc(1000), { format: 'openai' }).messages.length, 2)
    assert.throws(() => readTranscript(doc(1001)), (error: unknown) => error instanceof TranscriptError && error.line === 1 && /nested more than 1000 levels deep/.test(error.message))
    const pretty = '[\n  {"role": "user", "content": "hi"},\n  {"role": "assistant", "content": "ok", "extra": ' + nested(5000) + '}\n]'
    assert.throws(() => readTranscript(pretty), (error: unknown) => error instanceof TranscriptError && error.line === 3)
  })

  test('a tool-call argument nested 200,000 deep: the tool names it instead of a stack overflow (it said "Maximum call stack size exceeded")', async () => {
    const dir = await tempDir()
    const { read_file, grep } = await tools(dir)
    const deep = JSON.parse(nested(200_000))
    assert.equal(await rejection(read_file.execute({ path: deep }, live())), 'read_file: "path" must be a string, got an array nested too deeply to print')
    assert.equal(await rejection(read_file.execute({ path: 'a', offset: deep }, live())), 'read_file: "offset" must be an integer from 1 to 9007199254740991 (a 1-based line number), got an array nested too deeply to print')
    assert.equal(await rejection(grep.execute({ pattern: 'a', ignore_case: { a: deep } }, live())), 'grep: "ignore_case" must be true or false, got an object nested too deeply to print')
    // A long value is quoted capped too (it was quoted whole).
    assert.equal(await rejection(read_file.execute({ path: ['x'.repeat(100_000)] }, live())), `read_file: "path" must be a string, got ["${'x'.repeat(198)}…`)
  })
})

describe('dsh show tolerates a compaction event without shadowedSeqs', () => {
  test('a prune without shadowedSeqs and a clear without shadowedTokenCount are shown, saying what is missing (show crashed: TypeError)', async () => {
    const session = await Session.open(new MemoryStore())
    session.append('turn/start', { turn: 1 })
    session.append('user/message', { message: { role: 'user', content: 'read it' }, surfaceOp: { op: 'append' } })
    session.append('assistant/message', { message: { role: 'assistant', content: [{ type: 'tool-call', id: 'r1', name: 'read_file', arguments: '{"path":"a"}' }, { type: 'tool-call', id: 'r2', name: 'read_file', arguments: '{"path":"b"}' }] }, surfaceOp: { op: 'append' } })
    const one = session.append('tool/result', { message: { role: 'tool', toolCallId: 'r1', content: [{ type: 'text', text: 'A'.repeat(4000) }] }, surfaceOp: { op: 'append' } }).seq
    const two = session.append('tool/result', { message: { role: 'tool', toolCallId: 'r2', content: [{ type: 'text', text: 'B'.repeat(4000) }] }, surfaceOp: { op: 'append' } }).seq
    // Written by other code: each compaction event misses one of its fields.
    const prune = session.append('compaction/prune', { shadowedTokenCount: 1008 } as any).seq
    session.append('tool/result', { message: { role: 'tool', toolCallId: 'r1', content: [{ type: 'text', text: 'A…' }] }, surfaceOp: { op: 'replace', start: one, end: one } })
    const clear = session.append('compaction/clear', { shadowedSeqs: [two] } as any).seq
    session.append('tool/result', { message: { role: 'tool', toolCallId: 'r2', content: [{ type: 'text', text: '[cleared]' }] }, surfaceOp: { op: 'replace', start: two, end: two } })
    session.append('turn/end', { turn: 1, reason: 'stop' })
    const out = await showSession(session, { name: 's.jsonl' })
    assert.ok(out.includes(`\n  [prune] #${prune} tool result (the event has no shadowedSeqs): 1,008 tokens → 9 tokens (999 tokens reclaimed)\n`), out)
    assert.ok(out.includes(`\n  [clear] #${clear} tool result #${two}: ? tokens (the event has no shadowedTokenCount) → 11 tokens\n`), out)
    assert.match(out, /^dsh show s\.jsonl: \d+ events, 1 turn\(s\), 0 step\(s\), 1 prune\(s\), 1 clear\(s\), 0 compaction\(s\)/)
    // /context reads the same events: what is there is counted, nothing crashes.
    const breakdown = await contextBreakdown(session, 100_000)
    assert.deepEqual(breakdown.shadowed.pruned, { tokens: 1008, messages: 0 })
    assert.deepEqual(breakdown.shadowed.cleared, { tokens: 0, messages: 1 })
  })
})

test('grep: an invalid glob is a grep: error that says how to fix it (it was a bare "Invalid regular expression")', async () => {
  const dir = await tempDir()
  await writeFile(join(dir, 'a.ts'), 'x\n')
  const { grep } = await tools(dir)
  assert.equal(await rejection(grep.execute({ pattern: 'x', glob: '[z-a]' }, live())),
    'grep: "glob" "[z-a]" is not a valid glob (Range out of order in character class); fix it, e.g. "*.ts" or "src/**/*.{js,mjs}", or leave it out')
  const long = await rejection(grep.execute({ pattern: 'x', glob: 'g'.repeat(100_000) + '[z-a]' }, live()))
  assert.equal(long, `grep: "glob" "${'g'.repeat(200)}…" is not a valid glob (Range out of order in character class); fix it, e.g. "*.ts" or "src/**/*.{js,mjs}", or leave it out`)
  assert.equal(await grep.execute({ pattern: 'x', glob: '*.ts' }, live()), 'a.ts:1:x\n[1 matching line in 1 file; 1 file searched]')
})

describe('replay reads a dsh log by the rule resume reads it: contiguous seqs from 0', () => {
  const ev = (seq: number, type: string, data: object) => JSON.stringify({ seq, type, time: 1_700_000_000_000 + seq, data })
  const user = { message: { role: 'user', content: 'hi' }, surfaceOp: { op: 'append' } }
  const assistant = { message: { role: 'assistant', content: [{ type: 'text', text: 'yo' }] }, surfaceOp: { op: 'append' } }
  const start = { id: 's', version: '0.1.0' }
  // [name, the log's seqs, the 1-based line of the first bad one, what both say about it]
  const CASES: Array<[string, number[], number, string]> = [
    ['a duplicate seq', [0, 1, 2, 2], 4, 'seq 2 where 3 was expected (events must be contiguous)'],
    ['a gap', [0, 1, 3, 4], 3, 'seq 3 where 2 was expected (events must be contiguous)'],
    ['a log that does not start at 0', [5, 6, 7, 8], 1, 'seq 5 where 0 was expected (events must be contiguous)'],
    ['seqs out of order', [0, 2, 1, 3], 2, 'seq 2 where 1 was expected (events must be contiguous)'],
  ]
  for (const [name, seqs, line, says] of CASES) {
    test(`${name}: replay refuses it with the line and the words resume uses (replay read it)`, async () => {
      const types = ['session/start', 'turn/start', 'user/message', 'assistant/message']
      const datas = [start, { turn: 1 }, user, assistant]
      const text = seqs.map((seq, i) => ev(seq, types[i], datas[i])).join('\n') + '\n'
      assert.throws(() => readTranscript(text), (error: unknown) => error instanceof TranscriptError && error.line === line
        && error.field === 'seq' && error.message.includes(`${says}; dsh would not resume this log either: replay the part before this line (head -n ${line - 1})`))
      const dir = await tempDir()
      await writeFile(join(dir, 'log.jsonl'), text)
      // Resume refuses the same file with the same words.
      await assert.rejects(Session.open(new FileStore(join(dir, 'log.jsonl'))), (error: unknown) => error instanceof SessionError
        && error.code === 'LOG_CORRUPT' && error.message === `session log line ${line}: ${says}`)
      const run = await runDsh(['replay', 'log.jsonl', '--context-window', '1000'], dir)
      assert.equal(run.code, 2, run.stderr)
      assert.ok(run.stderr.startsWith(`dsh: replay: log.jsonl: line ${line}, field seq: ${says}; `), run.stderr)
      assert.equal(run.stdout, '')
    })
  }

  test('the same log with contiguous seqs is read by both (the control)', async () => {
    const text = [ev(0, 'session/start', start), ev(1, 'turn/start', { turn: 1 }), ev(2, 'user/message', user), ev(3, 'assistant/message', assistant)].join('\n') + '\n'
    assert.deepEqual(readTranscript(text).messages.map((m) => m.role), ['user', 'assistant'])
    const dir = await tempDir()
    await writeFile(join(dir, 'log.jsonl'), text)
    const store = new FileStore(join(dir, 'log.jsonl'))
    const session = await Session.open(store, { readOnly: true })
    assert.equal(session.seq, 4)
    await store.close()
  })
})

describe('replay of a bad input file: a clear error or a note, never a hang or an absurd report', () => {
  test('a FIFO, a device, a directory and a file over 256 MiB are refused at once, exit 2 (a FIFO hung replay for good; /dev/zero read until the heap gave out)', async () => {
    const dir = await tempDir()
    const made = spawnSync('mkfifo', [join(dir, 'pipe')])
    assert.equal(made.status, 0, String(made.stderr))
    await writeFile(join(dir, 'big.json'), '')
    const r = spawnSync('truncate', ['-s', String(257 * MiB), join(dir, 'big.json')]) // sparse: no disk used
    assert.equal(r.status, 0, String(r.stderr))
    const CASES: Array<[string, string]> = [
      ['pipe', 'it is a FIFO, not a regular file; give the transcript file itself'],
      ['/dev/zero', 'it is a device, not a regular file; give the transcript file itself'],
      ['.', 'it is a directory, not a regular file; give the transcript file itself'],
      ['big.json', `it is ${257 * MiB} bytes; replay reads transcripts of at most ${256 * MiB} bytes (256 MiB): split it, or replay one session of it`],
    ]
    for (const [file, says] of CASES) {
      const run = await runDsh(['replay', file, '--context-window', '1000'], dir, CLEAN_ENV, undefined, 15_000)
      assert.equal(run.code, 2, `${file}: ${run.stderr}`)
      assert.equal(run.stderr, `dsh: replay: cannot read ${file}: ${says}\n`)
    }
  })

  test('usage figures that are no token count (1e308, negative, cached over the prompt) are ignored with a note; the report has no 1e+308 (it calibrated on them: "$1.53e+301")', async () => {
    const messages = [
      { role: 'user', content: 'go' },
      { role: 'assistant', content: 'a', usage: { prompt_tokens: 1e308, completion_tokens: 1e308 } },
      { role: 'user', content: 'again' },
      { role: 'assistant', content: 'b', usage: { prompt_tokens: -5, completion_tokens: 3 } },
      { role: 'user', content: 'and' },
      { role: 'assistant', content: 'c', usage: { prompt_tokens: 120, completion_tokens: 4, prompt_tokens_details: { cached_tokens: 9e99 } } },
      { role: 'user', content: 'last' },
      { role: 'assistant', content: 'd', usage: { prompt_tokens: 150, completion_tokens: 5 } },
    ]
    const t = readTranscript(JSON.stringify(messages))
    assert.deepEqual(t.usage, [undefined, undefined, { promptTokens: 120, completionTokens: 4 }, { promptTokens: 150, completionTokens: 5 }])
    assert.ok(t.notes.includes('ignored 3 usage figure(s) that are no token count from 0 to 1000000000 (negative, not finite or absurd): [1], [3], [5]'), t.notes.join('\n'))
    const dir = await tempDir()
    await writeFile(join(dir, 'usage.json'), JSON.stringify(messages))
    const run = await runDsh(['replay', 'usage.json', '--context-window', '10000'], dir)
    assert.equal(run.code, 0, run.stderr)
    assert.ok(!/e\+\d|Infinity|NaN/.test(run.stdout), run.stdout)
  })
})
