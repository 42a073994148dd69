"""``estimate(job)``: iteration time, its breakdown, MFU/HFU, tokens/s and training days.

The layer graph is costed op by op (simulator.timing), the pipeline is played by the
discrete-event engine (simulator.engine), and memory comes from simulator.memory. Nothing here
reads an end-to-end measurement.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from simulator.costs import Group
from simulator.engine import EngineResult, PipelineWork, StageWork, simulate
from simulator.layers import CollectiveKind, CollectiveOp, Op, OpKind
from simulator.memory import MemoryPlan, memory_plan, stage_parameters
from simulator.plan import Job, RecomputeGranularity, RecomputeMethod
from simulator.schedules import build_schedule
from simulator.timing import (
    LayerTimes,
    StageExtraTimes,
    cost_model_for,
    extra_times,
    layer_times,
)

SECONDS_PER_DAY = 86400.0
# HBM bytes per parameter of Megatron's mixed-precision optimizer step (Float16OptimizerWithFloat16Params
# with apex's multi-tensor kernels): global gradient norm (read fp32 grad, 4); clipping (read and
# write the grad, 8); Adam (read master, grad, m, v and write master, m, v: 28); copy master to the
# bf16 model weights (read 4, write 2); zeroing the fp32 main_grad buffer for the next step (4).
OPTIMIZER_BYTES_PER_PARAM = 4 + 8 + 28 + 6 + 4


class Breakdown(BaseModel):
    """Where the iteration goes on its critical (slowest) stage; the parts sum to the iteration time."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    compute_s: float = Field(description="Compute kernels (GEMMs, attention, memory-bound ops), recompute included.")
    tp_communication_s: float = Field(description="Tensor-parallel collectives not hidden behind compute.")
    pipeline_bubble_s: float = Field(description="Compute stream idle for want of work (warm-up, cool-down, imbalance).")
    pipeline_transfer_s: float = Field(description="Idle while an activation or gradient was in flight.")
    data_parallel_s: float = Field(description="Gradient reduction not hidden behind the backward pass.")
    optimizer_s: float = Field(description="Optimizer step (and the distributed optimizer's parameter all-gather).")


class LayerTimesOut(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    forward_s: float
    backward_s: float
    recompute_s: float


class Estimate(BaseModel):
    """What `simulator plan` answers."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    iteration_time_s: float
    mfu: float = Field(description="Model FLOPs utilisation, Korthikanti Appendix A (Eq. 7 FLOPs), against the dense "
                                   "peak of the plan's precision (bf16 for FP8 plans, as Megatron reports it); "
                                   "at most 1.")
    hfu: float = Field(description="Hardware FLOPs utilisation: FLOPs executed, recompute included; at most 1.")
    utilisation_note: str | None = Field(
        None, description="Set when MFU or HFU came out above 1 and is shown as 1, with the values and why.")
    tokens_per_s: float
    tflops_per_gpu: float = Field(description="Model TFLOP/s achieved per GPU.")
    model_flops_per_iteration: float
    hardware_flops_per_iteration: float
    breakdown: Breakdown
    critical_stage: int
    layer: LayerTimesOut = Field(description="One transformer layer, one micro-batch, one TP rank.")
    memory: MemoryPlan
    num_gpus: int
    tokens: float | None = None
    training_days: float | None = None
    gpu_hours: float | None = None


@dataclass(frozen=True)
class Simulation:
    """The estimate plus what produced it (for traces and timelines)."""

    estimate: Estimate
    engine: EngineResult
    layer: LayerTimes
    extras: StageExtraTimes


def model_flops_per_sequence(job: Job) -> float:
    """Forward + backward model FLOPs of one sequence (Korthikanti Eq. 7, generalised to GQA/SwiGLU).

    Attention scores and context count the full s x s product, as the paper does, even when a
    causal kernel skips half of it.
    """
    m = job.model
    s, h = m.seq_length, m.hidden_size
    weights = m.layer_parameters() - 2 * m.norm_parameters()
    biases = (m.hidden_size + 2 * m.kv_size + m.hidden_size + (2 if m.swiglu else 1) * m.ffn_size + m.hidden_size
              if m.add_bias_linear else 0)
    matmul_params = weights - biases
    layer = 2 * s * matmul_params + 4 * s * s * h
    logits = 2 * s * h * m.vocab_size
    return 3.0 * (m.num_layers * layer + logits)


def recompute_flops_per_iteration(job: Job) -> float:
    """FLOPs replayed by recompute in one iteration, all GPUs together."""
    from simulator.layers import ordered_ops, transformer_layer

    per_rank = sum(op.flops for op in ordered_ops(transformer_layer(job.model, job.plan).recompute))
    if per_rank == 0:
        return 0.0
    plan = job.plan
    layers = sum(_recomputed_layers(job, n) for n in job.layers_per_chunk) * plan.virtual_pipeline_stages
    micro_batches = plan.global_batch_size // plan.micro_batch_size
    return per_rank * plan.tensor_parallel_size * layers * micro_batches


def _recomputed_layers(job: Job, chunk_layers: int) -> int:
    r = job.plan.recompute
    if r.granularity is RecomputeGranularity.none:
        return 0
    if r.granularity is RecomputeGranularity.full and r.method is RecomputeMethod.block:
        return min(r.num_layers, chunk_layers)
    return chunk_layers


def _dp_time(cost, job: Job, kind: CollectiveKind, nbytes: float) -> float:
    d = job.plan.data_parallel_size
    if d == 1 or nbytes <= 0:
        return 0.0
    return cost.collective_time_s(kind, int(nbytes), Group(size=d, stride=job.plan.tensor_parallel_size))


def _p2p_times(cost, job: Job) -> tuple[float, ...]:
    """One activation (or gradient) from stage i to stage (i + 1) % p, per TP rank.

    Megatron sends a 1/t slice per TP rank: the activation is already sequence-sharded under SP,
    and without SP its scatter-gather optimisation all-gathers the slices over NVLink on arrival.
    Stage i holds ranks [i t d, (i + 1) t d) (Megatron's order: TP, then DP, then PP), so a
    boundary stays inside a node only when both stages share it.
    """
    m, plan = job.model, job.plan
    t, p = plan.tensor_parallel_size, plan.pipeline_parallel_size
    full = m.seq_length * plan.micro_batch_size * m.hidden_size * plan.precision.activation_bytes
    gather = 0.0
    if t > 1 and not plan.sequence_parallel:
        gather = cost.op_time_s(Op("pipeline_all_gather", OpKind.collective,
                                   collective=CollectiveOp(CollectiveKind.all_gather, full, t)))
    stage_gpus, node = t * plan.data_parallel_size, job.cluster.gpus_per_node
    times = []
    for i in range(p):
        first, last = i * stage_gpus, ((i + 1) % p) * stage_gpus
        inter_node = stage_gpus >= node or first // node != last // node
        times.append(cost.p2p_time_s(full // t, inter_node) + gather)
    return tuple(times)


def _optimizer_time(cost, job: Job, params: int) -> float:
    d = job.plan.data_parallel_size
    shard = params / d if job.plan.use_distributed_optimizer else params
    step = cost.op_time_s(Op("optimizer", OpKind.elementwise, bytes_moved=shard * OPTIMIZER_BYTES_PER_PARAM))
    if job.plan.use_distributed_optimizer:
        step += _dp_time(cost, job, CollectiveKind.all_gather, params * 2)
    return step


def build_work(job: Job, cost, lt: LayerTimes, ext: StageExtraTimes) -> PipelineWork:
    plan = job.plan
    p, v = plan.pipeline_parallel_size, plan.virtual_pipeline_stages
    grad_kind = CollectiveKind.reduce_scatter if plan.use_distributed_optimizer else CollectiveKind.all_reduce
    bwd_plain = lt.backward_s
    bwd_rec = lt.backward_with_recompute_s
    tied = not job.model.untie_embeddings_and_output_weights and p > 1
    embedding_grad_bytes = job.model.vocab_size * job.model.hidden_size // plan.tensor_parallel_size * 4
    stages = []
    for s, n in enumerate(job.layers_per_chunk):
        rec = _recomputed_layers(job, n)
        fwd, bwd, reduce = [], [], []
        stage_params = stage_parameters(job, s)
        for c in range(v):
            f = n * lt.forward_s
            b = rec * bwd_rec + (n - rec) * bwd_plain
            if s == 0 and c == 0:
                f += ext.embedding_forward.duration_s
                b += ext.embedding_backward.duration_s
            if s == p - 1 and c == v - 1:
                f += ext.output_forward.duration_s
                b += ext.output_backward.duration_s
            fwd.append(f)
            bwd.append(b)
            r = _dp_time(cost, job, grad_kind, stage_params / v * 4)
            if tied and ((s == 0 and c == 0) or (s == p - 1 and c == v - 1)):
                r += cost.collective_time_s(CollectiveKind.all_reduce, embedding_grad_bytes,
                                            Group(size=2, stride=plan.tensor_parallel_size * plan.data_parallel_size * (p - 1)))
            reduce.append(r)
        stages.append(StageWork(tuple(fwd), tuple(bwd), tuple(reduce), _optimizer_time(cost, job, stage_params)))
    send = _p2p_times(cost, job) if p > 1 else (0.0,)
    return PipelineWork(tuple(stages), send, plan.overlap_grad_reduce, plan.overlap_p2p_comm)


def simulate_job(job: Job, profile=None, tokens: float | None = None, record: bool = False,
                 layers: LayerTimes | None = None) -> Simulation:
    """Play one iteration of ``job``; ``layers`` replaces the cost model's per-layer times (e.g. by
    measured ones, to see what the rest of the model makes of them)."""
    cost = cost_model_for(job, profile)
    lt = layers if layers is not None else layer_times(job, cost=cost)
    ext = extra_times(job, cost)
    mem = memory_plan(job)
    work = build_work(job, cost, lt, ext)
    plan = job.plan
    schedule = build_schedule(plan.pipeline_parallel_size, plan.num_micro_batches, plan.virtual_pipeline_stages,
                              plan.schedule.value)
    result = simulate(schedule, work, record=record)
    est = _summarise(job, cost, lt, ext, result, mem, tokens)
    return Simulation(est, result, lt, ext)


def estimate(job: Job, profile=None, tokens: float | None = None) -> Estimate:
    """Predict one training iteration of ``job`` (and, with ``tokens``, the whole run)."""
    return simulate_job(job, profile, tokens).estimate


def _summarise(job, cost, lt, ext, result, mem, tokens) -> Estimate:
    plan = job.plan
    p, v, m = plan.pipeline_parallel_size, plan.virtual_pipeline_stages, plan.num_micro_batches
    T = result.iteration_time_s
    ready = [r.grads_ready_s for r in result.stages]
    crit = max(range(p), key=lambda s: (ready[s], -s))
    r = result.stages[crit]
    n = job.layers_per_chunk[crit]
    rec = _recomputed_layers(job, n)
    compute = m * v * (n * lt.forward.compute_s + rec * lt.backward.compute_s + (n - rec) * lt.backward_only.compute_s)
    if crit == 0:
        compute += m * (ext.embedding_forward.compute_s + ext.embedding_backward.compute_s)
    if crit == p - 1:
        compute += m * (ext.output_forward.compute_s + ext.output_backward.compute_s)
    compute = min(compute, r.busy_s)
    breakdown = Breakdown(
        compute_s=compute,
        tp_communication_s=r.busy_s - compute,
        pipeline_bubble_s=r.wait_s - r.transfer_wait_s + (max(ready) - ready[crit]),
        pipeline_transfer_s=r.transfer_wait_s,
        data_parallel_s=ready[crit] - r.last_backward_end_s,
        optimizer_s=T - max(ready),
    )
    tokens_per_iter = plan.global_batch_size * job.model.seq_length
    model_flops = model_flops_per_sequence(job) * plan.global_batch_size
    hw_flops = model_flops + recompute_flops_per_iteration(job)
    peak = job.num_gpus * cost.peak_flops
    mfu, hfu = model_flops / (T * peak), hw_flops / (T * peak)
    note = None
    if hfu > 1:
        # Not an error in the time model: FP8 GEMMs run up to the fp8 peak (2x bf16 on Hopper), and Eq. 7
        # counts the whole s x s attention product while a causal kernel computes half of it. A
        # utilisation is at most 1, so it is capped and the rate stays in tflops_per_gpu.
        why = [why for cond, why in (
            (plan.fp8_format is not None, "the FP8 GEMMs run above that peak"),
            (plan.use_flash_attention, "Eq. 7 counts the whole s x s attention product that the causal kernel halves"),
        ) if cond] or ["the ops ran faster than that peak"]
        note = (f"MFU {mfu:.3f} and HFU {hfu:.3f} against the {plan.precision.value} dense peak are shown capped "
                f"at 1 ({' and '.join(why)}); tflops_per_gpu gives the rate")
        mfu, hfu = min(mfu, 1.0), 1.0
    tokens_per_s = tokens_per_iter / T
    days = hours = None
    if tokens is not None:
        seconds = tokens / tokens_per_s
        days = seconds / SECONDS_PER_DAY
        hours = seconds / 3600 * job.num_gpus
    return Estimate(
        iteration_time_s=T,
        mfu=mfu,
        hfu=hfu,
        utilisation_note=note,
        tokens_per_s=tokens_per_s,
        tflops_per_gpu=model_flops / T / job.num_gpus / 1e12,
        model_flops_per_iteration=model_flops,
        hardware_flops_per_iteration=hw_flops,
        breakdown=breakdown,
        critical_stage=crit,
        layer=LayerTimesOut(forward_s=lt.forward_s, backward_s=lt.backward_s, recompute_s=lt.recompute_s),
        memory=mem,
        num_gpus=job.num_gpus,
        tokens=tokens,
        training_days=days,
        gpu_hours=hours,
    )
