/*
 * motus web chat: a client of the session API (../sessions...), served from the same origin.
 *
 * Plain ES modules loaded by <script type="module" src="app.js"> (no build step); this one
 * wires the page up, the others hold one concern each:
 *   dom.js           find and build elements (text only), announce to screen readers
 *   text.js          hidden characters shown visibly (the second guarantee below)
 *   api.js           fetch() against the API; the API key form
 *   notice.js        the notice line
 *   state.js         the open session's state, shared by the modules below
 *   loop.js          routing by the URL's hash, and the open session's request loop
 *   conversation.js  the status, the messages, the turn's error
 *   cards.js         interrupt cards and resuming
 *   sessions.js      the session list; create, delete, send a message
 *   sse.js           server-sent events read with fetch() (so the API key can be sent)
 *   markdown.js      the agent's Markdown as DOM nodes (never HTML), http(s) links only
 *   time.js          times and countdowns
 *   inbox.js         the Inbox view: pending interrupts of every session, live
 *   audit.js         the open session's audit and remembered approvals
 *
 * Guarantees these modules keep:
 * - Text from the agent or an interrupt payload is only ever inserted as text
 *   (textContent / text nodes), never parsed as HTML.
 * - In interrupt cards and tool calls, characters that can hide or reorder text (C0 and
 *   C1 controls, DEL, bidi marks, embeddings, overrides and isolates, line separators)
 *   are never shown raw: JSON shows them as its own escapes ("\u202e", "\r"), plain
 *   text as "⟨U+202E⟩", each in a highlighted span.ctl that names the character.
 *   The values sent back are the agent's own, unchanged.
 * - One request loop per open session (this tab only opens one). Where the server has
 *   event streams (GET /sessions/{id}/events), every event wakes it and it reads once;
 *   otherwise (a 404: the reference server) a long poll (?wait=true) while the session
 *   is running, else a plain refresh every few seconds while the tab is visible, and at
 *   once after this tab acts. Switching
 *   sessions aborts the old loop's request before the new loop starts.
 * - A response that was requested before this tab's latest action is dropped, so a
 *   stale read never undoes what the action showed.
 * - An interrupt card is keyed by interrupt_id and kept while the interrupt is pending,
 *   so what the user typed into one card survives refreshes and answers to other cards.
 * - On a 401 the page asks for an API key once (a form, not prompt()), keeps it in
 *   sessionStorage for this tab, and retries with "Authorization: Bearer <key>".
 */

import { $ } from "./dom.js";
import { clearNotice } from "./notice.js";
import { view, server } from "./state.js";
import { api, readJson } from "./api.js";
import { navigate, route, wakeLoop } from "./loop.js";
import { renderStatus } from "./conversation.js";
import { refreshSessionList, createSession, deleteSession, sendMessage, wireDeleteDialog } from "./sessions.js";
import { toggleAudit } from "./audit.js";
import { refreshInbox } from "./inbox.js";

// ---------------------------------------------------------------- wiring

/** Who this tab's key is (GET /whoami), so cards offer only the answers it may give; an
 *  older server without it leaves every control offered (the server checks answers). */
async function loadMe(retry = true) {
  try {
    const response = await api("GET", "whoami");
    if (!response.ok) return; // an older server: every control is offered, the server decides
    const me = await readJson(response);
    if (me && typeof me.name === "string") {
      server.me = me;
      wakeLoop();
      refreshInbox();
    }
  } catch {
    // Not reachable now: the cards offer every control meanwhile; asked once more shortly.
    if (retry) setTimeout(() => loadMe(false), 3000);
  }
}

window.addEventListener("motus:key", () => {
  server.me = null;
  loadMe();
});

function init() {
  // The skip link must not touch the URL's hash: the hash names the open session.
  document.querySelector(".skip-link").addEventListener("click", (event) => {
    event.preventDefault();
    $("composer-input").focus();
  });
  $("composer").addEventListener("submit", sendMessage);
  $("composer-input").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      $("composer").requestSubmit();
    }
  });
  $("new-session").addEventListener("click", () => createSession().then((sid) => sid && $("composer-input").focus()));
  $("delete-session").addEventListener("click", deleteSession);
  $("show-audit").addEventListener("click", toggleAudit);
  wireDeleteDialog();
  $("notice-close").addEventListener("click", () => clearNotice());
  $("sessions-toggle").addEventListener("click", () => {
    const open = $("sidebar").classList.toggle("open");
    $("sessions-toggle").setAttribute("aria-expanded", open ? "true" : "false");
  });
  $("session-list").addEventListener("click", (event) => {
    const link = event.target.closest("a[data-sid]");
    if (!link) return;
    event.preventDefault();
    $("sidebar").classList.remove("open");
    $("sessions-toggle").setAttribute("aria-expanded", "false");
    navigate(link.dataset.sid);
  });
  window.addEventListener("hashchange", route);
  window.addEventListener("popstate", route);
  document.addEventListener("visibilitychange", () => {
    if (!document.hidden) {
      wakeLoop();
      refreshSessionList();
    }
  });
  refreshSessionList();
  route();
  loadMe();
  if (!view.sid) renderStatus();
}

init();
