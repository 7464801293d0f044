// How test/logs/e9ce0b5.jsonl was written: dsh at commit e9ce0b5 (the start of the core redesign)
// runs a scripted session with tool calls, prunes, clears, a pin, an overflow recovered by a summary
// checkpoint, calibration samples (ladder/state), and a tool call left open by a "crash".
//   git show e9ce0b5:dsh.ts > .tmp/e9/dsh.ts
//   DSH_AT=.tmp/e9/dsh.ts node --import tsx test/logs/record-e9ce0b5.ts test/logs/e9ce0b5.jsonl
// test/logs/e9ce0b5.expected.json holds what that commit derives when it resumes the log
// (RECORD_E9CE0B5=.tmp/e9/dsh.ts node --import tsx --test test/log-format.test.ts writes it).
import { writeFileSync } from 'node:fs'
import { resolve } from 'node:path'
type ChatResponse = any
type Tool = any
const { Agent, Session, MemoryStore, ProviderError } = await import(resolve(process.env.DSH_AT ?? 'dsh.ts'))
const say = (text: string, usage?: ChatResponse['usage']): ChatResponse => ({ message: { role: 'assistant', content: [{ type: 'text', text }] }, finishReason: 'stop', usage })
const call = (id: string, name: string, args: object, usage?: ChatResponse['usage']): ChatResponse => ({ message: { role: 'assistant', content: [{ type: 'reasoning', text: 'thinking about ' + id }, { type: 'tool-call', id, name, arguments: JSON.stringify(args) }] }, finishReason: 'tool_calls', usage })
const line = (i: number) => `line ${i}: ` + 'the quick brown fox jumps over the lazy dog 北京 😊 '.repeat(2)
const tools: Tool[] = [
  { name: 'read_file', description: 'read a file', parameters: { type: 'object', properties: { path: { type: 'string' } } }, execute: (a: any) => Array.from({ length: 78 }, (_, i) => line(i)).join('\n') + `\n(${a.path})` },
  { name: 'shell', description: 'run a command', parameters: { type: 'object', properties: { command: { type: 'string' } } }, execute: (a: any) => `$ ${a.command}\nexit code: 1\nError: cannot find module 'x'\n` + 'output '.repeat(300) },
]
const script: unknown[] = [
  call('call_1', 'read_file', { path: 'src/a.ts' }, { promptTokens: 1400, completionTokens: 20, cachedTokens: 0 }),
  call('call_2', 'shell', { command: 'npm test' }, { promptTokens: 5200, completionTokens: 30, cachedTokens: 1300 }),
  call('call_3', 'read_file', { path: 'src/b.ts' }, { promptTokens: 6400, completionTokens: 25, cachedTokens: 5000 }),
  call('call_3b', 'shell', { command: 'ls src' }, { promptTokens: 7400, completionTokens: 25, cachedTokens: 6000 }),
  call('call_3c', 'read_file', { path: 'src/d.ts' }, { promptTokens: 8000, completionTokens: 25, cachedTokens: 6000 }),
  call('call_3d', 'shell', { command: 'git status' }, { promptTokens: 8600, completionTokens: 25, cachedTokens: 6000 }),
  say('Both files read; the test fails on a missing module.', { promptTokens: 9800, completionTokens: 40, cachedTokens: 6000 }),
  new ProviderError('CONTEXT_WINDOW_EXCEEDED', "This model's maximum context length is 12000 tokens. However, your messages resulted in 12500 tokens.", { status: 400, body: '{"error":{"message":"This model\'s maximum context length is 12000 tokens. However, your messages resulted in 12500 tokens."}}' }),
  call('call_4', 'read_file', { path: 'src/c.ts' }, { promptTokens: 4000, completionTokens: 22 }),
  say('Done: c.ts read too.', { promptTokens: 7000, completionTokens: 12, cachedTokens: 3000 }),
  call('call_5', 'shell', { command: 'npm run build' }),
]
let conv = 0
const provider = {
  model: 'scripted', baseURL: 'memory://scripted', contextWindow: 12000, maxTokens: 1000, prices: { cacheHitInput: 0.01, cacheMissInput: 0.1, output: 0.5 },
  async complete(req: any): Promise<ChatResponse> {
    if (req.headers?.['x-dsh-purpose'] === 'compaction') return say('1. Request — read the files and run the tests.\n2. Key facts — the test fails: cannot find module x.\n7. Next step — fix the import.', { promptTokens: 3000, completionTokens: 60 })
    const r = script[Math.min(conv++, script.length - 1)]
    if (r instanceof ProviderError) throw r
    return structuredClone(r)
  },
}
let t = 1_795_988_964_000
const store = new MemoryStore()
const session = await Session.open(store, { id: 'e9ce0b5-example', now: () => (t += 1000) })
const agent = new Agent({ session, provider, tools: [...tools, { name: 'deploy', description: 'deploy', parameters: { type: 'object', properties: {} }, execute: () => { throw new Error('crash') } }], system: 'You are a careful coding agent.' })
await agent.run('Read src/a.ts and src/b.ts, then run the tests.')
agent.pin(session.surface()[0].seq)
try { await agent.run('Now read src/c.ts.') } catch (e) { console.log('turn 2 failed:', (e as Error).message.slice(0, 80)) }
// A crash while call_5 runs: its tool/call is logged, its result never is.
const events = store.events.slice()
const lastAssistant = events.findLastIndex((e: any) => e.type === 'assistant/message')
// Turn 3: the assistant asks for call_5, the tool starts (tool/call logged), the process dies.
session.append('turn/start', { turn: 3 })
session.append('user/message', { message: { role: 'user', content: 'Build it.' }, surfaceOp: { op: 'append' } })
session.append('step/start', { turn: 3, step: 1 })
session.append('assistant/message', { message: { role: 'assistant', content: [{ type: 'tool-call', id: 'call_5', name: 'shell', arguments: '{"command":"npm run build"}' }] }, finishReason: 'tool_calls', surfaceOp: { op: 'append' } })
session.append('tool/call', { callId: 'call_5', name: 'shell' })
await session.flush()
writeFileSync(process.argv[2], store.events.map((e: unknown) => JSON.stringify(e)).join('\n') + '\n')
const types: Record<string, number> = {}
for (const e of store.events as any[]) types[e.type] = (types[e.type] ?? 0) + 1
console.log(store.events.length, 'events', JSON.stringify(types), lastAssistant)
