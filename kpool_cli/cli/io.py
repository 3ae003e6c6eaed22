"""What every command does with its inputs and outputs before and after the work: load
a trace, refuse an output, open one, and fail.

Owns: `fail` (exit 2 with `kpool: message`, every line made visible), `invalid` (an
invalid trace), `load` (a trace, or exit 2), `version_for` (the engine a run uses),
`refuse_outputs` (before any work: an output that would destroy an input or a
non-file), `open_output` (stdout, or a file written whole), `naming_the_trace` (a
MemoryError names its trace: `OutOfMemory`), `hanging` (a line of help or listing
wrapped under its head), `code_items` and `codes` (finding codes given on the command
line).
"""

from __future__ import annotations

import contextlib
import sys
import textwrap
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, NoReturn, TextIO

import click

from ..contracts import exits
from ..contracts.files import STDOUT, OutputError, check_outputs, written_whole
from ..versions import (
    DEFAULT_VERSION,
    EngineVersion,
    VersionError,
    load_version,
    plugin_files,
)
from ..wording import fit_line, visible

if TYPE_CHECKING:  # the loader (yaml, numpy): imported by `load`, when a command loads
    from ..trace.load import TraceError
    from ..trace.model import Trace


def fail(message: str, *more_lines: str) -> NoReturn:
    """Exit 2 with `kpool: message` and `more_lines` below it, each line made visible:
    no text taken from an input (a path, a name) can break a line or fake one. On a
    terminal each line wraps between words (`terminal_lines`)."""
    lines = [visible(line) for line in (f"kpool: {message}", *more_lines)]
    click.echo(terminal_lines(lines, sys.stderr), err=True, nl=False)
    sys.exit(exits.BAD_INPUT)


def terminal_lines(lines: Iterable[str], stream: TextIO) -> str:
    """`lines` as text for `stream`: on a terminal, each wrapped to its width between
    the units kpool words as one (`wording.fit_line`), a continuation indented; else
    as they are, one message a line, for a log or a grep."""
    from ..report.terminal import console_width, stream_is_terminal

    width = console_width(stream) if stream_is_terminal(stream) else None
    return "".join(fit_line(line, width) for line in lines)


def invalid(e: TraceError) -> NoReturn:
    """Exit 2 for an invalid trace: every problem on its own line (TraceError's); a
    file that could not be read at all (missing, a FIFO...) says just that."""
    if e.unread:
        fail(*str(e).split("\n"))
    fail("invalid trace", *str(e).split("\n"))


def load(path: str, max_tokens: int, max_nodes: int | None) -> Trace:
    from ..trace.load import TraceError
    from ..verdict.expect import load_checked

    try:
        return load_checked(path, max_tokens=max_tokens, max_nodes=max_nodes)
    except TraceError as e:
        invalid(e)


def version_for(name: str | None, trace_engine: str | None) -> EngineVersion:
    """--engine (even empty: an error), else the trace's `engine:`, else the default."""
    try:
        return load_version(name if name is not None else trace_engine or DEFAULT_VERSION)
    except VersionError as e:
        fail(str(e))


def refuse_outputs(inputs: tuple[str, ...], engines: Iterable[str | None] = (),
                   **outputs: str | None) -> None:
    """Exit 2, before any work, for an output that would destroy an input or a non-file;
    the inputs include the modules of the plug-in `engines` and their packages
    (`plugin_files`)."""
    plugins = tuple(f for spec in engines for f in plugin_files(spec))
    # a command's main output (`--output`) not given goes to stdout, as `-` does
    given = dict(outputs)
    if "output" in given and given["output"] is None:
        given["output"] = STDOUT
    try:
        check_outputs((*inputs, *plugins), [(f"--{k}", v) for k, v in given.items()])
    except OutputError as e:
        fail(str(e))


@contextlib.contextmanager
def open_output(path: str | None) -> Iterator[TextIO]:
    """stdout, or a file that appears only when the run completes."""
    if path is None or path == "-":
        yield sys.stdout
        return
    with written_whole(path) as f:
        yield f


class OutOfMemory(Exception):
    """A MemoryError, with the trace whose replay ran out."""


@contextlib.contextmanager
def naming_the_trace(trace: Trace) -> Iterator[None]:
    try:
        yield
    except MemoryError:
        raise OutOfMemory(trace.path) from None


def hanging(head: str, text: str, width: int = 80) -> str:
    """`head` then `text` filled to `width` columns, continued under `text`, never
    breaking a word (nor at its hyphens)."""
    return textwrap.fill(text, width, initial_indent=head, subsequent_indent=" " * len(head),
                         break_on_hyphens=False, break_long_words=False)


def code_items(option: str, values: tuple[str, ...]) -> tuple[str, ...]:
    """The items of `option` given repeated or comma-separated, stripped, in upper case;
    exit 2 for an empty one (`''`, `,`, `KP001,`): it names no code, and is refused as
    an unknown code is, not passed over."""
    items = tuple(c.strip().upper() for v in values for c in v.split(","))
    if "" in items:
        given = next(v for v in values if "" in (c.strip() for c in v.split(",")))
        fail(f"{option} {given!r}: an empty item names no finding code; give codes "
             f"separated by commas (e.g. {option} KP001,KP005)")
    return items


def codes(option: str, values: tuple[str, ...]) -> tuple[str, ...]:
    """Finding codes given as repeated or comma-separated `option`s; exit 2 for an
    empty or unknown one."""
    from ..verdict.codes import CODES

    out = code_items(option, values)
    unknown = [c for c in out if c not in CODES]
    if unknown:
        fail(f"{option}: unknown finding code {unknown[0]!r}: known codes are "
             f"{', '.join(CODES)}")
    return out
