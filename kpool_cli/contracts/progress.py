"""What long work tells a progress bar, without knowing how (or whether) one is drawn.

Owns: `Progress`, the protocol a renderer's bar satisfies (`report.terminal.Ticker`):
work that can take long (the diff's replays) takes one and sets its `total`,
`label` and `unit` and calls `tick`; the command that runs the work makes the bar
and closes it. So no layer below the renderers imports one.
"""

from __future__ import annotations

from typing import Protocol


class Progress(Protocol):
    total: int  # how many units the work plans (it may grow)
    label: str  # what is being done now (shown as given: make it visible first)
    unit: str  # what a tick counts ("ubatches", "replays", ...)

    def tick(self, n: int = 1) -> None: ...
