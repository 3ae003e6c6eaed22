"""Benchmark of the value backends (the README's "Performance" section).

The trace: kv_size 131072, n_embd 128, kpool 4, one sequence; a 65536-token prefill
split by the engine into ubatches of n_ubatch = 512 (llama_batch_allocr's
split_equal, as `kpool replay` does it), then 4096 one-token decodes. Each backend
(and the model-only replay, `none`) runs the
whole replay in a subprocess of its own, which reports wall time, tokens/s, peak
RSS (ru_maxrss) and the time spent inside the backend's kernels (key rows, pool,
scatter, check). Then the cold start of `kpool replay traces/shared-prefix-race.yaml`
after one warm-up run (numba's cache warm).

    python benchmarks/bench_backend.py [--decodes 4096] [--prefill 65536]
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def build_trace(prefill: int, decodes: int, ubatch: int = 512):
    from kpool_cli.trace import model as m

    cfg = m.CacheConfig(kv_size=131072, kpool=4, n_seq_max=1, n_ubatch=ubatch, n_embd=128)
    ops = [m.Decode(tuple(m.Token(p, (0,)) for p in range(prefill)))]
    ops += [m.Decode((m.Token(p, (0,)),)) for p in range(prefill, prefill + decodes)]
    return m.Trace(cfg, tuple(ops), name="bench-backend", seed=1)


def child(backend: str, prefill: int, decodes: int) -> None:
    from kpool_cli.backend.store import make_backend
    from kpool_cli.contracts.records import UbatchRecord
    from kpool_cli.replay import replay
    from kpool_cli.versions import REP_ONCE

    t = build_trace(prefill, decodes)
    be = make_backend(backend, t)
    if be is not None:
        be.time_kernels()
    t0 = time.perf_counter()
    phase = {}
    n_find = 0
    for rec in replay(t, REP_ONCE, be):
        if isinstance(rec, UbatchRecord):
            n_find += len(rec.findings)
            if rec.op == 0:
                phase["prefill"] = time.perf_counter() - t0
    wall = time.perf_counter() - t0
    out = {
        "backend": backend, "wall": wall, "prefill": phase.get("prefill", 0.0),
        "tokens_per_s": (prefill + decodes) / wall, "findings": n_find,
        "maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "kernels": dict(be.kernel_time) if be is not None else {},
        "pools_checked": be.pools_checked if be is not None else 0,
    }
    if backend == "numba":
        from kpool_cli.backend import kernels

        out["parallel_used"] = dict(kernels.PARALLEL_USED)
    print(json.dumps(out))


def run_child(backend: str, prefill: int, decodes: int) -> dict:
    r = subprocess.run([sys.executable, __file__, "--child", backend, "--prefill", str(prefill),
                        "--decodes", str(decodes)], capture_output=True, text=True, cwd=ROOT,
                       check=True)
    return json.loads(r.stdout.strip().splitlines()[-1])


def cold_start(n: int = 5) -> float:
    cmd = [sys.executable, "-m", "kpool_cli", "replay", "traces/shared-prefix-race.yaml",
           "--backend", "numba"]
    subprocess.run(cmd, capture_output=True, cwd=ROOT)  # warm numba's cache
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        subprocess.run(cmd, capture_output=True, cwd=ROOT)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--child", choices=["numba", "numpy", "none"])
    ap.add_argument("--prefill", type=int, default=65536)
    ap.add_argument("--decodes", type=int, default=4096)
    a = ap.parse_args()
    if a.child:
        child(a.child, a.prefill, a.decodes)
        return
    print(f"trace: kv_size 131072, n_embd 128, kpool 4, prefill {a.prefill} tokens in "
          f"ubatches of 512, then {a.decodes} one-token decodes (rep-once)")
    res = {b: run_child(b, a.prefill, a.decodes) for b in ("none", "numpy", "numba")}
    print(f"{'backend':8} {'wall s':>8} {'prefill s':>9} {'tokens/s':>10} {'peak MB':>8} "
          f"{'kernels s':>9}  kernel breakdown (s)")
    for b, r in res.items():
        k = r["kernels"]
        tot = sum(k.values())
        brk = ", ".join(f"{n} {v:.3f}" for n, v in sorted(k.items()))
        print(f"{b:8} {r['wall']:8.2f} {r['prefill']:9.2f} {r['tokens_per_s']:10.0f} "
              f"{r['maxrss_mb']:8.0f} {tot:9.3f}  {brk}")
    kn, kb = sum(res["numpy"]["kernels"].values()), sum(res["numba"]["kernels"].values())
    print(f"kernel speed-up numba vs numpy: {kn / kb:.1f}x "
          f"(pools checked: {res['numba']['pools_checked']}; "
          f"parallel builds used: {res['numba'].get('parallel_used')})")
    for name in sorted(res["numpy"]["kernels"]):
        n, b = res["numpy"]["kernels"][name], res["numba"]["kernels"].get(name, 0.0)
        print(f"  {name:10} numpy {n:.3f} s  numba {b:.3f} s  ({n / b if b else 0:.1f}x)")
    print(f"cold start of `kpool replay traces/shared-prefix-race.yaml` (numba, warm "
          f"cache, median of 5): {cold_start():.2f} s")


if __name__ == "__main__":
    main()
