"""Hostile inputs for `kpool`, by class, and how to run and judge one.

Shared by the in-suite property test (`test_hostile_inputs.py`, a few hundred cases)
and the full campaign (`campaign_robustness.py`, 10,000+ cases in killable worker
processes). Everything here is plain seeded generation: `make_case(cls, key)` turns a
class name and a key (any string: the campaign uses `"<seed>/<class>/<i>"`) into the
same `Case` on every machine and every run, so a failure is reproduced from its key.
`strategy(cls)` wraps it for hypothesis.

Classes (`CLASSES`):

- `bytes`: byte-level mutations of the shipped traces: flipped bits, inserted or
  overwritten bytes (random, or YAML punctuation, NUL, 0xff, a BOM, ANSI escapes),
  deleted or duplicated spans, truncation, two traces spliced.
- `yaml`: YAML-structure mutations of a shipped trace: a value replaced by a hostile
  scalar (huge or negative ints in every YAML 1.1 notation, floats, .nan, bools,
  null, strings with control characters, ANSI/OSC escapes, bidi overrides, rich markup,
  huge strings), a deep nested list, an anchor/alias bomb, a recursive or undefined
  alias, a tag (`!!python/object/apply:...`, `!!binary`, `!!set`, `!custom`), merge
  keys, duplicate and unknown keys, deleted keys; and whole-document ones: a second
  document, directives, non-UTF-8 bytes, UTF-16, a BOM, CRLF or CR line ends, tabs,
  an empty file, a scalar or list root.
- `semantic`: valid YAML of the trace format with edge values: traces generated from
  scratch (random cache config up to the format's limits, random ops and ids) and
  shipped traces with seq ids swapped, huge kv_size/n_embd/n_ubatch, ranges like
  `0..4194304`, n_seq_max 256 (and 257), cells out of range or taken, `state_read` of
  an unknown slot, random `expect` items, `by_order` with `ext`.
- `report`: `kpool diff` of two JSON reports built from real `kpool replay --format
  json` output, then mutated: values replaced (unknown finding codes, 10**5000, 1e999,
  NaN, wrong types, deep nesting), fields deleted or added, duplicate keys, plausible
  but inconsistent edits (ops and indexes shuffled, findings added), byte mutations.
- `argv`: random argument lists for every command (and none): each command's options
  with random and edge values, paths that do not exist, `-`, directories, /dev/null,
  /dev/zero, unknown options, plus hostile COLUMNS/NO_COLOR/FORCE_COLOR.

Output paths are only ever in the case's own directory, `-` or /dev/null: never an
input, never a file elsewhere. Plug-in engine names are a fixed harmless set, or
random names no module has.

`run_case(case, workdir)` runs one case in this process (`kpool_cli.cli.main` with
sys.argv patched, under click's stream isolation, KPOOL_TRACEBACK=1 so an internal
error re-raises), and `judge(case, outcome, workdir)` lists what is wrong with the
result: the contract is exit 0, 1 or 2 only; no traceback; no "internal error"; for
exit 2 a message (naming the input file when the file's content is what is under
test, `file:line:col: field: ...` for an invalid trace); no terminal control
characters from the input on stderr (or on stdout's plain view); JSON on stdout when
JSON was asked for; no output or temporary file left behind by exit 2.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import random
import re
import signal
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
TRACES = sorted((ROOT / "traces").glob("*.yaml"))
CLASSES = ("bytes", "yaml", "semantic", "report", "argv")
PH = "@/"  # placeholder: the case directory (argv items starting with it are files)
EXIT_OK = (0, 1, 2)

# failure kinds, in the order a result is judged and tables list them
KINDS = ("traceback", "internal error", "bad exit status", "timeout", "memory", "crash",
         "message", "escape", "bad json", "output left")


@dataclass
class Case:
    cls: str
    key: str
    desc: str  # what was done, one line
    argv: list[str]  # kpool's arguments; "@/name" is `name` in the case directory
    files: dict[str, bytes] = field(default_factory=dict)  # written to the case directory
    env: dict[str, str] = field(default_factory=dict)
    under_test: tuple[str, ...] = ()  # files whose content is the hostile input
    json_stdout: bool = False  # exit 0/1 must print JSON on stdout
    json_files: tuple[str, ...] = ()  # exit 0/1 must leave these as JSON
    outputs: tuple[str, ...] = ()  # output files in the case directory (argv's)
    plain: bool = True  # no colour forced: stdout holds no control characters

    def to_json(self) -> dict:
        return {"cls": self.cls, "key": self.key, "desc": self.desc, "argv": self.argv,
                "env": self.env, "files": sorted(self.files)}


@dataclass
class Outcome:
    code: object  # the SystemExit code (None when main() raised), or "timeout" ...
    stdout: str
    stderr: str
    exc: str | None = None  # the traceback of an exception that escaped main()
    seconds: float = 0.0
    raw: str = ""  # fd-level output of a worker process (campaign only)


# --- small helpers ----------------------------------------------------------------------


_heavy = True  # set by make_case: False leaves out the slow inputs (for the suite)


def _big(*values):
    """`values` when heavy cases are allowed, else nothing (splice into a choice list)."""
    return list(values) if _heavy else []


def rng_for(key: str) -> random.Random:
    return random.Random(f"kpool-hostile:{key}")


def _weighted(rng: random.Random, table: list[tuple[float, object]]):
    total = sum(w for w, _ in table)
    x = rng.random() * total
    for w, v in table:
        x -= w
        if x < 0:
            return v
    return table[-1][1]


@functools.cache
def shipped() -> tuple[tuple[str, bytes], ...]:
    return tuple((p.name, p.read_bytes()) for p in TRACES)


@functools.cache
def shipped_trees() -> tuple[tuple[str, dict], ...]:
    return tuple((n, yaml.safe_load(b)) for n, b in shipped())


class Raw:
    """YAML (or JSON) text put into a document as it is."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        t = self.text if len(self.text) < 60 else self.text[:57] + "..."
        return f"Raw({t!r})"


# --- a YAML emitter that can put raw text anywhere -------------------------------------

_PLAIN_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _qstr(s: str, ascii_only: bool) -> str:
    return json.dumps(s, ensure_ascii=ascii_only)


def _scalar(v, ascii_only: bool) -> str:
    if isinstance(v, Raw):
        return v.text
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if v != v:
            return ".nan"
        if v in (float("inf"), float("-inf")):
            return ".inf" if v > 0 else "-.inf"
        return repr(v)
    if isinstance(v, str):
        # plain when it is safe and resolves to a string, else double-quoted
        if re.fullmatch(r"[0-9]+\.\.[0-9]+", v):
            return v  # a range, plain as people write it
        if re.fullmatch(r"[A-Za-z][A-Za-z0-9_.-]*", v) and v.lower() not in (
                "true", "false", "yes", "no", "on", "off", "null", "y", "n"):
            return v
        return _qstr(v, ascii_only)
    raise TypeError(type(v))


def flow(v, ascii_only: bool = True) -> str:
    if isinstance(v, list):
        return "[" + ", ".join(flow(x, ascii_only) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_key(k, ascii_only)}: {flow(x, ascii_only)}"
                               for k, x in v.items()) + "}"
    return _scalar(v, ascii_only)


def _key(k, ascii_only: bool) -> str:
    if isinstance(k, Raw):
        return k.text
    if isinstance(k, str) and _PLAIN_KEY.fullmatch(k):
        return k
    return _scalar(k, ascii_only)


def emit(doc, ascii_only: bool = True) -> str:
    """A trace-like YAML document: block mappings at the top and for `cache`, a block
    list of flow items for `ops`, flow style below that."""
    if not isinstance(doc, dict):
        return flow(doc, ascii_only) + "\n"
    out = []
    for k, v in doc.items():
        if isinstance(v, dict) and v and not isinstance(k, Raw):
            out.append(f"{_key(k, ascii_only)}:")
            out += [f"  {_key(k2, ascii_only)}: {flow(v2, ascii_only)}" for k2, v2 in v.items()]
        elif isinstance(v, list) and v:
            out.append(f"{_key(k, ascii_only)}:")
            out += [f"  - {flow(x, ascii_only)}" for x in v]
        else:
            out.append(f"{_key(k, ascii_only)}: {flow(v, ascii_only)}")
    return "\n".join(out) + "\n"


# --- hostile values ---------------------------------------------------------------------

_BIG_INTS = [0, -1, 1, 2, 3, 4, 5, 7, 8, 15, 16, 63, 64, 255, 256, 257, 4095, 4096, 4097,
             2**15, 2**16, 2**20, 2**20 + 1, 2**22, 2**22 + 1, 2**24, 2**24 + 1, 2**31 - 2**20,
             2**31 - 2**20 - 1, 2**31 - 1, 2**31, 2**32, 2**53 + 1, 2**63 - 1, 2**63, 2**64 - 1,
             2**64, -(2**31), -(2**31) - 1, -(2**63), -(2**63) - 1, -(2**64)]


def hostile_int(rng: random.Random):
    r = rng.random()
    if r < 0.55:
        return rng.choice(_BIG_INTS)
    if r < 0.65:
        return rng.randint(-(2**70), 2**70)
    n = rng.choice([19, 20, 21, 40, 100, 1000, 4299, 4300, 4301, 5000, 20000])
    sign = rng.choice(["", "-", "+"])
    forms = [
        sign + "9" * n,
        sign + "1" + "0" * (n - 1),
        sign + "0x" + "f" * rng.choice([8, 16, 17, 3600, 4000, 20000]),
        sign + "0o" + "7" * rng.choice([11, 22, 5000, 10000]),
        sign + "0b" + "1" * rng.choice([31, 32, 64, 65, 15000, 40000]),
        sign + "0" + "7" * rng.choice([11, 22, 5000]),  # YAML 1.1 octal
        sign + "1" + "_000" * rng.choice([3, 10, 2000]),
        sign + "1" + ":0" * rng.choice([1, 2, 5, 12, 2500, 3000, 6000]),  # sexagesimal
        sign + "59" + ":59" * rng.choice([3, 2500, 2700]),
        "0x_", "0b", "0o", "0x" + "g", "1__0", "0x8000_0000", "1:60", "00", "-0", "+0",
        "0x7fffffff", "0x80000000", "0xffffffffffffffff", "0b" + "1" * 64, "017777777777",
    ]
    return Raw(rng.choice(forms))


def hostile_float(rng: random.Random):
    return Raw(rng.choice([
        "0.5", "-0.0", "1.0", "4.0", "1e308", "1.0e+400", "-1.0e+400", ".inf", "-.inf", ".nan",
        ".NaN", "+.inf", "6.8523015e+5", "685.230_15e+03", "190:20:30.15", "1." + "0" * 5000,
        "1.5e-400", "3.", ".5", "1e3", "1E3",
    ]))


_STRINGS = [
    "", " ", "a", "-", "KP001", "kp001", "KP0001", "KP008", "KP999", "KP", "scatter-race",
    "rep-once", "cache-safe", "none", "0..4", "4..0", "0..0", "1..1", "0..4194304",
    "0..4194305", "0..2147483647", "0..2146435072", "2146435071..2146435073", "-1..3",
    "0...4", "..", "0..", "..4", "a..b", "0x10..0x20", " 0 .. 4 ", "\uff11..\uff14",
    "\u0663..\u0665", "\x1b[31mRED\x1b[0m", "\x1b]0;pwned\x07", "\x1b[2J\x1b[H", "\x1b[6n",
    "\x1b]8;;file:///etc/passwd\x1b\\link\x1b]8;;\x1b\\", "\r\roverwritten", "\u202eevil",
    "\u2066x\u2069", "\u200b", "\ufeffbom", "\x00", "\x07\x08\x7f", "\x85\u2028\u2029",
    "\x9b31m", "line\nbreak", "tab\there", "%s%n%x", "{0}{1}", "${HOME}", "$(id)",
    "[bold red]markup[/]", "[/]", "[/bold]", "[link=file:///etc/passwd]x[/link]",
    ":smile: :cross_mark:", "[", "]", "\\[escaped]", "<script>alert(1)</script>",
    "&amp;<>\"'", "\U0001f600", "\U0001f1fa\U0001f1f8", "e\u0301" * 20, "\u0663", "\ud7ff",
    "x" * 70000, "\n" * 2000, "a:b", "os:system", "json:loads", "kpool_cli.cli:main",
    "kpool_cli.engine.versions:REP_ONCE", "kpool_cli.engine.versions:VERSIONS", "<<", "=",
    "~", "null", "true", "1", "-1", "0x10", "1e3", "2001-12-14", "2001-12-14t21:59:43.10-05:00",
]


def hostile_str(rng: random.Random) -> str:
    s = rng.choice(_STRINGS)
    if rng.random() < 0.1:
        s = "".join(rng.choice(_STRINGS[:60]) for _ in range(rng.randint(2, 6)))
    return s


def deep(rng: random.Random) -> Raw:
    d = rng.choice([10, 31, 32, 33, 64, 100, 1000, 5000, 20000, *_big(200000)])
    kind = rng.random()
    if kind < 0.5:
        return Raw("[" * d + "0" + "]" * d)
    if kind < 0.8:
        return Raw("{a: " * d + "0" + "}" * d)
    return Raw("[" * d)  # never closed


def bomb(rng: random.Random) -> Raw:
    width = rng.choice([2, 4, 9, 10])
    levels = rng.choice([3, 6, 9, 12, 20])
    leaf = rng.choice(["0", "{seq: 0, pos: 0}", "[0, 1]", "x"])
    parts = [f"&b0 [{', '.join([leaf] * width)}]"]
    for i in range(1, levels):
        parts.append(f"&b{i} [{', '.join([f'*b{i - 1}'] * width)}]")
    return Raw("[" + ", ".join(parts) + "]")


def tagged(rng: random.Random) -> Raw:
    return Raw(rng.choice([
        "!!python/object/apply:os.system ['touch PWNED']",
        "!!python/object/apply:subprocess.check_output [[id]]",
        "!!python/name:os.system", "!!python/object:argparse.Namespace {a: 1}",
        "!!python/tuple [1, 2]", "!!python/bytes aGk=", "!!binary aGVsbG8=", "!!set {a, b}",
        "!!omap [{a: 1}, {b: 2}]", "!!pairs [[a, 1]]", "!custom 5", "!<tag:yaml.org,2002:int> 5",
        "!!int 5", "!!str 5", "!!float 5", "!!int '0x10'", "!!int 1" + "0" * 5000, "!!bool yes",
        "!!null ''", "! 5", "!!map {}", "!!seq []", "!!timestamp 2001-01-01", "!!int x",
        "!!float x", "!!bool 2", "!!timestamp x", "!!value =", "!!merge <<", "!!yaml x",
        "!e!x 5", "!!int [1]", "!!str {a: 1}", "!!python/none ''",
    ]))


def alias_trick(rng: random.Random) -> Raw:
    return Raw(rng.choice([
        "*nosuch", "&a [*a]", "&a {x: *a}", "&a 5", "&a [1, 2]", "{<<: {seq: 0}, pos: 1}",
        "{<<: [{seq: 0}, {pos: 1}]}", "{<<: 5}", "{<<: *nosuch}", "&x &y 5",
        "{? [1, 2] : 3}", "{? {a: 1} : 3}", "{[1]: 2}", "{null: 1}", "{1: 2}", "{true: 1}",
        "{1.5: 1}", "{~: 1}",
    ]))


def hostile_value(rng: random.Random, depth: int = 0):
    kind = _weighted(rng, [(6, "int"), (2, "float"), (1, "bool"), (1, "null"), (5, "str"),
                           (1.5, "deep"), (1, "bomb"), (2, "tag"), (2, "alias"), (2, "list"),
                           (1.5, "dict"), (0.5, "long")])
    if kind == "int":
        return hostile_int(rng)
    if kind == "float":
        return hostile_float(rng)
    if kind == "bool":
        return rng.choice([True, False, Raw("yes"), Raw("No"), Raw("on"), Raw("OFF"), Raw("y")])
    if kind == "null":
        return rng.choice([None, Raw("~"), Raw(""), Raw("Null")])
    if kind == "str":
        return hostile_str(rng)
    if kind == "deep":
        return deep(rng)
    if kind == "bomb":
        return bomb(rng)
    if kind == "tag":
        return tagged(rng)
    if kind == "alias":
        return alias_trick(rng)
    if kind == "long":
        n = rng.choice([1000, 70000, *_big(300000)])
        return Raw("[" + ", ".join(["0"] * n) + "]")
    if depth > 2:
        return 0
    if kind == "list":
        return [hostile_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    return {rng.choice(["seq", "pos", "a", "kv_size", "x"]): hostile_value(rng, depth + 1)
            for _ in range(rng.randint(0, 3))}


# --- case building ----------------------------------------------------------------------


def _trace_argv(rng: random.Random, name: str, *, small: bool = True) -> tuple[list[str], dict]:
    """A replay or diff of trace `name` with benign options (values, navigation, views,
    a shipped trace beside it); returns argv and the Case fields that follow."""
    flags: dict = {"json_stdout": False, "json_files": (), "outputs": (), "plain": True,
                   "env": {}}
    others = [str(p) for p in TRACES]
    if rng.random() < 0.2 and not name.endswith(".json"):  # a .json is a report to diff
        argv = ["diff", PH + name]
        if rng.random() < 0.15:
            argv.append(rng.choice(others))
            if rng.random() < 0.3:
                argv += ["--jobs", "2"]
        if rng.random() < 0.5:
            argv += ["--format", "json"]
            flags["json_stdout"] = True
        elif rng.random() < 0.3:
            flags["env"] = {"FORCE_COLOR": "1", "COLUMNS": rng.choice(["40", "100", "250"])}
            flags["plain"] = False
        if rng.random() < 0.3:
            argv += ["--base", rng.choice(["rep-once", "cache-safe"])]
        if rng.random() < 0.2:
            argv += ["--fail-on-change"]
        if small and rng.random() < 0.2:
            argv += ["--backend", rng.choice(["numpy", "numba"])]
        return argv, flags
    argv = ["replay", PH + name]
    if rng.random() < 0.1:
        argv.insert(rng.choice([1, 2]), rng.choice(others))
    backend = "none"
    if small:
        backend = _weighted(rng, [(7, "none"), (1.5, "numpy"), (1.5, "numba")])
    argv += ["--backend", backend]
    if rng.random() < 0.4:
        argv += ["--engine", rng.choice(["rep-once", "cache-safe"])]
    if rng.random() < 0.3:
        argv.append("--check")
    if rng.random() < 0.1:
        argv += ["--pools", "all"]
    if rng.random() < 0.1:
        argv += ["--fail-on", rng.choice(["warning", "never", "error"])]
    for _ in range(rng.choice([0, 0, 0, 1, 2])):  # navigation of the text view
        argv += rng.choice([["--ubatch", rng.choice(["0", "1", "2..5", "3..", "0..1", "100"])],
                            ["--seq", rng.choice(["0", "1", "3", "255"])], ["--only-findings"],
                            ["--all-ubatches"]])
    r = rng.random()
    if r < 0.3:
        argv += ["--format", "json"]
        if rng.random() < 0.3:
            argv += ["-o", PH + "out.json"]
            flags["json_files"] = ("out.json",)
            flags["outputs"] = ("out.json",)
        else:
            flags["json_stdout"] = True
    elif r < 0.5:
        argv += ["--color"]
        flags["plain"] = False
        if rng.random() < 0.4:
            flags["env"] = {"COLUMNS": rng.choice(["1", "5", "20", "40", "80", "200", "300",
                                                   "5000"])}
        if rng.random() < 0.3:
            out = rng.choice(["view.svg", "view.html"])
            argv += ["--svg" if out.endswith("svg") else "--html", PH + out]
            flags["outputs"] = (out,)
    elif r < 0.55:
        argv += ["--no-color", "--all-ubatches"]
    elif r < 0.6:
        argv += ["--quiet", "-o", PH + "out.txt"]
        flags["outputs"] = ("out.txt",)
    return argv, flags


_NAMES = ["t\x1b[2J.yaml", "t\n.yaml", "t\u202e.yaml", "t .yaml", "t:1:2.yaml", "trace",
          "t.yml", "t.YAML", "t\udcff.yaml", "\u00e9t\u00e9.yaml", "t'\".yaml", "t.json"]


def _trace_name(rng: random.Random) -> str:
    """The trace's file name: t.yaml, or one with escapes, a line break, no extension..."""
    return rng.choice(_NAMES) if rng.random() < 0.08 else "t.yaml"


def case_bytes(rng: random.Random, key: str) -> Case:
    traces = shipped()
    name, data = rng.choice(traces)
    buf = bytearray(data)
    done = []
    tokens = [b"\x00", b"\xff", b"\xfe", b"\xef\xbb\xbf", b"\r", b"\r\n", b"\t", b": ", b"- ",
              b"[", b"]", b"{", b"}", b"&a ", b"*a", b"!!", b"!", b"%", b"|", b">", b"#", b"'",
              b'"', b"..", b"---\n", b"...\n", b"\x1b[2J", b"\xc3", b"\xe2\x80\xae", b"9" * 30,
              b"-", b"\\", b"\n  ", b"<<: ", b"? ", b"@", b"`", b",", b"\x85", b"\xc2\x85",
              b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"0x", b"\n- ", b"  ", b"\x0c", b"~"]
    for _ in range(rng.choice([1, 1, 1, 2, 2, 3, 5, 10])):
        if not buf:
            buf += b"\n"
        op = _weighted(rng, [(3, "flip"), (3, "set"), (3, "insert"), (2, "delete"), (1, "dup"),
                             (1, "truncate"), (1, "splice"), (1, "swap-lines"), (0.3, "repeat")])
        i = rng.randrange(len(buf) + 1)
        if op == "flip" and i < len(buf):
            buf[i] ^= 1 << rng.randrange(8)
        elif op == "set" and i < len(buf):
            buf[i] = rng.randrange(256)
        elif op == "insert":
            ins = rng.choice(tokens) if rng.random() < 0.7 else bytes(
                rng.randrange(256) for _ in range(rng.randint(1, 8)))
            buf[i:i] = ins
        elif op == "delete":
            del buf[i:i + rng.choice([1, 1, 2, 5, 20, 200])]
        elif op == "dup":
            j = min(len(buf), i + rng.randint(1, 80))
            buf[i:i] = buf[i:j]
        elif op == "truncate":
            del buf[i:]
        elif op == "splice":
            _, other = rng.choice(traces)
            j = rng.randrange(len(other) + 1)
            buf = buf[:i] + bytearray(other[j:])
        elif op == "swap-lines":
            lines = bytes(buf).split(b"\n")
            a, b = rng.randrange(len(lines)), rng.randrange(len(lines))
            lines[a], lines[b] = lines[b], lines[a]
            buf = bytearray(b"\n".join(lines))
        elif op == "repeat":  # up to just past the loader's 64 MiB bound, no further
            times = rng.choice([2, 50, *_big(2000, 70000)])
            buf = buf * max(1, min(times, (70 << 20) // max(1, len(buf))))
        done.append(op)
    fname = _trace_name(rng)
    argv, flags = _trace_argv(rng, fname)
    return Case("bytes", key, f"{name}: {' '.join(done)}", argv, {fname: bytes(buf)},
                under_test=(fname,), **flags)


def _paths(tree, prefix=()):
    """Every (path, value) of a parsed document, containers included."""
    yield prefix, tree
    if isinstance(tree, dict):
        for k, v in tree.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(tree, list):
        for i, v in enumerate(tree):
            yield from _paths(v, (*prefix, i))


def _set(tree, path, value):
    if not path:
        return value
    node = tree
    for p in path[:-1]:
        node = node[p]
    node[path[-1]] = value
    return tree


def _containers(tree):
    return [(p, v) for p, v in _paths(tree) if isinstance(v, dict | list)]


def _copy(tree):
    return json.loads(json.dumps(tree))


def _desc_path(path) -> str:
    return ".".join(str(p) for p in path) or "<root>"


def case_yaml(rng: random.Random, key: str) -> Case:
    name, tree0 = rng.choice(shipped_trees())
    tree = _copy(tree0)
    ascii_only = rng.random() < 0.7
    kind = _weighted(rng, [(10, "value"), (2, "delete"), (2, "unknown-key"), (2, "dup-key"),
                           (1, "anchor-reuse"), (4, "document")])
    desc = kind
    text: str | None = None
    data: bytes | None = None
    if kind in ("value", "delete", "unknown-key"):
        for _ in range(rng.choice([1, 1, 1, 2, 3])):
            paths = list(_paths(tree))
            if kind == "value":
                path, _ = rng.choice(paths)
                v = hostile_value(rng)
                tree = _set(tree, path, v)
                desc += f" {_desc_path(path)}={v!r:.60}"
            elif kind == "delete":
                path, _ = rng.choice(paths[1:])
                parent = tree
                for p in path[:-1]:
                    parent = parent[p]
                del parent[path[-1]]
                desc += f" del {_desc_path(path)}"
            else:
                maps = [(p, v) for p, v in _containers(tree) if isinstance(v, dict)]
                path, m = rng.choice(maps)
                k = rng.choice(["kv_sise", "Kpool", "n_rs_seq", "seqs", "pos ", "x" * 300,
                                "\x1b[31mkey", "ops", "cache", "decode", "kpool_trace", "tokens",
                                "", "\u202ekey", "1", "note", "expect"])
                if k in m:  # would not be unknown
                    k += "_"
                m[k] = hostile_value(rng) if rng.random() < 0.5 else 0
                desc += f" add {_desc_path(path)}[{k!r:.40}]"
        text = emit(tree, ascii_only)
    elif kind == "dup-key":
        text = emit(tree, ascii_only)
        lines = text.split("\n")
        cands = [i for i, ln in enumerate(lines) if re.match(r"\s*[A-Za-z_]+:", ln)]
        i = rng.choice(cands)
        lines.insert(i + 1, lines[i])
        text = "\n".join(lines)
        desc += f" line {i + 1}"
        if rng.random() < 0.5:  # also inside a flow mapping
            text = text.replace("{seq: ", "{seq: 1, seq: ", 1)
    elif kind == "anchor-reuse":
        text = emit(tree, ascii_only)
        # anchor the first decode's body and alias it many times
        m = re.search(r"- decode: (\{.*\})\n", text)
        if m:
            n = rng.choice([2, 100, 10000, *_big(300000)])
            text = text.replace(m.group(0), f"- decode: &d {m.group(1)}\n", 1)
            text = text.rstrip("\n") + "\n" + "  - decode: *d\n" * n
            desc += f" x{n}"
        else:
            text += "x: &a 1\ny: *a\n"
    else:
        text, data, what = _document_mutation(rng, tree, ascii_only)
        desc += " " + what
    if data is None:
        data = text.encode("utf-8", "surrogatepass")
    fname = _trace_name(rng)
    argv, flags = _trace_argv(rng, fname)
    return Case("yaml", key, f"{name}: {desc}", argv, {fname: data}, under_test=(fname,),
                **flags)


def _document_mutation(rng: random.Random, tree, ascii_only: bool
                       ) -> tuple[str, bytes | None, str]:
    text = emit(tree, ascii_only)
    what = rng.choice(["multi-doc", "multi-doc-empty", "end-marker", "directive", "tag-directive",
                       "latin1", "utf16", "utf32", "bom", "bom-twice", "crlf", "cr", "tabs",
                       "nul", "empty", "comment-only", "scalar-root", "list-root", "null-root",
                       "long-line", "trailing-garbage", "json-syntax", "block-scalar",
                       "deep-block", "many-keys", "huge-doc", "lone-surrogate", "nel",
                       "all-flow", "indent-mix", "ops-mapping"])
    data = None
    if what == "multi-doc":
        text = text + "---\n" + text
    elif what == "multi-doc-empty":
        text = "---\n" + text + "---\n"
    elif what == "end-marker":
        text = text + "...\n" + rng.choice(["", "garbage: [\n", "---\nx: 1\n"])
    elif what == "directive":
        text = rng.choice(["%YAML 1.2\n---\n", "%YAML 1.1\n---\n", "%YAML 2.0\n---\n",
                           "%YAML 1.1\n%YAML 1.1\n---\n", "%FOO bar\n---\n"]) + text
    elif what == "tag-directive":
        text = "%TAG !e! tag:example.com,2000:\n---\n" + text.replace(
            "kv_size: ", "kv_size: !e!int ", 1)
    elif what == "latin1":
        text = text.replace("\n", " # caf\u00e9\n", 1)
        data = text.encode("latin-1", "replace")
    elif what in ("utf16", "utf32"):
        data = text.encode("utf-16" if what == "utf16" else "utf-32")
    elif what == "bom":
        text = "\ufeff" + text
    elif what == "bom-twice":
        text = "\ufeff\ufeff" + text
    elif what == "crlf":
        text = text.replace("\n", "\r\n")
    elif what == "cr":
        text = text.replace("\n", "\r")
    elif what == "nel":
        text = text.replace("\n", "\x85")
    elif what == "tabs":
        text = text.replace("  ", "\t")
    elif what == "indent-mix":
        text = text.replace("\n  - ", "\n - ", 1)
    elif what == "nul":
        i = rng.randrange(len(text))
        text = text[:i] + "\x00" + text[i:]
    elif what == "empty":
        text = rng.choice(["", "\n", "   \n\n", "---\n", "---\n...\n", "\ufeff"])
    elif what == "comment-only":
        text = "# just a comment\n"
    elif what == "scalar-root":
        text = rng.choice(["5\n", "kpool_trace\n", "'x'\n", "!!python/object/apply:os.system "
                                                             "['id']\n", "1" + "0" * 5000 + "\n"])
    elif what == "list-root":
        text = "- kpool_trace: 1\n- " + flow(tree, True) + "\n"
    elif what == "null-root":
        text = "~\n"
    elif what == "long-line":
        text = text.replace("\n", " # " + "x" * rng.choice([10**4, *_big(10**6)]) + "\n", 1)
    elif what == "trailing-garbage":
        text += rng.choice(["]", "}", "x", ": :", "- a", "\x00", "&", "*", "!", "|\n  x",
                            "\"unterminated"])
    elif what == "json-syntax":
        text = json.dumps(tree)
    elif what == "block-scalar":
        text = text.replace("kpool_trace: 1", "kpool_trace: |\n  1", 1)
    elif what == "deep-block":
        d = rng.choice([40, 1000, 10000])
        text += "x:\n" + "".join(" " * i + "- \n" for i in range(1, d))
    elif what == "many-keys":
        n = rng.choice([50, 10000, *_big(200000)])
        text += "".join(f"k{i}: {i}\n" for i in range(n))
    elif what == "huge-doc":
        text += "note_pad: [" + ", ".join(["1"] * rng.choice([10**4, *_big(10**6)])) + "]\n"
    elif what == "lone-surrogate":
        text = text.replace("\n", ' # "\ud800"\n', 1)
        data = text.encode("utf-8", "surrogatepass")
    elif what == "all-flow":
        text = flow(tree, ascii_only) + "\n"
    elif what == "ops-mapping":
        text = re.sub(r"\nops:\n(.*)", "\nops: {decode: {seq: 0, pos: 0}}\n", text, flags=re.S)
    return text, data, what


# --- semantic: valid YAML of the format, with edge values --------------------------------


def _pos(rng: random.Random, start: int, n: int):
    form = rng.random()
    if form < 0.6:
        return f"{start}..{start + n}" if n != 1 or rng.random() < 0.5 else start
    if form < 0.8 and n <= 64:
        return list(range(start, start + n))
    return start


def random_trace(rng: random.Random, *, big: bool) -> tuple[dict, str]:
    """A trace generated from scratch: a plausible story (seq ids in range, decodes that
    fit the cache, slots read after they are written) with, in one trace out of three,
    edges sprinkled in (ids out of range, cells taken or out of range, sizes past the
    cache, unknown engines). `big` allows configs and ranges up to the format's limits
    (slower cases)."""
    edgy = rng.random() < 0.35

    def edge(p: float) -> bool:
        return edgy and rng.random() < p

    n_seq_max = _weighted(rng, [(4, 1), (4, 2), (2, 3), (2, 4), (1, 8), (0.5, 64), (0.5, 256)]
                          + ([(0.1, 257), (0.05, 0)] if edgy else []))
    unified = rng.random() < 0.7
    by_order = rng.random() < 0.2
    kv_choices = [(2, 1), (2, 2), (2, 3), (2, 4), (2, 5), (3, 8), (4, 16), (4, 32), (4, 64),
                  (2, 100), (2, 256), (1, 1024), (0.5, 4096)]
    if big:
        kv_choices += [(0.5, 65536), (0.5, 2**20), (0.5, 2**24), (0.05, 2**24 + 1),
                       (0.05, 0), (0.05, -1)]
    kv_size = _weighted(rng, kv_choices)
    span = max(1, kv_size)
    kpool = _weighted(rng, [(2, 1), (2, 2), (1, 3), (6, 4), (1, 5), (2, 8), (1, 16),
                            (0.5, span)] + ([(0.3, span + 1), (0.05, 0)] if edgy else []))
    if not edgy:
        kpool = min(kpool, span)
    n_ubatch = _weighted(rng, [(5, 512), (2, 1), (2, 2), (1, 3), (2, 4), (1, 7), (2, 8), (1, 64),
                               (0.3, 2**20)] + ([(0.05, 2**20 + 1)] if edgy else []))
    n_embd = _weighted(rng, [(6, 16), (2, 1), (1, 2), (1, 3), (1, 64), (0.5, 128),
                             (0.3 if big else 0.05, 4096)] + ([(0.05, 4097)] if edgy else []))
    cache: dict = {"kv_size": kv_size, "kpool": kpool}
    for k, v, p in (("n_seq_max", n_seq_max, 0.9), ("unified", unified, 0.6),
                    ("by_order", by_order, 0.6), ("n_ubatch", n_ubatch, 0.6),
                    ("n_embd", n_embd, 0.5)):
        if rng.random() < p or (k == "by_order" and by_order) or (k == "n_seq_max" and
                                                                   n_seq_max != 1):
            cache[k] = v
    if edge(0.05):
        cache["n_rs_seq"] = rng.choice([0, 1, 4])  # TRACE_FORMAT.md lists it
    doc: dict = {"kpool_trace": 1}
    if rng.random() < 0.3:
        doc["name"] = hostile_str(rng) if rng.random() < 0.3 else "gen"
    if rng.random() < 0.2:
        doc["description"] = hostile_str(rng)
    doc["cache"] = cache
    if rng.random() < 0.3:
        doc["engine"] = rng.choice(["rep-once", "cache-safe"]
                                   + (["nope", "os:system", "kpool_cli.engine.versions:REP_ONCE"]
                                      if edgy else []))
    if rng.random() < 0.3:
        doc["seed"] = rng.choice([0, 1, 2**32, 2**64 - 1, 12345] + ([2**64, -1] if edgy else []))
    n_seqs = max(1, n_seq_max)
    room = span  # tokens a stream can hold: one decode never asks for more (unless edgy)

    def seq_id() -> int:
        if edge(0.1):
            return rng.choice([n_seqs, -1, 256, 2**31])
        return rng.randrange(n_seqs)

    def two_seqs() -> list[int]:
        a = seq_id()
        if edge(0.2):
            return [a, seq_id()]
        b = rng.randrange(n_seqs)
        return [a, b] if b != a else [a]

    ops: list = []
    next_pos: dict[int, int] = {}
    slots: list[str] = []
    for _ in range(rng.randint(1, 40 if not big else 12)):
        op = _weighted(rng, [(10, "decode"), (3, "tokens"), (1, "ubatches"), (2, "seq_cp"),
                             (2, "seq_rm"), (1, "seq_add"), (1, "seq_div"), (1, "seq_keep"),
                             (1, "state_write"), (1, "state_read"), (0.7, "state_drop"),
                             (0.4, "clear"), (0.6, "note"), (3, "expect")])
        s = seq_id()
        if op == "decode":
            start = next_pos.get(s, 0)
            if edge(0.15) or rng.random() < 0.05:
                start = rng.choice([0, 1, 5, POS_MAX - 1000, POS_MAX - 1]
                                   + ([POS_MAX, 2**31 - 1] if edgy else []))
            n = _weighted(rng, [(10, rng.randint(1, 8)), (3, rng.randint(1, room))]
                          + ([(0.5, room + 1), (0.3, 0)] if edgy else [])
                          + ([(0.4, 4096), (0.3, 65536), (0.2, 2**22), (0.1, 2**22 + 1)]
                             if big else []))
            if not edgy:
                n = max(1, min(n, room))
                start = min(start, POS_MAX - n)
            body: dict = {"seq": s if rng.random() < 0.85 else two_seqs(),
                          "pos": _pos(rng, start, n)}
            if (by_order and rng.random() < 0.3) or edge(0.03):
                body["ext"] = [rng.randint(0, 3), rng.randint(0, 3)]
            if edge(0.05):
                body["cell"] = rng.choice([0, 1, span - 1, span, -1])
            ops.append({"decode": body})
            if s >= 0:
                next_pos[s] = start + n
        elif op in ("tokens", "ubatches"):
            toks = []
            with_cells = rng.random() < 0.25
            free = list(range(span))
            rng.shuffle(free)
            for _t in range(rng.randint(1, min(10, room) if not edgy else 10)):
                seqs = [seq_id()] if rng.random() < 0.8 else two_seqs()
                p = min(max(next_pos.get(x, 0) for x in seqs), POS_MAX - 1)
                if edge(0.2):
                    p = rng.randint(0, 20)
                tok: dict = {"pos": p, "seq": seqs}
                for x in seqs:
                    next_pos[x] = p + 1
                if by_order and rng.random() < 0.5:
                    tok["ext"] = [rng.randint(0, 2), rng.randint(0, 2)]
                if with_cells:
                    tok["cell"] = (rng.choice([rng.randrange(span), span, 0]) if edgy
                                   else free.pop() if free else 0)
                toks.append(tok)
            if op == "tokens":
                ops.append({"decode": {"tokens": toks}})
            else:
                step = rng.randint(1, min(len(toks), n_ubatch))
                split = [toks[i:i + step] for i in range(0, len(toks), step)]
                if edge(0.2):
                    split.append([])
                ops.append({"decode": {"ubatches": split}})
        elif op == "seq_cp":
            body = {"src": s, "dst": seq_id()}
            if rng.random() < 0.4:
                body |= {"p0": rng.choice([-1, 0, 2, 4]),
                         "p1": rng.choice([-1, 3, 8] + ([2**31] if edgy else []))}
            ops.append({"seq_cp": body})
        elif op == "seq_rm":
            body = {"seq": s if not rng.random() < 0.1 else -1}
            if rng.random() < 0.6:
                body |= {"p0": rng.choice([-1, 0, 1, 4, 7]), "p1": rng.choice([-1, 2, 8, 100])}
            ops.append({"seq_rm": body})
        elif op == "seq_add":
            ops.append({"seq_add": {"seq": s, "p0": rng.choice([-1, 0, 4]),
                                    "p1": rng.choice([-1, 8]),
                                    "shift": rng.choice([-2, -1, 1, 4] + ([
                                        -(2**31), 2**31 - 1, 2**31 - 2**20] if edgy else []))}})
        elif op == "seq_div":
            ops.append({"seq_div": {"seq": s, "p0": rng.choice([-1, 0, 4]),
                                    "p1": rng.choice([-1, 8]),
                                    "d": rng.choice([1, 2, 3] + ([0, -1, 2**31] if edgy else []))
                                    }})
        elif op == "seq_keep":
            ops.append({"seq_keep": {"seq": s}})
        elif op == "state_write":
            slot = rng.choice(["a", "b", "prompt", "x" * 200]
                              + (["", "\x1b[31m"] if edgy else []))
            slots.append(slot)
            ops.append({"state_write": {"seq": s, "slot": slot}})
        elif op == "state_read":
            if not slots and not edgy:
                continue
            slot = rng.choice(slots) if slots and not edge(0.3) else rng.choice(
                ["nosuch", "a", ""])
            ops.append({"state_read": {"seq": s, "slot": slot}})
        elif op == "state_drop":
            ops.append({"state_drop": {"seq": rng.choice([s, -1])}})
        elif op == "clear":
            ops.append({"clear": {}})
        elif op == "note":
            ops.append({"note": hostile_str(rng) if rng.random() < 0.5 else "a note"})
        else:
            if not edgy and not any(next(iter(o)) not in ("note", "expect") for o in ops):
                continue
            ops.append({"expect": random_expect(rng, n_seqs, edgy)})
    doc["ops"] = ops
    return doc, f"gen{' edgy' if edgy else ''} kv={kv_size} kpool={kpool} seqs={n_seq_max} " \
                f"ops={len(ops)}"


POS_MAX = 2**31 - 2**20  # positions are below this (TRACE_FORMAT limits)


def random_expect(rng: random.Random, n_seqs: int, edgy: bool = True) -> dict:
    e: dict = {}
    if rng.random() < 0.4:
        e["engine"] = rng.choice(["rep-once", "cache-safe"] + (["nope"] if edgy else []))
    if rng.random() < 0.6:
        e["findings"] = rng.sample(["KP001", "KP002", "KP003", "KP004", "KP005", "KP006",
                                    "KP007"] + (["KP999", "scatter-race"] if edgy else []),
                                   rng.randint(0, 3))
    if rng.random() < 0.4:
        e["n_new"] = rng.choice([0, 1, 2, 3] + ([-1, 2**31] if edgy else []))
    if rng.random() < 0.2:
        e["n_new_g"] = rng.choice([0, 1, 5])
    if rng.random() < 0.3:
        pools = [[rng.randrange(n_seqs), rng.randint(0, 4)] for _ in range(rng.randint(0, 3))]
        e["pools"] = pools if edgy else [list(p) for p in dict.fromkeys(map(tuple, pools))]
    if rng.random() < 0.2:
        e["status"] = rng.choice(["applied", "rejected", "aborted"] + (["weird"] if edgy else []))
    if rng.random() < 0.15:
        e["ubatch"] = rng.choice([0, 1, 5] + ([-1] if edgy else []))
    return e


def semantic_mutation(rng: random.Random) -> tuple[dict, str]:
    """A shipped trace with one to three edge edits that keep it well-formed YAML."""
    name, tree0 = rng.choice(shipped_trees())
    tree = _copy(tree0)
    edits = []
    for _ in range(rng.randint(1, 3)):
        what = rng.choice(["swap-seqs", "kv_size", "n_embd", "n_ubatch", "n_seq_max", "kpool",
                           "big-range", "cell", "state_read", "expect", "by_order-ext",
                           "unified", "drop-op", "dup-op", "shift-pos", "seq-out-of-range"])
        if _heavy and rng.random() < 0.015:  # seconds and gigabytes each: a few suffice
            what = rng.choice(["many-streams", "huge-range", "huge-prefill"])
        cache, ops = tree["cache"], tree["ops"]
        if what == "swap-seqs":
            a, b = rng.sample(range(max(2, cache.get("n_seq_max", 1))), 2)
            txt = json.dumps(ops)
            swap = {a: b, b: a}
            txt = re.sub(r'("(?:seq|src|dst)": )(\d+)', lambda m, swap=swap: m.group(1) + str(
                swap.get(int(m.group(2)), int(m.group(2)))), txt)
            tree["ops"] = json.loads(txt)
        elif what == "kv_size":
            cache["kv_size"] = rng.choice([1, 2, 4, 12, 13, 2**16, 2**20, 2**24])
        elif what == "n_embd":
            cache["n_embd"] = rng.choice([1, 3, 128, 1024, 4096])
        elif what == "n_ubatch":
            cache["n_ubatch"] = rng.choice([1, 2, 3, 2**20])
        elif what == "n_seq_max":
            cache["n_seq_max"] = rng.choice([1, 3, 255, 256])
        elif what == "kpool":
            cache["kpool"] = rng.choice([1, 2, 3, 7, 64, cache["kv_size"]])
        elif what == "huge-prefill":  # a valid 2**22-token decode into a cache that holds it
            cache |= {"kv_size": rng.choice([2**22, 2**23, 2**24]), "unified": True}
            ops.insert(0, {"decode": {"seq": 0, "pos": f"0..{rng.choice([2**20, 2**21, 2**22])}"}})
        elif what == "many-streams":  # kv_size * n_stream * n_embd near the 2**31 bound
            cache |= {"n_seq_max": 256, "unified": False, "n_embd": 1,
                      "kv_size": rng.choice([2**12, 2**16, 2**20, 2**23])}
        elif what == "unified":
            cache["unified"] = not cache.get("unified", True)
        elif what in ("big-range", "huge-range"):
            n = rng.choice([4096, 65536]) if what == "big-range" else rng.choice(
                [2**21, 2**22, 2**22 + 1])
            ops.insert(rng.randint(0, len(ops)), {"decode": {"seq": 0, "pos": f"0..{n}"}})
        elif what == "cell":
            ops.insert(rng.randint(0, len(ops)), {"decode": {"tokens": [
                {"pos": rng.randint(0, 40), "seq": [0],
                 "cell": rng.choice([0, 1, cache["kv_size"] - 1, cache["kv_size"], 2**31])}]}})
        elif what == "state_read":
            ops.insert(rng.randint(0, len(ops)),
                       {"state_read": {"seq": 0, "slot": rng.choice(["nosuch", "prompt"])}})
        elif what == "expect":
            ops.insert(rng.randint(0, len(ops)),
                       {"expect": random_expect(rng, cache.get("n_seq_max", 1))})
        elif what == "by_order-ext":
            cache["by_order"] = True
            ops.append({"decode": {"tokens": [{"pos": 50, "seq": [0], "ext": [0, i]}
                                              for i in range(rng.randint(1, 9))]}})
        elif what == "drop-op" and ops:
            del ops[rng.randrange(len(ops))]
        elif what == "dup-op" and ops:
            i = rng.randrange(len(ops))
            ops.insert(i, _copy(ops[i]))
        elif what == "shift-pos":
            txt = json.dumps(ops)
            d = rng.choice([1, -1, 100, 2**31 - 2**20 - 64])
            txt = re.sub(r'("pos": )(\d+)',
                         lambda m, d=d: m.group(1) + str(int(m.group(2)) + d), txt)
            tree["ops"] = json.loads(txt)
        elif what == "seq-out-of-range":
            txt = json.dumps(ops)
            tree["ops"] = json.loads(txt.replace('"seq": 0', f'"seq": {cache.get("n_seq_max", 1)}',
                                                 1))
        edits.append(what)
    return tree, f"{name}: {' '.join(edits)}"


def _elems(tree: dict) -> int:
    """kv_size * n_stream * n_embd of a generated trace (what a value backend holds)."""
    c = tree.get("cache", {})
    try:
        streams = 1 if c.get("unified", True) else c.get("n_seq_max", 1)
        return int(c["kv_size"]) * int(streams) * int(c.get("n_embd", 16))
    except (KeyError, TypeError, ValueError):
        return 0


def case_semantic(rng: random.Random, key: str) -> Case:
    if rng.random() < 0.55:
        tree, desc = random_trace(rng, big=_heavy and rng.random() < 0.08)
    else:
        tree, desc = semantic_mutation(rng)
    data = emit(tree, False).encode("utf-8", "surrogatepass")
    small = _elems(tree) <= 2**22 and b"..4194" not in data and b"..2097" not in data
    fname = _trace_name(rng)
    argv, flags = _trace_argv(rng, fname, small=small or rng.random() < 0.03)
    return Case("semantic", key, desc, argv, {fname: data}, under_test=(fname,), **flags)


# --- reports for `kpool diff` -----------------------------------------------------------


@functools.cache
def base_reports() -> tuple[tuple[str, str, str, str], ...]:
    """(trace, engine, backend, JSON text) of real `kpool replay --format json` reports of
    the shipped traces, and of all of them at once (an array)."""
    out = []
    for engine in ("cache-safe", "rep-once"):
        for backend in ("none", "numpy"):
            for p in TRACES:
                o = run_argv(["replay", str(p), "--format", "json", "--backend", backend,
                              "--engine", engine])
                if o.code not in (0, 1) or o.exc:
                    raise RuntimeError(f"cannot make a base report of {p.name}: {o.stderr}"
                                       f"{o.exc or ''}")
                out.append((p.name, engine, backend, o.stdout))
        o = run_argv(["replay", *map(str, TRACES), "--format", "json", "--backend", "none",
                      "--engine", engine])
        out.append(("*", engine, "none", o.stdout))
    return tuple(out)


_JSON_VALUES = [
    "1" + "0" * 5000, "-1", "0", "1", "2", "-0", "9223372036854775807", "9223372036854775808",
    "-9223372036854775809", "18446744073709551616", "1.5", "1.0", "1e999", "-1e999", "1e-999",
    "NaN", "Infinity", "-Infinity", "true", "false", "null", '""', '"KP999"', '"KP008"',
    '"KP1"', '"kp001"', '"KP0010"', '"KP001\\u001b[31m"', '"\\ud800"', '"\\udfff\\ud800"',
    '"\\u0000"', '"\\u001b]0;x\\u0007"', '"\\u202e"', '"[bold]x[/]"', '"[/]"', "[]", "{}", "[[]]",
    '{"": 0}', '"' + "x" * 100000 + '"', "[" + ",".join(["0"] * 100000) + "]",
    '"rep-once"', '"cache-safe"', '"numba"', '"cuda"', '"none"', '"applied"', '"invalid"',
    '"fail"', '"aborted"', '"0"', '"-1"', '"99999999999999999999"', '"' + "a" * 64 + '"',
    '"' + "A" * 64 + '"', '"' + "0" * 63 + '"', "[-1]", "[1e999]", '[0, "x"]', '{"0": -1}',
    '{"x": 0}', '{"99999999999999999999": 0}', '{"-1": 0}', "[[0, 1]]",
]


def _deep_json(rng: random.Random) -> str:
    d = rng.choice([7, 99, 100, 101, 1000, 5000, 100000, 1000000])
    if rng.random() < 0.6:
        return "[" * d + "]" * d
    return '{"a":' * d + "0" + "}" * d


class _RawJSON:
    def __init__(self, text: str) -> None:
        self.text = text


def _dumps(v, indent: int | None = None) -> str:
    """json.dumps with _RawJSON put in as it is."""
    marks: list[str] = []

    def default(o):
        if isinstance(o, _RawJSON):
            marks.append(o.text)
            return f"\x00RAW{len(marks) - 1}\x00"
        raise TypeError(type(o))

    s = json.dumps(v, default=default, ensure_ascii=False, indent=indent)
    return re.sub(r'"\\u0000RAW(\d+)\\u0000"', lambda m: marks[int(m.group(1))], s)


def mutate_report(rng: random.Random, text: str) -> tuple[str | bytes, str]:
    doc = json.loads(text)
    kind = _weighted(rng, [(6, "value"), (2, "delete"), (1, "add"), (1, "dup-key"),
                           (8, "plausible"), (2, "bytes"), (1, "shape"), (1, "none")])
    what = kind
    if kind == "value":
        for _ in range(rng.choice([1, 1, 2, 3])):
            path, _ = rng.choice(list(_paths(doc)))
            r = rng.random()
            if r < 0.1:
                v = _RawJSON(_deep_json(rng))
            elif r < 0.3:
                v = rng.randint(-(2**64), 2**64) if rng.random() < 0.5 else rng.choice(
                    [-1, 0, 1, 2**31, 2**63 - 1, 2**63, -(2**63) - 1])
            else:
                v = _RawJSON(rng.choice(_JSON_VALUES))
            doc = _set(doc, path, v)
            what += f" {_desc_path(path)}={(v.text if isinstance(v, _RawJSON) else v)!r:.50}"
    elif kind == "delete":
        paths = [p for p, _ in _paths(doc) if p]
        path = rng.choice(paths)
        parent = doc
        for p in path[:-1]:
            parent = parent[p]
        del parent[path[-1]]
        what += f" {_desc_path(path)}"
    elif kind == "add":
        maps = [(p, v) for p, v in _containers(doc) if isinstance(v, dict)]
        path, m = rng.choice(maps)
        m[rng.choice(["extra", "x" * 1000, "\x1b[31m", "", "problems"])] = _RawJSON(
            rng.choice(_JSON_VALUES))
        what += f" {_desc_path(path)}"
    elif kind == "plausible":
        for _ in range(rng.choice([1, 1, 2, 3])):
            what += " " + _plausible(rng, doc)
    elif kind == "shape":
        s = rng.choice(["array", "array-many", "empty-array", "numbers", "nested-array",
                        "string", "null"])
        what += " " + s
        doc = {"array": [doc, doc], "array-many": [doc] * rng.choice([3, 50]),
               "empty-array": [], "numbers": [1, 2], "nested-array": [[doc]], "string": "x",
               "null": None}[s]
    out: str | bytes = _dumps(doc, None if rng.random() < 0.7 else 2)
    if kind == "dup-key":
        out = _dumps(doc)
        keys = re.findall(r'"(\w+)": ', out)
        k = rng.choice(keys)
        out = out.replace(f'"{k}": ', f'"{k}": 0, "{k}": ', 1)
        what += f" {k}"
    elif kind == "bytes":
        b = bytearray(out.encode())
        for _ in range(rng.randint(1, 4)):
            i = rng.randrange(len(b) + 1)
            op = rng.choice(["flip", "insert", "delete", "truncate", "bom", "utf16", "latin1",
                             "garbage", "two-docs", "crlf"])
            if op == "flip" and i < len(b):
                b[i] ^= 1 << rng.randrange(8)
            elif op == "insert":
                b[i:i] = rng.choice([b"\xff", b"\x00", b"{", b"]", b",", b'"', b"\\", b"\xc3"])
            elif op == "delete":
                del b[i:i + rng.randint(1, 30)]
            elif op == "truncate":
                del b[i:]
            elif op == "bom":
                b = bytearray(b"\xef\xbb\xbf") + b
            elif op == "utf16":
                b = bytearray(bytes(b).decode("utf-8", "replace").encode("utf-16"))
            elif op == "latin1":
                b += b'\n"\xe9"'
            elif op == "garbage":
                b += b" x"
            elif op == "two-docs":
                b += b"\n" + bytes(b)
            elif op == "crlf":
                b = bytearray(bytes(b).replace(b"\n", b"\r\n").replace(b",", b",\r\n"))
            what += " " + op
        out = bytes(b)
    return out, what


def _plausible(rng: random.Random, doc) -> str:
    """A report edit a buggy or newer kpool could write: right types, odd content."""
    reports = doc if isinstance(doc, list) else [doc]
    rep = rng.choice(reports)
    ubs, evs = rep.get("ubatches", []), rep.get("events", [])
    what = rng.choice(["shuffle-ubatches", "drop-ubatch", "dup-ubatch", "op-shift", "add-finding",
                       "event-status", "drop-events", "index-shift", "big-ints", "tokens",
                       "summary", "stale", "pools", "scatter", "engine", "config"])
    if what == "shuffle-ubatches":
        rng.shuffle(ubs)
    elif what == "drop-ubatch" and ubs:
        del ubs[rng.randrange(len(ubs))]
    elif what == "dup-ubatch" and ubs:
        i = rng.randrange(len(ubs))
        ubs.insert(i, _copy(ubs[i]))
    elif what == "op-shift":
        for x in rng.sample(ubs + evs, min(len(ubs + evs), rng.randint(1, 3))):
            x["op"] = max(0, x["op"] + rng.choice([-2, -1, 1, 5, 1000, 2**62]))
    elif what == "add-finding" and ubs:
        u = rng.choice(ubs + evs)
        u.setdefault("findings", []).append({
            "code": rng.choice(["KP001", "KP002", "KP003", "KP004", "KP005", "KP006", "KP007"]),
            "name": "x", "severity": rng.choice(["error", "warning", "bogus"]), "message": "m",
            "rows": [rng.randint(0, 70) for _ in range(rng.randint(0, 3))],
            "seqs": [0]})
    elif what == "event-status" and evs:
        rng.choice(evs)["status"] = rng.choice(["applied", "rejected", "aborted"])
    elif what == "drop-events":
        rep["events"] = []
    elif what == "index-shift" and ubs:
        for u in ubs:
            u["index"] = rng.choice([u["index"] * 7, 0, u["index"] + 1])
            u["batch_ubatch"] = rng.choice([u["batch_ubatch"], 0, 5])
    elif what == "big-ints" and ubs:
        u = rng.choice(ubs)
        k = rng.choice(["n_new", "n_new_g", "n_pool_real", "index", "op", "batch_ubatch"])
        u[k] = rng.choice([2**63 - 1, 0, 2**40])
    elif what == "tokens" and ubs:
        u = rng.choice(ubs)
        u["tokens"] = [{"pos": rng.choice([0, 2**63 - 1]), "seq": [rng.choice([0, 1, 255, 2**40])],
                        "cell": 0} for _ in range(rng.randint(0, 5))]
    elif what == "summary":
        rep["summary"] = {"ubatches": 0, "findings": {"KP001": 2**63 - 1}, "status": rng.choice(
            ["pass", "fail", "aborted", "invalid"]), "pools_marked": 0}
    elif what == "stale" and (ubs or evs):
        x = rng.choice(ubs + evs)
        x["stale_batch" if "stale_batch" in x else "stale"] = {
            str(rng.choice([0, 1, 2**40])): rng.choice([-1, 0, 2**40]) for _ in range(3)}
    elif what == "pools" and ubs:
        u = rng.choice(ubs)
        u["pools"] = [{"seq": rng.randint(0, 3), "k": rng.randint(0, 2**40), "first_pos": 0,
                       "last_pos": 3, "cells": [0], "rep": 0, "new": rng.random() < 0.5}
                      for _ in range(rng.randint(0, 4))]
    elif what == "scatter" and ubs:
        u = rng.choice(ubs)
        u["scatter"] = [{"rep": rng.randint(0, 2**40), "cells": [1, 2], "pad": rng.random() < 0.3}
                        for _ in range(rng.randint(0, 4))]
    elif what == "engine":
        rep["engine"] = rng.choice(["rep-once", "x" * 500, "\x1b[31mred", ""])
    elif what == "config":
        rep["config"][rng.choice(list(rep["config"]))] = rng.choice([1, 2**40, True, 0])
    return what


def case_report(rng: random.Random, key: str) -> Case:
    reps = base_reports()
    a = rng.choice(reps)
    same = [r for r in reps if r[0] == a[0] and r is not a]
    b = rng.choice(same) if same and rng.random() < 0.85 else rng.choice(reps)
    ta, tb = a[3], b[3]
    desc = f"{a[0]} {a[1]}/{a[2]} vs {b[1]}/{b[2]}:"
    files: dict[str, bytes] = {}
    mutated = []
    for side, t in (("a", ta), ("b", tb)):
        if side == "a" or rng.random() < 0.35:
            out, what = mutate_report(rng, t)
            mutated.append(side)
            desc += f" {side}: {what};"
        else:
            out = t
        files[side] = out.encode("utf-8", "surrogatepass") if isinstance(out, str) else out
    ext = rng.choice([".json", ".json", ".json", "", ".JSON", ".txt"])
    files = {f"{k}{ext}": v for k, v in files.items()}
    names = list(files)
    argv = ["diff", *(PH + n for n in names)]
    flags: dict = {"json_stdout": False, "json_files": (), "outputs": (), "plain": True}
    if rng.random() < (0.6 if a[0] != b[0] else 0.2):
        argv.append("--force")
    if rng.random() < 0.3:
        argv.append("--fail-on-change")
    if rng.random() < 0.2:
        argv += ["--ignore", rng.choice(["KP005", "KP00", "KP001,KP003", "kp007"])]
    r = rng.random()
    if r < 0.3:
        argv += ["--format", "json"]
        if rng.random() < 0.3:
            argv += ["-o", PH + "diff.json"]
            flags |= {"json_files": ("diff.json",), "outputs": ("diff.json",)}
        else:
            flags["json_stdout"] = True
    elif r < 0.4:
        argv += ["--output", PH + "diff.txt"]
        flags["outputs"] = ("diff.txt",)
    elif r < 0.5:
        flags["plain"] = False
        return Case("report", key, desc, argv, files, env={"FORCE_COLOR": "1"},
                    under_test=tuple(f"{s}{ext}" for s in mutated), **flags)
    return Case("report", key, desc, argv, files, under_test=tuple(f"{s}{ext}" for s in mutated),
                **flags)


# --- random argument lists --------------------------------------------------------------

_ENGINES = ["rep-once", "cache-safe", "", "nope", "REP-ONCE", "rep-once ", "os:sep", "json:loads",
            "kpool_cli.engine.versions:REP_ONCE", "kpool_cli.engine.versions:VERSIONS",
            "kpool_cli.engine.versions:DEFAULT_VERSION", "kpool_cli.cli:cli", ":", "a:b:c", ":x",
            "x:", ".x:y", "kpool_cli..cli:x", "\x1b[31m:x", "zzqx_nomod_81:V", "kpool_cli:nosuch",
            "kpool_cli.cli", "\u202ex:y", "x" * 5000, "../../etc:passwd", "/tmp/x:y",
            "kpool_cli.engine.versions:REP_ONCE.name", "sys:exit", "builtins:print"]
_UBATCH = ["0", "3", "3..5", "5..3", "0..", "..", "..4", "-1", "a", "1.5", "0..0", "2..2",
           "99999999999999999999", "0..99999999999999999999", "9" * 5000, "", " 1 ", "1..2..3",
           "\x1b[2J", "\uff11", "0x10", "1_0"]
_SEQ = ["0", "1", "-1", "255", "256", "99999999999999999999", "x", "", "1.0", "0x1", "9" * 5000]
_CODES = ["KP001", "kp001", "scatter-race", "KP008", "KP", "", "x" * 3000, "\x1b[31m",
          "KP00", "stale-read", "KP001 ", "\u202eKP001", "--list"]


def _out_path(rng: random.Random, names: list[str]) -> str:
    return rng.choice([PH + "o1.json", PH + "o2.html", PH + "o3.svg", PH + "sub/missing/x.json",
                       PH, "-", "/dev/null", "", PH + "o1.json", PH + "x\x1b[31m.txt",
                       PH + "dir", PH + " ", PH + "a" * 300])


def case_argv(rng: random.Random, key: str) -> Case:
    files = {"t.yaml": dict(shipped())["shared-prefix-race.yaml"],
             "p.yaml": dict(shipped())["partial-copy.yaml"],
             "bad.yaml": b"kpool_trace: 1\ncache: {kv_size: 0}\nops: []\n",
             "dir/.keep": b""}
    use_reports = rng.random() < 0.25
    if use_reports:
        reps = base_reports()
        a = rng.choice([r for r in reps if r[0] != "*"])
        b = next(r for r in reps if r[0] == a[0] and r[2] == a[2] and r[1] != a[1])
        files["a.json"], files["b.json"] = a[3].encode(), b[3].encode()
    inputs = [PH + "t.yaml", PH + "p.yaml", PH + "bad.yaml", PH + "nosuch.yaml", PH + "dir",
              "-", "/dev/null", "/dev/zero", str(TRACES[0]), PH + "a.json", PH + "b.json",
              PH + "t.yaml", "", "x\x1b[31m.yaml", PH + "nosuch.json"]
    cmd = _weighted(rng, [(10, "replay"), (6, "diff"), (2, "explain"), (1, "schema"),
                          (1, "engines"), (0.5, "none"), (0.5, "unknown")])
    argv: list[str] = []
    env: dict[str, str] = {}
    if rng.random() < 0.15:
        env["COLUMNS"] = rng.choice(["0", "1", "-1", "abc", "20", "40", "100000", "", "1e3"])
    if rng.random() < 0.05:
        env["LINES"] = rng.choice(["0", "-5", "x"])
    if rng.random() < 0.1:
        env["FORCE_COLOR"] = rng.choice(["1", "0", "", "x"])
    if rng.random() < 0.1:
        env["NO_COLOR"] = rng.choice(["1", ""])
    if rng.random() < 0.05:
        env["TERM"] = rng.choice(["dumb", "xterm-256color", ""])
    if cmd == "none":
        argv = rng.choice([[], ["--version"], ["--help"], ["-h"], ["--nope"], ["--"], ["-"]])
    elif cmd == "unknown":
        argv = [rng.choice(["replays", "REPLAY", "", "-x", "\x1b[31m", "help", "diff2"])]
    elif cmd == "schema":
        argv = ["schema", *rng.choice([["trace"], ["report"], [], ["x"], ["trace", "report"],
                                       ["--help"], ["TRACE"]])]
    elif cmd == "engines":
        argv = ["engines", *rng.choice([[], ["x"], ["--help"], ["--nope"]])]
    elif cmd == "explain":
        argv = ["explain"]
        for _ in range(rng.randint(0, 3)):
            r = rng.random()
            if r < 0.5:
                argv.append(rng.choice(_CODES))
            elif r < 0.7:
                argv.append("--list")
            else:
                argv.append(rng.choice(["--color", "--no-color", "--help", "--nope"]))
    else:
        n_in = _weighted(rng, [(1, 0), (6, 1), (3, 2), (1, 3)])
        if use_reports and cmd == "diff" and rng.random() < 0.7:
            ins = [PH + "a.json", PH + "b.json"]
        else:
            ins = [rng.choice(inputs) for _ in range(n_in)]
        argv = [cmd, *ins]
        opts = _replay_opts if cmd == "replay" else _diff_opts
        for _ in range(_weighted(rng, [(2, 0), (4, 1), (3, 2), (2, 3), (1, 6)])):
            argv += opts(rng, list(files))
        # keep replays cheap: a backend other than numba unless one was drawn
        if (rng.random() < 0.3 or cmd == "replay") and "--backend" not in argv \
                and rng.random() < 0.8:
                argv += ["--backend", "none"]
        if rng.random() < 0.2:
            rng.shuffle(argv[1:])  # type: ignore[arg-type]
            argv = [cmd, *argv[1:]]
    # outputs are the case directory's files that are not inputs
    named = [a[len(PH):] if a.startswith(PH) else a.split("=" + PH, 1)[1] for a in argv
             if a.startswith(PH) or "=" + PH in a]
    outs = tuple(n for n in named if n not in files and n not in ("nosuch.yaml", "nosuch.json",
                                                                  "dir"))
    plain = not (any(a in ("--color",) for a in argv) or env.get("FORCE_COLOR") not in (None, ""))
    return Case("argv", key, " ".join(repr(a) for a in argv)[:200], argv, files, env=env,
                outputs=outs, plain=plain)


def _replay_opts(rng: random.Random, names: list[str]) -> list[str]:
    o = rng.choice(["--engine", "--format", "--output", "-o", "--fail-on", "--pools", "--check",
                    "--ubatch", "--seq", "--only-findings", "--all-ubatches", "--color",
                    "--no-color", "--quiet", "-q", "--html", "--svg", "--backend", "--nope",
                    "--help", "--engine=", "--format=", "--", "-", "--output=", "--max-tokens",
                    "--max-memory"])
    if o in ("--engine",):
        return [o, rng.choice(_ENGINES)]
    if o == "--format":
        return [o, rng.choice(["text", "json", "JSON", "", "xml"])]
    if o in ("--output", "-o", "--html", "--svg"):
        return [o, _out_path(rng, names)]
    if o == "--fail-on":
        return [o, rng.choice(["error", "warning", "never", "info", ""])]
    if o == "--pools":
        return [o, rng.choice(["marked", "all", "some"])]
    if o == "--ubatch":
        return [o, rng.choice(_UBATCH)]
    if o == "--seq":
        return [o, rng.choice(_SEQ)]
    if o == "--backend":
        return [o, rng.choice(["none", "none", "numpy", "numba", "cuda", ""])]
    if o in ("--max-tokens", "--max-memory"):
        return _limit_opt(rng, o)
    if o == "--output=":  # never a relative path: outputs stay in the case directory
        return [o + rng.choice(["", "-", PH + "eq.json"])]
    if o.endswith("="):
        return [o + rng.choice(["json", "", "x", "rep-once"])]
    return [o]


def _diff_opts(rng: random.Random, names: list[str]) -> list[str]:
    o = rng.choice(["--base", "--head", "--format", "--output", "-o", "--fail-on-change",
                    "--ignore", "--force", "--backend", "--jobs", "-j", "--nope", "--help",
                    "--check", "--", "--max-tokens", "--max-memory"])
    if o in ("--base", "--head"):
        return [o, rng.choice(_ENGINES)]
    if o == "--format":
        return [o, rng.choice(["text", "json", ""])]
    if o in ("--output", "-o"):
        return [o, _out_path(rng, names)]
    if o == "--ignore":
        return [o, rng.choice(["KP005", "KP00", "KP", "", ",", "KP001,,KP002", "kp003", "KP9",
                               "x" * 1000, "\x1b[31m", "KP001, KP002"])]
    if o == "--backend":
        return [o, rng.choice(["none", "numpy", "numba", "x"])]
    if o in ("--jobs", "-j"):
        return [o, rng.choice(["1", "1", "2", "0", "-1", "x", "99999999999999999999", "64"])]
    if o in ("--max-tokens", "--max-memory"):
        return _limit_opt(rng, o)
    return [o]


def _limit_opt(rng: random.Random, o: str) -> list[str]:
    if o == "--max-tokens":
        return [o, rng.choice(["0", "1", "2", "8", "-1", "4194304", "4194305", "x", "",
                               "99999999999999999999", "9" * 5000, "1e3", "0x10"])]
    return [o, rng.choice(["1", "0", "none", "1K", "1MB", "64M", "2G", "8GiB", "2.5GB", "100%",
                           "-1", "x", "1e3", "1e999G", "nan", "inf", "99999999999T", "", " 1 G",
                           "1" + "0" * 5000, "0.0000001", "1b"])]


MAKERS = {"bytes": case_bytes, "yaml": case_yaml, "semantic": case_semantic,
          "report": case_report, "argv": case_argv}


def make_case(cls: str, key: str, heavy: bool = True) -> Case:
    """Case `key` of class `cls`. `heavy=False` leaves out the inputs that take seconds
    or gigabytes each (4M-token ranges, 10**6-item lists, 2**31-element caches): the
    same key gives another case then."""
    global _heavy
    _heavy = heavy
    try:
        return MAKERS[cls](rng_for(f"{cls}:{key}:{'h' if heavy else 'l'}"), key)
    finally:
        _heavy = True


def strategy(cls: str, heavy: bool = False):
    """A hypothesis strategy of `Case`s of one class (seeded by an integer hypothesis
    draws, so a failure prints a key that `make_case` and the campaign reproduce)."""
    from hypothesis import strategies as st

    return st.integers(min_value=0, max_value=2**32 - 1).map(
        lambda n: make_case(cls, f"h{n}", heavy))


# --- running and judging one case -------------------------------------------------------


class CaseTimeout(BaseException):
    """The in-process run took too long (raised from SIGALRM, past kpool's handlers)."""


def materialize(case: Case, workdir: Path) -> list[str]:
    """Write the case's files into `workdir`; its argv with the placeholder resolved."""
    for name, data in case.files.items():
        p = workdir / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    return resolve(case, workdir)


def resolve(case: Case, workdir: Path) -> list[str]:
    """The case's argv with the placeholder replaced by `workdir`."""
    base = str(workdir) + "/"
    return [base + a[len(PH):] if a.startswith(PH) else a.replace("=" + PH, "=" + base, 1)
            for a in case.argv]


def run_argv(argv: list[str], env: dict[str, str] | None = None,
             timeout: float | None = None) -> Outcome:
    """`kpool ARGV` in this process: main() with sys.argv patched, streams captured."""
    from click.testing import CliRunner

    from kpool_cli.cli import main

    runner = CliRunner()
    full_env = {"KPOOL_TRACEBACK": "1", "COLUMNS": "100", "FORCE_COLOR": None, "NO_COLOR": None,
                "TERM": "xterm"}
    full_env.update(env or {})
    old_argv = sys.argv
    old_term = signal.getsignal(signal.SIGTERM)
    old_alarm = None
    code: object = None
    exc = None
    t0 = time.perf_counter()
    with runner.isolation(env=full_env) as streams:
        sys.argv = ["kpool", *argv]
        if timeout:
            def on_alarm(signum, frame):
                raise CaseTimeout

            old_alarm = signal.signal(signal.SIGALRM, on_alarm)
            signal.setitimer(signal.ITIMER_REAL, timeout)
        try:
            main()
            code = 0
        except SystemExit as e:
            code = 0 if e.code is None else e.code
        except CaseTimeout:
            code = "timeout"
        except BaseException:  # anything that escapes main() is a finding
            exc = traceback.format_exc()
        finally:
            if timeout:
                signal.setitimer(signal.ITIMER_REAL, 0)
                signal.signal(signal.SIGALRM, old_alarm)
            sys.argv = old_argv
            signal.signal(signal.SIGTERM, old_term)
            with contextlib.suppress(Exception):
                sys.stdout.flush()
                sys.stderr.flush()
        out = streams[0].getvalue().decode("utf-8", "backslashreplace")
        err = streams[1].getvalue().decode("utf-8", "backslashreplace")
    return Outcome(code, out, err, exc, time.perf_counter() - t0)


def run_case(case: Case, workdir: Path, timeout: float | None = None, *,
             written: bool = False) -> Outcome:
    """The case in this process, from inside `workdir` (so nothing lands elsewhere).
    `written`: its files are in `workdir` already (`materialize`)."""
    argv = resolve(case, workdir) if written else materialize(case, workdir)
    cwd = os.getcwd()
    os.chdir(workdir)
    try:
        return run_argv(argv, case.env, timeout)
    finally:
        os.chdir(cwd)


_PROBLEM = re.compile(r"(?P<file>.+?):(?P<line>\d+):(?P<col>\d+): (?P<field>.+?): \S")
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
_SGR = re.compile(r"\x1b\[[0-9;]*m|\x1b\]8;[^\x1b\x07]*(?:\x1b\\|\x07)")


def judge(case: Case, o: Outcome, workdir: Path) -> list[tuple[str, str]]:
    """What is wrong with this outcome: (kind, detail) pairs, empty when it is right."""
    bad: list[tuple[str, str]] = []
    text = o.stdout + o.stderr + o.raw
    if o.code == "timeout":
        return [("timeout", f"no exit after {o.seconds:.1f} s")]
    if o.code == "memory":
        return [("memory", o.raw[-300:] or "over the memory limit")]
    if o.code == "crash":
        return [("crash", o.raw[-300:])]
    if o.exc or "internal error" in o.stderr:
        kind = "memory" if "MemoryError" in (o.exc or "") + o.stderr else "internal error"
        if o.exc and "internal error" not in o.stderr:
            kind = "memory" if "MemoryError" in o.exc else "traceback"
        return [(kind, _last_line(o.exc or o.stderr) + "\n" + (o.exc or o.stderr)[-3000:])]
    if "Traceback (most recent call last)" in text:
        bad.append(("traceback", text[text.index("Traceback"):][:3000]))
    if o.code not in EXIT_OK:
        bad.append(("bad exit status", f"exit {o.code!r}"))
        return bad
    err = o.stderr
    if o.code == 2:
        usage = "Usage:" in err or err.startswith("Error:")
        if not err.strip():
            bad.append(("message", "exit 2 with nothing on stderr"))
        elif case.under_test and not usage:
            from kpool_cli.wording import visible

            paths = [str(workdir / n) for n in case.under_test]
            shown = [x for p in paths for x in (p, visible(p), _escaped(visible(p)))]
            if not any(p in err for p in shown):
                bad.append(("message", "exit 2 without naming the input file: "
                            + err.strip()[:300]))
        if "invalid trace\n" in err:
            for ln in err.split("invalid trace\n", 1)[1].splitlines():
                if ln.startswith("(stopped after") or ln.startswith("kpool: warning"):
                    continue
                m = _PROBLEM.match(ln)
                if not m:
                    bad.append(("message",
                                f"problem line without file:line:col: field: {ln[:200]}"))
                    break
                if m["line"] == "0" and m["field"] not in ("<file>",):
                    bad.append(("message", f"problem without a line: {ln[:200]}"))
                    break
    # terminal control characters: never on stderr; not on stdout's plain view
    if case.plain:
        for name, s in (("stderr", err), ("stdout", o.stdout if not case.json_stdout else "")):
            m = _CONTROL.search(s)
            if m:
                i = m.start()
                line = s[s.rfind("\n", 0, i) + 1:i]
                bad.append(("escape", f"{name} holds {m.group()!r} after: {line[-80:]}"
                            f"\n{s[max(0, i - 200):i + 50]!r}"))
                break
    else:
        plain_err = _SGR.sub("", err)
        m = _CONTROL.search(plain_err)
        if m:
            i = m.start()
            line = plain_err[plain_err.rfind("\n", 0, i) + 1:i]
            bad.append(("escape", f"stderr holds {m.group()!r} after: {line[-80:]}"
                        f"\n{plain_err[max(0, i - 200):i + 50]!r}"))
    if o.code in (0, 1):
        if case.json_stdout:
            try:
                json.loads(o.stdout)
            except ValueError as e:
                bad.append(("bad json", f"stdout is not JSON: {e}: {o.stdout[:200]!r}"))
        for n in case.json_files:
            try:
                json.loads((workdir / n).read_text())
            except (OSError, ValueError) as e:
                bad.append(("bad json", f"{n}: {e}"))
    # exit 2 leaves no output file; no run leaves a temporary file
    known = set(case.files) | {n.split("/")[0] for n in case.files}
    left = []
    for p in workdir.rglob("*"):
        rel = str(p.relative_to(workdir))
        if p.is_dir() or rel in known:
            continue
        if rel not in case.outputs or o.code == 2:
            left.append(rel)
    if left:
        bad.append(("output left", f"exit {o.code} left {sorted(left)[:5]}"))
    return bad


def _escaped(s: str) -> str:
    """How a stream with errors="backslashreplace" writes `s` (a lone surrogate from a
    file name that is not UTF-8 becomes `\\udcff`)."""
    return s.encode("utf-8", "backslashreplace").decode("utf-8")


def _last_line(s: str) -> str:
    lines = [ln for ln in s.strip().splitlines() if ln.strip()]
    return lines[-1][:300] if lines else ""
