import { VERSION, estimateTextTokens, pruneText } from './dsh.mjs'

export default {
  async fetch(request) {
    const output = 'line\n'.repeat(5000)
    const kept = pruneText(output)
    return Response.json({ version: VERSION, before: estimateTextTokens(output), after: estimateTextTokens(kept) })
  },
}
