// review6b: a hostile review of the room rule (docs/design.md §5 "Room": what the ladder keeps is sized by window × f²,
// f = min(1, 2 × room ÷ window)) and the older rules under it (§12 the user's words, the tool pairing, the spend cap).
// Each test here failed on the commit it was written against (rev6b, 92b526e): it states what docs/design.md promises
// or what the brief's house rules require, and the candidate does not yet keep. Do not fix dsh.ts here.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import {
  Agent, Session, MemoryStore, ProviderError, estimateRequestTokens, estimateTextTokens, type ChatRequest, type Provider, type SessionEvent,
} from '../dsh.ts'

const size = (r: ChatRequest) => estimateRequestTokens({ system: r.system, tools: r.tools }, r.messages)

/** A conversation model of window `window` that calls tool `t` once per user message, then answers 'ok'; the sizes
 *  (heuristic tokens, as the meter prices them) of every request it was sent go to `sizes`. */
function toolOncePerTurn(window: number, sizes: number[], usage?: (r: ChatRequest, i: number) => { promptTokens: number;
  completionTokens: number } | undefined): Provider {
  let k = 0, i = 0
  return { model: 'm', baseURL: 'memory://m', contextWindow: window, maxTokens: 100,
    complete: async (r: ChatRequest) => {
      sizes.push(size(r))
      const u = usage?.(r, i++)
      return r.messages.at(-1)!.role === 'user'
        ? { message: { role: 'assistant', content: [{ type: 'tool-call', id: `c${k++}`, name: 't', arguments: '{}' }] },
          finishReason: 'tool-calls', ...(u ? { usage: u } : {}) }
        : { message: { role: 'assistant', content: [{ type: 'text', text: 'ok' }] }, finishReason: 'stop',
          ...(u ? { usage: u } : {}) }
    } } as Provider
}
const shortSummarizer = (window: number): Provider => ({ model: 's', baseURL: 'memory://s', contextWindow: window,
  maxTokens: 100, complete: async () => ({ message: { role: 'assistant', content: [{ type: 'text',
    text: 'Summary: tools were run.' }] }, finishReason: 'stop' }) } as Provider)
const tool = (chars: number) => ({ name: 't', description: 'd', parameters: { type: 'object', properties: {} },
  execute: () => 'r'.repeat(chars) })
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

// ── §12 under the room rule: the user's words in a checkpoint that fits ──

test('room: a large envelope (80% of the window) leaves user messages out of checkpoints that had room for them', { todo: 'open: the room rule (docs/design.md §5) makes §12\'s user budget a share of the kept window, and §12 leaves the oldest out when 200-unit cuts of them all exceed it; a floor tried this session raised a 95%-envelope case over the window (review6b 2), so the two rules need one decision' }, async () => {
  // Window 10,000 tokens, system prompt 8,000: room 2,000, f = 0.4, kept window 1,600, so a checkpoint's user budget
  // is 15% of 1,600 = 240 tokens (f² of the window's 1,500): four 223-unit messages (+ their 32-unit lines) cannot
  // "fit" it, and the oldest are left out with no recall key. Yet the largest conversation request sent was 8,981
  // tokens: a thousand tokens were free, and the four messages left out are about 56 tokens each.
  const sizes: number[] = []
  const session = await Session.open(new MemoryStore())
  const agent = new Agent({ session, provider: toolOncePerTurn(10_000, sizes), summarizer: shortSummarizer(10_000),
    system: 's'.repeat(32_000), recall: false, warn: () => {}, tools: [tool(2_000)] } as ConstructorParameters<typeof Agent>[0])
  for (let i = 0; i < 8; i++) await agent.run(words(i))
  const dropped = [...Array(8).keys()].filter((i) => !userMessagesOnSurface(session, 8).includes(i))
  const freeTokens = 10_000 - Math.max(...sizes)
  const droppedTokens = dropped.reduce((t, i) => t + estimateTextTokens(words(i)) + 8, 0)
  assert.ok(droppedTokens < freeTokens, `${droppedTokens} tokens of user messages dropped, ${freeTokens} were free`)
  // Observed: USER-1 … USER-4 are gone from the surface (no text, no recall key): the checkpoints "trimmed" them.
  assert.deepEqual(dropped, [], `user messages left out of the checkpoint: ${dropped.map((i) => `USER-${i}`).join(', ')}`)
})

test('room: the task is cut below the 200-unit minimum, to its marker alone, in a checkpoint with room to spare', { todo: 'open: with the 200-unit floor for the task and the others the same session sent a request of 10,230 tokens into its 10,000-token window; the task keeps its recall key meanwhile' }, async () => {
  // docs/design.md §12: "A message is cut to no fewer than 200 UTF-16 units". Window 10,000, system prompt 9,500:
  // room 500, f = 0.1, kept window 100 tokens, the task's share 10 tokens (40 units, less the 32-unit line): the
  // 223-unit task is "cut" to 86 units, the marker alone, and not one of its words is left. The conversation's
  // largest request was 9,727 tokens: the 223 units (56 tokens) whole would have fitted.
  const sizes: number[] = []
  const session = await Session.open(new MemoryStore())
  const agent = new Agent({ session, provider: toolOncePerTurn(10_000, sizes), summarizer: shortSummarizer(10_000),
    system: 's'.repeat(38_000), recall: false, warn: () => {}, tools: [tool(2_000)] } as ConstructorParameters<typeof Agent>[0])
  for (let i = 0; i < 4; i++) await agent.run(words(i))
  assert.ok(Math.max(...sizes) + 56 < 10_000, `largest request ${Math.max(...sizes)}`)
  const summaries = session.events.filter((e) => e.type === 'compaction/summary') as SessionEvent<'compaction/summary'>[]
  const tasks = summaries.map((s) => s.data.ledger?.userMessages.find((u) => u.seq === 2)?.text)
    .filter((t): t is string => t !== undefined)
  assert.ok(tasks.length > 0, 'a checkpoint carried the task')
  // Observed: [86, 86, 86]: '\n\n[... middle of this user message cut; recall {"key":"seq:2"} returns it whole ...]\n\n'
  assert.deepEqual(tasks.map((t) => t.length >= 200 || t === words(0)), tasks.map(() => true),
    `task lengths in checkpoints: ${tasks.map((t) => t.length).join(', ')}`)
  assert.ok(tasks.every((t) => t.startsWith('USER-0 please')), `the task's head: ${JSON.stringify(tasks[0].slice(0, 40))}`)
})

// ── A Provider's count, on the summary path ──

test('count: a summary request\'s countTokens answer that is no token count ("99999", 1.5e12, 12000.5) is not logged as a sample', async () => {
  // 66de51e: "a Provider's countTokens answer that is no token count is not logged (a warning, the estimate stands)".
  // That check is on the conversation's count near the window only; the summary job's own count (SummaryJob.request,
  // which re-plans on it) logs what it gets as `ladder/state {sample: {providerTokens}}`: a string, a count over
  // USAGE_MAX_TOKENS (1e9), a fraction. The fraction moves the calibration (2.41 after resume, from 1).
  const isSummary = (messages: readonly unknown[]) =>
    JSON.stringify(messages.at(-1)).includes('Write a checkpoint of the conversation')
  const logged: unknown[] = []
  for (const answer of ['99999', 1.5e12, 12000.5] as unknown[]) {
    let k = 0
    const provider = { model: 'm', baseURL: 'memory://m', contextWindow: 10_000, maxTokens: 100,
      countTokens: async (r: { messages: readonly unknown[] }) => {
        if (isSummary(r.messages)) return answer
        throw new Error('no count here')
      },
      complete: async (r: ChatRequest) => isSummary(r.messages)
        ? { message: { role: 'assistant', content: [{ type: 'text', text: 'Summary: tools were run.' }] }, finishReason: 'stop' }
        : k < 9 ? { message: { role: 'assistant', content: [{ type: 'tool-call', id: `c${k++}`, name: 't', arguments: '{}' }] },
          finishReason: 'tool-calls' }
          : { message: { role: 'assistant', content: [{ type: 'text', text: 'ok' }] }, finishReason: 'stop' },
    } as unknown as Provider
    const session = await Session.open(new MemoryStore())
    const agent = new Agent({ session, provider, system: 'sys', recall: false, warn: () => {}, compaction: { clear: false },
      tools: [tool(7_000)] } as ConstructorParameters<typeof Agent>[0])
    await agent.run('go')
    assert.ok(session.events.some((e) => e.type === 'compaction/summary'), `a summary was made (count ${answer})`)
    for (const e of session.events as SessionEvent<'ladder/state'>[]) {
      const t = e.type === 'ladder/state' ? (e.data as { sample?: { providerTokens: unknown } }).sample?.providerTokens : undefined
      if (t !== undefined && !(Number.isInteger(t) && (t as number) >= 0 && (t as number) <= 1e9)) logged.push(t)
    }
  }
  // Observed: ['99999' ×6, 1500000000000 ×6, 12000.5 ×12]
  assert.deepEqual([...new Set(logged)], [])
})

test('count: a countTokens that answers a plain number, or throws at once, disables every summary (requests grow past the window)', async () => {
  // The conversation's count near the window awaits the answer in a try: a plain number is read, a throw is a warning
  // and the estimate stands. The summary job calls `provider.countTokens?.(…).catch(…)`: a plain number has no
  // .catch (TypeError), a synchronous throw escapes the .catch; either fails the compaction before its request, every
  // time. With a 10,000-token window and nine 1,750-token results the requests grow to about 16,000 tokens.
  const seen: string[] = []
  for (const count of [() => 3000, () => { throw new Error('count: not supported by this server') }]) {
    let k = 0
    const sizes: number[] = []
    const provider = { ...toolOncePerTurn(10_000, sizes), countTokens: count,
      complete: async (r: ChatRequest) => { sizes.push(size(r))
        return k < 9 ? { message: { role: 'assistant', content: [{ type: 'tool-call', id: `c${k++}`, name: 't', arguments: '{}' }] },
          finishReason: 'tool-calls' } : { message: { role: 'assistant', content: [{ type: 'text', text: 'ok' }] }, finishReason: 'stop' } },
    } as unknown as Provider
    const session = await Session.open(new MemoryStore())
    const agent = new Agent({ session, provider, summarizer: { ...shortSummarizer(10_000), countTokens: count } as unknown as Provider,
      system: 'sys', recall: false, warn: () => {}, compaction: { clear: false }, tools: [tool(7_000)] } as ConstructorParameters<typeof Agent>[0])
    await agent.run('go')
    const failures = session.events.filter((e) => e.type === 'compaction/end' && (e.data as { error?: string }).error)
      .map((e) => (e.data as { error: string }).error)
    // Observed: 0 summaries, six failures 'provider.countTokens(...).catch is not a function' (or the count's own
    // error), and a largest request of ~16,000 tokens in the 10,000-token window.
    seen.push(...new Set(failures), ...(Math.max(...sizes) > 10_000 ? [`a request of ${Math.max(...sizes)} tokens`] : []))
  }
  assert.deepEqual(seen, [])
})

// ── The current input under the room rule: a steering message ──

test('input: a steering message is cut by the prune rung before the model has read it once, though it fits the window', async () => {
  // docs/design.md §3 "Oversized messages": "Earlier user messages may be cut likewise; the current input never is".
  // `steer(text)` queues the user's newest words for the next step: they are that step's current input. Window 10,000,
  // system prompt 6,000 (kept window 6,400), a 9,006-character steering message (~2,250 tokens) queued while a tool
  // runs: the request carrying it whole is ~9,000 tokens (over the 8,000 threshold, within the window).
  let k = 0
  const seen: { tokens: number; steer?: string }[] = []
  const provider = { model: 'm', baseURL: 'memory://m', contextWindow: 10_000, maxTokens: 100,
    complete: async (r: ChatRequest) => {
      const steer = r.messages.map((m) => (typeof m.content === 'string' ? m.content : ''))
        .find((c) => c.startsWith('STEER '))
      seen.push({ tokens: size(r), steer })
      return k < 3 ? { message: { role: 'assistant', content: [{ type: 'tool-call', id: `c${k++}`, name: 't', arguments: '{}' }] },
        finishReason: 'tool-calls' } : { message: { role: 'assistant', content: [{ type: 'text', text: 'ok' }] }, finishReason: 'stop' }
    } } as unknown as Provider
  const session = await Session.open(new MemoryStore())
  const steering = 'STEER ' + 'x'.repeat(9_000)
  const agent: Agent = new Agent({ session, provider, summarizer: shortSummarizer(10_000), system: 's'.repeat(24_000),
    recall: false, warn: () => {}, tools: [{ ...tool(1_200), execute: () => { if (k === 1) agent.steer(steering)
      return 'r'.repeat(1_200) } }] } as ConstructorParameters<typeof Agent>[0])
  await agent.run('task')
  const first = seen.find((s) => s.steer !== undefined)
  assert.ok(first, 'a request carried the steering message')
  const whole = first.tokens - estimateTextTokens(first.steer!) + estimateTextTokens(steering)
  assert.ok(whole < 10_000, `the request with it whole would be ${whole} tokens`)
  // Observed: the first request that carries it has 5,250 characters of the 9,006 (head + marker + tail).
  assert.equal(first.steer!.length, steering.length)
})

// ── The room as measured: a tokenizer that counts 1.5× the heuristic, an envelope over half the window ──

test('room: with a large envelope usage never calibrates, so summary requests are sent over the window they are planned to fit', { todo: 'open: a usage sample is taken only when the messages are half the request; calibrating with an envelope that large needs the offset fit replay has (docs/design.md §15) in a live session' }, async () => {
  // The server counts 1.5 tokens per heuristic token and reports it as usage on every answer, and refuses (400, with
  // its counts) a request over its 20,000-token window. System prompt 11,000 heuristic tokens (16,500 counted).
  // The conversation's total is anchored on usage and right; but a usage sample is taken only when the messages are
  // half the request, which a large envelope never lets them be, so the calibration stays 1 and the room, the kept
  // window and the summary job's plan all price the envelope at 11,000: the summary requests are planned to fit
  // and overflow.
  const W = 20_000, RATIO = 1.5
  const over: number[] = []
  const counted = (r: ChatRequest) => Math.round(size(r) * RATIO)
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
  const agent = new Agent({ session, provider, summarizer, system: 's'.repeat(44_000), recall: false, warn: () => {},
    compaction: { clear: false }, tools: [tool(8_000)] } as ConstructorParameters<typeof Agent>[0])
  await agent.run('task '.repeat(50))
  assert.deepEqual(over, [], 'no conversation request over the window')
  assert.ok(summaries.length > 0, 'summaries were made')
  // Observed: 3 of 14 summary requests over the window (23,027, 20,081, 20,081 counted tokens of 20,000).
  assert.deepEqual(summaries.filter((n) => n > W), [], `summary requests (counted tokens): ${summaries.join(', ')}`)
})

// ── The spend cap: a Provider of the caller's own whose prices change after the cap is checked ──

const FLASH = { cacheHitInput: 0.003, cacheMissInput: 0.15, output: 0.6 }
/** A Provider of the caller's own whose `prices` getter answers FLASH until `state.changed`, then `later`. */
function changingPrices(state: { changed: boolean }, later: unknown): Provider {
  return { model: 'm', baseURL: 'memory://m', contextWindow: 100_000, maxTokens: 100,
    get prices() { return state.changed ? later : FLASH },
    complete: async () => ({ message: { role: 'assistant', content: [{ type: 'text', text: 'ok' }] }, finishReason: 'stop',
      usage: { promptTokens: 10_000, completionTokens: 5 } }),
  } as unknown as Provider
}

test('cap: a custom Provider whose prices getter answers zeros once maxCostUSD is checked runs past the cap', async () => {
  // 19b89c8/e7fd24e read maxCostUSD and openAICompatible's prices once into copies, and spendCap() validates a custom
  // Provider's prices where the cap is set; but that validated copy is thrown away and every request/header reads
  // provider.prices again. With the prices honest, a $0.004 session cap stops the third 10,000-token turn ('budget').
  const state = { changed: false }
  const session = await Session.open(new MemoryStore())
  const agent = new Agent({ session, provider: changingPrices(state, { cacheHitInput: 0, cacheMissInput: 0, output: 0 }),
    maxCostUSD: { session: 0.004 }, warn: () => {} } as ConstructorParameters<typeof Agent>[0])
  state.changed = true
  const reasons: string[] = []
  for (let i = 0; i < 5; i++) reasons.push((await agent.run('x'.repeat(40_000))).reason)
  // Observed: ['stop' ×5], spendFloor().costUSD 0 after five 10,000-token requests.
  assert.deepEqual(reasons, ['stop', 'stop', 'budget', 'budget', 'budget'])
})

test('cap: a custom Provider whose prices turn NaN mid-session ends the turn with a clear error, not the log\'s INVALID_EVENT', async () => {
  // The same getter answering NaN prices after the check: the next request/header is refused by the log's own event
  // check, and run() throws SessionError INVALID_EVENT "request/header: prices.cacheHitInput must be … got null"
  // after turn/start and the input were logged (the turn has no end). Expected: the prices read once where the cap is
  // set (the run goes on at them), or a ConfigError/TypeError naming the provider's prices before the turn starts.
  const state = { changed: false }
  const session = await Session.open(new MemoryStore())
  const agent = new Agent({ session, provider: changingPrices(state, { cacheHitInput: NaN, cacheMissInput: NaN, output: NaN }),
    maxCostUSD: { session: 1 }, warn: () => {} } as ConstructorParameters<typeof Agent>[0])
  state.changed = true
  let thrown: unknown
  try { await agent.run('hello') } catch (e) { thrown = e }
  assert.ok(!(thrown instanceof Error && /INVALID_EVENT/.test(`${(thrown as { code?: string }).code} ${thrown.message}`)),
    `run threw ${(thrown as Error)?.name} ${(thrown as { code?: string })?.code}: ${(thrown as Error)?.message?.slice(0, 120)}`)
  const types = session.events.map((e) => e.type)
  assert.equal(types.filter((t) => t === 'turn/start').length, types.filter((t) => t === 'turn/end').length,
    `a turn/start without its turn/end: ${types.join(', ')}`)
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
        const n = size(r)
        if (n > W) throw new ProviderError('CONTEXT_WINDOW_EXCEEDED', `maximum context length is ${W} tokens`,
          { status: 400, body: `This model's maximum context length is ${W} tokens. However, you requested ${n} tokens` })
        return k < 6 ? { message: { role: 'assistant', content: [{ type: 'tool-call', id: `c${k++}`, name: 't', arguments: '{}' }] },
          finishReason: 'tool-calls' } : { message: { role: 'assistant', content: [{ type: 'text', text: 'done' }] }, finishReason: 'stop' }
      } } as unknown as Provider
    const session = await Session.open(new MemoryStore())
    const agent = new Agent({ session, provider, summarizer: shortSummarizer(W), system: 's'.repeat(38_400), recall,
      warn: () => {}, tools: [tool(2_000)] } as ConstructorParameters<typeof Agent>[0])
    try { return (await agent.run('task '.repeat(50))).reason } catch (e) { return `${(e as Error).name} ${(e as { code?: string }).code}` }
  }
  assert.equal(await outcome(false), 'stop')
  // Observed: 'ProviderError CONTEXT_WINDOW_EXCEEDED' (requested 10,417 tokens).
  assert.equal(await outcome(true), 'stop')
})
