"""Chrome trace-event JSON of a simulated iteration (opens in Perfetto and chrome://tracing).

One process per pipeline stage, one thread per stream: compute, tensor-parallel communication,
pipeline sends in each direction and the data-parallel reduction. Each pipeline step is a slice
on the compute thread; its tensor-parallel collectives are slices on the communication thread for
every micro-batch, and the steps of the micro-batches in ``detail`` (micro-batch 0 by default) are
also expanded into every op (GEMMs, attention, memory-bound kernels) under the step. The idle
gaps of the compute stream are slices too, named ("pipeline bubble", ...), and so is the part of
a detailed step beyond its layers' device time (a cost model with host overhead). A flow arrow joins
each send to the step that receives it, and a counter track per stage follows its memory:
weights, gradients and optimizer state, plus the activations of the micro-batches in flight.

Times are whole nanoseconds: every start and end is rounded from the engine's seconds once, as an
absolute time, and an op is clamped to the step that holds it, so slices on a thread nest or
follow one another and never cross. ``ts``/``dur`` are microseconds with three decimals (exact).
Every slice has ``args``: micro-batch, FLOPs and bytes where they apply.
"""

from __future__ import annotations

import json
from collections import defaultdict, deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from simulator.estimator.memory import chunk_activations, stage_memory
from simulator.estimator.prediction import Simulation
from simulator.graph.layers import CollectiveKind, Op, Stream, embedding_extras, output_extras, transformer_layer
from simulator.graph.parameters import stage_parameters
from simulator.outputs.describe import layout, settings_json
from simulator.schedule.engine import Interval, _consumer
from simulator.schedule.schedules import Phase
from simulator.schedule.stage_work import optimizer_bytes_per_param, recomputed_layers
from simulator.schedule.timing import PhaseTimeline
from simulator.spec._io import write_output
from simulator.spec.plan import Job
from simulator.spec.units import GIB

THREADS = {"compute": 0, "tp_comm": 1, "send_forward": 2, "send_backward": 3, "dp": 4}
NS_PER_S = 1_000_000_000
MEMORY_COUNTER = "memory (GiB)"


def ns(t_s: float) -> int:
    """Seconds to whole nanoseconds (every time in the trace goes through here once)."""
    return round(t_s * NS_PER_S)


def _us(t_ns: int) -> float:
    return t_ns / 1000  # three decimals at most, so the text holds the exact nanosecond


@dataclass(frozen=True)
class _Part:
    """A piece of a step: one layer (or the embedding / output layer) played as a phase timeline."""

    label: str | int  # global layer index, or "embedding" / "output"
    timeline: PhaseTimeline
    ops: dict[str, Op]


def _ops(*graphs) -> dict[str, Op]:
    return {name: data["op"] for g in graphs for name, data in g.nodes(data=True)}


class _StepParts:
    """The parts of each (stage, chunk, phase) step, in the order the stage plays them."""

    def __init__(self, sim: Simulation, job: Job):
        self.job, self.sim = job, sim
        self.fwd_ops, self.bwd_ops = {}, {}
        for moe in ((False, True) if job.model.is_moe else (False,)):
            layer = transformer_layer(job.model, job.plan, moe)
            self.fwd_ops[moe], self.bwd_ops[moe] = _ops(layer.forward), _ops(layer.recompute, layer.backward)
        emb, out = embedding_extras(job.model, job.plan), output_extras(job.model, job.plan)
        self.emb = (_ops(emb.forward), _ops(emb.backward))
        self.out = (_ops(out.forward), _ops(out.backward))
        self._cache: dict[tuple[int, int, Phase], list[_Part]] = {}

    def first_layer(self, stage: int, chunk: int) -> int:
        """The global index of the chunk's first layer (``Job.chunk_first_layer``)."""
        return self.job.chunk_first_layer(stage, chunk)

    def __call__(self, stage: int, chunk: int, phase: Phase) -> list[_Part]:
        key = (stage, chunk, phase)
        if key not in self._cache:
            self._cache[key] = self._build(stage, chunk, phase)
        return self._cache[key]

    def _build(self, stage: int, chunk: int, phase: Phase) -> list[_Part]:
        job, sim, ext = self.job, self.sim, self.sim.extras
        kind = job.model.is_moe_layer
        p, v = job.plan.pipeline_parallel_size, job.plan.virtual_pipeline_stages
        n, first = job.chunk_layers[stage][chunk], self.first_layer(stage, chunk)
        embedding, output = stage == 0 and chunk == 0, stage == p - 1 and chunk == v - 1
        if phase is Phase.forward:
            parts = [_Part("embedding", ext.embedding_forward, self.emb[0])] if embedding else []
            parts += [_Part(first + i, sim.layer_of(kind(first + i)).forward, self.fwd_ops[kind(first + i)])
                      for i in range(n)]
            return parts + ([_Part("output", ext.output_forward, self.out[0])] if output else [])
        recomputed = recomputed_layers(job, n)
        parts = [_Part("output", ext.output_backward, self.out[1])] if output else []
        parts += [_Part(first + i, (lambda lt: lt.backward if i < recomputed else lt.backward_only)(
                      sim.layer_of(kind(first + i))), self.bwd_ops[kind(first + i)]) for i in reversed(range(n))]
        return parts + ([_Part("embedding", ext.embedding_backward, self.emb[1])] if embedding else [])


def _op_args(op: Op, activation_bytes: int) -> dict[str, Any]:
    args: dict[str, Any] = {"kind": op.kind.value, "flops": op.flops}
    if op.collective is not None:
        args.update(bytes=op.collective.bytes, collective=op.collective.kind.value,
                    group_size=op.collective.group_size)
    elif op.gemm is not None:
        g = op.gemm
        operand = 1 if g.fp8 else activation_bytes
        args.update(bytes=g.batch * ((g.m * g.k + g.k * g.n) * operand + g.m * g.n * activation_bytes),
                    shape=f"{g.m} x {g.n} x {g.k}" + (f" x{g.batch}" if g.batch > 1 else ""))
    else:
        args["bytes"] = op.bytes_moved
    return args


class _Writer:
    def __init__(self) -> None:
        self.events: list[dict] = []

    def slice(self, pid: int, thread: str, name: str, start: int, end: int, cat: str, args: dict) -> None:
        self.events.append({"ph": "X", "name": name, "pid": pid, "tid": THREADS[thread], "ts": _us(start),
                            "dur": _us(end - start), "cat": cat, "args": args})


def _expand_step(w: _Writer, parts: list[_Part], iv: Interval, start: int, end: int, mb: int, detail: bool,
                 activation_bytes: int) -> None:
    """The step's ops under it (all of them when ``detail``, else the TP collectives), clamped to [start, end].

    Where the step lasts longer than its parts' device time (a cost model with host overhead: the
    device waiting for the CPU to issue work), the difference is one slice after the ops.
    """
    offset = iv.start_s
    if detail:
        device = ns(iv.start_s + sum(part.timeline.duration_s for part in parts))
        if end > device:
            w.slice(iv.stage, "compute", "waiting for the host (issue and launch)", max(device, start), end, "host",
                    {"micro_batch": mb, "idle_s": (end - max(device, start)) / NS_PER_S})
    for part in parts:
        for op_iv in part.timeline.intervals:
            comm = op_iv.stream is Stream.tp_comm
            if not (comm or detail):
                continue
            op = part.ops[op_iv.name]
            a = min(max(ns(offset + op_iv.start_s), start), end)
            b = min(max(ns(offset + op_iv.end_s), a), end)
            args = {"micro_batch": mb, "layer": part.label, **_op_args(op, activation_bytes)}
            w.slice(iv.stage, "tp_comm" if comm else "compute", op_iv.name, a, b, "op", args)
        offset += part.timeline.duration_s


def _idle(w: _Writer, stage: int, steps: list["_StepSlice"], optimizer_start: int, blocking_sends: bool) -> None:
    """Name the idle gaps of a stage's compute stream.

    Before a step: "blocked on send" while the previous step's own send is in flight (Megatron's
    blocking exchange), "waiting for transfer" while this step's input is in flight, "pipeline
    bubble" otherwise ("(fill)" before the first step); after the last step, the wait for the
    gradient reduction and the slowest stage before the optimizer.
    """
    prev_end, prev_send_end = 0, 0
    for i, st in enumerate(steps):
        a = prev_end
        if blocking_sends and prev_send_end > a:
            b = min(prev_send_end, st.start)
            w.slice(stage, "compute", "blocked on send", a, b, "bubble", {"idle_s": (b - a) / NS_PER_S,
                                                                          "after": steps[i - 1].name})
            a = b
        transfer_from = max(a, min(st.input_start, st.start)) if st.input_start is not None else st.start
        if transfer_from > a:
            w.slice(stage, "compute", "pipeline bubble (fill)" if i == 0 else "pipeline bubble", a, transfer_from,
                    "bubble", {"idle_s": (transfer_from - a) / NS_PER_S, "before": st.name})
        if st.start > transfer_from:
            w.slice(stage, "compute", "waiting for transfer", transfer_from, st.start, "bubble",
                    {"idle_s": (st.start - transfer_from) / NS_PER_S, "before": st.name})
        prev_end, prev_send_end = st.end, st.send_end
    a = max(prev_end, prev_send_end if blocking_sends else 0)
    if blocking_sends and a > prev_end:
        w.slice(stage, "compute", "blocked on send", prev_end, min(a, optimizer_start), "bubble",
                {"idle_s": (min(a, optimizer_start) - prev_end) / NS_PER_S, "after": steps[-1].name})
    if optimizer_start > a:
        w.slice(stage, "compute", "waiting for gradient reduction and the slowest stage", a, optimizer_start,
                "bubble", {"idle_s": (optimizer_start - a) / NS_PER_S, "before": "optimizer"})


@dataclass
class _StepSlice:
    name: str
    start: int
    end: int
    send_end: int = 0  # end of the send of this step's output (0: none)
    input_start: int | None = None  # start of the send that brought this step's input


def trace_events(sim: Simulation, job: Job, detail: Iterable[int] = (0,)) -> list[dict]:
    """The trace's events: metadata, slices, flows and memory counters (see the module docstring)."""
    if not sim.engine.intervals:
        raise ValueError("the simulation was run without record=True, so it has no intervals to trace")
    detail = frozenset(detail)
    plan, model = job.plan, job.model
    p, v, t = plan.pipeline_parallel_size, plan.virtual_pipeline_stages, plan.tensor_parallel_size
    ab = plan.precision.activation_bytes
    parts = _StepParts(sim, job)
    w = _Writer()
    for stage in range(p):
        w.events.append({"ph": "M", "name": "process_name", "pid": stage, "args": {"name": f"stage {stage}"}})
        w.events.append({"ph": "M", "name": "process_sort_index", "pid": stage, "args": {"sort_index": stage}})
        for thread, tid in THREADS.items():
            w.events.append({"ph": "M", "name": "thread_name", "pid": stage, "tid": tid, "args": {"name": thread}})

    # one activation (or its gradient) per TP rank between stages (Megatron sends a 1/t slice; see estimate)
    p2p_bytes = model.seq_length * plan.micro_batch_size * model.hidden_size * ab // t
    grad_kind = CollectiveKind.reduce_scatter if plan.use_distributed_optimizer else CollectiveKind.all_reduce
    saved = [[chunk_activations(job, runs)[0] for runs in chunks] for chunks in job.layer_runs]
    emb_saved = embedding_extras(model, plan).activation_bytes()
    out_saved = output_extras(model, plan).activation_bytes()

    # sends of one link (stage, direction) leave in the order the stage's steps produce them
    sends: dict[tuple[int, str, int], deque] = defaultdict(deque)
    dp_slices: dict[tuple[int, str], int] = defaultdict(int)
    for iv in sim.engine.intervals:
        if iv.stream.startswith("send_"):
            sends[(iv.stage, iv.stream, int(iv.name.rsplit("mb", 1)[1]))].append(iv)
        elif iv.stream == "dp":
            dp_slices[(iv.stage, iv.name.split("chunk ")[1].split()[0] if "chunk " in iv.name else "")] += 1
    steps_of: dict[int, list[_StepSlice]] = defaultdict(list)
    by_key: dict[tuple[Phase, int, int, int], _StepSlice] = {}
    flows: list[tuple[int, int, int, tuple]] = []  # (stage, thread, send start, receiver key)
    optimizer_start: dict[int, int] = {}
    counters: list[dict] = []
    for stage in range(p):
        mem = stage_memory(job, stage)
        static = mem.weights_bytes + mem.gradients_bytes + mem.optimizer_bytes
        counters.append(_counter(stage, 0, static, 0))
        live = 0
        for iv in (x for x in sim.engine.intervals if x.stage == stage and not x.stream.startswith("send_")):
            start, end = ns(iv.start_s), ns(iv.end_s)
            if iv.stream == "dp":  # a chunk's fp32 gradients, in as many slices as it has buckets
                chunk = iv.name.split("chunk ")[1].split()[0] if "chunk " in iv.name else ""
                w.slice(stage, "dp", iv.name, start, end, "dp",
                        {"bytes": stage_parameters(job, stage) // v * 4 // dp_slices[(stage, chunk)],
                         "collective": grad_kind.value, "data_parallel_size": plan.data_parallel_size})
                continue
            if iv.step is None:  # the optimizer step
                optimizer_start[stage] = start
                params = stage_parameters(job, stage)
                shard = params / plan.data_parallel_size if plan.use_distributed_optimizer else params
                w.slice(stage, "compute", iv.name, start, end, "optimizer",
                        {"parameters": params, "bytes": shard * optimizer_bytes_per_param(plan.precision)})
                continue
            step = iv.step
            chunk_bytes = saved[stage][step.chunk] + (emb_saved if (stage, step.chunk) == (0, 0) else 0) \
                + (out_saved if (stage, step.chunk) == (p - 1, v - 1) else 0)
            step_parts = parts(stage, step.chunk, step.phase)
            labels = [x.label for x in step_parts if isinstance(x.label, int)]
            w.slice(stage, "compute", iv.name, start, end, step.phase.value, {
                "micro_batch": step.micro_batch, "chunk": step.chunk, "phase": step.phase.value,
                "layers": f"{min(labels)}-{max(labels)}" if labels else "",
                "flops": sum(x.timeline.flops for x in step_parts),
                ("saved_bytes" if step.phase is Phase.forward else "freed_bytes"): chunk_bytes})
            _expand_step(w, step_parts, iv, start, end, step.micro_batch, step.micro_batch in detail, ab)
            st = _StepSlice(iv.name, start, end)
            steps_of[stage].append(st)
            by_key[(step.phase, step.micro_batch, stage, step.chunk)] = st  # the engine's arrival key
            live += chunk_bytes if step.phase is Phase.forward else -chunk_bytes
            counters.append(_counter(stage, end, static, live))
            consumer = _consumer(step, p, v)
            if consumer is None:
                continue
            thread = f"send_{step.phase.value}"
            send = sends[(stage, thread, step.micro_batch)].popleft()
            a, b = ns(send.start_s), ns(send.end_s)
            st.send_end = b
            w.slice(stage, thread, send.name, a, b, "p2p",
                    {"micro_batch": step.micro_batch, "chunk": step.chunk, "bytes": p2p_bytes,
                     "from_stage": stage, "to_stage": consumer[0]})
            flows.append((stage, THREADS[thread], a, consumer[1]))
    assert not any(sends.values()), "a send was not matched to the step that produced it"
    flow_events = []
    for flow_id, (stage, tid, send_start, key) in enumerate(flows):
        receiver = by_key[key]
        receiver.input_start = send_start
        flow_events.append({"ph": "s", "id": flow_id, "name": "p2p", "cat": "p2p", "pid": stage, "tid": tid,
                            "ts": _us(send_start)})
        flow_events.append({"ph": "f", "bp": "e", "id": flow_id, "name": "p2p", "cat": "p2p", "pid": key[2],
                            "tid": THREADS["compute"], "ts": _us(receiver.start)})
    for stage in range(p):
        _idle(w, stage, steps_of[stage], optimizer_start.get(stage, 0), not plan.overlap_p2p_comm)
    meta = [e for e in w.events if e["ph"] == "M"]
    slices = sorted((e for e in w.events if e["ph"] == "X"),
                    key=lambda e: (e["pid"], e["tid"], e["ts"], -e["dur"]))
    return meta + slices + flow_events + counters


def _counter(stage: int, at_ns: int, static: int, live: int) -> dict:
    return {"ph": "C", "name": MEMORY_COUNTER, "pid": stage, "ts": _us(at_ns),
            "args": {"weights, gradients, optimizer": static / GIB, "activations": live / GIB}}


def trace_document(sim: Simulation, job: Job, detail: Iterable[int] = (0,)) -> dict:
    return {"traceEvents": trace_events(sim, job, detail), "displayTimeUnit": "ns",
            "otherData": {"model": job.model.name, "cluster": job.cluster.name, "num_gpus": job.num_gpus,
                          "plan": layout(job.plan), "global_batch_size": job.plan.global_batch_size,
                          **settings_json(job.model, job.plan),
                          "iteration_time_s": sim.estimate.iteration_time_s}}


def write_trace(sim: Simulation, job: Job, path: Path, detail: Iterable[int] = (0,)) -> None:
    """Write the trace atomically (see ``simulator.spec._io.write_output``): a reader never sees half a file."""
    write_output(path, json.dumps(trace_document(sim, job, detail), separators=(",", ":"), allow_nan=False), "trace")
