// The meter's usage anchor (docs/design.md §2) against a broken or hostile server: bogus counts never become
// the anchor, so one bad reply cannot price every later request as an overflow, live or after a resume.
import { test, after } from 'node:test'
import assert from 'node:assert/strict'
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { Agent, Session, FileStore, openAICompatible, CostLedger } from '../dsh.ts'
import { startFakeProvider } from './fake-provider.ts'
import { tuned } from './tuning.ts'

const dirs: string[] = []
const servers: Array<{ close(): Promise<void> }> = []
after(async () => { for (const s of servers) await s.close(); for (const d of dirs) rmSync(d, { recursive: true, force: true }) })

for (const [name, usage] of [
  ['prompt_tokens 1e12', { prompt_tokens: 1e12, completion_tokens: 5 }],
  ['prompt_tokens 1.5e300', { prompt_tokens: 1.5e300, completion_tokens: 0 }],
  ['negative counts', { prompt_tokens: -1e9, completion_tokens: -5 }],
] as const) {
  test(`usage with ${name} on the first reply: later turns run, the total stays the heuristic one, a resumed session agrees`, async () => {
    const dir = mkdtempSync(join(tmpdir(), 'dsh-usage-')); dirs.push(dir)
    let i = 0
    const server = await startFakeProvider({ handler: () => ({ text: `reply ${i}`, usage: i++ === 0 ? usage : null }) })
    servers.push(server)
    const provider = tuned({ maxRetries: 0 }, () => openAICompatible({ baseURL: server.url, model: 'fake-model', apiKey: 'k', contextWindow: 32_000 }))
    const path = join(dir, 's.jsonl')
    const session = await Session.open(new FileStore(path))
    const agent = new Agent({ session, provider })
    for (let t = 0; t < 3; t++) assert.equal((await agent.run(`hello ${t} ` + 'y'.repeat(4_000))).text, `reply ${t}`)
    const m = session.measure()
    assert.equal(m.anchored, false, JSON.stringify(m.anchor))
    assert.equal(m.totalTokens, m.heuristicTokens)
    assert.ok(CostLedger.of(session).usage().outputTokens >= 0, `outputTokens ${CostLedger.of(session).usage().outputTokens}`)
    const again = await Session.open(new FileStore(path))
    assert.equal(again.measure().totalTokens, m.totalTokens)
  })
}

test('recall: an answer that quotes a hostile argument (100,000 code points) stays capped', async () => {
  const { Agent: A, Session: S, MemoryStore, codePointLength } = await import('../dsh.ts')
  const { RECALL_MAX_CODE_POINTS } = await import('./spec.ts')
  const big = Array.from({ length: 5_000 }, (_, k) => `row ${k} ` + 'q'.repeat(30)).join('\n')
  const huge = 'x'.repeat(100_000)
  const calls = [{ pattern: huge }, { key: huge }, { tool: huge }, { tool: 'dump', arguments: huge }, { [huge]: 1 }]
  const replies = [{ toolCalls: [{ id: 'big', name: 'dump', arguments: {} }] }, ...calls.map((a, i) => ({ toolCalls: [{ id: `q${i}`, name: 'recall', arguments: a }] })), { text: 'ok' }]
  let i = 0
  const server = await startFakeProvider({ handler: () => replies[Math.min(i++, replies.length - 1)] })
  servers.push(server)
  const session = await S.open(new MemoryStore())
  const dump = { name: 'dump', description: '', parameters: {}, execute: () => big }
  const provider = tuned({ maxRetries: 0 }, () => openAICompatible({ baseURL: server.url, model: 'm', apiKey: 'k', contextWindow: 16_000 }))
  assert.equal((await new A({ session, provider, tools: [dump] }).run('go')).text, 'ok')
  const answers = session.events.filter((e) => e.type === 'tool/result' && (e.data as any).surfaceOp.op === 'append' && (e.data as any).message.toolCallId.startsWith('q'))
  assert.equal(answers.length, calls.length)
  for (const e of answers) {
    const text: string = (e.data as any).message.content[0].text
    assert.match(text, /^recall: /)
    assert.ok(codePointLength(text) <= RECALL_MAX_CODE_POINTS, `${(e.data as any).message.toolCallId}: ${codePointLength(text)} code points`)
  }
})

// Usage figures are read in one place (checkedUsage): a count that is not a number in [0, 1e9] never
// reaches the log, the anchor, the calibration or cost, whether a custom provider reports it or a log holds it.
const PRICES = { cacheHitInput: 0.1, cacheMissInput: 1, output: 2 }
for (const [name, usage] of [
  ['1e308 counts', { promptTokens: 1e308, completionTokens: 1e308 }],
  ['NaN counts', { promptTokens: NaN, completionTokens: 10 }],
  ['Infinity counts', { promptTokens: 10, completionTokens: Infinity }],
  ['an absurd cached count', { promptTokens: 100, completionTokens: 10, cachedTokens: 1e308 }],
] as const) {
  test(`a custom provider reporting ${name}: the cost stays finite and small, the log holds no absurd count`, async () => {
    const { MemoryStore } = await import('../dsh.ts')
    const warnings: string[] = []
    let i = 0
    const provider = {
      model: 'in-process', baseURL: 'memory://in-process', contextWindow: 32_000, maxTokens: 100, prices: PRICES,
      complete: async () => ({ message: { role: 'assistant' as const, content: [{ type: 'text' as const, text: `reply ${i}` }] }, finishReason: 'stop', usage: i++ === 0 ? usage as any : { promptTokens: 50, completionTokens: 5 } }),
    }
    const session = await Session.open(new MemoryStore())
    const agent = new Agent({ session, provider, onEvent: (e) => { if (e.type === 'warning') warnings.push(e.message) } })
    for (let t = 0; t < 2; t++) assert.equal((await agent.run(`hello ${t}`)).text, `reply ${t}`)
    const u = CostLedger.of(session).usage()
    assert.ok(Number.isFinite(u.costUSD) && u.costUSD! < 0.01, `costUSD ${u.costUSD}`)
    assert.ok(u.inputTokens < 1e6 && u.outputTokens < 1e6 && u.cachedInputTokens <= u.inputTokens, JSON.stringify(u))
    const logged = session.events.filter((e) => e.type === 'assistant/message').map((e) => (e.data as any).usage)
    for (const l of logged) for (const v of Object.values(l ?? {})) assert.ok(Number.isFinite(v) && (v as number) <= 1e9, JSON.stringify(logged))
    if (usage.cachedTokens === undefined) {
      assert.equal(logged[0], undefined, 'refused, not logged')
      assert.match(warnings.join('\n'), /usage ignored: .* is not token counts in \[0, 1000000000\]/)
    } else assert.deepEqual(logged[0], { promptTokens: 100, completionTokens: 10 }, 'the absurd cached count is dropped')
    assert.ok(Number.isFinite(session.measure().totalTokens))
  })
}

test('a log holding 1e308 usage (written by another writer) resumes with finite cost and no anchor', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'dsh-usage-')); dirs.push(dir)
  const path = join(dir, 's.jsonl')
  const s = await Session.open(new FileStore(path))
  s.append('request/header', { model: 'm', baseURL: 'http://x', prices: PRICES })
  s.append('user/message', { message: { role: 'user', content: 'hi' }, surfaceOp: { op: 'append' } })
  s.append('assistant/message', { message: { role: 'assistant', content: [{ type: 'text', text: 'ok' }] }, usage: { promptTokens: 1e308, completionTokens: 1e308 }, surfaceOp: { op: 'append' } })
  await s.sync(); await s.store.close?.()
  const again = await Session.open(new FileStore(path))
  const u = CostLedger.of(again).usage()
  assert.ok(Number.isFinite(u.costUSD) && u.costUSD! < 0.01, `costUSD ${u.costUSD}`)
  assert.equal(again.measure().anchored, false)
  await again.store.close?.()
})
