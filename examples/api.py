"""The Python API in one page: estimate a plan, search for the best one, draw its figures, write a trace.

    python examples/api.py [OUTDIR]

Llama 3 8B on 64 H100s, global batch 512 (4M tokens), 1T tokens. Prints the plan's iteration time,
MFU, breakdown and memory, then the three fastest plans of the search; with OUTDIR it also writes
the best plan's pipeline timeline, its per-stage memory and a Perfetto trace there.
"""

from __future__ import annotations

import sys
from pathlib import Path

from simulator import (
    Job,
    ParallelPlan,
    RecomputePolicy,
    SearchRequest,
    estimate,
    load_cluster,
    load_model,
    plan_name,
    search,
    simulate_job,
    write_trace,
)

TOKENS = 1e12


def main(out: Path | None) -> None:
    model = load_model("llama3-8b")
    cluster = load_cluster("dgx-h100")

    # One plan: TP 2 x PP 2 x DP 16 with sequence parallelism and selective recompute.
    plan = ParallelPlan(tensor_parallel_size=2, pipeline_parallel_size=2, data_parallel_size=16,
                        sequence_parallel=True, micro_batch_size=1, global_batch_size=512,
                        recompute=RecomputePolicy(granularity="selective"), use_flash_attention=True)
    job = Job(model=model, cluster=cluster, plan=plan)
    est = estimate(job, tokens=TOKENS)
    print(f"{model.name} on {job.num_gpus} x {cluster.gpu.name}, sequence {model.seq_length:,}")
    print(f"plan: iteration {est.iteration_time_s:.3f} s, MFU {est.mfu:.1%}, {est.tokens_per_s:,.0f} tokens/s, "
          f"peak {est.memory.peak_bytes / 2**30:.1f} GiB, {est.training_days:.1f} days for {TOKENS:.0e} tokens")
    for part, seconds in est.breakdown.model_dump().items():
        print(f"  {part:22s} {seconds:8.3f} s")

    # The search: every valid plan on the same GPUs, the fastest that fits first.
    result = search(SearchRequest(model=model, cluster=cluster, num_gpus=64, global_batch_size=512,
                                  use_flash_attention=True), tokens=TOKENS, top=3)
    print(f"search: {result.enumerated} plans, {len(result.screened)} fit, {result.simulated} simulated")
    for ranked in result.plans:
        e = ranked.estimate
        print(f"  #{ranked.rank}: {plan_name(ranked.plan)}: {e.iteration_time_s:.3f} s, MFU {e.mfu:.1%}, "
              f"{e.training_days:.1f} days (band {e.training_days_low:.1f}-{e.training_days_high:.1f})")

    if out is not None:
        from simulator.outputs.figures import plan_data
        from simulator.outputs.plots import draw

        best = Job(model=model, cluster=cluster, plan=result.best.plan)
        sim = simulate_job(best, record=True)
        for kind in ("timeline", "stage-memory"):
            draw(kind, plan_data(kind, best, sim), out / f"{kind}.png")
        write_trace(sim, best, out / "trace.json")
        print(f"figures and trace of the best plan written to {out}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else None)
