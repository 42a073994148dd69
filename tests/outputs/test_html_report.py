"""The interactive page: one offline file that renders in headless Chromium, where hovering a plan shows
its layout, time, MFU and memory and clicking a simulated plan shows its breakdown.

The test writes a copy of the page with a probe script appended: once plotly has drawn, the probe
moves the mouse over the best plan's point (a real mousemove on plotly's drag layer), reads the
hover label, clicks a simulated plan, and writes what it saw into the DOM, which Chromium's
``--dump-dom`` prints. Skipped only where no Chromium is installed (``make test`` installs it where
it can).
"""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess

import pytest

from simulator.outputs.html_report import page_data, render_html, write_html
from simulator.planner.plan_search import SearchRequest, search
from simulator.spec.catalog import PRESETS
from simulator.spec.hardware import load_cluster

pytest.importorskip("plotly")

TOKENS = 30e9

CHROMIUM = next((shutil.which(name) for name in ("chromium", "chromium-browser", "google-chrome")
                 if shutil.which(name)), None)
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--host-resolver-rules=MAP * ~NOTFOUND",  # no network: the page must work offline
         "--virtual-time-budget=20000", "--dump-dom"]


def probe_page(page_html: str, probe_js: str, tmp_path) -> dict:
    """What ``probe_js`` saw in ``page_html`` once headless Chromium ran it: the script, given ``out`` (a
    ``<pre>`` it fills with JSON) and ``sleep``, runs after the page's own; an error it throws fails the test."""
    script = ("<script>\n(async function () {\n  const out = document.createElement(\"pre\");\n  out.id = \"probe\";\n"
              "  const sleep = ms => new Promise(r => setTimeout(r, ms));\n  try {\n" + probe_js +
              "  } catch (e) {\n    out.textContent = JSON.stringify({error: String(e && e.stack || e)});\n  }\n"
              "  document.body.appendChild(out);\n})();\n</script>\n")
    path = tmp_path / "page.html"
    path.write_text(page_html.replace("</body>", script + "</body>"), encoding="utf-8")
    run = subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={tmp_path / 'chromium-profile'}", path.as_uri()],
                         capture_output=True, text=True, timeout=180)
    found = re.search(r'<pre id="probe">(.*?)</pre>', run.stdout, re.S)
    assert found, f"the page did not finish rendering:\n{run.stderr[-2000:]}"
    seen = json.loads(html.unescape(found.group(1)))
    assert "error" not in seen, seen["error"]
    return seen

PROBE = r"""
    const gd = document.getElementById("pareto");
    for (let i = 0; i < 200 && !(gd._fullLayout && gd._fullLayout.xaxis); i++) await sleep(50);
    const D = JSON.parse(document.getElementById("page-data").textContent);
    const best = D.plans.find(p => p[5] === D.best);
    const xa = gd._fullLayout.xaxis, ya = gd._fullLayout.yaxis, box = gd.getBoundingClientRect();
    const drag = gd.querySelector(".nsewdrag");
    drag.dispatchEvent(new MouseEvent("mousemove", {bubbles: true, clientX: box.left + xa._offset + xa.l2p(best[1]),
                                                    clientY: box.top + ya._offset + ya.l2p(best[2])}));
    await sleep(500);
    const hover = Array.from(gd.querySelectorAll(".hoverlayer .hovertext")).map(e => e.textContent).join(" | ");
    const other = D.plans.find(p => p[5] > 0);
    gd.emit("plotly_click", {points: [{customdata: other[5]}]});
    await sleep(300);
    out.textContent = JSON.stringify({
      points: gd.querySelectorAll(".scatterlayer .trace:first-child .point").length, hover: hover,
      selected: document.getElementById("selected").textContent, other: D.simulated[other[5]].layout,
      bars: document.querySelectorAll("#breakdown .bars .point").length,
      answer: (document.getElementById("answer") || {}).innerText,
      note: (document.querySelector("p.note") || {}).innerText,
      breakdown_title: (document.querySelector("#breakdown .gtitle") || {}).textContent});
"""


@pytest.fixture(scope="module")
def page():
    req = SearchRequest(model=PRESETS["gpt3-1.3b"], cluster=load_cluster("dgx-a100-80gb"), num_gpus=16,
                        global_batch_size=32)
    result = search(req, tokens=TOKENS, top=3)
    return req, result, page_data(result, req)


def test_the_page_is_one_offline_deterministic_file(page, tmp_path):
    _, result, data = page
    text = render_html(data)
    assert text == render_html(json.loads(json.dumps(data)))  # the same data, the same bytes
    assert "<script src" not in text and "<link" not in text  # nothing to fetch
    assert len(data["plans"]) == len(result.screened)
    assert data["simulated"][data["best"]]["layout"] in text
    write_html(data, tmp_path / "p.html")
    assert (tmp_path / "p.html").read_text(encoding="utf-8") == text


@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium installed (apt-get install chromium)")
def test_the_page_renders_in_headless_chromium_and_a_hover_shows_a_plan(page, tmp_path):
    _, result, data = page
    seen = probe_page(render_html(data), PROBE, tmp_path)
    assert seen["points"] == len(result.screened)
    best = data["simulated"][data["best"]]
    for needle in (best["layout"], f"iteration {best['iteration_time_s']:.2f} s", f"MFU {100 * best['mfu']:.1f}%",
                   f"peak memory {best['peak_gib']:.1f} GiB"):
        assert needle in seen["hover"], (needle, seen["hover"])
    assert seen["selected"].startswith(f"selected: {seen['other']}:")
    assert seen["breakdown_title"] == f"Where the iteration goes: {seen['other']}"
    assert seen["bars"] == len(data["parts"])
    # the answer, as `search` gives it: days and their band, the regime or why outside it, the launch
    e, best_plan = result.best.estimate, result.best
    for needle in (f"{e.training_days:.1f} training days for {TOKENS:.3g} tokens",
                   f"band {e.training_days_low:.1f}-{e.training_days_high:.1f} days",
                   f"band {best_plan.iteration_time_s_low:.2f}-{best_plan.iteration_time_s_high:.2f} s",
                   "torchrun", f"--tensor-model-parallel-size {best_plan.plan.tensor_parallel_size}"):
        assert needle in seen["answer"], (needle, seen["answer"])
    if best_plan.validation_regime is not None:
        assert f"inside a measured regime: {best_plan.validation_regime}" in seen["answer"]
    else:
        assert "outside every measured regime" in seen["answer"]
    if e.validation_note:
        assert e.validation_note in seen["answer"]
    assert f"{result.simulated} simulated by the engine" in seen["note"]


def test_the_page_says_the_answer_and_counts_as_search_does(page):
    """Days, band, regime and warnings and the launch are in the page's static HTML; its count of simulated
    plans is the search's (the front's plans it times for itself are said apart)."""
    _, result, data = page
    text = render_html(data)
    a = data["answer"]
    assert a["training_days"] == result.best.estimate.training_days
    assert (a["training_days_low"], a["training_days_high"]) == (result.best.estimate.training_days_low,
                                                                  result.best.estimate.training_days_high)
    assert f"band {a['training_days_low']:.1f}-{a['training_days_high']:.1f} days" in text
    assert html.escape(a["launch"]) in text and "--tensor-model-parallel-size" in a["launch"]
    assert ("inside a measured regime" if a["validation_regime"] else "outside every measured regime") in text
    assert data["summary"].split(", ")[2].startswith(f"{result.simulated} simulated by the engine")


def test_the_page_gives_the_expected_days_and_ettr_beside_the_days(page):
    """Where the best plan's failure-free days are shown, its expected days with failures, checkpoints and
    restarts and its ETTR stand beside them, the figures `plan` gives, and the launch saves at the interval
    those days assume."""
    from simulator.estimator.goodput import goodput
    from simulator.spec.plan import Job

    req, result, data = page
    best = result.best
    g = goodput(Job(model=req.model, cluster=req.cluster, plan=best.plan), best.estimate, req.goodput, simulate=False)
    a = data["answer"]
    assert (a["expected_days"], a["ettr"], a["save_interval"]) == (g.expected_days, g.ettr, g.save_interval)
    assert a["expected_days"] >= a["training_days"]  # failures only ever add days
    text = render_html(data)
    days = text.index('id="answer-days"')
    expected = text.index('id="answer-expected"')
    assert days < expected < text.index('id="answer-regime"')
    for needle in (f"{g.expected_days:.1f} expected days with failures, checkpoints and restarts",
                   f"ETTR {100 * g.ettr:.1f}%"):
        assert needle in text, needle
    assert f"--save-interval {g.save_interval}" in a["launch"]


def test_the_pages_best_plan_says_how_plans_are_ranked(page):
    from simulator.outputs.plots import RANKED_BY

    req, _, data = page
    assert data["ranked_by"] == RANKED_BY[req.rank_by.value]
    assert "plans ranked by ${D.ranked_by}" in render_html(data)


def test_without_tokens_the_page_has_no_expected_days():
    req = SearchRequest(model=PRESETS["gpt3-1.3b"], cluster=load_cluster("dgx-a100-80gb"), num_gpus=16,
                        global_batch_size=32)
    data = page_data(search(req, top=1), req)
    assert data["answer"]["expected_days"] is None and data["answer"]["ettr"] is None
    assert 'id="answer-expected"' not in render_html(data)
