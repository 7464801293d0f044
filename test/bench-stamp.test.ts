// The benchmarks' bookkeeping (not their timings): which commit a run says it measured
// (bench/lib.ts commitStamp, stampLabel), how an `--update` splice stamps its sections
// (bench/results.ts), and how a CPU profile's self and total times are counted (bench/profile.ts).
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { execFileSync } from 'node:child_process'
import { mkdtempSync, mkdirSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { changedPaths, commitStamp, stampLabel, type Section } from '../bench/lib.ts'
import { render, splice, targetsOf } from '../bench/results.ts'
import { topFrames, type CpuProfile } from '../bench/profile.ts'

const git = (cwd: string, ...args: string[]) => execFileSync('git', args, { cwd, encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] }).trim()

test('changedPaths reads porcelain -z output: leading-space status, renames, bench outputs left out', () => {
  const z = [' M dsh.ts', '?? bench/new.ts', 'R  docs/b.md', 'docs/a.md', ' M bench/RESULTS.md', 'M  docs/bench.md', ''].join('\0')
  assert.deepEqual(changedPaths(z), ['dsh.ts', 'bench/new.ts', 'docs/b.md'])
  assert.deepEqual(changedPaths(''), [])
})

test('stampLabel: clean, dsh.ts from an older commit, dirty with and without dsh.ts', () => {
  assert.equal(stampLabel({ commit: 'abc1234', dshCommit: 'abc1234', changed: [] }), 'abc1234')
  assert.equal(stampLabel({ commit: 'abc1234', dshCommit: 'e9ce0b5', changed: [] }), 'abc1234 (dsh.ts as of e9ce0b5)')
  assert.equal(stampLabel({ commit: 'abc1234', dshCommit: 'abc1234', changed: ['dsh.ts'], dshBlob: '0123456789' }), 'abc1234 + dirty: dsh.ts modified (blob 0123456789)')
  assert.equal(stampLabel({ commit: 'abc1234', dshCommit: 'abc1234', changed: ['a', 'b', 'c', 'd', 'e'] }), 'abc1234 + dirty: a, b, c and 2 more differ')
  assert.equal(stampLabel({ commit: 'abc1234', dshCommit: 'abc1234', changed: ['bench/x.ts'] }), 'abc1234 + dirty: bench/x.ts differs')
})

test('commitStamp names HEAD, the commit of dsh.ts, and what differs from HEAD', () => {
  const dir = mkdtempSync(join(tmpdir(), 'dsh-stamp-'))
  try {
    git(dir, 'init', '-q')
    git(dir, 'config', 'user.email', 't@example.invalid'); git(dir, 'config', 'user.name', 't')
    mkdirSync(join(dir, 'bench'))
    writeFileSync(join(dir, 'dsh.ts'), 'export const a = 1\n')
    writeFileSync(join(dir, 'bench', 'RESULTS.md'), '# r\n')
    git(dir, 'add', '.'); git(dir, 'commit', '-q', '-m', 'one')
    const first = git(dir, 'rev-parse', '--short', 'HEAD')
    assert.deepEqual(commitStamp(dir), { commit: first, dshCommit: first, changed: [], dshBlob: undefined })

    writeFileSync(join(dir, 'README.md'), 'x\n')
    git(dir, 'add', '.'); git(dir, 'commit', '-q', '-m', 'two')
    const second = git(dir, 'rev-parse', '--short', 'HEAD')
    assert.equal(stampLabel(commitStamp(dir)), `${second} (dsh.ts as of ${first})`)

    writeFileSync(join(dir, 'bench', 'RESULTS.md'), '# r2\n') // what the runner itself writes: not dirty
    assert.deepEqual(commitStamp(dir).changed, [])
    writeFileSync(join(dir, 'dsh.ts'), 'export const a = 2\n')
    writeFileSync(join(dir, 'bench', 'new.ts'), '')
    const s = commitStamp(dir)
    assert.deepEqual(s.changed.sort(), ['bench/new.ts', 'dsh.ts'])
    assert.equal(s.dshBlob, git(dir, 'hash-object', 'dsh.ts').slice(0, 10))
    assert.equal(stampLabel(s), `${second} (dsh.ts as of ${first}) + dirty: dsh.ts modified (blob ${s.dshBlob}); bench/new.ts differs`)
  } finally { rmSync(dir, { recursive: true, force: true }) }
})

const section = (id: string, title: string, commit: string, measured: string): Section => ({
  id, title, status: 'ran', method: `method of ${id}`, tables: [`| t |\n|---|\n| ${measured} |`],
  targets: [{ name: `${id} target`, target: '≤ 1', measured, met: true }], at: { commit, label: commit, date: '2026-12-01' },
})

test('an --update splice stamps its sections and target rows with their commit and leaves the others as run', () => {
  const full = render([section('pruner', 'Pruner', 'aaaaaaa', 'old-p'), section('scale', 'Long sessions at scale', 'aaaaaaa', 'old-s')], [['commit measured', 'aaaaaaa']])
  assert.match(full, /## 1\. Pruner\n\nRan at `aaaaaaa` on 2026-12-01\./)
  assert.match(full, /\| 1\. Pruner \| pruner target: ≤ 1 \| old-p \| ✅ met \| aaaaaaa \|/)

  const once = splice(full, [section('scale', 'Long sessions at scale', 'bbbbbbb', 'new-s')])
  assert.match(once, /## 7\. Long sessions at scale\n\nRan at `bbbbbbb` on 2026-12-01\./)
  assert.match(once, /\| 7\. Long sessions at scale \| scale target: ≤ 1 \| new-s \| ✅ met \| bbbbbbb \|/)
  assert.doesNotMatch(once, /old-s/)
  assert.match(once, /## 1\. Pruner\n\nRan at `aaaaaaa`/) // untouched
  assert.match(once, /\| commit measured \| aaaaaaa \|\n\| sections measured later \(`--update`\) \| 7\. Long sessions at scale at `bbbbbbb` on 2026-12-01 \|/)

  const twice = splice(splice(once, [section('pruner', 'Pruner', 'ccccccc', 'new-p')]), [section('scale', 'Long sessions at scale', 'ddddddd', 'newer-s')])
  const row = twice.split('\n').find((l) => l.startsWith('| sections measured later'))!
  assert.equal(row, '| sections measured later (`--update`) | 1. Pruner at `ccccccc` on 2026-12-01<br>7. Long sessions at scale at `ddddddd` on 2026-12-01 |')
  assert.equal(twice.split('\n').filter((l) => l.startsWith('## 7.')).length, 1)
  // docs/bench.md's headline after an --update quotes the spliced targets table: each row with the commit it measured
  const targets = targetsOf(twice).split('\n')
  assert.equal(targets[0], '| benchmark | target | measured | status | at |')
  assert.ok(targets.some((l) => l.startsWith('| 7. Long sessions at scale |') && l.endsWith('| ddddddd |')), targets.join('\n'))
  assert.ok(targets.some((l) => l.startsWith('| 1. Pruner |') && l.endsWith('| ccccccc |')))
  assert.ok(targets.every((l) => l.startsWith('|')))
})

test('an --update splice keeps the other entries of a later-measurements row whose entries a merge joined with "; "', () => {
  const full = render([section('pruner', 'Pruner', 'aaaaaaa', 'old-p')], [['commit measured', 'aaaaaaa'],
    ['sections measured later (`--update`)', '8. Cost at `b` on 2026-12-01; 10. Replay at `c` on 2026-12-01<br>4. Bundle at `d` on 2026-12-01']])
  const row = splice(full, [section('cost', 'Cost', 'eeeeeee', 'new-c')]).split('\n').find((l) => l.startsWith('| sections measured later'))!
  assert.equal(row, '| sections measured later (`--update`) | 10. Replay at `c` on 2026-12-01<br>4. Bundle at `d` on 2026-12-01'
    + '<br>8. Cost at `eeeeeee` on 2026-12-01 |')
})

test('topFrames: self time from the gaps between samples, total time over the stack, counted once per frame', () => {
  const cf = (functionName: string, lineNumber = 0) => ({ functionName, url: '', lineNumber, columnNumber: 0 })
  // root → a → b; root → (idle). a recursion (a → a) must count a's total once per sample.
  const profile: CpuProfile = {
    nodes: [
      { id: 1, callFrame: cf('(root)'), children: [2, 4] },
      { id: 2, callFrame: cf('a'), children: [3, 5] },
      { id: 3, callFrame: cf('b') },
      { id: 4, callFrame: cf('(idle)') },
      { id: 5, callFrame: cf('a'), children: [] },
    ],
    startTime: 0, endTime: 10_000,
    samples: [3, 3, 2, 4, 5], timeDeltas: [0, 1000, 1000, 1000, 3000], // stamps 0, 1000, 2000, 3000, 6000; end 10000
  }
  const f = Object.fromEntries(topFrames(profile).map((x) => [x.name, x]))
  assert.equal(f.b.selfMs, 2); assert.equal(f.b.totalMs, 2)
  assert.equal(f['(idle)'].selfMs, 3)
  assert.equal(f.a.selfMs, 1 + 4) // sample at node 2 (1 ms) and at node 5 (4 ms, to the end)
  assert.equal(f.a.totalMs, 2 + 1 + 4)
  assert.equal(f['(idle)'].share, 0.3)
  assert.deepEqual(topFrames(profile).map((x) => x.name), ['a', '(idle)', 'b'])
})

test('topFrames: anonymous functions are told apart by where they are (one frame each), V8\'s own entries are not', () => {
  const cf = (functionName: string, lineNumber: number, url = 'file:///nowhere/bundle.mjs') => ({ functionName, url, lineNumber, columnNumber: 0 })
  const profile: CpuProfile = {
    nodes: [
      { id: 1, callFrame: cf('(root)', 0, ''), children: [2, 3, 4] },
      { id: 2, callFrame: cf('', 10) },
      { id: 3, callFrame: cf('', 20) },
      { id: 4, callFrame: cf('(garbage collector)', 0, '') },
    ],
    startTime: 0, endTime: 6_000,
    samples: [2, 3, 3, 4], timeDeltas: [0, 1000, 1000, 1000], // 2: 1 ms, 3: 2 ms, 4: 3 ms (to the end)
  }
  const frames = topFrames(profile).map((x) => [x.name, x.where, x.selfMs])
  assert.deepEqual(frames, [['(garbage collector)', '', 3], ['(anonymous)', 'bundle.mjs:21', 2], ['(anonymous)', 'bundle.mjs:11', 1]])
})
