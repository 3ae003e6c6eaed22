"""The code stays ruff-clean and type-checked (pyproject.toml's rules and the tool
versions its `test` extra pins): CI runs these with the suite."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_ruff_is_clean():
    r = subprocess.run([sys.executable, "-m", "ruff", "check", "kpool_cli", "tests", "benchmarks"],
                       capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr


def test_mypy_is_clean():
    """`kpool_cli` ships `py.typed`: its annotations are a promise mypy checks."""
    r = subprocess.run([sys.executable, "-m", "mypy", "kpool_cli"],
                       capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
