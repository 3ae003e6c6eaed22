"""The outcome of one replay: counts, status and exit code (as black's `Report`).

Owns: `Tally`, fed every record of a replay; it decides `status` (pass, fail,
aborted, invalid) under a failing severity, and the exit code of TRACE_FORMAT.md
(0 pass, 1 findings at or above `--fail-on`, 2 a trace found invalid mid-replay,
e.g. a recorded cell that is not empty; other bad input is refused by the CLI
before a replay starts). `tallied(records, tally)`, the one place a replay's
records are counted, and `exit_code(tallies)`, the exit code of a command over
several traces.

Invariants: the CLI feeds a replay's stream to one tally through `tallied` and
hands the same stream to whichever renderer; renderers never count, they read
`Tally.summary()` once the stream is consumed. A trace found invalid mid-replay
is recorded in the tally (`problems`, status "invalid", exit 2) before the error
goes on to the renderer, which either closes its document saying why (the JSON
report) or lets it end the command (the text views).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from ..trace.load import TraceError
from . import exits
from .finding import severity_rank
from .records import ABORTED, ExpectResult, OpEvent, UbatchRecord
from .report_format import SUMMARY

FAIL_ON = ("error", "warning", "never")


@dataclass
class Tally:
    fail_on: str = "error"
    check: bool = False  # `--check`: a failed expectation fails the run
    ubatches: int = 0
    pools_marked: int = 0
    tokens: int = 0
    findings: Counter = field(default_factory=Counter)
    failing: int = 0  # findings at or above fail_on
    expect_failed: int = 0
    expect_passed: int = 0
    aborted: bool = False
    cost: Counter = field(default_factory=Counter)
    problems: tuple = ()  # trace.load.Problem: why the trace turned out invalid mid-replay
    interrupted: bool = False  # a signal (Ctrl-C, SIGTERM) ended the replay here

    def add(self, rec: OpEvent | UbatchRecord | ExpectResult) -> None:
        if isinstance(rec, ExpectResult):
            if rec.ok:
                self.expect_passed += 1
            else:
                self.expect_failed += 1
            return
        if isinstance(rec, UbatchRecord):
            self.ubatches += 1
            self.pools_marked += rec.n_new
            self.tokens += rec.n_tokens
            self.cost.update(rec.cost)
            self.aborted |= rec.aborted
        elif rec.status == ABORTED:
            self.aborted = True
        for f in rec.findings:
            self.findings[f.code] += 1
            if self.fail_on != "never" and severity_rank(f.severity) >= severity_rank(self.fail_on):
                self.failing += 1

    def invalidate(self, problems) -> None:
        """The replay stopped: the trace is invalid at this point (exit 2)."""
        self.problems = tuple(problems)

    @property
    def failed(self) -> bool:
        return self.failing > 0 or (self.check and self.expect_failed > 0)

    @property
    def status(self) -> str:
        if self.problems:
            return "invalid"
        if self.interrupted:
            return "interrupted"
        if self.aborted:
            return "aborted"
        return "fail" if self.failed else "pass"

    @property
    def exit_code(self) -> int:
        return exits.BAD_INPUT if self.problems else exits.FINDINGS if self.failed else exits.PASS

    def summary(self) -> dict:
        """The report's `summary` record (contracts/report_format.py, SUMMARY)."""
        return SUMMARY.make(
            ubatches=self.ubatches,
            tokens=self.tokens,
            findings=dict(sorted(self.findings.items())),
            pools_marked=self.pools_marked,
            pools_per_token=round(self.pools_marked / self.tokens, 4) if self.tokens else 0.0,
            expectations={"passed": self.expect_passed, "failed": self.expect_failed},
            cost=dict(sorted(self.cost.items())),
            status=self.status,
        )


Record = OpEvent | UbatchRecord | ExpectResult


def tallied(records: Iterable[Record], tally: Tally) -> Iterator[Record]:
    """`records`, each added to `tally` before it is passed on. A trace found invalid
    mid-replay (TraceError) is recorded in `tally` (`Tally.invalidate`), then raised
    on: the records before it are counted, the renderer decides how its output ends."""
    try:
        for rec in records:
            tally.add(rec)
            yield rec
    except TraceError as e:
        tally.invalidate(e.problems)
        raise


def exit_code(tallies: Iterable[Tally]) -> int:
    """The exit code of a command over several traces: the worst of theirs."""
    return exits.worst(t.exit_code for t in tallies)
