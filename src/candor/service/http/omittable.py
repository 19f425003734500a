"""`Omittable[X]`: a PATCH body field that a client may leave out but never set to `null`.

Statically the field is `X | None` (None: the client left it out, `model_fields_set` says which were sent).
Pydantic validates and describes it as plain `X`: the default is never validated, so only a sent value is, and an
explicit `null` gets the error `X` itself gives (`bool_type`, `list_type`, …) at the field's own path, with no
`null` in the JSON schema.
"""

from __future__ import annotations

from types import NoneType
from typing import Annotated, Any, TypeVar, get_args

from pydantic import GetCoreSchemaHandler
from pydantic_core import CoreSchema

__all__ = ("Omittable",)

_T = TypeVar("_T")


class _SentValueOnly:
    """Builds the schema of the one non-None member of the field's `X | None`."""

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        present = [member for member in get_args(source) if member is not NoneType]
        if len(present) != 1:
            raise TypeError(f"Omittable needs exactly one type besides None, not {source!r}")
        return handler.generate_schema(present[0])


Omittable = Annotated[_T | None, _SentValueOnly()]
