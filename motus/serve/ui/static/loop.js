// The open session: routing by the URL's hash, and its one request loop.

import { $, sleep } from "./dom.js";
import { api, readJson, detailOf, retryAfterMs, sessionPath } from "./api.js";
import { showNotice, clearNotice } from "./notice.js";
import { view, server, clearPending, loadTimes } from "./state.js";
import { renderStatus, renderMessages } from "./conversation.js";
import { renderInterrupts } from "./cards.js";
import { refreshSessionList, markCurrentInList } from "./sessions.js";
import { readStream } from "./sse.js";
import { openInbox, closeInbox } from "./inbox.js";
import { renderAudit } from "./audit.js";

const LONG_POLL_SECONDS = 25;
const IDLE_REFRESH_MS = 5000;
//: With a live event stream every change wakes the loop; this is only a safety net.
const STREAM_REFRESH_MS = 60000;
const MAX_BACKOFF_MS = 30000;
//: After a 503 (every stream slot taken), long-poll this long before trying a stream again.
const STREAM_BUSY_MS = 15000;

/** The session the URL names: an id, null for none, undefined for a hash that is not ours. */
function parseHash() {
  if (!location.hash || location.hash === "#") return null;
  if (location.hash === "#/inbox") return "inbox";
  const match = /^#\/sessions\/([^/?#]+)$/.exec(location.hash);
  if (!match) return undefined;
  try {
    return decodeURIComponent(match[1]);
  } catch {
    return null;
  }
}

/** Make ``sid`` (or no session) the open one, and name it in the URL. */
export function navigate(sid) {
  const target = sid ? `#/sessions/${encodeURIComponent(sid)}` : location.pathname + location.search;
  if (sid ? location.hash !== target : location.hash) history.pushState(null, "", target);
  route();
}

/** Open the Inbox view. */
export function navigateInbox() {
  if (location.hash !== "#/inbox") history.pushState(null, "", "#/inbox");
  route();
}

export function route() {
  const sid = parseHash();
  if (sid === undefined) return;
  if (sid === "inbox") {
    if (view.sid) closeSession();
    openInbox();
    return;
  }
  const leftInbox = closeInbox();
  if (sid === view.sid && !(leftInbox && !sid)) return;
  if (sid) openSession(sid);
  else closeSession();
}

function stopLoop() {
  view.generation += 1;
  if (view.controller) view.controller.abort();
  view.controller = null;
  if (view.streamController) view.streamController.abort();
  view.streamController = null;
  view.streaming = false;
  view.lastEventId = null;
  if (view.wake) view.wake();
  view.wake = null;
  view.dirty = false;
}

function resetView(sid) {
  stopLoop();
  view.sid = sid;
  view.session = null;
  view.renderedKeys = [];
  view.answered = new Set();
  view.audit = null;
  view.auditDirty = true;
  view.times = sid ? loadTimes(sid) : {};
  view.timesFrom = null;
  view.renderedMessages = [];
  view.turnStartedAt = null;
  view.turnEndedAt = null;
  $("audit-view").hidden = true;
  $("show-audit").setAttribute("aria-expanded", "false");
  $("show-audit").hidden = !sid;
  for (const card of view.cards.values()) card.remove();
  view.cards.clear();
  $("messages").replaceChildren();
  $("turn-error").hidden = true;
  $("running").hidden = true;
  $("interrupts").hidden = true;
  $("empty").hidden = Boolean(sid);
  $("delete-session").hidden = !sid;
  $("conversation-title").textContent = sid ? `Session ${sid.slice(0, 8)}` : "New conversation";
  $("conversation-title").title = sid || "";
  document.title = sid ? `motus chat: ${sid.slice(0, 8)}` : "motus chat";
  renderStatus();
  markCurrentInList();
}

function openSession(sid) {
  resetView(sid);
  $("status").textContent = "Loading session…";
  const generation = view.generation;
  runLoop(generation, sid);
  if (server.events !== false) streamLoop(generation, sid);
}

function closeSession() {
  resetView(null);
}

/** Wake the loop now: after this tab acted, or when the tab becomes visible. */
export function wakeLoop() {
  view.dirty = true;
  if (view.wake) {
    const wake = view.wake;
    view.wake = null;
    wake();
  }
}

/** Between refreshes of a session that is not running: a few seconds, or until woken. */
function idleWait(ms = IDLE_REFRESH_MS) {
  if (view.dirty) return Promise.resolve();
  return new Promise((resolve) => {
    let timer = null;
    const done = () => {
      if (timer !== null) clearTimeout(timer);
      resolve();
    };
    // A hidden tab does not refresh at all; becoming visible wakes it.
    if (!document.hidden) timer = setTimeout(done, ms);
    view.wake = done;
  });
}

/** The one request loop of the open session; ends when ``generation`` is superseded. */
async function runLoop(generation, sid) {
  let first = true;
  let failures = 0;
  let again = false; // the last reads disagreed: read again at once, without a long poll
  const current = () => generation === view.generation;
  while (current()) {
    const readNow = again;
    again = false;
    if (!first && !readNow) {
      if (view.streaming) await idleWait(STREAM_REFRESH_MS);
      else if (view.session && view.session.status !== "running") await idleWait();
    }
    first = false;
    if (!current()) return;
    view.dirty = false;
    const epoch = view.epoch;
    const running = Boolean(view.session && view.session.status === "running");
    const controller = new AbortController();
    view.controller = controller;
    let session = null;
    let messages = null;
    let gone = false;
    try {
      // Long-poll only without a live stream: with one, events wake this loop.
      view.longPolling = running && !view.streaming && !readNow;
      const query = view.longPolling ? `?wait=true&timeout=${LONG_POLL_SECONDS}` : "";
      const response = await api("GET", sessionPath(sid, query), { signal: controller.signal });
      if (response.status === 503 && view.longPolling) {
        // Every long-poll slot is taken: not lost contact. Wait as told, then ask again.
        await readJson(response); // read to its end: the request is over
        showNotice("The server is busy; trying again shortly…", "connection");
        await sleep(retryAfterMs(response.headers, 1000));
        view.dirty = true;
        continue;
      }
      if (response.status === 404) gone = true;
      else if (!response.ok) throw new Error(`${response.status}: ${await detailOf(response)}`);
      else session = await readJson(response);
      if (session && current()) {
        const listed = await api("GET", sessionPath(sid, "/messages") + "?senders=true", { signal: controller.signal });
        if (listed.status === 404) gone = true;
        else if (!listed.ok) throw new Error(`${listed.status}: ${await detailOf(listed)}`);
        else messages = await readJson(listed);
      }
      if (session && current() && view.auditDirty && server.audit !== false) {
        view.auditDirty = false;
        const audited = await api("GET", sessionPath(sid, "/audit"), { signal: controller.signal });
        if (audited.status === 404) server.audit = false; // the session exists: no audit here
        else if (audited.ok) {
          const records = await readJson(audited);
          if (Array.isArray(records)) {
            view.audit = records;
            server.audit = true;
          }
        } else view.auditDirty = true;
      }
    } catch (error) {
      if (!current()) return;
      if (controller.signal.aborted) continue; // a long poll cut short: a stream took over
      view.auditDirty = true;
      failures += 1;
      showNotice(`Lost contact with the server (${error.message || error}). Retrying…`, "connection");
      await sleep(Math.min(MAX_BACKOFF_MS, 1000 * 2 ** Math.min(failures, 5)));
      continue;
    } finally {
      if (view.controller === controller) view.controller = null;
      view.longPolling = false;
    }
    if (!current()) return;
    failures = 0;
    clearNotice("connection");
    if (gone) {
      sessionGone(sid);
      return;
    }
    // Read before this tab's latest action: drop it, the loop reads again at once.
    if (epoch !== view.epoch) continue;
    if (turnEndedBetween(session, messages)) {
      again = true;
      continue;
    }
    applySession(session, Array.isArray(messages) ? messages : []);
  }
}

/** Whether the session was read with a live turn whose end the messages, read just after,
 *  already hold: the history is longer than where that turn's messages start
 *  (``turn.history_at``). Shown together, the turn's steps and its stored reply made the reply
 *  appear twice. */
function turnEndedBetween(session, messages) {
  const turn = session && session.turn;
  return Boolean(
    turn && typeof turn === "object" && Number.isInteger(turn.history_at) && Array.isArray(messages) && messages.length > turn.history_at,
  );
}

function sessionGone(sid) {
  // A 404 on the events route may have been this session's, not a missing route.
  if (server.events === false && !server.eventsSeen) server.events = null;
  showNotice(`Session ${sid.slice(0, 8)} no longer exists on the server (deleted, expired, or the server restarted).`);
  clearPending(sid);
  navigate(null);
  refreshSessionList();
}

function interruptIds(session) {
  return JSON.stringify(((session && session.interrupts) || []).map((i) => i && i.interrupt_id));
}

function applySession(session, messages) {
  if (!session || typeof session !== "object") return;
  const previous = view.session ? view.session.status : null;
  // Without events, a change of status or of the pending interrupts may mean a decision.
  if (!view.streaming && (previous !== session.status || interruptIds(view.session) !== interruptIds(session))) view.auditDirty = true;
  if (view.auditDirty && !view.streaming && view.audit !== null) wakeLoop();
  view.session = session;
  if (session.status === "idle") clearPending(view.sid);
  renderMessages(messages, session);
  renderStatus();
  renderInterrupts(session);
  renderAudit();
  if (previous !== session.status) refreshSessionList();
}

// ---------------------------------------------------------------- the event stream

/** The open session's event stream: every change wakes the request loop at once (and a new
 *  interrupt shows before that read returns). Falls back to the loop's long polls while the
 *  stream is down, for good when the server has no event streams (404), for a while when
 *  every stream slot is taken (503). Reconnects with Last-Event-ID, so nothing is missed. */
async function streamLoop(generation, sid) {
  const current = () => generation === view.generation;
  let failures = 0;
  while (current() && server.events !== false) {
    const controller = new AbortController();
    view.streamController = controller;
    let result = null;
    try {
      result = await readStream(sessionPath(sid, "/events"), {
        lastId: view.lastEventId,
        signal: controller.signal,
        onOpen: () => {
          if (!current()) return;
          view.streaming = true;
          server.events = true;
          server.eventsSeen = true;
          failures = 0;
          // A long poll in flight would hold the loop: cut it short, then read at once.
          if (view.longPolling && view.controller) view.controller.abort();
          wakeLoop();
        },
        onEvent: (event) => current() && onEvent(sid, event),
      });
    } catch {
      result = null;
    } finally {
      if (view.streamController === controller) view.streamController = null;
      if (current()) view.streaming = false;
    }
    if (!current()) return;
    wakeLoop(); // read now: the loop long-polls until the stream is back
    if (result && result.status === 404) {
      // No event streams on this server (or no such session: the loop's read will tell).
      if (!server.eventsSeen) server.events = false;
      return;
    }
    if (result && result.status === 503) {
      await sleep(retryAfterMs(result.headers, STREAM_BUSY_MS));
      continue;
    }
    if (result && result.status === 200) failures = 0;
    failures += 1;
    await sleep(Math.min(MAX_BACKOFF_MS, 500 * 2 ** Math.min(failures, 6)));
  }
}

function onEvent(sid, event) {
  if (event.id !== null && event.id !== undefined) view.lastEventId = event.id;
  const data = event.data || {};
  if (event.kind === "ready" || event.kind === "reset") {
    if (event.kind === "reset") view.auditDirty = true;
    wakeLoop();
    return;
  }
  if (data.session_id !== sid) return;
  switch (event.kind) {
    case "status":
      if (data.status === "running" && data.turn_id !== undefined) { // a new turn (not a resume)
        view.turnStartedAt = data.at || null;
        view.turnEndedAt = null;
      } else if (data.status === "idle" || data.status === "error") view.turnEndedAt = data.at || view.turnEndedAt;
      if (data.status === "deleted") {
        view.generation += 1; // this loop is over
        sessionGone(sid);
        return;
      }
      break;
    case "interrupt":
      showInterruptNow(data);
      break;
    case "resolved":
    case "approval":
    case "grant":
    case "revoke":
      view.auditDirty = true;
      break;
    case "message":
    case "error":
      view.turnEndedAt = data.at || view.turnEndedAt;
      break;
    default:
      break;
  }
  wakeLoop();
}

/** Show a new interrupt's card from its event, before the loop's read returns. */
function showInterruptNow(data) {
  if (!view.session || typeof data.interrupt_id !== "string") return;
  const list = Array.isArray(view.session.interrupts) ? view.session.interrupts : [];
  if (list.some((item) => item && item.interrupt_id === data.interrupt_id)) return;
  const { interrupt_id, type, payload, created_at, expires_at } = data;
  view.session = { ...view.session, status: "interrupted", interrupts: [...list, { interrupt_id, type, payload, created_at, expires_at }] };
  view.epoch += 1; // a read that started before this event would hide the card again
  renderStatus();
  renderInterrupts(view.session);
}
