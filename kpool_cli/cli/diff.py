"""`kpool diff`: parse, gather the two sides (diff/runs.py), compare, render."""

from __future__ import annotations

import sys

import click

from ..backend.store import BACKENDS
from .io import code_items, fail, open_output, refuse_outputs
from .options import (
    ENGINES,
    core_option,
    jobs_option,
    load_bounds,
    max_memory_option,
    quiet_option,
    shared_budget,
)


@click.command("diff")
@click.argument("inputs", nargs=-1, required=True, type=click.Path())
@click.option("--base", metavar="ENGINE",
              help=f"{ENGINES} The base, for traces. Default: cache-safe.")
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
@click.option("--html", "html_out", metavar="FILE", default=None,
              help="Also write the comparison as one page that needs nothing else (it "
                   "opens offline): each trace's "
                   "host work per ubatch and summed, base and head, where their "
                   "decisions part, findings fixed and introduced (written whole).")
@click.option("--force", is_flag=True,
              help="Compare two reports even when they are not of the same trace (sha256).")
@click.option("--backend", type=click.Choice(BACKENDS), default=None,
              help="Value backend for traces [default: none]. The diff compares engine "
                   "decisions, which need no values; numba or numpy also compute KP001 "
                   "values and KP003 (stale reads), at a cost.")
@jobs_option(1, "Replay traces on N processes.")
@quiet_option
@load_bounds
@max_memory_option(jobs=True)
@core_option
def diff_cmd(inputs: tuple[str, ...], base: str | None, head: str | None, fmt: str,
             output: str | None, fail_on_change: bool, ignore: tuple[str, ...], force: bool,
             backend: str | None, jobs: int, quiet: bool, max_tokens: int,
             max_nodes: int | None,
             max_memory: int | None, core: str, html_out: str | None) -> None:
    """Compare two engine versions on TRACES, or two JSON reports.

    \b
    Examples:
      kpool diff traces/*.yaml
          cache-safe (base) vs rep-once (head), the defaults
      kpool diff t.yaml --base rep-once --head mypkg.engine:Candidate
          a candidate engine of yours against rep-once
      kpool diff a.json b.json
          two saved `kpool replay --format json` reports
      kpool gen random --seed 7 | kpool diff -
          an input given as - is read from standard input (a trace or a report)
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
         traces, reports of different traces without --force, or a replay
         process that died (--jobs)
    """
    from ..diff.compare import DiffResult, compare, ignore_selectors
    from ..diff.runs import DiffInputError, gather
    from ..inputs import trace_paths
    from ..report.diff_view import write_diff
    from ..report.ticking import progress_bar
    from ..versions import by_design

    files, problems = trace_paths(inputs, unique=False)  # a folder: the traces in it
    if problems:
        fail(problems[0])
    refuse_outputs((*inputs, *files), (base, head), output=output, html=html_out)
    max_memory = shared_budget(max_memory, jobs, 2 * len(files))  # base and head each
    try:
        selectors = ignore_selectors(code_items("--ignore", ignore))
    except ValueError as e:
        fail(str(e))
    try:
        with progress_bar(0, "kpool diff", quiet=quiet) as bar:
            pairs, warnings = gather(files, base=base, head=head, backend=backend, jobs=jobs,
                                     force=force, max_tokens=max_tokens,
                                     max_nodes=max_nodes, max_memory=max_memory,
                                     progress=bar, core=core)
    except DiffInputError as e:
        fail(*str(e).split("\n"))
    for w in warnings:
        click.echo(f"kpool: warning: {w}", err=True)
    result = DiffResult(tuple(compare(b, h, by_design(b.engine, h.engine)) for b, h in pairs),
                        fail_on_change, selectors)
    with open_output(output) as out:
        write_diff(out, result, fmt)
    if html_out is not None:
        from ..report.diff_page import write_diff_page

        with open_output(html_out) as page:
            write_diff_page(page, result, pairs)
    sys.exit(result.exit_code)
