"""The text output of `kpool check`: one line per trace and engine, and under a failure
what was expected beside what happened; for traces checked under more than one
engine, which versions show each finding; a summary line at the end. Also the words
the other check formats share (`run_name`, `headline`, `unmet_text`, `flagged_text`,
`problem_text`), so a difference reads the same in every format, but for its counts:
grouped from 10,000 on here (`wording.count`), bare in JUnit (`headline(r, str)`).

Owns: `write_check_text` (streams: a line as each result comes) and those words. It
never judges: each `CheckResult` carries its status; codes and lists are worded by
`kpool_cli.wording`, and every text taken from an input (a path, an engine named by
a trace, a finding's message quoting a trace) goes through `visible`.

Width: on a terminal, or with COLUMNS set, a line longer than the width wraps between
`wording.units` (a path, `KP001 x2`, `(op 3, ubatch 1)` stay whole), the rest of a
result's line indented under its path, the rest of a detail under the detail (the
width: report/terminal.py's `console_width`); piped without COLUMNS, or written to
an --output file, each line stays one line (for grep and CI logs).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from typing import TextIO

from .. import wording as words
from ..check import FAIL, INVALID, CheckResult, Flagged, Problem, Shown, Unmet, by_version, summary
from ..verdict.codes import CODES
from ..wording import visible
from .terminal import console_width, env_columns, stream_is_terminal

_LABEL = {"pass": "PASS", "fail": "FAIL", "invalid": "INVALID"}


def _counts(counts: dict[str, int], number: Callable[[int], str]) -> str:
    return ", ".join(words.code_count(c, n, number) for c, n in counts.items())


def run_name(r: CheckResult) -> str:
    """`traces/a.yaml under rep-once` (the trace alone when it did not load)."""
    return visible(r.path) + (f" under {visible(r.engine)}" if r.engine else "")


def headline(r: CheckResult, number: Callable[[int], str] = words.count) -> str:
    """What a result comes to, in a clause: `2 expectations held, pinned KP001 x1`.
    `number`: how its counts read, `wording.count` as the text output's other lines
    (`str` for JUnit, which writes numbers bare)."""
    if r.status == INVALID:
        n = len(r.problems)
        return f"invalid trace ({words.counted(n, 'problem', number=number)})"
    parts = []
    total = r.expect_passed + r.expect_failed
    if r.expect_failed:
        parts.append(f"{number(r.expect_failed)} of {number(total)} expectations not met")
    else:
        parts.append(f"{words.counted(total, 'expectation', number=number)} held")
    failing = r.n_failing
    if failing:
        parts.append(f"{words.counted(failing, 'unpinned finding', number=number)} at "
                     f"or above --fail-on {r.fail_on}")
    below = r.n_below
    if below:
        parts.append(f"{words.counted(below, 'finding', number=number)} below --fail-on")
    if r.pinned:
        parts.append(f"pinned {_counts(r.pinned, number)}")
    if r.ignored:
        parts.append(f"ignored {_counts(r.ignored, number)}")
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
    return [words.joined(*row[:3]) for row in _unmet_rows(u, indent)]


# a line in parts: what starts it (kept whole, on the first line), what follows it
# (kept whole too, on the first line when it fits), the rest, and the indent of the
# lines after the first when it wraps
_Row = tuple[str, str, str, str]


def _unmet_rows(u: Unmet, indent: str) -> list[_Row]:
    rows = [("what", "expected", "actual")] + [
        (visible(w), visible(e), visible(a)) for w, e, a in u.diffs]
    if len(rows) == 1:
        return [(indent, "", visible(u.message), indent + "  ")]
    w0 = max(len(r[0]) for r in rows)
    w1 = max(len(r[1]) for r in rows)
    hang = " " * (len(indent) + w0 + 2 + w1 + 2)  # under the `actual` column
    return [(f"{indent}{a:<{w0}}  {b:<{w1}} ", "", c, hang) for a, b, c in rows]


def flagged_title(f: Flagged) -> str:
    pinned = " not pinned by an expect" if f.pinnable else ""
    return f"{words.code(f.code, f.name)} [{f.severity}]{pinned}"


def flagged_text(f: Flagged) -> str:
    at = f"op {f.op}" + (f", ubatch {f.ubatch}" if f.ubatch is not None else "")
    return f"{visible(f.message)} ({at})"


def problem_text(p: Problem) -> str:
    return f"{visible(p.field)}: {visible(p.message)}"


def details(r: CheckResult, indent: str = "  ", number: Callable[[int], str] = words.count
            ) -> list[str]:
    """The lines under a result that did not pass: each problem, each unmet expect
    with its differences side by side, each failing finding at its op's line
    (`number` as `headline`'s)."""
    return [words.joined(*row[:3]) for row in _detail_rows(r, indent, number)]


def _detail_rows(r: CheckResult, indent: str,
                 number: Callable[[int], str] = words.count) -> list[_Row]:
    out: list[_Row] = []
    more = indent + "    "
    for p in r.problems:
        where = _where(p.file or r.path, p.line) + (f":{p.column}" if p.line and p.column
                                                    else "")
        out.append((f"{indent}{where}:", "", problem_text(p), more))
    for u in r.unmet:
        out.append((f"{indent}{_where(r.path, u.line)}:", "", f"{unmet_title(u)}:", more))
        out += _unmet_rows(u, indent + "    ")
    for f in r.failing:
        out.append((f"{indent}{_where(r.path, f.line)}:", "",
                    f"{flagged_title(f)}: {flagged_text(f)}", more))
    if r.n_failing > len(r.failing):
        left = words.counted(r.n_failing - len(r.failing), "more unpinned finding",
                             number=number)
        out.append((indent, "", f"... and {left} at or above --fail-on", more))
    return out


def _width(out: TextIO) -> int | None:
    """The columns a line of `out` may take: COLUMNS (a positive number) when set, else
    the terminal's when `out` is one; None (no wrapping) for a pipe without COLUMNS
    and for an --output file."""
    if out is not sys.stdout:
        return None
    if env_columns() is None and not stream_is_terminal(out):
        return None
    return console_width(out)


def _fit(row: _Row, width: int | None) -> str:
    """A row as its lines (`wording.fit`)."""
    return words.fit(*row, width)


def _result_row(r: CheckResult) -> _Row:
    """`PASS    path under engine: headline`: the path whole on the first line, `under
    engine:` whole after it, the headline under the path when it wraps."""
    head = f"{_LABEL[r.status]:<8}{visible(r.path)}"
    if r.engine:
        return (head, f"under {visible(r.engine)}:", headline(r), " " * 8)
    return (head + ":", "", headline(r), " " * 8)


def shown_text(s: Shown) -> str:
    """`cache-safe (x2, first at op 3), ...; not rep-once`: the versions that show a
    code on a trace, and those that do not."""
    by = ", ".join(f"{visible(e)} (x{words.count(n)}, first at op {op})" for e, n, op in s.by)
    return by + (f"; not {', '.join(visible(e) for e in s.not_by)}" if s.not_by else "")


def _shown_row(s: Shown) -> _Row:
    info = CODES.get(s.code)
    return (f"  {visible(s.path)}:", f"{words.code(s.code, info.name if info else '')}:",
            shown_text(s), " " * 6)


def write_check_text(out: TextIO, results: Iterable[CheckResult]) -> list[CheckResult]:
    """A line per result as it comes (details under a failure), then the summary line.
    Returns the results, for the exit code."""
    seen: list[CheckResult] = []
    width = _width(out)
    for r in results:
        seen.append(r)
        out.write(_fit(_result_row(r), width))
        if r.status in (FAIL, INVALID):
            out.write("".join(_fit(row, width) for row in _detail_rows(r, "  ")))
        out.flush()
    shown = by_version(seen)
    if shown:
        out.write("which versions show each finding:\n")
        out.write("".join(_fit(_shown_row(s), width) for s in shown))
    s = summary(seen)
    n = {k: words.count(v) for k, v in s.items()}
    out.write(_fit((f"checked {words.counted(s['runs'], 'run')} of "
                    f"{words.counted(s['traces'], 'trace')}:", "",
                    f"{n['passed']} passed, {n['failed']} failed, {n['invalid']} invalid",
                    "  "), width))
    return seen
