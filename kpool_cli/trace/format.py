"""The trace format v1, declared once (TRACE_FORMAT.md, "Trace"): every section of a
trace file with its fields, each field's type, bounds, default and a line of doc.

Owns: the format's version and static bounds (`KV_SIZE_MAX`, `POS_LIMIT`, ...), the
value types (`Type`: `SEQ`, `POS`, `CELL`, ...), `Field`, `Section`, and the sections:
`TOP`, `CACHE`, `TOKEN`, the three forms of a decode (`DECODE_FORMS`), one section
per op (`OPS`, in TRACE_FORMAT.md's order), and `POOL` (an item of `expect.pools`).

What derives from it:
- `trace.load`: the keys each mapping may hold, which are required, every static
  bound it checks (from the field or its type) and every default it fills in;
  the checks that depend on the cache (seq ids below `n_seq_max`, cells below
  `kv_size`, `kpool <= kv_size`) and the decode-wide rules stay code there;
- `trace.schema.trace_schema`: property names, types, bounds, defaults and
  descriptions;
- `trace.write.dump_trace`: key order, and which arguments it leaves out (those equal
  to their default, unless the field is `always_written`);
- `trace.model.CacheConfig`: its defaults and `as_dict`;
- the loader's messages: an op written as its name alone is told its
  `Section.skeleton` (`- seq_keep: {seq: ...}`).

Invariants:
- a field is either required or has a default (`NO_DEFAULT` only on required fields);
- a field's `lo`/`hi` are those of its type unless the field narrows them;
- names are the format's public keys: add, never rename (TRACE_FORMAT.md);
- this module imports nothing of kpool: the model, the loader, the writer and the
  schema all import it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = [
    "CACHE",
    "COUNT_MAX",
    "DECODE_FORMS",
    "DECODE_KEYS",
    "FINDING_CODE_PATTERN",
    "FORMAT_VERSION",
    "INT32_MAX",
    "INT32_MIN",
    "KV_SIZE_MAX",
    "NO_DEFAULT",
    "N_EMBD_MAX",
    "N_RS_SEQ_MAX",
    "N_SEQ_MAX_MAX",
    "N_UBATCH_MAX",
    "OPS",
    "OP_STATUSES",
    "POOL",
    "POS_LIMIT",
    "SEED_MAX",
    "TOKEN",
    "TOP",
    "Field",
    "Section",
    "Type",
]

FORMAT_VERSION = 1

# --- static bounds ------------------------------------------------------------------

KV_SIZE_MAX = 2**24
N_SEQ_MAX_MAX = 256  # TRACE_FORMAT.md: n_seq_max "at most 256"
N_UBATCH_MAX = 2**20
N_BATCH_MAX = 2**31 - 1  # llama_context_params.n_batch: a uint32, bounded as positions
N_EMBD_MAX = 4096
N_RS_SEQ_MAX = 1024  # rollback snapshots per sequence (an MTP draft depth: a few)
POS_LIMIT = 2**31 - 2**20  # positions are < POS_LIMIT, so pos + n_ubatch fits an int32
INT32_MIN = -(2**31)
INT32_MAX = 2**31 - 1
SEED_MAX = 2**64 - 1
COUNT_MAX = 2**31 - 1  # expect.n_new / n_new_g / ubatch

OP_STATUSES = ("applied", "rejected", "aborted")  # what an op did (ENGINE.md §2)
FINDING_CODE_PATTERN = "^KP[0-9]{3}$"


class _NoDefault:
    """The default of a required field: there is none."""

    def __repr__(self) -> str:
        return "NO_DEFAULT"


NO_DEFAULT: object = _NoDefault()


@dataclass(frozen=True)
class Type:
    """A kind of value: `name` says how the loader reads it and which definition the
    schema uses; `lo`/`hi` are its static bounds (inclusive, None: unbounded); `hint`
    ends an out-of-range problem; `nonempty` is for strings."""

    name: str
    lo: int | None = None
    hi: int | None = None
    doc: str = ""
    hint: str = ""
    nonempty: bool = False


def int_type(lo: int | None = None, hi: int | None = None, hint: str = "") -> Type:
    """A plain int within [lo, hi]."""
    return Type("int", lo, hi, hint=hint)


VERSION = Type("version", FORMAT_VERSION, FORMAT_VERSION, "the format version")
BOOL = Type("bool")
STR = Type("str")
NONEMPTY_STR = Type("str", nonempty=True)
ENGINE = Type("engine", nonempty=True, doc="a registered engine version (the loader checks)")
SEQ = Type("seq", 0, N_SEQ_MAX_MAX - 1, "a seq id, below cache.n_seq_max")
SEQ_OR_ALL = Type("seq_or_all", -1, N_SEQ_MAX_MAX - 1, "a seq id, or -1: every sequence")
SEQ_SET = Type("seq_set", 0, N_SEQ_MAX_MAX - 1,
               "a token's sequences: one seq id or a list of distinct ones"
               " (the first is the one the token reads through)")
POS = Type("pos", 0, POS_LIMIT - 1, "a position", hint=" (positions are below 2**31 - 2**20)")
POSITIONS = Type("positions", 0, POS_LIMIT - 1,
                 "a position, a half-open range 'A..B' (A < B), or a list")
EXT = Type("ext", 0, POS_LIMIT - 1, "M-RoPE [x, y]; only with cache.by_order: true")
CELL = Type("cell", 0, KV_SIZE_MAX - 1,
            "a recorded placement: stream-local cell, below kv_size;"
            " every token of the decode has one, or none")
BOUND = Type("bound", -1, INT32_MAX, "a position, or -1 for no bound (the default)")
SLOT = Type("slot", nonempty=True, doc="a state slot's name")
FINDINGS = Type("findings", doc="finding codes (KP001, KP002, ...), each once")
POOLS = Type("pools", doc="pools [seq, k] or {seq, k}, each once")
STATUS = Type("status", doc="one of " + ", ".join(OP_STATUSES))
TOKENS = Type("tokens", doc="explicit tokens")
# its bounds are the tokens of one ubatch (at most cache.n_ubatch, checked by the loader)
UBATCHES = Type("ubatches", 1, N_UBATCH_MAX, "a fixed split: ubatches of at most n_ubatch"
                " tokens each (capped at n_batch, when given)")
SECTION = Type("section", doc="the cache block (CACHE)")
OP_LIST = Type("ops", doc="the ops (OPS), each a mapping with one key: its name")


@dataclass(frozen=True)
class Field:
    """One key of a section. `lo`/`hi` default to the type's bounds."""

    name: str
    type: Type
    doc: str
    required: bool = False
    default: object = NO_DEFAULT
    lo: int | None = None
    hi: int | None = None
    always_written: bool = False  # the writer writes it even when it equals its default

    def __post_init__(self) -> None:
        assert self.required == (self.default is NO_DEFAULT), self.name
        if self.lo is None:
            object.__setattr__(self, "lo", self.type.lo)
        if self.hi is None:
            object.__setattr__(self, "hi", self.type.hi)

    @property
    def hint(self) -> str:
        return self.type.hint


@dataclass(frozen=True)
class Section:
    """A mapping of the format: its fields in the canonical key order. `body` says
    what the value is: a mapping of `fields` ("mapping"), a mapping that may also be
    written null ("empty", `clear: {}` or `clear:`), or a string ("text", `note`)."""

    name: str
    doc: str
    fields: tuple[Field, ...] = ()
    body: str = "mapping"
    _by_name: dict[str, Field] = field(init=False, repr=False, compare=False)
    # the key lists, asked once a token by the loader: made once
    names: tuple[str, ...] = field(init=False, repr=False, compare=False)
    required: tuple[str, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_name", {f.name: f for f in self.fields})
        assert len(self._by_name) == len(self.fields), self.name
        object.__setattr__(self, "names", tuple(f.name for f in self.fields))
        object.__setattr__(self, "required", tuple(f.name for f in self.fields if f.required))

    def __getitem__(self, name: str) -> Field:
        return self._by_name[name]

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    @property
    def defaults(self) -> dict[str, object]:
        return {f.name: f.default for f in self.fields if not f.required}

    @property
    def skeleton(self) -> str:
        """The section's value with its required keys, as a trace writes it: `{}`
        (an empty body), `"..."` (a text), `{seq: ..., slot: ...}`."""
        if self.body != "mapping":
            return "{}" if self.body == "empty" else '"..."'
        return "{" + ", ".join(f"{n}: ..." for n in self.required) + "}"


def _req(name: str, type_: Type, doc: str, **kw: int | None) -> Field:
    return Field(name, type_, doc, required=True, **kw)  # type: ignore[arg-type]


def _opt(name: str, type_: Type, doc: str, default: object, **kw: object) -> Field:
    return Field(name, type_, doc, default=default, **kw)  # type: ignore[arg-type]


# --- sections -----------------------------------------------------------------------

CACHE = Section("cache", "the indexer cache's shape (docs/FORMATS.md)", (
    _req("kv_size", int_type(1, KV_SIZE_MAX), "cells per stream"),
    _req("kpool", int_type(1, KV_SIZE_MAX), "tokens per pool, at most kv_size"),
    _opt("n_seq_max", int_type(1, N_SEQ_MAX_MAX), "sequences (seq ids 0..n_seq_max-1)", 1),
    _opt("unified", BOOL, "one stream for every sequence; false: stream s is sequence s's",
         True),
    _opt("by_order", BOOL, "pools by rank (M-RoPE images); allows a token's ext", False),
    _opt("n_ubatch", int_type(1, N_UBATCH_MAX), "tokens per ubatch at most", 512),
    _opt("n_batch", int_type(1, N_BATCH_MAX),
         "tokens per decode at most (llama_context_params.n_batch): a larger decode "
         "aborts, and n_ubatch is capped at it; unset: the context's cells", None),
    _opt("n_embd", int_type(1, N_EMBD_MAX), "key width used by the value backend", 16),
    _opt("n_rs_seq", int_type(0, N_RS_SEQ_MAX),
         "the recurrent child's rollback snapshots per sequence "
         "(0 without MTP; the draft depth with it, e.g. 3)", 0),
))

TOKEN = Section("token", "one token of a decode", (
    _req("pos", POS, "its position"),
    _req("seq", SEQ_SET, "its sequences (the first is the one it reads through)"),
    _opt("ext", EXT, "M-RoPE [x, y]; only with cache.by_order: true", None),
    _opt("cell", CELL, "its recorded cell (stream-local): every token of the decode has"
         " one, or none", None),
))

DECODE_FORMS: tuple[Section, ...] = (
    Section("decode", "shorthand: one token per position, all with the same sequences"
            " (cell: only for a single position)", (
                _req("seq", SEQ_SET, "the tokens' sequences"),
                _req("pos", POSITIONS, "the tokens' positions"),
                _opt("ext", EXT, "M-RoPE [x, y] of every token", None),
                _opt("cell", CELL, "the recorded cell of the single token", None),
            )),
    Section("decode", "explicit tokens, split by the engine", (
        _req("tokens", TOKENS, "the tokens, at least one"),
    )),
    Section("decode", "a fixed split into ubatches", (
        _req("ubatches", UBATCHES, "non-empty lists of tokens, at most cache.n_ubatch each"
             " (capped at cache.n_batch, when given), whose sequence sets are equal or"
             " disjoint"),
    )),
)
# every key a decode may hold, over its three forms (only one form at a time)
DECODE_KEYS: tuple[str, ...] = tuple(n for form in DECODE_FORMS for n in form.names)

POOL = Section("pool", "a marked pool, [seq, k] or {seq, k}", (
    _req("seq", SEQ, "the pool's sequence"),
    _req("k", int_type(0, KV_SIZE_MAX), "the pool's index in its sequence"),
))


def _p(name: str) -> Field:
    return _opt(name, BOUND, ("start" if name == "p0" else "end") + " of the half-open"
                " range [p0, p1), -1: no bound", -1)


OPS: dict[str, Section] = {s.name: s for s in (
    Section("decode", "a decode: one llama_batch, in one of three forms (DECODE_FORMS)",
            tuple(f for form in DECODE_FORMS for f in form.fields)),
    Section("seq_rm", "remove positions [p0, p1) of seq (-1: every sequence)", (
        _req("seq", SEQ_OR_ALL, "the sequence, or -1: every sequence"), _p("p0"), _p("p1"),
    )),
    Section("seq_cp", "copy positions [p0, p1) of src to dst", (
        _req("src", SEQ, "the sequence copied from"),
        _req("dst", SEQ, "the sequence copied to"), _p("p0"), _p("p1"),
    )),
    Section("seq_keep", "keep only seq", (_req("seq", SEQ, "the sequence kept"),)),
    Section("seq_add", "shift positions [p0, p1) of seq", (
        _req("seq", SEQ, "the sequence"), _p("p0"), _p("p1"),
        _req("shift", int_type(INT32_MIN, INT32_MAX), "added to each position"),
    )),
    Section("seq_div", "divide positions [p0, p1) of seq", (
        _req("seq", SEQ, "the sequence"), _p("p0"), _p("p1"),
        _req("d", int_type(1, INT32_MAX), "each position is divided by it"),
    )),
    Section("state_write", "save seq's state in slot", (
        _req("seq", SEQ, "the sequence saved"), _req("slot", SLOT, "the slot written"),
    )),
    Section("state_read", "restore a slot written earlier into seq", (
        _req("seq", SEQ, "the sequence restored"),
        _req("slot", SLOT, "a slot written by an earlier state_write"),
    )),
    Section("state_drop", "drop seq (-1: every sequence)", (
        _req("seq", SEQ_OR_ALL, "the sequence, or -1: every sequence"),
    )),
    Section("clear", "empty the cache", body="empty"),
    Section("note", "free text shown in the report", body="text"),
    Section("expect", "assertions on the previous op (not the first op, notes do not count)", (
        _opt("engine", ENGINE, "checked only under this engine version", None),
        _opt("findings", FINDINGS, "the exact set of codes the op raised", None),
        _opt("n_new", int_type(0, COUNT_MAX), "pools marked new in the ubatch", None),
        _opt("n_new_g", int_type(0, COUNT_MAX), "scatter entries of the ubatch", None),
        _opt("pools", POOLS, "the exact marked pools of the ubatch", None),
        _opt("status", STATUS, "what the op did", None),
        _opt("ubatch", int_type(-1, COUNT_MAX, " (a ubatch index, or -1 for the last)"),
             "the decode's ubatch checked, -1 (default): the last", -1),
    )),
)}

TOP = Section("trace", "a trace of the k-pool indexer cache (TRACE_FORMAT.md)", (
    _req("kpool_trace", VERSION, "the format version"),
    _opt("name", STR, "the trace's name", ""),
    _opt("description", STR, "shown by replay", ""),
    _req("cache", SECTION, CACHE.doc),
    _opt("engine", ENGINE, "the default engine version; --engine overrides it", None),
    _opt("seed", int_type(0, SEED_MAX), "the key generator's seed", 0, always_written=True),
    _req("ops", OP_LIST, "the ops, each a mapping with one key: the op name"),
))
