"""A jittery rank makes the rank waiting for it lose time on average: Clark's moments of the maximum, and
the engine playing a schedule with them."""

from __future__ import annotations

import math

import numpy as np
import pytest

from simulator.cost.jitter import clark_max
from simulator.schedule import fast_engine
from simulator.schedule.engine import PipelineWork, StageWork, simulate
from simulator.schedule.schedules import build_schedule


def test_clark_max_is_the_maximum_where_nothing_varies_and_later_where_it_does():
    assert clark_max(3.0, 0.0, 2.0, 0.0) == (3.0, 0.0)
    assert clark_max(2.0, 0.0, 3.0, 0.0) == (3.0, 0.0)
    assert clark_max(2.0, 0.0, 3.0, 0.5)[0] > 3.0  # the later one may still come early: no gain, sometimes a loss
    # two equal times of spread sigma: E[max] - mean = sigma / sqrt(pi), Var = sigma^2 (1 - 1/pi)
    mean, var = clark_max(10.0, 4.0, 10.0, 4.0)
    assert mean == pytest.approx(10.0 + 2.0 / math.sqrt(math.pi), rel=1e-12)
    assert var == pytest.approx(4.0 * (1 - 1 / math.pi), rel=1e-12)
    # symmetric, never below either mean, and the plain maximum once the other lies many spreads below
    assert clark_max(1.0, 0.3, 1.4, 0.1) == pytest.approx(clark_max(1.4, 0.1, 1.0, 0.3), rel=1e-12)
    assert clark_max(5.0, 0.01, 0.0, 0.01)[0] == pytest.approx(5.0, abs=1e-12)


@pytest.mark.parametrize("a, b", [((0.0, 1.0), (0.0, 1.0)), ((0.5, 1.0), (0.0, 0.25)), ((-1.0, 0.2), (0.3, 2.0))])
def test_clark_max_matches_sampled_normals(a, b):
    rng = np.random.default_rng(3)
    x = rng.normal(a[0], math.sqrt(a[1]), 400_000)
    y = rng.normal(b[0], math.sqrt(b[1]), 400_000)
    mean, var = clark_max(*a, *b)
    z = np.maximum(x, y)
    assert mean == pytest.approx(z.mean(), abs=0.01) and var == pytest.approx(z.var(), rel=0.02)


def _work(p: int, f: float, b: float, jitter: float) -> PipelineWork:
    stage = StageWork((f,), (b,), (0.0,), 0.0)
    return PipelineWork((stage,) * p, (0.0,) * p, step_jitter=jitter)


def test_without_jitter_nothing_changes_and_one_stage_never_waits():
    for p, m in ((1, 4), (2, 8), (4, 8)):
        plain = simulate(build_schedule(p, m, 1), _work(p, 1.0, 2.0, 0.0)).iteration_time_s
        assert plain == pytest.approx((m + p - 1) * 3.0, rel=1e-12)
    assert simulate(build_schedule(1, 4, 1), _work(1, 1.0, 2.0, 0.2)).iteration_time_s == pytest.approx(12.0)


def test_jitter_costs_a_pipeline_more_the_more_it_varies():
    def time(p, jitter):
        return fast_engine.evaluate(p, 8, 1, _work(p, 1.0, 2.0, jitter)).iteration_time_s

    for p in (2, 4, 8):
        assert time(p, 0.0) < time(p, 0.05) < time(p, 0.2)


def _sampled_iteration_s(p: int, m: int, f: float, b: float, jitter: float, samples: int, seed: int) -> float:
    """The mean iteration of a 1F1B pipeline whose every step's duration is drawn on its own (normal, relative
    spread ``jitter``), played as the max-plus recurrence of the engine with zero transfer time."""
    compiled = fast_engine.compile_schedule(p, m, 1)
    rng = np.random.default_rng(seed)
    arrive = np.zeros((compiled.slots, samples))
    known = [False] * compiled.slots
    now = np.zeros((p, samples))
    ptr = [0] * p
    while any(ptr[s] < len(compiled.stages[s]) for s in range(p)):
        for s in range(p):
            steps = compiled.stages[s]
            while ptr[s] < len(steps):
                forward, _, wait_slot, fill_slot, _ = steps[ptr[s]]
                if wait_slot >= 0:
                    if not known[wait_slot]:
                        break
                    now[s] = np.maximum(now[s], arrive[wait_slot])
                d = f if forward else b
                now[s] += rng.normal(d, jitter * d, samples)
                if fill_slot >= 0:
                    arrive[fill_slot], known[fill_slot] = now[s], True
                ptr[s] += 1
    return float(now.max(axis=0).mean())


@pytest.mark.parametrize("p, f, b, jitter", [(2, 1.0, 2.0, 0.1), (2, 1.3, 2.0, 0.25), (4, 1.0, 2.0, 0.1),
                                             (4, 1.0, 1.0, 0.25), (8, 1.0, 2.0, 0.25)])
def test_the_engine_under_jitter_follows_a_sampled_pipeline(p, f, b, jitter):
    """Clark's moments at every wait, a stage's variance counted from its last wait, against drawing every
    step: the same added time for two stages, never more and at least half of it for deeper pipelines (a
    wait leaves the stages less aligned than the reset assumes)."""
    m = 8
    plain = (m + p - 1) * (f + b)
    engine = fast_engine.evaluate(p, m, 1, _work(p, f, b, jitter)).iteration_time_s - plain
    sampled = _sampled_iteration_s(p, m, f, b, jitter, 20_000, seed=5) - plain
    assert sampled > 0
    if p == 2:
        assert engine == pytest.approx(sampled, rel=0.05)
    else:
        assert 0.5 * sampled < engine <= 1.02 * sampled


def test_the_optimizer_waits_for_the_latest_of_the_data_parallel_replicas():
    """Each stage's copies vary alike and apart: the expected latest of n of them, E[max of n normals]."""
    from simulator.cost.jitter import expected_max_of_normals

    assert expected_max_of_normals(1) == 0.0
    assert expected_max_of_normals(2) == pytest.approx(1 / math.sqrt(math.pi), rel=1e-9)
    samples = np.random.default_rng(1).standard_normal((100_000, 8)).max(axis=1).mean()
    assert expected_max_of_normals(8) == pytest.approx(samples, abs=0.01)
    one = PipelineWork((StageWork((1.0,), (2.0,), (0.0,), 0.0),), (0.0,), step_jitter=0.1)
    four = PipelineWork(one.stages, one.send_s, step_jitter=0.1, replicas=4)
    sd = 0.1 * math.sqrt(4 * (1.0**2 + 2.0**2))  # one stage, four forwards and backwards, no wait between
    for engine in (lambda w: simulate(build_schedule(1, 4, 1), w), lambda w: fast_engine.evaluate(1, 4, 1, w)):
        assert engine(one).iteration_time_s == pytest.approx(12.0, rel=1e-12)
        assert engine(four).iteration_time_s == pytest.approx(12.0 + sd * expected_max_of_normals(4), rel=1e-9)
