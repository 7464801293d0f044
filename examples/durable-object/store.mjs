// A dsh LogStore over the Durable Object storage API (Cloudflare Workers): a session's log lives in
// the Durable Object that owns the session, so any Worker anywhere can continue it.
//
//   import { DurableObjectLogStore } from './store.mjs'
//   const session = await Session.open(new DurableObjectLogStore(this.ctx.storage), { id })
//
// Layout (keys sort in seq order because the seq is zero-padded):
//   event:<seq, 12 digits>   one SessionEvent as JSON text
//   artefact:<name>          a spilled tool result (docs/design.md §5)
//   part:<key>:<i>           slices of a value longer than PART_UNITS; <key> then holds { parts: n }
// Limits of the storage API this respects (developers.cloudflare.com/durable-objects/api/storage-api):
// a value is at most 128 KiB on the key-value backend (2 MiB on SQLite), and one put()/get() takes
// at most 128 keys. Uses only the key-value methods, so it works on both backends.

/** UTF-16 units per stored string: at most 64 KiB serialised, under the 128 KiB value limit. */
const PART_UNITS = 32_768
/** Keys per put()/get() call (the storage API's limit). */
const KEYS_PER_CALL = 128
const EVENT = 'event:'
const ARTEFACT = 'artefact:'
const REF = 'durable-object:'

const eventKey = (seq) => EVENT + String(seq).padStart(12, '0')
const partKey = (key, i) => `part:${key}:${i}`

/** @implements {import('./dsh.mjs').LogStore} */
export class DurableObjectLogStore {
  /** @param {DurableObjectStorage} storage `this.ctx.storage` of the Durable Object. */
  constructor(storage) {
    this.storage = storage
  }

  /** The whole log, in seq order. (For very long logs, page with list({ start, limit }).) */
  async load() {
    const heads = await this.storage.list({ prefix: EVENT })
    const events = []
    for (const [key, value] of heads) events.push(JSON.parse(await this.#join(key, value)))
    return { events }
  }

  /** Writes the events; one batch of put() calls with no await between them commits atomically. */
  async append(events) {
    const entries = {}
    for (const event of events) this.#split(eventKey(event.seq), JSON.stringify(event), entries)
    await this.#put(entries)
  }

  /** The durability point: resolves when the writes so far are stored. */
  async sync() {
    await this.storage.sync?.()
  }

  /** Stores `text` under `name`; returns the reference that getArtefact() takes. */
  async putArtefact(name, text) {
    const entries = {}
    this.#split(ARTEFACT + name, text, entries)
    await this.#put(entries)
    return REF + ARTEFACT + name
  }

  /** The text stored by putArtefact(); throws naming the reference when there is none. */
  async getArtefact(ref) {
    const key = ref.startsWith(REF) ? ref.slice(REF.length) : ARTEFACT + ref
    const value = await this.storage.get(key)
    if (value === undefined) throw new Error(`no artefact ${ref} in this Durable Object; references look like ${REF}${ARTEFACT}<name>`)
    return this.#join(key, value)
  }

  /** Adds `key → text` to `entries`, as slices when it is longer than PART_UNITS. */
  #split(key, text, entries) {
    if (text.length <= PART_UNITS) { entries[key] = text; return }
    let parts = 0
    for (let at = 0; at < text.length;) {
      // Never between the two halves of a surrogate pair (each half alone is not valid text).
      let end = Math.min(at + PART_UNITS, text.length)
      if (end < text.length && (text.charCodeAt(end - 1) & 0xfc00) === 0xd800) end--
      entries[partKey(key, parts++)] = text.slice(at, end)
      at = end
    }
    entries[key] = { parts }
  }

  /** The text stored under `key`, whose value is `value` (a string, or { parts } for a sliced one). */
  async #join(key, value) {
    if (typeof value === 'string') return value
    const keys = Array.from({ length: value.parts }, (_, i) => partKey(key, i))
    let text = ''
    for (let i = 0; i < keys.length; i += KEYS_PER_CALL) {
      const got = await this.storage.get(keys.slice(i, i + KEYS_PER_CALL))
      for (const k of keys.slice(i, i + KEYS_PER_CALL)) text += got.get(k)
    }
    return text
  }

  async #put(entries) {
    const keys = Object.keys(entries)
    const writes = []
    for (let i = 0; i < keys.length; i += KEYS_PER_CALL) {
      writes.push(this.storage.put(Object.fromEntries(keys.slice(i, i + KEYS_PER_CALL).map((k) => [k, entries[k]]))))
    }
    await Promise.all(writes)
  }
}
