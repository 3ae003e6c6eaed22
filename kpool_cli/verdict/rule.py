"""What a rule module (`verdict/rules/kpNNN_*.py`) declares, and the parts rules share.

Owns: `Code` (a code's number, name, severity and one-line summary), `Explanation`
(what `kpool explain` prints: written like ruff's rule docs, STYLE.md §3), and the
helpers more than one rule uses: `AppearanceFilter` (a persisting condition
reported where it appears) and `doc` (an explanation's paragraphs). Messages word
rows, pools and ranges with `kpool_cli.wording`.

Invariants: an `Explanation.example` is a minimal trace that loads with
`load_trace_text` and raises its code when replayed under `version()` (with a value
backend when the code is a value-only one); tests/test_codes.py replays each and
holds its findings to the committed ones.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, field, replace
from typing import Any

from ..engine.versions import VERSIONS, EngineVersion
from .finding import CodeLookup


@dataclass(frozen=True, slots=True)
class Code:
    """A finding code. Codes are a public contract: never renumber one, never reuse a
    retired one. Severity decides the exit status (`--fail-on`). `values_only`: only
    a value backend can raise it (a model-only replay does not look for it)."""

    code: str
    name: str
    severity: str
    summary: str
    values_only: bool = False


@dataclass(frozen=True, slots=True)
class Explanation(CodeLookup):
    code: str
    oneline: str  # why it matters, in one line (the rich view's finding panels)
    what: str
    why: str
    example: str  # a minimal YAML trace that raises the code under `version()`
    engine: str  # the registered engine the example runs under (or the plug-in's base)
    fix: str
    # the EngineVersion fields a plug-in engine replaces in `engine` when the example
    # needs one (its `kpool explain` line shows them as replace() arguments)
    replaces: dict[str, Any] = field(default_factory=dict, hash=False)

    @property
    def plugin(self) -> str:
        """The replace() arguments of the example's plug-in engine ('' for none)."""
        return ", ".join(f'{k}="{v}"' if isinstance(v, str) else f"{k}={v!r}"
                         for k, v in self.replaces.items())

    @property
    def needs_values(self) -> bool:
        """The example needs a value backend (not --backend none)."""
        from .codes import CODES

        return CODES[self.code].values_only

    @property
    def command(self) -> str:
        if self.replaces:
            return "kpool replay example.yaml --engine mypkg.myengine:Version"
        return f"kpool replay example.yaml --engine {self.engine}"

    def version(self) -> EngineVersion:
        """The engine the example runs under."""
        return replace(VERSIONS[self.engine], **self.replaces)


def doc(text: str) -> str:
    """An explanation's paragraph or example, written indented in its module."""
    return textwrap.dedent(text).strip()


class AppearanceFilter:
    """Reports a persisting condition once, where it appears; it may appear again
    after it has cleared. Keys identify the condition (a row, a sequence)."""

    def __init__(self) -> None:
        self._active: set = set()

    def new(self, keys: set) -> set:
        fresh = keys - self._active
        self._active = set(keys)
        return fresh
