"""The band on each plan the search ranks: its own, as `plan` gives it, and around its iteration time."""

import pytest

from simulator.estimator.band import band, corners, widened
from simulator.planner.plan_search import SCREEN_MARGIN, SearchPins, SearchRequest, search
from simulator.spec.catalog import PRESETS
from simulator.spec.hardware import load_cluster
from simulator.schedule.screen import screen
from simulator.spec.plan import Job

H100, A100 = load_cluster("dgx-h100"), load_cluster("dgx-a100-80gb")
# Between them: MoE and dense models, both GPUs' profiles, plans whose constants act the other way from the
# best plan's (the MoE search's 7th to 10th plans), and plans no constant moves at all.
BAND_SEARCHES = {
    "qwen1.5-moe-512": (SearchRequest(model=PRESETS["qwen1.5-moe-a2.7b"], cluster=H100, num_gpus=512,
                                      global_batch_size=512,
                                      pins=SearchPins(recompute_granularity="full", use_distributed_optimizer=True)),
                        12),
    "mixtral-16": (SearchRequest(model=PRESETS["mixtral-8x7b"], cluster=H100, num_gpus=16, global_batch_size=64,
                                 pins=SearchPins(micro_batch_size=1, tensor_parallel_size=2)), 12),
    "gpt3-13b-64": (SearchRequest(model=PRESETS["gpt3-13b"], cluster=A100, num_gpus=64, global_batch_size=128), 12),
    "llama3-8b-16": (SearchRequest(model=PRESETS["llama3-8b"], cluster=H100, num_gpus=16, global_batch_size=64), 12),
}


@pytest.fixture(scope="module", params=sorted(BAND_SEARCHES))
def searched(request):
    req, top = BAND_SEARCHES[request.param]
    return req, search(req, top=top)


def test_every_plans_band_holds_its_iteration_time(searched):
    _, result = searched
    assert len(result.plans) > 1
    for p in result.plans:
        assert p.iteration_time_s_low <= p.estimate.iteration_time_s <= p.iteration_time_s_high, p.rank


def test_each_plans_band_is_the_one_plan_gives_it(searched):
    """The same corners as `plan` (each constant at the end that makes this plan fastest or slowest), timed by
    the engine time scaled with the screen's ratio where `plan` plays the engine at each corner. The screen is
    within SCREEN_MARGIN of the engine at either end, so the two differ by at most that ratio's spread."""
    req, result = searched
    spread = (1 + SCREEN_MARGIN) / (1 - SCREEN_MARGIN)
    for p in result.plans:
        t = p.estimate.iteration_time_s
        b = band(Job(model=req.model, cluster=req.cluster, plan=p.plan), None, t)
        for ours, theirs in ((p.iteration_time_s_low, b.iteration_time_s_low),
                             (p.iteration_time_s_high, b.iteration_time_s_high)):
            assert 1 / spread <= ours / theirs <= spread, (p.rank, ours, theirs)
        # a plan no constant moves has no band in either
        assert (b.iteration_time_s_low == b.iteration_time_s_high) is (p.iteration_time_s_low ==
                                                                       p.iteration_time_s_high), p.rank


def test_each_plans_band_is_timed_at_its_own_corners(searched):
    """The corners `plan` finds for the plan (band.corners), not the best plan's: a constant that does not move
    the best plan, or moves it the other way, sits at the end that is fast (or slow) for this one."""
    req, result = searched
    for p in result.plans:
        job = Job(model=req.model, cluster=req.cluster, plan=p.plan)
        c, t, base = corners(job), p.estimate.iteration_time_s, p.screen_time_s
        assert base == screen(job)
        at = [t * screen(job, corner) / base for corner in (c.fast, c.slow)]
        low, high, regime = widened(job, t, p.estimate.mfu, min(t, *at), max(t, *at))
        assert (p.iteration_time_s_low, p.iteration_time_s_high) == (low, high), p.rank
        assert p.validation_regime == regime.name and p.outside_regime_reasons == regime.outside


def test_the_search_ranks_by_the_slow_end_of_the_band_by_default(searched):
    req, result = searched
    assert req.rank_by.value == "upper"
    from simulator.planner.plan_search import rank_order

    keys = [p.rank_key_s for p in result.plans]
    assert keys == [p.iteration_time_s_high for p in result.plans]
    # slow ends equal to 12 digits (every plan above the best measured MFU has one) fall to the point
    ordered = [rank_order(p.rank_key_s, p.estimate.iteration_time_s) for p in result.plans]
    assert ordered == sorted(ordered)


def test_ranking_by_the_point_orders_by_the_iteration_time(searched):
    req, _ = searched
    result = search(req.model_copy(update={"rank_by": "point"}), top=5)
    times = [p.estimate.iteration_time_s for p in result.plans]
    assert times == sorted(times) and [p.rank_key_s for p in result.plans] == times


def test_a_validated_plan_outranks_a_faster_one_no_measured_run_covers():
    """Ranked by the band's slow end, a plan outside every measured regime (here: the distributed optimizer,
    which no measured A100 run used) loses to one inside a regime unless it is faster by more than the
    difference of their bands."""
    base = SearchRequest(model=PRESETS["gpt3-2.7b"], cluster=A100, num_gpus=16, global_batch_size=64,
                         pins=SearchPins(tensor_parallel_size=2, pipeline_parallel_size=1, micro_batch_size=2,
                                         recompute_granularity="none", sequence_parallel=True))
    point = search(base.model_copy(update={"rank_by": "point"}), top=2)
    upper = search(base, top=2)
    assert point.best.plan.use_distributed_optimizer and point.best.validation_regime is None
    assert not upper.best.plan.use_distributed_optimizer and upper.best.validation_regime is not None
    assert upper.best.estimate.iteration_time_s >= point.best.estimate.iteration_time_s
