"""Untrusted input, round two: every file a command reads is an input, a settings
file runs no code, special files are refused unread, every OS error and signal ends
honestly, and a newcomer's first commands do what they say (docs/robustness.md).

Each test runs `kpool` in a subprocess, as a user would, or in this process
(`kpool_here`) where the process does not matter, and asserts what the user sees:
the exit status, the message, the files left behind.
"""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_untrusted import KPOOL, RACE, ROOT, kpool, kpool_here, long_trace, write

TRACES = ROOT / "traces"


def digest(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}


# -- 1. an output is never an input ------------------------------------------------------


def test_check_refuses_to_write_over_a_trace_found_in_its_folder(tmp_path: Path) -> None:
    d = tmp_path / "d"
    d.mkdir()
    (d / "race.yaml").write_bytes(RACE.read_bytes())
    before = digest(d)
    r = kpool_here("check", "--no-config", str(d), "-o", str(d / "race.yaml"))
    assert r.returncode == 2 and "is the input" in r.stderr and "race.yaml" in r.stderr
    assert digest(d) == before


def test_check_refuses_to_write_over_its_settings_file(tmp_path: Path) -> None:
    (tmp_path / "kpool.toml").write_text('fail-on = "error"\n')
    (tmp_path / "t.yaml").write_bytes(RACE.read_bytes())
    r = kpool_here("check", "t.yaml", "-o", "kpool.toml", cwd=tmp_path)
    assert r.returncode == 2 and "is the input" in r.stderr
    assert (tmp_path / "kpool.toml").read_text() == 'fail-on = "error"\n'


def test_diff_refuses_to_write_over_a_trace_of_its_folder(tmp_path: Path) -> None:
    (tmp_path / "race.yaml").write_bytes(RACE.read_bytes())
    r = kpool_here("diff", str(tmp_path), "-o", str(tmp_path / "race.yaml"))
    assert r.returncode == 2 and "is the input" in r.stderr
    assert (tmp_path / "race.yaml").read_bytes() == RACE.read_bytes()


# -- 2. no code from data ----------------------------------------------------------------


@pytest.mark.parametrize("engine", ["os:abort", "os:fork", "this:s"])
def test_a_settings_file_names_registered_versions_only(tmp_path: Path, engine: str) -> None:
    (tmp_path / "kpool.toml").write_text(f'engines = ["{engine}"]\n')
    (tmp_path / "t.yaml").write_bytes(RACE.read_bytes())
    r = kpool_here("check", "t.yaml", cwd=tmp_path)
    assert r.returncode == 2 and r.stdout == ""
    assert f"kpool.toml:1: engines: unknown engine '{engine}'" in r.stderr
    assert r.stderr.rstrip().endswith("; a settings file is data and names registered versions "
                                      "only: a plug-in (module:Name) is given with --engine")


@pytest.mark.parametrize("engine, found", [("os:abort", "builtin_function_or_method"),
                                           ("os:fork", "builtin_function_or_method"),
                                           ("os:getcwd", "builtin_function_or_method")])
def test_a_plugin_on_the_command_line_is_not_called(engine: str, found: str) -> None:
    r = kpool("replay", str(RACE), "--engine", engine)
    assert r.returncode == 2 and r.stdout == ""
    assert f"is a {found}, not a kpool_cli.versions.EngineVersion" in r.stderr


def test_a_plugin_function_returning_a_version_is_not_called(tmp_path: Path) -> None:
    (tmp_path / "plug.py").write_text(
        "import pathlib\nfrom kpool_cli.versions import REP_ONCE\n"
        "def V():\n    pathlib.Path('called').write_text('yes')\n    return REP_ONCE\n")
    r = kpool("replay", str(RACE), "--engine", "plug:V", cwd=tmp_path,
              env={"PYTHONPATH": str(tmp_path)})
    assert r.returncode == 2 and "V is a function" in r.stderr
    assert not (tmp_path / "called").exists()


@pytest.mark.parametrize("args", [("replay", str(RACE), "--engine", ""),
                                  ("diff", str(RACE), "--base", ""),
                                  ("check", str(RACE), "--engine", ""),
                                  ("fuzz", "--engine", "", "--runs", "1")])
def test_an_empty_engine_name_is_an_error(args: tuple[str, ...]) -> None:
    r = kpool_here(*args)
    assert r.returncode == 2 and "empty engine name" in r.stderr


# -- 3. regular files only ---------------------------------------------------------------


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    p = tmp_path / "f.yaml"
    os.mkfifo(p)
    return p


@pytest.mark.parametrize("command", ["replay", "check", "validate", "diff"])
def test_a_fifo_is_refused_unread(fifo: Path, command: str) -> None:
    r = kpool(command, str(fifo))  # waiting on it would time out
    assert r.returncode == 2
    assert "f.yaml" in r.stdout + r.stderr and "is a FIFO, not a regular file" in (
        r.stdout + r.stderr)


def test_a_folder_holding_a_fifo_checks_the_rest(fifo: Path) -> None:
    (fifo.parent / "race.yaml").write_bytes(RACE.read_bytes())
    r = kpool("check", "--no-config", str(fifo.parent))
    assert r.returncode == 2
    assert "INVALID" in r.stdout and "is a FIFO" in r.stdout
    assert r.stdout.count("race.yaml under") == 2  # both engines ran on the rest


@pytest.mark.parametrize("path, why", [("/proc/self/status", "a file of /proc or /sys"),
                                       ("/dev/zero", "is a device")])
def test_special_files_are_refused_unread(path: str, why: str) -> None:
    r = kpool("validate", path)
    assert r.returncode == 2 and why in r.stdout + r.stderr


def test_a_fifo_settings_file_is_refused(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "kpool.toml")
    (tmp_path / "t.yaml").write_bytes(RACE.read_bytes())
    r = kpool("check", "t.yaml", cwd=tmp_path)
    assert r.returncode == 2 and "kpool.toml: cannot read it: it is a FIFO" in r.stderr


def test_a_missing_file_says_so() -> None:
    r = kpool_here("replay", "no-such.yaml")
    assert r.returncode == 2
    assert r.stderr == "kpool: no-such.yaml: cannot read the trace: No such file or directory\n"


# -- 4. OS errors on output --------------------------------------------------------------


@pytest.mark.parametrize("args", [("replay", str(RACE)), ("replay", str(RACE), "--format",
                                                          "json"),
                                  ("gen", "server"), ("schema", "trace"), ("explain", "KP001"),
                                  ("check", str(RACE)), ("diff", str(RACE))])
def test_a_full_stdout_is_exit_2_with_the_reason(args: tuple[str, ...]) -> None:
    with open("/dev/full", "w") as full:
        r = subprocess.run([*KPOOL, *args], stdout=full, stderr=subprocess.PIPE, text=True,
                           cwd=ROOT, timeout=120)
    assert r.returncode == 2
    assert r.stderr == "kpool: cannot write standard output: No space left on device\n"


@pytest.mark.parametrize("args", [("gen", "server"), ("schema", "trace"), ("engines",),
                                  ("replay", str(RACE)), ("check", str(RACE)),
                                  ("validate", str(TRACES))])
def test_a_closed_pipe_is_141(args: tuple[str, ...]) -> None:
    r, w = os.pipe()
    os.close(r)  # the reader is gone before kpool writes
    p = subprocess.run([*KPOOL, *args], stdout=w, stderr=subprocess.PIPE, cwd=ROOT,
                       timeout=120)
    os.close(w)
    assert p.returncode == 141 and p.stderr == b""


# -- 5. a signal closes the JSON ---------------------------------------------------------


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_json_on_stdout_stays_one_document_when_signalled(tmp_path: Path, sig: int, code: int
                                                          ) -> None:
    t = tmp_path / "long.yaml"
    t.write_text(long_trace(4000))
    out = tmp_path / "out.json"
    with open(out, "wb") as f:
        p = subprocess.Popen([*KPOOL, "replay", str(t), "--engine", "cache-safe", "--format",
                              "json", "--backend", "none"], stdout=f, stderr=subprocess.PIPE,
                             cwd=ROOT)
        deadline = time.monotonic() + 60
        while out.stat().st_size < 2000 and time.monotonic() < deadline:  # replaying
            time.sleep(0.05)
        p.send_signal(sig)
        _, err = p.communicate(timeout=60)
    assert p.returncode == code, err
    doc = json.loads(out.read_text())
    assert doc["summary"]["status"] == "interrupted"
    assert 0 < doc["summary"]["ubatches"] < 4000
    assert len(doc["ubatches"]) == doc["summary"]["ubatches"]


# -- 6. no line breaks from data ---------------------------------------------------------


def test_line_breaks_in_trace_text_are_escaped_in_the_rich_view(tmp_path: Path) -> None:
    t = write(tmp_path / "nl.yaml", """\
        kpool_trace: 1
        name: "n\\u2028kpool: fake name"
        cache: {kv_size: 16, kpool: 4}
        ops:
          - note: "x\\nkpool: fake line\\u2029y\\u0085z\\rw"
          - decode: {seq: 0, pos: 0..4}
          - state_write: {seq: 0, slot: "s\\nkpool: fake slot"}
        """)
    r = kpool_here("replay", str(t), "--color", env={"COLUMNS": "200"})
    text = r.stdout
    for broken in ("\u2028", "\u2029", "\x85", "\r"):
        assert broken not in text
    assert not any(line.lstrip(" \x1b[0123456789;m│").startswith("kpool:")
                   for line in text.splitlines())
    assert "x\\nkpool: fake line\\u2029y\\x85z\\rw" in text
    assert "s\\nkpool: fake slot" in text


# -- 8. every option bounded -------------------------------------------------------------


@pytest.mark.parametrize("args, said", [
    (("check", str(RACE), "-j", "100000"), "'100000' is not an integer from 1 to 256"),
    (("fuzz", "--engine", "rep-once", "--time-budget", "nan"), "nan and inf are not numbers"),
    (("fuzz", "--engine", "rep-once", "--time-budget", "inf"), "nan and inf are not numbers"),
    (("replay", str(RACE), "--ubatch", "9" * 5000), "at most 15 digits each"),
    (("replay", str(RACE), "--seq", "9" * 5000), "is not an integer from 0 to 255"),
    (("gen", "server", "--seed", "9" * 5000), "is not an integer from 0 to"),
    (("gen", "server", "--slots", "1e3"), "'1e3' is not an integer from 1 to 16"),
    (("replay", str(RACE), "--ubatch", "\u0663"), "is not a ubatch index N"),
    (("replay", str(RACE), "--ubatch", "\uff13..\uff15"), "is not a ubatch index N"),
    (("replay", str(RACE), "--max-memory", "1e300G"), "not a memory size: '1e300G'"),
    (("replay", str(RACE), "--max-memory", "\u0663G"), "not a memory size"),
    (("replay", str(RACE), "--max-memory", "+2G"), "not a memory size"),
    (("replay", str(RACE), "--max-memory", "9" * 5000), "not a memory size"),
    (("replay", str(RACE), "--max-memory", "999999999999999T"),
     "more than the largest budget, 1 EiB"),
    (("fuzz", "--engine", "rep-once", "--runs", "1", "-o", ""), "-o: the path is empty"),
])
def test_numbers_are_checked_in_kpools_words(args: tuple[str, ...], said: str) -> None:
    r = kpool_here(*args)
    assert r.returncode == 2 and said in r.stderr
    assert "sys.set_int_max_str_digits" not in r.stderr and len(r.stderr) < 1000


def test_the_pool_never_outgrows_the_cores() -> None:
    from kpool_cli.workers import MAX_JOBS, workers_for

    cores = os.cpu_count() or 1
    assert workers_for(MAX_JOBS, 10_000) == min(cores, MAX_JOBS)
    assert workers_for(8, 3) == min(3, cores) and workers_for(1, 100) == 1


def test_validate_checks_expectation_codes(tmp_path: Path) -> None:
    t = write(tmp_path / "t.yaml", """\
        kpool_trace: 1
        cache: {kv_size: 16, kpool: 4}
        ops:
          - decode: {seq: 0, pos: 0..4}
          - expect: {findings: [KP999]}
        """)
    r = kpool_here("validate", str(t))
    assert r.returncode == 2
    assert "t.yaml:5:5: ops[1].expect.findings: unknown finding code 'KP999'" in r.stdout


# -- 9. the newcomer's first hour --------------------------------------------------------


def test_diff_takes_a_folder_as_check_does() -> None:
    r = kpool_here("diff", "traces/", "--base", "rep-once", "--head", "tail-truncate")
    assert "shared-prefix-race.yaml" in r.stdout  # a trace of the folder, and of found/:
    # the port's one known regression (traces/found/tail-truncate-port-keeps-a-drift.yaml)
    assert r.returncode == 1, r.stderr
    assert r.stdout.rstrip().endswith(
        "REGRESSION (exit 1): head introduces KP007 in tail-truncate-port-keeps-a-drift at "
        "op 4.0")


def test_the_plain_view_prints_values_as_a_trace_writes_them() -> None:
    r = kpool_here("replay", str(RACE))
    assert "unified true, by_order false" in r.stdout and "True" not in r.stdout


def test_an_unchecked_failed_expect_is_said_to_be_unchecked(tmp_path: Path) -> None:
    t = write(tmp_path / "t.yaml", """\
        kpool_trace: 1
        cache: {kv_size: 16, kpool: 4}
        ops:
          - decode: {seq: 0, pos: 0..4}
          - expect: {n_new: 5}
        """)
    r = kpool_here("replay", str(t))
    assert r.returncode == 0
    assert "summary: 1 ubatch, 1 pool marked" in r.stdout  # not `1 ubatches`, `1 pools`
    assert "expect (op 1): FAILED (not checked):" in r.stdout
    assert r.stdout.rstrip().endswith("1 expectation failed (not checked: --check): PASS")
    r = kpool_here("replay", str(t), "--check")
    # checked, the failed expectation is the cause the summary names (it said only
    # `no findings: FAIL`, a newcomer's walk of 7 December found)
    assert r.returncode == 1
    assert r.stdout.rstrip().endswith("no findings, 1 expectation failed: FAIL")


@pytest.mark.parametrize("how", [("--color",), ()])
def test_color_forces_the_rich_view_when_piped(how: tuple[str, ...]) -> None:
    env = {} if how else {"FORCE_COLOR": "1"}
    r = kpool_here("replay", str(RACE), *how, env=env)
    assert "\x1b[" in r.stdout and "kpool replay" in re.sub("\x1b\\[[0-9;]*m", "", r.stdout)
    assert "╭─" in r.stdout


def test_help_and_schemas_cite_the_repositorys_files() -> None:
    for args in (("--help",), ("replay", "--help"), ("diff", "--help"), ("check", "--help"),
                 ("schema", "trace"), ("schema", "report"), ("schema", "check"),
                 ("schema", "diff")):
        out = kpool(*args).stdout
        for cited in ("TRACE_FORMAT.md", "ENGINE.md", "DESIGN.md", "STYLE.md"):
            assert cited not in out, (args, cited)


def test_the_engine_help_points_at_kpool_engines_which_names_every_version() -> None:
    from kpool_cli.versions import BASES, PATCHES, VERSIONS

    for args in (("replay", "--help"), ("diff", "--help"), ("check", "--help")):
        out = " ".join(kpool(*args, env={"COLUMNS": "200"}).stdout.split())
        assert "(see kpool engines)" in out and "BASE+PATCH" in out, args
    listed = kpool_here("engines", env={"COLUMNS": "200"}).stdout
    assert all(name in listed for name in [*VERSIONS, *BASES, *PATCHES])
    docs = (ROOT / "docs" / "configuration.md").read_text()
    assert "kpool engines" in docs


def test_not_regular_names_each_kind(tmp_path: Path) -> None:
    from kpool_cli.inputs import not_regular

    os.mkfifo(tmp_path / "p")
    (tmp_path / "f").write_text("x")
    assert not_regular(tmp_path / "p") == "is a FIFO, not a regular file"
    assert not_regular(tmp_path) == "is a directory"
    assert not_regular(tmp_path / "f") is None and not_regular(tmp_path / "missing") is None
    assert stat.S_ISREG(os.stat(tmp_path / "f").st_mode)
    assert sys.platform != "linux" or not_regular("/proc/self/status") is not None
