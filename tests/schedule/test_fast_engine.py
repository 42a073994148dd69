"""The fast evaluators play the same iteration as the simpy engine: same times, same per-stage accounts."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.schedule import fast_engine
from simulator.schedule.engine import PipelineWork, StageWork, simulate
from simulator.schedule.schedules import build_schedule

FIELDS = ("busy_s", "wait_s", "transfer_wait_s", "last_backward_end_s", "grads_ready_s", "optimizer_s")
times = st.floats(0.0, 5.0, allow_nan=False)


@st.composite
def pipelines(draw):
    p = draw(st.integers(1, 6))
    v = draw(st.integers(1, 3)) if p > 1 else 1
    m = p * draw(st.integers(1, 5)) if v > 1 else draw(st.integers(1, 12))
    kind = "gpipe" if v == 1 and draw(st.booleans()) else "1f1b"
    stages = tuple(StageWork(tuple(draw(times) + 1e-3 for _ in range(v)), tuple(draw(times) + 1e-3 for _ in range(v)),
                             tuple(draw(times) for _ in range(v)), draw(times),
                             grad_buckets=tuple(draw(st.integers(1, 5)) for _ in range(v)))
                   for _ in range(p))
    work = PipelineWork(stages, tuple(draw(times) for _ in range(p)), draw(st.booleans()), draw(st.booleans()),
                        draw(st.sampled_from((0.0, 0.0, 0.05, 0.3))), draw(st.integers(1, 4)))
    return p, m, v, kind, work


def _same(reference, result):
    assert result.iteration_time_s == pytest.approx(reference.iteration_time_s, rel=1e-9, abs=1e-12)
    for a, b in zip(reference.stages, result.stages):
        for name in FIELDS:
            assert getattr(b, name) == pytest.approx(getattr(a, name), rel=1e-9, abs=1e-12), name


@settings(max_examples=150)
@given(pipelines())
def test_python_evaluator_equals_the_simpy_engine(case):
    p, m, v, kind, work = case
    _same(simulate(build_schedule(p, m, v, kind), work), fast_engine.evaluate(p, m, v, work, kind))


@settings(max_examples=150)
@given(pipelines())
def test_compiled_evaluator_equals_the_simpy_engine(case):
    pytest.importorskip("numba")
    p, m, v, kind, work = case
    _same(simulate(build_schedule(p, m, v, kind), work), fast_engine.evaluate_compiled(p, m, v, work, kind))


@pytest.mark.parametrize("p,m,v,kind", [(1, 5, 1, "1f1b"), (4, 8, 1, "1f1b"), (4, 3, 1, "1f1b"), (4, 8, 2, "1f1b"),
                                       (3, 9, 3, "1f1b"), (8, 16, 4, "1f1b"), (4, 6, 1, "gpipe")])
def test_the_compiled_schedule_is_the_schedule(p, m, v, kind):
    """Step for step: phase, chunk, the slot it waits on (its own coordinates), the slot it fills (its consumer's)."""
    from simulator.schedule.engine import _consumer, _producer_key
    from simulator.schedule.schedules import Phase

    compiled = fast_engine.compile_schedule(p, m, v, kind)
    schedule = build_schedule(p, m, v, kind)

    def slot(key):
        if key is None:
            return -1
        phase, mb, stage, chunk = key
        return (((phase is Phase.backward) * m + mb) * p + stage) * v + chunk

    for s, steps in enumerate(schedule):
        assert len(compiled.stages[s]) == len(steps)
        last = {step.chunk: i for i, step in enumerate(steps) if step.phase is Phase.backward}
        for i, (step, row) in enumerate(zip(steps, compiled.stages[s])):
            consumer = _consumer(step, p, v)
            expect = (step.phase is Phase.forward, step.chunk, slot(_producer_key(step, p, v)),
                      slot(consumer[1] if consumer else None), step.phase is Phase.backward and last[step.chunk] == i)
            assert row == expect, (s, i)


def test_the_compiled_evaluator_takes_any_number_of_buckets():
    pytest.importorskip("numba")
    stage = StageWork((1.0,), (2.0,), (0.5,), 0.1, grad_buckets=(10**12,))
    for overlap in (True, False):
        work = PipelineWork((stage,) * 3, (0.01,) * 3, overlap)
        assert fast_engine.evaluate_compiled(3, 6, 1, work).iteration_time_s == pytest.approx(
            fast_engine.evaluate(3, 6, 1, work).iteration_time_s, rel=1e-12)
