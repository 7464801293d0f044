/**
 * test/crash-driver.ts — a child process for the crash-safety test (test/reliability.test.ts).
 *
 *   node --import tsx test/crash-driver.ts --session FILE --url URL [--chunky]
 *
 * Opens (and so resumes) the session in FILE on a FileStore, then runs turns forever against the
 * fake provider at URL, until the parent kills it with SIGKILL. Tools that sleep and tools with
 * large outputs, a small context window and a small prune config make every kind of moment likely:
 * mid-append, mid-stream, mid-tool, mid-compaction.
 *
 * Stdout (written synchronously, so a line is out before any kill):
 *   `ready N`   the session is open; N events are in the log
 *   `synced N`  a sync (fsync) completed with N events in the file
 *   `at PHASE`  the driver entered PHASE: stream, tool, compaction, idle (on each change)
 * `--chunky` writes each append in three pieces with pauses between them (a slow disk), so that a
 * kill can leave a torn last line.
 */
import { writeSync } from 'node:fs'
import { Agent, FileStore, Session, openAICompatible, type SessionEvent, type Tool, type TornLine } from '../dsh.ts'
import { tuned } from './tuning.ts'

const args = process.argv.slice(2)
const flag = (name: string): string | undefined => { const i = args.indexOf(name); return i >= 0 ? args[i + 1] : undefined }
const file = flag('--session')!
const url = flag('--url')!
const chunky = args.includes('--chunky')
const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms))
const say = (line: string): void => { writeSync(1, line + '\n') }

/** A FileStore that reports every completed sync with the number of events in the file. */
class ReportingStore extends FileStore {
  count = 0
  async scan(onEvent: (e: SessionEvent) => void): Promise<{ torn?: TornLine }> { this.count = 0; return await super.scan((e) => { this.count++; onEvent(e) }) }
  async append(events: readonly SessionEvent[]): Promise<void> { await super.append(events); this.count += events.length }
  async sync(): Promise<void> { await super.sync(); say(`synced ${this.count}`) }
}

/**
 * Writes each batch in three pieces with pauses: a kill between them tears the last line (anywhere
 * in it, even inside its first bytes). The pauses are long enough that some of the 50 chunky kills
 * land in them (the test asserts a mid-append kill); at 3 ms a run averaged 3 and about 1 in 20 had none.
 */
const PIECE_PAUSE_MS = 10
class ChunkyStore extends ReportingStore {
  protected async write(bytes: Uint8Array): Promise<void> {
    const a = Math.floor(bytes.length / 3), b = Math.floor((2 * bytes.length) / 3)
    for (const piece of [bytes.subarray(0, a), bytes.subarray(a, b), bytes.subarray(b)]) { await super.write(piece); await sleep(PIECE_PAUSE_MS) }
  }
}

const store = chunky ? new ChunkyStore(file) : new ReportingStore(file)
const session = await Session.open(store)
say(`ready ${session.seq}`)

const tools: Tool[] = [
  { name: 'nap', description: 'sleeps ms milliseconds', parameters: { type: 'object' }, execute: async (a: { ms: number }) => { await sleep(a.ms); return `slept ${a.ms} ms` } },
  { name: 'dump', description: 'returns n characters', parameters: { type: 'object' }, execute: (a: { n: number }) => `dump ${a.n}\n` + 'abcdefghij\n'.repeat(Math.ceil(a.n / 11)) },
]
const provider = tuned({ retryBaseMs: 1, retryMaxMs: 5 }, () => openAICompatible({ baseURL: url, model: 'fake-model', apiKey: 'sk-crash-driver', contextWindow: 4_000, headers: { 'x-lane': 'child' } }))
let phase = ''
const enter = (p: string): void => { if (p !== phase) { phase = p; say(`at ${p}`) } }
const agent = new Agent({
  session, provider, tools, prune: { thresholdChars: 2_000, headChars: 800, tailChars: 400 },
  onEvent: (e) => {
    if (e.type === 'stream') enter(phase === 'compaction' ? 'compaction' : 'stream')
    else if (e.type === 'log') {
      const t = e.event.type
      if (t === 'tool/call') enter('tool')
      else if (t === 'compaction/start') enter('compaction')
      else if (t === 'tool/result' || t === 'compaction/end' || t === 'assistant/message' || t === 'step/end') enter('idle')
    }
  },
})
for (let i = 0; ; i++) {
  try { await agent.run(`task ${i}: use the tools`) } catch (err) { say(`error ${(err as Error).message.slice(0, 200)}`) }
}
