"""The regime of a plan and the model-error band: fitted to the measured sets, checked with each left out."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from simulator.estimator.band import band, estimate_with_band
from simulator.estimator.prediction import estimate, validation_note
from simulator.estimator.regime import OUTSIDE_WIDENING, band_table, regime_of
from simulator.measure.datasets import vtrain_job
from simulator.spec.catalog import PRESETS
from simulator.spec.hardware import load_cluster
from simulator.spec.plan import DataParallelSharding, Fp8Format, Job, ParallelPlan

A100 = "A100-SXM4-80GB"


def _job(cluster: str = "dgx-a100-80gb", model: str = "gpt3-13b", **plan) -> Job:
    fields = dict(tensor_parallel_size=4, pipeline_parallel_size=2, data_parallel_size=4, global_batch_size=64)
    return Job(model=PRESETS[model], cluster=load_cluster(cluster), plan=ParallelPlan(**{**fields, **plan}))


def test_a_measured_set_plan_lies_in_its_regime():
    job = vtrain_job(64, 512, 4, 3072, 32, 30, 2048, 2, 32, 1)
    r = regime_of(job, estimate(job).mfu)
    assert r.name is not None and A100 in r.name and not r.outside
    assert r.half_width == band_table()["gpus"][A100]["half_width"]


@pytest.mark.parametrize("plan, reason", [
    (dict(use_distributed_optimizer=True), "sharding optim"),
    (dict(data_parallel_sharding_strategy=DataParallelSharding.optim_grads_params), "sharding optim_grads_params"),
    (dict(context_parallel_size=2, data_parallel_size=2), "context_parallel yes"),
])
def test_a_feature_no_measured_run_had_widens_the_band_and_says_why(plan, reason):
    job = _job(**plan)
    r = regime_of(job, 0.3)
    assert r.name is None and any(reason in why for why in r.outside)
    assert r.half_width == pytest.approx(band_table()["widest_half_width"] * OUTSIDE_WIDENING)


def test_fp8_and_an_unmeasured_gpu_are_outside_two_steps_out():
    job = _job(cluster="dgx-h100", fp8_format=Fp8Format.hybrid)
    r = regime_of(job, 0.3)
    assert r.name is None and r.outside == ("no measured run on H100-SXM5-80GB",
                                            "precision fp8: no measured run on any GPU had it")
    assert r.outside_steps == 2
    bf16 = regime_of(_job(cluster="dgx-h100"), 0.3)
    assert bf16.outside == ("no measured run on H100-SXM5-80GB",) and bf16.outside_steps == 1
    assert r.half_width == bf16.half_width and r.slow > bf16.slow


def test_the_slow_end_grows_with_each_step_outside_and_the_fast_end_does_not():
    """The declared rule: one feature no run had is one step, two are two; every step adds OUTSIDE_WIDENING - 1
    widest half-widths to the slow side, none to the fast side."""
    widest = band_table()["widest_half_width"]
    one = regime_of(_job(use_distributed_optimizer=True), 0.3)
    two = regime_of(_job(use_distributed_optimizer=True, context_parallel_size=2, data_parallel_size=2), 0.3)
    assert (one.outside_steps, two.outside_steps) == (1, 2)
    assert one.slow == pytest.approx(widest * OUTSIDE_WIDENING)
    assert two.slow - one.slow == pytest.approx(widest * (OUTSIDE_WIDENING - 1))
    assert one.half_width == two.half_width == pytest.approx(widest * OUTSIDE_WIDENING)


@given(st.sampled_from([1, 2, 4, 8]))
def test_more_gpus_than_any_measured_run_is_outside_and_further_the_more(doubling):
    """Past the largest measured run the plan is a step further out per doubling; at it, it is inside."""
    top = band_table()["gpus"][A100]["max_gpus"]
    assert top % 8 == 0
    at = regime_of(_job(tensor_parallel_size=8, pipeline_parallel_size=1, data_parallel_size=top // 8,
                        global_batch_size=top // 8), 0.3)
    assert at.name is not None
    past = regime_of(_job(tensor_parallel_size=8, pipeline_parallel_size=1, data_parallel_size=top * doubling // 4,
                          global_batch_size=top * doubling // 4), 0.3)
    assert past.name is None and any("more than the largest measured run" in why for why in past.outside)
    assert past.outside_steps == pytest.approx(math.log2(2 * doubling))


def test_an_mfu_above_every_measured_run_sets_the_slow_end():
    job = _job()
    ceiling = band_table()["gpus"][A100]["max_measured_mfu"]
    est = estimate(job)
    above = min(0.99, ceiling * 1.6)
    b = band(job, None, est.iteration_time_s, above)
    assert b.regime.name is None and any("MFU" in why for why in b.regime.outside)
    # pays in proportion, on top of the widened slow side: the slow end is no faster than that MFU would give
    expected = est.iteration_time_s * (1 + b.regime.slow) * above / ceiling
    assert b.iteration_time_s_high >= expected * (1 - 1e-12)


@given(st.floats(0.05, 0.99))
def test_the_slow_end_never_falls_as_the_mfu_rises(mfu):
    """Two answers with the same time, one at a higher MFU: the higher one's slow end is never the faster."""
    job = _job()
    t = estimate(job).iteration_time_s
    lower, higher = band(job, None, t, mfu), band(job, None, t, min(0.995, mfu * 1.2))
    assert higher.iteration_time_s_high >= lower.iteration_time_s_high


def test_the_band_holds_the_answer_and_names_its_regime_in_the_estimate():
    est = estimate_with_band(_job(use_distributed_optimizer=True), tokens=1e11)
    assert est.iteration_time_s_low < est.iteration_time_s < est.iteration_time_s_high
    assert est.validation_regime is None and est.outside_regime_reasons
    inside = estimate_with_band(vtrain_job(64, 512, 4, 3072, 32, 30, 2048, 2, 32, 1))
    assert inside.validation_regime is not None and inside.outside_regime_reasons == ()


@given(st.lists(st.floats(0.0, 10.0), min_size=1, max_size=80))
def test_the_conformal_quantile_covers_at_least_its_level_of_the_runs_it_came_from(scores):
    """Split conformal's quantile is an order statistic of the scores, and at least 90% of them (all of a set of
    fewer than nine) lie at or below it: never an interpolation short of that."""
    from calibration.fit_band import conformal_quantile

    q = conformal_quantile(scores)
    assert q in scores
    assert sum(x <= q for x in scores) >= min(len(scores), math.ceil(0.9 * (len(scores) + 1)))


def test_every_set_is_covered_when_it_is_left_out():
    """The target the band is built for: the measured time inside [low, high] for at least 80% of the runs of
    every measured set, with the set's own runs left out of the half-width."""
    table = band_table()
    assert {row["set"] for row in table["leave_one_set_out"]} >= {"korthikanti2022", "vtrain-single-node",
                                                                  "vtrain-multi-node-dev"}
    for row in table["leave_one_set_out"]:
        assert row["coverage_left_out"] >= table["target_coverage"], row
        assert row["coverage_in"] >= table["target_coverage"], row


def test_the_committed_band_file_is_what_the_fit_gives():
    from calibration.fit_band import _scores, fit

    fresh, committed = fit(_scores()), band_table()
    assert fresh["gpus"].keys() == committed["gpus"].keys()
    for gpu, g in committed["gpus"].items():
        assert fresh["gpus"][gpu]["covered"] == g["covered"]
        assert fresh["gpus"][gpu]["half_width"] == pytest.approx(g["half_width"], rel=1e-6), gpu
        assert fresh["gpus"][gpu]["max_measured_mfu"] == pytest.approx(g["max_measured_mfu"], rel=1e-6), gpu
    for a, b in zip(fresh["leave_one_set_out"], committed["leave_one_set_out"]):
        assert a["set"] == b["set"] and a["coverage_left_out"] == pytest.approx(b["coverage_left_out"], abs=1e-9)


def test_the_validated_range_flag_and_the_regime_share_one_mfu_ceiling():
    """`!` (the validation note) and the band's regime judge a plan's MFU against the same best measured MFU, so
    a plan is flagged exactly when the regime counts its MFU past what was measured, and both print one number."""
    ceiling = band_table()["gpus"][A100]["max_measured_mfu"]
    gpt3 = Job(model=PRESETS["gpt3-175b"], cluster=load_cluster("dgx-a100-80gb"),
               plan=ParallelPlan(tensor_parallel_size=8, pipeline_parallel_size=16, data_parallel_size=8,
                                 virtual_pipeline_stages=6, sequence_parallel=True, micro_batch_size=4,
                                 global_batch_size=1536))
    for mfu in (ceiling * 0.9, ceiling * 1.1):
        note = validation_note(gpt3, mfu)
        past = any("above the best measured" in r for r in regime_of(gpt3, mfu).outside)
        assert bool(note) == past == (mfu > ceiling)
        if note:
            assert f"({ceiling:.1%})" in note
