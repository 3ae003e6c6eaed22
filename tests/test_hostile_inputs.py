"""Hostile inputs, property-tested: whatever the trace, report or
argument list, `kpool` exits 0, 1 or 2, never with a traceback or an "internal error",
says what is wrong with which file when it exits 2, and stays within a time and
memory bound.

The cases come from `hostile.py` (mutated shipped traces, YAML-structure and semantic
mutations, mutated and amplified JSON reports for `kpool diff`, random argument lists,
hostile settings files, special files, outputs pointed at inputs, hostile numeric
options and engine strings, closed pipes and signals, line breaks in every text
field), 890 in all, the light ones only (no 4M-token ranges or 2**31-element caches:
`tests/campaign_robustness.py` runs those, 10,000+ cases, each in a killable process).
Each case runs in this process (kpool's `main` under click's stream isolation, or on
real file descriptors for the pipe and signal cases, with KPOOL_TRACEBACK=1 so an
internal error raises here with its traceback), under a wall-clock alarm and an
address-space limit; every input is hashed before and after. A handful run as real
processes.
A failure prints the case's class and key: `python tests/campaign_robustness.py
--repro CLASS KEY` reruns it and shows everything.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import hostile
import pytest
from hypothesis import HealthCheck, Phase, given, note, settings

ROOT = Path(__file__).resolve().parent.parent

# cases per class: 890 in all, about 30 s on a 2-core machine when kpool passes
EXAMPLES = {"bytes": 120, "yaml": 150, "semantic": 120, "report": 120, "argv": 90,
            "settings": 50, "special": 50, "outputs": 50, "options": 60, "signals": 30,
            "linebreaks": 50}
CASE_SECONDS = 20  # wall clock per case: a hang, not a slow case
SPECIAL_SECONDS = 5  # a special file takes milliseconds: past this, a read waits on a FIFO
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
        seconds = SPECIAL_SECONDS if case.cls == "special" else CASE_SECONDS
        with tempfile.TemporaryDirectory() as d:
            wd = Path(d)
            with address_space(EXTRA_MB << 20):
                outcome = hostile.run_case(case, wd, timeout=seconds)
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


# -- pipes, signals and special files for the `kpool` a user starts -----------------------
#
# As a user runs it: stdout block-buffered (PYTHONUNBUFFERED unset: with it, every write
# goes out at once and a closed pipe or a full disk shows sooner), a real SIGINT.


def _user_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    env["COLUMNS"] = "100"
    return env


def _long_trace(path: Path, n_ops: int = 3000) -> None:
    ops = "".join(f"  - decode: {{seq: 0, pos: {i}..{i + 1}}}\n" for i in range(n_ops))
    path.write_text(f"kpool_trace: 1\ncache: {{kv_size: 4096, kpool: 4}}\nops:\n{ops}")


STDOUT_CASES = {
    # name: (argv after `kpool`, "closed" or "full", the status it must end with)
    "replay JSON into a closed pipe": (["replay", "@T", "--format", "json", "--backend", "none"],
                                       "closed", 141),
    "diff into a closed pipe": (["diff", "@T"], "closed", 141),
    "check JSON into a closed pipe": (["check", "@T", "--backend", "none", "--output-format",
                                       "json"], "closed", 141),
    "--version into a closed pipe": (["--version"], "closed", 141),
    "replay JSON onto /dev/full": (["replay", "@T", "--format", "json", "--backend", "none"],
                                   "full", 2),
    "diff onto /dev/full": (["diff", "@T"], "full", 2),
}


@pytest.mark.parametrize("name", list(STDOUT_CASES))
def test_stdout_that_takes_nothing_in_a_real_process(tmp_path, name):
    argv, where, status = STDOUT_CASES[name]
    args = [str(hostile.ROOT / "traces" / hostile.SMALL) if a == "@T" else a for a in argv]
    if where == "closed":
        r, w = os.pipe()
        os.close(r)
    else:
        w = os.open("/dev/full", os.O_WRONLY)
    try:
        p = subprocess.run([sys.executable, "-m", "kpool_cli", *args], stdout=w,
                           stderr=subprocess.PIPE, text=True, cwd=tmp_path, timeout=60,
                           env=_user_env())
    finally:
        os.close(w)
    assert p.returncode == status, (p.returncode, p.stderr[-1000:])
    assert "Exception ignored" not in p.stderr and "Traceback" not in p.stderr, p.stderr
    if status == 2:
        assert "standard output" in p.stderr, p.stderr


@pytest.mark.parametrize("sig, status", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_during_a_json_replay_leaves_one_document(tmp_path, sig, status):
    _long_trace(tmp_path / "long.yaml")
    p = subprocess.Popen([sys.executable, "-m", "kpool_cli", "replay", "long.yaml",
                          "--backend", "none", "--format", "json"], cwd=tmp_path,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_user_env())
    first = os.read(p.stdout.fileno(), 1)  # the document has begun: the replay runs
    p.send_signal(sig)
    out, err = p.communicate(timeout=60)
    assert p.returncode == status, (p.returncode, err[-1000:])
    doc = json.loads(first + out)
    assert doc["summary"]["status"] == "interrupted"


SPECIAL_CASES = {
    # name: (argv after `kpool`, with @F the FIFO)
    "a FIFO as a trace": ["replay", "@F.yaml", "--backend", "none"],
    "a FIFO in a folder": ["check", "@D", "--backend", "none"],
    "a FIFO named .json for diff": ["diff", "@F.json", "@F.json"],
    "a FIFO named kpool.toml": ["check", "@T", "--backend", "none"],
}


@pytest.mark.parametrize("name", list(SPECIAL_CASES))
def test_nothing_waits_on_a_fifo_in_a_real_process(tmp_path, name):
    os.mkfifo(tmp_path / "f.yaml")
    os.mkfifo(tmp_path / "f.json")
    (tmp_path / "d").mkdir()
    os.mkfifo(tmp_path / "d" / "x.yaml")
    if name.endswith("kpool.toml"):
        os.mkfifo(tmp_path / "kpool.toml")
    args = [a.replace("@F", str(tmp_path / "f")).replace("@D", str(tmp_path / "d"))
            .replace("@T", str(hostile.ROOT / "traces" / hostile.SMALL)) for a in
            SPECIAL_CASES[name]]
    try:
        p = subprocess.run([sys.executable, "-m", "kpool_cli", *args], capture_output=True,
                           text=True, cwd=tmp_path, timeout=15, env=_user_env())
    except subprocess.TimeoutExpired:
        pytest.fail(f"kpool {' '.join(args)} waited on a FIFO for 15 s")
    assert p.returncode == 2, (p.returncode, p.stderr[-1000:])
    assert "FIFO" in p.stdout + p.stderr, p.stdout + p.stderr
