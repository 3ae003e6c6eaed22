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
- `settings`: no code from data. A hostile kpool.toml or `[tool.kpool]` of a
  pyproject.toml (in the current folder or a parent) for `kpool check`: plug-in strings
  in `engines` (`os:abort`, the planted probe module), bad engine names, hostile ints
  (5,000 digits, nan, inf, 1e3, -1, 100000) and strings, unknown keys, unknown codes,
  hostile per-file-ignores globs, TOML syntax errors, bad UTF-8, a file over 1 MiB, and
  the settings file as a FIFO, a folder, a socket, a symlink to a device or /proc;
  plus traces whose `engine:` or an expect's `engine` names a plug-in.
- `special`: files that are not regular files, as inputs of every command (replay,
  check, validate, diff of traces and of reports) and inside input folders beside a
  good trace: FIFOs, sockets, folders named like traces, symlinks to /dev/zero,
  /dev/null, /dev/full, /dev/urandom, /proc and /sys files, to a FIFO, dangling and
  looping symlinks, and devices and /proc files named directly.
- `outputs`: every command's `-o/--output/--html/--svg` (and gen's `-o`, fuzz's `-o`
  folder) pointed at an input (spelled another way, through a symlink or a hard link),
  a trace in an input folder, a report being compared, the settings file, a device, a
  FIFO, a socket, a folder, a read-only folder, a missing folder, a path under a file,
  /proc, /sys, the empty path, the same file for two outputs, a file system that fills
  midway (RLIMIT_FSIZE); and stdout on /dev/full.
- `options`: every command's numeric options (replay, check, validate, diff, fuzz, every
  gen scenario) with hostile numbers (nan, inf, 1e3, 5,000 digits, negatives, -j
  100000, hex, `1_000`, non-ASCII digits, sizes like 1e300G), hostile `--engine`,
  `--base`, `--head` strings (empty, `os:abort`, every object of the probe module), and
  traces whose expect names an unknown finding code (`KP999`).
- `signals`: stdout a closed pipe (exit 141) or /dev/full (exit 2) for every command
  that prints, and SIGINT or SIGTERM at a random moment of a JSON replay, check or diff
  (exit 130/143, stdout empty or one JSON document whose last report says
  "interrupted", no output file left).
- `linebreaks`: line-breaking characters (\n, \r, \x0b, \x0c, \x1c-\x1e, U+0085,
  U+2028, U+2029) in every text field of a trace (name, description, note, slot names,
  an unknown key, an engine name), in file and folder names and in a report's text,
  shown in every view (plain, rich, check's formats, validate, diff, output files).

Output paths are in the case's own directory, `-`, or a place kpool must refuse (a
device, /proc, /sys): when an output is pointed at an input, the input is hashed
before and after. Plug-in engine names are a fixed set: harmless modules, names no
module has, and `kpool_probe`, a module the case plants in its directory (put on
`sys.path` for the run) whose import and every one of whose functions, properties
and dunder methods leave a marker file: kpool may import it only when the command
line names it, and never run any of it.

`run_case(case, workdir)` runs one case in this process (`kpool_cli.cli.main` with
sys.argv patched, under click's stream isolation, KPOOL_TRACEBACK=1 so an internal
error re-raises), and `judge(case, outcome, workdir)` lists what is wrong with the
result: the contract is exit 0, 1 or 2 only; no traceback; no "internal error"; for
exit 2 a message (naming the input file when the file's content is what is under
test, `file:line:col: field: ...` for an invalid trace); no terminal control
characters from the input on stderr (or on stdout's plain view), U+2028 and U+2029
included; JSON on stdout when JSON was asked for; no output or temporary file left
behind by exit 2 (or 130/143); no input changed (every file of the case's directory,
and every input outside it, hashed before and after); no code of the probe module run
(nor imported, where only data named it); the exit status a case must have (2 for a
refusal, 141 for a closed pipe) with the refused path or option named; no raw line
break from a text field in a view.

Cases whose stdout is a pipe, a closed pipe or /dev/full, or that a signal
interrupts, run with real file descriptors 1 and 2 (`run_argv_fd`), the others under
click's stream isolation (`run_argv`).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import json
import os
import random
import re
import resource
import signal
import stat
import sys
import threading
import time
import traceback
import typing
from dataclasses import dataclass, field
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
TRACES = sorted((ROOT / "traces").glob("*.yaml"))
CLASSES = ("bytes", "yaml", "semantic", "report", "argv", "settings", "special", "outputs",
           "options", "signals", "linebreaks")
PH = "@/"  # placeholder: the case directory (argv items starting with it are files)
EXIT_OK = (0, 1, 2)

# failure kinds, in the order a result is judged and tables list them
KINDS = ("traceback", "internal error", "bad exit status", "not refused", "timeout", "memory",
         "crash", "message", "escape", "bad json", "output left", "input changed", "code run")


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
    outputs: tuple[str, ...] = ()  # output files (or folders) in the case directory
    plain: bool = True  # no colour forced: stdout holds no control characters
    # files that are not regular: name -> "fifo", "socket", "dir", "link:TARGET" or
    # "hardlink:NAME" (made after `files`)
    special: dict[str, str] = field(default_factory=dict)
    readonly: tuple[str, ...] = ()  # folders made read-only (for root too: see run_case)
    cwd: str = ""  # the folder of the case directory kpool runs in
    pythonpath: bool = False  # the case directory is on sys.path (the probe module)
    no_import: bool = False  # only data names the probe module: importing it is running it
    expect_exit: tuple[int, ...] | None = None  # the statuses allowed (a refusal: (2,))
    names: tuple[str, ...] = ()  # a refusal names one of these on stderr
    stdout_names: tuple[str, ...] = ()  # on exit 2 stdout names these (the rest checked)
    stdio: str = ""  # "pipe", "closed" (a pipe with no reader) or "full" (/dev/full)
    signal: tuple[int, float] | None = None  # (signal, seconds after main() starts)
    markers: tuple[str, ...] = ()  # text that must never reach a view raw
    text_files: tuple[str, ...] = ()  # output files that are text views (checked too)
    fsize: int | None = None  # RLIMIT_FSIZE while the case runs: a disk that fills up
    timeout: float | None = None  # seconds, when shorter than the runner's limit
    digests: dict[str, str] = field(default_factory=dict, repr=False)  # set by materialize

    def __repr__(self) -> str:  # short: hypothesis prints it, and files can be megabytes
        return (f"Case({self.cls!r}, {self.key!r}, {self.desc[:80]!r}, argv={self.argv!r:.300}, "
                f"files={sorted(self.files)!r:.200})")

    def _repr_pretty_(self, p, cycle) -> None:  # hypothesis's printer: the short form too
        p.text(repr(self))

    def to_json(self) -> dict:
        d = {"cls": self.cls, "key": self.key, "desc": self.desc, "argv": self.argv,
             "env": self.env, "files": sorted(self.files)}
        for k in ("special", "readonly", "cwd", "pythonpath", "no_import", "expect_exit",
                  "names", "stdout_names", "stdio", "signal", "markers", "fsize"):
            v = getattr(self, k)
            if v:
                d[k] = v
        return d


@dataclass
class Outcome:
    code: object  # the SystemExit code (None when main() raised), or "timeout" ...
    stdout: str
    stderr: str
    exc: str | None = None  # the traceback of an exception that escaped main()
    seconds: float = 0.0
    raw: str = ""  # fd-level output of a worker process (campaign only)
    notes: list[str] = field(default_factory=list)  # how the run went ("signal sent" ...)


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
    "kpool_cli.versions:REP_ONCE", "kpool_cli.versions:VERSIONS", "<<", "=",
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
                                   + (["nope", "os:system", "kpool_cli.versions:REP_ONCE"]
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
                           (8, "plausible"), (2, "bytes"), (1, "shape"), (1, "none"),
                           (2.5, "amplify")])
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
    elif kind == "amplify":
        doc, what = _amplify(rng, doc)
        if rng.random() < 0.3:  # and an edit on top
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


def _amplify(rng: random.Random, doc):
    """A report scaled up (a plausible report of a long run, or a hostile one of a
    huge one): ubatches, findings, events, tokens or pools repeated, strings grown,
    or an array of many reports; at most 2 MiB of JSON added (16 MiB for heavy
    cases). Returns the document and what was done."""
    cap = (16 << 20) if _heavy else (2 << 20)
    k0 = rng.choice([10, 100, 1000, *_big(3000, 10000, 100000)])

    def times(part) -> int:  # how many copies of `part` fit the cap
        return max(1, min(k0, cap // max(1, len(json.dumps(part)))))

    what = rng.choice(["ubatches", "findings", "events", "tokens", "pools", "strings",
                       "reports", "expectations"])
    if what == "reports":
        one = doc[0] if isinstance(doc, list) and doc else doc
        k = times(one)
        return [one] * k, f"amplify reports x{k}"
    reports = doc if isinstance(doc, list) else [doc]
    rep = rng.choice(reports) if reports else {}
    if not isinstance(rep, dict):
        return doc, "amplify (no report)"
    ubs = rep.get("ubatches") or []
    k = 1
    if what == "ubatches" and ubs:
        k = times(ubs)
        rep["ubatches"] = ubs * k
    elif what == "findings" and ubs:
        u = rng.choice(ubs)
        fs = u.get("findings") or [{"code": "KP001", "name": "scatter-race", "severity": "error",
                                    "message": "m", "rows": [3], "seqs": [0]}]
        k = times(fs)
        u["findings"] = fs * k
    elif what == "events" and rep.get("events"):
        k = times(rep["events"])
        rep["events"] = rep["events"] * k
    elif what == "tokens" and ubs:
        u = rng.choice(ubs)
        toks = u.get("tokens") or [{"pos": 0, "seq": [0], "cell": 0}]
        k = times(toks)
        u["tokens"] = toks * k
    elif what == "pools" and ubs:
        u = rng.choice(ubs)
        k = times(u.get("pools") or [])
        u["pools"] = (u.get("pools") or []) * k
    elif what == "expectations" and rep.get("expectations"):
        k = times(rep["expectations"])
        rep["expectations"] = rep["expectations"] * k
    elif what == "strings":
        k = min(k0 * 100, cap)
        field_ = rng.choice(["engine", "name", "message"])
        if field_ == "engine":
            rep["engine"] = "rep-once" + "x" * k
        elif field_ == "name":
            rep.setdefault("trace", {})["name"] = "n" * k
        else:
            found = [f for u in ubs for f in u.get("findings") or []]
            for f in found:
                f["message"] = "m" * (k // len(found))
        what += f" {field_}"
    return doc, f"amplify {what} x{k}"


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
            "kpool_cli.versions:REP_ONCE", "kpool_cli.versions:VERSIONS",
            "kpool_cli.versions:DEFAULT_VERSION", "kpool_cli.cli:cli", ":", "a:b:c", ":x",
            "x:", ".x:y", "kpool_cli..cli:x", "\x1b[31m:x", "zzqx_nomod_81:V", "kpool_cli:nosuch",
            "kpool_cli.cli", "\u202ex:y", "x" * 5000, "../../etc:passwd", "/tmp/x:y",
            "kpool_cli.versions:REP_ONCE.name", "sys:exit", "builtins:print"]
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


# --- the promises of the untrusted-input work -------------------------------------------
#
# settings, special files, outputs onto inputs, numeric options and engine strings,
# signals and pipes, line breaks. Every case is small (a 1 KB trace, a few hundred ops
# at most for the signal cases), so that thousands run in minutes.

SMALL = "shared-prefix-race.yaml"  # 3 ubatches; its expects hold under both engines
PROBE = "kpool_probe"  # the module a case plants in its directory

# Importing it leaves PROBE-imported beside it; any of its code that runs after the
# import leaves PROBE-called-<what>. `V` is a proper plug-in engine; every other name
# is a trap: a function, a class, an object that lies about its class, EngineVersion
# objects whose fields run code when kpool looks at them, a subclass with its own
# comparison, and a module-level __getattr__ that answers for any other name.
PROBE_SOURCE = '''"""Planted by tests/hostile.py: a plug-in engine that tells on its callers."""
import os as _os
from dataclasses import replace as _replace

from kpool_cli.versions import REP_ONCE as _REP_ONCE, EngineVersion as _EV

_HERE = _os.path.dirname(_os.path.abspath(__file__))
_ready = False


def _mark(what):
    if _ready or what == "imported":
        open(_os.path.join(_HERE, "PROBE-" + what), "a").close()


_mark("imported")


def fn(*args, **kwargs):
    _mark("called-fn")
    return _REP_ONCE


class Cls:
    def __init__(self, *args, **kwargs):
        _mark("called-cls")


class _Sneaky:
    @property
    def __class__(self):
        _mark("called-class-property")
        return _EV

    def __getattr__(self, name):
        _mark("called-getattr")
        return getattr(_REP_ONCE, name)


sneaky = _Sneaky()


class _Bool:
    def __bool__(self):
        _mark("called-bool")
        return True


class _Str(str):
    def __hash__(self):
        _mark("called-hash")
        return str.__hash__(self)

    def __eq__(self, other):
        _mark("called-eq")
        return str.__eq__(self, other)

    def __ne__(self, other):
        _mark("called-ne")
        return str.__ne__(self, other)


boolish = _replace(_REP_ONCE, name="probe-bool", mark_once_per_rep=_Bool())
strname = _replace(_REP_ONCE, name=_Str("rep-once"))


class _SubV(_EV):
    __slots__ = ()

    def __eq__(self, other):
        _mark("called-eq")
        return False

    def __ne__(self, other):
        _mark("called-ne")
        return True

    __hash__ = _EV.__hash__


subv = _SubV(**{f: getattr(_REP_ONCE, f) for f in _EV.__dataclass_fields__})
V = _replace(_REP_ONCE, name="probe-engine", description="a plug-in (tests/hostile.py)")


def __getattr__(name):
    _mark("called-module-getattr")
    if name == "raiser":
        raise RuntimeError("probe: module __getattr__ raised")
    if name == "exiter":
        raise SystemExit(7)
    raise AttributeError(name)


_ready = True
'''

# (engine string, must it be refused?) for --engine, --base, --head (None: no promise
# on the status; whatever happens, no probe code runs)
ENGINE_ARGS = [
    ("", True), (" ", True), (":", True), ("a:", True), (":b", True), ("::", True),
    ("os:abort", True), ("os:system", True), ("sys:exit", True), ("builtins:exec", True),
    ("builtins:print", True), ("shutil:rmtree", True), ("kpool_cli.cli:main", True),
    ("kpool_cli.versions:VERSIONS", True), ("kpool_cli.versions:EngineVersion",
                                                    True),
    ("kpool_cli.versions:load_version", True), (PROBE + ":fn", True),
    (PROBE + ":Cls", True), (PROBE + ":sneaky", True), (PROBE + ":missing", True),
    (PROBE + ":raiser", True), (PROBE + ":exiter", True), (PROBE + ":V.name", True),
    (PROBE + ":_mark", True), (PROBE, True), (PROBE + ":boolish", None),
    (PROBE + ":strname", None), (PROBE + ":subv", None), (PROBE + ":V", False),
    ("kpool_cli.versions:REP_ONCE", False), ("\x1b[31m:x", True), ("x" * 5000, True),
    ("rep-once\n", True), ("rep-once\u2028", True), ("REP-ONCE", True), ("rep-once ", True),
    ("zzqx_nomod_81:V", True), ("../etc:passwd", True), ("/tmp/x:y", True),
    ("kpool_cli..engine:x", True), ("rep-once", False), ("cache-safe", False),
    ("tail-truncate", False),
]


def _small() -> bytes:
    return dict(shipped())[SMALL]


def _probe_files() -> dict[str, bytes]:
    return {PROBE + ".py": PROBE_SOURCE.encode()}


def _report_pair(rng: random.Random) -> tuple[bytes, bytes]:
    """Two real reports of one shipped trace (engines rep-once and cache-safe)."""
    reps = [r for r in base_reports() if r[0] != "*" and r[2] == "none"]
    a = rng.choice(reps)
    b = next(r for r in reps if r[0] == a[0] and r[1] != a[1])
    return a[3].encode(), b[3].encode()


def _toml_str(s: str) -> str:
    return json.dumps(s)  # a TOML basic string: JSON's escapes are TOML's (\\uXXXX ...)


def _toml_list(items: list[str]) -> str:
    return "[" + ", ".join(_toml_str(x) for x in items) + "]"


_TOML_INTS = ["0", "1", "2", "256", "257", "-1", "100000", "1" + "0" * 5000, "9" * 30,
              "0x10", "0o7", "0b11", "1_0", "+1", "1e3", "1.0", "nan", "inf", "-inf", "+inf",
              "true", '"2"', "[1]", "{a = 1}", "1979-05-27", "9223372036854775807",
              "9223372036854775808", "-9223372036854775809", "0x" + "f" * 4000]
_TOML_TEXT = ["error", "warning", "never", "text", "json", "junit", "github", "sarif", "",
              " ", "ERROR", "xml", "\x1b[31mred\x1b[0m", "\x1b]0;pwned\x07", "error\n",
              "a\u2028b", "\u202eevil", "x" * 100000, "\x00", "KP999", "rep-once"]
_PLUGINS = ["os:abort", "os:system", "sys:exit", "builtins:exec", "subprocess:call",
            "shutil:rmtree", PROBE + ":V", PROBE + ":fn", PROBE + ":raiser", PROBE,
            "kpool_cli.versions:REP_ONCE", "kpool_cli.cli:main", "json:loads"]
_BAD_ENGINES = ["[]", '[""]', '["rep-once", "rep-once"]', '"rep-once"', "[1]",
                '[["rep-once"]]', '["REP-ONCE"]', '["rep-once "]', '["rep-once\\nPASS x"]',
                '["\\u001b[2J"]', '["\\u2028"]', "[" + ", ".join(['"rep-once"'] * 10000) + "]",
                '["' + "x" * 5000 + '"]', "{engine = 1}", '["rep-once", 5]']


def _settings_body(rng: random.Random) -> tuple[dict[str, str], dict[str, dict[str, str]],
                                                 bool, str]:
    """Keys (TOML value text by key) and tables of a settings file, whether kpool must
    refuse it, and what was done to it."""
    keys: dict[str, str] = {}
    tables: dict[str, dict[str, str]] = {}
    if rng.random() < 0.6:
        keys["engines"] = _toml_list(rng.sample(["rep-once", "cache-safe", "tail-truncate"],
                                                rng.randint(1, 2)))
    if rng.random() < 0.4:
        keys["fail-on"] = _toml_str(rng.choice(["error", "warning", "never"]))
    if rng.random() < 0.3:
        keys["ignore"] = _toml_list(rng.sample(["KP001", "KP004", "KP005"], rng.randint(0, 2)))
    if rng.random() < 0.3:
        keys["output-format"] = _toml_str(rng.choice(["text", "json", "junit", "github",
                                                      "sarif"]))
    if rng.random() < 0.2:
        keys["jobs"] = rng.choice(["1", "1", "2"])
    if rng.random() < 0.2:
        tables["per-file-ignores"] = {_toml_str(rng.choice(["*.yaml", "**/*.yaml", "t.yaml"])):
                                      '["KP001"]'}
    kind = _weighted(rng, [(2, "valid"), (3, "plugin"), (2, "engine-bad"), (2, "int"),
                           (2, "text"), (1.5, "codes"), (1.5, "globs"), (1.5, "unknown")])
    refuse = False
    desc = kind
    if kind == "plugin":
        names = rng.sample(["rep-once", "cache-safe"], rng.randint(0, 1))
        names.insert(rng.randint(0, len(names)), rng.choice(_PLUGINS))
        keys["engines"] = _toml_list(names)
        refuse, desc = True, f"plugin engines = {keys['engines']}"
    elif kind == "engine-bad":
        keys["engines"] = rng.choice(_BAD_ENGINES)
        refuse, desc = True, f"engines = {keys['engines'][:60]}"
    elif kind == "int":
        k = rng.choice(["jobs", "jobs", "jobs", "fail-on", "engines", "ignore", "output-format"])
        v = rng.choice(_TOML_INTS)
        keys[k] = v
        try:
            import tomllib

            parsed = tomllib.loads(f"x = {v}")["x"]
            ok = k == "jobs" and type(parsed) is int and 1 <= parsed <= 256
        except (ValueError, ImportError):  # a TOML error, or past 4300 digits
            ok = False
        refuse, desc = not ok, f"{k} = {v[:40]}"
    elif kind == "text":
        k = rng.choice(["fail-on", "output-format", "jobs"])
        v = rng.choice(_TOML_TEXT)
        keys[k] = _toml_str(v)
        allowed = {"fail-on": ("error", "warning", "never"),
                   "output-format": ("text", "json", "junit", "github", "sarif")}.get(k, ())
        refuse, desc = v not in allowed, f"{k} = {v[:40]!r}"
    elif kind == "codes":
        v = rng.choice(['["KP999"]', '["kp001"]', '[""]', '["KP00"]', '["KP0010"]', "[1]",
                        '"KP001"', '["KP001", "KP999"]', '["scatter-race"]', '["KP001 "]',
                        '["KP001\\n"]', '["\\u001b[31mKP001"]'])
        keys["ignore"] = v
        refuse = v != '["scatter-race"]'
        desc = f"ignore = {v}"
    elif kind == "globs":
        g = rng.choice(["**/" * 300 + "*.yaml", "[", "[!", "[!]", "\\", "/abs/*.yaml",
                        "../*.yaml", "*a" * 60 + "b", "{a,b}", "", "\x1b[31m*", "t.yaml\n",
                        "x" * 2000, "**", "***", "a/**/b/**/c/**/*.yaml", "\u2028*", "."])
        codes = rng.choice(['["KP001"]', '["KP001"]', '["KP999"]', '"KP001"', "[]", "[1]"])
        tables["per-file-ignores"] = {_toml_str(g): codes}
        refuse = codes in ('["KP999"]', '"KP001"', "[1]")
        desc = f"per-file-ignores {g[:40]!r} = {codes}"
    elif kind == "unknown":
        k = rng.choice(["fail_on", "Engines", '"jobs "', '""', '"\\u001b[31m"', "x" * 300,
                        "tool", "kpool", "engine", "output_format", '"a\\u2028b"'])
        if rng.random() < 0.3:
            tables[k] = {"a": "1"}
        else:
            keys[k] = rng.choice(["1", '"x"', "[]"])
        refuse, desc = True, f"unknown key {k[:40]}"
    return keys, tables, refuse, desc


def _settings_text(keys: dict[str, str], tables: dict[str, dict[str, str]],
                   pyproject: bool) -> str:
    head = "[tool.kpool]\n" if pyproject else ""
    out = head + "".join(f"{k} = {v}\n" for k, v in keys.items())
    for t, kv in tables.items():
        out += f"\n[{'tool.kpool.' if pyproject else ''}{t}]\n"
        out += "".join(f"{k} = {v}\n" for k, v in kv.items())
    if pyproject:
        out = '[project]\nname = "demo"\n\n' + out
    return out


def _syntax_mutation(rng: random.Random, text: str) -> tuple[bytes, bool | None, str]:
    """A TOML file broken whole: the bytes, whether kpool must refuse it (None: not
    promised), what was done."""
    what = rng.choice(["dup-key", "unterminated", "bad-escape", "array-of-tables",
                       "no-value", "bad-utf8", "nul", "over-1mib", "at-1mib", "deep", "bom",
                       "crlf", "cr", "truncate", "flip", "lone-surrogate", "long-line",
                       "huge-int-table"])
    b = text.encode()
    refuse: bool | None = True
    if what == "dup-key":
        b += b"fail-on = \"error\"\nfail-on = \"never\"\n"
    elif what == "unterminated":
        b += b'fail-on = "error\n'
    elif what == "bad-escape":
        b += b'fail-on = "\\q"\n'
    elif what == "array-of-tables":
        b += b"[[engines]]\nname = \"rep-once\"\n"
    elif what == "no-value":
        b += b"fail-on =\n"
    elif what == "bad-utf8":
        b += b"# caf\xe9 \xff\xfe\n"
    elif what == "nul":
        b += b"# \x00\n"
    elif what == "over-1mib":
        b += b"#" + b"x" * (1 << 20) + b"\n"
    elif what == "at-1mib":
        b += b"#" * max(0, (1 << 20) - len(b) - 1) + b"\n"
        refuse = None
    elif what == "deep":
        d = rng.choice([50, 500, 5000])
        b += b"x = " + b"[" * d + b"1" + b"]" * d + b"\n"
    elif what == "bom":
        b = b"\xef\xbb\xbf" + b
        refuse = None
    elif what == "crlf":
        b = b.replace(b"\n", b"\r\n")
        refuse = None
    elif what == "cr":
        b = b.replace(b"\n", b"\r")
        refuse = None
    elif what == "truncate":
        b = b[:rng.randrange(len(b) + 1)]
        refuse = None
    elif what == "flip":
        if b:
            i = rng.randrange(len(b))
            b = b[:i] + bytes([b[i] ^ (1 << rng.randrange(8))]) + b[i + 1:]
        refuse = None
    elif what == "lone-surrogate":
        b += b'fail-on = "\\ud800"\n'
    elif what == "long-line":
        b += b"# " + b"y" * 500000 + b"\n"
        refuse = None
    elif what == "huge-int-table":
        b += b"[per-file-ignores]\n" + b"".join(b'"g%d" = ["KP001"]\n' % i for i in range(5000))
        refuse = None
    return b, refuse, what


_SETTINGS_SPECIAL = ["fifo", "dir", "socket", "link:/dev/zero", "link:/dev/null",
                     "link:/dev/urandom", "link:/proc/self/status", "link:/proc/self/environ",
                     "link:nowhere.toml", "loop"]


def case_settings(rng: random.Random, key: str) -> Case:
    files = {"t.yaml": _small(), **_probe_files()}
    special: dict[str, str] = {}
    up = rng.random() < 0.25  # the settings file in the folder above the current one
    cwd = "sub" if up else ""
    if up:
        files["sub/.keep"] = b""
    what = _weighted(rng, [(8, "kpool.toml"), (4, "pyproject.toml"), (1, "both"),
                           (1.5, "pyproject-odd"), (2, "trace-plugin")])
    argv = ["check", PH + "t.yaml", "--backend", "none"]
    under: tuple[str, ...] = ()
    refuse = False
    if what == "trace-plugin":  # data names a plug-in: never imported
        plugin = rng.choice(_PLUGINS)
        text = _small().decode()
        if rng.random() < 0.5:
            text = text.replace("kpool_trace: 1\n", f"kpool_trace: 1\nengine: {plugin}\n", 1)
            desc = f"trace engine: {plugin}"
        else:
            text = text.rstrip("\n") + f"\n  - expect: {{engine: {_toml_str(plugin)}}}\n"
            desc = f"expect engine: {plugin}"
        files["t.yaml"] = text.encode()
        argv = rng.choice([["replay", PH + "t.yaml", "--backend", "none"],
                           ["check", PH + "t.yaml", "--backend", "none"],
                           ["validate", PH + "t.yaml"], ["diff", PH + "t.yaml"]])
        # a trace's engine: is refused by every command; an expect's engine: limits the
        # expect to that engine, so replay and diff (which run other engines) pass it
        # over, while check (which runs every engine expects name) and validate refuse it
        refuse = desc.startswith("trace") or argv[0] in ("check", "validate")
        under = ("t.yaml",)
        if argv[0] == "check" and rng.random() < 0.3:  # --engine: the expect is not run
            argv += ["--engine", "cache-safe"]
            refuse = desc.startswith("trace")
    else:
        name = "pyproject.toml" if what == "pyproject.toml" else "kpool.toml"
        keys, tables, refuse, desc = _settings_body(rng)
        text = _settings_text(keys, tables, name == "pyproject.toml")
        data = text.encode("utf-8", "surrogatepass")
        r = rng.random()
        if what == "pyproject-odd":
            name = "pyproject.toml"
            data, refuse, desc = rng.choice([
                (b"[tool]\nkpool = 5\n", True, "tool.kpool = 5"),
                (b'[[tool.kpool]]\nengines = ["rep-once"]\n', True, "[[tool.kpool]]"),
                (b"[project\nname = 1\n", True, "pyproject syntax error, no [tool.kpool]"),
                (b'tool = "kpool"\n', False, 'tool = "kpool" (no [tool.kpool] table)'),
                (b'[project]\nname = "x"\n', False, "pyproject without [tool.kpool]"),
                (b"[tool.kpool]\n", False, "empty [tool.kpool]"),
                (b'[tool.kpool]\nengines = ["os:abort"]\n[tool.kpool.per-file-ignores]\n',
                 True, "pyproject plug-in"),
            ])
        elif r < 0.12:
            special[name] = rng.choice(_SETTINGS_SPECIAL)
            if special[name] == "loop":
                special[name] = "link:" + name
            refuse, desc = True, f"{name} is {special[name]}"
        elif r < 0.3:
            data, must, how = _syntax_mutation(rng, text)
            refuse, desc = bool(must) or refuse, f"{desc}; {how}"
            if must is None:
                refuse = False
        if name not in special:
            files[name] = data
        if what == "both":  # kpool.toml wins over a good pyproject.toml beside it
            files["pyproject.toml"] = b'[tool.kpool]\nengines = ["rep-once"]\n'
            desc += " (beside a good pyproject.toml)"
        under = (name,)
        desc = f"{name}: {desc}"
    no_config = what != "trace-plugin" and rng.random() < 0.1
    names: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()
    json_stdout = False
    engine_refused = False
    allowed_import = False
    if argv[0] == "check" and what != "trace-plugin":
        if no_config:
            argv.append("--no-config")
            refuse, under = False, ()
        if rng.random() < 0.25:
            eng, must = rng.choice([("rep-once", False), ("cache-safe", False),
                                    (PROBE + ":V", False), (PROBE + ":fn", True),
                                    (PROBE + ":sneaky", True), ("os:abort", True), ("", True)])
            argv += ["--engine", eng]
            allowed_import = eng.startswith(PROBE)
            if must:  # refused for the engine: the message names it, not the settings
                engine_refused, under = True, ()
        r = rng.random()
        sname = next(iter(under), "")
        if r < 0.1 and sname.endswith(".toml") and sname not in special and not no_config \
                and what != "pyproject-odd":  # (a pyproject.toml kpool passes over is no input)
            target = rng.choice([sname, PH + sname]) if not up else PH + sname
            argv += ["-o", target]  # the settings file as the output: refused, untouched
            refuse, names = True, (sname,)
            under = ()
        elif r < 0.25:
            argv += ["-o", PH + "out.txt"]
            outputs = ("out.txt",)
        elif r < 0.4:
            argv += ["--output-format", "json"]
            json_stdout = True
    return Case("settings", key, desc, argv, files, under_test=under, special=special,
                cwd=cwd, pythonpath=True, no_import=not allowed_import,
                expect_exit=(2,) if refuse or engine_refused else None, names=names,
                outputs=outputs, json_stdout=json_stdout, timeout=15)


_SPECIAL_KINDS = [(4, "fifo"), (2, "socket"), (1.5, "dir"), (2, "link:/dev/zero"),
                  (1, "link:/dev/null"), (1, "link:/dev/full"), (1, "link:/dev/urandom"),
                  (0.5, "link:/dev/tty"), (1, "link:/proc/self/status"),
                  (0.5, "link:/proc/self/mem"), (0.5, "link:/proc/self/environ"),
                  (0.5, "link:/sys/kernel/mm/transparent_hugepage/enabled"),
                  (1.5, "link:FIFO"), (1, "link:nowhere.yaml"), (1, "loop"), (1, "link:DIR")]
_DEVICES = ["/dev/zero", "/dev/null", "/dev/full", "/dev/urandom", "/proc/self/status",
            "/proc/self/mem", "/proc/version", "/proc/self/cmdline", "/proc/self/environ",
            "/sys/kernel/mm/transparent_hugepage/enabled", "/proc/self/maps"]


def case_special(rng: random.Random, key: str) -> Case:
    files: dict[str, bytes] = {}
    special: dict[str, str] = {}
    cmd = _weighted(rng, [(2, "replay"), (3, "check"), (2.5, "validate"), (2, "diff"),
                          (1.5, "diff-reports")])
    place = "direct" if cmd in ("replay", "diff-reports") else _weighted(
        rng, [(3, "direct"), (3, "folder"), (1, "device")])
    if cmd == "replay" and rng.random() < 0.25:
        place = "device"
    names: list[str] = []
    desc_parts = []

    def add_special(path: str, in_folder: bool) -> None:
        kind = _weighted(rng, [(w, k) for w, k in _SPECIAL_KINDS
                               if not (in_folder and k in ("dir", "link:DIR"))])
        if kind == "loop":
            kind = "link:" + path.rsplit("/", 1)[-1]
        elif kind == "link:FIFO":
            special[os.path.join(os.path.dirname(path), "target.fifo")] = "fifo"
            kind = "link:target.fifo"
        elif kind == "link:DIR":
            special[os.path.join(os.path.dirname(path), "target.d")] = "dir"
            kind = "link:target.d"
        special[path] = kind
        names.append(os.path.basename(path))
        desc_parts.append(f"{path}={kind}")

    stdout_names: tuple[str, ...] = ()
    if cmd == "diff-reports":
        a, _ = _report_pair(rng)
        files["good.json"] = a
        sname = rng.choice(["x.json", "x.JSON", "x", "x.txt"])
        add_special(sname, False)
        pair = [PH + sname, PH + "good.json"]
        if rng.random() < 0.5:
            pair.reverse()
        argv = ["diff", *pair]
    else:
        # a folder walk takes *.yaml and *.yml; diff takes a .json (or a file starting
        # with { or [) for a report: those are the diff-reports cases
        suffix = [".yaml", ".yml"] if place == "folder" or cmd == "diff" else [
            ".yaml", ".yml", ".json", "", ".YAML"]
        args: list[str] = []
        n = rng.choice([1, 1, 1, 2, 3])
        if place == "folder":
            files["d/good.yaml"] = _small()
            for i in range(n):
                sub = rng.choice(["d/", "d/", "d/sub/", "d/sub/deeper/"])
                add_special(f"{sub}x{i}{rng.choice(suffix)}", True)
            if rng.random() < 0.2:
                special["d/self"] = "link:."  # a folder that holds itself
            args = [PH + "d"]
            if cmd in ("check", "validate"):
                stdout_names = ("good.yaml",)
        elif place == "device":
            dev = rng.choice(_DEVICES)
            args = [dev]
            names.append(dev)
            desc_parts.append(dev)
        else:
            for i in range(n):
                nm = f"x{i}{rng.choice(suffix)}"
                if rng.random() < 0.1:
                    nm = rng.choice(["x\n.yaml", "x\x1b[2J.yaml", "x\u202e.yaml", "x .yaml",
                                     "-x.yaml"]) if i == 0 else nm
                add_special(nm, False)
                args.append(PH + nm)
        if cmd != "replay" and rng.random() < 0.3 and place != "folder":
            files["good.yaml"] = _small()
            args.insert(rng.randint(0, len(args)), PH + "good.yaml")
        argv = [cmd, *args]
        if cmd == "replay":
            argv += ["--backend", "none"]
            if rng.random() < 0.3:
                argv += ["--format", "json"]
        elif cmd == "check":
            argv += ["--backend", "none"]
            if rng.random() < 0.2:
                argv += ["-j", "2"]
        elif cmd == "diff" and rng.random() < 0.2:
            argv += ["--jobs", "2"]
    return Case("special", key, f"{cmd} {place}: {' '.join(desc_parts)}", argv, files,
                special=special, expect_exit=(2,), names=tuple(names),
                stdout_names=stdout_names, timeout=10)


def case_outputs(rng: random.Random, key: str) -> Case:
    files: dict[str, bytes] = {"t.yaml": _small()}
    special: dict[str, str] = {}
    readonly: tuple[str, ...] = ()
    cwd = ""
    stdio = ""
    fsize = None
    names: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()
    expect: tuple[int, ...] | None = (2,)
    target_kind = _weighted(rng, [(3, "input"), (2, "folder-trace"), (2, "report"),
                                  (2, "settings"), (2, "device"), (1.5, "readonly"),
                                  (2, "missing"), (1, "same-twice"), (1, "fsize"),
                                  (1.5, "stdout-full"), (1, "gen"), (1, "fuzz"),
                                  (1, "control")])
    cmd = rng.choice(["replay", "replay", "check", "diff"])
    ins = [PH + "t.yaml"]
    opt = {"replay": rng.choice(["-o", "--output", "--output=", "--html", "--svg"]),
           "check": rng.choice(["-o", "--output"]), "diff": rng.choice(["-o", "--output"])}
    target = ""
    desc = target_kind
    if target_kind == "input":
        spelled = rng.choice(["same", "dot", "updown", "relative", "symlink", "hardlink",
                              "second"])
        if spelled == "same":
            target = PH + "t.yaml"
        elif spelled == "dot":
            target = PH + "./t.yaml"
        elif spelled == "updown":
            files["sub/.keep"] = b""
            target = PH + "sub/../t.yaml"
        elif spelled == "relative":
            target = "t.yaml"
        elif spelled == "symlink":
            special["lnk.yaml"] = "link:t.yaml"
            target = PH + "lnk.yaml"
        elif spelled == "hardlink":
            special["hard.yaml"] = "hardlink:t.yaml"
            target = PH + "hard.yaml"
        else:
            files["p.yaml"] = dict(shipped())["partial-copy.yaml"]
            ins.append(PH + "p.yaml")
            target = PH + "p.yaml"
        names = (os.path.basename(target),)
        desc += f" {spelled}"
    elif target_kind == "folder-trace":
        cmd = rng.choice(["check", "diff"])
        files = {"d/a.yaml": _small(), "d/sub/b.yml": dict(shipped())["clear.yaml"]}
        ins = [PH + "d"]
        how = rng.choice(["a", "b", "dotted", "symlink"])
        target = {"a": PH + "d/a.yaml", "b": PH + "d/sub/b.yml",
                  "dotted": PH + "d/./sub/../a.yaml", "symlink": PH + "lnk.yaml"}[how]
        if how == "symlink":
            special["lnk.yaml"] = "link:d/sub/b.yml"
        names = (os.path.basename(target),)
        desc += f" {how}"
    elif target_kind == "report":
        cmd = "diff"
        a, b = _report_pair(rng)
        files = {"a.json": a, "b.json": b}
        ins = [PH + "a.json", PH + "b.json"]
        how = rng.choice(["a", "b", "symlink"])
        target = {"a": PH + "a.json", "b": PH + "b.json", "symlink": PH + "lnk.json"}[how]
        if how == "symlink":
            special["lnk.json"] = "link:a.json"
        names = (os.path.basename(target),)
        desc += f" {how}"
    elif target_kind == "settings":
        cmd = "check"
        sname = rng.choice(["kpool.toml", "kpool.toml", "pyproject.toml"])
        files[sname] = (b'engines = ["rep-once", "cache-safe"]\n' if sname == "kpool.toml"
                        else b'[tool.kpool]\nengines = ["rep-once"]\n')
        if rng.random() < 0.3:
            cwd = "sub"
            files["sub/.keep"] = b""
            target = rng.choice(["../" + sname, PH + sname])
        else:
            target = rng.choice([sname, PH + sname, "./" + sname])
        names = (sname,)
        desc += f" {sname} from {cwd or '.'}"
    elif target_kind == "device":
        dev = rng.choice(["/dev/full", "/dev/zero", "/dev/null", "link:/dev/full", "fifo",
                          "socket", "dir", "link:/dev/zero", "/dev/urandom"])
        if dev.startswith("/"):
            target = dev
        else:
            special["dev.out"] = dev
            target = PH + "dev.out"
        names = (os.path.basename(target),)
        desc += f" {dev}"
    elif target_kind == "readonly":
        readonly = ("ro",)
        target = rng.choice([PH + "ro/x.json", PH + "ro/sub/x.json", PH + "ro"])
        names = (os.path.basename(target),) if not target.endswith("/ro") else ("ro",)
        desc += f" {target[len(PH):]}"
    elif target_kind == "missing":
        target = rng.choice([PH + "missing/x.json", PH + "t.yaml/x.json", "/proc/kpool-x.json",
                             "/sys/kpool-x.json", PH + "", "", PH + "missing/deeper/x",
                             "/proc/self/status", PH + "x" * 300])
        names = (os.path.basename(target.rstrip("/")) or "empty",)
        if target == PH:
            names = (" is a directory", "directory")
        elif target.endswith("x" * 300):
            names = ("xxxxxxxxxx",)
        desc += f" {target.replace(PH, '')[:40]!r}"
    elif target_kind == "same-twice":
        cmd = "replay"
        pair = rng.choice([("--html", "--svg"), ("-o", "--svg"), ("--output", "--html"),
                           ("--html", "-o")])
        v = rng.choice(["v.html", "v.txt"])
        extra = [pair[0], PH + v, pair[1], PH + v]
        names = (v,)
        desc += f" {pair}"
    elif target_kind == "fsize":
        fsize = rng.choice([1, 16, 64])  # below any report's size
        target = PH + "out.txt"
        names = ("out.txt",)
        desc += f" RLIMIT_FSIZE {fsize}"
    elif target_kind == "stdout-full":
        stdio = "full"
        names = ("standard output",)
    elif target_kind == "gen":
        cmd = "gen"
        target = rng.choice(["/dev/full", "/dev/zero", PH + "missing/x.yaml", PH + "ro/x.yaml",
                             PH + "", "", "/proc/kpool-x.yaml", PH + "ff"])
        if "/ro/" in target:
            readonly = ("ro",)
        if target.endswith("/ff"):
            special["ff"] = "fifo"
        names = (os.path.basename(target.rstrip("/")) or "empty",)
        if target == PH:
            names = ("directory",)
        desc += f" {target.replace(PH, '')!r}"
    elif target_kind == "fuzz":
        cmd = "fuzz"
        target = rng.choice([PH + "t.yaml", "/dev/null", PH + "ff", "", PH + "ro",
                             PH + "t.yaml/x", "/proc/kpool-x"])
        if target.endswith("/ro"):
            readonly = ("ro",)
            names = ("ro",)
        elif target.endswith("/ff"):
            special["ff"] = "fifo"
            names = ("ff",)
        else:
            names = (os.path.basename(target) or "-o",)
        desc += f" -o {target.replace(PH, '')!r}"
    else:  # control: a fresh file, or a file that is no input, overwritten
        expect = None
        if rng.random() < 0.5:
            files["old.txt"] = b"old\n"
            target = PH + "old.txt"
            outputs = ("old.txt",)
        else:
            target = PH + "fresh.txt"
            outputs = ("fresh.txt",)
    # the command line
    if cmd == "gen":
        argv = ["gen", rng.choice(["random", "server", "speculative"]), "-o", target]
    elif cmd == "fuzz":
        argv = ["fuzz", "--engine", "cache-safe", "--runs", "2", "--time-budget", "3", "-o",
                target]
    elif target_kind == "same-twice":
        argv = ["replay", *ins, "--backend", "none", *extra]
    elif target_kind == "stdout-full":
        argv = rng.choice([["replay", *ins, "--backend", "none"],
                           ["replay", *ins, "--backend", "none", "--format", "json"],
                           ["check", *ins, "--backend", "none"], ["validate", *ins],
                           ["diff", *ins], ["diff", *ins, "--format", "json"],
                           ["explain", "KP001"], ["schema", "report"], ["engines"],
                           ["gen", "random"], ["--help"], ["--version"]])
    else:
        o = opt[cmd]
        argv = [cmd, *ins]
        argv += [o + target] if o.endswith("=") else [o, target]
        if cmd in ("replay", "check"):
            argv += ["--backend", "none"]
        if cmd == "replay" and o in ("-o", "--output", "--output=") and rng.random() < 0.3:
            argv += ["--format", "json"]
        if cmd == "check" and rng.random() < 0.3:
            argv += ["--output-format", rng.choice(["json", "junit", "sarif"])]
    return Case("outputs", key, f"{' '.join(argv[:1])} {desc}", argv, files, special=special,
                readonly=readonly, cwd=cwd, stdio=stdio, fsize=fsize, expect_exit=expect,
                names=names, outputs=outputs, timeout=15)


_HOSTILE_NUMBERS = ["nan", "NaN", "-nan", "inf", "-inf", "+inf", "Infinity", "1e3", "1E3",
                    "1e999", "-1e999", "1e-300", "-1", "-0", "0", "1", "2", "3", "100000",
                    "4294967296", "9223372036854775808", "18446744073709551616",
                    "-9223372036854775809", "99999999999999999999", "9" * 5000,
                    "1" + "0" * 5000, "0x10", "0o7", "0b1", "1_000", "+1", " 1", "1 ", "1.0",
                    "1.5", ".5", "5.", "", " ", "\u0663", "\uff13", "1\u0663", "\x1b[31m1",
                    "1\n", "1\u2028", "1K", "1G", "64M", "1e300G", "1e308", "9" * 308 + "T",
                    "none", "0.0000001", "2.5GB", "1..2", "3..", "..", "5..3",
                    "0..99999999999999999999", "-1..2", "2.." + "9" * 16, "1e3..2e3"]

@functools.cache
def numeric_options() -> dict[str, tuple[tuple[str, str, float, float], ...]]:
    """Every numeric option of every command, read off kpool's click commands: command
    (`gen server` for a scenario) -> (option, kind, lo, hi), kind "int" or "float"
    (kpool's Int and Float types and their bounds), "size" (--max-memory) or "ubatch"."""
    import click

    from kpool_cli.cli import cli
    from kpool_cli.cli.options import Float, Int

    out: dict[str, tuple[tuple[str, str, float, float], ...]] = {}

    def walk(group: click.Group, prefix: str) -> None:
        for name in sorted(group.commands):
            cmd = group.commands[name]
            if isinstance(cmd, click.Group):
                walk(cmd, prefix + name + " ")
                continue
            opts = []
            for p in cmd.params:
                if not isinstance(p, click.Option) or p.is_flag:
                    continue
                if isinstance(p.type, Int | Float):
                    kind = "int" if isinstance(p.type, Int) else "float"
                    opts += [(o, kind, p.type.lo, p.type.hi) for o in p.opts]
                elif "--max-memory" in p.opts:
                    opts.append(("--max-memory", "size", 0, 0))
                elif "--ubatch" in p.opts:
                    opts.append(("--ubatch", "ubatch", 0, 0))
            if opts:
                out[prefix + name] = tuple(opts)

    walk(cli, "")
    return out


def must_refuse_number(kind: str, lo, hi, text: str) -> bool:
    """Whether kpool must refuse `text` for an option of this kind: the promise is
    plain ASCII decimal within the bounds for an int (surrounding blanks aside), a
    finite decimal within them for a float, `N` or `A..B` of ASCII digits for a ubatch,
    and for a size at least no nan, inf, negative or 5,000-digit number."""
    t = text.strip()
    if kind == "int":
        if not re.fullmatch(r"-?[0-9]+", t, re.ASCII) or len(t) > 25:
            return True
        n = int(t)
        return n < lo or (hi is not None and n > hi)
    if kind == "float":
        if not re.fullmatch(r"-?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]{1,3})?", t,
                            re.ASCII) or len(t) > 40:
            return True
        x = float(t)
        return not (lo <= x <= hi)
    if kind == "ubatch":
        m = re.fullmatch(r"([0-9]+)(?:\s*\.\.\s*([0-9]*))?", t, re.ASCII)
        if not m or any(len(g or "") > 15 for g in m.groups()):
            return True
        return bool(m.group(2)) and int(m.group(2)) <= int(m.group(1))
    low = t.lower()
    return (low in ("", "nan", "-nan", "inf", "-inf", "+inf", "infinity") or t.startswith("-")
            or len(t) > 1000 or low.startswith(("1e999", "-1e999")))


def case_options(rng: random.Random, key: str) -> Case:
    files = {"t.yaml": _small()}
    kind = _weighted(rng, [(6, "number"), (1.5, "gen"), (3, "engine"), (1.5, "expect-code")])
    names: tuple[str, ...] = ()
    expect: tuple[int, ...] | None = None
    outputs: tuple[str, ...] = ()
    under: tuple[str, ...] = ()
    pythonpath = False
    desc = kind
    if kind == "number":
        table = numeric_options()
        cmd = rng.choice([c for c in table if not c.startswith("gen ")])
        opt, okind, lo, hi = rng.choice(table[cmd])
        v = rng.choice(_HOSTILE_NUMBERS)
        if cmd == "fuzz":
            argv = ["fuzz", "--engine", "cache-safe", "-o", PH + "fz"]
            outputs = ("fz",)
            if opt != "--runs":
                argv += ["--runs", "2"]
            if opt != "--time-budget":
                argv += ["--time-budget", "3"]
        else:
            argv = [cmd, PH + "t.yaml"]
            if cmd in ("replay", "check"):
                argv += ["--backend", "none"]
        argv += [opt, v] if rng.random() < 0.8 else [f"{opt}={v}" if opt.startswith("--")
                                                     else opt + v]
        if must_refuse_number(okind, lo, hi, v):
            expect, names = (2,), (opt,)
        desc = f"{cmd} {opt} {v[:30]!r}"
    elif kind == "gen":
        table = numeric_options()
        sub = rng.choice([c for c in table if c.startswith("gen ")])
        opt, _kind, lo, hi = rng.choice(table[sub])
        v = rng.choice(_HOSTILE_NUMBERS)
        argv = [*sub.split(), opt, v]
        if rng.random() < 0.3:
            argv += ["-o", PH + "g.yaml"]
            outputs = ("g.yaml",)
        if must_refuse_number("int", lo, hi, v):
            expect, names = (2,), (opt,)
        desc = f"{sub} {opt} {v[:30]!r}"
    elif kind == "engine":
        files.update(_probe_files())
        pythonpath = True
        eng, must = rng.choice(ENGINE_ARGS)
        where = rng.choice(["replay", "check", "diff-base", "diff-head", "fuzz", "fuzz-base"])
        if where == "replay":
            argv = ["replay", PH + "t.yaml", "--backend", "none", "--engine", eng]
        elif where == "check":
            argv = ["check", PH + "t.yaml", "--backend", "none", "--engine", eng]
        elif where.startswith("diff"):
            argv = ["diff", PH + "t.yaml", "--" + where[5:], eng]
        else:
            argv = ["fuzz", "--runs", "2", "--time-budget", "3", "-o", PH + "fz"]
            argv += ["--engine", "cache-safe", "--base", eng] if where == "fuzz-base" else [
                "--engine", eng]
            outputs = ("fz",)
        if must:
            expect = (2,)
        desc = f"{where} {eng[:40]!r}"
    else:  # an expect naming a finding code kpool does not know
        code = rng.choice(["KP999", "KP000", "KP0010", "kp001", "scatter-race", "", "KP001\n",
                           "KP", "KP1", "KP-001", "KP\u0661\u0660\u0660", "KP001 ", "1"])
        item = rng.choice([f"[{json.dumps(code)}]", f"[KP001, {json.dumps(code)}]"])
        text = _small().decode().rstrip("\n") + f"\n  - expect: {{findings: {item}}}\n"
        files["t.yaml"] = text.encode()
        argv = rng.choice([["validate", PH + "t.yaml"],
                           ["check", PH + "t.yaml", "--backend", "none"],
                           ["replay", PH + "t.yaml", "--backend", "none", "--check"]])
        expect, under = (2,), ("t.yaml",)
        desc = f"{argv[0]} expect findings {item}"
    return Case("options", key, desc, argv, files, expect_exit=expect, names=names,
                outputs=outputs, under_test=under, pythonpath=pythonpath,
                no_import=False, timeout=20)


def _long_trace(rng: random.Random, n_ops: int) -> bytes:
    """A valid trace of about `n_ops` small decodes on two sequences (a replay of some
    tenths of a second to a few seconds)."""
    pos = [0, 0]
    lines = ["kpool_trace: 1", "name: long", "cache: {kv_size: 16384, kpool: 4, n_seq_max: 2}",
             "ops:"]
    for i in range(n_ops):
        s = rng.randrange(2)
        if i % 97 == 96:
            lines.append(f"  - seq_rm: {{seq: {s}, p0: {max(0, pos[s] - 2)}, p1: -1}}")
            pos[s] = max(0, pos[s] - 2)
            continue
        k = rng.randint(1, 4)
        lines.append(f"  - decode: {{seq: {s}, pos: {pos[s]}..{pos[s] + k}}}")
        pos[s] += k
    return ("\n".join(lines) + "\n").encode()


_PRINTING = [
    ["replay", PH + "t.yaml", "--backend", "none"],
    ["replay", PH + "t.yaml", "--backend", "none", "--format", "json"],
    ["replay", PH + "t.yaml", "--backend", "none", "--color", "--all-ubatches"],
    ["replay", PH + "t.yaml", "--backend", "none", "--format", "junit"],
    ["check", PH + "t.yaml", "--backend", "none"],
    ["check", PH + "t.yaml", "--backend", "none", "--output-format", "json"],
    ["check", PH + "t.yaml", "--backend", "none", "--output-format", "junit"],
    ["check", PH + "t.yaml", "--backend", "none", "--output-format", "sarif"],
    ["validate", PH + "t.yaml"], ["diff", PH + "t.yaml"],
    ["diff", PH + "t.yaml", "--format", "json"], ["diff", PH + "a.json", PH + "b.json"],
    ["explain", "KP001"], ["explain", "--list"], ["schema", "trace"], ["schema", "report"],
    ["schema", "check"], ["engines"], ["gen", "random"], ["gen", "server"], ["--help"],
    ["--version"], ["replay", "--help"],
]


def case_signals(rng: random.Random, key: str) -> Case:
    a, b = _report_pair(rng)
    files = {"t.yaml": _small(), "a.json": a, "b.json": b}
    kind = _weighted(rng, [(3, "closed"), (2, "full"), (5, "signal")])
    if kind in ("closed", "full"):
        argv = list(rng.choice(_PRINTING))
        return Case("signals", key, f"stdout {kind}: {' '.join(argv[:3])}", argv, files,
                    stdio=kind, expect_exit=(141,) if kind == "closed" else (2,),
                    names=("standard output",) if kind == "full" else (), timeout=20)
    n = rng.choice([100, 400, 1000, 2000, 3000])
    files["long.yaml"] = _long_trace(rng, n)
    sig = rng.choice([signal.SIGINT, signal.SIGTERM])
    delay = rng.choice([0.0, 0.01, 0.05, 0.1, 0.2, 0.3, 0.5, 0.8, 1.2])
    form = _weighted(rng, [(5, "replay-json"), (2, "replay-two"), (1, "replay-o"),
                           (1, "check-json"), (1, "diff-json"), (1, "replay-text")])
    json_stdout = form in ("replay-json", "replay-two", "check-json", "diff-json")
    outputs: tuple[str, ...] = ()
    json_files: tuple[str, ...] = ()
    if form == "replay-json":
        argv = ["replay", PH + "long.yaml", "--backend", "none", "--format", "json"]
    elif form == "replay-two":
        two = [PH + "t.yaml", PH + "long.yaml"]
        if rng.random() < 0.5:
            two.reverse()
        if rng.random() < 0.3:
            two.append(PH + "t.yaml")
        argv = ["replay", *two, "--backend", "none", "--format", "json"]
    elif form == "replay-o":
        argv = ["replay", PH + "long.yaml", "--backend", "none", "--format", "json", "-o",
                PH + "out.json"]
        outputs = json_files = ("out.json",)
    elif form == "check-json":
        argv = ["check", PH + "long.yaml", "--backend", "none", "--output-format", "json"]
    elif form == "diff-json":
        argv = ["diff", PH + "long.yaml", "--format", "json"]
    else:
        argv = ["replay", PH + "long.yaml", "--backend", "none", "--all-ubatches"]
    return Case("signals", key, f"{signal.Signals(sig).name} after {delay} s: {form}, {n} ops",
                argv, files, stdio="pipe", signal=(int(sig), delay), json_stdout=json_stdout,
                outputs=outputs, json_files=json_files, timeout=30)


LINE_BREAKS = ["\n", "\r", "\r\n", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028",
               "\u2029"]


def _lb_trace(field_: str, marker: str) -> str:
    q = json.dumps
    name = marker if field_ == "name" else "lb"
    desc = marker if field_ == "description" else "d"
    note = marker if field_ == "note" else "n"
    slot = marker if field_ == "slot" else "s"
    read = marker if field_ == "unknown-slot" else slot
    engine = f"engine: {q(marker)}\n" if field_ == "engine" else ""
    extra = f"{q(marker)}: 1\n" if field_ == "key" else ""
    expect_engine = f", engine: {q(marker)}" if field_ == "expect-engine" else ""
    return (f"kpool_trace: 1\nname: {q(name)}\ndescription: {q(desc)}\n{engine}{extra}"
            "cache: {kv_size: 16, kpool: 4, n_seq_max: 2}\nops:\n"
            "  - decode: {seq: 0, pos: 0..4}\n"
            f"  - note: {q(note)}\n"
            f"  - state_write: {{seq: 0, slot: {q(slot)}}}\n"
            "  - seq_rm: {seq: 0}\n"
            f"  - state_read: {{seq: 0, slot: {q(read)}}}\n"
            "  - decode: {seq: 0, pos: 4..6}\n"
            f"  - expect: {{findings: []{expect_engine}}}\n")


_LB_VIEWS = [
    (3, ["replay", "@T", "--backend", "none", "--all-ubatches"], "plain"),
    (3, ["replay", "@T", "--backend", "none", "--all-ubatches", "--color"], "rich"),
    (1, ["replay", "@T", "--backend", "none", "--only-findings"], "plain"),
    (1, ["replay", "@T", "--backend", "none", "--all-ubatches", "-o", PH + "out.txt"], "file"),
    (1, ["replay", "@T", "--backend", "none", "--format", "junit"], "plain"),
    (1, ["replay", "@T", "--backend", "none", "--format", "github"], "plain"),
    (0.5, ["replay", "@T", "--backend", "none", "--format", "json"], "json"),
    (2, ["check", "@T", "--backend", "none"], "plain"),
    (1, ["check", "@T", "--backend", "none", "--output-format", "github"], "plain"),
    (1, ["check", "@T", "--backend", "none", "--output-format", "junit"], "plain"),
    (0.5, ["check", "@T", "--backend", "none", "--output-format", "sarif"], "json"),
    (1, ["check", "@T", "--backend", "none", "-o", PH + "out.txt"], "file"),
    (2, ["validate", "@T"], "plain"),
    (2, ["diff", "@T"], "plain"),
    (1.5, ["diff", "@T"], "rich-env"),
    (1, ["diff", "@T", "-o", PH + "out.txt"], "file"),
    (0.5, ["diff", "@T", "--format", "json"], "json"),
]


def case_linebreaks(rng: random.Random, key: str) -> Case:
    ch = rng.choice(LINE_BREAKS)
    marker = f"QQa{ch}QQb"
    where = _weighted(rng, [(2, "name"), (2, "description"), (2, "note"), (2, "slot"),
                            (1, "unknown-slot"), (1, "engine"), (1, "key"),
                            (1, "expect-engine"), (2, "filename"), (1, "folder"),
                            (3, "report")])
    files: dict[str, bytes] = {}
    env: dict[str, str] = {}
    if where == "report":
        a, b = _report_pair(rng)
        doc = json.loads(a)
        fields = [("trace", "name"), ("trace", "path"), ("engine",), ("tool", "version"),
                  ("backend",)]
        for i, u in enumerate(doc.get("ubatches", [])):
            for j, _f in enumerate(u.get("findings", [])):
                fields += [("ubatches", i, "findings", j, "message"),
                           ("ubatches", i, "findings", j, "name")]
        for i, _e in enumerate(doc.get("events", [])):
            fields.append(("events", i, "status"))
        for i, _x in enumerate(doc.get("expectations", [])):
            fields.append(("expectations", i, "message"))
        path = rng.choice(fields)
        doc = _set(doc, path, marker if rng.random() < 0.8 else f"x {marker} y")
        files = {"a.json": json.dumps(doc).encode(), "b.json": b}
        argv = ["diff", PH + "a.json", PH + "b.json"]
        if rng.random() < 0.5:
            argv[1:3] = argv[2:0:-1]
        view = rng.choice(["plain", "plain", "rich-env", "file", "json"])
        if rng.random() < 0.5:
            argv.append("--force")
        if view == "file":
            argv += ["-o", PH + "out.txt"]
        elif view == "json":
            argv += ["--format", "json"]
        desc = f"report {_desc_path(path)} {ch!r} ({view})"
    else:
        fname = "t.yaml"
        if where == "filename":
            fname = f"QQa{ch}QQb.yaml"
            text = _lb_trace("none", marker)
        elif where == "folder":
            fname = f"QQa{ch}QQb/t.yaml"
            text = _lb_trace("none", marker)
        else:
            text = _lb_trace(where, marker)
        files[fname] = text.encode("utf-8")
        _w, template, view = _weighted(rng, [(w, (w, t, v)) for w, t, v in _LB_VIEWS])
        target = PH + fname
        if where == "folder" or (where == "filename" and rng.random() < 0.3 and
                                 template[0] in ("check", "validate", "diff")):
            target = PH + fname.split("/")[0] if where == "folder" else PH
        if where == "folder" and template[0] == "replay":
            target = PH + fname
        argv = [target if a == "@T" else a for a in template]
        desc = f"{where} {ch!r}: {' '.join(argv[:1])} ({view})"
    if view in ("rich-env",):
        env = {"FORCE_COLOR": "1", "COLUMNS": rng.choice(["20", "80", "200"])}
    elif view == "rich":
        env = {"COLUMNS": rng.choice(["20", "40", "80", "200"])}
    outputs = ("out.txt",) if view == "file" else ()
    json_stdout = view == "json"
    markers = () if view == "json" else (marker,)
    return Case("linebreaks", key, desc, argv, files, env=env, outputs=outputs,
                text_files=outputs, json_stdout=json_stdout, markers=markers,
                plain=view not in ("rich", "rich-env"), timeout=20)


MAKERS = {"bytes": case_bytes, "yaml": case_yaml, "semantic": case_semantic,
          "report": case_report, "argv": case_argv, "settings": case_settings,
          "special": case_special, "outputs": case_outputs, "options": case_options,
          "signals": case_signals, "linebreaks": case_linebreaks}


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
    """Write the case's files (and special files) into `workdir` and hash everything
    there and every input outside it (`case.digests`); its argv with the placeholder
    resolved."""
    for name, data in case.files.items():
        p = workdir / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    for name, spec in case.special.items():
        p = workdir / name
        p.parent.mkdir(parents=True, exist_ok=True)
        if spec == "fifo":
            os.mkfifo(p)
        elif spec == "socket":
            _bind_socket(p)
        elif spec == "dir":
            p.mkdir(exist_ok=True)
        elif spec.startswith("link:"):
            os.symlink(spec[5:], p)
        elif spec.startswith("hardlink:"):
            os.link(workdir / spec[9:], p)
        else:
            raise ValueError(f"unknown special file {spec!r}")
    for d in case.readonly:
        (workdir / d).mkdir(parents=True, exist_ok=True)
        os.chmod(workdir / d, 0o555)
    argv = resolve(case, workdir)
    case.digests = snapshot(workdir, argv)
    return argv


def _bind_socket(p: Path) -> None:
    """A UNIX socket file at `p` (bound from its folder: the path may be long)."""
    import socket

    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    cwd = os.getcwd()
    try:
        os.chdir(p.parent)
        s.bind(p.name)
    finally:
        os.chdir(cwd)
        s.close()


def _digest(path: str) -> str:
    """What a path is, without opening anything that is not a regular file."""
    try:
        st = os.lstat(path)
    except OSError:
        return "missing"
    if stat.S_ISLNK(st.st_mode):
        return "link:" + os.readlink(path)
    if stat.S_ISDIR(st.st_mode):
        return "dir"
    if not stat.S_ISREG(st.st_mode):
        return f"special:{stat.S_IFMT(st.st_mode):o}"
    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    except OSError as e:
        return f"unreadable:{e.errno}"
    return "sha256:" + h.hexdigest()


def snapshot(workdir: Path, argv: list[str] = ()) -> dict[str, str]:
    """Every entry of `workdir` (relative path -> `_digest`), symlinks not followed; and
    every argument that is a regular file outside it ("abs:PATH")."""
    out: dict[str, str] = {}
    root = str(workdir)
    for dirpath, dirs, files in os.walk(root):
        for n in dirs + files:
            p = os.path.join(dirpath, n)
            out[os.path.relpath(p, root)] = _digest(p)
    for a in argv:
        if a.startswith("/") and not a.startswith(root + "/") and not a.startswith(
                ("/dev/", "/proc/", "/sys/")):
            with contextlib.suppress(OSError, ValueError):
                if stat.S_ISREG(os.stat(a).st_mode):
                    out["abs:" + a] = _digest(a)
    return out


def resolve(case: Case, workdir: Path) -> list[str]:
    """The case's argv with the placeholder replaced by `workdir`."""
    base = str(workdir) + "/"
    return [base + a[len(PH):] if a.startswith(PH) else a.replace("=" + PH, "=" + base, 1)
            for a in case.argv]


def run_argv(argv: list[str], env: dict[str, str | None] | None = None,
             timeout: float | None = None, *, cwd: Path | None = None,
             base: dict[str, str | None] | None = None) -> Outcome:
    """`kpool ARGV` in this process: main() with sys.argv patched, streams captured, in
    the folder `cwd` (this process's own when None). The environment is this process's
    with `base` applied (None: `_KPOOL_ENV`, the campaign's; `{}`: nothing, the
    environment a child process would inherit), then `env` (a value None: unset).
    What main() changes of the process is put back after it: the handlers of the
    signals it takes (`signals.install`), the collector's thresholds, the folder."""
    import gc

    from click.testing import CliRunner

    from kpool_cli.cli import main
    from kpool_cli.signals import TERMINATING

    runner = CliRunner()
    full_env = dict(_KPOOL_ENV if base is None else base)
    full_env.update(env or {})
    old_argv = sys.argv
    old_handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, *TERMINATING)}
    old_thresholds = gc.get_threshold()
    old_cwd = os.getcwd() if cwd is not None else None
    old_alarm = None
    code: object = None
    exc = None
    t0 = time.perf_counter()
    with runner.isolation(env=full_env) as streams:
        sys.argv = ["kpool", *argv]
        if cwd is not None:
            os.chdir(cwd)
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
            for signum, handler in old_handlers.items():
                if handler is not None:  # None: a handler not set from Python
                    signal.signal(signum, handler)
            gc.set_threshold(*old_thresholds)
            if old_cwd is not None:
                os.chdir(old_cwd)
            with contextlib.suppress(Exception):
                sys.stdout.flush()
                sys.stderr.flush()
        out = streams[0].getvalue().decode("utf-8", "backslashreplace")
        err = streams[1].getvalue().decode("utf-8", "backslashreplace")
    return Outcome(code, out, err, exc, time.perf_counter() - t0)


_KPOOL_ENV = {"KPOOL_TRACEBACK": "1", "COLUMNS": "100", "FORCE_COLOR": None, "NO_COLOR": None,
              "TERM": "xterm"}


@contextlib.contextmanager
def _environment(env: dict[str, str | None]):
    old = {k: os.environ.get(k) for k in env}
    try:
        for k, v in env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _drain(fd: int, chunks: list[bytes]) -> None:
    with contextlib.suppress(OSError):
        while True:
            b = os.read(fd, 1 << 16)
            if not b:
                break
            chunks.append(b)
    os.close(fd)


def run_argv_fd(argv: list[str], env: dict[str, str] | None, timeout: float | None,
                stdio: str, sig: tuple[int, float] | None = None) -> Outcome:
    """`kpool ARGV` in this process with real file descriptors: stdout a pipe read by a
    thread ("pipe"), a pipe whose reader is gone ("closed"), or /dev/full ("full");
    stderr a pipe. sys.stdout and sys.stderr are new text streams on fds 1 and 2, as
    the interpreter makes them for a pipe. With `sig`, a thread sends the signal to this
    process that many seconds after main() starts (only while main() runs)."""
    from kpool_cli.cli import main

    full_env = dict(_KPOOL_ENV)
    full_env.update(env or {})
    saved = {fd: os.dup(fd) for fd in (1, 2)}
    old_streams = sys.stdout, sys.stderr
    out_chunks: list[bytes] = []
    err_chunks: list[bytes] = []
    readers = []
    r_err, w_err = os.pipe()
    readers.append(threading.Thread(target=_drain, args=(r_err, err_chunks), daemon=True))
    if stdio == "full":
        w_out = os.open("/dev/full", os.O_WRONLY)
    else:
        r_out, w_out = os.pipe()
        if stdio == "closed":
            os.close(r_out)
        else:
            readers.append(threading.Thread(target=_drain, args=(r_out, out_chunks),
                                            daemon=True))
    for t in readers:
        t.start()
    notes: list[str] = []
    code: object = None
    exc = None
    final_err = ""
    old_argv = sys.argv
    old_int = signal.getsignal(signal.SIGINT)
    old_term = signal.getsignal(signal.SIGTERM)
    old_alarm = None
    lock = threading.Lock()
    state = {"armed": True, "fired": False}

    def fire() -> None:
        with lock:
            if state["armed"]:
                state["fired"] = True
                os.kill(os.getpid(), sig[0])

    timer = threading.Timer(sig[1], fire) if sig else None
    t0 = time.perf_counter()
    os.dup2(w_out, 1)
    os.dup2(w_err, 2)
    os.close(w_out)
    os.close(w_err)
    # as the interpreter makes stdout for a pipe or a file (without PYTHONUNBUFFERED):
    # block-buffered, st_blksize bytes
    sys.stdout = open(1, "w", encoding="utf-8", errors="strict", closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", encoding="utf-8", errors="backslashreplace",  # noqa: SIM115
                      closefd=False, buffering=1)
    try:
        with _environment(full_env):
            sys.argv = ["kpool", *argv]
            if timeout:
                def on_alarm(signum, frame):
                    raise CaseTimeout

                old_alarm = signal.signal(signal.SIGALRM, on_alarm)
                signal.setitimer(signal.ITIMER_REAL, timeout)
            try:
                try:
                    # until kpool installs its handlers, a signal kills the process as
                    # it would a real one (the shell sees 128 + the signal)
                    signal.signal(signal.SIGINT, _early_signal)
                    signal.signal(signal.SIGTERM, _early_signal)
                    if timer:
                        timer.start()
                    main()
                    code = 0
                except SystemExit as e:
                    code = 0 if e.code is None else e.code
                except CaseTimeout:
                    code = "timeout"
                except _EarlySignal as e:
                    code = 128 + e.signum
                    notes.append("signal before kpool's handlers")
                except BaseException as e:  # anything that escapes main() is a finding
                    exc = traceback.format_exc()
                    if sig and isinstance(e, KeyboardInterrupt) and _at_exit(e):
                        exc, code = None, 128 + sig[0]
                        notes.append("signal after main() decided its status")
            except KeyboardInterrupt:  # the signal, handled after main() returned
                notes.append("signal after main() returned")
            with lock:
                state["armed"] = False
            if timer:
                timer.cancel()
            if state["fired"]:
                notes.append("signal sent")
                with contextlib.suppress(KeyboardInterrupt):
                    time.sleep(0.05)  # a handler still pending runs here
            if exc is None and code != "timeout":
                # what the interpreter does at exit: flush stdout; when that fails, it
                # says "Exception ignored" and the status becomes 120 (Py_FinalizeEx)
                try:
                    sys.stdout.flush()
                except Exception as e:
                    notes.append(f"the interpreter's final flush failed ({code!r} -> 120)")
                    final_err = (f"Exception ignored in: <_io.TextIOWrapper name='<stdout>' "
                                 f"mode='w' encoding='utf-8'>\n{type(e).__name__}: {e}\n")
                    code = 120
    finally:
        if timeout:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old_alarm)
        signal.signal(signal.SIGINT, old_int)
        signal.signal(signal.SIGTERM, old_term)
        sys.argv = old_argv
        for s in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                s.flush()
        with contextlib.suppress(Exception):
            sys.stdout.close()
        with contextlib.suppress(Exception):
            sys.stderr.close()
        sys.stdout, sys.stderr = old_streams
        for fd, dup in saved.items():
            os.dup2(dup, fd)
            os.close(dup)
        for t in readers:
            t.join(10)
    out = b"".join(out_chunks).decode("utf-8", "backslashreplace")
    err = b"".join(err_chunks).decode("utf-8", "backslashreplace") + final_err
    return Outcome(code, out, err, exc, time.perf_counter() - t0, notes=notes)


class _EarlySignal(BaseException):
    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _early_signal(signum, frame) -> None:
    raise _EarlySignal(signum)


def _at_exit(e: BaseException) -> bool:
    """The KeyboardInterrupt came in main()'s last line (`sys.exit(code)`), after kpool
    had caught what it could: a shell would see the signal's status, as it should."""
    tb = e.__traceback__
    last = None
    while tb is not None:
        last = tb
        tb = tb.tb_next
    if last is None:
        return False
    co = last.tb_frame.f_code
    return co.co_name == "main" and co.co_filename.endswith(os.path.join("kpool_cli", "cli.py"))


# --- for root, a read-only folder is read-only too -------------------------------------

_CAP_DAC_OVERRIDE = 1


class _CapHeader(ctypes.Structure):
    _fields_: typing.ClassVar = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_: typing.ClassVar = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                                 ("inheritable", ctypes.c_uint32)]


@contextlib.contextmanager
def _without_dac_override():
    """Root writes into a mode-0555 folder: while a case with read-only folders runs,
    this thread's effective capabilities lose CAP_DAC_OVERRIDE (kept in the permitted
    set, so they come back after). Yields whether the folders are read-only now."""
    if os.geteuid() != 0:
        yield True
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        head = _CapHeader(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3
        data = (_CapData * 2)()
        if libc.capget(ctypes.byref(head), data) != 0:
            raise OSError(ctypes.get_errno(), "capget")
        saved = data[0].effective
        data[0].effective &= ~(1 << _CAP_DAC_OVERRIDE)
        if libc.capset(ctypes.byref(head), data) != 0:
            raise OSError(ctypes.get_errno(), "capset")
    except (OSError, AttributeError):
        yield False
        return
    try:
        yield True
    finally:
        data[0].effective = saved
        libc.capset(ctypes.byref(head), data)


def _writable(d: Path) -> bool:
    probe = d / ".hostile-probe"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError:
        return False
    os.close(fd)
    probe.unlink()
    return True


@contextlib.contextmanager
def _case_context(case: Case, workdir: Path):
    """What a case needs around its run: its folder on sys.path (the probe module; no
    bytecode written), RLIMIT_FSIZE, read-only folders that are read-only for root too.
    Yields the notes of how it went."""
    notes: list[str] = []
    with contextlib.ExitStack() as stack:
        if case.pythonpath:
            sys.path.insert(0, str(workdir))
            old_bytecode = sys.dont_write_bytecode
            sys.dont_write_bytecode = True

            def unpath() -> None:
                with contextlib.suppress(ValueError):
                    sys.path.remove(str(workdir))
                sys.path_importer_cache.pop(str(workdir), None)
                sys.modules.pop(PROBE, None)
                sys.dont_write_bytecode = old_bytecode

            stack.callback(unpath)
        if case.fsize is not None:
            old_lim = resource.getrlimit(resource.RLIMIT_FSIZE)
            old_xfsz = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (case.fsize, old_lim[1]))

            def unlimit() -> None:
                resource.setrlimit(resource.RLIMIT_FSIZE, old_lim)
                signal.signal(signal.SIGXFSZ, old_xfsz)

            stack.callback(unlimit)
        if case.readonly:
            stack.enter_context(_without_dac_override())
            if any(_writable(workdir / d) for d in case.readonly):
                notes.append("read-only folder writable")
        yield notes


def run_case(case: Case, workdir: Path, timeout: float | None = None, *,
             written: bool = False) -> Outcome:
    """The case in this process, from inside `workdir` (or its `cwd` folder), so that
    nothing lands elsewhere. `written`: its files are in `workdir` already
    (`materialize`)."""
    argv = resolve(case, workdir) if written else materialize(case, workdir)
    if case.timeout:
        timeout = min(timeout, case.timeout) if timeout else case.timeout
    cwd = os.getcwd()
    os.chdir(workdir / case.cwd)
    try:
        with _case_context(case, workdir) as notes:
            if case.stdio:
                o = run_argv_fd(argv, case.env, timeout, case.stdio, case.signal)
            else:
                o = run_argv(argv, case.env, timeout)
        o.notes = notes + o.notes
        return o
    finally:
        os.chdir(cwd)


_PROBLEM = re.compile(r"(?P<file>.+?):(?P<line>\d+):(?P<col>\d+): (?P<field>.+?): \S")
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u00ad\u2028\u2029\u202a-\u202e\u2066-\u2069"
                      "\U000e0000-\U000e007f]")
_SGR = re.compile(r"\x1b\[[0-9;]*m|\x1b\]8;[^\x1b\x07]*(?:\x1b\\|\x07)")


def _allowed(case: Case, o: Outcome) -> tuple[int, ...]:
    """The exit statuses this case may end with."""
    allowed = case.expect_exit if case.expect_exit is not None and not _unenforced(o) else EXIT_OK
    if case.signal:
        allowed = (*EXIT_OK, 128 + case.signal[0])
        if case.expect_exit is not None:
            allowed = (*case.expect_exit, 128 + case.signal[0])
    return allowed


def _unenforced(o: Outcome) -> bool:
    """A read-only folder this process could still write (root without capset): the
    refusal it should cause cannot be asked for."""
    return "read-only folder writable" in o.notes


def _shown(s: str) -> tuple[str, ...]:
    from kpool_cli.wording import visible

    return s, visible(s), _escaped(visible(s))


def judge(case: Case, o: Outcome, workdir: Path) -> list[tuple[str, str]]:
    """What is wrong with this outcome: (kind, detail) pairs, empty when it is right."""
    bad: list[tuple[str, str]] = []
    text = o.stdout + o.stderr + o.raw
    after = snapshot(workdir, resolve(case, workdir))
    bad += _changed_inputs(case, after)
    bad += _code_run(case, after)
    if o.code == "timeout":
        return [*bad, ("timeout", f"no exit after {o.seconds:.1f} s")]
    if o.code == "memory":
        return [*bad, ("memory", o.raw[-300:] or "over the memory limit")]
    if o.code == "crash":
        return [*bad, ("crash", o.raw[-300:])]
    if o.exc or "internal error" in o.stderr:
        kind = "memory" if "MemoryError" in (o.exc or "") + o.stderr else "internal error"
        if o.exc and "internal error" not in o.stderr:
            kind = "memory" if "MemoryError" in o.exc else "traceback"
        return [*bad, (kind, _last_line(o.exc or o.stderr) + "\n" + (o.exc or o.stderr)[-3000:])]
    if "Traceback (most recent call last)" in text:
        bad.append(("traceback", text[text.index("Traceback"):][:3000]))
    allowed = _allowed(case, o)
    if o.code not in allowed:
        if o.code in (0, 1) and case.expect_exit is not None and 2 in case.expect_exit:
            bad.append(("not refused", f"exit {o.code!r}, not {allowed}: "
                        + (o.stderr.strip() or o.stdout.strip())[:300]))
        else:
            bad.append(("bad exit status", f"exit {o.code!r}, not one of {allowed}: "
                        + o.stderr.strip()[:300]))
        if o.code not in (*EXIT_OK, 130, 141, 143):
            return bad
    err = o.stderr
    interrupted = bool(case.signal) and o.code == 128 + case.signal[0]
    # check writes its report on exit 2 too (the invalid traces are in it): to stdout
    # or to -o; validate lists the files on stdout
    reporting = case.argv[:1] in (["check"], ["validate"])
    if o.code == 2:
        usage = "Usage:" in err or err.startswith("Error:")
        said = err
        if reporting:
            said += o.stdout
            for n in case.outputs:
                with contextlib.suppress(OSError, IsADirectoryError):
                    said += (workdir / n).read_text(errors="replace")
        if not said.strip():
            bad.append(("message", "exit 2 with nothing on stderr"))
        elif case.under_test and not usage:
            paths = [str(workdir / n) for n in case.under_test]
            shown = [x for p in paths for x in _shown(p)]
            if not any(p in said for p in shown):
                bad.append(("message", "exit 2 without naming the input file: "
                            + err.strip()[:300]))
        if case.names and said.strip() and not _unenforced(o):
            shown = [x for n in case.names for x in _shown(n)]
            if not any(n in said for n in shown):
                bad.append(("message", f"exit 2 without naming {case.names[0]!r}: "
                            + said.strip()[:300]))
        for n in case.stdout_names:
            if not any(x in o.stdout for x in _shown(n)):
                bad.append(("message", f"exit 2 and {n} (beside the refused file) not "
                            f"checked: {o.stdout.strip()[:300]!r}"))
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
    bad += _raw_markers(case, o, workdir)
    if o.code in (0, 1) or interrupted:
        if case.json_stdout and (o.code in (0, 1) or o.stdout.strip()):
            try:
                doc = json.loads(o.stdout)
            except ValueError as e:
                bad.append(("bad json", f"stdout is not JSON: {e}: {o.stdout[:200]!r}"
                            f"...{o.stdout[-200:]!r}"))
            else:
                if interrupted and case.argv[0] == "replay":
                    last = doc[-1] if isinstance(doc, list) and doc else doc
                    status = last.get("summary", {}).get("status") if isinstance(
                        last, dict) else None
                    # several traces: a signal between two reports closes the array
                    # after the last whole report, which says how it ended
                    if status != "interrupted" and not isinstance(doc, list):
                        bad.append(("bad json", f"interrupted (exit {o.code}), yet the last "
                                    f"report's summary.status is {status!r}"))
        for n in case.json_files if o.code in (0, 1) else ():
            try:
                json.loads((workdir / n).read_text())
            except (OSError, ValueError) as e:
                bad.append(("bad json", f"{n}: {e}"))
    # exit 2 (or a signal) leaves no output file; no run leaves a temporary file
    failed = o.code not in (0, 1) and not (reporting and o.code == 2 and "INVALID" in said)
    left = []
    for rel, d in after.items():
        if rel in case.digests or rel.startswith("abs:") or d == "dir":
            continue
        if os.path.basename(rel).startswith("PROBE-"):
            continue  # _code_run's
        if failed or not _is_output(case, rel):
            left.append(rel)
    if left:
        bad.append(("output left", f"exit {o.code} left {sorted(left)[:5]}"))
    return bad


def _is_output(case: Case, rel: str) -> bool:
    return any(rel == n or rel.startswith(n.rstrip("/") + "/") for n in case.outputs)


def _changed_inputs(case: Case, after: dict[str, str]) -> list[tuple[str, str]]:
    """Inputs (every file that was there before, outputs the case names aside) that
    are not as they were."""
    changed = [f"{rel}: {d} -> {after.get(rel, 'missing')}" for rel, d in case.digests.items()
               if after.get(rel) != d and not _is_output(case, rel)]
    return [("input changed", "; ".join(changed)[:1000])] if changed else []


def _code_run(case: Case, after: dict[str, str]) -> list[tuple[str, str]]:
    """The probe module's markers: code of a plug-in that ran (or a module only data
    named, imported)."""
    marks = sorted(os.path.basename(r)[len("PROBE-"):] for r in after
                   if os.path.basename(r).startswith("PROBE-"))
    ran = [m for m in marks if m != "imported" or case.no_import]
    if not ran:
        return []
    return [("code run", ("imported " + PROBE + ", named only by data"
                          if ran == ["imported"] else "kpool ran the plug-in's "
                          + ", ".join(m for m in ran if m != "imported")))]


def _raw_markers(case: Case, o: Outcome, workdir: Path) -> list[tuple[str, str]]:
    """A marker (text with a line break inside) that reached a view as it is."""
    if not case.markers:
        return []
    views = [("stdout", o.stdout), ("stderr", o.stderr)]
    for n in case.text_files:
        with contextlib.suppress(OSError):
            views.append((n, (workdir / n).read_text(errors="replace")))
    for m in case.markers:
        raw = m[:4]  # "QQa" and the line break
        for name, s in views:
            i = s.find(raw)
            if i >= 0:
                return [("escape", f"{name} shows the line break {m[3]!r} raw: "
                         f"{s[max(0, i - 120):i + 40]!r}")]
    return []


def _escaped(s: str) -> str:
    """How a stream with errors="backslashreplace" writes `s` (a lone surrogate from a
    file name that is not UTF-8 becomes `\\udcff`)."""
    return s.encode("utf-8", "backslashreplace").decode("utf-8")


def _last_line(s: str) -> str:
    lines = [ln for ln in s.strip().splitlines() if ln.strip()]
    return lines[-1][:300] if lines else ""
