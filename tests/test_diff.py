"""`kpool diff`: two engine versions (or two saved reports) on the same trace.

The three exit paths (0 no regression, 1 regression or --fail-on-change, 2 bad
input), the race of PR #29994 fixed by rep-once with its pool ratio, the runs
parting where rep-once aborts, saved reports against live replays, and the views.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import pickle
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner
from test_view import BIG

from kpool_cli.cli import cli
from kpool_cli.diff.compare import DiffResult, EventDiff, Place, compare
from kpool_cli.diff.runs import DiffInputError, Unit, gather, run_unit
from kpool_cli.diff.summary import EventSummary, RunSummary, UbatchSummary
from kpool_cli.report.diff_page import write_diff_page
from kpool_cli.report.diff_view import diff_json, write_diff_plain, write_diff_rich
from kpool_cli.report.terminal import Manners, make_console
from kpool_cli.wording import SPARKS

ROOT = Path(__file__).resolve().parent.parent
TRACES = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "traces").glob("*.yaml"))
RACE = "traces/shared-prefix-race.yaml"
PARTIAL = "traces/partial-copy.yaml"
NON_UNIFIED = "traces/non-unified.yaml"
PREFILL = "traces/prefill-decode.yaml"


@pytest.fixture(autouse=True)
def _in_root(monkeypatch):
    monkeypatch.chdir(ROOT)


def run(*args: str) -> tuple[int, str, str]:
    r = CliRunner().invoke(cli, ["diff", *args], catch_exceptions=False)
    return r.exit_code, r.stdout, r.stderr


def run_json(*args: str) -> tuple[int, dict]:
    code, out, err = run(*args, "--format", "json")
    assert code != 2, err
    return code, json.loads(out)


def save_report(path: Path, trace: str, engine: str) -> str:
    r = CliRunner().invoke(cli, ["replay", trace, "--engine", engine, "--backend", "none",
                                 "--format", "json", "-o", str(path)])
    assert r.exit_code in (0, 1), r.stderr
    return str(path)


# --- exit 0 ------------------------------------------------------------------------------


@pytest.mark.parametrize("engine", ["cache-safe", "rep-once"])
def test_a_version_against_itself_has_no_differences(engine):
    code, out, _ = run(*TRACES, "--base", engine, "--head", engine)
    assert code == 0
    assert out.rstrip().endswith("no differences (exit 0)")
    code, doc = run_json(*TRACES, "--base", engine, "--head", engine, "--fail-on-change")
    assert code == 0
    assert doc["summary"]["verdict"] == "no differences"
    assert all(not t["changed"] and not t["differences"] for t in doc["traces"])


def test_rep_once_fixes_the_race_on_shared_prefix_with_fewer_pools():
    """ENGINE.md §6: cache-safe re-pools all 6 (then 8) pools while cells are shared and
    scatters rows 3, 7, 11 twice (KP001); rep-once marks each rep once."""
    code, doc = run_json(RACE)
    assert code == 0
    t = doc["traces"][0]
    assert [(c["code"], c["where"], c["aligned"]) for c in t["findings_fixed"]] == [
        ("KP001", "op 3.0", True), ("KP001", "op 6.0", True)]
    assert t["findings_introduced"] == [] and t["parted"] is None
    pools = t["totals"]["compare"]["pools_repooled"]
    assert (pools["base"], pools["head"]) == (17, 8)
    assert pools["ratio"] == pytest.approx(8 / 17, abs=1e-4)
    cells = t["totals"]["compare"]["cells_scanned"]
    assert cells["ratio"] == pytest.approx(cells["head"] / cells["base"], abs=1e-4)
    ub = {(d["op"], d.get("batch_ubatch")): d for d in t["differences"]}
    first = ub[(3, 0)]
    assert first["pools_only_base"] == [[0, 0], [0, 1], [0, 2]]
    assert first["pools_only_head"] == []
    assert first["findings_lost"] == ["KP001"] and first["findings_gained"] == []
    assert [e["rep"] for e in first["base"]["scatter"]] == [3, 7, 11, 3, 7, 11]
    assert [e["rep"] for e in first["head"]["scatter"]] == [3, 7, 11]
    # the seq_cp differs too: cache-safe stales the source as well (ENGINE.md §4)
    assert ub[(1, None)]["base"]["stale"] == {"0": 0, "1": 0}
    assert ub[(1, None)]["head"]["stale"] == {"1": 0}


def test_behaviour_change_without_regression_exits_0_unless_fail_on_change():
    assert run(NON_UNIFIED)[0] == 0
    code, out, _ = run(NON_UNIFIED, "--fail-on-change")
    assert code == 1
    assert "behaviour changed (exit 1, --fail-on-change)" in out
    # cost counters alone never fail: cache-safe's sharing scan reads more cells
    code, doc = run_json(PREFILL, "--fail-on-change")
    assert code == 0
    t = doc["traces"][0]
    assert not t["changed"] and t["cost_only_ubatches"] > 0
    assert doc["summary"]["totals"]["compare"]["cells_scanned"]["ratio"] < 1


# --- exit 1 ------------------------------------------------------------------------------


def test_a_plugin_head_that_reintroduces_the_race_is_a_regression(tmp_path):
    (tmp_path / "mymod.py").write_text(textwrap.dedent("""\
        import dataclasses
        from kpool_cli.versions import CACHE_SAFE
        Racy = dataclasses.replace(CACHE_SAFE, name="racy")
        """))
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}
    r = subprocess.run([sys.executable, "-m", "kpool_cli", "diff", RACE, "--base", "rep-once",
                        "--head", "mymod:Racy", "--format", "json"],
                       capture_output=True, text=True, cwd=ROOT, env=env)
    assert r.returncode == 1, r.stderr
    doc = json.loads(r.stdout)
    assert doc["head"] == "racy"
    assert [(g["code"], g["where"]) for g in doc["summary"]["regressions"]] == [
        ("KP001", "op 3.0"), ("KP001", "op 6.0")]
    assert doc["summary"]["verdict"] == "regression"
    # the text view says so too, and --jobs runs the plug-in in worker processes
    r = subprocess.run([sys.executable, "-m", "kpool_cli", "diff", RACE, PREFILL, "--base",
                        "rep-once", "--head", "mymod:Racy", "--jobs", "2"],
                       capture_output=True, text=True, cwd=ROOT, env=env)
    assert r.returncode == 1, r.stderr
    assert "REGRESSION (exit 1): head introduces KP001 in shared-prefix-race at op 3.0" in r.stdout
    assert "NEW: KP001 scatter-race rows 3 7 11" in r.stdout


def test_runs_part_where_rep_once_aborts_the_partial_copy():
    """PR #29994 asserts on a partial seq_cp (KP005): the runs part at op 2; cache-safe's
    later race (op 5) is compared by counts, as fixed; the abort is introduced."""
    code, doc = run_json(PARTIAL)
    assert code == 1
    t = doc["traces"][0]
    p = t["parted"]
    assert (p["op"], p["kind"]) == (2, "seq_cp")
    assert p["reason"] == "base applied, head aborted (KP005)"
    assert p["base"]["status"] == "applied" and p["head"]["status"] == "aborted"
    assert (p["base_ubatches_after"], p["head_ubatches_after"]) == (1, 0)
    assert [(c["code"], c["where"], c["aligned"]) for c in t["findings_introduced"]] == [
        ("KP005", "op 2", False)]
    assert {c["code"]: c["where"] for c in t["findings_fixed"]} == {"KP001": "op 5.0",
                                                                   "KP002": "op 5.0"}
    assert t["differences"] == []  # ops 0 and 1 are the same in both
    _, out, _ = run(PARTIAL)
    assert ("the runs part at op 2 (seq_cp): base applied, head aborted (KP005); after it "
            "base ran 1 more ubatch, head 0") in out


def test_every_finding_change_and_the_parting_say_where_they_sit_on_the_ubatch_axis():
    """What the diff page places, each place an op's event (batch_ubatch None) or one
    of its ubatches, said explicitly: the partial copy's abort (the seq_cp, op 2,
    after the decodes of ops 0 and 1, ubatches 0 and 1) comes before ubatch 2 of head,
    where the runs part; cache-safe's race after it is at its own ubatch 2 (op 5, the
    decode after two expects); the race's aligned fixes at ubatches 1 (op 3, after
    the seq_cp of op 1 and the note of op 2) and 2 (op 6), its seq_cp before ubatch 1."""
    (t,) = _result(PARTIAL).traces
    assert t.parting is not None and t.parting.before == 2
    assert [(c.code, c.places) for c in t.introduced] == [("KP005", (Place(2, None, 2),))]
    assert [(c.code, c.places) for c in t.fixed] == [("KP001", (Place(5, 0, 2),)),
                                                     ("KP002", (Place(5, 0, 2),))]
    assert [(p.event, p.where) for p in t.introduced[0].places] == [(True, "op 2")]
    assert [(p.event, p.where) for p in t.fixed[0].places] == [(False, "op 5.0")]
    (race,) = _result(RACE).traces
    assert [c.places for c in race.fixed] == [(Place(3, 0, 1),), (Place(6, 0, 2),)]
    assert [(e.op, e.before) for e in race.entries if isinstance(e, EventDiff)] == [(1, 1)]


def _ubatch(index: int, op: int, findings=()) -> UbatchSummary:
    return UbatchSummary(index, op, 0, ((index, (0,)),), (), 1, 1, 1, ((0, index),),
                         ((index, (index,), False),), tuple(findings), ())


def test_differs_names_each_field_that_differs_in_the_formats_words():
    """Built by hand: one ubatch (op 0) and one seq_rm (op 1) on each side. Head's ubatch
    marks pools (0, 0) and (0, 5) where base's marks (0, 0) alone: n_new 2 against 1
    and the pools differ, nothing else (the tokens, stale positions, scatter plan and
    findings are the same). Head's seq_rm stales seq 0 at 4 where base's stales
    nothing. So `differs` is [n_new, pools] for the ubatch (the declared order, not
    the order they were changed in) and [stale] for the event."""
    ub = _ubatch(0, 0)
    head_ub = dataclasses.replace(ub, marked=((0, 0), (0, 5)), n_new=2)
    rm = EventSummary(1, "seq_rm", "applied", (), ())
    base = RunSummary("t.yaml", "t", "0" * 64, "b", None, (), (ub,), (rm,))
    head = dataclasses.replace(base, engine="h", ubatches=(head_ub,),
                               events=(dataclasses.replace(rm, stale=((0, 4),)),))
    doc = diff_json(DiffResult((compare(base, head),)))
    ubatch, event = doc["traces"][0]["differences"]
    assert (ubatch["type"], ubatch["differs"]) == ("ubatch", ["n_new", "pools"])
    assert ubatch["pools_only_head"] == [[0, 5]] and ubatch["pools_only_base"] == []
    assert (event["type"], event["differs"]) == ("event", ["stale"])
    assert event["head"]["stale"] == {"0": 4} and event["base"]["stale"] == {}
    assert doc["summary"]["verdict"] == "changed" and doc["summary"]["exit_code"] == 0


def test_after_the_runs_part_each_place_is_a_ubatch_or_an_event_and_where_names_four():
    """Built by hand: both runs decode op 0 (ubatch 0); at op 1 head aborts (KP005 on
    its ubatch 1), where base goes on: ubatches 1 to 5 (ops 1 to 5) with a KP001
    each, then an edit (op 6, after its ubatches 0..5: before 6) with a KP008. So
    base's findings from op 1 on are fixed: KP001 x5 at five ubatches, named four
    and `+1 more`; KP008 at the event; head's KP005 introduced at its ubatch 1."""
    race = ("KP001", (3,))
    base = RunSummary("t.yaml", "t", "0" * 64, "b", None, (),
                      (_ubatch(0, 0), *(_ubatch(i, i, (race,)) for i in range(1, 6))),
                      (EventSummary(6, "seq_rm", "rejected", (), (("KP008", ()),)),))
    head = dataclasses.replace(base, engine="h", ubatches=(
        _ubatch(0, 0), _ubatch(1, 1, (("KP005", ()),))), events=())
    d = compare(base, head)
    assert d.parting is not None and (d.parting.op, d.parting.before) == (1, 1)
    assert [(c.code, c.count, c.aligned, c.rows, c.places) for c in d.fixed] == [
        ("KP001", 5, False, (3,), tuple(Place(i, 0, i) for i in range(1, 6))),
        ("KP008", 1, False, (), (Place(6, None, 6),))]
    assert [c.where for c in d.fixed] == ["op 1.0, op 2.0, op 3.0, op 4.0 (+1 more)",
                                          "op 6"]
    assert [(c.code, c.places, c.where) for c in d.introduced] == [
        ("KP005", (Place(1, 0, 1),), "op 1.0")]


def test_the_diff_page_names_several_engines_of_a_side_as_its_summary_does():
    """Two pairs of reports whose sides name different engines (x then y in base, z
    then w in head): the page's title and heading word each side as the text views do,
    `x/y` and `z/w`, the same as the summary it shows (it said `x, y` above `x/y`)."""
    run_ = RunSummary("t.yaml", "t", "0" * 64, "x", None, (), (_ubatch(0, 0),), ())
    pairs = [(run_, dataclasses.replace(run_, engine="z")),
             (dataclasses.replace(run_, engine="y"), dataclasses.replace(run_, engine="w"))]
    buf = io.StringIO()
    write_diff_page(buf, DiffResult(tuple(compare(b, h) for b, h in pairs)), pairs)
    page = buf.getvalue()
    assert "<title>kpool diff: x/y vs z/w</title>" in page
    assert "<h1>kpool diff: base x/y vs head z/w</h1>" in page
    assert "<pre>summary: base x/y vs head z/w\n" in page
    assert "x, y" not in page


def test_the_json_names_a_regression_s_trace_as_its_trace_entry_does(tmp_path):
    """A trace whose file name is not UTF-8 (byte 0xff) and that regresses (the partial
    copy: KP005 under rep-once): `summary.regressions[].trace` is the path as
    `traces[].trace.path` writes it, `\\xff`, never a lone surrogate (`\\udcff`, which
    a strict JSON reader refuses)."""
    odd = os.fsdecode(bytes(tmp_path) + b"/pc\xff.yaml")
    Path(odd).write_bytes((ROOT / PARTIAL).read_bytes())
    code, out, err = run(odd, "--format", "json")
    assert code == 1, err
    assert "\\udcff" not in out
    doc = json.loads(out)
    ((t,), (regression,)) = doc["traces"], doc["summary"]["regressions"]
    assert t["trace"]["path"].endswith("/pc\\xff.yaml")
    assert regression["trace"] == t["trace"]["path"]
    assert regression["code"] == "KP005"


def test_runs_part_inside_a_decode_when_one_side_aborts_a_ubatch():
    """A head that aborts in a decode's ubatch (KP005 on the ubatch record): the runs part
    at that decode, and the view shows both sides' ubatches of it."""
    b = run_unit(Unit(RACE, "rep-once", "none"))
    last = b.ubatches[-1]
    aborted = dataclasses.replace(last, findings=(("KP005", ()),))
    h = dataclasses.replace(b, engine="aborts", ubatches=(*b.ubatches[:-1], aborted))
    d = compare(b, h)
    assert d.parting is not None and d.parting.op == last.op
    assert d.parting.reason == "base applied, head aborted (KP005)"
    assert [(c.code, c.where, c.aligned) for c in d.introduced] == [
        ("KP005", f"op {last.op}.0", False)]
    buf = io.StringIO()
    write_diff_plain(buf, DiffResult((d,)))
    assert f"op {last.op} decode  the runs part here" in buf.getvalue()
    assert "NEW: KP005 engine-abort" in buf.getvalue()


def test_every_trace_rep_once_fixes_races_and_only_the_partial_copy_abort_is_new():
    code, doc = run_json(*TRACES)
    assert code == 1
    assert [(g["trace"], g["code"]) for g in doc["summary"]["regressions"]] == [
        (PARTIAL, "KP005")]
    fixed = {t["trace"]["name"]: {c["code"] for c in t["findings_fixed"]}
             for t in doc["traces"]}
    assert fixed["shared-prefix-race"] == {"KP001"}
    # the abort PR #29994 adds on purpose can be accepted explicitly
    code, doc = run_json(*TRACES, "--ignore", "KP005")
    assert code == 0 and doc["summary"]["regressions"] == []
    assert doc["summary"]["findings_introduced"] == {"KP005": 1}


# --- exit 2 ------------------------------------------------------------------------------


def test_reports_of_different_traces_are_refused_unless_forced(tmp_path):
    a = save_report(tmp_path / "a.json", RACE, "cache-safe")
    b = save_report(tmp_path / "b.json", PARTIAL, "rep-once")
    code, out, err = run(a, b)
    assert code == 2 and out == ""
    assert "are not reports of the same trace" in err and "--force" in err
    code, _, err = run(a, b, "--force")
    assert code in (0, 1)
    assert "different traces" in err


@pytest.mark.parametrize("args, message", [
    (("traces/shared-prefix-race.yaml", "x.json"), "cannot mix reports with traces"),
    (("traces/nope.yaml",), "cannot read the trace"),
    ((RACE, "--head", "no-such-engine"), "unknown engine 'no-such-engine'"),
    ((RACE, "--head", "no_such_module:V"), "no module named 'no_such_module'"),
    ((RACE, "--ignore", "XY1"), "no finding code starts with it"),
    (("a.json",), "compare exactly two reports"),
])
def test_bad_input_exits_2_with_a_message(args, message):
    code, out, err = run(*args)
    assert code == 2 and out == ""
    assert message in err
    assert "Traceback" not in err


def test_report_options_for_traces_only_are_refused(tmp_path):
    a = save_report(tmp_path / "a.json", RACE, "cache-safe")
    code, _, err = run(a, a, "--head", "rep-once")
    assert code == 2 and "--head applies to traces only" in err


def test_a_file_that_is_not_a_report_exits_2(tmp_path):
    a = save_report(tmp_path / "a.json", RACE, "cache-safe")
    (tmp_path / "bad.json").write_text('{"kpool_report": 1, "trace": {"sha256": "x"}}')
    code, _, err = run(a, str(tmp_path / "bad.json"))
    assert code == 2 and "bad.json:1:1: report.tool: missing field" in err
    (tmp_path / "nojson.json").write_text("{")
    code, _, err = run(a, str(tmp_path / "nojson.json"))
    assert code == 2 and "not JSON" in err


# --- one comparison for both sources ------------------------------------------------------


@pytest.mark.parametrize("trace", [RACE, PARTIAL, NON_UNIFIED])
def test_saved_reports_and_live_replays_give_the_same_diff(tmp_path, trace):
    a = save_report(tmp_path / "a.json", trace, "cache-safe")
    b = save_report(tmp_path / "b.json", trace, "rep-once")
    from_reports, _ = gather([a, b], base=None, head=None, backend=None)
    live, _ = gather([trace], base="cache-safe", head="rep-once", backend="none")
    assert from_reports == live  # the normalised runs are equal
    r1 = DiffResult(tuple(compare(x, y) for x, y in from_reports))
    r2 = DiffResult(tuple(compare(x, y) for x, y in live))
    assert r1 == r2
    assert run_json(a, b) == run_json(trace)


def test_a_report_with_n_batch_reads_as_its_live_run(tmp_path):
    """`config.n_batch`, written only when the trace records it, reads back as the
    live run's: the saved reports and the live replays give the same runs."""
    trace = tmp_path / "nb.yaml"
    trace.write_text("kpool_trace: 1\ncache: {kv_size: 32, kpool: 4, n_seq_max: 2, "
                     "n_batch: 8}\nops:\n  - decode: {seq: 0, pos: 0..8}\n"
                     "  - seq_cp: {src: 0, dst: 1}\n  - decode: {seq: 0, pos: 8}\n")
    a = save_report(tmp_path / "a.json", str(trace), "cache-safe")
    b = save_report(tmp_path / "b.json", str(trace), "rep-once")
    assert json.loads(Path(a).read_text())["config"]["n_batch"] == 8
    from_reports, _ = gather([a, b], base=None, head=None, backend=None)
    live, _ = gather([str(trace)], base="cache-safe", head="rep-once", backend="none")
    assert from_reports == live and dict(live[0][0].config)["n_batch"] == 8


def test_several_reports_in_one_file_pair_in_order(tmp_path):
    def save(name: str, engine: str) -> str:
        r = CliRunner().invoke(cli, ["replay", RACE, PARTIAL, "--engine", engine, "--backend",
                                     "none", "--format", "json", "-o", str(tmp_path / name)])
        assert r.exit_code in (0, 1)
        return str(tmp_path / name)
    code, doc = run_json(save("a.json", "cache-safe"), save("b.json", "rep-once"))
    assert code == 1
    assert [t["trace"]["path"] for t in doc["traces"]] == [RACE, PARTIAL]
    assert doc == run_json(RACE, PARTIAL)[1]


def test_jobs_give_the_same_result_as_one_process():
    one, _ = gather(TRACES, base="cache-safe", head="rep-once", backend="none", jobs=1)
    many, _ = gather(TRACES, base="cache-safe", head="rep-once", backend="none", jobs=3)
    assert one == many


def test_units_and_summaries_pickle():
    unit = Unit(RACE, "rep-once", "none")
    assert pickle.loads(pickle.dumps(unit)) == unit
    summary = run_unit(unit)
    assert pickle.loads(pickle.dumps(summary)) == summary


def test_an_invalid_trace_found_by_a_unit_is_bad_input(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("kpool_trace: 1\ncache: {kv_size: 0, kpool: 4}\nops: []\n")
    with pytest.raises(DiffInputError, match="invalid trace"):
        gather([str(bad)], base=None, head=None, backend=None)


def test_compare_is_pure_and_symmetric_in_its_findings():
    b = run_unit(Unit(RACE, "cache-safe", "none"))
    h = run_unit(Unit(RACE, "rep-once", "none"))
    d = compare(b, h)
    assert d == compare(b, h)
    back = compare(h, b)
    assert [(c.code, c.where) for c in back.introduced] == [(c.code, c.where) for c in d.fixed]
    assert [(c.code, c.where) for c in back.fixed] == [(c.code, c.where) for c in d.introduced]
    assert len(back.entries) == len(d.entries)


def test_the_value_backend_passes_through_and_adds_kp003():
    """coupled-rep-conflict: with values, cache-safe's stale reads (KP003) are fixed at
    op 3 and both versions still read row 5 wrong at op 7 (no regression)."""
    code, doc = run_json("traces/coupled-rep-conflict.yaml", "--backend", "numpy")
    assert code == 0
    t = doc["traces"][0]
    assert t["base"]["backend"] == t["head"]["backend"] == "numpy"
    assert t["totals"]["head"]["findings"].get("KP003")
    assert "KP003" in {c["code"] for c in t["findings_fixed"]}


# --- the views ----------------------------------------------------------------------------


def _result(*traces: str) -> DiffResult:
    pairs, _ = gather(list(traces), base=None, head=None, backend="none")
    return DiffResult(tuple(compare(b, h) for b, h in pairs))


def test_json_output_is_valid_and_written_atomically(tmp_path):
    out = tmp_path / "diff.json"
    code, stdout, _ = run(*TRACES, "--format", "json", "-o", str(out))
    assert code == 1 and stdout == ""
    doc = json.loads(out.read_text())
    assert doc["kpool_diff"] == 1
    assert (doc["base"], doc["head"]) == ("cache-safe", "rep-once")
    assert len(doc["traces"]) == len(TRACES)
    assert doc["summary"]["exit_code"] == 1
    assert json.loads(json.dumps(doc)) == doc


@pytest.mark.parametrize("width", [80, 200])
def test_the_rich_view_fits_the_terminal(width):
    buf = io.StringIO()
    r = _result(*TRACES)
    write_diff_rich(make_console(buf, Manners(True, False, width)), r)
    text = buf.getvalue()
    assert max(len(line) for line in text.splitlines()) <= width
    assert "base: cache-safe" in text and "head: rep-once" in text
    assert "the runs part here" in text
    assert "fixed: KP001 scatter-race" in text
    # shared-prefix-race's pools re-pooled in its summary row: `17 -> 8` whole, its
    # ratio after it at 200 columns; at 80, where the outcome column keeps its lines
    # whole (`2/3 ubatches and 1 event`), the ratio takes the line under the counts
    lines = [line.rstrip() for line in text.splitlines()]
    row = next(i for i, line in enumerate(lines) if line.split()[:1] == ["shared-prefix-race"])
    assert "17 -> 8 (0.47x)" in lines[row] if width == 200 else \
        re.search(r"\b17 -> 8 +58 -> 32$", lines[row]) and "(0.47x)" in lines[row + 1]
    assert "2/3 ubatches and 1 event" in lines[row + 1]
    assert "REGRESSION (exit 1)" in text


def test_the_rich_view_wraps_its_cells_between_units_at_80_columns():
    """shared-prefix-race at 80 columns: the where column (about 19 cells) cannot hold
    `seq 0 pos 12; seq 1 pos 12`, nor a side (about 29) `stale seq 0 from pos 0, seq 1
    from pos 0`; each breaks between its sequences (`wording.units`), never inside one,
    the line after hung 2 in. rich's own wrapping broke at any space: `seq` ended a
    line and `1 pos 12` began the next."""
    buf = io.StringIO()
    write_diff_rich(make_console(buf, Manners(True, False, 80)), _result(RACE))
    lines = buf.getvalue().splitlines()
    # a word cut from its value ends a column: `seq` then the gap to the next, or the end
    assert not any(re.search(r"\b(seq|pos|KP\d{3})( {2,}|$)", ln) for ln in lines)
    assert sum("seq 1 pos 12" in ln for ln in lines) == 1  # op 3.0's where
    # op 1's and op 3.0's stale positions, both sides
    assert sum(ln.count("seq 1 from pos 0") for ln in lines) == 4
    assert sum(ln.count("fixed: KP001 scatter-race") for ln in lines) == 2


def test_both_views_group_counts_from_10_000(tmp_path):
    """`wording.count` in the diff's views: one sequence decodes 12,000 tokens in one
    ubatch, a token a pool (kpool 1), so each engine marks all 12,000 pools, new ones:
    `12,000 -> 12,000 (1.00x)` pools re-pooled, and a sparkline of one ubatch a side.
    The trace's positions (`pos 0..12000`) are never grouped."""
    path = tmp_path / "big.yaml"
    path.write_text(BIG)
    r = _result(str(path))
    buf = io.StringIO()
    write_diff_plain(buf, r)
    plain = buf.getvalue()
    assert "pools re-pooled 12,000 -> 12,000 (1.00x)" in plain
    assert "big: pools marked (per ubatch): base 12,000; head 12,000\n" in plain
    assert "all traces: pools re-pooled 12,000 -> 12,000 (1.00x)" in plain
    buf = io.StringIO()
    write_diff_rich(make_console(buf, Manners(True, False, 80)), r)
    rich = [" ".join(line.split()) for line in buf.getvalue().splitlines()]
    assert any(line.startswith("big same behaviour 12,000 -> 12,000 (1.00x)") for line in rich)
    assert "all traces 12,000 -> 12,000 (1.00x)" in " ".join(rich)
    assert "big pools marked base █ head █ per ubatch" in rich


def _summary(r: DiffResult, width: int) -> list[str]:
    """The rich view's summary (from its heading on) at `width` columns."""
    buf = io.StringIO()
    write_diff_rich(make_console(buf, Manners(True, False, width)), r)
    lines = [line.rstrip() for line in buf.getvalue().splitlines()]
    return lines[next(i for i, line in enumerate(lines) if line.startswith("summary:")):]


@pytest.mark.parametrize("width", [40, 60])
def test_the_summary_keeps_every_outcome_and_count_of_five_digits_at_40_columns(
        tmp_path, width):
    """`big` re-pools 12,000 pools: `12,000 -> 12,000 (1.00x)`, 24 columns a ratio. At
    40 columns the two ratios left its outcome no column: `same behaviour` was not
    printed, `all traces` was cut to `all tr…`, and beside the race trace the outcome
    took a letter a line. Now the rows go under their names and each count takes a
    line of its own (`12,000` / `-> 12,000` / `(1.00x)`) when that is what leaves the
    outcome its words whole."""
    from rich.cells import cell_len

    path = tmp_path / "big.yaml"
    path.write_text(BIG)
    for r in (_result(str(path)), _result(str(path), RACE)):
        lines = _summary(r, width)
        text = "\n".join(lines)
        assert all(cell_len(line) <= width for line in lines), text
        assert "…" not in text, text
        assert [line.strip() for line in lines].count("all traces") == 1, text
        assert re.search(r"^   same behaviour +12,000", text, re.M), text
        if width == 40:  # 16 + 16 columns of `12,000 -> 12,000` leave the outcome none
            assert re.search(r"^ +-> 12,000 +-> 12,000$", text, re.M), text
        if len(r.traces) == 2:
            assert re.search(r"^   fixed KP001 x2 ", text, re.M), text


def test_a_sparkline_row_is_measured_by_both_its_sides():
    """partial-copy under rep-once (2 ubatches: it aborts at op 2) vs cache-safe (3):
    `base ▃▅  head ▃▅█  per ubatch` takes 29 columns. At 59 the sparklines' column is
    28 wide beside `partial-copy` and `cells scanned`: measured with the base side
    twice (28), the row was kept in columns and `per ubatch` went to a line of its
    own; now it is on a line of its own, its name above it, whole."""
    pairs, _ = gather([PARTIAL], base="rep-once", head="cache-safe", backend="none")
    lines = _summary(DiffResult(tuple(compare(b, h) for b, h in pairs)), 59)
    marks = [line for line in lines if re.search(f"base [{SPARKS}]+  head ", line)]
    assert len(marks) == 2
    assert all(line.endswith("  per ubatch") for line in marks), "\n".join(lines)
    assert "partial-copy" in [line.strip() for line in lines]


def test_the_plain_view_lists_only_differing_ubatches():
    buf = io.StringIO()
    write_diff_plain(buf, _result(RACE, PREFILL))
    text = buf.getvalue()
    assert "op 3.0  ubatch 1  seq 0 pos 12; seq 1 pos 12" in text
    assert "op 0.0" not in text  # the prefill ubatch is the same in both
    assert "prefill-decode): same behaviour" in text
    assert "pools re-pooled 17 -> 8 (0.47x)" in text
    assert diff_json(_result(RACE))["summary"]["verdict"] == "changed"


def test_the_diff_words_ranges_pools_and_stale_positions_as_the_replay_does():
    """shared-prefix-race: at op 1 cache-safe stales both slots from pos 0, rep-once only
    the copy (seq 1); at op 6.0 cache-safe re-pools pools 0, 1, 2 of both slots, which
    rep-once keeps. coupled-rep-conflict at op 3.0: cache-safe's two entries write row 5."""
    buf = io.StringIO()
    write_diff_plain(buf, _result(RACE, "traces/coupled-rep-conflict.yaml"))
    text = buf.getvalue()
    assert "stale seq 0 from pos 0, seq 1 from pos 0" in text
    assert "stale seq 1 from pos 0" in text
    assert "marks 8, only here: 0:0..3 1:0..3" in text
    assert "op 6.0  ubatch 2  seq 0 pos 13..16; seq 1 pos 13..16" in text
    assert "scatter 5 x2" in text
    assert not re.search(r"\d-\d", text)  # no inclusive range anywhere
