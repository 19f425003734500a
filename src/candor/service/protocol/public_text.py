"""Text shown to API users and operators (OpenAPI descriptions, `--help`) without the spec's internal rule and
section numbers (`§7.8`, `S-12`, `H-3`): those mean something to this repository's maintainers only."""

from __future__ import annotations

import re

__all__ = ("public_text",)

_REF = r"(?:§\s?\d+(?:\.\d+)*(?:\s+step\s+\d+)?|[SH]-\d+)"
_REFS = rf"{_REF}(?:\s*(?:,|;|and|/)\s*{_REF})*"
_PARENTHESISED = re.compile(rf"\s*\(\s*{_REFS}\s*\)")
_LEADING = re.compile(rf"(?m)^(\s*){_REFS}\s*:\s*")
_INLINE = re.compile(rf"\s*(?:,\s*)?{_REFS}\b")
_SPACE_BEFORE_PUNCTUATION = re.compile(r"[ \t]+([,.;:)])")


def public_text(text: str) -> str:
    """`text` with every spec reference removed: `(§8.6)`, `(S-81, S-82)`, a leading `S-79:`, a bare `§8.1`."""
    text = _PARENTHESISED.sub("", text)
    text = _LEADING.sub(r"\1", text)
    text = _INLINE.sub("", text)
    text = _SPACE_BEFORE_PUNCTUATION.sub(r"\1", text)
    return re.sub(r"\(\s*\)", "", text)
