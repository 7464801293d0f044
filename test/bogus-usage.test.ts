// A broken or hostile server's usage figures (docs/design.md §2): bogus counts never become the anchor,
// so one bad reply cannot price every later request as an overflow, live or after a resume.
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
    assert.ok(session.usage().outputTokens >= 0, `outputTokens ${session.usage().outputTokens}`)
    await session.close?.()
    const again = await Session.open(new FileStore(path))
    assert.equal(again.measure().totalTokens, m.totalTokens)
  })
}
