"""The report's section on failures, checkpoints and restarts: the Llama 3 check it shows and its figure."""

from __future__ import annotations

import pytest

from simulator.outputs.figures import draw
from simulator.outputs.report_goodput import SAVE_COSTS_S, step_goodput


@pytest.fixture(scope="module")
def section():
    return step_goodput({})


def test_the_section_shows_llama3_against_its_paper(section):
    text = "\n".join(section["lines"])
    assert "| unexpected interruptions per day | 7.76 (419 in 54 days) | 7.76 |" in text
    assert "more than 90%" in text
    assert section["data"]["goodput"]["llama3"]["ettr"] > 0.90


def test_more_gpus_and_slower_saves_lower_the_ettr(section):
    (_, kind, data), = section["figures"]
    points = data["points"]
    for i in range(len(SAVE_COSTS_S)):
        ettr = [q["by_save_cost"][i]["ettr"] for q in points]
        assert ettr == sorted(ettr, reverse=True)
    for q in points:
        by_cost = [b["ettr"] for b in q["by_save_cost"]]
        assert by_cost == sorted(by_cost, reverse=True)


def test_the_figure_draws(section, tmp_path):
    (stem, kind, data), = section["figures"]
    summary = draw(kind, data, tmp_path / f"{stem}.png")
    assert (tmp_path / f"{stem}.png").stat().st_size > 0
    assert [a["ylabel"] for a in summary["axes"]] == ["ETTR (%)", "days", "% of the expected run"]
