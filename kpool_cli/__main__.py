"""`python -m kpool_cli`: the `kpool` command.

Python puts the current directory first on `sys.path` under `-m`; the installed
`kpool` script does not. Drop it, so a plug-in engine (`--engine module:Name`) is
looked up the same way however kpool is started: never from whatever directory
the command happens to run in.
"""

import contextlib
import os
import sys

_here = ""
with contextlib.suppress(OSError):  # a removed current folder: `run` says so
    _here = os.getcwd()
if sys.path and sys.path[0] in ("", _here):
    del sys.path[0]

from kpool_cli.cli import run  # noqa: E402 - after the path is mended

run()
