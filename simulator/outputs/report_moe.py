"""The report's mixture-of-experts section: Mixtral 8x7B on H100, iteration time and memory against
the expert-parallel size, with the share of the iteration in the token dispatch and combine."""

from __future__ import annotations

from simulator.outputs.figure_data import moe_ep_data
from simulator.outputs.report_scenarios import _describe, _table
from simulator.planner.plan_search import SearchPins, SearchRequest, search
from simulator.spec.catalog import PRESETS
from simulator.spec.errors import InfeasiblePlanError
from simulator.spec.hardware import load_cluster
from simulator.spec.plan import Job, ParallelPlan

MODEL, CLUSTER, GPUS, GLOBAL_BATCH = "mixtral-8x7b", "dgx-h100", 64, 512
EP_SIZES = (1, 2, 4, 8)
# one layout for every EP, so that only the experts' placement changes: four stages of eight layers,
# sixteen data-parallel replicas, full recompute and the distributed optimizer
LAYOUT = dict(tensor_parallel_size=1, pipeline_parallel_size=4, data_parallel_size=16, micro_batch_size=1,
              recompute={"granularity": "full"}, use_distributed_optimizer=True, moe_token_dispatcher_type="alltoall",
              moe_grouped_gemm=True, overlap_grad_reduce=True)


LAYOUT_TEXT = "TP 1, PP 4, DP 16, micro-batch 1, full recompute, distributed optimizer, alltoall, grouped GEMM"


def _job(ep: int) -> Job:
    plan = ParallelPlan(global_batch_size=GLOBAL_BATCH, expert_model_parallel_size=ep, **LAYOUT)
    return Job(model=PRESETS[MODEL], cluster=load_cluster(CLUSTER), plan=plan)


def step_moe(_: dict) -> dict:
    data = moe_ep_data(_job(1))
    model = PRESETS[MODEL]
    rows = [[str(q["ep"]), f"{q['iteration_time_s']:.2f}", f"{q['mfu'] * 100:.1f}%",
             f"{q['dispatch_s'] / q['iteration_time_s'] * 100:.1f}%", f"{q['states_gib']:.1f}",
             f"{q['activations_gib']:.1f}", f"{q['peak_gib']:.1f}", "yes" if q["fits"] else "no"]
            for q in data["points"]]
    best = []
    for ep in EP_SIZES:
        req = SearchRequest(model=model, cluster=load_cluster(CLUSTER), num_gpus=GPUS, global_batch_size=GLOBAL_BATCH,
                            pins=SearchPins(expert_model_parallel_size=ep))
        try:
            r = search(req, top=1).best
        except InfeasiblePlanError:  # a pinned EP with no plan that fits is an answer too
            best.append([str(ep), "no plan fits", "", "", ""])
            continue
        e = r.estimate
        best.append([str(ep), _describe(r.plan), f"{e.iteration_time_s:.2f}", f"{e.mfu * 100:.1f}%",
                     f"{e.expert_dispatch_s / e.iteration_time_s * 100:.1f}%"])
    lines = [f"## 8. Mixture of experts: {MODEL} on {GPUS} H100, iteration time and memory vs expert parallelism", "",
             f"One layout ({LAYOUT_TEXT}) with the experts spread over EP ranks; each rank holds "
             f"{model.num_experts} / EP experts and exchanges every token's {model.moe_router_topk} copies with the "
             "others all-to-all (inside the node up to EP 8). MFU and days count the parameters a token passes "
             f"({model.num_parameters(active=True) / 1e9:.1f}B active of {model.num_parameters() / 1e9:.1f}B). The "
             "MoE layers are planned for perfectly balanced routing (`moe_load_imbalance` 1.0; `--moe-load-imbalance` "
             "plans for a busier rank). The all-to-all share is the critical stage's time in the dispatch and combine "
             "collectives, which the experts wait for. No measured MoE run is in the repository: these are "
             "predictions of the model, not validated ones.", "",
             "![iteration time and memory vs EP](figures/moe_ep.png)", ""]
    lines += _table(["EP", "iteration (s)", "MFU", "all-to-all share", "weights+grads+optimizer (GiB)",
                     "activations (GiB)", "peak (GiB)", "fits in 80 GiB"], rows)
    lines += ["", f"### The fastest plan the search finds with each EP pinned ({GPUS} H100, global batch {GLOBAL_BATCH})",
              ""]
    lines += _table(["EP", "best plan", "iteration (s)", "MFU", "all-to-all share"], best)
    lines.append("")
    return {"lines": lines, "data": {"moe": {str(q["ep"]): [q["iteration_time_s"], q["peak_gib"]]
                                             for q in data["points"]}},
            "figures": [["moe_ep", "moe-ep", data]]}
