"""One run of one trace under one engine, as plain data the diff can compare.

Owns: `UbatchSummary`, `EventSummary`, `RunSummary`, `from_records` (a live replay's
`OpEvent`/`UbatchRecord` stream), `ubatch_summaries` (many at once, from columns) and
`without_codes`. The other way to build a `RunSummary`, from a saved JSON report, is
`kpool_cli.diff.reports.from_report`.

Invariants: both constructors give equal summaries for the same run (the report is
written from the same records, and `kpool_version` is the writer's), so a diff of
two saved reports and a diff of the two live replays they came from are the same
diff. Everything is hashable, frozen
tuples of ints and strings: a summary crosses process boundaries (pickle) and
compares with `==`. What is kept is what an engine decides (tokens, marked pools,
the scatter plan, findings, stale positions, statuses) and its cost counters; not
kept: cells of tokens, pool member lists, finding messages, notes, expectations.

Memory: a summary holds every ubatch of its run (scatter rows included), so a diff
holds two runs at once, unlike `kpool replay`, which streams. Fine for traces of
thousands of ubatches; a multi-million-ubatch trace wants a streaming aligner. So
`from_records` counts what it holds (`HELD_TOKEN`, `HELD_ENTRY`, `HELD_CELL`: a
cache-safe ubatch lists every pool, each kpool member rows) and stops at its share
of the memory budget (`SummaryTooLarge`), as the run goes, where a replay is refused
before it starts.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields, replace
from itertools import repeat
from typing import Any

from .. import __version__
from ..contracts.finding import Finding
from ..contracts.records import ABORTED, APPLIED, ExpectResult, OpEvent, UbatchRecord
from ..verdict.rules import kp005_engine_abort

# a finding as the diff sees it: (code, global rows)
FindingKey = tuple[str, tuple[int, ...]]
# a scatter entry: (rep row it writes, member rows it pools, padding?)
ScatterEntry = tuple[int, tuple[int, ...], bool]

ENGINE_ABORT = kp005_engine_abort.CODE.code

# what a diff holds per token, scatter entry and member cell of a ubatch: its summary
# (an entry's tuples, 260 bytes and 40 a member row: tracemalloc of cache-safe
# ubatches of kpool 4, 64 and 1,024), then the comparison and its rendering, which
# took the whole command to about 4x that (`/usr/bin/time -v kpool diff` of such a
# trace; docs/robustness.md, "The fifth round")
HELD_TOKEN, HELD_ENTRY, HELD_CELL = 600, 1040, 160


class SummaryTooLarge(Exception):
    """A run whose summary would hold more than its share of the memory budget
    (exit 2, as a trace whose replay is over it): `str(e)` says so, the trace first."""

    def __str__(self) -> str:
        return str(self.args[0])


@dataclass(frozen=True, slots=True)
class UbatchSummary:
    """What one ubatch did. `tokens` are (pos, seq ids) in ubatch order; `marked` the
    (seq, k) pools marked new, in layout order; `stale_batch` and `cost` are sorted
    (key, value) pairs."""

    index: int  # ubatch number in the whole replay
    op: int  # index of the decode in the trace's ops
    batch_ubatch: int  # position of the ubatch in its batch
    tokens: tuple[tuple[int, tuple[int, ...]], ...]
    stale_batch: tuple[tuple[int, int], ...]
    n_pool_real: int
    n_new: int
    n_new_g: int
    marked: tuple[tuple[int, int], ...]
    scatter: tuple[ScatterEntry, ...]
    findings: tuple[FindingKey, ...]
    cost: tuple[tuple[str, int], ...]

    @property
    def aborted(self) -> bool:
        """The engine aborted in this ubatch (KP005): the replay ends here."""
        return any(code == ENGINE_ABORT for code, _ in self.findings)


@dataclass(frozen=True, slots=True)
class EventSummary:
    """A non-decode op (notes excluded), or a decode refused before any ubatch ran."""

    op: int
    kind: str
    status: str  # applied | rejected | aborted
    stale: tuple[tuple[int, int], ...]  # (seq, stale position) pairs it set, sorted
    findings: tuple[FindingKey, ...]
    message: str = ""  # shown, never compared


@dataclass(frozen=True, slots=True)
class RunSummary:
    """One trace under one engine: its identity and its records in op order."""

    trace_path: str
    trace_name: str
    sha256: str
    engine: str
    backend: str | None  # the value backend, None for the model-only replay
    config: tuple[tuple[str, object], ...]
    ubatches: tuple[UbatchSummary, ...]
    events: tuple[EventSummary, ...]
    kpool_version: str = __version__  # the kpool that replayed it (a report's tool.version)


def _finding_key(f: Finding) -> FindingKey:
    return (f.code, tuple(f.rows))


def ubatch_summary(r: UbatchRecord) -> UbatchSummary:
    return UbatchSummary(
        index=r.index, op=r.op, batch_ubatch=r.batch_ubatch,
        tokens=tuple((p, tuple(ss)) for p, ss in zip(r.token_pos.tolist(), r.token_seqs,
                                                     strict=True)),
        stale_batch=tuple(sorted(r.stale_batch.items())),
        n_pool_real=r.n_pool_real, n_new=r.n_new, n_new_g=r.n_new_g,
        marked=r.pools.marked(),
        scatter=tuple((rep, tuple(cells), bool(pad)) for rep, cells, pad in zip(
            r.scatter_rep.tolist(), r.scatter_rows.tolist(), r.scatter_pad.tolist(),
            strict=True)),
        findings=tuple(_finding_key(f) for f in r.findings),
        cost=tuple(sorted(r.cost.items())),
    )


# each field's slot of a UbatchSummary, set by `ubatch_summaries` (no __post_init__ to run)
_UBATCH_SLOTS = tuple(UbatchSummary.__dict__[f.name].__set__ for f in fields(UbatchSummary))
assert not hasattr(UbatchSummary, "__post_init__"), "teach ubatch_summaries"


def ubatch_summaries(*columns: Sequence[Any]) -> list[UbatchSummary]:
    """The summaries of many ubatches from the columns of their fields (in the order
    UbatchSummary declares them): what `UbatchSummary(*row)` makes of each row, built
    a field at a time over every ubatch, each slot's setter mapped over its column
    (half the time of the frozen dataclass's `__init__` a row: docs/performance.md,
    "the report reader")."""
    out = list(map(object.__new__, repeat(UbatchSummary, len(columns[0]))))
    for put, column in zip(_UBATCH_SLOTS, columns, strict=True):
        deque(map(put, out, column), maxlen=0)
    return out


def event_summary(e: OpEvent) -> EventSummary:
    return EventSummary(e.op, e.kind, e.status, tuple(sorted(e.stale.items())),
                        tuple(_finding_key(f) for f in e.findings), e.message)


def from_records(records: Iterable[OpEvent | UbatchRecord | ExpectResult], *, path: str,
                 name: str, sha256: str, engine: str, backend: str | None,
                 config: dict, max_bytes: int | None = None, budget: int | None = None
                 ) -> RunSummary:
    """Consume a replay's records (notes and expectations are dropped). Raises
    SummaryTooLarge, as soon as it is, when what it holds (`HELD_TOKEN` a token,
    `HELD_ENTRY` a scatter entry, `HELD_CELL` a member row of one) passes `max_bytes`
    (None: no bound), its share of the command's memory `budget`."""
    ubatches: list[UbatchSummary] = []
    events: list[EventSummary] = []
    held = 0
    for rec in records:
        if isinstance(rec, UbatchRecord):
            held += (HELD_TOKEN * rec.token_pos.size + HELD_ENTRY * rec.scatter_rep.size
                     + HELD_CELL * rec.scatter_rows.size)
            if max_bytes is not None and held > max_bytes:
                raise SummaryTooLarge(_too_large(path, engine, len(ubatches) + 1, held,
                                                 max_bytes, budget))
            ubatches.append(ubatch_summary(rec))
        elif isinstance(rec, OpEvent) and rec.kind != "note":
            events.append(event_summary(rec))
    return RunSummary(path, name, sha256, engine, backend, tuple(config.items()),
                      tuple(ubatches), tuple(events))


def _too_large(path: str, engine: str, n_ubatches: int, held: int, max_bytes: int,
               budget: int | None) -> str:
    from ..backend.budget import format_bytes

    of = "" if budget is None else f" of {format_bytes(budget)} (--max-memory)"
    return (f"{path}: comparing its run under {engine} would hold more than the "
            f"{format_bytes(max_bytes)} it may{of}: its first {n_ubatches:,} ubatches "
            f"list tokens and scatter entries for about {format_bytes(held)}. kpool diff "
            "keeps every ubatch of both runs of every trace at once, each run its share "
            "of the budget less what its replay may take, and a cache-safe ubatch lists "
            "every pool: diff a shorter trace, or raise --max-memory.")


def op_status(event: EventSummary | None, ubatches: tuple[UbatchSummary, ...]) -> str:
    """An op's status: its event's, else aborted when a ubatch aborted, else applied."""
    if event is not None:
        return event.status
    return ABORTED if any(u.aborted for u in ubatches) else APPLIED


def without_codes(run: RunSummary, codes: frozenset[str]) -> RunSummary:
    """`run` with the findings of `codes` taken out of every ubatch and event (the
    codes one side of a diff could not have found: see `compare.comparable`)."""
    def keep(fs: tuple[FindingKey, ...]) -> tuple[FindingKey, ...]:
        return tuple(f for f in fs if f[0] not in codes)

    def hit(fs: tuple[FindingKey, ...]) -> bool:
        return any(c in codes for c, _ in fs)

    return replace(
        run,
        ubatches=tuple(replace(u, findings=keep(u.findings)) if hit(u.findings) else u
                       for u in run.ubatches),
        events=tuple(replace(e, findings=keep(e.findings)) if hit(e.findings) else e
                     for e in run.events))
