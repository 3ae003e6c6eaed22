"""The defects a fourth hostile-input campaign found on 7 December 2026
(docs/robustness.md, "The fourth round"): fuzz's output folder, a plug-in's zip
archive, standard output onto an input, the memory cgroup, the signals that end a
process, and plug-ins' values. Each test runs what the campaign ran, or the function
it reached, and asserts what a user sees.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
from test_untrusted import kpool, kpool_here

PLUGIN = """from dataclasses import replace
from kpool_cli.versions import REP_ONCE
ok = replace(REP_ONCE, name="mine")
"""


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# -- kpool fuzz -o DIR -------------------------------------------------------------------


def test_fuzz_never_writes_through_a_link_in_its_folder(tmp_path):
    """Links named as shrunk traces, to the plug-in's own module: refused before any
    run (exit 2), the module untouched (fuzz wrote the trace over it, exit 0)."""
    plug = tmp_path / "plug"
    plug.mkdir()
    module = plug / "pg.py"
    module.write_text(PLUGIN)
    before = _digest(module)
    out = tmp_path / "found"
    out.mkdir()
    for name in ("KP005_decode_own", "KP008_seq_rm_own"):
        (out / f"{name}.yaml").symlink_to(module)
    r = kpool("fuzz", "--engine", "pg:ok", "--runs", "30", "--seed", "3", "-o", str(out),
              env={"PYTHONPATH": f"{os.environ.get('PYTHONPATH', '')}:{plug}"})
    assert r.returncode == 2, r.stderr
    assert "is a symbolic link" in r.stderr and r.stdout == ""
    assert _digest(module) == before


@pytest.mark.parametrize("make, says", [
    (lambda d: os.mkfifo(d / "found" / "KP008_seq_rm_own.yaml"), "is a FIFO"),
    (lambda d: (d / "found" / "KP001_decode_shared.yaml").mkdir(), "is a folder"),
])
def test_fuzz_refuses_a_folder_it_cannot_fill_before_any_run(tmp_path, make, says):
    (tmp_path / "found").mkdir()
    make(tmp_path)
    r = kpool_here("fuzz", "--engine", "cache-safe", "--runs", "300", "-o",
                   str(tmp_path / "found"))
    assert r.returncode == 2 and says in r.stderr, r.stderr
    assert r.stdout == ""  # no campaign ran: no summary
    assert sorted(p.name for p in (tmp_path / "found").iterdir()) in (
        ["KP008_seq_rm_own.yaml"], ["KP001_decode_shared.yaml"])


def test_fuzz_refuses_a_folder_under_a_file_before_any_run(tmp_path):
    (tmp_path / "afile").write_text("")
    r = kpool_here("fuzz", "--engine", "cache-safe", "--runs", "300", "-o",
                   str(tmp_path / "afile" / "sub"))
    assert r.returncode == 2 and "cannot write there" in r.stderr and r.stdout == ""


# -- plug-ins ------------------------------------------------------------------------------


def _zipped_plugin(folder: Path, body: str) -> Path:
    import zipfile

    archive = folder / "plug.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("zpg.py", body)
    return archive


def test_an_output_onto_the_zip_archive_a_plug_in_came_from_is_refused(tmp_path):
    """The archive is the file the plug-in is read from: `-o plug.zip` replaced it with
    the report (exit 0), and the next run found no module."""
    archive = _zipped_plugin(tmp_path, PLUGIN)
    before = _digest(archive)
    trace = tmp_path / "t.yaml"
    trace.write_text("kpool_trace: 1\ncache: {kv_size: 16, kpool: 4}\nops:\n"
                     "  - decode: {seq: 0, pos: 0..4}\n")
    env = {"PYTHONPATH": f"{os.environ.get('PYTHONPATH', '')}:{archive}"}
    for command in (["replay", str(trace)], ["diff", str(trace), "--base", "rep-once",
                                             "--head", "zpg:ok"]):
        extra = ["--engine", "zpg:ok"] if command[0] == "replay" else []
        r = kpool(*command, *extra, "--format", "json", "-o", str(archive), env=env)
        assert r.returncode == 2 and "is the input" in r.stderr, r.stderr
    assert _digest(archive) == before


def test_a_plug_in_value_set_past_its_checks_is_refused(tmp_path):
    """`object.__setattr__` after `replace` skips EngineVersion's own checks: the
    padding policy "bogus" replayed silently, exit 0."""
    (tmp_path / "bad.py").write_text(PLUGIN + 'object.__setattr__(ok, "padding", "bogus")\n')
    trace = tmp_path / "t.yaml"
    trace.write_text("kpool_trace: 1\ncache: {kv_size: 16, kpool: 4}\nops:\n"
                     "  - decode: {seq: 0, pos: 0..4}\n")
    r = kpool("replay", str(trace), "--engine", "bad:ok",
              env={"PYTHONPATH": f"{os.environ.get('PYTHONPATH', '')}:{tmp_path}"})
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith("kpool: engine 'bad:ok': ok.padding must be one of")


def test_fuzz_under_a_plug_in_named_with_a_lone_surrogate_writes_its_traces(tmp_path):
    """A name holding "\\udcff" (an undecodable byte, as Python carries it) made the
    shrunk trace's description a YAML escape no trace can load: an internal error."""
    (tmp_path / "spg.py").write_text(
        'from dataclasses import replace\nfrom kpool_cli.versions import CACHE_SAFE\n'
        'surr = replace(CACHE_SAFE, name="a\\udcffb")\n')
    r = kpool("fuzz", "--engine", "spg:surr", "--runs", "30", "--seed", "3", "-o",
              str(tmp_path / "found"),
              env={"PYTHONPATH": f"{os.environ.get('PYTHONPATH', '')}:{tmp_path}"})
    assert r.returncode == 0, r.stderr
    found = list((tmp_path / "found").glob("*.yaml"))
    assert found and all("under a\\udcffb" in f.read_text() for f in found)


# -- standard output onto an input ----------------------------------------------------------


@pytest.mark.parametrize("command", [["check", "{t}", "--backend", "none"],
                                     ["replay", "{t}", "--backend", "none"],
                                     ["validate", "{t}"],
                                     ["diff", "{r}", "{r2}", "--format", "json"]])
def test_standard_output_open_on_an_input_is_refused(tmp_path, command):
    """`kpool check t.yaml 1<>t.yaml` wrote PASS into the trace (and then read it back
    as INVALID); `-o /dev/stdout` was refused, plain stdout was not."""
    import subprocess
    import sys

    t = tmp_path / "t.yaml"
    t.write_text("kpool_trace: 1\ncache: {kv_size: 16, kpool: 4}\nops:\n"
                 "  - decode: {seq: 0, pos: 0..4}\n")
    r, r2 = tmp_path / "r.json", tmp_path / "r2.json"
    kpool_here("replay", str(t), "--backend", "none", "--format", "json", "-o", str(r))
    r2.write_bytes(r.read_bytes())
    victim = t if "{t}" in command else r
    before = _digest(victim)
    args = [a.format(t=t, r=r, r2=r2) for a in command]
    with open(victim, "r+b") as out:  # the shell's `1<>FILE`: no truncation
        p = subprocess.run([sys.executable, "-m", "kpool_cli", *args], stdout=out,
                           stderr=subprocess.PIPE, text=True, timeout=120)
    assert p.returncode == 2, p.stderr
    assert "standard output is the input" in p.stderr
    assert _digest(victim) == before


# -- settings discovery -------------------------------------------------------------------


def test_a_settings_search_that_cannot_read_a_folder_says_so_not_cannot_write(tmp_path):
    """In a working folder past the system's path length, the search for a settings
    file failed with "cannot write <cwd>: File name too long" (nothing was written)."""
    import subprocess
    import sys

    here = os.getcwd()
    os.chdir(tmp_path)
    try:
        for _ in range(45):  # 45 x 101 characters: past PATH_MAX (4096), one step at a time
            os.mkdir("x" * 100)
            os.chdir("x" * 100)
        Path("t.yaml").write_text("kpool_trace: 1\ncache: {kv_size: 16, kpool: 4}\nops: []\n")
        runs = [subprocess.run([sys.executable, "-m", "kpool_cli", "check", "t.yaml",
                                "--backend", "none", *extra], capture_output=True,
                               text=True, timeout=120) for extra in ([], ["--no-config"])]
    finally:
        os.chdir(here)
    r, r_no_config = runs
    assert r.returncode == 2
    assert "cannot look for a settings file there: File name too long" in r.stderr
    assert "cannot write" not in r.stderr and "--no-config" in r.stderr
    assert r_no_config.returncode == 0, r_no_config.stderr


# -- signals that end a process -------------------------------------------------------------


@pytest.mark.parametrize("name", ["SIGQUIT", "SIGUSR1", "SIGALRM", "SIGXCPU"])
def test_every_signal_that_ends_a_process_leaves_no_temporary_file(tmp_path, name):
    """Ctrl-\\ (SIGQUIT), `timeout -s USR1`, an alarm, `ulimit -t`'s soft limit
    (SIGXCPU): each killed kpool with its default action, leaving the output's
    half-written `.r.json.XXXX.tmp`. Each now ends as SIGTERM does: the temporary
    removed, "kpool: terminated", 128 + the signal's number."""
    import signal

    from test_untrusted import _signal_mid_run

    sig = getattr(signal, name)
    code, err = _signal_mid_run(tmp_path, sig, "json")
    assert code == 128 + sig and err == "kpool: terminated\n"


# -- the memory budget's cgroup ---------------------------------------------------------------


def _cgroup_tree(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


@pytest.mark.parametrize("proc, files, room", [
    # v2, a service's MemoryMax= on its own cgroup (the root has none)
    ("0::/system.slice/kpool.service\n",
     {"memory.max": "max\n", "system.slice/kpool.service/memory.max": "1073741824\n",
      "system.slice/kpool.service/memory.current": "73741824\n"}, 1_000_000_000),
    # v2, the parent's limit binds tighter than the child's
    ("0::/a/b\n", {"a/memory.max": "500000000\n", "a/memory.current": "100000000\n",
                   "a/b/memory.max": "2000000000\n", "a/b/memory.current": "0\n"},
     400_000_000),
    # v1 (hybrid: a memory controller of its own), nested, "no limit" above it
    ("4:memory:/process_api/job\n0::/\n",
     {"memory/memory.limit_in_bytes": "9223372036854771712\n",
      "memory/process_api/job/memory.limit_in_bytes": "1073741824\n",
      "memory/process_api/job/memory.usage_in_bytes": "0\n"}, 1 << 30),
    # no limit anywhere
    ("0::/x\n", {"memory.max": "max\n", "x/memory.max": "max\n"}, None),
    # a parent slice whose usage is mostly reclaimable file cache
    ("0::/s/job\n", {"s/memory.max": "4000000000\n", "s/memory.current": "3900000000\n",
                     "s/memory.stat": "anon 100000000\ninactive_file 3000000000\n"},
     3_100_000_000),
])
def test_the_budget_reads_the_process_s_own_memory_cgroup(tmp_path, proc, files, room):
    """The default --max-memory read only the hierarchy's root: a 1 GiB child cgroup
    left an 11.5 GiB budget, and the OOM killer ended the replay (exit 137, no
    message). Every level from the process's own cgroup up binds it."""
    from kpool_cli.backend import budget

    (tmp_path / "cgroup").write_text(proc)
    _cgroup_tree(tmp_path / "fs", files)
    assert budget._cgroup_headroom(str(tmp_path / "cgroup"), str(tmp_path / "fs")) == room


# -- --svg's size ---------------------------------------------------------------------------


def test_svg_of_a_long_run_stops_its_views_at_a_budget_and_keeps_the_summary(tmp_path):
    """--svg recorded every ubatch's view: a 150-ubatch trace of 16 slots made a 126 MB
    SVG in 94 s and 957 MB (--html stops its views at 3 MiB). The views now stop at
    SVG_RECORD_CHARS characters, with a line saying where and how to see the rest,
    and the summary is still there."""
    import re

    from test_untrusted import long_trace

    from kpool_cli.report.text import SVG_RECORD_CHARS

    t = tmp_path / "long.yaml"
    t.write_text(long_trace(100))  # the views stop near ubatch 44: 100 is past it
    svg = tmp_path / "v.svg"
    r = kpool_here("replay", str(t), "--engine", "cache-safe", "--backend", "none",
                   "--all-ubatches", "--svg", str(svg), "-q")
    assert r.returncode == 1, r.stderr
    text = re.sub(r"<[^>]+>", "", svg.read_text()).replace("&#160;", " ")
    shown = re.findall(r"\bubatch (\d+) · op ", " ".join(text.split()))
    assert 0 < len(set(shown)) < 100
    first = max(map(int, shown)) + 1
    assert f"the views stop before ubatch {first}, at {SVG_RECORD_CHARS:,} characters" \
        in " ".join(text.split())
    assert "summary" in text and svg.stat().st_size < 8 << 20
    # the rich view as the output (a terminal, FORCE_COLOR): every view on stdout,
    # the note in the file alone
    r = kpool_here("replay", str(t), "--engine", "cache-safe", "--backend", "none",
                   "--all-ubatches", "--svg", str(svg), "-q", env={"FORCE_COLOR": "1"})
    assert r.returncode == 1 and "views stop" not in r.stdout
    assert "ubatch 99 " in re.sub(r"\x1b\[[0-9;]*m", "", r.stdout)
    assert "views stop" in " ".join(re.sub(r"<[^>]+>", "", svg.read_text())
                                    .replace("&#160;", " ").split())


# -- two outputs on standard output ---------------------------------------------------------


@pytest.mark.parametrize("args, second", [
    (["diff", "{t}", "--html", "-", "--format", "json"], "--html"),  # JSON, then a page
    (["diff", "{t}", "--html", "/dev/stdout"], "--html"),
    (["diff", "{t}", "--html", "-", "-o", "-"], "--html"),
    (["replay", "{t}", "--html", "-"], "--html"),  # wrote a file named `-`
    (["replay", "{t}", "--svg", "-"], "--svg"),
])
def test_two_outputs_on_standard_output_are_refused(tmp_path, args, second):
    t = tmp_path / "t.yaml"
    t.write_text("kpool_trace: 1\ncache: {kv_size: 16, kpool: 4}\nops:\n"
                 "  - decode: {seq: 0, pos: 0..4}\n")
    r = kpool_here(*[a.format(t=t) for a in args], cwd=tmp_path)
    assert r.returncode == 2 and r.stdout == "", r.stderr
    assert f"{second} and --output both go to standard output" in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.yaml"]


def test_a_page_on_standard_output_is_written_there_when_the_report_is_not(tmp_path):
    t = tmp_path / "t.yaml"
    t.write_text("kpool_trace: 1\ncache: {kv_size: 16, kpool: 4}\nops:\n"
                 "  - decode: {seq: 0, pos: 0..4}\n")
    r = kpool_here("replay", str(t), "--html", "-", "-o", str(tmp_path / "r.txt"),
                   cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("<!DOCTYPE html>") and (tmp_path / "r.txt").exists()
    assert not (tmp_path / "-").exists()


# -- a key by alias -------------------------------------------------------------------------


def test_a_duplicate_key_by_alias_is_placed_where_the_alias_stands():
    """`*k : "b"` on line 5 repeats the key anchored on line 2: the message named line
    2 for both, so the reader looked for the duplicate where the first one is."""
    from kpool_cli.trace.load import TraceError, load_trace_text

    text = ('kpool_trace: 1\n&k name: "a"\ncache: {kv_size: 16, kpool: 4}\nops: []\n'
            '*k : "b"\n')
    with pytest.raises(TraceError) as e:
        load_trace_text(text, "ak.yaml")
    (p,) = e.value.problems
    assert (p.line, p.field) == (5, "name")
    assert "duplicate key 'name' (first at line 2" in p.message


def test_the_default_budget_is_shared_by_the_processes_of_jobs(monkeypatch):
    """With `-j N` each worker checked its replay against the whole default budget
    (half of the memory available), so N of them could take N halves. Not given,
    --max-memory is now that half shared by the processes that run at once; given,
    it is each one's."""
    import click
    from click.testing import CliRunner

    from kpool_cli.backend import budget
    from kpool_cli.cli import options

    monkeypatch.setattr(budget, "_meminfo", lambda key: 8 << 30)
    monkeypatch.setattr(budget, "_cgroup_headroom", lambda: None)
    monkeypatch.setattr(budget, "_address_space_headroom", lambda: None)
    monkeypatch.setattr("os.cpu_count", lambda: 4)

    @click.command()
    @options.max_memory_option(jobs=True)
    @click.option("--jobs", type=int, default=1)
    def show(max_memory, jobs):
        click.echo(options.shared_budget(max_memory, jobs, 100))

    run = CliRunner().invoke
    assert run(show, []).output == f"{4 << 30}\n"
    assert run(show, ["--jobs", "2"]).output == f"{2 << 30}\n"
    assert run(show, ["--jobs", "16"]).output == f"{1 << 30}\n"  # 4 cores run at once
    assert run(show, ["--jobs", "2", "--max-memory", "3G"]).output == f"{3 << 30}\n"


def test_a_handler_of_the_caller_s_own_stays_beyond_int_term_and_hup():
    """`signals.install()` takes the signals that would kill the process, not one the
    caller handles: a harness's SIGALRM (tests/hostile.py times a case out so) or a
    sampling profiler's SIGPROF ran kpool's handler instead, "kpool: terminated"."""
    import subprocess
    import sys

    script = ("import signal\n"
              "mine = lambda *a: None\n"
              "signal.signal(signal.SIGALRM, mine)\n"
              "from kpool_cli import signals\n"
              "signals.install()\n"
              "print(signal.getsignal(signal.SIGALRM) is mine,\n"
              "      signal.getsignal(signal.SIGQUIT) is signals._on_sigterm,\n"
              "      signal.getsignal(signal.SIGTERM) is signals._on_sigterm)\n")
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       timeout=60)
    assert r.stdout == "True True True\n", r.stderr


def test_fuzz_writes_into_a_folder_named_through_a_link_and_leaves_none_it_made_empty(
        tmp_path):
    """The folder itself may be a link (`-o ~/scratch`): only the entries in it must not
    be; and a folder made for shrunk traces that got none is removed again."""
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    r = kpool_here("fuzz", "--engine", "cache-safe", "--runs", "20", "-o",
                   str(tmp_path / "link"))
    assert r.returncode == 0, r.stderr
    assert list(real.glob("KP*.yaml"))
    r = kpool_here("fuzz", "--engine", "rep-once", "--runs", "1", "--seed", "100", "-o",
                   str(tmp_path / "none"))
    assert r.returncode == 0 and not (tmp_path / "none").exists(), r.stderr
