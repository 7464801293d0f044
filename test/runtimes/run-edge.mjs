// Runs the smoke scenario in Vercel's edge-runtime, the way an edge function runs: classic scripts
// (no ES modules) evaluated in its VM, answering a fetch event.
//   node test/runtimes/run-edge.mjs IIFE_PATH BASE_URL PROVIDER_URL
// IIFE_PATH is dist/dsh.iife.js (defines the global DSH). The scenario module is turned into a
// script (global SMOKE) with esbuild. Prints one `DSH-SMOKE {…}` line; exits 1 on failure.
import { EdgeRuntime } from 'edge-runtime'
import * as esbuild from 'esbuild'
import { readFileSync } from 'node:fs'
import { createRequire } from 'node:module'
import { fileURLToPath } from 'node:url'

const [iifePath, baseURL, providerURL] = process.argv.slice(2)
const { version } = createRequire(import.meta.url)('edge-runtime/package.json')
try {
  const scenario = await esbuild.build({
    entryPoints: [fileURLToPath(new URL('./scenario.mjs', import.meta.url))],
    bundle: true, format: 'iife', globalName: 'SMOKE', write: false, logLevel: 'warning',
  })
  const handler = `addEventListener('fetch', (event) => {
    const params = new URL(event.request.url).searchParams
    event.respondWith(SMOKE.run(DSH, params.get('base'), params.get('provider')).then(
      (result) => new Response(JSON.stringify(result), { headers: { 'content-type': 'application/json' } }),
      (err) => new Response(String(err && err.stack || err), { status: 500 })))
  })`
  const initialCode = [readFileSync(iifePath, 'utf8'), scenario.outputFiles[0].text, handler].join('\n;\n')
  const runtime = new EdgeRuntime({ initialCode })
  const res = await runtime.dispatchFetch(`http://edge.invalid/?base=${encodeURIComponent(baseURL)}&provider=${encodeURIComponent(providerURL)}`)
  const text = await res.text()
  if (res.status !== 200) throw new Error(`edge function answered ${res.status}: ${text}`)
  console.log('DSH-SMOKE ' + JSON.stringify({ runtime: `edge-runtime ${version}`, ...JSON.parse(text) }))
} catch (err) {
  console.error(`edge-runtime ${version}: ${err?.stack ?? err}`)
  process.exit(1)
}
