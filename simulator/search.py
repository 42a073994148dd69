"""The auto-configurator: every valid plan for a model on N GPUs, the fastest that fits first.

Three tiers, cheapest first, as NeMo's hyper-parameter tool narrows its grid:
1. enumerate the space (TP up to a node, PP dividing the layers, virtual stages, micro-batch,
   SP, recompute with every useful number of checkpointed layers, distributed optimizer), with
   the arithmetic rules of ``ParallelPlan``/``Job`` applied while generating, not after;
2. prune by memory (the first and last stage bound every other) and screen the survivors with a
   closed form over the same per-step durations the engine plays (``fast_iteration_time_s``);
3. simulate the finalists with the discrete-event engine and rank them by its iteration time.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Iterator

from pydantic import BaseModel, ConfigDict, Field

from simulator.engine import PipelineWork
from simulator.errors import InfeasiblePlanError
from simulator.estimate import Estimate, build_work, simulate_job
from simulator.hardware import ClusterSpec
from simulator.limits import MAX_GLOBAL_BATCH_SIZE, MAX_GPUS, MAX_PIPELINE_CHUNKS
from simulator.memory import stage_memory
from simulator.model import ModelSpec
from simulator.plan import (
    Job,
    ParallelPlan,
    Precision,
    RecomputeGranularity,
    RecomputeMethod,
    RecomputePolicy,
)
from simulator.timing import cost_model_for, extra_times, layer_times
from simulator.units import gib

MICRO_BATCH_SIZES = (1, 2, 4, 8, 16)
# How far the closed-form screen may be from the engine (tests/test_search.py checks it on the
# finalists); the engine stops once the next screened plan is that much slower than the top.
SCREEN_MARGIN = 0.03


class SearchPins(BaseModel):
    """Dimensions the user fixed (None = search it)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tensor_parallel_size: int | None = None
    pipeline_parallel_size: int | None = None
    virtual_pipeline_stages: int | None = None
    micro_batch_size: int | None = None
    sequence_parallel: bool | None = None
    recompute_granularity: RecomputeGranularity | None = None
    use_distributed_optimizer: bool | None = None


class SearchRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    model: ModelSpec
    cluster: ClusterSpec
    num_gpus: int = Field(gt=0, le=MAX_GPUS)
    global_batch_size: int = Field(gt=0, le=MAX_GLOBAL_BATCH_SIZE)
    pins: SearchPins = SearchPins()
    precision: Precision = Precision.bf16
    use_flash_attention: bool = False
    overlap_grad_reduce: bool = False
    finalists: int = Field(16, gt=0, description="Plans the engine simulates after the closed-form screen.")


class RankedPlan(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    rank: int
    plan: ParallelPlan
    estimate: Estimate
    screen_time_s: float = Field(description="The closed-form screen's iteration time for this plan.")


class ScreenedPlan(BaseModel):
    """A plan that fits, with its closed-form time (every survivor of the memory prune)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    plan: ParallelPlan
    screen_time_s: float
    peak_bytes: int


class SearchResult(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    plans: list[RankedPlan]
    screened: list[ScreenedPlan] = Field(description="Every plan that fits, with its screen time (for the Pareto plot).")
    enumerated: int
    pruned_memory: int
    simulated: int
    elapsed_s: float

    @property
    def best(self) -> RankedPlan:
        return self.plans[0]


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _recompute_options(chunk_layers: int, pinned: RecomputeGranularity | None) -> list[RecomputePolicy]:
    """none, selective, full (uniform, one layer per group) and full/block with 1..n-1 checkpointed layers."""
    out = []
    if pinned in (None, RecomputeGranularity.none):
        out.append(RecomputePolicy())
    if pinned in (None, RecomputeGranularity.selective):
        out.append(RecomputePolicy(granularity=RecomputeGranularity.selective))
    if pinned in (None, RecomputeGranularity.full):
        out.append(RecomputePolicy(granularity=RecomputeGranularity.full))
        out += [RecomputePolicy(granularity=RecomputeGranularity.full, method=RecomputeMethod.block, num_layers=k)
                for k in range(1, chunk_layers)]
    return out


def _pinned(allowed: list, pin):
    """The allowed values, or the pinned one if the rules allow it (a pin never adds a value they refuse)."""
    return allowed if pin is None else [x for x in allowed if x == pin]


def enumerate_plans(req: SearchRequest) -> Iterator[ParallelPlan]:
    """Every plan the rules allow, in a fixed order (so the ranking is deterministic)."""
    m, c, pins, n = req.model, req.cluster, req.pins, req.num_gpus
    L, gbs = m.num_layers, req.global_batch_size
    tps = [t for t in _divisors(c.gpus_per_node)
           if m.num_attention_heads % t == 0 and m.vocab_size % t == 0 and m.ffn_size % t == 0
           and (m.query_groups % t == 0 or t % m.query_groups == 0)]
    for t in _pinned(tps, pins.tensor_parallel_size):
        for p in _pinned(_divisors(L), pins.pipeline_parallel_size):
            if n % (t * p):
                continue
            d = n // (t * p)
            for mbs in MICRO_BATCH_SIZES if pins.micro_batch_size is None else [pins.micro_batch_size]:
                if gbs % (mbs * d):
                    continue
                micro_batches = gbs // (mbs * d)
                vs = [1] + ([v for v in _divisors(L // p) if v > 1 and micro_batches % p == 0] if p > 1 else [])
                for v in _pinned(vs, pins.virtual_pipeline_stages):
                    if L % (p * v) or p * v * micro_batches > MAX_PIPELINE_CHUNKS:
                        continue
                    for sp in _pinned([False, True] if t > 1 else [False], pins.sequence_parallel):
                        for rec in _recompute_options(L // (p * v), pins.recompute_granularity):
                            dopts = [False, True] if d > 1 else [False]
                            for dopt in dopts if pins.use_distributed_optimizer is None else [pins.use_distributed_optimizer]:
                                yield ParallelPlan.model_construct(
                                    tensor_parallel_size=t, pipeline_parallel_size=p, data_parallel_size=d,
                                    virtual_pipeline_stages=v, sequence_parallel=sp, micro_batch_size=mbs,
                                    global_batch_size=gbs, recompute=rec, use_distributed_optimizer=dopt,
                                    precision=req.precision, use_flash_attention=req.use_flash_attention,
                                    overlap_grad_reduce=req.overlap_grad_reduce,
                                    **{k: f.default for k, f in ParallelPlan.model_fields.items()
                                       if k in ("schedule", "allow_tp_across_nodes", "pipeline_layer_split")},
                                )


def peak_bytes(job: Job) -> int:
    """The plan's per-GPU peak: the first stage holds the most in-flight activations and the
    embedding, the last the output layer and logits; every middle stage is bounded by the first."""
    stages = {0, job.plan.pipeline_parallel_size - 1}
    return max(stage_memory(job, s).peak_bytes for s in stages)


def fast_iteration_time_s(work: PipelineWork, num_micro_batches: int) -> float:
    """Closed-form iteration time over the engine's own per-step durations.

    1F1B keeps the slowest stage busy for m micro-batches and pays (p - 1) / v of a mean stage's
    micro-batch work to fill and drain the pipeline (exact for uniform stages); the gradient
    reduction and the optimizer close the iteration. Blocking sends hold every step, so they are
    part of each micro-batch's work, fill and drain included; sends that run beside compute still
    put the p v - 1 crossings of the first activation and the last gradient on the critical path.
    """
    p = len(work.stages)
    v = len(work.stages[0].forward_s)
    # with blocking sends every step also waits for its own send: forward to i + 1, backward to i - 1
    send = work.send_s
    blocking = [0.0 if work.overlap_p2p or p == 1 else v * (send[i] + send[i - 1]) for i in range(p)]
    per_mb = [sum(s.forward_s) + sum(s.backward_s) + blocking[i] for i, s in enumerate(work.stages)]
    fill = (p - 1) / v * (sum(per_mb) / p)
    transfers = 2 * (p * v - 1) * sum(send) / p if p > 1 and work.overlap_p2p else 0.0
    if work.overlap_grad_reduce:
        reduce = max(s.grad_reduce_s[0] for s in work.stages)
    else:
        reduce = max(sum(s.grad_reduce_s) for s in work.stages)
    optimizer = max(s.optimizer_s for s in work.stages)
    return num_micro_batches * max(per_mb) + fill + transfers + reduce + optimizer


def screen(job: Job, profile=None) -> float:
    """The closed-form iteration time of ``job`` (the search's fast tier)."""
    cost = cost_model_for(job, profile)
    work = build_work(job, cost, layer_times(job, cost=cost), extra_times(job, cost))
    return fast_iteration_time_s(work, job.plan.num_micro_batches)


@dataclass
class _Closest:
    overflow_bytes: float = float("inf")
    plan: ParallelPlan | None = None
    peak: int = 0


def search(req: SearchRequest, profile=None, tokens: float | None = None, top: int = 10,
           progress: Callable[[str, int, int], None] | None = None) -> SearchResult:
    """Rank every valid plan that fits by simulated iteration time.

    ``progress(phase, done, total)`` is called as the screen ("screening") and the engine
    ("simulating") work through their candidates.
    """
    started = time.perf_counter()
    capacity = req.cluster.gpu.memory_bytes
    screened: list[ScreenedPlan] = []
    closest = _Closest()
    candidates = list(enumerate_plans(req))
    enumerated = len(candidates)
    for i, plan in enumerate(candidates, 1):
        if progress is not None and i % 256 == 0:
            progress("screening", i, enumerated)
        job = Job.model_construct(model=req.model, cluster=req.cluster, plan=plan)
        peak = peak_bytes(job)
        if peak > capacity:
            if peak - capacity < closest.overflow_bytes:
                closest = _Closest(peak - capacity, plan, peak)
            continue
        screened.append(ScreenedPlan(plan=plan, screen_time_s=screen(job, profile), peak_bytes=peak))
    if enumerated == 0:
        raise InfeasiblePlanError(
            f"no plan of {req.model.name} on {req.num_gpus} GPUs with global batch {req.global_batch_size} satisfies "
            "the parallelism rules and the pinned dimensions; relax a pin or change the GPU count or batch"
        )
    if not screened:
        p = closest.plan
        raise InfeasiblePlanError(
            f"no plan of {req.model.name} fits in {gib(capacity):.0f} GiB per GPU on {req.num_gpus} GPUs; the closest "
            f"(TP {p.tensor_parallel_size}, PP {p.pipeline_parallel_size}, micro-batch {p.micro_batch_size}, "
            f"recompute {p.recompute.granularity.value}) needs {gib(closest.peak):.1f} GiB, "
            f"{gib(closest.overflow_bytes):.1f} GiB too many; use more GPUs or GPUs with more memory"
        )
    screened.sort(key=lambda s: s.screen_time_s)
    finalists = screened[: max(req.finalists, top)]
    ranked = []
    for i, cand in enumerate(finalists):
        if len(ranked) >= top and cand.screen_time_s > ranked[top - 1][0].iteration_time_s * (1 + SCREEN_MARGIN):
            break  # the screen is within SCREEN_MARGIN of the engine, so no later plan can enter the top
        job = Job(model=req.model, cluster=req.cluster, plan=cand.plan)
        ranked.append((simulate_job(job, profile, tokens).estimate, cand))
        ranked.sort(key=lambda r: r[0].iteration_time_s)
        if progress is not None:
            progress("simulating", i + 1, len(finalists))
    plans = [RankedPlan(rank=i + 1, plan=c.plan, estimate=e, screen_time_s=c.screen_time_s)
             for i, (e, c) in enumerate(ranked[:top])]
    return SearchResult(plans=plans, screened=screened, enumerated=enumerated,
                        pruned_memory=enumerated - len(screened), simulated=len(ranked),
                        elapsed_s=time.perf_counter() - started)
