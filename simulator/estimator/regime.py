"""The regime a plan lies in, and how wrong the model has been there: the half-width of the band.

A regime is a GPU kind and the features of a plan that change what the model must get right: how the
data-parallel state is sharded, the pipeline schedule, the precision, context and expert parallelism.
(Kernel choices such as fused attention are not among them: their costs come from per-kernel
measurements, not from the end-to-end runs.) ``python -m calibration.fit_band`` predicts every measured run in the repository and
writes, per GPU kind, which values of those features the measured runs covered, the best MFU any of
them reached, and the band's half-width: the largest, over the measured sets, of each set's split-conformal
90% quantile of |measured / predicted - 1| (its ceil((n + 1) 0.9)-th smallest, with each set a calibration
split, so that one large set cannot hide another's error). ``calibration/published/model_error_band.json`` holds the
result, with the coverage of every set when it is left out of the fit.

A plan with a feature no measured run on its GPU had, a GPU no measured run used, or more GPUs than the largest
measured run on its GPU is outside every regime, and each reason is named. Its fast end is the widest measured
half-width times ``OUTSIDE_WIDENING``; its slow end grows with how far outside it lies (``outside_steps``): each
feature no measured run had is one step, and so is each doubling of the GPUs past the largest measured run, and
every step adds ``OUTSIDE_WIDENING - 1`` widest half-widths. The model's misses outside the measured regimes have
been one-sided (measured slower than predicted: hidden collectives, stragglers, kernels that reach less than
the GEMM ceiling), which is why only the slow end keeps growing. A plan whose MFU is above the best measured on
its GPU pays in proportion: its slow end is scaled by its MFU over that best, so that a search ranking by the
slow end stops preferring a plan for an MFU no measured run reached (with nothing else outside, the band is
the regime's own, so that the slow end moves continuously across that MFU).
"""

from __future__ import annotations

import json
import math
from functools import lru_cache
from importlib import resources

from pydantic import BaseModel, ConfigDict, Field

from simulator.spec.plan import Job

BAND_FILE = "model_error_band.json"

OUTSIDE_WIDENING = 2.0
"""Unpinned: how much further than in the measured regimes the model may err outside them. No
measurement pins it (nothing outside the regimes is measured here); 2 is a judgement, plausible from
1.5 to 3: the out-of-regime errors seen so far (e.g. a sharded run's hidden gathers) were up to about
twice the in-regime ones. Source: none; declared here so that the band says how it was widened."""


class Regime(BaseModel):
    """Where a plan lies relative to the measured runs, and the band's half-width there."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str | None = Field(description="The measured regime the plan lies in, e.g. 'A100-SXM4-80GB: "
                                         "vtrain-single-node, vtrain-multi-node-dev, korthikanti2022'; None outside.")
    half_width: float = Field(description="Relative half-width of the model-error band on the fast side (and, in a "
                                           "measured regime, on both sides).")
    slow_half_width: float | None = Field(None, description="Relative half-width on the slow side, before any MFU "
                                                            "above the best measured scales it (None: half_width).")
    outside: tuple[str, ...] = Field(description="Why the plan lies outside every measured regime (empty inside).")
    outside_steps: float = Field(0.0, ge=0, description="How far outside every measured regime the plan lies: one "
                                                        "per feature no measured run had, one per doubling of the "
                                                        "GPUs past the largest measured run (0 inside).")
    mfu_ceiling: float | None = Field(description="The best MFU a measured run on this GPU reached (None: none measured).")

    @property
    def slow(self) -> float:
        """The slow side's half-width (the fast side's where none is set)."""
        return self.half_width if self.slow_half_width is None else self.slow_half_width


def plan_features(job: Job) -> dict[str, str]:
    """The features a regime is made of, as the strings the band file stores."""
    p = job.plan
    return {
        "sharding": p.sharding.value,
        "schedule": "interleaved" if p.virtual_pipeline_stages > 1 else p.schedule.value,
        "precision": "fp8" if p.fp8_format is not None else p.precision.value,
        "context_parallel": "yes" if p.context_parallel_size > 1 else "no",
        "experts": "yes" if job.model.is_moe else "no",
    }


@lru_cache(maxsize=1)
def band_table() -> dict:
    """The fitted band file (``python -m calibration.fit_band`` writes it)."""
    path = resources.files("calibration") / "published" / BAND_FILE
    return json.loads(path.read_text(encoding="utf-8"))


def outside_slow_half_width(widest: float, steps: float) -> float:
    """The slow side's half-width ``steps`` outside the measured regimes (at least one step's): each step adds
    ``OUTSIDE_WIDENING - 1`` times the widest measured half-width to it."""
    return widest * (1 + (OUTSIDE_WIDENING - 1) * max(steps, 1.0))


def _outside(widest: float, reasons: list[str], steps: float, ceiling: float | None) -> Regime:
    return Regime(name=None, half_width=widest * OUTSIDE_WIDENING, outside=tuple(reasons), outside_steps=steps,
                  slow_half_width=outside_slow_half_width(widest, steps), mfu_ceiling=ceiling)


def regime_of(job: Job, mfu: float | None = None) -> Regime:
    """The regime of ``job`` (whose predicted MFU is ``mfu``) and its band's half-widths."""
    table = band_table()
    widest = max(g["half_width"] for g in table["gpus"].values())
    features = plan_features(job)
    name = job.cluster.gpu.name
    gpu = table["gpus"].get(name)
    if gpu is None:
        # no run on this GPU: a feature no run on any GPU had lies a step further out
        unmeasured = [f"{feature} {value}: no measured run on any GPU had it" for feature, value in features.items()
                      if all(value not in g["covered"][feature] for g in table["gpus"].values())]
        return _outside(widest, [f"no measured run on {name}", *unmeasured], 1.0 + len(unmeasured), None)
    reasons = [f"{feature} {value}: no measured run on {name} had it"
               for feature, value in features.items() if value not in gpu["covered"][feature]]
    steps = float(len(reasons))
    gpus = job.plan.num_gpus
    if gpus > gpu["max_gpus"]:
        reasons.append(f"{gpus:,} GPUs, more than the largest measured run on {name} ({gpu['max_gpus']:,})")
        steps += math.log2(gpus / gpu["max_gpus"])
    if mfu is not None and mfu > gpu["max_measured_mfu"]:
        reasons.append(f"MFU {mfu:.1%} above the best measured on {name} ({gpu['max_measured_mfu']:.1%})")
    if steps:
        return _outside(widest, reasons, steps, gpu["max_measured_mfu"])
    if reasons:
        # only the MFU is past what was measured: the regime's own error, and the excess paid in proportion
        # (``band.widened``), so that the slow end moves continuously across the best measured MFU
        return Regime(name=None, half_width=gpu["half_width"], mfu_ceiling=gpu["max_measured_mfu"],
                      outside=tuple(reasons))
    return Regime(name=f"{name}: {', '.join(sorted(gpu['sets']))}", half_width=gpu["half_width"],
                  outside=(), mfu_ceiling=gpu["max_measured_mfu"])
