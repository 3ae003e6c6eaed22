"""`kpool fuzz`: random traces under an engine, kpool's invariants, shrunk findings
(gen/fuzz.py), on a process pool or a Dask cluster (cluster.py)."""

from __future__ import annotations

import contextlib
import sys

import click

from .. import signals
from ..backend.store import BACKENDS
from ..contracts import exits
from ..contracts.files import OutputError, check_output_folder
from ..trace.format import SEED_MAX
from ..versions import ALL, VERSIONS, VersionError, load_version
from ..wording import visible
from .io import fail
from .options import Float, Int, jobs_option, quiet_option


@click.command("fuzz")
@click.option("--engine", "engine", required=True, metavar="NAME",
              help="An engine version (see kpool engines): BASE, BASE+PATCH or "
                   "package.module:Name; all: every shipped version, saying which show "
                   "each finding.")
@click.option("--runs", type=Int(1, 10_000_000), default=1000, show_default=True,
              help="Random traces to replay.")
@click.option("--seed", type=Int(0, SEED_MAX), default=0, show_default=True,
              help="Run r replays the trace `kpool gen random` writes for seed + r "
                   "(wrapped to 0 past the bound): any run is reproducible.")
@jobs_option(1, "Fuzz on N processes.")
@quiet_option
@click.option("--time-budget", type=Float(0.1, 366 * 86400), default=None, metavar="SECONDS",
              help="Stop after this many seconds (the runs done are reported, and the "
                   "--seed and --runs of the rest).")
@click.option("-o", "--output", "out_dir", default="fuzz-out", show_default=True,
              metavar="FOLDER", help="Folder for the shrunk traces (one per code and "
                                     "signature, replacing a file of that name).")
@click.option("--backend", type=click.Choice(BACKENDS), default="none", show_default=True,
              help="Value backend: none is the model only (KP003 unseen), numba sees KP003.")
@click.option("--dask", "dask_address", default=None, metavar="ADDRESS",
              help="Run on a Dask distributed cluster at ADDRESS instead of -j "
                   "(kpool[dask] on every worker, and a plug-in engine).")
@click.option("--base", "base", default=None, metavar="ENGINE",
              help="Look only for behaviour differences from ENGINE, as `kpool diff "
                   "--base ENGINE` shows them, shrinking the first one.")
def fuzz_cmd(engine: str, runs: int, seed: int, jobs: int, quiet: bool,
             time_budget: float | None,
             out_dir: str, backend: str, dask_address: str | None, base: str | None) -> None:
    """Fuzz ENGINE with random traces, shrinking each new finding.

    Replay random traces under ENGINE on both replay cores, check kpool's
    invariants, shrink each new finding to a minimal trace with an `expect` pinning
    it. Exit 0 when kpool found no defect of its own (engine findings are what fuzzing
    is for; a record where the compiled core differs from the reference core is a
    defect, INV-core), 1 on a defect. With --base, the findings are the traces whose
    behaviour differs from the base's. Ctrl-C ends the campaign with the summary of
    the runs done (exit 130; SIGTERM 143)."""
    import time
    from pathlib import Path

    from ..cluster import ClusterError, in_order_dask
    from ..gen.fuzz import SHRUNK_FILES, Progress, campaign, run_seed, save_new_shrunk, tasks_for
    from ..report.fuzz_text import FuzzBar, render_summary
    from ..report.terminal import Manners, make_console, stream_is_terminal
    from ..workers import in_order

    try:
        name = f"every shipped version ({', '.join(VERSIONS)})" if engine == ALL else \
            load_version(engine).name
        if base is not None:
            load_version(base)
    except VersionError as e:
        fail(str(e))
    if engine == ALL and base is not None:
        fail("--engine all with --base: compare one version with the base at a time "
             "(--engine NAME --base BASE)")
    try:  # the folder can take the shrunk traces: found before the runs, not after
        made = check_output_folder("-o", out_dir, SHRUNK_FILES)
    except OutputError as e:
        fail(str(e))
    out = Path(out_dir)
    # what the folder held before: said after the campaign, as `kpool check` reads it all
    held = {p.name for p in out.glob(SHRUNK_FILES)}

    if dask_address is not None:
        def runner(fn, units):
            return in_order_dask(fn, units, dask_address)
    else:
        def runner(fn, units):
            return in_order(fn, units, jobs)
    tasks = tasks_for(engine, runs, seed, backend, base)
    err = sys.stderr
    console = (make_console(err, Manners.detect(err)) if stream_is_terminal(err) else None)
    bar = FuzzBar(None if quiet else console, runs)
    start = time.monotonic()
    files: dict[tuple[str, str], str] = {}
    replaced: list[str] = []  # what an earlier run left there under a name written now
    totals = Progress()
    signal_met: KeyboardInterrupt | None = None
    problem: str | None = None
    out_of_time = False

    def keep(p: Progress) -> None:  # a finding counted has its shrunk trace, whole
        files.update(save_new_shrunk(p, out, replaced))

    try:
        # closed on the way out: the workers end
        with contextlib.closing(campaign(tasks, runner, totals, keep)) as done:
            for _ in done:
                bar.update(totals)
                if time_budget is not None and time.monotonic() - start > time_budget:
                    out_of_time = True
                    break
    except (OutputError, ClusterError) as e:
        problem = str(e)
    except VersionError as e:  # the engine loaded here: a worker could not load it
        problem = (f"a worker process could not load the engine: {e}"
                   if dask_address is None else
                   f"a Dask worker of {visible(dask_address)} could not load the engine: "
                   f"{e}; every worker loads it itself, with the same kpool: install a "
                   "plug-in's package there, or start `dask worker` with the PYTHONPATH "
                   "that finds it")
    except KeyboardInterrupt as e:  # Ctrl-C, SIGTERM: the runs done are summed up first
        signal_met = e
    finally:
        bar.close()  # before any message: the bar's line is not the message's
    if made and not files:  # made for the shrunk traces, and none came
        with contextlib.suppress(OSError):
            out.rmdir()
    if problem is not None:
        fail(problem)
    if not totals.runs and signal_met is None:
        fail("no run finished")
    if signal_met is not None:
        stopped: tuple[str, int] | None = (
            "terminated" if isinstance(signal_met, signals.Terminated) else "interrupted",
            runs)
    else:
        stopped = ("stopped by --time-budget", runs) if out_of_time else None
    render_summary(make_console(sys.stdout, Manners.detect(sys.stdout)),
                   totals, files, name, time.monotonic() - start,
                   (out_dir, len(held - {Path(p).name for p in files.values()})),
                   stopped=stopped, next_seed=run_seed(seed, totals.runs),
                   replaced=replaced)
    if signal_met is not None:
        raise signal_met  # its exit status and line are main()'s (130, 143...)
    sys.exit(exits.FINDINGS if totals.defects else exits.PASS)
