"""The pre-commit hook (`.pre-commit-hooks.yaml`): in a git repository holding traces,
its entry runs as pre-commit runs it (the entry split, the staged files its `files`
pattern selects appended) and fails exactly when a changed trace breaks an
expectation."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
HOOKS = ROOT / ".pre-commit-hooks.yaml"
KPOOL = Path(sys.executable).parent / "kpool"

# 8 tokens in one ubatch of a kpool-4 cache complete pools 0..4 and 4..8: n_new 2; the
# decode at 8 starts pool 8..12 and completes none: n_new 0 (the same in both versions)
GOOD = """\
kpool_trace: 1
name: NAME
description: one sequence, an 8-token prefill in one ubatch, then one decode
cache:
  kv_size: 32
  kpool: 4
  n_ubatch: 8
ops:
  - decode: {seq: 0, pos: 0..8}
  - expect: {findings: [], n_new: NEW}
  - decode: {seq: 0, pos: 8}
  - expect: {findings: [], n_new: 0}
"""


def _trace(name: str, n_new: int) -> str:
    return GOOD.replace("NAME", name).replace("NEW", str(n_new))


def _hook() -> dict[str, object]:
    hooks = yaml.safe_load(HOOKS.read_text())
    (hook,) = [h for h in hooks if h["id"] == "kpool-check"]
    return hook


def _check_available() -> str | None:
    """Why the hook cannot run here, or None."""
    if not KPOOL.exists():
        return f"no kpool script beside {sys.executable}"
    r = subprocess.run([str(KPOOL), "check", "--help"], capture_output=True, text=True)
    if r.returncode != 0:
        return "`kpool check` is not available in this build"
    return None


def _git(repo: Path, *args: str) -> str:
    r = subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo,
                       capture_output=True, text=True, check=True)
    return r.stdout


def _run_hook(repo: Path) -> subprocess.CompletedProcess[str]:
    """The hook's entry over the staged files its `files` pattern selects, as
    pre-commit runs it (pass_filenames: the names appended, relative to the root)."""
    hook = _hook()
    staged = _git(repo, "diff", "--cached", "--name-only").split()
    files = [f for f in staged if re.search(str(hook["files"]), f)]
    argv = shlex.split(str(hook["entry"]))
    assert argv[0] == "kpool"
    argv[0] = str(KPOOL)
    return subprocess.run([*argv, *files], cwd=repo, capture_output=True, text=True)


def test_hook_declaration():
    hook = _hook()
    assert hook["entry"] == "kpool check"
    assert hook["language"] == "python"
    assert hook["pass_filenames"] is True
    pattern = re.compile(str(hook["files"]))
    for taken in ("traces/a.yaml", "traces/legacy/b.yml", "sub/traces/c.yaml"):
        assert pattern.search(taken), taken
    for left in (".pre-commit-config.yaml", ".github/workflows/ci.yml", "traces/README.md",
                 "mytraces/a.yaml", "config.yaml"):
        assert not pattern.search(left), left


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    why = _check_available()
    if why is not None:
        pytest.skip(why)
    _git(tmp_path, "init", "-q")
    (tmp_path / "traces").mkdir()
    (tmp_path / "traces" / "good.yaml").write_text(_trace("good", 2))
    (tmp_path / "ci.yaml").write_text("not: a trace\n")  # YAML the hook must leave alone
    _git(tmp_path, "add", "-A")
    return tmp_path


def test_hook_passes_a_good_trace(repo: Path):
    r = _run_hook(repo)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "good" in r.stdout + r.stderr


def test_hook_fails_a_broken_expectation(repo: Path):
    _git(repo, "commit", "-q", "-m", "good")
    (repo / "traces" / "broken.yaml").write_text(_trace("broken", 3))
    _git(repo, "add", "-A")
    assert _git(repo, "diff", "--cached", "--name-only").split() == ["traces/broken.yaml"]
    r = _run_hook(repo)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "broken" in r.stdout + r.stderr
    # the good trace again, changed alongside: still exit 1, the broken one decides
    (repo / "traces" / "good.yaml").write_text(_trace("good", 2) + "# touched\n")
    _git(repo, "add", "-A")
    assert _run_hook(repo).returncode == 1
