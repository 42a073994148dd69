"""Shared fixtures and the hypothesis profile (bounded so the suite stays fast on two cores)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from simulator.spec.catalog import PRESETS
from simulator.spec.hardware import load_cluster

REPO = Path(__file__).resolve().parent.parent
PUBLISHED = REPO / "calibration" / "published"

settings.register_profile("default", max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("thorough", max_examples=1000, deadline=None)
settings.load_profile("default")


@pytest.fixture(scope="session")
def a100_80gb():
    return load_cluster("dgx-a100-80gb")


@pytest.fixture(scope="session")
def gpt3_175b():
    return PRESETS["gpt3-175b"]


@pytest.fixture(scope="session")
def published_dir() -> Path:
    """The repo's copy of the published reference data (never ../shared)."""
    return PUBLISHED


def pytest_terminal_summary(terminalreporter):
    """What the fuzz tests' cases ended in (tests/test_fuzz.py), when any ran."""
    from tests import fuzz_tally

    lines = fuzz_tally.summary()
    if lines:
        terminalreporter.section("fuzz cases")
        for line in lines:
            terminalreporter.write_line(line)
