"""The registry of finding codes (ENGINE.md §8), derived from the rule modules.

Owns: `CODES` (code -> `contracts.finding.Code`, in code order) and `VALUE_CODES`,
both read from `rules.RULES`: a code's number, name, severity and summary live in
its rule module only. No rule imports this module.

Codes are a public contract: never renumber one, never reuse a retired one.
Severity decides the exit status (`--fail-on`).
"""

from __future__ import annotations

from ..contracts.finding import Code
from .rules import RULES

CODES: dict[str, Code] = {r.CODE.code: r.CODE for r in RULES}

# codes only a value backend can raise (a model-only replay does not look for them)
VALUE_CODES = frozenset(c.code for c in CODES.values() if c.values_only)
