"""kpool at 80 columns: every view, table and help text fits, and nothing that must
stay whole is split across lines.

Each command runs on a real pseudo-terminal of 24x80 (a child forked with the pty
as its controlling terminal, COLUMNS unset, TERM=xterm), as a user at an 80-column
terminal sees it, and where it is cheap also piped with COLUMNS=80. What it wrote
is played on a small model of a terminal (`screen`: carriage returns, cursor moves
and erasures as rich uses them, so a progress bar that erased itself is gone), and
must have

- no row that ever reached past 80 cells (a terminal breaks it anywhere);
- no finding code, `KP001 x2` count, stale position (`seq 1 from pos 0`), token
  (`pos 4 seq 1`), repeated value (`0 x4`), file path, engine name or `kpool CMD`
  command split across a line break, and no word broken at its hyphen
  (`half-` / `open`, `cache-` / `safe`); in help texts no `code span` either;
- no word that the same command at 200 columns does not print (a word rich folded
  or cut with an ellipsis), for the commands run at both widths, and nothing cut with
  an ellipsis (`…`) at all;
- no sparkline broken across lines: `base ▂▅█  head ▂▃▃` stays on its line, its
  marks whole and with their label, and `per ubatch` (`most of each 2 ubatches`)
  in one piece;
- for `kpool explain CODE`, its one-line explanation and its `Example (under ...)`
  heading indented when they wrap.

`kpool diff` runs on every shipped trace and on traces whose names take more than a
third of the width (`LONG`) too, and its runs are also checked at 60 columns: the
same checks at that width, but for the words of 200 columns (its sparklines fold to
the width left, and say so). Not covered: the plain replay and diff views piped (one
line per ubatch or trace by design, for grep).
The commands run as concurrent children (JOBS at a time, no threads): about 30 s
on two idle cores. `test_the_checks_catch_what_they_are_for` shows each check
failing on the defect it is for.
"""

from __future__ import annotations

import fcntl
import itertools
import os
import pty
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from rich.cells import cell_len

from kpool_cli.gen.scenarios import SCENARIOS
from kpool_cli.verdict.codes import CODES
from kpool_cli.versions import VERSIONS
from kpool_cli.wording import SPARKS

ROOT = Path(__file__).resolve().parent.parent
TRACES = sorted((ROOT / "traces").glob("*.yaml"))
RACE = ROOT / "traces" / "shared-prefix-race.yaml"
GOOD_EXPECT = "- expect: {engine: cache-safe, findings: [KP001], n_new: 6}"
BAD_EXPECT = "- expect: {engine: cache-safe, findings: [], n_new: 5}"
BROKEN = "failing/shared-prefix-race-broken.yaml"  # relative to the scratch folder
# scratch traces whose summary labels take more than a third of 80 columns: one has
# no name (its path labels it), the other a long one; each fits 60 columns whole
LONG = {"long/shared-prefix-race-from-the-staging-server.yaml": (RACE, None),
        "long/seq-keep.yaml": (ROOT / "traces" / "seq-keep.yaml",
                               "seq-keep-after-the-server-restarted-its-two-slots")}

WIDTH = 80
WIDE = 200  # the width whose words a run at 80 columns is compared with
NARROW = 60  # `kpool diff` is also run at this width
TIMEOUT = 240.0  # seconds for every run together (a hang fails, never blocks)
JOBS = max(2, min(4, os.cpu_count() or 2))

ANSI = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)|[()][0-9A-Za-z]"
                  r"|[=>78DEHMc])")
BOX = "".join(chr(c) for c in range(0x2500, 0x25A0))  # box drawing, block elements
COMMANDS = ("replay", "diff", "check", "fuzz", "validate", "gen", "explain", "schema",
            "engines")

# split across " " (the parts of a multi-word unit on two lines) ...
SPACED = [re.compile(p) for p in (
    r"seq \d+ from pos \d+", r"KP\d{3} x\d+", r"pos \d+ seq \d+", r"\b\d+ x\d+\b",
    r"kpool (?:" + "|".join(COMMANDS) + r")\b", r"kpool explain KP\d{3}",
    r"per ubatch\b", r"most of each [\d,]+ ubatches")]
CODE_SPAN = re.compile(r"`[^`]+`")
# ... or inside a word (its two halves joined without a space)
CODE = re.compile(r"KP\d{3}")
WHOLE = sorted({*VERSIONS, *(str(p.relative_to(ROOT)) for p in
                             (ROOT / "traces").rglob("*.yaml")), BROKEN, *LONG,
                *(name for _, name in LONG.values() if name)}, key=len, reverse=True)
MARKS = f"[{SPARKS}]"
RULES = "".join(chr(c) for c in range(0x2500, 0x2580))  # box drawing, not the marks


@dataclass
class Run:
    key: str
    argv: tuple[str, ...]
    in_scratch: bool = False  # run in the scratch folder (its own files), not the repo
    piped: bool = False  # stdout a pipe with COLUMNS=80, not a terminal
    cols: int = WIDTH
    help: bool = False
    out: str = ""
    rc: int | None = None


def _runs() -> list[Run]:
    runs = [Run("help", ("--help",), help=True)]
    runs += [Run(f"{c} --help", (c, "--help"), help=True) for c in COMMANDS]
    runs += [Run(f"gen {s} --help", ("gen", s, "--help"), help=True) for s in SCENARIOS]
    runs += [Run(f"explain {c}", ("explain", c)) for c in CODES]
    runs += [Run("explain --list", ("explain", "--list")), Run("engines", ("engines",)),
             Run("validate", ("validate", "traces")),
             Run("check", ("check", "--no-config", "-j", "2", "traces")),
             Run("check failing", ("check", "--no-config", BROKEN), in_scratch=True),
             Run("diff", ("diff", "traces/shared-prefix-race.yaml",
                          "traces/coupled-rep-conflict.yaml")),
             Run("diff every trace", ("diff", *(str(p.relative_to(ROOT)) for p in TRACES))),
             Run("diff long names", ("diff", *LONG), in_scratch=True),
             # seeds 1..20 give 4 shrunk traces (`test_every_run_ran` wants 3), with the
             # widest cells 40 runs gave (`decode-coupled/shared`,
             # `KP001_decode-coupled_shared.yaml`): a table as wide, all 80 columns
             Run("fuzz", ("fuzz", "--engine", "cache-safe", "--runs", "20", "--seed", "1",
                          "-o", "fuzz"), in_scratch=True),
             # first seeds of 13 digits: the table cannot keep its file column
             Run("fuzz big seeds", ("fuzz", "--engine", "cache-safe", "--runs", "80",
                                    "--seed", str(10**12), "-o", "fuzz-big"), in_scratch=True)]
    # every shipped trace; the value backend (KP001 values, KP003) for those whose
    # findings need it, the model alone for the others (twice as fast)
    runs += [Run(f"replay {p.name}", ("replay", str(p.relative_to(ROOT)))
                 + (() if p.name in VALUES else ("--backend", "none"))) for p in TRACES]
    piped = [Run(r.key, r.argv, r.in_scratch, piped=True, help=r.help) for r in runs
             if r.help or r.key.startswith(("explain", "engines", "check", "validate",
                                            "fuzz big"))]
    # words at 200 columns, for the runs compared with them
    wide = [Run(r.key, r.argv, r.in_scratch, cols=WIDE) for r in runs if r.key in COMPARED]
    narrow = [Run(r.key, r.argv, r.in_scratch, cols=NARROW) for r in runs if r.key in DIFFS]
    return runs + piped + wide + narrow


VALUES = {"coupled-rep-conflict.yaml", "partial-copy.yaml", "shared-prefix-race.yaml",
          "seq-add-drift.yaml"}
DIFFS = {"diff", "diff every trace", "diff long names"}  # also run at NARROW columns
COMPARED = {"check", "check failing", "fuzz", *DIFFS, "explain KP001",
            "explain KP004", *(f"replay {n}" for n in (*VALUES, "seq-keep.yaml"))}
RUNS = _runs()
TOO_WIDE: dict[str, str] = {}  # run key -> why it is known not to fit (xfail)
FUZZ_FILES = ("fuzz files", False, 0)  # the key of the names the fuzz runs wrote


# -- running on terminals ----------------------------------------------------------------


def _environ(piped: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("COLUMNS", "LINES", "NO_COLOR", "FORCE_COLOR", "KPOOL_TRACEBACK")}
    env["TERM"] = "xterm"
    if piped:
        env["COLUMNS"] = str(WIDTH)
    return env


def _spawn(r: Run, cwd: Path) -> tuple[int, int]:
    """A child on a new pty (its controlling terminal) of 24 x r.cols; everything is
    prepared before the fork, so the child only sets the size, changes folder and
    execs."""
    argv = [sys.executable, "-m", "kpool_cli", *r.argv]
    env = _environ(False)
    size = struct.pack("HHHH", 24, r.cols, 0, 0)
    folder = str(cwd)
    pid, fd = pty.fork()
    if pid == 0:  # the child
        try:
            fcntl.ioctl(pty.STDOUT_FILENO, termios.TIOCSWINSZ, size)
            os.chdir(folder)
            os.execve(sys.executable, argv, env)
        finally:
            os._exit(127)
    return pid, fd


def _on_terminals(runs: list[Run], cwd_of) -> None:
    """Every run on its own terminal, JOBS at a time, read as they write."""
    pending = list(runs)
    active: dict[int, tuple[Run, int, bytearray]] = {}  # master fd -> run, pid, output
    deadline = time.monotonic() + TIMEOUT
    try:
        while pending or active:
            while pending and len(active) < JOBS:
                r = pending.pop(0)
                pid, fd = _spawn(r, cwd_of(r))
                active[fd] = (r, pid, bytearray())
            ready, _, _ = select.select(list(active), [], [], 1.0)
            for fd in ready:
                r, pid, buf = active[fd]
                try:
                    chunk = os.read(fd, 1 << 16)
                except OSError:  # EIO: every end of the terminal's child side closed
                    chunk = b""
                if chunk:
                    buf += chunk
                    continue
                os.close(fd)
                del active[fd]
                _, status = os.waitpid(pid, 0)
                r.rc = os.waitstatus_to_exitcode(status)
                r.out = bytes(buf).decode("utf-8", "replace")
            if time.monotonic() > deadline:
                pytest.fail(f"still running after {TIMEOUT:.0f} s: "
                            + ", ".join(r.key for r, _, _ in active.values()))
    finally:
        for fd, (_, pid, _) in active.items():
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            os.close(fd)


def _piped(runs: list[Run], cwd_of) -> None:
    procs = []
    for r in runs:
        if len(procs) >= JOBS:
            _finish(*procs.pop(0))
        procs.append((r, subprocess.Popen(
            [sys.executable, "-m", "kpool_cli", *r.argv], cwd=cwd_of(r), env=_environ(True),
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)))
    for rp in procs:
        _finish(*rp)


def _finish(r: Run, p: subprocess.Popen) -> None:
    out, _ = p.communicate(timeout=TIMEOUT)
    r.rc, r.out = p.returncode, out.decode("utf-8", "replace")


@pytest.fixture(scope="module")
def ran(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, bool, int], Run]:
    """Every run of RUNS, done once: {(key, piped, cols): run}."""
    scratch = tmp_path_factory.mktemp("columns")
    text = RACE.read_text()
    assert GOOD_EXPECT in text
    for kind in ("terminal", "piped", "wide"):  # a folder each: the same paths printed
        (scratch / kind / BROKEN).parent.mkdir(parents=True)
        (scratch / kind / BROKEN).write_text(text.replace(GOOD_EXPECT, BAD_EXPECT))
        for path, (source, name) in LONG.items():
            (scratch / kind / path).parent.mkdir(parents=True, exist_ok=True)
            named = re.sub(r"(?m)^name: .*\n", "" if name is None else f"name: {name}\n",
                           source.read_text())
            (scratch / kind / path).write_text(named)
    runs = [Run(r.key, r.argv, r.in_scratch, r.piped, r.cols, r.help) for r in RUNS]

    def cwd_of(r: Run) -> Path:
        if not r.in_scratch:
            return ROOT
        return scratch / ("piped" if r.piped else "wide" if r.cols != WIDTH else "terminal")

    _on_terminals([r for r in runs if not r.piped], cwd_of)
    _piped([r for r in runs if r.piped], cwd_of)
    got = {(r.key, r.piped, r.cols): r for r in runs}
    # the names of the files the fuzz runs wrote, which must stay whole
    got[FUZZ_FILES] = Run("fuzz files", (), out="\n".join(
        sorted({p.name for p in scratch.rglob("KP*.yaml")})))
    return got


# -- what a screen shows ---------------------------------------------------------------


CSI = re.compile(r"\x1b\[([0-?]*)[ -/]*([@-~])")


@dataclass
class Screen:
    """What a terminal shows once the output is written: its rows in the end (a
    progress bar that erased itself is gone), and every row that ever reached past
    column 80 (a terminal would have broken it anywhere). The cursor moves as rich
    moves it (CR, LF, cursor up/down/left/right/column, erase in line/display);
    colours, cursor visibility and other escapes change nothing shown. A row never
    wraps here: a row too long stays one row, to be seen."""

    rows: list[str]
    too_wide: list[str]


def screen(out: str, width: int = WIDTH) -> Screen:
    rows: list[list[str]] = [[]]
    too_wide: list[str] = []
    y = x = 0
    i, n = 0, len(out)
    while i < n:
        c = out[i]
        if c == "\x1b":
            m = CSI.match(out, i)
            if m is None:  # OSC (a hyperlink) or a two-character escape
                other = ANSI.match(out, i)
                i = other.end() if other else i + 1
                continue
            i = m.end()
            arg, op = m.group(1), m.group(2)
            k = int(arg) if arg.isdigit() else 0
            if op == "A":
                y = max(0, y - (k or 1))
            elif op == "B":
                y += k or 1
            elif op == "C":
                x += k or 1
            elif op == "D":
                x = max(0, x - (k or 1))
            elif op == "G":
                x = max(0, k - 1)
            elif op == "K":  # 0: to the end of the row, 1: to the cursor, 2: all of it
                row = rows[y]
                rows[y] = row[:x] if k == 0 else [" "] * (x + 1) + row[x + 1:] if k == 1 else []
            elif op == "J" and not arg.startswith("?"):
                rows[y] = rows[y][:x]
                del rows[y + 1:]
            while len(rows) <= y:
                rows.append([])
            continue
        i += 1
        if c == "\r":
            x = 0
        elif c == "\n":  # a terminal's output processing (onlcr) returns the carriage too
            x = 0
            y += 1
            while len(rows) <= y:
                rows.append([])
        elif c == "\b":
            x = max(0, x - 1)
        elif c == "\t":
            x = (x // 8 + 1) * 8
        elif c >= " " and c != "\x7f":
            row = rows[y]
            row.extend(" " * (x + 1 - len(row)))
            row[x] = c
            x += 1
            if cell_len("".join(row[:x])) == width + 1:
                too_wide.append("".join(row).rstrip())
    return Screen(["".join(r).rstrip() for r in rows], too_wide)


def shown(out: str) -> list[str]:
    """The rows of `out` on a terminal, in the end."""
    return screen(out).rows


def _bare(line: str) -> str:
    return line.strip(" " + BOX)


_TABLE_GAP = re.compile(" {3,}")  # between the columns of a table's row


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" " + BOX))


def _last_cell(line: str) -> int:
    """The screen column where the last cell of `line` starts: past its last gap of
    three spaces or more, or its indent."""
    body = line.rstrip(" " + BOX)
    gaps = list(_TABLE_GAP.finditer(body, _indent(body)))
    return gaps[-1].end() if gaps else _indent(body)


def _crossing(lines: list[str], sep: str, patterns, literals=()) -> list[str]:
    """Matches of `patterns` (and the `literals`) in the lines joined by `sep`
    (borders and indents stripped) that run across a line break. A break where the
    next line starts indented but left of the last cell of the line before (a rich
    table's next row, or a wrapped cell of one of its middle columns) is passed
    over: text does not read on from there (`kpool diff`'s `... from pos 0` in its
    head column, then `seq 1 pos 12` in its where column, is no `pos 0 seq 1`); a
    table's cells are their view's to test (tests/test_diff.py). A line at column 0
    always reads on: the terminal's own wrap of a line too long starts there."""
    parts = [_bare(line) for line in lines]
    bounds, at = [], 0
    for k, p in enumerate(parts):
        at += len(p)
        nxt = _indent(lines[k + 1]) if k + 1 < len(lines) else 0
        if nxt == 0 or nxt >= _last_cell(lines[k]):
            bounds.append(at)
        at += len(sep)
    flat = sep.join(parts)
    found = []
    for pat in patterns:
        for m in pat.finditer(flat):
            if any(m.start() < b < m.end() for b in bounds):
                found.append(m.group())
    for word in literals:
        start = flat.find(word)
        while start >= 0:
            if any(start < b < start + len(word) for b in bounds):
                found.append(word)
            start = flat.find(word, start + 1)
    return found


def problems(out: str, *, help_text: bool = False, whole: tuple[str, ...] = (),
             wide: str | None = None, width: int = WIDTH) -> list[str]:
    """What is wrong with `out` at `width` columns (empty: nothing)."""
    scr = screen(out, width)
    bad = [f"past column {width}: {row!r}" for row in scr.too_wide]
    final = scr.rows
    bad += [f"cut with an ellipsis: {row.strip()!r}" for row in final if "…" in row]
    for a, b in itertools.pairwise(final):
        if re.search(r"\w-$", _bare(a)) and re.match(r"\w", _bare(b)):
            bad.append(f"broken at a hyphen: {_bare(a)[-30:]!r} / {_bare(b)[:30]!r}")
        # a line ending in a sparkline's label or marks, the next going on with marks
        end, start = a.rstrip(" " + RULES), b.lstrip(" " + RULES)
        if re.search(rf"(?:\b(?:base|head)|{MARKS})$", end) and re.match(MARKS, start):
            bad.append(f"a sparkline broken across lines: {end[-30:]!r} / {start[:30]!r}")
    spaced = SPACED + ([CODE_SPAN] if help_text else [])
    bad += [f"split: {t!r}" for t in _crossing(final, " ", spaced)]
    bad += [f"split inside: {t!r}" for t in _crossing(final, "", [CODE], (*WHOLE, *whole))]
    if wide is not None:
        bad += [f"not a word at 200 columns: {w!r}" for w in sorted(words(final)
                                                                     - words(shown(wide)))]
    return bad


def unindented(out: str) -> list[str]:
    """`kpool explain CODE`: the lines of its one-line explanation (between the title
    and `What it does`) and the lines of its `Example (under ...)` heading after the
    first (up to the one ending with `)`) must be indented: a line wrapped there
    starts at the margin otherwise."""
    lines = shown(out)
    what = lines.index("What it does")
    bad = [f"not indented under the title: {line!r}" for line in lines[1:what]
           if line and not line.startswith("  ")]
    at = next(i for i, line in enumerate(lines) if line.startswith("Example (under"))
    while not lines[at].endswith(")"):
        at += 1
        if not lines[at].startswith("  "):
            bad.append(f"the Example heading continued at the margin: {lines[at]!r}")
    return bad


NUMERIC = re.compile("[-\\d.,:;()/x" + re.escape(BOX) + "]+")  # a number, a rule


def words(lines: list[str]) -> set[str]:
    """The words of `lines`, but numbers (timings, row labels, widths) and rules."""
    return {w for line in lines for w in line.split()
            if not NUMERIC.fullmatch(w)}


# -- the tests -------------------------------------------------------------------------


def _marks(r: Run) -> list:
    if r.key in TOO_WIDE:
        return [pytest.mark.xfail(strict=True, reason=TOO_WIDE[r.key])]
    return []


TERMINAL = [pytest.param(r, id=r.key, marks=_marks(r)) for r in RUNS
            if not r.piped and r.cols == WIDTH]
NARROWED = [pytest.param(r, id=r.key) for r in RUNS if r.cols == NARROW]
PIPED = [pytest.param(r, id=r.key) for r in RUNS if r.piped]


def _check(ran: dict, r: Run) -> None:
    got = ran[(r.key, r.piped, r.cols)]
    assert got.rc in (0, 1), f"kpool {' '.join(r.argv)}: exit {got.rc}\n{got.out[-2000:]}"
    assert "Traceback" not in got.out and "internal error" not in got.out, got.out[-2000:]
    assert len(shown(got.out)) > 2, got.out
    whole = tuple(ran[FUZZ_FILES].out.split()) if r.key.startswith("fuzz") else ()
    wide = ran.get((r.key, False, WIDE)) if r.cols == WIDTH and not r.piped else None
    bad = problems(got.out, help_text=r.help, whole=whole,
                   wide=wide.out if wide is not None else None, width=r.cols)
    if r.key.startswith("explain KP"):
        bad += unindented(got.out)
    assert not bad, (f"kpool {' '.join(r.argv)} at {r.cols} columns:\n  " + "\n  ".join(bad)
                     + "\n\n" + "\n".join(shown(got.out)))


@pytest.mark.parametrize("r", TERMINAL)
def test_on_a_terminal_of_80_columns(ran, r: Run) -> None:
    _check(ran, r)


@pytest.mark.parametrize("r", PIPED)
def test_piped_with_columns_80(ran, r: Run) -> None:
    _check(ran, r)


@pytest.mark.parametrize("r", NARROWED)
def test_diff_on_a_terminal_of_60_columns(ran, r: Run) -> None:
    _check(ran, r)


def test_every_run_ran(ran) -> None:
    """The fuzz runs found something to tabulate, the failing check failed, and the
    big seeds took the table's two-line form (its file under its finding)."""
    assert ran[FUZZ_FILES].out.count(".yaml") >= 3
    assert ran[("check failing", False, WIDTH)].rc == 1
    big = shown(ran[("fuzz big seeds", False, WIDTH)].out)
    assert any(re.fullmatch(r"\s+KP\d{3}_\S+\.yaml", line.rstrip()) for line in big)
    # the diff's summaries: every trace's name whole, in the trace column at 80
    # columns, on a line of its own at 60 (and for the long names, at 80 too); the
    # sparklines of the 15 ubatches of server-session unfolded at 80 columns
    for cols, alone in ((WIDTH, False), (NARROW, True)):
        lines = shown(ran[("diff every trace", False, cols)].out)
        for p in TRACES:
            name = p.stem
            assert any(line.split()[:1] == [name] and (len(line.split()) == 1) == alone
                       for line in lines), (cols, name)
        assert alone or any(re.search(rf"base {MARKS}{{15}}  head {MARKS}{{15}}", line)
                            for line in lines)
    for cols in (WIDTH, NARROW):
        lines = [line.strip() for line in shown(ran[("diff long names", False, cols)].out)]
        assert {*LONG} - {"long/seq-keep.yaml"} <= {*lines}
        assert LONG["long/seq-keep.yaml"][1] in lines


def test_bad_usage_wraps_between_words_on_a_terminal() -> None:
    """click's own refusals (a folder given to replay, a --format it does not take)
    were written as one long line, which the terminal broke inside words (`t` /
    `race files`): they wrap between words now, as kpool's own messages do, the lines
    after the first indented."""
    runs = [Run("replay a folder", ("replay", "traces")),
            Run("replay --format xml", ("replay", str(RACE.relative_to(ROOT)), "--format",
                                        "xml"))]
    _on_terminals(runs, lambda r: ROOT)
    for r in runs:
        assert r.rc == 2, r.out
        assert not problems(r.out), (r.key, problems(r.out), shown(r.out))
        error = [line for line in shown(r.out) if line.startswith("Error: ")]
        assert len(error) == 1, shown(r.out)
        after = shown(r.out)[shown(r.out).index(error[0]) + 1:]
        assert after and all(line.startswith("    ") for line in after if line.strip())


# -- the checks themselves -------------------------------------------------------------


def test_the_checks_catch_what_they_are_for() -> None:
    """A line too wide, a code or a stale position split, a hyphen break, a path
    split, and a folded word are each caught; a good screen passes."""
    assert problems("x" * 81)
    assert problems("PASS    traces/a.yaml under cache-safe: pinned KP0\n06 x2")
    assert problems("stale seq 0 from pos 0, seq\n     1 from pos 0")
    assert problems("│ pinned KP006 │\n│ x2 and more │")
    assert problems("Text: show ubatches A..B (half-\nopen; A.. to the end)")
    assert problems("in traces/shared-prefix-\nrace.yaml", whole=())
    assert problems("use `kpool replay\n--format json`", help_text=True)
    assert problems("KP001_decode-coupled_sha\nred.yaml",
                    whole=("KP001_decode-coupled_shared.yaml",))
    assert problems("a word folded", wide="a word") == ["not a word at 200 columns: 'folded'"]
    assert not problems("stale seq 0 from pos 0,\n     seq 1 from pos 0 · KP001 x2\n"
                        "traces/seq-keep.yaml under rep-once", wide="stale seq 0 from pos "
                        "0, seq 1 from pos 0 · KP001 x2 traces/seq-keep.yaml under rep-once")
    # a sparkline broken from its label, its marks folded, its note split, a cut name
    assert problems(" clear   pools marked   base ▄▆▆▆█▄▁  head\n"
                    "                        ▄▄▁▁▄▄▁  per ubatch")
    assert problems(" clear   pools marked   base ▄▆▆▆█▄▁▁▁▁\n"
                    "                        ▁▁▁  head ▄▄")
    assert problems(" clear   pools marked   base ▄▆▆▆█▄▁  head ▄▄▁▁▄▄▁  per\n"
                    "                        ubatch")
    assert problems(" speculative-no-roll…  same behaviour")
    assert problems("x" * 61, width=NARROW) and not problems("x" * 61)
    assert not problems(" clear\n   pools marked   base ▄▆▆▆█▄▁  head ▄▄▁▁▄▄▁  per ubatch\n"
                        "   cells scanned  base ▇█▂▂▂▇▂  head ▄▅▂▂▂▄▂\n"
                        "                    most of each 2 ubatches")
    # a table's row ends in its last column; the next row starts in its first
    table = " op 1      stale seq 0 from pos 0,   stale seq 1 from pos 0\n seq 1 pos 12"
    assert not problems(table)
    assert problems(table.replace("\n seq", "\nseq"))  # at column 0: the terminal's wrap


def test_the_terminal_is_a_real_one_of_80_columns() -> None:
    """The child's stdout is a terminal of 80 columns and no COLUMNS is set (what the
    runs above rely on)."""
    pid, fd = _spawn_probe()
    out = bytearray()
    while True:
        try:
            chunk = os.read(fd, 1024)
        except OSError:
            break
        if not chunk:
            break
        out += chunk
    os.waitpid(pid, 0)
    os.close(fd)
    assert out.decode().split() == ["True", "80", "None"]


def _spawn_probe() -> tuple[int, int]:
    code = ("import os, sys; print(sys.stdout.isatty(), os.get_terminal_size().columns, "
            "os.environ.get('COLUMNS'))")
    env = _environ(False)
    size = struct.pack("HHHH", 24, WIDTH, 0, 0)
    pid, fd = pty.fork()
    if pid == 0:
        try:
            fcntl.ioctl(pty.STDOUT_FILENO, termios.TIOCSWINSZ, size)
            os.execve(sys.executable, [sys.executable, "-c", code], env)
        finally:
            os._exit(127)
    return pid, fd
