// The redesign of Part I must not change what the ladder does (docs/design.md §14): the replay rows
// of every shared-corpus transcript at 16k / 32k / 64k tokens equal the rows recorded at the commit
// the redesign started from (test/replay-rows.json, dsh's own output, not shared data). Each chain
// is compared by the SHA-256 of all its rows (every field); the short per-row lines name the first
// difference. Recorded with `RECORD_REPLAY_ROWS=<a dsh.ts of the base commit> node --import tsx --test
// test/replay-rows.test.ts` (e.g. `git show BASE:dsh.ts > .tmp/base/dsh.ts`); re-record only for a
// deliberate change of behaviour, and say why in the commit.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { createHash } from 'node:crypto'
import { existsSync, readFileSync, readdirSync, writeFileSync } from 'node:fs'
import { runReplay, type ReplayReport } from '../dsh.ts'
import { resolve } from 'node:path'
import { sharedPath, skipWithoutShared, readCorpus } from './shared.ts'

const WINDOWS = [16_000, 32_000, 64_000]
const RECORDED = new URL('./replay-rows.json', import.meta.url)
interface Chain { rows: number; sha256: string; lines: string[] }
type Recorded = { commit: string; chains: Record<string, Chain> }

const skip = skipWithoutShared('corpus')
const files = skip ? [] : readdirSync(sharedPath('corpus')).filter((f) => /\.(jsonl|traj|json)$/.test(f)).sort()

/** One line per row: kind, turn.step, tokens before > after, the rung, prunes and summary calls. */
const line = (r: ReplayReport['rows'][number]) =>
  `${r.kind === 'step' ? 's' : 't'}${r.turn}.${r.step} ${r.requestTokens ?? '-'} ${r.beforeTokens}>${r.afterTokens} ${r.rung} p${r.prunes} c${r.summaryCalls}`

async function chains(replay: typeof runReplay): Promise<Record<string, Chain>> {
  const out: Record<string, Chain> = {}
  for (const file of files) {
    for (const contextWindow of WINDOWS) {
      const { report, sidechainReports } = await replay(readCorpus(file), { contextWindow, sidechains: true })
      ;[report, ...sidechainReports].forEach((r, k) => {
        out[`${file} @${contextWindow} #${k}`] = {
          rows: r.rows.length, sha256: createHash('sha256').update(JSON.stringify(r.rows)).digest('hex'), lines: r.rows.map(line),
        }
      })
    }
  }
  return out
}

test('replay rows of every corpus transcript at 16k / 32k / 64k equal the recorded ones', { skip }, async () => {
  const base = process.env.RECORD_REPLAY_ROWS
  if (base) {
    const module = await import(resolve(base)) as { runReplay: typeof runReplay }
    const commit = process.env.RECORD_REPLAY_COMMIT ?? base
    writeFileSync(RECORDED, JSON.stringify({ commit, chains: await chains(module.runReplay) } satisfies Recorded, null, 1) + '\n')
  }
  const now = await chains(runReplay)
  assert.ok(existsSync(RECORDED), 'test/replay-rows.json is missing: record it at the base commit')
  const recorded = JSON.parse(readFileSync(RECORDED, 'utf8')) as Recorded
  assert.deepEqual(Object.keys(now).sort(), Object.keys(recorded.chains).sort())
  for (const [name, chain] of Object.entries(recorded.chains)) {
    const got = now[name]
    if (got.sha256 === chain.sha256) continue
    const at = chain.lines.findIndex((l, i) => got.lines[i] !== l)
    assert.fail(`${name}: rows differ from those recorded at ${recorded.commit}` + (at < 0
      ? ` (the same ${chain.rows} lines; another field differs)`
      : ` from row ${at}: recorded "${chain.lines[at]}", now "${got.lines[at] ?? '(none)'}"`))
  }
})
