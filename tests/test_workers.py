"""workers.py: a pool's worker that dies is a clean exit 2, and a worker never
outlives its parent."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from kpool_cli.workers import WorkerDied, in_order

ROOT = Path(__file__).resolve().parent.parent
RACE = str(ROOT / "traces" / "shared-prefix-race.yaml")
PARTIAL = str(ROOT / "traces" / "partial-copy.yaml")

needs_two = pytest.mark.skipif((os.cpu_count() or 1) < 2,
                               reason="needs two cores for a process pool")


def _dies(unit: int) -> int:
    os._exit(3)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except OSError:
        return False
    return state != "Z"


@needs_two
def test_a_worker_that_dies_is_worker_died_with_every_worker_ended() -> None:
    with pytest.raises(WorkerDied, match=r"a worker process died .*--jobs 1"):
        list(in_order(_dies, [1, 2, 3], 2))


@needs_two
@pytest.mark.parametrize("command", ["check", "fuzz"])
def test_a_dead_worker_is_exit_2_with_one_line_not_an_internal_error(command: str,
                                                                      tmp_path: Path) -> None:
    """`kpool check -j 2` and `kpool fuzz -j 2`, each worker killed (a stand-in for
    the OOM killer: its unit function exits at once)."""
    target, args = (("kpool_cli.check", "_result_of"), ["check", RACE, PARTIAL, "-j", "2"]) \
        if command == "check" else (("kpool_cli.gen.fuzz", "fuzz_one"),
                                    ["fuzz", "--engine", "cache-safe", "--runs", "4", "-j",
                                     "2", "-o", str(tmp_path / "found")])
    script = textwrap.dedent(f"""
        import os, sys, importlib

        def dies(*args, **kwargs):  # found by name in the forked worker
            os._exit(3)

        mod = importlib.import_module({target[0]!r})
        setattr(mod, {target[1]!r}, dies)
        sys.argv = ["kpool", *{args!r}]
        from kpool_cli.cli.main import run
        run()
        """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       cwd=ROOT, timeout=120)
    assert r.returncode == 2, (r.returncode, r.stderr)
    # stderr whole in the message: a run under CI once began with "Exception ignored in
    # sys.unraisablehook: <function _on_unraisable ...>", its traceback cut off
    assert r.stderr.startswith("kpool: a worker process died") and "--jobs 1" in r.stderr, \
        r.stderr
    assert "internal error" not in r.stderr and r.stderr.count("\n") == 1, r.stderr


@needs_two
@pytest.mark.skipif(sys.platform != "linux", reason="PR_SET_PDEATHSIG is Linux's")
def test_workers_die_with_a_parent_killed_by_sigkill(tmp_path: Path) -> None:
    """A parent SIGKILL ends (the OOM killer, a CI job's hard stop) cannot end its
    workers: they must not run on as orphans."""
    script = textwrap.dedent(f"""
        import os, time
        from kpool_cli.workers import in_order

        def sleeper(unit):
            open(os.path.join({str(tmp_path)!r}, str(os.getpid())), "w").close()
            time.sleep(120)

        list(in_order(sleeper, [1, 2], 2))
        """)
    script_file = tmp_path / "parent.py"
    script_file.write_text(script)
    parent = subprocess.Popen([sys.executable, str(script_file)], cwd=ROOT)
    try:
        deadline = time.monotonic() + 60
        while len([p for p in tmp_path.iterdir() if p.name.isdigit()]) < 2:
            assert time.monotonic() < deadline, "the workers did not start"
            time.sleep(0.05)
        workers = [int(p.name) for p in tmp_path.iterdir() if p.name.isdigit()]
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
        deadline = time.monotonic() + 10
        while any(_alive(w) for w in workers):
            assert time.monotonic() < deadline, f"workers outlived their parent: {workers}"
            time.sleep(0.05)
    finally:
        parent.kill()
        for p in tmp_path.iterdir():
            if p.name.isdigit():
                with contextlib.suppress(OSError):
                    os.kill(int(p.name), signal.SIGKILL)


def test_a_worker_whose_parent_is_already_gone_exits() -> None:
    """`_worker_init` is given the parent's pid; a worker that finds another parent
    (its own died before the death signal was set) ends at once."""
    r = subprocess.run([sys.executable, "-c",
                        "from kpool_cli.workers import _worker_init; _worker_init(1)"],
                       cwd=ROOT, timeout=60)
    assert r.returncode == 1


class _Counted:
    """A sequence of a billion units that counts how many were read."""

    def __init__(self) -> None:
        self.read = 0

    def __len__(self) -> int:
        return 10**9

    def __iter__(self):
        for i in range(len(self)):
            self.read += 1
            yield i


def _double(unit: int) -> int:
    return 2 * unit


@needs_two
def test_a_long_sequence_of_units_is_read_as_it_goes() -> None:
    """`kpool fuzz --runs 10000000` made every unit and every future before its first
    result (28 s and 1.5 GB past a 2 s budget): the pool keeps a window in flight."""
    from kpool_cli.workers import WINDOW_PER_WORKER

    units = _Counted()
    got = in_order(_double, units, 2)  # type: ignore[arg-type]
    assert [next(got) for _ in range(3)] == [0, 2, 4]
    got.close()
    assert units.read <= 3 + 2 * WINDOW_PER_WORKER


def test_a_campaign_s_runs_are_made_when_asked_for() -> None:
    from kpool_cli.gen.fuzz import FuzzTask, tasks_for

    tasks = tasks_for("cache-safe", 10**12, 5)
    assert len(tasks) == 10**12
    assert tasks[0] == FuzzTask(5, "cache-safe", "none", shrink=False, base=None)
    assert tasks[-1].seed == 5 + 10**12 - 1
    with pytest.raises(IndexError):
        tasks[10**12]


@needs_two
def test_the_pool_forks_its_workers_whatever_the_default_start_method() -> None:
    """Python 3.14 makes forkserver Linux's default: a worker's parent would be the
    fork server, and every worker would take itself for an orphan and exit."""
    import multiprocessing

    if "forkserver" not in multiprocessing.get_all_start_methods():
        pytest.skip("no forkserver here")
    script = textwrap.dedent("""
        import multiprocessing
        multiprocessing.set_start_method("forkserver")
        from kpool_cli.workers import in_order
        print(list(in_order(abs, [-1, -2, -3, -4], 2)))
        """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       cwd=ROOT, timeout=120)
    assert r.returncode == 0 and r.stdout == "[1, 2, 3, 4]\n", r.stderr


@needs_two
def test_a_fork_outside_a_pool_keeps_its_signal_handlers() -> None:
    """The after-fork hook that gives a worker its handlers acts for a pool's workers
    alone: a later `subprocess` with `preexec_fn` (a fork) ran its program with SIGINT
    ignored, and a kpool started so ignored Ctrl-C."""
    list(in_order(abs, [-1, -2], 2))  # registers the hook in this process
    r = subprocess.run([sys.executable, "-c", "import signal; "
                        "print(signal.getsignal(signal.SIGINT) is signal.SIG_IGN)"],
                       preexec_fn=lambda: None, capture_output=True, text=True, timeout=60)
    assert r.stdout == "False\n"


@pytest.mark.skipif(not hasattr(signal, "SIGRTMIN"), reason="no real-time signals")
def test_a_dead_worker_s_exit_is_said_in_words() -> None:
    """Signal 9 by its name; a real-time signal, which `signal.Signals` has no member
    for (its lookup raised ValueError), by its number; an exit by its status."""
    from kpool_cli.workers import _how_it_ended

    assert _how_it_ended(-9) == "killed by SIGKILL"
    assert _how_it_ended(-15) == "killed by SIGTERM"
    rt = int(signal.SIGRTMIN) + 6  # 40 on Linux, between SIGRTMIN and SIGRTMAX
    assert _how_it_ended(-rt) == f"killed by signal {rt}"
    assert _how_it_ended(3) == "exit status 3"
    assert _how_it_ended(0) == "exit status 0"
