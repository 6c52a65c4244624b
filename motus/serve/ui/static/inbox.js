// The Inbox view (#/inbox): every pending interrupt of every session, live, answered in place.
//
// Live: the all-sessions event stream (GET /events) wakes a read of GET /interrupts at every
// change that may concern the inbox (``concernsInbox``); without streams it long-polls
// GET /interrupts?wait=true while nothing waits, and re-reads every few seconds while
// something does (a long poll would return at once).

import { $, el, sleep, announce } from "./dom.js";
import { api, readJson, detailOf, retryAfterMs } from "./api.js";
import { buildCard, numberCards, updateCard } from "./cards.js";
import { readStream } from "./sse.js";
import { server } from "./state.js";
import { timeElement } from "./time.js";
import { visibleText } from "./text.js";

const LONG_POLL_SECONDS = 25;
// The oldest this many are shown (and read): nobody answers thousands at once, and with
// thousands pending each read of them all is megabytes.
const SHOWN_AT_MOST = 200;
const BUSY_REFRESH_MS = 3000;
const STREAM_REFRESH_MS = 60000;

const inbox = { open: false, generation: 0, controllers: new Set(), wake: null, dirty: false, streaming: false, items: new Map(), groups: new Map(), total: null };

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
  inbox.groups.clear();
  inbox.total = null;
  $("inbox-list").replaceChildren();
  $("inbox-view").hidden = true;
  delete $("main").dataset.view;
  $("inbox-link").removeAttribute("aria-current");
  return true;
}

/** Read the inbox again now (what a card may offer changed: the key, say). */
export function refreshInbox() {
  wake();
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
      const response = await api("GET", `interrupts?status=pending&limit=${SHOWN_AT_MOST}${query}`, { signal: controller.signal });
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
      const total = Number.parseInt(response.headers.get("X-Total-Count") || "", 10);
      inbox.total = Number.isFinite(total) ? total : null; // a server without it lists them all
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
          if (current() && concernsInbox(event)) wake();
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

/** Whether an event of the all-sessions stream may change what the inbox shows, so that
 *  the view reads it again: an interrupt that came, went or gained an approval, what the
 *  agent said while its interrupts wait ("said"), a session that starts waiting, a turn
 *  that failed or a session deleted (its interrupts go without a "resolved"; shown or not,
 *  since the count says how many wait beyond those shown), and any change of a session the
 *  view shows. Other sessions' turns starting, resuming and ending ("running", "idle", after
 *  their "resolved") do not: with thousands pending, each read is the whole inbox. */
function concernsInbox(event) {
  switch (event.kind) {
    case "ready": case "reset": case "interrupt": case "resolved": case "approval": case "said":
      return true;
    case "status":
      return ["interrupted", "error", "deleted"].includes(event.data.status) || inbox.groups.has(event.data.session_id);
    case "title":
      return inbox.groups.has(event.data.session_id);
    default:
      return false;
  }
}

/** The group of session ``sid`` in the list: a heading that says what its turn is about
 *  (title, the message that started it, who sent it and when, what the agent said before
 *  asking), then its items, numbered within the session. Created on first use. */
function sessionGroup(sid, context) {
  let group = inbox.groups.get(sid);
  if (!group) {
    const head = el("div", { class: "inbox-session-head" });
    const items = el("ol", { class: "inbox-items" });
    group = { li: el("li", { class: "inbox-session", "data-session-id": sid }, head, items), head, items, shown: null };
    inbox.groups.set(sid, group);
    $("inbox-list").append(group.li);
  }
  const key = JSON.stringify(context || {});
  if (group.shown !== key) {
    group.shown = key;
    group.head.replaceChildren(...contextNodes(sid, context || {}));
  }
  return group;
}

function contextNodes(sid, context) {
  const title = typeof context.session_title === "string" && context.session_title ? context.session_title : null;
  const nodes = [
    el(
      "h3",
      { class: "inbox-session-title" },
      el("a", { href: `#/sessions/${encodeURIComponent(sid)}`, title: sid }, ...(title ? visibleText(title) : [`Session ${sid.slice(0, 8)}`])),
    ),
  ];
  if (typeof context.message === "string") {
    const who = typeof context.sent_by === "string" && context.sent_by !== "anonymous" ? context.sent_by : null;
    nodes.push(
      el(
        "p",
        { class: "inbox-message" },
        el("span", { class: "inbox-label" }, who ? `${who} asked` : "Asked"),
        context.sent_at ? " at " : null,
        context.sent_at ? timeElement(context.sent_at) : null,
        ": ",
        el("span", { class: "inbox-text" }, ...visibleText(context.message, { multiline: true })),
      ),
    );
  }
  if (typeof context.agent_text === "string" && context.agent_text) {
    nodes.push(
      el(
        "p",
        { class: "inbox-agent" },
        el("span", { class: "inbox-label" }, "The agent said: "),
        el("span", { class: "inbox-text" }, ...visibleText(context.agent_text, { multiline: true })),
      ),
    );
  }
  return nodes;
}

function render(list) {
  const live = new Set();
  for (const item of list) {
    if (!item || typeof item.interrupt_id !== "string" || typeof item.session_id !== "string") continue;
    live.add(item.interrupt_id);
    const group = sessionGroup(item.session_id, item.context);
    const sentBy = item.context && typeof item.context.sent_by === "string" ? item.context.sent_by : null;
    if (inbox.items.has(item.interrupt_id)) {
      updateCard(inbox.items.get(item.interrupt_id).querySelector(".card"), item, sentBy);
      continue;
    }
    const card = buildCard(item, item.session_id, answered);
    updateCard(card, item, sentBy);
    const li = el(
      "li",
      { class: "inbox-item", "data-session-id": item.session_id },
      item.created_at ? el("p", { class: "inbox-meta" }, "Waiting since ", timeElement(item.created_at)) : null,
      card,
    );
    inbox.items.set(item.interrupt_id, li);
    group.items.append(li);
  }
  for (const [id, li] of [...inbox.items]) {
    if (!live.has(id) && !li.querySelector('.card[aria-busy="true"]')) {
      li.remove();
      inbox.items.delete(id);
    }
  }
  settle();
}

/** Drop the groups left without items, number each group's cards, say how many wait. */
function settle() {
  for (const [sid, group] of [...inbox.groups]) {
    const cards = [...group.items.querySelectorAll(".card")];
    if (!cards.length) {
      group.li.remove();
      inbox.groups.delete(sid);
    } else numberCards(cards);
  }
  const count = inbox.items.size;
  const total = inbox.total !== null && inbox.total > count ? inbox.total : count;
  $("inbox-state").textContent = !count
    ? "Nothing waits for an answer."
    : total > count
      ? `${total} waiting for an answer; the oldest ${count} are shown.`
      : `${count} waiting for an answer.`;
}

function answered(card, hadFocus) {
  const li = card.closest(".inbox-item");
  const id = card.dataset.interruptId;
  if (li) li.remove();
  inbox.items.delete(id);
  if (inbox.total !== null) inbox.total -= 1;
  settle();
  if (hadFocus) {
    const next = $("inbox-list").querySelector(".card-title");
    if (next) next.focus();
    else $("inbox-title").focus();
  }
  announce("Answer sent.");
  wake();
}
