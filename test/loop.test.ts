// Agent loop and escalation ladder (docs/design.md §§5, 7; issue 4), against an in-process scripted provider.
import { test, describe } from 'node:test'
import assert from 'node:assert/strict'
import {
  Agent, Session, MemoryStore, PRUNE_MARKER, ProviderError, estimateRequestTokens,
  DEFAULT_PRUNE_CONFIG, type Tool, type Message, type SessionEvent, type AgentEvent, internals, ConfigError,
} from '../dsh.ts'
import {
  CHECKPOINT_PREAMBLE, SUMMARY_INSTRUCTION,
} from './spec.ts'

const { selectRegion, summarise, stateOf } = internals
import { ScriptedProvider, say, call, overflow } from './scripted-provider.ts'
import { ladderConfig } from './tuning.ts'

const types = (events: SessionEvent[]) => events.map((e) => e.type)
const count = (s: Session, type: string) => s.events.filter((e) => e.type === type).length
const textTool = (name: string, text: (args: any) => string): Tool => ({ name, description: `returns text`, parameters: { type: 'object' }, execute: (a) => text(a) })
const flat = (messages: readonly Message[]) => JSON.stringify(messages)

function assertPaired(messages: readonly Message[]) {
  const calls: string[] = [], results: string[] = []
  for (const m of messages) {
    if (m.role === 'assistant') for (const b of m.content) if (b.type === 'tool-call') calls.push((b as any).id)
    if (m.role === 'tool') results.push(m.toolCallId)
  }
  assert.deepEqual(calls.sort(), results.sort())
}

describe('pressure', () => {
  test('case 1: a 60 KB tool result is pruned; no summary request', async () => {
    const session = await Session.open()
    const provider = new ScriptedProvider(16_000, [call('c1', 'read_log'), say('the log shows 3 errors')])
    const agent = new Agent({ session, provider, tools: [textTool('read_log', () => 'log line\n'.repeat(6_667) + 'end')] })
    const result = await agent.run('summarise the log')
    assert.equal(result.text, 'the log shows 3 errors')
    assert.equal(provider.conversation.length, 2)
    assert.equal(provider.summaryRequests.length, 0)
    assert.ok(flat(provider.conversation[1].request.messages).includes(JSON.stringify(PRUNE_MARKER).slice(1, -1)))
    assert.equal(count(session, 'compaction/prune'), 1)
    assert.equal(count(session, 'compaction/summary'), 0)
    const prune = session.events.find((e) => e.type === 'compaction/prune')!
    assert.equal((prune.data as any).shadowedTokenCount, Math.ceil(60_006 / 4) + 8)
    assert.ok(provider.conversation[1].estimate < 12_800)
  })

  test('case 2: many medium results → exactly one summary request; checkpoint first; tail kept; pairs intact', async () => {
    const session = await Session.open()
    const medium = (i: number) => `result ${i} `.padEnd(7_000, '.') // 7,000 code points: under the prune threshold
    let n = 0
    const script = [
      ...Array.from({ length: 5 }, (_, i) => call(`a${i}`, 'fetch', { i })), say('turn 1 done'),
      ...Array.from({ length: 4 }, (_, i) => call(`b${i}`, 'fetch', { i })), say('turn 2 done'),
    ]
    const provider = new ScriptedProvider(16_000, script, [say('SUMMARY: fetched results 0-4 in turn 1; all fine.')])
    const agent = new Agent({ session, provider, tools: [textTool('fetch', () => medium(n++))], compaction: { clear: false } })
    await agent.run('fetch five')
    assert.equal(provider.summaryRequests.length, 0)
    await agent.run('fetch four more')
    assert.equal(provider.summaryRequests.length, 1)
    const sreq = provider.summaryRequests[0].request
    assert.equal(sreq.headers?.['x-dsh-purpose'], 'compaction')
    assert.deepEqual(sreq.messages.at(-1), { role: 'user', content: SUMMARY_INSTRUCTION })
    const idx = provider.requests.findIndex((r) => r.purpose === 'compaction')
    const next = provider.requests.slice(idx + 1).find((r) => r.purpose === 'conversation')!
    const first = next.request.messages[0]
    assert.equal(first.role, 'user')
    assert.ok(typeof first.content === 'string' && first.content.startsWith(CHECKPOINT_PREAMBLE + '\n<compacted-summary>\nSUMMARY: fetched'))
    // Kept verbatim after the checkpoint: at least floor(16,000 × 0.16) = 2,560 tokens.
    assert.ok(estimateRequestTokens({}, next.request.messages.slice(1)) >= 2_560)
    for (const r of provider.requests) assertPaired(r.request.messages)
    const summaryEvent = session.events.find((e) => e.type === 'compaction/summary')!
    assert.equal((summaryEvent.data as any).model, 'scripted')
    assert.equal(count(session, 'compaction/end'), 1)
    assert.equal((session.events.find((e) => e.type === 'compaction/end')!.data as any).error, undefined)
  })

  test('case 5: a summary longer than its region is rejected; surface unchanged; turn continues', async () => {
    const session = await Session.open()
    let n = 0
    const provider = new ScriptedProvider(16_000,
      [...Array.from({ length: 9 }, (_, i) => call(`a${i}`, 'fetch')), say('done')],
      [(req) => say('x'.repeat(4 * estimateRequestTokens({}, req.messages)))])
    const events: AgentEvent[] = []
    const agent = new Agent({ session, provider, tools: [textTool('fetch', () => `r${n++}`.padEnd(7_000, '.'))], onEvent: (e) => events.push(e), compaction: { clear: false } })
    const result = await agent.run('go')
    assert.equal(result.reason, 'stop')
    const ends = session.events.filter((e) => e.type === 'compaction/end').map((e) => (e.data as any).error)
    assert.ok(ends.length >= 1)
    for (const err of ends) assert.match(err, /summary rejected: \d+ tokens is not smaller than the \d+ tokens/)
    assert.equal(count(session, 'compaction/summary'), 0)
    assert.equal(session.replaceGeneration, 0)
    assert.ok(events.some((e) => e.type === 'warning' && /after compaction/.test(e.message)))
  })

  test('case 6: an envelope above the threshold: at most one attempt, a warning with numbers, no retry until growth', async () => {
    const session = await Session.open()
    const provider = new ScriptedProvider(16_000, [call('a', 'noop'), call('b', 'noop'), call('c', 'noop'), say('done')], [say('short')])
    const warnings: string[] = []
    const agent = new Agent({ session, provider, system: 'S'.repeat(56_000), tools: [textTool('noop', () => 'ok')], onEvent: (e) => { if (e.type === 'warning') warnings.push(e.message) } })
    await agent.run('hi')
    assert.ok(provider.summaryRequests.length <= 1)
    assert.equal(warnings.length, 1)
    assert.match(warnings[0], /context still at \d+ of 16000 tokens \(threshold 12800\)/)
    assert.equal(count(session, 'compaction/warning'), 1)
  })

  test('no context window: one configuration warning naming the model; turns still run', async () => {
    const session = await Session.open()
    const provider = new ScriptedProvider(undefined, [call('a', 'noop'), say('x'), say('y')])
    const warnings: string[] = []
    const agent = new Agent({ session, provider, tools: [textTool('noop', () => 'ok')], onEvent: (e) => { if (e.type === 'warning') warnings.push(e.message) } })
    await agent.run('one'); await agent.run('two')
    assert.equal(warnings.length, 1)
    assert.match(warnings[0], /context window of model "scripted" is unknown.*--context-window/)
  })
})

describe('overflow', () => {
  async function historyThenOverflow(first: ProviderError | (() => ProviderError)) {
    const session = await Session.open()
    let n = 0
    const script = [
      ...Array.from({ length: 4 }, (_, i) => call(`h${i}`, 'fetch')), say('first turn done'),
      typeof first === 'function' ? first() : first, say('recovered answer'),
    ]
    const provider = new ScriptedProvider(16_000, script, [say('CHECKPOINT: four fetches done.')])
    const agent = new Agent({ session, provider, tools: [textTool('fetch', () => `r${n++}`.padEnd(6_000, '.'))] })
    await agent.run('fetch four')
    const result = await agent.run('now answer')
    return { session, provider, result }
  }

  for (const [name, err] of [['thrown HTTP 400', overflow()], ['inside a 200 stream', new ProviderError('CONTEXT_WINDOW_EXCEEDED', 'maximum context length exceeded', { status: 200 })]] as const) {
    test(`case 3: overflow (${name}) → prune + compaction → retry as a new step → turn completes`, async () => {
      const { session, provider, result } = await historyThenOverflow(err)
      assert.equal(result.text, 'recovered answer')
      assert.equal(provider.summaryRequests.length, 1)
      const conv = provider.conversation
      const [failed, retried] = conv.slice(-2)
      assert.ok(retried.estimate < failed.estimate)
      assert.ok(flat(retried.request.messages).includes('CHECKPOINT: four fetches done.'))
      const turn2 = session.events.slice(session.events.findLastIndex((e) => e.type === 'turn/start'))
      assert.deepEqual(turn2.filter((e) => e.type.startsWith('step/')).map((e) => [e.type, (e.data as any).step]), [['step/start', 1], ['step/end', 1], ['step/start', 2], ['step/end', 2]])
      const retry = turn2.find((e) => e.type === 'recovery/retry')!
      assert.ok((retry.data as any).generationAfter > (retry.data as any).generationBefore)
      assert.deepEqual(types(turn2).filter((t) => ['request/error', 'compaction/start', 'compaction/summary', 'compaction/end', 'recovery/retry'].includes(t)),
        ['request/error', 'compaction/start', 'compaction/summary', 'compaction/end', 'recovery/retry'])
    })
  }

  test('case 4: nothing to reclaim → no retry; the caller gets the original error object', async () => {
    const session = await Session.open()
    const err = overflow()
    const provider = new ScriptedProvider(16_000, [err])
    const agent = new Agent({ session, provider })
    await assert.rejects(agent.run('x'.repeat(40_000)), (e) => e === err && (e as ProviderError).code === 'CONTEXT_WINDOW_EXCEEDED' && /maximum context length is 16000/.test((e as Error).message))
    assert.equal(provider.requests.length, 1)
    assert.equal(count(session, 'recovery/retry'), 0)
    assert.equal(session.events.at(-1)!.type, 'turn/end')
    assert.equal((session.events.at(-1)!.data as any).reason, 'error')
  })

  test('case 7: a region larger than the summarizer window is summarised in chunks; no request exceeds the window', async () => {
    const session = await Session.open()
    let n = 0
    const provider = new ScriptedProvider(16_000, [
      ...Array.from({ length: 9 }, (_, i) => call(`h${i}`, 'fetch')), say('done'), overflow(), say('after'),
    ], [(req, i) => say(`part ${i} summary of ${req.messages.length} messages`)])
    const agent = new Agent({ session, provider, tools: [textTool('fetch', () => `r${n++}`.padEnd(7_000, '.'))], compaction: { auto: false } })
    await agent.run('fill')
    const agent2 = new Agent({ session, provider, tools: agent.tools, compaction: { clear: false } })
    const r = await agent2.run('next')
    assert.equal(r.text, 'after')
    assert.ok(provider.summaryRequests.length >= 2, `summary requests: ${provider.summaryRequests.length}`)
    for (const req of provider.requests.slice(10)) assert.ok(req.estimate + 1 <= 16_000, `request of ${req.estimate} tokens`)
    const s2 = provider.summaryRequests[1].request.messages[0]
    assert.ok(typeof s2.content === 'string' && s2.content.includes('part 0 summary'))
  })

  test('case 11: auto false disables pressure and overflow recovery', async () => {
    const err = overflow()
    {
      const session = await Session.open()
      const provider = new ScriptedProvider(16_000, [call('c1', 'big'), say('ok'), err])
      const agent = new Agent({ session, provider, tools: [textTool('big', () => 'z'.repeat(60_000))], compaction: { auto: false } })
      await agent.run('one')
      assert.equal(count(session, 'compaction/prune'), 0)
      await assert.rejects(agent.run('two'), (e) => e === err)
      assert.equal(count(session, 'compaction/start'), 0)
    }
  })
})

describe('loop', () => {
  test('bad arguments, unknown tool, throwing tool, non-string output become error results', async () => {
    const session = await Session.open()
    const bad = { role: 'assistant' as const, content: [
      { type: 'tool-call', id: 'j', name: 'echo', arguments: '{not json' },
      { type: 'tool-call', id: 'u', name: 'nope', arguments: '{}' },
      { type: 'tool-call', id: 't', name: 'boom', arguments: '{}' },
      { type: 'tool-call', id: 'n', name: 'num', arguments: '{}' },
      { type: 'tool-call', id: '', name: 'echo', arguments: '{"x":1}' },
    ] }
    const provider = new ScriptedProvider(16_000, [{ message: bad, finishReason: 'tool_calls' }, say('ok')])
    const tools: Tool[] = [
      textTool('echo', (a) => JSON.stringify(a)),
      { name: 'boom', description: '', parameters: {}, execute: () => { throw new Error('disk full') } },
      { name: 'num', description: '', parameters: {}, execute: () => 42 as never },
    ]
    await new Agent({ session, provider, tools }).run('go')
    const results = session.events.filter((e) => e.type === 'tool/result').map((e) => (e.data as any).message)
    assert.deepEqual(results.map((m) => [m.isError ?? false, m.metadata?.code]), [[true, 'TOOL_BAD_ARGUMENTS'], [true, 'TOOL_UNKNOWN'], [true, 'TOOL_ERROR'], [true, 'TOOL_BAD_OUTPUT'], [false, undefined]])
    assert.match(results[1].content[0].text, /unknown tool "nope"; available tools: echo, boom, num/)
    assert.match(results[2].content[0].text, /disk full/)
    assert.equal(results[4].content[0].text, '{"x":1}')
    assert.match(results[4].toolCallId, /^call_dsh_/)
    assertPaired(provider.conversation[1].request.messages)
  })

  test('case 8: abort during tool execution: running call finishes, others get aborted results, next request valid', async () => {
    const session = await Session.open()
    const ctrl = new AbortController()
    const provider = new ScriptedProvider(16_000, [{ message: { role: 'assistant', content: [
      { type: 'tool-call', id: 'slow', name: 'slow', arguments: '{}' }, { type: 'tool-call', id: 'later', name: 'slow', arguments: '{}' }] }, finishReason: 'tool_calls' }, say('resumed')])
    let finished = 0
    const slow: Tool = { name: 'slow', description: '', parameters: {}, execute: async () => { ctrl.abort(); await new Promise((r) => setTimeout(r, 20)); finished++; return 'slow done' } }
    const agent = new Agent({ session, provider, tools: [slow] })
    const r = await agent.run('go', { signal: ctrl.signal })
    assert.equal(r.reason, 'aborted')
    assert.equal(finished, 1)
    const results = session.events.filter((e) => e.type === 'tool/result').map((e) => (e.data as any).message)
    assert.deepEqual(results.map((m) => [m.toolCallId, m.metadata?.code]), [['slow', undefined], ['later', 'TOOL_ABORTED']])
    assert.equal(count(session, 'tool/call'), 1)
    assertPaired(session.messages())
    const r2 = await agent.run('continue')
    assert.equal(r2.text, 'resumed')
    assertPaired(provider.conversation[1].request.messages)
  })

  test('case 8: abort during summarisation commits nothing after it and closes the lock', async () => {
    const session = await Session.open()
    const ctrl = new AbortController()
    let n = 0
    const provider = new ScriptedProvider(16_000, [...Array.from({ length: 8 }, (_, i) => call(`a${i}`, 'fetch')), say('never')],
      [say('unused')], async (req) => { if (req.headers?.['x-dsh-purpose'] === 'compaction') ctrl.abort() })
    const agent = new Agent({ session, provider, tools: [textTool('fetch', () => `r${n++}`.padEnd(7_000, '.'))], compaction: { clear: false } })
    const before = () => JSON.stringify(session.surface().map((x) => x.seq))
    let surfaceAtStart = ''
    session.subscribe((e) => { if (e.type === 'compaction/start') surfaceAtStart = before() })
    const r = await agent.run('go', { signal: ctrl.signal })
    assert.equal(r.reason, 'aborted')
    assert.equal(provider.summaryRequests.length, 1)
    const start = session.events.findIndex((e) => e.type === 'compaction/start')
    const after = types(session.events.slice(start))
    assert.deepEqual(after, ['compaction/start', 'compaction/end', 'step/end', 'turn/end'])
    assert.equal((session.events[start + 1].data as any).error, 'aborted')
    assert.equal(stateOf(session).compaction, undefined)
    assert.equal(before(), surfaceAtStart)
  })

  test('case 9: a crash after tool/call → resume gives TOOL_OUTCOME_UNKNOWN; the session continues', async () => {
    const store = new MemoryStore()
    const session = await Session.open(store)
    const hang: Tool = { name: 'deploy', description: '', parameters: {}, execute: () => new Promise(() => {}) }
    const provider = new ScriptedProvider(16_000, [call('d1', 'deploy')])
    void new Agent({ session, provider, tools: [hang] }).run('deploy it')
    await new Promise((r) => setTimeout(r, 20)) // the tool is now running forever: "kill" the process here
    assert.equal(store.events.at(-1)!.type, 'tool/call')
    const resumed = await Session.open(store)
    const repaired = resumed.events.find((e) => e.type === 'tool/result')!
    assert.equal((repaired.data as any).message.metadata.code, 'TOOL_OUTCOME_UNKNOWN')
    const p2 = new ScriptedProvider(16_000, [say('I will check whether the deploy happened')])
    const r = await new Agent({ session: resumed, provider: p2, tools: [hang] }).run('what happened?')
    assert.equal(r.turn, 2)
    assertPaired(p2.conversation[0].request.messages)
  })

  test('steer() adds a user message for the next step', async () => {
    const session = await Session.open()
    const provider = new ScriptedProvider(16_000, [say('first'), say('second')])
    const agent = new Agent({ session, provider })
    const unsub = agent.on('agent/request', () => { if (provider.requests.length === 0) agent.steer('also: be brief') })
    const r = await agent.run('hello')
    unsub()
    assert.equal(r.text, 'second')
    assert.deepEqual(provider.conversation[1].request.messages.map((m) => m.role), ['user', 'assistant', 'user'])
    assert.equal(provider.conversation[1].request.messages[2].content, 'also: be brief')
  })

  test('region selection never keeps a result without its call', () => {
    const node = (seq: number, message: Message, tokens = 100) => ({ seq, message, tokens, key: seq })
    const nodes = [
      node(1, { role: 'user', content: 'u' }),
      node(2, { role: 'assistant', content: [{ type: 'tool-call', id: 'A', name: 't', arguments: '' }] }),
      node(3, { role: 'assistant', content: [{ type: 'tool-call', id: 'B', name: 't', arguments: '' }] }),
      node(4, { role: 'tool', toolCallId: 'A', content: [] }),
      node(5, { role: 'tool', toolCallId: 'B', content: [] }),
      node(6, { role: 'assistant', content: [{ type: 'text', text: 'x' }] }),
    ]
    for (let retained = 0; retained <= 600; retained += 50) {
      const r = selectRegion(nodes, retained)
      if (!r) continue
      const inside = new Set(nodes.slice(r.start, r.end).map((n) => n.seq))
      for (const [c, res] of [[2, 4], [3, 5]]) assert.equal(inside.has(c), inside.has(res), `retained ${retained}: ${[...inside]}`)
    }
    assert.deepEqual(selectRegion(nodes, 50), { start: 0, end: 5, tokens: 500 })
    assert.deepEqual(selectRegion(nodes, 150), { start: 0, end: 1, tokens: 100 }) // keeping B's result keeps B, A's result and A
    assert.deepEqual(selectRegion(nodes, 250, 1), undefined)
  })

  test('region selection: a checkpoint then the pinned input → the current turn\'s older steps', () => {
    const node = (seq: number, message: Message, tokens: number) => ({ seq, message, tokens, key: seq })
    // A checkpoint is known by its event (compactionId), which marks its node; its text alone is a user's message.
    const nodes = [{ ...node(0, { role: 'user', content: CHECKPOINT_PREAMBLE + '\n<compacted-summary>\nx\n</compacted-summary>' }, 2_043), checkpoint: true as const }, node(1, { role: 'user', content: 'go on' }, 11)]
    for (let i = 0; i < 20; i++) {
      nodes.push(node(2 + 2 * i, { role: 'assistant', content: [{ type: 'tool-call', id: `c${i}`, name: 't', arguments: '' }] }, 9))
      nodes.push(node(3 + 2 * i, { role: 'tool', toolCallId: `c${i}`, content: [] }, 1_008))
    }
    assert.deepEqual(selectRegion(nodes, 5_120, 1, 1_287), { start: 2, end: 30, tokens: 14_238 })
  })
})

describe('review fixes', () => {
  const host = (provider: ScriptedProvider) => ({ session: new Session(), summarizer: provider, envelope: {}, settings: { contextWindow: 4_000, compaction: ladderConfig(), prune: DEFAULT_PRUNE_CONFIG } })

  test('summary requests stay inside the window for emoji text and huge tool-call arguments', async () => {
    const provider = new ScriptedProvider(4_000, [], [say('S')])
    await summarise(host(provider), [{ role: 'user', content: '😀'.repeat(20_000) }])
    await summarise(host(provider), [
      { role: 'user', content: 'w' },
      { role: 'assistant', content: [{ type: 'tool-call', id: 'c1', name: 'write_file', arguments: JSON.stringify({ t: 'x'.repeat(40_000) }) }] },
      { role: 'tool', toolCallId: 'c1', content: [{ type: 'text', text: 'ok' }, { type: 'image', data: 'A'.repeat(50_000) }] },
    ])
    assert.equal(provider.requests.length, 2)
    for (const r of provider.requests) assert.ok(r.estimate < 4_000, `summary request of ${r.estimate} tokens`)
    const args = (provider.requests[1].request.messages[1].content as any[])[0].arguments
    assert.doesNotThrow(() => JSON.parse(args)) // still JSON for servers that check history
  })

  test('a tool-call id repeated by the server is renamed; the turn completes', async () => {
    const session = await Session.open()
    const provider = new ScriptedProvider(16_000, [call('call_0', 't'), call('call_0', 't'), say('done')])
    const r = await new Agent({ session, provider, tools: [textTool('t', () => 'r')] }).run('go')
    assert.equal(r.text, 'done')
    const ids = session.events.filter((e) => e.type === 'tool/call').map((e) => (e.data as any).callId)
    assert.equal(ids[0], 'call_0')
    assert.match(ids[1], /^call_dsh_\d+_0$/)
    assertPaired(provider.conversation[2].request.messages)
  })

  test('an agent/request hook edits a copy: the live surface equals the reloaded log', async () => {
    const store = new MemoryStore()
    const session = await Session.open(store)
    const agent = new Agent({ session, provider: new ScriptedProvider(16_000, [say('ok')]) })
    agent.on('agent/request', ({ request }) => { (request!.messages[0] as any).content = 'REDACTED' })
    await agent.run('secret question')
    assert.equal(session.messages()[0].content, 'secret question')
    assert.deepEqual((await Session.open(store, { readOnly: true })).messages(), session.messages())
  })

  test('the turn-start check prices the envelope; the missing-window warning names the conversation model', async () => {
    const session = await Session.open()
    const provider = new ScriptedProvider(16_000, [say('ok')])
    await new Agent({ session, provider, system: 'S'.repeat(52_000) }).run('hi')
    const types = session.events.map((e) => e.type)
    assert.ok(types.indexOf('compaction/warning') > -1 && types.indexOf('compaction/warning') < types.indexOf('step/start'), types.join(','))
    const warnings: string[] = []
    const s2 = await Session.open()
    await new Agent({ session: s2, provider: new ScriptedProvider(undefined, [say('ok')]), summarizer: new ScriptedProvider(undefined, []), onEvent: (e) => { if (e.type === 'warning') warnings.push(e.message) } }).run('hi')
    assert.equal(warnings.length, 1)
    assert.match(warnings[0], /model "scripted"/)
  })

  test('a block that cannot be stored as JSON is refused before any state changes', async () => {
    const session = await Session.open()
    const block: any = { type: 'image' }
    block.self = block
    const seq = session.seq
    assert.throws(() => session.append('user/message', { message: { role: 'user', content: [block] }, surfaceOp: { op: 'append' } }), /cannot be stored as JSON/)
    assert.equal(session.seq, seq)
  })
})

test('one fsync per step: a turn of N steps syncs the store N times (plus none for the input)', async () => {
  class CountingStore extends MemoryStore {
    syncs = 0
    async sync() { this.syncs++ }
  }
  const store = new CountingStore()
  const session = await Session.open(store)
  const opened = store.syncs
  const provider = new ScriptedProvider(100_000, [call('c1', 'echo'), call('c2', 'echo'), call('c3', 'echo'), say('done')])
  const agent = new Agent({ session, provider, tools: [textTool('echo', () => 'ok')] })
  const result = await agent.run('go')
  assert.equal(result.steps, 4)
  assert.equal(store.syncs - opened, 4)
  assert.equal(store.events.length, session.seq) // everything reached the store
  assert.equal(store.events.at(-1)!.type, 'turn/end')
})

test('Agent options are checked with the value, the limit and the fix (one helper)', () => {
  const session = new Session()
  const provider = new ScriptedProvider(16_000, [])
  const bad: Array<[Record<string, unknown>, RegExp]> = [
    [{ maxSteps: 0 }, /^maxSteps must be an integer ≥ 1 \(provider calls per turn\), got 0$/],
    [{ maxSteps: '5' }, /^maxSteps must be an integer ≥ 1 \(provider calls per turn\), got "5"$/],
    [{ recall: 'no' }, /^recall must be true or false, got "no"$/],
    [{ contextWindow: 1000 }, /^new Agent: the option contextWindow moved; use the provider's contextWindow/],
    [{ maxTokens: 100 }, /^new Agent: the option maxTokens moved; use the provider's maxTokens/],
    [{ instructions: 'x' }, /^new Agent: the option instructions moved; use system/],
  ]
  for (const [options, message] of bad) {
    assert.throws(() => new Agent({ session, provider, ...options } as any), (e: unknown) => e instanceof ConfigError && e instanceof TypeError && message.test((e as Error).message), JSON.stringify(options))
  }
  assert.equal(new Agent({ session, provider, contextWindow: undefined } as any).contextWindow, 16_000, 'a moved option left undefined is no error; the window is the provider\'s')
})
