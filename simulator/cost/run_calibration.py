"""What a profile fitted to a user's own runs carries (``simulator calibrate --from-runs``): which runs, what
the fit set, and the band its leave-one-run-out errors give, for plans like those runs."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class RunCalibration(BaseModel):
    """The provenance and band of a profile fitted to measured runs."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    runs: tuple[str, ...] = Field(description="The runs fitted to (their logs' paths or labels).")
    run_digests: tuple[str, ...] = Field((), description="SHA-256 of each run's log, in the order of runs (empty where "
                                                          "the runs were not files): how validate knows a log is one the "
                                                          "profile was fitted to, wherever the file now lies.")
    parameters: dict[str, float] = Field(description="The fitted constants by name, as the fit reported them.")
    pinned: tuple[str, ...] = Field(description="The constants the runs pinned; the rest stayed near their priors.")
    band_below: float = Field(ge=0, lt=1, description="The band's fast half-width, relative: the largest "
                                                      "leave-one-run-out error of a prediction that was slow (or the "
                                                      "profile's before the fit, where that was not kept or one run "
                                                      "left none out).")
    band_above: float = Field(ge=0, lt=10, description="The band's slow half-width, relative: the largest such error of "
                                                       "a prediction that was fast.")
    features: tuple[str, ...] = Field(description="The regime features ('name=value') the runs had; a plan with "
                                                  "one outside them keeps the regime's band.")


def calibration_features(features: dict[str, str], tensor_parallel_size: int) -> tuple[str, ...]:
    """A plan's features as a calibration stores them: the regime's, and its TP size (a run set of one TP cannot
    speak for another's collectives)."""
    return tuple(sorted([f"{k}={v}" for k, v in features.items()] + [f"tensor_parallel={tensor_parallel_size}"]))
