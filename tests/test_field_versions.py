"""The field's versions (versions.py, docs/versions.md): the no-op seq_rm patch, the
glm5next branch's padding, angt f46848f, the registry and `--engine all`. Numbers
derived by hand."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from conftest import codes, run, trace, ubatches

from kpool_cli.gen.scenarios import speculative
from kpool_cli.versions import BASES, COMBINATIONS, PATCHES, VERSIONS, registered

ROOT = Path(__file__).resolve().parent.parent


def kpool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kpool_cli", *args], capture_output=True,
                          text=True, cwd=ROOT, env={"COLUMNS": "200", "PATH": ""})


def test_engines_lists_every_base_patch_and_version_with_its_origin():
    raw = kpool("engines").stdout
    for name in [*BASES, *PATCHES, *VERSIONS]:
        assert f"  {name} " in raw, name
    out = " ".join(raw.split())  # lines wrap at the terminal's width
    for origin in ("audiagentic/bigcherry patches/1292_kpool_tail_truncate/patch.py",
                   "angt/llama.cpp src/llama-memory-hybrid-idx.cpp @ "
                   "f46848f9ddcb07e23ffa3bbf37ddc72fe1be3184",
                   "ggml-org/llama.cpp src/llama-kv-cache-kpool.cpp @ "
                   "048799f098a19e52ec11a4dec93dbf9fead1233d",
                   "43fe9c64281ef735046adc025e9e7559a1f659a5 (PR #29994)"):
        assert origin in out, origin
    assert "applies to cache-safe: it anchors on `size_t n_kept = 0;`" in out


def test_engines_says_on_the_patch_row_that_the_shipped_version_of_its_name_is_the_port():
    """`tail-truncate` is a patch (cache-safe only) and a shipped version (its port on
    rep-once): the patch's row says what to use on rep-once, and that the shipped
    `tail-truncate` is that, not the patch; the port's row points cache-safe back."""
    out = " ".join(kpool("engines").stdout.split())
    patch_row = out[out.index(" tail-truncate a fork's"):out.index(" tail-truncate-port ")]
    assert ("on rep-once, use its port: rep-once+tail-truncate-port, the shipped version "
            "`tail-truncate` (not the patch of that name)") in patch_row, patch_row
    assert "on cache-safe, use the patch it ports: cache-safe+tail-truncate" in out


def test_angt_f46848f_is_pr_29994_on_angts_kv_cache():
    """Every policy of angt's version is rep-once's but its kv cache's seq_keep, which
    empties every stream: its seq-id checks and its gather mode are out of a valid
    trace's reach (docs/versions.md)."""
    angt = registered("angt-f46848f")
    assert COMBINATIONS["angt-f46848f"][0] == "rep-once+seq-keep-every-stream"
    assert angt == replace(registered("rep-once"), name=angt.name,
                           description=angt.description, seq_keep_every_stream=True)


# -- the no-op seq_rm patch -------------------------------------------------------------


def test_s4_a_fully_accepted_draft_rebuilds_the_layout_unless_the_patch_skips_it():
    """`kpool gen speculative --prompt 8 --draft 3 --accept 3 --trim 1 --steps 6`: an
    8-token prompt, then 6 steps of 4 tokens, each followed by a seq_rm of the empty
    tail (every draft accepted). The prompt's update copies 8 pairs, step 1 appends 4.
    Each seq_rm stales pos 12, 16, ...: rep-once rebuilds the whole sequence at the next
    step (16, 20, 24, 28, 32 pairs); with the patch the seq_rm removed nothing, stales
    nothing, and each step appends its 4 pairs. The pools marked are those the steps
    complete (one a step) either way, and no finding."""
    t = speculative(0, prompt=8, draft=3, accept=3, trim=1, steps=6)
    got = {}
    for engine in ("rep-once", "rep-once+noop-seq-rm"):
        ubs = ubatches(run(t, engine))
        got[engine] = [u.cost["cells_scanned"] for u in ubs]
        assert [len(u.pools.marked()) for u in ubs[1:]] == [1] * 6, engine
        assert not codes(run(t, engine))
    assert got == {"rep-once": [8, 4, 16, 20, 24, 28, 32],
                   "rep-once+noop-seq-rm": [8, 4, 4, 4, 4, 4, 4]}


# -- the glm5next branch's padding --------------------------------------------------------

PREFILL = """
    kpool_trace: 1
    cache: {kv_size: 16, kpool: 4}
    ops:
      - decode: {seq: 0, pos: 0..8}
    """


def test_s7_padding_repeats_the_first_pool_a_duplicate_write_of_equal_values():
    """One ubatch of pos 0..7 (kpool 4): pools 0 (cells 0..3, rep 3) and 1 (rep 7), so
    n_new 2; n_new_g = max(2, 1, min(8 / 4 + 1, pad(2) - 1, 16 / 4)) = 3: one padding
    entry. rep-once gives it the smallest row no pool's rep is, row 0: no finding. The
    glm5next padding re-pools pool 0 into row 3: row 3 has two writers (pool 0's entry
    and the padding), KP001 with equal values (both pool cells 0..3)."""
    t = trace(PREFILL)
    (ro,) = ubatches(run(t, "rep-once"))
    assert ro.scatter_rep.tolist() == [3, 7, 0] and not ro.findings
    (gl,) = ubatches(run(t, "glm5next-048799f0"))
    assert gl.scatter_rep.tolist() == [3, 7, 3]
    assert gl.scatter_rows[2].tolist() == [0, 1, 2, 3]
    (f,) = gl.findings
    assert f.code == "KP001" and f.rows == (3,) and "(seq 0 and padding)" in f.message
    from kpool_cli.backend.store import make_backend
    from kpool_cli.contracts.records import UbatchRecord
    from kpool_cli.replay import replay

    (valued,) = [r for r in replay(t, registered("glm5next-048799f0"), make_backend("numpy", t))
                 if isinstance(r, UbatchRecord)]
    assert [f.message.endswith("values equal: every racing entry writes the same value")
            for f in valued.findings] == [True]


def test_s7_padding_with_no_pool_writes_cell_0_from_every_padding_entry():
    """Two sequences, one token each at pos 0 (kpool 4): no pool; n_new 0, n_new_g =
    max(0, 1, min(2 / 4 + 2, 63, 16 / 4 * 2)) = 2 padding entries, both on row 0 (cell 0
    pooled from 4 copies of itself): KP001 on row 0, equal values; no pool reads row 0,
    so no KP004."""
    t = trace("""
        kpool_trace: 1
        cache: {kv_size: 16, kpool: 4, n_seq_max: 2}
        ops:
          - decode: {tokens: [{pos: 0, seq: 0}, {pos: 0, seq: 1}]}
        """)
    (u,) = ubatches(run(t, "glm5next-048799f0"))
    assert u.scatter_rep.tolist() == [0, 0] and u.scatter_rows.tolist() == [[0] * 4] * 2
    assert [(f.code, f.rows) for f in u.findings] == [("KP001", (0,))]


# -- --engine all ------------------------------------------------------------------------


def test_fuzz_engine_all_says_which_versions_show_a_finding():
    """The race of PR #29994 under every shipped version: KP001 on a shared layout
    under cache-safe and the fork's version (its base); not under the others."""
    from kpool_cli.gen.fuzz import _under_every_version
    from kpool_cli.trace.load import load_trace

    race = load_trace(ROOT / "traces" / "shared-prefix-race.yaml")
    _, defects, _, shown = _under_every_version(race, "none")
    assert not defects
    assert shown[("KP001", "KP001/decode/shared")] == ("cache-safe",
                                                        "cache-safe+tail-truncate")


def test_check_engine_all_in_json_names_the_versions_of_each_finding(tmp_path):
    """`kpool check --engine all` on the race of PR #29994, worked by hand: cache-safe
    and the fork's version race at op 3 and op 6 (KP001 x2). glm5next's first ubatch
    (op 0: pos 0..11, pools 0..2, n_new 3, n_new_g = max(3, 1, min(12 / 4 + 1, 63, 32))
    = 4) pads one entry with pool 0 (rep row 3), which pool 0's own entry writes too:
    KP001 x1 at op 0; its later ubatches pad nothing a marked pool writes. rep-once, the
    port and angt's version: none. Settings may say `engines = ["all"]` too."""
    import json

    race = ROOT / "traces" / "shared-prefix-race.yaml"
    r = kpool("check", str(race), "--engine", "all", "--output-format", "json",
              "--no-config")
    doc = json.loads(r.stdout)
    assert r.returncode == 1  # the fork's version and glm5next leave KP001 unpinned
    assert [x["engine"] for x in doc["results"]] == list(VERSIONS)
    (kp001,) = doc["versions"]
    assert kp001["code"] == "KP001"
    assert kp001["by"] == [{"engine": "cache-safe", "count": 2, "first_op": 3},
                           {"engine": "cache-safe+tail-truncate", "count": 2, "first_op": 3},
                           {"engine": "glm5next-048799f0", "count": 1, "first_op": 0}]
    assert kp001["not_by"] == ["rep-once", "tail-truncate", "angt-f46848f"]
    (tmp_path / "kpool.toml").write_text('engines = ["all"]\n')
    r = subprocess.run([sys.executable, "-m", "kpool_cli", "check", str(race),
                        "--output-format", "json"], capture_output=True, text=True,
                       cwd=tmp_path)
    assert [x["engine"] for x in json.loads(r.stdout)["results"]] == list(VERSIONS)
