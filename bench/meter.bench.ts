// Benchmark 2 (issue 7): `measure()` after each append on sessions of 100, 10,000 and 100,000 events,
// against a baseline that re-estimates every surface message on each call. Target: dsh's per-call
// cost at 100,000 events within 2× of its cost at 100 events.
import { MemoryStore, Session, estimateRequestTokens, type Envelope, type Message } from '../dsh.ts'
import { fmtRatio, fmtStats, fmtTime, gc, interleaved, nowMs, paired, rng, stats, table, tinybench, type Section, type Stats, type Target, type Task } from './lib.ts'

const SIZES = [100, 10_000, 100_000] as const
const ENVELOPE: Envelope = {
  system: 'You are a coding agent. Use the tools to read and change files; keep answers short.',
  tools: [{ name: 'bash', description: 'Run a shell command', parameters: { type: 'object', properties: { command: { type: 'string' } }, required: ['command'] } }],
}

type Append = [type: string, data: Record<string, unknown>]

/**
 * An endless, realistic event stream: turns of 25 steps; each step is step/start, an assistant
 * message with one tool call (and provider usage, so the meter is anchored), the tool/call dispatch
 * record, the tool result, step/end. Texts come from a small seeded pool (shared strings: the meter
 * reads only lengths, and 100,000 events stay small in memory).
 */
function* events(): Generator<Append> {
  const next = rng(2)
  const pool = Array.from({ length: 64 }, (_, i) => 'x'.repeat(50 + Math.floor(next() * 4000)) + i)
  const pick = () => pool[Math.floor(next() * pool.length)]
  yield ['session/start', { id: 'bench', version: 'bench' }]
  yield ['request/header', { model: 'bench', baseURL: 'http://127.0.0.1', system: ENVELOPE.system, tools: ENVELOPE.tools, maxTokens: 8192, contextWindow: 128_000 }]
  for (let turn = 1; ; turn++) {
    yield ['turn/start', { turn }]
    yield ['user/message', { message: { role: 'user', content: pick().slice(0, 300) }, surfaceOp: { op: 'append' } }]
    for (let step = 1; step <= 25; step++) {
      const id = `call_${turn}_${step}`
      yield ['step/start', { turn, step }]
      const assistant: Message = { role: 'assistant', content: [{ type: 'text', text: pick().slice(0, 400) }, { type: 'tool-call', id, name: 'bash', arguments: JSON.stringify({ command: `grep -rn step${step} src` }) }] }
      yield ['assistant/message', { message: assistant, usage: { promptTokens: 1000 * step, completionTokens: 120 }, finishReason: 'tool_calls', surfaceOp: { op: 'append' } }]
      yield ['tool/call', { callId: id, name: 'bash', arguments: '{}' }]
      yield ['tool/result', { message: { role: 'tool', toolCallId: id, content: [{ type: 'text', text: pick() }] }, surfaceOp: { op: 'append' } }]
      yield ['step/end', { turn, step }]
    }
    yield ['turn/end', { turn, reason: 'stop' }]
  }
}

/** A session holding the first `count` events of the stream, and the stream to continue it. */
function sessionOf(count: number): { session: Session; rest: Generator<Append> } {
  const session = new Session({ store: new MemoryStore(), now: () => 0 })
  const rest = events()
  for (let i = 0; i < count; i++) {
    const [type, data] = rest.next().value as Append
    session.append(type, data)
  }
  return { session, rest }
}

/** The baseline: the obvious meter, which prices the envelope and every surface message again. */
function remeasure(session: Session): number {
  const nodes = session.surface()
  const messages: Message[] = new Array(nodes.length)
  for (let i = 0; i < nodes.length; i++) messages[i] = nodes[i].message
  return estimateRequestTokens(ENVELOPE, messages)
}

/** Untimed appends before each timed batch. */
const WARM = 5

/**
 * One sample: `sessions` times, a fresh session of `size − calls/2` events, then `calls` appends
 * each followed by a measurement, timed together (the session is `size` events on average while
 * timed). Returns ms per append + measurement.
 */
function sample(size: number, calls: number, sessions: number, measure: (s: Session) => number): () => number {
  return () => {
    let ms = 0, sink = 0
    for (let k = 0; k < sessions; k++) {
      const { session, rest } = sessionOf(size - calls / 2 - WARM)
      // A few untimed appends first, so the timed ones do not pay for cold caches.
      for (let i = 0; i < WARM; i++) { const [type, data] = rest.next().value as Append; session.append(type, data); measure(session) }
      const batch = Array.from({ length: calls }, () => rest.next().value as Append)
      const t0 = nowMs()
      for (const [type, data] of batch) {
        session.append(type, data)
        sink += measure(session)
      }
      ms += nowMs() - t0
    }
    if (sink <= 0) throw new Error('measured nothing')
    return ms / (calls * sessions)
  }
}

const ROUNDS = 11
/** Per size: appends timed per session, and sessions per sample (so that a sample times ≥ 500 calls). */
const PLAN = { 100: { calls: 20, sessions: 50 }, 10_000: { calls: 500, sessions: 1 }, 100_000: { calls: 500, sessions: 1 } } as const

export default async function meter(): Promise<Section> {
  const dshMeasure = (s: Session) => s.measure().totalTokens
  // Every size, dsh and baseline, in interleaved rounds: the ratio between sizes is taken within a round.
  const tasks: Task[] = []
  for (const size of SIZES) {
    const { calls, sessions } = PLAN[size]
    tasks.push({ name: `dsh ${size}`, sample: sample(size, calls, sessions, dshMeasure) })
    tasks.push({ name: `baseline ${size}`, sample: sample(size, Math.min(calls, 100), sessions, remeasure) })
  }
  const samples = interleaved(tasks, ROUNDS)
  const of = (name: string) => samples[tasks.findIndex((t) => t.name === name)]

  const rows: { size: number; calls: number; dsh: Stats; base: Stats; alone: Stats; agree: boolean }[] = []
  for (const size of SIZES) {
    // measure() alone, 10,000 calls on a session of this size (tinybench).
    const { session } = sessionOf(size)
    const alone = await tinybench(`measure() ${size}`, () => {
      let sink = 0
      const t0 = nowMs()
      for (let i = 0; i < 10_000; i++) sink += session.measure().totalTokens
      const per = (nowMs() - t0) / 10_000
      if (sink <= 0) throw new Error('measured nothing')
      return { overriddenDuration: per }
    }, { timeMs: 0, iterations: 31 })
    // Same figure both ways (unanchored heuristic total = re-estimate of envelope + surface).
    const agree = session.measure().heuristicTokens === remeasure(session)
    rows.push({ size, calls: PLAN[size].calls * PLAN[size].sessions, dsh: stats(of(`dsh ${size}`)), base: stats(of(`baseline ${size}`)), alone, agree })
    gc()
  }
  const growthPaired = paired(of(`dsh ${SIZES[SIZES.length - 1]}`), of(`dsh ${SIZES[0]}`))

  const first = rows[0], last = rows[rows.length - 1]
  const growth = growthPaired.median
  const targets: Target[] = [{
    name: 'per-call cost flat in session size', target: '100,000 events within 2× of 100 events',
    measured: `${fmtRatio(growth)} (paired, ${fmtRatio(growthPaired.min)}–${fmtRatio(growthPaired.max)}; ${fmtTime(last.dsh.median)} vs ${fmtTime(first.dsh.median)} per call)`, met: growth <= 2,
  }]
  return {
    id: 'meter', title: 'Meter', status: 'ran', targets,
    method: [
      'A session is built from a realistic event stream (bench/meter.bench.ts: turns of 25 steps; each step = step/start, an',
      'assistant message with a tool call and provider usage, tool/call, tool result, step/end; ≈ 2 surface messages per 5',
      'events). One sample builds fresh sessions of *size − calls/2* events and times *calls* appends on each, every append',
      'followed by a measurement: **dsh** = `session.measure().totalTokens` (incremental, anchored on the usage); **baseline** =',
      'the obvious meter, `estimateRequestTokens(envelope, every surface message)` again after each append. Times are per',
      `append + measurement, median (min–max) of ${ROUNDS} interleaved rounds (every size, dsh and baseline, once per round); the`,
      'target ratio is paired within each round. "measure() alone": tinybench, 10,000 calls per sample, no append.',
      '"same total" checks dsh\'s heuristic total equals the baseline\'s figure on the final session.',
    ].join('\n'),
    tables: [table(
      ['events', 'surface messages', 'dsh append + measure()', 'baseline append + re-estimate', 'speed-up', 'measure() alone', 'same total', 'samples × calls (dsh)'],
      rows.map((r) => [
        r.size.toLocaleString('en-US'), `≈ ${Math.round(r.size * 2 / 5).toLocaleString('en-US')}`, fmtStats(r.dsh), fmtStats(r.base),
        fmtRatio(r.base.median / r.dsh.median), fmtStats(r.alone), r.agree ? 'yes' : '**NO**', `${r.dsh.runs} × ${r.calls}`,
      ]),
    )],
  }
}
