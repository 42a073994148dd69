"""Days as they are lived: a training run that fails, checkpoints and restarts.

The job stops whenever any part of it fails (``ClusterSpec.reliability``: per-component rates per GPU-hour,
so its mean time between interruptions M falls as 1 / its GPUs). It saves every k iterations; a save costs
what the file system takes to write the rank's share of the weights and optimizer state (the memory
model's, ``checkpoint_cost``), or, saved asynchronously, the copy to host memory while the write goes on
beside training. A failure loses the work since the last checkpoint that reached storage and pays a restart
R (detection, rescheduling, process start, NCCL at the job's size, warm-up, the load of the checkpoint),
which can itself be hit by a failure.

For Poisson failures the expected wall time of one segment of s seconds (k iterations and their save) is
exactly M e^(R/M) (e^(s/M) - 1) (Daly, "A higher order estimate of the optimum checkpoint interval", FGCS
2006); the segments' sum is the expected run (``closed_form``), and the interval that minimises it per
useful second is found numerically (Young's sqrt(2 x save x M) is its first-order limit; Saxena et al.,
NVIDIA 2024, refine the same trade for availability). An asynchronous save is taken to first order: its
write delays when the checkpoint is safe, which adds the write time to the restart's cost. Planned
maintenance stops add a save and a restart each. The distribution of the days comes from a seeded
simulation of the whole job (``simulator.estimator.goodput_sim``), whose mean the tests hold to the
closed form's.
"""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, Field

from simulator.estimator.memory import _state_bytes, stage_expert_parameters, stage_parameters, stage_state
from simulator.estimator.prediction import FINITE, SECONDS_PER_DAY, Estimate
from simulator.spec import limits
from simulator.spec.errors import ConfigError
from simulator.spec.plan import DataParallelSharding, Job
from simulator.spec.reliability import Reliability, StorageSpec

GB = 1e9


class EndlessRunError(ConfigError):
    """A run that fails faster than it restarts and saves: its expected days are past any use."""


class GoodputSettings(BaseModel):
    """What the user chooses about failures and checkpoints (flags of `plan` and `search`)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    async_save: bool = Field(False, description="Megatron's --async-save: the save blocks only for the copy to "
                                                "host memory; the write goes on beside training.")
    save_interval: int | None = Field(None, ge=1, le=limits.MAX_SAVE_INTERVAL,
                                      description="Iterations between checkpoints; None: the one that maximises "
                                                  "useful time.")
    mtbf_gpu_hours: float | None = Field(None, gt=0, le=limits.MAX_MTBF_GPU_HOURS,
                                         description="One GPU's mean time between unplanned interruptions, "
                                                     "GPU-hours; replaces the level of the cluster's rates.")
    write_gbps_per_node: float | None = Field(None, **limits.GBPS_RANGE, description="Storage write, GB/s per node.")
    write_gbps: float | None = Field(None, **limits.GBPS_RANGE, description="Storage write, GB/s in aggregate.")
    spare_nodes: int | None = Field(None, ge=0, le=limits.MAX_SPARE_NODES,
                                    description="Hot spare nodes; a failed node waits for repair when none is "
                                                "free. None: the pool always has one (the closed form's case).")
    runs: int | None = Field(None, ge=1, le=limits.MAX_GOODPUT_RUNS,
                             description="Simulated runs; None: as many as a budget of events allows (40 to 400).")
    seed: int = Field(0, ge=0, le=limits.MAX_SEED)

    def reliability(self, data: Reliability) -> Reliability:
        return data if self.mtbf_gpu_hours is None else data.with_mtbf_gpu_hours(self.mtbf_gpu_hours)

    def storage(self, storage: StorageSpec) -> StorageSpec:
        for name in ("write_gbps_per_node", "write_gbps"):
            if getattr(self, name) is not None:
                storage = storage.with_bandwidth(name, getattr(self, name))
        return storage


class CheckpointCost(BaseModel):
    """One checkpoint of the plan: its bytes and what saving and loading it take."""

    model_config = FINITE

    save_bytes_per_rank: int = Field(description="The most one rank writes: its 1/(DP x CP) share of the weights "
                                                 "and optimizer state it holds replicated, and all it holds sharded "
                                                 "(Megatron's torch_dist and fsdp_dtensor with fully parallel save).")
    save_bytes: int = Field(description="The whole checkpoint: each weight and optimizer state once.")
    load_bytes_per_rank: int = Field(description="What one rank reads on restart: the weights and optimizer state "
                                                 "it holds (sharded by the distributed optimizer or FSDP, or not).")
    copy_s: float = Field(description="The rank's share copied to host memory.")
    write_s: float = Field(description="The write, at the slower of the node's and the file system's bandwidth.")
    blocking_s: float = Field(description="What training waits for per save: planning and copy, plus the write "
                                          "when saving synchronously.")
    durable_lag_s: float = Field(description="After the blocking part, until the checkpoint is safe on storage "
                                             "(the asynchronous write; 0 when synchronous).")
    load_s: float = Field(description="Reading the checkpoint back on restart.")


class TimeSplit(BaseModel):
    """Where the expected run goes, days; the parts sum to the expected days."""

    model_config = FINITE

    compute_days: float
    checkpoint_days: float
    lost_work_days: float
    restart_days: float


class GoodputEstimate(BaseModel):
    """Ideal and expected days of a run with failures, checkpoints and restarts."""

    model_config = FINITE

    ideal_days: float = Field(description="Iterations x iteration time: no failure, no checkpoint (at least one "
                                          "iteration: Megatron runs whole ones).")
    expected_days: float = Field(description="The mean with failures, saves and restarts (closed form).")
    expected_days_low: float = Field(description="... with every declared constant (failure rates, restart, storage) "
                                                 "and the iteration time at the ends of their ranges that shorten it.")
    expected_days_high: float | None = Field(
        description="... that lengthen it; None when there the run would take more than "
                    f"{limits.MAX_SLOWDOWN_BY_FAILURES:g} times its days without interruptions (it fails faster "
                    "than it restarts).")
    p10_days: float | None = Field(None, description="The simulation's 10th percentile; None when not simulated.")
    p50_days: float | None = None
    p90_days: float | None = None
    simulated_mean_days: float | None = None
    simulated_runs: int = 0
    seed: int = 0
    ettr: float = Field(description="Effective training time ratio: ideal over expected days.")
    interruptions_per_day: float = Field(description="Planned and unplanned, per day of the run.")
    unplanned_interruptions_per_day: float
    job_mtbf_hours: float | None = Field(description="Mean time between unplanned interruptions of the job; None: "
                                                     "none happen.")
    gpu_mtbf_hours: float | None
    save_interval: int = Field(description="Iterations between checkpoints (Megatron's --save-interval).")
    save_interval_s: float
    save_interval_optimal: bool = Field(description="The interval is the one that maximises useful time.")
    async_save: bool
    checkpoint: CheckpointCost
    restart_s: float = Field(description="One restart, the checkpoint's load included.")
    checkpoint_overhead: float = Field(description="Blocking save time over compute time, at the interval.")
    spare_nodes: int | None = None
    split: TimeSplit
    note: str = ""


# --- checkpoint bytes and times ------------------------------------------------------------------


def checkpoint_bytes(job: Job) -> tuple[int, int, int]:
    """(most bytes one rank saves, bytes of the whole checkpoint, most bytes one rank loads).

    Saving, each rank writes its 1/group share of the state the group holds replicated (Megatron's fully
    parallel save, the default of its torch_dist format), so the checkpoint is written once, sharded or not;
    loading, each rank reads what it holds, which the distributed optimizer or FSDP shards."""
    plan = job.plan
    replicated = plan.model_copy(update=dict(data_parallel_sharding_strategy=DataParallelSharding.no_shard,
                                             use_distributed_optimizer=False))
    gpus_per_stage = job.num_gpus // plan.pipeline_parallel_size
    save_rank = total = load_rank = 0
    for stage in range(plan.pipeline_parallel_size):
        params, experts = stage_parameters(job, stage), stage_expert_parameters(job, stage)
        w, _, o = _state_bytes(params - experts, replicated)
        we, _, oe = _state_bytes(experts, replicated)
        share = -(-(w + o) // plan.gradient_group_size) + (-(-(we + oe) // plan.expert_data_parallel_size)
                                                           if experts else 0)
        held = stage_state(job, stage)
        save_rank, load_rank = max(save_rank, share), max(load_rank, held.weights + held.optimizer)
        total += share * gpus_per_stage
    return save_rank, total, load_rank


def checkpoint_cost(job: Job, storage: StorageSpec, async_save: bool, end: str = "value") -> CheckpointCost:
    """Save and load times of ``job``'s checkpoint on ``storage``, its declared bandwidths at ``end``."""
    save_rank, total, load_rank = checkpoint_bytes(job)
    per_node = job.cluster.gpus_per_node
    slow = {"low": "high", "high": "low", "value": "value"}[end]  # a short save wants the high bandwidths
    copy = save_rank / (storage.host_copy_gbps_per_gpu.at(slow) * GB)
    write = max(per_node * save_rank / (storage.write_gbps_per_node.at(slow) * GB),
                total / (storage.write_gbps.at(slow) * GB))
    load = max(per_node * load_rank / (storage.read_gbps_per_node.at(slow) * GB),
               job.num_gpus * load_rank / (storage.read_gbps.at(slow) * GB))
    fixed = storage.save_fixed_s.at(end)
    blocking = fixed + copy + (0.0 if async_save else write)
    return CheckpointCost(save_bytes_per_rank=save_rank, save_bytes=total, load_bytes_per_rank=load_rank, copy_s=copy,
                          write_s=write, blocking_s=blocking, durable_lag_s=write if async_save else 0.0, load_s=load)


def restart_s(job: Job, data: Reliability, iteration_time_s: float, load_s: float, end: str = "value") -> float:
    r = data.restart
    return (r.detect_s.at(end) + r.reschedule_s.at(end) + r.process_start_s.at(end) + r.nccl_init_s.at(end)
            + r.nccl_init_s_per_gpu.at(end) * job.num_gpus + r.warmup_iterations.at(end) * iteration_time_s + load_s)


# --- the closed form -----------------------------------------------------------------------------


class Renewal(BaseModel):
    """The job as the closed form and the simulation see it: seconds and rates, nothing of the model."""

    model_config = FINITE

    iteration_time_s: float = Field(gt=0)
    iterations: float = Field(gt=0, description="Iterations of the run (fractional: tokens over a batch's).")
    unplanned_per_s: float = Field(ge=0, description="The job's rate of unplanned interruptions.")
    planned_per_s: float = Field(ge=0)
    blocking_save_s: float = Field(ge=0)
    durable_lag_s: float = Field(ge=0)
    restart_s: float = Field(ge=0)

    def segment_s(self, k: float) -> float:
        """Wall time of k iterations and their save when nothing fails: an asynchronous save waits for the
        previous write when the interval is shorter than it."""
        compute = k * self.iteration_time_s
        return compute + self.blocking_save_s + max(0.0, self.durable_lag_s - compute)

    def expected_segment_s(self, k: float) -> float:
        """Expected wall time of one segment of k iterations, failures and restarts included (Daly's form)."""
        s = self.segment_s(k)
        lam = self.unplanned_per_s
        if lam == 0:
            return s
        exponent = lam * (self.restart_s + self.durable_lag_s)
        if exponent + lam * s > 700:
            return math.inf
        return math.exp(exponent) * math.expm1(lam * s) / lam

    def expected_s(self, k: int) -> float:
        """Expected wall time of the whole run saving every k iterations (the last segment may be shorter)."""
        full = math.floor(self.iterations / k)
        rest = self.iterations - full * k
        unplanned = full * self.expected_segment_s(k) + (self.expected_segment_s(rest) if rest > 1e-9 else 0.0)
        return unplanned * self.planned_stretch()

    def planned_stretch(self) -> float:
        """Planned stops come at their rate over the whole run and cost a save and a restart each, no lost
        work: the run stretches by 1 / (1 - rate x cost)."""
        busy = self.planned_per_s * (self.blocking_save_s + self.durable_lag_s + self.restart_s)
        return 1 / (1 - busy) if busy < 1 else math.inf

    def saves(self, k: int) -> int:
        return math.ceil(self.iterations / k - 1e-9)

    def best_interval(self) -> int:
        """The k that minimises the expected run: the continuous optimum of the expected time per useful second
        (unimodal in the interval), then the better of the whole numbers beside it."""
        n = self.iterations
        if self.unplanned_per_s == 0:
            return max(1, min(limits.MAX_SAVE_INTERVAL, math.ceil(n)))
        rate = lambda logk: self.expected_segment_s(math.exp(logk)) / math.exp(logk)  # noqa: E731
        lo, hi = 0.0, math.log(max(1.0, min(n, limits.MAX_SAVE_INTERVAL)))
        g = (math.sqrt(5) - 1) / 2
        a, b = hi - g * (hi - lo), lo + g * (hi - lo)
        for _ in range(80):
            if rate(a) < rate(b):
                hi = b
            else:
                lo = a
            a, b = hi - g * (hi - lo), lo + g * (hi - lo)
        k = math.exp((lo + hi) / 2)
        ks = {max(1, min(limits.MAX_SAVE_INTERVAL, int(x))) for x in (math.floor(k), math.ceil(k), math.ceil(n))}
        return min(sorted(ks), key=self.expected_s)


def renewal_of(job: Job, data: Reliability, cost: CheckpointCost, iteration_time_s: float, iterations: float,
               end: str = "value") -> Renewal:
    hours = job.num_gpus / 3600.0
    return Renewal(iteration_time_s=iteration_time_s, iterations=iterations,
                   unplanned_per_s=data.rate_per_gpu_hour(end, planned=False) * hours,
                   planned_per_s=data.rate_per_gpu_hour(end, planned=True) * hours,
                   blocking_save_s=cost.blocking_s, durable_lag_s=cost.durable_lag_s,
                   restart_s=restart_s(job, data, iteration_time_s, cost.load_s, end))


def _without_interruptions(r: Renewal) -> Renewal:
    return r.model_copy(update=dict(unplanned_per_s=0.0, planned_per_s=0.0))


def _endless(expected_s: float, free_s: float) -> bool:
    """Failures stretch the run past the limit. Measured against the run without interruptions (compute and
    saves), not its compute alone: a run shorter than one save is long beside its compute, never endless."""
    return expected_s > limits.MAX_SLOWDOWN_BY_FAILURES * free_s


def _refuse_if_endless(job: Job, r: Renewal, expected_s: float, free_s: float) -> None:
    if not _endless(expected_s, free_s):
        return
    mtbf_min = 1 / max(r.unplanned_per_s, r.planned_per_s, 1e-300) / 60
    raise EndlessRunError(
        f"{job.num_gpus:,} GPUs are interrupted every {mtbf_min:.3g} minutes on average, while a restart takes "
        f"{r.restart_s / 60:.3g} and a save {r.blocking_save_s / 60:.3g} minutes, so the run would take more than "
        f"{limits.MAX_SLOWDOWN_BY_FAILURES:g} times its {free_s / SECONDS_PER_DAY:.3g} days without interruptions; "
        "use fewer GPUs, a larger --mtbf-gpu-hours or faster storage")


def _split(r: Renewal, k: int, expected_s: float) -> TimeSplit:
    """Compute, saves, restarts and lost work of the expected run: failures come at the job's rate over the
    whole run; each starts a restart that a later failure may cut short (M (1 - e^(-R/M)) on average)."""
    compute = r.iterations * r.iteration_time_s
    planned = r.planned_per_s * expected_s
    saves = r.saves(k) * (r.segment_s(k) - k * r.iteration_time_s) + planned * (r.blocking_save_s + r.durable_lag_s)
    lam = r.unplanned_per_s
    unplanned_s = expected_s / r.planned_stretch()  # the run without its planned stops, where failures strike
    restarts = (unplanned_s * -math.expm1(-lam * r.restart_s) if lam else 0.0) + planned * r.restart_s
    lost = max(0.0, expected_s - compute - saves - restarts)
    d = SECONDS_PER_DAY
    return TimeSplit(compute_days=compute / d, checkpoint_days=saves / d, lost_work_days=lost / d,
                     restart_days=(expected_s - compute - saves - lost) / d)


def goodput(job: Job, est: Estimate, settings: GoodputSettings | None = None,
            simulate: bool = True) -> GoodputEstimate:
    """Ideal and expected days of ``job`` trained for ``est.tokens``, the checkpoint interval, and (``simulate``)
    the P10 / P50 / P90 days of a seeded simulation of the run."""
    settings = settings or GoodputSettings()
    if est.tokens is None or est.training_days is None:
        raise ConfigError("expected days need the run's length; give --tokens (e.g. 300e9)")
    data = settings.reliability(job.cluster.reliability)
    storage = settings.storage(job.cluster.storage)
    T = est.iteration_time_s
    batch_tokens = job.plan.global_batch_size * job.model.seq_length
    if est.tokens < batch_tokens:
        raise ConfigError(f"--tokens {est.tokens:.3g} is fewer than one global batch ({batch_tokens:,} tokens: "
                          f"{job.plan.global_batch_size} sequences of {job.model.seq_length}); give at least "
                          f"{batch_tokens:,} tokens")
    # Megatron runs whole iterations: fewer tokens than one global batch still take one
    iterations = max(1.0, est.tokens / batch_tokens)
    cost = checkpoint_cost(job, storage, settings.async_save)
    r = renewal_of(job, data, cost, T, iterations)
    k = settings.save_interval if settings.save_interval is not None else r.best_interval()
    k = min(k, max(1, math.ceil(iterations)))
    ideal_s = iterations * T
    expected_s = r.expected_s(k)
    _refuse_if_endless(job, r, expected_s, _without_interruptions(r).expected_s(k))
    corners = []
    for end, t in (("low", est.iteration_time_s_low or T), ("high", est.iteration_time_s_high or T)):
        c = checkpoint_cost(job, storage, settings.async_save, end)
        corner = renewal_of(job, data, c, t, iterations, end)
        corners.append((corner.expected_s(k), _without_interruptions(corner).expected_s(k)))
    (low_s, _), (high_s, high_free_s) = corners
    unplanned, planned = r.unplanned_per_s, r.planned_per_s
    out = dict(
        ideal_days=ideal_s / SECONDS_PER_DAY, expected_days=expected_s / SECONDS_PER_DAY,
        expected_days_low=min(low_s, expected_s) / SECONDS_PER_DAY,
        expected_days_high=max(high_s, expected_s) / SECONDS_PER_DAY if not _endless(high_s, high_free_s) else None,
        ettr=ideal_s / expected_s, interruptions_per_day=(unplanned + planned) * SECONDS_PER_DAY,
        unplanned_interruptions_per_day=unplanned * SECONDS_PER_DAY,
        job_mtbf_hours=1 / unplanned / 3600 if unplanned else None,
        gpu_mtbf_hours=job.num_gpus / unplanned / 3600 if unplanned else None,
        save_interval=k, save_interval_s=k * T, save_interval_optimal=settings.save_interval is None,
        async_save=settings.async_save, checkpoint=cost, restart_s=r.restart_s,
        checkpoint_overhead=(r.segment_s(k) - k * T) / (k * T), spare_nodes=settings.spare_nodes,
        split=_split(r, k, expected_s), seed=settings.seed)
    if simulate:
        from simulator.estimator.goodput_sim import simulate_run

        sim = simulate_run(r, k, component_mix(data), settings)
        if sim is None:
            out["note"] = ("too many interruptions to simulate each one; the spread of the days is under a percent "
                           "of the mean")
        else:
            out.update(p10_days=sim.p10_days, p50_days=sim.p50_days, p90_days=sim.p90_days,
                       simulated_mean_days=sim.mean_days, simulated_runs=sim.runs)
            if sim.chunks_per_run > 1:
                out["note"] = (f"the run is too long to play whole: each of the {sim.runs} simulated runs plays "
                               f"1/{sim.chunks_per_run:.3g} of it, its days scaled to the whole run")
    return GoodputEstimate(**out)


def component_mix(data: Reliability) -> tuple[tuple[float, bool, bool, float], ...]:
    """Per component: (its share of the job's interruptions, planned, replaces a node, repair seconds)."""
    total = data.rate_per_gpu_hour(planned=None)
    if total == 0:
        return ()
    return tuple((c.per_million_gpu_hours.value / 1e6 / total, c.planned, c.replaces_node,
                  c.repair_hours.value * 3600.0) for _, c in sorted(data.components.items()))


def effective_iteration_time_s(job: Job, iteration_time_s: float, settings: GoodputSettings | None = None) -> float:
    """Wall seconds per useful iteration of a long run at the best interval: the iteration time over the ETTR.
    What `search --rank-by expected-days` orders plans by (a run's days are this times its iterations)."""
    settings = settings or GoodputSettings()
    data = settings.reliability(job.cluster.reliability)
    cost = checkpoint_cost(job, settings.storage(job.cluster.storage), settings.async_save)
    r = renewal_of(job, data, cost, iteration_time_s, 1e12)
    k = settings.save_interval if settings.save_interval is not None else r.best_interval()
    per_iteration = r.expected_segment_s(k) / k * r.planned_stretch()
    _refuse_if_endless(job, r, per_iteration, _without_interruptions(r).segment_s(k) / k)
    return per_iteration
