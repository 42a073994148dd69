"""The one interval of a run's days: a joint sample of failure timing, the time model's band and the declared
ranges, which is the Monte Carlo's own where nothing else is uncertain and widens as the ranges do."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import BaseModel

from simulator.bench import gpt3_job
from simulator.estimator.goodput import goodput
from simulator.estimator.prediction import estimate
from simulator.planner.capacity_interval import failure_quantiles, joint_days, latin_hypercube, triangular
from simulator.spec.reliability import Declared


def _scaled(node, f: float):
    """``node`` with every declared range scaled about its value by ``f`` (0 pins them all)."""
    if isinstance(node, Declared):
        return node.model_copy(update=dict(low=node.value - f * (node.value - node.low),
                                           high=node.value + f * (node.high - node.value)))
    if isinstance(node, BaseModel):
        return node.model_copy(update={k: _scaled(getattr(node, k), f) for k in type(node).model_fields})
    if isinstance(node, dict):
        return {k: _scaled(v, f) for k, v in node.items()}
    return node


@pytest.fixture(scope="module")
def run():
    job = gpt3_job()  # GPT-3 175B on 1,024 A100: some ten interruptions in its 300B tokens
    return job, estimate(job, tokens=300e9)


def _job_at(job, f: float):
    cluster = job.cluster.model_copy(update=dict(reliability=_scaled(job.cluster.reliability, f),
                                                 storage=_scaled(job.cluster.storage, f)))
    return job.model_copy(update=dict(cluster=cluster))


def _banded(est, width: float):
    t = est.iteration_time_s
    return est.model_copy(update=dict(iteration_time_s_low=t * (1 - width), iteration_time_s_high=t * (1 + width)))


def test_with_every_range_pinned_the_interval_is_the_monte_carlos(run):
    job, est = run
    pinned = _job_at(job, 0.0)
    est = _banded(est, 0.0)
    g = goodput(pinned, est, simulate=True)
    assert g.p10_days < g.p90_days  # the failures' timing alone spreads the days
    interval = joint_days(pinned, est, g)
    for mine, theirs in ((interval.p10_days, g.p10_days), (interval.p50_days, g.p50_days),
                         (interval.p90_days, g.p90_days)):
        assert mine == pytest.approx(theirs, rel=1e-3)


def test_the_interval_widens_as_the_band_widens(run):
    job, est = run
    pinned = _job_at(job, 0.0)
    g = goodput(pinned, _banded(est, 0.0), simulate=True)
    intervals = [joint_days(pinned, _banded(est, w), g) for w in (0.0, 0.05, 0.1, 0.2, 0.4)]
    for narrow, wide in zip(intervals, intervals[1:]):
        assert wide.p10_days <= narrow.p10_days and wide.p90_days >= narrow.p90_days
    assert intervals[-1].p90_days - intervals[-1].p10_days > 5 * (intervals[0].p90_days - intervals[0].p10_days)


def test_the_interval_widens_as_the_declared_ranges_widen(run):
    job, est = run
    est = _banded(est, 0.0)
    widths = []
    for f in (0.0, 0.5, 1.0):
        scaled = _job_at(job, f)
        interval = joint_days(scaled, est, goodput(scaled, est, simulate=True))
        widths.append(interval.p90_days - interval.p10_days)
    assert widths[0] < widths[1] < widths[2]


def test_the_same_seed_gives_the_same_interval(run):
    job, est = run
    g = goodput(job, est, simulate=True)
    assert joint_days(job, est, g) == joint_days(job, est, g)


def test_the_sampled_laws_hold_their_ranges_and_modes():
    u = latin_hypercube(1000, 3, seed=7)
    assert u.shape == (3, 1000) and np.allclose(np.sort(u[0]), (np.arange(1000) + 0.5) / 1000)
    x = triangular(u[0], 1.0, 2.0, 5.0)
    assert x.min() >= 1.0 and x.max() <= 5.0
    assert np.mean(x) == pytest.approx((1 + 2 + 5) / 3, rel=1e-3)  # the triangle's mean
    assert np.all(triangular(u[0], 2.0, 2.0, 2.0) == 2.0)
    q = failure_quantiles(np.array([0.1, 0.5, 0.9]), 10.0, 11.0, 13.0)
    assert q.tolist() == pytest.approx([10.0, 11.0, 13.0])
