"""Where `kpool diff` places a problem with a report's field: `FILE:LINE:COL: PATH:
problem` (docs/robustness.md, "Report fields by line").

`unplaced(message)` checks the place without the reader's code: it reads FILE, takes
the value the standard library's JSON decoder finds at LINE:COL, and follows PATH in
the file as `json.loads` parses it, as far as the file holds it (a missing field: its
object). The two must be the same value. It returns the message without `:LINE:COL`,
so a test goes on to assert the path and the problem as words.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

_PLACED = re.compile(
    r"^(?:kpool: )?(?P<file>[^\n]+?):(?P<line>\d+):(?P<col>\d+): "
    r'(?P<path>reports?(?:\.[A-Za-z_][A-Za-z0-9_]*|\[\d+\]|\["(?:[^"\\]|\\.)*"\])*): ')
_STEP = re.compile(r'\.([A-Za-z_][A-Za-z0-9_]*)|\[(\d+)\]|\[("(?:[^"\\]|\\.)*")\]')
_UNPLACED = re.compile(r"^(?:kpool: )?[^\n]+?: reports?[.\[:]")


def _follow(doc: object, path: str) -> object:
    """The value at `path` (after the root's name) in `doc`, or its deepest ancestor."""
    for m in _STEP.finditer(path):
        key: object = m[1] if m[1] is not None else (
            int(m[2]) if m[2] is not None else json.loads(m[3]))
        held = (key in doc if isinstance(doc, dict) and isinstance(key, str) else
                key < len(doc) if isinstance(doc, list) and isinstance(key, int) else False)
        if not held:
            break
        doc = doc[key]  # type: ignore[index]
    return doc


def unplaced(message: str) -> str:
    """`message` without its `:LINE:COL`, once the value there is checked to be the one
    its path names; a message about a field without a place fails."""
    m = _PLACED.search(message)
    if m is None:
        assert not _UNPLACED.search(message), f"a field's problem without a place: {message}"
        return message
    text = Path(m["file"]).read_text(encoding="utf-8").removeprefix("\ufeff")
    lines = text.split("\n")
    line, col = int(m["line"]), int(m["col"])
    assert line <= len(lines) and col <= len(lines[line - 1]) + 1, message
    offset = sum(len(x) + 1 for x in lines[:line - 1]) + col - 1
    decoder = json.JSONDecoder(parse_int=str)  # integers of any length, as written
    at, _ = decoder.raw_decode(text, offset)
    try:
        whole = decoder.decode(text)
    except (json.JSONDecodeError, RecursionError):  # text the reader did not reach that
        # is not JSON, or nests deeper than the decoder goes: not followed
        return message[:m.start("line") - 1] + message[m.end("col"):]
    want = _follow(whole, m["path"].removeprefix("reports").removeprefix("report"))
    assert json.dumps(at, sort_keys=True) == json.dumps(want, sort_keys=True), (
        f"{message}: the value at {line}:{col} is not the value at {m['path']}")
    return message[:m.start("line") - 1] + message[m.end("col"):]
