"""A profile fitted to runs a user already made on their cluster (``simulator calibrate --from-runs``).

The fit moves a few named, physically meaningful constants of the profile, each within a declared range
(``FIT_PARAMETERS``), with the profile's own value as its prior: a maximum a posteriori fit of the measured
iteration times in log space (``scipy.optimize.least_squares``, bounded to the ranges), every run weighted by
the run-to-run noise of a measured iteration time, every constant pulled back to its prior by its prior width.
A run set that cannot tell a constant apart (only DP varies: nothing pins the tensor-parallel cost) leaves it
at its prior; the result says which constants the runs pinned (posterior width under half the prior's) and
which stayed.

The band of the fitted profile comes from the fit's own errors on runs it did not see: each run is left out
in turn, the rest refitted, and the left-out run predicted; the slow and fast half-widths are the largest
leave-one-run-out errors on each side (so the band is as asymmetric as the errors), never narrower than the
noise. The fit is kept only where those left-out predictions beat the profile as it is on the same runs (model
selection by leave-one-out): otherwise the profile's constants stay, and its own errors on the runs, which it
never saw, give the band (as they do for a single run, where none can be left out). It holds for plans like
the runs: a plan whose regime features (``simulator.estimator.regime``) none of the runs had keeps the regime's
wider band.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from simulator.cost.profile import HardwareProfile
from simulator.cost.run_calibration import RunCalibration, calibration_features
from simulator.spec.errors import ConfigError
from simulator.spec.plan import Job

RUN_NOISE = 0.05
"""Relative spread of a run's measured time about the prediction that no fitted constant explains (one standard
deviation): the run's own noise (a logged median repeats to about 1-3%) and the model's error on a run of a
measured regime (about 5%, the development sets' mean error). Declared, not fitted: it weighs one run against
the priors, and the band never comes out narrower than it."""

PINNED_RATIO = 0.5
"""A constant counts as pinned by the runs when its posterior width is under this share of its prior's."""

BOUND_TOLERANCE = 1e-3
"""How near a bound, as a share of the range, a fitted value counts as on it: the solver starts this far inside a
bound, and a constant the runs cannot see may stay there."""

HELD_STEP = 0.1
"""A constant on a bound is held there by its range, not by its prior, when the fit would move it this many prior
widths further out (a Newton step): a tenth of a width is well inside what a run's noise lets the fit tell apart."""


@dataclass(frozen=True)
class FitParameter:
    """One constant the fit may move: where it lives, its declared range and prior width, and why."""

    name: str
    path: str  # the profile number (``HardwareProfile.with_value``), or several joined by "+", moved together
    low: float
    high: float
    prior_width: float
    scaled: bool  # the fitted value multiplies the profile's value(s); else it replaces it
    source: str

    def apply(self, profile: HardwareProfile, value: float) -> HardwareProfile:
        for path in self.path.split("+"):
            profile = profile.with_value(path, _get(profile, path) * value if self.scaled else value)
        return profile

    def prior(self, profile: HardwareProfile) -> float:
        return 1.0 if self.scaled else float(_get(profile, self.path.split("+")[0]))


def _get(profile: HardwareProfile, path: str) -> float:
    obj = profile.at(path)
    return 1.0 if obj is None else float(obj)  # an optional factor left unset is 1: not modelled


FIT_PARAMETERS: tuple[FitParameter, ...] = (
    FitParameter("sustained compute fraction", "sustained_clock_fraction", 0.70, 1.0, 0.05, False,
                 "tensor-core throughput a long run sustains over the GEMM and attention blocks' bursts; the fit's "
                 "range, not a measurement: 1 is the bursts, 0.70 a device held well below its base clock"),
    FitParameter("device speed spread", "device_speed_spread", 0.0, 0.10, 0.02, False,
                 "relative standard deviation of speed across devices of one type, a synchronous step waiting for "
                 "the slowest of N (grows with N); Sinha et al. (SC22) report about 8% variation across a "
                 "cluster's devices, with outliers slower still"),
    FitParameter("inter-node network efficiency", "collectives.network.max_busbw_gbps", 0.40, 1.0, 0.10, True,
                 "the share of the profile's inter-node bus bandwidth a run's collectives reach (adaptive routing, "
                 "congestion from other jobs, rings that share a NIC); the fit's range"),
    FitParameter("partial-node communicator efficiency", "collectives.network.partial_node_efficiency", 0.5, 1.0,
                 0.25, False,
                 "the share of the routed bandwidth an inter-node ring keeps when its group holds some but not all "
                 "of each node's GPUs (TP 2-4 data-parallel groups): NVIDIA/nccl#1168, nccl-tests#277 (about half)"),
    FitParameter("per-op host time", "host.op_s+host.backward_op_s", 0.25, 3.0, 0.5, True,
                 "host time to issue one op, forward and backward, as a multiple of the profile's (eager PyTorch "
                 "issues an op in 5-25 us: hardware.md)"),
    FitParameter("per-collective issue time", "host.collective_s", 0.0, 3e-4, 5e-5, False,
                 "host and synchronisation time of one collective call as Megatron issues it in the loop (launch, "
                 "skew across ranks, stream waits), s; the fit's range"),
    FitParameter("overlap slowdown", "overlap_compute_slowdown", 0.0, 0.30, 0.05, False,
                 "the share by which compute slows while an NCCL kernel runs beside it (SM and memory contention)"),
)


class FittedParameter(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    path: str
    prior: float
    value: float
    low: float
    high: float
    prior_width: float
    posterior_width: float
    pinned: bool = Field(description="The runs narrowed it to under half its prior width.")
    at_range_end: bool = Field(False, description="The runs pull it past an end of its declared range, where the fit "
                                                  "held it: the model misses something they measure, or the range "
                                                  "is too narrow. False for a constant that sits on an end only "
                                                  "because its prior does and the runs cannot see it.")
    source: str


class RunFit(BaseModel):
    """What ``calibrate --from-runs`` found: the fitted constants, each run's error before and after, the
    leave-one-run-out errors the band comes from, and what the runs could not tell apart."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    runs: tuple[str, ...]
    measured_s: tuple[float, ...]
    predicted_before_s: tuple[float, ...]
    predicted_after_s: tuple[float, ...]
    parameters: tuple[FittedParameter, ...]
    leave_one_out_errors: tuple[float | None, ...] = Field(
        description="Each run predicted by a fit to the others: (predicted - measured) / measured.")
    band_below: float = Field(description="The band's fast half-width, relative.")
    band_above: float = Field(description="The band's slow half-width, relative.")
    kept_profile: bool = Field(False, description="The fit predicted left-out runs no better than the profile as it "
                                                  "is, so the profile's constants were kept.")
    band_source: str = Field("leave-one-run-out", description="What the band's half-widths are: 'leave-one-run-out' "
                                                              "(the fit's errors on runs it did not see) or 'profile "
                                                              "before the fit' (its errors on the runs, which it never "
                                                              "saw: the fit was not kept, or one run left none out).")
    warnings: tuple[str, ...] = ()


def _predict(jobs: list[Job], profile: HardwareProfile) -> np.ndarray:
    from simulator.estimator.prediction import estimate

    return np.array([estimate(job, profile).iteration_time_s for job in jobs])


def _fit(jobs: list[Job], measured: np.ndarray, base: HardwareProfile, parameters: tuple[FitParameter, ...],
         ends: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(values, posterior widths, prior values, held at a range's end) of the MAP fit of ``parameters`` to the
    runs; a constant is held at its range's end where it sits on a bound and the fit's objective still falls
    beyond it by more than ``HELD_STEP`` prior widths (a Newton step on that constant alone); ``ends=False`` leaves
    that out (all False), for fits whose values alone are wanted."""
    from scipy.optimize import least_squares

    priors = np.array([p.prior(base) for p in parameters])
    widths = np.array([p.prior_width for p in parameters])
    lows = np.array([p.low for p in parameters])
    highs = np.array([p.high for p in parameters])
    start = np.clip(priors, lows, highs)

    def profile_at(values: np.ndarray) -> HardwareProfile:
        profile = base
        for p, v in zip(parameters, values):
            profile = p.apply(profile, float(v))
        return profile

    def residuals(z: np.ndarray) -> np.ndarray:
        values = priors + z * widths
        data = np.log(_predict(jobs, profile_at(values)) / measured) / RUN_NOISE
        return np.concatenate([data, z])  # the prior: each constant one width from its prior costs as one run

    z0 = (start - priors) / widths
    zl, zh = (lows - priors) / widths, (highs - priors) / widths
    zh = np.maximum(zh, zl + 1e-9)
    # start strictly inside the box: a start on a bound (a spread whose prior is 0) stalls the trust region
    inside = np.clip(z0, zl + BOUND_TOLERANCE * (zh - zl), zh - BOUND_TOLERANCE * (zh - zl))
    result = least_squares(residuals, inside, bounds=(zl, zh), diff_step=0.05, x_scale=1.0, max_nfev=60)
    values = priors + result.x * widths
    jac = result.jac[: len(jobs)]
    precision = jac.T @ jac + np.eye(len(parameters))  # in prior widths
    posterior = np.sqrt(np.diag(np.linalg.inv(precision))) * widths
    # A constant whose prior lies on a bound (a spread of 0, an efficiency of 1) sits there whether the runs push it
    # past the bound or cannot see it at all; only the first is the runs asking for what the range does not allow.
    # The solver's Jacobian is no guide there (it drops a column held on a bound), so each constant on a bound is
    # stepped inward once, and a Newton step on it alone says how much further out the objective would take it.
    held = np.zeros(len(parameters), dtype=bool)
    for i in range(len(parameters) if ends else 0):
        span = zh[i] - zl[i]
        outward = -1.0 if result.x[i] - zl[i] <= BOUND_TOLERANCE * span else (
            1.0 if zh[i] - result.x[i] <= BOUND_TOLERANCE * span else 0.0)
        if outward:
            h = -outward * min(0.05, 0.5 * span)
            column = (residuals(result.x + h * np.eye(len(parameters))[i]) - result.fun) / h
            step = -(column @ result.fun) / (column @ column)
            held[i] = step * outward > HELD_STEP
    return values, posterior, priors, held


def _check_runs(runs: list[tuple[str, Job, float]], base: HardwareProfile) -> None:
    if not runs:
        raise ConfigError("no runs to calibrate from; give at least one training log")
    gpus = {job.cluster.gpu.name for _, job, _ in runs}
    if len(gpus) > 1:
        raise ConfigError(f"the runs are on {len(gpus)} GPU types ({', '.join(sorted(gpus))}); a profile describes "
                          "one: calibrate each GPU's runs apart")
    (gpu,) = gpus
    if gpu != base.gpu:
        raise ConfigError(f"the runs are on {gpu} but the profile {base.name!r} describes {base.gpu}; give --cluster "
                          "for the runs' GPUs or that GPU's profile")


def fit_runs(runs: list[tuple[str, Job, float]], base: HardwareProfile,
             parameters: tuple[FitParameter, ...] = FIT_PARAMETERS, leave_one_out: bool = True) -> RunFit:
    """Fit ``parameters`` of ``base`` to ``runs`` ((label, job, measured iteration s)); see the module docstring."""
    _check_runs(runs, base)
    labels = [label for label, _, _ in runs]
    jobs = [job for _, job, _ in runs]
    measured = np.array([m for _, _, m in runs], dtype=float)
    if not np.all(np.isfinite(measured)) or np.any(measured <= 0):
        raise ConfigError("a run's measured iteration time is not a positive number; check its log")
    if base.host is None:
        parameters = tuple(p for p in parameters if not p.path.startswith("host."))
    before = _predict(jobs, base)
    values, posterior, priors, held = _fit(jobs, measured, base, parameters)
    fitted = base
    for p, v in zip(parameters, values):
        fitted = p.apply(fitted, float(v))
    after = _predict(jobs, fitted)
    loo: list[float | None] = [None] * len(runs)
    if leave_one_out and len(runs) > 1:
        for i in range(len(runs)):
            keep = [k for k in range(len(runs)) if k != i]
            v_i, _, _, _ = _fit([jobs[k] for k in keep], measured[keep], base, parameters, ends=False)
            profile_i = base
            for p, v in zip(parameters, v_i):
                profile_i = p.apply(profile_i, float(v))
            loo[i] = float(_predict([jobs[i]], profile_i)[0] / measured[i] - 1)
    errors = [e for e in loo if e is not None]
    warnings = []
    kept = False
    unfitted = [float(b / m - 1) for b, m in zip(before, measured)]
    source = "leave-one-run-out"
    if not errors:
        # nothing was left out, so nothing says how the fit does on a run it did not see: the profile's own errors
        # on the runs, which it never saw, are the nearest measure of the error a plan like them carries
        errors, source = unfitted, "profile before the fit"
    elif np.mean(np.abs(errors)) >= np.mean(np.abs(unfitted)):
        # the fit must predict runs it did not see better than the profile as it is, or it is not kept: those
        # runs are then out of sample for the profile, and its own errors on them are the band
        kept, values, after, errors, source = True, np.array(priors), before, unfitted, "profile before the fit"
        warnings.append("fitted to all but one run, the constants predicted the run left out no better than the "
                        f"profile as it is ({np.mean(np.abs(loo)):.1%} against {np.mean(np.abs(unfitted)):.1%} mean "
                        "error): the profile's constants are kept, and its errors on these runs give the band")
    # a prediction above its measurement means the truth can lie below the point: that widens the fast side
    below = max([RUN_NOISE] + [e / (1 + e) for e in errors if e > 0])
    above = max([RUN_NOISE] + [-e / (1 + e) for e in errors if e < 0])
    layouts = {_layout(job) for job in jobs}
    if len(layouts) == 1:
        warnings.append("every run has one layout (TP, PP, CP, micro-batch): the fit cannot tell the layout's "
                        "costs apart, and plans of other layouts keep the regime's band")
    left_out = sum(e is not None for e in loo)
    if left_out == 0:
        warnings.append(f"{len(runs)} run(s), none left out: the band is the profile's error on the runs before the "
                        "fit, and nothing checked the fit on a run it did not see")
    elif len(runs) < 3:
        warnings.append(f"{len(runs)} run(s): the band rests on {left_out} left-out prediction(s)")
    params = tuple(FittedParameter(
        name=p.name, path=p.path, prior=float(prior), value=float(v), low=p.low, high=p.high,
        prior_width=p.prior_width, posterior_width=float(p.prior_width if kept else w),
        pinned=bool(not kept and w < PINNED_RATIO * p.prior_width), at_range_end=bool(not kept and at_end),
        source=p.source) for p, v, w, prior, at_end in zip(parameters, values, posterior, priors, held))
    return RunFit(runs=tuple(labels), measured_s=tuple(measured.tolist()), predicted_before_s=tuple(before.tolist()),
                  predicted_after_s=tuple(after.tolist()), parameters=params, leave_one_out_errors=tuple(loo),
                  band_below=float(below), band_above=float(above), kept_profile=kept, band_source=source,
                  warnings=tuple(warnings))


def _layout(job: Job) -> tuple:
    p = job.plan
    return (p.tensor_parallel_size, p.pipeline_parallel_size, p.context_parallel_size, p.micro_batch_size)


def fitted_profile(base: HardwareProfile, fit: RunFit, jobs: list[Job], name: str,
                   digests: tuple[str, ...] = ()) -> HardwareProfile:
    """``base`` with the fitted values, its provenance naming the runs (and, for logs, ``digests``: each file's
    SHA-256), and the band of the fit."""
    from simulator.estimator.regime import plan_features

    by_name = {p.name: p for p in FIT_PARAMETERS}
    profile = base
    for fp in fit.parameters:
        profile = by_name[fp.name].apply(profile, fp.value)
    profile = _with_sources(_ranges_holding_values(profile), fit)
    features = sorted({f for job in jobs
                       for f in calibration_features(plan_features(job), job.plan.tensor_parallel_size)})
    calibration = RunCalibration(
        runs=fit.runs, run_digests=tuple(digests), band_below=fit.band_below, band_above=fit.band_above, features=tuple(features),
        parameters={fp.name: fp.value for fp in fit.parameters},
        pinned=tuple(fp.name for fp in fit.parameters if fp.pinned))
    notes = (f"{base.notes} " if base.notes else "") + (
        f"Calibrated from {len(fit.runs)} measured run(s) ({', '.join(fit.runs[:5])}"
        f"{', ...' if len(fit.runs) > 5 else ''}) by simulator calibrate --from-runs, from {base.name}.")
    return profile.model_copy(update={"name": name, "source": "measured", "notes": notes,
                                      "run_calibration": calibration})


_TOP_SOURCES = {"sustained_clock_fraction": "sustained_clock_source", "device_speed_spread": "device_speed_spread_source",
                "overlap_compute_slowdown": "overlap_source"}


def _with_sources(profile: HardwareProfile, fit: RunFit) -> HardwareProfile:
    """Each fitted number's source says the fit set it, from which runs and prior: the profile's provenance."""
    runs = f"{len(fit.runs)} measured run(s) ({', '.join(fit.runs[:3])}{', ...' if len(fit.runs) > 3 else ''})"
    for fp in fit.parameters:
        text = (f"fitted by calibrate --from-runs to {runs}: {fp.name} {fp.value:.4g} (prior {fp.prior:.4g}, "
                f"range {fp.low:g}-{fp.high:g}, {'pinned by the runs' if fp.pinned else 'not pinned: near its prior'})")
        for path in fp.path.split("+"):
            *parents, name = path.split(".")
            if not parents:
                profile = profile.model_copy(update={_TOP_SOURCES[name]: text})
                continue
            block = profile.at(".".join(parents))
            if block is None:
                continue
            profile = _replace_block(profile, parents, {**block.ranges}, {**block.sources, name: text})
    return profile


def _ranges_holding_values(profile: HardwareProfile) -> HardwareProfile:
    """``profile`` with each declared band range widened to hold its fitted value: the fit's range is the one
    the value may not leave; the band's range must only hold it."""
    for path, value, low, high in profile.unpinned():
        if low <= value <= high:
            continue
        *parents, name = path.split(".")
        holder = profile.at(".".join(parents)) if parents else profile
        ranges = {**holder.ranges, name: (min(low, value), max(high, value))}
        if parents:
            profile = _replace_block(profile, parents, ranges)
        else:
            profile = profile.model_copy(update={"ranges": ranges})
    return profile


def _replace_block(profile: HardwareProfile, parents: list[str], ranges: dict,
                   sources: dict | None = None) -> HardwareProfile:
    update = {"ranges": ranges, **({"sources": sources} if sources is not None else {})}
    return profile.with_update(".".join(parents), update)


def describe(fit: RunFit) -> list[str]:
    """The fit in words: each constant, whether the runs pinned it, each run before and after."""
    name_width = max([len("constant"), *(len(p.name) for p in fit.parameters)])
    lines = [f"{'constant':<{name_width}}  {'prior':>10}  {'fitted':>10}  {'range':^18}  pinned"]
    for p in fit.parameters:
        lines.append(f"{p.name:<{name_width}}  {_fmt(p.prior):>10}  {_fmt(p.value):>10}  "
                     f"{_fmt(p.low):>8}..{_fmt(p.high):<8}  " + _verdict(p))
    lines.append("")
    labels = _run_labels(fit.runs)
    width = max(36, *(len(x) for x in labels))
    lines.append(f"{'run':<{width}} measured   before    after   left out")
    for i, label in enumerate(labels):
        m, b, a, e = fit.measured_s[i], fit.predicted_before_s[i], fit.predicted_after_s[i], fit.leave_one_out_errors[i]
        lines.append(f"{label:<{width}} {m:8.3f}s {b / m - 1:+7.1%} {a / m - 1:+7.1%} "
                     + ("      -" if e is None else f"{e:+9.1%}"))
    lines.append(f"band of the fitted profile: -{fit.band_below:.1%} / +{fit.band_above:.1%} "
                 + ("(the largest leave-one-run-out errors on each side)" if fit.band_source == "leave-one-run-out"
                    else "(the profile's largest errors on these runs before the fit, on each side)")
                 + f", never under the {RUN_NOISE:.0%} of a run's noise")
    lines += [f"warning: {w}" for w in fit.warnings]
    return lines


LABEL_WIDTH = 48  # a run's name in the table: its file name, or as much of its path as tells it apart


def _run_labels(runs: tuple[str, ...]) -> list[str]:
    """Each run's file name where those are unique, else its path; a name too long for the table keeps its end
    (where the file name is), marked with '...' where it was cut."""
    names = [Path(r).name or r for r in runs]
    chosen = names if len(set(names)) == len(names) else list(runs)
    return [x if len(x) <= LABEL_WIDTH else "..." + x[-(LABEL_WIDTH - 3):] for x in chosen]


def _verdict(p: FittedParameter) -> str:
    """Whether the runs pinned the constant; a fit that ran into its range's end says so, since the runs then
    asked for a value the range does not allow (the model misses something there, or the range is too narrow)."""
    if p.at_range_end:
        return ("yes" if p.pinned else "no") + ", at its range's end"
    if p.pinned:
        return "yes"
    return "no: stays near its prior" if abs(p.value - p.prior) <= 0.5 * p.prior_width else "no: moved, loosely held"


def _fmt(x: float) -> str:
    if abs(x) < 1e-12:  # an optimiser's zero
        return "0"
    return f"{x:.3g}" if abs(x) >= 1e-3 else f"{x * 1e6:.3g}u"
