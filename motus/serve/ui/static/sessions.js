// The session list, and creating, deleting and messaging sessions.

import { $, el, announce } from "./dom.js";
import { api, readJson, detailOf, sessionPath } from "./api.js";
import { showNotice, clearNotice } from "./notice.js";
import { STATUS_TEXT, view, savePending, clearPending } from "./state.js";
import { navigate, wakeLoop } from "./loop.js";
import { renderStatus, renderMessages, lastMessages } from "./conversation.js";
import { renderInterrupts } from "./cards.js";
import { visibleText } from "./text.js";

let listRequest = 0;
//: session id -> title, as the last list read said (a server without titles gives none).
const titles = new Map();

export async function refreshSessionList() {
  const ticket = ++listRequest;
  let list;
  try {
    const response = await api("GET", "sessions?titles=true");
    if (!response.ok) return;
    list = await readJson(response);
  } catch {
    return;
  }
  if (ticket !== listRequest || !Array.isArray(list)) return;
  const ul = $("session-list");
  const focusedSid = document.activeElement && document.activeElement.dataset ? document.activeElement.dataset.sid : undefined;
  const items = list
    .filter((s) => s && typeof s.session_id === "string")
    .reverse()
    .map((s) => {
      const count = Number(s.total_messages) || 0;
      const status = String(s.status || "");
      const title = typeof s.title === "string" && s.title ? s.title : null;
      if (title) titles.set(s.session_id, title);
      else titles.delete(s.session_id);
      const meta = `${STATUS_TEXT[status] ? status : status || "unknown"}, ${count} message${count === 1 ? "" : "s"}`;
      return el(
        "li",
        {},
        el(
          "a",
          { href: `#/sessions/${encodeURIComponent(s.session_id)}`, "data-sid": s.session_id, title: s.session_id },
          title ? el("span", { class: "session-title" }, ...visibleText(title)) : el("span", { class: "session-id" }, s.session_id.slice(0, 8)),
          el("span", { class: "session-meta" }, meta, title ? " · " : null, title ? el("span", { class: "session-id" }, s.session_id.slice(0, 8)) : null),
        ),
      );
    });
  ul.replaceChildren(...items);
  $("session-list-empty").hidden = items.length > 0;
  markCurrentInList();
  if (focusedSid) {
    const again = [...ul.querySelectorAll("a")].find((a) => a.dataset.sid === focusedSid);
    if (again) again.focus();
  }
}

/** Mark the open session in the list, and head the conversation with its title. */
export function markCurrentInList() {
  for (const link of $("session-list").querySelectorAll("a")) {
    if (link.dataset.sid === view.sid) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
  const title = view.sid ? titles.get(view.sid) : null;
  if (title) {
    const marked = visibleText(title);
    $("conversation-title").replaceChildren(...marked);
    // The tab's title is plain text: hidden characters as their marks there too.
    document.title = `motus chat: ${marked.map((node) => (typeof node === "string" ? node : node.textContent)).join("")}`;
  }
}

export async function createSession() {
  let response;
  try {
    response = await api("POST", "sessions", { body: {} });
  } catch (error) {
    showNotice(`Could not reach the server to create a session (${error.message || error}).`);
    return null;
  }
  if (response.status !== 201) {
    showNotice(`Could not create a session (${response.status}): ${await detailOf(response)}`);
    return null;
  }
  const body = await readJson(response);
  if (!body || typeof body.session_id !== "string") {
    showNotice("The server answered without a session id.");
    return null;
  }
  navigate(body.session_id);
  refreshSessionList();
  return body.session_id;
}

/** Ask before deleting a session whose turn is in progress; resolves to true to go ahead.
 *  Escape, or "Keep the session", keeps it. */
function confirmDelete(status) {
  const dialog = $("confirm-delete");
  $("confirm-delete-text").textContent =
    status === "interrupted"
      ? "The agent is waiting for your answer in this session. Deleting it cancels that turn: what you have not approved will not run, and the conversation is gone."
      : "The agent is still working in this session. Deleting it stops that turn, and the conversation is gone.";
  dialog.returnValue = "";
  return new Promise((resolve) => {
    dialog.addEventListener("close", () => resolve(dialog.returnValue === "delete"), { once: true });
    dialog.showModal();
    $("confirm-delete-no").focus();
  });
}

/** The confirmation dialog's buttons (wired once). */
export function wireDeleteDialog() {
  $("confirm-delete-yes").addEventListener("click", () => $("confirm-delete").close("delete"));
  $("confirm-delete-no").addEventListener("click", () => $("confirm-delete").close("keep"));
}

export async function deleteSession() {
  const sid = view.sid;
  if (!sid) return;
  const status = view.session ? view.session.status : null;
  if (status === "interrupted" || status === "running") {
    const go = await confirmDelete(status);
    if (view.sid !== sid) return; // another session was opened meanwhile
    if (!go) {
      $("delete-session").focus();
      return;
    }
  }
  let response;
  try {
    response = await api("DELETE", sessionPath(sid));
  } catch (error) {
    showNotice(`Could not reach the server to delete the session (${error.message || error}).`);
    return;
  }
  if (response.status !== 204 && response.status !== 404) {
    showNotice(`Could not delete the session (${response.status}): ${await detailOf(response)}`);
    return;
  }
  clearPending(sid);
  if (view.sid === sid) navigate(null);
  announce(response.status === 204 ? "Session deleted." : "That session was already gone.");
  if (response.status === 404) showNotice(`Session ${sid.slice(0, 8)} was already gone.`);
  refreshSessionList();
  $("composer-input").focus();
}

export async function sendMessage(event) {
  event.preventDefault();
  const input = $("composer-input");
  const text = input.value.trim();
  if (!text) {
    $("composer-hint").textContent = "Type a message first.";
    input.focus();
    return;
  }
  const button = $("composer-send");
  if (button.disabled) return;
  button.disabled = true;
  try {
    const sid = view.sid || (await createSession());
    if (!sid) return;
    view.epoch += 1;
    let response;
    try {
      response = await api("POST", sessionPath(sid, "/messages"), { body: { role: "user", content: text } });
    } catch (error) {
      showNotice(`Could not reach the server to send the message (${error.message || error}).`);
      return;
    }
    view.epoch += 1;
    if (sid !== view.sid) return;
    if (response.status === 202) {
      input.value = "";
      savePending(sid, text);
      view.turnStartedAt = new Date().toISOString();
      view.turnEndedAt = null;
      clearNotice();
      view.session = { ...(view.session || { session_id: sid, response: null }), status: "running", error: null, interrupts: null };
      renderMessages(lastMessages(), view.session);
      renderStatus();
      renderInterrupts(view.session);
      wakeLoop();
      refreshSessionList();
      return;
    }
    showNotice(`The message was not sent (${response.status}): ${await detailOf(response)}`);
    wakeLoop();
  } finally {
    renderStatus();
  }
}
