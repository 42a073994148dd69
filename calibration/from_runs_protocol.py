"""How far a profile fitted to three of a set's runs carries to the rest of the set.

    python -m calibration.from_runs_protocol [--out calibration/published/from_runs_protocol.json]

The rule that picks the runs is fixed before looking at any error: sort the set's runs by GPU count (then by
label), and take the first, the middle (index n // 2) and the last, the smallest, median and largest jobs, as a
team with a short trial, last month's job and a big run would have. ``simulator calibrate --from-runs``'s fit
(``simulator.measure.calibrate_runs``) is run on those three, and every other run of the set is predicted with
the uncalibrated and the calibrated profile: mean absolute error, bias, and the calibrated band's coverage and
width (high - low over the point), for the runs the calibrated band applies to and for all of them.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from simulator.cost.profile import default_profile
from simulator.estimator.band import band, run_band
from simulator.estimator.prediction import estimate
from simulator.measure.calibrate_runs import fit_runs, fitted_profile
from simulator.measure.datasets import MeasuredRun, data_set

HERE = Path(__file__).resolve().parent
OUT = HERE / "published" / "from_runs_protocol.json"
SETS = ("vtrain-multi-node-dev", "vtrain-single-node")
COMMAND = "python -m calibration.from_runs_protocol"
BAND_SAMPLE = 120
"""Runs of a set whose bands are played (the band plays the engine at two corners: every run of the 1,440 would
take minutes); a fixed, evenly spaced sample of the runs left, in the set's order."""


def pick(runs: list[MeasuredRun]) -> list[MeasuredRun]:
    """The fixed rule: the smallest, median and largest GPU counts (ties by label)."""
    order = sorted(runs, key=lambda r: (r.job.plan.num_gpus, r.label))
    return [order[0], order[len(order) // 2], order[-1]]


def _errors(runs: list[MeasuredRun], profile) -> np.ndarray:
    return np.array([estimate(r.job, profile).iteration_time_s / r.measured_s - 1 for r in runs])


def protocol(key: str) -> dict:
    runs = data_set(key).runs()
    chosen = pick(runs)
    base = chosen[0].profile if chosen[0].profile is not None else default_profile(chosen[0].job.cluster.gpu.name)
    fit = fit_runs([(r.label, r.job, r.measured_s) for r in chosen], base)
    calibrated = fitted_profile(base, fit, [r.job for r in chosen], f"{key}-three-runs")
    rest = [r for r in runs if r not in chosen]
    before, after = _errors(rest, base), _errors(rest, calibrated)
    sample = rest[:: max(1, len(rest) // BAND_SAMPLE)][:BAND_SAMPLE]
    covered, widths, applies = [], [], []
    for r in sample:
        b = band(r.job, calibrated)
        t = estimate(r.job, calibrated).iteration_time_s
        covered.append(b.iteration_time_s_low <= r.measured_s <= b.iteration_time_s_high)
        widths.append((b.iteration_time_s_high - b.iteration_time_s_low) / t)
        applies.append(run_band(r.job, calibrated) is not None)
    covered, widths, applies = np.array(covered), np.array(widths), np.array(applies)

    def band_stats(mask: np.ndarray) -> dict:
        if not mask.any():
            return {"runs": 0, "coverage": None, "median_width": None}
        return {"runs": int(mask.sum()), "coverage": float(covered[mask].mean()),
                "median_width": float(np.median(widths[mask]))}

    return {
        "set": key, "chosen": [r.label for r in chosen], "judged_on": len(rest),
        "fit": {p.name: {"prior": p.prior, "value": p.value, "pinned": p.pinned} for p in fit.parameters},
        "band_below": fit.band_below, "band_above": fit.band_above, "kept_profile": fit.kept_profile,
        "warnings": list(fit.warnings),
        "uncalibrated": {"mean_abs_error": float(np.abs(before).mean()), "bias": float(before.mean())},
        "calibrated": {"mean_abs_error": float(np.abs(after).mean()), "bias": float(after.mean())},
        "band_sampled": len(sample),
        "band_where_it_applies": band_stats(applies),
        "band_all": band_stats(np.ones_like(applies, dtype=bool)),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    rows = [protocol(key) for key in SETS]
    args.out.write_text(json.dumps({"command": COMMAND, "rows": rows}, indent=2) + "\n", encoding="utf-8")
    for row in rows:
        u, c = row["uncalibrated"], row["calibrated"]
        print(f"{row['set']}: from {', '.join(row['chosen'])}; the other {row['judged_on']}: "
              f"{u['mean_abs_error']:.1%}/{u['bias']:+.1%} -> {c['mean_abs_error']:.1%}/{c['bias']:+.1%}; band "
              f"{row['band_where_it_applies']} where it applies, {row['band_all']} over all")


if __name__ == "__main__":
    main()
