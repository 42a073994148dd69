"""The band: every unpinned constant declared with a range, and an answer bracketed by its corners."""

from __future__ import annotations

import pytest

from simulator.cost.profile import default_profile
from simulator.estimator.band import band, corners, corners_by, estimate_with_band, unread_constants
from simulator.estimator.prediction import estimate
from simulator.schedule.screen import screen
from simulator.schedule.timing import cost_model_for
from simulator.spec.catalog import PRESETS
from simulator.spec.hardware import load_cluster
from simulator.spec.plan import Job, ParallelPlan


@pytest.fixture(scope="module")
def job() -> Job:
    return Job(model=PRESETS["gpt3-13b"], cluster=load_cluster("dgx-a100-80gb"),
               plan=ParallelPlan(tensor_parallel_size=4, pipeline_parallel_size=4, data_parallel_size=2,
                                 micro_batch_size=1, global_batch_size=64))


@pytest.mark.parametrize("gpu", ["A100-SXM4-80GB", "H100-SXM5-80GB"])
def test_every_range_holds_its_value_and_names_a_source(gpu):
    profile = default_profile(gpu)
    unpinned = profile.unpinned()
    assert unpinned, "a published profile has constants no measurement pins"
    for path, value, low, high in unpinned:
        assert low <= value <= high, path
        *parents, name = path.split(".")
        if parents:
            assert name in profile.at(".".join(parents)).sources, path


def test_the_answer_lies_inside_its_band(job):
    est = estimate_with_band(job, tokens=1e11)
    assert est.iteration_time_s_low <= est.iteration_time_s <= est.iteration_time_s_high
    assert est.training_days_low <= est.training_days <= est.training_days_high
    assert est.training_days_high / est.training_days == pytest.approx(est.iteration_time_s_high / est.iteration_time_s)
    assert est.band_drivers, "some constant moves a 13B plan"


def test_a_profile_without_ranges_keeps_only_the_models_measured_error(job):
    profile = default_profile("A100-SXM4-80GB")
    pinned = profile.model_copy(update={"ranges": {}})
    for path, *_ in profile.unpinned():
        block_path, name = path.rsplit(".", 1) if "." in path else ("", path)
        if block_path:
            *parents, last = block_path.split(".")
            holder = pinned
            for part in parents:
                holder = getattr(holder, part)
            block = getattr(holder, last).model_copy(update={"ranges": {}})
            pinned = _replace(pinned, block_path, block)
    assert pinned.unpinned() == []
    est = estimate(job, pinned)
    t = est.iteration_time_s
    b = band(job, pinned, t, est.mfu)
    assert not b.drivers and b.regime.name is not None and est.mfu < b.regime.mfu_ceiling
    assert b.iteration_time_s_low == pytest.approx(t * (1 - b.regime.half_width))
    assert b.iteration_time_s_high == pytest.approx(t * (1 + b.regime.half_width))


def _replace(profile, path: str, value):
    *parents, name = path.split(".")
    chain = [profile]
    for part in parents:
        chain.append(getattr(chain[-1], part))
    new = chain[-1].model_copy(update={name: value})
    for parent, part in zip(reversed(chain[:-1]), reversed(parents)):
        new = parent.model_copy(update={part: new})
    return new


def test_the_corners_set_each_constant_to_one_end(job):
    c = corners(job)
    for path, value, low, high in default_profile("A100-SXM4-80GB").unpinned():
        fast = _get(c.fast, path)
        slow = _get(c.slow, path)
        assert fast in (low, high, value) and slow in (low, high, value), path


def _get(profile, path):
    return profile.at(path)


@pytest.mark.parametrize("cluster,plan", [
    ("dgx-a100-80gb", dict(tensor_parallel_size=4, pipeline_parallel_size=1, data_parallel_size=2,
                           attention_backend="unfused")),
    ("dgx-h100", dict(tensor_parallel_size=2, pipeline_parallel_size=1, data_parallel_size=4, fp8_format="hybrid")),
    ("dgx-h100", dict(tensor_parallel_size=2, pipeline_parallel_size=1, data_parallel_size=4,
                      attention_backend="flash")),
])
def test_constants_a_plan_never_reads_move_none_of_its_band(cluster, plan):
    """The band skips the screens of constants the plan's cost never reads; screening them anyway must give
    the same corners and drivers (each of their changes is nought)."""
    job = Job(model=PRESETS["gpt3-13b"], cluster=load_cluster(cluster),
              plan=ParallelPlan(micro_batch_size=1, global_batch_size=64, **plan))
    base_profile = cost_model_for(job, None).profile
    unread = unread_constants(job, base_profile)
    assert unread, "each of these plans leaves a block unread (FP8 GEMMs, fused attention or the exchange)"
    base = screen(job, base_profile)

    def change(path, end):
        return screen(job, base_profile.with_value(path, end)) / base - 1

    assert corners_by(base_profile, change, unread=unread) == corners_by(base_profile, change)
