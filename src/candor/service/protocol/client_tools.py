"""Client tools (§8.8): the pure check of `options.client_tools` and the name-collision rule.

`validate_client_tools(value)` answers either the tools (`list[ClientTool]`) or a `ClientToolsProblem`
`(field, reason)` naming the offending item (`options.client_tools.<i>.<key>`); the command turns a problem into
400 `invalid_argument` (S-133) and creates nothing. `parameters` must be a JSON Schema object describing the call's
arguments: `jsonschema` meta-validation is used when that package is installed; otherwise a structural check
(an object whose `type`, if given, is `"object"`, with well-formed `properties` / `required`). An empty object is
accepted and read as "no arguments". Each `parameters` is at most 16 KiB of canonical JSON.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from .canonical import canonical_json
from .json_types import JsonObject

__all__ = (
    "CLIENT_TOOLS_FIELD",
    "MAX_CLIENT_TOOLS",
    "MAX_PARAMETERS_BYTES",
    "ClientTool",
    "ClientToolsProblem",
    "validate_client_tools",
    "colliding_names",
    "parameters_schema",
)

CLIENT_TOOLS_FIELD = "options.client_tools"
MAX_CLIENT_TOOLS = 64
MAX_PARAMETERS_BYTES = 16 * 1024
NAME = re.compile(r"\A[a-zA-Z_][a-zA-Z0-9_-]{0,63}\Z")
_KEYS = frozenset({"name", "description", "parameters"})
_JSON_TYPES = frozenset({"object", "array", "string", "number", "integer", "boolean", "null"})


@dataclass(frozen=True, kw_only=True, slots=True)
class ClientTool:
    """One tool the client runs itself; a model call to it ends the run `waiting` (S-131)."""

    name: str
    description: str | None
    parameters: JsonObject


@dataclass(frozen=True, slots=True)
class ClientToolsProblem:
    """Why `options.client_tools` is invalid: rendered as `{"field", "reason"}` in `details.fields`."""

    field: str
    reason: str


def _schema_problem(schema: Mapping[str, object]) -> str | None:
    """`None` when `schema` is an acceptable arguments schema, else a reason."""
    try:
        import jsonschema  # type: ignore[import-untyped]  # optional: only when installed
    except ImportError:
        jsonschema = None
    if jsonschema is not None:
        try:
            jsonschema.validators.validator_for(schema).check_schema(schema)
        except jsonschema.exceptions.SchemaError:
            return "invalid_schema"
    kind = schema.get("type", "object")
    if kind != "object":
        return "not_an_object_schema"
    properties = schema.get("properties", {})
    if not isinstance(properties, Mapping) or not all(
        isinstance(name, str) and isinstance(sub, (Mapping, bool)) for name, sub in properties.items()
    ):
        return "invalid_schema"
    for sub in properties.values():
        if isinstance(sub, Mapping) and not _valid_type(sub.get("type", "object")):
            return "invalid_schema"
    required = schema.get("required", [])
    if not isinstance(required, list) or not all(isinstance(name, str) for name in required):
        return "invalid_schema"
    if len(set(required)) != len(required):
        return "invalid_schema"
    return None


def _valid_type(kind: object) -> bool:
    if isinstance(kind, str):
        return kind in _JSON_TYPES
    return isinstance(kind, list) and bool(kind) and all(isinstance(k, str) and k in _JSON_TYPES for k in kind)


def _tool(index: int, item: object) -> ClientTool | ClientToolsProblem:
    at = f"{CLIENT_TOOLS_FIELD}.{index}"
    if not isinstance(item, Mapping):
        return ClientToolsProblem(at, "dict_type")
    for key in item:
        if key not in _KEYS:
            return ClientToolsProblem(f"{at}.{key}", "unknown_field")
    name = item.get("name")
    if name is None:
        return ClientToolsProblem(f"{at}.name", "required")
    if not isinstance(name, str) or not NAME.match(name):
        return ClientToolsProblem(f"{at}.name", "string_pattern_mismatch")
    description = item.get("description")
    if description is not None and not isinstance(description, str):
        return ClientToolsProblem(f"{at}.description", "string_type")
    if "parameters" not in item:
        return ClientToolsProblem(f"{at}.parameters", "required")
    parameters = item["parameters"]
    if not isinstance(parameters, Mapping):
        return ClientToolsProblem(f"{at}.parameters", "dict_type")
    try:
        size = len(canonical_json(parameters).encode("utf-8"))
    except (TypeError, ValueError):
        return ClientToolsProblem(f"{at}.parameters", "not_json")
    if size > MAX_PARAMETERS_BYTES:
        return ClientToolsProblem(f"{at}.parameters", "too_large")
    if (reason := _schema_problem(parameters)) is not None:
        return ClientToolsProblem(f"{at}.parameters", reason)
    return ClientTool(name=name, description=description, parameters=json.loads(canonical_json(parameters)))


def validate_client_tools(value: object) -> list[ClientTool] | ClientToolsProblem:
    """§8.8, S-133: at most 64 tools, each well-formed, names unique. `None` (absent) is an empty list."""
    if value is None:
        return []
    if not isinstance(value, list):
        return ClientToolsProblem(CLIENT_TOOLS_FIELD, "list_type")
    if len(value) > MAX_CLIENT_TOOLS:
        return ClientToolsProblem(CLIENT_TOOLS_FIELD, "too_long")
    tools: list[ClientTool] = []
    seen: set[str] = set()
    for index, item in enumerate(value):
        checked = _tool(index, item)
        if isinstance(checked, ClientToolsProblem):
            return checked
        if checked.name in seen:
            return ClientToolsProblem(f"{CLIENT_TOOLS_FIELD}.{index}.name", "duplicate")
        seen.add(checked.name)
        tools.append(checked)
    return tools


def colliding_names(tools: Iterable[ClientTool], agent_tool_names: Iterable[str]) -> list[str]:
    """§8.8: client tool names that an agent already has, in the client's order."""
    taken = set(agent_tool_names)
    return [tool.name for tool in tools if tool.name in taken]


def parameters_schema(tool: ClientTool) -> JsonObject:
    """The arguments schema handed to the model: an empty schema reads as an object with no properties."""
    schema = dict(tool.parameters)
    schema.setdefault("type", "object")
    if schema["type"] == "object":
        schema.setdefault("properties", {})
    return schema
