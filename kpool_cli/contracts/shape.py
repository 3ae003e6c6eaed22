"""The shape of a run at a glance: per-ubatch series folded into a few bins as the
records stream by, for the replay's and the diff's summaries (drawn by
`wording.sparkline`).

Owns: `Series` (a per-ubatch series of one count, folded into at most `2 * width`
bins, each the largest value of the ubatches it holds) and `Shape` (a run's two
series: pools marked and cells scanned per ubatch).

Invariants: a series holds O(width) numbers whatever the run's length (a bin's width
doubles when the bins run out, two neighbours merged into one); bin i covers
ubatches `i * per .. (i + 1) * per - 1`, the last one possibly fewer.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .records import UbatchRecord

WIDTH = 40  # sparkline characters (a series keeps between WIDTH and 2 * WIDTH bins)


@dataclass(slots=True)
class Series:
    """One count per ubatch, folded into bins of `per` ubatches (their largest)."""

    width: int = WIDTH
    per: int = 1
    bins: list[int] = field(default_factory=list)
    n: int = 0  # ubatches added
    peak: int = 0
    peak_at: int = 0  # the index of the first ubatch with the peak

    def add(self, value: int, index: int) -> None:
        if self.n % self.per == 0 and len(self.bins) == 2 * self.width:
            self.bins = _pairs(self.bins)
            self.per *= 2
        if self.n % self.per == 0:
            self.bins.append(value)
        else:
            self.bins[-1] = max(self.bins[-1], value)
        if value > self.peak:
            self.peak, self.peak_at = value, index
        self.n += 1

    def folded(self, limit: int | None = None, per: int = 1) -> tuple[list[int], int]:
        """At most `limit` (default `width`) values, each the largest of `per'` ubatches
        (`per'` at least `per`: give two series one `per` to line them up), and `per'`."""
        limit = self.width if limit is None else max(limit, 1)
        values, each = list(self.bins), self.per
        while len(values) > limit or each < per:
            values, each = _pairs(values), 2 * each
        return values, each


def _pairs(values: list[int]) -> list[int]:
    """Each two neighbours folded into their largest."""
    return [max(values[i:i + 2]) for i in range(0, len(values), 2)]


@dataclass(slots=True)
class Shape:
    """A run's shape: pools marked (n_new) and cells scanned per ubatch."""

    marked: Series = field(default_factory=Series)
    scanned: Series = field(default_factory=Series)

    def add(self, rec: UbatchRecord) -> None:
        self.add_counts(rec.n_new, int(rec.cost.get("cells_scanned", 0)), rec.index)

    def add_counts(self, marked: int, scanned: int, index: int) -> None:
        self.marked.add(marked, index)
        self.scanned.add(scanned, index)

    def series(self) -> tuple[tuple[str, Series], ...]:
        """(what, series), the series that have a ubatch."""
        return tuple((what, s) for what, s in (("pools marked", self.marked),
                                               ("cells scanned", self.scanned)) if s.n)
