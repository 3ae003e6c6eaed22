"""The defects an eighth hostile-input campaign found on 7 December 2026
(docs/robustness.md, "The eighth round"): a worker of `kpool check -j` or `kpool diff
-j` ended while it wrote its result (a large summary takes a while to write) left
half a message in the pool's pipe, and the executor's thread that reads results
waited for the rest for ever. Ctrl-C or SIGTERM at that moment printed "kpool:
interrupted" and the process never exited (the interpreter joins that thread at
exit); a worker killed at that moment (the OOM killer, `kill -9`) left the command
waiting for ever, with nothing said. Each test makes the moment happen on purpose:
the unit function, found by name in the forked worker, writes half of its result
and then signals its parent, or kills itself. The last four tests are reviews' of
that fix: a second Ctrl-C during the stop, a signal with no name, Ctrl-C held down
during the stop, and a SIGTERM then a Ctrl-C.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from test_untrusted import ROOT

RACE = str(ROOT / "traces" / "shared-prefix-race.yaml")
PARTIAL = str(ROOT / "traces" / "partial-copy.yaml")

needs_two = pytest.mark.skipif((os.cpu_count() or 1) < 2,
                               reason="needs two cores for a process pool")

# the unit function each command hands its pool, by module and name
UNIT_FUNCTIONS = {"check": ("kpool_cli.check", "_result_of"),
                  "diff": ("kpool_cli.diff.runs", "run_unit")}


def _run_with_half_written_results(command: str, then: str) -> subprocess.CompletedProcess:
    """`kpool COMMAND -j 2` on two traces, each worker writing half of its result's
    bytes to the pool's pipe and then doing `then` (Python, with PARENT the parent's
    pid), never writing the rest."""
    module, name = UNIT_FUNCTIONS[command]
    script = textwrap.dedent(f"""
        import importlib, os, signal, sys
        import multiprocessing.connection as mc

        PARENT = os.getpid()
        mod = importlib.import_module({module!r})
        unit_function = getattr(mod, {name!r})

        def half_written(unit, *args):  # found by name in the forked worker
            result = unit_function(unit, *args)

            def send(self, buf, write=os.write):
                write(self._handle, bytes(buf[:max(1, len(buf) // 2)]))
                {then}

            mc.Connection._send = send
            return result

        setattr(mod, {name!r}, half_written)
        sys.argv = ["kpool", {command!r}, {RACE!r}, {PARTIAL!r}, "-j", "2"]
        from kpool_cli.cli.main import run
        run()
        """)
    try:
        return subprocess.run([sys.executable, "-c", script], capture_output=True,
                              text=True, cwd=ROOT, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail(f"kpool {command} -j 2 had not exited after 60 s")


@needs_two
# each command under one signal: the two signals take one path (`workers._stop_now`),
# and so do the two commands (`workers.in_order`)
@pytest.mark.parametrize("command, signum, status, said", [
    ("check", signal.SIGINT, 130, "interrupted"), ("diff", signal.SIGTERM, 143, "terminated")])
def test_an_interrupt_while_a_worker_writes_its_result_exits(command, signum, status, said):
    """The worker stops (SIGSTOP) with half its result written, after signalling its
    parent: the parent ends its workers and says so, and on HEAD then hung in the
    interpreter's exit, joining the executor's thread stuck reading the half result.
    Now the parent closes its own copy of the pipe's write end once the workers are
    gone, the half message ends in end of file, and the thread ends with it."""
    then = f"os.kill(PARENT, {int(signum)}); os.kill(os.getpid(), signal.SIGSTOP)"
    r = _run_with_half_written_results(command, then)
    assert r.returncode == status, (r.returncode, r.stderr)
    assert r.stderr == f"kpool: {said}\n"


@needs_two
@pytest.mark.parametrize("command", ["check", "diff"])
def test_a_worker_killed_while_it_writes_its_result_is_a_dead_worker(command):
    """A worker SIGKILLed with half its result written: the executor's thread waited for
    the rest for ever and never looked at the workers, so the command waited for ever
    too (on HEAD), where a worker killed at any other moment is exit 2 and one line.
    The wait for a result now looks at the workers every POLL_SECONDS."""
    r = _run_with_half_written_results(command, "os.kill(os.getpid(), signal.SIGKILL)")
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert r.stderr.startswith("kpool: a worker process died (killed by SIGKILL)"), r.stderr
    assert "--jobs 1" in r.stderr and r.stderr.count("\n") == 1
    assert "Traceback" not in r.stderr


@needs_two
def test_a_second_ctrl_c_while_the_workers_are_ended_still_exits():
    """Ctrl-C pressed again while the parent ends its workers: each worker stops (SIGSTOP)
    with half its result written, as above, and a second SIGINT comes 0.3 s after the
    first, while the parent waits (1 s) for a stopped worker to end. That signal cut the
    stop short: the stopped worker was never killed, the pipe's write end never closed,
    and the process printed "interrupted" and hung at exit, joining the executor's
    thread. It is now raised once the workers are ended."""
    then = ("import subprocess; "
            "subprocess.Popen(['sh', '-c', f'sleep 0.3; kill -INT {PARENT}']); "
            "os.kill(PARENT, signal.SIGINT); os.kill(os.getpid(), signal.SIGSTOP)")
    r = _run_with_half_written_results("check", then)
    assert r.returncode == 130, (r.returncode, r.stderr)
    assert r.stderr == "kpool: interrupted\n"


@needs_two
@pytest.mark.skipif(not hasattr(signal, "SIGRTMIN"), reason="no real-time signals")
def test_a_worker_killed_by_a_signal_without_a_name_is_a_dead_worker():
    """A worker ended, half its result written, by a real-time signal (SIGRTMIN + 6, 40
    on Linux): `signal.Signals` has no member for it, and naming it raised ValueError,
    "kpool: internal error", where a dead worker is due."""
    signum = int(signal.SIGRTMIN) + 6
    r = _run_with_half_written_results("check", f"os.kill(os.getpid(), {signum})")
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert r.stderr.startswith(f"kpool: a worker process died (killed by signal {signum}):")
    assert r.stderr.count("\n") == 1


def _second_signal_then(signum: int, sender: str, lock: str) -> str:
    """`then` for `_run_with_half_written_results`: the first worker to get there starts
    `sender` (sh, with PARENT the parent's pid) and every worker sends `signum` to the
    parent and stops (SIGSTOP), half its result written."""
    return ("import subprocess; "
            f"first = not os.path.exists({lock!r}) and not open({lock!r}, 'w').close(); "
            f"first and subprocess.Popen(['sh', '-c', f{sender!r}], "
            "stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); "
            f"os.kill(PARENT, {int(signum)}); os.kill(os.getpid(), signal.SIGSTOP)")


@needs_two
def test_ctrl_c_held_down_while_the_workers_are_ended_does_not_delay_the_end(tmp_path):
    """Ctrl-C held down (a SIGINT every 0.2 s, for 30 s at most) while the parent ends a
    worker stopped with half its result written: each signal started the stop's steps
    again, the 1 s wait for the stopped worker with them, so it was never killed and
    kpool ran until the signals stopped (31.7 s). A signal during the stop now kills
    the workers at once: kpool exits while Ctrl-C is still held."""
    sent = tmp_path / "sent"
    sender = ("i=0; while [ $i -lt 150 ] && kill -INT {PARENT} 2>/dev/null; "
              f"do i=$((i+1)); sleep 0.2; done; echo $i > {sent}")
    r = _run_with_half_written_results(
        "check", _second_signal_then(signal.SIGINT, sender, str(tmp_path / "lock")))
    assert r.returncode == 130, (r.returncode, r.stderr)
    assert r.stderr == "kpool: interrupted\n"
    for _ in range(400):  # the sender sees the parent gone within 0.2 s of its end
        if sent.exists() and sent.read_text().strip():
            break
        time.sleep(0.1)
    assert int(sent.read_text()) < 150, "kpool ran until the last Ctrl-C"


@needs_two
def test_a_ctrl_c_after_a_sigterm_while_the_workers_are_ended_is_still_a_sigterm(tmp_path):
    """SIGTERM, then a Ctrl-C 0.3 s later while the parent waits for a stopped worker to
    end: the Ctrl-C, raised once the stop was done, replaced the SIGTERM, and the run
    ended "interrupted", 130. The first signal decides, as `signals` keeps the first:
    "terminated", 143 (README's exit status of a SIGTERM)."""
    r = _run_with_half_written_results("check", _second_signal_then(
        signal.SIGTERM, "sleep 0.3; kill -INT {PARENT}", str(tmp_path / "lock")))
    assert r.returncode == 143, (r.returncode, r.stderr)
    assert r.stderr == "kpool: terminated\n"
