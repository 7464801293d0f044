import { Agent, Session, openAICompatible } from './dsh.mjs'

const add = {
  name: 'add', description: 'adds two numbers',
  parameters: { type: 'object', properties: { a: { type: 'number' }, b: { type: 'number' } }, required: ['a', 'b'] },
  execute: ({ a, b }) => String(a + b),
}

export default {
  async fetch(request, env) {
    const provider = openAICompatible({ baseURL: env.MODEL_URL, model: 'local-model', contextWindow: 32_768 })
    const agent = new Agent({ session: await Session.open(), provider, tools: [add] })
    const { text, steps } = await agent.run('What is 2 + 3? Use the add tool.')
    return Response.json({ text, steps })
  },
}
