"""How text that kpool did not write is shown: trace names, descriptions, notes,
slot names, paths, engine text from a plug-in, and anything read back from a report.

Owns: `visible(text)`, the one function every view passes such text through.

Invariant: the result holds no character a terminal acts on, and it can be
encoded as UTF-8. Every C0 control (except a line break where `keep_newlines`
allows it), DEL, every C1 control, the Unicode format characters that reorder or
hide text (bidirectional overrides and isolates, zero-width joiners, the byte
order mark), and lone surrogates (a file name's undecodable bytes, as Python
carries them) are written as Python-style escapes (`\\x1b`, `\\u202e`). A
backslash is left alone: the escapes are for reading, not for round-tripping.
So a trace whose name is `"\\x1b[2J\\x1b[31mPASS"` cannot clear the screen or
paint a fake verdict; it shows as the literal text `\\x1b[2J\\x1b[31mPASS`.

>>> visible("ok\\x1b[2J\\x07")
'ok\\\\x1b[2J\\\\x07'
>>> visible("two\\nlines", keep_newlines=True)
'two\\nlines'
>>> visible("two\\nlines")
'two\\\\nlines'
"""

from __future__ import annotations

import re

# C0 controls, DEL, C1 controls; plus the format characters (category Cf) that a
# terminal or a bidi-aware renderer acts on, and the line/paragraph separators
_HIDDEN = re.compile(
    "[\x00-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2060-\u2069\ud800-\udfff\ufeff"
    "\ufff9-\ufffb]"
)
_HIDDEN_KEEP_NL = re.compile(
    "[\x00-\x09\x0b-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2060-\u2069\ud800-\udfff"
    "\ufeff\ufff9-\ufffb]"
)


_NAMED = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}


def _escape(m: re.Match[str]) -> str:
    c = m.group()
    if c in _NAMED:
        return _NAMED[c]
    o = ord(c)
    return f"\\x{o:02x}" if o < 0x100 else f"\\u{o:04x}"


def visible(text: str, *, keep_newlines: bool = False) -> str:
    """`text` with every character a terminal would act on written as an escape."""
    pattern = _HIDDEN_KEEP_NL if keep_newlines else _HIDDEN
    return pattern.sub(_escape, text)

