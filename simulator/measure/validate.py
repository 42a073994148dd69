"""Predicted against measured for one reference run: iteration time, each of Megatron's timer phases
per pipeline stage with the run's spread, the time outside the layers, per-layer times, activation
bytes per layer and peak memory, each with its relative error; checks that the run matches the
profile (device, threads); and a one-line verdict.

Memory comes from the layer graph (``simulator.graph.layers``) and the memory plan; times from the
engine (``simulator.estimator.prediction`` / ``simulator.schedule.timing``) with a hardware profile. The engine is
imported only here, inside the function, so a record can be checked for memory alone. The
phases are the engine's own stage timeline cut as Megatron's timers cut a step: the forward and
backward steps, the idle time waiting on pipeline transfers, the gradient reductions after the
last backward (sequence parallelism's and the tied embedding's costed as the engine costs them,
the data-parallel buckets the rest), and the optimizer.
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import mean
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from simulator.graph.layers import transformer_layer
from simulator.measure.run_record import RunRecord
from simulator.spec._io import build
from simulator.spec.errors import SimulatorError
from simulator.spec.hardware import load_cluster
from simulator.spec.plan import Job, RecomputeGranularity


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


class PhaseComparison(BaseModel):
    """One of Megatron's timer phases on one pipeline stage: predicted against the mean over the run's timed
    iterations and the stage's ranks, with the range those measurements span."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    phase: str = Field(description="The timer's name ('pipeline send/recv' sums the four send/receive timers).")
    stage: int
    predicted: float | None
    measured: float | None
    relative_error: float | None
    measured_min: float | None = Field(None, description="Smallest value over timed iterations and the stage's ranks.")
    measured_max: float | None = None

    @property
    def spread(self) -> float | None:
        """(max - min) / mean of the measurements: how far the run itself moves."""
        if self.measured_min is None or self.measured_max is None or not self.measured:
            return None
        return (self.measured_max - self.measured_min) / self.measured


class Check(BaseModel):
    """Whether the run matches the profile it is validated against; ``ok`` None = informational."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    ok: bool | None
    detail: str


class Validation(BaseModel):
    """Everything ``simulator validate`` shows; ``iteration_time_s`` and ``activation_bytes_per_layer``
    (the mean over layers) are the headline figures, ``verdict`` the one line to decide from."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    run: str
    device: str
    iteration_time_s: Comparison
    activation_bytes_per_layer: Comparison
    layers: list[LayerComparison]
    peak_memory_bytes_per_stage: list[Comparison] | None
    notes: list[str]
    iteration_time_spread: float | None = Field(
        None, description="(max - min) / mean of the timed iteration times: the run's own noise.")
    phases: list[PhaseComparison] = Field(
        default_factory=list, description="Megatron's timer phases per stage, predicted against measured.")
    outside_layers_s: Comparison | None = Field(
        None, description="Iteration time less the transformer layers' forward, backward and recompute on the "
                          "critical stage: embedding, loss, communication outside the layers, optimizer, idle.")
    checks: list[Check] = Field(default_factory=list, description="Does the run match the profile (device, threads)?")
    verdict: str = Field("", description="One line: within the run's noise, or where the error lives.")


def job_of(record: RunRecord) -> Job:
    """The job the run played, checked again against its cluster."""
    return build(Job, {"model": record.model, "cluster": load_cluster(record.cluster), "plan": record.plan},
                 f"job of run record on {record.cluster}")


def _with_granularity(job: Job, granularity: RecomputeGranularity) -> Job:
    recompute = job.plan.recompute.model_copy(update={"granularity": granularity})
    return job.model_copy(update={"plan": job.plan.model_copy(update={"recompute": recompute})})


P2P_TIMERS = ("forward-recv", "forward-send", "backward-recv", "backward-send")
PHASES = ("forward-compute", "backward-compute", "pipeline send/recv", "grads-all-reduce",
          "layernorm-grads-all-reduce", "embedding-grads-all-reduce", "optimizer")


@dataclass(frozen=True)
class _Predicted:
    iteration_s: float
    critical_stage: int
    per_layer: dict  # granularity -> (forward, backward, recompute)
    phases: list[dict[str, float]]  # per stage, phase -> seconds


def _time_predictions(job: Job, record: RunRecord, profile: Any) -> tuple[_Predicted | None, list[str]]:
    """The engine's iteration, its phases per stage and the per-layer times, or None with the reason."""
    try:
        from simulator.estimator.prediction import simulate_job
        from simulator.schedule.stage_work import build_work, embedding_group, sequence_parallel_grad_bytes
        from simulator.schedule.timing import cost_model_for, layer_times
    except ImportError as exc:
        return None, [f"no time predictions: the engine is not available ({exc})"]
    from simulator.cost import Group
    from simulator.graph.layers import CollectiveKind

    sim = simulate_job(job, profile)
    cost = cost_model_for(job, profile)
    work = build_work(job, cost, sim.layer, sim.extras)
    plan, m = job.plan, job.plan.num_micro_batches
    p, t = plan.pipeline_parallel_size, plan.tensor_parallel_size
    tied = not job.model.untie_embeddings_and_output_weights and p > 1
    embedding_bytes = job.model.vocab_size * job.model.hidden_size // t * plan.grad_bytes
    phases = []
    stages = sim.engine.stages
    # each reduction's timer starts after a barrier of every rank (Megatron's --barrier-with-L1-time), so the
    # earlier stage's wait for the later one is in no phase: it is in the iteration's time only
    for s, (sw, r) in enumerate(zip(work.stages, stages)):
        layernorm = cost.collective_time_s(CollectiveKind.all_reduce, sequence_parallel_grad_bytes(job, s),
                                           Group(size=t, stride=1))
        embedding = 0.0
        if tied and s in (0, p - 1):
            embedding = cost.collective_time_s(CollectiveKind.all_reduce, embedding_bytes,
                                               embedding_group(job))
        after_backward = r.grads_ready_s - r.last_backward_end_s
        phases.append({
            "forward-compute": m * sum(sw.forward_s), "backward-compute": m * sum(sw.backward_s),
            "pipeline send/recv": r.wait_s,
            "grads-all-reduce": max(after_backward - layernorm - embedding, 0.0),
            "layernorm-grads-all-reduce": layernorm, "embedding-grads-all-reduce": embedding,
            "optimizer": r.optimizer_s,
        })
    per_layer = {}
    for g in sorted({layer.recompute_granularity for layer in record.layers}, key=lambda g: g.value):
        lt = layer_times(_with_granularity(job, g), profile)
        per_layer[g] = (lt.forward_s, lt.backward_s, lt.recompute_s)
    return _Predicted(sim.estimate.iteration_time_s, sim.estimate.critical_stage, per_layer, phases), []


def _stage_of_rank(record: RunRecord) -> list[int]:
    plan = record.plan
    return [r // (plan.tensor_parallel_size * plan.data_parallel_size) for r in range(record.world_size)]


def _measured_phase(record: RunRecord, phase: str, stage: int) -> tuple[float, float, float] | None:
    """(mean, min, max) of a phase over the timed iterations and the stage's ranks, or None without timers."""
    if not record.timers:
        return None
    names = P2P_TIMERS if phase == "pipeline send/recv" else (phase,)
    if any(n not in record.timers for n in names):
        return None
    ranks = [r for r, s in enumerate(_stage_of_rank(record)) if s == stage]
    first = record.warmup_iterations if record.warmup_iterations < len(record.iteration_times_s) else 0
    values = [sum(record.timers[n][i][r] for n in names)
              for i in range(first, len(record.iteration_times_s)) for r in ranks]
    return mean(values), min(values), max(values)


def _plan_has(record: RunRecord, phase: str) -> bool:
    plan = record.plan
    return {"pipeline send/recv": plan.pipeline_parallel_size > 1,
            "grads-all-reduce": plan.data_parallel_size > 1,
            "layernorm-grads-all-reduce": plan.sequence_parallel and plan.tensor_parallel_size > 1,
            "embedding-grads-all-reduce": plan.pipeline_parallel_size > 1
            and not record.model.untie_embeddings_and_output_weights}.get(phase, True)


def _phases(record: RunRecord, predicted: _Predicted | None) -> list[PhaseComparison]:
    """Each phase the plan has, per stage; the predicted column alone for a record without timers."""
    if not record.timers and predicted is None:
        return []
    out = []
    for stage in range(record.plan.pipeline_parallel_size):
        for phase in PHASES:
            measured = _measured_phase(record, phase, stage) or (None, None, None)
            pred = predicted.phases[stage][phase] if predicted is not None else None
            if not _plan_has(record, phase) or (not measured[2] and not pred):
                continue  # a phase this plan (or this stage) does not have
            c = compare(pred, measured[0])
            out.append(PhaseComparison(phase=phase, stage=stage, predicted=c.predicted, measured=c.measured,
                                       relative_error=c.relative_error, measured_min=measured[1],
                                       measured_max=measured[2]))
    return out


def _inside_layers(record: RunRecord, stage: int, per_layer: dict | None) -> tuple[float | None, float | None]:
    """Predicted and measured time in the stage's transformer layers per iteration."""
    m = record.plan.num_micro_batches
    layers = [x for x in record.layers if x.stage == stage]
    measured = None
    if layers and all(x.forward_s is not None and x.backward_s is not None for x in layers):
        measured = m * sum(x.forward_s + x.backward_s + (x.recompute_s or 0.0) for x in layers)
    predicted = None
    if per_layer:
        predicted = m * sum(sum(per_layer[x.recompute_granularity]) for x in layers)
    return predicted, measured


def _load_profile(path: str | None):
    if path is None:
        return None
    from simulator.cost.profile import load_profile

    return load_profile(path)


def _checks(record: RunRecord, profile) -> list[Check]:
    """Does the run match the profile: the same kind of device, as many threads per rank as were measured."""
    out = []
    kind = "cuda" if record.device.startswith("cuda") else "cpu"
    if profile is not None and profile.device.kind is not None:
        ok = profile.device.kind == kind
        out.append(Check(name="device", ok=ok, detail=f"the run was on {kind}, the profile measured on "
                                                      f"{profile.device.kind}" + ("" if ok else "; calibrate there")))
    if profile is not None and profile.device.threads is not None and record.threads_per_rank is not None:
        ok = profile.device.threads == record.threads_per_rank
        out.append(Check(name="threads", ok=ok,
                         detail=f"{record.threads_per_rank} thread(s) per rank in the run, {profile.device.threads} "
                                f"when the profile was measured" + ("" if ok else
                                                                   "; rerun with --threads "
                                                                   f"{profile.device.threads} or calibrate again")))
    elif kind == "cpu" and record.threads_per_rank is None:
        out.append(Check(name="threads", ok=None, detail="the run did not record its threads per rank"))
    if record.load_average is not None:
        out.append(Check(name="load", ok=None, detail=f"load average {record.load_average[0]:.2f} when the run began"
                                                      + (f" ({profile.device.load_average[0]:.2f} while calibrating)"
                                                         if profile is not None and profile.device.load_average
                                                         else "")))
    return out


def _spread(values: list[float]) -> float | None:
    return (max(values) - min(values)) / mean(values) if len(values) > 1 and mean(values) > 0 else None


def verdict(iteration: Comparison, spread: float | None, phases: list[PhaseComparison],
            outside: Comparison | None, checks: list[Check]) -> str:
    """One line: whether the run can be compared at all, whether the error is within its noise, else where it lives."""
    failed = [c for c in checks if c.ok is False]
    if failed:
        return "not comparable: " + "; ".join(c.detail for c in failed)
    if iteration.relative_error is None:
        return "no time prediction to judge"
    err = iteration.relative_error
    noise = (spread or 0.0) / 2
    if spread is not None and abs(err) <= noise:
        return (f"within the run's noise: iteration time off by {err:+.1%}, the timed iterations spread "
                f"\u00b1{noise:.1%}")
    lead = f"iteration time off by {err:+.1%} " + (f"(the run's noise \u00b1{noise:.1%})" if spread is not None
                                                  else "(one timed iteration: no spread to compare with)")
    # where the seconds of the error are: the phase whose (predicted - measured) is largest
    worst = max((ph for ph in phases if ph.predicted is not None and ph.measured is not None),
                key=lambda ph: abs(ph.predicted - ph.measured), default=None)
    if worst is None:
        if outside is not None and outside.predicted is not None and outside.measured is not None:
            where = "outside the layers" if abs(outside.predicted - outside.measured) > \
                abs((iteration.predicted - outside.predicted) - (iteration.measured - outside.measured)) \
                else "in the layers"
            return f"{lead}; the error lives {where}"
        return lead
    share = (worst.predicted - worst.measured) / iteration.measured
    stage = f" on stage {worst.stage}" if any(ph.stage for ph in phases) else ""
    return (f"{lead}; most of it lives in {worst.phase}{stage} "
            f"({worst.predicted * 1e3:.3g} ms predicted, {worst.measured * 1e3:.3g} ms measured, "
            f"{share:+.1%} of the iteration)")


def validate(record: RunRecord, profile_path: str | None = None, run: str = "", predict_times: bool = True) -> Validation:
    """Compare a run with the simulator's predictions for the same job.

    Without ``profile_path`` the engine's default profile for the cluster is used; if there is
    none, the time columns are left empty with a note (memory needs no profile). With
    ``predict_times=False`` the engine is not run at all.
    """
    job = job_of(record)
    notes: list[str] = []
    predicted: _Predicted | None = None
    profile = None
    if not predict_times:
        notes.append("time predictions not requested")
    else:
        try:
            profile = _load_profile(profile_path)
            predicted, why = _time_predictions(job, record, profile)
            notes += why
        except SimulatorError as exc:
            if profile_path is not None:
                raise
            notes.append(f"no time predictions without --profile: {' '.join(str(exc).split())}")
    per_layer = predicted.per_layer if predicted is not None else {}
    layers = []
    for layer in record.layers:
        f, b, r = per_layer.get(layer.recompute_granularity, (None, None, None))
        modelled = transformer_layer(job.model, job.plan, moe=job.model.is_moe_layer(layer.index)).activation_bytes(
            layer.recompute_granularity)
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
        from simulator.estimator.memory import memory_plan

        stages = memory_plan(job).stages
        # max_memory_allocated does not see the CUDA context, workspaces or fragmentation
        peaks = [compare(s.peak_bytes - s.reserve_bytes, measured)
                 for s, measured in zip(stages, record.peak_allocated_bytes_per_stage)]
        notes.append("predicted peak memory is the memory plan's peak less its reserve "
                     "(CUDA context, workspaces, fragmentation), which torch.cuda.max_memory_allocated does not count")
    else:
        notes.append("no peak memory: the run was on CPU")
    measured_iteration = mean(record.timed_iteration_times_s)
    iteration = compare(predicted.iteration_s if predicted is not None else None, measured_iteration)
    phases = _phases(record, predicted)
    stage = predicted.critical_stage if predicted is not None else 0
    inside_pred, inside_meas = _inside_layers(record, stage, per_layer)
    outside = None
    if inside_meas is not None:
        outside = compare(iteration.predicted - inside_pred if inside_pred is not None and iteration.predicted
                          is not None else None, measured_iteration - inside_meas)
    if not record.timers:
        notes.append("the run recorded no per-phase timers (a record from before they were kept)")
    checks = _checks(record, profile)
    spread = _spread(record.timed_iteration_times_s)
    return Validation(
        run=run,
        device=record.device,
        iteration_time_s=iteration,
        activation_bytes_per_layer=compare(mean(x.activation_bytes.predicted for x in layers),
                                           mean(x.activation_bytes.measured for x in layers)),
        layers=layers,
        peak_memory_bytes_per_stage=peaks,
        notes=notes,
        iteration_time_spread=spread,
        phases=phases,
        outside_layers_s=outside,
        checks=checks,
        verdict=verdict(iteration, spread, phases, outside, checks) if predict_times else "",
    )
