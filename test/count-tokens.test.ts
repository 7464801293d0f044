// Exact counts where a provider offers them (docs/design.md §6.1): near the window the Agent asks the
// provider's own count of the request, logs it as an exact calibration sample and relieves pressure
// on it before the request is sent.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { Agent, Session, MemoryStore, type ChatRequest, type Message, type Provider, type SessionEvent } from '../dsh.ts'
import { FLASH, requestTokens, resultTool, shortSummarizer, toolOncePerTurn } from './scripted-provider.ts'

const text = (m: Message) => (typeof m.content === 'string' ? m.content : JSON.stringify(m.content))

function provider(count: (request: ChatRequest) => Promise<number>) {
  const sent: ChatRequest[] = [], counted: ChatRequest[] = []
  return {
    sent, counted,
    model: 'm', baseURL: 'memory://count', contextWindow: 10_000, maxTokens: 100,
    complete: async (request: ChatRequest) => {
      sent.push(request)
      return { message: { role: 'assistant' as const, content: [{ type: 'text' as const, text: 'ok: a short reply' }] }, finishReason: 'stop' }
    },
    countTokens: async (request: ChatRequest) => { counted.push(request); return count(request) },
  }
}

test('near the window the provider\'s count is a sample and an anchor, and the ladder compacts on it before the request', async () => {
  const p = provider(async () => 12_000)
  const session = await Session.open(new MemoryStore())
  const agent = new Agent({ session, provider: p, compaction: { thresholdRatio: 0.95 } })
  await agent.run('first ' + 'a'.repeat(16_000)) // ≈ 4,000 tokens: far from the window, nothing counted
  assert.equal(p.counted.length, 0)
  await agent.run('second ' + 'b'.repeat(20_000)) // ≈ 9,000 heuristic tokens: within 10% of the 10,000-token window
  assert.equal(p.counted.length >= 1, true)
  const samples = session.events.filter((e) => e.type === 'ladder/state' && (e.data as any).sample?.source === 'count')
  assert.equal((samples[0].data as any).sample.providerTokens, 12_000)
  // The ladder acted on the count before the second turn's request went out: the first message is cut.
  const answer = session.events.findLast((e) => e.type === 'assistant/message')!
  const edits = session.events.filter((e) => e.type.startsWith('compaction/') && e.seq > samples[0].seq && e.seq < answer.seq)
  assert.ok(edits.length > 0, 'an edit between the count and the answer')
  const first = p.sent.at(-1)!.messages.find((m) => text(m).startsWith('first '))!
  assert.ok(text(first).includes('[... middle of this user message cut; recall {"key":"seq:') && text(first).length < 16_006, 'the first message is no longer sent whole')
})

test('a count that fails is warned about once, the estimate stands and the turn runs', async () => {
  const p = provider(async () => { throw new Error('count endpoint down') })
  const session = await Session.open(new MemoryStore())
  const warnings: string[] = []
  const agent = new Agent({ session, provider: p, compaction: { thresholdRatio: 0.95 }, onEvent: (e) => { if (e.type === 'warning') warnings.push(e.message) } })
  await agent.run('x'.repeat(37_000))
  await agent.run('y')
  assert.equal(p.counted.length, 1)
  assert.deepEqual(warnings.filter((w) => w.includes('could not count')), ['the provider could not count the request (count endpoint down); the estimate stands'])
  assert.equal(p.sent.length >= 2, true)
})

test('a summary request the server counts over the window is planned smaller before it is sent', async () => {
  // The summarizer's tokenizer is 3× the heuristic: its count says the first plan cannot fit.
  const summaries: ChatRequest[] = []
  const heuristic = (r: ChatRequest) => r.messages.reduce((n, m) => n + Math.ceil(text(m).length / 4) + 8, 0)
  const summarizer = {
    model: 's', baseURL: 'memory://s', contextWindow: 8_000, maxTokens: 100,
    complete: async (r: ChatRequest) => { summaries.push(r); return { message: { role: 'assistant' as const, content: [{ type: 'text' as const, text: 'summary' }] }, finishReason: 'stop' } },
    countTokens: async (r: ChatRequest) => 3 * heuristic(r),
  }
  const p = provider(async () => 1)
  const session = await Session.open(new MemoryStore())
  const agent = new Agent({ session, provider: { ...p, contextWindow: 20_000, countTokens: undefined }, summarizer })
  for (let i = 0; i < 12; i++) await agent.run(`turn ${i} ` + String(i % 10).repeat(8_000))
  assert.ok(summaries.length > 0, 'a summary was made')
  // every request the summarizer got fits its window by its own count
  for (const r of summaries) assert.ok(3 * heuristic(r) + (r.maxTokens ?? 0) <= 8_000, `${3 * heuristic(r)} + ${r.maxTokens}`)
})

// A Provider's count that is no token count, and the summary job's own count (the hostile reviews rev6, rev6b).
test('count: a Provider whose countTokens answers no token count (NaN, -5, "12000") logs no calibration sample of it', async () => {
  // The adapters check their server's count (an integer in [0, USAGE_MAX_TOKENS]); the loop takes any Provider's
  // answer as is and logs it: ladder/state {sample: {providerTokens: null}} (NaN as JSON), -5, "12000".
  const logged: unknown[] = []
  for (const count of [Number.NaN, -5, '12000']) {
    const provider: Provider = { model: 'm', baseURL: 'memory://count', contextWindow: 10_000, maxTokens: 100, prices: FLASH,
      complete: async () => ({ message: { role: 'assistant', content: [{ type: 'text', text: 'ok' }] }, finishReason: 'stop' }),
      countTokens: async () => count as number } as Provider
    const session = await Session.open(new MemoryStore())
    await new Agent({ session, provider } as ConstructorParameters<typeof Agent>[0]).run('x'.repeat(36_000))
    for (const e of session.events) {
      const sample = (e.data as { sample?: { providerTokens: unknown; source: string } }).sample
      if (e.type === 'ladder/state' && sample?.source === 'count') logged.push(sample.providerTokens)
    }
  }
  // Observed: [NaN, -5, '12000'] (NaN is written as null).
  assert.deepEqual(logged, [])
})

test('count: a summary request\'s countTokens answer that is no token count ("99999", 1.5e12, 12000.5) is not logged as a sample', async () => {
  // 66de51e: "a Provider's countTokens answer that is no token count is not logged (a warning, the estimate stands)".
  // That check is on the conversation's count near the window only; the summary job's own count (SummaryJob.request,
  // which re-plans on it) logs what it gets as `ladder/state {sample: {providerTokens}}`: a string, a count over
  // USAGE_MAX_TOKENS (1e9), a fraction. The fraction moves the calibration (2.41 after resume, from 1).
  const isSummary = (messages: readonly unknown[]) =>
    JSON.stringify(messages.at(-1)).includes('Write a checkpoint of the conversation')
  const logged: unknown[] = []
  for (const answer of ['99999', 1.5e12, 12000.5] as unknown[]) {
    let k = 0
    const provider = { model: 'm', baseURL: 'memory://m', contextWindow: 10_000, maxTokens: 100,
      countTokens: async (r: { messages: readonly unknown[] }) => {
        if (isSummary(r.messages)) return answer
        throw new Error('no count here')
      },
      complete: async (r: ChatRequest) => isSummary(r.messages)
        ? { message: { role: 'assistant', content: [{ type: 'text', text: 'Summary: tools were run.' }] }, finishReason: 'stop' }
        : k < 9 ? { message: { role: 'assistant', content: [{ type: 'tool-call', id: `c${k++}`, name: 't', arguments: '{}' }] },
          finishReason: 'tool-calls' }
          : { message: { role: 'assistant', content: [{ type: 'text', text: 'ok' }] }, finishReason: 'stop' },
    } as unknown as Provider
    const session = await Session.open(new MemoryStore())
    const agent = new Agent({ session, provider, system: 'sys', recall: false, compaction: { clear: false },
      tools: [resultTool(7_000)] } as ConstructorParameters<typeof Agent>[0])
    await agent.run('go')
    assert.ok(session.events.some((e) => e.type === 'compaction/summary'), `a summary was made (count ${answer})`)
    for (const e of session.events as SessionEvent<'ladder/state'>[]) {
      const t = e.type === 'ladder/state' ? (e.data as { sample?: { providerTokens: unknown } }).sample?.providerTokens : undefined
      if (t !== undefined && !(Number.isInteger(t) && (t as number) >= 0 && (t as number) <= 1e9)) logged.push(t)
    }
  }
  // Observed: ['99999' ×6, 1500000000000 ×6, 12000.5 ×12]
  assert.deepEqual([...new Set(logged)], [])
})

test('count: a countTokens that answers a plain number, or throws at once, disables every summary (requests grow past the window)', async () => {
  // The conversation's count near the window awaits the answer in a try: a plain number is read, a throw is a warning
  // and the estimate stands. The summary job calls `provider.countTokens?.(…).catch(…)`: a plain number has no
  // .catch (TypeError), a synchronous throw escapes the .catch; either fails the compaction before its request, every
  // time. With a 10,000-token window and nine 1,750-token results the requests grow to about 16,000 tokens.
  const seen: string[] = []
  for (const count of [() => 3000, () => { throw new Error('count: not supported by this server') }]) {
    let k = 0
    const sizes: number[] = []
    const provider = { ...toolOncePerTurn(10_000, sizes), countTokens: count,
      complete: async (r: ChatRequest) => { sizes.push(requestTokens(r))
        return k < 9 ? { message: { role: 'assistant', content: [{ type: 'tool-call', id: `c${k++}`, name: 't', arguments: '{}' }] },
          finishReason: 'tool-calls' } : { message: { role: 'assistant', content: [{ type: 'text', text: 'ok' }] }, finishReason: 'stop' } },
    } as unknown as Provider
    const session = await Session.open(new MemoryStore())
    const agent = new Agent({ session, provider, summarizer: { ...shortSummarizer(10_000), countTokens: count } as unknown as Provider,
      system: 'sys', recall: false, compaction: { clear: false }, tools: [resultTool(7_000)] } as ConstructorParameters<typeof Agent>[0])
    await agent.run('go')
    const failures = session.events.filter((e) => e.type === 'compaction/end' && (e.data as { error?: string }).error)
      .map((e) => (e.data as { error: string }).error)
    // Observed: 0 summaries, six failures 'provider.countTokens(...).catch is not a function' (or the count's own
    // error), and a largest request of ~16,000 tokens in the 10,000-token window.
    seen.push(...new Set(failures), ...(Math.max(...sizes) > 10_000 ? [`a request of ${Math.max(...sizes)} tokens`] : []))
  }
  assert.deepEqual(seen, [])
})
