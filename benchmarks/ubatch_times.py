"""Per-ubatch times inside one process: what a change does to the ubatches it aims
at, free of startup, load and the machine's moves between processes.

Runs `kpool replay ARGS...` in this process (the CLI's own collector thresholds, no
signal handlers) with a timer around each ubatch (`Replayer._ubatch`, which leaves
out the report's writing) and, with `--time MODULE:QUALNAME`, around any function or
method it names. Prints the whole command's wall time, the sum of the ubatches'
times, and each timed part's mean (or `--median`) per call and its count of calls,
grouped by the ubatch's index modulo `--every` (W4's slot 0 changes the plan every
fourth ubatch: `--every 4` sets that ubatch apart from the three others; `--skip 40`
leaves out its prefill; a call before the first ubatch, the trace's load say, is
filed nowhere). Two commits compared: run it with each on
PYTHONPATH in turn, a few times, and read a bucket against another of the same run.

    python benchmarks/ubatch_times.py [--every 4] [--time kpool_cli.report.json_report:ubatch_json]
        -- replay TRACE --engine cache-safe --core compiled --format json -o REPORT -q
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import gc
import importlib
import statistics
import sys
import time
from collections.abc import Callable


def _timed(owner: object, name: str, label: str, at: Callable[[], int | None],
           spent: dict[tuple[str, int], list[float]]) -> None:
    """Replace `owner.name` with a timer that files each call's time under (label,
    the current ubatch's bucket), or nowhere when `at()` is None."""
    fn = getattr(owner, name)

    def timer(*args, **kwargs):  # type: ignore[no-untyped-def]
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            bucket = at()
            if bucket is not None:
                spent[(label, bucket)].append(time.perf_counter() - t0)

    setattr(owner, name, timer)


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--every", type=int, default=4, help="group ubatches by index modulo this")
    ap.add_argument("--time", action="append", default=[], metavar="MODULE:QUALNAME",
                    help="also time this function or method (repeatable)")
    ap.add_argument("--median", action="store_true",
                    help="each part's median per call, not its mean: a part whose first call "
                         "loads a kernel (numba's on-disk cache, once a process) costs "
                         "that once, which a mean spreads over every call")
    ap.add_argument("--skip", type=int, default=0, metavar="N",
                    help="file no time of the first N ubatches (a prefill's), whose calls "
                         "would otherwise make up the whole of a bucket where the steady "
                         "state skips a part (a plan kept by identity)")
    ap.add_argument("kpool", nargs=argparse.REMAINDER, help="-- then kpool's arguments")
    a = ap.parse_args()
    args = a.kpool[1:] if a.kpool[:1] == ["--"] else a.kpool
    cli = importlib.import_module("kpool_cli.cli.main")
    replay = importlib.import_module("kpool_cli.replay")
    gc.set_threshold(*cli.GC_THRESHOLDS)
    spent: dict[tuple[str, int], list[float]] = collections.defaultdict(list)
    index = [-1]

    def at() -> int | None:
        return None if index[0] < a.skip else index[0] % a.every

    for spec in a.time:
        module, qual = spec.split(":")
        owner: object = importlib.import_module(module)
        *path, name = qual.split(".")
        for part in path:
            owner = getattr(owner, part)
        _timed(owner, name, qual, at, spent)
    ubatch = replay.Replayer._ubatch

    def counted(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        index[0] += 1
        return ubatch(self, *args, **kwargs)

    replay.Replayer._ubatch = counted
    _timed(replay.Replayer, "_ubatch", "ubatch", at, spent)
    t0 = time.perf_counter()
    with contextlib.suppress(SystemExit):  # a command's exit status: not ours to take
        cli.cli.main(args=args, prog_name="kpool", standalone_mode=False)
    wall = time.perf_counter() - t0
    total = sum(sum(spent[("ubatch", r)]) for r in range(a.every))
    kept = f" after the first {a.skip}" if a.skip else ""
    print(f"wall {wall:.2f} s, {index[0] + 1} ubatches, the sum of those{kept} {total:.2f} s")
    labels = dict.fromkeys(label for label, _ in spent)
    stat, name = (statistics.median, "median") if a.median else (statistics.fmean, "mean")
    head = f"{name} us per call, by ubatch index mod {a.every}"
    width = max(len(head), *map(len, labels))
    print(f"{head:{width}s}"
          + "".join(f" | {r:>9d}" for r in range(a.every)) + " |  calls")
    for label in labels:
        print(f"{label:{width}s}" + "".join(
            f" | {stat(spent[(label, r)]) * 1e6:9.1f}" if spent[(label, r)]
            else f" | {'-':>9s}" for r in range(a.every))
              + f" | {sum(len(spent[(label, r)]) for r in range(a.every)):6d}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
