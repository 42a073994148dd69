"""``simulator clusters``: the cluster presets (nodes of GPUs, NVLink, NICs) as a table or JSON."""

from __future__ import annotations

import json
from typing import Any

import click

from simulator.cost.profile import profile_names
from simulator.spec.hardware import ClusterSpec, cluster_names, load_cluster
from simulator.spec.units import text_table

EXAMPLES = """
\b
Examples:
  simulator clusters
  simulator clusters dgx-h100 --json
  simulator plan --model llama3-70b --cluster dgx-h100 --fp8-format hybrid ...
"""

_COLUMNS = ("name", "GPU", "GPUs/node", "memory GiB", "HBM GB/s", "bf16 TFLOP/s", "fp8 TFLOP/s",
            "NVLink GB/s", "NICs", "profile")


def published_profile(cluster: ClusterSpec) -> str | None:
    """The shipped profile the planner uses for this cluster's GPU by default, if there is one."""
    name = f"{cluster.gpu.name.lower()}-published"
    return name if name in profile_names() else None


def cluster_row(c: ClusterSpec) -> dict[str, Any]:
    """One cluster for ``--json``, in the units the table shows."""
    peaks = c.gpu.peak_tflops
    return {
        "name": c.name, "gpu": c.gpu.name, "architecture": c.gpu.architecture, "gpus_per_node": c.gpus_per_node,
        "memory_gib": c.gpu.hbm_capacity_gib, "hbm_bandwidth_gbps": c.gpu.hbm_bandwidth_gbps,
        "peak_tflops": peaks.model_dump(mode="json"), "fp8": peaks.fp8 is not None,
        "nvswitch": c.nvswitch, "nvlink_bandwidth_gbps_per_direction": c.nvlink_bandwidth_gbps_per_direction,
        "nics_per_node": c.nics_per_node, "nic_line_rate_gbit_s": c.nic_line_rate_gbit_s,
        "nic_bandwidth_gbps_per_gpu": c.nic_bandwidth_gbps_per_gpu, "published_profile": published_profile(c),
        "nvlink_domain_gpus": c.nvlink_domain_gpus or c.gpus_per_node,
        "ranks_per_nvlink_domain": c.ranks_per_nvlink_domain,
    }


def _num(x: float) -> str:
    return f"{x:g}"


def render_table(clusters: list[ClusterSpec]) -> str:
    rows = [_COLUMNS] + [
        (c.name, c.gpu.name, str(c.gpus_per_node), _num(c.gpu.hbm_capacity_gib), _num(c.gpu.hbm_bandwidth_gbps),
         _num(c.gpu.peak_tflops.bf16), _num(c.gpu.peak_tflops.fp8) if c.gpu.peak_tflops.fp8 else "-",
         _num(c.nvlink_bandwidth_gbps_per_direction), f"{c.nics_per_node} x {_num(c.nic_line_rate_gbit_s)} Gb/s",
         published_profile(c) or "-")
        for c in clusters
    ]
    return text_table(_COLUMNS, rows[1:], frozenset({0, 1, len(_COLUMNS) - 1}))


@click.command("clusters", epilog=EXAMPLES)
@click.argument("names", nargs=-1, metavar="[NAME|FILE]...")
@click.option("--json", "as_json", is_flag=True, default=False, help="Print machine-readable JSON to stdout.")
def clusters_command(names: tuple[str, ...], as_json: bool) -> None:
    """List the cluster presets (or the given names and YAML files): GPU, GPUs per node, memory
    (GiB), HBM bandwidth, dense bf16 and fp8 peaks, NVLink per GPU and direction, the compute NICs
    per node and the published profile the planner uses for that GPU."""
    clusters = [load_cluster(n) for n in (names or cluster_names())]
    if as_json:
        click.echo(json.dumps([cluster_row(c) for c in clusters], indent=2))
        return
    click.echo(render_table(clusters))
    click.echo("NVLink: GB/s per GPU and direction; NICs: compute NICs per node and their line rate")
