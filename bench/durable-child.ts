// One measurement of the durable-step benchmark (bench/durable.bench.ts) in its own process.
// Prints one JSON line on stdout. BUNDLE is a build of dsh.ts (bench/builds.ts); DIR is on a disk.
//
// Run as a bundle (bench/builds.ts bundleScript) with plain `node --expose-gc durable-child.mjs …`:
//   durable-child run STEPS BLOCK DIR BUNDLE
//     STEPS durable steps, turn by turn (a turn is 10 steps); after (or, every other turn, before)
//     each turn the floor writes the turn's bytes as one line per step, writeSync + fsyncSync each.
//     Per block of BLOCK steps: steps, bytes, fsyncs, dsh ms, floor ms.
//   durable-child profile STEPS DIR BUNDLE
//     WARMUP steps untimed, then STEPS steps under V8's sampling CPU profiler (the one `node
//     --cpu-prof` drives, started through node:inspector so that only the steps are sampled);
//     writes DIR/steps.cpuprofile.
import { writeFileSync } from 'node:fs'
import { Session as Inspector } from 'node:inspector/promises'
import { join } from 'node:path'
import { pathToFileURL } from 'node:url'
import { openRawFloor, stepRunner, type StepModule } from './steps.ts'

const [mode, ...args] = process.argv.slice(2)
const out = (value: unknown): void => { process.stdout.write(JSON.stringify(value) + '\n') }
const load = async (bundle: string) => (await import(pathToFileURL(bundle).href)) as StepModule
/** Steps run before the profiler starts: module start-up and JIT warm-up stay out of the profile. */
const PROFILE_WARMUP_STEPS = 200
/** Sampling interval of the profile, µs (V8's default is 1,000). */
const PROFILE_INTERVAL_US = 250

if (mode === 'run') {
  const [steps, block, dir, bundle] = [Number(args[0]), Number(args[1]), args[2], args[3]]
  const runner = await stepRunner(await load(bundle), join(dir, 'durable.jsonl'))
  const floor = openRawFloor(join(dir, 'raw.jsonl'))
  const blocks: { steps: number; bytes: number; syncs: number; dshMs: number; rawMs: number }[] = []
  // Paired per turn (~10 steps, tens of ms), not per block: a shared disk's fsync latency moves
  // within a second. The floor goes after the turn on even turns and before it on odd ones (then
  // with the previous turn's bytes per step, as this turn's are not known yet).
  let done = 0, turn = 0, perStep = 0
  while (done < steps) {
    const cur = { steps: 0, bytes: 0, syncs: 0, dshMs: 0, rawMs: 0 }
    while (cur.steps < block && done + cur.steps < steps) {
      const bytes0 = runner.bytes(), syncs0 = runner.syncs()
      const before = turn % 2 === 1 ? floor.run(10, 10 * perStep) : -1
      const t0 = performance.now()
      const n = await runner.run(1)
      cur.dshMs += performance.now() - t0
      const bytes = runner.bytes() - bytes0
      cur.rawMs += before >= 0 ? before * n / 10 : floor.run(n, bytes)
      cur.steps += n; cur.bytes += bytes; cur.syncs += runner.syncs() - syncs0
      perStep = bytes / n
      turn++
    }
    blocks.push(cur)
    done += cur.steps
  }
  await runner.close()
  floor.close()
  out({ blocks })
} else if (mode === 'profile') {
  const [steps, dir, bundle] = [Number(args[0]), args[1], args[2]]
  const runner = await stepRunner(await load(bundle), join(dir, 'profiled.jsonl'))
  await runner.run(PROFILE_WARMUP_STEPS)
  const inspector = new Inspector()
  inspector.connect()
  await inspector.post('Profiler.enable')
  await inspector.post('Profiler.setSamplingInterval', { interval: PROFILE_INTERVAL_US })
  await inspector.post('Profiler.start')
  const t0 = performance.now()
  const n = await runner.run(steps)
  const ms = performance.now() - t0
  const { profile } = await inspector.post('Profiler.stop')
  inspector.disconnect()
  await runner.close()
  writeFileSync(join(dir, 'steps.cpuprofile'), JSON.stringify(profile))
  out({ steps: n, ms, intervalUs: PROFILE_INTERVAL_US, warmupSteps: PROFILE_WARMUP_STEPS })
} else {
  console.error('usage: see the header of bench/durable-child.ts')
  process.exit(2)
}
