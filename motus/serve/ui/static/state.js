// State of the open session, shared by the modules that show it.

const PENDING_STORAGE = "motus.pending.";
export const STATUS_TEXT = {
  idle: "Ready",
  running: "The agent is working…",
  interrupted: "Waiting for your answer",
  error: "The turn failed",
};

export const view = {
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
  // Event streams: whether this server has them (null: not known yet), this loop's stream.
  streaming: false,
  lastEventId: null,
  // The session's audit (who resolved what), or null when not read (or not offered).
  audit: null,
  auditDirty: true,
  // Times of stored messages (index -> ISO), and of the turn seen live: when it started.
  times: {},
  timesFrom: null,
  renderedMessages: [],
  turnStartedAt: null,
  turnEndedAt: null,
};

// me: this tab's key as GET /whoami says ({name, roles, read_only}), or null when not known.
export const server = { events: null, audit: null, me: null };

const TIMES_STORAGE = "motus.times.";
export function loadTimes(sid) {
  try {
    const parsed = JSON.parse(localStorage.getItem(TIMES_STORAGE + sid) || "{}");
    return parsed && typeof parsed === "object" ? parsed : {};
  } catch {
    return {};
  }
}
export function saveTimes(sid, times) {
  try {
    localStorage.setItem(TIMES_STORAGE + sid, JSON.stringify(times));
  } catch { /* storage full or off: times are a nicety */ }
}

export const loadPending = (sid) => sessionStorage.getItem(PENDING_STORAGE + sid);
export const savePending = (sid, text) => sessionStorage.setItem(PENDING_STORAGE + sid, text);
export const clearPending = (sid) => sessionStorage.removeItem(PENDING_STORAGE + sid);
