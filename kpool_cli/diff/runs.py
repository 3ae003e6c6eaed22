"""Where the two sides of a diff come from: live replays or saved JSON reports.

Owns: `Unit` (one trace under one engine with one backend: plain strings, so it
pickles and a process pool can run it), `run_unit`, `run_units` (in order, on a
process pool when `jobs > 1`; ticking a `contracts.progress.Progress` the caller
draws, if any), `pair_reports` and `gather`, which turns the command
line's inputs into (base, head) pairs or a `DiffInputError` (exit 2). Reading a
report is `kpool_cli.diff.reports` (untrusted input: bounds, checks, located errors).

A unit re-loads its trace and engine in the process that runs it: live objects
never cross a process boundary, only a `RunSummary` comes back. A trace on standard
input (`-`) is read by this process before a pool's workers fork, which are given
what it read (`inputs.STDIN`). Errors are the
loader's (`TraceError`, `VersionError`), raised in the worker and re-raised here as
they are (both pickle), and the report reader's (`ReportError`); a worker that dies
is a `DiffInputError` too. Every text taken from an input (paths, trace names,
problems) goes through `wording.visible` before it is put in a message.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..backend.budget import ReplayTooLarge, check_replay_memory
from ..backend.store import make_backend
from ..inputs import STDIN, input_name
from ..replay import DEFAULT_CORE, replay
from ..trace.load import MAX_TOKENS
from ..verdict.expect import load_checked
from ..versions import load_version
from ..wording import counted, visible
from ..workers import WorkerDied, in_order
from .compare import left_out
from .reports import ReportError, input_kind, read_reports
from .summary import RunSummary, SummaryTooLarge, from_records

if TYPE_CHECKING:
    from ..contracts.progress import Progress
    from ..contracts.records import ExpectResult, OpEvent, UbatchRecord
    from ..trace.model import Trace

    Record = OpEvent | UbatchRecord | ExpectResult


@dataclass(frozen=True, slots=True)
class Unit:
    trace_path: str
    engine: str  # a registered name or package.module:Name
    backend: str  # numba | numpy | none
    max_tokens: int = MAX_TOKENS  # the loader's bound on the trace's tokens
    max_memory: int | None = None  # the replay's memory budget (bytes; None: none)
    core: str = DEFAULT_CORE  # the replay core (replay.CORE_CHOICES)
    max_nodes: int | None = None  # the loader's node bound (None: its default)
    max_held: int | None = None  # what its summary may hold (bytes; None: no bound)


def run_unit(unit: Unit, bar: _Bar | None = None) -> RunSummary:
    """Replay one trace under one engine and summarise it (a pure unit of work; `bar`,
    in this process only, ticks at every ubatch)."""
    trace = load_checked(unit.trace_path, max_tokens=unit.max_tokens,
                         max_nodes=unit.max_nodes)
    bound = check_replay_memory(trace, unit.backend, unit.max_memory)
    # the summary's share, less what the replay beside it may take
    held = (None if unit.max_held is None or unit.max_memory is None
            else max(0, min(unit.max_held, unit.max_memory - bound.total)))
    version = load_version(unit.engine)
    records: Iterable[Record] = replay(trace, version, make_backend(unit.backend, trace),
                                       core=unit.core)
    if bar is not None:
        records = bar.replaying(unit, trace, version.name, records)
    return from_records(records, path=trace.path, name=trace.name, sha256=trace.sha256,
                        engine=version.name,
                        backend=None if unit.backend == "none" else unit.backend,
                        config=trace.cache.as_dict(), max_bytes=held,
                        budget=unit.max_memory)


def run_units(units: Sequence[Unit], jobs: int = 1, *, progress: Progress | None = None
              ) -> list[RunSummary]:
    """Every unit's summary, in the order given (`workers.in_order`: on a process pool
    when `jobs > 1`). `progress` ticks over the ubatches of every replay when they run
    here, else over the replays as they finish."""
    if progress is None:
        return list(in_order(run_unit, units, jobs))
    if jobs <= 1 or len(units) <= 1:
        progress.unit = "ubatches"
        bar = _Bar(progress, units)
        return [run_unit(u, bar) for u in units]
    out: list[RunSummary] = []
    progress.unit, progress.total = "replays", len(units)
    for summary in in_order(run_unit, units, jobs):
        out.append(summary)
        progress.tick()
    return out


class _Bar:
    """One progress bar over the replays run in this process: its total grows by the
    planned ubatches of every unit of a trace when the trace is first loaded (a
    diff's units are its traces in order, base and head), its label is the trace and
    engine replayed."""

    def __init__(self, ticker: Progress, units: Sequence[Unit]) -> None:
        self.ticker = ticker
        self.units_of = Counter(u.trace_path for u in units)
        self.paths = list(dict.fromkeys(u.trace_path for u in units))
        self.planned: set[str] = set()

    def replaying(self, unit: Unit, trace: Trace, engine: str, records: Iterable[Record]
                  ) -> Iterator[Record]:
        from ..replay import planned_ubatches

        path = unit.trace_path
        if path not in self.planned:
            self.planned.add(path)
            self.ticker.total += planned_ubatches(trace) * self.units_of[path]
        which = (f"{self.paths.index(path) + 1}/{len(self.paths)} "
                 if len(self.paths) > 1 else "")
        self.ticker.label = f"{which}{visible(trace.name or trace.path)} ({visible(engine)})"
        return self._ticking(records)

    def _ticking(self, records: Iterable[Record]) -> Iterator[Record]:
        from ..contracts.records import UbatchRecord

        for rec in records:
            if isinstance(rec, UbatchRecord):
                self.ticker.tick()
            yield rec


def pair_reports(a: list[RunSummary], b: list[RunSummary], a_path: str, b_path: str,
                 force: bool) -> list[tuple[RunSummary, RunSummary]]:
    """Pair the reports of two files in order. They must be reports of the same
    traces (sha256), unless `force`. Raises ReportError."""
    a_file, b_file = visible(input_name(a_path)), visible(input_name(b_path))
    if len(a) != len(b):
        raise ReportError(f"{a_file} holds {counted(len(a), 'report', number=str)}, "
                          f"{b_file} holds {len(b)}: "
                          "they are not reports of the same traces")
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        if x.sha256 != y.sha256 and not force:
            n = f" (report {i})" if len(a) > 1 else ""
            raise ReportError(
                f"{a_file} and {b_file} are not reports of the same trace{n}: "
                f"{visible(x.trace_path) or '?'} sha256 {x.sha256[:12]} vs "
                f"{visible(y.trace_path) or '?'} sha256 {y.sha256[:12]} "
                "(--force compares them anyway)")
    return list(zip(a, b, strict=True))


class DiffInputError(Exception):
    """Bad input for `kpool diff` (exit 2): usage, an invalid trace, an unknown engine,
    a report that is not one, or reports of different traces without --force."""


DEFAULT_BASE, DEFAULT_HEAD = "cache-safe", "rep-once"


def _report_warnings(pairs: list[tuple[RunSummary, RunSummary]]) -> list[str]:
    out: list[str] = []
    for x, y in pairs:
        where = visible(x.trace_path or y.trace_path or "?")
        if x.sha256 != y.sha256:
            out.append(f"comparing reports of different traces (--force): "
                       f"{visible(x.trace_path)} and {visible(y.trace_path)}")
        codes = left_out(x.backend, y.backend)
        if codes:
            out.append(f"{where}: base was replayed with value backend {x.backend or 'none'}, "
                       f"head with {y.backend or 'none'}: {', '.join(codes)} is left out of "
                       "the comparison (only a value backend finds it); make both reports "
                       "with the same --backend to compare it")
    writers = sorted({s.kpool_version for pair in pairs for s in pair})
    if len(writers) > 1:
        out.append("the reports were written by different kpool versions ("
                   + ", ".join(visible(w) for w in writers)
                   + "): a difference may come from kpool, not from the engines")
    return out


def gather(paths: Sequence[str], *, base: str | None, head: str | None, backend: str | None,
           jobs: int = 1, force: bool = False, max_tokens: int = MAX_TOKENS,
           max_nodes: int | None = None, max_memory: int | None = None,
           progress: Progress | None = None, core: str = DEFAULT_CORE
           ) -> tuple[list[tuple[RunSummary, RunSummary]], list[str]]:
    """The (base, head) pairs to compare, and warnings for stderr (made visible).

    Traces: each is replayed under `base` and `head` (defaults cache-safe, rep-once)
    with `backend` (default none), ticking `progress` (`run_units`). Reports (`kpool
    replay --format json` output, told from traces by `reports.input_kind`): exactly
    two files, paired in order.
    Raises DiffInputError for anything that must exit 2."""
    from ..trace.load import TraceError
    from ..versions import VersionError

    if not paths:
        raise DiffInputError("give one or more traces, or two JSON reports")
    kinds = {p: input_kind(p) for p in paths}
    reports = [p for p in paths if kinds[p][0] == "report"]
    if reports and len(reports) != len(paths):
        trace = next(p for p in paths if kinds[p][0] == "trace")
        raise DiffInputError(
            f"cannot mix reports with traces: {visible(input_name(reports[0]))} is a report "
            f"({kinds[reports[0]][1]}), {visible(input_name(trace))} a trace "
            f"({kinds[trace][1]}); give "
            "traces (replayed under --base and --head) or exactly two reports")
    if reports:
        given = [n for n, v in (("--base", base), ("--head", head), ("--backend", backend))
                 if v is not None]
        if given:
            verb = "applies" if len(given) == 1 else "apply"
            raise DiffInputError(f"{', '.join(given)} {verb} to traces only: two reports "
                                 "already name their engines and backend")
        if len(reports) != 2:
            raise DiffInputError(f"compare exactly two reports, not {len(reports)}")
        a_path, b_path = reports
        try:
            pairs = pair_reports(read_reports(a_path), read_reports(b_path), a_path, b_path,
                                 force)
        except ReportError as e:
            raise DiffInputError(str(e)) from None
        return pairs, _report_warnings(pairs)
    base = base if base is not None else DEFAULT_BASE  # an empty name is an error
    head = head if head is not None else DEFAULT_HEAD
    backend = backend or "none"
    try:
        for spec in (base, head):
            load_version(spec)  # an unknown engine fails here, before any replay
        if STDIN in paths and jobs > 1:
            # standard input read here, before a pool's workers fork and are given it
            load_checked(STDIN, max_tokens=max_tokens, max_nodes=max_nodes)
        # the parent holds every run's summary at once: each its share of the budget
        held = None if max_memory is None else max_memory // (2 * len(paths))
        summaries = run_units([Unit(p, e, backend, max_tokens, max_memory, core, max_nodes,
                                    held)
                               for p in paths for e in (base, head)], jobs,
                              progress=progress)
    except TraceError as e:
        raise DiffInputError(str(e) if e.unread else f"invalid trace\n{e}") from None
    except (VersionError, ReplayTooLarge, SummaryTooLarge, WorkerDied) as e:
        raise DiffInputError(visible(str(e))) from None
    return [(summaries[2 * i], summaries[2 * i + 1]) for i in range(len(paths))], []
