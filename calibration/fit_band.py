"""Fit the band on every answer to the model's own errors on the measured sets in the repository.

    python -m calibration.fit_band [--out calibration/published/model_error_band.json]

Every run of every data set in ``simulator.measure.datasets`` is predicted with the profile it is
judged with; each run's nonconformity score is |measured / predicted - 1|. Per GPU kind the half-width
is the largest, over the sets measured on it, of the set's split-conformal 90% quantile of that score
(its ceil((n + 1) 0.9)-th smallest, ``conformal_quantile``): each set is a
calibration split of its own, so a set of 1,440 runs cannot drown one of 62. The file also records, per
GPU kind, the plan features the measured runs covered and the best MFU they reached
(``simulator.estimator.regime`` reads it), and the leave-one-set-out table: each set's coverage when its
own runs are left out of the half-width, against its coverage with them in.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np

from simulator.estimator.prediction import estimate
from simulator.estimator.regime import BAND_FILE, OUTSIDE_WIDENING, plan_features
from simulator.measure.datasets import REGISTRY

HERE = Path(__file__).resolve().parent
OUT = HERE / "published" / BAND_FILE
QUANTILE = 0.9  # of |measured / predicted - 1| within each set; the target coverage is 80% of every set


def _scores() -> dict[str, dict]:
    """Per set: its GPU kind, each run's score, signed residual, features and measured MFU."""
    out = {}
    for ds in REGISTRY:
        runs = ds.runs()
        if not runs:  # a set this checkout does not hold
            continue
        rows = []
        for run in runs:
            est = estimate(run.job, run.profile)
            residual = run.measured_s / est.iteration_time_s - 1
            rows.append({"gpu": run.job.cluster.gpu.name, "residual": residual,
                         "features": plan_features(run.job), "gpus": run.job.plan.num_gpus,
                         "measured_mfu": est.mfu * est.iteration_time_s / run.measured_s})
        out[ds.key] = {"gpu": rows[0]["gpu"], "rows": rows}
    return out


def conformal_quantile(values: list[float], level: float = QUANTILE) -> float:
    """Split conformal prediction's quantile of ``values``: the ceil((n + 1) level)-th smallest (the largest
    where that passes n), which covers a new draw from the same runs with probability at least ``level``;
    an interpolated quantile falls short of that on a set of a few dozen runs."""
    ordered = sorted(values)
    return float(ordered[min(math.ceil((len(ordered) + 1) * level), len(ordered)) - 1])


def _half_width(scores: dict[str, dict], keys: list[str]) -> float:
    return max(conformal_quantile([abs(r["residual"]) for r in scores[k]["rows"]]) for k in keys)


def _coverage(rows: list[dict], half_width: float) -> float:
    return float(np.mean([abs(r["residual"]) <= half_width for r in rows]))


def _outside_shares(rows: list[dict], half_width: float) -> dict[str, float]:
    """The share of runs measured faster than the band's fast end, and slower than its slow end: a band whose
    misses all fall on one side is shaped unlike the error."""
    return {"below_fast_end": float(np.mean([r["residual"] < -half_width for r in rows])),
            "above_slow_end": float(np.mean([r["residual"] > half_width for r in rows]))}


def _sides(rows: list[dict]) -> dict[str, float]:
    """How far the set's runs reach on each side of the prediction, each side's split-conformal 90% quantile of
    measured / predicted - 1: faster (``fast_side``, its magnitude) and slower (``slow_side``). Recorded to show
    where the error lies; the band's half-width stays the quantile of |measured / predicted - 1|, because the
    sets disagree on the side (a band built per side fails the single-node set when it is left out)."""
    return {"fast_side": max(0.0, conformal_quantile([-r["residual"] for r in rows])),
            "slow_side": max(0.0, conformal_quantile([r["residual"] for r in rows]))}


def fit(scores: dict[str, dict]) -> dict:
    by_gpu: dict[str, list[str]] = {}
    for key, s in scores.items():
        by_gpu.setdefault(s["gpu"], []).append(key)
    gpus = {}
    for gpu, keys in sorted(by_gpu.items()):
        rows = [r for k in keys for r in scores[k]["rows"]]
        covered = {f: sorted({r["features"][f] for r in rows}) for f in rows[0]["features"]}
        gpus[gpu] = {
            "half_width": _half_width(scores, keys),
            "sets": {k: {"runs": len(scores[k]["rows"]),
                         "abs_residual_q90": _half_width(scores, [k]), **_sides(scores[k]["rows"]),
                         "bias": float(np.mean([r["residual"] for r in scores[k]["rows"]]))} for k in sorted(keys)},
            "covered": covered,
            "max_measured_mfu": max(r["measured_mfu"] for r in rows),
            "max_gpus": max(r["gpus"] for r in rows),
        }
    widest = max(g["half_width"] for g in gpus.values())
    loso = []
    for key, s in scores.items():
        others = [k for k in by_gpu[s["gpu"]] if k != key]
        if others:
            hw, how = _half_width(scores, others), "the other sets on this GPU"
        else:
            rest = [k for k in scores if k != key]
            hw, how = _half_width(scores, rest) * OUTSIDE_WIDENING, "outside every regime: the widest other set, widened"
        hw_in = gpus[s["gpu"]]["half_width"]
        loso.append({"set": key, "gpu": s["gpu"], "half_width_left_out": hw, "from": how,
                     "coverage_left_out": _coverage(s["rows"], hw),
                     **{f"{k}_left_out": v for k, v in _outside_shares(s["rows"], hw).items()},
                     "half_width_in": hw_in, "coverage_in": _coverage(s["rows"], hw_in),
                     **{f"{k}_in": v for k, v in _outside_shares(s["rows"], hw_in).items()}})
    return {"command": "python -m calibration.fit_band", "quantile": QUANTILE, "target_coverage": 0.8,
            "widest_half_width": widest, "gpus": gpus, "leave_one_set_out": loso}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    result = fit(_scores())
    args.out.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    for row in result["leave_one_set_out"]:
        print(f"{row['set']}: coverage {row['coverage_in']:.0%} (half-width {row['half_width_in']:.1%}; faster than "
              f"the fast end {row['below_fast_end_in']:.0%}, slower than the slow end {row['above_slow_end_in']:.0%}), "
              f"left out {row['coverage_left_out']:.0%} (half-width {row['half_width_left_out']:.1%}; "
              f"{row['below_fast_end_left_out']:.0%}, {row['above_slow_end_left_out']:.0%})")


if __name__ == "__main__":
    main()
