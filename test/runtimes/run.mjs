// Runs the smoke scenario in Node, Deno or Bun:
//   <runtime> test/runtimes/run.mjs MODULE_URL BASE_URL PROVIDER_URL
// MODULE_URL is a file: URL of dsh.ts (Node through tsx, Deno, Bun) or of dist/dsh.mjs.
// Prints one line `DSH-SMOKE {"runtime", "steps", "observation"}` on stdout; exits 1 on failure.
import { run } from './scenario.mjs'

const [moduleURL, baseURL, providerURL] = globalThis.Deno ? globalThis.Deno.args : process.argv.slice(2)
const runtime = globalThis.Deno ? `deno ${globalThis.Deno.version.deno}`
  : globalThis.Bun ? `bun ${globalThis.Bun.version}`
  : `node ${process.version}`
try {
  const dsh = await import(moduleURL)
  const result = await run(dsh, baseURL, providerURL)
  console.log('DSH-SMOKE ' + JSON.stringify({ runtime, ...result }))
} catch (err) {
  console.error(`${runtime}: ${err?.stack ?? err}`)
  // Deno and Bun have `process` too, but Deno.exit avoids relying on its Node compatibility layer.
  globalThis.Deno ? globalThis.Deno.exit(1) : process.exit(1)
}
