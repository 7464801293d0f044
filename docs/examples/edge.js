// A script, not a module: dsh.iife.js, loaded before it, defines the global DSH.
const add = {
  name: 'add', description: 'adds two numbers',
  parameters: { type: 'object', properties: { a: { type: 'number' }, b: { type: 'number' } }, required: ['a', 'b'] },
  execute: ({ a, b }) => String(a + b),
}

addEventListener('fetch', (event) => {
  const provider = DSH.openAICompatible({ baseURL: 'http://127.0.0.1:8000/v1', model: 'local-model', contextWindow: 32_768 })
  event.respondWith((async () => {
    const agent = new DSH.Agent({ session: await DSH.Session.open(), provider, tools: [add] })
    const { text, steps } = await agent.run('What is 2 + 3? Use the add tool.')
    return Response.json({ text, steps })
  })())
})
