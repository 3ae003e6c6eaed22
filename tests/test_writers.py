"""backend/writers.py holds the slots a standing plan writes again (`Writers.wrote_again`)
instead of writing their `w_ubatch` each ubatch; what `content` says must be what
writing them each time says. The oracle here writes them each time."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from kpool_cli.backend.facts import POOLED
from kpool_cli.backend.store import ValueBackend
from kpool_cli.trace.model import CacheConfig

CFG = CacheConfig(kv_size=16, kpool=2, n_seq_max=1, n_embd=4)
ROWS = np.arange(12, dtype=np.int64)


def writers_with_slots():
    """A backend whose rows 0..11 hold slots 1..12, and its writers."""
    be = ValueBackend(CFG, 3, "numpy")
    be.write_rows(ROWS, ROWS + 1)
    slots = be.slots.of(ROWS)
    assert sorted(slots.tolist()) == list(range(1, 13))
    return be, slots


# the arrays a plan's race groups could hand in: nested ones (a plan grown by appended
# pools holds every slot of the one it grew from) and one apart
def _arrays(slots: np.ndarray) -> list[np.ndarray]:
    return [slots[:3].copy(), slots[:6].copy(), slots[:9].copy(), slots[8:].copy()]


OPS = st.lists(st.one_of(
    st.tuples(st.just("again"), st.integers(0, 3)),
    st.tuples(st.just("grown"), st.integers(0, 1)),  # array i + 1, grown from array i
    st.tuples(st.just("stamp"), st.lists(st.integers(0, 11), min_size=1, max_size=4,
                                         unique=True)),
    st.tuples(st.just("tick"), st.none()),
    st.tuples(st.just("read"), st.integers(0, 11)),
), max_size=40)


@settings(max_examples=300, deadline=None)
@given(ops=OPS)
def test_held_writes_read_as_writes_made_each_time(ops) -> None:
    be, slots = writers_with_slots()
    w = be.writers
    arrays = _arrays(slots)
    eager = be.slots.w_ubatch.copy()  # the oracle: every write made when it is asked
    for kind, arg in ops:
        if kind == "again":
            w.wrote_again(arrays[arg])
            eager[arrays[arg]] = w.n_ubatch
        elif kind == "grown":
            w.wrote_again(arrays[arg + 1], arrays[arg])
            eager[arrays[arg + 1]] = w.n_ubatch
        elif kind == "stamp":
            s = slots[np.array(arg)]
            w.stamp(s, POOLED, 0, 1)
            eager[s] = w.n_ubatch
        elif kind == "tick":
            w.n_ubatch += 1
        else:
            assert w.content(int(ROWS[arg])).ubatch == eager[slots[arg]]
    assert [w.content(int(r)).ubatch for r in ROWS] == eager[slots].tolist()


def test_a_standing_plan_writes_no_slot_until_read() -> None:
    """Slots 1..3 written again at ubatches 5, 6 and 7: w_ubatch keeps its 0 until
    `content` reads, which finds 7; a stamp of slot 2 at ubatch 9 after the last
    hold (9 > 7) stays 9."""
    be, slots = writers_with_slots()
    w, held = be.writers, slots[:3].copy()
    for u in (5, 6, 7):
        w.n_ubatch = u
        w.wrote_again(held)
    assert be.slots.w_ubatch[held].tolist() == [0, 0, 0]
    w.n_ubatch = 9
    w.stamp(held[1:2], POOLED, 0, 1)
    assert [w.content(r).ubatch for r in (0, 1, 2)] == [7, 9, 7]
    assert be.slots.w_ubatch[held].tolist() == [7, 9, 7]


def test_held_slots_are_counted_until_written_in() -> None:
    """The held array is memory the budget sees: 3 slots held, 24 bytes; none once
    `content` writes them in."""
    be, slots = writers_with_slots()
    w = be.writers
    assert w.bytes_held() == 0
    w.wrote_again(slots[:3].copy())
    assert w.bytes_held() == 24
    w.content(0)
    assert w.bytes_held() == 0
