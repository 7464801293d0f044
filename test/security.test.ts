// Security rules (docs/design.md §13) under hostile input: a prompt-injected model choosing tool
// arguments, a hostile or broken server, a second process. Each test fails without its fix.
import { test, describe } from 'node:test'
import assert from 'node:assert/strict'
import { readFileSync, writeFileSync } from 'node:fs'
import { readFile, readdir } from 'node:fs/promises'
import { join } from 'node:path'
import {
  Agent, Session, FileStore, MemoryStore, openAICompatible, stripControls, internals, type Tool,
} from '../dsh.ts'
import {
  spillName,
} from './spec.ts'

const { stateOf } = internals
import { ScriptedProvider, say } from './scripted-provider.ts'
import { FETCH_BASE, sseAnswer, sseResponse, startFakeProvider } from './fake-provider.ts'
import { tuned } from './tuning.ts'
import { runDsh, CLEAN_ENV, tempDirs } from './cli-child.ts'

const tempDir = tempDirs('dsh-sec-')

describe('the session log: tool-call arguments once, spill names from the seq', () => {
  test('ids "c:1", "c_1" and a 300-character id spill to three distinct artefacts; arguments are logged once', async () => {
    const dir = await tempDir()
    const longId = 'x'.repeat(300)
    const ids = ['c:1', 'c_1', longId]
    const big: Tool = { name: 'big', description: 'big output', parameters: { type: 'object' }, execute: (args: { n: string }) => `${args.n}:` + 'y'.repeat(300_000) }
    const provider = new ScriptedProvider(100_000, [
      { message: { role: 'assistant', content: ids.map((id, i) => ({ type: 'tool-call', id, name: 'big', arguments: JSON.stringify({ n: `out${i}` }) })) }, finishReason: 'tool_calls' },
      say('done'),
    ])
    const session = await Session.open(new FileStore(join(dir, 's.jsonl')))
    const agent = new Agent({ session, provider, tools: [big] }) // each result over the 256 KiB spill size
    const result = await agent.run('go')
    assert.equal(result.reason, 'stop')
    await session.store.close?.()
    const log = (await readFile(join(dir, 's.jsonl'), 'utf8')).trim().split('\n').map((l) => JSON.parse(l))
    const results = log.filter((e) => e.type === 'tool/result')
    assert.equal(results.length, 3)
    const files = (await readdir(join(dir, 's.jsonl.artefacts'))).sort()
    assert.deepEqual(files, results.map((e) => spillName(e.seq)).sort())
    for (const [i, e] of results.entries()) {
      assert.equal(e.data.message.toolCallId, ids[i])
      assert.ok((await readFile(e.data.spilled.ref, 'utf8')).startsWith(`out${i}:`), 'each original kept whole in its own artefact')
    }
    const calls = log.filter((e) => e.type === 'tool/call')
    assert.deepEqual(calls.map((e) => Object.keys(e.data).sort()), [['callId', 'name'], ['callId', 'name'], ['callId', 'name']])
    const text = await readFile(join(dir, 's.jsonl'), 'utf8')
    assert.equal(text.split('{\\"n\\":\\"out1\\"}').length - 1, 1, 'the arguments appear once in the log')
    // Resume still knows which calls were dispatched.
    const again = await Session.open(new FileStore(join(dir, 's.jsonl')), { readOnly: true })
    assert.ok(ids.every((id) => stateOf(again).dispatched.has(id)))
  })

  test('a result the store cannot spill is kept inline whole, answered, with a warning saying why', async () => {
    const store = new MemoryStore()
    store.putArtefact = async () => { throw new Error('ENOSPC: no space left on device') }
    const big: Tool = { name: 'big', description: 'big output', parameters: { type: 'object' }, execute: () => 'y'.repeat(300_000) }
    const provider = new ScriptedProvider(100_000, [
      { message: { role: 'assistant', content: [{ type: 'tool-call', id: 'c1', name: 'big', arguments: '{}' }] }, finishReason: 'tool_calls' },
      say('done'),
    ])
    const session = await Session.open(store)
    const warnings: string[] = []
    const agent = new Agent({ session, provider, tools: [big], onEvent: (e) => { if (e.type === 'warning') warnings.push(e.message) } })
    assert.equal((await agent.run('go')).reason, 'stop')
    const results = store.events.filter((e) => e.type === 'tool/result').map((e) => e.data as { message: { toolCallId: string; content: { text: string }[] }; spilled?: unknown })
    assert.deepEqual(results.map((r) => [r.message.toolCallId, r.message.content[0].text.length, r.spilled]), [['c1', 300_000, undefined]])
    assert.equal(warnings.filter((w) => /300000 bytes .*kept inline.*ENOSPC/.test(w)).length, 1, warnings.join('\n'))
  })

  // From the hostile review rev5: an artefact the store cannot make.
  test('spill: a tool result whose artefact cannot be stored still gets a result, and the session goes on', async () => {
    // The artefacts directory cannot be made (a file holds its name: a full or read-only disk fails the same way).
    const dir = await tempDir()
    const log = join(dir, 's.jsonl')
    writeFileSync(`${log}.artefacts`, 'not a directory')
    let calls = 0
    const fetch = async () => (++calls === 1 ? sseResponse([{ choices: [{ index: 0, delta: { tool_calls: [{ index: 0, id: 'c1',
      type: 'function', function: { name: 'read', arguments: '{}' } }] } }] },
    { choices: [{ index: 0, delta: {}, finish_reason: 'tool_calls' }] }], false) : sseAnswer('done'))
    const provider = tuned({ maxRetries: 0 }, () => openAICompatible({ ...FETCH_BASE, contextWindow: 1_000_000, fetch }))
    const session = await Session.open(new FileStore(log))
    // A result over the spill size (256 KiB) goes to the artefacts.
    const agent = new Agent({ session, provider, tools: [{ name: 'read', description: 'read',
      parameters: { type: 'object', properties: {} }, execute: () => 'z'.repeat(300 * 1024) }] })
    const first = await agent.run('go').then((r) => r.reason, (e: Error & { code?: string }) => `${e.code}: ${e.message}`)
    const second = await agent.run('again').then((r) => r.reason, (e: Error & { code?: string }) => `${e.code}: ${e.message}`)
    await session.store.close?.()
    const results = readFileSync(log, 'utf8').split('\n').filter(Boolean).map((l) => JSON.parse(l) as
      { type: string; data: { message?: { toolCallId?: string } } }).filter((e) => e.type === 'tool/result')
    // The call that ran has its result in the log (whole, or an error saying why), and the next turn can be sent.
    assert.deepEqual([results.map((e) => e.data.message?.toolCallId), second], [['c1'], 'stop'],
      `first turn: ${first}; second: ${second}`)
  })
})

describe('the DeepSeek key only over https: to its host', () => {
  for (const url of ['http://api.deepseek.com:8080', 'http://api.deepseek.com']) {
    test(`--base-url ${url} is refused (exit 2) before anything is sent`, async () => {
      const cwd = await tempDir()
      for (const extra of [[], ['--api-key-env', 'MY_KEY']]) {
        const run = await runDsh(['-p', 'hi', '--base-url', url, ...extra], cwd, { ...CLEAN_ENV, DEEPSEEK_API_KEY: 'sk-secret-1234', MY_KEY: 'sk-mine-5678' })
        assert.equal(run.code, 2, run.stderr)
        assert.equal(run.stderr, `dsh: --base-url "${url}" would send the DeepSeek API key unencrypted; use https://${new URL(url).host}\n`)
      }
    })
  }
})

describe('terminal control sequences from the model and the server are not printed', () => {
  const HOSTILE = 'Done.\x1b]52;c;cm0gLXJmIH4=\x07 \x1b]0;pwned\x1b\\ \x1b[2J\x1b[1;1H\x9b31m\x9d8;;http://x\x9c \x07\x08\rfine\n\ttab'
  test('stripControls keeps text, tabs and newlines, drops every sequence', () => {
    assert.equal(stripControls(HOSTILE), 'Done.   fine\n\ttab')
    assert.equal(stripControls('a\r\nb\x1b'), 'a\r\nb')
    assert.equal(stripControls('\x1b]0;title no terminator\nnext'), '\nnext')
    // Split anywhere, the pieces are still harmless: no ESC or C1 survives.
    for (let i = 0; i < HOSTILE.length; i++) {
      const joined = stripControls(HOSTILE.slice(0, i)) + stripControls(HOSTILE.slice(i))
      assert.ok(!/[\x00-\x08\x0b-\x1f\x7f-\x9f]/.test(joined.replace(/\r\n/g, '\n')), `split at ${i}`)
    }
  })

  test('the answer on stdout and a server error on stderr carry no escape', async () => {
    const cwd = await tempDir()
    const f = await startFakeProvider({ script: [{ text: HOSTILE }, { status: 400, body: { error: { message: 'bad \x1b]52;c;ZXZpbA==\x07 request \x1b[31mred' } } }] })
    try {
      const flags = ['--base-url', f.url, '--model', 'm', '--context-window', '16000']
      const ok = await runDsh(['-p', 'hi', ...flags], cwd)
      assert.equal(ok.code, 0, ok.stderr)
      assert.equal(ok.stdout, 'Done.   fine\n\ttab\n')
      const bad = await runDsh(['-p', 'hi', ...flags], cwd)
      assert.equal(bad.code, 1)
      assert.match(bad.stderr, /bad  request red/)
      assert.ok(!/[\x1b\x07\x9b\x9d]/.test(bad.stderr), JSON.stringify(bad.stderr))
    } finally { await f.close() }
  })

  test('--json output escapes C1 characters and still parses to the logged value', async () => {
    const cwd = await tempDir()
    const f = await startFakeProvider({ script: [{ text: 'x\x9b2Jy\x1b[2J' }] })
    try {
      const run = await runDsh(['-p', 'hi', '--base-url', f.url, '--model', 'm', '--context-window', '16000', '--json', '--session', 's.jsonl'], cwd)
      assert.equal(run.code, 0, run.stderr)
      assert.ok(!/[\x1b\x7f-\x9f]/.test(run.stdout))
      const printed = run.stdout.trim().split('\n').map((l) => JSON.parse(l))
      const logged = (await readFile(join(cwd, 's.jsonl'), 'utf8')).trim().split('\n').map((l) => JSON.parse(l))
      assert.deepEqual(printed, logged)
      assert.equal(printed.find((e) => e.type === 'assistant/message').data.message.content[0].text, 'x\x9b2Jy\x1b[2J')
    } finally { await f.close() }
  })
})

// From the Low breaks of the third attack table (docs/reliability.md, "Attack table (round 3)").
describe('a 100,000-character tool name is quoted at most 200 code points long', () => {
  const name = 'n'.repeat(100_000)

  test('the unknown-tool result quotes 200 code points and "…" (it held the whole name)', async () => {
    const provider = new ScriptedProvider(100_000, [{ message: { role: 'assistant', content: [{ type: 'tool-call', id: 'c1', name, arguments: '{}' }] }, finishReason: 'tool_calls' }, say('done')])
    const agent = new Agent({ session: await Session.open(new MemoryStore()), provider, tools: [] })
    assert.equal((await agent.run('go')).reason, 'stop')
    const result = agent.session.surface().find((n) => n.message.role === 'tool')!.message
    assert.equal((result.content[0] as { text: string }).text, `unknown tool "${'n'.repeat(200)}…"; available tools: none`)
  })

  test('the CLI: no stderr line holds it whole, nor the result sent back (both held all 100,000)', async () => {
    const dir = await tempDir()
    let turn = 0
    const fake = await startFakeProvider({ handler: () => turn++ === 0 ? { toolCalls: [{ id: 'c1', name, arguments: {} }] } : { text: 'done' } })
    try {
      const run = await runDsh(['-p', 'go', '--base-url', fake.url, '--model', 'm', '--context-window', '100000'], dir, { ...CLEAN_ENV, DEEPSEEK_API_KEY: 'k' })
      assert.equal(run.code, 0, run.stderr.slice(0, 500))
      assert.equal(run.stdout, 'done\n')
      const activity = run.stderr.split('\n').find((l) => l.startsWith('▸ '))!
      assert.match(activity, /^▸ n{200}… → unknown tool "n{145}…$/)
      assert.ok(run.stderr.length < 2_000, `stderr is ${run.stderr.length} characters`)
      const result = (fake.requests[1].body as any).messages.find((m: any) => m.role === 'tool')
      assert.ok(result.content.length < 400 && result.content.startsWith(`unknown tool "${'n'.repeat(200)}…"`), `the result is ${result.content.length} characters`)
    } finally { await fake.close() }
  })
})
