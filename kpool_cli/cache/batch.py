"""A decode's batch as llama_batch_allocr sees it: validation and the ubatch split
(ENGINE.md §3).

Owns: `validate` (llama_batch_allocr::init's checks against the cache; of a
`Span`, from its ends: `validate_span`), `over_the_batch` (llama_decode's assert on
a batch past the context) and `split_equal`
(llama_batch_allocr::split_equal; of a span, `first_ubatch_len`). All are pure
functions of the batch and the memory's pos_min/pos_max; a refusal is a returned
message, never an exception, because llama_decode reports it with a return code.
Also the batch's shape, which the steps after ask too: its tokens' sequence sets
(`seq_sets`, a `SeqSets`), whether they are one set (`one_set`), one seq id a token
(`one_id_each`: a server's step of prompt chunks and decodes) or one sequence a
token (`one_seq_each`: a step of parallel slots); a `SeqSets` holds each answer
once found, so a decode's steps that share it find each once. A batch of
`COLUMNS_FROM` tokens or more, one seq id each, is validated and split from its
seq id and pos columns (numpy sorts), the others token by token: the same answers.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import chain
from operator import attrgetter, itemgetter
from typing import Protocol, TypeVar

import numpy as np

from ..trace.model import CacheConfig, Span, Token
from ..wording import count, counted
from .aborts import KeepTailAssert

Ends = dict[int, tuple[int, int, int]]  # seq id: (first pos, last pos, distinct positions)


@dataclass(frozen=True, slots=True)
class Ubatch:
    """Indices into the batch's tokens, in ubatch order, and the number of distinct
    seq ids among them (`n_seqs_unq`)."""

    tokens: tuple[int, ...]
    n_seqs_unq: int


class SeqPositions(Protocol):
    """What batch validation reads of the memory: the hybrid memory's positions
    (cache.recurrent.HybridPositions)."""

    def seq_pos_min(self, s: int) -> int: ...
    def seq_pos_max(self, s: int) -> int: ...
    def seq_pos_maxes(self, seqs: Sequence[int]) -> list[int]: ...  # seq_pos_max of each


def validate(tokens: tuple[Token, ...], cache: SeqPositions, n_seq_max: int, *, mrope: bool,
             embd: bool, sets: SeqSets | None = None) -> str | None:
    """llama_batch_allocr::init, the checks that can refuse a batch. None = accepted.
    `sets`: the tokens' `seq_sets`, when the caller has them.

    The "no partial sequence sub-sets" and "no decreasing positions" checks of the
    real code never fire as written (ENGINE.md §3), so they are not modelled: a
    batch with positions [9, 8] is accepted, as llama.cpp accepts it."""
    sets = seq_sets(tokens) if sets is None else sets
    first = one_set(sets) if len(sets) > 1 else None
    if first is not None and len(first) == 1:
        # one sequence's tokens (a decode of a slot, a draft): no set of its own each
        s = first[0]
        if not 0 <= s < n_seq_max:
            return _invalid_seq(0, s, n_seq_max)
        ps = set(map(_POS, tokens))
        return _validate_ends({s: (min(ps), max(ps), len(ps))}, set(), cache, mrope=mrope,
                              embd=embd)
    singles = one_seq_each(sets)
    if singles:  # parallel slots: each token's set is its own sequence (none: no token)
        if min(singles) < 0 or max(singles) >= n_seq_max:
            return _invalid_seq(*_first_invalid(singles, n_seq_max), n_seq_max)
        if not mrope:
            for x, t in zip(cache.seq_pos_maxes(singles), tokens, strict=True):
                if x >= 0 and t.pos != x + 1:
                    break
            else:
                return None  # `_validate_ends`' checks of one token a sequence, all passed
        ends = {s: (t.pos, t.pos, 1) for s, t in zip(singles, tokens, strict=True)}
        return _validate_ends(ends, set(), cache, mrope=mrope, embd=embd)
    ids = _by_columns(sets)
    found = (_token_ends(tokens, n_seq_max) if ids is None
             else _id_ends(ids, tokens, n_seq_max))
    if isinstance(found, str):
        return found
    return _validate_ends(*found, cache, mrope=mrope, embd=embd)


def _token_ends(tokens: Sequence[Token], n_seq_max: int
                ) -> tuple[Ends, set[tuple[int, int]]] | str:
    """The batch's ends per sequence and its coupled pairs of seq ids, token by token;
    or the refusal of the first seq id outside [0, n_seq_max)."""
    positions: dict[int, set[int]] = {}
    for i, t in enumerate(tokens):
        for s in t.seq:
            if not 0 <= s < n_seq_max:
                return _invalid_seq(i, s, n_seq_max)
            positions.setdefault(s, set()).add(t.pos)
    ends = {s: (min(ps), max(ps), len(ps)) for s, ps in positions.items()}
    coupled = {(a, b) for t in tokens for a in t.seq for b in t.seq if a < b}
    return ends, coupled


def _id_ends(ids: np.ndarray, tokens: Sequence[Token], n_seq_max: int
             ) -> tuple[Ends, set[tuple[int, int]]] | str:
    """`_token_ends` of tokens of one seq id each (`ids`), none coupled, from their
    columns: sorted by (seq id, pos), each sequence's first and last pos are its
    run's ends, and its distinct positions the pos changes within it."""
    outside = (ids < 0) | (ids >= n_seq_max)
    if outside.any():
        i = int(outside.argmax())
        return _invalid_seq(i, int(ids[i]), n_seq_max)
    n, seq = ids.size, ids
    pos = np.fromiter(map(_POS, tokens), dtype=np.int64, count=n)  # < POS_LIMIT
    order = np.lexsort((pos, seq))
    seq, pos = seq[order], pos[order]
    other_seq = seq[1:] != seq[:-1]
    head = np.flatnonzero(np.concatenate(([True], other_seq)))
    last = np.append(head[1:], n) - 1
    # a sorted token whose (seq id, pos) is not the one before it: a distinct pos
    fresh = np.cumsum(np.concatenate(([True], other_seq | (pos[1:] != pos[:-1]))))
    ends = dict(zip(seq[head].tolist(), zip(pos[head].tolist(), pos[last].tolist(),
                                            (fresh[last] - fresh[head] + 1).tolist(),
                                            strict=True), strict=True))
    return ends, set()


def _first_invalid(ids: tuple[int, ...], n_seq_max: int) -> tuple[int, int]:
    """(index, seq id) of the first of `ids` outside [0, n_seq_max) (there is one)."""
    return next((i, s) for i, s in enumerate(ids) if not 0 <= s < n_seq_max)


def _invalid_seq(i: int, s: int, n_seq_max: int) -> str:
    """The refusal of token i's seq id s, outside [0, n_seq_max)."""
    return f"token {i}: invalid seq_id {s} (n_seq_max = {n_seq_max})"


def over_the_batch(n_tokens: int, cfg: CacheConfig) -> str | None:
    """llama_context::decode asserts `n_tokens_all <= cparams.n_batch` once the batch
    is valid, before the memory update (ENGINE.md §3). `cparams.n_batch` is the
    trace's `n_batch` capped at `n_ctx` with causal attention (`CacheConfig.
    ctx_n_batch`), `n_ctx` the cache's cells over all its streams (`n_ctx_seq` =
    kv_size a stream); a trace that records no n_batch is bound by `n_ctx` alone.
    The assert's message for a batch past it, or None."""
    bound = cfg.ctx_n_batch
    if n_tokens <= bound:
        return None
    n_ctx, n_stream = cfg.n_rows, cfg.n_stream
    # the batch's tokens are a count (`wording.count`); n_batch, n_ctx and kv_size are
    # the trace's settings, written as the trace and the views' cache line write them
    if bound < n_ctx:
        return (f"GGML_ASSERT(n_tokens_all <= cparams.n_batch): a batch of {count(n_tokens)} "
                f"tokens, more than n_batch ({bound}, cache.n_batch): llama_decode aborts")
    capped = "" if cfg.n_batch is None else f" (cache.n_batch {cfg.n_batch} is capped at them)"
    return (f"GGML_ASSERT(n_tokens_all <= cparams.n_batch): a batch of {count(n_tokens)} "
            f"tokens, more than the context's {n_ctx} cells (kv_size {cfg.kv_size} x "
            f"{counted(n_stream, 'stream', number=str)}), which bound n_batch{capped}: "
            "llama_decode aborts")


def validate_span(span: Span, cache: SeqPositions, *, mrope: bool) -> str | None:
    """`validate` of a span's tokens from its ends alone: every sequence of its set
    holds the positions start..stop, all distinct, and each pair of them is coupled."""
    ends = dict.fromkeys(span.seq, (span.start, span.stop - 1, len(span)))
    coupled = {(a, b) for a in span.seq for b in span.seq if a < b}
    return _validate_ends(ends, coupled, cache, mrope=mrope, embd=span.ext is not None)


def _validate_ends(ends: Ends, coupled: set[tuple[int, int]],
                   cache: SeqPositions, *, mrope: bool, embd: bool) -> str | None:
    """The checks per sequence, from its first and last position and its count of
    distinct positions, then those of the coupled pairs."""
    seqs = sorted(ends)
    for s, x in zip(seqs, cache.seq_pos_maxes(seqs), strict=True):
        y, y_max, n_distinct = ends[s]
        if mrope:
            # M-RoPE: text needs X < Y, image embeddings X <= Y; no continuity check
            if x >= 0 and (x > y if embd else x >= y):
                rel = "<=" if embd else "<"
                return (f"seq {s}: the cache's last position X = {x} and the batch's first "
                        f"Y = {y} break X {rel} Y")
            continue
        if x >= 0 and y != x + 1:
            return (f"seq {s}: the cache's last position is X = {x} but the batch starts at "
                    f"Y = {y}; it is required that Y = X + 1")
        if y_max - y + 1 > n_distinct:
            return f"seq {s}: positions {y}..{y_max} are not continuous"

    for a, b in sorted(coupled):
        if (cache.seq_pos_min(a) != cache.seq_pos_min(b)
                or cache.seq_pos_max(a) != cache.seq_pos_max(b)):
            return (f"seq {a} is coupled to seq {b} in the batch, but they have diverged "
                    f"(pos {cache.seq_pos_min(a)}..{cache.seq_pos_max(a)} vs "
                    f"{cache.seq_pos_min(b)}..{cache.seq_pos_max(b)})")
    return None




def split_equal(tokens: tuple[Token, ...], n_ubatch: int, sequential: bool,
                n_keep_tail: int = 0, sets: SeqSets | None = None) -> list[Ubatch] | str:
    """llama_batch_allocr::split_equal until the batch is used up (ENGINE.md §3).

    Each ubatch: collect the sequence sets of unused tokens (batch order) that overlap
    none already collected (sequential: every unused token is tried in turn, and one
    whose seq id is the last collected one's + 1 is taken, even when its sequence was
    passed over earlier in the walk), stopping once more than n_ubatch are collected;
    then take one more token of every set per round while each still has one,
    stopping when another round would pass n_ubatch tokens; then, with `n_keep_tail`
    (the hybrid memory passes n_rs_seq + 1 when n_rs_seq > 0), keep the trailing
    tokens of each sequence together (`_keep_tails`). Returns a message when the
    split is refused; raises KeepTailAssert where llama.cpp asserts n_ubatch >
    n_keep_tail (after the refusal of coupled sequences in a sequential split).
    `sets`: the tokens' `seq_sets`, when the caller has them."""
    n = len(tokens)
    if sets is None:
        sets = seq_sets(tokens)
    first = one_set(sets) if sets and n <= max(n_ubatch, 1) else None
    if first is not None:
        # a decode step of one sequence set (one token, or a draft's few): the walk
        # below collects the set, takes its every token in one ubatch, and leaves no
        # tail to keep
        n_unq = len(set(first))
        refused = split_refusal(n_unq > 1, n_ubatch, sequential, n_keep_tail)
        return refused if refused is not None else [Ubatch(tuple(range(n)), n_unq)]
    if not sequential and 1 < n <= n_ubatch and sets and one_seq_each(sets):
        # parallel slots: every set is collected (at most n_ubatch of them), the first
        # round takes each set's one token in batch order and leaves none to keep
        refused = split_refusal(False, n_ubatch, sequential, n_keep_tail)
        return refused if refused is not None else [Ubatch(tuple(range(n)), n)]
    return _split_walk(tokens, n_ubatch, sequential, n_keep_tail, sets)


def _split_walk(tokens: tuple[Token, ...], n_ubatch: int, sequential: bool,
                n_keep_tail: int, sets: SeqSets) -> list[Ubatch] | str:
    """`split_equal` the general way: the walk its docstring describes."""
    by_set = _token_sets(sets)
    refused = split_refusal(any(len(s) > 1 for s in by_set), n_ubatch, sequential, n_keep_tail)
    if refused is not None:
        return refused
    cursor = {ss: 0 for ss in by_set}
    out: list[Ubatch] = []
    n_used = 0
    while n_used < len(tokens):
        # the unused tokens in batch order start with each set's first unused token
        pending = sorted((by_set[ss][cursor[ss]], ss) for ss in by_set
                         if cursor[ss] < len(by_set[ss]))
        cur = (_sequential_sets(pending, by_set, cursor, tokens, n_ubatch) if sequential
               else _disjoint_sets(pending, n_ubatch))
        if not cur:
            return "the batch could not be split"
        per_set: list[list[int]] = [[] for _ in cur]
        if len(cur) == 1:
            # one set: the rounds below take its next min(n_ubatch, remaining) tokens
            ss = cur[0]
            take = by_set[ss][cursor[ss]:cursor[ss] + max(n_ubatch, 1)]
            cursor[ss] += len(take)
            per_set[0].extend(take)
            n_used += len(take)
        while len(cur) > 1 and all(cursor[ss] < len(by_set[ss]) for ss in cur):
            for k, ss in enumerate(cur):
                idx = by_set[ss][cursor[ss]]
                cursor[ss] += 1
                per_set[k].append(idx)
                n_used += 1
            if (len(per_set[0]) + 1) * len(cur) > n_ubatch:
                break
        if n_keep_tail > 0:
            n_used += _keep_tails(cur, per_set, by_set, cursor, n_ubatch, n_keep_tail)
        order = tuple(chain.from_iterable(per_set))
        # every token of per_set[k] has the seq ids cur[k]
        n_unq = len(frozenset().union(*(ss for ss, lst in zip(cur, per_set, strict=True)
                                         if lst)))
        out.append(Ubatch(order, n_unq))
    return out


_POS, _SEQ = attrgetter("pos"), attrgetter("seq")

# A batch of this many tokens or more, one seq id each, is validated and split from
# its columns (`_id_ends`, `_id_sets`): token by token, 512 tokens of a server's step
# cost 0.35 ms of sets and dicts, from columns 0.22 ms; below some 100 tokens the
# numpy calls' own cost is more (docs/performance.md, the thirty-seventh session).
COLUMNS_FROM = 128


class SeqSets(tuple[tuple[int, ...], ...]):
    """Each token's sequence set, in batch order (`seq_sets`), holding what `one_set`,
    `one_id_each` and `one_seq_each` say of them from the first time each is asked (in
    its `__dict__`, by those functions): a step of parallel slots asks them in its
    validation, its split, and its ubatch's writes and find_slot (a tuple of tuples:
    the sets never change, nor do the answers)."""


_UNSET = object()
_T = TypeVar("_T")


def _kept(sets: SeqSets, name: str, find: Callable[[SeqSets], _T]) -> _T:
    """`find(sets)`, found once and kept in the sets (a dict look-up, not a
    `cached_property`, whose lock costs a decode of one token more than it saves)."""
    known = sets.__dict__
    got = known.get(name, _UNSET)
    if got is _UNSET:
        got = known[name] = find(sets)
    return got


def seq_sets(tokens: Sequence[Token]) -> SeqSets:
    """Each token's sequence set, in batch order (one pass in C: a prefill's 65,536
    tokens are asked several times)."""
    return SeqSets(map(_SEQ, tokens))


def token_positions(tokens: Sequence[Token]) -> list[int]:
    """Each token's pos, in batch order (one pass in C)."""
    return list(map(_POS, tokens))


def one_set(seq_sets: Sequence[tuple[int, ...]]) -> tuple[int, ...] | None:
    """The seq ids of every set, when all the sets are the same (a decode of one
    sequence, a prefill: one set for every token); else None (no set, or several).
    Of a `SeqSets`, found once."""
    if type(seq_sets) is SeqSets:
        return _kept(seq_sets, "one_set", _one_set)
    return _one_set(seq_sets)


def _one_set(seq_sets: Sequence[tuple[int, ...]]) -> tuple[int, ...] | None:
    if not seq_sets:
        return None
    first = seq_sets[0]
    if seq_sets[-1] != first:  # several sets (a step of parallel slots): no pass
        return None
    return first if seq_sets.count(first) == len(seq_sets) else None


def one_seq_each(seq_sets: Sequence[tuple[int, ...]]) -> tuple[int, ...] | None:
    """Each set's one seq id, when every set has exactly one and no two share it (the
    tokens of a step of parallel slots); else None. Of a `SeqSets`, found once."""
    if type(seq_sets) is SeqSets:
        return _kept(seq_sets, "one_seq_each", _one_seq_each)
    return _one_seq_each(seq_sets)


def _one_seq_each(seq_sets: Sequence[tuple[int, ...]]) -> tuple[int, ...] | None:
    ids = one_id_each(seq_sets)
    return ids if ids is not None and len(set(ids)) == len(ids) else None


def one_id_each(seq_sets: Sequence[tuple[int, ...]]) -> tuple[int, ...] | None:
    """Each set's one seq id, when every set has exactly one, two maybe the same (the
    tokens of a server's step: prompt chunks and decodes of its slots); else None.
    Of a `SeqSets`, found once."""
    if type(seq_sets) is SeqSets:
        return _kept(seq_sets, "one_id_each", _one_id_each)
    return _one_id_each(seq_sets)


_FIRST = itemgetter(0)


def first_seq_ids(seq_sets: Sequence[tuple[int, ...]]) -> np.ndarray:
    """Each token's first seq id (the one it reads through, ENGINE.md §7), read in C."""
    return np.fromiter(map(_FIRST, seq_sets), dtype=np.int64, count=len(seq_sets))


def _by_columns(sets: SeqSets) -> np.ndarray | None:
    """The seq id column of a batch validated and split from its columns: one of
    `COLUMNS_FROM` tokens or more (one at least), one seq id each; else None. Made
    once for the validation and the split (kept in the sets, read-only). The columns
    are int64: a loaded trace's seq ids and positions are (trace/load), and a batch
    made otherwise past int64 raises OverflowError here."""
    if len(sets) < max(COLUMNS_FROM, 1):
        return None
    return _kept(sets, "id_column", _id_column)


def _id_column(sets: SeqSets) -> np.ndarray | None:
    ids = one_id_each(sets)
    if ids is None:
        return None
    column = np.array(ids, dtype=np.int64)
    column.flags.writeable = False
    return column


def _one_id_each(seq_sets: Sequence[tuple[int, ...]]) -> tuple[int, ...] | None:
    if set(map(len, seq_sets)) - {1}:  # a set of none, or of two or more
        return None
    return tuple(map(_FIRST, seq_sets))


def _token_sets(sets: SeqSets) -> dict[frozenset[int], list[int]]:
    """The batch's tokens (their sets `sets`) by sequence set, each set's in batch
    order, the sets in the order of their first token. A batch of one seq id tuple (a
    prefill, a decode of one sequence) is one set, known without a set per token; one
    of `COLUMNS_FROM` tokens or more, one seq id each, is grouped by a sort of its ids."""
    first = one_set(sets)
    if first is not None:
        return {frozenset(first): list(range(len(sets)))}
    ids = _by_columns(sets)
    if ids is not None:
        return _id_sets(ids)
    by_set: dict[frozenset[int], list[int]] = {}
    for i, ss in enumerate(sets):
        by_set.setdefault(frozenset(ss), []).append(i)
    return by_set


def _id_sets(ids: np.ndarray) -> dict[frozenset[int], list[int]]:
    """`_token_sets` of tokens of one seq id each (the column `ids`): a stable sort by
    seq id keeps each sequence's tokens in batch order; its first is its run's head."""
    order = np.argsort(ids, kind="stable")
    seq = ids[order]
    head = np.flatnonzero(np.concatenate(([True], seq[1:] != seq[:-1])))
    runs = np.split(order, head[1:])
    heads = seq[head].tolist()
    return {frozenset((heads[j],)): runs[j].tolist() for j in np.argsort(order[head]).tolist()}


def split_refusal(coupled: bool, n_ubatch: int, sequential: bool, n_keep_tail: int
                  ) -> str | None:
    """What llama_batch_allocr::split_equal checks before it splits: a sequential split
    refuses coupled sequences (the message); then GGML_ASSERT(n_ubatch > n_keep_tail)
    (raises KeepTailAssert)."""
    if sequential and coupled:
        return ("a sequential split (non-unified cache) does not support coupled sequences "
                "in the batch")
    if n_keep_tail and n_ubatch <= n_keep_tail:
        raise KeepTailAssert(
            f"GGML_ASSERT(n_ubatch > n_keep_tail) in llama_batch_allocr::split_equal: n_ubatch "
            f"{n_ubatch} cannot keep the {n_keep_tail} trailing tokens of a sequence together "
            "(n_rs_seq + 1)")
    return None


def decode_split(tokens: tuple[Token, ...], fixed: tuple[tuple[int, ...], ...] | None,
                 n_ubatch: int, sequential: bool, n_keep_tail: int,
                 sets: SeqSets | None = None) -> list[Ubatch] | str:
    """A decode's ubatches as the replay runs them: its recorded split (`fixed`, which
    a sequential split refuses with coupled sequences), or llama_memory_hybrid_idx::
    init_batch's split_equal(n_ubatch, sequential, n_keep_tail). A refusal is the
    message; GGML_ASSERT(n_ubatch > n_keep_tail) raises KeepTailAssert. `sets`: the
    tokens' `seq_sets`, when the caller has them."""
    if fixed is None:
        return split_equal(tokens, n_ubatch, sequential, n_keep_tail, sets)
    refused = split_refusal(any(len(t.seq) > 1 for t in tokens), n_ubatch, sequential, 0)
    if refused is not None:
        return refused
    return [Ubatch(ub, len({s for j in ub for s in tokens[j].seq})) for ub in fixed]


def first_ubatch_len(span: Span, n_ubatch: int, n_keep_tail: int) -> int:
    """The tokens in the first ubatch split_equal makes of a span (one sequence set):
    split_equal run on the span's first n_ubatch + n_keep_tail tokens, which end that
    ubatch exactly as the whole span does (a remainder of n_keep_tail or more is
    kept whole); so at most that many tokens are built."""
    n = min(len(span), n_ubatch + n_keep_tail)
    head = Token.each(range(span.start, span.start + n), span.seq, span.ext)
    split = split_equal(head, n_ubatch, sequential=False, n_keep_tail=n_keep_tail)
    assert not isinstance(split, str), split  # one set always splits
    return len(split[0].tokens)


def _disjoint_sets(pending: list[tuple[int, frozenset[int]]], n_ubatch: int
                   ) -> list[frozenset[int]]:
    """The non-sequential collection of llama_batch_allocr::split_equal: walking the
    unused tokens in batch order, take a token's set if it overlaps none taken.
    Each distinct set is decided at its first unused token: a set refused for
    overlapping a taken one overlaps it at every later token too (the collection only
    grows), and a taken set overlaps itself. So the walk visits sets, not tokens; and
    a set overlaps one taken exactly when it meets the union of those taken."""
    cur: list[frozenset[int]] = []
    taken: set[int] = set()
    for _i, ss in pending:
        if not taken.isdisjoint(ss):
            continue
        cur.append(ss)
        taken.update(ss)
        if len(cur) > n_ubatch:
            break
    return cur


def _sequential_sets(pending: list[tuple[int, frozenset[int]]],
                     by_set: dict[frozenset[int], list[int]], cursor: dict[frozenset[int], int],
                     tokens: tuple[Token, ...], n_ubatch: int) -> list[frozenset[int]]:
    """The sequential collection of llama_batch_allocr::split_equal (non-unified
    cache; every set is one sequence): the first unused token's sequence, then, walking
    on in batch order, the next token whose seq id is the last taken one's + 1. Every
    unused token is tried when the walk reaches it, so a sequence passed over earlier
    in the walk (its id was not yet the next one) is taken at a later token of it
    (tokens {0}, {2}, {1}, {2}: 0, then 1, then 2). The walk is followed by jumping
    to the next unused token of seq last + 1 after the walk's position."""
    first_i, first = pending[0]
    cur = [first]
    at, last = first_i, tokens[first_i].seq[0]
    while len(cur) <= n_ubatch:
        nxt = frozenset((last + 1,))
        idxs = by_set.get(nxt)
        if idxs is None:
            break
        k = bisect.bisect_right(idxs, at, lo=cursor[nxt])
        if k == len(idxs):
            break  # no unused token of seq last + 1 later in the walk
        cur.append(nxt)
        at, last = idxs[k], last + 1
    return cur


def _keep_tails(cur: list[frozenset[int]], per_set: list[list[int]],
                by_set: dict[frozenset[int], list[int]], cursor: dict[frozenset[int], int],
                n_ubatch: int, n_keep_tail: int) -> int:
    """The `n_keep_tail` step of llama_batch_allocr::split_equal: the trailing
    n_keep_tail tokens of a sequence set must land in one ubatch (the recurrent
    child's rollback snapshots, ENGINE.md §3). Keep the leading sets whose unused
    remainder is 0 or at least n_keep_tail, and give back that first offender and
    every set after it. When even the first would be cut: take its whole remainder if
    it fits in n_ubatch, else give its tokens back until n_keep_tail remain.
    Updates `cur`, `per_set` and `cursor` in place; returns the change in tokens used."""

    def remaining(k: int) -> int:
        return len(by_set[cur[k]]) - cursor[cur[k]]

    delta = 0
    n_keep = 0
    while n_keep < len(cur) and not 0 < remaining(n_keep) < n_keep_tail:
        n_keep += 1
    if n_keep == 0:
        ss, taken = cur[0], per_set[0]
        if len(taken) + remaining(0) <= n_ubatch:  # finish the set in this ubatch
            more = by_set[ss][cursor[ss]:]
            taken.extend(more)
            cursor[ss] += len(more)
            delta += len(more)
        else:
            while remaining(0) < n_keep_tail:
                taken.pop()
                cursor[ss] -= 1
                delta -= 1
        n_keep = 1
    for k in range(n_keep, len(cur)):
        cursor[cur[k]] -= len(per_set[k])
        delta -= len(per_set[k])
    del cur[n_keep:], per_set[n_keep:]
    return delta
