"""kpool fuzz: the random generator, one run's purity, shrinking, the invariants."""

from __future__ import annotations

from concurrent.futures import ProcessPoolExecutor

import numpy as np
import pytest

from kpool_cli.gen import fuzz
from kpool_cli.gen.fuzz import FuzzTask, fuzz_one, run_checked
from kpool_cli.gen.random_trace import random_trace
from kpool_cli.trace.load import load_trace_text
from kpool_cli.trace.write import dump_trace


def test_random_trace_is_deterministic_and_loads() -> None:
    assert random_trace(7) == random_trace(7)
    assert random_trace(7) != random_trace(8)
    for s in range(50):
        load_trace_text(dump_trace(random_trace(s)))


def test_random_traces_mostly_pass_validation() -> None:
    refused = sum(run_checked(random_trace(s), "rep-once")[2] for s in range(200))
    assert refused <= 40  # at least 80% of the traces replay without a KP006


def test_fuzz_one_is_pure_also_in_a_process_pool() -> None:
    tasks = [FuzzTask(s, "cache-safe") for s in (16, 19, 28)]
    here = [fuzz_one(t) for t in tasks]
    assert here == [fuzz_one(t) for t in tasks]
    with ProcessPoolExecutor(2) as pool:
        assert list(pool.map(fuzz_one, tasks)) == here


def test_shrinking_keeps_the_race_and_makes_it_small() -> None:
    """Seed 19 under cache-safe: a KP001 in a 12-op trace; its shrunk trace still
    shows KP001 (the pinned expect holds: `_pinned` replays it) in at most 6 ops."""
    o = fuzz_one(FuzzTask(19, "cache-safe"))
    assert any(c == "KP001" for c, _ in o.findings)
    sh = next(s for s in o.shrunk if s.code == "KP001")
    assert sh.n_ops <= min(6, o.n_ops)
    t = load_trace_text(sh.yaml)
    assert any(c == "KP001" for c, _ in run_checked(t, "cache-safe")[0])
    assert "expect" in sh.yaml and t.description


@pytest.mark.parametrize("seed, code", [(34, "KP005"), (125, "KP002")])
def test_a_model_only_shrunk_trace_passes_kpool_check(seed: int, code: str) -> None:
    """What `kpool check` asks of a found trace: every finding pinned, under a value
    backend (its default) and model-only. Seed 34's KP005 trace also raises a KP001 at
    an earlier op, and seed 125's KP002 trace a KP003 that only a value backend sees:
    each is pinned after its own op, and the description's command reproduces the run."""
    from kpool_cli.backend.store import make_backend
    from kpool_cli.contracts.records import ExpectResult
    from kpool_cli.replay import replay
    from kpool_cli.trace import model as m
    from kpool_cli.versions import VERSIONS

    sh = next(s for s in fuzz_one(FuzzTask(seed, "cache-safe")).shrunk if s.code == code)
    t = load_trace_text(sh.yaml)
    assert f"--seed {seed} --runs 1 --backend none`" in t.description
    pinned = {c for op in t.ops if isinstance(op, m.Expect) for c in op.findings or ()}
    for backend in ("numba", "numpy", "none"):
        recs = list(replay(t, VERSIONS["cache-safe"], make_backend(backend, t)))
        results = [r for r in recs if isinstance(r, ExpectResult)]
        assert results and all(r.ok for r in results), (backend, results)
        found = {f.code for r in recs if not isinstance(r, ExpectResult) for f in r.findings}
        assert found <= pinned, (backend, found, pinned)


def test_rep_once_does_not_show_the_shrunk_race() -> None:
    sh = next(s for s in fuzz_one(FuzzTask(19, "cache-safe")).shrunk if s.code == "KP001")
    assert not any(c == "KP001" for c, _ in run_checked(load_trace_text(sh.yaml), "rep-once")[0])


def test_a_plan_naming_an_empty_cell_is_a_defect(monkeypatch: pytest.MonkeyPatch) -> None:
    from kpool_cli.cache.kv import KvCache

    def emptied(self, rows):  # type: ignore[no-untyped-def]
        return np.full(np.asarray(rows).size, -1)  # every cell looks empty to the invariant

    monkeypatch.setattr(KvCache, "row_pos", emptied)
    _, defects, _ = run_checked(random_trace(19), "cache-safe")
    assert any(d[0] == fuzz.INV_EMPTY for d in defects)


def test_an_unreported_drift_is_a_defect(monkeypatch: pytest.MonkeyPatch) -> None:
    from kpool_cli.compiled.layout import CompiledLayout
    from kpool_cli.engine.layout import Layout
    from kpool_cli.verdict.rules import kp007_layout_drift
    for cls in (Layout, CompiledLayout):  # each core's layout
        monkeypatch.setattr(cls, "drift", lambda self, cache, s: (0, None, (0, 0)))
    monkeypatch.setattr(kp007_layout_drift.Check, "at_ubatch", lambda self, ctx: [])
    _, defects, _ = run_checked(random_trace(19), "rep-once")
    assert any(d[0] == fuzz.INV_DRIFT for d in defects)


def test_an_escaping_exception_is_a_defect(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(self, *a):  # type: ignore[no-untyped-def]
        raise np.linalg.LinAlgError("injected")

    monkeypatch.setattr(fuzz._Invariants, "__call__", boom)
    _, defects, _ = run_checked(random_trace(19), "rep-once")
    assert defects[0][:2] == (fuzz.INV_CRASH, f"{fuzz.INV_CRASH}/LinAlgError")


def test_a_recurrent_child_out_of_sync_is_a_defect(monkeypatch: pytest.MonkeyPatch) -> None:
    """The recurrent child's `check_invariants` runs after every op: a `_placed` left
    standing by a mutator that should have dropped it (seq_cp here) escapes as an
    AssertionError. Random trace 4 has a step of slots in place, then a seq_cp that
    moves one of them."""
    from kpool_cli.cache.recurrent import RecurrentChild

    real = RecurrentChild.seq_cp

    def keeps_placed(self, src, dst):  # type: ignore[no-untyped-def]
        placed = self._placed
        real(self, src, dst)
        self._placed = placed

    monkeypatch.setattr(RecurrentChild, "seq_cp", keeps_placed)
    _, defects, _ = run_checked(random_trace(4), "rep-once")
    assert defects[0] == (fuzz.INV_CRASH, f"{fuzz.INV_CRASH}/AssertionError",
                          "AssertionError: _placed is not in place"), defects
