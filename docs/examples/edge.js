// A script, not a module: dsh.iife.js, loaded before it, defines the global DSH.
addEventListener('fetch', (event) => {
  const output = 'line\n'.repeat(5000)
  const kept = DSH.pruneText(output)
  event.respondWith(Response.json({ version: DSH.VERSION, before: DSH.estimateTextTokens(output), after: DSH.estimateTextTokens(kept) }))
})
