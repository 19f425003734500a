"""Request checks of the user actions (§8.1, §8.2, §8.6 step 1): shapes and sizes, no state and no I/O.

Each `checked_*` returns the value in the form the commands store and digest, or raises `InvalidArgument` with the
field and a stable reason (never the submitted value). Checks that need the configured agents live with the
commands (`commands/acceptance.py`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final, Literal, TypedDict, TypeVar

from pydantic import ValidationError
from pydantic_ai import ModelMessage, ModelMessagesTypeAdapter

from ..errors import Forbidden, InvalidArgument, ServiceError
from .authority import Permission, Principal
from .client_tools import ClientToolsProblem, validate_client_tools
from .idempotency import KeyProblem, canonical_json, validate_idempotency_key
from .json_types import JsonObject, JsonValue
from .pending import resume_shape_problem
from .resume import ResumeAnswers
from .tool_recovery import TOOL_RECOVERY_FIELD, tool_recovery_message, tool_recovery_problem

__all__ = (
    "checked_limit",
    "NAME_LIMIT",
    "checked_name",
    "OPTIONS_LIMIT",
    "RESUME_BODY_LIMIT",
    "Delivery",
    "require",
    "checked_key",
    "checked_input",
    "checked_delivery",
    "json_size",
    "checked_options",
    "checked_history",
    "checked_resume_body",
    "EDITABLE_FIELDS",
    "checked_entry_edit",
    "EntryEditFields",
    "checked_entry_order",
    "still_there",
)

OPTIONS_LIMIT: Final = 64 * 1024
"""§5.1: `options` is a JSON object of at most 64 KiB."""
RESUME_BODY_LIMIT: Final = 256 * 1024
"""§8.6 step 1, S-79."""

Delivery = Literal["steer", "next_run"]
_DELIVERIES: Final[dict[str, Delivery]] = {"steer": "steer", "next_run": "next_run"}


def require(principal: Principal, permission: Permission) -> None:
    """403 `forbidden` unless the authenticated key holds `permission` (§4.2)."""
    if not principal.can(permission):
        raise Forbidden(permission)


def checked_limit(limit: int) -> int:
    """§8.1, S-98: a list `limit` is 1–100."""
    if not 1 <= limit <= 100:
        raise InvalidArgument(fields=[("limit", "out_of_range")])
    return limit


NAME_LIMIT = 200


def checked_name(name: object) -> str:
    """A label of 1–200 characters that is not only whitespace."""
    if not isinstance(name, str) or not name.strip() or len(name) > NAME_LIMIT:
        raise InvalidArgument(fields=[("name", "invalid")])
    return name


def checked_key(key: str | None) -> str:
    """§8.2, S-93: 1–512 visible ASCII characters."""
    checked = validate_idempotency_key(key)
    if isinstance(checked, KeyProblem):
        raise InvalidArgument(fields=[("Idempotency-Key", checked.reason)])
    return checked


def checked_input(value: object, field: str = "input") -> JsonObject:
    """§8.1: `{"content": [{"type": "text", "text": str}, ...]}` with at least one item."""
    content = value.get("content") if isinstance(value, Mapping) and set(value) == {"content"} else None
    if not isinstance(content, list) or not content:
        raise InvalidArgument(fields=[(field, "invalid_content")])
    for item in content:
        if not (
            isinstance(item, Mapping)
            and set(item) == {"type", "text"}
            and item["type"] == "text"
            and isinstance(item["text"], str)
        ):
            raise InvalidArgument(fields=[(field, "invalid_content")])
    return {"content": [{"type": "text", "text": item["text"]} for item in content]}


def checked_delivery(value: object) -> Delivery:
    """§8.3: `steer` or `next_run`."""
    delivery = _DELIVERIES.get(value) if isinstance(value, str) else None
    if delivery is None:
        raise InvalidArgument(fields=[("delivery", "invalid")])
    return delivery


def json_size(value: object, field: str) -> int:
    """Bytes of the canonical JSON of `value`; 400 `not_json` for a value JSON cannot hold."""
    try:
        return len(canonical_json(value).encode("utf-8"))
    except (TypeError, ValueError) as exc:
        raise InvalidArgument(fields=[(field, "not_json")]) from exc


def checked_options(value: object) -> JsonObject | None:
    """§5.1, §8.8: a JSON object of at most 64 KiB whose `client_tools` and `tool_recovery`, when given, are well
    formed."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise InvalidArgument(fields=[("options", "not_an_object")])
    if json_size(value, "options") > OPTIONS_LIMIT:
        raise InvalidArgument(fields=[("options", "too_large")])
    tools = validate_client_tools(value.get("client_tools"))  # §8.8, S-133
    if isinstance(tools, ClientToolsProblem):
        raise InvalidArgument(fields=[(tools.field, tools.reason)])
    if (reason := tool_recovery_problem(value)) is not None:
        raise InvalidArgument(tool_recovery_message(value["tool_recovery"]), fields=[(TOOL_RECOVERY_FIELD, reason)])
    return dict(value)


def checked_history(value: object) -> tuple[list[ModelMessage], list[JsonValue]] | None:
    """`message_history` as messages plus their JSON form (for the digest); `None` when absent or empty."""
    if value is None:
        return None
    try:
        messages = ModelMessagesTypeAdapter.validate_python(value)
    except ValidationError as exc:
        raise InvalidArgument(fields=[("message_history", "invalid")]) from exc
    if not messages:
        return None
    return messages, ModelMessagesTypeAdapter.dump_python(messages, mode="json")


def checked_resume_body(body: ResumeAnswers | Mapping[str, object]) -> ResumeAnswers:
    """§8.6 step 1, S-79: both maps, no id in both, at most 128 results, at most 256 KiB, answers well formed.

    The HTTP layer hands in the `ResumeAnswers` its body parsed into; other callers a plain mapping, built into one
    here (once). Either way the same size and shape checks follow.
    """
    answers = body if isinstance(body, ResumeAnswers) else _answers_of(body)
    if json_size(answers.stored_json(), "body") > RESUME_BODY_LIMIT:
        raise InvalidArgument(fields=[("body", "too_large")])
    match resume_shape_problem(answers.approvals.keys(), answers.calls.keys()):
        case "overlap":
            raise InvalidArgument(fields=[("calls", "id_also_in_approvals")])
        case "too_many":
            raise InvalidArgument(fields=[("body", "too_many_results")])
    if answers.input is not None:
        checked_input(answers.input)
    return answers


def _answers_of(body: object) -> ResumeAnswers:
    """The typed value of a resume body given as a mapping, or the `InvalidArgument` naming the first bad field."""
    if not isinstance(body, Mapping) or not set(body) <= {"approvals", "calls", "input"}:
        raise InvalidArgument(fields=[("body", "invalid")])
    missing = [(name, "required") for name in ("approvals", "calls") if not isinstance(body.get(name), Mapping)]
    if missing:
        raise InvalidArgument(fields=missing)
    if json_size(body, "body") > RESUME_BODY_LIMIT:
        raise InvalidArgument(fields=[("body", "too_large")])
    try:
        return ResumeAnswers.model_validate(body)
    except ValidationError as exc:
        field = str(exc.errors()[0]["loc"][0])  # pydantic reports in field order: approvals, calls, input
        raise InvalidArgument(fields=[(field, "invalid_content" if field == "input" else "invalid_answer")]) from exc


EDITABLE_FIELDS: Final = ("input", "delivery", "agent", "options")
"""§8.3 `PATCH …/inbox/{entry_id}`: the fields of a post that an edit may change."""


class EntryEditFields(TypedDict, total=False):
    """The checked fields of an entry edit; a key is present when the edit changes that field."""

    input: JsonObject
    delivery: Delivery
    agent: str | None
    options: JsonObject | None


def checked_entry_edit(changes: object) -> EntryEditFields:
    """The changed fields of a pending entry, checked like a post's (§8.5); at least one, only `EDITABLE_FIELDS`.

    `agent` and `options` may be `None`: the entry then no longer names them and inherits them when it starts.
    Whether the agent is configured is checked by the command.
    """
    if not isinstance(changes, Mapping) or not changes:
        raise InvalidArgument(fields=[("body", "no_changes")])
    unknown = [(str(name), "unknown_field") for name in changes if name not in EDITABLE_FIELDS]
    if unknown:
        raise InvalidArgument(fields=unknown)
    checked: EntryEditFields = {}
    if "input" in changes:
        checked["input"] = checked_input(changes["input"])
    if "delivery" in changes:
        checked["delivery"] = checked_delivery(changes["delivery"])
    if "agent" in changes:
        agent = changes["agent"]
        if agent is not None and (not isinstance(agent, str) or not agent):
            raise InvalidArgument(fields=[("agent", "invalid")])
        checked["agent"] = agent
    if "options" in changes:
        checked["options"] = checked_options(changes["options"])
    return checked


def checked_entry_order(entry_ids: object) -> list[str]:
    """§8.3 `PUT …/inbox/order`: `entry_ids` is a list of entry ids (whether it lists exactly the pending entries
    is a matter of state: `protocol.inbox.order_mismatch`)."""
    if not isinstance(entry_ids, list) or not all(isinstance(entry_id, str) for entry_id in entry_ids):
        raise InvalidArgument(fields=[("entry_ids", "invalid")])
    return list(entry_ids)


_Row = TypeVar("_Row")


def still_there(row: _Row | None, what: str) -> _Row:
    """A row this request already found, read again (or joined) in the same transaction: runs, threads, inbox
    entries and outbox deliveries are never deleted, so None is a store defect, reported as `internal` (the
    transaction changes nothing) rather than an `assert` that `python -O` would skip."""
    if row is None:
        raise ServiceError(f"the {what} this request read was gone when read again; nothing was changed")
    return row
