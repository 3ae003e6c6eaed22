"""The progress bar of the long commands (`report.ticking.progress_bar`, the replay's
`Ticker`): `kpool diff`'s replays, `kpool gen`'s writing, `kpool check`, `kpool
validate`. On stderr, only on a terminal, after its delay; never when stderr is piped."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

import kpool_cli.report.text as text_mod
import kpool_cli.report.ticking as ticking_mod
from kpool_cli.cli import cli
from kpool_cli.diff.runs import Unit, run_units
from kpool_cli.gen.scenarios import SCENARIOS
from kpool_cli.replay import planned_ubatches
from kpool_cli.report.terminal import Manners, Ticker, make_console
from kpool_cli.trace.load import load_trace
from kpool_cli.trace.write import dump_trace

ROOT = Path(__file__).resolve().parent.parent
RACE = ROOT / "traces" / "shared-prefix-race.yaml"


@pytest.fixture
def shown(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Ticker, io.StringIO]]:
    """Every `progress_bar` made: on a terminal-like console, with no delay."""
    made: list[tuple[Ticker, io.StringIO]] = []

    def bar(total: int, label: str, *, unit: str = "ubatches", quiet: bool = False,
            color: bool | None = None, shares_terminal: bool = False) -> Ticker:
        buf = io.StringIO()
        t = Ticker(make_console(buf, Manners(True, True, 100)), total, label, delay=0,
                   shares_terminal=shares_terminal, unit=unit)
        made.append((t, buf))
        return t

    monkeypatch.setattr(ticking_mod, "progress_bar", bar)
    return made


def test_diff_replays_tick_one_bar_over_base_and_head(shown) -> None:
    units = [Unit(str(RACE), e, "none") for e in ("cache-safe", "rep-once")]
    summaries = run_units(units, progress=ticking_mod.progress_bar(0, "kpool diff"))
    assert len(summaries) == 2
    (ticker, buf), = shown
    planned = planned_ubatches(load_trace(RACE))
    assert ticker.total == 2 * planned and ticker.done == 2 * planned
    assert "shared-prefix-race (rep-once)" in ticker.label and "ubatches" in buf.getvalue()


def test_diff_on_a_pool_ticks_the_replays(shown) -> None:
    units = [Unit(str(RACE), e, "none") for e in ("cache-safe", "rep-once")]
    run_units(units, jobs=2, progress=ticking_mod.progress_bar(0, "kpool diff"))
    (ticker, _), = shown
    assert ticker.unit == "replays" and ticker.done == ticker.total == 2


def test_gen_writes_the_same_text_ticking_its_ops(shown) -> None:
    out = io.StringIO()
    trace = SCENARIOS["server"].generate(3, slots=4, requests=20, steps=30)
    bar = ticking_mod.progress_bar(0, "kpool gen server", unit="ops")
    text_mod.write_trace(out, trace, bar)
    bar.close()
    assert out.getvalue() == dump_trace(trace)
    (ticker, buf), = shown
    assert ticker.done == ticker.total == len(trace.ops) and " ops " in buf.getvalue()


def test_each_item_hides_a_shared_bar_and_the_end_erases_it() -> None:
    buf = io.StringIO()
    t = Ticker(make_console(buf, Manners(True, True, 80)), 3, "kpool check", delay=0,
               shares_terminal=True, unit="runs")
    seen = []
    for item in ticking_mod.ticking_each(iter("abc"), t):
        assert t._progress is None  # off the terminal while the caller writes
        seen.append(item)
    assert seen == ["a", "b", "c"] and t.done == 3 and t._progress is None


def test_a_label_is_never_markup() -> None:
    buf = io.StringIO()
    t = Ticker(make_console(buf, Manners(True, True, 80)), 2, "[/] [bold]x", delay=0)
    t.tick()
    t.close()
    assert "[/] [bold]x" in buf.getvalue()


@pytest.mark.parametrize("args", [
    ["diff", str(RACE)],
    ["gen", "server", "--requests", "30"],
    ["check", str(ROOT / "traces"), "--backend", "none"],
    ["validate", str(ROOT / "traces")],
])
def test_piped_stderr_gets_nothing(args: list[str]) -> None:
    r = subprocess.run([sys.executable, "-m", "kpool_cli", *args], capture_output=True,
                       text=True, cwd=ROOT)
    assert r.returncode in (0, 1) and r.stderr == "", r.stderr


def test_cli_runner_output_is_unchanged_by_the_bar(tmp_path: Path) -> None:
    out = tmp_path / "g.yaml"
    r = CliRunner().invoke(cli, ["gen", "server", "--seed", "4", "-o", str(out)])
    assert r.exit_code == 0 and r.stderr == ""
    assert out.read_text() == dump_trace(SCENARIOS["server"].generate(4))
