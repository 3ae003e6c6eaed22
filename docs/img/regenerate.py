"""Regenerate the README's images from the shipped traces, the way a user makes them.

    python docs/img/regenerate.py        # from the repository's root, kpool installed

- race-cache-safe.svg, race-rep-once.svg: `kpool replay
  traces/shared-prefix-race.yaml --engine E --svg FILE` at 100 columns (the rich view,
  self-contained: no font or script fetched);
- replay-server.png: `kpool replay traces/server-session.yaml --engine cache-safe
  --html PAGE`, and diff-mtp3.png: `kpool diff traces/mtp3-speculative.yaml --base
  rep-once --head tail-truncate --html PAGE`, each screenshotted (its top) by
  headless Chromium (Debian's `chromium`) with the network blocked.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
IMG = ROOT / "docs" / "img"


def kpool(*args: str) -> None:
    env = {**os.environ, "COLUMNS": "100"}
    r = subprocess.run([sys.executable, "-m", "kpool_cli", *args], cwd=ROOT, env=env,
                       stdout=subprocess.DEVNULL)
    if r.returncode not in (0, 1):  # 1: the trace has findings, as the race does
        sys.exit(f"kpool {' '.join(args)}: exit {r.returncode}")


def main() -> None:
    for engine in ("cache-safe", "rep-once"):
        kpool("replay", "traces/shared-prefix-race.yaml", "--engine", engine,
              "--svg", str(IMG / f"race-{engine}.svg"))
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        sys.exit("chromium is not installed (apt-get install chromium)")
    with tempfile.TemporaryDirectory() as tmp:
        replay, diff = Path(tmp) / "replay.html", Path(tmp) / "diff.html"
        kpool("replay", "traces/server-session.yaml", "--engine", "cache-safe", "--html",
              str(replay), "-o", str(Path(tmp) / "view.txt"))
        kpool("diff", "traces/mtp3-speculative.yaml", "--base", "rep-once", "--head",
              "tail-truncate", "--html", str(diff))
        for page, image in ((replay, "replay-server.png"), (diff, "diff-mtp3.png")):
            subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu",
                            "--hide-scrollbars", "--host-resolver-rules=MAP * ~NOTFOUND",
                            f"--user-data-dir={Path(tmp) / 'profile'}",
                            "--window-size=1000,1240", f"--screenshot={IMG / image}",
                            page.as_uri()], check=True, capture_output=True)


if __name__ == "__main__":
    main()
