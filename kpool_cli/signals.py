"""Ctrl-C and SIGTERM, as exceptions raised where the program is (so that `finally`
blocks run: an output's temporary file is removed, a JSON document is closed), and
the spans of work they must not cut in two.

Owns: `Terminated` (SIGTERM; a KeyboardInterrupt, so that what ends cleanly on Ctrl-C
ends cleanly on it too), `install()` (the handlers: SIGINT raises KeyboardInterrupt,
SIGTERM Terminated), `held()` and `masked()`:
- inside `held()`, a signal that arrives is kept and raised as the block ends, so it
  lands between two records of a stream, never inside one. Python runs a handler in
  the main thread between two bytecodes, whichever thread the kernel gave the
  signal to, so holding is a flag the handlers read, not a signal mask (numpy's
  threads would take a masked signal);
- `masked()` blocks SIGINT and SIGTERM in the calling thread while numba compiles (or
  loads its cache), partly inside llvmlite's ctypes callbacks, where the exception a
  handler raises is printed and lost (the run went on to exit 0): masked, the signal
  is answered right after, in plain Python code. It also holds, for the signals a
  thread of numpy's takes.

Invariant: without `install()` (kpool as a library) nothing is held: the default
handlers apply.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from types import FrameType


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the program is, before exit 143."""


_depth = 0  # how many `held()` blocks the main thread is in
_kept: KeyboardInterrupt | None = None  # the first signal that came while held


def _raise(exc: KeyboardInterrupt) -> None:
    global _kept
    if _depth:
        _kept = _kept or exc
        return
    raise exc


def _on_sigint(signum: int, frame: FrameType | None) -> None:
    _raise(KeyboardInterrupt())


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    _raise(Terminated())


def install() -> None:
    """The CLI's handlers of SIGINT and SIGTERM (main thread only)."""
    signal.signal(signal.SIGINT, _on_sigint)
    signal.signal(signal.SIGTERM, _on_sigterm)


@contextlib.contextmanager
def held() -> Iterator[None]:
    """A signal that comes during the block is raised as the block ends."""
    global _depth, _kept
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        if not _depth and _kept is not None:
            exc, _kept = _kept, None
            raise exc


@contextlib.contextmanager
def masked() -> Iterator[None]:
    """SIGINT and SIGTERM blocked in this thread (and held) for the block."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        with held():
            yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
