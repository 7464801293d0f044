// Core tests: meter, pruner, session log and surface, stores (docs/design.md §§1–4; issue 2).
import { test, describe } from 'node:test'
import assert from 'node:assert/strict'
import { mkdtempSync, writeFileSync, readFileSync, appendFileSync, readdirSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import {
  VERSION, PRUNE_MARKER, DEFAULT_PRUNE_CONFIG, codePointLength, pruneText, pruneToolResult, estimateTextTokens,
  estimateMessageTokens, Session, MemoryStore, FileStore, SessionError, type ToolResultMessage, type Message,
  type Block, ConfigError, internals,
} from './dsh.ts'
import {
  estimateEnvelopeTokens,
} from './test/spec.ts'

const { spillToolResult, stateOf } = internals
import { logEvents } from './test/shared.ts'
import { logHeader } from './test/spec.ts'

const toolResult = (text: string, id = 'call_1'): ToolResultMessage => ({ role: 'tool', toolCallId: id, content: [{ type: 'text', text }] })
const textOf = (m: ToolResultMessage) => m.content.filter((b) => b.type === 'text').map((b) => (b as { text: string }).text).join('')
const hasLoneSurrogate = (s: string) => /[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/.test(s)

test('version is semver', () => { assert.match(VERSION, /^\d+\.\d+\.\d+$/) })

describe('meter (docs/design.md §2)', () => {
  test('worked check: a 200,000-char tool result is 50,008 tokens; pruned it is 5,159 code points and 1,298 tokens', () => {
    const big = toolResult('x'.repeat(200_000))
    assert.equal(estimateMessageTokens(big), 50_008)
    const pruned = pruneToolResult(big)
    assert.equal(codePointLength(textOf(pruned)), 5_159)
    assert.equal(estimateMessageTokens(pruned), 1_298)
  })
  const cases: Array<[string, Message, number]> = [
    ['empty user string', { role: 'user', content: '' }, 8],
    ['user string of 5 units', { role: 'user', content: 'hello' }, 10],
    ['assistant text + reasoning (3 + 6 units)', { role: 'assistant', content: [{ type: 'text', text: 'abc' }, { type: 'reasoning', text: 'defghi' }] }, 11],
    ['tool-call name + arguments (4 + 13 units)', { role: 'assistant', content: [{ type: 'tool-call', id: 'c1', name: 'read', arguments: '{"path":"a"}' + ' ' }] }, 13],
    ['emoji counts UTF-16 units (2 each)', { role: 'user', content: '😀😀' }, 9],
    ['non-text block priced by its JSON length', { role: 'user', content: [{ type: 'image', url: 'data:x' }] }, 8 + Math.ceil(JSON.stringify({ type: 'image', url: 'data:x' }).length / 4)],
  ]
  for (const [name, message, tokens] of cases) test(name, () => assert.equal(estimateMessageTokens(message), tokens))
  test('estimateTextTokens is ceil(length/4)', () => {
    assert.deepEqual(['', 'a', 'abcd', 'abcde'].map(estimateTextTokens), [0, 1, 1, 2])
  })
  test('envelope: system and tools each cost ceil(len/4)+8; absent parts cost 0', () => {
    const tools = [{ name: 'read_file', description: 'Read a file', parameters: { type: 'object' } }]
    assert.equal(estimateEnvelopeTokens({}), 0)
    assert.equal(estimateEnvelopeTokens({ system: 'x'.repeat(100) }), 33)
    assert.equal(estimateEnvelopeTokens({ system: 'x'.repeat(100), tools }), 33 + Math.ceil(JSON.stringify(tools).length / 4) + 8)
  })
})

describe('pruner (docs/design.md §3)', () => {
  test('marker and defaults', () => {
    assert.equal(codePointLength(PRUNE_MARKER), 39)
    assert.deepEqual({ ...DEFAULT_PRUNE_CONFIG }, { thresholdChars: 8192, headChars: 4096, tailChars: 1024 })
  })

  const emoji = '😀'
  const cjk = '漢'
  const shapes: Array<[string, string]> = [
    ['9,000 emoji', emoji.repeat(9000)],
    ['cut on surrogate boundaries (ASCII prefix shifts parity)', 'a' + emoji.repeat(9000) + 'b'],
    ['odd offset before emoji', 'abc' + emoji.repeat(4200) + 'xy'.repeat(100) + emoji.repeat(4200)],
    ['CJK text', cjk.repeat(9000)],
    ['mixed CJK, emoji, ASCII', (cjk + emoji + 'a').repeat(3000)],
  ]
  for (const [name, text] of shapes) {
    test(`code-point safe: ${name}`, () => {
      const out = pruneText(text)
      assert.equal(codePointLength(out), 4096 + 39 + 1024)
      assert.equal(hasLoneSurrogate(out), false)
      assert.equal(JSON.parse(JSON.stringify(out)), out)
      assert.equal(new TextDecoder('utf-8', { fatal: true }).decode(new TextEncoder().encode(out)), out)
      const cps = Array.from(text)
      assert.equal(out, cps.slice(0, 4096).join('') + PRUNE_MARKER + cps.slice(-1024).join(''))
    })
  }

  test('threshold is inclusive: 8,192 code points untouched, 8,193 pruned', () => {
    const at = emoji.repeat(8192)
    assert.equal(pruneText(at), at)
    const msg = toolResult(at)
    assert.equal(pruneToolResult(msg), msg)
    const over = emoji.repeat(8193)
    assert.equal(codePointLength(pruneText(over)), 5159)
    assert.notEqual(pruneToolResult(toolResult(over)), toolResult(over))
  })

  test('idempotent: pruning a pruned result returns the same object', () => {
    const once = pruneToolResult(toolResult('y'.repeat(50_000)))
    assert.equal(pruneToolResult(once), once)
    assert.equal(pruneText(textOf(once)), textOf(once))
  })

  test('non-text blocks keep their relative positions; other fields unchanged', () => {
    const image = { type: 'image', data: 'AAAA', mimeType: 'image/png' }
    const unknown = { type: 'thinking-trace', note: 'kept as is' }
    const msg: ToolResultMessage = {
      role: 'tool', toolCallId: 'call_9', isError: true, metadata: { exit: 2 },
      content: [{ type: 'text', text: 'A'.repeat(3000) }, image, { type: 'text', text: 'B'.repeat(5000) }, unknown, { type: 'text', text: 'C'.repeat(3000) }],
    }
    const out = pruneToolResult(msg)
    assert.deepEqual(out.content, [
      { type: 'text', text: 'A'.repeat(3000) },
      image,
      { type: 'text', text: 'B'.repeat(1096) + PRUNE_MARKER },
      unknown,
      { type: 'text', text: 'C'.repeat(1024) },
    ])
    assert.equal(out.toolCallId, 'call_9'); assert.equal(out.isError, true); assert.deepEqual(out.metadata, { exit: 2 })
    assert.equal(codePointLength(textOf(out)), 5159)
  })

  test('text blocks wholly inside the cut are dropped; head and tail in one block', () => {
    const msg: ToolResultMessage = { role: 'tool', toolCallId: 'c', content: [{ type: 'text', text: 'h'.repeat(5000) }, { type: 'text', text: 'm'.repeat(5000) }, { type: 'text', text: 't'.repeat(2000) }] }
    assert.deepEqual(pruneToolResult(msg).content, [{ type: 'text', text: 'h'.repeat(4096) + PRUNE_MARKER }, { type: 'text', text: 't'.repeat(1024) }])
    const one = pruneToolResult(toolResult('a'.repeat(4096) + 'b'.repeat(5000) + 'c'.repeat(1024)))
    assert.deepEqual(one.content, [{ type: 'text', text: 'a'.repeat(4096) + PRUNE_MARKER + 'c'.repeat(1024) }])
  })

  test('config validation names the numbers and unknown keys', () => {
    assert.throws(() => pruneText('x', { headChars: 5000, tailChars: 4000 }), (e: Error) =>
      e instanceof ConfigError && /5000/.test(e.message) && /4000/.test(e.message) && /8192/.test(e.message))
    assert.throws(() => pruneText('x', { headChar: 10 } as never), /unknown key "headChar"/)
    assert.throws(() => pruneText('x', { headChars: 1.5 }), /headChars must be a non-negative integer/)
    assert.throws(() => pruneText('x', { tailChars: -1 }), /tailChars must be a non-negative integer/)
    assert.equal(pruneText('x'.repeat(200), { thresholdChars: 100, headChars: 30, tailChars: 31 }), 'x'.repeat(30) + PRUNE_MARKER + 'x'.repeat(31))
  })

  test('code-point cuts never split a surrogate pair (a grapheme cluster may be split)', () => {
    const family = '👨‍👩‍👧' // 5 code points, one grapheme
    const text = 'a'.repeat(4094) + family + 'z'.repeat(8000)
    const plain = pruneText(text)
    assert.ok(plain.startsWith('a'.repeat(4094) + '👨‍' + PRUNE_MARKER)) // code-point cut splits the cluster
    assert.equal(hasLoneSurrogate(plain), false)
  })
})

/** Builds a session with two assistant calls A and B answered as A-result, B-result (issue 2 case 6). */
function interleaved(session: Session) {
  session.append('user/message', { message: { role: 'user', content: 'do two things' }, surfaceOp: { op: 'append' } })
  const a = session.append('assistant/message', { message: { role: 'assistant', content: [{ type: 'tool-call', id: 'A', name: 't', arguments: '{}' }] }, finishReason: 'tool_calls', surfaceOp: { op: 'append' } })
  const b = session.append('assistant/message', { message: { role: 'assistant', content: [{ type: 'tool-call', id: 'B', name: 't', arguments: '{}' }] }, finishReason: 'tool_calls', surfaceOp: { op: 'append' } })
  const ra = session.append('tool/result', { message: toolResult('a'.repeat(9000), 'A'), surfaceOp: { op: 'append' } })
  const rb = session.append('tool/result', { message: toolResult('b', 'B'), surfaceOp: { op: 'append' } })
  return { a: a.seq, b: b.seq, ra: ra.seq, rb: rb.seq }
}

/** Every call on the projection has a result and every result its call (by id). */
function assertPaired(messages: Message[]) {
  const calls = new Set<string>(), results = new Set<string>()
  for (const m of messages) {
    if (m.role === 'assistant') for (const b of m.content) if (b.type === 'tool-call') calls.add((b as { id: string }).id)
    if (m.role === 'tool') results.add(m.toolCallId)
  }
  assert.deepEqual([...calls].sort(), [...results].sort())
}

describe('session log and surface (docs/design.md §4)', () => {
  test('seq is contiguous and prune follows the log protocol', async () => {
    const session = await Session.open(new MemoryStore(), { id: 's1', now: () => 1000 })
    const { ra } = interleaved(session)
    assert.deepEqual(session.events.map((e) => e.seq), [0, 1, 2, 3, 4, 5])
    const before = session.measure().totalTokens
    const reclaimed = pruneToolResult(session, ra)
    assert.equal(reclaimed, (8 + 9000 / 4) - (8 + Math.ceil(5159 / 4)))
    const [prune, result] = session.events.slice(-2)
    assert.deepEqual(prune.data, { shadowedSeqs: [ra], shadowedTokenCount: 8 + 9000 / 4 })
    assert.deepEqual((result.data as any).surfaceOp, { op: 'replace', start: ra, end: ra })
    assert.equal(session.replaceGeneration, 1)
    assert.equal(session.measure().totalTokens, before - reclaimed)
    assert.equal(pruneToolResult(session, result.seq), 0) // idempotent: no event
    assert.equal(session.events.length, 8)
    assert.equal((session.events[ra].data as any).message.content[0].text.length, 9000) // original kept
  })

  test('case 6: A-call, B-call, A-result, B-result — no replace may separate a call from its result', async () => {
    const session = await Session.open()
    const { a, b, ra, rb } = interleaved(session)
    assertPaired(session.messages())
    const summary = (text: string) => ({ message: { role: 'user' as const, content: text }, surfaceOp: { op: 'replace' as const, start: a, end: 0 } })
    const bad: Array<[number, number]> = [[a, b], [a, ra], [b, ra], [ra, rb], [b, rb], [a, a]]
    for (const [start, end] of bad) {
      const gen = session.replaceGeneration, seq = session.seq
      assert.throws(() => session.append('user/message', { ...summary('s'), surfaceOp: { op: 'replace', start, end } }), (e: SessionError) => e.code === 'PAIRING', `${start}..${end}`)
      assert.equal(session.replaceGeneration, gen); assert.equal(session.seq, seq)
    }
    session.append('user/message', { ...summary('checkpoint'), surfaceOp: { op: 'replace', start: a, end: rb } })
    assertPaired(session.messages())
    assert.deepEqual(session.messages().map((m) => m.role), ['user', 'user'])
  })

  test('case 7: bad replace ranges throw and change nothing', async () => {
    const session = await Session.open()
    const { a, rb } = interleaved(session)
    const snapshot = () => [session.seq, session.replaceGeneration, JSON.stringify(session.messages())]
    const before = snapshot()
    for (const [start, end] of [[rb, a], [a, 999], [-1, a], [0, a]]) {
      assert.throws(() => session.append('user/message', { message: { role: 'user', content: 'x' }, surfaceOp: { op: 'replace', start, end } }), SessionError)
      assert.deepEqual(snapshot(), before)
    }
  })

  test('tool/result replace may change only content; results need a known, unanswered call', async () => {
    const session = await Session.open()
    const { ra } = interleaved(session)
    assert.throws(() => session.append('tool/result', { message: { ...toolResult('x', 'A'), isError: true }, surfaceOp: { op: 'replace', start: ra, end: ra } }), /only content/)
    assert.throws(() => session.append('tool/result', { message: toolResult('x', 'Z'), surfaceOp: { op: 'append' } }), /unknown tool call id "Z"/)
    assert.throws(() => session.append('tool/result', { message: toolResult('x', 'A'), surfaceOp: { op: 'append' } }), /already has a result/)
    assert.throws(() => session.append('assistant/message', { message: { role: 'assistant', content: [{ type: 'tool-call', id: 'A', name: 't', arguments: '' }] }, finishReason: 'x', surfaceOp: { op: 'append' } }), /not unique/)
    assert.throws(() => session.append('user/message', { message: { role: 'user', content: 42 } as never, surfaceOp: { op: 'append' } }), (e: SessionError) => e.code === 'INVALID_MESSAGE')
  })

  test('projection refuses a call without a result', async () => {
    const session = await Session.open()
    session.append('assistant/message', { message: { role: 'assistant', content: [{ type: 'tool-call', id: 'X', name: 't', arguments: '{}' }] }, finishReason: 'tool_calls', surfaceOp: { op: 'append' } })
    assert.throws(() => session.messages(), /X have no result/)
  })

  test('usage anchor: provider figure plus signed heuristic changes since; envelope change drops it', async () => {
    const session = await Session.open()
    logHeader(session, { model: 'm', baseURL: 'http://x', system: 'S'.repeat(40) }) // 10 + 8
    session.append('user/message', { message: { role: 'user', content: 'u'.repeat(400) }, surfaceOp: { op: 'append' } }) // 108
    assert.deepEqual([session.measure().totalTokens, session.measure().anchored], [126, false])
    session.append('assistant/message', { message: { role: 'assistant', content: [{ type: 'tool-call', id: 'c', name: 'read', arguments: '{}' + 'x'.repeat(6) }] }, finishReason: 'tool_calls', usage: { promptTokens: 500, completionTokens: 20 }, surfaceOp: { op: 'append' } }) // 3 + 8
    assert.deepEqual([session.measure().totalTokens, session.measure().anchored], [520, true])
    const r = session.append('tool/result', { message: toolResult('r'.repeat(40_000), 'c'), surfaceOp: { op: 'append' } }) // 10,008
    assert.equal(session.measure().totalTokens, 520 + 10_008)
    pruneToolResult(session, r.seq) // −10,008 + 1,298
    assert.equal(session.measure().totalTokens, 520 + 1_298)
    // A low provider figure never undercounts: heuristic at anchor (137) beats 50.
    session.append('user/message', { message: { role: 'user', content: 'next' }, surfaceOp: { op: 'append' } })
    session.append('assistant/message', { message: { role: 'assistant', content: [{ type: 'text', text: 'ok' }] }, finishReason: 'stop', usage: { promptTokens: 40, completionTokens: 10 }, surfaceOp: { op: 'append' } })
    const m = session.measure()
    assert.equal(m.totalTokens, m.heuristicTokens)
    logHeader(session, { model: 'm', baseURL: 'http://x', system: 'changed' })
    assert.equal(session.measure().anchored, false)
  })

  test('case 9: a reloaded session derives the same messages and replaceGeneration', async () => {
    const store = new MemoryStore()
    const live = await Session.open(store)
    const { ra, a, rb } = interleaved(live)
    pruneToolResult(live, ra)
    live.append('user/message', { message: { role: 'user', content: 'summary' }, surfaceOp: { op: 'replace', start: a, end: rb } })
    await live.sync()
    const again = await Session.open(store, { readOnly: true })
    assert.deepEqual(again.messages(), live.messages())
    assert.equal(again.replaceGeneration, live.replaceGeneration)
    assert.equal(again.replaceGeneration, 2)
    assert.deepEqual(again.measure().totalTokens, live.measure().totalTokens)
  })
})

describe('FileStore', () => {
  const tmp = () => mkdtempSync(join(tmpdir(), 'dsh-test-'))

  test('round trip through JSONL, and resume', async () => {
    const file = join(tmp(), 's.jsonl')
    const live = await Session.open(new FileStore(file))
    interleaved(live)
    await live.sync()
    const lines = readFileSync(file, 'utf8').trimEnd().split('\n')
    assert.equal(lines.length, live.seq)
    const again = await Session.open(new FileStore(file))
    assert.deepEqual(again.messages(), live.messages())
    assert.equal((await again.readEvent(live.seq)).type, 'session/resume')
  })

  test('case 8: a torn last line is dropped, saved and reported; the file is repaired', async () => {
    const dir = tmp(), file = join(dir, 's.jsonl')
    const live = await Session.open(new FileStore(file))
    live.append('user/message', { message: { role: 'user', content: 'hello' }, surfaceOp: { op: 'append' } })
    await live.sync()
    appendFileSync(file, '{"seq":2,"type":"user/mess')
    const again = await Session.open(new FileStore(file))
    assert.equal(again.torn?.line, 3)
    assert.equal(again.torn?.bytes, 26)
    assert.ok(readdirSync(dir).some((f) => f.startsWith('s.jsonl.torn-')))
    assert.equal((await again.readEvent(2)).type, 'session/resume')
    assert.deepEqual(((await again.readEvent(2)).data as any).torn.line, 3)
    await again.sync()
    assert.equal((await Session.open(new FileStore(file), { readOnly: true })).seq, 3) // file is whole again
  })

  test('case 8: a corrupt line in the middle is refused with its line number', async () => {
    const file = join(tmp(), 's.jsonl')
    const live = await Session.open(new FileStore(file))
    live.append('user/message', { message: { role: 'user', content: 'a' }, surfaceOp: { op: 'append' } })
    live.append('user/message', { message: { role: 'user', content: 'b' }, surfaceOp: { op: 'append' } })
    await live.sync()
    const lines = readFileSync(file, 'utf8').split('\n')
    lines[1] = lines[1].slice(0, 20)
    writeFileSync(file, lines.join('\n'))
    await assert.rejects(Session.open(new FileStore(file), { readOnly: true }), (e: SessionError) => e.code === 'LOG_CORRUPT' && e.line === 2 && /line 2/.test(e.message))
  })

  test('a file of another format is refused at line 1 with a hint', async () => {
    const file = join(tmp(), 'not-a-log.jsonl')
    writeFileSync(file, '{"role":"user","content":"hi"}\n')
    await assert.rejects(Session.open(new FileStore(file), { readOnly: true }), /line 1: not a dsh event.*replay/)
  })

  test('resume repairs an open turn: TOOL_OUTCOME_UNKNOWN vs TOOL_NOT_STARTED', async () => {
    const file = join(tmp(), 's.jsonl')
    const live = await Session.open(new FileStore(file))
    live.append('turn/start', { turn: 1 })
    live.append('step/start', { turn: 1, step: 1 })
    live.append('assistant/message', { message: { role: 'assistant', content: [{ type: 'tool-call', id: 'ran', name: 't', arguments: '{}' }, { type: 'tool-call', id: 'queued', name: 't', arguments: '{}' }] }, finishReason: 'tool_calls', surfaceOp: { op: 'append' } })
    live.append('tool/call', { callId: 'ran', name: 't', arguments: '{}' })
    live.append('compaction/start', { id: 'k1', trigger: 'pressure' })
    await live.sync()
    const again = await Session.open(new FileStore(file))
    const tail = await logEvents(again, live.seq)
    assert.deepEqual(tail.map((e) => e.type), ['session/resume', 'compaction/end', 'tool/result', 'tool/result', 'step/end', 'turn/end'])
    const codes = tail.filter((e) => e.type === 'tool/result').map((e) => [(e.data as any).message.toolCallId, (e.data as any).message.metadata.code])
    assert.deepEqual(codes, [['ran', 'TOOL_OUTCOME_UNKNOWN'], ['queued', 'TOOL_NOT_STARTED']])
    assertPaired(again.messages())
    assert.equal(stateOf(again).compaction, undefined)
    assert.deepEqual(again.turn, { turn: 1, open: false, step: 1, stepOpen: false })
  })
})

test('blocks of unknown type survive the log round trip', async () => {
  const store = new MemoryStore()
  const s = await Session.open(store)
  const blocks: Block[] = [{ type: 'text', text: 'see' }, { type: 'image', url: 'u' }]
  s.append('user/message', { message: { role: 'user', content: blocks }, surfaceOp: { op: 'append' } })
  await s.sync()
  assert.deepEqual((await Session.open(store, { readOnly: true })).messages(), [{ role: 'user', content: blocks }])
})

test('README library example (examples/library.ts) prints the documented numbers', async () => {
  const { execFileSync } = await import('node:child_process')
  const out = execFileSync(process.execPath, ['--import', 'tsx', 'examples/library.ts'], { encoding: 'utf8' })
  assert.equal(out, [
    'before: 45038 tokens',
    'pruned: 43710 tokens reclaimed; now 1328 tokens',
    'original kept in the log: 45008 tokens',
    'replaceGeneration: 1 | events: session/start, user/message, assistant/message, tool/result, compaction/prune, tool/result',
    '',
  ].join('\n'))
})

test('Session.readEvent / readEvents read back logged events, including shadowed originals', async () => {
  const session = await Session.open(new MemoryStore())
  session.append('user/message', { message: { role: 'user', content: 'hello' }, surfaceOp: { op: 'append' } })
  const replaced = session.append('user/message', { message: { role: 'user', content: 'hi' }, surfaceOp: { op: 'replace', start: 1, end: 1 } })
  assert.equal(((await session.readEvent(1)).data as any).message.content, 'hello')
  assert.equal((await session.readEvent(replaced.seq)).seq, 2)
  await assert.rejects(session.readEvent(99), /no event with seq 99/)
  const seqs: number[] = []
  for await (const e of session.readEvents(1)) seqs.push(e.seq)
  assert.deepEqual(seqs, [1, 2])
})

test('spill decides by UTF-8 bytes at the limit, whatever the mix of 1-, 2-, 3- and 4-byte characters', async () => {
  const limit = 1200
  const cases: [string, boolean][] = [
    ['a'.repeat(400), false], // 400 units: decided by length (3 × 400 ≤ 1200)
    ['\u20ac'.repeat(400), false], // 1,200 bytes exactly
    ['\u20ac'.repeat(400) + 'a', true], // 1,201 bytes, 401 units: walked
    ['\u00e9'.repeat(600), false], // 1,200 bytes
    ['\u{1F600}'.repeat(300), false], // 600 units, 1,200 bytes
    ['\u{1F600}'.repeat(300) + 'a', true],
    ['a'.repeat(1201), true], // decided by length
  ]
  for (const [text, spills] of cases) {
    const store = new MemoryStore()
    const out = await spillToolResult(toolResult(text), store, limit, 'x.txt')
    assert.equal(out.spilled !== undefined, spills, `${text.length} units`)
    if (spills) assert.equal(out.spilled!.bytes, new TextEncoder().encode(text).length)
  }
})

describe('FileStore streaming load and read-back (memory O(surface))', () => {
  const tmp = () => mkdtempSync(join(tmpdir(), 'dsh-stream-'))

  test('a FileStore session keeps only its surface; originals are read back from the file', async () => {
    const file = join(tmp(), 's.jsonl')
    const live = await Session.open(new FileStore(file))
    assert.throws(() => live.events, /keeps only its surface.*readEvent/)
    live.append('assistant/message', { message: { role: 'assistant', content: [{ type: 'tool-call', id: 'c1', name: 'cat', arguments: '{}' }] }, finishReason: 'tool_calls', surfaceOp: { op: 'append' } })
    // 5 MB of mixed 1-, 2-, 3- and 4-byte characters: the line spans two 4 MiB reads, a character sits on the cut.
    const big = ('a\u00e9\u20ac\u{1F600}'.repeat(500_000)) + 'END'
    const original = live.append('tool/result', { message: toolResult(big, 'c1'), surfaceOp: { op: 'append' } })
    pruneToolResult(live, original.seq)
    await live.sync()
    assert.equal(((await live.readEvent(original.seq)).data as any).message.content[0].text, big)
    await live.store.close?.()
    const again = await Session.open(new FileStore(file))
    assert.deepEqual(again.messages(), live.messages())
    assert.equal(((await again.readEvent(original.seq)).data as any).message.content[0].text, big)
    const types = (await logEvents(again)).map((e) => e.type)
    assert.deepEqual(types, ['session/start', 'assistant/message', 'tool/result', 'compaction/prune', 'tool/result', 'session/resume'])
    assert.deepEqual((await logEvents(again, 4)).map((e) => e.seq), [4, 5])
    // Events appended after the reload are read back too (also before any explicit flush).
    const late = again.append('user/message', { message: { role: 'user', content: 'later \u{1F600}' }, surfaceOp: { op: 'append' } })
    assert.equal(((await again.readEvent(late.seq)).data as any).message.content, 'later \u{1F600}')
    await again.store.close?.()
  })

  test('a last line without its newline that parses is kept; the next append starts a new line', async () => {
    const file = join(tmp(), 's.jsonl')
    const live = await Session.open(new FileStore(file))
    live.append('user/message', { message: { role: 'user', content: 'h\u00e9llo' }, surfaceOp: { op: 'append' } })
    await live.sync(); await live.store.close?.()
    writeFileSync(file, readFileSync(file, 'utf8').trimEnd())
    const again = await Session.open(new FileStore(file))
    assert.equal(again.torn, undefined)
    await again.sync()
    assert.equal(((await again.readEvent(1)).data as any).message.content, 'h\u00e9llo')
    assert.equal((await again.readEvent(2)).type, 'session/resume')
    assert.equal(readFileSync(file, 'utf8').split('\n').filter(Boolean).length, 3)
    await again.store.close?.()
  })

  test('a torn multi-byte last line is saved byte for byte and the file truncated to the last whole line', async () => {
    const dir = tmp(), file = join(dir, 's.jsonl')
    const live = await Session.open(new FileStore(file))
    await live.sync(); await live.store.close?.()
    const whole = readFileSync(file)
    const tail = Buffer.from('{"seq":1,"type":"user/message","data":{"message":{"role":"user","content":"\u20ac\u20ac')
    writeFileSync(file, Buffer.concat([whole, tail.subarray(0, tail.length - 1)])) // cut inside the last €
    const again = await Session.open(new FileStore(file), { readOnly: true })
    assert.equal(again.torn?.line, 2)
    assert.equal(again.torn?.bytes, tail.length - 1)
    assert.deepEqual(readFileSync(again.torn!.savedTo!), tail.subarray(0, tail.length - 1))
    assert.deepEqual(readFileSync(file), whole)
  })
})

test('FileStore readOnly: a torn last line is reported, the file is left byte for byte; appends are refused', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'dsh-ro-')), file = join(dir, 's.jsonl')
  const live = await Session.open(new FileStore(file))
  live.append('user/message', { message: { role: 'user', content: 'hi' }, surfaceOp: { op: 'append' } })
  await live.sync(); await live.store.close?.()
  appendFileSync(file, '{"seq":3,"type":"user/mes')
  const before = readFileSync(file)
  const ro = await Session.open(new FileStore(file, { readOnly: true }), { readOnly: true })
  assert.equal(ro.torn?.line, 3)
  assert.equal(ro.torn?.savedTo, undefined)
  assert.equal(((await ro.readEvent(1)).data as any).message.content, 'hi')
  assert.deepEqual(readFileSync(file), before)
  assert.deepEqual(readdirSync(dir).sort(), ['s.jsonl'])
  await assert.rejects(new FileStore(file, { readOnly: true }).append([{ seq: 2, type: 'x', time: 0, data: {} }]), /read-only/)
})

test('event types named like Object.prototype members (toString, constructor) are plain events, not surface events', async () => {
  const store = new MemoryStore()
  const s = await Session.open(store)
  for (const type of ['toString', 'constructor', '__proto__', 'hasOwnProperty']) s.append(type, { note: type })
  await s.sync()
  assert.equal(s.surface().length, 0)
  const again = await Session.open(store, { readOnly: true })
  assert.deepEqual((await store.load()).events.slice(-4).map((e) => e.type), ['toString', 'constructor', '__proto__', 'hasOwnProperty'])
  assert.equal(again.surface().length, 0)
})

test('a file that is not a dsh log is refused without echoing its content (an .env may hold secrets)', async () => {
  const file = join(mkdtempSync(join(tmpdir(), 'dsh-env-')), '.env')
  writeFileSync(file, 'API_KEY=sk-very-secret-123\n')
  await assert.rejects(Session.open(new FileStore(file), { readOnly: true }), (e: SessionError) => e.code === 'LOG_CORRUPT' && /line 1: not valid JSON \(26 characters; not shown\)/.test(e.message) && !e.message.includes('sk-very'))
  assert.equal(readFileSync(file, 'utf8'), 'API_KEY=sk-very-secret-123\n')
})
