"""Sentences of the report that explain a figure say what the figure's data says: the Pareto figure's star
is the search's best plan as the search ranks plans, and the caption counts the simulated plans drawn above
it that rank below it."""

from __future__ import annotations

import types

import pytest

from simulator.outputs.plots import RANKED_BY
from simulator.outputs.report import _pareto_caption
from simulator.outputs.report_scenarios import SCENARIOS, search_request
from simulator.planner.plan_search import SearchRequest, search
from simulator.spec.catalog import PRESETS
from simulator.spec.hardware import load_cluster


@pytest.fixture(scope="module")
def result():
    req = SearchRequest(model=PRESETS["gpt3-1.3b"], cluster=load_cluster("dgx-a100-80gb"), num_gpus=16,
                        global_batch_size=32)
    return search(req, top=4)


def test_the_pareto_caption_says_how_plans_are_ranked(result):
    caption = _pareto_caption(types.SimpleNamespace(full_space=result, scenario=SCENARIOS[0]))
    assert f"ranks plans by {RANKED_BY[search_request(SCENARIOS[0]).rank_by.value]}" in caption
    assert "slow end of their band" in caption  # the report's search ranks by the band's slow end


def test_the_pareto_caption_counts_the_faster_plans_ranked_below_the_star(result):
    # the slowest simulated plan first: every other simulated plan is faster on its prediction
    slowest_first = sorted(result.plans, key=lambda r: -r.estimate.iteration_time_s)
    faster = sum(r.estimate.iteration_time_s < slowest_first[0].estimate.iteration_time_s for r in slowest_first[1:])
    assert faster > 0
    caption = _pareto_caption(types.SimpleNamespace(full_space=result.model_copy(update={"plans": slowest_first}),
                                                    scenario=SCENARIOS[0]))
    assert f"{faster} of the {len(result.plans) - 1} plans simulated beside it" in caption
    assert "rank below it" in caption
