"""An interactive page of a search, in one offline HTML file (plotly.js bundled inline).

The Pareto plot shows every plan that fits; hovering a point shows its layout, iteration time, MFU,
peak memory and throughput. Clicking a plan the engine simulated (the top plans and the Pareto
front) selects it, and the bar below shows where its iteration goes; the best plan is selected
when the page opens. Needs the ``html`` extra (plotly) only to bundle its JavaScript.
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

from simulator.estimator.prediction import Estimate, simulate_job
from simulator.outputs.describe import band_origin, layout
from simulator.outputs.figure_data import breakdown_label, breakdown_parts, pareto_front, request_title
from simulator.outputs.plots import RANKED_BY
from simulator.planner.plan_search import SearchRequest, SearchResult
from simulator.spec._io import write_output
from simulator.spec.errors import ConfigError
from simulator.spec.plan import Job
from simulator.spec.units import gib


def _simulated(est: Estimate, plan) -> dict[str, Any]:
    return {"layout": layout(plan), "iteration_time_s": est.iteration_time_s, "mfu": est.mfu,
            "peak_gib": gib(est.memory.peak_bytes), "tokens_per_s": est.tokens_per_s,
            "parts": list(breakdown_parts(est).values())}


def page_data(result: SearchResult, req: SearchRequest, profile=None) -> dict[str, Any]:
    """The page's numbers: every plan that fits (closed-form screen) and the engine's breakdown of the
    ranked plans and of every plan on the Pareto front (simulated here if the search did not)."""
    best = result.best.estimate
    mfu_seconds = best.mfu * best.iteration_time_s  # the same model FLOPs and peak for every plan
    tokens = req.global_batch_size * req.model.seq_length
    front = pareto_front([(s.peak_bytes, -s.screen_time_s) for s in result.screened])
    engine = {r.plan: r.estimate for r in result.plans}
    for i in front:
        plan = result.screened[i].plan
        if plan not in engine:
            engine[plan] = simulate_job(Job(model=req.model, cluster=req.cluster, plan=plan), profile).estimate
    simulated, index = [], {}
    for plan in [r.plan for r in result.plans] + [result.screened[i].plan for i in front]:
        if plan not in index:
            index[plan] = len(simulated)
            simulated.append(_simulated(engine[plan], plan))
    plans = [[layout(s.plan), gib(s.peak_bytes), tokens / s.screen_time_s, mfu_seconds / s.screen_time_s,
              s.screen_time_s, index.get(s.plan, -1)] for s in result.screened]
    extra = len(simulated) - result.simulated
    return {"title": request_title(req), "capacity_gib": gib(req.cluster.gpu.memory_bytes), "plans": plans,
            "front": sorted(front, key=lambda i: result.screened[i].peak_bytes), "simulated": simulated,
            "best": 0, "parts": [breakdown_label(k) for k in breakdown_parts(best)],
            # the search's own counts, as `search` prints them; the front's plans timed for this page apart
            "summary": f"{result.enumerated:,} plans enumerated, {len(result.screened):,} fit in memory, "
                       f"{result.simulated} simulated by the engine"
                       + (f" (and {extra} more of the Pareto front for this page)" if extra > 0 else ""),
            "answer": answer(result, req), "ranked_by": RANKED_BY[req.rank_by.value]}


def _expected(job: Job, est: Estimate, req: SearchRequest) -> dict[str, Any]:
    """The best plan's days with failures, checkpoints and restarts and its ETTR, in closed form as `plan`
    gives them (``simulator.estimator.goodput``); none without --tokens, and a note where the run would
    fail faster than it restarts."""
    from simulator.estimator.goodput import EndlessRunError, goodput

    none = {"expected_days": None, "expected_days_low": None, "expected_days_high": None, "ettr": None,
            "save_interval": req.goodput.save_interval, "goodput_note": ""}
    if est.tokens is None:
        return none
    try:
        g = goodput(job, est, req.goodput, simulate=False)
    except EndlessRunError as exc:
        return {**none, "goodput_note": f"no expected days: {exc}"}
    return {"expected_days": g.expected_days, "expected_days_low": g.expected_days_low,
            "expected_days_high": g.expected_days_high, "ettr": g.ettr, "save_interval": g.save_interval,
            "goodput_note": ""}


def answer(result: SearchResult, req: SearchRequest) -> dict[str, Any]:
    """What the page says first, as `search` says it: the best plan, its time and days with their band, its
    expected days with failures, checkpoints and restarts and its ETTR, the measured regime it lies in or why
    it lies outside every one, and the Megatron-LM launch that runs it (saving at the interval those days
    assume)."""
    from simulator.outputs.export import render_launch

    best, est = result.best, result.best.estimate
    job = Job(model=req.model, cluster=req.cluster, plan=best.plan)
    expected = _expected(job, est, req)
    return {"plan": layout(best.plan), "iteration_time_s": est.iteration_time_s,
            "iteration_time_s_low": best.iteration_time_s_low, "iteration_time_s_high": best.iteration_time_s_high,
            "mfu": est.mfu, "training_days": est.training_days, "training_days_low": est.training_days_low,
            "training_days_high": est.training_days_high, "tokens": est.tokens, **expected,
            "validation_regime": best.validation_regime, "outside_regime_reasons": list(best.outside_regime_reasons),
            "band_from_runs": list(best.band_from_runs),
            "validation_note": est.validation_note,
            "launch": render_launch(job, save_interval=expected["save_interval"], async_save=req.goodput.async_save)}


def _expected_html(a: dict[str, Any]) -> str:
    """The expected days and ETTR beside the failure-free days, as one sentence."""
    if a["expected_days"] is None:
        return a["goodput_note"]
    high = f"{a['expected_days_high']:.1f}" if a["expected_days_high"] is not None else "never finishing"
    return (f"{a['expected_days']:.1f} expected days with failures, checkpoints and restarts "
            f"(band {a['expected_days_low']:.1f}-{high} days), ETTR {100 * a['ettr']:.1f}%, "
            f"saving every {a['save_interval']:,} iterations")


def _answer_html(a: dict[str, Any]) -> list[str]:
    """The answer as static HTML, readable before (or without) any script."""
    time = f"{a['iteration_time_s']:.2f} s per iteration"
    if a["iteration_time_s_low"] is not None:
        time += f" (band {a['iteration_time_s_low']:.2f}-{a['iteration_time_s_high']:.2f} s)"
    days = "training days: give the search --tokens"
    if a["training_days"] is not None:
        days = f"{a['training_days']:.1f} training days for {a['tokens']:.3g} tokens without failures"
        if a["training_days_low"] is not None:
            days += f" (band {a['training_days_low']:.1f}-{a['training_days_high']:.1f} days)"
    if a["band_from_runs"]:
        regime = "band: " + band_origin(a["validation_regime"], a["outside_regime_reasons"], a["band_from_runs"])
    elif a["validation_regime"] is not None:
        regime = f"inside a measured regime: {a['validation_regime']}"
    else:
        regime = "outside every measured regime, so its band is widened: " + "; ".join(a["outside_regime_reasons"])
    expected = _expected_html(a)
    out = ['<div id="answer">', f"<h2>Best plan: {html.escape(a['plan'])}</h2>",
           f'<p id="answer-days"><b>{html.escape(days)}</b>; {html.escape(time)}, MFU {100 * a["mfu"]:.1f}%</p>',
           *([f'<p id="answer-expected"><b>{html.escape(expected)}</b></p>'] if expected else []),
           f'<p id="answer-regime">{html.escape(regime)}</p>']
    if a["validation_note"]:
        out.append(f'<p id="answer-warning" class="warning">! {html.escape(a["validation_note"])}</p>')
    out += ["<details open><summary>Megatron-LM launch of the best plan</summary>",
            f'<pre id="answer-launch">{html.escape(a["launch"])}</pre></details>', "</div>"]
    return out


STYLE = """
body { font-family: sans-serif; margin: 1.5em; color: #222; }
h1 { font-size: 1.2em; white-space: pre-line; }
#selected { font-family: monospace; margin: 0.5em 0; }
.note { color: #666; font-size: 0.9em; }
.warning { color: #a40000; }
h2 { font-size: 1.05em; }
pre { background: #f4f4f4; padding: 0.5em; overflow-x: auto; font-size: 0.85em; }
"""

_SCRIPT = r"""
const D = JSON.parse(document.getElementById("page-data").textContent);
const pct = x => (100 * x).toFixed(1) + "%";
const num = x => Math.round(x).toLocaleString("en-US");
function describe(p) {
  const sim = p[5] >= 0 ? D.simulated[p[5]] : null;
  const time = sim ? `iteration ${sim.iteration_time_s.toFixed(2)} s (engine; screen ${p[4].toFixed(2)} s)`
                   : `iteration ${p[4].toFixed(2)} s (closed-form screen)`;
  return `<b>${p[0]}</b><br>${time}<br>MFU ${pct(sim ? sim.mfu : p[3])}<br>peak memory ${p[1].toFixed(1)} GiB` +
         `<br>${num(sim ? sim.tokens_per_s : p[2])} tokens/s`;
}
const P = D.plans;
const sims = P.filter(p => p[5] >= 0);
const best = P.find(p => p[5] === D.best);
const traces = [
  {type: "scatter", mode: "markers", name: `plans that fit (${P.length}, closed-form screen)`,
   x: P.map(p => p[1]), y: P.map(p => p[2]), text: P.map(describe), customdata: P.map(p => p[5]),
   hovertemplate: "%{text}<extra></extra>", marker: {size: 5, color: "#1f77b4", opacity: 0.45}},
  {type: "scatter", mode: "lines+markers", name: `Pareto front (${D.front.length} plans)`,
   x: D.front.map(i => P[i][1]), y: D.front.map(i => P[i][2]), text: D.front.map(i => describe(P[i])),
   customdata: D.front.map(i => P[i][5]), hovertemplate: "%{text}<extra></extra>",
   line: {color: "#ff7f0e"}, marker: {size: 6, color: "#ff7f0e"}},
  {type: "scatter", mode: "markers", name: "simulated by the engine (click for its breakdown)",
   x: sims.map(p => p[1]), y: sims.map(p => p[2]), text: sims.map(describe), customdata: sims.map(p => p[5]),
   hovertemplate: "%{text}<extra></extra>", marker: {size: 9, symbol: "diamond", color: "#2ca02c"}},
  {type: "scatter", mode: "markers", name: `best plan: ${best[0]} (plans ranked by ${D.ranked_by})`,
   x: [best[1]], y: [best[2]],
   text: [describe(best)], customdata: [D.best], hovertemplate: "%{text}<extra></extra>",
   marker: {size: 16, symbol: "star", color: "#d62728"}},
];
const layout = {
  title: {text: "Throughput against peak memory, every plan that fits"}, hovermode: "closest",
  xaxis: {title: {text: "peak memory per GPU (GiB)"}}, yaxis: {title: {text: "throughput (tokens / s)"}},
  shapes: [{type: "line", x0: D.capacity_gib, x1: D.capacity_gib, yref: "paper", y0: 0, y1: 1,
            line: {dash: "dash", color: "grey"}}],
  annotations: [{x: D.capacity_gib, yref: "paper", y: 1.02, text: `GPU memory (${D.capacity_gib.toFixed(0)} GiB)`,
                 showarrow: false}],
  legend: {orientation: "h", y: -0.2}, margin: {t: 50},
};
const config = {displaylogo: false, responsive: true};
Plotly.newPlot("pareto", traces, layout, config);
function select(i) {
  const s = D.simulated[i];
  document.getElementById("selected").textContent =
    `selected: ${s.layout}: ${s.iteration_time_s.toFixed(2)} s per iteration, MFU ${pct(s.mfu)}, ` +
    `peak ${s.peak_gib.toFixed(1)} GiB`;
  const bars = D.parts.map((name, k) => ({type: "bar", orientation: "h", name: name, x: [s.parts[k]], y: [""],
    hovertemplate: `${name}: %{x:.3f} s<extra></extra>`}));
  Plotly.react("breakdown", bars, {barmode: "stack", title: {text: `Where the iteration goes: ${s.layout}`},
    xaxis: {title: {text: "seconds per iteration (critical stage)"}},
    legend: {orientation: "h", y: -0.5, traceorder: "normal"},
    margin: {t: 40}}, config);
}
document.getElementById("pareto").on("plotly_click", ev => {
  const i = ev.points[0].customdata;
  if (i >= 0) select(i);
  else document.getElementById("selected").textContent =
    "not simulated by the engine (closed-form screen only): click a green, orange or red point for a breakdown";
});
select(D.best);
"""


def plotly_js() -> str:
    """plotly.js, to bundle inline; without plotly (the ``html`` extra), one sentence (``ConfigError``)."""
    try:
        from plotly.offline import get_plotlyjs
    except ImportError:
        raise ConfigError("the HTML page needs plotly; install it with pip install 'megatron-perf-simulator[html]' "
                          "(or pip install plotly)") from None
    return get_plotlyjs()


def html_page(title: str, body: list[str], data: dict[str, Any], script: str, style: str = STYLE) -> str:
    """A page as one string: ``title`` as its heading (a line break kept), ``body``, ``data`` as JSON in the
    element ``page-data`` and ``script`` after it, plotly.js inline: no network, same bytes for the same data."""
    js = plotly_js()
    one_line = title.replace("\n", ", ")
    payload = json.dumps(data, sort_keys=True, separators=(",", ":")).replace("</", "<\\/")
    return "\n".join([
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{html.escape(one_line)}</title>", f"<style>{style}</style>",
        f"<script>{js}</script>", "</head><body>", f"<h1>{html.escape(title)}</h1>", *body,
        f'<script type="application/json" id="page-data">{payload}</script>',
        f"<script>{script}</script>", "</body></html>", ""])


def render_html(data: dict[str, Any]) -> str:
    """The search's page as one string (see ``html_page``)."""
    return html_page(data["title"], [
        *(_answer_html(data["answer"]) if "answer" in data else []),
        f'<p class="note">{html.escape(data["summary"])}. Hover a point for '
        "its plan; click a simulated plan for its time breakdown.</p>",
        '<div id="pareto" style="height:600px"></div>', '<div id="selected"></div>',
        '<div id="breakdown" style="height:260px"></div>'], data, _SCRIPT)


def write_html(data: dict[str, Any], path: Path) -> None:
    """Write the page as every output is written (``write_output``)."""
    write_output(path, render_html(data), "HTML page")


def write_search_html(result: SearchResult, req: SearchRequest, path: Path, profile=None) -> None:
    write_html(page_data(result, req, profile), path)
