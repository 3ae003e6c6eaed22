"""The command a user runs first: the shipped race trace under both engines (the
README's first command)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RACE = ROOT / "traces" / "shared-prefix-race.yaml"


def kpool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kpool_cli", *args], capture_output=True,
                          text=True, cwd=ROOT)


def test_race_trace_fails_under_cache_safe_and_names_rows():
    r = kpool("replay", str(RACE), "--engine", "cache-safe")
    assert r.returncode == 1, r.stderr
    assert "KP001" in r.stdout and "3 7 11" in r.stdout


def test_race_trace_passes_under_rep_once():
    r = kpool("replay", str(RACE), "--engine", "rep-once", "--check")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "KP001" not in r.stdout


def test_json_report_names_the_raced_rows():
    r = kpool("replay", str(RACE), "--engine", "cache-safe", "--format", "json")
    assert r.returncode == 1
    rep = json.loads(r.stdout)
    kp001 = [f for u in rep["ubatches"] for f in u["findings"] if f["code"] == "KP001"]
    assert kp001 and kp001[0]["rows"] == [3, 7, 11]
    assert rep["summary"]["status"] == "fail"
