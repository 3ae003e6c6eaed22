"""Exit statuses: the one table every command's exit goes through (TRACE_FORMAT.md,
"Report": 0 pass, 1 findings, 2 bad usage or input; README "Exit status").

Owns: `PASS`, `FINDINGS`, `BAD_INPUT`, the statuses of a signal or a closed stdout
(`INTERRUPTED` 130, `BROKEN_PIPE` 141, as a shell reports a process killed by it;
`ended_by(signum)` for every signal that ends a run as a termination: 128 + its
number, SIGTERM 143, SIGHUP 129), `worst` (the status of a command over several
runs: the highest of 0, 1, 2) and `of_status` (a run's status word to its exit
status). Commands decide
*whether* a run passed (the tally, `check`, the diff's result); this says *which
number* that is.
"""

from __future__ import annotations

import signal
from collections.abc import Iterable

PASS = 0  # every run passed
FINDINGS = 1  # a finding at or above --fail-on, a failed expect, a change under --fail-on-change
BAD_INPUT = 2  # bad usage, an invalid input, an output refused, an internal error
INTERRUPTED = 128 + signal.SIGINT  # 130: Ctrl-C
BROKEN_PIPE = 128 + signal.SIGPIPE  # 141: stdout's reader left

_OF_STATUS = {"pass": PASS, "fail": FINDINGS, "aborted": FINDINGS, "invalid": BAD_INPUT}


def ended_by(signum: int) -> int:
    """The exit status of a run a termination signal ended (SIGTERM 143, SIGHUP 129,
    SIGQUIT 131, SIGXCPU 152, ...), as a shell reports a process it killed."""
    return 128 + signum


def of_status(status: str) -> int:
    """The exit status of a run whose status word is `status` (pass, fail, aborted,
    invalid)."""
    return _OF_STATUS[status]


def worst(codes: Iterable[int]) -> int:
    """The exit status of a command over several runs: the worst of theirs (0 when
    there are none)."""
    return max(codes, default=PASS)
