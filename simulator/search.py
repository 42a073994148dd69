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

from simulator.errors import InfeasiblePlanError
from simulator.estimate import Estimate, simulate_job
from simulator.hardware import ClusterSpec
from simulator.limits import MAX_GLOBAL_BATCH_SIZE, MAX_GPUS, MAX_PIPELINE_CHUNKS
from simulator.memory import stage_peak_bytes
from simulator.model import ModelSpec
from simulator.pipeline_split import chunk_layers
from simulator.plan import (
    AttentionBackend,
    DataParallelSharding,
    Fp8Format,
    Job,
    MoEDispatcher,
    ParallelPlan,
    Precision,
    RecomputeGranularity,
    RecomputeMethod,
    RecomputePolicy,
)
from simulator.band import corners
from simulator.screen import fast_iteration_time_s, screen  # noqa: F401 - the search's fast tier
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
    context_parallel_size: int | None = None
    expert_model_parallel_size: int | None = Field(
        None, gt=0, description="Mixture of experts: EP, ranks the routed experts are spread over.")
    expert_tensor_parallel_size: int | None = Field(
        None, gt=0, description="Mixture of experts: ETP, ranks each expert is split over.")


class SearchRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    model: ModelSpec
    cluster: ClusterSpec
    num_gpus: int = Field(gt=0, le=MAX_GPUS)
    global_batch_size: int = Field(gt=0, le=MAX_GLOBAL_BATCH_SIZE)
    pins: SearchPins = SearchPins()
    precision: Precision = Precision.bf16
    use_flash_attention: bool = Field(True, description="Plans use a fused attention kernel (Megatron's default, "
                                                         "attention_backend auto); False: Megatron's unfused path.")
    overlap_grad_reduce: bool = False
    fp8_format: Fp8Format | None = Field(None, description="Every plan's linear layers in FP8 (Hopper).")
    finalists: int = Field(16, gt=0, description="Plans the engine simulates after the closed-form screen.")


class RankedPlan(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    rank: int
    plan: ParallelPlan
    estimate: Estimate
    screen_time_s: float = Field(description="The closed-form screen's iteration time for this plan.")
    iteration_time_s_low: float | None = Field(
        None, description="The iteration time at the band's fast corner (the best plan's unpinned constants at "
                          "the ends that make it fastest).")
    iteration_time_s_high: float | None = Field(None, description="... at the slow corner.")
    within_band_of_best: bool = Field(
        False, description="Its lead (or the best plan's) flips at a corner of the band: the profile cannot tell "
                           "the two apart.")


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


def _pinned(allowed, pin) -> list:
    """The allowed values, or the pinned one if the rules allow it (a pin never adds a value they refuse)."""
    return list(allowed) if pin is None else [x for x in allowed if x == pin]


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


def pipeline_splits(num_layers: int, p: int, v: int) -> list[dict]:
    """How Megatron can split the layers over p stages of v chunks: evenly where that divides; else
    with the embedding and the loss counted as layers; else with lighter first and last stages and
    the rest even (the most even such split). Each is the plan fields that state it."""
    L = num_layers
    if L % (p * v) == 0:
        return [{}]
    if p == 1:
        return []
    if (L + 2) % (p * v) == 0 and (L + 2) // (p * v) >= 2:
        return [{"account_for_embedding_in_pipeline_split": True, "account_for_loss_in_pipeline_split": True}]
    if p > 2:
        for middle in range(-(-L // p), L):
            rest = L - middle * (p - 2)
            if rest < 2 * v:
                break
            if rest % 2 == 0 and (rest // 2) % v == 0 and middle % v == 0:
                return [{"decoder_first_pipeline_num_layers": rest // 2, "decoder_last_pipeline_num_layers": rest // 2}]
    return []


# Context parallelism pays off for long sequences; below this many tokens per CP rank it is not searched.
CP_MIN_TOKENS_PER_RANK = 2048
CP_SIZES = (2, 4, 8, 16, 32)


def enumerate_plans(req: SearchRequest) -> Iterator[ParallelPlan]:
    """Every plan the rules allow, in a fixed order (so the ranking is deterministic).

    TP up to a node; CP for long sequences (with a fused attention kernel); PP any size whose layers
    split as Megatron can split them (``pipeline_splits``); virtual stages; micro-batch; SP;
    recompute; and the data-parallel sharding (the distributed optimizer, and Megatron-FSDP's deeper
    levels where there is no pipeline).
    """
    m, c, pins, n = req.model, req.cluster, req.pins, req.num_gpus
    L, gbs, s = m.num_layers, req.global_batch_size, m.seq_length
    tps = [t for t in _divisors(c.gpus_per_node)
           if m.num_attention_heads % t == 0 and m.vocab_size % t == 0 and m.ffn_size % t == 0
           and (m.query_groups % t == 0 or t % m.query_groups == 0)]
    cps = [1] + [cp for cp in CP_SIZES
                 if req.use_flash_attention and s % (2 * cp) == 0 and s // cp >= CP_MIN_TOKENS_PER_RANK]
    backend = AttentionBackend.auto if req.use_flash_attention else AttentionBackend.unfused
    # MoE plans exchange tokens all-to-all with the experts run as one grouped GEMM, as Megatron-Core
    # recommends for expert parallelism
    moe = dict(moe_token_dispatcher_type=MoEDispatcher.alltoall, moe_grouped_gemm=True) if m.is_moe else {}
    # every candidate is this template with its own layout: copying one plan is far cheaper than
    # building each from its defaults (built at one sequence, which every rule allows, then given the batch)
    template = ParallelPlan(global_batch_size=1, precision=req.precision, fp8_format=req.fp8_format,
                            use_flash_attention=req.use_flash_attention, attention_backend=backend,
                            overlap_grad_reduce=req.overlap_grad_reduce, **moe).model_copy(
                                update={"global_batch_size": gbs})
    for t in _pinned(tps, pins.tensor_parallel_size):
        for cp in _pinned(cps, pins.context_parallel_size):
            for p in _pinned(range(1, L + 1), pins.pipeline_parallel_size):
                if n % (t * cp * p):
                    continue
                d = n // (t * cp * p)
                for mbs in MICRO_BATCH_SIZES if pins.micro_batch_size is None else [pins.micro_batch_size]:
                    if gbs % (mbs * d):
                        continue
                    micro_batches = gbs // (mbs * d)
                    vs = [1] + ([v for v in range(2, L // p + 1) if micro_batches % p == 0] if p > 1 else [])
                    for v in _pinned(vs, pins.virtual_pipeline_stages):
                        if p * v * micro_batches > MAX_PIPELINE_CHUNKS:  # a schedule too long to play
                            continue
                        for split in pipeline_splits(L, p, v):
                            chunk = max(max(c_) for c_ in _split_layers(L, p, v, split))
                            for ep, etp in _expert_layouts(m, c.gpus_per_node, pins, t, cp, d):
                                yield from _variants(template, pins, t, cp, p, d, v, mbs, split, chunk, ep, etp)


def _expert_layouts(m: ModelSpec, gpus_per_node: int, pins: SearchPins, t: int, cp: int,
                    d: int) -> list[tuple[int, int | None]]:
    """(EP, ETP) pairs for a stage of t x cp x d ranks: EP any divisor of the experts that, with ETP, tiles
    the stage's ranks (Megatron's expert rank generator); ETP either 1 (whole experts, Megatron-Core's
    advice for fine-grained experts) or the dense layers' TP (its default). A dense model has (1, None)."""
    if not m.is_moe:
        return [(1, None)]
    out = []
    for etp in _pinned(sorted({1, t}), pins.expert_tensor_parallel_size):
        if m.expert_ffn_size % etp or etp > gpus_per_node:
            continue
        for ep in _pinned(_divisors(m.num_experts), pins.expert_model_parallel_size):
            if (t * cp * d) % (etp * ep) == 0:
                out.append((ep, None if etp == t else etp))
    return out


def _split_layers(L: int, p: int, v: int, split: dict) -> tuple[tuple[int, ...], ...]:
    return chunk_layers(L, p, v, first=split.get("decoder_first_pipeline_num_layers"),
                        last=split.get("decoder_last_pipeline_num_layers"),
                        account_for_embedding=split.get("account_for_embedding_in_pipeline_split", False),
                        account_for_loss=split.get("account_for_loss_in_pipeline_split", False))


def _variants(template: ParallelPlan, pins: SearchPins, t: int, cp: int, p: int, d: int, v: int, mbs: int, split: dict,
              chunk: int, ep: int = 1, etp: int | None = None) -> Iterator[ParallelPlan]:
    # expert parallelism beside tensor parallelism needs sequence parallelism (Megatron's rule)
    sps = ([True] if ep > 1 else [False, True]) if t > 1 else [False]
    shardings = [DataParallelSharding.no_shard, DataParallelSharding.optim] if d * cp > 1 else [DataParallelSharding.no_shard]
    if d * cp > 1 and p == 1:  # Megatron-FSDP's deeper levels, which do not combine with pipelining
        shardings += [DataParallelSharding.optim_grads, DataParallelSharding.optim_grads_params]
    if pins.use_distributed_optimizer is not None:
        shardings = [x for x in shardings if (x is not DataParallelSharding.no_shard) == pins.use_distributed_optimizer]
    for sp in _pinned(sps, pins.sequence_parallel):
        for rec in _recompute_options(chunk, pins.recompute_granularity):
            for sharding in shardings:
                yield template.model_copy(update=dict(
                    tensor_parallel_size=t, context_parallel_size=cp, pipeline_parallel_size=p, data_parallel_size=d,
                    virtual_pipeline_stages=v, sequence_parallel=sp, micro_batch_size=mbs, recompute=rec,
                    expert_model_parallel_size=ep, expert_tensor_parallel_size=etp,
                    overlap_p2p_comm=v > 1,  # Megatron's default: interleaved schedules overlap their sends
                    use_distributed_optimizer=sharding is not DataParallelSharding.no_shard,
                    data_parallel_sharding_strategy=(sharding if sharding in (DataParallelSharding.optim_grads,
                                                                              DataParallelSharding.optim_grads_params)
                                                     else None), **split))


def peak_bytes(job: Job) -> int:
    """The plan's per-GPU peak: the first stage holds the most in-flight activations and the
    embedding, the last the output layer and logits; every middle stage is bounded by the first."""
    p = job.plan.pipeline_parallel_size
    stages = {0, p - 1}
    if len(set(job.layers_per_stage)) > 1:  # a fuller second stage can outweigh a lighter first
        stages |= {min(1, p - 1), max(p - 2, 0)}
    if job.model.is_moe and p > 2:  # stages may hold other mixes of dense and MoE layers: one of each mix
        runs = job.layer_runs
        mixes = {runs[s]: s for s in range(p - 2, 0, -1) if runs[s] not in (runs[0], runs[p - 1])}
        stages |= set(mixes.values())
    return max(stage_peak_bytes(job, s) for s in stages)


def _fewest_checkpointed_layers(plans: list[ParallelPlan]) -> list:
    """An MoE model multiplies the space by EP and ETP. There each layout's block-recompute plans are
    gathered (in place of the first) into one list, of which only the plan with the fewest checkpointed
    layers that fits is screened: each layer more only adds recompute time and saves memory."""
    out: list = []
    groups: dict[tuple, list] = {}
    for plan in plans:
        if plan.recompute.method is not RecomputeMethod.block:
            out.append(plan)
            continue
        key = (plan.tensor_parallel_size, plan.context_parallel_size, plan.pipeline_parallel_size,
               plan.data_parallel_size, plan.virtual_pipeline_stages, plan.micro_batch_size, plan.sequence_parallel,
               plan.data_parallel_sharding_strategy, plan.use_distributed_optimizer, plan.expert_model_parallel_size,
               plan.expert_tensor_parallel_size, plan.decoder_first_pipeline_num_layers,
               plan.account_for_embedding_in_pipeline_split)
        if key not in groups:
            groups[key] = []
            out.append(groups[key])
        groups[key].append(plan)
    return out


def _first_that_fits(req: SearchRequest, plans: list[ParallelPlan], capacity: int, closest: "_Closest"):
    """The plan of ``plans`` (more checkpointed layers, less memory, one after another) with the fewest
    checkpointed layers that fits, found by bisection; None (noting the closest miss) when none fits."""
    def peak(plan: ParallelPlan) -> int:
        return peak_bytes(Job.model_construct(model=req.model, cluster=req.cluster, plan=plan))

    lo, hi = 0, len(plans) - 1
    last = peak(plans[hi])
    if last > capacity:
        if last - capacity < closest.overflow_bytes:
            closest.overflow_bytes, closest.plan, closest.peak = last - capacity, plans[hi], last
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        if peak(plans[mid]) <= capacity:
            hi = mid
        else:
            lo = mid + 1
    return plans[lo]


@dataclass
class _Closest:
    overflow_bytes: float = float("inf")
    plan: ParallelPlan | None = None
    peak: int = 0


def _with_bands(req: SearchRequest, profile, ranked: list) -> list[RankedPlan]:
    """The ranked plans with their bands: the corners are the best plan's, and each plan's time at a
    corner is its engine time scaled by what the screen says the corner does to it."""
    if not ranked:
        return []
    jobs = [Job.model_construct(model=req.model, cluster=req.cluster, plan=c.plan) for _, c in ranked]
    c = corners(jobs[0], profile)
    bands = []
    for job, (est, cand) in zip(jobs, ranked):
        base = screen(job, profile)
        bands.append((est.iteration_time_s * screen(job, c.fast) / base,
                      est.iteration_time_s * screen(job, c.slow) / base))
    (best_low, best_high) = bands[0]
    return [RankedPlan(rank=i + 1, plan=cand.plan, estimate=est, screen_time_s=cand.screen_time_s,
                       iteration_time_s_low=low, iteration_time_s_high=high,
                       within_band_of_best=i > 0 and (low <= best_low or high <= best_high))
            for i, ((est, cand), (low, high)) in enumerate(zip(ranked, bands))]


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
    if req.model.is_moe:
        candidates = _fewest_checkpointed_layers(candidates)
    for i, plan in enumerate(candidates, 1):
        if progress is not None and i % 256 == 0:
            progress("screening", i, len(candidates))
        if isinstance(plan, list):  # one layout's block recomputes, fewest checkpointed layers first
            plan = _first_that_fits(req, plan, capacity, closest)
            if plan is None:
                continue
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
    plans = _with_bands(req, profile, ranked[:top])
    return SearchResult(plans=plans, screened=screened, enumerated=enumerated,
                        pruned_memory=enumerated - len(screened), simulated=len(ranked),
                        elapsed_s=time.perf_counter() - started)
