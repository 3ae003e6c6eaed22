"""How the verification finds a sequence's pools to recheck, decided for every
sequence at once (`verify.py`, `Verifier._sequences`): the ways and the rule.

Owns: the ways (`NONE`, `NEW`, `LOOK`, `SCAN`) and `NO_TAIL`, which the kernels
`recheck_ways` and `least_pair` (and `recheck_one`, `recheck_many`, which run the
rule inside: kernels.py, their numpy twins in reference.py) and the verifier share,
with cache/cells.py's `NO_PAIR` (re-exported here).

The rule, per sequence s of the layout, from its pools (`start[s]:start[s + 1]`),
the verdicts kept (`n_bad[s]`), the pools the update kept (`kept[s]`) and whether
its pairs are known to equal the cache's (`known[s]`):
- `NEW` when the update cut, regrouped or added pools (`kept < n_bad` or
  `n_bad < n_pools`), else `NONE`;
- when a row changed since the last verification (`dirty`): `SCAN` for a sequence
  with pools whose pairs are not known equal; for one whose pairs are known equal
  and that kept pools, `SCAN` when there are too many changed rows to look up
  (`too_many`), else its `tail`, the pair of its last kept pool's rep
  (`rep_pos << CELL_BITS | cell`): the verifier makes it `LOOK` when a changed pair
  lies at or before it (`_DirtyPairs.lowest`). Every other sequence's tail is
  `NO_TAIL`, below every pair;
- `before`: the least changed pair, whoever holds it (`least_pair` of the changed
  cells), lies at or before some sequence's tail. Only then is `lowest` asked (or,
  in `recheck_many`, the same test over the stream's holders: a sequence holding a
  changed pair at or before its own tail looks up, which that kernel leaves to the
  general way).
"""

from __future__ import annotations

import numpy as np

from ..cache.cells import NO_PAIR

NONE, NEW, LOOK, SCAN = -1, 0, 1, 2
NO_TAIL = int(np.iinfo(np.int64).min)  # below every pair: no kept tail to look before
__all__ = ["LOOK", "NEW", "NONE", "NO_PAIR", "NO_TAIL", "SCAN"]
