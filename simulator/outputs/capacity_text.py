"""A capacity answer in words: the figures as `simulator capacity` prints them, its table, the answer, what binds,
where the curves bend and the economics each figure comes from.

`capacity` prints ``render_text``; its HTML page (``html_capacity``) and the report's section
(``report_capacity``) say the same things with the same pieces, so the three never disagree on a figure.
"""

from __future__ import annotations

from typing import Iterable

from simulator.planner.capacity import CapacityOption, CapacityRequest, CapacityResult, Figure
from simulator.spec.economics import ClusterEconomics


def si(x: float | None, digits: int = 3) -> str:
    """``x`` with an SI suffix (1.04M, 179k); None, a run that never ends, is "never"."""
    if x is None:
        return "never"
    for scale, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            return f"{x / scale:.{digits}g}{suffix}"
    return f"{x:.{digits}g}"


def figure_text(f: Figure | None) -> str:
    """A figure at the confidence with its band: "538k (249k-2.2M)"."""
    return "" if f is None else f"{si(f.value)} ({si(f.low)}-{si(f.high)})"


def days_text(days: float | None) -> str:
    return "never" if days is None else f"{days:.1f}" if days >= 10 else f"{days:.3g}"


def days_triple(o: CapacityOption) -> str:
    """P10 / P50 / P90 of an option's days; empty where it has none."""
    return "" if o.status != "ok" else " / ".join(days_text(d) for d in (o.days_p10, o.days_p50, o.days_p90))


def is_answer(result: CapacityResult, o: CapacityOption) -> bool:
    a = result.answer
    return a is not None and (o.cluster, o.gpus) == (a.cluster, a.gpus)


def mark(result: CapacityResult, o: CapacityOption) -> str:
    """"*" the answer, "+" on the frontier, "" neither."""
    return "*" if is_answer(result, o) else "+" if o.on_frontier else ""


def goal_words(result: CapacityResult) -> str:
    c = result.confidence.value
    if result.deadline_days is not None:
        return f"the cheapest option that finishes by {result.deadline_days:g} days at {c}"
    if result.budget_usd is not None:
        return f"the fastest option that costs at most ${result.budget_usd:,.0f} at {c}"
    return f"the frontier of days against cost at {c}"


def question_line(req: CapacityRequest, result: CapacityResult) -> str:
    tokens = si(req.tokens).replace("G", "B")
    return f"{req.model.name}, {tokens} tokens, global batch {req.global_batch_size:,}: {goal_words(result)}"


def searched_line(req: CapacityRequest, result: CapacityResult) -> str:
    kinds = f"{len(req.clusters)} cluster kind{'s' if len(req.clusters) != 1 else ''}"
    return f"{result.searches} points searched on {kinds} in {result.elapsed_s:.1f} s"


def legend_line(result: CapacityResult, quote: str = "") -> str:
    """What the marks and the bands mean (``quote``: put around each mark, "`" in Markdown)."""
    c = result.confidence.value
    star, plus = (f"{quote}{m}{quote}" for m in "*+")
    return (f"{star} the answer; {plus} on the frontier (no other option is both faster and cheaper at {c}); "
            f"figures at {c} (a booking that long), each band from P10 with every price, power, PUE and carbon figure "
            "at its low end to P90 with each at its high end")


def answer_line(result: CapacityResult) -> str | None:
    """The answer in one line (None where no option meets the goal, or there is no goal)."""
    a = result.answer
    if a is None:
        return None
    nodes = f"{a.nodes:,} node" + ("s" if a.nodes != 1 else "")
    c = result.confidence.value
    return (f"answer: {a.gpus:,} GPUs ({nodes}) of {a.cluster}, {a.plan_name}: {days_text(a.days)} days at {c} "
            f"(P10 {days_text(a.days_p10)}, P50 {days_text(a.days_p50)}), {si(a.gpu_hours.value)} GPU-hours, "
            f"${si(a.cost_usd.value)}, {si(a.energy_mwh.value)} MWh, {si(a.tco2e.value)} tCO2e")


def binding_line(result: CapacityResult) -> str:
    return f"binding: {result.binding}: {result.binding_note}"


def bend_lines(result: CapacityResult) -> list[str]:
    """Where each cluster's curve bends, one line each (none: no line)."""
    return [f"{b.cluster} at {b.gpus:,} GPUs, {b.kind}: {b.note}" for b in result.bends]


def samples_line(req: CapacityRequest) -> str:
    return ("days: P10 / P50 / P90 of one joint sample of the failures' timing, the time model's band and the "
            f"declared failure, restart and storage ranges ({req.samples:,} draws)")


def economics_lines(economics: Iterable[ClusterEconomics]) -> list[str]:
    """Each cluster's price (with its range), power per GPU, PUE and carbon intensity."""
    return [f"{e.cluster}: ${e.price_per_gpu_hour_usd.value:g} per GPU-hour "
            f"({e.price_per_gpu_hour_usd.low:g}-{e.price_per_gpu_hour_usd.high:g}), "
            f"{e.power_w_per_gpu.value:,.0f} W per GPU with its node's share, PUE {e.pue.value:g}, "
            f"{e.grid_kg_co2e_per_kwh.value:g} kg CO2e per kWh" for e in economics]


def option_cells(o: CapacityOption) -> list[str]:
    """An option's plan, days, GPU-hours, cost, MWh and tCO2e, as the table shows them ("" where it has none)."""
    if o.status != "ok":
        return [o.plan_name or "", "", "", "", "", ""]
    return [o.plan_name or "", days_triple(o), figure_text(o.gpu_hours), figure_text(o.cost_usd),
            figure_text(o.energy_mwh), figure_text(o.tco2e)]


def render_text(req: CapacityRequest, result: CapacityResult, economics: Iterable[ClusterEconomics]) -> list[str]:
    """What `simulator capacity` prints before the answer's launch."""
    lines = [question_line(req, result), searched_line(req, result), "",
             f"{'':2}{'cluster':16s} {'GPUs':>6}  {'plan':36s} {'days P10 / P50 / P90':>22}  {'GPU-hours':>20} "
             f"{'cost (USD)':>22} {'MWh':>20} {'tCO2e':>20}"]
    for o in result.options:
        if o.status == "ok":
            plan, days, hours, cost, mwh, co2 = option_cells(o)
            body = f"{plan[:36]:36s} {days:>22}  {hours:>20} {cost:>22} {mwh:>20} {co2:>20}"
        else:
            body = f"{o.status}: {o.message[:150]}"
        lines.append(f"{mark(result, o):2}{o.cluster[:16]:16s} {o.gpus:6,d}  {body}")
    lines += ["", legend_line(result)]
    answer = answer_line(result)
    if answer is not None:
        lines.append(answer)
    lines.append(binding_line(result))
    if result.bends:
        lines.append("where the curves bend:")
        lines += [f"  {b}" for b in bend_lines(result)]
    lines.append(samples_line(req))
    lines += economics_lines(economics)
    return lines
