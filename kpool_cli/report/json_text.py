"""The JSON text kpool writes: compact (a replay report's values) or indented by two
spaces (the documents of `kpool diff`, `kpool check --output-format json` and
`sarif`, `kpool schema`).

Owns: `dumps`, `ORJSON` (orjson's options for kpool's values), `as_json_writes`
(orjson's text of a value taken where it is json's).
Invariant: the text is `json.dumps(value)`'s with the same separators and indent,
byte for byte, and ASCII-only. orjson writes it (a 23 MB diff document: 0.04 s
against json's 1.9 s, its indented encoder being pure Python); where orjson's text
would differ from json's, json writes it instead:
- a character past ASCII (a trace's name may hold any, bidi controls included),
  which json escapes as `\\u`;
- a value orjson refuses (a lone surrogate, an int past 64 bits);
- a float of magnitude 1e-9 to 1e-4, which orjson writes as `0.00001` or `1e-7`
  where json writes `1e-05` and `1e-07`;
- DEL (U+007F), which orjson writes raw where json escapes it as `\\u007f`.
These two are found in the text (`_APART`), so a string holding `0.0000` or `e-7`
costs json's time, not a wrong byte. A float from 1e16 up is `1e+16` in both only
from orjson 3.11.7 on (earlier ones wrote `1e16`): pyproject.toml's floor.
"""

from __future__ import annotations

import json
import re

import orjson

# int keys written as json writes them; a dataclass or datetime refused, as json does
ORJSON = (orjson.OPT_NON_STR_KEYS | orjson.OPT_PASSTHROUGH_DATACLASS
          | orjson.OPT_PASSTHROUGH_DATETIME)
# orjson's text where it is not json's (module doc)
_APART = re.compile(rb"0\.0000|e-\d(?!\d)|\x7f")


def as_json_writes(raw: bytes) -> str | None:
    """orjson's text `raw` as a str where it is json's text of the same value (the
    module's invariant), else None."""
    return raw.decode("ascii") if raw.isascii() and not _APART.search(raw) else None


def dumps(value: object, *, indent: bool = False) -> str:
    """`value` as JSON text, compact or (`indent`) indented by two spaces: the
    module's invariant."""
    try:
        text = as_json_writes(
            orjson.dumps(value, option=ORJSON | orjson.OPT_INDENT_2 if indent else ORJSON))
        if text is not None:
            return text
    except orjson.JSONEncodeError:
        pass
    return json.dumps(value, indent=2) if indent else json.dumps(value, separators=(",", ":"))
