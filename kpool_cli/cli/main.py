"""The `kpool` group and the `kpool` script: how every command starts and ends.

Owns: `cli` (the click group, with one command per module of this package) and
`main()`, which runs it and turns whatever ends it into one exit status
(contracts/exits.py) and at most one line on stderr: a command's own status, bad
usage (click's message, made visible: `_usage_text`), Ctrl-C 130, SIGTERM 143,
SIGHUP 129 (any signal of signals.TERMINATING: 128 + its number), a worker that
died 2, a closed stdout 141, an output that cannot be written 2, an internal error
2 (never a traceback, unless KPOOL_TRACEBACK is set); and `run()`, the installed
script, which leaves the process once main() is done without the interpreter's
teardown (`leave`).

The standard streams are the caller's and may be anything (`_standard_streams`): a
stream the caller closed (`>&-`) fails each write as a closed file does (stdout: exit
2, naming it) or takes nothing (stderr: the status still says what happened), and a
character the stream's encoding cannot write (`PYTHONIOENCODING=ascii`) is written
as its escape.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import gc
import importlib
import io
import os
import sys
import threading
from collections.abc import Iterator, MutableMapping
from typing import NoReturn

import click

from .. import __version__, signals
from ..contracts import exits
from ..contracts.files import OutputError
from ..signals import Terminated
from ..wording import visible
from ..workers import WorkerDied
from .io import OutOfMemory, terminal_lines

# Every command: its module in this package, its object there, and the first sentence of
# its docstring, which `kpool --help` lists whole beside the command's name
# (tests/test_startup.py holds the two equal; tests/test_newcomer_cli.py holds each on one
# line at 80 columns). A command's module, and all it imports (numpy, the loader, the
# replay ...), is imported only when that command runs or shows its own help: `kpool
# --help` imports none of them.
COMMANDS: dict[str, tuple[str, str, str]] = {
    "check": ("check", "check_cmd", "Check the traces in PATHS as a CI gate."),
    "diff": ("diff", "diff_cmd", "Compare two engine versions on TRACES, or two JSON reports."),
    "engines": ("info", "engines_cmd", "List the engine versions, bases and patches."),
    "explain": ("info", "explain_cmd",
                "Explain finding CODE: what it means and how to fix the engine."),
    "fuzz": ("fuzz", "fuzz_cmd", "Fuzz ENGINE with random traces, shrinking each new finding."),
    "gen": ("gen", "gen_cmd", "Write a generated trace (format v1)."),
    "replay": ("replay", "replay_cmd",
               "Replay TRACES through an engine version, ubatch by ubatch."),
    "schema": ("info", "schema_cmd",
               "Print the JSON Schema of a trace, a report, check or diff JSON."),
    "validate": ("check", "validate_cmd", "Load the traces in PATHS without replaying them."),
}


class _ReaderLeft(Exception):
    """stdout's reader left (a BrokenPipeError), carried past click, which would turn
    it into exit 1."""


class _Interrupted(BaseException):
    """Ctrl-C, carried past click, which would print a blank line and `Aborted!`."""


class _TerminatedPast(BaseException):
    """A Terminated (SIGTERM, SIGHUP...), carried past click, which would take it for a
    Ctrl-C."""

    def __init__(self, signum: int) -> None:
        super().__init__()
        self.signum = signum


class _Commands(MutableMapping[str, click.Command]):
    """The group's commands by name (`COMMANDS`), each module imported at the first look-up
    of one of its commands (click looks a command up to run it or show its help)."""

    def __init__(self) -> None:
        self._loaded: dict[str, click.Command] = {}

    def __getitem__(self, name: str) -> click.Command:
        if name not in self._loaded:
            module, attr, _ = COMMANDS[name]
            self._loaded[name] = getattr(importlib.import_module(f"{__package__}.{module}"),
                                         attr)
        return self._loaded[name]

    def __setitem__(self, name: str, command: click.Command) -> None:
        self._loaded[name] = command

    def __delitem__(self, name: str) -> None:
        del self._loaded[name]

    def __iter__(self) -> Iterator[str]:
        return iter(dict.fromkeys([*COMMANDS, *self._loaded]))

    def __len__(self) -> int:
        return len(set(COMMANDS) | set(self._loaded))


class _Group(click.Group):
    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """click's listing (`Group.format_commands`), each line the command's sentence
        from `COMMANDS`, whole (click would cut it with `...` past the width, mid-phrase),
        rather than from the command: no command's module is imported for it."""
        rows = [(n, COMMANDS[n][2]) for n in self.list_commands(ctx) if n in COMMANDS]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)

    def make_context(self, *args, **kwargs) -> click.Context:
        # `kpool --help` and `--version` print while the arguments are parsed
        try:
            return super().make_context(*args, **kwargs)
        except BrokenPipeError:
            raise _ReaderLeft from None

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except BrokenPipeError:
            raise _ReaderLeft from None
        except Terminated as e:
            raise _TerminatedPast(e.signum) from None
        except KeyboardInterrupt:
            raise _Interrupted from None


@click.group(cls=_Group, commands=_Commands(),
             context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="kpool")
def cli() -> None:
    """Replay and inspect traces of llama.cpp's k-pool indexer cache."""


# The cyclic collector's thresholds for a command (Python's default: 700, 10, 10). A
# replay builds each ubatch's record, thousands of small dicts and lists that die by
# reference count once written; collected every 700 allocations, they were traversed
# while alive, promoted, and then rescanned with the whole trace by full collections: a
# quarter of a W2 replay (docs/performance.md). They are still collected, only less often.
GC_THRESHOLDS = (10_000, 10, 10)


def main() -> None:
    """The `kpool` script. Exit status: the command's (0, 1, 2), or 2 for bad usage
    or an internal error, 130 on Ctrl-C, 143 on SIGTERM, 129 on SIGHUP, 141 when
    stdout's reader left (`kpool replay t.yaml | head -1`): never 1, which means
    findings."""
    signals.install()
    gc.set_threshold(*GC_THRESHOLDS)
    _standard_streams()
    try:
        try:
            code = cli.main(prog_name="kpool", standalone_mode=False)
        except SystemExit as e:  # a command's sys.exit: its code, once stdout is out
            code = e.code
        sys.stdout.flush()  # a full disk or a closed pipe shows here at the latest
    except click.ClickException as e:  # bad usage: click's message and usage line
        shown = io.StringIO()
        e.show(file=shown)  # it quotes the arguments: made visible like any input
        text = _usage_text(shown.getvalue().rstrip("\n"), sys.argv[1:])
        # on a terminal, a long line wraps between words, as kpool's own messages do
        _stderr_line(terminal_lines(text.split("\n"), sys.stderr).rstrip("\n"))
        code = e.exit_code
    except (Terminated, _TerminatedPast) as e:
        _stderr_line("kpool: terminated")
        code = exits.ended_by(e.signum)
    except (KeyboardInterrupt, _Interrupted, click.exceptions.Abort):
        _stderr_line("kpool: interrupted")
        code = exits.INTERRUPTED
    except (BrokenPipeError, _ReaderLeft):
        # the reader left: say nothing more
        _drop_stdout()
        code = exits.BROKEN_PIPE
    except WorkerDied as e:  # `--jobs`: a worker killed (the OOM killer, a signal)
        _stderr_line(f"kpool: {visible(str(e))}")
        code = exits.BAD_INPUT
    except OutputError as e:  # a missing or read-only directory, a full disk ...
        _stderr_line(f"kpool: {visible(str(e))}")
        code = exits.BAD_INPUT
    except OSError as e:  # writing stdout (> /dev/full), or a file a command writes
        if e.filename is None and isinstance(e, FileNotFoundError) and _cwd_gone():
            # os.getcwd's own error, which names no file
            _stderr_line("kpool: the current folder no longer exists: run kpool from a "
                         "folder that does")
        else:
            where = visible(str(e.filename)) if e.filename else "standard output"
            _stderr_line(f"kpool: cannot write {where}: {e.strerror or type(e).__name__}")
        _drop_stdout()
        code = exits.BAD_INPUT
    except (MemoryError, OutOfMemory) as e:  # over a limit the budget cannot see (ulimit -v)
        where = f"{visible(str(e))}: " if isinstance(e, OutOfMemory) else ""
        _stderr_line(f"kpool: {where}out of memory: this command needs more memory than the "
                     "process may take (ulimit, cgroup); --max-memory sets the budget a "
                     "replay is checked against before it starts")
        code = exits.BAD_INPUT
    except Exception as e:  # a bug in kpool, not in the input: no traceback, exit 2
        _stderr_line(f"kpool: internal error: {type(e).__name__}: {visible(str(e))}\n"
                     "Please report it with the trace that caused it "
                     "(KPOOL_TRACEBACK=1 shows where).")
        if os.environ.get("KPOOL_TRACEBACK"):
            raise
        code = exits.BAD_INPUT
    if code in (exits.PASS, exits.FINDINGS) and (missed := signals.lost()) is not None:
        # a signal Python dropped (raised inside a gc callback): the run still ends as it says
        if isinstance(missed, Terminated):
            _stderr_line("kpool: terminated")
            code = exits.ended_by(missed.signum)
        else:
            _stderr_line("kpool: interrupted")
            code = exits.INTERRUPTED
    sys.exit(code if isinstance(code, int) else exits.PASS)


def run() -> NoReturn:
    """The `kpool` script (and `python -m kpool_cli`): `main()`, then `leave`."""
    try:
        main()
        code: object = exits.PASS
    except SystemExit as e:
        code = e.code
    leave(code if isinstance(code, int) else exits.PASS)


def leave(code: int) -> NoReturn:
    """End the process with `code` once everything is written: atexit handlers run,
    standard streams flushed, then os._exit, skipping the interpreter's teardown
    of every module and object. With numba's kernels loaded that teardown alone takes
    0.2-0.45 s, a third of a warm replay of a small trace (README, "Values: the backend").
    Every output file is closed by then (contracts/files.py writes each whole, or not
    at all). When a thread other than the main one is still alive (a cluster's
    client) the interpreter ends as usual, waiting for it. The command is done: a
    Ctrl-C or SIGTERM from here on is held, and dropped with the process."""
    if threading.active_count() > 1:
        sys.exit(code)
    with signals.masked():
        with contextlib.suppress(Exception):  # each handler's error is printed, as at exit
            atexit._run_exitfuncs()
        try:
            sys.stdout.flush()  # main() flushed it: only what an atexit handler wrote is left
        except (OSError, ValueError):
            code = 120  # the interpreter's status when its own final flush fails
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.flush()
        os._exit(code)
    raise AssertionError("unreachable")  # pragma: no cover - os._exit does not return


class _Closed(io.TextIOBase):
    """A standard stream the caller closed: every write fails as a write to a closed
    descriptor does (OSError EBADF), which `main` reports as it reports a full disk."""

    def __init__(self, name: str) -> None:
        self._name = name

    def write(self, text: str) -> int:
        raise OSError(errno.EBADF, f"{self._name} is closed")

    def fileno(self) -> int:
        raise OSError(errno.EBADF, f"{self._name} is closed")


def _standard_streams() -> None:
    """The caller's standard streams made safe to write (the module's invariants). A
    closed descriptor 0, 1 or 2 is opened on /dev/null first, so that no file kpool
    opens later takes its number (and a child inherits no hole); Python then holds
    None for the stream, which becomes `_Closed` (stdout) or /dev/null (stderr)."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:  # closed: the lowest free descriptor is this one
            with contextlib.suppress(OSError):
                os.open(os.devnull, os.O_RDWR)
    if sys.stdout is None:
        sys.stdout = _Closed("standard output")
    if sys.stderr is None:
        sys.stderr = open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115 - the process's
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper):
            with contextlib.suppress(ValueError, OSError):
                stream.reconfigure(errors="backslashreplace")


def _cwd_gone() -> bool:
    """The current folder was removed (`rmdir` from another shell)."""
    try:
        os.getcwd()
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return False


def _drop_stdout() -> None:
    """stdout can take no more: what is left in its buffer goes nowhere, so that the
    interpreter's final flush does not fail again."""
    with contextlib.suppress(OSError, ValueError):
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _usage_text(shown: str, given: list[str]) -> str:
    """click's message of bad usage (`shown`: its usage lines, then `Error: ...`) as
    stderr shows it, made visible. click's own line breaks and tabs (a missing
    choice's `Choose from:` list, a choice a line) are kpool's text: shown as a
    terminal would, the tabs as spaces to the next multiple of 8. Every other
    character a terminal acts on is escaped, as the arguments it quotes are; and
    when an argument (`given`) holds a tab or a line break, so are those of the
    message after `Error:`, which may be the argument's."""
    at = 0 if shown.startswith("Error: ") else shown.find("\nError: ") + 1
    usage, said = shown[:at], shown[at:]  # the usage lines are the command's own
    if any("\t" in arg or "\n" in arg for arg in given):
        return visible(usage, keep_newlines=True) + visible(said)
    return visible(shown.expandtabs(), keep_newlines=True)


def _stderr_line(text: str) -> None:
    with contextlib.suppress(OSError):
        sys.stderr.write(text + "\n")
        sys.stderr.flush()
