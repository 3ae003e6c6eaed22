"""The defects a fifth hostile-input campaign found on 7 December 2026
(docs/robustness.md, "The fifth round"): the memory a diff of traces holds, a file
name that is not UTF-8 in SARIF and in a report `kpool diff` reads back, and
COLUMNS or LINES of thousands of digits read by rich itself. Each test runs what the
campaign ran and asserts what a user sees.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from test_untrusted import RACE_BODY, ROOT, kpool, write

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
    r = kpool("replay", str(RACE), "--backend", "none", "--color",
              env={variable: "9" * 5000}, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "internal error" not in r.stderr and "summary" in r.stdout
