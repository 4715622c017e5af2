"""Text from people and servers, made safe to show: control characters escaped, long quotes shortened."""

from __future__ import annotations

QUOTE_LIMIT = 80  # characters of an answer quoted back in a question


def printable(text: str) -> str:
    """`text` with every character a terminal would act on (ESC, CR, backspace, bidi overrides, ...) written as
    its Python escape (\\x1b, \\r, \\u202e), so it is shown, never executed; spaces stay."""
    return "".join(ch if ch.isprintable() or ch == " " else ch.encode("unicode_escape").decode("ascii") for ch in text)


def quote(text: str, limit: int = QUOTE_LIMIT) -> str:
    """`text` as a short quote: escaped (printable), cut at `limit` characters with its full length said."""
    shown = printable(text)
    if len(shown) > limit:
        shown = f"{shown[: limit - 1]}… ({len(text):,} characters)"
    return f"'{shown}'"
