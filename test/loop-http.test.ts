// The loop and the ladder over real HTTP against the fake provider (issue 4 cases 1, 2, 3, 10).
import { test, after } from 'node:test'
import assert from 'node:assert/strict'
import {
  Agent, Session, MemoryStore, openAICompatible, PRUNE_MARKER, ProviderError, type Tool, type ToolCallBlock, CostLedger
} from '../dsh.ts'
import {
  SUMMARY_INSTRUCTION, CHECKPOINT_PREAMBLE,
} from './spec.ts'
import { startFakeProvider, type FakeReply, type FakeRequest } from './fake-provider.ts'
import { tuned } from './tuning.ts'

const servers: Array<{ close(): Promise<void> }> = []
after(async () => { for (const s of servers) await s.close() })

/** A fake whose conversation replies come from `script` and whose summary replies come from `summaries`. */
async function fake(script: FakeReply[], summaries: FakeReply[] = [{ text: 'CHECKPOINT: work so far.' }]) {
  let c = 0, s = 0
  const server = await startFakeProvider({
    handler: (req: FakeRequest) => req.headers['x-dsh-purpose'] === 'compaction' ? summaries[Math.min(s++, summaries.length - 1)] : script[Math.min(c++, script.length - 1)],
  })
  servers.push(server)
  const provider = tuned({ maxRetries: 0 }, () => openAICompatible({ baseURL: server.url, model: 'fake-model', apiKey: 'sk-test', contextWindow: 16_000 }))
  const conversation = () => server.requests.filter((r) => r.headers['x-dsh-purpose'] !== 'compaction')
  const summary = () => server.requests.filter((r) => r.headers['x-dsh-purpose'] === 'compaction')
  return { server, provider, conversation, summary }
}

const tool = (name: string, out: () => string): Tool => ({ name, description: 'test tool', parameters: { type: 'object', properties: {} }, execute: out })
const count = (s: Session, type: string) => s.events.filter((e) => e.type === type).length
const DEEPSEEK_OVERFLOW = { error: { message: "This model's maximum context length is 65536 tokens. However, you requested 70411 tokens (62219 in the messages, 8192 in the completion). Please reduce the length of the messages or completion.", type: 'invalid_request_error', param: null, code: 'invalid_request_error' } }

test('case 1 over HTTP: the pruner alone brings a 60 KB result under the threshold', async () => {
  const f = await fake([{ toolCalls: [{ id: 'c1', name: 'read_log', arguments: {} }] }, { text: 'three errors' }])
  const session = await Session.open(new MemoryStore())
  const r = await new Agent({ session, provider: f.provider, tools: [tool('read_log', () => 'ERROR x\n'.repeat(7_500))] }).run('read the log')
  assert.equal(r.text, 'three errors')
  assert.equal(f.summary().length, 0)
  assert.equal(count(session, 'compaction/prune'), 1)
  assert.equal(count(session, 'compaction/summary'), 0)
  const second = f.conversation()[1].body
  const toolMsg = second.messages.find((m: any) => m.role === 'tool')
  assert.ok(toolMsg.content.includes(PRUNE_MARKER))
  assert.equal([...toolMsg.content].length, 5_159)
})

test('case 2 over HTTP: one summary request with x-dsh-purpose, instruction last; checkpoint leads the next request', async () => {
  let n = 0
  const calls = (k: number, p: string) => Array.from({ length: k }, (_, i) => ({ toolCalls: [{ id: `${p}${i}`, name: 'fetch', arguments: { i } }] }))
  const f = await fake([...calls(5, 'a'), { text: 'turn 1 done' }, ...calls(4, 'b'), { text: 'turn 2 done' }])
  const session = await Session.open(new MemoryStore())
  const agent = new Agent({ session, provider: f.provider, tools: [tool('fetch', () => `result ${n++} `.padEnd(7_000, '.'))], compaction: { clear: false } })
  await agent.run('fetch five')
  await agent.run('fetch four more')
  assert.equal(f.summary().length, 1)
  const s = f.summary()[0].body
  assert.deepEqual(s.messages.at(-1), { role: 'user', content: SUMMARY_INSTRUCTION })
  const after = f.server.requests.slice(f.server.requests.indexOf(f.summary()[0]) + 1)[0].body
  assert.equal(after.messages[0].role, 'user')
  assert.ok(after.messages[0].content.startsWith(CHECKPOINT_PREAMBLE))
  for (const req of f.server.requests) {
    const ids = req.body.messages.flatMap((m: any) => (m.tool_calls ?? []).map((c: any) => c.id)).sort()
    const results = req.body.messages.filter((m: any) => m.role === 'tool').map((m: any) => m.tool_call_id).sort()
    assert.deepEqual(ids, results)
  }
})

for (const [name, overflowReply] of [
  ['HTTP 400 with DeepSeek wording', { status: 400, body: DEEPSEEK_OVERFLOW }],
  ['an error inside a 200 stream', { fault: 'in-band-error', error: { message: "This model's maximum context length is 65536 tokens. However, you requested 70411 tokens." } }],
] as Array<[string, FakeReply]>) {
  test(`case 3 over HTTP: overflow as ${name} → compaction → retry as step 2 → done`, async () => {
    let n = 0
    const f = await fake([...Array.from({ length: 4 }, (_, i) => ({ toolCalls: [{ id: `h${i}`, name: 'fetch', arguments: {} }] })), { text: 'first done' }, overflowReply, { text: 'recovered' }])
    const session = await Session.open(new MemoryStore())
    const agent = new Agent({ session, provider: f.provider, tools: [tool('fetch', () => `r${n++}`.padEnd(6_000, '.'))] })
    await agent.run('fetch four')
    const r = await agent.run('answer now')
    assert.equal(r.text, 'recovered')
    const [failed, retried] = f.conversation().slice(-2)
    assert.ok(retried.rawBody.length < failed.rawBody.length)
    assert.ok(retried.rawBody.includes('CHECKPOINT: work so far.'))
    const retry = session.events.find((e) => e.type === 'recovery/retry')!
    // One replace per rung edit of this recovery (clears of old results, then the checkpoint).
    const edits = session.events.slice(session.events.findIndex((e) => e.type === 'request/error')).filter((e) => ['compaction/clear', 'compaction/prune', 'compaction/summary'].includes(e.type)).length
    assert.ok(edits >= 1)
    assert.equal((retry.data as any).generationAfter, (retry.data as any).generationBefore + edits)
    const steps = session.events.filter((e) => e.type === 'step/start' && (e.data as any).turn === 2).map((e) => (e.data as any).step)
    assert.deepEqual(steps, [1, 2])
    const err = session.events.find((e) => e.type === 'request/error')!
    assert.equal((err.data as any).code, 'CONTEXT_WINDOW_EXCEEDED')
  })
}

test('case 4 over HTTP: nothing to reclaim → the provider error object with its text', async () => {
  const f = await fake([{ status: 400, body: DEEPSEEK_OVERFLOW }])
  const session = await Session.open(new MemoryStore())
  await assert.rejects(new Agent({ session, provider: f.provider }).run('x'.repeat(40_000)),
    (e) => e instanceof ProviderError && e.code === 'CONTEXT_WINDOW_EXCEEDED' && e.status === 400 && e.message.includes('maximum context length is 65536'))
  assert.equal(f.server.requests.length, 1)
})

test('case 10: thinking mode keeps reasoning_content on every assistant message through prune and compaction', async () => {
  let n = 0
  const steps = Array.from({ length: 9 }, (_, i) => ({ reasoning: `think ${i}`, toolCalls: [{ id: `t${i}`, name: 'fetch', arguments: { i } }] }))
  const f = await fake([{ reasoning: 'big', toolCalls: [{ id: 'big', name: 'big', arguments: {} }] }, ...steps, { reasoning: 'final', text: 'done' }, { text: 'turn 2' }])
  const session = await Session.open(new MemoryStore())
  const agent = new Agent({ session, provider: f.provider, tools: [tool('fetch', () => `r${n++}`.padEnd(6_500, '.')), tool('big', () => 'B'.repeat(40_000))], compaction: { clear: false } })
  await agent.run('think and fetch')
  await agent.run('again')
  assert.ok(count(session, 'compaction/prune') >= 1)
  assert.ok(count(session, 'compaction/summary') >= 1)
  let checked = 0
  for (const req of f.server.requests) {
    for (const m of req.body.messages) {
      if (m.role !== 'assistant') continue
      assert.equal(typeof m.content, 'string')
      if (m.tool_calls) {
        checked++
        const id = m.tool_calls[0].id
        assert.equal(m.reasoning_content, id === 'big' ? 'big' : `think ${id.slice(1)}`)
      }
    }
  }
  assert.ok(checked > 20, `checked ${checked} assistant messages`)
})

// A stream that breaks after output: the adapter does not retry it (the caller saw the text), the loop does, once.
test('an in-stream error after content: the partial is kept as an interrupted message and the step is retried once as a new step', async () => {
  const f = await fake([{ fault: 'in-band-error', text: 'Once upon', error: { code: 500, message: 'slot failed', type: 'server_error' } }, { text: 'a time.' }])
  const session = await Session.open(new MemoryStore())
  const r = await new Agent({ session, provider: f.provider }).run('tell a story')
  assert.equal(r.reason, 'stop')
  assert.equal(r.text, 'a time.')
  assert.equal(r.steps, 2)
  const turn = session.events.filter((e) => e.type !== 'request/header')
  assert.deepEqual(turn.map((e) => e.type), ['session/start', 'turn/start', 'user/message', 'step/start', 'request/error', 'assistant/message', 'step/end', 'step/retry', 'step/start', 'assistant/message', 'step/end', 'turn/end'])
  // The broken request ran on the server: it is logged with what dsh sent and received (the spend cap counts it), and
  // its partial is that same request, not a second one.
  assert.deepEqual(turn[4].data, { code: 'SERVER', status: 500, message: (turn[4].data as { message: string }).message, trigger: 'conversation',
    spent: { inputTokens: 11, modelledHitTokens: 0, outputTokens: 11 } })
  assert.equal(CostLedger.of(session).usage().conversation.requests, 2)
  assert.deepEqual(turn[5].data, { message: { role: 'assistant', content: [{ type: 'text', text: 'Once upon' }], interrupted: true }, finishReason: 'error', surfaceOp: { op: 'append' } })
  assert.deepEqual(turn[7].data, { turn: 1, step: 1, code: 'SERVER' })
  // The retried request carries the partial output as the last (assistant) message.
  const [first, second] = f.conversation().map((q) => q.body.messages)
  assert.deepEqual(second, [...first, { role: 'assistant', content: 'Once upon' }])
})

test('two stream breaks in a row end the turn with the second error; both partials are kept', async () => {
  const broken = (text: string) => ({ fault: 'in-band-error' as const, text, error: { message: 'overloaded', type: 'server_error' } })
  const f = await fake([broken('one'), broken('two'), { text: 'unused' }])
  const session = await Session.open(new MemoryStore())
  await assert.rejects(new Agent({ session, provider: f.provider }).run('go'), (err: ProviderError) => err.code === 'SERVER' && err.partial?.content[0]?.type === 'text')
  assert.equal(f.conversation().length, 2)
  assert.equal(count(session, 'step/retry'), 1)
  assert.deepEqual(session.messages().slice(1), [
    { role: 'assistant', content: [{ type: 'text', text: 'one' }], interrupted: true },
    { role: 'assistant', content: [{ type: 'text', text: 'two' }], interrupted: true },
  ])
  assert.equal(session.events.at(-1)!.type, 'turn/end')
  assert.deepEqual(session.events.at(-1)!.data, { turn: 1, reason: 'error' })
})

test('a stream error before any output is not retried by the loop (the adapter retries those itself)', async () => {
  const f = await fake([{ fault: 'in-band-error', error: { message: 'overloaded', type: 'server_error' } }, { text: 'unused' }])
  const session = await Session.open(new MemoryStore())
  await assert.rejects(new Agent({ session, provider: f.provider }).run('go'), (err: ProviderError) => err.code === 'SERVER')
  assert.equal(f.conversation().length, 1)
  assert.equal(count(session, 'step/retry'), 0)
})

// A reply with more tool calls than the window can answer (even with every result cleared, a call
// and its result take ~30 tokens) would leave a group no rung can shrink: every later turn failed
// preflight. The calls past window / 64 are dropped unrun, with a note, and the next turns work.
test('1,000 tool calls in an 8,000-token window: 125 run, the rest are dropped with a note; the next turns work', { timeout: 60_000 }, async () => {
  const calls = Array.from({ length: 1000 }, (_, i) => ({ id: `c${i}`, name: 'ping', arguments: {} }))
  const f = await fake([{ toolCalls: calls, deltaSize: 100 }, { text: 'pinged' }, { text: 'second turn' }, { text: 'third turn' }])
  const provider = tuned({ maxRetries: 0 }, () => openAICompatible({ baseURL: f.server.url, model: 'fake-model', apiKey: 'sk-test', contextWindow: 8_000, maxTokens: 500 }))
  const session = await Session.open(new MemoryStore())
  let ran = 0
  const warnings: string[] = []
  const agent = new Agent({ session, provider, tools: [tool('ping', () => { ran++; return 'pong' })], onEvent: (e) => { if (e.type === 'warning') warnings.push(e.message) } })
  assert.equal((await agent.run('ping everything')).text, 'pinged')
  assert.equal(ran, 125)
  const logged = (session.events.find((e) => e.type === 'assistant/message')!.data as any).message
  assert.equal(logged.content.filter((b: any) => b.type === 'tool-call').length, 125)
  assert.deepEqual(logged.content.at(-1), { type: 'text', text: '[dsh: 875 more tool calls of this message were dropped without running: one message may make at most 125 tool calls in a 8000-token context window; make fewer at a time]' })
  assert.equal(count(session, 'tool/result'), 125)
  assert.ok(warnings.some((w) => w.startsWith('the model made 1000 tool calls in one message; the first 125 run, 875 were dropped')), warnings.join('\n'))
  assert.equal((await agent.run('again')).text, 'second turn')
  assert.equal((await agent.run('and again')).text, 'third turn')
  const last = f.conversation().at(-1)!.body
  assert.equal(last.messages.filter((m: any) => m.role === 'tool').length, 125)
  assert.ok(session.measure().totalTokens < 0.8 * 8_000, `${session.measure().totalTokens} tokens, over the pressure threshold`)
})

/** An in-process provider (1,000,000-token window) whose first answer is `calls`, every later one `reply N`. */
function manyCallsThenText(calls: ToolCallBlock[]) {
  let n = 0
  return {
    model: 'in-process', baseURL: 'memory://in-process', contextWindow: 1_000_000, maxTokens: 100,
    complete: async () => (n++ === 0 ? { message: { role: 'assistant' as const, content: calls }, finishReason: 'tool_calls' } : { message: { role: 'assistant' as const, content: [{ type: 'text' as const, text: `reply ${n}` }] }, finishReason: 'stop' }),
  }
}

test('a provider that returns 20,000 tool calls in one message (no adapter cap): 1,000 run, TOOL_LIMIT errors up to what the window holds, the next turn works', { timeout: 60_000 }, async () => {
  const many = Array.from({ length: 20_000 }, (_, i) => ({ type: 'tool-call' as const, id: `c${i}`, name: 'ping', arguments: '{}' }))
  const provider = manyCallsThenText(many)
  const session = await Session.open(new MemoryStore())
  let ran = 0
  const agent = new Agent({ session, provider, tools: [tool('ping', () => { ran++; return 'pong' })] })
  await agent.run('ping everything')
  assert.equal(ran, 1000)
  // 1,000,000 / 64 = 15,625 calls fit as a group; the 14,625 past the step's 1,000 are answered with errors.
  assert.match(contentOf(session), /\[dsh: 4375 more tool calls of this message were dropped without running: one message may make at most 15625 tool calls in a 1000000-token context window; make fewer at a time\]/)
  const results = session.events.filter((e) => e.type === 'tool/result').map((e) => (e.data as any).message)
  assert.equal(results.length, 15_625)
  assert.equal(results.filter((m) => m.metadata?.code === 'TOOL_LIMIT').length, 14_625)
  assert.equal((await agent.run('next')).text, 'reply 3')
})

test('calls past the 1,000 a step runs get TOOL_LIMIT error results saying why (not dropped unrun); the next turn works', { timeout: 60_000 }, async () => {
  const many = Array.from({ length: 1_500 }, (_, i) => ({ type: 'tool-call' as const, id: `c${i}`, name: 'ping', arguments: '{}' }))
  const provider = manyCallsThenText(many)
  const session = await Session.open(new MemoryStore())
  let ran = 0
  const warnings: string[] = []
  const agent = new Agent({ session, provider, tools: [tool('ping', () => { ran++; return 'pong' })], onEvent: (e) => { if (e.type === 'warning') warnings.push(e.message) } })
  await agent.run('ping everything')
  assert.equal(ran, 1000)
  const message = (session.events.find((e) => e.type === 'assistant/message')!.data as any).message
  assert.equal(message.content.filter((b: any) => b.type === 'tool-call').length, 1_500, 'every call is kept and answered')
  const results = session.events.filter((e) => e.type === 'tool/result').map((e) => (e.data as any).message)
  assert.equal(results.length, 1_500)
  const limited = results.filter((m) => m.isError && m.metadata?.code === 'TOOL_LIMIT')
  assert.equal(limited.length, 500)
  assert.equal(limited[0].toolCallId, 'c1000')
  assert.equal(limited[0].content[0].text, 'TOOL_LIMIT: not run: a step runs at most 1000 tool calls; call it again if it is still needed')
  assert.equal(session.events.filter((e) => e.type === 'tool/call').length, 1000, 'only the calls that ran were dispatched')
  assert.deepEqual(warnings, ['the model made 1500 tool calls in one message; the first 1000 run, 500 were answered with TOOL_LIMIT errors (a step runs at most 1000)'])
  assert.equal((await agent.run('next')).text, 'reply 3')
})

const contentOf = (s: Session): string => JSON.stringify((s.events.find((e) => e.type === 'assistant/message')!.data as any).message.content.at(-1))
