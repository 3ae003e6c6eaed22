"""The SARIF 2.1.0 output of `kpool check` (for code scanning): one run of the tool
`kpool`, one rule per finding code of the registry (its name, summary, why it
matters and the whole `kpool explain` text), plus a rule for an unmet expectation
and one for an invalid trace; one result per problem, located at the trace file and
the line of the op behind it (a problem of an invalid trace at its line and column).

Owns: `sarif_log` and `write_check_sarif`. Levels: `error` for what fails the check
(an unmet expect, an unpinned finding at or above `--fail-on`, an invalid trace),
`warning` for an unpinned finding below it. Locations are URIs: a relative path as a
relative reference (percent-encoded), an absolute one as a `file:` URI. Validated in
the tests against the official SARIF 2.1.0 schema.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import quote

from .. import __version__
from ..check import CheckResult, exit_code
from ..verdict.codes import CODES
from ..verdict.explain import EXPLANATIONS, explain_text
from ..wording import unicode_path, visible
from .check_text import flagged_text, problem_text, unmet_text, unmet_title
from .json_text import dumps

SARIF_VERSION = "2.1.0"
SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
EXPECT_RULE = "expect-unmet"
INVALID_RULE = "invalid-trace"


def _rules() -> list[dict[str, Any]]:
    rules: list[dict[str, Any]] = [{
        "id": c.code,
        "name": c.name,
        "shortDescription": {"text": c.summary},
        "fullDescription": {"text": EXPLANATIONS[c.code].oneline},
        "help": {"text": explain_text(c.code)},
        "defaultConfiguration": {"level": c.severity},
        "properties": {"tags": ["kpool", c.severity]},
    } for c in CODES.values()]
    rules.append({
        "id": EXPECT_RULE, "name": "expect-unmet",
        "shortDescription": {"text": "An expect item of the trace did not hold"},
        "fullDescription": {"text": "The replay did not do what an expect item of the "
                            "trace says: the engine's behaviour changed, or the "
                            "expectation is wrong."},
        "defaultConfiguration": {"level": "error"},
    })
    rules.append({
        "id": INVALID_RULE, "name": "invalid-trace",
        "shortDescription": {"text": "The trace cannot be checked"},
        "fullDescription": {"text": "The trace does not load (a field, a type, a bound), "
                            "names an unknown engine, needs more memory than allowed, "
                            "or turned out invalid mid-replay."},
        "defaultConfiguration": {"level": "error"},
    })
    return rules


def uri(path: str) -> str:
    """The artifact's URI: a path's bytes percent-encoded, those of a name that is not
    UTF-8 included (the file system's bytes, `os.fsencode`)."""
    p = Path(path)
    if p.is_absolute():
        return p.as_uri()
    return quote(os.fsencode(p.as_posix()), safe="/")


def _location(path: str, line: int, column: int = 0) -> dict[str, Any]:
    """A result's place; `line` and `column` (1-based) are left out when 0 (unknown)."""
    phys: dict[str, Any] = {"artifactLocation": {"uri": uri(path)}}
    if line > 0:
        phys["region"] = {"startLine": line, **({"startColumn": column} if column > 0 else {})}
    return {"physicalLocation": phys}


def sarif_log(results: Iterable[CheckResult]) -> dict[str, Any]:
    rs = list(results)
    rules = _rules()
    index = {r["id"]: i for i, r in enumerate(rules)}
    out: list[dict[str, Any]] = []

    def add(rule: str, level: str, text: str, path: str, line: int, column: int = 0,
            **props: Any) -> None:
        out.append({"ruleId": rule, "ruleIndex": index[rule], "level": level,
                    "message": {"text": text}, "locations": [_location(path, line, column)],
                    "properties": props})

    for r in rs:
        engine = f" (under {visible(r.engine)})" if r.engine else ""
        for p in r.problems:
            add(INVALID_RULE, "error", problem_text(p), p.file or r.path, p.line, p.column,
                field=p.field)
        for u in r.unmet:
            add(EXPECT_RULE, "error", f"{unmet_title(u)}{engine}: {unmet_text(u)}", r.path,
                u.line, engine=unicode_path(r.engine), op=u.op, target_op=u.target,
                differences=[{"what": w, "expected": e, "actual": a} for w, e, a in u.diffs])
        for f in r.flagged:
            add(f.code, "error" if f.fails else "warning",
                f"{f.code} {f.name}{engine}: {flagged_text(f)}", r.path, f.line,
                engine=unicode_path(r.engine), op=f.op, ubatch=f.ubatch, severity=f.severity)
    code = exit_code(rs)
    return {
        "$schema": SARIF_SCHEMA,
        "version": SARIF_VERSION,
        "runs": [{
            "tool": {"driver": {"name": "kpool", "version": __version__, "rules": rules}},
            "invocations": [{"executionSuccessful": code != 2, "exitCode": code}],
            "results": out,
        }],
    }


def write_check_sarif(out: TextIO, results: Iterable[CheckResult]) -> list[CheckResult]:
    rs = list(results)
    out.write(dumps(sarif_log(rs), indent=True) + "\n")
    return rs
