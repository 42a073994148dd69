"""`simulator plan`: iteration time, MFU, breakdown, memory and training days of one plan."""

from __future__ import annotations

import json
from pathlib import Path

import click

from simulator.cli.goodput_options import goodput_options, goodput_settings, optimal_beside, render_goodput
from simulator.cli.megatron_input import MegatronAwareCommand, job_from_megatron, megatron_options
from simulator.cli.options import (
    TOKENS,
    BoundedInt,
    OutputFile,
    job_from_options,
    plan_options,
    require_fit,
    require_fit_option,
)
from simulator.outputs.describe import band_origin
from simulator.spec import limits
from simulator.spec.units import format_gib

EXAMPLES = """
\b
Examples:
  simulator plan --gpus 1024 --tp 8 --pp 16 --vpp 2 --sp --recompute-granularity selective \\
      --gbs 1536 --tokens 300e9
  simulator plan --model megatron-22b --tp 8 --gbs 4 --mbs 4 --json
  simulator plan ... --trace iteration.json     # open in https://ui.perfetto.dev
  simulator plan ... --plots figures/            # timeline, stage memory, memory vs micro-batch, ...
  simulator plan ... --launch                     # the Megatron-LM launch and NeMo fragment that run it
  simulator plan ... --tokens 15e12 --async-save --mtbf-gpu-hours 25000   # expected days with failures
  simulator plan --cluster dgx-h100 --megatron-args run.sh          # predict an existing launch
  simulator plan --gpus 64 --num-layers 32 --hidden-size 4096 --num-attention-heads 32 --seq-length 4096 \\
      --tensor-model-parallel-size 8 --bf16          # Megatron's flags work here too
"""


def plan_json(job, est) -> dict:
    """The `simulator plan --json` document: the estimate plus the job that produced it."""
    from simulator.estimator.prediction import assert_finite
    from simulator.outputs.describe import settings_json

    doc = assert_finite(est).model_dump(mode="json")
    doc["model"] = job.model.name
    doc["cluster"] = job.cluster.name
    doc["plan"] = job.plan.model_dump(mode="json")
    doc.update(settings_json(job.model, job.plan))
    if job.model.is_moe:
        doc["moe_load_imbalance"] = job.model.moe_load_imbalance
    return doc


def experts_line(model, plan=None) -> str:
    """'experts: 8 routed, top-2, dropless; EP 8, ETP 1, alltoall dispatcher, grouped GEMM; load imbalance 1.3
    planned for': what a mixture-of-experts model's numbers rest on beyond the dense layout."""
    parts = [f"{model.num_experts} routed, top-{model.moe_router_topk}"]
    if model.moe_shared_expert_intermediate_size:
        parts.append(f"shared {model.moe_shared_expert_intermediate_size:,}")
    if model.num_moe_layers < model.num_layers:
        parts.append(f"in {model.num_moe_layers} of {model.num_layers} layers")
    factor = model.moe_expert_capacity_factor
    parts.append(f"capacity factor {factor:g}" if factor is not None else "dropless")
    text = "experts: " + ", ".join(parts)
    if plan is not None:
        etp = plan.expert_tensor_parallel_size
        text += (f"; EP {plan.expert_model_parallel_size}, ETP {plan.expert_tp_size}" + (" (= TP)" if etp is None else "")
                 + f", {plan.moe_token_dispatcher_type.value} dispatcher, "
                 + ("grouped GEMM" if plan.moe_grouped_gemm else "one GEMM per expert"))
    return text + f"; load imbalance {model.moe_load_imbalance:g} planned for (1 = balanced)"


def launch_json(job, save_interval: int | None = None, async_save: bool = False) -> dict:
    """The keys that say how to run the job: Megatron flags, environment and notes, the NeMo fragment and
    megatron-core's TransformerConfig / DistributedDataParallelConfig / GPTModel arguments."""
    from simulator.outputs.bridge import bridge_recipe
    from simulator.outputs.export import megatron_args, megatron_env, megatron_notes
    from simulator.outputs.export_config import ddp_config, gpt_model_args, nemo_yaml, transformer_config

    return {"megatron_args": megatron_args(job, save_interval, async_save), "megatron_env": megatron_env(job),
            "megatron_notes": megatron_notes(job), "nemo_yaml": nemo_yaml(job),
            "transformer_config": transformer_config(job), "ddp_config": ddp_config(job),
            "gpt_model": gpt_model_args(job), "bridge_recipe": bridge_recipe(job, save_interval, async_save)}


def render_launch_text(job, save_interval: int | None = None, async_save: bool = False) -> str:
    from simulator.outputs.export import render_launch
    from simulator.outputs.export_config import nemo_yaml

    return "\nMegatron-LM launch:\n" + render_launch(job, save_interval=save_interval, async_save=async_save) + "\n\nNeMo config fragment:\n" + nemo_yaml(job)


def render(job, est, notes: list[str] = (), goodput=None, optimal=None) -> str:
    from simulator.estimator.prediction import assert_finite
    from simulator.outputs.describe import run_settings

    plan, b = job.plan, assert_finite(est).breakdown
    T = est.iteration_time_s
    rec = plan.recompute.granularity.value
    lines = [
        f"{job.model.name} on {job.num_gpus} x {job.cluster.gpu.name} ({job.cluster.name}, {job.num_nodes} nodes)",
        run_settings(job.model.seq_length, plan),
        *(f"note: {n}" for n in notes),
        f"plan: TP {plan.tensor_parallel_size}, "
        + (f"CP {plan.context_parallel_size}, " if plan.context_parallel_size > 1 else "")
        + f"PP {plan.pipeline_parallel_size}"
        + (f" (x{plan.virtual_pipeline_stages} interleaved)" if plan.interleaved else "")
        + f", DP {plan.data_parallel_size}, SP {'on' if plan.sequence_parallel else 'off'}, recompute {rec}, "
        f"micro-batch {plan.micro_batch_size}, global batch {plan.global_batch_size} "
        f"({plan.num_micro_batches} micro-batches per pipeline)",
        *([experts_line(job.model, plan)] if job.model.is_moe else []),
        "",
        f"iteration time   {T:9.3f} s" + _band(est.iteration_time_s_low, est.iteration_time_s_high, "s", 3),
        f"MFU / HFU        {est.mfu * 100:8.1f} % / {est.hfu * 100:.1f} %   ({est.tflops_per_gpu:.0f} model TFLOP/s per GPU; "
        f"attention counted {est.mfu_attention_count}, as Megatron reports MFU)",
        f"throughput       {est.tokens_per_s:9.0f} tokens/s",
        *([f"note: {est.utilisation_note}"] if est.utilisation_note else []),
        "",
        f"breakdown (stage {est.critical_stage}):",
    ]
    moe = est.expert_dispatch_s is not None
    for name, value in (("compute", b.compute_s),
                        ("TP + EP communication (exposed)" if moe else "TP communication (exposed)",
                         b.tp_communication_s),
                        ("pipeline bubble", b.pipeline_bubble_s), ("pipeline transfers (exposed)", b.pipeline_transfer_s),
                        ("DP gradient reduction (exposed)", b.data_parallel_s), ("optimizer", b.optimizer_s),
                        ("waiting for the host", b.host_overhead_s)):
        lines.append(f"  {name:32s} {value:9.3f} s  {value / T * 100:5.1f} %")
        if moe and name.startswith("TP + EP"):
            lines.append(f"    MoE dispatch + combine, busy {est.expert_dispatch_s:9.3f} s  "
                         f"{est.expert_dispatch_s / T * 100:5.1f} %   (partly under the backward's compute)")
    mem = est.memory
    worst = mem.stages[mem.overflowing_stage if mem.overflowing_stage is not None else
                       max(range(len(mem.stages)), key=lambda i: mem.stages[i].peak_bytes)]
    lines += [
        "",
        f"memory peak      {format_gib(mem.peak_bytes)} GiB of {format_gib(mem.capacity_bytes)} GiB "
        f"(stage {worst.stage}) -> {'fits' if mem.fits else 'DOES NOT FIT'}",
    ]
    if est.training_days is not None:
        lines += [f"training         {est.training_days:9.1f} days for {est.tokens:.3g} tokens "
                  f"({est.gpu_hours:,.0f} GPU-hours)" + _band(est.training_days_low, est.training_days_high, "days", 1)]
    if goodput is not None:
        lines += render_goodput(goodput, optimal)
    if est.iteration_time_s_low is not None:
        lines += ["", "band: " + band_origin(est.validation_regime, est.outside_regime_reasons, est.band_from_runs)]
    if est.band_drivers and not est.band_from_runs:  # a band from runs did not play the constants' ends
        lines += ["the profile's unpinned constants at the ends of their ranges; the largest effects:"]
        for d in est.band_drivers[:3]:
            lines.append(f"  {d['constant']:32s} {d['low']:.3g} .. {d['high']:.3g}   "
                         f"{d['change_at_low'] * 100:+5.1f} % .. {d['change_at_high'] * 100:+5.1f} %")
    if est.validation_note:
        lines += ["", f"note: {est.validation_note}"]
    return "\n".join(lines)


def gpus_of_nodes(kwargs: dict, nnodes: int | None) -> int | None:
    """--gpus, or --nnodes times the cluster's GPUs per node; both given, they must agree."""
    gpus = kwargs.get("gpus")
    if nnodes is None:
        return gpus
    from simulator.spec.errors import ConfigError
    from simulator.spec.hardware import load_cluster

    per_node = load_cluster(kwargs.get("cluster", "dgx-a100-80gb")).gpus_per_node
    if gpus is not None and gpus != nnodes * per_node:
        raise ConfigError(f"--gpus {gpus} and --nnodes {nnodes} x {per_node} GPUs per node disagree; give one of them")
    return nnodes * per_node


def _band(low: float | None, high: float | None, unit: str, digits: int) -> str:
    return "" if low is None or high is None else f"   (band {low:.{digits}f} .. {high:.{digits}f} {unit})"


@click.command("plan", epilog=EXAMPLES, cls=MegatronAwareCommand)
@plan_options
@megatron_options
@click.option("--launch", "show_launch", is_flag=False, flag_value="megatron", default=None,
              type=click.Choice(["megatron", "bridge"]),
              help="Also print the launch: alone or 'megatron', the Megatron-LM launch (environment, torchrun and "
                   "flags) and the NeMo fragment; 'bridge', a Megatron-Bridge recipe (ConfigContainer) in Python.")
@click.option("--nnodes", "nnodes", type=BoundedInt(1, limits.MAX_GPUS), default=None,
              help="Nodes, each of the cluster's (or the launch's --nproc-per-node) GPUs: --gpus = nodes x GPUs per "
                   "node. With --megatron-args it replaces the launcher's count.")
@click.option("--tokens", type=TOKENS, default=None,
              help="Training tokens, for days and GPU-hours (e.g. 300e9); MoE models count active parameters.")
@click.option("--profile", "profile_path", default=None, metavar="FILE|NAME",
              help="Hardware profile (default: the published profile of the cluster's GPU).")
@click.option("--trace", "trace_path", type=OutputFile("trace"), default=None,
              help="Write a Chrome trace-event JSON of the iteration (Perfetto).")
@click.option("--plots", "plots_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Write the plan's figures (PNG) into this folder: timeline, stage memory, memory vs "
                   "micro-batch, memory by strategy, time breakdown, and predicted vs measured.")
@goodput_options
@require_fit_option
def plan_command(tokens, profile_path, trace_path, as_json, require_fit_flag, plots_dir=None, show_launch=None,
                 nnodes=None, **kwargs):
    """Predict one training iteration of a plan: time, MFU/HFU, breakdown, memory and training days.
    For mixture-of-experts models MFU and days count the active parameters (the experts a token is
    routed to), not every expert."""
    from simulator.cost.profile import load_profile
    from simulator.estimator.prediction import simulate_job
    from simulator.spec.hf import collected_notes

    launch_notes: list[str] = []
    launch_checkpoints: dict = {}
    with collected_notes() as notes:
        from_megatron = job_from_megatron(click.get_current_context(), {**kwargs, "nnodes": nnodes})
        if from_megatron is not None:
            job, launch_notes, launch_checkpoints = from_megatron
        else:
            job = job_from_options(**{**kwargs, "gpus": gpus_of_nodes(kwargs, nnodes)})
    notes = launch_notes + notes
    settings = goodput_settings(kwargs, launch_checkpoints, notes)
    profile = load_profile(profile_path) if profile_path else None
    from simulator.estimator.band import with_band

    sim = simulate_job(job, profile, tokens=tokens, record=trace_path is not None or plots_dir is not None)
    est = with_band(job, sim.estimate, profile)
    goodput = None
    if tokens is not None:
        from simulator.estimator.goodput import EndlessRunError, goodput as expected_days

        try:
            goodput = expected_days(job, est, settings)
        except EndlessRunError as exc:
            if settings != type(settings)():
                raise  # what the flags asked for has no answer
            notes.append(f"no expected days: {exc}")  # the cluster's own data: the ideal days still stand
    optimal = optimal_beside(job, est, settings, goodput)  # beside an interval the user chose
    interval = goodput.save_interval if goodput is not None else settings.save_interval
    if trace_path is not None:
        from simulator.outputs.trace import write_trace

        write_trace(sim, job, trace_path)
    plots = {}
    if plots_dir is not None:
        from simulator.outputs.figures import write_plan_figures

        plots = write_plan_figures(job, plots_dir, sim, profile)
    if as_json:
        doc = plan_json(job, est)
        doc["notes"] = notes
        doc["goodput"] = goodput.model_dump(mode="json") if goodput is not None else None
        doc["goodput_optimal"] = (None if optimal is None else
                                  {"save_interval": optimal.save_interval, "expected_days": optimal.expected_days})
        doc.update(launch_json(job, interval, settings.async_save))
        if plots:
            doc["plots"] = plots
        click.echo(json.dumps(doc, indent=2, sort_keys=True, allow_nan=False))
    else:
        click.echo(render(job, est, notes, goodput, optimal))
        if show_launch == "bridge":
            from simulator.outputs.bridge import bridge_recipe

            click.echo("\nMegatron-Bridge recipe:\n" + bridge_recipe(job, interval, settings.async_save))
        elif show_launch:
            click.echo(render_launch_text(job, interval, settings.async_save))
        if trace_path is not None:
            click.echo(f"\ntrace written to {trace_path}")
        if plots:
            click.echo(f"figures written to {plots_dir}: {', '.join(plots)}")
    if require_fit_flag:
        require_fit(job, sim.estimate.memory)
