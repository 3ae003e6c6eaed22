"""The JSON output of `kpool check` (format: contracts/report_format.py, `CHECK`).

Owns: `check_document` (the results as the declared records, in order) and
`write_check_json`. Keys come from the declaration (`Record.make`), so the output
and `kpool schema check` cannot disagree. Text from the trace is written as it is:
JSON escapes what it must, and a reader shows it as it sees fit. Text from the command
line and the file system (paths, a problem's file and message, the engine asked for)
is written as `wording.unicode_path` writes it, as a report's path is: the bytes of a
name that is not UTF-8 as `\\xff`, never a lone surrogate a strict reader refuses.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, TextIO

from .. import __version__
from ..check import CheckResult, by_version, summary
from ..contracts.report_format import (
    CHECK,
    CHECK_DIFF,
    CHECK_FINDING,
    CHECK_RESULT,
    CHECK_SHOWN,
    CHECK_UNMET,
    CHECK_VERSION,
    PROBLEM,
    TOOL,
)
from ..wording import unicode_path
from .json_text import dumps


def result_record(r: CheckResult) -> dict[str, Any]:
    return CHECK_RESULT.make(
        path=unicode_path(r.path), engine=unicode_path(r.engine), status=r.status,
        unmet=[CHECK_UNMET.make(
            op=u.op, line=u.line, target=u.target, target_line=u.target_line,
            diffs=[CHECK_DIFF.make(what=w, expected=e, actual=a) for w, e, a in u.diffs],
            message=u.message) for u in r.unmet],
        findings=[CHECK_FINDING.make(
            code=f.code, name=f.name, severity=f.severity, op=f.op, line=f.line,
            ubatch=f.ubatch, message=f.message, fails=f.fails) for f in r.flagged],
        more_findings=r.more_flagged,
        problems=[PROBLEM.make(file=unicode_path(p.file), line=p.line, column=p.column,
                               field=p.field, message=unicode_path(p.message))
                  for p in r.problems],
        expectations={"passed": r.expect_passed, "failed": r.expect_failed},
        ubatches=r.ubatches,
        counts={"all": r.findings, "pinned": r.pinned, "ignored": r.ignored},
    )


def check_document(results: Iterable[CheckResult], fail_on: str) -> dict[str, Any]:
    rs = list(results)
    return CHECK.make(kpool_check=CHECK_VERSION,
                      tool=TOOL.make(name="kpool", version=__version__), fail_on=fail_on,
                      results=[result_record(r) for r in rs],
                      versions=[CHECK_SHOWN.make(
                          path=unicode_path(s.path), code=s.code,
                          by=[{"engine": unicode_path(e), "count": n, "first_op": op}
                              for e, n, op in s.by],
                          not_by=[unicode_path(e) for e in s.not_by])
                          for s in by_version(rs)],
                      summary=summary(rs))


def write_check_json(out: TextIO, results: Iterable[CheckResult], fail_on: str
                     ) -> list[CheckResult]:
    rs = list(results)
    out.write(dumps(check_document(rs, fail_on), indent=True) + "\n")
    return rs
