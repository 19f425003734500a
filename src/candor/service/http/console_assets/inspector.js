// candor run inspector (docs/console.md): the workspace's threads, a thread's runs as a timeline, and a run's
// attempts and steps with each tool call's recovery outcome. Loaded after console.js, whose helpers it uses (el, $,
// api, streamThread, setLive). Every text from the API goes in as text (textContent), never as markup.
"use strict";

const INSPECTOR_PAGES = 10; // pages of 100 read at most for one list (a thread's runs, a run's messages)
const LIVE_STATUSES = new Set(["accepted", "running"]);

const inspector = {
  stream: null, // AbortController of the thread stream the page follows
  reload: null, // pending debounced re-render
  generation: 0, // bumped on every navigation: a late answer for an older page is dropped
  cursors: [], // the threads list's previous cursors, for "Previous page"
};

// --- routing -----------------------------------------------------------------------------------------------------

// The page a console path shows, or null for the approvals list (`/console`).
function inspectorRoute(pathname, search) {
  const match = pathname.match(/^\/console\/(threads|runs)(?:\/([^/]+))?\/?$/);
  if (!match) return null;
  const id = match[2] ? decodeURIComponent(match[2]) : null;
  if (match[1] === "runs") return id ? { page: "run", id } : null;
  if (id) return { page: "thread", id };
  return { page: "threads", query: new URLSearchParams(search) };
}

function inspectorShown() {
  return inspectorRoute(location.pathname, location.search) !== null;
}

function navigate(href) {
  history.pushState(null, "", href);
  if (!showInspector()) {
    $("inspector").hidden = true;
    startApprovals();
  }
}

// Renders the inspector page of the current location; false when the location is the approvals list.
function showInspector() {
  const route = inspectorRoute(location.pathname, location.search);
  for (const link of document.querySelectorAll("#nav a")) {
    const current = route ? "threads" : "approvals";
    link.classList.toggle("current", link.dataset.view === current);
  }
  if (!route) return false;
  stopApprovals();
  $("approvals-view").hidden = true;
  const view = $("inspector");
  view.hidden = false;
  stopInspector();
  const generation = ++inspector.generation;
  const render = { threads: renderThreadsPage, thread: renderThreadPage, run: renderRunPage }[route.page];
  render(route, generation).catch((error) => showLoadError(error, generation));
  return true;
}

function stopInspector() {
  if (inspector.stream) inspector.stream.abort();
  inspector.stream = null;
  clearTimeout(inspector.reload);
  inspector.generation++;
}

function current(generation) {
  return generation === inspector.generation;
}

function showLoadError(error, generation) {
  if (!current(generation)) return;
  const view = $("inspector");
  if (error instanceof ApiError && error.status === 401) return; // console.js sends the user to the key form
  const text = error instanceof ApiError ? `${error.error.code}: ${error.error.message}` : String(error);
  view.replaceChildren(el("p", { class: "error load-error", role: "alert", text: "Could not load this page — " + text }));
}

// Follow the thread stream while the shown object can still change; `onChange` re-renders (debounced).
function followThread(threadId, generation, onChange) {
  const controller = new AbortController();
  inspector.stream = controller;
  streamThread(threadId, controller.signal, (event) => {
    if (!current(generation)) return;
    if (["changed", "boundary", "reset", "gap"].includes(event.event)) {
      clearTimeout(inspector.reload);
      inspector.reload = setTimeout(() => {
        if (current(generation)) onChange();
      }, 150);
    }
  });
}

// --- shared pieces -----------------------------------------------------------------------------------------------

function link(href, text, cls) {
  const node = el("a", { href, text });
  if (cls) node.className = cls;
  return node;
}

const runHref = (id) => "/console/runs/" + encodeURIComponent(id);
const threadHref = (id) => "/console/threads/" + encodeURIComponent(id);

function badge(value, cls = "status") {
  return el("span", { class: `badge ${cls} ${cls}-${value}`, text: value });
}

function when(value) {
  return value ? new Date(value).toLocaleString() : "—";
}

async function allPages(path, limit = 100) {
  const items = [];
  let cursor = null;
  for (let page = 0; page < INSPECTOR_PAGES; page++) {
    const query = new URLSearchParams({ limit: String(limit) });
    if (cursor) query.set("cursor", cursor);
    const { body } = await api("GET", `${path}?${query}`);
    items.push(...body.items);
    cursor = body.next_cursor;
    if (!cursor) return { items, complete: true };
  }
  return { items, complete: false };
}

function field(label, ...value) {
  return el("div", { class: "field" }, el("dt", { text: label }), el("dd", {}, ...value));
}

function usageText(usage) {
  if (!usage) return "—";
  const parts = [];
  for (const [name, value] of Object.entries(usage)) {
    if (typeof value === "number" && value) parts.push(`${name.replace(/_tokens$/, "").replace(/_/g, " ")} ${value}`);
  }
  return parts.length ? parts.join(" · ") : "—";
}

function jsonText(value) {
  return typeof value === "string" ? value : JSON.stringify(value, null, 2);
}

// --- threads list ------------------------------------------------------------------------------------------------

async function renderThreadsPage(route, generation) {
  const query = route.query;
  const view = $("inspector");
  const form = el("form", { id: "thread-search", class: "search", role: "search" });
  const search = el("input", { type: "text", name: "q", id: "thread-q", placeholder: "thread or run id (or its start)",
    "aria-label": "Thread or run id" });
  search.value = query.get("q") || "";
  const agent = el("input", { type: "text", name: "agent", id: "thread-agent", placeholder: "agent",
    "aria-label": "Agent" });
  agent.value = query.get("agent") || "";
  const stateSelect = el("select", { name: "state", id: "thread-state", "aria-label": "State" });
  for (const value of ["", "active", "waiting", "paused", "idle", "archived"]) {
    const option = el("option", { value, text: value || "any state" });
    option.selected = value === (query.get("state") || "");
    stateSelect.append(option);
  }
  form.append(search, agent, stateSelect, el("button", { type: "submit", class: "primary", text: "Search" }));
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const q = search.value.trim();
    if (/^run_[A-Za-z0-9_-]+$/.test(q)) return navigate(runHref(q)); // a whole run id: open the run
    const next = new URLSearchParams();
    if (q) next.set("q", q);
    if (agent.value.trim()) next.set("agent", agent.value.trim());
    if (stateSelect.value) next.set("state", stateSelect.value);
    inspector.cursors = [];
    navigate("/console/threads" + (next.toString() ? "?" + next : ""));
  });
  view.replaceChildren(el("h2", { text: "Threads" }), form, el("p", { class: "meta", text: "Loading…" }));

  const params = new URLSearchParams({ limit: String(Number(query.get("limit")) || 25) });
  const q = (query.get("q") || "").trim();
  if (q) params.set("id_prefix", q);
  if (query.get("agent")) params.set("agent", query.get("agent"));
  if (query.get("state")) params.set("state", query.get("state"));
  if (query.get("cursor")) params.set("cursor", query.get("cursor"));
  const { body } = await api("GET", "/v1/threads?" + params);
  if (!current(generation)) return;

  const table = el("table", { class: "threads" });
  table.append(el("thead", {}, el("tr", {}, ...["Thread", "Agent", "State", "Origin", "Created", "Updated"]
    .map((name) => el("th", { text: name })))));
  const rows = el("tbody");
  for (const thread of body.items) {
    const origin = el("td", { text: thread.origin });
    if (thread.origin_thread_id) {
      origin.append(document.createTextNode(" of "), link(threadHref(thread.origin_thread_id), thread.origin_thread_id));
    }
    rows.append(el("tr", { "data-thread-id": thread.id },
      el("td", {}, link(threadHref(thread.id), thread.id, "thread-link")), el("td", { text: thread.agent }),
      el("td", {}, badge(thread.state, "state")), origin,
      el("td", { text: when(thread.created_at) }), el("td", { text: when(thread.updated_at) })));
  }
  table.append(rows);
  const paging = el("div", { class: "paging" });
  const previous = el("button", { type: "button", id: "threads-previous", text: "Previous page" });
  previous.disabled = !query.get("cursor");
  previous.addEventListener("click", () => {
    const back = new URLSearchParams(query);
    const earlier = inspector.cursors.pop();
    if (earlier) back.set("cursor", earlier);
    else back.delete("cursor");
    navigate("/console/threads?" + back);
  });
  const next = el("button", { type: "button", id: "threads-next", text: "Next page" });
  next.disabled = !body.next_cursor;
  next.addEventListener("click", () => {
    inspector.cursors.push(query.get("cursor") || "");
    const forward = new URLSearchParams(query);
    forward.set("cursor", body.next_cursor);
    navigate("/console/threads?" + forward);
  });
  paging.append(previous, next);
  const summary = body.items.length ? `${body.items.length} thread(s) on this page` : "No thread matches.";
  view.replaceChildren(el("h2", { text: "Threads" }), form, el("p", { class: "meta", id: "threads-summary",
    text: summary }), table, paging);
  setStatus("");
}

// --- a thread: its runs as a timeline ----------------------------------------------------------------------------

// How a run follows its `parent_run_id` (§5.3): a resume successor, a fork's first run, a continuation.
function lineageText(run) {
  if (run.trigger === "resume") return "resumes";
  if (run.lineage === "fork") return "forked from";
  if (run.lineage === "continue") return "continues";
  return "follows";
}

async function renderThreadPage(route, generation) {
  const threadPath = "/v1/threads/" + encodeURIComponent(route.id);
  const [{ body: thread }, runs, offspring] = await Promise.all([
    api("GET", threadPath),
    allPages(threadPath + "/runs"),
    api("GET", "/v1/threads?" + new URLSearchParams({ origin_thread_id: route.id, limit: "100" })),
  ]);
  if (!current(generation)) return;
  const view = $("inspector");
  const ordered = [...runs.items].reverse(); // oldest first: a timeline
  const header = el("div", { class: "card thread-head", "data-thread-id": thread.id },
    el("h2", {}, document.createTextNode("Thread "), el("code", { text: thread.id })),
    el("dl", { class: "fields" },
      field("agent", el("code", { text: thread.agent })), field("state", badge(thread.state, "state")),
      field("origin", document.createTextNode(thread.origin + " "),
        thread.origin_thread_id ? link(threadHref(thread.origin_thread_id), thread.origin_thread_id) : "",
        thread.origin_run_id ? document.createTextNode(" · run ") : "",
        thread.origin_run_id ? link(runHref(thread.origin_run_id), thread.origin_run_id) : ""),
      field("created", document.createTextNode(when(thread.created_at))),
      field("updated", document.createTextNode(when(thread.updated_at)))));

  const timeline = el("ol", { class: "timeline" });
  const spawnedBy = new Map(); // run id -> threads forked or spawned from it
  for (const other of offspring.body.items) {
    if (!spawnedBy.has(other.origin_run_id)) spawnedBy.set(other.origin_run_id, []);
    spawnedBy.get(other.origin_run_id).push(other);
  }
  for (const run of ordered) {
    const item = el("li", { class: "timeline-run", "data-run-id": run.id, "data-status": run.status });
    const answered = run.status === "waiting" && ordered.some((o) => o.parent_run_id === run.id && o.trigger === "resume");
    const head = el("div", { class: "run-line" }, badge(run.status), link(runHref(run.id), run.id, "run-link"),
      el("span", { class: "trigger", text: ` ${run.trigger} · ${run.lineage}` + (answered ? " · answered" : "") }));
    item.append(head);
    if (run.parent_run_id) {
      item.append(el("p", { class: "lineage" }, document.createTextNode(lineageText(run) + " "),
        link(runHref(run.parent_run_id), run.parent_run_id)));
    }
    const facts = [`created ${when(run.created_at)}`, run.sealed_at ? `sealed ${when(run.sealed_at)}` : "",
      `${run.attempts} attempt(s)`, `tokens: ${usageText(run.usage)}`].filter(Boolean).join(" · ");
    item.append(el("p", { class: "meta", text: facts }));
    if (run.failure) item.append(el("p", { class: "failure" }, el("strong", { text: run.failure.code }),
      document.createTextNode(" " + (run.failure.message || ""))));
    for (const other of spawnedBy.get(run.id) || []) {
      item.append(el("p", { class: "offspring", "data-thread-id": other.id },
        document.createTextNode(other.origin === "child" ? "child thread " : "forked into "),
        link(threadHref(other.id), other.id), document.createTextNode(" "), badge(other.state, "state")));
    }
    timeline.append(item);
  }
  const notes = [];
  if (!runs.complete) notes.push(el("p", { class: "meta", text: `Only the newest ${runs.items.length} runs are shown.` }));
  view.replaceChildren(header, el("h3", { text: `Runs (${ordered.length}), oldest first` }), ...notes, timeline);
  if (!ordered.length) timeline.append(el("li", { class: "meta", text: "No run yet." }));
  setStatus(`Thread ${thread.id} · updated ${new Date().toLocaleTimeString()}`);
  if (!inspector.stream && thread.state !== "archived") {
    followThread(thread.id, generation, () => renderThreadPage(route, generation).catch((e) => showLoadError(e, generation)));
  }
}

// --- a run: attempts, then steps -------------------------------------------------------------------------------

// What recovery did to one tool call, from its return part (pure): the label and whether it must stand out.
function callOutcome(result) {
  if (!result) return { outcome: "no_result", label: "no result recorded", alarm: false };
  const metadata = result.metadata && typeof result.metadata === "object" ? result.metadata : {};
  if (metadata["candor.unknown_outcome"] === true) return { outcome: "unknown", label: "unknown outcome", alarm: true };
  const tag = metadata["candor.recovery"];
  if (tag === "replayed" || tag === "reconciled" || tag === "rerun") return { outcome: tag, label: tag, alarm: true };
  if (result.part_kind === "retry-prompt") return { outcome: "retry", label: "retry requested", alarm: false };
  if (result.outcome === "denied") return { outcome: "denied", label: "denied", alarm: false };
  if (result.outcome === "failed") return { outcome: "failed", label: "failed", alarm: false };
  return { outcome: "answered", label: "answered", alarm: false };
}

// The run's messages as steps: each model response with its tool calls, each call with the result recorded for it.
function stepsOf(messages) {
  const steps = [];
  const calls = new Map(); // tool call id -> call record
  const carried = []; // results of calls made before this run (a resume's answers), with no call in these messages
  const inputs = [];
  for (const message of messages) {
    if (message.kind === "response") {
      const step = { response: message, calls: [], texts: [], inputs: inputs.splice(0) };
      for (const part of message.parts || []) {
        if (part.part_kind === "text") step.texts.push(part.content);
        else if (part.part_kind === "tool-call") {
          const call = { part, result: null };
          calls.set(part.tool_call_id, call);
          step.calls.push(call);
        }
      }
      steps.push(step);
    } else if (message.kind === "request") {
      for (const part of message.parts || []) {
        if (part.part_kind === "tool-return" || part.part_kind === "retry-prompt") {
          const call = calls.get(part.tool_call_id);
          if (call) call.result = part;
          else if (part.tool_call_id) carried.push(part);
        } else if (part.part_kind === "user-prompt") {
          inputs.push(part.content);
        }
      }
    }
  }
  return { steps, carried, trailingInputs: inputs };
}

function argumentsOf(part) {
  if (typeof part.args === "string") {
    try {
      return JSON.parse(part.args);
    } catch (_) {
      return part.args;
    }
  }
  return part.args ?? {};
}

function answerNote(callId, answers) {
  if (!answers) return null;
  const approval = answers.approvals[callId];
  const answer = answers.calls[callId];
  const given = approval || answer;
  if (!given) return null;
  const what = approval ? (approval.action === "deny" ? "denied" : approval.arguments ? "approved with edited arguments"
    : "approved") : (answer.status === "failed" ? "declined" : "answered");
  return el("p", { class: "answered-by", "data-call-id": callId },
    document.createTextNode(`${what} by key `), el("code", { class: "key-id", text: answers.answered_by }),
    document.createTextNode(` at ${when(answers.answered_at)}`),
    given.reason ? document.createTextNode(` — reason: ${given.reason}`) : "",
    given.message ? document.createTextNode(` — ${given.message}`) : "");
}

function renderCall(call, run, tools, answers) {
  const part = call.part || call.result;
  const id = part.tool_call_id;
  const { outcome, label, alarm } = callOutcome(call.result);
  const node = el("div", { class: "call" + (alarm ? " recovered" : "") + (outcome === "unknown" ? " unknown" : ""),
    "data-call-id": id, "data-outcome": outcome });
  const declared = tools.byName.get(part.tool_name);
  const safety = !tools.known && !declared ? "retry-safe: not known here"
    : declared ? (declared.retry_safe ? "declared retry-safe" : "not declared retry-safe")
      + (declared.reconciler ? " · has a reconciler" : "") + (declared.kind !== "function" ? ` · ${declared.kind}` : "")
      : "not in the agent's tools";
  node.append(el("div", { class: "call-head" },
    el("span", { class: "tool", text: part.tool_name }), el("span", { class: "outcome outcome-" + outcome, text: label }),
    el("span", { class: "meta", text: "  " + id })));
  node.append(el("p", { class: "policy meta" }, document.createTextNode("policy "),
    el("code", { class: "policy-mode", text: run.tool_recovery }), document.createTextNode(" · "),
    el("span", { class: "retry-safe", text: safety })));
  if (call.part) {
    node.append(el("p", { class: "caption", text: "arguments" }),
      el("pre", { class: "arguments", text: JSON.stringify(argumentsOf(call.part), null, 2) }));
  }
  if (call.result) {
    node.append(el("p", { class: "caption", text: "result" }), el("pre", { class: "result", text: jsonText(call.result.content) }));
  }
  if (outcome === "unknown") {
    node.append(el("p", { class: "warning", text: "The process running this call stopped before its result was "
      + "recorded. The call may have taken effect; the agent was told so." }));
  }
  const note = answerNote(id, answers);
  if (note) node.append(note);
  const pending = run.pending ? [...run.pending.approvals, ...run.pending.calls].find((p) => p.tool_call_id === id) : null;
  if (pending && !call.result) node.append(el("p", { class: "pending-note", text: `waiting for ${pending.kind}` }));
  return node;
}

function renderAttempts(attempts) {
  const table = el("table", { class: "attempts" });
  table.append(el("thead", {}, el("tr", {}, ...["#", "Status", "Worker", "Start reason", "Failure", "Lease expires",
    "Started", "Finished"].map((name) => el("th", { text: name })))));
  const rows = el("tbody");
  for (const attempt of attempts) {
    const failure = el("td", { class: "failure-code" });
    if (attempt.failure) failure.append(el("strong", { text: attempt.failure.code }),
      document.createTextNode(attempt.failure.message ? " " + attempt.failure.message : ""));
    else if (attempt.yield_reason) failure.append(document.createTextNode("handed off: " + attempt.yield_reason));
    const reason = el("td", { class: "start-reason", text: attempt.start_reason });
    if (attempt.replaces_attempt_id) reason.append(el("span", { class: "meta", text: " after " + attempt.replaces_attempt_id }));
    rows.append(el("tr", { class: "attempt", "data-attempt": String(attempt.number), "data-status": attempt.status },
      el("td", { text: String(attempt.number) }), el("td", {}, badge(attempt.status)),
      el("td", {}, el("code", { class: "worker", text: attempt.worker_id })), reason, failure,
      el("td", { text: when(attempt.lease_expires_at) }), el("td", { text: when(attempt.started_at) }),
      el("td", { text: when(attempt.finished_at) })));
  }
  table.append(rows);
  return table;
}

async function optional(promise) {
  try {
    return (await promise).body;
  } catch (error) {
    if (error instanceof ApiError && error.status === 404) return null;
    throw error;
  }
}

async function renderRunPage(route, generation) {
  const runPath = "/v1/runs/" + encodeURIComponent(route.id);
  const { body: run } = await api("GET", runPath);
  const [attempts, messages, toolList, answers, siblings] = await Promise.all([
    api("GET", runPath + "/attempts"),
    allPages(runPath + "/messages"),
    api("GET", runPath + "/tools"),
    run.trigger === "resume" ? optional(api("GET", runPath + "/answers")) : Promise.resolve(null),
    run.status === "waiting" ? allPages("/v1/threads/" + encodeURIComponent(run.thread_id) + "/runs") : null,
  ]);
  if (!current(generation)) return;
  const tools = { known: toolList.body.complete, byName: new Map(toolList.body.items.map((t) => [t.name, t])) };
  // A waiting run's answers live with its resume successor.
  let successor = null;
  let successorAnswers = null;
  if (siblings) {
    successor = siblings.items.find((other) => other.parent_run_id === run.id && other.trigger === "resume") || null;
    if (successor) successorAnswers = await optional(api("GET", "/v1/runs/" + encodeURIComponent(successor.id) + "/answers"));
    if (!current(generation)) return;
  }
  const view = $("inspector");
  const recovered = run.recovery || [];
  const unknown = recovered.filter((call) => call.outcome === "unknown").length;
  const head = el("div", { class: "card run-head", "data-run-id": run.id, "data-status": run.status },
    el("h2", {}, document.createTextNode("Run "), el("code", { text: run.id }), document.createTextNode(" "),
      badge(run.status)),
    el("dl", { class: "fields" },
      field("thread", link(threadHref(run.thread_id), run.thread_id, "thread-link")),
      field("agent", el("code", { text: run.agent })),
      field("trigger", document.createTextNode(`${run.trigger} · ${run.lineage}`),
        run.parent_run_id ? document.createTextNode(" · " + lineageText(run) + " ") : "",
        run.parent_run_id ? link(runHref(run.parent_run_id), run.parent_run_id, "parent-link") : ""),
      field("acts for key", el("code", { class: "principal", text: run.principal_id })),
      field("tool recovery", el("code", { class: "run-policy", text: run.tool_recovery })),
      field("attempts", document.createTextNode(`${run.attempts} of at most ${run.max_attempts}`)),
      field("created", document.createTextNode(when(run.created_at))),
      field("started", document.createTextNode(when(run.started_at))),
      field("sealed", document.createTextNode(when(run.sealed_at))),
      field("usage (total)", el("span", { class: "usage-total", text: usageText(run.usage) }))));
  if (unknown) {
    head.append(el("p", { class: "alarm", role: "note", text: `${unknown} tool call(s) of this run have an unknown `
      + "outcome: they may or may not have taken effect." }));
  }
  if (run.failure) head.append(el("div", { class: "failure" }, el("strong", { class: "code", text: run.failure.code }),
    document.createTextNode(" " + (run.failure.message || ""))));
  if (run.status === "completed" && run.output !== null) {
    head.append(el("p", { class: "caption", text: "output" }), el("pre", { class: "output", text: jsonText(run.output) }));
  }
  if (successor) {
    head.append(el("p", { class: "successor-note" }, document.createTextNode("Answered"),
      successorAnswers ? document.createTextNode(" by key ") : "",
      successorAnswers ? el("code", { class: "key-id", text: successorAnswers.answered_by }) : "",
      successorAnswers ? document.createTextNode(` at ${when(successorAnswers.answered_at)}`) : "",
      document.createTextNode("; resumed as "), link(runHref(successor.id), successor.id, "successor-link")));
  }

  const sections = [head, el("h3", { text: "Attempts" }), renderAttempts(attempts.body.items)];
  if (answers) {
    const box = el("div", { class: "card answers", "data-answered-by": answers.answered_by },
      el("h3", {}, document.createTextNode("Answers that started this run: by key "),
        el("code", { class: "key-id", text: answers.answered_by }), document.createTextNode(` at ${when(answers.answered_at)}, `
          + "for "), link(runHref(answers.answered_run_id), answers.answered_run_id)));
    const given = [...Object.entries(answers.approvals), ...Object.entries(answers.calls)];
    for (const [callId, answer] of given) {
      box.append(el("div", { class: "answer", "data-call-id": callId }, el("code", { text: callId }),
        el("pre", { text: JSON.stringify(answer, null, 2) })));
    }
    if (answers.input) box.append(el("p", { class: "meta", text: "with the message: " + jsonText(answers.input) }));
    sections.push(box);
  }

  const { steps, carried, trailingInputs } = stepsOf(messages.items);
  sections.push(el("h3", { text: `Steps (${steps.length})` }));
  if (!messages.complete) sections.push(el("p", { class: "meta", text: "Only the first messages are shown." }));
  if (carried.length) {
    const box = el("div", { class: "card step carried" }, el("h4", { text: "Results of the calls this run was resumed with" }));
    for (const result of carried) box.append(renderCall({ part: null, result }, run, tools, answers));
    sections.push(box);
  }
  steps.forEach((step, index) => {
    const box = el("div", { class: "card step", "data-step": String(index + 1) });
    box.append(el("h4", {}, document.createTextNode(`Step ${index + 1} · model response`),
      el("span", { class: "meta step-usage", text: "  tokens: " + usageText(step.response.usage) })));
    for (const input of step.inputs) box.append(el("p", { class: "caption", text: "input" }),
      el("pre", { class: "input", text: jsonText(input) }));
    for (const text of step.texts) box.append(el("p", { class: "caption", text: "text" }),
      el("pre", { class: "response-text", text }));
    for (const call of step.calls) box.append(renderCall(call, run, tools, successorAnswers || null));
    sections.push(box);
  });
  for (const input of trailingInputs) sections.push(el("pre", { class: "input", text: jsonText(input) }));
  if (!steps.length) sections.push(el("p", { class: "meta", text: "No step recorded yet." }));
  view.replaceChildren(...sections);
  setStatus(`Run ${run.id} · ${run.status} · updated ${new Date().toLocaleTimeString()}`);
  if (!inspector.stream && (LIVE_STATUSES.has(run.status) || (run.status === "waiting" && !successor))) {
    // Re-read on every boundary, reset and seal of the thread, until the page is left.
    followThread(run.thread_id, generation, () => renderRunPage(route, generation).catch((e) => showLoadError(e, generation)));
  }
}

document.addEventListener("DOMContentLoaded", () => {
  // Links inside the console change the page without a reload; the address stays a deep link that survives one.
  document.addEventListener("click", (event) => {
    const anchor = event.target.closest && event.target.closest("a[href^='/console']");
    if (!anchor || event.defaultPrevented || event.button !== 0 || event.metaKey || event.ctrlKey || event.shiftKey) return;
    if (!state.key) return;
    event.preventDefault();
    navigate(anchor.getAttribute("href"));
  });
  window.addEventListener("popstate", () => {
    if (!state.key) return;
    if (!showInspector()) {
      $("inspector").hidden = true;
      startApprovals();
    }
  });
});
