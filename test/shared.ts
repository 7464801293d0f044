// Locates ../shared (fixtures and corpus from other public projects; never copied into this repo).
// Tests that need it call sharedPath(...) and skip with a visible message when it is absent;
// under CI (.ci/run sets DSH_REQUIRE_SHARED=1) absence is a failure instead.
import { existsSync, readFileSync } from 'node:fs'
import { fileURLToPath } from 'node:url'
import { dirname, join, resolve } from 'node:path'

const here = dirname(fileURLToPath(import.meta.url))
/** Root of the shared folder: $DSH_SHARED, or ../shared beside the repository. */
export const SHARED_DIR = resolve(process.env.DSH_SHARED ?? join(here, '..', '..', 'shared'))

/** Absolute path inside the shared folder. */
export function sharedPath(...parts: string[]): string { return join(SHARED_DIR, ...parts) }

/**
 * `false` when the shared folder (or the given part of it) is present. Otherwise a skip message for
 * node:test's `{ skip }` option — or, when DSH_REQUIRE_SHARED=1 (CI), it throws.
 */
export function skipWithoutShared(...parts: string[]): false | string {
  const p = sharedPath(...parts)
  if (existsSync(p)) return false
  const msg = `SKIPPED: ${p} is absent (set DSH_SHARED to the shared folder to run this test)`
  if (process.env.DSH_REQUIRE_SHARED === '1') throw new Error(msg.replace('SKIPPED', 'MISSING'))
  console.log(`# ${msg}`)
  return msg
}

const corpusText = new Map<string, string>()
/** The text of a corpus transcript (`shared/corpus/FILE`), read once per process. */
export function readCorpus(file: string): string {
  let text = corpusText.get(file)
  if (text === undefined) corpusText.set(file, text = readFileSync(sharedPath('corpus', file), 'utf8'))
  return text
}

/** The session's log from `fromSeq` on, read back (works on sessions that keep only their surface, e.g. FileStore). */
export async function logEvents(session: { readEvents(fromSeq?: number): AsyncIterable<import('../dsh.ts').SessionEvent> }, fromSeq = 0): Promise<import('../dsh.ts').SessionEvent[]> {
  const out: import('../dsh.ts').SessionEvent[] = []
  for await (const e of session.readEvents(fromSeq)) out.push(e)
  return out
}
