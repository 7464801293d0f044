// Fidelity across compaction (docs/design.md §12, issue 15): pins, project instructions, the facts
// ledger, focus and summary-instruction override, compaction hooks, fidelity figures. Over real
// HTTP against test/fake-provider.ts where a model is involved; the ledger's extraction rules on
// hand-built logs.
import { test, describe, after } from 'node:test'
import assert from 'node:assert/strict'
import {
  Agent, Session, MemoryStore, openAICompatible, SessionError, PRUNE_MARKER, estimateMessageTokens,
  estimateTextTokens, runReplay, FIDELITY_FIGURES, type Tool, type Ledger, type SessionEvent, internals, Pins, pruneToolResult
} from '../dsh.ts'
import {
  SUMMARY_INSTRUCTION, CHECKPOINT_PREAMBLE, frameCheckpoint, ledgerBudget, summaryInstructionText,
  estimateEnvelopeTokens,
} from './spec.ts'

const { renderLedger, regionLedger, trimLedger, recallTool } = internals
import { readCorpus, skipWithoutShared } from './shared.ts'
import { startFakeProvider, type FakeReply, type FakeRequest } from './fake-provider.ts'
import { tuned, ladderTuned } from './tuning.ts'

const servers: Array<{ close(): Promise<void> }> = []
after(async () => { for (const s of servers) await s.close() })

/** Conversation replies from `script`, summary replies (x-dsh-purpose: compaction) from `summaries`. */
async function fake(script: FakeReply[], summaries: FakeReply[] = [{ text: 'ok' }], contextWindow = 16_000) {
  let c = 0, s = 0
  const server = await startFakeProvider({
    handler: (req: FakeRequest) => req.headers['x-dsh-purpose'] === 'compaction' ? summaries[Math.min(s++, summaries.length - 1)] : script[Math.min(c++, script.length - 1)],
  })
  servers.push(server)
  const provider = tuned({ maxRetries: 0 }, () => openAICompatible({ baseURL: server.url, model: 'fake-model', apiKey: 'sk-test', contextWindow }))
  const conversation = () => server.requests.filter((r) => r.headers['x-dsh-purpose'] !== 'compaction')
  const summary = () => server.requests.filter((r) => r.headers['x-dsh-purpose'] === 'compaction')
  return { server, provider, conversation, summary }
}

const tool = (name: string, out: (args: any) => any): Tool => ({ name, description: `${name} (test double)`, parameters: { type: 'object', properties: {} }, execute: out })
const eventsOf = (s: Session, type: string) => s.events.filter((e) => e.type === type)
const calls = (k: number, p: string) => Array.from({ length: k }, (_, i) => ({ toolCalls: [{ id: `${p}${i}`, name: 'fetch', arguments: { i } }] }))

describe('case 1: pins', () => {
  const PIN = 'Constraint for the whole session: never touch the vendor/ directory; answer in British English.'

  test('a pinned first message survives three compactions verbatim and in position; no summary request carries it', async () => {
    let n = 0
    const script: FakeReply[] = []
    for (let t = 0; t < 7; t++) script.push(...calls(3, `t${t}c`), { text: `turn ${t + 1} done` })
    const f = await fake(script, [{ text: 'CHECKPOINT one' }, { text: 'CHECKPOINT two' }, { text: 'CHECKPOINT three' }, { text: 'CHECKPOINT four' }])
    const store = new MemoryStore()
    const session = await Session.open(store)
    // Clear rung off (docs/design.md §10): this test is about pins across summaries.
    const agent = new Agent({ session, provider: f.provider, tools: [tool('fetch', () => `result ${n++} `.padEnd(7_000, '.'))], compaction: { clear: false } })
    const first = await agent.run(PIN, { pin: true })
    assert.equal(first.text, 'turn 1 done')
    const pinSeq = (eventsOf(session, 'surface/pin')[0].data as any).seq
    assert.equal(pinSeq, eventsOf(session, 'user/message')[0].seq)
    for (let t = 2; t <= 7; t++) await agent.run(`go on with part ${t}`)
    const summaries = eventsOf(session, 'compaction/summary')
    assert.ok(summaries.length >= 3, `${summaries.length} compactions`)
    for (const s of summaries) assert.ok(!(s.data as any).shadowedSeqs.includes(pinSeq))
    // Every conversation request starts with the pin, verbatim; after a compaction the checkpoint follows it.
    const firstSummaryAt = f.server.requests.indexOf(f.summary()[0])
    for (const [i, req] of f.server.requests.entries()) {
      if (req.headers['x-dsh-purpose'] === 'compaction') {
        assert.ok(!req.rawBody.includes(PIN), `summary request ${i} carries the pinned text`)
        continue
      }
      assert.deepEqual(req.body.messages[0], { role: 'user', content: PIN })
      if (i > firstSummaryAt) assert.ok(req.body.messages[1].content.startsWith(CHECKPOINT_PREAMBLE), `request ${i}`)
    }
    // Only one checkpoint at a time: each later one merged the one before (the region starts right after the pin).
    const surface = session.surface()
    assert.equal(surface[0].seq, pinSeq)
    assert.equal(surface.filter((n) => typeof n.message.content === 'string' && n.message.content.startsWith(CHECKPOINT_PREAMBLE)).length, 1)
    // Pins survive resume.
    const resumed = await Session.open(store)
    assert.deepEqual(Pins.of(resumed).seqs(), [pinSeq])
    assert.equal(Pins.of(resumed).tokens(), estimateMessageTokens({ role: 'user', content: PIN }))
  })

  test('a pinned tool result is never pruned; a replace over a pinned message is refused', async () => {
    const f = await fake([{ toolCalls: [{ id: 'b', name: 'big', arguments: {} }] }, { text: 'read it' }])
    const session = await Session.open(new MemoryStore())
    const agent = new Agent({ session, provider: f.provider, tools: [tool('big', () => 'B'.repeat(20_000))] })
    agent.on('agent/post-step', () => { for (const n of session.surface()) if (n.message.role === 'tool' && !Pins.of(session).has(n.seq)) agent.pin(n.seq) })
    await agent.run('read the big one')
    const resultSeq = eventsOf(session, 'tool/result')[0].seq
    assert.ok(Pins.of(session).has(resultSeq))
    assert.equal(eventsOf(session, 'compaction/prune').length, 0)
    assert.equal(f.conversation()[1].body.messages.find((m: any) => m.role === 'tool').content, 'B'.repeat(20_000))
    const before = session.seq
    assert.throws(() => pruneToolResult(session, resultSeq), (e: any) => e instanceof SessionError && e.code === 'PIN'
      && e.message === `tool/result: replace ${resultSeq}..${resultSeq} would change pinned message seq ${resultSeq}; pinned messages are never pruned, cleared or summarised (unpin it first)`)
    assert.equal(session.seq, before, 'nothing appended')
    assert.throws(() => Pins.of(session).pin(resultSeq), /surface\/pin: seq \d+ is already pinned/)
    Pins.of(session).unpin(resultSeq)
    assert.equal(Pins.of(session).has(resultSeq), false)
    assert.ok(pruneToolResult(session, resultSeq) > 0)
    assert.throws(() => Pins.of(session).pin(9_999), /surface\/pin: seq 9999 is not a message on the current surface/)
  })

  test('a pinned assistant message with tool calls cannot be replaced either (live or in a loaded log)', async () => {
    const session = await Session.open(new MemoryStore())
    const call = (args: string) => ({ role: 'assistant' as const, content: [{ type: 'tool-call' as const, id: 'c1', name: 't', arguments: args }] })
    const asked = session.append('assistant/message', { message: call(`{"x":"${'x'.repeat(2000)}"}`), surfaceOp: { op: 'append' }, finishReason: 'tool-calls' })
    session.append('tool/result', { message: { role: 'tool', toolCallId: 'c1', content: [{ type: 'text', text: 'r' }] }, surfaceOp: { op: 'append' } })
    Pins.of(session).pin(asked.seq)
    const replace = { message: call('{}'), surfaceOp: { op: 'replace' as const, start: asked.seq, end: asked.seq }, finishReason: 'pruned' }
    // What happened: the replace was taken (a replace that keeps its calls skipped the pin check), the pin named a seq
    // no longer on the surface, and Pins.of(session).tokens() threw "TypeError: Cannot read properties of undefined".
    assert.throws(() => session.append('assistant/message', replace), (e: any) => e instanceof SessionError && e.code === 'PIN'
      && e.message === `assistant/message: replace ${asked.seq}..${asked.seq} would change pinned message seq ${asked.seq}; pinned messages are never pruned, cleared or summarised (unpin it first)`)
    assert.equal(Pins.of(session).tokens(), session.surface().node(asked.seq)!.tokens)
    const store = new MemoryStore()
    for (const e of session.events) store.events.push(e)
    store.events.push({ seq: session.seq, type: 'assistant/message', time: 0, data: replace })
    await assert.rejects(Session.open(store), (e: any) => e instanceof SessionError && e.code === 'LOG_CORRUPT' && e.line === session.seq + 1)
  })

  test('a pin that cannot fit is refused with the numbers, before anything is logged', async () => {
    const f = await fake([{ text: 'never' }])
    const session = await Session.open(new MemoryStore())
    const agent = new Agent({ session, provider: f.provider, tools: [tool('fetch', () => 'x')] })
    const big = 'p'.repeat(52_000) // 13,008 tokens by §2
    const envelope = estimateEnvelopeTokens(agent.envelope)
    const events = session.seq
    await assert.rejects(agent.run(big, { pin: true }), (e: any) => e instanceof SessionError && e.code === 'PIN' && e.message ===
      `cannot pin the input (13008 tokens): pinned messages would hold 13008 tokens, which with the ${envelope}-token envelope exceeds the 12800-token limit for pins (the compaction threshold of the 16000-token window); pinned messages are never compacted, so unpin one (Pins.of(session).unpin(seq), CLI /unpin) or pin a shorter message`)
    assert.deepEqual(session.events.slice(events).map((e) => e.type), ['request/header'])
    assert.equal(f.server.requests.length, 0)
    // A pin that fits is accepted; a second that would pass the limit is refused with the sum.
    const r = await agent.run('p'.repeat(40_000), { pin: true }) // 10,008 tokens
    assert.equal(r.text, 'never')
    const userSeq = eventsOf(session, 'user/message')[0].seq
    assert.deepEqual(Pins.of(session).seqs(), [userSeq])
    await agent.run('q'.repeat(12_000)) // 3,008 tokens
    const second = eventsOf(session, 'user/message')[1].seq
    assert.throws(() => agent.pin(second), (e: any) => e.code === 'PIN' && e.message.startsWith(`cannot pin seq ${second} (3008 tokens): pinned messages would hold 13016 tokens, which with the ${envelope}-token envelope exceeds the 12800-token limit`))
    assert.equal(Pins.of(session).has(second), false)
  })
})

describe('case 2: the facts ledger', () => {
  const A_TS = 'export const a = 1\n'.repeat(300) // 5,700 characters
  const TSC = "src/b.ts(3,1): error TS2304: Cannot find name 'x'."
  const tools = [
    tool('read_file', () => A_TS),
    tool('edit_file', () => 'edited src/b.ts: 1 replacement at line 3'),
    tool('shell', () => ({ content: `exit code 1\nstdout:\n> demo@1.0.0 test\n> tsc --noEmit || echo "error: see above"\n\n${TSC}\n`, isError: true })),
    tool('fetch', () => 'F'.repeat(12_000)),
  ]
  const script: FakeReply[] = [
    { toolCalls: [{ id: 'r1', name: 'read_file', arguments: { path: 'src/a.ts' } }] },
    { toolCalls: [{ id: 'e1', name: 'edit_file', arguments: { path: 'src/b.ts', old_string: 'y', new_string: 'x' } }] },
    { toolCalls: [{ id: 's1', name: 'shell', arguments: { command: 'npm test' } }] },
    { text: 'The build fails on a missing name.' },
    { toolCalls: [{ id: 'f1', name: 'fetch', arguments: {} }] },
    { text: 'fetched' },
  ]
  const EXPECTED: Omit<Ledger, 'read' | 'edited' | 'commands' | 'errors' | 'userMessages'> & Record<string, unknown> = {
    written: [], trimmed: 0,
  }

  test('read src/a.ts, edited src/b.ts, ran npm test (exit 1, TS2304): the ledger lists exactly those though the summary is "ok"', async () => {
    const f = await fake(script, [{ text: 'ok' }])
    const session = await Session.open(new MemoryStore())
    const agent = ladderTuned({ retainedTailRatio: 0.05 }, () => new Agent({ session, provider: f.provider, tools }))
    await agent.run('fix the build')
    await agent.run('now fetch the rest')
    const outcome = await agent.compactNow()
    assert.equal(outcome.action, 'compacted')
    const summary = eventsOf(session, 'compaction/summary')[0].data as any
    const seqOf = (type: string, pred: (e: SessionEvent) => boolean) => session.events.find((e) => e.type === type && pred(e))!.seq
    const resultSeq = (id: string) => seqOf('tool/result', (e) => (e.data as any).message.toolCallId === id)
    const ledger: Ledger = summary.ledger
    assert.deepEqual(ledger, {
      ...EXPECTED,
      read: [{ path: 'src/a.ts', count: 1, seq: resultSeq('r1') }],
      edited: [{ path: 'src/b.ts', count: 1, seq: resultSeq('e1') }],
      commands: [{ command: 'npm test', exitCode: 1, failed: true, count: 1, seq: resultSeq('s1') }],
      errors: [{ text: TSC, count: 1, seq: resultSeq('s1') }],
      userMessages: [
        { text: 'fix the build', count: 1, seq: seqOf('user/message', (e) => (e.data as any).message.content === 'fix the build') },
        { text: 'now fetch the rest', count: 1, seq: seqOf('user/message', (e) => (e.data as any).message.content === 'now fetch the rest') },
      ],
    })
    const text = [
      CHECKPOINT_PREAMBLE,
      '<compacted-summary>', 'ok', '</compacted-summary>',
      '<ledger>', 'Recorded by dsh from the session log, verbatim (not summarised):',
      'files read:', '- src/a.ts',
      'files edited:', '- src/b.ts',
      'commands run:', '- npm test → exit 1',
      'tool errors (first line):', `- ${TSC}`,
      'user messages (newest first):', '<user-message>', 'now fetch the rest', '</user-message>', '<user-message>', 'fix the build', '</user-message>',
      '</ledger>',
    ].join('\n')
    assert.equal(frameCheckpoint('ok', ledger), text)
    // The summary was asked with the default instruction; the next request carries the checkpoint.
    assert.deepEqual(f.summary()[0].body.messages.at(-1), { role: 'user', content: SUMMARY_INSTRUCTION })
    const checkpoint = session.surface().find((n) => n.message.role === 'user' && n.message.content === text)
    assert.ok(checkpoint, 'the checkpoint on the surface is exactly the framed text')
    // Fidelity: the ledger carries every fact; the model's "ok" carries none.
    assert.deepEqual(summary.fidelity, {
      paths: { total: 2, inCheckpoint: 2, inSummary: 0 },
      commands: { total: 1, inCheckpoint: 1, inSummary: 0 },
      errors: { total: 1, inCheckpoint: 1, inSummary: 0 },
      userMessages: { total: 2, inCheckpoint: 2, inSummary: 0, pruned: 0 },
    })
    // The ledger is priced: the checkpoint node costs the whole framed text.
    assert.equal(checkpoint!.tokens, Math.ceil(text.length / 4) + 8)
  })

  test('a second compaction merges the first ledger: deduplicated, counts added, nothing lost', async () => {
    let k = 0
    const f = await fake([
      { toolCalls: [{ id: 'r1', name: 'read_file', arguments: { path: 'src/a.ts' } }] }, { text: 'one' },
      { toolCalls: [{ id: 'r2', name: 'read_file', arguments: { path: 'src/a.ts' } }] },
      { toolCalls: [{ id: 's2', name: 'shell', arguments: { command: 'npm test' } }] }, { text: 'two' },
      { toolCalls: [{ id: 'f1', name: 'fetch', arguments: {} }] }, { text: 'three' },
    ], [{ text: 'first summary' }, { text: 'second summary' }])
    const session = await Session.open(new MemoryStore())
    const agent = ladderTuned({ retainedTailRatio: 0.05 }, () => new Agent({ session, provider: f.provider, tools: tools.map((t) => t.name === 'shell' ? tool('shell', () => `exit code ${k++}\nstdout:\nall good`) : t) }))
    await agent.run('step one')
    await agent.run('step two')
    assert.equal((await agent.compactNow()).action, 'compacted')
    await agent.run('step three')
    assert.equal((await agent.compactNow()).action, 'compacted')
    const [first, second] = eventsOf(session, 'compaction/summary').map((e) => (e.data as any).ledger as Ledger)
    assert.deepEqual(first.read.map((e) => [e.path, e.count]), [['src/a.ts', 1]])
    assert.deepEqual(second.read.map((e) => [e.path, e.count]), [['src/a.ts', 2]])
    assert.deepEqual(second.commands.map((e) => [e.command, e.exitCode, e.failed]), [['npm test', 0, false]])
    assert.deepEqual(second.userMessages.map((e) => e.text), ['step one', 'step two', 'step three'])
    const ckpt = session.surface().find((n) => n.message.role === 'user' && String(n.message.content).startsWith(CHECKPOINT_PREAMBLE))!
    assert.match(String(ckpt.message.content), /\nfiles read:\n- src\/a\.ts \(2×\)\n/)
    assert.match(String(ckpt.message.content), /\ncommands run:\n- npm test → exit 0\n/)
  })

  test('paths and commands come from argument keys, whatever the tool is called', async () => {
    const session = new Session()
    session.append('session/start', { id: 's', version: 'x' })
    session.append('user/message', { message: { role: 'user', content: [{ type: 'text', text: 'look\naround' }] }, surfaceOp: { op: 'append' } })
    const step = (id: string, name: string, args: unknown, result: string, isError = false) => {
      session.append('assistant/message', { message: { role: 'assistant', content: [{ type: 'tool-call', id, name, arguments: JSON.stringify(args) }] }, surfaceOp: { op: 'append' }, finishReason: 'tool_calls' })
      session.append('tool/result', { message: { role: 'tool', toolCallId: id, content: [{ type: 'text', text: result }], ...(isError ? { isError } : {}) }, surfaceOp: { op: 'append' } })
    }
    step('1', 'str_replace_based_edit_tool', { command: 'view', path: '/repo/x.py' }, 'contents')
    step('2', 'str_replace_based_edit_tool', { command: 'str_replace', path: '/repo/x.py', old_str: 'a', new_str: 'b' }, 'done')
    step('3', 'str_replace_based_edit_tool', { command: 'create', path: '/repo/new.py', file_text: '' }, 'created')
    step('4', 'Bash', { command: 'pytest -q', description: 'tests' }, 'Exit code 2\nFAILED tests/test_x.py::test_a - AssertionError', true)
    step('5', 'MultiEdit', { file_path: 'src/m.ts', edits: [] }, 'ok')
    step('6', 'Write', { file_path: 'src/w.ts', content: '' }, 'ok')
    step('7', 'Read', { file_path: 'missing.ts' }, 'File does not exist.', true)
    step('8', 'mcp__fs__read_multiple_files', { paths: ['a.md', 'b.md'] }, 'two files')
    step('9', 'run', { cmd: ['git', 'status'] }, '<returncode>0</returncode>\nclean')
    step('10', 'Glob', { pattern: '**/*.ts' }, 'src/m.ts')
    step('11', 'think', 'not an object', 'ok')
    const ledger = await regionLedger(session, session.surface())
    const seqOf = (id: string) => session.events.find((e) => e.type === 'tool/result' && (e.data as any).message.toolCallId === id)!.seq
    assert.deepEqual(ledger.read, [{ path: '/repo/x.py', count: 1, seq: seqOf('1') }, { path: 'a.md', count: 1, seq: seqOf('8') }, { path: 'b.md', count: 1, seq: seqOf('8') }])
    assert.deepEqual(ledger.edited, [{ path: '/repo/x.py', count: 1, seq: seqOf('2') }, { path: 'src/m.ts', count: 1, seq: seqOf('5') }])
    assert.deepEqual(ledger.written, [{ path: '/repo/new.py', count: 1, seq: seqOf('3') }, { path: 'src/w.ts', count: 1, seq: seqOf('6') }])
    assert.deepEqual(ledger.commands, [
      { command: 'pytest -q', exitCode: 2, failed: true, count: 1, seq: seqOf('4') },
      { command: 'git status', exitCode: 0, failed: false, count: 1, seq: seqOf('9') },
    ])
    assert.deepEqual(ledger.errors.map((e) => e.text), ['FAILED tests/test_x.py::test_a - AssertionError', 'File does not exist.'])
    assert.deepEqual(ledger.userMessages.map((e) => e.text), ['look\naround'])
    // A pruned result counts as it was: the ledger reads the original from the log.
    assert.match(renderLedger(ledger), /<user-message>\nlook\naround\n<\/user-message>/)
  })

  test('the budget: min(2,000, floor(window × 0.05)) tokens for the facts; the oldest go first, and are counted; user messages are not its', () => {
    assert.equal(ledgerBudget(16_000), 800)
    assert.equal(ledgerBudget(1_048_576), 2000)
    assert.equal(ledgerBudget(undefined), 2000)
    const ledger: Ledger = {
      read: Array.from({ length: 40 }, (_, i) => ({ path: `src/file-${String(i).padStart(2, '0')}.ts`, count: 1, seq: i * 2 })),
      written: [], edited: [], commands: [], errors: [],
      userMessages: [{ text: 'U'.repeat(600), count: 1, seq: 1 }, { text: 'the newest ask', count: 1, seq: 100 }],
      trimmed: 3,
    }
    const cut = trimLedger(ledger, 150) // 600 UTF-16 units
    const text = renderLedger(cut)
    const facts = renderLedger({ ...cut, userMessages: [] })
    assert.ok(estimateTextTokens(facts) <= 150, `${estimateTextTokens(facts)} tokens`)
    // The user's messages have a budget of their own (the checkpoint fits them, see case 6): trimLedger keeps them.
    assert.deepEqual(cut.userMessages, ledger.userMessages)
    // Newest first: the newest paths stay.
    const kept = cut.read.map((e) => e.seq)
    assert.equal(kept.at(-1), 78)
    assert.deepEqual(kept, Array.from({ length: kept.length }, (_, i) => 78 - 2 * (kept.length - 1 - i)), 'a contiguous newest run')
    assert.equal(cut.trimmed, 3 + (40 - kept.length))
    assert.match(text, new RegExp(`\\n\\(${cut.trimmed} older ledger entries left out to fit the ledger budget; the session log keeps them\\)\\n</ledger>$`))
    assert.equal(trimLedger(ledger, 10_000), ledger, 'within budget: unchanged')
    // An entry over a tenth of the budget (a long script) goes after the others, newest first.
    const script = { command: `cat > setup.sh <<'EOF'\n${'echo step\n'.repeat(40)}EOF`, failed: false, count: 1, seq: 99 }
    const scripted = trimLedger({ ...ledger, read: ledger.read.slice(30), commands: [script], userMessages: [] }, 150)
    assert.deepEqual([scripted.commands.length, scripted.read.length], [0, 10], 'ten paths kept, the 440-unit script left out')
  })
})

describe('case 6: every user message of a compacted region is in its checkpoint (docs/design.md §12)', () => {
  /** `n` numbered lines of 80 UTF-16 units each (79 + LF), so recall pages it by whole lines. */
  const lines = (tag: string, n: number) => Array.from({ length: n }, (_, i) => `${tag} line ${String(i).padStart(4, '0')}: `.padEnd(79, '.')).join('\n')
  const TASK = lines('task', 151).slice(0, 12_000) // 3,000 tokens by §2 (3,008 as a message)
  const BIG = lines('paste', 251).slice(0, 20_000) // 20,000 characters
  /** Pages through `recall {key}` and joins the pages: the original, as recall returns it. */
  async function recallWhole(session: Session, key: string): Promise<string> {
    const recall = recallTool(session)
    const parts: string[] = []
    for (let offset = 1; ;) {
      const answer = String(await recall.execute({ key, offset }, { signal: new AbortController().signal, callId: 'r' }))
      const head = answer.split('\n', 1)[0]
      assert.match(head, new RegExp(`^${key} \\(user message\\), lines ${offset}–(\\d+) of \\d+:$`))
      const more = /\n\[more: recall \{"key":"[^"]+","offset":(\d+)\}\]$/.exec(answer)
      parts.push((more ? answer.slice(0, more.index) : answer).slice(head.length + 1))
      if (!more) return parts.join('\n')
      offset = Number(more[1])
    }
  }

  test('a 3,000-token task at window 32,000, compacted three times: every checkpoint holds it verbatim; a later 20,000-character message is there as head + tail with a recall key that returns it', async () => {
    let n = 0
    const script: FakeReply[] = []
    for (let t = 0; t < 6; t++) script.push(...calls(4, `t${t}c`), { text: `turn ${t + 1} done` })
    // No usage: the calibration stays 1, so the budgets are the window's shares exactly.
    const f = await fake(script.map((r) => ({ ...r, usage: null })), [{ text: 'CHECKPOINT one', usage: null }, { text: 'CHECKPOINT two', usage: null }, { text: 'CHECKPOINT three', usage: null }], 32_000)
    const session = await Session.open(new MemoryStore())
    const agent = new Agent({ session, provider: f.provider, tools: [tool('fetch', () => `result ${n++} `.padEnd(4_000, '.'))], compaction: { clear: false } })
    await agent.run(TASK)
    await agent.run('step two')
    const o1 = await agent.compactNow()
    assert.equal(o1.action, 'compacted', JSON.stringify(o1))
    await agent.run(BIG)
    await agent.run('step four')
    const o2 = await agent.compactNow()
    assert.equal(o2.action, 'compacted', JSON.stringify(o2) + JSON.stringify(session.events.filter((e) => e.type.startsWith('compaction/')).map((e) => [e.type, (e.data as any).error ?? (e.data as any).message])))
    await agent.run('step five')
    await agent.run('step six') // the region must be worth twice the user messages' budget (a checkpoint saves room)
    assert.equal((await agent.compactNow()).action, 'compacted')
    const userSeq = (text: string) => session.events.find((e) => e.type === 'user/message' && (e.data as any).message.content === text)!.seq
    const taskSeq = userSeq(TASK), bigSeq = userSeq(BIG)
    const checkpoints = session.events.filter((e) => e.type === 'user/message' && (e.data as any).compactionId !== undefined).map((e) => (e.data as any).message.content as string)
    assert.equal(checkpoints.length, 3)
    for (const [k, c] of checkpoints.entries()) assert.ok(c.includes(`<user-message>\n${TASK}\n</user-message>`), `checkpoint ${k + 1} holds the task verbatim`)
    // Window 32,000: the user messages have 4,800 tokens (19,200 units), the task takes 12,032 of them; the
    // 20,000-character paste is cut to what is left (less the other messages), its marker naming its key.
    const marker = `\n\n[... middle of this user message cut; recall {"key":"seq:${bigSeq}"} returns it whole ...]\n\n`
    const summaries = session.events.filter((e) => e.type === 'compaction/summary').map((e) => e.data as any)
    for (const k of [1, 2]) {
      const entry = (summaries[k].ledger.userMessages as Array<{ text: string; seq: number; pruned?: boolean }>).find((e) => e.seq === bigSeq)!
      assert.equal(entry.pruned, true)
      const [head, tail] = entry.text.split(marker)
      assert.ok(BIG.startsWith(head) && BIG.endsWith(tail))
      assert.ok(checkpoints[k].includes(`<user-message>\n${entry.text}\n</user-message>`))
      const users = summaries[k].ledger.userMessages.reduce((u: number, e: { text: string }) => u + e.text.length + 32, 0)
      // 19,200 − (12,000 + 32) for the task − (8 + 32) for 'step two' (− 41 each for 'step four' and 'step five'
      // in the third) − 32.
      assert.equal(users, 19_200)
      assert.equal(entry.text.length, [7_096, 7_014][k - 1])
      const keep = entry.text.length - marker.length
      assert.deepEqual([head.length, tail.length], [Math.floor(keep * 0.75), keep - Math.floor(keep * 0.75)])
      // Fidelity: every user message is kept, the paste as pruned with its key.
      assert.deepEqual(summaries[k].fidelity.userMessages, { total: summaries[k].ledger.userMessages.length, inCheckpoint: summaries[k].ledger.userMessages.length, inSummary: 0, pruned: 1 })
    }
    assert.equal(summaries[0].fidelity.userMessages.pruned, 0)
    assert.equal(await recallWhole(session, `seq:${bigSeq}`), BIG)
    assert.ok(!checkpoints[0].includes(`seq:${taskSeq}`))
  })

  test('a region that is mostly the user\'s own words: their budget is at most half the region, so the checkpoint still saves room', async () => {
    const f = await fake([{ text: 'ok', usage: null }], [{ text: 'CHECKPOINT', usage: null }], 16_000)
    const session = await Session.open(new MemoryStore())
    const agent = new Agent({ session, provider: f.provider, compaction: { clear: false } })
    const note = (k: string) => `${k} ` + 'note '.repeat(1_600) // 8,000+ characters: 2,000+ tokens each
    for (const k of ['first', 'second', 'third']) await agent.run(note(k))
    const out = await agent.compactNow()
    assert.equal(out.action, 'compacted', out.reason)
    const summary = session.events.find((e) => e.type === 'compaction/summary')!.data as any
    const users = summary.ledger.userMessages as Array<{ text: string; seq: number; pruned?: boolean }>
    // The region: the first note and its answer (2,019 tokens); 15% of the window would be 2,400 tokens.
    assert.equal(summary.shadowedTokenCount, 2_019)
    assert.deepEqual(users.map((u) => [u.text.length + 32, u.pruned]), [[Math.floor(2_019 / 2) * 4, true]])
    assert.ok(users[0].text.startsWith('first note') && users[0].text.includes(`recall {"key":"seq:${users[0].seq}"}`))
    assert.ok(summary.fidelity.userMessages.inCheckpoint === 1 && summary.fidelity.userMessages.pruned === 1)
  })

  test('a task over 10% of the window is head + tail with its key; many messages over the budget are all there, the longest cut alike', async () => {
    let n = 0
    const replies: FakeReply[] = [...calls(2, 'a'), { text: 'one' }, ...calls(2, 'b'), { text: 'two' }, ...calls(2, 'c'), { text: 'three' }]
    const f = await fake(replies.map((r) => ({ ...r, usage: null })), [{ text: 'CHECKPOINT', usage: null }], 16_000)
    const session = await Session.open(new MemoryStore())
    const agent = ladderTuned({ retainedTailRatio: 0.05 }, () => new Agent({ session, provider: f.provider, tools: [tool('fetch', () => `r${n++} `.padEnd(3_000, '.'))], compaction: { clear: false } }))
    const task = lines('task', 100) // 7,999 units > 10% of 16,000 tokens (6,400 units)
    const asks = Array.from({ length: 6 }, (_, i) => `ask ${i}: ` + 'w'.repeat(i < 3 ? 40 : 2_500)) // three short, three long
    await agent.run(task)
    for (const a of asks.slice(0, 3)) agent.steer({ role: 'user', content: a })
    await agent.run('go')
    for (const a of asks.slice(3)) agent.steer({ role: 'user', content: a })
    await agent.run('on')
    assert.equal((await agent.compactNow()).action, 'compacted')
    const summary = session.events.find((e) => e.type === 'compaction/summary')!.data as any
    const users = summary.ledger.userMessages as Array<{ text: string; seq: number; pruned?: boolean }>
    const taskSeq = session.events.find((e) => e.type === 'user/message' && (e.data as any).message.content === task)!.seq
    const taskEntry = users.find((e) => e.seq === taskSeq)!
    assert.equal(taskEntry.pruned, true)
    assert.equal(taskEntry.text.length, 6_400 - 32, 'cut to 10% of the window (6,400 units) less its tags')
    assert.ok(taskEntry.text.includes(`recall {"key":"seq:${taskSeq}"} returns it whole`))
    // 15% of 16,000 tokens = 9,600 units; after the task 3,200: the short ones whole, the long ones cut to one size.
    const total = users.reduce((u, e) => u + e.text.length + 32, 0)
    assert.ok(total <= 9_600, `${total} units`)
    const rest = users.filter((e) => e.seq !== taskSeq)
    assert.ok(rest.length >= 7, `${rest.length} other user messages`) // go, on and six steered (steering may sit in the tail)
    const cut = rest.filter((e) => e.pruned)
    assert.ok(cut.length >= 2 && cut.every((e) => e.text.startsWith('ask ') && e.text.length === cut[0].text.length), cut.map((e) => e.text.length).join(', '))
    for (const e of rest.filter((x) => !x.pruned)) assert.ok(asks.includes(e.text) || ['go', 'on'].includes(e.text))
    assert.equal(summary.fidelity.userMessages.inCheckpoint, summary.fidelity.userMessages.total)
    assert.equal(summary.fidelity.userMessages.pruned, cut.length + 1)
  })
})

/** An Agent whose model answers 'ok' and whose summariser answers 'S', on a new MemoryStore session. */
async function okAgent(contextWindow: number, compaction?: { auto: boolean }) {
  const ok = { message: { role: 'assistant', content: [{ type: 'text', text: 'ok' }] }, finishReason: 'stop' }
  const provider = { model: 'm', baseURL: 'memory://m', contextWindow, maxTokens: 100, complete: async () => ok } as any
  const summarizer = { ...provider, model: 's', complete: async () => ({ ...ok, message: { ...ok.message, content: [{ type: 'text', text: 'S' }] } }) }
  const session = await Session.open(new MemoryStore())
  return { session, agent: new Agent({ session, provider, summarizer, ...(compaction ? { compaction } : {}) }) }
}

test('120 user messages over three compactions: each is in the checkpoint, or its recall key is, and the key returns it', async () => {
  // Was: past the user messages' budget the oldest were left out with no key ("N older ledger entries left out"):
  // the user's words could not be read back. Emoji, CJK, lone surrogates and forged tags included.
  const { session, agent } = await okAgent(4_000)
  const said = Array.from({ length: 120 }, (_, i) => `note ${i} ` + ['🙂', '漢字', '\ud800', '</user-message></ledger>'][i % 4].repeat(i % 9)
    + '.'.repeat(150))
  for (const text of said) await agent.run(text)
  const summaries = eventsOf(session, 'compaction/summary')
  assert.ok(summaries.length >= 3, `${summaries.length} compactions`)
  const surface = session.surface().map((n) => String(n.message.content)).join('\n')
  const checkpoint = session.surface().map((n) => String(n.message.content)).find((c) => c.startsWith(CHECKPOINT_PREAMBLE))!
  const recall = recallTool(session)
  let keyed = 0
  for (const text of said) {
    if (surface.includes(text.replace(/</g, '&lt;')) || surface.includes(text)) continue
    const seq = eventsOf(session, 'user/message').find((e) => (e.data as any).message.content === text)!.seq
    assert.ok(new RegExp(`\\bseq:${seq}\\b`).test(checkpoint), `no key for seq ${seq} in the checkpoint`)
    const answer = String(await recall.execute({ key: `seq:${seq}` }, { signal: new AbortController().signal, callId: 'r' }))
    assert.equal(answer, `seq:${seq} (user message), lines 1–1 of 1:\n${text}`)
    keyed++
  }
  assert.ok(keyed > 50, `${keyed} read back by key`)
})

test('a user message full of checkpoint tags is cut to its budget as the checkpoint shows it (each < written &lt;)', async () => {
  // Was: the cut was sized on the raw text, and '<' → '&lt;' grew it by 3 units a tag: 13,000 units in a 9,600 budget.
  const { session, agent } = await okAgent(16_000, { auto: false })
  await agent.run('the task')
  const tags = (i: number) => `${i}` + '<ledger></user-message>'.repeat(340) // 7,821 units (under the prune threshold)
  for (let i = 0; i < 5; i++) await agent.run(tags(i))
  await agent.run('more')
  const out = await agent.compactNow()
  assert.equal(out.action, 'compacted', out.reason)
  const checkpoint = session.surface().map((n) => String(n.message.content)).find((c) => c.startsWith(CHECKPOINT_PREAMBLE))!
  const users = checkpoint.slice(checkpoint.indexOf('user messages (newest first):\n') + 30, checkpoint.lastIndexOf('\n</ledger>'))
  assert.ok(users.includes('&lt;ledger>&lt;/user-message>') && !users.includes('<ledger>'), users.slice(0, 200))
  assert.ok(users.length <= 9_600 && users.length > 8_500, `${users.length} units of user messages; the budget is 15% of 16,000 tokens, 9,600`)
})

test('a user message that starts like a checkpoint (one pasted from another session) is the user\'s, kept in the next checkpoint', async () => {
  // Was: a checkpoint was told by its text, so the pasted one was read as this session's own: its ledger was looked
  // up in the log, none was found, and the user's message was in no checkpoint at all.
  const { session, agent } = await okAgent(16_000, { auto: false })
  const pasted = `${CHECKPOINT_PREAMBLE}\n<compacted-summary>\nWe were migrating src/db.ts to Postgres 16.\n</compacted-summary>`
  await agent.run('the task')
  await agent.run(pasted)
  for (let i = 0; i < 4; i++) await agent.run(`step ${i} `.padEnd(6_000, '.'))
  assert.equal((await agent.compactNow()).action, 'compacted')
  const summary = eventsOf(session, 'compaction/summary')[0].data as any
  assert.ok(summary.ledger.userMessages.some((u: { text: string }) => u.text === pasted), JSON.stringify(summary.ledger.userMessages).slice(0, 300))
  const checkpoint = session.surface().map((n) => String(n.message.content)).find((c) => c.startsWith(CHECKPOINT_PREAMBLE))!
  assert.ok(checkpoint.includes('We were migrating src/db.ts to Postgres 16.\n&lt;/compacted-summary>\n</user-message>'))
})

describe('case 3 (library): instructions are part of the envelope', () => {
  test('every request, before and after a compaction and in summary requests, carries the instructions in the system prompt', async () => {
    let n = 0
    const f = await fake([...calls(8, 'a'), { text: 'done' }, { text: 'after' }])
    const session = await Session.open(new MemoryStore())
    const INSTR = 'Project instructions (AGENTS.md):\nRun `npm test` before you say you are done.'
    const agent = new Agent({ session, provider: f.provider, system: `You are a test agent.\n\n${INSTR}`, tools: [tool('fetch', () => `r${n++}`.padEnd(7_000, '.'))], compaction: { clear: false } })
    await agent.run('fetch five')
    await agent.run('and now?')
    assert.ok(f.summary().length >= 1)
    for (const req of f.server.requests) assert.deepEqual(req.body.messages[0], { role: 'system', content: `You are a test agent.\n\n${INSTR}` })
  })
})

describe('case 4 (library): focus, summaryInstruction, compaction hooks', () => {
  const work = () => [...calls(2, 'w'), { text: 'step done' }, ...calls(1, 'z'), { text: 'more done' }] as FakeReply[]
  /** Two turns of 12,000-char results (three in all), ready for a manual compaction. */
  async function twoTurns() {
    let n = 0
    const f = await fake(work())
    const session = await Session.open(new MemoryStore())
    const agent = new Agent({ session, provider: f.provider, tools: [tool('fetch', () => `r${n++}`.padEnd(12_000, '.'))] })
    await agent.run('one'); await agent.run('two')
    return { f, session, agent }
  }

  test('compactNow({focus}) puts the focus into the summary instruction; the focus is logged', async () => {
    const { f, session, agent } = await twoTurns()
    assert.equal((await agent.compactNow({ focus: 'fix the parser first' })).action, 'compacted')
    assert.deepEqual(f.summary()[0].body.messages.at(-1), {
      role: 'user',
      content: `${SUMMARY_INSTRUCTION}\n\nFocus of this checkpoint, as asked for: fix the parser first\nGive it the most detail; keep everything else that still matters.`,
    })
    assert.equal((eventsOf(session, 'compaction/summary')[0].data as any).focus, 'fix the parser first')
    assert.throws(() => agent.compactNow({ focus: 7 as any }), /focus must be a string, got number/)
  })

  test('summaryInstruction replaces the default; a hook adds focus; compaction/after sees the checkpoint', async () => {
    let n = 0
    const f = await fake(work(), [{ text: 'custom summary' }])
    const session = await Session.open(new MemoryStore())
    const agent = new Agent({ session, provider: f.provider, summaryInstruction: 'Summarise as a bullet list.', tools: [tool('fetch', () => `r${n++}`.padEnd(12_000, '.'))] })
    const seen: any[] = []
    agent.on('compaction/before', (ctx) => { assert.equal(ctx.agent, agent); seen.push({ ...ctx.compaction }); return { focus: 'keep the API names' } })
    agent.on('compaction/after', ({ checkpoint }) => { seen.push(checkpoint) })
    await agent.run('one'); await agent.run('two')
    await agent.compactNow({ focus: 'the parser' })
    assert.equal(f.summary()[0].body.messages.at(-1).content, summaryInstructionText('Summarise as a bullet list.', 'the parser; keep the API names'))
    assert.ok(f.summary()[0].body.messages.at(-1).content.startsWith('Summarise as a bullet list.\n\nFocus of this checkpoint, as asked for: the parser; keep the API names\n'))
    const summary = eventsOf(session, 'compaction/summary')[0]
    assert.equal(seen[0].trigger, 'manual')
    assert.equal(seen[0].focus, 'the parser')
    assert.deepEqual(seen[0].shadowedSeqs, (summary.data as any).shadowedSeqs)
    const node = session.surface().find((x) => x.seq === seen[1].seq)!
    assert.equal(seen[1].text, node.message.content)
    assert.equal(seen[1].tokens, node.tokens)
    assert.equal(seen[1].summary, 'custom summary')
    assert.deepEqual(seen[1].fidelity, (summary.data as any).fidelity)
    for (const bad of ['', '   ', 3]) {
      assert.throws(() => new Agent({ session, provider: f.provider, summaryInstruction: bad as any }), /summaryInstruction must be a non-empty string, got .*; leave it out for the default/)
    }
  })

  test('compaction/before may cancel: no summary request, the surface unchanged, the reason logged', async () => {
    const { f, session, agent } = await twoTurns()
    agent.on('compaction/before', () => ({ cancel: 'the user is reading it' }))
    await agent.compactNow()
    assert.equal(f.summary().length, 0)
    assert.equal(eventsOf(session, 'compaction/summary').length, 0)
    assert.deepEqual(eventsOf(session, 'compaction/end').map((e) => (e.data as any).error), ['cancelled by a compaction/before hook: the user is reading it'])
    assert.equal(eventsOf(session, 'compaction/start').length, 1, 'asked once, not retried')
  })
})

test('a pruned tool result enters the ledger as it was (the original is read from the log)', async () => {
  const f = await fake([{ toolCalls: [{ id: 'g', name: 'grep', arguments: { pattern: 'x', path: 'lib' } }] }, { text: 'found' }, ...calls(1, 'q'), { text: 'q' }])
  const session = await Session.open(new MemoryStore())
  const agent = ladderTuned({ retainedTailRatio: 0.05 }, () => new Agent({ session, provider: f.provider, tools: [tool('grep', () => ({ content: 'grep: lib: No such file or directory\n' + 'x'.repeat(60_000), isError: true })), tool('fetch', () => 'F'.repeat(12_000))] }))
  await agent.run('search')
  assert.equal(eventsOf(session, 'compaction/prune').length, 1)
  assert.ok(f.conversation()[1].rawBody.includes(PRUNE_MARKER.trim()))
  await agent.run('again')
  await agent.compactNow()
  const ledger = (eventsOf(session, 'compaction/summary')[0].data as any).ledger as Ledger
  assert.deepEqual(ledger.errors.map((e) => e.text), ['grep: lib: No such file or directory'])
  assert.deepEqual(ledger.read, [], 'a failed call touches no path')
})

describe('case 5 figures: replay reports the fidelity of its compactions', () => {
  const openai = (n: number) => JSON.stringify([
    { role: 'user', content: 'fix the build' },
    ...Array.from({ length: n }, (_, i) => [
      { role: 'assistant', content: null, tool_calls: [{ id: `c${i}`, type: 'function', function: { name: 'read_file', arguments: JSON.stringify({ path: `src/f${i}.ts` }) } }] },
      { role: 'tool', tool_call_id: `c${i}`, content: `// f${i}\n`.padEnd(6_000, 'x') },
    ]).flat(),
    { role: 'assistant', content: 'done' },
  ])

  test('a synthetic transcript: every compacted path is in a checkpoint (the ledger), none in the simulated summary', async () => {
    const { report, output } = await runReplay(openai(8), { contextWindow: 8_000, figures: FIDELITY_FIGURES, compaction: { clear: false } })
    const f = report.totals.figures!
    assert.ok(report.totals.compactions >= 1)
    const total = f['fidelity paths total']
    const compactions = report.rows.flatMap((r) => r.events).filter((e) => e.type === 'compaction')
    // Summed over compactions: a later one counts again the paths it merged from the earlier ledger.
    assert.ok(total >= compactions.length, `paths total ${total}`)
    assert.equal(f['fidelity paths in checkpoint'], total)
    assert.equal(f['fidelity paths in summary'], 0)
    assert.equal(f['fidelity commands total'], 0)
    assert.equal(compactions.length, report.totals.compactions)
    assert.ok(output.includes(`\n  fidelity `) && output.includes(`in checkpoints: paths ${total}/${total}, commands 0/0, error lines 0/0, user messages 0/0; in the summaries alone: 0/${total}, 0/0, 0/0, 0/0\n`), output.slice(-600))
    // No compaction, no fidelity line.
    const small = await runReplay(openai(1), { contextWindow: 8_000, figures: FIDELITY_FIGURES, compaction: { clear: false } })
    assert.ok(!small.output.includes('\n  fidelity '))
  })

  for (const [file, line] of [
    ['psf__requests-1142.traj.json', 'in checkpoints: paths 0/0, commands 24/24, error lines 0/0, user messages 1/1; in the summaries alone: 0/0, 0/24, 0/0, 0/1'],
    ['pylint-dev__pylint-6528.traj.json', 'in checkpoints: paths 0/0, commands 150/155, error lines 11/11, user messages 4/4; in the summaries alone: 0/0, 0/155, 0/11, 0/4'],
  ]) {
    test(`corpus ${file} at 32,000: the fidelity totals line`, { skip: skipWithoutShared('corpus', file) }, async () => {
      // SWE-agent trajectories run everything through one bash tool: commands, no path arguments.
      // Over 1,600 tokens (floor(32,000 × 0.05)) the ledger drops its oldest entries: pylint's 155
      // commands do not all fit. The replay decides in the run's own tokens (1.2× the estimate here,
      // docs/design.md §15), so it compacts sooner and more often than on the estimate alone (which
      // gave psf 35 commands in one compaction, pylint 108). Before user messages had a budget of their
      // own and long scripts went last, pylint kept 98/109 and the task statement never fit (users 1/2).
      const { output } = await runReplay(readCorpus(file), { contextWindow: 32_000, figures: FIDELITY_FIGURES, compaction: { clear: false } })
      assert.match(output, new RegExp(`\\n  fidelity +${line.replace(/[.*+?^${}()|[\]\\/]/g, '\\$&')}\\n`), output.slice(-900))
    })
  }
})
