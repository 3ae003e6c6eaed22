"""The JSON report of TRACE_FORMAT.md ("Report"), written as the replay streams.

Owns: the mapping from records to report fields (their names and order are
declared in `report.format`: a public contract, add, never rename), the run form
that keeps a ubatch's listing short (pools, scatter entries, finding pools and
rows; docs/FORMATS.md, "Runs"; which pools and entries form runs is
contracts/runs.py's rule; the diff's reader expands them), and `write_report`,
which streams ubatches as they come and holds only events and expectations (a few
per op) until the end.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from itertools import chain, islice
from types import ModuleType
from typing import TextIO, TypeVar

import numpy as np
import orjson

from .. import __version__, signals
from ..arrays import SameArrays, ranges
from ..contracts.finding import Finding, PoolIds
from ..contracts.records import ExpectResult, OpEvent, Pools, UbatchRecord
from ..contracts.report_format import (
    CONFIG,
    COST,
    EVENT,
    EXPECTATION,
    FINDING,
    FINDING_TOKEN,
    POOL,
    POOL_RUN,
    PROBLEM,
    REPORT,
    REPORT_VERSION,
    SCATTER,
    SCATTER_RUN,
    TOKEN,
    TOOL,
    TRACE,
    UBATCH,
    Record,
)
from ..contracts.runs import NO_SPANS, pool_spans, run_cells, scatter_spans
from ..contracts.tally import Tally
from ..signals import held
from ..trace.load import TraceError
from ..trace.model import Trace
from ..wording import unicode_path
from .json_text import ORJSON, as_json_writes, dumps


def finding_json(f: Finding) -> dict:
    """A finding. Its pools [seq, k] are written as [seq, k0, k1] where k0..k1-1 of one
    sequence follow each other, and its rows partly as `row_runs` (rows_json)."""
    rows, row_runs = _rows_json(f.rows.array)
    more: dict = {}
    if row_runs:
        more["row_runs"] = row_runs
    if f.tokens:
        more["tokens"] = [FINDING_TOKEN.make(pos=p, seq=s) for p, s in f.tokens]
    if f.pools:
        more["pools"] = pool_ids_json(f.pools)
    if f.evidence:
        more["evidence"] = f.evidence
    return FINDING.make(code=f.code, name=f.name, severity=f.severity, message=f.message,
                        rows=rows, seqs=list(f.seqs), **more)


ROW_RUN_MIN = 8  # rows evenly spaced, at least this many, are written as a run


def rows_json(rows: np.ndarray) -> tuple[list[int], list[list[int]]]:
    """(rows, row_runs): the stretches of at least ROW_RUN_MIN evenly spaced rows,
    written as [first, end, step] (first, first + step, ... < end) in row_runs, and
    the other rows listed. Stretches are taken left to right; a row two stretches
    share goes to the first one taken."""
    a = np.asarray(rows, dtype=np.int64)  # the finding's RowIds array, or any ints
    if a.size < ROW_RUN_MIN:
        return a.tolist(), []
    step = np.diff(a)
    cut = np.flatnonzero(step[1:] != step[:-1]) + 1  # pair index where the step changes
    alone = np.ones(a.size, dtype=bool)
    out: list[list[int]] = []
    free = 0  # the first row no stretch has taken
    for lo, hi in zip([0, *cut.tolist()], [*cut.tolist(), step.size], strict=True):
        first, last = max(lo, free), hi  # rows first..last of pairs lo..hi-1
        if last - first + 1 >= ROW_RUN_MIN:
            alone[first:last + 1] = False
            out.append([int(a[first]), int(a[last] + step[lo]), int(step[lo])])
            free = last + 1
    return a[alone].tolist(), out


def pool_ids_json(pools: PoolIds) -> list[list[int]]:
    """(seq, k) pairs, consecutive k of one sequence folded into [seq, k0, k1]."""
    return _pool_ids_json(pools.array)


def _pool_pairs_json(a: np.ndarray) -> list[list[int]]:
    """`pool_ids_json` of a PoolIds' [n, 2] array: each maximal stretch of two or more
    pools of one sequence with consecutive k is one [seq, k0, k1], found from where
    the pairs break (so a run costs one list, not a pass of its own)."""
    seq, k = a[:, 0], a[:, 1]
    cut = np.flatnonzero((seq[1:] != seq[:-1]) | (k[1:] != k[:-1] + 1)) + 1
    lo, hi = np.concatenate(([0], cut)), np.concatenate((cut, [len(a)]))
    long = np.flatnonzero(hi - lo >= 2)
    out: list[list[int]] = []
    at = 0
    for first, end in zip(lo[long].tolist(), hi[long].tolist(), strict=True):
        out += a[at:first].tolist()
        out.append([int(a[first, 0]), int(a[first, 1]), int(a[end - 1, 1]) + 1])
        at = end
    return out + a[at:].tolist()


# A finding a re-pool-all ubatch finds again while its plan stands (KP001's race)
# holds the same row and pool arrays: written once, its lists are shared (never written)
_rows_json = SameArrays(rows_json)
_pool_ids_json = SameArrays(_pool_pairs_json)


def event_json(e: OpEvent) -> dict:
    more: dict = {}
    if e.message:
        more["message"] = e.message
    if e.findings:
        more["findings"] = [finding_json(f) for f in e.findings]
    return EVENT.make(op=e.op, kind=e.kind, status=e.status,
                      stale={str(s): p for s, p in e.stale.items()}, **more)


def _pools_alone(p: Pools, at: np.ndarray | slice | None = None) -> list[dict]:
    """The pools `at` of the listing (None: every one), one object each."""
    if at is not None:
        p = Pools(p.seq[at], p.k[at], p.first_pos[at], p.last_pos[at], p.cells[at],
                  p.rep[at], p.new[at])
    seq_, k_, first_, last_, cells_, rep_, new_ = POOL.names  # a pool each: no make() each
    return [{seq_: s, k_: k, first_: f, last_: la, cells_: c, rep_: r, new_: w}
            for s, k, f, la, c, r, w in zip(
                p.seq.tolist(), p.k.tolist(), p.first_pos.tolist(), p.last_pos.tolist(),
                p.cells.tolist(), p.rep.tolist(), p.new.tolist(), strict=True)]


def pools_json(p: Pools, kpool: int, spans: np.ndarray | None = None) -> list[dict]:
    """The listed pools, in order (kpool 0: no runs). A run of pools (contracts/runs.py
    `pool_spans`; `spans`, when the core found them) is written as one
    {"seq", "k": [k0, k1], "first_pos": p0, "cells": [c0, d, e], "new"}."""
    n = len(p)
    if n < 2 or not kpool:  # no run can form: every pool alone
        return _pools_alone(p)
    spans = pool_spans(p) if spans is None else spans
    if not spans.size:  # no run formed
        return _pools_alone(p)
    return _with_singles(_pool_runs(p, spans), spans, n, lambda idx: _pools_alone(p, idx))


def _pool_runs(p: Pools, spans: np.ndarray) -> list[dict]:
    """The runs `spans` of the listing `p`, one object each, each run's fields read a
    column at a time (W2's changed plans list 128 runs)."""
    first = spans[:, 0]
    seq_, k_, first_, cells_, new_ = POOL_RUN.names  # a run each: no make() each
    return [{seq_: s, k_: [k0, k1 + 1], first_: p0, cells_: cells, new_: new}
            for s, k0, k1, p0, cells, new in zip(
                p.seq[first].tolist(), p.k[first].tolist(), p.k[spans[:, 1] - 1].tolist(),
                p.first_pos[first].tolist(), run_cells(p.cells, first),
                p.new[first].tolist(), strict=True)]


def _with_singles(runs: list[dict], spans: np.ndarray, n: int,
                  singles: Callable[[np.ndarray | slice], list[dict]]) -> list[dict]:
    """A listing of `n` items in order: its `runs` (over `spans`, contracts/runs.py)
    and, before, between and after them, the items no run holds, `singles` of their
    indices (ascending) made in one call. A listing of every pool is a few runs over
    tens of thousands of pools, often end to end (no single: the runs themselves) or
    with a plan's padding past them (the runs and the entries past them)."""
    ends = np.concatenate(([0], spans.ravel(), [n])).reshape(-1, 2)
    gap = ends[:, 1] - ends[:, 0]
    if not gap[:-1].any():
        return runs + singles(slice(int(ends[-1, 0]), n)) if gap[-1] else runs
    alone = iter(singles(ranges(ends[:, 0], gap)))
    out: list[dict] = []
    for g, run in zip(gap.tolist(), [*runs, None], strict=True):
        out += islice(alone, g)
        if run is not None:
            out.append(run)
    return out


def scatter_json(r: UbatchRecord, kpool: int) -> list[dict]:
    """The scatter entries, in order (kpool 0: no runs). A run of n entries
    (contracts/runs.py `scatter_spans`; the record's, when the core found them) is
    written as one {"n": n, "cells": [c0, d, e], "pad": false}."""
    rows, rep, pad = r.scatter_rows, r.scatter_rep, r.scatter_pad
    n = int(rep.size)

    singles = partial(_entries_alone, r)
    if n < 2 or not kpool:  # no run can form: every entry alone
        return singles()
    found = scatter_spans(rows, rep, pad) if r.scatter_spans is None else r.scatter_spans
    if not found.size:  # no run formed (a decode step's few entries)
        return singles()
    return _with_singles(_entry_runs(rows, found), found, n, singles)


def _entries_alone(r: UbatchRecord, at: np.ndarray | slice | None = None) -> list[dict]:
    """The scatter entries `at` of the record (None: every one), one object each."""
    rows, rep, pad = r.scatter_rows, r.scatter_rep, r.scatter_pad
    rep_, cells_, pad_ = SCATTER.names  # an entry each: no make() each
    reps, members, pads = (rep, rows, pad) if at is None else (rep[at], rows[at], pad[at])
    return [{rep_: w, cells_: c, pad_: d} for w, c, d in zip(
        reps.tolist(), members.tolist(), pads.tolist(), strict=True)]


def _entry_runs(rows: np.ndarray, spans: np.ndarray) -> list[dict]:
    """The runs `spans` of the scatter entries of `rows`, one object each."""
    n_, cells_, pad_ = SCATTER_RUN.names  # a run each: no make() each
    return [{n_: m, cells_: cells, pad_: False} for m, cells in zip(
        (spans[:, 1] - spans[:, 0]).tolist(), run_cells(rows, spans[:, 0]), strict=True)]


def _pieces_text(n: int, spans: np.ndarray, runs: Callable[[np.ndarray], list[dict]],
                 singles: Callable[[slice], list[dict]]) -> orjson.Fragment:
    """The text orjson writes of a listing of `n` items whose runs are `spans`
    (`_with_singles`'s list: the items no run holds before, between and after the
    runs), made `PIECE` objects at a time and encoded piece by piece: `runs(spans')`
    the objects of some of the runs, `singles(at)` those of the items at `at`. So a
    long listing written without the listing kernel holds its text and one piece, not
    an object per item: its memory is the budget's (backend/budget.py
    `POOL_INFO_BYTES` a listed pool), whatever the listing's length."""
    texts: list[bytes] = []
    piece: list[dict] = []
    gap_start = np.concatenate(([0], spans[:, 1])).tolist()  # the items after each run
    gap_stop = np.concatenate((spans[:, 0], [n])).tolist()
    made: list[dict] = []
    for g, (lo, hi) in enumerate(zip(gap_start, gap_stop, strict=True)):
        for a in range(lo, hi, PIECE):
            piece += singles(slice(a, min(hi, a + PIECE)))
            if len(piece) >= PIECE:
                texts.append(orjson.dumps(piece, option=ORJSON)[1:-1])
                piece = []
        if g < len(spans):
            if g % PIECE == 0:  # the next PIECE runs' objects, a column at a time
                made = runs(spans[g:g + PIECE])
            piece.append(made[g % PIECE])
            if len(piece) >= PIECE:
                texts.append(orjson.dumps(piece, option=ORJSON)[1:-1])
                piece = []
    if piece:
        texts.append(orjson.dumps(piece, option=ORJSON)[1:-1])
    return orjson.Fragment(b"[" + b",".join(texts) + b"]")


# a listing of more than this many items is written in pieces of this many objects
# when no listing kernel writes it (`_pieces_text`)
PIECE = 4096


# A plan that stands (engine/scatter.py) lists the last one's pools and entries, in
# the same arrays with the same spans (replay.py `_from_plan`): written once, the
# lists are shared (never written). Kept only in run form with the core's spans.
_POOLS_JSON: SameArrays[list[dict]] = SameArrays(
    lambda *_kept_by, p, kpool, spans: pools_json(p, kpool, spans))
_SCATTER_JSON: SameArrays[list[dict]] = SameArrays(
    lambda *_kept_by, r, kpool: scatter_json(r, kpool))
# a listing of at most this many items is written again, not looked up (a decode's
# pool or two: comparing its arrays costs what writing them does)
_FEW_LISTED = 4
# a listing of more than this many items is written by the listing kernel, once a
# replay has loaded numba (`EncodedTexts.listings`): a call's arguments cost about 14
# us in a replay, what orjson takes of 10-16 objects made in Python (a server
# session's decode steps: 5-8 pools, 16 entries)
_KERNEL_LISTED = 16


def _listed_json(r: UbatchRecord, kpool: int) -> list[dict]:
    """`pools_json` of the record's listing (a few pools: written, not looked up)."""
    p, spans = r.pools, r.pool_spans
    if not kpool or spans is None or len(p) <= _FEW_LISTED:
        return pools_json(p, kpool, spans)
    return _POOLS_JSON(p.seq, p.k, p.first_pos, p.last_pos, p.cells, p.rep, p.new, spans,
                       p=p, kpool=kpool, spans=spans)


def _entries_json(r: UbatchRecord, kpool: int) -> list[dict]:
    """`scatter_json` of the record (a few entries: written, not looked up)."""
    if not kpool or r.scatter_spans is None or r.scatter_rep.size <= _FEW_LISTED:
        return scatter_json(r, kpool)
    return _SCATTER_JSON(r.scatter_rows, r.scatter_rep, r.scatter_pad, r.scatter_spans, r=r,
                         kpool=kpool)


def tokens_json(r: UbatchRecord) -> list[dict]:
    """The record's tokens, one object each."""
    pos_, seq_, cell_, ext_ = TOKEN.names  # many tokens a ubatch: no make() each
    tokens = [{pos_: p, seq_: list(ss), cell_: row} for p, ss, row in zip(
        r.token_pos.tolist(), r.token_seqs, r.token_rows.tolist(), strict=True)]
    if r.token_ext is not None:
        for t, ext in zip(tokens, r.token_ext.tolist(), strict=True):
            t[ext_] = ext
    return tokens


def listings_json(r: UbatchRecord, kpool: int) -> tuple[list[dict], list[dict], list[dict]]:
    """The record's three lists: its tokens, its pools and its scatter entries (kpool
    0: no runs)."""
    return tokens_json(r), _listed_json(r, kpool), _entries_json(r, kpool)


def ubatch_json(r: UbatchRecord, run_form: bool = True,
                finding: Callable[[Finding], object] = finding_json,
                listings: Callable[[UbatchRecord, int], tuple[object, object, object]]
                = listings_json) -> dict:
    """A ubatch. `run_form`: pools and scatter entries that follow each other are
    written as runs (pools_json, scatter_json); without it, one object each (what
    `--pools all` asks for: the full listing). `finding`: each finding's value
    (`finding_json`, or its text already encoded: `EncodedTexts`); `listings`: the
    values of the tokens, the pools and the scatter entries (`listings_json`, or
    their texts already encoded: `EncodedTexts.listings`)."""
    kpool = int(r.scatter_rows.shape[1]) if run_form else 0
    tokens, pools, scatter = listings(r, kpool)
    return UBATCH.make(
        index=r.index, op=r.op, batch_ubatch=r.batch_ubatch, tokens=tokens,
        stale_batch={str(s): p for s, p in r.stale_batch.items()},
        n_pool_real=r.n_pool_real, n_new=r.n_new, n_new_g=r.n_new_g,
        pools=pools, scatter=scatter,
        cost=COST.make(**r.cost), findings=[finding(f) for f in r.findings],
    )


class EncodedTexts:
    """JSON texts (what orjson writes, as orjson `Fragment`s, which `ubatch_text`
    places as they are) encoded once while the replay hands on the very same value:
    each finding's (`__call__`: `finding_json(f)`), while the rules hand on the same
    (frozen) `Finding` (a race that stands, re-found each ubatch: W4 cache-safe's
    KP001, 4.5 KB of each 5 KB ubatch), and each listing's of more than
    `_FEW_LISTED` items (`listing`), while a plan stands and `_listed_json` and
    `_entries_json` hand on their lists (cache-safe's listing of every pool as runs:
    about half of W2's standing ubatch's encoding). Holds the last `KEEP` findings
    and the last two listings met, with their values (so an id stays its own). A
    long list written by a listing kernel (`listings`) is kept apart, by the arrays
    it was written from (`_POOLS_TEXT`, `_SCATTER_TEXT`)."""

    KEEP = 16

    def __init__(self) -> None:
        self._texts: dict[int, tuple[Finding, orjson.Fragment]] = {}
        self._lists: dict[int, tuple[list[dict], orjson.Fragment]] = {}

    def __call__(self, f: Finding) -> orjson.Fragment:
        got = self._texts.get(id(f))
        if got is not None:
            return got[1]
        if len(self._texts) >= self.KEEP:
            self._texts.clear()
        self._texts[id(f)] = (f, text := _fragment(finding_json(f)))
        return text

    def listings(self, r: UbatchRecord, kpool: int) -> tuple[object, object, object]:
        """The record's three lists, tokens, pools and scatter entries, as
        `listings_json` gives them or as their texts. Once a replay has loaded numba,
        a list of more than `_KERNEL_LISTED` items is written by a listing kernel
        from the record's columns (`tokens_text`, `pools_text`, `scatter_text`; a
        listing's last text again while a plan stands and hands on its arrays and
        spans, as `_listed_json` keeps its lists); before, a listing of more than
        `PIECE` pools or entries is written by the same functions a piece at a time
        (`_pieces_text`: never an object per item at once, nor kept). Any shorter
        listing is `listing` of its list (its text past `_FEW_LISTED` items); shorter
        tokens, their list."""
        kernels = _listing_kernels()
        # without the kernels, a listing longer than a piece is written in pieces
        few = _KERNEL_LISTED if kernels is not None else PIECE
        tokens = (tokens_text(kernels, r) if kernels is not None
                  and r.token_pos.size > _KERNEL_LISTED else tokens_json(r))
        p, spans = r.pools, r.pool_spans
        pools: object
        if len(p) <= few:
            pools = self.listing(_listed_json(r, kpool))
        elif not kpool or spans is None:
            pools = pools_text(kernels, p, kpool, spans)
        else:
            pools = _POOLS_TEXT(p.seq, p.k, p.first_pos, p.last_pos, p.cells, p.rep, p.new,
                                spans, p=p, kpool=kpool, spans=spans, kernels=kernels)
        entries: object
        if r.scatter_rep.size <= few:
            entries = self.listing(_entries_json(r, kpool))
        elif not kpool or r.scatter_spans is None:
            entries = scatter_text(kernels, r, kpool)
        else:
            entries = _SCATTER_TEXT(r.scatter_rows, r.scatter_rep, r.scatter_pad,
                                    r.scatter_spans, r=r, kpool=kpool, kernels=kernels)
        return tokens, pools, entries

    def listing(self, items: list[dict]) -> list[dict] | orjson.Fragment:
        """`items`, or its text once it is long enough to be handed on (a few pools or
        entries are made anew each ubatch: encoding them apart would only cost)."""
        if len(items) <= _FEW_LISTED:
            return items
        got = self._lists.get(id(items))
        if got is not None:
            return got[1]
        if len(self._lists) >= 2:  # a plan's two listings: the last ones alone
            self._lists.clear()
        self._lists[id(items)] = (items, text := _fragment(items))
        return text


# -- a listing's text from its columns (the listing kernel) -------------------------------


def _listing_kernels() -> ModuleType | None:
    """The listing kernel's module (json_kernels.py) once a replay has loaded numba
    (`kpool_cli.jit`, which the compiled core's and the numba backend's kernels
    import), else None: a replay that runs no kernel writes its listings in Python
    rather than pay numba's import for them. The texts are the same either way."""
    global _kernels
    if _kernels is None and "kpool_cli.jit" in sys.modules:
        # the import waits for a module another thread is importing: set whole
        from . import json_kernels
        _kernels = json_kernels
    return _kernels


_kernels: ModuleType | None = None  # json_kernels once imported: no import a ubatch


def _key_texts(*records: tuple[Record, tuple[str, ...]]) -> tuple[np.ndarray, np.ndarray]:
    """The keys' texts of `records` one after the other (each field's `{` or `,`, its
    name, its `:`), as the listing kernels read them, and where each begins (one
    more than there are keys). Each record's names must be the order its kernel
    gathers their values in (json_kernels.py)."""
    texts = []
    for record, gathered in records:
        assert record.names == gathered, (record.name, record.names)
        texts += [(b"," if i else b"{") + orjson.dumps(name) + b":"
                  for i, name in enumerate(gathered)]
    at = np.cumsum([0, *map(len, texts)], dtype=np.int64)
    return np.frombuffer(b"".join(texts), dtype=np.uint8), at


_POOL_KEYS = _key_texts(
    (POOL, ("seq", "k", "first_pos", "last_pos", "cells", "rep", "new")),
    (POOL_RUN, ("seq", "k", "first_pos", "cells", "new")))
_SCATTER_KEYS = _key_texts((SCATTER, ("rep", "cells", "pad")),
                           (SCATTER_RUN, ("n", "cells", "pad")))
_TOKEN_KEYS = _key_texts((TOKEN, ("pos", "seq", "cell", "ext")))
_INT_TEXT = len(str(-(1 << 63)))  # the longest int64's text


def _widths(kernels: ModuleType, record: Record, members: int) -> np.ndarray:
    """Each field's width as the listing kernels read it (json_kernels.py: INT, BOOL,
    LISTED or a list's length), from its schema: an integer, a boolean (or a
    constant one), or an array of `maxItems` integers, else of `members` (a pool's
    rows; LISTED: as many as each object has, a token's sequences). Worked out once
    a record and a width."""
    got = _WIDTHS.get((record.name, members))
    if got is None:
        widths = []
        for f in record.fields:
            kind = f.schema.get("type")
            if kind == "array":
                widths.append(int(f.schema.get("maxItems", members)))
            else:
                assert kind in ("integer", "boolean") or isinstance(
                    f.schema.get("const"), bool), (record.name, f.name)
                widths.append(kernels.INT if kind == "integer" else kernels.BOOL)
        got = _WIDTHS[(record.name, members)] = np.array(widths, dtype=np.int64)
    return got


_WIDTHS: dict[tuple[str, int], np.ndarray] = {}


def _object_most(kernels: ModuleType, keys: tuple[np.ndarray, np.ndarray], first: int,
                 widths: np.ndarray, listed: int = 0) -> int:
    """The longest text of an object whose keys are the texts first.. of `keys` and
    whose fields have `widths` (`_widths`): its keys, each integer at its longest, a
    boolean's `false`, a list's brackets and commas (a LISTED list of `listed`
    items at most) and its closing brace."""
    at = keys[1]
    most = int(at[first + widths.size] - at[first]) + 1
    for w in widths.tolist():
        if w == kernels.INT:
            most += _INT_TEXT
        elif w == kernels.BOOL:
            most += len("false")
        else:
            most += 2 + (listed if w == kernels.LISTED else w) * (_INT_TEXT + 1)
    return most


def _listing_fields(kernels: ModuleType, single: Record, run: Record,
                    keys: tuple[np.ndarray, np.ndarray], members: int
                    ) -> tuple[np.ndarray, np.ndarray, int]:
    """A listing's fields as its kernel reads them, for items of `members` rows: the
    widths of an item alone (`single`) and of a run (`run`, whose keys follow the
    item's in `keys`), and the longest object's text of either. Worked out once a
    listing and a width."""
    got = _FIELDS.get((single.name, members))
    if got is None:
        one, many = _widths(kernels, single, members), _widths(kernels, run, members)
        got = _FIELDS[(single.name, members)] = (one, many, max(
            _object_most(kernels, keys, 0, one), _object_most(kernels, keys, one.size, many)))
    return got


_FIELDS: dict[tuple[str, int], tuple[np.ndarray, np.ndarray, int]] = {}


def _listing_out(n: int, spans: np.ndarray, most: int) -> np.ndarray:
    """The buffer of a listing of `n` items whose runs are `spans`, each object's text
    at most `most` long: its objects (a run, or an item no run holds), their commas,
    its brackets. The kernel checks each object's room, so spans that are not runs
    of the listing cannot make it write past the end."""
    n_objects = n - int((spans[:, 1] - spans[:, 0]).sum()) + len(spans) if spans.size else n
    return np.empty(2 + n_objects * (most + 1), dtype=np.uint8)


def _text(out: np.ndarray, end: int, what: str) -> orjson.Fragment:
    """The kernel's text, `out[:end]`; `end` -1: it refused (`json_kernels`'
    invariants), a defect of kpool's, not of the trace."""
    if end < 0:
        raise ValueError(f"the listing kernel refused the {what}: its spans are not runs of "
                         "it, or its buffer is short (a kpool defect)")
    return orjson.Fragment(out[:end].tobytes())


def _ints(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.int64)


def pools_text(kernels: ModuleType | None, p: Pools, kpool: int, spans: np.ndarray | None
               ) -> orjson.Fragment:
    """`pools_json(p, kpool, spans)`'s text, written by the listing kernel (`kernels`
    None: in pieces, `_pieces_text`)."""
    n, members = p.cells.shape
    if n < 2 or not kpool:
        spans = NO_SPANS
    elif spans is None:
        spans = pool_spans(p)
    if kernels is None:
        return _pieces_text(n, spans, lambda some: _pool_runs(p, some),
                            lambda at: _pools_alone(p, at))
    single, run, most = _listing_fields(kernels, POOL, POOL_RUN, _POOL_KEYS, members)
    out = _listing_out(n, spans, most)
    end = kernels.pools_listing(
        out, *_POOL_KEYS, single, run, np.empty(members + 8, dtype=np.int64), _ints(p.seq),
        _ints(p.k), _ints(p.first_pos), _ints(p.last_pos), _ints(p.cells), _ints(p.rep),
        np.ascontiguousarray(p.new, dtype=bool), _ints(spans), most)
    return _text(out, end, "pools")


def scatter_text(kernels: ModuleType | None, r: UbatchRecord, kpool: int) -> orjson.Fragment:
    """`scatter_json(r, kpool)`'s text, written by the listing kernel (`kernels` None:
    in pieces, `_pieces_text`)."""
    rows, rep, pad = r.scatter_rows, r.scatter_rep, r.scatter_pad
    n, members = rows.shape
    if n < 2 or not kpool:
        spans = NO_SPANS
    else:
        spans = scatter_spans(rows, rep, pad) if r.scatter_spans is None else r.scatter_spans
    if kernels is None:
        return _pieces_text(n, spans, lambda some: _entry_runs(rows, some),
                            lambda at: _entries_alone(r, at))
    single, run, most = _listing_fields(kernels, SCATTER, SCATTER_RUN, _SCATTER_KEYS,
                                        members)
    out = _listing_out(n, spans, most)
    end = kernels.scatter_listing(
        out, *_SCATTER_KEYS, single, run, np.empty(members + 4, dtype=np.int64), _ints(rep),
        _ints(rows), np.ascontiguousarray(pad, dtype=bool), _ints(spans), most)
    return _text(out, end, "scatter entries")


def tokens_text(kernels: ModuleType, r: UbatchRecord) -> orjson.Fragment:
    """`tokens_json(r)`'s text, written by the listing kernel."""
    n = r.token_pos.size
    lens = np.fromiter(map(len, r.token_seqs), dtype=np.int64, count=n)
    seq_at = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lens, out=seq_at[1:])
    seqs = np.fromiter(chain.from_iterable(r.token_seqs), dtype=np.int64, count=int(seq_at[-1]))
    most_seqs = int(lens.max()) if n else 0
    widths = _widths(kernels, TOKEN, kernels.LISTED)
    ext = r.token_ext
    if ext is None:  # no M-RoPE: no ext field
        widths, ext = widths[:len(TOKEN.fields) - 1], _NO_EXT
    most = _object_most(kernels, _TOKEN_KEYS, 0, widths, most_seqs)
    out = _listing_out(n, NO_SPANS, most)
    # values: pos, the count and the sequences, cell, ext's two
    end = kernels.tokens_listing(out, *_TOKEN_KEYS, widths, np.empty(most_seqs + 5, np.int64),
                                 _ints(r.token_pos), seq_at, seqs, _ints(r.token_rows),
                                 _ints(ext), most)
    return _text(out, end, "tokens")


_NO_EXT = np.empty((0, 2), dtype=np.int64)


# a plan that stands hands on the last listing's arrays: its texts are the last ones
_POOLS_TEXT: SameArrays[orjson.Fragment] = SameArrays(
    lambda *_kept_by, p, kpool, spans, kernels: pools_text(kernels, p, kpool, spans))
_SCATTER_TEXT: SameArrays[orjson.Fragment] = SameArrays(
    lambda *_kept_by, r, kpool, kernels: scatter_text(kernels, r, kpool))


def _fragment(value: object) -> orjson.Fragment:
    """orjson's text of `value`, to be placed as it is. Not ASCII, the ubatch's text is
    not either: `ubatch_text` then writes it the other way; orjson refusing it
    (JSONEncodeError) does the same."""
    return orjson.Fragment(orjson.dumps(value, option=ORJSON))


def ubatch_text(r: UbatchRecord, run_form: bool, texts: EncodedTexts) -> str:
    """`dumps(ubatch_json(r, run_form))`, with the findings' and the listings' texts
    from `texts` (the same bytes: orjson writes a nested value as it writes it
    alone)."""
    try:
        text = as_json_writes(
            orjson.dumps(ubatch_json(r, run_form, texts, texts.listings), option=ORJSON))
        if text is not None:
            return text
    except orjson.JSONEncodeError:
        pass
    return dumps(ubatch_json(r, run_form))  # as dumps writes what orjson does not


def report_header(trace: Trace, engine: str, backend: str | None) -> dict:
    """The report's fields before `ubatches`: what was replayed, how."""
    return REPORT.make(
        kpool_report=REPORT_VERSION,
        tool=TOOL.make(name="kpool", version=__version__),
        trace=TRACE.make(path=unicode_path(trace.path), name=trace.name,
                         sha256=trace.sha256),
        engine=engine,
        backend=backend,
        config=CONFIG.make(**trace.cache.as_dict()),
    )


def write_report(out: TextIO, trace: Trace, engine: str, backend: str | None,
                 records: Iterable[OpEvent | UbatchRecord | ExpectResult], tally: Tally,
                 indent: str = "", run_form: bool = True, lead: str = "") -> None:
    """Stream one report to `out` from `records`, the stream `tally.tallied` feeds
    `tally` from (read here for `problems` and `summary`, never added to). A trace
    that turns out invalid mid-replay (TraceError, recorded in `tally` by `tallied`)
    ends the report there, with its `problems` and `summary.status` "invalid"; a
    signal met while replaying (KeyboardInterrupt: Ctrl-C, and the CLI's SIGTERM)
    ends it with status "interrupted", and is raised on once the document is whole."""
    head = report_header(trace, engine, backend)
    signals.unsettle()  # a signal kept since the last report's summary ends the output here
    out.write(lead + "{\n")  # lead: the array's separator, in the same write
    for key, value in head.items():
        out.write(f'{indent}  {dumps(key)}: {dumps(value)},\n')
    out.write(f'{indent}  "ubatches": [')
    events, expects = [], []
    first = True
    signal_met: KeyboardInterrupt | None = None
    texts = EncodedTexts()

    def take(rec: OpEvent | UbatchRecord | ExpectResult) -> None:
        nonlocal first
        if isinstance(rec, UbatchRecord):
            out.write(("\n" if first else ",\n") + f"{indent}    "
                      + ubatch_text(rec, run_form, texts))
            first = False
        elif isinstance(rec, OpEvent):
            events.append(event_json(rec))
        else:
            expects.append(EXPECTATION.make(op=rec.op, ok=rec.ok, message=rec.message))

    it = iter(records)
    try:
        while True:
            # a record is replayed, counted (tally) and written with Ctrl-C and SIGTERM
            # held, so a signal lands between records: the summary counts what was written
            with held():
                rec = next(it, None)
                if rec is None:
                    break
                take(rec)
    except TraceError:  # invalid at this point: the document still closes, saying why
        assert tally.problems, "records not fed through tally.tallied"
    except KeyboardInterrupt as e:  # Ctrl-C or SIGTERM: the document closes, saying so
        tally.interrupted, signal_met = True, e
    with held():  # the document's end is written whole, whatever signal comes
        if signals.pending():  # one came since the last record: the status says so
            tally.interrupted = True
        _close(out, indent, first, events, expects, tally)
        if not tally.interrupted:
            signals.settle()  # the status is written: a later signal cannot change it
    if signal_met is not None:
        raise signal_met  # write_reports closes the array; the CLI exits as the signal says


def _close(out: TextIO, indent: str, first: bool, events: list, expects: list,
           tally: Tally) -> None:
    out.write(("" if first else f"\n{indent}  ") + "],\n")
    for key, value in (("events", events), ("expectations", expects)):
        out.write(f"{indent}  {dumps(key)}: [")
        out.write(",".join(f"\n{indent}    " + dumps(v) for v in value))
        out.write(("" if not value else f"\n{indent}  ") + "],\n")
    if tally.problems:
        problems = [PROBLEM.make(file=p.file, line=p.line, column=p.column, field=p.field,
                                 message=p.message) for p in tally.problems]
        out.write(f'{indent}  "problems": {dumps(problems)},\n')
    out.write(f'{indent}  "summary": {dumps(tally.summary())}\n{indent}}}')


# -- several traces: the framing of the output -------------------------------------------

R = TypeVar("R")  # one run of the replay, as the caller describes it


def write_reports(out: TextIO, runs: Sequence[R], write_one: Callable[[R, str], Tally]
                  ) -> list[Tally]:
    """The JSON output of a replay of `runs`: one report per run, written to `out` by
    `write_one(run, lead)` (which writes `lead`, the separator, with its first bytes,
    and returns the run's tally); one run gives the report alone,
    several a JSON array of them (`[`, `,` between reports, `]`). A run whose trace
    turns out invalid (its tally's `problems`) is the last: its report says why, the
    array closes after it, and no later run is written (nor replayed). Returns the
    tallies of the runs written, in order."""
    several = len(runs) > 1
    if several:
        out.write("[\n")
    tallies: list[Tally] = []
    try:
        for run in runs:
            # the separator goes out with the next report's first bytes (its `lead`)
            tallies.append(write_one(run, ",\n" if tallies else ""))
            if tallies[-1].problems:
                break
    except KeyboardInterrupt:  # a signal: the report written says so; the array closes
        out.write("\n]\n" if several else "\n")
        out.flush()
        raise
    out.write("\n]\n" if several else "\n")
    return tallies
