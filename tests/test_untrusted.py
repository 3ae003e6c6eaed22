"""A trace is untrusted data: it runs no code, cannot drive the terminal, and no
output destroys an input; every way a run ends has an honest exit status.

Each test runs `kpool` as a user would (a subprocess, or click's runner where the
process does not matter) and asserts what the user sees: the exit status, the
message on stderr, the files left behind.
"""

from __future__ import annotations

import json
import os
import pty
import resource
import select
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import hostile
import jsonschema
import pytest

from kpool_cli import signals
from kpool_cli.contracts import files
from kpool_cli.contracts.report_format import report_schema

ROOT = Path(__file__).resolve().parent.parent
RACE = ROOT / "traces" / "shared-prefix-race.yaml"
KPOOL = [sys.executable, "-m", "kpool_cli"]


def kpool(*args: str, cwd: Path = ROOT, env: dict | None = None, **kw
          ) -> subprocess.CompletedProcess:
    return subprocess.run([*KPOOL, *args], capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, **(env or {})}, timeout=120, **kw)


def kpool_here(*args: str, cwd: Path = ROOT, env: dict | None = None
               ) -> subprocess.CompletedProcess:
    """`kpool(*args)` run in this process instead, for a test of what kpool says and
    writes rather than of its process (its signals, descriptors, limits, imports,
    workers, plug-ins, standard input): `hostile.run_argv`, main() with sys.argv and
    the standard streams swapped, under the environment a child would inherit. A
    child costs 0.3-0.5 s of CPU, nearly all of it starting Python and loading numba
    and kpool's kernels again; here they are loaded once. What escapes main() fails
    the test, with its traceback. Not for help texts: click's runner wraps them at 80
    columns whatever COLUMNS says (a child wraps them at 78, or to COLUMNS)."""
    o = hostile.run_argv(list(args), env, 120, cwd=cwd, base={})
    assert o.exc is None, o.exc
    return subprocess.CompletedProcess([*KPOOL, *args], o.code, o.stdout, o.stderr)


def write(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text))
    return path


RACE_BODY = """\
    cache: {kv_size: 32, kpool: 4, n_seq_max: 2}
    ops:
      - decode: {seq: 0, pos: 0..8}
      - seq_cp: {src: 0, dst: 1}
      - decode: {seq: 0, pos: 8}
    """


def long_trace(n: int) -> str:
    """A cache-safe race that goes on for `n` ubatches (a few seconds of work)."""
    lines = ["kpool_trace: 1", "cache: {kv_size: 8192, kpool: 4, n_seq_max: 2}", "ops:",
             "  - decode: {seq: 0, pos: 0..64}", "  - seq_cp: {src: 0, dst: 1}"]
    lines += [f"  - decode: {{tokens: [{{pos: {i}, seq: [0]}}, {{pos: {i}, seq: [1]}}]}}"
              for i in range(64, 64 + n)]
    return "\n".join(lines) + "\n"


# -- 1. a trace runs no code ----------------------------------------------------------


@pytest.mark.parametrize("engine", ["sys:exit", "os:abort", "evil:V", "no-such-version"])
def test_a_trace_names_only_registered_engines(tmp_path, engine):
    (tmp_path / "evil.py").write_text(
        "import pathlib\npathlib.Path('ran').write_text('imported')\nV = None\n")
    t = write(tmp_path / "t.yaml", f"kpool_trace: 1\nengine: {json.dumps(engine)}\n"
              + textwrap.dedent(RACE_BODY))
    r = kpool("replay", str(t), cwd=tmp_path)
    assert r.returncode == 2 and r.stdout == ""
    assert f"t.yaml:2:9: engine: unknown engine {engine!r}" in r.stderr
    assert ("a trace is data and names registered versions only: a plug-in (module:Name) "
            "is given with --engine" in r.stderr) == (":" in engine)
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "ran").exists()  # nothing was imported


def test_a_plugin_is_not_looked_up_in_the_current_directory(tmp_path):
    """`python -m` would put the current directory on sys.path: kpool drops it, so
    `--engine evil:V` finds nothing there, and says how the lookup works."""
    (tmp_path / "evil.py").write_text(
        "import pathlib\npathlib.Path('ran').write_text('imported')\n")
    r = kpool("replay", str(RACE), "--engine", "evil:V", cwd=tmp_path)
    assert r.returncode == 2
    assert "no module named 'evil' on Python's import path" in r.stderr
    assert "PYTHONPATH" in r.stderr and "current directory is not searched" in r.stderr
    assert not (tmp_path / "ran").exists()


@pytest.mark.parametrize("body, said", [
    ("import sys\nsys.exit(0)\n", "it called sys.exit(0)"),
    ("raise RuntimeError('boom')\n", "RuntimeError: boom"),
    ("def V():\n    raise SystemExit(0)\n", "V is a function, not a kpool_cli.versions"),
    ("V = 42\n", "is a int, not a kpool_cli.versions.EngineVersion"),
])
def test_a_failing_plugin_is_exit_2_never_0(tmp_path, body, said):
    (tmp_path / "plug.py").write_text(body)
    r = kpool("replay", str(RACE), "--engine", "plug:V", cwd=tmp_path,
              env={"PYTHONPATH": str(tmp_path)})
    assert r.returncode == 2 and r.stdout == ""
    assert said in r.stderr and "Traceback" not in r.stderr


def test_a_plugin_on_pythonpath_runs(tmp_path):
    (tmp_path / "plug.py").write_text(
        "from dataclasses import replace\nfrom kpool_cli.versions import CACHE_SAFE\n"
        "V = replace(CACHE_SAFE, name='mine')\n")
    r = kpool("replay", str(RACE), "--engine", "plug:V", "--backend", "none",
              env={"PYTHONPATH": str(tmp_path)})
    assert r.returncode == 1 and "under mine" in r.stdout  # the race, KP001


def test_an_output_never_overwrites_a_plugin_engines_module(tmp_path):
    """versions.py `plugin_files`: the module a `module:Name` engine is imported from,
    and each package above it, is an input of `replay`, `diff` and `check` alike
    (`replay --engine plug:V -o plug.py` once wrote the text report over the user's
    engine, and `--engine pkg.plug:V -o pkg/__init__.py` over its package)."""
    body = ("from dataclasses import replace\nfrom kpool_cli.versions import CACHE_SAFE\n"
            "V = replace(CACHE_SAFE, name='mine')\n")
    plug, pkg = tmp_path / "plug.py", tmp_path / "pkg"
    plug.write_text(body)
    pkg.mkdir()
    (pkg / "__init__.py").write_text("# the package\n")
    (pkg / "plug.py").write_text(body)
    files = [plug, pkg / "__init__.py", pkg / "plug.py"]
    before = [f.read_text() for f in files]
    env = {"PYTHONPATH": str(tmp_path)}
    for spec, out in (("plug:V", plug), ("pkg.plug:V", pkg / "__init__.py"),
                      ("pkg.plug:V", pkg / "plug.py")):
        for args in (("replay", str(RACE), "--engine", spec, "-o", str(out)),
                     ("diff", str(RACE), "--head", spec, "-o", str(out)),
                     ("check", str(RACE), "--engine", spec, "-o", str(out))):
            r = kpool(*args, env=env)
            assert r.returncode == 2 and f"is the input {out}" in r.stderr, (args, r.stderr)
    assert [f.read_text() for f in files] == before


# -- 2. trace text cannot drive the terminal -----------------------------------------

ATTACK = "\x1b[2J\x1b[31mPASS\x07"
TITLE = "\x1b]0;title\x07\x1b[1A\x1b[2K  summary: 0 ubatches: PASS\r\u202e"


def hostile_trace(tmp_path: Path) -> Path:
    description = json.dumps("line one" + ATTACK + "\nline two")
    return write(tmp_path / "hostile.yaml", f"""\
        kpool_trace: 1
        name: {json.dumps(ATTACK)}
        description: {description}
        cache: {{kv_size: 32, kpool: 4, n_seq_max: 3}}
        ops:
          - decode: {{seq: 0, pos: 0..8}}
          - note: {json.dumps(TITLE)}
          - state_write: {{seq: 0, slot: {json.dumps("s" + ATTACK)}}}
          - seq_cp: {{src: 0, dst: 1}}
          - decode: {{seq: 0, pos: 8}}
          - state_read: {{seq: 2, slot: {json.dumps("s" + ATTACK)}}}
        """)


def assert_shown_not_obeyed(text: str) -> None:
    """The attack's escapes are on the page as text; none reached the terminal."""
    for raw in ("\x1b[2J", "\x1b]0;", "\x07", "\x1b[1A", "\r\u202e", "\u202e"):
        assert raw not in text
    assert "\\x1b[2J\\x1b[31mPASS\\x07" in text


def test_plain_view_shows_control_characters(tmp_path):
    r = kpool_here("replay", str(hostile_trace(tmp_path)), "--engine", "cache-safe")
    assert r.returncode == 1
    assert_shown_not_obeyed(r.stdout)
    assert "\\x1b]0;title\\x07\\x1b[1A\\x1b[2K  summary: 0 ubatches: PASS\\r\\u202e" in r.stdout
    assert sum(line.lstrip().startswith("summary:") for line in r.stdout.splitlines()) == 1


def test_svg_and_html_show_control_characters(tmp_path):
    t = hostile_trace(tmp_path)
    svg, html = tmp_path / "v.svg", tmp_path / "v.html"
    r = kpool_here("replay", str(t), "--engine", "cache-safe", "--svg", str(svg),
                   "--html", str(html), env={"COLUMNS": "200"})
    assert r.returncode == 1
    for f in (svg, html):
        text = f.read_text()
        assert "\x1b" not in text and "\x07" not in text and "\u202e" not in text
        assert "x1b[2J" in text  # the escape, as text (SVG/HTML may encode the backslash)


def test_rich_view_on_a_terminal_shows_control_characters(tmp_path):
    t = hostile_trace(tmp_path)
    out = run_on_a_terminal([*KPOOL, "replay", str(t), "--engine", "cache-safe",
                             "--no-color"])
    assert_shown_not_obeyed(out)


def run_on_a_terminal(argv: list[str]) -> str:
    """What `argv` prints on a pseudo-terminal 120 columns wide."""
    pid, fd = pty.fork()
    if pid == 0:  # the child: stdout and stderr are the terminal
        os.environ["COLUMNS"] = "120"
        os.environ.pop("FORCE_COLOR", None)
        os.chdir(ROOT)
        os.execv(argv[0], argv)
    chunks = []
    while True:
        ready, _, _ = select.select([fd], [], [], 120)
        if not ready:
            break
        try:
            data = os.read(fd, 65536)
        except OSError:
            break
        if not data:
            break
        chunks.append(data)
    os.waitpid(pid, 0)
    return b"".join(chunks).decode("utf-8", "replace")


def test_error_messages_show_control_characters(tmp_path):
    bad = write(tmp_path / ("bad" + "\x1b[2J" + ".yaml"), "kpool_trace: 1\ncache: 3\nops: []\n")
    r = kpool_here("replay", str(bad))
    assert r.returncode == 2 and "\x1b" not in r.stderr and "bad\\x1b[2J.yaml" in r.stderr
    r = kpool_here("explain", ATTACK)
    assert r.returncode == 2 and "\x1b" not in r.stderr and "\x07" not in r.stderr


# -- 3. outputs never destroy inputs ---------------------------------------------------


def test_an_output_that_is_an_input_is_refused(tmp_path):
    t = tmp_path / "t.yaml"
    t.write_text(RACE.read_text())
    link = tmp_path / "link.yaml"
    link.symlink_to(t)
    before = t.read_text()
    for args, said in [
        ((str(t), "-o", str(t)), f"--output {t}: is the input {t}"),
        ((str(link), "-o", str(t)), "is the input"),
        ((str(t), "-o", str(link)), "is the input"),
        ((str(t), "--svg", str(t)), "--svg"),
        ((str(t), "--svg", str(tmp_path / "a"), "--html", str(tmp_path / "a")),
         "the same file as --svg"),
    ]:
        r = kpool_here("replay", *args)
        assert r.returncode == 2 and said in r.stderr, (args, r.stderr)
        assert r.stdout == ""
    assert t.read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.yaml", "t.yaml"]


def test_an_output_that_is_not_a_regular_file_is_refused(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    devlink = tmp_path / "devlink"
    devlink.symlink_to("/dev/null")
    for target, said in [("/dev/null", "is a device"), (str(devlink), "is a device"),
                         (str(fifo), "is a FIFO"), (str(tmp_path), "is a directory"),
                         ("", "the path is empty"),
                         (str(tmp_path / "no" / "r.json"), "does not exist")]:
        r = kpool_here("replay", str(RACE), "--format", "json", "-o", target)
        assert r.returncode == 2 and said in r.stderr, (target, r.stderr)
    assert os.path.exists("/dev/null") and not os.path.isfile("/dev/null")


def test_dash_is_stdout():
    r = kpool_here("replay", str(RACE), "--format", "json", "-o", "-", "--backend", "none")
    assert r.returncode == 0 and json.loads(r.stdout)["kpool_report"] == 1


@pytest.mark.skipif(os.access("/sys", os.W_OK) and not os.path.ismount("/sys"),
                    reason="needs a read-only directory: /sys")
def test_a_read_only_directory_is_exit_2_with_the_reason():
    """/sys stands for a read-only directory (as root, permission bits do not stop
    kpool; a read-only file system does)."""
    r = kpool_here("replay", str(RACE), "-o", "/sys/kpool-report.txt")
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.startswith("kpool: cannot write /sys/kpool-report.txt: ")
    assert "internal error" not in r.stderr
    assert not os.path.exists("/sys/kpool-report.txt")


def _small_files() -> None:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (2000, 2000))


def test_a_write_that_fails_midway_is_exit_2_and_leaves_nothing(tmp_path):
    """A full disk, as the file-size limit makes it: the write fails with the system's
    reason; the temporary file is gone and no report appears."""
    out = tmp_path / "r.json"
    # no bytecode or numba cache written under the limit: it would be cut short too
    r = subprocess.run([*KPOOL, "replay", str(RACE), "--format", "json", "-o", str(out),
                        "--backend", "none"], capture_output=True, text=True, cwd=ROOT,
                       preexec_fn=_small_files, timeout=120,
                       env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    assert r.returncode == 2
    assert f"cannot write {out}: File too large" in r.stderr
    assert list(tmp_path.iterdir()) == []


# -- 4. honest exit statuses -----------------------------------------------------------


def _signal_mid_run(tmp_path: Path, sig: int, fmt: str) -> tuple[int, str]:
    t = tmp_path / "long.yaml"
    t.write_text(long_trace(3000))
    out = tmp_path / f"r.{fmt}"
    p = subprocess.Popen([*KPOOL, "replay", str(t), "--engine", "cache-safe", "--format", fmt,
                          "-o", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, cwd=ROOT)
    deadline = time.monotonic() + 60
    while not any(q.name.endswith(".tmp") for q in tmp_path.iterdir()):
        assert p.poll() is None and time.monotonic() < deadline
        time.sleep(0.01)
    p.send_signal(sig)
    _, err = p.communicate(timeout=60)
    assert sorted(q.name for q in tmp_path.iterdir()) == ["long.yaml"]  # no temporary
    return p.returncode, err


@pytest.mark.parametrize("fmt", ["json", "text"])
def test_sigint_is_130_and_one_line(tmp_path, fmt):
    code, err = _signal_mid_run(tmp_path, signal.SIGINT, fmt)
    assert code == 130 and err == "kpool: interrupted\n"


def test_a_signal_as_the_temporary_file_is_made_leaves_no_file(tmp_path, monkeypatch):
    """SIGTERM at the moment the output's temporary file exists but before its writer
    knows its name (what the test below aims at, and under load hit: a `.tmp` left
    behind): the creation runs masked (`signals.masked`: the signal waits, whichever
    thread takes it), so it lands where the cleanup can remove the file."""
    real = files.tempfile.mkstemp

    def mkstemp(*args, **kwargs):
        made = real(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGTERM)  # arrives before mkstemp has returned
        return made

    monkeypatch.setattr(files.tempfile, "mkstemp", mkstemp)
    old = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    signals.install()  # the CLI's handlers
    try:
        with pytest.raises(signals.Terminated), \
                files.written_whole(str(tmp_path / "r.json")) as f:
            f.write("{}")
    finally:
        signal.signal(signal.SIGINT, old[0])
        signal.signal(signal.SIGTERM, old[1])
    assert list(tmp_path.iterdir()) == []


_SIGNAL_IN_GC = """
import gc, signal, sys
from kpool_cli.cli.main import main
fired = []
def at_collection(phase, info):  # Ctrl-C as it lands while the collector runs
    handler = signal.getsignal(signal.SIGINT)
    if phase == "start" and not fired and handler.__module__ == "kpool_cli.signals":
        fired.append(1)
        handler(signal.SIGINT, None)
gc.callbacks.append(at_collection)
sys.argv = ["kpool", "replay", sys.argv[1], "--backend", "none", "--format", "json"]
main()
"""


def test_a_signal_that_lands_in_a_gc_callback_ends_the_run_without_a_traceback():
    """signals.py `_on_unraisable`: Python drops what a handler raises inside a gc
    callback and prints "Exception ignored in: <gc callback>" with a traceback. kpool
    keeps the signal (`lost()`): the user sees one line and status 130."""
    r = subprocess.run([sys.executable, "-c", _SIGNAL_IN_GC, str(RACE)], capture_output=True,
                       text=True, cwd=ROOT, timeout=120)
    assert (r.returncode, r.stderr) == (130, "kpool: interrupted\n")


def test_sigterm_is_143_and_leaves_no_temporary(tmp_path):
    code, err = _signal_mid_run(tmp_path, signal.SIGTERM, "json")
    assert code == 143 and err == "kpool: terminated\n"


@pytest.mark.parametrize("extra, env", [([], {}), ([], {"FORCE_COLOR": "1"}),
                                        (["--format", "json"], {})])
def test_a_reader_that_leaves_is_141_never_1(tmp_path, extra, env):
    """`kpool replay t.yaml | head -1` on a trace with findings: the reader left, so the
    run did not finish: 141, as a shell filter killed by SIGPIPE, and nothing on stderr."""
    t = tmp_path / "long.yaml"
    t.write_text(long_trace(1500))
    p = subprocess.Popen([*KPOOL, "replay", str(t), "--engine", "cache-safe", "--backend",
                          "none", "--all-ubatches", *extra], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, cwd=ROOT, env={**os.environ, **env})
    assert p.stdout is not None and p.stderr is not None
    p.stdout.readline()
    p.stdout.close()
    err = p.stderr.read()
    assert p.wait(timeout=60) == 141 and err == b""


def test_json_on_stdout_closes_when_the_trace_turns_out_invalid(tmp_path):
    late = write(tmp_path / "late.yaml", """\
        kpool_trace: 1
        cache: {kv_size: 8, kpool: 4}
        ops:
          - decode: {seq: 0, pos: 0, cell: 3}
          - decode: {seq: 0, pos: 1, cell: 3}
        """)
    for args in ([str(late)], [str(RACE), str(late), str(RACE)]):
        r = kpool_here("replay", *args, "--format", "json", "--backend", "none")
        assert r.returncode == 2
        assert "late.yaml:5:5: decode.cell: recorded cell 3" in r.stderr
        doc = json.loads(r.stdout)  # one valid document
        reports = doc if isinstance(doc, list) else [doc]
        for rep in reports:
            jsonschema.validate(rep, report_schema())
        bad = reports[-1]
        assert bad["summary"]["status"] == "invalid"
        assert bad["problems"] == [{"file": str(late), "line": 5, "column": 5,
                                    "field": "decode.cell", "message": "recorded cell 3 "
                                    "(stream 0) is not empty when the decode runs"}]
        assert len(reports) == len(args) - (len(args) > 1)  # nothing runs after it


def _children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(c) for c in f.read().split()]


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_diff_jobs_stops_its_workers_on_an_interrupt(tmp_path, sig, code):
    """Ctrl-C reaches the whole process group, as a terminal sends it: the parent says
    one line and its worker processes are gone when it exits, not after their unit
    (a unit of this trace runs for about a minute)."""
    t = tmp_path / "long.yaml"
    t.write_text(long_trace(4000))
    p = subprocess.Popen([*KPOOL, "diff", str(t), str(t), "-j", "2", "--backend", "numpy"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                         start_new_session=True)
    deadline = time.monotonic() + 60
    while len(workers := _children(p.pid)) < 2:
        assert p.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    time.sleep(0.5)  # the workers are replaying
    os.killpg(p.pid, sig)
    _, err = p.communicate(timeout=30)
    assert p.returncode == code
    assert err == ("kpool: interrupted\n" if code == 130 else "kpool: terminated\n")
    assert not [w for w in workers if os.path.exists(f"/proc/{w}")]


def test_a_replay_over_the_memory_budget_is_refused_before_it_starts(tmp_path):
    """--max-memory is checked before anything is allocated; the message names the
    config fields that drive the need."""
    t = write(tmp_path / "big.yaml", """\
        kpool_trace: 1
        cache: {kv_size: 131072, kpool: 4, n_embd: 4096}
        ops:
          - decode: {seq: 0, pos: 0..8}
          - clear: {}
        """)
    r = kpool_here("replay", str(t), "--backend", "numpy", "--max-memory", "32M")
    assert r.returncode == 2 and r.stdout == ""
    assert "over the memory budget of 32.0 MiB (--max-memory)" in r.stderr
    assert "cache.kv_size 131072" in r.stderr and "cache.n_embd 4096" in r.stderr
    r = kpool_here("replay", str(t), "--backend", "numpy", "--max-memory", "lots")
    assert r.returncode == 2 and "not a memory size: 'lots'" in r.stderr
    r = kpool("replay", str(t), "--backend", "numpy", "--max-memory", "none", "-q")
    assert r.returncode == 0


def test_usage_errors_show_the_arguments_visibly():
    r = kpool_here("explain", "kp001", "\u202eKP001\x1b[2J")
    assert r.returncode == 2
    assert "\u202e" not in r.stderr and "\x1b" not in r.stderr
    assert "\\u202eKP001" in r.stderr and "Usage: kpool explain" in r.stderr


def test_usage_errors_show_clicks_own_tabs_as_a_terminal_would_and_the_arguments_escaped():
    """`kpool schema` with no argument: click lists the choices one a line, each after
    a tab, which is kpool's text (shown as the terminal would: to column 8), never
    `\\t`. A tab or a line break in an argument click quotes stays escaped, so an
    argument cannot start a line of its own that reads as kpool's."""
    r = kpool_here("schema")
    assert r.returncode == 2 and "\\t" not in r.stderr and "\t" not in r.stderr, r.stderr
    assert ("Choose from:\n        trace,\n        report,\n        check,\n        diff\n"
            in r.stderr)
    r = kpool_here("schema", "trace", "x\n\tError: fake")
    assert r.returncode == 2 and "\t" not in r.stderr, r.stderr
    assert "Got unexpected extra argument (x\\n\\tError: fake)" in r.stderr
    assert "\nError: fake" not in r.stderr
    r = kpool_here("schema", "tr\tace")
    assert r.returncode == 2 and "'tr\\tace' is not one of" in r.stderr, r.stderr


def test_odd_paths_are_named_not_crashed_on(tmp_path):
    r = kpool_here("replay", "")
    assert r.returncode == 2 and r.stderr == "kpool: '': the trace path is empty\n"
    raw = os.fsencode(str(tmp_path)) + b"/\xff\xfe.yaml"
    with open(raw, "wb") as f:
        f.write(b"kpool_trace: 1\ncache: 3\nops: []\n")
    r = subprocess.run([*KPOOL, "replay", os.fsdecode(raw)], capture_output=True, cwd=ROOT,
                       timeout=120)
    err = r.stderr.decode("utf-8")  # kpool's stderr is UTF-8, whatever the file name
    assert r.returncode == 2 and "\\udcff\\udcfe.yaml:2:8: cache" in err
    assert "internal error" not in err


def _small_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))


def test_running_out_of_memory_past_the_budget_is_exit_2(tmp_path):
    """A limit the budget cannot see (ulimit -v): the allocation fails, and kpool says
    so in one line, exit 2, never an internal error."""
    t = write(tmp_path / "t.yaml", """\
        kpool_trace: 1
        cache: {kv_size: 8388608, kpool: 4, n_seq_max: 64, unified: false, n_embd: 1}
        ops:
          - decode: {seq: 0, pos: 0..8}
        """)
    r = subprocess.run([*KPOOL, "replay", str(t), "--backend", "numpy", "--max-memory", "none"],
                       capture_output=True, text=True, cwd=ROOT, preexec_fn=_small_memory,
                       timeout=120)
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith(f"kpool: {t}: out of memory") and "Traceback" not in r.stderr
    r = kpool_here("diff", str(t), "--max-memory", "512M")
    assert r.returncode == 2 and "over the memory budget of 512.0 MiB" in r.stderr


def test_the_default_budget_sees_ulimit_v(tmp_path):
    """Under `ulimit -v` the default --max-memory is at most half of what the address
    space still allows, so such a trace is refused before the replay, naming it."""
    t = write(tmp_path / "t.yaml", """\
        kpool_trace: 1
        cache: {kv_size: 1048576, kpool: 4, n_seq_max: 256, unified: false, n_embd: 1}
        ops:
          - decode: {seq: 0, pos: 0..8}
        """)
    r = subprocess.run([*KPOOL, "replay", str(t), "--backend", "none"], capture_output=True,
                       text=True, cwd=ROOT, timeout=120,
                       preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS,
                                                             (2 << 30, 2 << 30)))
    assert r.returncode == 2 and r.stdout == ""
    assert f"kpool: {t}: replaying it can need up to" in r.stderr


def test_diff_jobs_reports_the_budget_not_a_dead_worker():
    """The refusal is raised in a worker and must cross the process boundary whole."""
    r = kpool("diff", "-j", "2", "--backend", "numpy", "--max-memory", "1K",
              str(ROOT / "traces" / "prefill-decode.yaml"), str(RACE))
    assert r.returncode == 2 and "over the memory budget of 1.0 KiB" in r.stderr
    assert "process died" not in r.stderr


def test_a_path_cannot_fake_a_line_on_stderr(tmp_path):
    r = kpool_here("replay", str(tmp_path / "x\nkpool: all good.yaml"))
    assert r.returncode == 2 and r.stderr.count("\n") == 1  # one line: the path escaped
    assert "x\\nkpool: all good.yaml" in r.stderr


@pytest.mark.skipif(os.access("/sys", os.W_OK) and not os.path.ismount("/sys"),
                    reason="needs a read-only directory: /sys")
def test_svg_and_html_appear_together_or_not_at_all(tmp_path):
    svg = tmp_path / "v.svg"
    r = kpool_here("replay", str(RACE), "--svg", str(svg), "--html", "/sys/kpool-view.html")
    assert r.returncode == 2 and "cannot write /sys/kpool-view.html" in r.stderr
    assert list(tmp_path.iterdir()) == []
