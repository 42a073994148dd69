"""Predicted against measured for runs a user already made, from their Megatron training logs.

A run's log gives its steady-state iteration time (``simulator.measure.megatron_log``: the stated rule for
warm-up, saves, evaluation and batch ramp-up, a median and its 10th-90th percentile spread) and, where
``--timing-log-level`` printed them, Megatron's ``forward-backward`` and ``optimizer`` timers. The job the run
played comes from its arguments (or its launch script) through the same reader as ``--megatron-args``; the
prediction is ``simulate_job`` with the profile's band, so each run says whether its measured time falls
inside the band the tool would have given, and in which measured regime the plan lies.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from simulator.measure.megatron_log import MeasuredTime, MegatronLog
from simulator.measure.validate import Comparison, compare
from simulator.spec.plan import Job


class PhaseCheck(BaseModel):
    """One of Megatron's timers, per iteration, on the slowest rank: predicted against measured."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    phase: str
    predicted_s: float | None
    measured_s: float
    relative_error: float | None


class RunCheck(BaseModel):
    """One logged run: the plan it ran, its measured time, the prediction, the band and the regime."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    run: str = Field(description="The log's path.")
    flavour: str = Field(description="megatron-lm, megatron-bridge or megatron (iteration lines only).")
    layout: str = Field(description="TP, PP (virtual stages), CP, DP, micro-batch, global batch and GPUs.")
    num_gpus: int
    iteration_time_s: Comparison = Field(description="Predicted against the measured median.")
    measured_p10_s: float
    measured_p90_s: float
    intervals_kept: int
    iterations_kept: int
    intervals_dropped: dict[str, int]
    band_low_s: float | None
    band_high_s: float | None
    inside_band: bool | None = Field(description="Whether the measured median lies inside the band.")
    regime: str | None = Field(description="The measured regime the plan lies in; None outside every one.")
    outside_regime_reasons: tuple[str, ...] = ()
    band_from_runs: tuple[str, ...] = Field((), description="The runs of a profile fitted by calibrate --from-runs "
                                                             "whose errors give the band (empty: the regime's band).")
    in_sample: bool = Field(False, description="The run is one the profile was fitted to (calibrate --from-runs): its "
                                               "error is in sample, not a check of the fit.")
    mfu: float = Field(description="The prediction's model FLOPs utilisation (full s x s attention count).")
    phases: list[PhaseCheck] = Field(default_factory=list)
    peak_allocated_bytes: Comparison | None = Field(
        None, description="The memory plan's peak less its reserve against the log's 'max allocated'.")
    notes: list[str] = Field(default_factory=list)


def layout_of(job: Job) -> str:
    p = job.plan
    vp = f" (VP {p.virtual_pipeline_stages})" if p.virtual_pipeline_stages > 1 else ""
    cp = f" CP {p.context_parallel_size}" if p.context_parallel_size > 1 else ""
    return (f"TP {p.tensor_parallel_size} PP {p.pipeline_parallel_size}{vp}{cp} DP {p.data_parallel_size}, "
            f"mbs {p.micro_batch_size}, gbs {p.global_batch_size}, {p.num_gpus} GPUs")


def check_run(job: Job, log: MegatronLog, measured: MeasuredTime, profile=None,
              notes: list[str] | None = None) -> RunCheck:
    """The prediction for ``job`` beside what ``log`` measured (``measured``, by the stated rule)."""
    from simulator.estimator.band import with_band
    from simulator.estimator.prediction import simulate_job

    notes = list(notes or [])
    if measured.global_batch_size is not None and measured.global_batch_size != job.plan.global_batch_size:
        notes.append(f"the log's global batch is {measured.global_batch_size}, the plan's "
                     f"{job.plan.global_batch_size}: the arguments and the iteration lines disagree")
    sim = simulate_job(job, profile)
    est = with_band(job, sim.estimate, profile)
    iteration = compare(est.iteration_time_s, measured.iteration_time_s)
    low, high = est.iteration_time_s_low, est.iteration_time_s_high
    inside = None if low is None or high is None else bool(low <= measured.iteration_time_s <= high)
    phases = []
    optimizer_s = est.breakdown.optimizer_s
    predicted_phase = {"optimizer": optimizer_s, "forward-backward": est.iteration_time_s - optimizer_s}
    for name, value_ms in measured.timers_ms.items():
        if name in predicted_phase:
            c = compare(predicted_phase[name], value_ms / 1e3)
            phases.append(PhaseCheck(phase=name, predicted_s=c.predicted, measured_s=value_ms / 1e3,
                                     relative_error=c.relative_error))
    peak = None
    if log.max_allocated_bytes is not None:
        stage0 = est.memory.stages[0]
        peak = compare(stage0.peak_bytes - stage0.reserve_bytes, log.max_allocated_bytes)
        notes.append("peak memory: rank 0's 'max allocated' (first pipeline stage) against the memory plan's peak "
                     "less its reserve, which torch's allocator statistics do not count")
    in_sample = fitted_to(getattr(profile, "run_calibration", None), log.source)
    if in_sample:
        notes.append("the profile was fitted to this run (calibrate --from-runs): its error is in sample, not a check "
                     "of the fit; validate runs it did not see")
    if measured.intervals_kept < 5:
        notes.append(f"only {measured.intervals_kept} logged intervals are past warm-up, saves and evaluation: "
                     "the measured time rests on few samples")
    return RunCheck(
        run=log.source, flavour=log.flavour, layout=layout_of(job), num_gpus=job.plan.num_gpus,
        iteration_time_s=iteration, measured_p10_s=measured.p10_s, measured_p90_s=measured.p90_s,
        intervals_kept=measured.intervals_kept, iterations_kept=measured.iterations_kept,
        intervals_dropped=measured.dropped, band_low_s=low, band_high_s=high, inside_band=inside,
        regime=est.validation_regime, outside_regime_reasons=tuple(est.outside_regime_reasons),
        band_from_runs=tuple(est.band_from_runs), in_sample=in_sample, mfu=est.mfu,
        phases=phases, peak_allocated_bytes=peak, notes=notes)


def log_digest(path: str | Path) -> str:
    """SHA-256 of a log file, read in blocks (a long run's log is hundreds of megabytes)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fitted_to(calibration, source: str) -> bool:
    """Whether the log at ``source`` is one of the runs ``calibration`` was fitted to: the same content where the
    calibration kept the logs' digests, else the same path."""
    if calibration is None:
        return False
    if calibration.run_digests:
        try:
            return log_digest(source) in calibration.run_digests
        except OSError:
            return False
    return any(Path(source).resolve() == Path(run).resolve() for run in calibration.runs)


class RunsSummary(BaseModel):
    """Many runs at once: the error's mean, bias and the band's coverage."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    runs: int
    mean_absolute_error: float
    bias: float = Field(description="Mean signed error (predicted - measured) / measured; negative: optimistic.")
    inside_band: int
    layouts: int = Field(description="Distinct (TP, PP, CP, DP, micro-batch) layouts among the runs.")
    in_sample: int = Field(0, description="Runs the profile was fitted to, whose errors are in sample.")


def summarise(checks: list[RunCheck]) -> RunsSummary | None:
    errors = [c.iteration_time_s.relative_error for c in checks if c.iteration_time_s.relative_error is not None]
    if not errors:
        return None
    return RunsSummary(runs=len(checks), mean_absolute_error=sum(map(abs, errors)) / len(errors),
                       bias=sum(errors) / len(errors), inside_band=sum(bool(c.inside_band) for c in checks),
                       layouts=len({c.layout.split(", gbs")[0] for c in checks}),
                       in_sample=sum(c.in_sample for c in checks))
