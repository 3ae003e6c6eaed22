"""`kpool gen` writes only traces kpool loads: every scenario refuses, before it
generates anything, sizes whose trace could cross a bound of the loader (its ops,
tokens, YAML nodes, bytes, positions, cells), naming the size and the bound.

The bounds are the loader's own constants (`LOADER_BOUNDS` reads them from
`trace.yaml_safe.limits` and `trace.format` when it checks), so a test that lowers one lowers
it for the estimate and the loader at once: the corners are found at small bounds,
where generating and loading is quick, and one corner at the real ones. Each estimate
is a bound of what the writer writes: never below what a generated trace holds, as
the composer and the walk count it."""

from __future__ import annotations

import glob
import random
from pathlib import Path

import pytest
from click.testing import CliRunner

import kpool_cli.gen.random_trace as random_trace_mod
import kpool_cli.gen.scenarios as sc_mod
from kpool_cli.cli import cli
from kpool_cli.gen.scenarios import LOADER_BOUNDS, SCENARIOS, Estimate, Scenario, Size
from kpool_cli.trace import format as trace_format
from kpool_cli.trace import load as load_mod
from kpool_cli.trace.load import SHAPE, load_trace, load_trace_text
from kpool_cli.trace.model import Decode, Trace
from kpool_cli.trace.write import dump_trace, head_written, op_written, trace_pieces
from kpool_cli.trace.yaml_safe import Composer, limits

ROOT = Path(__file__).resolve().parent.parent

# the loader's bounds, lowered (in yaml_safe.limits, where the composer and both
# walks read them; max_tokens is passed to the loader as kpool replay passes
# --max-tokens)
SMALL = {"MAX_NODE_VISITS": 40_000, "MAX_OPS": 2_000, "MAX_TOKENS": 8_000,
         "MAX_BYTES": 300_000}

# per scenario, the sizes that make the trace no smaller as they grow: each corner
# lets one of them grow until the trace would not load
GROWING = {
    "server": ["requests", "steps", "system", "prompt"],
    "speculative": ["steps", "prompt", "draft"],
    "context-shift": ["ctx", "shifts"],
    "save-restore": ["rounds", "prompt", "steps", "slots"],
    "mrope-image": ["patches", "text", "images"],
    "random": ["max_ops"],
}


def run(*args: str) -> tuple[int, str, str]:
    r = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    return r.exit_code, r.stdout, r.stderr


@pytest.fixture
def small(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in SMALL.items():
        monkeypatch.setattr(limits, name, value)


def measured(trace: Trace, text: str | None = None) -> dict[str, int]:
    """What the loader counts of the written trace (`text`, if written already),
    without its bounds."""
    text = dump_trace(trace) if text is None else text
    c = Composer(text, 1 << 62, SHAPE)
    root = c.document()
    w = load_mod._Walker("<gen>", 1 << 62)
    assert w.trace(root, "") is not None and not w.problems, w.problems
    positions = [p for op in trace.ops if isinstance(op, Decode)
                 for p in ([op.span.stop - 1] if op.span else [])
                 + [q for t in op.tokens for q in (t.pos, *(t.ext or ()))]]
    return {"ops": len(trace.ops), "tokens": w.n_tokens, "nodes": c.nodes,
            "visits": w.visits, "bytes": len(text.encode("utf-8")),
            "max_pos": max(positions, default=0), "kv_size": trace.cache.kv_size}


def bounded(e: Estimate) -> dict[str, int]:
    return {"ops": e.ops, "tokens": e.tokens, "nodes": e.written.nodes,
            "visits": e.written.nodes, "bytes": e.written.bytes, "max_pos": e.max_pos,
            "kv_size": e.kv_size}


def assert_within(sc: Scenario, seed: int, sizes: dict[str, int]) -> str:
    """The generated trace's text, once checked to hold no more than the estimate."""
    trace = sc.generate(seed, **sizes)
    text = dump_trace(trace)
    got, most = measured(trace, text), bounded(sc.estimate(seed, sc.check(seed, **sizes)))
    over = {k: (got[k], most[k]) for k in got if got[k] > most[k]}
    assert not over, (sc.name, seed, sizes, over)
    return text


def fits(sc: Scenario, seed: int, sizes: dict[str, int]) -> bool:
    return sc.fits(seed, **sizes)


def largest(sc: Scenario, seed: int, base: dict[str, int], s: Size) -> int | None:
    """The largest value of `s` accepted with the other sizes at `base` (None: none)."""
    if not fits(sc, seed, {**base, s.name: s.lo}):
        return None
    lo, hi = s.lo, s.hi
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(sc, seed, {**base, s.name: mid}) else (lo, mid - 1)
    return lo


def corners(sc: Scenario) -> list[dict[str, int]]:
    """The defaults, the first growing size at its largest, and every growing size at
    its largest (the others at their defaults)."""
    hi = {s.name: s.hi for s in sc.sizes}
    first = GROWING[sc.name][0]
    out = [{s.name: s.default for s in sc.sizes}]
    out.append({**out[0], first: hi[first]})
    if sc.name == "context-shift":  # the largest that fit together
        out.append({**out[0], "ctx": 65536, "keep": 0, "chunk": 1, "shifts": 64})
    else:
        out.append({**out[0], **{g: hi[g] for g in GROWING[sc.name]}})
    return out


@pytest.fixture
def nothing_generated(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any generator that gets past its checks fails the test."""
    def generated(*a: object, **k: object) -> None:
        raise AssertionError("a refused size got to generating")

    monkeypatch.setattr(sc_mod, "_seed", generated)
    monkeypatch.setattr(random_trace_mod, "random_config", generated)  # random_trace's first


# -- the bounds are the loader's -------------------------------------------------------


def test_the_bounds_are_the_loaders_constants() -> None:
    assert {(b.module, b.name) for b in LOADER_BOUNDS} == {
        (limits, "MAX_OPS"), (limits, "MAX_TOKENS"), (limits, "MAX_NODE_VISITS"),
        (limits, "MAX_BYTES"), (trace_format, "POS_LIMIT"),
        (trace_format, "KV_SIZE_MAX")}
    for b in LOADER_BOUNDS:
        assert b.limit == getattr(load_mod, b.name)  # what the loader re-exports


def test_a_lowered_bound_is_lowered_for_the_estimate(small: None) -> None:
    assert {b.name: b.limit for b in LOADER_BOUNDS if b.name in SMALL} == SMALL


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_help_lists_the_loaders_bounds(name: str) -> None:
    code, out, _ = run("gen", name, "--help")
    flat = " ".join(out.split())
    assert code == 0
    for b in LOADER_BOUNDS:
        assert b.name in flat and f"{b.limit:,}" in flat, b.name
    assert "refused (exit 2) before anything is generated" in flat


def test_server_help_names_the_node_bound() -> None:
    _, out, _ = run("gen", "server", "--help")
    assert "at most 1,000,000 YAML nodes (MAX_NODE_VISITS)" in " ".join(out.split())


# -- the estimate bounds what is written -----------------------------------------------


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_the_estimate_bounds_every_count(name: str) -> None:
    sc = SCENARIOS[name]
    rng = random.Random(name)
    done = 0
    while done < 12:
        sizes = {s.name: rng.randint(s.lo, min(s.hi, max(s.lo + 3, 3 * s.default)))
                 for s in sc.sizes if rng.random() < 0.7}
        seed = rng.randrange(2**32)
        if fits(sc, seed, sizes):
            assert_within(sc, seed, sizes)
            done += 1


def test_draws_with_one_outcome_meet_the_estimate() -> None:
    """With every draw forced (prompt 1, steps 1), the server's worst case is its only
    case: the estimate's ops and tokens are exact."""
    sc = SCENARIOS["server"]
    for slots, requests in ((1, 5), (3, 7), (4, 8), (16, 256)):
        sizes = {"slots": slots, "requests": requests, "prompt": 1, "steps": 1}
        got = measured(sc.generate(0, **sizes))
        e = sc.estimate(0, sc.check(0, **sizes))
        assert (got["ops"], got["tokens"]) == (e.ops, e.tokens)


def test_random_traces_stay_within_the_widest_op() -> None:
    """The estimate of `random` knows random_trace's widest op (its code): a listed
    decode of at most 24 tokens, a span of at most kv_size + 8, a sequence moved on by
    at most 8 positions an op."""
    for seed in range(300):
        t = random_trace_mod.random_trace(seed, max_ops=60)
        top = 0
        for op in t.ops:
            if isinstance(op, Decode):
                assert len(op.tokens) <= sc_mod._RANDOM_LISTED
                if op.span is not None:
                    assert len(op.span) <= sc_mod._RANDOM_PAST
                top = max([top, *(tok.pos for tok in op.tokens)])
        assert top <= len(t.ops) * sc_mod._RANDOM_STEP + sc_mod._RANDOM_PAST


def test_the_writer_weighs_what_it_writes() -> None:
    """`head_written` plus `op_written` of every op is exactly the text's nodes and
    bytes, and the pieces join into `dump_trace`."""
    traces = [load_trace(p) for p in sorted(glob.glob(str(ROOT / "traces/**/*.yaml"),
                                                      recursive=True))]
    traces += [sc.generate(seed) for sc in SCENARIOS.values() for seed in range(3)]
    for t in traces:
        text = dump_trace(t)
        c = Composer(text, 1 << 62, SHAPE)
        c.document()
        w = head_written(t)
        for op in t.ops:
            w = w + op_written(op)
        assert (w.nodes, w.bytes) == (c.nodes, len(text.encode("utf-8"))), t.path
        assert "".join(p for p, _ in trace_pieces(t, weight=5)) == text
        assert sum(n for _, n in trace_pieces(t, weight=5)) == len(t.ops)


def test_positions_and_cells_are_never_near_their_bounds() -> None:
    """The registry's size bounds keep every position far below POS_LIMIT and every
    cache within KV_SIZE_MAX: at the largest sizes only the other bounds refuse."""
    for sc in SCENARIOS.values():
        for sizes in corners(sc):
            e = sc.estimate(0, sc_mod.check_sizes(sc.sizes, sizes))
            assert e.max_pos < trace_format.POS_LIMIT // 1000
            assert e.kv_size <= trace_format.KV_SIZE_MAX


# -- corners: the largest accepted loads, one more is refused before generating --------


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_largest_accepted_loads_and_one_more_is_refused(
        name: str, small: None, monkeypatch: pytest.MonkeyPatch) -> None:
    sc = SCENARIOS[name]
    tried = 0
    seeds = iter(range(10**6, 10**7, 7919))  # a seed per corner
    for base in corners(sc):
        for s in (s for s in sc.sizes if s.name in GROWING[name]):
            seed = next(seeds)
            x = largest(sc, seed, base, s)
            if x is None or x == s.hi:  # nothing fits here, or the size is not bounded
                continue
            tried += 1
            accepted = {**base, s.name: x}
            text = assert_within(sc, seed, accepted)
            load_trace_text(text, max_tokens=limits.MAX_TOKENS)
            past = {**accepted, s.name: x + 1}
            with monkeypatch.context() as m:
                def generated(*a: object, **k: object) -> None:
                    raise AssertionError("a refused size got to generating")
                m.setattr(sc_mod, "_seed", generated)
                m.setattr(random_trace_mod, "random_config", generated)
                with pytest.raises(ValueError) as refused:
                    sc.generate(seed, **past)
            msg = str(refused.value)
            assert f"{s.option} {x + 1}" in msg  # the sizes as given
            assert any(f"({b.name} in kpool_cli/trace/" in msg for b in LOADER_BOUNDS), msg
            assert "it fits with --" in msg, msg  # a size to change, and to what
    assert tried >= 2, name


def test_a_refusal_names_the_size_and_the_bound_and_writes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "t.yaml"
    code, stdout, stderr = run("gen", "server", "--slots", "16", "--system", "1024",
                               "--prompt", "1024", "--steps", "512", "--requests", "256",
                               "-o", str(out))
    assert code == 2 and stdout == "" and not out.exists()
    assert stderr.startswith("kpool: --slots 16 --system 1024 --prompt 1024 --steps 512 "
                             "--requests 256")
    assert "YAML nodes" in stderr
    assert "(MAX_NODE_VISITS in kpool_cli/trace/yaml_safe/limits.py)" in stderr
    assert "it fits with --requests at most " in stderr and "Traceback" not in stderr
    n = int(stderr.split("--requests at most ")[1].split()[0])
    assert SCENARIOS["server"].check(0, slots=16, system=1024, prompt=1024, steps=512,
                                     requests=n)
    with pytest.raises(ValueError):
        SCENARIOS["server"].check(0, slots=16, system=1024, prompt=1024, steps=512,
                                  requests=n + 1)


def test_sizes_that_crossed_before_are_refused(nothing_generated: None) -> None:
    """The sizes that ran for a minute and wrote a trace kpool replay refused, and the
    like for each bound, are refused now (before generating)."""
    cases = [
        ("server", dict(slots=16, system=1024, prompt=1024, steps=512, requests=256),
         "MAX_NODE_VISITS"),
        ("server", dict(slots=1, system=1, prompt=1, steps=512, requests=256), "MAX_OPS"),
        ("context-shift", dict(ctx=65536, keep=0, shifts=64, chunk=1), "MAX_OPS"),
        ("save-restore", dict(slots=16, prompt=1024, steps=512, rounds=256),
         "MAX_NODE_VISITS"),
        ("random", dict(max_ops=65536), "MAX_NODE_VISITS"),
    ]
    for name, sizes, bound in cases:
        with pytest.raises(ValueError, match=bound):
            SCENARIOS[name].generate(0, **sizes)


def test_at_the_real_bound_the_largest_accepted_loads() -> None:
    """One corner at the loader's real bounds: one slot, one-token prompts, up to 512
    steps a request; the ops bound (65,536) sets the most requests."""
    sc = SCENARIOS["server"]
    base = {"slots": 1, "system": 1, "prompt": 1, "steps": 512}
    x = largest(sc, 0, base, next(s for s in sc.sizes if s.name == "requests"))
    assert x is not None and 1 < x < 256
    assert sc.estimate(0, sc.check(0, **base, requests=x)).ops <= limits.MAX_OPS
    trace = sc.generate(0, **base, requests=x)
    load_trace_text(dump_trace(trace))
    with pytest.raises(ValueError, match="MAX_OPS"):
        sc.check(0, **base, requests=x + 1)
