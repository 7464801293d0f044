// One measurement of the scale benchmark (bench/scale.bench.ts) in its own process, so that its peak
// RSS (`process.resourceUsage().maxRSS`) is its own. Prints one JSON line on stdout.
//
//   node --expose-gc --import tsx bench/scale-child.ts resume FILE     Session.load + resume of a log
//   node --expose-gc --import tsx bench/scale-child.ts baseline FILE   read + JSON.parse every line once
//   node --expose-gc --import tsx bench/scale-child.ts heap STEPS DIR  heap after GC every 1,000 steps (FileStore)
//   node --expose-gc --import tsx bench/scale-child.ts adapter TOKENS [BUNDLE]  adapter CPU per streamed token vs the floor
// (Durable steps, fsync on, are benchmark 9: bench/durable.bench.ts.)
import { statSync } from 'node:fs'
import { join } from 'node:path'
import * as dsh from '../dsh.ts'
import { FileStore, Session, openAICompatible } from '../dsh.ts'
import { readAndParse } from './logs.ts'
import { stepRunner, type StepModule } from './steps.ts'

const [mode, arg, dir] = process.argv.slice(2)
const out = (value: unknown): void => { process.stdout.write(JSON.stringify(value) + '\n') }
const gc = (): void => { (globalThis as { gc?: () => void }).gc?.() }
const rssMB = (): number => process.resourceUsage().maxRSS / 1024

if (mode === 'resume') {
  gc()
  const startMB = process.memoryUsage().rss / 1024 / 1024 // the runtime and the code, before the log
  const t0 = performance.now(), c0 = process.cpuUsage()
  const session = await Session.open(new FileStore(arg)) // loads, resumes (session/resume) and fsyncs
  const ms = performance.now() - t0, c = process.cpuUsage(c0)
  out({ ms, cpuMs: (c.user + c.system) / 1000, rssMB: rssMB(), startMB, heapLimitMB: (await import('node:v8')).getHeapStatistics().heap_size_limit / 1024 / 1024, events: session.seq, surfaceNodes: session.surface().length, surfaceBytes: JSON.stringify(session.messages()).length })
} else if (mode === 'baseline') {
  gc()
  const startMB = process.memoryUsage().rss / 1024 / 1024
  const t0 = performance.now(), c0 = process.cpuUsage()
  const lines = readAndParse(arg)
  const c = process.cpuUsage(c0)
  out({ ms: performance.now() - t0, cpuMs: (c.user + c.system) / 1000, rssMB: rssMB(), startMB, lines })
} else if (mode === 'heap') {
  // fsync off: the disk does not change the heap.
  const total = Number(arg)
  const heapMB: number[] = []
  const file = join(dir, 'heap.jsonl')
  const runner = await stepRunner(dsh as unknown as StepModule, file, { fsync: false })
  const t0 = performance.now()
  for (let done = 0; done < total;) {
    const n = await runner.run(1)
    for (let s = done + 1; s <= done + n; s++) if (s % 1000 === 0) { gc(); heapMB.push(process.memoryUsage().heapUsed / 1024 / 1024) }
    done += n
  }
  await runner.close()
  out({ heapMB, ms: performance.now() - t0, logBytes: statSync(file).size })
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
