// SSE parser conformance: every case of the eventsource-parser test suite (recorded as data in
// ../shared/fixtures/sse/eventsource-parser-cases.json) through parseSSE (the adapter feeds the same
// parser from its body reader), fed as strings, as UTF-8 bytes, and byte by byte. The three cases that call
// the push parser's reset() test an API dsh no longer has (one parser behind parseSSE; CHANGELOG.md).
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { readFileSync } from 'node:fs'
import { parseSSE, openAICompatible, type SSEEvent } from '../dsh.ts'
import { sharedPath, skipWithoutShared } from './shared.ts'
import { createParser } from 'eventsource-parser'
import { rng } from './rng.ts'

type Op = string | { reset: { consume?: boolean } }
interface Case { name: string; config: { maxBufferSize?: number; onComment?: false }; ops: Op[]; expected: Record<string, unknown>[] }

const skip = skipWithoutShared('fixtures', 'sse', 'eventsource-parser-cases.json')
const cases: Case[] = skip ? [] : JSON.parse(readFileSync(sharedPath('fixtures', 'sse', 'eventsource-parser-cases.json'), 'utf8')).cases

test('SSE fixture file holds the 49 recorded cases', { skip }, () => {
  assert.equal(cases.length, 49)
})

/** The events a case expects, in parseSSE's shape, up to the first overflow/throw. */
function expectedEvents(c: Case): { events: SSEEvent[]; overflow: boolean } {
  const events: SSEEvent[] = []
  for (const e of c.expected) {
    if (e.type === 'error' && e.errorType === 'max-buffer-size-exceeded') return { events, overflow: true }
    if (e.type === 'event') events.push({ event: (e.event as string | undefined) ?? 'message', data: e.data as string, ...(e.id !== undefined ? { id: e.id as string } : {}) })
  }
  return { events, overflow: false }
}

async function collect(source: AsyncIterable<Uint8Array | string>, maxBufferSize?: number): Promise<{ events: SSEEvent[]; error?: unknown }> {
  const events: SSEEvent[] = []
  try {
    for await (const e of parseSSE(source, { maxBufferSize })) events.push(e)
  } catch (error) {
    return { events, error }
  }
  return { events }
}

/** Latin-1 "ï»¿" in the fixture stands for the raw bytes EF BB BF; everything else is UTF-8 text. */
function toBytes(op: string): Uint8Array {
  const raw = '\u00ef\u00bb\u00bf'
  if (!op.includes(raw)) return new TextEncoder().encode(op)
  const parts = op.split(raw).map((p) => new TextEncoder().encode(p))
  const out: number[] = []
  parts.forEach((p, i) => { if (i > 0) out.push(0xef, 0xbb, 0xbf); out.push(...p) })
  return Uint8Array.from(out)
}

async function* iterate<T>(items: T[]): AsyncGenerator<T> { for (const item of items) yield item }

for (const c of cases) {
  if (c.ops.some((op) => typeof op !== 'string')) continue // reset() is an API of the push parser only
  const ops = c.ops as string[]
  test(`parseSSE (strings, UTF-8 chunks, single bytes): ${c.name}`, async () => {
    const want = expectedEvents(c)
    const bytes = ops.map(toBytes)
    const single = bytes.flatMap((b) => Array.from(b, (x) => Uint8Array.of(x)))
    for (const source of [iterate(ops), iterate(bytes), iterate(single)]) {
      const got = await collect(source, c.config.maxBufferSize)
      if (want.overflow) {
        assert.ok(got.error instanceof RangeError && /held more than maxBufferSize = \d+ UTF-16 units/.test(got.error.message), `expected an overflow, got ${String(got.error)}`)
        assert.deepEqual(got.events, want.events)
      } else {
        assert.equal(got.error, undefined)
        // A byte-at-a-time feed sees no chunk boundary inside the decoded text where the string feed
        // did; the events must be the same all the same.
        assert.deepEqual(got.events, want.events)
      }
    }
  })
}

test('parseSSE reads a ReadableStream, joins a UTF-8 character split across chunks, and cancels on early exit', async () => {
  const text = 'data: 北京😊\n\ndata: second\n\ndata: third\n\n'
  const bytes = new TextEncoder().encode(text)
  // Split inside the 3-byte 北 and inside the 4-byte emoji; the third event stays unread.
  const cuts = [7, 13, 16, 32, bytes.length]
  let cancelled = false
  let start = 0
  const stream = new ReadableStream<Uint8Array>({
    pull(controller) {
      const end = cuts.shift()
      if (end === undefined) return controller.close()
      controller.enqueue(bytes.slice(start, end)); start = end
    },
    cancel() { cancelled = true },
  })
  const seen: string[] = []
  for await (const e of parseSSE(stream)) {
    seen.push(e.data)
    if (seen.length === 2) break
  }
  assert.deepEqual(seen, ['北京😊', 'second'])
  assert.equal(cancelled, true)
})

test('parseSSE: an event without its blank line at EOF is not dispatched; BOM only skipped once', async () => {
  const got = await collect(iterate([Uint8Array.of(0xef, 0xbb, 0xbf, 0xef, 0xbb, 0xbf), new TextEncoder().encode('data: x\n\ndata: y\n')]))
  // The second BOM is data: "\uFEFFdata" is an unknown field, so only the tail event remains — and it never ends.
  assert.deepEqual(got, { events: [] })
  const ok = await collect(iterate([Uint8Array.of(0xef, 0xbb, 0xbf), new TextEncoder().encode('data: x\n\ndata: y\n')]))
  assert.deepEqual(ok, { events: [{ event: 'message', data: 'x' }] })
})

test('parseSSE rejects a source that is not a stream', async () => {
  await assert.rejects(async () => { for await (const _ of parseSSE(42 as never)) { /* nothing */ } }, /ReadableStream<Uint8Array> or an AsyncIterable/)
})

test('parseSSE refuses a bad maxBufferSize', async () => {
  await assert.rejects(async () => { for await (const _ of parseSSE(iterate(['data: x\n\n']), { maxBufferSize: 0 })) { /* nothing */ } }, /maxBufferSize must be a positive integer/)
})

test('the adapter\'s form: events of one chunk arrive synchronously; [DONE] stops and cancels the body; a throw from onEvent rejects and cancels', async () => {
  let cancelled = 0
  const chunk = (text: string) => `data: {"choices":[{"index":0,"delta":{"content":"${text}"}}]}\n\n`
  const stream = () => new ReadableStream<Uint8Array>({
    start(c) { c.enqueue(new TextEncoder().encode(`${chunk('a')}${chunk('b')}data: [DONE]\n\n${chunk('after')}`)) },
    cancel() { cancelled++ },
  })
  const provider = openAICompatible({ baseURL: 'http://127.0.0.1:9', model: 'm',
    fetch: async () => new Response(stream(), { headers: { 'content-type': 'text/event-stream' } }) })
  const seen: string[] = []
  const r = await provider.complete({ messages: [{ role: 'user', content: 'hi' }], onEvent: (e) => { if (e.type === 'text-delta') seen.push(e.text) } })
  assert.deepEqual(seen, ['a', 'b'])
  assert.deepEqual(r.message.content, [{ type: 'text', text: 'ab' }])
  assert.equal(cancelled, 1)
  await assert.rejects(provider.complete({ messages: [{ role: 'user', content: 'hi' }], onEvent: () => { throw new Error('listener failed') } }), /listener failed/)
  assert.equal(cancelled, 2)
})

test('parseSSE: a line it ignores (comment, unknown field) is dropped as it arrives, in pieces of any size; a data line of that length overflows', async () => {
  // 1 MiB of one comment line, one unknown-field line and one line without a colon, each in 100-unit pieces, under a
  // 10,000-unit cap: the comment and the unknown field are never held, so nothing overflows and the event after
  // them arrives. The ignored line is looked at only once it holds 4,096 units, so what it held stays under the cap.
  const pieces = (head: string) => [head, ...Array.from({ length: 10_486 }, () => 'x'.repeat(100)), '\n']
  for (const head of [': keep-alive ', 'unknown-field: ', 'a']) {
    const got = await collect(iterate([...pieces(head), '\n', 'data: after\n\n']), 10_000)
    assert.deepEqual(got, { events: [{ event: 'message', data: 'after' }] }, head)
  }
  const data = await collect(iterate([...pieces('data: '), '\n', 'data: after\n\n']), 10_000)
  assert.ok(data.error instanceof RangeError && /held more than maxBufferSize = 10000 UTF-16 units/.test(data.error.message), String(data.error))
  assert.deepEqual(data.events, [])
  // Under a cap smaller than 4,096 units the line is looked at before it could overflow.
  const small = await collect(iterate([': ', 'y'.repeat(60), 'y'.repeat(60), '\n', 'data: z\n\n']), 100)
  assert.deepEqual(small, { events: [{ event: 'message', data: 'z' }] })
})

test('parseSSE equals eventsource-parser on 300 seeded streams of mixed line ends (LF, CR, CRLF), comments, unknown fields and ids, cut at random places', async () => {
  const lineEnds = ['\n', '\r', '\r\n']
  for (let seed = 1; seed <= 300; seed++) {
    const r = rng(seed)
    const pick = <T>(xs: readonly T[]): T => xs[Math.floor(r() * xs.length)]
    const text = (n: number) => Array.from({ length: n }, () => pick(['a', 'b', ' ', ':', '北', '😊', 'é'])).join('')
    let stream = r() < 0.2 ? '\ufeff' : ''
    for (let block = 0; block < 12; block++) {
      for (let k = 1 + Math.floor(r() * 3); k > 0; k--) {
        const field = pick(['data: ', 'data:', 'data', 'event: ', 'id: ', ': ', 'retry: ', 'other: '])
        stream += field + text(Math.floor(r() * 40)) + pick(lineEnds)
      }
      stream += pick(lineEnds)
    }
    // eventsource-parser holds a CR that ends its input (an LF may follow); dsh dispatches at once (WHATWG: a CR ends
    // the line). An LF after it ends the same line, so both see the same events.
    if (stream.endsWith('\r')) stream += '\n'
    const want: SSEEvent[] = []
    const esp = createParser({ onEvent: (e) => want.push(e.id === undefined ? { event: e.event ?? 'message', data: e.data }
      : { event: e.event ?? 'message', data: e.data, id: e.id }) })
    esp.feed(stream.replace(/^\ufeff/, '')) // a decoder strips the BOM before eventsource-parser sees the text (WHATWG)
    // the same text in chunks cut anywhere (a CRLF split too), as strings and as UTF-8 bytes cut anywhere
    const cuts = (n: number) => [...new Set(Array.from({ length: 1 + Math.floor(r() * 20) }, () => Math.floor(r() * n)))]
      .sort((a, b) => a - b)
    const pieces = <T extends { slice(a: number, b?: number): T; length: number }>(whole: T): T[] => {
      const at = [0, ...cuts(whole.length), whole.length]
      return at.slice(1).map((end, i) => whole.slice(at[i], end)).filter((p) => p.length > 0)
    }
    for (const source of [pieces(stream), pieces(new TextEncoder().encode(stream))]) {
      const got: SSEEvent[] = []
      for await (const e of parseSSE(iterate<string | Uint8Array>(source))) got.push(e)
      assert.deepEqual(got, want, `seed ${seed}: ${JSON.stringify(stream.slice(0, 200))}`)
    }
  }
})
