"""Signals held while numba compiles.

Owns: `signals_held()`, a context manager that blocks SIGINT and SIGTERM in the
calling thread and delivers any that arrived when it ends. numba compiles (or
loads its cache) partly inside llvmlite's ctypes callbacks, where the exception a
Ctrl-C raises is printed and lost, and the run went on to exit 0. Held, the signal
is answered right after the compilation, in plain Python code.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
