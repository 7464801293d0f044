// The adapter's one test seam (internals.adapterTuning, docs/design.md §14): its retries, times and message cap
// are named constants of dsh.ts, read when a provider is made. A test that needs others makes its provider here.
import { internals } from '../dsh.ts'

export type Tuning = Partial<typeof internals.adapterTuning>

/** `make()` run with the adapter's tuning changed by `tuning`, then set back: the provider it makes keeps it. */
export function tuned<T>(tuning: Tuning, make: () => T): T {
  const saved = { ...internals.adapterTuning }
  Object.assign(internals.adapterTuning, tuning)
  try { return make() } finally { Object.assign(internals.adapterTuning, saved) }
}
