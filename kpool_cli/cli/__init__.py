"""The `kpool` command line: parse, call, render, exit. Nothing else: what a replay
is, how records are counted and the exit code decided (contracts/tally.py,
contracts/exits.py), how reports are framed (report/json_report.py) and how the
views word things live elsewhere.

One module per command (`replay`, `diff`, `check` with `validate`, `gen`, `fuzz`,
`info` for explain, schema and engines), `options` (what several commands take),
`io` (loading inputs, refusing and opening outputs, failing) and `main` (the group
and the script). Exit status of every command (docs/FORMATS.md): 0 pass, 1 findings
at or above `--fail-on`, 2 bad usage, an invalid trace, or an internal error. Never
a traceback; `--output` files are written whole or not at all.
"""

from .main import cli, main, run

__all__ = ["cli", "main", "run"]
