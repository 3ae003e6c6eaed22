"""Which records a text view shows: `--ubatch`, `--seq`, `--only-findings`. Shared
by the plain and the rich view.

Owns: `Selection` (the navigation options, parsed) and `select`, a pure function
from the replay's records to `(record, shown)` pairs. Every record comes out exactly
once, in order, so a `Tally` fed from the pairs counts the whole run whatever is
shown. How many ubatches a trace plans is the replay's to say
(`replay.planned_ubatches`).

Rules (all the options given must hold):
- a ubatch is shown when its index is in a `--ubatch` range; when it decodes a token
  of a `--seq` sequence, re-pools one of its pools or has a finding naming it; and,
  under `--only-findings`, when it has a finding;
- an event (an edit, a note, a refused decode) is shown under `--only-findings` only
  when it has a finding, under `--seq` only when it edits or stales that sequence,
  and under `--ubatch` only when it lies between two shown ubatches;
- an expectation is shown when the record before it was (a failed one always);
- what no record could match (a range past the last ubatch, a sequence past
  n_seq_max) is said beside the count shown (`unmatched`, `shown_note`, the one
  wording of both views).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from ..contracts.records import ExpectResult, OpEvent, UbatchRecord
from ..replay import planned_ubatches
from ..trace import model as m
from ..wording import count, span
from ..wording import seqs as words_seqs

Record = OpEvent | UbatchRecord | ExpectResult

AUTO_ONLY_FINDINGS = 200  # more planned ubatches than this: --only-findings by default
OPEN_END = 1 << 62  # the end of an open ubatch range `A..`

UBATCH_DIGITS = 15  # a ubatch index: more digits than any trace has ubatches
_RANGE = re.compile(r"^\s*([0-9]+)\s*(?:\.\.\s*([0-9]*)\s*)?$", re.ASCII)


def parse_ubatch_range(text: str) -> tuple[int, int]:
    """`N` or `A..B` (half-open, as positions in a trace; `A..` runs to the end) ->
    (first, end). Raises ValueError with a message for anything else.

    >>> parse_ubatch_range("7"), parse_ubatch_range("3..5"), parse_ubatch_range("2..")[0]
    ((7, 8), (3, 5), 2)
    """
    mt = _RANGE.match(text) if len(text) <= 2 * UBATCH_DIGITS + 2 else None
    if mt is None or any(len(g or "") > UBATCH_DIGITS for g in mt.groups()):
        shown = text if len(text) <= 40 else text[:40] + "..."
        raise ValueError(f"{shown!r} is not a ubatch index N or a range A..B (at most "
                         f"{UBATCH_DIGITS} digits each)")
    a = int(mt.group(1))
    if "." not in text:
        return a, a + 1
    b = int(mt.group(2)) if mt.group(2) else OPEN_END
    if b <= a:
        raise ValueError(f"empty ubatch range {text!r} (A..B is half-open: B > A)")
    return a, b


def _ubatches(ranges: tuple[tuple[int, int], ...]) -> str:
    """`ubatch 4`, `ubatches 2..5, 9..`: ubatch index ranges as the options give them."""
    one = len(ranges) == 1 and ranges[0][1] - ranges[0][0] == 1
    return ("ubatch " if one else "ubatches ") + ", ".join(
        span(a, None if b >= OPEN_END else b) for a, b in ranges)


@dataclass(frozen=True, slots=True)
class Selection:
    ubatches: tuple[tuple[int, int], ...] = ()  # half-open index ranges; () = every ubatch
    seqs: frozenset[int] = frozenset()  # () = every sequence
    only_findings: bool = False
    auto: bool = False  # only_findings was chosen because the trace is long

    @classmethod
    def of(cls, trace: m.Trace, ubatches: tuple[tuple[int, int], ...] = (),
           seqs: Iterable[int] = (), only_findings: bool | None = None) -> Selection:
        """The options as given; `only_findings=None` (not given either way) turns
        --only-findings on for a trace of more than AUTO_ONLY_FINDINGS ubatches when no
        other navigation option is given."""
        seqs = frozenset(seqs)
        auto = (only_findings is None and not ubatches and not seqs
                and planned_ubatches(trace) > AUTO_ONLY_FINDINGS)
        return cls(tuple(ubatches), seqs, bool(only_findings) or auto, auto)

    @property
    def filters(self) -> bool:
        return bool(self.ubatches or self.seqs or self.only_findings)

    def describe(self) -> str:
        """One line saying what is shown ("" when everything is)."""
        parts = []
        if self.ubatches:
            parts.append(_ubatches(self.ubatches))
        if self.seqs:
            parts.append(words_seqs(sorted(self.seqs)))
        if self.only_findings:
            parts.append("only ubatches and ops with findings")
        if not parts:
            return ""
        line = "showing " + "; ".join(parts)
        if self.auto:
            line += (f" (the default past {AUTO_ONLY_FINDINGS} ubatches: --all-ubatches shows "
                     "every one, --ubatch A..B or --seq S picks)")
        return line

    def unmatched(self, n_ubatches: int, n_seq_max: int) -> str:
        """What of the selection no record could match, as the summary says it beside
        the count of ubatches shown: the `--ubatch` ranges that start past the last
        ubatch the replay ran, the `--seq` ids past the last of n_seq_max ("" when
        none).

        >>> Selection(((3, 4), (20, 30)), frozenset({1, 9})).unmatched(15, 2)
        'ubatches 20..30 are past the last, 14; seq 9 is past the last, 1 (n_seq_max 2)'
        """
        parts = []
        past = tuple(sorted({r for r in self.ubatches if r[0] >= n_ubatches}))
        if past:
            last = f"the last, {n_ubatches - 1}" if n_ubatches else "the replay's, which ran none"
            named = _ubatches(past)
            parts.append(f"{named} {'are' if named.startswith('ubatches') else 'is'} past {last}")
        seqs = sorted(s for s in self.seqs if s >= n_seq_max)
        if seqs:
            parts.append(f"{words_seqs(seqs)} {'is' if len(seqs) == 1 else 'are'}")
            parts[-1] += f" past the last, {n_seq_max - 1} (n_seq_max {n_seq_max})"
        return "; ".join(parts)

    def shown_note(self, shown: int, n_ubatches: int, n_seq_max: int, *, counted: bool
                   ) -> str:
        """` (2 shown: ubatch 20 is past the last, 10)`: the ubatches shown, with what
        the selection could not match of the replay's n_ubatches and n_seq_max
        (`unmatched`); given where the view counts what it showed (`counted`, its own
        rule) or something was missed, else ""."""
        missed = self.unmatched(n_ubatches, n_seq_max)
        if not (counted or missed):
            return ""
        return f" ({count(shown)} shown{': ' * bool(missed)}{missed})"

    # -- the rules ------------------------------------------------------------------

    def _ubatch(self, r: UbatchRecord) -> bool:
        if self.ubatches and not any(a <= r.index < b for a, b in self.ubatches):
            return False
        if self.seqs and not (
                any(s in self.seqs for ss in r.token_seqs for s in ss)
                or any(s in self.seqs for s, _ in r.pools.marked())
                or any(s in self.seqs for f in r.findings for s in f.seqs)):
            return False
        return not (self.only_findings and not r.findings)

    def _event(self, e: OpEvent, trace: m.Trace) -> bool:
        if self.only_findings and not e.findings:
            return False
        if self.seqs:
            touched = set(e.stale) | _op_seqs(trace.ops[e.op])
            if e.kind != "note" and not (touched & self.seqs or -1 in touched):
                return False
        return True


def _op_seqs(op) -> set[int]:
    """The sequences an op names (seq, src, dst, a decode's seq ids)."""
    if isinstance(op, m.Decode):
        return set(op.span.seq) if op.span else {s for t in op.tokens for s in t.seq}
    return {getattr(op, a) for a in ("seq", "src", "dst") if hasattr(op, a)}


def select(records: Iterable[Record], sel: Selection, trace: m.Trace
           ) -> Iterator[tuple[Record, bool]]:
    """Every record with whether the view shows it, in order. Under `--ubatch`, events
    wait for the next ubatch to decide (shown only between two shown ubatches)."""
    held: list[tuple[Record, bool, bool]] = []  # (event, shown if kept, always shown)
    seen_shown = False
    last_shown = True
    for rec in records:
        if isinstance(rec, UbatchRecord):
            shown = sel._ubatch(rec)
            keep = shown and seen_shown
            yield from ((r, force or (s and keep)) for r, s, force in held)
            held = []
            seen_shown |= shown
            last_shown = shown
            yield rec, shown
            continue
        force = isinstance(rec, ExpectResult) and not rec.ok
        if isinstance(rec, ExpectResult):
            shown = last_shown or force
        else:
            shown = last_shown = sel._event(rec, trace)
        if sel.ubatches and (held or not isinstance(rec, ExpectResult)):
            held.append((rec, shown, force))  # an expect follows what it checks
        else:
            yield rec, shown
    yield from ((r, force) for r, _, force in held)
