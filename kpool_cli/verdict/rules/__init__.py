"""The finding codes (ENGINE.md §8), one module each, as ruff keeps one file per rule.

Owns: `RULES`, every rule module in code order. A rule module is named for its code
(`kp001_scatter_race` for KP001 scatter-race) and holds its `CODE` (`rule.Code`),
its `EXPLANATION` (`rule.Explanation`, what `kpool explain` prints) and its check,
run over the replay's `context.UbatchContext`, or, for a code the replay raises
from an exception (KP005, KP006, KP008), the function that builds the finding.

Adding a code: a new module here, added to `RULES`, a call where the replay runs
it, and its committed findings (tests/test_codes.py says how). The registry
(`codes.CODES`), `kpool explain` and everything else derive from `RULES`.

Invariants (held by tests/test_codes.py): `RULES` is every module of this package,
in code order, each code once; a code's string is written in its module only; each
explanation's example raises its code, and exactly its committed findings.
"""

from __future__ import annotations

from . import (
    kp001_scatter_race,
    kp002_rep_conflict,
    kp003_stale_read,
    kp004_pad_collision,
    kp005_engine_abort,
    kp006_decode_rejected,
    kp007_layout_drift,
    kp008_edit_refused,
)

RULES = (
    kp001_scatter_race,
    kp002_rep_conflict,
    kp003_stale_read,
    kp004_pad_collision,
    kp005_engine_abort,
    kp006_decode_rejected,
    kp007_layout_drift,
    kp008_edit_refused,
)
