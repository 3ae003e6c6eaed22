"""The text of `kpool fuzz`: its progress bar on stderr and its summary table.

Owns: `FuzzBar` (runs, findings, shrinks, on stderr, only on a terminal) and
`render_summary` (a table of codes, signatures, counts, first seeds and the shrunk
files). Renderers read a campaign's `Progress`; they never count.
"""

from __future__ import annotations

import os

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from ..gen.fuzz import Progress as Totals
from ..wording import visible


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
                           info=f"findings {len(t.counts)}  shrinks {t.shrinks}")

    def close(self) -> None:
        if self._p is not None:
            self._p.stop()


def render_summary(console: Console, t: Totals, files: dict[tuple[str, str], str],
                   engine: str, seconds: float) -> None:
    """The campaign's table: one row per (code, signature)."""
    console.print(f"kpool fuzz: {t.runs} runs under {visible(engine)} in {seconds:.1f} s; "
                  f"{t.rejected} with a refused decode (KP006, not a finding)")
    if not t.counts:
        console.print("no finding, no defect")
        return
    folders = sorted({os.path.dirname(p) for p in files.values()})
    if len(folders) == 1:  # the usual case: name the folder once, the files by name
        console.print(f"shrunk traces in {visible(folders[0] or '.')}/")
        shown = {k: os.path.basename(p) for k, p in files.items()}
    else:
        shown = dict(files)
    table = Table("code", "runs", "first seed")
    table.add_column("where (op, path)", overflow="fold")
    table.add_column("shrunk trace", overflow="fold")
    for (code, sig), n in sorted(t.counts.items()):
        first = t.first.get((code, sig))
        where = sig.removeprefix(f"{code}/")  # the signature is code/op/path
        table.add_row(code, str(n), str(first.seed) if first else "-", visible(where),
                      visible(shown.get((code, sig), "-")))
    console.print(table)
    for (code, sig), (seed, msg) in sorted(t.defects.items()):
        console.print(f"kpool defect {code} ({sig}), seed {seed}: {visible(msg)}")
