"""The numbers each figure draws, computed from the library (no matplotlib here).

Every function returns a plain JSON-able dict: ``simulator plot KIND --json`` prints it, the report
caches it, and ``simulator.outputs.plots`` draws it. Each dict has a ``title`` naming the model, cluster,
GPUs, global batch, sequence length, precision and attention backend it was computed for.
"""

from __future__ import annotations

import copy
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Iterable

from simulator.estimator.memory import memory_plan
from simulator.estimator.prediction import Estimate, Simulation, simulate_job
from simulator.outputs.describe import job_title, layout, settings_json, short_layout, title
from simulator.spec.plan_names import sharding_name
from simulator.planner.plan_search import MICRO_BATCH_SIZES, SearchRequest, SearchResult, search
from simulator.spec.errors import InfeasiblePlanError
from simulator.spec.plan import Job, ParallelPlan, RecomputeGranularity, RecomputeMethod, RecomputePolicy
from simulator.spec.units import gib

BREAKDOWN_LABELS = {"compute_s": "compute", "tp_communication_s": "TP communication (exposed)",
                    "pipeline_bubble_s": "pipeline bubble", "pipeline_transfer_s": "pipeline transfers (exposed)",
                    "data_parallel_s": "DP gradient reduction (exposed)", "optimizer_s": "optimizer step"}


def breakdown_parts(est: Estimate) -> dict[str, float]:
    """Every part of the estimate's breakdown (they sum to the iteration time), in the model's order."""
    return est.breakdown.model_dump()


def breakdown_label(part: str) -> str:
    return BREAKDOWN_LABELS.get(part, part.removesuffix("_s").replace("_", " "))
STREAM_CODES = {"compute": 0, "send_forward": 1, "send_backward": 2, "dp": 3}
REPO = Path(__file__).resolve().parents[2]
CPU_VALIDATION = REPO / "reports" / "cpu-validation"


def request_title(req: SearchRequest) -> str:
    plan = ParallelPlan(precision=req.precision, use_flash_attention=req.use_flash_attention)
    return title(req.model, req.cluster, req.num_gpus, req.global_batch_size, plan)


def pareto_front(points: list[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point beats on both axes (less memory x, more throughput y)."""
    order = sorted(range(len(points)), key=lambda i: (points[i][0], -points[i][1]))
    front, best = [], float("-inf")
    for i in order:
        if points[i][1] > best:
            front.append(i)
            best = points[i][1]
    return front


def pareto_data(result: SearchResult, req: SearchRequest) -> dict[str, Any]:
    """Every plan that fits: peak memory, tokens/s and MFU from the closed-form screen; the front; the
    simulated plans. MFU scales as 1 / time: the model FLOPs and peak of every plan are the same."""
    best = result.best.estimate
    tokens = req.global_batch_size * req.model.seq_length
    mfu_seconds = best.mfu * best.iteration_time_s
    plans = [[gib(s.peak_bytes), tokens / s.screen_time_s, mfu_seconds / s.screen_time_s, s.screen_time_s,
              short_layout(s.plan)] for s in result.screened]
    front = pareto_front([(p[0], p[1]) for p in plans])
    simulated = [[gib(r.estimate.memory.peak_bytes), r.estimate.tokens_per_s, r.estimate.mfu, r.estimate.iteration_time_s,
                  short_layout(r.plan)] for r in result.plans]
    return {"kind": "pareto", "title": request_title(req), "capacity_gib": gib(req.cluster.gpu.memory_bytes),
            "columns": ["peak_gib", "tokens_per_s", "mfu", "iteration_time_s", "plan"], "plans": plans,
            "front": front, "simulated": simulated, "best": layout(result.best.plan), "rank_by": req.rank_by.value}


def timeline_data(sim: Simulation, job: Job, steps: tuple[int, int] | None = None) -> dict[str, Any]:
    """The engine's intervals, [stage, stream, start_s, end_s, micro-batch, chunk, phase]; ``steps`` = (a, b)
    zooms to the span of each stage's steps a..b-1 (schedule order)."""
    rows = []
    for iv in sim.engine.intervals:
        step = iv.step
        kind = "optimizer" if iv.stream == "compute" and step is None else iv.stream
        rows.append([iv.stage, kind, iv.start_s, iv.end_s, step.micro_batch if step else None,
                     step.chunk if step else None, step.phase.value if step else None])
    window = None
    if steps is not None:
        a, b = steps
        per_stage: dict[int, list[list]] = {}
        for r in rows:
            if r[6] is not None:
                per_stage.setdefault(r[0], []).append(r)
        count = min(len(v) for v in per_stage.values())
        if not 0 <= a < b <= count:
            from simulator.spec.errors import ConfigError

            raise ConfigError(f"--steps {a}:{b} is outside the {count} steps each stage plays; use 0 <= A < B <= {count}")
        window = [min(v[a][2] for v in per_stage.values()), max(v[b - 1][3] for v in per_stage.values()), a, b]
    return {"kind": "timeline", "title": job_title(job), "plan": layout(job.plan),
            "iteration_time_s": sim.estimate.iteration_time_s, "stages": job.plan.pipeline_parallel_size,
            "micro_batches": job.plan.num_micro_batches, "window": window, "intervals": rows}


def stage_memory_data(job: Job) -> dict[str, Any]:
    mem = memory_plan(job)
    parts = {"weights": [gib(s.weights_bytes) for s in mem.stages],
             "gradients": [gib(s.gradients_bytes) for s in mem.stages],
             "optimizer state": [gib(s.optimizer_bytes) for s in mem.stages],
             "activations": [gib(s.activations_bytes) for s in mem.stages],
             "transient": [gib(s.transient_bytes) for s in mem.stages],
             "reserve": [gib(s.reserve_bytes) for s in mem.stages]}
    return {"kind": "stage-memory", "title": job_title(job), "plan": layout(job.plan), "parts": parts,
            "peak_gib": [gib(s.peak_bytes) for s in mem.stages], "capacity_gib": gib(mem.capacity_bytes)}


def _variant(job: Job, **update: Any) -> Job | None:
    """The job with plan fields changed, or None if the rules reject it."""
    from pydantic import ValidationError

    try:
        plan = ParallelPlan.model_validate({**job.plan.model_dump(), **update})
        return Job(model=job.model, cluster=job.cluster, plan=plan)
    except ValidationError:
        return None


POLICIES = (("no recompute", RecomputePolicy()), ("selective", RecomputePolicy(granularity=RecomputeGranularity.selective)),
            ("full (uniform, 1 layer)", RecomputePolicy(granularity=RecomputeGranularity.full,
                                                        method=RecomputeMethod.uniform, num_layers=1)))


def memory_vs_micro_batch_data(job: Job) -> dict[str, Any]:
    """Peak memory per GPU (the largest stage) for each micro-batch size and recompute policy, the rest
    of the plan as given; a micro-batch the global batch does not divide into is left out."""
    series: dict[str, list[float | None]] = {}
    for label, policy in POLICIES:
        values = []
        for mbs in MICRO_BATCH_SIZES:
            variant = _variant(job, micro_batch_size=mbs, recompute=policy.model_dump())
            values.append(gib(memory_plan(variant).peak_bytes) if variant is not None else None)
        series[label] = values
    return {"kind": "memory-vs-micro-batch", "title": job_title(job), "micro_batch_sizes": list(MICRO_BATCH_SIZES),
            "series": series, "capacity_gib": gib(job.cluster.gpu.memory_bytes), "layout": _fixed_layout(job.plan)}


def _fixed_layout(plan: ParallelPlan) -> str:
    """The layout without the micro-batch and recompute, which the figure varies."""
    return (f"TP {plan.tensor_parallel_size}" + (f", CP {plan.context_parallel_size}" if plan.context_parallel_size > 1
                                                 else "")
            + f", PP {plan.pipeline_parallel_size}" + (f" x{plan.virtual_pipeline_stages}" if plan.interleaved else "")
            + f", DP {plan.data_parallel_size}, SP {'on' if plan.sequence_parallel else 'off'}"
            + (f", {sharding_name(plan)}" if sharding_name(plan) else "")
            + "; micro-batch and recompute varied")


STRATEGIES = (("no recompute", False, "none"), ("SP", True, "none"), ("selective", False, "selective"),
              ("SP + selective", True, "selective"), ("full", False, "full"))


def memory_breakdown_data(jobs: list[Job], heading: str) -> dict[str, Any]:
    """First-stage memory of each job under the five strategies (SP needs TP > 1), one panel per job."""
    panels = []
    for job in jobs:
        bars = {}
        for label, sp, g in STRATEGIES:
            variant = _variant(job, sequence_parallel=sp, recompute={"granularity": g})
            if variant is None:
                continue
            st = memory_plan(variant).stages[0]
            bars[label] = {"weights+grads+optimizer": gib(st.weights_bytes + st.gradients_bytes + st.optimizer_bytes),
                           "activations": gib(st.activations_bytes),
                           "transient+reserve": gib(st.transient_bytes + st.reserve_bytes)}
        p = job.plan
        panels.append({"model": job.model.name, "bars": bars,
                       "config": f"TP {p.tensor_parallel_size}, PP {p.pipeline_parallel_size}, mbs {p.micro_batch_size}, "
                                 f"sequence {job.model.seq_length:,}"})
    return {"kind": "memory-breakdown", "title": heading, "panels": panels,
            "capacity_gib": gib(jobs[0].cluster.gpu.memory_bytes)}


def time_breakdown_data(entries: list[tuple[ParallelPlan, Estimate]], heading: str) -> dict[str, Any]:
    """Where each plan's iteration goes (the critical stage's breakdown), fastest first."""
    plans = [{"plan": short_layout(plan), "layout": layout(plan), "iteration_time_s": est.iteration_time_s,
              "mfu": est.mfu, "parts": breakdown_parts(est)}
             for plan, est in entries]
    return {"kind": "time-breakdown", "title": heading, "plans": plans}


def search_time_breakdown_data(result: SearchResult, req: SearchRequest) -> dict[str, Any]:
    return time_breakdown_data([(r.plan, r.estimate) for r in result.plans], request_title(req))


def tp_pp_heatmap_data(result: SearchResult, req: SearchRequest, profile=None) -> dict[str, Any]:
    """For each (TP, PP), the engine's iteration time of the plan the screen ranks fastest in that cell."""
    fastest: dict[tuple[int, int], Any] = {}
    for s in result.screened:  # sorted by screen time: the first of a cell is its fastest
        fastest.setdefault((s.plan.tensor_parallel_size, s.plan.pipeline_parallel_size), s)
    tps = sorted({k[0] for k in fastest})
    pps = sorted({k[1] for k in fastest})
    times: list[list[float | None]] = [[None] * len(pps) for _ in tps]
    plans: list[list[str | None]] = [[None] * len(pps) for _ in tps]
    for (t, p), s in fastest.items():
        job = Job(model=req.model, cluster=req.cluster, plan=s.plan)
        times[tps.index(t)][pps.index(p)] = simulate_job(job, profile).estimate.iteration_time_s
        plans[tps.index(t)][pps.index(p)] = short_layout(s.plan)
    return {"kind": "tp-pp-heatmap", "title": request_title(req), "tensor_parallel_sizes": tps,
            "pipeline_parallel_sizes": pps, "iteration_time_s": times, "plans": plans}


def scaling_data(req: SearchRequest, gpu_counts: Iterable[int], tokens: float | None, profile=None,
                 describe: Callable[[ParallelPlan], str] = layout) -> dict[str, Any]:
    """The best plan at each GPU count (the same model, cluster, batch and pins): days (with ``tokens``),
    MFU, tokens/s; a count with no plan is listed in ``skipped`` with the reason."""
    gpu_counts = list(gpu_counts)
    points, skipped = [], []
    for n in gpu_counts:
        try:
            best = search(req.model_copy(update={"num_gpus": n}), profile, tokens=tokens, top=1).best
        except InfeasiblePlanError as exc:
            skipped.append([n, " ".join(str(exc).split())])
            continue
        e = best.estimate
        points.append({"gpus": n, "days": e.training_days, "mfu": e.mfu, "tokens_per_s": e.tokens_per_s,
                       "iteration_time_s": e.iteration_time_s, "plan": describe(best.plan)})
    if not points:
        raise InfeasiblePlanError(f"no plan fits at any of the GPU counts {', '.join(map(str, gpu_counts))}: "
                                  + "; ".join(f"{n}: {why}" for n, why in skipped))
    heading = (f"{req.model.name} on {req.cluster.name} ({req.cluster.gpu.name}), global batch "
               f"{req.global_batch_size:,}" + (f", {tokens / 1e9:g}B tokens" if tokens else "") + "\n"
               + request_title(req).split("\n")[1])
    return {"kind": "scaling", "title": heading, "gpu": req.cluster.gpu.name, "tokens": tokens,
            "points": points, "skipped": skipped}


def _comparisons(rows: Iterable[tuple[str, float, float]]) -> list[list]:
    return [[label, predicted, measured] for label, predicted, measured in rows]


def parity_data(profile=None, cpu_validation: Path = CPU_VALIDATION) -> dict[str, Any]:
    """Predicted vs measured for every validation data set in the repository: Korthikanti et al. 2022
    (Tables 4 and 5, the 2,240-GPU run, MFU, Figures 1, 7 and 8) and the CPU reference runs."""
    return copy.deepcopy(_parity_data(profile, Path(cpu_validation)))


@lru_cache(maxsize=4)
def _parity_data(profile, cpu_validation: Path) -> dict[str, Any]:
    from simulator.measure import korthikanti as k
    from simulator.schedule.timing import layer_times

    korth = "Korthikanti 2022 on DGX A100 80GB, sequence 2,048, bf16, unfused attention"
    sets = []
    t5 = k.table5(profile) + [k.data_parallel_point(profile)]
    sets.append({"name": "Table 5 and Sec. 6.3: iteration time", "unit": "s", "source": korth, "tolerance": 0.08,
                 "points": _comparisons((c.label, c.predicted, c.published) for c in t5)})
    mfu = k.table5_mfu(profile) + k.data_parallel_mfu(profile)
    sets.append({"name": "Table 5 and abstract: MFU", "unit": "%", "source": korth, "tolerance": None,
                 "points": _comparisons((c.label, 100 * c.predicted, 100 * c.published) for c in mfu)})
    t4 = [c for pair in k.table4(profile) for c in pair]
    sets.append({"name": "Table 4: one 22B layer", "unit": "ms", "source": korth, "tolerance": 0.10,
                 "points": _comparisons((c.label, c.predicted, c.published) for c in t4)})
    shares = []
    for (name, sp), published in sorted(k.figure8_digitized().items()):
        base = layer_times(k.figure8_layer_job(name, False, "none"), profile)
        total = base.forward_s + base.backward_s
        x = layer_times(k.figure8_layer_job(name, sp, "selective" if sp else "full"), profile)
        ours = (x.forward_s, x.backward_s, x.backward_with_recompute_s - x.backward_s)
        for what, o, pub in zip(("forward", "backward", "recompute"), ours, published):
            shares.append((f"{name} {'SP + selective' if sp else 'full recompute'} {what}", 100 * o / total, pub))
    sets.append({"name": "Figure 8: layer time shares", "unit": "% of baseline layer", "source": korth,
                 "tolerance": None, "points": _comparisons(shares)})
    sets.append({"name": "Figure 7: activation memory", "unit": "% of TP baseline", "source": korth, "tolerance": None,
                 "points": _comparisons((c.label, c.predicted, c.published) for c in k.figure7())})
    sets.append({"name": "Figure 1: memory per GPU", "unit": "GiB", "source": korth, "tolerance": None,
                 "points": _comparisons((c.label, c.predicted, c.published) for c in k.figure1())})
    sets += _cpu_sets(cpu_validation)
    sets += _registry_sets(profile, covered={"korthikanti2022", "cpu-reference-loop"})
    return {"kind": "parity", "title": "Predicted vs measured: every validation data set in the repository",
            "sets": sets}


def _registry_sets(profile, covered: set[str]) -> list[dict[str, Any]]:
    """The measured iteration times of every data set declared in ``simulator.measure.datasets`` (where the
    repository has that registry) that the panels above do not already draw, each with its role
    (checked, fitted or held out) in its source line."""
    try:
        from simulator.measure import datasets
    except ImportError:
        return []
    out = []
    for ds in datasets.REGISTRY:
        if ds.key in covered:
            continue
        rows = datasets.evaluate(ds, profile).rows
        out.append({"name": ds.title.split(" (")[0], "unit": "s", "tolerance": None,
                    "source": f"{ds.title}: {ds.role.value}" + (f" ({', '.join(ds.fitted)})" if ds.fitted else ""),
                    "points": _comparisons((r.label, r.predicted_s, r.measured_s) for r in rows)})
    return out


def _cpu_sets(folder: Path) -> list[dict[str, Any]]:
    """The reference loop's CPU runs (reports/cpu-validation), predicted with the profile measured beside them."""
    from simulator.measure.run_record import load_run_record
    from simulator.measure.validate import validate

    records = sorted(folder.glob("run-*.json")) if folder.is_dir() else []
    profile = folder / "cpu-profile.json"
    if not records or not profile.exists():
        return []
    times, memory = [], []
    source = ""
    for path in records:
        record = load_run_record(path)
        v = validate(record, str(profile), run=path.name)
        run = path.stem.removeprefix("run-")
        times.append((f"{run} iteration", v.iteration_time_s.predicted * 1e3, v.iteration_time_s.measured * 1e3))
        for layer in v.layers:
            for what, c in (("forward", layer.forward_s), ("backward", layer.backward_s)):
                if c.predicted is not None and c.measured is not None:
                    times.append((f"{run} layer {layer.index} {what}", c.predicted * 1e3, c.measured * 1e3))
            memory.append((f"{run} layer {layer.index}", layer.activation_bytes.predicted,
                           layer.activation_bytes.measured))
        source = (f"reference loop on {record.cluster} ({record.device}), model {record.model.name}, "
                  f"sequence {record.model.seq_length:,}, {record.plan.precision.value}")
    return [{"name": "CPU reference runs: times", "unit": "ms", "source": source, "tolerance": None,
             "points": _comparisons(times)},
            {"name": "CPU reference runs: activations per layer", "unit": "bytes", "source": source,
             "tolerance": None, "points": _comparisons(memory)}]


def plan_settings(job: Job) -> dict[str, Any]:
    return {"model": job.model.name, "cluster": job.cluster.name, "num_gpus": job.num_gpus,
            "global_batch_size": job.plan.global_batch_size, **settings_json(job.model, job.plan)}


def moe_ep_data(job: Job, profile=None) -> dict[str, Any]:
    """Iteration time, MFU, all-to-all time and memory of an MoE plan at each expert-parallel size the rules
    allow with everything else kept (EP divides the experts and, with ETP, tiles a stage's ranks)."""
    from simulator.estimator.prediction import estimate
    from simulator.spec.errors import ConfigError

    if not job.model.is_moe:
        raise ConfigError(f"the moe-ep figure needs a mixture-of-experts model, and {job.model.name} is dense; "
                          "use --model mixtral-8x7b or another MoE model")
    plan = job.plan
    stage_ranks = plan.tensor_parallel_size * plan.context_parallel_size * plan.data_parallel_size
    points = []
    for ep in (e for e in range(1, job.model.num_experts + 1) if job.model.num_experts % e == 0):
        if stage_ranks % (ep * plan.expert_tp_size) or (ep > 1 and plan.tensor_parallel_size > 1
                                                         and not plan.sequence_parallel):
            continue
        variant = Job(model=job.model, cluster=job.cluster, plan=plan.model_copy(
            update={"expert_model_parallel_size": ep}))
        est = estimate(variant, profile)
        stage = max(est.memory.stages, key=lambda s: s.peak_bytes)
        points.append({"ep": ep, "iteration_time_s": est.iteration_time_s, "mfu": est.mfu,
                       "dispatch_s": est.expert_dispatch_s,
                       "states_gib": gib(stage.weights_bytes + stage.gradients_bytes + stage.optimizer_bytes),
                       "activations_gib": gib(stage.activations_bytes),
                       "other_gib": gib(stage.transient_bytes + stage.reserve_bytes),
                       "peak_gib": gib(est.memory.peak_bytes), "fits": est.memory.fits})
    return {"kind": "moe-ep", "title": f"{job_title(job)}\n{layout(plan)}; EP varied", "points": points,
            "capacity_gib": gib(job.cluster.gpu.memory_bytes)}
