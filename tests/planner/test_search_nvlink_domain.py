"""The search inside an NVLink domain: TP, EP, ETP and CP up to the GPUs NVLink joins, never past what Megatron allows."""

from __future__ import annotations

import itertools

import pytest

from simulator.estimator.memory import memory_plan
from simulator.planner.plan_search import SearchPins, SearchRequest, search
from simulator.planner.space import candidates, plan_template
from simulator.spec.catalog import PRESETS
from simulator.spec.errors import InfeasiblePlanError
from simulator.spec.hardware import load_cluster
from simulator.spec.plan import Job, ParallelPlan

NVL72, HGX, H100 = load_cluster("gb200-nvl72"), load_cluster("dgx-b200"), load_cluster("dgx-h100")


def _request(cluster, model="llama3-70b", gpus=128, gbs=128, **pins) -> SearchRequest:
    return SearchRequest(model=PRESETS[model], cluster=cluster, num_gpus=gpus, global_batch_size=gbs,
                         pins=SearchPins(**pins))


def _sizes(req: SearchRequest) -> tuple[set[int], set[int], set[int | None]]:
    tps, eps, etps = set(), set(), set()
    for c in candidates(req):
        tps.add(c.t), eps.add(c.ep), etps.add(c.etp)
    return tps, eps, etps


def test_tp_reaches_the_gpus_a_job_takes_of_an_nvl72_domain_and_stops_at_the_node_on_hgx():
    # llama3-70b: 64 heads, 8 KV groups; every power of two up to 64 divides its heads, FFN and vocabulary
    assert _sizes(_request(NVL72, gpus=256, pipeline_parallel_size=4, micro_batch_size=1))[0] == {
        1, 2, 4, 8, 16, 32, 64}
    assert _sizes(_request(HGX, gpus=256, pipeline_parallel_size=4, micro_batch_size=1))[0] == {1, 2, 4, 8}
    assert _sizes(_request(H100, gpus=256, pipeline_parallel_size=4, micro_batch_size=1))[0] == {1, 2, 4, 8}


def test_plans_past_a_node_inside_the_domain_pass_megatrons_rules_without_allow_tp_across_nodes():
    req = _request(NVL72, pipeline_parallel_size=2, micro_batch_size=1)
    template = plan_template(req)
    wide = [c for c in candidates(req) if c.t > 8 or (c.etp or 0) > 8]
    assert wide
    for c in itertools.islice(wide, 0, None, max(1, len(wide) // 40)):
        plan = ParallelPlan.model_validate(c.plan(template).model_dump())
        assert not plan.allow_tp_across_nodes
        Job(model=req.model, cluster=NVL72, plan=plan)


def test_experts_spread_over_the_whole_domain():
    # deepseek-v3-style: 256 experts; EP 64 fills a domain a job takes of an NVL72 rack
    _, eps, etps = _sizes(_request(NVL72, model="deepseek-v3-style", gpus=256, gbs=256, pipeline_parallel_size=1,
                                   micro_batch_size=1, tensor_parallel_size=1))
    assert {8, 16, 32, 64} <= eps
    assert etps <= {None, 1}


def test_a_search_on_gb200_takes_tp_16_and_its_plans_fit():
    req = _request(NVL72, model="llama3-8b", gpus=32, gbs=32, tensor_parallel_size=16, pipeline_parallel_size=1)
    result = search(req, top=3)
    assert result.plans
    for ranked in result.plans:
        assert ranked.plan.tensor_parallel_size == 16
        assert memory_plan(Job(model=req.model, cluster=NVL72, plan=ranked.plan)).fits
    # on HGX B200 TP 16 would cross InfiniBand: the search offers no such plan
    with pytest.raises(InfeasiblePlanError, match="satisfies the parallelism rules and the pinned dimensions"):
        search(_request(HGX, model="llama3-8b", gpus=32, gbs=32, tensor_parallel_size=16, pipeline_parallel_size=1),
               top=3)
