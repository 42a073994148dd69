"""`simulator search`: the fastest plan that fits, with the Pareto figure and the flags to run it."""

from __future__ import annotations

import json
import sys

import click

from simulator import limits
from simulator.cli.options import (
    GLOBAL_BATCH,
    GPUS,
    MICRO_BATCH,
    PARALLEL_SIZE,
    SEQ_LENGTH,
    TOKENS,
    VIRTUAL_STAGES,
    BoundedInt,
    OutputFile,
    data_parallel_size,
)
from simulator.cli.plan_cmd import plan_json
from simulator.plan import Precision, RecomputeGranularity
from simulator.units import format_gib

EXAMPLES = """
\b
Examples:
  simulator search --model gpt3-175b --gpus 1024 --gbs 1536 --tokens 300e9
  simulator search --gpus 1024 --gbs 1536 --tp 8 --no-sp --recompute-granularity full   # pin dimensions
  simulator search --model megatron-22b --gpus 64 --gbs 256 --json --top 3
"""


def _describe(plan) -> str:
    r = plan.recompute
    rec = r.granularity.value
    if r.granularity is RecomputeGranularity.full:
        rec += f"/{r.method.value}:{r.num_layers}"
    return (f"TP{plan.tensor_parallel_size} PP{plan.pipeline_parallel_size}"
            + (f"x{plan.virtual_pipeline_stages}" if plan.interleaved else "")
            + f" DP{plan.data_parallel_size} mbs{plan.micro_batch_size} SP{'+' if plan.sequence_parallel else '-'} "
            + f"{rec}{' distopt' if plan.use_distributed_optimizer else ''}")


def check_pins(req) -> None:
    """Refuse a pinned dimension that breaks a rule on its own, with the sentence `simulator plan` gives.

    The search only tries values the rules allow, so without this a pin such as --tp 3 against a
    vocabulary of 51,200 would end in "no plan satisfies the rules" without saying which rule.
    """
    from simulator._io import build
    from simulator.plan import Job, ParallelPlan

    pins = req.pins
    tp, pp = pins.tensor_parallel_size or 1, pins.pipeline_parallel_size or 1
    data_parallel_size(req.num_gpus, tp, pp, None)
    vpp = pins.virtual_pipeline_stages if pins.pipeline_parallel_size is not None else None
    probe = build(ParallelPlan, {
        "tensor_parallel_size": tp, "pipeline_parallel_size": pp, "virtual_pipeline_stages": vpp or 1,
        "sequence_parallel": bool(pins.sequence_parallel) and pins.tensor_parallel_size is not None,
        "global_batch_size": pp, "precision": req.precision,  # pp micro-batches: what interleaving needs
    }, "pinned plan")
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
@click.option("--tensor-model-parallel-size", "--tp", "tp", type=PARALLEL_SIZE, default=None, help="Pin TP.")
@click.option("--pipeline-model-parallel-size", "--pp", "pp", type=PARALLEL_SIZE, default=None, help="Pin PP.")
@click.option("--virtual-pipeline-model-parallel-size", "--vpp", "vpp", type=VIRTUAL_STAGES, default=None,
              help="Pin the virtual pipeline stages.")
@click.option("--micro-batch-size", "--mbs", "mbs", type=MICRO_BATCH, default=None, help="Pin the micro-batch.")
@click.option("--sequence-parallel/--no-sequence-parallel", "--sp/--no-sp", "sp", default=None,
              help="Pin sequence parallelism on or off.")
@click.option("--recompute-granularity", "recompute", type=click.Choice([g.value for g in RecomputeGranularity]),
              default=None, help="Pin the recompute granularity.")
@click.option("--use-distributed-optimizer/--no-distributed-optimizer", "dopt", default=None,
              help="Pin the distributed optimizer on or off.")
@click.option("--precision", type=click.Choice([p.value for p in Precision]), default="bf16", show_default=True)
@click.option("--use-flash-attn", "flash", is_flag=True, default=False, help="Plans use fused attention.")
@click.option("--overlap-grad-reduce", "overlap", is_flag=True, default=False,
              help="Plans overlap the DP gradient reduction with the backward pass.")
@click.option("--profile", "profile_path", default=None, metavar="FILE|NAME", help="Hardware profile.")
@click.option("--pareto", "pareto_path", type=OutputFile("Pareto figure", (".png", ".svg", ".pdf")), default=None,
              help="Save the throughput vs peak-memory scatter with its Pareto front (PNG, SVG or PDF by the suffix).")
@click.option("--trace", "trace_path", type=OutputFile("trace"), default=None,
              help="Write the best plan's iteration as a Chrome trace-event JSON (Perfetto).")
@click.option("--json", "as_json", is_flag=True, default=False, help="Print machine-readable JSON.")
def search_command(model, seq_length, cluster, gpus, global_batch_size, tokens, top, tp, pp, vpp, mbs, sp, recompute, dopt,
                   precision, flash, overlap, profile_path, pareto_path, trace_path, as_json):
    """Search every valid plan (TP, PP, virtual stages, micro-batch, SP, recompute, distributed optimizer)
    for the fastest that fits in GPU memory."""
    from simulator._io import build
    from simulator.export import megatron_args, nemo_yaml
    from simulator.hardware import load_cluster
    from simulator.model import load_model
    from simulator.plan import Job
    from simulator.profile import load_profile
    from simulator.search import SearchPins, SearchRequest, search

    req = build(SearchRequest, dict(
        model=load_model(model, seq_length), cluster=load_cluster(cluster), num_gpus=gpus, global_batch_size=global_batch_size,
        pins=SearchPins(tensor_parallel_size=tp, pipeline_parallel_size=pp, virtual_pipeline_stages=vpp,
                        micro_batch_size=mbs, sequence_parallel=sp, recompute_granularity=recompute,
                        use_distributed_optimizer=dopt),
        precision=precision, use_flash_attention=flash, overlap_grad_reduce=overlap,
    ), "search")
    check_pins(req)
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

    result = search(req, profile, tokens=tokens, top=top, progress=progress)
    for bar in bars.values():
        bar.close()
    best = result.best
    job = Job(model=req.model, cluster=req.cluster, plan=best.plan)
    if pareto_path is not None:
        from simulator.plots import pareto_figure

        pareto_figure(result, req.cluster.gpu.memory_bytes,
                      f"{req.model.name}, {gpus} x {req.cluster.gpu.name}, global batch {global_batch_size}", pareto_path)
    if trace_path is not None:
        from simulator.estimate import simulate_job
        from simulator.trace import write_trace

        write_trace(simulate_job(job, profile, tokens, record=True), job, trace_path)
    if as_json:
        doc = {
            "plans": [{"rank": r.rank, "screen_time_s": r.screen_time_s,
                       **plan_json(Job.model_construct(model=req.model, cluster=req.cluster, plan=r.plan), r.estimate)}
                      for r in result.plans],
            "enumerated": result.enumerated, "pruned_memory": result.pruned_memory,
            "screened": len(result.screened), "simulated": result.simulated, "elapsed_s": result.elapsed_s,
            "megatron_args": megatron_args(job), "nemo_yaml": nemo_yaml(job),
        }
        click.echo(json.dumps(doc, indent=2, sort_keys=True, allow_nan=False))
        return
    click.echo(f"{req.model.name} on {gpus} x {req.cluster.gpu.name}, global batch {global_batch_size}: "
               f"{result.enumerated} plans enumerated, {result.pruned_memory} pruned (memory), "
               f"{len(result.screened)} screened, {result.simulated} simulated in {result.elapsed_s:.1f} s\n")
    header = f"{'#':>2}  {'plan':44s} {'iter (s)':>9} {'MFU':>6} {'peak GiB':>9}" + (f" {'days':>7}" if tokens else "")
    click.echo(header)
    for r in result.plans:
        e = r.estimate
        row = (f"{r.rank:2d}  {_describe(r.plan):44s} {e.iteration_time_s:9.2f} {e.mfu * 100:5.1f}% "
               f"{format_gib(e.memory.peak_bytes, 1):>9}")
        if tokens:
            row += f" {e.training_days:7.1f}"
        click.echo(row)
    click.echo("\nMegatron-LM flags for the best plan:\n  " + " \\\n  ".join(megatron_args(job)))
    click.echo("\nNeMo config fragment:\n" + nemo_yaml(job))
    if pareto_path is not None:
        click.echo(f"Pareto figure written to {pareto_path}")
    if trace_path is not None:
        click.echo(f"trace of the best plan written to {trace_path} (open it in https://ui.perfetto.dev)")
