"""Keep the machine's cores busy while a test measures it, so that a test that only passes on a quiet machine
fails here rather than on a user's.

``cpu_hog(processes)`` starts that many processes that spin on the CPU and stops them when the block ends,
however it ends. Each one also stops by itself after ``limit_s`` and when the process that started it dies,
so a hog never outlives the test run.

As a pytest plugin (``pytest -p tests.load``, what ``make test-loaded`` runs) it wraps every test marked
``measures`` in a hog of $SIMULATOR_TEST_HOG processes (default: one per core).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest

HOG_LIMIT_S = 900.0  # longer than any measuring test; a hog left behind by a killed run stops by itself
# Spins until its time is up; asks the kernel to kill it with its parent (Linux), so a run killed outright
# leaves nothing spinning.
_SPIN = """
import ctypes, signal, sys, time
try:
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
except (OSError, AttributeError):
    pass
end = time.monotonic() + float(sys.argv[1])
x = 0
while time.monotonic() < end:
    for _ in range(100_000):
        x += 1
"""


@contextlib.contextmanager
def cpu_hog(processes: int | None = None, limit_s: float = HOG_LIMIT_S) -> Iterator[list[subprocess.Popen]]:
    """``processes`` busy processes (default: one per core) for the block; stopped when it ends."""
    count = processes if processes is not None else (os.cpu_count() or 2)
    hogs: list[subprocess.Popen] = []
    try:
        for _ in range(count):
            hogs.append(subprocess.Popen([sys.executable, "-c", _SPIN, str(limit_s)], stdin=subprocess.DEVNULL,
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        yield hogs
    finally:
        for hog in hogs:
            if hog.poll() is None:
                hog.send_signal(signal.SIGKILL)
        for hog in hogs:
            hog.wait()


def hog_processes() -> int:
    """How many busy processes a loaded run keeps: $SIMULATOR_TEST_HOG, else one per core."""
    text = os.environ.get("SIMULATOR_TEST_HOG", "")
    return int(text) if text.strip() else (os.cpu_count() or 2)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item):
    if item.get_closest_marker("measures") is None:
        yield
        return
    with cpu_hog(hog_processes()):
        yield
