"""How long one layer's forward, backward and recompute take on one TP rank: the op graph played
on two CUDA streams (compute and tensor-parallel communication).

Ops are list-scheduled in a fixed topological order: an op starts when its inputs are ready
and its stream is free. A collective that Megatron issues asynchronously (the input-gradient
all-reduce or reduce-scatter during the weight-gradient GEMM) therefore overlaps compute by
construction, and one that the next op waits for is exposed. While the two streams overlap,
NCCL's kernels take SMs and memory bandwidth from the compute kernels; the profile's
``overlap_compute_slowdown`` stretches the overlapped span by that fraction. A collective issued with
only memory-bound ops since its group's previous one finds the ranks still together and pays the
profile's measured share alone of its in-loop time (``LinkParams.isolated_factors``).

The engine plays pipeline steps, not ops: a chunk of n identical layers takes n times the
layer's phase time, so a simulation costs the same for any layer count.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property, lru_cache
from typing import NamedTuple, Protocol

import networkx as nx

from simulator.graph.layers import (LayerKey, Op, OpKind, Stream, _embedding_extras, _output_extras, layer_graph,
                                    ordered_ops)
from simulator.spec.model import ModelSpec
from simulator.spec.plan import Job, RecomputeGranularity
from simulator.spec.value_cache import ValueCache


class OpCoster(Protocol):
    """What the timeline needs from a cost model."""

    overlap_compute_slowdown: float

    def op_time_s(self, op: Op) -> float: ...


class OpInterval(NamedTuple):
    """One op on one stream (every play records each op twice: a named tuple builds fastest)."""

    name: str
    stream: Stream
    start_s: float
    end_s: float


class Span(NamedTuple):
    """A stretch of work as the host issues it: ``host_s`` of CPU time, ``device_s`` of device time
    once queued, and ``cold_s``, the time from an empty queue until the device is done.

    On an asynchronous device the host runs ahead, so a long span takes about the longer of the
    two; for a single stream the makespan from an empty queue is max over ops k of (host time
    to issue k + device time from k on), which is what ``then`` and ``times`` compose exactly.
    On a synchronous device (a CPU) every op waits for its own issue: the two add up.
    A value, built millions of times by a search: a named tuple, which builds three times faster
    than a frozen dataclass.
    """

    host_s: float
    device_s: float
    cold_s: float
    asynchronous: bool = True
    host_sync: bool = False  # the host waits for the device inside the span: every repetition starts cold

    @staticmethod
    def host_only(host_s: float, asynchronous: bool = True) -> "Span":
        return Span(host_s, 0.0, host_s, asynchronous)

    @property
    def steady_s(self) -> float:
        """Time per repetition once the queue is in steady state (from an empty queue, if the host waits)."""
        if self.host_sync:
            return self.cold_s
        return max(self.host_s, self.device_s) if self.asynchronous else self.host_s + self.device_s

    @property
    def host_wait_s(self) -> float:
        """Of ``cold_s``, the time the device is idle for want of work the host has yet to issue."""
        return max(self.cold_s - self.device_s, 0.0)

    def then(self, other: "Span") -> "Span":
        cold = (max(self.cold_s + other.device_s, self.host_s + other.cold_s)
                if self.asynchronous and not other.host_sync else self.cold_s + other.cold_s)
        return Span(self.host_s + other.host_s, self.device_s + other.device_s, cold, self.asynchronous,
                    self.host_sync or other.host_sync)

    def times(self, n: int) -> "Span":
        if n <= 0:
            return Span(0.0, 0.0, 0.0, self.asynchronous)
        return Span(n * self.host_s, n * self.device_s, self.cold_s + (n - 1) * self.steady_s, self.asynchronous,
                    self.host_sync)


@dataclass(frozen=True)
class PhaseTimeline:
    """One phase of one layer (or of the stage extras) on one TP rank."""

    intervals: tuple[OpInterval, ...]
    duration_s: float  # device time with the queue full (the host never late)
    compute_s: float  # time the compute stream is busy (without the overlap slowdown)
    tp_comm_s: float  # time the communication stream is busy
    flops: float
    host_s: float = 0.0  # CPU time to issue the phase's ops
    cold_s: float = 0.0  # from an empty queue, the host issuing as it goes, until the device is done
    asynchronous: bool = True
    host_sync: bool = False  # an op makes the host wait for the device (e.g. MoE token counts)

    @property
    def exposed_comm_s(self) -> float:
        """Time the phase is longer than its compute alone: waiting on collectives, plus overlap slowdown."""
        return max(self.duration_s - self.compute_s, 0.0)

    @cached_property
    def span(self) -> Span:  # kept: the search composes each layer's spans thousands of times
        return Span(self.host_s, self.duration_s, self.cold_s, self.asynchronous, self.host_sync)

    @property
    def steady_s(self) -> float:
        """The phase's time inside a run of phases: the host's or the device's, whichever is longer."""
        return self.span.steady_s

    @staticmethod
    def empty() -> "PhaseTimeline":
        return PhaseTimeline((), 0.0, 0.0, 0.0, 0.0)


def play(graphs: list[nx.DiGraph], cost: OpCoster, backward: tuple[bool, ...] | None = None) -> PhaseTimeline:
    """List-schedule the ops of ``graphs`` (played one after another) on their streams.

    ``backward[i]`` says graph i is issued by the autograd engine (its host cost per op differs).
    The device-only schedule gives ``duration_s``; a second pass has each op also wait for the
    host to issue it (``cold_s``). On a synchronous device each op runs on the issuing thread, so
    ops, collectives included, run one after another.
    """
    backward = backward or (False,) * len(graphs)
    asynchronous = getattr(cost, "asynchronous", True)
    host_time = getattr(cost, "host_time_s", None)
    step_time = getattr(cost, "step_op_time_s", cost.op_time_s)
    synchronised_time = getattr(cost, "synchronised_op_time_s", None)
    stream_free = {Stream.compute: 0.0, Stream.tp_comm: 0.0}
    cold_free = {Stream.compute: 0.0, Stream.tp_comm: 0.0}
    intervals: list[OpInterval] = []
    t0 = cold_t0 = issued = 0.0
    flops = 0.0
    cold_overlap: list[OpInterval] = []
    synced = False
    for graph, is_backward in zip(graphs, backward):
        end: dict[str, float] = {}
        cold_end: dict[str, float] = {}
        for op, name, stream, preds, together in _schedule(graph):
            t = synchronised_time(op) if together and synchronised_time is not None else step_time(op)
            host = host_time(op, is_backward) if host_time is not None else 0.0
            if asynchronous:
                ready = max([end[p] for p in preds]) if preds else t0
                free = stream_free[stream]
                start = ready if ready >= free else free
                if op.host_sync:  # the host waits until the device has run everything issued so far
                    issued = max(issued, *cold_free.values())
                    synced = True
                issued += host
                cold_start = max(max([cold_end[p] for p in preds]) if preds else cold_t0, cold_free[stream], issued)
            else:  # one thread: every op after the previous one, and after its own issue
                start = max(stream_free.values())
                cold_start = max(cold_free.values()) + host
                issued += host
            finish = start + t
            end[name] = finish
            stream_free[stream] = finish
            intervals.append(OpInterval(name, stream, start, finish))
            cold_end[name] = cold_finish = cold_start + t
            cold_free[stream] = cold_finish
            cold_overlap.append(OpInterval(name, stream, cold_start, cold_finish))
            flops += op.flops
        t0 = max(stream_free.values())
        cold_t0 = max(cold_free.values())
    makespan = max((iv.end_s for iv in intervals), default=0.0)
    cold = max((iv.end_s for iv in cold_overlap), default=0.0)
    compute = sum(iv.end_s - iv.start_s for iv in intervals if iv.stream is Stream.compute)
    comm = sum(iv.end_s - iv.start_s for iv in intervals if iv.stream is Stream.tp_comm)
    slow = cost.overlap_compute_slowdown
    return PhaseTimeline(tuple(intervals), makespan + slow * _overlap_s(intervals), compute, comm, flops,
                         issued, max(cold + slow * _overlap_s(cold_overlap), issued), asynchronous, synced)


def _schedule(graph: nx.DiGraph) -> tuple:
    """(op, name, stream, predecessors, ranks together) of each op of ``graph`` in play order, kept on the graph
    beside its order (graphs are never changed once built, and each is played under many cost models)."""
    steps = graph.graph.get("schedule")
    if steps is None:
        ops = ordered_ops(graph)
        together = _ranks_together(ops)
        steps = graph.graph["schedule"] = tuple((op, op.name, op.stream, tuple(graph.predecessors(op.name)),
                                                 op.name in together) for op in ops)
    return steps


def _ranks_together(ops: list[Op]) -> set[str]:
    """The collectives issued with only memory-bound ops since their group's previous collective, the layer's ops
    taken as repeating layer after layer (before its first collective come the previous layer's last ops): what
    sets ranks apart before a collective is the GEMMs and attention each ran alone, and a layer norm or a
    dropout-add is too short to. Sequence parallelism's all-gather after the reduce-scatter is the case."""
    together = set()
    n = len(ops)
    for i, op in enumerate(ops):
        if op.kind is not OpKind.collective or op.collective is None:
            continue
        group = (op.collective.group_size, op.collective.stride)
        for back in range(1, n + 1):
            prev = ops[(i - back) % n]
            if prev.kind is OpKind.collective and prev.collective is not None:
                if (prev.collective.group_size, prev.collective.stride) == group:
                    if back < n:  # not the op itself, come round: a layer with one collective
                        together.add(op.name)
                    break
            elif prev.kind is not OpKind.elementwise:
                break
    return together


def _overlap_s(intervals: list[OpInterval]) -> float:
    """Total time during which both streams are busy. Each stream's intervals never overlap and come in
    the order they start, so a compute interval that ends before one collective starts ends before every
    later one: a single pass adds the overlapping pairs, collective by collective, as a double loop would."""
    comp = [(iv.start_s, iv.end_s) for iv in intervals if iv.stream is Stream.compute]
    comm = [(iv.start_s, iv.end_s) for iv in intervals if iv.stream is Stream.tp_comm]
    total = 0.0
    first = 0
    for a0, a1 in comm:
        while first < len(comp) and comp[first][1] <= a0:
            first += 1
        for b0, b1 in comp[first:]:
            if b0 >= a1:
                break
            if a0 < b1:
                total += min(a1, b1) - max(a0, b0)
    return total


@dataclass(frozen=True)
class LayerTimes:
    """Per layer, per micro-batch, on one TP rank; the times are those inside a run of layers
    (``PhaseTimeline.steady_s``): the device's, or the host's where it is the slower."""

    forward_s: float
    backward_s: float  # the backward pass alone
    recompute_s: float  # what replaying the policy's forward ops before it adds to the backward
    forward: PhaseTimeline
    backward: PhaseTimeline  # recompute followed by backward, as one timeline
    backward_only: PhaseTimeline  # for layers the policy does not recompute (full/block)

    @property
    def backward_with_recompute_s(self) -> float:
        return self.backward.steady_s

    def with_durations(self, forward_s: float, backward_s: float, recompute_s: float) -> "LayerTimes":
        """These times with the phases lasting as given (e.g. measured), each timeline scaled to fit.

        The phase's host and device times, and its time from an empty queue, scale together, so the
        given time is what a run of such phases takes (a measured phase holds its host waits).
        """
        def scaled(tl: PhaseTimeline, duration_s: float) -> PhaseTimeline:
            k = duration_s / tl.steady_s if tl.steady_s else 0.0
            return PhaseTimeline(tl.intervals, tl.duration_s * k, tl.compute_s * k, tl.tp_comm_s * k, tl.flops,
                                 tl.host_s * k, tl.cold_s * k, tl.asynchronous, tl.host_sync)

        return LayerTimes(forward_s, backward_s, recompute_s, scaled(self.forward, forward_s),
                          scaled(self.backward, backward_s + recompute_s), scaled(self.backward_only, backward_s))


@lru_cache(maxsize=4096)
def _layer_times(model: ModelSpec, key: LayerKey, cost: OpCoster) -> LayerTimes:
    layer = layer_graph(model, key)
    fwd, bwd_only = _forward_and_backward(model, replace(key, granularity=RecomputeGranularity.none), cost)
    both = (play([layer.recompute, layer.backward], cost, backward=(False, True))
            if layer.recompute.number_of_nodes() else bwd_only)
    # what the replay adds to the backward (host and device overlap across the two, so not the replay's
    # own time)
    return LayerTimes(fwd.steady_s, bwd_only.steady_s, both.steady_s - bwd_only.steady_s, fwd, both, bwd_only)


def _forward_and_backward(model: ModelSpec, key: LayerKey, cost: OpCoster) -> tuple[PhaseTimeline, PhaseTimeline]:
    """The forward and the backward alone, played once for every recompute granularity: they are the same
    graphs under each (only the replay before the backward differs)."""
    return _forward(model, replace(key, ordered_overlap=True), cost), _backward(model, key, cost)


@lru_cache(maxsize=4096)
def _forward(model: ModelSpec, key: LayerKey, cost: OpCoster) -> PhaseTimeline:
    """The forward alone: the CUDA work queues' order of collectives and GEMMs is the backward's alone."""
    return play([layer_graph(model, key).forward], cost)


@lru_cache(maxsize=4096)
def _backward(model: ModelSpec, key: LayerKey, cost: OpCoster) -> PhaseTimeline:
    return play([layer_graph(model, key).backward], cost, backward=(True,))


def layer_times(job: Job, profile=None, cost: OpCoster | None = None, moe: bool = False) -> LayerTimes:
    """Forward, backward and recompute time of one transformer layer (``moe``: one whose MLP is the
    model's mixture of experts) for one micro-batch."""
    cost = cost if cost is not None else cost_model_for(job, profile)
    return _layer_times(job.model, LayerKey.of(job.plan, moe), cost)


@dataclass(frozen=True)
class StageExtraTimes:
    embedding_forward: PhaseTimeline
    embedding_backward: PhaseTimeline
    output_forward: PhaseTimeline
    output_backward: PhaseTimeline


def extra_times(job: Job, cost: OpCoster) -> StageExtraTimes:
    # the embedding and the output layer are the same under every recompute granularity: played once for all
    return _extra_times(job.model, replace(LayerKey.of(job.plan), granularity=RecomputeGranularity.none), cost)


@lru_cache(maxsize=4096)
def _extra_times(model: ModelSpec, key: LayerKey, cost: OpCoster) -> StageExtraTimes:
    emb, out = _embedding_extras(model, key), _output_extras(model, key)
    return StageExtraTimes(play([emb.forward], cost), play([emb.backward], cost, backward=(True,)),
                           play([out.forward], cost), play([out.backward], cost, backward=(True,)))


def cost_model_for(job: Job, profile, num_gpus: int | None = None):
    """The (cached) cost model of the job's cluster under ``profile``: None for the GPU's published
    profile, a name or path to load, or a ``HardwareProfile``; for a job on ``num_gpus`` GPUs (default the
    job's own), which sets how many devices of a machine compute beside each one."""
    from simulator.cost.profile import default_profile, load_profile

    if profile is None:
        profile = default_profile(job.cluster.gpu.name)
    elif isinstance(profile, str):
        profile = load_profile(profile)
    from simulator.cost import busy_neighbours

    gpus = num_gpus or job.plan.num_gpus
    return cached_cost_model(job.cluster, profile, job.plan.precision, busy_neighbours(job.cluster, gpus), gpus)


_COST_MODELS: ValueCache = ValueCache(maxsize=32)


def cached_cost_model(cluster, profile, precision, busy_neighbours: int = 0, devices: int = 1):
    """The cost model of these inputs, built once while it stays among the 32 most recently asked for."""
    from simulator.cost import build_cost_model

    devices = devices if profile.device_speed_spread else 1  # the job's size changes nothing else
    key = (cluster.value_key(), profile.value_key(), precision.value, int(busy_neighbours), int(devices))
    return _COST_MODELS.get(key, lambda: build_cost_model(cluster, profile, precision, busy_neighbours, devices))
