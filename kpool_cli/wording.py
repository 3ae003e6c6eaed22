"""How kpool words things: the one home of every notation the views, the diff and
the messages share, and of how text kpool did not write is shown.

Owns:
- `visible(text)`, the one function every view passes untrusted text through: trace
  names, descriptions, notes, slot names, paths, engine text from a plug-in, and
  anything read back from a report, escaped and, past SHOWN_MOST characters, cut in
  the middle;
- `unicode_path(path)`, `unicode_text(text)`: a path (its undecodable bytes as
  `\\xff`) or other text kpool did not write (a lone surrogate as `\\udcff`) as
  Unicode text a JSON reader takes;
- `span(first, end)`: a range, half-open `A..B` as traces write positions (`4..8` is
  4, 5, 6, 7), a one-element range as its number (`7`), an open one as `A..`;
- `folded(values)`: a list of ints (positions, rows, cells, ubatch indexes) in the
  order given, three or more consecutive ones as a range (`0..4`), a repeated one as
  `5 x3`: `0..4 9 12 13 5 x3`;
- `tokens(pairs)`: tokens by sequence set: `seq 0 pos 12; seq 0,1 pos 13..16`;
- `stale(positions)`: the stale position of each sequence (ENGINE.md §4: the first
  position whose pools may have regrouped): `seq 0 from pos 12, seq 1 from pos 0`;
- `seqs(ids)`: sequences by id, singular for one: `seq 1`, `seqs 0, 1`;
- `pools(pairs)`: pools as `seq:k`, three or more consecutive pools of one sequence
  as a run `seq:k0..k1` (half-open): `0:0..3 1:0`;
- `place(op, batch_ubatch)`: a place in a replay: `op 3.0` (op 3, its ubatch 0), or
  `op 3` (the op itself: an edit, a refused decode);
- `code(code, name)`: a finding code with its name: `KP001 scatter-race`;
- `count(n)`: a count as the text views show it: grouped by thousands from
  GROUPED_FROM on (`12,345`), bare below (`1247`); a number that names a place in a
  trace (a position, a cell, a row, an index, an op, a seed) is never grouped;
  `code_count(code, n)`: how many findings of a code: `KP001 x12`; `counted(n,
  noun)`: a count and its noun, singular for 1: `1 token`, `3 tokens`;
- `clip(text, n)`, `quoted(text, n)`: a value a message echoes, cut to `n`
  characters (and quoted);
- `suggest(word, known)`: the known name closest to one that is none, `(did you
  mean 'rep-once'?)`, for every refusal of an unknown name (a key, an op, a code, an
  engine); `unknown_key(key, known)`: the refusal of an unknown key of a
  mapping (a trace's, a settings file's), with the keys there are;
- `units(text)`: where a wrapped line may break, so that no view splits a stale
  position, a token, a count or a label from its value across lines; `fit` and
  `fit_line`: a line broken there to a width (`kpool check`'s lines, and the
  messages of an invalid input on a terminal).

Invariants: every range kpool prints is half-open `A..B`, never inclusive; an empty
list is worded `none` (NONE); a list longer than `limit` parts ends `... (n)`, n the
number of values it stands for. This module imports nothing of kpool, so every
layer (the verdicts' messages, the diff, the views) can word with it.

`visible`: the result holds no character a terminal acts on, and it can be
encoded as UTF-8. Every C0 control (except a line break where `keep_newlines`
allows it), DEL, every C1 control, every Unicode format character (those that
reorder or hide text: bidirectional overrides and isolates, zero-width joiners, the
byte order mark, the soft hyphen, the tag characters), and lone surrogates (a file
name's undecodable bytes, as Python carries them) are written as Python-style
escapes (`\\x1b`, `\\u202e`, `\\U000e0041`). A backslash is left alone: the
escapes are for reading, not for round-tripping.
So a trace whose name is `"\\x1b[2J\\x1b[31mPASS"` cannot clear the screen or
paint a fake verdict; it shows as the literal text `\\x1b[2J\\x1b[31mPASS`.

>>> visible("ok\\x1b[2J\\x07")
'ok\\\\x1b[2J\\\\x07'
>>> visible("two\\nlines", keep_newlines=True)
'two\\nlines'
>>> visible("two\\nlines")
'two\\\\nlines'
>>> span(4, 8), span(7, 8), span(2, None)
('4..8', '7', '2..')
>>> folded([0, 1, 2, 3, 9, 12, 13, 5, 5, 5])
'0..4 9 12 13 5 x3'
>>> stale({1: 0, 0: 12})
'seq 0 from pos 12, seq 1 from pos 0'
>>> pools([(0, 0), (0, 1), (0, 2), (1, 0), (1, 2)])
'0:0..3 1:0 1:2'
>>> count(1247), count(12345), count(1048576)
('1247', '12,345', '1,048,576')
>>> counted(1, "token"), counted(12345, "token"), counted(2, "entry", "entries")
('1 token', '12,345 tokens', '2 entries')
>>> suggest("rep_once", ["cache-safe", "rep-once"])
" (did you mean 'rep-once'?)"
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # numpy is imported where a wording needs it (see `folded`)
    import numpy as np

# What a view writes as an escape: C0 controls, DEL, C1 controls; every format
# character (category Cf of Unicode 14.0, Python 3.11's, and 15.0-15.1, Python
# 3.12's and 3.13's, which add U+13439-1343F: the bidi controls and zero-widths a
# terminal or a bidi-aware renderer acts on, and those that show nothing, as the
# soft hyphen U+00AD and the tag characters U+E0000-E007F do, so that two names that
# look alike are told apart); the line and paragraph separators;
# surrogates; and the two noncharacters U+FFFE and U+FFFF, which no XML document may
# hold (an SVG view, a JUnit report: XML 1.0's Char excludes them, as it does
# surrogates and controls). `_UNSHOWN`: all of it past the C1 controls
_UNSHOWN = (
    "\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2\u180e\u200b-\u200f"
    "\u2028-\u202e\u2060-\u206f\ud800-\udfff\ufeff\ufff9-\ufffb\ufffe\uffff"
    "\U000110bd\U000110cd\U00013430-\U0001343f\U0001bca0-\U0001bca3"
    "\U0001d173-\U0001d17a\U000e0000-\U000e007f"
)
_HIDDEN = re.compile(f"[\x00-\x1f\x7f-\x9f{_UNSHOWN}]")
_HIDDEN_KEEP_NL = re.compile(f"[\x00-\x09\x0b-\x1f\x7f-\x9f{_UNSHOWN}]")


_NAMED = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}


def _escape(m: re.Match[str]) -> str:
    c = m.group()
    if c in _NAMED:
        return _NAMED[c]
    o = ord(c)
    return (f"\\x{o:02x}" if o < 0x100 else f"\\u{o:04x}" if o < 0x10000
            else f"\\U{o:08x}")


# the most characters of untrusted text (a name, a description, a message line with
# its paths) `visible` shows whole: four times PATH_MAX, so a line with a path or two
# of any length shows whole, where a report's 100 MB name would cost a terminal view
# gigabytes. Longer text shows its first and last SHOWN_END characters, so a message
# line keeps its file and its field and problem, around what is cut
SHOWN_MOST = 16384
SHOWN_END = 8000


def unicode_path(path: str) -> str:
    """A path as Unicode text a JSON reader takes: the bytes of a file name that is not
    UTF-8 (which Python holds as lone surrogates, `os.fsdecode`) written `\\xff`."""
    return path.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def unicode_text(text: str) -> str:
    """Text kpool did not write (a plug-in's name, its message) as Unicode text a JSON
    reader takes: each lone surrogate written as its escape (`\\udcff`), as a plain str
    (`str.encode`: a str subclass cannot encode otherwise)."""
    return str.encode(text, "utf-8", "backslashreplace").decode("utf-8")


def visible(text: str, *, keep_newlines: bool = False) -> str:
    """`text` with every character a terminal would act on written as an escape; when
    that is longer than SHOWN_MOST characters, its first and last SHOWN_END with how
    many were cut between them (so what `visible` gave is the same through it again)."""
    pattern = _HIDDEN_KEEP_NL if keep_newlines else _HIDDEN
    shown = pattern.sub(_escape, text)
    if len(shown) <= SHOWN_MOST:
        return shown
    return (f"{shown[:SHOWN_END]} ... ({count(len(shown) - 2 * SHOWN_END)} characters cut) ... "
            f"{shown[-SHOWN_END:]}")


# -- ranges and lists ----------------------------------------------------------------------

NONE = "none"  # an empty list
# consecutive values (or pools) folded into a range: at least this many (`3 4` says
# as much as `3..5`, and reads at once)
RUN_MIN = 3


def span(first: int, end: int | None) -> str:
    """The half-open range first..end: `4..8`; `7` when it holds one value; `4..` when
    `end` is None (open: to the end)."""
    if end is None:
        return f"{first}.."
    return str(first) if end == first + 1 else f"{first}..{end}"


def _limited(parts: list[str], limit: int | None, n: int) -> str:
    if limit is not None and len(parts) > limit:
        return " ".join(parts[:limit]) + f" ... ({n})"
    return " ".join(parts)


def folded(values: Iterable[int], limit: int | None = None) -> str:
    """Ints in the order given: RUN_MIN or more consecutive ones (each one more than
    the one before) as a range `0..4`, a value repeated as `5 x3`, the others alone;
    at most `limit` parts, then `... (n)` with n the number of values. `none` when empty.

    >>> folded([3, 7, 11, 12, 13, 3]), folded([0, 1, 2, 3, 4], limit=1), folded([])
    ('3 7 11..14 3', '0..5', 'none')
    """
    import numpy as np  # here: `kpool --help` words nothing and imports no numpy

    vals = np.fromiter(values, dtype=np.int64) if not isinstance(values, np.ndarray) \
        else values.astype(np.int64, copy=False)
    n = int(vals.size)
    # with a limit, the parts shown come from a prefix: once it holds more than
    # `limit` parts, the ones shown each ended before the next began inside it
    m = n if limit is None else min(n, 64)
    while True:
        parts = _parts(vals[:m], limit)
        if m == n or (limit is not None and len(parts) > limit):
            return _limited(parts, limit, n) or NONE
        m = min(n, 4 * m)


def _parts(vals: np.ndarray, limit: int | None) -> list[str]:
    """`folded`'s parts of `vals`, left to right, at most limit + 1."""
    import numpy as np

    n = int(vals.size)
    d = np.diff(vals)
    # where each kind of run breaks: the run from i of step 0 (1) ends at the first
    # k >= i with d[k] != 0 (1), so a part costs a search, not a walk of its run
    breaks = {0: np.flatnonzero(d != 0), 1: np.flatnonzero(d != 1)}
    parts: list[str] = []
    i = 0
    while i < n and (limit is None or len(parts) <= limit):
        j = i
        step = int(d[i]) if i + 1 < n else None
        if step in (0, 1):
            b = breaks[step]
            at = int(np.searchsorted(b, i))
            j = int(b[at]) if at < b.size else n - 1
        first = int(vals[i])
        if step == 0 and j > i:
            parts.append(f"{first} x{j - i + 1}")
        elif step == 1 and j - i + 1 >= RUN_MIN:
            parts.append(span(first, int(vals[j]) + 1))
        else:
            j = i
            parts.append(str(first))
        i = j + 1
    return parts


def tokens(pairs: Iterable[tuple[int, tuple[int, ...]]], limit: int | None = None) -> str:
    """(pos, seq ids) pairs by sequence set, in order of first appearance, positions
    `folded` (at most `limit` parts each): `seq 0 pos 12; seq 0,1 pos 13..16`."""
    by_seqs: dict[tuple[int, ...], list[int]] = {}
    for p, ss in pairs:
        by_seqs.setdefault(tuple(ss), []).append(p)
    return "; ".join(f"seq {','.join(map(str, ss))} pos {folded(ps, limit)}"
                     for ss, ps in by_seqs.items()) or NONE


def stale_one(seq: int, pos: int) -> str:
    """One sequence's stale position: `seq 0 from pos 12` (its pools from pos 12 on
    may have regrouped: ENGINE.md §4)."""
    return f"seq {seq} from pos {pos}"


def stale(positions: Mapping[int, int] | Iterable[tuple[int, int]]) -> str:
    """The stale positions of sequences, by seq id: `seq 0 from pos 12, seq 1 from
    pos 0`; `none` when there are none."""
    items = positions.items() if isinstance(positions, Mapping) else positions
    return ", ".join(stale_one(s, p) for s, p in sorted(items)) or NONE


def seqs(ids: Iterable[int]) -> str:
    """Sequences by seq id, in the order given: `seq 1` for one, `seqs 0, 1` for more.

    >>> seqs([1]), seqs([0, 1])
    ('seq 1', 'seqs 0, 1')
    """
    named = [str(int(s)) for s in ids]
    return ("seq " if len(named) == 1 else "seqs ") + ", ".join(named)


def pools(pairs: Iterable[tuple[int, int]], limit: int | None = None) -> str:
    """(seq, k) pools in the order given, as `seq:k`; RUN_MIN or more consecutive
    pools of one sequence as the run `seq:k0..k1` (half-open); at most `limit` parts,
    then `... (n)` with n the number of pools. `none` when empty."""
    ps = [(int(s), int(k)) for s, k in pairs]
    parts: list[str] = []
    i = 0
    while i < len(ps) and (limit is None or len(parts) <= limit):
        j = i
        while j + 1 < len(ps) and ps[j + 1] == (ps[j][0], ps[j][1] + 1):
            j += 1
        if j - i + 1 >= RUN_MIN:
            parts.append(f"{ps[i][0]}:{span(ps[i][1], ps[j][1] + 1)}")
        else:
            j = i
            parts.append(f"{ps[i][0]}:{ps[i][1]}")
        i = j + 1
    return _limited(parts, limit, len(ps)) or NONE


def place(op: int, batch_ubatch: int | None = None) -> str:
    """A place in a replay: `op 3.0`, op 3's ubatch 0 (`batch_ubatch`, its position in
    its batch); `op 3` without one, the op itself (an edit, a refused decode).

    >>> place(3, 0), place(1)
    ('op 3.0', 'op 1')
    """
    return f"op {op}" if batch_ubatch is None else f"op {op}.{batch_ubatch}"


def writer(w: tuple[int, int]) -> str:
    """A scatter entry's writer as messages name it: `seq:k`, or `padding` for (-1, -1)."""
    return "padding" if tuple(w) == (-1, -1) else f"{w[0]}:{w[1]}"


def code(code: str, name: str = "") -> str:
    """A finding code with its name (`KP001 scatter-race`), the code alone without."""
    return f"{code} {name}" if name else code


# -- numbers -------------------------------------------------------------------------------

# a count of this many or more is grouped by thousands in the text views and pages
# (`12,345`, `1,048,576`); a smaller one is not (`1247` reads at once, and stays short
# in `1247 -> 634`)
GROUPED_FROM = 10_000


def count(n: int) -> str:
    """A count (ubatches, tokens, pools, entries, cells scanned, findings, runs, and a
    bound on one) as the text views and pages show it: grouped by thousands from
    GROUPED_FROM on (`12,345`), bare below (`1247`). A number that names a place in a
    trace (a position, a cell, a row, a ubatch or op index, a seed, a cache setting)
    is never grouped: it is shown as the trace and the JSON report write it, to be
    found there. The JSON, JUnit and SARIF formats write every number bare."""
    return f"{n:,}" if abs(n) >= GROUPED_FROM else str(n)


def counted(n: int, noun: str, plural: str = "", number: Callable[[int], str] = count
            ) -> str:
    """`n` and its noun, singular for 1 and plural otherwise: `1 token`, `0 tokens`,
    `12,345 tokens` (`count`; `number=str` writes it bare); `plural` when the noun
    does not take an `s` (`entry`, `entries`)."""
    return f"{number(n)} {noun if n == 1 else plural or noun + 's'}"


def suggest(word: str, known: Iterable[str]) -> str:
    """` (did you mean 'rep-once'?)`: the known name closest to a word that is none
    (difflib's), or "" when none is close or the word is too long to compare."""
    if len(word) > 100:
        return ""
    close = difflib.get_close_matches(word, list(known), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def clip(text: str, n: int = 40) -> str:
    """`text`, cut to `n` characters: a message never echoes a whole value."""
    return text if len(text) <= n else text[: n - 3] + "..."


def quoted(text: str, n: int = 40) -> str:
    """`text` clipped (`clip`) and quoted as Python writes a str: `'rep_once'`."""
    return repr(clip(text, n))


def unknown_key(key: str, known: Sequence[str]) -> str:
    """`unknown key 'form' (did you mean 'from'?); known keys: seq, from`: the key
    quoted (`quoted`), `known` in the order a reader meets them."""
    return f"unknown key {quoted(key)}{suggest(key, known)}; known keys: {', '.join(known)}"


def code_count(code: str, n: int, number: Callable[[int], str] = count) -> str:
    """How many findings of `code`: `KP001 x12`, `KP001 x12,345` (`count`; `str` for
    a format that writes numbers bare)."""
    return f"{code} x{number(n)}"


# -- where a line may break ----------------------------------------------------------------

# what a wrapped line never splits: a stale position, a token, a sequence set with its
# first positions (`seq 0,1 pos 13..16`, `seq 0 pos 5 x3`), a list's tail, a short
# parenthesis (`(op 3, ubatch 1)`, `(kpool explain KP001)`), a code's count or its
# name (`KP001 scatter-race`: a name is hyphenated, so `KP003 not` is no unit), an option
# with its value (`--fail-on error`), a label with its first value (`seq 0`, `pos 5
# x3`, `kv_size 32`), a repeated value, a number with the word it counts (`2
# unpinned`), a time with its unit and the word before it (`in 5.8 s`); punctuation
# and a `·` separator stay with what they end
_UNIT = re.compile(r"""
    (?: seq\ \d+\ from\ pos\ \d+
      | pos\ \d+\ seq\ \d+(?:,\d+)*
      | seq\ \d+(?:,\d+)*\ pos\ -?\d\S*?(?:\ x\d+)?(?=[\s,;:)]|$)
      | \.\.\.\ \(\d+\)
      | \(kpool\ [^()]*\)
      | \([^()\s]+(?:\ [^()\s]+){0,3}\)
      | KP\d{3}\ x\d+
      | KP\d{3}\ [a-z][a-z0-9]*(?:-[a-z0-9]+)+
      | --[a-z][\w-]*\ [a-z0-9][\w.:-]*
      | (?:[A-Za-z_][\w-]*\ )?\d+(?:\.\d+)?\ (?:s|ms|µs|min)(?=[\s,;:)]|$)
      | [A-Za-z_][\w-]*\ -?\d\S*?(?:\ x\d+)?(?=[\s,;:)]|$)
      | -?\d+\ x\d+
      | \d+\ [a-z][\w()'-]*
      | \S+ )
    \S*(?:\ ·(?!\S))?""", re.X)


def units(text: str) -> list[str]:
    """`text` cut where a wrapped line may break: at spaces, but never inside a unit
    it words as one (above). Joined by single spaces, the units are `text` with its
    runs of whitespace made one space. A view wraps between units; nothing here
    changes how anything is worded.

    >>> units("stale seq 0 from pos 12, seq 1 from pos 0")
    ['stale', 'seq 0 from pos 12,', 'seq 1 from pos 0']
    >>> units("pools 0:0 · 5 x3 (op 3, ubatch 1) KP001 x2")
    ['pools 0:0 ·', '5 x3', '(op 3, ubatch 1)', 'KP001 x2']
    >>> units("seq 0 pos 12; seq 0,1 pos 13..16 KP001 scatter-race")
    ['seq 0 pos 12;', 'seq 0,1 pos 13..16', 'KP001 scatter-race']
    >>> units("seq 0 pos 5 x3 6; KP003 not compared; KP009 rows 3 7")
    ['seq 0 pos 5 x3', '6;', 'KP003', 'not', 'compared;', 'KP009', 'rows 3', '7']
    """
    return _UNIT.findall(text)


def joined(head: str, lead: str, rest: str) -> str:
    """A line in parts as one: `head`, then `lead` and `rest` after a space each (none
    after a head that is only an indent)."""
    line = head
    for part in (lead, rest):
        if part:
            line += (" " if line.strip() else "") + part
    return line.rstrip()


def fit(head: str, lead: str, rest: str, hang: str, width: int | None) -> str:
    """A line in parts (`joined`) as its line when it fits `width` (or there is none),
    else as lines that break only between the units of its rest (`units`): the head
    and the lead whole first, each further line `hang` in. A unit wider than the width
    takes a line of its own. Each line ends with a newline.

    >>> print(fit("a.yaml:3:5:", "", "seq 1 from pos 12, seq 0 from pos 4", "    ", 30), end="")
    a.yaml:3:5: seq 1 from pos 12,
        seq 0 from pos 4
    """
    line = joined(head, lead, rest)
    if width is None or len(line) <= width:
        return line + "\n"
    fresh = not head.strip()  # only an indent so far
    lines = [head if fresh else head.rstrip()]
    for unit in ([lead] if lead else []) + units(rest):
        if fresh or len(lines[-1]) + 1 + len(unit) <= width:
            lines[-1] += ("" if fresh else " ") + unit
            fresh = False
        else:
            lines.append(hang + unit)
    return "".join(ln + "\n" for ln in lines)


def fit_line(line: str, width: int | None, hang: str = "    ") -> str:
    """A line of text (`file:line:col: field: message`, `kpool: message`) fitted to
    `width` (`fit`): its indent and first unit kept as the head, the lines after
    the first `hang` further in than its indent."""
    body = line.lstrip(" ")
    indent = line[:len(line) - len(body)]
    first, _, rest = body.partition(" ")
    return fit(indent + first, "", rest, indent + hang, width)


SPARKS = "▁▂▃▄▅▆▇█"


def sparkline(values: Sequence[int], top: int | None = None) -> str:
    """A mark per value, scaled to `top` (default: the largest; give two series one
    `top` to compare them): `▁` for 0 and below, `█` for `top`."""
    top = max(values, default=0) if top is None else top
    if top <= 0:
        return SPARKS[0] * len(values)
    last = len(SPARKS) - 1
    return "".join(SPARKS[0] if v <= 0 else SPARKS[min(last, max(1, -(-v * last // top)))]
                   for v in values)


def per_bin(per: int) -> str:
    """How many ubatches a folded value covers: `per ubatch`, `most of each 4 ubatches`."""
    return "per ubatch" if per == 1 else f"most of each {count(per)} ubatches"
