"""Each finding code is one rule module (kpool_cli/verdict/rules/), with a fixture.

A code's fixture is its explanation's example (`EXPLANATION.example`, the minimal
trace `kpool explain` prints: one copy, in the module), replayed under the
example's engine with a value backend, as `kpool replay example.yaml` runs it. Its
findings, as the JSON report writes them, are committed in
tests/fixtures/codes/KPnnn.findings.json; this file compares them and never writes
them. For a new code, write its expected findings once with
`python tests/test_codes.py KPnnn`, then read them against the trace by hand.
"""

from __future__ import annotations

import ast
import json
import os
import pkgutil
import re
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from kpool_cli.backend.store import make_backend
from kpool_cli.contracts.records import ExpectResult, UbatchRecord
from kpool_cli.engine import context
from kpool_cli.engine.layout import Layout
from kpool_cli.replay import replay
from kpool_cli.report.json_report import finding_json
from kpool_cli.trace.load import load_trace, load_trace_text
from kpool_cli.verdict import rules
from kpool_cli.verdict.codes import CODES, VALUE_CODES
from kpool_cli.verdict.explain import EXPLANATIONS
from kpool_cli.verdict.rules import RULES
from kpool_cli.versions import VERSIONS

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "codes"
RULE_OF = {r.CODE.code: r for r in RULES}

# a code's literal outside its module that the module does not own: the rich view
# styles KP001's raced rows itself (the view's styling per code is the view's)


def findings_of(code: str) -> list[dict]:
    """Every finding of the code's fixture replay: where (op, ubatch index or None
    for an op's event) and the finding as the JSON report writes it."""
    e = RULE_OF[code].EXPLANATION
    trace = load_trace_text(e.example)
    out = []
    for r in replay(trace, e.version(), make_backend("numpy", trace)):
        if isinstance(r, ExpectResult):
            continue
        where = {"op": r.op, "ubatch": r.index if isinstance(r, UbatchRecord) else None}
        out += [{**where, "finding": finding_json(f)} for f in r.findings]
    return json.loads(json.dumps(out))  # as read back: int keys are strings


def expected_path(code: str) -> Path:
    return FIXTURES / f"{code}.findings.json"


# -- the registry derives from the modules ------------------------------------------------


def test_every_rule_module_is_registered_in_code_order():
    names = {m.name for m in pkgutil.iter_modules(rules.__path__)}
    assert names == {r.__name__.rsplit(".", 1)[1] for r in RULES}
    codes = [r.CODE.code for r in RULES]
    assert codes == sorted(codes) and len(set(codes)) == len(codes)
    assert list(CODES) == codes and list(EXPLANATIONS) == codes


@pytest.mark.parametrize("code", list(CODES))
def test_a_rule_module_is_named_for_its_code(code):
    rule = RULE_OF[code]
    c = rule.CODE
    assert rule.__name__.rsplit(".", 1)[1] == f"kp{c.code[2:]}_{c.name.replace('-', '_')}"
    assert CODES[code] is c and EXPLANATIONS[code] is rule.EXPLANATION
    assert rule.EXPLANATION.code == code
    assert rule.__doc__.startswith(f"{code} {c.name}: ")


def test_value_codes_are_the_value_only_rules():
    assert {"KP003"} == VALUE_CODES
    assert {c for c, e in EXPLANATIONS.items() if e.needs_values} == {"KP003"}


@pytest.mark.parametrize("code", list(CODES))
def test_every_code_has_a_module_a_fixture_and_expected_findings(code):
    e = RULE_OF[code].EXPLANATION
    assert load_trace_text(e.example).ops  # the fixture: a trace that loads
    assert expected_path(code).is_file(), (
        f"{expected_path(code).relative_to(ROOT)} is missing: write it with "
        f"`python tests/test_codes.py {code}` and read it against the trace")


def test_no_expected_findings_without_a_code():
    assert {p.name.split(".")[0] for p in FIXTURES.glob("*.findings.json")} == set(CODES)


def _code_literals(path: Path) -> list[tuple[int, str]]:
    """The string constants of a module that are exactly a finding code (prose that
    mentions one, in a docstring, a comment or a message, is not one)."""
    tree = ast.parse(path.read_text(), str(path))
    return [(n.lineno, n.value) for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str)
            and re.fullmatch(r"KP\d{3}", n.value)]


def test_a_code_is_written_only_in_its_module():
    homes = {r.CODE.code: Path(r.__file__).resolve() for r in RULES}
    stray = []
    for path in sorted((ROOT / "kpool_cli").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        for line, code in _code_literals(path):
            if path.resolve() != homes.get(code):
                stray.append(f"{rel}:{line}: {code}")
    assert not stray, "a code written outside its rule module: " + "; ".join(stray)
    # and each module writes its own code once: in its CODE
    for code, home in homes.items():
        assert [c for _, c in _code_literals(home)] == [code]


# -- each fixture raises its code, and exactly the committed findings -----------------------


@pytest.mark.parametrize("code", list(CODES))
def test_the_fixture_raises_its_code(code):
    assert code in {f["finding"]["code"] for f in findings_of(code)}


@pytest.mark.parametrize("code", list(CODES))
def test_the_fixture_findings_are_the_committed_ones(code):
    path = expected_path(code)
    if not path.is_file():
        pytest.fail(f"{path.relative_to(ROOT)} is missing (it is never written by the tests)")
    assert findings_of(code) == json.loads(path.read_text())


# -- the race groups are computed once a ubatch -------------------------------------------


@pytest.mark.parametrize("core", ["reference", "compiled"])
def test_the_race_groups_are_computed_once_per_ubatch(monkeypatch, core):
    """The replay builds one context a ubatch; the static KP001, the value backend's
    scatter and KP001's value evidence all read its groups (on either core)."""
    import kpool_cli.replay as replay_module
    from kpool_cli.compiled import kernels
    from kpool_cli.compiled import marking as cm

    calls = []
    # the reference sorts every plan's rep rows; the compiled core sorts them or grows
    # the last plan's groups by its new entries (compiled/marking.py `GrowingGroups`)
    if core == "reference":
        module, names = context, ["race_groups"]
    else:  # a kernel's first call puts it in its module in place of the stub
        module, names = kernels, ["race_groups", "grown_race_groups"]
        one = np.zeros(1, dtype=np.int64)  # (jit.kernel): load them first
        kernels.race_groups(one, 1)
        kernels.grown_race_groups(one, np.array([0, 1]), one, -1, one, np.array([0, 1]),
                                  np.ones(1, dtype=np.int64), np.array([0, 1]), one.copy(),
                                  one.copy(), one.copy(), np.zeros(2, dtype=np.int64),
                                  one.copy())
    for name in names:
        real = getattr(module, name)

        def counted(*args, real=real, name=name):  # the plan's rep rows: counted
            calls.append(args[0 if name == "race_groups" else 4].size)
            return real(*args)

        monkeypatch.setattr(module, name, counted)
    # and KP001's raced writers, each core's own (the compiled core hands the context
    # its kernel's twin): counted on both, called on its own alone
    writers_called = {"reference": 0, "compiled": 0}
    for where, owner in (("reference", replay_module), ("compiled", cm)):
        def counted_writers(*args, real=owner.raced_writers, where=where):
            writers_called[where] += 1
            return real(*args)

        monkeypatch.setattr(owner, "raced_writers", counted_writers)
    trace = load_trace(ROOT / "traces" / "shared-prefix-race.yaml")
    recs = [r for r in replay(trace, VERSIONS["cache-safe"], make_backend("numpy", trace),
                              core=core) if isinstance(r, UbatchRecord)]
    with_plan = [r for r in recs if not r.aborted]
    assert any(f.code == "KP001" for r in recs for f in r.findings)  # some race is judged
    assert calls == [r.n_new_g for r in with_plan]
    other = "reference" if core == "compiled" else "compiled"
    assert writers_called[core] > 0 and writers_called[other] == 0, writers_called


def test_the_context_groups_entries_by_row_in_entry_order():
    # entries 0..5 write rows 7, 3, 7, 9, 3, 7: rows 3 (entries 1, 4), 7 (0, 2, 5), 9 (3)
    order, starts, rows = context.race_groups(np.array([7, 3, 7, 9, 3, 7]))
    assert rows.tolist() == [3, 7, 9]
    assert starts.tolist() == [0, 2, 5, 6]
    assert order.tolist() == [1, 4, 0, 2, 5, 3]


def test_group_writers_are_the_writers_of_each_groups_entries_in_entry_order():
    """KP001's value evidence: entries 0..5 write rows 7, 3, 7, 9, 3, 7 and pool the
    global pools 12, 3, -1 (padding), 21, 4, 13; a pool p is (seq p // 10, k p % 10)
    here. Row 7's group is entries 0, 2, 5: (1, 2), padding, (1, 3); row 3's is 1, 4:
    (0, 3), (0, 4); row 9's is 3: (2, 1)."""
    ctx = _race_context([7, 3, 7, 9, 3, 7], [12, 3, -1, 21, 4, 13])
    got = ctx.group_writers(np.array([1, 2, 0]))
    assert got == [[[1, 2], [-1, -1], [1, 3]], [[2, 1]], [[0, 3], [0, 4]]]
    assert ctx.group_writers(np.array([], dtype=np.int64)) == []


def test_the_raced_writers_are_the_writers_of_groups_of_two_or_more_in_entry_order():
    """engine/context.py `raced_writers`, by hand, on both cores' twins: entries 0..5
    write rows 7, 3, 7, 9, 3, 7 and pool the global pools 12, 0, -1 (padding), 21, 4,
    10 of a layout whose sequences hold 10, 0, 20 and 0 pools (pool_start [0, 10, 10,
    30, 30]: pool p < 10 is (0, p), p >= 10 is (2, p - 10), sequence 1 empty). Groups:
    row 3 (group 0: entries 1, 4), row 7 (group 1: 0, 2, 5), row 9 (group 2: 3, alone,
    so not raced). The raced entries in entry order are 0, 1, 2, 4, 5: writers (2,
    2), (0, 0), padding, (0, 4), (2, 0); groups 1, 0, 1, 0, 1."""
    from kpool_cli.compiled import marking as cm

    order, starts, _rows = context.race_groups(np.array([7, 3, 7, 9, 3, 7]))
    entry_pool = np.array([12, 0, -1, 21, 4, 10])
    for twin in (context.raced_writers, cm.raced_writers):
        writers, group = twin(order, starts, entry_pool, _layout_of([10, 0, 20, 0]))
        assert writers.tolist() == [[2, 2], [0, 0], [-1, -1], [0, 4], [2, 0]], twin
        assert group.tolist() == [1, 0, 1, 0, 1], twin


def test_the_compiled_raced_writers_are_the_references_on_random_plans():
    """compiled/marking.py `raced_writers` (one kernel, a binary search in pool_start)
    against engine/context.py's numpy (`Layout.locate`, which reads `pool_seq`), on
    random plans: 0 to 3000 entries over a few rows or many (groups of one to
    dozens), a tenth padding, pools spread over sequences a third of which are
    empty (the first, the last, runs of them)."""
    from kpool_cli.compiled import marking as cm

    rng = np.random.default_rng(29)
    for n in (0, 1, 2, 65, 3000):
        for n_rows in (3, 50, 100_000):
            counts = rng.integers(1, 40, 9) * (rng.random(9) < 0.67)
            counts[rng.integers(0, 9)] = 0
            layout = _layout_of(counts.tolist())
            n_pools = int(counts.sum())
            rep = rng.integers(0, n_rows, n).astype(np.int64)
            entry_pool = rng.integers(0, max(n_pools, 1), n).astype(np.int64)
            entry_pool[(rng.random(n) < 0.1) | (n_pools == 0)] = -1
            order, starts, _rows = context.race_groups(rep)
            want = context.raced_writers(order, starts, entry_pool, layout)
            got = cm.raced_writers(order, starts, entry_pool, layout)
            for g, w in zip(got, want, strict=True):
                assert g.dtype == w.dtype and np.array_equal(g, w), (n, n_rows, counts)


def _layout_of(counts: list[int]) -> Layout:
    """A layout whose sequences hold `counts` pools (what `locate` and `pool_start`
    read; the pools' own columns are not asked)."""
    layout = Layout(len(counts), 4, False, 64)
    for sq, n in zip(layout.seqs, counts, strict=True):
        sq.pools.assign(np.zeros(n, dtype=np.int64))
    layout.n_pool_real = sum(counts)
    return layout


def _race_context(rep: list[int], entry_pool: list[int], raced_kept: bool = False
                  ) -> SimpleNamespace:
    """A ubatch context as KP001 reads it: the plan's entries writing rows `rep` and
    pooling global pools `entry_pool`, pool p being (seq p // 10, k p % 10);
    `raced_kept` as its race groups say (`RaceGroups`)."""
    order, starts, rows = context.race_groups(np.array(rep))
    layout = _layout_of([10, 10, 10])
    ctx = SimpleNamespace(order=order, starts=starts, rows=rows, layout=layout,
                          sizes=np.diff(starts), raced=np.flatnonzero(np.diff(starts) > 1),
                          plan=SimpleNamespace(entry_pool=np.array(entry_pool)),
                          raced_of=context.raced_writers, raced_kept=raced_kept)
    for name in ("raced_writers", "group_writers"):
        setattr(ctx, name, getattr(context.UbatchContext, name).__get__(ctx))
    return ctx


def _count_looks(check) -> list[int]:  # type: ignore[no-untyped-def]
    """KP001 `check`'s looks at a race's values (the `SameValues` behind its identity
    cache), one item each, in the list returned."""
    valued, looked = check._valued, []

    def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
        looked.append(1)
        return valued(*args, **kwargs)

    check._valued = counted
    return looked


def test_a_race_found_again_with_the_same_writers_is_the_same_finding():
    """kp001 `Check`, by hand. Plan A: entries 0..5 write rows 7, 3, 7, 9, 3, 7 and pool
    12, 3, -1, 21, 4, 13 (as above): rows 3 (entries 1, 4) and 7 (0, 2, 5) are raced, by
    (1, 2), (0, 3), padding, (0, 4), (1, 3) in entry order. Plan C is A's values in new
    arrays (a new plan that races as A did): the same finding and the same valued
    finding, the very objects. Plan B writes rows 3, 7, 7, 9, 3, 7 with the same
    pools: the same raced rows, counts and writers in entry order, so the same
    message, but row 3 is now entries 0 and 4, (1, 2) and (0, 4): its evidence says
    so."""
    from kpool_cli.backend.facts import ValueFacts
    from kpool_cli.verdict.rules.kp001_scatter_race import Check

    facts = ValueFacts(np.ones(3, dtype=bool), {}, {})
    check = Check()
    a = _race_context([7, 3, 7, 9, 3, 7], [12, 3, -1, 21, 4, 13])
    (found_a,) = check.at_ubatch(a)
    assert found_a.message == ("2 rows written by more than one scatter entry (seqs 0, 1 "
                               "and padding): 3 7")
    assert list(found_a.pools) == [(1, 2), (0, 3), (0, 4), (1, 3)]
    (valued_a,) = check.with_values(a, facts, [found_a])
    assert valued_a.evidence["values"][3]["writers"] == [[0, 3], [0, 4]]
    c = _race_context([7, 3, 7, 9, 3, 7], [12, 3, -1, 21, 4, 13])
    (found_c,) = check.at_ubatch(c)
    assert found_c is found_a and check.with_values(c, facts, [found_c])[0] is valued_a
    b = _race_context([3, 7, 7, 9, 3, 7], [12, 3, -1, 21, 4, 13])
    (found_b,) = check.at_ubatch(b)
    assert found_b.message == found_a.message and list(found_b.pools) == list(found_a.pools)
    (valued_b,) = check.with_values(b, facts, [found_b])
    assert valued_b.evidence["values"][3]["writers"] == [[1, 2], [0, 4]]
    assert valued_b.evidence["values"][7]["writers"] == [[0, 3], [-1, -1], [1, 3]]


def test_a_race_whose_groups_are_kept_is_read_from_the_last_plan():
    """kp001 `Check`, by hand: a context whose race groups say the raced ones are the
    last plan's (`RaceGroups.raced_kept`, compiled/marking.py `GrowingGroups`: a
    cache-safe slot closing a pool no other slot shares) is judged on the last plan's
    key, without a look at its writers: plan A above, then plan A's pools moved one
    entry on (an entry appended before them: pools 3 and 21 now at entries 2 and 4,
    the same raced rows and writers), kept: the very finding and valued finding of
    A, and no raced writers asked. The same moved plan not kept asks its writers,
    and finds the same finding by value. With every group's values equal, said so
    (`ValueFacts.all_equal`, the backend's), the kept race's valued finding is the
    last one without a look at the values either (A had 3 groups, the moved plan 4)."""
    from kpool_cli.backend.facts import ValueFacts
    from kpool_cli.verdict.rules.kp001_scatter_race import Check

    asked = []
    check = Check()
    looked = _count_looks(check)
    a = _race_context([7, 3, 7, 9, 3, 7], [12, 3, -1, 21, 4, 13])
    (found_a,) = check.at_ubatch(a)
    (valued_a,) = check.with_values(a, ValueFacts(np.ones(3, dtype=bool), {}, {}, True),
                                    [found_a])
    moved = [7, 8, 3, 7, 9, 3, 7], [12, 40, 3, -1, 21, 4, 13]
    kept = _race_context(*moved, raced_kept=True)
    kept.raced = a.raced  # the raced groups' very array, as `GrowingGroups` hands it on
    kept.raced_of = lambda *args: asked.append(1)  # never asked: it would fail
    (found,) = check.at_ubatch(kept)
    assert found is found_a and not asked
    facts = ValueFacts(np.ones(4, dtype=bool), {}, {}, True)
    assert check.with_values(kept, facts, [found])[0] is valued_a
    assert not asked and looked == [1]
    facts = ValueFacts(np.ones(4, dtype=bool), {}, {})  # not said: looked at, the same
    assert check.with_values(kept, facts, [found])[0] is valued_a and looked == [1, 1]
    again = _race_context(*moved)
    real = again.raced_of
    again.raced_of = lambda *args: asked.append(1) or real(*args)
    (found,) = check.at_ubatch(again)
    assert asked and found is found_a


def test_a_race_judged_again_on_the_very_same_arrays_follows_its_values():
    """kp001 `Check.with_values`, by hand, on plan A above (groups: row 3, row 7, row
    9; rows 3 and 7 raced) kept whole, as a plan that stands is: judged with one
    all-True equality array, then again with it (the very same valued finding, no
    look at the values), then with row 7's entries unequal (a new array: its values
    differ, and seq 1 may lose its value: row 7's writers are (1, 2), padding,
    (1, 3)), then with the first array again (equal again)."""
    from kpool_cli.backend.facts import ValueFacts
    from kpool_cli.verdict.rules.kp001_scatter_race import Check

    check = Check()
    looked = _count_looks(check)
    a = _race_context([7, 3, 7, 9, 3, 7], [12, 3, -1, 21, 4, 13])
    (found,) = check.at_ubatch(a)
    equal = ValueFacts(np.ones(3, dtype=bool), {}, {})
    unequal = ValueFacts(np.array([True, False, True]), {}, {})
    (first,) = check.with_values(a, equal, [found])
    assert first.message.endswith("values equal: every racing entry writes the same value")
    assert len(looked) == 1
    assert check.with_values(a, equal, [found])[0] is first and len(looked) == 1
    (differ,) = check.with_values(a, unequal, [found])
    assert differ.message.endswith("values differ on 1 row (row 7: 1:2, padding, 1:3): "
                                   "seq 1 may lose its value")
    assert differ.evidence["values"][7]["equal"] is False
    assert check.with_values(a, equal, [found])[0].message == first.message


def test_a_count_in_a_finding_message_takes_its_noun_and_verb_by_the_count():
    """The messages said `1 row(s)`, `1 rep row(s) hold`, `2 token(s) read 1 bad
    pool(s)` and `seqs 0` for one sequence: each count now takes `wording.counted`
    (bare, as the messages' other numbers), its verb agrees, and one sequence is
    `seq 0` (`wording.seqs`). KP001 by hand: rows 3 and 7 each written by two
    entries; row 0 by pool 0:0 and a padding entry. KP002: rows 3 (and 7) each the
    rep of pools 0:1 and 1:1. KP003: the example of `kpool explain KP003` with its
    last decode two tokens long (seq 1, pos 4..6): both tokens see pool 1:0
    (positions 0..3), whose row 5 holds pool 0:0's value: 2 tokens, 1 bad pool."""
    from kpool_cli.verdict.rules.kp001_scatter_race import race
    from kpool_cli.verdict.rules.kp002_rep_conflict import finding

    one = race(np.array([3]), np.array([2]), np.array([[0, 0], [1, 0]]))
    assert one.message == "1 row written by more than one scatter entry (seqs 0, 1): 3"
    two = race(np.array([3, 7]), np.array([2, 2]),
               np.array([[0, 0], [1, 0], [0, 1], [-1, -1]]))
    assert two.message == ("2 rows written by more than one scatter entry (seqs 0, 1 and "
                           "padding): 3 7")
    pad = race(np.array([0]), np.array([2]), np.array([[0, 0], [-1, -1]]))
    assert pad.message == ("1 row written by more than one scatter entry (seq 0 and "
                           "padding): 0")
    pools = ((0, 1), (1, 1))
    assert finding({3: pools}).message == ("1 rep row holds pools with different members: "
                                          "row 3 is the rep of pools 0:1 1:1")
    assert finding({3: pools, 7: pools}).message.startswith(
        "2 rep rows hold pools with different members: row 3 ")
    text = RULE_OF["KP003"].EXPLANATION.example.replace(
        "{seq: 1, pos: 4}", "{seq: 1, pos: 4..6}")
    assert text != RULE_OF["KP003"].EXPLANATION.example
    trace = load_trace_text(text)
    (stale,) = [f for r in replay(trace, VERSIONS["rep-once"], make_backend("numpy", trace))
                if not isinstance(r, ExpectResult) for f in r.findings if f.code == "KP003"]
    assert stale.message == ("token (pos 4, seq 1) reads pool 1:0 at row 5, which holds pool "
                             "0:0's value (written at ubatch 3) instead of the pooling of "
                             "its members (2 tokens read 1 bad pool)")


def test_one_token_reading_two_bad_pools_reads_them_in_the_singular():
    """KP003's count of readers took `counted` but its verb stayed plural: "(1 token
    read 2 bad pools)". By hand: seqs 0 and 1 each write pos 0..1 and 4..5 alone and
    share pos 2..3 and 6..7, so under rep-once pools 0:k and 1:k have one rep row
    (their shared last cell) and different members; seq 0's pooling is written there
    last (ubatches 3 and 7). The last decode is one token (seq 1, pos 8) that sees
    pools 1:0 and 1:1, both holding seq 0's value: 1 token, 2 bad pools."""
    trace = load_trace_text(
        "kpool_trace: 1\ncache: {kv_size: 32, kpool: 4, n_seq_max: 2}\nops:\n"
        + "".join(f"  - decode: {{seq: {s}, pos: {p}}}\n" for s, p in (
            (0, "0..2"), (1, "0..2"), ("[0, 1]", 2), ("[0, 1]", 3),
            (0, "4..6"), (1, "4..6"), ("[0, 1]", 6), ("[0, 1]", 7), (1, 8))))
    (*_, last) = [f for r in replay(trace, VERSIONS["rep-once"], make_backend("numpy", trace))
                  if isinstance(r, UbatchRecord) for f in r.findings if f.code == "KP003"]
    assert list(last.pools) == [(1, 0), (1, 1)] and last.tokens == ((8, 1),)
    assert last.message.endswith("instead of the pooling of its members "
                                 "(1 token reads 2 bad pools)")


def _write_expected(codes: list[str]) -> None:
    """Write the named codes' expected findings (by hand, for a new code or a change
    of its findings; read each against its trace before committing it)."""
    FIXTURES.mkdir(parents=True, exist_ok=True)
    for code in codes:
        path = expected_path(code)
        found = findings_of(code)  # one finding a line
        path.write_text("[\n" + ",\n".join(json.dumps(f) for f in found) + "\n]\n")
        print(f"wrote {path.relative_to(ROOT)}: read it against the trace", file=sys.stderr)


if __name__ == "__main__":
    if not sys.argv[1:] or any(c not in CODES for c in sys.argv[1:]):
        sys.exit(f"usage: python tests/test_codes.py CODE...  (codes: {', '.join(CODES)})")
    _write_expected(sys.argv[1:])


# -- a new code is one module and its fixture ---------------------------------------------

KP009 = '''"""KP009 many-pools: a ubatch marks more pools than it has tokens (a throw-away rule
of tests/test_codes.py, showing that a code is one module and its fixture)."""

from __future__ import annotations

from ... import wording as words
from ...contracts.finding import Code, Finding
from ...engine.context import UbatchContext
from ..rule import LAYOUT, Check as RuleCheck, Explanation, doc

CODE = Code("KP009", "many-pools", "warning", "a ubatch marks more pools than it has tokens")

EXPLANATION = Explanation(
    CODE,
    oneline="more pools re-pooled than tokens decoded",
    what=doc("Flags a ubatch whose marking re-pools more pools than it decodes tokens."),
    why=doc("Host work that grows with the cache, not with the batch."),
    example=doc("""
        kpool_trace: 1
        cache: {kv_size: 16, kpool: 2, n_seq_max: 2}
        ops:
          - decode: {seq: 0, pos: 0..8}
          - seq_rm: {seq: 0, p0: 0, p1: 1}
          - decode: {seq: 0, pos: 8}"""),
    engine="rep-once",
    fix=doc("Re-pool what changed."),
)


class Check(RuleCheck):
    reads = LAYOUT

    def at_ubatch(self, ctx: UbatchContext) -> list[Finding]:
        n = 0 if ctx.plan is None else int((ctx.plan.entry_pool >= 0).sum())
        if n <= ctx.token_pos.size:
            return []
        tokens = words.counted(ctx.token_pos.size, "token", number=str)
        return [Finding(CODE, f"{n} pools re-pooled for {tokens}")]
'''


def test_a_new_code_is_one_module(tmp_path: Path) -> None:
    """Copy kpool, add verdict/rules/kp009_many_pools.py and nothing else: the replay
    raises it, the report carries it, `kpool explain` knows it."""
    import shutil
    import subprocess
    import sys

    shutil.copytree(ROOT / "kpool_cli", tmp_path / "kpool_cli",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "kpool_cli" / "verdict" / "rules" / "kp009_many_pools.py").write_text(KP009)
    example = tmp_path / "example.yaml"
    example.write_text("kpool_trace: 1\ncache: {kv_size: 16, kpool: 2, n_seq_max: 2}\n"
                       "ops:\n  - decode: {seq: 0, pos: 0..8}\n"
                       "  - seq_rm: {seq: 0, p0: 0, p1: 1}\n  - decode: {seq: 0, pos: 8}\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}

    def kpool(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "kpool_cli", *args], env=env,
                              cwd=tmp_path, capture_output=True, text=True, timeout=120)

    r = kpool("replay", str(example), "--backend", "none", "--format", "json")
    assert r.returncode == 0, r.stderr  # a warning does not fail
    doc_ = json.loads(r.stdout)
    found = [f for u in doc_["ubatches"] for f in u["findings"] if f["code"] == "KP009"]
    # the seq_rm of pos 0 stales seq 0 from 0: the 1-token decode re-pools all 4 pools
    assert [f["message"] for f in found] == ["4 pools re-pooled for 1 token"]
    assert doc_["summary"]["findings"] == {"KP009": 1}
    r = kpool("explain", "KP009")
    assert r.returncode == 0 and "many-pools" in r.stdout
    assert "KP009" in kpool("explain", "--list").stdout
    # and the suite asks for its fixture (tests/fixtures/codes/KP009.findings.json)
    assert not expected_path("KP009").is_file()
