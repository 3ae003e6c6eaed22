"""Helpers shared by the engine tests.

- `trace(yaml_text)`: a `Trace` from a (dedented) YAML string.
- `run(trace_or_text, engine)`: every record of a replay, as a list.
- `drive(trace_or_text, engine)`: the replay step by step: yields `(record, replayer)`
  so a test can read `replayer.cache`, `replayer.layout` and `replayer.stale` right
  after each record. Every step runs `replayer.cache.check_invariants()` first.
  Note: the replayer resets `stale` to CLEAN only when it resumes after a batch's
  ubatch 0, so at a ubatch-0 record `replayer.stale` is still the batch's snapshot.
- the `checked_drive` fixture hands out `drive` (same invariant check).

Hypothesis profiles: "ci" is derandomised (the examples are a
function of the test, so a run is repeatable), keeps no example database, and has
no timing-based failures (no deadline, no too_slow health check); it is loaded
when `CI` is set (not "", "0", "false", "no"), as CI services and .ci/run's
callers do. "dev" is hypothesis's default (fresh examples every run, the local
database). `HYPOTHESIS_PROFILE=ci|dev` chooses either explicitly; a profile a
pytest plugin loaded first (the mutation run's `-p tests.mutation.hypothesis_profile`)
or `--hypothesis-profile` is kept.
"""

from __future__ import annotations

import compileall
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from warm_numba import warm, warm_listings

from kpool_cli.contracts.records import ExpectResult, OpEvent, UbatchRecord
from kpool_cli.replay import Replayer
from kpool_cli.trace.load import load_trace_text
from kpool_cli.trace.model import Token, Trace
from kpool_cli.versions import registered

# The suite runs on two processes (pytest-xdist, pyproject's addopts), whose workers
# inherit COLUMNS=80 and LINES=24 from it; kpool wraps text to COLUMNS when it is set,
# so the tests that mean a width set it themselves, as a user's shell would
for _name in ("COLUMNS", "LINES"):
    os.environ.pop(_name, None)

sys.path.insert(0, str(Path(__file__).parent))

# both from hypothesis's "default", not from whatever profile is loaded now (recent
# hypothesis loads its own "ci" profile when a CI variable is present, even empty)
settings.register_profile("ci", settings.get_profile("default"), derandomize=True,
                          database=None, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow], print_blob=True)
settings.register_profile("dev", settings.get_profile("default"))
_CI = os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")
_LOADED = (settings.get_current_profile_name()  # not in older hypothesis
           if hasattr(settings, "get_current_profile_name") else settings._current_profile)
if os.environ.get("HYPOTHESIS_PROFILE"):
    settings.load_profile(os.environ["HYPOTHESIS_PROFILE"])
elif _LOADED in (None, "default", "ci"):  # hypothesis's own choice, not a plugin's
    settings.load_profile("ci" if _CI else "dev")

ENGINES = ("rep-once", "cache-safe")


def toks(*specs: tuple[int, list[int]]) -> tuple[Token, ...]:
    """A batch's tokens from (pos, seq ids) pairs."""
    return tuple(Token(pos=p, seq=tuple(s)) for p, s in specs)


def trace(yaml_text: str) -> Trace:
    return load_trace_text(textwrap.dedent(yaml_text))


def _as_trace(t: Trace | str) -> Trace:
    return trace(t) if isinstance(t, str) else t


def drive(t: Trace | str, engine: str = "rep-once"
          ) -> Iterator[tuple[OpEvent | UbatchRecord, Replayer]]:
    """The replay ubatch by ubatch (and event by event), with the replayer's state.
    The cache's invariants are checked after every record. `expect` ops are not
    answered here (kpool_cli.replay.replay does that)."""
    rp = Replayer(_as_trace(t), registered(engine))
    rp.cache.check_invariants()
    for rec in rp.run():
        rp.cache.check_invariants()
        yield rec, rp


def run(t: Trace | str, engine: str = "rep-once") -> list:
    return [rec for rec, _ in drive(t, engine)]


def ubatches(records: list) -> list[UbatchRecord]:
    return [r for r in records if isinstance(r, UbatchRecord)]


def events(records: list) -> list[OpEvent]:
    return [r for r in records if isinstance(r, OpEvent)]


def codes(records) -> set[str]:
    if isinstance(records, UbatchRecord | OpEvent):
        records = [records]
    return {f.code for r in records if not isinstance(r, ExpectResult) for f in r.findings}


def expects_ok(records: list) -> None:
    bad = [r.message for r in records if isinstance(r, ExpectResult) and not r.ok]
    assert not bad, bad


@pytest.fixture(autouse=True)
def _signal_state(monkeypatch: pytest.MonkeyPatch) -> None:
    """kpool's signal state and the unraisable hook as they were before each test. A
    test that installs the CLI's handlers and sends itself a signal leaves it kept
    (signals.py `_raise`: the CLI answers it as it exits), and the next `held()` block
    in that process raised it: a later test's first kernel call, as an interrupt of
    the whole pytest worker."""
    from kpool_cli import signals

    for name in ("_kept", "_settled", "_depth"):
        monkeypatch.setattr(signals, name, getattr(signals, name))
    monkeypatch.setattr(sys, "unraisablehook", sys.unraisablehook)


@pytest.fixture
def checked_drive():
    """`drive`, which checks the cache's invariants after every record."""
    return drive


@pytest.fixture(params=ENGINES)
def engine(request) -> str:
    return request.param


def _bytecode_once() -> None:
    """Where Python may not write bytecode as it imports (PYTHONDONTWRITEBYTECODE, set
    on the project's machine), every process the suite starts (its two workers and
    hundreds of `kpool` commands) would compile all of kpool_cli from source again,
    which costs a short command about half its time (docs/performance.md,
    "thirty-fourth session"). So the controller compiles it once, into the
    `__pycache__` folders where an import would have written it (and numba's cache
    already goes): the suite writes bytecode into the source tree despite that
    setting, and no other process writes any. compileall recompiles a `.pyc` whose
    source changed; Python checks each against its source before it reads it."""
    if sys.dont_write_bytecode:
        compileall.compile_dir(Path(__file__).resolve().parent.parent / "kpool_cli",
                               quiet=2)  # a folder it cannot write: no speed-up, no noise


def pytest_configure(config: pytest.Config) -> None:
    """Fill kpool's bytecode (`_bytecode_once`) and numba's on-disk cache once, in the
    controlling process, before pytest-xdist starts its workers. Without numba's, on
    a fresh clone every process that replays with numba would compile the same
    kernels at the same time (both workers, and the `kpool` subprocesses the CLI
    tests start). A replay of a few shipped traces on the compiled core with the
    numba backend (warm_numba.py) compiles every kernel the suite calls; on a warm
    cache it only loads them. An error in it stops the session before any test
    runs, as it would stop any replay.

    On a fresh clone the two kinds of kernel compile side by side: the compiled core's
    in a child (`python tests/warm_numba.py`), the value backend's here on the reference
    core, and the JSON writer's listing kernels (`warm_listings`); then the replay on
    both compiles the few backend kernels only the compiled core reaches and loads the
    rest. No child where it cannot pay: under NUMBA_BOUNDSCHECK=1 (the bounds-checked
    rerun, where numba cannot cache most of the core's kernels: the child's work would
    be lost) and under the mutation check (MUTANT_UNDER_TEST: a session a mutant, on a
    warm cache)."""
    if hasattr(config, "workerinput"):  # an xdist worker: its controller did it
        return
    _bytecode_once()
    if not (os.environ.get("NUMBA_BOUNDSCHECK") or os.environ.get("MUTANT_UNDER_TEST")):
        tests = Path(__file__).resolve().parent
        child = subprocess.Popen([sys.executable, str(tests / "warm_numba.py")],
                                 cwd=tests.parent, stdin=subprocess.DEVNULL,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            warm("numba", "reference")
            warm_listings()
        finally:
            _, err = child.communicate()
        if child.returncode:  # only the speed-up is lost: the replay below runs it all
            print(f"numba's warm-up child failed (exit {child.returncode}); its kernels "
                  f"compile below:\n{err.decode(errors='replace')[-2000:]}", file=sys.stderr)
    warm("numba", "compiled")
