"""The report's section on days as they are lived: failures, checkpoints and restarts.

Llama 3 405B on 16,384 H100 against the interruption rate and effective training time its paper reports,
then ETTR and days against the GPU count for a few checkpoint costs, and where the time goes (drawn by
``simulator.outputs.plots_goodput``).
"""

from __future__ import annotations

from typing import Any

from simulator.estimator.goodput import (
    GoodputSettings,
    Renewal,
    renewal_of,
    checkpoint_cost,
    goodput,
)
from simulator.estimator.prediction import SECONDS_PER_DAY, estimate
from simulator.outputs.report_layouts import layouts_data, layouts_lines
from simulator.outputs.report_scenarios import _table
from simulator.spec.catalog import PRESETS
from simulator.spec.hardware import load_cluster
from simulator.spec.plan import Job, ParallelPlan

TOKENS = 15e12
CLUSTER = "dgx-h100"
# the layout Llama 3 405B trained with on 16,384 GPUs (TP 8, CP 1, PP 16, DP 128, section 3.3.2), 126 layers split
# 7 + 14 x 8 + 7 so that PP 16 divides them
LAYOUT = dict(tensor_parallel_size=8, pipeline_parallel_size=16, sequence_parallel=True, micro_batch_size=1,
              decoder_first_pipeline_num_layers=7, decoder_last_pipeline_num_layers=7, use_distributed_optimizer=True,
              recompute={"granularity": "selective"})
SEQUENCES_PER_REPLICA = 16  # global batch 2,048 at DP 128: the same per replica at every GPU count
GPU_COUNTS = (1024, 4096, 16384, 65536, 131072)
SAVE_COSTS_S = (10.0, 60.0, 300.0)  # blocking seconds per checkpoint, from an asynchronous save to a slow file system
# Llama 3 405B (Dubey et al. 2024, section 3.3.4): 466 interruptions, 419 unexpected, in 54 days on 16,384 GPUs
PAPER = {"unexpected_per_day": 419 / 54, "all_per_day": 466 / 54, "ettr_above": 0.90, "mtbf_hours": 3.0}


def _job(gpus: int) -> Job:
    dp = gpus // (LAYOUT["tensor_parallel_size"] * LAYOUT["pipeline_parallel_size"])
    plan = ParallelPlan(data_parallel_size=dp, global_batch_size=dp * SEQUENCES_PER_REPLICA, **LAYOUT)
    return Job(model=PRESETS["llama3-405b"], cluster=load_cluster(CLUSTER), plan=plan)


def _at_save_cost(job: Job, est, save_s: float) -> Renewal:
    cost = checkpoint_cost(job, job.cluster.storage, async_save=False)
    r = renewal_of(job, job.cluster.reliability, cost, est.iteration_time_s,
                 TOKENS / (job.plan.global_batch_size * job.model.seq_length))
    return r.model_copy(update=dict(blocking_save_s=save_s))


def goodput_data() -> dict[str, Any]:
    points = []
    for gpus in GPU_COUNTS:
        job = _job(gpus)
        est = estimate(job, tokens=TOKENS)
        own = goodput(job, est, GoodputSettings(), simulate=False)
        by_cost = []
        for save_s in SAVE_COSTS_S:
            r = _at_save_cost(job, est, save_s)
            k = r.best_interval()
            expected = r.expected_s(k)
            by_cost.append({"save_s": save_s, "ettr": r.iterations * r.iteration_time_s / expected,
                            "expected_days": expected / SECONDS_PER_DAY, "save_interval": k})
        points.append({"gpus": gpus, "ideal_days": own.ideal_days, "expected_days": own.expected_days,
                       "ettr": own.ettr, "own_save_s": own.checkpoint.blocking_s, "restart_s": own.restart_s,
                       "interruptions_per_day": own.interruptions_per_day, "split": own.split.model_dump(),
                       "by_save_cost": by_cost})
    return {"kind": "goodput", "title": f"Llama 3 405B, {TOKENS / 1e12:.0f}T tokens, DGX H100; TP 8, PP 16, DP "
                                        f"varied, {SEQUENCES_PER_REPLICA} sequences per replica",
            "points": points}


def step_goodput(_: dict) -> dict:
    job = _job(16384)
    est = estimate(job, tokens=TOKENS)
    g = goodput(job, est, GoodputSettings())
    data = goodput_data()
    check = [["unexpected interruptions per day", f"{PAPER['unexpected_per_day']:.2f} (419 in 54 days)",
              f"{g.unplanned_interruptions_per_day:.2f}"],
             ["all interruptions per day", f"{PAPER['all_per_day']:.2f} (466 in 54 days)",
              f"{g.interruptions_per_day:.2f}"],
             ["mean time between unexpected interruptions", "about 3 hours", f"{g.job_mtbf_hours:.2f} hours"],
             ["effective training time (ETTR)", "more than 90%", f"{g.ettr * 100:.1f}%"]]
    c = g.checkpoint
    lines = ["## 9. Days as they are lived: failures, checkpoints and restarts", "",
             "Training days above are iterations x iteration time: a run that never fails. A synchronous job stops "
             "whenever any of its parts fails; `hardware_specs/reliability/llama3-h100.yaml` declares each part's "
             "rate, derived from the one published breakdown at scale (Llama 3 405B, Table 5), with its range. The "
             "expected days are Daly's closed form at the interval that maximises useful time; `plan` adds the "
             "P10 / P50 / P90 of a seeded simulation of the run.", "",
             f"### Llama 3 405B on 16,384 H100, against its paper (TP 8, PP 16, DP 128, {TOKENS / 1e12:.0f}T tokens)",
             ""]
    lines += _table(["", "Llama 3 (section 3.3.4)", "predicted"], check)
    lines += ["", f"- The rates are the paper's counts over its 21.2 million GPU-hours, so the first three rows check "
                  "the derivation and its scaling to the job; the ETTR is a prediction from the declared restart "
                  f"({g.restart_s:.0f} s, the checkpoint's load included) and save costs.",
              f"- Checkpoint: {c.save_bytes / 1e12:.2f} TB (bf16 weights and fp32 Adam state), "
              f"{c.save_bytes_per_rank / 1e6:.0f} MB per rank, saved in {c.blocking_s:.1f} s every "
              f"{g.save_interval:,} iterations ({g.save_interval_s / 60:.1f} min); expected {g.expected_days:.1f} days "
              f"against {g.ideal_days:.1f} ideal (P10 {g.p10_days:.1f}, P90 {g.p90_days:.1f}).", "",
              "![ETTR and days vs GPUs](figures/goodput_vs_gpus.png)", "",
              "### ETTR and expected days against the GPU count, for three checkpoint costs", ""]
    rows = []
    for q in data["points"]:
        rows.append([f"{q['gpus']:,}", f"{q['ideal_days']:.1f}"]
                    + [f"{b['ettr'] * 100:.1f}% / {b['expected_days']:.1f}" for b in q["by_save_cost"]])
    lines += _table(["GPUs", "ideal days"] + [f"save {s:.0f} s: ETTR / days" for s in SAVE_COSTS_S], rows)
    lines += ["", "### Where the time goes (the plan's own checkpoint)", ""]
    rows = [[f"{q['gpus']:,}", f"{q['split']['compute_days']:.1f}", f"{q['split']['checkpoint_days']:.2f}",
             f"{q['split']['lost_work_days']:.2f}", f"{q['split']['restart_days']:.2f}", f"{q['ettr'] * 100:.1f}%"]
            for q in data["points"]]
    lines += _table(["GPUs", "compute", "checkpoints", "lost work", "restarts", "ETTR"], rows)
    lines += ["", "Failures grow with the GPU count while the ideal days shrink: past some size more GPUs buy fewer "
                  "days than they cost in restarts and lost work, and sooner the slower the save.", ""]
    layouts = layouts_data()
    lines += layouts_lines(layouts)
    return {"lines": lines,
            "data": {"goodput": {"llama3": {"ettr": g.ettr, "interruptions_per_day": g.interruptions_per_day,
                                            "expected_days": g.expected_days, "save_interval": g.save_interval},
                                 "points": {str(q["gpus"]): [q["ideal_days"], q["expected_days"]]
                                            for q in data["points"]},
                                 "published_layouts": layouts}},
            "figures": [["goodput_vs_gpus", "goodput", data]]}
