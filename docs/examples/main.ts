import { Agent, Session, openAICompatible, type Tool } from './dsh.ts'

// Any OpenAI-compatible server; here a local one (vLLM, llama.cpp, Ollama serve …/v1).
// For DeepSeek use deepseek() instead: it reads the key from DEEPSEEK_API_KEY.
const provider = openAICompatible({ baseURL: 'http://127.0.0.1:8000/v1', model: 'local-model', contextWindow: 32_768 })
const add: Tool<{ a: number; b: number }> = {
  name: 'add', description: 'adds two numbers',
  parameters: { type: 'object', properties: { a: { type: 'number' }, b: { type: 'number' } }, required: ['a', 'b'] },
  execute: ({ a, b }) => String(a + b),
}
const agent = new Agent({ session: await Session.open(), provider, tools: [add] })
const { text, steps } = await agent.run('What is 2 + 3? Use the add tool.')
console.log(JSON.stringify({ text, steps }))
