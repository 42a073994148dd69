"""``simulator memory``: will the plan fit, and where does each GPU's memory go?"""

from __future__ import annotations

import json
from typing import Any

import click

from simulator.cli.options import job_from_options, plan_options, require_fit, require_fit_option
from simulator.estimator.memory import MemoryPlan, memory_plan
from simulator.outputs.describe import settings_json
from simulator.spec.plan import Job
from simulator.spec.units import format_gib, text_table

_COLUMNS = ("stage", "layers", "weights", "grads", "optimizer", "activations", "in-flight", "transient", "reserve",
            "peak", "fits")


def describe_job(job: Job) -> str:
    p = job.plan
    parts = [
        f"{job.model.name} on {job.num_gpus} x {job.cluster.gpu.name} ({job.cluster.name})",
        f"TP {p.tensor_parallel_size} PP {p.pipeline_parallel_size} DP {p.data_parallel_size}"
        + (f" VPP {p.virtual_pipeline_stages}" if p.interleaved else "")
        + (" SP" if p.sequence_parallel else ""),
        f"micro-batch {p.micro_batch_size}, global batch {p.global_batch_size} ({p.num_micro_batches} micro-batches)",
        f"recompute {p.recompute.granularity.value}"
        + (f"/{p.recompute.method.value}/{p.recompute.num_layers}" if p.recompute.granularity.value == "full" else ""),
        p.precision.value + (", distributed optimizer" if p.use_distributed_optimizer else ""),
        f"sequence {job.model.seq_length:,}, {'flash' if p.use_flash_attention else 'unfused'} attention",
    ]
    text = "; ".join(parts)
    if job.model.is_moe:
        from simulator.cli.plan_cmd import experts_line

        text += "\n" + experts_line(job.model, p)
    return text


def render_table(plan: MemoryPlan) -> str:
    """The per-stage breakdown in GiB, one row per pipeline stage."""
    rows = [_COLUMNS]
    for s in plan.stages:
        rows.append((
            str(s.stage), str(s.num_layers), format_gib(s.weights_bytes), format_gib(s.gradients_bytes),
            format_gib(s.optimizer_bytes), format_gib(s.activations_bytes), str(s.in_flight),
            format_gib(s.transient_bytes), format_gib(s.reserve_bytes), format_gib(s.peak_bytes),
            "yes" if s.fits else "NO",
        ))
    return text_table(_COLUMNS, rows[1:], frozenset())


def to_json(job: Job, plan: MemoryPlan) -> dict[str, Any]:
    return {
        "model": job.model.name,
        "cluster": job.cluster.name,
        "num_gpus": job.num_gpus,
        "plan": job.plan.model_dump(mode="json"),
        **settings_json(job.model, job.plan),
        **({"moe_load_imbalance": job.model.moe_load_imbalance} if job.model.is_moe else {}),
        **plan.model_dump(mode="json"),
    }


EXAMPLES = """
\b
Examples:
  simulator memory --gpus 1024 --tp 8 --pp 16 --sp --recompute-granularity selective --gbs 1536
  simulator memory --model megatron-22b --tp 8 --mbs 4 --gbs 4 --json
  simulator memory --model llama3-70b --cluster dgx-h100 --gpus 64 --tp 8 --pp 4 --sp \\
      --recompute-granularity selective --use-distributed-optimizer
"""


@click.command("memory", epilog=EXAMPLES)
@plan_options
@require_fit_option
def memory(require_fit_flag: bool, **options: Any) -> None:
    """Per-stage, per-GPU memory of a plan (GiB) and whether it fits."""
    from simulator.spec.hf import collected_notes

    with collected_notes() as notes:
        job = job_from_options(**options)
    plan = memory_plan(job)
    if options["as_json"]:
        click.echo(json.dumps({**to_json(job, plan), "notes": notes}, indent=2, allow_nan=False))
        if require_fit_flag:
            require_fit(job, plan)
        return
    click.echo(describe_job(job))
    for note in notes:
        click.echo(f"note: {note}")
    click.echo("memory per GPU, GiB (in-flight = micro-batch chunks held at the stage's peak)")
    click.echo(render_table(plan))
    verdict = (
        f"fits: peak {format_gib(plan.peak_bytes)} GiB of {format_gib(plan.capacity_bytes)} GiB"
        if plan.fits
        else f"does NOT fit: stage {plan.overflowing_stage} needs {format_gib(plan.peak_bytes)} GiB of "
        f"{format_gib(plan.capacity_bytes)} GiB"
    )
    click.echo(verdict)
    if require_fit_flag:
        require_fit(job, plan)
