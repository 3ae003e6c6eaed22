"""The reference campaign: kpool's replay against both from-scratch references on
random traces of kpool_cli.gen.random_trace (every op, unified and non-unified
caches, the recurrent child, decodes larger than their stream, whole-range seq_rm of
every sequence), per engine version:

- tests/ref_cache.py (ENGINE.md §2-§4, with its own §5 layout), record by record and
  the state after each (`test_cache_reference.compare`), under rep-once, cache-safe
  and angt-f46848f (the versions it models);
- tests/reference.py (ENGINE.md §5-§7), ubatch by ubatch
  (`test_reference_agreement.check_agreement`), under all four versions
  (tail-truncate and angt-f46848f with rep-once's marking rules, as
  docs/versions.md says).

    python tests/campaign_reference.py --traces 10000 [--seed 0] [--jobs 2]

prints one line per version (traces, divergences, ubatches compared, the corners
reached) and exits 1 on any divergence, naming the seeds. docs/testing.md gives the
last result; tests/test_reference_campaign.py runs 500 traces of it in the suite.
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

# version -> the §2-§4 reference's versions for it (test_cache_reference.REF_VERSIONS)
VERSIONS = {"rep-once": ("rep-once",), "cache-safe": ("cache-safe",),
            "tail-truncate": (), "angt-f46848f": ("angt-f46848f",)}
# the §5-§7 reference's marking rules for a version that is not one of its own
RULES = {"tail-truncate": "rep-once", "angt-f46848f": "rep-once"}

# what the random traces must reach, per version, for a campaign to mean something
CORNERS = ("decode of more tokens than the stream has cells",
           "recurrent seq_rm of every sequence accepted",
           "recurrent find_slot asserts on a dangling tail")
# and what a version's own rules must reach
VERSION_CORNERS = {"angt-f46848f": ("seq_keep that empties another stream",)}


def corners_of(version: str) -> tuple[str, ...]:
    """What the random traces must reach under `version` (none where the §2-§4
    reference does not run)."""
    return (CORNERS + VERSION_CORNERS.get(version, ())) if VERSIONS[version] else ()


def run_one(version: str, seed: int) -> tuple[str | None, Counter]:
    """One random trace under one version through both references: (the divergence
    or None, what the §2-§4 reference saw)."""
    from test_cache_reference import compare
    from test_reference_agreement import check_agreement

    from kpool_cli.gen.random_trace import random_trace

    t = random_trace(seed)
    seen: Counter = Counter()
    try:
        for engine in VERSIONS[version]:
            compare(t, engine, seen)
        counts = check_agreement(t, version, RULES.get(version))
        seen["ubatches compared (§5-§7)"] += counts.get("ubatches", 0)
    except AssertionError:
        return f"seed {seed}: {traceback.format_exc(limit=1).strip().splitlines()[-1]}", seen
    return None, seen


def _chunk(args: tuple[str, list[int]]) -> tuple[list[str], Counter]:
    version, seeds = args
    bad: list[str] = []
    seen: Counter = Counter()
    for s in seeds:
        why, got = run_one(version, s)
        seen.update(got)
        if why is not None:
            bad.append(why)
    return bad, seen


def campaign(version: str, n: int, seed: int, jobs: int) -> tuple[list[str], Counter]:
    seeds = list(range(seed, seed + n))
    chunks = [(version, seeds[i::jobs * 8]) for i in range(jobs * 8)]
    bad: list[str] = []
    seen: Counter = Counter()
    results = map(_chunk, chunks) if jobs == 1 else ProcessPoolExecutor(jobs).map(_chunk, chunks)
    for b, s in results:
        bad += b
        seen.update(s)
    return sorted(bad), seen


def main() -> int:
    from campaign import told

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--traces", type=int, default=10_000, help="random traces per version")
    ap.add_argument("--seed", type=int, default=0, help="the first seed")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--version", action="append", choices=sorted(VERSIONS))
    a = ap.parse_args()
    failed = False
    for version in a.version or list(VERSIONS):
        t0 = time.perf_counter()
        bad, seen = campaign(version, a.traces, a.seed, a.jobs)
        corners = ", ".join(f"{c} {seen[c]:,}" for c in corners_of(version))
        print(f"{version}: {a.traces:,} traces (seeds {a.seed}..{a.seed + a.traces}), "
              f"{len(bad)} divergences, {seen['ubatches compared (§5-§7)']:,} ubatches "
              f"compared, {seen['ubatch']:,} records held to ref_cache"
              + (f"; {corners}" if corners else "")
              + f" ({time.perf_counter() - t0:.0f} s)")
        failed |= told(bad)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
