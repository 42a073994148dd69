"""Where a plan's GPU memory goes: weights, gradients, optimizer state and activations per pipeline stage.

Activations are not typed in as Korthikanti's closed forms: they are the sums of the tensors each
operation of ``simulator.graph.layers`` saves for its backward pass, times the layers of a chunk and the
chunks a stage holds at its peak. The tests check those sums against Table 2 and Figures 1 and 7.

Every number is per GPU (one tensor-parallel rank of one pipeline stage of one data-parallel
replica), in bytes.
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache
from typing import NamedTuple

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from simulator.graph.layers import LayerKey, _embedding_extras, _output_extras, layer_graph
from simulator.graph.parameters import (
    layer_parameters_per_rank,
    moe_layer_parameters_per_rank,
    stage_expert_parameters,
    stage_fp8_parameters,
    stage_parameters,
)
from simulator.spec.model import ModelSpec
from simulator.spec.plan import (
    DataParallelSharding,
    Job,
    ParallelPlan,
    PipelineSchedule,
    Precision,
    RecomputeGranularity,
    RecomputeMethod,
)
from simulator.spec.units import GIB

# The reserve, beyond the tensors the model accounts for, that a PyTorch/Megatron process needs:
# - CUDA context with the kernels of PyTorch, cuBLAS and NCCL loaded: 0.5-1 GiB on A100/H100 with
#   CUDA 11/12 (nvidia-smi shows it before the first tensor is allocated); we take 1 GiB.
# - NCCL communicator buffers (NCCL_BUFFSIZE = 4 MiB per channel and peer, for the TP, PP, DP and
#   embedding groups) and the cuBLAS workspaces of each stream: about 0.5 GiB together.
# - Allocator fragmentation: the caching allocator keeps freed blocks of varied sizes; activations
#   and recompute buffers are allocated and freed every micro-batch, out of order, so we add 10% of
#   them. Weights, gradients and optimizer state live in buffers allocated once (Megatron's
#   contiguous grad buffer) and do not fragment.
CONTEXT_RESERVE_BYTES = 1 * GIB
WORKSPACE_RESERVE_BYTES = GIB // 2
FRAGMENTATION_FRACTION = 0.10


class StageMemory(BaseModel):
    """Memory of one GPU of one pipeline stage at the stage's peak."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    stage: int = Field(ge=0, description="Pipeline stage index, 0 = first (holds the embedding).")
    num_layers: int = Field(ge=0, description="Transformer layers on this stage (all its chunks).")
    parameters: int = Field(ge=0, description="Parameters held by one GPU of this stage (after TP).")
    weights_bytes: int = Field(ge=0, description="bf16/fp16 (or fp32) model weights.")
    gradients_bytes: int = Field(ge=0, description="Gradient buffer (Megatron's main_grad; fp32 unless fp16 without "
                                                   "accumulate_allreduce_grads_in_fp32).")
    optimizer_bytes: int = Field(ge=0, description="fp32 master weights and Adam m, v (sharded over DP if distributed).")
    activations_bytes: int = Field(ge=0, description="Tensors saved for backward, all in-flight chunks, with extras.")
    extra_activations_bytes: int = Field(
        ge=0, description="Of activations_bytes: embedding dropout (first stage), final norm/output/logits (last)."
    )
    in_flight: int = Field(ge=0, description="Micro-batch chunks whose activations the stage holds at its peak.")
    transient_bytes: int = Field(ge=0, description="Short-lived working set: one recomputed group during backward, and "
                                                   "under sharded data parallelism the full-size buckets it gathers.")
    reserve_bytes: int = Field(ge=0, description="CUDA context, NCCL/cuBLAS workspaces, allocator fragmentation.")
    peak_bytes: int = Field(ge=0, description="Sum of all of the above.")
    fits: bool = Field(description="peak_bytes <= the GPU's memory.")


class MemoryPlan(BaseModel):
    """Per-stage memory of a job and the verdict against the GPU's memory."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    stages: tuple[StageMemory, ...]
    peak_bytes: int = Field(ge=0, description="The largest per-GPU peak of any stage.")
    capacity_bytes: int = Field(gt=0, description="Memory of one GPU.")
    fits: bool
    overflowing_stage: int | None = Field(None, description="The stage with the highest peak when it does not fit.")


# --- pipeline: how many micro-batch chunks a stage holds -----------------------------------------


def in_flight_chunks(stage: int, plan: ParallelPlan) -> int:
    """Chunks (micro-batch x model chunk) whose activations stage ``stage`` holds at its peak.

    1F1B: stage i runs p - i - 1 warm-up forwards and one more before its first backward, so it
    holds min(p - i, m) micro-batches. Interleaved (Megatron): (p - i - 1) * 2 + (v - 1) * p warm-up
    forwards plus one, at most m * v, each of L / (p v) layers; on the first stage that is
    L (1 + (p - 1) / (p v)) layers' worth, Korthikanti Section 4.2.3. GPipe holds all m.
    """
    p, m, v = plan.pipeline_parallel_size, plan.num_micro_batches, plan.virtual_pipeline_stages
    if plan.schedule is PipelineSchedule.gpipe:
        return m
    if v == 1:
        return min(p - stage, m)
    return min((p - stage - 1) * 2 + (v - 1) * p + 1, m * v)


def _kth_chunk(k: int, p: int, v: int, forward: bool) -> int:
    """The model chunk of a stage's k-th forward (or backward) in Megatron's interleaved order."""
    chunk = (k % (p * v)) // p
    return chunk if forward else v - 1 - chunk


@lru_cache(maxsize=4096)
def chunk_in_flight(stage: int, chunk: int, p: int, m: int, v: int, gpipe: bool = False) -> int:
    """Most micro-batches of one model chunk a stage holds at once (for the embedding and loss extras).

    Follows the stage's forward/backward order (the same order as ``schedules``) counting only
    ``chunk``: the warm-up forwards, then one forward and one backward at a time, so the count peaks
    right after a forward. Counted over the whole order at once (O(m v) integers), cached.
    """
    if gpipe:
        return m
    total = m * v
    if v == 1:
        warm = min(p - stage - 1, m)
    else:
        warm = min((p - stage - 1) * 2 + (v - 1) * p, total)
    held = np.cumsum(_kth_chunk(np.arange(total), p, v, True) == chunk)  # the chunk's forwards up to forward k
    freed = np.cumsum(_kth_chunk(np.arange(total - warm), p, v, False) == chunk)  # its backwards up to backward i
    held[warm + 1:] -= freed[:-1]  # forward warm + i follows backwards 0 .. i - 1
    return int(held.max())


# --- parameters ----------------------------------------------------------------------------------


def _state_bytes(parameters: int, plan: ParallelPlan, group: int | None = None,
                 fp8_parameters: int = 0) -> tuple[int, int, int]:
    """(weights, gradients, optimizer) bytes for ``parameters`` under the plan's precision.

    Mixed precision: 2-byte weights, a 4-byte fp32 gradient buffer and 12 bytes of optimizer state
    (fp32 master copy, Adam m and v) = 18 bytes per parameter; the distributed optimizer shards the
    12 bytes over DP (Megatron's 6 + 12/d). Under fp16 Megatron keeps the gradient buffer in fp16
    unless told to accumulate in fp32, and under bf16 with --grad-reduce-in-bf16 (``ParallelPlan.grad_bytes``);
    the precision-aware optimizer's dtypes set the 12 (``ParallelPlan.optimizer_state_bytes``), and with
    ``fp8_param_gather`` the ``fp8_parameters`` of them (linear-layer weights) take 1 byte, not 2.
    fp32: 4 + 4 + 8 (no master copy).
    Sharded data parallelism shards over the DP x CP ranks (``group``: the expert-data-parallel ranks
    for expert parameters): the optimizer state (optim), and the gradients (optim_grads), and the
    weights (optim_grads_params).
    """
    if plan.precision is Precision.fp32:
        weight, grad, state = 4, 4, 8
    else:
        weight, grad, state = 2, plan.grad_bytes, plan.optimizer_state_bytes
    weights, grads, optimizer = parameters * weight, parameters * grad, parameters * state
    if plan.fp8_param_gather:
        weights -= fp8_parameters * (weight - 1)
    d, level = (group if group is not None else plan.gradient_group_size), plan.sharding
    if level is not DataParallelSharding.no_shard:
        optimizer = -(-optimizer // d)
    if level.megatron_fsdp:
        grads = -(-grads // d)
    if level is DataParallelSharding.optim_grads_params:
        weights = -(-weights // d)
    return weights, grads, optimizer


def _sharding_buffers(parameters: int, job: Job, stage: int) -> int:
    """Full-size buckets sharded data parallelism materialises: a bucket of gradients before its
    reduce-scatter; with sharded weights, two units of gathered weights (in use and prefetched),
    Megatron-FSDP's units being the transformer layers and one root unit per model chunk (the
    engine's ``stage_communication`` splits the same way)."""
    plan = job.plan
    level = plan.sharding
    if level in (DataParallelSharding.no_shard, DataParallelSharding.optim):
        return 0
    if level is DataParallelSharding.optim_grads_params:
        chunks = job.chunk_layers[stage]
        bucket = -(-parameters // (sum(chunks) + len(chunks)))
    else:
        bucket = min(parameters, max(40_000_000, 1_000_000 * plan.gradient_group_size))
    gathered = 2 * bucket * plan.gathered_param_bytes if level is DataParallelSharding.optim_grads_params else 0
    return bucket * plan.grad_bytes + gathered


# --- activations ---------------------------------------------------------------------------------


def layer_saved_bytes(model: ModelSpec, key: LayerKey, moe_key: LayerKey | None = None) -> dict:
    """What one layer of each kind saves for one micro-batch: ``[moe]`` -> (no recompute, selective, full =
    its input), the MoE kind (``moe_key``) only for a mixture-of-experts model."""
    per_kind = {False: _saved_bytes(model, key)[0]}
    if moe_key is not None:
        per_kind[True] = _saved_bytes(model, moe_key)[0]
    return per_kind


def _extras_saved_bytes(model: ModelSpec, plan: ParallelPlan) -> tuple[int, int]:
    """Bytes the first stage's embedding and the last stage's output layer save for one micro-batch."""
    return _saved_bytes(model, LayerKey.of(plan))[1]


@lru_cache(maxsize=4096)
def _saved_bytes(model: ModelSpec, key: LayerKey) -> tuple[tuple[int, int, int], tuple[int, int]]:
    if key.granularity is not RecomputeGranularity.none or not key.ordered_overlap:
        # the forward ops, the layer input and the extras are the same under every recompute granularity
        # (only the replayed graph differs) and whatever order the backward's collectives run in: one layer
        # graph answers for all
        return _saved_bytes(model, replace(key, granularity=RecomputeGranularity.none, ordered_overlap=True))
    graph = layer_graph(model, key)
    layer = tuple(graph.activation_bytes(g) for g in RecomputeGranularity)
    return layer, (_embedding_extras(model, key).activation_bytes(), _output_extras(model, key).activation_bytes())


def chunk_activations(job: Job, layers: int | tuple[tuple[bool, int], ...]) -> tuple[int, int]:
    """(saved bytes, transient bytes) of one micro-batch through a chunk of ``layers`` layers.

    none/selective: every layer keeps what ``LayerGraph.saved_tensors`` lists; selective replays the
    core attention of one layer at a time, so that region's tensors are the transient.
    full/uniform (k layers per group): each of the ceil(n / k) groups keeps only its input; the
    backward of a group rematerialises all k layers' tensors at once (the transient).
    full/block (k layers): the first k layers of the chunk keep only their input, the others keep
    everything; recomputing one checkpointed layer is the transient.
    The replayed first norm saves the very tensor the checkpoint kept (its input), so the
    transient of a full-recompute group is one layer input less than its tensors.
    ``layers``: a count of dense layers, or the chunk's runs of (MoE layer, count) in forward order
    (``Job.chunk_runs``); a group of mixed layers is taken at its heaviest kind.
    """
    runs = ((False, layers),) if isinstance(layers, int) else layers
    return _chunk_activations(job.model, LayerKey.of(job.plan), job.plan.recompute, runs,
                              LayerKey.of(job.plan, moe=True) if job.model.is_moe else None)


@lru_cache(maxsize=16384)
def _chunk_activations(model: ModelSpec, key: LayerKey, policy, runs: tuple[tuple[bool, int], ...],
                       moe_key: LayerKey | None = None) -> tuple[int, int]:
    per_kind = {moe: _saved_bytes(model, key if moe == key.moe else moe_key)[0] for moe in {m for m, _ in runs}}
    return chunk_activations_of(per_kind, policy, runs)


def chunk_activations_of(per_kind: dict[bool, tuple[int, int, int]], policy,
                         runs: tuple[tuple[bool, int], ...]) -> tuple[int, int]:
    """``chunk_activations`` from what one layer of each kind in ``runs`` saves (``layer_saved_bytes``)."""
    saved = {moe: per_kind[moe] for moe in {m for m, _ in runs}}
    n = sum(k for _, k in runs)
    if not saved:
        return 0, 0
    layer_input = next(iter(saved.values()))[2]
    if policy.granularity is RecomputeGranularity.none:
        return sum(k * saved[m][0] for m, k in runs), 0
    if policy.granularity is RecomputeGranularity.selective:
        return sum(k * saved[m][1] for m, k in runs), max(x[0] - x[1] for x in saved.values())
    k = min(policy.num_layers, n)
    heaviest = max(x[0] for x in saved.values())
    if policy.method is RecomputeMethod.uniform:
        return -(-n // k) * layer_input, k * heaviest - layer_input
    # block: the first k layers keep their input, the rest everything; one of the first k is replayed at a time
    kept, seen, replayed = k * layer_input, 0, 0
    for moe, count in runs:
        kept += max(0, min(count, seen + count - k)) * saved[moe][0]
        if seen < k:
            replayed = max(replayed, saved[moe][0])
        seen += count
    return kept, replayed - layer_input


def _reserve(activations: int, transient: int) -> int:
    return CONTEXT_RESERVE_BYTES + WORKSPACE_RESERVE_BYTES + int(FRAGMENTATION_FRACTION * (activations + transient))


def stage_memory(job: Job, stage: int) -> StageMemory:
    """The memory of one GPU of ``stage`` (see ``memory_plan``)."""
    return StageMemory(**_stage_bytes(job, stage), fits=stage_peak_bytes(job, stage) <= job.cluster.gpu.memory_bytes)


def stage_peak_bytes(job: Job, stage: int) -> int:
    """``stage_memory(job, stage).peak_bytes`` without building the model (the search prunes thousands)."""
    return _stage_bytes(job, stage)["peak_bytes"]


class StageState(NamedTuple):
    """What one GPU of a stage holds for its parameters: their count and bytes."""

    parameters: int
    weights: int
    gradients: int
    optimizer: int
    buffers: int  # full-size buckets that sharded data parallelism materialises (a transient)


def stage_state(job: Job, stage: int) -> StageState:
    """Weights, gradients and optimizer state of one GPU of ``stage`` (experts' over their own group)."""
    plan = job.plan
    params = stage_parameters(job, stage)
    experts = stage_expert_parameters(job, stage)
    fp8_dense, fp8_experts = stage_fp8_parameters(job, stage) if plan.fp8_param_gather else (0, 0)
    weights, gradients, optimizer = _state_bytes(params - experts, plan, fp8_parameters=fp8_dense)
    if experts:
        w, g, o = _state_bytes(experts, plan, plan.expert_data_parallel_size, fp8_parameters=fp8_experts)
        weights, gradients, optimizer = weights + w, gradients + g, optimizer + o
    return StageState(params, weights, gradients, optimizer, _sharding_buffers(params, job, stage))


def stage_chunk_activations(job: Job, stage: int) -> tuple[int, int]:
    """(saved bytes, transient bytes) of one micro-batch through the stage's heaviest chunk."""
    plan, moe = job.plan, job.model.is_moe
    return heaviest_chunk_activations(job.model, LayerKey.of(plan), LayerKey.of(plan, moe=True) if moe else None,
                                      plan.recompute, job.layer_runs[stage] if moe else job.layers_per_chunk[stage])


def heaviest_chunk_activations(model: ModelSpec, key: LayerKey, moe_key: LayerKey | None, policy,
                               chunks: int | tuple) -> tuple[int, int]:
    """``stage_chunk_activations`` from its parts: ``chunks`` is the stage's largest chunk (a dense model) or
    its chunks' runs (an MoE model, whose MoE layers have ``moe_key``)."""
    return heaviest_chunk_of(layer_saved_bytes(model, key, moe_key), policy, chunks)


def heaviest_chunk_of(per_kind: dict, policy, chunks: int | tuple) -> tuple[int, int]:
    """``heaviest_chunk_activations`` from what each kind of layer saves (``layer_saved_bytes``): arithmetic
    only, for a search that asks it of many chunks of the same layers."""
    if True in per_kind:  # chunks of a stage may hold different kinds of layers: the heaviest sets the peak
        return max(chunk_activations_of(per_kind, policy, runs) for runs in chunks)
    return chunk_activations_of(per_kind, policy, ((False, chunks),))


def stage_extra_activations(job: Job, stage: int) -> int:
    """Bytes the first stage's embedding and the last stage's output layer keep for their in-flight micro-batches."""
    plan = job.plan
    return extra_activations(job.model, LayerKey.of(plan), stage, plan.pipeline_parallel_size,
                             plan.num_micro_batches, plan.virtual_pipeline_stages,
                             plan.schedule is PipelineSchedule.gpipe)


def extra_activations(model: ModelSpec, key: LayerKey, stage: int, p: int, m: int, v: int, gpipe: bool) -> int:
    """``stage_extra_activations`` from its parts (p stages, m micro-batches, v chunks per stage)."""
    extras = 0
    embedding, output = _saved_bytes(model, key)[1]
    if stage == 0:
        extras += embedding * chunk_in_flight(0, 0, p, m, v, gpipe)
    if stage == p - 1:
        extras += output * chunk_in_flight(p - 1, v - 1, p, m, v, gpipe)
    return extras


def stage_totals(state: StageState, in_flight: int, per_chunk: int, transient: int,
                 extras: int) -> tuple[int, int, int, int]:
    """(activations, transient, reserve, peak) bytes of a stage from its parts: ``in_flight`` chunks of
    ``per_chunk`` saved bytes each, the extras, and the transient of one chunk (the search sums each
    candidate's parts, which many candidates share, with this same function)."""
    activations = in_flight * per_chunk + extras
    transient += state.buffers
    reserve = _reserve(activations, transient)
    peak = state.weights + state.gradients + state.optimizer + activations + transient + reserve
    return activations, transient, reserve, peak


def _stage_bytes(job: Job, stage: int) -> dict[str, int]:
    state = stage_state(job, stage)
    chunks = in_flight_chunks(stage, job.plan)
    per_chunk, transient = stage_chunk_activations(job, stage)
    extras = stage_extra_activations(job, stage)
    activations, transient, reserve, peak = stage_totals(state, chunks, per_chunk, transient, extras)
    return dict(stage=stage, num_layers=job.layers_per_stage[stage], parameters=state.parameters,
                weights_bytes=state.weights, gradients_bytes=state.gradients, optimizer_bytes=state.optimizer,
                activations_bytes=activations, extra_activations_bytes=extras, in_flight=chunks,
                transient_bytes=transient, reserve_bytes=reserve, peak_bytes=peak)


def memory_plan(job: Job) -> MemoryPlan:
    """Per-stage, per-GPU memory of ``job`` and whether its largest stage fits in the GPU."""
    stages = tuple(stage_memory(job, i) for i in range(job.plan.pipeline_parallel_size))
    capacity = job.cluster.gpu.memory_bytes
    worst = max(stages, key=lambda s: s.peak_bytes)
    fits = worst.peak_bytes <= capacity
    return MemoryPlan(
        stages=stages,
        peak_bytes=worst.peak_bytes,
        capacity_bytes=capacity,
        fits=fits,
        overflowing_stage=None if fits else worst.stage,
    )


__all__ = [
    "CONTEXT_RESERVE_BYTES",
    "FRAGMENTATION_FRACTION",
    "MemoryPlan",
    "StageMemory",
    "WORKSPACE_RESERVE_BYTES",
    "chunk_activations",
    "chunk_in_flight",
    "extra_activations",
    "heaviest_chunk_activations",
    "in_flight_chunks",
    "layer_parameters_per_rank",
    "memory_plan",
    "moe_layer_parameters_per_rank",
    "stage_chunk_activations",
    "stage_expert_parameters",
    "stage_extra_activations",
    "stage_memory",
    "stage_parameters",
    "stage_state",
    "stage_totals",
]
