"""``simulator validate RUN.json``: the simulator's predictions against a reference run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from simulator.measure.run_record import load_run_record
from simulator.measure.validate import Comparison, Validation, validate


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
"""


@click.command("validate", epilog=EXAMPLES)
@click.argument("run", type=click.Path(path_type=Path))
@click.option("--profile", "profile", default=None, metavar="FILE",
              help="Hardware profile for the time predictions (default: the cluster's).")
@click.option("--memory-only", is_flag=True, default=False, help="Compare memory only; do not run the engine.")
@click.option("--json", "as_json", is_flag=True, default=False, help="Print machine-readable JSON to stdout.")
def validate_cmd(run: Path, profile: str | None, memory_only: bool, as_json: bool, **_: Any) -> None:
    """Predicted vs measured for a run record of 'simulator reference', with relative errors."""
    result = validate(load_run_record(run), profile, run=str(run), predict_times=not memory_only)
    click.echo(result.model_dump_json(indent=2) if as_json else render(result))
