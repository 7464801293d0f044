// Replay runs the real Agent (docs/design.md §8): a recorded provider and recorded tools drive the
// loop, and the report is read off the Agent's events. These tests hold replay to the live loop's
// log, and show that a new ladder rung or an extra figure reaches the report with no replay change.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { spawnSync } from 'node:child_process'
import { fileURLToPath } from 'node:url'
import {
  Agent, Session, MemoryStore, readTranscript, replayTranscript, runReplay, formatReplay, cliHelp,
  type AgentEvent, type Message, type Provider, type ReplayFigure, type SessionEvent, type Tool,
} from '../dsh.ts'

import { ScriptedProvider, call, say } from './scripted-provider.ts'
import { skipWithoutShared, sharedPath } from './shared.ts'
import { startFakeProvider } from './fake-provider.ts'
import { dsh as dshChild, tempDir } from './cli-helpers.ts'
import { writeFile } from 'node:fs/promises'
import { join } from 'node:path'
import { logHeader } from './spec.ts'

const fn = (id: string, name: string, args: string) => ({ id, type: 'function', function: { name, arguments: args } })

/** The log of a session without what differs by construction (time, the model's name in the header). */
const shape = (events: readonly SessionEvent[]) => events.filter((e) => e.type !== 'session/start').map((e) => {
  const d = { ...(e.data as Record<string, unknown>) }
  if (e.type === 'request/header') return { type: e.type, system: d.system, tools: d.tools, contextWindow: d.contextWindow }
  delete d.finishReason
  delete d.usage
  return { type: e.type, ...d }
})

test('the replay log is the live loop\'s log: same events in the same order for the same conversation', async () => {
  // Turn 1: a call, its result, steering typed while the tool ran, the answer. Turn 2: a plain answer.
  const t = readTranscript(JSON.stringify({ tools: [{ type: 'function', function: { name: 'sh', description: 'run', parameters: {} } }], messages: [
    { role: 'user', content: 'task' },
    { role: 'assistant', content: null, tool_calls: [fn('c1', 'sh', '{"cmd":"ls"}')] },
    { role: 'tool', tool_call_id: 'c1', content: 'a.txt\nb.txt' },
    { role: 'user', content: 'also check c' },
    { role: 'assistant', content: 'done' },
    { role: 'user', content: 'next' },
    { role: 'assistant', content: 'ok' },
  ] }))
  let replayed!: Session
  const report = await replayTranscript(t, { contextWindow: 10_000, onStep: (_row, s) => { replayed = s } })
  assert.deepEqual(report.rows.map((r) => [r.kind, r.turn, r.step]), [['turn-start', 1, 1], ['step', 1, 1], ['step', 1, 2], ['turn-start', 2, 3], ['step', 2, 3]])
  assert.equal(report.totals.turns, 2)

  // The same conversation, live: a scripted model, a tool that returns the recorded output and
  // during which the user steers.
  const live = await Session.open(new MemoryStore(), { id: 'live' })
  const provider = new ScriptedProvider(10_000, [call('c1', 'sh', { cmd: 'ls' }), say('done'), say('ok')])
  let agent!: Agent
  const sh: Tool = { name: 'sh', description: 'run', parameters: {}, execute: () => { agent.steer('also check c'); return 'a.txt\nb.txt' } }
  agent = new Agent({ session: live, provider, tools: [sh] })
  await agent.run('task')
  await agent.run('next')
  assert.deepEqual(shape(replayed.events), shape(live.events))
  assert.deepEqual(replayed.messages(), live.messages())
})

test('a turn the transcript ends while the loop would go on ends as cancelled; no step is invented', async () => {
  const t = readTranscript(JSON.stringify([
    { role: 'user', content: 'go' },
    { role: 'assistant', content: null, tool_calls: [fn('c1', 'sh', '{}')] },
    { role: 'tool', tool_call_id: 'c1', content: 'out' },
  ]))
  const ends: unknown[] = []
  const report = await replayTranscript(t, {
    contextWindow: 1_000,
    onEvent: (e: AgentEvent) => { if (e.type === 'log' && e.event.type === 'turn/end') ends.push(e.event.data) },
  })
  assert.deepEqual(report.rows.map((r) => r.kind), ['turn-start', 'step'])
  assert.equal(report.totals.steps, 1)
  assert.deepEqual(ends, [{ turn: 1, reason: 'aborted' }])
})

test('a dsh log whose next turn starts after a step with tool calls: the loop ends the turn there, as the log did', async () => {
  const session = await Session.open(new MemoryStore(), { id: 'log' })
  logHeader(session, { model: 'm', baseURL: 'b', contextWindow: 1_000 })
  const add = (type: string, data: object) => session.append(type, data as Record<string, unknown>)
  add('turn/start', { turn: 1 })
  add('user/message', { message: { role: 'user', content: 'go' }, surfaceOp: { op: 'append' } })
  add('step/start', { turn: 1, step: 1 })
  add('assistant/message', { message: { role: 'assistant', content: [{ type: 'tool-call', id: 'a', name: 'sh', arguments: '{}' }] }, finishReason: 'tool_calls', surfaceOp: { op: 'append' } })
  add('tool/result', { message: { role: 'tool', toolCallId: 'a', content: [{ type: 'text', text: 'x' }] }, surfaceOp: { op: 'append' } })
  add('step/end', { turn: 1, step: 1 })
  add('turn/end', { turn: 1, reason: 'aborted' }) // Ctrl-C
  add('turn/start', { turn: 2 })
  add('user/message', { message: { role: 'user', content: 'instead do y' }, surfaceOp: { op: 'append' } })
  add('step/start', { turn: 2, step: 1 })
  add('assistant/message', { message: { role: 'assistant', content: [{ type: 'text', text: 'y' }] }, finishReason: 'stop', surfaceOp: { op: 'append' } })
  const t = readTranscript(session.events.map((e) => JSON.stringify(e)).join('\n') + '\n')
  const report = await replayTranscript(t)
  assert.deepEqual(report.rows.map((r) => [r.kind, r.turn]), [['turn-start', 1], ['step', 1], ['turn-start', 2], ['step', 2]])
})

test('a new compaction/* event type is a rung of its own, and an extra figure is a column, with no change to replay', async () => {
  // 7 steps of 2,000-char results at window 4,000 compact once (see replay.test.ts); the summarizer
  // here also logs a `compaction/evict` event (seq 46, right after compaction/start k45: each of the seven
  // recorded counts before it is a calibration sample in the log, `ladder/state`), as a rung
  // not yet written would; the real clear rung is off so that only the fake one acts.
  const messages: object[] = [{ role: 'user', content: 'task' }]
  for (let i = 1; i <= 7; i++) {
    // Recorded prompt tokens equal to dsh's estimate of each unmanaged request (9 + 517 per step before it): the
    // calibration fits ratio 1, offset 0, so the ladder acts where the estimate alone would.
    messages.push({ role: 'assistant', content: null, tool_calls: [fn(`c${i}`, 'sh', '{}')], usage: { prompt_tokens: 9 + 517 * (i - 1), completion_tokens: 10 + i } })
    messages.push({ role: 'tool', tool_call_id: `c${i}`, content: String(i).repeat(2000) })
  }
  let session: Session | undefined
  const summarizer: Provider = {
    model: 'test-summarizer', baseURL: 'memory://s', contextWindow: 4_000, maxTokens: 100,
    async complete() {
      session!.append('compaction/evict', { shadowedSeqs: [7, 11, 15], shadowedTokenCount: 1_524 })
      return { message: { role: 'assistant', content: [{ type: 'text', text: 'S'.repeat(40) }] }, finishReason: 'stop' }
    },
  }
  // The completion tokens the transcript records, summed: read off the recorded usage stream event.
  const completion: ReplayFigure = {
    name: 'completion', total: 'sum', cell: (v) => String(v),
    add: (e, v) => (e.type === 'stream' && e.event.type === 'usage' ? v + e.event.usage.completionTokens : v),
  }
  const t = readTranscript(JSON.stringify(messages))
  const report = await replayTranscript(t, { summarizer, figures: [completion], compaction: { clear: false }, onEvent: () => {}, onStep: (_r, s) => { session = s } } as Parameters<typeof replayTranscript>[1])
  const compacted = report.rows.find((r) => r.rung === 'compact')!
  assert.deepEqual(compacted.events.map((e) => e.type), ['rung', 'compaction'])
  assert.deepEqual(compacted.events[0], { type: 'rung', rung: 'evict', seq: 46, data: { shadowedSeqs: [7, 11, 15], shadowedTokenCount: 1_524 } })
  assert.deepEqual(report.totals.rungs, { evict: 1, compact: 1 })
  assert.deepEqual(report.rows.filter((r) => r.kind === 'step').map((r) => r.figures!.completion), [11, 12, 13, 14, 15, 16, 17])
  assert.equal(report.totals.figures!.completion, 98)
  const out = formatReplay(report, { figures: [completion] })
  assert.deepEqual(report.totals.calibration, { ratio: 1, offsetTokens: 0, samples: 7 })
  assert.match(out, /^ *step +turn +request +calibrated +unmanaged +recorded +before +rung +after +reclaimed +rereads +completion$/m)
  assert.match(out, /↳ evict +seq 46: shadowedSeqs 7\.\.15 \(3\), shadowedTokenCount 1,524$/m)
  assert.match(out, /^ {2}rung evict +1$/m)
  assert.match(out, /^ {2}completion +98$/m)
  const json = (await runReplay(JSON.stringify(messages.slice(0, 3)), { contextWindow: 4_000, json: true, figures: [completion] })).output
  const objects = json.trimEnd().split('\n').map((l) => JSON.parse(l))
  assert.deepEqual(objects.map((o) => o.figures), [{ rereads: 0, completion: 0 }, { rereads: 0, completion: 11 }, { rereads: 0, completion: 11 }])
  await assert.rejects(replayTranscript(t, { contextWindow: 4_000, figures: [completion, completion] }), /unique non-empty name, got "completion"/)
})

test('user messages with blocks steer as whole messages (Agent.steer takes a UserMessage)', async () => {
  const image = { type: 'image_url', image_url: { url: 'data:image/png;base64,AAAA' } }
  const t = readTranscript(JSON.stringify([
    { role: 'user', content: 'look' },
    { role: 'assistant', content: null, tool_calls: [fn('c1', 'shot', '{}')] },
    { role: 'tool', tool_call_id: 'c1', content: 'taken' },
    { role: 'user', content: [{ type: 'text', text: 'this one' }, image] },
    { role: 'assistant', content: 'I see it' },
  ]))
  let s!: Session
  await replayTranscript(t, { contextWindow: 1_000, onStep: (_r, x) => { s = x } })
  assert.deepEqual(s.messages().map((m: Message) => m.role), ['user', 'assistant', 'tool', 'user', 'assistant'])
  assert.deepEqual(s.messages()[3].content, t.messages[3].content)
})

test('CLI: replay --sidechains replays each Claude Code Task run after the main chain; --help documents it',
  { skip: skipWithoutShared('corpus', 'fe5e1c67-53e7-4862-81ae-d0e013e3270b.jsonl') }, () => {
    const dsh = fileURLToPath(new URL('../dsh.ts', import.meta.url))
    const file = sharedPath('corpus', 'fe5e1c67-53e7-4862-81ae-d0e013e3270b.jsonl')
    const run = (flags: string[]) => spawnSync(process.execPath, ['--import', 'tsx', dsh, 'replay', file, '--context-window', '32000', ...flags], { encoding: 'utf8' })
    const plain = run([])
    assert.equal(plain.status, 0, plain.stderr)
    assert.doesNotMatch(plain.stdout, /sidechain 1 of/)
    const side = run(['--sidechains', '--json'])
    assert.equal(side.status, 0, side.stderr)
    const totals = side.stdout.trimEnd().split('\n').map((l) => JSON.parse(l)).filter((o) => o.kind === 'totals')
    assert.deepEqual(totals.map((o) => [o.chain, o.steps]), [['main chain', 9], ['sidechain 1 of 5', 9], ['sidechain 2 of 5', 34], ['sidechain 3 of 5', 40], ['sidechain 4 of 5', 25], ['sidechain 5 of 5', 53]])
    assert.match(cliHelp(), /--sidechains +Claude Code: also replay each Task-subagent run/)
  })

test('hostile transcripts: an empty call id is repaired by the loop and still gets its recorded result; arguments that are not JSON are answered by the loop, and noted', async () => {
  const t = readTranscript(JSON.stringify([
    { role: 'user', content: 'go' },
    { role: 'assistant', content: null, tool_calls: [fn('', 'sh', '{}')] },
    { role: 'tool', tool_call_id: '', content: 'recorded output' },
    { role: 'assistant', content: null, tool_calls: [fn('b', 'sh', '{"cmd": ')] },
    { role: 'tool', tool_call_id: 'b', content: 'the original agent ran something' },
    { role: 'assistant', content: 'done' },
  ]))
  let s!: Session
  const report = await replayTranscript(t, { contextWindow: 1_000, onStep: (_r, x) => { s = x } })
  const results = s.messages().filter((m) => m.role === 'tool')
  assert.match(results[0].toolCallId, /^call_dsh_\d+_0$/)
  assert.deepEqual(results[0].content, [{ type: 'text', text: 'recorded output' }])
  assert.equal(results[1].isError, true)
  assert.match(JSON.stringify(results[1].content), /arguments of sh are not valid JSON/)
  assert.ok(report.notes.includes('1 tool call(s) answered by the loop itself, not with the recorded result (e.g. arguments that are not JSON), as a live run would'))
  // The unmanaged figure counts what the transcript recorded: 'go' 9 + call 9 + 'recorded output' 12
  // + call 11 + 'the original agent ran something' (32 chars) 16 = 57 before the last step.
  assert.equal(report.totals.steps, 3)
  assert.equal(report.rows.at(-1)!.unmanagedTokens, 57)
})

test('cancellation mid-replay: the signal stops the Agent at the next step boundary and rejects with its reason', async () => {
  const messages: object[] = [{ role: 'user', content: 'task' }]
  for (let i = 1; i <= 20; i++) {
    messages.push({ role: 'assistant', content: null, tool_calls: [fn(`c${i}`, 'sh', '{}')] })
    messages.push({ role: 'tool', tool_call_id: `c${i}`, content: 'x' })
  }
  const ac = new AbortController()
  let rows = 0
  await assert.rejects(replayTranscript(readTranscript(JSON.stringify(messages)), {
    contextWindow: 10_000, signal: ac.signal,
    onStep: () => { if (++rows === 3) ac.abort(new Error('enough')) },
  }), /enough/)
  assert.equal(rows, 3)
})

test('a rung that replaces one node (compaction/<rung> {shadowedSeqs: [seq]} then the replace) is priced before → after, whatever its name', async () => {
  // The summarizer stands in for a new rung: on its first call it masks the first tool result
  // (seq 7, 508 tokens) the way a rung logs it, which also makes that summary attempt fail (the
  // surface changed); the ladder's retry then compacts.
  const messages: object[] = [{ role: 'user', content: 'task' }]
  for (let i = 1; i <= 7; i++) {
    messages.push({ role: 'assistant', content: null, tool_calls: [fn(`c${i}`, 'sh', '{}')] })
    messages.push({ role: 'tool', tool_call_id: `c${i}`, content: String(i).repeat(2000) })
  }
  let session: Session | undefined
  let masked = false
  const summarizer: Provider = {
    model: 'test-summarizer', baseURL: 'memory://s', contextWindow: 4_000, maxTokens: 100,
    async complete() {
      if (!masked) {
        masked = true
        session!.append('compaction/mask', { shadowedSeqs: [7], shadowedTokenCount: 508 })
        session!.append('tool/result', { message: { role: 'tool', toolCallId: 'c1', content: [{ type: 'text', text: '[masked]' }] }, surfaceOp: { op: 'replace', start: 7, end: 7 } })
      }
      return { message: { role: 'assistant', content: [{ type: 'text', text: 'S'.repeat(40) }] }, finishReason: 'stop' }
    },
  }
  const report = await replayTranscript(readTranscript(JSON.stringify(messages)), { summarizer, compaction: { clear: false }, onStep: (_r, s) => { session = s } } as Parameters<typeof replayTranscript>[1])
  const row = report.rows.find((r) => r.events.some((e) => e.type === 'rung'))!
  const mask = row.events.find((e) => e.type === 'rung')!
  // '[masked]' is 8 UTF-16 units → 2 + 8 = 10 tokens.
  assert.deepEqual(mask, { type: 'rung', rung: 'mask', seq: 39, tokensBefore: 508, tokensAfter: 10, data: { shadowedSeqs: [7], shadowedTokenCount: 508 } })
  assert.equal(report.totals.rungs.mask, 1)
  assert.equal(report.totals.rungReclaimedTokens.mask, 498)
  const out = formatReplay(report)
  assert.match(out, /↳ mask +seq 39: 508 → 10 tokens; shadowedSeqs 7, shadowedTokenCount 508$/m)
  assert.match(out, /^ {2}rung mask +1 \(498 tokens reclaimed\)$/m)
})

test('CLI: replay --base-url summarises with that server\'s model (x-dsh-purpose: compaction), and says so', async () => {
  const fake = await startFakeProvider({ script: [{ text: 'S'.repeat(40) }] })
  try {
    const cwd = await tempDir()
    // Eight turns of a 2,000-char user message (508 tokens) and a short answer: no tool results, so
    // only a summary brings the total under the 3,200-token threshold.
    const messages: object[] = []
    for (let i = 1; i <= 8; i++) messages.push({ role: 'user', content: String(i).repeat(2000) }, { role: 'assistant', content: 'ok' })
    await writeFile(join(cwd, 't.json'), JSON.stringify(messages))
    const run = await dshChild(['replay', 't.json', '--context-window', '4000', '--base-url', fake.url, '--model', 'local-model'], cwd)
    assert.equal(run.code, 0, run.stderr)
    assert.match(run.stdout, /^summaries written by the model local-model$/m)
    assert.ok(fake.requests.length >= 1)
    assert.equal(fake.requests[0].headers['x-dsh-purpose'], 'compaction')
    assert.equal((fake.requests[0].body as { model: string }).model, 'local-model')
    assert.match(run.stdout, /↳ compact +k\d+: \d+ messages/)
  } finally { await fake.close() }
})

test('a transcript that opens with an assistant message: the loop gets an empty input, which is noted and not counted as recorded', async () => {
  const report = await replayTranscript(readTranscript(JSON.stringify([{ role: 'assistant', content: 'hi' }])), { contextWindow: 1_000 })
  // '' costs 8 tokens on the surface; 'hi' 1 + 8 = 9.
  assert.deepEqual(report.rows.map((r) => [r.kind, r.requestTokens ?? null, r.unmanagedTokens, r.afterTokens]), [['turn-start', null, 0, 8], ['step', 8, 0, 17]])
  assert.ok(report.notes.includes('the transcript opens with an assistant message: replay opened the first turn with an empty user input'))
})

test('a transcript with a tool of its own named "recall" replays (the Agent then offers no recall of its own), noted', async () => {
  const t = readTranscript(JSON.stringify([
    { role: 'user', content: 'what did we decide?' },
    { role: 'assistant', content: null, tool_calls: [fn('m1', 'recall', '{"topic":"db"}')] },
    { role: 'tool', tool_call_id: 'm1', content: 'use sqlite' },
    { role: 'assistant', content: 'sqlite' },
  ]))
  let s!: Session
  const report = await replayTranscript(t, { contextWindow: 1_000, recall: true, onStep: (_r, x) => { s = x } })
  assert.equal(report.totals.steps, 2)
  assert.deepEqual(s.messages()[2].content, [{ type: 'text', text: 'use sqlite' }])
  assert.ok(report.notes.includes('the transcript has a tool of its own named "recall": replayed without dsh\'s recall tool'))
})

test('recall: true — the recall tool the Agent offers once content is shadowed joins the transcript\'s envelope, as a live run sends it', async () => {
  const text = JSON.stringify({ tools: [{ type: 'function', function: { name: 'read_file', parameters: {} } }], messages: [
    { role: 'user', content: 'read big.txt' },
    { role: 'assistant', content: null, tool_calls: [fn('c1', 'read_file', '{"path":"big.txt"}')] },
    { role: 'tool', tool_call_id: 'c1', content: 'x'.repeat(60_000) },
    { role: 'assistant', content: 'done' },
  ] })
  const headers: { tools?: { name: string }[] }[] = []
  const onEvent = (e: AgentEvent) => { if (e.type === 'log' && e.event.type === 'request/header') headers.push(e.event.data as { tools?: { name: string }[] }) }
  const off = await replayTranscript(readTranscript(text), { contextWindow: 16_000 })
  const on = await replayTranscript(readTranscript(text), { contextWindow: 16_000, recall: true, onEvent })
  // The prune after step 1 shadows the result; step 2's request carries the recall spec as well.
  assert.deepEqual(headers.map((h) => h.tools?.map((t) => t.name)), [['read_file'], ['read_file', 'recall']])
  const step2 = (r: typeof off) => r.rows.filter((x) => x.kind === 'step')[1].requestTokens!
  assert.ok(step2(on) > step2(off), `${step2(on)} > ${step2(off)}`)
})
