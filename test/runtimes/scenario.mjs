// The cross-runtime smoke scenario (issue 6). Plain ESM with no imports, so it runs unchanged in
// Node, Deno, Bun, workerd and — bundled to a script by run-edge.mjs — Vercel's edge-runtime.
//
// Each runtime's runner calls `run(dsh, baseURL)` with the dsh namespace (dsh.ts, dist/dsh.mjs or
// the IIFE global `DSH`) and the base URL of the test server on 127.0.0.1 (a path prefix naming the
// runner, so the server can tell the runs apart). `run` returns `{ steps, observation }`: the names
// of the steps it ran and one JSON value per step. test/runtimes.test.ts asserts that every runtime
// ran exactly the steps of STEPS and produced the identical observation.
//
// To grow the scenario, add one entry to STEPS. A step receives (dsh, ctx) and returns a JSON value
// that is the same on every runtime (no timings, no runtime names, no chunk counts); it throws to
// fail the run. ctx: { baseURL, post(path, json) → parsed JSON reply }.
//
// The test server (test/runtimes.test.ts) answers, under the base URL:
//   POST /echo    → { method, path, contentType, body } of the request it received (JSON)
//   GET  /stream  → text/event-stream in several writes, one UTF-8 character split across two
//   GET  /hang    → never answers, not even headers (for cancellation)
//   GET  /stall   → headers and one chunk `data: partial\n\n`, then nothing (for cancellation)

/** @type {Array<[name: string, step: (dsh: any, ctx: any) => unknown]>} */
export const STEPS = [
  ['version', (dsh) => dsh.VERSION],

  // Value exports only (types vanish); identical across source, ESM bundle and IIFE global.
  ['exports', (dsh) => Object.keys(dsh).sort()],

  ['provider-error', (dsh) => {
    const cause = new TypeError('socket hang up')
    const e = new dsh.ProviderError('RATE_LIMIT', 'slow down', {
      status: 429, retryAfterMs: 1500, requestId: 'req-1', body: '{"error":{"message":"slow down"}}', cause,
    })
    const bare = new dsh.ProviderError('TRANSPORT', 'stream ended without [DONE]')
    return {
      string: String(e),
      fields: { name: e.name, code: e.code, status: e.status, retryAfterMs: e.retryAfterMs, requestId: e.requestId, body: e.body },
      // Own enumerable keys, in order: shows class-field semantics ([[Define]] vs [[Set]]) per transpiler.
      ownKeys: Object.keys(e),
      isError: e instanceof Error,
      isProviderError: e instanceof dsh.ProviderError,
      causeKept: e.cause === cause,
      bare: { code: bare.code, status: bare.status ?? null, body: bare.body, hasCause: 'cause' in bare },
    }
  }],

  // Meter and pruner (DESIGN.md §2–3) on astral and ZWJ text: string handling and Intl.Segmenter
  // (the grapheme-safe cut) must agree everywhere.
  ['meter-pruner', (dsh) => {
    const family = '👨‍👩‍👧' // 8 UTF-16 units, 5 code points, 1 grapheme
    const text = 'a'.repeat(4094) + family.repeat(1000) + 'é😀'.repeat(600)
    const shape = (s) => ({
      units: s.length, codePoints: dsh.codePointLength(s), tokens: dsh.estimateTextTokens(s),
      aroundHead: s.slice(4090, 4102), tail: s.slice(-6),
    })
    const result = { role: 'tool', toolCallId: 'A', content: [{ type: 'text', text }, { type: 'image', url: 'x' }, { type: 'text', text: 'end' }] }
    const pruned = dsh.pruneToolResult(result)
    return {
      input: shape(text),
      plain: shape(dsh.pruneText(text)),
      graphemeSafe: shape(dsh.pruneText(text, { graphemeSafe: true })),
      toolResult: { types: pruned.content.map((b) => b.type), tokens: dsh.estimateMessageTokens(pruned) },
      messageTokens: dsh.estimateMessageTokens({ role: 'user', content: 'héllo 😀' }),
    }
  }],

  // The session log in a MemoryStore (DESIGN.md §4): append, surface, reload from the store.
  ['session-memory', async (dsh) => {
    const store = new dsh.MemoryStore()
    const session = await dsh.Session.open(store, { id: 'smoke', now: () => 1000 })
    session.append('user/message', { message: { role: 'user', content: 'read it' }, surfaceOp: { op: 'append' } })
    session.append('assistant/message', {
      message: { role: 'assistant', content: [{ type: 'tool-call', id: 'A', name: 'read', arguments: '{}' }] },
      finishReason: 'tool_calls', surfaceOp: { op: 'append' },
    })
    session.append('tool/result', {
      message: { role: 'tool', toolCallId: 'A', content: [{ type: 'text', text: 'x😀'.repeat(5000) }] }, surfaceOp: { op: 'append' },
    })
    await session.sync()
    const reloaded = await dsh.Session.load(store)
    const surface = (s) => s.surface().map((n) => [n.seq, n.message.role, n.tokens])
    return {
      events: session.events.map((e) => [e.seq, e.type, e.time]),
      surface: surface(session),
      reloadedSurface: surface(reloaded),
      openToolCalls: reloaded.openToolCalls(),
    }
  }],

  // The Agent loop and the ladder's prune rung (DESIGN.md §§5, 7) with an in-process scripted
  // provider: a two-step turn whose 60 KB tool result is pruned before the second request.
  // (The HTTP provider against test/fake-provider.ts replaces this provider when it lands.)
  ['agent-scripted', async (dsh) => {
    const replies = [
      { message: { role: 'assistant', content: [{ type: 'tool-call', id: 'c1', name: 'read_log', arguments: '{}' }] }, finishReason: 'tool_calls' },
      { message: { role: 'assistant', content: [{ type: 'text', text: 'the log shows 3 errors' }] }, finishReason: 'stop' },
    ]
    const requests = []
    const provider = {
      model: 'scripted', baseURL: 'memory://scripted', contextWindow: 16_000, maxTokens: 1000,
      async complete(req) {
        requests.push({ purpose: req.headers?.['x-dsh-purpose'] ?? 'conversation', messages: JSON.parse(JSON.stringify(req.messages)) })
        return JSON.parse(JSON.stringify(replies[requests.length - 1]))
      },
    }
    const readLog = { name: 'read_log', description: 'returns the log', parameters: { type: 'object' }, execute: () => 'log line\n'.repeat(6_667) + 'end' }
    const session = await dsh.Session.open(new dsh.MemoryStore(), { id: 'smoke', now: () => 1000 })
    const events = []
    const agent = new dsh.Agent({ session, provider, tools: [readLog], onEvent: (e) => events.push(e.type === 'log' ? e.event.type : e.type) })
    const result = await agent.run('summarise the log')
    return {
      result: { text: result.text, steps: result.steps, reason: result.reason },
      events,
      log: session.events.map((e) => e.type),
      requests: requests.map((r) => ({ purpose: r.purpose, messages: r.messages.map((m) => [m.role, JSON.stringify(m.content).length]) })),
      prunedInSecondRequest: JSON.stringify(requests[1]?.messages ?? []).includes(JSON.stringify(dsh.PRUNE_MARKER).slice(1, -1)),
    }
  }],

  // Loopback networking: a JSON POST reaches the test server and its reply comes back.
  ['fetch-echo', (dsh, ctx) => ctx.post('/echo', { model: 'smoke', messages: [{ role: 'user', content: 'héllo 😀' }] })],

  // A streamed body read chunk by chunk through TextDecoderStream (how the provider reads SSE).
  ['fetch-stream', async (dsh, ctx) => {
    const res = await fetch(`${ctx.baseURL}/stream`)
    let text = ''
    for await (const chunk of iterate(res.body.pipeThrough(new TextDecoderStream()))) text += chunk
    return { status: res.status, contentType: res.headers.get('content-type'), text }
  }],

  // Cancellation, before the response headers (fetch rejects) and in the middle of the body (the
  // read rejects): both must surface as an AbortError, which the provider maps to ABORTED.
  ['fetch-abort', async (dsh, ctx) => {
    const before = new AbortController()
    const pending = fetch(`${ctx.baseURL}/hang`, { signal: before.signal })
    setTimeout(() => before.abort(), 50)
    const beforeHeaders = await pending.then(() => ({ rejected: false }), (err) => ({ rejected: true, name: err?.name }))

    const during = new AbortController()
    const res = await fetch(`${ctx.baseURL}/stall`, { signal: during.signal })
    const reader = res.body.getReader()
    const first = new TextDecoder().decode((await reader.read()).value)
    setTimeout(() => during.abort(), 50)
    const midBody = await reader.read().then(() => ({ rejected: false }), (err) => ({ rejected: true, name: err?.name }))
    return { beforeHeaders, midBody: { status: res.status, first, ...midBody } }
  }],
]

/** Runs every step in order; rejects naming the step that threw. */
export async function run(dsh, baseURL) {
  const ctx = {
    baseURL,
    async post(path, json) {
      const res = await fetch(baseURL + path, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(json) })
      if (!res.ok) throw new Error(`POST ${path}: HTTP ${res.status}`)
      return res.json()
    },
  }
  const steps = []
  const observation = {}
  for (const [name, step] of STEPS) {
    try {
      observation[name] = await step(dsh, ctx)
    } catch (err) {
      throw new Error(`smoke step "${name}" failed: ${err?.stack ?? err}`)
    }
    steps.push(name)
  }
  // Round-trip through JSON so every runner reports exactly what the comparison will see.
  return JSON.parse(JSON.stringify({ steps, observation }))
}

// ReadableStream is async-iterable in Node, Deno and Bun but not everywhere; read it by hand.
async function* iterate(stream) {
  const reader = stream.getReader()
  try {
    for (;;) {
      const { done, value } = await reader.read()
      if (done) return
      yield value
    }
  } finally {
    reader.releaseLock()
  }
}
