// The SSE decoder's two paths (docs/design.md §6): near-ASCII chunks are cut before a character split
// at their end and decoded whole, the rest by the streaming decoder. Whatever the bytes and however
// they are chunked, parseSSE must give exactly what one streaming TextDecoder over the whole stream
// gives (U+FFFD for invalid bytes included).
import { test } from 'node:test'
import assert from 'node:assert/strict'
import fc from 'fast-check'
import { parseSSE } from '../dsh.ts'
import { createParser } from 'eventsource-parser'

const enc = new TextEncoder()
/** The reference: one streaming decode of all the bytes, parsed by eventsource-parser. */
function reference(bytes: Uint8Array): string[] {
  const out: string[] = []
  const p = createParser({ onEvent: (e) => out.push(e.data) })
  p.feed(new TextDecoder('utf-8', { ignoreBOM: true }).decode(bytes))
  return out
}
async function dsh(chunks: Uint8Array[]): Promise<string[]> {
  const out: string[] = []
  async function* source() { for (const c of chunks) yield c }
  for await (const e of parseSSE(source())) out.push(e.data)
  return out
}
/** Bytes of text pieces: ASCII runs, CJK, emoji, and raw bytes that are not valid UTF-8. */
const piece = fc.oneof(
  fc.constantFrom('data: ', '\n', '\n\n', '{"content":"', '"}', 'x'.repeat(300)).map((s) => enc.encode(s)),
  fc.string({ unit: 'grapheme', maxLength: 12 }).map((s) => enc.encode(s)),
  fc.constantFrom('北京', '😊', 'é', '\uFFFD').map((s) => enc.encode(s)),
  fc.uint8Array({ minLength: 1, maxLength: 4 }).map((b) => b.map((x) => x | 0x80)), // continuation / lead bytes
)

test('parseSSE over any bytes in any chunking equals one streaming decode of them', async () => {
  await fc.assert(fc.asyncProperty(fc.array(piece, { maxLength: 60 }), fc.array(fc.integer({ min: 1, max: 40 }), { minLength: 1, maxLength: 30 }),
    async (pieces, cuts) => {
      const body = enc.encode('data: ')
      const all = new Uint8Array([...body, ...pieces.flatMap((p) => [...p]), ...enc.encode('\n\n')])
      const chunks: Uint8Array[] = []
      for (let at = 0, k = 0; at < all.length; k++) { const n = cuts[k % cuts.length]; chunks.push(all.subarray(at, at + n)); at += n }
      assert.deepEqual(await dsh(chunks), reference(all))
    }), { numRuns: 400, seed: 26 })
})

test('a mostly-ASCII stream switches to the whole decoder and back around a dense non-ASCII stretch', async () => {
  const text = `data: ${'a'.repeat(5000)}\n\ndata: ${'北京😊'.repeat(2000)}\n\ndata: ${'b'.repeat(5000)}é\n\n`
    + `data: ${'a'.repeat(3000)}${'北京😊'.repeat(40)}${`${'a'.repeat(37)}😊`.repeat(300)}\n\n`
    + `data: ${`${'a'.repeat(3000)}😊${'b'.repeat(2000)}é`.repeat(40)}\n\n` // rare characters: the whole decoder, split
  const bytes = enc.encode(text)
  for (const size of [...Array.from({ length: 80 }, (_, i) => i + 1), 1021, 1022, 1023, 1025, 2047, 2049, 3001, 4093]) {
    const chunks: Uint8Array[] = []
    for (let i = 0; i < bytes.length; i += size) chunks.push(bytes.subarray(i, i + size))
    assert.deepEqual(await dsh(chunks), reference(bytes), `chunks of ${size} bytes`)
  }
})

test('a character split at the end of a chunk read by the whole decoder is joined with its end from the next chunk', async () => {
  const bytes = enc.encode(`data: ${`${'a'.repeat(3000)}😊${'b'.repeat(2000)}é${'c'.repeat(2500)}北`.repeat(30)}\n\n`)
  // cut inside every multi-byte character (after its 1st, 2nd or 3rd byte in turn), and every 1,500 bytes between
  const cuts: number[] = []
  let k = 0
  for (let i = 0; i < bytes.length; i++) if (bytes[i] >= 0xc2 && bytes[i] <= 0xf4) cuts.push(i + 1 + (k++ % (bytes[i] >= 0xf0 ? 3 : bytes[i] >= 0xe0 ? 2 : 1)))
  for (let i = 1500; i < bytes.length; i += 1500) cuts.push(i)
  const at = [0, ...[...new Set(cuts)].sort((a, b) => a - b), bytes.length]
  const chunks = at.slice(1).map((end, i) => bytes.subarray(at[i], end)).filter((c) => c.length > 0)
  assert.deepEqual(await dsh(chunks), reference(bytes))
  // and a split character followed by invalid bytes: U+FFFD as the streaming decoder gives it
  const bad = new Uint8Array([...enc.encode(`data: ${'a'.repeat(4000)}`), 0xf0, 0x9f, 0x41, 0xe4, ...enc.encode('x\n\n')])
  assert.deepEqual(await dsh([bad.subarray(0, 4007), bad.subarray(4007, 4008), bad.subarray(4008)]), reference(bad))
  // a character split at the end of the last chunk the streaming decoder reads before the whole decoder takes over
  for (let ascii = 0; ascii < 10; ascii++) {
    const chunks = [enc.encode(`data: ${'北京😊'.repeat(10)}`), ...Array.from({ length: ascii }, () => enc.encode('a'.repeat(4000))),
      new Uint8Array([...enc.encode('a'.repeat(4000)), 0xf0]), new Uint8Array([0x9f, 0x98, 0x8a, ...enc.encode(`${'z'.repeat(5000)}\n\n`)])]
    const all = new Uint8Array(chunks.reduce((n, c) => n + c.length, 0))
    chunks.reduce((at, c) => { all.set(c, at); return at + c.length }, 0)
    assert.deepEqual(await dsh(chunks), reference(all), `${ascii} ASCII chunks`)
  }
})
