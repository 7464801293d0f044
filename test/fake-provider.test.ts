// The fake provider's CLI mode, as child-process and cross-runtime tests use it.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { spawn } from 'node:child_process'
import { mkdtempSync, writeFileSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join, dirname } from 'node:path'
import { fileURLToPath } from 'node:url'
import { createInterface } from 'node:readline'
import { openAICompatible, ProviderError } from '../dsh.ts'

const here = dirname(fileURLToPath(import.meta.url))

test('CLI mode: prints its URL first, serves the script in order, reports requests at /__requests', { timeout: 20_000 }, async () => {
  const dir = mkdtempSync(join(tmpdir(), 'dsh-fake-'))
  const script = join(dir, 'script.json')
  writeFileSync(script, JSON.stringify([
    { text: 'from a child process', reasoning: 'r' },
    { chunks: ['data: {"choices":[{"index":0,"delta":{"content":"spl', 'it"},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n'] },
    { status: 429, body: { error: { message: 'slow down' } } },
  ]))
  const child = spawn(process.execPath, ['--import', 'tsx', join(here, 'fake-provider.ts'), '--script', script], { stdio: ['ignore', 'pipe', 'inherit'] })
  try {
    const url = await new Promise<string>((resolve, reject) => {
      createInterface({ input: child.stdout! }).once('line', resolve)
      child.once('exit', (code) => reject(new Error(`fake provider exited with ${code}`)))
    })
    assert.match(url, /^http:\/\/127\.0\.0\.1:\d+$/)
    const provider = openAICompatible({ baseURL: url, model: 'cli-model', apiKey: 'sk-cli-123456', maxRetries: 0 })
    const first = await provider.complete({ messages: [{ role: 'user', content: 'hi' }] })
    assert.deepEqual(first.message.content, [{ type: 'reasoning', text: 'r' }, { type: 'text', text: 'from a child process' }])
    const second = await provider.complete({ messages: [{ role: 'user', content: 'again' }] })
    assert.deepEqual(second.message.content, [{ type: 'text', text: 'split' }])
    const third = await provider.complete({ messages: [{ role: 'user', content: 'once more' }] }).catch((e) => e)
    assert.ok(third instanceof ProviderError && third.code === 'RATE_LIMIT' && third.status === 429)
    const requests = await (await fetch(`${url}/__requests`)).json() as { path: string; body: { model: string; messages: { content: string }[] }; headers: Record<string, string> }[]
    assert.deepEqual(requests.map((r) => r.body.messages[0].content), ['hi', 'again', 'once more'])
    assert.equal(requests[0].body.model, 'cli-model')
    assert.equal(requests[0].headers.authorization, 'Bearer sk-cli-123456')
  } finally {
    const exited = new Promise((resolve) => child.once('exit', resolve))
    child.kill('SIGTERM')
    await exited
    rmSync(dir, { recursive: true, force: true })
  }
})
