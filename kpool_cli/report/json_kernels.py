"""The JSON writer's kernels: a ubatch's list of tokens, pools or scatter entries
(docs/FORMATS.md "Runs" for the two listings) written from the record's columns in
one pass, without one Python object per item.

Owns: `pools_listing`, `scatter_listing` and `tokens_listing`, each the twin of the
JSON writer's Python way (json_report.py `pools_json`, `scatter_json`: the runs of
docs/FORMATS.md and, before, between and after them, the items no run holds;
`tokens_json`), and `_object`, which writes one object of any of them from its
fields' keys, widths and values. The keys' texts and the fields' widths are handed
in, derived from report_format.py's declaration (json_report.py `_key_texts`, which
holds the declared order of the fields to the one the kernels gather their values
in, and `_widths`).

Invariants: the text is what orjson writes of the Python way's lists (compact,
ASCII; tests/test_report_runs.py holds the two equal on random listings and
tokens), for values whose runs' steps and ends fit int64 (rows, positions and pool
indices do: the trace format bounds them far below). A kernel writes into `out`,
sized by its caller, only while the longest object (`most`, its caller's bound from
the fields' widths) still fits: else, and for spans that are not runs of the
listing (each [a, b) with b - a >= 2, ascending, within it), it returns -1 having
written nothing past `out`. It never allocates and never raises. Imported only once
a replay has loaded numba (json_report.py `_listing_kernels`). One `_object` serves
every object, so that a first run compiles one writer of integers, not one per
field (it took twice the time).
"""

from __future__ import annotations

from functools import partial

import numpy as np
from numba import types as nt

from ..jit import inner, kernel

BOOL = -1  # a field's width: a boolean (0 false, else true)
INT = 0  # a field's width: one integer; a width w > 0 is a list of w integers
LISTED = -2  # a field's width: a list whose length is its first value, its items next

# Each kernel's one signature: its input arrays read-only, which a writable array
# converts to as the call is dispatched (as fast as an exact match), so that a record's
# read-only array (the spans of no run, say) never compiles the kernel a second time.
_OUT = nt.Array(nt.uint8, 1, "C")
_SCRATCH = nt.Array(nt.int64, 1, "C")
_TEXT = nt.Array(nt.uint8, 1, "C", readonly=True)
_INTS = nt.Array(nt.int64, 1, "C", readonly=True)
_TABLE = nt.Array(nt.int64, 2, "C", readonly=True)
_FLAGS = nt.Array(nt.bool_, 1, "C", readonly=True)

_MINUS, _COMMA = 45, 44
_OPEN_LIST, _CLOSE_LIST, _CLOSE_OBJECT = 91, 93, 125
# unsigned, so that the digits' arithmetic stays in uint64 (numba takes a mix of
# signed and unsigned integers to float64)
_ZERO, _ONE, _TEN = np.uint64(48), np.uint64(1), np.uint64(10)
_TRUE = np.frombuffer(b"true", dtype=np.uint8)
_FALSE = np.frombuffer(b"false", dtype=np.uint8)


def _int(out, o, v):  # pragma: no cover - compiled
    """Writes int64 `v` in decimal at out[o:]; returns the end. The magnitude is
    taken unsigned: the int64 minimum has no positive twin."""
    if v < 0:
        out[o] = _MINUS
        o += 1
        m = np.uint64(-(v + 1)) + _ONE
    else:
        m = np.uint64(v)
    start = o
    while True:
        out[o] = m % _TEN + _ZERO
        o += 1
        m //= _TEN
        if m == 0:
            break
    end = o - 1
    while start < end:  # the digits were written lowest first
        out[start], out[end] = out[end], out[start]
        start += 1
        end -= 1
    return o


_int_in = inner(_int)


def _object(out, o, keys, key_at, first_key, widths, values):  # pragma: no cover
    """Writes one object after the last (its comma: none when `o` is 1, past the
    `[`): field f's key text (`keys[key_at[first_key + f]:key_at[first_key + f +
    1]]`, its `{` or `,` and its `:` included) and its value, read in `values` in
    turn: an integer (width INT), a boolean (BOOL: 0 false, else true), a list of
    `widths[f]` integers, or of as many as the first value says (LISTED). Returns
    the end."""
    if o > 1:
        out[o] = _COMMA
        o += 1
    c = 0
    for f in range(widths.size):
        for i in range(key_at[first_key + f], key_at[first_key + f + 1]):
            out[o] = keys[i]
            o += 1
        w = widths[f]
        if w == INT:
            o = _int_in(out, o, values[c])
            c += 1
        elif w == BOOL:
            word = _TRUE if values[c] != 0 else _FALSE
            for i in range(word.size):
                out[o] = word[i]
                o += 1
            c += 1
        else:
            if w == LISTED:
                w = values[c]
                c += 1
            out[o] = _OPEN_LIST
            o += 1
            for j in range(w):
                if j:
                    out[o] = _COMMA
                    o += 1
                o = _int_in(out, o, values[c + j])
            out[o] = _CLOSE_LIST
            o += 1
            c += w
    out[o] = _CLOSE_OBJECT
    return o + 1


_object_in = inner(_object)


def _steps(values, c, rows, a):  # pragma: no cover - compiled
    """values[c:c + 3] = [c0, d, e] of the run whose first entry is `a`
    (contracts/runs.py `run_cells`: member j of entry a + i on row c0 + i e + j d;
    d 1 where an entry has one member)."""
    c0 = rows[a, 0]
    values[c] = c0
    values[c + 1] = rows[a, 1] - c0 if rows.shape[1] > 1 else 1
    values[c + 2] = rows[a + 1, 0] - c0


_steps_in = inner(_steps)


def _run_at(out, o, most, spans, r, i, n):  # pragma: no cover - compiled
    """Before item i of a listing of n items whose next run is `spans[r]`: -1 when the
    longest object (`most`, its comma, the closing bracket) no longer fits `out`, or
    when that run starts at i but is not one of the listing's (two items at least,
    within it); the run's end when it starts at i; else 0 (item i alone)."""
    if o + most + 2 > out.size:
        return -1
    if r < spans.shape[0] and spans[r, 0] == i:
        b = spans[r, 1]
        return b if i + 2 <= b <= n else -1
    return 0


_run_at_in = inner(_run_at)


def _closed(out, o, spans, r):  # pragma: no cover - compiled
    """The listing's closing bracket, after its last object, when every span was one
    of its runs (r of them taken): the text's length; else -1."""
    if r != spans.shape[0]:  # a span out of order, overlapping, or past the listing
        return -1
    out[o] = _CLOSE_LIST
    return o + 1


_closed_in = inner(_closed)


@partial(kernel, sig=nt.int64(_OUT, _TEXT, _INTS, _INTS, _INTS, _SCRATCH, _INTS, _INTS, _INTS,
                              _INTS, _TABLE, _INTS, _FLAGS, _TABLE, nt.int64))
def pools_listing(out, keys, key_at, single, run, values, seq, k, first_pos, last_pos, cells,
                  rep, new, spans, most):  # pragma: no cover - compiled
    """Writes json_report.py `pools_json`'s text into `out`; returns its length. A
    pool alone: keys 0.. of widths `single` (seq, k, first_pos, last_pos, cells,
    rep, new); a run: the next keys, of widths `run` (seq, k as [k0, k1],
    first_pos, cells as [c0, d, e], new). `spans`: the runs, [a, b) each;
    `values`: scratch of kpool + 8 at least; `most`: the longest object's text."""
    o, i, r, n, w = 1, 0, 0, seq.size, cells.shape[1]
    out[0] = _OPEN_LIST
    while i < n:
        b = _run_at_in(out, o, most, spans, r, i, n)
        if b < 0:
            return -1
        if b:
            values[0], values[1], values[2] = seq[i], k[i], k[b - 1] + 1
            values[3] = first_pos[i]
            _steps_in(values, 4, cells, i)
            values[7] = new[i]
            o = _object_in(out, o, keys, key_at, single.size, run, values)
            i, r = b, r + 1
        else:
            values[0], values[1], values[2], values[3] = seq[i], k[i], first_pos[i], last_pos[i]
            for j in range(w):
                values[4 + j] = cells[i, j]
            values[4 + w], values[5 + w] = rep[i], new[i]
            o = _object_in(out, o, keys, key_at, 0, single, values)
            i += 1
    return _closed_in(out, o, spans, r)


@partial(kernel, sig=nt.int64(_OUT, _TEXT, _INTS, _INTS, _INTS, _SCRATCH, _INTS, _TABLE,
                              _FLAGS, _TABLE, nt.int64))
def scatter_listing(out, keys, key_at, single, run, values, rep, rows, pad, spans, most
                    ):  # pragma: no cover - compiled
    """Writes json_report.py `scatter_json`'s text into `out`; returns its length. An
    entry alone: keys 0.. of widths `single` (rep, cells, pad); a run: the next
    keys, of widths `run` (n, cells as [c0, d, e], pad: false). `spans`: the runs,
    [a, b) each; `values`: scratch of kpool + 4 at least; `most`: the longest
    object's text."""
    o, i, r, n, w = 1, 0, 0, rep.size, rows.shape[1]
    out[0] = _OPEN_LIST
    while i < n:
        b = _run_at_in(out, o, most, spans, r, i, n)
        if b < 0:
            return -1
        if b:
            values[0] = b - i
            _steps_in(values, 1, rows, i)
            values[4] = 0
            o = _object_in(out, o, keys, key_at, single.size, run, values)
            i, r = b, r + 1
        else:
            values[0] = rep[i]
            for j in range(w):
                values[1 + j] = rows[i, j]
            values[1 + w] = pad[i]
            o = _object_in(out, o, keys, key_at, 0, single, values)
            i += 1
    return _closed_in(out, o, spans, r)


@partial(kernel, sig=nt.int64(_OUT, _TEXT, _INTS, _INTS, _SCRATCH, _INTS, _INTS, _INTS, _INTS,
                              _TABLE, nt.int64))
def tokens_listing(out, keys, key_at, widths, values, pos, seq_at, seqs, rows, ext, most
                   ):  # pragma: no cover - compiled
    """Writes json_report.py `tokens_json`'s text into `out`; returns the text's
    length. Keys and `widths`: a token's (pos, seq as LISTED, cell, and ext when
    `widths` has a fourth field). Token i's sequences are `seqs[seq_at[i]:seq_at[i +
    1]]`, its ext `ext[i]`; `values`: scratch of a token's most sequences + 5 at
    least; `most`: the longest token's text."""
    o = 1
    out[0] = _OPEN_LIST
    for i in range(pos.size):
        if o + most + 2 > out.size:
            return -1
        values[0] = pos[i]
        a, b = seq_at[i], seq_at[i + 1]
        values[1] = b - a
        for j in range(a, b):
            values[2 + j - a] = seqs[j]
        c = 2 + b - a
        values[c] = rows[i]
        if widths.size > 3:
            values[c + 1], values[c + 2] = ext[i, 0], ext[i, 1]
        o = _object_in(out, o, keys, key_at, 0, widths, values)
    out[o] = _CLOSE_LIST
    return o + 1
