"""The text of `kpool fuzz`: its progress bar on stderr and its summary table.

Owns: `FuzzBar` (runs, findings, shrinks, on stderr, only on a terminal) and
`render_summary` (a table of codes, signatures, counts, first seeds and the shrunk
files; under `--base`, a difference's row says `differs from BASE` where a finding's
names its op and path). Renderers read a campaign's `Progress`; they never count. A
file name is never wrapped: when the table would not fit the width with every name
whole, each finding takes two lines instead, its file on the second.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from rich import box
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from ..gen.fuzz import DIVERGED
from ..gen.fuzz import Progress as Totals
from ..versions import VERSIONS
from ..wording import count, counted, visible
from .view import Flow


class FuzzBar:
    """A progress bar of a campaign; does nothing without a console (not a terminal)."""

    def __init__(self, console: Console | None, total: int) -> None:
        self._p: Progress | None = None
        if console is not None:
            self._p = Progress(TextColumn("fuzz"), BarColumn(), MofNCompleteColumn(),
                               TextColumn("{task.fields[info]}"), TimeElapsedColumn(),
                               console=console, transient=True)
            self._task = self._p.add_task("fuzz", total=total, info="")
            self._p.start()

    def update(self, t: Totals) -> None:
        if self._p is not None:
            self._p.update(self._task, completed=t.runs,
                           info=f"findings {count(len(t.counts))}  shrinks {count(t.shrinks)}")

    def close(self) -> None:
        if self._p is not None:
            self._p.stop()


def render_summary(console: Console, t: Totals, files: dict[tuple[str, str], str],
                   engine: str, seconds: float, earlier: tuple[str, int] = ("", 0),
                   stopped: tuple[str, int] | None = None, next_seed: int | None = None,
                   replaced: Sequence[str] = ()) -> None:
    """The campaign's table: one row per (code, signature), or two lines per finding
    when a row with its file name whole would not fit the width; under `--engine all`,
    a line per finding with the versions that show it. `earlier`: the output folder
    and the traces it held before that this run did not write again, said last (a
    `kpool check` of the folder reads them too); `replaced`: the names of those it
    held with other contents that this run wrote over. `stopped`: what ended the
    campaign early (`interrupted`, `terminated`: a signal; `stopped by --time-budget`)
    and the runs it was to make, said first; with `next_seed`, the seed of the first
    run not made, so that the line after the table gives the options of the rest."""
    runs = (counted(t.runs, "run") if stopped is None
            else f"{stopped[0]} after {count(t.runs)} of {counted(stopped[1], 'run')}")
    console.print(Flow(hang=2).words(
        f"kpool fuzz: {runs} under {visible(engine)} in {seconds:.1f} s; "
        f"{count(t.rejected)} with a refused decode (KP006, not a finding)"))
    if not t.counts:
        console.print("no finding, no defect")
    else:
        _findings(console, t, files)
    folder, n = earlier
    if replaced:
        console.print(Flow(hang=2).words(
            f"replaced {counted(len(replaced), 'trace')} an earlier run had left in "
            f"{visible(folder)} under the same names: {', '.join(map(visible, sorted(replaced)))} "
            "(a trace's name says no engine: give each engine's campaign its own -o)"))
    if n:
        console.print(Flow(hang=2).words(
            f"{visible(folder)} also holds {counted(n, 'trace')} this run did not "
            f"write (an earlier run's): kpool check {visible(folder)} reads them too"))
    if stopped is not None and next_seed is not None and t.runs < stopped[1]:
        left = stopped[1] - t.runs
        console.print(Flow(hang=2).words(
            f"the other {counted(left, 'run')}: the same command with --seed {next_seed} "
            f"--runs {left}"))


def _findings(console: Console, t: Totals, files: dict[tuple[str, str], str]) -> None:
    """The table of findings and the lines after it (`render_summary`)."""
    folders = sorted({os.path.dirname(p) for p in files.values()})
    if len(folders) == 1:  # the usual case: name the folder once, the files by name
        console.print(f"shrunk traces in {visible(folders[0] or '.')}/", overflow="fold")
        shown = {k: os.path.basename(p) for k, p in files.items()}
    else:
        shown = dict(files)
    rows: list[tuple[str, ...]] = []
    for (code, sig), n in sorted(t.counts.items()):
        first = t.first.get((code, sig))
        # a finding's signature is code/op/path; a difference's (`--base`) diff/BASE
        where = sig.removeprefix(f"{code}/")
        if code == DIVERGED:
            where = f"differs from {where}"
        rows.append((code, count(n), str(first.seed) if first else "-", visible(where),
                     visible(shown.get((code, sig), "-"))))
    table = _table(("code", "runs", "first seed", "where (op, path)", "shrunk trace"), rows)
    wide = console.options.update_width(1 << 16)  # measured unclamped by the console's
    if console.measure(table, options=wide).maximum <= console.width:
        console.print(table)
    else:  # the file under its finding, on a line of its own
        console.print(_table(("code", "runs", "first seed", "where (op, path), shrunk trace"),
                             [row[:4] for row in rows], files=[row[4] for row in rows]))
    order = list(VERSIONS)
    for (code, sig), engines in sorted(t.versions.items()):
        by = [e for e in order if e in engines]
        console.print(Flow(hang=2).words(
            f"{code} {visible(sig.removeprefix(f'{code}/'))}: {', '.join(by)}"
            + (f" (not {', '.join(e for e in order if e not in engines)})"
               if len(by) < len(order) else "")))
    for (code, sig), (seed, msg) in sorted(t.defects.items()):
        console.print(Flow(hang=2).words(f"kpool defect {code} ({sig}), seed {seed}: "
                                         f"{visible(msg)}"))


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]],
           files: list[str] | None = None) -> Table:
    """The summary table, no cell wrapped (numbers are right-aligned); with `files`,
    each row is followed by a line with its file, in the last column."""
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, collapse_padding=True,
                  header_style="bold")
    for n, name in enumerate(header):
        # the last column folds only a name wider than the whole width
        table.add_column(name, no_wrap=n + 1 < len(header), overflow="fold",
                         justify="right" if n in (1, 2) else "left")
    for k, row in enumerate(rows):
        table.add_row(*row)
        if files is not None:
            table.add_row(*[""] * (len(header) - 1), Text(files[k], style="bold"),
                          end_section=False)
    return table
