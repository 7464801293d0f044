// Findings of the third adversarial review against a real llama-server (docs/design.md §10): what the
// CLI says about a refused request.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { statusReporter, type AgentEvent, type SessionEvent } from '../dsh.ts'

test('the CLI\'s status line for an overflow says who counted, and says nothing of recovery for an input refused before the ladder', () => {
  const lines: string[] = []
  const report = statusReporter(() => undefined, (l) => lines.push(l), false, false)
  const log = (data: Record<string, unknown>): AgentEvent => ({ type: 'log', event: { seq: 1, time: 0, type: 'request/error', data } as unknown as SessionEvent })
  // The CLI with its coding tools in a 2,048-token window: the envelope alone does not fit, and the
  // line said "context overflow reported by the provider; pruning and compacting to recover".
  report(log({ code: 'CONTEXT_WINDOW_EXCEEDED', trigger: 'input', message: 'CONTEXT_WINDOW_EXCEEDED: the current input alone is 19 tokens (plus 1156 of system prompt and tools, × 3.20 calibration = 3755) …; nothing was sent.' }))
  assert.deepEqual(lines, [])
  report(log({ code: 'CONTEXT_WINDOW_EXCEEDED', trigger: 'conversation', message: 'CONTEXT_WINDOW_EXCEEDED: preflight: nothing was sent. The prompt is estimated at 2162 tokens …' }))
  assert.equal(lines.length, 1)
  assert.match(lines[0], /would not fit the context window \(dsh's estimate; nothing was sent\)/)
  assert.doesNotMatch(lines[0], /reported by the provider/)
  report(log({ code: 'CONTEXT_WINDOW_EXCEEDED', trigger: 'conversation', status: 400, message: 'CONTEXT_WINDOW_EXCEEDED: HTTP 400 …' }))
  assert.match(lines[1], /context overflow reported by the provider \(400\); pruning and compacting to recover/)
})
