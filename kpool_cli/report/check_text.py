"""The text output of `kpool check`: one line per trace and engine, and under a failure
what was expected beside what happened; a summary line at the end. Also the words
the other check formats share (`run_name`, `headline`, `unmet_text`, `flagged_text`,
`problem_text`), so a difference reads the same in every format.

Owns: `write_check_text` (streams: a line as each result comes) and those words. It
never judges: each `CheckResult` carries its status; codes and lists are worded by
`kpool_cli.wording`, and every text taken from an input (a path, an engine named by
a trace, a finding's message quoting a trace) goes through `visible`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TextIO

from .. import wording as words
from ..check import FAIL, INVALID, CheckResult, Flagged, Problem, Unmet, summary
from ..wording import visible

_LABEL = {"pass": "PASS", "fail": "FAIL", "invalid": "INVALID"}


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{c} x{n}" for c, n in counts.items())


def run_name(r: CheckResult) -> str:
    """`traces/a.yaml under rep-once` (the trace alone when it did not load)."""
    return visible(r.path) + (f" under {visible(r.engine)}" if r.engine else "")


def headline(r: CheckResult) -> str:
    """What a result comes to, in a clause: `2 expectations held, KP001 x1 pinned`."""
    if r.status == INVALID:
        n = len(r.problems)
        return f"invalid trace ({n} problem{'s' if n != 1 else ''})"
    parts = []
    total = r.expect_passed + r.expect_failed
    if r.expect_failed:
        parts.append(f"{r.expect_failed} of {total} expectations not met")
    else:
        parts.append(f"{total} expectation{'s' if total != 1 else ''} held")
    failing = r.n_failing
    if failing:
        parts.append(f"{failing} unpinned finding{'s' if failing != 1 else ''} at or above "
                     f"--fail-on {r.fail_on}")
    below = r.n_below
    if below:
        parts.append(f"{below} finding{'s' if below != 1 else ''} below --fail-on")
    if r.pinned:
        parts.append(f"pinned {_counts(r.pinned)}")
    if r.ignored:
        parts.append(f"ignored {_counts(r.ignored)}")
    return ", ".join(parts)


def _where(path: str, line: int) -> str:
    return f"{visible(path)}:{line}" if line else visible(path)


def unmet_title(u: Unmet) -> str:
    target = (f"on op {u.target}" + (f" (line {u.target_line})" if u.target_line else "")
              if u.target >= 0 else "with no op before it")
    return f"expect (op {u.op}) {target} not met"


def unmet_text(u: Unmet) -> str:
    """The differences in a line: `findings: expected KP001, actual none; ...`."""
    return "; ".join(f"{visible(w)}: expected {visible(e)}, actual {visible(a)}"
                     for w, e, a in u.diffs) or visible(u.message)


def unmet_table(u: Unmet, indent: str = "      ") -> list[str]:
    """The differences side by side: a header and a row per difference."""
    rows = [("what", "expected", "actual")] + [
        (visible(w), visible(e), visible(a)) for w, e, a in u.diffs]
    if len(rows) == 1:
        return [indent + visible(u.message)]
    w0 = max(len(r[0]) for r in rows)
    w1 = max(len(r[1]) for r in rows)
    return [f"{indent}{a:<{w0}}  {b:<{w1}}  {c}".rstrip() for a, b, c in rows]


def flagged_title(f: Flagged) -> str:
    pinned = " not pinned by an expect" if f.pinnable else ""
    return f"{words.code(f.code, f.name)} [{f.severity}]{pinned}"


def flagged_text(f: Flagged) -> str:
    at = f"op {f.op}" + (f", ubatch {f.ubatch}" if f.ubatch is not None else "")
    return f"{visible(f.message)} ({at})"


def problem_text(p: Problem) -> str:
    return f"{visible(p.field)}: {visible(p.message)}"


def details(r: CheckResult, indent: str = "  ") -> list[str]:
    """The lines under a result that did not pass: each problem, each unmet expect
    with its differences side by side, each failing finding at its op's line."""
    out: list[str] = []
    for p in r.problems:
        where = _where(p.file or r.path, p.line) + (f":{p.column}" if p.line and p.column
                                                    else "")
        out.append(f"{indent}{where}: {problem_text(p)}")
    for u in r.unmet:
        out.append(f"{indent}{_where(r.path, u.line)}: {unmet_title(u)}:")
        out += unmet_table(u, indent + "    ")
    for f in r.failing:
        out.append(f"{indent}{_where(r.path, f.line)}: {flagged_title(f)}: {flagged_text(f)}")
    if r.n_failing > len(r.failing):
        out.append(f"{indent}... and {r.n_failing - len(r.failing)} more unpinned findings "
                   "at or above --fail-on")
    return out


def write_check_text(out: TextIO, results: Iterable[CheckResult]) -> list[CheckResult]:
    """A line per result as it comes (details under a failure), then the summary line.
    Returns the results, for the exit code."""
    seen: list[CheckResult] = []
    for r in results:
        seen.append(r)
        out.write(f"{_LABEL[r.status]:<8}{run_name(r)}: {headline(r)}\n")
        if r.status in (FAIL, INVALID):
            out.write("".join(line + "\n" for line in details(r)))
        out.flush()
    s = summary(seen)
    out.write(f"checked {s['runs']} run{'s' if s['runs'] != 1 else ''} of {s['traces']} "
              f"trace{'s' if s['traces'] != 1 else ''}: {s['passed']} passed, "
              f"{s['failed']} failed, {s['invalid']} invalid\n")
    return seen
