// What a durable step spends beyond its write and its fsync (bench/durable.bench.ts measures it):
// the header of the request is serialised once per step (to compare it with the one logged), not
// twice, and a header that changed is logged once and compared by its own text from then on.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { Agent, MemoryStore, Session } from '../dsh.ts'
import { ScriptedProvider, call, say } from './scripted-provider.ts'

const readTool = { name: 'read_file', description: 'reads a file', parameters: { type: 'object' }, execute: () => 'x'.repeat(100) }
const isHeader = (v: unknown): boolean => typeof v === 'object' && v !== null && 'baseURL' in v && 'model' in v && 'tools' in v

test('a step serialises the request header once, and logs it only when it changed', async () => {
  const session = await Session.open(new MemoryStore())
  const provider = new ScriptedProvider(32_000, [call('c1', 'read_file'), call('c2', 'read_file'), call('c3', 'read_file'), say('done'), say('again')])
  const agent = new Agent({ session, provider, tools: [readTool] })
  const stringify = JSON.stringify
  let headerStringifies = 0
  JSON.stringify = function (this: unknown, value: unknown, ...rest: unknown[]) {
    if (isHeader(value)) headerStringifies++
    return (stringify as (...a: unknown[]) => string).call(JSON, value, ...rest)
  } as typeof JSON.stringify
  let steps = 0
  try {
    steps += (await agent.run('read three files')).steps
    steps += (await agent.run('once more')).steps
  } finally { JSON.stringify = stringify }
  assert.equal(steps, 5)
  // One per step, plus one per turn start (the turn-start pressure check prices the envelope); never twice in a row.
  assert.equal(headerStringifies, steps + 2)
  let headers = 0
  for await (const e of session.readEvents()) if (e.type === 'request/header') headers++
  assert.equal(headers, 1, 'an unchanged header is logged once')
})

test('a changed header is logged once more, then compared with the new one', async () => {
  const session = await Session.open(new MemoryStore())
  const run = async (system: string) => { await new Agent({ session, provider: new ScriptedProvider(32_000, [say('ok')]), tools: [readTool], system }).run('hi') }
  await run('one'); await run('one'); await run('two'); await run('two'); await run('one')
  const systems: string[] = []
  for await (const e of session.readEvents()) if (e.type === 'request/header') systems.push((e.data as { system: string }).system)
  assert.deepEqual(systems, ['one', 'two', 'one'])
})
