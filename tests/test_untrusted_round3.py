"""The defects a hostile-input campaign found on 7 December 2026 (docs/robustness.md,
"The third round"): outputs through links, settings globs, the standard streams,
folders, line numbers, XML, tags and widths. Each test runs what the campaign ran,
or the function it reached, and asserts what a user sees.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
import xml.dom.minidom
from pathlib import Path

import pytest
from click.testing import CliRunner
from test_untrusted import KPOOL, RACE, ROOT, _signal_mid_run, kpool, kpool_here, long_trace

from kpool_cli import inputs
from kpool_cli.cli.main import cli
from kpool_cli.report import terminal
from kpool_cli.wording import visible

TRACE = """kpool_trace: 1
name: NAME
cache: {kv_size: 16, kpool: 4}
ops:
  - decode: {seq: 0, pos: 0..4}
"""


def _trace(folder: Path, name: str = "t.yaml", title: str = "t") -> Path:
    path = folder / name
    path.write_text(TRACE.replace("NAME", title), encoding="utf-8")
    return path


# -- outputs -------------------------------------------------------------------------


def test_an_output_through_a_link_writes_the_file_it_names(tmp_path):
    """`-o LINK`: the report goes to the file the link names, and the link stays a
    link (kpool renamed its temporary over the link itself)."""
    t = _trace(tmp_path)
    target = tmp_path / "real.json"
    target.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    r = kpool_here("replay", str(t), "--backend", "none", "--format", "json", "-o", str(link))
    assert r.returncode == 0, r.stderr
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert json.loads(target.read_text())["kpool_report"] == 1


def test_an_output_through_a_link_to_the_standard_output_writes_its_file(tmp_path):
    """`-o /dev/stdout > x.txt` as the campaign ran it, on a link of the test's own (to
    /proc/self/fd/1, as /dev/stdout is): the report lands in x.txt and the link stays
    (kpool replaced /dev/stdout with a regular file, for every process)."""
    t = _trace(tmp_path)
    link = tmp_path / "stdout"
    link.symlink_to("/proc/self/fd/1")
    x = tmp_path / "x.txt"
    with x.open("w") as out:
        r = subprocess.run([*KPOOL, "replay", str(t), "--backend", "none", "--format",
                            "json", "-o", str(link)], stdout=out, stderr=subprocess.PIPE,
                           text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr
    assert link.is_symlink() and os.readlink(link) == "/proc/self/fd/1"
    assert json.loads(x.read_text())["kpool_report"] == 1


def test_an_output_on_the_standard_output_keeps_what_the_shell_wrote_around_it(tmp_path):
    """`{ echo header; kpool ... -o /dev/stdout; echo footer; } > out.txt` and `>> log`:
    the report is written on the descriptor the shell opened, after what it holds and
    before what follows (a file renamed over out.txt's path kept the report alone), and
    `-o /dev/stdout | cat` writes to the pipe (it was refused as a FIFO)."""
    t = _trace(tmp_path)
    out, log = tmp_path / "out.txt", tmp_path / "log.txt"
    log.write_text("prior log\n")
    kp = " ".join(KPOOL)
    for shell in (f'{{ echo header; {kp} replay "{t}" --backend none --format json '
                  f'-o /dev/stdout; echo footer; }} > "{out}"',
                  f'{kp} replay "{t}" --backend none --format json -o /dev/stdout >> "{log}"'):
        r = subprocess.run(["sh", "-c", shell], capture_output=True, text=True, cwd=ROOT,
                           timeout=120)
        assert r.returncode == 0, r.stderr
    head, _, rest = out.read_text().partition("\n")
    report, _, tail = rest.rstrip("\n").rpartition("\n")
    assert (head, tail) == ("header", "footer") and json.loads(report)["kpool_report"] == 1
    prior, _, report = log.read_text().partition("\n")
    assert prior == "prior log" and json.loads(report)["kpool_report"] == 1
    r = subprocess.run(["sh", "-c", f'{kp} replay "{t}" --backend none --format json '
                        "-o /dev/stdout | cat"], capture_output=True, text=True, cwd=ROOT,
                       timeout=120)
    assert r.returncode == 0 and json.loads(r.stdout)["kpool_report"] == 1, r.stderr


def test_an_output_name_as_long_as_the_system_allows_is_written(tmp_path):
    """A 250-character name: the temporary beside it takes the name's first
    characters only (`.{name}.XXXXXXXX.tmp` passed the 255 a name may take)."""
    t = _trace(tmp_path)
    out = tmp_path / ("r" * 245 + ".json")
    r = kpool_here("replay", str(t), "--backend", "none", "--format", "json", "-o", str(out))
    assert r.returncode == 0, r.stderr
    assert json.loads(out.read_text())["kpool_report"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([out.name, "t.yaml"])


def test_an_output_path_that_ends_in_a_slash_is_refused(tmp_path):
    """`-o newdir/`: a folder's path, refused before any work (it wrote a file named
    `newdir`)."""
    t = _trace(tmp_path)
    r = kpool_here("replay", str(t), "--backend", "none", "-o", str(tmp_path / "newdir") + "/")
    assert r.returncode == 2
    assert "names a directory (it ends in /): give the path of a file" in r.stderr
    r = kpool_here("replay", str(t), "--backend", "none", "-o", str(tmp_path) + "/")
    assert r.returncode == 2 and "is a directory" in r.stderr  # one that exists
    assert not (tmp_path / "newdir").exists()


def test_sighup_is_129_and_leaves_no_temporary(tmp_path):
    """The terminal went away (SIGHUP) mid-run: the temporary output is removed, as on
    SIGTERM; status 128 + 1 (it left `.r.json.XXXX.tmp` behind)."""
    code, err = _signal_mid_run(tmp_path, signal.SIGHUP, "json")
    assert code == 129 and err == "kpool: terminated\n"


def test_a_sighup_the_caller_ignores_stays_ignored(tmp_path):
    """`nohup kpool ...` starts kpool with SIGHUP ignored: the run goes on to its own
    end when the terminal goes away (the handler that ends a run on SIGHUP must not
    replace the caller's choice)."""
    t = tmp_path / "long.yaml"
    t.write_text(long_trace(1500))
    out = tmp_path / "r.json"
    p = subprocess.Popen([*KPOOL, "replay", str(t), "--engine", "cache-safe", "--format",
                          "json", "-o", str(out)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, cwd=ROOT,
                         preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN))
    deadline = time.monotonic() + 60
    while not any(q.name.endswith(".tmp") for q in tmp_path.iterdir()):
        assert p.poll() is None and time.monotonic() < deadline
        time.sleep(0.01)
    p.send_signal(signal.SIGHUP)
    _, err = p.communicate(timeout=120)
    assert (p.returncode, err) == (1, "")  # the race's findings: the run's own status
    assert json.loads(out.read_text())["summary"]["status"] == "fail"


# -- the standard streams -------------------------------------------------------------


def _closed(fd: int, *args: str) -> subprocess.CompletedProcess:
    """kpool with descriptor `fd` closed, as `>&-` or `2>&-` leaves it."""
    def close() -> None:
        os.close(fd)
    return subprocess.run([*KPOOL, *args], text=True, cwd=ROOT, timeout=120,
                          preexec_fn=close, stdout=None if fd == 1 else subprocess.PIPE,
                          stderr=None if fd == 2 else subprocess.PIPE)


def test_a_closed_stdout_is_named_and_exit_2(tmp_path):
    """`kpool replay t.yaml >&-`: the view cannot be written: exit 2, saying why (it
    was an internal error, a traceback and exit 1, which means findings)."""
    r = _closed(1, "replay", str(_trace(tmp_path)), "--backend", "none")
    assert r.returncode == 2
    assert r.stderr == "kpool: cannot write standard output: standard output is closed\n"


def test_a_closed_stdout_that_nothing_writes_to_is_no_matter(tmp_path):
    """`-o r.txt >&-`: stdout is not used; the run passes."""
    out = tmp_path / "r.txt"
    r = _closed(1, "replay", str(_trace(tmp_path)), "--backend", "none", "-o", str(out))
    assert (r.returncode, r.stderr) == (0, "")
    assert out.read_text().startswith("trace ")


def test_a_closed_stderr_keeps_the_exit_status(tmp_path):
    """`2>&-` and an invalid trace: nothing can be said, but the status is still 2 (it
    was 1)."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("kpool_trace: 1\nops: []\n")
    r = _closed(2, "replay", str(bad))
    assert r.returncode == 2 and r.stdout == ""


def test_a_stdout_that_cannot_encode_a_name_writes_its_escape(tmp_path):
    """PYTHONIOENCODING=ascii and a trace named `café ✓`: the name is written as its
    escapes (an internal error, UnicodeEncodeError, before)."""
    t = _trace(tmp_path, title='"café ✓"')
    r = kpool("replay", str(t), "--backend", "none", env={"PYTHONIOENCODING": "ascii"})
    assert r.returncode == 0, r.stderr
    assert "(caf\\xe9 \\u2713)" in r.stdout.splitlines()[0]


def test_a_removed_current_folder_is_named(tmp_path):
    """Run from a folder another shell removed: kpool says so (it said it could not
    write standard output, or `python -m kpool_cli` died in a traceback)."""
    gone = tmp_path / "gone"
    gone.mkdir()
    r = subprocess.run(["sh", "-c", f'cd "{gone}" && rmdir "{gone}" && exec "$@"', "sh",
                        *KPOOL, "check", str(RACE), "--no-config"], capture_output=True,
                       text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert r.returncode == 2
    assert r.stderr == ("kpool: the current folder no longer exists: run kpool from a "
                        "folder that does\n")


# -- folders ---------------------------------------------------------------------------


def test_a_folder_that_cannot_be_listed_is_refused_not_skipped(tmp_path, monkeypatch):
    """A folder under the one given that cannot be listed (mode 000, read by a user
    without the root's override: the campaign's case, made here by the listing's
    PermissionError): `kpool check` refuses the run, naming it (it skipped the folder,
    and passed on the traces it had not read)."""
    d = tmp_path / "d"
    (d / "sub").mkdir(parents=True)
    _trace(d, "a.yaml")
    _trace(d / "sub", "b.yaml")
    real = os.scandir

    def scandir(path):  # type: ignore[no-untyped-def]
        if Path(path).name == "sub":
            raise PermissionError(13, "Permission denied", str(path))
        return real(path)

    monkeypatch.setattr(inputs.os, "scandir", scandir)
    _, problems = inputs.trace_paths([str(d)])
    assert problems == [f"cannot list the folder {d / 'sub'}: Permission denied"]
    r = CliRunner().invoke(cli, ["check", str(d), "--no-config", "--backend", "none"])
    assert r.exit_code == 2
    assert f"kpool: cannot list the folder {d / 'sub'}: Permission denied" in r.output


def test_a_folder_nested_a_thousand_deep_is_walked(tmp_path):
    """1,000 folders deep (a RecursionError, an internal error, past about 980): the
    walk keeps its own stack."""
    deep = tmp_path / "deep"
    leaf = str(deep)
    os.mkdir(leaf)
    for _ in range(1000):  # one at a time: os.makedirs recurses as deep
        leaf = os.path.join(leaf, "a")
        os.mkdir(leaf)
    t = Path(leaf) / "t.yaml"
    try:
        _trace(Path(leaf))
        files, problems = inputs.trace_paths([str(deep)])
        assert (files, problems) == ([str(t)], [])
    finally:  # removed here, leaf first: pytest's own clean-up recurses as deep
        t.unlink(missing_ok=True)
        while leaf != str(deep):
            os.rmdir(leaf)
            leaf = os.path.dirname(leaf)
        os.rmdir(leaf)


def test_a_trace_named_in_capitals_is_found_in_a_folder(tmp_path):
    """`T.YAML` is a trace as much as `t.yaml` (the walk passed it over, unsaid); a
    hidden file is not."""
    _trace(tmp_path, "T.YAML")
    _trace(tmp_path, ".hidden.yaml")
    files, problems = inputs.trace_paths([str(tmp_path)])
    assert (files, problems) == ([str(tmp_path / "T.YAML")], [])


def test_a_cgroup_file_is_refused_unread():
    """A file of a cgroup mount (a separate mount under /sys: its device is not /sys's)
    is refused as /sys's own are (it was read, and its text met as a trace)."""
    mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    where = [line.split()[4] for line in mounts
             if " - " in line and line.split(" - ")[1].split()[0] in ("cgroup", "cgroup2")]
    files = [p for w in where for p in sorted(Path(w).glob("*")) if p.is_file()][:1]
    if not files:
        pytest.skip("no cgroup mount with a file in it here")
    r = kpool_here("replay", str(files[0]))
    assert r.returncode == 2
    assert "is a file of /proc or /sys (generated by the kernel)" in r.stderr


# -- what a trace's text may hold -------------------------------------------------------


@pytest.mark.parametrize("breaker", ["\x85", "\u2028", "\u2029"])
def test_a_line_break_of_yaml_alone_does_not_move_the_lines(tmp_path, breaker):
    """libyaml ends a line at NEL, LS and PS; kpool's lines end at `\\n` alone
    (inputs.line_at). A name holding one: the bad key of line 5 is at line 5 (it was
    6), column 33."""
    t = tmp_path / "t.yaml"
    t.write_text(f'kpool_trace: 1\nname: "a{breaker}b"\ncache: {{kv_size: 16, kpool: 4}}\n'
                 "ops:\n  - decode: {seq: 0, pos: 0..4, bogus: 1}\n", encoding="utf-8")
    r = kpool_here("validate", str(t))
    assert r.returncode == 2
    assert f"{t}:5:33: ops[0].decode.bogus: unknown key 'bogus'" in r.stdout


def test_a_line_break_of_yaml_alone_before_token_lines(tmp_path):
    """The same in a recorder's trace of 3,000 token lines (whose fast path counts
    `\\n`): the bad token of line 2,007 is at line 2,007 (it was 2,009)."""
    lines = ["kpool_trace: 1", 'name: "a\x85b\u2028c"', "cache: {kv_size: 4096, kpool: 4}",
             "ops:", "  - decode:", "      tokens:"]
    lines += [f"        - {{pos: {p}, seq: 0{', bogus: 1' if p == 2000 else ''}}}"
              for p in range(3000)]
    t = tmp_path / "t.yaml"
    t.write_text("\n".join(lines) + "\n", encoding="utf-8")
    r = kpool_here("validate", str(t))
    assert r.returncode == 2
    assert f"{t}:2007:31: ops[0].decode.tokens[2000].bogus: unknown key 'bogus'" in r.stdout


def test_places_a_message_quotes_are_the_files_too(tmp_path):
    """After a NEL: a recursive alias's anchor (the message quotes its place) and a
    YAML error's context line are the file's (they were libyaml's: line 3 of a file of
    2 lines)."""
    t = tmp_path / "t.yaml"
    t.write_text("kpool_trace: 1\ncache: {kv_size: 8}\x85x: &c [1, *c]\nops: []\n",
                 encoding="utf-8")
    r = kpool_here("validate", str(t))
    assert ("t.yaml:2:31: x[1]: a recursive alias: *c is used inside the node it names "
            "(anchored at line 2, column 24)") in r.stdout
    t.write_text("kpool_trace: 1 # a\x85comment\ncache: {kv_size: 16, kpool: 4}\nops: []\n",
                 encoding="utf-8")
    r = kpool_here("validate", str(t))
    assert "(while scanning a simple key at line 1)" in r.stdout and "t.yaml:2:1:" in r.stdout


def test_a_character_refused_after_non_ascii_text_is_placed_by_characters(tmp_path):
    """libyaml's reader places a character it refuses by its UTF-8 byte: `\x01` after
    five `é` on line 4 is at 4:8 (it said 5:4, in a file of 4 lines)."""
    t = tmp_path / "t.yaml"
    t.write_text("kpool_trace: 1\ncache: {kv_size: 16, kpool: 4}\nops: []\n# ééééé\x01\n",
                 encoding="utf-8")
    r = kpool_here("validate", str(t))
    assert f"{t}:4:8: <yaml>: invalid YAML: character U+0001 is not allowed" in r.stdout


@pytest.mark.parametrize(("value", "got"), [("!!str 5", "a string"), ("!!float 5", "a float")])
def test_an_explicit_tag_is_what_the_value_is(tmp_path, value, got):
    """`seed: !!str 5` is the string "5" (refused as `"5"` is), not the int 5."""
    t = tmp_path / "t.yaml"
    t.write_text(f"kpool_trace: 1\nseed: {value}\ncache: {{kv_size: 16, kpool: 4}}\n"
                 "ops:\n  - decode: {seq: 0, pos: 0..4}\n")
    r = kpool_here("validate", str(t))
    assert r.returncode == 2
    assert f"{t}:2:7: seed: expected an int, got {got} ('5')" in r.stdout


def test_xml_outputs_escape_the_two_noncharacters(tmp_path):
    """U+FFFE and U+FFFF, which XML 1.0 does not allow, in a trace's name and in a
    file's name: the SVG view and the JUnit report are well-formed (they were not)."""
    assert visible("a\ufffeb\uffffc") == "a\\ufffeb\\uffffc"
    t = _trace(tmp_path, title='"a\\uFFFFb"')
    svg = tmp_path / "p.svg"
    r = kpool_here("replay", str(t), "--backend", "none", "--svg", str(svg), "-q")
    assert r.returncode == 0, r.stderr
    xml.dom.minidom.parse(str(svg))
    g = tmp_path / "g"
    g.mkdir()
    _trace(g, "x\uffff.yaml")
    junit = tmp_path / "g.xml"
    r = kpool_here("check", str(g), "--no-config", "--backend", "none", "--output-format",
                   "junit", "-o", str(junit))
    assert r.returncode == 0, r.stderr
    xml.dom.minidom.parse(str(junit))


# -- the terminal's width -----------------------------------------------------------------


@pytest.mark.parametrize(("columns", "width"), [("0", None), ("abc", None), ("1", 20),
                                                ("120", 120), ("99999999", 1000),
                                                ("9" * 5000, 1000), ("٣", None)])
def test_columns_from_the_environment_are_kept_in_bounds(monkeypatch, columns, width):
    """COLUMNS is the environment's: 0 drew nothing, 99999999 took a minute and 1.4 GB,
    5,000 digits were an internal error (no int of more than 4,300); a width from it is
    kept within 20 .. 1000, and one that is no positive number in ASCII digits is not
    read."""
    monkeypatch.setenv("COLUMNS", columns)
    assert terminal.env_columns() == width


def test_a_view_with_columns_zero_draws_at_eighty(tmp_path):
    """COLUMNS=0 with --color, piped: the view draws at the default 80 columns (it drew
    nothing and passed)."""
    r = kpool_here("replay", str(_trace(tmp_path)), "--backend", "none", "--color",
                   env={"COLUMNS": "0"})
    assert r.returncode == 0 and "kpool replay" in r.stdout
    shown = [re.sub(r"\x1b\[[0-9;]*m", "", line) for line in r.stdout.splitlines()]
    assert max(len(line) for line in shown) == 80
