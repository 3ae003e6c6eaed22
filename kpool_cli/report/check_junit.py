"""The JUnit XML output of `kpool check` (and of `kpool replay --format junit`): one
test suite named for the command that ran (`kpool check`, `kpool replay`), one test
case per trace and engine (classname the trace file, name the engine); a failure
carries the difference (the text output's detail lines) and the type
`kpool.COMMAND.fail`, an invalid trace is an error of type `kpool.COMMAND.invalid`.

Owns: `write_check_junit`. The XML is written by `junitparser` (the optional extra
`ci`: `pip install 'kpool[ci]'`), a kept library that knows the schema CI servers
read; without it `MissingExtra` says how to install it. Every text goes through
`visible` first, so no control character (which XML 1.0 cannot hold) reaches it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TextIO

from ..check import FAIL, INVALID, CheckResult
from ..wording import visible
from .check_text import details, headline


class MissingExtra(Exception):
    """An output format needs a package that is not installed (exit 2)."""


def write_check_junit(out: TextIO, results: Iterable[CheckResult], command: str
                      ) -> list[CheckResult]:
    """`results` as one test suite of `kpool COMMAND` (`command`: the command that ran
    them, `check` or `replay`)."""
    try:
        from junitparser import Error, Failure, JUnitXml, TestCase, TestSuite
    except ImportError:
        raise MissingExtra("--output-format junit needs junitparser: "
                           "pip install 'kpool[ci]'") from None
    rs = list(results)
    suite = TestSuite(f"kpool {command}")
    for r in rs:
        case = TestCase(visible(r.engine) or "load", classname=visible(r.path))
        if r.status in (FAIL, INVALID):
            kind = Failure if r.status == FAIL else Error
            verdict = kind(headline(r, str), f"kpool.{command}.{r.status}")  # numbers bare
            verdict.text = "\n".join(details(r, indent="", number=str))
            case.result = [verdict]
        suite.add_testcase(case)
    suite.update_statistics()
    xml = JUnitXml()
    xml.add_testsuite(suite)
    xml.update_statistics()
    out.write('<?xml version="1.0" encoding="utf-8"?>\n')
    out.write(xml.tostring().decode("utf-8"))
    out.write("\n")
    return rs
