"""Realistic cache workloads as traces: one generator per scenario of `kpool gen`.

Owns: the scenario generators (`server`, `speculative`, `context_shift`,
`save_restore`, `mrope_image`), `Size` and `Scenario` (a generator with its size
options: name, default, bounds, one line of doc each) and the registry `SCENARIOS`,
which the CLI reads to build `kpool gen SCENARIO`'s options; each scenario's
`estimate` (an `Estimate` of its trace for given sizes) and `LOADER_BOUNDS`, the
loader's bounds it is checked against. The `random` scenario's generator lives in
`gen.random_trace` and is registered here.

Invariants:
- a generator is a pure function of `(seed, **sizes)`: its only randomness is one
  `random.Random(seed)`, so the same arguments give the same trace, on any machine;
- it raises ValueError for a size outside its bounds or sizes that do not fit
  together (the CLI's exit 2), before building anything;
- every decode continues each of its sequences from the position the trace left it
  at (llama_batch_allocr's Y = X + 1; M-RoPE: X < Y, X <= Y for an image), the cache
  holds every live cell and keeps a free row for the scatter's padding entry (kv_size
  is derived from the sizes, with kpool cells to spare), and no edit is one an
  engine asserts on (no partial seq_cp, no seq_add on an M-RoPE cache) or the
  recurrent child refuses (no removal inside a state but a rollback of at most
  n_rs_seq tokens): both engines replay a generated trace without KP005, KP006 or
  KP008;
- the trace's `name` is the scenario and its `description` says what it shows and
  how to regenerate it (`kpool gen NAME --seed S --size N ...`);
- the trace is one `kpool replay` loads: before building anything, a generator
  refuses (ValueError naming the size to lower and the loader's bound) sizes whose
  trace could cross a bound of the loader (`LOADER_BOUNDS`: its ops, tokens, YAML
  nodes, bytes, positions, cells), whatever its seed draws. Each scenario's
  `estimate` is a bound, over every draw, of what `trace.write` writes for the
  sizes: the worst case of each count (every draw at its largest; the server's
  slots scheduled at their worst), each op weighed by the writer itself
  (`op_written`) on a stand-in with the largest numbers the sizes allow.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable
from dataclasses import dataclass, replace
from types import ModuleType

from kpool_cli.trace import format as trace_format
from kpool_cli.trace.format import (
    KV_SIZE_MAX,
    N_EMBD_MAX,
    N_RS_SEQ_MAX,
    N_SEQ_MAX_MAX,
    N_UBATCH_MAX,
    SEED_MAX,
)
from kpool_cli.trace.model import (
    CacheConfig,
    Decode,
    Note,
    Op,
    SeqAdd,
    SeqCp,
    SeqRm,
    StateDrop,
    StateRead,
    StateWrite,
    Token,
    Trace,
)
from kpool_cli.trace.write import Written, head_written, op_written
from kpool_cli.trace.yaml_safe import limits as yaml_safe
from kpool_cli.wording import counted

__all__ = ["LOADER_BOUNDS", "SCENARIOS", "Estimate", "LoaderBound", "Scenario", "Size",
           "check_sizes", "context_shift", "mrope_image", "save_restore", "server",
           "speculative"]


@dataclass(frozen=True, slots=True)
class Size:
    """One integer size option of a scenario: `--NAME N`, N in [lo, hi]."""

    name: str
    default: int
    lo: int
    hi: int
    doc: str

    @property
    def option(self) -> str:
        return "--" + self.name.replace("_", "-")


@dataclass(frozen=True, slots=True)
class Estimate:
    """At most what a scenario's trace holds for given sizes, whatever its seed draws:
    the counts the loader bounds (`written`: its YAML nodes and bytes)."""

    ops: int
    tokens: int
    written: Written
    max_pos: int  # the largest position of a token or a range
    kv_size: int


@dataclass(frozen=True, slots=True)
class LoaderBound:
    """A bound of the loader on a trace, read from the loader's own module when it is
    checked (one constant: a test that lowers it lowers it for both)."""

    module: ModuleType
    name: str  # the constant: `module.name`
    bound: str  # what the loader reads, formatted with the constant
    count: str  # what the trace holds, formatted with the estimate's count
    measure: Callable[[Estimate], int]
    below: bool = False  # the count must be below the constant, not at most it
    note: str = ""

    @property
    def limit(self) -> int:
        return int(getattr(self.module, self.name))

    def crossed(self, est: Estimate) -> bool:
        n = self.measure(est)
        return n >= self.limit if self.below else n > self.limit

    def excess(self, est: Estimate) -> float:
        """How far past the bound the estimate is, as a ratio (above 1: crossed)."""
        return (self.measure(est) + self.below) / max(self.limit, 1)

    @property
    def label(self) -> str:
        return f"{self.name}, {self.note}" if self.note else self.name

    def describe(self) -> str:
        return f"{self.bound.format(self.limit)} ({self.label})"


LOADER_BOUNDS = (
    LoaderBound(yaml_safe, "MAX_OPS", "at most {:,} ops", "up to {:,} ops", lambda e: e.ops),
    LoaderBound(yaml_safe, "MAX_TOKENS", "at most {:,} tokens", "up to {:,} tokens",
                lambda e: e.tokens, note="the default --max-tokens"),
    LoaderBound(yaml_safe, "MAX_NODE_VISITS", "at most {:,} YAML nodes",
                "up to {:,} YAML nodes", lambda e: e.written.nodes),
    LoaderBound(yaml_safe, "MAX_BYTES", "at most {:,} bytes", "up to {:,} bytes",
                lambda e: e.written.bytes),
    LoaderBound(trace_format, "POS_LIMIT", "positions below {:,}", "positions up to {:,}",
                lambda e: e.max_pos, below=True),
    LoaderBound(trace_format, "KV_SIZE_MAX", "at most {:,} cells per stream",
                "up to {:,} cells per stream", lambda e: e.kv_size),
)


def _loader_bounds_help() -> str:
    bounds = "; ".join(b.describe() for b in LOADER_BOUNDS)
    return ("The trace is one kpool replay reads: sizes whose trace could, whatever the "
            "seed draws, cross a bound of the loader are refused (exit 2) before anything "
            f"is generated. The bounds: {bounds}.")


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    fn: Callable[..., Trace]
    sizes: tuple[Size, ...]
    doc: str
    estimate: Callable[[int, dict[str, int]], Estimate]

    def generate(self, seed: int, **sizes: int) -> Trace:
        """The scenario's trace; sizes not given take their defaults. ValueError for
        sizes out of range, that do not fit together, or whose trace the loader could
        refuse (checked before anything is built)."""
        return self.fn(seed, **sizes)

    def check(self, seed: int, **sizes: int) -> dict[str, int]:
        """Every size (defaults filled in), checked as `generate` checks them before it
        builds anything: the same ValueError, nothing generated."""
        return _loadable(self.sizes, self.estimate, seed, sizes)

    def fits(self, seed: int, **sizes: int) -> bool:
        """Would `check` accept the sizes? (Quicker when not: no message.)"""
        try:
            v = check_sizes(self.sizes, sizes)
            _check_seed(seed)
        except ValueError:
            return False
        return _fits(self.estimate, seed, v)

    @property
    def help(self) -> str:
        """`kpool gen NAME --help`: what it does (a sentence, as every command's help
        opens), and the loader's bounds."""
        return f"{self.doc[:1].upper()}{self.doc[1:]}.\n\n{_loader_bounds_help()}"



def check_sizes(sizes: tuple[Size, ...], given: dict[str, int]) -> dict[str, int]:
    """Every size of `sizes`, from `given` or its default; ValueError for an unknown
    name or a value out of its bounds."""
    unknown = sorted(set(given) - {s.name for s in sizes})
    if unknown:
        raise ValueError(f"unknown size {unknown[0]!r}")
    out = {}
    for s in sizes:
        v = given.get(s.name, s.default)
        if not s.lo <= v <= s.hi:
            raise ValueError(f"{s.option} {v} is out of range: it must be in {s.lo}..{s.hi}")
        out[s.name] = v
    return out


def _check_seed(seed: int) -> None:
    if not 0 <= seed <= SEED_MAX:
        raise ValueError(f"--seed {seed} is out of range: it must be from 0 to {SEED_MAX}")


def _seed(seed: int) -> random.Random:
    _check_seed(seed)
    return random.Random(seed)


def _crossed(est: Estimate) -> list[LoaderBound]:
    """The loader's bounds the estimate crosses."""
    return [b for b in LOADER_BOUNDS if b.crossed(est)]


def _fits(estimate: Callable[[int, dict[str, int]], Estimate], seed: int,
          values: dict[str, int]) -> bool:
    try:
        return not _crossed(estimate(seed, values))
    except ValueError:  # sizes that do not fit together
        return False


# a size with at most this many values is searched value by value; a wider one is
# assumed to make the trace no smaller as it grows (or, searched upwards, as it shrinks)
_SCAN = 64


def _fitting(estimate: Callable[[int, dict[str, int]], Estimate], seed: int,
             v: dict[str, int], s: Size) -> tuple[int, str] | None:
    """The value of size `s` nearest its current one that fits, the others as given,
    and whether it is "at most" (below) or "at least" (above) it; None if none."""
    cur = v[s.name]

    def fits(x: int) -> bool:
        return _fits(estimate, seed, {**v, s.name: x})

    if s.hi - s.lo <= _SCAN:
        for d in range(1, s.hi - s.lo + 1):
            if cur - d >= s.lo and fits(cur - d):
                return cur - d, "at most"
            if cur + d <= s.hi and fits(cur + d):
                return cur + d, "at least"
        return None
    if cur > s.lo and fits(s.lo):  # the largest that fits below: binary search
        lo, hi = s.lo, cur - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
        return lo, "at most"
    if cur < s.hi and fits(s.hi):  # the smallest that fits above
        lo, hi = cur + 1, s.hi
        while lo < hi:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if fits(mid) else (mid + 1, hi)
        return lo, "at least"
    return None


def _loadable(sizes: tuple[Size, ...], estimate: Callable[[int, dict[str, int]], Estimate],
              seed: int, given: dict[str, int]) -> dict[str, int]:
    """`check_sizes`, the seed's range, the sizes' fit together (the estimate's
    ValueError), then the loader's bounds: ValueError naming the first bound the
    worst case crosses and the sizes that, lowered (or raised) alone, make it fit."""
    v = check_sizes(sizes, given)
    _check_seed(seed)
    est = estimate(seed, v)
    crossed = _crossed(est)
    if not crossed:
        return v
    bound = max(crossed, key=lambda b: b.excess(est))  # the one crossed the most
    # the sizes changed from their defaults first: the ones the user is likely to move
    order = sorted(sizes, key=lambda s: v[s.name] == s.default)
    fixes = []
    for s in order:
        hit = _fitting(estimate, seed, v, s)
        if hit is not None:
            fixes.append(f"{s.option} {hit[1]} {hit[0]}")
    given_text = " ".join(f"{s.option} {v[s.name]}" for s in sizes)
    where = bound.module.__name__.replace(".", "/") + ".py"
    msg = (f"{given_text} can make a trace with {bound.count.format(bound.measure(est))} "
           f"(whatever the seed draws), and kpool replay reads {bound.bound.format(bound.limit)}"
           f" ({bound.name} in {where})")
    if fixes:
        msg += f"; it fits with {fixes[0]} (the others as given)"
        if len(fixes) > 1:
            msg += ", or " + ", or ".join(fixes[1:])
    else:
        msg += "; no one size alone makes it fit: lower several"
    raise ValueError(msg)


def _head(name: str, seed: int, sizes: tuple[Size, ...], values: dict[str, int],
          cache: CacheConfig, what: str) -> Written:
    """What the trace writes but its ops: as `_trace` makes it."""
    return head_written(_trace(name, seed, sizes, values, cache, [], what))


def _listed(token: Token) -> tuple[Written, Written]:
    """(per decode, per token) of a decode of listed tokens each at most as wide as
    `token`: a decode of k such tokens weighs `per decode + k * per token`, and no
    shorthand `{seq, pos}` decode of them weighs more."""
    two, three = (_op_weight(Decode((token,) * k)) for k in (2, 3))
    per_token = Written(three.nodes - two.nodes, three.bytes - two.bytes)
    return Written(two.nodes - 2 * per_token.nodes, two.bytes - 2 * per_token.bytes), per_token


# the stand-ins repeat while a refusal looks for the sizes that fit
_op_weight = functools.lru_cache(maxsize=4096)(op_written)


def _weight(*ops: Op) -> Written:
    out = Written()
    for op in ops:
        out = out + _op_weight(op)
    return out


def _run(seq: int, start: int, n: int) -> tuple[Token, ...]:
    return Token.each(range(start, start + n), (seq,))


def _how(name: str, seed: int, sizes: tuple[Size, ...], values: dict[str, int]) -> str:
    args = " ".join(f"{s.option} {values[s.name]}" for s in sizes)
    return f"Generated by: kpool gen {name} --seed {seed} {args}"


def _trace(name: str, seed: int, sizes: tuple[Size, ...], values: dict[str, int],
           cache: CacheConfig, ops: list[Op], what: str) -> Trace:
    return Trace(cache=cache, ops=tuple(ops), name=f"gen-{name}", seed=seed,
                 description=f"{what}\n{_how(name, seed, sizes, values)}\n")


# -- server ---------------------------------------------------------------------------

SERVER_SIZES = (
    Size("slots", 2, 1, 16, "server slots: seq ids 0..slots-1"),
    Size("system", 12, 1, 1024, "tokens of the system prompt every slot shares"),
    Size("prompt", 8, 1, 1024, "a request's own prompt: 1..prompt tokens"),
    Size("steps", 6, 1, 512, "a request's decode steps: 1..steps"),
    Size("requests", 4, 1, 256, "requests served in all (slots are reused)"),
    Size("coupled", 0, 0, 1, "0: share the system prompt by seq_cp; 1: decode it once "
                             "with every slot's seq id"),
    Size("kpool", 4, 1, 64, "tokens per pool"),
)


def server(seed: int, **sizes: int) -> Trace:
    """llama-server with N slots on one unified cache: the system prompt decoded in
    slot 0 and copied to the others by a whole seq_cp (or decoded once with every
    slot's seq id), then every slot's prompt and decode steps in shared batches; a
    finished slot is cleared (seq_rm of the whole sequence: a hybrid model's recurrent
    state keeps no prefix) and serves the next request from position 0."""
    v = _loadable(SERVER_SIZES, _server_estimate, seed, sizes)
    rng = _seed(seed)
    n, sysn = v["slots"], v["system"]
    cache = _server_cache(v)
    ops: list[Op] = _server_prologue(v)
    nxt = [sysn] * n  # next position of each slot
    served = min(n, v["requests"])
    prompt = [0] * n  # tokens of its own prompt a slot still has to decode
    left = [0] * n  # decode steps a slot still has to run
    for s in range(served):
        prompt[s] = rng.randint(1, v["prompt"])
        left[s] = rng.randint(1, v["steps"])
    while any(prompt) or any(left):
        tokens: list[Token] = []
        for s in range(n):
            if prompt[s]:
                tokens += _run(s, nxt[s], prompt[s])
                nxt[s] += prompt[s]
                prompt[s] = 0
            elif left[s]:
                tokens.append(Token(nxt[s], (s,)))
                nxt[s] += 1
                left[s] -= 1
        ops.append(Decode(tuple(tokens)))
        for s in range(n):
            if prompt[s] or left[s] or nxt[s] == 0 or served >= v["requests"]:
                continue
            # the slot has finished: it serves the next request from scratch
            ops += [_finished(s, served + 1), SeqRm(s)]
            served += 1
            nxt[s] = 0
            prompt[s] = sysn + rng.randint(1, v["prompt"])
            left[s] = rng.randint(1, v["steps"])
    return _trace("server", seed, SERVER_SIZES, v, cache, ops, _server_what(v, cache))


def _server_cache(v: dict[str, int]) -> CacheConfig:
    n, kp = v["slots"], v["kpool"]
    return CacheConfig(kv_size=n * (v["system"] + v["prompt"] + v["steps"]) + kp, kpool=kp,
                       n_seq_max=n)


def _server_prologue(v: dict[str, int]) -> list[Op]:
    """The system prompt: decoded once with every slot's seq id, or by slot 0 and
    copied to the others."""
    n, sysn = v["slots"], v["system"]
    if v["coupled"]:
        return [Decode(tuple(Token(p, tuple(range(n))) for p in range(sysn)))]
    ops: list[Op] = [Decode(_run(0, 0, sysn))]
    for s in range(1, n):
        ops += [SeqRm(s), SeqCp(0, s)]
    return ops


def _finished(slot: int, request: int) -> Note:
    return Note(f"slot {slot} has finished; it takes request {request}")


def _server_what(v: dict[str, int], cache: CacheConfig) -> str:
    share = ("decoded once with every slot's seq id" if v["coupled"] else
             "decoded by slot 0 and copied to the others by a whole seq_cp")
    return (f"llama-server with {counted(v['slots'], 'slot', number=str)} on one unified "
            f"cache of {cache.kv_size} cells: a {v['system']}-token system prompt {share}; "
            "each request decodes its prompt and its steps in batches shared by the slots; "
            "a finished slot is cleared "
            f"and serves the next request ({v['requests']} in all). Shared cells: cache-safe "
            "re-pools every pool and may race (KP001), rep-once marks each rep once.")


def _server_estimate(seed: int, v: dict[str, int]) -> Estimate:
    """A request holds its slot for 1 + its steps batches (its prompt in one, then a
    token a batch), at most 1 + steps; a finished slot takes the next request at once,
    so the slots are busy until the last request starts, and a slot that takes one
    after `ceil(requests / slots) - 1` rounds of the longest cannot exist: at most
    `ceil(requests / slots) * (1 + steps)` batches. A request decodes at most prompt +
    steps tokens, and the system prompt again when it reuses a slot."""
    n, sysn, p, t, r = v["slots"], v["system"], v["prompt"], v["steps"], v["requests"]
    cache = _server_cache(v)
    prologue = _server_prologue(v)
    batches = -(-r // n) * (1 + t)
    first, reused = min(n, r), r - min(n, r)
    loop_tokens = first * (p + t) + reused * (sysn + p + t)
    per_slot = sysn + p + t
    per_decode, per_token = _listed(Token(per_slot - 1, (n - 1,)))
    written = (_head("server", seed, SERVER_SIZES, v, cache, _server_what(v, cache))
               + _weight(*prologue) + batches * per_decode + loop_tokens * per_token
               + reused * _weight(_finished(n - 1, r), SeqRm(n - 1)))
    return Estimate(ops=len(prologue) + batches + 2 * reused, tokens=sysn + loop_tokens,
                    written=written, max_pos=per_slot - 1, kv_size=cache.kv_size)


# -- speculative ----------------------------------------------------------------------

SPECULATIVE_SIZES = (
    Size("draft", 3, 1, 16, "draft tokens per step (MTP depth); cache.n_rs_seq = draft"),
    Size("steps", 8, 1, 1024, "speculative steps"),
    Size("prompt", 10, 1, 262144, "tokens of the prompt"),
    Size("kpool", 4, 1, 64, "tokens per pool"),
    Size("accept", -1, -1, 16, "drafts accepted per step, at most --draft; -1: a random "
         "prefix"),
    Size("trim", 0, 0, 1, "1: remove the tail after every step, a fully accepted draft's "
         "empty one too (a seq_rm that removes nothing, as llama-server's loop does); "
         "0: only a rejected tail"),
)


def speculative(seed: int, **sizes: int) -> Trace:
    """One slot decoding with drafts of D tokens: each step decodes the last accepted
    token and D drafts, accepts a random prefix of the drafts (or `accept` of them) and
    removes the rejected tail with seq_rm(0, p, -1), a rollback of at most D tokens that
    the recurrent child accepts (n_rs_seq = D) and the next decode consumes. With
    `trim`, a fully accepted draft's empty tail is removed too, as llama-server does."""
    v = _loadable(SPECULATIVE_SIZES, _speculative_estimate, seed, sizes)
    rng = _seed(seed)
    d = v["draft"]
    cache = _speculative_cache(v)
    ops: list[Op] = [Decode(_run(0, 0, v["prompt"]))]
    p = v["prompt"]  # the token sampled last: the next step decodes it first
    if v["accept"] > d:
        raise ValueError(f"--accept {v['accept']} is more than --draft {d}")
    for _ in range(v["steps"]):
        ops.append(Decode(_run(0, p, d + 1)))
        accepted = rng.randint(0, d) if v["accept"] < 0 else v["accept"]
        if accepted < d or v["trim"]:
            ops.append(SeqRm(0, p + 1 + accepted, -1))
        p += 1 + accepted
    return _trace("speculative", seed, SPECULATIVE_SIZES, v, cache, ops,
                  _speculative_what(v))


def _speculative_cache(v: dict[str, int]) -> CacheConfig:
    d, kp = v["draft"], v["kpool"]
    kv = v["prompt"] + v["steps"] * (d + 1)
    return CacheConfig(kv_size=kv + kp, kpool=kp, n_ubatch=max(16, 2 * (d + 2)), n_rs_seq=d)


def _speculative_what(v: dict[str, int]) -> str:
    d = v["draft"]
    return (f"A slot decoding with multi-token prediction: a {v['prompt']}-token prompt, then "
            f"{v['steps']} steps of the last accepted token and {d} drafts; a random prefix "
            "of the drafts is accepted and the rejected tail removed with seq_rm(0, p, -1), "
            f"a rollback the recurrent child accepts (n_rs_seq {d}).")


def _speculative_estimate(seed: int, v: dict[str, int]) -> Estimate:
    """The prompt, then per step a decode of D + 1 tokens and at most one seq_rm; a
    step moves on by at most D + 1 positions."""
    d, steps, prompt = v["draft"], v["steps"], v["prompt"]
    cache = _speculative_cache(v)
    last = prompt + (steps - 1) * (d + 1)  # the last step's first position, at most
    written = (_head("speculative", seed, SPECULATIVE_SIZES, v, cache, _speculative_what(v))
               + _weight(Decode(_run(0, 0, prompt)))
               + steps * _weight(Decode(_run(0, last, d + 1)), SeqRm(0, last + d, -1)))
    return Estimate(ops=1 + 2 * steps, tokens=prompt + steps * (d + 1), written=written,
                    max_pos=last + d, kv_size=cache.kv_size)


# -- context-shift --------------------------------------------------------------------

CONTEXT_SHIFT_SIZES = (
    Size("ctx", 32, 16, 65536, "the slot's context: cache.kv_size"),
    Size("keep", 4, 0, 32767, "n_keep: the head a shift keeps (below ctx / 2)"),
    Size("shifts", 2, 1, 64, "context shifts before the trace ends"),
    Size("chunk", 2, 1, 64, "tokens per decode step at most (at most ctx / 4)"),
    Size("kpool", 4, 1, 64, "tokens per pool, at most ctx"),
)


def context_shift(seed: int, **sizes: int) -> Trace:
    """llama-server's context shift: a slot generates until the next step would not
    fit its context, then discards half of what follows n_keep,
    seq_rm(0, n_keep, n_keep + n_discard) and
    seq_add(0, n_keep + n_discard, n_past, -n_discard), and goes on."""
    v = _loadable(CONTEXT_SHIFT_SIZES, _context_shift_estimate, seed, sizes)
    ctx, keep, chunk, kp = v["ctx"], v["keep"], v["chunk"], v["kpool"]
    rng = _seed(seed)
    n_past = rng.randint(keep + 1, ctx - chunk)
    ops: list[Op] = [Decode(_run(0, 0, n_past))]
    shifts, tail = 0, rng.randint(1, 4)
    while tail:
        c = rng.randint(1, chunk)
        if n_past + c >= ctx:  # llama-server keeps a cell free: n_past + 1 >= n_ctx
            discard = (n_past - keep) // 2
            ops += _shift(n_past, ctx, keep, discard)
            n_past -= discard
            shifts += 1
        ops.append(Decode(_run(0, n_past, c)))
        n_past += c
        if shifts >= v["shifts"]:
            tail -= 1
    cache = CacheConfig(kv_size=ctx, kpool=kp)
    return _trace("context-shift", seed, CONTEXT_SHIFT_SIZES, v, cache, ops,
                  _context_shift_what(v))


def _shift(n_past: int, ctx: int, keep: int, discard: int) -> list[Op]:
    return [Note(f"the slot is at {n_past} of {ctx} positions: context shift, "
                 f"n_keep {keep}, n_discard {discard}"),
            SeqRm(0, keep, keep + discard),
            SeqAdd(0, keep + discard, n_past, -discard)]


def _context_shift_what(v: dict[str, int]) -> str:
    return (f"llama-server's context shift on a {v['ctx']}-cell context, n_keep {v['keep']}: "
            f"the slot generates up to {counted(v['chunk'], 'token', number=str)} per step "
            f"and shifts {counted(v['shifts'], 'time', number=str)} (seq_rm of half the "
            "positions after n_keep, seq_add of the rest down). The shifted pools regroup "
            "from the first moved position; nothing is shared.")


_TAIL = 4  # decodes after the last shift asked for, at most (context_shift's tail)


def _context_shift_estimate(seed: int, v: dict[str, int]) -> Estimate:
    """ValueError for sizes that do not fit together. Every step decodes at least one
    token and n_past stays below ctx. Before the first shift: at most ctx - 1 tokens
    in all, the first decode's at least keep + 1. A shift at n_past = x (x >= ctx -
    chunk: the step did not fit) leaves x - (x - keep) // 2, so the steps until the next
    shift decode at most M = chunk - 1 + (ctx - chunk - keep) // 2 tokens, in at most M
    steps. After the shift asked for last, at most `_TAIL` steps, each of which may
    shift again."""
    ctx, keep, chunk, kp = v["ctx"], v["keep"], v["chunk"], v["kpool"]
    if 2 * (keep + 1) > ctx:
        raise ValueError(f"--keep {keep} does not fit --ctx {ctx}: keep must be below ctx / 2")
    if 4 * chunk > ctx:
        raise ValueError(f"--chunk {chunk} does not fit --ctx {ctx}: at most ctx / 4")
    if kp > ctx:
        raise ValueError(f"--kpool {kp} does not fit --ctx {ctx}: at most ctx")
    k = v["shifts"]
    cycle = chunk - 1 + (ctx - chunk - keep) // 2
    decodes = 1 + (ctx - 2 - keep) + (k - 1) * cycle + _TAIL
    shifts = k + _TAIL - 1
    tokens = ctx - 1 + (k - 1) * cycle + _TAIL * chunk
    most = (ctx - 1 - keep) // 2  # the largest discard
    cache = CacheConfig(kv_size=ctx, kpool=kp)
    written = (_head("context-shift", seed, CONTEXT_SHIFT_SIZES, v, cache,
                     _context_shift_what(v))
               + decodes * _weight(Decode(_run(0, ctx - 1, 2)))
               + shifts * _weight(*_shift(ctx - 1, ctx, keep, most)))
    return Estimate(ops=decodes + 3 * shifts, tokens=tokens, written=written,
                    max_pos=ctx - 1, kv_size=ctx)


# -- save-restore ---------------------------------------------------------------------

SAVE_RESTORE_SIZES = (
    Size("slots", 3, 2, 16, "server slots: seq ids 0..slots-1"),
    Size("prompt", 10, 1, 1024, "a prompt: 1..prompt tokens"),
    Size("steps", 4, 1, 512, "tokens a slot decodes per round: 1..steps"),
    Size("rounds", 3, 1, 256, "rounds of save, restore or drop, then decode"),
    Size("kpool", 4, 1, 64, "tokens per pool"),
)


def save_restore(seed: int, **sizes: int) -> Trace:
    """Slots saved and restored (llama-server's slot save / restore and prompt cache):
    each round saves a slot's state (state_write), then restores a saved state into a
    slot (state_read: the target's cells are replaced by the snapshot) or drops a slot
    (state_drop), and every slot decodes on; a dropped slot takes a new prompt. The
    cache is unified or not, by the seed."""
    v = _loadable(SAVE_RESTORE_SIZES, _save_restore_estimate, seed, sizes)
    rng = _seed(seed)
    n = v["slots"]
    unified = rng.random() < 0.5
    cache = _save_restore_cache(v, unified)
    length = [rng.randint(1, v["prompt"]) for _ in range(n)]
    ops: list[Op] = [Decode(tuple(t for s in range(n) for t in _run(s, 0, length[s])))]
    saved: dict[str, int] = {}
    for r in range(v["rounds"]):
        src = rng.randrange(n)
        name = _slot_name(src, r)
        ops.append(StateWrite(src, name))
        saved[name] = length[src]
        if rng.random() < 0.7:
            dst, pick = rng.randrange(n), rng.choice(sorted(saved))
            ops.append(StateRead(dst, pick))
            length[dst] = saved[pick]
        else:
            dst = rng.randrange(n)
            ops.append(StateDrop(dst))
            length[dst] = 0
        tokens: list[Token] = []
        for s in range(n):
            grow = rng.randint(1, v["prompt"] if length[s] == 0 else v["steps"])
            tokens += _run(s, length[s], grow)
            length[s] += grow
        ops.append(Decode(tuple(tokens)))
    return _trace("save-restore", seed, SAVE_RESTORE_SIZES, v, cache, ops,
                  _save_restore_what(v, cache))


def _save_restore_cache(v: dict[str, int], unified: bool) -> CacheConfig:
    n, kp = v["slots"], v["kpool"]
    longest = v["prompt"] + v["rounds"] * v["steps"]
    kv = n * longest if unified else longest
    return CacheConfig(kv_size=kv + kp, kpool=kp, n_seq_max=n, unified=unified)


def _slot_name(slot: int, round_: int) -> str:
    return f"slot{slot}-round{round_}"


def _save_restore_what(v: dict[str, int], cache: CacheConfig) -> str:
    kind = "one unified cache" if cache.unified else "a stream per slot"
    return (f"{v['slots']} slots on {kind} ({cache.kv_size} cells per stream); {v['rounds']} "
            "rounds of a state_write, then a state_read of a saved state into a slot (its "
            "cells replaced by the snapshot, staled from 0) or a state_drop, then every slot "
            "decodes on. Nothing is shared, so both versions agree.")


def _save_restore_estimate(seed: int, v: dict[str, int]) -> Estimate:
    """The first decode: at most prompt tokens a slot; a round: a state_write, a
    state_read or a state_drop, and a decode in which the one slot dropped, if any,
    takes at most prompt tokens and every other at most steps (no slot is ever left
    empty by a round's decode, and a saved state is never empty). A slot holds at most
    prompt + rounds * steps positions."""
    n, prompt, steps, rounds = v["slots"], v["prompt"], v["steps"], v["rounds"]
    longest = prompt + rounds * steps
    head = Written()
    for unified in (False, True):  # by the seed
        cache = _save_restore_cache(v, unified)
        head = head.most(_head("save-restore", seed, SAVE_RESTORE_SIZES, v, cache,
                               _save_restore_what(v, cache)))
    tokens = n * prompt + rounds * ((n - 1) * steps + max(prompt, steps))
    per_decode, per_token = _listed(Token(longest - 1, (n - 1,)))
    name = _slot_name(n - 1, rounds - 1)
    state = _weight(StateWrite(n - 1, name)) + _weight(StateRead(n - 1, name)).most(
        _weight(StateDrop(n - 1)))
    written = head + (1 + rounds) * per_decode + tokens * per_token + rounds * state
    return Estimate(ops=1 + 3 * rounds, tokens=tokens, written=written, max_pos=longest - 1,
                    kv_size=_save_restore_cache(v, True).kv_size)


# -- mrope-image ----------------------------------------------------------------------

MROPE_IMAGE_SIZES = (
    Size("images", 3, 1, 64, "images in the prompt"),
    Size("patches", 6, 1, 1024, "image tokens per image at most (a w x h grid)"),
    Size("text", 8, 1, 1024, "text tokens between images: 1..text"),
    Size("kpool", 4, 1, 64, "tokens per pool"),
)


def mrope_image(seed: int, **sizes: int) -> Trace:
    """An M-RoPE model (pools by order): text, then images whose w x h tokens all share
    one pos and differ in ext [x, y], the text after an image going on from its pos
    + max(w, h), as Qwen2-VL counts; the last text run is the model's answer."""
    v = _loadable(MROPE_IMAGE_SIZES, _mrope_image_estimate, seed, sizes)
    rng = _seed(seed)
    ops: list[Op] = []
    p, total = 0, 0
    for i in range(v["images"] + 1):
        n_text = rng.randint(1, v["text"])
        ops.append(Decode(_run(0, p, n_text)))
        p, total = p + n_text, total + n_text
        if i == v["images"]:
            break
        w = rng.randint(1, v["patches"])
        h = rng.randint(1, v["patches"] // w)
        ops.append(Decode(tuple(Token(p, (0,), ext=(x, y)) for y in range(h)
                                for x in range(w))))
        total += w * h
        p += max(w, h)
    cache = CacheConfig(kv_size=total + v["kpool"], kpool=v["kpool"], by_order=True)
    return _trace("mrope-image", seed, MROPE_IMAGE_SIZES, v, cache, ops, _mrope_image_what(v))


def _mrope_image_what(v: dict[str, int]) -> str:
    return (f"An M-RoPE model pools by order: {counted(v['images'], 'image', number=str)} "
            f"of at most {v['patches']} tokens, each grid's tokens at one pos with ext "
            "[x, y], between text runs. A token's pool is its rank among the sequence's "
            "cells, not its pos; nothing is shared.")


def _mrope_image_estimate(seed: int, v: dict[str, int]) -> Estimate:
    """images + 1 text runs of at most text tokens, and images grids of w x h <=
    patches tokens (h <= patches // w), each moving the position on by max(w, h) <=
    patches."""
    images, patches, text, kp = v["images"], v["patches"], v["text"], v["kpool"]
    tokens = (images + 1) * text + images * patches
    last = tokens - 1  # the largest position, at most
    cache = CacheConfig(kv_size=tokens + kp, kpool=kp, by_order=True)  # the largest
    per_image, per_token = _listed(Token(last, (0,), ext=(patches - 1, patches - 1)))
    written = (_head("mrope-image", seed, MROPE_IMAGE_SIZES, v, cache, _mrope_image_what(v))
               + (images + 1) * _weight(Decode(_run(0, last, 2)))
               + images * per_image + images * patches * per_token)
    return Estimate(ops=2 * images + 1, tokens=tokens, written=written, max_pos=last,
                    kv_size=cache.kv_size)


# -- the registry ---------------------------------------------------------------------

# what each of random_trace's sizes means, for `kpool gen random --help`
_RANDOM_HELP = {"max_ops": "the most ops a trace has (1 to max_ops, a decode first)"}


def _random_sizes() -> tuple[Size, ...]:
    """The `random` scenario's sizes: the keyword-only int parameters of
    `gen.random_trace.random_trace`, with its defaults (bounds 1..2**16: the
    generator refuses what it cannot use with a ValueError)."""
    import inspect

    try:
        from kpool_cli.gen.random_trace import random_trace
    except ImportError:
        return ()
    out = []
    for p in inspect.signature(random_trace).parameters.values():
        if p.kind is p.KEYWORD_ONLY and type(p.default) is int:
            out.append(Size(p.name, p.default, 1, 2**16,
                            _RANDOM_HELP.get(p.name, f"random_trace's {p.name}")))
    return tuple(out)


def _random(seed: int, **sizes: int) -> Trace:
    """`gen.random_trace.random_trace`, imported when first used."""
    from kpool_cli.gen.random_trace import random_trace

    sizes = _loadable(_random_sizes(), _random_estimate, seed, sizes)
    trace = random_trace(seed, **sizes)
    return replace(trace, name="gen-random", description=_random_description(seed, sizes))


def _random_description(seed: int, sizes: dict[str, int]) -> str:
    what = ("A random valid mix of every op (decodes, coupled or not, sequence edits, "
            "state saves and restores, clears) on a small cache, unified or not; a few "
            "decodes are off position on purpose, so the batch validator is exercised.")
    return f"{what}\n{_how('random', seed, _random_sizes(), sizes)}\n"


# What one op of random_trace holds at most (gen/random_trace.py, its code): a decode
# lists at most 4 sequences (n_seq_max <= 4) of at most 6 tokens (_random_tokens), a
# pair of sequences sharing fewer; a decode starts at most 2 past its sequence's end;
# one refused for its size (a span, never built) has at most kv_size + 8 <= 72 tokens.
_RANDOM_LISTED = 4 * 6
_RANDOM_STEP = 6 + 2  # how far a decode moves a sequence's last position on, at most
_RANDOM_PAST = 64 + 8


def _random_estimate(seed: int, v: dict[str, int]) -> Estimate:
    """At most max_ops ops, each at most the widest: a decode of `_RANDOM_LISTED`
    tokens, each weighed with the format's largest numbers (positions below POS_LIMIT,
    two seq ids, an ext), the head with the format's largest cache."""
    m = v["max_ops"]
    top = trace_format.POS_LIMIT - 1
    widest = _weight(Decode((Token(top, (N_SEQ_MAX_MAX - 1, N_SEQ_MAX_MAX - 2),
                                   ext=(top, top)),) * _RANDOM_LISTED))
    cache = CacheConfig(kv_size=KV_SIZE_MAX, kpool=KV_SIZE_MAX, n_seq_max=N_SEQ_MAX_MAX,
                        unified=False, by_order=False, n_ubatch=N_UBATCH_MAX,
                        n_embd=N_EMBD_MAX, n_rs_seq=N_RS_SEQ_MAX)
    head = head_written(Trace(cache=cache, ops=(), name="gen-random", seed=seed,
                              description=_random_description(seed, v)))
    return Estimate(ops=m, tokens=m * max(_RANDOM_LISTED, _RANDOM_PAST),
                    written=head + m * widest, max_pos=m * _RANDOM_STEP + _RANDOM_PAST,
                    kv_size=64)


SCENARIOS: dict[str, Scenario] = {
    s.name: s for s in (
        Scenario("server", server, SERVER_SIZES,
                 "slots sharing a system prompt (seq_cp or coupled), prompts, decode "
                 "steps, slots reused", _server_estimate),
        Scenario("speculative", speculative, SPECULATIVE_SIZES,
                 "drafts of D tokens, a random accepted prefix, the rejected tail removed",
                 _speculative_estimate),
        Scenario("context-shift", context_shift, CONTEXT_SHIFT_SIZES,
                 "a slot that fills its context and shifts it (seq_rm + seq_add)",
                 _context_shift_estimate),
        Scenario("save-restore", save_restore, SAVE_RESTORE_SIZES,
                 "slots saved, restored into slots, dropped (state_write/read/drop)",
                 _save_restore_estimate),
        Scenario("mrope-image", mrope_image, MROPE_IMAGE_SIZES,
                 "an M-RoPE (by-order) prompt of text and image grids (ext positions)",
                 _mrope_image_estimate),
        Scenario("random", _random, _random_sizes(),
                 "any valid mix of every op, unified and not (gen.random_trace)",
                 _random_estimate),
    )
}
