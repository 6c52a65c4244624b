// The audit of the open session (GET /sessions/{id}/audit): who decided what, and when;
// and the tools remembered for this session (GET /sessions/{id}/grants), each revocable.

import { $, el } from "./dom.js";
import { visibleText, visibleJson, markedJson } from "./text.js";
import { api, readJson, detailOf, sessionPath } from "./api.js";
import { view, server } from "./state.js";
import { timeElement } from "./time.js";
import { showNotice } from "./notice.js";

export function toggleAudit() {
  const open = $("audit-view").hidden;
  $("audit-view").hidden = !open;
  $("show-audit").setAttribute("aria-expanded", open ? "true" : "false");
  if (open) {
    renderAudit();
    loadGrants();
    $("audit-title").focus();
  }
}

function describe(record) {
  const payload = record.payload && typeof record.payload === "object" ? record.payload : {};
  const value = record.value;
  if (record.kind === "grant") return ["Remembered ", el("code", {}, visibleText(record.tool_name ?? "a tool")), " for this session"];
  if (record.kind === "revoke") return ["Forgot the approval of ", el("code", {}, visibleText(record.tool_name ?? "a tool"))];
  if (typeof payload.tool_name === "string") {
    const approved = Boolean(value && typeof value === "object" && value.approved === true);
    // An approval towards a quorum ("approval") says where it stood; a resolution lists them all.
    const count = record.kind === "approval" && Array.isArray(record.approvals) && Number.isInteger(record.quorum) ? ` (${record.approvals.length} of ${record.quorum} approvals)` : "";
    const all = record.kind === "resolved" && Array.isArray(record.approvals) && record.approvals.length ? ` (approvals: ${record.approvals.map((a) => String(a && a.by)).join(", ")})` : "";
    return [approved ? "Approved " : "Rejected ", el("code", {}, visibleText(payload.tool_name)), record.reason === "timeout" ? " (timed out)" : "", count, ...visibleText(all)];
  }
  return ["Answered ", el("code", {}, visibleText(record.type || payload.type || "interrupt")), record.reason === "timeout" ? " (timed out)" : ""];
}

export function renderAudit() {
  if ($("audit-view").hidden) return;
  const list = $("audit-list");
  if (server.audit === false) {
    $("audit-state").textContent = "This server keeps no audit.";
    list.replaceChildren();
    return;
  }
  const records = Array.isArray(view.audit) ? view.audit : [];
  $("audit-state").textContent = records.length ? "" : "No decisions yet.";
  list.replaceChildren(
    ...records.map((record) =>
      el(
        "li",
        { class: `audit-entry ${record.kind}` },
        el("p", {}, timeElement(record.at), " ", el("strong", { class: "record-by" }, visibleText(record.by ?? "")), ": ", describe(record)),
        record.kind === "resolved" || record.kind === "approval" ? el("details", {}, el("summary", {}, "Request and answer"), el("pre", { class: "mono" }, markedJson(visibleJson({ payload: record.payload, value: record.value })))) : null,
      )),
  );
}

async function loadGrants() {
  const sid = view.sid;
  const box = $("grant-list");
  let response;
  try {
    response = await api("GET", sessionPath(sid, "/grants"));
  } catch {
    return;
  }
  if (sid !== view.sid) return;
  if (!response.ok) {
    box.replaceChildren();
    return;
  }
  const grants = (await readJson(response)) || [];
  box.replaceChildren(
    ...grants.map((grant) => {
      const revoke = el("button", { class: "button small danger", type: "button", "aria-label": `Revoke ${grant.tool_name}` }, "Revoke");
      revoke.addEventListener("click", async () => {
        revoke.disabled = true;
        const answer = await api("DELETE", sessionPath(sid, `/grants/${encodeURIComponent(grant.tool_name)}`));
        if (!answer.ok && answer.status !== 404) showNotice(`Could not revoke (${answer.status}): ${await detailOf(answer)}`);
        loadGrants();
      });
      return el(
        "li",
        { class: "grant" },
        el("code", {}, visibleText(grant.tool_name)),
        " approved for this session by ",
        el("strong", {}, visibleText(grant.granted_by)),
        " ",
        timeElement(grant.granted_at),
        " ",
        revoke,
      );
    }),
  );
  $("grants-state").textContent = grants.length ? "Remembered approvals:" : "No remembered approvals.";
}
