"""`kpool check` and `kpool validate` as CI runs them: the shipped traces pass (one
line per trace and engine), a hand-broken expectation fails with a readable
difference in every output format, each format read back by a real parser or
schema (junitparser and xml.etree for JUnit, the official SARIF 2.1.0 schema,
GitHub's documented workflow-command form), what an `expect` pins and what
`--ignore`, `--fail-on`, `--engine` and the settings file change."""

from __future__ import annotations

import json
import re
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import jsonschema
import pytest
from click.testing import CliRunner

from kpool_cli.check import DEFAULT_ENGINES, engines_for, pinned_codes
from kpool_cli.cli import cli
from kpool_cli.trace.load import load_trace, load_trace_text
from kpool_cli.verdict.codes import CODES

ROOT = Path(__file__).resolve().parent.parent
TRACES = ROOT / "traces"
RACE = TRACES / "shared-prefix-race.yaml"
SARIF_SCHEMA = Path(__file__).parent / "fixtures" / "sarif" / "sarif-schema-2.1.0.json"

GOOD_EXPECT = "- expect: {engine: cache-safe, findings: [KP001], n_new: 6}"
BAD_EXPECT = "- expect: {engine: cache-safe, findings: [], n_new: 5}"


def run(*args: str) -> tuple[int, str, str]:
    r = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    return r.exit_code, r.stdout, r.stderr


def line_of(path: Path, text: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line)


def race_decode_line(path: Path) -> int:
    """The line of the race trace's first decode of both slots (`- decode:` alone)."""
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1)
                if line.strip() == "- decode:")


@pytest.fixture
def broken(tmp_path: Path) -> Path:
    """A copy of the shared-prefix race whose cache-safe expectation is broken by hand:
    it says no finding and 5 pools where the replay raises KP001 and marks 6."""
    text = RACE.read_text()
    assert GOOD_EXPECT in text
    p = tmp_path / "broken.yaml"
    p.write_text(text.replace(GOOD_EXPECT, BAD_EXPECT))
    return p


# -- the shipped traces ----------------------------------------------------------------


def test_shipped_traces_pass_one_line_per_trace_and_engine():
    code, out, err = run("check", str(TRACES), "--no-config", "--jobs", "2")
    assert code == 0, out + err
    lines = out.splitlines()
    want = {(str(p), e) for p in sorted(TRACES.rglob("*.yaml"))
            for e in engines_for(load_trace(p))}
    block = lines.index("which versions show each finding:")
    got = set()
    for line in lines[:block]:
        m = re.fullmatch(r"PASS    (\S+) under (\S+): .*", line)
        assert m, line
        got.add((m[1], m[2]))
    assert got == want and block == len(want)
    assert lines[-1].startswith(f"checked {len(want)} runs of ")
    # the race of PR #29994: KP001 at the first decode after the seq_cp (op 3), twice,
    # under cache-safe; not under rep-once
    race = str(TRACES / "shared-prefix-race.yaml")
    assert (f"  {race}: KP001 scatter-race: cache-safe (x2, first at op 3); not rep-once"
            in lines[block + 1:-1])
    # the race trace passes under cache-safe because its expect pins KP001
    race = next(line for line in lines if f"{RACE} under cache-safe" in line)
    assert "pinned KP001" in race


# -- which engines, what is pinned -----------------------------------------------------


def _trace(*expects: str) -> str:
    ops = "".join(f"  - expect: {e}\n" for e in expects)
    return ("kpool_trace: 1\ncache: {kv_size: 16, kpool: 4}\nops:\n"
            "  - decode: {seq: 0, pos: 0..4}\n" + ops)


def test_engines_and_pins_follow_the_expectations():
    named = load_trace_text(_trace("{engine: rep-once, findings: [KP002]}"))
    assert engines_for(named) == ("rep-once",)
    mixed = load_trace_text(_trace("{engine: cache-safe, findings: [KP001]}",
                                   "{findings: [KP004]}"))
    assert engines_for(mixed) == DEFAULT_ENGINES
    assert engines_for(load_trace_text(_trace())) == DEFAULT_ENGINES  # no expect
    assert engines_for(named, ("cache-safe",)) == ("cache-safe",)
    assert pinned_codes(mixed, "cache-safe") == {"KP001", "KP004"}
    assert pinned_codes(mixed, "rep-once") == {"KP004"}


# -- a broken expectation, in every format ---------------------------------------------


def test_text_shows_expected_beside_actual(broken: Path):
    code, out, _ = run("check", str(broken), "--no-config")
    assert code == 1
    assert f"PASS    {broken} under rep-once" in out
    assert f"FAIL    {broken} under cache-safe: 1 of 1 expectations not met" in out
    at = line_of(broken, BAD_EXPECT)
    assert f"{broken}:{at}: expect (op 4) on op 3" in out
    table = [line.split() for line in out.splitlines()]
    assert ["what", "expected", "actual"] in table
    assert ["findings", "none", "KP001"] in table
    assert ["n_new", "5", "6"] in table
    # the race is no longer pinned under cache-safe: it fails at its decode's line
    assert f"{broken}:{race_decode_line(broken)}: KP001 scatter-race [error] not pinned" in out


def test_json_matches_its_schema_and_carries_the_difference(broken: Path):
    code, out, _ = run("check", str(broken), "--no-config", "--output-format", "json")
    assert code == 1
    doc = json.loads(out)
    _, schema, _ = run("schema", "check")
    jsonschema.validate(doc, json.loads(schema))
    by_engine = {r["engine"]: r for r in doc["results"]}
    assert by_engine["rep-once"]["status"] == "pass"
    bad = by_engine["cache-safe"]
    assert bad["status"] == "fail"
    (unmet,) = bad["unmet"]
    assert unmet["line"] == line_of(broken, BAD_EXPECT)
    assert [(d["what"], d["expected"], d["actual"]) for d in unmet["diffs"]] == [
        ("findings", "none", "KP001"), ("n_new", "5", "6")]
    assert doc["summary"] == {"traces": 1, "runs": 2, "passed": 1, "failed": 1,
                              "invalid": 0, "exit_code": 1}


def test_junit_is_read_by_junit_parsers(broken: Path):
    junitparser = pytest.importorskip("junitparser")
    code, out, _ = run("check", str(broken), "--no-config", "--output-format", "junit")
    assert code == 1
    root = ET.fromstring(out.encode())  # well-formed XML
    assert root.tag == "testsuites"
    xml = junitparser.JUnitXml.fromstring(out)
    cases = {c.name: c for suite in xml for c in suite}
    assert set(cases) == {"rep-once", "cache-safe"}
    assert all(c.classname == str(broken) for c in cases.values())
    assert cases["rep-once"].is_passed
    (failure,) = cases["cache-safe"].result
    assert isinstance(failure, junitparser.Failure)
    assert "1 of 1 expectations not met" in failure.message
    assert ["n_new", "5", "6"] in [line.split() for line in failure.text.splitlines()]
    assert xml.failures == 1 and xml.tests == 2


# GitHub's workflow command: `::LEVEL PROPS::MESSAGE`, properties `k=v` comma-separated,
# `,` `:` `%` CR LF escaped in values, `%` CR LF in the message
ANNOTATION = re.compile(r"::(error|warning|notice) ((?:\w+=[^,:\r\n]*)(?:,\w+=[^,:\r\n]*)*)"
                        r"::([^\r\n]*)")


def test_github_annotations_follow_the_documented_form(broken: Path):
    code, out, _ = run("check", str(broken), "--no-config", "--output-format", "github")
    assert code == 1
    parsed = []
    for line in out.splitlines():
        m = ANNOTATION.fullmatch(line)
        assert m, line
        props = dict(p.split("=", 1) for p in m[2].split(","))
        assert not re.search(r"%(?!25|0D|0A|3A|2C)", m[2] + m[3]), line
        parsed.append((m[1], props, m[3]))
    expect_line = str(line_of(broken, BAD_EXPECT))
    decode_line = str(race_decode_line(broken))
    assert [(lv, p["file"], p["line"]) for lv, p, _ in parsed][:2] == [
        ("error", str(broken), expect_line), ("error", str(broken), decode_line)]
    assert parsed[0][2] == "findings: expected none, actual KP001; n_new: expected 5, actual 6"
    assert "%3A" in parsed[0][1]["title"]  # the title's `:` escaped


def test_github_escapes_what_would_break_a_command():
    from kpool_cli.report.check_github import command

    line = command("error", "a,b:c.yaml", 3, "t: x, y", "50% done\nnext")
    assert line == "::error file=a%2Cb%3Ac.yaml,line=3,title=t%3A x%2C y::50%25 done%0Anext"


def test_sarif_validates_against_the_official_schema(broken: Path):
    code, out, _ = run("check", str(broken), "--no-config", "--output-format", "sarif")
    assert code == 1
    log = json.loads(out)
    schema = json.loads(SARIF_SCHEMA.read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    jsonschema.Draft7Validator(schema).validate(log)
    (run_,) = log["runs"]
    rules = run_["tool"]["driver"]["rules"]
    assert [r["id"] for r in rules][:len(CODES)] == list(CODES)
    assert all(r["fullDescription"]["text"] for r in rules)
    first = run_["results"][0]
    assert first["ruleId"] == "expect-unmet" and first["level"] == "error"
    region = first["locations"][0]["physicalLocation"]["region"]
    assert region == {"startLine": line_of(broken, BAD_EXPECT)}
    assert "expected none, actual KP001" in first["message"]["text"]
    kp001 = [r for r in run_["results"] if r["ruleId"] == "KP001"]
    assert kp001 and rules[kp001[0]["ruleIndex"]]["id"] == "KP001"


def test_sarif_schema_rejects_a_broken_log(broken: Path):
    """The schema is strict enough to catch a malformed log (the test above can fail)."""
    _, out, _ = run("check", str(broken), "--no-config", "--output-format", "sarif")
    log = json.loads(out)
    log["runs"][0]["results"][0]["level"] = "fatal"
    schema = json.loads(SARIF_SCHEMA.read_text())
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft7Validator(schema).validate(log)


# -- what fails, what does not ---------------------------------------------------------


@pytest.fixture
def unpinned(tmp_path: Path) -> Path:
    """The race trace without its cache-safe expectation: under cache-safe (asked
    with --engine) KP001 is raised and nothing pins it."""
    p = tmp_path / "unpinned.yaml"
    p.write_text(RACE.read_text().replace(f"  {GOOD_EXPECT}\n", ""))
    assert engines_for(load_trace(p)) == ("rep-once",)
    return p


def test_an_unpinned_finding_fails_unless_ignored_or_below_fail_on(unpinned: Path):
    base = ("check", str(unpinned), "--no-config", "--engine", "cache-safe")
    code, out, _ = run(*base)
    assert code == 1 and "unpinned finding" in out
    code, out, _ = run(*base, "--ignore", "KP001")
    assert code == 0 and "ignored KP001 x2" in out and "not pinned" not in out
    code, out, _ = run(*base, "--fail-on", "never")
    assert code == 0 and "2 findings below --fail-on" in out
    code, _, err = run(*base, "--ignore", "KP999")
    assert code == 2 and "unknown finding code 'KP999'" in err


def test_an_ignored_code_is_not_listed_by_version():
    """docs/configuration.md: an ignored code "neither fails the check nor is listed".
    The race trace is checked under cache-safe and rep-once (its expects name both);
    KP001, raised twice under cache-safe, was still listed under "which versions show
    each finding" (and in the JSON's `versions`) when ignored."""
    code, out, _ = run("check", str(RACE), "--no-config")
    assert code == 0 and f"  {RACE}: KP001 scatter-race: cache-safe (x2" in out
    code, out, _ = run("check", str(RACE), "--no-config", "--ignore", "KP001")
    assert code == 0 and "ignored KP001 x2" in out
    assert "KP001 scatter-race" not in out and "which versions" not in out
    code, out, _ = run("check", str(RACE), "--no-config", "--ignore", "KP001",
                       "--output-format", "json")
    assert code == 0 and json.loads(out)["versions"] == []


def test_jobs_give_the_same_output(broken: Path):
    args = ("check", str(broken), str(RACE), "--no-config", "--backend", "numpy")
    assert run(*args, "-j", "1") == run(*args, "-j", "3")


def test_an_invalid_trace_is_exit_2_with_its_problems(tmp_path: Path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("kpool_trace: 1\ncache: {kv_size: 0, kpool: 4}\nops: []\n")
    code, out, _ = run("check", str(bad), str(RACE), "--no-config")
    assert code == 2
    assert f"INVALID {bad}: invalid trace" in out
    assert f"{bad}:2:" in out and "kv_size" in out


def test_an_empty_folder_is_an_error(tmp_path: Path):
    code, _, err = run("check", str(tmp_path), "--no-config")
    assert code == 2 and "no traces" in err


# -- validate --------------------------------------------------------------------------


def test_validate_lists_every_problem_of_every_file(tmp_path: Path):
    shutil.copy(RACE, tmp_path / "good.yaml")
    sub = tmp_path / "sub"
    sub.mkdir()
    (sub / "bad.yaml").write_text(
        "kpool_trace: 1\ncache: {kv_size: 0, kpool: 4}\n"
        "ops:\n  - decode: {seq: -3, pos: 0}\n")
    code, out, _ = run("validate", str(tmp_path))
    assert code == 2
    assert f"ok      {tmp_path / 'good.yaml'}" in out
    assert f"INVALID {sub / 'bad.yaml'}" in out
    problems = [line for line in out.splitlines() if line.startswith(f"  {sub / 'bad.yaml'}:")]
    assert len(problems) == 2, out  # kv_size and seq, both
    assert out.splitlines()[-1] == "validated 2 traces: 1 valid, 1 invalid"
    code, out, _ = run("validate", str(tmp_path / "good.yaml"))
    assert code == 0


# -- settings --------------------------------------------------------------------------


def test_settings_take_effect_and_the_command_line_beats_them(
        unpinned: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    (tmp_path / "pyproject.toml").write_text(
        '[tool.kpool]\nengines = ["cache-safe"]\noutput-format = "github"\n'
        'ignore = ["KP001"]\n')
    monkeypatch.chdir(tmp_path)
    code, out, _ = run("check", str(unpinned))
    assert code == 0 and out == ""  # cache-safe only, KP001 ignored: no annotation
    code, out, _ = run("check", str(unpinned), "--output-format", "text")
    assert code == 0 and out.startswith(f"PASS    {unpinned} under cache-safe")
    code, out, _ = run("check", str(unpinned), "--engine", "rep-once", "--output-format",
                       "text")
    assert code == 0 and " under cache-safe" not in out
    code, out, _ = run("check", str(unpinned), "--no-config")
    assert code == 0 and out.startswith(f"PASS    {unpinned} under rep-once")
    (tmp_path / "pyproject.toml").write_text("[tool.kpool]\nfail_on = 'x'\n")
    code, _, err = run("check", str(unpinned))
    assert code == 2 and "pyproject.toml:2" in err


def test_replay_writes_its_findings_for_ci_with_nothing_pinned():
    """`kpool replay --format github|sarif|junit`: the race trace under cache-safe has
    KP001 at both decodes after the copy. Its `expect` pins KP001 for `kpool check`
    (exit 0 there), but a replay pins nothing: exit 1, two annotations at the decodes'
    lines, two SARIF results valid against the schema, one failing JUnit case."""
    assert run("check", str(RACE), "--engine", "cache-safe")[0] == 0
    code, out, _ = run("replay", str(RACE), "--engine", "cache-safe", "--format", "github")
    assert code == 1
    lines = [ANNOTATION.fullmatch(x) for x in out.splitlines()]
    assert all(lines) and len(lines) == 2
    assert "not pinned" not in out  # nothing is pinned in a replay: no such wording
    decodes = [i + 1 for i, x in enumerate(RACE.read_text().splitlines())
               if x.strip().startswith("- decode:")]
    assert [int(re.search(r"line=(\d+)", x).group(1)) for x in out.splitlines()] == decodes[-2:]
    code, out, _ = run("replay", str(RACE), "--engine", "cache-safe", "--format", "sarif")
    log = json.loads(out)
    jsonschema.validate(log, json.loads(SARIF_SCHEMA.read_text()))
    assert [r["ruleId"] for r in log["runs"][0]["results"]] == ["KP001", "KP001"]
    code, out, _ = run("replay", str(RACE), "--engine", "rep-once", "--format", "junit")
    assert code == 0 and 'failures="0"' in out


def test_junit_names_its_suite_and_failure_type_for_the_command_that_ran(broken: Path):
    """`kpool replay --format junit` wrote a suite named `kpool check` and failures
    of type `kpool.check.fail`: it is named for the command that ran. The race under
    cache-safe fails the replay (KP001, nothing pinned) and the broken trace fails
    the check (its expect)."""
    def suite_and_types(out: str) -> tuple[list[str], list[str]]:
        root = ET.fromstring(out.encode())
        return ([s.get("name", "") for s in root.iter("testsuite")],
                [f.get("type", "") for f in root.iter("failure")])

    code, out, _ = run("replay", str(RACE), "--engine", "cache-safe", "--format", "junit")
    assert code == 1
    assert suite_and_types(out) == (["kpool replay"], ["kpool.replay.fail"])
    code, out, _ = run("check", str(broken), "--no-config", "--output-format", "junit")
    assert code == 1
    assert suite_and_types(out) == (["kpool check"], ["kpool.check.fail"])


PLUG_IN = ("from dataclasses import replace\n"
           "from kpool_cli.versions import CACHE_SAFE\n"
           "Mine = replace(CACHE_SAFE, name='my-cache-safe')\n")


def test_check_names_a_plug_in_by_its_name_as_replay_does(tmp_path: Path, monkeypatch):
    """`kpool check --engine MODULE:Name` named the version by its spec in every
    format (`under kpool_h82_named:Mine`) where replay, diff and fuzz say its name:
    one name everywhere now. The plug-in is cache-safe renamed; the race trace's
    expects all name a shipped engine, so under it nothing is pinned: KP001 twice
    (the decodes of ops 3 and 6), exit 1. A composition given with spaces is named
    as its version is too (`rep-once+noop-seq-rm`)."""
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "kpool_h82_named.py").write_text(PLUG_IN)
    spec = "kpool_h82_named:Mine"
    outs = {}
    for fmt in ("text", "json", "github", "sarif"):
        code, outs[fmt], err = run("check", str(RACE), "--no-config", "--engine", spec,
                                   "--engine", "cache-safe", "--output-format", fmt)
        assert code == 1, err
        assert spec not in outs[fmt], fmt
    assert f"FAIL    {RACE} under my-cache-safe: " in outs["text"]
    assert (f"  {RACE}: KP001 scatter-race: my-cache-safe (x2, first at op 3), cache-safe "
            "(x2, first at op 3)") in outs["text"]
    doc = json.loads(outs["json"])
    assert [r["engine"] for r in doc["results"]] == ["my-cache-safe", "cache-safe"]
    assert [b["engine"] for v in doc["versions"] for b in v["by"]] == [
        "my-cache-safe", "cache-safe"]
    assert outs["github"].count("title=kpool under my-cache-safe%3A KP001") == 2
    results = json.loads(outs["sarif"])["runs"][0]["results"]
    assert [r["properties"]["engine"] for r in results] == ["my-cache-safe"] * 2
    assert all("(under my-cache-safe)" in r["message"]["text"] for r in results)
    code, out, _ = run("replay", str(RACE), "--engine", spec, "--format", "json")
    assert code == 1 and json.loads(out)["engine"] == "my-cache-safe"
    code, out, _ = run("check", str(RACE), "--no-config", "--engine", " rep-once + noop-seq-rm")
    assert code == 0 and f"PASS    {RACE} under rep-once+noop-seq-rm: " in out
    for args in (("check", "--no-config", "--output-format", "junit"),
                 ("replay", "--format", "junit")):
        code, out, _ = run(args[0], str(RACE), "--engine", spec, *args[1:])
        assert code == 1
        cases = ET.fromstring(out.encode()).iter("testcase")
        assert [c.get("name") for c in cases] == ["my-cache-safe"], args


def test_a_count_reads_the_same_in_every_line_of_the_text_and_bare_in_junit(
        tmp_path: Path):
    """10,001 refused seq_rm (KP008: a rollback of 6 tokens with n_rs_seq 0), pinned
    by an expect: the result's line said `pinned KP008 x10001` above `(x10,001, first
    at op 1)` in the table of versions; both are `wording.count`'s now, and JUnit's
    headline (the same words) stays bare."""
    from kpool_cli.check import CheckResult
    from kpool_cli.report.check_text import headline

    t = tmp_path / "refused.yaml"
    t.write_text("kpool_trace: 1\ncache: {kv_size: 16, kpool: 4}\nops:\n"
                 "  - decode: {seq: 0, pos: 0..8}\n"
                 + "  - seq_rm: {seq: 0, p0: 2, p1: -1}\n" * 10_001
                 + "  - expect: {findings: [KP008]}\n")
    code, out, _ = run("check", "--no-config", str(t))
    assert code == 0, out
    for engine in DEFAULT_ENGINES:
        assert (f"PASS    {t} under {engine}: 1 expectation held, pinned KP008 x10,001\n"
                in out), out
        assert f"{engine} (x10,001, first at op 1)" in out
    r = CheckResult(str(t), "rep-once", "fail", expect_passed=12_000, expect_failed=10_000,
                    n_failing=10_500, pinned={"KP008": 10_001})
    assert headline(r) == ("10,000 of 22,000 expectations not met, 10,500 unpinned "
                           "findings at or above --fail-on error, pinned KP008 x10,001")
    assert headline(r, str) == ("10000 of 22000 expectations not met, 10500 unpinned "
                                "findings at or above --fail-on error, pinned KP008 x10001")


def test_a_count_of_one_takes_the_singular_in_every_clause() -> None:
    """`wording.counted`: one expectation, one unpinned finding, one finding below
    --fail-on, one more unpinned finding left out of the list (it read `1 more unpinned
    findings`), and two of each in the plural."""
    from kpool_cli.check import CheckResult
    from kpool_cli.report.check_text import details, headline

    one = CheckResult("t.yaml", "rep-once", "fail", expect_passed=1, n_failing=1, n_below=1)
    assert headline(one) == ("1 expectation held, 1 unpinned finding at or above "
                             "--fail-on error, 1 finding below --fail-on")
    assert details(one)[-1] == "  ... and 1 more unpinned finding at or above --fail-on"
    two = CheckResult("t.yaml", "rep-once", "fail", expect_passed=2, n_failing=2, n_below=2)
    assert headline(two) == ("2 expectations held, 2 unpinned findings at or above "
                             "--fail-on error, 2 findings below --fail-on")
    assert details(two)[-1] == "  ... and 2 more unpinned findings at or above --fail-on"


def test_an_invalid_traces_problem_is_placed_at_its_line_and_column(tmp_path: Path):
    """A problem of an invalid trace carries its column (`bad.yaml:5:29`), which the
    text shows; GitHub's annotation (`col=`) and SARIF's region (`startColumn`) left
    it out. Counted by hand: line 5 is `  - seq_rm: {seq: 0, p0: 1, p9: 2}`, whose key
    `p9` follows `  - seq_rm: {` (13 characters), `seq: 0, ` (8) and `p0: 1, ` (7):
    column 29 (1-based)."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("kpool_trace: 1\ncache: {kv_size: 64, kpool: 4}\nops:\n"
                   "  - decode: {seq: 0, pos: 0..4}\n  - seq_rm: {seq: 0, p0: 1, p9: 2}\n")
    code, out, _ = run("check", str(bad), "--no-config", "--output-format", "github")
    assert code == 2
    m = ANNOTATION.fullmatch(out.splitlines()[0])
    assert m and m[1] == "error", out
    props = dict(p.split("=", 1) for p in m[2].split(","))
    assert (props["line"], props["col"]) == ("5", "29")
    code, out, _ = run("check", str(bad), "--no-config", "--output-format", "sarif")
    assert code == 2
    (result,) = json.loads(out)["runs"][0]["results"]
    assert result["ruleId"] == "invalid-trace"
    assert result["locations"][0]["physicalLocation"]["region"] == {"startLine": 5,
                                                                    "startColumn": 29}
    jsonschema.validate(json.loads(out), json.loads(SARIF_SCHEMA.read_text()))


def test_a_rep_conflict_on_two_rows_says_one_more_row() -> None:
    """KP002's message read `(+1 more rows)` for two conflicting rows: its count takes
    `wording.counted` as every other count and its noun does (bare, as the message's
    other numbers)."""
    from kpool_cli.verdict.rules.kp002_rep_conflict import finding

    pools = ((0, 1), (1, 1))
    two = finding({3: pools, 7: pools}).message
    assert two.endswith("row 3 is the rep of pools 0:1 1:1 (+1 more row)"), two
    three = finding({3: pools, 7: pools, 11: pools}).message
    assert three.endswith("(+2 more rows)"), three
    assert finding({3: pools}).message.endswith("pools 0:1 1:1"), finding({3: pools}).message
