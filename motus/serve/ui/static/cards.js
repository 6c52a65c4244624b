// Interrupt cards: tool approvals, questions, and any other type; resuming.

import { $, uid, el, announce } from "./dom.js";
import { visibleText, visibleJson, markedJson } from "./text.js";
import { api, readJson, detailOf, sessionPath } from "./api.js";
import { showNotice } from "./notice.js";
import { view, server } from "./state.js";
import { wakeLoop } from "./loop.js";
import { renderStatus } from "./conversation.js";
import { countdown, startCountdowns } from "./time.js";

export function renderInterrupts(session) {
  const section = $("interrupts");
  const pending = session.status === "interrupted" && Array.isArray(session.interrupts) ? session.interrupts : [];
  const live = new Set();
  const added = [];
  for (const interrupt of pending) {
    if (!interrupt || typeof interrupt.interrupt_id !== "string") continue;
    const id = interrupt.interrupt_id;
    if (view.answered.has(id)) continue;
    live.add(id);
    if (!view.cards.has(id)) {
      const card = buildCard(interrupt, view.sid);
      view.cards.set(id, card);
      section.append(card);
      added.push(card);
    }
    updateCard(view.cards.get(id), interrupt, session.turn && session.turn.sent_by);
  }
  for (const id of [...view.cards.keys()]) if (!live.has(id)) removeCard(id);
  section.hidden = view.cards.size === 0;
  // In the order the server lists them (the order they were raised), whatever order their
  // events and reads arrived in: "1 of 2" is the first one raised, here as in the terminal.
  const order = pending.map((interrupt) => interrupt && view.cards.get(interrupt.interrupt_id)).filter(Boolean);
  const shown = [...view.cards.values()];
  if (order.length === shown.length && order.some((card, index) => card !== shown[index])) {
    const focused = document.activeElement;
    for (const card of order) {
      view.cards.delete(card.dataset.interruptId);
      view.cards.set(card.dataset.interruptId, card);
      section.append(card);
    }
    if (focused && focused !== document.activeElement && section.contains(focused)) focused.focus({ preventScroll: true });
  }
  numberCards([...view.cards.values()]);
  if (added.length) {
    announce(added.length === 1 ? "The agent is waiting for your answer." : `The agent is waiting for ${added.length} answers.`);
    const active = document.activeElement;
    const busyElsewhere = active && active !== document.body && section.contains(active);
    if (!busyElsewhere) added[0].querySelector(".card-title").focus({ preventScroll: false });
    added[0].scrollIntoView({ block: "nearest" });
  }
}

/** Remove a card; if it held focus (``hadFocus`` overrides: a busy card's disabled
 *  controls lose focus), move focus to the next card or to the message box. */
/** "1 of 2", "2 of 2" on the cards waiting together (nothing on a lone card). */
export function numberCards(cards) {
  cards.forEach((card, index) => {
    const count = card.querySelector(".card-count");
    const text = cards.length > 1 ? `${index + 1} of ${cards.length}` : "";
    if (count.textContent !== text) count.textContent = text;
    count.hidden = !text;
  });
}

function removeCard(id, hadFocus = undefined) {
  const card = view.cards.get(id);
  if (!card) return;
  if (hadFocus === undefined) hadFocus = card.contains(document.activeElement);
  card.remove();
  view.cards.delete(id);
  numberCards([...view.cards.values()]);
  if (hadFocus) {
    const next = view.cards.values().next().value;
    if (next) next.querySelector(".card-title").focus();
    else $("composer-input").focus();
  }
}

/** The card of one interrupt of session ``sid``; ``onAnswered(card)`` (the Inbox) replaces
 *  what the conversation does once the answer is accepted or refused for good. */
export function buildCard(interrupt, sid, onAnswered = null) {
  const payload = interrupt.payload && typeof interrupt.payload === "object" ? interrupt.payload : {};
  const type = typeof payload.type === "string" ? payload.type : String(interrupt.type || "unknown");
  let card;
  if (type === "tool_approval" && typeof payload.tool_name === "string") card = approvalCard(interrupt, payload);
  else if (type === "user_input" && validQuestions(payload.questions)) card = questionCard(interrupt, payload);
  else card = customCard(interrupt, payload, type);
  card.sid = sid;
  card.onAnswered = onAnswered;
  return card;
}

function cardShell(interrupt, kind, ...title) {
  const titleId = uid("card-title");
  const error = el("p", { class: "card-error", role: "alert" });
  const card = el(
    "article",
    { class: `card ${kind}`, "aria-labelledby": titleId, "data-interrupt-id": interrupt.interrupt_id, "data-kind": kind },
    el("h4", { class: "card-title", id: titleId, tabindex: "-1" }, el("span", { class: "card-count", hidden: true }), ...title),
  );
  const clock = countdown(interrupt.expires_at);
  if (clock) {
    card.append(clock);
    startCountdowns();
  }
  card.cardError = error;
  return card;
}

function setBusy(card, busy) {
  card.setAttribute("aria-busy", busy ? "true" : "false");
  for (const control of card.querySelectorAll("button, input, textarea")) control.disabled = busy;
}

/** POST the resume; remove the card when accepted, explain and refresh when not. */
async function resume(card, interrupt, value) {
  const sid = card.sid;
  const id = interrupt.interrupt_id;
  const hadFocus = card.contains(document.activeElement);
  card.cardError.textContent = "";
  setBusy(card, true);
  view.epoch += 1;
  let response;
  try {
    response = await api("POST", sessionPath(sid, "/resume"), { body: { interrupt_id: id, value } });
  } catch (error) {
    setBusy(card, false);
    if (hadFocus) card.querySelector(".card-title").focus();
    card.cardError.textContent = `Could not reach the server (${error.message || error}). Try again.`;
    return;
  }
  if (response.ok && response.headers.get("Content-Type")?.includes("json")) {
    const body = await readJson(response.clone());
    if (body && Number.isInteger(body.approvals_needed)) {
      // One approval of several: the interrupt waits for other keys, so the card stays.
      setBusy(card, false);
      card.approvedHere = true; // no Approve again; the next read shows the approvals as the server counts them
      updateCard(card, { ...interrupt, approvals_needed: body.approvals_needed }, card.sentBy);
      if (hadFocus) card.querySelector(".card-title").focus();
      announce(typeof body.detail === "string" ? body.detail : "Your approval was recorded; it needs more.");
      card.cardError.textContent = "";
      if (!card.onAnswered) wakeLoop(); // the Inbox is woken by the approval's event
      return;
    }
  }
  if (card.onAnswered) {
    if (response.ok || response.status === 404 || response.status === 409) {
      if (!response.ok) showNotice(`That answer was not accepted: the server said "${await detailOf(response)}" (${response.status}). It may have been answered elsewhere, or the session ended.`);
      else announce("Answer sent.");
      card.onAnswered(card, hadFocus);
      return;
    }
    setBusy(card, false);
    card.cardError.textContent = `The server refused this answer (${response.status}): ${await detailOf(response)}`;
    return;
  }
  if (sid !== view.sid) return;
  view.epoch += 1;
  if (response.ok) {
    const body = await readJson(response);
    view.answered.add(id);
    removeCard(id, hadFocus || document.activeElement === document.body);
    announce("Answer sent.");
    if (view.session && body && typeof body.status === "string") {
      view.session = { ...view.session, status: body.status };
      if (body.status !== "interrupted") view.session.interrupts = null;
      renderStatus();
    }
    $("interrupts").hidden = view.cards.size === 0;
    wakeLoop();
    return;
  }
  const detail = await detailOf(response);
  if (response.status === 404 || response.status === 409) {
    showNotice(`That answer was not accepted: the server said "${detail}" (${response.status}). It may have been answered in another tab, or the session ended. The view has been refreshed.`);
    removeCard(id, hadFocus || document.activeElement === document.body);
    $("interrupts").hidden = view.cards.size === 0;
    wakeLoop();
    return;
  }
  setBusy(card, false);
  if (hadFocus) card.querySelector(".card-title").focus();
  card.cardError.textContent = `The server refused this answer (${response.status}): ${detail}`;
}

/** Parse JSON typed by the user; on failure mark the field and return undefined. */
function parseField(field, errorNode, { requireObject = false } = {}) {
  const text = field.value.trim();
  let value;
  let problem = "";
  if (!text) problem = "Enter a JSON value.";
  else {
    try {
      value = JSON.parse(text);
      if (requireObject && (value === null || typeof value !== "object" || Array.isArray(value))) {
        problem = 'The arguments must be a JSON object, like {"path": "/tmp/x"}.';
      }
    } catch (error) {
      problem = `That is not valid JSON: ${error.message}`;
    }
  }
  errorNode.textContent = problem;
  field.setAttribute("aria-invalid", problem ? "true" : "false");
  if (problem) {
    field.focus();
    return undefined;
  }
  return value;
}

/** The tool's approver policy in words ("approvers", "self_approval", "quorum" in its payload), or null. */
function whoMayApprove(payload) {
  const roles = Array.isArray(payload.approvers) ? payload.approvers.map((role) => String(role)) : [];
  const quorum = quorumOf(payload);
  const parts = [];
  if (roles.length) parts.push(quorum > 1 ? `${quorum} different keys with the role ${roles.join(" or ")}` : `a key with the role ${roles.join(" or ")}`);
  else if (quorum > 1) parts.push(`${quorum} different keys`);
  if (payload.self_approval === false) parts.push("not the key that sent the message");
  return parts.length ? `Who may approve: ${parts.join(", ")}` : null;
}

/** Show ``text`` in ``node`` (hidden characters marked, as everywhere), hidden when empty. */
function setText(node, text) {
  if (node.dataset.text !== text) {
    node.dataset.text = text;
    node.replaceChildren(...visibleText(text));
  }
  node.hidden = !text;
}

const quorumOf = (payload) => (Number.isInteger(payload.quorum) && payload.quorum > 1 ? payload.quorum : 1);

/** Why this tab's key cannot answer the interrupt at all (a sentence), or null: it may,
 *  or who it is is not known (an older server without GET /whoami). The server checks
 *  every answer anyway; this only keeps buttons it would refuse off the card. */
function cannotAnswer(payload, sentBy) {
  const me = server.me;
  if (!me || typeof me.name !== "string") return null;
  if (me.read_only) return `Your key (${me.name}) is read-only: it may watch, not answer.`;
  const roles = Array.isArray(payload.approvers) ? payload.approvers.map((role) => String(role)) : [];
  const mine = Array.isArray(me.roles) ? me.roles : [];
  const restricted = roles.length || payload.self_approval === false || quorumOf(payload) > 1;
  if (restricted && me.name === "anonymous") {
    return "This server has no API keys, so it cannot tell who answers: nobody may answer this here.";
  }
  if (roles.length && !roles.some((role) => mine.includes(role))) {
    return `Your key (${me.name}) cannot answer this: it needs the role ${roles.join(" or ")}.`;
  }
  if (payload.self_approval === false && typeof sentBy === "string" && sentBy === me.name) {
    return "You sent the message that asked for this, so someone else must answer it.";
  }
  return null;
}

/** Keep a card up to date with what the server says now: where its quorum stands
 *  ("1 of 2 approvals: bob") and which of its controls this key may use. ``sentBy``: the
 *  name of the key that sent the turn's message, where known. */
export function updateCard(card, interrupt, sentBy) {
  if (!card) return;
  card.sentBy = sentBy;
  const payload = interrupt.payload && typeof interrupt.payload === "object" ? interrupt.payload : {};
  const quorum = quorumOf(payload);
  const given = Array.isArray(interrupt.approvals) ? interrupt.approvals.map((a) => String(a && a.by)) : [];
  const progress = card.querySelector(".card-progress");
  if (progress) {
    const text = quorum > 1 ? `${given.length} of ${quorum} approvals${given.length ? `: ${given.join(", ")}` : ""}` : "";
    setText(progress, text);
  }
  const why = cannotAnswer(payload, sentBy);
  const me = server.me && typeof server.me.name === "string" ? server.me.name : null;
  // This tab's own approval (its response said so) counts before the next read shows it.
  const approvedByMe = quorum > 1 && ((me !== null && given.includes(me)) || card.approvedHere === true);
  const needed = Number.isInteger(interrupt.approvals_needed) ? interrupt.approvals_needed : Math.max(quorum - given.length, 1);
  const cannot = card.querySelector(".card-cannot");
  const note = why || (approvedByMe ? `You approved this; it needs ${needed} more from another key. You may still reject it.` : "");
  if (cannot) setText(cannot, note);
  for (const part of card.querySelectorAll(".answer-part")) part.hidden = Boolean(why);
  for (const part of card.querySelectorAll(".approve-part")) part.hidden = Boolean(why) || approvedByMe;
}

function approvalCard(interrupt, payload) {
  const args = payload.tool_args === undefined ? {} : payload.tool_args;
  const card = cardShell(interrupt, "approval", "Approve this tool call? ", el("code", { class: "tool-name" }, visibleText(payload.tool_name)));
  const argsId = uid("args");
  // The editor starts from the same text: valid JSON, so approving it unchanged sends
  // exactly the arguments the agent proposed.
  const argsJson = visibleJson(args);
  const argsView = el("pre", { class: "mono args", id: argsId }, markedJson(argsJson));
  const editId = uid("edit");
  const editError = el("p", { class: "field-error", id: uid("edit-error"), role: "alert" });
  const editor = el("textarea", {
    class: "mono",
    id: editId,
    rows: String(Math.min(12, argsJson.split("\n").length + 1)),
    spellcheck: "false",
    "aria-describedby": editError.id,
  });
  const editBox = el("div", { class: "field", hidden: true }, el("label", { for: editId }, "Arguments (JSON object)"), editor, editError);
  const reasonId = uid("reason");
  const reason = el("input", { id: reasonId, type: "text", autocomplete: "off" });
  const approve = el("button", { class: "button primary", type: "button" }, "Approve");
  const reject = el("button", { class: "button danger", type: "button" }, "Reject");
  const edit = el("button", { class: "button", type: "button", "aria-expanded": "false", "aria-controls": editId }, "Edit arguments");
  const rememberId = uid("remember");
  const remember = el("input", { id: rememberId, type: "checkbox", class: "remember" });
  const approved = (extra = {}) => (remember.checked ? { approved: true, ...extra, remember: "session" } : { approved: true, ...extra });
  let editing = false;

  const setEditing = (on) => {
    editing = on;
    editBox.hidden = !on;
    argsView.hidden = on;
    edit.textContent = on ? "Cancel editing" : "Edit arguments";
    edit.setAttribute("aria-expanded", on ? "true" : "false");
    approve.textContent = on ? "Approve with these arguments" : "Approve";
    if (on) {
      editor.value = argsJson;
      editError.textContent = "";
      editor.setAttribute("aria-invalid", "false");
      editor.focus();
    }
  };
  edit.addEventListener("click", () => setEditing(!editing));
  approve.addEventListener("click", () => {
    if (!editing) return resume(card, interrupt, approved());
    const edited = parseField(editor, editError, { requireObject: true });
    if (edited !== undefined) resume(card, interrupt, approved({ tool_args: edited }));
  });
  const rejectNow = () => {
    const why = reason.value.trim();
    resume(card, interrupt, why ? { approved: false, reason: why } : { approved: false });
  };
  reject.addEventListener("click", rejectNow);
  reason.addEventListener("keydown", (event) => {
    if (event.key === "Enter") {
      event.preventDefault();
      rejectNow();
    }
  });
  editor.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) {
      event.preventDefault();
      approve.click();
    }
  });

  const policy = whoMayApprove(payload);
  approve.classList.add("approve-part");
  edit.classList.add("approve-part");
  card.append(
    el("p", { class: "card-label", id: uid("args-label") }, "Arguments"),
    argsView,
    editBox,
    ...(policy ? [el("p", { class: "card-policy" }, ...visibleText(policy))] : []),
    el("p", { class: "card-progress", hidden: true }),
    el("p", { class: "card-cannot", hidden: true }),
    el("div", { class: "field answer-part" }, el("label", { for: reasonId }, "Reason if you reject (optional)"), reason),
    // A tool that names who may approve each call is never remembered (the server refuses it).
    ...(policy ? [] : [el(
      "div",
      { class: "field check remember-field answer-part" },
      remember,
      el("label", { for: rememberId }, "Remember for this session: approve later calls of ", el("code", {}, visibleText(payload.tool_name)), " without asking"),
    )]),
    // "editable": false: the agent cannot run the call with other arguments, so no edit is
    // offered; nor with a quorum, where every approver approves the same call.
    el("div", { class: "actions answer-part" }, approve, reject, ...(payload.editable === false || quorumOf(payload) > 1 ? [] : [edit])),
    card.cardError,
  );
  return card;
}

function validQuestions(questions) {
  return (
    Array.isArray(questions) &&
    questions.length > 0 &&
    questions.every(
      (q) =>
        q && typeof q === "object" && typeof q.question === "string" && Array.isArray(q.options) &&
        q.options.every((o) => o && typeof o === "object" && typeof o.label === "string"),
    )
  );
}

function questionCard(interrupt, payload) {
  const questions = payload.questions;
  const one = questions.length === 1;
  const card = cardShell(interrupt, "questions", one ? "The agent has a question" : `The agent has ${questions.length} questions`);
  // The "answer every question" error, while it shows: kept true to what is still missing.
  let missingShown = false;
  const firstUnanswered = () => readers.find(({ answer }) => !answer());
  const recheck = () => {
    if (!missingShown) return;
    const missing = firstUnanswered();
    if (missing) card.cardError.textContent = missingText(missing.q);
    else {
      card.cardError.textContent = "";
      missingShown = false;
    }
  };
  const readers = questions.map((q) => {
    const { node, answer, focusFirst } = questionBlock(q, () => send(), recheck);
    card.append(node);
    return { q, answer, focusFirst };
  });
  const buttonText = one ? "Send answer" : "Send answers";
  const hint = el(
    "p",
    { class: "card-hint", id: uid("send-hint") },
    `Choosing an option does not send it: ${one ? "" : "answer every question, then "}press “${buttonText}”.`,
  );
  const sendButton = el("button", { class: "button primary", type: "button", "aria-describedby": hint.id }, buttonText);
  const send = () => {
    const missing = firstUnanswered();
    if (missing) {
      card.cardError.textContent = missingText(missing.q);
      missingShown = true;
      missing.focusFirst();
      return;
    }
    const answers = {};
    for (const { q, answer } of readers) answers[q.question] = answer();
    resume(card, interrupt, { answers });
  };
  sendButton.addEventListener("click", send);
  card.append(hint, el("div", { class: "actions" }, sendButton), card.cardError);
  return card;
}

const missingText = (q) => `Answer every question first: "${q.header || q.question}" has no answer yet.`;

/** One question: its options (buttons, or checkboxes when multiSelect) and "Other".
 *  ``changed`` runs after every change of its answer.
 *
 *  An option's markdown preview shows while the option is hovered or focused, in the flow
 *  of the card (it pushes what follows down, so it can never cover the "Other" field), and
 *  closes once the option is chosen: it opens again after the pointer and the focus have
 *  both left the option. */
function questionBlock(q, submit, changed) {
  const multi = q.multiSelect === true;
  const legend = el(
    "legend",
    {},
    q.header ? el("span", { class: "chip" }, visibleText(q.header)) : null,
    el("span", { class: "question-text" }, visibleText(q.question, { multiline: true })),
  );
  const fieldset = el("fieldset", { class: "question" }, legend);
  const options = el("div", { class: "options" });
  const otherId = uid("other");
  const other = el("input", { id: otherId, type: "text", autocomplete: "off", class: "other-input" });
  const controls = [];
  const labels = new Map(); // control -> the option's label, as the agent sent it

  q.options.forEach((option) => {
    const descId = uid("desc");
    const previewId = uid("preview");
    const hasDesc = typeof option.description === "string" && option.description !== "";
    const hasPreview = typeof option.markdown === "string" && option.markdown !== "";
    const describedBy = [hasDesc ? descId : null, hasPreview ? previewId : null].filter(Boolean).join(" ") || null;
    const desc = hasDesc ? el("span", { class: "option-desc", id: descId }, visibleText(option.description, { multiline: true })) : null;
    const preview = hasPreview ? el("pre", { class: "mono preview", id: previewId }, visibleText(option.markdown, { multiline: true })) : null;
    let control;
    let wrapper;
    if (multi) {
      const boxId = uid("choice");
      control = el("input", { type: "checkbox", id: boxId, value: option.label, "aria-describedby": describedBy });
      wrapper = el("div", { class: "option check" }, control, el("label", { for: boxId }, el("span", { class: "option-label" }, visibleText(option.label)), desc));
    } else {
      control = el("button", { type: "button", class: "option-button", "aria-pressed": "false", "aria-describedby": describedBy }, el("span", { class: "option-label" }, visibleText(option.label)));
      control.addEventListener("click", () => {
        const chosen = control.getAttribute("aria-pressed") !== "true";
        for (const c of controls) c.setAttribute("aria-pressed", "false");
        control.setAttribute("aria-pressed", chosen ? "true" : "false");
        if (chosen) {
          other.value = "";
          closePreview(wrapper);
        }
        changed();
      });
      wrapper = el("div", { class: "option" }, control, desc);
    }
    if (multi) {
      control.addEventListener("change", () => {
        if (control.checked) closePreview(wrapper);
        changed();
      });
    }
    if (preview) {
      wrapper.append(preview);
      const reopen = () => {
        if (!wrapper.matches(":hover") && !wrapper.contains(document.activeElement)) wrapper.classList.remove("preview-closed");
      };
      wrapper.addEventListener("mouseleave", reopen);
      wrapper.addEventListener("focusout", () => setTimeout(reopen, 0)); // once focus has landed elsewhere
    }
    controls.push(control);
    labels.set(control, option.label);
    options.append(wrapper);
  });

  other.addEventListener("input", () => {
    if (!multi && other.value.trim()) for (const c of controls) c.setAttribute("aria-pressed", "false");
    changed();
  });
  other.addEventListener("keydown", (event) => {
    if (event.key === "Enter") {
      event.preventDefault();
      submit();
    }
  });
  fieldset.append(
    options,
    el("div", { class: "field other" }, el("label", { for: otherId }, multi ? "Other (added to your choices)" : "Other (type your own answer)"), other),
  );

  const answer = () => {
    const typed = other.value.trim();
    if (multi) {
      const chosen = controls.filter((c) => c.checked).map((c) => labels.get(c));
      if (typed) chosen.push(typed);
      return chosen.join(", ");
    }
    if (typed) return typed;
    const pressed = controls.find((c) => c.getAttribute("aria-pressed") === "true");
    return pressed ? labels.get(pressed) : "";
  };
  const focusFirst = () => (controls[0] || other).focus();
  return { node: fieldset, answer, focusFirst };
}

/** Hide an option's preview now that it is chosen (see questionBlock). */
function closePreview(wrapper) {
  if (wrapper.querySelector(".preview")) wrapper.classList.add("preview-closed");
}

function customCard(interrupt, payload, type) {
  const card = cardShell(interrupt, "custom", "The agent is waiting: ", el("code", {}, visibleText(type)));
  const answerId = uid("answer");
  const error = el("p", { class: "field-error", id: uid("answer-error"), role: "alert" });
  const hintId = uid("answer-hint");
  const field = el("textarea", { class: "mono", id: answerId, rows: "3", spellcheck: "false", "aria-describedby": `${hintId} ${error.id}` });
  const send = el("button", { class: "button primary", type: "button" }, "Send answer");
  send.addEventListener("click", () => {
    const value = parseField(field, error);
    if (value !== undefined) resume(card, interrupt, value);
  });
  field.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) {
      event.preventDefault();
      send.click();
    }
  });
  // A custom payload often carries its own words for the person; show them first.
  if (typeof payload.title === "string" && payload.title.trim()) {
    card.append(el("p", { class: "card-custom-title" }, visibleText(payload.title.trim())));
  }
  const words = ["prompt", "message", "question", "text"].map((k) => payload[k]).find((v) => typeof v === "string" && v);
  if (words) card.append(el("p", { class: "card-prompt" }, visibleText(words, { multiline: true })));
  card.append(
    el("p", { class: "card-label" }, "This request has no dedicated form here. What the agent sent:"),
    el("pre", { class: "mono payload" }, markedJson(visibleJson(interrupt.payload))),
    el(
      "div",
      { class: "field" },
      el("label", { for: answerId }, "Your answer (JSON)"),
      el("p", { class: "muted hint", id: hintId }, answerHint(payload)),
      suggestions(payload, field),
      field,
      error,
    ),
    el("div", { class: "actions" }, send),
    card.cardError,
  );
  return card;
}

/** Values the payload offers (the first list of plain values it holds, such as the
 *  spec's "presets"), its default, and its own hint or example, if any. */
function offered(payload) {
  for (const [key, value] of Object.entries(payload)) {
    if (key === "type" || !Array.isArray(value) || !value.length || value.length > 20) continue;
    if (value.every((v) => v === null || ["string", "number", "boolean"].includes(typeof v))) return { key, values: value };
  }
  return null;
}

function answerHint(payload) {
  const own = ["hint", "answer_hint", "expected", "example", "format"].map((k) => payload[k]).find((v) => typeof v === "string" && v.trim());
  const parts = [];
  if (own) parts.push(own.trim());
  const offer = offered(payload);
  if (offer) parts.push(`The agent offered ${offer.key}: ${offer.values.map((v) => JSON.stringify(v)).join(", ")}; pick one below or type any JSON value.`);
  if (payload.default !== undefined) parts.push(`Its default is ${JSON.stringify(payload.default)}.`);
  if (!parts.length) parts.push("Any JSON value: what the agent expects is up to the agent (see what it sent above).");
  return `${parts.join(" ")} Ctrl+Enter sends.`;
}

/** A button per offered value: fills the answer field with it as JSON. */
function suggestions(payload, field) {
  const offer = offered(payload);
  if (!offer) return null;
  return el(
    "div",
    { class: "suggestions", role: "group", "aria-label": `Offered ${offer.key}` },
    offer.values.map((value) =>
      el("button", {
        type: "button",
        class: "button small",
        "aria-label": `Use ${JSON.stringify(value)}`,
        on: { click: () => { field.value = JSON.stringify(value); field.focus(); } },
      }, visibleText(JSON.stringify(value)))),
  );
}
