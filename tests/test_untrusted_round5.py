"""The defects a fifth hostile-input campaign found on 7 December 2026
(docs/robustness.md, "The fifth round"): the memory a diff of traces holds, a file
name that is not UTF-8 in SARIF and in a report `kpool diff` reads back, and
COLUMNS or LINES of thousands of digits read by rich itself; fuzz's repro commands
past its own seed bound, the memory budget's count of kpool-wide entries, an empty
`--ignore` item, and the wording for a settings file's over-long dotted key. Each
test runs what the campaign ran, or the function it reached, and asserts what a user
sees.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import tomllib
from pathlib import Path

import pytest
from conftest import trace
from test_untrusted import RACE_BODY, ROOT, kpool, kpool_here, write

from kpool_cli.backend import budget
from kpool_cli.backend.store import make_backend
from kpool_cli.cache.kv import Reach
from kpool_cli.engine.marking import entries_bound
from kpool_cli.gen.fuzz import run_seed, tasks_for
from kpool_cli.gen.random_trace import random_trace
from kpool_cli.replay import Replayer
from kpool_cli.settings import SettingsError, load_settings
from kpool_cli.trace.format import SEED_MAX
from kpool_cli.versions import VERSIONS

RACE = ROOT / "traces" / "shared-prefix-race.yaml"
NOT_UTF8 = os.fsdecode(b"race\xff.yaml")  # a file name a Python str holds as a surrogate


def _wide(tmp_path: Path) -> Path:
    """Two slots sharing a 4,096-token prompt, then five steps: under cache-safe each
    step lists its 2,048 pools (the campaign's case, a hundred times smaller)."""
    lines = ["kpool_trace: 1", "cache: {kv_size: 8192, kpool: 4, n_seq_max: 2}", "ops:",
             "  - decode: {seq: 0, pos: 0..4096}", "  - seq_cp: {src: 0, dst: 1}"]
    lines += [f"  - decode: {{tokens: [{{pos: {i}, seq: [0]}}, {{pos: {i}, seq: [1]}}]}}"
              for i in range(4096, 4101)]
    path = tmp_path / "wide.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_diff_of_traces_keeps_what_it_holds_within_the_memory_budget(tmp_path):
    """The summaries of both runs grew without bound (a 1.5 KB trace took 1.9 GB, and
    --max-memory held nothing back): past its share of the budget a run stops with a
    message naming the trace (exit 2, no output written); a budget that holds it
    diffs it."""
    trace = _wide(tmp_path)
    out = tmp_path / "out.txt"
    r = kpool("diff", str(trace), "--max-memory", "80M", "-o", str(out), cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith(f"kpool: {trace}: comparing its run under cache-safe would "
                               "hold more than the "), r.stderr
    assert "of 80.0 MiB (--max-memory)" in r.stderr and "Traceback" not in r.stderr
    assert not out.exists()
    r = kpool("diff", str(trace), "--max-memory", "400M", "-o", str(out), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert out.stat().st_size > 0


@pytest.mark.parametrize("command", [
    ("check", NOT_UTF8, "--engine", "cache-safe", "--output-format", "sarif"),
    ("replay", NOT_UTF8, "--engine", "cache-safe", "--format", "sarif"),
])
def test_sarif_of_a_file_name_that_is_not_utf8_percent_encodes_its_bytes(tmp_path, command):
    """`urllib.parse.quote` refused the surrogate: an internal error, no file. The
    artifact's URI now carries the name's bytes, %FF (a race no expect pins: a
    result with a location)."""
    write(tmp_path / NOT_UTF8, "    kpool_trace: 1\n" + RACE_BODY)
    out = tmp_path / "x.sarif"
    r = kpool(*command, "--backend", "none", "-o", str(out), cwd=tmp_path)
    assert r.returncode == 1, r.stderr
    uris = {loc["physicalLocation"]["artifactLocation"]["uri"]
            for run in json.loads(out.read_text())["runs"] for res in run["results"]
            for loc in res["locations"]}
    assert uris == {"race%FF.yaml"}


def test_diff_reads_back_the_reports_of_a_file_name_that_is_not_utf8(tmp_path):
    """The report wrote the name as a lone surrogate (`\\udcff`), which the diff's
    reader refuses: it is written `\\xff` now, and the two reports diff."""
    shutil.copy(RACE, tmp_path / NOT_UTF8)
    for engine, name in (("cache-safe", "a.json"), ("rep-once", "b.json")):
        r = kpool("replay", NOT_UTF8, "--engine", engine, "--backend", "none", "--format",
                  "json", "-o", name, cwd=tmp_path)
        assert r.returncode in (0, 1), r.stderr
    assert json.loads((tmp_path / "a.json").read_text())["trace"]["path"] == "race\\xff.yaml"
    r = kpool("diff", "a.json", "b.json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "race\\xff.yaml" in r.stdout


@pytest.mark.parametrize("variable", ["COLUMNS", "LINES"])
def test_columns_or_lines_of_thousands_of_digits_are_not_read_by_rich(tmp_path, variable):
    """kpool kept its own width within bounds, but rich's Console parsed COLUMNS and
    LINES itself: past 4,300 digits Python refuses the int, an internal error. Every
    console is handed its height too now, so rich reads neither."""
    r = kpool_here("replay", str(RACE), "--backend", "none", "--color",
                   env={variable: "9" * 5000}, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "internal error" not in r.stderr and "summary" in r.stdout


# -- kpool fuzz --seed at the top of its bound ---------------------------------------------


def test_every_run_seed_is_one_fuzz_takes():
    """Run r's seed was `seed + r`, past `--seed`'s bound from the top seed on: it
    wraps to 0 there, and stays `seed + r` below it."""
    tasks = tasks_for("cache-safe", 50, SEED_MAX)
    assert [tasks[r].seed for r in range(3)] == [SEED_MAX, 0, 1]
    assert all(0 <= t.seed <= SEED_MAX for t in tasks)
    assert [t.seed for t in tasks_for("cache-safe", 3, 7)] == [7, 8, 9]
    assert run_seed(SEED_MAX - 1, 1) == SEED_MAX


def test_the_command_a_shrunk_trace_gives_is_accepted(tmp_path):
    """`kpool fuzz --seed 4611686018427387904` (then the top of the bound, 2**62) wrote
    shrunk traces found by `--seed 4611686018427387921`, which the option refuses: each
    command a description gives now runs (exit 0, not 2), from the top of today's
    bound (SEED_MAX) too."""
    out = tmp_path / "found"
    r = kpool_here("fuzz", "--seed", str(SEED_MAX), "--runs", "3", "--engine", "cache-safe",
                   "-o", str(out), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    commands = {m.group(1) for f in out.glob("*.yaml")
                for m in re.finditer(r"Found by `kpool (fuzz [^`]*)`", f.read_text())}
    assert commands
    for command in sorted(commands):
        args = shlex.split(command)
        assert 0 <= int(args[args.index("--seed") + 1]) <= SEED_MAX
        r = kpool_here(*args, "-o", str(tmp_path / "again"), cwd=tmp_path)
        assert r.returncode == 0, (command, r.stderr)


# -- the memory budget and cache.kpool ---------------------------------------------------

WIDE = """
    kpool_trace: 1
    cache: {kv_size: 16777216, kpool: 16777216}
    ops:
      - decode: {seq: 0, pos: 0}
    """


def test_one_token_in_kpool_wide_pools_is_not_counted_as_64_entries():
    """One token of `kv_size: kpool: 16777216` was bounded at 32.8 GiB (64 padding
    entries, each 16M rows wide; the replay's peak is 466 MB): a plan has at most the
    pools the cache has room for (here one), so the bound is under 2 GiB."""
    t = trace(WIDE)
    assert entries_bound(1, 16777216, 16777216, 1) == 1
    b = budget.memory_bound(t, "none")
    assert b.total < 2 << 30, b.parts


def test_the_budget_names_cache_kpool_where_it_drives_the_need():
    """The advice said "Lower cache.kv_size, cache.n_embd or cache.n_seq_max" whatever
    drove the need: it names the fields that do, cache.kpool among them here, and
    not where kpool-wide arrays are a small part."""
    with pytest.raises(budget.ReplayTooLarge) as e:
        budget.check_replay_memory(trace(WIDE), "none", 100 << 20)
    msg = str(e.value)
    assert "cache.kpool" in e.value.fields
    assert "scatter entries of cache.kpool 16777216 rows each" in msg
    assert "Lower cache.kv_size, cache.n_seq_max or cache.kpool, decode fewer" in msg
    with pytest.raises(budget.ReplayTooLarge) as e:
        budget.check_replay_memory(trace(WIDE), "numba", 100 << 20)
    assert e.value.fields[0] == "cache.kpool"
    narrow = WIDE.replace("kpool: 16777216", "kpool: 4")
    with pytest.raises(budget.ReplayTooLarge) as e:
        budget.check_replay_memory(trace(narrow), "none", 1 << 20)
    assert "cache.kpool" not in e.value.fields and "cache.kpool" not in str(e.value)


def test_a_plan_never_has_more_entries_than_the_bound():
    """`entries_bound` (what the budget counts) holds for every ubatch of the fuzzer's
    random traces, under every shipped version."""
    for seed in range(40):
        t = random_trace(seed)
        cfg, cells = t.cache, Reach.of(t).cells
        most = entries_bound(cells, cfg.kv_size, cfg.kpool, cfg.n_seq_max)
        for version in VERSIONS.values():
            for rec in Replayer(t, version, make_backend("none", t)).run():
                assert getattr(rec, "n_new_g", 0) <= most, (seed, version.name)


# -- --ignore with an empty item -----------------------------------------------------------


@pytest.mark.parametrize("command", ["check", "diff"])
@pytest.mark.parametrize("value", ["", ",", "  ", "KP001,"])
def test_an_empty_ignore_item_is_refused(tmp_path, command, value):
    """`--ignore ''` (or `,`, a blank, a trailing comma) was taken in silence and
    ignored nothing: it is refused as an unknown code is, naming the option."""
    r = kpool_here(command, str(RACE), "--ignore", value, "--backend", "none", cwd=tmp_path)
    assert r.returncode == 2, r.stdout
    assert r.stderr.startswith(f"kpool: --ignore {value!r}: an empty item names no "
                               "finding code"), r.stderr
    assert "Traceback" not in r.stderr


# -- a settings file's dotted key of 300,000 parts ------------------------------------------


@pytest.mark.parametrize("name, head", [("kpool.toml", ""),
                                        ("pyproject.toml", "[tool.kpool]\njobs = 1\n")])
def test_a_long_dotted_key_is_named_a_dotted_key(tmp_path, name, head):
    """A 300,000-part dotted key was reported as "arrays and inline tables nested too
    deeply" (tomllib's time and memory grow with the square of its parts: 27 s and
    3.5 GB at 30,000): it is refused before tomllib reads it, at its line, as what
    it is. Dots in strings and comments are not keys."""
    path = tmp_path / name
    path.write_text(head + "# " + "a." * 100 + "\nx = '" + "a." * 100 + "'\n"
                    + "a." * 300_000 + "a = 1\n")
    with pytest.raises(SettingsError) as e:
        load_settings(tmp_path)
    line = head.count("\n") + 3
    assert (e.value.file, e.value.line) == (path.resolve(), line)
    assert e.value.message == ("invalid TOML: a dotted key of more than 64 parts (kpool's "
                               "keys have at most four): not parsed")


def test_a_long_dotted_key_exits_2_with_the_line(tmp_path: Path):
    (tmp_path / "kpool.toml").write_text("a." * 300_000 + "a = 1\n")
    r = kpool_here("check", str(RACE), "--backend", "none", cwd=tmp_path)
    assert r.returncode == 2
    assert r.stderr == (f"kpool: {(tmp_path / 'kpool.toml').resolve()}:1: invalid TOML: a "
                        "dotted key of more than 64 parts (kpool's keys have at most four): "
                        "not parsed\n")


def test_a_multi_line_string_with_an_escaped_quote_hides_its_dotted_lines(tmp_path: Path):
    """A review's case: `\\\"""` inside a multi-line basic string does not end it, so
    the long dotted line of the next multi-line string is text, not a key; tomllib
    reads the file, and so must the check before it (a pyproject.toml of another
    tool's is read to find `[tool.kpool]`)."""
    text = ('x = """a\\"""b"""\nw = """\n' + ".".join(["k"] * 70) + '\n"""\n'
            "[tool.kpool]\nignore = ['KP006']\n")
    tomllib.loads(text)  # valid TOML
    (tmp_path / "pyproject.toml").write_text(text)
    got = load_settings(tmp_path)
    assert got is not None and got.ignore == ("KP006",)


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can give a file to another user")
def test_a_settings_file_of_another_user_is_passed_over_with_a_warning(tmp_path: Path):
    """The settings search went up to / across owners: a kpool.toml planted in a
    shared folder (/tmp) ignored every finding of a `kpool check` run below it, which
    then passed. A file another user owns (not root, not this user) is passed over,
    with a warning naming it; the check fails on its race as without the file."""
    planted = tmp_path / "kpool.toml"
    planted.write_text('ignore = ["KP001", "KP002"]\n')
    sub = tmp_path / "work"
    sub.mkdir()
    write(sub / "r.yaml", "    kpool_trace: 1\n" + RACE_BODY)
    args = ("check", "r.yaml", "--engine", "cache-safe", "--backend", "none")
    assert kpool_here(*args, cwd=sub).returncode == 0  # this user's file: its ignores hold
    os.chown(planted, 4242, 4242)
    r = kpool_here(*args, cwd=sub)
    assert r.returncode == 1 and "KP001" in r.stdout, r.stdout
    assert r.stderr == (f"kpool: warning: {planted} is not read: it belongs to another "
                        "user (uid 4242), and a settings file decides what a check "
                        "ignores\n")
