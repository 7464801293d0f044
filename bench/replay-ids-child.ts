// One measurement of the replay-ids benchmark (bench/replay-ids.bench.ts) in its own process, run as a
// bundle with plain `node replay-ids-child.mjs BUNDLE CALLS [pieces]`: builds an OpenAI-style transcript of one
// assistant message with CALLS tool calls that all carry the id "call", then the CALLS results (the
// shape SWE-agent demonstrations and some providers produce), and times readTranscript and
// replayTranscript on the build at BUNDLE, and unmanagedSession (the floor replay builds, timed alone:
// it does not depend on the loop's cap on the calls it runs of one message). Prints one JSON line:
// {calls, readMs, floorMs, replayMs?, rows?}. With `pieces`, replayTranscript is not run (the build
// before the fix takes minutes there).
import { pathToFileURL } from 'node:url'

const [bundle, callsText, mode] = process.argv.slice(2)
const calls = Number(callsText)
const dsh = (await import(pathToFileURL(bundle).href)) as Record<string, any>
const call = (i: number) => ({ id: 'call', type: 'function', function: { name: 'shell', arguments: `{"command":"echo ${i}"}` } })
const messages: object[] = [
  { role: 'user', content: 'go' },
  { role: 'assistant', content: '', tool_calls: Array.from({ length: calls }, (_, i) => call(i)) },
  ...Array.from({ length: calls }, (_, i) => ({ role: 'tool', tool_call_id: 'call', content: `output ${i}` })),
  { role: 'assistant', content: 'done' },
]
const text = JSON.stringify(messages)
const t0 = performance.now()
const transcript = dsh.readTranscript(text)
const t1 = performance.now()
dsh.unmanagedSession(transcript)
const t2 = performance.now()
const out: Record<string, number> = { calls, readMs: t1 - t0, floorMs: t2 - t1 }
if (mode !== 'pieces') {
  const report = await dsh.replayTranscript(transcript, { contextWindow: 128_000 })
  Object.assign(out, { replayMs: performance.now() - t2, rows: report.rows.length })
}
process.stdout.write(JSON.stringify(out) + '\n')
