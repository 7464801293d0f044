// Benchmark 3 (issue 7): dsh's `parseSSE` against the `eventsource-parser` package on the same 50 MiB
// stream of realistic chat-completion chunks, split into network chunks of seeded random sizes.
// Target: ≥ 1.0× its throughput, with byte-identical events.
import * as dshModule from '../dsh.ts'
import { fmtRatio, fmtStats, gc, nowMs, stats, table, type Section, type Stats } from './lib.ts'
import { CHUNK_MAX, CHUNK_MIN, digest, makeStream, runDsh, runDshPump, runDshPush, runEventsourceParser, runEventsourceParserStream, type Consumer, type CreateSSEParser, type ParseSSE, type PumpSSE } from './sse-streams.ts'

const STREAM_BYTES = 50 * 1024 * 1024
const RUNS = 11

interface StreamResult { table: string; targets: Section['targets']; blocks: number; mib: number; chunks: number }

async function measureStream(kind: 'recorded' | 'cjk', mod: { parseSSE: ParseSSE; createSSEParser?: CreateSSEParser; pumpSSE?: PumpSSE }): Promise<StreamResult> {
  const parseSSE = mod.parseSSE
  const { bytes, chunks, blocks } = makeStream(kind, STREAM_BYTES)
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
      ...base, status: 'not-run', reason: '`parseSSE` (dsh.ts section 2, stream in) has not landed on this branch yet; bench/sse.bench.ts is written against its documented API (docs/design.md §9) and runs once it does',
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
