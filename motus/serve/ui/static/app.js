/*
 * motus web chat: a client of the session API (../sessions...), served from the same origin.
 *
 * Guarantees the rest of this file keeps:
 * - Text from the agent or an interrupt payload is only ever inserted as text
 *   (textContent / text nodes), never parsed as HTML.
 * - In interrupt cards and tool calls, characters that can hide or reorder text (C0 and
 *   C1 controls, DEL, bidi marks, embeddings, overrides and isolates, line separators)
 *   are never shown raw: JSON shows them as its own escapes ("\u202e", "\r"), plain
 *   text as "⟨U+202E⟩", each in a highlighted span.ctl that names the character.
 *   The values sent back are the agent's own, unchanged.
 * - One request loop per open session (this tab only opens one): a long poll
 *   (?wait=true) while the session is running, otherwise a plain refresh every few
 *   seconds while the tab is visible, and at once after this tab acts. Switching
 *   sessions aborts the old loop's request before the new loop starts.
 * - A response that was requested before this tab's latest action is dropped, so a
 *   stale read never undoes what the action showed.
 * - An interrupt card is keyed by interrupt_id and kept while the interrupt is pending,
 *   so what the user typed into one card survives refreshes and answers to other cards.
 * - On a 401 the page asks for an API key once (a form, not prompt()), keeps it in
 *   sessionStorage for this tab, and retries with "Authorization: Bearer <key>".
 */
(() => {
  "use strict";

  // The page lives at <root>/ui/, the API at <root>/.
  const API_BASE = new URL("../", document.baseURI);
  const LONG_POLL_SECONDS = 25;
  const IDLE_REFRESH_MS = 5000;
  const MAX_BACKOFF_MS = 30000;
  const KEY_STORAGE = "motus.apiKey";
  const PENDING_STORAGE = "motus.pending.";
  const STATUS_TEXT = {
    idle: "Ready",
    running: "The agent is working…",
    interrupted: "Waiting for your answer",
    error: "The turn failed",
  };

  const $ = (id) => document.getElementById(id);
  let idCounter = 0;
  const uid = (prefix) => `${prefix}-${++idCounter}`;

  /** Build an element. Children and the "text" prop become text nodes, never HTML. */
  function el(tag, props = {}, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(props)) {
      if (value === undefined || value === null || value === false) continue;
      if (name === "class") node.className = value;
      else if (name === "text") node.textContent = String(value);
      else if (name === "on") for (const [event, fn] of Object.entries(value)) node.addEventListener(event, fn);
      else node.setAttribute(name, value === true ? "" : String(value));
    }
    for (const child of children.flat()) {
      if (child === undefined || child === null || child === false) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

  function pretty(value) {
    try {
      const text = JSON.stringify(value, null, 2);
      return text === undefined ? String(value) : text;
    } catch {
      return String(value);
    }
  }

  // ---------------------------------------------------------------- hidden characters, shown

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
  function visibleText(value, { multiline = false } = {}) {
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
  function visibleJson(value) {
    return pretty(value).replace(HIDDEN, (ch) =>
      ch === "\n" ? ch : Array.from({ length: ch.length }, (_, i) => `\\u${hex4(ch.charCodeAt(i))}`).join(""));
  }

  /** JSON text (from visibleJson) as nodes, with each escape of a control or hidden
   *  character ("\r", "\u001b", "\u202e") marked; "\\", "\"" and "\/" stay plain. */
  function markedJson(text) {
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
  function visibleJsonString(text) {
    if (typeof text !== "string") return markedJson(visibleJson(text));
    try {
      return markedJson(visibleJson(JSON.parse(text)));
    } catch {
      return visibleText(text, { multiline: true });
    }
  }

  function announce(text) {
    const region = $("announcer");
    region.textContent = "";
    // A fresh text node after clearing makes screen readers speak repeated messages too.
    setTimeout(() => { region.textContent = text; }, 50);
  }

  // ---------------------------------------------------------------- API and API key

  const auth = {
    key: sessionStorage.getItem(KEY_STORAGE),
    waiting: null,
    /** Show the key form (once, however many requests are waiting for it). */
    ask(refused) {
      if (!this.waiting) {
        this.waiting = new Promise((resolve) => openAuthForm(refused, resolve)).finally(() => {
          this.waiting = null;
        });
      }
      return this.waiting;
    },
  };

  function openAuthForm(refused, resolve) {
    const overlay = $("auth");
    const input = $("auth-key");
    const error = $("auth-error");
    const form = $("auth-form");
    error.textContent = refused ? "The server refused that key. Check it and enter it again." : "";
    input.value = "";
    input.setAttribute("aria-invalid", refused ? "true" : "false");
    overlay.hidden = false;
    $("app").inert = true;
    input.focus();
    const submit = (event) => {
      event.preventDefault();
      const key = input.value.trim();
      if (!key) {
        error.textContent = "Enter the API key to continue.";
        input.setAttribute("aria-invalid", "true");
        input.focus();
        return;
      }
      form.removeEventListener("submit", submit);
      auth.key = key;
      sessionStorage.setItem(KEY_STORAGE, key);
      overlay.hidden = true;
      $("app").inert = false;
      resolve();
    };
    form.addEventListener("submit", submit);
  }

  /** fetch() against the API; on 401 ask for a key and retry. Network errors throw. */
  async function api(method, path, { body, signal } = {}) {
    for (;;) {
      const usedKey = auth.key;
      const headers = { Accept: "application/json" };
      if (body !== undefined) headers["Content-Type"] = "application/json";
      if (usedKey) headers.Authorization = `Bearer ${usedKey}`;
      const response = await fetch(new URL(path, API_BASE), {
        method,
        headers,
        body: body === undefined ? undefined : JSON.stringify(body),
        signal,
        cache: "no-store",
        credentials: "same-origin",
      });
      if (response.status !== 401) return response;
      // Another request may have fixed the key meanwhile; only ask if ours was current.
      if (auth.key === usedKey) await auth.ask(Boolean(usedKey));
    }
  }

  async function readJson(response) {
    try {
      return await response.json();
    } catch {
      return null;
    }
  }

  async function detailOf(response) {
    const body = await readJson(response);
    if (body && body.detail !== undefined) return typeof body.detail === "string" ? body.detail : pretty(body.detail);
    return response.statusText || "no details";
  }

  const sessionPath = (sid, rest = "") => `sessions/${encodeURIComponent(sid)}${rest}`;

  // ---------------------------------------------------------------- notices

  let noticeKind = null;

  function showNotice(text, kind = "info") {
    noticeKind = kind;
    $("notice-text").textContent = text;
    $("notice").hidden = false;
    $("notice").dataset.kind = kind;
  }

  function clearNotice(kind) {
    if (kind && noticeKind !== kind) return;
    noticeKind = null;
    $("notice").hidden = true;
    $("notice-text").textContent = "";
  }

  // ---------------------------------------------------------------- the open session

  const view = {
    sid: null,
    session: null,
    renderedKeys: [],
    cards: new Map(),
    answered: new Set(),
    generation: 0,
    epoch: 0,
    controller: null,
    wake: null,
    dirty: false,
  };

  const loadPending = (sid) => sessionStorage.getItem(PENDING_STORAGE + sid);
  const savePending = (sid, text) => sessionStorage.setItem(PENDING_STORAGE + sid, text);
  const clearPending = (sid) => sessionStorage.removeItem(PENDING_STORAGE + sid);

  /** The session the URL names: an id, null for none, undefined for a hash that is not ours. */
  function parseHash() {
    if (!location.hash || location.hash === "#") return null;
    const match = /^#\/sessions\/([^/?#]+)$/.exec(location.hash);
    if (!match) return undefined;
    try {
      return decodeURIComponent(match[1]);
    } catch {
      return null;
    }
  }

  /** Make ``sid`` (or no session) the open one, and name it in the URL. */
  function navigate(sid) {
    const target = sid ? `#/sessions/${encodeURIComponent(sid)}` : location.pathname + location.search;
    if (sid ? location.hash !== target : location.hash) history.pushState(null, "", target);
    route();
  }

  function route() {
    const sid = parseHash();
    if (sid === undefined || sid === view.sid) return;
    if (sid) openSession(sid);
    else closeSession();
  }

  function stopLoop() {
    view.generation += 1;
    if (view.controller) view.controller.abort();
    view.controller = null;
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
  }

  function closeSession() {
    resetView(null);
  }

  /** Wake the loop now: after this tab acted, or when the tab becomes visible. */
  function wakeLoop() {
    view.dirty = true;
    if (view.wake) {
      const wake = view.wake;
      view.wake = null;
      wake();
    }
  }

  /** Between refreshes of a session that is not running: a few seconds, or until woken. */
  function idleWait() {
    if (view.dirty) return Promise.resolve();
    return new Promise((resolve) => {
      let timer = null;
      const done = () => {
        if (timer !== null) clearTimeout(timer);
        resolve();
      };
      // A hidden tab does not refresh at all; becoming visible wakes it.
      if (!document.hidden) timer = setTimeout(done, IDLE_REFRESH_MS);
      view.wake = done;
    });
  }

  /** The one request loop of the open session; ends when ``generation`` is superseded. */
  async function runLoop(generation, sid) {
    let first = true;
    let failures = 0;
    const current = () => generation === view.generation;
    while (current()) {
      if (!first && view.session && view.session.status !== "running") await idleWait();
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
        const query = running ? `?wait=true&timeout=${LONG_POLL_SECONDS}` : "";
        const response = await api("GET", sessionPath(sid, query), { signal: controller.signal });
        if (response.status === 404) gone = true;
        else if (!response.ok) throw new Error(`${response.status}: ${await detailOf(response)}`);
        else session = await readJson(response);
        if (session && current()) {
          const listed = await api("GET", sessionPath(sid, "/messages"), { signal: controller.signal });
          if (listed.status === 404) gone = true;
          else if (!listed.ok) throw new Error(`${listed.status}: ${await detailOf(listed)}`);
          else messages = await readJson(listed);
        }
      } catch (error) {
        if (!current()) return;
        failures += 1;
        showNotice(`Lost contact with the server (${error.message || error}). Retrying…`, "connection");
        await sleep(Math.min(MAX_BACKOFF_MS, 1000 * 2 ** Math.min(failures, 5)));
        continue;
      } finally {
        if (view.controller === controller) view.controller = null;
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
      applySession(session, Array.isArray(messages) ? messages : []);
    }
  }

  function sessionGone(sid) {
    showNotice(`Session ${sid.slice(0, 8)} no longer exists on the server (deleted, expired, or the server restarted).`);
    clearPending(sid);
    navigate(null);
    refreshSessionList();
  }

  function applySession(session, messages) {
    if (!session || typeof session !== "object") return;
    const previous = view.session ? view.session.status : null;
    view.session = session;
    if (session.status === "idle") clearPending(view.sid);
    renderMessages(messages, session);
    renderStatus();
    renderInterrupts(session);
    if (previous !== session.status) refreshSessionList();
  }

  // ---------------------------------------------------------------- rendering

  function renderStatus() {
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

  function conversationItems(messages, session) {
    const items = messages.filter((m) => m && typeof m === "object").map((message) => ({ kind: "message", message }));
    const reply = session.response;
    if (session.status === "idle" && reply && typeof reply === "object" && !sameMessage(messages[messages.length - 1], reply)) {
      items.push({ kind: "message", message: reply });
    }
    const pending = view.sid ? loadPending(view.sid) : null;
    if (pending !== null && session.status !== "idle") {
      items.push({ kind: "pending", text: pending, failed: session.status === "error" });
    }
    return items;
  }

  function renderMessages(messages, session) {
    const list = $("messages");
    const log = $("log");
    const nearBottom = log.scrollHeight - log.scrollTop - log.clientHeight < 80;
    const items = conversationItems(messages, session);
    const keys = items.map((item) => JSON.stringify(item));
    const old = view.renderedKeys;
    const isPrefix = old.length <= keys.length && old.every((key, i) => key === keys[i]);
    if (isPrefix && old.length === keys.length) return;
    const toolNames = new Map();
    for (const item of items) {
      for (const call of (item.message && item.message.tool_calls) || []) {
        if (call && call.id && call.function) toolNames.set(call.id, call.function.name);
      }
    }
    const start = isPrefix ? old.length : 0;
    if (!isPrefix) list.replaceChildren();
    for (const item of items.slice(start)) list.append(renderItem(item, toolNames));
    view.renderedKeys = keys;
    $("empty").hidden = true;
    if (nearBottom || !isPrefix) log.scrollTop = log.scrollHeight;
  }

  function renderItem(item, toolNames) {
    if (item.kind === "pending") {
      return el(
        "li",
        { class: `msg user pending${item.failed ? " failed" : ""}` },
        el("p", { class: "who" }, "You"),
        el("div", { class: "text" }, item.text),
        el("p", { class: "note" }, item.failed ? "Not saved: this turn failed." : "Sent; the agent is on it."),
      );
    }
    const m = item.message;
    const role = ["user", "assistant", "tool", "system"].includes(m.role) ? m.role : "assistant";
    const content = m.content === undefined || m.content === null ? "" : String(m.content);
    if (role === "tool") {
      const name = m.name || toolNames.get(m.tool_call_id) || "tool";
      return el(
        "li",
        { class: "msg tool" },
        el("details", {}, el("summary", {}, "Result of ", el("code", {}, visibleText(name))), el("pre", { class: "mono" }, visibleJsonString(content))),
      );
    }
    if (role === "system") {
      return el("li", { class: "msg system" }, el("details", {}, el("summary", {}, "System instructions"), el("pre", { class: "mono" }, content)));
    }
    const li = el("li", { class: `msg ${role}` }, el("p", { class: "who" }, role === "user" ? "You" : "Agent"));
    if (content) li.append(el("div", { class: "text" }, content));
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

  // ---------------------------------------------------------------- interrupt cards

  function renderInterrupts(session) {
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
        const card = buildCard(interrupt);
        view.cards.set(id, card);
        section.append(card);
        added.push(card);
      }
    }
    for (const id of [...view.cards.keys()]) if (!live.has(id)) removeCard(id);
    section.hidden = view.cards.size === 0;
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
  function removeCard(id, hadFocus = undefined) {
    const card = view.cards.get(id);
    if (!card) return;
    if (hadFocus === undefined) hadFocus = card.contains(document.activeElement);
    card.remove();
    view.cards.delete(id);
    if (hadFocus) {
      const next = view.cards.values().next().value;
      if (next) next.querySelector(".card-title").focus();
      else $("composer-input").focus();
    }
  }

  function buildCard(interrupt) {
    const payload = interrupt.payload && typeof interrupt.payload === "object" ? interrupt.payload : {};
    const type = typeof payload.type === "string" ? payload.type : String(interrupt.type || "unknown");
    if (type === "tool_approval" && typeof payload.tool_name === "string") return approvalCard(interrupt, payload);
    if (type === "user_input" && validQuestions(payload.questions)) return questionCard(interrupt, payload);
    return customCard(interrupt, payload, type);
  }

  function cardShell(interrupt, kind, ...title) {
    const titleId = uid("card-title");
    const error = el("p", { class: "card-error", role: "alert" });
    const card = el(
      "article",
      { class: `card ${kind}`, "aria-labelledby": titleId, "data-interrupt-id": interrupt.interrupt_id, "data-kind": kind },
      el("h4", { class: "card-title", id: titleId, tabindex: "-1" }, ...title),
    );
    card.cardError = error;
    return card;
  }

  function setBusy(card, busy) {
    card.setAttribute("aria-busy", busy ? "true" : "false");
    for (const control of card.querySelectorAll("button, input, textarea")) control.disabled = busy;
  }

  /** POST the resume; remove the card when accepted, explain and refresh when not. */
  async function resume(card, interrupt, value) {
    const sid = view.sid;
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
      if (!editing) return resume(card, interrupt, { approved: true });
      const edited = parseField(editor, editError, { requireObject: true });
      if (edited !== undefined) resume(card, interrupt, { approved: true, tool_args: edited });
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

    card.append(
      el("p", { class: "card-label", id: uid("args-label") }, "Arguments"),
      argsView,
      editBox,
      el("div", { class: "field" }, el("label", { for: reasonId }, "Reason if you reject (optional)"), reason),
      el("div", { class: "actions" }, approve, reject, edit),
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
    const card = cardShell(interrupt, "questions", questions.length === 1 ? "The agent has a question" : `The agent has ${questions.length} questions`);
    const readers = questions.map((q) => {
      const { node, answer, focusFirst } = questionBlock(q, () => send());
      card.append(node);
      return { q, answer, focusFirst };
    });
    const sendButton = el("button", { class: "button primary", type: "button" }, questions.length === 1 ? "Send answer" : "Send answers");
    const send = () => {
      const answers = {};
      for (const { q, answer, focusFirst } of readers) {
        const value = answer();
        if (!value) {
          card.cardError.textContent = `Answer every question first: "${q.header || q.question}" has no answer yet.`;
          focusFirst();
          return;
        }
        answers[q.question] = value;
      }
      resume(card, interrupt, { answers });
    };
    sendButton.addEventListener("click", send);
    card.append(el("div", { class: "actions" }, sendButton), card.cardError);
    return card;
  }

  /** One question: its options (buttons, or checkboxes when multiSelect) and "Other". */
  function questionBlock(q, submit) {
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
          if (chosen) other.value = "";
        });
        wrapper = el("div", { class: "option" }, control, desc);
      }
      if (preview) wrapper.append(preview);
      controls.push(control);
      labels.set(control, option.label);
      options.append(wrapper);
    });

    other.addEventListener("input", () => {
      if (!multi && other.value.trim()) for (const c of controls) c.setAttribute("aria-pressed", "false");
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
    const words = ["prompt", "message", "question", "text"].map((k) => payload[k]).find((v) => typeof v === "string" && v);
    if (words) card.append(el("p", { class: "card-prompt" }, visibleText(words, { multiline: true })));
    card.append(
      el("p", { class: "card-label" }, "This request has no dedicated form here. What the agent sent:"),
      el("pre", { class: "mono payload" }, markedJson(visibleJson(interrupt.payload))),
      el(
        "div",
        { class: "field" },
        el("label", { for: answerId }, "Your answer (JSON)"),
        el("p", { class: "muted hint", id: hintId }, 'Any JSON value, for example {"hex": "#4ECDC4"} or "yes". Ctrl+Enter sends.'),
        field,
        error,
      ),
      el("div", { class: "actions" }, send),
      card.cardError,
    );
    return card;
  }

  // ---------------------------------------------------------------- sessions list

  let listRequest = 0;

  async function refreshSessionList() {
    const ticket = ++listRequest;
    let list;
    try {
      const response = await api("GET", "sessions");
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
        return el(
          "li",
          {},
          el(
            "a",
            { href: `#/sessions/${encodeURIComponent(s.session_id)}`, "data-sid": s.session_id, title: s.session_id },
            el("span", { class: "session-id" }, s.session_id.slice(0, 8)),
            el("span", { class: "session-meta" }, `${STATUS_TEXT[status] ? status : status || "unknown"}, ${count} message${count === 1 ? "" : "s"}`),
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

  function markCurrentInList() {
    for (const link of $("session-list").querySelectorAll("a")) {
      if (link.dataset.sid === view.sid) link.setAttribute("aria-current", "page");
      else link.removeAttribute("aria-current");
    }
  }

  async function createSession() {
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

  async function deleteSession() {
    const sid = view.sid;
    if (!sid) return;
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

  async function sendMessage(event) {
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

  /** The stored messages as last rendered (pending and synthetic items excluded). */
  function lastMessages() {
    return view.renderedKeys.map((key) => JSON.parse(key)).filter((item) => item.kind === "message").map((item) => item.message);
  }

  // ---------------------------------------------------------------- wiring

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
    if (!view.sid) renderStatus();
  }

  init();
})();
