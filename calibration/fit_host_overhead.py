"""Fit the host-side constants of the published profiles to the measured A100 sets together.

    python -m calibration.fit_host_overhead [--out calibration/published/host_overhead_fit.json]
    python -m calibration.fit_host_overhead --leave-one-set-out [--out calibration/published/host_overhead_loso.json]

The second form checks the fit as the other sets see it: for each measured A100 set in turn, the
constants are fitted to the other sets together (each set weighing the same, however many runs it has)
and the set left out is judged with them, and without any host block.

No microbenchmark in ``calibration/published/hardware.md`` pins what Megatron's Python and the
CUDA launch path cost per op on a DGX host (its only source gives 5-25 us per eager op, a
tutorial's breakdown), so these constants are fitted, by least squares on the relative error of
every run, to every measured A100 set in ``simulator.measure.datasets`` together, each set weighing
the same (the 1,440 single-node runs pin the per-op terms; the others, bound by the GPU, keep the fit
from buying one set's accuracy with another's), with everything else of the A100 profile fixed as
``build_published_profiles`` fits it from microbenchmarks. The output records each set's errors
before and after, and ``build_published_profiles`` names the sets in the profile.

Each constant also has a prior (``PRIORS``): where it sits when no run says otherwise (an op and a
collective call at eager PyTorch's 5-25 us, no host work beyond the ops), and a width. A constant
moves one width from its prior only where that buys at least a point of root-mean-square relative
error on one set (``PRIOR_WEIGHT``), so sets that barely see the host (bound by the GPU) leave it
near the prior instead of driving it to a bound for a tenth of a point: what the leave-one-set-out
table then shows for a set left out is what the other sets really say about it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

from simulator.cost.profile import HardwareProfile, HostParams
from simulator.measure.datasets import REGISTRY, DataSet, SetErrors, evaluate

HERE = Path(__file__).resolve().parent
OUT = HERE / "published" / "host_overhead_fit.json"
LOSO_OUT = HERE / "published" / "host_overhead_loso.json"
GPU = "A100-SXM4-80GB"

# (name, start, lower, upper), seconds. op_s stands for both forward and backward ops: with full
# recompute (the whole set) every layer issues its forward twice and its backward once, which
# leaves the two inseparable.
PARAMETERS = (
    ("op_s", 40e-6, 1e-6, 200e-6),
    ("collective_s", 20e-6, 0.0, 500e-6),
    ("pipeline_exchange_s", 100e-6, 0.0, 5e-3),
    ("micro_batch_s", 500e-6, 0.0, 10e-3),
    ("iteration_s", 5e-3, 0.0, 100e-3),
)


# (centre, width), seconds: eager PyTorch's 5-25 us per op (hardware.md, host-side cost) for an op and for a
# collective call. The rest are centred on no host work beyond the ops, as wide as what they stand for: a
# pipeline exchange synchronizes the device, so the host re-fills an empty queue after it (up to a
# millisecond); a micro-batch's data, masks and loss are tens of eager calls; the optimizer's bookkeeping
# and gradient-norm sync, hundreds
PRIORS = {
    "op_s": (15e-6, 10e-6),
    "collective_s": (15e-6, 10e-6),
    "pipeline_exchange_s": (0.0, 1e-3),
    "micro_batch_s": (0.0, 1e-3),
    "iteration_s": (0.0, 10e-3),
}
PRIOR_WEIGHT = 0.01  # a one-width move weighs as much as this relative error over a whole set


def with_host(profile: HardwareProfile, values: dict[str, float]) -> HardwareProfile:
    host = HostParams(op_s=values["op_s"], backward_op_s=values["op_s"], collective_s=values["collective_s"],
                      pipeline_exchange_s=values["pipeline_exchange_s"], micro_batch_s=values["micro_batch_s"],
                      iteration_s=values["iteration_s"], sources={k: "fit in progress" for k in HostParams.model_fields
                                                                  if k not in ("sources", "fits", "ranges")})
    return profile.model_copy(update={"host": host})


def summary(errors: SetErrors) -> dict:
    return {
        "mean_abs_error": errors.mean_abs_error,
        "bias": errors.bias,
        "subsets": {tag: {str(v): {"mean_abs_error": mae, "bias": bias, "runs": n} for v, (mae, bias, n) in by.items()}
                    for tag, by in errors.subsets.items()},
    }


def _least_squares(base: HardwareProfile, sets: list[DataSet], tolerance: float = 1e-8) -> dict[str, float]:
    """The constants that minimise the relative errors of ``sets`` together, each set weighing the same."""
    names = [p[0] for p in PARAMETERS]
    start = np.array([p[1] for p in PARAMETERS])
    lower = np.array([p[2] for p in PARAMETERS])
    upper = np.array([p[3] for p in PARAMETERS])
    scale = start.copy()

    centre = np.array([PRIORS[n][0] for n in names])
    width = np.array([PRIORS[n][1] for n in names])

    def residuals(z: np.ndarray) -> np.ndarray:
        values = dict(zip(names, (z * scale).tolist()))
        out = []
        for data in sets:
            errors = np.array([r.error for r in evaluate(data, with_host(base, values)).rows])
            out.append(errors / np.sqrt(len(errors)))
        out.append(PRIOR_WEIGHT * (z * scale - centre) / width)
        return np.concatenate(out)

    res = least_squares(residuals, start / scale, bounds=(lower / scale, upper / scale), x_scale="jac",
                        diff_step=1e-3, xtol=tolerance, ftol=tolerance, gtol=tolerance)
    return dict(zip(names, (res.x * scale).tolist()))


def _a100_sets() -> list[DataSet]:
    """The measured A100 sets this checkout holds (the CPU runs have their own profile)."""
    return [d for d in REGISTRY if d.key != "cpu-reference-loop" and d.runs()]


def _left_out_row(base: HardwareProfile, left_key: str) -> dict:
    sets = _a100_sets()
    left = next(d for d in sets if d.key == left_key)
    values = _least_squares(base, [d for d in sets if d is not left], tolerance=1e-6)
    with_fit, without = evaluate(left, with_host(base, values)), evaluate(left, base)
    return {"left_out": left.key, "fitted_on": [d.key for d in sets if d is not left], "parameters": values,
            "with": {"mean_abs_error": with_fit.mean_abs_error, "bias": with_fit.bias},
            "without": {"mean_abs_error": without.mean_abs_error, "bias": without.bias}}


def leave_one_set_out(base: HardwareProfile, jobs: int = 1) -> dict:
    """Per A100 set: the constants fitted to the others, and the left-out set's errors with them and with none.
    ``jobs`` > 1 fits the folds in as many processes (each fold is independent of the others)."""
    keys = [d.key for d in _a100_sets()]
    if jobs > 1:
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(max_workers=min(jobs, len(keys))) as pool:
            rows = list(pool.map(_left_out_row, [base] * len(keys), keys))
    else:
        rows = [_left_out_row(base, key) for key in keys]
    return {"command": "python -m calibration.fit_host_overhead --leave-one-set-out", "profile": base.name,
            "rows": rows}


def fit(base: HardwareProfile) -> dict:
    """The constants fitted to every measured A100 set together, each set weighing the same, with each
    set's errors before and after (``--leave-one-set-out`` checks the same fit with each set left out)."""
    sets = _a100_sets()
    values = _least_squares(base, sets)
    per_set = {}
    for data in sets:
        before, after = evaluate(data, base), evaluate(data, with_host(base, values))
        per_set[data.key] = {"runs": len(after.rows), "before": summary(before), "after": summary(after)}
    return {
        "data_sets": [d.key for d in sets],
        "runs": sum(v["runs"] for v in per_set.values()),
        "profile": base.name,
        "command": "python -m calibration.fit_host_overhead",
        "parameters": values,
        "bounds": {p[0]: [p[2], p[3]] for p in PARAMETERS},
        "priors": {name: {"centre": c, "width": w} for name, (c, w) in PRIORS.items()},
        "prior_weight": PRIOR_WEIGHT,
        "sets": per_set,
    }


def main(argv: list[str] | None = None) -> None:
    from calibration.build_published_profiles import build_profile

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--leave-one-set-out", action="store_true",
                        help="fit to every A100 set but one in turn and judge the one left out")
    parser.add_argument("--jobs", type=int, default=1, help="with --leave-one-set-out: fit the folds in this "
                        "many processes")
    args = parser.parse_args(argv)
    base = build_profile(GPU, host=False)
    if args.leave_one_set_out:
        out = args.out or LOSO_OUT
        table = leave_one_set_out(base, args.jobs)
        out.write_text(json.dumps(table, indent=2, sort_keys=True) + "\n")
        for row in table["rows"]:
            w, wo = row["with"], row["without"]
            print(f"{row['left_out']}: fitted on {', '.join(row['fitted_on'])}: mean abs error "
                  f"{wo['mean_abs_error']:.1%} without -> {w['mean_abs_error']:.1%} with (bias {wo['bias']:+.1%} -> "
                  f"{w['bias']:+.1%})")
        return
    args.out = args.out or OUT
    result = fit(base)
    args.out.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    print(f"{args.out}: " + ", ".join(f"{k} {v * 1e6:.1f} us" for k, v in result["parameters"].items()))
    for key, one in result["sets"].items():
        b, a = one["before"], one["after"]
        print(f"  {key} ({one['runs']} runs): mean abs error {b['mean_abs_error']:.1%} -> {a['mean_abs_error']:.1%}, "
              f"bias {b['bias']:+.1%} -> {a['bias']:+.1%}")


if __name__ == "__main__":
    main()
