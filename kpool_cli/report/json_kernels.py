"""The JSON writer's kernel: a listing's text (a ubatch's pools or scatter entries,
docs/FORMATS.md "Runs") written from its columns in one pass, without one Python
object per pool.

Owns: `pools_listing` and `scatter_listing`, each the twin of the JSON writer's
Python way (json_report.py `pools_json`, `scatter_json`: the runs of docs/FORMATS.md
and, before, between and after them, the items no run holds). The keys' texts are
handed in, in the order report_format.py declares the fields (json_report.py
`_KEYS`, which holds that order to the one the kernels write their values in).

Invariants: the text is what orjson writes of the Python way's lists (compact,
ASCII; tests/test_report_runs.py holds the two equal on random listings); `out` is
sized by the caller (json_report.py `_most`), and a kernel never writes past it,
never allocates and never raises. Imported only once a replay has loaded numba
(json_report.py `_listing_kernels`).
"""

from __future__ import annotations

import numpy as np

from ..jit import inner, kernel

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


def _key(out, o, keys, key_at, f):  # pragma: no cover - compiled
    """Writes key text f (its `{` or `,`, its name, its `:`); returns the end."""
    for i in range(key_at[f], key_at[f + 1]):
        out[o] = keys[i]
        o += 1
    return o


_key_in = inner(_key)


def _bool(out, o, v):  # pragma: no cover - compiled
    """Writes `true` or `false`; returns the end."""
    word = _TRUE if v else _FALSE
    for i in range(word.size):
        out[o] = word[i]
        o += 1
    return o


_bool_in = inner(_bool)


def _ints(out, o, row):  # pragma: no cover - compiled
    """Writes the list of the ints of `row`; returns the end."""
    out[o] = _OPEN_LIST
    o += 1
    for j in range(row.size):
        if j:
            out[o] = _COMMA
            o += 1
        o = _int_in(out, o, row[j])
    out[o] = _CLOSE_LIST
    return o + 1


_ints_in = inner(_ints)


def _steps(out, o, rows, a):  # pragma: no cover - compiled
    """Writes [c0, d, e] of the run whose first entry is `a` (contracts/runs.py
    `run_cells`: member j of entry a + i on row c0 + i e + j d; d 1 where an entry
    has one member); returns the end."""
    c0 = rows[a, 0]
    out[o] = _OPEN_LIST
    o = _int_in(out, o + 1, c0)
    out[o] = _COMMA
    o = _int_in(out, o + 1, rows[a, 1] - c0 if rows.shape[1] > 1 else 1)
    out[o] = _COMMA
    o = _int_in(out, o + 1, rows[a + 1, 0] - c0)
    out[o] = _CLOSE_LIST
    return o + 1


_steps_in = inner(_steps)


def _item(out, o, spans, r, i):  # pragma: no cover - compiled
    """Before item i of a listing whose next run is `spans[r]`: the comma after the
    last object (`o` 1: none yet, past the `[`). Returns the end and whether the run
    starts at item i (else item i is written alone)."""
    if o > 1:
        out[o] = _COMMA
        o += 1
    return o, r < spans.shape[0] and spans[r, 0] == i


_item_in = inner(_item)


@kernel
def pools_listing(out, keys, key_at, seq, k, first_pos, last_pos, cells, rep, new, spans
                  ):  # pragma: no cover - compiled
    """Writes json_report.py `pools_json`'s text into `out`; returns its length.
    Keys 0-6: a pool's (seq, k, first_pos, last_pos, cells, rep, new); 7-11: a
    run's (seq, k, first_pos, cells, new). `spans`: the runs, [a, b) each."""
    o, i, r, n = 0, 0, 0, seq.size
    out[o] = _OPEN_LIST
    o += 1
    while i < n:
        o, run = _item_in(out, o, spans, r, i)
        if run:
            b = spans[r, 1]
            o = _int_in(out, _key_in(out, o, keys, key_at, 7), seq[i])
            o = _key_in(out, o, keys, key_at, 8)
            out[o] = _OPEN_LIST
            o = _int_in(out, o + 1, k[i])
            out[o] = _COMMA
            o = _int_in(out, o + 1, k[b - 1] + 1)
            out[o] = _CLOSE_LIST
            o = _int_in(out, _key_in(out, o + 1, keys, key_at, 9), first_pos[i])
            o = _steps_in(out, _key_in(out, o, keys, key_at, 10), cells, i)
            o = _bool_in(out, _key_in(out, o, keys, key_at, 11), new[i])
            i, r = b, r + 1
        else:
            o = _int_in(out, _key_in(out, o, keys, key_at, 0), seq[i])
            o = _int_in(out, _key_in(out, o, keys, key_at, 1), k[i])
            o = _int_in(out, _key_in(out, o, keys, key_at, 2), first_pos[i])
            o = _int_in(out, _key_in(out, o, keys, key_at, 3), last_pos[i])
            o = _ints_in(out, _key_in(out, o, keys, key_at, 4), cells[i])
            o = _int_in(out, _key_in(out, o, keys, key_at, 5), rep[i])
            o = _bool_in(out, _key_in(out, o, keys, key_at, 6), new[i])
            i += 1
        out[o] = _CLOSE_OBJECT
        o += 1
    out[o] = _CLOSE_LIST
    return o + 1


@kernel
def scatter_listing(out, keys, key_at, rep, rows, pad, spans):  # pragma: no cover - compiled
    """Writes json_report.py `scatter_json`'s text into `out`; returns its length.
    Keys 0-2: an entry's (rep, cells, pad); 3-5: a run's (n, cells, pad), a run's
    pad false. `spans`: the runs, [a, b) each."""
    o, i, r, n = 0, 0, 0, rep.size
    out[o] = _OPEN_LIST
    o += 1
    while i < n:
        o, run = _item_in(out, o, spans, r, i)
        if run:
            b = spans[r, 1]
            o = _int_in(out, _key_in(out, o, keys, key_at, 3), b - i)
            o = _steps_in(out, _key_in(out, o, keys, key_at, 4), rows, i)
            o = _bool_in(out, _key_in(out, o, keys, key_at, 5), False)
            i, r = b, r + 1
        else:
            o = _int_in(out, _key_in(out, o, keys, key_at, 0), rep[i])
            o = _ints_in(out, _key_in(out, o, keys, key_at, 1), rows[i])
            o = _bool_in(out, _key_in(out, o, keys, key_at, 2), pad[i])
            i += 1
        out[o] = _CLOSE_OBJECT
        o += 1
    out[o] = _CLOSE_LIST
    return o + 1
