"""Output files that appear whole or not at all.

Owns: `written_whole(path)`, a context manager yielding a text stream on a
temporary file beside `path`, renamed over it only when the block completes; an
exception or an interrupt (KeyboardInterrupt included) removes the temporary and
leaves any earlier `path` untouched. The file gets the mode a new file would
(0666 less the umask), not mkstemp's 0600: reports and views are artifacts.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO


@contextlib.contextmanager
def written_whole(path: str) -> Iterator[TextIO]:
    target = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp",
                               dir=target.parent if str(target.parent) else ".")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            yield f
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_whole(path: str, text: str) -> None:
    with written_whole(path) as f:
        f.write(text)
