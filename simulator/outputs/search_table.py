"""Every plan a search screened, as rows: what ``search --json --all`` and ``search --csv`` export.

A row is a plan's layout (Megatron's names), its closed-form screen time with the throughput and
MFU that time gives, its peak memory, and the engine's time when the search simulated it. Every
plan of one search has the same model FLOPs and peak, so MFU is the simulated best plan's MFU
scaled by the ratio of times; like every MFU here it counts attention's full s x s product, as Megatron
reports MFU, though a causal flash kernel runs about half of it.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

from simulator.outputs.describe import layout
from simulator.planner.plan_search import SearchRequest, SearchResult
from simulator.spec._io import write_output

COLUMNS = ("rank", "tensor_parallel_size", "pipeline_parallel_size", "virtual_pipeline_stages", "data_parallel_size",
           "micro_batch_size", "sequence_parallel", "recompute_granularity", "recompute_method",
           "recompute_num_layers", "use_distributed_optimizer", "screen_time_s", "screen_tokens_per_s", "screen_mfu",
           "peak_memory_bytes", "simulated_iteration_time_s", "layout")


def screened_rows(result: SearchResult, req: SearchRequest) -> list[dict[str, Any]]:
    """One dict per screened plan, fastest screen time first (``rank`` 1 is the screen's fastest)."""
    best = result.best.estimate
    mfu_seconds = best.mfu * best.iteration_time_s
    tokens = req.global_batch_size * req.model.seq_length
    simulated = {r.plan: r.estimate.iteration_time_s for r in result.plans}
    rows = []
    for rank, s in enumerate(result.screened, 1):
        p, r = s.plan, s.plan.recompute
        rows.append({
            "rank": rank, "tensor_parallel_size": p.tensor_parallel_size,
            "pipeline_parallel_size": p.pipeline_parallel_size, "virtual_pipeline_stages": p.virtual_pipeline_stages,
            "data_parallel_size": p.data_parallel_size, "micro_batch_size": p.micro_batch_size,
            "sequence_parallel": p.sequence_parallel, "recompute_granularity": r.granularity.value,
            "recompute_method": r.method.value, "recompute_num_layers": r.num_layers,
            "use_distributed_optimizer": p.use_distributed_optimizer, "screen_time_s": s.screen_time_s,
            "screen_tokens_per_s": tokens / s.screen_time_s, "screen_mfu": mfu_seconds / s.screen_time_s,
            "peak_memory_bytes": s.peak_bytes, "simulated_iteration_time_s": simulated.get(p), "layout": layout(p),
        })
    return rows


def write_csv(rows: list[dict[str, Any]], path: Path) -> None:
    """Write the rows as CSV (a header of ``COLUMNS``) as every output is written (``write_output``)."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows({k: ("" if v is None else v) for k, v in row.items()} for row in rows)
    write_output(path, buffer.getvalue(), "CSV table")
