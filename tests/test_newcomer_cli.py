"""Surprises of a newcomer walking the README: no `-` for a trace on stdin, no
summary when Ctrl-C ends `kpool fuzz`, `kpool validate` silent on why it stopped at a
trace's version, `--seed` bounded one way by `kpool fuzz` and another by `kpool gen
random`; and the help: `kpool --help` cutting five commands' lines with `...` at 80
columns, `kpool gen` speaking of commands where the README says scenarios,
`replay --seq` helped as `sequence S` beside a metavar of `0-255`, a scenario's help
opening in lower case, and `kpool explain --list KP001` answered as if neither had
been given; `replay --max-memory` helped as shared by `--jobs` processes replay does
not have; a plug-in that failed to import said what it raised but not where in the
plug-in, nor, for a misspelt policy, which policies there are; `replay --engine all`
called `all` unknown; and `kpool fuzz --base` put the base's name under `where (op,
path)`.
Each test runs
`kpool` as a user would (in this process, `kpool_here`, where the process does not
matter; or reads the help click prints) and asserts what they see.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pty
import re
import signal
import subprocess
import time
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from test_untrusted import KPOOL, RACE, kpool, kpool_here, write

from kpool_cli.cli.fuzz import fuzz_cmd
from kpool_cli.cli.gen import gen_cmd
from kpool_cli.cli.main import COMMANDS, cli
from kpool_cli.gen.fuzz import tasks_for
from kpool_cli.gen.random_trace import random_trace
from kpool_cli.gen.scenarios import SCENARIOS
from kpool_cli.trace.format import SEED_MAX
from kpool_cli.trace.load import MAX_BYTES, load_trace_text
from kpool_cli.trace.write import dump_trace

# -- 1. `-`: one trace on standard input ---------------------------------------------------


def test_a_generated_trace_piped_into_replay_is_the_file_replayed(tmp_path: Path) -> None:
    """`kpool gen random | kpool replay -` replays what `gen` wrote: the report is the
    file's, named `<stdin>`, with the sha256 of the bytes piped in."""
    gen = kpool_here("gen", "random", "--seed", "3")
    assert gen.returncode == 0, gen.stderr
    t = tmp_path / "g.yaml"
    t.write_text(gen.stdout)
    piped = kpool("replay", "-", "--format", "json", "--backend", "none", input=gen.stdout)
    given = kpool_here("replay", str(t), "--format", "json", "--backend", "none")
    assert piped.returncode == given.returncode == 0, piped.stderr
    a, b = json.loads(piped.stdout), json.loads(given.stdout)
    assert a["trace"]["path"] == "<stdin>"
    assert a["trace"]["sha256"] == hashlib.sha256(gen.stdout.encode()).hexdigest()
    assert a["ubatches"] == b["ubatches"] and a["summary"] == b["summary"]


def test_an_invalid_trace_on_stdin_is_located_at_stdin(tmp_path: Path) -> None:
    """Line 2, column 28 is the `9` of `kpool: 9` (counted by hand)."""
    text = "kpool_trace: 1\ncache: {kv_size: 4, kpool: 9}\nops: []\n"
    for cmd in ("replay", "validate", "check"):
        r = kpool(cmd, "-", input=text, cwd=tmp_path)
        assert r.returncode == 2, (cmd, r.stderr)
        assert "<stdin>:2:28: cache.kpool: out of range" in r.stdout + r.stderr, cmd
        assert "Traceback" not in r.stderr


def test_stdin_is_bounded_as_a_file_is(tmp_path: Path) -> None:
    """One byte past MAX_BYTES is refused, as a file of that size is; --max-tokens too."""
    r = subprocess.run([*KPOOL, "validate", "-"], input=b" " * (MAX_BYTES + 1),
                       capture_output=True, cwd=tmp_path, timeout=120)
    assert r.returncode == 2
    assert f"<stdin>: the trace is larger than {MAX_BYTES >> 20} MiB" in r.stdout.decode()
    tokens = ("kpool_trace: 1\ncache: {kv_size: 16, kpool: 4}\nops:\n"
              "  - decode: {seq: 0, pos: 0..8}\n")
    r = kpool("replay", "-", "--max-tokens", "4", input=tokens, cwd=tmp_path)
    assert r.returncode == 2
    # column 27: the `0` of `pos: 0..8`
    assert ("<stdin>:4:27: ops[0].decode.pos: more than 4 tokens in the trace (8 here, "
            "0 before)") in r.stderr, r.stderr


def test_a_terminal_on_stdin_is_refused_not_waited_on(tmp_path: Path) -> None:
    main, child = pty.openpty()
    try:
        r = subprocess.run([*KPOOL, "replay", "-"], stdin=child, capture_output=True,
                           text=True, cwd=tmp_path, timeout=120)
    finally:
        os.close(main)
        os.close(child)
    assert r.returncode == 2
    assert "kpool: <stdin>: cannot read the trace: it is a terminal" in r.stderr


def test_standard_input_named_by_a_path_is_refused_with_the_way_to_read_it(
        tmp_path: Path) -> None:
    """`/dev/stdin` (or `/dev/fd/0`) on a pipe is a FIFO, refused as any FIFO is, and
    the message says it is standard input, which `-` reads; a FIFO that is not
    standard input gets no such hint."""
    for path in ("/dev/stdin", "/dev/fd/0"):
        r = kpool("validate", path, input="kpool_trace: 1\n", cwd=tmp_path)
        assert r.returncode == 2, r.stderr
        assert (f"{path}: cannot read the trace: it is a FIFO, not a regular file "
                "(standard input: give - to read it)") in r.stdout, r.stdout
    fifo = tmp_path / "f.yaml"
    os.mkfifo(fifo)
    r = kpool("validate", str(fifo), input="kpool_trace: 1\n", cwd=tmp_path)
    assert r.returncode == 2 and "is a FIFO, not a regular file" in r.stdout
    assert "standard input" not in r.stdout


def test_no_output_lands_on_stdin(tmp_path: Path) -> None:
    """stdin is an input: the file it is open on is never written, nor is stdin."""
    t = write(tmp_path / "t.yaml", RACE.read_text())
    before = t.read_bytes()
    with open(t) as stdin:
        r = kpool("replay", "-", "-o", str(t), stdin=stdin, cwd=tmp_path)
    assert r.returncode == 2 and "is the input <stdin>" in r.stderr
    assert t.read_bytes() == before
    r = kpool("replay", str(RACE), "-o", "/dev/stdin", cwd=tmp_path, input="")
    assert r.returncode == 2 and "names standard input" in r.stderr
    r = kpool_here("fuzz", "--engine", "cache-safe", "--runs", "1", "-o", "-", cwd=tmp_path)
    assert r.returncode == 2 and "-o -: standard output cannot take a folder" in r.stderr
    assert not (tmp_path / "-").exists()


def test_dash_is_stdin_and_dot_slash_dash_a_file(tmp_path: Path) -> None:
    (tmp_path / "-").write_text("not a trace")
    r = kpool("validate", "-", input=RACE.read_text(), cwd=tmp_path)
    assert r.returncode == 0 and "ok      <stdin>" in r.stdout, r.stdout
    r = kpool("validate", "./-", input=RACE.read_text(), cwd=tmp_path)
    assert r.returncode == 2 and "INVALID ./-" in r.stdout


def test_check_and_diff_take_a_trace_on_stdin_also_on_a_pool(tmp_path: Path) -> None:
    """With -j 2 the workers are forked after kpool read stdin: they replay what it
    read (the pipe is empty by then), so the diff is the file's."""
    r = kpool("check", "-", "-j", "2", input=RACE.read_text(), cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "PASS    <stdin> under rep-once" in r.stdout
    assert "PASS    <stdin> under cache-safe" in r.stdout
    piped = kpool("diff", "-", "-j", "2", "--format", "json", input=RACE.read_text(),
                  cwd=tmp_path)
    given = kpool_here("diff", str(RACE), "--format", "json", cwd=tmp_path)
    assert piped.returncode == given.returncode == 0, piped.stderr
    a, b = json.loads(piped.stdout), json.loads(given.stdout)
    assert a["summary"] == b["summary"] and a["summary"]["findings_fixed"] == {"KP001": 2}
    assert a["traces"][0]["differences"] == b["traces"][0]["differences"]


def test_diff_names_a_report_on_stdin_as_stdin(tmp_path: Path) -> None:
    """`kpool diff a.json -` said `a.json and - are not reports of the same trace`, and
    `kpool diff - t.yaml` `- is a report`, where every other message says `<stdin>`."""
    a = kpool_here("replay", str(RACE), "--format", "json", "--backend", "none", cwd=tmp_path)
    b = kpool_here("replay", str(Path(RACE).parent / "partial-copy.yaml"), "--format", "json",
                   "--backend", "none", cwd=tmp_path)
    (tmp_path / "a.json").write_text(a.stdout)
    r = kpool("diff", "a.json", "-", input=b.stdout, cwd=tmp_path)
    assert r.returncode == 2
    assert r.stderr.startswith("kpool: a.json and <stdin> are not reports of the same "
                               "trace: "), r.stderr
    r = kpool("diff", "-", str(RACE), input=a.stdout, cwd=tmp_path)
    assert r.returncode == 2
    assert "cannot mix reports with traces: <stdin> is a report (starts with {)" in r.stderr


# -- 2. Ctrl-C in kpool fuzz -------------------------------------------------------------


def test_ctrl_c_in_fuzz_prints_the_runs_done_and_exits_130(tmp_path: Path) -> None:
    """SIGINT once the first shrunk trace is written (run 0, seed 0, has KP001 on a
    coupled decode): the summary of the runs done, then `kpool: interrupted`, 130;
    every file in the folder is whole and named by the summary."""
    out = tmp_path / "found"
    runs = 1_000_000
    p = subprocess.Popen([*KPOOL, "fuzz", "--engine", "cache-safe", "--runs", str(runs),
                          "-o", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, cwd=tmp_path)
    deadline = time.monotonic() + 120
    while not list(out.glob("*.yaml")) and time.monotonic() < deadline:
        time.sleep(0.05)
    p.send_signal(signal.SIGINT)
    stdout, stderr = p.communicate(timeout=120)
    assert p.returncode == 130, stderr
    assert stderr.splitlines()[-1] == "kpool: interrupted"
    # counts from 10,000 on are grouped by thousands (wording.count)
    m = re.match(r"kpool fuzz: interrupted after ([\d,]+) of 1,000,000 runs", stdout)
    assert m is not None, stdout
    assert 1 <= int(m.group(1).replace(",", "")) < runs
    assert re.search(r"KP001 +\d+ +0 +decode-coupled/shared", stdout), stdout
    left = sorted(os.listdir(out))
    assert left and not [n for n in left if n.startswith(".")], left  # no temporary
    for name in left:
        assert name in stdout
        load_trace_text((out / name).read_text())


# Ctrl-C while run 1 is counted (inside the block that holds signals): run 1 (seed 1)
# shows KP008 first, and its trace was shrunk; the signal is sent as the block ends
CTRL_C_WHILE_COUNTED = """
import contextlib, os, signal, sys
import kpool_cli.gen.fuzz as fuzz
from kpool_cli.cli.main import run
held, blocks = fuzz.held, []
@contextlib.contextmanager
def held_then_ctrl_c():
    with held():
        yield
        blocks.append(1)
        if len(blocks) == 2:
            os.kill(os.getpid(), signal.SIGINT)
fuzz.held = held_then_ctrl_c
sys.argv = ["kpool", "fuzz", "--engine", "cache-safe", "--runs", "50", "-o", sys.argv[1]]
run()
"""


def test_ctrl_c_while_a_run_is_counted_leaves_its_finding_with_its_trace(
        tmp_path: Path) -> None:
    """The campaign counted run 1 (its KP008 first seen) and raised the held Ctrl-C
    before the command wrote that run's shrunk trace: the summary listed `KP008 ...
    seq_rm/own  -` and the folder had no file for it. Its trace is now written as the
    run is counted: every finding the summary lists has its file, and every file is
    named by it."""
    out = tmp_path / "found"
    r = subprocess.run([*KPOOL[:1], "-c", CTRL_C_WHILE_COUNTED, str(out)],
                       capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert r.returncode == 130, r.stderr
    assert r.stdout.startswith("kpool fuzz: interrupted after 2 of 50 runs"), r.stdout
    rows = [line.split() for line in r.stdout.splitlines() if re.match(r"KP\d{3} ", line)]
    assert ["1", "1"] in [row[1:3] for row in rows], r.stdout  # runs 1, first seed 1
    for row in rows:
        assert row[-1] != "-" and (out / row[-1]).is_file(), r.stdout
    assert sorted(os.listdir(out)) == sorted(row[-1] for row in rows)


def test_the_fuzz_summary_says_1_run() -> None:
    """`kpool fuzz --runs 1` summed up `1 runs`."""
    from io import StringIO

    from kpool_cli.gen.fuzz import Progress
    from kpool_cli.report.fuzz_text import render_summary
    from kpool_cli.report.terminal import Manners, make_console

    for runs, stopped, said in ((1, None, "kpool fuzz: 1 run under cache-safe"),
                                (0, ("interrupted", 1),
                                 "kpool fuzz: interrupted after 0 of 1 run under"),
                                (2, None, "kpool fuzz: 2 runs under cache-safe")):
        buf = StringIO()
        render_summary(make_console(buf, Manners(False, False, 200)), Progress(runs=runs),
                       {}, "cache-safe", 0.1, stopped=stopped)
        assert buf.getvalue().startswith(said), buf.getvalue()


# -- 3. a trace of another version -----------------------------------------------------


def test_validate_says_the_rest_of_a_trace_of_another_version_was_not_checked(
        tmp_path: Path) -> None:
    t = write(tmp_path / "v2.yaml", """\
        kpool_trace: 2
        cache: {kv_size: 4, kpool: 9}
        ops: 3
        """)
    r = kpool_here("validate", str(t), cwd=tmp_path)
    assert r.returncode == 2
    problems = [line for line in r.stdout.splitlines() if line.startswith("  ")]
    assert problems == [
        f"  {t}:1:14: kpool_trace: unsupported format version 2, this kpool reads 1: the "
        "rest of the trace was not checked, since what a trace may hold depends on its "
        "version"]


# -- 4. one bound for --seed -----------------------------------------------------------


def _seed_bounds(command) -> tuple[int, int]:
    seed = next(p for p in command.params if p.name == "seed")
    return seed.type.lo, seed.type.hi


def test_fuzz_and_gen_random_take_the_same_seeds() -> None:
    assert _seed_bounds(fuzz_cmd) == _seed_bounds(gen_cmd.commands["random"]) == (0, SEED_MAX)


def test_every_fuzz_run_is_a_trace_gen_random_writes(tmp_path: Path) -> None:
    """From the top seed, runs 0, 1, 2 are seeds SEED_MAX, 0, 1 (wrapped), each one
    `kpool gen random --seed` takes and writes the run's trace for."""
    tasks = tasks_for("cache-safe", 3, SEED_MAX)
    assert [t.seed for t in tasks] == [SEED_MAX, 0, 1]
    for task in tasks:
        r = kpool_here("gen", "random", "--seed", str(task.seed), cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        unnamed = dataclasses.replace(load_trace_text(r.stdout), name="", description="")
        assert dump_trace(unnamed) == dump_trace(
            dataclasses.replace(random_trace(task.seed), name=""))
    r = kpool_here("fuzz", "--engine", "cache-safe", "--seed", str(SEED_MAX), "--runs", "2",
                   "-o", str(tmp_path / "found"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("kpool fuzz: 2 runs under cache-safe")



# -- 5. the help -----------------------------------------------------------------------


def _commands_section(out: str) -> list[str]:
    lines = out.splitlines()
    return lines[lines.index("Commands:") + 1:]


def test_kpool_help_lists_every_command_whole() -> None:
    """At 80 columns click cut five of the nine lines mid-phrase (`check     Check the
    traces in PATHS (files, or folders searched...`): each command is now listed on one
    line with its whole sentence; on a narrower terminal the sentence wraps, never cut."""
    r = kpool("--help", env={"COLUMNS": "80"})
    assert r.returncode == 0, r.stderr
    rows = _commands_section(r.stdout)
    assert [row.split()[0] for row in rows] == sorted(COMMANDS)
    for row in rows:
        name, sentence = row.split(maxsplit=1)
        assert sentence == COMMANDS[name][2], row
        assert len(row) <= 80 and not sentence.endswith("..."), row
    r = kpool("--help", env={"COLUMNS": "60"})
    assert r.returncode == 0, r.stderr
    said = " ".join(_commands_section(r.stdout))
    assert "..." not in said
    assert said.split() == [w for n in sorted(COMMANDS) for w in [n, *COMMANDS[n][2].split()]]


def test_gen_speaks_of_scenarios_as_the_readme_does() -> None:
    """`kpool gen SCENARIO`, the README's words: click said `COMMAND [ARGS]...`,
    `Commands:` and `No such command 'foo'.`"""
    r = kpool("gen", "--help")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("Usage: kpool gen [OPTIONS] SCENARIO [OPTIONS]\n")
    lines = r.stdout.splitlines()
    listed = lines[lines.index("Scenarios:") + 1:]
    assert [row.split()[0] for row in listed if not row.startswith("   ")] == list(SCENARIOS)
    assert "command" not in r.stdout.lower()
    r = kpool_here("gen", "servre")
    assert r.returncode == 2
    assert r.stderr.endswith("Error: No such scenario 'servre'. The scenarios are:\n"
                             "  server, speculative, context-shift, save-restore, "
                             "mrope-image, random\n"), r.stderr
    assert max(len(line) for line in r.stderr.splitlines()) <= 80
    assert "Usage: kpool gen [OPTIONS] SCENARIO [OPTIONS]" in r.stderr
    r = kpool_here("gen", "server", "--slots", "1")
    assert r.returncode == 0 and r.stdout.startswith("kpool_trace: 1\n"), r.stderr


# a capital letter standing alone for a value (`sequence S`, `range A..B`), not `A` as
# the article before a word nor inside brackets (`seq: [S]` is trace syntax)
PLACEHOLDER = re.compile(r"(?<![\w\[`.])([A-Z])(?![\w\]])(?! [a-z])")


def _options(command: click.Command, path: str) -> list[tuple[str, click.Option]]:
    if isinstance(command, click.Group):
        return [o for name, sub in command.commands.items()
                for o in _options(sub, f"{path} {name}")]
    return [(path, p) for p in command.params if isinstance(p, click.Option)]


def test_an_options_help_names_only_placeholders_its_metavar_shows() -> None:
    """`replay --help` showed `--seq 0-255  Text: show the ubatches that decode,
    re-pool or flag sequence S`: an S the line never defines."""
    commands = [cli.commands[name] for name in COMMANDS]  # each module, imported
    checked = []
    for command in commands:
        for path, option in _options(command, f"kpool {command.name}"):
            try:
                metavar = option.make_metavar(click.Context(click.Command(path)))
            except TypeError:  # click < 8.2: no context
                metavar = option.make_metavar()  # type: ignore[call-arg]
            for letter in PLACEHOLDER.findall(option.help or ""):
                checked.append(letter)
                assert letter in metavar, (path, option.opts, metavar, option.help)
    assert "N" in checked and "A" in checked  # --jobs N, --ubatch N|A..B
    assert PLACEHOLDER.findall("flag sequence S. Repeatable.") == ["S"]


def test_explain_says_when_a_code_and_list_are_both_given() -> None:
    """`kpool explain --list KP001` said "give a CODE ... or --list", as if neither
    had been given; it now says not both, and neither is still asked for."""
    r = kpool_here("explain", "--list", "KP001")
    assert r.returncode == 2
    assert r.stderr == "kpool: give a CODE (kpool explain KP001) or --list, not both\n"
    r = kpool_here("explain")
    assert r.returncode == 2
    assert r.stderr == "kpool: give a CODE (kpool explain KP001) or --list\n"


def test_a_scenarios_help_opens_with_a_sentence_as_every_commands_does() -> None:
    """`kpool gen random --help` opened with "any valid mix ..." in lower case, where
    every other command's help opens with a capital; the `Scenarios:` listing keeps
    the scenarios' own lower-case words, as click's listings do."""
    for name, scenario in SCENARIOS.items():
        r = CliRunner().invoke(cli, ["gen", name, "--help"], terminal_width=80)
        assert r.exit_code == 0, r.output
        lines = r.stdout.splitlines()
        opening = " ".join(line.strip() for line in lines[2:lines.index("", 2)])
        assert opening == scenario.doc[0].upper() + scenario.doc[1:] + ".", opening
        assert scenario.doc[0].islower()  # else this test shows nothing


def test_an_options_help_speaks_of_jobs_only_in_a_command_that_has_them() -> None:
    """`kpool replay --help` said --max-memory's default was "shared by the --jobs
    processes": replay has no --jobs."""
    said = []
    for name in COMMANDS:
        command = cli.commands[name]
        for path, option in _options(command, f"kpool {name}"):
            if "--jobs" in (option.help or ""):
                said.append(path)
                owner = command if not isinstance(command, click.Group) else \
                    command.commands[path.split()[-1]]
                assert any("--jobs" in p.opts for p in owner.params
                           if isinstance(p, click.Option)), (path, option.opts, option.help)
    assert "kpool check" in said and "kpool diff" in said  # their --max-memory
    r = CliRunner().invoke(cli, ["replay", "--help"], terminal_width=80)
    assert "half of the memory available]." in " ".join(r.stdout.split())


PLUG_HEAD = "from dataclasses import replace\nfrom kpool_cli.versions import REP_ONCE\n\n"


@pytest.mark.parametrize("files, said", [
    ({"plug_typo.py": PLUG_HEAD + "V = replace(REP_ONCE, name='mine', mark_once_per_repp=False)\n"},
     "plug_typo.py:4: TypeError: EngineVersion.__init__() got an unexpected keyword "
     "argument 'mark_once_per_repp'; its fields are name, description, seq_cp_whole_only, "
     "seq_cp_stales_src, restale_all_when_shared, repool_all_when_shared, mark_once_per_rep, "
     "padding, truncate_stale_tail, truncate_spares, seq_rm_noop_keeps_clean, "
     "seq_rm_noop_one_seq_only, recurrent_seq_rm_matches_any, seq_keep_every_stream"),
    ({"plug_pad.py": PLUG_HEAD + "V = replace(REP_ONCE, padding='row_zero')\n"},
     "plug_pad.py:4: ValueError: padding must be one of unused-rows, row-zero, "
     "repeat-pool, not 'row_zero'"),
    # the line of the user's module that raised, not that of the plug-in importing it
    ({"plug_outer.py": "import plug_inner\n",
      "plug_inner.py": "X = 1\nimport numpyy_not_here\n"},
     "plug_inner.py:2: ModuleNotFoundError: No module named 'numpyy_not_here'"),
    ({"plug_syn.py": "V = replace(\n"}, "plug_syn.py:1: SyntaxError: '(' was never closed"),
    ({"plug_exit.py": "import sys\n\nsys.exit(3)\n"}, "plug_exit.py:3: it called sys.exit(3)"),
], ids=["misspelt-policy", "policy-value", "import-in-a-module-it-imports", "syntax", "exit"])
def test_a_plug_in_that_fails_to_import_is_told_where(tmp_path: Path, files: dict[str, str],
                                                      said: str) -> None:
    """A plug-in written from docs/versions.md with a misspelt policy said only
    "importing 'plug' failed: TypeError: EngineVersion.__init__() got an unexpected
    keyword argument ...": no file, no line, no word of the policies there are; a
    policy's value that is not one of its choices listed them as a Python tuple."""
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    module = next(iter(files)).removesuffix(".py")
    r = kpool("replay", str(RACE), "--engine", f"{module}:V", cwd=tmp_path,
              env={"PYTHONPATH": f"{os.environ.get('PYTHONPATH', '')}:{tmp_path}"})
    assert r.returncode == 2 and r.stdout == "", r.stderr
    assert r.stderr == f"kpool: engine '{module}:V': importing '{module}' failed: {said}\n"


def test_replay_says_engine_all_is_for_check_and_fuzz() -> None:
    """`replay --engine all` called `all` an unknown engine, where check and fuzz take
    it; and an unknown engine on the command line named no composition (BASE+PATCH),
    which it takes."""
    from kpool_cli.versions import VERSIONS, VersionError, load_version

    known = ", ".join(VERSIONS)
    with pytest.raises(VersionError) as e:
        load_version("rep_once")
    assert str(e.value) == ("unknown engine 'rep_once' (did you mean 'rep-once'?): known "
                            f"engines are {known}, BASE+PATCH (kpool engines), or give "
                            "package.module:Name")
    r = kpool_here("replay", str(RACE), "--engine", "all")
    assert r.returncode == 2 and r.stderr == (
        f"kpool: engine 'all' (every shipped version) is taken by kpool check --engine and "
        f"kpool fuzz --engine only; name one version here: {known}, BASE+PATCH or "
        "package.module:Name\n")


def test_the_fuzz_summary_says_a_difference_from_the_base_as_one() -> None:
    """`kpool fuzz --engine plug:V --base rep-once` listed `diff  13  16  rep-once`
    under `where (op, path)`: the base's name where an op and a path belong."""
    from io import StringIO

    from kpool_cli.gen.fuzz import DIVERGED, Progress
    from kpool_cli.report.fuzz_text import render_summary
    from kpool_cli.report.terminal import Manners, make_console

    buf = StringIO()
    t = Progress(runs=200, counts={(DIVERGED, f"{DIVERGED}/rep-once"): 13,
                                   ("KP001", "KP001/decode/shared"): 2})
    files = {(DIVERGED, f"{DIVERGED}/rep-once"): "fz/diff_rep-once.yaml",
             ("KP001", "KP001/decode/shared"): "fz/KP001_decode_shared.yaml"}
    render_summary(make_console(buf, Manners(False, False, 80)), t, files, "mine", 1.0)
    rows = [line.split() for line in buf.getvalue().splitlines()]
    assert ["KP001", "2", "-", "decode/shared", "KP001_decode_shared.yaml"] in rows
    assert ["diff", "13", "-", "differs", "from", "rep-once", "diff_rep-once.yaml"] in rows


@pytest.mark.parametrize("command", ["check", "diff"])
def test_the_exit_statuses_in_help_name_a_replay_process_that_died(command: str) -> None:
    """README's exit status 2 of check and diff includes a replay process that died
    under --jobs (`workers.WorkerDied`); the commands' own help left it out."""
    r = CliRunner().invoke(cli, [command, "--help"], env={"COLUMNS": "80"})
    assert r.exit_code == 0, r.output
    two = r.output.split("Exit status:")[1].split("\n    2  ")[1].split("\n\n")[0]
    assert " ".join(two.split()).endswith("or a replay process that died (--jobs)")


@pytest.mark.parametrize("args", [
    ["check", "--no-config", str(RACE)], ["validate", str(RACE)],
    ["diff", str(RACE), "--backend", "none"], ["gen", "random", "--seed", "1"],
    ["replay", str(RACE), "--backend", "none", "--format", "json"],
])
def test_every_command_with_a_progress_bar_takes_quiet(monkeypatch, args) -> None:
    """`-q` was replay's alone: `kpool check -q` was "No such option". Each command that
    draws a bar on stderr takes it now, and hands it to the bar."""
    from kpool_cli.report import ticking

    asked: list[bool] = []
    real = ticking.progress_bar

    def recording(*a, quiet: bool = False, **k):
        asked.append(quiet)
        return real(*a, quiet=quiet, **k)

    monkeypatch.setattr(ticking, "progress_bar", recording)
    monkeypatch.setattr(ticking, "ticker_for",
                        lambda trace, *, quiet, **k: recording(0, "t", quiet=quiet, **k))
    for quiet in ([], ["-q"]):
        asked.clear()
        r = CliRunner().invoke(cli, [*args, *quiet])
        assert r.exit_code in (0, 1), r.output
        assert asked and set(asked) == {bool(quiet)}, (args, quiet, asked)


def test_fuzz_quiet_draws_no_bar(monkeypatch, tmp_path) -> None:
    """`kpool fuzz -q` on a terminal: its bar gets no console (draws nothing)."""
    from kpool_cli.report import fuzz_text

    consoles: list[object] = []

    class Recording(fuzz_text.FuzzBar):
        def __init__(self, console, total):
            consoles.append(console)
            super().__init__(None, total)

    monkeypatch.setattr(fuzz_text, "FuzzBar", Recording)
    monkeypatch.setattr("kpool_cli.report.terminal.stream_is_terminal", lambda s: True)
    for n, quiet in enumerate(([], ["-q"])):
        r = CliRunner().invoke(fuzz_cmd, ["--engine", "rep-once", "--runs", "2", *quiet,
                                          "-o", str(tmp_path / str(n))])
        assert r.exit_code == 0, r.output
    assert consoles[0] is not None and consoles[1] is None


def test_an_engine_name_misspelt_on_the_command_line_is_answered_with_the_closest() -> None:
    """A settings file's `engines = ["rep_once"]` said `(did you mean 'rep-once'?)`; the
    command line's `--engine rep_once` did not (versions could not import the wording
    then: it has a layer of its own above it now)."""
    r = CliRunner().invoke(cli, ["replay", str(RACE), "--engine", "rep_once"])
    assert r.exit_code == 2
    assert r.stderr.startswith("kpool: unknown engine 'rep_once' (did you mean 'rep-once'?): "
                               "known engines are cache-safe, rep-once"), r.stderr
