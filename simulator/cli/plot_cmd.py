"""`simulator plot KIND`: one figure of a plan, of a search, or of the validation data, as a PNG."""

from __future__ import annotations

import json
from pathlib import Path

import click

from simulator.cli.options import TOKENS, OutputFile, plan_options
from simulator.outputs.figures import KINDS, PLAN_KINDS, SEARCH_KINDS
from simulator.outputs.plots_base import FIGURE_SUFFIXES

EXAMPLES = """
\b
Figures of one plan (the plan flags as for `simulator plan`):
  simulator plot timeline --gpus 1024 --tp 8 --pp 16 --vpp 2 --sp --gbs 1536 --steps 100:130
  simulator plot stage-memory --gpus 1024 --tp 8 --pp 16 --sp --recompute-granularity selective --gbs 1536
  simulator plot memory-vs-micro-batch --gpus 1024 --tp 8 --pp 16 --sp --gbs 1536
  simulator plot memory-breakdown --model megatron-22b --tp 8 --mbs 4 --gbs 4
\b
Figures of a search (plan flags given on the command line pin that dimension):
  simulator plot pareto --gpus 1024 --gbs 1536 --out pareto.png
  simulator plot time-breakdown --gpus 1024 --gbs 1536 --top 8
  simulator plot tp-pp-heatmap --gpus 1024 --gbs 1536 --sp
  simulator plot days-vs-gpus --gpus 1024 --gbs 1536 --tokens 300e9 --gpu-counts 256,512,1024,2048
  simulator plot mfu-vs-gpus --model llama3-70b --cluster dgx-h100 --gpus 512 --gbs 1024
\b
Predicted vs measured for every validation data set in the repository:
  simulator plot parity
"""

# plan flags that pin a search dimension when given on the command line
_PINS = {"tensor_parallel_size": "tensor_parallel_size", "pipeline_parallel_size": "pipeline_parallel_size",
         "virtual_pipeline_stages": "virtual_pipeline_stages", "micro_batch_size": "micro_batch_size",
         "sequence_parallel": "sequence_parallel", "recompute_granularity": "recompute_granularity",
         "use_distributed_optimizer": "use_distributed_optimizer", "context_parallel_size": "context_parallel_size",
         "expert_model_parallel_size": "expert_model_parallel_size",
         "expert_tensor_parallel_size": "expert_tensor_parallel_size"}


def _steps(value: str | None) -> tuple[int, int] | None:
    if value is None:
        return None
    try:
        a, b = (int(x) for x in value.split(":"))
    except ValueError:
        raise click.BadParameter(f"{value!r} is not A:B with whole numbers, e.g. 100:130", param_hint="--steps") from None
    if not 0 <= a < b:
        raise click.BadParameter(f"{value!r} needs 0 <= A < B", param_hint="--steps")
    return a, b


def _counts(value: str | None) -> list[int] | None:
    if value is None:
        return None
    try:
        counts = [int(x) for x in value.split(",") if x.strip()]
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a comma-separated list of GPU counts", param_hint="--gpu-counts") from None
    if not counts or min(counts) < 1:
        raise click.BadParameter(f"{value!r} needs at least one positive GPU count", param_hint="--gpu-counts")
    return sorted(set(counts))


def _search(ctx: click.Context, options: dict, top: int, profile):
    from simulator.planner.plan_search import SearchPins, SearchRequest, search
    from simulator.spec.catalog import load_model
    from simulator.spec.hardware import load_cluster

    for flag, key in (("--gpus", "gpus"), ("--global-batch-size", "global_batch_size")):
        if options.get(key) is None:
            raise click.UsageError(f"a search figure needs {flag}")
    given = {k: options[k] for k in _PINS if ctx.get_parameter_source(k) is click.core.ParameterSource.COMMANDLINE}
    req = SearchRequest(model=load_model(options["model"], options["seq_length"]), cluster=load_cluster(options["cluster"]),
                        num_gpus=options["gpus"], global_batch_size=options["global_batch_size"],
                        pins=SearchPins(**{_PINS[k]: v for k, v in given.items()}), precision=options["precision"],
                        use_flash_attention=bool(options.get("use_flash_attention"))
                        or options.get("attention_backend") not in ("unfused", "local"),
                        attention_backend=None if options.get("use_flash_attention") else options.get("attention_backend"),
                        overlap_grad_reduce=options["overlap_grad_reduce"], fp8_format=options.get("fp8_format"))
    return req, search(req, profile, top=top)


@click.command("plot", epilog=EXAMPLES)
@click.argument("kind", type=click.Choice(KINDS))
@plan_options
@click.option("--out", "out", type=OutputFile("figure"), default=None,
              help="Figure file to write, in the format its suffix names (PNG, SVG, PDF, ...; default: KIND.png).")
@click.option("--tokens", type=TOKENS, default=None, help="Training tokens, for days (days-vs-gpus needs it).")
@click.option("--profile", "profile_path", default=None, metavar="FILE|NAME", help="Hardware profile.")
@click.option("--steps", default=None, metavar="A:B", help="timeline: zoom to steps A to B-1 of each stage.")
@click.option("--gpu-counts", default=None, metavar="N,N,...",
              help="days-vs-gpus, mfu-vs-gpus: GPU counts (default: a quarter to four times --gpus).")
@click.option("--top", type=click.IntRange(min=1), default=5, show_default=True,
              help="Search figures: plans the engine ranks (time-breakdown shows them).")
@click.pass_context
def plot_command(ctx, kind, out, tokens, profile_path, steps, gpu_counts, top, as_json, **options):
    """Draw one figure (PNG): a plan's pipeline timeline, stage memory, memory against micro-batch or
    by strategy, or time breakdown; a search's Pareto front, top plans' time breakdown, TP x PP heat map,
    MFU or days against GPU count; or predicted against measured for every validation data set."""
    from simulator.cli.options import job_from_options
    from simulator.cost.profile import load_profile
    from simulator.outputs import figures
    from simulator.outputs.describe import settings_json
    from simulator.outputs.figure_data import plan_settings
    from simulator.spec.hf import collected_notes

    if out is not None and out.suffix and out.suffix.lower() not in FIGURE_SUFFIXES:
        kinds = ", ".join(x.lstrip(".").upper() for x in FIGURE_SUFFIXES)
        raise click.BadParameter(f"{str(out)!r} ends in {out.suffix!r}, which names no figure format; the figure is "
                                 f"written as the suffix says ({kinds}), so name it like {out.stem or kind}.png",
                                 param_hint="'--out'")
    window, counts = _steps(steps), _counts(gpu_counts)
    if kind == "days-vs-gpus" and tokens is None:
        raise click.UsageError("days-vs-gpus needs --tokens (e.g. 300e9)")
    profile = load_profile(profile_path) if profile_path else None
    out = out if out is not None else Path(f"{kind}.png")
    with collected_notes() as notes:
        if kind == "parity":
            data, settings = figures.plan_data(kind, None, profile=profile), {}
        elif kind in SEARCH_KINDS and not (kind in PLAN_KINDS and options.get("gpus") is None):
            req, result = _search(ctx, options, top, profile)
            data = figures.search_data(kind, result, req, profile, tokens, counts)
            settings = {"model": req.model.name, "cluster": req.cluster.name, "num_gpus": req.num_gpus,
                        "global_batch_size": req.global_batch_size, **settings_json(req.model, result.best.plan)}
        else:
            job = job_from_options(**options)
            data = figures.plan_data(kind, job, profile=profile, steps=window)
            settings = plan_settings(job)
    summary = figures.draw(kind, data, out)
    if as_json:
        shown = {k: v for k, v in data.items() if k != "intervals"}  # the timeline's raw intervals stay out
        click.echo(json.dumps({"kind": kind, "path": str(out), **settings, "figure": summary, "data": shown,
                               "notes": notes}, indent=2, sort_keys=True))
        return
    click.echo(f"{kind} written to {out}: {summary['title'] or summary['axes'][0]['title']}".replace("\n", "; "))
    for note in notes:
        click.echo(f"note: {note}")
