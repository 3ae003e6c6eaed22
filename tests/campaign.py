"""What the opt-in campaign scripts (tests/campaign_*.py) share: a campaign's seeds
run in chunks on a process pool, and the listing of what failed. Not a test module."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from typing import TypeVar

R = TypeVar("R")
SHOWN = 20  # failures listed under a campaign's line


def chunked(fn: Callable[[tuple], R], head: tuple, seeds: list[int], size: int, jobs: int
            ) -> list[R]:
    """`fn((*head, chunk))` for each chunk of `size` seeds, in order, on `jobs`
    processes."""
    chunks = [(*head, seeds[i:i + size]) for i in range(0, len(seeds), size)]
    with ProcessPoolExecutor(jobs) as pool:
        return list(pool.map(fn, chunks))


def told(bad: list[str]) -> bool:
    """Print the first SHOWN failures, indented under the campaign's line; whether
    there was any."""
    for b in bad[:SHOWN]:
        print(f"  {b}")
    return bool(bad)
