// anthropic() against a real Anthropic Messages server: llama.cpp's llama-server (pinned, the same
// binary as real.test.ts) serves POST /v1/messages (SSE with Anthropic's event names) and
// POST /v1/messages/count_tokens. The model (stories260K) never calls tools, so a history with
// tool_use / tool_result blocks is written by the test; what is checked is the wire: usage, the
// server's acceptance, its overflow error and its token count. Run: npm run test:real.
import { describe, test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { Agent, Session, MemoryStore, anthropic, estimateRequestTokens, type Message, type StreamEvent, type ChatRequest } from '../../dsh.ts'
import { skipWithoutServer, startServer, recordingFetch, settled, type RunningServer, type Exchange } from './server.ts'
import { tuned, ladderTuned } from '../tuning.ts'

const skip = skipWithoutServer()
const SCENARIO_TIMEOUT_MS = 300_000

/** The server's own usage in an Anthropic stream: message_start's input fields, message_delta's output. */
function wireUsage(x: Exchange): { input: number; cacheRead: number; output: number } {
  const out = { input: -1, cacheRead: 0, output: -1 }
  for (const line of x.responseText.split('\n')) {
    if (!line.startsWith('data: {')) continue
    const e = JSON.parse(line.slice(6))
    const u = e.type === 'message_start' ? e.message.usage : e.type === 'message_delta' ? e.usage : undefined
    if (u?.input_tokens !== undefined) out.input = u.input_tokens
    if (u?.cache_read_input_tokens !== undefined) out.cacheRead = u.cache_read_input_tokens
    if (u?.output_tokens !== undefined) out.output = u.output_tokens
  }
  return out
}

const WORDS = 'the a little girl boy dog cat tree sun park ball happy sad big small red went saw played ran and but so then'.split(' ')
const filler = (chars: number, seed: number) => {
  let out = '', x = seed
  while (out.length < chars) { x = (x * 1103515245 + 12345) % 2 ** 31; out += WORDS[x % WORDS.length] + ' ' }
  return out.slice(0, chars)
}

describe('anthropic() against llama-server\'s /v1/messages', { skip, timeout: SCENARIO_TIMEOUT_MS }, () => {
  let server: RunningServer
  before(async () => { server = await startServer({ ctxSize: 2048 }) })
  after(async () => { await server?.stop() })
  const make = () => {
    const rec = recordingFetch()
    const provider = tuned({ maxRetries: 0 }, () => anthropic({ baseURL: server.baseURL.replace(/\/v1$/, ''), model: 'stories260K', contextWindow: server.ctxSize,
      maxTokens: 24, fetch: rec.fetch, extraBody: { temperature: 0 } }))
    return { provider, exchanges: rec.exchanges }
  }

  test('a streamed turn: text from the deltas, usage equal to the server\'s own figures, countTokens equal to the prompt it billed', async () => {
    const { provider, exchanges } = make()
    const request: ChatRequest = { system: 'You tell stories.', messages: [{ role: 'user', content: 'Once upon a time, there was a little dog named Max.' }] }
    const events: StreamEvent[] = []
    const r = await provider.complete({ ...request, onEvent: (e) => events.push(e) })
    await settled(exchanges)
    const [x] = exchanges
    assert.equal(x.url, `${server.baseURL}/messages`)
    assert.equal(x.status, 200)
    assert.equal(x.headers['anthropic-version'], '2023-06-01')
    assert.deepEqual(x.body.system, [{ type: 'text', text: 'You tell stories.', cache_control: { type: 'ephemeral' } }])
    const text = r.message.content.filter((b) => b.type === 'text').map((b) => (b as { text: string }).text).join('')
    assert.ok(text.length > 0)
    assert.equal(events.filter((e) => e.type === 'text-delta').map((e) => (e as { text: string }).text).join(''), text)
    const u = wireUsage(x)
    assert.ok(u.input > 0 && u.output > 0, JSON.stringify(u))
    assert.deepEqual(r.usage, { promptTokens: u.input + u.cacheRead, completionTokens: u.output, cachedTokens: u.cacheRead })
    assert.ok(['stop', 'length'].includes(r.finishReason))
    // The server's count of the same request equals the prompt it billed for it.
    assert.equal(await provider.countTokens!(request), r.usage!.promptTokens)
    assert.equal(exchanges[1].url, `${server.baseURL}/messages/count_tokens`)
  })

  test('a history holding tool_use / tool_result blocks is accepted and answered; countTokens counts it as the completion does', async () => {
    const { provider, exchanges } = make()
    const messages: Message[] = [
      { role: 'user', content: 'Read both notes.' },
      { role: 'assistant', content: [{ type: 'text', text: 'Reading.' }, { type: 'tool-call', id: 'toolu_a', name: 'read_file', arguments: '{"path":"a.txt"}' },
        { type: 'tool-call', id: 'toolu_b', name: 'read_file', arguments: '{"path":"b.txt"}' }] },
      { role: 'tool', toolCallId: 'toolu_a', content: [{ type: 'text', text: 'The dog ran to the park.' }] },
      { role: 'tool', toolCallId: 'toolu_b', content: [{ type: 'text', text: 'no such file' }], isError: true },
      { role: 'user', content: 'What happened next?' },
    ]
    const tools = [{ name: 'read_file', description: 'Read a file', parameters: { type: 'object', properties: { path: { type: 'string' } } } }]
    const counted = await provider.countTokens!({ tools, messages })
    const r = await provider.complete({ tools, messages })
    await settled(exchanges)
    const x = exchanges[1]
    assert.equal(x.status, 200)
    assert.deepEqual(x.body.messages[1].content.map((b: any) => b.type), ['text', 'tool_use', 'tool_use'])
    assert.deepEqual(x.body.messages[2].content.map((b: any) => [b.type, b.tool_use_id, b.is_error]), [
      ['tool_result', 'toolu_a', undefined], ['tool_result', 'toolu_b', true], ['text', undefined, undefined]])
    assert.ok(r.message.content.length > 0)
    const u = wireUsage(x)
    assert.equal(r.usage!.promptTokens, u.input + u.cacheRead)
    assert.equal(counted, r.usage!.promptTokens)
  })

  test('an overflow of the real 2,048-token window is classified and recovered by the ladder; the retry is accepted', async () => {
    const { provider, exchanges } = make()
    const session = await Session.open(new MemoryStore())
    for (let i = 0; i < 4; i++) {
      session.append('assistant/message', { message: { role: 'assistant', content: [{ type: 'tool-call', id: `r${i}`, name: 'read_file', arguments: '{}' }] }, finishReason: 'tool_calls', surfaceOp: { op: 'append' } })
      session.append('tool/result', { message: { role: 'tool', toolCallId: `r${i}`, content: [{ type: 'text', text: filler(1_300, 20 + i) }] }, surfaceOp: { op: 'append' } })
    }
    const agent = ladderTuned({ summaryMaxTokens: 64 }, () => new Agent({ session, provider, prune: { thresholdChars: 1_000, headChars: 200, tailChars: 100 } }))
    const input = 'What happened next?'
    const estimate = estimateRequestTokens(agent.envelope, [...session.messages(), { role: 'user', content: input }])
    assert.ok(estimate + 24 < 2048 * 0.8, `the heuristic must think it fits (${estimate})`)
    const r = await agent.run(input)
    await settled(exchanges)
    assert.ok(['stop', 'length'].includes(r.reason))
    const rejected = exchanges[0]
    assert.equal(rejected.status, 400)
    assert.equal(JSON.parse(rejected.responseText).error.type, 'exceed_context_size_error')
    const errors = session.events.filter((e) => e.type === 'request/error')
    assert.equal(errors[0].data.code, 'CONTEXT_WINDOW_EXCEEDED')
    assert.equal(session.events.filter((e) => e.type === 'recovery/retry').length, 1)
    const conversation = exchanges.filter((x) => x.headers['x-dsh-purpose'] !== 'compaction')
    assert.equal(conversation.at(-1)!.status, 200)
    assert.ok(wireUsage(conversation.at(-1)!).input + wireUsage(conversation.at(-1)!).cacheRead < 2048)
  })
})
