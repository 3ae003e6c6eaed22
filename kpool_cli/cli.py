"""The `kpool` command line: parse, call, render, exit. Nothing else: what a replay
is, how records are counted and the exit code decided (contracts/tally.py), how reports
are framed (report/json_report.py) and how the views word things live elsewhere.

Exit status of every command (docs/FORMATS.md): 0 pass, 1 findings at or above
`--fail-on`, 2 bad usage, an invalid trace, or an internal error. Never a
traceback; `--output` files are written whole or not at all.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import sys
import textwrap
from collections.abc import Iterator
from typing import NoReturn, TextIO

import click

from . import __version__, signals
from .backend.budget import (
    ReplayTooLarge,
    check_replay_memory,
    default_max_memory,
    parse_memory,
)
from .backend.store import BACKENDS, DEFAULT_BACKEND, make_backend
from .contracts.files import OutputError, check_outputs, written_whole
from .contracts.report_format import report_schema
from .contracts.tally import FAIL_ON, Record, Tally, exit_code, tallied
from .options import Float, Int, jobs_option
from .replay import replay
from .report.check_formats import CI_FORMATS
from .report.check_formats import FORMATS as CHECK_FORMATS
from .report.json_report import write_report, write_reports
from .report.select import Selection, parse_ubatch_range
from .signals import Terminated
from .trace.format import N_SEQ_MAX_MAX
from .trace.load import MAX_TOKENS, Problem, TraceError
from .trace.model import Trace
from .trace.schema import trace_schema
from .verdict.expect import load_checked
from .versions import DEFAULT_VERSION, VERSIONS, EngineVersion, VersionError, load_version
from .wording import visible

EXIT_BAD_INPUT = 2
_ENGINES = ", ".join(VERSIONS)  # the registry: the one list of versions in help


def _fail(message: str, *more_lines: str) -> NoReturn:
    """Exit 2 with `kpool: message` and `more_lines` below it, each line made visible:
    no text taken from an input (a path, a name) can break a line or fake one."""
    click.echo("\n".join(visible(line) for line in (f"kpool: {message}", *more_lines)),
               err=True)
    sys.exit(EXIT_BAD_INPUT)


def _invalid(e: TraceError) -> NoReturn:
    """Exit 2 for an invalid trace: every problem on its own line (TraceError's); a
    file that could not be read at all (missing, a FIFO...) says just that."""
    if e.unread:
        _fail(*str(e).split("\n"))
    _fail("invalid trace", *str(e).split("\n"))


def _refuse_outputs(inputs: tuple[str, ...], **outputs: str | None) -> None:
    """Exit 2, before any work, for an output that would destroy an input or a non-file."""
    try:
        check_outputs(inputs, [(f"--{k}", v) for k, v in outputs.items()])
    except OutputError as e:
        _fail(str(e))


@contextlib.contextmanager
def _output(path: str | None) -> Iterator[TextIO]:
    """stdout, or a file that appears only when the run completes."""
    if path is None or path == "-":
        yield sys.stdout
        return
    with written_whole(path) as f:
        yield f


def _version_for(name: str | None, trace_engine: str | None) -> EngineVersion:
    """--engine (even empty: an error), else the trace's `engine:`, else the default."""
    try:
        return load_version(name if name is not None else trace_engine or DEFAULT_VERSION)
    except VersionError as e:
        _fail(str(e))


def _memory_budget(ctx, param, value: str | None) -> int | None:
    if value is None:
        return default_max_memory()
    try:
        return parse_memory(value)
    except ValueError as e:
        raise click.BadParameter(str(e)) from e


def _ubatch_ranges(ctx, param, values: tuple[str, ...]) -> tuple[tuple[int, int], ...]:
    try:
        return tuple(parse_ubatch_range(v) for v in values)
    except ValueError as e:
        raise click.BadParameter(str(e)) from e


# the bounds on a trace's work, the same for every command that replays
_max_tokens_option = click.option(
    "--max-tokens", type=Int(1, 2**40), default=MAX_TOKENS, show_default=True,
    metavar="N", help="Refuse, before replaying, a trace of more than N tokens (a trace is "
                      "untrusted input).")
_max_memory_option = click.option(
    "--max-memory", metavar="SIZE", callback=_memory_budget,
    help="Refuse, before replaying, a trace whose replay can need more memory than SIZE "
         "(512M, 8G, or none) [default: half of the memory available].")


class _OutOfMemory(Exception):
    """A MemoryError, with the trace whose replay ran out."""


@contextlib.contextmanager
def _naming_the_trace(trace) -> Iterator[None]:
    try:
        yield
    except MemoryError:
        raise _OutOfMemory(trace.path) from None


class _ReaderLeft(Exception):
    """stdout's reader left (a BrokenPipeError), carried past click, which would turn
    it into exit 1."""


class _Interrupted(BaseException):
    """Ctrl-C, carried past click, which would print a blank line and `Aborted!`."""


class _TerminatedPast(BaseException):
    """SIGTERM, carried past click, which would take it for a Ctrl-C."""


class _Group(click.Group):
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
        except Terminated:
            raise _TerminatedPast from None
        except KeyboardInterrupt:
            raise _Interrupted from None


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="kpool")
def cli() -> None:
    """Replay and inspect traces of llama.cpp's k-pool indexer cache."""


@cli.command("replay")
@click.argument("traces", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("--engine", "engine", metavar="NAME",
              help=f"The engine version: {_ENGINES}, or package.module:Name. "
                   "Default: rep-once, unless the trace's `engine:` names one.")
@click.option("--format", "fmt", type=click.Choice(["text", "json", *CI_FORMATS]),
              default="text", show_default=True,
              help="Text for people, JSON (docs/FORMATS.md) for machines; junit, github, "
                   "sarif: the findings as `kpool check` writes them, for CI.")
@click.option("--output", "-o", metavar="FILE",
              help="Write the report to FILE (atomically) instead of stdout.")
@click.option("--fail-on", type=click.Choice(FAIL_ON), default="error", show_default=True,
              help="Exit 1 when a finding of this severity or above is found.")
@click.option("--pools", type=click.Choice(["marked", "all"]), default="marked",
              show_default=True, help="List the marked pools of each ubatch, or every pool.")
@click.option("--check", is_flag=True,
              help="Fail (exit 1) when an `expect` of the trace does not hold.")
@click.option("--ubatch", "ubatch", metavar="N|A..B", multiple=True, callback=_ubatch_ranges,
              help="Text: show ubatch N, or the ubatches of the half-open range A..B (A.. "
                   "to the end). Repeatable.")
@click.option("--seq", "seq", type=Int(0, N_SEQ_MAX_MAX - 1), multiple=True,
              help="Text: show the ubatches that decode, re-pool or flag sequence S. "
                   "Repeatable.")
@click.option("--only-findings/--all-ubatches", "only_findings", default=None,
              help="Text: show only ubatches and ops with findings [default: only past "
                   "200 ubatches with no other navigation option].")
@click.option("--color/--no-color", "color", default=None,
              help="Colour the text view [default: on a terminal, unless NO_COLOR is set; "
                   "FORCE_COLOR forces it].")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar on stderr.")
@click.option("--html", "html", metavar="FILE",
              help="Also save the rich view as HTML (atomically), e.g. for CI artifacts.")
@click.option("--svg", "svg", metavar="FILE",
              help="Also save the rich view as SVG (atomically), e.g. for a bug report.")
@_max_tokens_option
@_max_memory_option
@click.option("--backend", "backend", type=click.Choice(BACKENDS), default=DEFAULT_BACKEND,
              show_default=True,
              help="Value backend (key rows, pooling, KP001 values, KP003): numba, its numpy "
                   "twin, or none for the model-only replay.")
def replay_cmd(traces: tuple[str, ...], engine: str | None, fmt: str, output: str | None,
               fail_on: str, pools: str, check: bool, ubatch: tuple[tuple[int, int], ...],
               seq: tuple[int, ...], only_findings: bool | None, color: bool | None,
               quiet: bool, html: str | None, svg: str | None, max_tokens: int,
               max_memory: int | None, backend: str) -> None:
    """Replay TRACES through an engine version and report what each ubatch did.

    Exit status: 0 pass, 1 findings at or above --fail-on (or a failed expect with
    --check), 2 bad usage or an invalid trace."""
    from .report.text import TextOutput, may_draw_rich, ticker_for, ticking

    _refuse_outputs(traces, output=output, svg=svg, html=html)
    if fmt != "text" and (html or svg):
        _fail("--html and --svg save the text view: use them with --format text")
    loaded = [_load(path, max_tokens) for path in traces]  # every trace, before any engine
    runs = [(t, _version_for(engine, t.engine)) for t in loaded]
    rich_view = fmt == "text" and may_draw_rich(html, svg, color)
    for t, _ in runs:
        try:
            check_replay_memory(t, backend, max_memory, cell_map=rich_view)
        except ReplayTooLarge as e:
            _fail(str(e))
    value_backend = None if backend == "none" else backend
    if fmt in CI_FORMATS:  # the findings as `kpool check` writes them, nothing pinned
        from .check import CheckJob, run_checks
        from .check import exit_code as check_exit_code

        jobs = [CheckJob(t.path, engine or t.engine or DEFAULT_VERSION, backend, fail_on,
                         max_tokens=max_tokens, max_memory=max_memory, pin=False,
                         expectations=check) for t in loaded]
        with _output(output) as out:
            done = _write_check(out, fmt, run_checks(jobs), fail_on)
        sys.exit(check_exit_code(done))

    def replayed(trace: Trace, version: EngineVersion, tally: Tally, cell_map: bool = False
                 ) -> Iterator[Record]:
        """The trace's records, each fed to `tally` on its way to the renderer."""
        return tallied(replay(trace, version, make_backend(backend, trace),
                              pools_all=pools == "all", cell_map=cell_map), tally)

    tallies: list[Tally] = []
    invalid: list[Problem] = []  # why a trace turned out invalid mid-replay (JSON)
    try:
        with _output(output) as out:
            if fmt == "text":
                text = TextOutput(out, color=color, quiet=quiet, html=html, svg=svg)
                for trace, version in runs:
                    tally = Tally(fail_on=fail_on, check=check)
                    tallies.append(tally)
                    with _naming_the_trace(trace):
                        text.run(trace, version, value_backend,
                                 replayed(trace, version, tally, cell_map=text.rich), tally,
                                 Selection.of(trace, ubatch, seq, only_findings), pools == "all")
                text.close()
            else:
                def write_one(run: tuple[Trace, EngineVersion], lead: str) -> Tally:
                    trace, version = run
                    tally = Tally(fail_on=fail_on, check=check)
                    with (_naming_the_trace(trace),
                          ticker_for(trace, quiet=quiet, color=color,
                                     shares_terminal=False) as ticker):
                        write_report(out, trace, version.name, value_backend,
                                     ticking(replayed(trace, version, tally), ticker), tally,
                                     run_form=pools != "all", lead=lead)
                    return tally

                tallies = write_reports(out, runs, write_one)
                invalid = [p for t in tallies for p in t.problems]
                if invalid and out is not sys.stdout:
                    raise TraceError(invalid)  # exit 2 leaves no output file
    except TraceError as e:  # met mid-replay; an output file, if any, is not kept
        _invalid(e)
    if invalid:  # on stdout the JSON closed, saying why
        _invalid(TraceError(invalid))
    sys.exit(exit_code(tallies))


def _load(path: str, max_tokens: int) -> Trace:
    try:
        return load_checked(path, max_tokens=max_tokens)
    except TraceError as e:
        _invalid(e)


@cli.command("explain")
@click.argument("code", required=False)
@click.option("--list", "list_codes", is_flag=True, help="List every finding code.")
@click.option("--color/--no-color", "color", default=None,
              help="Colour [default: on a terminal, unless NO_COLOR is set].")
def explain_cmd(code: str | None, list_codes: bool, color: bool | None) -> None:
    """What finding CODE (KP001, or its name: scatter-race) means, why it is harmful, a
    minimal trace that triggers it, and how to fix the engine."""
    from .report.terminal import Manners, make_console
    from .report.view import print_code_list, print_explanation
    from .verdict.codes import CODES
    from .verdict.explain import EXPLANATIONS, explain_text, resolve

    if list_codes == (code is not None):
        _fail("give a CODE (kpool explain KP001) or --list")
    manners = Manners.detect(sys.stdout, color=color)
    rich = manners.is_terminal or manners.color
    if list_codes:
        if rich:
            print_code_list(make_console(sys.stdout, manners))
        else:
            for c in CODES.values():
                click.echo(_hanging(f"{c.code}  {c.name:16} {c.severity:8} ", c.summary))
        return
    found = resolve(code or "")
    if found is None:
        _fail(f"unknown finding code {code!r}: known codes are {', '.join(CODES)} "
              "(kpool explain --list)")
    if rich:
        print_explanation(make_console(sys.stdout, manners), EXPLANATIONS[found])
    else:
        click.echo(explain_text(found), nl=False)


@cli.command("schema")
@click.argument("which", type=click.Choice(["trace", "report", "check"]))
def schema_cmd(which: str) -> None:
    """Print the JSON Schema of the trace (YAML as parsed), of the report, or of
    `kpool check --output-format json`."""
    from .contracts.report_format import check_schema

    doc = {"trace": trace_schema, "report": report_schema, "check": check_schema}[which]()
    click.echo(json.dumps(doc, indent=2))


@cli.command("engines")
def engines_cmd() -> None:
    """List the registered engine versions."""
    width = max(len(name) for name in VERSIONS)
    for v in VERSIONS.values():
        click.echo(_hanging(f"{visible(v.name):{width}}  ", visible(v.description)))


@cli.command("diff")
@click.argument("inputs", nargs=-1, required=True, type=click.Path())
@click.option("--base", metavar="ENGINE",
              help=f"Base engine for traces: {_ENGINES}, or package.module:Name. "
                   "Default: cache-safe.")
@click.option("--head", metavar="ENGINE",
              help="Head engine (the candidate) for traces. Default: rep-once.")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text",
              show_default=True, help="Text for people (side by side on a terminal, plain "
                                      "when piped), JSON for machines.")
@click.option("--output", "-o", metavar="FILE",
              help="Write the diff to FILE (atomically) instead of stdout.")
@click.option("--fail-on-change", is_flag=True,
              help="Exit 1 on any behavioural difference (n_new, marked pools, scatter rows, "
                   "findings, stale positions, statuses), not only on a regression. Cost "
                   "counters never fail.")
@click.option("--ignore", "ignore", metavar="CODES", multiple=True,
              help="Finding codes or prefixes (KP005, KP00) whose appearance in head is "
                   "shown but not a regression. Repeatable, or comma-separated.")
@click.option("--force", is_flag=True,
              help="Compare two reports even when they are not of the same trace (sha256).")
@click.option("--backend", type=click.Choice(BACKENDS), default=None,
              help="Value backend for traces [default: none]. The diff compares engine "
                   "decisions, which need no values; numba or numpy also compute KP001 "
                   "values and KP003 (stale reads), at a cost.")
@jobs_option(1, "Replay traces on N processes.")
@_max_tokens_option
@_max_memory_option
def diff_cmd(inputs: tuple[str, ...], base: str | None, head: str | None, fmt: str,
             output: str | None, fail_on_change: bool, ignore: tuple[str, ...], force: bool,
             backend: str | None, jobs: int, max_tokens: int, max_memory: int | None
             ) -> None:
    """Compare two engine versions on TRACES, or two saved JSON reports.

    \b
    Examples:
      kpool diff traces/*.yaml
          cache-safe (base) vs rep-once (head), the defaults
      kpool diff t.yaml --base rep-once --head mypkg.engine:Candidate
          a candidate engine of yours against rep-once
      kpool diff a.json b.json
          two saved `kpool replay --format json` reports
      kpool diff traces/*.yaml --head mypkg.engine:Candidate --format json
          for CI: the diff as JSON (-o diff.json for a file), exit 1 on a
          regression

    Each trace is replayed under --base and --head and aligned ubatch by ubatch (by op
    and position in the batch) until the runs part (one side aborts, or rejects a decode
    the other applies). Shown: the differing ubatches and events side by side, findings
    fixed and introduced, pools re-pooled and cells scanned base vs head.

    \b
    Exit status:
      0  no regression (behaviour may differ; see --fail-on-change)
      1  a regression: head has a finding base does not (or, with
         --fail-on-change, any behavioural difference)
      2  bad usage, an invalid trace, an unknown engine, mixing reports with
         traces, or reports of different traces without --force
    """
    from .diff.compare import DiffResult, compare, ignore_selectors
    from .diff.runs import DiffInputError, gather
    from .inputs import trace_paths
    from .report.diff_view import write_diff

    files, empty = trace_paths(inputs, unique=False)  # a folder: the traces in it
    if empty:
        _fail(f"no traces (*.yaml, *.yml) under {empty[0]}")
    _refuse_outputs((*inputs, *files), output=output)
    try:
        selectors = ignore_selectors(ignore)
    except ValueError as e:
        _fail(str(e))
    try:
        pairs, warnings = gather(files, base=base, head=head, backend=backend, jobs=jobs,
                                 force=force, max_tokens=max_tokens, max_memory=max_memory)
    except DiffInputError as e:
        _fail(*str(e).split("\n"))
    for w in warnings:
        click.echo(f"kpool: warning: {w}", err=True)
    result = DiffResult(tuple(compare(b, h) for b, h in pairs), fail_on_change, selectors)
    with _output(output) as out:
        write_diff(out, result, fmt)
    sys.exit(result.exit_code)


def _hanging(head: str, text: str, width: int = 80) -> str:
    """`head` then `text` filled to `width` columns, continued under `text`, never
    breaking a word (nor at its hyphens)."""
    return textwrap.fill(text, width, initial_indent=head, subsequent_indent=" " * len(head),
                         break_on_hyphens=False, break_long_words=False)


def _codes(values: tuple[str, ...]) -> tuple[str, ...]:
    """Codes given as repeated or comma-separated options; exit 2 for an unknown one."""
    from .verdict.codes import CODES

    out = tuple(c.strip().upper() for v in values for c in v.split(",") if c.strip())
    unknown = [c for c in out if c not in CODES]
    if unknown:
        _fail(f"unknown finding code {unknown[0]!r}: known codes are {', '.join(CODES)}")
    return out


def _gen_command(scenario) -> click.Command:
    """`kpool gen NAME`: its options are the scenario's sizes (gen/scenarios.py)."""
    from .trace.format import SEED_MAX

    def run(seed: int, output: str | None, **sizes: int) -> None:
        from .report.text import progress_bar, write_trace

        _refuse_outputs((), output=output)
        bar = progress_bar(0, f"kpool gen {scenario.name}", unit="ops")  # its delay: from now
        try:
            trace = scenario.generate(seed, **sizes)
        except ValueError as e:
            _fail(str(e))
        with _output(output) as out, bar:
            write_trace(out, trace, bar)

    params: list[click.Parameter] = [
        click.Option(["--seed"], type=Int(0, SEED_MAX), default=0,
                     show_default=True, help="The seed: the same seed gives the same trace."),
        click.Option(["--output", "-o"], metavar="FILE",
                     help="Write the trace to FILE (whole or not at all) [default: stdout]."),
    ]
    params += [click.Option([size.option, size.name], type=Int(size.lo, size.hi),
                            default=size.default, show_default=True, metavar="N",
                            help=f"{size.doc}.")
               for size in scenario.sizes]
    return click.Command(scenario.name, callback=run, params=params, help=scenario.help,
                         short_help=scenario.doc)


@cli.group("gen")
def gen_cmd() -> None:
    """Write a generated trace (format v1): a seeded, deterministic scenario whose sizes
    are options; its description says how to regenerate it."""


def _add_gen_commands() -> None:
    from .gen.scenarios import SCENARIOS

    for scenario in SCENARIOS.values():
        gen_cmd.add_command(_gen_command(scenario))


_add_gen_commands()


@cli.command("check")
@click.argument("paths", nargs=-1, required=True, type=click.Path())
@click.option("--engine", "engines", metavar="NAME", multiple=True,
              help=f"Check under this engine only ({_ENGINES}, or "
                   "package.module:Name). Repeatable. Default: the engines the trace's "
                   "expect items name, plus rep-once and cache-safe for those naming none.")
@click.option("--fail-on", type=click.Choice(FAIL_ON), default=None,
              help="Fail on an unpinned finding of this severity or above [default: error].")
@click.option("--ignore", "ignore", metavar="CODES", multiple=True,
              help="Finding codes that never fail the check (added to the settings' "
                   "ignore). Repeatable, or comma-separated.")
@click.option("--output-format", "fmt", type=click.Choice(CHECK_FORMATS), default=None,
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
@_max_tokens_option
@_max_memory_option
def check_cmd(paths: tuple[str, ...], engines: tuple[str, ...], fail_on: str | None,
              ignore: tuple[str, ...], fmt: str | None, output: str | None,
              jobs: int | None, backend: str, no_config: bool, max_tokens: int,
              max_memory: int | None) -> None:
    """Check the traces in PATHS (files, or folders searched recursively for *.yaml and
    *.yml) as a CI gate: each is replayed under every engine its expect items name;
    every expect must hold, and no finding at or above --fail-on may be left
    unpinned (a code listed in an expect's findings for that engine is pinned).

    \b
    Settings: [tool.kpool] of the nearest pyproject.toml, or kpool.toml, from the
    current folder upwards (engines, fail-on, ignore, per-file-ignores,
    output-format, jobs); an option given here beats the file.

    \b
    Exit status:
      0  every trace passed under every engine
      1  an expect did not hold, or an unpinned finding at or above --fail-on
      2  bad usage, a bad settings file, or an invalid trace
    """
    from pathlib import Path

    from .check import exit_code as check_exit_code
    from .check import plan, run_checks
    from .inputs import trace_paths
    from .settings import SettingsError, load_settings

    try:
        settings = load_settings(Path.cwd(), no_config=no_config)
    except SettingsError as e:
        _fail(str(e))
    files, empty = trace_paths(paths)
    # every file read is an input: the traces found in a folder, the settings file
    _refuse_outputs((*paths, *files, *([str(settings.source)] if settings.source else [])),
                    output=output)
    engines = engines or settings.engines or ()
    for spec in engines:
        _version_for(spec, None)  # an unknown engine: exit 2 before any work
    fail_on = fail_on or settings.fail_on or "error"
    fmt = fmt or settings.output_format or "text"
    jobs = jobs or settings.jobs or 1
    extra = frozenset(_codes(ignore) + settings.ignore)
    if empty:
        _fail(f"no traces (*.yaml, *.yml) under {empty[0]}")

    def ignored_for(path: Path) -> frozenset[str]:
        return extra | settings.ignored_for(path)

    from .report.terminal import stream_is_terminal
    from .report.text import progress_bar, ticking_each

    # a bar over the traces as they load, then over the runs; the line a run writes to
    # the terminal (text, github) is its own progress
    bar = progress_bar(len(files), "kpool check: loading", unit="traces",
                       shares_terminal=output in (None, "-") and fmt in ("text", "github")
                       and stream_is_terminal(sys.stdout))
    units: list = []
    with bar:
        for path in files:
            units += plan([path], engines, backend=backend, fail_on=fail_on,
                          ignored_for=ignored_for, max_tokens=max_tokens,
                          max_memory=max_memory)
            bar.tick()
        bar.label, bar.unit, bar.total, bar.done = "kpool check", "runs", len(units), 0
        results = ticking_each(run_checks(units, jobs), bar)
        with _output(output) as out:
            done = _write_check(out, fmt, results, fail_on)
    sys.exit(check_exit_code(done))


def _write_check(out: TextIO, fmt: str, results, fail_on: str) -> list:
    from .report.check_formats import write_check
    from .report.check_junit import MissingExtra

    try:
        return write_check(out, fmt, results, fail_on)
    except MissingExtra as e:
        _fail(str(e))


@cli.command("fuzz")
@click.option("--engine", "engine", required=True, help="Engine version (name or module:Name).")
@click.option("--runs", type=Int(1, 10_000_000), default=1000, show_default=True)
@click.option("--seed", type=Int(0, 2**62), default=0, show_default=True,
              help="Run r replays random_trace(seed + r): any run is reproducible.")
@jobs_option(1, "Fuzz on N processes.")
@click.option("--time-budget", type=Float(0.1, 366 * 86400), default=None, metavar="SECONDS",
              help="Stop after this many seconds (the runs done are reported).")
@click.option("-o", "out_dir", default="fuzz-out", show_default=True,
              help="Folder for the shrunk traces (one per code and signature).")
@click.option("--backend", type=click.Choice(BACKENDS), default="none", show_default=True,
              help="Value backend: none is the model only (KP003 unseen), numba sees KP003.")
@click.option("--dask", "dask_address", default=None,
              help="Run on a Dask distributed cluster at ADDRESS (kpool[dask]).")
@click.option("--base", "base", default=None, metavar="ENGINE",
              help="Look only for behaviour differences from ENGINE, as `kpool diff "
                   "--base ENGINE` shows them, shrinking the first one.")
def fuzz_cmd(engine: str, runs: int, seed: int, jobs: int, time_budget: float | None,
             out_dir: str, backend: str, dask_address: str | None, base: str | None) -> None:
    """Replay random traces under ENGINE, check kpool's invariants, shrink each new
    finding to a minimal trace with an `expect` pinning it. Exit 0 when kpool found no
    defect of its own (engine findings are what fuzzing is for), 1 on a defect. With
    --base, the findings are the traces whose behaviour differs from the base's."""
    import time
    from pathlib import Path

    from .gen.fuzz import campaign, save_new_shrunk, tasks_for
    from .report.fuzz_text import FuzzBar, render_summary
    from .report.terminal import Manners, make_console, stream_is_terminal
    from .workers import in_order

    try:
        version = load_version(engine)
        if base is not None:
            load_version(base)
    except VersionError as e:
        _fail(str(e))
    if not out_dir:
        _fail("-o: the path is empty (give the folder for the shrunk traces)")
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        _fail(f"-o {out_dir}: not a folder")
    from .cluster import ClusterError, in_order_dask

    if dask_address is not None:
        def runner(fn, units):
            return in_order_dask(fn, units, dask_address)
    else:
        def runner(fn, units):
            return in_order(fn, units, jobs)
    tasks = tasks_for(engine, runs, seed, backend, base)
    err = sys.stderr
    console = (make_console(err, Manners.detect(err)) if stream_is_terminal(err) else None)
    bar = FuzzBar(console, runs)
    start = time.monotonic()
    files: dict[tuple[str, str], str] = {}
    totals = None
    try:
        for totals in campaign(tasks, runner):
            bar.update(totals)
            files.update(save_new_shrunk(totals, out))
            if time_budget is not None and time.monotonic() - start > time_budget:
                break  # leaving the loop closes the campaign and ends its workers
    except (OutputError, ClusterError) as e:
        _fail(str(e))
    finally:
        bar.close()
    if totals is None:
        _fail("no run finished")
    render_summary(make_console(sys.stdout, Manners.detect(sys.stdout)), totals, files,
                   version.name, time.monotonic() - start)
    sys.exit(1 if totals.defects else 0)


@cli.command("validate")
@click.argument("paths", nargs=-1, required=True, type=click.Path())
@_max_tokens_option
def validate_cmd(paths: tuple[str, ...], max_tokens: int) -> None:
    """Load the traces in PATHS (files, or folders searched recursively for *.yaml and
    *.yml) without replaying them, and list every problem of every file.

    \b
    Exit status:
      0  every trace is valid
      2  a trace is invalid (or bad usage)
    """
    from .inputs import trace_paths

    files, empty = trace_paths(paths)
    if empty:
        _fail(f"no traces (*.yaml, *.yml) under {empty[0]}")
    from .report.terminal import stream_is_terminal
    from .report.text import progress_bar

    bad = 0
    bar = progress_bar(len(files), "kpool validate", unit="traces",
                       shares_terminal=stream_is_terminal(sys.stdout))
    with bar:
        for path in files:
            try:
                load_checked(path, max_tokens=max_tokens)
            except TraceError as e:
                bad += 1
                lines = [f"INVALID {visible(path)}",
                         *(f"  {line}" for line in str(e).split("\n"))]
            else:
                lines = [f"ok      {visible(path)}"]
            with bar.hidden():  # the lines on the terminal are progress enough
                click.echo("\n".join(lines))
            bar.tick()
    click.echo(f"validated {len(files)} trace{'s' if len(files) != 1 else ''}: "
               f"{len(files) - bad} valid, {bad} invalid")
    sys.exit(EXIT_BAD_INPUT if bad else 0)


EXIT_INTERRUPTED = 128 + signal.SIGINT  # 130, as a shell reports a Ctrl-C
EXIT_TERMINATED = 128 + signal.SIGTERM  # 143
EXIT_BROKEN_PIPE = 128 + signal.SIGPIPE  # 141, as a shell filter killed by SIGPIPE


def main() -> None:
    """The `kpool` script. Exit status: the command's (0, 1, 2), or 2 for bad usage
    or an internal error, 130 on Ctrl-C, 143 on SIGTERM, 141 when stdout's reader left
    (`kpool replay t.yaml | head -1`): never 1, which means findings."""
    signals.install()
    try:
        try:
            code = cli.main(prog_name="kpool", standalone_mode=False)
        except SystemExit as e:  # a command's sys.exit: its code, once stdout is out
            code = e.code
        sys.stdout.flush()  # a full disk or a closed pipe shows here at the latest
    except click.ClickException as e:  # bad usage: click's message and usage line
        shown = io.StringIO()
        e.show(file=shown)  # it quotes the arguments: made visible like any input
        _stderr_line(visible(shown.getvalue().rstrip("\n"), keep_newlines=True))
        code = e.exit_code
    except (Terminated, _TerminatedPast):
        _stderr_line("kpool: terminated")
        code = EXIT_TERMINATED
    except (KeyboardInterrupt, _Interrupted, click.exceptions.Abort):
        _stderr_line("kpool: interrupted")
        code = EXIT_INTERRUPTED
    except (BrokenPipeError, _ReaderLeft):
        # the reader left: say nothing more
        _drop_stdout()
        code = EXIT_BROKEN_PIPE
    except OutputError as e:  # a missing or read-only directory, a full disk ...
        _stderr_line(f"kpool: {visible(str(e))}")
        code = EXIT_BAD_INPUT
    except OSError as e:  # writing stdout (> /dev/full), or a file a command writes
        where = visible(str(e.filename)) if e.filename else "standard output"
        _stderr_line(f"kpool: cannot write {where}: {e.strerror or type(e).__name__}")
        _drop_stdout()
        code = EXIT_BAD_INPUT
    except (MemoryError, _OutOfMemory) as e:  # over a limit the budget cannot see (ulimit -v)
        where = f"{visible(str(e))}: " if isinstance(e, _OutOfMemory) else ""
        _stderr_line(f"kpool: {where}out of memory: this replay needs more memory than the "
                     "process may take (ulimit, cgroup); --max-memory sets the budget checked "
                     "before a replay starts")
        code = EXIT_BAD_INPUT
    except Exception as e:  # a bug in kpool, not in the input: no traceback, exit 2
        _stderr_line(f"kpool: internal error: {type(e).__name__}: {visible(str(e))}\n"
                     "Please report it with the trace that caused it "
                     "(KPOOL_TRACEBACK=1 shows where).")
        if os.environ.get("KPOOL_TRACEBACK"):
            raise
        code = EXIT_BAD_INPUT
    if code in (0, 1) and (missed := signals.lost()) is not None:
        # a signal Python dropped (raised inside a gc callback): the run still ends as it says
        terminated = isinstance(missed, Terminated)
        _stderr_line("kpool: terminated" if terminated else "kpool: interrupted")
        code = EXIT_TERMINATED if terminated else EXIT_INTERRUPTED
    sys.exit(code if isinstance(code, int) else 0)


def _drop_stdout() -> None:
    """stdout can take no more: what is left in its buffer goes nowhere, so that the
    interpreter's final flush does not fail again."""
    with contextlib.suppress(OSError, ValueError):
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _stderr_line(text: str) -> None:
    with contextlib.suppress(OSError):
        sys.stderr.write(text + "\n")
        sys.stderr.flush()
