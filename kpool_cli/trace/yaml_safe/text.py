"""A trace's text, read bounded: from a file or standard input (`read_trace_file`:
the name a message gives it, its text and the sha256 of its bytes) or as given
(`encode_trace_text`: the sha256 of the text encoded as UTF-8).

Invariants:
- At most `MAX_BYTES` are read: a larger file is refused unread, a larger text
  before it is hashed.
- Standard input (the path `-`, `inputs.STDIN`) is read as a file is, under the same
  bound, and named `<stdin>` (`inputs.input_name`) in problems and in the trace.
- A file that cannot be read (an empty path, missing, a directory, a FIFO, not
  UTF-8, too large; a terminal on stdin) or a text that cannot be encoded (lone
  surrogates) raises
  `TraceError`, never anything else, with one problem of field `<file>` and no
  position.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from kpool_cli.inputs import InputRefused, InputTooLarge, input_name, read_input

from . import limits
from .problems import Problem, TraceError


def read_trace_file(path: str | Path) -> tuple[str, str, str]:
    """(file, text, sha256 of the bytes) of the trace at `path` (`-`: standard input,
    whose file is `<stdin>`), at most `MAX_BYTES` read. Raises `TraceError`, never
    anything else, for a file that cannot be read (missing, a directory, not UTF-8,
    too large)."""
    file = input_name(path)
    if not file:
        raise TraceError([Problem("''", 0, 0, "<file>", "the trace path is empty")])
    try:
        data = read_input(path, limits.MAX_BYTES)
    except InputTooLarge:
        raise TraceError([_too_big(file)]) from None
    except InputRefused as e:
        problem = Problem(file, 0, 0, "<file>", f"cannot read the trace: it {e}")
        raise TraceError([problem]) from None
    except OSError as e:
        reason = e.strerror or type(e).__name__
        problem = Problem(file, 0, 0, "<file>", f"cannot read the trace: {reason}")
        raise TraceError([problem]) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise TraceError(
            [Problem(file, 0, 0, "<file>", f"not UTF-8 text: {e.reason} at byte {e.start}")]
        ) from None
    return file, text, hashlib.sha256(data).hexdigest()


def encode_trace_text(text: str, path: str) -> str:
    """The sha256 of `text` encoded as UTF-8; `TraceError` if it cannot be encoded
    (lone surrogates) or is larger than `MAX_BYTES`."""
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError as e:  # lone surrogates
        raise TraceError(
            [Problem(path, 0, 0, "<file>", f"not encodable as UTF-8: {e.reason}")]
        ) from None
    if len(data) > limits.MAX_BYTES:
        raise TraceError([_too_big(path)])
    return hashlib.sha256(data).hexdigest()


def _too_big(file: str) -> Problem:
    return Problem(file, 0, 0, "<file>", f"the trace is larger than {limits.MAX_BYTES >> 20} MiB")
