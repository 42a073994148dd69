"""The report's Blackwell section: the best plan the search finds for three models on HGX B200 nodes and on
GB200 NVL72 racks, and whether the NVL72's larger NVLink domain changes the layout.

On HGX B200 NVLink joins the 8 GPUs of a node; on GB200 NVL72 it joins the GPUs a job takes of a rack (64 of 72
with the preset's 16 of 18 trays), so Megatron's TP x CP and ETP x EP groups may grow past 8 at NVLink speed.
Which group size the best plan picks, and what the fastest plan with the other kind of group screens at, are
read from each search, never stated in advance. Every Blackwell plan lies outside every measured regime (no
measured run on either GPU is in the repository), so its band is the regime rule's widened one.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from simulator.estimator.regime import OUTSIDE_WIDENING, band_table, regime_of
from simulator.outputs.report_scenarios import _describe, _table
from simulator.planner.plan_search import SCREEN_MARGIN, SearchPins, SearchRequest, search
from simulator.spec.catalog import PRESETS
from simulator.spec.hardware import ClusterSpec, load_cluster
from simulator.spec.layout import RankLayout
from simulator.spec.plan import Job, ParallelPlan
from simulator.spec.units import gib

HGX, NVL72 = "dgx-b200", "gb200-nvl72"
CLUSTERS = (HGX, NVL72)


@dataclass(frozen=True)
class BlackwellScenario:
    """A model, the GPUs booked for it, its global batch (sequences) and the tokens its days are for."""

    model: str
    gpus: int
    global_batch_size: int
    tokens: float


# Global batches of two (dense) and four (MoE) sequences a GPU, so that every DP size a layout leaves divides
# them; tokens about what each model was pre-trained on (15T for Llama 3 405B and DeepSeek-V3, 300B for GPT-3)
SCENARIOS = (
    BlackwellScenario("llama3-405b", 576, 1152, 15e12),
    BlackwellScenario("deepseek-v3-style", 1152, 4608, 15e12),
    BlackwellScenario("gpt3-175b", 576, 1152, 300e9),
)


def _layout(plan: ParallelPlan, cluster: ClusterSpec) -> RankLayout:
    # the search's screened plans carry no Job; the layout reads only the plan and the cluster
    return RankLayout.of(SimpleNamespace(plan=plan, cluster=cluster))


def nvlink_groups(plan: ParallelPlan, cluster: ClusterSpec, moe: bool) -> list[dict[str, Any]]:
    """Megatron's TP x CP group (and, of an MoE model, its ETP x EP group): GPUs, and whether NVLink joins them."""
    lay = _layout(plan, cluster)
    out = [{"name": "TP x CP", "gpus": lay.size("tp") * lay.size("cp"),
            "in_nvlink_domain": lay.within_nvlink_domain("cp")}]
    if moe:
        out.append({"name": "ETP x EP", "gpus": lay.size("etp") * lay.size("ep"),
                    "in_nvlink_domain": lay.within_nvlink_domain("ep")})
    return out


def _largest(groups: list[dict[str, Any]]) -> dict[str, Any]:
    return max(groups, key=lambda g: g["gpus"])  # ties keep TP x CP


def _fastest_screens(result, cluster: ClusterSpec, moe: bool, node_gpus: int) -> tuple[float | None, float | None]:
    """The closed-form time of the fastest plan that fits whose groups all stay within ``node_gpus``, and of the
    fastest with a larger group NVLink still joins (the screened list is in screen order)."""
    within = beyond = None
    for s in result.screened:
        g = _largest(nvlink_groups(s.plan, cluster, moe))
        if g["gpus"] <= node_gpus and within is None:
            within = s.screen_time_s
        elif g["gpus"] > node_gpus and g["in_nvlink_domain"] and beyond is None:
            beyond = s.screen_time_s
        if within is not None and beyond is not None:
            break
    return within, beyond


def _row(s: BlackwellScenario, cluster: ClusterSpec, pins: SearchPins, node_gpus: int) -> dict[str, Any]:
    model = PRESETS[s.model]
    req = SearchRequest(model=model, cluster=cluster, num_gpus=s.gpus, global_batch_size=s.global_batch_size, pins=pins)
    result = search(req, tokens=s.tokens, top=1)
    best, e = result.best, result.best.estimate
    regime = regime_of(Job(model=model, cluster=cluster, plan=best.plan), e.mfu)
    groups = nvlink_groups(best.plan, cluster, model.is_moe)
    within, beyond = _fastest_screens(result, cluster, model.is_moe, node_gpus)
    return {"cluster": cluster.name, "model": s.model, "gpus": s.gpus, "global_batch_size": s.global_batch_size,
            "tokens": s.tokens, "precision": req.precision.value, "fused_attention": req.use_flash_attention,
            "rank_by": req.rank_by.value, "plan": best.plan.model_dump(mode="json"), "layout": _describe(best.plan),
            "iteration_time_s": e.iteration_time_s, "iteration_time_s_low": best.iteration_time_s_low,
            "iteration_time_s_high": best.iteration_time_s_high, "mfu": e.mfu, "training_days": e.training_days,
            "training_days_low": e.training_days_low, "training_days_high": e.training_days_high,
            "peak_gib": gib(e.memory.peak_bytes), "capacity_gib": gib(cluster.gpu.memory_bytes), "fits": e.memory.fits,
            "capacity_gib_low": cluster.gpu.ranges.get("hbm_capacity_gib", (cluster.gpu.hbm_capacity_gib,))[0],
            "regime": regime.name, "outside_regime_reasons": list(regime.outside), "half_width": regime.half_width,
            "slow_half_width": regime.slow, "outside_steps": regime.outside_steps,
            "groups": groups, "largest_group": _largest(groups),
            "screen_s_within_node": within, "screen_s_beyond_node": beyond}


def blackwell_data(scenarios=SCENARIOS, clusters=CLUSTERS, pins: SearchPins = SearchPins()) -> dict[str, Any]:
    """One row per (cluster, model): the best plan of a top-1 search, its band, memory and NVLink groups."""
    nvl = load_cluster(NVL72)
    node_gpus = load_cluster(HGX).ranks_per_nvlink_domain  # what NVLink joins on HGX: the comparison's line
    rows = [_row(s, load_cluster(name), pins, node_gpus) for s in scenarios for name in clusters]
    return {"rows": rows, "hgx_nvlink_gpus": node_gpus,
            "nvl72": {"gpus_per_node": nvl.gpus_per_node, "nvlink_domain_gpus": nvl.nvlink_domain_gpus,
                      "nodes_per_nvlink_domain": nvl.nodes_per_nvlink_domain,
                      "nvlink_segment_nodes": nvl.nvlink_segment_nodes,
                      "ranks_per_nvlink_domain": nvl.ranks_per_nvlink_domain},
            "widest_measured_half_width": max(g["half_width"] for g in band_table()["gpus"].values()),
            "outside_widening": OUTSIDE_WIDENING, "screen_margin": SCREEN_MARGIN}


def _group_text(g: dict[str, Any], cluster: str) -> str:
    if g["gpus"] == 1:
        return "1 (TP, CP and EP 1)"
    where = ("NVLink domain" if cluster == NVL72 else "node") if g["in_nvlink_domain"] else "across InfiniBand"
    return f"{g['gpus']} ({g['name']}, {where})"


def _defaults(r: dict[str, Any]) -> str:
    return (f"{r['precision']}, {'fused' if r['fused_attention'] else 'unfused'} attention, ranked by "
            f"`--rank-by {r['rank_by']}`, top 1")


def _racks(rows: list[dict[str, Any]], per_rack: int) -> str:
    gpus = sorted({r["gpus"] for r in rows if r["cluster"] == NVL72})
    return ", ".join(f"{n:,} GPUs: {n / per_rack:g}" for n in gpus)


def _tokens(n: float) -> str:
    return f"{n / 1e12:g}T" if n >= 1e12 else f"{n / 1e9:g}B"


def _days(r: dict[str, Any]) -> str:
    return f"{r['training_days']:.1f} ({r['training_days_low']:.1f}-{r['training_days_high']:.1f})"


def _verdict(r: dict[str, Any], node_gpus: int, margin: float) -> str:
    """Whether groups past an HGX node win on the NVL72, from the best plan and the fastest screen of each kind."""
    g, within, beyond = r["largest_group"], r["screen_s_within_node"], r["screen_s_beyond_node"]
    text = f"- {r['model']} on {r['gpus']:,} GB200: " + (
        f"the best plan's largest group is {g['name']} of {g['gpus']} GPUs "
        f"({'larger than' if g['gpus'] > node_gpus else 'within'} an HGX node's {node_gpus}). " if g["gpus"] > 1 else
        "the best plan has no TP, CP or EP group (all three are 1). ")
    if beyond is None or within is None:
        kind = "a group larger than" if beyond is None else "every group within"
        return text + f"No plan that fits has {kind} {node_gpus} GPUs inside the domain."
    change = beyond / within - 1
    text += (f"The fastest plan that fits with a larger group inside the domain screens at {beyond:.2f} s, the "
             f"fastest keeping every group within {node_gpus} at {within:.2f} s")
    if abs(change) <= margin:
        return text + f": within the screen's {margin:.0%} of the engine, neither clearly wins."
    if change < 0:
        return text + f": larger groups win, {-change * 100:.1f}% faster."
    return text + f": groups within {node_gpus} win, the larger group {change * 100:.1f}% slower."


def blackwell_lines(data: dict[str, Any]) -> list[str]:
    rows, nvl, node_gpus = data["rows"], data["nvl72"], data["hgx_nvlink_gpus"]
    widest, widening = data["widest_measured_half_width"], data["outside_widening"]
    table = [[r["cluster"], r["model"], f"{r['gpus']:,}", r["layout"],
              f"{r['iteration_time_s']:.2f} ({r['iteration_time_s_low']:.2f}-{r['iteration_time_s_high']:.2f})",
              f"{r['mfu'] * 100:.1f}%", _tokens(r["tokens"]), _days(r),
              f"{r['peak_gib']:.1f} / {r['capacity_gib']:.1f}", _group_text(r["largest_group"], r["cluster"]),
              "; ".join(r["outside_regime_reasons"]) or r["regime"]] for r in rows]
    outside = [r for r in rows if r["outside_regime_reasons"]]
    sides = sorted({f"-{r['half_width'] * 100:.0f}% / +{r['slow_half_width'] * 100:.0f}%" for r in outside})
    reasons = sorted({reason for r in outside for reason in r["outside_regime_reasons"]})
    lines = ["## 10. Blackwell: HGX B200 and GB200 NVL72", "",
             f"The best plan of `simulator search` (its defaults: {_defaults(rows[0])}) for each model on `{HGX}` "
             f"(HGX B200: NVLink "
             f"joins a node's {node_gpus} GPUs) and on `{NVL72}` (a rack's {nvl['nvlink_domain_gpus']} GPUs in "
             f"{nvl['nodes_per_nvlink_domain']} trays of {nvl['gpus_per_node']} share one NVLink domain), with the "
             "published-data B200 and GB200 profiles. The GB200 preset books "
             f"{nvl['nvlink_segment_nodes']} of each rack's {nvl['nodes_per_nvlink_domain']} trays "
             f"(`nvlink_segment_nodes`), {nvl['ranks_per_nvlink_domain']} GPUs a rack, as NVIDIA advises for large "
             f"jobs: a group NVLink joins must divide {nvl['ranks_per_nvlink_domain']}, not "
             f"{nvl['nvlink_domain_gpus']}, and a job of N GPUs takes N / {nvl['ranks_per_nvlink_domain']} racks "
             f"({_racks(rows, nvl['ranks_per_nvlink_domain'])}); a copy of the preset with every tray would change "
             "both. Iteration time and days carry their band; the largest group is the larger of Megatron's TP x CP "
             "and ETP x EP groups, with where it runs.", ""]
    lines += _table(["cluster", "model", "GPUs", "best plan", "iteration (s), band", "MFU", "tokens",
                     "days, band", "peak / capacity (GiB)", "largest group (GPUs)", "regime"], table)
    lines.append("")
    if outside:
        lines.append(f"{'Every plan' if len(outside) == len(rows) else f'{len(outside)} of the {len(rows)} plans'} "
                     f"here lies outside every measured regime ({'; '.join(reasons)}). By the declared rule such a "
                     f"band is the widest half-width measured on any GPU ({widest * 100:.1f}%) times {widening:g} on "
                     f"the fast side, and on the slow side plus {widening - 1:g}x that half-width for each step "
                     f"further out (a feature no measured run on any GPU had is a step) ({', '.join(sides)}), or "
                     "wider where the profile's unpinned constants reach further; "
                     "`simulator calibrate --from-runs` on the user's own runs (or `simulator calibrate --device cuda` "
                     "on the GPU) gives a profile that narrows it.")
        lines.append("")
    lines += [f"Whether groups larger than an HGX node pay on the NVL72 (the fastest plan of each kind by the "
              f"closed-form screen, which is within {data['screen_margin']:.0%} of the engine):", ""]
    lines += [_verdict(r, node_gpus, data["screen_margin"]) for r in rows if r["cluster"] == NVL72]
    tight = [r for r in rows if r["fits"] and r["peak_gib"] > r["capacity_gib_low"]]
    if tight:
        lines += ["", "Fits only near the top of the range the GPU spec declares for its memory (`hbm_capacity_gib`; "
                  "its source says where each end comes from):", ""]
        lines += [f"- {r['model']} on `{r['cluster']}`: a peak of {r['peak_gib']:.1f} GiB, under the "
                  f"{r['capacity_gib']:.1f} GiB the device exposes but over the range's {r['capacity_gib_low']:.1f}."
                  for r in tight]
    return lines + [""]


def step_blackwell(_: dict) -> dict:
    data = blackwell_data()
    return {"lines": blackwell_lines(data), "data": {"blackwell": data}}
