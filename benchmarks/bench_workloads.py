"""Benchmark of four server-shaped workloads against the targets the README states.

Each workload is generated here (never stored in the repo): built in memory with
`kpool_cli.trace.model`, written as YAML with the project's writer
(`kpool_cli.trace.write.dump_trace`) to a temporary directory (or `--keep DIR`).
Each trace is then replayed the way a user does, one subprocess per run:

    kpool replay TRACE --engine E --format json -o REPORT -q            # full replay
    kpool replay TRACE --engine E --format json -o REPORT -q --backend none   # model only

under both shipped engines (rep-once, cache-safe), default backend (numba) for the
full replay. The parent measures each child's wall time (spawn to exit: interpreter
start, trace load, replay, report) and its peak RSS (ru_maxrss from os.wait4), and
reads the report's size and `summary` (ubatches, tokens, status; exit 1, findings,
is a completed run, its status shown in the notes). Before the runs,
one small replay per engine warms numba's on-disk cache, so no run pays for JIT
compilation. Figures come from one run each; there is no assertion.

    workload                                                    target
    W1  kv 131072, kpool 4, n_ubatch 512, 1 seq: a 65536-token  200k tokens/s
        prefill (one decode op), then 4096 one-token decodes
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

n_embd is 128 in every workload (as in bench_backend.py and the README's benchmark;
`--n-embd` changes it). The loader's bounds (trace/load/) all hold at full scale:
at most 4,097 ops (MAX_OPS 65,536), 132,096 tokens (--max-tokens default 2**22),
W2's decodes about 660k YAML nodes (MAX_NODE_VISITS 1,000,000) and 3 MB of YAML
(MAX_BYTES 64 MiB); so no CLI option is needed. W2 at `--scale` above ~1.4 would
cross the node bound.

    python benchmarks/bench_workloads.py [--only W1,W3] [--engines rep-once,cache-safe]
        [--scale 0.05] [--timeout 600] [--keep DIR] [--no-model-only] [--n-embd 128]
        [--src DIR]

`--src DIR` replays with another copy of kpool_cli, e.g. a snapshot of a commit taken
while the working tree is being edited:
    mkdir /tmp/kpool-head && git archive HEAD kpool_cli | tar -x -C /tmp/kpool-head
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

ENGINES = ("rep-once", "cache-safe")
SEED = 20240601
GB, MB = 1 << 30, 1 << 20

# the targets, by workload: (what, value)
TARGETS = {
    "W1": "200k tokens/s",
    "W2": "rep-once 50k tokens/s; cache-safe <= 3x rep-once's time; peak RSS < 2 GB",
    "W3": "2,000 steps/s (the real engine's own host code: ~1,100 steps/s)",
    "W4": "cache-safe 2,000 ubatches/s, peak RSS < 1 GB, report < 100 MB",
}


@dataclass
class Workload:
    name: str
    trace: object  # kpool_cli.trace.model.Trace
    tokens: int
    steps: int = 0  # W3: speculative steps
    ubatches: int = 0  # W4: expected (the report's summary says, when there is one)
    about: str = ""


@dataclass
class Run:
    wall: float | None = None  # None: timed out
    partial_mb: float | None = None  # timed out: the report written so far
    rc: int | None = None
    maxrss_mb: float = 0.0
    report_mb: float | None = None
    summary: dict = field(default_factory=dict)
    error: str = ""


# -- the workloads ------------------------------------------------------------------------


def _n(x: float, scale: float, lo: int = 1) -> int:
    return max(lo, round(x * scale))


def _kv(kv: int, scale: float, need: int) -> int:
    """kv_size scaled, a multiple of 512, never below the cells the trace needs."""
    k = max(math.ceil(kv * scale), need + 64)
    return min(kv, -(-k // 512) * 512)


def w1(scale: float, n_embd: int):
    from kpool_cli.trace import model as m

    prefill, decodes = _n(65536, scale), _n(4096, scale)
    cfg = m.CacheConfig(kv_size=_kv(131072, scale, prefill + decodes), kpool=4, n_seq_max=1,
                        n_ubatch=512, n_embd=n_embd)
    ops = [m.Decode(tuple(m.Token(p, (0,)) for p in range(prefill)))]
    ops += [m.Decode((m.Token(p, (0,)),)) for p in range(prefill, prefill + decodes)]
    t = m.Trace(cfg, tuple(ops), name="bench-w1-prefill-decode", seed=SEED)
    return Workload("W1", t, prefill + decodes,
                    about=f"kv {cfg.kv_size}, 1 seq: {prefill}-token prefill, "
                          f"{decodes} one-token decodes")


def w2(scale: float, n_embd: int):
    from kpool_cli.trace import model as m

    n_seq, prompt, steps = 64, _n(1024, scale), _n(2048, scale)
    cfg = m.CacheConfig(kv_size=_kv(262144, scale, prompt + n_seq * steps), kpool=4,
                        n_seq_max=n_seq, unified=True, n_ubatch=512, n_embd=n_embd)
    ops: list = [m.Decode(tuple(m.Token(p, (0,)) for p in range(prompt)))]
    ops += [m.SeqCp(0, s) for s in range(1, n_seq)]
    ops += [m.Decode(tuple(m.Token(prompt + i, (s,)) for s in range(n_seq)))
            for i in range(steps)]
    t = m.Trace(cfg, tuple(ops), name="bench-w2-parallel-slots", seed=SEED)
    return Workload("W2", t, prompt + n_seq * steps, steps=steps,
                    about=f"kv {cfg.kv_size}, 64 seqs: {prompt}-token prompt, 63 seq_cp, "
                          f"{steps} steps x 64 tokens")


def w3(scale: float, n_embd: int):
    from kpool_cli.trace import model as m

    prefill, steps = _n(32768, scale), _n(2048, scale)
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
    t = m.Trace(cfg, tuple(ops), name="bench-w3-mtp3", seed=SEED)
    return Workload("W3", t, prefill + 4 * steps, steps=steps,
                    about=f"kv {cfg.kv_size}, n_rs_seq 3: {prefill}-token prefill, {steps} "
                          f"4-token steps, {rms} seq_rm (seed {SEED})")


def w4(scale: float, n_embd: int):
    from kpool_cli.trace import model as m

    prompt, decodes = _n(16384, scale), _n(4000, scale)
    cfg = m.CacheConfig(kv_size=_kv(65536, scale, prompt + decodes), kpool=4, n_seq_max=2,
                        n_ubatch=512, n_embd=n_embd)
    ops: list = [m.Decode(tuple(m.Token(p, (0,)) for p in range(prompt))), m.SeqCp(0, 1)]
    ops += [m.Decode((m.Token(p, (0,)),)) for p in range(prompt, prompt + decodes)]
    t = m.Trace(cfg, tuple(ops), name="bench-w4-copied-prompt", seed=SEED)
    return Workload("W4", t, prompt + decodes, ubatches=-(-prompt // 512) + decodes,
                    about=f"kv {cfg.kv_size}, 2 seqs: {prompt}-token prompt, seq_cp 0->1, "
                          f"{decodes} one-token decodes")


BUILDERS = {"W1": w1, "W2": w2, "W3": w3, "W4": w4}


# -- running ------------------------------------------------------------------------------


def kpool_cmd() -> list[str]:
    """The `kpool` script next to this interpreter (what a user runs), else `-m`."""
    exe = Path(sys.executable).parent / "kpool"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "kpool_cli"]


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


def child_env(src: str | None) -> dict[str, str]:
    """The children's environment: `--src DIR` puts DIR's kpool_cli first on the path
    (ahead of the editable install's finder)."""
    env = dict(os.environ)
    if src:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    return env


def run(cmd: list[str], report: Path, log: Path, timeout: float, env: dict[str, str]) -> Run:
    """Run `cmd` in its own process group; wall time and the child's peak RSS from
    os.wait4; on timeout kill that group and report no time."""
    if report.exists():
        report.unlink()
    with open(log, "wb") as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, cwd=ROOT,
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
    r = Run(wall=None if timed_out else wall, rc=proc.returncode, maxrss_mb=ru.ru_maxrss / 1024)
    if timed_out:
        # the CLI writes the report atomically (contracts/files.py: a temporary file next to
        # it, renamed at the end): a killed run leaves that file; note its size, delete it
        for tmp in report.parent.glob(f".{report.name}.*.tmp"):
            r.partial_mb = (r.partial_mb or 0.0) + tmp.stat().st_size / MB
            tmp.unlink()
        return r
    if report.exists():
        r.report_mb = report.stat().st_size / MB
        r.summary = read_summary(report)
    if r.rc not in (0, 1) or r.report_mb is None:  # exit 1 is a run with findings
        lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
        first = next((ln for ln in lines if "rror" in ln), lines[0] if lines else "no message")
        r.error = f"exit {r.rc}: {first[:200]}"
    return r


def warm_up(engines: list[str], timeout: float, env: dict[str, str]) -> None:
    """One small replay per engine: numba compiles (or loads) its kernels here."""
    with tempfile.TemporaryDirectory() as d:
        for e in engines:
            out = Path(d) / "warm.json"
            run([*kpool_cmd(), "replay", "traces/mtp3-speculative.yaml", "--engine", e,
                 "--format", "json", "-o", str(out), "-q"],
                out, Path(d) / "warm.log", timeout, env)


# -- the table ----------------------------------------------------------------------------


def fmt_rate(n: float | None, wall: float | None, timeout: float) -> str:
    if not n:
        return "-"
    if wall is None:
        return f"<{n / timeout:,.0f}"
    return f"{n / wall:,.0f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n".join(__doc__.splitlines()[2:]))
    ap.add_argument("--only", default="W1,W2,W3,W4", help="workloads, e.g. W1,W3")
    ap.add_argument("--engines", default=",".join(ENGINES), help="engines, e.g. cache-safe")
    ap.add_argument("--scale", type=float, default=1.0,
                    help="multiply the sizes (prefills, steps, decodes, kv_size) by F")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per run")
    ap.add_argument("--keep", metavar="DIR", help="keep the traces and reports in DIR")
    ap.add_argument("--no-model-only", action="store_true",
                    help="skip the model-only runs (--backend none)")
    ap.add_argument("--n-embd", type=int, default=128, help="cache.n_embd of every workload")
    ap.add_argument("--src", metavar="DIR",
                    help="replay with the kpool_cli package in DIR (put first on PYTHONPATH), "
                         "e.g. a `git archive` snapshot of a commit; default: the installed one")
    a = ap.parse_args()
    only = [w.strip().upper() for w in a.only.split(",") if w.strip()]
    engines = [e.strip() for e in a.engines.split(",") if e.strip()]
    bad = [w for w in only if w not in BUILDERS]
    if bad or not only or not engines or a.scale <= 0 or a.timeout <= 0:
        ap.error(f"unknown workload(s) {bad}" if bad else "nothing to run")

    from kpool_cli.trace.write import dump_trace

    tmp = None
    if a.keep:
        out_dir = Path(a.keep).resolve()
        out_dir.mkdir(parents=True, exist_ok=True)
    else:
        tmp = tempfile.TemporaryDirectory(prefix="kpool-bench-")
        out_dir = Path(tmp.name)
    try:
        print(f"warming numba's cache ({', '.join(engines)}) ...", file=sys.stderr, flush=True)
        a.src = str(Path(a.src).resolve()) if a.src else None
        env = child_env(a.src)
        warm_up(engines, a.timeout, env)
        header, rows = [], []
        results: dict[tuple[str, str], tuple[Run, Run | None]] = {}
        for name in only:
            t0 = time.perf_counter()
            wl = BUILDERS[name](a.scale, a.n_embd)
            path = out_dir / f"{name.lower()}.yaml"
            path.write_text(dump_trace(wl.trace))
            gen = time.perf_counter() - t0
            header.append(f"{name}: {wl.about}; {len(wl.trace.ops):,} ops, {wl.tokens:,} tokens, "
                          f"YAML {path.stat().st_size / MB:.1f} MB (built in {gen:.1f} s)")
            for e in engines:
                full_rep = out_dir / f"{name.lower()}-{e}.json"
                base = [*kpool_cmd(), "replay", str(path), "--engine", e, "--format", "json"]
                print(f"{name} {e}: full replay ...", file=sys.stderr, flush=True)
                full = run([*base, "-o", str(full_rep), "-q"], full_rep,
                           out_dir / f"{name.lower()}-{e}.log", a.timeout, env)
                model = None
                if not a.no_model_only:
                    mo_rep = out_dir / f"{name.lower()}-{e}-none.json"
                    print(f"{name} {e}: model-only replay ...", file=sys.stderr, flush=True)
                    model = run([*base, "-o", str(mo_rep), "-q", "--backend", "none"], mo_rep,
                                out_dir / f"{name.lower()}-{e}-none.log", a.timeout,
                                env)
                results[(name, e)] = (full, model)
                rows.append(row(wl, e, full, model, results, a.timeout))
        print_table(a, header, rows)
        if a.keep:
            print(f"traces and reports kept in {out_dir}")
    finally:
        if tmp is not None:
            tmp.cleanup()


def limit_notes(full: Run, rss_mb: float, report_mb: float | None) -> list[str]:
    """ok / NO against the RSS and report-size targets; a timed-out run counts as NO
    once what it reached already crosses the limit, else as unknown (?)."""
    if full.error:
        return []
    done = full.wall is not None
    out = [f"RSS<{rss_mb / 1024:g}GB "
           + ("NO" if full.maxrss_mb >= rss_mb else "ok" if done else "?")]
    if report_mb is not None:
        size = full.report_mb if done else full.partial_mb
        out.append(f"report<{report_mb:g}MB "
                   + ("NO" if size is not None and size >= report_mb else "ok" if done else "?"))
    return out


def row(wl: Workload, engine: str, full: Run, model: Run | None,
        results: dict, timeout: float) -> list[str]:
    ubatches = (full.summary.get("ubatches")
                or (model.summary.get("ubatches") if model else None) or wl.ubatches)
    wall = f"> {timeout:g} s" if full.wall is None else f"{full.wall:.2f}"
    if full.error:
        wall = "error"
    tok = fmt_rate(wl.tokens, full.wall, timeout) if not full.error else "-"
    if wl.name == "W3":
        other = "steps/s " + fmt_rate(wl.steps, full.wall, timeout)
    elif wl.name == "W4":
        other = "ubatches/s " + fmt_rate(ubatches, full.wall, timeout)
    else:
        other = "-"
    if full.error:
        other = "-"
    rss = f"{full.maxrss_mb:,.0f}" + ("+" if full.wall is None else "")
    rep = "-" if full.report_mb is None else f"{full.report_mb:,.1f}"
    if full.partial_mb is not None:
        rep = f"{full.partial_mb:,.0f}+"

    # the ratio to the target: >= 1 meets it (an upper bound "<" when the run timed out)
    notes: list[str] = []
    vs = "-"

    def ratio(achieved_per_s: float | None, target: float) -> str:
        if full.error or not achieved_per_s:
            return "-"
        if full.wall is None:
            return f"<{achieved_per_s / timeout / target:.3f}x"
        return f"{achieved_per_s / full.wall / target:.3f}x"

    if wl.name == "W1":
        vs = ratio(wl.tokens, 200_000)
    elif wl.name == "W2":
        if engine == "rep-once":
            vs = ratio(wl.tokens, 50_000)
        elif engine == "cache-safe":
            ro = results.get(("W2", "rep-once"), (None, None))[0]
            if ro is not None and ro.wall is not None and not full.error:
                vs = (f"<{3 * ro.wall / timeout:.3f}x" if full.wall is None
                      else f"{3 * ro.wall / full.wall:.3f}x")
                notes.append("target: <= 3x rep-once's time")
        notes += limit_notes(full, 2048, None)
    elif wl.name == "W3":
        vs = ratio(wl.steps, 2_000)
        notes.append("real engine ~1,100 steps/s")
    elif wl.name == "W4":
        vs = ratio(ubatches, 2_000)
        if engine != "cache-safe":
            notes.append("comparison")
        notes += limit_notes(full, 1024, 100)
    if full.error:
        notes.append(full.error)
    elif full.wall is None:
        notes.append("timed out" + ("" if full.partial_mb is None else
                                    f" ({full.partial_mb:,.0f} MB of report written)"))
    elif full.summary.get("status") not in (None, "pass"):
        found = full.summary.get("findings") or {}
        notes.append(f"status {full.summary.get('status')}"
                     + "".join(f" {code} x{n:,}" for code, n in sorted(found.items())))

    if model is None:
        m_wall, m_ratio = "-", "-"
    elif model.error:
        m_wall, m_ratio = "error", "-"
        notes.append("model-only " + model.error)
    elif model.wall is None:
        m_wall, m_ratio = f"> {timeout:g} s", "-"
    else:
        m_wall = f"{model.wall:.2f}"
        m_ratio = "-" if full.error else (f"<{model.wall / timeout:.2f}" if full.wall is None
                                          else f"{model.wall / full.wall:.2f}")
    return [wl.name, engine, wall, tok, other, rss, rep, vs, m_wall, m_ratio, "; ".join(notes)]


def print_table(a: argparse.Namespace, header: list[str], rows: list[list[str]]) -> None:
    print(f"kpool replay TRACE --engine E --format json -o REPORT -q (backend numba; model only: "
          f"--backend none); scale {a.scale:g}, timeout {a.timeout:g} s, n_embd {a.n_embd}, "
          f"seed {SEED}")
    print(f"kpool_cli: {a.src or 'the installed package'}")
    for h in header:
        print("  " + h)
    cols = ["workload", "engine", "wall s", "tokens/s", "other rate", "peak RSS MB",
            "report MB", "vs target", "model-only s", "model/full", "notes"]
    right = {2, 3, 4, 5, 6, 7, 8, 9}
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(cols)]

    def line(cells: list[str]) -> str:
        return "  ".join(c.rjust(w) if i in right else c.ljust(w)
                         for i, (c, w) in enumerate(zip(cells, widths, strict=True))).rstrip()

    print(line(cols))
    print(line(["-" * w for w in widths]))
    for r in rows:
        print(line(r))
    print("targets; 'vs target' is achieved / target, >= 1 meets it "
          "('<' when timed out);\n"
          "a '+' after peak RSS or report MB: what a timed-out run had reached when killed")
    for name in sorted({r[0] for r in rows}):
        print(f"  {name}: {TARGETS[name]}")


if __name__ == "__main__":
    main()
