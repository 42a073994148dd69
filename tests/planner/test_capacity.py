"""Capacity planning's contract, on synthetic clusters whose days follow a known curve (no search is run): the
answer meets the goal at the stated confidence and no option on the grid beats it; prices scale costs and
nothing else; the walk finds what searching every count finds; an impossible goal says the best there is and
what binds."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from simulator.estimator.goodput import GoodputSettings
from simulator.planner.capacity import CapacityRequest, Confidence, PointResult, plan_capacity, priced
from simulator.planner.capacity_grid import bisection_walk, boundary_walk, cluster_counts, memory_floor_nodes
from simulator.spec.catalog import load_model
from simulator.spec.economics import economics_for, load_economics
from simulator.spec.errors import ConfigError
from simulator.spec.hardware import load_cluster

MODEL = load_model("gpt3-175b")
CLUSTERS = {name: load_cluster(name) for name in ("dgx-a100-80gb", "dgx-h100", "dgx-h200")}
# GPU-days of work per cluster kind, and the GPUs below which no plan fits
WORK = {"dgx-a100-80gb": 18_000.0, "dgx-h100": 6_000.0, "dgx-h200": 5_000.0}
FLOOR = {"dgx-a100-80gb": 128, "dgx-h100": 64, "dgx-h200": 32}
SPREAD = 0.1  # P10 and P90 a tenth either side of P50


def fake_point(point) -> PointResult:
    """Days that fall as 1 / GPUs, with a loss that grows with the log of the GPUs (so GPU-hours rise)."""
    name, gpus = point.cluster.name, point.gpus
    base = dict(cluster=name, gpus=gpus, nodes=gpus // point.cluster.gpus_per_node)
    if gpus < FLOOR[name]:
        return PointResult(**base, status="no plan", message=f"no plan fits in 80 GiB per GPU on {gpus} GPUs")
    ideal = WORK[name] / gpus * (1 + 0.08 * math.log2(gpus / 8))
    ettr = 1 - 0.02 * math.log2(gpus / 8)
    days = ideal / ettr
    return PointResult(**base, status="ok", plan_name=f"fake {gpus}", iteration_time_s=1.0, mfu=0.5,
                       ideal_days=ideal, expected_days=days, ettr=ettr, save_interval=100,
                       days_p10=days * (1 - SPREAD), days_p50=days, days_p90=days * (1 + SPREAD))


def _request(clusters=("dgx-a100-80gb", "dgx-h100", "dgx-h200"), prices=None, **kw) -> CapacityRequest:
    data = load_economics()
    cs = tuple(CLUSTERS[c] for c in clusters)
    prices = prices or {}
    return CapacityRequest(model=MODEL, clusters=cs, economics=tuple(economics_for(c, data, prices.get(c.name))
                                                                     for c in cs),
                           tokens=300e9, global_batch_size=1536, **kw)


def _run(req):
    return plan_capacity(req, evaluate=fake_point)


def _key(o):
    return (o.cluster, o.gpus)


DEADLINES = st.floats(min_value=2.0, max_value=400.0)
CONFIDENCES = st.sampled_from([Confidence.p50, Confidence.p90])


@given(deadline=DEADLINES, confidence=CONFIDENCES, refine=st.integers(0, 3), every=st.booleans())
def test_the_answer_meets_the_deadline_and_no_cheaper_option_does(deadline, confidence, refine, every):
    result = _run(_request(deadline_days=deadline, confidence=confidence, refine=refine, every_count=every))
    ok = [o for o in result.options if o.status == "ok"]
    judged = [(o.days_p90 if confidence is Confidence.p90 else o.days_p50) for o in ok]
    meeting = [o for o, d in zip(ok, judged) if d <= deadline]
    if not meeting:
        assert result.answer is None and result.fastest is not None
        assert "no option finishes by" in result.binding_note and result.binding != "deadline"
        return
    a = result.answer
    assert a.days == (a.days_p90 if confidence is Confidence.p90 else a.days_p50) and a.days <= deadline
    assert all(o.cost_usd.value >= a.cost_usd.value for o in meeting)
    if result.binding == "deadline":  # a cheaper option exists, and it misses
        assert any(o.cost_usd.value < a.cost_usd.value and o.days > deadline for o in ok)


@given(deadline=DEADLINES, confidence=CONFIDENCES)
def test_the_walk_finds_the_answer_every_count_finds(deadline, confidence):
    walked = _run(_request(deadline_days=deadline, confidence=confidence, refine=0))
    full = _run(_request(deadline_days=deadline, confidence=confidence, refine=0, every_count=True))
    assert (walked.answer and _key(walked.answer)) == (full.answer and _key(full.answer))
    assert walked.searches <= full.searches


@given(budget=st.floats(min_value=1e5, max_value=5e7), confidence=CONFIDENCES)
def test_the_budget_walk_finds_the_answer_every_count_finds(budget, confidence):
    # A100's fewest GPUs by the memory floor hold no plan here (no cost): short of the budget, not past it
    one = ("dgx-a100-80gb",)
    walked = _run(_request(clusters=one, budget_usd=budget, confidence=confidence, refine=0))
    full = _run(_request(clusters=one, budget_usd=budget, confidence=confidence, refine=0, every_count=True))
    assert (walked.answer and _key(walked.answer)) == (full.answer and _key(full.answer))


@given(budget=st.floats(min_value=1e5, max_value=5e7), confidence=CONFIDENCES)
def test_the_budget_answer_is_the_fastest_within_it(budget, confidence):
    result = _run(_request(budget_usd=budget, confidence=confidence, every_count=True))
    ok = [o for o in result.options if o.status == "ok"]
    within = [o for o in ok if o.cost_usd.value <= budget]
    if not within:
        assert result.answer is None and result.binding == "budget"
        return
    assert result.answer.cost_usd.value <= budget
    assert all(o.days >= result.answer.days for o in within)


def test_doubling_the_price_doubles_every_cost_and_changes_no_plan():
    prices = {"dgx-a100-80gb": 1.7, "dgx-h100": 2.9, "dgx-h200": 3.1}
    one = _run(_request(prices=prices, deadline_days=40, every_count=True))
    two = _run(_request(prices={k: 2 * v for k, v in prices.items()}, deadline_days=40, every_count=True))
    assert [_key(o) for o in one.options] == [_key(o) for o in two.options]
    for a, b in zip(one.options, two.options):
        assert a.plan_name == b.plan_name and a.days == b.days and a.gpu_hours == b.gpu_hours
        if a.cost_usd is not None:
            for end in ("low", "value", "high"):
                assert getattr(b.cost_usd, end) == pytest.approx(2 * getattr(a.cost_usd, end))
        assert a.energy_mwh == b.energy_mwh and a.tco2e == b.tco2e
    assert _key(one.answer) == _key(two.answer)
    assert [o.on_frontier for o in one.options] == [o.on_frontier for o in two.options]


def test_the_frontier_holds_every_option_no_other_beats():
    result = _run(_request(every_count=True))
    ok = [o for o in result.options if o.status == "ok"]
    for o in ok:
        beaten = any(p.days <= o.days and p.cost_usd.value <= o.cost_usd.value
                     and (p.days, p.cost_usd.value) != (o.days, o.cost_usd.value) for p in ok)
        assert o.on_frontier == (not beaten), _key(o)
    assert result.answer is None and result.goal.value == "frontier"


def test_an_impossible_deadline_says_the_fastest_and_what_binds():
    result = _run(_request(deadline_days=0.01))
    assert result.answer is None
    fastest = result.fastest
    assert fastest is not None and f"the fastest, {fastest.gpus:,} GPUs of {fastest.cluster}" in result.binding_note
    assert f"{fastest.days:.1f} days" in result.binding_note
    assert result.binding in ("GPU range", "global batch", "failures", "scaling")


def test_memory_binds_where_fewer_gpus_hold_no_plan():
    # a deadline so loose that the fewest GPUs that fit meet it: only memory keeps the answer from fewer
    result = _run(_request(clusters=("dgx-h100",), deadline_days=400, gpus=(32, 64, 128), every_count=True))
    assert _key(result.answer) == ("dgx-h100", 64)
    assert result.binding == "memory" and "GPUs of dgx-h100 hold no plan: no plan fits" in result.binding_note
    # the bisection looked between the two, in whole nodes, and found no count that fits
    assert {o.gpus for o in result.options if o.refined} == {48, 56}


def test_bisection_refines_between_the_counts_either_side_of_the_deadline():
    coarse = _run(_request(clusters=("dgx-h100",), deadline_days=20, refine=0))
    fine = _run(_request(clusters=("dgx-h100",), deadline_days=20, refine=3))
    refined = [o for o in fine.options if o.refined]
    assert refined and not any(o.refined for o in coarse.options)
    assert fine.answer.cost_usd.value <= coarse.answer.cost_usd.value
    assert fine.answer.gpus % 8 == 0


def test_the_counts_are_whole_nodes_from_the_memory_floor():
    h100 = CLUSTERS["dgx-h100"]
    floor = memory_floor_nodes(MODEL, h100)
    assert floor == 8  # 175B x 16 bytes over 80 GiB: 33 GPUs, 5 nodes, the next power of two
    counts = cluster_counts(MODEL, h100)
    assert counts[0] == floor * 8 and counts[-1] == floor * 8 * 128
    assert all(c % 8 == 0 and b == 2 * a for c, (a, b) in zip(counts, zip(counts, counts[1:])))
    assert cluster_counts(MODEL, h100, gpus_min=100, gpus_max=1000) == (104, 128, 256, 512, 1000)
    with pytest.raises(ConfigError, match="the GPU range 1-7 holds no whole node of dgx-h100 .* multiple of 8"):
        cluster_counts(MODEL, h100, gpus_min=1, gpus_max=7)
    with pytest.raises(ConfigError, match="--gpus 100 is not whole nodes of dgx-h100"):
        cluster_counts(MODEL, h100, gpus=(64, 100))


def test_the_walks_ask_for_what_they_need():
    counts = (8, 16, 32, 64, 128, 256, 512, 1024)
    past = lambda o: o >= 100  # noqa: E731 - options here are the counts themselves
    w = boundary_walk(counts, past, every=False)
    asked, step = [], next(w)
    while True:
        asked += step
        try:
            step = w.send({c: c for c in step})
        except StopIteration:
            break
    assert len(asked) <= math.ceil(math.log2(len(counts) + 1)) and 128 in asked and 64 in asked
    b = bisection_walk(64, 128, 8, lambda o: o >= 100, steps=10)
    asked, step = [], next(b)
    while True:
        asked += step
        try:
            step = b.send({c: c for c in step})
        except StopIteration:
            break
    assert asked == [96, 112, 104]  # 12 nodes short, 14 past, 13 past: 12 and 13 are adjacent, so it ends


def test_a_request_refuses_two_goals_and_a_cluster_named_twice():
    with pytest.raises(ValueError, match="not both"):
        _request(deadline_days=30, budget_usd=1e6)
    with pytest.raises(ValueError, match="named twice"):
        _request(clusters=("dgx-h100", "dgx-h100"))
    with pytest.raises(ValueError, match="GPU range 512-256 is empty"):
        _request(gpus_min=512, gpus_max=256)


def test_gpu_hours_never_fall_as_dp_grows_with_the_plan_and_ettr_held():
    """The time model through capacity's arithmetic: the same plan with more DP replicas never takes fewer
    GPU-hours for the same tokens (its DP collectives only grow)."""
    from simulator.estimator.prediction import estimate
    from simulator.spec.plan import Job, ParallelPlan

    model, cluster = load_model("gpt3-1.3b"), CLUSTERS["dgx-h100"]
    economics = economics_for(cluster, load_economics())
    hours = []
    for dp in (1, 2, 4, 8, 16):
        plan = ParallelPlan(tensor_parallel_size=2, pipeline_parallel_size=2, data_parallel_size=dp,
                            micro_batch_size=2, global_batch_size=512)
        est = estimate(Job(model=model, cluster=cluster, plan=plan), tokens=30e9)
        days = est.training_days / 0.95  # ETTR held
        point = PointResult(cluster=cluster.name, gpus=4 * dp, nodes=max(1, 4 * dp // 8), status="ok", ettr=0.95,
                            days_p10=days, days_p50=days, days_p90=days)
        hours.append(priced(point, economics, Confidence.p90).gpu_hours.value)
    assert all(b >= a * (1 - 1e-9) for a, b in zip(hours, hours[1:])), hours


def test_the_goodput_settings_reach_every_point():
    seen = []

    def spy(point):
        seen.append(point.goodput)
        return fake_point(point)

    req = _request(clusters=("dgx-h100",), goodput=GoodputSettings(mtbf_gpu_hours=20_000, seed=3), deadline_days=30)
    plan_capacity(req, evaluate=spy)
    assert seen and all(g.mtbf_gpu_hours == 20_000 and g.seed == 3 for g in seen)


def test_local_processes_give_what_one_process_gives():
    req = _request(deadline_days=30, refine=2)
    one = plan_capacity(req, evaluate=fake_point, workers=1)
    many = plan_capacity(req, evaluate=fake_point, workers=3)
    assert one.model_dump(exclude={"elapsed_s"}) == many.model_dump(exclude={"elapsed_s"})


def test_a_budget_is_refined_between_the_counts_either_side_of_it_past_counts_with_no_plan():
    # A100's fewest GPUs hold no plan here: they have no cost, so they lie short of the budget, not past it
    one = ("dgx-a100-80gb",)
    full = _run(_request(clusters=one, every_count=True))
    costs = {o.gpus: o.cost_usd.value for o in full.options if o.status == "ok"}
    assert any(o.status == "no plan" for o in full.options)
    low, high = sorted(costs)[1:3]
    budget = (costs[low] + costs[high]) / 2
    result = _run(_request(clusters=one, budget_usd=budget, refine=2, every_count=True))
    refined = [o.gpus for o in result.options if o.refined]
    assert refined and all(low < g < high for g in refined)
    assert result.answer.cost_usd.value <= budget and result.answer.gpus >= low
