"""The report's figure steps: the search's figures, predicted vs measured, memory, the best plan's
timeline, and scaling with GPU count (see ``simulator.outputs.report`` for the step format)."""

from __future__ import annotations

from typing import Any

from simulator.estimator.prediction import simulate_job
from simulator.measure import korthikanti as k
from simulator.outputs import figure_data as fd
from simulator.outputs.report_scenarios import (
    GPU_COUNTS,
    SCENARIOS,
    TOKENS,
    Scenario,
    _describe,
    _pct,
    _table,
    search_request,
)
from simulator.planner.plan_search import SearchResult
from simulator.schedule.schedules import warmup_forwards
from simulator.spec.plan import Job, ParallelPlan


def _full_space(deps: dict) -> tuple[Any, SearchResult]:
    return search_request(SCENARIOS[0]), SearchResult.model_validate(deps["decomposition"]["full_space"])


def step_search_figures(deps: dict) -> dict:
    """The headline's full-space search: its Pareto front, the top plans' breakdowns, the TP x PP map."""
    req, result = _full_space(deps)
    return {"lines": [], "figures": [["pareto_gpt3_175b", "pareto", fd.pareto_data(result, req)],
                                     ["time_breakdown_top_plans", "time-breakdown",
                                      fd.search_time_breakdown_data(result, req)],
                                     ["tp_pp_heatmap", "tp-pp-heatmap", fd.tp_pp_heatmap_data(result, req)]]}


def step_html(deps: dict) -> dict:
    from simulator.outputs.html_report import page_data

    req, result = _full_space(deps)
    return {"page": page_data(result, req)}


def step_parity(_: dict) -> dict:
    data = fd.parity_data()
    rows, summary = [], {}
    for s in data["sets"]:
        errors = [abs(p / m - 1) for _, p, m in s["points"] if m]
        mean, worst = sum(errors) / len(errors), max(errors)
        summary[s["name"]] = {"points": len(s["points"]), "mean_abs_error": mean, "max_abs_error": worst}
        rows.append([s["name"], s["unit"], str(len(s["points"])), f"{mean * 100:.1f}%", f"{worst * 100:.1f}%"])
    lines = ["### Every validation data set in the repository, predicted against measured", "",
             "Korthikanti et al.'s tables and digitized figures above, and the reference loop's CPU runs in "
             "[`cpu-validation/`](cpu-validation/README.md) (predicted with the CPU profile measured in the same run; "
             "those times are one noisy machine at one moment, and the activation bytes are exact by construction). "
             "`simulator plot parity` draws the same figure.", "",
             "![predicted vs measured](figures/parity.png)", ""]
    lines += _table(["data set", "unit", "points", "mean abs. error", "largest"], rows)
    lines.append("")
    return {"lines": lines, "data": {"parity": summary}, "figures": [["parity", "parity", data]]}


def _table3_job(name: str) -> Job:
    row = next(r for r in k.table5_rows() if k.MODELS[r["model"]["params_b"]] == name)
    return k.table5_job(row)


def step_memory(deps: dict) -> dict:
    """Memory by strategy for the four Table 3 configurations; against micro-batch for the article's best
    plan; per stage for the full space's best plan."""
    jobs = [_table3_job(name) for name in ("megatron-22b", "gpt3-175b", "mt-nlg-530b", "megatron-1t")]
    breakdown = fd.memory_breakdown_data(jobs, "Memory per GPU by strategy, first pipeline stage, Table 3 configurations "
                                               "(Korthikanti et al. 2022) on DGX A100 80GB, sequence 2,048, bf16")
    table = {p["model"]: p["bars"] for p in breakdown["panels"]}
    s = SCENARIOS[0]
    req, result = _full_space(deps)
    article = Job(model=req.model, cluster=req.cluster, plan=ParallelPlan.model_validate(deps["decomposition"]["article_best_plan"]))
    best = Job(model=req.model, cluster=req.cluster, plan=result.best.plan)
    lines = ["## 4. Memory per GPU by strategy (first pipeline stage, Table 3 configurations)", "",
             "![memory breakdown](figures/memory_breakdown.png)", ""]
    rows = [[name, label, f"{v['weights+grads+optimizer']:.1f}", f"{v['activations']:.1f}", f"{sum(v.values()):.1f}"]
            for name, d in table.items() for label, v in d.items()]
    lines += _table(["model", "strategy", "weights+grads+optimizer (GiB)", "activations (GiB)", "peak (GiB)"], rows)
    mvm = fd.memory_vs_micro_batch_data(article)
    fits = {label: max((m for m, v in zip(mvm["micro_batch_sizes"], values) if v is not None and v <= mvm["capacity_gib"]),
                       default=None) for label, values in mvm["series"].items()}
    lines += ["", f"### Memory against micro-batch, each recompute policy ({s.model}, {_describe(article.plan).split(', mbs')[0]})",
              "", "The largest micro-batch that fits in 80 GiB: "
              + "; ".join(f"{label}: {m if m else 'none'}" for label, m in fits.items()) + ".", "",
              "![memory vs micro-batch](figures/memory_vs_micro_batch.png)", "",
              f"### Per-stage memory of the best plan ({_describe(best.plan)})", "",
              "The first stage holds the most micro-batches in flight and the embedding; the last, the output layer "
              "and the logits.", "", "![stage memory](figures/stage_memory.png)", ""]
    return {"lines": lines, "data": {"memory": table},
            "figures": [["memory_breakdown", "memory-breakdown", breakdown],
                        ["memory_vs_micro_batch", "memory-vs-micro-batch", mvm],
                        ["stage_memory", "stage-memory", fd.stage_memory_data(best)]]}


def step_timeline(deps: dict) -> dict:
    """One iteration of the full space's best plan (the report's fastest), whole and around its first backward."""
    req, result = _full_space(deps)
    job = Job(model=req.model, cluster=req.cluster, plan=result.best.plan)
    sim = simulate_job(job, record=True)
    plan = job.plan
    p, m, v = plan.pipeline_parallel_size, plan.num_micro_batches, plan.virtual_pipeline_stages
    warm = warmup_forwards(0, p, m, v)
    window = (max(warm - 8, 0), min(warm + 16, 2 * m * v))
    lines = ["## 5. One iteration of the best plan, as the engine played it", "",
             f"{_describe(plan)} (the full space's fastest, section 1): {sim.estimate.iteration_time_s:.2f} s. Each row "
             "is a pipeline stage: its compute stream (forward light, backward dark, optimizer red; grey where it is "
             "idle), its sends and its data-parallel reduction. The second figure zooms to steps "
             f"{window[0]}-{window[1] - 1} of each stage, around stage 0's first backward (after its {warm} warm-up "
             "forwards), each step labelled micro-batch.chunk. `simulator plot timeline ... --steps A:B` draws any "
             "window; `simulator plan ... --trace FILE` writes the same iteration as a Perfetto trace.", "",
             "![pipeline timeline](figures/pipeline_timeline.png)", "",
             "![pipeline timeline, zoomed](figures/pipeline_timeline_zoom.png)", ""]
    return {"lines": lines, "figures": [["pipeline_timeline", "timeline", fd.timeline_data(sim, job)],
                                        ["pipeline_timeline_zoom", "timeline", fd.timeline_data(sim, job, window)]]}


def step_scaling(_: dict) -> dict:
    s = SCENARIOS[0]
    # the full space, as section 1's best plan was searched, so the curve passes through that plan's days
    req = search_request(Scenario(s.model, GPU_COUNTS[0], s.global_batch_size, s.standard_pp, ""))
    data = fd.scaling_data(req, GPU_COUNTS, TOKENS, describe=_describe)
    data["title"] += "\nbest plan of the full space at each count (interleaving, distributed optimizer, FSDP)"
    points = data["points"]
    first = points[0]
    lines = ["## 6. Training days and MFU vs GPU count (GPT-3 175B, 300B tokens, global batch 1,536, best plan at "
             "each size of the full space, as section 1 searched it)", "", "![days vs GPUs](figures/days_vs_gpus.png)",
             "![MFU vs GPUs](figures/mfu_vs_gpus.png)", ""]
    lines += _table(["A100 GPUs", "days", "MFU", "scaling efficiency", "best plan"],
                    [[f"{q['gpus']:,}", f"{q['days']:.1f}", f"{q['mfu'] * 100:.1f}%",
                      f"{q['mfu'] / first['mfu'] * 100:.0f}%", q["plan"]] for q in points])
    lines += ["", f"Scaling efficiency is MFU over the MFU at {first['gpus']:,} GPUs; from {first['gpus']:,} to "
              f"{points[-1]['gpus']:,} GPUs the days fall {first['days'] / points[-1]['days']:.1f}x for "
              f"{points[-1]['gpus'] // first['gpus']}x the GPUs ({_pct(points[-1]['mfu'] / first['mfu'] - 1)} MFU).", ""]
    return {"lines": lines, "data": {"scaling": {str(q["gpus"]): q["days"] for q in points}},
            "figures": [["days_vs_gpus", "days-vs-gpus", data], ["mfu_vs_gpus", "mfu-vs-gpus", data]]}
