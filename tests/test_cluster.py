"""`cluster.in_order_dask` on a local two-worker Dask cluster: the contract of
`workers.in_order` (order, errors), a lost worker loses no result, a missing scheduler
fails fast, and a fuzz campaign on the cluster equals the local one."""

from __future__ import annotations

import gc
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kpool_cli import cluster, workers
from kpool_cli.gen import fuzz

# the `dask` extra is optional: without it these tests skip, except under CI, whose
# environment installs the test extra (which includes it) and must run them
distributed = (__import__("distributed") if os.environ.get("CI")
               else pytest.importorskip("distributed"))


@pytest.fixture(scope="module")
def address() -> Iterator[str]:
    """One cluster for the module: two worker processes of one thread each."""
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=":0") as lc:
        yield lc.scheduler_address


def square(n: int) -> int:
    return n * n


def slow_first(unit: tuple[int, float]) -> int:
    """The unit's number, after sleeping its delay: the first unit sleeps, the others
    finish before it."""
    n, delay = unit
    time.sleep(delay)
    return n


def fail_on(unit: tuple[int, float, bool]) -> int:
    n, delay, bad = unit
    time.sleep(delay)
    if bad:
        raise ValueError(f"unit {n} is bad")
    return n


def kill_worker_once(unit: tuple[str, int]) -> int:
    """The first run of a unit ends its worker's process; a run after it returns."""
    marker, n = unit
    if not os.path.exists(marker):
        Path(marker).touch()
        os._exit(1)
    return n + 100


def fail_once(unit: tuple[str, int]) -> int:
    """The first run of a unit raises; a run after it returns."""
    marker, n = unit
    if not os.path.exists(marker):
        Path(marker).touch()
        raise RuntimeError("flaky")
    return n


def test_equals_a_local_run(address: str) -> None:
    units = [*range(23), 5, 5]  # a repeated unit is one task, answered twice
    local = list(workers.in_order(square, units, 1))
    assert local[-3:] == [22 * 22, 25, 25]
    assert list(cluster.in_order_dask(square, units, address)) == local


def test_a_window_smaller_than_the_units(address: str) -> None:
    units = list(range(40))
    assert list(cluster.in_order_dask(square, units, address, window=3)) == [
        n * n for n in units]


def test_order_is_kept_when_later_units_finish_first(address: str) -> None:
    units = [(0, 1.0), (1, 0.0), (2, 0.0), (3, 0.0), (4, 0.0)]
    # completion order would be 1..4 (on the free worker) then 0
    assert list(cluster.in_order_dask(slow_first, units, address)) == [0, 1, 2, 3, 4]


def test_an_error_is_raised_as_the_task_raised_it(address: str) -> None:
    units = [(0, 0.0, False), (1, 0.0, False), (2, 0.0, True), (3, 0.0, False)]
    with pytest.raises(ValueError, match=r"^unit 2 is bad$"):
        list(workers.in_order(fail_on, units, 1))
    got: list[int] = []
    with pytest.raises(ValueError, match=r"^unit 2 is bad$"):
        for r in cluster.in_order_dask(fail_on, units, address, retries=0):
            got.append(r)
    assert got == [0, 1]  # the results before the error were yielded


def test_the_first_error_in_order_wins(address: str) -> None:
    # unit 3 fails at once, unit 1 a moment later: unit 1 comes first in order
    units = [(0, 0.0, False), (1, 0.5, True), (2, 0.0, False), (3, 0.0, True)]
    with pytest.raises(ValueError, match=r"^unit 1 is bad$"):
        list(cluster.in_order_dask(fail_on, units, address, retries=0))


def test_a_failing_task_is_retried(address: str, tmp_path: Path) -> None:
    units = [(str(tmp_path / "a"), 1), (str(tmp_path / "b"), 2)]
    assert list(cluster.in_order_dask(fail_once, units, address, retries=1)) == [1, 2]
    units = [(str(tmp_path / "c"), 3)]
    with pytest.raises(RuntimeError, match=r"^flaky$"):
        list(cluster.in_order_dask(fail_once, units, address, retries=0))


def test_a_lost_worker_loses_no_result(address: str, tmp_path: Path) -> None:
    units = [(str(tmp_path / "m0"), 0), (str(tmp_path / "m1"), 1)]
    assert list(cluster.in_order_dask(kill_worker_once, units, address)) == [100, 101]
    assert (tmp_path / "m0").exists() and (tmp_path / "m1").exists()  # both died once


def test_no_scheduler_fails_fast_with_a_clear_message(
        capfd: pytest.CaptureFixture[str]) -> None:
    start = time.monotonic()
    with pytest.raises(cluster.ClusterError, match=re.escape(
            "no Dask scheduler answered at 'tcp://127.0.0.1:1' within 1 s")):
        list(cluster.in_order_dask(square, [1], "tcp://127.0.0.1:1", connect_timeout=1))
    assert time.monotonic() - start < 8
    with pytest.raises(cluster.ClusterError, match="missing port number"):
        list(cluster.in_order_dask(square, [1], "nonsense", connect_timeout=1))
    gc.collect()  # no half-built client is left to print a traceback when collected
    assert "Traceback" not in capfd.readouterr().err


@pytest.mark.parametrize(("address", "said"), [
    ("", "not a Dask scheduler address: '' (ValueError: missing port number"),
    ("tcp://[::1", "not a Dask scheduler address: 'tcp://[::1' (ValueError: invalid address"),
    ("tcp://127.0.0.1:99999", "not a Dask scheduler address: 'tcp://127.0.0.1:99999' (port "
                              "99999 is out of range 1..65535)"),
    ("tls://127.0.0.1:1", "cannot connect to 'tls://127.0.0.1:1' (TypeError: TLS expects"),
])
def test_an_address_that_is_none_is_said_so_at_once(address: str, said: str) -> None:
    """A hostile-input campaign (7 December 2026): a malformed address said "no Dask
    scheduler answered ... within 10 s" (it failed at once), a port past 65535 waited
    the whole timeout, and a tls:// address where nothing listens was "not a Dask
    scheduler". Each says what it is, before any wait (a 60 s timeout here)."""
    start = time.monotonic()
    with pytest.raises(cluster.ClusterError, match=re.escape(said)):
        list(cluster.in_order_dask(square, [1], address, connect_timeout=60))
    assert time.monotonic() - start < 30


@pytest.fixture
def not_a_scheduler() -> Iterator[Callable[[bytes | None], str]]:
    """A TCP port on 127.0.0.1 that accepts and then says `greeting` to each
    connection (an SSH server's banner), or nothing (None: a silent port, an HTTP
    server waiting for its request); gives its tcp:// address."""
    servers: list[socket.socket] = []

    def listen(greeting: bytes | None) -> str:
        server = socket.create_server(("127.0.0.1", 0))
        servers.append(server)
        held: list[socket.socket] = []

        def serve() -> None:
            while True:
                try:
                    conn, _ = server.accept()
                except OSError:  # closed: the test is over
                    return
                held.append(conn)
                if greeting is not None:
                    conn.sendall(greeting)

        threading.Thread(target=serve, daemon=True).start()
        return f"tcp://127.0.0.1:{server.getsockname()[1]}"

    yield listen
    for server in servers:
        server.close()


def test_a_peer_that_is_no_scheduler_fails_in_bounded_time_with_a_clear_message(
        not_a_scheduler: Callable[[bytes | None], str],
        capfd: pytest.CaptureFixture[str]) -> None:
    """cluster._connect asks the peer its identity: an SSH banner, read as a frame
    length, once made the client ask for exabytes (a MemoryError, shown as "out of
    memory"), and a silent peer held the client past its timeout for ever. Each is now
    a ClusterError within the connect timeout (1 s here)."""
    banner = not_a_scheduler(b"SSH-2.0-OpenSSH_8.9p1\r\n")
    start = time.monotonic()
    with pytest.raises(cluster.ClusterError, match=re.escape(
            f"what answered at '{banner}' is not a Dask scheduler")):
        list(cluster.in_order_dask(square, [1], banner, connect_timeout=1))
    silent = not_a_scheduler(None)
    with pytest.raises(cluster.ClusterError, match=re.escape(
            f"no Dask scheduler answered at '{silent}' within 1 s (TimeoutError)")):
        list(cluster.in_order_dask(square, [1], silent, connect_timeout=1))
    assert time.monotonic() - start < 8
    gc.collect()
    assert "Traceback" not in capfd.readouterr().err


_FAKE_SCHEDULER = """
import asyncio
from distributed.core import Server

async def main():
    # tells a scheduler's identity, and takes no client (no handler for its register)
    server = Server({"identity": lambda: {"type": "Scheduler", "id": "fake"}})
    await server.listen("tcp://127.0.0.1:0")
    print(server.address, flush=True)
    await asyncio.sleep(300)

asyncio.run(main())
"""


def test_a_peer_that_tells_a_schedulers_identity_and_takes_no_client(
        tmp_path: Path) -> None:
    """`cluster._connect` puts down a client whose start fails (`_put_down`): its
    finaliser closed it again as the process exited, waiting twice the connect timeout
    (10 s) for the peer, then printed a traceback (21 s in all, a TimeoutError). Now
    the command ends with its one-line error, exit 2."""
    fake = subprocess.Popen([sys.executable, "-c", _FAKE_SCHEDULER], stdout=subprocess.PIPE,
                            text=True)
    try:
        address = fake.stdout.readline().strip() if fake.stdout else ""
        assert address.startswith("tcp://")
        start = time.monotonic()
        r = subprocess.run([sys.executable, "-m", "kpool_cli", "fuzz", "--engine", "rep-once",
                            "--runs", "2", "--dask", address], capture_output=True, text=True,
                           timeout=120, cwd=tmp_path)
        took = time.monotonic() - start
    finally:
        fake.kill()
        fake.wait()
    assert r.returncode == 2
    assert r.stderr.startswith(f"kpool: the Dask scheduler at '{address}' did not take a "
                               "client within 10 s"), r.stderr
    assert "Traceback" not in r.stderr and "Exception ignored" not in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert took < 15  # not twice the connect timeout and more


def test_missing_dask_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "distributed", None)  # `import distributed` fails
    with pytest.raises(cluster.ClusterError, match=r"pip install 'kpool\[dask\]'"):
        list(cluster.in_order_dask(square, [1], "tcp://127.0.0.1:8786"))


def test_a_fuzz_campaign_on_the_cluster_equals_the_local_one(address: str) -> None:
    tasks = [fuzz.FuzzTask(seed=seed, engine=engine)
             for engine in ("rep-once", "cache-safe") for seed in range(10)]
    local = list(workers.in_order(fuzz.fuzz_one, tasks, 1))
    remote = list(cluster.in_order_dask(fuzz.fuzz_one, tasks, address))
    assert remote == local  # outcomes, the shrunk traces with them
    shrunk = [s.yaml for o in local for s in o.shrunk]
    assert shrunk  # the comparison covers shrunk traces
    assert [s.yaml for o in remote for s in o.shrunk] == shrunk
