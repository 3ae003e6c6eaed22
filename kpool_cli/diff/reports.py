"""Saved reports as `kpool diff` input: untrusted files, read with bounds, checked
field by field, turned into `RunSummary`s.

Reports are attached to bug reports and passed around, so nothing in one is trusted.
Owns: `input_kind` (is a path a report or a trace?), `read_reports` (a file to
summaries), `from_report` (one parsed report object to a summary), `ReportError`.

What a report must be, and what happens otherwise. Every failure is a `ReportError`
naming the file and, for a field, its JSON path (`reports[1].ubatches[3].findings[0]
.code` in a file holding an array of reports, `report.engine` in a file holding one),
or a line and column for what is not JSON at all; `kpool diff` exits 2 with it.

- Size: a file larger than `MAX_REPORT_BYTES` (128 MiB) is refused, and never more
  than that is read (a multi-GB attachment, `/dev/zero`): reading a report takes
  about 8 times its size in memory, and a diff holds two runs at once (`summary`).
  A report that large is of a trace of some 100k ubatches: diff the traces instead.
- JSON: UTF-8 (a leading byte order mark is allowed), RFC 8259 JSON. `NaN`,
  `Infinity`, duplicate keys in any object, and lone surrogates in a string the diff
  reads are refused where they are; nesting too deep for the parser is refused at the
  line and column where it goes past `DEPTH_SHOWN` levels (a report nests 6).
- Numbers: every number the diff reads is an integer of at most 64 bits (`1e999`,
  `1.0`, `10**5000` and `true` are not); counts, indexes and rows are not negative.
  Numbers it does not read are not converted, so no size of them costs anything.
- Fields: every field the diff reads must be there with its type of TRACE_FORMAT.md
  ("Report"; `kpool schema report`), as kpool writes it: `kpool_report` (1), `tool`,
  `trace` (`path`, `name`, `sha256`), `engine`, `backend`, `config`, `ubatches`
  (`index`, `op`, `batch_ubatch`, `tokens[].pos/seq`, `stale_batch`, `n_pool_real`,
  `n_new`, `n_new_g`, `pools[].seq/k/new`, `scatter[].rep/cells/pad` (or the run
  forms: `pools[].k` as `[k0, k1]`, `scatter[].n` with `cells` as `[c0, d, e]`),
  `cost`, `findings[].code/rows/row_runs`), `events` (`op`, `kind`, `status`,
  `stale`, and `message` and `findings` when present). The config's fields, their
  bounds and which may be absent, and the cost counters required, are those
  `report.format` declares (`CONFIG`, `COST_KEYS`). The format is open: fields the
  diff does not read, known or added by a later version, are neither read nor
  checked.
- Another kpool version: a `kpool_report` other than 1, a finding code this kpool
  does not know (a newer kpool may add KP008), or a value backend it does not know
  is refused, naming the value and the kpool version that wrote the report: its
  severity and meaning are unknown here, so no verdict on it could be right. Diff
  such reports with the kpool that wrote them, or replay the traces with this one.
- A stopped replay: a report whose trace turned out invalid mid-replay (`problems`,
  `summary.status` "invalid") is not a whole run and is refused.

Classification (`input_kind`): a path ending in `.json` is a report and one ending
in `.yaml` or `.yml` a trace, by name (JSON is YAML: a generator may write a trace
in JSON syntax); any other file by content: its first non-blank byte is `{` or `[`
for a report, anything else (or an unreadable file) is a trace.
"""

from __future__ import annotations

import functools
import json
import os
import re
import stat
from collections.abc import Callable
from typing import Any

from .. import __version__
from ..report.format import CONFIG, COST_KEYS, REPORT_VERSION
from ..trace.format import CACHE, OP_STATUSES
from ..verdict.codes import CODES
from ..wording import visible
from .summary import EventSummary, FindingKey, RunSummary, UbatchSummary

MAX_REPORT_BYTES = 128 * 1024 * 1024  # a larger report is refused, and not read
SNIFF_BYTES = 64 * 1024  # blank bytes looked through for the first non-blank one
DEPTH_SHOWN = 100  # a report nests 6 levels; parser-deep nesting is shown from here
INT_MIN, INT_MAX = -(2**63), 2**63 - 1
VALUE_BACKENDS = ("numba", "numpy")  # `backend` of a report: null (or "none") or these

_CODE = re.compile(r"KP[0-9]{3}", re.ASCII)
_SEQ_ID = re.compile(r"0|[1-9][0-9]{0,17}", re.ASCII)
_SHA256 = re.compile(r"([0-9a-f]{64})?", re.ASCII)
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*", re.ASCII)
_SURROGATE = re.compile("[\ud800-\udfff]")
_STRING_OR_BRACKET = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]', re.DOTALL)


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
    try:
        with open(path, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                return "trace", "not a regular file"
            chunk = f.read(SNIFF_BYTES)
    except OSError:
        return "trace", "unreadable"
    chunk = chunk.removeprefix(b"\xef\xbb\xbf").lstrip(b" \t\r\n")
    if chunk[:1] in (b"{", b"["):
        return "report", f"starts with {chunk[:1].decode()}"
    return "trace", "does not start with { or ["


# --- JSON, with bounds --------------------------------------------------------------------


class _Number:
    """A number the parser did not convert: a float (`1.5`, `1e999`), an integer of
    more than 64 bits, or a non-JSON constant (`NaN`, `Infinity`; `bad`)."""

    __slots__ = ("bad", "text")

    def __init__(self, text: str, bad: bool = False) -> None:
        self.text, self.bad = text, bad

    @property
    def integral(self) -> bool:
        return self.text.lstrip("-").isdigit()


class _Dup(dict):
    """An object that had a key twice (the last value kept, as json does)."""

    __slots__ = ("duplicate",)
    duplicate: str  # the first key seen twice


class _Parser:
    def __init__(self) -> None:
        self.suspect = False  # a NaN or a duplicate key somewhere: find where

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


def _line_col(text: str, offset: int) -> tuple[int, int]:
    line = text.count("\n", 0, offset) + 1
    return line, offset - (text.rfind("\n", 0, offset) + 1) + 1


def _too_deep_at(text: str) -> int:
    """Where the nesting of `text` first goes past DEPTH_SHOWN levels (0 if it does not)."""
    depth = 0
    for m in _STRING_OR_BRACKET.finditer(text):
        c = m.group()
        if c in "[{":
            depth += 1
            if depth > DEPTH_SHOWN:
                return m.start()
        elif c in "]}":
            depth -= 1
    return 0


def _key(k: str) -> str:
    """A path step for key `k`: `.name`, or `["odd key"]` (ASCII-escaped)."""
    return f".{k}" if _NAME.fullmatch(k) else f"[{json.dumps(k)}]"


def _roots(doc: object) -> list[tuple[str, object]]:
    """(path, report) of each report in a document: one object, or an array."""
    if isinstance(doc, list):
        return [(f"reports[{i}]", d) for i, d in enumerate(doc)]
    return [("report", doc)]


def _find_suspect(doc: object) -> tuple[str, str] | None:
    """(path, problem) of the first NaN/Infinity or duplicate key, in document order."""
    stack: list[tuple[str, object]] = list(reversed(_roots(doc)))
    while stack:
        path, v = stack.pop()
        if isinstance(v, _Number) and v.bad:
            return path, f"{v.text} is not JSON (a report holds only integers)"
        if isinstance(v, dict):
            if isinstance(v, _Dup):
                return path, f"duplicate key {json.dumps(v.duplicate)}"
            stack.extend((path + _key(k), x) for k, x in reversed(v.items()))
        elif isinstance(v, list):
            stack.extend((f"{path}[{i}]", x) for i, x in reversed(list(enumerate(v))))
    return None


def parse_report_json(data: bytes, file: str) -> object:
    """The JSON document in `data`, every number the reader may need kept exact."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise ReportError(f"{file}:{line}: not UTF-8 text ({e.reason} at byte {e.start})"
                          ) from None
    text = text.removeprefix("\ufeff")
    p = _Parser()
    try:
        doc = json.loads(text, parse_int=p.integer, parse_float=_Number,
                         parse_constant=p.constant, object_pairs_hook=p.pairs)
    except json.JSONDecodeError as e:
        raise ReportError(f"{file}:{e.lineno}:{e.colno}: not JSON: {e.msg}") from None
    except RecursionError:
        at = _too_deep_at(text)
        line, col = _line_col(text, at)
        raise ReportError(f"{file}:{line}:{col}: arrays and objects nested too deeply to "
                          f"read (past {DEPTH_SHOWN} levels here; a report nests 6)") from None
    except MemoryError:
        raise ReportError(f"{file}: too large to hold in memory") from None
    if p.suspect:
        found = _find_suspect(doc)
        if found is not None:
            raise ReportError(f"{file}: {found[0]}: {found[1]}")
    return doc


def read_report_bytes(path: str) -> bytes:
    """At most MAX_REPORT_BYTES of `path`; ReportError when it holds more."""
    file = visible(path)
    too_big = (f"{file}: the report is larger than {MAX_REPORT_BYTES >> 20} MiB, the most "
               "kpool diff reads (diff the traces instead: kpool diff TRACE --base A --head B)")
    try:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            if stat.S_ISREG(st.st_mode) and st.st_size > MAX_REPORT_BYTES:
                raise ReportError(too_big)
            data = f.read(MAX_REPORT_BYTES + 1)
    except OSError as e:
        raise ReportError(f"{file}: cannot read the report: "
                          f"{e.strerror or type(e).__name__}") from None
    except MemoryError:
        raise ReportError(f"{file}: too large to hold in memory") from None
    if len(data) > MAX_REPORT_BYTES:
        raise ReportError(too_big)
    return data


def read_reports(path: str) -> list[RunSummary]:
    """The reports in a `kpool replay --format json` file: one object, or an array."""
    file = visible(path)
    doc = parse_report_json(read_report_bytes(path), file)
    if isinstance(doc, list) and not doc:
        raise ReportError(f"{file}: an empty array holds no report")
    try:
        return [from_report(d, file, root) for root, d in _roots(doc)]
    except MemoryError:
        raise ReportError(f"{file}: too large to hold in memory") from None


# --- field by field -----------------------------------------------------------------------


class _Bad(Exception):
    """A field that is not what the report format says: the problem, and the path to
    it, gathered innermost first as the error goes up."""

    def __init__(self, problem: str, *where: str) -> None:
        super().__init__(problem)
        self.problem = problem
        self.where = list(where)


def _clip(s: str, n: int = 40) -> str:
    return s if len(s) <= n else f"{s[:n - 10]}... ({len(s)} characters)"


def _show(v: object) -> str:
    """A value as the message shows it: short, ASCII, and no control character."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return _clip(repr(v))
    if isinstance(v, _Number):
        if v.integral and len(v.text) > 30:
            return f"{v.text[:12]}... (an integer of {len(v.text.lstrip('-'))} digits)"
        return _clip(v.text)
    if isinstance(v, str):
        return "the string " + json.dumps(_clip(v, 60))
    if isinstance(v, list):
        return "an array"
    return "an object"


def _int(v: object, lo: int = INT_MIN) -> int:
    if type(v) is int:
        if lo <= v <= INT_MAX:
            return v
        raise _Bad(f"{v} is out of range (at least {lo})" if v < lo else
                   f"{v} is out of range (at most {INT_MAX})")
    if isinstance(v, _Number) and v.integral:
        raise _Bad(f"{_show(v)} is out of range (integers of at most 64 bits)")
    want = "a non-negative integer" if lo == 0 else ("a positive integer" if lo == 1
                                                      else "an integer")
    raise _Bad(f"expected {want}, got {_show(v)}")


def _nat(v: object) -> int:
    return _int(v, 0)


def _bool(v: object) -> bool:
    if type(v) is bool:
        return v
    raise _Bad(f"expected true or false, got {_show(v)}")


def _str(v: object) -> str:
    if type(v) is str:
        m = _SURROGATE.search(v)
        if m:
            raise _Bad(f"not Unicode text: a lone surrogate \\u{ord(m.group()):04x}")
        return v
    raise _Bad(f"expected a string, got {_show(v)}")


def _obj(v: object) -> dict:
    if isinstance(v, dict):
        return v
    raise _Bad(f"expected an object, got {_show(v)}")


def _list(v: object) -> list:
    if type(v) is list:
        return v
    raise _Bad(f"expected an array, got {_show(v)}")


_MISSING = object()


def _field(d: dict, key: str, conv: Callable[[Any], Any], default: object = _MISSING) -> Any:
    """`conv(d[key])`; a missing key is an error unless a default is given."""
    v = d.get(key, _MISSING)
    if v is _MISSING:
        if default is _MISSING:
            raise _Bad("missing field", _key(key))
        return default
    try:
        return conv(v)
    except _Bad as e:
        e.where.append(_key(key))
        raise


def _each(v: object, conv: Callable[[Any], Any]) -> tuple:
    out = []
    for i, x in enumerate(_list(v)):
        try:
            out.append(conv(x))
        except _Bad as e:
            e.where.append(f"[{i}]")
            raise
    return tuple(out)


def _ints(v: object, lo: int = INT_MIN) -> tuple[int, ...]:
    items = _list(v)
    if all(type(x) is int and lo <= x <= INT_MAX for x in items):
        return tuple(items)
    return _each(items, lambda x: _int(x, lo))


def _seq_map(v: object) -> tuple[tuple[int, int], ...]:
    """{"seq id": position} as sorted (seq, position) pairs."""
    out = []
    for k, p in _obj(v).items():
        if not _SEQ_ID.fullmatch(k):
            raise _Bad(f"not a seq id: {json.dumps(_clip(k))} (keys are seq ids: \"0\", "
                       "\"1\", ...)", f"[{json.dumps(k)}]")
        try:
            out.append((int(k), _int(p)))
        except _Bad as e:
            e.where.append(f"[{json.dumps(k)}]")
            raise
    return tuple(sorted(out))


class _Reader:
    """One report object to a RunSummary. Knows the kpool version that wrote it, so a
    code or value it does not know can say where it comes from."""

    def __init__(self) -> None:
        self.writer = "?"  # tool.version of the report
        self.kpool = 1  # the report's config.kpool (runs of scatter entries need it)
        self.n_rows = 0  # its kv_size * n_stream (bounds the rows of row runs)

    def _from_another_version(self) -> str:
        if self.writer == __version__:
            return (f"the report claims to be from kpool {__version__} (this version), which "
                    "never writes that: it was edited, or made by another tool")
        return (f"the report was written by kpool {_clip(self.writer)}, this is kpool "
                f"{__version__}: diff it with that version, or replay the trace with this one")

    def code(self, v: object) -> str:
        code = _str(v)
        if code in CODES:
            return code
        if _CODE.fullmatch(code):
            raise _Bad(f"unknown finding code {json.dumps(code)} (this kpool knows "
                       f"{', '.join(CODES)}): {self._from_another_version()}")
        raise _Bad(f"not a finding code: {_show(code)} (codes are KP and three digits)")

    def findings(self, v: object) -> tuple[FindingKey, ...]:
        return _each(v, lambda f: (_field(_obj(f), "code", self.code), self.rows(f)))

    def rows(self, f: dict) -> tuple[int, ...]:
        """A finding's rows: `rows`, and those of its `row_runs` [first, end, step]
        (at most the cache's rows in all), sorted as kpool wrote them."""
        rows = list(_field(f, "rows", _ints))
        runs = _field(f, "row_runs", lambda rs: _each(rs, _row_run), ())
        if sum(len(r) for r in runs) > self.n_rows:
            raise _Bad(f"row runs name more rows than the cache's {self.n_rows}", ".row_runs")
        for r in runs:
            rows.extend(r)
        return tuple(sorted(rows))

    def backend(self, v: object) -> str | None:
        if v is None or v == "none":
            return None
        name = _str(v)
        if name in VALUE_BACKENDS:
            return name
        raise _Bad(f"unknown value backend {json.dumps(_clip(name))} (this kpool knows "
                   f"{', '.join(VALUE_BACKENDS)}, or null): {self._from_another_version()}")

    def ubatch(self, v: object) -> UbatchSummary:
        u = _obj(v)
        n_pool_real = _field(u, "n_pool_real", _nat)
        n_new_g = _field(u, "n_new_g", _nat)
        return UbatchSummary(
            index=_field(u, "index", _nat), op=_field(u, "op", _nat),
            batch_ubatch=_field(u, "batch_ubatch", _nat),
            tokens=_field(u, "tokens", lambda ts: _each(ts, _token)),
            stale_batch=_field(u, "stale_batch", _seq_map),
            n_pool_real=n_pool_real, n_new=_field(u, "n_new", _nat), n_new_g=n_new_g,
            marked=tuple(p for item in _field(u, "pools", lambda ps: _each(
                ps, lambda q: self.pools(q, n_pool_real))) for p, new in item if new),
            scatter=tuple(e for item in _field(u, "scatter", lambda es: _each(
                es, lambda q: self.scatter(q, n_new_g))) for e in item),
            findings=_field(u, "findings", self.findings),
            cost=_field(u, "cost", _cost),
        )

    def pools(self, v: object, n_pool_real: int) -> tuple[tuple[tuple[int, int], bool], ...]:
        """A `pools` item: one pool, or a run {"seq", "k": [k0, k1], ...} of pools
        k0..k1-1 (at most n_pool_real of them), each ((seq, k), new)."""
        p = _obj(v)
        seq, new = _field(p, "seq", _nat), _field(p, "new", _bool)
        k = p.get("k")
        if not isinstance(k, list):
            return (((seq, _field(p, "k", _nat)), new),)
        k0, k1 = _field(p, "k", lambda r: _range(r, n_pool_real))
        _field(p, "cells", _steps)
        return tuple(((seq, kk), new) for kk in range(k0, k1))

    def scatter(self, v: object, n_new_g: int) -> tuple[tuple[int, tuple[int, ...], bool], ...]:
        """A `scatter` item: one entry, or a run {"n", "cells": [c0, d, e], "pad": false}
        of n entries (at most n_new_g), entry i pooling rows c0 + i e + j d (j <
        kpool) into the last of them."""
        e = _obj(v)
        if "rep" in e:
            return ((_field(e, "rep", _nat), _field(e, "cells", _ints), _field(e, "pad", _bool)),)
        n = _field(e, "n", _nat)
        if not 2 <= n <= n_new_g:
            raise _Bad(f"a run of {n} entries in a ubatch of {n_new_g}", ".n")
        c0, d, step = _field(e, "cells", _steps)
        pad = _field(e, "pad", _bool)
        return tuple((members[-1], members, pad)
                     for members in (tuple(c0 + i * step + j * d for j in range(self.kpool))
                                     for i in range(n)))

    def event(self, v: object) -> EventSummary:
        e = _obj(v)
        return EventSummary(
            _field(e, "op", _nat), _field(e, "kind", _str), _field(e, "status", _status),
            _field(e, "stale", _seq_map), _field(e, "findings", self.findings, ()),
            _field(e, "message", _str, ""))

    def run(self, doc: dict) -> RunSummary:
        tool = _field(doc, "tool", _obj)
        _field(tool, "name", _str)
        try:
            self.writer = _field(tool, "version", _str)
        except _Bad as e:
            e.where.append(".tool")
            raise
        _stopped(doc)
        trace = _field(doc, "trace", _obj)
        try:
            path = _field(trace, "path", _str)
            name = _field(trace, "name", lambda v: "" if v is None else _str(v))
            sha256 = _field(trace, "sha256", _sha256)
        except _Bad as e:
            e.where.append(".trace")
            raise
        engine = _field(doc, "engine", _str)
        backend = _field(doc, "backend", self.backend)
        config = _field(doc, "config", _config)
        cfg: dict[str, Any] = dict(config)
        self.kpool = cfg["kpool"]
        self.n_rows = cfg["kv_size"] * (1 if cfg["unified"] else cfg["n_seq_max"])
        ubatches = _field(doc, "ubatches", lambda us: _each(us, self.ubatch))
        events = _field(doc, "events", lambda es: _each(es, self.event))
        return RunSummary(path, name, sha256, engine, backend, config, ubatches,
                          tuple(e for e in events if e.kind != "note"), self.writer)


def _range(v: object, most: int) -> tuple[int, int]:
    """A half-open [a, b) of non-negative integers with a < b and b - a <= most."""
    r = _ints(v, 0)
    if len(r) != 2 or not r[0] < r[1]:
        raise _Bad(f"expected a range [a, b) with a < b, got {_show(v)}")
    if r[1] - r[0] > most:
        raise _Bad(f"the range {list(r)} holds more than the {most} its ubatch has")
    return r[0], r[1]


def _row_run(v: object) -> range:
    """A finding's row run [first, end, step]: rows first, first + step, ... < end."""
    r = _ints(v, 0)
    if len(r) != 3 or r[2] == 0:
        raise _Bad(f"expected [first row, end, step] with a step, got {_show(v)}")
    return range(*r)


def _steps(v: object) -> tuple[int, int, int]:
    """A run's [c0, d, e]: first row (not negative), member step, entry step."""
    r = _ints(v)
    if len(r) != 3 or r[0] < 0:
        raise _Bad(f"expected [first row, member step, entry step], got {_show(v)}")
    return r[0], r[1], r[2]


def _token(v: object) -> tuple[int, tuple[int, ...]]:
    t = _obj(v)
    return _field(t, "pos", _int), _field(t, "seq", lambda s: _ints(s, 0))


def _cost(v: object) -> tuple[tuple[str, int], ...]:
    d = _obj(v)
    for k in COST_KEYS:
        _field(d, k, _nat)
    out = []
    for k, n in d.items():
        try:
            out.append((_str(k), _nat(n)))
        except _Bad as e:
            e.where.append(_key(k))
            raise
    return tuple(sorted(out))


def _status(v: object) -> str:
    s = _str(v)
    if s in OP_STATUSES:
        return s
    raise _Bad(f"expected one of {', '.join(OP_STATUSES)}, got {_show(s)}")


def _sha256(v: object) -> str:
    s = _str(v)
    if _SHA256.fullmatch(s):
        return s
    raise _Bad(f"not a sha256 (64 lowercase hex digits): {_show(s)}")


def _config(v: object) -> tuple[tuple[str, object], ...]:
    """The v1 cache config (`report.format.CONFIG`), in its order; a field added after
    v1's first release may be absent (its default then: the trace's); keys added
    later are ignored."""
    d = _obj(v)
    out: list[tuple[str, object]] = []
    for f in CONFIG.fields:
        if f.schema.get("type") == "boolean":
            conv: Callable[[Any], Any] = _bool
        else:
            conv = functools.partial(_int, lo=f.schema["minimum"])
        if not f.required and f.name not in d:
            out.append((f.name, CACHE[f.name].default))
        else:
            out.append((f.name, _field(d, f.name, conv)))
    return tuple(out)


def _stopped(doc: dict) -> None:
    """Refuse the report of a replay that stopped on an invalid trace."""
    problems = doc.get("problems")
    summary = doc.get("summary")
    status = summary.get("status") if isinstance(summary, dict) else None
    if not problems and status != "invalid":
        return
    first = ""
    if isinstance(problems, list) and problems and isinstance(problems[0], dict):
        msg = problems[0].get("message")
        if isinstance(msg, str):
            first = f" ({_clip(msg, 120)})"
    raise _Bad("the replay stopped: the trace turned out invalid mid-replay"
               f"{first}, so the report is not a whole run and cannot be compared",
               ".problems" if problems else ".summary.status")


def from_report(doc: object, file: str, root: str = "report") -> RunSummary:
    """A summary of one parsed report object. Raises ReportError naming `file` and the
    JSON path of the first field that is wrong (`root` is its path in the file)."""
    if not isinstance(doc, dict):
        raise ReportError(f"{file}: {root}: not a kpool report (expected an object, got "
                          f"{_show(doc)})")
    version = doc.get("kpool_report", _MISSING)
    if version is _MISSING:
        if "kpool_trace" in doc:
            raise ReportError(
                f"{file}: {root}: a trace, not a report: a trace in JSON syntax must be "
                "named .yaml or .yml, or be given with other traces")
        raise ReportError(f"{file}: {root}: not a kpool report (no \"kpool_report\": 1)")
    if type(version) is not int or version != REPORT_VERSION:
        writer = ""
        tool = doc.get("tool")
        if isinstance(tool, dict) and isinstance(tool.get("version"), str):
            writer = f", written by kpool {_clip(visible(tool['version']))}"
        raise ReportError(f"{file}: {root}.kpool_report: report format {_show(version)}"
                          f"{writer}: this kpool ({__version__}) reads format {REPORT_VERSION}")
    reader = _Reader()
    try:
        return reader.run(doc)
    except _Bad as e:
        path = root + "".join(reversed(e.where))
        raise ReportError(f"{file}: {path}: {visible(e.problem)}") from None
