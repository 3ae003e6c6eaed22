"""The options more than one command takes, and the command line's numbers: every
numeric option is bounded, checked before it is converted, and refused in kpool's
own words.

Owns `Int(lo, hi)` and `Float(lo, hi)`, click parameter types that accept only plain
decimal text (`-?[0-9]+`; a float also `.` and an exponent), at most as many digits
as the bound needs (so a 5,000-digit argument never reaches `int()`), never nan or
inf, within `[lo, hi]`; a refusal quotes at most 40 characters of the argument.
And `MAX_JOBS` with `jobs_option`, the `--jobs/-j` shared by every command that runs
a process pool (the pool is also capped by the machine's cores: workers.in_order);
`load_bounds` (`--max-tokens`, `--max-nodes`: the loader's bounds, every command that
loads a trace takes both) and `max_memory_option`, the bounds on a trace's work;
`core_option` (`--core`); `ubatch_ranges` (`--ubatch`); `ENGINES`, how help names the
engine versions; `TraceFile`, `kpool replay`'s trace argument (a folder refused with
the commands that take one: those that read their paths by `inputs.trace_paths`).
"""

from __future__ import annotations

import math
import os
import re
from typing import Any

import click
from click.core import ParameterSource

from ..backend.budget import default_max_memory, parse_memory
from ..replay import CORE_CHOICES, DEFAULT_CORE, auto_compiled_from
from ..report.select import parse_ubatch_range
from ..trace.load import MAX_BYTES, MAX_NODE_VISITS, MAX_TOKENS
from ..wording import count
from ..workers import MAX_JOBS

_INT = re.compile(r"-?[0-9]+", re.ASCII)
_FLOAT = re.compile(r"-?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]{1,3})?", re.ASCII)
_MAX_CHARS = 40  # of an argument quoted back


def _quoted(value: str) -> str:
    shown = value if len(value) <= _MAX_CHARS else value[:_MAX_CHARS] + "..."
    return repr(shown)


class TraceFile(click.Path):
    """A trace file of `kpool replay` (`-`: stdin). A folder is refused in words
    that say which commands take one, and how to give its traces."""

    def __init__(self) -> None:
        super().__init__(dir_okay=False)

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> Any:
        if isinstance(value, str) and value != "-" and os.path.isdir(value):
            # whole (a path is at most PATH_MAX, else no folder): its name is its end
            self.fail(f"{value!r} is a folder: kpool replay takes trace files (its *.yaml); "
                      "kpool check, kpool diff and kpool validate take a folder", param, ctx)
        return super().convert(value, param, ctx)


class Int(click.ParamType):
    """An integer in [lo, hi]; its metavar `lo-hi` (closed bounds: not kpool's `a..b`,
    which is half-open), its messages "is not an integer from lo to hi"."""

    name = "integer"

    def __init__(self, lo: int, hi: int) -> None:
        self.lo, self.hi = lo, hi

    def get_metavar(self, param: click.Parameter, ctx: click.Context | None = None) -> str:
        return f"{self.lo}-{self.hi}"

    def bounds(self) -> str:
        """The bounds, in the words of the messages."""
        return f"from {self.lo} to {self.hi}"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None
                ) -> int:
        if isinstance(value, int) and not isinstance(value, bool):
            n = value
        else:
            text = str(value).strip()
            digits = max(len(str(self.lo)), len(str(self.hi)))
            if len(text) > digits + 1 or not _INT.fullmatch(text):
                self.fail(f"{_quoted(text)} is not an integer {self.bounds()}", param, ctx)
            n = int(text)
        if not self.lo <= n <= self.hi:
            self.fail(f"{n} is not an integer {self.bounds()}", param, ctx)
        return n


class Float(click.ParamType):
    """A finite number in [lo, hi]."""

    name = "number"

    def __init__(self, lo: float, hi: float) -> None:
        self.lo, self.hi = lo, hi

    def get_metavar(self, param: click.Parameter, ctx: click.Context | None = None) -> str:
        return f"{self.lo:g}-{self.hi:g}"

    def bounds(self) -> str:
        """The bounds, in the words of the messages."""
        return f"from {self.lo:g} to {self.hi:g}"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None
                ) -> float:
        if isinstance(value, float | int) and not isinstance(value, bool):
            x = float(value)
        else:
            text = str(value).strip()
            if len(text) > _MAX_CHARS or not _FLOAT.fullmatch(text):
                self.fail(f"{_quoted(text)} is not a number {self.bounds()} (nan and inf "
                          "are not numbers here)", param, ctx)
            x = float(text)
        if not math.isfinite(x) or not self.lo <= x <= self.hi:
            self.fail(f"{x:g} is not a number {self.bounds()}", param, ctx)
        return x


def jobs_option(default: int | None, help_text: str) -> Any:
    """--jobs/-j N: processes, 1..MAX_JOBS (and at most the machine's cores run)."""
    return click.option("--jobs", "-j", "jobs", type=Int(1, MAX_JOBS), default=default,
                        show_default=default is not None, metavar="N",
                        help=f"{help_text} At most {MAX_JOBS}; no more processes than the "
                             "machine has cores are started.")


# the one wording of an engine name in help, first in an option's help so that no line
# breaks inside `kpool engines` (which lists them)
ENGINES = "An engine version (see kpool engines): BASE, BASE+PATCH or package.module:Name."


def _memory_budget(ctx: click.Context, param: click.Parameter, value: str | None
                   ) -> int | None:
    if value is None:
        return default_max_memory()
    try:
        return parse_memory(value)
    except ValueError as e:
        raise click.BadParameter(str(e)) from e


def shared_budget(max_memory: int | None, jobs: int, n_units: int) -> int | None:
    """The budget each of `jobs` processes checks its replay against: --max-memory as
    given, or, when it was not, the default (half of the memory available) shared by
    the processes that run at once (`workers_for`), which all take it from the same
    memory."""
    ctx = click.get_current_context()
    if ctx.get_parameter_source("max_memory") is not ParameterSource.DEFAULT:
        return max_memory
    from ..workers import workers_for

    return default_max_memory(workers_for(jobs, n_units))


def ubatch_ranges(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]
                  ) -> tuple[tuple[int, int], ...]:
    try:
        return tuple(parse_ubatch_range(v) for v in values)
    except ValueError as e:
        raise click.BadParameter(str(e)) from e


# the bounds on a trace's work, the same for every command that reads a trace (validate
# among them, which never replays: the help says what each does, a load's refusal)
max_tokens_option = click.option(
    "--max-tokens", type=Int(1, 2**40), default=MAX_TOKENS, metavar="N",
    help=f"Refuse, while reading it, a trace of more than N tokens (a trace is untrusted "
         f"input).  [default: {count(MAX_TOKENS)}]")
# about the most nodes a trace of MAX_BYTES holds without aliases (`{a,a,a}` is a
# node a byte): a larger node bound would only let an alias bomb run longer
MAX_NODES_CHOSEN = MAX_BYTES
max_nodes_option = click.option(
    "--max-nodes", type=Int(1, MAX_NODES_CHOSEN), default=None, metavar="N",
    help=f"Refuse, while reading it, a trace of more than N YAML nodes, aliases expanded "
         f"[default: {count(MAX_NODE_VISITS)}; at most {count(MAX_NODES_CHOSEN)}]. A token "
         "on a line of its own is 5 nodes (6 with seq: [S]): raise it for a recorded trace of "
         "more tokens.")


def load_bounds(f: Any) -> Any:
    """--max-tokens and --max-nodes, in that order: the command's `max_tokens` and
    `max_nodes`, which every load of its traces takes."""
    return max_tokens_option(max_nodes_option(f))


quiet_option = click.option("--quiet", "-q", is_flag=True, help="No progress bar on stderr.")
core_option = click.option(
    "--core", type=click.Choice(CORE_CHOICES), default=DEFAULT_CORE, show_default=True,
    metavar="CORE",
    help="The replay core: compiled (numba kernels), reference (the engine in numpy, "
         "which the compiled core is held to byte for byte), or auto: compiled for a "
         f"trace of {count(auto_compiled_from('numba'))} ubatches or more "
         f"({count(auto_compiled_from(None))} without the numba backend). The report is the "
         "same.")


def max_memory_option(jobs: bool) -> Any:
    """--max-memory SIZE, the budget a replay is checked against before it starts;
    `jobs`: the command has --jobs, whose processes share the default budget (its
    help says so only then)."""
    shared = ", shared by the --jobs processes" if jobs else ""
    return click.option(
        "--max-memory", metavar="SIZE", callback=_memory_budget,
        help="Refuse, before replaying, a trace whose replay can need more memory than "
             f"SIZE (512M, 8G, or none) [default: half of the memory available{shared}].")
