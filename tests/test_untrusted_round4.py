"""The defects a fourth hostile-input campaign found on 7 December 2026
(docs/robustness.md, "The fourth round"): fuzz's output folder, a plug-in's zip
archive, standard output onto an input, the memory cgroup, the signals that end a
process, and plug-ins' values. Each test runs what the campaign ran, or the function
it reached, and asserts what a user sees.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
from test_untrusted import kpool

PLUGIN = """from dataclasses import replace
from kpool_cli.versions import REP_ONCE
ok = replace(REP_ONCE, name="mine")
"""


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# -- kpool fuzz -o DIR -------------------------------------------------------------------


def test_fuzz_never_writes_through_a_link_in_its_folder(tmp_path):
    """Links named as shrunk traces, to the plug-in's own module: refused before any
    run (exit 2), the module untouched (fuzz wrote the trace over it, exit 0)."""
    plug = tmp_path / "plug"
    plug.mkdir()
    module = plug / "pg.py"
    module.write_text(PLUGIN)
    before = _digest(module)
    out = tmp_path / "found"
    out.mkdir()
    for name in ("KP005_decode_own", "KP008_seq_rm_own"):
        (out / f"{name}.yaml").symlink_to(module)
    r = kpool("fuzz", "--engine", "pg:ok", "--runs", "30", "--seed", "3", "-o", str(out),
              env={"PYTHONPATH": f"{os.environ.get('PYTHONPATH', '')}:{plug}"})
    assert r.returncode == 2, r.stderr
    assert "is a symbolic link" in r.stderr and r.stdout == ""
    assert _digest(module) == before


@pytest.mark.parametrize("make, says", [
    (lambda d: os.mkfifo(d / "found" / "KP008_seq_rm_own.yaml"), "not a regular file"),
    (lambda d: (d / "found" / "KP001_decode_shared.yaml").mkdir(), "is a folder"),
])
def test_fuzz_refuses_a_folder_it_cannot_fill_before_any_run(tmp_path, make, says):
    (tmp_path / "found").mkdir()
    make(tmp_path)
    r = kpool("fuzz", "--engine", "cache-safe", "--runs", "300", "-o",
              str(tmp_path / "found"))
    assert r.returncode == 2 and says in r.stderr, r.stderr
    assert r.stdout == ""  # no campaign ran: no summary
    assert sorted(p.name for p in (tmp_path / "found").iterdir()) in (
        ["KP008_seq_rm_own.yaml"], ["KP001_decode_shared.yaml"])


def test_fuzz_refuses_a_folder_under_a_file_before_any_run(tmp_path):
    (tmp_path / "afile").write_text("")
    r = kpool("fuzz", "--engine", "cache-safe", "--runs", "300", "-o",
              str(tmp_path / "afile" / "sub"))
    assert r.returncode == 2 and "cannot write there" in r.stderr and r.stdout == ""
