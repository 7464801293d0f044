// The interactive CLI's commands and terminal output (issue 27 items 6–8): /model, /compact when
// there is nothing to compact, the status line's rules, the /context bar. Child processes under a
// pseudo-terminal (util-linux `script`) against test/fake-provider.ts.
import { test, describe } from 'node:test'
import assert from 'node:assert/strict'
import { CLEAN_ENV, dshPtyDriven, fake, readLog, runFlags, skipWithoutPty, tempDir } from './cli-helpers.ts'
import type { FakeRequest } from './fake-provider.ts'

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
