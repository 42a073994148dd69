"""One interval a deadline can be planned with: the P10 / P50 / P90 of a run's days from one joint sample.

Three things move the days a run takes: when its failures come, how far the iteration time is from the
prediction, and the declared constants of failures, restarts and storage that no measurement pins. Each sample
draws all three together:

- the failure timing: a quantile of the seeded Monte Carlo of the whole run (``goodput_sim``), read from the
  piecewise-linear quantile function through its P10, P50 and P90 (extended linearly past them);
- the iteration time: triangular between the ends of the time model's band, its mode the point prediction (the
  band says where the time lies, not how it is spread: a triangle weighs the prediction most and puts nothing
  past the ends);
- the job's unplanned and planned interruption rates, a save's blocking time and write lag, and a restart's
  time: each triangular between that figure with every declared constant at the low end of its range and at
  its high end, its mode at the values. The components of one figure (the rates of GPU, HBM, network, ...)
  move together, which bounds the spread of their sum from above.

A sample's days are the Monte Carlo's (its failure timing) times the closed-form expected days at the sampled
time and constants over the closed form at the point values, at the checkpoint interval chosen at the point
(the interval the launch sets). The dimensions are a Latin hypercube: each is cut into as many equal-probability
slices as there are samples, one sample at the middle of each, paired across dimensions by seeded
permutations. So the percentiles are stable with a thousand samples, and with the band and every declared range
pinned the interval is the Monte Carlo's own P10 / P50 / P90.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from simulator.estimator.goodput import (
    GoodputEstimate,
    GoodputSettings,
    Renewal,
    checkpoint_cost,
    renewal_of,
)
from simulator.estimator.prediction import Estimate
from simulator.spec import limits
from simulator.spec.plan import Job

DEFAULT_SAMPLES = 1000
_QUANTILES = (0.1, 0.5, 0.9)
# the renewal's figures drawn from their declared ranges, in the order of the sample's dimensions
_FIGURES = ("unplanned_per_s", "planned_per_s", "blocking_save_s", "durable_lag_s", "restart_s")


@dataclass(frozen=True)
class DaysInterval:
    """P10 / P50 / P90 of the days; None where that share of the samples never finishes (failures outpace the
    restarts at the slow end of the declared ranges)."""

    p10_days: float | None
    p50_days: float | None
    p90_days: float | None
    samples: int


def latin_hypercube(samples: int, dims: int, seed: int) -> np.ndarray:
    """(dims, samples) probabilities: in each dimension one at the middle of each of ``samples`` equal slices,
    in an order of its own drawn from ``seed``."""
    rng = np.random.default_rng(np.random.SeedSequence(seed))
    return np.stack([(rng.permutation(samples) + 0.5) / samples for _ in range(dims)])


def triangular(u: np.ndarray, low: float, mode: float, high: float) -> np.ndarray:
    """The inverse CDF of the triangular law on [low, high] with its peak at ``mode``; ``mode`` where the range
    is a point."""
    width = high - low
    if width <= 0:
        return np.full_like(u, mode)
    c = (mode - low) / width
    below = low + np.sqrt(u * width * (mode - low))
    above = high - np.sqrt((1 - u) * width * (high - mode))
    return np.where(u < c, below, above)


def failure_quantiles(u: np.ndarray, p10: float, p50: float, p90: float) -> np.ndarray:
    """The Monte Carlo's days at probabilities ``u``: linear through its P10, P50 and P90, and past them along the
    nearer segment's slope (never below zero)."""
    inside = np.interp(u, _QUANTILES, (p10, p50, p90))
    low = p10 - (0.1 - u) * (p50 - p10) / 0.4
    high = p90 + (u - 0.9) * (p90 - p50) / 0.4
    return np.maximum(0.0, np.where(u < 0.1, low, np.where(u > 0.9, high, inside)))


def percentiles(days: np.ndarray) -> tuple[float | None, ...]:
    """P10 / P50 / P90 as numpy's linear interpolation gives them; None where an infinite sample takes part."""
    ordered = np.sort(days)
    out = []
    for q in _QUANTILES:
        position = q * (len(ordered) - 1)
        a, b = ordered[math.floor(position)], ordered[math.ceil(position)]
        out.append(None if math.isinf(a) or math.isinf(b) else float(a + (b - a) * (position - math.floor(position))))
    return tuple(out)


def _expected_s(r: Renewal, k: int) -> float:
    """The closed form's expected run, infinite where failures stretch it past the limit the goodput model
    refuses (``limits.MAX_SLOWDOWN_BY_FAILURES`` times the run without interruptions)."""
    expected = r.expected_s(k)
    free = r.model_copy(update=dict(unplanned_per_s=0.0, planned_per_s=0.0)).expected_s(k)
    return math.inf if expected > limits.MAX_SLOWDOWN_BY_FAILURES * free else expected


def joint_days(job: Job, est: Estimate, g: GoodputEstimate, settings: GoodputSettings | None = None,
               samples: int = DEFAULT_SAMPLES) -> DaysInterval:
    """The P10 / P50 / P90 of ``job``'s days from one joint sample (see the module's docstring). ``est``: the
    estimate with its band; ``g``: its goodput, simulated (without the simulation, the failure timing is taken
    as the closed form's mean)."""
    settings = settings or GoodputSettings()
    data = settings.reliability(job.cluster.reliability)
    storage = settings.storage(job.cluster.storage)
    t = est.iteration_time_s
    iterations = max(1.0, est.tokens / (job.plan.global_batch_size * job.model.seq_length))
    k = g.save_interval
    ends = {end: renewal_of(job, data, checkpoint_cost(job, storage, settings.async_save, end), t, iterations, end)
            for end in ("low", "value", "high")}
    point = ends["value"]
    u = latin_hypercube(samples, 2 + len(_FIGURES), settings.seed)
    times = triangular(u[1], min(est.iteration_time_s_low or t, t), t, max(est.iteration_time_s_high or t, t))
    figures = {name: triangular(u[2 + i], min(getattr(ends["low"], name), getattr(point, name)),
                                getattr(point, name), max(getattr(ends["high"], name), getattr(point, name)))
               for i, name in enumerate(_FIGURES)}
    base = point.model_dump()
    closed = np.array([
        _expected_s(Renewal.model_construct(**{**base, "iteration_time_s": float(times[i]),
                                               **{name: float(figures[name][i]) for name in _FIGURES}}), k)
        for i in range(samples)])
    point_s = _expected_s(point, k)
    if g.p10_days is None:  # not simulated: the failure timing at the closed form's mean
        timing = np.full(samples, g.expected_days)
    else:
        timing = failure_quantiles(u[0], g.p10_days, g.p50_days, g.p90_days)
    days = timing * closed / point_s if math.isfinite(point_s) else np.full(samples, math.inf)
    p10, p50, p90 = percentiles(days)
    return DaysInterval(p10_days=p10, p50_days=p50, p90_days=p90, samples=samples)
