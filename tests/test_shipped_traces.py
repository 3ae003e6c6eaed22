"""Every shipped expectation holds.

Each trace in traces/ is replayed under both engines and every backend (the two
value backends, numba and numpy, and the model-only `none`), and every `expect`
op that applies there (no `engine:`, or that engine) must be evaluated and hold:
`kpool replay --check` would fail on it. A trace must also say something under
each engine: an (trace, engine) pair with no expectation at all is listed in
NO_EXPECTATION, so the gap is visible and the list is held exact.

traces/README.md is the library's index: one table row per trace with the
findings each engine raises; the table is checked against replays here.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kpool_cli.backend.store import make_backend
from kpool_cli.contracts.records import ExpectResult
from kpool_cli.contracts.tally import Tally, tallied
from kpool_cli.replay import replay
from kpool_cli.trace import model as m
from kpool_cli.trace.load import load_trace
from kpool_cli.versions import VERSIONS

ROOT = Path(__file__).resolve().parent.parent
TRACES = sorted((ROOT / "traces").glob("*.yaml"))
ENGINES = ("rep-once", "cache-safe")
BACKENDS = ("numba", "numpy", "none")

# (trace, engine) pairs whose trace has no expectation for that engine (every
# `expect` of the trace names the other engine): nothing to assert there yet.
# non-unified: its only expect is `engine: rep-once`. cache-safe replays it with no
# finding either, but its seq_cp also stales the source, so the last decode marks
# 4 pools, [[0, 0], [0, 1], [1, 0], [1, 1]], not 2: the trace (not this file) should
# say so with an `engine: cache-safe` expect.
NO_EXPECTATION: set[tuple[str, str]] = set()


def applicable(t: m.Trace, engine: str) -> list[int]:
    """Indices of the trace's `expect` ops that apply under `engine`."""
    return [i for i, op in enumerate(t.ops)
            if isinstance(op, m.Expect) and op.engine in (None, engine)]


def test_there_are_shipped_traces():
    assert len(TRACES) >= 14, [p.name for p in TRACES]


@pytest.mark.parametrize("path", TRACES, ids=lambda p: p.stem)
def test_every_trace_describes_itself_and_pins_both_engines(path: Path) -> None:
    """A shipped trace is a lesson: it says what it models, and it pins what each
    shipped version does there (an `expect` without `engine:` pins both)."""
    t = load_trace(path)
    assert t.name == path.stem, f"{path.name}: name {t.name!r} is not the file's stem"
    assert len(t.description.split()) >= 12, f"{path.name}: describe the situation"
    for engine in ENGINES:
        assert applicable(t, engine), f"{path.name}: no expect applies under {engine}"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("path", TRACES, ids=lambda p: p.stem)
def test_every_expectation_holds(path: Path, engine: str, backend: str) -> None:
    t = load_trace(path)
    results = [r for r in replay(t, VERSIONS[engine], make_backend(backend, t))
               if isinstance(r, ExpectResult)]
    # every expect that applies was evaluated (an aborted replay still reports its
    # later expects), and none that does not apply
    assert [r.op for r in results] == applicable(t, engine)
    bad = [f"{path.name} op {r.op}: {r.message}" for r in results if not r.ok]
    assert not bad, f"{engine}, backend {backend}: " + "; ".join(bad)
    if (path.stem, engine) in NO_EXPECTATION:
        assert not results, f"{path.stem} now has an expectation under {engine}: " \
                            "drop it from NO_EXPECTATION"
    else:
        assert results, (f"{path.name} has no expectation under {engine}: add one to the "
                         "trace (or list the pair in NO_EXPECTATION, with why)")


def test_no_expectation_lists_real_traces() -> None:
    stems = {p.stem for p in TRACES}
    assert {name for name, _ in NO_EXPECTATION} <= stems
    assert {engine for _, engine in NO_EXPECTATION} <= set(ENGINES)


@pytest.mark.parametrize("engine", ENGINES)
def test_replay_check_passes_on_every_shipped_trace(engine: str) -> None:
    """The same through the CLI: `kpool replay traces/*.yaml --check --fail-on never`
    exits 0 (the traces show findings on purpose: only a failed expect may fail)."""
    r = subprocess.run([sys.executable, "-m", "kpool_cli", "replay", *map(str, TRACES),
                        "--engine", engine, "--backend", "numpy", "--check",
                        "--fail-on", "never"],
                       capture_output=True, text=True, cwd=ROOT,
                       env={**os.environ, "NO_COLOR": "1"}, timeout=120)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]


README = ROOT / "traces" / "README.md"
ROW = re.compile(r"^\| \[([\w.-]+)\]\(([\w.-]+\.yaml)\) \| [^|]+ \| ([^|]+) \| ([^|]+) \|$")


def readme_rows() -> dict[str, tuple[str, str]]:
    """The table of traces/README.md: file name -> (rep-once cell, cache-safe cell)."""
    rows = {}
    for line in README.read_text().splitlines():
        mo = ROW.match(line)
        if mo:
            name, file, rep_once, cache_safe = mo.groups()
            assert file == f"{name}.yaml", line
            assert file not in rows, f"{file} has two rows"
            rows[file] = (rep_once.strip(), cache_safe.strip())
    return rows


def findings_cell(t: m.Trace, engine: str) -> str:
    """What the README's table says of one replay: its findings with their counts
    (the report's summary.findings), and whether it aborted."""
    tally = Tally(fail_on="never")
    for _ in tallied(replay(t, VERSIONS[engine], make_backend("numpy", t)), tally):
        pass
    cell = ", ".join(f"{code} x{n}" for code, n in sorted(tally.findings.items())) or "none"
    return cell + " (aborted)" if tally.status == "aborted" else cell


def test_readme_lists_every_trace_once() -> None:
    assert sorted(readme_rows()) == [p.name for p in TRACES]


@pytest.mark.parametrize("path", TRACES, ids=lambda p: p.stem)
def test_readme_findings_are_what_the_replay_finds(path: Path) -> None:
    rows = readme_rows()
    assert path.name in rows, f"traces/README.md has no row for {path.name}"
    t = load_trace(path)
    got = tuple(findings_cell(t, engine) for engine in ENGINES)
    assert rows[path.name] == got, f"{path.name}: README says {rows[path.name]}, replays give {got}"
