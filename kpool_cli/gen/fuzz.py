"""The fuzzer: one random trace under one engine, its invariants, and shrinking.

Owns: `FuzzTask`, `FuzzOutcome`, `fuzz_one` (one run), `shrink`, `campaign` (many
runs, deduplicated) and the defect codes `INV_*`. A task's engine `all` replays the
trace under every shipped version and notes which show each finding.

Invariants:
- `fuzz_one` is a pure function of its task (plain, picklable data): the trace is
  `random_trace(task.seed)`, the replay is deterministic and so is the shrinking, so
  a run gives the same outcome here, in a process pool or on a cluster, and any
  finding is reproducible from its seed;
- every run's seed is one `kpool fuzz --seed` and `kpool gen random --seed` take
  (0 to `SEED_MAX`, the bound of a trace's `seed`, trace/format.py: `run_seed` wraps
  past it), so the command a shrunk trace's description gives is accepted, and run
  r's trace is the one `kpool gen random --seed` writes for its seed;
- engine findings (KP codes the replay reports) and kpool defects (`INV_*`: an
  invariant of kpool's own model broken, or an exception escaping the replay) are
  kept apart: findings are what fuzzing looks for, defects are kpool's bugs; every
  run replays on both cores (replay.CORES), and a record where the compiled core
  differs from the reference core is a defect (`INV_CORE`); the recurrent child's
  `check_invariants` runs after every op (its failure escapes: `INV_CRASH`);
- KP006 (a decode the validator refuses) is not a finding here: the generator
  produces a few on purpose, and they say nothing about the engine;
- a finding's signature is `CODE/op-kind/path`: the kind of op that raised it (a
  decode is `decode` for one sequence per token, `decode-coupled` when a token
  carries several seq ids) and the engine path it took (`shared` when the layout
  saw shared cells, else `own`); campaigns deduplicate by (code, signature);
- the shrunk trace still loads and still shows the same code with the same
  signature (a defect: the same code and signature); it is never larger than the
  original.

The default backend is `none` (the model only: about 4 ms a trace), so KP003, which
needs values, is not seen; `--backend numba` (or numpy) adds it at a higher cost.
"""

from __future__ import annotations

import dataclasses
import os
import stat
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import zip_longest
from pathlib import Path
from typing import overload

import numpy as np

from ..backend.store import make_backend
from ..contracts.files import OutputError, written_whole
from ..contracts.records import ExpectResult, UbatchRecord, first_difference
from ..diff.compare import compare
from ..diff.summary import from_records
from ..engine.context import UbatchContext
from ..replay import Replayer
from ..signals import held
from ..trace import model as m
from ..trace.format import SEED_MAX
from ..trace.load import TraceError, load_trace_text
from ..trace.write import dump_trace
from ..verdict.codes import CODES
from ..verdict.expect import with_expectations
from ..verdict.rules import kp006_decode_rejected, kp007_layout_drift
from ..versions import ALL, VERSIONS, by_design, load_version
from ..wording import visible
from .random_trace import random_trace

INV_DRIFT = "INV-drift"  # a layout differs from a rebuild and no KP007 says so
INV_EMPTY = "INV-empty-cell"  # a scatter entry names an empty cell
INV_POOL = "INV-pool"  # a pool is not well formed
INV_CRASH = "INV-exception"  # an exception escaped the replay
INV_CORE = "INV-core"  # the compiled core's records differ from the reference core's
NOT_FINDINGS = frozenset({kp006_decode_rejected.CODE.code})

def run_seed(seed: int, r: int) -> int:
    """Run r's seed: `seed + r`, wrapped to 0 past SEED_MAX, so that it is a seed
    `--seed` takes (`found_by` gives it as the command that runs it again), and `kpool
    gen random --seed` too."""
    return (seed + r) % (SEED_MAX + 1)


@dataclass(frozen=True, slots=True)
class FuzzTask:
    seed: int
    engine: str = "rep-once"  # a registered name or module:Name
    backend: str = "none"
    shrink: bool = True
    max_ops: int = 12
    base: str | None = None  # compare with this engine: a behaviour difference is found


@dataclass(frozen=True, slots=True)
class Shrunk:
    code: str
    signature: str
    yaml: str
    n_ops: int  # ops of the shrunk trace, its `expect` not counted


@dataclass(frozen=True, slots=True)
class FuzzOutcome:
    seed: int
    n_ops: int
    findings: tuple[tuple[str, str], ...]  # (code, signature), sorted
    defects: tuple[tuple[str, str, str], ...]  # (code, signature, message)
    shrunk: tuple[Shrunk, ...] = ()
    rejected: bool = False  # some decode was refused (KP006)
    # `--engine all`: per (code, signature), the versions that show it
    versions: tuple[tuple[tuple[str, str], tuple[str, ...]], ...] = ()


# -- one replay with the invariants ---------------------------------------------------


class _Invariants:
    """kpool's invariants, checked on every ubatch of a replay (its observer)."""

    def __init__(self, version_name: str, cfg: m.CacheConfig) -> None:
        self.version_name, self.cfg = version_name, cfg
        self.defects: list[tuple[str, str, str]] = []
        self._differing: set[int] = set()

    def _defect(self, code: str, message: str) -> None:
        self.defects.append((code, f"{code}/{self.version_name}", message))

    def __call__(self, rec: UbatchRecord, ctx: UbatchContext) -> None:
        cache, layout, cfg = ctx.cache, ctx.layout, self.cfg
        drifted = {s for s in range(cfg.n_seq_max) if layout.drift(cache, s) is not None}
        kp7 = {s for f in rec.findings if f.code == kp007_layout_drift.CODE.code for s in f.seqs}
        for s in sorted(drifted - self._differing - kp7):
            self._defect(INV_DRIFT, f"ubatch {rec.index}: seq {s}'s layout differs from a "
                                    "rebuild and no KP007 was reported")
        self._differing = drifted
        if drifted or rec.aborted:
            return
        real = np.flatnonzero(~rec.scatter_pad)
        for e in real.tolist():
            rows = np.array([int(rec.scatter_rep[e]), *rec.scatter_rows[e].tolist()])
            for row in rows[cache.row_pos(rows) < 0].tolist():
                self._defect(INV_EMPTY, f"ubatch {rec.index}: scatter entry {e} names "
                                        f"row {row}, an empty cell")
        for s, sq in enumerate(layout.seqs):
            starts = sq.pools.view
            if np.any(np.diff(starts) < cfg.kpool):
                self._defect(INV_POOL, f"ubatch {rec.index}: seq {s}'s pools overlap")
            if not starts.size:
                continue
            members = sq.members(np.arange(starts.size), cfg.kpool, cfg.kv_size)
            if not cache.holds(s, members.ravel()).all():
                self._defect(INV_POOL, f"ubatch {rec.index}: a pool of seq {s} holds a "
                                       "cell not in the sequence")
            p = cache.row_pos(members.ravel()).reshape(members.shape)
            if not cfg.by_order and np.any(np.diff(p, axis=1) != 1):
                self._defect(INV_POOL, f"ubatch {rec.index}: a pool of seq {s} has "
                                       "non-consecutive positions")


def _op_kind(op: m.Op) -> str:
    if isinstance(op, m.Decode):
        seq_sets = [op.span.seq] if op.span else [t.seq for t in op.tokens]
        return "decode-coupled" if any(len(ss) > 1 for ss in seq_sets) else "decode"
    return op.kind


def run_checked(trace: m.Trace, engine: str, backend: str = "none", *,
                both_cores: bool = True
                ) -> tuple[dict[tuple[str, str], int], list[tuple[str, str, str]], bool]:
    """Replay `trace` on the compiled core with kpool's invariants, and (with
    `both_cores`) on the reference core: ({(code, signature): first op index},
    defects, rejected). A record where the two cores differ is a defect (INV_CORE).
    Shrinking a finding needs only the first: whether the finding stays."""
    version = load_version(engine)
    found: dict[tuple[str, str], int] = {}
    rejected = False
    inv = _Invariants(version.name, trace.cache)
    # spans: the records carry each core's run form too, and so compare it
    rp = Replayer(trace, version, make_backend(backend, trace), observer=inv,
                  spans=both_cores, core="compiled")
    reference = (Replayer(trace, version, make_backend(backend, trace), spans=True,
                          core="reference").run() if both_cores else iter(()))
    try:
        for rec, ref in zip_longest(rp.run(), reference):
            # the recurrent child's derived state, after every op (an AssertionError
            # escapes as INV_CRASH)
            rp.recurrent.check_invariants()
            where = first_difference(rec, ref) if both_cores else None
            if where is not None:
                op = rec.op if rec is not None else ref.op
                inv.defects.append((INV_CORE, f"{INV_CORE}/{version.name}",
                                    f"op {op}: the compiled core's {where} differs from "
                                    "the reference core's"))
                break
            path = "shared" if rp.layout_shared else "own"
            for f in rec.findings:
                if f.code in NOT_FINDINGS:
                    rejected = True
                    continue
                key = (f.code, f"{f.code}/{_op_kind(trace.ops[rec.op])}/{path}")
                found.setdefault(key, rec.op)
    except Exception as e:  # any escape is a kpool defect, named by its type
        inv.defects.append((INV_CRASH, f"{INV_CRASH}/{type(e).__name__}",
                            f"{type(e).__name__}: {e}"))
    return found, inv.defects, rejected


# -- shrinking ------------------------------------------------------------------------


def _loads(t: m.Trace) -> m.Trace | None:
    try:
        return load_trace_text(dump_trace(t))
    except (TraceError, ValueError):
        return None


def _candidates(t: m.Trace) -> Iterator[m.Trace]:
    """Smaller variants of `t`, in order: without one op, a decode without one token,
    ranges shortened, then a smaller kv_size, n_seq_max, kpool."""
    ops = t.ops
    for i in reversed(range(len(ops))):
        if len(ops) > 1:
            yield dataclasses.replace(t, ops=ops[:i] + ops[i + 1:])
    for i, op in enumerate(ops):
        if isinstance(op, m.Decode) and len(op.tokens) > 1:
            for j in reversed(range(len(op.tokens))):
                d = m.Decode(tokens=op.tokens[:j] + op.tokens[j + 1:])
                yield dataclasses.replace(t, ops=(*ops[:i], d, *ops[i + 1:]))
        if isinstance(op, (m.SeqRm, m.SeqCp, m.SeqAdd, m.SeqDiv)):
            variants = []
            if op.p0 > 0:
                variants += [dataclasses.replace(op, p0=-1), dataclasses.replace(op, p0=op.p0 - 1)]
            if op.p1 >= 0:
                variants += [dataclasses.replace(op, p1=-1), dataclasses.replace(op, p1=op.p1 - 1)]
            for v in variants:
                yield dataclasses.replace(t, ops=(*ops[:i], v, *ops[i + 1:]))
    c = t.cache
    for kv in (8, c.kv_size // 2, c.kv_size - 1):
        if c.kpool <= kv < c.kv_size:
            yield dataclasses.replace(t, cache=dataclasses.replace(c, kv_size=kv))
    for n in range(1, c.n_seq_max):
        yield dataclasses.replace(t, cache=dataclasses.replace(c, n_seq_max=n))
    if c.n_rs_seq:
        yield dataclasses.replace(t, cache=dataclasses.replace(c, n_rs_seq=0))
    if c.n_ubatch != 512:
        yield dataclasses.replace(t, cache=dataclasses.replace(c, n_ubatch=512))


def _size(t: m.Trace) -> tuple[int, int, int, int]:
    n_tok = sum(op.n_tokens for op in t.ops if isinstance(op, m.Decode))
    return (len(t.ops), n_tok, t.cache.kv_size, t.cache.n_seq_max)


def shrink(t: m.Trace, keeps: Callable[[m.Trace], bool]) -> m.Trace:
    """Greedy delta debugging: take the first candidate that loads, is smaller and
    still `keeps` the finding; repeat until none does. Deterministic."""
    changed = True
    while changed:
        changed = False
        for cand in _candidates(t):
            loaded = _loads(cand)
            if loaded is not None and _size(loaded) <= _size(t) and cand != t and keeps(loaded):
                t, changed = loaded, True
                break
    return t


def found_by(task: FuzzTask) -> str:
    """The command that runs `task` again, as a shrunk trace's description gives it; a
    plug-in's name is the plug-in's text, shown escaped (a lone surrogate is no
    character a trace file can hold)."""
    base = "" if task.base is None else f" --base {visible(task.base)}"
    return (f"`kpool fuzz --engine {visible(task.engine)}{base} --seed {task.seed} "
            f"--runs 1 --backend {task.backend}`")


def _pinned(t: m.Trace, code: str, signature: str, engine: str, backend: str, seed: int,
            n_from: int) -> str:
    """`t` as YAML with an `expect` after each op that raises findings (the exact codes
    of that op: `code` among them, and any other, so `kpool check` passes on it) and a
    description of what it shows. The findings are a value backend's, the model-only
    fuzz's too (`PIN_BACKEND`): `kpool check` runs one, and sees KP003 where the model
    cannot; a model-only replay does not hold an expect to a value-only code."""
    version = load_version(engine)
    by_op: dict[int, set[str]] = {}
    pin = backend if backend != "none" else PIN_BACKEND
    for rec in Replayer(t, version, make_backend(pin, t)).run():
        by_op.setdefault(rec.op, set()).update(f.code for f in rec.findings)
    ops = list(t.ops)
    # a trace names registered versions only: a plug-in's trace pins its findings for
    # whatever engine it is replayed under (the description names the plug-in)
    named = version.name if version.name in VERSIONS else None
    for op in sorted((op for op, codes in by_op.items() if codes), reverse=True):
        ops.insert(op + 1, m.Expect(engine=named, findings=tuple(sorted(by_op[op]))))
    info = CODES.get(code)
    what = f"{code} {info.name}: {info.summary}" if info else code
    desc = (f"Found by {found_by(FuzzTask(seed, engine, backend))} and shrunk from "
            f"{n_from} ops to {len(t.ops)}: under {visible(version.name)}, {what} "
            f"(signature {signature}).")
    out = dataclasses.replace(t, ops=tuple(ops), name=f"fuzz-{signature.replace('/', '-')}",
                              description=desc, engine=named)
    text = dump_trace(out)
    # the pin must hold: replay the written text with its expectations, under the
    # fuzz's backend and the pin's
    loaded = load_trace_text(text)
    for b in dict.fromkeys((backend, pin)):
        for r in with_expectations(loaded, version.name, b != "none",
                                   Replayer(loaded, version, make_backend(b, loaded)).run()):
            if isinstance(r, ExpectResult) and not r.ok:
                raise AssertionError(f"the shrunk trace's expect does not hold under "
                                     f"backend {b}: {r.message}")
    return text


DIVERGED = "diff"  # the "code" of a behaviour difference from the base engine
# the value backend whose findings a model-only fuzz's shrunk trace pins: the numpy
# kernels (numba's twins, the same findings), which a worker loads in no time
PIN_BACKEND = "numpy"


def diverges(t: m.Trace, base: str, head: str, backend: str = "none") -> bool:
    """Whether `kpool diff --base BASE --head HEAD` finds a behaviour difference on `t`
    (layouts through marking and scatter, findings, events; cost counters aside)."""
    runs = []
    for engine in (base, head):
        version = load_version(engine)
        runs.append(from_records(Replayer(t, version, make_backend(backend, t)).run(),
                                 path=t.path, name=t.name, sha256=t.sha256,
                                 engine=version.name,
                                 backend=None if backend == "none" else backend,
                                 config=t.cache.as_dict()))
    try:
        return compare(runs[0], runs[1], by_design(base, head)).changed
    except Exception:  # a comparison that fails is a difference too
        return True


def _shows_finding(code: str, sig: str, task: FuzzTask) -> Callable[[m.Trace], bool]:
    return lambda t: (code, sig) in run_checked(t, task.engine, task.backend,
                                                 both_cores=False)[0]


def _shows_defect(sig: str, task: FuzzTask) -> Callable[[m.Trace], bool]:
    return lambda t: any(d[1] == sig for d in run_checked(t, task.engine, task.backend)[1])


def _under_every_version(t: m.Trace, backend: str
                         ) -> tuple[dict[tuple[str, str], int], list[tuple[str, str, str]],
                                    bool, dict[tuple[str, str], tuple[str, ...]]]:
    """`run_checked` under every shipped version (`--engine all`): the findings of
    any, each with the versions that show it, in the registry's order."""
    found: dict[tuple[str, str], int] = {}
    defects: list[tuple[str, str, str]] = []
    rejected = False
    shown: dict[tuple[str, str], list[str]] = {}
    for engine in VERSIONS:
        f, d, r = run_checked(t, engine, backend)
        for key, op in f.items():
            found[key] = min(op, found.get(key, op))
            shown.setdefault(key, []).append(engine)
        defects += d
        rejected |= r
    return found, defects, rejected, {k: tuple(v) for k, v in shown.items()}


def fuzz_one(task: FuzzTask) -> FuzzOutcome:
    """One fuzz run: replay random_trace(task.seed) under the task's engine with the
    invariants (`all`: under every shipped version, noting which show each finding);
    with `task.shrink`, shrink each finding (keeping its code and signature, under the
    first version that shows it) and each defect (once per code, keeping its
    signature)."""
    t = random_trace(task.seed, max_ops=task.max_ops)
    shown: dict[tuple[str, str], tuple[str, ...]] = {}
    if task.engine == ALL:
        found, defects, rejected, shown = _under_every_version(t, task.backend)
    else:
        found, defects, rejected = run_checked(t, task.engine, task.backend)
    shrunk: list[Shrunk] = []
    if task.base is not None:
        sig = f"{DIVERGED}/{task.base}"
        if diverges(t, task.base, task.engine, task.backend):
            found[(DIVERGED, sig)] = 0
            if task.shrink:
                small = shrink(t, lambda c: diverges(c, task.base or "", task.engine,
                                                     task.backend))
                base, head = visible(task.base or ""), visible(task.engine)
                # named by the versions' names, as every output names a version; the
                # command to run again by their specs
                names = "-".join(visible(load_version(e).name)
                                 for e in (task.base or "", task.engine))
                shrunk.append(Shrunk(DIVERGED, sig, dump_trace(dataclasses.replace(
                    small, name=f"diverged-{names}",
                    description=f"Found by {found_by(task)} and shrunk from {len(t.ops)} "
                    f"ops to {len(small.ops)}: `kpool diff --base {base} --head {head}` "
                    "shows a behaviour difference.")), len(small.ops)))
        found = {k: v for k, v in found.items() if k[0] == DIVERGED}
    if task.shrink and task.base is None:
        done: set[str] = set()
        for code, sig in sorted(found):
            engine = shown[(code, sig)][0] if shown else task.engine
            under = dataclasses.replace(task, engine=engine)
            small = shrink(t, _shows_finding(code, sig, under))
            shrunk.append(Shrunk(code, sig, _pinned(small, code, sig, engine,
                                                    task.backend, task.seed, len(t.ops)),
                                 len(small.ops)))
        for code, sig, _msg in defects:
            if code in done:
                continue
            done.add(code)
            small = shrink(t, _shows_defect(sig, task))
            shrunk.append(Shrunk(code, sig, dump_trace(dataclasses.replace(
                small, name=f"defect-{code}", description=f"kpool defect {sig}, found by "
                f"{found_by(task)}")), len(small.ops)))
    return FuzzOutcome(task.seed, len(t.ops), tuple(sorted(found)), tuple(defects),
                       tuple(shrunk), rejected, tuple(sorted(shown.items())))


# -- campaigns -----------------------------------------------------------------------


@dataclass(slots=True)
class Progress:
    """A campaign's running totals, as each outcome arrives (in seed order)."""

    runs: int = 0
    rejected: int = 0
    counts: dict[tuple[str, str], int] = field(default_factory=dict)  # (code, sig) -> runs
    first: dict[tuple[str, str], FuzzOutcome] = field(default_factory=dict)
    defects: dict[tuple[str, str], tuple[int, str]] = field(default_factory=dict)
    new: tuple[tuple[str, str], ...] = ()  # the signatures this outcome showed first
    # `--engine all`: (code, sig) -> the versions that showed it in some run
    versions: dict[tuple[str, str], set[str]] = field(default_factory=dict)

    @property
    def shrinks(self) -> int:
        """The shrunk traces the campaign keeps: one per (code, signature) whose first
        run shrank it (that run's other shrunk traces are of signatures seen before)."""
        return sum(any(s.signature == sig for s in o.shrunk)
                   for (_, sig), o in self.first.items())


@dataclass(frozen=True, slots=True)
class FuzzTasks(Sequence[FuzzTask]):
    """The runs of a campaign, each made when it is asked for (ten million runs are
    not ten million objects before the first one runs): run r has seed
    `run_seed(seed, r)`."""

    engine: str
    runs: int
    seed: int
    backend: str = "none"
    base: str | None = None

    def __len__(self) -> int:
        return self.runs

    @overload
    def __getitem__(self, i: int) -> FuzzTask: ...

    @overload
    def __getitem__(self, i: slice) -> Sequence[FuzzTask]: ...

    def __getitem__(self, i: int | slice) -> FuzzTask | Sequence[FuzzTask]:
        if isinstance(i, slice):
            return [self[r] for r in range(*i.indices(self.runs))]
        r = i + self.runs if i < 0 else i
        if not 0 <= r < self.runs:
            raise IndexError(i)
        return FuzzTask(run_seed(self.seed, r), self.engine, self.backend, shrink=False,
                        base=self.base)


def tasks_for(engine: str, runs: int, seed: int, backend: str = "none",
              base: str | None = None) -> FuzzTasks:
    """Run r has seed `run_seed(seed, r)`; only runs are shrunk whose signature is new, so the
    first pass does not shrink (see `campaign`). With `base`, a run looks for
    behaviour differences from that engine only (`diverges`)."""
    return FuzzTasks(engine, runs, seed, backend, base)


def campaign(tasks: Sequence[FuzzTask],
             runner: Callable[[Callable[[FuzzTask], FuzzOutcome], Sequence[FuzzTask]],
                              Iterable[FuzzOutcome]],
             totals: Progress | None = None,
             keep: Callable[[Progress], object] | None = None
             ) -> Generator[Progress, None, None]:
    """Run `tasks` through `runner` (e.g. `lambda fn, us: workers.in_order(fn, us, 2)`),
    adding each outcome to `totals` (a new Progress unless given) and yielding them.
    The first (lowest seed) run of each new (code, signature) is run again with
    shrinking, here: only those are shrunk. A run is counted whole or not at all, and
    `keep(totals)` (e.g. `save_new_shrunk`'s write of the traces the run shrank) is
    part of its counting: a signal (Ctrl-C) that comes meanwhile is raised once both
    are done. So the totals (given, to be held when a signal comes before the first
    yield) are those of the runs done, each with what `keep` kept of it."""
    p = Progress() if totals is None else totals
    for i, o in enumerate(runner(fuzz_one, tasks)):  # the outcomes come in task order
        keys = list(o.findings) + [(c, s) for c, s, _ in o.defects]
        fresh = [k for k in keys if k not in p.first]
        if fresh:
            task = tasks[i]
            full = fuzz_one(dataclasses.replace(task, shrink=True)) if not task.shrink else o
        with held():
            p.runs += 1
            p.rejected += o.rejected
            for k in keys:
                p.counts[k] = p.counts.get(k, 0) + 1
            for k, engines in o.versions:
                p.versions.setdefault(k, set()).update(engines)
            for k in fresh:
                p.first[k] = full
            for c, s, msg in o.defects:
                p.defects.setdefault((c, s), (o.seed, msg))
            p.new = tuple(fresh)
            if keep is not None:
                keep(p)
        yield p


SHRUNK_FILES = "*.yaml"  # the names `save_new_shrunk` gives (contracts/files.py checks)


def save_new_shrunk(p: Progress, out_dir: Path, replaced: list[str] | None = None
                    ) -> dict[tuple[str, str], str]:
    """Write the shrunk trace of each signature `p` shows first into `out_dir` (made if
    missing), atomically, named by its signature; returns {(code, sig): path}. A link
    there is refused, not written through (`check_output_folder` said so before the
    runs; this holds against one made since). A file of that name holding anything
    else (an earlier campaign's trace: the name says no engine) is replaced, and its
    name added to `replaced`, for the summary to say."""
    saved: dict[tuple[str, str], str] = {}
    for key in p.new:
        sh = next((s for s in p.first[key].shrunk if s.signature == key[1]), None)
        if sh is None:
            continue
        out_dir.mkdir(parents=True, exist_ok=True)
        path = out_dir / (key[1].replace("/", "_") + ".yaml")
        if path.is_symlink():
            raise OutputError(f"-o {out_dir}: {path.name} in it is a symbolic link: kpool "
                              "writes its files there as regular files")
        if replaced is not None and _holds_other(path, sh.yaml.encode()):
            replaced.append(path.name)
        with written_whole(str(path)) as f:
            f.write(sh.yaml)
        saved[key] = str(path)
    return saved


def _holds_other(path: Path, data: bytes) -> bool:
    """Whether `path` exists and holds other than `data` (read only when it is a
    regular file of that very size)."""
    try:
        st = os.lstat(path)
        if not stat.S_ISREG(st.st_mode) or st.st_size != len(data):
            return True
        with open(path, "rb") as f:
            return f.read(len(data) + 1) != data
    except FileNotFoundError:
        return False
    except OSError:
        return True

