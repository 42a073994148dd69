"""The report's capacity section: its table, answer and frontier say what its data holds, every option searched is
a row, the figure is the command's, and the same question gives the same bytes. The fast tests price the synthetic
curve of the planner's tests (no search is run); the report's own question runs its searches (`make test-slow`)."""

from __future__ import annotations

import json

import pytest

from simulator.outputs.figures import draw
from simulator.outputs.report import README_ORDER, steps
from simulator.outputs.report_capacity import (
    CLUSTERS,
    DEADLINE_DAYS,
    FIGURE,
    capacity_data,
    capacity_request,
    capacity_section,
    step_capacity,
)
from simulator.spec.economics import economics_for, load_economics
from simulator.spec.hardware import load_cluster
from tests.planner.test_capacity import fake_point


def _section(**kw) -> dict:
    data = capacity_data(capacity_request(**kw), evaluate=fake_point, workers=1)
    return json.loads(json.dumps(capacity_section(data)))  # as the report's cache hands it on


@pytest.fixture(scope="module")
def section():
    # 64 GPUs of A100 lie under the synthetic curve's memory floor: a row with no plan, and its reason
    return _section(gpus=(64, 128, 256, 512, 1024))


def _option_rows(lines: list[str]) -> list[list[str]]:
    start = lines.index(next(x for x in lines if x.startswith("|  | cluster | GPUs |"))) + 2
    end = lines.index("", start)
    return [[c.strip() for c in row.strip("|").split(" | ")] for row in lines[start:end]]


def check(section: dict) -> None:
    """The contract of the section, whatever the question's numbers: the lines say what the data holds."""
    lines, summary = section["lines"], section["data"]["capacity"]
    rows = _option_rows(lines)
    options = summary["options"]
    assert [(r[1], r[2]) for r in rows] == [(o["cluster"], f"{o['gpus']:,}") for o in options]
    a = summary["answer"]
    starred = [(r[1], r[2]) for r in rows if r[0] == "`*`"]
    if a is None:
        assert starred == [] and any(x.startswith("No option finishes within") for x in lines)
    else:
        assert starred == [(a["cluster"], f"{a['gpus']:,}")]
        answer = next(o for o in options if (o["cluster"], o["gpus"]) == (a["cluster"], a["gpus"]))
        said = next(x for x in lines if x.startswith("**Answer: "))
        assert said.startswith(f"**Answer: {a['gpus']:,} GPUs") and f"of {a['cluster']}, {answer['plan_name']}" in said
        assert answer["days"] <= DEADLINE_DAYS and answer["days"] == answer["days_p90"]
    for r, o in zip(rows, options):
        assert (r[0] == "`+`") == (o["on_frontier"] and (a is None or (o["cluster"], o["gpus"]) != (a["cluster"],
                                                                                                      a["gpus"])))
        assert r[-1] == "ok" if o["status"] == "ok" else r[-1].startswith(f"{o['status']}: ")
    front = [o for o in options if o["on_frontier"]]
    if front:
        said = next(x for x in lines if x.startswith("The frontier, fastest first"))
        assert all(f"{o['gpus']:,} GPUs of {o['cluster']}, " in said for o in front)
    assert f"What binds ({summary['binding']}): {summary['binding_note']}." in lines
    (stem, kind, figure), = section["figures"]
    assert (stem, kind) == (FIGURE, "capacity") and f"figures/{FIGURE}.png" in "\n".join(lines)
    assert [(o["cluster"], o["gpus"]) for o in figure["options"]] == [(o["cluster"], o["gpus"]) for o in options]
    assert "elapsed_s" not in figure  # nothing the report keeps depends on how long it took


def test_the_table_answer_and_frontier_say_what_the_data_holds(section):
    check(section)
    assert any(o["status"] == "no plan" for o in section["data"]["capacity"]["options"])
    assert section["data"]["capacity"]["answer"] is not None


def test_without_an_answer_the_section_says_so():
    check(_section(gpus=(64, 128), clusters=("dgx-a100-80gb",)))


def test_the_prices_are_the_declared_ones_with_their_ranges(section):
    data = load_economics()
    text = "\n".join(section["lines"])
    assert "hardware_specs/economics/default.yaml" in text
    for name in CLUSTERS:
        e = economics_for(load_cluster(name), data)
        p, pue = e.price_per_gpu_hour_usd, e.pue
        assert f"| {name} | {p.value:g} ({p.low:g}-{p.high:g}) |" in text
        assert f"| {pue.value:g} ({pue.low:g}-{pue.high:g}) |" in text


def test_the_same_question_gives_the_same_bytes(section):
    assert json.dumps(_section(gpus=(64, 128, 256, 512, 1024)), sort_keys=True) == json.dumps(section, sort_keys=True)


def test_the_figure_is_the_commands(section, tmp_path):
    (stem, kind, figure), = section["figures"]
    said = draw(kind, figure, tmp_path / f"{stem}.png")
    days, cost = said["axes"]
    assert f"deadline, {DEADLINE_DAYS:g} days" in days["legend"]
    assert any(x.startswith("answer: ") for x in days["legend"])
    assert {"frontier", "answer", "deadline"} <= set(cost["legend"])


def test_the_report_runs_the_section_after_blackwell():
    assert README_ORDER[README_ORDER.index("blackwell") + 1] == "capacity"
    step = next(s for s in steps() if s.name == "capacity")
    assert step.compute is step_capacity and list(CLUSTERS) in step.params and DEADLINE_DAYS in step.params


@pytest.mark.slow
def test_the_reports_capacity_question():
    """The section as the report computes it (thirteen or so searches, about half a minute on 2 cores)."""
    section = json.loads(json.dumps(step_capacity({})))
    check(section)
    assert section["data"]["capacity"]["answer"] is not None
    assert {o["cluster"] for o in section["data"]["capacity"]["options"]} == set(CLUSTERS)
