"""`search --rank-by expected-days`: plans ordered by wall seconds per useful iteration, failures counted."""

from __future__ import annotations

import pytest

from simulator.estimator.goodput import GoodputSettings, effective_iteration_time_s
from simulator.planner.plan_search import SearchRequest, search
from simulator.spec.catalog import load_model
from simulator.spec.hardware import load_cluster
from simulator.spec.plan import Job


@pytest.mark.parametrize("settings", [GoodputSettings(), GoodputSettings(mtbf_gpu_hours=500, async_save=True)])
def test_plans_are_ordered_by_their_expected_seconds_per_iteration(settings):
    req = SearchRequest(model=load_model("gpt3-1.3b"), cluster=load_cluster("dgx-a100-80gb"), num_gpus=64,
                        global_batch_size=512, rank_by="expected-days", goodput=settings)
    result = search(req, top=4)
    keys = [r.rank_key_s for r in result.plans]
    assert keys == sorted(keys)
    for r in result.plans:
        job = Job(model=req.model, cluster=req.cluster, plan=r.plan)
        assert r.rank_key_s == pytest.approx(effective_iteration_time_s(job, r.estimate.iteration_time_s, settings))
        assert r.rank_key_s >= r.estimate.iteration_time_s
