"""The comparison of two runs of one trace: a pure function of two `RunSummary`s.

Owns: `compare(base, head) -> TraceDiff`, the frozen result records (a finding
change's places are `Place`s: an op's ubatch or its event, explicitly), and
`DiffResult`, which gathers the diffs of several traces and owns the exit policy
(as black's `Report`): 1 when head has a finding base does not (a regression, one
of `regressions`), or with `fail_on_change` any behavioural difference; else 0. (2,
bad input, is the CLI's.)

Alignment. Both versions get the same ops of the same trace, and the cache model
(cells, validation, split, find_slot) does not depend on the engine, so both runs
see the same ubatches, op by op, until one side's op ends differently: one side
aborts (KP005) or rejects a decode the other applies, or a decode splits
differently. That op is where the runs *part*: from there on nothing is aligned,
and findings are compared by code counts over the rest of each run.

    >>> from kpool_cli.diff.summary import RunSummary, EventSummary
    >>> ev = EventSummary(1, "seq_cp", "applied", ((1, 0),), ())
    >>> run = RunSummary("t.yaml", "t", "0" * 64, "rep-once", None, (), (), (ev,))
    >>> compare(run, run).changed
    False

Per aligned ubatch (keyed by (op, batch_ubatch)) or event (keyed by op), a finding
code head has more often than base is *introduced* (a regression), one base has
more often than head is *fixed*. Cost counters are compared and summed, never
judged: a version may cost more and still be right.

Differences by design. A version made to change one thing (the no-op seq_rm patch
stales nothing where its base does) is compared on everything else: `compare`'s
`by_design` names those fields (`versions.by_design`), which the views state.

Value backends. Only what both sides could have found is compared. A run with a
value backend (numba, numpy: they agree to the last bit) finds the codes of
`VALUE_CODES` (KP003, stale reads) that a model-only run (`none`) never looks for;
everything else (tokens, marked pools, scatter plan, statuses, stale positions and
every other finding, KP001 included, whose rows do not depend on values) is decided
without values and is the same either way. So when exactly one side has a value
backend, `compare` takes the value codes out of both runs, compares the rest in
full, and records them in `TraceDiff.not_compared`; every view says so. Why not
refuse: the rest is a sound comparison, and a report attached to a bug often
cannot be made again (its trace may not be attached); refusing would throw that
away. Why not compare them: KP003 would be introduced (or fixed) by the backend
alone, a REGRESSION that is only a mismatch of backends. To compare KP003 too,
make both reports with the same `--backend` (numba or numpy).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from .. import wording as words
from ..contracts import exits
from ..contracts.records import ABORTED, APPLIED
from ..contracts.report_format import DIFF_EVENT_FIELDS, DIFF_UBATCH_FIELDS, DIFF_VERDICTS
from ..contracts.shape import Shape
from ..verdict.codes import CODES, VALUE_CODES
from .summary import (
    ENGINE_ABORT,
    EventSummary,
    RunSummary,
    UbatchSummary,
    op_status,
    without_codes,
)

BASE, HEAD = "base", "head"
WHERE_SHOWN = 4  # the most places `FindingChange.where` names


@dataclass(frozen=True, slots=True)
class Place:
    """Where findings sit in one run: one of an op's ubatches, or the op's event
    (`batch_ubatch` None: an edit, a refused decode, an abort before any ubatch), and
    where that is on the run's ubatch axis."""

    op: int
    batch_ubatch: int | None  # the ubatch's position in its batch; None: the event
    at: int  # the ubatch's index; an event's: the ubatches its run ran before it

    @property
    def event(self) -> bool:
        return self.batch_ubatch is None

    @property
    def where(self) -> str:
        """`op 3.0` (op 3, its ubatch 0), `op 1` (an event): `wording.place`."""
        return words.place(self.op, self.batch_ubatch)


@dataclass(frozen=True, slots=True)
class FindingChange:
    """A finding code gained (introduced) or lost (fixed) by head at one place or
    (after the runs part) several."""

    code: str
    count: int  # how many more findings of `code` one side has there
    aligned: bool  # False: after the runs part, compared by counts
    rows: tuple[int, ...]  # the rows of those findings, on the side that has them
    places: tuple[Place, ...]  # every place of them, on the side that has them

    @property
    def where(self) -> str:
        """`op 3.0`, or the places (`op 5.0, op 6` ...: WHERE_SHOWN of them at most)."""
        more = len(self.places) - WHERE_SHOWN
        return (", ".join(p.where for p in self.places[:WHERE_SHOWN])
                + (f" (+{more} more)" if more > 0 else ""))


@dataclass(frozen=True, slots=True)
class UbatchDiff:
    """An aligned pair of ubatches whose behaviour differs."""

    op: int
    batch_ubatch: int
    base: UbatchSummary
    head: UbatchSummary
    fields: tuple[str, ...]  # which behavioural fields differ
    only_base: tuple[tuple[int, int], ...]  # pools (seq, k) marked only in base
    only_head: tuple[tuple[int, int], ...]
    gained: tuple[str, ...]  # finding codes head has more of (with multiplicity)
    lost: tuple[str, ...]

    @property
    def where(self) -> str:
        return words.place(self.op, self.batch_ubatch)


@dataclass(frozen=True, slots=True)
class EventDiff:
    """An aligned pair of events (non-decode op or refused decode) that differ."""

    op: int
    kind: str
    base: EventSummary
    head: EventSummary
    fields: tuple[str, ...]
    gained: tuple[str, ...]
    lost: tuple[str, ...]
    before: int  # the ubatches both runs ran before it (the index of the next one)

    @property
    def where(self) -> str:
        return words.place(self.op)


@dataclass(frozen=True, slots=True)
class OpSide:
    """Everything one run did at one op: its event (if any) and its ubatches."""

    op: int
    event: EventSummary | None
    ubatches: tuple[UbatchSummary, ...]
    before: int  # the ubatches the run ran before the op (its first one's index)

    @property
    def status(self) -> str:
        return op_status(self.event, self.ubatches)

    @property
    def kind(self) -> str:
        return self.event.kind if self.event is not None else "decode"


@dataclass(frozen=True, slots=True)
class Parting:
    """The op where the runs stop being comparable ubatch by ubatch."""

    op: int
    kind: str
    reason: str
    base: OpSide | None  # None: that run has no record of the op (it ended before)
    head: OpSide | None
    base_after: int  # ubatches the run went on to after the parting op
    head_after: int
    before: int  # the ubatches both runs ran before the op (its first one's index)


@dataclass(frozen=True, slots=True)
class Totals:
    """One run as a whole."""

    ubatches: int
    pools_repooled: int  # sum of n_new
    cost: tuple[tuple[str, int], ...]  # summed cost counters, sorted by name
    findings: tuple[tuple[str, int], ...]  # code -> count, sorted
    aborted: bool
    # pools marked and cells scanned per ubatch, folded (empty: totals of several runs)
    shape: Shape = field(default_factory=Shape, compare=False)

    def counter(self, name: str) -> int:
        return dict(self.cost).get(name, 0)


@dataclass(frozen=True, slots=True)
class TraceDiff:
    trace_path: str
    trace_name: str
    sha256: str
    base_engine: str
    head_engine: str
    base_backend: str | None
    head_backend: str | None
    same_trace: bool  # False only when reports of different traces were forced together
    entries: tuple[UbatchDiff | EventDiff, ...]  # differing aligned ubatches/events, op order
    parting: Parting | None
    fixed: tuple[FindingChange, ...]
    introduced: tuple[FindingChange, ...]
    base: Totals
    head: Totals
    aligned_ubatches: int
    cost_only: int  # aligned ubatches that differ in cost counters only
    not_compared: tuple[str, ...] = ()  # codes only one side could find, left out of both
    by_design: tuple[str, ...] = ()  # fields that differ by design (versions.by_design)

    @property
    def changed(self) -> bool:
        """Any behavioural difference (cost counters excluded)."""
        return bool(self.entries) or self.parting is not None


def ratio(base: int, head: int) -> float | None:
    """head / base, None when base is 0 (rounded to 4 places)."""
    return round(head / base, 4) if base else None


# --- the comparison -----------------------------------------------------------------


def _by_op(run: RunSummary) -> dict[int, OpSide]:
    events = {e.op: e for e in run.events}
    ubs: dict[int, list[UbatchSummary]] = {}
    for u in run.ubatches:
        ubs.setdefault(u.op, []).append(u)
    out: dict[int, OpSide] = {}
    before = 0
    for op in sorted(set(events) | set(ubs)):
        side = out[op] = OpSide(op, events.get(op), tuple(ubs.get(op, ())), before)
        before = side.ubatches[-1].index + 1 if side.ubatches else before
    return out


def _totals(run: RunSummary) -> Totals:
    cost: Counter = Counter()
    findings: Counter = Counter()
    shape = Shape()
    # each distinct cost once (many ubatches cost the same: a report's reader shares
    # their tuples), times the ubatches it is
    costs = Counter(u.cost for u in run.ubatches)
    for counters, times in costs.items():
        for name, n in counters:
            cost[name] += n * times
    scanned = {c: dict(c).get("cells_scanned", 0) for c in costs}
    for u in run.ubatches:
        if u.findings:
            findings.update(code for code, _ in u.findings)
        shape.add_counts(u.n_new, scanned[u.cost], u.index)
    for e in run.events:
        findings.update(code for code, _ in e.findings)
    return Totals(len(run.ubatches), sum(u.n_new for u in run.ubatches),
                  tuple(sorted(cost.items())), tuple(sorted(findings.items())),
                  findings[ENGINE_ABORT] > 0, shape)


def _codes(findings) -> Counter:
    return Counter(code for code, _ in findings)


def _rows(findings, code: str) -> tuple[int, ...]:
    return tuple(sorted({r for c, rows in findings if c == code for r in rows}))


def _changes(place: Place, base_f, head_f
             ) -> tuple[list[FindingChange], list[FindingChange]]:
    """(introduced, fixed) between the findings of an aligned place (the same in both
    runs)."""
    b, h = _codes(base_f), _codes(head_f)
    intro = [FindingChange(c, n, True, _rows(head_f, c), (place,))
             for c, n in sorted((h - b).items())]
    fixed = [FindingChange(c, n, True, _rows(base_f, c), (place,))
             for c, n in sorted((b - h).items())]
    return intro, fixed


def _expand(codes: Counter) -> tuple[str, ...]:
    return tuple(c for c, n in sorted(codes.items()) for _ in range(n))


def _ubatch_fields(b: UbatchSummary, h: UbatchSummary, by_design: tuple[str, ...]
                   ) -> tuple[str, ...]:
    def fields(u: UbatchSummary) -> tuple:  # in the order of DIFF_UBATCH_FIELDS
        return (u.tokens, u.stale_batch, u.n_pool_real, u.n_new, u.n_new_g, u.marked,
                u.scatter, u.findings)
    return _differing(DIFF_UBATCH_FIELDS, fields(b), fields(h), by_design)


def _event_fields(b: EventSummary, h: EventSummary, by_design: tuple[str, ...]
                  ) -> tuple[str, ...]:
    # (the kind and the status are the same: where they differ, the runs part there)
    return _differing(DIFF_EVENT_FIELDS, (b.stale, b.findings), (h.stale, h.findings),
                      by_design)


def _differing(names: tuple[str, ...], b: tuple, h: tuple, by_design: tuple[str, ...]
               ) -> tuple[str, ...]:
    """The names of the fields whose values differ, those differing by design aside."""
    return tuple(name for name, x, y in zip(names, b, h, strict=True)
                 if x != y and name not in by_design)


def _part_reason(b: OpSide | None, h: OpSide | None) -> str | None:
    """Why the runs cannot be aligned at this op, or None when they can."""
    if b is None or h is None:
        gone = BASE if b is None else HEAD
        return f"{gone} has no record of this op (its run ended before it)"
    if b.status != h.status:
        def say(side: str, s: OpSide) -> str:
            codes = sorted({c for c, _ in s.event.findings}) if s.event else []
            if s.status == ABORTED:
                codes = [ENGINE_ABORT]
            why = f" ({', '.join(codes)})" if codes and s.status != APPLIED else ""
            return f"{side} {s.status}{why}"
        return f"{say(BASE, b)}, {say(HEAD, h)}"
    if (b.event is None) != (h.event is None) or b.kind != h.kind:
        return "the op ran differently (an event on one side only)"
    if [u.batch_ubatch for u in b.ubatches] != [u.batch_ubatch for u in h.ubatches]:
        split = words.counted(len(b.ubatches), "ubatch", "ubatches", str)
        return f"the decode splits into {split} in base, {len(h.ubatches)} in head"
    return None


def _unaligned(parting_op: int, base_ops: dict[int, OpSide], head_ops: dict[int, OpSide]
               ) -> tuple[list[FindingChange], list[FindingChange]]:
    """(introduced, fixed) over everything from the parting op on, by code counts."""
    def found(ops: dict[int, OpSide]
              ) -> tuple[Counter, dict[str, list[Place]], dict[str, set[int]]]:
        counts: Counter = Counter()
        places: dict[str, list[Place]] = {}
        rows: dict[str, set[int]] = {}
        for op, side in ops.items():
            if op < parting_op:
                continue
            items = [(Place(op, None, side.before), side.event.findings)
                     ] if side.event is not None else []
            items += [(Place(op, u.batch_ubatch, u.index), u.findings) for u in side.ubatches]
            for place, fs in items:
                for code, rs in fs:
                    counts[code] += 1
                    its = places.setdefault(code, [])
                    if not its or its[-1] != place:  # a place's findings come together
                        its.append(place)
                    rows.setdefault(code, set()).update(rs)
        return counts, places, rows

    bc, bp, br = found(base_ops)
    hc, hp, hr = found(head_ops)
    intro = [FindingChange(c, n, False, tuple(sorted(hr[c])), tuple(hp[c]))
             for c, n in sorted((hc - bc).items())]
    fixed = [FindingChange(c, n, False, tuple(sorted(br[c])), tuple(bp[c]))
             for c, n in sorted((bc - hc).items())]
    return intro, fixed


def _either(a: str, b: str) -> str:
    """One name for both sides: the common one, else `a vs b` (forced reports)."""
    return a if a == b or not b else b if not a else f"{a} vs {b}"


def left_out(base_backend: str | None, head_backend: str | None) -> tuple[str, ...]:
    """The codes a comparison of runs with these value backends leaves out: the value
    codes when exactly one side ran with a value backend (module doc), else none."""
    if (base_backend is None) == (head_backend is None):
        return ()
    return tuple(sorted(VALUE_CODES))


def comparable(base: RunSummary, head: RunSummary
               ) -> tuple[RunSummary, RunSummary, tuple[str, ...]]:
    """The two runs as far as both could find the same codes, and the codes left out
    (`left_out`)."""
    codes = left_out(base.backend, head.backend)
    if not codes:
        return base, head, ()
    drop = frozenset(codes)
    return without_codes(base, drop), without_codes(head, drop), codes


def compare(base: RunSummary, head: RunSummary, by_design: tuple[str, ...] = ()
            ) -> TraceDiff:
    """How `head` differs from `base` on the same trace. Pure; see the module doc.
    `by_design`: fields the two versions differ in on purpose (`versions.by_design`,
    e.g. the stale positions of the no-op seq_rm patch), left out of the judgement
    and named in the result."""
    base, head, codes_left_out = comparable(base, head)
    base_ops, head_ops = _by_op(base), _by_op(head)
    entries: list[UbatchDiff | EventDiff] = []
    introduced: list[FindingChange] = []
    fixed: list[FindingChange] = []
    parting: Parting | None = None
    aligned = cost_only = 0
    for op in sorted(set(base_ops) | set(head_ops)):
        b, h = base_ops.get(op), head_ops.get(op)
        reason = _part_reason(b, h)
        if reason is not None:
            side = b or h  # (aligned until here: both ran as many ubatches before it)
            assert side is not None
            parting = Parting(
                op, side.kind, reason, b, h,
                sum(len(s.ubatches) for o, s in base_ops.items() if o > op),
                sum(len(s.ubatches) for o, s in head_ops.items() if o > op), side.before)
            i, f = _unaligned(op, base_ops, head_ops)
            introduced += i
            fixed += f
            break
        assert b is not None and h is not None
        if b.event is not None and h.event is not None:
            fields = _event_fields(b.event, h.event, by_design)
            i, f = _changes(Place(op, None, b.before), b.event.findings, h.event.findings)
            introduced += i
            fixed += f
            if fields:
                entries.append(EventDiff(op, b.event.kind, b.event, h.event, fields,
                                         _expand(_codes(h.event.findings)
                                                 - _codes(b.event.findings)),
                                         _expand(_codes(b.event.findings)
                                                 - _codes(h.event.findings)), b.before))
        for ub, uh in zip(b.ubatches, h.ubatches, strict=True):
            aligned += 1
            fields = _ubatch_fields(ub, uh, by_design)
            if ub.findings != uh.findings:  # (else neither introduces nor fixes any)
                i, f = _changes(Place(op, ub.batch_ubatch, ub.index), ub.findings,
                                uh.findings)
                introduced += i
                fixed += f
            if not fields:
                cost_only += ub.cost != uh.cost
                continue
            hb, hh = set(ub.marked), set(uh.marked)
            entries.append(UbatchDiff(
                op, ub.batch_ubatch, ub, uh, fields,
                tuple(p for p in ub.marked if p not in hh),
                tuple(p for p in uh.marked if p not in hb),
                _expand(_codes(uh.findings) - _codes(ub.findings)),
                _expand(_codes(ub.findings) - _codes(uh.findings))))
    return TraceDiff(
        trace_path=_either(base.trace_path, head.trace_path),
        trace_name=_either(base.trace_name, head.trace_name),
        sha256=base.sha256, base_engine=base.engine, head_engine=head.engine,
        base_backend=base.backend, head_backend=head.backend,
        same_trace=base.sha256 == head.sha256,
        entries=tuple(entries), parting=parting, fixed=tuple(fixed),
        introduced=tuple(introduced), base=_totals(base), head=_totals(head),
        aligned_ubatches=aligned, cost_only=cost_only, not_compared=codes_left_out,
        by_design=by_design)


# --- several traces and the exit policy ------------------------------------------------


def code_matches(code: str, selectors: tuple[str, ...]) -> bool:
    """A code matches a selector that is the code itself or a prefix (`KP`, `KP00`)."""
    return any(code.startswith(s) for s in selectors)


def regressions(t: TraceDiff, ignore: tuple[str, ...] = ()) -> tuple[FindingChange, ...]:
    """The findings head introduces in `t`, but those of codes `ignore` matches: the
    regressions, which fail the diff (`DiffResult.exit_code`)."""
    return tuple(c for c in t.introduced if not code_matches(c.code, ignore))


def ignore_selectors(items: Iterable[str]) -> tuple[str, ...]:
    """`--ignore`'s items (cli/io.py `code_items`: split, in upper case, none empty) as
    the selectors of `code_matches`. Raises ValueError for a selector that matches no
    finding code."""
    selectors = tuple(items)
    for s in selectors:
        if not any(code_matches(c, (s,)) for c in CODES):
            raise ValueError(f"--ignore {s}: no finding code starts with it "
                             f"(codes: {', '.join(CODES)})")
    return selectors


@dataclass(frozen=True, slots=True)
class DiffResult:
    """The diffs of every trace, and what they mean for CI."""

    traces: tuple[TraceDiff, ...]
    fail_on_change: bool = False
    ignore: tuple[str, ...] = ()  # codes (or prefixes) whose gain is not a regression

    @property
    def regressions(self) -> tuple[tuple[TraceDiff, FindingChange], ...]:
        return tuple((t, c) for t in self.traces for c in regressions(t, self.ignore))

    @property
    def changed(self) -> bool:
        return any(t.changed for t in self.traces)

    @property
    def exit_code(self) -> int:
        failed = bool(self.regressions) or (self.fail_on_change and self.changed)
        return exits.FINDINGS if failed else exits.PASS

    @property
    def verdict(self) -> str:
        """regression | changed | no differences (cost counters aside): one of
        `DIFF_VERDICTS`, worst first."""
        regression, changed, same = DIFF_VERDICTS
        if self.regressions:
            return regression
        return changed if self.changed else same

    def totals(self, side: str) -> Totals:
        ts = [t.base if side == BASE else t.head for t in self.traces]
        cost: Counter = Counter()
        findings: Counter = Counter()
        for t in ts:
            cost.update(dict(t.cost))
            findings.update(dict(t.findings))
        return Totals(sum(t.ubatches for t in ts), sum(t.pools_repooled for t in ts),
                      tuple(sorted(cost.items())), tuple(sorted(findings.items())),
                      any(t.aborted for t in ts))

    @property
    def not_compared(self) -> tuple[str, ...]:
        """Codes left out of the comparison of at least one trace (value backends)."""
        return tuple(sorted({c for t in self.traces for c in t.not_compared}))

    def changes(self, which: str) -> dict[str, int]:
        """code -> count over every trace, of `introduced` or `fixed` findings."""
        out: Counter = Counter()
        for t in self.traces:
            for c in (t.introduced if which == "introduced" else t.fixed):
                out[c.code] += c.count
        return dict(sorted(out.items()))
