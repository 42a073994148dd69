"""A progress bar for a person watching a terminal: never in a log, a pipe, ``--json`` or the stream a test
reads, so what a command prints never depends on it."""

from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import Callable, Iterator


@contextmanager
def terminal_progress(desc: str, unit: str, quiet: bool = False) -> Iterator[Callable[[int, int], None]]:
    """``progress(done, total)`` drawing a tqdm bar on stderr when it is a terminal (and not ``quiet``); the bar
    is closed on the way out, however the work ends."""
    bar = None

    def progress(done: int, total: int) -> None:
        nonlocal bar
        if quiet or not sys.stderr.isatty():
            return
        if bar is None:
            from tqdm import tqdm

            bar = tqdm(total=total, desc=desc, unit=unit, leave=False, file=sys.stderr)
        bar.total = max(total, done)  # a walk that learns of more work as it goes
        bar.update(done - bar.n)

    try:
        yield progress
    finally:
        if bar is not None:
            bar.close()
