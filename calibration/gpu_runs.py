"""The reference runs of a GPU session: one model, recompute none, selective and full, one record each.

    python -m calibration.gpu_runs --model gpt3-1.3b --device cuda --out OUTDIR --budget-s 200

Needs torch, pydantic and PyYAML only (no numpy, no click), so that it runs on a GPU machine where
``calibration/gpu_session.sh`` installed the carried wheels. Each run gets an equal share of what is
left of ``--budget-s`` and is stopped past it; a run that fails or is stopped leaves no record and a
line saying why, and the next one still runs. Validate the records at home:

    simulator validate OUTDIR/run-selective.json --profile OUTDIR/profile.json
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

GRANULARITIES = ("none", "selective", "full")
# the cluster whose GPU a device name stands for (the record's cluster, which only the predictions use)
CLUSTERS = (("H200", "dgx-h200"), ("H100", "dgx-h100"), ("A100", "dgx-a100-80gb"))


def cluster_for(device: str) -> str:
    if device == "cpu":
        return "local-cpu"
    import torch

    name = torch.cuda.get_device_name(0)
    for tag, cluster in CLUSTERS:
        if tag in name:
            if cluster == "dgx-a100-80gb" and torch.cuda.get_device_properties(0).total_memory < 48 * 2**30:
                return "dgx-a100-40gb"
            return cluster
    return "dgx-h100"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gpt3-1.3b", help="A preset name or a YAML/JSON model file.")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--tp", type=int, default=1, help="Tensor-parallel size = processes (one GPU each).")
    parser.add_argument("--mbs", type=int, default=2, help="Micro-batch size.")
    parser.add_argument("--gbs", type=int, default=8, help="Global batch size.")
    parser.add_argument("--iterations", type=int, default=6, help="Iterations per run, the first a warm-up.")
    parser.add_argument("--budget-s", type=float, default=300.0, help="Wall-clock allowance for all runs.")
    parser.add_argument("--granularities", default=",".join(GRANULARITIES))
    args = parser.parse_args(argv)

    from calibration.reference.launch import check_supported, run_reference
    from simulator.spec.catalog import load_model
    from simulator.spec.errors import SimulatorError
    from simulator.spec.hardware import load_cluster
    from simulator.spec.plan import Job, ParallelPlan

    start = time.monotonic()
    granularities = [g for g in args.granularities.split(",") if g]
    failed = 0
    try:
        model, cluster = load_model(args.model), load_cluster(cluster_for(args.device))
    except SimulatorError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for i, granularity in enumerate(granularities):
        left = args.budget_s - (time.monotonic() - start)
        share = left / (len(granularities) - i)
        out = args.out / f"run-{granularity}.json"
        if share < 10:
            print(f"recompute {granularity}: skipped, {left:.0f} s left of the budget", flush=True)
            failed += 1
            continue
        try:
            plan = ParallelPlan(tensor_parallel_size=args.tp, micro_batch_size=args.mbs, global_batch_size=args.gbs,
                                precision="fp32" if args.device == "cpu" else "bf16",
                                recompute={"granularity": granularity}, allow_tp_across_nodes=args.device == "cpu",
                                attention_backend="unfused")  # the attention the reference loop implements
            job = Job(model=model, cluster=cluster, plan=plan)
            check_supported(job)
            t0 = time.monotonic()
            record = run_reference(job, device=args.device, iterations=args.iterations, out=out, timeout_s=share)
        except (SimulatorError, ValueError) as exc:
            print(f"recompute {granularity}: no record: {' '.join(str(exc).split())}", flush=True)
            failed += 1
            continue
        timed = record.timed_iteration_times_s
        peak = max(record.peak_allocated_bytes_per_stage) / 2**30 if record.peak_allocated_bytes_per_stage else None
        print(f"recompute {granularity}: {out} in {time.monotonic() - t0:.0f} s; iteration "
              f"{sum(timed) / len(timed) * 1e3:.1f} ms over {len(timed)} timed, losses "
              f"{record.losses[0]:.3f} -> {record.losses[-1]:.3f}"
              + (f", peak allocated {peak:.1f} GiB" if peak is not None else ""), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
