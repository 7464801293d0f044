// One measurement of the scale benchmark (bench/scale.bench.ts) in its own process, so that its peak
// RSS (`process.resourceUsage().maxRSS`) is its own. Prints one JSON line on stdout.
//
//   node --expose-gc --import tsx bench/scale-child.ts resume FILE     Session.load + resume of a log
//   node --expose-gc --import tsx bench/scale-child.ts baseline FILE   read + JSON.parse every line once
//   node --expose-gc --import tsx bench/scale-child.ts heap STEPS DIR  heap after GC every 1,000 steps (FileStore)
//   node --expose-gc --import tsx bench/scale-child.ts durable STEPS DIR  steps with fsync vs raw write + fsync
//   node --expose-gc --import tsx bench/scale-child.ts adapter TOKENS [BUNDLE]  adapter CPU per streamed token vs the floor
import { openSync, readSync, closeSync, writeSync, fsyncSync, statSync } from 'node:fs'
import { join } from 'node:path'
import { Agent, FileStore, Session, openAICompatible, type ChatRequest, type ChatResponse, type Provider } from '../dsh.ts'

const [mode, arg, dir] = process.argv.slice(2)
const out = (value: unknown): void => { process.stdout.write(JSON.stringify(value) + '\n') }
const gc = (): void => { (globalThis as { gc?: () => void }).gc?.() }
const rssMB = (): number => process.resourceUsage().maxRSS / 1024

/** An in-process provider: each step calls `read_file` `callsPerTurn` times, then answers; summaries are short. */
class StepProvider implements Provider {
  readonly model = 'bench'
  readonly baseURL = 'memory://bench'
  readonly contextWindow = 32_000
  readonly maxTokens = 1_000
  private n = 0
  constructor(private readonly callsPerTurn: number) {}
  async complete(req: ChatRequest): Promise<ChatResponse> {
    if (req.headers?.['x-dsh-purpose'] === 'compaction') return { message: { role: 'assistant', content: [{ type: 'text', text: 'Checkpoint: read files; nothing pending.' }] }, finishReason: 'stop' }
    const i = this.n++
    if (i % (this.callsPerTurn + 1) === this.callsPerTurn) return { message: { role: 'assistant', content: [{ type: 'text', text: 'done' }] }, finishReason: 'stop' }
    return { message: { role: 'assistant', content: [{ type: 'tool-call', id: `c${i}`, name: 'read_file', arguments: JSON.stringify({ path: `src/f${i % 97}.ts` }) }] }, finishReason: 'tool_calls' }
  }
}
const readTool = { name: 'read_file', description: 'reads a file', parameters: { type: 'object' }, execute: (a: { path: string }) => `// ${a.path}\n` + 'export const x = 1 // some code here\n'.repeat(60) }

/** A FileStore without fsync: the heap figure does not depend on the disk. Counts syncs. */
class NoSyncStore extends FileStore { syncs = 0; async sync(): Promise<void> { this.syncs++ } }
class CountingStore extends FileStore { syncs = 0; async sync(): Promise<void> { this.syncs++; await super.sync() } }

async function steps(store: FileStore, total: number, onThousand?: (step: number) => void): Promise<number> {
  const session = await Session.open(store)
  const agent = new Agent({ session, provider: new StepProvider(9), tools: [readTool] })
  let done = 0
  while (done < total) {
    const r = await agent.run(`task ${done}`)
    for (let s = done + 1; s <= done + r.steps; s++) if (s % 1000 === 0) onThousand?.(s)
    done += r.steps
  }
  await store.close()
  return done
}

if (mode === 'resume') {
  gc()
  const startMB = process.memoryUsage().rss / 1024 / 1024 // the runtime and the code, before the log
  const t0 = performance.now()
  const session = await Session.open(new FileStore(arg)) // loads, resumes (session/resume) and fsyncs
  const ms = performance.now() - t0
  out({ ms, rssMB: rssMB(), startMB, heapLimitMB: (await import('node:v8')).getHeapStatistics().heap_size_limit / 1024 / 1024, events: session.seq, surfaceNodes: session.surface().length, surfaceBytes: JSON.stringify(session.messages()).length })
} else if (mode === 'baseline') {
  gc()
  const startMB = process.memoryUsage().rss / 1024 / 1024
  const t0 = performance.now()
  const fd = openSync(arg, 'r')
  const chunk = Buffer.allocUnsafe(4 * 1024 * 1024)
  let carry: Buffer | undefined
  let lines = 0
  for (;;) {
    const n = readSync(fd, chunk, 0, chunk.length, null)
    if (n === 0) break
    let buf = chunk.subarray(0, n)
    if (carry) { buf = Buffer.concat([carry, buf]); carry = undefined }
    let from = 0
    for (let nl = buf.indexOf(10); nl >= 0; nl = buf.indexOf(10, from)) { JSON.parse(buf.toString('utf8', from, nl)); lines++; from = nl + 1 }
    if (from < buf.length) carry = Buffer.from(buf.subarray(from))
  }
  closeSync(fd)
  out({ ms: performance.now() - t0, rssMB: rssMB(), startMB, lines })
} else if (mode === 'heap') {
  const total = Number(arg)
  const heapMB: number[] = []
  const store = new NoSyncStore(join(dir, 'heap.jsonl'))
  const t0 = performance.now()
  await steps(store, total, () => { gc(); heapMB.push(process.memoryUsage().heapUsed / 1024 / 1024) })
  out({ heapMB, ms: performance.now() - t0, logBytes: statSync(join(dir, 'heap.jsonl')).size })
} else if (mode === 'durable') {
  const total = Number(arg)
  const store = new CountingStore(join(dir, 'durable.jsonl'))
  const t0 = performance.now()
  const done = await steps(store, total)
  const dshMs = performance.now() - t0
  const bytesPerStep = statSync(join(dir, 'durable.jsonl')).size / done
  // The floor: the same bytes per step appended with one write and one fsync.
  const fd = openSync(join(dir, 'raw.jsonl'), 'a')
  const line = Buffer.from('x'.repeat(Math.max(1, Math.round(bytesPerStep) - 1)) + '\n')
  const t1 = performance.now()
  for (let i = 0; i < done; i++) { writeSync(fd, line); fsyncSync(fd) }
  const rawMs = performance.now() - t1
  closeSync(fd)
  out({ steps: done, syncs: store.syncs, dshMs, rawMs, bytesPerStep })
} else if (mode === 'adapter') {
  const tokens = Number(arg)
  const enc = new TextEncoder()
  const words = ['the', ' parser', ' reads', ' 北京', ' 😊', ' code', '\n', ' x', ' =', ' 42']
  let sse = ''
  for (let i = 0; i < tokens; i++) sse += `data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"deepseek-flash","choices":[{"index":0,"delta":{"content":${JSON.stringify(words[i % words.length])}},"finish_reason":null}]}\n\n`
  sse += 'data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"deepseek-flash","choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"usage":{"prompt_tokens":10,"completion_tokens":' + tokens + ',"total_tokens":' + (tokens + 10) + '}}\n\ndata: [DONE]\n\n'
  const bytes = enc.encode(sse)
  const chunks: Uint8Array[] = []
  for (let i = 0; i < bytes.length; i += 1024) chunks.push(bytes.subarray(i, i + 1024))
  const body = () => new ReadableStream<Uint8Array>({ start(c) { for (const ch of chunks) c.enqueue(ch); c.close() } })
  // The adapter as users run it: the esbuild bundle the runner passes in (tsx's per-file transform is slower).
  const { openAICompatible: make } = (await import(dir ?? '../dsh.ts')) as { openAICompatible: typeof openAICompatible }
  const provider = make({ baseURL: 'http://127.0.0.1:9', model: 'deepseek-flash', apiKey: 'sk-bench', contextWindow: 1_000_000,
    fetch: async () => new Response(body(), { status: 200, headers: { 'content-type': 'text/event-stream' } }) })
  const cpu = (fn: () => Promise<void>) => async () => { gc(); const c0 = process.cpuUsage(); await fn(); const c = process.cpuUsage(c0); return (c.user + c.system) / 1000 }
  const adapter = cpu(async () => { const r = await provider.complete({ messages: [{ role: 'user', content: 'hi' }] }); if (r.usage?.completionTokens !== tokens) throw new Error('bad usage') })
  const floor = cpu(async () => {
    const decoder = new TextDecoder()
    let rest = ''
    for await (const ch of body() as unknown as AsyncIterable<Uint8Array>) {
      const text = rest + decoder.decode(ch, { stream: true })
      const lines = text.split('\n')
      rest = lines.pop()!
      for (const l of lines) if (l.startsWith('data: {')) JSON.parse(l.slice(6))
    }
  })
  const a: number[] = [], f: number[] = []
  for (let r = 0; r < 9; r++) { if (r % 2) { a.push(await adapter()); f.push(await floor()) } else { f.push(await floor()); a.push(await adapter()) } }
  out({ tokens, adapterMs: a.slice(1), floorMs: f.slice(1) })
} else {
  console.error('usage: see the header of bench/scale-child.ts')
  process.exit(2)
}
