"""The discrete-event engine against the closed forms where they hold, and its invariants."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.schedule.engine import PipelineWork, StageWork, simulate
from simulator.schedule.schedules import bubble_fraction, build_schedule


def uniform(p, v, fwd=1.0, bwd=2.0, send=0.0, reduce=0.0, opt=0.0, overlap=False):
    stage = StageWork((fwd / v,) * v, (bwd / v,) * v, (reduce / v,) * v, opt)
    return PipelineWork((stage,) * p, (send,) * p, overlap)


@pytest.mark.parametrize("p,m,v", [(1, 4, 1), (4, 8, 1), (8, 64, 1), (4, 8, 2), (8, 64, 3), (16, 192, 3)])
def test_uniform_free_communication_matches_closed_form_bubble(p, m, v):
    result = simulate(build_schedule(p, m, v), uniform(p, v))
    ideal = m * 3.0
    assert (result.iteration_time_s - ideal) / ideal == pytest.approx(bubble_fraction(p, m, v), rel=0.01)


def test_gpipe_has_the_same_bubble_as_1f1b():
    p, m = 4, 8
    assert simulate(build_schedule(p, m, kind="gpipe"), uniform(p, 1)).iteration_time_s == pytest.approx(
        m * 3.0 * (1 + bubble_fraction(p, m))
    )


def test_heavier_first_and_last_stages_depart_from_closed_form():
    p, m = 8, 16
    work = uniform(p, 1)
    heavy = StageWork((1.3,), (2.6,), (0.0,), 0.0)
    stages = (heavy,) + work.stages[1:-1] + (heavy,)
    result = simulate(build_schedule(p, m), PipelineWork(stages, work.send_s))
    closed = m * 3.0 * (1 + bubble_fraction(p, m))
    assert result.iteration_time_s > closed * 1.05


@given(st.integers(1, 6), st.integers(1, 4), st.floats(0, 0.5), st.floats(0, 2), st.booleans())
@settings(max_examples=40, deadline=None)
def test_never_shorter_than_the_busiest_stream(p, mult, send, reduce, overlap):
    m = p * mult
    result = simulate(build_schedule(p, m), uniform(p, 1, send=send, reduce=reduce, opt=0.1, overlap=overlap))
    busy = m * 3.0
    assert result.iteration_time_s >= busy + 0.1 - 1e-9
    assert result.iteration_time_s >= m * send - 1e-9
    for stage in result.stages:
        assert stage.transfer_wait_s <= stage.wait_s + 1e-9


def test_overlapping_the_gradient_reduction_never_hurts():
    sched = build_schedule(4, 8, 2)
    plain = simulate(sched, uniform(4, 2, send=0.01, reduce=1.0)).iteration_time_s
    overlapped = simulate(sched, uniform(4, 2, send=0.01, reduce=1.0, overlap=True)).iteration_time_s
    assert overlapped <= plain
    assert overlapped < plain - 0.1  # chunk 1 finishes early enough to hide part of its reduction


def test_no_stream_runs_two_things_at_once():
    result = simulate(build_schedule(4, 8, 2), uniform(4, 2, send=0.05, reduce=0.5, overlap=True), record=True)
    by_stream = {}
    for iv in result.intervals:
        by_stream.setdefault((iv.stage, iv.stream), []).append(iv)
    for ivs in by_stream.values():
        ivs.sort(key=lambda iv: iv.start_s)
        for a, b in zip(ivs, ivs[1:]):
            assert b.start_s >= a.end_s - 1e-12


def test_deterministic():
    work = uniform(8, 3, send=0.013, reduce=0.7, overlap=True)
    a = simulate(build_schedule(8, 24, 3), work, record=True)
    b = simulate(build_schedule(8, 24, 3), work, record=True)
    assert a.iteration_time_s == b.iteration_time_s
    assert a.intervals == b.intervals


@given(n=st.integers(1, 16), reduce=st.floats(0.01, 5.0), bwd=st.floats(0.1, 5.0))
def test_bucketed_reduction_overlaps_the_last_backward_but_never_beats_its_last_bucket(n, reduce, bwd):
    """Buckets are reduced as they fill during the last backward step: the iteration ends no sooner than
    the last bucket after that step, no later than the whole reduction after it."""
    p, m = 1, 4
    stage = StageWork((1.0,), (bwd,), (reduce,), 0.0, grad_buckets=(n,))
    overlapped = simulate(build_schedule(p, m), PipelineWork((stage,), (0.0,), True)).iteration_time_s
    after = simulate(build_schedule(p, m), PipelineWork((stage,), (0.0,), False)).iteration_time_s
    compute = m * (1.0 + bwd)
    assert compute + reduce / n - 1e-9 <= overlapped <= after + 1e-9
    assert after == pytest.approx(compute + reduce)


def _queued_buckets(free, ready_from, ready_to, total, n):
    """Bucket j ready at ready_from + (j + 1) / n of the way to ready_to, each total / n long, one after another
    on a stream free from ``free``: the end of the last, one bucket at a time."""
    for j in range(n):
        free = max(ready_from + (ready_to - ready_from) * (j + 1) / n, free) + total / n
    return free


@given(free=st.floats(0, 10), ready_from=st.floats(0, 10), span=st.floats(0, 10), total=st.floats(0, 10),
       n=st.integers(1, 200))
def test_the_buckets_queue_in_closed_form(free, ready_from, span, total, n):
    from simulator.schedule.engine import buckets_done_s

    assert buckets_done_s(free, ready_from, ready_from + span, total, n) == pytest.approx(
        _queued_buckets(free, ready_from, ready_from + span, total, n), rel=1e-12, abs=1e-12)


@pytest.mark.parametrize("record", [False, True])
def test_any_number_of_buckets_is_played_at_once(record):
    """A bucket of one parameter splits a chunk into hundreds of millions: the engines take the queue in closed
    form and a trace shows it in a bounded number of slices, which still never overlap on the stream."""
    from simulator.schedule import fast_engine
    from simulator.schedule.engine import MAX_TRACED_BUCKETS

    n = 10**9
    stage = StageWork((1.0, 1.0), (2.0, 2.0), (0.5, 0.5), 0.1, grad_buckets=(n, n))
    work = PipelineWork((stage,) * 2, (0.01, 0.01), True)
    result = simulate(build_schedule(2, 4, 2), work, record=record)
    assert result.iteration_time_s == pytest.approx(fast_engine.evaluate(2, 4, 2, work).iteration_time_s, rel=1e-12)
    many = PipelineWork((StageWork((1.0, 1.0), (2.0, 2.0), (0.5, 0.5), 0.1, grad_buckets=(10**4,) * 2),) * 2,
                        (0.01, 0.01), True)
    assert result.iteration_time_s == pytest.approx(simulate(build_schedule(2, 4, 2), many).iteration_time_s, rel=1e-3)
    if record:
        dp = sorted((iv for iv in result.intervals if iv.stream == "dp"), key=lambda iv: (iv.stage, iv.start_s))
        assert 0 < len(dp) <= 2 * 2 * MAX_TRACED_BUCKETS
        for a, b in zip(dp, dp[1:]):
            assert a.stage != b.stage or b.start_s >= a.end_s - 1e-12
