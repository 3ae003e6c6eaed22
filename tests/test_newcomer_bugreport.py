"""Surprises of a llama.cpp developer who turns a bug report (`--parallel 4`, a shared
system prompt, a slot cleared and reused) into a trace by hand, replays it, looks at
its pictures, plugs in a patched build and gates it in CI: a seq id past an
`n_seq_max` the trace left at its default (1) said neither that it was the default
nor what to set, and wrote the ids as `0..3`, a half-open range everywhere else; an
unknown key with no close name (`from`, `parallel`) did not say which keys there
are; an op written as its name alone (`- clear`) was told only that an op is a
mapping; a tab in the indentation got libyaml's words alone; a plug-in named by its
file (`mypatch/engine.py:Candidate`) was sent looking for `mypatch/engine/py.py`, and
a misspelt version in a plug-in got no suggestion; the `--svg` of a long replay
opened shrunk to the window's height (a viewBox and no size); the page's cell map
coloured sequences with no key; `kpool replay traces/` answered in click's words
alone; a settings list written as one string did not say how to write it; and the
docs counted three shipped versions, listed three names for a trace's `engine:` and
gave `1` for findings as every command's exit status.

Each test runs kpool as a user does (in this process: `kpool_here`) or calls the
function whose words the user reads, and asserts what they see.
"""

from __future__ import annotations

import re
import textwrap
import tracemalloc
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from test_untrusted import RACE, ROOT, kpool_here, write

from kpool_cli.cli.main import COMMANDS
from kpool_cli.report.trace_page import EMPTY_COLOUR, SEQ_COLOURS, SHARED_COLOUR
from kpool_cli.trace.load import TraceError, load_trace_text
from kpool_cli.versions import VERSIONS, VersionError, load_version

DOCS = ROOT / "docs"

# the bug report's first ops, as a developer writes them from docs/TRACE_FORMAT.md
SLOTS = """\
    kpool_trace: 1
    name: parallel4-slot-reuse
    cache:
      kv_size: 64
      kpool: 4{n_seq_max}
    ops:
      - decode: {{seq: 0, pos: 0..8}}
      - seq_cp: {{src: 0, dst: {dst}}}
"""


def _slots(dst: int, n_seq_max: str = "") -> str:
    return textwrap.dedent(SLOTS).format(dst=dst, n_seq_max=n_seq_max)


def _problems(text: str) -> list[str]:
    with pytest.raises(TraceError) as info:
        load_trace_text(text, "bug.yaml")
    return [str(p) for p in info.value.problems]


# -- the trace ---------------------------------------------------------------------------


def test_a_seq_id_past_the_default_n_seq_max_says_it_is_the_default_and_what_to_set():
    """`--parallel 4` written without `n_seq_max`: seq 1 is out of range because the
    default is 1; the message says so, and the value that admits seq 1."""
    (p,) = _problems(_slots(1))
    assert p == ("bug.yaml:8:27: ops[1].seq_cp.dst: seq id 1 is out of range: "
                 "cache.n_seq_max is not set, so it is 1 (its default) and the only seq id "
                 "is 0; set cache.n_seq_max (llama-server's --parallel) to 2 or more")
    # the fix it names loads
    load_trace_text(_slots(1, "\n  n_seq_max: 2"), "bug.yaml")


def test_a_seq_id_past_a_given_n_seq_max_names_the_ids_in_words_not_as_a_range():
    """With n_seq_max 4 the ids are 0, 1, 2, 3: `0..3` reads as 0, 1, 2 where every
    range kpool prints is half-open."""
    (p,) = _problems(_slots(4, "\n  n_seq_max: 4"))
    assert p.endswith("seq id 4 is out of range: cache.n_seq_max is 4, so seq ids are 0 to 3")
    assert "0..3" not in p and "set cache.n_seq_max" not in p  # it was set: no default


def test_an_unknown_key_with_no_close_name_lists_the_keys_there_are():
    text = _slots(1, "\n  n_seq_max: 4\n  parallel: 4") + "  - seq_rm: {seq: 2, from: 8}\n"
    ps = _problems(text)
    assert ps == [
        "bug.yaml:7:3: cache.parallel: unknown key 'parallel'; known keys: kv_size, kpool, "
        "n_seq_max, unified, by_order, n_ubatch, n_batch, n_embd, n_rs_seq",
        "bug.yaml:11:22: ops[2].seq_rm.from: unknown key 'from'; known keys: seq, p0, p1",
    ]


@pytest.mark.parametrize(("op", "line"), [
    ("clear", "- clear: {}"),
    ("seq_keep", "- seq_keep: {seq: ...}"),
    ("state_read", "- state_read: {seq: ..., slot: ...}"),
    ("decode", "- decode: {seq: ..., pos: ...}"),
    ("note", '- note: "..."'),
])
def test_an_op_written_as_its_name_alone_is_told_how_to_write_it(op: str, line: str):
    (p,) = _problems(_slots(1, "\n  n_seq_max: 2") + f"  - {op}\n")
    assert p.startswith("bug.yaml:10:5: ops[2]: an op is a mapping with one key")
    assert p.endswith(f"got a string ({op!r}): write `{line}`")


def test_the_line_suggested_for_a_bare_clear_loads():
    load_trace_text(_slots(1, "\n  n_seq_max: 2") + "  - clear: {}\n", "bug.yaml")


def test_a_tab_in_the_indentation_says_yaml_indents_with_spaces():
    (p,) = _problems("kpool_trace: 1\ncache:\n\tkv_size: 64\n")
    assert p.startswith("bug.yaml:3:1: <yaml>: invalid YAML: ")
    assert p.endswith("(a tab: YAML indents with spaces)")
    # a YAML error that is not at a tab says nothing of tabs
    (q,) = _problems("kpool_trace: 1\ncache: {kv_size: 64\n")
    assert "tab" not in q


def test_the_tab_of_a_long_file_is_found_without_a_string_a_line():
    """The tab was looked for by splitting the text at every line before it: a 64 MB
    file of short lines then a tab peaked at 1.6 GB (a string a line), ten times what
    the same file costs without the look. The look holds no copy of the text now: a
    million lines of `##` cost the text's size at the most, not 20 times it."""
    text = "##\n" * 1_000_000 + "kpool_trace: 1\ncache:\n\tkv_size: 64\n"
    tracemalloc.start()
    try:
        (p,) = _problems(text)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert p.startswith("bug.yaml:1000003:1: <yaml>: invalid YAML: ")
    assert p.endswith("(a tab: YAML indents with spaces)")
    assert peak < 2 * len(text), peak / len(text)


# -- the plug-in ---------------------------------------------------------------------------


@pytest.mark.parametrize(("spec", "words"), [
    ("mypatch/engine.py:Candidate",
     "--engine mypatch.engine:Candidate, with PYTHONPATH=. in the folder that holds mypatch/"),
    ("./mypatch/engine.py:Candidate",
     "--engine mypatch.engine:Candidate, with PYTHONPATH=. in the folder that holds mypatch/"),
    ("/src/fork/mypatch/engine.py:Candidate",
     "--engine engine:Candidate, with PYTHONPATH=/src/fork/mypatch"),
    # no `/`: the import is tried, and fails on its package `kpool_no_such_plugin`
    ("kpool_no_such_plugin.py:Candidate",
     "--engine kpool_no_such_plugin:Candidate, with PYTHONPATH=. in the folder that holds "
     "kpool_no_such_plugin.py"),
])
def test_a_plugin_named_by_its_file_is_told_its_module_name(spec: str, words: str):
    with pytest.raises(VersionError) as info:
        load_version(spec)
    msg = str(info.value)
    assert msg == f"engine {spec!r}: name the module, not its file: {words}"
    assert "py.py" not in msg


@pytest.mark.parametrize(("spec", "words"), [
    # a package's own file is the package, a folder that holds it
    ("mypatch/__init__.py:Candidate",
     "--engine mypatch:Candidate, with PYTHONPATH=. in the folder that holds mypatch/"),
    ("mypatch/:Candidate",
     "--engine mypatch:Candidate, with PYTHONPATH=. in the folder that holds mypatch/"),
    # no dotted name imports these: none is made up (`my-patch.engine`, `engine.txt`,
    # `:Candidate` for the root folder)
    ("my-patch/engine.py:Candidate", None),
    ("a.b/engine.py:Candidate", None),
    ("mypatch/engine.txt:Candidate", None),
    ("/:Candidate", None),
])
def test_a_plugin_file_whose_path_names_no_module_is_told_how_modules_are_named(
        spec: str, words: str | None):
    """`my-patch/engine.py:Candidate` was told `--engine my-patch.engine:Candidate`,
    `/:X` `--engine :X`, and `mypatch/__init__.py` the module `mypatch.__init__` in
    `mypatch/`; a module's dotted name is made of identifiers, and a package is named
    by its folder."""
    with pytest.raises(VersionError) as info:
        load_version(spec)
    general = ("--engine package.module:Candidate, each part of the module's dotted name "
               "a Python identifier, with the folder that holds its top package on "
               "PYTHONPATH")
    assert str(info.value) == (f"engine {spec!r}: name the module, not its file: "
                               f"{words or general}")


def test_a_misspelt_version_in_a_plugin_is_suggested_from_those_it_holds(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    write(tmp_path / "kpool_bugreport_plugin.py", """\
        from dataclasses import replace
        from kpool_cli.versions import REP_ONCE

        Candidate = replace(REP_ONCE, name="rep-once-no-rep-gen", mark_once_per_rep=False)
        helper = 3
        """)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(VersionError) as info:
        load_version("kpool_bugreport_plugin:Candidat")
    assert str(info.value) == (
        "engine 'kpool_bugreport_plugin:Candidat': module 'kpool_bugreport_plugin' has no "
        "attribute 'Candidat' (did you mean 'Candidate'?); its EngineVersion objects: "
        "REP_ONCE, Candidate")
    assert load_version("kpool_bugreport_plugin:Candidate").name == "rep-once-no-rep-gen"


# -- the pictures --------------------------------------------------------------------------


def _size_and_box(svg: str) -> tuple[tuple[str, str], list[str]]:
    root = ET.fromstring(svg)
    return (root.get("width"), root.get("height")), root.get("viewBox", "").split()


def test_the_svg_of_a_replay_opens_at_its_own_size(tmp_path: Path):
    """Without a width and height a browser fits the whole run into its window: a
    replay of 2,000 px shows at a third of its size in a window of 700."""
    svg = tmp_path / "race.svg"
    r = kpool_here("replay", str(RACE), "--engine", "cache-safe", "--svg", str(svg),
                   "--backend", "none", "-o", str(tmp_path / "view.txt"))
    assert r.returncode == 1, r.stderr
    (width, height), box = _size_and_box(svg.read_text(encoding="utf-8"))
    assert box[:2] == ["0", "0"] and (width, height) == (box[2], box[3])
    assert float(height) > 1000  # a long view: the size is what keeps it readable


@pytest.mark.parametrize("image", ["race-cache-safe.svg", "race-rep-once.svg"])
def test_the_readme_svgs_are_made_with_their_size(image: str):
    (width, height), box = _size_and_box((DOCS / "img" / image).read_text(encoding="utf-8"))
    assert (width, height) == (box[2], box[3])


@pytest.mark.parametrize(("n_seq_max", "keyed", "more"), [(4, 4, ""), (12, 10, "seq 10 and up")])
def test_the_page_keys_the_colours_of_its_cell_map(tmp_path: Path, n_seq_max: int, keyed: int,
                                                   more: str):
    t = tmp_path / "t.yaml"
    t.write_text(_slots(1, f"\n  n_seq_max: {n_seq_max}"))
    page = tmp_path / "t.html"
    r = kpool_here("replay", str(t), "--html", str(page), "--backend", "none",
                   "-o", str(tmp_path / "view.txt"))
    assert r.returncode == 0, r.stderr
    (key,) = re.findall(r'<p class="key">(.*?)</p>', page.read_text(encoding="utf-8"))
    labelled = re.findall(r"background:(#[0-9a-f]{6});[^>]*></span>([^<]+)</span>", key)
    assert labelled == ([(SEQ_COLOURS[s], f"seq {s}") for s in range(keyed)]
                        + [(SHARED_COLOUR, "shared"), (EMPTY_COLOUR, "empty")])
    assert (more in key) if more else "and up" not in key


# -- the command line and the settings ------------------------------------------------------


def test_a_folder_given_to_replay_names_the_commands_that_take_one(tmp_path: Path):
    """The commands named are those that run on a folder of traces: `kpool diff
    traces/` does (the README's second example), and was left out."""
    (tmp_path / "traces").mkdir()
    (tmp_path / "traces" / "race.yaml").write_text(RACE.read_text())
    r = kpool_here("replay", "traces", cwd=tmp_path)
    assert r.returncode == 2 and r.stdout == ""
    said = r.stderr.replace("\n", " ")
    assert ("'traces' is a folder: kpool replay takes trace files (its *.yaml); "
            "kpool check, kpool diff and kpool validate take a folder") in said
    take = [c for c in COMMANDS
            if kpool_here(c, "traces", "--backend", "none", cwd=tmp_path).returncode in (0, 1)
            or kpool_here(c, "traces", cwd=tmp_path).returncode in (0, 1)]
    assert take == ["check", "diff", "validate"]
    assert re.findall(r"kpool (\w+)", said.partition("; ")[2]) == take


def test_a_settings_list_written_as_one_string_says_how_to_write_it(tmp_path: Path):
    write(tmp_path / "pyproject.toml", """\
        [tool.kpool]
        engines = "rep-once"
        """)
    r = kpool_here("check", str(RACE), "--backend", "none", cwd=tmp_path)
    assert r.returncode == 2
    assert r.stderr.replace("\n", " ").startswith(
        f"kpool: {(tmp_path / 'pyproject.toml').resolve()}:2: tool.kpool.engines: expected a "
        "list of engine names, got a string ('rep-once'): write a list, even of one: "
        "['rep-once']"), r.stderr
    # the line it gives is TOML kpool takes
    (tmp_path / "pyproject.toml").write_text("[tool.kpool]\nengines = ['rep-once']\n")
    r = kpool_here("check", str(RACE), "--backend", "none", cwd=tmp_path)
    assert r.returncode == 0, r.stderr


# -- the docs ----------------------------------------------------------------------------


def test_no_doc_counts_the_shipped_versions_wrong():
    said = {(path.name, m.group(1))
            for path in (ROOT / "README.md", *DOCS.glob("*.md"))
            for m in re.finditer(r"the (\w+) engine versions kpool ships",
                                 path.read_text(encoding="utf-8"))}
    numbers = {"two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7}
    assert [(f, n) for f, n in said if numbers.get(n) != len(VERSIONS)] == []


def test_the_trace_formats_engine_names_are_all_or_the_bases():
    """A trace's `engine:` takes every shipped version: a list of some of them reads as
    the whole choice."""
    page = (DOCS / "TRACE_FORMAT.md").read_text(encoding="utf-8")
    (bullet,) = re.findall(r"^- `engine` names .*?(?=^- )", page, flags=re.M | re.S)
    named = set(re.findall(r"`([a-z0-9+-]+)`", bullet)) & set(VERSIONS)
    assert named == set(VERSIONS) or named <= {"cache-safe", "rep-once"}, named


def test_the_commands_the_trace_format_gives_exit_1_for_findings_do(tmp_path: Path):
    """docs/TRACE_FORMAT.md names the commands whose 1 means findings; each does, on
    an unpinned race, and `validate` (which never exits 1) is not among them."""
    page = (DOCS / "TRACE_FORMAT.md").read_text(encoding="utf-8")
    (said,) = re.findall(r"Exit status of (.+?): 0 pass, 1 findings", page)
    commands = re.findall(r"`(\w+)`", said)
    assert commands and "validate" not in commands, said
    race = tmp_path / "race.yaml"  # the shared prompt's pools, scattered twice: KP001
    race.write_text(_slots(1, "\n  n_seq_max: 2")
                    + "  - decode: {tokens: [{pos: 8, seq: 0}, {pos: 8, seq: 1}]}\n")
    for command in commands:
        r = kpool_here(command, str(race), "--engine", "cache-safe", "--backend", "none")
        assert r.returncode == 1, (command, r.stdout, r.stderr)
    assert kpool_here("validate", str(race)).returncode == 0
