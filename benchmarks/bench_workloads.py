"""Benchmark of four server-shaped workloads against issue 23's targets, under both cores.

Each workload is generated here (never stored in the repo): built in memory with
`kpool_cli.trace.model`, written as YAML with the project's writer
(`kpool_cli.trace.write.dump_trace`) to a temporary directory (or `--keep DIR`).
Each trace is then replayed the way a user does, one subprocess per run:

    kpool replay TRACE --engine E --core C --format json -o REPORT -q                # full
    kpool replay TRACE --engine E --core C --format json -o REPORT -q --backend none # model only

for every engine (rep-once, cache-safe) and core (compiled, reference: today's Python
engine), default backend (numba) for the full replay. The installed kpool is asked once
(`kpool replay --help`) whether it takes `--core`; when it does not, only the reference
runs, with no option, and the output says so. The parent measures each child's wall time
(spawn to exit: interpreter start, trace load, replay, report) and its peak RSS (ru_maxrss
from os.wait4), and reads the report's size and `summary` (ubatches, tokens, status;
exit 1, findings, is a completed run, its status shown in the notes). The reports of the
two cores are compared byte for byte (the report is deterministic: they must be equal).
Before the runs, each workload built at a small scale (its shape kept) is replayed once
per engine and core: numba's on-disk cache then holds the kernels it calls, so no run
pays for JIT compilation. Figures come from one run each (`--repeat N`: a child's
median wall over N runs in turn, for a machine whose speed moves); there is no assertion.

    workload                                                    target
    W1  kv 131072, kpool 4, n_ubatch 512, 1 seq: a 65536-token  200k tokens/s;
        prefill (one decode op), then 4096 one-token decodes    model only 400k tokens/s
    W2  kv 262144, kpool 4, n_seq_max 64, unified: seq 0 decodes rep-once 50k tokens/s;
        a 1024-token prompt, seq_cp 0 -> 1..63 (whole), then 2048 cache-safe <= 3x
        steps, each ONE decode of one token for each of 64 slots  rep-once's time;
                                                                peak RSS < 2 GB
    W3  kv 131072, kpool 4, n_rs_seq 3 (MTP3), 1 seq: a 32768-  2,000 steps/s (the
        token prefill, then 2048 steps: a 4-token decode at     real engine's host
        p..p+3, then seq_rm(0, p+4-r, -1) for r (seeded, 0..3)  code: ~1,100 steps/s)
        rejected drafts when r > 0; the next step starts at p+4-r
    W4  kv 65536, kpool 4, n_seq_max 2: seq 0 decodes a 16384-  cache-safe: 2,000
        token prompt, seq_cp 0 -> 1, then 4000 one-token        ubatches/s, peak RSS
        decodes of seq 0 (rep-once too, for comparison)         < 1 GB, report < 100 MB
    every workload: doubling the decodes (W1, W4) or steps (W2, W3) costs at most 2.2x

The tables, from one run:

- the first touch of fresh memory, before the runs and after them: one child maps 256 MiB
  and writes a byte a page, timed per page. Each replay's minor page faults (ru_minflt
  from os.wait4) are in the main table: a replay's fresh memory (its value rows above
  all) costs it about that many first touches, and what one costs moves with the
  machine and the hour, so a run states its own. The same child then copies 4 MiB
  between two parts of its map, touched already: the memory traffic (GB/s, bytes read
  and written) of a pass over a large column, what each pass over every pool of a
  cache-safe plan's change costs.

- the main table: per workload, engine, core and mode (full, model only) the wall time,
  the figure the target counts (tokens/s; W3 steps/s; W4 ubatches/s), peak RSS, report
  size, the ratio figure / target (>= 1 meets it) and, on the compiled row, the speed-up
  over the reference (its time / the compiled time). `--markdown` prints it as a Markdown
  table for the README.
- the floors: what a whole command pays before and around the replay, one child each:
  `python -c pass` (the bare interpreter), `python -c "import numpy"` and `python -c
  "import numba"` (a full replay pays numba's import over numpy's, which kpool's CLI
  imports anyway; a model-only one does not import numba), `kpool --help` (the
  interpreter and kpool's CLI: every command pays it), `kpool validate TRACE` per
  workload (the same plus loading and checking the trace, no replay: the load is its
  wall minus `kpool --help`'s), and the JSON encoding of each report: a child
  `json.load`s the report the replay wrote and times re-encoding it in the writer's
  layout (report/json_report.write_report: one `dumps` per header field, per
  ubatch, per event; the writer takes the replay's records, not a parsed report, so it
  cannot be called on one) and writing it to a file. Per workload, engine and mode the
  floor = startup + load + encoding, the best figure it allows (count / floor), beside
  the target, and each core's time as a multiple of the floor: a best figure below the
  target means the target cannot be met by a whole command, whatever the core does.
- the growth (`--no-growth` skips it): each workload again with its decodes (W1, W4) or
  steps (W2, W3) doubled, full replay, every engine and core: time(2x) / time(1x) raw,
  and of the replay part (wall minus the trace's `kpool validate` wall, i.e. startup and
  load, and minus numba's import over numpy's). The 1x and the 2x trace run in turn,
  one pair per `--repeat`, each replay followed at once by its trace's `kpool validate`,
  whose wall that replay's part subtracts; each ratio is the median of the pairs'
  ratios: a machine whose speed drifts over minutes moves the runs of a pair alike,
  where a 1x run taken minutes before its 2x twin, or a load timed minutes before its
  replay, can put the ratio off by a third. A doubled trace
  past the loader's default node bound (W2's: 1.3 million nodes) is loaded, and both
  traces of its pair replayed, with `--max-nodes` raised, as a user loads such a trace;
  with a kpool that has no `--max-nodes`, the pair is a halved trace and the workload.

n_embd is 128 in every workload (as in bench_backend.py and the README's benchmark;
`--n-embd` changes it). The loader's bounds (trace/load/) all hold at full scale:
at most 4,097 ops (MAX_OPS 65,536), 132,096 tokens (--max-tokens default 2**22),
W2's decodes about 660k YAML nodes (MAX_NODE_VISITS 1,000,000) and 3 MB of YAML
(MAX_BYTES 64 MiB); so no CLI option is needed but for W2's doubled twin (growth,
above). W2 at `--scale` above ~1.4 would cross the node bound.

    python benchmarks/bench_workloads.py [--only W1,W3] [--engines rep-once,cache-safe]
        [--cores compiled,reference] [--scale 0.05] [--timeout 600] [--keep DIR]
        [--no-model-only] [--no-growth] [--markdown] [--n-embd 128] [--src DIR]

`--src DIR` replays with another copy of kpool_cli, e.g. a snapshot of a commit taken
while the working tree is being edited:
    mkdir /tmp/kpool-head && git archive HEAD kpool_cli | tar -x -C /tmp/kpool-head
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import hashlib
import itertools
import json
import math
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from kpool_cli.trace.model import Trace

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

ENGINES = ("rep-once", "cache-safe")
CORES = ("compiled", "reference")  # `kpool replay --core C`; reference: the Python engine
MODES = ("full", "model-only")  # model-only: `--backend none`
SEED = 20240601
GB, MB = 1 << 30, 1 << 20

# -- the targets (issue 23's table: the checks and the legend read them here) -------------

UNIT = {"W1": "tokens/s", "W2": "tokens/s", "W3": "steps/s", "W4": "ubatches/s"}
# (workload, mode) -> (the figure per second, the engines it is set for)
RATE = {
    ("W1", "full"): (200_000, ENGINES),
    ("W1", "model-only"): (400_000, ENGINES),
    ("W2", "full"): (50_000, ("rep-once",)),
    ("W3", "full"): (2_000, ENGINES),
    ("W4", "full"): (2_000, ("cache-safe",)),
}
W2_TIMES = 3.0  # W2, full: cache-safe's time at most this many times rep-once's (same core)
RSS_MB = {"W2": 2048, "W4": 1024}  # full replay: peak RSS below this
REPORT_MB = {"W4": 100}  # full replay: report below this
GROWTH = 2.2  # doubling the decodes (steps) costs at most this many times the time
REMARK = {"W3": "the real engine's own host code: ~1,100 steps/s",
          "W4": "rep-once: for comparison"}


def fmt_k(v: float) -> str:
    return f"{v / 1000:g}k" if v >= 10_000 else f"{v:,.0f}"


def target_cell(name: str, engine: str, mode: str) -> str:
    """The target of one row of the main table, or '-'."""
    value, engines = RATE.get((name, mode), (None, ()))
    if value and engine in engines:
        return f"{fmt_k(value)} {UNIT[name]}"
    if (name, engine, mode) == ("W2", "cache-safe", "full"):
        return f"<= {W2_TIMES:g}x rep-once's time"
    return "-"


def target_text(name: str) -> str:
    """One workload's targets, for the legend."""
    out = []
    for (w, mode), (value, engines) in RATE.items():
        if w == name:
            who = "" if engines == ENGINES else " " + ", ".join(engines)
            out.append(f"{mode}{who} {fmt_k(value)} {UNIT[name]}")
    if name == "W2":
        out.append(f"cache-safe <= {W2_TIMES:g}x rep-once's time")
    if name in RSS_MB:
        out.append(f"peak RSS < {RSS_MB[name] / 1024:g} GB")
    if name in REPORT_MB:
        out.append(f"report < {REPORT_MB[name]:g} MB")
    out.append(f"doubling costs <= {GROWTH:g}x")
    return "; ".join(out) + (f" ({REMARK[name]})" if name in REMARK else "")


@dataclass
class Workload:
    name: str
    trace: Trace
    tokens: int
    steps: int = 0  # W2, W3: steps
    ubatches: int = 0  # W4: expected (the report's summary says, when there is one)
    about: str = ""
    grow: float = 1.0  # the growth's twin: its decodes (steps) times this

    @property
    def file(self) -> str:
        """Its YAML's name: w3.yaml (the name docs/versions.md uses with --keep), w3-x2.yaml."""
        return f"{self.name.lower()}{_tag(self.grow)}.yaml"


@dataclass
class Run:
    wall: float | None = None  # None: timed out
    partial_mb: float | None = None  # timed out: the report written so far
    rc: int | None = None
    maxrss_mb: float = 0.0
    minflt: int = 0  # minor page faults (ru_minflt): pages the child touched first
    report_mb: float | None = None
    sha256: str = ""  # of the report
    summary: dict = field(default_factory=dict)
    error: str = ""

    @property
    def done(self) -> bool:
        return self.secs is not None

    @property
    def secs(self) -> float | None:
        """The wall time of a run that completed, else None."""
        return None if self.error else self.wall


class Turn(NamedTuple):
    """One turn of a growth pair: a full replay and the `kpool validate` of its trace,
    run just after it (the load its replay part subtracts, timed in the same moment of
    the machine)."""

    replay: Run
    load: Run


# -- the workloads ------------------------------------------------------------------------


def _n(x: float, scale: float, lo: int = 1, grow: float = 1.0) -> int:
    """x scaled; `grow` multiplies the scaled count (the growth's doubled or halved trace)."""
    return max(lo, round(max(lo, round(x * scale)) * grow))


def _kv(kv: int, scale: float, need: int) -> int:
    """kv_size scaled, a multiple of 512, never below the cells the trace needs (nor above
    the full-scale kv_size unless the trace needs more)."""
    k = max(math.ceil(kv * scale), need + 64)
    return max(min(kv, -(-k // 512) * 512), -(-(need + 64) // 512) * 512)


def _tag(grow: float) -> str:
    return "" if grow == 1 else f"-x{grow:g}"


def w1(scale: float, n_embd: int, grow: float = 1.0):
    from kpool_cli.trace import model as m

    prefill, decodes = _n(65536, scale), _n(4096, scale, grow=grow)
    cfg = m.CacheConfig(kv_size=_kv(131072, scale, prefill + decodes), kpool=4, n_seq_max=1,
                        n_ubatch=512, n_embd=n_embd)
    ops = [m.Decode(tuple(m.Token(p, (0,)) for p in range(prefill)))]
    ops += [m.Decode((m.Token(p, (0,)),)) for p in range(prefill, prefill + decodes)]
    t = m.Trace(cfg, tuple(ops), name="bench-w1-prefill-decode" + _tag(grow), seed=SEED)
    return Workload("W1", t, prefill + decodes, steps=decodes, grow=grow,
                    about=f"kv {cfg.kv_size}, 1 seq: {prefill}-token prefill, "
                          f"{decodes} one-token decodes")


def w2(scale: float, n_embd: int, grow: float = 1.0):
    from kpool_cli.trace import model as m

    n_seq, prompt, steps = 64, _n(1024, scale), _n(2048, scale, grow=grow)
    cfg = m.CacheConfig(kv_size=_kv(262144, scale, prompt + n_seq * steps), kpool=4,
                        n_seq_max=n_seq, unified=True, n_ubatch=512, n_embd=n_embd)
    ops: list = [m.Decode(tuple(m.Token(p, (0,)) for p in range(prompt)))]
    ops += [m.SeqCp(0, s) for s in range(1, n_seq)]
    ops += [m.Decode(tuple(m.Token(prompt + i, (s,)) for s in range(n_seq)))
            for i in range(steps)]
    t = m.Trace(cfg, tuple(ops), name="bench-w2-parallel-slots" + _tag(grow), seed=SEED)
    return Workload("W2", t, prompt + n_seq * steps, steps=steps, grow=grow,
                    about=f"kv {cfg.kv_size}, 64 seqs: {prompt}-token prompt, 63 seq_cp, "
                          f"{steps} steps x 64 tokens")


def w3(scale: float, n_embd: int, grow: float = 1.0):
    from kpool_cli.trace import model as m

    prefill, steps = _n(32768, scale), _n(2048, scale, grow=grow)
    cfg = m.CacheConfig(kv_size=_kv(131072, scale, prefill + 4 * steps), kpool=4, n_seq_max=1,
                        n_ubatch=512, n_embd=n_embd, n_rs_seq=3)
    rng = random.Random(SEED)
    ops: list = [m.Decode(tuple(m.Token(p, (0,)) for p in range(prefill)))]
    p, rms = prefill, 0
    for _ in range(steps):
        ops.append(m.Decode(tuple(m.Token(q, (0,)) for q in range(p, p + 4))))
        r = rng.randint(0, 3)  # rejected drafts
        if r:
            ops.append(m.SeqRm(0, p + 4 - r, -1))
            rms += 1
        p += 4 - r
    t = m.Trace(cfg, tuple(ops), name="bench-w3-mtp3" + _tag(grow), seed=SEED)
    return Workload("W3", t, prefill + 4 * steps, steps=steps, grow=grow,
                    about=f"kv {cfg.kv_size}, n_rs_seq 3: {prefill}-token prefill, {steps} "
                          f"4-token steps, {rms} seq_rm (seed {SEED})")


def w4(scale: float, n_embd: int, grow: float = 1.0):
    from kpool_cli.trace import model as m

    prompt, decodes = _n(16384, scale), _n(4000, scale, grow=grow)
    cfg = m.CacheConfig(kv_size=_kv(65536, scale, prompt + decodes), kpool=4, n_seq_max=2,
                        n_ubatch=512, n_embd=n_embd)
    ops: list = [m.Decode(tuple(m.Token(p, (0,)) for p in range(prompt))), m.SeqCp(0, 1)]
    ops += [m.Decode((m.Token(p, (0,)),)) for p in range(prompt, prompt + decodes)]
    t = m.Trace(cfg, tuple(ops), name="bench-w4-copied-prompt" + _tag(grow), seed=SEED)
    return Workload("W4", t, prompt + decodes, steps=decodes, grow=grow,
                    ubatches=-(-prompt // 512) + decodes,
                    about=f"kv {cfg.kv_size}, 2 seqs: {prompt}-token prompt, seq_cp 0->1, "
                          f"{decodes} one-token decodes")


BUILDERS: dict[str, Callable[..., Workload]] = {"W1": w1, "W2": w2, "W3": w3, "W4": w4}
GROWN = {"W1": "decodes", "W2": "steps", "W3": "steps", "W4": "decodes"}  # what doubles


def count(wl: Workload, r: Run | None = None) -> int:
    """What the target counts: tokens (W1, W2), steps (W3), ubatches (W4: the report's
    summary when there is one)."""
    if wl.name == "W3":
        return wl.steps
    if wl.name == "W4":
        return int((r.summary.get("ubatches") if r else None) or wl.ubatches)
    return wl.tokens


# -- running ------------------------------------------------------------------------------


def kpool_cmd() -> list[str]:
    """The `kpool` script next to this interpreter (what a user runs), else `-m`."""
    exe = Path(sys.executable).parent / "kpool"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "kpool_cli"]


def replay_cmd(trace: Path, engine: str, core: str | None, mode: str, report: Path,
               bounds: Sequence[str] = ()) -> list[str]:
    """One replay; `core` None: a kpool without `--core` (no option passed); `bounds`:
    the loader's bounds raised (`--max-nodes N`) for a trace that needs it."""
    return [*kpool_cmd(), "replay", str(trace), "--engine", engine, "--format", "json",
            "-o", str(report), "-q", *(["--core", core] if core else []),
            *(["--backend", "none"] if mode == "model-only" else []), *bounds]


def help_text(args: list[str], env: dict[str, str], timeout: float) -> str:
    """`kpool ARGS --help`'s output ('' when it fails): what the installed kpool accepts."""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        p = subprocess.run([*kpool_cmd(), *args, "--help"], capture_output=True, text=True,
                           cwd=ROOT, env=env, timeout=timeout)
        return p.stdout if p.returncode == 0 else ""
    return ""


def read_summary(report: Path) -> dict:
    """The report's `summary` (its last key, on one line), read from the file's tail."""
    try:
        with open(report, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - (1 << 20)))
            tail = f.read().decode("utf-8", "replace")
    except OSError:
        return {}
    at = tail.rfind('"summary": ')
    if at < 0:
        return {}
    try:
        value, _ = json.JSONDecoder().raw_decode(tail, at + len('"summary": '))
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def child_env(src: str | None) -> dict[str, str]:
    """The children's environment: `--src DIR` puts DIR's kpool_cli first on the path
    (ahead of the editable install's finder)."""
    env = dict(os.environ)
    if src:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    return env


def run(cmd: list[str], report: Path | None, log: Path, timeout: float,
        env: dict[str, str]) -> Run:
    """Run `cmd` in its own process group; wall time and the child's peak RSS from
    os.wait4; on timeout kill that group and report no time. `report`: the file the
    child writes (a replay's report), read for its size and summary; None: a child
    that writes none, which fails only by its exit status."""
    if report is not None and report.exists():
        report.unlink()
    with open(log, "wb") as err:
        t0 = time.perf_counter()
        # stdout too: `kpool validate` says why a trace is invalid there
        proc = subprocess.Popen(cmd, stdout=err, stderr=err, cwd=ROOT,
                                env=env, start_new_session=True)
        deadline = t0 + timeout
        timed_out = False
        while True:
            pid, status, ru = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() > deadline:
                timed_out = True
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                pid, status, ru = os.wait4(proc.pid, 0)
                break
            time.sleep(0.02)
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen
    r = Run(wall=None if timed_out else wall, rc=proc.returncode, maxrss_mb=ru.ru_maxrss / 1024,
            minflt=ru.ru_minflt)
    if timed_out:
        if report is None:
            return r
        # the CLI writes the report atomically (contracts/files.py: a temporary file next to
        # it, renamed at the end): a killed run leaves that file; note its size, delete it
        for tmp in report.parent.glob(f".{report.name}.*.tmp"):
            r.partial_mb = (r.partial_mb or 0.0) + tmp.stat().st_size / MB
            tmp.unlink()
        return r
    if report is not None and report.exists():
        r.report_mb = report.stat().st_size / MB
        r.summary = read_summary(report)
    failed = r.rc != 0 if report is None else r.rc not in (0, 1) or r.report_mb is None
    if failed:  # a replay's exit 1 is a run with findings
        lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
        # an error's line, or the problem under `kpool validate`'s INVALID line
        after = [b for a, b in itertools.pairwise(lines) if a.startswith("INVALID")]
        first = next((ln for ln in lines if "rror" in ln),
                     after[0] if after else lines[-1] if lines else "no message")
        r.error = f"exit {r.rc}: {first[:200]}"
    return r


# the scale of the warm-up's workloads: each keeps its shape (its sequences, its edits,
# its plan changes), so it calls the kernels the workload calls, in a few hundred ubatches
WARM_SCALE = 0.02


def warm_up(only: list[str], engines: list[str], cores: list[str | None], timeout: float,
            env: dict[str, str], n_embd: int) -> None:
    """One small replay of each workload run (built at WARM_SCALE) per engine and core:
    numba compiles (or loads) the kernels the workload calls here, so no timed run
    pays for compiling one (a shipped trace alone left W2's and W4's cache-safe
    kernels, the parallel slots' and the grown plans', to their first timed run)."""
    from kpool_cli.trace.write import dump_trace

    with tempfile.TemporaryDirectory() as d:
        for name in only:
            path = Path(d) / f"warm-{name}.yaml"
            path.write_text(dump_trace(BUILDERS[name](WARM_SCALE, n_embd).trace))
            for e in engines:
                for c in cores:
                    out = Path(d) / "warm.json"
                    run(replay_cmd(path, e, c, "full", out), out, Path(d) / "warm.log",
                        timeout, env)


# the JSON encoding floor, in a child: parse the report, then time its encoding in the
# writer's layout (json_report.write_report) and the write of that text to a file
ENCODE_CHILD = r"""
import json, sys, time
try:  # the writer's own encoding of a value (a kpool before it: json's)
    from kpool_cli.report.json_report import dumps
except ImportError:
    dumps = json.dumps
src, out = sys.argv[1], sys.argv[2]
t0 = time.perf_counter()
with open(src, encoding="utf-8") as f:
    doc = json.load(f)
t1 = time.perf_counter()
parts = ["{\n"]
for i, (key, value) in enumerate(doc.items()):
    end = ",\n" if i < len(doc) - 1 else "\n"
    if key in ("ubatches", "events", "expectations"):
        parts.append(f"  {dumps(key)}: [" + ",".join("\n    " + dumps(v)
                     for v in value) + ("\n  " if value else "") + "]" + end)
    else:
        parts.append(f"  {dumps(key)}: {dumps(value)}" + end)
text = "".join(parts) + "}\n"
t2 = time.perf_counter()
with open(out + ".json", "w", encoding="utf-8") as f:
    f.write(text)
t3 = time.perf_counter()
fast = {}
try:  # the fastest encoder at hand, on the same data: the least any JSON writer pays
    import orjson
except ImportError:
    pass
else:
    t4 = time.perf_counter()
    raw = orjson.dumps(doc)
    t5 = time.perf_counter()
    with open(out + ".json", "wb") as f:
        f.write(raw)
    t6 = time.perf_counter()
    fast = {"fast_encode_s": t5 - t4, "fast_write_s": t6 - t5, "fast_mb": len(raw) / (1 << 20)}
with open(out, "w") as f:
    json.dump({"parse_s": t1 - t0, "encode_s": t2 - t1, "write_s": t3 - t2,
               "mb": len(text.encode()) / (1 << 20), **fast}, f)
"""

# the YAML floor, in a child: libyaml's C parser reading every event of the trace, the
# least an event-driven YAML loader of it does (no node, no check, no model built); or,
# when less, kpool's scan for the trace's token lines and op lines plus libyaml's events
# of the text with each run of them as one scalar (trace/yaml_safe/composer.py,
# `_token_lines`): the least kpool's own loader reads
YAML_CHILD = r"""
import sys, time
from yaml import StreamEndEvent
from yaml._yaml import CParser


def events(text):
    parser = CParser(text)
    n = 0
    while not isinstance(parser.get_event(), StreamEndEvent):
        n += 1
    return n


def read():
    with open(sys.argv[1], encoding="utf-8") as f:
        return f.read()


t0 = time.perf_counter()
n = events(read())
secs = time.perf_counter() - t0
try:
    from kpool_cli.trace.yaml_safe.composer import _token_lines
except ImportError:  # a kpool without them
    _token_lines = None
if _token_lines is not None:
    t0 = time.perf_counter()
    lines = _token_lines(read(), 1 << 62)
    if lines is not None:
        if hasattr(lines, "text"):  # before f460bfb: the text, made at once
            source = lines.text
        else:  # a reader; each run is taken as it is read, as kpool's composer takes it

            class Taken:
                def read(self, size):
                    lines.runs.clear()
                    return lines.read(size)

            source = Taken()
        n_lines = events(source)
        secs_lines = time.perf_counter() - t0
        if secs_lines < secs:
            n, secs = n_lines, secs_lines
with open(sys.argv[2], "w") as f:
    f.write(repr({"events": n, "secs": secs}))
"""


# the machine's first touch of fresh memory, in a child: an anonymous private map of
# TOUCH_MIB MiB written once a page, the time per page (each write a minor fault: the
# kernel hands the page and zeroes it). A replay's fresh memory (its value rows above
# all) costs its pages this; it is not one figure on every machine, nor on one machine
# at every hour (a virtual machine whose host has not yet backed a page pays far more
# for it), so each run of the benchmark measures it before its replays and after them.
# The same child then times a copy of COPY_MIB MiB between two parts of that map,
# touched already (the median of COPY_TIMES, in GB/s of bytes read and written): the
# memory traffic a pass over a large column costs, what a cache-safe plan's change
# pays for each of its passes over every pool (W2's growth: docs/performance.md,
# "thirty-ninth session")
TOUCH_MIB = 256
COPY_MIB, COPY_TIMES = 4, 51
TOUCH_CHILD = r"""
import mmap, sys, time
import numpy as np
n = int(sys.argv[1]) << 20
mm = mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE)  # anonymous (-1): zero pages
pages = np.frombuffer(mm, dtype=np.uint8)[::mmap.PAGESIZE]
t0 = time.perf_counter()
pages[:] = 1
secs = time.perf_counter() - t0
whole = np.frombuffer(mm, dtype=np.uint8)
half = int(sys.argv[2]) << 20
a, b = whole[:half], whole[half:2 * half]
took = []
for _ in range(int(sys.argv[3])):
    t0 = time.perf_counter()
    np.copyto(b, a)
    took.append(time.perf_counter() - t0)
print(repr({"us_per_page": secs / pages.size * 1e6, "page": mmap.PAGESIZE,
            "copy_gb_s": 2 * half / sorted(took)[len(took) // 2] / 1e9}))
"""


def first_touch(out_dir: Path, timeout: float, env: dict[str, str], when: str) -> dict | None:
    """TOUCH_CHILD's figures ({"us_per_page", "page", "copy_gb_s"}), or None if it
    failed."""
    log = out_dir / f"first-touch-{when}.log"
    r = run([sys.executable, "-c", TOUCH_CHILD, str(TOUCH_MIB), str(COPY_MIB),
             str(COPY_TIMES)], None, log, timeout, env)
    if r.wall is None or r.error:
        return None
    try:
        return dict(ast.literal_eval(log.read_text().strip().splitlines()[-1]))
    except (IndexError, SyntaxError, TypeError, ValueError):  # no figures printed
        return None


def yaml_floor(trace: Path, out_dir: Path, timeout: float, env: dict[str, str]) -> float | None:
    """libyaml's event parse of `trace` in seconds (YAML_CHILD), or None if it failed."""
    out = out_dir / f"{trace.stem}.yaml-events"
    r = run([sys.executable, "-c", YAML_CHILD, str(trace), str(out)], None,
            out_dir / f"{trace.stem}.yaml-events.log", timeout, env)
    if r.wall is None or r.error or not out.exists():
        return None
    return float(ast.literal_eval(out.read_text())["secs"])


def encode_floor(report: Path, out_dir: Path, timeout: float, env: dict[str, str]
                 ) -> dict | str:
    """The encoding and write time of `report` (ENCODE_CHILD), or why there is none."""
    out = out_dir / f"{report.stem}.encode"
    r = run([sys.executable, "-c", ENCODE_CHILD, str(report), str(out)], out,
            out_dir / f"{report.stem}.encode.log", timeout, env)
    if r.wall is None:
        return "timed out"
    if r.error:
        return r.error
    value = json.loads(out.read_text())
    Path(str(out) + ".json").unlink(missing_ok=True)
    return value


# -- the tables ---------------------------------------------------------------------------


def fmt_rate(n: float | None, wall: float | None, timeout: float) -> str:
    if not n:
        return "-"
    if wall is None:
        return f"<{n / timeout:,.0f}"
    return f"{n / wall:,.0f}"


def table(cols: list[str], rows: list[list[str]], right: set[int]) -> None:
    """Print `rows` under `cols`, columns in `right` right-aligned."""
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(cols)]

    def line(cells: list[str]) -> str:
        return "  ".join(c.rjust(w) if i in right else c.ljust(w)
                         for i, (c, w) in enumerate(zip(cells, widths, strict=True))).rstrip()

    print(line(cols))
    print(line(["-" * w for w in widths]))
    for r in rows:
        print(line(r))


def markdown(cols: list[str], rows: list[list[str]]) -> None:
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for r in rows:
        print("| " + " | ".join(c.replace("|", "\\|") for c in r) + " |")


@dataclass
class Bench:
    """Everything one run of the script measured."""
    a: argparse.Namespace
    engines: list[str]
    cores: list[str]
    core_opt: bool  # the installed kpool takes --core
    modes: list[str]
    out_dir: Path
    env: dict[str, str]
    max_nodes_opt: bool = False  # the installed kpool takes --max-nodes
    header: list[str] = field(default_factory=list)
    workloads: dict[str, Workload] = field(default_factory=dict)
    runs: dict[tuple[str, str, str, str], Run] = field(default_factory=dict)  # wl, e, c, mode
    start: dict[str, Run] = field(default_factory=dict)  # python, numba, kpool --help
    loads: dict[str, Run] = field(default_factory=dict)  # trace name -> kpool validate
    yamls: dict[str, float | None] = field(default_factory=dict)  # trace name -> libyaml s
    touch: dict[str, dict | None] = field(default_factory=dict)  # "before", "after" -> probe
    encodes: dict[tuple[str, str, str], dict | str] = field(default_factory=dict)  # wl, e, mode
    # growth: workload -> (the small and the big trace, by (engine, core) their turns:
    # each a replay and the `kpool validate` of its trace run just after it)
    grown: dict[str, tuple[Workload, Workload,
                           dict[tuple[str, str], tuple[list[Turn], list[Turn]]]]] = \
        field(default_factory=dict)

    def log(self, what: str) -> None:
        print(what, file=sys.stderr, flush=True)

    def write(self, wl: Workload) -> Path:
        from kpool_cli.trace.write import dump_trace

        path = self.out_dir / wl.file
        path.write_text(dump_trace(wl.trace))
        return path

    def child(self, what: str, cmd: list[str], report: Path | None = None,
              n: int | None = None) -> Run:
        """`cmd` run `n` (default `--repeat`) times in turn: the median wall, the largest
        peak RSS and count of minor faults, the last run's report. A run that fails or
        times out stands for the child."""
        log = self.out_dir / f"{what.replace(' ', '_').replace('/', '_')}.log"
        n = self.a.repeat if n is None else n
        walls: list[float] = []
        rss, flt = 0.0, 0
        for i in range(n):
            self.log(what + (f" ({i + 1}/{n})" if n > 1 else "") + " ...")
            r = run(cmd, report, log, self.a.timeout, self.env)
            if r.error or r.wall is None:
                return r
            walls.append(r.wall)
            rss, flt = max(rss, r.maxrss_mb), max(flt, r.minflt)
        r.wall, r.maxrss_mb, r.minflt = statistics.median(walls), rss, flt
        return r

    def validate(self, wl: Workload, path: Path, bounds: Sequence[str] = ()) -> Run:
        r = self.child(f"validate {path.name}",
                       [*kpool_cmd(), "validate", str(path), *bounds])
        self.loads[wl.file] = r
        return r

    def hard_startup(self, mode: str) -> float | None:
        """The least a replay in this stack pays before it reads the trace: the
        interpreter with numba imported (numpy with it) for a full replay, with numpy
        alone for a model-only one."""
        return self.start["numba" if mode == "full" else "numpy"].secs

    def startup(self, mode: str) -> float | None:
        """What a replay pays before it loads the trace: `kpool --help`, and numba's
        import when it replays values (`numba_import`)."""
        kh = self.start["help"].secs
        if kh is None or mode != "full":
            return kh
        nb = self.numba_import()
        return None if nb is None else kh + nb

    def numba_import(self) -> float | None:
        """numba's import over numpy's, which kpool's CLI imports already: what a full
        replay pays and `kpool --help` and `kpool validate` do not."""
        npy, nb = self.start["numpy"].secs, self.start["numba"].secs
        return None if nb is None or npy is None else max(0.0, nb - npy)

    def load(self, wl: Workload) -> float | None:
        v, kh = self.loads.get(wl.file), self.start["help"].wall
        if v is None or v.error or v.wall is None or kh is None:
            return None
        return max(0.0, v.wall - kh)  # noise can put it below kpool --help's wall

    def replay_part(self, turn: Turn) -> float | None:
        """A full replay's wall minus startup and the trace's load: minus the wall of
        the `kpool validate` run just after it (`kpool --help` and the load) and
        `numba_import`."""
        r, v = turn
        nb = self.numba_import()
        if r.secs is None or v.secs is None or nb is None:
            return None
        return r.secs - v.secs - nb


def measure(b: Bench, only: list[str]) -> None:
    a = b.a
    b.touch["before"] = first_touch(b.out_dir, a.timeout, b.env, "before")
    b.start["python"] = b.child("python -c pass", [sys.executable, "-c", "pass"])
    b.start["numpy"] = b.child("import numpy", [sys.executable, "-c", "import numpy"])
    b.start["numba"] = b.child("import numba", [sys.executable, "-c", "import numba"])
    b.start["help"] = b.child("kpool --help", [*kpool_cmd(), "--help"])
    for name in only:
        t0 = time.perf_counter()
        wl = BUILDERS[name](a.scale, a.n_embd)
        path = b.write(wl)
        gen = time.perf_counter() - t0
        b.workloads[name] = wl
        b.header.append(f"{name}: {wl.about}; {len(wl.trace.ops):,} ops, "
                        f"{wl.tokens:,} tokens, YAML {path.stat().st_size / MB:.1f} MB "
                        f"(built in {gen:.1f} s)")
        b.validate(wl, path)
        b.log(f"libyaml events of {path.name} ...")
        b.yamls[wl.file] = yaml_floor(path, b.out_dir, a.timeout, b.env)
        for e in b.engines:
            for c in b.cores:
                for mode in b.modes:
                    rep = b.out_dir / f"{name.lower()}-{e}-{c}-{mode}.json"
                    r = b.child(f"{name} {e} {c} {mode}",
                                replay_cmd(path, e, c if b.core_opt else None, mode, rep), rep)
                    if r.report_mb is not None:
                        r.sha256 = sha256(rep)
                    b.runs[(name, e, c, mode)] = r
            for mode in b.modes:  # the encoding of the report (equal under both cores)
                done = [c for c in b.cores if b.runs[(name, e, c, mode)].report_mb is not None]
                b.encodes[(name, e, mode)] = (
                    encode_floor(b.out_dir / f"{name.lower()}-{e}-{done[0]}-{mode}.json",
                                 b.out_dir, a.timeout, b.env) if done else "no report")
        if a.growth:
            grow_one(b, wl, path)


def grow_one(b: Bench, wl: Workload, path: Path) -> None:
    """The workload with its decodes (steps) doubled; full replays of it and of the
    workload under every engine and core. A doubled trace past the loader's default
    node bound (W2's) loads as a user loads it, with `--max-nodes` raised (its load,
    its replays and the workload's, whose work a bound does not change); with a kpool
    that has no such option, the pair is the workload halved and the workload."""
    from kpool_cli.cli.options import MAX_NODES_CHOSEN

    big = BUILDERS[wl.name](b.a.scale, b.a.n_embd, grow=2.0)
    big_path = b.write(big)
    small, small_path = wl, path
    bounds: list[str] = []
    if not b.validate(big, big_path).done and b.max_nodes_opt:
        bounds = ["--max-nodes", str(MAX_NODES_CHOSEN)]
        b.header.append(f"{wl.name} x2 loads with --max-nodes (the default node bound "
                        f"refuses it: {b.loads[big.file].error})")
        b.validate(big, big_path, bounds)
    if not b.loads[big.file].done:
        b.header.append(f"{wl.name} x2 does not load ({b.loads[big.file].error}): "
                        "its growth pair is x0.5 -> x1")
        small, big, big_path = BUILDERS[wl.name](b.a.scale, b.a.n_embd, grow=0.5), wl, path
        small_path = b.write(small)
        b.validate(small, small_path)
    pair: dict[tuple[str, str], tuple[list[Turn], list[Turn]]] = {}
    for e in b.engines:
        for c in b.cores:
            done: dict[int, list[Turn]] = {id(small): [], id(big): []}
            for i in range(b.a.repeat):  # small, big, small, big ...: the pairs share the
                for w, p in ((small, small_path), (big, big_path)):  # machine's speed
                    rep = b.out_dir / f"{p.stem}-{e}-{c}-grow.json"
                    what = f"{p.stem} {e} {c} full (pair {i + 1}/{b.a.repeat})"
                    r = b.child(what, replay_cmd(p, e, c if b.core_opt else None, "full",
                                                 rep, bounds), rep, n=1)
                    v = b.child(f"{what}: its load",
                                [*kpool_cmd(), "validate", str(p), *bounds], n=1)
                    done[id(w)].append(Turn(r, v))
            pair[(e, c)] = (done[id(small)], done[id(big)])
    b.grown[wl.name] = (small, big, pair)


def main_rows(b: Bench) -> list[list[str]]:
    t = b.a.timeout
    rows = []
    for (name, e, c, mode), r in b.runs.items():
        wl = b.workloads[name]
        n = count(wl, r)
        if r.error:
            wall, fig = "error", "-"
        else:
            wall = f"> {t:g} s" if r.wall is None else f"{r.wall:.2f}"
            fig = fmt_rate(n, r.wall, t) + " " + UNIT[name]
        rss = f"{r.maxrss_mb:,.0f}" + ("+" if r.wall is None else "")
        faults = f"{r.minflt / 1000:,.1f}k" + ("+" if r.wall is None else "")
        rep = "-" if r.report_mb is None else f"{r.report_mb:,.1f}"
        if r.partial_mb is not None:
            rep = f"{r.partial_mb:,.0f}+"

        # the ratio to the target: >= 1 meets it (an upper bound "<" when the run timed out)
        ratio, notes = "-", []
        value, engines = RATE.get((name, mode), (0, ()))
        if value and e in engines and not r.error:
            ratio = (f"<{n / t / value:.3f}x" if r.wall is None
                     else f"{n / r.wall / value:.3f}x")
        elif (name, e, mode) == ("W2", "cache-safe", "full") and not r.error:
            ro = b.runs.get(("W2", "rep-once", c, "full"))
            if ro is not None and ro.secs is not None:
                ratio = (f"<{W2_TIMES * ro.secs / t:.3f}x" if r.wall is None
                         else f"{W2_TIMES * ro.secs / r.wall:.3f}x")
        if mode == "full":
            notes += limit_notes(r, RSS_MB.get(name), REPORT_MB.get(name))

        # the compiled core's speed-up over the reference, and whether their reports agree
        speed = "-"
        ref = b.runs.get((name, e, "reference", mode))
        if c == "compiled" and ref is not None:
            if r.secs is not None and ref.secs is not None:
                speed = f"{ref.secs / r.secs:.2f}x"
            elif r.secs is not None and ref.wall is None:
                speed = f">{t / r.secs:.2f}x"
            if r.sha256 and ref.sha256 and r.sha256 != ref.sha256:
                notes.append("report DIFFERS from the reference's")
            elif r.sha256 and ref.sha256:
                notes.append("report = reference's")
        if mode == "model-only":
            full = b.runs.get((name, e, c, "full"))
            if full is not None and full.secs is not None and r.secs is not None:
                notes.append(f"model/full {r.secs / full.secs:.2f}")
        if r.error:
            notes.append(r.error)
        elif r.wall is None:
            notes.append("timed out" + ("" if r.partial_mb is None else
                                        f" ({r.partial_mb:,.0f} MB of report written)"))
        elif r.summary.get("status") not in (None, "pass"):
            found = r.summary.get("findings") or {}
            notes.append(f"status {r.summary.get('status')}"
                         + "".join(f" {code} x{k:,}" for code, k in sorted(found.items())))
        rows.append([name, e, c, mode, wall, fig, rss, rep, target_cell(name, e, mode), ratio,
                     speed, faults, "; ".join(notes)])
    return rows


def limit_notes(r: Run, rss_mb: float | None, report_mb: float | None) -> list[str]:
    """ok / NO against the RSS and report-size targets; a timed-out run counts as NO
    once what it reached already crosses the limit, else as unknown (?)."""
    if r.error:
        return []
    done = r.wall is not None
    out = []
    if rss_mb is not None:
        out.append(f"RSS<{rss_mb / 1024:g}GB "
                   + ("NO" if r.maxrss_mb >= rss_mb else "ok" if done else "?"))
    if report_mb is not None:
        size = r.report_mb if done else r.partial_mb
        out.append(f"report<{report_mb:g}MB "
                   + ("NO" if size is not None and size >= report_mb else "ok" if done else "?"))
    return out


def print_main(b: Bench) -> None:
    a = b.a
    core = "--core C " if b.core_opt else ""
    print(f"kpool replay TRACE --engine E {core}--format json -o REPORT -q (backend numba; "
          f"model only: --backend none); scale {a.scale:g}, timeout {a.timeout:g} s, "
          f"n_embd {a.n_embd}, seed {SEED}"
          + (f"; each child run {a.repeat} times, its median wall" if a.repeat > 1 else ""))
    print(f"kpool_cli: {a.src or 'the installed package'}")
    if not b.core_opt:
        print("NOTE: this kpool's `replay` has no --core option: only the reference engine "
              "ran (no option passed); no compiled rows, no speed-up")
    for h in b.header:
        print("  " + h)
    rows = main_rows(b)
    if a.markdown:
        cols = ["workload", "engine", "core", "mode", "figure", "target", "ratio",
                "peak RSS", "report size", "minor faults"]
        markdown(cols, [[r[0], r[1], r[2], r[3], r[5], r[8], r[9], f"{r[6]} MB",
                         "-" if r[7] == "-" else f"{r[7]} MB", r[11]] for r in rows])
    else:
        cols = ["workload", "engine", "core", "mode", "wall s", "figure", "peak RSS MB",
                "report MB", "target", "ratio", "speed-up", "minor faults", "notes"]
        table(cols, rows, {4, 5, 6, 7, 9, 10, 11})
    print("'ratio' is figure / target (W2 cache-safe: 3x rep-once's time / its time), >= 1 "
          "meets it ('<' when timed out);\n'speed-up': the reference's time / the compiled "
          "core's; a '+' after peak RSS, report MB or minor faults: what a timed-out run had "
          "reached;\n"
          "'minor faults': the page faults the kernel served without I/O (first touches of "
          "fresh memory above all), the largest count of its runs")
    print_touch(b)
    for name in b.workloads:
        print(f"  {name}: {target_text(name)}")


def print_touch(b: Bench) -> None:
    """The first-touch probe's figures, before and after the runs (TOUCH_CHILD)."""
    got = {k: v for k, v in b.touch.items() if v is not None}
    if not got:
        print("first touch of fresh memory: the probe failed")
        return
    page = next(iter(got.values()))["page"]
    print(f"first touch of fresh memory ({TOUCH_MIB} MiB in one child, one write a "
          f"{page // 1024} KiB page): "
          + ", ".join(f"{v['us_per_page']:.2f} us a page {k} the runs" for k, v in got.items())
          + ";\na replay's minor faults times it bounds what its first touches cost it "
          "(some faults map pages of files already in memory, which cost less); the figure "
          "moves\nbetween machines and hours (a virtual machine pays far more for a page "
          "its host has not yet backed): each run states its own")
    print(f"memory traffic (a copy of {COPY_MIB} MiB between two parts of that map, the "
          f"median of {COPY_TIMES}, bytes read and written): "
          + ", ".join(f"{v['copy_gb_s']:.1f} GB/s {k} the runs" for k, v in got.items()))


def print_floors(b: Bench) -> None:
    print("\nfloors (one child each): what a whole command pays besides the replay itself")
    rows = []
    meaning = {"python": "the bare interpreter's start",
               "numpy": "the interpreter + numpy's import (kpool's CLI imports numpy)",
               "numba": "the interpreter + numba's import: a full replay pays it minus "
                        "numpy's (model-only does not import numba)",
               "help": "the interpreter + kpool's CLI: the startup every command pays"}
    cmds = {"python": "python -c pass", "numpy": 'python -c "import numpy"',
            "numba": 'python -c "import numba"',
            "help": "kpool --help"}
    for k, r in b.start.items():
        rows.append([cmds[k], "-" if r.secs is None else f"{r.secs:.2f}",
                     meaning[k] + (f"; {r.error}" if r.error else "")])
    help_s = b.start["help"].secs
    for trace, r in b.loads.items():
        w = r.secs
        load = (r.error or "timed out" if w is None else "-" if help_s is None else
                f"load {max(0.0, w - help_s):.2f} s"
                + (" (below kpool --help's wall: noise)" if w < help_s else ""))
        rows.append([f"kpool validate {trace}", "-" if w is None else f"{w:.2f}",
                     f"startup + loading and checking the trace, no replay: {load}"])
    for trace, secs in b.yamls.items():
        rows.append([f"libyaml events of {trace}", "-" if secs is None else f"{secs:.2f}",
                     "libyaml's C parser reading every event of the trace (or, when less, "
                     "kpool's scan for its token and op lines and the events of the rest), timed "
                     "inside its child: the least a YAML load of it pays"])
    table(["command", "wall s", "what it means"], rows, {1})

    print("\nfloors per workload, two of them:\n- kpool's floor = startup (+ numba's import "
          "- numpy's for a full replay) + kpool's load + the report's encoding in kpool's "
          "layout and\n  encoder, and its write: what kpool pays today besides the replay;"
          "\n- the hard floor = the interpreter with numba (full) or numpy (model-only) imported + "
          "the YAML\n  floor above + the report's data encoded by orjson and "
          "written: the least any replay in this stack pays.\n'best' is the figure a "
          "command costing just the hard floor reaches: below the target, the target is "
          "impossible;\n'<core> x floor' is that core's wall / kpool's floor, '<core> x hard' "
          "its wall / the hard floor")
    rows = []
    for (name, e, mode), enc in b.encodes.items():
        wl = b.workloads[name]
        s, ld = b.startup(mode), b.load(wl)
        hs, ys = b.hard_startup(mode), b.yamls.get(wl.file)
        enc_s = enc["encode_s"] + enc["write_s"] if isinstance(enc, dict) else None
        fast_s = (enc["fast_encode_s"] + enc["fast_write_s"]
                  if isinstance(enc, dict) and "fast_encode_s" in enc else None)
        floor = None if s is None or ld is None or enc_s is None else s + ld + enc_s
        hard = None if hs is None or ys is None or fast_s is None else hs + ys + fast_s
        ref = next((b.runs[(name, e, c, mode)] for c in b.cores), None)
        n = count(wl, ref)
        best = "-" if hard is None else f"{n / hard:,.0f} {UNIT[name]}"
        value, engines = RATE.get((name, mode), (0, ()))
        vs, note = "-", "" if isinstance(enc, dict) else f"encoding: {enc}"
        if isinstance(enc, dict) and fast_s is None:
            note = "no orjson: no hard floor (pip install orjson)"
        if hard is not None and value and e in engines:
            vs = f"{n / hard / value:.3f}x"
            note = ("target IMPOSSIBLE as a whole command: the hard floor alone misses it"
                    if n / hard < value else "")
            if floor is not None and n / floor < value <= n / hard:
                note = "kpool's load and encoding alone miss the target; the hard floor meets it"
        per_core = []
        for c in b.cores:
            w = b.runs[(name, e, c, mode)].secs
            per_core.append("-" if floor is None or w is None else f"{w / floor:.2f}x")
            per_core.append("-" if hard is None or w is None else f"{w / hard:.2f}x")
        cell = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
        rows.append([name, e, mode, cell(s), cell(ld), cell(enc_s), cell(floor), cell(hs),
                     cell(ys), cell(fast_s), cell(hard), best, target_cell(name, e, mode), vs,
                     *per_core, note])
    cores = [f"{c} x {f}" for c in b.cores for f in ("floor", "hard")]
    table(["workload", "engine", "mode", "startup s", "load s", "encode s", "floor s",
           "hard start s", "yaml s", "orjson s", "hard floor s", "best", "target",
           "best/target", *cores, "notes"],
          rows, {*range(3, 12), 13, *range(14, 14 + len(cores))})


def print_growth(b: Bench) -> None:
    print(f"\ngrowth: the decodes (W1, W4) or steps (W2, W3) doubled, full replay; target "
          f"time ratio <= {GROWTH:g}x;\n'replay' = wall - startup (kpool --help + numba's "
          "import - numpy's) - the trace's load (its kpool validate - kpool --help), that "
          "is wall - (numba's import - numpy's) - the wall of the trace's kpool validate "
          "run just after the replay; the 1x and 2x traces run in turn, --repeat pairs: "
          "walls are medians, ratios the median of the pairs' ratios; '?': the replay part "
          "is below the startup, so noise may decide")
    rows = []
    start = b.startup("full") or 0.0
    for name, (small, big, pair) in b.grown.items():
        what = GROWN[name]
        for (e, c), (r1s, r2s) in pair.items():
            notes = sorted({prefix + (x.error or "timed out")
                            for t in (*r1s, *r2s)
                            for prefix, x in (("", t.replay), ("load: ", t.load))
                            if not x.done})
            walls: list[tuple[float, float]] = []  # the pairs that both completed
            parts: list[tuple[float, float]] = []  # and their replay parts, when positive
            for t1, t2 in zip(r1s, r2s, strict=True):
                r1, r2 = t1.replay, t2.replay
                if r1.secs is None or r2.secs is None:
                    continue
                walls.append((r1.secs, r2.secs))
                p1, p2 = b.replay_part(t1), b.replay_part(t2)
                if p1 is not None and p2 is not None and p1 > 0:
                    parts.append((p1, p2))
            raw, net, verdict = "-", "-", "-"
            if walls:
                raw = f"{statistics.median(w2_ / w1_ for w1_, w2_ in walls):.2f}x"
            if parts:
                ratios = sorted(p2 / p1 for p1, p2 in parts)
                ratio = statistics.median(ratios)
                net = f"{ratio:.2f}x" + (f" ({ratios[0]:.2f}-{ratios[-1]:.2f})"
                                         if len(ratios) > 1 else "")
                verdict = "ok" if ratio <= GROWTH else "NO"
                if statistics.median(p1 for p1, _ in parts) < start:  # the subtracted
                    verdict += "?"  # outweighs what is left: its noise rules
                    notes.append("replay 1x < startup: noise-dominated, use a larger --scale")

            def med(xs: list[float]) -> str:
                return f"{statistics.median(xs):.2f}" if xs else "-"
            rows.append([name, e, c, f"{what} {small.steps:,} -> {big.steps:,}",
                         med([w for w, _ in walls]), med([w for _, w in walls]), raw,
                         med([p for p, _ in parts]), med([p for _, p in parts]),
                         net, verdict, "; ".join(notes)])
    table(["workload", "engine", "core", "doubled", "wall 1x", "wall 2x", "raw", "replay 1x",
           "replay 2x", "replay ratio", f"<={GROWTH:g}x", "notes"], rows,
          {4, 5, 6, 7, 8, 9})


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n".join((__doc__ or "").splitlines()[2:]))
    ap.add_argument("--only", default="W1,W2,W3,W4", help="workloads, e.g. W1,W3")
    ap.add_argument("--engines", default=",".join(ENGINES), help="engines, e.g. cache-safe")
    ap.add_argument("--cores", default=",".join(CORES),
                    help="replay cores (`kpool replay --core C`), e.g. compiled; a kpool "
                         "without --core runs the reference alone")
    ap.add_argument("--scale", type=float, default=1.0,
                    help="multiply the sizes (prefills, steps, decodes, kv_size) by F")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per run")
    ap.add_argument("--keep", metavar="DIR", help="keep the traces and reports in DIR")
    ap.add_argument("--no-model-only", action="store_true",
                    help="skip the model-only runs (--backend none)")
    ap.add_argument("--growth", action=argparse.BooleanOptionalAction, default=True,
                    help="replay each workload with its decodes (steps) doubled too "
                         "(default: on)")
    ap.add_argument("--markdown", action="store_true",
                    help="print the main table as a Markdown table (for the README)")
    ap.add_argument("--repeat", type=int, default=1, metavar="N",
                    help="run each replay, startup and load child N times in turn and take "
                         "its median wall (and largest peak RSS): for a machine whose speed "
                         "moves from one run to the next (default: 1)")
    ap.add_argument("--n-embd", type=int, default=128, help="cache.n_embd of every workload")
    ap.add_argument("--src", metavar="DIR",
                    help="replay with the kpool_cli package in DIR (put first on PYTHONPATH), "
                         "e.g. a `git archive` snapshot of a commit; default: the installed one")
    a = ap.parse_args()
    only = [w.strip().upper() for w in a.only.split(",") if w.strip()]
    engines = [e.strip() for e in a.engines.split(",") if e.strip()]
    cores = [c.strip() for c in a.cores.split(",") if c.strip()]
    bad = [w for w in only if w not in BUILDERS] + [c for c in cores if c not in CORES]
    if (bad or not only or not engines or not cores or a.scale <= 0 or a.timeout <= 0
            or a.repeat < 1):
        ap.error(f"unknown workload(s) or core(s) {bad}" if bad else "nothing to run")

    tmp = None
    if a.keep:
        out_dir = Path(a.keep).resolve()
        out_dir.mkdir(parents=True, exist_ok=True)
    else:
        tmp = tempfile.TemporaryDirectory(prefix="kpool-bench-")
        out_dir = Path(tmp.name)
    try:
        a.src = str(Path(a.src).resolve()) if a.src else None
        env = child_env(a.src)
        replay_help = help_text(["replay"], env, a.timeout)  # asked once
        core_opt = "--core" in replay_help
        if not core_opt:
            cores = ["reference"]
        if not help_text(["validate"], env, a.timeout):
            ap.error("this kpool has no `validate` command: the load floor cannot be measured")
        b = Bench(a, engines, cores, core_opt,
                  ["full"] if a.no_model_only else list(MODES), out_dir, env,
                  max_nodes_opt="--max-nodes" in replay_help)
        b.log(f"warming numba's cache ({', '.join(engines)}; cores {', '.join(cores)}) ...")
        warm_up(only, engines, list(cores) if core_opt else [None], a.timeout, env, a.n_embd)
        measure(b, only)
        b.touch["after"] = first_touch(out_dir, a.timeout, env, "after")
        print_main(b)
        print_floors(b)
        if a.growth:
            print_growth(b)
        if a.keep:
            print(f"traces and reports kept in {out_dir}")
    finally:
        if tmp is not None:
            tmp.cleanup()


if __name__ == "__main__":
    main()
