"""The one int syntax of a trace: plain decimal.

Owns: `DECIMAL` (the only int syntax), `NUMBER_LIKE` (a text written as a number of
some kind), `not_decimal` (why such a text is not an int of a trace, and what to
write instead) and `plain_int` (a scalar's int, when it is one, for the shape the
composer is given; `decimal_int`, the same of a text known to be an INT scalar's).

Invariants:
- Ints are plain decimal, `-?[0-9]+` with no leading zero (`DECIMAL`): YAML 1.1's
  other int forms (`010` octal, `0x1F`, `0b101`, `1_000`, `+5`, `1:20` in base 60)
  and number-like strings (`0o17`, `1e3`) are problems saying what to write instead
  (`not_decimal`); an int of more than `MAX_INT_DIGITS` digits is refused by its
  size, never parsed.
- `not_decimal` works out the value YAML 1.1 (or the writer) meant only for a text
  of at most 40 characters, and quotes at most 40 of it.
"""

from __future__ import annotations

import re

from . import limits
from .nodes import INT, Scalar
from .problems import quote

DECIMAL = re.compile(r"-?(?:0|[1-9][0-9]*)", re.ASCII)  # the only int syntax
NUMBER_LIKE = re.compile(r"[-+]?\.?[0-9]", re.ASCII)  # written as a number of some kind

_BASES = {"x": (16, "hexadecimal"), "o": (8, "octal"), "b": (2, "binary")}
_BASE_DIGITS = {16: "0123456789abcdef", 8: "01234567", 2: "01"}


def not_decimal(text: str) -> str:
    """Why `text`, written like a number, is not an int of a trace (ints are plain
    decimal), and what to write instead. The value YAML 1.1 (or the writer) meant is
    only worked out for a short text."""
    sign = "-" if text.startswith("-") else ""
    body = text[1:] if text[:1] in ("-", "+") else text
    low = body.lower()
    short = len(text) <= 40
    instead: str | None = None
    if low[:2] in ("0x", "0o", "0b"):
        base, why = _BASES[low[1]]
        digits = body[2:].replace("_", "")
        if short and digits and all(c in _BASE_DIGITS[base] for c in digits.lower()):
            instead = f"{sign}{int(digits, base)}"
    elif ":" in body:
        why = "YAML 1.1 reads a:b:c in base 60"
        parts = body.replace("_", "").split(":")
        if short and all(p.isascii() and p.isdigit() for p in parts):
            v = 0
            for p in parts:
                v = v * 60 + int(p)
            why += f", as {sign}{v}"
            instead = f"{sign}{v}"
    elif "." in body or "e" in low:
        why = "not a whole number"
        try:
            f = float(text.replace("_", "")) if short else None
        except ValueError:
            f = None
        if f is not None and f.is_integer():
            why, instead = "written as a float", str(int(f))
        elif f is None:
            why = "not an int"
    elif body[:1] == "0" and len(body) > 1 and body.replace("_", "").isdigit():
        digits = body.replace("_", "")
        why = "a leading zero"
        octal = None
        if all(c in "01234567_" for c in body):
            octal = f"{sign}{int(digits, 8)}" if short else None
            why += " (YAML 1.1 reads it as octal" + (f": {octal})" if octal else ")")
        if short:
            instead = f"{sign}{int(digits)}"
            if octal is not None:
                instead += f" (or {octal}, if octal was meant)"
    elif "_" in body:
        why = "digit separators '_'"
        digits = body.replace("_", "")
        if short and digits.isascii() and digits.isdigit():
            instead = f"{sign}{int(digits)}"
    elif text.startswith("+"):
        why = "a '+' sign"
        if short and DECIMAL.fullmatch(body):
            instead = body
    else:
        why = "not an int"
    tail = f"; write {instead}" if instead is not None else ""
    return (
        f"expected a plain decimal int (-?[0-9]+, no leading zero), got {quote(text)}:"
        f" {why}{tail}"
    )


# the ints of short texts read so far (a trace repeats its positions and seq ids: a
# server trace reads "0".."63" once per step); bounded, as the composer's memo is
_PLAIN: dict[str, int | None] = {}


def plain_int(node: Scalar | None) -> int | None:
    """The int an INT scalar holds when it is plain decimal (`DECIMAL`, at most
    `MAX_INT_DIGITS` characters); None for any other node."""
    if node is None or node.tag != INT:
        return None
    return decimal_int(node.value)


def decimal_int(text: str) -> int | None:
    """`plain_int` of an INT scalar of this text."""
    if text in _PLAIN:
        return _PLAIN[text]
    v = (int(text) if len(text) <= limits.MAX_INT_DIGITS and DECIMAL.fullmatch(text)
         else None)
    if len(text) <= 16 and len(_PLAIN) < 4096:
        _PLAIN[text] = v
    return v
