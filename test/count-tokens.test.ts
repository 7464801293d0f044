// Exact counts where a provider offers them (docs/design.md §6.1): near the window the Agent asks the
// provider's own count of the request, logs it as an exact calibration sample and relieves pressure
// on it before the request is sent.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { Agent, Session, MemoryStore, PRUNE_MARKER, type ChatRequest, type Message } from '../dsh.ts'

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
  assert.ok(text(first).includes(PRUNE_MARKER) && text(first).length < 16_006, 'the first message is no longer sent whole')
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
