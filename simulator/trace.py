"""Chrome trace-event JSON of a simulated iteration (opens in Perfetto and chrome://tracing).

One process per pipeline stage, one thread per stream (compute, tensor-parallel communication,
pipeline sends in each direction, data-parallel reduction). Pipeline steps appear as slices;
the steps of micro-batch 0 are also expanded into their layer ops (GEMMs, attention,
collectives) from the layer timeline, which keeps the file small for 1,000-step pipelines
while showing what a step is made of.
"""

from __future__ import annotations

import json
from pathlib import Path

from simulator._io import write_output
from simulator.estimate import Simulation
from simulator.layers import Stream
from simulator.schedules import Phase

THREADS = {"compute": 0, "tp_comm": 1, "send_forward": 2, "send_backward": 3, "dp": 4}
US = 1e6


def trace_events(sim: Simulation, job) -> list[dict]:
    events: list[dict] = []
    p = job.plan.pipeline_parallel_size
    for stage in range(p):
        events.append({"ph": "M", "name": "process_name", "pid": stage, "args": {"name": f"stage {stage}"}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": stage, "args": {"sort_index": stage}})
        for thread, tid in THREADS.items():
            events.append({"ph": "M", "name": "thread_name", "pid": stage, "tid": tid, "args": {"name": thread}})
    for iv in sim.engine.intervals:
        events.append({"ph": "X", "name": iv.name, "pid": iv.stage, "tid": THREADS[iv.stream],
                       "ts": iv.start_s * US, "dur": (iv.end_s - iv.start_s) * US,
                       "cat": iv.stream})
        step = iv.step
        if step is None or step.micro_batch != 0:
            continue
        layers = job.layers_per_chunk[iv.stage]
        timeline = sim.layer.forward if step.phase is Phase.forward else sim.layer.backward
        offset = iv.start_s
        if step.phase is Phase.forward and iv.stage == 0 and step.chunk == 0:
            offset += sim.extras.embedding_forward.duration_s
        for layer in range(layers):
            for op in timeline.intervals:
                events.append({"ph": "X", "name": op.name, "pid": iv.stage,
                               "tid": THREADS["tp_comm" if op.stream is Stream.tp_comm else "compute"],
                               "ts": (offset + op.start_s) * US, "dur": (op.end_s - op.start_s) * US,
                               "cat": "op", "args": {"layer": layer}})
            offset += timeline.duration_s
    return events


def write_trace(sim: Simulation, job, path: Path) -> None:
    """Write the trace (atomically, see ``simulator._io.write_output``)."""
    doc = {"traceEvents": trace_events(sim, job), "displayTimeUnit": "ms",
           "otherData": {"model": job.model.name, "cluster": job.cluster.name}}
    write_output(path, json.dumps(doc, allow_nan=False), "trace")
