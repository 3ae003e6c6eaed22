"""The defects a tenth hostile-input campaign found on 7 December 2026
(docs/robustness.md, "The tenth round"): a trace naming an engine composition that
does not apply, a plug-in naming itself as a composition, the memory budget's advice,
two outputs whose names one folding file system takes for one file, and the JSON
listing of every pool written without the listing kernels, over the memory budget.
Each test runs what the campaign ran, or the function it reached, and asserts what a
user sees.
"""

from __future__ import annotations

import json
import textwrap
import tracemalloc
import unicodedata
from types import SimpleNamespace

import numpy as np
import orjson
import pytest
from test_report_runs import _random_listing
from test_untrusted import RACE, RACE_BODY, kpool, kpool_here

from kpool_cli.backend import budget
from kpool_cli.contracts import runs
from kpool_cli.contracts.records import Pools
from kpool_cli.report import json_report
from kpool_cli.report.json_report import (
    EncodedTexts,
    pools_json,
    pools_text,
    scatter_json,
    scatter_text,
)
from kpool_cli.trace.load import load_trace_text
from kpool_cli.versions import REP_ONCE, by_design, compose, load_version

# -- an engine a trace names -----------------------------------------------------------------

TAIL_ON_REP_ONCE = (
    "engine 'rep-once+tail-truncate': patch 'tail-truncate' cannot apply to base "
    "'rep-once': it anchors on `size_t n_kept = 0;` and gates on `!sq.shared` in "
    "kpool_layout_update, which PR #29994 removed with the sharing scan; for rep-once, "
    "use its port: rep-once+tail-truncate-port, the shipped version `tail-truncate` "
    "(not the patch of that name)")


@pytest.mark.parametrize("where, line, col, field", [
    ("top", 2, 9, "engine"),
    ("expect", 8, 22, "ops[3].expect.engine"),  # at the value: `  - expect: {engine: `
])
def test_a_trace_naming_a_composition_that_does_not_apply_is_told_why(tmp_path, where,
                                                                         line, col, field):
    """`engine: rep-once+tail-truncate` (and an expect's) was refused as "not a
    registered engine version (known: ..., or BASE+PATCH)": the name is BASE+PATCH,
    and the reason `--engine` and a settings file give (the patch needs the other
    base; its port is the shipped `tail-truncate`) was not said."""
    top = "engine: rep-once+tail-truncate\n" if where == "top" else "seed: 0\n"
    body = textwrap.dedent(RACE_BODY) + (
        "  - expect: {engine: rep-once+tail-truncate, findings: []}\n"
        if where == "expect" else "")
    t = tmp_path / "t.yaml"
    t.write_text("kpool_trace: 1\n" + top + body)
    r = kpool_here("validate", str(t), cwd=tmp_path)
    assert r.returncode == 2
    assert f"  {t}:{line}:{col}: {field}: {TAIL_ON_REP_ONCE}\n" in r.stdout, r.stdout
    assert "unknown engine" not in r.stdout


def test_a_trace_naming_a_composition_of_one_patch_twice_is_told_so(tmp_path):
    t = tmp_path / "t.yaml"
    t.write_text("kpool_trace: 1\nengine: rep-once+noop-seq-rm+noop-seq-rm\n"
                 + textwrap.dedent(RACE_BODY))
    r = kpool_here("validate", str(t), cwd=tmp_path)
    assert r.returncode == 2
    assert (f"  {t}:2:9: engine: engine 'rep-once+noop-seq-rm+noop-seq-rm': patches "
            "'noop-seq-rm' and 'noop-seq-rm' both change seq_rm_noop_keeps_clean\n"
            ) in r.stdout, r.stdout
    # a composition that applies is a name a trace may give, top level and in an expect
    t.write_text("kpool_trace: 1\nengine: rep-once+noop-seq-rm\n" + textwrap.dedent(RACE_BODY)
                 + "  - expect: {engine: cache-safe+noop-seq-rm, findings: []}\n")
    assert load_trace_text(t.read_text()).engine == "rep-once+noop-seq-rm"
    assert kpool_here("validate", str(t), cwd=tmp_path).returncode == 0


def test_an_expect_naming_a_composition_with_spaces_holds_under_it(tmp_path):
    """`expect: {engine: "cache-safe + noop-seq-rm"}` loads (a composition, its parts
    stripped, as `--engine` takes it), and kpool check runs the trace under it, named
    `cache-safe+noop-seq-rm`; but the expect kept its spelling, matched no run's name,
    and was never judged: "0 expectations held", its KP001 unpinned, exit 1. The loader
    reads an engine as the version's own name. By hand: seqs 0 and 1 share pos 0..8,
    two pools each, so cache-safe re-pools both sequences' pools onto rows 3 and 7 in
    both decodes (KP001 twice), which the no-op seq_rm patch does not change."""
    t = tmp_path / "t.yaml"
    t.write_text(textwrap.dedent("""\
        kpool_trace: 1
        engine: " cache-safe + noop-seq-rm "
        cache: {kv_size: 64, kpool: 4, n_seq_max: 2}
        ops:
          - decode: {seq: [0, 1], pos: 0..8}
          - decode: {tokens: [{pos: 8, seq: 0}, {pos: 8, seq: 1}]}
          - expect: {engine: "cache-safe + noop-seq-rm", findings: [KP001]}
        """))
    loaded = load_trace_text(t.read_text())
    assert loaded.engine == loaded.ops[-1].engine == "cache-safe+noop-seq-rm"
    r = kpool_here("check", str(t), "--no-config", cwd=tmp_path)
    assert r.returncode == 0, r.stdout
    assert (f"PASS    {t} under cache-safe+noop-seq-rm: 1 expectation held, pinned KP001 x2"
            ) in r.stdout
    r = kpool_here("replay", str(t), "--check", "--backend", "none", "--format", "json",
                   cwd=tmp_path)
    assert json.loads(r.stdout)["summary"]["expectations"] == {"passed": 1, "failed": 0}


# -- a plug-in named as a composition ---------------------------------------------------------


def test_a_plug_in_named_as_a_composition_is_shown_as_the_plug_in(tmp_path, monkeypatch):
    """A plug-in naming itself `cache-safe+noop-seq-rm` (rep-once's policies) kept the
    name, where one naming itself `cache-safe` is shown `cache-safe@spec`: its replay
    said "under cache-safe+noop-seq-rm", and `kpool diff --base cache-safe` left n_new,
    the marked pools, the scatter and the stale positions out "by design", the
    composition's leniency, not the plug-in's. One that is the composition keeps it."""
    (tmp_path / "plgcomp.py").write_text(
        "from dataclasses import replace\n"
        "from kpool_cli.versions import REP_ONCE, compose\n"
        "W = replace(REP_ONCE, name='cache-safe+noop-seq-rm')\n"
        "SAME = compose('cache-safe+noop-seq-rm')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    v = load_version("plgcomp:W")
    assert v.name == "cache-safe+noop-seq-rm@plgcomp:W"
    assert v.policies() == REP_ONCE.policies()
    assert by_design("cache-safe", v.name) == ()
    assert by_design("cache-safe", "cache-safe+noop-seq-rm") != ()  # the composition's own
    assert load_version("plgcomp:SAME") == compose("cache-safe+noop-seq-rm")
    r = kpool("diff", str(RACE), "--base", "cache-safe", "--head", "plgcomp:W",
              env={"PYTHONPATH": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    assert "head cache-safe+noop-seq-rm@plgcomp:W" in r.stdout
    assert "differ by design" not in r.stdout


# -- the memory budget's advice ---------------------------------------------------------------


def test_the_budget_advises_a_smaller_backend_only_where_there_is_one():
    """A model-only replay (`--backend none`) over the budget was told to "use a
    smaller --backend (none needs no value rows)": it had none already."""
    t = load_trace_text("kpool_trace: 1\ncache: {kv_size: 1048576, kpool: 1}\n"
                        "ops:\n  - decode: {seq: 0, pos: 0..1000}\n")
    for backend, advised in (("none", False), ("numpy", True), ("numba", True)):
        with pytest.raises(budget.ReplayTooLarge) as e:
            budget.check_replay_memory(t, backend, 1 << 20)
        assert ("use a smaller --backend" in str(e.value)) == advised, (backend, str(e.value))
        assert str(e.value).endswith("or raise --max-memory.")


# -- two outputs one file ------------------------------------------------------------------------


@pytest.mark.parametrize("first, second", [
    ("R.json", "r.json"),
    ("caf\u00e9.html", "cafe\u0301.html"),  # NFC and NFD: one name on macOS
])
def test_outputs_whose_names_differ_by_case_or_normalisation_are_refused(tmp_path, first,
                                                                        second):
    """`-o R.json --html r.json` was taken: on a file system that folds case (macOS,
    Windows, a casefolded folder) or Unicode normalisation (macOS) they are one file,
    and the page replaced the report. Refused before any work, as the same path twice
    is; nothing is written."""
    assert unicodedata.normalize("NFC", first).casefold() == \
        unicodedata.normalize("NFC", second).casefold() and first != second
    r = kpool_here("replay", str(RACE), "-o", first, "--html", second, cwd=tmp_path)
    assert r.returncode == 2
    assert f"--html {second}: the same file as --output {first}: " in r.stderr, r.stderr
    assert "differ only by case or Unicode normalisation" in r.stderr
    assert list(tmp_path.iterdir()) == []
    r = kpool_here("replay", str(RACE), "-o", "a.txt", "--html", "b.html", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "b.html"]


def test_the_same_output_path_twice_is_not_told_of_case_folding(tmp_path):
    """`-o v.txt --html v.txt` (and `./v.txt`, one file by a link of its folder) is
    the same file on every file system: the note on names that differ by case or
    normalisation was added to it too, where no two names differ."""
    (tmp_path / "here").symlink_to(tmp_path)
    for first, second in (("v.txt", "v.txt"), ("v.txt", "./v.txt"), ("v.txt", "here/v.txt")):
        r = kpool_here("replay", str(RACE), "-o", first, "--html", second, cwd=tmp_path)
        assert r.returncode == 2
        said = r.stderr.replace("\n", " ")
        assert (f"--html {second}: the same file as --output {first}: each output needs "
                "its own path") in said, said
        assert "case" not in said and "normalisation" not in said


# -- a listing written without the kernels -------------------------------------------------------


def _fragment_text(fragment: object) -> bytes:
    return orjson.dumps([fragment])[1:-1]


@pytest.mark.parametrize("kpool", [1, 2, 3])
def test_a_listing_written_in_pieces_is_what_orjson_writes_of_the_list(kpool, monkeypatch):
    """Without the listing kernels, a listing longer than `PIECE` objects is written a
    piece at a time (`_pieces_text`): the bytes orjson writes of `pools_json` and
    `scatter_json`, in the run form and in full, for random listings (runs, singles
    and both at a piece's edge: pieces of 1 to 4 objects here)."""
    rng = np.random.default_rng(100 + kpool)
    n_runs = 0
    for i in range(240):
        monkeypatch.setattr(json_report, "PIECE", 1 + i % 4)
        p, cells, rep, pad = _random_listing(rng, kpool)
        r = SimpleNamespace(scatter_rows=cells, scatter_rep=rep, scatter_pad=pad,
                            scatter_spans=None if i % 2 else runs.scatter_spans(cells, rep, pad))
        for form in (kpool, 0):
            want = orjson.dumps(pools_json(p, form))
            assert _fragment_text(pools_text(None, p, form, None)) == want
            assert _fragment_text(pools_text(None, p, form, runs.pool_spans(p))) == want
            assert _fragment_text(scatter_text(None, r, form)) == orjson.dumps(
                scatter_json(r, form))
        n_runs += len(runs.pool_spans(p))
    assert n_runs > 100


def _record(n: int, rng: np.random.Generator) -> SimpleNamespace:
    """A ubatch's record listing `n` pools of one row each, on rows far apart at random
    (no two form a run), and a scatter entry each: `--pools all` of a large layout."""
    cells = np.sort(rng.choice(10**8, n, replace=False)).astype(np.int64)[:, None]
    idx = np.arange(n, dtype=np.int64)
    pools = Pools(np.zeros(n, np.int64), idx, idx, idx, cells, cells[:, 0].copy(),
                  np.ones(n, dtype=bool))
    return SimpleNamespace(
        pools=pools, pool_spans=None, scatter_rows=cells, scatter_rep=cells[:, 0].copy(),
        scatter_pad=np.zeros(n, dtype=bool), scatter_spans=None,
        token_pos=np.zeros(0, np.int64), token_seqs=(), token_rows=np.zeros(0, np.int64),
        token_ext=None)


@pytest.mark.parametrize("kpool", [0, 1])
def test_a_long_listing_without_the_kernels_holds_its_text_not_an_object_per_item(
        kpool, monkeypatch):
    """`kpool replay --pools all --format json --core reference --backend none` of a
    300-byte trace (a million pools listed a ubatch) took 2.1 GB under `--max-memory
    900M`, which the budget had admitted at 868 MiB: written without the listing
    kernels, a listing was a Python object per pool, kept (its text's key) for the
    next ubatches. The budget counts `POOL_INFO_BYTES` a listed pool, "its JSON while
    written"; the listing's pieces now hold less, made and encoded as they come."""
    monkeypatch.setattr(json_report, "_listing_kernels", lambda: None)
    n = 20_000  # five pieces (PIECE 4096) of each listing
    r = _record(n, np.random.default_rng(kpool))
    texts = EncodedTexts()
    tracemalloc.start()
    try:
        _, pools, entries = texts.listings(r, kpool)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # n pools listed and n scatter entries: the budget's share of each while written
    assert peak < budget.POOL_INFO_BYTES * 2 * n, peak / (2 * n)
    assert _fragment_text(pools) == orjson.dumps(pools_json(r.pools, kpool))
    assert _fragment_text(entries) == orjson.dumps(scatter_json(r, kpool))


def test_a_report_written_without_the_kernels_in_pieces_is_the_same(tmp_path, monkeypatch):
    """The whole report, `--pools all` and in the run form, written a piece of two
    objects at a time without the kernels: the same bytes as the one list at once."""
    t = tmp_path / "t.yaml"
    t.write_text(textwrap.dedent("""\
        kpool_trace: 1
        cache: {kv_size: 64, kpool: 2, n_seq_max: 3}
        ops:
          - decode: {seq: [0, 1], pos: 0..20}
          - decode: {tokens: [{pos: 20, seq: 0}, {pos: 20, seq: 1}, {pos: 0, seq: 2}]}
          - seq_cp: {src: 0, dst: 2}
          - decode: {tokens: [{pos: 21, seq: 0}, {pos: 21, seq: 1}, {pos: 21, seq: 2}]}
        """))
    monkeypatch.setattr(json_report, "_listing_kernels", lambda: None)
    texts = {}
    for piece in (10**9, 2):
        monkeypatch.setattr(json_report, "PIECE", piece)
        for pools in ("marked", "all"):
            out = tmp_path / f"{piece}-{pools}.json"
            r = kpool_here("replay", str(t), "--engine", "cache-safe", "--core", "reference",
                           "--backend", "none", "--format", "json", "--pools", pools,
                           "-o", str(out), cwd=tmp_path)
            assert r.returncode == 1, r.stderr
            texts[piece, pools] = out.read_text()
    for pools in ("marked", "all"):
        assert texts[2, pools] == texts[10**9, pools]
    listed = json.loads(texts[2, "all"])["ubatches"][-1]["pools"]
    assert len(listed) == 33 and all("rep" in p for p in listed)  # every pool alone


def test_the_pieces_path_is_taken_only_past_a_piece(monkeypatch):
    """A listing of at most `PIECE` items is written as before (its list, or its text
    once handed on), so a decode step's few pools cost what they did."""
    monkeypatch.setattr(json_report, "_listing_kernels", lambda: None)
    r = _record(json_report.PIECE, np.random.default_rng(5))
    _, pools, _ = EncodedTexts().listings(r, 0)
    assert _fragment_text(pools) == orjson.dumps(pools_json(r.pools, 0))
    called = []
    monkeypatch.setattr(json_report, "_pieces_text", lambda *a: called.append(a))
    EncodedTexts().listings(r, 0)
    assert called == []
    EncodedTexts().listings(_record(json_report.PIECE + 1, np.random.default_rng(5)), 0)
    assert len(called) == 2  # the pools and the entries



KNOWN = ("known engines are cache-safe, rep-once, tail-truncate, cache-safe+tail-truncate, "
         "angt-f46848f, glm5next-048799f0, BASE+PATCH (kpool engines)")


def test_an_unknown_engine_is_refused_in_one_wording_wherever_it_is_named(tmp_path):
    """The command line, a settings file, a trace's `engine:` and an expect's each
    refused an unknown name in words of their own (four wordings, two of them
    re-deciding what a composition is): one refusal now (versions.unknown_engine),
    each place adding only what else it takes."""
    body = textwrap.dedent(RACE_BODY)
    (tmp_path / "t.yaml").write_text("kpool_trace: 1\n" + body)
    said = f"unknown engine 'rep_once' (did you mean 'rep-once'?): {KNOWN}"
    r = kpool_here("replay", "t.yaml", "--engine", "rep_once", cwd=tmp_path)
    assert r.stderr == f"kpool: {said}, or give package.module:Name\n"
    (tmp_path / "kpool.toml").write_text('engines = ["rep_once"]\n')
    r = kpool_here("check", "t.yaml", cwd=tmp_path)
    assert r.stderr.endswith(f"kpool.toml:1: engines: {said}, or all\n"), r.stderr
    (tmp_path / "kpool.toml").unlink()
    (tmp_path / "e.yaml").write_text("kpool_trace: 1\nengine: rep_once\n" + body)
    r = kpool_here("replay", "e.yaml", cwd=tmp_path)
    assert r.stderr.endswith(f"e.yaml:2:9: engine: {said}\n"), r.stderr
    assert r.returncode == 2


def test_a_long_unknown_engine_name_is_clipped_where_a_trace_names_it(tmp_path):
    """A megabyte of name is echoed as its first 37 characters and `...`, as a
    problem quotes any other scalar (the review found 16 KB of it)."""
    name = "x" * 2**20
    (tmp_path / "t.yaml").write_text(f"kpool_trace: 1\nengine: {name}\n"
                                     + textwrap.dedent(RACE_BODY))
    r = kpool_here("validate", "t.yaml", cwd=tmp_path)
    assert r.returncode == 2
    assert f"engine: unknown engine '{'x' * 37}...': {KNOWN}\n" in r.stdout, r.stdout[:500]
    assert len(r.stdout) < 1000
