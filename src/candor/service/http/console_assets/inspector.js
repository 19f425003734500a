// candor run inspector (docs/console.md): routing between its pages, the workspace's threads and a thread's runs as
// a timeline; the run page is run_page.js. Loaded after console.js, whose helpers it uses (el, $, api,
// streamThread, setLive). Every text from the API goes in as text (textContent), never as markup.
"use strict";

const INSPECTOR_PAGES = 10; // pages of 100 read at most for one list (a thread's runs, a run's messages)

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

  const limit = Math.min(100, Math.max(1, Math.trunc(Number(query.get("limit"))) || 25)); // the API's bounds
  const params = new URLSearchParams({ limit: String(limit) });
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
