import { VERSION, estimateTextTokens, pruneText } from './dsh.ts'

const output = 'line\n'.repeat(5000) // a 25,000-char tool output
const kept = pruneText(output) // head + marker + tail (DEFAULT_PRUNE_CONFIG)
console.log(JSON.stringify({ version: VERSION, before: estimateTextTokens(output), after: estimateTextTokens(kept) }))
