"""Each format is declared once (trace.format, report.format) and what derives from
the declaration agrees with it: the loader's keys, bounds and defaults, the writer's
key order and omissions, the JSON Schemas (property names, bounds, defaults), the
model's defaults, the report writer's keys and the diff reader's key lists."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from click.testing import CliRunner

from kpool_cli.cli import cli
from kpool_cli.contracts import report_format as rf
from kpool_cli.contracts.report_format import report_schema
from kpool_cli.diff import reports as diff_reports
from kpool_cli.trace import format as tf
from kpool_cli.trace.load import Problem, TraceError, load_trace_text
from kpool_cli.trace.model import OP_TYPES, CacheConfig, Trace
from kpool_cli.trace.schema import trace_schema
from kpool_cli.trace.write import dump_trace

ROOT = Path(__file__).resolve().parent.parent
HEAD = "kpool_trace: 1\ncache: {kv_size: 64, kpool: 4, n_seq_max: 4, by_order: true}\nops:\n"
BEFORE = "  - decode: {seq: 0, pos: 0..4}\n  - state_write: {seq: 0, slot: a}\n"

# A value of each declared type other than its field's default (trace.format's types;
# the cache above has n_seq_max 4 and kv_size 64, the slot `a` is written by BEFORE).
SAMPLE: dict[str, Any] = {
    "seq": 2, "seq_or_all": -1, "bound": 3, "slot": "a", "findings": ("KP001", "KP004"),
    "pools": ((1, 2), (0, 0)), "status": "rejected", "engine": "rep-once",
}


def sample(f: tf.Field) -> Any:
    """A valid value for field `f`, not its default: a type's sample, or for an int
    the bound nearest its default that is not the default."""
    if f.type.name != "int":
        return SAMPLE[f.type.name]
    v = f.hi if f.default != f.hi else f.lo
    return min(v, 2**31 - 1)  # shift, d, ...: a count the engine takes


def problems(text: str) -> list[Problem]:
    with pytest.raises(TraceError) as info:
        load_trace_text(text, "t.yaml")
    return info.value.problems


MAPPING_OPS = [s for s in tf.OPS.values() if s.body == "mapping" and s.name != "decode"]


# --- trace: writer and loader against the declaration -----------------------------------


@pytest.mark.parametrize("op", MAPPING_OPS, ids=lambda s: s.name)
def test_every_declared_field_of_an_op_round_trips(op: tf.Section) -> None:
    """Each field set to a value other than its default is written under its declared
    name, in the declared order, and read back as the same op; with every optional
    field at its default, only the required ones are written."""
    cfg = CacheConfig(64, 4, n_seq_max=4, by_order=True)
    prelude = load_trace_text(HEAD + BEFORE).ops
    full = OP_TYPES[op.name](**{f.name: sample(f) for f in op.fields})
    bare = OP_TYPES[op.name](**{f.name: sample(f) for f in op.fields if f.required})
    for o, keys in ((full, op.names), (bare, op.required)):
        t = Trace(cfg, (*prelude, o))
        text = dump_trace(t)
        written = yaml.safe_load(text)["ops"][-1][op.name]
        assert tuple(written or ()) == keys
        assert load_trace_text(text).ops == t.ops


def test_every_declared_field_of_the_cache_and_a_token_round_trips() -> None:
    cfg = CacheConfig(**{f.name: sample(f) if f.type.name == "int" else not f.default
                         for f in tf.CACHE.fields})
    assert tuple(cfg.as_dict()) == tf.CACHE.names
    text = dump_trace(Trace(dataclasses.replace(cfg, kv_size=64, kpool=4, by_order=True), ()))
    assert tuple(yaml.safe_load(text)["cache"]) == tf.CACHE.names
    tok = "{pos: 7, seq: [1, 0], ext: [2, 3], cell: 5}"
    t = load_trace_text(HEAD + f"  - decode: {{tokens: [{tok}]}}\n")
    (written,) = yaml.safe_load(dump_trace(t))["ops"][0]["decode"]["tokens"]
    assert tuple(written) == tf.TOKEN.names
    assert load_trace_text(dump_trace(t)).ops == t.ops


def test_the_top_level_is_written_in_the_declared_order() -> None:
    t = Trace(CacheConfig(4, 2), (), name="n", description="d", engine="rep-once", seed=3)
    assert tuple(yaml.safe_load(dump_trace(t))) == tf.TOP.names
    # name, description and engine at their defaults are left out; seed never is
    bare = yaml.safe_load(dump_trace(Trace(CacheConfig(4, 2), ())))
    assert tuple(bare) == ("kpool_trace", "cache", "seed", "ops")


def test_the_model_defaults_are_the_declared_ones() -> None:
    for f in tf.CACHE.fields:
        if not f.required:
            assert getattr(CacheConfig(1, 1), f.name) == f.default, f.name
    for op in MAPPING_OPS:
        fields = {f.name: f for f in dataclasses.fields(OP_TYPES[op.name])}
        assert tuple(n for n in fields if n != "loc") == op.names
        for f in op.fields:
            if not f.required:
                assert fields[f.name].default == f.default, (op.name, f.name)


def _int_fields() -> list[tuple[str, tf.Field]]:
    out = [("cache", f) for f in tf.CACHE.fields if f.type.name == "int"]
    out += [(op.name, f) for op in MAPPING_OPS for f in op.fields if f.type.name == "int"]
    return [*out, ("", tf.TOP["seed"])]


def _trace_with(where: str, name: str, value: int) -> str:
    """A valid trace but for `where`.`name`, set to `value`."""
    if where == "cache":
        cache = {"kv_size": 64, "kpool": 4, name: value}
        if name == "kv_size":
            cache["kpool"] = 1
        if name == "kpool":  # kpool <= kv_size: the cache's bound, not the static one
            cache["kv_size"] = max(1, min(value, tf.KV_SIZE_MAX))
        return "kpool_trace: 1\ncache: " + json.dumps(cache) + "\nops: [clear: {}]\n"
    if where == "":
        return HEAD.replace("ops:", f"{name}: {value}\nops:") + "  - clear: {}\n"
    op = tf.OPS[where]
    args = {f.name: sample(f) for f in op.fields if f.required}
    args[name] = value
    args = {k: list(v) if isinstance(v, tuple) else v for k, v in args.items()}
    return HEAD + BEFORE + f"  - {where}: {json.dumps(args)}\n"


@pytest.mark.parametrize(("where", "f"), _int_fields(), ids=lambda x: getattr(x, "name", x))
def test_the_loader_checks_the_declared_bounds(where: str, f: tf.Field) -> None:
    """Both declared bounds of every int field are accepted, one past them refused."""
    for v in (f.lo, f.hi):
        if v is not None:
            load_trace_text(_trace_with(where, f.name, v))
    for v in (None if f.lo is None else f.lo - 1, None if f.hi is None else f.hi + 1):
        if v is not None:
            (p,) = problems(_trace_with(where, f.name, v))
            assert p.field.endswith(f.name) and p.message.startswith("out of range"), str(p)


@pytest.mark.parametrize("op", MAPPING_OPS, ids=lambda s: s.name)
def test_the_loader_knows_the_declared_keys_and_no_other(op: tf.Section) -> None:
    args = {f.name: sample(f) for f in op.fields if f.required}
    args = {k: list(v) if isinstance(v, tuple) else v for k, v in args.items()}
    (p,) = problems(HEAD + BEFORE + f"  - {op.name}: {json.dumps({**args, 'zz': 1})}\n")
    assert (p.field, p.message) == (f"ops[2].{op.name}.zz",
                                    f"unknown key 'zz'; known keys: {', '.join(op.names)}")
    for name in op.required:
        text = json.dumps({k: v for k, v in args.items() if k != name})
        (p,) = problems(HEAD + BEFORE + f"  - {op.name}: {text}\n")
        assert (p.field, p.message) == (f"ops[2].{op.name}.{name}", "required key missing")


def test_the_loader_fills_in_the_declared_defaults() -> None:
    t = load_trace_text("kpool_trace: 1\ncache: {kv_size: 8, kpool: 2}\nops: [seq_rm: {seq: 0}]")
    # an unset field (n_batch: None) is left out of the written block
    assert t.cache.as_dict() == {"kv_size": 8, "kpool": 2, **{
        k: v for k, v in tf.CACHE.defaults.items() if v is not None}}
    assert t.cache.n_batch is tf.CACHE["n_batch"].default is None
    assert (t.name, t.description, t.engine, t.seed) == tuple(
        tf.TOP[k].default for k in ("name", "description", "engine", "seed"))
    (op,) = t.ops
    assert (op.p0, op.p1) == (tf.OPS["seq_rm"]["p0"].default, tf.OPS["seq_rm"]["p1"].default)


# --- trace: the schema against the declaration -------------------------------------------


def _resolve(schema: dict, node: dict) -> dict:
    while "$ref" in node:
        node = schema["$defs"][node["$ref"].rsplit("/", 1)[1]]
    return node


def _check_section(schema: dict, node: dict, section: tf.Section) -> None:
    """Properties, required keys, int bounds and defaults of `node` are the section's."""
    props = node["properties"]
    assert tuple(props) == section.names
    assert tuple(node.get("required", ())) == section.required
    assert node["additionalProperties"] is False
    for f in section.fields:
        p = props[f.name]
        assert p["description"] == f.doc
        if f.default is not tf.NO_DEFAULT and f.default is not None:
            assert p["default"] == f.default
        target = _resolve(schema, p)
        if target.get("type") == "integer":
            assert (target.get("minimum"), target.get("maximum")) == (f.lo, f.hi), f.name


def test_the_trace_schema_is_the_declaration() -> None:
    s = trace_schema()
    _check_section(s, s, tf.TOP)
    _check_section(s, s["properties"]["cache"], tf.CACHE)
    _check_section(s, s["$defs"]["token"], tf.TOKEN)
    for form, node in zip(tf.DECODE_FORMS, s["$defs"]["decode"]["oneOf"], strict=True):
        _check_section(s, node, form)
    ops = s["properties"]["ops"]["items"]["oneOf"]
    assert [next(iter(o["properties"])) for o in ops] == list(tf.OPS)
    for o in ops:
        (name,) = o["properties"]
        assert o["description"] == tf.OPS[name].doc
        if tf.OPS[name].body == "mapping" and name != "decode":
            _check_section(s, o["properties"][name], tf.OPS[name])
    # the types' bounds: a seq id's, a position's, a cell's
    for d, t in (("seq", tf.SEQ), ("seqOrAll", tf.SEQ_OR_ALL), ("pos", tf.POS),
                 ("cell", tf.CELL)):
        assert (s["$defs"][d]["minimum"], s["$defs"][d]["maximum"]) == (t.lo, t.hi)


# --- the report ---------------------------------------------------------------------------


def _check_record(node: dict, record: rf.Record) -> None:
    assert tuple(node["properties"]) == record.names
    assert tuple(node.get("required", ())) == record.required
    assert node["additionalProperties"] is True  # open: fields may be added


def test_the_report_schema_is_the_declaration() -> None:
    s = report_schema()
    jsonschema.Draft202012Validator.check_schema(s)
    assert s["oneOf"] == [{"$ref": "#/$defs/report"},
                          {"type": "array", "items": {"$ref": "#/$defs/report"}, "minItems": 2}]
    _check_record(s["$defs"]["report"], rf.REPORT)
    p = s["$defs"]["report"]["properties"]
    for name, rec in (("tool", rf.TOOL), ("trace", rf.TRACE), ("config", rf.CONFIG),
                      ("summary", rf.SUMMARY)):
        _check_record(p[name], rec)
    _check_record(p["events"]["items"], rf.EVENT)
    _check_record(p["expectations"]["items"], rf.EXPECTATION)
    _check_record(p["problems"]["items"], rf.PROBLEM)
    u = p["ubatches"]["items"]
    _check_record(u, rf.UBATCH)
    _check_record(u["properties"]["tokens"]["items"], rf.TOKEN)
    _check_record(u["properties"]["cost"], rf.COST)
    for node, rec in zip(u["properties"]["pools"]["items"]["oneOf"], (rf.POOL, rf.POOL_RUN),
                         strict=True):
        _check_record(node, rec)
    for node, rec in zip(u["properties"]["scatter"]["items"]["oneOf"],
                         (rf.SCATTER, rf.SCATTER_RUN), strict=True):
        _check_record(node, rec)
    _check_record(s["$defs"]["finding"], rf.FINDING)
    assert report_schema() == s and report_schema() is not s


def test_the_report_config_is_the_trace_cache_block() -> None:
    assert rf.CONFIG.names == tf.CACHE.names
    for f in rf.CONFIG.fields:
        c = tf.CACHE[f.name]
        if c.type.name == "int":
            assert f.schema["minimum"] == c.lo and "maximum" not in f.schema
    # n_rs_seq and n_batch came later: optional
    assert rf.CONFIG.required == tuple(n for n in tf.CACHE.names
                                       if n not in ("n_batch", "n_rs_seq"))


def _keys_in_order(obj: dict, record: rf.Record) -> None:
    """`obj`'s keys: declared ones, in the declared order, the required ones there."""
    keys = tuple(obj)
    assert keys == tuple(n for n in record.names if n in obj), (record.name, keys)
    assert set(record.required) <= set(keys), (record.name, keys)


def _replay(*args: str) -> dict:
    r = CliRunner().invoke(cli, ["replay", *args, "--format", "json"])
    assert r.exit_code in (0, 1), r.stderr
    return json.loads(r.stdout)


@pytest.mark.parametrize("trace", ["shared-prefix-race", "mrope-images", "rejected-decodes"])
def test_the_report_writer_writes_the_declared_records(trace: str) -> None:
    """Every record of a real report has the declared keys in the declared order."""
    for pools in ("marked", "all"):
        doc = _replay(str(ROOT / "traces" / f"{trace}.yaml"), "--engine", "cache-safe",
                      "--pools", pools)
        _keys_in_order(doc, rf.REPORT)
        for name, rec in (("tool", rf.TOOL), ("trace", rf.TRACE), ("config", rf.CONFIG),
                          ("summary", rf.SUMMARY)):
            _keys_in_order(doc[name], rec)
        findings = [f for e in doc["events"] for f in e.get("findings", ())]
        for e in doc["events"]:
            _keys_in_order(e, rf.EVENT)
        for x in doc["expectations"]:
            _keys_in_order(x, rf.EXPECTATION)
        for u in doc["ubatches"]:
            _keys_in_order(u, rf.UBATCH)
            _keys_in_order(u["cost"], rf.COST)
            for t in u["tokens"]:
                _keys_in_order(t, rf.TOKEN)
            for p in u["pools"]:
                _keys_in_order(p, rf.POOL_RUN if isinstance(p["k"], list) else rf.POOL)
            for e in u["scatter"]:
                _keys_in_order(e, rf.SCATTER if "rep" in e else rf.SCATTER_RUN)
            findings += u["findings"]
        for f in findings:
            _keys_in_order(f, rf.FINDING)
            for t in f.get("tokens", ()):
                _keys_in_order(t, rf.FINDING_TOKEN)


def test_a_record_refuses_a_name_it_does_not_declare() -> None:
    """`Record.make`: fields given out of order are put in the declared order (and
    given in order, kept so); a name it does not declare is refused."""
    for made in (rf.EXPECTATION.make(message="m", op=1, ok=True),
                 rf.EXPECTATION.make(op=1, ok=True, message="m")):
        assert list(made.items()) == [("op", 1), ("ok", True), ("message", "m")]
    with pytest.raises(ValueError, match="expectation declares no field okay"):
        rf.EXPECTATION.make(op=1, okay=True)


def test_the_diff_reader_requires_the_declared_cost_counters(tmp_path: Path) -> None:
    assert rf.COST.names == diff_reports.COST_KEYS
    doc = _replay(str(ROOT / "traces" / "partial-copy.yaml"), "--backend", "none")
    config = dict(diff_reports.from_report(doc, "r.json").config)
    # every declared field but an unset n_batch (None: the trace records none)
    assert tuple(config) == tuple(n for n in rf.CONFIG.names if n != "n_batch")
    for key in rf.COST.names:
        bad = json.loads(json.dumps(doc))
        del bad["ubatches"][0]["cost"][key]
        with pytest.raises(diff_reports.ReportError) as info:
            diff_reports.from_report(bad, "r.json")
        assert str(info.value) == f"r.json: report.ubatches[0].cost.{key}: missing field"
    # n_rs_seq came after v1's first release: a report without it reads as 0
    del doc["config"]["n_rs_seq"]
    assert dict(diff_reports.from_report(doc, "r.json").config)["n_rs_seq"] == 0


# --- kpool diff --format json ---------------------------------------------------------------


def _closed(node: Any) -> Any:
    """`node` with every object of declared properties closed: a document it accepts
    holds no key the declaration does not name (an object that declares what else it
    holds, a schema for its other keys, keeps that)."""
    if isinstance(node, list):
        return [_closed(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: _closed(v) for k, v in node.items()}
    if "properties" in out and out.get("additionalProperties", True) is True:
        out["additionalProperties"] = False
    return out


def _diff(*args: str) -> dict:
    r = CliRunner().invoke(cli, ["diff", *args, "--format", "json"])
    assert r.exit_code in (0, 1), r.stderr
    return json.loads(r.stdout)


def test_the_diff_schema_is_the_declaration() -> None:
    s = rf.diff_schema()
    jsonschema.Draft202012Validator.check_schema(s)
    assert s["title"] == "kpool diff, format v1"
    _check_record(s, rf.DIFF)
    t = s["properties"]["traces"]["items"]
    _check_record(t, rf.DIFF_TRACE)
    _check_record(t["properties"]["parted"]["oneOf"][0], rf.DIFF_PARTED)
    ubatch, event = t["properties"]["differences"]["items"]["oneOf"]
    _check_record(ubatch, rf.DIFF_UBATCH)
    _check_record(event, rf.DIFF_EVENT)
    _check_record(s["properties"]["summary"], rf.DIFF_SUMMARY)
    # the comparison's words are the format's: what differs, and the verdicts
    assert ubatch["properties"]["differs"]["items"]["enum"] == list(rf.DIFF_UBATCH_FIELDS)
    assert set(rf.DIFF_EVENT_FIELDS) < set(rf.DIFF_UBATCH_FIELDS)
    assert (s["properties"]["summary"]["properties"]["verdict"]["enum"]
            == ["regression", "changed", "no differences"])
    assert rf.diff_schema() == s and rf.diff_schema() is not s


def test_the_diff_writer_writes_what_the_schema_declares_and_nothing_else(
        tmp_path: Path) -> None:
    """Real diffs holding every kind of entry: ubatches and events that differ, a
    parting (partial-copy: cache-safe rejects the partial seq_cp rep-once applies),
    regressions and fixes, fields differing by design (the no-op seq_rm patch), codes
    not compared (reports of two backends). Each validates against the schema with
    every declared object closed, so the writer writes no key the declaration lacks."""
    traces = ROOT / "traces"
    a = tmp_path / "a.json"
    a.write_text(json.dumps(_replay(str(traces / "shared-prefix-race.yaml"),
                                    "--engine", "cache-safe")))
    b = tmp_path / "b.json"
    b.write_text(json.dumps(_replay(str(traces / "shared-prefix-race.yaml"),
                                    "--engine", "rep-once", "--backend", "none")))
    docs = [
        _diff(str(traces / "partial-copy.yaml"), str(traces / "shared-prefix-race.yaml"),
              "--base", "rep-once", "--head", "cache-safe"),
        _diff(str(traces / "found" / "noop-seq-rm-keeps-a-drift.yaml"),
              "--base", "rep-once", "--head", "rep-once+noop-seq-rm"),
        _diff(str(a), str(b)),
    ]
    seen: set[str] = set()
    validator = jsonschema.Draft202012Validator(_closed(rf.diff_schema()))
    for doc in docs:
        validator.validate(doc)
        _keys_in_order(doc, rf.DIFF)
        for t in doc["traces"]:
            _keys_in_order(t, rf.DIFF_TRACE)
            seen |= {e["type"] for e in t["differences"]}
            seen |= {k for k in ("parted", "by_design", "not_compared") if t[k]}
        seen |= {"regressions"} if doc["summary"]["regressions"] else set()
    assert seen == {"ubatch", "event", "parted", "by_design", "not_compared",
                    "regressions"}
    # and the closed schema can fail: a key it does not declare, a verdict it does not
    # know, a required field missing
    doc = docs[0]
    for broken in ({**doc, "extra": 1},
                   {**doc, "summary": {**doc["summary"], "verdict": "worse"}},
                   {k: v for k, v in doc.items() if k != "summary"}):
        assert not validator.is_valid(broken)


def test_the_diff_of_reports_with_a_later_versions_cost_counter_is_declared(
        tmp_path: Path) -> None:
    """The diff's reader takes a report's cost counters a later kpool adds (up to 64), and
    the writer writes each ubatch side's counters as its report has them: a ubatch side's
    `cost` held a key its declaration (`COST`'s six) did not name, so the diff of two
    such reports failed the closed schema. Built by hand: `later` added to every ubatch
    of the race under cache-safe (0, 1, 2, ...) and rep-once (1, 2, 3, ...)."""
    race = str(ROOT / "traces" / "shared-prefix-race.yaml")
    paths = []
    for plus, engine in enumerate(("cache-safe", "rep-once")):
        doc = _replay(race, "--engine", engine, "--backend", "none")
        for i, u in enumerate(doc["ubatches"]):
            u["cost"]["later"] = i + plus
        doc["summary"]["cost"]["later"] = len(doc["ubatches"])
        paths.append(tmp_path / f"{engine}.json")
        paths[-1].write_text(json.dumps(doc))
    doc = _diff(*map(str, paths))
    jsonschema.Draft202012Validator(_closed(rf.diff_schema())).validate(doc)
    (t,) = doc["traces"]
    sides = [d[side]["cost"] for d in t["differences"] if d["type"] == "ubatch"
             for side in ("base", "head")]
    assert sides and all(c["later"] >= 0 and set(rf.COST_KEYS) < set(c) for c in sides)
    n = len(_replay(race, "--engine", "cache-safe", "--backend", "none")["ubatches"])
    # summed over the ubatches: 0 + 1 + ... + (n - 1), and 1 + 2 + ... + n
    assert t["totals"]["base"]["cost"]["later"] == n * (n - 1) // 2
    assert t["totals"]["head"]["cost"]["later"] == n * (n + 1) // 2


def test_the_fields_two_versions_differ_in_by_design_are_the_diffs_words() -> None:
    """`versions.BY_DESIGN` names fields of the comparison: each is one `differs` can
    name (a misspelt one would compare the field after all, and write a `by_design`
    the schema refuses)."""
    from kpool_cli.versions import BY_DESIGN

    named = {f for fields in BY_DESIGN.values() for f in fields}
    assert named and named <= set(rf.DIFF_UBATCH_FIELDS)
