"""Predicted against measured for one reference run: iteration time, per-layer times, activation
bytes per layer and peak memory, each with its relative error.

Memory comes from the layer graph (``simulator.layers``) and the memory plan; times from the
engine (``simulator.estimate`` / ``simulator.timing``) with a hardware profile. The engine is
imported only here, inside the function, so a record can be checked for memory alone.
"""

from __future__ import annotations

from statistics import mean
from typing import Any

from pydantic import BaseModel, ConfigDict

from simulator._io import build
from simulator.errors import SimulatorError
from simulator.hardware import load_cluster
from simulator.layers import transformer_layer
from simulator.plan import Job, RecomputeGranularity
from simulator.run_record import RunRecord


class Comparison(BaseModel):
    """One quantity; ``relative_error`` = (predicted - measured) / measured, null when either is missing."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    predicted: float | None
    measured: float | None
    relative_error: float | None


def compare(predicted: float | None, measured: float | None) -> Comparison:
    if predicted is None or measured is None:
        error = None
    elif measured == 0:
        error = 0.0 if predicted == 0 else None
    else:
        error = (predicted - measured) / measured
    return Comparison(predicted=predicted, measured=measured, relative_error=error)


class LayerComparison(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    index: int
    stage: int
    recompute_granularity: RecomputeGranularity
    forward_s: Comparison
    backward_s: Comparison
    recompute_s: Comparison
    activation_bytes: Comparison


class Validation(BaseModel):
    """Everything ``simulator validate`` shows; ``iteration_time_s`` and ``activation_bytes_per_layer``
    (the mean over layers) are the headline figures."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    run: str
    device: str
    iteration_time_s: Comparison
    activation_bytes_per_layer: Comparison
    layers: list[LayerComparison]
    peak_memory_bytes_per_stage: list[Comparison] | None
    notes: list[str]


def job_of(record: RunRecord) -> Job:
    """The job the run played, checked again against its cluster."""
    return build(Job, {"model": record.model, "cluster": load_cluster(record.cluster), "plan": record.plan},
                 f"job of run record on {record.cluster}")


def _with_granularity(job: Job, granularity: RecomputeGranularity) -> Job:
    recompute = job.plan.recompute.model_copy(update={"granularity": granularity})
    return job.model_copy(update={"plan": job.plan.model_copy(update={"recompute": recompute})})


def _time_predictions(job: Job, record: RunRecord, profile: Any) -> tuple[float | None, dict, list[str]]:
    """Iteration time and (forward, backward, recompute) per granularity, or None with the reason."""
    try:
        from simulator.estimate import estimate
        from simulator.timing import layer_times
    except ImportError as exc:
        return None, {}, [f"no time predictions: the engine is not available ({exc})"]
    iteration = estimate(job, profile).iteration_time_s
    per_layer = {}
    for g in sorted({layer.recompute_granularity for layer in record.layers}, key=lambda g: g.value):
        lt = layer_times(_with_granularity(job, g), profile)
        per_layer[g] = (lt.forward_s, lt.backward_s, lt.recompute_s)
    return iteration, per_layer, []


def _load_profile(path: str | None):
    if path is None:
        return None
    from simulator.profile import load_profile

    return load_profile(path)


def validate(record: RunRecord, profile_path: str | None = None, run: str = "", predict_times: bool = True) -> Validation:
    """Compare a run with the simulator's predictions for the same job.

    Without ``profile_path`` the engine's default profile for the cluster is used; if there is
    none, the time columns are left empty with a note (memory needs no profile). With
    ``predict_times=False`` the engine is not run at all.
    """
    job = job_of(record)
    notes: list[str] = []
    iteration, per_layer = None, {}
    if not predict_times:
        notes.append("time predictions not requested")
    else:
        try:
            iteration, per_layer, why = _time_predictions(job, record, _load_profile(profile_path))
            notes += why
        except SimulatorError as exc:
            if profile_path is not None:
                raise
            notes.append(f"no time predictions without --profile: {' '.join(str(exc).split())}")
    layers = []
    for layer in record.layers:
        f, b, r = per_layer.get(layer.recompute_granularity, (None, None, None))
        modelled = transformer_layer(job.model, job.plan).activation_bytes(layer.recompute_granularity)
        layers.append(LayerComparison(
            index=layer.index, stage=layer.stage, recompute_granularity=layer.recompute_granularity,
            forward_s=compare(f, layer.forward_s), backward_s=compare(b, layer.backward_s),
            recompute_s=compare(r, layer.recompute_s), activation_bytes=compare(modelled, layer.activation_bytes),
        ))
    if any(layer.norm_statistics_bytes for layer in record.layers):
        notes.append("measured activation bytes leave out LayerNorm's fp32 mean and 1/std per token "
                     f"({record.layers[0].norm_statistics_bytes} bytes in layer 0), which the model omits")
    peaks = None
    if record.peak_allocated_bytes_per_stage is not None:
        from simulator.memory import memory_plan

        stages = memory_plan(job).stages
        # max_memory_allocated does not see the CUDA context, workspaces or fragmentation
        peaks = [compare(s.peak_bytes - s.reserve_bytes, measured)
                 for s, measured in zip(stages, record.peak_allocated_bytes_per_stage)]
        notes.append("predicted peak memory is the memory plan's peak less its reserve "
                     "(CUDA context, workspaces, fragmentation), which torch.cuda.max_memory_allocated does not count")
    else:
        notes.append("no peak memory: the run was on CPU")
    return Validation(
        run=run,
        device=record.device,
        iteration_time_s=compare(iteration, mean(record.timed_iteration_times_s)),
        activation_bytes_per_layer=compare(mean(x.activation_bytes.predicted for x in layers),
                                           mean(x.activation_bytes.measured for x in layers)),
        layers=layers,
        peak_memory_bytes_per_stage=peaks,
        notes=notes,
    )
