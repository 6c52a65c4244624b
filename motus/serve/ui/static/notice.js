// The one notice line above the conversation.

import { $ } from "./dom.js";

let noticeKind = null;

export function showNotice(text, kind = "info") {
  noticeKind = kind;
  $("notice-text").textContent = text;
  $("notice").hidden = false;
  $("notice").dataset.kind = kind;
}

export function clearNotice(kind) {
  if (kind && noticeKind !== kind) return;
  noticeKind = null;
  $("notice").hidden = true;
  $("notice-text").textContent = "";
}
