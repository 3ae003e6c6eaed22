"""Saved reports as `kpool diff` input: untrusted files, read with bounds, checked
field by field against the report format's declaration, turned into `RunSummary`s.

Reports are attached to bug reports and passed around, so nothing in one is trusted.
Owns: `input_kind` (is a path a report or a trace?), `read_reports` (a file to
summaries), `from_report` (one parsed report object to a summary), `ReportError`.

What a report must be, and what happens otherwise. Every failure is a `ReportError`
naming the file and, for a field, `FILE:LINE:COL: PATH: problem`: the line and column
where the field's value starts (a missing field: its object's), found once, for the
message, by following the path in the text (`_Text.value_at`), and its JSON path
(`reports[1].ubatches[3].findings[0].code` in a file holding an array of reports,
`report.engine` in a file holding one); `FILE:LINE:COL: not JSON: ...` for what is
not JSON at all. `kpool diff` exits 2 with it.

- The format, from its one declaration. Every field is checked against the JSON
  Schema `report.format` declares (`report_schema()`, `kpool schema report`),
  compiled here into checks (`_compile`: the keywords the schema uses, no other; a
  keyword it starts using fails the compile, not a report): every declared field
  there with its type, bounds, pattern, enum or const, the array lengths, the
  forms of `oneOf` (a pool or a pool run, an entry or an entry run: exactly one),
  the names of map keys. So a report this reader accepts validates against the
  schema (tests/test_diff_bounds.py checks it with jsonschema); the format is open,
  and a field it does not declare (known to a later version) is checked as JSON and
  not kept. Then what the schema cannot say (the `_HOOKS`, by place in the schema):
  the report is bounded by its own config (below), and its counts agree with what
  they count. A report of one object, or an array of two or more (the schema's
  root; kpool writes a single report as an object).
- Bounds from the config. `config` is the trace's cache block, so its fields have
  the trace's bounds too (`trace.format.CACHE`: kv_size at most 2**24, n_seq_max 256,
  n_ubatch 2**20, ...; kpool at most kv_size), and every later field is bounded by
  it, checked as it is read, before anything is built from it:
  - a ubatch holds 1 to `n_ubatch` tokens (the context's: capped at `n_batch` and
    the cache's rows when the report records n_batch, `trace.model.context_batch`, as
    the replay splits), or `n_ubatch + 1` when n_seq_max > n_ubatch (split_equal
    always takes its first lock-step round, one token of each of up to n_ubatch + 1
    sequence sets, docs/ENGINE-NOTES.md; the n_rs_seq tail it
    keeps together only ever gives tokens back or finishes a set within n_ubatch);
    the tokens array is refused as soon as it holds more;
  - seq ids (tokens, stale maps, pools, findings) are below `n_seq_max`, and a token,
    a stale map or a finding names at most that many; rows
    (a token's `cell`, pool members and reps, scatter rows, a finding's rows and
    row runs, every row a run stands for) below `kv_size * n_stream`, and in a
    non-unified cache a token's row is in its sequence's stream; positions are below
    2**31 - 2**20 (`trace.format.POS_LIMIT`), `ext` only with `by_order`;
  - a sequence holds at most kv_size // kpool pools (pools are kpool pairs each,
    never overlapping), so `k` is below it and `n_pool_real` at most n_seq_max times
    it; `n_new` at most `n_pool_real`; the pools listed at most `n_pool_real`, those
    marked new exactly `n_new`; `n_new_g` at most `engine.marking.n_new_graph`'s
    bound for the ubatch, and the scatter plan exactly `n_new_g` entries (none when
    the engine aborted the ubatch); a pool and an entry have `kpool` member rows; a
    finding names at most the cache's rows, pools and a ubatch's tokens; a ubatch's
    cost at most 64 counters past the declared ones (a later version's);
  - ubatches are in order: `index` 0, 1, 2, ...; `op` never goes back, and
    `batch_ubatch` counts 0, 1, ... within an op; `op` (of ubatches and events) is
    below the trace loader's `MAX_OPS` (2**16), and an op's ubatches hold at most the
    cache's rows of tokens (the decode is placed whole before its first ubatch runs),
    and at most a recorded `n_batch` (a larger decode aborts before its first ubatch).
    So the ubatches are at most MAX_OPS times kv_size * n_stream, and, each at least
    a token, fewer than the file's bytes.
  Every array and object with such a bound is refused as soon as it holds one item
  too many, before the rest of it is read.
- Memory, before the work. Runs (`pools[].k` `[k0, k1]`, scatter runs, `row_runs`)
  stand for many pools, entries and rows in a few bytes: a summary holds them all.
  So what every ubatch, token, pool, entry, row and event will take is counted as
  it is read, before it is built (the `_*_BYTES` estimates, above what CPython takes),
  and a file is refused when its reports would pass `MEMORY_PER_BYTE` (6) times its
  size plus `MEMORY_FLOOR` (32 MiB). Every shipped trace's report takes under 4.2
  times its size; a long cache-safe replay's (every pool marked in every ubatch, as
  runs of a few bytes) can take a thousand times: it is refused, diff shorter traces.
- Size and reading: a file larger than `MAX_REPORT_BYTES` (128 MiB) is refused, and
  never more than that is read (a multi-GB attachment, `/dev/zero`); `-` is standard
  input (`inputs.STDIN`, named `<stdin>`), read under the same bound. A value is
  parsed by the C parser at once when it is small (`SMALL_BYTES`, 64 KiB: a ubatch,
  a token, a run of tokens), else read part by part (`_Text`), so no part of a
  report is held as a parsed tree larger than that (LINES_BYTES of kpool's own
  lines, below), and what no version declares (junk, however nested) is checked
  and dropped as it is read. Reading keeps the file's text (its size) and the
  summaries (the budget above), little else.
- Kpool's own lines, at once (`_ubatch_lines`). Where `ubatches` is laid out as kpool
  writes it, a ubatch a line as orjson writes it, runs of whole lines (at most
  `LINES_BYTES`, 256 KiB) are parsed by orjson and checked over whole columns
  (`_ubatch_columns`, numpy): every check above, the same summaries, in a quarter to
  a third of the time (docs/performance.md). A run is taken only when orjson writes
  what it parsed back to the very same text (no key twice, no number or string
  written another way) and every check holds for it; else nothing of it is, and the
  precise path reads those lines and words what is wrong as it always does. The
  rules of the posts (`_ubatch_post`, `_token_post`, `_pool_post`, `_scatter_post`,
  `_ubatch_order`) are written a second time there, over columns (the bounds alone
  are read from the schema, `_int_bounds`): a rule changed in one is changed in the
  other, and tests/test_diff_bounds.py ("a report as kpool writes it") holds the two
  paths to each other on edited reports. The precise path
  reads runs of small items at once (`_Text.items`) and, of two problems in one run,
  words the one its parser meets: so where it meets a problem past lines taken (its
  runs did not all start where they do without them), it reads the array again from
  its start without them, and no message depends on which path met the problem.
  The budget is charged for a run before any of it is built.
- JSON: UTF-8 (a leading byte order mark is allowed), RFC 8259 JSON. `NaN`,
  `Infinity`, duplicate keys in any object, and lone surrogates in a string of the
  format are refused where they are; nesting past `MAX_DEPTH` (512) levels is
  refused at the line and column where it goes past `DEPTH_SHOWN` (100: a report
  nests 6).
- Numbers: every integer of the format is one of at most 64 bits (`1e999`, `1.0`,
  `10**5000` and `true` are not). Numbers of fields it does not declare are not
  converted past 4,300 digits (int's limit), so no size of them costs anything.
- Another kpool version: a `kpool_report` other than 1, a finding code this kpool
  does not know (a newer kpool may add KP008), or a value backend it does not know
  is refused, naming the value and the kpool version that wrote the report: its
  severity and meaning are unknown here, so no verdict on it could be right. Diff
  such reports with the kpool that wrote them, or replay the traces with this one.
- A stopped replay: a report whose trace turned out invalid mid-replay (`problems`,
  `summary.status` "invalid"), or whose replay a signal ended (`summary.status`
  "interrupted"), is not a whole run and is refused.

Classification (`input_kind`): a path ending in `.json` is a report and one ending
in `.yaml` or `.yml` a trace, by name (JSON is YAML: a generator may write a trace
in JSON syntax); any other file by content: its first non-blank byte is `{` or `[`
for a report, anything else (or an unreadable file) is a trace.
"""

from __future__ import annotations

import functools
import gc
import json
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, fields
from itertools import chain
from json.decoder import scanstring  # type: ignore[attr-defined]
from operator import itemgetter
from typing import Any, NoReturn, TypeVar

import numpy as np
import orjson

from .. import __version__
from ..contracts.report_format import (
    CONFIG,
    COST,
    COST_KEYS,
    POOL,
    POOL_RUN,
    REPORT,
    REPORT_VERSION,
    SCATTER,
    SCATTER_RUN,
    STOPPED_STATUSES,
    TOKEN,
    UBATCH,
    VALUE_BACKENDS,
    Record,
    report_schema,
)
from ..engine.marking import n_new_graph
from ..inputs import (
    InputRefused,
    InputTooLarge,
    input_name,
    line_at,
    nesting_past,
    read_head,
    read_input,
)
from ..trace.format import CACHE, FINDING_CODE_PATTERN, POS_LIMIT
from ..trace.model import context_batch, context_cells
from ..trace.yaml_safe import MAX_OPS
from ..verdict.codes import CODES
from ..wording import visible
from .summary import (
    ENGINE_ABORT,
    EventSummary,
    FindingKey,
    RunSummary,
    ScatterEntry,
    UbatchSummary,
    ubatch_summaries,
)

MAX_REPORT_BYTES = 128 * 1024 * 1024  # a larger report is refused, and not read
SNIFF_BYTES = 64 * 1024  # blank bytes looked through for the first non-blank one
DEPTH_SHOWN = 100  # a report nests 6 levels; too deep a nesting is shown from here
MAX_DEPTH = 512  # arrays and objects nested deeper are refused
SMALL_BYTES = 64 * 1024  # a value this long or shorter is parsed at once
LINES_BYTES = 4 * SMALL_BYTES  # the most text of whole ubatch lines parsed at once (0: none)
RUN_ITEMS = 4096  # the most array items parsed at once (SMALL_BYTES of them at most)
TINY_ITEM = 256  # a problem's place is walked to past runs of items this short (bytes)
SKEL_DEPTH = 16  # the nesting a value parsed at once may have
MEMORY_PER_BYTE = 6  # a report may take this many times its size in memory ...
MEMORY_FLOOR = 32 * 1024 * 1024  # ... plus this
INT_MIN, INT_MAX = -(2**63), 2**63 - 1

# what a summary's parts take in memory (CPython, 64-bit), for the budget
_UBATCH_BYTES = 1024  # UbatchSummary, its tuples and its cost counters
_TOKEN_BYTES = 96  # (pos, seqs) and its int
_POOL_BYTES = 96  # (seq, k), its int, its slot in `marked`
_ENTRY_BYTES = 112  # (rep, rows, pad) and its rows tuple, plus 36 a row
_ROW_BYTES = 36  # an int and its slot in a tuple
_FINDING_BYTES = 128
_EVENT_BYTES = 256  # EventSummary and its tuples, plus its strings

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*", re.ASCII)
_SURROGATE = re.compile("[\ud800-\udfff]")
_WS = re.compile(r"[ \t\n\r]*")
_STR = r'"(?:[^"\\]++|\\.)*+"'
# a step of a JSON path as a message writes it (`_key`, `[i]`): a name, an index, a key
_STEP = re.compile(r'\.([A-Za-z_][A-Za-z0-9_]*)|\[(\d+)\]|\[("(?:[^"\\]|\\.)*")\]')
_STRING_OR_BRACKET = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]', re.DOTALL)

# what a pattern of the schema means, said when a value does not match it
_PATTERN_SAYS = {
    FINDING_CODE_PATTERN: "not a finding code: {} (codes are KP and three digits)",
    "^([0-9a-f]{64})?$": "not a sha256 (64 lowercase hex digits): {}",
    "^(0|[1-9][0-9]*)$": "not a seq id: {} (keys are seq ids: \"0\", \"1\", ...)",
}


class ReportError(Exception):
    """A file that is not a kpool report this version can compare (exit 2)."""


# --- is it a report? --------------------------------------------------------------------


def input_kind(path: str) -> tuple[str, str]:
    """("report" | "trace", how that was decided) for a `kpool diff` input."""
    low = path.lower()
    if low.endswith(".json"):
        return "report", "named .json"
    if low.endswith((".yaml", ".yml")):
        return "trace", f"named {low[low.rfind('.'):]}"
    try:  # read_head opens without blocking: a FIFO is refused, never waited on
        chunk = read_head(path, SNIFF_BYTES)
    except InputRefused:
        return "trace", "not a regular file"  # its load says why, by name
    except OSError:
        return "trace", "unreadable"
    chunk = chunk.removeprefix(b"\xef\xbb\xbf").lstrip(b" \t\r\n")
    if chunk[:1] in (b"{", b"["):
        return "report", f"starts with {chunk[:1].decode()}"
    return "trace", "does not start with { or ["


# --- problems and how values are shown ----------------------------------------------------


class _Bad(Exception):
    """A field that is not what the report format says: the problem, and the path to
    it, gathered innermost first as the error goes up. `progress`: how many fields of
    the innermost record held before it (picks the form of a `oneOf` meant)."""

    def __init__(self, problem: str, *where: str) -> None:
        super().__init__(problem)
        self.problem = problem
        self.where = list(where)
        self.progress = 0


def _clip(s: str, n: int = 40) -> str:
    return s if len(s) <= n else f"{s[:n - 10]}... ({len(s)} characters)"


class _Number:
    """A number the parser did not convert: a float (`1.5`, `1e999`), an integer of
    more than 4,300 digits, or a non-JSON constant (`NaN`, `Infinity`; `bad`)."""

    __slots__ = ("bad", "text")

    def __init__(self, text: str, bad: bool = False) -> None:
        self.text, self.bad = text, bad

    @property
    def integral(self) -> bool:
        return self.text.lstrip("-").isdigit()


def _digits(text: str) -> str:
    return f"{text[:12]}... (an integer of {len(text.lstrip('-'))} digits)"


def _show(v: object) -> str:
    """A value as the message shows it: short, ASCII, and no control character."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        try:
            text = str(v)
        except ValueError:  # past int's 4,300 digits
            return "an integer of more than 4300 digits"
        return _digits(text) if len(text) > 30 else text
    if isinstance(v, float):
        return _clip(repr(v))
    if isinstance(v, _Number):
        if v.integral and len(v.text) > 30:
            return _digits(v.text)
        return _clip(v.text)
    if isinstance(v, str):
        return "the string " + json.dumps(_clip(v, 60))
    if isinstance(v, list):
        return "an array"
    return "an object"


def _key(k: str) -> str:
    """A path step for key `k`: `.name`, or `["odd key"]` (ASCII-escaped)."""
    return f".{k}" if _NAME.fullmatch(k) else f"[{json.dumps(_clip(k, 60))}]"


def _out_of_range(v: int, lo: int, hi: int) -> _Bad:
    shown = _show(v)
    if "digits" in shown:
        return _Bad(f"{shown} is out of range (integers of at most 64 bits)")
    return _Bad(f"{v} is out of range ({f'at least {lo}' if v < lo else f'at most {hi}'})")


# --- JSON, read part by part, with bounds ---------------------------------------------------


class _Dup(dict):
    """An object that had a key twice (the last value kept, as json does)."""

    __slots__ = ("duplicate",)
    duplicate: str  # the first key seen twice


class _Parser:
    """The C parser's hooks: duplicate keys and NaN are marked (`suspect`), found
    later by `_find_suspect`; integers are converted by the parser itself, except (the
    slow parser, after int's 4,300-digit limit was hit) those of more than 20 digits."""

    def __init__(self) -> None:
        self.suspect = False

    def integer(self, text: str) -> int | _Number:
        return int(text) if len(text) <= 20 else _Number(text)

    def constant(self, text: str) -> _Number:
        self.suspect = True
        return _Number(text, bad=True)

    def pairs(self, pairs: list[tuple[str, Any]]) -> dict:
        d = dict(pairs)
        if len(d) == len(pairs):
            return d
        self.suspect = True
        seen: set[str] = set()
        out = _Dup(d)
        out.duplicate = next(k for k, _ in pairs if k in seen or seen.add(k))  # type: ignore[func-returns-value]
        return out


def _find_suspect(v: object) -> tuple[str, str] | None:
    """(path in `v`, problem) of the first NaN/Infinity or duplicate key, in document
    order."""
    stack: list[tuple[str, object]] = [("", v)]
    while stack:
        path, x = stack.pop()
        if isinstance(x, _Number) and x.bad:
            return path, f"{x.text} is not JSON (a report holds only integers)"
        if isinstance(x, dict):
            if isinstance(x, _Dup):
                return path, f"duplicate key {json.dumps(_clip(x.duplicate, 60))}"
            stack.extend((path + _key(k), y) for k, y in reversed(x.items()))
        elif isinstance(x, list):
            stack.extend((f"{path}[{i}]", y) for i, y in reversed(list(enumerate(x))))
    return None


def _place(file: str, text: str, offset: int) -> str:
    """`FILE:LINE:COL`, where `offset` of the file's `text` is (as a trace's problems
    are placed)."""
    col = offset - (text.rfind("\n", 0, offset) + 1) + 1
    return f"{file}:{line_at(text, offset)}:{col}"


def _too_deep(file: str, text: str, at: int) -> str:
    return (f"{_place(file, text, at)}: arrays and objects nested too deeply to read "
            f"(past {DEPTH_SHOWN} levels here; a report nests 6)")


def _too_deep_at(text: str) -> int:
    """Where the nesting of `text` first goes past DEPTH_SHOWN levels (0 if it does not)."""
    return nesting_past(text, _STRING_OR_BRACKET, DEPTH_SHOWN) or 0


@functools.cache
def _skeleton(depth: int) -> re.Pattern[str]:
    """An array or object of at most `depth` levels, its strings skipped whole: where a
    value ends, found without parsing it (the C parser, given the same text, ends it
    there or fails before)."""
    inner = ""
    for _ in range(depth):
        alt = r'[^"\[\]{}]++|' + _STR + (f"|{inner}" if inner else "")
        inner = rf"[\[{{](?:{alt})*+[\]}}]"
    return re.compile(inner, re.DOTALL)


def _item(depth: int) -> str:
    """The pattern of an array item: a string, a scalar, or a value of `depth` levels."""
    return rf'(?:{_STR}|{_skeleton(depth).pattern}|[^"\[\]{{}},:\s]++)'


@functools.cache
def _run_of_items(depth: int) -> re.Pattern[str]:
    """Up to RUN_ITEMS array items (scalars, or values of `depth` levels) with the
    commas between them, ending at an item."""
    item = _item(depth)
    return re.compile(rf"{item}(?:[ \t\n\r]*+,[ \t\n\r]*+{item}){{0,{RUN_ITEMS - 1}}}"
                      r"(?=[ \t\n\r]*[,\]])", re.DOTALL)


@functools.cache
def _items_and_comma(depth: int) -> re.Pattern[str]:
    """Exactly RUN_ITEMS array items (values of at most `depth` levels), each with the
    comma after it."""
    return re.compile(rf"(?:{_item(depth)}[ \t\n\r]*+,[ \t\n\r]*+){{{RUN_ITEMS}}}", re.DOTALL)


@functools.cache
def _value_end() -> re.Pattern[str]:
    """A value (of at most SKEL_DEPTH levels), matched to its end without parsing it."""
    return re.compile(_item(SKEL_DEPTH), re.DOTALL)


class _Text:
    """A report's text, read value by value: a small value (`SMALL_BYTES`) is parsed at
    once by the C parser, a larger one part by part, its parts checked as they come
    (so a bound is met before the rest is parsed, and no parsed tree is larger than
    a small value). Errors: ReportError (not JSON: line and column) or _Bad."""

    def __init__(self, text: str, file: str) -> None:
        self.text, self.file = text, file
        self.p = _Parser()
        fast = json.JSONDecoder(object_pairs_hook=self.p.pairs, parse_float=_Number,
                                parse_constant=self.p.constant)
        slow = json.JSONDecoder(object_pairs_hook=self.p.pairs, parse_float=_Number,
                                parse_constant=self.p.constant, parse_int=self.p.integer)
        self.fast = fast.scan_once  # type: ignore[attr-defined]
        self.slow = slow.scan_once  # type: ignore[attr-defined]
        self.opens: list[int] = []  # where the arrays and objects being read start

    # -- errors ------------------------------------------------------------------------

    def fail(self, pos: int, msg: str) -> NoReturn:
        raise ReportError(f"{_place(self.file, self.text, pos)}: not JSON: {msg}")

    def too_deep(self, more: list[int]) -> NoReturn:
        opens = self.opens + more
        at = opens[DEPTH_SHOWN] if len(opens) > DEPTH_SHOWN else _too_deep_at(self.text)
        raise ReportError(_too_deep(self.file, self.text, at))

    def value_at(self, path: str) -> int:
        """Where the value at JSON `path` (steps as a message writes them, from the
        document's root value) starts, as far as the text holds it: a missing field's
        object, a key too long to quote whole (`_clip`) its object. Called once, for a
        problem, on text already read up to that value: the members and items before
        it are skipped by shape (`_skeleton`), not parsed, or, nested deeper than it
        matches, by `skip`; after an item of less than TINY_ITEM bytes, an array's
        items whole runs at a time (`_past_runs`), as the reader took them. So the walk
        costs about what the reading did, at most."""
        text = self.text
        pos = self.ws(0)
        for level, m in enumerate(_STEP.finditer(path), 2):  # the root's items: level 2
            name, index = (m[1] if m[1] is not None else
                           json.loads(m[3]) if m[3] is not None else None), m[2]
            open_, close = ("[", "]") if index is not None else ("{", "}")
            if not text.startswith(open_, pos):
                break
            i, n, found = self.ws(pos + 1), 0, False
            short, retry = False, i  # the last item was short; runs are tried from retry
            while not text.startswith(close, i):
                if name is not None:
                    if not text.startswith('"', i):
                        break
                    k, i = scanstring(text, i + 1, True)
                    i = self.ws(self.ws(i) + 1)  # past the colon
                    found = k == name
                else:
                    if short and i >= retry:
                        i, n, retry = self._past_runs(i, n, int(index), level)
                    found = n == int(index)
                if found:
                    pos = i
                    break
                end = _value_end().match(text, i)
                try:
                    j = end.end() if end is not None else self.skip(i, level)
                except (_Bad, ReportError):  # not met: the text was read up to here
                    break
                short = j - i < TINY_ITEM
                i, n = self.ws(j), n + 1
                if not text.startswith(",", i):
                    break
                i = self.ws(i + 1)
            if not found:
                break
        return pos

    def _past_runs(self, i: int, n: int, want: int, level: int) -> tuple[int, int, int]:
        """From item n of an array, at `i`: past whole runs of RUN_ITEMS items (each
        matched by shape within RUN_ITEMS * TINY_ITEM bytes, at level `level`, none
        parsed) that end before item `want`: (where the next item starts, its index,
        where runs are worth trying again). A run that does not fit is tried again
        only past the bytes it was looked for in, so no byte is matched more than
        twice, whatever mix of short and long items. For items of a few bytes: 31
        million of them took 58 s one by one; a ubatch of 7 KB is passed as fast one
        by one (`value_at`)."""
        window = RUN_ITEMS * TINY_ITEM
        k = min(SKEL_DEPTH, MAX_DEPTH - level + 1)
        while want - n > RUN_ITEMS and k > 0:
            m = _items_and_comma(k).match(self.text, i, i + window)
            if m is None:
                return i, n, i + window
            i, n = self.ws(m.end()), n + RUN_ITEMS
        return i, n, len(self.text)  # the item is a run's reach away: one by one

    # -- pieces ------------------------------------------------------------------------

    def ws(self, pos: int) -> int:
        return _WS.match(self.text, pos).end()  # type: ignore[union-attr]

    def small_end(self, pos: int, depth: int) -> int:
        """The end of the array or object at pos when it is small and nests at most
        to MAX_DEPTH (its level: `depth`), else -1."""
        k = min(SKEL_DEPTH, MAX_DEPTH - depth + 1)
        if k <= 0:
            return -1
        m = _skeleton(k).match(self.text, pos, pos + SMALL_BYTES)
        return m.end() if m else -1

    def parse(self, pos: int, text: str | None = None, shift: int = 0) -> tuple[Any, int]:
        """The value at `pos` (a scalar, or a small value), parsed by the C parser;
        `text`: a piece made of the report's text from `shift` on."""
        s = self.text if text is None else text
        try:
            try:
                v, end = self.fast(s, pos)
            except (StopIteration, json.JSONDecodeError):
                raise
            except ValueError:  # an integer past int's 4,300 digits
                v, end = self.slow(s, pos)
        except StopIteration as e:
            self.fail(max(0, e.value + shift), "Expecting value")
        except json.JSONDecodeError as e:
            self.fail(max(0, e.pos + shift), e.msg)
        except RecursionError:
            self.too_deep([])
        if self.p.suspect:
            self.p.suspect = False
            found = _find_suspect(v)
            if found is not None:
                raise _Bad(found[1], found[0])
        return v, end

    def key(self, pos: int, keys: set[str]) -> tuple[str, int]:
        """The key of an object member at `pos` (not one in `keys`: a duplicate is a
        _Bad at the object), and where its value starts."""
        text = self.text
        if not text.startswith('"', pos):
            self.fail(pos, "Expecting property name enclosed in double quotes")
        try:
            k, i = scanstring(text, pos + 1, True)
        except json.JSONDecodeError as e:
            self.fail(e.pos, e.msg)
        if k in keys:
            raise _Bad(f"duplicate key {json.dumps(_clip(k, 60))}")
        keys.add(k)
        i = self.ws(i)
        if not text.startswith(":", i):
            self.fail(i, "Expecting ':' delimiter")
        return k, self.ws(i + 1)

    def after(self, pos: int, close: str) -> tuple[bool, int]:
        """After a member or item: (another follows, where it starts or where the
        container ends)."""
        i = self.ws(pos)
        c = self.text[i:i + 1]
        if c == ",":
            return True, self.ws(i + 1)
        if c == close:
            return False, i + 1
        self.fail(i, "Expecting ',' delimiter")

    def items(self, pos: int, depth: int) -> tuple[list[Any], int] | None:
        """A run of small items of the array whose item starts at `pos` (at most
        SMALL_BYTES of text), parsed at once: (the items, where the run ends); None when
        the item there is not small."""
        k = min(SKEL_DEPTH, MAX_DEPTH - depth + 1)
        if k <= 0:
            return None
        m = _run_of_items(k).match(self.text, pos, pos + SMALL_BYTES)
        if m is None:
            return None
        piece = "[" + self.text[pos:m.end()] + "]"
        v, end = self.parse(0, piece, pos - 1)
        if end != len(piece):
            self.fail(pos - 1 + end, "Expecting ',' delimiter")
        return v, m.end()

    def shape(self, pos: int, depth: int) -> dict[str, Any]:
        """The object at `pos` as its keys, each with its value if a scalar, else an
        empty array or object (what a `oneOf` tells its forms by), the values checked
        as JSON and not kept."""
        out: dict[str, Any] = {}
        keys: set[str] = set()
        i = self.ws(pos + 1)
        more = not self.text.startswith("}", i)
        while more:
            k, i = self.key(i, keys)
            c = self.text[i:i + 1]
            if c in ("[", "{"):
                out[k], i = ([] if c == "[" else {}), self.skip(i, depth + 1)
            else:
                out[k], i = self.parse(i)
            more, i = self.after(i, "}")
        return out

    def skip(self, pos: int, depth: int) -> int:
        """The end of the value at `pos` (its level: `depth`), checked as JSON (syntax,
        NaN, duplicate keys, nesting) and not kept: no more than a small value is ever
        held. Iterative: any nesting up to MAX_DEPTH."""
        text = self.text
        # per open container: [its start, an object?, its keys, the step to the child]
        stack: list[list[Any]] = []
        i = pos
        try:
            while True:
                c = text[i:i + 1]
                d = depth + len(stack)
                run = None
                if stack and not stack[-1][1]:  # in an array: a run of small items at once
                    top = stack[-1]
                    try:
                        run = self.items(i, d)
                    except _Bad as e:
                        _reindex(e, top[2])
                        top[3] = ""
                        raise
                    if run is not None:
                        top[2] += len(run[0]) - 1
                        top[3] = f"[{top[2]}]"
                        i = run[1]
                if run is not None:
                    pass
                elif c in ("[", "{"):
                    end = self.small_end(i, d)
                    if end >= 0:
                        self.parse(i)
                        i = end
                    else:
                        if d > MAX_DEPTH:
                            self.too_deep([e[0] for e in stack] + [i])
                        obj = c == "{"
                        stack.append([i, obj, set(), ""])
                        j = self.ws(i + 1)
                        if not text.startswith("}" if obj else "]", j):
                            if obj:
                                k, i = self.key(j, stack[-1][2])
                                stack[-1][3] = _key(k)
                            else:
                                stack[-1][3], stack[-1][2] = "[0]", 0
                                i = j
                            continue
                        stack.pop()
                        i = j + 1
                else:
                    _, i = self.parse(i)
                while stack:
                    top = stack[-1]
                    more, i = self.after(i, "}" if top[1] else "]")
                    if more:
                        if top[1]:
                            k, i = self.key(i, top[2])
                            top[3] = _key(k)
                        else:
                            top[2] += 1
                            top[3] = f"[{top[2]}]"
                        break
                    stack.pop()
                else:
                    return i
        except _Bad as e:
            steps = [s[3] for s in stack]
            if e.problem.startswith("duplicate key") and steps and not e.where:
                steps.pop()  # a duplicate key is the object's, not its member's
            e.where.append("".join(steps))
            raise


def _reindex(e: _Bad, first: int) -> None:
    """A NaN or duplicate key in a run of items parsed at once (`_Text.items`) is at
    [its index in the run]: at [first + that index] in the array."""
    m = re.match(r"\[(\d+)\]", e.where[-1]) if e.where else None
    if m is not None:
        e.where[-1] = f"[{first + int(m.group(1))}]" + e.where[-1][m.end():]


# --- the schema, compiled ---------------------------------------------------------------------

_MISSING = object()
_SUPPORTED = {"type", "properties", "required", "additionalProperties", "propertyNames",
              "items", "minItems", "maxItems", "minimum", "maximum", "enum", "const",
              "pattern", "oneOf", "not", "$ref", "description", "title"}

Post = Callable[["_Ctx", Any], Any]
Counts = TypeVar("Counts", int, np.ndarray)
# the items of an array at a place of the text, from an index on: (what is kept of
# them, where the last ends), or ([], where to try again) where it does not take them
Lines = Callable[["_Text", int, int, "_Ctx"], tuple[list[Any], int]]


@dataclass(frozen=True)
class _Limit:
    """The most items (keys) a container may hold: the _Ctx bound `attr`, and why."""

    attr: str
    say: Callable[[_Ctx, int], str]

    def most(self, ctx: _Ctx) -> int:
        n: int = getattr(ctx, self.attr)
        return n

    def over(self, ctx: _Ctx) -> _Bad:
        return _Bad(self.say(ctx, self.most(ctx)))


@dataclass(frozen=True)
class _Hook:
    """What the reader adds at one place of the schema: `post` turns the checked value
    into what the summary keeps (and checks what depends on the config); `limit` is
    the most items an array (keys an object) may hold, with why, checked as they are
    read; `item` checks an array item with its index; `extra` is the schema of
    undeclared keys; `says` words what is wrong with a value (None: as the check
    words it); `lines` reads an array's items a run of lines at a time where the
    text is as kpool writes it (`_ubatch_lines`), before `item` and the items' checks
    are asked (`item` must take index 0 again: where the precise path meets a problem
    past lines taken, it reads the array again from its start, `_Array.read`)."""

    post: Post | None = None
    limit: _Limit | None = None
    item: Callable[[_Ctx, int, Any], None] | None = None
    extra: dict[str, Any] | None = None
    says: Callable[[Any], str | None] | None = None  # what a wrong value is, in words
    lines: Lines | None = None


class _Node:
    """A schema compiled: `check` a parsed value, or `read` one from a report's text;
    both return what the reader keeps of it."""

    post: Post | None = None
    json_types: frozenset[str] | None = None  # the JSON types it may hold (None: any)

    def check(self, v: Any, ctx: _Ctx) -> Any:
        raise NotImplementedError

    def plausible(self, v: Any) -> bool:
        """Whether `v` may be of this form (its type; an object's required and
        forbidden keys, the types of its fields): a cheap test, so that a `oneOf`
        checks only the forms a value may be of."""
        return self.json_types is None or _json_type(v) in self.json_types

    def read(self, doc: _Text, pos: int, depth: int, ctx: _Ctx) -> tuple[Any, int]:
        text = doc.text
        c = text[pos:pos + 1]
        if c in ("[", "{"):
            end = doc.small_end(pos, depth)
            if end < 0:  # not a small value, nor one this node reads part by part
                end = doc.skip(pos, depth)
                return self.check([] if c == "[" else {}, ctx), end
        v, end = doc.parse(pos)
        return self.check(v, ctx), end


class _Says(_Node):
    """`node`, with what is wrong with a value worded by `says` (given the value; a
    large array or object as an empty one), not by the schema; a field of it that is
    wrong is worded as that field's node words it."""

    def __init__(self, node: _Node, says: Callable[[Any], str | None]) -> None:
        self.node, self.says = node, says
        self.json_types = node.json_types

    def _said(self, e: _Bad, v: Any) -> _Bad:
        said = None if e.where else self.says(v)
        return e if said is None else _Bad(said)

    def check(self, v: Any, ctx: _Ctx) -> Any:
        try:
            return self.node.check(v, ctx)
        except _Bad as e:
            raise self._said(e, v) from None

    def read(self, doc: _Text, pos: int, depth: int, ctx: _Ctx) -> tuple[Any, int]:
        try:
            return self.node.read(doc, pos, depth, ctx)
        except _Bad as e:
            raise self._said(e, _RAW.read(doc, pos, depth, ctx)[0]) from None


class _Any(_Node):
    """A value of a field the format does not declare: any JSON, not kept."""

    def check(self, v: Any, ctx: _Ctx) -> None:
        return None

    def read(self, doc: _Text, pos: int, depth: int, ctx: _Ctx) -> tuple[None, int]:
        return None, doc.skip(pos, depth)


_ANY = _Any()


class _Leaf(_Node):
    """A scalar (or a const, an enum, a type list)."""

    def __init__(self, s: dict[str, Any], post: Post | None) -> None:
        types = s.get("type")
        self.types = (types,) if isinstance(types, str) else tuple(types or ())
        self.lo = s.get("minimum", INT_MIN)
        self.hi = s.get("maximum", INT_MAX)
        self.enum = tuple(s["enum"]) if "enum" in s else None
        self.const = s.get("const", _MISSING)
        pattern = s.get("pattern")
        self.pattern = re.compile(pattern[:-1] + r"\Z" if pattern.endswith("$") else pattern
                                  ) if pattern else None
        self.says = _PATTERN_SAYS.get(pattern or "", "does not match the pattern "
                                      + json.dumps(pattern) + ": {}")
        self.post = post
        kinds = set(self.types) or {_json_type(x) for x in (
            (self.const,) if self.const is not _MISSING else self.enum or ())}
        self.json_types = frozenset(kinds | ({"integer"} if "number" in kinds else set()))
        self.int_only = self.types == ("integer",) and self.enum is None
        self.str_only = self.types == ("string",) and self.enum is None

    def check(self, v: Any, ctx: _Ctx) -> Any:
        if self.int_only:
            if type(v) is not int or not self.lo <= v <= self.hi:
                self._bad_int(v)
        elif self.str_only and type(v) is str and self.pattern is None:
            if _SURROGATE.search(v):
                self._bad_str(v)
        else:
            self._check(v)
        return v if self.post is None else self.post(ctx, v)

    def _bad_int(self, v: Any) -> None:
        if type(v) is int:
            raise _out_of_range(v, self.lo, self.hi)
        if isinstance(v, _Number) and v.integral:
            raise _Bad(f"{_show(v)} is out of range (integers of at most 64 bits)")
        want = ("a non-negative integer" if self.lo == 0 else
                "a positive integer" if self.lo == 1 else "an integer")
        raise _Bad(f"expected {want}, got {_show(v)}")

    def _bad_str(self, v: str) -> None:
        m = _SURROGATE.search(v)
        assert m is not None
        raise _Bad(f"not Unicode text: a lone surrogate \\u{ord(m.group()):04x}")

    def _check(self, v: Any) -> None:
        if self.const is not _MISSING:
            if type(v) is not type(self.const) or v != self.const:
                raise _Bad(f"expected {json.dumps(self.const)}, got {_show(v)}")
            return
        t = _json_type(v)
        if self.types and t not in self.types and not (t == "integer" and "number" in
                                                         self.types):
            if self.types == ("integer",):
                self._bad_int(v)
            raise _Bad(f"expected {' or '.join(_TYPE_WORDS[x] for x in self.types)}, got "
                       f"{_show(v)}")
        if t == "integer" and not self.lo <= v <= self.hi:
            raise _out_of_range(v, self.lo, self.hi)
        if t == "string":
            if _SURROGATE.search(v):
                self._bad_str(v)
            if self.pattern is not None and not self.pattern.search(v):
                raise _Bad(self.says.format(_show(v)))
        if self.enum is not None and not any(type(v) is type(x) and v == x for x in self.enum):
            raise _Bad(f"expected one of {', '.join(map(str, self.enum))}, got {_show(v)}")


_TYPE_WORDS = {"integer": "an integer", "string": "a string", "boolean": "true or false",
               "null": "null", "number": "a number", "object": "an object", "array": "an array"}


def _json_type(v: Any) -> str:
    if v is None:
        return "null"
    if type(v) is bool:
        return "boolean"
    if type(v) is int:
        return "integer"
    if type(v) is float or (isinstance(v, _Number) and not v.bad):
        return "number"
    if type(v) is str:
        return "string"
    if isinstance(v, dict):
        return "object"
    if type(v) is list:
        return "array"
    return "?"


class _Array(_Node):
    json_types = frozenset({"array"})

    def __init__(self, s: dict[str, Any], items: _Node, hook: _Hook) -> None:
        self.items = items
        self.min = s.get("minItems", 0)
        self.max = s.get("maxItems")
        self.post, self.limit, self.item = hook.post, hook.limit, hook.item
        self.lines = hook.lines
        assert self.lines is None or (self.limit is None and self.post is None), \
            "lines of an array with a limit or a post: teach _Array.read"
        leaf = items if isinstance(items, _Leaf) else None
        # items all integers of a range, and kept as they are: checked at once
        self.ints = (leaf.lo, leaf.hi) if leaf is not None and leaf.int_only \
            and leaf.post is None else None

    def check(self, v: Any, ctx: _Ctx) -> Any:
        if type(v) is not list:
            raise _Bad(f"expected an array, got {_show(v)}")
        if self.limit is not None and len(v) > self.limit.most(ctx):
            raise self.limit.over(ctx)
        if self.ints is not None:
            lo, hi = self.ints
            if not v or (set(map(type, v)) == {int} and lo <= min(v) and max(v) <= hi):
                return self.finish(tuple(v), ctx)
        out: list[Any] = []
        append, check, item = out.append, self.items.check, self.item
        i = 0
        try:
            for x in v:
                y = check(x, ctx)
                if item is not None:
                    item(ctx, i, y)
                append(y)
                i += 1
        except _Bad as e:
            e.where.append(f"[{i}]")
            raise
        return self.finish(tuple(out), ctx)

    def one(self, x: Any, i: int, ctx: _Ctx) -> Any:
        try:
            y = self.items.check(x, ctx)
            if self.item is not None:
                self.item(ctx, i, y)
        except _Bad as e:
            e.where.append(f"[{i}]")
            raise
        return y

    def over(self, ctx: _Ctx) -> _Bad:
        assert self.limit is not None
        return self.limit.over(ctx)

    def finish(self, out: tuple, ctx: _Ctx) -> Any:
        if len(out) < self.min or (self.max is not None and len(out) > self.max):
            n = f"exactly {self.min}" if self.min == self.max else (
                f"at least {self.min}" if self.max is None else
                f"{self.min} to {self.max}")
            raise _Bad(f"expected an array of {n} items, got {len(out)}")
        return out if self.post is None else self.post(ctx, out)

    def read(self, doc: _Text, pos: int, depth: int, ctx: _Ctx) -> tuple[Any, int]:
        if not doc.text.startswith("[", pos):
            return super().read(doc, pos, depth, ctx)
        end = doc.small_end(pos, depth)
        if end >= 0:
            v, _ = doc.parse(pos)
            return self.check(v, ctx), end
        out: list[Any] = []
        doc.opens.append(pos)
        opens, left = len(doc.opens), 0 if ctx.budget is None else ctx.budget[0]
        taken = [0]  # the items `lines` took
        try:
            i = self._items(doc, pos, depth, ctx, out, self.lines, taken)
        except (_Bad, ReportError):
            if not taken[0]:
                raise
            # the precise path reads runs of small items at once (`_Text.items`), and of
            # two problems in a run words its parser's: the runs it read past the lines
            # taken did not all start where they do without them, so the array is read
            # again from its start, without them, for the problem met then
            del out[:], doc.opens[opens:]
            if ctx.budget is not None:
                ctx.budget[0] = left
            i = self._items(doc, pos, depth, ctx, out, None, taken)
        doc.opens.pop()
        return self.finish(tuple(out), ctx), i

    def _items(self, doc: _Text, pos: int, depth: int, ctx: _Ctx, out: list[Any],
               lines: Lines | None, taken: list[int]) -> int:
        """The items of the array at `pos`, read part by part into `out`, runs of lines
        at a time where `lines` takes them (`taken[0]`: how many it took): where the
        array ends."""
        most = self.limit.most(ctx) if self.limit is not None else INT_MAX
        i = doc.ws(pos + 1)
        more = not doc.text.startswith("]", i)
        if not more:
            i += 1
        tried = i  # the lines are tried again from here on (each byte once, at most)
        while more:
            if lines is not None and i >= tried:
                got, tried = lines(doc, i, len(out), ctx)
                if got:
                    out.extend(got)
                    taken[0] += len(got)
                    more, i = doc.after(tried, "]")
                    continue
            try:
                run = doc.items(i, depth + 1)
            except _Bad as e:
                _reindex(e, len(out))
                raise
            if run is not None:
                items, i = run
                if len(out) + len(items) > most:
                    raise self.over(ctx)
                for x in items:
                    out.append(self.one(x, len(out), ctx))
            else:
                if len(out) >= most:
                    raise self.over(ctx)
                try:
                    y, i = self.items.read(doc, i, depth + 1, ctx)
                    if self.item is not None:
                        self.item(ctx, len(out), y)
                except _Bad as e:
                    e.where.append(f"[{len(out)}]")
                    raise
                out.append(y)
            more, i = doc.after(i, "]")
        return i


class _Object(_Node):
    json_types = frozenset({"object"})

    def __init__(self, s: dict[str, Any], props: list[tuple[str, _Node, bool]],
                 extra: _Node | None, hook: _Hook) -> None:
        self.props = props
        self.by_name = {name: node for name, node, _ in props}
        self.index = {name: n for n, (name, _, _) in enumerate(props)}
        self.required = frozenset(name for name, _, required in props if required)
        # the fields whose type tells this form from another (set by a `oneOf`)
        self.typed = tuple((name, node.json_types) for name, node, _ in props
                           if node.json_types is not None)
        # the fields checked here when they hold what they should (else by their node,
        # which says what is wrong): integers of a range, arrays of them, strings, true
        # or false, kept as they are
        self.fast = tuple((name, node, required, *_fast(node)) for name, node, required in props)
        self.extra = extra  # the schema of undeclared keys (None: any value, not kept)
        names = s.get("propertyNames", {}).get("pattern")
        self.names = _Leaf({"type": "string", "pattern": names}, None) if names else None
        # `not: {required: [...]}`: a form that must not hold all of these
        assert set(s.get("not", {})) <= {"required"}, "not: teach _compile"
        self.forbid = tuple(s["not"]["required"]) if "not" in s else ()
        self.post, self.limit = hook.post, hook.limit

        self.check = _object_check(self)  # type: ignore[assignment]

    def field(self, n: int, x: Any, ctx: _Ctx) -> Any:
        """Field n of the record, `x`, checked by its node (which says what is wrong)."""
        name, node = self.props[n][:2]
        try:
            return node.check(x, ctx)
        except _Bad as e:
            e.where.append(_key(name))
            e.progress = n
            raise

    def too_many(self, v: dict[str, Any], ctx: _Ctx) -> None:
        assert self.limit is not None
        if len(v) > self.limit.most(ctx):
            raise self.limit.over(ctx)

    def missing(self, n: int) -> NoReturn:
        raise self.missing_field(n)

    def missing_field(self, n: int) -> _Bad:
        """The error of required field n missing (its progress: the fields before it)."""
        e = _Bad("missing field", _key(self.props[n][0]))
        e.progress = n
        return e

    def rest(self, v: dict[str, Any], out: dict[str, Any], ctx: _Ctx) -> Any:
        """After the declared fields: the undeclared keys, the form's rules, `post`."""
        if self.extra is not None or self.names is not None:
            for k, x in v.items():
                if k not in self.by_name:
                    self.undeclared(k, x, out, ctx)
        return self.finish(out, v, ctx)

    def first_missing(self, keys: Any) -> _Bad | None:
        """The error `check` gives for the first required field missing from `keys`."""
        for n, (name, _, required) in enumerate(self.props):
            if required and name not in keys:
                return self.missing_field(n)
        return None

    def plausible(self, v: Any) -> bool:
        if not isinstance(v, dict) or not self.required <= v.keys():
            return False
        if self.forbid and all(k in v for k in self.forbid):
            return False
        for name, types in self.typed:
            x = v.get(name, _MISSING)
            if x is not _MISSING and _json_type(x) not in types:
                return False
        return True

    def undeclared(self, k: str, x: Any, out: dict[str, Any], ctx: _Ctx) -> None:
        try:
            if self.names is not None:
                self.names.check(k, ctx)
            if self.extra is not None:
                out[k] = self.extra.check(x, ctx)
        except _Bad as e:
            e.where.append(_key(k))
            e.progress = len(self.props)
            raise

    def finish(self, out: dict[str, Any], keys: Any, ctx: _Ctx) -> Any:
        if self.forbid and all(k in keys for k in self.forbid):
            raise _Bad(f"holds {', '.join(self.forbid)}, which this form does not",
                       _key(self.forbid[0]))
        return out if self.post is None else self.post(ctx, out)

    def read(self, doc: _Text, pos: int, depth: int, ctx: _Ctx) -> tuple[Any, int]:
        if not doc.text.startswith("{", pos):
            return super().read(doc, pos, depth, ctx)
        end = doc.small_end(pos, depth)
        if end >= 0:
            v, _ = doc.parse(pos)
            return self.check(v, ctx), end
        out: dict[str, Any] = {}
        keys: set[str] = set()
        doc.opens.append(pos)
        i = doc.ws(pos + 1)
        more = not doc.text.startswith("}", i)
        if not more:
            i += 1
        most = self.limit.most(ctx) if self.limit is not None else INT_MAX
        while more:
            k, i = doc.key(i, keys)
            if len(keys) > most:
                assert self.limit is not None
                raise self.limit.over(ctx)
            node = self.by_name.get(k)
            try:
                if node is None:
                    if self.names is not None:
                        self.names.check(k, ctx)
                    node = self.extra or _ANY
                y, i = node.read(doc, i, depth + 1, ctx)
            except _Bad as e:
                e.where.append(_key(k))
                e.progress = self.index.get(k, len(self.props))  # as `check` counts
                raise
            if node is not _ANY:
                out[k] = y
            more, i = doc.after(i, "}")
        doc.opens.pop()
        missing = self.first_missing(keys)
        if missing is not None:
            raise missing
        return self.finish(out, keys, ctx), i


_GENERIC, _INT, _INTS, _TEXT, _TRUTH = range(5)
_ONLY_INT = {int}
# how a field of each kind is checked inline, when it holds what it should
_INLINE = {
    _INT: "type(x) is int and {lo} <= x <= {hi}",
    _INTS: "type(x) is list and (not x or (set(map(type, x)) == ONLY_INT and {lo} <= min(x)"
           " and max(x) <= {hi})) and {mn} <= len(x) <= {mx}",
    _TEXT: "type(x) is str and (x.isascii() or not SURROGATE.search(x))",
    _TRUTH: "type(x) is bool",
}


def _object_check(node: _Object) -> Callable[[Any, _Ctx], Any]:
    """`node.check`, written out for its fields (a report has millions of records: a
    loop over the fields would take half the time of reading it). Each field is
    checked inline when it is of a simple kind and holds what it should, else by its
    node; missing, a required one is an error."""
    lines = ["def check(v, ctx):",
             "    if not isinstance(v, dict):",
             "        not_object(v)",
             *(["    too_many(v, ctx)"] if node.limit is not None else []),
             "    out = {}",
             "    get = v.get"]
    for n, (name, _node, required, kind, lo, hi, mn, mx) in enumerate(node.fast):
        lines += [f"    x = get({name!r}, MISSING)",
                  "    if x is MISSING:",
                  f"        {f'missing({n})' if required else 'pass'}"]
        if kind != _GENERIC:
            lines += [f"    elif {_INLINE[kind].format(lo=lo, hi=hi, mn=mn, mx=mx)}:",
                      f"        out[{name!r}] = {'tuple(x)' if kind == _INTS else 'x'}"]
        lines += ["    else:", f"        out[{name!r}] = field({n}, x, ctx)"]
    if node.extra is not None or node.names is not None or node.forbid:
        lines.append("    return rest(v, out, ctx)")
    else:
        lines.append("    return out" if node.post is None else "    return post(ctx, out)")
    scope: dict[str, Any] = {"MISSING": _MISSING, "ONLY_INT": _ONLY_INT,
                             "SURROGATE": _SURROGATE, "not_object": _not_object,
                             "missing": node.missing, "field": node.field, "rest": node.rest,
                             "too_many": node.too_many, "post": node.post}
    exec("\n".join(lines), scope)  # the source: names and bounds of report.format
    check: Callable[[Any, _Ctx], Any] = scope["check"]
    return check


def _not_a_report(v: Any) -> _Bad:
    return _Bad(f"not a kpool report (expected an object, got {_show(v)})")


def _not_object(v: Any) -> NoReturn:
    raise _Bad(f"expected an object, got {_show(v)}")


def _fast(node: _Node) -> tuple[int, int, int, int, int | str]:
    """How `_Object.check` checks a field of this node itself: (kind, lo, hi, fewest
    items, most items: a number, or the _Ctx bound that is)."""
    none = (_GENERIC, 0, 0, 0, 0)
    if isinstance(node, _Array) and node.ints is not None and node.post is None \
            and node.item is None:
        most: int | str = INT_MAX if node.max is None else node.max
        if node.limit is not None:
            assert node.max is None
            most = f"ctx.{node.limit.attr}"
        return (_INTS, *node.ints, node.min, most)
    if not isinstance(node, _Leaf) or node.post is not None:
        return none
    if node.int_only:
        return _INT, node.lo, node.hi, 0, 0
    if node.str_only and node.pattern is None:
        return _TEXT, 0, 0, 0, 0
    if node.types == ("boolean",) and node.const is _MISSING and node.enum is None:
        return _TRUTH, 0, 0, 0, 0
    return none


class _OneOf(_Node):
    """Exactly one of the forms; when none holds, the error of the form that got the
    furthest (a pool run with a bad `new` is a run, not a pool with a bad `k`)."""

    def __init__(self, forms: list[_Node], post: Post | None) -> None:
        self.forms = forms
        self.post = post
        types = [f.json_types for f in forms]
        self.json_types = None if None in types else frozenset().union(
            *(t for t in types if t is not None))
        for f in forms:  # an object form is told by the fields typed otherwise elsewhere
            if isinstance(f, _Object):
                others = [o for o in forms if o is not f]
                f.typed = tuple((name, t) for name, t in f.typed if any(
                    not isinstance(o, _Object) or name not in o.by_name
                    or o.by_name[name].json_types != t for o in others))

    def _one(self, attempt: Callable[[_Node], Any], forms: list[_Node]) -> Any:
        got: Any = _MISSING
        errors: list[_Bad] = []
        for form in forms:
            try:
                r = attempt(form)
            except _Bad as e:
                errors.append(e)
                continue
            if got is not _MISSING:
                raise _Bad("holds the fields of more than one form")
            got = r
        if got is _MISSING:
            raise max(errors, key=lambda e: e.progress)
        return got

    def check(self, v: Any, ctx: _Ctx) -> Any:
        # only the forms `v` may be of are checked (one, as a rule: its errors are the
        # value's); none may be: every form, for the error of the one that got furthest
        forms = [f for f in self.forms if f.plausible(v)]
        if len(forms) == 1:
            r = forms[0].check(v, ctx)
        else:
            r = self._one(lambda form: form.check(v, ctx), forms or self.forms)
        return r if self.post is None else self.post(ctx, r)

    def read(self, doc: _Text, pos: int, depth: int, ctx: _Ctx) -> tuple[Any, int]:
        if doc.text[pos:pos + 1] not in ("[", "{") or doc.small_end(pos, depth) >= 0:
            v, end = doc.parse(pos)
            return self.check(v, ctx), end
        opens = len(doc.opens)

        def attempt(form: _Node) -> tuple[Any, int]:
            del doc.opens[opens:]  # a form that failed left its containers open
            try:
                return form.read(doc, pos, depth, ctx)
            except _Bad as e:
                # read in the text's order, it failed where it did; `check` would have
                # failed first at a field missing before that one
                gone = form.first_missing(shape) if isinstance(form, _Object) else None
                if gone is not None and gone.progress < e.progress:
                    raise gone from None
                raise

        # the forms it may be of, told as `check` tells them, from its keys and their
        # values' kinds (a pass over it that keeps nothing)
        shape: Any = doc.shape(pos, depth) if doc.text.startswith("{", pos) else []
        forms = [f for f in self.forms if f.plausible(shape)]
        if len(forms) == 1:
            r, end = forms[0].read(doc, pos, depth, ctx)
        else:
            r, end = self._one(attempt, forms or self.forms)
        return (r if self.post is None else self.post(ctx, r)), end


def _compile(s: dict[str, Any], defs: dict[str, Any], path: tuple[str, ...],
             hooks: dict[tuple[str, ...], _Hook]) -> _Node:
    """The check of schema `s` at `path` (keys; "*" an item or an undeclared key)."""
    node = _compiled(s, defs, path, hooks)
    says = hooks.get(path, _Hook()).says
    return node if says is None else _Says(node, says)


def _compiled(s: dict[str, Any], defs: dict[str, Any], path: tuple[str, ...],
              hooks: dict[tuple[str, ...], _Hook]) -> _Node:
    if "$ref" in s:
        s = defs[s["$ref"].rsplit("/", 1)[1]]
    unknown = set(s) - _SUPPORTED
    assert not unknown, f"the report schema uses {sorted(unknown)} at {path}: teach _compile"
    hook = hooks.get(path, _Hook())
    _used.add(path)
    if "oneOf" in s:
        return _OneOf([_compile(f, defs, (*path, f"|{i}"), hooks)
                       for i, f in enumerate(s["oneOf"])], hook.post)
    if s.get("type") == "object":
        required = set(s.get("required", ()))
        props = [(name, _compile(p, defs, (*path, name), hooks), name in required)
                 for name, p in s.get("properties", {}).items()]
        extra_s = hook.extra if hook.extra is not None else s.get("additionalProperties", True)
        extra = _compile(extra_s, defs, (*path, "*"), hooks) if isinstance(extra_s, dict) \
            else None
        assert extra_s is not False, "closed objects: teach _compile"
        return _Object(s, props, extra, hook)
    if s.get("type") == "array":
        return _Array(s, _compile(s["items"], defs, (*path, "*"), hooks), hook)
    if set(s) <= {"description", "title"}:
        return _ANY
    return _Leaf(s, hook.post)


# --- what the reader keeps, and the bounds the config sets ----------------------------------


class _Ctx:
    """One report's reading: the kpool version that wrote it (for messages), the
    bounds its config sets, and the memory budget of the file it is in."""

    def __init__(self, budget: list[int] | None) -> None:
        self.writer = "?"
        self.budget = budget  # [bytes left] of the file, shared by its reports; None: none
        self.seqs: dict[tuple[int, ...], tuple[int, ...]] = {}  # token seq tuples, shared
        self.costs: dict[tuple[int, ...], tuple[tuple[str, int], ...]] = {}  # equal, shared
        self.last: UbatchSummary | None = None  # the ubatch read last
        self.op_tokens = 0  # the tokens of its op's ubatches so far
        # the bounds of the smallest cache until `config` is read (`_Report` reads
        # nothing the config bounds before it)
        self.configure({"kv_size": 1, "kpool": 1, "n_seq_max": 1, "unified": True,
                        "by_order": False, "n_ubatch": 1})

    def configure(self, cfg: dict[str, Any]) -> None:
        self.kv_size, self.kpool, self.n_seq_max = cfg["kv_size"], cfg["kpool"], cfg["n_seq_max"]
        self.unified, self.by_order = cfg["unified"], cfg["by_order"]
        self.n_stream = 1 if self.unified else self.n_seq_max
        self.n_rows = context_cells(self.kv_size, self.unified, self.n_seq_max)
        # the context's n_batch and n_ubatch, as the replay splits by them: a recorded
        # n_batch caps both (an op past it aborted, and left no ubatch)
        self.given_n_batch: int | None = cfg.get("n_batch")
        self.n_batch, self.n_ubatch = context_batch(self.given_n_batch, cfg["n_ubatch"],
                                                    self.n_rows)
        self.given_n_ubatch: int = cfg["n_ubatch"]
        self.pools_per_seq = self.kv_size // self.kpool
        self.n_pool_max = self.pools_per_seq * self.n_seq_max
        # split_equal's first round takes one token of each of up to n_ubatch + 1
        # disjoint sequence sets (at most n_seq_max of them); later rounds and the
        # n_rs_seq tail stay within n_ubatch (module doc); never more than a recorded
        # n_batch, the most an op holds
        self.max_tokens = self.n_ubatch + (1 if self.n_seq_max > self.n_ubatch else 0)
        if self.given_n_batch is not None:
            self.max_tokens = min(self.max_tokens, self.n_batch)
        self.n_counters = len(COST_KEYS) + _COUNTERS

    def charge(self, n: int) -> None:
        """Count `n` bytes of what the summary will hold; _Bad past the budget."""
        if self.budget is None:
            return
        self.budget[0] -= n
        if self.budget[0] < 0:
            raise _Bad(f"the report would take more memory than kpool diff gives it "
                       f"({MEMORY_PER_BYTE} times its size + {MEMORY_FLOOR >> 20} MiB): its "
                       "runs (pools, scatter entries, finding rows) stand for more than its "
                       "text holds, as a long cache-safe replay's do; diff shorter traces")

    def from_another_version(self) -> str:
        if self.writer == __version__:
            return (f"the report claims to be from kpool {__version__} (this version), which "
                    "never writes that: it was edited, or made by another tool")
        return (f"the report was written by kpool {_clip(self.writer)}, this is kpool "
                f"{__version__}: diff it with that version, or replay the trace with this one")

    # -- checks --------------------------------------------------------------------------

    def seq(self, s: int, step: str = "") -> None:
        if not 0 <= s < self.n_seq_max:
            raise _Bad(f"seq {s} is out of range (config.n_seq_max is {self.n_seq_max})",
                       *((step,) if step else ()))

    def row(self, r: int, step: str = "", of: str = "") -> None:
        if not 0 <= r < self.n_rows:
            raise _Bad(f"row {r}{of} is out of range (the cache has {self.n_rows} rows: "
                       f"config.kv_size {self.kv_size} x {self.n_stream} stream(s))",
                       *((step,) if step else ()))

    def rows(self, rows: tuple[int, ...], step: str) -> None:
        n = self.n_rows
        if rows and (min(rows) < 0 or max(rows) >= n):
            i = next(i for i, r in enumerate(rows) if not 0 <= r < n)
            self.row(rows[i], f"{step}[{i}]")

    def pool_k(self, k: int, step: str, end: bool = False) -> None:
        if not 0 <= k < self.pools_per_seq + end:
            raise _Bad(f"pool {k} is out of range (a sequence holds at most "
                       f"{self.pools_per_seq} pools: config.kv_size // kpool)", step)

    def run_rows(self, c0: int, d: int, e: int, n: int, step: str) -> None:
        """Every row c0 + i e + j d (i < n, j < kpool) of a run is a row of the cache."""
        if c0 < 0:
            raise _Bad(f"expected [first row, member step, entry step], got {[c0, d, e]}: "
                       "a first row is not negative", step)
        ends = [c0 + i * e + j * d for i in (0, n - 1) for j in (0, self.kpool - 1)]
        bad = [r for r in ends if not 0 <= r < self.n_rows]
        if bad:
            self.row(bad[0], step, " of the run")


def _cfg_post(ctx: _Ctx, out: dict[str, Any]) -> tuple[tuple[str, object], ...]:
    """The v1 cache config in CONFIG's order, with the trace's bounds (CACHE); a field
    added after v1's first release may be absent (the trace's default then; left out
    when that is unset, None, as `CacheConfig.as_dict` leaves it out)."""
    cfg: dict[str, Any] = {}
    for f in CONFIG.fields:
        v = out.get(f.name, CACHE[f.name].default)
        if v is None:
            continue
        hi = CACHE[f.name].hi
        if hi is not None and type(v) is int and v > hi:
            raise _Bad(f"{v} is out of range (at most {hi}, the trace's bound)", _key(f.name))
        cfg[f.name] = v
    if cfg["kpool"] > cfg["kv_size"]:
        raise _Bad(f"{cfg['kpool']} is more than kv_size {cfg['kv_size']} (a pool is at most "
                   "a stream's cells)", ".kpool")
    ctx.configure(cfg)
    return tuple(cfg.items())


def _tool_post(ctx: _Ctx, out: dict[str, Any]) -> dict[str, Any]:
    ctx.writer = out["version"]
    return out


def _token_post(ctx: _Ctx, t: dict[str, Any]) -> tuple[int, tuple[int, ...]]:
    pos, seq, row = t["pos"], t["seq"], t["cell"]
    if (0 <= pos < POS_LIMIT and seq and min(seq) >= 0 and max(seq) < ctx.n_seq_max
            and (len(seq) == 1 or len(set(seq)) == len(seq)) and 0 <= row < ctx.n_rows
            and (ctx.unified or row // ctx.kv_size == seq[0]) and "ext" not in t):
        return pos, ctx.seqs.setdefault(seq, seq)  # (what follows says what is wrong)
    if not 0 <= pos < POS_LIMIT:
        raise _Bad(f"{pos} is out of range (positions are 0 to 2**31 - 2**20 - 1)", ".pos")
    if not seq:
        raise _Bad("a token has at least one sequence", ".seq")
    for i, s in enumerate(seq):
        ctx.seq(s, f".seq[{i}]")
    if len(set(seq)) != len(seq):
        raise _Bad("a sequence listed twice", ".seq")
    ctx.row(row, ".cell")
    if not ctx.unified and row // ctx.kv_size != seq[0]:
        raise _Bad(f"row {row} is not in stream {seq[0]}, its sequence's (rows "
                   f"{seq[0] * ctx.kv_size}..{(seq[0] + 1) * ctx.kv_size})", ".cell")
    ext = t.get("ext")
    if ext is not None:
        if not ctx.by_order:
            raise _Bad("M-RoPE only: config.by_order is false", ".ext")
        for i, x in enumerate(ext):
            if not 0 <= x < POS_LIMIT:
                raise _Bad(f"{x} is out of range (positions are 0 to 2**31 - 2**20 - 1)",
                           f".ext[{i}]")
    return pos, ctx.seqs.setdefault(seq, seq)


def _tokens_say(ctx: _Ctx, n: int) -> str:
    if ctx.given_n_batch is not None and n == ctx.n_batch < ctx.n_ubatch + (
            ctx.n_seq_max > ctx.n_ubatch):
        return (f"more than the {n} tokens an op holds (config.n_batch {ctx.given_n_batch}"
                + (f", capped at the cache's {ctx.n_rows} rows"
                   if ctx.given_n_batch > ctx.n_rows else "") + ")")
    # the cap is the context's n_batch: the recorded one, or the cache's rows below it
    capped = ("" if ctx.n_ubatch == ctx.given_n_ubatch else
              f", capped at config.n_batch {ctx.given_n_batch}"
              if ctx.n_batch == ctx.given_n_batch else
              f", capped at the cache's {ctx.n_rows} rows, as config.n_batch "
              f"{ctx.given_n_batch} is")
    return (f"more than the {n} tokens a ubatch holds (config.n_ubatch {ctx.given_n_ubatch}"
            + capped + (", + 1: split_equal's first round" if n > ctx.n_ubatch else "") + ")")


def _seq_map_post(ctx: _Ctx, out: dict[str, int]) -> tuple[tuple[int, int], ...]:
    """{"seq id": position} as sorted (seq, position) pairs."""
    pairs = []
    for k, p in out.items():
        if len(k) > 3 or int(k) >= ctx.n_seq_max:
            raise _Bad(f"seq {_clip(k)} is out of range (config.n_seq_max is "
                       f"{ctx.n_seq_max})", _key(k))
        pairs.append((int(k), p))
    return tuple(sorted(pairs))


def _pool_post(ctx: _Ctx, p: dict[str, Any]) -> tuple[int, int, int, bool]:
    """A `pools` item, a pool or a run of pools k0..k1-1: (seq, k0, k1, new)."""
    ctx.seq(p["seq"], ".seq")
    k = p["k"]
    if type(k) is int:
        ctx.pool_k(k, ".k")
        if len(p["cells"]) != ctx.kpool:
            raise _Bad(f"{len(p['cells'])} member rows: a pool has config.kpool "
                       f"({ctx.kpool})", ".cells")
        ctx.rows(p["cells"], ".cells")
        ctx.row(p["rep"], ".rep")
        return p["seq"], k, k + 1, p["new"]
    k0, k1 = k
    if not k0 < k1:
        raise _Bad(f"expected a range [k0, k1) with k0 < k1, got {list(k)}", ".k")
    ctx.pool_k(k1, ".k[1]", end=True)
    c0, d, e = p["cells"]
    ctx.run_rows(c0, d, e, k1 - k0, ".cells")
    return p["seq"], k0, k1, p["new"]


def _scatter_post(ctx: _Ctx, e: dict[str, Any]) -> tuple[Any, ...]:
    """A `scatter` item: ("entry", rep, rows, pad) or ("run", n, c0, d, e)."""
    if "rep" in e:
        ctx.row(e["rep"], ".rep")
        if len(e["cells"]) != ctx.kpool:
            raise _Bad(f"{len(e['cells'])} rows: an entry pools config.kpool ({ctx.kpool})",
                       ".cells")
        ctx.rows(e["cells"], ".cells")
        return "entry", e["rep"], e["cells"], e["pad"]
    n = e["n"]
    if n > ctx.n_pool_max:
        raise _Bad(f"a run of {n} entries in a ubatch of at most {ctx.n_pool_max} (n_new_g: "
                   "at most the pools the cache holds)", ".n")
    c0, d, step = e["cells"]
    ctx.run_rows(c0, d, step, n, ".cells")
    return "run", n, c0, d, step


def _row_run(ctx: _Ctx, r: tuple[int, ...]) -> range:
    """A finding's row run [first, end, step]: rows first, first + step, ... < end."""
    if r[2] == 0:
        raise _Bad(f"expected [first row, end, step] with a step, got {list(r)}")
    rows = range(*r)
    if rows:
        ctx.row(min(rows[0], rows[-1]))
        ctx.row(max(rows[0], rows[-1]))
    return rows


def _code_post(ctx: _Ctx, code: str) -> str:
    """A finding code this kpool knows (checked before the finding's other fields: a
    code of a later version may come with other fields)."""
    if code not in CODES:
        raise _Bad(f"unknown finding code {json.dumps(code)} (this kpool knows "
                   f"{', '.join(CODES)}): {ctx.from_another_version()}")
    return code


def _finding_post(ctx: _Ctx, f: dict[str, Any]) -> FindingKey:
    code = f["code"]
    rows = f["rows"]
    ctx.rows(rows, ".rows")
    runs = []
    for i, r in enumerate(f.get("row_runs", ())):
        try:
            runs.append(_row_run(ctx, r))
        except _Bad as e:
            e.where.append(f".row_runs[{i}]")
            raise
    n = len(rows) + sum(len(r) for r in runs)
    if n > ctx.n_rows:
        raise _Bad(f"names {n} rows, more than the cache's {ctx.n_rows}", ".row_runs")
    for i, s in enumerate(f["seqs"]):
        ctx.seq(s, f".seqs[{i}]")
    for i, p in enumerate(f.get("pools", ())):
        ctx.seq(p[0], f".pools[{i}][0]")
        for j, k in enumerate(p[1:], 1):
            ctx.pool_k(k, f".pools[{i}][{j}]", end=j == 2)
    for i, t in enumerate(f.get("tokens", ())):
        for j, s in enumerate(t["seq"] if isinstance(t["seq"], tuple) else (t["seq"],)):
            ctx.seq(s, f".tokens[{i}].seq" + (f"[{j}]" if isinstance(t["seq"], tuple) else ""))
    ctx.charge(_FINDING_BYTES + _ROW_BYTES * n)
    if runs:
        return code, tuple(sorted([*rows, *(x for r in runs for x in r)]))
    return code, tuple(sorted(rows))


def _cost_post(ctx: _Ctx, c: dict[str, int]) -> tuple[tuple[str, int], ...]:
    return tuple(sorted((sys.intern(k), v) for k, v in c.items()))


def _ubatch_bytes(ctx: _Ctx, tokens: Counts, marked: Counts, entries: Counts, stale: Counts
                  ) -> Counts:
    """What a ubatch's summary takes (its findings apart), for the budget (of each ubatch
    of columns of counts)."""
    return (_UBATCH_BYTES + _TOKEN_BYTES * tokens + _POOL_BYTES * marked
            + (_ENTRY_BYTES + _ROW_BYTES * ctx.kpool) * entries + _ROW_BYTES * stale)


def _run_entries(n: int, c0: int, d: int, step: int, kpool: int) -> list[ScatterEntry]:
    """The entries of a scatter run: entry i pools rows c0 + i step + j d (j < kpool)
    into the last of them."""
    plan = []
    for i in range(n):
        first = c0 + i * step
        members = tuple(range(first, first + kpool * d, d)) if d else (first,) * kpool
        plan.append((members[-1], members, False))
    return plan


def _ubatch_post(ctx: _Ctx, u: dict[str, Any]) -> UbatchSummary:
    """The ubatch's counts against what they count, then its summary, its runs
    expanded once the budget allows them."""
    tokens = u["tokens"]
    if not tokens:
        raise _Bad("a ubatch holds at least one token", ".tokens")
    n_pool_real, n_new, n_new_g = u["n_pool_real"], u["n_new"], u["n_new_g"]
    if n_pool_real > ctx.n_pool_max:
        raise _Bad(f"{n_pool_real} pools: more than the {ctx.n_pool_max} the cache holds "
                   "(config.n_seq_max x kv_size // kpool)", ".n_pool_real")
    if n_new > n_pool_real:
        raise _Bad(f"{n_new} pools marked new, of n_pool_real {n_pool_real}", ".n_new")
    pools = u["pools"]
    listed = sum(k1 - k0 for _, k0, k1, _ in pools)
    if listed > n_pool_real:
        raise _Bad(f"lists {listed} pools, more than n_pool_real {n_pool_real}", ".pools")
    marked = sum(k1 - k0 for _, k0, k1, new in pools if new)
    if marked != n_new:
        raise _Bad(f"lists {marked} pools marked new, but n_new is {n_new}", ".pools")
    n_seqs = len({s for _, ss in tokens for s in ss})
    most = n_new_graph(n_new, len(tokens), n_seqs, n_pool_real, ctx.kv_size, ctx.kpool,
                       ctx.n_seq_max, repool_all=False)
    if n_new_g > most:
        raise _Bad(f"{n_new_g} scatter entries: more than the {most} of this ubatch's "
                   "graph (n_new, tokens, sequences and pools: ENGINE.md §6)", ".n_new_g")
    scatter = u["scatter"]
    entries = sum(1 if e[0] == "entry" else e[1] for e in scatter)
    aborted = any(code == ENGINE_ABORT for code, _ in u["findings"])
    if entries != n_new_g and not (entries == 0 and aborted):
        raise _Bad(f"holds {entries} entries, but n_new_g is {n_new_g}", ".scatter")
    stale = u["stale_batch"]
    ctx.charge(_ubatch_bytes(ctx, len(tokens), marked, entries, len(stale)))
    kpool = ctx.kpool
    plan: list[ScatterEntry] = []
    for e in scatter:
        if e[0] == "entry":
            plan.append((e[1], e[2], e[3]))
        else:
            _, n, c0, d, step = e
            plan += _run_entries(n, c0, d, step, kpool)
    return UbatchSummary(
        index=u["index"], op=u["op"], batch_ubatch=u["batch_ubatch"], tokens=tokens,
        stale_batch=stale, n_pool_real=n_pool_real, n_new=n_new, n_new_g=n_new_g,
        marked=tuple((s, k) for s, k0, k1, new in pools if new for k in range(k0, k1)),
        scatter=tuple(plan), findings=u["findings"], cost=u["cost"])


def _ubatch_order(ctx: _Ctx, i: int, u: UbatchSummary) -> None:
    """Ubatches as a replay writes them: index 0, 1, ...; an op's ubatches 0, 1, ...;
    ops in order."""
    if u.index != i:
        raise _Bad(f"ubatch {i} of the report has index {u.index}", ".index")
    last = ctx.last if i else None
    if last is not None and u.op < last.op:
        raise _Bad(f"op {u.op} comes after op {last.op}: ubatches are in op order", ".op")
    same = last is not None and u.op == last.op
    want = last.batch_ubatch + 1 if last is not None and same else 0
    if u.batch_ubatch != want:
        raise _Bad(f"expected {want} (the op's ubatches count 0, 1, ...), got "
                   f"{u.batch_ubatch}", ".batch_ubatch")
    # every token of a decode that ran takes a cell of its stream (the decode is placed
    # whole before its first ubatch runs): an op's ubatches hold at most the cache's rows,
    # and at most a recorded n_batch (a larger decode aborts on llama_decode's assert)
    ctx.op_tokens = (ctx.op_tokens if same else 0) + len(u.tokens)
    if ctx.op_tokens > ctx.n_batch:
        bound = (f"the cache's {ctx.n_rows} rows" if ctx.n_batch == ctx.n_rows else
                 f"config.n_batch {ctx.n_batch} (a larger decode aborts)")
        raise _Bad(f"the ubatches of op {u.op} hold {ctx.op_tokens} tokens, more than "
                   f"{bound}", ".tokens")
    ctx.last = u


def _op_post(ctx: _Ctx, op: int) -> int:
    if op >= MAX_OPS:
        raise _Bad(f"{op} is out of range (a trace has at most {MAX_OPS} ops)")
    return op


def _event_post(ctx: _Ctx, e: dict[str, Any]) -> EventSummary:
    kind, message = e["kind"], e.get("message", "")
    ctx.charge(_EVENT_BYTES + len(kind) + len(message) + _ROW_BYTES * len(e["stale"]))
    return EventSummary(e["op"], kind, e["status"], e["stale"], e.get("findings", ()),
                        message)


def _backend_post(ctx: _Ctx, v: str | None) -> str | None:
    if v is None or v == "none":
        return None
    if v in VALUE_BACKENDS:
        return v
    raise _Bad(f"unknown value backend {json.dumps(_clip(v))} (this kpool knows "
               f"{', '.join(VALUE_BACKENDS)}, or null): {ctx.from_another_version()}")


def _trace_post(ctx: _Ctx, t: dict[str, Any]) -> tuple[str, str, str]:
    ctx.charge(len(t["path"]) + len(t["name"]) + 200)
    return t["path"], t["name"], t["sha256"]


def _engine_post(ctx: _Ctx, v: str) -> str:
    ctx.charge(len(v) + 64)
    return v


def _steps_say(v: Any) -> str:
    return f"expected [first row, member step, entry step], got {_show(v)}"


def _dropped(ctx: _Ctx, v: Any) -> None:
    return None


def _problem_post(ctx: _Ctx, p: dict[str, Any]) -> dict[str, Any]:
    return {"message": p["message"]}  # what the refusal of a stopped replay says


# --- ubatches as kpool writes them, a run of lines at a time ---------------------------------


class _NotFast(Exception):
    """Lines `_ubatch_lines` does not take (not kpool's text, or a check fails there):
    the precise path reads them, and says what is wrong, if anything is."""


def _ubatch_lines(doc: _Text, pos: int, n: int, ctx: _Ctx) -> tuple[list[UbatchSummary], int]:
    """Ubatches n, n + 1, ... from `pos`, a run of lines at a time, where the text is
    what kpool writes: one ubatch a line, as orjson writes it, each line indented as
    the first (`report.json_report.write_report`). Whole lines, at most LINES_BYTES of
    them, are parsed at once by orjson, and taken only when orjson writes what it
    parsed back to the very same text (so no key twice, no number or string written
    another way: what the precise path's parser reads there is the same) and every
    check of the precise path holds for them (`_ubatch_columns`): (their summaries,
    where the last ends). Else nothing is taken: ([], where lines are tried again),
    and the precise path reads up to there."""
    text = doc.text
    line = text.rfind("\n", max(0, pos - _INDENT_MOST), pos)  # (not the whole text back)
    indent = text[line + 1:pos] if line >= 0 else ""
    if len(indent) < 2 or indent.strip(" "):
        return [], len(text)  # not a ubatch a line: the precise path reads the array
    sep = ",\n" + indent
    stop = min(len(text), pos + LINES_BYTES)
    end = text.find("\n" + indent[:-2] + "]", pos, stop)  # the array's last line
    if end < 0:
        end = text.rfind(sep, pos, stop)
    if end <= pos:
        return [], pos + 1  # a ubatch longer than LINES_BYTES: read part by part
    piece = text[pos:end]
    budget = 0 if ctx.budget is None else ctx.budget[0]
    try:
        # parsed as it stands (a newline in a string is not JSON), then compared with
        # the lines joined (the separators' newlines and indents are whitespace then)
        items = orjson.loads("[" + piece + "]")
        if orjson.dumps(items) != ("[" + piece.replace(sep, ",") + "]").encode():
            raise _NotFast
        return _ubatch_columns(items, n, ctx), end
    # orjson's errors are ValueError and TypeError; KeyError: a field missing; and what
    # a check this path missed would raise: the precise path reads those lines
    except (_NotFast, _Bad, KeyError, OverflowError, TypeError, ValueError, IndexError):
        if ctx.budget is not None:
            ctx.budget[0] = budget  # (what the findings charged)
        return [], end


def _taken(record: Record, *names: str) -> itemgetter:
    """The fields `names` of `record`, which must be exactly those it requires: the
    fast path takes a record holding these alone (any other field, the precise path)."""
    assert set(names) == set(record.required), f"{record.name}: teach _ubatch_columns"
    return itemgetter(*names)


_UBATCH_FIELDS = _taken(UBATCH, *UBATCH.names)
_TOKEN_FIELDS = _taken(TOKEN, "pos", "seq", "cell")
_POOL_FIELDS = _taken(POOL, "seq", "k", "first_pos", "last_pos", "cells", "rep", "new")
_POOL_RUN_FIELDS = _taken(POOL_RUN, "seq", "k", "first_pos", "cells", "new")
_ENTRY_FIELDS = _taken(SCATTER, "rep", "cells", "pad")
_ENTRY_RUN_FIELDS = _taken(SCATTER_RUN, "n", "cells", "pad")
_COST_SORTED = tuple(sys.intern(k) for k in sorted(COST_KEYS))  # as `_cost_post` keeps them
_COST_FIELDS = _taken(COST, *_COST_SORTED)
_RUN_STEP_MOST = 2**28  # a run's steps past this are left to the precise path (int64)
_INDENT_MOST = 64  # a ubatch line indented deeper is left to the precise path
_ONLY_DICT, _ONLY_LIST, _ONLY_BOOL = {dict}, {list}, {bool}


def _types(col: Any) -> set[type]:
    return set(map(type, col))


@functools.cache
def _int_bounds(place: tuple[str, ...]) -> tuple[int, int]:
    """The schema's bounds of the integers at `place` of a ubatch (its steps as
    _HOOKS writes them: a name, "*" an item, "|i" a form of a `oneOf`)."""
    node: _Node = _fields()["ubatches"]
    for step in ("*", *place, ""):
        while isinstance(node, _Says):
            node = node.node
        if isinstance(node, _Array) and step == "*":
            node = node.items
        elif isinstance(node, _OneOf) and step.startswith("|"):
            node = node.forms[int(step[1:])]
        elif isinstance(node, _Object) and step:
            node = node.by_name[step]
    assert isinstance(node, _Leaf) and node.types == ("integer",) and node.enum is None \
        and node.const is _MISSING, f"{place}: teach _ubatch_columns"
    return node.lo, node.hi


def _ints(col: Any, place: tuple[str, ...], lo: int = INT_MIN, hi: int = INT_MAX
          ) -> np.ndarray:
    """Column `col` as int64: each item an integer within the schema's bounds at `place`
    and within lo..hi (what the posts bound it by); else _NotFast."""
    at_least, at_most = _int_bounds(place)
    lo, hi = max(lo, at_least), min(hi, at_most)
    if _types(col) - _ONLY_INT:
        raise _NotFast
    a = np.array(col, dtype=np.int64)  # OverflowError past 64 bits
    if a.size and (a.min() < lo or a.max() > hi):
        raise _NotFast
    return a


def _fixed(col: Any, width: int, place: tuple[str, ...], lo: int = INT_MIN,
           hi: int = INT_MAX) -> np.ndarray:
    """Column `col` of arrays of `width` integers each (`_ints`'s), as rows of int64."""
    if _types(col) != _ONLY_LIST or set(map(len, col)) != {width}:
        raise _NotFast
    return _ints(list(chain.from_iterable(col)), (*place, "*"), lo, hi).reshape(-1, width)


def _lengths(col: Any, most: int, least: int = 0) -> np.ndarray:
    """The lengths of column `col`'s arrays, each from `least` to `most` items."""
    if _types(col) != _ONLY_LIST:
        raise _NotFast
    n = np.array(list(map(len, col)), dtype=np.int64)
    if n.min() < least or n.max() > most:
        raise _NotFast
    return n


def _truths(col: Any) -> np.ndarray:
    if _types(col) - _ONLY_BOOL:
        raise _NotFast
    return np.array(col, dtype=bool)


def _per_ubatch(values: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """The sums of `values` over each ubatch's items (`counts` of them, in order)."""
    total = np.concatenate(([0], np.cumsum(values)))
    ends = np.cumsum(counts)
    return total[ends] - total[ends - counts]


def _run_rows(steps: np.ndarray, n: np.ndarray, ctx: _Ctx) -> None:
    """`_Ctx.run_rows` over runs: rows [c0, d, e] (`steps`), `n` entries (pools) each."""
    c0, d, e = steps.T
    if (c0 < 0).any() or (c0 >= ctx.n_rows).any():
        raise _NotFast
    if ((d < -_RUN_STEP_MOST) | (d > _RUN_STEP_MOST) | (e < -_RUN_STEP_MOST)
            | (e > _RUN_STEP_MOST)).any():
        raise _NotFast
    last_entry, last_member = (n - 1) * e, (ctx.kpool - 1) * d
    for row in (c0 + last_member, c0 + last_entry, c0 + last_entry + last_member):
        if (row < 0).any() or (row >= ctx.n_rows).any():
            raise _NotFast


def _shallow(v: Any, levels: int) -> bool:
    """Whether `v` nests at most `levels` arrays and objects deep."""
    stack = [(v, 1)]
    while stack:
        x, depth = stack.pop()
        if depth > levels:
            return False
        stack += [(y, depth + 1) for y in (x.values() if isinstance(x, dict) else x)
                  if isinstance(y, dict | list)]
    return True


def _some(items: list[Any], at: np.ndarray) -> list[Any]:
    """The items `at` (every one, as a rule)."""
    return items if len(at) == len(items) else list(map(items.__getitem__, at.tolist()))


def _pool_columns(pools: list[Any], ctx: _Ctx) -> tuple[np.ndarray, ...]:
    """(seq, k0, k1, new) of each `pools` item, a pool or a run of pools k0..k1-1, as
    the form's checks and `_pool_post` take them; _NotFast where any fails."""
    seq, k0, k1 = (np.zeros(len(pools), dtype=np.int64) for _ in range(3))
    new = np.zeros(len(pools), dtype=bool)
    if not pools:
        return seq, k0, k1, new
    if _types(pools) != _ONLY_DICT:
        raise _NotFast
    sizes = np.array(list(map(len, pools)))
    single, run = sizes == len(POOL.names), sizes == len(POOL_RUN.names)
    if not (single | run).all():
        raise _NotFast
    at = np.flatnonzero(single)
    if at.size:
        taken = map(_POOL_FIELDS, _some(pools, at))
        s, k, first, last, cells, rep, marked = zip(*taken, strict=True)
        place = ("pools", "*", "|0")
        seq[at] = _ints(s, (*place, "seq"), hi=ctx.n_seq_max - 1)
        k0[at] = _ints(k, (*place, "k"), hi=ctx.pools_per_seq - 1)
        k1[at] = k0[at] + 1
        _ints(first, (*place, "first_pos"))
        _ints(last, (*place, "last_pos"))
        _fixed(cells, ctx.kpool, (*place, "cells"), 0, ctx.n_rows - 1)
        _ints(rep, (*place, "rep"), 0, ctx.n_rows - 1)
        new[at] = _truths(marked)
    at = np.flatnonzero(run)
    if at.size:
        taken = map(_POOL_RUN_FIELDS, _some(pools, at))
        s, k, first, cells, marked = zip(*taken, strict=True)
        place = ("pools", "*", "|1")
        seq[at] = _ints(s, (*place, "seq"), hi=ctx.n_seq_max - 1)
        ks = _fixed(k, 2, (*place, "k"))
        if not (ks[:, 0] < ks[:, 1]).all() or ks[:, 1].max() > ctx.pools_per_seq:
            raise _NotFast
        k0[at], k1[at] = ks[:, 0], ks[:, 1]
        _ints(first, (*place, "first_pos"))
        _run_rows(_fixed(cells, 3, (*place, "cells")), ks[:, 1] - ks[:, 0], ctx)
        new[at] = _truths(marked)
    return seq, k0, k1, new


def _scatter_columns(scatter: list[Any], ctx: _Ctx
                     ) -> tuple[np.ndarray, Callable[[], list[ScatterEntry]]]:
    """(the entries each `scatter` item stands for, the plan they make, runs expanded,
    built when called: once the budget allows it), as the form's checks and
    `_scatter_post` take them; _NotFast where any fails."""
    if not scatter:
        return np.zeros(0, dtype=np.int64), list
    if _types(scatter) != _ONLY_DICT or set(map(len, scatter)) != {len(SCATTER.names)}:
        raise _NotFast
    entry = np.array(["rep" in e for e in scatter])
    counts = np.ones(len(scatter), dtype=np.int64)
    at = np.flatnonzero(entry)
    if at.size:
        taken = map(_ENTRY_FIELDS, _some(scatter, at))
        rep, cells, pad = zip(*taken, strict=True)
        _ints(rep, ("scatter", "*", "|0", "rep"), 0, ctx.n_rows - 1)
        _fixed(cells, ctx.kpool, ("scatter", "*", "|0", "cells"), 0, ctx.n_rows - 1)
        _truths(pad)
    at = np.flatnonzero(~entry)
    if at.size:
        taken = map(_ENTRY_RUN_FIELDS, _some(scatter, at))
        n, cells, pad = zip(*taken, strict=True)
        counts[at] = _ints(n, ("scatter", "*", "|1", "n"), hi=ctx.n_pool_max)
        _run_rows(_fixed(cells, 3, ("scatter", "*", "|1", "cells")), counts[at], ctx)
        if _types(pad) != _ONLY_BOOL or any(pad):  # the form's const: false
            raise _NotFast
    if entry.all():
        return counts, lambda: list(zip(rep, map(tuple, cells), pad, strict=True))

    def plan(kpool: int = ctx.kpool) -> list[ScatterEntry]:
        out: list[ScatterEntry] = []
        for e in scatter:
            if "rep" in e:
                out.append((e["rep"], tuple(e["cells"]), e["pad"]))
            else:
                c0, d, step = e["cells"]
                out += _run_entries(e["n"], c0, d, step, kpool)
        return out

    return counts, plan


def _ubatch_columns(items: list[Any], n: int, ctx: _Ctx) -> list[UbatchSummary]:
    """Parsed ubatches n, n + 1, ... checked as the precise path checks each (the
    schema's bounds, the posts' rules and `_ubatch_order`'s), over whole columns, and
    summarized as it summarizes them; _NotFast (or _Bad, from a part its own node
    checks: a stale map, findings) where any check fails, before anything is built
    or charged past the budget."""
    m = len(items)
    if _types(items) != _ONLY_DICT or set(map(len, items)) != {len(UBATCH.names)}:
        raise _NotFast
    col = dict(zip(UBATCH.names, zip(*map(_UBATCH_FIELDS, items), strict=True), strict=True))
    ubatches = _fields()["ubatches"]
    assert isinstance(ubatches, _Array) and isinstance(ubatches.items, _Object)
    ubatch = ubatches.items

    # the order of the ubatches and their ops (`_ubatch_order`, `_op_post`)
    index = _ints(col["index"], ("index",))
    if not np.array_equal(index, np.arange(n, n + m)):
        raise _NotFast
    op = _ints(col["op"], ("op",), hi=MAX_OPS - 1)
    batch_ubatch = _ints(col["batch_ubatch"], ("batch_ubatch",))
    last = ctx.last if n else None
    op_before = np.concatenate(([-1 if last is None else last.op], op[:-1]))
    bu_before = np.concatenate(([-1 if last is None else last.batch_ubatch],
                                batch_ubatch[:-1]))
    same = op == op_before
    if (op < op_before).any() or not np.array_equal(
            batch_ubatch, np.where(same, bu_before + 1, 0)):
        raise _NotFast
    n_tokens = _lengths(col["tokens"], ctx.max_tokens, 1)
    total = np.cumsum(n_tokens)
    first = np.maximum.accumulate(np.where(same, 0, np.arange(m)))  # of the op, here
    op_tokens = total - (total - n_tokens)[first]
    if same[0]:
        op_tokens[first == 0] += ctx.op_tokens
    if op_tokens.max() > ctx.n_batch:
        raise _NotFast

    # tokens (`_token_post`)
    tokens = list(chain.from_iterable(col["tokens"]))
    sizes = set(map(len, tokens))
    if _types(tokens) != _ONLY_DICT or not sizes <= {3, 4}:
        raise _NotFast
    pos, seqs, cells = zip(*map(_TOKEN_FIELDS, tokens), strict=True)
    if 4 in sizes:  # M-RoPE's [x, y] (a fourth field of another name: KeyError)
        if not ctx.by_order:
            raise _NotFast
        _fixed([t["ext"] for t in tokens if len(t) == 4], 2, ("tokens", "*", "ext"), 0,
               POS_LIMIT - 1)
    _ints(pos, ("tokens", "*", "pos"), 0, POS_LIMIT - 1)
    rows = _ints(cells, ("tokens", "*", "cell"), 0, ctx.n_rows - 1)
    n_ids = _lengths(seqs, ctx.n_seq_max, 1)
    ids = _ints(list(chain.from_iterable(seqs)), ("tokens", "*", "seq", "*"), 0,
                ctx.n_seq_max - 1)
    if not ctx.unified and not np.array_equal(rows // ctx.kv_size, ids[np.cumsum(n_ids)
                                                                         - n_ids]):
        raise _NotFast
    if n_ids.max() > 1 and any(len(set(s)) != len(s) for s in seqs):
        raise _NotFast

    # the counts against what they count (`_ubatch_post`)
    n_pool_real = _ints(col["n_pool_real"], ("n_pool_real",), hi=ctx.n_pool_max)
    n_new = _ints(col["n_new"], ("n_new",))
    n_new_g = _ints(col["n_new_g"], ("n_new_g",))
    if (n_new > n_pool_real).any():
        raise _NotFast
    n_pools = _lengths(col["pools"], ctx.n_pool_max)
    seq, k0, k1, new = _pool_columns(list(chain.from_iterable(col["pools"])), ctx)
    marked = _per_ubatch((k1 - k0) * new, n_pools)
    if (_per_ubatch(k1 - k0, n_pools) > n_pool_real).any() or not np.array_equal(
            marked, n_new):
        raise _NotFast
    graphed = np.flatnonzero(n_new_g > np.maximum(n_new, 1))  # past what any bound is
    if graphed.size:
        seq_of = np.repeat(np.repeat(np.arange(m), n_tokens), n_ids) * ctx.n_seq_max + ids
        n_seqs = np.bincount(np.unique(seq_of) // ctx.n_seq_max, minlength=m)
        for k in graphed.tolist():
            most = n_new_graph(int(n_new[k]), int(n_tokens[k]), int(n_seqs[k]),
                               int(n_pool_real[k]), ctx.kv_size, ctx.kpool, ctx.n_seq_max,
                               repool_all=False)
            if n_new_g[k] > most:
                raise _NotFast
    n_scatter = _lengths(col["scatter"], ctx.n_pool_max)
    counts, plan = _scatter_columns(list(chain.from_iterable(col["scatter"])), ctx)
    entries = _per_ubatch(counts, n_scatter)
    stale_node, findings_node = ubatch.by_name["stale_batch"], ubatch.by_name["findings"]
    if _types(col["stale_batch"]) != _ONLY_DICT or _types(col["findings"]) != _ONLY_LIST:
        raise _NotFast
    stale = [stale_node.check(s, ctx) if s else () for s in col["stale_batch"]]
    findings: list[tuple[FindingKey, ...]] = [()] * m
    if any(col["findings"]):
        if not all(_shallow(f, SKEL_DEPTH) for f in col["findings"]):
            raise _NotFast  # (read part by part, as deep as MAX_DEPTH)
        findings = [findings_node.check(f, ctx) if f else () for f in col["findings"]]
    for k in np.flatnonzero(entries != n_new_g).tolist():
        if entries[k] or not any(code == ENGINE_ABORT for code, _ in findings[k]):
            raise _NotFast

    # the cost counters (`_cost_post`: sorted by name)
    if _types(col["cost"]) != _ONLY_DICT or set(map(len, col["cost"])) != {len(COST_KEYS)}:
        raise _NotFast
    counters = list(map(_COST_FIELDS, col["cost"]))
    assert len({_int_bounds(("cost", name)) for name in COST_KEYS}) == 1, "checked as one"
    _ints(list(chain.from_iterable(counters)), ("cost", _COST_SORTED[0]))

    # within the budget, then built
    ctx.charge(sum(_ubatch_bytes(ctx, n_tokens, marked, entries,
                                 np.array(list(map(len, stale)))).tolist()))
    seq_ids = list(map(tuple, seqs))
    tokens_kept = list(zip(pos, map(ctx.seqs.setdefault, seq_ids, seq_ids), strict=True))
    new_at = np.flatnonzero(new)
    pools_marked = [(s, k) for s, a, b in zip(seq[new_at].tolist(), k0[new_at].tolist(),
                                              k1[new_at].tolist(), strict=True)
                    for k in range(a, b)]
    kept, known = ctx.costs, ctx.costs.get  # equal costs: one tuple
    costs = [known(c) or kept.setdefault(c, tuple(zip(_COST_SORTED, c, strict=True)))
             for c in counters]
    out = ubatch_summaries(col["index"], col["op"], col["batch_ubatch"],
                           _split(tokens_kept, n_tokens), stale, col["n_pool_real"],
                           col["n_new"], col["n_new_g"], _split(pools_marked, marked),
                           _split(plan(), entries), findings, costs)
    ctx.last, ctx.op_tokens = out[-1], int(op_tokens[-1])
    return out


def _split(items: list[Any], counts: np.ndarray) -> list[tuple[Any, ...]]:
    """`items` cut into tuples of `counts` items each, in order."""
    if not items:
        return [()] * len(counts)
    if counts.min() == counts.max():  # as many each (one token a ubatch, one entry)
        return list(zip(*[iter(items)] * int(counts[0]), strict=True))
    ends = np.cumsum(counts).tolist()
    return [tuple(items[a:b]) for a, b in zip([0, *ends[:-1]], ends, strict=True)]


# `_ubatch_columns` gives `ubatch_summaries` the columns in this order
assert tuple(f.name for f in fields(UbatchSummary)) == (
    "index", "op", "batch_ubatch", "tokens", "stale_batch", "n_pool_real", "n_new", "n_new_g",
    "marked", "scatter", "findings", "cost"), "UbatchSummary's fields: teach _ubatch_columns"


def _most(attr: str, what: str) -> _Limit:
    """A limit: at most the config's `attr` (a _Ctx bound), `what` saying why."""
    return _Limit(attr, lambda ctx, n: f"more than {n} {what}")


_SEQS = _most("n_seq_max", "sequences (config.n_seq_max)")
_ROWS = _most("n_rows", "rows (the cache's: config.kv_size x streams)")
_POOLS = _most("n_pool_max", "pools (the most the cache holds: config.n_seq_max x "
               "kv_size // kpool)")
_MEMBERS = _most("kpool", "rows (a pool's members: config.kpool)")
_COUNTERS = 64  # undeclared cost counters (a later version's) a report may hold


_COUNTER_LIMIT = _Limit("n_counters", lambda ctx, n: f"more than {n} counters "
                        f"({len(COST_KEYS)} and {_COUNTERS} a later version adds)")


_U, _F = ("ubatches", "*"), ("findings", "*")
_FINDING_LIMITS = {"rows": _ROWS, "row_runs": _ROWS, "seqs": _SEQS, "pools": _POOLS,
                   "tokens": _most("max_tokens", "tokens (a ubatch's most)")}
_HOOKS: dict[tuple[str, ...], _Hook] = {
    ("tool",): _Hook(_tool_post),
    ("trace",): _Hook(_trace_post),
    ("engine",): _Hook(_engine_post),
    ("backend",): _Hook(_backend_post),
    ("config",): _Hook(_cfg_post),
    ("ubatches",): _Hook(item=_ubatch_order, lines=_ubatch_lines),
    _U: _Hook(_ubatch_post),
    (*_U, "op"): _Hook(_op_post),
    (*_U, "tokens"): _Hook(limit=_Limit("max_tokens", _tokens_say)),
    (*_U, "tokens", "*"): _Hook(_token_post),
    (*_U, "tokens", "*", "seq"): _Hook(limit=_SEQS),
    (*_U, "stale_batch"): _Hook(_seq_map_post, limit=_SEQS),
    (*_U, "pools"): _Hook(limit=_POOLS),
    (*_U, "pools", "*"): _Hook(_pool_post),
    (*_U, "pools", "*", "|0", "cells"): _Hook(limit=_MEMBERS),
    (*_U, "scatter"): _Hook(limit=_POOLS),
    (*_U, "scatter", "*"): _Hook(_scatter_post),
    (*_U, "scatter", "*", "|0", "cells"): _Hook(limit=_MEMBERS),
    (*_U, "scatter", "*", "|1", "cells"): _Hook(says=_steps_say),
    (*_U, "scatter", "*", "|1", "n"): _Hook(says=lambda v: f"a run of {_show(v)} entries: a "
                                            "run holds 2 or more" if type(v) is int else None),
    (*_U, "pools", "*", "|1", "cells"): _Hook(says=_steps_say),
    # counters a later version adds are compared and summed too: integers >= 0
    (*_U, "cost"): _Hook(_cost_post, limit=_COUNTER_LIMIT, extra=COST[COST_KEYS[0]].schema),
    ("summary", "cost"): _Hook(limit=_COUNTER_LIMIT),
    (*_U, *_F): _Hook(_finding_post),
    (*_U, *_F, "code"): _Hook(_code_post),
    ("events", "*"): _Hook(_event_post),
    ("events", "*", "op"): _Hook(_op_post),
    ("events", "*", "stale"): _Hook(_seq_map_post, limit=_SEQS),
    ("events", "*", *_F): _Hook(_finding_post),
    ("events", "*", *_F, "code"): _Hook(_code_post),
    ("expectations", "*"): _Hook(_dropped),
    ("problems", "*"): _Hook(_problem_post),
    **{(*where, *_F, name): _Hook(limit=limit) for where in (_U, ("events", "*"))
       for name, limit in _FINDING_LIMITS.items()},
}


_used: set[tuple[str, ...]] = set()  # the places _compile went through


@functools.cache
def _fields() -> dict[str, _Node]:
    """The report's fields, compiled from `report_schema()`, by name."""
    schema = report_schema()
    node = _compile(schema["$defs"]["report"], schema["$defs"], (), _HOOKS)
    assert isinstance(node, _Object)
    stray = set(_HOOKS) - _used
    assert not stray, f"hooks at places the report schema does not have: {sorted(stray)}"
    return node.by_name


def _min_reports() -> int:
    """The fewest reports an array of them holds (the schema's root: one report, or an
    array of at least this many)."""
    return min(f.get("minItems", 1) for f in report_schema()["oneOf"] if "items" in f)


# --- a report ---------------------------------------------------------------------------------

_BIG = ("ubatches", "events")  # read once the config (and the writer) is known


class _Report:
    """One report object, member by member (in the order given): the format version
    first (a report of another format is not read further), problems with the other
    fields as they come, `ubatches` and `events` once `tool` and `config` are read
    (before: set aside, read at the end)."""

    def __init__(self, ctx: _Ctx) -> None:
        self.ctx = ctx
        self.fields = _fields()
        self.values: dict[str, Any] = {}
        self.keys: set[str] = set()
        self.version: Any = _MISSING
        self.problem: _Bad | None = None  # the first, met before the version was known
        self.later: list[tuple[str, Callable[[_Node], Any]]] = []

    def version_ok(self) -> bool:
        return type(self.version) is int and self.version == REPORT_VERSION

    def take(self, key: str, read: Callable[[_Node], Any]) -> None:
        """Member `key`, its value read by `read(node)`."""
        self.keys.add(key)
        node = self.fields.get(key)

        def past(skip: _Node = _ANY) -> Any:  # not read, only checked as JSON
            try:
                return read(skip)
            except _Bad as e:
                e.where.append(_key(key))
                raise

        if key == "kpool_report":
            self.version = past(_RAW)
            return
        if node is None or (self.version is not _MISSING and not self.version_ok()
                            and key != "tool"):
            past()
            return
        if key in _BIG and not ("tool" in self.values and "config" in self.values
                                and self.version_ok() and self.problem is None):
            self.later.append((key, read))
            past()
            return
        try:
            self.values[key] = read(node)
        except _Bad as e:
            e.where.append(_key(key))
            if self.version_ok() and self.problem is None:
                raise
            if self.problem is None:
                self.problem = e
            past()  # past the value, where its reading stopped

    def done(self) -> RunSummary:
        if self.version is _MISSING:
            if "kpool_trace" in self.keys:
                raise _Bad("a trace, not a report: a trace in JSON syntax must be named "
                           ".yaml or .yml, or be given with other traces")
            raise _Bad("not a kpool report (no \"kpool_report\": 1)")
        if not self.version_ok():
            tool = self.values.get("tool")
            writer = f", written by kpool {_clip(tool['version'])}" if tool else ""
            raise _Bad(f"report format {_show(self.version)}{writer}: this kpool "
                       f"({__version__}) reads format {REPORT_VERSION}", ".kpool_report")
        if self.problem is not None:
            raise self.problem
        for name in REPORT.required:
            if name not in self.keys:
                raise _Bad("missing field", _key(name))
        for key, read in self.later:
            try:
                self.values[key] = read(self.fields[key])
            except _Bad as e:
                e.where.append(_key(key))
                raise
        _stopped(self.values.get("problems"), self.values.get("summary"))
        v = self.values
        path, name, sha256 = v["trace"]
        return RunSummary(path, name, sha256, v["engine"], v["backend"], v["config"],
                          v["ubatches"], tuple(e for e in v["events"] if e.kind != "note"),
                          self.ctx.writer)


def _stopped(problems: Any, summary: Any) -> None:
    """Refuse the report of a replay that stopped: an invalid trace, a signal (from
    `problems` and `summary`, checked or as they are)."""
    status = summary.get("status") if isinstance(summary, dict) else None
    if not problems and status not in STOPPED_STATUSES:
        return
    if status == "interrupted" and not problems:
        raise _Bad("the replay was interrupted (a signal ended it), so the report is not "
                   "a whole run and cannot be compared", ".summary.status")
    first = ""
    if isinstance(problems, list | tuple) and problems and isinstance(problems[0], dict):
        msg = problems[0].get("message")
        if isinstance(msg, str):
            first = f" ({_clip(msg, 120)})"
    raise _Bad("the replay stopped: the trace turned out invalid mid-replay"
               f"{first}, so the report is not a whole run and cannot be compared",
               ".problems" if problems else ".summary.status")


class _Raw(_Node):
    """A value kept as parsed (a container: an empty one, its kind is all that shows)."""

    def check(self, v: Any, ctx: _Ctx) -> Any:
        return v

    def read(self, doc: _Text, pos: int, depth: int, ctx: _Ctx) -> tuple[Any, int]:
        c = doc.text[pos:pos + 1]
        if c in ("[", "{"):
            return ([] if c == "[" else {}), doc.skip(pos, depth)
        return doc.parse(pos)


_RAW = _Raw()


def _located(e: _Bad, file: str, root: str, doc: _Text | None) -> ReportError:
    """The error of problem `e` in the report at `root` (`report`, `reports[n]`) of
    `file`: `FILE:LINE:COL: PATH: problem`, placed at the value `e` is about (or as far
    as the text holds its path); `FILE: PATH: problem` without the text (`from_report`
    given a parsed object alone)."""
    path = root + "".join(reversed(e.where))
    place = file if doc is None else _place(file, doc.text, doc.value_at(
        path.removeprefix("reports").removeprefix("report")))
    return ReportError(f"{place}: {path}: {visible(e.problem)}")


def from_report(doc: object, file: str, root: str = "report",
                budget: list[int] | None = None, text: _Text | None = None) -> RunSummary:
    """A summary of one parsed report object. Raises ReportError naming `file` and the
    JSON path of the first field that is wrong (`root` is its path in the file), and
    its line and column when given the file's `text`; `budget`: [bytes] the summary
    may take (shared by the reports of a file)."""
    if not isinstance(doc, dict):
        raise _located(_not_a_report(doc), file, root, text)
    ctx = _Ctx(budget)
    r = _Report(ctx)
    r.keys.update(doc)
    try:
        for name in REPORT.names:  # kpool_report first, then as the format lists them
            if name in doc:

                def check(node: _Node, v: Any = doc[name]) -> Any:
                    return node.check(v, ctx)

                r.take(name, check)
            elif r.version_ok() and name in REPORT.required:
                raise _Bad("missing field", _key(name))
            if name == "tool" and r.version_ok():
                _stopped(doc.get("problems"), doc.get("summary"))
        return r.done()
    except _Bad as e:
        raise _located(e, file, root, text) from None


def _read_report(doc: _Text, pos: int, depth: int, file: str, root: str,
                 budget: list[int]) -> tuple[RunSummary, int]:
    """The report object at `pos` (its level: `depth`), read member by member."""
    ctx = _Ctx(budget)
    r = _Report(ctx)
    text = doc.text
    keys: set[str] = set()
    doc.opens.append(pos)
    i = doc.ws(pos + 1)
    more = not text.startswith("}", i)
    if not more:
        i += 1
    try:
        while more:
            k, i = doc.key(i, keys)
            at = i

            def read(node: _Node, at: int = at) -> Any:
                nonlocal i
                v, i = node.read(doc, at, depth + 1, ctx)
                return v

            r.take(k, read)
            more, i = doc.after(i, "}")
        end = i  # (the members set aside move `i` when `done` reads them)
        doc.opens.pop()
        return r.done(), end
    except _Bad as e:
        raise _located(e, file, root, doc) from None


def _read_document(text: str, file: str, size: int) -> list[RunSummary]:
    doc = _Text(text, file)
    budget = [MEMORY_PER_BYTE * size + MEMORY_FLOOR]
    i = doc.ws(0)
    c = text[i:i + 1]
    out: list[RunSummary] = []
    if c == "{" or c == "[":
        end = doc.small_end(i, 1)
        if end >= 0:  # small: parsed at once, so what is not JSON is found first
            try:
                v, _ = doc.parse(i)
            except _Bad as e:
                raise _located(e, file, "reports" if c == "[" else "report", doc) from None
            if doc.ws(end) != len(text):
                doc.fail(doc.ws(end), "Extra data")
            if c == "{":
                return [from_report(v, file, "report", budget, doc)]
            out = [from_report(x, file, f"reports[{n}]", budget, doc)
                   for n, x in enumerate(v)]
            end = len(text)
        elif c == "{":
            s, end = _read_report(doc, i, 1, file, "report", budget)
            out.append(s)
        else:
            doc.opens.append(i)
            end = doc.ws(i + 1)
            more = not text.startswith("]", end)
            if not more:
                end += 1
            while more:
                root = f"reports[{len(out)}]"
                if not text.startswith("{", end):
                    try:
                        v, _ = _RAW.read(doc, end, 2, _Ctx(None))
                    except _Bad as e:
                        raise _located(e, file, root, doc) from None
                    raise _located(_not_a_report(v), file, root, doc)
                s, end = _read_report(doc, end, 2, file, root, budget)
                out.append(s)
                more, end = doc.after(end, "]")
    else:
        try:
            v, end = doc.parse(i)
        except _Bad as e:
            raise _located(e, file, "report", doc) from None
        if doc.ws(end) != len(text):
            doc.fail(doc.ws(end), "Extra data")
        raise _located(_not_a_report(v), file, "report", doc)
    if doc.ws(end) != len(text):
        doc.fail(doc.ws(end), "Extra data")
    if c == "[" and len(out) < _min_reports():
        raise _located(_Bad("an empty array holds no report" if not out else
                            f"an array of {len(out)} report: an array holds "
                            f"{_min_reports()} or more (kpool writes one report as an "
                            "object)"), file, "reports", doc)
    return out


# --- a file -------------------------------------------------------------------------------------


def read_report_bytes(path: str) -> bytes:
    """At most MAX_REPORT_BYTES of `path`; ReportError when it holds more."""
    file = visible(input_name(path))
    too_big = (f"{file}: the report is larger than {MAX_REPORT_BYTES >> 20} MiB, the most "
               "kpool diff reads (diff the traces instead: kpool diff TRACE --base A --head B)")
    try:  # a regular file only, opened without blocking, read with the bound
        data = read_input(path, MAX_REPORT_BYTES)
    except InputTooLarge:
        raise ReportError(too_big) from None
    except InputRefused as e:
        raise ReportError(f"{file}: cannot read the report: it {e}") from None
    except OSError as e:
        raise ReportError(f"{file}: cannot read the report: "
                          f"{e.strerror or type(e).__name__}") from None
    except MemoryError:
        raise ReportError(f"{file}: too large to hold in memory") from None
    return data  # (read_input raises InputTooLarge past the bound, a file grown too)


def _decode(data: bytes, file: str) -> str:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = line_at(data, e.start)
        raise ReportError(f"{file}:{line}: not UTF-8 text ({e.reason} at byte {e.start})"
                          ) from None
    return text.removeprefix("\ufeff")


def read_reports(path: str) -> list[RunSummary]:
    """The reports in a `kpool replay --format json` file: one object, or an array."""
    file = visible(input_name(path))
    data = read_report_bytes(path)
    size = len(data)
    text = _decode(data, file)
    del data
    # what is read is trees (no reference cycles) kept by the hundred thousand: the
    # cycle collector would walk them again and again (half the time), for nothing
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _read_document(text, file, size)
    except RecursionError:
        raise ReportError(_too_deep(file, text, _too_deep_at(text))) from None
    except MemoryError:
        raise ReportError(f"{file}: too large to hold in memory") from None
    finally:
        if collecting:
            gc.enable()
