"""`kpool replay` as CI uses it: the JSON report (TRACE_FORMAT.md "Report"), exit
codes, located errors for bad traces, atomic --output, plug-in engine versions, and
the tally: every record counted once, by `tally.tallied`, whatever renders it."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jsonschema
import pytest
from click.testing import CliRunner

from kpool_cli.cli import cli
from kpool_cli.contracts.records import UbatchRecord
from kpool_cli.contracts.tally import Tally, exit_code, tallied
from kpool_cli.replay import replay
from kpool_cli.report.json_report import write_report, write_reports
from kpool_cli.report.plain import write_plain
from kpool_cli.trace.load import TraceError, load_trace, load_trace_text
from kpool_cli.versions import VERSIONS

ROOT = Path(__file__).resolve().parent.parent
TRACES = sorted((ROOT / "traces").glob("*.yaml"))
RACE = ROOT / "traces" / "shared-prefix-race.yaml"
PREFILL = ROOT / "traces" / "prefill-decode.yaml"
# valid YAML, invalid only at replay time: op 1 decodes into cell 3, which op 0 filled
LATE_INVALID = textwrap.dedent("""\
    kpool_trace: 1
    cache: {kv_size: 8, kpool: 4}
    ops:
      - decode: {seq: 0, pos: 0, cell: 3}
      - decode: {seq: 0, pos: 1, cell: 3}
    """)


def run(*args: str) -> tuple[int, str, str]:
    r = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    return r.exit_code, r.stdout, r.stderr


def report_schema() -> dict:
    """The schema as `kpool schema report` publishes it."""
    code, out, _ = run("schema", "report")
    assert code == 0
    return json.loads(out)


@pytest.mark.parametrize("engine", ["cache-safe", "rep-once"])
@pytest.mark.parametrize("trace", TRACES, ids=[t.stem for t in TRACES])
def test_every_report_matches_the_schema(trace, engine):
    code, out, _ = run("replay", str(trace), "--engine", engine, "--format", "json",
                       "--backend", "none")
    rep = json.loads(out)
    jsonschema.validate(rep, report_schema())
    assert rep["engine"] == engine
    failing = sum(n for c, n in rep["summary"]["findings"].items()
                  if c not in ("KP006", "KP008"))  # the two warnings
    assert code == (1 if failing else 0)
    assert rep["summary"]["ubatches"] == len(rep["ubatches"])


def test_pools_all_lists_every_pool_with_its_new_flag():
    _, out, _ = run("replay", str(RACE), "--format", "json", "--pools", "all",
                    "--engine", "rep-once", "--backend", "none")
    last = json.loads(out)["ubatches"][-1]
    assert len(last["pools"]) == last["n_pool_real"] == 8
    assert sum(p["new"] for p in last["pools"]) == last["n_new"] == 2


def test_fail_on_never_and_warning():
    rejected = str(ROOT / "traces" / "rejected-decodes.yaml")
    assert run("replay", rejected, "--backend", "none")[0] == 0  # KP006 is a warning
    assert run("replay", rejected, "--fail-on", "warning", "--backend", "none")[0] == 1
    assert run("replay", str(RACE), "--engine", "cache-safe", "--fail-on", "never",
               "--backend", "none")[0] == 0


def test_several_traces_give_a_json_array():
    code, out, _ = run("replay", str(RACE), str(PREFILL), "--format", "json",
                       "--engine", "cache-safe", "--backend", "none")
    reps = json.loads(out)
    assert [r["trace"]["name"] for r in reps] == ["shared-prefix-race", "prefill-decode"]
    assert code == 1  # the race trace's KP001; prefill-decode alone passes
    assert out.startswith("[\n{\n") and out.endswith("\n}\n]\n") and "\n},\n{\n" in out
    schema = report_schema()
    for rep in reps:
        jsonschema.validate(rep, schema)


def test_a_json_array_of_several_reports_validates_against_the_schema():
    """The array itself validates; an array whose second report lacks its summary,
    or an array of one report (one trace gives the report alone), does not."""
    _, out, _ = run("replay", str(RACE), str(PREFILL), "--format", "json",
                    "--engine", "cache-safe", "--backend", "none")
    v = jsonschema.Draft202012Validator(report_schema())
    reps = json.loads(out)
    v.validate(reps)
    assert not v.is_valid([reps[0], {k: x for k, x in reps[1].items() if k != "summary"}])
    assert not v.is_valid(reps[:1])


def test_one_trace_gives_the_report_alone():
    _, out, _ = run("replay", str(RACE), "--format", "json", "--backend", "none")
    assert out.startswith("{\n") and out.endswith("\n}\n")
    assert json.loads(out)["trace"]["name"] == "shared-prefix-race"


def test_an_invalid_trace_ends_the_array_after_its_report(tmp_path):
    """The trace found invalid mid-replay is the last report: its status says so, the
    array closes, the trace after it is not replayed, and the command exits 2."""
    bad = tmp_path / "late.yaml"
    bad.write_text(LATE_INVALID)
    code, out, err = run("replay", str(RACE), str(bad), str(PREFILL), "--format", "json",
                         "--engine", "cache-safe", "--backend", "none")
    assert code == 2 and "not empty" in err
    reps = json.loads(out)
    assert [r["summary"]["status"] for r in reps] == ["fail", "invalid"]
    assert reps[1]["problems"] and len(reps[1]["ubatches"]) == 1  # op 0 ran, op 1 did not


def test_write_reports_frames_what_each_run_writes():
    for runs, framed in ((["a", "b", "c"], '[\n"a",\n"b",\n"c"\n]\n'), (["a"], '"a"\n')):
        out = io.StringIO()
        assert len(write_reports(out, runs, _writes_its_name(out))) == len(runs)
        assert out.getvalue() == framed


def _writes_its_name(out: io.StringIO):
    def one(name: str, lead: str) -> Tally:
        out.write(f'{lead}"{name}"')
        return Tally()
    return one


# -- the tally: fed once, by `tallied`; renderers only read it ---------------------------


def test_tallied_counts_each_record_once_and_renderers_never_count():
    """shared-prefix-race under cache-safe: 3 ubatches of 12, 2 and 6 tokens marking
    3 + 6 + 8 pools, KP001 at ubatches 1 and 2, one expectation that holds."""
    trace = load_trace(RACE)
    for render in (write_report_to_nowhere, write_plain_to_nowhere):
        tally = Tally()
        render(trace, tallied(replay(trace, VERSIONS["cache-safe"]), tally), tally)
        assert (tally.ubatches, tally.tokens, tally.pools_marked) == (3, 20, 17)
        assert dict(tally.findings) == {"KP001": 2} and tally.expect_passed == 1
        assert tally.exit_code == 1 and tally.status == "fail"


def write_report_to_nowhere(trace, records, tally) -> None:
    write_report(io.StringIO(), trace, "cache-safe", None, records, tally)


def write_plain_to_nowhere(trace, records, tally) -> None:
    write_plain(io.StringIO(), trace, "cache-safe", records, tally)


def test_a_renderer_fed_without_tallied_counts_nothing():
    trace = load_trace(RACE)
    tally = Tally()
    out = io.StringIO()
    write_plain(out, trace, "cache-safe", replay(trace, VERSIONS["cache-safe"]), tally)
    assert tally.ubatches == 0 and tally.exit_code == 0
    assert out.getvalue().splitlines()[-1] == (
        "  summary: 0 ubatches, 0 pools marked (0.0 per token), no findings: PASS")


def test_tallied_records_an_invalid_trace_and_raises_it_on():
    trace = load_trace_text(LATE_INVALID, "late.yaml")
    tally = Tally()
    seen = []
    with pytest.raises(TraceError):
        for rec in tallied(replay(trace, VERSIONS["rep-once"]), tally):
            seen.append(rec)
    assert [type(r) for r in seen] == [UbatchRecord] and tally.ubatches == 1
    assert tally.problems and tally.status == "invalid" and tally.exit_code == 2
    # the JSON report closes the document, saying why
    out = io.StringIO()
    tally = Tally()
    write_report(out, trace, "rep-once", None,
                 tallied(replay(trace, VERSIONS["rep-once"]), tally), tally)
    doc = json.loads(out.getvalue())
    assert doc["summary"]["status"] == "invalid" and "not empty" in doc["problems"][0]["message"]


def test_the_exit_code_of_several_traces_is_the_highest():
    passed, failed, invalid = Tally(), Tally(failing=1), Tally()
    invalid.invalidate(["why"])
    assert [t.exit_code for t in (passed, failed, invalid)] == [0, 1, 2]
    assert exit_code([]) == 0 and exit_code([passed]) == 0
    assert exit_code([passed, failed]) == 1 and exit_code([invalid, failed, passed]) == 2


def test_malformed_trace_exits_2_with_file_line_column_and_field(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("kpool_trace: 1\ncache: {kv_size: 8, kpool: 4}\nops:\n"
                   "  - decode: {seq: 0, pos: 0..4}\n  - seq_rm: {seq: 0, p9: 2}\n")
    r = subprocess.run([sys.executable, "-m", "kpool_cli", "replay", str(bad)],
                       capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 2
    assert f"{bad}:5:" in r.stderr and "p9" in r.stderr
    assert "Traceback" not in r.stderr


def test_output_is_atomic_and_absent_after_a_failure(tmp_path):
    out = tmp_path / "report.json"
    code, _, _ = run("replay", str(RACE), "--format", "json", "-o", str(out),
                     "--backend", "none")
    assert code == 0 and json.loads(out.read_text())["kpool_report"] == 1
    bad = tmp_path / "late.yaml"  # valid YAML, invalid only at replay time
    bad.write_text(textwrap.dedent("""\
        kpool_trace: 1
        cache: {kv_size: 8, kpool: 4}
        ops:
          - decode: {seq: 0, pos: 0, cell: 3}
          - decode: {seq: 0, pos: 1, cell: 3}
        """))
    out2 = tmp_path / "late.json"
    code, _, err = run("replay", str(bad), "--format", "json", "-o", str(out2),
                       "--backend", "none")
    assert code == 2 and "not empty" in err
    assert not out2.exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_unknown_engine_is_a_usage_error():
    code, _, err = run("replay", str(RACE), "--engine", "nope")
    assert code == 2 and "unknown engine" in err


def test_plugin_engine_version_loads_from_module(tmp_path):
    """`--engine package.module:Name`; here a rep-once that forgets to
    mark once per rep brings the race back."""
    (tmp_path / "myengine.py").write_text(textwrap.dedent("""\
        from dataclasses import replace
        from kpool_cli.versions import CACHE_SAFE
        Racy = replace(CACHE_SAFE, name="racy")
        """))
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}
    r = subprocess.run([sys.executable, "-m", "kpool_cli", "replay", str(RACE), "--engine",
                        "myengine:Racy", "--format", "json", "--backend", "none"],
                       capture_output=True, text=True, cwd=ROOT, env=env)
    assert r.returncode == 1, r.stderr
    rep = json.loads(r.stdout)
    assert rep["engine"] == "racy"
    assert rep["summary"]["findings"].get("KP001")


def test_check_fails_on_a_broken_expectation(tmp_path):
    t = tmp_path / "t.yaml"
    t.write_text(textwrap.dedent("""\
        kpool_trace: 1
        cache: {kv_size: 16, kpool: 4}
        ops:
          - decode: {seq: 0, pos: 0..8}
          - expect: {n_new: 3}
        """))
    assert run("replay", str(t), "--backend", "none")[0] == 0
    code, out, _ = run("replay", str(t), "--check", "--backend", "none")
    assert code == 1 and "n_new is 2, expected 3" in out


def test_schema_command_prints_json_schemas():
    for which in ("trace", "report", "check", "diff"):
        code, out, _ = run("schema", which)
        assert code == 0
        jsonschema.Draft202012Validator.check_schema(json.loads(out))


def test_messages_of_an_invalid_input_wrap_between_units_on_a_terminal_only(monkeypatch):
    """`kpool validate` and `kpool: ...` messages: on a terminal each line wraps at its
    width, never inside a unit (`seq 0`), continued four columns in; piped, one
    message a line (a log, a grep)."""
    import io

    from kpool_cli.cli.io import terminal_lines

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    line = "  t.yaml:6:13: ops[0].seq: seq 1 in the block of seq 0: one block per sequence"
    monkeypatch.setenv("COLUMNS", "40")
    assert terminal_lines([line], Tty()) == (
        "  t.yaml:6:13: ops[0].seq: seq 1 in the\n"
        "      block of seq 0: one block per\n"
        "      sequence\n")
    assert terminal_lines([line], io.StringIO()) == line + "\n"


def test_integer_and_number_options_show_and_word_their_bounds_one_way():
    """`kpool gen server --help` hid each size's bounds behind `N`; out of range, a
    value was "not in 1..16", a closed range in the notation kpool keeps for
    half-open ones, where a malformed one was "not an integer from 1 to 16"."""
    from click.testing import CliRunner

    from kpool_cli.cli.main import cli

    run = CliRunner().invoke
    assert "--slots 1-16" in run(cli, ["gen", "server", "--help"],
                                 env={"COLUMNS": "100"}).output
    for args, says in ((["gen", "server", "--slots", "0"], "0 is not an integer from 1 to 16"),
                       (["gen", "server", "--slots", "x"], "'x' is not an integer from 1 to 16"),
                       (["fuzz", "--time-budget", "0"], "0 is not a number from 0.1 to")):
        r = run(cli, args)
        assert r.exit_code == 2 and says in r.stderr, (args, r.stderr)


def test_fuzz_says_what_its_folder_held_that_the_run_did_not_write(tmp_path):
    """`kpool fuzz -o DIR` writes its shrunk traces among what DIR holds and replaces
    only its own names: an earlier run's traces stay, and `kpool check DIR` reads them
    too. The summary says how many (a newcomer's walk of 7 December found a folder of
    six traces after a run that listed four)."""
    out = tmp_path / "found"
    out.mkdir()
    (out / "earlier.yaml").write_text("kpool_trace: 1\n")
    code, stdout, _ = run("fuzz", "--engine", "cache-safe", "--runs", "20", "--seed", "1",
                          "-o", str(out))
    assert code == 0
    assert f"{out} also holds 1 trace this run did not write (an earlier run's)" in \
        " ".join(stdout.split())
    code, stdout, _ = run("fuzz", "--engine", "rep-once", "--runs", "5", "--seed", "1",
                          "-o", str(tmp_path / "new"))
    assert code == 0 and "also holds" not in stdout


def test_fuzz_and_gen_random_help_say_what_each_option_is():
    """A newcomer's walk of 7 December: `kpool fuzz --help` gave `--runs` no words,
    `-o TEXT` no long form nor a name of what it takes, `--engine TEXT` where every
    other command says NAME; `kpool gen random --help` said `random_trace's max_ops.`"""
    _, fuzz_help, _ = run("fuzz", "--help")
    flat = " ".join(fuzz_help.split())
    assert "--runs 1-10000000 Random traces to replay." in flat
    assert "-o, --output FOLDER" in flat and "--engine NAME" in flat
    assert "--dask ADDRESS" in flat and "TEXT" not in flat
    _, gen_help, _ = run("gen", "random", "--help")
    assert "random_trace's" not in gen_help
    assert "--max-ops 1-65536 the most ops a trace has" in " ".join(gen_help.split())
