"""Capacity planning: what to book, by when, at what cost.

The question a team brings is "we must train this model on these tokens by this date (or within this budget):
which GPUs, how many, which plan, what will it cost in GPU-hours, money and energy, and how sure are we?".
``plan_capacity`` answers it over several cluster kinds: for each kind and GPU count the walk asks for
(``capacity_grid``), the best plan of the search (``plan_search.search``, ranked as `search` and `sweep` rank
plans, among its DEFAULT_FINALISTS fastest by the closed-form screen),
its days with failures, checkpoints and restarts as one P10 / P50 / P90 (``capacity_interval``), and from them
the GPU-hours, cost, energy and emissions (``simulator.spec.economics``), each with its band. Then the answer
to the goal (``capacity_explain``): the cheapest option that finishes by the deadline at the chosen confidence,
the fastest within the budget, or, without a goal, the Pareto frontier of days against cost; what binds at the
answer; and where each cluster's curve bends.

An option's figures at the confidence (its days at P50 or P90) are what a booking for that long costs: the
GPU-hours are GPUs x 24 x those days, the cost the declared price times them. Each band runs from the P10 days
with every declared figure (price, power, PUE, carbon intensity) at the low end of its range to the P90 days
with every one at its high end: a bound, not a percentile, since a price range is a choice of contract.
"""

from __future__ import annotations

import time
from enum import Enum
from typing import Callable, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from simulator.estimator.goodput import GoodputSettings
from simulator.planner.capacity_explain import (
    Bend,
    budget_answer,
    deadline_answer,
    frontier_binding,
    mark_frontier,
    priced_ok,
)
from simulator.planner.capacity_explain import bends as curve_bends
from simulator.planner.capacity_grid import (
    bisection_walk,
    boundary_walk,
    bracket,
    cluster_counts,
    run_walks,
    runner,
)
from simulator.planner.capacity_interval import DEFAULT_SAMPLES
from simulator.spec import limits
from simulator.spec.economics import ClusterEconomics
from simulator.spec.errors import SimulatorError
from simulator.spec.hardware import ClusterSpec
from simulator.spec.model import ModelSpec
from simulator.spec.plan import ParallelPlan

HOURS_PER_DAY = 24.0
# A capacity question runs a search per point; each simulates this many of its fastest plans by the closed-form
# screen, where `search` simulates 16: the engine and the bands of the finalists take a third or more of a search,
# and `simulator search --gpus N` still ranks 16 for the plan of the count chosen
DEFAULT_FINALISTS = 4
# simulated runs of each point's failures (unless the settings name theirs): its P10 and P90 are the joint sample's
# failure timing, and two hundred place them within a percent or two of the spread
FAILURE_RUNS = 200
# a cluster is refined near a deadline unless its options either side of it cost this much more than the best
REFINE_MARGIN = 0.25
# bounds of the goal's figures: past them a question is a typo, not a plan
MAX_DEADLINE_DAYS = 36_500.0  # a century
MAX_BUDGET_USD = 1e15
MAX_PRICE_PER_GPU_HOUR_USD = 1e6


class Confidence(str, Enum):
    """The share of runs that finish within the days an option is judged by."""

    p50 = "P50"
    p90 = "P90"


class Goal(str, Enum):
    deadline = "deadline"  # the cheapest option that finishes by the deadline
    budget = "budget"  # the fastest option within the budget
    frontier = "frontier"  # no goal: the Pareto frontier of days against cost


class CapacityRequest(BaseModel):
    """A capacity question: the run, the clusters and GPU counts it may use, and the goal."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: ModelSpec
    clusters: tuple[ClusterSpec, ...] = Field(min_length=1)
    economics: tuple[ClusterEconomics, ...] = Field(description="Each cluster's price, power, PUE and carbon, in "
                                                                "the order of clusters.")
    tokens: float = Field(gt=0, le=limits.MAX_TOKENS, description="Training tokens.")
    global_batch_size: int = Field(gt=0, le=limits.MAX_GLOBAL_BATCH_SIZE, description="Sequences per iteration.")
    gpus: tuple[int, ...] | None = Field(None, min_length=1, description="The GPU counts to search, as given.")
    gpus_min: int | None = Field(None, gt=0, le=limits.MAX_GPUS)
    gpus_max: int | None = Field(None, gt=0, le=limits.MAX_GPUS)
    deadline_days: float | None = Field(None, gt=0, le=MAX_DEADLINE_DAYS, description="Days the run must finish "
                                                                                       "within.")
    budget_usd: float | None = Field(None, gt=0, le=MAX_BUDGET_USD, description="The most the run may cost, US "
                                                                                "dollars.")
    confidence: Confidence = Confidence.p90
    refine: int = Field(2, ge=0, le=10, description="Bisection steps between the counts either side of the goal's "
                                                    "boundary.")
    every_count: bool = Field(False, description="Search every count of the range, not only where the goal's "
                                                 "boundary lies.")
    goodput: GoodputSettings = GoodputSettings()
    samples: int = Field(DEFAULT_SAMPLES, ge=10, le=100_000, description="Joint samples of each option's days.")
    finalists: int = Field(DEFAULT_FINALISTS, gt=0, le=limits.MAX_TOP,
                           description="Plans each search simulates after its closed-form screen (`search` "
                                       "simulates 16); the best of them is the point's plan.")

    @model_validator(mode="after")
    def _one_goal_and_one_entry_per_cluster(self) -> "CapacityRequest":
        if self.deadline_days is not None and self.budget_usd is not None:
            raise ValueError("give a deadline (the cheapest option by then) or a budget (the fastest within it), "
                             "not both")
        names = [c.name for c in self.clusters]
        twice = next((n for n in names if names.count(n) > 1), None)
        if twice is not None:
            raise ValueError(f"cluster {twice!r} is named twice; name each cluster once")
        if [e.cluster for e in self.economics] != names:
            raise ValueError("economics must give each cluster's figures, in the order of the clusters")
        if self.gpus is not None and (self.gpus_min is not None or self.gpus_max is not None):
            raise ValueError("give the GPU counts (--gpus) or their range (--gpus-min, --gpus-max), not both")
        if self.gpus_min is not None and self.gpus_max is not None and self.gpus_min > self.gpus_max:
            raise ValueError(f"the GPU range {self.gpus_min:,}-{self.gpus_max:,} is empty; give --gpus-min at most "
                             "--gpus-max")
        return self

    @property
    def goal(self) -> Goal:
        return (Goal.deadline if self.deadline_days is not None else Goal.budget if self.budget_usd is not None
                else Goal.frontier)


class CapacityPoint(BaseModel):
    """One search of the question: a cluster and a GPU count."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: ModelSpec
    cluster: ClusterSpec
    gpus: int = Field(gt=0, le=limits.MAX_GPUS)
    global_batch_size: int
    tokens: float
    goodput: GoodputSettings
    samples: int
    finalists: int = DEFAULT_FINALISTS


class PointResult(BaseModel):
    """A point's best plan and its days, or why it has none: all a search says, before prices."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    cluster: str
    gpus: int
    nodes: int
    status: Literal["ok", "no plan", "no expected days"]
    message: str = ""
    plan: ParallelPlan | None = None
    plan_name: str | None = None
    iteration_time_s: float | None = None
    iteration_time_s_low: float | None = None
    iteration_time_s_high: float | None = None
    mfu: float | None = None
    peak_gib: float | None = None
    ideal_days: float | None = Field(None, description="Iterations x iteration time: no failure, no checkpoint.")
    expected_days: float | None = Field(None, description="The closed form's mean with failures, saves, restarts.")
    ettr: float | None = None
    save_interval: int | None = None
    simulated_p10_days: float | None = Field(None, description="The failure timing's Monte Carlo at the point "
                                                               "values, for comparison with the joint interval.")
    simulated_p90_days: float | None = None
    days_p10: float | None = Field(None, description="The joint sample's P10 of the days (None: never finishing).")
    days_p50: float | None = None
    days_p90: float | None = None


class Figure(BaseModel):
    """A figure at the confidence, with its band (see the module's docstring); None where the run never ends."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    low: float | None
    value: float | None
    high: float | None


class CapacityOption(PointResult):
    """A point with what it costs: GPU-hours, money, energy and emissions at the confidence, each with its band."""

    refined: bool = Field(False, description="Searched by the bisection near the goal's boundary.")
    days: float | None = Field(None, description="The days at the confidence (P50 or P90).")
    price_per_gpu_hour_usd: float
    gpu_hours: Figure | None = None
    cost_usd: Figure | None = None
    energy_mwh: Figure | None = None
    tco2e: Figure | None = None
    on_frontier: bool = Field(False, description="No other option is both faster and cheaper at the confidence.")


def evaluate_point(point: CapacityPoint) -> PointResult:
    """The best plan of ``point``'s search and its days (never raises a user error: the result says why)."""
    from simulator.estimator.goodput import EndlessRunError, goodput
    from simulator.planner.capacity_interval import joint_days
    from simulator.planner.plan_search import SearchRequest, search
    from simulator.spec.plan import Job
    from simulator.spec.plan_names import compact_plan_name

    base = dict(cluster=point.cluster.name, gpus=point.gpus, nodes=point.gpus // point.cluster.gpus_per_node)
    try:
        req = SearchRequest(model=point.model, cluster=point.cluster, num_gpus=point.gpus,
                            global_batch_size=point.global_batch_size, goodput=point.goodput,
                            finalists=point.finalists)
        best = search(req, tokens=point.tokens, top=1).best
    except SimulatorError as exc:
        return PointResult(**base, status="no plan", message=" ".join(str(exc).split()))
    est = best.estimate
    found = dict(plan=best.plan, plan_name=compact_plan_name(best.plan), iteration_time_s=est.iteration_time_s,
                 iteration_time_s_low=est.iteration_time_s_low, iteration_time_s_high=est.iteration_time_s_high,
                 mfu=est.mfu, peak_gib=est.memory.peak_bytes / 2**30, ideal_days=est.training_days)
    job = Job(model=point.model, cluster=point.cluster, plan=best.plan)
    try:
        g = goodput(job, est, point.goodput, simulate=True)
    except EndlessRunError as exc:
        return PointResult(**base, **found, status="no expected days", message=" ".join(str(exc).split()))
    interval = joint_days(job, est, g, point.goodput, point.samples)
    return PointResult(**base, **found, status="ok", expected_days=g.expected_days, ettr=g.ettr,
                       save_interval=g.save_interval, simulated_p10_days=g.p10_days, simulated_p90_days=g.p90_days,
                       days_p10=interval.p10_days, days_p50=interval.p50_days, days_p90=interval.p90_days)


def priced(result: PointResult, economics: ClusterEconomics, confidence: Confidence,
           refined: bool = False) -> CapacityOption:
    """``result`` with its GPU-hours, cost, energy and emissions at ``confidence`` (see the module's docstring)."""
    days = result.days_p50 if confidence is Confidence.p50 else result.days_p90
    out = CapacityOption(**result.model_dump(), refined=refined, days=days,
                         price_per_gpu_hour_usd=economics.price_per_gpu_hour_usd.value)
    if result.status != "ok":
        return out

    def hours(d: float | None) -> float | None:
        return None if d is None else result.gpus * HOURS_PER_DAY * d

    h = Figure(low=hours(result.days_p10), value=hours(days), high=hours(result.days_p90))

    def figure(of: Callable[[float, str], float]) -> Figure:
        return Figure(**{end: None if getattr(h, end) is None else of(getattr(h, end), end)
                         for end in ("low", "value", "high")})

    return out.model_copy(update=dict(gpu_hours=h, cost_usd=figure(economics.cost_usd),
                                      energy_mwh=figure(economics.energy_mwh), tco2e=figure(economics.tco2e)))


def meets_deadline(option: CapacityOption, deadline_days: float) -> bool:
    return option.days is not None and option.days <= deadline_days


def within_budget(option: CapacityOption, budget_usd: float) -> bool:
    return option.cost_usd is not None and option.cost_usd.value is not None and option.cost_usd.value <= budget_usd


class CapacityResult(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    goal: Goal
    confidence: Confidence
    deadline_days: float | None
    budget_usd: float | None
    options: list[CapacityOption] = Field(description="Every point searched, by cluster (as given) and GPUs.")
    answer: CapacityOption | None = Field(description="The goal's answer; None without a goal or where none meets it.")
    fastest: CapacityOption | None = Field(description="The option with the fewest days at the confidence.")
    binding: str = Field(description="What binds at the answer (or, with none, at the fastest or cheapest option): "
                                     "deadline, budget, memory, global batch, failures, scaling, GPU range or none.")
    binding_note: str
    bends: list[Bend] = Field(description="Where each cluster's curve bends: the global batch caps DP, the per-GPU "
                                          "work becomes too small, failures cost a tenth of the run.")
    searches: int
    elapsed_s: float


def answer_job(req: CapacityRequest, result: CapacityResult):
    """The job of the answer (the request's model on the answer's cluster, with its plan); None without one."""
    from simulator.spec.plan import Job

    a = result.answer
    if a is None or a.plan is None:
        return None
    cluster = next(c for c in req.clusters if c.name == a.cluster)
    return Job(model=req.model, cluster=cluster, plan=a.plan)


def plan_capacity(req: CapacityRequest, evaluate: Callable[[CapacityPoint], PointResult] | None = None,
                  workers: int = 1, ray_address: str | None = None,
                  progress: Callable[[int, int], None] | None = None) -> CapacityResult:
    """Walk each cluster's counts, search the points the goal needs (``evaluate``: ``evaluate_point``, a search
    each), price them and answer the goal."""
    started = time.perf_counter()
    evaluate = evaluate or evaluate_point
    by_name = {c.name: (c, e) for c, e in zip(req.clusters, req.economics)}
    counts = {c.name: cluster_counts(req.model, c, req.gpus_min, req.gpus_max, req.gpus) for c in req.clusters}
    if req.goal is Goal.deadline:
        past = lambda o: meets_deadline(o, req.deadline_days)  # noqa: E731
    elif req.goal is Goal.budget:
        # a count with no plan has no cost: it lies short of the budget (fewer GPUs than fit), never past it
        past = lambda o: o.status == "ok" and not within_budget(o, req.budget_usd)  # noqa: E731
    else:
        past = None
    every = req.every_count or req.gpus is not None

    settings = req.goodput if req.goodput.runs is not None else req.goodput.model_copy(update={"runs": FAILURE_RUNS})

    def task(name: str, count: int) -> CapacityPoint:
        return CapacityPoint(model=req.model, cluster=by_name[name][0], gpus=count,
                             global_batch_size=req.global_batch_size, tokens=req.tokens, goodput=settings,
                             samples=req.samples, finalists=req.finalists)

    found: dict[tuple[str, int], CapacityOption] = {}

    def walk_all(walks: dict, on) -> None:
        offset = len(found)
        shown = None if progress is None else lambda done, total: progress(offset + done, offset + total)
        for name, count, result in run_walks(walks, task, on, shown):
            found[(name, count)] = priced(result, by_name[name][1], req.confidence, count not in counts[name])

    with runner(evaluate, list(counts), workers, ray_address) as on:
        walk_all({name: _priced_walk(boundary_walk(cs, past, every), by_name[name][1], req.confidence)
                  for name, cs in counts.items()}, on)
        if past is not None and req.refine:
            walk_all(_bisections(req, found, past, {name: c.gpus_per_node for name, (c, _) in by_name.items()}), on)
    order = {c.name: i for i, c in enumerate(req.clusters)}
    options = [found[k] for k in sorted(found, key=lambda k: (order[k[0]], k[1]))]
    options = mark_frontier(options)
    bottoms = {name: cs[0] for name, cs in counts.items()}
    tops = {name: cs[-1] for name, cs in counts.items()}
    label = req.confidence.value
    if req.goal is Goal.deadline:
        answer, binding, note = deadline_answer(options, req.deadline_days, label, bottoms, tops)
    elif req.goal is Goal.budget:
        answer, binding, note = budget_answer(options, req.budget_usd, label, bottoms, tops)
    else:
        answer, (binding, note) = None, frontier_binding(options, tops)
    ok = priced_ok(options)
    return CapacityResult(goal=req.goal, confidence=req.confidence, deadline_days=req.deadline_days,
                          budget_usd=req.budget_usd, options=options, answer=answer,
                          fastest=min(ok, key=lambda o: (o.days, o.cost_usd.value)) if ok else None,
                          binding=binding, binding_note=note, bends=curve_bends(options, req.global_batch_size),
                          searches=len(options), elapsed_s=time.perf_counter() - started)


def _priced_walk(inner, economics: ClusterEconomics, confidence: Confidence):
    """``inner`` (a walk over options) fed with the searches' results priced, as its goal judges them."""
    step = next(inner, None)
    while step is not None:
        results = yield step
        try:
            step = inner.send({c: priced(r, economics, confidence) for c, r in results.items()})
        except StopIteration:
            return


def _bisections(req: CapacityRequest, found: dict, past, gpus_per_node: dict[str, int]) -> dict:
    """The bisection of each cluster's nodes between the counts either side of the goal's boundary. Under a
    deadline, a cluster whose two options there both cost more than REFINE_MARGIN over the cheapest option that
    meets it is left as it is: a count between them would have to cut the GPU-hours by as much to compete."""
    economics = dict(zip((c.name for c in req.clusters), req.economics))
    incumbent = None
    if req.goal is Goal.deadline:
        meeting = [o.cost_usd.value for o in priced_ok(list(found.values())) if past(o)]
        incumbent = min(meeting, default=None)
    walks = {}
    for c in req.clusters:
        mine = {count: o for (name, count), o in found.items() if name == c.name}
        ends = bracket(mine, past)
        if ends is None:
            continue
        costs = [mine[e].cost_usd.value for e in ends if mine[e].cost_usd is not None]
        if incumbent is not None and costs and min(costs) > incumbent * (1 + REFINE_MARGIN):
            continue
        walks[c.name] = _priced_walk(bisection_walk(*ends, gpus_per_node[c.name], past, req.refine),
                                     economics[c.name], req.confidence)
    return walks


__all__ = ["CapacityOption", "CapacityPoint", "CapacityRequest", "CapacityResult", "Confidence", "Goal", "PointResult",
           "evaluate_point", "plan_capacity", "priced"]
