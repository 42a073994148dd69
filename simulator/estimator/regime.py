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

A plan with a feature no measured run on its GPU had, or a GPU no measured run used, is outside every
regime: its half-width is the widest measured one times ``OUTSIDE_WIDENING``, and each reason is named.
A plan whose MFU is above the best measured on its GPU gets a slow end no faster than that MFU.
"""

from __future__ import annotations

import json
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
    half_width: float = Field(description="Relative half-width of the model-error band for this plan.")
    outside: tuple[str, ...] = Field(description="Why the plan lies outside every measured regime (empty inside).")
    mfu_ceiling: float | None = Field(description="The best MFU a measured run on this GPU reached (None: none measured).")


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


def regime_of(job: Job, mfu: float | None = None) -> Regime:
    """The regime of ``job`` (whose predicted MFU is ``mfu``) and its band half-width."""
    table = band_table()
    widest = max(g["half_width"] for g in table["gpus"].values())
    gpu = table["gpus"].get(job.cluster.gpu.name)
    if gpu is None:
        return Regime(name=None, half_width=widest * OUTSIDE_WIDENING, mfu_ceiling=None,
                      outside=(f"no measured run on {job.cluster.gpu.name}",))
    reasons = [f"{feature} {value}: no measured run on {job.cluster.gpu.name} had it"
               for feature, value in plan_features(job).items() if value not in gpu["covered"][feature]]
    if mfu is not None and mfu > gpu["max_measured_mfu"]:
        reasons.append(f"MFU {mfu:.1%} above the best measured on {job.cluster.gpu.name} ({gpu['max_measured_mfu']:.1%})")
    if reasons:
        return Regime(name=None, half_width=widest * OUTSIDE_WIDENING, outside=tuple(reasons),
                      mfu_ceiling=gpu["max_measured_mfu"])
    return Regime(name=f"{job.cluster.gpu.name}: {', '.join(sorted(gpu['sets']))}", half_width=gpu["half_width"],
                  outside=(), mfu_ceiling=gpu["max_measured_mfu"])


def narrowest_half_width(gpu_name: str) -> float:
    """The smallest half-width any plan on ``gpu_name`` can get (the search's bound on a plan not yet played)."""
    table = band_table()
    gpu = table["gpus"].get(gpu_name)
    return gpu["half_width"] if gpu is not None else max(g["half_width"] for g in table["gpus"].values()) * OUTSIDE_WIDENING
