"""contracts/shape.py: a run's shape folded into a few bins as it streams, and
wording.sparkline. Numbers derived by hand."""

from __future__ import annotations

from kpool_cli.contracts.shape import Series
from kpool_cli.wording import sparkline


def test_a_short_series_keeps_one_bin_per_ubatch():
    s = Series(width=4)
    for i, v in enumerate([3, 6, 8]):
        s.add(v, i)
    assert s.folded() == ([3, 6, 8], 1)
    assert (s.peak, s.peak_at) == (8, 2)


def test_bins_double_when_they_run_out_each_the_largest_of_its_ubatches():
    """width 2: up to 4 bins. 9 values 1..9: after 4 bins [1 2 3 4] the 5th folds them
    to [2 4] (per 2), then 5, 6 -> [2 4 6], 7, 8 -> [2 4 6 8], 9 folds to [4 8] (per 4)
    and starts [4 8 9]; folded to at most 2: [8 9], 8 ubatches a bin."""
    s = Series(width=2)
    for i in range(9):
        s.add(i + 1, i)
    assert (s.bins, s.per) == ([4, 8, 9], 4)
    assert s.folded() == ([8, 9], 8)
    assert (s.peak, s.peak_at, s.n) == (9, 8, 9)


def test_the_first_peak_is_named():
    s = Series()
    for i, v in enumerate([1, 5, 5, 2]):
        s.add(v, 10 + i)
    assert (s.peak, s.peak_at) == (5, 11)


def test_sparkline_scales_to_the_largest_and_keeps_zero_lowest():
    """8 marks: 0 -> the lowest; v -> ceil(v * 7 / top), at least 1."""
    assert sparkline([0, 1, 4, 8]) == "▁▂▅█"  # ceil(7/8)=1, ceil(28/8)=4, 7
    assert sparkline([0, 0]) == "▁▁"
    assert sparkline([]) == ""
    assert sparkline([5]) == "█"
    assert sparkline([2, 9], top=4) == "▅█"  # one scale for two series: 9 > top clips
