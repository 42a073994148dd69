"""``simulator validate RUN.json``: the simulator's predictions against a reference run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource

from simulator.measure.run_record import load_run_record
from simulator.outputs.describe import band_origin
from simulator.measure.validate import Comparison, Validation, validate
from simulator.spec.errors import ConfigError


def _value(x: float | None, unit: str) -> str:
    if x is None:
        return "-"
    if unit == "s":
        return f"{x * 1e3:.3f} ms"
    if unit == "B":
        return f"{x:,.0f} B"
    return f"{x:.4g}"


def _error(c: Comparison) -> str:
    return "-" if c.relative_error is None else f"{c.relative_error:+.1%}"


def _table(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [r[0].ljust(widths[0]) + "  " + "  ".join(x.rjust(w) for x, w in zip(r[1:], widths[1:])) for r in rows]
    lines.insert(1, "-" * len(lines[0]))
    return lines


def render(v: Validation) -> str:
    rows = [("quantity", "predicted", "measured", "error")]

    def add(name: str, c: Comparison, unit: str) -> None:
        rows.append((name, _value(c.predicted, unit), _value(c.measured, unit), _error(c)))

    add("iteration time", v.iteration_time_s, "s")
    if v.outside_layers_s is not None:
        add("outside the layers (critical stage)", v.outside_layers_s, "s")
    add("activation bytes per layer (mean)", v.activation_bytes_per_layer, "B")
    for layer in v.layers:
        tag = f"layer {layer.index} (stage {layer.stage}, {layer.recompute_granularity.value})"
        add(f"{tag} forward", layer.forward_s, "s")
        add(f"{tag} backward", layer.backward_s, "s")
        if layer.recompute_granularity.value != "none":
            add(f"{tag} recompute", layer.recompute_s, "s")
        add(f"{tag} activations", layer.activation_bytes, "B")
    for stage, c in enumerate(v.peak_memory_bytes_per_stage or []):
        add(f"stage {stage} peak allocated memory", c, "B")
    lines = [f"{v.run} ({v.device})"]
    if v.verdict:
        lines.append(f"verdict: {v.verdict}")
    lines += _table(rows)
    if v.phases:
        spread = f", iterations spread {v.iteration_time_spread:.1%}" if v.iteration_time_spread is not None else ""
        lines += ["", f"per iteration, Megatron's timers (mean over timed iterations and the stage's ranks{spread}):"]
        phase_rows = [("phase", "stage", "predicted", "measured", "error", "measured range")]
        for ph in v.phases:
            c = Comparison(predicted=ph.predicted, measured=ph.measured, relative_error=ph.relative_error)
            span = (f"{_value(ph.measured_min, 's')} .. {_value(ph.measured_max, 's')}"
                    if ph.measured_min is not None else "-")
            phase_rows.append((ph.phase, str(ph.stage), _value(ph.predicted, "s"), _value(ph.measured, "s"),
                               _error(c), span))
        lines += _table(phase_rows)
    for check in v.checks:
        mark = {True: "ok", False: "MISMATCH", None: "info"}[check.ok]
        lines.append(f"check {check.name}: {mark}: {check.detail}")
    return "\n".join(lines + [f"note: {n}" for n in v.notes])


EXAMPLES = """
\b
Examples:
  simulator validate run.json --profile my-cpu.json
  simulator validate run.json --memory-only --json
  simulator validate logs/ --cluster dgx-a100-80gb          # every *.log / *.out / *.txt of a folder
  simulator validate trial.log --megatron-args launch.sh    # a Megatron-Bridge log, with the launch it ran
"""


def _render_runs(checks: list, summary) -> str:
    rows = [("run", "layout", "predicted", "measured (p10..p90)", "error", "band", "in band", "regime")]
    for c in checks:
        it = c.iteration_time_s
        band = "-" if c.band_low_s is None else f"{c.band_low_s:.3f}..{c.band_high_s:.3f} s"
        rows.append((Path(c.run).name, c.layout, f"{it.predicted:.3f} s",
                     f"{it.measured:.3f} s ({c.measured_p10_s:.3f}..{c.measured_p90_s:.3f})", _error(it), band,
                     {True: "yes", False: "NO", None: "-"}[c.inside_band],
                     "its runs' band" if c.band_from_runs else c.regime or "outside every measured regime"))
    lines = _table(rows)
    # what every run of several shares (a flag none of their launches gave, one band) is said once, after them
    origins = [band_origin(c.regime, c.outside_regime_reasons, c.band_from_runs) if c.band_from_runs else None
               for c in checks]
    shared_origin = origins[0] if len(checks) > 1 and origins[0] is not None and len(set(origins)) == 1 else None
    shared_notes = [n for n in checks[0].notes if len(checks) > 1 and all(n in c.notes for c in checks[1:])]
    for c, origin in zip(checks, origins):
        detail = [f"{ph.phase} {ph.predicted_s * 1e3:.1f} ms predicted, {ph.measured_s * 1e3:.1f} ms measured "
                  f"({ph.relative_error:+.1%})" for ph in c.phases if ph.relative_error is not None]
        if c.peak_allocated_bytes is not None and c.peak_allocated_bytes.relative_error is not None:
            detail.append(f"peak allocated {c.peak_allocated_bytes.predicted / 2**30:.1f} GiB predicted, "
                          f"{c.peak_allocated_bytes.measured / 2**30:.1f} GiB measured")
        dropped = ", ".join(f"{n} {why}" for why, n in c.intervals_dropped.items())
        lines.append(f"{Path(c.run).name}: {c.intervals_kept} intervals kept ({c.iterations_kept} iterations)"
                     + (f", dropped {dropped}" if dropped else "") + ("; " + "; ".join(detail) if detail else ""))
        if origin is not None and shared_origin is None:
            lines.append("  band: " + origin)
        elif c.outside_regime_reasons:
            lines.append("  outside every measured regime: " + "; ".join(c.outside_regime_reasons))
        lines += [f"  note: {n}" for n in c.notes if n not in shared_notes]
    if shared_origin is not None:
        lines.append(f"band of every run: {shared_origin}")
    lines += [f"note, every run: {n}" for n in shared_notes]
    if summary is not None and summary.runs > 1:
        lines.append(f"{summary.runs} runs: mean absolute error {summary.mean_absolute_error:.1%}, bias "
                     f"{summary.bias:+.1%}, {summary.inside_band} of {summary.runs} inside the band, "
                     f"{summary.layouts} distinct layout{'' if summary.layouts == 1 else 's'}"
                     + (f"; {summary.in_sample} of the runs are the profile's own (in sample)" if summary.in_sample
                        else ""))
    return "\n".join(lines)


def _validate_logs(paths: list[str], profile: str | None, cluster: str, model: str, launch: str | None,
                   warmup: int, as_json: bool, cluster_given: bool) -> None:
    from simulator.cli.runs_input import job_of_log
    from simulator.measure.megatron_log import log_files, measured_time, read_log
    from simulator.measure.run_logs import check_run, summarise

    profile_obj = None
    if profile is not None:
        from simulator.cost.profile import load_profile

        profile_obj = load_profile(profile)
    checks = []
    for path in log_files(paths):
        log = read_log(path)
        job, notes = job_of_log(log, cluster, model, launch, cluster_given=cluster_given)
        checks.append(check_run(job, log, measured_time(log, warmup), profile_obj, notes))
    summary = summarise(checks)
    if as_json:
        click.echo(json.dumps({"runs": [c.model_dump(mode="json") for c in checks],
                               "summary": summary.model_dump(mode="json") if summary else None}, indent=2))
    else:
        click.echo(_render_runs(checks, summary))


@click.command("validate", epilog=EXAMPLES)
@click.argument("runs", nargs=-1, required=True, metavar="RUN...")
@click.option("--profile", "profile", default=None, metavar="FILE",
              help="Hardware profile for the time predictions (default: the cluster's).")
@click.option("--memory-only", is_flag=True, default=False, help="Compare memory only; do not run the engine.")
@click.option("--json", "as_json", is_flag=True, default=False, help="Print machine-readable JSON to stdout.")
@click.option("--cluster", default="dgx-a100-80gb", show_default=True, metavar="NAME|FILE",
              help="For training logs: the cluster the runs ran on (a log does not say).")
@click.option("--model", default="gpt3-175b", show_default=True, metavar="NAME|FILE",
              help="For training logs: the model whose fields the arguments leave unset.")
@click.option("--megatron-args", "launch", default=None, metavar="FILE",
              help="For a log without an arguments block (Megatron-Bridge): the launch the run ran.")
@click.option("--warmup-iterations", "warmup", type=click.IntRange(0, 1_000_000), default=None,
              help="Iterations after a (re)start whose logged intervals are dropped [default: 10].")
def validate_cmd(runs: tuple[str, ...], profile: str | None, memory_only: bool, as_json: bool, cluster: str,
                 model: str, launch: str | None, warmup: int | None, **_: Any) -> None:
    """Predicted vs measured: for a run record of 'simulator reference' (RUN.json), with per-layer and per-phase
    errors; for Megatron-LM or Megatron-Bridge training logs (files or folders), the steady-state iteration time
    of each run against the prediction and its band, with the run's regime."""
    from simulator.measure.megatron_log import DEFAULT_WARMUP_ITERATIONS

    records = [r for r in runs if r.endswith(".json")]
    logs = [r for r in runs if not r.endswith(".json")]
    if records and logs:
        raise ConfigError("give run records (*.json) or training logs, not both in one call")
    if logs:
        if memory_only:
            raise ConfigError("--memory-only is for run records; a training log is checked for its time")
        given = click.get_current_context().get_parameter_source("cluster") is not ParameterSource.DEFAULT
        _validate_logs(logs, profile, cluster, model, launch,
                       DEFAULT_WARMUP_ITERATIONS if warmup is None else warmup, as_json, given)
        return
    if len(records) > 1:
        raise ConfigError("give one run record (*.json) at a time")
    run = Path(records[0])
    result = validate(load_run_record(run), profile, run=str(run), predict_times=not memory_only)
    click.echo(result.model_dump_json(indent=2) if as_json else render(result))
