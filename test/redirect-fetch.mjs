// Preloaded (`node --import`) by the docs snippet test (test/docs-examples.test.ts): every model
// request a snippet makes (…/chat/completions, whatever the host: DeepSeek, a local server) goes to
// the fake OpenAI-compatible server at $DSH_TEST_MODEL_URL instead. Nothing else changes.
const target = process.env.DSH_TEST_MODEL_URL
const original = globalThis.fetch
if (target) {
  globalThis.fetch = (input, init) => {
    const url = typeof input === 'string' ? input : input instanceof URL ? input.href : input.url
    return /\/chat\/completions$/.test(new URL(url).pathname) ? original(`${target}/chat/completions`, init) : original(input, init)
  }
}
