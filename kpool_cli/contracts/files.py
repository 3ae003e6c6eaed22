"""Output files: which paths kpool may write, and writing them whole or not at all.

Owns:
- `check_outputs(inputs, outputs)`: refuses, before any work, an output path that
  would destroy something: one of the inputs (the same file, through any link, or
  standard output itself open on one: `1<>trace.yaml`),
  the same path twice (or two names that differ only by case or Unicode
  normalisation: one file where the file system folds them), or anything that is not
  a regular file (a directory, a
  device such as /dev/sda or /dev/full, a FIFO, a socket, a symlink to one), a path
  that ends in `/`, and the empty path; and one that could not be written: in a
  missing folder, or one where a probe file cannot be made (read-only, not kpool's),
  so that a page written after the replay (`--html`, `--svg`) is not refused only
  once the work is done. `-` (stdout) is always allowed, and so is a
  path that names one of kpool's own descriptors (`/dev/stdout`: written as `-` is),
  standard input's excepted (`/dev/stdin`: an input, never written). An input `-` is
  standard input (`inputs.STDIN`), whatever it is open on.
- `written_whole(path)`: a context manager yielding a text stream on a temporary
  file beside the file `path` names (a symlink is written through, never replaced;
  `-` is stdout),
  renamed over it only when the block completes; a path that names one of this
  process's own descriptors (`own_descriptor`: `/dev/stdout`, `/dev/fd/N`,
  `/proc/self/fd/N`, or a link to one) is written on that descriptor, as `-` is on
  stdout: the shell opened it (`> x.txt`, `>> log`, a pipe) and what it holds
  besides is the shell's; an exception,
  an interrupt (KeyboardInterrupt) or a termination (the CLI turns SIGTERM into an
  exception) removes the temporary and leaves any earlier `path` untouched. The file
  gets the mode a new file would (0666 less the umask), not mkstemp's 0600: reports
  and views are artifacts.
- `check_output_folder(opt, path, pattern)`: a folder kpool fills with files of its
  own naming (`kpool fuzz -o DIR`), checked before any work: made if missing, a
  file written and removed in it (a read-only folder, /proc, a full disk fail
  now), and no entry matching `pattern` that is not a regular file (a link, a
  FIFO, a folder): kpool replaces its own files there, and writes through nothing.
  `-` is refused: standard output is one stream, not a folder of files.
- `OutputError`: why an output path was refused or could not be written, with the
  path and the system's reason (missing directory, read-only, disk full...).
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
import sys
import tempfile
import unicodedata
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TextIO

from ..inputs import STDIN, input_name
from ..signals import masked

STDOUT = "-"
TMP_NAME_CHARS = 32  # of the output's name, in its temporary's (4 bytes a character at most)


class OutputError(Exception):
    """An output path kpool refuses, or cannot write (exit 2)."""


# a path naming a process's descriptor: /proc/PID/fd/N (self, thread-self) or /dev/fd/N
_FD_PATH = re.compile(r"/(?:proc/(self|thread-self|\d+)|dev)/fd/(\d+)")


def own_descriptor(path: str) -> int | None:
    """The descriptor of this process that `path` names, through its links
    (`/dev/stdout` -> `/proc/self/fd/1`), or None. A descriptor's own entry is a link
    to the file it has open: it is matched before it is followed."""
    p = os.path.abspath(path)
    for _ in range(40):  # the system's own bound on a chain of links
        m = _FD_PATH.fullmatch(p)
        if m is not None and m.group(1) in (None, "self", "thread-self", str(os.getpid())):
            return int(m.group(2))
        try:
            target = os.readlink(p)
        except OSError:  # not a link, or none there
            return None
        p = os.path.normpath(os.path.join(os.path.dirname(p), target))
    return None


def _identity(path: str) -> tuple[int, int] | None:
    """The file `path` names (the input `-`: the one standard input is open on)."""
    try:
        st = os.fstat(0) if path == STDIN else os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def check_outputs(inputs: Iterable[str], outputs: Iterable[tuple[str, str | None]], *,
                  probe: bool = True) -> None:
    """Raise OutputError unless every output (`(option, path)`, path None when not
    given) may be written without destroying an input or a non-file, and (with
    `probe`) a file can be made in its folder."""
    outputs = list(outputs)
    # what goes to standard output (`-`, a path naming descriptor 1: /dev/stdout): two
    # would mix in one stream (a JSON report followed by a page is no JSON document)
    to_stdout = [opt for opt, p in outputs if p == STDOUT or (p and own_descriptor(p) == 1)]
    if len(to_stdout) > 1:
        raise OutputError(f"{to_stdout[-1]} and {to_stdout[0]} both go to standard output: "
                          f"give {to_stdout[-1]} a file of its own")
    given = [(opt, p) for opt, p in outputs if p is not None and p != STDOUT]
    inputs_by_id = {}
    for i in inputs:
        ident = _identity(i)
        if ident is not None:
            inputs_by_id[ident] = input_name(i)
    try:  # `1<>input`, `>> input`: what is written to stdout would land on it
        out = os.fstat(1)
    except OSError:
        out = None
    if out is not None and stat.S_ISREG(out.st_mode) and (out.st_dev, out.st_ino) in inputs_by_id:
        raise OutputError(f"standard output is the input {inputs_by_id[(out.st_dev, out.st_ino)]}"
                          ": kpool never writes over its inputs (redirect it elsewhere)")
    seen: dict[str, tuple[str, str]] = {}  # folded real path: (option and path, real)
    for opt, path in given:
        if path == "":
            raise OutputError(f"{opt}: the path is empty")
        if path.endswith(("/", os.sep)) and not os.path.isdir(path):  # a new one
            raise OutputError(f"{opt} {path}: names a directory (it ends in /): give the "
                              "path of a file")
        # the file a name stands for on every file system: one that folds case or
        # Unicode normalisation (macOS, Windows, a casefolded folder) makes R.json and
        # r.json one file, which the second output would replace
        real = os.path.realpath(path)
        folded = unicodedata.normalize("NFC", real).casefold()
        if folded in seen:
            first, first_real = seen[folded]
            raise OutputError(f"{opt} {path}: the same file as {first}: each output needs "
                              "its own path" + ("" if real == first_real else
                                                " (names that differ only by case or "
                                                "Unicode normalisation are one file where "
                                                "the file system folds them)"))
        seen[folded] = (f"{opt} {path}", real)
        fd = own_descriptor(path)
        if fd == 0:
            raise OutputError(f"{opt} {path}: names standard input: kpool writes nothing "
                              "there (use - for stdout)")
        if fd is not None:  # written as `-` is (whatever it is open on)
            ident = _identity(path)
            if ident is not None and ident in inputs_by_id:
                raise OutputError(f"{opt} {path}: is the input {inputs_by_id[ident]}: kpool "
                                  "never writes over its inputs")
            continue
        try:
            st = os.stat(path)  # follows a symlink: its target is what would be written
        except FileNotFoundError:
            st = None
        except OSError as e:
            raise OutputError(f"{opt} {path}: {e.strerror or e}") from None
        if st is not None:
            if stat.S_ISDIR(st.st_mode):
                raise OutputError(f"{opt} {path}: is a directory")
            if not stat.S_ISREG(st.st_mode):
                kind = _kind(st.st_mode)
                raise OutputError(f"{opt} {path}: is {kind}, not a regular file: kpool "
                                  "writes reports and views to regular files only "
                                  "(use - for stdout)")
            if (st.st_dev, st.st_ino) in inputs_by_id:
                raise OutputError(f"{opt} {path}: is the input "
                                  f"{inputs_by_id[(st.st_dev, st.st_ino)]}: kpool never "
                                  "writes over its inputs")
        parent = Path(path).parent
        if not parent.is_dir():
            reason = "does not exist" if not parent.exists() else "is not a directory"
            raise OutputError(f"{opt} {path}: the directory {parent} {reason}")
        if probe:
            try:  # where `written_whole` makes it: beside what a link names
                _probe(Path(os.path.realpath(path)).parent)
            except OSError as e:
                raise OutputError(f"cannot write {path}: {e.strerror or e}") from None


def check_output_folder(opt: str, path: str, pattern: str) -> bool:
    """Raise OutputError unless kpool can fill the folder `path` with its own files,
    each a name matching `pattern` (the module's `check_output_folder`). Makes the
    folder when it is missing; returns whether it did (a run that writes nothing
    there may remove it again)."""
    where = f"{opt} {path}"
    if path == "":
        raise OutputError(f"{opt}: the path is empty (give a folder)")
    if path == STDOUT:
        raise OutputError(f"{where}: standard output cannot take a folder of files: give "
                          "a folder (made if missing)")
    folder = Path(path)
    try:
        if folder.exists() and not folder.is_dir():  # a link to a folder is one
            raise OutputError(f"{where}: not a folder")
        made = not folder.exists()
        folder.mkdir(parents=True, exist_ok=True)
        for entry in folder.glob(pattern):
            mode = os.lstat(entry).st_mode
            if not stat.S_ISREG(mode):
                raise OutputError(f"{where}: {entry.name} in it is {_kind(mode)}: kpool writes "
                                  "its files there as regular files and replaces nothing "
                                  "else")
        _probe(folder)
    except OSError as e:
        raise OutputError(f"{where}: cannot write there: {e.strerror or e}") from None
    return made


def _probe(folder: Path) -> None:
    """Make a file in `folder` and remove it: raises the OSError that writing there
    would (a read-only folder or disk, /proc, a full disk). A signal waits until the
    file is gone (as in `written_whole`): Ctrl-C never leaves it behind."""
    with masked():
        fd, probe = tempfile.mkstemp(prefix=".kpool-", suffix=".tmp", dir=folder)
        try:
            os.close(fd)
        finally:
            os.unlink(probe)


def _on_descriptor(fd: int, path: str) -> Iterator[TextIO]:
    """A text stream on this process's descriptor `fd` (stdout and stderr themselves:
    what else is written to them stays in order), flushed as the block ends."""
    try:
        if fd in (1, 2):
            stream = sys.stdout if fd == 1 else sys.stderr
            yield stream
            stream.flush()
            return
        with os.fdopen(os.dup(fd), "w", encoding="utf-8") as f:
            yield f
    except OSError as e:
        if isinstance(e, BrokenPipeError):
            raise
        raise OutputError(f"cannot write {path}: {e.strerror or e}") from None


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):  # of an lstat: what a check that follows no link met
        return "a symbolic link"
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


@contextlib.contextmanager
def written_whole(path: str) -> Iterator[TextIO]:
    # the last line of defence, whatever the command checked: never replace a device,
    # a FIFO or a directory with a regular file
    check_outputs((), [("output", path)], probe=False)  # the file is made at once
    fd = 1 if path == STDOUT else own_descriptor(path)
    if fd is not None:
        yield from _on_descriptor(fd, path)
        return
    # the file a link names (check_outputs followed it too): the link stays a link
    target = Path(os.path.realpath(path))
    tmp: str | None = None
    try:
        # a signal while the temporary file is made is answered once its name is known
        # (masked: SIGINT and every terminating signal wait), so that the cleanup below can
        # remove it
        with masked():
            # the name's first characters only: a name as long as the system allows
            # leaves no room for a prefix and a suffix around it whole
            fd, tmp = tempfile.mkstemp(prefix=f".{target.name[:TMP_NAME_CHARS]}.",
                                       suffix=".tmp", dir=target.parent)
            f = os.fdopen(fd, "w", encoding="utf-8")
        try:
            yield f
            f.flush()  # a full disk or a file-size limit shows here at the latest
            os.fsync(f.fileno())
        finally:
            with contextlib.suppress(OSError):
                f.close()
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, target)
    except BaseException as e:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        if isinstance(e, OSError) and not isinstance(e, BrokenPipeError):
            # making the file, or its own write, flush or rename: say why, with the path
            raise OutputError(f"cannot write {path}: {e.strerror or e}") from None
        raise

