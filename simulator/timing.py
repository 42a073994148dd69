"""How long one layer's forward, backward and recompute take on one TP rank: the op graph played
on two CUDA streams (compute and tensor-parallel communication).

Ops are list-scheduled in a fixed topological order: an op starts when its inputs are ready
and its stream is free. A collective that Megatron issues asynchronously (the input-gradient
all-reduce or reduce-scatter during the weight-gradient GEMM) therefore overlaps compute by
construction, and one that the next op waits for is exposed. While the two streams overlap,
NCCL's kernels take SMs and memory bandwidth from the compute kernels; the profile's
``overlap_compute_slowdown`` stretches the overlapped span by that fraction.

The engine plays pipeline steps, not ops: a chunk of n identical layers takes n times the
layer's phase time, so a simulation costs the same for any layer count.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Protocol

import networkx as nx

from simulator.layers import (
    LayerGraph,
    Op,
    Stream,
    embedding_extras,
    ordered_ops,
    output_extras,
    transformer_layer,
)
from simulator.plan import Job


class OpCoster(Protocol):
    """What the timeline needs from a cost model."""

    overlap_compute_slowdown: float

    def op_time_s(self, op: Op) -> float: ...


@dataclass(frozen=True, slots=True)
class OpInterval:
    name: str
    stream: Stream
    start_s: float
    end_s: float


@dataclass(frozen=True)
class PhaseTimeline:
    """One phase of one layer (or of the stage extras) on one TP rank."""

    intervals: tuple[OpInterval, ...]
    duration_s: float
    compute_s: float  # time the compute stream is busy (without the overlap slowdown)
    tp_comm_s: float  # time the communication stream is busy
    flops: float

    @property
    def exposed_comm_s(self) -> float:
        """Time the phase is longer than its compute alone: waiting on collectives, plus overlap slowdown."""
        return max(self.duration_s - self.compute_s, 0.0)

    @staticmethod
    def empty() -> "PhaseTimeline":
        return PhaseTimeline((), 0.0, 0.0, 0.0, 0.0)


def play(graphs: list[nx.DiGraph], cost: OpCoster) -> PhaseTimeline:
    """List-schedule the ops of ``graphs`` (played one after another) on their streams."""
    stream_free = {Stream.compute: 0.0, Stream.tp_comm: 0.0}
    intervals: list[OpInterval] = []
    t0 = 0.0
    flops = 0.0
    for graph in graphs:
        end: dict[str, float] = {}
        for op in ordered_ops(graph):
            ready = max((end[p] for p in graph.predecessors(op.name)), default=t0)
            start = max(ready, stream_free[op.stream])
            finish = start + cost.op_time_s(op)
            end[op.name] = finish
            stream_free[op.stream] = finish
            intervals.append(OpInterval(op.name, op.stream, start, finish))
            flops += op.flops
        t0 = max(stream_free.values())
    makespan = max((iv.end_s for iv in intervals), default=0.0)
    compute = sum(iv.end_s - iv.start_s for iv in intervals if iv.stream is Stream.compute)
    comm = sum(iv.end_s - iv.start_s for iv in intervals if iv.stream is Stream.tp_comm)
    overlap = _overlap_s(intervals)
    return PhaseTimeline(tuple(intervals), makespan + cost.overlap_compute_slowdown * overlap, compute, comm, flops)


def _overlap_s(intervals: list[OpInterval]) -> float:
    """Total time during which both streams are busy (each stream's intervals never overlap)."""
    comp = [(iv.start_s, iv.end_s) for iv in intervals if iv.stream is Stream.compute]
    comm = [(iv.start_s, iv.end_s) for iv in intervals if iv.stream is Stream.tp_comm]
    total = 0.0
    for a0, a1 in comm:
        for b0, b1 in comp:
            if b0 < a1 and a0 < b1:
                total += min(a1, b1) - max(a0, b0)
    return total


@dataclass(frozen=True)
class LayerTimes:
    """Per layer, per micro-batch, on one TP rank."""

    forward_s: float
    backward_s: float  # the backward pass alone
    recompute_s: float  # the forward ops replayed before it under the recompute policy
    forward: PhaseTimeline
    backward: PhaseTimeline  # recompute followed by backward, as one timeline
    backward_only: PhaseTimeline  # for layers the policy does not recompute (full/block)

    @property
    def backward_with_recompute_s(self) -> float:
        return self.backward.duration_s

    def with_durations(self, forward_s: float, backward_s: float, recompute_s: float) -> "LayerTimes":
        """These times with the phases lasting as given (e.g. measured), each timeline scaled to fit."""
        def scaled(tl: PhaseTimeline, duration_s: float) -> PhaseTimeline:
            k = duration_s / tl.duration_s if tl.duration_s else 0.0
            return PhaseTimeline(tl.intervals, duration_s, tl.compute_s * k, tl.tp_comm_s * k, tl.flops)

        return LayerTimes(forward_s, backward_s, recompute_s, scaled(self.forward, forward_s),
                          scaled(self.backward, backward_s + recompute_s), scaled(self.backward_only, backward_s))


@lru_cache(maxsize=4096)
def _layer_times(layer: LayerGraph, cost: OpCoster) -> LayerTimes:
    fwd = play([layer.forward], cost)
    rec = play([layer.recompute], cost) if layer.recompute.number_of_nodes() else PhaseTimeline.empty()
    bwd_only = play([layer.backward], cost)
    both = play([layer.recompute, layer.backward], cost) if layer.recompute.number_of_nodes() else bwd_only
    return LayerTimes(fwd.duration_s, bwd_only.duration_s, rec.duration_s, fwd, both, bwd_only)


def layer_times(job: Job, profile=None, cost: OpCoster | None = None) -> LayerTimes:
    """Forward, backward and recompute time of one transformer layer for one micro-batch."""
    cost = cost if cost is not None else cost_model_for(job, profile)
    return _layer_times(transformer_layer(job.model, job.plan), cost)


@dataclass(frozen=True)
class StageExtraTimes:
    embedding_forward: PhaseTimeline
    embedding_backward: PhaseTimeline
    output_forward: PhaseTimeline
    output_backward: PhaseTimeline


def extra_times(job: Job, cost: OpCoster) -> StageExtraTimes:
    return _extra_times(embedding_extras(job.model, job.plan), output_extras(job.model, job.plan), cost)


@lru_cache(maxsize=4096)
def _extra_times(emb, out, cost: OpCoster) -> StageExtraTimes:
    return StageExtraTimes(play([emb.forward], cost), play([emb.backward], cost),
                           play([out.forward], cost), play([out.backward], cost))


def cost_model_for(job: Job, profile):
    """The (cached) cost model of the job's cluster under ``profile``: None for the GPU's published
    profile, a name or path to load, or a ``HardwareProfile``."""
    from simulator.profile import default_profile, load_profile

    if profile is None:
        profile = default_profile(job.cluster.gpu.name)
    elif isinstance(profile, str):
        profile = load_profile(profile)
    return cached_cost_model(job.cluster, profile, job.plan.precision)


@lru_cache(maxsize=32)
def cached_cost_model(cluster, profile, precision):
    from simulator.costs import build_cost_model

    return build_cost_model(cluster, profile, precision)
