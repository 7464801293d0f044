// Replay in the transcript's own tokens (docs/design.md §15): where a transcript records prompt tokens,
// the replay's session fits them as offset + ratio × dsh's estimate of the same unmanaged prompt, from
// the steps seen so far (calibration samples `ladder/state {source: 'transcript'}`), and every ladder
// decision is made on the calibrated total.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { readTranscript, replayTranscript, runReplay, type ReplayStep } from '../dsh.ts'
import { ladderTuned } from './tuning.ts'

const call = (id: string) => ({ id, type: 'function', function: { name: 'sh', arguments: '{}' } })

/**
 * 'task' (9 tokens by §2), then `steps` steps of a call `sh {}` (9) and a 2,000-character result (508):
 * the unmanaged request of step k is 9 + 517 (k − 1) tokens by dsh's estimate; the file records
 * `recorded(estimate)` prompt tokens for it.
 */
function transcript(steps: number, recorded?: (estimate: number) => number): string {
  const messages: object[] = [{ role: 'user', content: 'task' }]
  for (let k = 1; k <= steps; k++) {
    const usage = recorded ? { usage: { prompt_tokens: recorded(9 + 517 * (k - 1)), completion_tokens: 3 } } : {}
    messages.push({ role: 'assistant', content: null, tool_calls: [call(`c${k}`)], ...usage })
    messages.push({ role: 'tool', tool_call_id: `c${k}`, content: String(k % 10).repeat(2_000) })
  }
  messages.push({ role: 'assistant', content: 'done' })
  return JSON.stringify(messages)
}

test('recorded = 2,000 + 1.3 × the estimate: the fit is within 2% of both from the third step, pressure fires on the calibrated total, no calibrated request is over the window', async () => {
  const fits: Array<{ step: number; ratio: number; offset: number }> = []
  const report = await replayTranscript(readTranscript(transcript(30, (e) => Math.round(2_000 + 1.3 * e))), {
    contextWindow: 16_000,
    onStep(row, session) {
      const m = session.measure()
      if (row.kind === 'step') fits.push({ step: row.step, ratio: m.calibration, offset: m.calibrationOffsetTokens })
    },
  })
  // One step seen: the seed's ratio (1), the offset takes the rest; the step's own count is met exactly.
  assert.deepEqual(fits[0], { step: 1, ratio: 1, offset: 2_012 - 9 })
  const steps = report.rows.filter((r) => r.kind === 'step')
  assert.equal(steps[0].calibratedRequestTokens, 2_012)
  for (const f of fits.filter((x) => x.step >= 3)) {
    assert.ok(Math.abs(f.ratio - 1.3) <= 0.026 && Math.abs(f.offset - 2_000) <= 40, `step ${f.step}: ${f.offset} + ${f.ratio} × estimate`)
  }
  // Calibrated, the surface after step k (9 + 517 k by §2) reaches the threshold (12,800) at k = 17
  // (2,000 + 1.3 × 8,798 = 13,437), the estimate alone only at k = 25 (12,934).
  const first = steps.find((r) => r.rung !== 'none')!
  assert.equal(first.step, 17)
  assert.ok(first.beforeTokens >= 12_800 && first.beforeTokens <= 13_437 + 10, `before ${first.beforeTokens}`)
  assert.ok(first.afterTokens < 12_800, `after ${first.afterTokens}`)
  // (Pressure only: the net-cost gate's own edits below the threshold, which start at step 24 here, are off.)
  const heuristicOnly = await ladderTuned({ gate: false }, () => replayTranscript(readTranscript(transcript(30)), { contextWindow: 16_000 }))
  assert.equal(heuristicOnly.rows.find((r) => r.kind === 'step' && r.rung !== 'none')!.step, 25)
  // Every request in the transcript's tokens stays under the window; unmanaged, 10 would not (steps 22–31).
  assert.deepEqual([report.totals.calibratedRequestsOverWindow, report.totals.requestsOverWindow], [0, 0])
  assert.ok(report.totals.peakCalibratedRequestTokens <= 16_000)
  assert.equal(report.totals.calibratedUnmanagedStepsOverWindow, steps.filter((r) => r.calibratedUnmanagedTokens! > 16_000).length)
  assert.equal(report.totals.calibratedUnmanagedStepsOverWindow, 10)
  assert.deepEqual([report.totals.calibration.offsetTokens, Math.round(report.totals.calibration.ratio * 1000) / 1000, report.totals.calibration.samples], [2_000, 1.3, 30])
})

test('no recorded prompt tokens: the seed formula exactly (calibrated = the estimate), and no calibrated column', async () => {
  const report = await replayTranscript(readTranscript(transcript(8)), { contextWindow: 16_000 })
  const steps = report.rows.filter((r) => r.kind === 'step')
  assert.deepEqual(steps.map((r) => r.calibratedRequestTokens), steps.map((r) => r.requestTokens))
  assert.deepEqual(steps.map((r: ReplayStep) => r.beforeTokens).slice(0, 3), [526, 1_043, 1_560])
  assert.deepEqual(report.totals.calibration, { ratio: 1, offsetTokens: 0, samples: 0 })
  assert.equal(report.totals.cost.calibrated, undefined)
  const { output } = await runReplay(transcript(8), { contextWindow: 16_000 })
  assert.match(output, /^ step +turn +request +unmanaged +recorded +before/m)
  assert.ok(output.includes('the transcript records no prompt tokens to calibrate it on'))
})

test('--json totals carry the calibrated figures, the fit, and the cost in the transcript\'s tokens (the floor in the same units)', async () => {
  const { output } = await runReplay(transcript(30, (e) => Math.round(2_000 + 1.3 * e)), { contextWindow: 16_000, json: true })
  const totals = JSON.parse(output.trimEnd().split('\n').at(-1)!)
  assert.equal(totals.kind, 'totals')
  assert.equal(totals.calibratedRequestsOverWindow, 0)
  assert.equal(totals.calibration.offsetTokens, 2_000)
  const { dsh, unmanaged } = totals.cost.calibrated
  // The floor: 31 appends-only requests (30 steps and 'done') of 9 + 517 (k − 1) tokens by the estimate, priced by the final fit.
  const { ratio, offsetTokens } = totals.calibration
  let input = 0
  for (let k = 1; k <= 31; k++) input += offsetTokens + Math.ceil((9 + 517 * (k - 1)) * ratio)
  assert.deepEqual([unmanaged.requests, unmanaged.inputTokens], [31, input])
  assert.ok(dsh.inputTokens < unmanaged.inputTokens && dsh.costUSD > 0)
})

// ── rereads (docs/design.md §15) ──

/**
 * 'task', a read of a.ts (2,000 characters back), a repeat of it at once, five filler steps of 2,000
 * characters, then `last` (a call and its output) and 'done'. At window 4,000 with 100-token summaries
 * and no clear rung, the ladder compacts once after step 7 (see replay.test.ts), the reads inside.
 */
function rereadTranscript(last: { command: string; output: string }): string {
  const A = 'export const a = 1\n'.repeat(105).slice(0, 2_000)
  const step = (id: string, command: string, output: string) => [
    { role: 'assistant', content: null, tool_calls: [{ id, type: 'function', function: { name: 'bash', arguments: JSON.stringify({ command }) } }] },
    { role: 'tool', tool_call_id: id, content: output },
  ]
  return JSON.stringify([
    { role: 'user', content: 'task' },
    ...step('r1', 'cat a.ts', A), ...step('r2', 'cat a.ts', A), // a repeat before any compaction is no reread
    ...[3, 4, 5, 6, 7].flatMap((k) => step(`f${k}`, `ls dir${k}`, String(k).repeat(2_000))),
    ...step('r8', last.command, last.output.replace('A', A)),
    { role: 'assistant', content: 'done' },
  ])
}

test('rereads: the same call and output before and after a compaction is 1; the output changed, 0; a shell read of the same file by another command, 1', async () => {
  const replay = async (last: { command: string; output: string }) => {
    const report = await replayTranscript(readTranscript(rereadTranscript(last)), { contextWindow: 4_000, summaryTokens: 100, compaction: { clear: false } })
    const compact = report.rows.find((r) => r.rung === 'compact')!
    assert.equal(report.totals.compactions, 1)
    assert.ok(compact.step >= 6 && compact.step <= 7, `compacted after step ${compact.step}`)
    const first = report.rows.flatMap((r) => r.events).find((e) => e.type === 'compaction')!
    assert.ok(first.type === 'compaction' && first.firstSeq <= 8, 'the reads are in the region')
    return report
  }
  const same = await replay({ command: '  cat   a.ts ', output: 'A' })
  assert.equal(same.totals.figures!.rereads, 1)
  assert.deepEqual(same.rows.filter((r) => r.figures!.rereads > 0).map((r) => [r.kind, r.step]), [['step', 8]])
  assert.equal((await replay({ command: 'cat a.ts', output: 'A // edited since' })).totals.figures!.rereads, 0)
  assert.equal((await replay({ command: 'sed -n 1,200p a.ts', output: 'A' })).totals.figures!.rereads, 1)
  assert.equal((await replay({ command: 'cat b.ts', output: 'A' })).totals.figures!.rereads, 0)
  // In the table (a column) and in --json (per row and in the totals).
  const { output } = await runReplay(rereadTranscript({ command: 'cat a.ts', output: 'A' }), { contextWindow: 4_000, summaryTokens: 100, compaction: { clear: false } })
  assert.match(output, /^ *step +turn +request +unmanaged +recorded +before +rung +after +reclaimed +rereads$/m)
  assert.match(output, /^ {2}rereads +1$/m)
  const json = (await runReplay(rereadTranscript({ command: 'cat a.ts', output: 'A' }), { contextWindow: 4_000, summaryTokens: 100, compaction: { clear: false }, json: true })).output
  const lines = json.trimEnd().split('\n').map((l) => JSON.parse(l))
  assert.equal(lines.at(-1).figures.rereads, 1)
  assert.equal(lines.filter((l) => l.kind === 'step').reduce((n: number, l: { figures: { rereads: number } }) => n + l.figures.rereads, 0), 1)
})

test('the simulated summarizer honours a summary request\'s max_tokens, as a server does: a 300-token budget gets a 300-token summary, not the 2,000 of --summary-tokens', async () => {
  const summaries = new Set<string>()
  const report = await ladderTuned({ summaryMaxTokens: 300, gate: false }, () => replayTranscript(readTranscript(transcript(30)), {
    contextWindow: 16_000, compaction: { clear: false },
    onStep(_row, session) {
      for (const n of session.surface()) {
        const text = typeof n.message.content === 'string' ? n.message.content : ''
        const summary = /\[simulated checkpoint of \d+ message\(s\)[^\n]*/.exec(text)
        if (summary) summaries.add(summary[0])
      }
    },
  }))
  assert.ok(report.totals.summaryCalls >= 1, `summary calls ${report.totals.summaryCalls}`)
  assert.ok(summaries.size >= 1)
  // 300 tokens by §2 are 1,200 UTF-16 units.
  for (const s of summaries) assert.equal(s.length, 1_200)
})

test('a hidden prompt of 12,000 tokens in a 16,000-token window: the ladder sizes its tail, task share, ledger and summary budget by the room the history has, and no calibrated request is over the window', async () => {
  // 'task', then 40 steps of `sh {}` and an 800-character result (209 tokens by §2); the run records 12,000 + 1.4 × the estimate.
  const messages: object[] = [{ role: 'user', content: 'task' }]
  for (let k = 1; k <= 40; k++) {
    const estimate = 9 + 209 * (k - 1)
    messages.push({ role: 'assistant', content: null, tool_calls: [call(`c${k}`)], usage: { prompt_tokens: Math.round(12_000 + 1.4 * estimate), completion_tokens: 3 } })
    messages.push({ role: 'tool', tool_call_id: `c${k}`, content: String(k % 10).repeat(800) })
  }
  messages.push({ role: 'assistant', content: 'done' })
  const t = readTranscript(JSON.stringify(messages))
  // The history has 16,000 − 12,000 = 4,000 tokens of room (the envelope is unknown: 0), so the kept window is
  // 16,000 × (2 × 4,000 ÷ 16,000)² = 4,000 and the retained tail 640 tokens (457 by §2). Sized by the window (a
  // 2,560-token tail, 1,828 by §2, and a checkpoint of up to 2,000), 26 requests went over (20 with clear off).
  for (const [compaction, summaries] of [[{}, 12], [{ clear: false }, 12]] as const) {
    const report = await ladderTuned({ gate: false }, () => replayTranscript(t, { contextWindow: 16_000, compaction }))
    assert.equal(report.totals.calibratedRequestsOverWindow, 0, JSON.stringify(compaction))
    assert.ok(report.totals.peakCalibratedRequestTokens <= 16_000, `peak ${report.totals.peakCalibratedRequestTokens}`)
    assert.equal(report.totals.summaryCalls, summaries, JSON.stringify(compaction))
  }
})
