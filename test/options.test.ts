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
