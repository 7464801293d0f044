// Durable steps for the benchmarks (bench/durable-child.ts, bench/scale-child.ts, bench/compare.ts):
// an Agent of a given build of dsh.ts on a FileStore, driven by an in-process scripted provider,
// and the floor it is compared with — raw `writeSync` + `fsyncSync` of the same bytes per step.
// Uses only the API every build has had since the first FileStore (Session.open, Agent, FileStore,
// agent.run → {steps}, store.sync/close), so one harness measures any commit.
import { closeSync, fsyncSync, openSync, statSync, writeSync } from 'node:fs'
import type { ChatRequest, ChatResponse } from '../dsh.ts'

/** The part of a dsh.ts build the step harness uses (structural: any commit's module fits). */
export interface StepModule {
  Session: { open(store: unknown): Promise<unknown> }
  Agent: new (options: { session: unknown; provider: unknown; tools: unknown[] }) => { run(input: string): Promise<{ steps: number }> }
  FileStore: new (path: string) => { sync(): Promise<void>; close(): Promise<void> }
}

/** Tool calls per turn: a turn is this many `read_file` steps, then an answer (one more step). */
export const CALLS_PER_TURN = 9

/** An in-process provider: each turn calls `read_file` `callsPerTurn` times, then answers; summaries are short. */
export class StepProvider {
  readonly model = 'bench'
  readonly baseURL = 'memory://bench'
  readonly contextWindow = 32_000
  readonly maxTokens = 1_000
  private n = 0
  constructor(private readonly callsPerTurn = CALLS_PER_TURN) {}
  async complete(req: ChatRequest): Promise<ChatResponse> {
    if (req.headers?.['x-dsh-purpose'] === 'compaction') return { message: { role: 'assistant', content: [{ type: 'text', text: 'Checkpoint: read files; nothing pending.' }] }, finishReason: 'stop' }
    const i = this.n++
    if (i % (this.callsPerTurn + 1) === this.callsPerTurn) return { message: { role: 'assistant', content: [{ type: 'text', text: 'done' }] }, finishReason: 'stop' }
    return { message: { role: 'assistant', content: [{ type: 'tool-call', id: `c${i}`, name: 'read_file', arguments: JSON.stringify({ path: `src/f${i % 97}.ts` }) }] }, finishReason: 'tool_calls' }
  }
}

/** The tool of the steps: ~2.3 KB of code per call. */
export const readTool = { name: 'read_file', description: 'reads a file', parameters: { type: 'object' }, execute: (a: { path: string }) => `// ${a.path}\n` + 'export const x = 1 // some code here\n'.repeat(60) }

/** A running Agent on a FileStore of `mod` at `file`; `syncs` counts the store's fsyncs (after open, too). */
export interface StepRunner {
  /** Runs whole turns until at least `minSteps` steps ran; returns the steps run. */
  run(minSteps: number): Promise<number>
  /** Bytes in the log now. */
  bytes(): number
  syncs(): number
  close(): Promise<void>
}

/** Opens a session on a FileStore of `mod` (fsync on unless `fsync` is false) and an Agent with the scripted provider. */
export async function stepRunner(mod: StepModule, file: string, options: { fsync?: boolean } = {}): Promise<StepRunner> {
  let syncs = 0
  const fsync = options.fsync !== false
  const Base = mod.FileStore
  const Counting = class extends Base { async sync(): Promise<void> { syncs++; if (fsync) await super.sync() } }
  const store = new Counting(file)
  const session = await mod.Session.open(store)
  const agent = new mod.Agent({ session, provider: new StepProvider(), tools: [readTool] })
  let turn = 0
  return {
    async run(minSteps) {
      let done = 0
      while (done < minSteps) done += (await agent.run(`task ${turn++}`)).steps
      return done
    },
    bytes: () => statSync(file).size,
    syncs: () => syncs,
    close: () => store.close(),
  }
}

/**
 * The floor of durable steps, appended to `file` (kept open until `close`): `run(steps, bytes)`
 * writes `bytes` in `steps` equal lines, each with one `writeSync` and one `fsyncSync`; returns ms.
 */
export function openRawFloor(file: string): { run(steps: number, bytes: number): number; close(): void } {
  let fd = openSync(file, 'a')
  return {
    run(steps, bytes) {
      const line = Buffer.from('x'.repeat(Math.max(1, Math.round(bytes / steps) - 1)) + '\n')
      const t0 = performance.now()
      for (let i = 0; i < steps; i++) { writeSync(fd, line); fsyncSync(fd) }
      return performance.now() - t0
    },
    close() { if (fd >= 0) closeSync(fd); fd = -1 },
  }
}
