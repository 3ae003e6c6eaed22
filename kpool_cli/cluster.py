"""Work that can grow, run on an existing Dask distributed cluster (`kpool fuzz --dask`).

Owns: `in_order_dask(fn, units, address)` and `ClusterError`. The contract is the one of
`workers.in_order`: a unit is plain, picklable data and `fn` a module-level function of
it alone (importable on the workers: kpool is installed there), so a unit's result is
the same here, in a local pool or on the cluster.

Invariants: results come back in the order of `units`, whatever order the tasks finish
in; the first error (in that order) is raised as the task raised it (its type and
message), after `retries` further attempts; a task whose worker is lost is run again on
another worker by the scheduler, so no result is lost; each task is submitted `pure`,
keyed by a hash of `fn` and its unit, so a resubmission of the same unit is the same
task, not a second one; at most `window` units are submitted or held (done, not yet
yielded) at once, so a campaign of 100,000 units never sits in the scheduler whole;
results are fetched as they complete. When the caller stops early (an error, Ctrl-C, a
closed generator) every task not yet done is cancelled and the connection closed; a
task already running finishes on its worker and its result is dropped (a thread cannot
be ended from outside).

Dask is an optional extra (`pip install 'kpool[dask]'`): it is imported only when a
campaign runs on a cluster. Its absence, an address that is none (no port, a port
past 65535, a host that cannot be one: said at once, not after the timeout), a
protocol kpool does not configure (tls://, ucx://), or no scheduler answering at the
address within `connect_timeout` seconds, is a `ClusterError` with a message for the
user.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

U = TypeVar("U")
R = TypeVar("R")

DEFAULT_WINDOW = 2000
DEFAULT_CONNECT_TIMEOUT = 10.0


class ClusterError(Exception):
    """The campaign cannot run on the cluster: the dask extra is not installed, the
    address is none, or no scheduler answers at it. The CLI reports it and exits 2."""


def in_order_dask(fn: Callable[[U], R], units: Sequence[U], address: str, *,
                  retries: int = 3, window: int = DEFAULT_WINDOW,
                  connect_timeout: float = DEFAULT_CONNECT_TIMEOUT) -> Iterator[R]:
    """`fn(unit)` for every unit, on the Dask cluster whose scheduler is at `address`
    (`tcp://HOST:8786`), yielded in the order of `units`."""
    if window < 1:
        raise ValueError(f"window must be at least 1, not {window}")
    try:
        import distributed
    except ImportError as e:
        raise ClusterError("running on a Dask cluster needs the dask extra: "
                           "pip install 'kpool[dask]'") from e
    client = _connect(distributed, address, connect_timeout)
    try:
        yield from _run(distributed, client, fn, units, retries, window)
    finally:
        client.close()


def _connect(distributed: Any, address: str, timeout: float) -> Any:
    """A client of the scheduler at `address`, or a `ClusterError` within `timeout`.

    The address is probed first, by one connection that asks for the peer's identity
    and must hear a scheduler's within the timeout: a `Client` that fails to connect
    is left half-built (its finaliser would print a traceback later), and one that
    reaches something else waits past its timeout for a reply that never comes (an
    HTTP server, a silent port) or reads a banner as a frame's length and asks for
    exabytes (an SSH server). A peer that tells a scheduler's identity and then does
    not take the client is a `ClusterError` too, the half-built client put down."""

    async def probe() -> Any:
        try:
            comm = await distributed.comm.connect(address, timeout=timeout)
        except TypeError as e:  # a protocol that needs what kpool does not pass
            raise _NoConnection(e) from None
        try:
            await comm.write({"op": "identity", "reply": True})
            return await comm.read()
        finally:
            comm.abort()

    start = "start one with `dask scheduler` and give its tcp://HOST:PORT"
    port = _PORT.search(address)
    if port is not None and not 0 < int(port.group(1)) < 65536:
        raise ClusterError(f"not a Dask scheduler address: {address!r} (port "
                           f"{port.group(1)} is out of range 1..65535); {start}")
    try:
        who = asyncio.run(asyncio.wait_for(probe(), timeout))
    except ValueError as e:  # no port, an unknown protocol, a host that cannot be one
        raise ClusterError(f"not a Dask scheduler address: {address!r} ({_why(e)}); "
                           f"{start}") from None
    except (OSError, TimeoutError) as e:  # nothing listening (retried to the timeout)
        raise ClusterError(f"no Dask scheduler answered at {address!r} within "
                           f"{timeout:g} s ({_why(e)}); {start}") from None
    except _NoConnection as e:
        raise ClusterError(f"cannot connect to {address!r} ({_why(e.cause)}): kpool connects "
                           "without a TLS context or UCX; " + start) from None
    except Exception as e:  # what a peer that speaks another protocol sent (garbage)
        who = e
    if not (isinstance(who, dict) and who.get("type") == "Scheduler"):
        raise ClusterError(f"what answered at {address!r} is not a Dask scheduler "
                           f"(it did not tell a scheduler's identity); {start}")
    # made, then started: a client whose start fails is still ours to put down
    client = distributed.Client.__new__(distributed.Client)
    try:
        client.__init__(address, timeout=timeout, set_as_default=False)
    except Exception as e:  # a peer that told a scheduler's identity and is none
        _put_down(client)
        raise ClusterError(f"the Dask scheduler at {address!r} did not take a client within "
                           f"{timeout:g} s ({_why(e)})") from None
    return client


# an address's port, when it ends in one
_PORT = re.compile(r":(\d{1,12})$")


class _NoConnection(Exception):
    """The connection itself failed other than by a refusal or a timeout: a protocol
    (tls://, ucx://) that needs a configuration kpool does not pass."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


def _put_down(client: Any) -> None:
    """A client whose start failed, left with nothing of it running: its event loop's
    thread stopped, and marked closed, so that its finaliser does not close it again,
    which waits twice the connect timeout for a peer that never answers and then
    prints a traceback as the process exits."""
    client.status = "closed"
    runner = getattr(client, "_loop_runner", None)  # made before the start, if at all
    if runner is not None:
        runner.stop()


def _why(e: BaseException) -> str:
    """An exception as a message quotes it: its type, and what it says if anything."""
    return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__


def _run(distributed: Any, client: Any, fn: Callable[[U], R], units: Sequence[U],
         retries: int, window: int) -> Iterator[R]:
    """Submit a window of units, fetch results as they complete, yield them in order.

    Every unit submitted and not yet yielded is either running (its future) or done
    (its result, or the exception it raised, kept for its turn): the two together
    never hold more than `window` units."""
    running: dict[int, Any] = {}  # index -> future
    done: dict[int, tuple[bool, Any]] = {}  # index -> (ok, result or exception)
    index_of: dict[Any, int] = {}  # future (by identity) -> index
    completed = distributed.as_completed(loop=client.loop)
    submitted = 0
    try:
        for head in range(len(units)):
            while submitted < len(units) and len(running) + len(done) < window:
                # a repeated unit has the same key: the scheduler runs it once
                future = client.submit(fn, units[submitted], pure=True, retries=retries)
                running[submitted] = future
                index_of[future] = submitted
                completed.add(future)
                submitted += 1
            while head not in done:
                future = next(completed)
                try:
                    outcome: tuple[bool, Any] = (True, future.result())
                except Exception as e:  # the task's own exception, kept for its turn
                    outcome = (False, e)
                i = index_of.pop(future)
                done[i] = outcome
                del running[i]
            ok, value = done.pop(head)
            if not ok:
                raise value
            yield value
    finally:
        if running:
            client.cancel(list(running.values()))
