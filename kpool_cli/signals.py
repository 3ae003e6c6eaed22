"""Ctrl-C, SIGTERM, SIGHUP and the other signals that end a process (`TERMINATING`), as
exceptions raised where the program is (so that `finally` blocks run: an output's
temporary file is removed, a JSON document is closed), and the spans of work they
must not cut in two.

Owns: `Terminated` (SIGTERM, SIGHUP when the terminal goes away, SIGQUIT...: a
KeyboardInterrupt, so that what ends cleanly on Ctrl-C ends cleanly on them too; it
carries the signal, for the exit status 128 + its number), `install()` (the handlers:
SIGINT raises KeyboardInterrupt, SIGTERM and SIGHUP Terminated, and so does each
other of TERMINATING whose action would kill the process: a handler of the
caller's own stays), `held()` and
`masked()`:
- inside `held()`, a signal that arrives is kept and raised as the block ends, so it
  lands between two records of a stream, never inside one. Python runs a handler in
  the main thread between two bytecodes, whichever thread the kernel gave the
  signal to, so holding is a flag the handlers read, not a signal mask (numpy's
  threads would take a masked signal);
- `masked()` blocks SIGINT and TERMINATING in the calling thread while numba compiles (or
  loads its cache), partly inside llvmlite's ctypes callbacks, where the exception a
  handler raises is printed and lost (the run went on to exit 0): masked, the signal
  is answered right after, in plain Python code. It also holds, for the signals a
  thread of numpy's takes.

- `settle()` and `unsettle()`: once a JSON report's status is decided (its summary
  written), the run it describes is over: a signal that comes later is kept for the
  next report (`unsettle()`, as that report starts, raises it) and, when no report
  follows, dropped, so the exit status never contradicts the document's status.
  `pending()` says whether a signal is kept, for the status decided under `held()`.

- a signal whose exception Python drops (raised in a gc or weakref callback) is kept,
  and `install()`'s hook of unraisable exceptions says nothing of it: without the hook
  Python prints "Exception ignored in: <gc callback>" and a traceback on stderr before
  the run ends as interrupted. Any other unraisable exception reaches the hook that
  was in place.

Invariant: without `install()` (kpool as a library) nothing is held: the default
handlers apply. `install()` starts unsettled, with nothing kept.
"""

from __future__ import annotations

import contextlib
import signal
import sys
from collections.abc import Callable, Iterator
from types import FrameType


class Terminated(KeyboardInterrupt):
    """SIGTERM, SIGHUP or another of TERMINATING (`signum`), raised where the program
    is, before exit 128 + `signum` (143, 129, ...)."""

    def __init__(self, signum: int = signal.SIGTERM) -> None:
        super().__init__()
        self.signum = signum


# the signals whose default action ends the process, which `install()` turns into
# Terminated so that an output's temporary file is removed on the way out: SIGTERM,
# SIGHUP, and the others a user or a limit sends (Ctrl-\, `ulimit -t`'s soft limit,
# `timeout -s`, a tool's alarm): SIGPIPE is the CLI's own (a reader that left), and
# SIGKILL cannot be caught
TERMINATING = tuple(getattr(signal, name) for name in (
    "SIGTERM", "SIGHUP", "SIGQUIT", "SIGXCPU", "SIGALRM", "SIGUSR1", "SIGUSR2",
    "SIGVTALRM", "SIGPROF") if hasattr(signal, name))
# the signals `install()` ends a run on, and `masked()` blocks
_ENDING = (signal.SIGINT, *TERMINATING)
# those it handles whatever handler it finds (one the caller ignores aside)
_ALWAYS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


_depth = 0  # how many `held()` blocks the main thread is in
_kept: KeyboardInterrupt | None = None  # the first signal that came while held (or settled)
_settled = False  # a report's status is decided: a signal now waits for the next one


def _raise(exc: KeyboardInterrupt) -> None:
    # kept even when raised: a handler can run inside a gc or weakref callback, whose
    # exceptions Python prints and drops ("Exception ignored"); the next `held()`
    # boundary, or the CLI's `lost()` at exit, answers it then
    global _kept
    _kept = _kept or exc
    if _depth or _settled:
        return
    raise exc


def lost() -> KeyboardInterrupt | None:
    """The signal that came and is neither settled nor answered by now: one Python
    dropped (raised in a callback), or one kept past the last `held()` block."""
    return None if _settled else _kept


def pending() -> bool:
    """A signal came and is kept (under `held()`, or settled)."""
    return _kept is not None


def settle() -> None:
    """The status of what was written is decided: a later signal is kept, raised by
    the next `unsettle()`, or dropped at exit when none comes."""
    global _settled
    _settled = True


def unsettle() -> None:
    """More work starts: raise the signal kept since `settle()`, if any."""
    global _settled, _kept
    _settled = False
    if _kept is not None and not _depth:
        exc, _kept = _kept, None
        raise exc


def _on_sigint(signum: int, frame: FrameType | None) -> None:
    _raise(KeyboardInterrupt())


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    _raise(Terminated(signum))


_unraisable_before: Callable[[sys.UnraisableHookArgs], object] = sys.__unraisablehook__


def _on_unraisable(u: sys.UnraisableHookArgs) -> None:
    # a signal of ours that Python dropped is kept (`_raise`): `lost()` answers it
    if isinstance(u.exc_value, KeyboardInterrupt) and _kept is not None:
        return
    _unraisable_before(u)


def install() -> None:
    """The CLI's handlers of SIGINT and TERMINATING (main thread only; a signal the
    process was started ignoring stays ignored), and the hook that keeps a dropped
    signal's exception off stderr."""
    global _settled, _kept, _depth, _unraisable_before
    _settled, _kept, _depth = False, None, 0
    for signum, handler in ((signal.SIGINT, _on_sigint),
                            *((s, _on_sigterm) for s in TERMINATING)):
        # one the caller ignores stays ignored: `nohup kpool ...` ignores SIGHUP, a
        # shell script's background job SIGINT; and beyond INT, TERM and HUP, a
        # handler of the caller's own stays (a test harness's SIGALRM, a sampling
        # profiler's SIGPROF): only a signal that would kill the process is taken
        now = signal.getsignal(signum)
        if now is not signal.SIG_IGN and (signum in _ALWAYS or now is signal.SIG_DFL):
            signal.signal(signum, handler)
    if sys.unraisablehook is not _on_unraisable:
        _unraisable_before = sys.unraisablehook
        sys.unraisablehook = _on_unraisable


class _Held:
    """`held()`'s block (a class, not a generator: a report enters one for each record,
    and a generator's context costs 1.5 us more)."""

    __slots__ = ()

    def __enter__(self) -> None:
        global _depth
        _depth += 1

    def __exit__(self, *exc: object) -> None:
        global _depth, _kept
        _depth -= 1
        if not _depth and _kept is not None and not _settled:
            kept, _kept = _kept, None
            raise kept


_HELD = _Held()


def held() -> _Held:
    """A signal that comes during the block is raised as the block ends."""
    return _HELD


@contextlib.contextmanager
def masked() -> Iterator[None]:
    """SIGINT and TERMINATING blocked in this thread (and held) for the block."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, set(_ENDING))
    try:
        with held():
            yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
