"""The suite's warm-up of numba's on-disk cache (tests/conftest.py `pytest_configure`):
a replay of a few shipped traces under both engines, which compiles every kernel
it calls into the cache, or loads it from there, and the JSON writer's listing
kernels (`warm_listings`), which a report's writer calls.

Run as a script (`python tests/warm_numba.py`), it warms the compiled core's
kernels alone (model only), which the controller runs in a child while it warms the
value backend's itself. The two must stay disjoint: numba updates a function's
cache index without a lock, so two processes adding signatures of the same kernel
at once could each claim the same file. A model-only replay calls no value kernel
(kpool_cli/backend/), and a replay on the reference core no kernel of the compiled
core (kpool_cli/compiled/).
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from kpool_cli.backend.store import make_backend
from kpool_cli.replay import replay
from kpool_cli.trace.load import load_trace
from kpool_cli.versions import registered

TRACES = ("shared-prefix-race", "coupled-rep-conflict", "mrope-images", "non-unified",
          "mtp3-speculative")


def warm(backend: str | None, core: str) -> None:
    """Replay TRACES under cache-safe and rep-once on `core` with the value backend
    `backend` (None: model only)."""
    root = Path(__file__).resolve().parent.parent / "traces"
    for name in TRACES:
        trace = load_trace(root / f"{name}.yaml")
        for engine in ("cache-safe", "rep-once"):
            values = None if backend is None else make_backend(backend, trace)
            for _ in replay(trace, registered(engine), values, core=core):
                pass


def warm_listings() -> None:
    """The JSON writer's listing kernels (kpool_cli/report/json_kernels.py), which a
    report's writer calls, not the replay: each once, on three pools (one run),
    their scatter entries and three tokens."""
    import numpy as np

    from kpool_cli.contracts.records import Pools
    from kpool_cli.report import json_kernels
    from kpool_cli.report.json_report import pools_text, scatter_text, tokens_text

    n = 3
    cells = np.arange(4 * n, dtype=np.int64).reshape(n, 4)
    ks = np.arange(n, dtype=np.int64)
    pools = Pools(np.zeros(n, dtype=np.int64), ks, 4 * ks, 4 * ks + 3, cells, cells[:, -1].copy(),
                  np.ones(n, dtype=bool))
    pools_text(json_kernels, pools, 4, None)
    entries = SimpleNamespace(scatter_rows=cells, scatter_rep=pools.rep,
                              scatter_pad=np.zeros(n, dtype=bool), scatter_spans=None)
    scatter_text(json_kernels, entries, 4)  # the fields of a record it reads
    tokens = SimpleNamespace(token_pos=ks, token_seqs=((0,),) * n, token_rows=ks, token_ext=None)
    tokens_text(json_kernels, tokens)


if __name__ == "__main__":
    warm(None, "compiled")
