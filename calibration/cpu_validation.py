"""Close the time loop on this machine: calibrate the CPU, run the reference loop, validate.

    python -m calibration.cpu_validation --out reports/cpu-validation

Writes the measured CPU profile, one run record per plan and a README.md with predicted vs
measured iteration and per-layer times. CPUs shared with other work are noisy, so these figures
are a measurement of this machine at one moment, not a gate; the byte-exact activation check is
the stable part (and is gated in the tests).
"""

from __future__ import annotations

import argparse
import os
import platform
from pathlib import Path

MODEL = Path(__file__).resolve().parent / "reference" / "gpt-small-cpu.yaml"
PLANS = {
    "TP 1": dict(global_batch_size=4),
    "TP 2": dict(tensor_parallel_size=2, global_batch_size=4),
    "TP 2 + SP, selective": dict(tensor_parallel_size=2, sequence_parallel=True,
                                 recompute_granularity="selective", global_batch_size=4),
    "TP 2, full recompute": dict(tensor_parallel_size=2, recompute_granularity="full", global_batch_size=4),
    "PP 2": dict(pipeline_parallel_size=2, global_batch_size=8),
}


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x * 100:+.0f}%"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--iterations", type=int, default=5)
    args = parser.parse_args(argv)

    # one thread per rank, as the profile measures one core standing for one device
    os.environ["OMP_NUM_THREADS"] = "1"
    from calibration.reference.launch import run_reference
    from simulator.calibrate import calibrate
    from simulator.cli.options import job_from_options
    from simulator.validate import validate

    args.out.mkdir(parents=True, exist_ok=True)
    profile = args.out / "cpu-profile.json"
    result = calibrate(profile, device="cpu", quick=True)
    lines = [
        "# Closing the time loop on a CPU",
        "",
        f"Regenerate with `python -m calibration.cpu_validation --out {args.out}` (measured: the numbers change "
        "from run to run, most with the machine's other load).",
        "",
        f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; one thread per rank; "
        f"model `{MODEL.name}`; profile `{profile.name}` measured by `simulator calibrate --device cpu --quick` "
        "in the same run.",
        "",
        "Fit errors of the profile (rms over the points of each block):",
        "",
        "| block | points | rms |",
        "|---|---|---|",
    ]
    lines += [f"| {e.block} | {e.points} | {e.rms * 100:.1f}% |" for e in result.fit_errors]
    lines += ["", "| plan | iteration pred. | measured | error | layer fwd error | layer bwd error | "
              "activation bytes pred. / measured |", "|---|---|---|---|---|---|---|"]
    for label, plan in PLANS.items():
        job = job_from_options(model=str(MODEL), cluster="local-cpu", precision="fp32", allow_tp_across_nodes=True,
                               attention_backend="unfused",
                               **plan)
        record_path = args.out / f"run-{label.lower().replace(' ', '').replace(',', '-').replace('+', '')}.json"
        record = run_reference(job, device="cpu", iterations=args.iterations, out=record_path)
        v = validate(record, str(profile))
        first = v.layers[0]
        lines.append(
            f"| {label} | {v.iteration_time_s.predicted * 1e3:.0f} ms | {v.iteration_time_s.measured * 1e3:.0f} ms | "
            f"{_pct(v.iteration_time_s.relative_error)} | {_pct(first.forward_s.relative_error)} | "
            f"{_pct(first.backward_s.relative_error)} | {first.activation_bytes.predicted:,.0f} / "
            f"{first.activation_bytes.measured:,.0f} |")
    lines += ["", "Reading the table: activation bytes are exact by construction (the tests gate on them). Times are "
              "predicted from a profile measured one process at a time; the TP and PP runs add gloo collectives on "
              "loopback, whose fitted cost is the least certain part of the profile (see the fit errors above), "
              "and two ranks sharing the machine's memory bandwidth.", ""]
    (args.out / "README.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out / 'README.md'}")


if __name__ == "__main__":
    main()
