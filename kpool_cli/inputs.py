"""Input files: reading a file kpool was given (a trace, a report, a settings file),
whatever it turns out to be. Every input is untrusted, its path included.

Owns:
- `read_input(path, limit)`: the bytes of a regular file, at most `limit` (one more
  is read only to tell that the file is larger); `read_head(path, n)`: its first `n`
  bytes. Anything else is refused before a byte is read: a directory, a FIFO, a
  socket, a device, and the files of the kernel's pseudo file systems (/proc, /sys
  and every mount of their kinds, such as /sys/fs/cgroup: `PSEUDO_FS`), whose
  contents are generated and unbounded. The file is opened without blocking (a FIFO
  with no writer would wait forever) and checked on the open descriptor, so a path
  swapped in between cannot slip through.
- `STDIN` (`-`): the path that stands for standard input, which both read as they
  read a file, under the same bound: a pipe is what it is for (`kpool gen random |
  kpool replay -`). It is read once, by kpool's own process, and kept, so every
  later read of `-` in the run (a replay after its load, a worker forked after it)
  sees the same bytes; a terminal or a directory is refused before a byte is read
  (kpool would wait for typing that never comes). `input_name(path)` is how a
  message names it, `<stdin>` (`STDIN_NAME`). Only the text `-` is it: a file named
  `-` is `./-`.
- `not_regular(path)`: why `path` is not a file kpool reads (None when it is), for
  the walks of input folders and for output checks; a path that names the file
  standard input is open on (`/dev/stdin` on a pipe) is told that `-` reads it.
- `trace_paths(paths)`: the trace files that files and folders given on the command
  line stand for (a folder's files are inputs as much as the folder), and why a
  folder gave none: it holds no trace, or a folder in it cannot be listed (a trace
  kpool did not read never passes a check). The walk keeps its own stack, so a
  folder nested as deep as the system allows is walked like any other.
- `InputRefused`: the refusal's reason, without the path (each caller words its
  own message around it, with file and field).
- `nesting_past(text, tokens, most)`: where the arrays and objects of an input's
  text (a report's JSON, a settings file's TOML) first nest past `most` levels, what
  a parser that gave out on it (Python's recursion) cannot say;
- `line_at(text, offset)`: the line (from 1) of an offset into an input's text or
  bytes, the one way every message that names a line counts it.

Invariant: nothing here blocks on an input or reads more than `limit + 1` bytes
(standard input excepted, which blocks until its writer writes or leaves: the largest
`limit + 1` any reader asked for is read of it, and kept).
"""

from __future__ import annotations

import contextlib
import os
import re
import select
import stat
import sys
from collections.abc import Iterable
from functools import cache
from pathlib import Path

TRACE_SUFFIXES = (".yaml", ".yml")
STDIN = "-"  # the path that stands for standard input, as in most command-line tools
STDIN_NAME = "<stdin>"  # how a message, a report or a view names it


class InputRefused(Exception):
    """A path kpool does not read; the message is the reason, without the path."""


class InputTooLarge(InputRefused):
    """A regular file larger than the reader's limit."""


# the kernel's file systems whose files are generated on read
PSEUDO_FS = frozenset({"proc", "sysfs", "cgroup", "cgroup2", "debugfs", "tracefs",
                       "securityfs", "configfs", "pstore", "bpf", "efivarfs", "fusectl",
                       "binfmt_misc", "rpc_pipefs", "nsfs"})
_MOUNTINFO_BYTES = 4 << 20


@cache
def _pseudo_devices() -> frozenset[int]:
    """The devices of /proc, /sys and every mount of a `PSEUDO_FS` kind (from
    /proc/self/mountinfo: each line's major:minor, and its type after the ` - `), where
    a "regular file" is generated on read."""
    out = set()
    for p in ("/proc", "/sys"):
        with contextlib.suppress(OSError):
            out.add(os.stat(p).st_dev)
    with contextlib.suppress(OSError, ValueError):
        fd = os.open("/proc/self/mountinfo", os.O_RDONLY)
        try:
            text = os.read(fd, _MOUNTINFO_BYTES).decode("utf-8", "replace")
        finally:
            os.close(fd)
        for line in text.splitlines():
            fields, sep, rest = line.partition(" - ")
            parts = fields.split()
            if sep and len(parts) > 2 and rest.split(" ", 1)[0] in PSEUDO_FS:
                major, _, minor = parts[2].partition(":")
                out.add(os.makedev(int(major), int(minor)))
    return frozenset(out)


def _why_not(st: os.stat_result) -> str | None:
    mode = st.st_mode
    if stat.S_ISDIR(mode):
        return "is a directory"
    if stat.S_ISFIFO(mode):
        return "is a FIFO, not a regular file"
    if stat.S_ISSOCK(mode):
        return "is a socket, not a regular file"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "is a device, not a regular file"
    if not stat.S_ISREG(mode):
        return "is not a regular file"
    if st.st_dev in _pseudo_devices():
        return "is a file of /proc or /sys (generated by the kernel), not a regular file"
    return None


def not_regular(path: str | Path) -> str | None:
    """Why kpool will not read `path` (it follows a symlink), or None for a regular
    file. A missing path is None: reading it then says why."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    why = _why_not(st)
    if why is not None and _is_stdin(st):  # `/dev/stdin`, `/dev/fd/0`, a pipe's FIFO...
        why += f" (standard input: give {STDIN} to read it)"
    return why


def _is_stdin(st: os.stat_result) -> bool:
    """Whether `st` is the file standard input is open on."""
    try:
        own = os.fstat(0)
    except OSError:  # no standard input at all
        return False
    return (own.st_dev, own.st_ino) == (st.st_dev, st.st_ino)


def read_head(path: str | Path, n: int) -> bytes:
    """The first `n` bytes of the regular file `path` (to tell what it is), or of
    standard input (`STDIN`); raises as `read_input` does."""
    if path == STDIN:
        return _stdin.prefix(n)
    return _read(path, n, whole=False)


def read_input(path: str | Path, limit: int) -> bytes:
    """The contents of the regular file `path`, or of standard input (`STDIN`), at
    most `limit` bytes. Raises InputRefused (InputTooLarge past `limit`) or the
    OSError of opening or reading it (missing, unreadable...)."""
    if path == STDIN:
        data = _stdin.prefix(limit + 1)
        if len(data) > limit:
            raise InputTooLarge(f"is larger than {_size(limit)}")
        return data
    return _read(path, limit, whole=True)


def input_name(path: str | Path) -> str:
    """How a message names the input `path`: `<stdin>` for `-`, else the path."""
    return STDIN_NAME if path == STDIN else str(path)


class _Stdin:
    """Standard input as read so far (descriptor 0, never `sys.stdin`, which may be
    None or a text wrapper): what one reader read, every later one is given."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.ended = False

    def prefix(self, n: int) -> bytes:
        """The first `n` bytes of standard input (fewer at its end), read now as far as
        they were not yet."""
        if len(self.data) < n and not self.ended:
            self._read_to(n)
        return bytes(memoryview(self.data)[:n])

    def _read_to(self, n: int) -> None:
        self._check(first=not self.data)
        while len(self.data) < n:
            try:
                chunk = os.read(0, min(n - len(self.data), 1 << 20))
            except BlockingIOError:  # a descriptor left non-blocking by the caller
                select.select([0], [], [])
                continue
            if not chunk:
                self.ended = True
                return
            self.data += chunk

    @staticmethod
    def _check(*, first: bool) -> None:
        """Refuse to read on in a worker of a pool (it is given what kpool's own process
        read, by the fork: the pipe is the parent's), and, before the `first` byte, a
        standard input that is a terminal (nothing piped in) or a directory."""
        mp = sys.modules.get("multiprocessing")
        if mp is not None and mp.parent_process() is not None:
            raise InputRefused("was not read before the work started: only kpool's own "
                               "process reads standard input")
        if not first:
            return
        try:
            st = os.fstat(0)
        except OSError as e:
            raise InputRefused(f"cannot be read: {e.strerror or e}") from None
        if stat.S_ISDIR(st.st_mode):
            raise InputRefused("is a directory")
        if os.isatty(0):
            raise InputRefused("is a terminal: give a trace's path, or pipe one in "
                               "(kpool gen random | kpool replay -)")


_stdin = _Stdin()


def _read(path: str | Path, limit: int, *, whole: bool) -> bytes:
    why = not_regular(path)
    if why is not None:
        raise InputRefused(why)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    try:
        st = os.fstat(fd)
        why = _why_not(st)
        if why is not None:
            raise InputRefused(why)
        if whole and st.st_size > limit:
            raise InputTooLarge(f"is larger than {_size(limit)}")
        os.set_blocking(fd, True)
        chunks: list[bytes] = []
        left = limit + 1 if whole else limit
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if whole and len(data) > limit:  # it grew while read
        raise InputTooLarge(f"is larger than {_size(limit)}")
    return data


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 and n % (1 << 20) == 0 else f"{n:,} bytes"


def trace_paths(paths: Iterable[str], *, unique: bool = True) -> tuple[list[str], list[str]]:
    """The trace files `paths` stand for, and what is wrong with the folders among them
    (a message each, naming the folder: the caller refuses the run, before any work,
    with the first).
    A file is taken as given (whatever its name), and so is `-` (standard input); a
    folder is searched for files
    named `*.yaml` or `*.yml` (in any case), hidden files and folders skipped, and
    folders that are symlinks not followed, in sorted order. A path that does not exist
    is taken as a file (its check says it is missing). Duplicates are dropped, unless
    not `unique` (`kpool diff a.json a.json` compares a report with itself)."""
    out: list[str] = []
    problems: list[str] = []
    seen: set[str] = set()
    for p in paths:
        if p == STDIN:  # standard input, never a file or folder named `-`
            candidates = [p]
        elif os.path.isdir(p):
            found, why = _traces_under(p)
            if why is not None:
                problems.append(why)
            elif not found:
                problems.append(f"no traces (*.yaml, *.yml) under {p}")
            candidates = found
        else:
            candidates = [p]
        for c in candidates:
            key = os.path.normpath(c)
            if key not in seen or not unique:
                seen.add(key)
                out.append(c)
    return out, problems


def _traces_under(top: str) -> tuple[list[str], str | None]:
    """The trace files under the folder `top`, sorted, or why it cannot be walked (a
    folder in it that cannot be listed)."""
    found: list[str] = []
    stack = [top]
    while stack:
        folder = stack.pop()
        try:
            with os.scandir(folder) as it:
                entries = [(e.name, e.path, _is_folder(e)) for e in it
                           if not e.name.startswith(".")]
        except OSError as e:
            return [], f"cannot list the folder {folder}: {e.strerror or e}"
        for name, path, is_folder in entries:
            if is_folder is None:
                continue  # a link to a folder: not followed
            if is_folder:
                stack.append(path)
            elif name.lower().endswith(TRACE_SUFFIXES):
                found.append(path)
    return sorted(found), None


def _is_folder(entry: os.DirEntry[str]) -> bool | None:
    """True for a folder, False for anything else, None for a link to a folder."""
    try:
        if entry.is_dir(follow_symlinks=False):
            return True
        return None if entry.is_dir() else False
    except OSError:
        return False


def nesting_past(text: str, tokens: re.Pattern[str], most: int) -> int | None:
    """The offset in `text` of the bracket where its nesting first passes `most` levels,
    or None. `tokens` matches the format's brackets (`[`, `]`, `{`, `}`) and, so that
    their brackets do not count, whatever else may hold one (its strings, comments)."""
    depth = 0
    for m in tokens.finditer(text):
        c = m.group()
        if c in "[{":
            depth += 1
            if depth > most:
                return m.start()
        elif c in "]}":
            depth -= 1
    return None


def line_at(text: str | bytes, offset: int) -> int:
    """The line, counted from 1, that `offset` of `text` (or its bytes) is on."""
    if isinstance(text, str):
        return text.count("\n", 0, offset) + 1
    return text.count(b"\n", 0, offset) + 1
