"""The text views: the rich renderer on fixed-width consoles
(snapshots under tests/snapshots/, regenerate with KPOOL_UPDATE_SNAPSHOTS=1), the
navigation options, `kpool explain`, --svg/--html, and terminal manners (NO_COLOR,
--no-color, pipes, `| head`, the >200-ubatch default)."""

from __future__ import annotations

import doctest
import io
import json
import os
import pty
import re
import select as os_select
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from kpool_cli import wording as words
from kpool_cli.backend.store import make_backend
from kpool_cli.cli import cli
from kpool_cli.contracts.records import SEQ_EMPTY, SEQ_SHARED, CellMap, ExpectResult, UbatchRecord
from kpool_cli.contracts.tally import Tally, tallied
from kpool_cli.replay import planned_ubatches, replay
from kpool_cli.report import select as select_module
from kpool_cli.report.select import (
    AUTO_ONLY_FINDINGS,
    Selection,
    parse_ubatch_range,
    select,
)
from kpool_cli.report.terminal import Manners, Ticker, make_console
from kpool_cli.report.view import RichView, cell_map_lines, cells_per_line, print_explanation
from kpool_cli.trace.load import load_trace, load_trace_text
from kpool_cli.verdict.codes import CODES
from kpool_cli.verdict.explain import EXPLANATIONS, explain_text
from kpool_cli.versions import VERSIONS

ROOT = Path(__file__).resolve().parent.parent
TRACES = sorted((ROOT / "traces").glob("*.yaml"))
RACE = ROOT / "traces" / "shared-prefix-race.yaml"
SNAPSHOTS = Path(__file__).parent / "snapshots"
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def render(path: Path | str, engine: str, width: int, *, backend: str = "none",
           sel: Selection | None = None, pools_all: bool = False, trace=None) -> str:
    """The rich view of a replay on a plain console of `width` columns."""
    if trace is None:  # a path relative to the repository: snapshots do not depend on it
        path = Path(path)
        trace = load_trace_text(path.read_text(), str(path.relative_to(ROOT)))
    version = VERSIONS[engine]
    buf = io.StringIO()
    console = make_console(buf, Manners(False, False, width))
    sel = sel or Selection.of(trace)
    view = RichView(console, trace, version, None if backend == "none" else backend, sel,
                    pools_all)
    tally = Tally()
    records = tallied(replay(trace, version, make_backend(backend, trace),
                             pools_all=pools_all, cell_map=True), tally)
    view.start()
    for rec, shown in select(records, sel, trace):
        view.add(rec, shown)
    view.finish(tally)
    return buf.getvalue()


def kpool(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kpool_cli", *args], capture_output=True,
                          text=True, cwd=ROOT, env={**os.environ, **(env or {})})


def in_terminal(*args: str, env: dict | None = None, cols: int = 80) -> str:
    """`kpool ARGS` with stdout and stderr on a pseudo-terminal; everything it printed."""
    master, slave = pty.openpty()
    import fcntl
    import struct
    import termios
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, cols, 0, 0))
    environ = {k: v for k, v in os.environ.items()
               if k not in ("NO_COLOR", "FORCE_COLOR", "COLUMNS")}
    environ.update({"TERM": "xterm-256color", **(env or {})})
    proc = subprocess.Popen([sys.executable, "-m", "kpool_cli", *args], stdout=slave,
                            stderr=slave, stdin=subprocess.DEVNULL, cwd=ROOT, env=environ)
    os.close(slave)
    out = b""
    while True:
        ready, _, _ = os_select.select([master], [], [], 30)
        if not ready:
            break
        try:
            chunk = os.read(master, 65536)
        except OSError:
            break
        if not chunk:
            break
        out += chunk
    proc.wait(timeout=30)
    os.close(master)
    return out.decode("utf-8", "replace")


def long_trace(n: int, partial_copy_at_end: bool = True) -> str:
    """Two slots decoding side by side for `n` one-token ubatches; rep-once aborts at
    the end on a partial seq_cp (KP005), so only the last op has a finding."""
    ops = ["  - decode: {seq: 0, pos: 0..8}", "  - seq_cp: {src: 0, dst: 1}"]
    ops += [f"  - decode: {{tokens: [{{pos: {p}, seq: [0]}}, {{pos: {p}, seq: [1]}}]}}"
            for p in range(8, 8 + n)]
    if partial_copy_at_end:
        ops.append("  - seq_cp: {src: 0, dst: 1, p0: 2, p1: 4}")
    return ("kpool_trace: 1\nname: long\ncache: {kv_size: 1024, kpool: 4, n_seq_max: 2}\n"
            "ops:\n" + "\n".join(ops) + "\n")


# -- snapshots ---------------------------------------------------------------------------


def updating_snapshots() -> bool:
    """KPOOL_UPDATE_SNAPSHOTS=1: write the snapshots instead of comparing with them."""
    return os.environ.get("KPOOL_UPDATE_SNAPSHOTS", "") == "1"


def check_snapshot(name: str, text: str, snapshots: Path = SNAPSHOTS) -> None:
    """`text` must be snapshot `name`. A missing snapshot fails (a test that compares
    with nothing proves nothing); KPOOL_UPDATE_SNAPSHOTS=1 writes it (and rewrites
    every snapshot) instead."""
    assert not ANSI.search(text), "snapshots are plain text"
    text = "\n".join(line.rstrip() for line in text.splitlines()) + "\n"
    path = snapshots / f"{name}.txt"
    if updating_snapshots():
        path.parent.mkdir(exist_ok=True)
        path.write_text(text, encoding="utf-8")
        return
    if not path.exists():
        pytest.fail(f"no snapshot {path.relative_to(path.parent.parent)}: write it with "
                    "KPOOL_UPDATE_SNAPSHOTS=1, review it and commit it", pytrace=False)
    want = path.read_text(encoding="utf-8")
    assert text == want, (f"the view of {name} changed: review it and rerun with "
                          "KPOOL_UPDATE_SNAPSHOTS=1 if the change is intended")


SNAPSHOT_CASES = [
    ("shared-prefix-race", "cache-safe", 80),
    ("shared-prefix-race", "rep-once", 80),
    ("shared-prefix-race", "cache-safe", 200),
    ("coupled-rep-conflict", "rep-once", 80),
    ("non-unified", "rep-once", 80),
    ("rejected-decodes", "rep-once", 80),
    ("partial-copy", "cache-safe", 80),
]


@pytest.mark.parametrize(("trace", "engine", "width"), SNAPSHOT_CASES)
def test_snapshot(trace, engine, width):
    text = render(ROOT / "traces" / f"{trace}.yaml", engine, width)
    check_snapshot(f"{trace}.{engine}.{width}", text)


def test_a_missing_snapshot_fails_unless_asked_to_write_it(tmp_path, monkeypatch):
    monkeypatch.delenv("KPOOL_UPDATE_SNAPSHOTS", raising=False)
    with pytest.raises(pytest.fail.Exception, match=r"no snapshot .*KPOOL_UPDATE_SNAPSHOTS=1"):
        check_snapshot("nowhere.rep-once.80", "a view\n", tmp_path / "snapshots")
    assert not (tmp_path / "snapshots").exists()
    for value in ("0", "yes", ""):  # only an explicit 1 writes
        monkeypatch.setenv("KPOOL_UPDATE_SNAPSHOTS", value)
        with pytest.raises(pytest.fail.Exception):
            check_snapshot("nowhere.rep-once.80", "a view\n", tmp_path / "snapshots")
    monkeypatch.setenv("KPOOL_UPDATE_SNAPSHOTS", "1")
    check_snapshot("nowhere.rep-once.80", "a view  \n", tmp_path / "snapshots")
    assert (tmp_path / "snapshots" / "nowhere.rep-once.80.txt").read_text() == "a view\n"
    monkeypatch.delenv("KPOOL_UPDATE_SNAPSHOTS")
    check_snapshot("nowhere.rep-once.80", "a view\n", tmp_path / "snapshots")
    with pytest.raises(AssertionError, match="changed"):
        check_snapshot("nowhere.rep-once.80", "another view\n", tmp_path / "snapshots")


def test_every_snapshot_file_is_checked():
    """A snapshot no test compares with is stale (a renamed trace or case)."""
    used = {f"{t}.{e}.{w}.txt" for t, e, w in SNAPSHOT_CASES}
    assert {p.name for p in SNAPSHOTS.glob("*.txt")} == used


def test_the_race_view_shows_every_item():
    text = render(RACE, "cache-safe", 80)
    # trace header
    assert "shared-prefix-race" in text and "cache-safe" in text and "kv_size 64" in text
    # per ubatch: index, op, position in its batch, tokens by sequence with cells
    assert "ubatch 1 · op 3 decode · ubatch 0 of its batch · 2 tokens" in text
    assert "seq 0  pos 12  cells 12" in text and "seq 1  pos 12  cells 13" in text
    # stale positions
    assert "stale  seq 0 from pos 0, seq 1 from pos 0" in text
    # marked pools with rep rows, raced rows, padding
    assert re.search(r"1\s+2\s+8\.\.12\s+8\.\.12\s+11\s+x2 race", text)
    assert re.search(r"pad\s+-\s+-\s+0 x4\s+0\s+padding", text)
    # cell map: shared cells, sequences, rep row and flagged row markers
    assert "     0  MMMMMMMMMMMM01.. " in text
    assert "           !   !   !" in text and "           ^   ^   ^" in text
    # finding panel: code, name, rows, seqs, one line of why
    assert "KP001 scatter-race [error]" in text and "rows 3 7 11 · seqs 0 1" in text
    assert "why: set_rows splits entries" in text
    # summary
    assert re.search(r"ubatches\s+│ 3 · 20 tokens", text)
    assert re.search(r"KP001\s+│ 2 scatter-race", text) and "FAIL" in text


@pytest.mark.parametrize("engine", ["cache-safe", "rep-once"])
@pytest.mark.parametrize("trace", TRACES, ids=[t.stem for t in TRACES])
@pytest.mark.parametrize("width", [80, 200])
def test_every_trace_fits_the_width(trace, engine, width):
    text = render(trace, engine, width)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= width
    assert "summary · " in text and not ANSI.search(text)
    n = len([r for r in replay(load_trace(trace), VERSIONS[engine])
             if isinstance(r, UbatchRecord)])
    assert len(re.findall(r"^ubatch \d+ · ", text, re.M)) == n


def test_value_findings_render_kp003():
    text = render(ROOT / "traces" / "coupled-rep-conflict.yaml", "rep-once", 100,
                  backend="numpy")
    assert "KP003 stale-read [error]" in text and "tokens pos 4 seq 1" in text


# -- wording: one notation in every view -----------------------------------------------


def test_wording_examples_hold():
    result = doctest.testmod(words)
    assert result.attempted >= 8 and result.failed == 0


def test_a_units_code_name_and_a_sequences_repeated_position_stay_whole():
    """`wording.units` keeps every code with its name (each name is hyphenated) and a
    token run's repeated first position with its count: `seq 0,1 pos 12 x2`, not
    `seq 0,1 pos 12` then `x2`. A code and a word after it that is no name stay apart
    (`KP003 not compared`), as a code unknown here does from a label (`rows 3`)."""
    from kpool_cli.verdict.codes import CODES

    for c, code in CODES.items():
        assert words.units(f"fixed: {words.code(c, code.name)} rows 3")[1] == (
            f"{c} {code.name}")
    tokens = words.tokens([(5, (0,)), (5, (0,)), (5, (0,)), (6, (0,)), (12, (0, 1)),
                           (12, (0, 1))])
    assert words.units(tokens) == ["seq 0 pos 5 x3", "6;", "seq 0,1 pos 12 x2"]
    assert words.units("KP003 not compared; KP009 rows 3")[:2] == ["KP003", "not"]
    assert words.units("KP009 rows 3")[1] == "rows 3"


# one sequence decodes 12,000 tokens in one ubatch, a token a pool (kpool 1): 12,000
# pools, every one new, in a cache of 16384 cells
BIG = ("kpool_trace: 1\nname: big\n"
       "cache: {kv_size: 16384, kpool: 1, n_seq_max: 1, n_ubatch: 12000}\n"
       "ops:\n  - decode: {seq: 0, pos: 0..12000}\n")


def test_counts_are_grouped_from_10_000_and_places_never():
    """`wording.count`: a count of 10,000 or more is grouped by thousands, a smaller
    one is not; a position, a cell or row, an index and a cache setting never are (they
    are read against the trace). In the plain view and the rich one alike: 12,000
    tokens and pools, `pos 0..12000`, `kv_size 16384`, the empty cells from row 12032
    (12000 rounded up to the map's 64 cells a line) folded as 68 lines (4352 cells / 64)."""
    assert [words.count(n) for n in (0, 9999, 10_000, 1_048_576, -12_345)] == \
        ["0", "9999", "10,000", "1,048,576", "-12,345"]
    assert words.code_count("KP001", 12_000) == "KP001 x12,000"
    trace = load_trace_text(BIG, "big.yaml")
    from kpool_cli.report.plain import write_plain

    buf = io.StringIO()
    tally = Tally()
    write_plain(buf, trace, "rep-once", tallied(replay(trace, VERSIONS["rep-once"]), tally),
                tally)
    plain = buf.getvalue()
    assert "kv_size 16384," in plain
    assert "seq 0 pos 0..12000: n_new 12,000/" in plain and "of 12,000 pools [0:0..12000]" \
        in plain
    assert "  pools marked (per ubatch): 12,000\n" in plain
    assert "summary: 1 ubatch, 12,000 pools marked (1.0 per token)" in plain
    rich = render("big.yaml", "rep-once", 80, trace=trace)
    assert "kv_size 16384 ·" in rich and "12,000 tokens" in rich
    assert "pools  12,000 marked of 12,000 ·" in rich
    assert " 12032  ... 68 lines of empty cells (rows 12032..16384) ..." in rich
    assert "max 12,000 at ubatch 0" in rich and "12,000 (1.0 per token)" in rich
    # ENGINE.md §6: n_new_g = min(12000 / 1 + 1 sequence, pad(12000) - 1 = 12031, 16384)
    # = 12,001, one padding entry; the pool table shows the first 7 of its 12,001
    # entries and the last 2, the 11,992 between folded; the last pool's number,
    # position, member and rep row bare
    assert "12,001 scatter entries (1 padding)" in rich and "... 11,992 more" in " ".join(
        rich.split())
    assert re.search(r"\b0 +11999 +11999 +11999 +11999\b", rich)


def test_the_counts_wording_itself_writes_follow_its_rule():
    """`per_bin`'s ubatches a mark stands for (the pages said `a point is the largest
    of 16,384`, the views `most of each 16384 ubatches` of the same fold) and
    `visible`'s characters cut are counts too: grouped from 10,000 on, bare below."""
    assert words.per_bin(16_384) == "most of each 16,384 ubatches"
    assert words.per_bin(4096) == "most of each 4096 ubatches"
    cut = words.visible("x" * (2 * words.SHOWN_END + 5000))
    assert " ... (5000 characters cut) ... " in cut
    cut = words.visible("x" * (2 * words.SHOWN_END + 12_345))
    assert " ... (12,345 characters cut) ... " in cut


def test_an_engine_message_writes_its_settings_as_the_trace_does():
    """KP005 for a decode of 2048 tokens past `n_batch: 1024` said `a batch of 2,048
    tokens, more than n_batch (1,024, cache.n_batch)` under a cache line that says
    `n_batch 1024`: a setting is never grouped, and 2048 tokens are a count below
    10,000."""
    text = ("kpool_trace: 1\ncache: {kv_size: 4096, kpool: 4, n_batch: 1024}\n"
            "ops:\n  - decode: {seq: 0, pos: 0..2048}\n")
    rich = " ".join(render("nb.yaml", "rep-once", 200,
                           trace=load_trace_text(text, "nb.yaml")).split())
    assert "n_batch 1024 ·" in rich
    assert ("GGML_ASSERT(n_tokens_all <= cparams.n_batch): a batch of 2048 tokens, more "
            "than n_batch (1024, cache.n_batch): llama_decode aborts") in rich


def test_the_summary_sparklines_fold_to_the_width_the_box_leaves():
    """60 ubatches (the prompt, then 59 one-token decodes) at 50 columns: the summary's
    box leaves 50 - 7 - 14 (`scanned/ubatch`) = 29 marks a line, so each sparkline
    folds 60 -> 30 -> 15 bins of 4 ubatches, on one line; 30 marks would not fit
    (rich then broke the sparkline onto two lines). At 80 columns 59 marks fit: 60
    become 30 of 2."""
    trace = load_trace_text(long_trace(59, partial_copy_at_end=False), "long.yaml")
    for width, marks, per in ((50, 15, "most of each 4 ubatches"),
                              (80, 30, "most of each 2 ubatches")):
        lines = render("long.yaml", "rep-once", width, trace=trace).splitlines()
        for label in ("marked/ubatch", "scanned/ubatch"):
            at = next(i for i, line in enumerate(lines) if f"│ {label} " in line)
            cell = lines[at].split("│")[2].strip()
            assert len(cell) == marks and set(cell) <= set(words.SPARKS), (width, lines[at])
            assert lines[at + 1].split("│")[2].strip().startswith(per)


def test_ranges_are_half_open_and_lists_fold_into_them():
    assert (words.span(4, 8), words.span(7, 8), words.span(3, None)) == ("4..8", "7", "3..")
    assert words.folded([0, 1, 2]) == "0..3"  # three in a row: the end is left out
    assert words.folded([0, 1]) == "0 1"  # two stay apart
    assert words.folded([5, 5]) == "5 x2" and words.folded([3] * 6) == "3 x6"
    assert words.folded([3, 7, 11, 3, 7, 11]) == "3 7 11 3 7 11"  # order kept
    assert words.folded(range(100), limit=1) == "0..100"
    assert words.folded([0, 2, 4, 6], limit=2) == "0 2 ... (4)"
    assert words.folded([]) == "none"


def test_a_limited_fold_reads_a_prefix_and_says_what_the_whole_fold_would():
    """`folded` with a limit folds a prefix (64 values, then 4x more while it holds
    too few parts): the parts it shows are the whole array's. By hand: 200 rows
    every 4 (each one alone), limit 8: the first 8, then the count. A run that
    crosses the first prefix (0..100 then 7 x5): one range. A repeat across it:
    5 x70. Random lists of short runs and repeats: the same as folding the whole
    array (`_parts` on all of it) and cutting at the limit."""
    assert words.folded(np.arange(3, 800, 4), limit=8) == "3 7 11 15 19 23 27 31 ... (200)"
    assert words.folded([*range(100), *[7] * 5], limit=1) == "0..100 ... (105)"
    assert words.folded([*range(100), *[7] * 5], limit=2) == "0..100 7 x5"
    assert words.folded([5] * 70 + [1], limit=1) == "5 x70 ... (71)"
    rng = np.random.default_rng(0)
    for _ in range(300):
        pieces = [rng.integers(0, 50, 1).repeat(rng.integers(1, 4)) if rng.random() < 0.3
                  else rng.integers(0, 9) + np.arange(rng.integers(1, 140))
                  for _ in range(rng.integers(0, 12))]
        vals = np.concatenate(pieces) if pieces else np.empty(0, dtype=np.int64)
        limit = int(rng.integers(1, 10))
        want = words._limited(words._parts(vals, None), limit, vals.size) or words.NONE
        assert words.folded(vals, limit=limit) == want, (vals.tolist(), limit)


def test_pools_stale_positions_tokens_and_codes_have_one_form():
    assert words.pools([(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]) == "0:0..3 1:0..3"
    assert words.pools([(0, 1), (0, 2), (1, 3)]) == "0:1 0:2 1:3"
    assert words.pools([(0, 2), (1, 3), (1, 4), (1, 5)]) == "0:2 1:3..6"  # one sequence a run
    assert words.pools([*((0, k) for k in range(5)), (2, 0), (3, 0)], limit=2) \
        == "0:0..5 2:0 ... (7)"
    assert words.pools([]) == "none"
    assert words.stale({1: 0, 0: 12}) == "seq 0 from pos 12, seq 1 from pos 0"  # by seq
    assert words.stale([(2, 4)]) == "seq 2 from pos 4" and words.stale({}) == "none"
    assert words.tokens([(12, (0,)), (12, (1,)), (13, (0,)), (14, (0,)), (15, (0,))]) \
        == "seq 0 pos 12..16; seq 1 pos 12"
    assert words.tokens([(3, (0, 1))] * 6) == "seq 0,1 pos 3 x6"  # M-RoPE: one position
    assert words.code("KP001", "scatter-race") == "KP001 scatter-race"
    assert words.code("KP042") == "KP042"


def test_the_plain_view_words_as_the_rich_view_does():
    """shared-prefix-race under cache-safe: seq_cp (op 1) stales both slots from pos 0;
    ubatch 2 decodes pos 13, 14, 15 of both into the cells after ubatch 1's 12 and 13
    (seq 0 in 14..17, seq 1 in 17..20) and re-pools every pool of each (four a slot)
    into rep rows 3 7 11 16 and 3 7 11 19."""
    r = CliRunner().invoke(cli, ["replay", str(RACE), "--engine", "cache-safe",
                                 "--backend", "none"])
    lines = r.stdout.splitlines()
    assert "  op 1 seq_cp applied (stale seq 0 from pos 0, seq 1 from pos 0)" in lines
    assert ("  ubatch 2 (op 6.0) seq 0 pos 13..16; seq 1 pos 13..16: n_new 8/8 of 8 pools "
            "[0:0..4 1:0..4] rows 3 7 11 16 3 7 11 19") in lines
    rich = render(RACE, "cache-safe", 200)
    assert "stale  seq 0 from pos 0, seq 1 from pos 0" in rich
    assert "seq 0  pos 13..16  cells 14..17" in rich
    assert "rows 3 7 11 · seqs 0 1 · pools 0:0..3 1:0..3" in rich


# -- the cell map ----------------------------------------------------------------------


def test_cell_map_of_a_large_cache_folds_to_a_few_lines():
    n = 131072
    seq = np.full(n, SEQ_EMPTY, dtype=np.int16)
    seq[:70000] = 0
    seq[:64] = SEQ_SHARED
    seq[70000:70010] = 37  # beyond z: '#'
    cm = CellMap(n, seq, np.arange(3, 70000, 4))
    lines = [t.plain for t in cell_map_lines(cm, 80)]
    assert len(lines) <= 12, lines
    assert all(len(line) <= 80 for line in lines)
    assert lines[0].startswith("     0  MMMMMMMMMMMMMMMM")
    assert any("more lines like it" in line for line in lines)
    assert any("lines of empty cells (rows" in line and "..131072)" in line for line in lines)
    assert any("##########" in line for line in lines)


def folded_by_hand(cm: CellMap, width: int, flagged: set[int], written: set[int]) -> list[str]:
    """The cell map's lines as plain text, the slow and obvious way: per line of
    `per` cells a key (its characters and marks from its first row on, and whether a
    row of it was written), a run while the next key equals it (a written line alone)."""
    n_rows, kv = cm.seq.size, cm.kv_size
    per = cells_per_line(width, kv)
    glyph = {SEQ_EMPTY: ".", SEQ_SHARED: "M"}
    chars = "".join(glyph.get(c) or ("0123456789abcdefghijklmnopqrstuvwxyz"[c] if c < 36
                                     else "#") for c in cm.seq.tolist())
    marks = [" "] * n_rows
    for r in cm.rep_rows.tolist():
        marks[r] = "^"
    for r in flagged:
        marks[r] = "!"
    mark_text = "".join(marks)

    def strip(a: int, b: int) -> list[str]:
        groups = range(a, b, 16)
        line = f"{a:>6}  " + " ".join(chars[g:min(g + 16, b)] for g in groups)
        under = " " * 8 + " ".join(mark_text[g:min(g + 16, b)] for g in groups)
        return [line, under] if under.strip() else [line]

    out = []
    for strm in range(n_rows // kv):
        base = strm * kv
        if n_rows > kv:
            out.append(f"stream {strm} (rows {words.span(base, base + kv)})")
        starts = list(range(base, base + kv, per))
        keys = [(chars[a:a + per], mark_text[a:a + per],
                 any(a <= r < a + per for r in written)) for a in starts]
        i = 0
        while i < len(starts):
            j = i
            while j + 1 < len(starts) and keys[j + 1] == keys[i] and not keys[i][2]:
                j += 1
            a, n_same = starts[i], j - i + 1
            end = min(starts[j] + per, base + kv)
            if n_same >= 2 and set(keys[i][0]) == {"."} and not keys[i][1].strip():
                out.append(f"{a:>6}  ... {n_same} lines of empty cells "
                           f"(rows {words.span(a, end)}) ...")
            else:
                out += strip(a, min(a + per, base + kv))
                if n_same >= 3:
                    out.append(f"{'':>6}  ... {n_same - 1} more lines like it "
                               f"(rows {words.span(a + per, end)}) ...")
                elif n_same == 2:
                    out += strip(a + per, min(a + 2 * per, end))
            i = j + 1
    return out


@pytest.mark.parametrize("n_stream", [1, 4])
def test_cell_map_folds_runs_of_a_large_cache_as_by_hand(n_stream):
    # 1,048,576 rows, a few live ones: runs of empty lines, runs of equal lines (of
    # different ids past z, all '#'), pairs of equal lines, a line a write sets apart,
    # marks, a line at the very end; 4 streams: a stream's last line is short
    n = 1 << 20
    kv = n // n_stream - (0 if n_stream == 1 else 1000)
    seq = np.full(n_stream * kv, SEQ_EMPTY, dtype=np.int16)
    seq[:20] = 0
    seq[64:70] = SEQ_SHARED
    seq[200_000:200_192] = np.repeat([37, 38, 39], 64)  # three lines of '#'
    seq[700_032:700_032 + 64 * 7] = 1  # seven lines of seq 1: a rep row in the first, a
    # write in the fourth
    seq[800_000:800_128] = 2  # two lines of seq 2, a flagged row in each
    seq[-5:] = 3
    cm = CellMap(kv, seq, np.array([3, 7, 700_035, n_stream * kv - 1]))
    flagged, written = {7, 800_001, 800_065}, np.array([0, 1, 700_032 + 64 * 3 + 5])
    lines = {width: [t.plain for t in cell_map_lines(cm, width, flagged, written)]
             for width in (80, 200)}
    for width, got in lines.items():
        assert got == folded_by_hand(cm, width, flagged, set(written.tolist()))
    if n_stream == 1:  # and by hand: 64 cells a line at 80 columns
        ones, twos = " ".join(["1" * 16] * 4), " ".join(["2" * 16] * 4)
        marked = " " * 8 + " !" + " " * 14 + " " * 51
        assert lines[80][3:] == [
            "   128  ... 3123 lines of empty cells (rows 128..200000) ...",
            "200000  " + " ".join(["#" * 16] * 4),
            "        ... 2 more lines like it (rows 200064..200192) ...",
            "200192  ... 7810 lines of empty cells (rows 200192..700032) ...",
            f"700032  {ones}", " " * 11 + "^" + " " * 63,  # the mark: alone
            f"700096  {ones}", f"700160  {ones}",  # a pair: both drawn
            f"700224  {ones}",  # the write: alone
            f"700288  {ones}",
            "        ... 2 more lines like it (rows 700352..700480) ...",
            "700480  ... 1555 lines of empty cells (rows 700480..800000) ...",
            f"800000  {twos}", marked, f"800064  {twos}", marked,
            "800128  ... 3881 lines of empty cells (rows 800128..1048512) ...",
            "1048512  " + " ".join(["." * 16] * 3) + " " + "." * 11 + "33333",
            " " * 74 + "^"]  # under the last cell, were the label 6 digits wide


def test_cell_map_matches_the_cache(engine):
    # ENGINE.md §2: one char per cell; unified: a shared prompt is 'M'
    recs = [r for r in replay(load_trace(RACE), VERSIONS[engine], cell_map=True)
            if isinstance(r, UbatchRecord)]
    cm = recs[1].cell_map
    assert cm is not None and cm.seq.size == 64
    assert (cm.seq[:12] == SEQ_SHARED).all() and cm.seq[12] == 0 and cm.seq[13] == 1
    assert (cm.seq[14:] == SEQ_EMPTY).all()
    assert cm.rep_rows.tolist() == [3, 7, 11]
    assert all(r.cell_map is None for r in replay(load_trace(RACE), VERSIONS[engine])
               if isinstance(r, UbatchRecord))


# -- navigation ------------------------------------------------------------------------


def shown_ubatches(path, engine: str, sel: Selection) -> list[int]:
    trace = load_trace(path)
    return [r.index for r, shown in select(replay(trace, VERSIONS[engine]), sel, trace)
            if shown and isinstance(r, UbatchRecord)]


def test_parse_ubatch_range():
    assert parse_ubatch_range("4") == (4, 5)
    assert parse_ubatch_range("2..5") == (2, 5)
    assert parse_ubatch_range("2..")[0] == 2
    for bad in ("x", "5..2", "-1", "1..1"):
        with pytest.raises(ValueError):
            parse_ubatch_range(bad)


def test_navigation_selects_exactly_the_requested_ubatches():
    pd = ROOT / "traces" / "prefill-decode.yaml"  # 11 ubatches
    assert shown_ubatches(pd, "rep-once", Selection(ubatches=((4, 5),))) == [4]
    assert shown_ubatches(pd, "rep-once", Selection(ubatches=((2, 5), (9, 1 << 62)))) \
        == [2, 3, 4, 9, 10]
    state = ROOT / "traces" / "state-restore.yaml"
    assert shown_ubatches(state, "rep-once", Selection(seqs=frozenset({2}))) == [1, 2, 3]
    assert shown_ubatches(state, "rep-once", Selection(seqs=frozenset({0}))) == [0]
    assert shown_ubatches(RACE, "cache-safe", Selection(only_findings=True)) == [1, 2]
    assert shown_ubatches(RACE, "rep-once", Selection(only_findings=True)) == []


def test_select_yields_every_record_once_in_order():
    trace = load_trace(RACE)
    recs = list(replay(trace, VERSIONS["cache-safe"]))
    for sel in (Selection(), Selection(ubatches=((1, 2),)), Selection(only_findings=True),
                Selection(seqs=frozenset({1}))):
        out = [r for r, _ in select(iter(recs), sel, trace)]
        assert out == recs


def test_events_between_shown_ubatches_only():
    trace = load_trace(RACE)
    pairs = list(select(replay(trace, VERSIONS["rep-once"]), Selection(ubatches=((0, 2),)),
                        trace))
    kinds = [(type(r).__name__, getattr(r, "kind", ""), s) for r, s in pairs]
    assert ("OpEvent", "seq_cp", True) in kinds and ("OpEvent", "note", True) in kinds
    # the expectations after ubatch 2 (not shown) are not shown
    assert [s for r, s in pairs if isinstance(r, ExpectResult)] == [True, False]


def test_cli_navigation_in_the_plain_view():
    r = CliRunner().invoke(cli, ["replay", str(ROOT / "traces" / "prefill-decode.yaml"),
                                 "--ubatch", "3..5", "--backend", "none"])
    assert re.findall(r"^  ubatch (\d+) ", r.stdout, re.M) == ["3", "4"]
    assert "(showing ubatches 3..5)" in r.stdout and "11 ubatches (2 shown)" in r.stdout
    r = CliRunner().invoke(cli, ["replay", str(RACE), "--engine", "cache-safe", "--seq", "1",
                                 "--only-findings", "--backend", "none"])
    assert re.findall(r"^  ubatch (\d+) ", r.stdout, re.M) == ["1", "2"]
    r = CliRunner().invoke(cli, ["replay", str(RACE), "--ubatch", "nope"])
    assert r.exit_code == 2 and "--ubatch" in r.stderr


def test_a_selection_past_the_replay_says_so_beside_the_count_shown():
    """`--ubatch 120` of a 15-ubatch trace showed nothing and said only `(0 shown)`, as
    `--seq 9` did in a cache of 2 sequences: the summary now says which of the
    selection no record could match. prefill-decode runs 11 ubatches (0..10) in a
    cache of n_seq_max 1."""
    pd = str(ROOT / "traces" / "prefill-decode.yaml")
    r = CliRunner().invoke(cli, ["replay", pd, "--ubatch", "20", "--backend", "none"])
    assert "11 ubatches (0 shown: ubatch 20 is past the last, 10)" in r.stdout
    r = CliRunner().invoke(cli, ["replay", pd, "--ubatch", "9..", "--ubatch", "11..13",
                                 "--seq", "0", "--seq", "3", "--seq", "1",
                                 "--backend", "none"])
    assert ("11 ubatches (2 shown: ubatches 11..13 are past the last, 10; seqs 1, 3 are past "
            "the last, 0 (n_seq_max 1))") in r.stdout
    r = CliRunner().invoke(cli, ["replay", pd, "--ubatch", "3..5", "--backend", "none"])
    assert "11 ubatches (2 shown)," in r.stdout
    view = CliRunner().invoke(cli, ["replay", pd, "--ubatch", "3..", "--ubatch", "40",
                                    "--backend", "none", "--color"],
                              env={"COLUMNS": "200"})
    assert "11 (8 shown: ubatch 40 is past the last, 10)" in view.stdout
    assert Selection(seqs=frozenset({0})).unmatched(0, 1) == ""
    assert (Selection(ubatches=((40, 41), (40, 41), (30, 31))).unmatched(11, 1)
            == "ubatches 30, 40 are past the last, 10")
    assert (Selection(ubatches=((0, 1),)).unmatched(0, 1)
            == "ubatch 0 is past the replay's, which ran none")
    assert doctest.testmod(select_module).failed == 0


def test_more_than_200_ubatches_defaults_to_only_findings(tmp_path):
    text = long_trace(AUTO_ONLY_FINDINGS + 10)
    trace = load_trace_text(text)
    assert planned_ubatches(trace) == AUTO_ONLY_FINDINGS + 11
    sel = Selection.of(trace)
    assert sel.only_findings and sel.auto
    assert not Selection.of(trace, only_findings=False).only_findings
    assert not Selection.of(trace, ubatches=((0, 3),)).only_findings
    assert not Selection.of(load_trace_text(long_trace(10))).only_findings
    view = render(None, "rep-once", 80, trace=trace)
    assert "the default past 200 ubatches" in view
    assert "KP005 engine-abort" in view and not re.search(r"^ubatch \d+ ", view, re.M)
    path = tmp_path / "long.yaml"
    path.write_text(text)
    r = CliRunner().invoke(cli, ["replay", str(path), "--backend", "none"])
    assert "the default past 200 ubatches" in r.stdout
    assert "op 212 seq_cp aborted" in r.stdout and "  ubatch " not in r.stdout
    r = CliRunner().invoke(cli, ["replay", str(path), "--backend", "none", "--all-ubatches"])
    assert len(re.findall(r"^  ubatch ", r.stdout, re.M)) == AUTO_ONLY_FINDINGS + 11


def test_repeated_findings_fold_under_only_findings():
    trace = load_trace_text(long_trace(30, partial_copy_at_end=False))
    text = render(None, "cache-safe", 80, trace=trace, sel=Selection(only_findings=True))
    assert re.findall(r"^ubatch (\d+) ", text, re.M) == ["1"]  # the first race, in full
    assert "29 more ubatches (2..31) with the same KP001" in text


# -- explain ---------------------------------------------------------------------------


def test_every_code_is_explained():
    assert set(EXPLANATIONS) == set(CODES)


@pytest.mark.parametrize("code", sorted(EXPLANATIONS))
def test_explain_text_has_the_ruff_headings(code):
    text = explain_text(code)
    for head in ("What it does", "Why is this bad?", "Example (under ",
                 "How to fix the engine"):
        assert head in text
    r = CliRunner().invoke(cli, ["explain", code.lower()])
    assert r.exit_code == 0 and r.stdout == text
    buf = io.StringIO()
    print_explanation(make_console(buf, Manners(False, False, 80)), EXPLANATIONS[code])
    assert "How to fix the engine" in buf.getvalue()
    assert max(len(x) for x in buf.getvalue().splitlines()) <= 80


@pytest.mark.parametrize("code", sorted(c for c, e in EXPLANATIONS.items() if e.replaces))
def test_a_plugin_example_runs_as_explain_shows_it(code, tmp_path):
    """An example under a plug-in engine (KP004's: padding on row 0) gives the module
    to write beside example.yaml and the command: written and run as shown (the
    command's `PYTHONPATH=.` as the environment), it raises the code. It named the
    README's own `mypkg.myengine:Version`, another engine, and no module (a
    newcomer's walk of 7 December)."""
    text = explain_text(code)
    e = EXPLANATIONS[code]
    (tmp_path / "example.yaml").write_text(e.example)
    (tmp_path / "example_engine.py").write_text(e.plugin_module)
    assert textwrap.indent(e.plugin_module, "    ").rstrip("\n") in text
    env_word, *argv = e.command.split()
    assert env_word == "PYTHONPATH=." and argv[:2] == ["kpool", "replay"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([".", os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, "-m", "kpool_cli", *argv[1:], "--format", "json"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    report = json.loads(r.stdout)
    assert code in report["summary"]["findings"], r.stderr


def test_explain_list_and_errors():
    r = CliRunner().invoke(cli, ["explain", "--list"])
    assert r.exit_code == 0 and all(c in r.stdout for c in CODES)
    assert CliRunner().invoke(cli, ["explain", "scatter-race"]).stdout.startswith("KP001")
    assert CliRunner().invoke(cli, ["explain", "KP999"]).exit_code == 2
    assert CliRunner().invoke(cli, ["explain"]).exit_code == 2


# -- files -----------------------------------------------------------------------------


def test_svg_and_html_are_written_with_the_race_rows(tmp_path):
    svg, html = tmp_path / "race.svg", tmp_path / "race.html"
    r = kpool("replay", str(RACE), "--engine", "cache-safe", "--svg", str(svg),
              "--html", str(html))
    assert r.returncode == 1
    assert r.stdout.startswith("trace ")  # piped: the plain view, as always
    s = svg.read_text().replace("&#160;", " ")
    assert s.startswith("<svg") and "KP001" in s and "3 7 11" in s and "x2 race" in s
    h = html.read_text()
    assert "<html" in h and "3 7 11" in h and "x2 race" in h
    assert not list(tmp_path.glob(".*.tmp"))


def test_html_with_json_is_refused(tmp_path):
    r = CliRunner().invoke(cli, ["replay", str(RACE), "--format", "json", "--svg",
                                 str(tmp_path / "x.svg")])
    assert r.exit_code == 2 and not (tmp_path / "x.svg").exists()


# -- terminal manners ------------------------------------------------------------------


def test_piped_output_is_plain_text():
    r = kpool("replay", str(RACE), "--engine", "cache-safe")
    assert r.returncode == 1 and not ANSI.search(r.stdout) and not ANSI.search(r.stderr)
    assert r.stdout.startswith("trace ") and "╭" not in r.stdout


def test_a_terminal_gets_the_rich_view_in_colour():
    out = in_terminal("replay", str(RACE), "--engine", "cache-safe", "--backend", "none")
    assert "\x1b[" in out and "findings · ubatch 1" in out


@pytest.mark.parametrize(("args", "env"), [((), {"NO_COLOR": "1"}), (("--no-color",), {})])
def test_no_color_and_dash_dash_no_color(args, env):
    out = in_terminal("replay", str(RACE), "--engine", "cache-safe", "--backend", "none",
                      *args, env=env)
    assert "findings · ubatch 1" in out and "MMMMMMMMMMMM01" in out  # still the rich view
    assert not ANSI.search(out)
    assert max(len(x) for x in out.replace("\r", "").splitlines()) <= 80


def test_head_exits_without_a_traceback(tmp_path):
    path = tmp_path / "long.yaml"
    path.write_text(long_trace(AUTO_ONLY_FINDINGS + 50))
    args = " ".join([str(path)] * 4)
    r = subprocess.run(f"{sys.executable} -m kpool_cli replay {args} --all-ubatches "
                       "--backend none | head -1", shell=True, capture_output=True, text=True,
                       cwd=ROOT)
    assert r.stdout.startswith("trace ") and r.stdout.count("\n") == 1
    assert "Traceback" not in r.stderr and "Exception" not in r.stderr and r.stderr == ""


def test_ticker_shows_only_after_its_delay():
    buf = io.StringIO()
    console = make_console(buf, Manners(True, True, 80))
    slow = Ticker(console, 10, "t", delay=60)
    for _ in range(10):
        slow.tick()
    slow.close()
    assert buf.getvalue() == ""
    fast = Ticker(console, 10, "trace-name", delay=0)
    fast.tick()
    fast.close()
    assert "trace-name" in buf.getvalue()
    off = Ticker(None, 10, "t", delay=0)
    off.tick()
    off.close()
    assert off.done == 1


def test_quiet_and_piped_runs_print_nothing_on_stderr():
    r = kpool("replay", str(RACE), "--quiet")
    assert r.stderr == ""


def test_plain_view_unchanged_for_scripts():
    # the plain view still starts with the trace line and ends with the summary line
    r = CliRunner().invoke(cli, ["replay", str(RACE), "--engine", "cache-safe",
                                 "--backend", "none"])
    lines = r.stdout.splitlines()
    assert lines[0].startswith("trace ") and lines[-1].startswith("  summary: 3 ubatches")
    assert textwrap.dedent(lines[-1]).endswith("FAIL")


@pytest.mark.parametrize("code", sorted(CODES))
def test_explain_plain_text_fits_80_columns(code):
    """80 columns stay readable, `kpool explain` included."""
    from kpool_cli.verdict.explain import explain_text

    assert max(len(line) for line in explain_text(code).splitlines()) <= 80


def test_the_selection_line_names_one_ubatch_in_the_singular():
    """`--ubatch 1` shows one ubatch: "showing ubatch 1", not "ubatches 1"."""
    assert Selection(ubatches=((1, 2),)).describe() == "showing ubatch 1"
    assert Selection(ubatches=((1, 3),)).describe() == "showing ubatches 1..3"
    assert Selection(ubatches=((1, 2), (5, 6))).describe() == "showing ubatches 1, 5"
