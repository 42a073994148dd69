"""`simulator capacity`: which GPUs, how many, which plan, and what it costs to train by a date or within a budget."""

from __future__ import annotations

import json
import math
import os

import click

from simulator.cli.goodput_options import goodput_options, goodput_settings
from simulator.cli.options import GLOBAL_BATCH, GPUS, SEQ_LENGTH, TOKENS, BoundedFloat, BoundedInt, OutputFile
from simulator.cli.progress import terminal_progress
from simulator.spec.errors import ConfigError

EXAMPLES = """
\b
Examples:
  simulator capacity --model gpt3-175b --tokens 300e9 --gbs 1536 \\
      --clusters dgx-a100-80gb,dgx-h100,dgx-h200 --deadline-days 30
  simulator capacity --tokens 300e9 --gbs 1536 --clusters dgx-h100 --budget 2e6 --confidence P50
  simulator capacity --tokens 300e9 --gbs 1536 --clusters dgx-h100,dgx-h200 --gpus 256,512,1024 --csv options.csv
  simulator capacity --tokens 300e9 --gbs 1536 --clusters dgx-a100-80gb,dgx-h100 --deadline-days 30 \\
      --html capacity.html
  simulator capacity --tokens 300e9 --gbs 1536 --clusters dgx-h100,dgx-a100-80gb --deadline-days 30 \\
      --price-per-gpu-hour dgx-h100=2.5 --price-per-gpu-hour dgx-a100-80gb=1.4
"""


def split_list(text: str, flag: str, example: str) -> list[str]:
    """A comma-separated list, none of its entries empty."""
    items = [x.strip() for x in text.split(",")]
    if not any(items):
        raise ConfigError(f"{flag} names nothing; give one or more, separated by commas, such as {example}")
    empty = next((i for i, x in enumerate(items) if not x), None)
    if empty is not None:
        raise ConfigError(f"{flag} {text!r} has an empty entry (entry {empty + 1}); remove the extra comma")
    return items


def _price(text: str, flag: str) -> float:
    from simulator.planner.capacity import MAX_PRICE_PER_GPU_HOUR_USD

    try:
        x = float(text)
    except ValueError:
        x = math.nan
    if not math.isfinite(x) or not 0 < x <= MAX_PRICE_PER_GPU_HOUR_USD:
        raise ConfigError(f"{flag} {text!r} is not a price; give US dollars per GPU-hour, more than 0 and at most "
                          f"{MAX_PRICE_PER_GPU_HOUR_USD:g}, such as 2.5 or dgx-h100=2.5")
    return x


def price_overrides(values: tuple[str, ...], clusters: list[str]) -> dict[str, float]:
    """``--price-per-gpu-hour`` as given: PRICE for every cluster, or NAME=PRICE for one (a later one wins)."""
    out: dict[str, float] = {}
    for value in values:
        for item in split_list(value, "--price-per-gpu-hour", "2.5 or dgx-h100=2.5"):
            name, sep, price = item.rpartition("=")
            if not sep:
                out.update({c: _price(item, "--price-per-gpu-hour") for c in clusters})
                continue
            if name.strip() not in clusters:
                raise ConfigError(f"--price-per-gpu-hour {item!r} names cluster {name.strip()!r}, which --clusters "
                                  f"does not; use one of {', '.join(clusters)}")
            out[name.strip()] = _price(price.strip(), "--price-per-gpu-hour")
    return out


def gpu_counts(text: str | None) -> tuple[int, ...] | None:
    if text is None:
        return None
    out = []
    for item in split_list(text, "--gpus", "256,512,1024"):
        try:
            out.append(GPUS.convert(item, None, None))
        except click.BadParameter as exc:
            raise ConfigError(f"--gpus {item!r}: {exc.format_message()}") from None
    return tuple(out)


CSV_COLUMNS = ("cluster", "gpus", "nodes", "status", "plan_name", "iteration_time_s", "iteration_time_s_low",
               "iteration_time_s_high", "mfu", "ideal_days", "expected_days", "ettr", "save_interval", "days_p10",
               "days_p50", "days_p90", "days", "price_per_gpu_hour_usd", "gpu_hours", "gpu_hours_low",
               "gpu_hours_high", "cost_usd", "cost_usd_low", "cost_usd_high", "energy_mwh", "energy_mwh_low",
               "energy_mwh_high", "tco2e", "tco2e_low", "tco2e_high", "on_frontier", "refined", "answer", "message")


def csv_rows(result) -> list[dict]:
    from simulator.outputs.capacity_text import is_answer

    rows = []
    for o in result.options:
        row = o.model_dump(mode="json", exclude={"plan", "gpu_hours", "cost_usd", "energy_mwh", "tco2e"})
        for name in ("gpu_hours", "cost_usd", "energy_mwh", "tco2e"):
            f = getattr(o, name)
            row.update({name: f and f.value, f"{name}_low": f and f.low, f"{name}_high": f and f.high})
        row["answer"] = is_answer(result, o)
        rows.append(row)
    return rows


def render_csv(result) -> str:
    from simulator.planner.sweep import _csv_cell

    lines = [",".join(CSV_COLUMNS)]
    lines += [",".join(_csv_cell(r.get(c)) for c in CSV_COLUMNS) for r in csv_rows(result)]
    return "\n".join(lines) + "\n"


@click.command("capacity", epilog=EXAMPLES)
@click.option("--model", default="gpt3-175b", show_default=True, metavar="NAME|FILE", help="Model preset or file.")
@click.option("--seq-length", "seq_length", type=SEQ_LENGTH, default=None,
              help="Override the model's sequence length (tokens).")
@click.option("--tokens", type=TOKENS, required=True, help="Training tokens (e.g. 300e9).")
@click.option("--global-batch-size", "--gbs", "global_batch_size", type=GLOBAL_BATCH, required=True,
              help="Sequences per iteration.")
@click.option("--clusters", "clusters_text", required=True, metavar="NAME|FILE,...",
              help="Cluster kinds to compare: presets (see `simulator clusters`) or files, separated by commas.")
@click.option("--gpus", "gpus_text", default=None, metavar="N,...",
              help="The GPU counts to search, whole nodes, separated by commas (default: powers of two of nodes in "
                   "--gpus-min..--gpus-max).")
@click.option("--gpus-min", "gpus_min", type=GPUS, default=None,
              help="Fewest GPUs to consider. Default: the memory floor (16 bytes per parameter over the GPUs).")
@click.option("--gpus-max", "gpus_max", type=GPUS, default=None, help="Most GPUs to consider. Default: 128 times "
                                                                       "the fewest.")
@click.option("--deadline-days", "deadline_days", type=BoundedFloat(0, 36_500), default=None, metavar="DAYS",
              help="Goal: the cheapest option that finishes within DAYS at --confidence.")
@click.option("--budget", "budget_usd", type=BoundedFloat(0, 1e15), default=None, metavar="USD",
              help="Goal: the fastest option that costs at most USD at --confidence. With neither goal: the frontier.")
@click.option("--confidence", type=click.Choice(["P50", "P90"]), default="P90", show_default=True,
              help="Judge options by the days half (P50) or nine in ten (P90) of runs finish within.")
@click.option("--price-per-gpu-hour", "prices", multiple=True, metavar="[NAME=]USD",
              help="Price per GPU-hour for every cluster, or NAME=USD for one (repeatable); replaces the declared "
                   "price and its range.")
@click.option("--pue", type=BoundedFloat(1, 10, closed=True), default=None, help="The facility's PUE (replaces "
                                                                                   "the declared 1.2).")
@click.option("--grid-kg-co2e-per-kwh", "grid_kg_co2e_per_kwh", type=BoundedFloat(0, 10, closed=True), default=None,
              metavar="KG", help="Carbon intensity of the grid (replaces the declared 0.4).")
@click.option("--economics", "economics_path", default=None, metavar="NAME|FILE",
              help="Prices and power per GPU kind and the site's PUE and carbon (default: hardware_specs/economics/"
                   "default.yaml).")
@click.option("--refine", type=BoundedInt(0, 10), default=2, show_default=True,
              help="Bisection steps, in whole nodes, between the counts either side of the goal's boundary (under a "
                   "deadline, not for a cluster whose options there both cost a quarter more than the best).")
@click.option("--every-count", "every_count", is_flag=True, default=False,
              help="Search every count of the range, not only where the goal's boundary lies.")
@click.option("--samples", type=BoundedInt(10, 100_000), default=1000, show_default=True,
              help="Joint samples of each option's days.")
@click.option("--finalists", type=BoundedInt(1, 1000), default=4, show_default=True,
              help="Plans each search simulates after its closed-form screen; `search` simulates 16, for the plan of "
                   "one count in detail.")
@click.option("--workers", type=BoundedInt(1, 1024), default=None,
              help="Parallel searches (default: one per cluster kind, at most two per CPU core).")
@click.option("--ray-address", "ray_address", default=None, metavar="ADDR",
              help="Run the searches on a Ray cluster (`local` starts one on this machine), as `sweep` does.")
@click.option("--csv", "csv_path", type=OutputFile("CSV table", (".csv",)), default=None,
              help="Write every option searched as CSV.")
@click.option("--plot", "plot_path", type=OutputFile("capacity figure", (".png", ".svg", ".pdf")), default=None,
              help="Draw days against GPUs per cluster kind with the deadline, and cost against days with the "
                   "frontier (PNG, SVG or PDF by the suffix).")
@click.option("--html", "html_path", type=OutputFile("HTML page", (".html", ".htm")), default=None,
              help="Write the answer, both charts (interactive) and every option as one offline page (needs the "
                   "'html' extra, plotly).")
@click.option("--json", "as_json", is_flag=True, default=False, help="Print machine-readable JSON.")
@goodput_options
def capacity_command(model, seq_length, tokens, global_batch_size, clusters_text, gpus_text, gpus_min, gpus_max,
                     deadline_days, budget_usd, confidence, prices, pue, grid_kg_co2e_per_kwh, economics_path, refine,
                     every_count, samples, finalists, workers, ray_address, csv_path, as_json, plot_path=None,
                     html_path=None, **goodput_flags):
    """Which cluster, how many GPUs and which plan train the model on the tokens by a deadline (the cheapest) or
    within a budget (the fastest), with GPU-hours, cost, energy and emissions, each with its band; with neither
    goal, the frontier of days against cost."""
    from simulator.planner import plan_search  # noqa: F401 - imported once here, shared by every worker forked
    from simulator.planner.capacity import CapacityRequest, answer_job, plan_capacity
    from simulator.spec._io import build, write_output
    from simulator.spec.catalog import load_model
    from simulator.spec.economics import economics_for, load_economics
    from simulator.spec.hardware import load_cluster

    if html_path is not None:
        from simulator.outputs.html_report import plotly_js

        plotly_js()  # without plotly, one sentence before minutes of searching, not after
    names = split_list(clusters_text, "--clusters", "dgx-a100-80gb,dgx-h100")
    clusters = [load_cluster(n) for n in names]
    data = load_economics(economics_path or "default")
    price = price_overrides(prices, [c.name for c in clusters])
    economics = [economics_for(c, data, price.get(c.name), pue, grid_kg_co2e_per_kwh) for c in clusters]
    req = build(CapacityRequest, dict(
        model=load_model(model, seq_length), clusters=tuple(clusters), economics=tuple(economics), tokens=tokens,
        global_batch_size=global_batch_size, gpus=gpu_counts(gpus_text), gpus_min=gpus_min, gpus_max=gpus_max,
        deadline_days=deadline_days, budget_usd=budget_usd, confidence=confidence, refine=refine,
        every_count=every_count, goodput=goodput_settings(goodput_flags), samples=samples,
        finalists=finalists), "capacity")
    workers = workers or max(1, min(len(clusters), 2 * (os.cpu_count() or 1)))
    with terminal_progress("capacity", "search", quiet=as_json) as progress:
        result = plan_capacity(req, workers=workers, ray_address=ray_address, progress=progress)
    if csv_path is not None:
        write_output(csv_path, render_csv(result), "CSV table")
    if plot_path is not None:
        from simulator.outputs.plots_capacity import capacity_figure

        capacity_figure(result, plot_path)
    if html_path is not None:
        from simulator.outputs.html_capacity import write_capacity_html

        write_capacity_html(req, result, economics, html_path)
    answer = result.answer
    job = answer_job(req, result)
    if as_json:
        from simulator.cli.plan_cmd import launch_json

        doc = {"model": req.model.name, "tokens": req.tokens, "global_batch_size": req.global_batch_size,
               **result.model_dump(mode="json"), "economics": [e.model_dump(mode="json") for e in economics],
               "samples": req.samples}
        if job is not None:
            doc["launch"] = launch_json(job, answer.save_interval, req.goodput.async_save)
        for key, value in (("csv", csv_path), ("plot", plot_path), ("html", html_path)):
            if value is not None:
                doc[key] = str(value)
        click.echo(json.dumps(doc, indent=2, sort_keys=True, allow_nan=False))
        return
    from simulator.outputs.capacity_text import render_text

    for line in render_text(req, result, economics):
        click.echo(line)
    if job is not None:
        from simulator.cli.plan_cmd import render_launch_text

        click.echo(render_launch_text(job, answer.save_interval, req.goodput.async_save)
                   .replace("Megatron-LM launch:", "Megatron-LM launch for the answer:"))
    if csv_path is not None:
        click.echo(f"every option written to {csv_path}")
    if plot_path is not None:
        click.echo(f"figure written to {plot_path}")
    if html_path is not None:
        click.echo(f"interactive page written to {html_path}")
