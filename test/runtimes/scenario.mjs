// The cross-runtime smoke scenario (issue 6). Plain ESM with no imports, so it runs unchanged in
// Node, Deno, Bun, workerd and — bundled to a script by run-edge.mjs — Vercel's edge-runtime.
//
// Each runtime's runner calls `run(dsh, baseURL, providerURL)` with the dsh namespace (dsh.ts,
// dist/dsh.mjs or the IIFE global `DSH`), the base URL of the test server and that of the fake
// OpenAI-compatible server (test/fake-provider.ts), both on 127.0.0.1 and ending in a path prefix
// naming the runner, so the servers can tell the runs apart. `run` returns `{ steps, observation }`: the names
// of the steps it ran and one JSON value per step. test/runtimes.test.ts asserts that every runtime
// ran exactly the steps of STEPS and produced the identical observation.
//
// To grow the scenario, add one entry to STEPS. A step receives (dsh, ctx) and returns a JSON value
// that is the same on every runtime (no timings, no runtime names, no chunk counts); it throws to
// fail the run. ctx: { baseURL, providerURL, post(path, json) → parsed JSON reply }.
//
// The test server (test/runtimes.test.ts) answers, under the base URL:
//   POST /echo    → { method, path, contentType, body } of the request it received (JSON)
//   GET  /stream  → text/event-stream in several writes, one UTF-8 character split across two
//   GET  /hang    → never answers, not even headers (for cancellation)
//   GET  /stall   → headers and one chunk `data: partial\n\n`, then nothing (for cancellation)

/** The user inputs of the three turns of step `agent-http`. */
export const TURN_INPUTS = ['summarise the log', 'read parts 1 to 3', 'answer now']

/** DeepSeek's answer to a request over the context window (HTTP 400), as recorded in issue 3. */
const DEEPSEEK_OVERFLOW = { error: { message: "This model's maximum context length is 65536 tokens. However, you requested 70411 tokens (62219 in the messages, 8192 in the completion). Please reduce the length of the messages or completion.", type: 'invalid_request_error', param: null, code: 'invalid_request_error' } }

/**
 * What test/fake-provider.ts answers to step `agent-http`, in order (reply shapes: the fake's
 * header). Summary requests (`x-dsh-purpose: compaction`) take their turn in the same list.
 */
export const PROVIDER_SCRIPT = [
  { toolCalls: [{ id: 'c1', name: 'read_log', arguments: { part: 0 } }] }, // turn 1, step 1
  { text: 'the log shows 3 errors' }, //                                       turn 1, step 2 (result pruned)
  { toolCalls: [{ id: 'c2', name: 'read_log', arguments: { part: 1 } }] }, // turn 2
  { toolCalls: [{ id: 'c3', name: 'read_log', arguments: { part: 2 } }] },
  { toolCalls: [{ id: 'c4', name: 'read_log', arguments: { part: 3 } }] },
  { text: 'CHECKPOINT one: the log shows 3 errors.' }, //                      pressure summary of turn 1
  { text: 'parts 1 to 3 are clean' },
  { status: 400, body: DEEPSEEK_OVERFLOW }, //                                 turn 3, step 1: overflow
  { text: 'CHECKPOINT two: 3 errors; parts 1 to 3 clean.' }, //               overflow summary
  { text: 'recovered: 3 errors in part 0' }, //                                turn 3, step 2 (the retry)
]

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

  // Meter and pruner (docs/design.md §2–3) on astral and ZWJ text: string handling and Intl.Segmenter
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
      toolResult: { types: pruned.content.map((b) => b.type), tokens: dsh.estimateMessageTokens(pruned) },
      messageTokens: dsh.estimateMessageTokens({ role: 'user', content: 'héllo 😀' }),
    }
  }],

  // The session log in a MemoryStore (docs/design.md §4): append, surface, reload from the store.
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
    const reloaded = await dsh.Session.open(store, { readOnly: true })
    const surface = (s) => s.surface().map((n) => [n.seq, n.message.role, n.tokens])
    return {
      events: session.events.map((e) => [e.seq, e.type, e.time]),
      surface: surface(session),
      reloadedSurface: surface(reloaded),
      openToolCalls: [...dsh.internals.stateOf(reloaded).openCalls],
    }
  }],

  // The Agent loop and the whole ladder (docs/design.md §§5–7) over real HTTP to test/fake-provider.ts,
  // through openAICompatible at a context window of 8000 tokens (pressure threshold 6400):
  //   turn 1  a two-step turn whose 60 KB tool result is pruned before the second request;
  //   turn 2  three more tool results push the surface over the threshold: turn 1 is summarised;
  //   turn 3  the server answers 400 with DeepSeek's overflow wording once: the ladder summarises
  //           what precedes the input and the step is retried.
  // The fake answers PROVIDER_SCRIPT in order (one list per runner); the test compares the request
  // bodies it received from every runtime.
  ['agent-http', async (dsh, ctx) => {
    const tuning = dsh.internals.tuning.adapter, retries = tuning.maxRetries
    tuning.maxRetries = 0 // the adapter's test seam (test/tuning.ts): no retries
    const provider = dsh.openAICompatible({ baseURL: ctx.providerURL, model: 'fake-model', apiKey: 'sk-test', contextWindow: 8000 })
    tuning.maxRetries = retries
    const readLog = {
      name: 'read_log', description: 'returns one part of the log',
      parameters: { type: 'object', properties: { part: { type: 'integer' } }, required: ['part'] },
      execute: ({ part }) => (part === 0 ? 'log line\n'.repeat(6_667) + 'end' : `part ${part}: ` + 'ok\n'.repeat(2_000)),
    }
    const session = await dsh.Session.open(new dsh.MemoryStore(), { id: 'smoke', now: () => 1000 })
    const events = []
    const onEvent = (e) => events.push(e.type === 'log' ? e.event.type : e.type === 'stream' ? `stream:${e.event.type}` : e.type)
    // The ladder as the hand-worked values below assume: no clear rung and no recall tool
    // (docs/design.md §10), so that this scenario exercises the summary path on every runtime.
    const agent = new dsh.Agent({ session, provider, tools: [readLog], onEvent, compaction: { clear: false }, recall: false })
    const turns = []
    for (const input of TURN_INPUTS) {
      const r = await agent.run(input)
      turns.push({ text: r.text, steps: r.steps, reason: r.reason })
    }
    const compactionEnds = session.events.filter((e) => e.type === 'compaction/end').map((e) => e.data)
    return { turns, events, log: session.events.map((e) => e.type), compactionEnds, surfaceTokens: session.measure().totalTokens }
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
export async function run(dsh, baseURL, providerURL) {
  const ctx = {
    baseURL,
    providerURL,
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
