"""The finding codes (ENGINE.md §8), one module each, as ruff keeps one file per rule.

Owns: `RULES`, every rule module of this package in code order, found by their names
(`kp001_scatter_race` for KP001 scatter-race): a module `kpNNN_name.py` here is a
rule, and nothing else names it. Each holds its `CODE` (`contracts.finding.Code`),
its `EXPLANATION` (`rule.Explanation`, what `kpool explain` prints) and its `Check`
(`rule.Check`: the entry points the replay calls).

Adding a code: a new module here and its committed findings (tests/test_codes.py says
how); the registry (`codes.CODES`), the replay's checks, `kpool explain` and
everything else derive from `RULES`.

Invariants (held by tests/test_codes.py): a module's name starts with its code in
lower case; each code once; a code's string is written in its module only; each
explanation's example raises its code, and exactly its committed findings.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from types import ModuleType

_RULE_MODULE = re.compile(r"kp\d{3}_[a-z0-9_]+")


def _discover() -> tuple[ModuleType, ...]:
    found = []
    for info in pkgutil.iter_modules(__path__):
        if _RULE_MODULE.fullmatch(info.name):
            mod = importlib.import_module(f"{__name__}.{info.name}")
            assert mod.CODE.code.lower() == info.name[:5], (info.name, mod.CODE.code)
            found.append(mod)
    found.sort(key=lambda m: m.CODE.code)
    return tuple(found)


RULES: tuple[ModuleType, ...] = _discover()
