// candor run inspector, the run page (docs/console.md): a run's attempts, then its steps, each tool call with its
// recovery outcome, the policy in force and whether its tool is declared retry-safe. Loaded after inspector.js,
// whose helpers it uses; `callOutcome` and `stepsOf` are pure (tests/e2e/console/test_inspector_browser.py
// checks them table-driven in the browser).
"use strict";

const LIVE_STATUSES = new Set(["accepted", "running"]);

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
