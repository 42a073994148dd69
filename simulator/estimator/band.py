"""The band on an answer: how wrong the model has been in the plan's regime, and how far the profile's
unpinned constants move the prediction; the wider of the two on each side.

The model's own error comes first: ``simulator.estimator.regime`` gives the half-width that held the
measured time of 90% of the runs of every measured set on the plan's GPU (and widens it, naming why,
for a plan outside what those runs covered: the slow end the further, the further outside the plan lies,
and in proportion to an MFU above the best those runs reached).

Every number no measurement pins is declared in its profile block with a plausible (low, high)
range (``HardwareProfile.unpinned``). Each one is moved to either end of its range and the
closed-form screen (``simulator.schedule.screen``) measures the effect on the iteration time; the engine
then plays the two corners where every constant sits at its fast end, or at its slow end. That is
2 n screens and 2 engine runs, not a grid, and the corners bound every combination of the
constants as long as each acts the same way at any setting of the others.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Callable

from pydantic import BaseModel, ConfigDict, Field

from simulator.cost.profile import HardwareProfile
from simulator.cost.run_calibration import calibration_features
from simulator.estimator.regime import Regime, plan_features, regime_of
from simulator.graph.layers import LayerKey, OpKind, layer_graph, ordered_ops
from simulator.schedule.screen import screen
from simulator.schedule.timing import cost_model_for
from simulator.spec.plan import Job


class BandDriver(BaseModel):
    """One unpinned constant and what the ends of its range do to the iteration time."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    constant: str = Field(description="Where the constant lives in the profile, e.g. gemm.k_half.")
    value: float
    low: float
    high: float
    change_at_low: float = Field(description="Relative change of the iteration time with the constant at low.")
    change_at_high: float = Field(description="Relative change of the iteration time with the constant at high.")


class Band(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    iteration_time_s_low: float
    iteration_time_s_high: float
    drivers: tuple[BandDriver, ...] = Field(description="The constants that move the answer, largest effect first.")
    regime: Regime = Field(description="Where the plan lies relative to the measured runs, and the model's error there.")
    from_runs: tuple[str, ...] = Field((), description="The runs of a profile fitted by calibrate --from-runs whose "
                                                       "leave-one-run-out errors give the band, where the plan is like "
                                                       "them; empty where the regime's band holds.")


@dataclass(frozen=True)
class Corners:
    """The two profiles at the ends of the band (every constant at its fast, or slow, end)."""

    fast: HardwareProfile
    slow: HardwareProfile
    drivers: tuple[BandDriver, ...]


def _profile(job: Job, profile) -> HardwareProfile:
    return cost_model_for(job, profile).profile


def corners(job: Job, profile=None, top: int = 5) -> Corners:
    """Screen each unpinned constant at both ends of its range; return the two corner profiles."""
    base_profile = _profile(job, profile)
    base = screen(job, base_profile)
    return corners_by(base_profile, lambda path, end: screen(job, base_profile.with_value(path, end)) / base - 1, top,
                      unread_constants(job, base_profile))


def unread_constants(job: Job, profile: HardwareProfile) -> tuple[str, ...]:
    """The constants of ``profile`` (a path, or a block's prefix) that costing ``job`` never reads, so that
    moving them cannot move its answer: the FP8 GEMM block without an FP8 GEMM in its layers, a fused-attention
    block whose kernel no attention op runs, the pipeline exchange's host time with a single stage."""
    plan = job.plan
    keys = (LayerKey.of(plan), LayerKey.of(plan, moe=True)) if job.model.is_moe else (LayerKey.of(plan),)
    unread, backends = _unread(job.model, keys, plan.pipeline_parallel_size > 1)
    own = set(profile.attention_kernels)
    if not backends - own:  # every attention op runs a kernel of its own block, none the default
        unread += ("attention.",)
    return unread + tuple(f"attention_kernels.{name}." for name in sorted(own - backends))


@lru_cache(maxsize=1024)
def _unread(model, keys: tuple[LayerKey, ...], pipelined: bool) -> tuple[tuple[str, ...], frozenset[str]]:
    """What a layer's ops leave unread whatever the profile, and the attention backends its ops run."""
    ops = [op for key in keys for g in (layer_graph(model, key).forward, layer_graph(model, key).backward)
           for op in ordered_ops(g)]
    unread = []
    if not any(op.gemm is not None and op.gemm.fp8 for op in ops):
        unread.append("gemm_fp8.")
    if not pipelined:
        unread.append("host.pipeline_exchange_s")
    return tuple(unread), frozenset(op.kernel for op in ops if op.kind is OpKind.flash_attention)


def corners_by(base_profile: HardwareProfile, change: Callable[[str, float], float], top: int = 5,
               unread: tuple[str, ...] = ()) -> Corners:
    """The corners of one answer, given ``change(path, end)``: the relative change of its iteration time with
    the constant at ``path`` moved to ``end`` (and every other constant at its value). A constant in
    ``unread`` (``unread_constants``) changes nothing, so it is not screened."""
    fast, slow, drivers = base_profile, base_profile, []
    for path, value, low, high in base_profile.unpinned():
        changes = []
        skip = any(path == u or (u.endswith(".") and path.startswith(u)) for u in unread)
        for end in (low, high):
            changes.append(0.0 if end == value or skip else change(path, end))
        at_low, at_high = changes
        fast_end, slow_end = (low, high) if at_low <= at_high else (high, low)
        if fast_end != value:
            fast = fast.with_value(path, fast_end)
        if slow_end != value:
            slow = slow.with_value(path, slow_end)
        drivers.append(BandDriver(constant=path, value=value, low=low, high=high, change_at_low=at_low,
                                  change_at_high=at_high))
    drivers.sort(key=lambda d: -max(abs(d.change_at_low), abs(d.change_at_high)))
    moving = tuple(d for d in drivers if max(abs(d.change_at_low), abs(d.change_at_high)) > 1e-4)
    return Corners(fast, slow, moving[:top])


def run_band(job: Job, profile: HardwareProfile | None) -> tuple[float, float] | None:
    """(fast, slow) relative half-widths of a profile fitted to measured runs, for a plan whose regime features
    and TP size those runs had; None otherwise, where the regime's band holds."""
    calibration = getattr(profile, "run_calibration", None)
    if calibration is None:
        return None
    mine = calibration_features(plan_features(job), job.plan.tensor_parallel_size)
    if not set(mine) <= set(calibration.features):
        return None
    return calibration.band_below, calibration.band_above


def widened(job: Job, iteration_time_s: float, mfu: float, low: float, high: float,
            calibrated: tuple[float, float] | None = None) -> tuple[float, float, Regime]:
    """``low`` and ``high`` widened, where the model's measured error in the plan's regime reaches further (or,
    for a profile fitted to runs like the plan, that fit's own leave-one-run-out errors: ``calibrated``), and
    the slow end scaled by the plan's MFU over the best measured on its GPU where it is above it; with the
    regime."""
    t = iteration_time_s
    regime = regime_of(job, mfu)
    below, above = calibrated if calibrated is not None else (regime.half_width, regime.slow)
    # an MFU past the best measured on this GPU pays in proportion, on top of the regime's own error
    excess = mfu / regime.mfu_ceiling if regime.mfu_ceiling is not None and mfu > regime.mfu_ceiling else 1.0
    low = min(low, t * (1 - below), t)
    high = max(high, t * (1 + above) * excess, t)
    return low, high, regime


def band(job: Job, profile=None, iteration_time_s: float | None = None, mfu: float | None = None) -> Band:
    """The wider, on each side, of the model's error in the plan's regime and the iteration time at the two
    corners of the unpinned constants (played by the engine); never narrower than the answer. ``mfu``: the
    answer's (computed when the time is)."""
    from simulator.estimator.prediction import estimate

    c = corners(job, profile)
    calibrated = run_band(job, profile if isinstance(profile, HardwareProfile) else None)
    if iteration_time_s is None or mfu is None:
        est = estimate(job, profile)
        iteration_time_s = est.iteration_time_s if iteration_time_s is None else iteration_time_s
        mfu = est.mfu if mfu is None else mfu
    if calibrated is not None:
        # runs like this plan measured what the unpinned constants do to it: their left-out errors are the band
        fast_s = slow_s = iteration_time_s
    else:
        fast_s, slow_s = estimate(job, c.fast).iteration_time_s, estimate(job, c.slow).iteration_time_s
    low, high, regime = widened(job, iteration_time_s, mfu, fast_s, slow_s, calibrated)
    runs = profile.run_calibration.runs if calibrated is not None else ()
    return Band(iteration_time_s_low=low, iteration_time_s_high=high, drivers=c.drivers, regime=regime, from_runs=runs)


def estimate_with_band(job: Job, profile=None, tokens: float | None = None):
    """``estimate`` with the band filled in: iteration time and training days at both corners."""
    from simulator.estimator.prediction import estimate

    return with_band(job, estimate(job, profile, tokens), profile)


def with_band(job: Job, est, profile=None):
    """``est`` (an ``Estimate`` of ``job``) with its band filled in."""
    return banded(est, band(job, profile, est.iteration_time_s, est.mfu))


def banded(est, b: Band):
    """``est`` with the band ``b`` written into its band fields (days scaled as the time)."""
    scale = (est.training_days / est.iteration_time_s) if est.training_days is not None else None
    return est.model_copy(update={
        "iteration_time_s_low": b.iteration_time_s_low,
        "iteration_time_s_high": b.iteration_time_s_high,
        "training_days_low": None if scale is None else b.iteration_time_s_low * scale,
        "training_days_high": None if scale is None else b.iteration_time_s_high * scale,
        "band_drivers": tuple(d.model_dump() for d in b.drivers),
        "validation_regime": b.regime.name,
        "outside_regime_reasons": b.regime.outside,
        "band_from_runs": b.from_runs,
    })
