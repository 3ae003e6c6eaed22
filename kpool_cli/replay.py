"""The replay loop: a trace's ops through the cache model, one engine version and
(optionally) a value backend, as a stream of records (DESIGN.md, "Data flow").

Owns: `replay(trace, version, ...)`, a generator that is a pure function of its
inputs (so a process pool, or a cluster, can run one trace under one engine
anywhere), and `Replayer`, which holds the state (the attention cache, the
recurrent child, the staleness, the layout) and only orders the steps: every rule
lives where its section does (cache/, engine/; engine/edits.py for §4 and the
edits' asserts), and `expect` ops are checked by a consumer of the records
(verdict/expect.py).

Per edit: asserts (KP005) -> the recurrent child's refusal (KP008) -> caches ->
staleness. Per decode: validate -> the memory update (pending stream copies and
K-shift; then, when there were any, a layout update) -> split -> find_slot for every
ubatch -> per ubatch: write cells -> layout update (what changed) ->
marking -> scatter plan -> the ubatch's context (engine/context.py: its race
groups computed once) -> the value backend's facts -> the rules' checks -> record.
A refusal yields an event and changes nothing; an engine abort (KP005) yields its
record or event and ends the replay.

The rules are `verdict.rules.RULES`, run through their one protocol
(`verdict.rule.Check`): the replay hands each op's outcome (`OpContext`) and each
ubatch's facts (`UbatchContext`, then the backend's `ValueFacts`) to every rule's
check and names no code. A ubatch's findings come in the order of the engine steps
they are about (`Check.reads`), then of their codes.

`Replayer(..., observer=...)` lets a caller look at every ubatch's record with its
context (the fuzzer checks kpool's own invariants there); `planned_ubatches` counts
a trace's ubatches with the replay's own split, for the views.

Two cores run the per-ubatch steps (`CORES`, `core_of`): `compiled`
(kpool_cli/compiled/, numba kernels) and `reference` (cache/ and engine/ in numpy,
which the compiled core is held to). They share the state's layout and every rule;
a replay's records do not depend on the core. `auto` (the default, `resolve_core`)
runs the compiled core on a trace of `auto_compiled_from` ubatches or more, where its
kernels save more than loading them costs, else the reference core.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Protocol

import numpy as np

from .arrays import SameArrays, unique
from .backend.facts import ValueFacts
from .cache.aborts import EngineAbort
from .cache.batch import (
    SeqSets,
    Ubatch,
    decode_split,
    first_ubatch_len,
    one_seq_each,
    one_set,
    over_the_batch,
    seq_sets,
    split_refusal,
    token_positions,
    validate,
    validate_span,
)
from .cache.kv import KvCache
from .cache.recurrent import EditRefused, HybridPositions, RecurrentChild, n_keep_tail
from .contracts import runs
from .contracts.finding import Finding
from .contracts.records import (
    ABORTED,
    APPLIED,
    REJECTED,
    SEQ_EMPTY,
    SEQ_SHARED,
    CellMap,
    ExpectResult,
    OpEvent,
    Pools,
    UbatchRecord,
)
from .engine.context import (
    Groups,
    OpContext,
    RacedWriters,
    UbatchContext,
    plan_groups,
    raced_writers,
)
from .engine.edits import Staleness, check_edit
from .engine.layout import POS_CLEAN, Layout, LayoutChange, all_clean
from .engine.marking import Marking, gen_zeroed, mark, n_new_graph
from .engine.scatter import ScatterPlan, build_plan, padding_entries
from .trace import model as m
from .trace.load import Problem, TraceError
from .verdict.expect import with_expectations
from .verdict.rule import Check
from .verdict.rules import RULES
from .versions import EngineVersion
from .wording import count

if TYPE_CHECKING:  # the compiled core imports numba: only when it runs
    from .compiled.runs import EverySpans


class Backend(Protocol):
    """What the replay tells a value backend (kpool_cli.backend). Rows are global."""

    def write_rows(self, rows: np.ndarray, key_ids: np.ndarray) -> None: ...
    def zero_rows(self, rows: np.ndarray) -> None: ...
    def copy_stream(self, src: int, dst: int) -> None: ...
    def snapshot(self, slot: str, rows: np.ndarray) -> None: ...
    def restore(self, slot: str, rows: np.ndarray) -> None: ...
    def clear(self) -> None: ...
    def run_ubatch(self, ctx: UbatchContext,
                   written: tuple[np.ndarray, np.ndarray] | None = None) -> ValueFacts:
        """Write `written` (the ubatch's rows and key ids, as `write_rows`), then pool,
        scatter and verify the ubatch of `ctx` (which has a plan); return what the
        rules read of its values."""
        ...


Observer = Callable[[UbatchRecord, UbatchContext], None]

_NO_POOLS = np.empty(0, dtype=np.int64)  # no pool marked, no entry (read-only)
_NO_POOLS.flags.writeable = False

CORES = ("compiled", "reference")
AUTO = "auto"
CORE_CHOICES = (AUTO, *CORES)
DEFAULT_CORE = AUTO
# ubatches from which the compiled core saves more than it costs to start: about
# 0.15 ms a decode ubatch against its kernels' module and loads (about 0.03 s) and,
# when the value backend has not imported numba already, numba itself (0.12-0.15 s);
# on the project's 2-core machine the two cores' whole commands are even at about 200
# ubatches with the numba backend and 1,000 without it (README, "Two replay cores")
AUTO_COMPILED_FROM = {"numba": 300, "other": 1500}


def auto_compiled_from(backend: str | None) -> int:
    """The ubatches from which `auto` runs the compiled core, for a value backend
    named `backend` (None: model only)."""
    return AUTO_COMPILED_FROM["numba" if backend == "numba" else "other"]


@dataclass(frozen=True, slots=True)
class Core:
    """One implementation of a ubatch's steps over the shared state: the cache and
    layout classes (their find_slot, writes and update) and the marking, scatter
    plan, race groups, writers of the raced rows and runs of a listing. Every field
    computes what the reference's does (a core's groups may also say that the raced
    ones are the last ones: `RaceGroups.raced_kept`)."""

    name: str
    cache: Callable[[m.CacheConfig], KvCache]
    layout: Callable[[m.CacheConfig], Layout]
    mark: Callable[..., Marking]
    build_plan: Callable[..., ScatterPlan]
    race_groups: Callable[[m.CacheConfig], Groups]
    raced_writers: RacedWriters
    pool_spans: Callable[[Pools], np.ndarray]  # contracts/runs.py's
    scatter_spans: Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]
    # both of a re-pool-all plan's listings, from the last ones' where the pools grew
    # (compiled/runs.py `EverySpans`); None: found whole
    every_spans: EverySpans | None = None
    # marking and the plan in one step where it can (compiled/marking.py
    # `mark_and_plan`: None, or the marking and maybe its plan); None: apart always
    mark_and_plan: Callable[..., tuple[Marking, ScatterPlan | None] | None] | None = None


def resolve_core(core: str, trace: m.Trace, backend: str | None = None) -> str:
    """The core `core` names for `trace` (one of CORE_CHOICES) replayed with the value
    backend `backend`: auto is compiled when the trace's decodes split into at least
    `auto_compiled_from(backend)` ubatches (counted as split_equal's least: a
    decode's listed tokens over n_ubatch, rounded up)."""
    if core != AUTO:
        return core
    n_ubatch = trace.cache.ctx_n_ubatch
    least = sum(-(-len(op.tokens) // n_ubatch) for op in trace.ops
                if isinstance(op, m.Decode) and op.span is None)
    return "compiled" if least >= auto_compiled_from(backend) else "reference"


def core_of(name: str) -> Core:
    """The core named `name` (one of CORES); the compiled one imports numba."""
    if name == "reference":
        return Core(name, KvCache,
                    lambda c: Layout(c.n_seq_max, c.kpool, c.by_order, c.kv_size),
                    mark, build_plan, lambda c: plan_groups, raced_writers,
                    runs.pool_spans, runs.scatter_spans)
    if name == "compiled":
        from .compiled import marking as cm
        from .compiled import runs as cr
        from .compiled.cache import CompiledKvCache
        from .compiled.layout import CompiledLayout

        # one a replay: both ways of planning keep its rows and its entries
        padding, alone = cm.Padding(), SameArrays(padding_entries)
        return Core(name, CompiledKvCache,
                    lambda c: CompiledLayout(c.n_seq_max, c.kpool, c.by_order, c.kv_size,
                                             c.n_rows),
                    cm.mark, partial(build_plan, padding=padding, visibility=cm.visible,
                                     padding_alone=alone),
                    lambda c: cm.GrowingGroups(c.n_rows), cm.raced_writers, cr.pool_spans,
                    cr.scatter_spans, cr.EverySpans(),
                    partial(cm.mark_and_plan, padding=padding, padding_alone=alone))
    raise ValueError(f"unknown core {name!r} (one of {', '.join(CORES)})")


def replay(trace: m.Trace, version: EngineVersion, backend: Backend | None = None, *,
           pools_all: bool = False, cell_map: bool = False, spans: bool = False,
           core: str = DEFAULT_CORE) -> Iterator[OpEvent | UbatchRecord | ExpectResult]:
    """Replay `trace` under `version` on `core` (CORE_CHOICES). Raises TraceError for a
    trace that turns out invalid only at replay time (a recorded cell that is not
    empty). `cell_map`: every UbatchRecord carries the cache's cells (for the rich
    view; costs a fill of an int16 per row a ubatch, then what the cache holds).
    `spans`: every UbatchRecord carries the run form's spans of its listing
    (contracts/runs.py; for the JSON writer), found by the core."""
    records = Replayer(trace, version, backend, pools_all=pools_all, cell_map=cell_map,
                       spans=spans, core=core).run()
    yield from with_expectations(trace, version.name, backend is not None, records)


def decode_ubatches(cfg: m.CacheConfig, op: m.Decode, sets: SeqSets | None = None
                    ) -> list[Ubatch] | str:
    """A listed decode's ubatches as the replay runs them: its recorded split, or
    llama_memory_hybrid_idx::init_batch's split_equal(n_ubatch, !unified,
    n_keep_tail) with the context's n_ubatch (`CacheConfig.ctx_n_ubatch`;
    cache/batch.py: `decode_split`); a refusal is its message, and
    GGML_ASSERT(n_ubatch > n_keep_tail) raises KeepTailAssert. `sets`: the tokens'
    `seq_sets`, when the caller has them."""
    return decode_split(op.tokens, op.ubatches, cfg.ctx_n_ubatch, not cfg.unified,
                        n_keep_tail(cfg.n_rs_seq), sets)


def planned_ubatches(trace: m.Trace) -> int:
    """The ubatches the trace's decodes split into, with the replay's own split
    (`decode_ubatches`), decodes a later step refuses included: an upper bound of
    what the replay yields, computed before it runs. A span (a decode its stream
    can never hold) and a split refused or asserted on yield none."""
    n = 0
    for op in trace.ops:
        if not isinstance(op, m.Decode) or op.span is not None:
            continue
        try:
            split = decode_ubatches(trace.cache, op)
        except EngineAbort:
            continue
        n += 0 if isinstance(split, str) else len(split)
    return n


def _state_positions(pos: np.ndarray, seqs) -> list[tuple[tuple[int, ...], int]]:
    """Each sequence set of a ubatch (its first token's seq ids, in order) with the pos
    of its last token in ubatch order: what the recurrent child's find_slot records."""
    first = one_set(seqs)
    if first is not None:  # a decode of one sequence
        return [(tuple(first), int(pos[-1]))]
    if one_seq_each(seqs) is not None:  # parallel slots: each token is its own set
        return list(zip(map(tuple, seqs), pos.tolist(), strict=True))
    last: dict[frozenset[int], tuple[tuple[int, ...], int]] = {}
    for p, ss in zip(pos.tolist(), seqs, strict=True):
        key = frozenset(ss)
        last[key] = (last[key][0] if key in last else tuple(ss), p)
    return list(last.values())


class Replayer:
    def __init__(self, trace: m.Trace, version: EngineVersion, backend: Backend | None = None,
                 *, pools_all: bool = False, cell_map: bool = False, spans: bool = False,
                 observer: Observer | None = None, core: str = DEFAULT_CORE) -> None:
        cfg = trace.cache
        self.trace, self.version, self.backend, self.pools_all = trace, version, backend, pools_all
        self.want_cell_map = cell_map
        self.want_spans = spans and not pools_all  # a full listing is written whole
        self.cfg = cfg
        self.core = core_of(resolve_core(core, trace, getattr(backend, "name", None)))
        self.groups = self.core.race_groups(cfg)
        self.cache = self.core.cache(cfg)
        self.recurrent = RecurrentChild(  # ENGINE.md §3
            cfg.n_seq_max, cfg.n_rs_seq,
            negative_seq_rm_matches_any=version.recurrent_seq_rm_matches_any)
        self.positions = HybridPositions(self.cache, self.recurrent)
        self.layout = self.core.layout(cfg)
        self.staleness = Staleness(cfg.n_seq_max, version)  # ENGINE.md §4
        self.n_ubatch_done = 0
        self.aborted = False
        # the layout updates of memory updates since the last ubatch's, as one change
        # (the next ubatch's context reads them with its own: `LayoutChange.then`)
        self._unseen: LayoutChange | None = None
        self.observer = observer
        # every rule's check for this replay, in the order a ubatch's findings come
        self.checks: list[Check] = sorted((r.Check() for r in RULES), key=lambda c: c.reads)
        self._from_plan = SameArrays(self._plan_listed)

    @property
    def layout_shared(self) -> bool:
        """The layout had a shared cell at its last update (cache-safe's sharing)."""
        return not self.layout.cache_safe

    def _at_op(self, op: OpContext) -> tuple[Finding, ...]:
        return tuple(f for chk in self.checks for f in chk.at_op(op))

    # -- the loop ---------------------------------------------------------------------

    def run(self) -> Iterator[OpEvent | UbatchRecord]:
        """Every op's records, in op order; `expect` ops are the consumer's
        (verdict/expect.py). After an abort nothing more runs."""
        for i, op in enumerate(self.trace.ops):
            if isinstance(op, m.Expect) or (self.aborted and isinstance(op, m.Note)):
                continue
            if self.aborted:
                return
            if isinstance(op, m.Note):
                yield OpEvent(i, "note", APPLIED, {}, op.text)
            elif isinstance(op, m.Decode):
                yield from self._decode(i, op)
            else:
                yield self._edit(i, op)

    # -- edits ---------------------------------------------------------------------------

    def _edit(self, i: int, op) -> OpEvent:
        """An edit: its GGML_ASSERTs (KP005), the recurrent child's refusal (KP008),
        then the caches, then the staleness it sets (engine/edits.py)."""
        cache = self.cache
        try:
            check_edit(op, self.version, self.cfg)
            if isinstance(op, m.SeqRm):
                # llama_memory_hybrid_idx::seq_rm asks the recurrent child first: when it
                # refuses, the call returns false before any cache changes
                self.recurrent.seq_rm(op.seq, op.p0, op.p1)
        except EngineAbort as e:
            return self._abort(i, op.kind, str(e))
        except EditRefused as e:
            return OpEvent(i, op.kind, REJECTED, {}, str(e),
                           self._at_op(OpContext(i, op.kind, op.seq, refused=str(e))))
        pos = self.staleness.before(op, cache.seq_pos_min, cache.holds_in)
        try:
            message = self._apply_edit(op)
        except EngineAbort as e:  # state_read's find_slot on a dangling tail
            return self._abort(i, op.kind, str(e))
        self.staleness.after(op, pos, layout_shared=not self.layout.cache_safe)
        return OpEvent(i, op.kind, REJECTED if message else APPLIED,
                       self.staleness.take_changed(), message or "")

    def _apply_edit(self, op) -> str | None:
        """The edit on the attention cache, the recurrent child and the value rows.
        Returns why a state_read failed (the sequence is then dropped), else None."""
        cache, be = self.cache, self.backend
        if isinstance(op, m.SeqRm):
            cache.seq_rm(op.seq, op.p0, op.p1)
        elif isinstance(op, m.SeqCp):
            cache.seq_cp(op.src, op.dst, op.p0, op.p1)
            self.recurrent.seq_cp(op.src, op.dst)
        elif isinstance(op, m.SeqKeep):
            cache.seq_keep(op.seq, every_stream=self.version.seq_keep_every_stream)
            self.recurrent.seq_keep(op.seq)
        elif isinstance(op, m.SeqAdd):
            cache.seq_add(op.seq, op.p0, op.p1, op.shift)
            self.recurrent.seq_add(op.seq, op.p0, op.p1, op.shift)
        elif isinstance(op, m.SeqDiv):
            cache.seq_div(op.seq, op.p0, op.p1, op.d)
            self.recurrent.seq_div(op.seq, op.p0, op.p1, op.d)
        elif isinstance(op, m.Clear) or (isinstance(op, m.StateDrop) and op.seq < 0):
            cache.clear()
            self.recurrent.clear()
            if be:
                be.clear()
        elif isinstance(op, m.StateWrite):
            cache.state_write(op.seq, op.slot)
            self.recurrent.state_write(op.seq, op.slot)
            if be:
                be.snapshot(op.slot, cache.snapshots[op.slot].rows)
        elif isinstance(op, m.StateRead):
            ok, rows = cache.state_read(op.seq, op.slot)
            if not ok:
                # the hybrid memory catches the failed restore and drops the sequence;
                # `rows` are the indexer cache's rows its state_clear zeroes (ENGINE.md §2)
                self._state_drop(op.seq, rows)
                return (f"no room to restore slot {op.slot!r} into seq {op.seq}: "
                        "the sequence was dropped")
            if be and rows.size:
                be.restore(op.slot, rows)
            self.recurrent.state_read(op.seq, op.slot)
        elif isinstance(op, m.StateDrop):
            self._state_drop(op.seq)
        else:  # pragma: no cover - the loader admits no other op
            raise AssertionError(f"unhandled op {op!r}")
        return None

    def _state_drop(self, s: int, zeroed: np.ndarray | None = None) -> None:
        """llama_memory_hybrid_idx::state_drop(s), s >= 0. `zeroed`: rows of cells s
        no longer holds that the indexer cache's state_clear(s) zeroes all the same (a
        failed state_read's, `KvCache.state_read`)."""
        rows = self.cache.state_drop(s)
        if zeroed is not None and zeroed.size:
            rows = np.concatenate((zeroed, rows))
        self.recurrent.state_drop(s)
        if self.backend and rows.size:
            self.backend.zero_rows(rows)

    def _memory_update(self) -> None:
        """llama_context::memory_update, run once a decode's batch is valid, before
        init_batch, so a decode refused later runs it too (ENGINE.md §3, "The memory
        update"): llama_kv_cache::update runs the cross-stream copies queued by seq_cp
        and the pending K-shift; when it ran anything, the hybrid memory's full
        context (init_full, for the graph reserve) updates the layout (§5) with the
        staleness as it stands. That update marks nothing and is no ubatch's (its
        cells are in no ubatch's `cells_scanned`); the next ubatch's context reads
        what it changed with its own update's change."""
        update = self.cache.take_update()
        for src, dst in update.copies:
            if self.backend:
                self.backend.copy_stream(src, dst)
        if update.ran:
            self._unseen = LayoutChange.joined(self._unseen, self._update_layout())

    def _update_layout(self) -> LayoutChange:
        """llama_memory_hybrid_idx::kpool_layout_update under this version (ENGINE.md §5)."""
        v = self.version
        return self.layout.update(self.cache, self.staleness.stale, v.repool_all_when_shared,
                                  truncate=v.truncate_spares if v.truncate_stale_tail else None)

    def _abort(self, i: int, kind: str, message: str) -> OpEvent:
        """An engine assert outside a ubatch's marking: KP005, and the replay ends."""
        self.aborted = True
        return OpEvent(i, kind, ABORTED, {}, message,
                       self._at_op(OpContext(i, kind, aborted=message)))

    # -- decode ----------------------------------------------------------------------------

    def _reject(self, i: int, message: str) -> OpEvent:
        return OpEvent(i, "decode", REJECTED, {}, message,
                       self._at_op(OpContext(i, "decode", refused=message)))

    def _decode_span(self, i: int, span: m.Span) -> OpEvent:
        """A decode of more tokens than its stream has cells (ENGINE.md §3): the steps
        of `_decode`, each decided from the range's ends (no token of it is built):
        past the whole cache, llama_decode's assert on n_batch (KP005); else (a
        non-unified cache, within the context) down to the attention cache's prepare,
        which fails (KP006), leaving only the heads it may move."""
        cfg, cache = self.cfg, self.cache
        msg = validate_span(span, self.positions, mrope=cfg.by_order)
        if msg is not None:
            return self._reject(i, msg)
        msg = over_the_batch(len(span), cfg)
        if msg is not None:
            return self._abort(i, "decode", msg)
        self._memory_update()
        n_keep_tail = self.recurrent.n_keep_tail
        try:
            msg = split_refusal(len(span.seq) > 1, cfg.ctx_n_ubatch, not cfg.unified,
                                n_keep_tail)
            if msg is not None:
                return self._reject(i, msg)
            self.recurrent.prepare([[span.seq]])
        except EngineAbort as e:  # the split's, or the recurrent child's
            return self._abort(i, "decode", str(e))
        k = cache.stream_of(span.seq[0])
        cache.prepare_unplaceable(k, first_ubatch_len(span, cfg.ctx_n_ubatch, n_keep_tail))
        # a unified cache's span is past the context, above: only a stream's is here
        return self._reject(
            i, f"failed to find a memory slot for batch of size {count(len(span))} "
               f"(init_batch: failed to prepare attention ubatches): its tokens need "
               f"{count(len(span))} cells of stream {k} (sequence {k}'s own), which has "
               f"{cfg.kv_size}")

    def _decode(self, i: int, op: m.Decode) -> Iterator[OpEvent | UbatchRecord]:
        if op.span is not None:
            yield self._decode_span(i, op.span)
            return
        cfg, cache = self.cfg, self.cache
        tokens = op.tokens
        # the batch's sets, asked by each step below (what they are is found once)
        sets = seq_sets(tokens)
        msg = validate(tokens, self.positions, cfg.n_seq_max, mrope=cfg.by_order,
                       embd=op.is_embd, sets=sets)
        if msg is not None:
            yield self._reject(i, msg)
            return
        msg = over_the_batch(len(tokens), cfg)
        if msg is not None:
            yield self._abort(i, "decode", msg)
            return
        self._memory_update()
        try:
            split = decode_ubatches(cfg, op, sets)
        except EngineAbort as e:
            yield self._abort(i, "decode", str(e))
            return
        if isinstance(split, str):  # the split is refused: why
            yield self._reject(i, split)
            return
        ubs = []
        every = tuple(range(len(tokens))) if len(split) == 1 else None
        tks: list[Sequence[m.Token]] = [
            tokens if ub.tokens == every else  # the batch, in order
            list(map(tokens.__getitem__, ub.tokens)) for ub in split]
        for tk in tks:
            recorded = (np.array([t.cell for t in tk], dtype=np.int64)
                        if tk[0].cell is not None else None)
            ubs.append((np.array(token_positions(tk), dtype=np.int64),
                        sets if tk is tokens else seq_sets(tk), recorded))
        self._check_recorded_cells(op, ubs)
        try:
            # llama_memory_hybrid_idx::init_batch prepares the recurrent child first
            self.recurrent.prepare(seqs for _pos, seqs, _rec in ubs)
        except EngineAbort as e:
            yield self._abort(i, "decode", str(e))
            return
        placements = cache.plan(ubs)
        if placements is None:
            yield self._reject(i, "find_slot found no free cell for a ubatch: the decode "
                                  "fails and nothing is applied")
            return

        stale_batch = list(self.staleness.stale)
        is_new_size = 0
        for b, (ub, tk, (pos, seqs, _), pl) in enumerate(zip(split, tks, ubs, placements,
                                                              strict=True)):
            ext = (np.array([t.ext or (0, 0) for t in tk], dtype=np.int64)
                   if cfg.by_order else None)
            rec = self._ubatch(i, b, ub, pos, seqs, ext, pl, stale_batch, is_new_size)
            is_new_size = rec.n_pool_real
            yield rec
            if rec.aborted:
                self.aborted = True
                return
            if b == 0:
                # llama_memory_hybrid_idx_context::next: clean after the first ubatch
                self.staleness.clean()

    def _check_recorded_cells(self, op: m.Decode, ubs) -> None:
        """A recorded `cell` must be empty when its ubatch is placed (TRACE_FORMAT.md)."""
        taken: set[tuple[int, int]] = set()
        for _pos, seqs, recorded in ubs:
            if recorded is None:
                continue
            for ss, c in zip(seqs, recorded.tolist(), strict=True):
                k = self.cache.stream_of(ss[0])
                if not self.cache.is_empty(k, c) or (k, c) in taken:
                    raise TraceError([Problem(
                        op.loc.file, op.loc.line, op.loc.column, "decode.cell",
                        f"recorded cell {c} (stream {k}) is not empty when the decode runs")])
                taken.add((k, c))

    def _ubatch(self, i: int, b: int, ub: Ubatch, pos: np.ndarray, seqs, ext, pl,
                stale_batch: list[int], is_new_size: int) -> UbatchRecord:
        cfg, cache, layout, v = self.cfg, self.cache, self.layout, self.version
        rows, key_ids = cache.apply(pl, pos, ext, seqs)
        self.recurrent.apply_ubatch(_state_positions(pos, seqs))
        own = self._update_layout()  # the ubatch's own update (its cost counters')
        change, self._unseen = LayoutChange.joined(self._unseen, own), None
        repool_all = v.repool_all_when_shared and not layout.cache_safe
        first = b == 0
        plan = None
        abort = None
        marked = _NO_POOLS
        n_new = n_new_g = 0
        try:
            graph = (pos.size, ub.n_seqs_unq, layout.n_pool_real, cfg.kv_size, cfg.kpool,
                     cfg.n_seq_max, repool_all)  # n_new_graph's, after n_new
            stale_from = stale_batch if first else None
            both = None if self.core.mark_and_plan is None else self.core.mark_and_plan(
                layout, change, pos, seqs, pl.cells, stale_from, repool_all=repool_all,
                once_per_rep=v.mark_once_per_rep, padding_policy=v.padding,
                g_floor=n_new_graph(0, *graph), n_rows=cfg.n_rows)
            marking, plan = both or (self.core.mark(
                layout, pos, seqs, pl.cells, stale_from, repool_all=repool_all,
                once_per_rep=v.mark_once_per_rep), None)
            marked, n_new = marking.marked, marking.n_new
            n_new_g = n_new_graph(n_new, *graph)
            if plan is None:
                plan = self.core.build_plan(layout, marked, n_new_g, pos, seqs, pl.cells,
                                            cfg.n_rows, v.padding)
            else:  # the one call's graph size is n_new_graph's (its floor, then max)
                assert plan.n_new_g == n_new_g
        except EngineAbort as e:
            abort = str(e)
        ctx = UbatchContext.of(cache, layout, change, plan, abort, pos, tuple(seqs),
                               self.groups, self.core.raced_writers)
        values = None
        if self.backend:
            # the cells' key rows are written first; nothing reads the values before
            # the plan, so the backend takes the write with it (one call: `run_ubatch`)
            if plan is None:
                self.backend.write_rows(rows, key_ids)
            else:
                values = self.backend.run_ubatch(ctx, (rows, key_ids))
        findings: list[Finding] = []
        for chk in self.checks:
            found = chk.at_ubatch(ctx)
            findings += found if values is None else chk.with_values(ctx, values, found)
        index = self.n_ubatch_done
        self.n_ubatch_done += 1
        cost = {
            "cells_scanned": own.cells_scanned,
            "pools_marked": n_new,
            "rows_gathered": layout.n_pool_real,
            "scatter_entries": n_new_g,
            "gen_zeroed": gen_zeroed(is_new_size, layout.n_pool_real, first,
                                     v.mark_once_per_rep, cfg.n_rows),
            "reps_sorted": plan.reps_sorted if plan is not None else 0,
        }
        if plan is not None and not self.pools_all:
            scatter_rows, scatter_rep, scatter_pool = plan.entry_rows, plan.entry_rep, \
                plan.entry_pool
            pools, scatter_pad, pool_spans, scatter_spans = self._from_plan(
                marked, scatter_pool, scatter_rows, scatter_rep)
        else:
            pools = self._listed_from_layout(marked)
            if plan is not None:
                scatter_rows, scatter_rep, scatter_pad, scatter_pool = \
                    plan.entry_rows, plan.entry_rep, plan.pad, plan.entry_pool
            else:
                empty = np.empty(0, dtype=np.int64)
                scatter_rows, scatter_rep, scatter_pad, scatter_pool = \
                    empty.reshape(0, cfg.kpool), empty, empty.astype(bool), empty
            pool_spans, scatter_spans = self._spans(pools, scatter_rows, scatter_rep,
                                                    scatter_pad)
        rec = UbatchRecord(
            index=index, op=i, batch_ubatch=b, token_pos=pos, token_seqs=tuple(seqs),
            token_rows=rows, token_ext=ext,
            token_visible=plan.visible if plan is not None else np.zeros(pos.size, np.int64),
            stale_batch=({s: p for s, p in enumerate(stale_batch) if p != POS_CLEAN}
                         if first and not all_clean(stale_batch)
                         else {}),  # every sequence clean (a step of slots): no pass
            n_pool_real=layout.n_pool_real, n_new=n_new, n_new_g=n_new_g,
            pools=pools, scatter_rep=scatter_rep, scatter_rows=scatter_rows,
            scatter_pad=scatter_pad,
            scatter_pool=scatter_pool,
            cost=cost, findings=tuple(findings), aborted=plan is None,
            cell_map=self._cell_map() if self.want_cell_map else None,
            pool_spans=pool_spans, scatter_spans=scatter_spans,
        )
        if self.observer is not None:
            self.observer(rec, ctx)
        return rec

    def _cell_map(self) -> CellMap:
        """Per global row: SEQ_EMPTY, the cell's one seq id, or SEQ_SHARED; the rep rows.
        Costs a fill of an int16 per row (`KvCache.seq_codes`), then what the cache
        holds: its (seq, cell) pairs and its pools."""
        return CellMap(self.cfg.kv_size, self.cache.seq_codes(SEQ_EMPTY, SEQ_SHARED),
                       unique(self.layout.pool_cells()))

    def _plan_listed(self, marked: np.ndarray, entry_pool: np.ndarray,
                     entry_rows: np.ndarray, entry_rep: np.ndarray
                     ) -> tuple[Pools, np.ndarray, np.ndarray | None, np.ndarray | None]:
        """What a ubatch's record takes from its plan alone (`_from_plan` keeps it while
        the plan stands, engine/scatter.py): the marked pools, whose members and rep
        rows are the plan's first entries (scatter.py's invariant), read there rather
        than looked up again; the padding entries; and the spans of both listings when
        the report asks."""
        pad = entry_pool < 0
        n = marked.size
        pools = (Pools(*self.layout.columns(marked), entry_rows[:n], entry_rep[:n],
                       np.ones(n, dtype=bool)) if n else Pools.none(self.cfg.kpool))
        every = self.core.every_spans
        if (self.want_spans and every is not None and entry_pool is marked
                and self.layout.is_every_pool(marked)):  # re-pool-all, unpadded
            return (pools, pad, *every(pools, entry_rows, pad, self.layout.every_growth()))
        return (pools, pad, *self._spans(pools, entry_rows, entry_rep, pad))

    def _spans(self, pools: Pools, rows: np.ndarray, rep: np.ndarray, pad: np.ndarray
               ) -> tuple[np.ndarray | None, np.ndarray | None]:
        """The run form's spans of the listing and of the scatter entries, when the
        report asks (`want_spans`)."""
        if not self.want_spans:
            return None, None
        return self.core.pool_spans(pools), self.core.scatter_spans(rows, rep, pad)

    def _listed_from_layout(self, marked: np.ndarray) -> Pools:
        """The listing without a plan's entries to read: every pool with pools="all"
        (the marked ones `new`), else the marked pools (a ubatch that aborted before
        its plan)."""
        layout = self.layout
        ips = np.arange(layout.n_pool_real) if self.pools_all else marked
        if ips.size == 0:
            return Pools.none(self.cfg.kpool)
        new = np.zeros(layout.n_pool_real, dtype=bool)
        new[marked] = True
        return Pools(*layout.columns(ips), layout.members_of(ips), layout.pool_cells()[ips],
                     new[ips])
