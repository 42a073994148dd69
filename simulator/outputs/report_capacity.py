"""The report's capacity section: GPT-3 175B on 300B tokens, the cheapest way to finish in 30 days on A100, H100
or H200.

One question of `simulator capacity` (``plan_capacity``): each cluster kind's GPU counts near the deadline searched
for their best plan, each plan's days judged at P90 of one joint sample, priced with the declared economics; then
the answer, what binds there, the frontier of days against cost and where the curves bend. The section's words
come from ``capacity_text``, as the command's do, and its figure is the command's ``--plot``.
"""

from __future__ import annotations

import os
from typing import Any, Callable

from simulator.outputs import capacity_text as t
from simulator.outputs.report_scenarios import _table
from simulator.planner.capacity import (
    CapacityPoint,
    CapacityRequest,
    HOURS_PER_DAY,
    CapacityResult,
    Confidence,
    PointResult,
    plan_capacity,
)
from simulator.spec.catalog import PRESETS
from simulator.spec.economics import DEFAULT_ECONOMICS, ClusterEconomics, economics_for, load_economics
from simulator.spec.hardware import load_cluster

MODEL = "gpt3-175b"
TOKENS = 300e9
GLOBAL_BATCH_SIZE = 1536
CLUSTERS = ("dgx-a100-80gb", "dgx-h100", "dgx-h200")
DEADLINE_DAYS = 30.0
CONFIDENCE = Confidence.p90
FIGURE = "capacity_gpt3_175b"
SHARE = {Confidence.p50.value: "half of its", Confidence.p90.value: "nine of ten"}  # runs that finish in time
ECONOMICS_FILE = f"hardware_specs/economics/{DEFAULT_ECONOMICS}.yaml"


def capacity_request(clusters: tuple[str, ...] = CLUSTERS, **kw: Any) -> CapacityRequest:
    """The section's question with the command's defaults (``kw`` replaces any field: a test asks a smaller one)."""
    cs = tuple(load_cluster(name) for name in clusters)
    data = load_economics(DEFAULT_ECONOMICS)
    fields = dict(model=PRESETS[MODEL], clusters=cs, economics=tuple(economics_for(c, data) for c in cs),
                  tokens=TOKENS, global_batch_size=GLOBAL_BATCH_SIZE, deadline_days=DEADLINE_DAYS,
                  confidence=CONFIDENCE)
    return CapacityRequest(**{**fields, **kw})


def command(req: CapacityRequest) -> str:
    """The `simulator capacity` line that asks the same question."""
    tokens = f"{req.tokens / 1e9:g}e9" if req.tokens >= 1e9 else f"{req.tokens:g}"
    return (f"simulator capacity --model {req.model.name} --tokens {tokens} --gbs {req.global_batch_size} "
            f"--clusters {','.join(c.name for c in req.clusters)} --deadline-days {req.deadline_days:g}"
            + (f" --confidence {req.confidence.value}" if req.confidence is not Confidence.p90 else ""))


def capacity_data(req: CapacityRequest | None = None,
                  evaluate: Callable[[CapacityPoint], PointResult] | None = None,
                  workers: int | None = None) -> dict[str, Any]:
    """The question, its result and the economics it was priced with, as JSON (``workers``: processes, by default
    one per cluster kind and at most one per core). The result carries no elapsed time: nothing in the report may
    depend on how long it took."""
    req = req or capacity_request()
    workers = workers or max(1, min(len(req.clusters), os.cpu_count() or 1))
    result = plan_capacity(req, evaluate=evaluate, workers=workers)
    return {"command": command(req), "model": req.model.name, "tokens": req.tokens,
            "global_batch_size": req.global_batch_size, "samples": req.samples, "refine": req.refine,
            "result": result.model_dump(mode="json", exclude={"elapsed_s"}),
            "economics": [e.model_dump(mode="json") for e in req.economics]}


def result_of(data: dict[str, Any]) -> CapacityResult:
    """The result ``capacity_data`` stored (its elapsed time, which nothing here shows, set to 0)."""
    return CapacityResult.model_validate({**data["result"], "elapsed_s": 0.0})


def _cell(text: str) -> str:
    return text.replace("|", "\\|")  # a message's bar would split the Markdown cell


def _declared(d: dict[str, Any], fmt: str = "g") -> str:
    return f"{d['value']:{fmt}} ({d['low']:{fmt}}-{d['high']:{fmt}})"


def capacity_lines(data: dict[str, Any]) -> list[str]:
    result = result_of(data)
    economics = [ClusterEconomics.model_validate(e) for e in data["economics"]]
    c = result.confidence.value
    deadline = result.deadline_days
    tokens = t.si(data["tokens"]).replace("G", "B")
    lines = [f"## 11. GPT-3 175B on {tokens} tokens: the cheapest way to finish in {deadline:g} days on A100, H100 "
             "or H200", "",
             f"`{data['command']}` asks which of {len(economics)} cluster kinds, how many GPUs and which plan train "
             f"{data['model']} on {tokens} tokens (global batch {data['global_batch_size']:,}) for the least money and "
             f"still finish within {deadline:g} days in {SHARE[c]} runs ({c}). For each kind it binary-searches its "
             "GPU counts (powers of two of whole nodes, from the memory floor up) for the first that meets the "
             f"deadline, bisects the nodes between it and the count before it up to {data['refine']} times where a "
             "cheaper answer could lie there, takes each count's best plan as `search` ranks plans, and judges it by "
             f"its days at {c} of one joint sample ({data['samples']:,} draws) of the failures' timing with "
             "checkpoints and restarts at the cluster's declared rates, the time model's band, and the declared "
             "failure, restart and storage ranges. An option's GPU-hours are its GPUs x "
             f"{HOURS_PER_DAY:g} x those days (a booking that long); its cost, energy and emissions are the GPU-hours "
             "x the price, x the node's power per GPU x PUE, and that energy x the grid's carbon intensity, each "
             f"declared in `{ECONOMICS_FILE}` with its range (below). Each figure's band runs from P10 with every "
             "price, power, PUE and carbon figure at its low end to P90 with each at its high end. `simulator "
             "capacity ... --html FILE` writes the same answer as an interactive page.", ""]
    lines += _table(["cluster", "USD per GPU-hour", "W per GPU (its node's share)", "PUE", "kg CO2e per kWh"],
                    [[e["cluster"], _declared(e["price_per_gpu_hour_usd"]), _declared(e["power_w_per_gpu"], ",.0f"),
                      _declared(e["pue"]), _declared(e["grid_kg_co2e_per_kwh"])] for e in data["economics"]])
    rows = []
    for o in result.options:
        plan, days, hours, cost, mwh, co2 = t.option_cells(o)
        status = o.status if o.status == "ok" else f"{o.status}: {o.message}"
        mark = t.mark(result, o)
        rows.append([f"`{mark}`" if mark else "", o.cluster, f"{o.gpus:,}", plan, days, hours, cost, mwh, co2,
                     _cell(status)])
    lines += ["", f"Every option searched ({result.searches} searches):", ""]
    lines += _table(["", "cluster", "GPUs", "best plan", "days P10 / P50 / P90", "GPU-hours", "cost (USD)", "MWh",
                     "tCO2e", "status"], rows)
    lines += ["", t.legend_line(result, quote="`") + ".", ""]
    answer = t.answer_line(result)
    lines.append(f"**{answer[0].upper()}{answer[1:]}.**" if answer is not None
                 else f"No option finishes within {deadline:g} days at {c}.")
    lines += ["", f"What binds ({result.binding}): {result.binding_note}.", ""]
    front = sorted((o for o in result.options if o.on_frontier), key=lambda o: o.days)
    if front:
        lines += [f"The frontier, fastest first (no other option is both faster and cheaper at {c}): "
                  + "; ".join(f"{o.gpus:,} GPUs of {o.cluster}, {t.days_text(o.days)} days, "
                              f"${t.si(o.cost_usd.value)}" for o in front) + ".", ""]
    if result.bends:
        lines += ["Where the curves bend:", ""] + [f"- {b}" for b in t.bend_lines(result)] + [""]
    lines += ["Left, each cluster kind's days against its GPUs (P50 and the P10-P90 band) with the deadline; right, "
              f"every option's cost against its days at {c}, with the frontier and the answer.", "",
              f"![capacity: days against GPUs and cost against days](figures/{FIGURE}.png)", ""]
    return lines


def _summary(result: CapacityResult) -> dict[str, Any]:
    """What report.json keeps: each option's days and figures, the answer and what binds."""
    keep = ("cluster", "gpus", "status", "plan_name", "days_p10", "days_p50", "days_p90", "days", "gpu_hours",
            "cost_usd", "energy_mwh", "tco2e", "on_frontier")
    a = result.answer
    return {"options": [o.model_dump(mode="json", include=set(keep)) for o in result.options],
            "answer": None if a is None else {"cluster": a.cluster, "gpus": a.gpus},
            "binding": result.binding, "binding_note": result.binding_note}


def capacity_section(data: dict[str, Any]) -> dict[str, Any]:
    """The section of ``data`` (``capacity_data``) as a report step returns it: its lines, what report.json keeps,
    and its figure, which `capacity --plot` draws."""
    return {"lines": capacity_lines(data), "data": {"capacity": _summary(result_of(data))},
            "figures": [[FIGURE, "capacity", data["result"]]]}


def step_capacity(_: dict) -> dict:
    return capacity_section(capacity_data())
