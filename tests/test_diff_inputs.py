"""`kpool diff` on hostile inputs: reports are untrusted (people attach them to bug
reports). Every bad report exits 2 with the file and the JSON path of the field, or
is compared in a stated way; never an internal error, a traceback, or a REGRESSION
that is only a mismatch of kinds (value backends). Also: telling reports from traces
by content, strings that would drive a terminal, and errors inside `--jobs` workers.
"""

from __future__ import annotations

import copy
import io
import json
import os
import re
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from placed import unplaced

from kpool_cli.cli import cli
from kpool_cli.diff import reports
from kpool_cli.diff.compare import DiffResult, compare
from kpool_cli.diff.reports import ReportError, from_report, input_kind, read_report_bytes
from kpool_cli.report.diff_view import write_diff_json, write_diff_plain, write_diff_rich
from kpool_cli.report.terminal import Manners, make_console

ROOT = Path(__file__).resolve().parent.parent
RACE = "traces/shared-prefix-race.yaml"
PARTIAL = "traces/partial-copy.yaml"
COUPLED = "traces/coupled-rep-conflict.yaml"


@pytest.fixture(autouse=True)
def _in_root(monkeypatch):
    monkeypatch.chdir(ROOT)


def diff(*args: str, env: dict | None = None) -> tuple[int, str, str]:
    r = CliRunner().invoke(cli, ["diff", *args], catch_exceptions=False, env=env)
    return r.exit_code, r.stdout, r.stderr


def refused(*args: str) -> str:
    """Run `kpool diff`, expect exit 2 with a message and nothing on stdout; the message."""
    code, out, err = diff(*args)
    assert code == 2, (code, out, err)
    assert out == ""
    assert err.startswith("kpool: ")
    assert "Traceback" not in err and "internal error" not in err
    return unplaced(err)


def replay_json(trace: str | list[str], engine: str, backend: str = "none") -> object:
    traces = [trace] if isinstance(trace, str) else trace
    r = CliRunner().invoke(cli, ["replay", *traces, "--engine", engine, "--backend", backend,
                                 "--format", "json"])
    assert r.exit_code in (0, 1), r.stderr
    return json.loads(r.stdout)


@pytest.fixture(scope="module")
def race_base() -> dict:
    return replay_json(RACE, "cache-safe")  # type: ignore[return-value]


@pytest.fixture(scope="module")
def race_head() -> dict:
    return replay_json(RACE, "rep-once")  # type: ignore[return-value]


def save(tmp_path: Path, name: str, doc: object) -> str:
    path = tmp_path / name
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc), encoding="utf-8")
    return str(path)


def mutated(doc: dict, path: str, value: object = None, *, delete: bool = False) -> dict:
    """A deep copy of `doc` with the field at `path` (`ubatches.1.n_new`) set or deleted."""
    out = copy.deepcopy(doc)
    *parents, last = path.split(".")
    node: object = out
    for p in parents:
        node = node[int(p)] if isinstance(node, list) else node[p]  # type: ignore[index]
    key: int | str = int(last) if isinstance(node, list) else last
    if delete:
        del node[key]  # type: ignore[union-attr]
    else:
        node[key] = value  # type: ignore[index]
    return out


def first_finding(doc: dict) -> int:
    return next(i for i, u in enumerate(doc["ubatches"]) if u["findings"])


# --- wrong types, missing fields, bad values -----------------------------------------------


@pytest.mark.parametrize("path, value, message", [
    ("ubatches.1.n_new", True, "report.ubatches[1].n_new: expected a non-negative integer, "
                               "got true"),
    ("ubatches.1.n_new", -1, "report.ubatches[1].n_new: -1 is out of range (at least 0)"),
    ("ubatches.1.n_new", 1.0, "report.ubatches[1].n_new: expected a non-negative integer, "
                              "got 1.0"),
    ("ubatches.1.n_new", None, "report.ubatches[1].n_new: expected a non-negative integer, "
                               "got null"),
    ("ubatches.0.tokens.0.pos", "1", "report.ubatches[0].tokens[0].pos: expected an integer, "
                                     "got the string \"1\""),
    ("ubatches.0.tokens", {}, "report.ubatches[0].tokens: expected an array, got an object"),
    ("ubatches.0.tokens.0.seq", [0, "x"], "report.ubatches[0].tokens[0].seq[1]: expected an "
                                          "integer"),
    ("ubatches.0.tokens.0.seq", [0, -1], "report.ubatches[0].tokens[0].seq[1]: seq -1 is out "
                                         "of range (config.n_seq_max is 2)"),
    ("ubatches.0.scatter.0.pad", 0, "report.ubatches[0].scatter[0].pad: expected false, "
                                    "got 0"),  # a run (its n), so pad is false
    ("ubatches.0.pools.0.new", "yes", "report.ubatches[0].pools[0].new: expected true or "
                                      "false"),
    ("ubatches.0.cost.cells_scanned", -5, "report.ubatches[0].cost.cells_scanned: -5 is out "
                                          "of range"),
    ("ubatches.0.cost.my counter", "a", "report.ubatches[0].cost[\"my counter\"]: expected a "
                                        "non-negative integer"),
    ("ubatches.0.stale_batch", {"01": 3}, "report.ubatches[0].stale_batch[\"01\"]: not a seq "
                                          "id"),
    ("events.0.stale", {"1": "zero"}, "report.events[0].stale[\"1\"]: expected an integer"),
    ("events.0.status", "exploded", "report.events[0].status: expected one of applied, "
                                    "rejected, aborted, got the string \"exploded\""),
    ("events.0.kind", 7, "report.events[0].kind: expected a string, got 7"),
    ("events.0.message", ["x"], "report.events[0].message: expected a string, got an array"),
    ("engine", {"name": "x"}, "report.engine: expected a string, got an object"),
    ("backend", 3, "report.backend: expected a string or null, got 3"),
    ("config.unified", 1, "report.config.unified: expected true or false, got 1"),
    ("config.kv_size", 0, "report.config.kv_size: 0 is out of range (at least 1)"),
    ("trace", "t.yaml", "report.trace: expected an object, got the string \"t.yaml\""),
    ("trace.sha256", "ABC", "report.trace.sha256: not a sha256"),
    ("tool.version", 1, "report.tool.version: expected a string, got 1"),
    ("ubatches", None, "report.ubatches: expected an array, got null"),
])
def test_a_field_of_the_wrong_type_or_value_is_located(tmp_path, race_base, path, value,
                                                       message):
    a = save(tmp_path, "a.json", race_base)
    b = save(tmp_path, "b.json", mutated(race_base, path, value))
    err = refused(a, b)
    assert f"b.json: {message}" in err


def test_a_finding_field_of_the_wrong_type_is_located(tmp_path, race_base):
    i = first_finding(race_base)
    a = save(tmp_path, "a.json", race_base)
    b = save(tmp_path, "b.json", mutated(race_base, f"ubatches.{i}.findings.0.rows", [3, 1.5]))
    assert f"b.json: report.ubatches[{i}].findings[0].rows[1]: expected an integer, got 1.5" \
        in refused(a, b)
    b = save(tmp_path, "b.json", mutated(race_base, f"ubatches.{i}.findings.0.code", None))
    assert f"report.ubatches[{i}].findings[0].code: expected a string, got null" \
        in refused(a, b)


@pytest.mark.parametrize("path", [
    "tool", "trace.sha256", "trace.path", "engine", "backend", "config", "config.n_embd",
    "ubatches", "events", "ubatches.1.scatter", "ubatches.0.index", "ubatches.0.cost.reps_sorted",
    "ubatches.0.tokens.0.seq", "ubatches.0.pools.0.k", "events.0.stale", "events.0.op",
])
def test_a_missing_field_is_located(tmp_path, race_base, path):
    a = save(tmp_path, "a.json", race_base)
    b = save(tmp_path, "b.json", mutated(race_base, path, delete=True))
    steps = "".join(f"[{p}]" if p.isdigit() else f".{p}" for p in path.split("."))
    assert f"b.json: report{steps}: missing field" in refused(a, b)


def test_a_bad_field_is_placed_by_line_and_column(tmp_path, race_base):
    """As a trace's problems are: `FILE:LINE:COL: PATH: problem`, at the field's value,
    or at its object when it is missing. The report is written one field a line
    (`indent=1`), so the places are found here by reading the text."""
    a = save(tmp_path, "a.json", race_base)
    text = json.dumps(mutated(race_base, "ubatches.1.n_new", -1), indent=1)
    b = save(tmp_path, "b.json", text)
    at = text.index('"n_new": -1')  # the only n_new of -1
    line = text.count("\n", 0, at) + 1
    col = at - text.rfind("\n", 0, at) + len('"n_new": ')  # 1-based, at the -1
    _, _, err = diff(a, b)
    assert f"b.json:{line}:{col}: report.ubatches[1].n_new: -1 is out of range" in err
    # missing: at the `{` of ubatch 1, the line after `"ubatches": [` and ubatch 0
    doc = mutated(race_base, "ubatches.1.op", delete=True)
    text = json.dumps(doc, indent=1)
    b = save(tmp_path, "b.json", text)
    ubatch_1 = text.index('\n  {\n', text.index('"ubatches": [') + 20) + 1
    line = text.count("\n", 0, ubatch_1) + 1
    _, _, err = diff(a, b)
    assert f"b.json:{line}:3: report.ubatches[1].op: missing field" in err


def test_a_field_after_deep_junk_is_placed_at_the_field(tmp_path, race_base):
    """A field the format does not declare may nest up to MAX_DEPTH levels: the walk to
    a later field's place skips it whole (40 levels, past what the shape's pattern
    matches), so the place is the field's, not the array's around it (`refused`
    checks the place against the parsed file)."""
    a = save(tmp_path, "a.json", race_base)
    doc = mutated(race_base, "ubatches.0.added_later", json.loads("[" * 40 + "]" * 40))
    b = save(tmp_path, "b.json", mutated(doc, "ubatches.1.n_new", -1))
    assert "b.json: report.ubatches[1].n_new: -1 is out of range" in refused(a, b)


def test_optional_fields_may_be_absent_and_unknown_ones_are_ignored(tmp_path, race_base,
                                                                    race_head):
    """An event without `findings` or `message` (kpool leaves them out when empty), and
    fields a later version may add, anywhere, holding anything that is JSON. A field
    the diff does not read is still checked (the schema's type), and a required one
    (`summary`) is still required."""
    doc = copy.deepcopy(race_head)
    for e in doc["events"]:
        e.pop("findings", None)
        e.pop("message", None)
    a = save(tmp_path, "a.json", race_base)
    bad = mutated(doc, "ubatches.0.pools.0.first_pos", "not read")
    assert "b.json: report.ubatches[0].pools[0].first_pos: expected an integer, got the " \
        "string \"not read\"" in refused(a, save(tmp_path, "b.json", bad))
    bad = mutated(doc, "summary", delete=True)
    assert "b.json: report.summary: missing field" in refused(a, save(tmp_path, "b.json", bad))
    text = json.dumps(doc)[:-1] + (', "added_later": {"huge": 1' + "0" * 5000
                                   + ', "float": 1e999, "deep": ' + "[" * 500 + "]" * 500 + "}}")
    code, _, err = diff(a, save(tmp_path, "b.json", text))
    assert code in (0, 1), err


def test_a_report_from_before_n_rs_seq_reads_as_n_rs_seq_0(tmp_path, race_base):
    """`config.n_rs_seq` came after v1's first reports: absent, it means 0, so such a
    report compares with a new one of the same run as "no differences"; a bad value
    is still located."""
    old = copy.deepcopy(race_base)
    del old["config"]["n_rs_seq"]
    a, b = save(tmp_path, "a.json", race_base), save(tmp_path, "b.json", old)
    code, out, err = diff(a, b)
    assert code == 0 and "no differences" in out, err
    bad = save(tmp_path, "c.json", mutated(race_base, "config.n_rs_seq", -1))
    assert "c.json: report.config.n_rs_seq: -1 is out of range (at least 0)" in refused(a, bad)


# --- another kpool version ------------------------------------------------------------------


def test_an_unknown_finding_code_names_the_code_and_the_version(tmp_path, race_base):
    i = first_finding(race_base)
    doc = copy.deepcopy(race_base)
    doc["tool"]["version"] = "9.9.9"
    doc["ubatches"][i]["findings"].append({"code": "KP042", "name": "later", "rows": [1]})
    a = save(tmp_path, "a.json", race_base)
    err = refused(a, save(tmp_path, "b.json", doc))
    assert f"b.json: report.ubatches[{i}].findings[1].code: unknown finding code \"KP042\"" \
        in err
    assert "written by kpool 9.9.9" in err and "REGRESSION" not in err


def test_an_unknown_code_in_an_array_of_reports_is_located_by_report(tmp_path):
    both = replay_json([RACE, PARTIAL], "rep-once")
    assert isinstance(both, list)
    bad = copy.deepcopy(both)
    bad[1]["events"][0]["findings"] = [{"code": "KP999", "rows": []}]
    a = save(tmp_path, "a.json", both)
    err = refused(a, save(tmp_path, "b.json", bad))
    assert "b.json: reports[1].events[0].findings[0].code: unknown finding code \"KP999\"" \
        in err
    bad[1]["events"][0]["findings"] = [{"code": "boom", "rows": []}]
    err = refused(a, save(tmp_path, "b.json", bad))
    assert "reports[1].events[0].findings[0].code: not a finding code" in err


@pytest.mark.parametrize("value, message", [
    (2, "report format 2, written by kpool 0.9: this kpool"),
    (True, "report format true"),
    ("1", "report format the string \"1\""),
])
def test_another_report_format_is_refused(tmp_path, race_base, value, message):
    doc = mutated(race_base, "kpool_report", value)
    doc["tool"]["version"] = "0.9"
    err = refused(save(tmp_path, "a.json", race_base), save(tmp_path, "b.json", doc))
    assert f"b.json: report.kpool_report: {message}" in err


def test_an_unknown_value_backend_is_refused(tmp_path, race_base):
    doc = mutated(race_base, "backend", "cuda")
    err = refused(save(tmp_path, "a.json", race_base), save(tmp_path, "b.json", doc))
    assert "b.json: report.backend: unknown value backend \"cuda\"" in err


def test_reports_of_different_kpool_versions_are_compared_with_a_warning(tmp_path, race_base):
    doc = mutated(race_base, "tool.version", "0.0.9")
    code, _, err = diff(save(tmp_path, "a.json", race_base), save(tmp_path, "b.json", doc))
    assert code == 0
    assert "written by different kpool versions (0.0.9, " in err


def test_the_report_of_a_stopped_replay_is_refused(tmp_path, race_base):
    doc = copy.deepcopy(race_base)
    doc["problems"] = [{"file": "t.yaml", "line": 6, "column": 5, "field": "decode.cell",
                        "message": "recorded cell 3 is not empty"}]
    doc["summary"]["status"] = "invalid"
    err = refused(save(tmp_path, "a.json", race_base), save(tmp_path, "b.json", doc))
    assert "b.json: report.problems: the replay stopped" in err
    assert "recorded cell 3 is not empty" in err


# --- numbers, NaN, duplicate keys, nesting, encoding ------------------------------------------


def _text_with(doc: dict, field: str, raw: str) -> str:
    """The report as JSON text, with `"field": <raw>` replacing the first such field."""
    text = json.dumps(doc)
    key = f'"{field}": '
    start = text.index(key) + len(key)
    end = start
    while text[end] not in ",}":
        end += 1
    return text[:start] + raw + text[end:]


@pytest.mark.parametrize("raw, message", [
    ("1" + "0" * 5000, "report.ubatches[0].n_new: 100000000000... (an integer of 5001 digits) "
                       "is out of range (integers of at most 64 bits)"),
    (str(2**63), f"report.ubatches[0].n_new: {2**63} is out of range"),
    ("1e999", "report.ubatches[0].n_new: expected a non-negative integer, got 1e999"),
    ("-1e999", "report.ubatches[0].n_new: expected a non-negative integer, got -1e999"),
    ("NaN", "report.ubatches[0].n_new: NaN is not JSON"),
    ("Infinity", "report.ubatches[0].n_new: Infinity is not JSON"),
    ("-Infinity", "report.ubatches[0].n_new: -Infinity is not JSON"),
])
def test_numbers_that_are_not_64_bit_integers_are_located(tmp_path, race_base, raw, message):
    b = save(tmp_path, "b.json", _text_with(race_base, "n_new", raw))
    assert f"b.json: {message}" in refused(save(tmp_path, "a.json", race_base), b)


def test_nan_is_refused_even_where_the_diff_does_not_read(tmp_path, race_base):
    text = json.dumps(race_base)[:-1] + ', "added": {"x": [1, NaN]}}'
    err = refused(save(tmp_path, "a.json", race_base), save(tmp_path, "b.json", text))
    assert "b.json: report.added.x[1]: NaN is not JSON" in err


@pytest.mark.parametrize("inject, where", [
    ('{"kpool_report": 1, "kpool_report": 1, ', "report: duplicate key \"kpool_report\""),
    (None, "report.ubatches[0]: duplicate key \"n_new\""),
])
def test_duplicate_keys_are_located(tmp_path, race_base, inject, where):
    text = json.dumps(race_base)
    if inject is not None:
        text = inject + text[1:]
    else:
        text = text.replace('"n_new": ', '"n_new": 0, "n_new": ', 1)
    err = refused(save(tmp_path, "a.json", race_base), save(tmp_path, "b.json", text))
    assert f"b.json: {where}" in err


def test_nesting_deeper_than_the_parser_goes_is_located(tmp_path, race_base):
    a = save(tmp_path, "a.json", race_base)
    err = refused(a, save(tmp_path, "b.json", "[" * 100_000))
    assert "b.json:1:101: arrays and objects nested too deeply to read" in err
    text = json.dumps(race_base)
    deep = text[:-1] + ',\n"added": ' + "[" * 100_000 + "]" * 100_000 + "}"
    err = refused(a, save(tmp_path, "b.json", deep))
    assert "b.json:2:109: arrays and objects nested too deeply" in err
    prefix = '{"kpool_report": 1, "x": "[[[{{", "y": '  # brackets in a string do not count
    err = refused(a, save(tmp_path, "b.json", prefix + "[" * 99_000))
    assert f"b.json:1:{len(prefix) + 100}: arrays and objects nested too deeply" in err


@pytest.mark.parametrize("data, message", [
    (b"", "b.json:1:1: not JSON: Expecting value"),
    (b"   \n", "b.json:2:1: not JSON: Expecting value"),
    (b'{"kpool_report": 1} trailing', "b.json:1:21: not JSON: Extra data"),
    (b"\xff\xfe{}", "b.json:1: not UTF-8 text (invalid start byte at byte 0)"),
    (b"[]", "b.json: reports: an empty array holds no report"),
    (b"5", "b.json: report: not a kpool report (expected an object, got 5)"),
    (b"[1]", "b.json: reports[0]: not a kpool report (expected an object, got 1)"),
    (b'{"name": "x"}', "b.json: report: not a kpool report (no \"kpool_report\": 1)"),
    (b'{"kpool_trace": 1, "cache": {}}', "b.json: report: a trace, not a report"),
    (b'{"kpool_report": 1, "tool": {"name": "kpool", "version": "0.1.0"}, '
     b'"trace": {"path": "\\ud800", "name": "", "sha256": ""}}',
     "b.json: report.trace.path: not Unicode text: a lone surrogate \\ud800"),
])
def test_files_that_are_not_reports_are_refused(tmp_path, race_base, data, message):
    (tmp_path / "b.json").write_bytes(data)
    err = refused(save(tmp_path, "a.json", race_base), str(tmp_path / "b.json"))
    assert message in err


def test_a_byte_order_mark_is_allowed(tmp_path, race_base):
    (tmp_path / "b.json").write_bytes(b"\xef\xbb\xbf" + json.dumps(race_base).encode())
    code, _, err = diff(save(tmp_path, "a.json", race_base), str(tmp_path / "b.json"))
    assert code == 0, err


# --- size -------------------------------------------------------------------------------------


def test_a_report_of_several_gigabytes_is_refused_unread(tmp_path, race_base):
    big = tmp_path / "big.json"
    with open(big, "wb") as f:  # sparse: costs no disk
        f.write(b"[")
        f.truncate(5 * 2**30)
    err = refused(save(tmp_path, "a.json", race_base), str(big))
    assert "big.json: the report is larger than 128 MiB" in err


def test_an_endless_device_is_refused_unread(monkeypatch):
    monkeypatch.setattr(reports, "MAX_REPORT_BYTES", 4096)
    with pytest.raises(ReportError, match="is a device, not a regular file"):
        read_report_bytes("/dev/zero")  # endless, and st_size 0


def test_the_size_bound_applies_to_reports_on_the_command_line(tmp_path, race_base,
                                                               monkeypatch):
    a = save(tmp_path, "a.json", race_base)
    monkeypatch.setattr(reports, "MAX_REPORT_BYTES", os.path.getsize(a) - 1)
    assert "a.json: the report is larger than" in refused(a, a)


# --- reports or traces: by name, else by content ----------------------------------------------


def test_reports_not_named_json_are_recognised_by_content(tmp_path, race_base, race_head):
    a = save(tmp_path, "before.report", race_base)
    b = save(tmp_path, "after", "\n  " + json.dumps(race_head))
    assert input_kind(a) == ("report", "starts with {")
    code, out, err = diff(a, b)
    assert code == 0, err
    assert "fixed KP001" in out
    arr = save(tmp_path, "both.txt", json.dumps([race_base]))
    assert input_kind(arr)[0] == "report"


def test_traces_not_named_yaml_are_recognised_by_content(tmp_path):
    t = tmp_path / "race.trace"
    t.write_text((ROOT / RACE).read_text())
    assert input_kind(str(t)) == ("trace", "does not start with { or [")
    code, out, err = diff(str(t))
    assert code == 0, err
    assert "fixed KP001" in out


def test_a_trace_in_json_syntax_is_a_trace_when_named_yaml(tmp_path):
    t = tmp_path / "race.yaml"
    t.write_text(json.dumps(yaml.safe_load((ROOT / RACE).read_text())))
    code, _, err = diff(str(t))
    assert code == 0, err
    other = tmp_path / "race.trace"
    other.write_text(t.read_text())
    assert "race.trace: report: a trace, not a report" in refused(str(other), str(other))


def test_mixing_reports_and_traces_is_refused_whatever_the_names(tmp_path, race_base):
    a = save(tmp_path, "a.report", race_base)
    err = refused(a, RACE)
    assert "cannot mix reports with traces" in err
    assert "a.report is a report (starts with {)" in err
    assert f"{RACE} a trace (named .yaml)" in err


def test_a_missing_input_is_a_trace_that_cannot_be_read():
    assert "cannot read the trace" in refused("no-such-file")


# --- value backends ---------------------------------------------------------------------------


def test_a_value_backend_on_one_side_only_leaves_kp003_out_and_says_so(tmp_path):
    """cache-safe finds KP003 on coupled-rep-conflict with values: the same engine with
    and without a value backend would show KP003 as introduced, a REGRESSION made by the
    backend alone. It is left out of both sides, and every view says so."""
    none = replay_json(COUPLED, "cache-safe", "none")
    numpy = replay_json(COUPLED, "cache-safe", "numpy")
    assert any(f["code"] == "KP003" for u in numpy["ubatches"] for f in u["findings"])
    a, b = save(tmp_path, "none.json", none), save(tmp_path, "numpy.json", numpy)
    for base, head in ((a, b), (b, a)):
        code, out, err = diff(base, head)
        assert code == 0, out
        assert "REGRESSION" not in out
        assert "KP003 not compared" in out
        assert "not compared: KP003 in coupled-rep-conflict" in out
        assert "KP003 is left out of the comparison" in err
        code, out, _ = diff(base, head, "--format", "json", "--fail-on-change")
        doc = json.loads(out)
        assert code == 0 and doc["summary"]["verdict"] == "no differences"
        assert doc["summary"]["not_compared"] == ["KP003"]
        assert doc["traces"][0]["not_compared"] == ["KP003"]
        assert "KP003" not in doc["traces"][0]["totals"]["head"]["findings"]
    code, out, _ = diff(b, b, "--format", "json")
    doc = json.loads(out)
    assert doc["summary"]["not_compared"] == [] and doc["traces"][0]["not_compared"] == []
    assert doc["traces"][0]["totals"]["base"]["findings"]["KP003"] > 0


@pytest.mark.parametrize("engine", ["cache-safe", "rep-once"])
def test_without_the_value_codes_a_value_backend_changes_nothing(engine):
    """What the rule rests on: on every shipped trace, a run with values and one without
    differ in the value codes only (KP001's rows do not depend on values)."""
    from kpool_cli.diff.runs import Unit, run_unit

    for trace in sorted(str(p.relative_to(ROOT)) for p in (ROOT / "traces").glob("*.yaml")):
        none = run_unit(Unit(trace, engine, "none"))
        numpy = run_unit(Unit(trace, engine, "numpy"))
        for a, b in ((none, numpy), (numpy, none)):
            d = compare(a, b)
            assert d.not_compared == ("KP003",)
            assert not d.changed and not d.fixed and not d.introduced, trace
            assert d.base.findings == d.head.findings


def test_two_value_backends_compare_everything(tmp_path):
    """numba and numpy agree to the last bit: KP003 is compared between them."""
    numpy = replay_json(COUPLED, "cache-safe", "numpy")
    other = copy.deepcopy(numpy)
    other["backend"] = "numba"
    code, out, err = diff(save(tmp_path, "a.json", numpy), save(tmp_path, "b.json", other),
                          "--format", "json")
    assert code == 0 and err == ""
    assert json.loads(out)["summary"]["not_compared"] == []


# --- strings that would drive a terminal -----------------------------------------------------

EVIL = "\x1b[2J\x1b[31mPASS\x07\u202e"
SHOWN = "\\x1b[2J\\x1b[31mPASS\\x07\\u202e"


def _evil_pair(tmp_path: Path, base: dict) -> tuple[str, str]:
    """Two reports of the same trace whose texts hold escape sequences, and whose first
    event parts the runs (so its message is shown)."""
    a = copy.deepcopy(base)
    a["trace"]["path"] = f"t{EVIL}.yaml"
    a["trace"]["name"] = f"name{EVIL}"
    a["engine"] = f"eng{EVIL}"
    a["events"][0]["kind"] = f"seq_cp{EVIL}"
    b = copy.deepcopy(a)
    b["engine"] = f"other{EVIL}"
    b["events"][0]["status"] = "rejected"
    b["events"][0]["message"] = f"msg{EVIL}\x1b]0;pwned\x07"
    b["backend"] = "numpy"
    return save(tmp_path, "a.json", a), save(tmp_path, "b.json", b)


def _no_control(text: str) -> None:
    for bad in ("\x1b[2J", "\x1b[31mPASS", "\x07", "\x1b]0;", "\u202e"):
        assert bad not in text, (bad, text)


def test_report_strings_cannot_drive_the_terminal(tmp_path, race_base):
    a, b = _evil_pair(tmp_path, race_base)
    code, out, err = diff(a, b)  # plain: stdout is not a terminal here
    assert code == 0, err
    _no_control(out)
    _no_control(err)
    assert f"name{SHOWN}" in out and f"msg{SHOWN}" in out and f"seq_cp{SHOWN}" in out
    assert f"base eng{SHOWN}" in out
    code, out, err = diff(a, b, env={"FORCE_COLOR": "1"})  # the rich view, in colour
    assert code == 0
    assert "\x1b[" in out  # its own styles
    _no_control(out)
    plain = re.sub(r"\x1b\[[0-9;]*m", "", out)
    assert f"base eng{SHOWN} vs head" in plain
    assert "msg\\x1b" in plain


def test_the_json_diff_keeps_strings_exact_and_escaped(tmp_path, race_base):
    a, b = _evil_pair(tmp_path, race_base)
    code, out, _ = diff(a, b, "--format", "json")
    assert code == 0
    assert all(c >= " " or c == "\n" for c in out)  # no raw control character at all
    doc = json.loads(out)
    assert doc["traces"][0]["trace"]["name"] == f"name{EVIL}"
    assert doc["head"] == f"other{EVIL}"
    assert doc["traces"][0]["parted"]["head"]["event"]["message"] == f"msg{EVIL}\x1b]0;pwned\x07"


def test_a_long_string_is_shown_cut_and_kept_whole_in_json(tmp_path, race_base):
    """wording.py `visible`: text whose shown form is longer than SHOWN_MOST (16,384)
    characters shows its first and last 8,000, with how many were cut between them. A
    report's 2 MB name (a report may be 128 MiB) once made the text view write eight
    times its size, and take 15 times in memory; the JSON diff keeps it whole. By hand:
    2,000,000 - 16,000 = 1,984,000."""
    a, b = _evil_pair(tmp_path, race_base)
    long = "x" * 2_000_000
    for path in (a, b):
        doc = json.loads(Path(path).read_text())
        doc["trace"]["name"] = long
        Path(path).write_text(json.dumps(doc))
    code, out, _ = diff(a, b)
    assert code == 0
    x = "x" * 8000
    assert f"({x} ... (1,984,000 characters cut) ... {x})" in out and len(out) < 100_000
    code, out, _ = diff(a, b, "--format", "json")
    assert code == 0 and json.loads(out)["traces"][0]["trace"]["name"] == long


def test_the_views_escape_strings_of_live_traces_too(tmp_path):
    t = tmp_path / "evil.yaml"
    text = (ROOT / RACE).read_text()
    t.write_text(f"name: {json.dumps('race' + EVIL)}\n"
                 + "\n".join(line for line in text.splitlines()
                             if not line.startswith("name:")) + "\n")
    code, out, err = diff(str(t))
    assert code == 0, err
    _no_control(out)
    assert f"race{SHOWN}" in out


def test_a_hostile_string_in_an_error_message_is_escaped(tmp_path, race_base):
    i = first_finding(race_base)
    doc = mutated(race_base, f"ubatches.{i}.findings.0.code", EVIL)
    err = refused(save(tmp_path, "a.json", race_base), save(tmp_path, "b.json", doc))
    _no_control(err)
    assert "not a finding code" in err
    doc = mutated(race_base, "tool.version", EVIL)
    doc = mutated(doc, "kpool_report", 3)
    err = refused(save(tmp_path, "a.json", race_base), save(tmp_path, "b.json", doc))
    _no_control(err)
    assert f"written by kpool {SHOWN}" in err


# --- errors inside --jobs workers ----------------------------------------------------------


def test_an_invalid_trace_found_in_a_worker_is_exit_2_with_its_location(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("kpool_trace: 1\ncache: {kv_size: 0, kpool: 4}\nops: []\n")
    err = refused(RACE, str(bad), "--jobs", "2")
    assert f"invalid trace\n{bad}:2:" in err and "cache.kv_size" in err


def test_a_trace_invalid_at_replay_time_in_a_worker_is_exit_2_with_its_location(tmp_path):
    """A recorded cell that is not empty is found only by the replay, in the worker."""
    clash = tmp_path / "clash.yaml"
    clash.write_text("kpool_trace: 1\ncache: {kv_size: 16, kpool: 4}\nops:\n"
                     "  - decode: {tokens: [{pos: 0, seq: [0], cell: 3}]}\n"
                     "  - decode: {tokens: [{pos: 1, seq: [0], cell: 3}]}\n")
    for jobs in ("1", "3"):
        err = refused(RACE, str(clash), PARTIAL, "--jobs", jobs)
        assert f"{clash}:5:" in err and "not empty" in err


def _dies(unit) -> None:
    """A replay worker that dies as a crash would kill it (run_unit's stand-in)."""
    os._exit(3)


def test_a_worker_that_dies_is_exit_2(monkeypatch):
    from kpool_cli.diff import runs

    if (os.cpu_count() or 1) < 2:  # no pool on one core: the stand-in would end pytest
        pytest.skip("needs two cores for a process pool")
    # the pool's workers are forked from here, so they run the stand-in (found by name)
    monkeypatch.setattr(runs, "run_unit", _dies)
    err = refused(RACE, PARTIAL, "--jobs", "2")
    assert "a worker process died" in err and "--jobs 1" in err


# --- no report, however mangled, reaches an internal error --------------------------------


HOSTILE = (None, True, -1, 2**63, 1.5, "x", "\x1b[2J", [], {}, [None], {"": None})


def _leaves(doc: object, path: tuple = ()):
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from _leaves(v, (*path, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from _leaves(v, (*path, i))
    yield path


def test_every_field_replaced_by_anything_is_refused_or_compared(race_base, race_head):
    """Each field of a report (and each container) replaced by each hostile value: the
    reader refuses it with a located ReportError, or the comparison and every view run."""
    base = from_report(race_base, "a.json")
    doc = copy.deepcopy(race_head)
    doc["ubatches"] = doc["ubatches"][:2]  # keep it small: the shapes are what matter
    seen = 0
    shown: set = set()
    for path in list(_leaves(doc)):
        if not path:
            continue
        for value in HOSTILE:
            bad = copy.deepcopy(doc)
            node = bad
            for p in path[:-1]:
                node = node[p]
            node[path[-1]] = value
            try:
                head = from_report(json.loads(json.dumps(bad)), "b.json")
            except ReportError as e:
                assert str(e).startswith("b.json: report")
                seen += 1
                continue
            d = compare(base, head)
            if d in shown:  # a field the diff does not read: the same diff as before
                continue
            shown.add(d)
            r = DiffResult((d,))
            for write in (write_diff_plain, write_diff_json):
                write(io.StringIO(), r)
            write_diff_rich(make_console(io.StringIO(), Manners(True, False, 100)), r)
    assert seen > 100 and len(shown) > 10


def test_files_holding_different_numbers_of_reports_say_each_count_in_words(tmp_path,
                                                                            race_base):
    """One report against two (a file of one trace's report, a file of two): refused,
    "1 report" singular, the other count bare."""
    one = save(tmp_path, "a.json", race_base)
    two = save(tmp_path, "b.json", [race_base, race_base])
    message = refused(one, two)
    assert f"{one} holds 1 report, {two} holds 2: they are not reports of the same " \
           "traces" in message
