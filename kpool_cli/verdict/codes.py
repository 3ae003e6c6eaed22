"""The registry of finding codes (ENGINE.md §8), derived from the rule modules.

Owns: `CODES` (code -> `Code`, in code order) and `VALUE_CODES`, both read from
`rules.RULES`: a code's number, name, severity and summary live in its rule module
only. Re-exports the finding record and its parts (`finding.py`) and `Code`
(`rule.py`) for the modules that read findings.

Codes are a public contract: never renumber one, never reuse a retired one.
Severity decides the exit status (`--fail-on`).
"""

from __future__ import annotations

from .finding import (
    EVIDENCE_ROWS,
    SEVERITIES,
    CodeLookup,
    Finding,
    PoolIds,
    severity_rank,
)
from .rule import Code
from .rules import RULES

__all__ = ["CODES", "EVIDENCE_ROWS", "SEVERITIES", "VALUE_CODES", "Code", "CodeLookup",
           "Finding", "PoolIds", "severity_rank"]

CODES: dict[str, Code] = {r.CODE.code: r.CODE for r in RULES}

# codes only a value backend can raise (a model-only replay does not look for them)
VALUE_CODES = frozenset(c.code for c in CODES.values() if c.values_only)
