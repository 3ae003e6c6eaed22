"""The output formats of `kpool check` (and of `kpool replay --format` for CI): which
writer writes each (their names are `check.OUTPUT_FORMATS` and `check.CI_FORMATS`).

Owns: `write_check`. Each writer lives in its own module (`check_text`, `check_json`,
`check_junit`, `check_github`, `check_sarif`), takes the stream of `CheckResult`s and
returns the results it wrote; none of them counts or decides the exit code
(`check.exit_code` does).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TextIO

from ..check import CheckResult


def write_check(out: TextIO, fmt: str, results: Iterable[CheckResult],
                fail_on: str, command: str) -> list[CheckResult]:
    """Write `results` to `out` in `fmt`, as the output of `kpool COMMAND` (`command`:
    `check`, or `replay` for its CI formats; JUnit names its suite so). Raises
    `check_junit.MissingExtra` when the format needs a package that is not installed."""
    from .check_github import write_check_github
    from .check_json import write_check_json
    from .check_junit import write_check_junit
    from .check_sarif import write_check_sarif
    from .check_text import write_check_text

    if fmt == "json":
        return write_check_json(out, results, fail_on)
    if fmt == "junit":
        return write_check_junit(out, results, command)
    if fmt == "github":
        return write_check_github(out, results)
    if fmt == "sarif":
        return write_check_sarif(out, results)
    return write_check_text(out, results)
