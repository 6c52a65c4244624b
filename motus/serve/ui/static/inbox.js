// The Inbox view (#/inbox): every pending interrupt of every session, live, answered in place.
//
// Live: the all-sessions event stream (GET /events) wakes a read of GET /interrupts at every
// change; without streams it long-polls GET /interrupts?wait=true while nothing waits, and
// re-reads every few seconds while something does (a long poll would return at once).

import { $, el, sleep, announce } from "./dom.js";
import { api, readJson, detailOf, retryAfterMs } from "./api.js";
import { buildCard, numberCards } from "./cards.js";
import { readStream } from "./sse.js";
import { server } from "./state.js";
import { timeElement } from "./time.js";

const LONG_POLL_SECONDS = 25;
const BUSY_REFRESH_MS = 3000;
const STREAM_REFRESH_MS = 60000;

const inbox = { open: false, generation: 0, controllers: new Set(), wake: null, dirty: false, streaming: false, items: new Map() };

export function openInbox() {
  if (inbox.open) return;
  inbox.open = true;
  inbox.generation += 1;
  $("main").dataset.view = "inbox";
  $("inbox-link").setAttribute("aria-current", "page");
  $("inbox-view").hidden = false;
  $("inbox-state").textContent = "Loading…";
  document.title = "motus chat: inbox";
  $("status").textContent = "Inbox";
  $("status").dataset.status = "none";
  const generation = inbox.generation;
  readLoop(generation);
  if (server.events !== false) streamLoop(generation);
  $("inbox-title").focus();
}

/** Leave the Inbox view; true if it was open. */
export function closeInbox() {
  if (!inbox.open) return false;
  inbox.open = false;
  inbox.generation += 1;
  for (const controller of inbox.controllers) controller.abort();
  inbox.controllers.clear();
  wake();
  inbox.streaming = false;
  inbox.items.clear();
  $("inbox-list").replaceChildren();
  $("inbox-view").hidden = true;
  delete $("main").dataset.view;
  $("inbox-link").removeAttribute("aria-current");
  return true;
}

function wake() {
  inbox.dirty = true;
  if (inbox.wake) {
    const fn = inbox.wake;
    inbox.wake = null;
    fn();
  }
}

function pause(ms) {
  if (inbox.dirty) return Promise.resolve();
  return new Promise((resolve) => {
    const timer = setTimeout(() => { inbox.wake = null; resolve(); }, ms);
    inbox.wake = () => { clearTimeout(timer); resolve(); };
  });
}

async function readLoop(generation) {
  const current = () => generation === inbox.generation;
  let first = true;
  let failures = 0;
  while (current()) {
    if (!first) {
      if (inbox.streaming) await pause(STREAM_REFRESH_MS);
      else if (inbox.items.size) await pause(BUSY_REFRESH_MS);
    }
    if (!current()) return;
    const longPoll = !first && !inbox.streaming && !inbox.items.size && !inbox.dirty;
    first = false;
    inbox.dirty = false;
    const controller = new AbortController();
    inbox.controllers.add(controller);
    let list = null;
    try {
      const query = longPoll ? `&wait=true&timeout=${LONG_POLL_SECONDS}` : "";
      const response = await api("GET", `interrupts?status=pending${query}`, { signal: controller.signal });
      if (response.status === 503 && longPoll) {
        // Every long-poll slot is taken: wait as told, then ask again (not lost contact).
        await readJson(response); // read to its end: the request is over
        $("inbox-state").textContent = "The server is busy; trying again shortly…";
        await sleep(retryAfterMs(response.headers, 1000));
        inbox.dirty = true;
        continue;
      }
      if (response.status === 404) {
        $("inbox-state").textContent = "This server has no inbox (it does not offer GET /interrupts). Open each session to answer it.";
        return;
      }
      if (!response.ok) throw new Error(`${response.status}: ${await detailOf(response)}`);
      list = await readJson(response);
    } catch (error) {
      if (!current()) return;
      if (controller.signal.aborted) continue;
      failures += 1;
      $("inbox-state").textContent = `Lost contact with the server (${error.message || error}). Retrying…`;
      await sleep(Math.min(30000, 1000 * 2 ** Math.min(failures, 5)));
      continue;
    } finally {
      inbox.controllers.delete(controller);
    }
    failures = 0;
    if (current() && Array.isArray(list)) render(list);
  }
}

async function streamLoop(generation) {
  const current = () => generation === inbox.generation;
  let failures = 0;
  while (current() && server.events !== false) {
    const controller = new AbortController();
    inbox.controllers.add(controller);
    let result = null;
    try {
      result = await readStream("events", {
        signal: controller.signal,
        onOpen: () => {
          inbox.streaming = true;
          server.events = true;
          server.eventsSeen = true;
          failures = 0;
          // A long poll in flight would hold the read loop: cut it short.
          for (const other of inbox.controllers) if (other !== controller) other.abort();
          wake();
        },
        onEvent: (event) => {
          if (current() && ["ready", "reset", "interrupt", "resolved", "status"].includes(event.kind)) wake();
        },
      });
    } catch {
      result = null;
    } finally {
      inbox.controllers.delete(controller);
      if (current()) inbox.streaming = false;
    }
    if (!current()) return;
    wake();
    if (result && result.status === 404) {
      server.events = false;
      return;
    }
    failures += 1;
    await sleep(result && result.status === 503 ? retryAfterMs(result.headers, 15000) : Math.min(30000, 500 * 2 ** Math.min(failures, 6)));
  }
}

function render(list) {
  const ul = $("inbox-list");
  const live = new Set();
  for (const item of list) {
    if (!item || typeof item.interrupt_id !== "string" || typeof item.session_id !== "string") continue;
    live.add(item.interrupt_id);
    if (inbox.items.has(item.interrupt_id)) continue;
    const card = buildCard(item, item.session_id, answered);
    const li = el(
      "li",
      { class: "inbox-item", "data-session-id": item.session_id },
      el(
        "p",
        { class: "inbox-meta" },
        "Session ",
        el("a", { href: `#/sessions/${encodeURIComponent(item.session_id)}`, title: item.session_id }, item.session_id.slice(0, 8)),
        item.created_at ? " · asked at " : null,
        item.created_at ? timeElement(item.created_at) : null,
      ),
      card,
    );
    inbox.items.set(item.interrupt_id, li);
    ul.append(li);
  }
  for (const [id, li] of [...inbox.items]) {
    if (!live.has(id) && !li.querySelector('.card[aria-busy="true"]')) {
      li.remove();
      inbox.items.delete(id);
    }
  }
  numberCards([...ul.querySelectorAll(".card")]);
  const count = inbox.items.size;
  $("inbox-state").textContent = count ? `${count} waiting for an answer.` : "Nothing waits for an answer.";
}

function answered(card, hadFocus) {
  const li = card.closest(".inbox-item");
  const id = card.dataset.interruptId;
  if (li) li.remove();
  inbox.items.delete(id);
  numberCards([...$("inbox-list").querySelectorAll(".card")]);
  $("inbox-state").textContent = inbox.items.size ? `${inbox.items.size} waiting for an answer.` : "Nothing waits for an answer.";
  if (hadFocus) {
    const next = $("inbox-list").querySelector(".card-title");
    if (next) next.focus();
    else $("inbox-title").focus();
  }
  announce("Answer sent.");
  wake();
}
