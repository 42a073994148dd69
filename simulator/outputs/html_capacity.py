"""The interactive page of a capacity answer, in one offline HTML file (plotly.js inline, as the search's page).

The page says first what `simulator capacity` prints (``capacity_text``): the question, the answer with its days,
GPU-hours, cost, energy and emissions, what binds, where the curves bend and the prices, power, PUE and carbon the
figures come from, then the answer's Megatron-LM launch. Two charts follow: each cluster kind's days against its
GPUs (P50, the P10-P90 band of the joint sample, the deadline) and every option's cost against its days at the
confidence (the frontier, the answer, the deadline or the budget); hovering a point shows its option. Last, the
table of every option searched. Everything but the charts is static HTML, readable without the script.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any, Iterable

from simulator.outputs import capacity_text as t
from simulator.outputs.html_report import STYLE, html_page
from simulator.planner.capacity import CapacityOption, CapacityRequest, CapacityResult, answer_job
from simulator.spec._io import write_output
from simulator.spec.economics import ClusterEconomics

TABLE_COLUMNS = ("", "cluster", "GPUs", "nodes", "plan", "days P10 / P50 / P90", "GPU-hours", "cost (USD)", "MWh",
                 "tCO2e", "status")


def _hover(o: CapacityOption, confidence: str) -> str:
    """What hovering an option's point shows (plotly's hover labels read <br> and <b>)."""
    plan, days, hours, cost, mwh, co2 = (html.escape(x) for x in t.option_cells(o))
    return (f"<b>{html.escape(o.cluster)}, {o.gpus:,} GPUs</b><br>{plan}<br>days P10 / P50 / P90: {days}<br>"
            f"at {confidence}: {hours} GPU-hours, ${cost}<br>{mwh} MWh, {co2} tCO2e")


def _launch(req: CapacityRequest, result: CapacityResult) -> str | None:
    """The answer's Megatron-LM launch, saving at the interval its days assume (None without an answer)."""
    from simulator.outputs.export import render_launch

    job = answer_job(req, result)
    if job is None:
        return None
    return render_launch(job, save_interval=result.answer.save_interval, async_save=req.goodput.async_save)


def page_data(req: CapacityRequest, result: CapacityResult, economics: Iterable[ClusterEconomics]) -> dict[str, Any]:
    """The page's words and numbers, as JSON: the text `capacity` prints, every option's row and point."""
    c = result.confidence.value
    options = [{"cluster": o.cluster, "gpus": o.gpus, "nodes": o.nodes, "status": o.status, "message": o.message,
                "mark": t.mark(result, o), "answer": t.is_answer(result, o), "on_frontier": o.on_frontier,
                "cells": t.option_cells(o), "days_p10": o.days_p10, "days_p50": o.days_p50, "days_p90": o.days_p90,
                "days": o.days, "cost_usd": o.cost_usd.value if o.cost_usd is not None else None,
                "hover": _hover(o, c)} for o in result.options]
    return {"title": t.question_line(req, result), "summary": t.searched_line(req, result),
            "answer": t.answer_line(result), "binding": t.binding_line(result), "bends": t.bend_lines(result),
            "samples": t.samples_line(req), "economics": t.economics_lines(economics), "legend": t.legend_line(result),
            "launch": _launch(req, result), "confidence": c, "deadline_days": result.deadline_days,
            "budget_usd": result.budget_usd, "clusters": list(dict.fromkeys(o.cluster for o in result.options)),
            "options": options}


def _answer_html(d: dict[str, Any]) -> list[str]:
    out = ['<div id="answer">']
    if d["answer"] is not None:
        out.append(f'<h2 id="answer-line">{html.escape(d["answer"])}</h2>')
    out.append(f'<p id="binding"><b>{html.escape(d["binding"])}</b></p>')
    if d["bends"]:
        out += ['<p>where the curves bend:</p>', '<ul id="bends">',
                *(f"<li>{html.escape(b)}</li>" for b in d["bends"]), "</ul>"]
    out += [f'<p class="note">{html.escape(d["samples"])}</p>', '<ul id="economics" class="note">',
            *(f"<li>{html.escape(e)}</li>" for e in d["economics"]), "</ul>"]
    if d["launch"] is not None:
        out += ["<details><summary>Megatron-LM launch of the answer</summary>",
                f'<pre id="answer-launch">{html.escape(d["launch"])}</pre></details>']
    return out + ["</div>"]


def _table_html(d: dict[str, Any]) -> list[str]:
    out = ['<table id="options">', "<tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in TABLE_COLUMNS) + "</tr>"]
    for o in d["options"]:
        kind = "answer" if o["answer"] else "frontier" if o["on_frontier"] else ""
        cells = [o["mark"], o["cluster"], f"{o['gpus']:,}", f"{o['nodes']:,}", *o["cells"]]
        row = "".join(f"<td>{html.escape(x)}</td>" for x in cells)
        status = o["status"] if o["status"] == "ok" else f"{o['status']}: {o['message']}"
        out.append(f'<tr class="{kind}">{row}<td>{html.escape(status)}</td></tr>')
    return out + ["</table>", f'<p class="note">{html.escape(d["legend"])}</p>']


_STYLE = STYLE + """
table { border-collapse: collapse; font-size: 0.85em; }
th, td { padding: 0.2em 0.6em; text-align: right; border-bottom: 1px solid #ddd; white-space: nowrap; }
th:nth-child(2), td:nth-child(2), th:nth-child(5), td:nth-child(5), td:last-child { text-align: left; }
td:last-child { white-space: normal; }
tr.answer { background: #fff3c4; font-weight: bold; }
tr.frontier { background: #eef5ff; }
.charts { display: flex; flex-wrap: wrap; }
.charts > div { flex: 1 1 560px; height: 520px; }
"""

_SCRIPT = r"""
const D = JSON.parse(document.getElementById("page-data").textContent);
const palette = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
                 "#bcbd22", "#17becf"];
const color = name => palette[D.clusters.indexOf(name) % palette.length];
const fill = hex => "rgba(" + [1, 3, 5].map(i => parseInt(hex.slice(i, i + 2), 16)).join(",") + ",0.18)";
const ok = D.options.filter(o => o.status === "ok" && o.days_p50 !== null);
const answer = D.options.find(o => o.answer);
const config = {displaylogo: false, responsive: true};
const star = {size: 16, symbol: "star", color: "black"};
// a goal's line is a trace a little past the points drawn (a shape on a log axis would need its position's log)
const across = values => [Math.min(...values) / 1.1, Math.max(...values) * 1.1];
const rule = (name, x, y, dash) => ({type: "scatter", mode: "lines", name: name, x: x, y: y, hoverinfo: "skip",
                                     line: {dash: dash, color: "black", width: 1}});

const days = [];
for (const name of D.clusters) {
  const curve = ok.filter(o => o.cluster === name).sort((a, b) => a.gpus - b.gpus);
  if (!curve.length) continue;
  const x = curve.map(o => o.gpus);
  // the band: P10, then P90 filled down to it (a run that never finishes at P90 is drawn at its P50)
  days.push({type: "scatter", mode: "lines", x: x, y: curve.map(o => o.days_p10), line: {width: 0},
             hoverinfo: "skip", showlegend: false, legendgroup: name});
  days.push({type: "scatter", mode: "lines", x: x, y: curve.map(o => o.days_p90 !== null ? o.days_p90 : o.days_p50),
             fill: "tonexty", fillcolor: fill(color(name)), line: {width: 0}, hoverinfo: "skip",
             name: `${name}, P10-P90`, legendgroup: name});
  days.push({type: "scatter", mode: "lines+markers", x: x, y: curve.map(o => o.days_p50), name: `${name}, P50`,
             text: curve.map(o => o.hover), hovertemplate: "%{text}<extra></extra>", legendgroup: name,
             line: {color: color(name)}, marker: {size: 7, color: color(name)}});
}
const gpus = [...new Set(ok.map(o => o.gpus))].sort((a, b) => a - b);
if (D.deadline_days !== null && ok.length) days.push(rule(`deadline, ${D.deadline_days} days`, across(gpus),
                                                          [D.deadline_days, D.deadline_days], "dash"));
if (answer && answer.days !== null) days.push({type: "scatter", mode: "markers", x: [answer.gpus], y: [answer.days],
  name: `answer: ${answer.gpus.toLocaleString("en-US")} GPUs of ${answer.cluster}, ` +
        `${answer.days.toFixed(1)} days at ${D.confidence}`,
  text: [answer.hover], hovertemplate: "%{text}<extra></extra>", marker: star});
Plotly.newPlot("days", days, {
  title: {text: "Days against GPUs: P50 and the P10-P90 band of one joint sample"}, hovermode: "closest",
  xaxis: {title: {text: "GPUs"}, type: "log", tickvals: gpus},
  yaxis: {title: {text: "days with failures, checkpoints and restarts"}, type: "log"},
  legend: {orientation: "h", y: -0.2}, margin: {t: 50}}, config);

const priced = ok.filter(o => o.days !== null && o.cost_usd !== null);
const cost = D.clusters.filter(name => priced.some(o => o.cluster === name)).map(name => {
  const mine = priced.filter(o => o.cluster === name);
  return {type: "scatter", mode: "markers", name: name, x: mine.map(o => o.days), y: mine.map(o => o.cost_usd),
          text: mine.map(o => o.hover), hovertemplate: "%{text}<extra></extra>",
          marker: {size: 9, color: color(name)}};
});
const front = priced.filter(o => o.on_frontier).sort((a, b) => a.days - b.days);
if (front.length) cost.push({type: "scatter", mode: "lines", name: "frontier", x: front.map(o => o.days),
                             y: front.map(o => o.cost_usd), hoverinfo: "skip", line: {color: "grey", width: 1}});
if (priced.length) {
  const dayRange = across(priced.map(o => o.days)), costRange = across(priced.map(o => o.cost_usd));
  if (D.deadline_days !== null) cost.push(rule("deadline", [D.deadline_days, D.deadline_days], costRange, "dash"));
  if (D.budget_usd !== null) cost.push(rule("budget", dayRange, [D.budget_usd, D.budget_usd], "dot"));
}
if (answer && answer.cost_usd !== null) cost.push({type: "scatter", mode: "markers", name: "answer",
  x: [answer.days], y: [answer.cost_usd], text: [answer.hover], hovertemplate: "%{text}<extra></extra>",
  marker: star});
Plotly.newPlot("cost", cost, {
  title: {text: "Cost against days: every option searched and the frontier"}, hovermode: "closest",
  xaxis: {title: {text: `days at ${D.confidence}`}, type: "log"},
  yaxis: {title: {text: `cost at ${D.confidence}, US dollars`}, type: "log", tickformat: "$.3s"},
  legend: {orientation: "h", y: -0.2}, margin: {t: 50}}, config);
"""


def render_html(data: dict[str, Any]) -> str:
    """The page as one string (``html_report.html_page``): the same data, the same bytes."""
    return html_page(data["title"], [
        *_answer_html(data),
        f'<p class="note">{html.escape(data["summary"])}. Hover a point for its option.</p>',
        '<div class="charts"><div id="days"></div><div id="cost"></div></div>',
        *_table_html(data)], data, _SCRIPT, _STYLE)


def write_capacity_html(req: CapacityRequest, result: CapacityResult, economics: Iterable[ClusterEconomics],
                        path: Path) -> None:
    """Write the page as every output is written (``write_output``)."""
    write_output(path, render_html(page_data(req, result, economics)), "HTML page")
