// Stores with one defect each, for test/store-conformance.test.ts: the conformance suite must fail
// on them (a suite that passes a broken store checks nothing). Run as a child: BROKEN=name.
import { type LoadedLog, type LogStore, type SessionEvent } from '../dsh.ts'
import { testLogStore } from '../conformance.ts'

/** A log kept as JSON lines in a Map shared by every instance (so instances cross like a file's). */
const logs = new Map<string, string[]>()
class SharedStore implements LogStore {
  constructor(readonly key: string) {}
  protected lines(): string[] { let l = logs.get(this.key); if (!l) logs.set(this.key, l = []); return l }
  protected encode(e: SessionEvent): string { return JSON.stringify(e) }
  async load(): Promise<LoadedLog> { return { events: this.lines().map((l) => JSON.parse(l)) } }
  async append(events: readonly SessionEvent[]): Promise<void> { for (const e of events) this.lines().push(this.encode(e)) }
}
const broken: Record<string, new (key: string) => LogStore> = {
  /** Text goes through UTF-8 bytes: lone surrogates come back as U+FFFD. */
  'utf8-lossy': class extends SharedStore {
    protected encode(e: SessionEvent) { return new TextDecoder().decode(new TextEncoder().encode(JSON.stringify(e).replace(/\\ud[89a-f][0-9a-f]{2}/g, (m) => JSON.parse(`"${m}"`)))) }
  },
  /** A new instance misses the last batch of the one before (a write cached and never stored). */
  'loses-last-batch': class extends SharedStore {
    private last = 0
    async append(events: readonly SessionEvent[]) { await super.append(events); this.last = events.length }
    async close() { this.lines().splice(this.lines().length - this.last, this.last) }
  },
  /** Claims one writer but lets two write the same seqs. */
  'no-second-writer-check': SharedStore,
}
const name = process.env.BROKEN!
/** 'torn-line-kept': a crash leaves half a line, which the store's load does not drop. */
const tear = name !== 'torn-line-kept' ? 'not a store with partial writes'
  : async (key: string, events: readonly SessionEvent[]) => { logs.get(key)!.push(JSON.stringify(events[0]).slice(0, 20)) }
testLogStore(name, (key) => new (broken[name] ?? SharedStore)(key), { secondWriter: 'refused', tear })
