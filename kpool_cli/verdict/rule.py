"""What a rule module (`verdict/rules/kpNNN_*.py`) declares, and the parts rules share.

Every rule module holds, and nothing else needs to know of it:
- `CODE`, its `contracts.finding.Code` (number, name, severity, summary);
- `EXPLANATION`, an `Explanation`: what `kpool explain` prints, written like ruff's
  rule docs (DESIGN.md "Rule modules");
- `Check`, a subclass of `Check` below: the replay makes one per replay (so a check
  may remember what it reported: `AppearanceFilter`) and calls its entry points
  where the rule's facts are, never naming a code:
  - `at_op(op)`: an op outcome (`engine.context.OpContext`: an edit, or a decode
    refused before any ubatch ran);
  - `at_ubatch(ctx)`: a ubatch's engine facts (`engine.context.UbatchContext`);
  - `with_values(ctx, values, found)`: the same ubatch once the value backend ran,
    given the value facts (`backend.facts.ValueFacts`) and what `at_ubatch` found;
    it returns the findings that stand (by default `found` unchanged).
  `Check.reads` orders a ubatch's findings by the engine step they are about:
  `STEP` (the ubatch's own step failed: an abort), `LAYOUT` (the layout after its
  update), `PLAN` (the scatter plan, and the values it writes); within a step, in
  code order.

Owns: `Explanation`, `Check` (with `STEP`, `LAYOUT`, `PLAN`), `AppearanceFilter` (a
persisting condition reported where it appears) and `doc` (an explanation's
paragraphs). Messages word rows, pools and ranges with `kpool_cli.wording`. Imports
no rule and not the registry (`codes.py`), which derives from the rule modules.

Invariants: an `Explanation.example` is a minimal trace that loads with
`load_trace_text` and raises its code when replayed under `version()` (with a value
backend when the code is a value-only one); tests/test_codes.py replays each and
holds its findings to the committed ones.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, ClassVar

from ..contracts.finding import Code, Finding
from ..versions import VERSIONS, EngineVersion

if TYPE_CHECKING:
    from ..backend.facts import ValueFacts
    from ..engine.context import OpContext, UbatchContext

STEP, LAYOUT, PLAN = 0, 1, 2  # what a check reads, in the order of a ubatch's steps
# the module of an example's plug-in engine, beside its example.yaml (`kpool explain`)
PLUGIN_MODULE = "example_engine"


@dataclass(frozen=True, slots=True)
class Explanation:
    rule: Code
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
    def code(self) -> str:
        return self.rule.code

    @property
    def name(self) -> str:
        return self.rule.name

    @property
    def severity(self) -> str:
        return self.rule.severity

    @property
    def plugin(self) -> str:
        """The replace() arguments of the example's plug-in engine ('' for none)."""
        return ", ".join(f'{k}="{v}"' if isinstance(v, str) else f"{k}={v!r}"
                         for k, v in self.replaces.items())

    @property
    def needs_values(self) -> bool:
        """The example needs a value backend (not --backend none)."""
        return self.rule.values_only

    @property
    def under(self) -> str:
        """What the example runs under, as its heading says it: the engine (a plug-in's
        replace() of its base), with a value backend when it needs one."""
        engine = (f"a plug-in engine: replace({self.engine.upper().replace('-', '_')}, "
                  f"{self.plugin})" if self.replaces else self.engine)
        return engine + (", with a value backend (the default)" if self.needs_values else "")

    @property
    def plugin_intro(self) -> str:
        """The line before `plugin_module` ('' when the example needs no plug-in)."""
        return f"with {PLUGIN_MODULE}.py beside it:" if self.replaces else ""

    @property
    def plugin_module(self) -> str:
        """The plug-in example's engine as the module `PLUGIN_MODULE`.py that `command`
        runs beside example.yaml ('' when the example needs none)."""
        if not self.replaces:
            return ""
        base = self.engine.upper().replace("-", "_")  # its name in kpool_cli.versions
        return (f"from dataclasses import replace\n\nfrom kpool_cli.versions import {base}\n"
                f"\nVersion = replace({base}, {self.plugin})\n")

    @property
    def command(self) -> str:
        if self.replaces:
            return (f"PYTHONPATH=. kpool replay example.yaml --engine "
                    f"{PLUGIN_MODULE}:Version")
        return f"kpool replay example.yaml --engine {self.engine}"

    def version(self) -> EngineVersion:
        """The engine the example runs under."""
        return replace(VERSIONS[self.engine], **self.replaces)


class Check:
    """A rule's checks over one replay (see the module's docstring): every entry point
    finds nothing unless the rule's module says otherwise."""

    reads: ClassVar[int] = PLAN

    def at_op(self, op: OpContext) -> list[Finding]:
        return []

    def at_ubatch(self, ctx: UbatchContext) -> list[Finding]:
        return []

    def with_values(self, ctx: UbatchContext, values: ValueFacts, found: list[Finding]
                    ) -> list[Finding]:
        return found


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
