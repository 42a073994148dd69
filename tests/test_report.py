"""The committed report is what the code computes: regenerate it from scratch and compare."""

import json
from pathlib import Path

import pytest

from simulator.report import generate
from tests.close import assert_close

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def fresh(tmp_path_factory):
    out = tmp_path_factory.mktemp("reports")
    generate(out)
    return out


def test_the_committed_report_equals_a_fresh_one(fresh):
    assert (fresh / "README.md").read_text() == (REPO / "reports" / "README.md").read_text(), \
        "reports/ is stale: run `simulator report --out reports` and commit it"
    fresh_data = json.loads((fresh / "data" / "report.json").read_text())
    # the Markdown's rounded figures must match exactly; the raw numbers within a relative 1e-9, since
    # another machine's numpy or BLAS moves their last bits and not the physics
    assert_close(fresh_data, json.loads((REPO / "reports" / "data" / "report.json").read_text()),
                 hint="run `simulator report --out reports` and commit it")


def test_every_figure_the_report_shows_is_written(fresh):
    text = (fresh / "README.md").read_text()
    for name in ("pareto_gpt3_175b", "memory_breakdown", "pipeline_timeline", "days_vs_gpus"):
        assert f"figures/{name}.png" in text
        assert (fresh / "figures" / f"{name}.png").stat().st_size > 10_000
        assert (REPO / "reports" / "figures" / f"{name}.png").exists()


def test_the_headline_is_within_ten_percent_of_24_days(fresh):
    data = json.loads((fresh / "data" / "report.json").read_text())
    assert abs(data["headline"]["best_days"] / 24 - 1) <= 0.10
    assert data["headline"]["standard_days"] > data["headline"]["search_alone_days"] > data["headline"]["best_days"]
