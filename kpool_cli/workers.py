"""Work that can grow, run on a process pool: one pure function over units of work
(a trace under an engine, for `kpool diff -j` and `kpool check --jobs`).

Owns: `in_order(fn, units, jobs)`, and `WorkerDied`, its error when a worker dies. A
unit is plain, picklable data and `fn` a module-level function of it alone, so the
same call runs in this process, in a local pool, or on any executor that can pickle
them.

Invariants: results come back in the order of `units`, whatever order the workers
finish in, with at most `WINDOW_PER_WORKER` units a worker submitted ahead (a long
sequence of units is read as it goes, never made whole); the first error (in that
order) is raised as the worker raised it; on an error or an interrupt (Ctrl-C,
SIGTERM) the workers are ended at once, not waited for, and so is the executor's
manager thread, even one a worker ended in the middle of its result left waiting
for the rest of it (so the process exits); a signal that comes while they are
ended has them killed at once, and is raised once they are unless a signal began
the stop (the first signal decides the exit status, as in `signals`); a worker that
dies is WorkerDied within `POLL_SECONDS`, whatever it was doing, whatever signal
killed it; a worker ignores Ctrl-C (only the parent answers it, so no worker prints
a traceback).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, TypeVar

from .signals import TERMINATING

if TYPE_CHECKING:  # multiprocessing: imported by a run that starts a pool
    from concurrent.futures import Future, ProcessPoolExecutor
    from multiprocessing.process import BaseProcess

U = TypeVar("U")
R = TypeVar("R")

MAX_JOBS = 256  # the most processes a command (or a settings file's `jobs`) may ask for
WINDOW_PER_WORKER = 4  # units submitted ahead of the results, per worker
POLL_SECONDS = 0.5  # how often a wait for a result looks whether a worker died
MANAGER_SECONDS = 10  # the longest a stop waits for the executor's manager thread


def workers_for(jobs: int, n_units: int) -> int:
    """The processes `jobs` gives for `n_units` units: never more than the units, the
    machine's cores, or MAX_JOBS."""
    return max(1, min(jobs, n_units, os.cpu_count() or 1, MAX_JOBS))


def in_order(fn: Callable[[U], R], units: Sequence[U], jobs: int = 1) -> Iterator[R]:
    """`fn(unit)` for every unit, in order: here when `workers_for` gives 1, else on a
    pool of that many processes."""
    n = workers_for(jobs, len(units))
    if n <= 1:
        for u in units:
            yield fn(u)
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    global _fork_hook
    # the workers are forked (Python 3.14 makes forkserver Linux's default: a worker's
    # parent would be the server, and the death signal and the hook below the
    # server's), where the system can
    fork = sys.platform == "linux" and "fork" in multiprocessing.get_all_start_methods()
    if fork and not _fork_hook:  # from the fork on, before the worker runs a line
        os.register_at_fork(after_in_child=_worker_signals)
        _fork_hook = True
    pool = ProcessPoolExecutor(max_workers=n, initializer=_worker_init,
                               initargs=(os.getpid() if fork else None,),
                               mp_context=multiprocessing.get_context("fork" if fork
                                                                      else None))
    # a window of units in flight, not all of them: `kpool fuzz --runs 10000000` made
    # ten million futures before its first result (28 s and 1.5 GB past a 2 s budget)
    pending = iter(units)
    window: deque = deque()

    def submit(u: U) -> None:
        global _forking
        _forking = True  # the hook acts for this pool's workers alone: the pool forks
        try:             # them in a submit
            window.append(pool.submit(fn, u))
        finally:
            _forking = False

    try:
        for u in itertools.islice(pending, WINDOW_PER_WORKER * n):
            submit(u)
        while window:
            result = _result(window.popleft(), pool)
            for u in itertools.islice(pending, 1):
                submit(u)
            yield result
    except BrokenProcessPool as e:
        _stop_now(pool, e)
        raise WorkerDied.of(str(e)) from None
    except BaseException as e:
        _stop_now(pool, e)
        raise
    pool.shutdown(wait=True)


class WorkerDied(Exception):
    """A worker process ended without its result (killed by the OOM killer or a
    signal): the command ends with exit 2 and this message, every other worker
    ended."""

    @classmethod
    def of(cls, why: str) -> WorkerDied:
        return cls(f"a worker process died ({why}): the OOM killer or a signal ends one "
                   "so; run with --jobs 1 to see why")


def _result(future: Future[R], pool: ProcessPoolExecutor) -> R:
    """`future`'s result, or WorkerDied once a worker of `pool` has died. The executor
    finds a dead worker by itself only between two results: one killed while it wrote
    its result (a large summary takes a while) leaves half a message in the pipe, which
    the executor's manager thread waits to read the rest of for ever, and the future
    never ends."""
    from concurrent.futures import wait

    while not wait([future], timeout=POLL_SECONDS).done:
        for w in _workers_of(pool):
            code = w.exitcode
            if code is not None:
                raise WorkerDied.of(_how_it_ended(code))
    return future.result()


def _workers_of(pool: ProcessPoolExecutor) -> list[BaseProcess]:
    """`pool`'s worker processes, from its process table (none once it is shut down:
    the table is dropped then)."""
    return list((getattr(pool, "_processes", None) or {}).values())


def _how_it_ended(exitcode: int) -> str:
    """A dead worker's `exitcode` in words: "killed by SIGKILL", "exit status 3", or
    "killed by signal 40" for a signal `signal.Signals` has no name for (the real-time
    signals between SIGRTMIN and SIGRTMAX: its lookup of one raised ValueError, an
    internal error where WorkerDied was due)."""
    if exitcode >= 0:
        return f"exit status {exitcode}"
    try:
        return f"killed by {signal.Signals(-exitcode).name}"
    except ValueError:
        return f"killed by signal {-exitcode}"


def _worker_init(parent: int | None = None) -> None:
    """Ctrl-C reaches every process of the terminal's process group: only the parent
    answers it (and stops the workers), so a worker never prints a traceback. SIGTERM
    (and the other TERMINATING signals) ends a worker at once: the parent's handler (an
    exception, so that its files are cleaned up) is inherited through fork and would
    let the worker run on. A worker dies with its parent (`parent`, its pid; None
    where the workers are not forked), even one SIGKILL ended (the OOM killer, a CI
    job's hard stop), which has no chance to end its workers: on Linux the kernel
    sends SIGKILL (PR_SET_PDEATHSIG); a parent gone before that was set leaves the
    worker to a new parent, which it sees and exits."""
    _worker_handlers()
    if sys.platform == "linux":
        import ctypes

        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if parent is not None and os.getppid() != parent:
        os._exit(1)


_PR_SET_PDEATHSIG = 1  # linux/prctl.h
_fork_hook = False  # `_worker_signals` is registered to run after every fork ...
_forking = False  # ... and acts while `in_order` submits to its pool, which forks then


def _worker_signals() -> None:
    """A worker's handlers (`_worker_init`), set in the child right after the fork: a
    SIGTERM that comes before the pool runs the initializer would otherwise raise the
    parent's Terminated in the worker, which multiprocessing reports on stderr
    ("Process ForkProcess-1:") and the worker may catch. Any other fork of the process
    (a `subprocess` with `preexec_fn`) keeps its handlers."""
    if _forking:
        _worker_handlers()


def _worker_handlers() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for signum in TERMINATING:
        signal.signal(signum, signal.SIG_DFL)


def _stop_now(pool: ProcessPoolExecutor, cause: BaseException) -> None:
    """Cancel what has not started and end the workers now: a unit can run for
    minutes, and `shutdown(wait=True)` would wait for it. Then end the executor's
    manager thread, which the interpreter joins at exit: `shutdown` forgets it, and
    it may be reading a result that a worker ended now (or before) left half
    written, whose rest it would wait for ever (the process printed "interrupted"
    and never exited). `cause` is what stops the pool.

    A signal that comes meanwhile (Ctrl-C pressed again, or held down; a SIGTERM
    after it) does not cut the stop short, which left a worker slow to end alive
    and the pipe open (the process hung at exit as before): the steps are done
    again, the workers killed at once (the signal is a hurry), the thread waited
    for no longer than `MANAGER_SECONDS` in all, so that signals that keep coming
    never keep the stop from its end. It is raised once they are done, unless
    `cause` is itself a signal: the first signal decides the exit status (SIGTERM,
    then Ctrl-C, is 143), as `signals` keeps the first."""
    # the shutdowns below forget all three, so they are taken first
    manager = getattr(pool, "_executor_manager_thread", None)
    results = getattr(pool, "_result_queue", None)
    workers = _workers_of(pool)
    late: KeyboardInterrupt | None = None
    until: float | None = None
    while True:  # each step is done again harmlessly when a signal cut it short
        try:
            _end_workers(pool, workers, at_once=late is not None)
            # the workers are gone, so kpool's own copy is the last open write end of
            # the results' pipe: closed, the half message ends in end of file, which
            # the thread takes for a broken pool, and it ends
            if results is not None:
                with contextlib.suppress(OSError, AttributeError):
                    results._writer.close()
            # joined here, the thread has closed its wakeup pipe before the
            # interpreter's exit hook would write to it as it closes ("Bad file
            # descriptor")
            if manager is not None and manager.is_alive():
                until = until or time.monotonic() + MANAGER_SECONDS
                manager.join(timeout=max(0.0, until - time.monotonic()))
            break
        except KeyboardInterrupt as e:  # Terminated too
            late = late or e
    if late is not None and not isinstance(cause, KeyboardInterrupt):
        raise late


def _end_workers(pool: ProcessPoolExecutor, workers: list[BaseProcess], *,
                 at_once: bool = False) -> None:
    """End `workers`, `pool`'s processes (taken before a shutdown forgets them): asked
    to (SIGTERM), and killed when still alive a second later; killed `at_once`."""
    terminate = getattr(pool, "terminate_workers", None)  # Python >= 3.14
    if terminate is not None and not at_once:
        terminate()
        return
    # before 3.14 the executor has no public way to end its workers; its process
    # table is the documented-by-source way the 3.14 method itself uses
    pool.shutdown(wait=False, cancel_futures=True)
    for w in workers:
        if at_once:
            w.kill()
        else:
            w.terminate()
    for w in workers:
        w.join(timeout=1)
    # a worker forked just now may not have run `_worker_init` yet: it still holds the
    # parent's SIGTERM handler, an exception it can catch and run on (a loaded
    # machine's suite saw the shutdown below wait on one): SIGKILL cannot be caught
    for w in workers:
        if w.is_alive():
            w.kill()
            w.join(timeout=1)
