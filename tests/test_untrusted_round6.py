"""The defects a sixth hostile-input campaign found on 7 December 2026
(docs/robustness.md, "The sixth round"): a report that claims a `config.n_batch` its
ubatches exceed was read by `kpool diff` as if the field bounded nothing. Each test
runs what the campaign ran (in this process: `kpool_here`) and asserts what a user
sees.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from test_untrusted import kpool_here, write

# a 12-token prompt split into three ubatches of 4 (cache.n_ubatch 4), one op
SPLIT = """\
    kpool_trace: 1
    cache: {kv_size: 32, kpool: 4, n_ubatch: 4}
    ops:
      - decode: {seq: 0, pos: 0..12}
    """


def _report(tmp_path: Path, body: str, name: str = "r.json") -> tuple[Path, dict]:
    t = write(tmp_path / "t.yaml", body)
    out = tmp_path / name
    r = kpool_here("replay", str(t), "--backend", "none", "--format", "json", "-o", str(out),
                   cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    return out, json.loads(out.read_text())


def _claiming(tmp_path: Path, report: dict, **config: int) -> Path:
    edited = json.loads(json.dumps(report))
    edited["config"].update(config)
    path = tmp_path / "claims.json"
    path.write_text(json.dumps(edited, indent=1))
    return path


def test_a_report_whose_op_holds_more_tokens_than_its_n_batch_is_refused(tmp_path):
    """A decode of more tokens than `n_batch` aborts on llama_decode's assert before
    its first ubatch: a report claiming n_batch 8 whose op 0 holds 12 tokens (three
    ubatches of 4) is no report a replay writes. It was diffed as if n_batch bounded
    nothing; it is refused at the ubatch that passes the bound, by line and field."""
    good, report = _report(tmp_path, SPLIT)
    bad = _claiming(tmp_path, report, n_batch=8)
    r = kpool_here("diff", good.name, bad.name, cwd=tmp_path)
    assert r.returncode == 2, r.stdout
    assert re.fullmatch(
        r"kpool: claims\.json:\d+:\d+: report\.ubatches\[2\]\.tokens: the ubatches of op 0 "
        r"hold 12 tokens, more than config\.n_batch 8 \(a larger decode aborts\)\n",
        r.stderr), r.stderr
    assert "Traceback" not in r.stderr
    # what a replay writes under n_batch (n_ubatch capped at it: ubatches of 4, ops of
    # 4) reads back, claimed n_batch or a larger one: the bounds are the replay's own
    body = SPLIT.replace("n_ubatch: 4}", "n_ubatch: 64, n_batch: 4}").replace(
        "0..12}", "0..4}\n      - decode: {seq: 0, pos: 4..8}")
    a, report = _report(tmp_path, body, "a.json")
    assert report["config"]["n_batch"] == 4
    assert [len(u["tokens"]) for u in report["ubatches"]] == [4, 4]
    for n_batch in (4, 5):
        r = kpool_here("diff", a.name, _claiming(tmp_path, report, n_batch=n_batch).name,
                       cwd=tmp_path)
        assert r.returncode == 0, r.stderr


def test_a_report_whose_ubatch_is_larger_than_its_n_batch_is_refused(tmp_path):
    """The context caps n_ubatch at n_batch (`trace.model.context_batch`), so a
    report with n_ubatch 512 and n_batch 1 holds ubatches of one token; the reader
    bounded its ubatches by n_ubatch alone and took a 12-token one."""
    good, report = _report(tmp_path, SPLIT.replace("n_ubatch: 4", "n_ubatch: 512"))
    bad = _claiming(tmp_path, report, n_batch=1)
    r = kpool_here("diff", good.name, bad.name, cwd=tmp_path)
    assert r.returncode == 2, r.stdout
    assert re.fullmatch(
        r"kpool: claims\.json:\d+:\d+: report\.ubatches\[0\]\.tokens: more than the 1 "
        r"tokens a ubatch holds \(config\.n_ubatch 512, capped at config\.n_batch 1\)\n",
        r.stderr), r.stderr
    bad = _claiming(tmp_path, report, n_batch=11)
    r = kpool_here("diff", good.name, bad.name, cwd=tmp_path)
    assert r.returncode == 2, r.stdout
    assert re.fullmatch(
        r"kpool: claims\.json:\d+:\d+: report\.ubatches\[0\]\.tokens: more than the 11 "
        r"tokens a ubatch holds \(config\.n_ubatch 512, capped at config\.n_batch 11\)\n",
        r.stderr), r.stderr


def test_a_ubatch_past_the_cache_is_refused_naming_the_cap_of_n_batch(tmp_path):
    """A recorded n_batch larger than the cache is capped at the cache's rows
    (`trace.model.context_batch`), and n_ubatch with it: a 9-token ubatch in a cache of
    8 rows, n_batch 100, is refused as more than the 8 tokens a ubatch holds, naming
    the cache's rows as the cap, not n_batch 100 (8 is not 100)."""
    good, report = _report(tmp_path, SPLIT.replace("kv_size: 32", "kv_size: 8").replace(
        "n_ubatch: 4", "n_ubatch: 512").replace("0..12", "0..8"))
    edited = json.loads(json.dumps(report))
    edited["config"]["n_batch"] = 100
    tokens = edited["ubatches"][0]["tokens"]
    tokens.append(dict(tokens[-1], pos=8))
    bad = tmp_path / "claims.json"
    bad.write_text(json.dumps(edited, indent=1))
    r = kpool_here("diff", good.name, bad.name, cwd=tmp_path)
    assert r.returncode == 2, r.stdout
    assert re.fullmatch(
        r"kpool: claims\.json:\d+:\d+: report\.ubatches\[0\]\.tokens: more than the 8 "
        r"tokens a ubatch holds \(config\.n_ubatch 512, capped at the cache's 8 rows, as "
        r"config\.n_batch 100 is\)\n", r.stderr), r.stderr
