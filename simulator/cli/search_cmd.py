"""`simulator search`: the fastest plan that fits, with the Pareto figure and the flags to run it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from simulator.cli.options import (
    GLOBAL_BATCH,
    GPUS,
    LOAD_IMBALANCE,
    MICRO_BATCH,
    PARALLEL_SIZE,
    SEQ_LENGTH,
    TOKENS,
    VIRTUAL_STAGES,
    BoundedInt,
    OutputFile,
    data_parallel_size,
    plan_fields,
    with_load_imbalance,
)
from simulator.cli.goodput_options import goodput_options, goodput_settings, render_goodput
from simulator.cli.plan_cmd import experts_line, launch_json, plan_json, render_launch_text
from simulator.outputs.describe import band_origin
from simulator.spec import limits
from simulator.spec.plan import Precision, RecomputeGranularity
from simulator.spec.units import format_gib

EXAMPLES = """
\b
Examples:
  simulator search --model gpt3-175b --gpus 1024 --gbs 1536 --tokens 300e9
  simulator search --gpus 1024 --gbs 1536 --tp 8 --no-sp --recompute-granularity full   # pin dimensions
  simulator search --model megatron-22b --gpus 64 --gbs 256 --json --top 3
  simulator search --gpus 1024 --gbs 1536 --json --all --csv plans.csv   # every plan that fits
  simulator search --gpus 1024 --gbs 1536 --tokens 300e9 --plots figures/ --html search.html
"""


def _describe(plan) -> str:
    from simulator.spec.plan_names import compact_plan_name

    return compact_plan_name(plan)


def _goodputs(req, result, tokens) -> list:
    """Each listed plan's expected days (the best plan's simulated too), or [] without --tokens."""
    if tokens is None:
        return []
    from simulator.estimator.goodput import EndlessRunError, goodput
    from simulator.spec.plan import Job

    try:
        return [goodput(Job.model_construct(model=req.model, cluster=req.cluster, plan=r.plan), r.estimate, req.goodput,
                        simulate=i == 0) for i, r in enumerate(result.plans)]
    except EndlessRunError:
        if req.goodput != type(req.goodput)():
            raise
        return []  # the cluster's own failure rates leave no expected days at this size: the ideal ones stand


def rank_by_point_pick(plans: list, req):
    """The plan ``--rank-by point`` would put first, where the search's own ranking put another first; None
    where the two agree or the search ranked by the predicted time already. ``plans``: every finalist, ranked."""
    from simulator.planner.space import RankBy

    if req.rank_by is RankBy.point or not plans:
        return None
    fastest = min(plans, key=lambda r: r.estimate.iteration_time_s)  # of equal times, the first ranked, as point's
    return fastest if fastest.estimate.iteration_time_s < plans[0].estimate.iteration_time_s else None


def _point_pick_json(pick, top: int):
    if pick is None:
        return None
    return {"rank": pick.rank, "listed": pick.rank <= top, "plan_name": _describe(pick.plan),
            "plan": pick.plan.model_dump(mode="json"), "iteration_time_s": pick.estimate.iteration_time_s,
            "rank_key_s": pick.rank_key_s}


_RANK_KEY_WORDS = {"upper": "band's slow end", "expected-days": "wall time per useful iteration"}


def _point_pick_line(pick, best, top: int, rank_by: str) -> str:
    where = f"#{pick.rank}" + ("" if pick.rank <= top else f", not among the {top} listed")
    return (f"--rank-by point would pick {_describe(pick.plan)} ({where}): predicted "
            f"{pick.estimate.iteration_time_s:.4g} s against {best.estimate.iteration_time_s:.4g} s for #1, whose "
            f"{_RANK_KEY_WORDS.get(rank_by, 'rank key')} is {best.rank_key_s:.4g} s against {pick.rank_key_s:.4g} s")


def check_pins(req, attention_backend: str | None = None, use_flash_attention: bool = False) -> None:
    """Refuse a pinned dimension, or a setting every plan of the search takes, that breaks a rule, with the
    sentence `simulator plan` gives: a probe plan is built from them by the mapping `plan` uses
    (``plan_fields``) and checked against the model and the cluster as `plan` checks its own.

    The search only tries values the rules allow, so without this a pin such as --tp 3 against a
    vocabulary of 51,200 would end in "no plan satisfies the rules" without saying which rule, and a pair
    `plan` refuses (FP8 beside fp32, --attention-backend local beside --use-flash-attn) would reach
    pydantic or pass unnoticed. ``attention_backend`` and ``use_flash_attention`` are the flags as given.
    """
    from simulator.spec._io import build
    from simulator.spec.plan import Job, ParallelPlan

    pins = req.pins
    tp, pp = pins.tensor_parallel_size or 1, pins.pipeline_parallel_size or 1
    cp = pins.context_parallel_size or 1
    dp = data_parallel_size(req.num_gpus, tp, pp, None, cp)
    vpp = pins.virtual_pipeline_stages if pins.pipeline_parallel_size is not None else None
    sp = bool(pins.sequence_parallel) and pins.tensor_parallel_size is not None
    probe_dp, experts = 1, {}
    if pins.expert_model_parallel_size is not None or pins.expert_tensor_parallel_size is not None:
        # the widest stage the pins leave (every other GPU data-parallel), which any expert layout must tile;
        # sequence parallelism unless it is pinned off, since the search turns it on where EP and TP meet
        probe_dp = dp
        experts = {"expert_model_parallel_size": pins.expert_model_parallel_size or 1,
                   "expert_tensor_parallel_size": pins.expert_tensor_parallel_size}
        sp = pins.sequence_parallel is not False and tp > 1
    mbs = pins.micro_batch_size or 1
    flags = {
        "tensor_parallel_size": tp, "pipeline_parallel_size": pp, "context_parallel_size": cp,
        "virtual_pipeline_stages": vpp or 1, "sequence_parallel": sp, "micro_batch_size": mbs, **experts,
        "global_batch_size": mbs * pp * probe_dp,  # pp micro-batches per pipeline: what interleaving needs
        "use_distributed_optimizer": bool(pins.use_distributed_optimizer),
        "precision": req.precision.value, "fp8_format": req.fp8_format.value if req.fp8_format else None,
        "attention_backend": attention_backend, "use_flash_attention": use_flash_attention,
        "overlap_grad_reduce": req.overlap_grad_reduce,
    }
    if pins.recompute_granularity is not None:
        flags["recompute_granularity"] = pins.recompute_granularity.value
    probe = build(ParallelPlan, plan_fields(flags, probe_dp), "pinned plan")
    build(Job, {"model": req.model, "cluster": req.cluster, "plan": probe}, "pinned plan")


@click.command("search", epilog=EXAMPLES)
@click.option("--model", default="gpt3-175b", show_default=True, metavar="NAME|FILE", help="Model preset or file.")
@click.option("--seq-length", "seq_length", type=SEQ_LENGTH, default=None,
              help="Override the model's sequence length (tokens).")
@click.option("--cluster", default="dgx-a100-80gb", show_default=True, metavar="NAME|FILE", help="Cluster preset or file.")
@click.option("--gpus", type=GPUS, required=True, help="Total GPUs.")
@click.option("--global-batch-size", "--gbs", "global_batch_size", type=GLOBAL_BATCH, required=True,
              help="Sequences per iteration.")
@click.option("--tokens", type=TOKENS, default=None, help="Training tokens, for days (e.g. 300e9).")
@click.option("--top", type=BoundedInt(1, limits.MAX_TOP), default=5, show_default=True, help="Plans to list.")
@click.option("--rank-by", "rank_by", type=click.Choice(["upper", "point", "expected-days"]), default="upper",
              show_default=True,
              help="Order plans by the slow end of their band (the plan most likely to deliver: a plan outside every "
                   "measured regime, or faster than any measured run, pays for it), by the predicted time alone, or "
                   "by the expected days with failures, checkpoints and restarts (expected-days).")
@click.option("--tensor-model-parallel-size", "--tp", "tp", type=PARALLEL_SIZE, default=None, help="Pin TP.")
@click.option("--pipeline-model-parallel-size", "--pp", "pp", type=PARALLEL_SIZE, default=None, help="Pin PP.")
@click.option("--virtual-pipeline-model-parallel-size", "--vpp", "vpp", type=VIRTUAL_STAGES, default=None,
              help="Pin the virtual pipeline stages.")
@click.option("--micro-batch-size", "--mbs", "mbs", type=MICRO_BATCH, default=None, help="Pin the micro-batch.")
@click.option("--context-parallel-size", "--cp", "cp", type=PARALLEL_SIZE, default=None,
              help="Pin context parallelism (searched for sequences of 4,096 tokens and more by default).")
@click.option("--expert-model-parallel-size", "--ep", "ep", type=PARALLEL_SIZE, default=None,
              help="Mixture of experts: pin expert parallelism (must divide the experts).")
@click.option("--expert-tensor-parallel-size", "--etp", "etp", type=PARALLEL_SIZE, default=None,
              help="Mixture of experts: pin the expert tensor-parallel size.")
@click.option("--moe-load-imbalance", "moe_load_imbalance", type=LOAD_IMBALANCE, default=None, metavar="FLOAT",
              help="Mixture of experts: plan for the busiest expert rank getting this many times its balanced share "
                   "of tokens (>= 1; replaces the model's).")
@click.option("--fp8-format", "fp8", type=click.Choice(["hybrid", "e4m3"]), default=None,
              help="Every plan runs its linear layers in FP8 (Transformer Engine, Hopper only).")
@click.option("--sequence-parallel/--no-sequence-parallel", "--sp/--no-sp", "sp", default=None,
              help="Pin sequence parallelism on or off.")
@click.option("--recompute-granularity", "recompute", type=click.Choice([g.value for g in RecomputeGranularity]),
              default=None, help="Pin the recompute granularity.")
@click.option("--use-distributed-optimizer/--no-distributed-optimizer", "dopt", default=None,
              help="Pin the distributed optimizer on or off.")
@click.option("--precision", type=click.Choice([p.value for p in Precision]), default="bf16", show_default=True)
@click.option("--attention-backend", "backend", type=click.Choice(["auto", "flash", "fused", "unfused", "local"]),
              default="auto", show_default=True,
              help="Megatron's --attention-backend; auto, flash and fused use a fused kernel, unfused and local "
                   "Megatron's own path that keeps the s x s scores.")
@click.option("--use-flash-attn", "flash", is_flag=True, default=False,
              help="Older Megatron's flag for a fused kernel (the default already).")
@click.option("--overlap-grad-reduce", "overlap", is_flag=True, default=False,
              help="Plans overlap the DP gradient reduction with the backward pass.")
@click.option("--profile", "profile_path", default=None, metavar="FILE|NAME", help="Hardware profile.")
@click.option("--pareto", "pareto_path", type=OutputFile("Pareto figure", (".png", ".svg", ".pdf")), default=None,
              help="Save the throughput vs peak-memory scatter with its Pareto front (PNG, SVG or PDF by the suffix).")
@click.option("--trace", "trace_path", type=OutputFile("trace"), default=None,
              help="Write the best plan's iteration as a Chrome trace-event JSON (Perfetto).")
@click.option("--json", "as_json", is_flag=True, default=False, help="Print machine-readable JSON.")
@click.option("--all", "all_plans", is_flag=True, default=False,
              help="Also list every plan that fits with its closed-form time (JSON: screened_plans).")
@click.option("--csv", "csv_path", type=OutputFile("CSV table", (".csv",)), default=None,
              help="Write every plan that fits, with its screen time, MFU and peak memory, as CSV.")
@click.option("--plots", "plots_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Write the search's figures (PNG) into this folder: Pareto front, top plans' time breakdown, "
                   "TP x PP heat map, MFU and days vs GPUs, and the best plan's figures.")
@click.option("--html", "html_path", type=OutputFile("HTML page", (".html", ".htm")), default=None,
              help="Write an interactive HTML page (one offline file; needs the 'html' extra, plotly).")
@goodput_options
def search_command(model, seq_length, cluster, gpus, global_batch_size, tokens, top, tp, pp, vpp, mbs, cp, fp8, sp,
                   recompute, dopt,
                   precision, backend, flash, overlap, profile_path, pareto_path, trace_path, as_json, all_plans=False,
                   csv_path=None, plots_dir=None, html_path=None, ep=None, etp=None, moe_load_imbalance=None,
                   rank_by="upper", **goodput_flags):
    """Search every valid plan (TP, PP, virtual stages, micro-batch, SP, recompute, distributed optimizer)
    for the fastest that fits in GPU memory. For mixture-of-experts models MFU and days count the active
    parameters (the experts a token is routed to), not every expert."""
    from simulator.cost.profile import load_profile
    from simulator.outputs.describe import run_settings, settings_json
    from simulator.planner.plan_search import SearchRequest, search
    from simulator.spec._io import build
    from simulator.spec.catalog import load_model
    from simulator.spec.hardware import load_cluster
    from simulator.spec.hf import collected_notes
    from simulator.spec.plan import Job

    with collected_notes() as notes:
        model_spec = with_load_imbalance(load_model(model, seq_length), moe_load_imbalance)
    req = build(SearchRequest, dict(
        model=model_spec, cluster=load_cluster(cluster), num_gpus=gpus, global_batch_size=global_batch_size,
        pins=dict(tensor_parallel_size=tp, pipeline_parallel_size=pp, virtual_pipeline_stages=vpp,
                  micro_batch_size=mbs, sequence_parallel=sp, recompute_granularity=recompute,
                  use_distributed_optimizer=dopt, context_parallel_size=cp,
                  expert_model_parallel_size=ep, expert_tensor_parallel_size=etp),
        fp8_format=fp8, precision=precision, use_flash_attention=flash or backend not in ("unfused", "local"),
        # the backend as given, so the search's plans (and its launch) carry it as `plan`'s do
        attention_backend=None if flash else backend,
        overlap_grad_reduce=overlap, rank_by=rank_by, goodput=goodput_settings(goodput_flags),
    ), "search")
    check_pins(req, backend, flash)
    profile = load_profile(profile_path) if profile_path else None
    bars: dict = {}
    # a bar only for a person watching a terminal: never in a log, a pipe or the stream a test reads
    show_progress = not as_json and sys.stderr.isatty()

    def progress(phase: str, done: int, total: int) -> None:
        if not show_progress:
            return
        if phase not in bars:
            from tqdm import tqdm

            # shown only when the phase takes more than a moment
            bars[phase] = tqdm(total=total, desc=phase, unit="plan", leave=False, delay=0.5,
                               file=sys.stderr)
        bars[phase].update(done - bars[phase].n)

    # every finalist the engine simulates comes back ranked (it simulates them all whatever the top asked for), so
    # the plan --rank-by point would pick is named even when it is not among those listed
    result = search(req, profile, tokens=tokens, top=max(top, req.finalists), progress=progress)
    for bar in bars.values():
        bar.close()
    point_pick = rank_by_point_pick(result.plans, req)
    result = result.model_copy(update={"plans": result.plans[:top]})
    best = result.best
    job = Job(model=req.model, cluster=req.cluster, plan=best.plan)
    goodputs = _goodputs(req, result, tokens)
    interval = goodputs[0].save_interval if goodputs else req.goodput.save_interval
    if pareto_path is not None:
        from simulator.outputs.figure_data import pareto_data
        from simulator.outputs.plots import pareto_figure

        pareto_figure(pareto_data(result, req), pareto_path)
    if trace_path is not None:
        from simulator.estimator.prediction import simulate_job
        from simulator.outputs.trace import write_trace

        write_trace(simulate_job(job, profile, tokens, record=True), job, trace_path)
    rows = None
    if all_plans or csv_path is not None:
        from simulator.outputs.search_table import screened_rows, write_csv

        rows = screened_rows(result, req)
        if csv_path is not None:
            write_csv(rows, csv_path)
    plots = {}
    if plots_dir is not None:
        from simulator.outputs.figures import write_search_figures

        plots = write_search_figures(result, req, plots_dir, profile, tokens)
    if html_path is not None:
        from simulator.outputs.html_report import write_search_html

        write_search_html(result, req, html_path, profile)
    if as_json:
        doc = {
            "plans": [{**plan_json(Job.model_construct(model=req.model, cluster=req.cluster, plan=r.plan), r.estimate),
                       "rank": r.rank, "screen_time_s": r.screen_time_s, "within_band_of_best": r.within_band_of_best,
                       "iteration_time_s_low": r.iteration_time_s_low, "iteration_time_s_high": r.iteration_time_s_high,
                       "validation_regime": r.validation_regime,
                       "outside_regime_reasons": list(r.outside_regime_reasons), "rank_key_s": r.rank_key_s,
                       "band_from_runs": list(r.band_from_runs),
                       "goodput": goodputs[i].model_dump(mode="json") if goodputs else None}
                      for i, r in enumerate(result.plans)],
            "rank_by": req.rank_by.value, "rank_by_point_pick": _point_pick_json(point_pick, top),
            "mfu_attention_count": best.estimate.mfu_attention_count,
            "enumerated": result.enumerated, "pruned_memory": result.pruned_memory,
            "screened": len(result.screened), "simulated": result.simulated, "elapsed_s": result.elapsed_s,
            **launch_json(job, interval, req.goodput.async_save),
            "model": req.model.name, "cluster": req.cluster.name, "num_gpus": gpus,
            "global_batch_size": global_batch_size, **settings_json(req.model, best.plan), "notes": notes,
        }
        if all_plans:
            doc["screened_plans"] = rows
        for key, value in (("csv", csv_path), ("html", html_path)):
            if value is not None:
                doc[key] = str(value)
        if plots:
            doc["plots"] = plots
        click.echo(json.dumps(doc, indent=2, sort_keys=True, allow_nan=False))
        return
    click.echo(f"{req.model.name} on {gpus} x {req.cluster.gpu.name}, global batch {global_batch_size}, "
               f"{run_settings(req.model.seq_length, best.plan)}: "
               f"{result.enumerated} plans enumerated, {result.pruned_memory} pruned (memory), "
               f"{len(result.screened)} screened, {result.simulated} simulated in {result.elapsed_s:.1f} s")
    for note in notes:
        click.echo(f"note: {note}")
    if req.model.is_moe:
        click.echo(experts_line(req.model))
    click.echo("")
    header = (f"{'#':>2}  {'plan':44s} {'iter (s)':>9} {'band (s)':>13} {'MFU':>6} {'peak GiB':>9}"
              + (f" {'days':>7}" if tokens else "") + (f" {'expected':>9}" if goodputs else ""))
    click.echo(header)
    for r, g in zip(result.plans, goodputs or [None] * len(result.plans)):
        e = r.estimate
        band = f"{r.iteration_time_s_low:.2f}-{r.iteration_time_s_high:.2f}" if r.iteration_time_s_low else ""
        row = (f"{r.rank:2d}  {_describe(r.plan):44s} {e.iteration_time_s:9.2f} {band:>13} {e.mfu * 100:5.1f}% "
               f"{format_gib(e.memory.peak_bytes, 1):>9}")
        if tokens:
            row += f" {e.training_days:7.1f}" + (f" {g.expected_days:9.1f}" if g is not None else "")
        marks = ("=" if r.within_band_of_best else "") + ("!" if e.outside_validated_range else "")
        click.echo(row + (f"  {marks}" if marks else ""))
    if any(r.within_band_of_best for r in result.plans):
        click.echo("= the lead of the best plan over this one flips at a corner of the band: "
                   "the profile cannot tell them apart")
    outside = [r for r in result.plans if r.estimate.outside_validated_range]
    if outside:
        click.echo(f"! {outside[0].estimate.validation_note}")
    click.echo(f"MFU counts attention {best.estimate.mfu_attention_count}, as Megatron reports it (a causal flash "
               "kernel runs about half of that product)")
    click.echo("ranked by " + {"upper": "the slow end of each plan's band (--rank-by point: by the time alone)",
                               "point": "the predicted time (--rank-by upper: by the band's slow end)",
                               "expected-days": "the expected days with failures, checkpoints and restarts (the "
                                                "iteration time over the run's ETTR)"}[req.rank_by.value])
    if point_pick is not None:
        click.echo(_point_pick_line(point_pick, best, top, req.rank_by.value))
    if goodputs:
        click.echo("expected: days with failures, checkpoints and restarts; the best plan's:"
                   + "\n".join(render_goodput(goodputs[0])))
    if best.band_from_runs:
        click.echo("the best plan's band: " + band_origin(best.validation_regime, best.outside_regime_reasons,
                                                          best.band_from_runs))
    elif best.validation_regime is not None:
        click.echo(f"the best plan lies in a measured regime: {best.validation_regime}")
    else:
        click.echo("the best plan lies outside every measured regime, so its band is widened: "
                   + "; ".join(best.outside_regime_reasons))
    click.echo(render_launch_text(job, interval, req.goodput.async_save).replace("Megatron-LM launch:", "Megatron-LM launch for the best plan:"))
    if all_plans:
        click.echo(f"\nEvery plan that fits ({len(rows)}), by closed-form screen time:")
        click.echo(f"{'#':>5}  {'plan':44s} {'screen (s)':>10} {'MFU':>6} {'peak GiB':>9}")
        for r, screened in zip(rows, result.screened):
            click.echo(f"{r['rank']:5d}  {_describe(screened.plan):44s} {r['screen_time_s']:10.2f} "
                       f"{r['screen_mfu'] * 100:5.1f}% {format_gib(r['peak_memory_bytes'], 1):>9}")
    if csv_path is not None:
        click.echo(f"every plan that fits written to {csv_path}")
    if plots:
        click.echo(f"figures written to {plots_dir}: {', '.join(plots)}")
    if html_path is not None:
        click.echo(f"interactive page written to {html_path}")
    if pareto_path is not None:
        click.echo(f"Pareto figure written to {pareto_path}")
    if trace_path is not None:
        click.echo(f"trace of the best plan written to {trace_path} (open it in https://ui.perfetto.dev)")
