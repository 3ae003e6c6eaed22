"""The memory a replay can need, known before it starts.

Owns: `memory_bound` / `replay_bytes_bound` (the sum), `check_replay_memory` (raises
`ReplayTooLarge`, whose message names the config fields that drive the need),
`default_max_memory` (a safe share of this machine's memory, for `--max-memory`)
and `parse_memory` (what `--max-memory` accepts).

Each part's estimate lives next to the code that allocates it:
- the cache model: `KvCache.bytes_bound` (cache/kv.py: streams, snapshots, one op's
  temporaries), `Stream.bytes_bound` / `Stream.op_bytes_bound` (cache/cells.py);
- what the trace can make it hold: `Reach.of(trace)` (cache/kv.py);
- the value backend: `ValueBackend.bytes_bound` (backend/store.py: the sum of its
  parts' `bytes_bound`s, in slots.py, writers.py and verify.py);
- the engine's layout and per-ubatch plan: `engine_bytes_bound` below, for now
  (its home is engine/layout.py and engine/scatter.py);
- the interpreter, numpy and numba/LLVM themselves: `RUNTIME_BYTES`, measured.

Not counted: the loaded trace (in memory before the bound is asked for), the
report writers (they stream; `--html`/`--svg` record the whole rich view, which
grows with the output, not with the cache).

Every estimate is an upper bound for a trace's worst case (every decode applied,
every copy made, every sequence holding every cell), so a real replay usually
needs much less; the point is that no trace gets past the check and then needs
more.
"""

from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass

from ..cache.kv import KvCache, Reach
from ..compiled.arena import Arena
from ..engine.marking import entries_bound
from ..trace.model import CacheConfig, Trace
from .store import BACKENDS, ValueBackend

# peak RSS of a replay of a tiny trace, rounded up with headroom (measured: none and
# numpy 42 MB, numba 150 MB with its cache warm and 181 MB compiling every kernel)
RUNTIME_BYTES = {"none": 64 << 20, "numpy": 64 << 20, "numba": 256 << 20}

# the engine's share (home: engine/layout.py and compiled/arena.py, engine/scatter.py,
# replay.py)
ENTRY_BYTES = 4 * 8  # a scatter entry's rep, pool, visible, race order (int64 each)
# a listed pool's columns in a record, and its JSON while written (by the listing
# kernels, or without them a piece at a time: report/json_report.py `_pieces_text`)
POOL_INFO_BYTES = 256
TOKEN_BYTES = 512  # a decode token's Python objects in the replay (seqs, split, records)
CELL_MAP_ROW_BYTES = 8  # a record's cell map (rich view): codes, masks, per global row


def engine_bytes_bound(config: CacheConfig, reach: Reach, *, cell_map: bool = False) -> int:
    """The layout (every sequence's copy of its pairs and its pools) and one ubatch's
    marking, scatter plan and record (its listed pools: at most every pool, so
    `--pools all` needs no more). A sequence holds at most `reach.cells` cells, so a kpool-th
    of them pools; a ubatch has at most `entries_bound` entries, each kpool rows wide.
    `cell_map`: the records carry the cache's cells (the rich view)."""
    n_seq, kpool, c = config.n_seq_max, config.kpool, reach.cells
    pools = n_seq * (c // kpool)
    entries = entries_bound(c, config.kv_size, kpool, n_seq)
    # every sequence's copy of its (pos, cell) pairs and its four pool columns, as the
    # compiled core holds them (compiled/arena.py; the reference core's GrowArrays,
    # twice the values and one sequence's growth, hold less), and pool_cells
    layout = (Arena.bytes_bound(n_seq, c) + 4 * Arena.bytes_bound(n_seq, c // kpool + 1)
              + 8 * pools)
    plan = entries * (ENTRY_BYTES + 3 * 8 * kpool)  # members_of, plan rows, the copies
    record = entries * POOL_INFO_BYTES
    tokens = reach.decode_tokens * TOKEN_BYTES
    cells = CELL_MAP_ROW_BYTES * config.n_rows if cell_map else 0
    # the compiled core's marking scratch (compiled/layout.py `scratch`): a byte per
    # global row or pool, twice over while it grows
    scratch = 2 * max(config.n_rows, pools)
    # its padding rows and its last plan of padding alone (compiled/marking.py
    # `Padding`, engine/scatter.py `padding_entries`), kept: a row, a pool, kpool members
    # and a rep per entry at most
    padding = entries * 8 * (kpool + 3)
    return layout + plan + record + tokens + cells + scratch + padding


@dataclass(frozen=True, slots=True)
class MemoryBound:
    """What a replay can need: the total and its parts (bytes), and what drives them."""

    total: int
    parts: dict[str, int]  # runtime, cache, engine, values
    reach: Reach
    backend: str
    cell_map: bool = False


def memory_bound(trace: Trace, backend: str, *, cell_map: bool = False) -> MemoryBound:
    """The upper bound of the bytes replaying `trace` with `backend` can need, by part.
    `cell_map` as the replay takes it (True for the rich view: costs O(n_rows) a
    ubatch)."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}: choose one of {', '.join(BACKENDS)}")
    reach = Reach.of(trace)
    parts = _parts(trace.cache, reach, backend, cell_map)
    return MemoryBound(sum(parts.values()), parts, reach, backend, cell_map)


def _parts(cfg: CacheConfig, reach: Reach, backend: str, cell_map: bool) -> dict[str, int]:
    return {
        "runtime": RUNTIME_BYTES[backend],
        "cache": KvCache.bytes_bound(cfg, reach),
        "engine": engine_bytes_bound(cfg, reach, cell_map=cell_map),
        "values": 0 if backend == "none" else ValueBackend.bytes_bound(cfg, reach, backend),
    }


class ReplayTooLarge(Exception):
    """A trace whose replay can need more memory than the budget. `fields` are the
    trace's fields that drive the need, largest part first."""

    def __init__(self, message: str, bound: MemoryBound, budget: int,
                 fields: tuple[str, ...]) -> None:
        super().__init__(message, bound, budget, fields)  # every argument: it pickles
        self.bound, self.budget, self.fields = bound, budget, fields

    def __str__(self) -> str:
        return str(self.args[0])


def format_bytes(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def _explain(trace: Trace, b: MemoryBound) -> tuple[list[str], tuple[str, ...]]:
    """One phrase per part, largest first, and the fields that drive the parts.
    cache.kpool drives a part when its kpool-wide arrays are most of it: the part
    with a kpool of 1 is less than half as large."""
    cfg, r = trace.cache, b.reach
    narrow = _parts(dataclasses.replace(cfg, kpool=1), r, b.backend, b.cell_map)
    kpool = {part: ("cache.kpool",) if 2 * narrow[part] < n else ()
             for part, n in b.parts.items()}
    streams = (f"cache.kv_size {cfg.kv_size} x n_stream {cfg.n_stream}"
               + ("" if cfg.unified else " (cache.n_seq_max, unified: false)"))
    written = (f"{r.tokens} decoded tokens, {r.restored} rows state_read can restore, "
               f"{r.copied} rows a cross-stream seq_cp can copy")
    what = {
        "cache": (f"the cache model for {streams} cells"
                  + (f" and cache.n_seq_max {cfg.n_seq_max} sequences" if cfg.unified
                     and cfg.n_seq_max > 1 else ""),
                  ("cache.kv_size", "cache.n_seq_max")),
        "values": (f"values for up to {r.value_rows} rows x cache.n_embd {cfg.n_embd} "
                   f"({written}, padding), with a slot map of every one of the "
                   f"{cfg.n_rows} rows ({streams})"
                   + (f", pooling cache.kpool {cfg.kpool} rows a pool" if kpool["values"] else ""),
                   kpool["values"] + ("cache.n_embd", "tokens", "cache.kv_size")),
        "engine": (f"the layout and plans of up to {cfg.n_seq_max} sequences x {r.cells} cells"
                   + (f", in scatter entries of cache.kpool {cfg.kpool} rows each"
                      if kpool["engine"] else ""),
                   kpool["engine"] + ("cache.n_seq_max", "tokens", "cache.kv_size")),
        "runtime": (f"Python, numpy{' and numba' if b.backend == 'numba' else ''}", ()),
    }
    phrases, fields = [], []
    for part, n in sorted(b.parts.items(), key=lambda kv: -kv[1]):
        if n == 0:
            continue
        text, drivers = what[part]
        phrases.append(f"{format_bytes(n)} {text}")
        fields += [f for f in drivers if f not in fields]
    return phrases, tuple(fields)


def _either(items: list[str]) -> str:
    """`a`, `a or b`, `a, b or c`."""
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} or {items[-1]}"


def check_replay_memory(trace: Trace, backend: str, max_bytes: int | None, *,
                        cell_map: bool = False) -> MemoryBound:
    """The bound of `memory_bound`; raises ReplayTooLarge when it is over `max_bytes`
    (None: no budget)."""
    b = memory_bound(trace, backend, cell_map=cell_map)
    if max_bytes is not None and b.total > max_bytes:
        phrases, fields = _explain(trace, b)
        where = trace.path if trace.path != "<built>" else (trace.name or "the trace")
        lower = [f for f in fields if f != "tokens"] or ["cache.kv_size"]
        message = (f"{where}: replaying it can need up to {format_bytes(b.total)}, over the "
                   f"memory budget of {format_bytes(max_bytes)} (--max-memory): "
                   + "; ".join(phrases)
                   + f". Lower {_either(lower)}, decode fewer tokens, "
                   + ("" if backend == "none" else
                      "use a smaller --backend (none needs no value rows), ")
                   + "or raise --max-memory.")
        raise ReplayTooLarge(message, b, max_bytes, fields)
    return b


# -- the budget ---------------------------------------------------------------------------


def _meminfo(key: str) -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                name, _, rest = line.partition(":")
                if name == key:
                    return int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            text = f.read().strip()
        return int(text)
    except (OSError, ValueError):  # missing, or "max"
        return None


CGROUP_ROOT = "/sys/fs/cgroup"


def _cgroup_headroom(proc_cgroup: str = "/proc/self/cgroup",
                     root: str = CGROUP_ROOT) -> int | None:
    """The memory this process's cgroup may still take: the least headroom (limit less
    usage) of its own memory cgroup and each one above it, whose limits bind it too
    (`/proc/self/cgroup` names it: systemd's MemoryMax=, a nested cgroup); v2
    (memory.max) or v1 (the memory controller's limit_in_bytes). None when no level
    sets a limit."""
    try:
        with open(proc_cgroup, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        lines = []
    levels: list[tuple[str, str]] = []  # (limit file, usage file), innermost first
    for line in lines:
        _, controllers, path = [*line.split(":", 2), "", ""][:3]
        if controllers == "":  # v2: the one hierarchy
            base, limit, usage = root, "memory.max", "memory.current"
        elif "memory" in controllers.split(","):
            base, limit, usage = f"{root}/memory", "memory.limit_in_bytes", \
                "memory.usage_in_bytes"
        else:
            continue
        parts = [p for p in path.split("/") if p and p not in (".", "..")]
        for n in range(len(parts), -1, -1):
            folder = "/".join([base, *parts[:n]])
            levels.append((f"{folder}/{limit}", f"{folder}/{usage}"))
    if not lines:  # no /proc: the root's files, as a container shows its own
        levels = [(f"{root}/memory.max", f"{root}/memory.current"),
                  (f"{root}/memory/memory.limit_in_bytes",
                   f"{root}/memory/memory.usage_in_bytes")]
    room = None
    for limit, usage in levels:
        lim = _read_int(limit)
        if lim is not None and lim < 1 << 60:  # v1 says "no limit" with a huge number
            # the usage counts page cache the kernel reclaims before it kills: its
            # inactive part is room (a parent slice's usage holds everyone's cache)
            used = max(0, (_read_int(usage) or 0) - _inactive_file(usage))
            here = max(0, lim - used)
            room = here if room is None else min(room, here)
    return room


def _inactive_file(usage: str) -> int:
    """The inactive file cache of the cgroup whose usage file is `usage`, from its
    memory.stat (v2 `inactive_file`, v1 `total_inactive_file`); 0 when unknown."""
    stat: dict[str, str] = {}
    try:
        with open(os.path.join(os.path.dirname(usage), "memory.stat"),
                  encoding="ascii", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(" ")
                stat[key] = value
        # v1's usage is hierarchical, as its total_ counts are: those first
        return int(stat.get("total_inactive_file") or stat.get("inactive_file") or 0)
    except (OSError, ValueError):
        return 0


def _physical() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def _address_space_headroom() -> int | None:
    """What `ulimit -v` (RLIMIT_AS) still lets this process map, None when unlimited."""
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
        if soft == resource.RLIM_INFINITY:
            return None
        with open("/proc/self/statm") as f:
            mapped = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        return max(0, soft - mapped)
    except (ImportError, OSError, ValueError, IndexError):
        return None


def default_max_memory(shares: int = 1) -> int | None:
    """Half of the memory available now (MemAvailable, capped by the cgroup's
    headroom and by what `ulimit -v` still allows), else half of physical memory,
    shared by `shares` processes running at once (`--jobs`); None when none is
    known."""
    known = [n for n in (_meminfo("MemAvailable") or _physical(), _cgroup_headroom(),
                         _address_space_headroom()) if n is not None]
    return min(known) // 2 // max(1, shares) if known else None


_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1000, "kib": 1 << 10, "m": 1 << 20, "mb": 1000**2,
          "mib": 1 << 20, "g": 1 << 30, "gb": 1000**3, "gib": 1 << 30, "t": 1 << 40,
          "tb": 1000**4, "tib": 1 << 40}


_SIZE = re.compile(r"([0-9]{1,15}(?:\.[0-9]{1,6})?) ?([a-z]{0,3})", re.ASCII)
MEMORY_MAX = 1 << 60  # 1 EiB: a budget above any machine's memory


def parse_memory(text: str) -> int | None:
    """`--max-memory`: a size ("512M", "8G", "8GiB", "2.5GB", bytes), or "none" / "0"
    for no budget; plain ASCII decimal (no exponent, sign, `_` or other digits), at
    most 1 EiB. Raises ValueError, quoting at most 40 characters, for anything else."""
    t = text.strip().lower()
    if t in ("none", "0", "off", "unlimited"):
        return None
    shown = repr(text if len(text) <= 40 else text[:40] + "...")
    m = _SIZE.fullmatch(t)
    if m is None or m.group(2) not in _UNITS or not float(m.group(1)) > 0:
        raise ValueError(f"not a memory size: {shown} (e.g. 512M, 8G, 8GiB, or none)")
    value = float(m.group(1)) * _UNITS[m.group(2)]
    if value > MEMORY_MAX:
        raise ValueError(f"{shown} is more than the largest budget, 1 EiB "
                         "(give none for no budget)")
    return int(value)
