"""`kpool replay`: parse, call the replay, render (text, JSON, or the CI formats)."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import click

from ..backend.budget import ReplayTooLarge, check_replay_memory
from ..backend.store import BACKENDS, DEFAULT_BACKEND, make_backend
from ..check import CI_FORMATS
from ..contracts.tally import FAIL_ON, Record, Tally, exit_code, tallied
from ..replay import replay
from ..report.json_report import write_report, write_reports
from ..report.select import Selection
from ..trace.format import N_SEQ_MAX_MAX
from ..trace.load import Problem, TraceError
from ..trace.model import Trace
from ..versions import DEFAULT_VERSION, EngineVersion
from .check import write_check
from .io import (
    fail,
    invalid,
    load,
    naming_the_trace,
    open_output,
    refuse_outputs,
    version_for,
)
from .options import (
    ENGINES,
    Int,
    TraceFile,
    core_option,
    load_bounds,
    max_memory_option,
    quiet_option,
    ubatch_ranges,
)


@click.command("replay")
@click.argument("traces", nargs=-1, required=True, type=TraceFile())
@click.option("--engine", "engine", metavar="NAME",
              help=f"{ENGINES} Default: rep-once, unless the trace's `engine:` "
                   "names one.")
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
@click.option("--ubatch", "ubatch", metavar="N|A..B", multiple=True, callback=ubatch_ranges,
              help="Text: show ubatch N, or the ubatches of the half-open range A..B (A.. "
                   "to the end). Repeatable.")
@click.option("--seq", "seq", type=Int(0, N_SEQ_MAX_MAX - 1), multiple=True,
              help="Text: show the ubatches that decode, re-pool or flag this sequence "
                   "(its seq id). Repeatable.")
@click.option("--only-findings/--all-ubatches", "only_findings", default=None,
              help="Text: show only ubatches and ops with findings [default: only past "
                   "200 ubatches with no other navigation option].")
@click.option("--color/--no-color", "color", default=None,
              help="Colour the text view [default: on a terminal, unless NO_COLOR is set; "
                   "FORCE_COLOR forces it].")
@quiet_option
@click.option("--html", "html", metavar="FILE",
              help="Also write the whole replay as one page that needs nothing else "
                   "(it opens offline): a timeline of "
                   "every ubatch (tokens, pools marked, scatter entries, cells scanned, "
                   "findings, edits), the cells over time, and each ubatch's view "
                   "(written whole), e.g. for CI artifacts.")
@click.option("--svg", "svg", metavar="FILE",
              help="Also save the rich view as SVG (atomically), e.g. for a bug report.")
@load_bounds
@max_memory_option(jobs=False)
@click.option("--backend", "backend", type=click.Choice(BACKENDS), default=DEFAULT_BACKEND,
              show_default=True,
              help="Value backend (key rows, pooling, KP001 values, KP003): numba, its numpy "
                   "twin, or none for the model-only replay.")
@core_option
def replay_cmd(traces: tuple[str, ...], engine: str | None, fmt: str, output: str | None,
               fail_on: str, pools: str, check: bool, ubatch: tuple[tuple[int, int], ...],
               seq: tuple[int, ...], only_findings: bool | None, color: bool | None,
               quiet: bool, html: str | None, svg: str | None, max_tokens: int,
               max_nodes: int | None, max_memory: int | None, backend: str, core: str
               ) -> None:
    """Replay TRACES through an engine version, ubatch by ubatch.

    \b
    A trace given as - is read from standard input:
      kpool gen random --seed 7 | kpool replay -

    Exit status: 0 pass, 1 findings at or above --fail-on (or a failed expect with
    --check), 2 bad usage or an invalid trace."""
    from ..report.ticking import ticker_for, ticking

    refuse_outputs(traces, (engine,), output=output, svg=svg, html=html)
    if fmt != "text" and (html or svg):
        fail("--html and --svg save the text view: use them with --format text")
    # every trace, before any engine
    loaded = [load(path, max_tokens, max_nodes) for path in traces]
    runs = [(t, version_for(engine, t.engine)) for t in loaded]
    if fmt == "text":  # the views, and rich: for the text view only
        from ..report.text import TextOutput, may_draw_rich
    rich_view = fmt == "text" and may_draw_rich(html, svg, color)
    for t, _ in runs:
        try:
            check_replay_memory(t, backend, max_memory, cell_map=rich_view)
        except ReplayTooLarge as e:
            fail(str(e))
    value_backend = None if backend == "none" else backend
    if fmt in CI_FORMATS:  # the findings as `kpool check` writes them, nothing pinned
        from ..check import CheckJob, run_checks
        from ..check import exit_code as check_exit_code

        # each job loads its trace again, by the path given (`-` reads the stdin kept)
        jobs = [CheckJob(path, engine or t.engine or DEFAULT_VERSION, backend, fail_on,
                         max_tokens=max_tokens, max_memory=max_memory, pin=False,
                         expectations=check, core=core, max_nodes=max_nodes)
                for path, t in zip(traces, loaded, strict=True)]
        with open_output(output) as out:
            done = write_check(out, fmt, run_checks(jobs), fail_on)
        sys.exit(check_exit_code(done))

    def replayed(trace: Trace, version: EngineVersion, tally: Tally, cell_map: bool = False,
                 spans: bool = False) -> Iterator[Record]:
        """The trace's records, each fed to `tally` on its way to the renderer."""
        return tallied(replay(trace, version, make_backend(backend, trace),
                              pools_all=pools == "all", cell_map=cell_map, spans=spans,
                              core=core), tally)

    tallies: list[Tally] = []
    problems: list[Problem] = []  # why a trace turned out invalid mid-replay (JSON)
    try:
        with open_output(output) as out:
            if fmt == "text":
                text = TextOutput(out, color=color, quiet=quiet, html=html, svg=svg)
                for trace, version in runs:
                    tally = Tally(fail_on=fail_on, check=check)
                    tallies.append(tally)
                    with naming_the_trace(trace):
                        text.run(trace, version, value_backend,
                                 replayed(trace, version, tally, cell_map=text.rich), tally,
                                 Selection.of(trace, ubatch, seq, only_findings), pools == "all")
                text.close()
            else:
                def write_one(run: tuple[Trace, EngineVersion], lead: str) -> Tally:
                    trace, version = run
                    tally = Tally(fail_on=fail_on, check=check)
                    with (naming_the_trace(trace),
                          ticker_for(trace, quiet=quiet, color=color,
                                     shares_terminal=False) as ticker):
                        write_report(out, trace, version.name, value_backend,
                                     ticking(replayed(trace, version, tally, spans=True),
                                             ticker), tally,
                                     run_form=pools != "all", lead=lead)
                    return tally

                tallies = write_reports(out, runs, write_one)
                problems = [p for t in tallies for p in t.problems]
                if problems and out is not sys.stdout:
                    raise TraceError(problems)  # exit 2 leaves no output file
    except TraceError as e:  # met mid-replay; an output file, if any, is not kept
        invalid(e)
    if problems:  # on stdout the JSON closed, saying why
        invalid(TraceError(problems))
    sys.exit(exit_code(tallies))

