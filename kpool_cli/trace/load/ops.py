"""The walk of the ops list, and of the ops in general (TRACE_FORMAT.md "Trace";
ENGINE.md §2 for what they do): the ops read by their declared fields alone (the
edits `seq_rm`, `seq_cp`, `seq_keep`, `seq_add`, `seq_div`, `state_drop`, and
`clear`), `note`, `expect`, and the state ops `state_write` and `state_read`. A
decode is `decode`'s.

Owns: `OpsWalk`, `FINDING_CODE`.

Invariants:
- At most `MAX_OPS` ops (the composer's bound, checked again: an alias of a list,
  or the composer's bound lifted); an op item is a mapping with exactly one key, a
  known op name; an op with rules of its own is read by its `op_<name>` method (of
  any section), any other by its declared fields, those left out taking their
  declared defaults.
- Every `expect` follows some op other than `note`/`expect`; its findings are
  codes `KP` + 3 digits and its pools `[seq, k]` or `{seq, k}`, each listed once;
  its status is one of `OP_STATUSES`.
- Every `state_read` names a slot written by an earlier `state_write` (a slot is
  written even if its op is otherwise wrong: no cascade of problems).
- A position bound (`p0`, `p1`) is a position >= 0, or -1 for no bound.
- An op line the composer made of the text (`OpMap`) in a plain form is read in one
  step from its texts (`plain_op`: an op with rules of its own by its `line_<name>`
  method, the others by their declared ints, `FieldReader.plain_bounds`), with the
  same op, count and nodes visited as the walk field by field
  (tests/test_load_fast.py); anything else is read the general way.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from kpool_cli.trace.format import BOUND, DECODE_FORMS, OP_STATUSES, OPS, POOL, SLOT, Section
from kpool_cli.trace.model import OP_TYPES, Decode, Loc, Note, Op, StateRead, StateWrite
from kpool_cli.trace.yaml_safe import (
    INT,
    MAP,
    STR,
    Map,
    Node,
    OpMap,
    Scalar,
    clip,
    decimal_int,
    describe,
    limits,
    quote,
)

from ...wording import suggest
from .decode import plain_token_of
from .fields import FieldReader, static_bounds

# the nodes the walk visits in an op item besides its mapping's pairs (a key and a
# value each): the item, its key, the mapping (`OpsWalk.plain_decode`, `plain_op`)
_OP_VISITS = 3
_PLAIN_DECODE_VISITS = _OP_VISITS + 2 * 2

FINDING_CODE = re.compile(r"KP[0-9]{3}", re.ASCII)


class OpsWalk(FieldReader):
    """The ops list and every op but a decode's own rules."""

    def ops(self, node: Node) -> tuple[Op, ...] | None:
        items = self.list_(node, "ops")
        if items is None:
            return None
        if len(items) > limits.MAX_OPS:  # an alias of a list, or the composer's bound lifted
            self.fatal(
                items[limits.MAX_OPS], f"ops[{limits.MAX_OPS}]",
                f"more than {limits.MAX_OPS:,} ops in the trace: refusing it"
                " (the bound on its ops)",
            )
        before = len(self.problems)
        out: list[Op] = []
        after_op = False  # some op other than note/expect came before
        for i, item in enumerate(items):
            f = f"ops[{i}]"
            name, op = self.op(item, f)
            if name == "expect" and not after_op:
                self.problem(
                    item, f,
                    "expect has no op before it (it checks the previous op; notes do not count)",
                )
            elif name is not None and name not in ("note", "expect"):
                after_op = True
            if op is not None:
                out.append(op)
        return tuple(out) if len(self.problems) == before else None

    def op(self, item: Node, f: str) -> tuple[str | None, Op | None]:
        """One item of `ops`: a mapping with exactly one key, the op name. Returns the
        op name when it is a known one (even if the op is invalid) and the op. A plain
        decode step is read in one step (`plain_decode`), and so is an op line of a
        plain form (`plain_op`)."""
        if item.__class__ is OpMap:
            line = self.plain_op(item)
            if line is not None:
                return line
        else:
            plain = self.plain_decode(item)
            if plain is not None:
                return "decode", plain
        if not self.visit(item, f):
            return None, None
        if not isinstance(item, Map):
            msg = (f"an op is a mapping with one key, the op name (`- seq_rm: {{seq: 0}}`),"
                   f" got {describe(item)}")
            if isinstance(item, Scalar) and item.tag == STR and item.value in OPS:
                # `- clear`: the op's name alone, its value left out
                form = DECODE_FORMS[0] if item.value == "decode" else OPS[item.value]
                msg += f": write `- {item.value}: {form.skeleton}`"
            self.problem(item, f, msg)
            return None, None
        if not item.value:
            self.problem(item, f, "empty op: expected one key, the op name")
            return None, None
        if len(item.value) > 1:
            names = ", ".join(
                clip(k.value, 20) if isinstance(k, Scalar) else describe(k)
                for k, _ in item.value[:4]
            ) + (", ..." if len(item.value) > 4 else "")
            self.problem(
                item.value[1][0], f,
                f"an op item has exactly one key, the op name; this one has {len(item.value)}"
                f" ({names}): a missing '-'?",
            )
            return None, None
        key, value = item.value[0]
        if not self.visit(key, f):
            return None, None
        if not (isinstance(key, Scalar) and key.tag == STR):
            self.problem(key, f, f"expected an op name, got {describe(key)}")
            return None, None
        name = key.value
        if name not in OPS:
            self.problem(key, f, f"unknown op {quote(name)}{suggest(name, OPS)}")
            return None, None
        loc = Loc(self.file, item.line, item.column)
        build: Callable[[Node, str, Loc], Op | None] | None = getattr(self, f"op_{name}", None)
        if build is None:
            return name, self.op_fields(OPS[name], value, f"{f}.{name}", loc)
        return name, build(value, f"{f}.{name}", loc)

    def plain_decode(self, item: Node) -> Decode | None:
        """The decode of the ops item `item` when it is `- decode: {seq: S, pos: P}`
        (the keys in either order) with P and S plain decimal ints in range: its
        mapping is `plain_token_of`'s form, read in one step, and reading it field by
        field would cross no bound; None for any other item, which `op` reads the
        general way. Either way the decode, the tokens counted and the nodes
        visited (`_PLAIN_DECODE_VISITS`) are the same (tests/test_load_fast.py): a
        decode step a generator writes, not a rule."""
        if (item.__class__ is not Map or item.tag != MAP or len(item.value) != 1
                or self.n_tokens + 1 > self.max_tokens
                or self.visits + _PLAIN_DECODE_VISITS > self.node_limit):
            return None
        ((key, value),) = item.value
        if key.__class__ is not Scalar or key.tag != STR or key.value != "decode":
            return None
        token = plain_token_of(value, self.seq_hi())
        if token is None:
            return None
        self.n_tokens += 1
        self.visits += _PLAIN_DECODE_VISITS
        return Decode(tokens=(token,), loc=Loc(self.file, item.line, item.column))

    def plain_op(self, item: OpMap) -> tuple[str, Op] | None:
        """(its name, the op) of the op line `item` (the composer's `OpMap`) when it is
        a plain form a generator writes, read in one step from its texts: an op with
        rules of its own by its `line_<name>` method (a decode's `line_decode`), any
        other read by its declared fields alone (`op_fields`) when each is there at
        most once, the required ones are, and each value is a plain decimal int
        within its field's bounds (`plain_bounds`). None for any other line, which
        `op` reads the general way, and when reading it so would cross the bound on
        nodes visited. Either way the op, the tokens counted and the nodes visited
        are the same (tests/test_load_fast.py)."""
        name, fields = item.name, item.fields
        visits = _OP_VISITS + 2 * len(fields)
        if (item.name_tag != STR or name not in OPS
                or self.visits + visits > self.node_limit):
            return None
        loc = Loc(self.file, item.line, item.column)
        line: Callable[[tuple[tuple[str, str, str, str], ...], Loc], Op | None] | None = (
            getattr(self, f"line_{name}", None))
        if line is not None:
            op = line(fields, loc)
        elif hasattr(self, f"op_{name}"):
            return None
        else:
            op = self.plain_fields(OPS[name], fields, loc)
        if op is None:
            return None
        self.visits += visits
        return name, op

    def plain_fields(self, op: Section, fields: tuple[tuple[str, str, str, str], ...],
                     loc: Loc) -> Op | None:
        """`op_fields` of an op line's texts when each is its field's plain decimal
        int (`plain_op`); None otherwise."""
        got: dict[str, object] = {}
        for key, key_tag, value, value_tag in fields:
            if key_tag != STR or value_tag != INT or key not in op or key in got:
                return None
            bounds = self.plain_bounds(op[key])
            v = decimal_int(value)
            if bounds is None or v is None or not bounds[0] <= v <= bounds[1]:
                return None
            got[key] = v
        if any(k not in got for k in op.required):
            return None
        return OP_TYPES[op.name](loc=loc, **{**op.defaults, **got})

    def op_fields(self, op: Section, node: Node, f: str, loc: Loc) -> Op | None:
        """An op that is a mapping of its declared fields, each read by its type; the
        fields left out take their declared defaults."""
        d = self.fields(node, f, {
            fld.name: (fld.required, self.reader(fld)) for fld in op.fields
        }, null_ok=op.body == "empty")
        return None if d is None else OP_TYPES[op.name](loc=loc, **{**op.defaults, **d})

    def p_bound(self, node: Node, field: str) -> int | None:
        v = self.int_(node, field)
        if v is None:
            return None
        lo, hi = static_bounds(BOUND)
        if not lo <= v <= hi:
            self.problem(node, field, f"out of range: {v} (a position >= 0, or -1 for no bound)")
            return None
        return v

    # -- the ops read by code of their own (the others: `op_fields`; ENGINE.md §2 for
    # what they do)

    def slot(self, node: Node, field: str) -> str | None:
        return self.str_(node, field, nonempty=SLOT.nonempty)

    def op_state_write(self, node: Node, f: str, loc: Loc) -> Op | None:
        before = len(self.problems)
        m = self.map_(node, f, OPS["state_write"].names, OPS["state_write"].required)
        if m is None:
            return None
        seq = self.seq_id(m["seq"], f"{f}.seq") if "seq" in m else None
        slot = self.slot(m["slot"], f"{f}.slot") if "slot" in m else None
        if slot is not None:  # written even if the op is otherwise wrong: no cascade
            self.slots.add(slot)
        if len(self.problems) != before or seq is None or slot is None:
            return None
        return StateWrite(seq=seq, slot=slot, loc=loc)

    def op_state_read(self, node: Node, f: str, loc: Loc) -> Op | None:
        before = len(self.problems)
        m = self.map_(node, f, OPS["state_read"].names, OPS["state_read"].required)
        if m is None:
            return None
        seq = self.seq_id(m["seq"], f"{f}.seq") if "seq" in m else None
        slot = self.slot(m["slot"], f"{f}.slot") if "slot" in m else None
        if slot is not None and slot not in self.slots:
            self.problem(
                m["slot"], f"{f}.slot",
                f"slot {quote(slot)} is not written by an earlier state_write"
                f"{suggest(slot, self.slots)}",
            )
        if len(self.problems) != before or seq is None or slot is None:
            return None
        return StateRead(seq=seq, slot=slot, loc=loc)

    def op_note(self, node: Node, f: str, loc: Loc) -> Op | None:
        text = self.str_(node, f)
        return None if text is None else Note(text=text, loc=loc)

    def findings(self, node: Node, field: str) -> tuple[str, ...] | None:
        items = self.list_(node, field, "a list of finding codes")
        if items is None:
            return None
        out: list[str] = []
        ok = True
        for i, it in enumerate(items):
            fi = f"{field}[{i}]"
            code = self.str_(it, fi)
            if code is None:
                ok = False
            elif not FINDING_CODE.fullmatch(code):
                self.problem(
                    it, fi, f"not a finding code: {quote(code)} (codes are KP001, KP002, ...)"
                )
                ok = False
            elif code in out:
                self.problem(it, fi, f"finding {code} is listed twice")
                ok = False
            else:
                out.append(code)
        return tuple(out) if ok else None

    def pools(self, node: Node, field: str) -> tuple[tuple[int, int], ...] | None:
        items = self.list_(node, field, "a list of pools ([seq, k] or {seq, k})")
        if items is None:
            return None
        out: list[tuple[int, int]] = []
        ok = True
        for i, it in enumerate(items):
            fi = f"{field}[{i}]"
            pool = self.pool(it, fi)
            if pool is None:
                ok = False
            elif pool in out:
                self.problem(it, fi, f"pool {list(pool)} is listed twice")
                ok = False
            else:
                out.append(pool)
        return tuple(out) if ok else None

    def pool(self, node: Node, field: str) -> tuple[int, int] | None:
        """A pool of `expect.pools`: {seq, k} (`POOL`) or [seq, k]."""
        k_ = self.reader(POOL["k"])
        if isinstance(node, Map):
            d = self.fields(node, field, {
                f.name: (f.required, self.reader(f)) for f in POOL.fields
            })
            return None if d is None else (d["seq"], d["k"])
        items = self.list_(node, field, "a pool: [seq, k] or {seq, k}")
        if items is None:
            return None
        if len(items) != 2:
            self.problem(node, field, f"a pool is [seq, k], got {len(items)} values")
            return None
        s = self.seq_id(items[0], f"{field}[0]")
        k = k_(items[1], f"{field}[1]")
        return None if s is None or k is None else (s, k)

    def status(self, node: Node, field: str) -> str | None:
        v = self.str_(node, field)
        if v is not None and v not in OP_STATUSES:
            self.problem(
                node, field,
                f"unknown status {quote(v)}{suggest(v, OP_STATUSES)}"
                f" (one of {', '.join(OP_STATUSES)})",
            )
            return None
        return v
