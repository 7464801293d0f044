// The meter's usage anchor (docs/design.md §2) against a broken or hostile server: bogus counts never become
// the anchor, so one bad reply cannot price every later request as an overflow, live or after a resume.
import { test, after } from 'node:test'
import assert from 'node:assert/strict'
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { Agent, Session, FileStore, openAICompatible } from '../dsh.ts'
import { startFakeProvider } from './fake-provider.ts'

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
    const provider = openAICompatible({ baseURL: server.url, model: 'fake-model', apiKey: 'k', contextWindow: 32_000, maxRetries: 0 })
    const path = join(dir, 's.jsonl')
    const session = await Session.open(new FileStore(path))
    const agent = new Agent({ session, provider })
    for (let t = 0; t < 3; t++) assert.equal((await agent.run(`hello ${t} ` + 'y'.repeat(4_000))).text, `reply ${t}`)
    const m = session.measure()
    assert.equal(m.anchored, false, JSON.stringify(m.anchor))
    assert.equal(m.totalTokens, m.heuristicTokens)
    assert.ok(session.cost.usage().outputTokens >= 0, `outputTokens ${session.cost.usage().outputTokens}`)
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
  const provider = openAICompatible({ baseURL: server.url, model: 'm', apiKey: 'k', contextWindow: 16_000, maxRetries: 0 })
  assert.equal((await new A({ session, provider, tools: [dump] }).run('go')).text, 'ok')
  const answers = session.events.filter((e) => e.type === 'tool/result' && (e.data as any).surfaceOp.op === 'append' && (e.data as any).message.toolCallId.startsWith('q'))
  assert.equal(answers.length, calls.length)
  for (const e of answers) {
    const text: string = (e.data as any).message.content[0].text
    assert.match(text, /^recall: /)
    assert.ok(codePointLength(text) <= RECALL_MAX_CODE_POINTS, `${(e.data as any).message.toolCallId}: ${codePointLength(text)} code points`)
  }
})
