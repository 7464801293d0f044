// Calibration under a large envelope (docs/design.md §10): the envelope-heavy fit (the messages' ratio and the
// envelope's apart), the samples that feed it (usage, a summary request's, the provider's count) and every place that
// prices the envelope (the room, the input check, the pin limit). From the hostile review of round 4 session 10; each
// test failed before the fix it names.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import {
  Agent, Session, MemoryStore, ProviderError, DEFAULT_PRUNE_CONFIG, estimateRequestTokens, internals, type ChatRequest,
  type Provider,
} from '../dsh.ts'
import { requestTokens } from './scripted-provider.ts'
import { ladderConfig } from './tuning.ts'

const WINDOW = 32_000

/** A server whose tokenizer counts the envelope (system + tools) at `envelopeRatio` × the heuristic and the messages
 *  at `messagesRatio` ×; it reports that count as usage, answers summary requests too (same model), refuses a request
 *  over its window. `sent`: every request's count. */
function tokenizer(envelopeRatio: number, messagesRatio = 1, sent: { purpose: string; count: number }[] = []): Provider {
  return {
    model: 'm', baseURL: 'memory://m', contextWindow: WINDOW, maxTokens: 1000,
    async complete(req: ChatRequest) {
      const env = requestTokens({ ...req, messages: [] })
      const count = Math.round(envelopeRatio * env + messagesRatio * (requestTokens(req) - env))
      const purpose = req.headers?.['x-dsh-purpose'] ?? 'conversation'
      sent.push({ purpose, count })
      if (count + 1 > WINDOW) {
        const text = `This model's maximum context length is ${WINDOW} tokens. However, you requested ${count} tokens`
        throw new ProviderError('CONTEXT_WINDOW_EXCEEDED', text, { status: 400, body: text })
      }
      return { message: { role: 'assistant', content: [{ type: 'text', text: purpose === 'compaction' ? 'Summary: greetings.' : 'ok' }] },
        finishReason: 'stop', usage: { promptTokens: count, completionTokens: 1 } }
    },
  } as Provider
}

/** A session and an Agent whose 28,000-code-point system prompt (7,008 heuristic tokens) the server counts at 4×
 *  (28,032 of its 32,000 tokens), after one turn; `sent`: every request's count. */
async function underFourTimes(sent: { purpose: string; count: number }[] = []) {
  const session = await Session.open(new MemoryStore())
  const agent = new Agent({ session, provider: tokenizer(4, 1, sent), system: 's'.repeat(28_000), recall: false } as ConstructorParameters<typeof Agent>[0])
  assert.equal((await agent.run('hello')).reason, 'stop')
  return { session, agent, sent }
}

test('calibration: the usage of an envelope-heavy summary request is no ratio sample; after a compaction under a 4x envelope an input that fits is sent', async () => {
  // docs/design.md §10: "A request gives a ratio sample only when its messages are at least half of it"; "r prices the
  // messages and the input ... so an input is never priced at the envelope's ratio". The system prompt is 7,008
  // heuristic tokens, counted 28,032 (4x) of the 32,000-token window: every conversation request is envelope-heavy and
  // the fit finds r = 1, offset 21,024. The pressure compaction's summary request (same model, the same envelope) is
  // just as envelope-heavy, but its usage is logged as a `ladder/state` sample of source 'summary', which
  // LadderState.apply feeds to sample() — a ratio sample — and from then on fit() ignores the heavy samples:
  // calibration 3.78, offset 0. The 2,008-token input below (about 30,200 counted in all) is then refused as
  // "(7,008 + 2,008) × 3.78 = 34,100 tokens".
  const sent: { purpose: string; count: number }[] = []
  const session = await Session.open(new MemoryStore())
  const agent = new Agent({ session, provider: tokenizer(4, 1, sent), system: 's'.repeat(28_000), recall: false } as ConstructorParameters<typeof Agent>[0])
  for (let i = 0; i < 3; i++) assert.equal((await agent.run('hello ' + 'h'.repeat(1200 * i))).reason, 'stop')
  assert.ok(sent.some((s) => s.purpose === 'compaction'), 'a summary request was made')
  const m = session.measure()
  const calibration = `calibration ${m.calibration}, offset ${m.calibrationOffsetTokens}`
  const n = sent.length
  const reason = await agent.run('w '.repeat(4_000)).then((r) => (r as { error?: Error }).error?.message ?? r.reason,
    (e: Error) => `${e.name}: ${e.message}`)
  assert.equal(reason, 'stop', calibration)
  assert.ok(sent.slice(n).every((s) => s.count < WINDOW), `requests: ${JSON.stringify(sent.slice(n))}`)
  assert.ok(Math.abs(m.calibration - 1) < 0.05, `the messages' ratio after the compaction: ${calibration}`)
})

test('calibration: a provider count (source "count") or overflow count of an envelope-heavy request keeps the messages\' ratio the heavy fit found', async () => {
  // Same rule, at the session level: countNearWindow and recoverOverflow log `ladder/state` samples with the request's
  // heuristic total; near the window under a large envelope those requests are envelope-heavy. The envelope is
  // counted at 2x, the messages at 1x.
  for (const source of ['count', 'overflow'] as const) {
    const s = await Session.open(new MemoryStore())
    s.append('request/header', { model: 'm', baseURL: 'memory://m', system: 's'.repeat(32_000), contextWindow: WINDOW })
    s.append('user/message', { message: { role: 'user', content: 'w '.repeat(2_000) }, surfaceOp: { op: 'append' } })
    let m = s.measure()
    const E = m.envelopeTokens
    s.append('assistant/message', { message: { role: 'assistant', content: [{ type: 'text', text: 'ok' }] },
      usage: { promptTokens: 2 * E + m.surfaceTokens, completionTokens: 1 }, surfaceOp: { op: 'append' } })
    m = s.measure()
    assert.equal(m.calibration, 1, 'the heavy fit: messages at 1')
    assert.equal(m.calibrationOffsetTokens, E, 'the envelope at 2 through the offset')
    s.append('user/message', { message: { role: 'user', content: 'v '.repeat(2_000) }, surfaceOp: { op: 'append' } })
    m = s.measure()
    s.append('ladder/state', { sample: { providerTokens: 2 * E + m.surfaceTokens, heuristicTokens: m.heuristicTokens, source } })
    m = s.measure()
    assert.ok(Math.abs(m.calibration - 1) < 0.05, `${source}: calibration ${m.calibration}, offset ${m.calibrationOffsetTokens}`)
  }
})

test('calibration: the input-too-large check prices the envelope as measured (offset + r × envelope): an input that cannot fit a 4x envelope is refused with nothing sent', async () => {
  // docs/design.md §10: the envelope costs r_e through the offset, "so the room (§5) is right". Agent.inputTooBig
  // computes ceil((envelope + input) × calibration) and ignores calibrationOffsetTokens: with r = 1 and offset 21,024
  // it prices a 7,008-token envelope counted 28,032 at 7,008, lets a 5,008-token input through (12,016 < 32,000), and
  // the request is sent at 33,059 counted tokens into the 32,000-token window (its own estimate, inputTokens, was
  // 33,051); the turn ends with the server's overflow instead of dsh's "nothing was sent".
  const { session, agent, sent } = await underFourTimes()
  const m = session.measure()
  assert.equal(m.calibration, 1)
  assert.equal(m.calibrationOffsetTokens, 3 * m.envelopeTokens)
  const n = sent.length
  const outcome = await agent.run('w '.repeat(10_000)).then((r) => (r as { error?: Error }).error?.message ?? r.reason,
    (e: Error) => e.message)
  assert.deepEqual(sent.slice(n).filter((s) => s.count >= WINDOW), [], 'no request sent over the window')
  assert.match(outcome, /nothing was sent/)
})

test('pins: the pin limit prices the envelope as measured (offset + r × envelope), as the room does', async () => {
  // Pins.checkFits computes ceil((envelope + pinned) × calibration) and ignores calibrationOffsetTokens. Envelope at 4x:
  // 7,008 heuristic tokens counted 28,032, over the 25,600-token pin limit (0.8 × 32,000) on its own; a 2,508-token
  // input (30,540 with the envelope as measured) is pinned because it is priced at (7,008 + 2,508) × 1 = 9,516.
  const { session, agent } = await underFourTimes()
  assert.equal(session.measure().calibrationOffsetTokens, 3 * session.measure().envelopeTokens)
  await assert.rejects(agent.run('w '.repeat(5_000), { pin: true }), { name: 'SessionError', code: 'PIN' })
})

test('calibration: messages counted at 1.5x under a 1x envelope of 70% of the window: later inputs that fit are still sent (at 66c9081 they were)', async () => {
  // The heavy fit finds r = 1.5 (messages) and r_e = 1 (envelope, offset -3,518). Agent.inputTooBig prices the envelope
  // at r, ignoring the offset: 7,036 × 1.5 = 10,554 > 10,000, so from the second turn on every input is refused
  // ("the system prompt and tool specs alone are 7036 tokens (× 1.50 calibration = 10554) ... nothing was sent"), though
  // a request with it is counted at about 8,000 of 10,000 tokens. At 66c9081 (no heavy fit: calibration 1) all 12
  // turns of this session ended 'stop'. The mirror of the round-4 regression the fit was written to prevent.
  const W = 10_000
  const sent: number[] = []
  let k = 0
  const provider = { model: 'm', baseURL: 'memory://m', contextWindow: W, maxTokens: 100,
    complete: async (r: ChatRequest) => {
      const env = requestTokens({ ...r, messages: [] })
      const n = Math.round(env + 1.5 * (requestTokens(r) - env))
      sent.push(n)
      if (n + 1 > W) throw new ProviderError('CONTEXT_WINDOW_EXCEEDED', `maximum context length is ${W} tokens, requested ${n} tokens`)
      const usage = { promptTokens: n, completionTokens: 5 }
      const last = r.messages.at(-1)!
      if (r.headers?.['x-dsh-purpose'] === 'compaction' || last.role !== 'user')
        return { message: { role: 'assistant', content: [{ type: 'text', text: 'ok' }] }, finishReason: 'stop', usage }
      return { message: { role: 'assistant', content: [{ type: 'tool-call', id: `c${k++}`, name: 't', arguments: '{}' }] },
        finishReason: 'tool-calls', usage }
    } } as unknown as Provider
  const session = await Session.open(new MemoryStore())
  const agent = new Agent({ session, provider, system: 's'.repeat(28_000), recall: false,
    tools: [{ name: 't', description: 'd', parameters: { type: 'object', properties: {} }, execute: () => 'r'.repeat(1500) }] } as ConstructorParameters<typeof Agent>[0])
  const outcomes: string[] = []
  for (let i = 0; i < 4; i++) {
    outcomes.push(await agent.run(`USER-${i} please handle item ${i}`).then((r) => (r as { error?: Error }).error?.message ?? r.reason,
      (e: Error) => e.message))
  }
  assert.deepEqual(outcomes, ['stop', 'stop', 'stop', 'stop'], `calibration ${session.measure().calibration}; largest request ${Math.max(...sent)} of ${W}`)
})

test('calibration: clamping the two-ratio fit coordinate by coordinate never gives a fit worse than the fallback (messages 1, envelope the rest)', async () => {
  // Two envelope-heavy samples, each of a plausible ratio (0.93 and 3.87 of their heuristic totals), with the envelope
  // changed between them and no model change. Unconstrained least squares gives r > 4 and r_e < 0.5; heavyFit clamps
  // each to [0.5, 4] separately: r = 4, r_e = 0.5 (a negative offset), a larger squared error over the samples than its
  // own fallback (r = 1, r_e = Σ(p − s) ÷ Σe), and every message and input priced at 4x. The box-constrained least
  // squares solution is not the clamp of the unconstrained one.
  const s = await Session.open(new MemoryStore())
  const turn = (system: string, text: string, promptTokens: number) => {
    s.append('request/header', { model: 'm', baseURL: 'memory://m', system, contextWindow: 64_000 })
    s.append('user/message', { message: { role: 'user', content: text }, surfaceOp: { op: 'append' } })
    const m = s.measure()
    s.append('assistant/message', { message: { role: 'assistant', content: [{ type: 'text', text: 'ok' }] },
      usage: { promptTokens, completionTokens: 1 }, surfaceOp: { op: 'append' } })
    return { e: m.envelopeTokens, s: m.surfaceTokens, p: promptTokens }
  }
  const samples = [turn('s'.repeat(48_000), 'w '.repeat(1_800), 12_000), turn('s'.repeat(32_000), 'w '.repeat(2_700), 40_000)]
  const m = s.measure()
  const r = m.calibration, re = r + m.calibrationOffsetTokens / m.envelopeTokens
  const sse = (a: number, b: number) => samples.reduce((t, x) => t + (a * x.s + b * x.e - x.p) ** 2, 0)
  const fallback = sse(1, samples.reduce((t, x) => t + x.p - x.s, 0) / samples.reduce((t, x) => t + x.e, 0))
  assert.ok(sse(r, re) <= fallback + 2 * Math.sqrt(fallback) + 1, `fit r=${r}, r_e=${re}: squared error ${sse(r, re).toExponential(3)} > the fallback's ${fallback.toExponential(3)}`)
})

// ── The second review: a summary request of another envelope, an earlier envelope's samples, the messages ──

const outcome = (p: Promise<unknown>) => p.then((r: any) => r.error?.message ?? r.reason, (e: Error) => e.message)
const tools = (n: number) => Array.from({ length: n }, (_, i) => ({ name: `t${i}`, description: 'd'.repeat(1500),
  parameters: { type: 'object', properties: {} }, execute: () => 'r' }))

test('calibration: a summary request sent without the tool specs does not wipe the conversation\'s envelope-heavy fit; an input that cannot fit the 2x envelope is refused with nothing sent', async () => {
  // Envelope 13,857 heuristic tokens (system 2,008 + 30 tools) counted at 2x = 27,714 of 32,000; messages at 1x.
  // The heavy fit finds r = 1, offset 13,857 (exact). The tools take more than a tenth of the window, so summary
  // requests carry the system prompt only (envelopeTokens 2,008); once a summary region outgrows that 2,008-token
  // system prompt, its usage (6,689 of 4,681 heuristic) is a *ratio* sample, and fit() then ignores every heavy
  // sample: calibration 1.43, offset 0, the conversation envelope priced 19,802 instead of 27,714. The input check
  // then lets through a 4,500-token input that cannot fit (priced ~26,200; counted > 32,000).
  const sent: { purpose: string; count: number }[] = []
  const session = await Session.open(new MemoryStore())
  const agent = new Agent({ session, provider: tokenizer(2, 1, sent), system: 's'.repeat(8000), tools: tools(30),
    recall: false } as ConstructorParameters<typeof Agent>[0])
  for (let i = 0; i < 6; i++) await agent.run('hello ' + 'h'.repeat(1500 * i))
  const m = session.measure()
  const re = m.calibration + m.calibrationOffsetTokens / m.envelopeTokens
  assert.ok(Math.abs(re - 2) < 0.2, `the envelope as measured: r ${m.calibration.toFixed(3)}, offset ${m.calibrationOffsetTokens} `
    + `(r_e ${re.toFixed(3)}; the server counts it at 2)`)
  const n = sent.length
  const said = await outcome(agent.run('w '.repeat(9_000)))
  assert.deepEqual(sent.slice(n).filter((s) => s.purpose === 'conversation' && s.count >= WINDOW), [], 'no request sent over the window')
  assert.match(said, /nothing was sent/)
})

test('calibration: ratio samples of an earlier small envelope (same model) do not price a later 4x envelope at the messages\' ratio; an input that cannot fit is refused before sending', async () => {
  // Three turns under a 9-token system prompt give a ratio sample (1.02). A new Agent on the same session (same model)
  // has a 7,008-token system prompt counted 28,032 of 32,000; its heavy samples are taken but fit() prefers any ratio
  // sample (offset 0), so the envelope is priced 7,160 in the room and the input check. A 4,500-token input
  // (about 33,000 counted) passes the check, costs two summary calls, and the turn rejects with the server's overflow.
  const sent: { purpose: string; count: number }[] = []
  const session = await Session.open(new MemoryStore())
  const provider = tokenizer(4, 1, sent)
  const first = new Agent({ session, provider, system: 'sys', recall: false } as ConstructorParameters<typeof Agent>[0])
  for (let i = 0; i < 3; i++) assert.equal((await first.run('w '.repeat(800))).reason, 'stop')
  const agent = new Agent({ session, provider, system: 's'.repeat(28_000), recall: false } as ConstructorParameters<typeof Agent>[0])
  for (let i = 0; i < 2; i++) assert.equal((await agent.run('hello')).reason, 'stop')
  const n = sent.length
  const said = await outcome(agent.run('w '.repeat(9_000)))
  assert.deepEqual(sent.slice(n).filter((s) => s.count >= WINDOW), [], 'no request sent over the window')
  assert.match(said, /nothing was sent/)
})

test('input check: under a 4x envelope an input smaller than the envelope as measured is refused naming the envelope (its measured size), not as "the current input alone"', async () => {
  // Envelope 7,008 heuristic (28,032 measured), input 7,016 (7,016 measured): the branch compares heuristic sizes, so
  // the message reads "the current input alone is 7016 tokens (plus 7008 of system prompt and tools, as measured =
  // 35048) ... shorten it": it blames an input of a fifth of the window, advises shortening it rather than the
  // envelope, and "7008 of system prompt and tools, as measured = 35048" reads as the envelope being 35,048.
  const { agent } = await underFourTimes()
  const said = await outcome(agent.run('x '.repeat(14_028)))
  assert.match(said, /nothing was sent/)
  assert.match(said, /system prompt and tool specs alone/, said)
  assert.match(said, /28032/, `the envelope's measured size is named: ${said}`)
})

test('pins: a refused pin under a 4x envelope names the envelope\'s measured size, so the sum it shows exceeds the limit', async () => {
  // "pinned messages would hold 7015 tokens, which with the 7008-token envelope exceeds the 25600-token limit for pins
  // (...) as measured (35047 tokens)": 7,015 + 7,008 = 14,023 is under 25,600; the 28,032 the envelope costs is not said.
  const { agent } = await underFourTimes()
  await assert.rejects(agent.run('z '.repeat(14_014), { pin: true }), (e: Error) => {
    assert.equal((e as { code?: string }).code, 'PIN')
    assert.match(e.message, /28032/, e.message)
    return true
  })
})

test('calibration: the ladder prices an envelope part the next request adds (a tool spec) at the envelope\'s ratio', async () => {
  // The next request's size (Ladder.nextRequestTokens, what an overflow's recovery checks against the window) adds the
  // host's envelope beyond the logged one; it priced that part at the messages' ratio (1 here), not the envelope's 4.
  const { session } = await underFourTimes()
  const m = session.measure()
  assert.equal(m.calibrationOffsetTokens, 3 * m.envelopeTokens)
  const extra = { name: 'extra', description: 'd'.repeat(4_000), parameters: { type: 'object', properties: {} } }
  const envelope = { system: 's'.repeat(28_000), tools: [extra] }
  const added = estimateRequestTokens(envelope, []) - m.envelopeTokens
  assert.ok(added > 1_000, `${added}`)
  const host = { session, summarizer: tokenizer(4), envelope,
    settings: { contextWindow: WINDOW, compaction: ladderConfig(), prune: DEFAULT_PRUNE_CONFIG } }
  const outcome = await new internals.Ladder(host as never).relievePressure()
  assert.equal(outcome.tokensBefore, m.totalTokens + 4 * added, 'the added spec at 4x')
})
