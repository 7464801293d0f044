// An in-process Provider for loop and ladder tests: answers from a script, records every request.
// (The HTTP-level fake provider is test/fake-provider.ts; this one isolates the loop from the wire.)
import { ProviderError, estimateRequestTokens, type ChatRequest, type ChatResponse, type Provider, type Block } from '../dsh.ts'

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
