// The runtime's one test seam (internals.tuning, docs/design.md §14): the adapter's retries, times and message cap,
// and the ladder's retained tail, summary cap and net-cost gate, are named constants of dsh.ts, read when a provider
// (the adapter's) or an Agent (the ladder's) is made. A test that needs other values makes its provider or Agent here.
import { internals, DEFAULT_COMPACTION_CONFIG, type LadderConfig } from '../dsh.ts'

export type Tuning = Partial<typeof internals.tuning.adapter>
export type LadderTuning = Partial<typeof internals.tuning.ladder>

/** `make()` run with `part` of the seam changed by `tuning`, then set back (once its promise settles, if it returns one). */
function withTuning<P extends object, T>(part: P, tuning: Partial<P>, make: () => T): T {
  const saved = { ...part }
  Object.assign(part, tuning)
  let result: T
  try { result = make() } catch (err) { Object.assign(part, saved); throw err }
  if (result instanceof Promise) return result.finally(() => Object.assign(part, saved)) as T
  Object.assign(part, saved)
  return result
}

/** `make()` with the adapter's tuning changed: the provider it makes keeps it. */
export const tuned = <T>(tuning: Tuning, make: () => T): T => withTuning(internals.tuning.adapter, tuning, make)

/** `make()` with the ladder's constants changed: an Agent it makes (a replay's too, before its promise settles) keeps them. */
export const ladderTuned = <T>(tuning: LadderTuning, make: () => T): T => withTuning(internals.tuning.ladder, tuning, make)

/** A ladder configuration as an Agent resolves it, for a `CompactionHost` built by hand. */
export const ladderConfig = (config: Partial<LadderConfig> = {}): LadderConfig =>
  ({ ...DEFAULT_COMPACTION_CONFIG, ...internals.tuning.ladder, ...config })
