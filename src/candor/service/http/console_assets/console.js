// candor approvals console (docs/console.md): lists the runs that wait for an answer and resumes each with ONE
// strict batch. Plain browser JavaScript, no dependencies, no build step; it only calls the /v1 API. The run
// inspector (threads, a thread's runs, a run's attempts and steps) is inspector.js and run_page.js, loaded after it.
"use strict";

const KEY_STORAGE = "candor.console.key";
const POLL_MS = 5000; // new waiting runs on other threads: there is no workspace-wide stream, so poll the list
const SUBMIT_TRIES = 3; // tries of one submission on a network error, 5xx or 429 (same Idempotency-Key each time)

const state = {
  key: sessionStorage.getItem(KEY_STORAGE),
  runs: new Map(), // run id -> {run, card, answered: successor id or null}
  streams: new Map(), // thread id -> AbortController
  pollTimer: null,
  submissions: new Map(), // run id -> {body, key}: a retried identical batch reuses its key
};

const $ = (id) => document.getElementById(id);

function el(tag, attrs = {}, ...children) {
  // Text only through textContent: tool arguments and error details never become markup.
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (name === "text") node.textContent = value;
    else if (name === "class") node.className = value;
    else node.setAttribute(name, value);
  }
  for (const child of children) if (child) node.append(child);
  return node;
}

function pretty(value) {
  return JSON.stringify(value, null, 2);
}

function newIdempotencyKey() {
  const bytes = new Uint8Array(16);
  crypto.getRandomValues(bytes);
  return "console_" + Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// --- the API --------------------------------------------------------------------------------------------------

class ApiError extends Error {
  constructor(status, envelope) {
    const error = (envelope && envelope.error) || { code: "http_" + status, message: "unexpected answer", details: {} };
    super(`${status} ${error.code}: ${error.message}`);
    this.status = status;
    this.error = error;
  }
}

async function api(method, path, { body, idempotencyKey } = {}) {
  const headers = { Authorization: "Bearer " + state.key, Accept: "application/json" };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  if (idempotencyKey) headers["Idempotency-Key"] = idempotencyKey;
  const response = await fetch(path, {
    method, headers, body: body === undefined ? undefined : JSON.stringify(body), cache: "no-store",
  });
  let payload = null;
  try {
    payload = await response.json();
  } catch (_) {
    payload = null;
  }
  if (response.status === 401) {
    forgetKey("The key was refused (401 unauthenticated). Enter another key.");
  }
  if (!response.ok) throw new ApiError(response.status, payload);
  return { status: response.status, body: payload };
}

async function waitingRuns() {
  const runs = [];
  let cursor = null;
  for (let page = 0; page < 10; page++) {
    const query = new URLSearchParams({ awaiting: "resume", limit: "100" });
    if (cursor) query.set("cursor", cursor);
    const { body } = await api("GET", "/v1/runs?" + query);
    runs.push(...body.items);
    cursor = body.next_cursor;
    if (!cursor) break;
  }
  return runs;
}

// --- the thread stream: fetch-based SSE (EventSource cannot send the Authorization header) ----------------------

function parseSse(onEvent) {
  let event = "";
  let data = [];
  let id = null;
  return (line) => {
    if (line === "") {
      if (data.length) onEvent({ event: event || "message", data: data.join("\n"), id });
      event = "";
      data = [];
      return;
    }
    if (line.startsWith(":")) return; // keep-alive comment
    const colon = line.indexOf(":");
    const name = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (name === "event") event = value;
    else if (name === "data") data.push(value);
    else if (name === "id") id = value || null;
  };
}

async function streamThread(threadId, signal, onEvent) {
  let lastEventId = null;
  let delay = 500;
  while (!signal.aborted) {
    try {
      const headers = { Authorization: "Bearer " + state.key, Accept: "text/event-stream" };
      if (lastEventId) headers["Last-Event-ID"] = lastEventId;
      const response = await fetch(`/v1/threads/${encodeURIComponent(threadId)}/stream`,
        { headers, signal, cache: "no-store" });
      if ([401, 403, 404].includes(response.status)) return; // access ended: nothing to reconnect to
      if (!response.ok) throw new Error("stream answered " + response.status);
      setLive(true);
      delay = 500;
      const feed = parseSse((event) => {
        if (event.id) lastEventId = event.id;
        onEvent(event);
      });
      const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
      let buffer = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += value;
        for (;;) {
          const at = buffer.search(/\r\n|\r|\n/);
          if (at < 0 || (buffer[at] === "\r" && at === buffer.length - 1)) break; // a lone \r may precede \n
          const width = buffer[at] === "\r" && buffer[at + 1] === "\n" ? 2 : 1;
          feed(buffer.slice(0, at));
          buffer = buffer.slice(at + width);
        }
      }
    } catch (_) {
      if (signal.aborted) return;
    }
    setLive(false);
    await sleep(delay); // reconnect with Last-Event-ID after a backoff
    delay = Math.min(delay * 2, 10000);
  }
}

function setLive(on) {
  $("live").classList.toggle("on", on);
}

function watchThread(threadId) {
  if (state.streams.has(threadId)) return;
  const controller = new AbortController();
  state.streams.set(threadId, controller);
  streamThread(threadId, controller.signal, (event) => onThreadEvent(threadId, event));
}

function stopStreams(keep = new Set()) {
  for (const [threadId, controller] of state.streams) {
    if (!keep.has(threadId)) {
      controller.abort();
      state.streams.delete(threadId);
    }
  }
}

let refreshQueued = null;
function onThreadEvent(threadId, event) {
  // `changed` says the thread moved (a run sealed, someone else answered); re-read the list and the successors.
  if (event.event === "changed" || event.event === "boundary") {
    clearTimeout(refreshQueued);
    refreshQueued = setTimeout(() => refresh(), 100);
  }
  for (const entry of state.runs.values()) {
    if (entry.run.thread_id === threadId && entry.card) {
      const live = entry.card.querySelector(".last-event");
      if (live) live.textContent = `live: ${event.event}` + (event.id ? ` #${event.id}` : "");
    }
  }
}

// --- rendering ---------------------------------------------------------------------------------------------------

function pendingItems(run) {
  const pending = run.pending || { approvals: [], calls: [] };
  return [...pending.approvals, ...pending.calls];
}

// A question's text is usually both an argument and a metadata entry (`CallDeferred(metadata={"question": …})`):
// shown once, as text, and left out of the JSON blocks.
function questionText(item) {
  if (item.kind !== "question") return null;
  for (const source of [item.metadata, item.arguments]) {
    if (source && typeof source.question === "string") return source.question;
  }
  return null;
}

function withoutQuestion(values, question) {
  const rest = { ...(values || {}) };
  if (question !== null && rest.question === question) delete rest.question;
  return rest;
}

// Metadata entries that only repeat an argument add nothing.
function metadataBeyond(item, question) {
  const extra = {};
  for (const [key, value] of Object.entries(withoutQuestion(item.metadata, question))) {
    if (JSON.stringify(value) !== JSON.stringify((item.arguments || {})[key])) extra[key] = value;
  }
  return extra;
}

function renderItem(item, runId) {
  const id = item.tool_call_id;
  const node = el("div", { class: "item", "data-call-id": id, "data-kind": item.kind });
  const kind = el("span", { class: "kind " + item.kind, text: item.kind });
  node.append(el("div", {}, el("span", { class: "tool", text: item.tool_name }), kind,
    el("span", { class: "meta", text: "  " + id })));
  const question = questionText(item);
  if (question !== null) node.append(el("p", { class: "question-text", text: question }));
  const args = withoutQuestion(item.arguments, question);
  if (question === null || Object.keys(args).length) {
    node.append(el("p", { class: "caption", text: "arguments" }), el("pre", { class: "arguments", text: pretty(args) }));
  }
  const extra = metadataBeyond(item, question);
  if (Object.keys(extra).length) {
    node.append(el("p", { class: "caption", text: "metadata" }), el("pre", { class: "metadata", text: pretty(extra) }));
  }
  // One radio group per item of this card: call ids repeat across runs (deterministic ids, a second run of the same
  // script), and a shared name would make answering one card clear the other's choice.
  const name = "choice-" + runId + "-" + id;
  const choice = (value, label, checked) => {
    const input = el("input", { type: "radio", name, value });
    input.checked = checked;
    return el("label", {}, input, document.createTextNode(" " + label));
  };
  if (item.kind === "approval") {
    node.append(el("div", { class: "choices" },
      choice("approve", "Approve", false), choice("edit", "Approve with edited arguments", false),
      choice("deny", "Deny", false)));
    const editor = el("textarea", { class: "editor", "aria-label": "Edited arguments (JSON)", spellcheck: "false" });
    editor.value = pretty(item.arguments);
    editor.hidden = true;
    const reason = el("input", { type: "text", class: "reason", placeholder: "Reason (shown to the agent)",
      "aria-label": "Reason for the denial" });
    reason.hidden = true;
    node.append(editor, reason);
  } else {
    node.append(el("div", { class: "choices" },
      choice("answer", item.kind === "question" ? "Answer" : "Return a value", false),
      choice("fail", "Decline", false)));
    const answer = el("textarea", { class: "answer", "aria-label": "Answer", spellcheck: "false",
      placeholder: item.kind === "question" ? "Your answer (text)" : "The call's result (JSON)" });
    answer.hidden = true;
    const reason = el("input", { type: "text", class: "reason", placeholder: "Why it is declined",
      "aria-label": "Why it is declined" });
    reason.hidden = true;
    node.append(answer, reason);
  }
  node.append(el("p", { class: "invalid", hidden: "" }));
  return node;
}

// The answer of one item, or {error} when it is not complete or not valid.
function readAnswer(node, item) {
  const picked = node.querySelector("input[type=radio]:checked");
  const invalid = (message) => ({ error: message });
  if (!picked) return invalid("choose an answer");
  const reason = node.querySelector(".reason").value.trim();
  switch (picked.value) {
    case "approve":
      return { group: "approvals", answer: { action: "approve" } };
    case "edit": {
      let value;
      try {
        value = JSON.parse(node.querySelector(".editor").value);
      } catch (e) {
        return invalid("the arguments are not valid JSON: " + e.message);
      }
      if (value === null || typeof value !== "object" || Array.isArray(value)) {
        return invalid("the arguments must be a JSON object");
      }
      return { group: "approvals", answer: { action: "approve", arguments: value } };
    }
    case "deny":
      return { group: "approvals", answer: reason ? { action: "deny", reason } : { action: "deny" } };
    case "answer": {
      const text = node.querySelector(".answer").value;
      if (item.kind === "question") {
        if (!text.trim()) return invalid("write an answer");
        return { group: "calls", answer: { status: "returned", value: text } };
      }
      try {
        return { group: "calls", answer: { status: "returned", value: JSON.parse(text) } };
      } catch (e) {
        return invalid("the result is not valid JSON: " + e.message);
      }
    }
    case "fail":
      if (!reason) return invalid("say why it is declined");
      return { group: "calls", answer: { status: "failed", message: reason } };
  }
  return invalid("choose an answer");
}

// The strict batch (§8.6): every pending item answered, or the list of problems.
function buildBatch(card, run) {
  const body = { approvals: {}, calls: {} };
  const problems = [];
  for (const item of pendingItems(run)) {
    const node = card.querySelector(`.item[data-call-id="${CSS.escape(item.tool_call_id)}"]`);
    const result = readAnswer(node, item);
    const message = node.querySelector(".invalid");
    if (result.error) {
      problems.push(`${item.tool_call_id}: ${result.error}`);
      message.textContent = result.error;
      message.hidden = false;
    } else {
      body[result.group][item.tool_call_id] = result.answer;
      message.hidden = true;
    }
  }
  const note = card.querySelector(".note").value.trim();
  if (note) body.input = { content: [{ type: "text", text: note }] };
  return { body, problems };
}

function syncControls(card, run) {
  for (const item of pendingItems(run)) {
    const node = card.querySelector(`.item[data-call-id="${CSS.escape(item.tool_call_id)}"]`);
    const picked = node.querySelector("input[type=radio]:checked");
    const value = picked ? picked.value : null;
    const editor = node.querySelector(".editor");
    if (editor) editor.hidden = value !== "edit";
    const answer = node.querySelector(".answer");
    if (answer) answer.hidden = value !== "answer";
    node.querySelector(".reason").hidden = !(value === "deny" || value === "fail");
  }
  const { problems } = buildBatch(card, run);
  for (const node of card.querySelectorAll(".item .invalid")) {
    // Only flag an item once something was chosen for it: an untouched item is just not answered yet.
    const item = node.closest(".item");
    if (!item.querySelector("input[type=radio]:checked")) node.hidden = true;
  }
  card.querySelector(".submit").disabled = problems.length > 0;
}

function renderRun(run) {
  const card = el("article", { class: "run", "data-run-id": run.id, "data-thread-id": run.thread_id,
    "data-agent": run.agent });
  card.append(el("h2", { text: `Agent ${run.agent} asks for ${pendingItems(run).length} answer(s)` }));
  const since = run.sealed_at ? new Date(run.sealed_at).toLocaleString() : "";
  card.append(el("p", { class: "meta" }, document.createTextNode("agent "), el("code", { text: run.agent }),
    document.createTextNode(" · for key "), el("code", { class: "principal", text: run.principal_id }),
    document.createTextNode(" · run "),
    el("a", { href: "/console/runs/" + encodeURIComponent(run.id), class: "inspect" }, el("code", { text: run.id })),
    document.createTextNode(" · thread "),
    el("a", { href: "/console/threads/" + encodeURIComponent(run.thread_id) }, el("code", { text: run.thread_id })),
    document.createTextNode(since ? " · waiting since " + since : ""),
    document.createTextNode(" · "), el("span", { class: "last-event", text: "" })));
  for (const item of pendingItems(run)) card.append(renderItem(item, run.id));
  const note = el("input", { type: "text", class: "note", placeholder: "Optional message to the agent",
    "aria-label": "Optional message to the agent" });
  const submit = el("button", { type: "button", class: "submit primary", text: "Submit answers" });
  submit.disabled = true;
  card.append(el("div", { class: "actions" }, note, submit));
  card.append(el("div", { class: "rejection", hidden: "" }));
  card.append(el("div", { class: "outcome", hidden: "" }));
  card.addEventListener("input", () => syncControls(card, run));
  card.addEventListener("change", () => syncControls(card, run));
  submit.addEventListener("click", () => submitBatch(card, run));
  return card;
}

function showRejection(card, error) {
  const box = card.querySelector(".rejection");
  box.replaceChildren(
    el("h3", { text: "The batch was rejected; nothing was changed." }),
    el("p", {}, el("strong", { class: "code", text: error.code }), document.createTextNode(" — " + error.message)),
    el("pre", { class: "details", text: pretty(error.details || {}) }),
    el("p", { class: "meta", text: "request id " + (error.request_id || "—") }),
  );
  box.hidden = false;
}

function showOutcome(card, successor) {
  const box = card.querySelector(".outcome");
  box.replaceChildren(
    el("p", {}, document.createTextNode("Answered. Successor run "), el("code", { class: "successor", text: successor.id }),
      document.createTextNode(": "), el("strong", { class: "successor-status", text: successor.status })),
  );
  if (successor.status === "completed" && successor.output !== null) {
    box.append(el("pre", { class: "successor-output", text: typeof successor.output === "string"
      ? successor.output : pretty(successor.output) }));
  }
  if (successor.failure) box.append(el("pre", { class: "successor-failure", text: pretty(successor.failure) }));
  box.hidden = false;
  // The heading said what the run asked for; once answered it says so (no stale count under "No run is waiting").
  card.classList.add("answered");
  card.querySelector("h2").textContent = `Agent ${card.dataset.agent}: answered`;
  for (const control of card.querySelectorAll("input, textarea, button")) control.disabled = true;
}

async function submitBatch(card, run) {
  const { body, problems } = buildBatch(card, run);
  if (problems.length) return; // the button is disabled then; a stale click changes nothing
  const text = JSON.stringify(body);
  // The same batch keeps its key across retries and re-clicks (a replay answers the same successor, §8.2); a
  // changed batch is another request and gets a new key.
  let submission = state.submissions.get(run.id);
  if (!submission || submission.body !== text) {
    submission = { body: text, key: newIdempotencyKey() };
    state.submissions.set(run.id, submission);
  }
  const button = card.querySelector(".submit");
  button.disabled = true;
  card.querySelector(".rejection").hidden = true;
  setStatus("Submitting answers for " + run.id + "…");
  for (let attempt = 1; attempt <= SUBMIT_TRIES; attempt++) {
    try {
      const { body: successor } = await api("POST", `/v1/runs/${encodeURIComponent(run.id)}/resume`,
        { body, idempotencyKey: submission.key });
      const entry = state.runs.get(run.id);
      if (entry) entry.answered = successor.id;
      showOutcome(card, successor);
      setStatus("Answered " + run.id + ".");
      watchThread(run.thread_id);
      return;
    } catch (error) {
      const retryable = !(error instanceof ApiError) || error.status >= 500 || error.status === 429;
      if (retryable && attempt < SUBMIT_TRIES) {
        await sleep(500 * attempt);
        continue;
      }
      if (error instanceof ApiError) showRejection(card, error.error);
      else showRejection(card, { code: "network_error", message: String(error), details: {}, request_id: null });
      setStatus("The answers for " + run.id + " were not accepted.");
      button.disabled = false;
      return;
    }
  }
}

function setStatus(text) {
  $("status").textContent = text;
}

// --- the list ----------------------------------------------------------------------------------------------------

let refreshing = null;
async function refresh() {
  if (!state.key) return;
  if (refreshing) return refreshing;
  refreshing = (async () => {
    try {
      const runs = await waitingRuns();
      const ids = new Set(runs.map((run) => run.id));
      const container = $("runs");
      for (const run of runs) {
        if (!state.runs.has(run.id)) {
          const card = renderRun(run);
          state.runs.set(run.id, { run, card, answered: null });
          container.append(card);
        }
      }
      for (const [id, entry] of state.runs) {
        if (ids.has(id)) continue;
        if (entry.answered) {
          // Keep an answered card in view and follow its successor until it seals.
          try {
            const { body } = await api("GET", "/v1/runs/" + encodeURIComponent(entry.answered));
            showOutcome(entry.card, body);
          } catch (_) { /* the next refresh tries again */ }
        } else {
          entry.card.remove(); // answered elsewhere, or the thread moved on
          state.runs.delete(id);
        }
      }
      const threads = new Set([...state.runs.values()].map((entry) => entry.run.thread_id));
      threads.forEach(watchThread);
      stopStreams(threads);
      $("empty").hidden = runs.length > 0;
      setStatus(`${runs.length} run(s) waiting · updated ${new Date().toLocaleTimeString()}`);
    } catch (error) {
      if (error instanceof ApiError && error.status !== 401) setStatus("Could not list the waiting runs: " + error.message);
      else if (!(error instanceof ApiError)) setStatus("Could not reach the service: " + error);
    } finally {
      refreshing = null;
    }
  })();
  return refreshing;
}

function start() {
  $("key-form").hidden = true;
  $("session").hidden = false;
  $("nav").hidden = false;
  if (showInspector()) return; // a threads, thread or run page (inspector.js)
  startApprovals();
}

function startApprovals() {
  $("approvals-view").hidden = false;
  refresh();
  clearInterval(state.pollTimer);
  state.pollTimer = setInterval(refresh, POLL_MS);
}

function stopApprovals() {
  clearInterval(state.pollTimer);
  state.pollTimer = null;
  stopStreams();
}

function forgetKey(message) {
  sessionStorage.removeItem(KEY_STORAGE);
  state.key = null;
  stopInspector();
  $("inspector").replaceChildren(); // no data of the forgotten key stays on screen
  $("inspector").hidden = true;
  $("nav").hidden = true;
  clearInterval(state.pollTimer);
  stopStreams();
  state.runs.clear();
  $("runs").replaceChildren();
  $("session").hidden = true;
  $("empty").hidden = true;
  $("key-form").hidden = false;
  const error = $("key-error");
  error.textContent = message || "";
  error.hidden = !message;
  setStatus("");
}

document.addEventListener("DOMContentLoaded", () => {
  $("key-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const key = $("key").value.trim();
    if (!key) return;
    state.key = key;
    sessionStorage.setItem(KEY_STORAGE, key);
    $("key").value = "";
    $("key-error").hidden = true;
    start();
  });
  $("forget").addEventListener("click", () => forgetKey());
  $("refresh").addEventListener("click", () => (inspectorShown() ? showInspector() : refresh()));
  if (state.key) start();
  else forgetKey();
});
