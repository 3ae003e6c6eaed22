"""Detectors that judge the engine's decisions without values (ENGINE.md §8):
KP001 (its static part: duplicate scatter rows), KP002, KP004 and KP007.

Owns: pure functions from a layout and a scatter plan to findings, and
`AppearanceFilter`, which turns conditions that persist across ubatches (a rep
conflict, a drifted layout) into one finding where they appear.
"""

from __future__ import annotations

import numpy as np

from ..cache.kv import KvCache
from ..engine.layout import Layout
from ..engine.scatter import ScatterPlan
from .codes import EVIDENCE_ROWS, Finding, PoolIds


def _row_list(rows: list[int], limit: int = 8) -> str:
    head = ", ".join(str(r) for r in rows[:limit])
    return head + (f", ... ({len(rows)} rows)" if len(rows) > limit else "")


def scatter_race(layout: Layout, plan: ScatterPlan) -> list[Finding]:
    """KP001: rows written by two or more scatter entries of the ubatch. set_rows
    splits entries across threads, so the row's final value has no defined writer.
    Evidence: the entries per row of the first EVIDENCE_ROWS rows."""
    rep = plan.entry_rep
    if rep.size < 2:
        return []
    uniq, counts = np.unique(rep, return_counts=True)
    raced = uniq[counts > 1]
    if raced.size == 0:
        return []
    hit = np.flatnonzero(np.isin(rep, raced))
    real = plan.entry_pool[hit]
    seq, k = layout.locate(real[real >= 0])
    pools = PoolIds.of(seq, k)
    seqs = tuple(np.unique(seq).tolist())
    rows = raced.tolist()
    n_pad = int((real < 0).sum())
    who = f"seqs {', '.join(map(str, seqs))}" if seqs else "padding entries"
    if n_pad and seqs:
        who += " and padding"
    per_row = dict(zip(rows[:EVIDENCE_ROWS], counts[counts > 1][:EVIDENCE_ROWS].tolist(),
                       strict=True))
    more = ({"entries_per_row_not_listed": len(rows) - EVIDENCE_ROWS}
            if len(rows) > EVIDENCE_ROWS else {})
    return [Finding(
        "KP001",
        f"{len(rows)} row(s) written by more than one scatter entry ({who}): "
        f"{_row_list(rows)}",
        rows=tuple(rows), seqs=seqs, pools=pools,
        evidence={"entries_per_row": per_row, **more},
    )]


def pad_collision(layout: Layout, plan: ScatterPlan) -> list[Finding]:
    """KP004: a padding entry writes a row that a real pool reads (its rep row)."""
    pad_rows = plan.entry_rep[plan.pad]
    if pad_rows.size == 0 or plan.pool_cells.size == 0:
        return []
    readers = np.flatnonzero(np.isin(plan.pool_cells, pad_rows))  # few pad rows: a scan
    if readers.size == 0:
        return []
    hit = np.unique(plan.pool_cells[readers])
    seq, k = layout.locate(readers)
    return [Finding(
        "KP004",
        f"padding writes {hit.size} row(s) that real pools read: {_row_list(hit.tolist())}",
        rows=tuple(hit.tolist()), seqs=tuple(sorted(set(seq.tolist()))),
        pools=PoolIds.of(seq, k),
    )]


def rep_conflicts(layout: Layout) -> dict[int, tuple[tuple[int, int], ...]]:
    """KP002's condition: rep rows shared by pools whose member rows differ.
    Returns {row: the (seq, k) pools on it}."""
    pc = layout.pool_cells()
    if pc.size < 2:
        return {}
    order = np.argsort(pc, kind="stable")
    spc = pc[order]
    same = spc[1:] == spc[:-1]
    if not same.any():
        return {}
    ips = order[np.isin(spc, spc[1:][same])]  # every pool on a shared rep row, by row
    ips = ips[np.argsort(pc[ips], kind="stable")]
    rows = pc[ips]
    members = layout.members_of(ips)
    group_start = np.concatenate(([True], rows[1:] != rows[:-1]))
    first_idx = np.maximum.accumulate(np.where(group_start, np.arange(ips.size), 0))
    differs = np.any(members != members[first_idx], axis=1)
    bad_rows = np.unique(rows[differs])
    out: dict[int, tuple[tuple[int, int], ...]] = {}
    for r in bad_rows.tolist():
        seq, k = layout.locate(ips[rows == r])
        out[r] = tuple(zip(seq.tolist(), k.tolist(), strict=True))
    return out


def rep_conflict_finding(conflicts: dict[int, tuple[tuple[int, int], ...]]) -> Finding:
    rows = sorted(conflicts)
    pools = tuple(p for r in rows for p in conflicts[r])
    seqs = tuple(sorted({s for s, _ in pools}))
    first = rows[0]
    return Finding(
        "KP002",
        f"{len(rows)} rep row(s) hold pools with different members: row {first} is the rep "
        f"of pools {', '.join(f'{s}:{k}' for s, k in conflicts[first])}"
        + (f" (+{len(rows) - 1} more rows)" if len(rows) > 1 else ""),
        rows=tuple(rows), seqs=seqs, pools=pools,
    )


def layout_drift(layout: Layout, cache: KvCache, s: int) -> Finding | None:
    """KP007 for sequence s, or None when its layout matches a rebuild."""
    d = layout.drift(cache, s)
    if d is None:
        return None
    j, have, want = d
    return Finding(
        "KP007",
        f"seq {s}: the layout's pair {j} is {_pair(have)} but the cells say {_pair(want)}; "
        "the engine goes on with the drifted layout",
        seqs=(s,), evidence={"index": j, "layout": have, "cells": want},
    )


def _pair(p: tuple[int, int] | None) -> str:
    return "absent" if p is None else f"(pos {p[0]}, cell {p[1]})"


class AppearanceFilter:
    """Reports a persisting condition once, where it appears; it may appear again
    after it has cleared. Keys identify the condition (a row, a sequence)."""

    def __init__(self) -> None:
        self._active: set = set()

    def new(self, keys: set) -> set:
        fresh = keys - self._active
        self._active = set(keys)
        return fresh
