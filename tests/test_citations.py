"""Every citation of the specification resolves to a heading of docs/ (DESIGN.md
"Citations"): a newcomer who clones the repository can follow each one.

What counts as a citation, in every text file of kpool_cli/, tests/, docs/,
benchmarks/ and in README.md (a citation may wrap across lines, comment markers
included; `\\u00a7` in a TOML or JSON file is a `§`):

- `§N` (`ENGINE.md §N`, and any bare `§N`: in this repository `§` always means a
  section of ENGINE.md; `§N.M` too; ranges `§2-§4`, `§2-3` and lists `§2/§3`,
  `§7, §8` are read number by number): docs/ENGINE.md has a heading `## N.`
  (`§N.M`: `### N.M`); `§N "Name"` or `§N, "Name"` also needs a heading containing
  Name inside section N;
- `TRACE_FORMAT.md "Name"`, `TRACE_FORMAT.md, "Name"`, `TRACE_FORMAT.md ("Name")`
  and the same of DESIGN.md: docs/<file> has a heading containing Name (a colon,
  `TRACE_FORMAT.md: "..."`, quotes the page's words instead, and is not checked);
- `ENGINE-NOTES.md, "topic"`: docs/ENGINE-NOTES.md has a table row whose first cell
  is the topic (backticks dropped), or a line that starts with it;
- any mention of ENGINE.md, TRACE_FORMAT.md or DESIGN.md: the file is in docs/;
- none of STYLE.md (it is not part of the repository: its conventions are
  DESIGN.md's), except as a quoted string literal naming the file (a test that
  makes sure no help text names it); none of `../shared` or `shared/docs`,
  `shared/seed` (files outside the repository).

This file is not scanned: it holds the fabricated citations that show the checker
reports what it is for.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
SCANNED_DIRS = ("kpool_cli", "tests", "docs", "benchmarks")
SCANNED_FILES = ("README.md",)
SKIPPED_DIRS = {"__pycache__", ".venv", ".git", ".pytest_cache", ".mypy_cache"}
THIS = Path(__file__).resolve()

GAP = r"[\s#]*"  # between the parts of a citation: spaces, line breaks, comment markers
NAME = r'"([A-Za-z][^"]{0,100}?)"'  # a quoted section name
SECTION = re.compile(r"§\s?(\d+)(?:\.(\d+))?(?:\s?[-–]\s?§?\s?(\d+))?")
NAMED_SECTION = re.compile(r"§\s?(\d+)(?:\.\d+)?" + GAP + "," + "?" + GAP + NAME)
NAMED_PAGE = re.compile(r"(TRACE_FORMAT|DESIGN)\.md" + GAP + r"[,(]?" + GAP + NAME)
NOTES_ROW = re.compile(r"ENGINE-NOTES\.md" + GAP + "," + GAP + r'"([^"]{1,120}?)"')
MENTION = re.compile(r"(ENGINE|TRACE_FORMAT|DESIGN)\.md(?!\w)")
STYLE = re.compile(r"STYLE\.md")
# no \b before a name: re then tries every position, ten times slower (the caller checks)
OUTSIDE = (re.compile(r"\.\./shared\b"), re.compile(r"shared/(?:docs|seed)\b"))
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def _plain(text: str) -> str:
    """A name as written in a citation or a heading: one space between words, comment
    markers of a wrapped line and backticks dropped."""
    return " ".join(text.replace("`", "").replace("#", " ").split())


def _in_word(text: str, start: int) -> bool:
    """Whether the match at `start` continues a word (`MY_DESIGN.md` is not DESIGN.md)."""
    return start > 0 and (text[start - 1].isalnum() or text[start - 1] == "_")


def headings(text: str) -> list[tuple[int, str]]:
    """The Markdown headings of `text` as (level, title), outside fenced code."""
    out: list[tuple[int, str]] = []
    fenced = False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        m = None if fenced else HEADING.match(line)
        if m:
            out.append((len(m.group(1)), m.group(2)))
    return out


class Docs:
    """What the citations are checked against: docs/'s headings and ENGINE-NOTES' rows."""

    def __init__(self, docs: Path = DOCS) -> None:
        self.files = {p.name for p in docs.glob("*.md")}
        self.headings = {name: headings((docs / name).read_text(encoding="utf-8"))
                         for name in self.files}
        # ENGINE.md: section N -> the titles of the headings inside it (its own first)
        self.sections: dict[str, list[str]] = {}
        current: str | None = None
        for level, title in self.headings.get("ENGINE.md", []):
            m = re.match(r"(\d+(?:\.\d+)?)\.?\s", title)
            if m and level == 2 + m.group(1).count("."):
                current = m.group(1)
                self.sections[current] = [title]
            elif level == 2:
                current = None
            if current is not None and level > 2:
                self.sections[current].append(title)
                if "." in current:  # a subsection's headings belong to its section too
                    self.sections[current.split(".")[0]].append(title)
        notes = (docs / "ENGINE-NOTES.md").read_text(encoding="utf-8") \
            if "ENGINE-NOTES.md" in self.files else ""
        self.note_rows = {_plain(m.group(1)) for m in
                          re.finditer(r"^\|\s*([^|]+?)\s*\|", notes, re.M)}
        self.note_lines = [_plain(line.lstrip("-* ")) for line in notes.splitlines()]

    def has_heading(self, page: str, name: str) -> bool:
        return any(_plain(name) in _plain(title) for _, title in self.headings.get(page, []))


def check_text(path: str, text: str, docs: Docs) -> list[str]:
    """The citations of one file's text that do not resolve, each as
    `path:line: what was written: why`."""
    text = text.replace("\\u00a7", "§")
    problems: list[str] = []

    def report(start: int, cited: str, why: str) -> None:
        line = text.count("\n", 0, start) + 1
        problems.append(f"{path}:{line}: {' '.join(cited.split())}: {why}")

    has_section, has_page = "§" in text, ".md" in text
    for m in SECTION.finditer(text) if has_section else ():
        first = m.group(1)
        if m.group(2) is not None:
            wanted = [f"{first}.{m.group(2)}"]
        elif m.group(3) is not None:
            wanted = [str(n) for n in range(int(first), int(m.group(3)) + 1)] or [first]
        else:
            wanted = [first]
        for n in wanted:
            if n not in docs.sections:
                report(m.start(), m.group(0), f"docs/ENGINE.md has no section {n}")
    for m in NAMED_SECTION.finditer(text) if has_section else ():
        n, name = m.group(1), _plain(m.group(2))
        titles = docs.sections.get(n, [])
        if n in docs.sections and not any(name in _plain(t) for t in titles[1:]):
            report(m.start(), m.group(0), f'docs/ENGINE.md §{n} has no heading "{name}"')
    for m in NAMED_PAGE.finditer(text) if has_page else ():
        if _in_word(text, m.start()):
            continue
        page, name = f"{m.group(1)}.md", _plain(m.group(2))
        if page in docs.files and not docs.has_heading(page, name):
            report(m.start(), m.group(0), f'docs/{page} has no heading "{name}"')
    for m in NOTES_ROW.finditer(text) if has_page else ():
        topic = _plain(m.group(1))
        if topic not in docs.note_rows and not any(line.startswith(topic)
                                                   for line in docs.note_lines):
            report(m.start(), m.group(0), f'docs/ENGINE-NOTES.md has no row "{topic}"')
    for m in MENTION.finditer(text) if has_page else ():
        if not _in_word(text, m.start()) and f"{m.group(1)}.md" not in docs.files:
            report(m.start(), m.group(0), "no such file in docs/")
    for m in STYLE.finditer(text) if has_page else ():
        before, after = text[m.start() - 1:m.start()], text[m.end():m.end() + 1]
        if not (before == after and before in "'\"" and before):
            report(m.start(), m.group(0), 'STYLE.md is not in the repository: cite DESIGN.md '
                                          '"Section"')
    outside = OUTSIDE if "shared" in text else ()
    for m in (m for r in outside for m in r.finditer(text)):
        if m.group(0).startswith("shared") and (_in_word(text, m.start())
                                                or text[m.start() - 3:m.start()] == "../"):
            continue  # a word that ends in shared, or a ../shared reported already
        report(m.start(), m.group(0), "a file outside the repository: cite docs/ or llama.cpp")
    return problems


def scanned_files() -> list[Path]:
    out = [ROOT / name for name in SCANNED_FILES]
    for d in SCANNED_DIRS:
        for p in sorted((ROOT / d).rglob("*")):
            if p.is_file() and not SKIPPED_DIRS & set(p.relative_to(ROOT).parts) \
                    and p.resolve() != THIS:
                out.append(p)
    return out


def check_repository(docs: Docs) -> tuple[list[str], int]:
    """(problems, files read) over every scanned text file."""
    problems: list[str] = []
    n = 0
    for p in scanned_files():
        try:
            text = p.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # not text
        n += 1
        problems += check_text(str(p.relative_to(ROOT)), text, docs)
    return problems, n


# --- the repository ------------------------------------------------------------------


def test_every_citation_resolves() -> None:
    problems, n = check_repository(Docs())
    assert n > 150, n  # the scan found the repository's files
    assert not problems, "\n".join(problems)


def test_engine_md_keeps_its_section_numbers() -> None:
    """The code cites ENGINE.md by number: §1-§8, with these titles, in order."""
    want = ["1. What is being modelled", "2. The cells",
            "3. A decode: validation, ubatches, cells", "4. Staleness",
            "5. Layout update", "6. Marking", "7. The scatter plan",
            "8. What `kpool` adds: values and verdicts"]
    got = [t for level, t in Docs().headings["ENGINE.md"] if level == 2]
    assert got == want
    assert "The recurrent child" in Docs().sections["3"][1:]


def test_engine_md_lists_every_finding_code() -> None:
    """§8's table: every code of a rule module (kpool_cli/verdict/rules/), with its
    name and severity, and no other."""
    declared = set()
    for p in (ROOT / "kpool_cli" / "verdict" / "rules").glob("kp*.py"):
        m = re.search(r'Code\("(KP\d{3})", "([a-z-]+)", "(error|warning)"', p.read_text())
        assert m, p
        declared.add(m.groups())
    engine = (DOCS / "ENGINE.md").read_text(encoding="utf-8")
    table = set(re.findall(r"^\| (KP\d{3}) \| ([a-z-]+) \| (error|warning) \|", engine, re.M))
    assert table == declared
    assert len(declared) >= 8


def test_the_format_pages_examples_hold() -> None:
    """TRACE_FORMAT.md's trace examples load, and its report validates against `kpool
    schema report`."""
    import json

    import jsonschema

    from kpool_cli.contracts.report_format import report_schema
    from kpool_cli.trace.load import load_trace_text

    page = (DOCS / "TRACE_FORMAT.md").read_text(encoding="utf-8")
    traces = re.findall(r"```yaml\n(.*?)```", page, re.S)
    reports = re.findall(r"```json\n(.*?)```", page, re.S)
    assert len(traces) >= 2 and reports
    for t in traces:
        load_trace_text(t)
    for r in reports:
        jsonschema.validate(json.loads(r), report_schema())


# --- the checker reports what it is for ----------------------------------------------


def test_the_checker_reports_a_fabricated_citation() -> None:
    docs = Docs()
    text = ('# see ENGINE.md §9 and TRACE_FORMAT.md "Nope"\n'
            "x = 1  # ENGINE.md §2-§10\n"
            '"""(DESIGN.md, "Nowhere"); ENGINE.md §3 "The wrong child"; §6.1"""\n'
            'ENGINE-NOTES.md, "no such topic"; docs/STYLE.md §3; ../shared/docs/ENGINE.md\n')
    problems = check_text("fake.py", text, docs)
    want = [
        "fake.py:1: §9: docs/ENGINE.md has no section 9",
        'fake.py:1: TRACE_FORMAT.md "Nope": docs/TRACE_FORMAT.md has no heading "Nope"',
        "fake.py:2: §2-§10: docs/ENGINE.md has no section 9",
        "fake.py:2: §2-§10: docs/ENGINE.md has no section 10",
        "fake.py:3: §6.1: docs/ENGINE.md has no section 6.1",
        'fake.py:3: §3 "The wrong child": docs/ENGINE.md §3 has no heading "The wrong child"',
        'fake.py:3: DESIGN.md, "Nowhere": docs/DESIGN.md has no heading "Nowhere"',
        'fake.py:4: ENGINE-NOTES.md, "no such topic": docs/ENGINE-NOTES.md has no row '
        '"no such topic"',
    ]
    for w in want:
        assert w in problems, (w, problems)
    assert any(p.startswith("fake.py:4: STYLE.md:") for p in problems), problems
    assert any(p.startswith("fake.py:4: ../shared:") for p in problems), problems
    assert len(problems) == len(want) + 2, problems


def test_the_checker_accepts_the_forms_in_use() -> None:
    docs = Docs()
    text = ("# ENGINE.md\n#   §8): the counters; ENGINE.md §2/§3, §5-§7, §2-3; §5 step 2\n"
            'TRACE_FORMAT.md ("Report"), (TRACE_FORMAT.md,\n"Report"), '
            'TRACE_FORMAT.md "Trace" (cache block), TRACE_FORMAT.md: "Publish a schema"\n'
            '(DESIGN.md, "Data flow"); ENGINE.md §3 "The recurrent\n    # child"; '
            '§6, "Graph size of the new list"\n'
            'ENGINE-NOTES.md, "seq_add head"; ENGINE-NOTES.md, "Not followed, on purpose"\n'
            'for cited in ("ENGINE.md", "STYLE.md"): ...; \\u00a74\n')
    assert check_text("fine.py", text, docs) == []


def test_a_missing_page_is_reported(tmp_path: Path) -> None:
    (tmp_path / "ENGINE.md").write_text("# x\n\n## 1. What is being modelled\n")
    docs = Docs(tmp_path)
    problems = check_text("f.md", 'ENGINE.md §1; DESIGN.md "Data flow"\n', docs)
    assert problems == ["f.md:1: DESIGN.md: no such file in docs/"]
