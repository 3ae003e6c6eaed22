"""Read a trace file (TRACE_FORMAT.md, "Trace", format v1) into `trace.model.Trace`.

Owns: `load_trace`, `load_trace_text`, `TraceError`, `Problem`, and the static limits
of the format (`POS_LIMIT`, `KV_SIZE_MAX`, ...), which `trace.schema` reuses.

How and why:
- The YAML is *composed*, never constructed: a `yaml.SafeLoader` subclass turns the
  text into a node graph and this module walks the nodes itself, field by field. So
  no Python object is ever built from a tag: only the standard scalar, list and
  mapping tags are accepted (`!!python/...`, `!custom`, `!!set`, merge keys `<<`
  are errors), and every problem carries the node's start mark (1-based line and
  column) and a dotted field path such as `ops[3].decode.tokens[1].pos`.
- Size bounds, so that a hostile file fails fast: at most `MAX_BYTES` of text; the
  node graph's size with every alias expanded is computed before the walk (linear
  in the document, because an alias is the anchored node itself) and must stay at
  or below `MAX_NODE_VISITS`; the walk also counts every node it visits (an alias
  visited twice counts twice) against the same bound; a recursive alias is an
  error; at most `MAX_TOKENS` tokens in a trace (a range `0..2000000000` would
  otherwise be materialised).
- Strict (TRACE_FORMAT.md: "Unknown keys are errors"): unknown keys (with the
  closest known key suggested), duplicate keys, wrong types (YAML `true` is not
  the int 1; an int is not a bool; `"5"` is not an int), out-of-range values.
- Every problem found is reported (up to `MAX_PROBLEMS`), not just the first.

Invariants of a returned `Trace`: those listed in `trace.model`'s docstring, plus
- every seq id is in `[0, n_seq_max)`, or -1 where the op allows it (seq_rm,
  state_drop);
- every position and `ext` coordinate is in `[0, POS_LIMIT)`, so
  `pos + n_ubatch` fits an int32 (llama_pos);
- `ext` appears only when `cache.by_order` is true; within a decode either every
  token has a `cell` (stream-local, `< kv_size`) or none has, and no two tokens
  of the decode name the same cell of the same stream;
- an explicit `ubatches` split has non-empty ubatches of at most `n_ubatch` tokens;
- every `state_read` names a slot written by an earlier `state_write`;
- every `expect` follows some op other than `note`/`expect`.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
import yaml.composer
import yaml.resolver

if yaml.__with_libyaml__:
    import yaml.cyaml
from yaml.constructor import SafeConstructor
from yaml.events import StreamEndEvent
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from kpool_cli.trace.model import (
    FORMAT_VERSION,
    OP_STATUSES,
    OP_TYPES,
    CacheConfig,
    Clear,
    Decode,
    Expect,
    Loc,
    Note,
    Op,
    SeqAdd,
    SeqCp,
    SeqDiv,
    SeqKeep,
    SeqRm,
    StateDrop,
    StateRead,
    StateWrite,
    Token,
    Trace,
)

__all__ = [
    "KV_SIZE_MAX",
    "MAX_BYTES",
    "MAX_DEPTH",
    "MAX_NODE_VISITS",
    "MAX_PROBLEMS",
    "MAX_TOKENS",
    "N_EMBD_MAX",
    "N_SEQ_MAX_MAX",
    "N_UBATCH_MAX",
    "POS_LIMIT",
    "Problem",
    "TraceError",
    "load_trace",
    "load_trace_text",
]

# --- limits -------------------------------------------------------------------------

MAX_BYTES = 64 * 1024 * 1024  # a larger document is refused unread
MAX_NODE_VISITS = 1_000_000  # nodes, aliases expanded ("billion laughs" guard)
MAX_PROBLEMS = 20  # problems collected before giving up
MAX_TOKENS = 2**22  # tokens in a whole trace (each one is a Token object: ~1 us, ~100 B)
MAX_DEPTH = 32  # YAML nesting levels (a valid trace needs 9)

KV_SIZE_MAX = 2**24
N_SEQ_MAX_MAX = 256  # TRACE_FORMAT.md: n_seq_max "at most 256"
N_UBATCH_MAX = 2**20
N_EMBD_MAX = 4096
REPLAY_ELEMS_MAX = 2**31  # kv_size * n_stream * n_embd: the backend's key array
POS_LIMIT = 2**31 - 2**20  # positions are < POS_LIMIT, so pos + n_ubatch fits an int32
INT32_MIN = -(2**31)
INT32_MAX = 2**31 - 1
SEED_MAX = 2**64 - 1
COUNT_MAX = 2**31 - 1  # expect.n_new / n_new_g / ubatch

FINDING_CODE = re.compile(r"KP[0-9]{3}", re.ASCII)
POS_RANGE = re.compile(r"\s*([0-9]+)\s*\.\.\s*([0-9]+)\s*", re.ASCII)

# --- problems -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong with a trace. `line`/`column` are 1-based (0: no position,
    e.g. an unreadable file); `field` is a dotted path (`cache.kv_size`,
    `ops[3].decode.tokens[1].pos`) or `<file>`, `<yaml>`, `<document>`."""

    file: str
    line: int
    column: int
    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.column}: {self.field}: {self.message}"


class TraceError(Exception):
    """A trace that cannot be loaded; `problems` lists why (at most `MAX_PROBLEMS`,
    `truncated` says whether more were left unreported)."""

    def __init__(self, problems: Sequence[Problem], truncated: bool = False) -> None:
        super().__init__(list(problems), truncated)
        self.problems: list[Problem] = list(problems)
        self.truncated = truncated

    def __str__(self) -> str:
        lines = [str(p) for p in self.problems]
        if self.truncated:
            lines.append(f"(stopped after {len(self.problems)} problems)")
        return "\n".join(lines)


# --- entry points -------------------------------------------------------------------


def load_trace(path: str | Path) -> Trace:
    """Read and validate the trace at `path`. Raises `TraceError`, never anything else
    for a bad file (missing, a directory, not UTF-8, too large, invalid)."""
    file = str(path)
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_BYTES + 1)
    except OSError as e:
        reason = e.strerror or type(e).__name__
        problem = Problem(file, 0, 0, "<file>", f"cannot read the trace: {reason}")
        raise TraceError([problem]) from None
    if len(data) > MAX_BYTES:
        raise TraceError([_too_big(file)])
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise TraceError(
            [Problem(file, 0, 0, "<file>", f"not UTF-8 text: {e.reason} at byte {e.start}")]
        ) from None
    return _load(text, file, hashlib.sha256(data).hexdigest())


def load_trace_text(text: str, path: str = "<string>") -> Trace:
    """Validate a trace given as text; `path` only names it in problems and in
    `Trace.path`. `Trace.sha256` is the hash of the text encoded as UTF-8."""
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError as e:  # lone surrogates
        raise TraceError(
            [Problem(path, 0, 0, "<file>", f"not encodable as UTF-8: {e.reason}")]
        ) from None
    if len(data) > MAX_BYTES:
        raise TraceError([_too_big(path)])
    return _load(text, path, hashlib.sha256(data).hexdigest())


def _too_big(file: str) -> Problem:
    return Problem(file, 0, 0, "<file>", f"the trace is larger than {MAX_BYTES >> 20} MiB")


# --- YAML composition ---------------------------------------------------------------


if yaml.__with_libyaml__:
    # libyaml's scanner and parser (about 10x faster than PyYAML's pure-Python ones)
    # feeding PyYAML's own composer and safe resolver, so nodes, marks and the depth
    # bound below are the same either way
    class _Parser(yaml.cyaml.CParser, yaml.composer.Composer, yaml.resolver.Resolver):
        def __init__(self, stream: str) -> None:
            yaml.cyaml.CParser.__init__(self, stream)
            yaml.composer.Composer.__init__(self)
            yaml.resolver.Resolver.__init__(self)
else:  # pragma: no cover - PyYAML built without libyaml
    _Parser = yaml.SafeLoader  # type: ignore[assignment,misc]


class _TraceLoader(_Parser):
    """Only a scanner, parser, composer and resolver are used: nodes, never objects.
    Nesting is bounded while composing: the composer recurses per level, and PyYAML's
    pure-Python scanner slows down quadratically with flow nesting (`[[[[...`)."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Node | None, index: object) -> Node | None:
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise yaml.composer.ComposerError(
                    None, None, f"nested deeper than {MAX_DEPTH} levels",
                    self.peek_event().start_mark,
                )
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


class _MultipleDocuments(Exception):
    def __init__(self, mark: yaml.Mark) -> None:
        super().__init__()
        self.mark = mark


def _compose(text: str) -> Node | None:
    """The single document's root node (None for an empty stream). Mirrors
    `Composer.get_single_node`, with a dedicated error for a second document."""
    loader = _TraceLoader(text)
    try:
        loader.get_event()  # StreamStart
        root = None
        if not loader.check_event(StreamEndEvent):
            root = loader.compose_document()
        if not loader.check_event(StreamEndEvent):
            raise _MultipleDocuments(loader.get_event().start_mark)
        return root
    finally:
        loader.dispose()


_YAML_BREAKS = re.compile("\r\n|[\r\n\x85\u2028\u2029]")


def _line_col(text: str, index: int) -> tuple[int, int]:
    """1-based line and column of `text[index]`, counting line breaks as YAML does."""
    line, start = 1, 0
    for m in _YAML_BREAKS.finditer(text, 0, index):
        line, start = line + 1, m.end()
    return line, index - start + 1


def _yaml_problem(file: str, text: str, e: yaml.YAMLError) -> Problem:
    if isinstance(e, yaml.MarkedYAMLError):
        mark = e.problem_mark or e.context_mark
        msg = e.problem or "invalid YAML"
        if e.context:
            where = f" at line {e.context_mark.line + 1}" if e.context_mark else ""
            msg = f"{msg} ({e.context}{where})"
        line, col = (mark.line + 1, mark.column + 1) if mark else (0, 0)
        return Problem(file, line, col, "<yaml>", f"invalid YAML: {msg}")
    if isinstance(e, yaml.reader.ReaderError) and isinstance(e.character, int):
        line, col = _line_col(text, e.position)
        return Problem(
            file, line, col, "<yaml>",
            f"invalid YAML: character U+{e.character:04X} is not allowed ({e.reason})",
        )
    return Problem(file, 0, 0, "<yaml>", f"invalid YAML: {e}")


def _load(text: str, file: str, sha256: str) -> Trace:
    try:
        root = _compose(text)
    except yaml.YAMLError as e:
        raise TraceError([_yaml_problem(file, text, e)]) from None
    except _MultipleDocuments as e:
        raise TraceError([Problem(
            file, e.mark.line + 1, e.mark.column + 1, "<document>",
            "a second YAML document: a trace file holds exactly one",
        )]) from None
    except RecursionError:
        raise TraceError([Problem(file, 0, 0, "<yaml>", "YAML nested too deeply")]) from None
    if root is None:
        raise TraceError([Problem(
            file, 1, 1, "<document>",
            "empty document: a trace is a mapping with kpool_trace, cache and ops",
        )])
    _prescan(root, file)
    w = _Walker(file)
    try:
        trace = w.trace(root, sha256)
    except _Stop:
        trace = None
    if w.problems or trace is None:
        problems = sorted(w.problems, key=lambda p: (p.line, p.column))
        raise TraceError(problems, w.truncated)
    return trace


def _prescan(root: Node, file: str) -> None:
    """Count the nodes of the graph with every alias expanded (each key and value of a
    mapping, each item of a list, the node itself), without expanding anything:
    the composer resolves an alias to the anchored node itself, so a size per
    distinct node, computed children first, is enough. Fails on a recursive alias
    and on more than `MAX_NODE_VISITS` nodes, at the node where the sizes of its
    children add up past the limit (where a "billion laughs" multiplies)."""
    limit = MAX_NODE_VISITS
    size: dict[int, int] = {}
    on_path: set[int] = set()
    stack: list[tuple[Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        children = _children(node)
        if done:
            on_path.discard(key)
            size[key] = min(limit + 1, 1 + sum(size[id(c)] for c in children))
            continue
        if key in size:
            continue
        on_path.add(key)
        stack.append((node, True))
        for c in children:
            if id(c) in on_path:
                _fatal(file, c, "<document>", "a recursive alias (an anchor used inside itself)")
            if id(c) not in size:
                stack.append((c, False))
    if size[id(root)] <= limit:
        return
    node = root
    while True:  # descend to where the expansion crosses the limit
        big = [c for c in _children(node) if size[id(c)] > limit]
        if not big:
            break
        node = big[0]
    _fatal(
        file, node, "<document>",
        f"more than {limit:,} YAML nodes once aliases are expanded: refusing the trace"
        " (an alias bomb?)",
    )


def _children(node: Node) -> list[Node]:
    if isinstance(node, SequenceNode):
        return list(node.value)
    if isinstance(node, MappingNode):
        return [n for kv in node.value for n in kv]
    return []


def _fatal(file: str, node: Node, field: str, message: str) -> None:
    m = node.start_mark
    raise TraceError([Problem(file, m.line + 1, m.column + 1, field, message)])


# --- the walk -----------------------------------------------------------------------

_Y = "tag:yaml.org,2002:"
STR, INT, BOOL, FLOAT, NULL, TIMESTAMP = (
    _Y + "str", _Y + "int", _Y + "bool", _Y + "float", _Y + "null", _Y + "timestamp"
)
SEQ, MAP, MERGE = _Y + "seq", _Y + "map", _Y + "merge"
_ALLOWED_TAGS: dict[type, frozenset[str]] = {
    ScalarNode: frozenset({STR, INT, BOOL, FLOAT, NULL, TIMESTAMP}),
    SequenceNode: frozenset({SEQ}),
    MappingNode: frozenset({MAP}),
}
_TYPE_NAMES = {
    STR: "a string", INT: "an int", BOOL: "a bool", FLOAT: "a float", NULL: "null",
    TIMESTAMP: "a timestamp",
}
_CONSTRUCT = SafeConstructor()  # only its per-scalar converters are used

TOP_KEYS = ("kpool_trace", "name", "description", "cache", "engine", "seed", "ops")
CACHE_KEYS = ("kv_size", "kpool", "n_seq_max", "unified", "by_order", "n_ubatch", "n_embd")
TOKEN_KEYS = ("pos", "seq", "ext", "cell")
DECODE_KEYS = ("seq", "pos", "ext", "cell", "tokens", "ubatches")
EXPECT_KEYS = ("engine", "findings", "n_new", "n_new_g", "pools", "status", "ubatch")


_CACHE_DEFAULTS = {f.name: f.default for f in dataclasses.fields(CacheConfig)}


class _Stop(Exception):
    """Too many problems: stop walking."""


def _short_tag(tag: str) -> str:
    return "!!" + tag[len(_Y):] if tag.startswith(_Y) else tag


def _what(node: Node) -> str:
    if isinstance(node, SequenceNode):
        return "a list"
    if isinstance(node, MappingNode):
        return "a mapping"
    name = _TYPE_NAMES.get(node.tag, f"a {_short_tag(node.tag)} scalar")
    if node.tag == NULL:
        return name
    value = node.value if len(node.value) <= 40 else node.value[:37] + "..."
    return f"{name} ({value!r})"


def _suggest(word: str, known: Iterable[str]) -> str:
    close = difflib.get_close_matches(word, list(known), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _join(field: str, key: str) -> str:
    return f"{field}.{key}" if field else key


@dataclass
class _Limits:
    """What the ops are checked against: the cache's values, None where the cache
    does not give a usable one (then only the static bound is checked)."""

    n_seq_max: int | None = None
    kv_size: int | None = None
    unified: bool | None = None
    by_order: bool | None = None
    n_ubatch: int | None = None


@dataclass
class _Tok:
    """A parsed explicit token and where its parts are, for the decode-wide checks."""

    token: Token | None
    field: str
    node: Node
    ext_node: Node | None
    cell_node: Node | None


Parse = Callable[[Node, str], Any]


class _Walker:
    def __init__(self, file: str) -> None:
        self.file = file
        self.problems: list[Problem] = []
        self.truncated = False
        self.visits = 0
        self.n_tokens = 0
        self.lim = _Limits()
        self.slots: set[str] = set()

    # -- reporting

    def problem(self, node: Node, field: str, message: str) -> None:
        if len(self.problems) >= MAX_PROBLEMS:
            self.truncated = True
            raise _Stop
        m = node.start_mark
        self.problems.append(
            Problem(self.file, m.line + 1, m.column + 1, field or "<document>", message)
        )

    def fatal(self, node: Node, field: str, message: str) -> None:
        self.problem(node, field, message)
        raise _Stop

    # -- generic nodes

    def visit(self, node: Node, field: str) -> bool:
        """Count the node; False (with a problem) if its tag is not a plain one."""
        self.visits += 1
        if self.visits > MAX_NODE_VISITS:
            self.fatal(
                node, field,
                f"more than {MAX_NODE_VISITS:,} YAML nodes visited (aliases expanded):"
                " refusing the trace (an alias bomb?)",
            )
        if node.tag in _ALLOWED_TAGS[type(node)]:
            return True
        if node.tag == MERGE:
            self.problem(node, field, "merge keys (<<) are not supported in a trace")
        else:
            self.problem(
                node, field,
                f"tag {_short_tag(node.tag)} is not allowed: a trace holds only plain YAML"
                " scalars, lists and mappings",
            )
        return False

    def typed(self, node: Node, field: str, tag: str, expected: str) -> ScalarNode | None:
        if not self.visit(node, field):
            return None
        if isinstance(node, ScalarNode) and node.tag == tag:
            return node
        hint = ""
        if tag == INT and node.tag == BOOL:
            hint = " (YAML true/false is a bool, not an int)"
        elif tag == STR and isinstance(node, ScalarNode):
            hint = " (quote it to make it a string)"
        self.problem(node, field, f"expected {expected}, got {_what(node)}{hint}")
        return None

    def int_(
        self, node: Node, field: str, lo: int | None = None, hi: int | None = None,
        hint: str = "",
    ) -> int | None:
        scalar = self.typed(node, field, INT, "an int")
        if scalar is None:
            return None
        try:
            v = _CONSTRUCT.construct_yaml_int(scalar)
        except (ValueError, IndexError):
            self.problem(node, field, f"not a valid int: {scalar.value!r}")
            return None
        if (lo is not None and v < lo) or (hi is not None and v > hi):
            lo_s = "" if lo is None else f"{lo} <= "
            hi_s = "" if hi is None else f" <= {hi}"
            self.problem(node, field, f"out of range: {v} (must be {lo_s}value{hi_s}){hint}")
            return None
        return v

    def bool_(self, node: Node, field: str) -> bool | None:
        scalar = self.typed(node, field, BOOL, "a bool (true or false)")
        if scalar is None:
            return None
        try:
            return bool(_CONSTRUCT.construct_yaml_bool(scalar))
        except KeyError:
            self.problem(node, field, f"not a valid bool: {scalar.value!r}")
            return None

    def str_(self, node: Node, field: str, *, nonempty: bool = False) -> str | None:
        scalar = self.typed(node, field, STR, "a string")
        if scalar is None:
            return None
        if nonempty and not scalar.value:
            self.problem(node, field, "must not be empty")
            return None
        return scalar.value

    def list_(self, node: Node, field: str, what: str = "a list") -> list[Node] | None:
        if not self.visit(node, field):
            return None
        if not isinstance(node, SequenceNode):
            self.problem(node, field, f"expected {what}, got {_what(node)}")
            return None
        return list(node.value)

    def map_(
        self, node: Node, field: str, known: Sequence[str], required: Sequence[str] = (),
        *, null_ok: bool = False,
    ) -> dict[str, Node] | None:
        """The mapping's values by key. Unknown, duplicate and non-string keys and
        missing required keys are reported; the known keys found are still returned."""
        if not self.visit(node, field):
            return None
        if null_ok and isinstance(node, ScalarNode) and node.tag == NULL:
            return {}
        if not isinstance(node, MappingNode):
            self.problem(node, field, f"expected a mapping, got {_what(node)}")
            return None
        out: dict[str, Node] = {}
        key_at: dict[str, str] = {}
        for k, v in node.value:
            if not self.visit(k, field):
                continue
            if not (isinstance(k, ScalarNode) and k.tag == STR):
                self.problem(k, field, f"keys must be strings, got {_what(k)}")
                continue
            name = k.value
            if name not in known:
                self.problem(k, _join(field, name), f"unknown key {name!r}{_suggest(name, known)}")
            elif name in out:
                self.problem(
                    k, _join(field, name),
                    f"duplicate key {name!r} (first at {key_at[name]})",
                )
            else:
                out[name] = v
                key_at[name] = f"line {k.start_mark.line + 1}, column {k.start_mark.column + 1}"
        for name in required:
            if name not in out:
                self.problem(node, _join(field, name), "required key missing")
        return out

    def fields(
        self, node: Node, field: str, spec: dict[str, tuple[bool, Parse]], *,
        null_ok: bool = False,
    ) -> dict[str, Any] | None:
        """Parse a mapping of scalar-ish fields: `spec` maps each key to (required,
        parser). None if anything about it was wrong (a problem was reported)."""
        before = len(self.problems)
        m = self.map_(node, field, tuple(spec), [k for k, (req, _) in spec.items() if req],
                      null_ok=null_ok)
        if m is None:
            return None
        out = {k: spec[k][1](v, _join(field, k)) for k, v in m.items()}
        return out if len(self.problems) == before else None

    # -- the trace

    def trace(self, root: Node, sha256: str) -> Trace | None:
        if isinstance(root, MappingNode):  # the version first: a v2 trace gets one problem
            for k, v in root.value:
                if isinstance(k, ScalarNode) and k.tag == STR and k.value == "kpool_trace":
                    self.version(v)
                    break
        top = self.map_(root, "", TOP_KEYS, ("kpool_trace", "cache", "ops"))
        if top is None:
            return None
        before = len(self.problems)
        cache = self.cache(top["cache"]) if "cache" in top else None
        name = self.str_(top["name"], "name") if "name" in top else ""
        description = self.str_(top["description"], "description") if "description" in top else ""
        engine = self.str_(top["engine"], "engine", nonempty=True) if "engine" in top else None
        seed = self.int_(top["seed"], "seed", 0, SEED_MAX) if "seed" in top else 0
        ops = self.ops(top["ops"]) if "ops" in top else None
        if len(self.problems) != before or cache is None or ops is None:
            return None
        assert name is not None and description is not None and seed is not None
        return Trace(
            cache=cache, ops=ops, name=name, description=description, engine=engine,
            seed=seed, path=self.file, sha256=sha256,
        )

    def version(self, node: Node) -> None:
        v = self.int_(node, "kpool_trace")
        if v is not None and v != FORMAT_VERSION:
            # Nothing else is checked: another version's fields would only add noise.
            self.fatal(
                node, "kpool_trace",
                f"unsupported format version {v}, this kpool reads {FORMAT_VERSION}",
            )

    def cache(self, node: Node) -> CacheConfig | None:
        """TRACE_FORMAT.md "Trace" (cache block) and ENGINE.md §2. Records the values
        that parse in `self.lim` even if the block as a whole is wrong, so that the
        ops are still checked against them."""
        f = "cache"
        before = len(self.problems)
        m = self.map_(node, f, CACHE_KEYS, ("kv_size", "kpool"))
        if m is None:
            return None
        kv = self.int_(m["kv_size"], "cache.kv_size", 1, KV_SIZE_MAX) if "kv_size" in m else None
        kpool = None
        if "kpool" in m:
            kpool = self.int_(m["kpool"], "cache.kpool", 1, KV_SIZE_MAX)
            if kpool is not None and kv is not None and kpool > kv:
                self.problem(
                    m["kpool"], "cache.kpool",
                    f"out of range: kpool {kpool} is larger than cache.kv_size ({kv})",
                )
                kpool = None
        vals: dict[str, Any] = {}
        for key, parse in (
            ("n_seq_max", lambda n, fl: self.int_(n, fl, 1, N_SEQ_MAX_MAX)),
            ("unified", self.bool_),
            ("by_order", self.bool_),
            ("n_ubatch", lambda n, fl: self.int_(n, fl, 1, N_UBATCH_MAX)),
            ("n_embd", lambda n, fl: self.int_(n, fl, 1, N_EMBD_MAX)),
        ):
            vals[key] = parse(m[key], f"cache.{key}") if key in m else _CACHE_DEFAULTS[key]
        self.lim = _Limits(
            n_seq_max=vals["n_seq_max"], kv_size=kv, unified=vals["unified"],
            by_order=vals["by_order"], n_ubatch=vals["n_ubatch"],
        )
        if len(self.problems) != before or kv is None or kpool is None:
            return None
        cfg = CacheConfig(kv_size=kv, kpool=kpool, **vals)
        elems = cfg.kv_size * cfg.n_stream * cfg.n_embd
        if elems > REPLAY_ELEMS_MAX:
            self.problem(
                node, f,
                f"too large to replay: kv_size * n_stream * n_embd = {cfg.kv_size} * "
                f"{cfg.n_stream} * {cfg.n_embd} = {elems:,} is over 2**31",
            )
            return None
        return cfg

    def ops(self, node: Node) -> tuple[Op, ...] | None:
        items = self.list_(node, "ops")
        if items is None:
            return None
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
        op name when it is a known one (even if the op is invalid) and the op."""
        if not self.visit(item, f):
            return None, None
        if not isinstance(item, MappingNode):
            self.problem(
                item, f,
                f"an op is a mapping with one key, the op name (`- seq_rm: {{seq: 0}}`),"
                f" got {_what(item)}",
            )
            return None, None
        if not item.value:
            self.problem(item, f, "empty op: expected one key, the op name")
            return None, None
        if len(item.value) > 1:
            names = ", ".join(
                k.value if isinstance(k, ScalarNode) else _what(k) for k, _ in item.value
            )
            self.problem(
                item.value[1][0], f,
                f"an op item has exactly one key, the op name; this one has {len(item.value)}"
                f" ({names}): a missing '-'?",
            )
            return None, None
        key, value = item.value[0]
        if not self.visit(key, f):
            return None, None
        if not (isinstance(key, ScalarNode) and key.tag == STR):
            self.problem(key, f, f"expected an op name, got {_what(key)}")
            return None, None
        name = key.value
        if name not in OP_TYPES:
            self.problem(key, f, f"unknown op {name!r}{_suggest(name, OP_TYPES)}")
            return None, None
        loc = Loc(self.file, item.start_mark.line + 1, item.start_mark.column + 1)
        build: Callable[[Node, str, Loc], Op | None] = getattr(self, f"op_{name}")
        return name, build(value, f"{f}.{name}", loc)

    # -- scalar parsers shared by the ops

    def seq_id(self, node: Node, field: str, *, allow_all: bool = False) -> int | None:
        """A seq id in `[0, n_seq_max)` (ENGINE.md §3), or -1 ("every sequence",
        ENGINE.md §2) when `allow_all`."""
        v = self.int_(node, field)
        if v is None:
            return None
        n = self.lim.n_seq_max
        hi = (n if n is not None else N_SEQ_MAX_MAX) - 1
        if (allow_all and v == -1) or 0 <= v <= hi:
            return v
        msg = f"seq id {v} is out of range: "
        msg += (f"cache.n_seq_max is {n}, so seq ids are 0..{hi}" if n is not None
                else f"seq ids are 0..{hi}")
        if allow_all:
            msg += ", or -1 for every sequence"
        elif v == -1:
            msg += " (-1, every sequence, is only for seq_rm and state_drop)"
        self.problem(node, field, msg)
        return None

    def seq_any(self, node: Node, field: str) -> int | None:
        return self.seq_id(node, field, allow_all=True)

    def seq_set(self, node: Node, field: str) -> tuple[int, ...] | None:
        """A token's sequence set: an int or a list of distinct ints, order kept."""
        if isinstance(node, ScalarNode):
            v = self.seq_id(node, field)
            return None if v is None else (v,)
        items = self.list_(node, field, "a seq id or a list of seq ids")
        if items is None:
            return None
        if not items:
            self.problem(node, field, "a token needs at least one seq id")
            return None
        out: list[int] = []
        ok = True
        for i, it in enumerate(items):
            v = self.seq_id(it, f"{field}[{i}]")
            if v is None:
                ok = False
            elif v in out:
                self.problem(it, f"{field}[{i}]", f"seq id {v} is listed twice")
                ok = False
            else:
                out.append(v)
        return tuple(out) if ok else None

    def pos(self, node: Node, field: str) -> int | None:
        return self.int_(node, field, 0, POS_LIMIT - 1, " (positions are below 2**31 - 2**20)")

    def positions(self, node: Node, field: str) -> Sequence[int] | None:
        """`pos` of the shorthand decode: an int, "A..B" (half-open, A < B) or a list."""
        if isinstance(node, SequenceNode):
            items = self.list_(node, field)
            if items is None:
                return None
            ps = [self.pos(it, f"{field}[{i}]") for i, it in enumerate(items)]
            return None if None in ps else ps  # type: ignore[return-value]
        if isinstance(node, ScalarNode) and node.tag == STR:
            if not self.visit(node, field):
                return None
            m = POS_RANGE.fullmatch(node.value)
            if m is None:
                self.problem(
                    node, field,
                    f"expected a position, a range 'A..B' or a list of positions,"
                    f" got {_what(node)}",
                )
                return None
            a, b = int(m[1]), int(m[2])
            if a >= b:
                self.problem(node, field, f"empty range {node.value!r}: A..B needs A < B")
                return None
            if b > POS_LIMIT:
                self.problem(
                    node, field,
                    f"out of range: {node.value!r} ends past {POS_LIMIT - 1}"
                    " (positions are below 2**31 - 2**20)",
                )
                return None
            return range(a, b)
        v = self.pos(node, field)
        return None if v is None else [v]

    def ext(self, node: Node, field: str) -> tuple[int, int] | None:
        items = self.list_(node, field, "a list [x, y]")
        if items is None:
            return None
        if len(items) != 2:
            self.problem(node, field, f"ext is [x, y], got {len(items)} values")
            return None
        x, y = (self.int_(it, f"{field}[{i}]", 0, POS_LIMIT - 1) for i, it in enumerate(items))
        return None if x is None or y is None else (x, y)

    def cell(self, node: Node, field: str) -> int | None:
        kv = self.lim.kv_size
        hint = f" (cells are stream-local: below cache.kv_size, {kv})" if kv else ""
        return self.int_(node, field, 0, (kv or KV_SIZE_MAX) - 1, hint)

    def p_bound(self, node: Node, field: str) -> int | None:
        v = self.int_(node, field)
        if v is None:
            return None
        if not -1 <= v <= INT32_MAX:
            self.problem(node, field, f"out of range: {v} (a position >= 0, or -1 for no bound)")
            return None
        return v

    def count_tokens(self, n: int, node: Node, field: str) -> None:
        self.n_tokens += n
        if self.n_tokens > MAX_TOKENS:
            self.fatal(node, field, f"more than {MAX_TOKENS:,} tokens in the trace")

    # -- decode (TRACE_FORMAT.md "Trace"; ENGINE.md §3)

    def op_decode(self, node: Node, f: str, loc: Loc) -> Decode | None:
        before = len(self.problems)
        m = self.map_(node, f, DECODE_KEYS)
        if m is None:
            return None
        forms = [k for k in ("tokens", "ubatches") if k in m]
        short = [k for k in ("seq", "pos", "ext", "cell") if k in m]
        if len(forms) + (1 if short else 0) > 1:
            self.problem(
                node, f,
                "a decode takes one form: {seq, pos} (with optional ext, cell), {tokens: [...]}"
                f" or {{ubatches: [[...], ...]}}; got keys {', '.join(forms + short)}",
            )
            return None
        ubatches: tuple[tuple[int, ...], ...] | None = None
        if forms == ["tokens"]:
            items = self.list_(m["tokens"], f"{f}.tokens", "a list of tokens")
            if items is None:
                return None
            toks = [self.token(it, f"{f}.tokens[{i}]") for i, it in enumerate(items)]
            if not toks:
                self.problem(m["tokens"], f"{f}.tokens", "a decode needs at least one token")
        elif forms == ["ubatches"]:
            parsed = self.ubatches(m["ubatches"], f"{f}.ubatches")
            if parsed is None:
                return None
            toks, ubatches = parsed
        else:
            return self.shorthand(node, m, f, loc, before)
        self.check_decode(toks)
        if len(self.problems) != before:
            return None
        return Decode(tokens=tuple(t.token for t in toks), ubatches=ubatches, loc=loc)  # type: ignore[misc]

    def ubatches(
        self, node: Node, f: str
    ) -> tuple[list[_Tok], tuple[tuple[int, ...], ...]] | None:
        groups = self.list_(node, f, "a list of ubatches (lists of tokens)")
        if groups is None:
            return None
        if not groups:
            self.problem(node, f, "a decode needs at least one token")
            return None
        toks: list[_Tok] = []
        split: list[tuple[int, ...]] = []
        for j, g in enumerate(groups):
            items = self.list_(g, f"{f}[{j}]", "a ubatch (a list of tokens)")
            if items is None:
                continue
            if not items:
                self.problem(g, f"{f}[{j}]", "a ubatch must not be empty")
                continue
            n_ubatch = self.lim.n_ubatch
            if n_ubatch is not None and len(items) > n_ubatch:
                self.problem(
                    g, f"{f}[{j}]",
                    f"a ubatch of {len(items)} tokens, more than cache.n_ubatch ({n_ubatch})",
                )
            start = len(toks)
            toks.extend(self.token(it, f"{f}[{j}][{i}]") for i, it in enumerate(items))
            split.append(tuple(range(start, len(toks))))
        return toks, tuple(split)

    def token(self, node: Node, f: str) -> _Tok:
        before = len(self.problems)
        self.count_tokens(1, node, f)
        m = self.map_(node, f, TOKEN_KEYS, ("pos", "seq"))
        if m is None:
            return _Tok(None, f, node, None, None)
        pos = self.pos(m["pos"], f"{f}.pos") if "pos" in m else None
        seq = self.seq_set(m["seq"], f"{f}.seq") if "seq" in m else None
        ext = self.ext(m["ext"], f"{f}.ext") if "ext" in m else None
        cell = self.cell(m["cell"], f"{f}.cell") if "cell" in m else None
        token = None
        if len(self.problems) == before:
            assert pos is not None and seq is not None
            token = Token(pos=pos, seq=seq, ext=ext, cell=cell)
        return _Tok(token, f, node, m.get("ext"), m.get("cell"))

    def check_decode(self, toks: list[_Tok]) -> None:
        """The decode-wide rules on explicit tokens: ext needs by_order; all or no
        cells; no cell named twice in one stream (ENGINE.md §2: stream = 0 when
        unified, else the token's first seq id)."""
        if self.lim.by_order is False:
            first = next((t for t in toks if t.ext_node is not None), None)
            if first is not None:
                assert first.ext_node is not None
                self.problem(first.ext_node, f"{first.field}.ext", _EXT_NEEDS_BY_ORDER)
        with_cell = [t for t in toks if t.cell_node is not None]
        if with_cell and len(with_cell) != len(toks):
            lacking = next(t for t in toks if t.cell_node is None)
            self.problem(
                lacking.node, lacking.field,
                f"this token has no cell but {with_cell[0].field} has one:"
                " give every token of a decode a cell, or none",
            )
        if not with_cell or self.lim.unified is None:
            return
        taken: dict[tuple[int, int], str] = {}
        for t in with_cell:
            if t.token is None or t.token.cell is None:
                continue
            strm = 0 if self.lim.unified else t.token.seq[0]
            key = (strm, t.token.cell)
            if key in taken:
                where = "" if self.lim.unified else f" of stream {strm}"
                assert t.cell_node is not None
                self.problem(
                    t.cell_node, f"{t.field}.cell",
                    f"cell {t.token.cell}{where} is already taken by {taken[key]}"
                    " in this decode",
                )
            else:
                taken[key] = t.field

    def shorthand(
        self, node: Node, m: dict[str, Node], f: str, loc: Loc, before: int
    ) -> Decode | None:
        """`{seq: S, pos: P}` (+ optional ext for every token, cell for a single one)."""
        for key in ("seq", "pos"):
            if key not in m:
                self.problem(node, f"{f}.{key}", "required key missing")
        seq = self.seq_set(m["seq"], f"{f}.seq") if "seq" in m else None
        ps = self.positions(m["pos"], f"{f}.pos") if "pos" in m else None
        ext = None
        if "ext" in m:
            ext = self.ext(m["ext"], f"{f}.ext")
            if self.lim.by_order is False:
                self.problem(m["ext"], f"{f}.ext", _EXT_NEEDS_BY_ORDER)
        cell = None
        if "cell" in m:
            cell = self.cell(m["cell"], f"{f}.cell")
            if ps is not None and len(ps) != 1:
                self.problem(
                    m["cell"], f"{f}.cell",
                    f"cell names one cell, but pos gives {len(ps)} positions"
                    " (use tokens: to place several)",
                )
        if ps is not None and not ps:
            self.problem(m["pos"], f"{f}.pos", "a decode needs at least one token")
        if len(self.problems) != before or seq is None or ps is None:
            return None
        self.count_tokens(len(ps), m["pos"], f"{f}.pos")
        return Decode(tokens=tuple(Token(p, seq, ext, cell) for p in ps), loc=loc)

    # -- the other ops (ENGINE.md §2 for what they do)

    def op_seq_rm(self, node: Node, f: str, loc: Loc) -> Op | None:
        d = self.fields(node, f, {
            "seq": (True, self.seq_any), "p0": (False, self.p_bound), "p1": (False, self.p_bound),
        })
        return None if d is None else SeqRm(loc=loc, **d)

    def op_seq_cp(self, node: Node, f: str, loc: Loc) -> Op | None:
        d = self.fields(node, f, {
            "src": (True, self.seq_id), "dst": (True, self.seq_id),
            "p0": (False, self.p_bound), "p1": (False, self.p_bound),
        })
        return None if d is None else SeqCp(loc=loc, **d)

    def op_seq_keep(self, node: Node, f: str, loc: Loc) -> Op | None:
        d = self.fields(node, f, {"seq": (True, self.seq_id)})
        return None if d is None else SeqKeep(loc=loc, **d)

    def op_seq_add(self, node: Node, f: str, loc: Loc) -> Op | None:
        d = self.fields(node, f, {
            "seq": (True, self.seq_id), "p0": (False, self.p_bound), "p1": (False, self.p_bound),
            "shift": (True, lambda n, fl: self.int_(n, fl, INT32_MIN, INT32_MAX)),
        })
        return None if d is None else SeqAdd(loc=loc, **d)

    def op_seq_div(self, node: Node, f: str, loc: Loc) -> Op | None:
        d = self.fields(node, f, {
            "seq": (True, self.seq_id), "p0": (False, self.p_bound), "p1": (False, self.p_bound),
            "d": (True, lambda n, fl: self.int_(n, fl, 1, INT32_MAX)),
        })
        return None if d is None else SeqDiv(loc=loc, **d)

    def slot(self, node: Node, field: str) -> str | None:
        return self.str_(node, field, nonempty=True)

    def op_state_write(self, node: Node, f: str, loc: Loc) -> Op | None:
        before = len(self.problems)
        m = self.map_(node, f, ("seq", "slot"), ("seq", "slot"))
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
        m = self.map_(node, f, ("seq", "slot"), ("seq", "slot"))
        if m is None:
            return None
        seq = self.seq_id(m["seq"], f"{f}.seq") if "seq" in m else None
        slot = self.slot(m["slot"], f"{f}.slot") if "slot" in m else None
        if slot is not None and slot not in self.slots:
            self.problem(
                m["slot"], f"{f}.slot",
                f"slot {slot!r} is not written by an earlier state_write"
                f"{_suggest(slot, self.slots)}",
            )
        if len(self.problems) != before or seq is None or slot is None:
            return None
        return StateRead(seq=seq, slot=slot, loc=loc)

    def op_state_drop(self, node: Node, f: str, loc: Loc) -> Op | None:
        d = self.fields(node, f, {"seq": (True, self.seq_any)})
        return None if d is None else StateDrop(loc=loc, **d)

    def op_clear(self, node: Node, f: str, loc: Loc) -> Op | None:
        d = self.fields(node, f, {}, null_ok=True)
        return None if d is None else Clear(loc=loc)

    def op_note(self, node: Node, f: str, loc: Loc) -> Op | None:
        text = self.str_(node, f)
        return None if text is None else Note(text=text, loc=loc)

    def op_expect(self, node: Node, f: str, loc: Loc) -> Op | None:
        d = self.fields(node, f, {
            "engine": (False, lambda n, fl: self.str_(n, fl, nonempty=True)),
            "findings": (False, self.findings),
            "n_new": (False, lambda n, fl: self.int_(n, fl, 0, COUNT_MAX)),
            "n_new_g": (False, lambda n, fl: self.int_(n, fl, 0, COUNT_MAX)),
            "pools": (False, self.pools),
            "status": (False, self.status),
            "ubatch": (False, lambda n, fl: self.int_(
                n, fl, -1, COUNT_MAX, " (a ubatch index, or -1 for the last)")),
        })
        return None if d is None else Expect(loc=loc, **d)

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
                self.problem(it, fi, f"not a finding code: {code!r} (codes are KP001, KP002, ...)")
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
        def k_(n: Node, fl: str) -> int | None:
            return self.int_(n, fl, 0, KV_SIZE_MAX)

        if isinstance(node, MappingNode):
            d = self.fields(node, field, {"seq": (True, self.seq_id), "k": (True, k_)})
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
                f"unknown status {v!r}{_suggest(v, OP_STATUSES)}"
                f" (one of {', '.join(OP_STATUSES)})",
            )
            return None
        return v


_EXT_NEEDS_BY_ORDER = (
    "ext (an M-RoPE token) needs cache.by_order: true, but cache.by_order is false"
)
