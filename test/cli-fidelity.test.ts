// The CLI side of fidelity across compaction (docs/design.md §12, issue 15 cases 3, 4, 5): project
// instructions from AGENTS.md / CLAUDE.md, /compact FOCUS, /pin and /context in interactive mode
// (under a pseudo-terminal), and `dsh show`. Child processes against test/fake-provider.ts.
import { test, describe, after } from 'node:test'
import { tuned, ladderTuned } from './tuning.ts'
import assert from 'node:assert/strict'
import { spawn, spawnSync } from 'node:child_process'
import { mkdtemp, writeFile, readFile, realpath, rm } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { startFakeProvider, type FakeProvider, type FakeReply, type FakeRequest } from './fake-provider.ts'
import { runDsh, CLEAN_ENV, DSH, TSX, ROOT } from './cli-child.ts'
import { sharedPath, skipWithoutShared } from './shared.ts'
import {
  Agent, Session, FileStore, openAICompatible, estimateMessageTokens, type Tool,
} from '../dsh.ts'
import {
  CHECKPOINT_PREAMBLE,
} from './spec.ts'

const temps: string[] = []
const fakes: FakeProvider[] = []
after(async () => {
  for (const f of fakes) await f.close()
  for (const dir of temps) await rm(dir, { recursive: true, force: true })
})
async function tempDir(): Promise<string> {
  const dir = await realpath(await mkdtemp(join(tmpdir(), 'dsh-fid-')))
  temps.push(dir)
  return dir
}
/** Conversation replies from `script` in order; every summary request (x-dsh-purpose: compaction) gets `summary`. */
async function fake(script: FakeReply[], summary = 'ok'): Promise<FakeProvider> {
  let c = 0
  const f = await startFakeProvider({ handler: (req: FakeRequest) => req.headers['x-dsh-purpose'] === 'compaction' ? { text: summary } : script[Math.min(c++, script.length - 1)] })
  fakes.push(f)
  return f
}
const flags = (f: FakeProvider) => ['--base-url', f.url, '--model', 'm', '--context-window', '16000']
const isSummary = (r: FakeRequest) => r.headers['x-dsh-purpose'] === 'compaction'
const reads = (k: number) => Array.from({ length: k }, (_, i) => ({ toolCalls: [{ id: `r${i}`, name: 'read_file', arguments: { path: `f${i % 3}.txt` } }] }))
/** Three 7,000-byte files (under the 8,192-code-point prune threshold: only a compaction can make room). */
async function workspace(files: Record<string, string> = {}): Promise<string> {
  const cwd = await tempDir()
  for (let i = 0; i < 3; i++) await writeFile(join(cwd, `f${i}.txt`), `file ${i}\n`.padEnd(7_000, 'x'))
  for (const [name, text] of Object.entries(files)) await writeFile(join(cwd, name), text)
  return cwd
}

describe('case 3: project instructions', () => {
  const AGENTS = '# Rules\nRun `npm test` before saying you are done.\nNever edit generated/.\n'
  test('AGENTS.md is in the system prompt of every request, before and after a compaction; the start says so', async () => {
    const cwd = await workspace({ 'AGENTS.md': AGENTS, 'CLAUDE.md': 'not this one' })
    const f = await fake([...reads(8), { text: 'done' }])
    // --no-clear: the clear rung (docs/design.md §10) would relieve this session without a summary.
    const run = await runDsh(['-p', 'read them all', '--no-clear', ...flags(f)], cwd)
    assert.equal(run.code, 0, run.stderr)
    assert.equal(run.stdout, 'done\n')
    assert.match(run.stderr, new RegExp(`^\\[dsh\\] project instructions: AGENTS\\.md \\(${AGENTS.length} bytes\\) is in the system prompt of every request; --no-project-instructions leaves it out\\n`))
    assert.ok(f.requests.some(isSummary), 'a compaction happened')
    const firstSummary = f.requests.findIndex(isSummary)
    assert.ok(f.requests.slice(firstSummary + 1).some((r) => !isSummary(r)), 'a conversation request after the compaction')
    const expected = `Project instructions from AGENTS.md in the working directory; follow them throughout the session:\n\n${AGENTS.trim()}`
    for (const r of f.requests) {
      assert.equal(r.body.messages[0].role, 'system')
      assert.ok(r.body.messages[0].content.endsWith(`\n\n${expected}`), r.body.messages[0].content)
      assert.ok(!r.rawBody.includes('not this one'))
    }
    // After the compaction the request holds the checkpoint (right after the input, whose turn's older steps it folds); the instructions stay in the system prompt.
    const after = f.requests.slice(firstSummary + 1).find((r) => !isSummary(r))!
    assert.deepEqual(after.body.messages[1], { role: 'user', content: 'read them all' })
    assert.ok(after.body.messages[2].content.startsWith(CHECKPOINT_PREAMBLE))
  })

  test('CLAUDE.md is the fallback; --no-project-instructions leaves it out', async () => {
    const cwd = await workspace({ 'CLAUDE.md': 'Use tabs.' })
    const f = await fake([{ text: 'a' }, { text: 'b' }])
    const run = await runDsh(['-p', 'hi', ...flags(f)], cwd)
    assert.equal(run.code, 0, run.stderr)
    assert.match(run.stderr, /^\[dsh\] project instructions: CLAUDE\.md \(9 bytes\)/)
    assert.ok(f.requests[0].body.messages[0].content.endsWith('\n\nProject instructions from CLAUDE.md in the working directory; follow them throughout the session:\n\nUse tabs.'))
    const off = await runDsh(['-p', 'hi', ...flags(f), '--no-project-instructions'], cwd)
    assert.equal(off.code, 0, off.stderr)
    assert.equal(off.stderr, '')
    assert.ok(!f.requests[1].rawBody.includes('Use tabs.'))
  })

  test('an AGENTS.md over 64 KiB is refused with the numbers (exit 2), before any request', async () => {
    const cwd = await workspace({ 'AGENTS.md': 'a'.repeat(70_000) })
    const f = await fake([{ text: 'never' }])
    const run = await runDsh(['-p', 'hi', ...flags(f)], cwd)
    assert.equal(run.code, 2)
    assert.equal(run.stderr, 'dsh: AGENTS.md is 70,000 bytes, over the 65,536-byte limit for project instructions (they go into every request); shorten it or pass --no-project-instructions\n')
    assert.equal(f.requests.length, 0)
  })
})

describe('case 4 and /pin, /context: interactive mode under a pseudo-terminal', () => {
  const probe = spawnSync('script', ['--version'], { encoding: 'utf8' })
  const skip = probe.status === 0 && /util-linux/.test(probe.stdout) ? false : 'SKIPPED: `script` from util-linux is not available to give dsh a pseudo-terminal'
  if (skip) console.log(`# ${skip}`)
  test('/compact fix the parser first puts the focus into the summary request; /pin pins the last input; /context shows the checkpoint', { skip }, async () => {
    const cwd = await workspace()
    const f = await fake([...reads(3), { text: 'Read three files.' }], 'CHECKPOINT: three files read.')
    const quote = (s: string) => `'${s.replaceAll("'", `'\\''`)}'`
    const command = [process.execPath, '--import', TSX, DSH, ...flags(f), '--session', 's.jsonl', '--allow-shell'].map(quote).join(' ')
    const input = 'read the files\n/pin\n/compact fix the parser first\n/context\n/exit\n'
    const run = await new Promise<{ code: number | null; out: string }>((resolve, reject) => {
      const child = spawn('script', ['-qec', command, '/dev/null'], { cwd, env: { ...CLEAN_ENV, NO_COLOR: '1', TERM: 'dumb' }, stdio: ['pipe', 'pipe', 'pipe'] })
      let out = ''
      child.stdout.setEncoding('utf8').on('data', (t: string) => { out += t })
      child.stdin.end(input)
      const guard = setTimeout(() => child.kill('SIGKILL'), 30_000)
      child.on('error', reject)
      child.on('close', (code) => { clearTimeout(guard); resolve({ code, out: out.replaceAll('\r', '') }) })
    })
    assert.equal(run.code, 0, run.out)
    const summaries = f.requests.filter(isSummary)
    assert.equal(summaries.length, 1, run.out)
    assert.equal(summaries[0].body.messages.at(-1).role, 'user')
    assert.ok(summaries[0].body.messages.at(-1).content.endsWith('\n\nFocus of this checkpoint, as asked for: fix the parser first\nGive it the most detail; keep everything else that still matters.'))
    assert.match(run.out, /\[dsh\] \/compact \(focus: fix the parser first\): compacted; [\d,]+ → [\d,]+ tokens/)

    const log = (await readFile(join(cwd, 's.jsonl'), 'utf8')).trim().split('\n').map((l) => JSON.parse(l))
    const input1 = log.find((e) => e.type === 'user/message' && e.data.message.content === 'read the files')
    const pin = log.find((e) => e.type === 'surface/pin')
    assert.deepEqual(pin.data, { seq: input1.seq })
    const tokens = estimateMessageTokens({ role: 'user', content: 'read the files' })
    assert.match(run.out, new RegExp(`\\[dsh\\] pinned your last input \\(seq ${input1.seq}, ${tokens} tokens\\): it is never pruned, cleared or summarised; pinned messages hold ${tokens} tokens`))
    // The pinned input stayed out of the summary and first in place.
    assert.ok(!summaries[0].rawBody.includes('read the files'))
    const summary = log.find((e) => e.type === 'compaction/summary')
    assert.equal(summary.data.focus, 'fix the parser first')
    assert.ok(!summary.data.shadowedSeqs.includes(input1.seq))
    // /context: the parts of the next request and the checkpoint in full.
    assert.match(run.out, /next request: [\d,]+ \/ 16,000 tokens \(\d+\.\d%\), (anchored on provider usage|heuristic estimate)\n/)
    assert.match(run.out, new RegExp(`\\n  pinned +${tokens} tokens  1 message\\n`))
    assert.match(run.out, /\n  checkpoints +[\d,]+ tokens  1 checkpoint\n/)
    assert.match(run.out, new RegExp(`\\n  summarised +[\\d,]+ tokens  ${summary.data.shadowedSeqs.length} messages in 1 compaction\\n`))
    assert.match(run.out, /newest checkpoint: seq \d+, [\d,]+ tokens; verbatim in it: paths 1\/1, commands 0\/0, error lines 0\/0, user messages 0\/0 \(in the model's summary alone: 0\/1, 0\/0, 0\/0, 0\/0\)\n/)
    assert.match(run.out, /<compacted-summary>\nCHECKPOINT: three files read\.\n<\/compacted-summary>\n<ledger>\n[^]*files read:\n- f0\.txt\n<\/ledger>/, 'the region is the first step (the rest is the retained tail); the pinned input is not in it')
  })
})

describe('case 5: dsh show', () => {
  test('a session with a prune, a clear and a compaction: each printed with token figures; --checkpoints prints the checkpoint', async () => {
    const dir = await tempDir()
    const file = join(dir, 's.jsonl')
    const f = await fake([
      { toolCalls: [{ id: 'big', name: 'read_big', arguments: { path: 'big.txt' } }] },
      ...Array.from({ length: 3 }, (_, i) => ({ toolCalls: [{ id: `m${i}`, name: 'read_mid', arguments: { path: `mid${i}.txt` } }] })),
      { text: 'all read' }, { text: 'second turn' },
    ], 'SUMMARY: four files read.')
    const session = await Session.open(new FileStore(file))
    const provider = tuned({ maxRetries: 0 }, () => openAICompatible({ baseURL: f.url, model: 'm', apiKey: 'k', contextWindow: 16_000 }))
    const tools: Tool[] = [
      { name: 'read_big', description: 'big', parameters: { type: 'object' }, execute: () => 'B'.repeat(60_000) },
      { name: 'read_mid', description: 'mid', parameters: { type: 'object' }, execute: () => 'M'.repeat(7_000) },
    ]
    const agent = ladderTuned({ retainedTailRatio: 0.05 }, () => new Agent({ session, provider, tools, compaction: { clear: false } }))
    await agent.run('read everything')
    // A clear, by the log protocol of docs/design.md §10: compaction/clear, then the placeholder replacing the result.
    const mid = session.surface().find((n) => n.message.role === 'tool' && (n.message as any).toolCallId === 'm2')!
    session.append('compaction/clear', { shadowedSeqs: [mid.seq], shadowedTokenCount: mid.tokens })
    session.append('tool/result', { message: { role: 'tool', toolCallId: 'm2', content: [{ type: 'text', text: '[cleared] read_mid {"path":"mid2.txt"}' }] }, surfaceOp: { op: 'replace', start: mid.seq, end: mid.seq } })
    await agent.run('and then?')
    const compacted = await agent.compactNow()
    assert.equal(compacted.action, 'compacted')
    await session.sync()
    await session.store.close?.()

    const log = (await readFile(file, 'utf8')).trim().split('\n').map((l) => JSON.parse(l))
    const at = (type: string) => log.filter((e) => e.type === type)
    const prune = at('compaction/prune')[0], clear = at('compaction/clear')[0], summary = at('compaction/summary')[0], end = at('compaction/end')[0]
    assert.ok(prune && clear && summary && end, 'the log holds a prune, a clear and a compaction')
    const tokensOf = (seq: number) => estimateMessageTokens(log[seq].data.message)
    const group = (n: number) => n.toLocaleString('en-US')

    const run = await runDsh(['show', file], dir)
    assert.equal(run.code, 0, run.stderr)
    assert.equal(run.stderr, '')
    const out = run.stdout
    assert.match(out, new RegExp(`^dsh show ${file.replace(/[.*+?^${}()|[\]\\/]/g, '\\$&')}: ${log.length} events, 2 turn\\(s\\), \\d+ step\\(s\\), 1 prune\\(s\\), 1 clear\\(s\\), 1 compaction\\(s\\); surface now \\d+ messages, [\\d,]+ tokens\\n`))
    assert.ok(out.includes(`\n  [prune] #${prune.seq} tool result #${prune.data.shadowedSeqs[0]}: ${group(prune.data.shadowedTokenCount)} tokens → ${group(tokensOf(prune.seq + 1))} tokens (${group(prune.data.shadowedTokenCount - tokensOf(prune.seq + 1))} tokens reclaimed), pressure\n`), out)
    assert.equal(prune.data.shadowedTokenCount, 15_008)
    assert.ok(out.includes(`\n  [clear] #${clear.seq} tool result #${mid.seq}: ${group(mid.tokens)} tokens → ${group(tokensOf(clear.seq + 1))} tokens (${group(mid.tokens - tokensOf(clear.seq + 1))} tokens reclaimed)\n`), out)
    const checkpoint = log.find((e) => e.type === 'user/message' && e.data.compactionId === summary.data.id)
    const ids = summary.data.shadowedSeqs
    const start = log.find((e) => e.type === 'compaction/start' && e.data.id === summary.data.id) // a ladder/state calibration sample may sit between it and the summary
    assert.ok(out.includes(`\n  [compaction ${summary.data.id}] #${start.seq} started (manual)\n  #${checkpoint.seq} checkpoint ${summary.data.id}: ${ids.length} messages (seq ${ids[0]}..${ids.at(-1)}), ${group(summary.data.shadowedTokenCount)} tokens → ${group(tokensOf(checkpoint.seq))} tokens\n`), out)
    assert.ok(out.includes(`\n  [compaction ${summary.data.id}] context ${group(end.data.tokensBefore)} tokens → ${group(end.data.tokensAfter)} tokens\n`), out)
    assert.ok(out.includes(`\n  #${log.find((e) => e.type === 'user/message').seq} user: read everything\n`))
    assert.ok(out.includes(`\n  #${log.find((e) => e.type === 'tool/result').seq} read_big result, 15,008 tokens: ${'B'.repeat(80)}…\n`), out)
    assert.ok(!out.includes('SUMMARY: four files read.'), 'the checkpoint text only with --checkpoints')

    const full = await runDsh(['show', file, '--checkpoints'], dir)
    assert.equal(full.code, 0, full.stderr)
    const text: string = checkpoint.data.message.content
    assert.ok(full.stdout.includes(text.split('\n').map((l) => `      | ${l}`).join('\n')), full.stdout)
    assert.ok(text.includes('\n<compacted-summary>\nSUMMARY: four files read.\n</compacted-summary>\n<ledger>\n'))
  })

  test('bad input: no file, two files, an unknown flag, a missing file, a file that is not a dsh log', async () => {
    const dir = await tempDir()
    await writeFile(join(dir, 'x.json'), '[{"role":"user","content":"hi"}]\n')
    const cases: Array<[string[], number, string]> = [
      [['show'], 2, 'dsh: show needs one session log FILE, got 0: npx tsx dsh.ts show FILE [--checkpoints]\n'],
      [['show', 'a', 'b'], 2, 'dsh: show needs one session log FILE, got 2: npx tsx dsh.ts show FILE [--checkpoints]\n'],
      [['show', 'a', '--full'], 2, 'dsh: show takes FILE, --checkpoints and -C DIR, got "--full": npx tsx dsh.ts show FILE [--checkpoints]\n'],
      [['show', 'x.json'], 2, 'dsh: show: x.json: session log line 1: a JSON array, not a dsh event {seq, type, time, data} (is this a transcript? use `dsh replay FILE`)\n'],
    ]
    for (const [args, code, stderr] of cases) {
      const run = await runDsh(args, dir)
      assert.equal(run.code, code, args.join(' '))
      assert.equal(run.stderr, stderr)
    }
    const missing = await runDsh(['show', 'nope.jsonl'], dir)
    assert.equal(missing.code, 2)
    assert.match(missing.stderr, /^dsh: show: cannot read nope\.jsonl: ENOENT/)
  })
})

test('a torn last line is reported and shown without it; the file is not changed', async () => {
  const dir = await tempDir()
  const file = join(dir, 't.jsonl')
  const session = await Session.open(new FileStore(file))
  session.append('turn/start', { turn: 1 })
  session.append('user/message', { message: { role: 'user', content: 'hello' }, surfaceOp: { op: 'append' } })
  await session.sync(); await session.store.close?.()
  const text = (await readFile(file, 'utf8')) + '{"seq":3,"type":"turn/e'
  await writeFile(file, text)
  const run = await runDsh(['show', file], dir)
  assert.equal(run.code, 0, run.stderr)
  assert.equal(run.stderr, `dsh: show: ${file}: the last line (line 4, 23 bytes) is incomplete (a crash, or a writer still running); shown without it\n`)
  assert.match(run.stdout, /\n  #2 user: hello\n/)
  assert.equal(await readFile(file, 'utf8'), text)
})

test('dsh replay prints the fidelity line of its compactions', { skip: skipWithoutShared('corpus', 'psf__requests-1142.traj.json') }, async () => {
  // --no-clear: the figures are those of the summary path (with the clear rung this session needs no summary).
  const run = await runDsh(['replay', sharedPath('corpus', 'psf__requests-1142.traj.json'), '--context-window', '32000', '--no-clear'], ROOT)
  assert.equal(run.code, 0, run.stderr)
  // Every user message of the compacted region is in the checkpoint (before they had a budget of their own,
  // the task statement never fit); calibrated on the run's own tokens, the replay compacts once, at step 51.
  assert.match(run.stdout, /\n  fidelity +in checkpoints: paths 0\/0, commands 24\/24, error lines 0\/0, user messages 1\/1; in the summaries alone: 0\/0, 0\/24, 0\/0, 0\/1\n/)
  assert.ok(!run.stdout.includes('fidelity paths total'), 'one combined line, not one per figure')
})
