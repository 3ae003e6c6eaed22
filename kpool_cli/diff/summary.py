"""One run of one trace under one engine, as plain data the diff can compare.

Owns: `UbatchSummary`, `EventSummary`, `RunSummary`, and the two ways to build a
`RunSummary`: `from_records` (a live replay's `OpEvent`/`UbatchRecord` stream) and
`from_report` (a saved JSON report, TRACE_FORMAT.md "Report" field names).

Invariants: both constructors give equal summaries for the same run (the report is
written from the same records), so a diff of two saved reports and a diff of the
two live replays they came from are the same diff. Everything is hashable, frozen
tuples of ints and strings: a summary crosses process boundaries (pickle) and
compares with `==`. What is kept is what an engine decides (tokens, marked pools,
the scatter plan, findings, stale positions, statuses) and its cost counters; not
kept: cells of tokens, pool member lists, finding messages, notes, expectations.

Memory: a summary holds every ubatch of its run (scatter rows included), so a diff
holds two runs at once, unlike `kpool replay`, which streams. Fine for traces of
thousands of ubatches; a multi-million-ubatch trace wants a streaming aligner.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ..records import ABORTED, ExpectResult, OpEvent, UbatchRecord
from ..verdict.codes import Finding

# a finding as the diff sees it: (code, global rows)
FindingKey = tuple[str, tuple[int, ...]]
# a scatter entry: (rep row it writes, member rows it pools, padding?)
ScatterEntry = tuple[int, tuple[int, ...], bool]

ENGINE_ABORT = "KP005"


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

    def behaviour(self) -> tuple:
        """Everything but the cost counters and the replay-wide index: two ubatches
        with equal behaviour are the same engine decision."""
        return (self.tokens, self.stale_batch, self.n_pool_real, self.n_new, self.n_new_g,
                self.marked, self.scatter, self.findings)


@dataclass(frozen=True, slots=True)
class EventSummary:
    """A non-decode op (notes excluded), or a decode refused before any ubatch ran."""

    op: int
    kind: str
    status: str  # applied | rejected | aborted
    stale: tuple[tuple[int, int], ...]  # (seq, stale position) pairs it set, sorted
    findings: tuple[FindingKey, ...]
    message: str = ""  # shown, never compared

    def behaviour(self) -> tuple:
        return (self.kind, self.status, self.stale, self.findings)


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


def _finding_key(f: Finding) -> FindingKey:
    return (f.code, tuple(f.rows))


def ubatch_summary(r: UbatchRecord) -> UbatchSummary:
    return UbatchSummary(
        index=r.index, op=r.op, batch_ubatch=r.batch_ubatch,
        tokens=tuple((p, tuple(ss)) for p, ss in zip(r.token_pos.tolist(), r.token_seqs,
                                                     strict=True)),
        stale_batch=tuple(sorted(r.stale_batch.items())),
        n_pool_real=r.n_pool_real, n_new=r.n_new, n_new_g=r.n_new_g,
        marked=tuple((p.seq, p.k) for p in r.pools if p.new),
        scatter=tuple((rep, tuple(cells), bool(pad)) for rep, cells, pad in zip(
            r.scatter_rep.tolist(), r.scatter_rows.tolist(), r.scatter_pad.tolist(),
            strict=True)),
        findings=tuple(_finding_key(f) for f in r.findings),
        cost=tuple(sorted(r.cost.items())),
    )


def event_summary(e: OpEvent) -> EventSummary:
    return EventSummary(e.op, e.kind, e.status, tuple(sorted(e.stale.items())),
                        tuple(_finding_key(f) for f in e.findings), e.message)


def from_records(records: Iterable[OpEvent | UbatchRecord | ExpectResult], *, path: str,
                 name: str, sha256: str, engine: str, backend: str | None,
                 config: dict) -> RunSummary:
    """Consume a replay's records (notes and expectations are dropped)."""
    ubatches: list[UbatchSummary] = []
    events: list[EventSummary] = []
    for rec in records:
        if isinstance(rec, UbatchRecord):
            ubatches.append(ubatch_summary(rec))
        elif isinstance(rec, OpEvent) and rec.kind != "note":
            events.append(event_summary(rec))
    return RunSummary(path, name, sha256, engine, backend, tuple(config.items()),
                      tuple(ubatches), tuple(events))


class ReportError(Exception):
    """A JSON document that is not a kpool report (TRACE_FORMAT.md "Report")."""


def _findings_json(items: list[dict]) -> tuple[FindingKey, ...]:
    return tuple((str(f["code"]), tuple(int(r) for r in f.get("rows", ()))) for f in items)


def _seq_map(d: dict) -> tuple[tuple[int, int], ...]:
    return tuple(sorted((int(s), int(p)) for s, p in d.items()))


def from_report(doc: object, where: str) -> RunSummary:
    """A summary of one report object (already parsed from JSON). Raises ReportError
    naming `where` and the missing or malformed field."""
    if not isinstance(doc, dict) or doc.get("kpool_report") != 1:
        raise ReportError(f"{where}: not a kpool report (no \"kpool_report\": 1)")
    field = "?"
    try:
        field = "trace"
        trace = doc["trace"]
        field = "ubatches"
        ubatches = tuple(
            UbatchSummary(
                index=int(u["index"]), op=int(u["op"]), batch_ubatch=int(u["batch_ubatch"]),
                tokens=tuple((int(t["pos"]), tuple(int(s) for s in t["seq"]))
                             for t in u["tokens"]),
                stale_batch=_seq_map(u.get("stale_batch", {})),
                n_pool_real=int(u["n_pool_real"]), n_new=int(u["n_new"]),
                n_new_g=int(u["n_new_g"]),
                marked=tuple((int(p["seq"]), int(p["k"])) for p in u["pools"]
                             if p.get("new", True)),
                scatter=tuple((int(e["rep"]), tuple(int(c) for c in e["cells"]), bool(e["pad"]))
                              for e in u["scatter"]),
                findings=_findings_json(u.get("findings", [])),
                cost=tuple(sorted((str(k), int(v)) for k, v in u.get("cost", {}).items())),
            )
            for u in doc["ubatches"])
        field = "events"
        events = tuple(
            EventSummary(int(e["op"]), str(e["kind"]), str(e["status"]),
                         _seq_map(e.get("stale", {})), _findings_json(e.get("findings", [])),
                         str(e.get("message", "")))
            for e in doc["events"] if e.get("kind") != "note")
        field = "engine"
        engine = str(doc["engine"])
        field = "config"
        config = tuple(dict(doc["config"]).items())
        return RunSummary(str(trace.get("path", "")), str(trace.get("name") or ""),
                          str(trace["sha256"]), engine, doc.get("backend"), config,
                          ubatches, events)
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise ReportError(f"{where}: malformed report field {field!r} ({type(e).__name__}: "
                          f"{e})") from None


def op_status(event: EventSummary | None, ubatches: tuple[UbatchSummary, ...]) -> str:
    """An op's status: its event's, else aborted when a ubatch aborted, else applied."""
    if event is not None:
        return event.status
    return ABORTED if any(u.aborted for u in ubatches) else "applied"
