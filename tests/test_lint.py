"""The code stays ruff-clean (pyproject.toml's rules): CI runs this with the suite."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_ruff_is_clean():
    r = subprocess.run([sys.executable, "-m", "ruff", "check", "kpool_cli", "tests", "benchmarks"],
                       capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
