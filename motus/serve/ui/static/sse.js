// Server-sent events over fetch(): like EventSource, but it can send the API key
// (EventSource cannot set an Authorization header) and it tells a 404 (a server without
// event streams, such as the reference product) from a dropped connection.

import { api } from "./api.js";

/**
 * Read one stream of ``path`` until it ends or ``signal`` aborts it.
 * ``onEvent({id, kind, data})`` runs for each complete event (data parsed as JSON).
 * Resolves to {status} when the server refused the stream (not 200), or to {status: 200}
 * when a stream that was open ended; rejects on a network error or abort.
 */
export async function readStream(path, { lastId = null, signal, onOpen, onEvent }) {
  const headers = { Accept: "text/event-stream" };
  if (lastId !== null && lastId !== undefined) headers["Last-Event-ID"] = String(lastId);
  const response = await api("GET", path, { signal, headers });
  if (response.status !== 200 || !response.body) {
    try { await response.body?.cancel(); } catch { /* already gone */ }
    return { status: response.status, headers: response.headers };
  }
  if (onOpen) onOpen();
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  let id = null;
  let kind = "message";
  let data = [];
  const line = (text) => {
    if (text === "") {
      if (data.length) {
        let parsed;
        try { parsed = JSON.parse(data.join("\n")); } catch { parsed = { text: data.join("\n") }; }
        onEvent({ id, kind, data: parsed && typeof parsed === "object" ? parsed : { value: parsed } });
      }
      id = null;
      kind = "message";
      data = [];
      return;
    }
    if (text.startsWith(":")) return;
    const colon = text.indexOf(":");
    const name = colon < 0 ? text : text.slice(0, colon);
    let value = colon < 0 ? "" : text.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (name === "id" && /^\d+$/.test(value)) id = Number(value);
    else if (name === "event") kind = value;
    else if (name === "data") data.push(value);
  };
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += value;
      let end;
      while ((end = buffer.search(/\r\n|\r|\n/)) >= 0) {
        const match = buffer.slice(end).startsWith("\r\n") ? 2 : 1;
        line(buffer.slice(0, end));
        buffer = buffer.slice(end + match);
      }
    }
  } finally {
    try { reader.releaseLock(); } catch { /* aborted */ }
  }
  return { status: 200 };
}
