// The status, the conversation and the turn's error.
//
// The conversation is: the stored messages (GET /sessions/{id}/messages), with the record of
// each decision (GET /sessions/{id}/audit) placed after the tool call it decided; then, while
// a turn runs or waits, that turn as the server describes it (the ``turn`` object: the user's
// message, the model's text and tool calls, results, and decisions already taken), so a
// person who opens a waiting session anywhere sees what they are asked to approve.

import { $, el } from "./dom.js";
import { visibleText, visibleJson, visibleJsonString, markedJson } from "./text.js";
import { renderMarkdown } from "./markdown.js";
import { timeElement } from "./time.js";
import { STATUS_TEXT, view, loadPending, saveTimes } from "./state.js";

export function renderStatus() {
  const session = view.session;
  const status = session ? session.status : null;
  const chip = $("status");
  chip.dataset.status = status || "none";
  chip.textContent = status ? STATUS_TEXT[status] || `Status: ${status}` : view.sid ? "Loading session…" : "No session open";
  $("running").hidden = status !== "running";
  const failed = status === "error";
  $("turn-error").hidden = !failed;
  $("turn-error-text").textContent = failed ? String(session.error || "No error message was given.") : "";
  const busy = status === "running" || status === "interrupted";
  $("composer-send").disabled = busy;
  $("composer-hint").textContent =
    status === "running" ? "You can send a message when the agent has finished."
      : status === "interrupted" ? "Answer the agent's request above first."
        : "";
}

function sameMessage(a, b) {
  return Boolean(a && b) && a.role === b.role && (a.content ?? null) === (b.content ?? null);
}

const isLive = (session) => (session.status === "running" || session.status === "interrupted") && session.turn && typeof session.turn === "object";

/** Give stored messages that appeared while this tab watched the turn the turn's times:
 *  the user's message when the turn started, the rest when it ended. Kept per browser. */
function stampTimes(messages) {
  if (view.timesFrom === null) {
    view.timesFrom = messages.length; // the first read: what is already stored has no times here
    return;
  }
  let changed = false;
  for (let i = view.timesFrom; i < messages.length; i += 1) {
    if (view.times[i]) continue;
    const m = messages[i] || {};
    view.times[i] = (m.role === "user" && view.turnStartedAt) || view.turnEndedAt || new Date().toISOString();
    changed = true;
  }
  view.timesFrom = messages.length;
  if (changed && view.sid) saveTimes(view.sid, view.times);
}

/** Each decision's record, after the stored tool call it decided (a greedy walk in order:
 *  both the audit and the messages are oldest first). A decision that matches no call goes
 *  before the agent's next plain reply. A record that says where its turn's messages start
 *  in the history (``history_at``) is looked for from there on, never in an earlier turn. */
function withRecords(items, records) {
  const after = new Map(); // item index -> records to insert after it (-1: before all)
  const used = new Set();
  let cursor = 0;
  const put = (index, record) => {
    if (!after.has(index)) after.set(index, []);
    after.get(index).push(record);
  };
  for (const record of records) {
    const payload = record.payload && typeof record.payload === "object" ? record.payload : {};
    if (Number.isInteger(record.history_at) && record.history_at > cursor) cursor = Math.min(record.history_at, items.length);
    let placed = false;
    if (typeof payload.tool_name === "string") {
      for (let i = cursor; i < items.length && !placed; i += 1) {
        const m = items[i].message;
        if (!m || m.role !== "assistant" || !Array.isArray(m.tool_calls)) continue;
        m.tool_calls.forEach((call, n) => {
          const key = `${i}:${n}`;
          if (placed || used.has(key) || !call || !call.function || call.function.name !== payload.tool_name) return;
          used.add(key);
          put(i, record);
          cursor = i;
          placed = true;
        });
      }
    }
    if (!placed) {
      let i = cursor;
      while (i < items.length && !(items[i].message && items[i].message.role === "assistant" && !(items[i].message.tool_calls || []).length)) i += 1;
      put(i - 1, record);
      cursor = Math.max(cursor, i);
    }
  }
  const out = [...(after.get(-1) || []).map((record) => ({ kind: "record", record }))];
  items.forEach((item, i) => {
    out.push(item);
    for (const record of after.get(i) || []) out.push({ kind: "record", record });
  });
  return out;
}

/** Who a user message is from: the name of the key that sent it, where the server knows
 *  one ("anonymous" is a server without keys: everyone is "You"). */
function sender(name) {
  return typeof name === "string" && name && name !== "anonymous" ? name : "You";
}

function conversationItems(messages, session) {
  stampTimes(messages);
  let items = messages
    // A time the server gives (when the message was sent) wins over one this tab noted.
    .map((message, i) => ({ kind: "message", message, at: (message && typeof message.sent_at === "string" && message.sent_at) || view.times[i] || null }))
    .filter((item) => item.message && typeof item.message === "object");
  const reply = session.response;
  if (session.status === "idle" && reply && typeof reply === "object" && !sameMessage(messages[messages.length - 1], reply)) {
    items.push({ kind: "message", message: reply, at: view.turnEndedAt });
  }
  const live = isLive(session) ? session.turn : null;
  const liveIds = new Set(live && Array.isArray(live.steps) ? live.steps.map((s) => s && s.interrupt_id).filter(Boolean) : []);
  const records = Array.isArray(view.audit)
    ? view.audit.filter((r) => r && r.kind === "resolved" && !liveIds.has(r.interrupt_id))
    : [];
  if (records.length) items = withRecords(items, records);
  if (live) {
    const message = live.message && typeof live.message === "object" ? live.message : { role: "user", content: loadPending(view.sid) };
    items.push({ kind: "pending", text: String(message.content ?? ""), at: live.started_at || view.turnStartedAt, live: true, by: live.sent_by });
    const called = []; // tool calls the model's steps showed, not yet matched to a gate
    for (const step of Array.isArray(live.steps) ? live.steps : []) {
      if (!step || typeof step !== "object") continue;
      if (step.kind === "interrupt") {
        const payload = step.payload && typeof step.payload === "object" ? step.payload : {};
        if (typeof payload.tool_name === "string") {
          // A gated call the model's steps did not show (or a model that is not journaled).
          const shown = called.indexOf(payload.tool_name);
          if (shown >= 0) called.splice(shown, 1);
          else items.push({ kind: "step", step: { kind: "model", seq: step.seq, status: "done", gate: true, tool_calls: [{ name: payload.tool_name, arguments: payload.tool_args ?? {} }] } });
        }
        if (step.status === "resolved") items.push({ kind: "record", record: { ...step, reason: step.by === "timeout" ? "timeout" : "resume" } });
      } else {
        if (step.kind === "model") for (const call of step.tool_calls || []) if (call && call.name) called.push(call.name);
        items.push({ kind: "step", step });
      }
    }
  } else {
    const pending = view.sid ? loadPending(view.sid) : null;
    if (pending !== null && session.status !== "idle") {
      items.push({ kind: "pending", text: pending, failed: session.status === "error", at: view.turnStartedAt });
    }
  }
  return items;
}

export function renderMessages(messages, session) {
  const list = $("messages");
  const log = $("log");
  const nearBottom = log.scrollHeight - log.scrollTop - log.clientHeight < 80;
  const items = conversationItems(messages, session);
  const keys = items.map((item) => JSON.stringify(item));
  const old = view.renderedKeys;
  let same = 0;
  while (same < old.length && same < keys.length && old[same] === keys[same]) same += 1;
  if (same === old.length && same === keys.length) return;
  const toolNames = new Map();
  for (const item of items) {
    for (const call of (item.message && item.message.tool_calls) || []) {
      if (call && call.id && call.function) toolNames.set(call.id, call.function.name);
    }
  }
  while (list.children.length > same) list.lastElementChild.remove();
  for (const item of items.slice(same)) list.append(renderItem(item, toolNames));
  view.renderedKeys = keys;
  view.renderedMessages = messages;
  $("empty").hidden = true;
  if (nearBottom || same < old.length) log.scrollTop = log.scrollHeight;
}

function who(text, at) {
  return el("p", { class: "who" }, text, at ? " · " : null, at ? timeElement(at) : null);
}

function renderItem(item, toolNames) {
  if (item.kind === "pending") {
    return el(
      "li",
      { class: `msg user pending${item.failed ? " failed" : ""}${item.live ? " live" : ""}` },
      who(sender(item.by), item.at),
      el("div", { class: "text" }, item.text),
      el("p", { class: "note" }, item.failed ? "Not saved: this turn failed." : "Sent; the agent is on it."),
    );
  }
  if (item.kind === "record") return renderRecord(item.record);
  if (item.kind === "step") return renderStep(item.step);
  const m = item.message;
  const role = ["user", "assistant", "tool", "system"].includes(m.role) ? m.role : "assistant";
  const content = m.content === undefined || m.content === null ? "" : String(m.content);
  if (role === "tool") {
    const name = m.name || toolNames.get(m.tool_call_id) || "tool";
    return el(
      "li",
      { class: "msg tool" },
      el("details", {}, el("summary", {}, "Result of ", el("code", {}, visibleText(name)), item.at ? " · " : null, item.at ? timeElement(item.at) : null), el("pre", { class: "mono" }, visibleJsonString(content))),
    );
  }
  if (role === "system") {
    return el("li", { class: "msg system" }, el("details", {}, el("summary", {}, "System instructions"), el("pre", { class: "mono" }, content)));
  }
  const li = el("li", { class: `msg ${role}` }, who(role === "user" ? sender(m.sent_by) : "Agent", item.at));
  if (content) li.append(role === "assistant" ? el("div", { class: "text md" }, renderMarkdown(content)) : el("div", { class: "text" }, content));
  if (typeof m.base64_image === "string" && /^[A-Za-z0-9+/=\s]+$/.test(m.base64_image)) {
    li.append(el("img", { class: "attachment", alt: "Image attached to this message", src: `data:image/png;base64,${m.base64_image.replace(/\s/g, "")}` }));
  }
  for (const call of Array.isArray(m.tool_calls) ? m.tool_calls : []) {
    const fn = (call && call.function) || {};
    li.append(
      el(
        "details",
        { class: "tool-call" },
        el("summary", {}, "Called ", el("code", {}, visibleText(fn.name || "a tool"))),
        el("pre", { class: "mono" }, visibleJsonString(fn.arguments ?? "{}")),
      ),
    );
  }
  return li;
}

/** One step of the live turn (from the ``turn`` object). */
function renderStep(step) {
  const label = typeof step.label === "string" ? step.label : String(step.kind);
  if (step.kind === "model") {
    const li = el("li", { class: "msg assistant live-step", "data-step": String(step.seq) }, who("Agent (this turn)"));
    if (step.status === "running") li.append(el("p", { class: "note left" }, "Thinking…"));
    if (typeof step.text === "string" && step.text) li.append(el("div", { class: "text md" }, renderMarkdown(step.text)));
    for (const call of Array.isArray(step.tool_calls) ? step.tool_calls : []) {
      if (!call || typeof call !== "object") continue;
      li.append(
        el(
          "div",
          { class: "tool-call live" },
          el("p", { class: "tool-call-head" }, "Calls ", el("code", { class: "tool-name" }, visibleText(call.name ?? "a tool"))),
          el("pre", { class: "mono args" }, markedJson(visibleJson(call.arguments ?? {}))),
        ),
      );
    }
    if (step.error !== undefined) li.append(el("p", { class: "field-error" }, visibleText(String(step.error))));
    return li;
  }
  const running = step.status === "running";
  const failed = step.status === "failed";
  const body = failed ? step.error : step.result;
  return el(
    "li",
    { class: `msg tool live-step${failed ? " failed" : ""}`, "data-step": String(step.seq) },
    running
      ? el("p", { class: "step-running" }, "Running ", el("code", {}, visibleText(label)), "…")
      : el(
        "details",
        {},
        el("summary", {}, failed ? "Failed: " : "Result of ", el("code", {}, visibleText(label))),
        el("pre", { class: "mono" }, typeof body === "string" ? visibleJsonString(body) : markedJson(visibleJson(body ?? null))),
      ),
  );
}

/** The inline record of one decision: approved or rejected (or answered), by whom, when,
 *  with which edited arguments and reason. */
export function renderRecord(record) {
  const payload = record.payload && typeof record.payload === "object" ? record.payload : {};
  const value = record.value;
  const by = typeof record.by === "string" && record.by ? record.by : "someone";
  const timedOut = record.reason === "timeout" || by === "timeout";
  const isApproval = (record.type === "tool_approval" || payload.type === "tool_approval") && typeof payload.tool_name === "string";
  const parts = [];
  let outcome = "answered";
  if (isApproval) {
    const approved = Boolean(value && typeof value === "object" && value.approved === true);
    outcome = approved ? "approved" : "rejected";
    parts.push(
      el("span", { class: "record-outcome" }, timedOut ? (approved ? "Approved on timeout" : "Rejected on timeout") : approved ? "Approved" : "Rejected"),
      " ",
      el("code", { class: "tool-name" }, visibleText(payload.tool_name)),
    );
  } else {
    parts.push(el("span", { class: "record-outcome" }, timedOut ? "Timed out" : "Answered"), " ", el("code", {}, visibleText(record.type || payload.type || "interrupt")));
  }
  if (timedOut) parts.push(" (nobody answered in time)");
  else parts.push(" by ", el("strong", { class: "record-by" }, visibleText(by)));
  const at = timeElement(record.at);
  if (at) parts.push(" at ", at);
  const li = el("li", { class: `msg record ${outcome}`, "data-interrupt-id": record.interrupt_id || "" }, el("p", { class: "record-line" }, parts));
  if (isApproval && value && typeof value === "object") {
    if (value.tool_args !== undefined) {
      li.append(el("p", { class: "record-detail" }, "With edited arguments:"), el("pre", { class: "mono args" }, markedJson(visibleJson(value.tool_args))));
    } else if (payload.tool_args !== undefined) {
      li.append(el("pre", { class: "mono args" }, markedJson(visibleJson(payload.tool_args))));
    }
    if (typeof value.reason === "string" && value.reason) li.append(el("p", { class: "record-detail" }, "Reason: ", visibleText(value.reason)));
    if (value.remember === "session") li.append(el("p", { class: "record-detail" }, "Remembered for the rest of this session."));
  } else if (!isApproval) {
    li.append(el("pre", { class: "mono args" }, markedJson(visibleJson(value === undefined ? null : value))));
  }
  return li;
}

/** The stored messages as last rendered. */
export function lastMessages() {
  return Array.isArray(view.renderedMessages) ? view.renderedMessages : [];
}
