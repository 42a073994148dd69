"""A stage's work as the engine plays it, put together from two parts that plans share separately: its
chunks' forward and backward steps (the layers' compute, which the micro-batch and the recompute policy
set) and its data-parallel part (gradient buckets and their reduction, Megatron-FSDP's gathers, the
optimizer step; which they do not). ``build_work`` below computes both for one job; the search
computes each once for the candidates that have it alike (``simulator.planner.memo``), and both put a
stage together here, with the same arithmetic.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Sequence

from simulator.cost import Group
from simulator.graph.layers import CollectiveKind, CollectiveOp, Op, OpKind
from simulator.graph.parameters import stage_expert_parameters, stage_outer_parameters, stage_parameters
from simulator.schedule.engine import PipelineWork, StageWork
from simulator.schedule.timing import LayerTimes, Span, StageExtraTimes, layer_times
from simulator.spec.layout import RankLayout
from simulator.spec.plan import (
    DataParallelSharding,
    Job,
    ParallelPlan,
    Precision,
    RecomputeGranularity,
    RecomputeMethod,
)


@dataclass(frozen=True)
class OptimizerStep:
    """A stage's optimizer step, apart from the first forward step its parameter gather may hide behind."""

    step_s: float  # the optimizer kernels
    # one bucket of the distributed optimizer's parameter all-gather; under Megatron-FSDP the root unit's gather,
    # which stays gathered from the step's first forward to its end (None: no gather)
    gather_s: float | None
    buckets: int
    overlap_param_gather: bool
    host_s: float | None  # the host's work once per iteration

    def time_s(self, first_forward_s: float) -> float:
        step = self.step_s
        if self.gather_s is not None:
            bucket, n = self.gather_s, self.buckets
            step += bucket + (max(0.0, (n - 1) * bucket - first_forward_s) if self.overlap_param_gather else 0.0)
        if self.host_s is not None:
            step += self.host_s
        return step


@dataclass(frozen=True)
class FsdpChunk:
    """Megatron-FSDP's collectives around one micro-batch's steps of a model chunk: the forward's gathers, of
    which ``first_s`` come before any compute can start, and the backward's gathers and reduce-scatters, of
    which ``edges_s`` come before its first or after its last compute."""

    forward_s: float
    first_s: float
    backward_s: float
    edges_s: float


@dataclass(frozen=True)
class StageCommunication:
    """A stage's data-parallel work, per model chunk: gradient buckets and reduction, and under
    Megatron-FSDP the (gather, scatter) each micro-batch's steps wait on; and the optimizer step.
    It does not depend on the micro-batch or the recompute policy, so the search shares it
    (``stage_communication`` computes it)."""

    buckets: tuple[int, ...]
    reduce_s: tuple[float, ...]
    fsdp_s: tuple[FsdpChunk, ...] | None
    optimizer: OptimizerStep
    overlap_slowdown: float = 0.0  # the profile's: compute beside a collective runs this much slower


@dataclass(frozen=True)
class StageSteps:
    """A stage's chunks' forward and backward steps, each from an empty queue, and of each the time the
    device waits for the host to issue its work."""

    forward_s: tuple[float, ...]
    backward_s: tuple[float, ...]
    forward_host_wait_s: tuple[float, ...]
    backward_host_wait_s: tuple[float, ...]

    @staticmethod
    def of(spans: tuple[tuple[Span, Span], ...]) -> "StageSteps":
        """From each chunk's (forward, backward) ``step_spans``."""
        return StageSteps(tuple(f.cold_s for f, _ in spans), tuple(b.cold_s for _, b in spans),
                          tuple(f.host_wait_s for f, _ in spans), tuple(b.host_wait_s for _, b in spans))


def stage_work(steps: StageSteps, comm: StageCommunication) -> StageWork:
    """A stage's work from its chunks' steps and its data-parallel part."""
    fwd, bwd = steps.forward_s, steps.backward_s
    if comm.fsdp_s is not None:
        fwd, bwd = list(fwd), list(bwd)
        slow = comm.overlap_slowdown
        for c, f in enumerate(comm.fsdp_s):
            # What comes before the first compute or after the last is exposed; the rest overlaps compute,
            # which runs slower beside it (the collectives take SMs and HBM bandwidth), and is exposed only
            # where it outlasts the compute.
            hidden_f = min(f.forward_s - f.first_s, fwd[c])
            hidden_b = min(f.backward_s - f.edges_s, bwd[c])
            fwd[c] += max(f.first_s, f.forward_s - fwd[c]) + slow * hidden_f
            bwd[c] += max(f.edges_s, f.backward_s - bwd[c]) + slow * hidden_b
        fwd, bwd = tuple(fwd), tuple(bwd)
    return StageWork(fwd, bwd, comm.reduce_s, comm.optimizer.time_s(fwd[0]), steps.forward_host_wait_s,
                     steps.backward_host_wait_s, comm.buckets)


def pipeline_work(plan: ParallelPlan, kind_of: tuple[int, ...], works: Sequence[StageWork],
                  send: tuple[float, ...], step_jitter: float = 0.0) -> PipelineWork:
    """The engine's work of every stage: ``works`` holds one per kind of stage, ``kind_of`` each stage's
    kind (``stage_kinds``); ``step_jitter`` the profile's."""
    return PipelineWork(tuple(works[k] for k in kind_of), send, plan.overlap_grad_reduce, plan.overlap_p2p_comm,
                        step_jitter, plan.data_parallel_size)


@lru_cache(maxsize=4096)
def stage_kinds(stage_layers: tuple) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(the first stage of each kind, each stage's kind). A stage's work depends only on its layers
    (``stage_layers[stage]``: its chunks' layer counts, or for an MoE model their runs) and whether it
    holds the embedding or the loss: uneven splits aside, the middle stages are one and the same."""
    p = len(stage_layers)
    index: dict[tuple, int] = {}
    firsts, kind_of = [], []
    for s, layers in enumerate(stage_layers):
        key = (layers, s == 0, s == p - 1)
        if key not in index:
            index[key] = len(firsts)
            firsts.append(s)
        kind_of.append(index[key])
    return tuple(firsts), tuple(kind_of)


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


def replayed_runs(runs: tuple[tuple[bool, int], ...], recomputed: int) -> list[tuple[bool, int, int]]:
    """A chunk's runs as (MoE, layers, of them recomputed): recompute covers the chunk's first
    ``recomputed`` layers (all of them, but for full/block)."""
    out, seen = [], 0
    for moe, k in runs:
        out.append((moe, k, max(0, min(k, recomputed - seen))))
        seen += k
    return out


def recomputed_layers(job: Job, chunk_layers: int) -> int:
    """Layers of a chunk whose backward replays their forward (full/block: the first k)."""
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


def _optimizer_step(cost, job: Job, params: int, expert_params: int = 0, root_params: int = 0) -> OptimizerStep:
    """The optimizer step; with the distributed optimizer, the all-gather of the updated bf16
    parameters, which ``overlap_param_gather`` issues bucket by bucket during the next forward: only
    the first bucket, and what the forward step cannot cover, stays exposed. Of ``params``,
    ``expert_params`` are sharded and gathered over the expert-data-parallel group instead.

    Megatron-FSDP gathers its units as they are used (``_fsdp_chunk``), except the root unit's
    ``root_params``: gathered before the step's first forward computes anything and released only when the
    step's gradients are synchronised, so once a step and exposed, as the next step's first gather."""
    plan = job.plan
    dense = params - expert_params
    shard = (dense / plan.gradient_group_size + expert_params / plan.expert_data_parallel_size
             if plan.shards_optimizer else params)
    step_bytes = shard * optimizer_bytes_per_param(plan.precision)
    step = cost.op_time_s(Op("optimizer", OpKind.elementwise, bytes_moved=step_bytes, kernel="optimizer"))
    bucket, n = None, 1
    if plan.sharding is DataParallelSharding.optim_grads_params:
        bucket = _dp_time(cost, job, CollectiveKind.all_gather, root_params * plan.gathered_param_bytes)
    elif plan.shards_optimizer:
        n = grad_buckets(job, params) if plan.overlap_param_gather else 1
        ab = plan.gathered_param_bytes
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
    rec = recomputed_layers(job, job.chunk_layers[stage][chunk])
    asynchronous = cost.asynchronous
    bwd = Span(0.0, 0.0, 0.0, asynchronous)
    if stage == p - 1 and chunk == v - 1:
        bwd = bwd.then(ext.output_backward.span)
    # backward runs the chunk's layers last to first; block recompute covers the first ones
    for moe, k, replayed in reversed(replayed_runs(job.chunk_runs(stage, chunk), rec)):
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


def embedding_group(job: Job) -> Group:
    """The pairs of first- and last-stage ranks that all-reduce the tied embeddings' gradients."""
    shape = RankLayout.of(job).embedding_group()
    return Group(shape.size, shape.stride)


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
            nb = job.chunk_layers[s][c] + 1
            fsdp_s.append(_fsdp_chunk(cost, job, s, c, stage_params, expert_params))
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
                                        embedding_group(job))
        if c == 0:  # after the stage's last backward (chunk 0's), with the data-parallel step
            r += cost.collective_time_s(CollectiveKind.all_reduce, sequence_parallel_grad_bytes(job, s),
                                        Group(size=plan.tensor_parallel_size, stride=1))
        reduce.append(r)
        buckets.append(nb)
    root = sum(stage_outer_parameters(job, s)) if fsdp else 0
    return StageCommunication(tuple(buckets), tuple(reduce), tuple(fsdp_s) if fsdp else None,
                              _optimizer_step(cost, job, stage_params, expert_params, root),
                              cost.overlap_compute_slowdown)


def _fsdp_chunk(cost, job: Job, s: int, c: int, stage_params: int, expert_params: int) -> FsdpChunk:
    """Megatron-FSDP's units are the transformer layers (its adapter wraps with fsdp_unit_modules=
    [TransformerLayer]) and one root unit for the rest: the embeddings, final norm and output layer, which
    for a large vocabulary outweigh several layers (Llama 3 8B: 1.05B against 0.22B a layer). It gathers
    each layer before it is used, prefetching the next while one computes, releases it after its forward
    and again after its backward, and reduce-scatters each micro-batch's gradients unit by unit. The root
    is released only when the step's gradients are synchronised (``finish_grad_sync``), so its gather is
    the step's, not a micro-batch's (``_optimizer_step``). So before a micro-batch's first compute comes the
    first layer's gather (issued as the root's forward starts, which is next to no compute); in the
    backward the last layer's gather comes before any compute (it is issued from that layer's output
    gradient, after the output layer's backward), and the first layer's and the root's reduce-scatters
    after all of it (the root's bucket waits for its last gradient, the embedding's)."""
    plan = job.plan
    before, after = stage_outer_parameters(job, s)
    layers, stage_layers = job.chunk_layers[s][c], job.layers_per_stage[s]
    root = (before if c == 0 else 0) + (after if c == plan.virtual_pipeline_stages - 1 else 0)
    dense = (stage_params - expert_params - before - after) / max(stage_layers, 1)
    experts = expert_params / max(stage_layers, 1)

    def unit(kind: CollectiveKind, bytes_per_param: int, n_dense: float, n_experts: float) -> float:
        return (_dp_time(cost, job, kind, n_dense * bytes_per_param)
                + _dp_time(cost, job, kind, n_experts * bytes_per_param, expert=True))

    ag, rs = CollectiveKind.all_gather, CollectiveKind.reduce_scatter
    gather, scatter = unit(ag, plan.gathered_param_bytes, dense, experts), unit(rs, plan.grad_bytes, dense, experts)
    root_scatter = unit(rs, plan.grad_bytes, root, 0)
    edge_gather, edge_scatter = (gather, scatter) if layers else (0.0, 0.0)
    return FsdpChunk(forward_s=layers * gather, first_s=edge_gather,
                     backward_s=layers * (gather + scatter) + root_scatter,
                     edges_s=edge_gather + edge_scatter + root_scatter)


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
