#!/usr/bin/env python3
"""Mutation check of kpool_cli/cache/ and kpool_cli/engine/ with mutmut 3 (docs/testing.md).

    python tests/mutation/run_mutmut.py                 # fresh full run, then the summary
    python tests/mutation/run_mutmut.py --rerun NAME..  # re-run named mutants of the last run
    python tests/mutation/run_mutmut.py --summary       # the summary of the last run only

Run it with the repository's virtualenv, mutmut installed there (3.8.1). It never
touches the repository: the tree is copied to a work directory (default kpool-mutmut in
the system's temporary directory, or $KPOOL_MUTWORK, or --workdir) without .git, .venv,
caches and any old mutants/, and mutmut runs there with pyproject.toml's [tool.mutmut]:
the mutants of kpool_cli/cache/*.py and kpool_cli/engine/*.py, each run against the
selected tests that reach the mutated function (-x, no cache provider, hypothesis
derandomized and without its example database: tests/mutation/hypothesis_profile.py), at
most 2 mutmut workers (--max-children).

The summary counts, per module, the mutants tried, killed, timed out, reached by no
selected test, and surviving; each survivor must be classified in
tests/mutation/survivors.toml (equivalent or harmless, with the reason; the mutated
line is stored too, so that an entry whose mutant has changed is reported as stale).
The exit status is 1 when a survivor is unclassified or a classification is stale, 0
otherwise. The summary is also written to WORKDIR/mutation-summary.json and every
survivor's diff to WORKDIR/survivors.diff.

--second-pass (off by default: slow) then runs SLOW_TESTS (tests/test_cache_reference.py,
about 10 s a run) once for each survivor, with the mutant chosen as mutmut chooses it
(MUTANT_UNDER_TEST, in mutants/), after checking that the unmutated run passes and that
a run where every mutated function raises fails. Its verdicts are kept in
WORKDIR/slow-pass.json with a fingerprint of what they depend on (kpool_cli/, tests/ but
tests/test_mutants_*.py and tests/mutation/, traces/), reused while it holds, and a
survivor it kills is counted under "killed 2nd".
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
CLASSIFIED = HERE / "survivors.toml"
DEFAULT_WORKDIR = Path(os.environ.get("KPOOL_MUTWORK",
                                      Path(tempfile.gettempdir()) / "kpool-mutmut"))
MODULE_DIRS = ("kpool_cli/cache", "kpool_cli/engine")
SLOW_TESTS = ("tests/test_cache_reference.py",)
SLOW_TIMEOUT = 900  # seconds of wall time for one mutant's second pass
SKIP = {".git", ".venv", "mutants", ".hypothesis", "__pycache__", ".ruff_cache",
        ".pytest_cache", "build", "dist"}

# mutmut 3's exit codes (mutmut/stats.py: status_by_exit_code)
STATUS = {1: "killed", 3: "killed", 0: "survived", 5: "no tests", 33: "no tests",
          34: "skipped", 35: "suspicious", 36: "timeout", 37: "type check",
          -24: "timeout", 24: "timeout", 152: "timeout", 255: "timeout",
          -11: "segfault", -9: "segfault", 2: "interrupted", None: "not checked"}


def _ignore(_dir: str, names: list[str]) -> set[str]:
    return {n for n in names if n in SKIP or n.endswith(".egg-info")}


def copy_tree(workdir: Path, *, keep_mutants: bool) -> None:
    """The repository's working tree into workdir (mutants/ kept only for --rerun)."""
    if workdir.resolve() == ROOT or ROOT in workdir.resolve().parents:
        sys.exit(f"the work directory {workdir} must be outside the repository {ROOT}")
    if workdir.exists():
        for p in workdir.iterdir():
            if (keep_mutants and p.name == "mutants") or p.name == "slow-pass.json":
                continue
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink()
    else:
        workdir.mkdir(parents=True)
    shutil.copytree(ROOT, workdir, ignore=_ignore, dirs_exist_ok=True)
    if keep_mutants and (workdir / "mutants").exists():
        # a re-run tests the current tests: refresh mutmut's copy of them
        shutil.copytree(workdir / "tests", workdir / "mutants" / "tests", ignore=_ignore,
                        dirs_exist_ok=True)


def run_mutmut(workdir: Path, max_children: int, names: list[str]) -> int:
    cmd = [sys.executable, "-m", "mutmut", "run", "--max-children", str(max_children), *names]
    log = workdir / "mutmut-run.log"
    print(f"$ cd {workdir} && {' '.join(cmd)}   (output: {log})", flush=True)
    t0 = time.monotonic()
    with open(log, "ab") as out:
        rc = subprocess.call(cmd, cwd=workdir, stdout=out, stderr=subprocess.STDOUT)
    print(f"mutmut exited {rc} after {time.monotonic() - t0:.0f} s", flush=True)
    return rc


def load_results(workdir: Path) -> dict[str, dict[str, str]]:
    """module path -> {mutant name: status}, from mutmut's .meta files."""
    out: dict[str, dict[str, str]] = {}
    for d in MODULE_DIRS:
        for meta in sorted((workdir / "mutants" / d).glob("*.py.meta")):
            codes = json.loads(meta.read_text())["exit_code_by_key"]
            if codes:
                out[f"{d}/{meta.name[:-5]}"] = {k: STATUS.get(v, "suspicious")
                                                for k, v in codes.items()}
    return out


def diffs_of(workdir: Path, names: list[str]) -> dict[str, str]:
    """Each named mutant's diff (mutmut's own `show`), from one process."""
    if not names:
        return {}
    code = ("import json, sys\n"
            "from mutmut.mutation.diff_apply import get_diff_for_mutant\n"
            "print(json.dumps({n: get_diff_for_mutant(n) for n in json.load(sys.stdin)}))\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=workdir, input=json.dumps(names),
                       capture_output=True, text=True, check=True)
    return json.loads(r.stdout.splitlines()[-1])


def mutated_lines(diff: str) -> str:
    """The mutant's side of a diff, stripped, one line per changed line."""
    return "\n".join(line[1:].strip() for line in diff.splitlines()
                     if line.startswith("+") and not line.startswith("+++"))


def _pytest_cmd(tests: list[str]) -> list[str]:
    return [sys.executable, "-m", "pytest", "-x", "-q", "--rootdir=.", "-p", "no:cacheprovider",
            "-p", "tests.mutation.hypothesis_profile", *tests]


def slow_fingerprint(workdir: Path) -> str:
    """What the second pass's verdicts depend on: the sources, the tests (not the
    mutation tests, which it does not run) and the traces."""
    h = hashlib.sha256()
    files = [*workdir.glob("kpool_cli/**/*.py"), *workdir.glob("tests/**/*.py"),
             *workdir.glob("traces/*")]
    for f in sorted(files):
        rel = f.relative_to(workdir).as_posix()
        if rel.startswith(("tests/test_mutants_", "tests/mutation/")):
            continue
        h.update(rel.encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def load_slow(workdir: Path) -> dict[str, str]:
    """The second pass's verdicts that still hold (same fingerprint)."""
    path = workdir / "slow-pass.json"
    if not path.exists():
        return {}
    data = json.loads(path.read_text())
    if data.get("fingerprint") != slow_fingerprint(workdir):
        return {}
    return data["verdicts"]


def slow_pass(workdir: Path, names: list[str], max_children: int) -> dict[str, str]:
    """Each named mutant against SLOW_TESTS: 'killed', 'survived' or 'timeout'. Runs
    pytest in mutants/ with MUTANT_UNDER_TEST set, as mutmut's workers do. Mutants with
    a verdict that still holds are not run again."""
    mutants = workdir / "mutants"
    tests = [t for t in SLOW_TESTS if (mutants / t).exists()]
    done_path = workdir / "slow-pass.json"
    fingerprint = slow_fingerprint(workdir)
    done = load_slow(workdir)
    names = [n for n in names if n not in done]
    if not tests or not names:
        return done

    def start(name: str) -> subprocess.Popen:
        return subprocess.Popen(_pytest_cmd(tests), cwd=mutants, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL,
                                env={**os.environ, "MUTANT_UNDER_TEST": name})

    # the pass must see the mutated tree: clean passes, every trampoline raising fails
    rc = start("").wait()
    if rc != 0:
        sys.exit(f"second pass: the clean run of {' '.join(tests)} exited {rc}, not 0")
    rc = start("fail").wait()
    if rc == 0:
        sys.exit(f"second pass: {' '.join(tests)} passed with every mutated function "
                 "raising: it does not import the mutated tree")
    print(f"second pass: {len(names)} survivors against {' '.join(tests)}", flush=True)
    todo = list(names)
    running: dict[str, tuple[subprocess.Popen, float]] = {}
    while todo or running:
        while todo and len(running) < max_children:
            name = todo.pop(0)
            running[name] = (start(name), time.monotonic())
        time.sleep(0.2)
        for name, (proc, t0) in list(running.items()):
            rc = proc.poll()
            if rc is None and time.monotonic() - t0 > SLOW_TIMEOUT:
                proc.kill()
                proc.wait()
                rc = -9
            if rc is None:
                continue
            del running[name]
            done[name] = {0: "survived", 1: "killed"}.get(rc, "timeout" if rc == -9
                                                          else f"error {rc}")
            done_path.write_text(json.dumps({"fingerprint": fingerprint, "tests": tests,
                                             "verdicts": done}, indent=1, sort_keys=True))
    return done


def load_classified() -> dict[str, dict]:
    if not CLASSIFIED.exists():
        return {}
    data = tomllib.loads(CLASSIFIED.read_text())
    return {m["name"]: m for m in data.get("mutant", [])}


def summarise(workdir: Path) -> int:
    results = load_results(workdir)
    if not results:
        sys.exit(f"no mutmut results under {workdir / 'mutants'}: run without --summary first")
    classified = load_classified()
    slow = load_slow(workdir)
    for res in results.values():
        for name, status in res.items():
            if status == "survived" and slow.get(name) in ("killed", "timeout"):
                res[name] = f"{slow[name]} (second pass)"
    survivors = sorted(n for r in results.values() for n, s in r.items() if s == "survived")
    want_diff = survivors + sorted(n for n, c in classified.items()
                                   if any(n in r for r in results.values()) and n not in survivors)
    diffs = diffs_of(workdir, want_diff)

    problems: list[str] = []
    rows = []
    totals: Counter[str] = Counter()
    verdicts: dict[str, Counter[str]] = defaultdict(Counter)
    for module, res in results.items():
        c = Counter(res.values())
        for name, status in res.items():
            entry = classified.get(name)
            if status == "survived":
                if entry is None:
                    problems.append(f"unclassified survivor {name}")
                    verdicts[module]["unclassified"] += 1
                    continue
                if entry["verdict"] == "killed":
                    problems.append(f"{name} is classified as killed by {entry.get('test')} "
                                    "but survived")
                verdicts[module][entry["verdict"]] += 1
            if (entry is not None and name in diffs
                    and mutated_lines(diffs[name]) != entry["mutated"].strip()):
                problems.append(f"stale classification {name}: the mutant now reads "
                                f"{mutated_lines(diffs[name])!r}")
        row = {"module": module, "tried": len(res), "killed": c["killed"],
               "killed 2nd": c["killed (second pass)"],
               "timeout": c["timeout"] + c["timeout (second pass)"],
               "no tests": c["no tests"], "survived": c["survived"],
               "equivalent": verdicts[module]["equivalent"],
               "harmless": verdicts[module]["harmless"],
               "unclassified": verdicts[module]["unclassified"],
               "other": sum(v for k, v in c.items()
                            if k not in ("killed", "killed (second pass)", "timeout",
                                         "timeout (second pass)", "no tests", "survived"))}
        rows.append(row)
        totals.update({k: v for k, v in row.items() if k != "module"})
    for name in classified:
        if not any(name in r for r in results.values()):
            problems.append(f"stale classification {name}: no such mutant in this run")

    cols = ["tried", "killed", "killed 2nd", "timeout", "no tests", "survived", "equivalent",
            "harmless", "unclassified", "other"]
    width = max(len(r["module"]) for r in rows)
    print(f"{'module':<{width}}  " + "  ".join(f"{c:>10}" for c in cols))
    for r in [*rows, {"module": "total", **totals}]:
        print(f"{r['module']:<{width}}  " + "  ".join(f"{r.get(c, 0):>10}" for c in cols))
    (workdir / "mutation-summary.json").write_text(json.dumps(
        {"rows": rows, "total": dict(totals), "survivors": survivors,
         "second_pass": {n: v for n, v in slow.items() if n in {m for r in results.values()
                                                                for m in r}},
         "problems": problems}, indent=2))
    with open(workdir / "survivors.diff", "w") as f:
        for name in survivors:
            entry = classified.get(name, {})
            f.write(f"# {name}: {entry.get('verdict', 'UNCLASSIFIED')}\n{diffs[name]}\n\n")
    for p in problems:
        print("PROBLEM:", p)
    print(f"summary: {workdir / 'mutation-summary.json'}; survivors' diffs: "
          f"{workdir / 'survivors.diff'}")
    return 1 if problems else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workdir", type=Path, default=DEFAULT_WORKDIR)
    ap.add_argument("--max-children", type=int, default=2)
    ap.add_argument("--rerun", nargs="+", metavar="MUTANT",
                    help="re-run these mutants (names, or fnmatch patterns such as "
                         "'kpool_cli.cache.batch*') of the last run, against the current tests")
    ap.add_argument("--summary", action="store_true", help="only summarise the last run")
    ap.add_argument("--second-pass", action="store_true",
                    help="after mutmut, run SLOW_TESTS against each survivor")
    ap.add_argument("--second-pass-only", action="store_true",
                    help="run only the second pass, on the last run's survivors")
    a = ap.parse_args()
    if a.second_pass_only:
        res = load_results(a.workdir)
        slow_pass(a.workdir, [n for r in res.values() for n, st in r.items()
                              if st == "survived"], a.max_children)
    elif not a.summary:
        try:
            import mutmut  # noqa: F401
        except ImportError:
            sys.exit("mutmut is not installed in this interpreter: pip install 'mutmut==3.8.1'")
        if a.rerun and not (a.workdir / "mutants").exists():
            sys.exit(f"--rerun needs a previous run in {a.workdir}")
        copy_tree(a.workdir, keep_mutants=bool(a.rerun))
        names = a.rerun or []
        if names and any("*" in n for n in names):
            # mutmut takes names only: expand patterns against the last run
            from fnmatch import fnmatch
            known = [n for r in load_results(a.workdir).values() for n in r]
            names = [n for n in known if any(fnmatch(n, p) for p in names)]
        rc = run_mutmut(a.workdir, a.max_children, names)
        if rc != 0:
            print(f"mutmut failed (exit {rc}); see {a.workdir / 'mutmut-run.log'}")
            return rc
        if a.second_pass:
            res = load_results(a.workdir)
            survived = [n for r in res.values() for n, st in r.items()
                        if st == "survived" and (not names or n in names)]
            slow_pass(a.workdir, survived, a.max_children)
    return summarise(a.workdir)


if __name__ == "__main__":
    sys.exit(main())
