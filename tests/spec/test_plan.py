"""ParallelPlan, RecomputePolicy and Job: each rule is a small validator whose message names the values and the fix."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from simulator.cli.options import job_from_options
from simulator.spec.catalog import PRESETS
from simulator.spec.errors import ConfigError
from simulator.spec.hardware import load_cluster
from simulator.spec.plan import Job, ParallelPlan, RecomputePolicy

CLUSTER = load_cluster("dgx-a100-80gb")


def job(model="gpt3-175b", **plan) -> Job:
    return Job(model=PRESETS[model], cluster=CLUSTER, plan=ParallelPlan(**plan))


@pytest.mark.parametrize("plan,needles", [
    (dict(sequence_parallel=True), ["sequence_parallel", "tensor_parallel_size > 1"]),
    (dict(global_batch_size=10, micro_batch_size=4), ["global_batch_size=10", "micro_batch_size=4", "multiple of 4"]),
    (dict(global_batch_size=12, micro_batch_size=2, data_parallel_size=4), ["data_parallel_size=4", "= 8"]),
    (dict(virtual_pipeline_stages=2), ["virtual_pipeline_stages=2", "pipeline_parallel_size > 1"]),
    (dict(pipeline_parallel_size=4, virtual_pipeline_stages=2, global_batch_size=6),
     ["(6)", "pipeline_parallel_size=4"]),
    (dict(recompute=RecomputePolicy(granularity="selective", num_layers=3)), ["num_layers=3", "'selective'"]),
    (dict(tensor_parallel_size=0), ["tensor_parallel_size"]),
])
def test_plan_rules_name_the_values(plan, needles):
    with pytest.raises(ValidationError) as err:
        ParallelPlan(**plan)
    for needle in needles:
        assert needle in str(err.value)


@pytest.mark.parametrize("plan,needles", [
    (dict(tensor_parallel_size=64, allow_tp_across_nodes=True),
     ["tensor_parallel_size=64 does not divide num_attention_heads=96", "1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48 or 96"]),
    (dict(tensor_parallel_size=32), ["tensor_parallel_size=32", "8 GPUs per node", "allow_tp_across_nodes"]),
    (dict(tensor_parallel_size=3), ["tensor_parallel_size=3 does not divide vocab_size=51200", "multiple of 3"]),
    (dict(pipeline_parallel_size=5, global_batch_size=5), ["pipeline_parallel_size=5 does not divide num_layers=96"]),
    (dict(pipeline_parallel_size=8, virtual_pipeline_stages=5, global_batch_size=8),
     ["virtual_pipeline_stages=5 = 40", "num_layers=96"]),
    (dict(pipeline_parallel_size=2, pipeline_layer_split=(50, 40), global_batch_size=2), ["[50, 40]", "num_layers=96"]),
    (dict(pipeline_parallel_size=8, recompute=RecomputePolicy(granularity="full", num_layers=13), global_batch_size=8),
     ["num_layers=13", "12 layers"]),
])
def test_job_rules_name_the_values(plan, needles):
    with pytest.raises(ValidationError) as err:
        job(**plan)
    for needle in needles:
        assert needle in str(err.value)


def test_derived_quantities():
    j = job(tensor_parallel_size=8, pipeline_parallel_size=8, data_parallel_size=4, virtual_pipeline_stages=3,
            global_batch_size=256, micro_batch_size=2)
    assert j.num_gpus == 256 and j.num_nodes == 32
    assert j.plan.num_micro_batches == 32
    assert j.layers_per_stage == (12,) * 8 and j.layers_per_chunk == (4,) * 8
    uneven = job(pipeline_parallel_size=2, pipeline_layer_split=(50, 46), global_batch_size=2)
    assert uneven.layers_per_stage == (50, 46)


def test_parallel_dims_message_is_torchtitan_like():
    with pytest.raises(ConfigError) as err:
        job_from_options(gpus=64, tensor_parallel_size=8, pipeline_parallel_size=4, data_parallel_size=4)
    assert str(err.value).startswith("Invalid parallel dims: tp(8) * pp(4) * dp(4) = 128 != gpus(64)")
    with pytest.raises(ConfigError, match=r"gpus\(100\) is not divisible by tp\(8\) \* pp\(1\)"):
        job_from_options(gpus=100, tensor_parallel_size=8)


def test_options_derive_dp_and_the_default_batch():
    j = job_from_options(gpus=1024, tensor_parallel_size=8, pipeline_parallel_size=16)
    assert j.plan.data_parallel_size == 8
    assert j.plan.global_batch_size == 8 * 16  # one pipeline's worth of micro-batches per replica
    assert j.plan.num_micro_batches == 16
    j = job_from_options(tensor_parallel_size=2, unrelated_flag="ignored")
    assert j.num_gpus == 2


def test_options_errors_are_config_errors():
    with pytest.raises(ConfigError, match="tensor_parallel_size=5 does not divide num_attention_heads=96"):
        job_from_options(tensor_parallel_size=5)
    with pytest.raises(ConfigError, match="micro_batch_size"):
        job_from_options(micro_batch_size=0)


@given(st.sampled_from([1, 2, 4, 8]), st.sampled_from([1, 2, 3, 4, 6, 8, 12]), st.integers(1, 16))
def test_gpus_is_the_product(t, p, d):
    j = job_from_options(gpus=t * p * d, tensor_parallel_size=t, pipeline_parallel_size=p)
    assert j.plan.data_parallel_size == d and j.num_gpus == t * p * d


@pytest.mark.parametrize("seq,tp,cp,refused", [
    (4, 8, 1, True), (12, 8, 1, True), (8, 8, 1, False), (16, 4, 2, False), (16, 8, 2, False), (16, 8, 4, True), (2048, 8, 1, False),
])
def test_sequence_parallelism_needs_tp_to_divide_each_ranks_sequence(seq, tp, cp, refused):
    """Megatron scatters the [s / cp, b, h] activations over the TP ranks along the sequence
    (``_split_along_first_dim``, which asserts the split is even): a sequence TP does not divide cannot run."""
    model = PRESETS["gpt3-1.3b"].model_copy(update={"seq_length": seq})
    plan = dict(tensor_parallel_size=tp, context_parallel_size=cp, sequence_parallel=True)
    if not refused:
        Job(model=model, cluster=CLUSTER, plan=ParallelPlan(**plan))
        return
    with pytest.raises(ValidationError) as err:
        Job(model=model, cluster=CLUSTER, plan=ParallelPlan(**plan))
    for needle in (f"seq_length={seq}", f"tensor_parallel_size={tp}", "sequence_parallel"):
        assert needle in str(err.value)
    Job(model=model, cluster=CLUSTER, plan=ParallelPlan(**{**plan, "sequence_parallel": False}))  # SP off runs
