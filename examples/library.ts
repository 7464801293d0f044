// A session, some messages, a prune and a measurement — no model needed.
// Run: npx tsx examples/library.ts
import { Session, MemoryStore, estimateMessageTokens, pruneToolResult } from '../dsh.ts'

const session = await Session.open(new MemoryStore())
session.append('user/message', { message: { role: 'user', content: 'Why does the build fail?' }, surfaceOp: { op: 'append' } })
session.append('assistant/message', {
  message: { role: 'assistant', content: [{ type: 'tool-call', id: 'call_1', name: 'shell', arguments: '{"command":"npm run build"}' }] },
  finishReason: 'tool_calls', surfaceOp: { op: 'append' },
})
const log = 'error TS2304: Cannot find name "x".\n'.repeat(5_000) // 180,000 UTF-16 units
const result = session.append('tool/result', { message: { role: 'tool', toolCallId: 'call_1', content: [{ type: 'text', text: log }] }, surfaceOp: { op: 'append' } })

console.log('before:', session.measure().totalTokens, 'tokens') // 45,038
const reclaimed = pruneToolResult(session, result.seq) // head 4,096 + marker + tail 1,024 code points
console.log('pruned:', reclaimed, 'tokens reclaimed; now', session.measure().totalTokens, 'tokens') // 43,710 → 1,328
console.log('original kept in the log:', estimateMessageTokens((session.events[result.seq].data as any).message), 'tokens')
console.log('replaceGeneration:', session.replaceGeneration, '| events:', session.events.map((e) => e.type).join(', '))
