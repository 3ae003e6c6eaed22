"""Settings files (`kpool_cli/settings.py`): discovery from a folder upwards, which file
wins, every key's effect, per-path ignores, and every refusal naming its file and the
line of the offending key."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from kpool_cli.settings import (
    KEYS,
    MAX_BYTES,
    MAX_JOBS,
    NO_SETTINGS,
    OUTPUT_FORMATS,
    Glob,
    Settings,
    SettingsError,
    load_settings,
)


def _write(folder: Path, name: str, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(text)
    return path


def _error(folder: Path) -> SettingsError:
    with pytest.raises(SettingsError) as e:
        load_settings(folder)
    return e.value


def _has_settings_above(folder: Path) -> bool:
    for d in folder.resolve().parents:
        if (d / "kpool.toml").is_file():
            return True
        py = d / "pyproject.toml"
        if py.is_file() and "kpool" in py.read_text(errors="replace"):
            return True
    return False


# -- discovery -----------------------------------------------------------------------------

def test_found_from_a_folder_below(tmp_path: Path):
    py = _write(tmp_path / "a", "pyproject.toml", "[project]\nname = 'x'\n[tool.kpool]\njobs = 3\n")
    deep = tmp_path / "a" / "b" / "c"
    deep.mkdir(parents=True)
    s = load_settings(deep)
    assert s.source == py.resolve()
    assert s.jobs == 3


def test_a_file_starts_from_its_folder(tmp_path: Path):
    k = _write(tmp_path, "kpool.toml", "jobs = 4\n")
    trace = _write(tmp_path / "traces", "t.yaml", "kpool_trace: 1\n")
    assert load_settings(trace).source == k.resolve()


def test_kpool_toml_wins_in_one_folder(tmp_path: Path):
    _write(tmp_path, "pyproject.toml", "[tool.kpool]\njobs = 2\n")
    k = _write(tmp_path, "kpool.toml", "jobs = 5\n")
    s = load_settings(tmp_path)
    assert (s.source, s.jobs) == (k.resolve(), 5)


def test_the_nearest_folder_wins(tmp_path: Path):
    _write(tmp_path, "kpool.toml", "jobs = 5\n")
    py = _write(tmp_path / "sub", "pyproject.toml", "[tool.kpool]\njobs = 2\n")
    s = load_settings(tmp_path / "sub")
    assert (s.source, s.jobs) == (py.resolve(), 2)


def test_a_pyproject_without_the_table_is_passed_over(tmp_path: Path):
    k = _write(tmp_path, "kpool.toml", "jobs = 7\n")
    _write(tmp_path / "sub", "pyproject.toml",
           "[tool.ruff]\nline-length = 100\n[tool.kpoolish]\njobs = 2\n")
    s = load_settings(tmp_path / "sub")
    assert (s.source, s.jobs) == (k.resolve(), 7)


def test_nothing_found(tmp_path: Path):
    if _has_settings_above(tmp_path):
        pytest.skip("a settings file above the temporary folder")
    _write(tmp_path, "pyproject.toml", "[tool.ruff]\n")
    assert load_settings(tmp_path) == NO_SETTINGS
    assert NO_SETTINGS.ignored_for(tmp_path / "t.yaml") == frozenset()


def test_no_config_reads_nothing(tmp_path: Path):
    _write(tmp_path, "kpool.toml", "this is not toml\n")
    assert load_settings(tmp_path, no_config=True) == NO_SETTINGS
    with pytest.raises(SettingsError):
        load_settings(tmp_path)


# -- values --------------------------------------------------------------------------------

FULL = """\
engines = ["rep-once", "cache-safe", "tail-truncate"]
fail-on = "warning"
ignore = ["KP004", "KP002", "KP004"]
output-format = "github"
jobs = 2

[per-file-ignores]
"traces/legacy/*.yaml" = ["KP001"]
"big-*.yaml" = ["KP003", "KP001"]
"""


def test_every_key_takes_effect(tmp_path: Path):
    k = _write(tmp_path, "kpool.toml", FULL)
    assert load_settings(tmp_path) == Settings(
        source=k.resolve(),
        engines=("rep-once", "cache-safe", "tail-truncate"),
        fail_on="warning",
        ignore=("KP004", "KP002"),
        per_path_ignore=(("traces/legacy/*.yaml", ("KP001",)),
                         ("big-*.yaml", ("KP003", "KP001"))),
        output_format="github",
        jobs=2,
    )


def test_the_same_keys_in_pyproject(tmp_path: Path):
    body = FULL.replace("[per-file-ignores]", "[tool.kpool.per-file-ignores]")
    py = _write(tmp_path, "pyproject.toml", "[project]\nname = 'x'\n\n[tool.kpool]\n" + body)
    s = load_settings(tmp_path)
    assert s.source == py.resolve()
    assert s.fail_on == "warning" and s.jobs == 2 and s.output_format == "github"
    assert s.per_path_ignore[0] == ("traces/legacy/*.yaml", ("KP001",))


def test_an_empty_table_says_nothing(tmp_path: Path):
    py = _write(tmp_path, "pyproject.toml", "[tool.kpool]\n")
    s = load_settings(tmp_path)
    assert s == Settings(source=py.resolve(), engines=None, fail_on=None, ignore=(),
                         per_path_ignore=(), output_format=None, jobs=None)


def test_ignored_for(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    _write(tmp_path, "kpool.toml", FULL + '"**/deep/*.yml" = ["KP005"]\n')
    s = load_settings(tmp_path)
    base = frozenset({"KP004", "KP002"})
    legacy = tmp_path / "traces" / "legacy"
    assert s.ignored_for(legacy / "a.yaml") == base | {"KP001"}
    # `*` stays in its folder; the glob is anchored at the settings file's folder
    assert s.ignored_for(legacy / "old" / "a.yaml") == base
    assert s.ignored_for(tmp_path / "x" / "traces" / "legacy" / "a.yaml") == base
    assert s.ignored_for(tmp_path / "traces" / "a.yaml") == base
    # a glob without `/` matches the file name in any folder, even outside the folder
    assert s.ignored_for(tmp_path / "x" / "big-1.yaml") == base | {"KP001", "KP003"}
    assert s.ignored_for(tmp_path.parent / "big-1.yaml") == base | {"KP001", "KP003"}
    assert s.ignored_for(tmp_path / "x" / "notbig-1.yaml") == base
    # `**/` spans any number of folders, none included
    assert s.ignored_for(tmp_path / "deep" / "t.yml") == base | {"KP005"}
    assert s.ignored_for(tmp_path / "a" / "b" / "deep" / "t.yml") == base | {"KP005"}
    assert s.ignored_for(tmp_path / "a" / "deep" / "x" / "t.yml") == base
    # a linked trace is matched by its own name, not its target's
    legacy.mkdir(parents=True)
    _write(tmp_path / "elsewhere", "t.yaml", "")  # makes its folder
    (legacy / "link.yaml").symlink_to(tmp_path / "elsewhere" / "t.yaml")
    assert s.ignored_for(legacy / "link.yaml") == base | {"KP001"}
    # a relative path is the current folder's
    monkeypatch.chdir(tmp_path / "..")
    rel = Path(tmp_path.name) / "traces" / "legacy" / "a.yaml"
    assert s.ignored_for(rel) == base | {"KP001"}


@pytest.mark.parametrize(("glob", "path", "matches"), [
    ("a?.yaml", "ab.yaml", True),
    ("a?.yaml", "a/.yaml", False),
    ("[ab]*.yaml", "b1.yaml", True),
    ("[!ab]*.yaml", "c1.yaml", True),
    ("[!ab]*.yaml", "a1.yaml", False),
    ("t/**", "t/x/y.yaml", True),
    ("a.yaml", "aXyaml", False),      # `.` is literal
    ("[x", "[x", True),               # an unclosed class is literal
    ("[^a]", "^", True),              # `^` and `[` in a class are themselves
    ("[^a]", "b", False),
    ("[[]x", "[x", True),
])
def test_glob(glob: str, path: str, matches: bool):
    assert Glob.of(glob).fullmatch(path) is matches


@pytest.mark.parametrize(("glob", "path", "matches"), [
    ("**/x.yaml", "x.yaml", True),     # `**/` may match nothing
    ("**/x.yaml", "a/b/x.yaml", True),
    ("**/x.yaml", "ax.yaml", False),   # or a run ending in `/`
    ("a/**/b", "a/b", True),
    ("a/**/b", "a/x/y/b", True),
    ("a/**", "a/", True),
    ("*.yaml", "a/b.yaml", False),     # `*` stays in its segment
    ("**.yaml", "a/b.yaml", True),     # `**` does not
    ("a***b", "a/b", True),            # a run of `*` with two or more is `**`
    ("[a-c]", "b", True),
    ("[a-c]", "d", False),
    ("[!a-c]", "/", False),            # a negated class never matches `/`
    ("[/]", "/", True),
    ("[a-]", "-", True),               # a `-` at the end is itself
    ("", "", True),
    # runs of stars read as the regex this replaced read them: pairs `**` left to
    # right, an even run before a `/` ending in a `**/`, whose `/` is optional
    ("***/x", "x", False),
    ("***/x", "a/x", True),
    ("****/x", "x", True),
    ("****/x", "ab", False),
    ("**/**/x", "x", True),
    ("a**", "a/b/c", True),
])
def test_glob_tokens(glob: str, path: str, matches: bool):
    """Each token by hand: `**/`, `**`, `*`, classes with ranges."""
    assert Glob.of(glob).fullmatch(path) is matches


def test_a_glob_matches_in_time_linear_in_the_path():
    """`*a*a*a*a*a*a*ab` against 120 `a`s fails: as a regex of `[^/]*` runs it
    backtracked for longer than a minute (a hostile-input campaign, 7 December 2026);
    as a set of states it takes one step a character. Ten thousand characters, and a
    glob of 500 stars, answer at once: a minute's alarm makes a return to backtracking
    fail here rather than hang the suite."""
    signal.signal(signal.SIGALRM, _too_long)
    signal.alarm(60)
    try:
        _linear_matches()
    finally:
        signal.alarm(0)


def _too_long(signum: int, frame: object) -> None:
    raise AssertionError("a glob match ran for a minute")


def _linear_matches() -> None:
    assert Glob.of("*a" * 6 + "b").fullmatch("a" * 120 + ".yaml") is False
    assert Glob.of("*a" * 6 + "b").fullmatch("a" * 120 + "b") is True
    assert Glob.of("*a" * 250 + "*").fullmatch("a" * 10_000) is True
    assert Glob.of("*a" * 250 + "b").fullmatch("a" * 10_000) is False


def test_a_reversed_class_range_is_the_files_problem(tmp_path: Path):
    """A class whose range runs backwards (`[z-a]`) is refused when the file is read,
    with the file and the glob's line, not met as an internal error while checking."""
    toml = _write(tmp_path, "kpool.toml", '[per-file-ignores]\n"ok/*.yaml" = ["KP001"]\n'
                                          '"[z-a].yaml" = ["KP001"]\n')
    e = _error(tmp_path)
    assert (e.file, e.line) == (toml.resolve(), 3)
    assert "glob '[z-a].yaml': the class [z-a] has a reversed range z-a" in str(e)


# -- refusals: file and line ---------------------------------------------------------------

def test_unknown_key_names_file_line_and_suggests(tmp_path: Path):
    py = _write(tmp_path, "pyproject.toml",
                "[project]\nname = 'x'\n\n[tool.kpool]\njobs = 2\nfail_on = 'error'\n")
    e = _error(tmp_path)
    assert (e.file, e.line) == (py.resolve(), 6)
    assert str(e).startswith(f"{py.resolve()}:6: tool.kpool.fail_on: unknown key 'fail_on'")
    assert "did you mean 'fail-on'?" in str(e)


def test_the_line_is_the_key_of_the_right_table(tmp_path: Path):
    # the same key, earlier, in other tables (one with the same last name), in a
    # string and in a comment: only the key of [tool.kpool] is the one at fault
    _write(tmp_path, "pyproject.toml", """\
[tool.other]
engine = "x"
note = "engine = 1"   # engine = 2
[tool.other.kpool]
engine = "y"
[tool.kpool]
jobs = 1
engines = [
  "rep-once", # engine = 3
]
engine = "rep-once"
""")
    assert _error(tmp_path).line == 11


def test_dotted_and_inline_keys_are_located(tmp_path: Path):
    _write(tmp_path, "pyproject.toml", """\
[tool]
kpool.jobs = 2
kpool.per-file-ignores = { "a/*.yaml" = ["KP001"], "b/*.yaml" = ["KP01"] }
""")
    e = _error(tmp_path)
    assert e.line == 3
    assert "tool.kpool.per-file-ignores.\"b/*.yaml\": unknown code 'KP01'" in str(e)


def test_a_header_writes_the_tables_it_names(tmp_path: Path):
    """settings.py `_key_lines`: a header [a.b] writes table a too, so an unknown key a
    is at the header's line (3), where it had none; and [tool.kpool.engine.x] (line 7)
    is where the unknown key engine of [tool.kpool] (line 4) is written."""
    k = _write(tmp_path / "k", "kpool.toml", "\n\n[a.b]\nc = 1\n")
    e = _error(tmp_path / "k")
    assert (e.file, e.line) == (k.resolve(), 3) and "a: unknown key 'a'" in e.message
    py = _write(tmp_path / "p", "pyproject.toml",
                "[project]\nname = 'x'\n\n[tool.kpool]\njobs = 2\n\n"
                "[tool.kpool.engine.x]\ny = 1\n")
    e = _error(tmp_path / "p")
    assert (e.file, e.line) == (py.resolve(), 7)
    assert "tool.kpool.engine: unknown key 'engine'" in e.message


def test_nesting_too_deep_names_the_line_it_starts_on(tmp_path: Path):
    """settings.py `_deep_line`: past Python's recursion, tomllib gives no line; the
    message names the line where arrays and inline tables first nest past 64 levels,
    brackets in strings and comments not counted (line 4 here)."""
    k = _write(tmp_path, "kpool.toml",
               "jobs = 1\n# [[[[\nnote = '" + "[" * 80 + "'\nx = " + "[" * 100_000 + "\n")
    e = _error(tmp_path)
    assert (e.file, e.line) == (k.resolve(), 4)
    assert e.message.startswith("invalid TOML: arrays and inline tables nested too deeply")


def test_kpool_toml_names_keys_at_top_level(tmp_path: Path):
    k = _write(tmp_path, "kpool.toml", "# settings\n\njobs = 1\nengins = ['rep-once']\n")
    e = _error(tmp_path)
    assert str(e).startswith(f"{k.resolve()}:4: engins: unknown key 'engins' "
                             "(did you mean 'engines'?)")


BAD = [
    ("engines = 'rep-once'", "expected a list of engine names, got a string ('rep-once')"),
    ("engines = []", "empty"),
    ("engines = ['rep_once']", "unknown engine 'rep_once' (did you mean 'rep-once'?)"),
    ("engines = ['pkg.mod']", "unknown engine 'pkg.mod'"),
    ("engines = ['pkg.mod:']", "unknown engine 'pkg.mod:'"),
    ("engines = ['pkg.mod:V']", "a settings file is data and names registered versions only: "
                                "a plug-in (module:Name) is given with --engine"),
    ("engines = ['rep-once', 'rep-once']", "named twice"),
    ("engines = ['rep-once', 3]", "item 1: expected a string, got an int"),
    ("fail-on = 'errors'", "unknown value 'errors' (did you mean 'error'?)"),
    ("fail-on = 1", "expected a string, got an int"),
    ("ignore = ['KP999']", "unknown code 'KP999'"),
    ("ignore = 'KP001'", "expected a list of codes, got a string"),
    ("output-format = 'sarif2'", "unknown value 'sarif2' (did you mean 'sarif'?)"),
    ("output-format = ['json']", "expected a string, got a list"),
    ("jobs = 0", "0 is out of range"),
    (f"jobs = {MAX_JOBS + 1}", f"{MAX_JOBS + 1} is out of range"),
    ("jobs = true", "expected an int, got a bool"),
    ("jobs = 2.0", "expected an int, got a float"),
    ("jobs = '2'", "expected an int, got a string ('2')"),
    ("per-file-ignores = ['a']", "expected a table of glob = [codes], got a list"),
    ("per-file-ignores = { '/abs/*.yaml' = ['KP001'] }", "relative to the settings file"),
    ("per-file-ignores = { '' = ['KP001'] }", "an empty glob"),
    ("per-file-ignores = { 'a' = 'KP001' }", "expected a list of codes"),
]


@pytest.mark.parametrize(("line", "message"), BAD)
def test_bad_values(tmp_path: Path, line: str, message: str):
    py = _write(tmp_path, "pyproject.toml",
                f"[tool.kpool]\nfail-on = 'never'\n{line}\nignore = ['KP001']\n")
    if line.startswith(("fail-on", "ignore")):  # the key once only: drop the other line
        py.write_text(f"[tool.kpool]\n\n{line}\n")
    e = _error(tmp_path)
    assert (e.file, e.line) == (py.resolve(), 3)
    assert message in e.message


def test_table_not_a_table(tmp_path: Path):
    _write(tmp_path, "pyproject.toml", "[tool]\nx = 1\nkpool = 5\n")
    e = _error(tmp_path)
    assert e.line == 3
    assert "tool.kpool: expected a table, got an int" in str(e)


def test_syntax_error_has_tomls_line(tmp_path: Path):
    k = _write(tmp_path, "kpool.toml", "jobs = 1\n\nengines = ['rep-once',,]\n")
    e = _error(tmp_path)
    assert (e.file, e.line) == (k.resolve(), 3)
    assert e.message.startswith("invalid TOML: ")
    # a syntax error in a pyproject.toml on the way up is one too (is there a table?)
    _write(tmp_path / "sub", "pyproject.toml", "[tool.ruff\n")
    assert _error(tmp_path / "sub").line == 1


def test_a_file_too_big_is_not_parsed(tmp_path: Path):
    k = _write(tmp_path, "kpool.toml", "# " + "x" * MAX_BYTES + "\n")
    e = _error(tmp_path)
    assert (e.file, e.line) == (k.resolve(), None)
    assert str(e) == f"{k.resolve()}: larger than {MAX_BYTES} bytes: not read"


def test_hostile_text(tmp_path: Path):
    k = tmp_path / "kpool.toml"
    k.write_bytes(b"jobs = 1\nengines = ['\xff']\n")
    assert _error(tmp_path).line == 2
    k.write_text("a = " + "[" * 100_000 + "]" * 100_000 + "\n")
    assert "nested too deeply" in str(_error(tmp_path))
    # a key that would move a terminal's cursor is quoted escaped, and clipped
    k.write_text('"\\u001b[2Jevil' + "x" * 100 + '" = 1\n')
    e = str(_error(tmp_path))
    assert "\x1b" not in e and "\\x1b[2Jevil" in e
    assert len(e) < len(str(k.resolve())) + 200


def test_the_docs_name_every_key_and_format():
    """docs/configuration.md's table has a row per key, and names every format."""
    doc = (Path(__file__).resolve().parent.parent / "docs" / "configuration.md").read_text()
    rows = {line.split("|")[1].strip().strip("`") for line in doc.splitlines()
            if line.startswith("| `")}
    assert set(KEYS) <= rows
    assert all(f'"{f}"' in doc for f in OUTPUT_FORMATS)
    assert f"1 to {MAX_JOBS}" in doc
