"""Host work per speculative step: the cells the layout update scans (the engine's own
cost counter, `cells_scanned`, docs/ENGINE.md §8) per MTP step after the prompt, for
each engine version, at several context sizes.

Each trace is made by `kpool gen speculative` (one slot, a prompt of CONTEXT tokens,
then steps of the last token and D drafts; `--accept` drafts accepted per step, `--trim
1`: the tail removed after every step, the empty one of a fully accepted draft too, as
llama-server's loop does) and replayed model-only, the way a user does:

    kpool gen speculative --prompt CONTEXT --draft 3 --accept 3 --trim 1 --steps 64 -o T
    kpool replay T --engine E --backend none --format json -o REPORT -q

A step's cells are the sum of `cost.cells_scanned` over the ubatches of that step's
decode (the ops after the prompt). Prints a table: context, engine, cells scanned per
step (mean), and the ratio to the first engine.

    python benchmarks/host_work.py [--contexts 10240,32768,81920] [--accept 3]
        [--engines rep-once,rep-once+noop-seq-rm,...] [--steps 64]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ENGINES = ("rep-once", "rep-once+noop-seq-rm", "tail-truncate", "cache-safe",
           "cache-safe+noop-seq-rm", "cache-safe+tail-truncate")


def kpool(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "kpool_cli", *args], check=True)


def per_step(report: Path) -> float:
    """Mean cells scanned per step: the ubatches of every decode op after the first."""
    doc = json.loads(report.read_text())
    by_op: dict[int, int] = {}
    for u in doc["ubatches"]:
        by_op[u["op"]] = by_op.get(u["op"], 0) + u["cost"]["cells_scanned"]
    steps = [n for op, n in by_op.items() if op > 0]
    return sum(steps) / len(steps)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--contexts", default="10240,32768,81920")
    ap.add_argument("--engines", default=",".join(ENGINES))
    ap.add_argument("--draft", type=int, default=3)
    ap.add_argument("--accept", type=int, default=3, help="-1: a random prefix")
    ap.add_argument("--steps", type=int, default=64)
    a = ap.parse_args()
    engines = a.engines.split(",")
    print(f"{'context':>8}  {'engine':<26} {'cells/step':>12}  {'x ' + engines[0]:>14}")
    with tempfile.TemporaryDirectory() as tmp:
        for ctx in (int(c) for c in a.contexts.split(",")):
            t = Path(tmp) / f"spec-{ctx}.yaml"
            kpool("gen", "speculative", "--prompt", str(ctx), "--draft", str(a.draft),
                  "--accept", str(a.accept), "--trim", "1", "--steps", str(a.steps),
                  "-o", str(t))
            first = None
            for e in engines:
                r = Path(tmp) / f"r-{ctx}-{e}.json"
                kpool("replay", str(t), "--engine", e, "--backend", "none", "--format",
                      "json", "-o", str(r), "-q", "--fail-on", "never")
                n = per_step(r)
                first = n if first is None else first
                print(f"{ctx:>8}  {e:<26} {n:>12,.1f}  {n / first:>13.4f}x", flush=True)


if __name__ == "__main__":
    main()
