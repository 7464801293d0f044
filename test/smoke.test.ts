import { test } from 'node:test'
import assert from 'node:assert/strict'
import { ProviderError } from '../dsh.ts'

test('ProviderError carries its code and body', () => {
  const e = new ProviderError('RATE_LIMIT', 'slow down', { status: 429, body: '{}' })
  assert.equal(e.code, 'RATE_LIMIT'); assert.equal(e.status, 429); assert.equal(e.body, '{}')
  assert.ok(e instanceof Error)
})
