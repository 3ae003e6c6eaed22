"""Where the two sides of a diff come from: live replays or saved JSON reports.

Owns: `Unit` (one trace under one engine with one backend: plain strings, so it
pickles and a process pool can run it), `run_unit`, `run_units` (in order, on a
process pool when `jobs > 1`), `read_reports` and `pair_reports`.

A unit re-loads its trace and engine in the process that runs it: live objects
never cross a process boundary, only a `RunSummary` comes back. Errors are the
loader's (`TraceError`, `VersionError`) and the report reader's (`ReportError`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from ..backend.store import make_backend
from ..engine.versions import load_version
from ..replay import replay
from ..trace.load import load_trace
from .summary import ReportError, RunSummary, from_records, from_report


@dataclass(frozen=True, slots=True)
class Unit:
    trace_path: str
    engine: str  # a registered name or package.module:Name
    backend: str  # numba | numpy | none


def run_unit(unit: Unit) -> RunSummary:
    """Replay one trace under one engine and summarise it (a pure unit of work)."""
    trace = load_trace(unit.trace_path)
    version = load_version(unit.engine)
    records = replay(trace, version, make_backend(unit.backend, trace))
    return from_records(records, path=trace.path, name=trace.name, sha256=trace.sha256,
                        engine=version.name,
                        backend=None if unit.backend == "none" else unit.backend,
                        config=trace.cache.as_dict())


def run_units(units: Sequence[Unit], jobs: int = 1) -> list[RunSummary]:
    """Every unit's summary, in the order given."""
    if jobs <= 1 or len(units) <= 1:
        return [run_unit(u) for u in units]
    with ProcessPoolExecutor(max_workers=min(jobs, len(units))) as pool:
        return list(pool.map(run_unit, units))


def read_reports(path: str) -> list[RunSummary]:
    """The reports in a `kpool replay --format json` file: one object, or an array."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ReportError(f"{path}: cannot read the report: {e}") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise ReportError(f"{path}:{e.lineno}:{e.colno}: not JSON: {e.msg}") from None
    docs = doc if isinstance(doc, list) else [doc]
    if not docs:
        raise ReportError(f"{path}: an empty array holds no report")
    return [from_report(d, f"{path}" + (f"[{i}]" if isinstance(doc, list) else ""))
            for i, d in enumerate(docs)]


def pair_reports(a: list[RunSummary], b: list[RunSummary], a_path: str, b_path: str,
                 force: bool) -> list[tuple[RunSummary, RunSummary]]:
    """Pair the reports of two files in order. They must be reports of the same
    traces (sha256), unless `force`. Raises ReportError."""
    if len(a) != len(b):
        raise ReportError(f"{a_path} holds {len(a)} report(s), {b_path} holds {len(b)}: "
                          "they are not reports of the same traces")
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        if x.sha256 != y.sha256 and not force:
            n = f" (report {i})" if len(a) > 1 else ""
            raise ReportError(
                f"{a_path} and {b_path} are not reports of the same trace{n}: "
                f"{x.trace_path or '?'} sha256 {x.sha256[:12]} vs {y.trace_path or '?'} "
                f"sha256 {y.sha256[:12]} (--force compares them anyway)")
    return list(zip(a, b, strict=True))


class DiffInputError(Exception):
    """Bad input for `kpool diff` (exit 2): usage, an invalid trace, an unknown engine,
    a report that is not one, or reports of different traces without --force."""


DEFAULT_BASE, DEFAULT_HEAD = "cache-safe", "rep-once"


def is_report_path(path: str) -> bool:
    return path.lower().endswith(".json")


def gather(paths: Sequence[str], *, base: str | None, head: str | None, backend: str | None,
           jobs: int = 1, force: bool = False
           ) -> tuple[list[tuple[RunSummary, RunSummary]], list[str]]:
    """The (base, head) pairs to compare, and warnings for stderr.

    Traces (any path not ending in .json): each is replayed under `base` and `head`
    (defaults cache-safe, rep-once) with `backend` (default none). Reports: exactly
    two .json files, `kpool replay --format json` output, paired in order. Raises
    DiffInputError for anything that must exit 2."""
    from ..engine.versions import VersionError
    from ..trace.load import TraceError

    if not paths:
        raise DiffInputError("give one or more traces, or two JSON reports")
    reports = [p for p in paths if is_report_path(p)]
    if reports and len(reports) != len(paths):
        raise DiffInputError("cannot mix JSON reports with traces: give traces (replayed "
                             "under --base and --head) or exactly two reports")
    warnings: list[str] = []
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
        for x, y in pairs:
            if x.sha256 != y.sha256:
                warnings.append(f"comparing reports of different traces (--force): "
                                f"{x.trace_path} and {y.trace_path}")
            if x.backend != y.backend:
                warnings.append(f"{x.trace_path}: the reports used different value backends "
                                f"({x.backend or 'none'} vs {y.backend or 'none'}): KP001 "
                                "values and KP003 may differ for that reason alone")
        return pairs, warnings
    base, head = base or DEFAULT_BASE, head or DEFAULT_HEAD
    backend = backend or "none"
    try:
        for spec in (base, head):
            load_version(spec)  # an unknown engine fails here, before any replay
        summaries = run_units([Unit(p, e, backend) for p in paths for e in (base, head)], jobs)
    except TraceError as e:
        raise DiffInputError(f"invalid trace\n{e}") from None
    except VersionError as e:
        raise DiffInputError(str(e)) from None
    return [(summaries[2 * i], summaries[2 * i + 1]) for i in range(len(paths))], warnings
