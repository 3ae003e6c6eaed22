"""The defects a seventh hostile-input campaign found on 7 December 2026
(docs/robustness.md, "The seventh round"): a settings file whose string never ends
read in time that grew with the square of its length, a settings int too long for
`str`, a settings file of chained `**/` globs that cost every trace seconds,
`kpool explain` of digits `int` refuses, and a page (`--html`, `--svg`) refused in a
read-only folder only once the replay was done; and, what it left, the soft hyphen
and the tag characters passed unescaped. Each test runs what the campaign
ran, or the function it reached, and asserts what a user sees.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest
from test_untrusted import KPOOL, ROOT, kpool_here, long_trace, write

from kpool_cli.contracts import files
from kpool_cli.settings import Glob, load_settings
from kpool_cli.wording import visible

RACE = ROOT / "traces" / "shared-prefix-race.yaml"

# -- a settings string that never ends -----------------------------------------------------


@pytest.mark.parametrize("name, head", [("kpool.toml", ""),
                                        ("pyproject.toml", "[tool.other]\nx = ")])
def test_a_settings_string_that_never_ends_is_read_once(tmp_path, name, head):
    """`"\\"\\"\\...` never ends: the check for long dotted keys, which runs before
    tomllib on every settings file and every pyproject.toml met on the way up, tried
    it again from each quote (40 KB took 38 s, the 1 MiB a file may hold hours).
    200 KB is now refused at once, at the line tomllib names."""
    (tmp_path / name).write_text(head + '"\\' * 100_000)
    try:
        r = subprocess.run([*KPOOL, "check", str(RACE), "--backend", "none"], cwd=tmp_path,
                           capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("a settings file of 200 KB was read for more than a minute")
    assert r.returncode == 2 and r.stdout == ""
    line = head.count("\n") + 1
    assert r.stderr.startswith(f"kpool: {(tmp_path / name).resolve()}:{line}: invalid "
                               "TOML: "), r.stderr


# -- a settings int past what str() shows --------------------------------------------------


@pytest.mark.parametrize("value, shown", [
    ("0x" + "f" * 5000, "an int of 20,000 bits"),        # 5,000 hex digits, 4 bits each
    ("0x" + "f" * 32, str(2**128 - 1)),                  # 128 bits: whole, 39 digits
    ("0x1" + "0" * 32, "an int of 129 bits"),            # 2**128
    ("0o" + "7" * 3000, "an int of 9,000 bits"),
    ("9" * 4000, "an int of 13,288 bits"),               # 4000 * log2(10) = 13,287.7
])
def test_a_settings_int_of_thousands_of_digits_is_named_by_its_size(tmp_path, value, shown):
    """TOML's hex, octal and binary ints have no bound, and `str` refuses one of more
    than 4,300 digits: `jobs = 0xfff...` (5,000 digits) was an internal error, and
    4,000 decimal digits were quoted whole. The problem quotes at most 39 digits."""
    (tmp_path / "kpool.toml").write_text(f"jobs = {value}\n")
    r = kpool_here("check", str(RACE), "--backend", "none", cwd=tmp_path)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr == (f"kpool: {(tmp_path / 'kpool.toml').resolve()}:1: jobs: {shown} is "
                        "out of range (must be 1 <= value <= 256)\n")


# -- per-file-ignores of chained `**/` -----------------------------------------------------


def test_chained_globs_match_as_one_and_cost_a_trace_its_name(tmp_path):
    """A glob of 333 `**/` was a chain of 333 skips, followed again at every character
    of a trace's path: 1,000 such globs (a 1 MiB settings file) cost 9 s a trace
    1,500 folders deep. `**/**/` matches what `**/` does (by hand: none, or any run
    ending in `/`), so it is one token; and a trace's folder is read once for the
    traces in it. Twenty traces of one such folder are matched within a minute's
    alarm (they took minutes)."""
    glob = "**/" * 330 + "t7.yaml"
    for path, matches in [("t7.yaml", True), ("a/b/t7.yaml", True), ("at7.yaml", False),
                          ("a/t8.yaml", False), ("a/bt7.yaml", False)]:
        assert Glob(glob).fullmatch(path) is matches
        assert Glob("**/t7.yaml").fullmatch(path) is matches
    globs = ["**/" * 330 + f"z{i:03d}.yaml" for i in range(999)] + [glob]
    (tmp_path / "kpool.toml").write_text(
        "[per-file-ignores]\n" + "".join(f'"{g}" = ["KP001"]\n' for g in globs))
    settings = load_settings(tmp_path)
    folder = tmp_path.joinpath(*["d"] * 1500)
    signal.signal(signal.SIGALRM, _too_long)
    signal.alarm(60)
    try:
        got = [settings.ignored_for(folder / f"t{i}.yaml") for i in range(20)]
    finally:
        signal.alarm(0)
    assert got == [frozenset({"KP001"}) if i == 7 else frozenset() for i in range(20)]


def _too_long(signum: int, frame: object) -> None:
    raise AssertionError("matching the per-file-ignores took a minute")


# -- kpool explain of digits int() refuses -------------------------------------------------


@pytest.mark.parametrize("code", ["²", "kp¹", "KP00\u0661", "\U0001d7cf", "kp1000"])
def test_explain_reads_ascii_digits_only(code):
    """`str.isdigit` takes `²` (int() refuses it: an internal error) and `١` or a
    mathematical `1` (int() reads them: KP001). A code's number is ASCII digits."""
    r = kpool_here("explain", code)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.startswith(f"kpool: unknown finding code {code!r}: known codes are "
                               "KP001, "), r.stderr


def test_explain_reads_a_number_past_its_leading_zeros():
    """5,001 digits were an internal error (int() refuses more than 4,300); leading
    zeros are read past, as in `kp0001`."""
    r = kpool_here("explain", "kp" + "0" * 5000 + "1")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("KP001 scatter-race (error)\n")
    r = kpool_here("explain", "kp" + "0" * 5000)
    assert r.returncode == 2 and "internal error" not in r.stderr
    assert r.stderr.startswith("kpool: unknown finding code 'kp0000")


# -- a page in a read-only folder ----------------------------------------------------------


@pytest.mark.skipif(not Path("/sys").is_dir() or Path("/sys/kpool-probe").exists(),
                    reason="needs a read-only directory: /sys")
@pytest.mark.parametrize("command, option", [("replay", "--html"), ("replay", "--svg"),
                                             ("diff", "--html")])
def test_a_page_in_a_read_only_folder_is_refused_before_the_replay(tmp_path, command,
                                                                   option):
    """A page is written after the replay: in a folder kpool cannot write (/sys, as
    root) it was refused once the work was done, the view already printed. The folder
    is tried (a file made and removed) before any work: nothing on stdout."""
    t = write(tmp_path / "t.yaml", long_trace(50))
    r = kpool_here(command, str(t), option, "/sys/kpool-page", "--backend", "none")
    assert r.returncode == 2
    assert r.stdout == ""
    assert r.stderr.startswith("kpool: cannot write /sys/kpool-page: "), r.stderr


# -- review of the seventh round ------------------------------------------------------------


@pytest.mark.parametrize("quote", ['"', "'"])
@pytest.mark.parametrize("after", [", " + ".".join(["k"] * 65) + " = 1 }",   # 65 parts
                                   ", w = " + "[" * 3000 + "]" * 3000 + " }"])
def test_a_quote_inside_a_multi_line_string_end_hides_nothing(tmp_path, quote, after):
    """`\"\"\"x\"\"\"\"` is the string `x"` (TOML: one or two quotes just inside the
    end). Skipped as `\"\"\"x\"\"\"` and a left-over `"` (a one-line string that does not
    end, skipped to its line's end), it hid the rest of its line from the checks that
    run before tomllib: a dotted key of 65 parts reached tomllib (40,000 parts: 4 s,
    1 MiB of them minutes), and nesting deeper than tomllib's recursion lost its line."""
    (tmp_path / "kpool.toml").write_text(
        f"x = {{ s = {quote * 3}x{quote * 4}" + after + "\n")
    r = kpool_here("check", str(RACE), "--backend", "none", cwd=tmp_path)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.startswith(f"kpool: {(tmp_path / 'kpool.toml').resolve()}:1: invalid "
                               "TOML: "), r.stderr


@pytest.mark.parametrize("quotes", ["", '"', '""'])
def test_a_multi_line_string_ending_in_quotes_is_still_read(tmp_path, quotes):
    """The quotes just inside a multi-line string's end are the string's: a file of
    them is read (its key checked), not refused."""
    (tmp_path / "kpool.toml").write_text(f'x = """a{quotes}"""\n')
    r = kpool_here("check", str(RACE), "--backend", "none", cwd=tmp_path)
    assert r.returncode == 2
    assert r.stderr.startswith(f"kpool: {(tmp_path / 'kpool.toml').resolve()}:1: x: "
                               "unknown key 'x'"), r.stderr


def test_ctrl_c_during_the_output_probe_leaves_no_file(tmp_path, monkeypatch):
    """The probe makes a file and removes it: a Ctrl-C between the two (here right
    after the file is closed) left `.kpool-*.tmp` in the output's folder."""
    real_close = os.close

    def close_then_interrupt(fd: int) -> None:
        real_close(fd)
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(files.os, "close", close_then_interrupt)
        with pytest.raises(KeyboardInterrupt):
            files.check_outputs((), [("-o", str(tmp_path / "r.json"))])
    assert list(tmp_path.iterdir()) == []


# -- characters that show nothing ----------------------------------------------------------


def test_every_format_character_is_escaped():
    """What the round left: the soft hyphen and the tag characters passed through
    `visible` raw, so `ra`, U+00AD, `ce` showed as `race`. Every format character
    (category Cf, as the interpreter's own Unicode tables have it) is escaped now,
    and one past U+FFFF as `\\U` and eight digits."""
    cf = [chr(c) for c in range(sys.maxunicode + 1) if unicodedata.category(chr(c)) == "Cf"]
    assert len(cf) > 160  # 161 in Unicode 14.0
    raw = [c for c in cf if c in visible(f"a{c}b")]
    assert raw == []
    assert visible("ra\u00adce") == "ra\\xadce"
    assert visible("x\U000e0041") == "x\\U000e0041"


def test_a_soft_hyphen_in_a_trace_name_shows_as_its_escape(tmp_path):
    trace = tmp_path / "t.yaml"
    trace.write_text(RACE.read_text().replace("name: shared-prefix-race",
                                              'name: "shared-prefix-ra\\u00adce\\U000e0041"'),
                     encoding="utf-8")
    r = kpool_here("replay", str(trace), "--engine", "rep-once", "--backend", "none")
    assert r.returncode == 0, r.stderr
    assert "shared-prefix-ra\\xadce\\U000e0041" in r.stdout
    assert "\u00ad" not in r.stdout and "\U000e0041" not in r.stdout


def test_the_format_characters_later_unicode_adds_are_escaped_too():
    """kpool runs on Python 3.11 and later: Python 3.12 and 3.13 (Unicode 15.0, 15.1)
    count the Egyptian hieroglyph format controls U+13439-1343F as format characters
    too, which a set drawn from Python 3.11's Unicode 14.0 let through raw there."""
    added = "".join(map(chr, range(0x13439, 0x13440)))
    assert visible(f"a{added}b") == ("a\\U00013439\\U0001343a\\U0001343b\\U0001343c"
                                     "\\U0001343d\\U0001343e\\U0001343fb")
