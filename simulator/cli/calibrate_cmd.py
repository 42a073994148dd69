"""`simulator calibrate`: measure this machine (or read raw points), fit a hardware profile, show the errors."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click
from click.core import ParameterSource

from simulator.cli.options import MICRO_BATCH, PARALLEL_SIZE, BoundedFloat, OutputFile
from simulator.spec import limits

EXAMPLES = """
\b
Examples:
  simulator calibrate --device cpu --quick --out cpu-profile.json
  simulator calibrate --device cuda --out h200.json --keep-raw h200-raw.json
  simulator calibrate --raw OUTDIR/raw.json --out h200.json     # points from calibration/gpu_session.sh
  simulator plan --cluster local-cpu --model gpt3-125m --profile cpu-profile.json
  simulator calibrate --from-runs logs/ --cluster dgx-a100-80gb --out my-a100.json   # your Megatron runs
"""


def render(result, out: Path) -> str:
    p = result.profile
    lines = [f"wrote {out}: profile {p.name!r} ({p.source}) for {p.gpu}, measured on {p.device.name} "
             f"({p.device.host}, {p.device.date}, torch {p.device.torch_version})", "",
             "fit errors, (model - measured) / measured:",
             f"  {'block':30s} {'points':>6s} {'rms':>8s} {'max':>8s}"]
    for e in result.fit_errors:
        lines.append(f"  {e.block:30s} {e.points:6d} {e.rms * 100:7.1f}% {e.max_abs * 100:7.1f}%")
    d = p.device
    if d.threads or d.load_average:
        load = (f", load average {d.load_average[0]:.2f} at the start" if d.load_average else "") + \
               (f" and {d.load_average_end[0]:.2f} at the end" if d.load_average_end else "")
        lines.insert(1, f"{d.kind or 'device'}: {d.threads} thread(s) per process"
                        + (f" of {d.cores} cores" if d.cores else "") + load)
    g = p.gemm
    lines += ["", f"GEMM model: max efficiency {g.max_efficiency:.3f}, k_half {g.k_half:.0f}, "
              f"alignment {g.alignment_bytes} B (misaligned x{g.misaligned_factor:.2f}), "
              f"launch {g.launch_overhead_s * 1e6:.1f} us"
              + (f", tiles chosen among {len(g.tile_choices)} (full rate from intensity "
                 f"{g.full_rate_intensity_elements:.0f})" if g.tile_choices and g.full_rate_intensity_elements else "")]
    link = p.collectives.network if d.kind == "cpu" else p.collectives.nvlink
    lines.append(f"link: latency {link.latency_s * 1e6:.0f} us per step, {link.max_busbw_gbps:.3g} GB/s bus bandwidth, "
                 f"half-size {link.half_size_bytes:,.0f} B, ramp exponent {link.ramp_exponent:.2f}")
    if p.host is not None:
        h = p.host
        lines.append(f"host: {h.op_s * 1e6:.1f} us per op, {h.backward_op_s * 1e6:.1f} us per backward op, "
                     f"{h.collective_s * 1e6:.1f} us per collective, {h.micro_batch_s * 1e6:.1f} us per micro-batch, "
                     f"{h.iteration_s * 1e3:.2f} ms per iteration")
    if result.held_out:
        lines += ["", "held-out GEMMs (not fitted), predicted vs measured:",
                  f"  {'m x n x k (x batch)':26s} {'measured':>11s} {'predicted':>11s} {'error':>8s}"]
        for h in result.held_out:
            shape = f"{h.m} x {h.n} x {h.k}" + (f" x{h.batch}" if h.batch > 1 else "")
            lines.append(f"  {shape:26s} {h.measured_s * 1e3:9.3f} ms {h.predicted_s * 1e3:9.3f} ms {h.error * 100:7.1f}%")
        lines.append(f"  rms error {result.held_out_rms() * 100:.1f}% over {len(result.held_out)} shapes")
    for note in result.notes:
        lines.append(f"note: {note}")
    return "\n".join(lines)


@click.command("calibrate", epilog=EXAMPLES)
@click.option("--device", type=click.Choice(["cuda", "cpu"]), default=None,
              help="Where to measure (omit with --raw: the points say).")
@click.option("--quick", is_flag=True, help="Fewer sizes and repetitions (about a minute on a CPU).")
@click.option("--out", "out", type=OutputFile("profile"), required=True,
              help="Profile JSON to write (atomically).")
@click.option("--raw", "raw", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Fit these raw points (from `python -m calibration.measure`) instead of measuring.")
@click.option("--keep-raw", type=OutputFile("raw points"), default=None,
              help="Also keep the raw points measured here in this file.")
@click.option("--gpu", default=None, metavar="NAME|FILE",
              help="GPU spec the profile describes (default: recognised from the device name).")
@click.option("--name", default=None, help="Profile name (default: <gpu>-measured).")
@click.option("--model", default=None, metavar="NAME|FILE", help="Model whose layer GEMMs are measured.")
@click.option("--tensor-model-parallel-size", "--tp", "tp", type=PARALLEL_SIZE, default=None,
              help="TP size of those layer GEMMs.")
@click.option("--micro-batch-size", "--mbs", "mbs", type=MICRO_BATCH, default=None,
              help="Micro-batch of those layer GEMMs.")
@click.option("--budget-s", type=BoundedFloat(1, limits.MAX_BUDGET_S, closed=True), default=None,
              help="Wall-clock allowance for measuring, seconds.")
@click.option("--json", "as_json", is_flag=True, help="Print the fit errors and held-out GEMMs as JSON.")
@click.option("--from-runs", "from_runs", multiple=True, metavar="LOG",
              help="Fit the profile to these Megatron-LM or Megatron-Bridge training logs (files or folders; "
                   "repeat the flag) instead of measuring.")
@click.option("--cluster", default="dgx-a100-80gb", show_default=True, metavar="NAME|FILE",
              help="With --from-runs: the cluster the runs ran on.")
@click.option("--megatron-args", "launch", default=None, metavar="FILE",
              help="With --from-runs: the launch of logs without an arguments block (Megatron-Bridge).")
@click.option("--profile", "base_profile", default=None, metavar="FILE|NAME",
              help="With --from-runs: the profile to start from (default: the runs' GPU's published one).")
@click.option("--warmup-iterations", "warmup", type=click.IntRange(0, 1_000_000), default=None,
              help="With --from-runs: iterations after a (re)start whose logged intervals are dropped [default: 10].")
def calibrate_command(device, quick, out, raw, keep_raw, gpu, name, model, tp, mbs, budget_s, as_json, from_runs,
                      cluster, launch, base_profile, warmup):
    """Measure GEMMs, attention, memory-bound kernels and collectives; fit and write a hardware profile. With
    --from-runs, fit the profile's named constants to runs already made on the cluster instead."""
    from simulator.measure.calibrate import calibrate, layer_arguments
    from simulator.spec.catalog import load_model
    from simulator.spec.hardware import load_gpu

    if from_runs:
        if device or raw or quick or keep_raw or gpu or tp or mbs or budget_s:
            raise click.UsageError("--from-runs fits to logged runs; drop --device, --raw, --quick, --keep-raw, "
                                   "--gpu, --tp, --mbs and --budget-s")
        from simulator.cli.calibrate_runs_cmd import calibrate_from_runs
        from simulator.measure.megatron_log import DEFAULT_WARMUP_ITERATIONS

        calibrate_from_runs(from_runs, out, cluster, model or "gpt3-175b", launch, base_profile,
                            DEFAULT_WARMUP_ITERATIONS if warmup is None else warmup, name, as_json)
        return
    cluster_given = click.get_current_context().get_parameter_source("cluster") is not ParameterSource.DEFAULT
    if cluster_given or launch or base_profile or warmup is not None:
        raise click.UsageError("--cluster, --megatron-args, --profile and --warmup-iterations go with --from-runs")
    if raw is None and device is None:
        raise click.UsageError("pass --device cuda|cpu to measure, or --raw with points measured before")
    if raw is not None and (quick or keep_raw or model or tp or mbs or budget_s):
        raise click.UsageError("--quick, --keep-raw, --model, --tp, --mbs and --budget-s set up a measurement; "
                               "drop them with --raw")
    layer_args: list[str] = []
    if model is not None:
        layer_args += layer_arguments(load_model(model))
    if tp is not None:
        layer_args += ["--tp", str(tp)]
    if mbs is not None:
        layer_args += ["--micro-batch", str(mbs)]
    # the measurement takes minutes: a person at a terminal sees each section start and end (never a log or a pipe)
    progress = (lambda line: click.echo(f"calibrate: {line}", err=True)) if sys.stderr.isatty() else None
    result = calibrate(out, device=device, quick=quick, raw_path=raw, keep_raw=keep_raw,
                       gpu=load_gpu(gpu) if gpu else None, name=name, budget_s=budget_s, layer_args=layer_args,
                       progress=progress)
    click.echo(json.dumps(result.to_dict(), indent=2, allow_nan=False) if as_json else render(result, out))
