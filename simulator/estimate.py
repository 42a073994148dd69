"""``estimate(job)``: iteration time, its breakdown, MFU/HFU, tokens/s and training days.

The layer graph is costed op by op (simulator.timing), the pipeline is played by the
discrete-event engine (simulator.engine), and memory comes from simulator.memory. Nothing here
reads an end-to-end measurement.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from pydantic import BaseModel, ConfigDict, Field

from simulator import fast_engine
from simulator.costs import Group
from simulator.engine import EngineResult, PipelineWork, StageWork, simulate
from simulator.layers import CollectiveKind, CollectiveOp, Op, OpKind, Stream
from simulator.layout import RankLayout
from simulator.memory import MemoryPlan, memory_plan, stage_expert_parameters, stage_parameters
from simulator.plan import DataParallelSharding, Job, Precision, RecomputeGranularity, RecomputeMethod
from simulator.schedules import build_schedule
from simulator.stage_work import (
    OptimizerStep,
    StageCommunication,
    StageSteps,
    pipeline_work,
    stage_kinds,
    stage_work,
)
from simulator.timing import (
    LayerTimes,
    Span,
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
MASTER_COPY_BYTES_PER_PARAM = 4 + 2
OPTIMIZER_BYTES_PER_PARAM = 4 + 8 + 28 + MASTER_COPY_BYTES_PER_PARAM + 4


def optimizer_bytes_per_param(precision: Precision) -> int:
    """The step's bytes per parameter; with fp32 weights (Megatron's ``FP32Optimizer``, the reference loop on
    a CPU) Adam updates the weights themselves and there is no master copy to write back."""
    return OPTIMIZER_BYTES_PER_PARAM - (MASTER_COPY_BYTES_PER_PARAM if precision is Precision.fp32 else 0)


class Breakdown(BaseModel):
    """Where the iteration goes on its critical (slowest) stage; the parts sum to the iteration time."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    compute_s: float = Field(description="Compute kernels (GEMMs, attention, memory-bound ops), recompute included.")
    tp_communication_s: float = Field(description="Tensor-parallel collectives not hidden behind compute (and, for "
                                                  "an MoE model, the expert-parallel dispatch and combine).")
    pipeline_bubble_s: float = Field(description="Compute stream idle for want of work (warm-up, cool-down, imbalance).")
    pipeline_transfer_s: float = Field(description="Idle while an activation or gradient was in flight.")
    data_parallel_s: float = Field(description="Gradient reduction not hidden behind the backward pass.")
    optimizer_s: float = Field(description="Optimizer step (and the distributed optimizer's parameter all-gather).")
    host_overhead_s: float = Field(
        0.0, description="Device idle while the host issues work (Python, dispatch and launch of short ops, "
                         "per-micro-batch and per-exchange host work); part of the steps, apart from compute.")


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
    layer: LayerTimesOut = Field(description="One transformer layer, one micro-batch, one TP rank (of an MoE model: "
                                             "the kind most of its layers are).")
    moe_layer: LayerTimesOut | None = Field(None, description="One MoE layer (router, dispatch, experts, combine), "
                                                              "for a mixture-of-experts model.")
    expert_dispatch_s: float | None = Field(
        None, description="Of the iteration, the critical stage's time in the MoE token dispatch and combine "
                          "collectives (all-to-all, or all-gather and reduce-scatter), on the communication stream; "
                          "the experts wait for them. None for a dense model.")
    moe_load_imbalance: float | None = Field(
        None, description="The busiest expert rank's tokens over the balanced share that the MoE layers were planned "
                          "for (the model's moe_load_imbalance). None for a dense model.")
    memory: MemoryPlan
    num_gpus: int
    tokens: float | None = None
    training_days: float | None = None
    gpu_hours: float | None = None
    iteration_time_s_low: float | None = Field(
        None, description="The iteration time with every unpinned profile constant at its fast end (the band).")
    iteration_time_s_high: float | None = Field(None, description="... at its slow end.")
    training_days_low: float | None = None
    training_days_high: float | None = None
    band_drivers: tuple[dict, ...] | None = Field(
        None, description="The unpinned constants that move the answer most, with their ranges and effects.")
    outside_validated_range: bool = Field(
        False, description="MFU above the best published run on this GPU, or no published run on it at all.")
    validation_note: str = Field("", description="Why the answer is outside the validated range, if it is.")


@dataclass(frozen=True)
class Simulation:
    """The estimate plus what produced it (for traces and timelines)."""

    estimate: Estimate
    engine: EngineResult
    layer: LayerTimes
    extras: StageExtraTimes
    moe_layer: LayerTimes | None = None

    def layer_of(self, moe: bool) -> LayerTimes:
        return self.moe_layer if moe and self.moe_layer is not None else self.layer


def model_flops_per_sequence(job: Job) -> float:
    """Forward + backward model FLOPs of one sequence (Korthikanti Eq. 7, generalised to GQA/SwiGLU and
    to mixture-of-experts layers, which count the parameters a token passes: the router, its top-k
    experts and the shared experts, not every expert).

    Attention scores and context count the full s x s product, as the paper does, even when a
    causal kernel skips half of it.
    """
    m = job.model
    s = m.seq_length

    def layer(moe: bool) -> float:
        return 2 * s * _matmul_parameters(m, moe) + 4 * s * s * m.q_size

    moe_layers = m.num_moe_layers
    logits = 2 * s * m.hidden_size * m.vocab_size
    return 3.0 * ((m.num_layers - moe_layers) * layer(False) + (moe_layers * layer(True) if moe_layers else 0)
                  + logits)


def _matmul_parameters(m, moe: bool) -> int:
    """A layer's weight-matrix parameters one token multiplies with (active ones for an MoE layer)."""
    def mlp_biases(ffn: int) -> int:
        return (2 if m.swiglu else 1) * ffn + m.hidden_size

    weights = m.layer_parameters(moe=moe, active=True) - 2 * m.norm_parameters() - (
        2 * m.head_dim if m.qk_layernorm else 0)
    if not m.add_bias_linear:
        return weights
    biases = m.q_size + 2 * m.kv_size + m.hidden_size
    if moe:
        biases += m.moe_router_topk * mlp_biases(m.expert_ffn_size)
        if m.moe_shared_expert_intermediate_size:
            biases += mlp_biases(m.moe_shared_expert_intermediate_size)
    else:
        biases += mlp_biases(m.ffn_size)
    return weights - biases


def recompute_flops_per_iteration(job: Job) -> float:
    """FLOPs replayed by recompute in one iteration, all GPUs together."""
    from simulator.layers import ordered_ops, transformer_layer

    plan = job.plan
    if plan.recompute.granularity is RecomputeGranularity.none:
        return 0.0
    per_rank = {moe: sum(op.flops for op in ordered_ops(transformer_layer(job.model, plan, moe).recompute))
                for moe in ((False, True) if job.model.is_moe else (False,))}
    flops = 0.0
    for stage, chunks in enumerate(job.chunk_layers):
        for c, n in enumerate(chunks):
            rec = _recomputed_layers(job, n)
            for moe, _, replayed in _replayed_runs(job.chunk_runs(stage, c), rec):
                flops += per_rank[moe] * replayed
    micro_batches = plan.global_batch_size // plan.micro_batch_size
    # each rank of a TP x CP group replays its part; expert work is per rank too (tokens x k copies)
    return flops * plan.tensor_parallel_size * plan.context_parallel_size * micro_batches


def _replayed_runs(runs: tuple[tuple[bool, int], ...], recomputed: int) -> list[tuple[bool, int, int]]:
    """A chunk's runs as (MoE, layers, of them recomputed): recompute covers the chunk's first
    ``recomputed`` layers (all of them, but for full/block)."""
    out, seen = [], 0
    for moe, k in runs:
        out.append((moe, k, max(0, min(k, recomputed - seen))))
        seen += k
    return out


def _recomputed_layers(job: Job, chunk_layers: int) -> int:
    r = job.plan.recompute
    if r.granularity is RecomputeGranularity.none:
        return 0
    if r.granularity is RecomputeGranularity.full and r.method is RecomputeMethod.block:
        return min(r.num_layers, chunk_layers)
    return chunk_layers


def _dp_time(cost, job: Job, kind: CollectiveKind, nbytes: float, expert: bool = False) -> float:
    """A collective over the ranks that hold the same parameters: DP x CP, TP ranks apart; ``expert``:
    the expert-data-parallel ranks that hold the same experts (ETP x EP ranks apart)."""
    if nbytes <= 0:
        return 0.0
    plan = job.plan
    if expert:  # etp x ep x edp decompose a stage's tp x cp x dp ranks (Megatron's expert rank generator)
        d, stride = plan.expert_data_parallel_size, plan.expert_tp_size * plan.expert_model_parallel_size
    else:
        d, stride = plan.gradient_group_size, plan.tensor_parallel_size
    if d == 1:
        return 0.0
    return cost.collective_time_s(kind, int(nbytes), Group(size=d, stride=stride))


def p2p_times(cost, job: Job) -> tuple[float, ...]:
    """One activation (or gradient) from stage i to stage (i + 1) % p, per TP rank.

    Megatron sends a 1/t slice per TP rank: the activation is already sequence-sharded under SP,
    and without SP its scatter-gather optimisation all-gathers the slices over NVLink on arrival.
    Every rank of a stage sends at once, so where a boundary leaves the node the sends of the GPUs
    behind one NIC share it (4 NICs for 8 GPUs: two sends per NIC); ``RankLayout`` says which.
    """
    m, plan = job.model, job.plan
    t = plan.tensor_parallel_size
    full = m.seq_length * plan.micro_batch_size * m.hidden_size * plan.precision.activation_bytes
    full //= plan.context_parallel_size  # each CP rank sends its own tokens
    gather = 0.0
    if t > 1 and not plan.sequence_parallel:
        gather = cost.op_time_s(Op("pipeline_all_gather", OpKind.collective,
                                   collective=CollectiveOp(CollectiveKind.all_gather, full, t)))
    boundaries = _pipeline_boundaries(RankLayout.of(job), job.cluster.nics_per_node)
    return tuple(cost.p2p_time_s(full // t, inter_node, sharing) + gather for inter_node, sharing in boundaries)


@lru_cache(maxsize=4096)
def _pipeline_boundaries(layout: RankLayout, nics_per_node: int) -> tuple[tuple[bool, int], ...]:
    return tuple(layout.pipeline_boundary(i, nics_per_node) for i in range(layout.pp))


def grad_buckets(job: Job, params: float) -> int:
    """Buckets Megatron-Core's DDP splits ``params`` gradients into: one without overlap, else
    ``ddp_bucket_size`` parameters each (default max(40M, 1M x DP), as Megatron sizes them)."""
    plan = job.plan
    if not plan.overlap_grad_reduce or params <= 0:
        return 1
    size = plan.ddp_bucket_size or max(40_000_000, 1_000_000 * plan.gradient_group_size)
    return max(1, math.ceil(params / size))


def _optimizer_step(cost, job: Job, params: int, expert_params: int = 0) -> OptimizerStep:
    """The optimizer step; with the distributed optimizer, the all-gather of the updated bf16
    parameters, which ``overlap_param_gather`` issues bucket by bucket during the next forward: only
    the first bucket, and what the forward step cannot cover, stays exposed. Of ``params``,
    ``expert_params`` are sharded and gathered over the expert-data-parallel group instead."""
    plan = job.plan
    dense = params - expert_params
    shard = (dense / plan.gradient_group_size + expert_params / plan.expert_data_parallel_size
             if plan.shards_optimizer else params)
    step_bytes = shard * optimizer_bytes_per_param(plan.precision)
    step = cost.op_time_s(Op("optimizer", OpKind.elementwise, bytes_moved=step_bytes))
    bucket, n = None, 1
    if plan.shards_optimizer and plan.sharding is not DataParallelSharding.optim_grads_params:
        n = grad_buckets(job, params) if plan.overlap_param_gather else 1
        ab = plan.precision.activation_bytes
        bucket = (_dp_time(cost, job, CollectiveKind.all_gather, dense * ab / n)
                  + _dp_time(cost, job, CollectiveKind.all_gather, expert_params * ab / n, expert=True))
    return OptimizerStep(step, bucket, n, plan.overlap_param_gather,
                         cost.host.iteration_s if cost.host is not None else None)


def step_spans(job: Job, cost, layers: dict[bool, LayerTimes], ext: StageExtraTimes, stage: int,
               chunk: int) -> tuple[Span, Span]:
    """The forward and backward pipeline steps of one (stage, chunk), as the host issues them.

    Each step starts from an empty queue: Megatron synchronises the device at every pipeline
    exchange and when it broadcasts each micro-batch's data. A forward step begins with the
    micro-batch's host work (data, masks, schedule); a step that talks to a neighbour stage ends
    with the exchange call. ``layers``: the times of a dense layer (False) and of an MoE layer (True).
    """
    return (forward_span(job, cost, layers, ext, stage, chunk),
            backward_span(job, cost, layers, ext, stage, chunk))


def forward_span(job: Job, cost, layers: dict[bool, LayerTimes], ext: StageExtraTimes, stage: int,
                 chunk: int) -> Span:
    """The forward step of ``step_spans`` (it does not depend on the recompute policy)."""
    plan, host = job.plan, cost.host
    p, v = plan.pipeline_parallel_size, plan.virtual_pipeline_stages
    asynchronous = cost.asynchronous
    fwd = Span.host_only(host.micro_batch_s, asynchronous) if host is not None else Span(0.0, 0.0, 0.0, asynchronous)
    if stage == 0 and chunk == 0:
        fwd = fwd.then(ext.embedding_forward.span)
    for moe, k in job.chunk_runs(stage, chunk):
        fwd = fwd.then(layers[moe].forward.span.times(k))
    if stage == p - 1 and chunk == v - 1:
        fwd = fwd.then(ext.output_forward.span)
    return _then_exchange(fwd, p, host, asynchronous)


def backward_span(job: Job, cost, layers: dict[bool, LayerTimes], ext: StageExtraTimes, stage: int,
                  chunk: int) -> Span:
    """The backward step of ``step_spans``, with the recompute it replays."""
    plan, host = job.plan, cost.host
    p, v = plan.pipeline_parallel_size, plan.virtual_pipeline_stages
    rec = _recomputed_layers(job, job.chunk_layers[stage][chunk])
    asynchronous = cost.asynchronous
    bwd = Span(0.0, 0.0, 0.0, asynchronous)
    if stage == p - 1 and chunk == v - 1:
        bwd = bwd.then(ext.output_backward.span)
    # backward runs the chunk's layers last to first; block recompute covers the first ones
    for moe, k, replayed in reversed(_replayed_runs(job.chunk_runs(stage, chunk), rec)):
        lt = layers[moe]
        bwd = bwd.then(lt.backward_only.span.times(k - replayed)).then(lt.backward.span.times(replayed))
    if stage == 0 and chunk == 0:
        bwd = bwd.then(ext.embedding_backward.span)
    return _then_exchange(bwd, p, host, asynchronous)


def _then_exchange(span: Span, p: int, host, asynchronous: bool) -> Span:
    """``span`` followed by the call that exchanges with the neighbour stage (none without a pipeline)."""
    if p > 1 and host is not None:
        return span.then(Span.host_only(host.pipeline_exchange_s, asynchronous))
    return span


def sequence_parallel_grad_bytes(job: Job, stage: int) -> int:
    """Gradient bytes Megatron all-reduces over TP after the backward under SP (``_allreduce_layernorm_grads``):
    the replicated parameters each rank computed on its own sequence shard, the norms' and the
    row-parallel layers' biases, coalesced into one call per stage."""
    plan, m = job.plan, job.model
    if not plan.sequence_parallel or plan.tensor_parallel_size == 1:
        return 0
    per_layer = 2 * m.norm_parameters() + (2 * m.hidden_size if m.add_bias_linear else 0)
    params = job.layers_per_stage[stage] * per_layer + (m.norm_parameters() if stage == plan.pipeline_parallel_size - 1
                                                        else 0)
    return params * plan.grad_bytes


def stage_communication(job: Job, cost, s: int) -> StageCommunication:
    plan = job.plan
    p, v = plan.pipeline_parallel_size, plan.virtual_pipeline_stages
    grad_kind = CollectiveKind.reduce_scatter if plan.shards_optimizer else CollectiveKind.all_reduce
    tied = not job.model.untie_embeddings_and_output_weights and p > 1
    reduce, buckets, fsdp_s = [], [], []
    stage_params = stage_parameters(job, s)
    expert_params = stage_expert_parameters(job, s)
    chunk_params = stage_params / v
    chunk_experts = expert_params / v  # expert gradients: buckets of their own, over the EDP group
    fsdp = plan.sharding is DataParallelSharding.optim_grads_params
    for c in range(v):
        nb = grad_buckets(job, chunk_params)
        if fsdp:
            # Megatron-FSDP gathers each bucket of parameters before it is used, forward and again backward,
            # prefetching the next while one computes, and reduce-scatters each micro-batch's gradients: the
            # first bucket and what compute cannot cover stay exposed (``stage_work``)
            nb = max(nb, math.ceil(chunk_params / max(40_000_000, 1_000_000 * plan.gradient_group_size)))
            gather = nb * (_dp_time(cost, job, CollectiveKind.all_gather,
                                    (chunk_params - chunk_experts) * plan.precision.activation_bytes / nb)
                           + _dp_time(cost, job, CollectiveKind.all_gather,
                                      chunk_experts * plan.precision.activation_bytes / nb, expert=True))
            scatter = nb * (_dp_time(cost, job, CollectiveKind.reduce_scatter,
                                     (chunk_params - chunk_experts) * plan.grad_bytes / nb)
                            + _dp_time(cost, job, CollectiveKind.reduce_scatter, chunk_experts * plan.grad_bytes / nb,
                                       expert=True))
            fsdp_s.append((gather, scatter))
        r = 0.0 if fsdp else nb * (
            _dp_time(cost, job, grad_kind, (chunk_params - chunk_experts) * plan.grad_bytes / nb)
            + _dp_time(cost, job, grad_kind, chunk_experts * plan.grad_bytes / nb, expert=True))
        if not fsdp and plan.gradient_group_size > 1:
            # Megatron's DDP scales each bucket by 1/DP in place before reducing it (``average_in_collective`` off,
            # its default): one read and one write of the gradients
            r += cost.op_time_s(Op("gradient_scaling", OpKind.elementwise, bytes_moved=2 * chunk_params * plan.grad_bytes))
        if tied and ((s == 0 and c == 0) or (s == p - 1 and c == v - 1)):
            embedding_grad_bytes = job.model.vocab_size * job.model.hidden_size // plan.tensor_parallel_size
            r += cost.collective_time_s(CollectiveKind.all_reduce, embedding_grad_bytes * plan.grad_bytes,
                                        Group(size=2, stride=plan.num_gpus // p * (p - 1)))
        if c == 0:  # after the stage's last backward (chunk 0's), with the data-parallel step
            r += cost.collective_time_s(CollectiveKind.all_reduce, sequence_parallel_grad_bytes(job, s),
                                        Group(size=plan.tensor_parallel_size, stride=1))
        reduce.append(r)
        buckets.append(nb)
    return StageCommunication(tuple(buckets), tuple(reduce), tuple(fsdp_s) if fsdp else None,
                              _optimizer_step(cost, job, stage_params, expert_params))


def _stage_work(job: Job, cost, layers: dict[bool, LayerTimes], ext: StageExtraTimes, s: int) -> StageWork:
    steps = tuple(step_spans(job, cost, layers, ext, s, c) for c in range(job.plan.virtual_pipeline_stages))
    return stage_work(StageSteps.of(steps), stage_communication(job, cost, s))


def layer_kinds(job: Job, cost, lt: LayerTimes | None = None) -> dict[bool, LayerTimes]:
    """The times of each kind of layer the model has: dense (False; ``lt`` where given) and MoE (True)."""
    m = job.model
    kinds = {}
    if lt is not None or m.num_moe_layers < m.num_layers:
        kinds[False] = lt if lt is not None else layer_times(job, cost=cost)
    if m.is_moe:
        kinds[True] = layer_times(job, cost=cost, moe=True)
    return kinds


def build_work(job: Job, cost, lt: LayerTimes | None, ext: StageExtraTimes,
               moe_lt: LayerTimes | None = None) -> PipelineWork:
    """The engine's per-step work; ``lt`` is a dense layer's times, ``moe_lt`` an MoE layer's (each computed
    where the model has such layers and it is not given)."""
    plan = job.plan
    p = plan.pipeline_parallel_size
    layers = layer_kinds(job, cost, lt)
    if moe_lt is not None:
        layers[True] = moe_lt
    send = p2p_times(cost, job) if p > 1 else (0.0,)
    firsts, kind_of = stage_kinds(job.layer_runs if job.model.is_moe else job.chunk_layers)
    return pipeline_work(plan, kind_of, [_stage_work(job, cost, layers, ext, s) for s in firsts], send,
                         cost.profile.step_jitter)


def simulate_job(job: Job, profile=None, tokens: float | None = None, record: bool = False,
                 layers: LayerTimes | None = None) -> Simulation:
    """Play one iteration of ``job``; ``layers`` replaces the cost model's per-layer times (e.g. by
    measured ones, to see what the rest of the model makes of them)."""
    cost = cost_model_for(job, profile)
    kinds = layer_kinds(job, cost, layers)
    lt = kinds.get(False, kinds.get(True))
    ext = extra_times(job, cost)
    mem = memory_plan(job)
    work = build_work(job, cost, kinds.get(False), ext, kinds.get(True))
    plan = job.plan
    p, m, v, kind = plan.pipeline_parallel_size, plan.num_micro_batches, plan.virtual_pipeline_stages, plan.schedule.value
    if record:  # the simpy engine keeps every interval for traces and timelines
        result = simulate(build_schedule(p, m, v, kind), work, record=True)
    else:  # the same recurrence without the event machinery (tests hold the two equal)
        result = fast_engine.run(p, m, v, work, kind)
    est = _summarise(job, cost, kinds, ext, work, result, mem, tokens)
    return Simulation(est, result, lt, ext, kinds.get(True))


def estimate(job: Job, profile=None, tokens: float | None = None) -> Estimate:
    """Predict one training iteration of ``job`` (and, with ``tokens``, the whole run)."""
    return simulate_job(job, profile, tokens).estimate


def _moe_dispatch_s(timeline) -> float:
    """Time a phase's MoE dispatch and combine collectives take on the communication stream."""
    return sum(iv.end_s - iv.start_s for iv in timeline.intervals
               if iv.stream is Stream.tp_comm and ".moe." in f".{iv.name}")


def _summarise(job, cost, layers, ext, work, result, mem, tokens) -> Estimate:
    plan = job.plan
    p, m = plan.pipeline_parallel_size, plan.num_micro_batches
    T = result.iteration_time_s
    ready = [r.grads_ready_s for r in result.stages]
    crit = max(range(p), key=lambda s: (ready[s], -s))
    r = result.stages[crit]
    compute = dispatch = 0.0
    for c, n in enumerate(job.chunk_layers[crit]):
        rec = _recomputed_layers(job, n)
        for moe, k, rk in _replayed_runs(job.chunk_runs(crit, c), rec):
            lt = layers[moe]
            compute += m * (k * lt.forward.compute_s + rk * lt.backward.compute_s + (k - rk) * lt.backward_only.compute_s)
            if moe:
                dispatch += m * (k * _moe_dispatch_s(lt.forward) + rk * _moe_dispatch_s(lt.backward)
                                 + (k - rk) * _moe_dispatch_s(lt.backward_only))
    if crit == 0:
        compute += m * (ext.embedding_forward.compute_s + ext.embedding_backward.compute_s)
    if crit == p - 1:
        compute += m * (ext.output_forward.compute_s + ext.output_backward.compute_s)
    compute = min(compute, r.busy_s)
    sw = work.stages[crit]
    host_wait = min(m * (sum(sw.forward_host_wait_s) + sum(sw.backward_host_wait_s)), r.busy_s - compute)
    exposed = r.busy_s - compute - host_wait
    if abs(exposed) <= 1e-9 * T:  # nothing but rounding left between the parts
        exposed = 0.0
    breakdown = Breakdown(
        compute_s=compute,
        tp_communication_s=exposed,
        pipeline_bubble_s=r.wait_s - r.transfer_wait_s + (max(ready) - ready[crit]),
        pipeline_transfer_s=r.transfer_wait_s,
        data_parallel_s=ready[crit] - r.last_backward_end_s,
        optimizer_s=T - max(ready),
        host_overhead_s=host_wait,
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
    validation = validation_note(job, model_flops / (T * peak))
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
        layer=_times_out(layers[job.model.is_moe and 2 * job.model.num_moe_layers >= job.model.num_layers]),
        moe_layer=_times_out(layers[True]) if job.model.is_moe else None,
        expert_dispatch_s=dispatch if job.model.is_moe else None,
        moe_load_imbalance=job.model.moe_load_imbalance if job.model.is_moe else None,
        memory=mem,
        num_gpus=job.num_gpus,
        tokens=tokens,
        training_days=days,
        gpu_hours=hours,
        outside_validated_range=bool(validation),
        validation_note=validation,
    )


def _times_out(lt: LayerTimes) -> LayerTimesOut:
    return LayerTimesOut(forward_s=lt.forward_s, backward_s=lt.backward_s, recompute_s=lt.recompute_s)


def validation_note(job: Job, mfu: float) -> str:
    """Why a prediction lies outside the range the model was checked in ('' when it does not)."""
    gpu = job.cluster.gpu
    if gpu.best_published_mfu is None:
        return (f"no published end-to-end run on {gpu.name} is in the repository, so this answer is not validated "
                "end to end; calibrate and validate a run before trusting it")
    if mfu > gpu.best_published_mfu:
        return (f"MFU {mfu:.1%} is above the best published run on {gpu.name} ({gpu.best_published_mfu:.1%}): "
                "outside the range the model was validated in")
    return ""
