// How dsh reads an options object (docs/design.md §14 "Few knobs"): one reader for all of them — the
// provider's options, headers, extraBody and prices, the prune and ladder configurations — that takes
// a plain object's own fields, reads each field once, and names the field whose getter throws.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { Agent, ConfigError, MemoryStore, Session, openAICompatible, type Prices } from '../dsh.ts'

const BASE = { baseURL: 'http://127.0.0.1:1', model: 'm' }

test('prices are read once: a getter that changes its answer later cannot change what the provider prices by', () => {
  let reads = 0
  const prices = { cacheHitInput: 0.1, cacheMissInput: 1, get output() { reads++; return reads === 1 ? 2 : Number.NaN } }
  const provider = openAICompatible({ ...BASE, prices })
  assert.equal(reads, 1)
  assert.deepEqual(provider.prices, { cacheHitInput: 0.1, cacheMissInput: 1, output: 2 })
  assert.equal(provider.prices!.output, 2)
  assert.equal(reads, 1, 'the provider kept a copy: the getter is not read again')
  const peak = { multiplier: 2, days: [1, 2], hoursUTC: [[1, 4]] }
  const withPeak = openAICompatible({ ...BASE, prices: { cacheHitInput: 0.1, cacheMissInput: 1, output: 2, peak } as unknown as Prices })
  peak.days.push(9); peak.hoursUTC[0][1] = 99
  assert.deepEqual(withPeak.prices!.peak, { multiplier: 2, days: [1, 2], hoursUTC: [[1, 4]] }, 'a later change of the caller\'s arrays is not seen')
})

test('a field whose getter throws is a TypeError naming the field, not the getter\'s own error', () => {
  const boom = () => { throw new RangeError('boom') }
  const prices = { cacheHitInput: 0.1, cacheMissInput: 1, get output(): number { return boom() } }
  assert.throws(() => openAICompatible({ ...BASE, prices }), (e: unknown) => e instanceof TypeError && !(e instanceof ConfigError)
    && e.message === 'openAICompatible: prices.output could not be read: boom' && (e.cause as Error).message === 'boom')
  const peak = { multiplier: 2, days: [1], get hoursUTC(): [number, number][] { return boom() } }
  assert.throws(() => openAICompatible({ ...BASE, prices: { cacheHitInput: 0.1, cacheMissInput: 1, output: 2, peak } }),
    { name: 'TypeError', message: 'openAICompatible: prices.peak.hoursUTC could not be read: boom' })
})

test('new Agent reads each option once: a getter that throws is a ConfigError naming the option, its error the cause', async () => {
  const session = await Session.open(new MemoryStore())
  const provider = openAICompatible(BASE)
  let reads = 0
  for (const key of ['session', 'system', 'maxSteps', 'compaction']) {
    const options = { session, provider }
    Object.defineProperty(options, key, { enumerable: true, get() { throw new RangeError(`boom ${key}`) } })
    assert.throws(() => new Agent(options), (e: unknown) => e instanceof ConfigError
      && e.message === `new Agent: options.${key} could not be read: boom ${key}` && (e.cause as Error).message === `boom ${key}`)
  }
  const agent = new Agent({ session, provider, get maxSteps() { reads++; return reads === 1 ? 3 : 0 } })
  assert.equal(reads, 1)
  assert.throws(() => new Agent(Object.assign(Object.create({ session }), { provider })),
    { name: 'ConfigError', message: 'new Agent: options must be a plain object of options, got an object that inherits fields' })
  assert.ok(agent)
})

test('a configuration that inherits its fields is refused, never read as the defaults', async () => {
  const session = await Session.open(new MemoryStore())
  const provider = openAICompatible({ ...BASE, contextWindow: 10_000 })
  const inherited = Object.create({ thresholdRatio: 0.5 })
  assert.throws(() => new Agent({ session, provider, compaction: inherited }),
    { name: 'ConfigError', message: 'compaction config must be an object, got an object that inherits fields' })
  assert.throws(() => new Agent({ session, provider, prune: Object.create({ headChars: 10 }) }),
    { name: 'ConfigError', message: 'prune config must be an object, got an object that inherits fields' })
  class Tuning { thresholdRatio = 0.5 }
  assert.throws(() => new Agent({ session, provider, compaction: new Tuning() }),
    { name: 'ConfigError', message: 'compaction config must be an object, got a Tuning' })
  assert.throws(() => openAICompatible({ ...BASE, prices: Object.create({ cacheHitInput: 0.1, cacheMissInput: 1, output: 2 }) }),
    { name: 'TypeError', message: 'openAICompatible: prices must be a plain object, got an object that inherits fields' })
  // A null-prototype object and a frozen literal are plain.
  const bare = Object.assign(Object.create(null), { thresholdRatio: 0.5 })
  assert.doesNotThrow(() => new Agent({ session, provider, compaction: bare }))
  assert.doesNotThrow(() => new Agent({ session, provider, compaction: Object.freeze({ thresholdRatio: 0.7 }) }))
})

// From the hostile reviews of the options reader (rev5, rev6).
test('provider options: NaN or Infinity is named in the error (not "got null")', () => {
  const base = BASE
  // The message must say the value given: "got null" for NaN sends the caller looking for a null.
  assert.throws(() => openAICompatible({ ...base, contextWindow: NaN }), (err: Error) => err instanceof TypeError
    && /got NaN/.test(err.message))
  assert.throws(() => openAICompatible({ ...base, maxTokens: Infinity }), (err: Error) => err instanceof TypeError
    && /got Infinity/.test(err.message))
})

test('provider options: headers and extraBody that are not plain objects fail loudly', () => {
  const base = BASE
  // A string spread as headers sends "0: a", "1: b", … and an array as extraBody sends {"0": …}: both fail loudly.
  assert.throws(() => openAICompatible({ ...base, headers: 'ab' as never }), TypeError)
  assert.throws(() => openAICompatible({ ...base, extraBody: ['temperature', 0] as never }), TypeError)
})

test('options: a revoked Proxy as prices is a TypeError naming prices, like any other unreadable prices', () => {
  const { proxy, revoke } = Proxy.revocable({}, {})
  revoke()
  // Observed: "Cannot perform 'IsArray' on a proxy that has been revoked" (the Array.isArray check before the
  // reader, outside its try): the error names neither the function nor the field. headers and extraBody say it.
  assert.throws(() => openAICompatible({ ...BASE, prices: proxy as unknown as Prices }),
    (e: unknown) => e instanceof TypeError && /^openAICompatible: prices\b/.test(e.message))
  assert.throws(() => openAICompatible({ ...BASE, headers: proxy as unknown as Record<string, string> }),
    (e: unknown) => e instanceof TypeError && /^openAICompatible: headers\b/.test(e.message))
})

test('options: a configuration field that is own but not enumerable is refused or read, never read as the default', async () => {
  // Like an object that inherits its fields (refused since e7fd24e): the caller's thresholdRatio 0.1 is silently
  // replaced by the default 0.8.
  const session = await Session.open(new MemoryStore())
  const provider = openAICompatible({ ...BASE, contextWindow: 10_000 })
  const compaction = Object.defineProperty({}, 'thresholdRatio', { value: 0.1, enumerable: false })
  let agent: Agent | undefined
  try { agent = new Agent({ session, provider, compaction }) } catch (e) { assert.equal((e as Error).name, 'ConfigError'); return }
  assert.equal(agent.compaction.thresholdRatio, 0.1)
})

test('options: an object that inherits its fields from a null-prototype object is refused too, never read as the defaults', async () => {
  // plainFields takes an object as plain when its prototype's prototype is null: true of Object.prototype, and also
  // of any null-prototype object used as a prototype. So Object.create(base) with base = Object.create(null) + fields
  // passes as plain, its own keys are none, and the caller's thresholdRatio 0.1 is read as the default 0.8.
  const session = await Session.open(new MemoryStore())
  const provider = openAICompatible({ ...BASE, contextWindow: 10_000 })
  const base = Object.assign(Object.create(null) as object, { thresholdRatio: 0.1 })
  let agent: Agent | undefined
  try { agent = new Agent({ session, provider, compaction: Object.create(base) }) } catch (e) {
    assert.deepEqual([(e as Error).name, (e as Error).message],
      ['ConfigError', 'compaction config must be an object, got an object that inherits fields'])
    return
  }
  assert.equal(agent.compaction.thresholdRatio, 0.1)
})

test('options: a sparse prices.peak.days of 2^27 holes is a TypeError, not an out-of-memory crash of the process', async () => {
  // validatePrices copies peak.days with Array.from before it validates it: a sparse array (a few bytes of the
  // caller's memory) becomes 2^27 undefined slots. In a process with a 64 MB heap that is a fatal V8 out-of-memory
  // crash (the caller cannot catch it); fb1e8ef took every() over the holes and accepted the list instead.
  const { spawnSync } = await import('node:child_process')
  const { fileURLToPath } = await import('node:url')
  const dsh = fileURLToPath(new URL('../dsh.ts', import.meta.url))
  const script = `const { openAICompatible } = await import(${JSON.stringify(dsh)});
    try { openAICompatible({ baseURL: 'http://127.0.0.1:1', model: 'm', prices: { cacheHitInput: 1, cacheMissInput: 1,
      output: 1, peak: { multiplier: 2, days: new Array(2 ** 27), hoursUTC: [[1, 2]] } } }); console.log('accepted') }
    catch (e) { console.log(e.name + ': ' + e.message.slice(0, 66)) }`
  const child = spawnSync(process.execPath, ['--max-old-space-size=64', '--import', 'tsx', '--input-type=module', '-e', script],
    { cwd: fileURLToPath(new URL('..', import.meta.url)), encoding: 'utf8', timeout: 120_000 })
  assert.deepEqual([child.status, child.signal, child.stdout.trim()],
    [0, null, 'TypeError: openAICompatible: prices.peak.days must be UTC weekdays 0 (Sunday)'], child.stderr.slice(0, 300))
})

test('new Agent: an options "object" of another kind — a function carrying the fields — is a ConfigError like a class instance', async () => {
  // A function is no record: its fields were read as they are.
  const session = await Session.open(new MemoryStore())
  const provider = openAICompatible(BASE)
  assert.throws(() => new Agent(Object.assign(function options() {}, { session, provider }) as never), { name: 'ConfigError' })
})
