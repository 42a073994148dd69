"""``simulator reference``: run the reference training loop on this machine and write its run record."""

from __future__ import annotations

from pathlib import Path
from statistics import mean
from typing import Any

import click
from click.core import ParameterSource

from simulator.cli.options import BoundedInt, OutputFile, job_from_options, plan_options
from simulator.spec import limits
from simulator.spec.plan import Precision

CPU_CLUSTER = "local-cpu"


EXAMPLES = """
\b
Examples:
  simulator reference --model calibration/reference/gpt-small-cpu.yaml --tp 2 --sp \\
      --recompute-granularity selective --gbs 4 --iterations 4 --out run.json
  simulator reference --model my-1b.yaml --device cuda --recompute-granularity full --out gpu-run.json
"""


@click.command("reference", epilog=EXAMPLES)
@plan_options
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True,
              help="cpu: gloo, fp32, one process per rank; cuda: NCCL, one GPU per rank.")
@click.option("--iterations", type=BoundedInt(1, limits.MAX_ITERATIONS), default=3, show_default=True,
              help="Training iterations; the first is a warm-up left out of the layer times.")
@click.option("--out", type=OutputFile("run record"), default=Path("reference-run.json"),
              show_default=True, help="Where to write the run record (JSON).")
@click.option("--seed", type=BoundedInt(0, limits.MAX_SEED), default=1234, show_default=True,
              help="Seed of the weights, data and dropout.")
@click.option("--threads", type=click.IntRange(min=1, max=1024), default=1, show_default=True,
              help="Torch threads per rank, set and checked (Megatron runs one; validate against a profile "
                   "measured with as many).")
@click.option("--megatron-log", "megatron_log", type=OutputFile("training log"), default=None,
              help="Also write the run as Megatron-LM's training log (what validate and calibrate --from-runs read).")
def reference(device: str, iterations: int, out: Path, seed: int, threads: int, megatron_log: Path | None,
              **options: Any) -> None:
    """Train the model with the plan for a few iterations under torchrun (TP x CP x PP x DP processes)."""
    from calibration.reference.launch import check_supported, run_reference

    ctx = click.get_current_context()
    if device == "cpu":
        # CPU runs are fp32 on the local-cpu cluster unless the user said otherwise
        if ctx.get_parameter_source("cluster") is ParameterSource.DEFAULT:
            options["cluster"] = CPU_CLUSTER
            options["allow_tp_across_nodes"] = True  # local-cpu: every rank is a node of its own
        if ctx.get_parameter_source("precision") is ParameterSource.DEFAULT:
            options["precision"] = Precision.fp32.value
    if not options.get("attention_backend") and not options.get("use_flash_attention") \
            and (options.get("context_parallel_size") or 1) == 1:
        # Megatron's own attention, the path the CPU profiles measure; context parallelism needs the
        # fused backend (the loop's flash-style ring attention), so it keeps Megatron's default
        options["attention_backend"] = "unfused"
    job = job_from_options(**options)
    check_supported(job)
    record = run_reference(job, device=device, iterations=iterations, out=out, seed=seed, threads=threads)
    if megatron_log is not None:
        from simulator.cli.reference_log import megatron_log_lines
        from simulator.spec._io import write_output

        write_output(megatron_log, "\n".join(megatron_log_lines(job, record)) + "\n", "training log")
    if options["as_json"]:
        click.echo(record.model_dump_json(indent=2))
        return
    click.echo(f"{job.model.name}: {job.num_gpus} processes on {record.device}, {len(record.losses)} iterations"
               + (f", load average {record.load_average[0]:.2f}" if record.load_average else ""))
    click.echo(f"losses: {', '.join(f'{x:.4f}' for x in record.losses)}")
    click.echo(f"iteration time: {mean(record.timed_iteration_times_s):.4f} s "
               f"(mean after {record.warmup_iterations} warm-up)")
    click.echo(f"activation bytes per layer: {record.layers[0].activation_bytes}")
    click.echo(f"run record: {out}")
