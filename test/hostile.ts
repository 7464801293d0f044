// Helpers of the security tests that feed dsh hostile input (test/security-*.test.ts).
import assert from 'node:assert/strict'

export const MiB = 1024 * 1024

/** The message of what `run` rejects with (a test fails when it resolves). */
export async function rejection(run: unknown): Promise<string> {
  try { await run } catch (error) { return (error as Error).message }
  assert.fail('expected the call to fail')
}

/** `value` nested in `depth` arrays, as JSON text (JSON.parse takes it; JSON.stringify would overflow the stack). */
export const nested = (depth: number, value = '0') => '['.repeat(depth) + value + ']'.repeat(depth)
