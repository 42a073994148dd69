"""`simulator capacity`: bad input is one sentence and exit code 2 before any search; the answer, the frontier
and every option's GPU-hours, cost, energy and emissions come out as a table, JSON, CSV and an HTML page."""

from __future__ import annotations

import csv
import html
import io
import json
import sys

import pytest
from click.testing import CliRunner

from simulator.cli import cli
from simulator.planner import capacity
from tests.planner.test_capacity import fake_point

BASE = ["capacity", "--model", "gpt3-175b", "--tokens", "300e9", "--gbs", "1536"]
THREE = ["--clusters", "dgx-a100-80gb,dgx-h100,dgx-h200"]


def refused(*args: str, needle: str) -> str:
    result = CliRunner().invoke(cli, list(args))
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    assert "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], result.stderr
    return lines[0]


@pytest.fixture
def searched(monkeypatch):
    """Every point searched by the synthetic curve of the planner's tests, in this process."""
    seen = []

    def fake(point):
        seen.append((point.cluster.name, point.gpus))
        return fake_point(point)

    monkeypatch.setattr(capacity, "evaluate_point", fake)
    return seen


@pytest.mark.parametrize("args,needle", [
    (THREE + ["--deadline-days", "0"], "--deadline-days"),
    (THREE + ["--deadline-days", "-3"], "--deadline-days"),
    (THREE + ["--deadline-days", "nan"], "--deadline-days"),
    (["--clusters", ""], "--clusters names nothing"),
    (["--clusters", " , "], "--clusters names nothing"),
    (["--clusters", "dgx-h100,,dgx-h200"], "empty entry"),
    (["--clusters", "dgx-h100,dgx-h100"], "named twice"),
    (["--clusters", "no-such-cluster"], "unknown cluster 'no-such-cluster'"),
    (["--clusters", "dgx-h100", "--gpus-min", "1", "--gpus-max", "7"], "holds no whole node of dgx-h100"),
    (["--clusters", "dgx-h100", "--gpus-min", "512", "--gpus-max", "256"], "GPU range 512-256 is empty"),
    (["--clusters", "dgx-h100", "--gpus", "64,100"], "--gpus 100 is not whole nodes"),
    (["--clusters", "dgx-h100", "--gpus", "64", "--gpus-max", "128"], "not both"),
    (["--clusters", "dgx-h100", "--gpus", "64,,128"], "empty entry"),
    (["--clusters", "dgx-h100", "--gpus", "sixty"], "not a whole number"),
    (THREE + ["--price-per-gpu-hour", "nan"], "--price-per-gpu-hour 'nan' is not a price"),
    (THREE + ["--price-per-gpu-hour", "dgx-h100=inf"], "is not a price"),
    (THREE + ["--price-per-gpu-hour", "dgx-h100=-1"], "is not a price"),
    (THREE + ["--price-per-gpu-hour", "dgx-b200=3"], "names cluster 'dgx-b200', which --clusters does not"),
    (THREE + ["--deadline-days", "30", "--budget", "1e6"], "not both"),
    (THREE + ["--pue", "0.9"], "--pue"),
    (["--clusters", "local-cpu"], "no price or power for GPU 'CPU'"),
    (THREE + ["--confidence", "P75"], "--confidence"),
])
def test_bad_input_is_one_sentence_and_exit_2_before_any_search(args, needle, searched):
    refused(*BASE, *args, needle=needle)
    assert searched == []


def test_the_deadline_answer_with_its_frontier_figures_and_launch(searched):
    result = CliRunner().invoke(cli, [*BASE, *THREE, "--deadline-days", "30", "--workers", "1"])
    assert result.exit_code == 0, (result.output, result.exception)
    out = result.output
    assert "the cheapest option that finishes by 30 days at P90" in out
    assert "answer: " in out and "binding: deadline: the next cheaper option" in out
    for column in ("GPU-hours", "cost (USD)", "MWh", "tCO2e", "days P10 / P50 / P90"):
        assert column in out
    assert "* " in out and "+ " in out  # the answer and the frontier are marked
    assert "per GPU-hour" in out and "kg CO2e per kWh" in out
    assert len({c for c, _ in searched}) == 3


def test_json_carries_every_option_the_answer_and_what_binds(searched, tmp_path):
    path = tmp_path / "options.csv"
    result = CliRunner().invoke(cli, [*BASE, *THREE, "--deadline-days", "30", "--workers", "1", "--json",
                                      "--csv", str(path)])
    assert result.exit_code == 0, (result.output, result.exception)
    doc = json.loads(result.output)
    assert doc["goal"] == "deadline" and doc["confidence"] == "P90" and doc["deadline_days"] == 30
    answer = doc["answer"]
    assert answer["days_p90"] <= 30 and answer["days"] == answer["days_p90"]
    for key in ("gpu_hours", "cost_usd", "energy_mwh", "tco2e"):
        f = answer[key]
        assert f["low"] <= f["value"] <= f["high"], key
    assert doc["binding"] == "deadline" and doc["binding_note"]
    assert any(o["on_frontier"] for o in doc["options"])
    assert [e["cluster"] for e in doc["economics"]] == ["dgx-a100-80gb", "dgx-h100", "dgx-h200"]
    assert doc["csv"] == str(path)
    rows = list(csv.DictReader(io.StringIO(path.read_text())))
    assert len(rows) == len(doc["options"]) and sum(r["answer"] == "True" for r in rows) == 1
    assert {"cost_usd", "cost_usd_low", "cost_usd_high", "energy_mwh", "tco2e", "gpu_hours"} <= set(rows[0])


def test_a_price_flag_replaces_the_price_of_its_cluster_only(searched):
    args = [*BASE, *THREE, "--workers", "1", "--json", "--price-per-gpu-hour", "dgx-h100=1.5"]
    doc = json.loads(CliRunner().invoke(cli, args).output)
    prices = {e["cluster"]: e["price_per_gpu_hour_usd"] for e in doc["economics"]}
    assert prices["dgx-h100"] == {"value": 1.5, "low": 1.5, "high": 1.5, "source": "given by a flag"}
    assert prices["dgx-a100-80gb"]["value"] == 2.0
    both = json.loads(CliRunner().invoke(cli, [*args, "--price-per-gpu-hour", "4"]).output)
    assert {e["price_per_gpu_hour_usd"]["value"] for e in both["economics"]} == {4.0}  # a later flag wins


def test_an_impossible_deadline_names_the_fastest_and_what_binds(searched):
    result = CliRunner().invoke(cli, [*BASE, *THREE, "--deadline-days", "0.01", "--workers", "1"])
    assert result.exit_code == 0, (result.output, result.exception)
    assert "answer: " not in result.output
    assert "no option finishes by 0.01 days at P90: the fastest," in result.output


def test_a_real_search_end_to_end():
    """One small question through the real searches: a plan, days from the joint sample, and its launch."""
    result = CliRunner().invoke(cli, ["capacity", "--model", "gpt3-125m", "--tokens", "2e9", "--gbs", "64",
                                      "--clusters", "dgx-h100", "--gpus", "8,16", "--deadline-days", "1",
                                      "--workers", "1", "--json"])
    assert result.exit_code == 0, (result.output, result.exception)
    doc = json.loads(result.output)
    assert [o["status"] for o in doc["options"]] == ["ok", "ok"]
    a = doc["answer"]
    assert a["plan"]["data_parallel_size"] * a["plan"]["tensor_parallel_size"] * a["plan"]["pipeline_parallel_size"] \
        == a["gpus"]
    assert a["days_p10"] <= a["days_p50"] <= a["days_p90"] <= 1
    assert "--global-batch-size" in " ".join(doc["launch"]["megatron_args"])


class _Ref:
    def __init__(self, value):
        self.value = value


def test_on_ray_the_answer_is_the_one_local_processes_give(searched, monkeypatch):
    """Ray replaced by the stand-in of the sweep's tests (each point run in this process when submitted)."""
    import sys
    import types

    from tests.cli.test_ray_cli import FakeRay

    class Ray(FakeRay):
        def remote(self, fn):
            return types.SimpleNamespace(remote=lambda *args: _Ref(fn(*args)))

        def wait(self, refs, num_returns=1):
            return refs[:num_returns], refs[num_returns:]

        def get(self, ref):
            return ref.value

    ray = Ray()
    monkeypatch.setitem(sys.modules, "ray", ray)
    args = [*BASE, *THREE, "--deadline-days", "30", "--json"]
    on_ray = json.loads(CliRunner().invoke(cli, [*args, "--ray-address", "local", "--workers", "2"]).output)
    local = json.loads(CliRunner().invoke(cli, [*args, "--workers", "1"]).output)
    assert ray.inits and ray.inits[0]["address"] == "local" and not ray.up
    for doc in (on_ray, local):
        doc.pop("elapsed_s")
    assert on_ray == local
    refused(*args, "--ray-address", " ", needle="--ray-address is empty")


def test_the_figure_draws_days_against_gpus_with_the_deadline_and_the_frontier(searched, tmp_path):
    from simulator.outputs.plots_capacity import capacity_figure
    from simulator.planner.capacity import plan_capacity
    from tests.planner.test_capacity import _request

    path = tmp_path / "capacity.png"
    result = CliRunner().invoke(cli, [*BASE, *THREE, "--deadline-days", "30", "--workers", "1", "--plot", str(path)])
    assert result.exit_code == 0, (result.output, result.exception)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f"figure written to {path}" in result.output
    said = capacity_figure(plan_capacity(_request(deadline_days=30), evaluate=fake_point), tmp_path / "c.svg")
    days, cost = said["axes"]
    assert "deadline, 30 days" in days["legend"] and any(x.startswith("answer: ") for x in days["legend"])
    assert {"frontier", "answer", "deadline"} <= set(cost["legend"])
    refused(*BASE, *THREE, "--plot", str(tmp_path / "c.txt"), needle="PNG, SVG or PDF")


def test_html_writes_the_page_and_json_names_it(searched, tmp_path):
    pytest.importorskip("plotly")
    page = tmp_path / "capacity.html"
    args = [*BASE, *THREE, "--deadline-days", "30", "--workers", "1", "--html", str(page)]
    doc = json.loads(CliRunner().invoke(cli, [*args, "--json"]).output)
    assert doc["html"] == str(page)
    text = page.read_text(encoding="utf-8")
    a = doc["answer"]
    assert f"answer: {a['gpus']:,} GPUs" in text and html.escape(doc["binding_note"]) in text
    assert all(f"<td>{o['cluster']}</td><td>{o['gpus']:,}</td>" in text for o in doc["options"])
    said = CliRunner().invoke(cli, args)
    assert said.exit_code == 0 and f"interactive page written to {page}" in said.output
    refused(*args[:-1], str(tmp_path / "c.txt"), needle="HTML")


def test_without_plotly_html_is_one_sentence_before_any_search(searched, monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "plotly", None)  # as if it were not installed
    monkeypatch.setitem(sys.modules, "plotly.offline", None)
    page = tmp_path / "capacity.html"
    refused(*BASE, *THREE, "--deadline-days", "30", "--workers", "1", "--html", str(page), needle="needs plotly")
    assert searched == [] and not page.exists()
