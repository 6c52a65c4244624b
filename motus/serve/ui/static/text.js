// Characters that can hide or reorder text, shown visibly (see app.js for the guarantee).

import { el, pretty } from "./dom.js";

/** Characters that can overprint, hide or reorder what a card shows: C0 and C1 controls
 *  and DEL, the bidi marks, embeddings, overrides and isolates, and the line and
 *  paragraph separators. */
const HIDDEN = /[\u0000-\u001f\u007f-\u009f\u00ad\u061c\u180e\u200b\u200c\u200e\u200f\u2028-\u202e\u2060-\u206f\ufeff\ufff9-\ufffb]|\udb40[\udc00-\udc7f]/g;
const HIDDEN_NAMES = {
  0x061c: "ARABIC LETTER MARK",
  0x200e: "LEFT-TO-RIGHT MARK",
  0x200f: "RIGHT-TO-LEFT MARK",
  0x2028: "LINE SEPARATOR",
  0x2029: "PARAGRAPH SEPARATOR",
  0x202a: "LEFT-TO-RIGHT EMBEDDING",
  0x202b: "RIGHT-TO-LEFT EMBEDDING",
  0x202c: "POP DIRECTIONAL FORMATTING",
  0x202d: "LEFT-TO-RIGHT OVERRIDE",
  0x202e: "RIGHT-TO-LEFT OVERRIDE",
  0x2066: "LEFT-TO-RIGHT ISOLATE",
  0x2067: "RIGHT-TO-LEFT ISOLATE",
  0x2068: "FIRST STRONG ISOLATE",
  0x2069: "POP DIRECTIONAL ISOLATE",
};
const JSON_SHORT_ESCAPES = { b: 0x08, f: 0x0c, n: 0x0a, r: 0x0d, t: 0x09 };
const hex4 = (code) => code.toString(16).padStart(4, "0");

/** A highlighted stand-in for one hidden character; its title names the character. */
function hiddenMark(code, shown) {
  const name = HIDDEN_NAMES[code] || (code >= 0xe0000 ? "tag character" : code >= 0xd800 && code <= 0xdfff ? "lone surrogate" : "invisible or control character");
  return el("span", { class: "ctl", title: `U+${hex4(code).toUpperCase()} ${name}` }, shown);
}

/** Plain text as nodes, each hidden character shown as a marked "⟨U+XXXX⟩".
 *  With ``multiline``, line feeds and tabs stay as they are. */
export function visibleText(value, { multiline = false } = {}) {
  const text = String(value);
  const nodes = [];
  let last = 0;
  for (const match of text.matchAll(HIDDEN)) {
    if (multiline && (match[0] === "\n" || match[0] === "\t")) continue;
    if (match.index > last) nodes.push(text.slice(last, match.index));
    const code = match[0].codePointAt(0);
    nodes.push(hiddenMark(code, `⟨U+${hex4(code).toUpperCase()}⟩`));
    last = match.index + match[0].length;
  }
  if (last < text.length) nodes.push(text.slice(last));
  return nodes;
}

/** ``value`` as pretty JSON in which every hidden character is a "\uXXXX" escape:
 *  still valid JSON, and it parses back to exactly ``value``. */
export function visibleJson(value) {
  return pretty(value).replace(HIDDEN, (ch) =>
    ch === "\n" ? ch : Array.from({ length: ch.length }, (_, i) => `\\u${hex4(ch.charCodeAt(i))}`).join(""));
}

/** JSON text (from visibleJson) as nodes, with each escape of a control or hidden
 *  character ("\r", "\u001b", "\u202e") marked; "\\", "\"" and "\/" stay plain. */
export function markedJson(text) {
  const nodes = [];
  let last = 0;
  for (const match of text.matchAll(/\\(?:u([0-9a-fA-F]{4})|([bfnrt])|["\\/])/g)) {
    if (!match[1] && !match[2]) continue;
    if (match.index > last) nodes.push(text.slice(last, match.index));
    nodes.push(hiddenMark(match[1] ? parseInt(match[1], 16) : JSON_SHORT_ESCAPES[match[2]], match[0]));
    last = match.index + match[0].length;
  }
  if (last < text.length) nodes.push(text.slice(last));
  return nodes;
}

/** A string that may hold JSON (tool arguments, tool results): pretty, marked JSON if
 *  it parses, else the text with its hidden characters marked. */
export function visibleJsonString(text) {
  if (typeof text !== "string") return markedJson(visibleJson(text));
  try {
    return markedJson(visibleJson(JSON.parse(text)));
  } catch {
    return visibleText(text, { multiline: true });
  }
}
