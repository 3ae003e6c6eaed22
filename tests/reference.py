"""A slow, obviously correct reference for the k-pool engine (ENGINE.md §5-§7).

Everything is rebuilt from scratch from the raw cell arrays of the replay's
`KvCache` (`stream.pos`, `stream.has`, `stream.seq_ids`), never from the per-sequence
sorted index the cache keeps, and never from the incremental layout. Plain Python:
lists, dicts and loops, written as the rules read.
"""

from __future__ import annotations

from dataclasses import dataclass, field

CLEAN = (1 << 31) - 1  # ENGINE.md §4: POS_CLEAN


# -- §2: a sequence's (pos, cell) pairs, from the raw arrays ---------------------------


def stream_index(cache, s: int) -> int:
    """§2: unified: every sequence is in stream 0; non-unified: stream s is sequence s."""
    return 0 if cache.config.unified else s


def seq_pairs(cache, s: int) -> list[tuple[int, int]]:
    """s's (pos, cell) pairs, ordered by pos then cell; cells are stream-local."""
    st = cache.streams[stream_index(cache, s)]
    col = list(st.seq_ids).index(s)
    out = []
    for c in range(cache.config.kv_size):
        p = int(st.pos[c])
        if p != -1 and bool(st.has[col][c]):
            out.append((p, c))
    out.sort()
    return out


def seqs_of_cell(cache, strm: int, c: int) -> list[int]:
    st = cache.streams[strm]
    return [s for i, s in enumerate(st.seq_ids) if bool(st.has[i][c])]


# -- §5 step 4: the pool scan ------------------------------------------------------------


def scan_pools(pairs: list[tuple[int, int]], kpool: int, by_order: bool) -> list[int]:
    """The greedy loop of ENGINE.md §5 step 4, from j = 0 (a from-scratch rebuild:
    pos_min = the first pair's pos)."""
    pos_min = pairs[0][0] if pairs else 0
    pools = []
    j = 0
    while j + kpool <= len(pairs):
        if by_order:
            pools.append(j)
            j += kpool
            continue
        pj = pairs[j][0]
        ok = (pj - pos_min) % kpool == 0
        for i in range(1, kpool):
            if pairs[j + i][0] != pj + i:
                ok = False
        if ok:
            pools.append(j)
            j += kpool
        else:
            j += 1
    return pools


@dataclass
class RefSeq:
    strm: int
    pairs: list[tuple[int, int]]
    pools: list[int]  # start indices into pairs


@dataclass
class RefLayout:
    kpool: int
    kv_size: int
    by_order: bool
    unified: bool
    seqs: list[RefSeq]
    shared: bool  # some cell of some sequence holds more than one sequence
    pool_seq: list[int] = field(default_factory=list)  # global pool ip -> seq
    pool_k: list[int] = field(default_factory=list)  # global pool ip -> k in its seq

    @property
    def n_pool_real(self) -> int:
        return len(self.pool_seq)

    def row(self, s: int, cell: int) -> int:
        return self.seqs[s].strm * self.kv_size + cell

    def members(self, ip: int) -> list[int]:
        s, k = self.pool_seq[ip], self.pool_k[ip]
        sq = self.seqs[s]
        j = sq.pools[k]
        return [self.row(s, sq.pairs[j + i][1]) for i in range(self.kpool)]

    def rep_row(self, ip: int) -> int:
        return self.members(ip)[-1]

    def rep_pos(self, s: int, k: int) -> int:
        sq = self.seqs[s]
        return sq.pairs[sq.pools[k] + self.kpool - 1][0]

    def first_pos(self, s: int, k: int) -> int:
        sq = self.seqs[s]
        return sq.pairs[sq.pools[k]][0]

    def pool_cells(self) -> list[int]:
        """§7: the global rep row of every real pool, in layout order."""
        return [self.rep_row(ip) for ip in range(self.n_pool_real)]

    def ip(self, s: int, k: int) -> int:
        return sum(len(self.seqs[t].pools) for t in range(s)) + k


def rebuild(cache) -> RefLayout:
    """ENGINE.md §5, from scratch: every sequence's pairs and pools; pools numbered in
    layout order (sequence 0's, then 1's, ...)."""
    cfg = cache.config
    seqs = []
    shared = False
    for s in range(cfg.n_seq_max):
        strm = stream_index(cache, s)
        pairs = seq_pairs(cache, s)
        seqs.append(RefSeq(strm, pairs, scan_pools(pairs, cfg.kpool, cfg.by_order)))
        if cfg.unified:
            for _p, c in pairs:
                if len(seqs_of_cell(cache, strm, c)) > 1:
                    shared = True
    lay = RefLayout(cfg.kpool, cfg.kv_size, cfg.by_order, cfg.unified, seqs, shared)
    for s, sq in enumerate(seqs):
        for k in range(len(sq.pools)):
            lay.pool_seq.append(s)
            lay.pool_k.append(k)
    return lay


# -- §6: marking ---------------------------------------------------------------------------


@dataclass
class RefMarking:
    marked: list[int]  # global pool indices, ascending (layout order)
    repool_all: bool
    abort: bool = False  # a by-order token missing from its sequence (GGML_ASSERT r >= 0)


def mark(lay: RefLayout, tokens: list[tuple[int, tuple[int, ...], int]],
         stale_from: list[int] | None, engine: str) -> RefMarking:
    """ENGINE.md §6 for one ubatch. `tokens` = (pos, seq ids in the order given,
    stream-local cell) in ubatch order; `stale_from` = the batch's stale snapshot on
    ubatch 0, else None. `engine` is "rep-once" or "cache-safe"."""
    n_pool = lay.n_pool_real
    if engine == "cache-safe" and lay.shared:
        return RefMarking(list(range(n_pool)), True)

    generation = 1
    is_new: dict[int, int] = {}  # pool ip -> generation that marked it
    rep_gen: dict[int, int] = {}  # global rep row -> generation that marked a pool on it

    def do_mark(s: int, k: int) -> None:
        ip = lay.ip(s, k)
        if engine == "rep-once":
            rep = lay.rep_row(ip)
            if rep_gen.get(rep) != generation:
                rep_gen[rep] = generation
                is_new[ip] = generation
        else:
            if is_new.get(ip) != generation:
                is_new[ip] = generation

    if stale_from is not None:
        for s, sq in enumerate(lay.seqs):
            if stale_from[s] == CLEAN:
                continue
            for k in range(len(sq.pools)):
                if lay.rep_pos(s, k) >= stale_from[s]:
                    do_mark(s, k)

    for p, ss, cell in tokens:
        for s in ss:
            sq = lay.seqs[s]
            if lay.by_order:
                if (p, cell) not in sq.pairs:
                    return RefMarking([], False, abort=True)
                r = sq.pairs.index((p, cell))
                if r // lay.kpool < len(sq.pools):
                    do_mark(s, r // lay.kpool)
                continue
            last = -1
            for k in range(len(sq.pools)):
                if lay.first_pos(s, k) <= p:
                    last = k
            if last >= 0 and p <= lay.rep_pos(s, last):
                do_mark(s, last)

    marked = sorted(ip for ip, g in is_new.items() if g == generation)
    return RefMarking(marked, False)


def pad(n: int) -> int:
    """kpool_pad: max(64, roundup(n + 1, 64))."""
    m = n + 1
    while m % 64 != 0:
        m += 1
    return max(64, m)


def n_new_g(n_new: int, n_tokens: int, n_seqs_unq: int, n_pool_real: int, kv_size: int,
            kpool: int, n_seq_max: int, repool_all: bool) -> int:
    """ENGINE.md §6, "Graph size of the new list"."""
    if repool_all:
        return max(n_new, 1)
    return max(n_new, 1, min(n_tokens // kpool + n_seqs_unq, pad(n_pool_real) - 1,
                             kv_size // kpool * n_seq_max))


# -- §7: the scatter plan ------------------------------------------------------------------


def padding_rows(pool_cells: list[int], n_pad: int, n_rows: int) -> list[int] | None:
    """The smallest global rows that are no real pool's rep, one per padding entry;
    None when a row would reach n_rows (GGML_ASSERT)."""
    reps = set(pool_cells)
    out = []
    row = 0
    while len(out) < n_pad:
        if row >= n_rows:
            return None
        if row not in reps:
            out.append(row)
        row += 1
    return out


@dataclass
class RefPlan:
    entry_rep: list[int]
    entry_rows: list[list[int]]
    entry_pad: list[bool]
    pool_cells: list[int]
    visible: list[int]
    abort: bool = False


def plan(lay: RefLayout, marked: list[int], n_g: int,
         tokens: list[tuple[int, tuple[int, ...], int]], n_rows: int) -> RefPlan:
    pool_cells = lay.pool_cells()
    rep, rows, padf = [], [], []
    for ip in marked:
        rows.append(lay.members(ip))
        rep.append(lay.rep_row(ip))
        padf.append(False)
    n_pad = n_g - len(marked)
    if n_pad > 0:
        extra = padding_rows(pool_cells, n_pad, n_rows)
        if extra is None:
            return RefPlan([], [], [], pool_cells, [], abort=True)
        for r in extra:
            rows.append([r] * lay.kpool)
            rep.append(r)
            padf.append(True)
    visible = []
    for p, ss, cell in tokens:
        s = ss[0]
        sq = lay.seqs[s]
        if lay.by_order:
            r = sq.pairs.index((p, cell))
            visible.append(min(len(sq.pools), (r + 1) // lay.kpool))
        else:
            visible.append(sum(1 for k in range(len(sq.pools)) if lay.rep_pos(s, k) <= p))
    return RefPlan(rep, rows, padf, pool_cells, visible)


def token_list(rec, kv_size: int) -> list[tuple[int, tuple[int, ...], int]]:
    """A UbatchRecord's tokens as (pos, seq ids, stream-local cell)."""
    out = []
    for i in range(rec.n_tokens):
        row = int(rec.token_rows[i])
        out.append((int(rec.token_pos[i]), tuple(rec.token_seqs[i]), row % kv_size))
    return out
