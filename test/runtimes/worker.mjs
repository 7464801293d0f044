// The smoke scenario inside a Cloudflare worker (workerd), importing the ESM bundle.
// test/runtimes.test.ts writes a workerd config beside copies of dsh.mjs, scenario.mjs and this
// file, binds BASE_URL and PROVIDER_URL (text) and routes outbound fetches through a network service that allows
// "local" addresses (workerd's default outbound refuses 127.0.0.1), then runs `workerd test`.
import * as dsh from './dsh.mjs'
import { run } from './scenario.mjs'

export default {
  // `workerd test` calls test() and exits 1 if it throws.
  async test(controller, env) {
    const result = await run(dsh, env.BASE_URL, env.PROVIDER_URL)
    console.log('DSH-SMOKE ' + JSON.stringify({ runtime: 'workerd', ...result }))
  },
}
