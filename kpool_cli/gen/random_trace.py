"""Random traces: any valid mix of every op, for `kpool gen random` and `kpool fuzz`.

Owns: `random_trace(seed, ...)` and its position tracker `PositionTracker`.

Invariants:
- pure: the trace is a function of the arguments alone (one `random.Random(seed)`,
  no other source of randomness, no clock), so any fuzz run is reproducible from its
  seed;
- small caches (kv_size 8..64, kpool 1..4, n_seq_max 1..4), at most `max_ops` ops;
- decodes continue each sequence from the position the hybrid memory reports (the
  attention cells and the recurrent state, rolled back by speculative removals), so
  llama.cpp's batch validation accepts most of them; about one decode in ten is
  nudged off that position on purpose, so the validator is exercised too;
- the tracker is a rough model for choosing arguments, not the thing under test:
  where it is wrong a decode is merely refused (KP006).
"""

from __future__ import annotations

import random

from ..trace.model import (
    CacheConfig,
    Clear,
    Decode,
    Op,
    SeqAdd,
    SeqCp,
    SeqDiv,
    SeqKeep,
    SeqRm,
    Span,
    StateDrop,
    StateRead,
    StateWrite,
    Token,
    Trace,
)

_END = 1 << 40  # "to the end" of a range, for the tracker
_N_UBATCH = (2, 3, 4, 6, 8, 512)


class PositionTracker:
    """Each stream's cells as [pos, set of seq ids], the recurrent child's state pos
    per sequence (-1: none) and whether a rollback is pending, snapshots by slot."""

    def __init__(self, cfg: CacheConfig) -> None:
        self.cfg = cfg
        self.streams: list[list[list]] = [[] for _ in range(cfg.n_stream)]
        self.rec = [-1] * cfg.n_seq_max
        self.pending = [False] * cfg.n_seq_max
        self.snaps: dict[str, tuple[list[int], int]] = {}

    def stream(self, s: int) -> list[list]:
        return self.streams[0 if self.cfg.unified else s]

    def positions(self, s: int) -> list[int]:
        return [c[0] for c in self.stream(s) if s in c[1]]

    def pmax(self, s: int) -> int:
        return max(self.positions(s), default=-1)

    def pmin(self, s: int) -> int:
        return min(self.positions(s), default=-1)

    def hmin(self, s: int) -> int:
        """The hybrid memory's seq_pos_min (what a batch is validated against)."""
        return max(self.pmin(s), self.rec[s])

    def hmax(self, s: int) -> int:
        """The hybrid memory's seq_pos_max: the attention cells capped by the recurrent
        state's pos."""
        return min(self.pmax(s), self.rec[s])

    def next_pos(self, s: int) -> int:
        x = self.hmax(s)
        return x + 1 if x >= 0 else self.pmax(s) + 1

    def _gc(self) -> None:
        self.streams = [[c for c in cells if c[1]] for cells in self.streams]

    def decode(self, tokens: tuple[Token, ...]) -> None:
        need: dict[int, int] = {}
        for t in tokens:
            k = 0 if self.cfg.unified else t.seq[0]
            need[k] = need.get(k, 0) + 1
        if any(self.cfg.kv_size - len(self.streams[k]) < n for k, n in need.items()):
            return  # find_slot refuses the real decode too
        for t in tokens:
            self.stream(t.seq[0]).append([t.pos, set(t.seq)])
            for s in t.seq:
                self.rec[s] = t.pos
                self.pending[s] = False

    def seq_rm(self, s: int, p0: int, p1: int) -> bool:
        """False when the recurrent child refuses (nothing changes); seq -1 over the
        whole range empties every cell and state (over part of it: refused)."""
        lo, hi = max(p0, 0), _END if p1 < 0 else p1
        if s < 0:
            if not (lo == 0 and p1 < 0):
                return False
            self.clear()
            return True
        r = self.rec[s]
        if lo == 0 and p1 < 0:
            self.pending[s] = False
        if r >= 0 and 0 < lo <= r < hi:
            if self.pending[s] or r - (lo - 1) > self.cfg.n_rs_seq:
                return False
            self.pending[s] = True
            self.rec[s] = lo - 1
        elif lo <= r < hi:
            self.rec[s] = -1
        for c in self.stream(s):
            if s in c[1] and lo <= c[0] < hi:
                c[1].discard(s)
        self._gc()
        return True

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        if src == dst:
            return
        self.rec[dst] = self.rec[src]
        lo, hi = max(p0, 0), _END if p1 < 0 else p1
        if self.cfg.unified:
            for c in self.streams[0]:
                if src in c[1] and lo <= c[0] < hi:
                    c[1].add(dst)
        else:
            self.streams[dst] = [[c[0], {dst}] for c in self.streams[src]]

    def seq_keep(self, s: int) -> None:
        self.rec = [r if t == s else -1 for t, r in enumerate(self.rec)]
        for c in self.stream(s):
            c[1] = {s} if s in c[1] else set()
        self._gc()

    def seq_add(self, s: int, p0: int, p1: int, shift: int) -> None:
        lo, hi = max(p0, 0), _END if p1 < 0 else p1
        if shift and lo < hi and lo <= self.rec[s] < hi:
            self.rec[s] += shift
        for c in self.stream(s):
            if s in c[1] and lo <= c[0] < hi:
                c[0] += shift
        self.streams = [[c for c in cells if c[1] and c[0] >= 0] for cells in self.streams]

    def seq_div(self, s: int, p0: int, p1: int, d: int) -> None:
        lo, hi = max(p0, 0), _END if p1 < 0 else p1
        if lo <= self.rec[s] < hi:
            self.rec[s] //= d
        for c in self.stream(s):
            if s in c[1] and lo <= c[0] < hi:
                c[0] //= d

    def state_write(self, s: int, slot: str) -> None:
        self.snaps[slot] = (self.positions(s), self.rec[s])

    def state_read(self, s: int, slot: str) -> None:
        pos, rec = self.snaps[slot]
        if pos:
            self.seq_rm(s, -1, -1)
            if self.cfg.kv_size - len(self.stream(s)) < len(pos):
                self.rec[s] = -1
                return  # the restore fails: s is dropped
            self.stream(s).extend([p, {s}] for p in pos)
        self.rec[s] = rec
        self.pending[s] = False

    def state_drop(self, s: int) -> None:
        self.seq_rm(s, -1, -1)
        self.rec[s] = -1

    def clear(self) -> None:
        self.streams = [[] for _ in self.streams]
        self.rec = [-1] * self.cfg.n_seq_max
        self.pending = [False] * self.cfg.n_seq_max


def random_config(rng: random.Random) -> CacheConfig:
    """kv_size 8..64, kpool 1..4, n_seq_max 1..4, unified or not, position mode four
    times in five; half the time rollback snapshots (n_rs_seq 1..3) with n_ubatch
    large enough for the kept tail."""
    kv_size = rng.choice((8, 12, 16, 24, 32, 48, 64))
    n_rs_seq = rng.randint(1, 3) if rng.random() < 0.5 else 0
    n_ubatch = rng.choice([n for n in _N_UBATCH if n > n_rs_seq + 1])
    return CacheConfig(
        kv_size=kv_size, kpool=rng.randint(1, 4), n_seq_max=rng.randint(1, 4),
        unified=rng.random() < 0.6, by_order=rng.random() < 0.2, n_ubatch=n_ubatch,
        n_rs_seq=n_rs_seq,
    )


def random_trace(seed: int, *, max_ops: int = 12) -> Trace:
    """A random trace of 1..max_ops ops (a decode first), every op kind possible:
    decodes (coupled seq ids in a unified cache; some larger than their stream, kept
    as a span), seq_rm (speculative tail removals and whole-range removals of every
    sequence among them), seq_cp whole and partial, seq_keep, seq_add, seq_div (position mode),
    state_write/read/drop, clear."""
    rng = random.Random(seed)
    cfg = random_config(rng)
    tr = PositionTracker(cfg)
    n = cfg.n_seq_max
    kinds = (["decode"] * 6 + ["seq_rm", "spec", "spec", "seq_cp", "seq_cp",
                               "seq_cp_part", "seq_keep", "state_write", "state_read",
                               "state_drop", "clear", "rm_all"])
    if not cfg.by_order:
        kinds += ["seq_add", "seq_add", "seq_div"]
        if n > 1:
            kinds += ["drift"]
    ops: list[Op] = []
    written: list[str] = []

    def seq() -> int:
        return rng.randrange(n)

    def bound() -> int:
        return rng.randint(-1, 2 * cfg.kv_size)

    def decode(tokens: tuple[Token, ...]) -> None:
        ops.append(Decode(tokens=tokens))
        tr.decode(tokens)

    target = rng.randint(1, max_ops)
    while len(ops) < target:
        kind = "decode" if not ops else rng.choice(kinds)
        if kind == "decode" and ops and rng.random() < 0.015 and cfg.n_stream > 1:
            # more tokens than the sequence's stream has cells, no more than the
            # context's: llama_decode refuses it (KP006); past the context, its assert
            # on n_batch would abort (KP005), an engine finding of the generator's own
            s = seq()
            start = tr.next_pos(s)
            length = min(cfg.kv_size + rng.randint(1, 8), cfg.kv_size * cfg.n_stream)
            ops.append(Decode(tokens=(), span=Span((s,), start, start + length)))
        elif kind == "decode":
            decode(_random_tokens(rng, tr, cfg))
        elif kind == "seq_rm":
            s, p0, p1 = seq(), bound(), bound()
            ops.append(SeqRm(s, p0, p1))
            tr.seq_rm(s, p0, p1)
        elif kind == "rm_all":
            # every sequence, the whole range: the recurrent child empties its cells and
            # leaves the tails (the next decode of a sequence that had a state aborts)
            ops.append(SeqRm(-1))
            tr.seq_rm(-1, -1, -1)
        elif kind == "spec":
            # speculative decoding: the draft's trailing tokens rejected, then the
            # decode goes on from the kept position
            s = seq()
            p = max(tr.next_pos(s) - rng.randint(0, cfg.n_rs_seq + 1), 0)
            ops.append(SeqRm(s, p, -1))
            tr.seq_rm(s, p, -1)
            if rng.random() < 0.5:
                decode(tuple(Token(tr.next_pos(s) + k, (s,)) for k in range(rng.randint(1, 4))))
        elif kind == "seq_cp":
            a, b = seq(), seq()
            ops.append(SeqCp(a, b))
            tr.seq_cp(a, b)
        elif kind == "seq_cp_part":
            a, b = seq(), seq()
            p0, p1 = rng.randint(0, max(tr.pmax(a), 0)), rng.choice((-1, bound()))
            ops.append(SeqCp(a, b, p0, p1))
            if cfg.unified:
                tr.seq_cp(a, b, p0, p1)
            else:
                tr.seq_cp(a, b)
        elif kind == "drift":
            # share a sequence, let the copy's layout be built, then move shared cells
            # through the source only
            a, b = seq(), seq()
            ops.append(SeqCp(a, b))
            tr.seq_cp(a, b)
            decode((Token(tr.next_pos(a), (a,)),))
            p0 = rng.randint(1, max(1, tr.pmax(a)))
            if rng.random() < 0.5:
                shift = rng.randint(-4, 2)
                ops.append(SeqAdd(a, p0, -1, shift))
                tr.seq_add(a, p0, -1, shift)
            else:
                ops.append(SeqDiv(a, p0, -1, 2))
                tr.seq_div(a, p0, -1, 2)
        elif kind == "seq_keep":
            s = seq()
            ops.append(SeqKeep(s))
            tr.seq_keep(s)
        elif kind == "seq_add":
            s, p0, p1, shift = seq(), bound(), bound(), rng.randint(-6, 6)
            ops.append(SeqAdd(s, p0, p1, shift))
            tr.seq_add(s, p0, p1, shift)
        elif kind == "seq_div":
            s, p0, p1, d = seq(), bound(), bound(), rng.randint(1, 3)
            ops.append(SeqDiv(s, p0, p1, d))
            tr.seq_div(s, p0, p1, d)
        elif kind == "state_write":
            s, slot = seq(), rng.choice("ab")
            ops.append(StateWrite(s, slot))
            tr.state_write(s, slot)
            written.append(slot)
        elif kind == "state_read" and written:
            s, slot = seq(), rng.choice(written)
            ops.append(StateRead(s, slot))
            tr.state_read(s, slot)
        elif kind == "state_drop":
            s = seq()
            ops.append(StateDrop(s))
            tr.seq_rm(s, -1, -1)
            tr.rec[s] = -1
        elif kind == "clear":
            ops.append(Clear())
            tr.clear()
    return Trace(cache=cfg, ops=tuple(ops[:max_ops]), name=f"random-{seed}", seed=seed)


def _random_tokens(rng: random.Random, tr: PositionTracker, cfg: CacheConfig) -> tuple[Token, ...]:
    """One decode's tokens: 1..n_seq_max sequences, each continuing where it ends;
    in a unified cache sometimes two sequences in step share their tokens."""
    n = cfg.n_seq_max
    chosen = sorted(set(rng.randrange(n) for _ in range(rng.randint(1, n))))
    tokens: list[Token] = []
    if cfg.unified and len(chosen) >= 2 and rng.random() < 0.3:
        a, b = chosen[0], chosen[1]
        if tr.pmin(a) == tr.pmin(b) and tr.next_pos(a) == tr.next_pos(b):
            pair = (a, b) if rng.random() < 0.5 else (b, a)
            start = tr.next_pos(a)
            tokens += [Token(start + k, pair) for k in range(rng.randint(1, 4))]
            chosen = chosen[2:]
    for s in chosen:
        start = tr.next_pos(s)
        if rng.random() < 0.1:  # a decode validation may refuse
            start = max(start + rng.choice((-1, 1, 2)), 0)
        if cfg.by_order and rng.random() < 0.3:
            tokens += [Token(start, (s,), (k // 3, k % 3)) for k in range(rng.randint(1, 6))]
            continue
        tokens += [Token(start + k, (s,)) for k in range(rng.randint(1, 6))]
    if cfg.by_order and any(t.ext is not None for t in tokens):
        # ext marks an image batch: every token of it carries one
        tokens = [t if t.ext is not None else Token(t.pos, t.seq, (0, 0)) for t in tokens]
    # the loader refuses a decode the cache could never place
    return tuple(tokens[: cfg.n_rows])
