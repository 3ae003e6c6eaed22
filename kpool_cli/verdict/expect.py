"""A trace's `expect` ops, checked against the records of its replay: a consumer of
the record stream (DESIGN.md, "Data flow"), like the views and the writers.

Owns: `load_checked` (a trace loaded with its expectations' codes checked), and
`with_expectations`, which passes the replay's records through and inserts an
`ExpectResult` where each `expect` op of the trace stands, and the rules of what an
expectation compares (docs/FORMATS.md, "expect").

Invariants: an `expect` checks the last op before it that is not a note, once every
record of that op has passed (records come in op order); an `expect` for another
engine yields nothing; an aborted replay still answers every later `expect`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from ..contracts.records import ABORTED, APPLIED, ExpectResult, OpEvent, Pools, Record, UbatchRecord
from ..trace import model as m
from ..trace.load import MAX_TOKENS, Problem, TraceError, load_trace
from ..wording import counted
from .codes import CODES, VALUE_CODES


@dataclass(slots=True)
class _Outcome:
    """What an `expect` checks about one op."""

    op: int
    keep: bool  # a later expect may ask about this op's ubatches
    status: str = APPLIED
    codes: set[str] = field(default_factory=set)
    n_ubatches: int = 0
    ubatches: list[tuple[int, int, Pools]] = field(default_factory=list)

    def add(self, r: OpEvent | UbatchRecord) -> None:
        self.codes.update(f.code for f in r.findings)
        if isinstance(r, OpEvent):
            self.status = r.status
            return
        self.n_ubatches += 1
        if self.keep:
            self.ubatches.append((r.n_new, r.n_new_g, r.pools))
        if r.aborted:
            self.status = ABORTED


def with_expectations(trace: m.Trace, engine: str, has_values: bool,
                      records: Iterable[Record]) -> Iterator[Record]:
    """`records` (a replay of `trace` under `engine`) with an ExpectResult at each
    `expect` op that applies to `engine`. `has_values`: a value backend ran, so the
    value-only codes (KP003) can be expected."""
    expects = [(i, op) for i, op in enumerate(trace.ops) if isinstance(op, m.Expect)]
    notes = {i for i, op in enumerate(trace.ops) if isinstance(op, m.Note)}
    # an op's ubatches are kept (one op at a time) only when some later expect asks
    # about ubatches: it reads the last op that ran before it
    last_asking = max((i for i, op in expects if _asks_ubatches(op)), default=-1)
    last: _Outcome | None = None
    at = 0  # the next expect to answer
    for r in records:
        while at < len(expects) and expects[at][0] < r.op:
            res = _check(*expects[at], last, engine, has_values)
            at += 1
            if res is not None:
                yield res
        if r.op not in notes and isinstance(r, OpEvent | UbatchRecord):
            if last is None or last.op != r.op:
                last = _Outcome(r.op, r.op < last_asking)
            last.add(r)
        yield r
    for i, op in expects[at:]:
        res = _check(i, op, last, engine, has_values)
        if res is not None:
            yield res


def _asks_ubatches(op: m.Expect) -> bool:
    return op.n_new is not None or op.n_new_g is not None or op.pools is not None


def _check(i: int, op: m.Expect, last: _Outcome | None, engine: str, has_values: bool
           ) -> ExpectResult | None:
    if op.engine is not None and op.engine != engine:
        return None
    if last is None:
        return ExpectResult(i, False, "no op ran before this expect",
                            diffs=(("op", "an op before this expect", "none"),))
    problems: list[str] = []
    diffs: list[tuple[str, str, str]] = []

    def differ(what: str, verb: str, actual: str, expected: str) -> None:
        problems.append(f"{what} {verb} {actual}, expected {expected}")
        diffs.append((what, expected, actual))

    if op.status is not None and op.status != last.status:
        differ("status", "is", last.status, op.status)
    if op.findings is not None:
        # a model-only replay cannot see what only values show: expect the rest
        want = set(op.findings) - (set() if has_values else VALUE_CODES)
        if want != last.codes:
            got = ", ".join(sorted(last.codes)) or "none"
            differ("findings", "are", got, ", ".join(sorted(want)) or "none")
    if _asks_ubatches(op):
        if not last.n_ubatches:
            problems.append("the op ran no ubatch")
            diffs.append(("ubatches", "at least one", "none"))
        else:
            try:
                n_new, n_new_g, listed = last.ubatches[op.ubatch]
            except IndexError:
                problems.append(f"the op has no ubatch {op.ubatch}")
                diffs.append(("ubatch", str(op.ubatch),
                              counted(last.n_ubatches, "ubatch", "ubatches", number=str)))
            else:
                pools = listed.marked()
                if op.n_new is not None and op.n_new != n_new:
                    differ("n_new", "is", str(n_new), str(op.n_new))
                if op.n_new_g is not None and op.n_new_g != n_new_g:
                    differ("n_new_g", "is", str(n_new_g), str(op.n_new_g))
                if op.pools is not None and tuple(op.pools) != pools:
                    differ("marked pools", "are", str(list(pools)),
                           str([list(p) for p in op.pools]))
    where = f"op {last.op}"
    if problems:
        return ExpectResult(i, False, f"{where}: " + "; ".join(problems), last.op,
                            tuple(diffs))
    return ExpectResult(i, True, f"{where}: as expected", last.op)


def load_checked(path: str, max_tokens: int = MAX_TOKENS, max_nodes: int | None = None
                 ) -> m.Trace:
    """`load_trace`, then its `expect` ops' codes: a code no rule has (KP999) is a
    problem at the expect's `findings` (a typo would never match, so the expectation
    could never hold). Every command loads its traces through here."""
    trace = load_trace(path, max_tokens=max_tokens, max_nodes=max_nodes)
    problems = [
        Problem(op.loc.file, op.loc.line, op.loc.column, f"ops[{i}].expect.findings",
                f"unknown finding code {code!r}: known codes are {', '.join(CODES)} "
                "(kpool explain --list)")
        for i, op in enumerate(trace.ops) if isinstance(op, m.Expect) and op.findings
        for code in op.findings if code not in CODES
    ]
    if problems:
        raise TraceError(problems)
    return trace
