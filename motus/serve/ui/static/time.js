// Times: the server's ISO 8601 (UTC) shown in the reader's local time.

import { el } from "./dom.js";

export function parseTime(iso) {
  if (typeof iso !== "string" || !iso) return null;
  const when = new Date(iso);
  return Number.isNaN(when.getTime()) ? null : when;
}

/** A <time> element: "14:03:27" today, else "2024-05-01 14:03"; the full time in its title. */
export function timeElement(iso, className = "when") {
  const when = parseTime(iso);
  if (!when) return null;
  const today = new Date().toDateString() === when.toDateString();
  const pad = (n) => String(n).padStart(2, "0");
  const clock = `${pad(when.getHours())}:${pad(when.getMinutes())}:${pad(when.getSeconds())}`;
  const shown = today ? clock : `${when.getFullYear()}-${pad(when.getMonth() + 1)}-${pad(when.getDate())} ${clock}`;
  return el("time", { class: className, datetime: when.toISOString(), title: when.toString() }, shown);
}

/** "4:05" left until ``iso``, or null once it has passed. */
export function remaining(iso, now = Date.now()) {
  const when = parseTime(iso);
  if (!when) return null;
  const seconds = Math.ceil((when.getTime() - now) / 1000);
  if (seconds <= 0) return null;
  const h = Math.floor(seconds / 3600);
  const m = Math.floor((seconds % 3600) / 60);
  const s = seconds % 60;
  const pad = (n) => String(n).padStart(2, "0");
  return h ? `${h}:${pad(m)}:${pad(s)}` : `${m}:${pad(s)}`;
}

/** Keep every ``.countdown[data-expires]`` in ``root`` current (one timer for the page). */
let ticking = null;
export function startCountdowns() {
  if (ticking) return;
  const tick = () => {
    for (const node of document.querySelectorAll(".countdown[data-expires]")) {
      const left = remaining(node.dataset.expires);
      const text = left ? `Expires in ${left}` : "Expired: the agent's default applies";
      if (node.textContent !== text) node.textContent = text;
      node.classList.toggle("soon", Boolean(left) && parseTime(node.dataset.expires).getTime() - Date.now() < 60000);
    }
  };
  tick();
  ticking = setInterval(tick, 1000);
}

export function countdown(expiresAt) {
  if (!parseTime(expiresAt)) return null;
  const left = remaining(expiresAt);
  return el("p", { class: "countdown", "data-expires": expiresAt }, left ? `Expires in ${left}` : "Expired: the agent's default applies");
}
