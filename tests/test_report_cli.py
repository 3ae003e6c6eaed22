"""`kpool replay` as CI uses it: the JSON report (TRACE_FORMAT.md "Report"), exit
codes, located errors for bad traces, atomic --output, plug-in engine versions."""

from __future__ import annotations

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
from kpool_cli.trace.schema import report_schema

ROOT = Path(__file__).resolve().parent.parent
TRACES = sorted((ROOT / "traces").glob("*.yaml"))
RACE = ROOT / "traces" / "shared-prefix-race.yaml"


def run(*args: str) -> tuple[int, str, str]:
    r = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    return r.exit_code, r.stdout, r.stderr


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
    code, out, _ = run("replay", str(RACE), str(ROOT / "traces" / "prefill-decode.yaml"),
                       "--format", "json", "--engine", "cache-safe", "--backend", "none")
    reps = json.loads(out)
    assert [r["trace"]["name"] for r in reps] == ["shared-prefix-race", "prefill-decode"]
    assert code == 1


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
    """Issue 2 point 4: `--engine package.module:Name`; here a rep-once that forgets to
    mark once per rep brings the race back."""
    (tmp_path / "myengine.py").write_text(textwrap.dedent("""\
        from dataclasses import replace
        from kpool_cli.engine.versions import CACHE_SAFE
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
    for which in ("trace", "report"):
        code, out, _ = run("schema", which)
        assert code == 0
        jsonschema.Draft202012Validator.check_schema(json.loads(out))
