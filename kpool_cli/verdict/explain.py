"""`kpool explain CODE`: what a finding code means, written like ruff's rule docs
(DESIGN.md "Rule modules"): What it does, Why is this bad?, Example (a minimal trace),
How to fix the engine. The rich view quotes `oneline` under each finding.

Owns: the plain rendering (`explain_text`), reading a code from what a user types
(`resolve`), and `EXPLANATIONS`, gathered from the rule modules (each code's text
lives in its module, `rules/kpNNN_*.py`; same keys as `codes.CODES`).
"""

from __future__ import annotations

import textwrap

from .. import wording as words
from .codes import CODES
from .rule import Explanation
from .rules import RULES

__all__ = ["EXPLANATIONS", "Explanation", "explain_text", "resolve"]


EXPLANATIONS: dict[str, Explanation] = {r.CODE.code: r.EXPLANATION for r in RULES}


def _fill(text: str, width: int, initial: str, subsequent: str) -> str:
    """`text` on lines of at most `width` columns, broken at spaces only: never inside
    a word, `cache-safe` or `--fail-on` (textwrap breaks at hyphens by default)."""
    return textwrap.fill(text, width, initial_indent=initial, subsequent_indent=subsequent,
                         break_on_hyphens=False, break_long_words=False)


def explain_text(code: str) -> str:
    """The plain text of `kpool explain CODE` (ruff's headings)."""
    e = EXPLANATIONS[code]
    ind = textwrap.indent
    return "\n".join([
        f"{words.code(e.code, e.name)} ({e.severity})",
        "",
        _fill(f"{e.oneline}.", 78, "  ", "  "),
        "",
        "What it does",
        ind(e.what, "  "),
        "",
        "Why is this bad?",
        ind(e.why, "  "),
        "",
        _fill(f"Example (under {e.under})", 80, "", "  "),
        ind(e.example, "    "),
        *([f"  {e.plugin_intro}", ind(e.plugin_module, "    ").rstrip("\n")]
          if e.plugin_module else []),
        "",
        f"  $ {e.command}",
        "",
        "How to fix the engine",
        ind(e.fix, "  "),
        "",
    ])


def resolve(word: str) -> str | None:
    """A code from `KP001`, `kp1`, `1` or a name (`scatter-race`). The number is ASCII
    digits (`str.isdigit` also takes `²` and `١`, which `int` refuses or reads), of at
    most three past its leading zeros (`int` refuses more than 4,300)."""
    w = word.strip().lower()
    for c in CODES.values():
        if w == c.name:
            return c.code
    digits = (w[2:] if w.startswith("kp") else w).lstrip("0") or "0"
    if digits.isascii() and digits.isdigit() and len(digits) <= 3:
        code = f"KP{int(digits):03d}"
        return code if code in CODES else None
    return None
