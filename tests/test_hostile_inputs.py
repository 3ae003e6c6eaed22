"""Hostile inputs, property-tested: whatever the trace, report or
argument list, `kpool` exits 0, 1 or 2, never with a traceback or an "internal error",
says what is wrong with which file when it exits 2, and stays within a time and
memory bound.

The cases come from `hostile.py` (mutated shipped traces, YAML-structure and semantic
mutations, mutated JSON reports for `kpool diff`, random argument lists), a few
hundred in all, the light ones only (no 4M-token ranges or 2**31-element caches:
`tests/campaign_robustness.py` runs those, 10,000+ cases, each in a killable process).
Each case runs in this process (kpool's `main` under click's stream isolation, with
KPOOL_TRACEBACK=1 so an internal error raises here with its traceback), under a
wall-clock alarm and an address-space limit; a handful run as real processes.
A failure prints the case's class and key: `python tests/campaign_robustness.py
--repro CLASS KEY` reruns it and shows everything.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import hostile
import pytest
from hypothesis import HealthCheck, Phase, given, note, settings

ROOT = Path(__file__).resolve().parent.parent

# cases per class: 600 in all, about 15 s on a 2-core machine
EXAMPLES = {"bytes": 120, "yaml": 150, "semantic": 120, "report": 120, "argv": 90}
CASE_SECONDS = 20  # wall clock per case: a hang, not a slow case
EXTRA_MB = 2048  # address space a case may add to this process


def _vm_size() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


@contextlib.contextmanager
def address_space(extra: int):
    """RLIMIT_AS (soft) at what this process maps now plus `extra` bytes, restored after:
    an allocation past it is a MemoryError, which `judge` reports as "memory"."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = _vm_size() + extra
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


@pytest.fixture(scope="module", autouse=True)
def _warm():
    """Base reports (the `report` and `argv` classes mutate them) and numba's kernels,
    loaded once, outside any case's limits."""
    hostile.base_reports()
    hostile.run_argv(["replay", str(hostile.TRACES[0]), "--backend", "numba"])


@pytest.mark.parametrize("cls", hostile.CLASSES)
def test_hostile_inputs_exit_cleanly(cls):
    @settings(max_examples=EXAMPLES[cls], derandomize=True, database=None,
              deadline=datetime.timedelta(seconds=2 * CASE_SECONDS),
              phases=(Phase.explicit, Phase.generate),  # another seed is not a smaller case
              suppress_health_check=list(HealthCheck), print_blob=False)
    @given(case=hostile.strategy(cls))
    def check(case: hostile.Case) -> None:
        note(f"case {case.cls} {case.key} (heavy=False): {case.desc}")
        with tempfile.TemporaryDirectory() as d:
            wd = Path(d)
            with address_space(EXTRA_MB << 20):
                outcome = hostile.run_case(case, wd, timeout=CASE_SECONDS)
            bad = hostile.judge(case, outcome, wd)
        assert not bad, (
            f"{case.cls} case {case.key!r} ({case.desc}): kpool {case.argv} "
            f"env {case.env} exited {outcome.code!r}:\n"
            + "\n".join(f"- {k}: {v[:1500]}" for k, v in bad)
            + f"\nrerun: python -c 'import sys; sys.path.insert(0, \"tests\"); import hostile; "
              f"print(hostile.make_case({case.cls!r}, {case.key!r}, heavy=False))'")

    check()


# -- a few cases as real processes: the bounds hold for the `kpool` a user starts ------


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))


def _bomb_trace() -> bytes:
    levels = ["  - &l0 [{seq: 0, pos: 0}, {seq: 0, pos: 0}, {seq: 0, pos: 0}, {seq: 0, pos: 0}]"]
    for i in range(1, 24):
        levels.append(f"  - &l{i} [*l{i - 1}, *l{i - 1}, *l{i - 1}, *l{i - 1}]")
    return ("kpool_trace: 1\nanchors:\n" + "\n".join(levels) + "\ncache: {kv_size: 64, kpool: 4}"
            "\nops:\n  - decode:\n      tokens: *l23\n").encode()


PROCESS_CASES = {
    # name: (file name, content or None for a path given as it is, argv after `kpool`)
    "alias bomb": ("bomb.yaml", _bomb_trace(), ["replay", "@/bomb.yaml"]),
    "deep flow nesting": ("deep.yaml", b"kpool_trace: 1\nops: " + b"[" * 200_000,
                          ["replay", "@/deep.yaml", "--backend", "none"]),
    "/dev/zero as a trace": (None, None, ["replay", "/dev/zero", "--backend", "none"]),
    "a report nested 10**6 deep": ("r.json", b"[" * 1_000_000 + b"]" * 1_000_000,
                                   ["diff", "@/r.json", "@/r.json"]),
    "huge ints in a trace": ("big.yaml", b"kpool_trace: 1\ncache: {kv_size: 1" + b"0" * 5000
                             + b", kpool: 0x" + b"f" * 5000 + b"}\nops: []\n",
                             ["replay", "@/big.yaml"]),
}


@pytest.mark.parametrize("name", list(PROCESS_CASES))
def test_hostile_input_in_a_real_process(tmp_path, name):
    fname, content, argv = PROCESS_CASES[name]
    if fname is not None:
        (tmp_path / fname).write_bytes(content)
    args = [str(tmp_path / a[2:]) if a.startswith("@/") else a for a in argv]
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "kpool_cli", *args], capture_output=True,
                       text=True, errors="backslashreplace", cwd=tmp_path, timeout=60,
                       preexec_fn=_limit_memory, env={**os.environ, "COLUMNS": "100"})
    seconds = time.monotonic() - t0
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert "Traceback" not in r.stderr + r.stdout
    assert "internal error" not in r.stderr, r.stderr[-2000:]
    named = args[1] if fname is None else str(tmp_path / fname)
    assert named in r.stderr, r.stderr[-2000:]
    assert seconds < 30, f"{seconds:.1f} s"
