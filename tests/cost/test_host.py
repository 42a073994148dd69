"""Host-side time: the device waits for the CPU that issues its work.

The physics: a stretch of work takes at least its host time and at least its device time; on an
asynchronous device the host runs ahead, on a synchronous one the two add; composing spans must
agree with issuing their ops one by one.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from simulator.cost.profile import default_profile
from simulator.estimator.prediction import estimate
from simulator.schedule.timing import Span
from simulator.spec.hardware import load_cluster
from simulator.spec.model import ModelSpec
from simulator.spec.plan import Job, ParallelPlan, Precision, RecomputePolicy

ops_strategy = st.lists(st.tuples(st.floats(0, 1e-3), st.floats(0, 1e-3)), min_size=1, max_size=12)


def _issue_one_by_one(ops: list[tuple[float, float]], asynchronous: bool = True) -> float:
    """A single stream: op k starts when the host has issued it and the op before it is done."""
    issued = done = 0.0
    for host, device in ops:
        issued = issued + host if asynchronous else done + host
        done = max(done, issued) + device
    return done


def _span(ops: list[tuple[float, float]], asynchronous: bool = True) -> Span:
    return Span(sum(h for h, _ in ops), sum(d for _, d in ops), _issue_one_by_one(ops, asynchronous), asynchronous)


@given(a=ops_strategy, b=ops_strategy, n=st.integers(1, 6), asynchronous=st.booleans())
def test_composed_spans_equal_issuing_every_op(a, b, n, asynchronous):
    whole = _issue_one_by_one(a * n + b, asynchronous)
    composed = _span(a, asynchronous).times(n).then(_span(b, asynchronous))
    assert composed.cold_s == pytest.approx(whole, rel=1e-9, abs=1e-15)


@given(ops=ops_strategy, asynchronous=st.booleans())
def test_a_span_takes_at_least_its_host_and_its_device_time(ops, asynchronous):
    s = _span(ops, asynchronous)
    assert s.cold_s >= s.host_s * (1 - 1e-12) and s.cold_s >= s.device_s * (1 - 1e-12)
    if not asynchronous:
        assert s.cold_s == pytest.approx(s.host_s + s.device_s)


def _small_job(**plan) -> Job:
    model = ModelSpec(name="small", num_layers=12, hidden_size=1024, num_attention_heads=16, seq_length=1024,
                      vocab_size=50304)
    plan = {"tensor_parallel_size": 2, "global_batch_size": 8, "precision": Precision.fp16,
            "recompute": RecomputePolicy(granularity="full"), **plan}
    return Job(model=model, cluster=load_cluster("dgx-a100-80gb"), plan=ParallelPlan(**plan))


def test_host_time_never_speeds_a_plan_up_and_matters_most_with_little_work():
    profile = default_profile("A100-SXM4-80GB")
    bare = profile.model_copy(update={"host": None})
    for mbs in (1, 8):
        job = _small_job(micro_batch_size=mbs)
        with_host, without = estimate(job, profile), estimate(job, bare)
        assert with_host.iteration_time_s >= without.iteration_time_s
        assert without.breakdown.host_overhead_s == 0.0
        ratio = with_host.iteration_time_s / without.iteration_time_s
        if mbs == 1:
            small_ratio = ratio
    assert small_ratio > ratio >= 1.0  # one sequence per micro-batch leaves the GPU waiting for Python


def test_the_breakdown_still_adds_up_with_the_host():
    est = estimate(_small_job(micro_batch_size=1, pipeline_parallel_size=2))
    b = est.breakdown
    total = (b.compute_s + b.tp_communication_s + b.pipeline_bubble_s + b.pipeline_transfer_s + b.data_parallel_s
             + b.optimizer_s + b.host_overhead_s)
    assert total == pytest.approx(est.iteration_time_s, rel=1e-9)
    assert b.host_overhead_s > 0
