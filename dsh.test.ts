import { test } from 'node:test'
import assert from 'node:assert/strict'
import { VERSION } from './dsh.ts'

test('version is semver', () => { assert.match(VERSION, /^\d+\.\d+\.\d+$/) })
