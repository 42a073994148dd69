"""The CPU hog that `make test-loaded` runs the measuring tests beside: it keeps its processes spinning for the
block and stops them when the block ends, however it ends."""

from __future__ import annotations

import os

import pytest

from tests.load import cpu_hog, hog_processes


def _cpu_ticks(pid: int) -> int:
    """User plus system clock ticks the process has run (Linux)."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="reads /proc")
def test_the_hog_spins_and_is_stopped_when_the_block_ends():
    import time

    with cpu_hog(2) as hogs:
        assert len(hogs) == 2 and all(h.poll() is None for h in hogs)
        pids = [h.pid for h in hogs]
        # each spins: it runs on the CPU rather than sleeping (however slowly a loaded machine lets it)
        deadline = time.monotonic() + 60
        while not all(_cpu_ticks(pid) > 0 for pid in pids):
            assert time.monotonic() < deadline, "a hog never ran"
            time.sleep(0.05)
    assert all(h.returncode is not None for h in hogs) and all(_gone(pid) for pid in pids)


def test_the_hog_is_stopped_when_the_block_raises():
    with pytest.raises(RuntimeError, match="a failing test"):
        with cpu_hog(1) as hogs:
            raise RuntimeError("a failing test")
    assert hogs[0].returncode is not None and _gone(hogs[0].pid)


def test_a_hog_stops_by_itself_at_its_limit():
    with cpu_hog(1, limit_s=0.2) as hogs:
        assert hogs[0].wait(timeout=60) == 0  # the time bound, not the block's end


def test_the_loaded_run_keeps_one_hog_per_core_unless_told(monkeypatch):
    monkeypatch.delenv("SIMULATOR_TEST_HOG", raising=False)
    assert hog_processes() == (os.cpu_count() or 2)
    monkeypatch.setenv("SIMULATOR_TEST_HOG", "3")
    assert hog_processes() == 3
