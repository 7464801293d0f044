// Session logs for the resume benchmarks (bench/scale.bench.ts, bench/compare.ts): a generator of
// valid dsh logs of any size, and the floor a resume is compared with — read the file in 4 MiB
// chunks and JSON.parse every line once.
import { closeSync, fsyncSync, openSync, readSync, writeSync } from 'node:fs'

const MiB = 1024 * 1024

/**
 * Writes a valid dsh log of about `bytes` bytes: turns of one tool call with a ~96 KiB result (a
 * tenth of them non-ASCII), each followed by a compaction whose checkpoint replaces the whole
 * surface — the shape of a long session whose originals are all shadowed. The surface left is one
 * checkpoint. Written with large synchronous writes, then fsynced, as a session's own log is step by step
 * (unsynced, the first resume's own fsync would wait for the writeback of the whole file, a cost
 * a real log never has); returns the event count. `version` goes into `session/start` (the
 * VERSION of the build that will read it).
 */
export function writeLog(file: string, bytes: number, version: string): number {
  const fd = openSync(file, 'w')
  let seq = 0, written = 0, buf: string[] = [], bufLen = 0
  const put = (type: string, data: unknown) => {
    const line = JSON.stringify({ seq: seq++, type, time: 1_700_000_000_000 + seq, data }) + '\n'
    buf.push(line); bufLen += line.length
    if (bufLen > 8 * MiB) { const b = Buffer.from(buf.join('')); writeSync(fd, b); written += b.length; buf = []; bufLen = 0 }
  }
  put('session/start', { id: 'bench', version })
  put('request/header', { model: 'bench', baseURL: 'memory://bench', system: 'You are a bench.', tools: [], maxTokens: 1000, contextWindow: 32_000 })
  const ascii = 'export function f(x: number): number { return x * 2 } // line of code\n'.repeat(1400)
  const mixed = '北京市 😊 données — ünïcödé text, 日本語のテキスト\n'.repeat(2200)
  let head = -1
  for (let turn = 1; written + bufLen < bytes; turn++) {
    put('turn/start', { turn })
    const user = seq; put('user/message', { message: { role: 'user', content: `task ${turn}` }, surfaceOp: { op: 'append' } })
    put('step/start', { turn, step: 1 })
    put('assistant/message', { message: { role: 'assistant', content: [{ type: 'tool-call', id: `c${turn}`, name: 'read_file', arguments: `{"path":"src/f${turn}.ts"}` }] }, finishReason: 'tool_calls', surfaceOp: { op: 'append' } })
    put('tool/call', { callId: `c${turn}`, name: 'read_file' })
    put('tool/result', { message: { role: 'tool', toolCallId: `c${turn}`, content: [{ type: 'text', text: turn % 10 === 0 ? mixed : ascii }] }, surfaceOp: { op: 'append' } })
    put('step/end', { turn, step: 1 })
    put('step/start', { turn, step: 2 })
    const last = seq; put('assistant/message', { message: { role: 'assistant', content: [{ type: 'text', text: `done ${turn}` }] }, finishReason: 'stop', surfaceOp: { op: 'append' } })
    put('step/end', { turn, step: 2 })
    put('turn/end', { turn, reason: 'stop' })
    const id = `k${turn}`
    put('compaction/start', { id, trigger: 'pressure' })
    put('compaction/summary', { id, summary: `checkpoint ${turn}`, shadowedSeqs: [], shadowedTokenCount: 0, model: 'bench' })
    const start = head >= 0 ? head : user
    head = seq; put('user/message', { message: { role: 'user', content: `<compacted-summary>checkpoint ${turn}</compacted-summary>` }, surfaceOp: { op: 'replace', start, end: last } })
    put('compaction/end', { id })
  }
  const b = Buffer.from(buf.join('')); writeSync(fd, b)
  fsyncSync(fd)
  closeSync(fd)
  return seq
}

/** The floor of a resume: reads `file` in 4 MiB chunks and `JSON.parse`s every line once. Returns the line count. */
export function readAndParse(file: string): number {
  const fd = openSync(file, 'r')
  const chunk = Buffer.allocUnsafe(4 * MiB)
  let carry: Buffer | undefined
  let lines = 0
  try {
    for (;;) {
      const n = readSync(fd, chunk, 0, chunk.length, null)
      if (n === 0) break
      let buf = chunk.subarray(0, n)
      if (carry) { buf = Buffer.concat([carry, buf]); carry = undefined }
      let from = 0
      for (let nl = buf.indexOf(10); nl >= 0; nl = buf.indexOf(10, from)) { JSON.parse(buf.toString('utf8', from, nl)); lines++; from = nl + 1 }
      if (from < buf.length) carry = Buffer.from(buf.subarray(from))
    }
  } finally { closeSync(fd) }
  return lines
}
