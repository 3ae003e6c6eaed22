"""`kpool check` (the CI gate over folders of traces) and `kpool validate` (load only)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TextIO

import click

from ..backend.store import BACKENDS, DEFAULT_BACKEND
from ..check import OUTPUT_FORMATS
from ..contracts import exits
from ..contracts.tally import FAIL_ON
from ..trace.load import TraceError
from ..verdict.expect import load_checked
from ..versions import expand_all
from ..wording import count, counted, visible
from .io import codes, fail, open_output, refuse_outputs, terminal_lines, version_for
from .options import (
    ENGINES,
    core_option,
    jobs_option,
    load_bounds,
    max_memory_option,
    quiet_option,
    shared_budget,
)


@click.command("check")
@click.argument("paths", nargs=-1, required=True, type=click.Path())
@click.option("--engine", "engines", metavar="NAME", multiple=True,
              help=f"{ENGINES} Check under this engine only; all: under every "
                   "shipped version (and say which versions show each finding). "
                   "Repeatable. Default: the engines the trace's expect items name, plus "
                   "rep-once and cache-safe for those naming none.")
@click.option("--fail-on", type=click.Choice(FAIL_ON), default=None,
              help="Fail on an unpinned finding of this severity or above [default: error].")
@click.option("--ignore", "ignore", metavar="CODES", multiple=True,
              help="Finding codes that never fail the check (added to the settings' "
                   "ignore). Repeatable, or comma-separated.")
@click.option("--output-format", "fmt", type=click.Choice(OUTPUT_FORMATS), default=None,
              help="text (a line per trace and engine, wrapped to a terminal's width), "
                   "json, junit, github (workflow annotations) or sarif (2.1.0) [default: "
                   "text].")
@click.option("--output", "-o", metavar="FILE",
              help="Write the output to FILE (atomically) instead of stdout.")
@jobs_option(None, "Replay on N processes [default: the settings' jobs, else 1].")
@click.option("--backend", type=click.Choice(BACKENDS), default=DEFAULT_BACKEND,
              show_default=True, help="Value backend (none: model-only, KP003 unseen).")
@click.option("--no-config", is_flag=True,
              help="Read no settings file ([tool.kpool] of pyproject.toml, kpool.toml).")
@quiet_option
@load_bounds
@max_memory_option(jobs=True)
@core_option
def check_cmd(paths: tuple[str, ...], engines: tuple[str, ...], fail_on: str | None,
              ignore: tuple[str, ...], fmt: str | None, output: str | None,
              jobs: int | None, backend: str, no_config: bool, quiet: bool,
              max_tokens: int, max_nodes: int | None, max_memory: int | None,
              core: str) -> None:
    """Check the traces in PATHS as a CI gate.

    PATHS are files, or folders searched recursively for *.yaml and *.yml. Each
    trace is replayed under every engine its expect items name; every expect must
    hold, and no finding at or above --fail-on may be left unpinned (a code listed
    in an expect's findings for that engine is pinned). A path given as - is one
    trace read from standard input.

    \b
    Settings: [tool.kpool] of the nearest pyproject.toml, or kpool.toml, from the
    current folder upwards (engines, fail-on, ignore, per-file-ignores,
    output-format, jobs); an option given here beats the file.

    \b
    Exit status:
      0  every trace passed under every engine
      1  an expect did not hold, or an unpinned finding at or above --fail-on
      2  bad usage, a bad settings file, an invalid trace, or a replay process
         that died (--jobs)
    """
    from ..check import exit_code as check_exit_code
    from ..check import plan, run_checks
    from ..inputs import trace_paths
    from ..report.terminal import stream_is_terminal
    from ..report.ticking import progress_bar, ticking_each
    from ..settings import SettingsError, load_settings

    try:
        settings = load_settings(Path.cwd(), no_config=no_config)
    except SettingsError as e:
        fail(str(e))
    for passed, owner in settings.not_trusted:
        click.echo(f"kpool: warning: {visible(str(passed))} is not read: it belongs to "
                   f"another user (uid {owner}), and a settings file decides what a check "
                   "ignores", err=True)
    files, problems = trace_paths(paths)
    engines = expand_all(engines or settings.engines or ())
    # every file read is an input: the traces found in a folder, the settings file, the
    # plug-in engines' modules
    refuse_outputs((*paths, *files, *([str(settings.source)] if settings.source else [])),
                   engines, output=output)
    for spec in engines:
        version_for(spec, None)  # an unknown engine: exit 2 before any work
    fail_on = fail_on or settings.fail_on or "error"
    fmt = fmt or settings.output_format or "text"
    jobs = jobs or settings.jobs or 1
    # the runs: a trace's under each engine given, else under each its expect items
    # name (found as it loads: counted at the most, one a process)
    max_memory = shared_budget(max_memory, jobs, len(files) * (len(engines) or jobs))
    extra = frozenset(codes("--ignore", ignore) + settings.ignore)
    if problems:
        fail(problems[0])

    def ignored_for(path: Path) -> frozenset[str]:
        return extra | settings.ignored_for(path)

    # a bar over the traces as they load, then over the runs; the line a run writes to
    # the terminal (text, github) is its own progress
    bar = progress_bar(len(files), "kpool check: loading", unit="traces", quiet=quiet,
                       shares_terminal=output in (None, "-") and fmt in ("text", "github")
                       and stream_is_terminal(sys.stdout))
    units: list = []
    with bar:
        for path in files:
            units += plan([path], engines, backend=backend, fail_on=fail_on,
                          ignored_for=ignored_for, max_tokens=max_tokens,
                          max_memory=max_memory, core=core, max_nodes=max_nodes)
            bar.tick()
        bar.label, bar.unit, bar.total, bar.done = "kpool check", "runs", len(units), 0
        results = ticking_each(run_checks(units, jobs), bar)
        with open_output(output) as out:
            done = write_check(out, fmt, results, fail_on)
    sys.exit(check_exit_code(done))


def write_check(out: TextIO, fmt: str, results, fail_on: str) -> list:
    """`results` written in `fmt` (report/check_formats.py) as the output of the command
    that runs (check, or replay's CI formats: its click name); exit 2 for a format whose
    extra is not installed."""
    from ..report.check_formats import write_check as write
    from ..report.check_junit import MissingExtra

    command = click.get_current_context().command.name
    assert command is not None  # every command of cli/ is named (cli/main.py)
    try:
        return write(out, fmt, results, fail_on, command)
    except MissingExtra as e:
        fail(str(e))


@click.command("validate")
@click.argument("paths", nargs=-1, required=True, type=click.Path())
@quiet_option
@load_bounds
def validate_cmd(paths: tuple[str, ...], quiet: bool, max_tokens: int,
                 max_nodes: int | None) -> None:
    """Load the traces in PATHS without replaying them.

    PATHS are files, or folders searched recursively for *.yaml and *.yml; every
    problem of every file is listed. A path given as - is one trace read from
    standard input.

    \b
    Exit status:
      0  every trace is valid
      2  a trace is invalid (or bad usage)
    """
    from ..inputs import input_name, trace_paths
    from ..report.terminal import stream_is_terminal
    from ..report.ticking import progress_bar

    files, problems = trace_paths(paths)
    if problems:
        fail(problems[0])
    refuse_outputs(tuple(files))  # stdout open on a trace (`1<>t.yaml`)
    bad = 0
    bar = progress_bar(len(files), "kpool validate", unit="traces", quiet=quiet,
                       shares_terminal=stream_is_terminal(sys.stdout))
    with bar:
        for path in files:
            try:
                load_checked(path, max_tokens=max_tokens, max_nodes=max_nodes)
            except TraceError as e:
                bad += 1
                lines = [f"INVALID {visible(input_name(path))}",
                         *(f"  {line}" for line in str(e).split("\n"))]
            else:
                lines = [f"ok      {visible(input_name(path))}"]
            with bar.hidden():  # the lines on the terminal are progress enough
                click.echo(terminal_lines(lines, sys.stdout), nl=False)
            bar.tick()
    click.echo(f"validated {counted(len(files), 'trace')}: "
               f"{count(len(files) - bad)} valid, {count(bad)} invalid")
    sys.exit(exits.BAD_INPUT if bad else exits.PASS)
