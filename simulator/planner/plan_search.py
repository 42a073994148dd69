"""The auto-configurator: every valid plan for a model on N GPUs, the fastest that fits first.

Three tiers, cheapest first, as NeMo's hyper-parameter tool narrows its grid:
1. enumerate the space (TP up to a node, PP dividing the layers, virtual stages, micro-batch,
   SP, recompute with every useful number of checkpointed layers, distributed optimizer), with
   the arithmetic rules of ``ParallelPlan``/``Job`` applied while generating, not after
   (``simulator.planner.space``);
2. prune by memory (the first and last stage bound every other) and screen the survivors with a
   closed form over the same per-step durations the engine plays (``fast_iteration_time_s``); the
   parts of both that many candidates share are computed once (``simulator.planner.memo``), and a
   candidate becomes a pydantic plan only once it fits;
3. simulate the finalists with the discrete-event engine and rank them: by default by the slow end of
   their band (``SearchRequest.rank_by``), so that a plan outside every regime the measured runs cover,
   or faster than any of them ran, pays for what nothing vouches for; or by the iteration time alone; or by
   the expected days of the run, its iteration time over its ETTR (failures, checkpoints, restarts), where a
   plan whose checkpoint is larger or slower to load pays for it.
"""

from __future__ import annotations

import gc
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator

from pydantic import BaseModel, ConfigDict, Field

from simulator.cost.profile import HardwareProfile
from simulator.estimator.band import Band, banded, corners_by, run_band, unread_constants, widened
from simulator.estimator.goodput import effective_iteration_time_s
from simulator.estimator.prediction import Estimate, model_flops_per_sequence, simulate_job
from simulator.planner.memo import SearchMemo, peak_bytes
from simulator.planner.space import (
    CP_MIN_TOKENS_PER_RANK,
    CP_SIZES,
    MICRO_BATCH_SIZES,
    Candidate,
    RankBy,
    SearchPins,
    SearchRequest,
    candidates,
    enumerate_plans,
    pipeline_splits,
    plan_template,
)
from simulator.schedule.screen import fast_iteration_time_s, screen
from simulator.spec.errors import InfeasiblePlanError
from simulator.spec.plan import Job, ParallelPlan, RecomputeMethod
from simulator.spec.units import gib

# How far the closed-form screen may be from the engine (tests/planner/test_search.py checks it on the
# finalists); the band's corners are the engine time scaled by the screen's, so they lean on it too.
SCREEN_MARGIN = 0.03


class RankedPlan(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)  # times are finite (an invariant)

    rank: int
    plan: ParallelPlan
    estimate: Estimate
    screen_time_s: float = Field(description="The closed-form screen's iteration time for this plan.")
    iteration_time_s_low: float | None = Field(
        None, description="The iteration time at the band's fast corner (this plan's unpinned constants at the "
                          "ends that make it fastest), never above its iteration time.")
    iteration_time_s_high: float | None = Field(None, description="... at the slow corner, never below it.")
    within_band_of_best: bool = Field(
        False, description="Its lead (or the best plan's) flips at a corner of the band: the profile cannot tell "
                           "the two apart.")
    validation_regime: str | None = Field(
        None, description="The measured regime the plan lies in (GPU kind and the sets measured on it); None outside.")
    outside_regime_reasons: tuple[str, ...] = Field((), description="Why the plan lies outside every measured regime.")
    band_from_runs: tuple[str, ...] = Field(
        (), description="The runs of a profile fitted by calibrate --from-runs whose errors give the band (empty: the "
                        "regime's band).")
    rank_key_s: float | None = Field(
        None, description="What the plan was ranked by: the band's slow end (rank_by upper), its iteration time "
                          "(point), or its wall seconds per useful iteration with failures (expected-days).")


class ScreenedPlan(BaseModel):
    """A plan that fits, with its closed-form time (every survivor of the memory prune)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

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


def _fewest_checkpointed_layers(cands: list[Candidate]) -> list:
    """An MoE model multiplies the space by EP and ETP. There each layout's block-recompute candidates
    are gathered (in place of the first) into one list, of which only the one with the fewest
    checkpointed layers that fits is screened: each layer more only adds recompute time and saves memory."""
    out: list = []
    groups: dict[tuple, list] = {}
    for c in cands:
        if c.recompute.method is not RecomputeMethod.block:
            out.append(c)
            continue
        key = (c.t, c.cp, c.p, c.d, c.v, c.mbs, c.sp, c.sharding, c.ep, c.etp, c.split)
        if key not in groups:
            groups[key] = []
            out.append(groups[key])
        groups[key].append(c)
    return out


def _first_that_fits(memo: SearchMemo, cands: list[Candidate], capacity: int, closest: "_Closest"):
    """The candidate of ``cands`` (more checkpointed layers, less memory, one after another) with the
    fewest checkpointed layers that fits, found by bisection; None (noting the closest miss) when none fits."""
    lo, hi = 0, len(cands) - 1
    last = memo.peak_bytes(cands[hi])
    if last > capacity:
        closest.note(cands[hi], last, capacity)
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        if memo.peak_bytes(cands[mid]) <= capacity:
            hi = mid
        else:
            lo = mid + 1
    return cands[lo]


@dataclass
class _Closest:
    """The candidate that missed the GPU's memory by the least."""

    overflow_bytes: float = float("inf")
    candidate: Candidate | None = None
    peak: int = 0

    def note(self, c: Candidate, peak: int, capacity: int) -> None:
        if peak - capacity < self.overflow_bytes:
            self.overflow_bytes, self.candidate, self.peak = peak - capacity, c, peak


def _with_bands(req: SearchRequest, profile, template: ParallelPlan, ranked: list) -> list[RankedPlan]:
    """The ranked plans with their bands. A plan's band is its own, as ``band.band`` gives it: each unpinned
    constant at the ends that make this plan fastest (or slowest), each corner timed as the plan's engine
    time scaled by what the screen says the corner does to it (the screen at the profile itself is the
    plan's screen time), and the band widened to hold the engine time. Whether a plan is within the band
    of the best is judged at the best plan's corners, where both plans are timed under the same constants."""
    if not ranked:
        return []
    base_profile = SearchMemo(req, template, profile).cost.profile
    memos: dict[tuple[float, ...], SearchMemo] = {}  # a profile's unpinned values (all it differs in) -> its memo

    def screen_at(p, cand: ScreenedPlan, layout: Candidate) -> float:
        key = tuple(value for _, value, _, _ in p.unpinned())
        if key not in memos:
            memos[key] = SearchMemo(req, template, p)
        return memos[key].screen_s(layout, cand.plan)

    rows = []
    for est, cand, layout in ranked:
        t, base = est.iteration_time_s, cand.screen_time_s
        job = Job.model_construct(model=req.model, cluster=req.cluster, plan=cand.plan)
        own = corners_by(base_profile, lambda path, end: screen_at(base_profile.with_value(path, end), cand, layout)
                         / base - 1, unread=unread_constants(job, base_profile))
        calibrated = run_band(job, base_profile)
        # a profile fitted to runs like this plan: their left-out errors are its band, not the corners
        fast, slow = (t, t) if calibrated is not None else (t * screen_at(c, cand, layout) / base
                                                            for c in (own.fast, own.slow))
        low, high, regime = widened(job, t, est.mfu, min(t, fast, slow), max(t, fast, slow), calibrated)
        b = Band(iteration_time_s_low=low, iteration_time_s_high=high, drivers=own.drivers, regime=regime)
        rows.append((_rank_key(req, job, t, high), banded(est, b), cand, layout, own))
    rows.sort(key=lambda r: rank_order(r[0], r[1].iteration_time_s))  # stable: ties keep the engine's order
    best = rows[0][4]

    def at_best(row) -> tuple[float, float]:
        est, cand, layout = row[1], row[2], row[3]
        scale = est.iteration_time_s / cand.screen_time_s
        return scale * screen_at(best.fast, cand, layout), scale * screen_at(best.slow, cand, layout)

    best_low, best_high = at_best(rows[0])
    out = []
    for i, row in enumerate(rows):
        key, est, cand = row[0], row[1], row[2]
        low, high = at_best(row) if i else (best_low, best_high)
        out.append(RankedPlan(rank=i + 1, plan=cand.plan, estimate=est, screen_time_s=cand.screen_time_s,
                              iteration_time_s_low=est.iteration_time_s_low,
                              iteration_time_s_high=est.iteration_time_s_high,
                              within_band_of_best=i > 0 and (low <= best_low or high <= best_high),
                              validation_regime=est.validation_regime,
                              outside_regime_reasons=est.outside_regime_reasons,
                              band_from_runs=est.band_from_runs, rank_key_s=key))
    return out


def _rank_key(req: SearchRequest, job: Job, iteration_time_s: float, high: float | None) -> float:
    """What a plan is ranked by, in seconds, never below its iteration time (the search's pruning relies on it)."""
    if req.rank_by is RankBy.upper:
        return high
    if req.rank_by is RankBy.expected_days:
        return effective_iteration_time_s(job, iteration_time_s, req.goodput)
    return iteration_time_s


def rank_order(key_s: float, iteration_time_s: float) -> tuple[float, float]:
    """Sort by the rank key, then by the point. Keys equal to 12 digits are a tie: every plan above the best
    measured MFU has the same slow end (the time at that MFU, widened), up to the rounding of the product."""
    return float(f"{key_s:.12g}"), iteration_time_s


def _finalists(req: SearchRequest, profile, memo: SearchMemo, screened: list[ScreenedPlan], n: int) -> list[int]:
    """Which ``n`` of the screened plans (in screen order) the engine plays: the fastest by the screen; ranking
    by the slow end, the screen's ``n // 4`` fastest and the rest those whose slow end comes first at their
    screen time. The screen's fastest are often all outside every measured regime (or above the best measured
    MFU), and ranking only them by their slow ends would reorder them among themselves while a plan the runs
    vouch for waits behind; the fastest few are played too, so that `search` can say which plan
    ``--rank-by point`` would pick."""
    n = min(n, len(screened))
    if req.rank_by is not RankBy.upper:
        return list(range(n))
    slow = _screen_slow_ends(req, profile, memo, screened)
    by_slow_end = sorted(range(len(screened)), key=lambda i: rank_order(slow[i], screened[i].screen_time_s))
    return list(dict.fromkeys(list(range(max(1, n // 4))) + by_slow_end))[:n]


def _screen_slow_ends(req: SearchRequest, profile, memo: SearchMemo, screened: list[ScreenedPlan]) -> list[float]:
    """Each screened plan's slow end from the model's error in its regime alone, at its screen time."""
    model_flops = model_flops_per_sequence(Job.model_construct(model=req.model)) * req.global_batch_size
    peak = req.num_gpus * memo.cost.peak_flops
    fitted = profile if isinstance(profile, HardwareProfile) else None
    out = []
    for cand in screened:
        t = cand.screen_time_s
        job = Job.model_construct(model=req.model, cluster=req.cluster, plan=cand.plan)
        out.append(widened(job, t, model_flops / (t * peak), t, t, run_band(job, fitted))[1])
    return out


def search(req: SearchRequest, profile=None, tokens: float | None = None, top: int = 10,
           progress: Callable[[str, int, int], None] | None = None) -> SearchResult:
    """Rank every valid plan that fits by simulated iteration time.

    ``progress(phase, done, total)`` is called as the screen ("screening") and the engine
    ("simulating") work through their candidates.
    """
    with _without_cyclic_gc():
        return _search(req, profile, tokens, top, progress)


@contextmanager
def _without_cyclic_gc() -> Iterator[None]:
    """A search allocates millions of short-lived tuples and no reference cycles that outlive it; the
    cyclic collector would only rescan its memo and the cached layer graphs over and over (a sixth of
    a dense search's time and a fifth of an MoE search's), as it would the engine's events."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


def _search(req: SearchRequest, profile, tokens: float | None, top: int,
            progress: Callable[[str, int, int], None] | None) -> SearchResult:
    started = time.perf_counter()
    capacity = req.cluster.gpu.memory_bytes
    template = plan_template(req)
    memo = SearchMemo(req, template, profile)
    screened: list[ScreenedPlan] = []
    layouts: list[Candidate] = []  # each screened plan's candidate
    closest = _Closest()
    space = list(candidates(req))
    enumerated = len(space)
    todo = _fewest_checkpointed_layers(space) if req.model.is_moe else space
    for i, c in enumerate(todo, 1):
        if progress is not None and i % 256 == 0:
            progress("screening", i, len(todo))
        if isinstance(c, list):  # one layout's block recomputes, fewest checkpointed layers first
            c = _first_that_fits(memo, c, capacity, closest)
            if c is None:
                continue
        peak = memo.peak_bytes(c)
        if peak > capacity:
            closest.note(c, peak, capacity)
            continue
        plan = memo.job(c).plan
        screened.append(ScreenedPlan(plan=plan, screen_time_s=memo.screen_s(c, plan), peak_bytes=peak))
        layouts.append(c)
    if enumerated == 0:
        raise InfeasiblePlanError(
            f"no plan of {req.model.name} on {req.num_gpus} GPUs with global batch {req.global_batch_size} satisfies "
            "the parallelism rules and the pinned dimensions; relax a pin or change the GPU count or batch"
        )
    if not screened:
        p = closest.candidate.plan(template)
        raise InfeasiblePlanError(
            f"no plan of {req.model.name} fits in {gib(capacity):.0f} GiB per GPU on {req.num_gpus} GPUs; the closest "
            f"(TP {p.tensor_parallel_size}, PP {p.pipeline_parallel_size}, micro-batch {p.micro_batch_size}, "
            f"recompute {p.recompute.granularity.value}) needs {gib(closest.peak):.1f} GiB, "
            f"{gib(closest.overflow_bytes):.1f} GiB too many; use more GPUs or GPUs with more memory"
        )
    order = sorted(range(len(screened)), key=lambda i: screened[i].screen_time_s)  # stable: ties keep their order
    screened, layouts = [screened[i] for i in order], [layouts[i] for i in order]
    # The engine plays the n fastest by the screen, and every one of them is ranked and banded before the list
    # is cut to ``top``: the final order is by each plan's own band, which no early stop can foresee, so
    # stopping once ``top`` plans were ahead let ``top`` change which plan comes first (GPT-3 175B on 512 A100s:
    # top 1 gave a plan 9% slower than top 5), and the sweep (top 1) and `search` (top 5) disagreed.
    n = max(req.finalists, top)
    finalists = _finalists(req, profile, memo, screened, n)
    ranked = []  # (rank key, estimate, screened plan, layout), best first
    for simulated, (cand, layout) in enumerate(((screened[i], layouts[i]) for i in finalists), 1):
        job = Job(model=req.model, cluster=req.cluster, plan=cand.plan)
        est = simulate_job(job, profile, tokens).estimate
        key = _rank_key(req, job, est.iteration_time_s,
                        widened(job, est.iteration_time_s, est.mfu, est.iteration_time_s, est.iteration_time_s,
                                run_band(job, profile if isinstance(profile, HardwareProfile) else None))[1]
                        if req.rank_by is RankBy.upper else None)
        ranked.append((key, est, cand, layout))
        if progress is not None:
            progress("simulating", simulated, len(finalists))
    ranked.sort(key=lambda r: rank_order(r[0], r[1].iteration_time_s))  # stable: ties keep the screen's order
    plans = _with_bands(req, profile, template, [(est, cand, layout) for _, est, cand, layout in ranked])[:top]
    return SearchResult(plans=plans, screened=screened, enumerated=enumerated,
                        pruned_memory=enumerated - len(screened), simulated=len(ranked),
                        elapsed_s=time.perf_counter() - started)
