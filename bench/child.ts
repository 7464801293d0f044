// One benchmark in its own process: `node --expose-gc --import tsx bench/child.ts NAME OUT.json`.
// Started by bench/run.ts; runs bench/NAME.bench.ts and writes its Section as JSON to OUT.json.
import { writeFileSync } from 'node:fs'
import type { Benchmark, Section } from './lib.ts'

const [name, out] = process.argv.slice(2)
if (!name || !out) {
  console.error('usage: node --expose-gc --import tsx bench/child.ts NAME OUT.json (normally started by bench/run.ts)')
  process.exit(2)
}
let section: Section
try {
  const mod = (await import(`./${name}.bench.ts`)) as { default: Benchmark }
  section = await mod.default()
} catch (err) {
  console.error(err)
  section = { id: name, title: name, status: 'failed', reason: String((err as Error)?.message ?? err), method: '', tables: [], targets: [] }
}
writeFileSync(out, JSON.stringify(section))
