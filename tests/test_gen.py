"""`kpool gen`: the scenario generators (kpool_cli/gen/scenarios.py) and the command.

Each scenario is deterministic, loads back, and replays under both engines without
an engine abort (KP005), a refused decode (KP006) or a refused edit (KP008): the
batch validator accepts what the generators write. The sizes say what they do, and
a bad size is exit 2."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner

from kpool_cli.cli import cli
from kpool_cli.contracts.records import OpEvent, UbatchRecord
from kpool_cli.gen.scenarios import SCENARIOS, server
from kpool_cli.replay import replay
from kpool_cli.trace.load import load_trace_text
from kpool_cli.trace.model import Decode, SeqAdd, SeqCp, SeqRm, Trace
from kpool_cli.trace.write import dump_trace
from kpool_cli.versions import load_version

# the scenarios owned here; `random` is registered too, but its validity is the
# random generator's own tests' business (some of its decodes are refused on purpose)
REALISTIC = ["server", "speculative", "context-shift", "save-restore", "mrope-image"]
ENGINES = ("rep-once", "cache-safe")


def run(*args: str) -> tuple[int, str, str]:
    r = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    return r.exit_code, r.stdout, r.stderr


def codes(trace: Trace, engine: str) -> set[str]:
    out: set[str] = set()
    for r in replay(trace, load_version(engine)):
        if isinstance(r, OpEvent | UbatchRecord):
            out |= {f.code for f in r.findings}
    return out


def test_every_scenario_is_registered_with_its_sizes() -> None:
    assert set(REALISTIC) | {"random"} == set(SCENARIOS)
    for sc in SCENARIOS.values():
        assert sc.doc
        for size in sc.sizes:
            assert size.lo <= size.default <= size.hi and size.doc


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_deterministic_and_seeded(name: str) -> None:
    sc = SCENARIOS[name]
    assert dump_trace(sc.generate(3)) == dump_trace(sc.generate(3))
    assert len({dump_trace(sc.generate(seed)) for seed in range(4)}) > 1


@pytest.mark.parametrize("name", REALISTIC)
def test_loads_back_and_replays_cleanly(name: str) -> None:
    for seed in range(4):
        trace = SCENARIOS[name].generate(seed)
        back = load_trace_text(dump_trace(trace))
        assert back.ops == trace.ops and back.cache == trace.cache
        assert back.name == f"gen-{name}" and f"kpool gen {name} --seed {seed}" in back.description
        for engine in ENGINES:
            assert not codes(back, engine) & {"KP005", "KP006", "KP008"}, (name, seed, engine)


def test_random_is_registered_and_round_trips() -> None:
    trace = SCENARIOS["random"].generate(11)
    back = load_trace_text(dump_trace(trace))
    assert back.ops == trace.ops and back.name == "gen-random"


def test_server_whole_copy_races_under_cache_safe_only() -> None:
    # By hand: slot 0 decodes the 8-token system prompt into cells 0..7 (pools 0 and 1
    # of seq 0, reps on rows 3 and 7), and a whole seq_cp shares those cells with
    # slot 1. The next batch has one prompt token per slot (pos 8, pool 2, not full).
    # cache-safe sees shared cells and re-pools every pool of both sequences: pools 0
    # and 1 of seq 0 and of seq 1, whose reps are the same rows 3 and 7, written by two
    # scatter entries each: KP001, n_new 4. rep-once marks each rep once: only seq 1's
    # pools 0 and 1 are new to it, n_new 2, no race.
    trace = server(7, slots=2, system=8, prompt=1, steps=1, requests=2, coupled=0)
    assert any(isinstance(op, SeqCp) and op.is_whole for op in trace.ops)
    first = {}
    for engine in ENGINES:
        rec = [r for r in replay(trace, load_version(engine)) if isinstance(r, UbatchRecord)]
        first[engine] = rec[1]  # the batch after the copy
    assert first["cache-safe"].n_new == 4
    assert [f.code for f in first["cache-safe"].findings] == ["KP001"]
    assert first["rep-once"].n_new == 2 and first["rep-once"].findings == ()
    assert codes(trace, "cache-safe") == {"KP001"} and codes(trace, "rep-once") == set()


def test_server_coupled_decodes_the_system_prompt_once_with_every_seq_id() -> None:
    trace = server(1, slots=3, coupled=1)
    first = trace.ops[0]
    assert isinstance(first, Decode) and {t.seq for t in first.tokens} == {(0, 1, 2)}
    assert not any(isinstance(op, SeqCp) for op in trace.ops)


def test_sizes_say_what_they_do() -> None:
    t = server(0, slots=3)
    seqs = {s for op in t.ops if isinstance(op, Decode) for tok in op.tokens for s in tok.seq}
    assert seqs == {0, 1, 2} and t.cache.n_seq_max == 3

    t = SCENARIOS["speculative"].generate(2, draft=2, steps=5)
    steps = [op for op in t.ops[1:] if isinstance(op, Decode)]
    assert t.cache.n_rs_seq == 2 and len(steps) == 5
    assert all(len(op.tokens) == 3 for op in steps)  # the last accepted token + 2 drafts
    for op, nxt in zip(t.ops, t.ops[1:], strict=False):
        if isinstance(nxt, SeqRm):  # the rejected tail of the draft just decoded
            assert isinstance(op, Decode) and nxt.p1 == -1
            assert 1 <= op.tokens[-1].pos - nxt.p0 + 1 <= 2

    t = SCENARIOS["context-shift"].generate(4, ctx=48, keep=6, shifts=3)
    adds = [op for op in t.ops if isinstance(op, SeqAdd)]
    assert t.cache.kv_size == 48 and len(adds) == 3
    assert all(op.shift < 0 for op in adds)
    assert [op.p0 for op in t.ops if isinstance(op, SeqRm)] == [6, 6, 6]

    t = SCENARIOS["mrope-image"].generate(5, images=2, patches=4)
    images = [op for op in t.ops if isinstance(op, Decode) and op.is_embd]
    assert t.cache.by_order and len(images) == 2
    assert all(len(op.tokens) <= 4 and len({tok.pos for tok in op.tokens}) == 1
               for op in images)


def test_a_description_counts_its_sizes_in_the_singular_for_one() -> None:
    """The descriptions said `1 slot(s)`, `1 token(s) per step`, `1 time(s)` and
    `1 image(s)`: each size takes `wording.counted`, as a count does elsewhere."""
    assert server(0, slots=1).description.startswith("llama-server with 1 slot on one ")
    assert server(0, slots=2).description.startswith("llama-server with 2 slots on one ")
    one = SCENARIOS["context-shift"].generate(4, ctx=48, keep=6, shifts=1, chunk=1)
    assert "generates up to 1 token per step and shifts 1 time (" in one.description
    two = SCENARIOS["context-shift"].generate(4, ctx=48, keep=6, shifts=2, chunk=2)
    assert "generates up to 2 tokens per step and shifts 2 times (" in two.description
    for n, images in ((1, "1 image of"), (2, "2 images of")):
        t = SCENARIOS["mrope-image"].generate(5, images=n, patches=4)
        assert t.description.startswith(f"An M-RoPE model pools by order: {images} at most")


def test_cli_writes_the_trace_and_its_description_regenerates_it(tmp_path: Path) -> None:
    out = tmp_path / "s.yaml"
    code, stdout, _ = run("gen", "server", "--seed", "9", "--slots", "3", "-o", str(out))
    assert code == 0 and stdout == ""
    text = out.read_text()
    assert text == dump_trace(server(9, slots=3))
    trace = load_trace_text(text)
    line = next(x for x in trace.description.splitlines() if x.startswith("Generated by: "))
    args = shlex.split(line.removeprefix("Generated by: kpool "))
    code, again, _ = run(*args)
    assert code == 0 and again == text


@pytest.mark.parametrize("args", [
    ["gen", "server", "--slots", "17"],
    ["gen", "speculative", "--draft", "0"],
    ["gen", "server", "--seed", "-1"],
    ["gen", "nosuch"],
])
def test_out_of_range_is_exit_2(args: list[str]) -> None:
    code, stdout, _ = run(*args)
    assert code == 2 and stdout == ""


def test_sizes_that_do_not_fit_together_are_exit_2_with_a_message() -> None:
    code, stdout, stderr = run("gen", "context-shift", "--ctx", "16", "--keep", "8")
    assert code == 2 and stdout == ""
    assert stderr.startswith("kpool: --keep 8 does not fit --ctx 16") and "Traceback" not in stderr


def test_a_seed_out_of_range_is_told_the_closed_range_in_words():
    """Ranges `A..B` are half-open in every kpool text; the seeds' bound is closed
    (SEED_MAX = 2**64 - 1 itself is a seed), so it is written "from 0 to"."""
    with pytest.raises(ValueError, match=r"^--seed 18446744073709551616 is out of range: it "
                                         r"must be from 0 to 18446744073709551615$"):
        server(2**64)
