// The replay runner behind `dsh.ts replay FILE` (issue 5, docs/design.md §8): transcripts through the meter
// and the ladder, offline. Corpus numbers (message counts, results over 8,192 code points, where they
// sit) were read off the files with python/jq — see the comment by each row — not produced by dsh.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import {
  replayTranscript, runReplay, formatReplay, readTranscript, estimateRequestTokens, Session, MemoryStore,
  TranscriptError, PRUNE_MARKER, DEFAULT_REPLAY_SUMMARY_TOKENS,
  type Message, type ReplayStep, type Transcript, type Provider, type ChatRequest, pruneToolResult
} from '../dsh.ts'

import { skipWithoutShared, readCorpus } from './shared.ts'
import { logHeader } from './spec.ts'

/** An unanchored total (docs/design.md §2, §10, §15): the offset plus the heuristic priced at the calibration. */
const unanchoredTotal = (heuristic: number, calibration: number, offset: number) =>
  offset + (calibration === 1 ? heuristic : Math.ceil(heuristic * calibration))
const codePoints = (s: string): number => { let n = 0; for (const _ of s) n++; return n }
const textOf = (m: Message): string =>
  typeof m.content === 'string' ? m.content : m.content.map(b => (b.type === 'text' ? (b as { text: string }).text : '')).join('')

/**
 * Replays and checks, at every pressure check, what must hold whatever the numbers:
 * - the measured total after the rung equals a full recount of the projected request (§2 heuristic,
 *   calibrated by the fit the session holds: docs/design.md §15),
 *   so the incremental meter and the table agree with what would be sent;
 * - after a check that started at or over the threshold, no tool result the model has seen is still
 *   over 8,192 code points (docs/design.md §3: under pressure every seen result is pruned first);
 * - only tool results over the threshold are ever pruned, and a pruned one carries the marker.
 */
async function replayChecked(t: Transcript, contextWindow: number, options: { summaryTokens?: number; compaction?: { clear?: boolean } } = {}) {
  const rows: ReplayStep[] = []
  let session!: Session
  const report = await replayTranscript(t, {
    contextWindow, ...options,
    onStep(row, s) {
      session = s
      rows.push(row)
      const messages = s.messages()
      // The ladder's total is the recount, calibrated by the fit of the recorded steps so far (the recount itself without any).
      const m = s.measure()
      assert.equal(unanchoredTotal(estimateRequestTokens(t.envelope, messages), m.calibration, m.calibrationOffsetTokens), row.afterTokens, `row ${row.kind} ${row.step}: recount`)
      if (row.beforeTokens >= Math.floor(contextWindow * 0.8)) {
        const lastAssistant = messages.map(m => m.role).lastIndexOf('assistant')
        messages.forEach((m, i) => {
          if (m.role === 'tool' && i < lastAssistant) assert.ok(codePoints(textOf(m)) <= 8192, `seen result still over the threshold after step ${row.step}`)
        })
      }
    },
  })
  assert.deepEqual(report.rows, rows)
  const prunedSeqs = session.events.filter(e => e.type === 'compaction/prune').map(e => (e.data as { shadowedSeqs: number[] }).shadowedSeqs[0])
  for (const seq of prunedSeqs) {
    const original = session.events[seq].data as { message: Message }
    const replacement = session.events.find(e => (e.data as any).surfaceOp?.op === 'replace' && (e.data as any).surfaceOp.start === seq)!
    if (original.message.role !== 'tool') {
      // An oversized assistant or user message (docs/design.md §10): some field over the threshold, cut with the marker.
      assert.ok(JSON.stringify((replacement.data as { message: Message }).message).includes(PRUNE_MARKER.trim()), `seq ${seq}: no marker`)
      continue
    }
    assert.ok(codePoints(textOf(original.message)) > 8192, `seq ${seq} was pruned though within the threshold`)
    const text = textOf((replacement.data as { message: Message }).message)
    assert.ok(text.includes(PRUNE_MARKER) && codePoints(text) === 4096 + 39 + 1024)
  }
  return { report, session, prunedSeqs }
}

const roles = (t: { messages: Message[] }) => {
  const n = { user: 0, assistant: 0, tool: 0 }
  for (const m of t.messages) n[m.role]++
  return n
}

// ── the corpus at a window of 32,000 tokens ──

interface CorpusCase {
  file: string
  roles: { user: number; assistant: number; tool: number }
  /** Tool results over 8,192 code points, read off the file. */
  overThreshold: number
  /** Expected prunes and spills at 32,000, with the reason in the comment. */
  prunes: number
  /** Oversized assistant messages pruned (over 8,192 code points in text, reasoning or a tool call's arguments). */
  messagePrunes: number
  spills: number
}

const CORPUS: CorpusCase[] = [
  // python: 71 assistant messages, 69 with exactly one ```bash block, each answered by the next user
  // message; 3 user messages left. Results over 8,192 code points at messages[63], [69], [93], [103]
  // (10,612–10,613) and [143] (868,162 code points, 868,171 UTF-8 bytes: the final `git diff`, over
  // the 256 KiB spill limit, so spilled at write time as the Agent does, never pruned). The
  // unmanaged session (no spill) reaches the 25,600-token threshold after the four mid-session ones.
  { file: 'psf__requests-1142.traj.json', roles: { user: 3, assistant: 71, tool: 69 }, overThreshold: 5, prunes: 4, messagePrunes: 0, spills: 1 },
  // python: 97 assistant, 95 with one bash block; results over 8,192 at messages[3], [11], [95], [99],
  // [105], [119], [123], [133], [137] and [195]. [195] (9,735 code points, the submitted diff) is the
  // last message: the clear rung (docs/design.md §10) keeps the surface at or below 0.6 × window, so
  // the last step (14,408 tokens) meets no pressure and [195] stays whole; the other nine are pruned.
  // One assistant message (seq 85, 3,339 tokens: a tool call whose arguments hold a whole file) is
  // pruned as well.
  { file: 'pylint-dev__pylint-6528.traj.json', roles: { user: 3, assistant: 97, tool: 95 }, overThreshold: 10, prunes: 9, messagePrunes: 1, spills: 0 },
  // jq: main chain 9 message.ids, 11 tool_result blocks, 3 user messages; largest result 2,021 code points.
  { file: 'fe5e1c67-53e7-4862-81ae-d0e013e3270b.jsonl', roles: { user: 3, assistant: 9, tool: 11 }, overThreshold: 0, prunes: 0, messagePrunes: 0, spills: 0 },
  // jq: history = system, user, 13 × (assistant + tool); largest observation 6,277 code points.
  { file: 'marshmallow-code__marshmallow-1867.function_calling_replace_from_source.traj', roles: { user: 1, assistant: 13, tool: 13 }, overThreshold: 0, prunes: 0, messagePrunes: 0, spills: 0 },
]


for (const c of CORPUS) {
  test(`corpus ${c.file} at 32,000: counts, prunes where results exceed 8,192 code points, no request over the window`,
    { skip: skipWithoutShared('corpus', c.file) }, async () => {
      const t = readTranscript(readCorpus(c.file))
      const { report } = await replayChecked(t, 32_000)
      assert.deepEqual(report.messages, c.roles)
      assert.equal(report.totals.steps, c.roles.assistant)
      assert.equal(report.rows.filter(r => r.kind === 'step').length, c.roles.assistant)
      assert.equal(report.totals.resultsOverPruneThreshold, c.overThreshold)
      // Tool-result prunes; oversized assistant messages are pruned too (docs/design.md §10), counted apart.
      const prunes = report.rows.flatMap(r => r.events).filter(e => e.type === 'prune')
      assert.equal(prunes.filter(e => e.type === 'prune' && !e.role).length, c.prunes)
      assert.equal(prunes.filter(e => e.type === 'prune' && e.role).length, c.messagePrunes)
      assert.equal(report.totals.spills, c.spills)
      assert.equal(report.totals.requestsOverWindow, 0)
      for (const r of report.rows) if (r.requestTokens !== undefined) assert.ok(r.requestTokens <= 32_000, `step ${r.step}: ${r.requestTokens}`)
      assert.ok(report.totals.peakRequestTokens <= 32_000)
      assert.equal(report.totals.summaryRequestsOverWindow, 0)
      // Not anchored: recorded usage is kept for comparison, never used as the measure.
      const recorded = t.usage.filter(u => u !== undefined).length
      assert.equal(report.rows.filter(r => r.recordedPromptTokens !== undefined).length, recorded)
    })
}

test('corpus psf__requests-1142: the pruned results are the four mid-session ones; the 868K result is spilled, then unmanaged vs managed',
  { skip: skipWithoutShared('corpus', 'psf__requests-1142.traj.json') }, async () => {
    const t = readTranscript(readCorpus('psf__requests-1142.traj.json'))
    const { report, session, prunedSeqs } = await replayChecked(t, 32_000)
    // The pruned originals are exactly the results of 10,612–10,613 code points (messages[63], [69], [93], [103]).
    const sizes = prunedSeqs.map(seq => codePoints(textOf((session.events[seq].data as { message: Message }).message))).sort()
    assert.deepEqual(sizes, [10612, 10612, 10613, 10613])
    const spill = report.rows.flatMap(r => r.events).find(e => e.type === 'spill')!
    assert.equal(spill.type === 'spill' && spill.bytes, 868_171)
    // The last step's request carries the whole unmanaged history minus what the ladder removed.
    const last = report.rows.at(-1)!
    assert.ok(last.kind === 'step' && last.unmanagedTokens > last.requestTokens!)
  })

test('corpus claude-code sidechains: runs 2 and 5 hold one result over 8,192 code points each; calibrated on a hidden prompt of 11,100–12,694 tokens, 0 requests over 32,000',
  { skip: skipWithoutShared('corpus', 'fe5e1c67-53e7-4862-81ae-d0e013e3270b.jsonl') }, async () => {
    const t = readTranscript(readCorpus('fe5e1c67-53e7-4862-81ae-d0e013e3270b.jsonl'), { sidechains: true })
    const runs = t.sidechains!
    // python over parentUuid roots: the 5 Task runs; results over 8,192: 26,746 (line 108, run 2) and 10,203 (line 357, run 5).
    assert.deepEqual(runs.map(roles), [
      { user: 1, assistant: 9, tool: 8 }, { user: 1, assistant: 34, tool: 33 }, { user: 1, assistant: 40, tool: 39 },
      { user: 1, assistant: 25, tool: 24 }, { user: 1, assistant: 53, tool: 52 },
    ])
    // Each run records its prompt tokens (input + cache); fitted on every step as offset + ratio × dsh's
    // estimate, the offset is what the file does not hold: the subagent's system prompt and tool specs.
    const FITS = [[11_588, 1.506], [11_100, 1.513], [11_387, 1.610], [12_256, 1.300], [12_694, 1.395]]
    // Requests over 16,000 in those tokens: a 16,000-token window leaves the runs 3,300–4,900 tokens
    // besides the hidden prompt; the ladder sizes its tail, the task's share, the checkpoint's budgets and
    // the summary budget by that room (docs/design.md §5 "Room"), so none is over (sized by the window,
    // with 2,000-token summaries whatever the budget: 0, 19, 30, 12, 32).
    const OVER_16K = [0, 0, 0, 0, 0]
    for (const [k, run] of runs.entries()) {
      const at32 = (await replayChecked(run, 32_000)).report
      assert.equal(at32.totals.resultsOverPruneThreshold, k === 1 || k === 4 ? 1 : 0)
      const fit = at32.totals.calibration
      assert.deepEqual([fit.offsetTokens, Math.round(fit.ratio * 1000) / 1000, fit.samples], [...FITS[k], run.messages.filter(m => m.role === 'assistant').length])
      assert.deepEqual([at32.totals.requestsOverWindow, at32.totals.calibratedRequestsOverWindow], [0, 0], `run ${k + 1}`)
      // A run meets pressure at 32,000 exactly when its calibrated unmanaged peak reaches the threshold (25,600).
      const peak = Math.max(...at32.rows.filter(r => r.kind === 'step').map(r => r.calibratedUnmanagedTokens!))
      assert.equal(at32.rows.some(r => r.rung !== 'none'), peak >= 25_600, `run ${k + 1}: calibrated unmanaged peak ${peak}`)
      const at16 = (await replayChecked(run, 16_000)).report
      assert.deepEqual([at16.totals.requestsOverWindow, at16.totals.calibratedRequestsOverWindow], [0, OVER_16K[k]], `run ${k + 1}`)
      // Tool-result prunes; run 5 also prunes two assistant messages whose Edit/MultiEdit arguments exceed 8,192 code points.
      const prunes16 = at16.rows.flatMap(r => r.events).filter(e => e.type === 'prune')
      assert.equal(prunes16.filter(e => e.type === 'prune' && !e.role).length, k === 1 || k === 4 ? 1 : 0, `run ${k + 1}`)
      assert.equal(prunes16.filter(e => e.type === 'prune' && e.role === 'assistant').length, k === 4 ? 2 : 0, `run ${k + 1}`)
    }
  })

// ── small inline transcripts with exact numbers ──

const call = (id: string, name: string, args: string) => ({ id, type: 'function', function: { name, arguments: args } })

test('a 60,000-char tool result at window 16,000: one prune, exact tokens per row (§2, §3)', async () => {
  const t = readTranscript(JSON.stringify([
    { role: 'user', content: 'read big.txt' }, // 12 chars → 3 + 8 = 11 tokens
    { role: 'assistant', content: null, tool_calls: [call('c1', 'read_file', '{"path":"big.txt"}')] }, // 9 + 18 chars → 7 + 8 = 15
    { role: 'tool', tool_call_id: 'c1', content: 'x'.repeat(60_000) }, // 15,000 + 8 = 15,008; pruned 5,159 → 1,298
    { role: 'assistant', content: 'done' }, // 1 + 8 = 9
  ]))
  const { report } = await replayChecked(t, 16_000)
  const pick = (r: ReplayStep) => [r.kind, r.step, r.turn, r.requestTokens, r.unmanagedTokens, r.beforeTokens, r.rung, r.afterTokens, r.reclaimedTokens, r.prunes, r.prunedTokens]
  assert.deepEqual(report.rows.map(pick), [
    ['turn-start', 1, 1, undefined, 11, 11, 'none', 11, 0, 0, 0],
    // 11 + 15 + 15,008 = 15,034 ≥ 12,800: the newest result is pruned (no older one to prune first).
    ['step', 1, 1, 11, 11, 15_034, 'prune', 1_324, 13_710, 1, 13_710],
    ['step', 2, 1, 1_324, 15_034, 1_333, 'none', 1_333, 0, 0, 0],
  ])
  assert.deepEqual(report.rows[1].events, [{ type: 'prune', seq: 7, tokensBefore: 15_008, tokensAfter: 1_298 }])
  assert.equal(report.thresholdTokens, 12_800)
  const { rows: _, ...rest } = report
  assert.deepEqual(rest.totals, {
    steps: 2, turns: 1, peakRequestTokens: 1_324, peakPercent: 8.3, prunes: 1, prunedTokens: 13_710, spills: 0,
    compactions: 0, failedCompactions: 0, summaryCalls: 0, requestsOverWindow: 0, unmanagedStepsOverWindow: 0,
    // No recorded prompt tokens: the calibrated figures are the §2 ones (the seed's formula).
    calibratedRequestsOverWindow: 0, peakCalibratedRequestTokens: 1_324, calibratedUnmanagedStepsOverWindow: 0, calibration: { ratio: 1, offsetTokens: 0, samples: 0 },
    peakUnmanagedTokens: 15_034, peakSummaryRequestTokens: 0, summaryRequestsOverWindow: 0, resultsOverPruneThreshold: 1, ladderWarnings: 0,
    rungs: { prune: 1 }, rungReclaimedTokens: { prune: 13_710 }, figures: { rereads: 0 },
    // deepseek-flash off-peak, modelled hits: request 2 hits the input (11) its predecessor sent; outputs 15 + 9.
    cost: {
      dsh: { requests: 2, summaryRequests: 0, inputTokens: 11 + 1_324, cachedInputTokens: 11, cacheHitShare: 11 / 1_335, outputTokens: 24, costUSD: (11 * 0.003 + 1_324 * 0.15 + 24 * 0.6) / 1e6 },
      unmanaged: { requests: 2, summaryRequests: 0, inputTokens: 11 + 15_034, cachedInputTokens: 11, cacheHitShare: 11 / 15_045, outputTokens: 24, costUSD: (11 * 0.003 + 15_034 * 0.15 + 24 * 0.6) / 1e6 },
    },
  })
  assert.deepEqual(rest.summaries, { simulated: true, tokens: DEFAULT_REPLAY_SUMMARY_TOKENS })
})

/** user 'task' (9 tokens), then `steps` steps of a call `sh {}` (2 + 2 chars → 9 tokens) and a 2,000-char result (508). */
function mediumSteps(steps: number, extra: object[] = []): Transcript {
  const messages: object[] = [{ role: 'user', content: 'task' }]
  for (let i = 1; i <= steps; i++) {
    messages.push({ role: 'assistant', content: null, tool_calls: [call(`c${i}`, 'sh', '{}')] })
    messages.push({ role: 'tool', tool_call_id: `c${i}`, content: String(i % 10).repeat(2000) })
  }
  return readTranscript(JSON.stringify([...messages, ...extra]))
}

test('medium results at window 4,000: one simulated compaction of exact size, tail and pairs kept', async () => {
  // After step k the total is 9 + 517k: 3,111 at k = 6, 3,628 at k = 7 ≥ threshold 3,200. Nothing to
  // prune (2,000 chars < 8,192), so compact: retained tail 640 → kept r7, a7, r6 (1,025), the cut moved
  // before a6 so r6 keeps its call; the pinned input (head) stays; region a1..r5 = 10 messages, 2,585
  // tokens → checkpoint of 98 (preamble) + 21 + 400 (summary, 100 tokens) + 21 = 540 chars → 143 tokens.
  // After: 9 + 143 + 2 × 517 = 1,186. Step 8 ("done", 9 tokens) is requested at 1,186.
  const t = mediumSteps(7, [{ role: 'assistant', content: 'done' }])
  const { report, session } = await replayChecked(t, 4_000, { summaryTokens: 100, compaction: { clear: false } })
  const steps = report.rows.filter(r => r.kind === 'step')
  assert.deepEqual(steps.map(r => r.requestTokens), [9, 526, 1_043, 1_560, 2_077, 2_594, 3_111, 1_186])
  assert.deepEqual(steps.map(r => r.rung), ['none', 'none', 'none', 'none', 'none', 'none', 'compact', 'none'])
  const s7 = steps[6]
  assert.deepEqual([s7.beforeTokens, s7.afterTokens, s7.reclaimedTokens, s7.summaryCalls, s7.prunes], [3_628, 1_186, 2_442, 1, 0])
  assert.deepEqual(s7.events, [{ type: 'compaction', id: 'k38', messages: 10, firstSeq: 5, lastSeq: 27, tokensBefore: 2_585, tokensAfter: 143, totalBefore: 3_628, totalAfter: 1_186 }])
  assert.deepEqual(session.messages().map(m => m.role), ['user', 'user', 'assistant', 'tool', 'assistant', 'tool', 'assistant'])
  assert.equal(session.messages()[0].content, 'task')
  assert.equal(report.totals.compactions, 1)
  assert.equal(report.totals.summaryCalls, 1)
  assert.equal(report.totals.unmanagedStepsOverWindow, 0) // the unmanaged peak, step 8: 9 + 7 × 517 = 3,628 ≤ 4,000
  assert.equal(report.totals.peakUnmanagedTokens, 3_628)
})

test('a real summarizer is called (x-dsh-purpose: compaction) instead of the simulation, and named in the output', async () => {
  const seen: ChatRequest[] = []
  const summarizer: Provider = {
    model: 'test-model', baseURL: 'memory://test', maxTokens: 500, contextWindow: 4_000,
    async complete(req) { seen.push(req); return { message: { role: 'assistant', content: [{ type: 'text', text: 'S'.repeat(40) }] }, finishReason: 'stop' } },
  }
  const t = mediumSteps(7)
  const report = await replayTranscript(t, { summarizer, compaction: { clear: false } })
  assert.equal(report.contextWindow, 4_000) // from the summarizer when none is given
  assert.equal(seen.length, 1)
  assert.equal(seen[0].headers?.['x-dsh-purpose'], 'compaction')
  // 98 + 21 + 40 + 21 = 180 chars → 45 + 8 = 53 tokens.
  assert.equal(report.rows.flatMap(r => r.events).find(e => e.type === 'compaction')?.tokensAfter, 53)
  assert.deepEqual(report.summaries, { simulated: false, model: 'test-model' })
  const out = formatReplay(report)
  assert.ok(out.includes('summaries written by the model test-model'))
  assert.ok(!out.includes('simulated'))
})

test('recorded usage calibrates, never anchors: a transcript reporting 900,000 prompt tokens is over a 1,000-token window in its own tokens', async () => {
  const t = readTranscript(JSON.stringify([
    { role: 'user', content: 'hi' }, // 1 + 8 = 9
    { role: 'assistant', content: 'hello', usage: { prompt_tokens: 900_000, completion_tokens: 5 } }, // 2 + 8 = 10
    { role: 'user', content: 'bye' }, // 1 + 8 = 9
    { role: 'assistant', content: 'ok', usage: { prompt_tokens: 900_020, completion_tokens: 1 } },
  ]))
  let anchored: boolean | undefined
  const report = await replayTranscript(t, { contextWindow: 1_000, onStep: (_r, s) => { anchored ||= s.measure().anchored } })
  const steps = report.rows.filter(r => r.kind === 'step')
  assert.deepEqual(steps.map(r => [r.requestTokens, r.recordedPromptTokens]), [[9, 900_000], [28, 900_020]])
  // Step 1: one sample, the seed's ratio 1 and the rest as offset (899,991); step 2: least squares through
  // (9, 900,000) and (28, 900,020): ratio 20/19, offset 899,991.
  assert.deepEqual(steps.map(r => r.calibratedRequestTokens), [900_000, 899_991 + Math.ceil(28 * 20 / 19)])
  assert.deepEqual(report.totals.calibration, { ratio: 20 / 19, offsetTokens: 899_991, samples: 2 })
  assert.equal(report.totals.peakRecordedPromptTokens, 900_020)
  assert.deepEqual([report.totals.requestsOverWindow, report.totals.calibratedRequestsOverWindow, report.totals.calibratedUnmanagedStepsOverWindow], [0, 2, 2])
  assert.equal(anchored, false)
  assert.deepEqual(report.rows.map(r => [r.kind, r.turn]), [['turn-start', 1], ['step', 1], ['turn-start', 2], ['step', 2]])
  const out = formatReplay(report)
  assert.ok(out.includes('fitted by least squares on the "recorded" prompt tokens of the steps so far'))
  assert.match(out, /^ {2}requests over the window, dsh +0 by the estimate, 2 calibrated$/m)
  assert.match(out, /^ {2}calibration +899,991 tokens \+ 1\.053 × dsh's estimate \(least squares on 2 recorded steps\)$/m)
})

test('a dsh log: surface events as written, turns from turn/start (steering opens none), window from the header', async () => {
  const session = await Session.open(new MemoryStore(), { id: 'log' })
  logHeader(session, { model: 'm', baseURL: 'b', system: 'sys', contextWindow: 2_000 })
  const add = (type: string, data: object) => session.append(type, data as Record<string, unknown>)
  add('turn/start', { turn: 1 })
  add('user/message', { message: { role: 'user', content: 'go' }, surfaceOp: { op: 'append' } })
  add('step/start', { turn: 1, step: 1 })
  add('assistant/message', { message: { role: 'assistant', content: [{ type: 'tool-call', id: 'a', name: 'sh', arguments: '{}' }] }, finishReason: 'tool_calls', surfaceOp: { op: 'append' } })
  add('tool/result', { message: { role: 'tool', toolCallId: 'a', content: [{ type: 'text', text: 'y'.repeat(9_000) }] }, surfaceOp: { op: 'append' } })
  add('user/message', { message: { role: 'user', content: 'steer' }, surfaceOp: { op: 'append' } }) // steering, no turn/start
  pruneToolResult(session, 6, undefined, 'pressure') // a replace in the recorded run: skipped, the original replayed
  add('step/end', { turn: 1, step: 1 })
  add('step/start', { turn: 1, step: 2 })
  add('assistant/message', { message: { role: 'assistant', content: [{ type: 'text', text: 'done' }] }, finishReason: 'stop', surfaceOp: { op: 'append' } })
  add('step/end', { turn: 1, step: 2 })
  add('turn/end', { turn: 1, reason: 'stop' })
  add('turn/start', { turn: 2 })
  add('user/message', { message: { role: 'user', content: 'again' }, surfaceOp: { op: 'append' } })
  const text = session.events.map(e => JSON.stringify(e)).join('\n') + '\n'
  const t = readTranscript(text)
  assert.deepEqual(t.turnStarts, [0, 5]) // go, assistant, tool, steer, done, again
  assert.equal(t.contextWindow, 2_000)
  const { report } = await replayChecked(t, t.contextWindow!)
  assert.equal(report.format, 'dsh')
  // sys: 1 + 8 = 9; 'go' 9; call 'sh'+'{}' 9; result 2,250 + 8 = 2,258 → 1,298 pruned; 'steer' 2 + 8 = 10; 'done' 9; 'again' 10.
  assert.deepEqual(report.rows.map(r => [r.kind, r.turn, r.requestTokens ?? null, r.beforeTokens, r.rung, r.afterTokens]), [
    ['turn-start', 1, null, 18, 'none', 18],
    // The steering message (10) is appended after the step's results and before its pressure check,
    // as the loop drains steering: 18 + 9 + 2,258 + 10 = 2,295. The result is the newest step's,
    // pruned since nothing older helps: 2,295 − 960 = 1,335.
    ['step', 1, 18, 2_295, 'prune', 1_335],
    ['step', 1, 1_335, 1_344, 'none', 1_344],
    ['turn-start', 2, null, 1_354, 'none', 1_354],
  ])
})

test('formatReplay: aligned text table with events and totals; JSONL with one object per row and a totals object', async () => {
  const text = JSON.stringify([
    { role: 'user', content: 'read big.txt' },
    { role: 'assistant', content: null, tool_calls: [call('c1', 'read_file', '{"path":"big.txt"}')] },
    { role: 'tool', tool_call_id: 'c1', content: 'x'.repeat(60_000) },
    { role: 'assistant', content: 'done' },
  ])
  const t = readTranscript(text)
  const { report, output } = await runReplay(text, { contextWindow: 16_000, name: 'big.json' })
  assert.deepEqual(report.rows, (await replayTranscript(t, { contextWindow: 16_000 })).rows)
  const lines = output.split('\n')
  assert.ok(lines[0].startsWith('dsh replay of big.json: openai, 4 messages (1 user, 2 assistant, 1 tool results), 1 turn(s), 2 step(s)'))
  assert.ok(output.includes('summaries simulated at 2,000 tokens each (no model was called)'))
  // No recorded prompt tokens: no calibrated column; the rereads figure is one (docs/design.md §15).
  const head = lines.findIndex(l => /^ *step +turn +request +unmanaged +recorded +before +rung +after +reclaimed +rereads$/.test(l))
  assert.ok(head > 0, output)
  assert.deepEqual(lines.slice(head + 1, head + 5), [
    'input     1        -         11         -      11  none      11          0        0',
    '    1     1       11         11         -  15,034  prune  1,324     13,710        0',
    '       ↳ prune    tool result seq 7: 15,008 → 1,298 tokens',
    '    2     1    1,324     15,034         -   1,333  none   1,333          0        0',
  ])
  assert.ok(/^ {2}prunes +1 \(13,710 tokens reclaimed by pruning\)$/m.test(output))
  assert.ok(/^ {2}peak request +1,324 tokens \(8\.3% of 16,000\)$/m.test(output))
  assert.ok(/^ {2}requests over the window, dsh +0$/m.test(output))

  const json = (await runReplay(JSON.stringify([{ role: 'user', content: 'a' }, { role: 'assistant', content: 'b' }]), { contextWindow: 100, json: true })).output
  const objects = json.trimEnd().split('\n').map(l => JSON.parse(l))
  assert.deepEqual(objects.map(o => o.kind), ['turn-start', 'step', 'totals'])
  assert.equal(objects[2].steps, 1)
  assert.equal(objects[2].contextWindow, 100)
  assert.deepEqual(objects[2].summaries, { simulated: true, tokens: 2000 })
})

test('bad input: a non-transcript is a TranscriptError with its line; bad options are RangeErrors naming the fix', async () => {
  await assert.rejects(runReplay('hello\n', { contextWindow: 100 }), (e: unknown) => e instanceof TranscriptError && e.line === 1)
  const t = readTranscript(JSON.stringify([{ role: 'user', content: 'a' }]))
  await assert.rejects(replayTranscript(t), /does not say its context window; pass contextWindow \(CLI: --context-window N, e.g. 128000\)/)
  await assert.rejects(replayTranscript(t, { contextWindow: 1.5 }), RangeError)
  await assert.rejects(replayTranscript(t, { contextWindow: 100, thresholdRatio: 1.5 }), /thresholdRatio must be a number in \(0, 1\]/)
  await assert.rejects(replayTranscript(t, { contextWindow: 100, summaryTokens: 0 }), /summaryTokens must be a positive integer/)
})

test('cancellation: an aborted signal stops the replay with its reason', async () => {
  const ac = new AbortController()
  ac.abort(new Error('stop here'))
  await assert.rejects(replayTranscript(mediumSteps(2), { contextWindow: 4_000, signal: ac.signal }), /stop here/)
})
