// The interactive CLI's commands and terminal output (issue 27 items 6–8): /model, /compact when
// there is nothing to compact, the status line's rules, the /context bar. Child processes under a
// pseudo-terminal (util-linux `script`) against test/fake-provider.ts.
import { test, describe } from 'node:test'
import assert from 'node:assert/strict'
import { readFile } from 'node:fs/promises'
import { join } from 'node:path'
import { CLEAN_ENV, dshPtyDriven, fake, readLog, runFlags, skipWithoutPty, tempDir } from './cli-helpers.ts'
import type { FakeRequest } from './fake-provider.ts'
import { Agent, MemoryStore, Session, contextBar, openAICompatible, statusReporter, pruneToolResult } from '../dsh.ts'

const skip = skipWithoutPty
const PROMPT = '› '
const isSummary = (r: FakeRequest) => r.headers['x-dsh-purpose'] === 'compaction'
const conversation = (f: { requests: FakeRequest[] }) => f.requests.filter((r) => !isSummary(r))

describe('/model NAME [--context-window N]', () => {
  test('the next request goes to the new model; its request/header is logged at once, and the ladder measures against the new window then', { skip }, async () => {
    const cwd = await tempDir()
    const f = await fake((request) => (isSummary(request) ? { text: 'Summary: two long notes.' } : { text: 'noted' }))
    const note = (tag: string) => `${tag} ${'note '.repeat(1600)}\r` // ~2,000 tokens each
    const run = await dshPtyDriven([...runFlags(f, 32000), '--no-shell', '--session', 's.jsonl'], cwd, CLEAN_ENV, [
      { waitFor: PROMPT, send: note('first') }, { waitFor: PROMPT, send: note('second') },
      { waitFor: PROMPT, send: '/model\r' },
      { waitFor: PROMPT, send: '/model small-model --context-window 5000\r' },
      { waitFor: PROMPT, send: '/model x --context-window 0\r' },
      { waitFor: PROMPT, send: 'third\r' },
      { waitFor: PROMPT, send: '/exit\r' },
    ])
    assert.equal(run.code, 0, run.stdout)
    assert.match(run.stdout, /\[dsh\] model m at http:\/\/127\.0\.0\.1:\d+, 32,000-token window; to switch, type \/model NAME \[--context-window N\]/)
    assert.match(run.stdout, /\[dsh\] model small-model, 5,000-token window, from the next request; context [\d,]+ \/ 5,000 tokens \([\d.]+%\)( ~)? after dsh compacted for the new window \([\d,]+ tokens before\)\n/)
    assert.match(run.stdout, /\[dsh\] \/model: --context-window must be a positive whole number of tokens, got "0"/)
    const models = conversation(f).map((r) => r.body.model)
    assert.deepEqual(models, ['m', 'm', 'small-model'], 'the turns after /model go to the new model')
    const log = await readLog(`${cwd}/s.jsonl`)
    const header = log.findIndex((e) => e.type === 'request/header' && e.data.model === 'small-model')
    assert.ok(header > 0, 'a request/header names the new model')
    assert.equal(log[header].data.contextWindow, 5000)
    const summary = log.findIndex((e) => e.type === 'compaction/summary')
    const third = log.findIndex((e) => e.type === 'turn/start' && e.data.turn === 3)
    assert.ok(header < summary && summary < third, 'logged at /model: the header, then the compaction the new window needs, then the next turn')
    assert.equal(f.requests.filter(isSummary)[0].body.model, 'small-model', 'the new model writes the summary')
  })
})

describe('/model and the cost', () => {
  test('from a priced model to one without a price: a line says the session\'s cost is unknown from now on; to a DeepSeek model: its prices', { skip }, async () => {
    const cwd = await tempDir()
    const f = await fake(() => ({ text: 'ok' }))
    const run = await dshPtyDriven([...runFlags(f), '--no-shell', '--no-save', '--prices', '0.003,0.15,0.6'], cwd, CLEAN_ENV, [
      { waitFor: PROMPT, send: 'hello\r' }, { waitFor: PROMPT, send: '/model deepseek-v4-pro\r' }, { waitFor: PROMPT, send: '/model local-model --context-window 8000\r' },
      { waitFor: PROMPT, send: '/exit\r' },
    ])
    assert.equal(run.code, 0, run.stdout)
    assert.match(run.stdout, /\[dsh\] model deepseek-v4-pro, 1,048,576-token window, from the next request; context [\d,]+ \/ 1,048,576 tokens/)
    assert.equal(run.stdout.split("this session's cost is unknown from now on").length, 2, run.stdout)
    assert.match(run.stdout, /\[dsh\] model local-model, 8,000-token window[^\n]*\n\[dsh\] this session's cost is unknown from now on: local-model has no price \(dsh knows DeepSeek's\)\n/)
  })
})

describe('/compact', () => {
  test('nothing to compact: one plain sentence says why (an empty conversation; everything within the kept tail); nothing is logged', { skip }, async () => {
    const cwd = await tempDir()
    const f = await fake(() => ({ text: 'ok' }))
    const run = await dshPtyDriven([...runFlags(f), '--no-shell', '--session', 's.jsonl'], cwd, CLEAN_ENV, [
      { waitFor: PROMPT, send: '/compact\r' },
      { waitFor: PROMPT, send: 'hello\r' },
      { waitFor: PROMPT, send: '/compact\r' },
      { waitFor: PROMPT, send: '/exit\r' },
    ])
    assert.equal(run.code, 0, run.stdout)
    assert.match(run.stdout, /\[dsh\] \/compact: nothing to compact yet: the conversation is empty\n/)
    assert.match(run.stdout, /\[dsh\] \/compact: nothing to compact yet: the conversation is \d+ tokens, all within the newest 2,560 tokens \(16% of the window\) that compaction always keeps word for word\n/)
    assert.equal(f.requests.filter(isSummary).length, 0)
    const log = await readLog(`${cwd}/s.jsonl`)
    assert.deepEqual(log.filter((e) => e.type.startsWith('compaction/') || e.type === 'ladder/state'), [], 'no warning, no failure guard')
  })
})

describe('the status line prints only news', () => {
  test('the first step; then only when the occupancy or the cache-hit share moved 5 points, or a rung acted', async () => {
    // Every request reports the same usage: the cache-hit share stays 50%, the occupancy moves only with the input.
    const usage = { prompt_tokens: 1000, completion_tokens: 5, prompt_cache_hit_tokens: 500, prompt_cache_miss_tokens: 500 }
    const f = await fake((request) => {
      const last = request.body.messages.at(-1)
      if (last.role === 'user' && last.content === 'read it') return { toolCalls: [{ id: 'c1', name: 'read', arguments: {} }], usage }
      return { text: 'ok', usage }
    })
    const session = await Session.open(new MemoryStore())
    const lines: string[] = []
    let agent: Agent | undefined
    const status = statusReporter(() => agent, (line) => lines.push(line), true, false)
    agent = new Agent({ session, provider: openAICompatible({ baseURL: f.url, model: 'm', contextWindow: 1_000_000 }), tools: [{ name: 'read', description: 'read', parameters: { type: 'object' }, execute: () => 'y'.repeat(40_000) }], onEvent: status, recall: false })
    const statusLines = () => lines.filter((l) => l.startsWith('[dsh] context '))
    await agent.run('one')
    assert.equal(statusLines().length, 1, 'the first step prints')
    await agent.run('two')
    await agent.run('three')
    assert.equal(statusLines().length, 1, 'small steps print nothing')
    await agent.run('x'.repeat(240_000)) // +60,000 tokens: 6 points of the window
    assert.equal(statusLines().length, 2, 'a move of 6 points prints')
    assert.match(statusLines()[1], /^\[dsh\] context 6\d,\d{3} \/ 1,000,000 tokens \(6\.\d%\) · cost unknown \(no price for this model; --prices sets one\), cache hits 50%\n$/)
    await agent.run('read it') // a 10,008-token result: 1 point
    assert.equal(statusLines().length, 2, lines.join(''))
    // A prune of it (the rung's own edit, logged as the ladder logs it) saves 0.9 points: it is news all the same.
    const result = session.surface().findLast((n) => n.message.role === 'tool')!
    assert.equal(pruneToolResult(session, result.seq), 8_710)
    const pruned = lines.findIndex((l) => l.startsWith('[dsh] pruned read: 10,008 → 1,298 tokens'))
    assert.ok(pruned > 0, lines.join(''))
    await agent.run('after')
    assert.equal(statusLines().length, 3, lines.join(''))
    assert.ok(lines.indexOf(statusLines()[2]) > pruned, 'the status line follows the rung')
    await agent.run('and after')
    assert.equal(statusLines().length, 3, 'once: the rung was reported')
  })

  test('cost is "unknown" or a number in one session, never both: /usage before any request and after', { skip }, async () => {
    const cwd = await tempDir()
    const f = await fake(() => ({ text: 'ok' }))
    const unpriced = await dshPtyDriven([...runFlags(f), '--no-shell', '--no-save'], cwd, CLEAN_ENV, [
      { waitFor: PROMPT, send: '/usage\r' }, { waitFor: PROMPT, send: 'hello\r' }, { waitFor: PROMPT, send: '/usage\r' }, { waitFor: PROMPT, send: '/exit\r' },
    ])
    assert.equal(unpriced.code, 0, unpriced.stdout)
    assert.equal(unpriced.stdout.match(/cost unknown/g)?.length, 2 * 3 + 1, 'each /usage: the total, the conversation, the summaries; and the status line')
    assert.doesNotMatch(unpriced.stdout, /\$\d/)
    const priced = await dshPtyDriven([...runFlags(f), '--no-shell', '--no-save', '--prices', '0.003,0.15,0.6'], cwd, CLEAN_ENV, [
      { waitFor: PROMPT, send: '/usage\r' }, { waitFor: PROMPT, send: 'hello\r' }, { waitFor: PROMPT, send: '/usage\r' }, { waitFor: PROMPT, send: '/exit\r' },
    ])
    assert.equal(priced.code, 0, priced.stdout)
    assert.doesNotMatch(priced.stdout, /unknown/)
    assert.match(priced.stdout, /cost: \$0\.000000 so far/)
    assert.match(priced.stdout, /cost: \$0\.000\d+ so far/)
  })
})

describe('/context opens with a one-line bar', () => {
  test('contextBar: a cell per 1/40 of the window for envelope, pinned, checkpoints, recent and free; the parts scaled to the measured total', () => {
    const part = (tokens: number) => ({ tokens, messages: 1 })
    const b = { totalTokens: 8_000, anchored: true, contextWindow: 16_000, envelopeTokens: 2_000, pinned: part(400), checkpoints: part(1_600), messages: part(1_000), toolResults: { ...part(3_000), pruned: 0, cleared: 0 }, shadowed: { pruned: part(0), cleared: part(0), summarised: { ...part(0), compactions: 0 } } }
    assert.equal(contextBar(b), `${'█'.repeat(5)}${'▓'.repeat(1)}${'▒'.repeat(4)}${'░'.repeat(10)}${'·'.repeat(20)} █ envelope 13%  ▓ pinned 3%  ▒ checkpoints 10%  ░ recent 25%  · free 50%`)
    // Anchored at 10,000 for 8,000 heuristic tokens: each part × 1.25.
    assert.equal(contextBar({ ...b, totalTokens: 10_000 }), `${'█'.repeat(6)}${'▓'.repeat(1)}${'▒'.repeat(5)}${'░'.repeat(13)}${'·'.repeat(15)} █ envelope 16%  ▓ pinned 3%  ▒ checkpoints 13%  ░ recent 31%  · free 38%`)
    assert.match(contextBar({ ...b, contextWindow: undefined }), / █ envelope 25%  ▓ pinned 5%  ▒ checkpoints 20%  ░ recent 50% \(of the total: window unknown\)$/)
  })

  test('the bar is the first line of /context', { skip }, async () => {
    const cwd = await tempDir()
    const f = await fake(() => ({ text: 'ok' }))
    const run = await dshPtyDriven([...runFlags(f), '--no-shell', '--no-save'], cwd, CLEAN_ENV, [
      { waitFor: PROMPT, send: 'hello\r' }, { waitFor: PROMPT, send: '/context\r' }, { waitFor: PROMPT, send: '/exit\r' },
    ])
    assert.equal(run.code, 0, run.stdout)
    assert.match(run.stdout, /\/context\n[█▓▒░·]{40} █ envelope \d+%  ▓ pinned 0%  ▒ checkpoints 0%  ░ recent (<1|\d+)%  · free \d+%\nnext request: /)
  })
})

describe('input typed during a turn (under a pseudo-terminal)', () => {
  test('is queued with a line saying so and runs after the turn; a question of the turn never takes it as its answer', { skip }, async () => {
    const cwd = await tempDir()
    const f = await fake((request) => {
      const last = request.body.messages.at(-1)
      if (last.role === 'tool') return { text: 'Not written, as you said.' }
      if (last.content === 'write it') return { toolCalls: [{ name: 'write_file', arguments: { path: 'a.txt', content: 'alpha\n' } }], delayMs: 300 }
      return { text: `next: ${last.content}` }
    })
    // A terminal with cursor control: the live line shows while the model is awaited.
    const run = await dshPtyDriven([...runFlags(f), '--no-shell', '--no-save'], cwd, { ...CLEAN_ENV, TERM: 'xterm' }, [
      { waitFor: PROMPT, send: 'write it\r' },
      { waitFor: 'waiting for m', send: 'y\r' }, // typed ahead: not an answer to the question that comes
      { waitFor: 'Apply this change to a.txt?', send: 'n\r' },
      { waitFor: 'next: y', send: '' },
      { waitFor: PROMPT, send: '/exit\r' },
    ])
    assert.equal(run.code, 0, run.stdout)
    assert.match(run.stdout, /\[dsh\] queued, runs after this turn: y\n/)
    await assert.rejects(readFile(join(cwd, 'a.txt')), { code: 'ENOENT' }, 'the question was answered n, not by the typed-ahead y')
    const users = f.requests.map((r) => r.body.messages.at(-1)).filter((m: any) => m.role === 'user').map((m: any) => m.content)
    assert.deepEqual(users, ['write it', 'y'])
    assert.ok(f.requests[1].body.messages.at(-1).content.includes('declined by the user'))
    assert.match(run.stdout, /Not written, as you said\.\n[^]*› y\n[^]*next: y/)
  })
})
