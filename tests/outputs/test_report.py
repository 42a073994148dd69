"""The committed report is what the code computes: regenerate it from scratch and compare; every figure
is written with labels that come from the data; a rerun with nothing changed is all cache hits and
writes the same bytes."""

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from simulator.cli import cli
from simulator.outputs.report import README_ORDER, generate, steps
from simulator.outputs.report_cache import ReportCache
from tests.close import assert_close

# the whole report is generated once for the module (over a minute on 2 cores): `make test-slow` runs it
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
FIGURES = ("pareto_gpt3_175b", "time_breakdown_top_plans", "tp_pp_heatmap", "parity", "memory_breakdown",
           "memory_vs_micro_batch", "stage_memory", "pipeline_timeline", "pipeline_timeline_zoom", "days_vs_gpus",
           "mfu_vs_gpus", "moe_ep", "goodput_vs_gpus", "capacity_gpt3_175b")
FIGURES_IN_ORDER = FIGURES  # the order the README shows them


@pytest.fixture(scope="module")
def fresh(tmp_path_factory):
    out = tmp_path_factory.mktemp("reports")
    generate(out)
    return out


@pytest.fixture(scope="module")
def data(fresh):
    return json.loads((fresh / "data" / "report.json").read_text())


def test_the_committed_report_equals_a_fresh_one(fresh, data):
    assert (fresh / "README.md").read_text() == (REPO / "reports" / "README.md").read_text(), \
        "reports/ is stale: run `simulator report --out reports` and commit it"
    # the raw numbers within a relative 1e-9: another machine's numpy or BLAS moves their last bits,
    # not the physics
    assert_close(data, json.loads((REPO / "reports" / "data" / "report.json").read_text()),
                 hint="run `simulator report --out reports` and commit it")


def test_every_figure_the_report_shows_is_written(fresh, data):
    text = (fresh / "README.md").read_text()
    assert sorted(data["figures"]) == sorted(FIGURES)
    for name in FIGURES:
        assert f"(figures/{name}.png)" in text
        assert (fresh / "figures" / f"{name}.png").stat().st_size > 10_000
        assert (REPO / "reports" / "figures" / f"{name}.png").exists()


def test_every_figure_says_what_it_shows(data):
    figures = data["figures"]
    for name in set(FIGURES) - {"parity", "memory_breakdown", "moe_ep", "goodput_vs_gpus", "capacity_gpt3_175b"}:
        title = figures[name]["axes"][0]["title"]
        for needle in ("gpt3-175b", "dgx-a100-80gb", "global batch 1,536", "sequence 2,048", "bf16", "unfused"):
            assert needle in title, (name, needle, title)
        assert figures[name]["axes"][0]["legend"], name
    for name in ("pareto_gpt3_175b", "time_breakdown_top_plans", "tp_pp_heatmap", "stage_memory", "pipeline_timeline"):
        assert "1,024 x A100-SXM4-80GB" in figures[name]["axes"][0]["title"]
    panels = figures["memory_breakdown"]["axes"]
    assert [ax["title"].split("\n")[0] for ax in panels] == ["megatron-22b", "gpt3-175b", "mt-nlg-530b", "megatron-1t"]
    assert all("sequence 2,048" in ax["title"] for ax in panels) and "GPU memory (80 GiB)" in panels[-1]["legend"]
    assert len(figures["parity"]["axes"]) == len(data["parity"])
    goodput = figures["goodput_vs_gpus"]  # section 9's own job: Llama 3 405B as Meta ran it
    assert "Llama 3 405B" in goodput["title"] and "H100" in goodput["title"]
    assert all(ax["legend"] and ax["xlabel"] == "GPUs" for ax in goodput["axes"])
    days, cost = figures["capacity_gpt3_175b"]["axes"]  # section 11's question: its deadline and its answer
    assert "deadline, 30 days" in days["legend"] and any(x.startswith("answer: ") for x in days["legend"])
    assert {"deadline", "frontier", "answer"} <= set(cost["legend"])


def test_the_timeline_shows_the_best_plan_of_the_search(data):
    figures = data["figures"]
    best = next(t for t in figures["pareto_gpt3_175b"]["axes"][0]["legend"] if t.startswith("best plan"))
    # "best plan (simulated): TP4 PP16x6 ..., 18.13 s, MFU 58.5%" and, on its own line, how plans were ranked
    seconds = re.search(r", (\d+(?:\.\d+)? s), MFU", best).group(1)
    for name in ("pipeline_timeline", "pipeline_timeline_zoom"):
        assert f": {seconds} per iteration" in figures[name]["axes"][0]["title"]
    assert "steps " in figures["pipeline_timeline_zoom"]["axes"][0]["title"]


def test_the_headline_is_within_ten_percent_of_24_days(data):
    assert abs(data["headline"]["best_days"] / 24 - 1) <= 0.10
    assert data["headline"]["standard_days"] > data["headline"]["search_alone_days"] > data["headline"]["best_days"]


def test_a_rerun_with_nothing_changed_reads_the_cache_and_writes_the_same_bytes(fresh):
    before = {p: p.read_bytes() for p in fresh.rglob("*") if p.is_file() and ".cache" not in p.parts}
    cache = ReportCache(fresh / ".cache")
    seen = []
    generate(fresh, progress=lambda step, cached, done, total: seen.append((step, cached, done, total)), cache=cache)
    assert cache.misses == []
    assert [s for s, *_ in seen] == [s.name for s in steps()] + [f"figure {name}" for name in FIGURES_IN_ORDER]
    assert all(cached for _, cached, _, _ in seen) and set(README_ORDER) <= {s for s, *_ in seen}
    after = {p: p.read_bytes() for p in fresh.rglob("*") if p.is_file() and ".cache" not in p.parts}
    assert after == before


def test_the_command_shows_no_progress_where_a_program_reads_and_writes_the_html_page(fresh):
    pytest.importorskip("plotly")
    result = CliRunner().invoke(cli, ["report", "--out", str(fresh), "--html"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert result.output == f"report written to {fresh / 'README.md'} and {fresh / 'report.html'}\n"
    page = (fresh / "report.html").read_text(encoding="utf-8")
    assert "<script src" not in page and "Where the iteration goes" in page


def test_the_cpu_rows_do_not_depend_on_what_the_process_computed_before():
    """A process that predicted the CPU runs with the A100 profile, validated them with their own, then played
    the report's A100 plans must still predict them as a fresh process does (the committed report's rows):
    every cache on the way is keyed by what it was built from."""
    from simulator.cost.profile import default_profile
    from simulator.measure.datasets import CPU_REFERENCE, CPU_VALIDATION, evaluate
    from simulator.measure.run_record import load_run_record
    from simulator.measure.validate import validate
    from simulator.outputs.figure_data import _cpu_sets

    evaluate(CPU_REFERENCE, default_profile("A100-SXM4-80GB"))
    for path in sorted(CPU_VALIDATION.glob("run-*.json")):
        validate(load_run_record(path), str(CPU_VALIDATION / "cpu-profile.json"))
    next(s for s in steps() if s.name == "decomposition").compute({})

    points = next(s["points"] for s in _cpu_sets(CPU_VALIDATION) if s["name"] == "CPU reference runs: times")
    errors = [abs(predicted / measured - 1) for _, predicted, measured in points]
    committed = json.loads((REPO / "reports" / "data" / "report.json").read_text())["parity"]
    assert_close({"mean_abs_error": sum(errors) / len(errors), "max_abs_error": max(errors), "points": len(points)},
                 committed["CPU reference runs: times"])
