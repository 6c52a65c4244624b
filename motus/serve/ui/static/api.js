// The session API of this server, and the API key it may ask for.

import { $, pretty } from "./dom.js";

// The page lives at <root>/ui/, the API at <root>/.
const API_BASE = new URL("../", document.baseURI);
const KEY_STORAGE = "motus.apiKey";

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
    // Another key may be another person: who it is is asked again (app.js, GET /whoami).
    window.dispatchEvent(new Event("motus:key"));
    overlay.hidden = true;
    $("app").inert = false;
    resolve();
  };
  form.addEventListener("submit", submit);
}

/** fetch() against the API; on 401 ask for a key and retry. Network errors throw. */
export async function api(method, path, { body, signal, headers: extra } = {}) {
  for (;;) {
    const usedKey = auth.key;
    const headers = { Accept: "application/json", ...(extra || {}) };
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
    // Read the refusal to its end: the request is over (an unread body keeps it open).
    await response.text().catch(() => "");
    // Another request may have fixed the key meanwhile; only ask if ours was current.
    if (auth.key === usedKey) await auth.ask(Boolean(usedKey));
    // Given up on while the key was asked for (its loop was replaced): not sent again.
    if (signal && signal.aborted) throw new DOMException("The request was aborted while the key was asked for", "AbortError");
  }
}

export async function readJson(response) {
  try {
    return await response.json();
  } catch {
    return null;
  }
}

export async function detailOf(response) {
  const body = await readJson(response);
  if (body && body.detail !== undefined) return typeof body.detail === "string" ? body.detail : pretty(body.detail);
  return response.statusText || "no details";
}

/** How long the server asked us to wait before trying again (a 503's Retry-After, in
 *  seconds), in ms, within [0.5 s, 60 s]; ``fallback`` ms when it did not say. */
export function retryAfterMs(headers, fallback) {
  const seconds = Number.parseFloat(headers && headers.get ? headers.get("Retry-After") : "");
  if (!Number.isFinite(seconds)) return fallback;
  return Math.min(60000, Math.max(500, seconds * 1000));
}

export const sessionPath = (sid, rest = "") => `sessions/${encodeURIComponent(sid)}${rest}`;
