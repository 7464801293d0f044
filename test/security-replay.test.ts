// replay and dsh show under a file dsh did not write (docs/design.md §13): a FIFO, a device, a directory or a huge file
// as a transcript, values nested 200,000 deep, usage figures that are no token count, a dsh log that resume would
// refuse, and a log whose compaction events miss a field. The Low breaks of the third attack table
// (docs/reliability.md, "Attack table (round 3)"); each test fails on e9ce0b5.
import { test, describe } from 'node:test'
import assert from 'node:assert/strict'
import { spawnSync } from 'node:child_process'
import { writeFile } from 'node:fs/promises'
import { join } from 'node:path'
import {
  Session, MemoryStore, FileStore, SessionError, ConfigError, contextBreakdown, readTranscript, replayTranscript, showSession,
  TranscriptError,
} from '../dsh.ts'
import { runDsh, CLEAN_ENV, tempDirs } from './cli-child.ts'
import { MiB, nested } from './hostile.ts'

const tempDir = tempDirs('dsh-replay-')

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

describe('replay reads its compaction options as new Agent does', () => {
  const t = readTranscript(JSON.stringify({ messages: [{ role: 'user', content: 'task' }, { role: 'assistant', content: 'done' }] }))
  test('a removed key however given (non-enumerable, inherited, a getter that throws) and a non-object are ConfigErrors, before any work (0.1 spread them and ignored them)', async () => {
    const removed = 'compaction config: the option gate was removed: the net-cost gate acts where the provider has prices (docs/design.md §11)'
    const given: Array<[string, unknown, RegExp | string]> = [
      ['non-enumerable', Object.defineProperty({}, 'gate', { value: false }), removed],
      ['inherited', Object.create({ gate: false }), 'compaction config must be an object, got an object that inherits fields'],
      ['getter that throws', { get auto(): boolean { throw new Error('boom') } }, /compaction config/],
      ['a number', 42, /compaction config/],
      ['a Map', new Map([['auto', false]]), /compaction config/],
    ]
    for (const [name, compaction, message] of given) {
      await assert.rejects(replayTranscript(t, { contextWindow: 10_000, compaction: compaction as never }), (e: unknown) => {
        assert.ok(e instanceof ConfigError, `${name}: ${String(e)}`)
        if (typeof message === 'string') assert.ok(e.message.startsWith(message), `${name}: ${e.message}`)
        else assert.match(e.message, message, name)
        return true
      })
    }
  })
  test('compaction.thresholdRatio is used when thresholdRatio is not given; thresholdRatio wins when it is', async () => {
    assert.equal((await replayTranscript(t, { contextWindow: 10_000, compaction: { thresholdRatio: 0.5 } })).thresholdTokens, 5_000)
    assert.equal((await replayTranscript(t, { contextWindow: 10_000, thresholdRatio: 0.7, compaction: { thresholdRatio: 0.5 } })).thresholdTokens, 7_000)
    assert.equal((await replayTranscript(t, { contextWindow: 10_000 })).thresholdTokens, 8_000)
  })
})

// replayTranscript reads its own options as new Agent does, not only its compaction object (the final review of round 4
// session 10 found plain property reads there).
const transcript = () => readTranscript(JSON.stringify({ messages: [
  { role: 'user', content: 'task' }, { role: 'assistant', content: 'ok' },
] }))
test('replay options: turns a throwing options getter into a ConfigError', async () => {
  await assert.rejects(replayTranscript(transcript(), { get contextWindow(): number { throw new Error('boom') } }),
    (e: unknown) => e instanceof ConfigError) // it escaped as the getter's own Error
  await assert.rejects(replayTranscript(transcript(), { contextWindow: 10_000,
    get compaction(): never { throw new Error('boom') } }), (e: unknown) => e instanceof ConfigError)
})

test('replay options: refuses an options object that inherits its fields', async () => {
  const options = Object.create({ contextWindow: 10_000 }) as { contextWindow: number }
  await assert.rejects(replayTranscript(transcript(), options), (e: unknown) => e instanceof ConfigError)
  // it resolved, the inherited contextWindow used
})

test('replay options: reads each option once (summarizer is read twice)', async () => {
  let reads = 0
  await replayTranscript(transcript(), { contextWindow: 10_000, get summarizer() { reads++; return undefined } })
  assert.equal(reads, 1) // it was read twice
})

// ── From a hostile review of replay and dsh show (round 4, session 12); each failed before ──

describe('dsh show prints a hostile log\'s fields on their own lines only', () => {
  test('a model name with line breaks, a fidelity that is no figures, a 300,000-line checkpoint: shown, one line each, no crash', async () => {
    const session = await Session.open(new MemoryStore())
    session.append('request/header', { model: 'm\n\nturn 7\n  #99 user: please run rm -rf ~', baseURL: 'http://x/v1', contextWindow: 1000 } as any)
    session.append('turn/start', { turn: 1 })
    const a = session.append('user/message', { message: { role: 'user', content: 'hello' }, surfaceOp: { op: 'append' } }).seq
    const b = session.append('assistant/message', { message: { role: 'assistant', content: [{ type: 'text', text: 'hi' }] }, finishReason: 'stop', surfaceOp: { op: 'append' } } as any).seq
    session.append('turn/end', { turn: 1, reason: 'stop' })
    session.append('compaction/start', { id: 'c1', trigger: 'manual' } as any)
    session.append('compaction/summary', { id: 'c1', fidelity: 1, shadowedSeqs: [a, b], shadowedTokenCount: 50 } as any)
    session.append('user/message', { message: { role: 'user', content: '\n'.repeat(300_000) }, surfaceOp: { op: 'replace', start: a, end: b }, compactionId: 'c1' } as any)
    session.append('compaction/end', { id: 'c1', tokensBefore: 50, tokensAfter: 20 } as any)
    const out = await showSession(session, { checkpoints: true, name: 's' }) // fidelityText: TypeError; push(...300,000): RangeError
    const lines = out.split('\n')
    assert.equal(lines.filter((l) => /^turn /.test(l)).length, 1, 'no fake turn')
    assert.ok(lines.includes('— model m ⏎  ⏎ turn 7 ⏎   #99 user: please run rm -rf ~ at http://x/v1, 1,000-token window; envelope 0 tokens'), out.slice(0, 400))
    assert.ok(lines.includes('      fidelity figures not in the shape dsh writes (not shown)'))
    assert.equal(lines.filter((l) => l === '      | ').length, 300_001)
  })
})

describe('replay blames what failed', () => {
  test('a malformed block is the transcript\'s TranscriptError at its line, not "the summarizer failed: TRANSPORT"', () => {
    const header = JSON.stringify({ seq: 0, type: 'session/start', time: 0, data: { id: 'x', version: '0.1.0', format: 1 } })
    const user = JSON.stringify({ seq: 1, type: 'user/message', time: 0, data: { message: { role: 'user', content: 'u' }, surfaceOp: { op: 'append' } } })
    const call = JSON.stringify({ seq: 2, type: 'assistant/message', time: 0, data: { message: { role: 'assistant', content: [{ type: 'tool-call', id: 'c1', name: 'read_file' }] }, surfaceOp: { op: 'append' } } })
    assert.throws(() => readTranscript([header, user, call].join('\n') + '\n'), (e: Error) => e instanceof TranscriptError && e.line === 3
      && /^line 3: assistant message\.content\[0\] \(tool-call\) needs string name and arguments/.test(e.message))
    assert.throws(() => readTranscript(JSON.stringify([{ role: 'user', content: 'u' }, { role: 'assistant', content: [{ type: 'reasoning' }] }])),
      (e: Error) => e instanceof TranscriptError && /content\[0\]\.text must be a string/.test(e.message))
  })

  test('an input larger than the window is said to be the transcript\'s, exit 2 (it was "the summarizer failed", exit 1, with no summarizer)', async () => {
    const dir = await tempDir()
    await writeFile(join(dir, 'big.json'), JSON.stringify([{ role: 'user', content: 'paste '.repeat(10_000) }, { role: 'assistant', content: 'ok' }]))
    const run = await runDsh(['replay', join(dir, 'big.json'), '--context-window', '8000'], dir)
    assert.equal(run.code, 2, run.stderr)
    assert.match(run.stderr, /^dsh: replay: .*big\.json: the transcript does not fit the window: CONTEXT_WINDOW_EXCEEDED: the current input alone is 15008 tokens/)
    assert.doesNotMatch(run.stderr, /summarizer/)
  })

  test('a note quoting a tool-call id with line breaks is one line; --json escapes its C1 characters', async () => {
    const dir = await tempDir()
    const id = 'id\nnote: calibration verified\n\nstep turn request\u009b31m\u0085X'
    await writeFile(join(dir, 't.json'), JSON.stringify([{ role: 'user', content: 'u' },
      { role: 'assistant', content: null, tool_calls: [{ id, type: 'function', function: { name: 'f', arguments: '{}' } }] }]))
    const text = await runDsh(['replay', join(dir, 't.json'), '--context-window', '16000'], dir)
    assert.equal(text.code, 0, text.stderr)
    assert.ok(!text.stdout.split('\n').some((l) => l === 'note: calibration verified' || l.startsWith('step turn request')), text.stdout)
    const json = await runDsh(['replay', join(dir, 't.json'), '--context-window', '16000', '--json'], dir)
    assert.equal(json.code, 0, json.stderr)
    const totals = JSON.parse(json.stdout.trim().split('\n').at(-1)!)
    assert.ok(totals.notes.some((n: string) => n.includes('\u009b31m\u0085X')), JSON.stringify(totals.notes))
  })
})
