// The parts over the log (docs/design.md §14): cost, recall, pins and calibration are read with
// CostLedger.of / RecallIndex.of / Pins.of, see every event of a loaded log, and stay out of a bundle
// that imports only Session.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { spawnSync } from 'node:child_process'
import { tmpdir } from 'node:os'
import { dirname, join } from 'node:path'
import { fileURLToPath, pathToFileURL } from 'node:url'
import { CostLedger, FileStore, MemoryStore, Pins, RecallIndex, Session, pruneToolResult } from '../dsh.ts'

const ROOT = dirname(dirname(fileURLToPath(import.meta.url)))
const append = { op: 'append' } as const

/** A session with a header, a calibrating answer (usage 2× the heuristic), a pinned input and a pruned result. */
async function scripted(session: Session): Promise<{ resultSeq: number; inputSeq: number }> {
  session.append('request/header', { model: 'm', baseURL: 'http://x', contextWindow: 100_000, maxTokens: 100,
    prices: { cacheHitInput: 0.1, cacheMissInput: 1, output: 2 } } as any)
  const input = session.append('user/message', { message: { role: 'user', content: 'q'.repeat(8_000) }, surfaceOp: append })
  session.append('assistant/message', { message: { role: 'assistant', content: [{ type: 'tool-call', id: 'c1', name: 'shell', arguments: '{}' }] },
    usage: { promptTokens: 4_016, completionTokens: 7 }, finishReason: 'tool_calls', surfaceOp: append })
  const result = session.append('tool/result', { message: { role: 'tool', toolCallId: 'c1', content: [{ type: 'text', text: 'x'.repeat(20_000) }] }, surfaceOp: append })
  Pins.of(session).pin(input.seq)
  assert.ok(pruneToolResult(session, result.seq) > 0)
  await session.sync()
  return { resultSeq: result.seq, inputSeq: input.seq }
}

test('parts: a loaded log gives every part the figures the live session had', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'dsh-parts-'))
  try {
    const file = join(dir, 's.jsonl')
    const live = await Session.open(new FileStore(file))
    const { resultSeq, inputSeq } = await scripted(live)
    const figures = (s: Session) => ({
      usage: CostLedger.of(s).usage(), next: CostLedger.of(s).nextRequestCache(),
      shadowed: [...RecallIndex.of(s).shadowedSeqs()], origin: RecallIndex.of(s).originalTokens(s.surface().at(-1)!.seq),
      pins: Pins.of(s).seqs(), pinnedTokens: Pins.of(s).tokens(),
      calibration: s.measure().calibration, samples: s.measure().calibrationSamples, total: s.measure().totalTokens,
    })
    const before = figures(live)
    assert.deepEqual(before.shadowed, [resultSeq])
    assert.deepEqual(before.pins, [inputSeq])
    assert.equal(before.origin, 5_008) // the result as first logged: 20,000 units / 4 + 8
    assert.equal(before.samples, 1)
    assert.equal(before.calibration, 2) // 4,016 reported for 2,008 heuristic tokens
    assert.equal(before.usage.requests, 1)
    await live.store.close?.()
    const loaded = await Session.open(new FileStore(file), { readOnly: true })
    assert.deepEqual(figures(loaded), before)
    await loaded.store.close?.()
  } finally { rmSync(dir, { recursive: true, force: true }) }
})

test('parts: reading one of another object is a TypeError that says what to pass', () => {
  for (const read of [() => CostLedger.of({} as Session), () => RecallIndex.of(null as any), () => Pins.of(42 as any)]) {
    assert.throws(read, (e: any) => e instanceof TypeError && /is not a Session of this copy of dsh.ts: pass the Session whose log the part reads/.test(e.message))
  }
})

test('parts: an app bundling only {Session, MemoryStore} leaves the parts out, and its measure() is uncalibrated', async () => {
  const esbuild = await import('esbuild')
  const program = `import { Session, MemoryStore } from ${JSON.stringify(join(ROOT, 'dsh.ts'))}
const s = await Session.open(new MemoryStore())
s.append('request/header', { model: 'm', contextWindow: 100000, maxTokens: 100 })
s.append('user/message', { message: { role: 'user', content: 'q'.repeat(8000) }, surfaceOp: { op: 'append' } })
s.append('assistant/message', { message: { role: 'assistant', content: [{ type: 'text', text: 'a' }] }, usage: { promptTokens: 4016, completionTokens: 7 }, finishReason: 'stop', surfaceOp: { op: 'append' } })
const m = s.measure()
export const figures = { calibration: m.calibration, samples: m.calibrationSamples, anchored: m.anchored, total: m.totalTokens }
// The provider's own count of the request is the anchor in the session itself, ladder or not.
s.append('ladder/state', { sample: { providerTokens: 3000, heuristicTokens: m.heuristicTokens, source: 'count' } })
export const counted = { anchored: s.measure().anchored, total: s.measure().totalTokens }`
  const result = await esbuild.build({
    stdin: { contents: program, resolveDir: ROOT, loader: 'ts' },
    bundle: true, minify: true, format: 'esm', platform: 'neutral', external: ['node:*'], write: false, logLevel: 'silent',
  })
  const js = result.outputFiles[0].text
  // One text each of the cost ledger, the recall index, the pins view and the ladder's memory.
  for (const text of ['cacheHitShare', 'reportedCacheRequests', 'cannot pin', 'transcriptFit', 'firstResultTokens']) {
    assert.equal(js.includes(text), false, `${text} belongs to a part the app never reads`)
  }
  const dir = mkdtempSync(join(tmpdir(), 'dsh-parts-app-'))
  try {
    writeFileSync(join(dir, 'app.mjs'), js)
    const { figures, counted } = await import(pathToFileURL(join(dir, 'app.mjs')).href)
    // Uncalibrated, still anchored on the answer's usage: 4,016 prompt + 7 completion tokens as reported.
    assert.deepEqual(figures, { calibration: 1, samples: 0, anchored: true, total: 4_016 + 7 })
    assert.deepEqual(counted, { anchored: true, total: 3_000 })
  } finally { rmSync(dir, { recursive: true, force: true }) }
  // The same log in dsh.ts (all parts present) is calibrated from that answer.
  const s = await Session.open(new MemoryStore())
  s.append('request/header', { model: 'm', contextWindow: 100000, maxTokens: 100 } as any)
  s.append('user/message', { message: { role: 'user', content: 'q'.repeat(8000) }, surfaceOp: append })
  s.append('assistant/message', { message: { role: 'assistant', content: [{ type: 'text', text: 'a' }] }, usage: { promptTokens: 4016, completionTokens: 7 }, finishReason: 'stop', surfaceOp: append })
  assert.deepEqual([s.measure().calibration, s.measure().calibrationSamples], [2, 1])
})

test('parts: a subclass of Session that overrides surface() or measure() changes no part figure; Pins.of is one view', async () => {
  class Inflated extends Session {
    private readonly extra = [] as any[]
    override surface(): any { return this.extra.length >= 0 ? super.surface() : undefined }
    override measure(): any { const m = super.measure(); return { ...m, envelopeTokens: m.envelopeTokens + 1000, surfaceTokens: m.surfaceTokens + 1000, calibration: 3 } }
  }
  const figures = async (s: Session) => {
    await scripted(s)
    return { next: CostLedger.of(s).nextRequestCache(), usage: CostLedger.of(s).usage(), pinned: Pins.of(s).tokens(), calibration: Session.prototype.measure.call(s).calibration }
  }
  const plain = await figures(new Session({ store: new MemoryStore() }))
  const sub = new Inflated({ store: new MemoryStore() })
  assert.deepEqual(await figures(sub), plain)
  assert.notEqual(sub.measure().calibration, plain.calibration, 'the override is in effect')
  assert.equal(Pins.of(sub), Pins.of(sub))
})

test('parts: the constructors are private (CostLedger.of and the others are the way in), in the types too', async () => {
  const dir = mkdtempSync(join(ROOT, 'test', '.tmp-parts-'))
  try {
    writeFileSync(join(dir, 'use.ts'), `import { CostLedger, Pins, RecallIndex, Session } from '../../dsh.ts'
declare const s: Session
new CostLedger(s as any)
new RecallIndex(s as any, {} as any)
new Pins(s as any, {} as any)
CostLedger.of(s).usage(); RecallIndex.of(s).shadowedSeqs(); Pins.of(s).seqs()
`)
    writeFileSync(join(dir, 'tsconfig.json'), JSON.stringify({ compilerOptions: { noEmit: true, strict: true, target: 'ES2022', module: 'ESNext',
      moduleResolution: 'Bundler', allowImportingTsExtensions: true, skipLibCheck: true, types: ['node'] }, files: ['use.ts'] }))
    const tsc = spawnSync(process.execPath, [join(ROOT, 'node_modules', 'typescript', 'bin', 'tsc'), '-p', join(dir, 'tsconfig.json')], { encoding: 'utf8' })
    const errors = tsc.stdout.split('\n').filter((l) => l.startsWith('use.ts') || l.includes('use.ts('))
      .map((l) => l.replace(/^.*use\.ts\((\d+),\d+\): error TS\d+: /, '$1: '))
    assert.deepEqual(errors, [
      "3: Constructor of class 'CostLedger' is private and only accessible within the class declaration.",
      "4: Constructor of class 'RecallIndex' is private and only accessible within the class declaration.",
      "5: Constructor of class 'Pins' is private and only accessible within the class declaration.",
    ], tsc.stdout)
  } finally { rmSync(dir, { recursive: true, force: true }) }
})

test('parts: a session of another copy of dsh.ts is a TypeError that says so; the message pruner alone does not bundle Session', async () => {
  const dir = mkdtempSync(join(ROOT, 'test', '.tmp-copy-'))
  try {
    writeFileSync(join(dir, 'dsh.ts'), readFileSync(join(ROOT, 'dsh.ts')))
    const other = await import(pathToFileURL(join(dir, 'dsh.ts')).href) as typeof import('../dsh.ts')
    const foreign = await other.Session.open(new other.MemoryStore())
    const { resultSeq } = await scripted(await Session.open(new MemoryStore())) // this copy's session works
    assert.ok(resultSeq > 0)
    const says = (e: any) => e instanceof TypeError && /is not a Session of this copy of dsh\.ts: .*another copy of dsh\.ts in the process/.test(e.message)
    assert.throws(() => CostLedger.of(foreign as any), says)
    assert.throws(() => pruneToolResult(foreign as any, 1), says)
    assert.equal(other.CostLedger.of(foreign).usage().requests, 0) // its own copy reads it
  } finally { rmSync(dir, { recursive: true, force: true }) }
  const esbuild = await import('esbuild')
  const result = await esbuild.build({
    stdin: { contents: `import { pruneToolResult } from ${JSON.stringify(join(ROOT, 'dsh.ts'))}\nconsole.log(pruneToolResult)`, resolveDir: ROOT, loader: 'ts' },
    bundle: true, minify: true, format: 'esm', platform: 'neutral', external: ['node:*'], write: false, logLevel: 'silent',
  })
  const js = result.outputFiles[0].text
  assert.equal(js.includes('cannot build a request: tool call(s)'), false, 'Session.messages is not in a pruner-only bundle')
  assert.ok(js.length < 12_000, `${js.length} bytes`)
})
