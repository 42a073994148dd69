"""FP8 GEMMs on Hopper (Transformer Engine's --fp8-format): faster, never by more than the peak ratio,
only where the tensor cores have FP8, with the casts Transformer Engine adds."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from simulator.cost import build_cost_model
from simulator.cost.profile import default_profile, load_profile
from simulator.estimator.memory import memory_plan
from simulator.estimator.prediction import estimate
from simulator.graph.layers import GemmShape, Op, OpKind, transformer_layer
from simulator.spec._io import build
from simulator.spec.catalog import PRESETS
from simulator.spec.errors import ConfigError, ProfileError
from simulator.spec.hardware import load_cluster
from simulator.spec.plan import Job, ParallelPlan, Precision

HOPPER = ["dgx-h100", "dgx-h200"]


def _job(cluster: str, fp8: str | None, model: str = "llama3-8b", tp: int = 2, pp: int = 1, **plan) -> Job:
    plan = {"use_flash_attention": True, "global_batch_size": 8, **plan}
    return Job(model=PRESETS[model], cluster=load_cluster(cluster), plan=ParallelPlan(
        tensor_parallel_size=tp, pipeline_parallel_size=pp, sequence_parallel=tp > 1, fp8_format=fp8, **plan))


def _peak_ratio(cluster: str) -> float:
    peaks = load_cluster(cluster).gpu.peak_tflops
    return peaks.fp8 / peaks.bf16


@pytest.mark.parametrize("cluster", HOPPER)
@pytest.mark.parametrize("model,tp,pp", [("llama3-8b", 2, 1), ("gpt3-175b", 8, 8)])
def test_fp8_makes_a_hopper_plan_faster_but_never_by_more_than_the_peak_ratio(cluster, model, tp, pp):
    bf16 = estimate(_job(cluster, None, model, tp, pp)).iteration_time_s
    fp8 = estimate(_job(cluster, "hybrid", model, tp, pp)).iteration_time_s
    assert 1.0 < bf16 / fp8 < _peak_ratio(cluster)


@pytest.mark.parametrize("cluster", HOPPER)
def test_every_fp8_gemm_is_faster_but_within_the_peak_ratio(cluster):
    job = _job(cluster, "hybrid")
    cost = build_cost_model(job.cluster, default_profile(job.cluster.gpu.name), Precision.bf16)
    layer = transformer_layer(job.model, job.plan)
    ops = [job_op for g in (layer.forward, layer.backward) for _, d in g.nodes(data=True)
           if (job_op := d["op"]).gemm is not None and job_op.gemm.fp8]
    assert len(ops) == 12  # qkv, proj, fc1, fc2: forward, dgrad, wgrad
    for op in ops:
        as_bf16 = Op(op.name, op.kind, flops=op.flops, gemm=GemmShape(op.gemm.m, op.gemm.n, op.gemm.k, op.gemm.batch,
                                                                       op.gemm.accumulate_bytes))
        ratio = cost.op_time_s(as_bf16) / cost.op_time_s(op)
        assert 1.0 < ratio <= _peak_ratio(cluster) * (1 + 1e-12), op.name


def test_only_the_linear_layers_run_in_fp8():
    job = _job("dgx-h100", "hybrid", use_flash_attention=False)
    layer = transformer_layer(job.model, job.plan)
    fp8 = {op.name for op in layer.forward_ops() if op.gemm is not None and op.gemm.fp8}
    assert fp8 == {"qkv", "attention_proj", "fc1", "fc2"}  # not the attention products


@pytest.mark.parametrize("cluster", HOPPER)
def test_fp8_keeps_only_the_linear_inputs_in_one_byte(cluster):
    """Transformer Engine saves the FP8 copy of each linear layer's input for wgrad; every other saved
    tensor (norm inputs, attention, activations) stays bf16, and weights, gradients and optimizer state
    do not change."""
    from simulator.spec.plan import RecomputeGranularity

    def saved(fp8):
        job = _job(cluster, fp8)
        return {t.name: t for t in transformer_layer(job.model, job.plan).saved_tensors(RecomputeGranularity.none)}

    bf16, fp8 = saved(None), saved("hybrid")
    linear_inputs = {"qkv.input", "attention_proj.input", "fc1.input", "fc2.input"}
    assert bf16.keys() == fp8.keys()
    for name in bf16:
        assert fp8[name].numel == bf16[name].numel
        assert fp8[name].dtype_bytes == (1 if name in linear_inputs else bf16[name].dtype_bytes), name
    a, b = memory_plan(_job(cluster, "hybrid")).stages[0], memory_plan(_job(cluster, None)).stages[0]
    assert (a.weights_bytes, a.gradients_bytes, a.optimizer_bytes) == (b.weights_bytes, b.gradients_bytes,
                                                                       b.optimizer_bytes)
    assert a.activations_bytes < b.activations_bytes


@pytest.mark.parametrize("name", ["h100-sxm5-80gb-published", "h200-sxm-141gb-published"])
def test_fp8_block_reproduces_the_published_maximum(name):
    # MAMF (hardware.md section 3d): the best FP8 shape reaches 70.9% (H100) / 73.4% (H200) of 1,979 TFLOPS.
    profile = load_profile(name)
    block = profile.gemm_fp8
    assert block is not None
    assert block.ceiling_efficiency == pytest.approx({"h100": 0.709, "h200": 0.734}[name[:4]], abs=0.001)
    assert block.fits[-1].max_abs_residual < 1e-6


@given(m=st.integers(1, 32768), n=st.integers(1, 65536), k=st.integers(1, 65536), acc=st.booleans())
def test_no_fp8_gemm_beats_the_fp8_ceiling(m, n, k, acc):
    cluster = load_cluster("dgx-h100")
    profile = default_profile(cluster.gpu.name)
    cost = build_cost_model(cluster, profile, Precision.bf16)
    op = Op("g", OpKind.gemm, flops=2.0 * m * n * k, gemm=GemmShape(m, n, k, accumulate_bytes=4 if acc else 0, fp8=True))
    achieved = op.flops / cost.op_time_s(op) / (cluster.gpu.peak_tflops.fp8 * 1e12)
    assert achieved <= profile.gemm_fp8.ceiling_efficiency * (1 + 1e-9)


def test_a100_rejects_fp8_with_a_clear_error():
    plan = ParallelPlan(fp8_format="hybrid")
    with pytest.raises(ConfigError) as info:
        build(Job, {"model": PRESETS["llama3-8b"], "cluster": load_cluster("dgx-a100-80gb"), "plan": plan}, "job")
    msg = str(info.value)
    assert "fp8_format='hybrid'" in msg and "A100-SXM4-80GB" in msg and "dgx-h100" in msg


def test_fp8_needs_mixed_precision():
    with pytest.raises(ConfigError, match="fp8_format='e4m3'.*precision bf16"):
        build(ParallelPlan, {"fp8_format": "e4m3", "precision": "fp32"}, "plan")


def test_a_profile_without_an_fp8_block_says_so():
    job = _job("dgx-h100", "hybrid")
    profile = default_profile(job.cluster.gpu.name).model_copy(update={"gemm_fp8": None})
    cost = build_cost_model(job.cluster, profile, Precision.bf16)
    op = next(o for o in transformer_layer(job.model, job.plan).forward_ops() if o.name == "qkv")
    with pytest.raises(ProfileError, match="gemm_fp8"):
        cost.op_time_s(op)
