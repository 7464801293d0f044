// An in-process Provider for loop and ladder tests: answers from a script, records every request.
// (The HTTP-level fake provider is test/fake-provider.ts; this one isolates the loop from the wire.)
import { ProviderError, estimateRequestTokens, type ChatRequest, type ChatResponse, type Prices, type Provider, type Block } from '../dsh.ts'

export type Reply = ChatResponse | ProviderError | ((req: ChatRequest, index: number) => ChatResponse | ProviderError | Promise<ChatResponse | ProviderError>)

export interface Recorded { request: ChatRequest; purpose: string; estimate: number }

export const say = (text: string, usage?: ChatResponse['usage']): ChatResponse => ({ message: { role: 'assistant', content: [{ type: 'text', text }] }, finishReason: 'stop', usage })
export const call = (id: string, name: string, args: object = {}, extra: Block[] = []): ChatResponse =>
  ({ message: { role: 'assistant', content: [...extra, { type: 'tool-call', id, name, arguments: JSON.stringify(args) }] }, finishReason: 'tool_calls' })
export const overflow = () => new ProviderError('CONTEXT_WINDOW_EXCEEDED', "This model's maximum context length is 16000 tokens. However, you requested 17000 tokens.", { status: 400, body: '{"error":{"message":"This model\'s maximum context length is 16000 tokens."}}' })

/** Conversation replies come from `script` in order; summary requests (x-dsh-purpose: compaction) from `summaries`. */
export class ScriptedProvider implements Provider {
  readonly model = 'scripted'
  readonly baseURL = 'memory://scripted'
  readonly maxTokens = 1000
  readonly requests: Recorded[] = []
  private conv = 0
  private sum = 0
  constructor(readonly contextWindow: number | undefined, private script: Reply[], private summaries: Reply[] = [], private gate?: (req: ChatRequest) => Promise<void>) {}
  get conversation() { return this.requests.filter((r) => r.purpose === 'conversation') }
  get summaryRequests() { return this.requests.filter((r) => r.purpose === 'compaction') }
  async complete(req: ChatRequest): Promise<ChatResponse> {
    const purpose = req.headers?.['x-dsh-purpose'] ?? 'conversation'
    this.requests.push({ request: { ...req, messages: structuredClone(req.messages) }, purpose, estimate: estimateRequestTokens({ system: req.system, tools: req.tools }, req.messages) })
    await this.gate?.(req)
    if (req.signal?.aborted) throw new ProviderError('ABORTED', 'aborted')
    const list = purpose === 'compaction' ? this.summaries : this.script
    const index = purpose === 'compaction' ? this.sum++ : this.conv++
    let reply = list[Math.min(index, list.length - 1)]
    if (reply === undefined) throw new Error(`script has no ${purpose} reply #${index}`)
    if (typeof reply === 'function') reply = await reply(req, index)
    if (reply instanceof ProviderError) throw reply
    return structuredClone(reply)
  }
}

/** deepseek-flash off-peak, USD per million tokens. */
export const FLASH: Prices = { cacheHitInput: 0.003, cacheMissInput: 0.15, output: 0.6 }

/** The size of request `r` in heuristic tokens, as the meter prices it. */
export const requestTokens = (r: ChatRequest): number => estimateRequestTokens({ system: r.system, tools: r.tools }, r.messages)

/** A tool `t` whose result is `chars` code points. */
export const resultTool = (chars: number) => ({ name: 't', description: 'd', parameters: { type: 'object', properties: {} },
  execute: () => 'r'.repeat(chars) })

/** A conversation model of window `window` that calls tool `t` once per user message, then answers 'ok'; the sizes
 *  (heuristic tokens, as the meter prices them) of every request it was sent go to `sizes`. */
export function toolOncePerTurn(window: number, sizes: number[], usage?: (r: ChatRequest, i: number) => { promptTokens: number;
  completionTokens: number } | undefined): Provider {
  let k = 0, i = 0
  return { model: 'm', baseURL: 'memory://m', contextWindow: window, maxTokens: 100,
    complete: async (r: ChatRequest) => {
      sizes.push(requestTokens(r))
      const u = usage?.(r, i++)
      return r.messages.at(-1)!.role === 'user'
        ? { message: { role: 'assistant', content: [{ type: 'tool-call', id: `c${k++}`, name: 't', arguments: '{}' }] },
          finishReason: 'tool-calls', ...(u ? { usage: u } : {}) }
        : { message: { role: 'assistant', content: [{ type: 'text', text: 'ok' }] }, finishReason: 'stop',
          ...(u ? { usage: u } : {}) }
    } } as Provider
}

/** A summarizer of window `window` whose every summary is one short line. */
export const shortSummarizer = (window: number): Provider => ({ model: 's', baseURL: 'memory://s', contextWindow: window,
  maxTokens: 100, complete: async () => ({ message: { role: 'assistant', content: [{ type: 'text',
    text: 'Summary: tools were run.' }] }, finishReason: 'stop' }) } as Provider)
