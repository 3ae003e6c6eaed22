"""The walk of the cache block (TRACE_FORMAT.md "Trace", ENGINE.md §2).

Owns: `CacheWalk`, the reading of `cache:` into a `CacheConfig`.

Invariants:
- Every key is read by its declared field (`trace.format`'s `CACHE`), the ones left
  out taking their declared defaults; `kpool <= kv_size`.
- The values that parse are recorded in `lim` (`fields.CacheLimits`) even if the
  block as a whole is wrong, so that the ops are still checked against them.
"""

from __future__ import annotations

from typing import Any

from kpool_cli.trace.format import CACHE
from kpool_cli.trace.model import CacheConfig, context_batch, context_cells
from kpool_cli.trace.yaml_safe import Node

from .fields import CacheLimits, FieldReader


class CacheWalk(FieldReader):
    """The cache block, read before the ops."""

    def cache(self, node: Node) -> CacheConfig | None:
        """TRACE_FORMAT.md "Trace" (cache block) and ENGINE.md §2. Records the values
        that parse in `self.lim` even if the block as a whole is wrong, so that the
        ops are still checked against them."""
        f = "cache"
        before = len(self.problems)
        m = self.map_(node, f, CACHE.names, CACHE.required)
        if m is None:
            return None
        kv = self.value(CACHE["kv_size"], m["kv_size"], "cache.kv_size") if "kv_size" in m else None
        kpool = None
        if "kpool" in m:
            kpool = self.value(CACHE["kpool"], m["kpool"], "cache.kpool")
            if kpool is not None and kv is not None and kpool > kv:
                self.problem(
                    m["kpool"], "cache.kpool",
                    f"out of range: kpool {kpool} is larger than cache.kv_size ({kv})",
                )
                kpool = None
        vals: dict[str, Any] = {
            fld.name: self.value(fld, m[fld.name], f"cache.{fld.name}") if fld.name in m
            else fld.default
            for fld in CACHE.fields if not fld.required
        }
        given = n_ubatch = vals["n_ubatch"]
        if n_ubatch is not None and kv is not None and None not in (
                vals["unified"], vals["n_seq_max"]):
            # a recorded ubatch is at most the context's n_ubatch
            n_ctx = context_cells(kv, vals["unified"], vals["n_seq_max"])
            n_ubatch = context_batch(vals["n_batch"], n_ubatch, n_ctx)[1]
        self.lim = CacheLimits(
            n_seq_max=vals["n_seq_max"], kv_size=kv, unified=vals["unified"],
            by_order=vals["by_order"], n_ubatch=n_ubatch, n_ubatch_capped=n_ubatch != given,
            n_seq_max_set="n_seq_max" in m,
        )
        if len(self.problems) != before or kv is None or kpool is None:
            return None
        cfg = CacheConfig(kv_size=kv, kpool=kpool, **vals)
        return cfg
