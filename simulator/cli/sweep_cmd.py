"""`simulator sweep`: a grid of searches (models x GPU counts x batches x clusters x sequence lengths)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from simulator.cli.progress import terminal_progress

EXAMPLES = """
\b
Examples:
  simulator sweep study.yaml --out study/            # local processes, resumable
  simulator sweep study.yaml --out study/ --ray-address local
  simulator sweep study.yaml --out study/ --ray-address ray://head:10001

\b
study.yaml:
  models: [gpt3-175b, llama3-70b]
  gpus: [256, 512, 1024]
  global_batch_sizes: [1536]
  clusters: [dgx-a100-80gb]
  tokens: 300e9
"""


@click.command("sweep", epilog=EXAMPLES)
@click.argument("spec_path", metavar="SPEC.yaml", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--out", "out", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="Folder for results.csv, results.json (results.parquet with pyarrow) and figures/; points "
                   "already there are skipped.")
@click.option("--ray-address", "ray_address", default=None, metavar="ADDR",
              help="Run the points on a Ray cluster (`local` starts one on this machine); default: local processes.")
@click.option("--workers", type=click.IntRange(min=1), default=None,
              help="Parallel searches (default: one per CPU core).")
@click.option("--json", "as_json", is_flag=True, default=False, help="Print the rows as JSON.")
def sweep_command(spec_path, out, ray_address, workers, as_json):
    """One search per point of a grid, as a table (CSV, JSON) and figures (days and MFU vs GPUs)."""
    from simulator.planner.sweep import load_spec, run_sweep, sweep_figures

    spec = load_spec(spec_path)
    with terminal_progress("sweep", "point", quiet=as_json) as progress:
        rows = run_sweep(spec, out, ray_address=ray_address, workers=workers, progress=progress)
    figures = sweep_figures(rows, out)
    if as_json:
        click.echo(json.dumps(rows, indent=2, sort_keys=True))
        return
    ok = [r for r in rows if r["status"] == "ok"]
    click.echo(f"{len(rows)} points, {len(ok)} with a plan; table in {out / 'results.csv'}")
    for r in rows:
        what = (f"{r['plan']:40s} {r['iteration_time_s']:8.2f} s  MFU {r['mfu'] * 100:5.1f}%"
                + (f"  {r['training_days']:7.1f} days" if r.get("training_days") else "")
                + (f", {r['expected_days']:.1f} expected (ETTR {r['ettr'] * 100:.1f} %)" if r.get("expected_days")
                   else "")
                if r["status"] == "ok" else r["message"])
        click.echo(f"  {r['model']} {r['cluster']} {r['gpus']:>6} GPUs batch {r['global_batch_size']}: {what}")
    for f in figures:
        click.echo(f"figure: {f}")
