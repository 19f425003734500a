"""(pure) `Omittable[X]` PATCH fields: left out → None and unchanged; an explicit `null` is refused as `X` refuses it.

S-96: the refusal is a field error at the field's own path, so the 400 `invalid_argument` names the same field and
reason as before the fields were typed `X | None`.
"""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict, ValidationError

from candor.service.http.admin_schemas import UpdateKeyBody, UpdateSubscriptionBody
from candor.service.http.errors import validation_fields
from candor.service.http.omittable import Omittable


def _errors(model: type[BaseModel], body: dict[str, Any]) -> list[tuple[str, tuple[Any, ...]]]:
    with pytest.raises(ValidationError) as raised:
        model.model_validate(body)
    return [(error["type"], error["loc"]) for error in raised.value.errors()]


@pytest.mark.parametrize(
    ("model", "field", "error_type"),
    [
        (UpdateKeyBody, "permissions", "list_type"),
        (UpdateKeyBody, "disabled", "bool_type"),
        (UpdateSubscriptionBody, "name", "string_type"),
        (UpdateSubscriptionBody, "url", "string_type"),
        (UpdateSubscriptionBody, "events", "list_type"),
        (UpdateSubscriptionBody, "filter", "model_type"),
        (UpdateSubscriptionBody, "enabled", "bool_type"),
    ],
)
def test_an_explicit_null_is_refused_as_the_field_type_refuses_it(
    model: type[BaseModel], field: str, error_type: str
) -> None:
    """S-96: `{"field": null}` fails at the field's own path with the error of its non-null type."""
    assert _errors(model, {field: None}) == [(error_type, (field,))]
    assert validation_fields([{"type": error_type, "loc": ("body", field)}]) == [{"field": field, "reason": error_type}]


def test_omitted_fields_are_none_and_not_given() -> None:
    """A PATCH changes only the fields the client sent."""
    body = UpdateSubscriptionBody.model_validate({"name": "hooks", "filter": {}})
    assert (body.url, body.events, body.enabled) == (None, None, None)
    assert body.given() == {"name": "hooks", "filter": {}}
    assert UpdateKeyBody.model_validate({}).given() == {}


def test_constraints_of_the_sent_value_still_apply_at_the_field_path() -> None:
    """S-96: a value that is sent is checked against `X`'s constraints; no union branch appears in the path."""
    assert _errors(UpdateSubscriptionBody, {"events": []}) == [("too_short", ("events",))]
    assert _errors(UpdateSubscriptionBody, {"name": ""}) == [("string_too_short", ("name",))]
    assert _errors(UpdateKeyBody, {"disabled": "maybe"}) == [("bool_parsing", ("disabled",))]


def test_the_json_schema_offers_no_null() -> None:
    """Clients generated from the OpenAPI document never send `null` for an omittable field."""
    properties = UpdateKeyBody.model_json_schema()["properties"]
    assert properties["disabled"] == {"default": None, "title": "Disabled", "type": "boolean"}
    assert "anyOf" not in str(UpdateSubscriptionBody.model_json_schema()["properties"])


def test_omittable_needs_one_type_besides_none() -> None:
    """A misdeclared field fails when the model is defined, not on a request."""
    with pytest.raises(TypeError, match="exactly one type"):

        class _Bad(BaseModel):
            model_config = ConfigDict(extra="forbid")
            value: Omittable[int | str] = None
