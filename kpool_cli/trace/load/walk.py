"""The walk of format v1 from the root node: the top level, and the walker made of
the sections of the walk (`cache`, `ops`, `decode`, on `fields`).

Owns: `_Walker` (a `Trace` from the root node, or problems), `_READ`, how the
walk reads a field of each declared type (`trace.format`).

Invariants:
- The version is read first: a trace of another version gets one problem, which
  says that nothing else was checked. What a trace may hold is its version's (this
  kpool knows format v1 alone): v1's rules would word a newer format's fields as
  errors, and an older one's as well, so the rest is not checked against them.
- The cache block is read before the ops, so the ops are checked against its
  values.
- The trace's default engine, and an expect's, is a registered version only
  (`versions.named_by_data`, the one wording of why not), read at its value and kept
  as the version's name (`a + b` is `a+b`, what a run under it is named): a trace is
  data and runs no code, so a plug-in (`module:Name`) is taken from `--engine` alone.
- A `Trace` is returned only when no problem was found.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kpool_cli.trace.format import BOUND, FORMAT_VERSION, TOP, Field
from kpool_cli.trace.model import Trace
from kpool_cli.trace.yaml_safe import STR, Map, Node, Parse, Scalar
from kpool_cli.versions import named_by_data, registered

from .cache import CacheWalk
from .decode import DecodeWalk
from .fields import static_bounds
from .ops import OpsWalk


class _Walker(CacheWalk, OpsWalk, DecodeWalk):
    """The walk of format v1: a `Trace` from the root node, or problems."""

    # -- the trace

    def trace(self, root: Node, sha256: str) -> Trace | None:
        if isinstance(root, Map):  # the version first: a v2 trace gets one problem
            for k, v in root.value:
                if isinstance(k, Scalar) and k.tag == STR and k.value == "kpool_trace":
                    self.version(v)
                    break
        top = self.map_(root, "", TOP.names, TOP.required)
        if top is None:
            return None
        before = len(self.problems)
        cache = self.cache(top["cache"]) if "cache" in top else None
        vals: dict[str, Any] = {
            k: self.value(TOP[k], top[k], k) if k in top else TOP[k].default
            for k in ("name", "description", "seed")
        }
        engine = self.value(TOP["engine"], top["engine"], "engine") if "engine" in top else None
        ops = self.ops(top["ops"]) if "ops" in top else None
        if len(self.problems) != before or cache is None or ops is None:
            return None
        assert None not in vals.values()
        return Trace(cache=cache, ops=ops, engine=engine, path=self.file, sha256=sha256, **vals)

    def engine(self, node: Node, path: str) -> str | None:
        """An engine version a trace names (its default `engine`, an expect's
        `engine`): a registered version only (`versions.named_by_data`), read as the
        version's own name (`rep-once + noop-seq-rm` is `rep-once+noop-seq-rm`), the
        name the runs under it carry, which an expect is matched against."""
        name = self.str_(node, path, nonempty=True)
        if name is None:
            return None
        why = named_by_data(name, "a trace")
        if why is None:
            return registered(name).name
        self.problem(node, path, why)
        return None

    def version(self, node: Node) -> None:
        v = self.int_(node, "kpool_trace")
        if v is not None and v != FORMAT_VERSION:
            # Nothing else is checked: another version's fields would only add noise.
            self.fatal(
                node, "kpool_trace",
                f"unsupported format version {v}, this kpool reads {FORMAT_VERSION}: the "
                "rest of the trace was not checked, since what a trace may hold depends "
                "on its version",
            )

    # -- a declared field, by its type (`_READ`)

    def value(self, fld: Field, node: Node, path: str) -> Any:
        """`node` read as the declared field `fld`: by its type, within its bounds."""
        return _READ[fld.type.name](self, fld, node, path)

    def reader(self, fld: Field) -> Parse:
        read = _READ[fld.type.name]
        return lambda node, path: read(self, fld, node, path)

    def plain_bounds(self, fld: Field) -> tuple[int, int] | None:
        """FieldReader.plain_bounds, by the field's type (`_PLAIN_BOUNDS`)."""
        bounds = _PLAIN_BOUNDS.get(fld.type.name)
        return None if bounds is None else bounds(self, fld)


# How the walk reads a field of each declared type (`trace.format`): the checks that
# depend on the cache are in the readers of seq ids and cells.
_READ: dict[str, Callable[[_Walker, Field, Node, str], Any]] = {
    "int": lambda w, f, n, p: w.int_(n, p, f.lo, f.hi, f.hint),
    "engine": lambda w, f, n, p: w.engine(n, p),
    "bool": lambda w, f, n, p: w.bool_(n, p),
    "str": lambda w, f, n, p: w.str_(n, p, nonempty=f.type.nonempty),
    "seq": lambda w, f, n, p: w.seq_id(n, p),
    "seq_or_all": lambda w, f, n, p: w.seq_any(n, p),
    "seq_set": lambda w, f, n, p: w.seq_set(n, p),
    "pos": lambda w, f, n, p: w.pos(n, p),
    "positions": lambda w, f, n, p: w.positions(n, p),
    "ext": lambda w, f, n, p: w.ext(n, p),
    "cell": lambda w, f, n, p: w.cell(n, p),
    "bound": lambda w, f, n, p: w.p_bound(n, p),
    "slot": lambda w, f, n, p: w.slot(n, p),
    "findings": lambda w, f, n, p: w.findings(n, p),
    "pools": lambda w, f, n, p: w.pools(n, p),
    "status": lambda w, f, n, p: w.status(n, p),
}

# Of the types `_READ` reads as ints, the bounds within which its reader takes a plain
# decimal int as it is (the op lines' one step, ops.py `OpsWalk.plain_op`): an int's
# declared bounds, a seq id's below the cache's n_seq_max (and -1 where it may be
# every sequence), a position bound's.
_PLAIN_BOUNDS: dict[str, Callable[[_Walker, Field], tuple[int, int] | None]] = {
    "int": lambda w, f: None if f.lo is None or f.hi is None else (f.lo, f.hi),
    "seq": lambda w, f: (0, w.seq_hi()),
    "seq_or_all": lambda w, f: (-1, w.seq_hi()),
    "bound": lambda w, f: static_bounds(BOUND),
}
