"""500 traces of the reference campaign (tests/campaign_reference.py) per engine
version: kpool's replay against tests/ref_cache.py (§2-§4) and tests/reference.py
(§5-§7) on random traces that include decodes larger than their stream and
whole-range seq_rm of every sequence; the campaign itself runs 10,000 per version
(docs/testing.md)."""

from __future__ import annotations

from collections import Counter

import pytest
from campaign_reference import VERSIONS, corners_of, run_one


@pytest.mark.parametrize("version", sorted(VERSIONS))
def test_500_random_traces_agree_with_both_references(version: str) -> None:
    seen: Counter = Counter()
    bad = []
    for seed in range(500):
        why, got = run_one(version, seed)
        seen.update(got)
        if why is not None:
            bad.append(why)
    assert not bad, bad[:5]
    # where the §2-§4 reference ran, the rules it aims at were reached
    assert all(seen[c] > 0 for c in corners_of(version)), {
        c: seen[c] for c in corners_of(version)}
