// The room rule (docs/design.md §5 "Room": what the ladder keeps is sized by window × f², f = min(1, 2 × room ÷ window))
// and the rules under it: the user's words in a checkpoint (§12), the room as measured by a tokenizer that counts
// more than the heuristic, the recall tool's spec (§3). From the hostile review of the room rule (rev6b, 92b526e); the
// TODO tests state what docs/design.md promises and dsh.ts does not yet keep.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import {
  Agent, Session, MemoryStore, ProviderError, estimateTextTokens, type ChatRequest, type Provider, type SessionEvent,
} from '../dsh.ts'
import { requestTokens, resultTool, shortSummarizer, toolOncePerTurn } from './scripted-provider.ts'

const words = (i: number) => `USER-${i} ` + `please also handle item ${i}; `.repeat(8)
/** Which of the user messages USER-0 … USER-(n-1) the surface still holds, verbatim or by their recall key. */
function userMessagesOnSurface(session: Session, n: number): number[] {
  const seqOf = new Map<number, number>()
  for (const e of session.events) if (e.type === 'user/message') {
    const m = /^USER-(\d+) /.exec(String((e.data as { message: { content: unknown } }).message.content))
    if (m) seqOf.set(Number(m[1]), e.seq)
  }
  const text = JSON.stringify(session.surface().map((node) => node.message))
  return [...Array(n).keys()].filter((i) => text.includes(`USER-${i} `) || text.includes(`seq:${seqOf.get(i)}`))
}

/** A session in a 10,000-token window under a system prompt of `systemChars` code points: `turns` turns of `words(i)`,
 *  each calling tool `t` (2,000-code-point results) once; `sizes`, the conversation requests' heuristic tokens. */
async function roomSession(systemChars: number, turns: number): Promise<{ session: Session; sizes: number[] }> {
  const sizes: number[] = []
  const session = await Session.open(new MemoryStore())
  const agent = new Agent({ session, provider: toolOncePerTurn(10_000, sizes), summarizer: shortSummarizer(10_000),
    system: 's'.repeat(systemChars), recall: false, tools: [resultTool(2_000)] } as ConstructorParameters<typeof Agent>[0])
  for (let i = 0; i < turns; i++) await agent.run(words(i))
  return { session, sizes }
}

// ── §12 under the room rule: the user's words in a checkpoint that fits ──

test('room: a large envelope (80% of the window) keeps every user message in the checkpoints, which have room for them', async () => {
  // Window 10,000 tokens, system prompt 8,000: room 2,000, f = 0.4, kept window 1,600. Under the kept window a
  // checkpoint's user budget was 15% of 1,600 = 240 tokens: four 223-unit messages (+ their 32-unit lines) could not
  // fit it, and the oldest were left out with no recall key, while the largest request sent was 8,981 tokens. The
  // user's words are budgeted by window × f = 4,000 (docs/design.md §5 "Room", §12): 600 tokens, and all eight stay.
  const { session, sizes } = await roomSession(32_000, 8)
  const dropped = [...Array(8).keys()].filter((i) => !userMessagesOnSurface(session, 8).includes(i))
  const freeTokens = 10_000 - Math.max(...sizes)
  const droppedTokens = dropped.reduce((t, i) => t + estimateTextTokens(words(i)) + 8, 0)
  assert.ok(droppedTokens < freeTokens, `${droppedTokens} tokens of user messages dropped, ${freeTokens} were free`)
  // At 66c9081: USER-1 … USER-4 were gone from the surface (no text, no recall key): the checkpoints "trimmed" them.
  assert.deepEqual(dropped, [], `user messages left out of the checkpoint: ${dropped.map((i) => `USER-${i}`).join(', ')}`)
})

test('room: the task is cut below the 200-unit minimum, to its marker alone, in a checkpoint with room to spare', { todo: 'open: under the user window (window × f, docs/design.md §5) the later checkpoints keep the task whole (223 units); the first one replaces a region of 113 tokens, and a checkpoint must be smaller than what it replaces, so the task is cut to 104 units there; a 200-unit floor (tried in round 4) sent a request of 10,230 tokens into the 10,000-token window' }, async () => {
  // docs/design.md §12: "A message is cut to no fewer than 200 UTF-16 units". Window 10,000, system prompt 9,500:
  // room 500, f = 0.1, kept window 100 tokens, the task's share 10 tokens (40 units, less the 32-unit line): the
  // 223-unit task is "cut" to 86 units, the marker alone, and not one of its words is left. The conversation's
  // largest request was 9,727 tokens: the 223 units (56 tokens) whole would have fitted.
  const { session, sizes } = await roomSession(38_000, 4)
  assert.ok(Math.max(...sizes) + 56 < 10_000, `largest request ${Math.max(...sizes)}`)
  const summaries = session.events.filter((e) => e.type === 'compaction/summary') as SessionEvent<'compaction/summary'>[]
  const tasks = summaries.map((s) => s.data.ledger?.userMessages.find((u) => u.seq === 2)?.text)
    .filter((t): t is string => t !== undefined)
  assert.ok(tasks.length > 0, 'a checkpoint carried the task')
  // At 66c9081: [86, 86, 86], the marker alone; now [104, 223, 223]: the first checkpoint holds at most 104 units of it.
  assert.deepEqual(tasks.map((t) => t.length >= 200 || t === words(0)), tasks.map(() => true),
    `task lengths in checkpoints: ${tasks.map((t) => t.length).join(', ')}`)
  assert.ok(tasks.every((t) => t.startsWith('USER-0 please')), `the task's head: ${JSON.stringify(tasks[0].slice(0, 40))}`)
})

// ── The room as measured: a tokenizer that counts 1.5× the heuristic, an envelope over half the window ──

test('room: with a large envelope usage calibrates the envelope and the messages apart, so summary requests fit the window they are planned to fit', async () => {
  // The server counts 1.5 tokens per heuristic token and reports it as usage on every answer, and refuses (400, with
  // its counts) a request over its 20,000-token window. System prompt 11,000 heuristic tokens (16,500 counted).
  // The conversation's total is anchored on usage and right; but a usage sample is taken only when the messages are
  // half the request, which a large envelope never lets them be, so the calibration stays 1 and the room, the kept
  // window and the summary job's plan all price the envelope at 11,000: the summary requests are planned to fit
  // and overflow.
  const W = 20_000, RATIO = 1.5
  const over: number[] = []
  const counted = (r: ChatRequest) => Math.round(requestTokens(r) * RATIO)
  const refuse = (n: number) => {
    throw new ProviderError('CONTEXT_WINDOW_EXCEEDED', `maximum context length is ${W} tokens, requested ${n} tokens`,
      { status: 400, body: `This model's maximum context length is ${W} tokens. However, you requested ${n} tokens` })
  }
  let k = 0
  const provider = { model: 'm', baseURL: 'memory://m', contextWindow: W, maxTokens: 100,
    complete: async (r: ChatRequest) => {
      const n = counted(r)
      if (n > W) { over.push(n); refuse(n) }
      const usage = { promptTokens: n, completionTokens: 9 }
      return k < 12 ? { message: { role: 'assistant', content: [{ type: 'tool-call', id: `c${k++}`, name: 't', arguments: '{}' }] },
        finishReason: 'tool-calls', usage } : { message: { role: 'assistant', content: [{ type: 'text', text: 'done' }] },
        finishReason: 'stop', usage }
    } } as unknown as Provider
  const summaries: number[] = []
  const summarizer = { model: 'm', baseURL: 'memory://m', contextWindow: W, maxTokens: 2000,
    complete: async (r: ChatRequest) => {
      const n = counted(r)
      summaries.push(n)
      if (n > W) refuse(n)
      return { message: { role: 'assistant', content: [{ type: 'text', text: 'Summary of the work so far: tool t ran.' }] },
        finishReason: 'stop', usage: { promptTokens: n, completionTokens: 12 } }
    } } as unknown as Provider
  const session = await Session.open(new MemoryStore())
  const agent = new Agent({ session, provider, summarizer, system: 's'.repeat(44_000), recall: false,
    compaction: { clear: false }, tools: [resultTool(8_000)] } as ConstructorParameters<typeof Agent>[0])
  await agent.run('task '.repeat(50))
  assert.deepEqual(over, [], 'no conversation request over the window')
  assert.ok(summaries.length > 0, 'summaries were made')
  // At 66c9081: 3 of 14 summary requests over the window (23,027, 20,081, 20,081 counted tokens of 20,000).
  assert.deepEqual(summaries.filter((n) => n > W), [], `summary requests (counted tokens): ${summaries.join(', ')}`)
  const m = session.measure()
  assert.ok(Math.abs(m.calibration - 1.5) < 0.001, `the messages' ratio, fitted apart from the envelope's: ${m.calibration}`)
})

test('room: the envelope\'s own ratio prices the envelope only: an input that fits the window is sent', async () => {
  // A tokenizer that counts the system prompt at 2× the heuristic and the messages at 1× (a withdrawn fix of round 4
  // took one ratio from envelope-heavy usage, 2×, and refused this input as too large for the window).
  const WINDOW = 32_000
  const sent: number[] = []
  const provider: Provider = {
    model: 'm', baseURL: 'memory://m', contextWindow: WINDOW, maxTokens: 1000,
    async complete(req: ChatRequest) {
      const env = requestTokens({ ...req, messages: [] })
      const count = 2 * env + (requestTokens(req) - env)
      sent.push(count)
      if (count + 1000 > WINDOW) throw new ProviderError('CONTEXT_WINDOW_EXCEEDED', `context is ${WINDOW} tokens, got ${count}`)
      return { message: { role: 'assistant', content: [{ type: 'text', text: 'ok' }] }, finishReason: 'stop',
        usage: { promptTokens: count, completionTokens: 1 } }
    },
  }
  const session = await Session.open(new MemoryStore())
  const agent = new Agent({ session, provider, system: 's'.repeat(32_000), recall: false })
  assert.equal((await agent.run('hello')).reason, 'stop')
  // 9,008 heuristic tokens of input; the provider counts the request at about 25,000 of its 32,000.
  const second = await agent.run('w '.repeat(18_000)).then((r) => r.reason, (e: ProviderError) => `${e.code}: ${e.message}`)
  assert.equal(second, 'stop')
  assert.equal(sent.length, 2)
  assert.ok(sent[1] < WINDOW - 1000, `second request ${sent[1]}`)
})

// ── The recall tool and the room ──

test('room: the recall tool is offered when its spec takes the room a large envelope leaves, and the turn then overflows', async () => {
  // docs/design.md §3 "Recall": the Agent offers `recall` unless its spec would take more than a tenth of the WINDOW;
  // the room is not asked. Window 10,000, system prompt 9,600 tokens, six tool calls of 500-token results, a server
  // that refuses (400) a request over its window: with recall: false the turn ends 'stop'; with the default recall
  // the first compaction adds the recall spec (~140 tokens) to every request and the turn throws the overflow.
  const W = 10_000
  const outcome = async (recall: boolean): Promise<string> => {
    let k = 0
    const provider = { model: 'm', baseURL: 'memory://m', contextWindow: W, maxTokens: 200,
      complete: async (r: ChatRequest) => {
        const n = requestTokens(r)
        if (n > W) throw new ProviderError('CONTEXT_WINDOW_EXCEEDED', `maximum context length is ${W} tokens`,
          { status: 400, body: `This model's maximum context length is ${W} tokens. However, you requested ${n} tokens` })
        return k < 6 ? { message: { role: 'assistant', content: [{ type: 'tool-call', id: `c${k++}`, name: 't', arguments: '{}' }] },
          finishReason: 'tool-calls' } : { message: { role: 'assistant', content: [{ type: 'text', text: 'done' }] }, finishReason: 'stop' }
      } } as unknown as Provider
    const session = await Session.open(new MemoryStore())
    const agent = new Agent({ session, provider, summarizer: shortSummarizer(W), system: 's'.repeat(38_400), recall,
      tools: [resultTool(2_000)] } as ConstructorParameters<typeof Agent>[0])
    try { return (await agent.run('task '.repeat(50))).reason } catch (e) { return `${(e as Error).name} ${(e as { code?: string }).code}` }
  }
  assert.equal(await outcome(false), 'stop')
  // Observed: 'ProviderError CONTEXT_WINDOW_EXCEEDED' (requested 10,417 tokens).
  assert.equal(await outcome(true), 'stop')
})
