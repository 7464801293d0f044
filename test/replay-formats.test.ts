// Transcript readers behind `dsh.ts replay` (issue 5). Expected numbers for the corpus files were read
// off the files with jq/python (see the comments by each row), never produced by these readers.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import fc from 'fast-check'
import {
  detectTranscriptFormat, readTranscript, runReplay, TranscriptError, TRANSCRIPT_FORMATS, cliHelp, parseCliArgs, Session, MemoryStore, PRUNE_MARKER, unmanagedSession,
  type Message, type ToolResultMessage, type ToolCallBlock, type Transcript, type TranscriptFormat, internals, pruneToolResult
} from '../dsh.ts'

const { stateOf } = internals
import { skipWithoutShared, readCorpus } from './shared.ts'
import { CLEAN_ENV, runProcess, TSX } from './cli-helpers.ts'
import { mkdtemp, rm, writeFile } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { logHeader } from './spec.ts'

/** Unicode code points (a surrogate pair counts once), not UTF-16 units. */
function codePoints(s: string): number { let n = 0; for (const _ of s) n++; return n }
const textOf = (m: Message): string =>
  typeof m.content === 'string' ? m.content : m.content.map(b => (b.type === 'text' ? (b as { text: string }).text : '')).join('')
const calls = (t: { messages: Message[] }): ToolCallBlock[] =>
  t.messages.flatMap(m => (m.role === 'assistant' ? m.content.filter((b): b is ToolCallBlock => b.type === 'tool-call') : []))
const roles = (t: { messages: Message[] }) => {
  const n = { user: 0, assistant: 0, tool: 0 }
  for (const m of t.messages) n[m.role]++
  return n
}
const overPruneThreshold = (t: Transcript) => t.messages.filter(m => m.role === 'tool' && codePoints(textOf(m)) > 8192).length

/** Every tool call answered by exactly one result with its id, right after its step; ids unique. */
function assertPaired(t: { messages: Message[] }): void {
  const ids = calls(t).map(c => c.id)
  assert.equal(new Set(ids).size, ids.length, 'tool-call ids are unique')
  const results = t.messages.filter(m => m.role === 'tool').map(m => (m as { toolCallId: string }).toolCallId)
  assert.deepEqual([...results].sort(), [...ids].sort())
  let open = new Set<string>()
  for (const m of t.messages) {
    if (m.role === 'tool') { assert.ok(open.delete(m.toolCallId), `result ${m.toolCallId} follows its call`); continue }
    assert.equal(open.size, 0, 'no open call before the next user/assistant message')
    if (m.role === 'assistant') open = new Set(m.content.filter(b => b.type === 'tool-call').map(b => (b as ToolCallBlock).id))
  }
  assert.equal(open.size, 0)
}

// ── the corpus: one row per file ──

interface CorpusRow {
  file: string
  format: TranscriptFormat
  roles: { user: number; assistant: number; tool: number }
  toolCalls: number
  overPruneThreshold: number
  largestResultCodePoints: number
  usageReported: number
  firstUsage?: { promptTokens: number; completionTokens: number; cachedTokens?: number }
  lastUsage?: { promptTokens: number; completionTokens: number; cachedTokens?: number }
  systemChars?: number
  first: { role: string; startsWith: string }
  last: { role: string; includes: string }
}

const CORPUS: CorpusRow[] = [
  {
    // jq: 144 messages = 1 system, 72 user, 71 assistant; 69 assistant messages hold exactly one ```bash
    // block (messages[56] and [122] hold two: format errors), so 69 calls, 69 next-user results and
    // 3 user messages left (the task and two format-error replies). Results > 8192 code points: 5
    // (868,162 = final `git diff --cached`, then 10,613, 10,613, 10,612, 10,612).
    // usage: messages[2] 1379/171 (cached 0), messages[142] 38122/36 (cached 37994).
    file: 'psf__requests-1142.traj.json', format: 'mini-swe-agent',
    roles: { user: 3, assistant: 71, tool: 69 }, toolCalls: 69, overPruneThreshold: 5, largestResultCodePoints: 868_162,
    usageReported: 71,
    firstUsage: { promptTokens: 1379, completionTokens: 171, cachedTokens: 0 },
    lastUsage: { promptTokens: 38122, completionTokens: 36, cachedTokens: 37994 },
    systemChars: 542,
    first: { role: 'user', startsWith: '<pr_description>\nConsider the following PR description:\nrequests.get is ALWAYS sending content length' },
    last: { role: 'tool', includes: 'diff --git a/build/lib/requests/__init__.py' },
  },
  {
    // jq: 196 = 1 system, 98 user, 97 assistant; messages[54] and [158] hold two bash blocks → 95 calls.
    // Results > 8192 code points: 10 (largest 41,623 and 25,425: timed-out pylint runs).
    // usage: first 1976/134, last 95507/119 (cached 94459).
    file: 'pylint-dev__pylint-6528.traj.json', format: 'mini-swe-agent',
    roles: { user: 3, assistant: 97, tool: 95 }, toolCalls: 95, overPruneThreshold: 10, largestResultCodePoints: 41_623,
    usageReported: 97,
    firstUsage: { promptTokens: 1976, completionTokens: 134, cachedTokens: 0 },
    lastUsage: { promptTokens: 95507, completionTokens: 119, cachedTokens: 94459 },
    systemChars: 542,
    first: { role: 'user', startsWith: '<pr_description>\nConsider the following PR description:\nPylint does not respect ignores' },
    last: { role: 'tool', includes: 'diff --git a/.a/foo.py b/.a/foo.py' },
  },
  {
    // jq: 438 lines = 1 summary + 32 main-chain + 405 isSidechain. Main chain: 18 assistant lines with 9
    // distinct message.id; 14 user lines = 2 string + 1 text block (isMeta) + 11 tool_result blocks.
    // 11 tool_use. Largest main-chain result 2,021 code points (line 294). Usage per message.id:
    // first kdjvaD 3+1331+14874 = 16208 / 172 (line with the largest output_tokens), last wmHapR 21552 / 10.
    file: 'fe5e1c67-53e7-4862-81ae-d0e013e3270b.jsonl', format: 'claude-code',
    roles: { user: 3, assistant: 9, tool: 11 }, toolCalls: 11, overPruneThreshold: 0, largestResultCodePoints: 2021,
    usageReported: 9,
    firstUsage: { promptTokens: 16208, completionTokens: 172, cachedTokens: 14874 },
    lastUsage: { promptTokens: 21552, completionTokens: 10 },
    first: { role: 'user', startsWith: '<command-message>orchestrator is running…</command-message>' },
    last: { role: 'assistant', includes: 'CLAUDE.md has been created with comprehensive documentation' },
  },
  {
    // jq: history 28 = system (1,786 chars), user, 13 × (assistant with one tool_call, tool with
    // tool_call_ids). Largest observation 6,277. No usage in history.
    file: 'marshmallow-code__marshmallow-1867.function_calling_replace_from_source.traj', format: 'swe-agent',
    roles: { user: 1, assistant: 13, tool: 13 }, toolCalls: 13, overPruneThreshold: 0, largestResultCodePoints: 6277,
    usageReported: 0, systemChars: 1786,
    first: { role: 'user', startsWith: "We're currently solving the following issue within our repository." },
    last: { role: 'tool', includes: 'diff --git a/src/marshmallow/fields.py b/src/marshmallow/fields.py' },
  },
]


for (const row of CORPUS) {
  test(`corpus ${row.file}: detected as ${row.format}, counts as read off the file`, { skip: skipWithoutShared('corpus', row.file) }, () => {
    const text = readCorpus(row.file)
    assert.equal(detectTranscriptFormat(text), row.format)
    const t = readTranscript(text)
    assert.equal(t.format, row.format)
    assert.deepEqual(roles(t), row.roles)
    assert.equal(calls(t).length, row.toolCalls)
    assertPaired(t)
    assert.equal(overPruneThreshold(t), row.overPruneThreshold)
    assert.equal(Math.max(...t.messages.filter(m => m.role === 'tool').map(m => codePoints(textOf(m)))), row.largestResultCodePoints)
    assert.equal(t.usage.length, row.roles.assistant, 'one usage entry per assistant message')
    assert.equal(t.usage.filter(u => u !== undefined).length, row.usageReported)
    if (row.firstUsage) assert.deepEqual(pick(t.usage[0], row.firstUsage), row.firstUsage)
    if (row.lastUsage) assert.deepEqual(pick(t.usage.at(-1), row.lastUsage), row.lastUsage)
    assert.equal(t.envelope.system?.length, row.systemChars)
    const first = t.messages[0]
    const last = t.messages.at(-1)!
    assert.equal(first.role, row.first.role)
    assert.ok(textOf(first).startsWith(row.first.startsWith), textOf(first).slice(0, 120))
    assert.equal(last.role, row.last.role)
    assert.ok(textOf(last).includes(row.last.includes), textOf(last).slice(0, 120))
  })
}

function pick(u: object | undefined, like: object): object | undefined {
  if (!u) return u
  return Object.fromEntries(Object.keys(like).map(k => [k, (u as Record<string, unknown>)[k]]))
}

test('corpus mini-swe-agent: bash block → tool call, next user message → result, format errors stay text',
  { skip: skipWithoutShared('corpus', 'psf__requests-1142.traj.json') }, () => {
    const t = readTranscript(readCorpus('psf__requests-1142.traj.json'))
    // messages[2] (jq): "THOUGHT: I need to explore the codebase … overview … files in the repository.\n\n```bash\nls -R\n```"
    const a = t.messages[1]
    assert.equal(a.role, 'assistant')
    assert.deepEqual(a.content.map(b => b.type), ['text', 'tool-call'])
    assert.ok(textOf(a).startsWith('THOUGHT: I need to explore the codebase') && !textOf(a).includes('```'))
    assert.deepEqual(a.content[1], { type: 'tool-call', id: 'mswea-call-2', name: 'bash', arguments: JSON.stringify({ command: 'ls -R' }) })
    assert.equal(t.messages[2].role, 'tool')
    assert.ok(textOf(t.messages[2]).startsWith('<returncode>0</returncode>\n<output>\n.:\nAUTHORS.rst'))
    // messages[56] has two bash blocks; messages[57] is the format error reply (jq).
    const twoBlocks = t.messages.find(m => m.role === 'assistant' && textOf(m).includes('Wait, I need to see how `collections` is imported.'))!
    assert.equal(twoBlocks.content.length, 1)
    const next = t.messages[t.messages.indexOf(twoBlocks) + 1]
    assert.equal(next.role, 'user')
    assert.ok(textOf(next).startsWith('Please always provide EXACTLY ONE action in triple backticks, found 2 actions.'))
    assert.ok(t.envelope.system?.startsWith('You are a helpful assistant that can interact multiple times with a computer shell'))
    assert.equal(t.envelope.tools, undefined)
  })

test('corpus mini-swe-agent: timed-out commands are error results (4 in pylint-6528, by grep)',
  { skip: skipWithoutShared('corpus', 'pylint-dev__pylint-6528.traj.json') }, () => {
    const t = readTranscript(readCorpus('pylint-dev__pylint-6528.traj.json'))
    const errors = t.messages.filter(m => m.role === 'tool' && m.isError)
    assert.equal(errors.length, 4)
    for (const e of errors) assert.ok(textOf(e).startsWith('The last command <command>'))
    assert.equal(Math.max(...t.usage.map(u => u!.promptTokens)), 95_507)
  })

test('corpus claude-code: grouping by message.id, parallel calls, astral text, sidechains as their own transcripts',
  { skip: skipWithoutShared('corpus', 'fe5e1c67-53e7-4862-81ae-d0e013e3270b.jsonl') }, () => {
    const text = readCorpus('fe5e1c67-53e7-4862-81ae-d0e013e3270b.jsonl')
    const t = readTranscript(text)
    // jq: main-chain tool_use names in order.
    assert.deepEqual(calls(t).map(c => c.name),
      ['Glob', 'Glob', 'TodoWrite', 'Task', 'Task', 'Task', 'TodoWrite', 'Task', 'Task', 'TodoWrite', 'Write'])
    // Lines 4-6 share message.id …kdjvaD: one text then two tool_use → one assistant message.
    assert.deepEqual(t.messages.find(m => m.role === 'assistant')!.content.map(b => b.type), ['text', 'tool-call', 'tool-call'])
    assert.equal(calls(t)[0].id, 'toolu_019okXfjnUzJkV2VZbndx6ik')
    // Line 436: Write input keys content, file_path → arguments is JSON of the input.
    assert.deepEqual(Object.keys(JSON.parse(calls(t)[10].arguments)).sort(), ['content', 'file_path'])
    // Line 294, tool_use_id …TkoP55: 2,021 code points, 2,024 UTF-16 units (🎯 🏗 📱 are astral).
    const r = t.messages.find(m => m.role === 'tool' && m.toolCallId === 'toolu_017rjDpjVPeNFmAEXNTkoP55')!
    assert.equal(codePoints(textOf(r)), 2021)
    assert.equal(textOf(r).length, 2024)
    assert.ok(t.notes.some(n => n.includes('405 sidechain line(s)') && n.includes('5 run(s)')), t.notes.join('\n'))
    assert.equal(t.sidechains, undefined)

    // With {sidechains: true}: 5 runs (one per Task call), counts per run from python over parentUuid roots.
    const w = readTranscript(text, { sidechains: true })
    assert.deepEqual(w.messages, t.messages)
    const runs = w.sidechains!
    assert.deepEqual(runs.map(roles), [
      { user: 1, assistant: 9, tool: 8 }, { user: 1, assistant: 34, tool: 33 }, { user: 1, assistant: 40, tool: 39 },
      { user: 1, assistant: 25, tool: 24 }, { user: 1, assistant: 53, tool: 52 },
    ])
    runs.forEach(assertPaired)
    assert.deepEqual(runs.map(overPruneThreshold), [0, 1, 0, 0, 1]) // 26,746 (line 108) and 10,203 (line 357)
    assert.equal(runs.flatMap(s => s.messages).filter(m => m.role === 'tool' && m.isError).length, 23) // is_error: true
    assert.deepEqual(runs.map(s => Math.max(...s.usage.map(u => u!.promptTokens))), [14654, 41160, 29050, 26483, 42726])
    assert.ok(textOf(runs[0].messages[0]).startsWith('Create React components for the TODO app in a components/ directory'))
  })

test('corpus swe-agent: history only; reused demonstration ids are renamed, results follow their calls',
  { skip: skipWithoutShared('corpus', 'marshmallow-code__marshmallow-1867.function_calling_replace_from_source.traj') }, () => {
    const t = readTranscript(readCorpus('marshmallow-code__marshmallow-1867.function_calling_replace_from_source.traj'))
    // jq: tool_calls ids — call_5iDd… used 4 times, call_ahTo… twice → 4 renames.
    const ids = calls(t).map(c => c.id)
    assert.equal(ids.filter(id => id.startsWith('call_5iDdbOYybq7L19vqXmR0DPaU')).length, 4)
    assert.deepEqual(ids.filter(id => id.includes('~')), [
      'call_5iDdbOYybq7L19vqXmR0DPaU~2', 'call_ahToD2vM0aQWJPkRmy5cumru~2', 'call_5iDdbOYybq7L19vqXmR0DPaU~3', 'call_5iDdbOYybq7L19vqXmR0DPaU~4',
    ])
    assert.ok(t.notes.some(n => n.startsWith('renamed 4 reused tool-call id(s)')))
    // jq: tool names bash ×6, open ×2, create, edit, find_file, insert, submit; the first is bash {"command":"ls -F"}.
    assert.deepEqual(calls(t)[0], { type: 'tool-call', id: 'call_9diWc1DYm4RLmPfHgIaP2wd', name: 'bash', arguments: '{"command":"ls -F"}' })
    assert.equal(calls(t).filter(c => c.name === 'bash').length, 6)
    assert.equal(calls(t).at(-1)!.name, 'submit')
    assert.ok(t.envelope.system?.startsWith('SETTING: You are an autonomous programmer'))
  })

test('corpus: --format forcing reads a mini-swe-agent file as plain OpenAI messages (no tool calls)',
  { skip: skipWithoutShared('corpus', 'psf__requests-1142.traj.json') }, () => {
    const t = readTranscript(readCorpus('psf__requests-1142.traj.json'), { format: 'openai' })
    assert.equal(t.format, 'openai')
    assert.deepEqual(roles(t), { user: 72, assistant: 71, tool: 0 }) // jq: 72 user, 71 assistant
    assert.equal(t.usage.filter(u => u !== undefined).length, 0) // usage sits in extra.response, not read by the openai reader
    assert.ok(t.notes.some(n => n.startsWith('no tool calls')))
  })

// ── small inline cases ──

const jsonl = (...rows: object[]) => rows.map(r => JSON.stringify(r)).join('\n') + '\n'
const cc = (uuid: string, parentUuid: string | null, type: 'user' | 'assistant', message: object, extra: object = {}) =>
  ({ parentUuid, isSidechain: false, sessionId: 's', type, message, uuid, ...extra })
const ev = (seq: number, type: string, data: object) => ({ seq, type, time: 1_700_000_000_000 + seq, data })

const DETECT: [string, string, TranscriptFormat][] = [
  ['openai array', JSON.stringify([{ role: 'user', content: 'hi' }]), 'openai'],
  ['openai object', JSON.stringify({ messages: [{ role: 'user', content: 'hi' }] }), 'openai'],
  ['mini-swe-agent', JSON.stringify({ trajectory_format: 'mini-swe-agent-1', messages: [{ role: 'user', content: 'hi' }] }, null, 2), 'mini-swe-agent'],
  ['swe-agent', JSON.stringify({ history: [{ role: 'user', content: 'hi' }], trajectory: [] }, null, 2), 'swe-agent'],
  ['claude-code', jsonl({ type: 'summary', summary: 'x', leafUuid: 'u1' }, cc('u1', null, 'user', { role: 'user', content: 'hi' })), 'claude-code'],
  ['dsh', jsonl(ev(0, 'session/start', { id: 's', version: '0.1.0' }), ev(1, 'user/message', { message: { role: 'user', content: 'hi' }, surfaceOp: { op: 'append' } })), 'dsh'],
  ['dsh, one line, no final newline', JSON.stringify(ev(0, 'session/start', { id: 's' })), 'dsh'],
]
for (const [name, text, format] of DETECT) {
  test(`detect: ${name} → ${format}`, () => assert.equal(detectTranscriptFormat(text), format))
}

test('openai: envelope, reasoning, parallel tool calls, parts, usage', () => {
  const t = readTranscript(JSON.stringify({
    tools: [{ type: 'function', function: { name: 'read_file', description: 'Read', parameters: { type: 'object' } } }],
    messages: [
      { role: 'system', content: 'be brief' },
      { role: 'user', content: [{ type: 'text', text: 'look' }, { type: 'image_url', image_url: { url: 'data:,x' } }] },
      {
        role: 'assistant', content: null, reasoning_content: 'think',
        tool_calls: [
          { id: 'a', type: 'function', function: { name: 'read_file', arguments: '{"path":"x"}' } },
          { id: 'b', type: 'function', function: { name: 'read_file', arguments: '{"path":"y"}' } },
        ],
        usage: { prompt_tokens: 100, completion_tokens: 20, prompt_tokens_details: { cached_tokens: 64 }, completion_tokens_details: { reasoning_tokens: 5 } },
      },
      { role: 'tool', tool_call_id: 'b', content: 'Y' },
      { role: 'tool', tool_call_id: 'a', content: [{ type: 'text', text: 'X' }] },
      { role: 'assistant', content: 'done' },
    ],
  }))
  assert.deepEqual(t.envelope, { system: 'be brief', tools: [{ name: 'read_file', description: 'Read', parameters: { type: 'object' } }] })
  assert.deepEqual(t.messages, [
    { role: 'user', content: [{ type: 'text', text: 'look' }, { type: 'image', image_url: { url: 'data:,x' } }] },
    {
      role: 'assistant', content: [
        { type: 'reasoning', text: 'think' },
        { type: 'tool-call', id: 'a', name: 'read_file', arguments: '{"path":"x"}' },
        { type: 'tool-call', id: 'b', name: 'read_file', arguments: '{"path":"y"}' },
      ],
    },
    { role: 'tool', toolCallId: 'b', content: [{ type: 'text', text: 'Y' }] },
    { role: 'tool', toolCallId: 'a', content: [{ type: 'text', text: 'X' }] },
    { role: 'assistant', content: [{ type: 'text', text: 'done' }] },
  ])
  assert.deepEqual(t.usage, [{ promptTokens: 100, completionTokens: 20, cachedTokens: 64, reasoningTokens: 5 }, undefined])
})

test('pairing: a missing result is synthesised as an error, an orphan result dropped, both noted', () => {
  const t = readTranscript(JSON.stringify([
    { role: 'user', content: 'go' },
    { role: 'assistant', content: '', tool_calls: [{ id: 'c1', type: 'function', function: { name: 'sh', arguments: '{}' } }] },
    { role: 'user', content: 'stop' },
    { role: 'tool', tool_call_id: 'c1', content: 'late' },
    { role: 'tool', tool_call_id: 'nope', content: 'orphan' },
  ]))
  assert.deepEqual(t.messages.map(m => m.role), ['user', 'assistant', 'tool', 'user'])
  const synthetic = t.messages[2]
  assert.ok(synthetic.role === 'tool' && synthetic.toolCallId === 'c1' && synthetic.isError === true)
  assert.ok(t.notes.some(n => n.startsWith('synthesised an error result for 1 tool call(s)') && n.includes('c1')))
  assert.ok(t.notes.some(n => n.startsWith('dropped 2 tool result(s)') && n.includes('nope') && n.includes('[4]')))
})

test('pairing: one id on many calls of a step is matched first call first result, the rest of a step synthesised in order; the floor pairs them the same way', () => {
  // A step's results are matched to its calls through a queue per recorded id (the scan it replaced was
  // quadratic in the calls of one message: bench/replay-ids.bench.ts); this pins what the matching is.
  const call = (id: string, cmd: string) => ({ id, type: 'function', function: { name: 'sh', arguments: JSON.stringify({ cmd }) } })
  const t = readTranscript(JSON.stringify([
    { role: 'user', content: 'go' },
    { role: 'assistant', content: '', tool_calls: [call('x', 'a'), call('y', 'b'), call('x', 'c'), call('x', 'd')] },
    { role: 'tool', tool_call_id: 'x', content: 'A' },
    { role: 'tool', tool_call_id: 'y', content: 'B' },
    { role: 'tool', tool_call_id: 'x', content: 'C' },
    { role: 'tool', tool_call_id: 'y', content: 'orphan: y is answered' },
    { role: 'assistant', content: '', tool_calls: [call('x', 'e')] },
    { role: 'tool', tool_call_id: 'x', content: 'E' },
  ]))
  const ids = t.messages.flatMap(m => m.role === 'assistant' ? m.content.flatMap(b => b.type === 'tool-call' ? [(b as { id: string }).id] : []) : [])
  assert.deepEqual(ids, ['x', 'y', 'x~2', 'x~3', 'x~4'])
  const results = t.messages.flatMap(m => m.role === 'tool' ? [`${m.toolCallId}=${m.isError ? 'synthetic' : (m.content[0] as { text: string }).text}`] : [])
  assert.deepEqual(results, ['x=A', 'y=B', 'x~2=C', 'x~3=synthetic', 'x~4=E'])
  assert.ok(t.notes.some(n => n.startsWith('synthesised an error result for 1 tool call(s)') && n.includes('sh x~3')))
  assert.ok(t.notes.some(n => n.startsWith('dropped 1 tool result(s)') && n.includes('y (')))
  const floor = unmanagedSession(t)
  const logged = floor.events.filter(e => e.type === 'tool/result').map(e => {
    const m = (e.data as { message: ToolResultMessage }).message
    return `${m.toolCallId}=${m.isError ? 'synthetic' : (m.content[0] as { text: string }).text}`
  })
  assert.deepEqual(logged, results)
})

test('mini-swe-agent inline: no bash block stays text, a trailing call gets a synthetic result, usage from extra', () => {
  const usage = (p: number, c: number) => ({ extra: { response: { usage: { prompt_tokens: p, completion_tokens: c } } } })
  const t = readTranscript(JSON.stringify({
    trajectory_format: 'mini-swe-agent-1',
    messages: [
      { role: 'system', content: 'sys' },
      { role: 'user', content: 'task' },
      { role: 'assistant', content: 'I think first.', ...usage(10, 1) },
      { role: 'user', content: 'Please always provide EXACTLY ONE action' },
      { role: 'assistant', content: 'THOUGHT: look\n\n```bash\nls -la\n```', ...usage(20, 2) },
      { role: 'user', content: '<returncode>0</returncode>\n<output>\nfile\n</output>' },
      { role: 'assistant', content: 'THOUGHT: again\n\n```bash\ncat file\n```' },
    ],
  }, null, 1))
  assert.equal(t.envelope.system, 'sys')
  assert.deepEqual(t.messages.map(m => m.role), ['user', 'assistant', 'user', 'assistant', 'tool', 'assistant', 'tool'])
  assert.deepEqual(t.messages[3].content, [
    { type: 'text', text: 'THOUGHT: look' },
    { type: 'tool-call', id: 'mswea-call-4', name: 'bash', arguments: '{"command":"ls -la"}' },
  ])
  assert.deepEqual(t.messages[4], { role: 'tool', toolCallId: 'mswea-call-4', content: [{ type: 'text', text: '<returncode>0</returncode>\n<output>\nfile\n</output>' }] })
  const last = t.messages[6]
  assert.ok(last.role === 'tool' && last.toolCallId === 'mswea-call-6' && last.isError === true)
  assert.deepEqual(t.usage, [{ promptTokens: 10, completionTokens: 1 }, { promptTokens: 20, completionTokens: 2 }, undefined])
  assert.ok(t.notes.some(n => n.includes('mswea-call-6')))
})

/** `readTranscript` of `text` in a child process that is killed after 30 s (cli-helpers' guard): a reader that takes
 *  the square of its input's size fails the test instead of holding the suite. Returns the child's stdout: `report`. */
async function readInChild(text: string, report: string): Promise<string> {
  const dir = await mkdtemp(join(tmpdir(), 'dsh-read-'))
  await writeFile(join(dir, 't'), text)
  const script = `import { readTranscript } from ${JSON.stringify(new URL('../dsh.ts', import.meta.url).href)}
    import { readFileSync } from 'node:fs'
    const t = readTranscript(readFileSync('t', 'utf8'), { sidechains: true }); console.log(${report})`
  const run = await runProcess(process.execPath, ['--import', TSX, '--input-type=module', '-e', script], dir, CLEAN_ENV)
  await rm(dir, { recursive: true, force: true })
  assert.equal(run.code, 0, `the reader did not finish within 30 s (or failed): ${run.stderr.slice(0, 300)}`)
  return run.stdout.trim()
}

test('mini-swe-agent: the bash block is found as the RegExp /```bash\\s*\\n([\\s\\S]*?)\\n```/g finds it, in linear time', async () => {
  const BASH = /```bash\s*\n([\s\S]*?)\n```/g
  const doc = (content: string) => JSON.stringify({ trajectory_format: 'mini-swe-agent-1', messages: [
    { role: 'user', content: 'task' }, { role: 'assistant', content }] })
  fc.assert(fc.property(fc.array(fc.constantFrom('```bash', '```', '\n', ' ', '\t', 'x', 'ls'), { maxLength: 14 }), (parts) => {
    const content = parts.join('')
    const blocks = [...content.matchAll(BASH)]
    const m = readTranscript(doc(content)).messages[1]
    if (blocks.length !== 1) return assert.deepEqual(m.content, content === '' ? [] : [{ type: 'text', text: content }])
    const text = (content.slice(0, blocks[0].index) + content.slice(blocks[0].index! + blocks[0][0].length)).trim()
    const call = (m.content as ToolCallBlock[]).find((b) => b.type === 'tool-call')!
    assert.equal(JSON.parse(call.arguments).command, blocks[0][1])
    assert.deepEqual((m.content as { type: string; text?: string }[]).filter((b) => b.type === 'text').map((b) => b.text), text === '' ? [] : [text])
  }), { numRuns: 3000 })
  // 500,000 unclosed fences (5.5 MB): the RegExp took 15 s at 990 KB and grows with the square (minutes here).
  assert.equal(await readInChild(doc('```bash\nx '.repeat(500_000)), 't.messages[1].content.length'), '1')
})

test('claude-code: a sidechain of 60,000 lines is grouped in linear time (each line\'s root was walked from that line)', async () => {
  // n² steps before: 25 s at 20,000 lines, so minutes here.
  const n = 60_000
  const line = (i: number) => JSON.stringify({ type: i % 2 ? 'assistant' : 'user', uuid: `u${i}`, parentUuid: i ? `u${i - 1}` : null,
    isSidechain: i > 0, sessionId: 's', message: i % 2 ? { role: 'assistant', content: [{ type: 'text', text: `a${i}` }] } : { role: 'user', content: `q${i}` } })
  // one run; its path back to the root runs through the main line u0
  assert.equal(await readInChild(Array.from({ length: n }, (_, i) => line(i)).join('\n') + '\n',
    '`${t.sidechains.length} ${t.sidechains[0].messages.length}`'), `1 ${n}`)
})

test('hostile sizes: 16,000 reuses of one call id, a torn line after 800,000 blank lines, 200,000 parts in a message, 3,000,000 lines', async () => {
  // each was quadratic (20.7 s for the ids at 1.6 MB; 12.5 s for the blank lines at 120 KB) or overflowed the stack
  const pre = Array.from({ length: 16_000 }, (_, i) => ({ id: `a~${i + 2}`, type: 'function', function: { name: 'f', arguments: '{}' } }))
  const ids = JSON.stringify([{ role: 'user', content: 'u' }, { role: 'assistant', content: null, tool_calls: pre },
    ...Array.from({ length: 16_000 }, () => ({ role: 'assistant', content: null, tool_calls: [{ id: 'a', type: 'function', function: { name: 'f', arguments: '{}' } }] }))])
  assert.equal(await readInChild(ids, 't.messages.filter((m) => m.role === "assistant").length'), '16001')
  const torn = JSON.stringify({ seq: 0, type: 'session/start', time: 0, data: { id: 'x', version: '0.1.0', format: 1 } }) + '\n'
    + JSON.stringify({ seq: 1, type: 'user/message', time: 1, data: { message: { role: 'user', content: 'hi' }, surfaceOp: { op: 'append' } } }) + '\n'
    + '\n \n'.repeat(400_000) + '{broken'
  assert.match(await readInChild(torn, 't.notes.join(" | ")'), /dropped the torn last line/)
  const parts = JSON.stringify([{ role: 'user', content: 'u' }, { role: 'assistant', content: Array.from({ length: 200_000 }, () => ({ type: 'text', text: 'x' })) }])
  assert.equal(await readInChild(parts, 't.messages[1].content.length'), '200000')
  assert.throws(() => readTranscript('{}\n'.repeat(3_000_000)), (e: Error) => e instanceof TranscriptError
    && /^it has more than 2,000,000 lines, the most replay reads \(TRANSCRIPT_MAX_LINES\): split it/.test(e.message))
})

test('claude-code inline: message.id groups, several tool_results plus text in one line, thinking, sidechain, branch, torn line', () => {
  const usage = (out: number) => ({ input_tokens: 5, output_tokens: out, cache_creation_input_tokens: 100, cache_read_input_tokens: 1000 })
  const text = jsonl(
    cc('u1', null, 'user', { role: 'user', content: 'start' }),
    cc('a1', 'u1', 'assistant', { id: 'm1', role: 'assistant', content: [{ type: 'thinking', thinking: 'hmm', signature: 'sig' }], usage: usage(1) }),
    cc('a2', 'a1', 'assistant', { id: 'm1', role: 'assistant', content: [{ type: 'tool_use', id: 't1', name: 'Bash', input: { command: 'ls' } }], usage: usage(1) }),
    cc('a3', 'a2', 'assistant', { id: 'm1', role: 'assistant', content: [{ type: 'tool_use', id: 't2', name: 'Read', input: { file_path: 'a' } }], usage: usage(42) }),
    cc('s1', null, 'user', { role: 'user', content: 'subagent task' }, { isSidechain: true }),
    cc('s2', 's1', 'assistant', { id: 'm9', role: 'assistant', content: [{ type: 'text', text: 'sub done' }], usage: usage(3) }, { isSidechain: true }),
    cc('u2', 'a3', 'user', {
      role: 'user', content: [
        { type: 'tool_result', tool_use_id: 't2', content: [{ type: 'text', text: 'file a' }] },
        { type: 'tool_result', tool_use_id: 't1', content: 'boom', is_error: true },
        { type: 'text', text: 'and also this' },
      ],
    }, { toolUseResult: { stdout: 'not counted' } }),
    cc('x1', 'u2', 'user', { role: 'user', content: 'abandoned branch' }),
    cc('u3', 'u2', 'user', { role: 'user', content: 'rewritten question' }),
    cc('a4', 'u3', 'assistant', { id: 'm2', role: 'assistant', content: [{ type: 'text', text: 'answer' }], usage: usage(7) }),
  ) + '{"parentUuid":"a4","type":"user","mess'
  const t = readTranscript(text, { sidechains: true })
  assert.equal(t.format, 'claude-code')
  assert.deepEqual(t.messages, [
    { role: 'user', content: 'start' },
    {
      role: 'assistant', content: [
        { type: 'reasoning', text: 'hmm' },
        { type: 'tool-call', id: 't1', name: 'Bash', arguments: '{"command":"ls"}' },
        { type: 'tool-call', id: 't2', name: 'Read', arguments: '{"file_path":"a"}' },
      ],
    },
    { role: 'tool', toolCallId: 't2', content: [{ type: 'text', text: 'file a' }] },
    { role: 'tool', toolCallId: 't1', content: [{ type: 'text', text: 'boom' }], isError: true },
    { role: 'user', content: [{ type: 'text', text: 'and also this' }] },
    { role: 'user', content: 'rewritten question' },
    { role: 'assistant', content: [{ type: 'text', text: 'answer' }] },
  ])
  assert.deepEqual(t.usage, [
    { promptTokens: 1105, completionTokens: 42, cachedTokens: 1000 },
    { promptTokens: 1105, completionTokens: 7, cachedTokens: 1000 },
  ])
  assert.ok(t.notes.some(n => n.startsWith('dropped the torn last line 11')), t.notes.join('\n'))
  assert.ok(t.notes.some(n => n.startsWith('1 line(s) off the path')), t.notes.join('\n'))
  assert.equal(t.sidechains?.length, 1)
  assert.deepEqual(t.sidechains![0].messages, [{ role: 'user', content: 'subagent task' }, { role: 'assistant', content: [{ type: 'text', text: 'sub done' }] }])
})

test('claude-code inline: a compaction boundary is crossed and its summary dropped', () => {
  const t = readTranscript(jsonl(
    cc('u1', null, 'user', { role: 'user', content: 'before' }),
    cc('a1', 'u1', 'assistant', { id: 'm1', role: 'assistant', content: [{ type: 'text', text: 'old answer' }] }),
    { type: 'system', subtype: 'compact_boundary', parentUuid: null, logicalParentUuid: 'a1', uuid: 'b1', sessionId: 's', content: 'Conversation compacted' },
    cc('c1', 'b1', 'user', { role: 'user', content: 'This session is being continued… summary' }, { isCompactSummary: true }),
    cc('u2', 'c1', 'user', { role: 'user', content: 'after' }),
  ))
  assert.deepEqual(t.messages.map(textOf), ['before', 'old answer', 'after'])
  assert.ok(t.notes.some(n => n.startsWith('crossed 1 Claude Code compaction boundary')))
  assert.ok(t.notes.some(n => n.startsWith('dropped 1 compact-summary')))
})

test('dsh inline: appended surface messages, envelope from request/header, replaces skipped', () => {
  const t = readTranscript(jsonl(
    ev(0, 'session/start', { id: 's', version: '0.1.0' }),
    ev(1, 'request/header', { model: 'm', system: 'sys', tools: [{ name: 'read_file', parameters: { type: 'object' } }] }),
    ev(2, 'user/message', { message: { role: 'user', content: 'read it' }, surfaceOp: { op: 'append' } }),
    ev(3, 'assistant/message', {
      message: { role: 'assistant', content: [{ type: 'tool-call', id: 'c1', name: 'read_file', arguments: '{}' }] },
      usage: { promptTokens: 50, completionTokens: 5 }, finishReason: 'tool_calls', surfaceOp: { op: 'append' },
    }),
    ev(4, 'tool/result', { message: { role: 'tool', toolCallId: 'c1', content: [{ type: 'text', text: 'x'.repeat(9000) }] }, surfaceOp: { op: 'append' } }),
    ev(5, 'compaction/prune', { shadowedSeqs: [4], shadowedTokenCount: 2258 }),
    ev(6, 'tool/result', { message: { role: 'tool', toolCallId: 'c1', content: [{ type: 'text', text: 'pruned' }] }, surfaceOp: { op: 'replace', start: 4, end: 4 } }),
    ev(7, 'assistant/message', { message: { role: 'assistant', content: [{ type: 'text', text: 'ok' }] }, finishReason: 'stop', surfaceOp: { op: 'append' } }),
  ))
  assert.equal(t.format, 'dsh')
  assert.deepEqual(t.envelope, { system: 'sys', tools: [{ name: 'read_file', parameters: { type: 'object' } }] })
  assert.deepEqual(t.messages.map(m => m.role), ['user', 'assistant', 'tool', 'assistant'])
  assert.equal(codePoints(textOf(t.messages[2])), 9000)
  assert.deepEqual(t.usage, [{ promptTokens: 50, completionTokens: 5 }, undefined])
  assert.ok(t.notes.some(n => n.startsWith('skipped 1 replace event(s)')))
})

test('dsh: a log written by Session (with a prune) reads back as the history before the prune', async () => {
  const store = new MemoryStore()
  const session = await Session.open(store, { id: 's1', now: () => 0 })
  logHeader(session, { model: 'm', baseURL: 'http://127.0.0.1:1', system: 'sys', tools: [{ name: 'read_file', parameters: { type: 'object' } }] })
  session.append('user/message', { message: { role: 'user', content: 'read big.txt' }, surfaceOp: { op: 'append' } })
  session.append('assistant/message', {
    message: { role: 'assistant', content: [{ type: 'tool-call', id: 'c1', name: 'read_file', arguments: '{"path":"big.txt"}' }] },
    usage: { promptTokens: 40, completionTokens: 9 }, finishReason: 'tool_calls', surfaceOp: { op: 'append' },
  })
  const big = '🎯'.repeat(10_000) // 10,000 code points, 20,000 UTF-16 units
  const result = session.append('tool/result', { message: { role: 'tool', toolCallId: 'c1', content: [{ type: 'text', text: big }] }, surfaceOp: { op: 'append' } })
  assert.ok(pruneToolResult(session, result.seq) > 0)
  session.append('assistant/message', { message: { role: 'assistant', content: [{ type: 'text', text: 'done' }] }, finishReason: 'stop', surfaceOp: { op: 'append' } })
  await stateOf(session).flush()
  const text = store.events.map(e => JSON.stringify(e)).join('\n') + '\n'

  assert.equal(detectTranscriptFormat(text), 'dsh')
  const t = readTranscript(text)
  assert.deepEqual(t.envelope, { system: 'sys', tools: [{ name: 'read_file', parameters: { type: 'object' } }] })
  assert.deepEqual(t.messages.map(m => m.role), ['user', 'assistant', 'tool', 'assistant'])
  assert.equal(textOf(t.messages[2]), big, 'the original result, not the pruned one')
  assert.deepEqual(t.usage, [{ promptTokens: 40, completionTokens: 9 }, undefined])
  assert.ok(t.notes.some(n => n.startsWith('skipped 1 replace event(s)')))
  // The session's own surface holds the pruned result instead.
  assert.ok(textOf(session.messages()[2]).includes(PRUNE_MARKER))
})

// ── errors: what is wrong, where, and the accepted formats; never a raw SyntaxError/TypeError ──

const ERRORS: { name: string; text: string; format?: TranscriptFormat; line?: number; field?: string; says: RegExp }[] = [
  { name: 'random text', text: '\n\nhello, this is not a transcript\n', line: 3, says: /not JSON: the first non-blank line starts with "hello/ },
  { name: 'empty file', text: '  \n', says: /the file is empty/ },
  // JSON, but not an object or array: named as the JSON value it is, not "not JSON".
  { name: 'JSON null', text: 'null\n', says: /^a JSON null is not a transcript \(a transcript is a JSON object or array, or JSONL\)/ },
  { name: 'JSON string', text: '"hello"', says: /^a JSON string is not a transcript/ },
  { name: 'JSON number 42', text: ' 42 ', says: /^a JSON number is not a transcript/ },
  { name: 'JSON object without messages', text: '{"foo": 1, "bar": [2]}', says: /^a JSON object that matches no format \(mini-swe-agent: an object with "trajectory_format": "mini-swe-agent…", or with "messages" and "info.mini_version"; swe-agent: an object with "history", or a "trajectory" of steps; openai: an array of messages, or an object with "messages"; dsh: one dsh event \{seq, type, time, data\}; claude-code: one Claude Code entry \{type, uuid or sessionId, message\}\); its keys are "foo", "bar"/ },
  { name: 'JSON number', text: '[1, 2]', field: '[0]', says: /a message must be an object, got number/ },
  { name: 'JSONL with a broken line 3', text: '{"seq":0,"type":"session/start","time":0,"data":{}}\n{"seq":1,"type":"turn/start","time":1,"data":{}}\n{"seq":2,"type":\n{"seq":3,"type":"turn/end","time":3,"data":{}}\n', line: 3, says: /not valid JSON/ },
  { name: 'JSONL line that is not an object', text: '{"type":"summary","leafUuid":"x","summary":"s"}\n[1]\n', line: 2, says: /must be a JSON object, got array/ },
  { name: 'JSONL of unknown events', text: '{"event":"x"}\n{"event":"y"}\n', line: 1, says: /JSONL that matches no format \(openai: request\/response lines \{request: \{messages\}, response\}; dsh: a first line that is a dsh event \{seq, type, time, data\}; claude-code: Claude Code entries \{type, uuid or sessionId, message\} among the first 50 lines\); its first line's keys are "event"/ },
  { name: 'pretty JSON broken on line 3', text: '{\n  "messages": [\n    {"role": "user",, }\n  ]\n}', line: 3, says: /not valid JSON/ },
  { name: 'unknown role', text: JSON.stringify({ messages: [{ role: 'user', content: 'a' }, { role: 'critic', content: 'b' }] }), field: 'messages[1].role', says: /unknown role "critic"; accepted roles: system, developer, user, assistant, tool, function/ },
  { name: 'tool call without id', text: JSON.stringify([{ role: 'assistant', tool_calls: [{ function: { name: 'x', arguments: '{}' } }] }]), field: '[0].tool_calls[0].id', says: /needs a string "id"/ },
  { name: 'tool message without tool_call_id', text: JSON.stringify([{ role: 'tool', content: 'x' }]), field: '[0].tool_call_id', says: /tool_call_id/ },
  { name: 'empty message array', text: '[]', says: /the message array is empty/ },
  { name: 'empty "messages"', text: '{"messages": []}', field: 'messages', says: /the message array is empty/ },
  { name: 'OpenHands event list', text: JSON.stringify([{ id: 0, source: 'user', action: 'message', args: {} }]), field: '[0].role', says: /OpenHands/ },
  { name: 'claude-code forced on a JSON array', text: '[{"role":"user","content":"x"}]', format: 'claude-code', says: /is JSONL .* but this file is a JSON array/ },
  { name: 'openai forced on JSONL', text: jsonl(ev(0, 'a', {}), ev(1, 'b', {})), format: 'openai', line: 1, says: /one JSON document, but this file is JSONL/ },
  { name: 'dsh forced on Claude Code lines', text: jsonl(cc('u1', null, 'user', { role: 'user', content: 'x' })), format: 'dsh', line: 1, field: 'seq', says: /a dsh log line is an event/ },
  { name: 'dsh request/header with bad tools', text: jsonl(ev(0, 'session/start', {}), ev(1, 'request/header', { tools: [{ description: 'no name' }] })), line: 2, field: 'data.tools[0]', says: /a tool spec needs a string "name"/ },
  { name: 'claude-code user line without message', text: jsonl({ type: 'user', uuid: 'u', sessionId: 's', parentUuid: null }), line: 1, field: 'message', says: /needs a "message" object/ },
  { name: 'claude-code tool_result without id', text: jsonl(cc('u', null, 'user', { role: 'user', content: [{ type: 'tool_result', content: 'x' }] })), line: 1, field: 'message.content[0].tool_use_id', says: /tool_use_id/ },
  { name: 'mini-swe-agent content not a string', text: JSON.stringify({ trajectory_format: 'mini-swe-agent-1', messages: [{ role: 'user', content: 5 }] }), field: 'messages[0].content', says: /must be a string or an array of parts/ },
  { name: 'swe-agent empty history', text: JSON.stringify({ history: [], trajectory: [] }), field: 'history', says: /history is empty/ },
  { name: 'unknown format option', text: '[]', format: 'csv' as TranscriptFormat, field: 'format', says: /unknown format "csv"/ },
]
for (const c of ERRORS) {
  test(`error: ${c.name}`, () => {
    let caught: unknown
    try { readTranscript(c.text, c.format ? { format: c.format } : {}) } catch (err) { caught = err }
    assert.ok(caught instanceof TranscriptError, `expected a TranscriptError, got ${String(caught)}`)
    assert.equal(caught.name, 'TranscriptError')
    assert.equal(caught.line, c.line)
    assert.equal(caught.field, c.field)
    assert.match(caught.message, c.says)
    // Every format of the readers' table, in its order, with what its files look like.
    assert.match(caught.message, new RegExp(`Accepted formats: ${TRANSCRIPT_FORMATS.map((f) => `${f} \\(`).join('.*')}`))
    if (c.line !== undefined) assert.match(caught.message, new RegExp(`^line ${c.line}\\b`))
  })
}

test('detectTranscriptFormat throws the same TranscriptError for a broken file', () => {
  assert.throws(() => detectTranscriptFormat('{"seq":0,"type":"a","time":0,"data":{}}\n{oops}\n{"seq":2}\n'),
    (err: unknown) => err instanceof TranscriptError && err.line === 2)
})

test('the readers table drives the format list, the help and the --format check', () => {
  // Detection order: the specific JSON shapes before openai's generic one.
  assert.deepEqual(TRANSCRIPT_FORMATS, ['mini-swe-agent', 'swe-agent', 'openai', 'dsh', 'claude-code'])
  const help = cliHelp()
  for (const f of TRANSCRIPT_FORMATS) assert.match(help, new RegExp(`^ {4}${f} +\\S`, 'm'), `help lists ${f}`)
  assert.match(help, new RegExp(`--format F +force a format: ${TRANSCRIPT_FORMATS.join(', ')}`))
  assert.throws(() => parseCliArgs(['replay', 'x', '--format', 'csv'], {}), { message: `--format must be one of auto, ${TRANSCRIPT_FORMATS.join(', ')}, got "csv"` })
  for (const f of TRANSCRIPT_FORMATS) assert.equal((parseCliArgs(['replay', 'x', '--format', f], {}) as { format: string }).format, f)
  // An inherited property name is no format.
  assert.throws(() => readTranscript('[]', { format: 'toString' as TranscriptFormat }), /unknown format "toString"/)
})

// ── variants the corpus does not hold: other versions of each tool (hostile review D) ──

test('mini-swe-agent v2 text-based (mini-swe-agent-1.1): ```mswea_bash_command actions, extra.actions, an exception result, the "exit" message skipped', () => {
  const usage = (p: number, c: number) => ({ response: { usage: { prompt_tokens: p, completion_tokens: c } } })
  const t = readTranscript(JSON.stringify({
    trajectory_format: 'mini-swe-agent-1.1',
    info: { mini_version: '2.0.0', exit_status: 'Submitted', config: { model: { action_regex: '```mswea_bash_command\\s*\\n(.*?)\\n```' } } },
    messages: [
      { role: 'system', content: 'sys' },
      { role: 'user', content: 'task' },
      { role: 'assistant', content: 'THOUGHT: look\n\n```mswea_bash_command\nls\n```', extra: { actions: [{ command: 'ls' }], ...usage(100, 9) } },
      { role: 'user', content: '<returncode>0</returncode>\n<output>\na\n</output>', extra: { returncode: 0, exception_info: '' } },
      { role: 'assistant', content: '```mswea_bash_command\nsleep 99\n```', extra: { actions: [{ command: 'sleep 99' }], ...usage(200, 8) } },
      { role: 'user', content: '<exception>timed out</exception>\n<returncode>-1</returncode>', extra: { returncode: -1, exception_info: 'An error occurred while executing the command: timed out' } },
      { role: 'assistant', content: 'two\n```mswea_bash_command\na\n```\n```mswea_bash_command\nb\n```', extra: usage(300, 7) },
      { role: 'user', content: 'Expected exactly 1 action, found 2.', extra: { interrupt_type: 'FormatError' } },
      { role: 'exit', content: 'the diff', extra: { exit_status: 'Submitted', submission: 'the diff' } },
    ],
  }, null, 2))
  assert.equal(t.envelope.system, 'sys')
  assert.deepEqual(t.messages, [
    { role: 'user', content: 'task' },
    { role: 'assistant', content: [{ type: 'text', text: 'THOUGHT: look' }, { type: 'tool-call', id: 'mswea-call-2', name: 'bash', arguments: '{"command":"ls"}' }] },
    { role: 'tool', toolCallId: 'mswea-call-2', content: [{ type: 'text', text: '<returncode>0</returncode>\n<output>\na\n</output>' }] },
    { role: 'assistant', content: [{ type: 'tool-call', id: 'mswea-call-4', name: 'bash', arguments: '{"command":"sleep 99"}' }] },
    { role: 'tool', toolCallId: 'mswea-call-4', content: [{ type: 'text', text: '<exception>timed out</exception>\n<returncode>-1</returncode>' }], isError: true },
    { role: 'assistant', content: [{ type: 'text', text: 'two\n```mswea_bash_command\na\n```\n```mswea_bash_command\nb\n```' }] },
    { role: 'user', content: 'Expected exactly 1 action, found 2.' },
  ])
  assert.deepEqual(t.usage, [{ promptTokens: 100, completionTokens: 9 }, { promptTokens: 200, completionTokens: 8 }, { promptTokens: 300, completionTokens: 7 }])
  assert.ok(t.notes.some(n => n.startsWith('skipped 1 "exit" message(s)')), t.notes.join('\n'))
  assert.ok(t.notes.some(n => n.includes('2 assistant message(s) with exactly one ```mswea_bash_command action') && n.includes('1 with 0 or several')), t.notes.join('\n'))
})

test('mini-swe-agent v2 with tool calls: the "exit" message is skipped, not an unknown role', () => {
  const t = readTranscript(JSON.stringify({
    trajectory_format: 'mini-swe-agent-1.1', info: { mini_version: '2.0.0' },
    messages: [
      { role: 'system', content: 'sys' },
      { role: 'user', content: 'task' },
      { role: 'assistant', content: null, tool_calls: [{ id: 'c1', type: 'function', function: { name: 'bash', arguments: '{"command":"ls"}' } }],
        extra: { actions: [{ command: 'ls', tool_call_id: 'c1' }], response: { usage: { prompt_tokens: 50, completion_tokens: 5 } } } },
      { role: 'tool', tool_call_id: 'c1', content: '<returncode>0</returncode>', extra: { returncode: 0 } },
      { role: 'exit', content: 'LimitsExceeded', extra: { exit_status: 'LimitsExceeded', submission: '' } },
    ],
  }))
  assert.deepEqual(t.messages.map(m => m.role), ['user', 'assistant', 'tool'])
  assert.deepEqual(t.usage, [{ promptTokens: 50, completionTokens: 5 }])
  assert.ok(t.notes.some(n => n.startsWith('skipped 1 "exit" message(s)')), t.notes.join('\n'))
})

test('mini-swe-agent: content as a list of parts (v2 multimodal), and the XML action of its swebench_xml config', () => {
  const t = readTranscript(JSON.stringify({
    trajectory_format: 'mini-swe-agent-1.1', info: { config: { model: { action_regex: '<mswea_bash_command>(.*?)</mswea_bash_command>' } } },
    messages: [
      { role: 'system', content: [{ type: 'text', text: 'sys' }] },
      { role: 'user', content: [{ type: 'text', text: 'task' }] },
      { role: 'assistant', content: [{ type: 'text', text: 'THOUGHT: x\n<mswea_bash_command>cat a.png</mswea_bash_command>' }] },
      { role: 'user', content: [{ type: 'text', text: '<returncode>0</returncode>' }, { type: 'image_url', image_url: { url: 'data:image/png;base64,AAAA' } }] },
    ],
  }))
  assert.equal(t.envelope.system, 'sys')
  assert.deepEqual(t.messages, [
    { role: 'user', content: [{ type: 'text', text: 'task' }] },
    { role: 'assistant', content: [{ type: 'text', text: 'THOUGHT: x' }, { type: 'tool-call', id: 'mswea-call-2', name: 'bash', arguments: '{"command":"cat a.png"}' }] },
    { role: 'tool', toolCallId: 'mswea-call-2', content: [{ type: 'text', text: '<returncode>0</returncode>' }, { type: 'image', image_url: { url: 'data:image/png;base64,AAAA' } }] },
  ])
  // a content that is neither a string nor parts is still the transcript's error, at its field
  assert.throws(() => readTranscript(JSON.stringify({ trajectory_format: 'mini-swe-agent-1', messages: [{ role: 'user', content: { text: 'x' } }] })),
    (e: unknown) => e instanceof TranscriptError && e.field === 'messages[0].content')
})

test('openai: the legacy function_call and its "function" result are a paired tool call; a refusal is text; input_text/output_text parts are text', () => {
  const t = readTranscript(JSON.stringify([
    { role: 'user', content: [{ type: 'input_text', text: 'weather?' }] },
    { role: 'assistant', content: null, function_call: { name: 'get_weather', arguments: '{"city":"Paris"}' } },
    { role: 'function', name: 'get_weather', content: '{"t":20}' },
    { role: 'assistant', content: [{ type: 'output_text', text: 'It is 20.' }] },
    { role: 'function', name: 'get_weather', content: 'no call is open' },
    { role: 'user', content: 'and tomorrow?' },
    { role: 'assistant', content: null, refusal: 'I cannot forecast.' },
  ]))
  assert.deepEqual(t.messages, [
    { role: 'user', content: [{ type: 'text', text: 'weather?' }] },
    { role: 'assistant', content: [{ type: 'tool-call', id: 'function-call-1', name: 'get_weather', arguments: '{"city":"Paris"}' }] },
    { role: 'tool', toolCallId: 'function-call-1', content: [{ type: 'text', text: '{"t":20}' }] },
    { role: 'assistant', content: [{ type: 'text', text: 'It is 20.' }] },
    { role: 'user', content: 'and tomorrow?' },
    { role: 'assistant', content: [{ type: 'text', text: 'I cannot forecast.' }] },
  ])
  assert.ok(t.notes.some(n => n.startsWith('1 legacy function_call(s) read as tool calls')), t.notes.join('\n'))
  assert.ok(t.notes.some(n => n.startsWith('dropped 1 tool result(s)') && n.includes('function get_weather ([4])')), t.notes.join('\n'))
  assert.throws(() => readTranscript(JSON.stringify([{ role: 'assistant', content: null, function_call: { arguments: '{}' } }])),
    (e: unknown) => e instanceof TranscriptError && e.field === '[0].function_call.name')
})

test('swe-agent without function calling: an action is a bash tool call, the observation after it its result (the first observation, the task, stays the user\'s)', () => {
  const history = [
    { message_type: 'system_prompt', role: 'system', content: 'SETTING', agent: 'primary' },
    { message_type: 'observation', role: 'user', content: 'ISSUE: fix it', agent: 'primary' },
    { message_type: 'action', role: 'assistant', content: "Let's list.\n```\nls -F\n```", thought: "Let's list.", action: 'ls -F\n', agent: 'primary' },
    { message_type: 'observation', role: 'user', content: 'AUTHORS.rst\nsetup.py', agent: 'primary' },
    { message_type: 'action', role: 'assistant', content: 'DISCUSSION\nOpen it.\n\n```\nopen setup.py\n```\n', thought: 'Open it.', action: 'open setup.py', agent: 'primary' },
    { message_type: 'observation', role: 'user', content: '[File: setup.py]\n1:import re', agent: 'primary' },
  ]
  const expected = [
    { role: 'user', content: 'ISSUE: fix it' },
    { role: 'assistant', content: [{ type: 'text', text: "Let's list." }, { type: 'tool-call', id: 'swe-call-2', name: 'bash', arguments: '{"command":"ls -F\\n"}' }] },
    { role: 'tool', toolCallId: 'swe-call-2', content: [{ type: 'text', text: 'AUTHORS.rst\nsetup.py' }] },
    { role: 'assistant', content: [{ type: 'text', text: 'DISCUSSION\nOpen it.' }, { type: 'tool-call', id: 'swe-call-4', name: 'bash', arguments: '{"command":"open setup.py"}' }] },
    { role: 'tool', toolCallId: 'swe-call-4', content: [{ type: 'text', text: '[File: setup.py]\n1:import re' }] },
  ]
  const t = readTranscript(JSON.stringify({ environment: 'swe_main', history, trajectory: [], info: {} }, null, 2))
  assert.equal(t.envelope.system, 'SETTING')
  // an action that is not fenced in the text leaves the text as it is (only a fenced action is moved out)
  const unfenced = readTranscript(JSON.stringify({ history: [history[1], { ...history[2], content: 'Use ls -F here.', action: 'ls -F' }, history[3]] }))
  assert.deepEqual(unfenced.messages[1].content, [{ type: 'text', text: 'Use ls -F here.' }, { type: 'tool-call', id: 'swe-call-1', name: 'bash', arguments: '{"command":"ls -F"}' }])
  assert.deepEqual(t.messages, expected)
  assert.ok(t.notes.some(n => n.startsWith('2 action(s) without native tool calls read as `bash` tool calls')), t.notes.join('\n'))
  // the same history as the last step's messages of a file without "history"
  const fromSteps = readTranscript(JSON.stringify({ trajectory: [{ action: 'ls -F\n', observation: 'x', messages: history.slice(0, 4) }, { action: 'open setup.py', observation: 'y', messages: history }], info: {} }))
  assert.equal(fromSteps.format, 'swe-agent')
  assert.deepEqual(fromSteps.messages, expected)
  assert.ok(fromSteps.notes.some(n => n.startsWith('no "history": read the last step\'s messages (trajectory[1].messages)')), fromSteps.notes.join('\n'))
})

test('swe-agent: a file with only "trajectory" steps (no messages in them) is rebuilt from response, action and observation', () => {
  const t = readTranscript(JSON.stringify({ trajectory: [
    { action: 'ls -F\n', observation: 'AUTHORS', response: "Let's list.\n```\nls -F\n```", thought: "Let's list.", state: '{}' },
    { action: 'submit', observation: 'diff --git a/x b/x', response: 'Done.\n```\nsubmit\n```', thought: 'Done.' },
  ], info: { exit_status: 'submitted' } }))
  assert.equal(t.format, 'swe-agent')
  assert.deepEqual(t.messages, [
    { role: 'assistant', content: [{ type: 'text', text: "Let's list." }, { type: 'tool-call', id: 'swe-call-0', name: 'bash', arguments: '{"command":"ls -F\\n"}' }] },
    { role: 'tool', toolCallId: 'swe-call-0', content: [{ type: 'text', text: 'AUTHORS' }] },
    { role: 'assistant', content: [{ type: 'text', text: 'Done.' }, { type: 'tool-call', id: 'swe-call-2', name: 'bash', arguments: '{"command":"submit"}' }] },
    { role: 'tool', toolCallId: 'swe-call-2', content: [{ type: 'text', text: 'diff --git a/x b/x' }] },
  ])
  assert.ok(t.notes.some(n => n.startsWith('no "history": rebuilt from the 2 trajectory steps')), t.notes.join('\n'))
  assert.throws(() => readTranscript(JSON.stringify({ trajectory: [{ action: 'ls' }, { thought: 5 }] }), { format: 'swe-agent' }),
    (e: unknown) => e instanceof TranscriptError && e.field === 'trajectory[1]' && /needs a string "action" or "observation"/.test(e.message))
})

test('openai request/response log (JSONL, a JSON array, one merged object): the longest request and its answer, each call\'s usage on the answer it produced', async () => {
  const call = (id: string) => ({ id, type: 'function', function: { name: 'sh', arguments: `{"cmd":"${id}"}` } })
  const m1 = [{ role: 'system', content: 'sys' }, { role: 'user', content: 'go' }]
  const a1 = { role: 'assistant', content: null, tool_calls: [call('c1')] }
  const m2 = [...m1, a1, { role: 'tool', tool_call_id: 'c1', content: 'out1' }]
  const a2 = { role: 'assistant', content: 'done' }
  const usage = (p: number, c: number) => ({ prompt_tokens: p, completion_tokens: c, prompt_tokens_details: { cached_tokens: p - 10 } })
  const entries = [
    { request: { model: 'gpt-4o', messages: m1, tools: [{ type: 'function', function: { name: 'sh', parameters: { type: 'object' } } }] },
      response: { id: 'chatcmpl-1', object: 'chat.completion', choices: [{ index: 0, message: a1, finish_reason: 'tool_calls' }], usage: usage(1200, 30) } },
    { request: { model: 'gpt-4o', messages: [{ role: 'user', content: 'another conversation' }] },
      response: { choices: [{ message: { role: 'assistant', content: 'x' } }], usage: usage(50, 1) } },
    { request: { model: 'gpt-4o', messages: m2, tools: [{ type: 'function', function: { name: 'sh', parameters: { type: 'object' } } }] },
      response: { choices: [{ message: a2, finish_reason: 'stop' }], usage: usage(1300, 5) } },
  ]
  const expected = [
    { role: 'user', content: 'go' },
    { role: 'assistant', content: [{ type: 'tool-call', id: 'c1', name: 'sh', arguments: '{"cmd":"c1"}' }] },
    { role: 'tool', toolCallId: 'c1', content: [{ type: 'text', text: 'out1' }] },
    { role: 'assistant', content: [{ type: 'text', text: 'done' }] },
  ]
  const expectedUsage = [{ promptTokens: 1200, completionTokens: 30, cachedTokens: 1190 }, { promptTokens: 1300, completionTokens: 5, cachedTokens: 1290 }]
  for (const text of [jsonl(...entries), JSON.stringify(entries, null, 2)]) {
    assert.equal(detectTranscriptFormat(text), 'openai')
    const t = readTranscript(text)
    assert.deepEqual(t.envelope, { system: 'sys', tools: [{ name: 'sh', parameters: { type: 'object' } }] })
    assert.deepEqual(t.messages, expected)
    assert.deepEqual(t.usage, expectedUsage)
    assert.ok(t.notes.some(n => n.startsWith('a request/response log of 3 call(s): the longest request\'s messages') && n.includes('usage of 2 call(s)') && n.includes('1 call(s) with usage are of another conversation')), t.notes.join('\n'))
  }
  // a side call logged after the session's last one (a title, a summary) does not stand for the session
  const side = { request: { messages: [{ role: 'user', content: 'Write a 5-word title for: go' }] }, response: { choices: [{ message: { role: 'assistant', content: 'Go' } }], usage: usage(40, 2) } }
  const withSide = readTranscript(jsonl(...entries, side))
  assert.deepEqual(withSide.messages, expected)
  assert.deepEqual(withSide.usage, expectedUsage)
  assert.ok(withSide.notes.some(n => n.includes('(line 3)') && n.includes('2 call(s) with usage are of another conversation')), withSide.notes.join('\n'))
  // the provider's prompt tokens reach the report as the recorded figures of its steps
  const { report } = await runReplay(jsonl(...entries), { contextWindow: 16_000 })
  assert.deepEqual(report.rows.filter(r => r.recordedPromptTokens !== undefined).map(r => r.recordedPromptTokens), [1200, 1300])
  // one object with the request's messages and the response's choices side by side: the answer is no longer dropped
  const merged = readTranscript(JSON.stringify({ model: 'gpt-4o', messages: m2, choices: [{ message: a2 }], usage: usage(1300, 5) }))
  assert.deepEqual(merged.messages, expected)
  assert.deepEqual(merged.usage, [undefined, expectedUsage[1]])
  // a broken message in the last request of a JSONL log is named by its line and field
  const bad = jsonl(entries[0], { request: { messages: [...m2.slice(0, 3), { role: 'critic', content: 'x' }] }, response: { choices: [] } })
  assert.throws(() => readTranscript(bad), (e: unknown) => e instanceof TranscriptError && e.line === 2 && e.field === 'request.messages[3].role' && /^line 2, field request\.messages\[3\]\.role: unknown role "critic"/.test(e.message))
  assert.throws(() => readTranscript(jsonl(entries[0], { response: {} })), (e: unknown) => e instanceof TranscriptError && e.line === 2 && e.field === 'request.messages')
})

test('a file that holds no conversation is an error that says what it held, never a report of 0 steps', () => {
  const cases: [string, string, RegExp][] = [
    ['claude-code, only summary and snapshot lines', jsonl({ type: 'summary', summary: 'x', leafUuid: 'u9' }, { type: 'file-history-snapshot', messageId: 'm', snapshot: {}, isSnapshotUpdate: false }),
      /^no conversation to replay: no "user" or "assistant" line, only 1 summary, 1 file-history-snapshot line\(s\)\. Accepted formats/],
    ['openai, only a system message', JSON.stringify([{ role: 'system', content: 'be brief' }]), /^no conversation to replay: the openai file holds no user, assistant or tool message/],
    ['dsh, only session/start', jsonl(ev(0, 'session/start', { id: 's', version: '0.1.0' })), /^no conversation to replay: the dsh file holds no user, assistant or tool message/],
    ['mini-swe-agent, only the system prompt and the exit', JSON.stringify({ trajectory_format: 'mini-swe-agent-1.1', messages: [{ role: 'system', content: 's' }, { role: 'exit', content: '' }] }),
      /^no conversation to replay: the mini-swe-agent file holds no user, assistant or tool message \(.*skipped 1 "exit" message/],
  ]
  for (const [name, text, says] of cases) {
    assert.throws(() => readTranscript(text), (e: unknown) => e instanceof TranscriptError && says.test(e.message), name)
  }
})

test('claude-code: a line written twice within one response adds nothing; a message.id reused by later responses (a gateway) does not merge them', () => {
  const usage = (i: number, o: number) => ({ input_tokens: i, output_tokens: o, cache_creation_input_tokens: 0, cache_read_input_tokens: 0 })
  const a = (uuid: string, parent: string, id: string, block: object, u: object, requestId?: string) =>
    cc(uuid, parent, 'assistant', { id, role: 'assistant', content: [block], usage: u }, requestId ? { requestId } : {})
  const text = jsonl(
    cc('u1', null, 'user', { role: 'user', content: 'first' }),
    a('a1', 'u1', 'msg_1', { type: 'text', text: 'looking' }, usage(100, 1), 'req_1'),
    a('a2', 'a1', 'msg_1', { type: 'text', text: 'looking' }, usage(100, 5), 'req_1'), // the same block again, a later usage snapshot
    a('a3', 'a2', 'msg_1', { type: 'tool_use', id: 't1', name: 'Bash', input: { command: 'ls' } }, usage(100, 9), 'req_1'),
    cc('r1', 'a3', 'user', { role: 'user', content: [{ type: 'tool_result', tool_use_id: 't1', content: 'a b' }] }),
    // a relay answers every request with the message id "ocgo" and no requestId
    a('g1', 'r1', 'ocgo', { type: 'tool_use', id: 't2', name: 'Bash', input: { command: 'pwd' } }, usage(200, 3)),
    cc('r2', 'g1', 'user', { role: 'user', content: [{ type: 'tool_result', tool_use_id: 't2', content: '/x' }] }),
    a('g2', 'r2', 'ocgo', { type: 'text', text: 'done' }, usage(300, 2)),
    cc('u2', 'g2', 'user', { role: 'user', content: 'again' }),
    a('g3', 'u2', 'ocgo', { type: 'text', text: 'ok' }, usage(400, 1)),
  )
  const t = readTranscript(text)
  assert.deepEqual(t.messages, [
    { role: 'user', content: 'first' },
    { role: 'assistant', content: [{ type: 'text', text: 'looking' }, { type: 'tool-call', id: 't1', name: 'Bash', arguments: '{"command":"ls"}' }] },
    { role: 'tool', toolCallId: 't1', content: [{ type: 'text', text: 'a b' }] },
    { role: 'assistant', content: [{ type: 'tool-call', id: 't2', name: 'Bash', arguments: '{"command":"pwd"}' }] },
    { role: 'tool', toolCallId: 't2', content: [{ type: 'text', text: '/x' }] },
    { role: 'assistant', content: [{ type: 'text', text: 'done' }] },
    { role: 'user', content: 'again' },
    { role: 'assistant', content: [{ type: 'text', text: 'ok' }] },
  ])
  assert.deepEqual(t.usage.map(u => u && [u.promptTokens, u.completionTokens]), [[100, 9], [200, 3], [300, 2], [400, 1]])
  assert.ok(t.notes.some(n => n.startsWith('skipped 1 content block(s) written again')), t.notes.join('\n'))
  assert.ok(t.notes.some(n => n.startsWith('2 response(s) reuse an earlier response\'s message.id')), t.notes.join('\n'))
  // lines of one response (one requestId) around a tool result written in between still make one message
  const interleaved = readTranscript(jsonl(
    cc('u1', null, 'user', { role: 'user', content: 'go' }),
    a('a1', 'u1', 'msg_1', { type: 'tool_use', id: 't1', name: 'Read', input: { file_path: 'a' } }, usage(100, 4), 'req_1'),
    cc('r1', 'a1', 'user', { role: 'user', content: [{ type: 'tool_result', tool_use_id: 't1', content: 'A' }] }),
    a('a2', 'r1', 'msg_1', { type: 'tool_use', id: 't2', name: 'Read', input: { file_path: 'b' } }, usage(100, 8), 'req_1'),
    cc('r2', 'a2', 'user', { role: 'user', content: [{ type: 'tool_result', tool_use_id: 't2', content: 'B' }] }),
  ))
  assert.deepEqual(interleaved.messages.map(m => m.role), ['user', 'assistant', 'tool', 'tool'])
  assert.deepEqual(interleaved.usage.map(u => u?.completionTokens), [8])
})

test('Responses API items: mini-swe-agent v2\'s response models (each answer the whole response object) and an openai list of items', () => {
  const response = (id: string, output: object[], input: number, out: number) => ({
    id, object: 'response', status: 'completed', output,
    usage: { input_tokens: input, output_tokens: out, input_tokens_details: { cached_tokens: input - 100 }, output_tokens_details: { reasoning_tokens: 3 } },
    extra: { actions: [{ command: 'ls', tool_call_id: 'fc1' }], cost: 0.01 },
  })
  const t = readTranscript(JSON.stringify({
    trajectory_format: 'mini-swe-agent-1.1', info: { mini_version: '2.0.0' },
    messages: [
      { role: 'system', content: 'sys' },
      { role: 'user', content: 'task' },
      response('resp_1', [
        { type: 'reasoning', id: 'rs_1', summary: [{ type: 'summary_text', text: 'list first' }], encrypted_content: 'gAAA' },
        { type: 'message', id: 'msg_1', role: 'assistant', content: [{ type: 'output_text', text: 'Listing.' }] },
        { type: 'function_call', id: 'fc_item', call_id: 'fc1', name: 'bash', arguments: '{"command":"ls"}' },
      ], 1500, 40),
      { type: 'function_call_output', call_id: 'fc1', output: '<returncode>0</returncode>', extra: { returncode: 0 } },
      { type: 'message', role: 'user', content: [{ type: 'input_text', text: 'No tool calls found in the response.' }], extra: { interrupt_type: 'FormatError' } },
      { role: 'exit', content: 'LimitsExceeded', extra: { exit_status: 'LimitsExceeded' } },
    ],
  }))
  assert.deepEqual(t.messages, [
    { role: 'user', content: 'task' },
    { role: 'assistant', content: [{ type: 'reasoning', text: 'list first' }, { type: 'text', text: 'Listing.' }, { type: 'tool-call', id: 'fc1', name: 'bash', arguments: '{"command":"ls"}' }] },
    { role: 'tool', toolCallId: 'fc1', content: [{ type: 'text', text: '<returncode>0</returncode>' }] },
    { role: 'user', content: [{ type: 'text', text: 'No tool calls found in the response.' }] },
  ])
  assert.deepEqual(t.usage, [{ promptTokens: 1500, completionTokens: 40, cachedTokens: 1400, reasoningTokens: 3 }])
  // an openai file that is a Responses input list: items in a row are one assistant message
  const o = readTranscript(JSON.stringify([
    { type: 'message', role: 'user', content: [{ type: 'input_text', text: 'go' }] },
    { type: 'function_call', call_id: 'a', name: 'sh', arguments: '{}' },
    { type: 'function_call', call_id: 'b', name: 'sh', arguments: '{"x":1}' },
    { type: 'function_call_output', call_id: 'a', output: 'A' },
    { type: 'function_call_output', call_id: 'b', output: 'B' },
    { type: 'message', role: 'assistant', content: [{ type: 'output_text', text: 'done' }] },
  ]))
  assert.deepEqual(o.messages.map(m => m.role), ['user', 'assistant', 'tool', 'tool', 'assistant'])
  assert.deepEqual(calls(o).map(c => c.id), ['a', 'b'])
  assert.ok(o.notes.some(n => n.startsWith('OpenAI Responses API items read as chat messages (6 item(s) → 5 message(s))')), o.notes.join('\n'))
  assert.throws(() => readTranscript(JSON.stringify([{ type: 'message', role: 'user', content: 'x' }, { type: 'web_search_call', id: 'w' }])),
    (e: unknown) => e instanceof TranscriptError && e.field === '[1].type' && /Responses API item of type "web_search_call", which replay does not read/.test(e.message))
})

test('claude-code stream-json output (claude -p --output-format stream-json): no parentUuid, so file order; parent_tool_use_id lines are a subagent\'s', () => {
  const line = (o: object) => ({ parent_tool_use_id: null, session_id: 'sess', ...o })
  const lines = [
    { type: 'system', subtype: 'init', session_id: 'sess', tools: ['Bash', 'Task'], model: 'claude-sonnet-4', uuid: 'i0' },
    line({ type: 'user', message: { role: 'user', content: 'list files' }, uuid: 'x1' }),
    line({ type: 'assistant', message: { id: 'msg_1', role: 'assistant', content: [{ type: 'tool_use', id: 't1', name: 'Task', input: { prompt: 'ls' } }], usage: { input_tokens: 3, cache_read_input_tokens: 9000, output_tokens: 20 } }, uuid: 'x2' }),
    line({ type: 'assistant', message: { id: 'msg_s', role: 'assistant', content: [{ type: 'text', text: 'subagent says' }], usage: { input_tokens: 50, output_tokens: 2 } }, parent_tool_use_id: 't1', uuid: 'x3' }),
    line({ type: 'user', message: { role: 'user', content: [{ type: 'tool_result', tool_use_id: 't1', content: 'a b' }] }, uuid: 'x4', tool_use_result: { stdout: 'a b' } }),
    line({ type: 'assistant', message: { id: 'msg_2', role: 'assistant', content: [{ type: 'text', text: 'two files' }], usage: { input_tokens: 3, cache_read_input_tokens: 9100, output_tokens: 4 } }, uuid: 'x5' }),
    { type: 'result', subtype: 'success', is_error: false, session_id: 'sess', usage: { input_tokens: 6 }, result: 'two files' },
  ]
  const expected = [
    { role: 'user', content: 'list files' },
    { role: 'assistant', content: [{ type: 'tool-call', id: 't1', name: 'Task', arguments: '{"prompt":"ls"}' }] },
    { role: 'tool', toolCallId: 't1', content: [{ type: 'text', text: 'a b' }] },
    { role: 'assistant', content: [{ type: 'text', text: 'two files' }] },
  ]
  // newer CLIs write a uuid on each line (the walk from the last line found only that line), older ones none (no format matched)
  for (const text of [jsonl(...lines), jsonl(...lines.map((l) => { const { uuid: _, ...rest } = l as { uuid?: string }; return rest }))]) {
    assert.equal(detectTranscriptFormat(text), 'claude-code')
    const t = readTranscript(text, { sidechains: true })
    assert.deepEqual(t.messages, expected)
    assert.deepEqual(t.usage.map(u => u?.promptTokens), [9003, 9103])
    assert.ok(t.notes.some(n => n.startsWith('lines without "parentUuid" (Claude Code\'s stream-json output): read in file order')), t.notes.join('\n'))
    assert.equal(t.sidechains?.length, 1)
    assert.deepEqual(t.sidechains![0].messages, [{ role: 'assistant', content: [{ type: 'text', text: 'subagent says' }] }])
  }
})

test('openai: a custom tool call (type "custom", free-form input) is a tool call; a function_call beside an empty tool_calls is still read', () => {
  const t = readTranscript(JSON.stringify([
    { role: 'user', content: 'run it' },
    { role: 'assistant', content: null, tool_calls: [{ id: 'call_1', type: 'custom', custom: { name: 'code_exec', input: 'print(1)' } }] },
    { role: 'tool', tool_call_id: 'call_1', content: '1' },
    { role: 'assistant', content: null, tool_calls: [], function_call: { name: 'f', arguments: '{}' } },
    { role: 'function', name: 'f', content: 'r' },
  ]))
  assert.deepEqual(calls(t), [
    { type: 'tool-call', id: 'call_1', name: 'code_exec', arguments: 'print(1)' },
    { type: 'tool-call', id: 'function-call-3', name: 'f', arguments: '{}' },
  ])
  assert.deepEqual(t.messages.filter(m => m.role === 'tool').map(m => textOf(m)), ['1', 'r'])
})
