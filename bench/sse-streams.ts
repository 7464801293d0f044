// The SSE inputs and harnesses shared by bench/sse.bench.ts and bench/compare.ts: streams of the
// recorded chat-completion chunks (ASCII-heavy) and of the same chunks made CJK/emoji-heavy, cut
// into network chunks of seeded random sizes; each parser run as its README (or docs/design.md §9)
// shows it; a digest of the events to check that every parser saw the same ones.
import { createHash } from 'node:crypto'
import { readFileSync, readdirSync } from 'node:fs'
import { join } from 'node:path'
import { createParser } from 'eventsource-parser'
import { EventSourceParserStream } from 'eventsource-parser/stream'
import { FIXTURES_DIR, rng } from './lib.ts'

/** The documented API (docs/design.md §9): an async iterable of `{event, data, id?}`; `event` defaults to "message". */
export interface SSEEvent { event: string; data: string; id?: string }
export type ParseSSE = (source: AsyncIterable<Uint8Array | string> | ReadableStream<Uint8Array>) => AsyncIterable<SSEEvent>
export type CreateSSEParser = (options: { onEvent?: (e: SSEEvent) => void }) => { feed(text: string): void }

/** Network chunk sizes: log-uniform between these (bytes), seeded. */
export const CHUNK_MIN = 1, CHUNK_MAX = 16 * 1024

/**
 * The recorded DeepSeek (and OpenAI-compatible) chat-completion chunks in shared/fixtures/wire:
 * one `data: {...}` line each, in recorded order, from each response (text, reasoning, tool calls,
 * parallel tool calls, usage; English, Chinese and emoji content).
 */
export function recordedResponses(): string[][] {
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
 * `streamBytes` of SSE: recorded responses one after another (each block `data: …\n\n`), with a
 * `: keep-alive` comment (as DeepSeek sends while a request waits) before ~2% of the blocks, and
 * `data: [DONE]` at the end. Then cut into chunks of seeded random sizes (views, no copies).
 */
/** CJK and emoji code points that stand in for each character of the recorded text (CJK-heavy stream). */
export const CJK_POOL = [...'北京上海广州深圳天气今天很好我们一起去公园散步吧数据解析器性能测试中文字符模型上下文窗口令牌😊🎉🚀🔥✨📦']

/** The recorded responses with every character of `content` / `reasoning_content` replaced by one from CJK_POOL. */
export function cjkResponses(): string[][] {
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

export function makeStream(kind: 'recorded' | 'cjk', streamBytes: number): { bytes: Uint8Array; chunks: Uint8Array[]; blocks: number } {
  const next = rng(3)
  const enc = new TextEncoder()
  const responses = (kind === 'cjk' ? cjkResponses() : recordedResponses()).map((r) => r.map((l) => enc.encode(`${l}\n\n`)))
  const keepAlive = enc.encode(': keep-alive\n\n')
  const done = enc.encode('data: [DONE]\n\n')
  const bytes = new Uint8Array(streamBytes)
  let at = 0, blocks = 0
  outer: for (let r = 0; ; r++) {
    for (const block of responses[r % responses.length]) {
      if (next() < 0.02) {
        if (at + keepAlive.length > streamBytes - done.length) break outer
        bytes.set(keepAlive, at); at += keepAlive.length
      }
      if (at + block.length > streamBytes - done.length) break outer
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
export async function* network(chunks: readonly Uint8Array[]): AsyncGenerator<Uint8Array> {
  for (const c of chunks) yield c
}

export type Consumer = (e: SSEEvent) => void

/** dsh: `for await (const e of parseSSE(body))`. */
export async function runDsh(parseSSE: ParseSSE, chunks: readonly Uint8Array[], onEvent: Consumer): Promise<void> {
  for await (const e of parseSSE(network(chunks))) onEvent(e)
}

/** dsh's push parser (same harness as the baseline): streaming TextDecoder + `feed`. */
export async function runDshPush(createSSEParser: CreateSSEParser, chunks: readonly Uint8Array[], onEvent: Consumer): Promise<void> {
  const parser = createSSEParser({ onEvent })
  const decoder = new TextDecoder('utf-8', { ignoreBOM: true })
  for await (const c of network(chunks)) parser.feed(decoder.decode(c, { stream: true }))
  parser.feed(decoder.decode())
}

/** The baseline, as its README shows it: a streaming TextDecoder feeding `createParser({onEvent})`. */
export async function runEventsourceParser(chunks: readonly Uint8Array[], onEvent: Consumer): Promise<void> {
  const parser = createParser({ onEvent: (e) => onEvent({ event: e.event ?? 'message', data: e.data, id: e.id }) })
  const decoder = new TextDecoder('utf-8', { ignoreBOM: true })
  for await (const c of network(chunks)) parser.feed(decoder.decode(c, { stream: true }))
  parser.feed(decoder.decode())
}

/**
 * The baseline's async-iterable form (the like-for-like API of `parseSSE`): the body piped through
 * `TextDecoderStream` and `EventSourceParserStream`, consumed with `for await`.
 */
export async function runEventsourceParserStream(chunks: readonly Uint8Array[], onEvent: Consumer): Promise<void> {
  const body = new ReadableStream<Uint8Array>({
    async start(controller) { for await (const c of network(chunks)) controller.enqueue(c); controller.close() },
  })
  const events = body.pipeThrough(new TextDecoderStream() as unknown as TransformStream<Uint8Array, string>).pipeThrough(new EventSourceParserStream())
  for await (const e of events as unknown as AsyncIterable<{ event?: string; data: string; id?: string }>) onEvent({ event: e.event ?? 'message', data: e.data, id: e.id })
}

/** SHA-256 over every event's (event, id, data), and the count: equal digests = byte-identical events. */
export async function digest(run: (onEvent: Consumer) => Promise<void>): Promise<{ events: number; sha256: string }> {
  const hash = createHash('sha256')
  let events = 0
  await run((e) => { events++; hash.update(`${e.event}\u0000${e.id ?? '\u0001'}\u0000${e.data}\u0000\n`) })
  return { events, sha256: hash.digest('hex') }
}

/** dsh's callback form, as the adapter uses it: `pumpSSE(body, onEvent)`. */
export async function runDshPump(pumpSSE: PumpSSE, chunks: readonly Uint8Array[], onEvent: Consumer): Promise<void> {
  await pumpSSE(network(chunks), onEvent)
}

export type PumpSSE = (source: AsyncIterable<Uint8Array | string>, onEvent: (e: SSEEvent) => void) => Promise<void>

