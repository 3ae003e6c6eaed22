"""The verification campaign: the value backend's incremental bad pools against a full
recomputation after every ubatch (`check_incremental` of
tests/test_backend_incremental.py, which also holds KP003's tokens to the recomputed
bad pools), on two generators' random traces:

- the suite's own (`value_traces`: edits that leave stale keys, so about one trace in
  ten reaches a bad pool), `--value-traces N` of them drawn by hypothesis (derandomised:
  the same N each run), every engine variant and both cores drawn with them;
- the fuzzer's (kpool_cli.gen.random_trace: speculative removals, the recurrent
  child, non-unified caches, coupled sequences), seeds `--seed`.. for `--traces`,
  under every engine version on both cores, on `--jobs` processes.

    python tests/campaign_verify.py [--value-traces 10000] [--traces 10000] [--seed 0] [--jobs 2]
                                    [--backend numpy]

`--backend` names the value kernels the backend runs: numpy's (the default, as the
suite runs them) or numba's, held to numpy's bit for bit by tests/test_backend_kernels.py
and here to the full recomputation as well.

prints one line per generator (and per version and core for the fuzzer's: traces,
ubatches, ubatches with a bad pool, failures, seconds) and exits 1 on any failure,
naming it. The suite runs the first part on 150 traces; this is the long, opt-in run
(docs/testing.md).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # conftest, as pytest has it

from campaign import chunked, told


def _chunk(args: tuple[str, str, str, list[int]]) -> tuple[int, int, list[str]]:
    from test_backend_incremental import check_incremental

    from kpool_cli.gen.random_trace import random_trace
    from kpool_cli.versions import VERSIONS

    version, core, backend, seeds = args
    n = n_bad = 0
    failed = []
    for seed in seeds:
        try:
            u, b = check_incremental(random_trace(seed), VERSIONS[version], core, backend)
        except Exception as e:  # an assertion of the property, or a crash
            failed.append(f"seed {seed}: {type(e).__name__}: {str(e)[:200]}")
            continue
        n, n_bad = n + u, n_bad + b
    return n, n_bad, failed


def value_campaign(n_traces: int, backend: str) -> bool:
    """`n_traces` of the suite's generator; True when every one holds."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st
    from test_backend_incremental import VARIANTS, check_incremental, value_traces

    seen = {"traces": 0, "ubatches": 0, "bad": 0}
    t0 = time.perf_counter()

    @settings(max_examples=n_traces, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(t=value_traces(), engine=st.sampled_from(sorted(VARIANTS)),
           core=st.sampled_from(["reference", "compiled"]))
    def each(t, engine: str, core: str) -> None:
        n, n_bad = check_incremental(t, VARIANTS[engine], core, backend)
        seen["traces"] += 1
        seen["ubatches"] += n
        seen["bad"] += n_bad > 0

    failure = ""
    try:
        each()
    except Exception as e:  # hypothesis re-raises the (shrunk) failing example's error
        failure = f"{type(e).__name__}: {str(e)[:400]}"
    print(f"value_traces: {seen['traces']} traces, {seen['ubatches']:,} ubatches, "
          f"{seen['bad']} traces reaching a bad pool, {1 if failure else 0} failures, "
          f"{time.perf_counter() - t0:.0f} s", flush=True)
    if failure:
        print(f"  {failure}")
    return not failure


def main() -> int:
    from kpool_cli.versions import VERSIONS

    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--value-traces", type=int, default=10000)
    ap.add_argument("--traces", type=int, default=10000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--backend", choices=("numpy", "numba"), default="numpy")
    a = ap.parse_args()
    failed = not value_campaign(a.value_traces, a.backend) if a.value_traces else False
    seeds = list(range(a.seed, a.seed + a.traces))
    for version in VERSIONS if a.traces else ():
        for core in ("reference", "compiled"):
            t0 = time.perf_counter()
            parts = chunked(_chunk, (version, core, a.backend), seeds, 100, a.jobs)
            n = sum(p[0] for p in parts)
            n_bad = sum(p[1] for p in parts)
            bad = [f for p in parts for f in p[2]]
            print(f"{version} {core}: {a.traces} traces (seeds {a.seed}..{a.seed + a.traces - 1}),"
                  f" {n:,} ubatches, {n_bad:,} with a bad pool, {len(bad)} failures, "
                  f"{time.perf_counter() - t0:.0f} s", flush=True)
            failed |= told(bad)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
