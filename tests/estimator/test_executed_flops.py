"""The FLOPs a plan's kernels execute per second never exceed what the cost model lets a tensor core sustain.

MFU counts Eq. 7's full s x s attention product; a causal flash kernel runs half of it, so a GPU's rate is
checked with each op's own FLOPs (``executed_flops_by_stage``), recompute included, against the profile's
best block: the GEMM block's efficiency cap (and the fused attention's, where higher) times the dense peak
of the precision the op runs in, at the sustained clock. FP8 GEMMs are held to the fp8 peak.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from simulator.cost.profile import GemmParams, default_profile
from simulator.estimator.prediction import (
    estimate,
    executed_flops_by_stage,
    model_flops_per_sequence,
    recompute_flops_per_iteration,
)
from simulator.spec.catalog import PRESETS
from simulator.spec.errors import ConfigError
from simulator.spec.hardware import load_cluster
from simulator.spec.plan import Job, ParallelPlan, Precision, RecomputePolicy

CLUSTERS = {name: load_cluster(name) for name in ("dgx-a100-80gb", "dgx-h100", "dgx-h200")}
DENSE = ("gpt3-1.3b", "gpt3-13b", "gpt3-175b", "llama3-8b", "llama3-70b", "megatron-22b")
MOE = ("mixtral-8x7b", "qwen3-30b-a3b")


def _block_cap(block: GemmParams) -> float:
    """The most of the dense peak any shape reaches in the block (the formula's factors are each at most 1)."""
    return min(block.max_efficiency, block.ceiling_efficiency if block.ceiling_efficiency is not None else 1.0)


def ceiling_flops_per_s(job: Job) -> float:
    profile, peaks = default_profile(job.cluster.gpu.name), job.cluster.gpu.peak_tflops
    peak = {Precision.bf16: peaks.bf16, Precision.fp16: peaks.fp16, Precision.fp32: peaks.fp32}[job.plan.precision]
    attention = max(max(block.forward_efficiency, block.backward_efficiency)
                    for block in (profile.attention, *profile.attention_kernels.values()))
    rate = peak * 1e12 * max(_block_cap(profile.gemm), attention)
    if job.plan.fp8_format is not None:
        rate = max(rate, peaks.fp8 * 1e12 * _block_cap(profile.gemm_fp8))
    return rate * profile.sustained_clock_fraction


@st.composite
def jobs(draw) -> Job:
    cluster = draw(st.sampled_from(sorted(CLUSTERS)))
    model = draw(st.sampled_from(DENSE + MOE))
    tp, pp = draw(st.sampled_from([1, 2, 4, 8])), draw(st.sampled_from([1, 2, 4]))
    dp, mbs = draw(st.sampled_from([1, 2])), draw(st.sampled_from([1, 2, 4]))
    moe = model in MOE
    plan = dict(
        tensor_parallel_size=tp, pipeline_parallel_size=pp, data_parallel_size=dp, micro_batch_size=mbs,
        global_batch_size=mbs * dp * pp * draw(st.sampled_from([1, 2])),
        # Megatron asserts sequence parallelism for an MoE model under TP
        sequence_parallel=tp > 1 and (moe or draw(st.booleans())),
        recompute=RecomputePolicy(granularity=draw(st.sampled_from(["none", "selective", "full"]))),
        attention_backend=draw(st.sampled_from(["auto", "flash", "fused", "unfused"])),
        fp8_format=draw(st.sampled_from([None, "hybrid"])) if cluster != "dgx-a100-80gb" else None,
        virtual_pipeline_stages=draw(st.sampled_from([1, 2])) if pp > 1 else 1,
    )
    try:
        return Job(model=PRESETS[model], cluster=CLUSTERS[cluster], plan=ParallelPlan(**plan))
    except (ConfigError, ValueError):  # a split the model's layers do not allow
        assume(False)


@given(jobs())
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
def test_no_gpu_executes_flops_faster_than_the_profiles_sustained_tensor_core_ceiling(job):
    e = estimate(job)
    busiest = max(executed_flops_by_stage(job))
    assert busiest / e.iteration_time_s <= ceiling_flops_per_s(job)


def _job(model: str, backend: str, granularity: str = "none") -> Job:
    plan = ParallelPlan(tensor_parallel_size=2, pipeline_parallel_size=2, data_parallel_size=2, global_batch_size=8,
                        attention_backend=backend, recompute=RecomputePolicy(granularity=granularity))
    return Job(model=PRESETS[model], cluster=CLUSTERS["dgx-a100-80gb"], plan=plan)


@pytest.mark.parametrize("model", ["gpt3-1.3b", "llama3-8b"])
@pytest.mark.parametrize("granularity", ["none", "full"])
def test_unfused_attention_executes_eq7s_full_product_and_a_flash_kernel_its_causal_half(model, granularity):
    """Megatron's unfused path multiplies every s x s score (the mask applies after); a causal flash kernel
    skips half, forward and backward, and its backward recomputes the scores (2.5x its forward, FA2)."""
    def executed(job: Job) -> float:
        plan = job.plan
        return sum(executed_flops_by_stage(job)) * plan.tensor_parallel_size * plan.data_parallel_size

    def hardware(job: Job) -> float:
        return model_flops_per_sequence(job) * job.plan.global_batch_size + recompute_flops_per_iteration(job)

    unfused, flash = _job(model, "unfused", granularity), _job(model, "auto", granularity)
    assert executed(unfused) == pytest.approx(hardware(unfused), rel=1e-12)
    m = flash.model
    full_product = 3 * 4 * m.seq_length ** 2 * m.q_size * m.num_layers * flash.plan.global_batch_size  # Eq. 7's
    causal = full_product / 2 * (1 + 2.5) / 3  # half of it forward, 2.5 times that backward
    assert executed(flash) == pytest.approx(hardware(flash) - full_product + causal, rel=1e-12)
