"""The capacity page: one offline file that says the answer, what binds and every option as `capacity` prints them,
and draws each cluster kind's days against its GPUs and every option's cost against its days (on the synthetic
curve of the planner's tests: no search is run).

The rendering test opens the page in headless Chromium with a probe appended, as the search page's test does,
and reads back what plotly drew and what hovering the answer shows; it is skipped where no Chromium is installed.
"""

from __future__ import annotations

import html
import json
import re

import pytest

from simulator.outputs import capacity_text as t
from simulator.outputs.html_capacity import page_data, render_html, write_capacity_html
from simulator.planner.capacity import plan_capacity
from tests.outputs.test_html_report import CHROMIUM, probe_page
from tests.planner.test_capacity import _request, fake_point

pytest.importorskip("plotly")


def _page(**kw):
    req = _request(**kw)
    result = plan_capacity(req, evaluate=fake_point)
    return req, result, page_data(req, result, req.economics)


@pytest.fixture(scope="module")
def deadline():
    # 64 GPUs of A100 lie under the synthetic curve's memory floor: an option with no plan, and its reason
    return _page(deadline_days=30, gpus=(64, 128, 256, 512, 1024))


def _rows(text: str) -> list[str]:
    table = text[text.index('<table id="options">'):text.index("</table>")]
    return re.findall(r"<tr[^>]*>.*?</tr>", table)[1:]  # past the header


def test_the_page_is_one_offline_deterministic_file(deadline, tmp_path):
    req, result, data = deadline
    text = render_html(data)
    assert text == render_html(json.loads(json.dumps(data)))  # the same data, the same bytes
    assert "<script src" not in text and "<link" not in text  # nothing to fetch
    write_capacity_html(req, result, req.economics, tmp_path / "c.html")
    assert (tmp_path / "c.html").read_text(encoding="utf-8") == text


def test_the_page_says_what_the_command_prints(deadline):
    req, result, data = deadline
    text = render_html(data)
    assert result.answer is not None
    for line in [t.question_line(req, result), t.answer_line(result), t.binding_line(result), t.samples_line(req),
                 *t.bend_lines(result), *t.economics_lines(req.economics)]:
        assert html.escape(line) in text, line
    assert text.index('id="answer-line"') < text.index('id="days"') < text.index('id="options"')


def test_every_option_is_a_row_and_the_answer_is_marked(deadline):
    _, result, data = deadline
    rows = _rows(render_html(data))
    assert len(rows) == len(result.options) >= 2
    assert any(o.status == "no plan" for o in result.options)
    for o, row in zip(result.options, rows):
        assert f"<td>{html.escape(o.cluster)}</td><td>{o.gpus:,}</td>" in row
        if o.status == "ok":
            assert all(f"<td>{html.escape(cell)}</td>" in row for cell in t.option_cells(o))
        else:
            assert html.escape(f"{o.status}: {o.message}") in row
    marked = [o for o, row in zip(result.options, rows) if 'class="answer"' in row]
    assert [(o.cluster, o.gpus) for o in marked] == [(result.answer.cluster, result.answer.gpus)]
    assert sum('class="frontier"' in row for row in rows) == sum(o.on_frontier and not t.is_answer(result, o)
                                                                 for o in result.options)


def test_without_an_answer_the_page_says_what_binds_and_lists_every_option():
    _, result, data = _page()  # no goal: the frontier alone
    text = render_html(data)
    assert result.answer is None and 'id="answer-line"' not in text and "answer-launch" not in text
    assert html.escape(t.binding_line(result)) in text
    assert len(_rows(text)) == len(result.options)


PROBE = r"""
    const days = document.getElementById("days"), cost = document.getElementById("cost");
    for (let i = 0; i < 200 && !(days._fullLayout && cost._fullLayout && cost._fullLayout.xaxis); i++) await sleep(50);
    const D = JSON.parse(document.getElementById("page-data").textContent);
    const a = D.options.find(o => o.answer);
    const xa = days._fullLayout.xaxis, ya = days._fullLayout.yaxis, box = days.getBoundingClientRect();
    // on a log axis l2p takes the log of the value
    days.querySelector(".nsewdrag").dispatchEvent(new MouseEvent("mousemove", {bubbles: true,
      clientX: box.left + xa._offset + xa.l2p(Math.log10(a.gpus)),
      clientY: box.top + ya._offset + ya.l2p(Math.log10(a.days))}));
    await sleep(500);
    const traces = gd => gd._fullData.map(tr => ({name: tr.name, points: tr.x.length, fill: tr.fill}));
    out.textContent = JSON.stringify({days: traces(days), cost: traces(cost), xtype: xa.type,
      hover: Array.from(days.querySelectorAll(".hoverlayer .hovertext")).map(e => e.textContent).join(" | ")});
"""


@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium installed (apt-get install chromium)")
def test_the_charts_draw_each_cluster_the_deadline_the_frontier_and_the_answer(deadline, tmp_path):
    _, result, data = deadline
    seen = probe_page(render_html(data), PROBE, tmp_path)
    ok = [o for o in result.options if o.status == "ok"]
    days = {tr["name"]: tr for tr in seen["days"]}
    for name in data["clusters"]:
        mine = sum(o.cluster == name for o in ok)
        assert days[f"{name}, P50"]["points"] == mine
        assert days[f"{name}, P10-P90"]["points"] == mine and days[f"{name}, P10-P90"]["fill"] == "tonexty"
    assert f"deadline, {result.deadline_days:g} days" in days
    a = result.answer
    assert any(n.startswith(f"answer: {a.gpus:,} GPUs of {a.cluster}, {a.days:.1f} days at P90") for n in days)
    cost = {tr["name"]: tr for tr in seen["cost"]}
    assert cost["frontier"]["points"] == sum(o.on_frontier for o in ok)
    assert {"deadline", "answer"} <= set(cost)
    assert sum(cost[name]["points"] for name in data["clusters"]) == len(ok)
    assert seen["xtype"] == "log"
    assert f"{a.cluster}, {a.gpus:,} GPUs" in seen["hover"] and a.plan_name in seen["hover"]
