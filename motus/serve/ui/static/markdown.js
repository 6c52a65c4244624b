// A small Markdown renderer that builds DOM nodes itself: the agent's text is never parsed
// as HTML. Paragraphs, line breaks, headings (shown as strong lines), emphasis, strong,
// code spans, fenced code blocks, bulleted and numbered lists, block quotes, links and
// tables (a header row, a delimiter row such as |---|:--:|, then body rows).
// A link is a link only when its address is http(s); any other address stays text.

import { el } from "./dom.js";

const FENCE = /^\s{0,3}(```|~~~)\s*([\w+-]*)\s*$/;
const BULLET = /^\s{0,3}[-*+]\s+(.*)$/;
const NUMBERED = /^\s{0,3}(\d{1,9})[.)]\s+(.*)$/;
const HEADING = /^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$/;
const QUOTE = /^\s{0,3}>\s?(.*)$/;
const TABLE_DELIMITER = /^\s{0,3}\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?\s*$/;

/** Markdown text as a DocumentFragment of safe nodes. */
export function renderMarkdown(text) {
  const fragment = document.createDocumentFragment();
  for (const node of blocks(String(text).replace(/\r\n?/g, "\n").split("\n"))) fragment.append(node);
  return fragment;
}

function blocks(lines) {
  const out = [];
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    if (!line.trim()) { i += 1; continue; }
    const fence = FENCE.exec(line);
    if (fence) {
      const body = [];
      i += 1;
      while (i < lines.length && !new RegExp(`^\\s{0,3}${fence[1]}\\s*$`).test(lines[i])) body.push(lines[i++]);
      i += 1; // the closing fence (or the end)
      const code = el("code", {}, body.join("\n"));
      if (fence[2]) code.dataset.lang = fence[2];
      out.push(el("pre", { class: "md-code" }, code));
      continue;
    }
    const heading = HEADING.exec(line);
    if (heading) {
      out.push(el("p", { class: `md-heading md-h${heading[1].length}` }, el("strong", {}, inline(heading[2]))));
      i += 1;
      continue;
    }
    if (line.includes("|") && i + 1 < lines.length && TABLE_DELIMITER.test(lines[i + 1]) && lines[i + 1].includes("-")) {
      const header = cells(line);
      const aligns = cells(lines[i + 1]).map((cell) => (cell.startsWith(":") && cell.endsWith(":") ? "center" : cell.endsWith(":") ? "right" : cell.startsWith(":") ? "left" : ""));
      if (aligns.length === header.length) {
        i += 2;
        const rows = [];
        while (i < lines.length && lines[i].trim() && lines[i].includes("|")) rows.push(cells(lines[i++]));
        const cell = (tag, text, n) => {
          const node = el(tag, {}, inline(text));
          if (aligns[n]) node.style.textAlign = aligns[n];
          return node;
        };
        out.push(el("div", { class: "md-table" }, el("table", {},
          el("thead", {}, el("tr", {}, header.map((text, n) => cell("th", text, n)))),
          el("tbody", {}, rows.map((row) => el("tr", {}, header.map((_, n) => cell("td", row[n] ?? "", n))))),
        )));
        continue;
      }
    }
    if (QUOTE.test(line)) {
      const body = [];
      while (i < lines.length && QUOTE.test(lines[i])) body.push(QUOTE.exec(lines[i++])[1]);
      out.push(el("blockquote", {}, blocks(body)));
      continue;
    }
    if (BULLET.test(line) || NUMBERED.test(line)) {
      const numbered = !BULLET.test(line);
      const pattern = numbered ? NUMBERED : BULLET;
      const list = numbered ? el("ol", {}) : el("ul", {});
      if (numbered && NUMBERED.exec(line)[1] !== "1") list.setAttribute("start", String(Number(NUMBERED.exec(line)[1])));
      let item = null;
      while (i < lines.length) {
        const current = lines[i];
        const match = pattern.exec(current);
        if (match) {
          item = [numbered ? match[2] : match[1]];
          list.append(el("li", {}));
          list.lastChild.itemLines = item;
          i += 1;
        } else if (item && current.trim() && /^\s+/.test(current) && !FENCE.test(current)) {
          item.push(current.trim()); // a continuation line of the item
          i += 1;
        } else break;
      }
      for (const li of list.children) {
        li.append(...inlineLines(li.itemLines));
        delete li.itemLines;
      }
      out.push(list);
      continue;
    }
    const para = [];
    while (i < lines.length && lines[i].trim() && !FENCE.test(lines[i]) && !HEADING.test(lines[i]) && !QUOTE.test(lines[i]) &&
      !(para.length && (BULLET.test(lines[i]) || NUMBERED.test(lines[i])))) {
      para.push(lines[i++]);
    }
    if (!para.length) para.push(lines[i++]); // a lone line no rule took
    out.push(el("p", {}, inlineLines(para)));
  }
  return out;
}

/** The cells of a table row: split on "|" (not "\\|"), the outer pipes dropped, trimmed. */
function cells(line) {
  let row = line.trim();
  if (row.startsWith("|")) row = row.slice(1);
  if (row.endsWith("|") && !row.endsWith("\\|")) row = row.slice(0, -1);
  return row.split(/(?<!\\)\|/).map((cell) => cell.trim().replace(/\\\|/g, "|"));
}

/** Lines of one block: inline Markdown, joined by line breaks. */
function inlineLines(lines) {
  const nodes = [];
  lines.forEach((line, index) => {
    if (index) nodes.push(el("br"));
    nodes.push(...inline(line.replace(/\s+$/, "")));
  });
  return nodes;
}

/** Only absolute http(s) addresses become links. */
export function safeHref(raw) {
  const text = String(raw).trim();
  if (!/^https?:\/\//i.test(text)) return null;
  try {
    const url = new URL(text);
    return url.protocol === "http:" || url.protocol === "https:" ? url.href : null;
  } catch {
    return null;
  }
}

/** Inline Markdown of one line as nodes (text nodes and elements, never HTML). */
export function inline(text) {
  const nodes = [];
  let plain = "";
  const flush = () => {
    if (plain) nodes.push(document.createTextNode(plain));
    plain = "";
  };
  let i = 0;
  while (i < text.length) {
    const ch = text[i];
    if (ch === "\\" && i + 1 < text.length && /[\\`*_[\]()#>+\-.!~]/.test(text[i + 1])) {
      plain += text[i + 1];
      i += 2;
      continue;
    }
    if (ch === "`") {
      const ticks = /^`+/.exec(text.slice(i))[0];
      const close = text.indexOf(ticks, i + ticks.length);
      if (close > 0) {
        flush();
        nodes.push(el("code", {}, text.slice(i + ticks.length, close).replace(/^ (.*) $/, "$1")));
        i = close + ticks.length;
        continue;
      }
      plain += ticks;
      i += ticks.length;
      continue;
    }
    if (ch === "[") {
      const link = /^\[([^\]]*)\]\(\s*<?([^()\s>]*)>?(?:\s+"[^"]*")?\s*\)/.exec(text.slice(i));
      if (link) {
        const href = safeHref(link[2]);
        flush();
        if (href) nodes.push(el("a", { href, rel: "noopener noreferrer nofollow", target: "_blank" }, inline(link[1])));
        else nodes.push(...inline(link[1]), document.createTextNode(` (${link[2]})`));
        i += link[0].length;
        continue;
      }
    }
    if (ch === "h" && /^https?:\/\//i.test(text.slice(i)) && (i === 0 || /[\s(]/.test(text[i - 1]))) {
      const bare = /^https?:\/\/[^\s<>"')\]]+/i.exec(text.slice(i))[0].replace(/[.,;:!?]+$/, "");
      const href = safeHref(bare);
      if (href) {
        flush();
        nodes.push(el("a", { href, rel: "noopener noreferrer nofollow", target: "_blank" }, bare));
        i += bare.length;
        continue;
      }
    }
    if (ch === "*" || ch === "_") {
      const double = text[i + 1] === ch;
      const marker = double ? ch + ch : ch;
      const start = i + marker.length;
      // Opens only before a non-space; "_" only at a word's start (snake_case stays text).
      const opens = start < text.length && !/\s/.test(text[start]) && (ch === "*" || i === 0 || !/\w/.test(text[i - 1]));
      if (opens) {
        let close = start;
        for (;;) {
          close = text.indexOf(marker, close + 1);
          if (close < 0) break;
          const closes = !/\s/.test(text[close - 1]) && (ch === "*" || close + marker.length >= text.length || !/\w/.test(text[close + marker.length]));
          if (closes && (double || text[close + 1] !== ch)) break;
        }
        if (close > start) {
          flush();
          nodes.push(el(double ? "strong" : "em", {}, inline(text.slice(start, close))));
          i = close + marker.length;
          continue;
        }
      }
      plain += marker;
      i += marker.length;
      continue;
    }
    plain += ch;
    i += 1;
  }
  flush();
  return nodes;
}
