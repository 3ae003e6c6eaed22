"""`kpool check`: every trace of a set of files and folders, replayed under the engines
its expectations name, judged as a CI gate: its `expect` items must hold, and no
finding at or above `--fail-on` may go unpinned.

Owns: which engines a trace runs
under (`engines_for`), the unit of work (`CheckJob`, `check_one`), the result record
(`CheckResult` with its `Unmet` expectations, `Flagged` findings and `Problem`s), the
rule of what an `expect` pins (`pinned_codes`), running the jobs in order on a
process pool (`run_checks`), and which versions show each finding (`by_version`: a
trace in a bug report, checked with `--engine all`, says which builds have the bug).

The rules, precisely:
- Engines. `--engine` (repeatable; or `engines` of the settings) replaces the choice.
  Otherwise a trace runs under every engine one of its `expect` items names, plus the
  default engines (`DEFAULT_ENGINES`, the two shipped versions, and the trace's own
  `engine:` if it names another) when some `expect` names no engine or none names
  one. A trace whose every `expect` says `engine: rep-once` runs under rep-once only.
- Pinned. A code is pinned for (trace, engine) when it is listed in the `findings` of
  some `expect` of that trace that applies to that engine (no `engine:`, or that
  one), wherever that `expect` stands: a trace that documents a race by expecting
  KP001 passes however many ubatches raise it. The `expect` itself still checks its
  own op exactly.
- Ignored. A code ignored for the trace (`--ignore`, the settings' `ignore` and
  per-path ignores) neither fails the check nor is listed; it is counted. Ignoring
  a code does not change what an `expect` compares.
- Status. `invalid` (exit 2): the trace does not load, its replay needs more memory
  than allowed, an engine it names does not exist, or it turns out invalid
  mid-replay. Else `fail` (exit 1): an `expect` did not hold, or an unpinned,
  unignored finding is at or above `--fail-on`. Else `pass`. The decision is the
  tally's (`contracts/tally.py`): it is fed the replay's records with the pinned and
  ignored findings taken out, under `check=True`.

Invariants: `check_one` is a pure function of its `CheckJob` (plain strings and
numbers, so it pickles) and returns a `CheckResult` of plain data: live objects never
cross a process boundary. It never raises for a bad trace: every bad input is an
`invalid` result naming file, line and field. `run_checks` yields results in the
order of the jobs, on a pool when asked, and stops its workers at once on an error
or an interrupt (`workers.in_order`, as `kpool diff -j`).

`kpool replay --format junit|github|sarif` runs the same jobs with `pin=False` (no
code is pinned) and `expectations` as its `--check`.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .backend.budget import ReplayTooLarge, check_replay_memory
from .backend.store import make_backend
from .contracts import exits
from .contracts.finding import Finding, severity_rank
from .contracts.records import ExpectResult, OpEvent, UbatchRecord
from .contracts.tally import Tally, tallied
from .inputs import input_name
from .replay import DEFAULT_CORE, replay
from .trace import model as m
from .trace.load import MAX_TOKENS, TraceError
from .verdict.expect import load_checked
from .versions import EngineVersion, VersionError, load_version
from .workers import in_order

DEFAULT_ENGINES = ("rep-once", "cache-safe")
# unpinned findings listed per result (the others are counted): a re-pool-all race
# raises one per ubatch
MAX_LISTED = 50

PASS, FAIL, INVALID = "pass", "fail", "invalid"
STATUSES = (PASS, FAIL, INVALID)
# the names of kpool check's output formats (--output-format, the settings file) and of
# those kpool replay --format also writes; report/check_formats.py writes each
OUTPUT_FORMATS = ("text", "json", "junit", "github", "sarif")
CI_FORMATS = ("junit", "github", "sarif")


@dataclass(frozen=True, slots=True)
class Problem:
    """Why a trace is invalid: where (line, column 1-based; 0: no position), the
    field's dotted path, and what is wrong."""

    file: str
    line: int
    column: int
    field: str
    message: str


@dataclass(frozen=True, slots=True)
class Unmet:
    """An `expect` that did not hold: the expect op (its index and line), the op it
    checked (-1 and line 0: none ran before it), and the differences, each
    (what, expected, actual)."""

    op: int
    line: int
    target: int
    target_line: int
    diffs: tuple[tuple[str, str, str], ...]
    message: str


@dataclass(frozen=True, slots=True)
class Flagged:
    """An unpinned, unignored finding. `fails`: at or above `--fail-on`. `ubatch`: the
    ubatch's index over the replay (None for a finding of an op event). `pinnable`:
    an `expect` could have pinned it (False for `kpool replay`'s CI formats)."""

    code: str
    name: str
    severity: str
    op: int
    line: int
    ubatch: int | None
    message: str
    fails: bool
    pinnable: bool = True


@dataclass(frozen=True, slots=True)
class CheckResult:
    """One trace under one engine. `engine` is the version's name, as every report,
    diff and fuzz summary names it (`EngineVersion.name`: a plug-in given as
    `pkg.mod:Name` is named by its `name`); the spec given where no version loaded
    from it (the problem says why); empty when the trace did not load."""

    path: str
    engine: str
    status: str
    unmet: tuple[Unmet, ...] = ()
    flagged: tuple[Flagged, ...] = ()  # at most MAX_LISTED, failing ones first
    more_flagged: int = 0  # unpinned findings left out of `flagged`
    problems: tuple[Problem, ...] = ()
    expect_passed: int = 0
    expect_failed: int = 0
    ubatches: int = 0
    findings: dict[str, int] = field(default_factory=dict)  # every finding, per code
    pinned: dict[str, int] = field(default_factory=dict)  # findings an expect pins
    ignored: dict[str, int] = field(default_factory=dict)  # findings of ignored codes
    fail_on: str = "error"
    n_failing: int = 0  # unpinned findings at or above fail_on, listed or not
    n_below: int = 0  # unpinned findings below it, listed or not
    first: dict[str, int] = field(default_factory=dict)  # each code's first op

    @property
    def exit_code(self) -> int:
        return exits.of_status(self.status)

    @property
    def failing(self) -> tuple[Flagged, ...]:
        return tuple(f for f in self.flagged if f.fails)


@dataclass(frozen=True, slots=True)
class CheckJob:
    """One (trace, engine) to check: plain data, so a process pool can run it."""

    path: str
    engine: str
    backend: str = "numba"  # numba | numpy | none
    fail_on: str = "error"
    ignored: frozenset[str] = frozenset()
    max_tokens: int = MAX_TOKENS
    max_memory: int | None = None
    pin: bool = True  # a code some `expect` of the trace lists does not fail (check)
    expectations: bool = True  # an unmet `expect` fails (check; replay's --check)
    core: str = DEFAULT_CORE  # the replay core (replay.CORE_CHOICES)
    max_nodes: int | None = None  # the loader's node bound (None: its default)


# -- which traces, which engines ------------------------------------------------------


def _expects(trace: m.Trace) -> list[tuple[int, m.Expect]]:
    return [(i, op) for i, op in enumerate(trace.ops) if isinstance(op, m.Expect)]


def engines_for(trace: m.Trace, override: Sequence[str] = ()) -> tuple[str, ...]:
    """The engines `trace` is checked under (the rule in the module's docstring)."""
    if override:
        return tuple(dict.fromkeys(override))
    expects = [op for _, op in _expects(trace)]
    named = [op.engine for op in expects if op.engine is not None]
    out: list[str] = []
    if not named or any(op.engine is None for op in expects):
        out += DEFAULT_ENGINES
        if trace.engine is not None:
            out.append(trace.engine)
    out += named
    # the shipped versions first, in their order; then the others as named
    return tuple(sorted(dict.fromkeys(out), key=lambda e: (
        DEFAULT_ENGINES.index(e) if e in DEFAULT_ENGINES else len(DEFAULT_ENGINES))))


def pinned_codes(trace: m.Trace, engine: str) -> frozenset[str]:
    """The codes an `expect` of `trace` that applies to `engine` lists."""
    return frozenset(c for _, op in _expects(trace)
                     if op.engine in (None, engine) and op.findings
                     for c in op.findings)


def plan(paths: Sequence[str], engines: Sequence[str], *, backend: str, fail_on: str,
         ignored_for, max_tokens: int = MAX_TOKENS, max_memory: int | None = None,
         core: str = DEFAULT_CORE, max_nodes: int | None = None
         ) -> list[CheckJob | CheckResult]:
    """For each trace of `paths`, in order, its jobs, or the `invalid` result of a
    trace that does not load. `ignored_for(path)`: the codes ignored for that trace."""
    out: list[CheckJob | CheckResult] = []
    for p in paths:
        try:
            trace = load_checked(p, max_tokens=max_tokens, max_nodes=max_nodes)
        except TraceError as e:
            out.append(_invalid(p, "", e))
            continue
        ignored = frozenset(ignored_for(Path(p)))
        out += [CheckJob(p, e, backend, fail_on, ignored, max_tokens, max_memory,
                         core=core, max_nodes=max_nodes)
                for e in engines_for(trace, engines)]
    return out


# -- one (trace, engine) --------------------------------------------------------------


def _invalid(path: str, engine: str, e: TraceError) -> CheckResult:
    path = input_name(path)
    problems = [Problem(p.file, p.line, p.column, p.field, p.message) for p in e.problems]
    if e.truncated:
        problems.append(Problem(path, 0, 0, "<file>",
                                f"(stopped after {len(e.problems)} problems)"))
    return CheckResult(path, engine, INVALID, problems=tuple(problems))


def _line(trace: m.Trace, op: int) -> int:
    return trace.ops[op].loc.line if 0 <= op < len(trace.ops) else 0


def check_one(job: CheckJob) -> CheckResult:
    """Replay the job's trace under its engine and judge it (the rules above)."""
    name = input_name(job.path)  # `-`: <stdin>
    version: EngineVersion | None = None
    try:
        version = load_version(job.engine)
    except VersionError as e:
        refused = str(e)
    engine = job.engine if version is None else version.name  # CheckResult's `engine`
    try:
        trace = load_checked(job.path, max_tokens=job.max_tokens, max_nodes=job.max_nodes)
    except TraceError as e:
        return _invalid(job.path, engine, e)
    if version is None:  # a spec of the command line (an expect names registered ones)
        return CheckResult(name, engine, INVALID, problems=(
            Problem(name, 0, 0, "engine", refused),))
    try:
        check_replay_memory(trace, job.backend, job.max_memory)
    except ReplayTooLarge as e:
        return CheckResult(name, engine, INVALID, problems=(
            Problem(name, 0, 0, "<trace>", str(e)),))
    pinned = pinned_codes(trace, version.name) if job.pin else frozenset()
    every: Counter[str] = Counter()
    first: dict[str, int] = {}
    kept_pinned: Counter[str] = Counter()
    kept_ignored: Counter[str] = Counter()
    flagged: list[Flagged] = []
    unmet: list[Unmet] = []
    fail_rank = None if job.fail_on == "never" else severity_rank(job.fail_on)

    def judged(records: Iterable[OpEvent | UbatchRecord | ExpectResult]
               ) -> Iterator[OpEvent | UbatchRecord | ExpectResult]:
        """The records with the pinned and ignored findings taken out (counted)."""
        for rec in records:
            if isinstance(rec, ExpectResult) or not rec.findings:
                yield rec
                continue
            left: list[Finding] = []
            for f in rec.findings:
                every[f.code] += 1
                first.setdefault(f.code, rec.op)
                if f.code in job.ignored:
                    kept_ignored[f.code] += 1
                elif f.code in pinned:
                    kept_pinned[f.code] += 1
                else:
                    left.append(f)
            yield dataclasses.replace(rec, findings=tuple(left))

    tally = Tally(fail_on=job.fail_on, check=job.expectations)
    records = replay(trace, version, make_backend(job.backend, trace), core=job.core)
    try:
        for rec in tallied(judged(records), tally):
            if isinstance(rec, ExpectResult):
                if not rec.ok and job.expectations:
                    unmet.append(Unmet(rec.op, _line(trace, rec.op), rec.target,
                                       _line(trace, rec.target), rec.diffs, rec.message))
                continue
            ubatch = rec.index if isinstance(rec, UbatchRecord) else None
            for f in rec.findings:
                fails = fail_rank is not None and severity_rank(f.severity) >= fail_rank
                flagged.append(Flagged(f.code, f.name, f.severity, rec.op,
                                       _line(trace, rec.op), ubatch, f.message, fails,
                                       job.pin))
    except TraceError as e:
        return dataclasses.replace(_invalid(job.path, engine, e), ubatches=tally.ubatches)
    flagged.sort(key=lambda f: not f.fails)  # stable: failing first, in replay order
    status = INVALID if tally.problems else FAIL if tally.failed else PASS
    return CheckResult(
        name, engine, status, tuple(unmet), tuple(flagged[:MAX_LISTED]),
        max(0, len(flagged) - MAX_LISTED), (), tally.expect_passed, tally.expect_failed,
        tally.ubatches, dict(sorted(every.items())), dict(sorted(kept_pinned.items())),
        dict(sorted(kept_ignored.items())), job.fail_on, first=dict(sorted(first.items())),
        n_failing=sum(f.fails for f in flagged), n_below=sum(not f.fails for f in flagged))


# -- many -----------------------------------------------------------------------------


def run_checks(units: Sequence[CheckJob | CheckResult], jobs: int = 1
               ) -> Iterator[CheckResult]:
    """Every unit's result in the order given (a `CheckResult` is passed through), on a
    process pool when `jobs > 1` (`workers.in_order`)."""
    return in_order(_result_of, units, jobs)


def _result_of(unit: CheckJob | CheckResult) -> CheckResult:
    return unit if isinstance(unit, CheckResult) else check_one(unit)


@dataclass(frozen=True, slots=True)
class Shown:
    """A finding code on one trace and the versions that show it: per version that
    does, how often and its first op; `not_by`: the versions that ran it whole and
    do not."""

    path: str
    code: str
    by: tuple[tuple[str, int, int], ...]  # (engine, count, first op)
    not_by: tuple[str, ...]


def by_version(results: Sequence[CheckResult]) -> list[Shown]:
    """Which versions show each finding code, per trace checked under more than one
    engine (the results that replayed: an invalid run shows nothing either way). A
    code ignored for the trace is not listed (module doc, "Ignored"): the ignores
    are the trace's, so a code one run counts as ignored is ignored in all."""
    runs: dict[str, list[CheckResult]] = {}
    for r in results:
        if r.engine and r.status != INVALID:
            runs.setdefault(r.path, []).append(r)
    out: list[Shown] = []
    for path, rs in runs.items():
        if len(rs) < 2:
            continue
        ignored = {c for r in rs for c in r.ignored}
        for code in sorted({c for r in rs for c in r.findings} - ignored):
            by = tuple((r.engine, r.findings[code], r.first[code]) for r in rs
                       if r.findings.get(code))
            out.append(Shown(path, code, by, tuple(r.engine for r in rs
                                                   if not r.findings.get(code))))
    return out


def exit_code(results: Iterable[CheckResult]) -> int:
    """The command's exit code: the worst of the results'."""
    return exits.worst(r.exit_code for r in results)


def summary(results: Sequence[CheckResult]) -> dict:
    """The `summary` record of a check (contracts/report_format.py, CHECK_SUMMARY)."""
    from .contracts.report_format import CHECK_SUMMARY

    by = Counter(r.status for r in results)
    return CHECK_SUMMARY.make(traces=len({r.path for r in results}), runs=len(results),
                              passed=by[PASS], failed=by[FAIL], invalid=by[INVALID],
                              exit_code=exit_code(results))
