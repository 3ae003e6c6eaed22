"""A fuzz campaign in a newcomer's first hour: a fork's own engine version (a copy of
rep-once whose padding writes row 0) fuzzed against rep-once with `-j 2` and on a
local Dask cluster, interrupted, stopped by its time budget and run again into the
same folder (8 December). Each test holds one surprise that walk met, fixed."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from test_untrusted import KPOOL, kpool_here, run_on_a_terminal

from kpool_cli import cluster
from kpool_cli.gen.fuzz import Progress, campaign, save_new_shrunk, tasks_for
from kpool_cli.trace.format import SEED_MAX
from kpool_cli.trace.load import load_trace_text

# the fork's version: rep-once with every padding entry written to row 0
PLUG = """\
from dataclasses import replace
from kpool_cli.versions import REP_ONCE

Candidate = replace(REP_ONCE, name="fork-row-zero", padding="row-zero")
"""


def plug_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, module: str) -> str:
    """The plug-in as module `module` on this process's import path: its spec."""
    (tmp_path / f"{module}.py").write_text(PLUG)
    monkeypatch.syspath_prepend(str(tmp_path))
    return f"{module}:Candidate"


def flat(text: str) -> str:
    return " ".join(text.split())


def test_a_dask_worker_that_cannot_load_the_plug_in_is_exit_2_not_an_internal_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Workers started without the plug-in's folder on their PYTHONPATH: every task
    raised VersionError on the worker, which came back as `kpool: internal error:
    VersionError: ... Please report it`, with advice for the machine where the plug-in
    had loaded. The worker is played here: a task run where the module is not found
    (Dask raises a task's exception as it was raised)."""
    spec = plug_in(tmp_path, monkeypatch, "fork84_worker")

    def on_a_worker_without_it(fn, units, address):
        monkeypatch.delitem(sys.modules, "fork84_worker")
        monkeypatch.setattr(sys, "path", [p for p in sys.path if p != str(tmp_path)])
        yield fn(units[0])

    monkeypatch.setattr(cluster, "in_order_dask", on_a_worker_without_it)
    out = tmp_path / "found"
    r = kpool_here("fuzz", "--engine", spec, "--base", "rep-once", "--runs", "3",
                   "--dask", "tcp://sched:8786", "-o", str(out), cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    said = flat(r.stderr)
    assert "internal error" not in said
    assert said.startswith("kpool: a Dask worker of tcp://sched:8786 could not load the "
                           "engine: engine 'fork84_worker:Candidate': no module named "
                           "'fork84_worker'"), said
    assert "start `dask worker` with the PYTHONPATH that finds it" in said
    assert not out.exists()  # made for the traces, none came: removed again


def test_a_campaign_that_fails_leaves_no_folder_and_says_so_on_a_line_of_its_own(
        tmp_path: Path) -> None:
    """`kpool fuzz --dask localhost -o found` (no port) left an empty `found/` behind,
    and on a terminal its message was written after the progress bar, on the bar's line
    (`fuzz ━━━━ 0/5  0:00:00kpool: not a Dask sc`), the bar drawn again after it."""
    out = tmp_path / "found"
    r = kpool_here("fuzz", "--engine", "rep-once", "--runs", "5", "--dask", "localhost",
                   "-o", str(out), cwd=tmp_path)
    assert r.returncode == 2 and "'localhost'" in r.stderr, r.stderr
    assert not out.exists()
    shown = run_on_a_terminal([*KPOOL, "fuzz", "--engine", "rep-once", "--runs", "5",
                               "--dask", "localhost", "-o", str(out)])
    at = shown.index("kpool: ")
    assert shown.rfind("fuzz ") < at, shown  # the bar is not drawn after the message
    assert shown[:at].endswith("\x1b[2K"), shown  # its line erased first


@pytest.mark.parametrize("seed", [5, SEED_MAX - 1])
def test_a_time_budget_says_it_stopped_and_gives_the_options_of_the_rest(
        tmp_path: Path, seed: int) -> None:
    """`--runs 3000 --time-budget 3` summed up `kpool fuzz: 135 runs under rep-once`: as
    if 135 had been asked for, and nothing said which seeds were left. Run r has seed
    `seed + r` (wrapped to 0 past SEED_MAX), so the rest start at seed + N."""
    r = kpool_here("fuzz", "--engine", "cache-safe", "--runs", "1000", "--seed", str(seed),
                   "--time-budget", "0.1", "-o", str(tmp_path / "found"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    said = flat(r.stdout)
    m = re.match(r"kpool fuzz: stopped by --time-budget after (\d+) of 1000 runs under "
                 r"cache-safe in ", said)
    assert m is not None, said
    n = int(m.group(1))
    assert 1 <= n < 1000
    rest = (seed + n) % (SEED_MAX + 1)
    assert said.endswith(f"the other {1000 - n} runs: the same command with --seed {rest} "
                         f"--runs {1000 - n}"), said


def test_a_signal_gives_the_options_of_the_rest_too() -> None:
    """Ctrl-C after 134 of 3,000 runs said which runs were done, not what to run for
    the others; a campaign that ran whole says neither."""
    from io import StringIO

    from kpool_cli.report.fuzz_text import render_summary
    from kpool_cli.report.terminal import Manners, make_console

    for stopped, next_seed, said in (
            (("interrupted", 12_000), 135, "the other 11,866 runs: the same command with "
                                           "--seed 135 --runs 11866"),
            (None, 135, None)):
        buf = StringIO()
        render_summary(make_console(buf, Manners(False, False, 80)), Progress(runs=134),
                       {}, "mine", 1.0, stopped=stopped, next_seed=next_seed)
        text = flat(buf.getvalue())
        if said is None:
            assert "the other" not in text, text
        else:
            assert text.endswith(said), text


def test_a_campaign_names_the_traces_of_an_earlier_one_it_replaced(tmp_path: Path) -> None:
    """A trace's file is named by its signature alone: a campaign of rep-once into the
    folder of a cache-safe campaign wrote its own `KP008_seq_rm_own.yaml` over
    cache-safe's without a word (seed 1 shows KP008 on a seq_rm under both). Running
    the same campaign again replaces nothing it did not write the same."""
    out = tmp_path / "found"
    argv = ("--runs", "2", "--seed", "1", "-o", str(out))
    r = kpool_here("fuzz", "--engine", "cache-safe", *argv, cwd=tmp_path)
    assert r.returncode == 0 and "replaced" not in r.stdout, r.stdout
    assert sorted(p.name for p in out.iterdir()) == ["KP008_seq_rm_own.yaml"]
    r = kpool_here("fuzz", "--engine", "rep-once", *argv, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert (f"replaced 1 trace an earlier run had left in {out} under the same names: "
            "KP008_seq_rm_own.yaml") in flat(r.stdout), r.stdout
    assert "under rep-once" in (out / "KP008_seq_rm_own.yaml").read_text()
    r = kpool_here("fuzz", "--engine", "rep-once", *argv, cwd=tmp_path)
    assert r.returncode == 0 and "replaced" not in r.stdout, r.stdout


def test_the_progress_counts_one_shrink_per_trace_kept(tmp_path: Path) -> None:
    """The bar said `findings 8  shrinks 20` of a campaign that kept 8 traces: the run
    first to show a signature shrinks every finding it has, and each was counted once
    per signature that run was first for. Seeds 16-19 under cache-safe: seed 16 shows
    KP001 on a coupled decode, seed 19 that one again and KP001 on a plain decode."""
    p = Progress()
    files: dict[tuple[str, str], str] = {}
    for _ in campaign(tasks_for("cache-safe", 4, 16), lambda fn, us: map(fn, us), p,
                      lambda q: files.update(save_new_shrunk(q, tmp_path))):
        pass
    assert sorted(files) == [("KP001", "KP001/decode-coupled/shared"),
                             ("KP001", "KP001/decode/shared")]
    assert [o.seed for _, o in sorted(p.first.items())] == [16, 19]
    assert sum(len(o.shrunk) for o in p.first.values()) == 3  # 1 + 2: what was counted
    assert p.shrinks == 2 == len(files)


def test_a_difference_from_the_base_is_named_by_the_versions_not_the_spec(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The shrunk trace of `--engine fork84_name:Candidate --base rep-once` was named
    `diverged-rep-once-fork84_name:Candidate`, where every other output names a version
    by its name; its description keeps the spec, to run it again. Seed 2 is one
    decode of one token in a cache of kpool 1: row-zero's padding writes row 0, which
    rep-once gives to no one."""
    spec = plug_in(tmp_path, monkeypatch, "fork84_name")
    out = tmp_path / "found"
    r = kpool_here("fuzz", "--engine", spec, "--base", "rep-once", "--runs", "1",
                   "--seed", "2", "-o", str(out), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    t = load_trace_text((out / "diff_rep-once.yaml").read_text())
    assert t.name == "diverged-rep-once-fork-row-zero"
    assert f"`kpool fuzz --engine {spec} --base rep-once --seed 2 --runs 1" in t.description


def test_a_plug_in_named_by_its_python_path_is_shown_the_colon(tmp_path: Path) -> None:
    """`--engine myfork.engine.Candidate` (the dotted path Python writes) was an unknown
    engine with the list of shipped ones; kpool takes `module:Name`, so the refusal now
    names the spec meant. A name that is no dotted path gets no such guess."""
    def refusal(name: str) -> str:
        r = kpool_here("fuzz", "--engine", name, "--runs", "1", "-o",
                       str(tmp_path / "found"), cwd=tmp_path)
        assert r.returncode == 2 and not (tmp_path / "found").exists()
        return flat(r.stderr)

    assert refusal("myfork.engine.Candidate").endswith(
        "BASE+PATCH (kpool engines), or give package.module:Name (did you mean "
        "'myfork.engine:Candidate'?)")
    for name in ("1.5", "rep-once.x", "rep_once"):
        assert refusal(name).endswith("or give package.module:Name"), name


def test_seconds_stay_with_their_number_when_a_summary_wraps():
    """At 80 columns the summary of a campaign stopped by --time-budget broke as
    `... in 5.8` / `s; 0 with a refused decode`: a time keeps its unit and the word
    before it (`wording.units`)."""
    from kpool_cli.wording import fit_line

    line = ("kpool fuzz: stopped by --time-budget after 1 of 400 runs under cache-safe in "
            "5.8 s; 0 with a refused decode (KP006, not a finding)")
    lines = fit_line(line, 80).splitlines()
    assert len(lines) == 2 and all(len(x) <= 80 for x in lines)
    assert lines[1].startswith("    in 5.8 s;"), lines
