// Benchmark 3 (issue 7): dsh's `parseSSE` against the `eventsource-parser` package on the same 50 MiB
// stream of realistic chat-completion chunks, split into network chunks of seeded random sizes.
// Target: ≥ 1.0× its throughput, with byte-identical events.
import { createHash } from 'node:crypto'
import { readFileSync, readdirSync } from 'node:fs'
import { join } from 'node:path'
import { createParser } from 'eventsource-parser'
import { EventSourceParserStream } from 'eventsource-parser/stream'
import * as dshModule from '../dsh.ts'
import { FIXTURES_DIR, fmtRatio, fmtStats, gc, nowMs, rng, stats, table, type Section, type Stats } from './lib.ts'

/** The documented API (docs/design.md §9): an async iterable of `{event, data, id?}`; `event` defaults to "message". */
interface SSEEvent { event: string; data: string; id?: string }
type ParseSSE = (source: AsyncIterable<Uint8Array | string> | ReadableStream<Uint8Array>) => AsyncIterable<SSEEvent>
type CreateSSEParser = (options: { onEvent?: (e: SSEEvent) => void }) => { feed(text: string): void }

const STREAM_BYTES = 50 * 1024 * 1024
const RUNS = 11
/** Network chunk sizes: log-uniform between these (bytes), seeded. */
const CHUNK_MIN = 1, CHUNK_MAX = 16 * 1024

/**
 * The recorded DeepSeek (and OpenAI-compatible) chat-completion chunks in shared/fixtures/wire:
 * one `data: {...}` line each, in recorded order, from each response (text, reasoning, tool calls,
 * parallel tool calls, usage; English, Chinese and emoji content).
 */
function recordedResponses(): string[][] {
  const responses: string[][] = []
  const vercel = join(FIXTURES_DIR, 'wire', 'vercel-ai', 'head')
  for (const f of readdirSync(vercel).filter((f) => f.endsWith('.chunks.txt')).sort()) {
    responses.push(readFileSync(join(vercel, f), 'utf8').split('\n').filter((l) => l.startsWith('{')).map((l) => `data: ${l}`))
  }
  const ai4j = join(FIXTURES_DIR, 'wire', 'ai4j-APIResponse')
  for (const f of readdirSync(ai4j).filter((f) => f.endsWith('.sse')).sort()) {
    responses.push(readFileSync(join(ai4j, f), 'utf8').split('\n').filter((l) => l.startsWith('data: {')))
  }
  return responses.filter((r) => r.length > 0)
}

/**
 * 50 MiB of SSE: recorded responses one after another (each block `data: …\n\n`), with a
 * `: keep-alive` comment (as DeepSeek sends while a request waits) before ~2% of the blocks, and
 * `data: [DONE]` at the end. Then cut into chunks of seeded random sizes (views, no copies).
 */
/** CJK and emoji code points that stand in for each character of the recorded text (CJK-heavy stream). */
const CJK_POOL = [...'北京上海广州深圳天气今天很好我们一起去公园散步吧数据解析器性能测试中文字符模型上下文窗口令牌😊🎉🚀🔥✨📦']

/** The recorded responses with every character of `content` / `reasoning_content` replaced by one from CJK_POOL. */
function cjkResponses(): string[][] {
  let k = 0
  const swap = (text: string) => [...text].map((c) => (c === '\n' || c === ' ' ? c : CJK_POOL[k++ % CJK_POOL.length])).join('')
  return recordedResponses().map((r) => r.map((line) => {
    const obj = JSON.parse(line.slice(6))
    for (const choice of obj.choices ?? []) {
      const d = choice.delta ?? {}
      if (typeof d.content === 'string') d.content = swap(d.content)
      if (typeof d.reasoning_content === 'string') d.reasoning_content = swap(d.reasoning_content)
    }
    return `data: ${JSON.stringify(obj)}`
  }))
}

function makeStream(kind: 'recorded' | 'cjk'): { bytes: Uint8Array; chunks: Uint8Array[]; blocks: number } {
  const next = rng(3)
  const enc = new TextEncoder()
  const responses = (kind === 'cjk' ? cjkResponses() : recordedResponses()).map((r) => r.map((l) => enc.encode(`${l}\n\n`)))
  const keepAlive = enc.encode(': keep-alive\n\n')
  const done = enc.encode('data: [DONE]\n\n')
  const bytes = new Uint8Array(STREAM_BYTES)
  let at = 0, blocks = 0
  outer: for (let r = 0; ; r++) {
    for (const block of responses[r % responses.length]) {
      if (next() < 0.02) {
        if (at + keepAlive.length > STREAM_BYTES - done.length) break outer
        bytes.set(keepAlive, at); at += keepAlive.length
      }
      if (at + block.length > STREAM_BYTES - done.length) break outer
      bytes.set(block, at); at += block.length; blocks++
    }
  }
  bytes.set(done, at); at += done.length; blocks++
  const stream = bytes.subarray(0, at)
  const chunks: Uint8Array[] = []
  const span = Math.log(CHUNK_MAX / CHUNK_MIN)
  for (let i = 0; i < stream.length;) {
    const size = Math.round(CHUNK_MIN * Math.exp(next() * span))
    chunks.push(stream.subarray(i, Math.min(stream.length, i + size)))
    i += size
  }
  return { bytes: stream, chunks, blocks }
}

/** The network: the chunks as an async iterable, as `for await (const c of response.body)` sees them. */
async function* network(chunks: readonly Uint8Array[]): AsyncGenerator<Uint8Array> {
  for (const c of chunks) yield c
}

type Consumer = (e: SSEEvent) => void

/** dsh: `for await (const e of parseSSE(body))`. */
async function runDsh(parseSSE: ParseSSE, chunks: readonly Uint8Array[], onEvent: Consumer): Promise<void> {
  for await (const e of parseSSE(network(chunks))) onEvent(e)
}

/** dsh's push parser (same harness as the baseline): streaming TextDecoder + `feed`. */
async function runDshPush(createSSEParser: CreateSSEParser, chunks: readonly Uint8Array[], onEvent: Consumer): Promise<void> {
  const parser = createSSEParser({ onEvent })
  const decoder = new TextDecoder('utf-8', { ignoreBOM: true })
  for await (const c of network(chunks)) parser.feed(decoder.decode(c, { stream: true }))
  parser.feed(decoder.decode())
}

/** The baseline, as its README shows it: a streaming TextDecoder feeding `createParser({onEvent})`. */
async function runEventsourceParser(chunks: readonly Uint8Array[], onEvent: Consumer): Promise<void> {
  const parser = createParser({ onEvent: (e) => onEvent({ event: e.event ?? 'message', data: e.data, id: e.id }) })
  const decoder = new TextDecoder('utf-8', { ignoreBOM: true })
  for await (const c of network(chunks)) parser.feed(decoder.decode(c, { stream: true }))
  parser.feed(decoder.decode())
}

/**
 * The baseline's async-iterable form (the like-for-like API of `parseSSE`): the body piped through
 * `TextDecoderStream` and `EventSourceParserStream`, consumed with `for await`.
 */
async function runEventsourceParserStream(chunks: readonly Uint8Array[], onEvent: Consumer): Promise<void> {
  const body = new ReadableStream<Uint8Array>({
    async start(controller) { for await (const c of network(chunks)) controller.enqueue(c); controller.close() },
  })
  const events = body.pipeThrough(new TextDecoderStream() as unknown as TransformStream<Uint8Array, string>).pipeThrough(new EventSourceParserStream())
  for await (const e of events as unknown as AsyncIterable<{ event?: string; data: string; id?: string }>) onEvent({ event: e.event ?? 'message', data: e.data, id: e.id })
}

/** SHA-256 over every event's (event, id, data), and the count: equal digests = byte-identical events. */
async function digest(run: (onEvent: Consumer) => Promise<void>): Promise<{ events: number; sha256: string }> {
  const hash = createHash('sha256')
  let events = 0
  await run((e) => { events++; hash.update(`${e.event}\u0000${e.id ?? '\u0001'}\u0000${e.data}\u0000\n`) })
  return { events, sha256: hash.digest('hex') }
}

/** dsh's callback form, as the adapter uses it: `pumpSSE(body, onEvent)`. */
async function runDshPump(pumpSSE: PumpSSE, chunks: readonly Uint8Array[], onEvent: Consumer): Promise<void> {
  await pumpSSE(network(chunks), onEvent)
}

type PumpSSE = (source: AsyncIterable<Uint8Array | string>, onEvent: (e: SSEEvent) => void) => Promise<void>

interface StreamResult { table: string; targets: Section['targets']; blocks: number; mib: number; chunks: number }

async function measureStream(kind: 'recorded' | 'cjk', mod: { parseSSE: ParseSSE; createSSEParser?: CreateSSEParser; pumpSSE?: PumpSSE }): Promise<StreamResult> {
  const parseSSE = mod.parseSSE
  const { bytes, chunks, blocks } = makeStream(kind)
  const impls: { name: string; run: (onEvent: Consumer) => Promise<void> }[] = [
    { name: 'dsh `parseSSE` (async iterable)', run: (f) => runDsh(parseSSE, chunks, f) },
    { name: 'eventsource-parser `createParser` + TextDecoder', run: (f) => runEventsourceParser(chunks, f) },
  ]
  if (typeof mod.pumpSSE === 'function') {
    const pump = mod.pumpSSE
    impls.push({ name: 'dsh `pumpSSE` (callback form, used by the adapter)', run: (f) => runDshPump(pump, chunks, f) })
  }
  if (typeof mod.createSSEParser === 'function') {
    const create = mod.createSSEParser
    impls.push({ name: 'dsh `createSSEParser` + TextDecoder (same harness as the baseline)', run: (f) => runDshPush(create, chunks, f) })
  }
  impls.push({ name: 'eventsource-parser `EventSourceParserStream` (for await; the like-for-like API of `parseSSE`)', run: (f) => runEventsourceParserStream(chunks, f) })

  // Correctness first: the same events, byte for byte.
  const digests: { events: number; sha256: string }[] = []
  for (const impl of impls) digests.push(await digest(impl.run))
  const identical = digests.every((d) => d.sha256 === digests[1].sha256 && d.events === digests[1].events)

  // Then time: rounds of one run of each, in rotating order, so that drift and other load hit all
  // alike; the ratio to the baseline is taken within each round (paired), then its median.
  const times: number[][] = impls.map(() => [])
  let sink = 0
  for (let r = 0; r < RUNS + 1; r++) {
    for (let i = 0; i < impls.length; i++) {
      const k = (i + r) % impls.length
      gc()
      const t0 = nowMs()
      await impls[k].run((e) => { sink += e.data.length })
      const ms = nowMs() - t0
      if (r > 0) times[k].push(ms) // the first round warms up
    }
  }
  if (sink === 0) throw new Error('no events')
  const s: Stats[] = times.map((t) => stats(t))
  const paired: Stats[] = times.map((t) => stats(t.map((ms, r) => times[1][r] / ms)))
  const mbps = (ms: number) => bytes.length / 1024 / 1024 / (ms / 1000)
  const fmtMbps = (x: Stats) => `${mbps(x.median).toFixed(0)} MiB/s (${mbps(x.max).toFixed(0)}–${mbps(x.min).toFixed(0)})`
  const label = kind === 'cjk' ? 'CJK/emoji-heavy stream' : 'recorded (ASCII-heavy) stream'
  const pumpAt = impls.findIndex((i) => i.name.includes('pumpSSE'))
  const targets: Section['targets'] = [
    { name: `throughput of \`parseSSE\`, ${label}`, target: '≥ 1.0× eventsource-parser (`createParser`)', measured: `${fmtRatio(paired[0].median)} paired median (${fmtMbps(s[0])} vs ${fmtMbps(s[1])})`, met: paired[0].median >= 1 },
  ]
  if (pumpAt >= 0) targets.push({ name: `throughput of \`pumpSSE\` (the adapter's form), ${label}`, target: '≥ 1.0× eventsource-parser (`createParser`)', measured: `${fmtRatio(paired[pumpAt].median)} paired median (${fmtMbps(s[pumpAt])})`, met: paired[pumpAt].median >= 1 })
  targets.push({ name: `same events, ${label}`, target: 'byte-identical to eventsource-parser', measured: identical ? `identical (${digests[0].events.toLocaleString('en-US')} events)` : `DIFFERENT (${digests.map((d) => `${d.events} events ${d.sha256.slice(0, 8)}`).join(' vs ')})`, met: identical })
  return {
    blocks, mib: bytes.length / 1024 / 1024, chunks: chunks.length, targets,
    table: `**${label}** (${(bytes.length / 1024 / 1024).toFixed(1)} MiB, ${blocks.toLocaleString('en-US')} blocks, ${chunks.length.toLocaleString('en-US')} network chunks)\n\n` + table(
      ['parser', 'time for the stream', 'throughput', 'vs eventsource-parser', 'events', 'SHA-256 of events'],
      impls.map((impl, i) => [impl.name, fmtStats(s[i]), fmtMbps(s[i]), `${fmtRatio(paired[i].median)} (${fmtRatio(paired[i].min)}–${fmtRatio(paired[i].max)})`, digests[i].events.toLocaleString('en-US'), `\`${digests[i].sha256.slice(0, 16)}…\``]),
    ),
  }
}

export default async function sse(): Promise<Section> {
  // The adapter's callback form is module-private: reached through the undocumented `internals`.
  const m = dshModule as unknown as { parseSSE?: ParseSSE; createSSEParser?: CreateSSEParser; pumpSSE?: PumpSSE; internals?: { pumpSSE?: PumpSSE } }
  const mod = { ...m, pumpSSE: m.pumpSSE ?? m.internals?.pumpSSE }
  const base = { id: 'sse', title: 'SSE parser', method: '', tables: [] as string[] }
  if (typeof mod.parseSSE !== 'function') {
    return {
      ...base, status: 'not-run', reason: '`parseSSE` (dsh.ts section 6, provider) has not landed on this branch yet; bench/sse.bench.ts is written against its documented API (docs/design.md §9) and runs once it does',
      targets: [{ name: 'throughput', target: '≥ 1.0× eventsource-parser, byte-identical events', measured: 'not yet run' }],
    }
  }
  const results = [await measureStream('recorded', mod as never), await measureStream('cjk', mod as never)]
  return {
    ...base, status: 'ran',
    method: [
      `Two streams of ${(STREAM_BYTES / 1024 / 1024).toFixed(0)} MiB each. **Recorded**: the recorded chat-completion chunks of`,
      'shared/fixtures/wire (DeepSeek text, reasoning, tool-call and parallel-tool-call responses, with English, Chinese and emoji',
      'content) repeated in order. **CJK/emoji-heavy**: the same chunks with every character of `content` and `reasoning_content`',
      'replaced by a CJK character or an emoji (so most of the bytes are 3- and 4-byte UTF-8). Both: `: keep-alive` comments before',
      `~2% of the blocks, \`data: [DONE]\` last, split into network chunks of ${CHUNK_MIN}–${CHUNK_MAX.toLocaleString('en-US')} bytes (log-uniform, seeded; UTF-8`,
      'characters are split too), fed as an async iterable of `Uint8Array` to each parser; each event is handed to a consumer that',
      'adds up `data.length`.',
      `Time: ${RUNS} rounds after one warm-up round; a round runs each parser once, in rotating order. Times: median (min–max).`,
      '"vs eventsource-parser" = its time ÷ this parser\'s time in the same round (paired, > 1 = faster), median (min–max) over',
      'the rounds. Identity: SHA-256 over every',
      'event\'s (event, id, data) in order; eventsource-parser\'s absent `event` counts as "message" (the WHATWG default dsh applies).',
    ].join('\n'),
    tables: results.map((r) => r.table),
    targets: results.flatMap((r) => r.targets),
  }
}
