"""The GitHub Actions output of `kpool check`: workflow commands that annotate the
trace file at the line of the op behind each problem.

Owns: `annotation_lines` and `write_check_github`. One line per annotation, in GitHub's
documented form `::error file=F,line=L,title=T::MESSAGE` (`::warning` for an
unpinned finding below `--fail-on`): an unmet `expect` at the expect's line, a
failing finding at the line of the op that raised it, a problem of an invalid trace
at its line and column. A passing run writes nothing.

Escaping is GitHub's (the Actions toolkit's `escapeData` / `escapeProperty`): in the
message `%`, CR and LF become `%25`, `%0D`, `%0A`; in a property also `:` and `,`
become `%3A`, `%2C`. Text is made `visible` first, so a trace's text cannot hide
escapes or start another command.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TextIO

from ..check import CheckResult
from ..wording import visible
from .check_text import flagged_text, flagged_title, problem_text, unmet_text, unmet_title


def escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def escape_property(text: str) -> str:
    return escape_data(text).replace(":", "%3A").replace(",", "%2C")


def command(level: str, file: str, line: int, title: str, message: str, column: int = 0
            ) -> str:
    """One annotation; `line` and `column` (1-based) are left out when 0 (unknown)."""
    props = [f"file={escape_property(visible(file))}"]
    if line > 0:
        props.append(f"line={line}")
        if column > 0:
            props.append(f"col={column}")
    props.append(f"title={escape_property(title)}")
    return f"::{level} {','.join(props)}::{escape_data(message)}"


def annotation_lines(r: CheckResult) -> Iterator[str]:
    """The annotation lines of one result."""
    engine = f" under {visible(r.engine)}" if r.engine else ""
    for p in r.problems:
        yield command("error", p.file or r.path, p.line, "kpool: invalid trace",
                      problem_text(p), p.column)
    for u in r.unmet:
        yield command("error", r.path, u.line, f"kpool{engine}: {unmet_title(u)}",
                      unmet_text(u))
    for f in r.flagged:
        yield command("error" if f.fails else "warning", r.path, f.line,
                      f"kpool{engine}: {flagged_title(f)}", flagged_text(f))


def write_check_github(out: TextIO, results: Iterable[CheckResult]) -> list[CheckResult]:
    rs = []
    for r in results:
        rs.append(r)
        out.write("".join(a + "\n" for a in annotation_lines(r)))
    return rs
