// A simple content classifier for the estimate-accuracy benchmark: which kind of text a message
// mostly is. The first rule that matches wins:
//
// 1. cjk     ≥ 30% of the non-whitespace code points are CJK (Han, kana, Hangul, CJK punctuation,
//            full-width forms).
// 2. base64  runs of ≥ 64 characters from [A-Za-z0-9+/=_-] (no whitespace) cover ≥ 50% of the
//            non-whitespace characters: base64 / base64url payloads, long hashes, encoded blobs.
// 3. json    the parts that parse as JSON objects or arrays (a tool call's arguments, or a text part
//            that is a whole JSON document) hold ≥ 50% of the characters.
// 4. code    lines that look like code hold ≥ 40% of the characters of the non-empty lines (the parts
//            are joined with newlines for this): indented by 2+ spaces or a tab (but not a markdown
//            list item); a diff line (`+++ `, `--- `, `@@ `, `diff `, `index <hex>`, or `+`/`-`
//            not followed by a single space); a numbered listing line (`  12→`,
//            `12:`); or a line ending in one of `{ } ; ( ) [ ] ,` or `:` after an identifier; or a
//            line starting with a keyword (def, class, import, from, return, if, for, while, const,
//            let, var, function, export, #include, $ ) or containing `==`, `=>`, `->`, `::`, `()`.
// 5. prose   everything else.
//
// It is deliberately simple and documented here rather than clever: every row of the table says
// how many messages it put in each class, and bench/RESULTS.md shows examples of the rule's edges.

export type TextClass = 'prose' | 'code' | 'json' | 'cjk' | 'base64'
export const TEXT_CLASSES: readonly TextClass[] = ['prose', 'code', 'json', 'cjk', 'base64']

const CJK = /[\u3000-\u303f\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff\uff00-\uffef]/g
const B64_RUN = /[A-Za-z0-9+/=_-]{64,}/g
const CODE_LINE = new RegExp([
  String.raw`^(\t| {2,})(?![-*] |\d+\. )\S`,
  String.raw`^(\+\+\+ |--- |@@ |diff |index [0-9a-f])|^[+-](?! )|^[+-] {2,}`,
  String.raw`^\s*\d+(→|:)`,
  String.raw`[{};()\[\],]\s*$`,
  String.raw`[A-Za-z_]\w*:\s*$`,
  String.raw`^\s*(def|class|import|from|return|if|for|while|const|let|var|function|export|#include|\$)\b`,
  String.raw`==|=>|->|::|\(\)`,
].join('|'))

function isJsonDocument(s: string): boolean {
  const t = s.trim()
  if (!(t.startsWith('{') || t.startsWith('['))) return false
  try { JSON.parse(t); return true } catch { return false }
}

/**
 * Classifies a message's text. `parts` are its text-bearing fields (text, reasoning, tool-call
 * name and arguments, tool-result text), in order; the rules above see them joined, except the JSON
 * rule, which asks of each part whether it is a JSON document.
 */
export function classify(parts: readonly string[]): TextClass {
  const text = parts.join('\n')
  const nonWs = text.replace(/\s+/g, '')
  if (nonWs.length === 0) return 'prose'
  const cjk = nonWs.match(CJK)?.length ?? 0
  if (cjk / [...nonWs].length >= 0.3) return 'cjk'
  let b64 = 0
  for (const m of text.matchAll(B64_RUN)) b64 += m[0].length
  if (b64 / nonWs.length >= 0.5) return 'base64'
  let json = 0
  for (const p of parts) if (isJsonDocument(p)) json += p.length
  if (json / text.length >= 0.5) return 'json'
  let lineChars = 0, codeChars = 0
  for (const l of text.split('\n')) {
    if (l.trim() === '') continue
    lineChars += l.length
    if (CODE_LINE.test(l)) codeChars += l.length
  }
  if (lineChars > 0 && codeChars / lineChars >= 0.4) return 'code'
  return 'prose'
}
