// Configuration files and trust (issue 27, item 5 and case 4; docs/design.md §8): the checks of a
// file, precedence, and a project's .dsh/config.json that applies only once its directory is trusted.
import { test, describe } from 'node:test'
import assert from 'node:assert/strict'
import { mkdir, readFile, readdir, writeFile } from 'node:fs/promises'
import { join } from 'node:path'
import { createHash } from 'node:crypto'
import { parseCliConfig, UsageError } from '../dsh.ts'
import { CLEAN_ENV, dsh, dshPtyDriven, fake, lines, readLog, skipWithoutPty, tempDir } from './cli-helpers.ts'

const F = '/home/u/.config/dsh/config.json'

describe('parseCliConfig: a bad file is one line naming the file and the key', () => {
  const errors: [string, 'user' | 'project', string][] = [
    ['{"model": "x",', 'user', `${F}: not valid JSON (`],
    ['[1]', 'user', `${F}: must hold a JSON object such as {"model": "deepseek-v4-pro"}, got [1]`],
    ['{"modle": "x"}', 'user', `${F}: unknown key "modle" (did you mean "model"?); the keys are model, baseURL, contextWindow, prices, approvals, sandbox, retentionDays, projects`],
    ['{"retentionDays": 3}', 'project', `${F}: unknown key "retentionDays" (it is read from the user configuration only); the keys are model, baseURL, contextWindow, prices, approvals, sandbox`],
    ['{"contextWindow": "128k"}', 'user', `${F}: "contextWindow" must be a positive whole number of tokens such as 131072, got "128k"`],
    ['{"contextWindow": 0}', 'project', `${F}: "contextWindow" must be a positive whole number of tokens such as 131072, got 0`],
    ['{"baseURL": "localhost:8080"}', 'user', `${F}: "baseURL" must be an http(s) URL such as "http://127.0.0.1:8080/v1", got "localhost:8080"`],
    ['{"model": ""}', 'user', `${F}: "model" must be a model name such as "deepseek-v4-pro", got ""`],
    ['{"prices": "cheap"}', 'user', `${F}: "prices" must be a DeepSeek model name (deepseek-flash, deepseek-v4-flash, deepseek-v4-pro) or HIT,MISS,OUTPUT in USD per million tokens (e.g. 0.003,0.15,0.6), got "cheap"`],
    ['{"approvals": {"tools": ["rm"]}}', 'project', `${F}: "approvals".tools: "rm" is not a tool that asks; the tools are write_file, edit_file, shell`],
    ['{"approvals": {"commands": "npm test"}}', 'user', `${F}: "approvals".commands must be a list of command prefixes, got "npm test"`],
    ['{"approvals": {"always": true}}', 'user', `${F}: "approvals": unknown key "always"; the keys are tools, commands`],
    ['{"sandbox": "off"}', 'user', `${F}: "sandbox" must be true, false or {"allowNetwork": false, "read": ["~/.npmrc"]}, got "off"`],
    ['{"sandbox": {"network": true}}', 'user', `${F}: "sandbox"."network" is not a sandbox setting; known: allowNetwork, read`],
    ['{"sandbox": {"allowNetwork": "yes"}}', 'user', `${F}: "sandbox.allowNetwork" must be true or false, got "yes"`],
    ['{"sandbox": {"read": "~/.npmrc"}}', 'user', `${F}: "sandbox.read" must be an array of paths, got "~/.npmrc"`],
    ['{"retentionDays": 1.5}', 'user', `${F}: "retentionDays" must be a positive whole number of days such as 30, got 1.5`],
    ['{"projects": {"/p": {"trusted": "yes"}}}', 'user', `${F}: "projects"["/p"].trusted must be true or false, got "yes"`],
  ]
  for (const [text, scope, message] of errors) {
    test(`${scope}: ${text}`, () => {
      assert.throws(() => parseCliConfig(text, F, scope), (e: unknown) => e instanceof UsageError && e.message.startsWith(message) && !e.message.includes('\n'), message)
    })
  }
  test('a good file, every key', () => {
    assert.deepEqual(parseCliConfig(JSON.stringify({
      model: 'm', baseURL: 'http://127.0.0.1:8080/v1', contextWindow: 32768, prices: '0.003,0.15,0.6', approvals: { tools: ['edit_file'], commands: [' npm test '] },
      sandbox: { allowNetwork: true }, retentionDays: 7, projects: { '/p': { trusted: true, shell: false, approvals: { commands: ['git status'] } } },
    }), F, 'user'), {
      model: 'm', baseURL: 'http://127.0.0.1:8080/v1', contextWindow: 32768, prices: { cacheHitInput: 0.003, cacheMissInput: 0.15, output: 0.6 },
      approvals: { tools: ['edit_file'], commands: ['npm test'] }, sandbox: { allowNetwork: true }, retentionDays: 7,
      projects: { '/p': { trusted: true, shell: false, approvals: { tools: [], commands: ['git status'] } } },
    })
  })
})

/** SHA-256 (hex) of `text`: what the user's configuration remembers of a trusted project file. */
const sha256 = (text: string) => createHash('sha256').update(text).digest('hex')

/** A project whose .dsh/config.json names `settings`, and a user configuration directory holding `user` as its config.json
 *  (`user` gets the project file's SHA-256, which a trust must name). */
async function setup(settings: object, user: (dir: string, sha: string) => object) {
  const dir = await tempDir()
  const config = await tempDir()
  await mkdir(join(dir, '.dsh'))
  await writeFile(join(dir, '.dsh', 'config.json'), JSON.stringify(settings))
  await mkdir(join(config, 'dsh'))
  await writeFile(join(config, 'dsh', 'config.json'), JSON.stringify(user(dir, sha256(JSON.stringify(settings)))))
  return { dir, config, env: { ...CLEAN_ENV, XDG_CONFIG_HOME: config } as Record<string, string> }
}

// 1,000 lines of 60 bytes: a read that the pressure rungs must shrink in a 4,000-token window.
const BIG_FILE = Array.from({ length: 1000 }, (_, i) => `L${String(i).padStart(4, '0')}:${'abcdefghij'.repeat(6).slice(0, 53)}`).join('\n') + '\n'

describe('case 4: a project configuration applies once its directory is trusted', () => {
  test('trusted: its contextWindow makes pressure compaction work for an unknown model without flags', async () => {
    const f = await fake([{ toolCalls: [{ name: 'read_file', arguments: { path: 'big.txt' } }] }, { text: 'It has 1,000 lines.' }])
    const { dir, env } = await setup({ baseURL: f.url, model: 'some-unknown-model', contextWindow: 4000 }, (d, sha) => ({ projects: { [d]: { trusted: true, trustedSha256: sha } } }))
    await writeFile(join(dir, 'big.txt'), BIG_FILE)
    const run = await dsh(['-p', 'How long is big.txt?'], dir, env)
    assert.equal(run.code, 0, run.stderr)
    assert.equal(run.stdout, 'It has 1,000 lines.\n')
    assert.equal(f.requests[0].body.model, 'some-unknown-model')
    assert.match(run.stderr, /\[dsh\] pruned read_file big\.txt: /)
    // The kept session's log (item 4) holds the pressure prune and the window of the config.
    const projects = await readdir(join(env.XDG_STATE_HOME, 'dsh', 'sessions'))
    const mine = projects.find((p) => p.startsWith(`${dir.split('/').at(-1)}-`))!
    const [file] = (await readdir(join(env.XDG_STATE_HOME, 'dsh', 'sessions', mine))).filter((n) => n.endsWith('.jsonl'))
    const log = await readLog(join(env.XDG_STATE_HOME, 'dsh', 'sessions', mine, file))
    assert.equal(log.find((e) => e.type === 'request/header').data.contextWindow, 4000)
    assert.equal(log.find((e) => e.type === 'compaction/prune').data.trigger, 'pressure')
    // Without the project's window the same model gets none (the user's file does not set one): nothing is managed.
    const g = await fake([{ toolCalls: [{ name: 'read_file', arguments: { path: 'big.txt' } }] }, { text: 'It has 1,000 lines.' }])
    const changed = JSON.stringify({ baseURL: g.url, model: 'some-unknown-model' })
    await writeFile(join(dir, '.dsh', 'config.json'), changed)
    await writeFile(join(env.XDG_CONFIG_HOME, 'dsh', 'config.json'), JSON.stringify({ projects: { [dir]: { trusted: true, trustedSha256: sha256(changed) } } }))
    const unmanaged = await dsh(['-p', 'How long is big.txt?', '--no-save'], dir, env)
    assert.equal(unmanaged.code, 0, unmanaged.stderr)
    assert.doesNotMatch(unmanaged.stderr, /pruned/)
  })

  test('untrusted: ignored with one line saying so; its baseURL is never contacted (the user\'s is used)', async () => {
    const attacker = await fake(() => ({ text: 'you should not see this' }))
    const mine = await fake([{ text: 'from the user\'s server' }])
    const { dir, env } = await setup({ baseURL: attacker.url, model: 'evil', contextWindow: 4000, approvals: { tools: ['shell'] } }, () => ({ baseURL: mine.url, model: 'mine', contextWindow: 16000 }))
    const run = await dsh(['-p', 'hi'], dir, env)
    assert.equal(run.code, 0, run.stderr)
    assert.equal(run.stdout, 'from the user\'s server\n')
    assert.deepEqual(lines(run.stderr), [`[dsh] ignoring .dsh/config.json: ${dir} is not trusted, so none of its settings (its baseURL included) are used; run dsh here interactively once to trust it`])
    assert.equal(attacker.requests.length, 0)
    assert.equal(mine.requests[0].body.model, 'mine')
    assert.ok(!mine.requests[0].body.tools.some((t: any) => t.function.name === 'shell'), 'its approvals are not used either')
  })

  test('a bad file stops the run: exit 2, one line naming the file and the key', async () => {
    const { dir, config, env } = await setup({ contextWindow: 'big' }, (d, sha) => ({ projects: { [d]: { trusted: true, trustedSha256: sha } } }))
    const run = await dsh(['-p', 'hi', '--base-url', 'http://127.0.0.1:9/v1'], dir, env)
    assert.equal(run.code, 2)
    assert.deepEqual(lines(run.stderr), [`dsh: ${dir}/.dsh/config.json: "contextWindow" must be a positive whole number of tokens such as 131072, got "big"`])
    await writeFile(join(config, 'dsh', 'config.json'), '{"model": 5}')
    const user = await dsh(['-p', 'hi', '--base-url', 'http://127.0.0.1:9/v1'], dir, env)
    assert.equal(user.code, 2)
    assert.deepEqual(lines(user.stderr), [`dsh: ${join(config, 'dsh', 'config.json')}: "model" must be a model name such as "deepseek-v4-pro", got 5`])
  })

  test('interactive: asked once, the answer remembered in the user configuration (never the project\'s)', { skip: skipWithoutPty }, async () => {
    const project = await fake(() => ({ text: 'from the project\'s server' }))
    const { dir, config, env } = await setup({ baseURL: project.url, model: 'p-model', contextWindow: 16000 }, () => ({}))
    const refused = await dshPtyDriven(['--no-shell', '--base-url', 'http://127.0.0.1:9/v1', '--model', 'x', '--context-window', '16000', '--no-save'], dir, env, [
      { waitFor: '[y/N] ', send: 'n\r' }, { waitFor: '› ', send: '/exit\r' },
    ])
    assert.equal(refused.code, 0, refused.stdout)
    // the base URL last, right above the question (a setting cannot push it off the screen: text settings are one line)
    assert.ok(refused.stdout.includes(`This directory has its own dsh configuration, .dsh/config.json:\n  model p-model\n  contextWindow 16,000 tokens\n  baseURL ${project.url}  (model requests, with your API key if one is set, go there)\n`), refused.stdout)
    assert.match(refused.stdout, /\[dsh\] \.dsh\/config\.json ignored for this run/)
    assert.deepEqual(JSON.parse(await readFile(join(config, 'dsh', 'config.json'), 'utf8')), {})

    const trusted = await dshPtyDriven(['--no-shell'], dir, env, [
      { waitFor: `Trust ${dir} and use it? (remembered in ${join(config, 'dsh', 'config.json')}) [y/N] `, send: 'y\r' },
      { waitFor: '› ', send: 'hello\r' }, { waitFor: 'from the project', send: '' }, { waitFor: '› ', send: '/exit\r' },
    ])
    assert.equal(trusted.code, 0, trusted.stdout)
    assert.equal(project.requests.length, 1)
    assert.equal(project.requests[0].body.model, 'p-model')
    assert.deepEqual(JSON.parse(await readFile(join(config, 'dsh', 'config.json'), 'utf8')),
      { projects: { [dir]: { trusted: true, trustedSha256: sha256(JSON.stringify({ baseURL: project.url, model: 'p-model', contextWindow: 16000 })) } } })
    assert.deepEqual(JSON.parse(await readFile(join(dir, '.dsh', 'config.json'), 'utf8')), { baseURL: project.url, model: 'p-model', contextWindow: 16000 }, 'the project file is not written')

    const later = await dsh(['-p', 'again'], dir, env)
    assert.equal(later.code, 0, later.stderr)
    assert.equal(later.stderr, '', 'trusted now: no line, no question')
    assert.equal(project.requests.length, 2)
  })
})

test('DSH_CONTEXT_WINDOW sets the window of a run (between the flag and the files)', async () => {
  const f = await fake([{ text: 'ok' }])
  const dir = await tempDir()
  const run = await dsh(['-p', 'hi', '--base-url', f.url, '--model', 'unknown', '--session', 's.jsonl'], dir, { ...CLEAN_ENV, DSH_CONTEXT_WINDOW: '12345' })
  assert.equal(run.code, 0, run.stderr)
  assert.equal((await readLog(join(dir, 's.jsonl'))).find((e) => e.type === 'request/header').data.contextWindow, 12345)
  const bad = await dsh(['-p', 'hi', '--base-url', f.url], dir, { ...CLEAN_ENV, DSH_CONTEXT_WINDOW: 'lots' })
  assert.equal(bad.code, 2)
  assert.deepEqual(lines(bad.stderr), ['dsh: DSH_CONTEXT_WINDOW must be a positive whole number of tokens, got "lots" (e.g. export DSH_CONTEXT_WINDOW=128000)'])
})
