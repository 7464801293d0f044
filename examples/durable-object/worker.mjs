// A Cloudflare Worker whose agent sessions live in Durable Objects: one object per session id,
// holding the session log (store.mjs), so every request for that id continues the same session.
//
//   POST /sessions/<id>   {"input": "…"}  runs one agent turn → {turn, text, events: [[seq, type], …]}
//   GET  /sessions/<id>                   the log as stored → {events: [SessionEvent, …]}
//
// The model: any OpenAI-compatible server (PROVIDER_URL, MODEL, API_KEY, CONTEXT_WINDOW bindings);
// for DeepSeek use deepseek({ apiKey: env.DEEPSEEK_API_KEY }) instead of openAICompatible.
import { DurableObject } from 'cloudflare:workers'
import { Agent, Session, openAICompatible } from './dsh.mjs'
import { DurableObjectLogStore } from './store.mjs'

export class SessionObject extends DurableObject {
  #session // Promise<Session>: opened once per object lifetime, from storage
  #queue = Promise.resolve() // turns of this session, one after another

  /** Runs one turn. Calls queue up: a turn waits on the model (I/O), and a session runs one turn at a time. */
  turn(id, input) {
    const run = this.#queue.then(() => this.#turn(id, input))
    this.#queue = run.catch(() => {})
    return run
  }

  /** The events as stored (read back from storage, not from the session in memory). */
  async log() {
    return (await new DurableObjectLogStore(this.ctx.storage).load()).events
  }

  async #turn(id, input) {
    // After the object was evicted, Session.open replays the stored log and logs a resume.
    this.#session ??= Session.open(new DurableObjectLogStore(this.ctx.storage), { id })
    const session = await this.#session
    const { env } = this
    const provider = openAICompatible({
      baseURL: env.PROVIDER_URL, model: env.MODEL, apiKey: env.API_KEY,
      contextWindow: env.CONTEXT_WINDOW ? Number(env.CONTEXT_WINDOW) : undefined,
    })
    const result = await new Agent({ session, provider }).run(input)
    return { turn: result.turn, text: result.text, events: session.events.map((e) => [e.seq, e.type]) }
  }
}

export default {
  async fetch(request, env) {
    const match = /^\/sessions\/([\w.-]{1,100})$/.exec(new URL(request.url).pathname)
    if (!match) return new Response('use /sessions/<id>', { status: 404 })
    const session = env.SESSIONS.get(env.SESSIONS.idFromName(match[1]))
    if (request.method === 'GET') return Response.json({ events: await session.log() })
    if (request.method !== 'POST') return new Response('GET or POST', { status: 405 })
    const { input } = await request.json()
    if (typeof input !== 'string' || input === '') return new Response('body: {"input": "a non-empty string"}', { status: 400 })
    return Response.json(await session.turn(match[1], input))
  },
}
