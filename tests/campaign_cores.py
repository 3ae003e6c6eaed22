"""The cores campaign: the compiled core against the reference core on random traces
of kpool_cli.gen.random_trace (speculative removals, the recurrent child, unified
and non-unified caches, coupled sequences, spans, every edit), under every engine
version, record by record (`fuzz.run_checked`, which `kpool fuzz` runs too).

    python tests/campaign_cores.py --traces 10000 [--seed 0] [--jobs 2] [--backend none]

prints one line per version (traces, differences, exceptions, seconds) and exits 1
on any, naming the seeds. The README gives the last result; tests/test_cores.py runs
500 traces of it in the suite.
"""

from __future__ import annotations

import argparse
import sys
import time

from campaign import chunked, told


def _chunk(args: tuple[str, str, list[int]]) -> list[str]:
    from kpool_cli.gen import fuzz
    from kpool_cli.gen.random_trace import random_trace

    version, backend, seeds = args
    bad = []
    for seed in seeds:
        _, defects, _ = fuzz.run_checked(random_trace(seed), version, backend)
        bad += [f"seed {seed}: {d[2]}" for d in defects
                if d[0] in (fuzz.INV_CORE, fuzz.INV_CRASH)]
    return bad


def main() -> int:
    from kpool_cli.versions import VERSIONS

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--traces", type=int, default=10000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--backend", choices=("none", "numpy", "numba"), default="none")
    a = ap.parse_args()
    failed = False
    for version in VERSIONS:
        t0 = time.perf_counter()
        seeds = list(range(a.seed, a.seed + a.traces))
        bad = [b for part in chunked(_chunk, (version, a.backend), seeds, 250, a.jobs)
               for b in part]
        print(f"{version}: {a.traces} traces (seeds {a.seed}..{a.seed + a.traces - 1}, "
              f"backend {a.backend}), {len(bad)} differences or exceptions, "
              f"{time.perf_counter() - t0:.0f} s", flush=True)
        failed |= told(bad)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
