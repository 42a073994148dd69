"""Every figure is written with a title naming what it shows, units, a legend and labelled reference
lines, and its labels and numbers come from the data (checked from what matplotlib drew, not pixels)."""

from __future__ import annotations

import pytest

from simulator.cli.options import job_from_options
from simulator.estimator.memory import memory_plan
from simulator.estimator.prediction import simulate_job
from simulator.outputs import figure_data as fd
from simulator.outputs import figures
from simulator.outputs.figure_data import breakdown_label
from simulator.outputs.plots import TIMELINE_STYLE, draw
from simulator.planner.plan_search import SearchPins, SearchRequest, search
from simulator.spec.catalog import PRESETS
from simulator.spec.errors import ConfigError
from simulator.spec.hardware import load_cluster
from simulator.spec.units import GIB

PLAN = dict(model="gpt3-1.3b", gpus=16, tensor_parallel_size=2, pipeline_parallel_size=4, virtual_pipeline_stages=2,
            sequence_parallel=True, recompute_granularity="selective", global_batch_size=16)


@pytest.fixture(scope="module")
def job():
    return job_from_options(**PLAN)


@pytest.fixture(scope="module")
def sim(job):
    return simulate_job(job, record=True)


@pytest.fixture(scope="module")
def searched():
    req = SearchRequest(model=PRESETS["gpt3-1.3b"], cluster=load_cluster("dgx-a100-80gb"), num_gpus=16,
                        global_batch_size=32)
    return req, search(req, top=4)


def _says_what_it_is(title: str, model="gpt3-1.3b", gpus="16", batch="global batch") -> None:
    for needle in (model, "dgx-a100-80gb", f"{gpus} x A100-SXM4-80GB", batch, "sequence 2,048", "bf16",
                   "auto attention"):
        assert needle in title, (needle, title)


def test_pareto_front_is_labelled_with_its_plans_and_throughput_is_in_tokens(tmp_path, searched):
    req, result = searched
    data = fd.pareto_data(result, req)
    summary = draw("pareto", data, tmp_path / "p.png")
    plot, key = summary["axes"]
    _says_what_it_is(plot["title"])
    assert plot["ylabel"] == "throughput (tokens / s)" and plot["ylabel_right"] == ["MFU (%)"]
    assert plot["xlabel"] == "peak memory per GPU (GiB)"
    assert "GPU memory (80 GiB)" in plot["legend"]
    assert f"Pareto front ({len(data['front'])} plans, numbered)" in plot["legend"]
    # every front point carries its number, and the key gives each number's plan
    assert plot["texts"] == [str(k) for k in range(1, len(data["front"]) + 1)]
    for k, i in enumerate(data["front"], 1):
        assert key["texts"][k - 1].startswith(f"{k:>2}  {data['plans'][i][4]}  ")
    # tokens/s and MFU of each plan are its own screen time's
    tokens = req.global_batch_size * req.model.seq_length
    for (peak, tps, mfu, t, _), s in zip(data["plans"], result.screened):
        assert tps == pytest.approx(tokens / s.screen_time_s) and peak == s.peak_bytes / GIB
    best = result.best.estimate
    assert data["plans"][0][2] * data["plans"][0][3] == pytest.approx(best.mfu * best.iteration_time_s)
    # no plan off the front beats a front plan on both axes
    front = {data["plans"][i][0]: data["plans"][i][1] for i in data["front"]}
    for peak, tps, *_ in data["plans"]:
        assert any(f_peak <= peak and f_tps >= tps for f_peak, f_tps in front.items())


def test_timeline_has_a_legend_and_zooms_to_a_window_of_steps(tmp_path, job, sim):
    whole = draw("timeline", fd.timeline_data(sim, job), tmp_path / "t.png")["axes"][0]
    _says_what_it_is(whole["title"])
    assert f"{sim.estimate.iteration_time_s:.2f} s per iteration" in whole["title"]
    assert "TP 2, PP 4 x2, DP 2, mbs 1, SP, recompute selective" in whole["title"]
    labels = [label for _, label, _, _ in TIMELINE_STYLE.values()]
    assert whole["legend"] == labels + ["compute idle (pipeline bubble, waiting)",
                                        f"iteration end ({sim.estimate.iteration_time_s:.2f} s)"]
    assert whole["texts"] == [] and whole["xlabel"] == "time (s)"
    data = fd.timeline_data(sim, job, (2, 6))
    zoom = draw("timeline", data, tmp_path / "z.png")["axes"][0]
    assert "steps 2-5 of each stage" in zoom["title"]
    # each stage's steps 2..5 are labelled micro-batch.chunk, in the stage's schedule order
    steps = [[iv for iv in sim.engine.intervals if iv.stage == s and iv.step is not None] for s in range(4)]
    expected = sorted(f"{iv.step.micro_batch}.{iv.step.chunk}" for stage in steps for iv in stage[2:6])
    # (steps of other stages that overlap the window are labelled too)
    assert set(expected) <= set(zoom["texts"])
    assert all(t.count(".") == 1 and t.replace(".", "").isdigit() for t in zoom["texts"])
    with pytest.raises(ConfigError, match="outside the"):
        fd.timeline_data(sim, job, (0, 10_000))


def test_stage_memory_parts_sum_to_each_stage_peak(tmp_path, job):
    data = fd.stage_memory_data(job)
    ax = draw("stage-memory", data, tmp_path / "s.png")["axes"][0]
    _says_what_it_is(ax["title"])
    assert sorted(ax["legend"]) == sorted(list(data["parts"]) + ["GPU memory (80 GiB)"])
    assert ax["ylabel"] == "GiB per GPU" and ax["xlabel"] == "pipeline stage"
    for stage, s in enumerate(memory_plan(job).stages):
        assert sum(v[stage] for v in data["parts"].values()) == pytest.approx(s.peak_bytes / GIB)
    assert ax["texts"] == [f"peak {max(data['peak_gib']):.1f} GiB"]


def test_memory_vs_micro_batch_more_recompute_never_more_memory(tmp_path):
    job = job_from_options(gpus=1024, tensor_parallel_size=8, pipeline_parallel_size=16, global_batch_size=1536)
    data = fd.memory_vs_micro_batch_data(job)
    ax = draw("memory-vs-micro-batch", data, tmp_path / "m.png")["axes"][0]
    _says_what_it_is(ax["title"], model="gpt3-175b", gpus="1,024")
    assert ax["legend"] == [f"recompute: {p}" for p in data["series"]] + ["GPU memory (80 GiB)"]
    assert ax["xlabel"] == "micro-batch size (sequences)" and "GiB" in ax["ylabel"]
    none, selective, full = data["series"].values()
    assert all(a >= b >= c for a, b, c in zip(none, selective, full))
    for series in data["series"].values():
        assert series == sorted(series)  # a bigger micro-batch never needs less


def test_memory_breakdown_panels_state_their_configuration(tmp_path, job):
    data = fd.memory_breakdown_data([job], fd.job_title(job))
    summary = draw("memory-breakdown", data, tmp_path / "b.png")
    _says_what_it_is(summary["title"])
    ax = summary["axes"][0]
    assert ax["title"] == "gpt3-1.3b\nTP 2, PP 4, mbs 1, sequence 2,048"
    assert "GPU memory (80 GiB)" in ax["legend"]
    assert set(data["panels"][0]["bars"]) == {"no recompute", "SP", "selective", "SP + selective", "full"}


def test_time_breakdown_parts_sum_to_each_plans_iteration(tmp_path, searched):
    req, result = searched
    data = fd.search_time_breakdown_data(result, req)
    ax = draw("time-breakdown", data, tmp_path / "tb.png")["axes"][0]
    _says_what_it_is(ax["title"])
    assert ax["legend"] == [breakdown_label(k) for k in result.best.estimate.breakdown.model_dump()]
    assert len(data["plans"]) == len(result.plans) == 4
    for q, r in zip(data["plans"], result.plans):
        assert sum(q["parts"].values()) == pytest.approx(r.estimate.iteration_time_s, rel=1e-9)
    assert ax["texts"] == [f" {r.estimate.iteration_time_s:.2f} s, MFU {r.estimate.mfu:.1%}" for r in result.plans]


def test_tp_pp_heatmap_cells_are_simulated_times(tmp_path, searched):
    req, result = searched
    data = fd.tp_pp_heatmap_data(result, req)
    summary = draw("tp-pp-heatmap", data, tmp_path / "h.png")
    ax = summary["axes"][0]
    _says_what_it_is(ax["title"])
    assert summary["axes"][1]["ylabel"] == "iteration time (s)"  # the colour bar
    cells = {(s.plan.tensor_parallel_size, s.plan.pipeline_parallel_size) for s in result.screened}
    filled = [t for row in data["iteration_time_s"] for t in row if t is not None]
    assert len(filled) == len(cells)
    fastest = min(filled)
    assert any(text.startswith("fastest: ") and text.endswith(f"{fastest:.2f} s") for text in ax["legend"])
    assert sorted(t for t in ax["texts"] if t != "-") == sorted(f"{t:.2f}" for t in filled)


def test_days_and_mfu_against_gpu_count(tmp_path):
    req = SearchRequest(model=PRESETS["gpt3-1.3b"], cluster=load_cluster("dgx-a100-80gb"), num_gpus=16,
                        global_batch_size=64, pins=SearchPins(virtual_pipeline_stages=1))
    data = fd.scaling_data(req, (8, 16, 32), 10e9)
    days = [q["days"] for q in data["points"]]
    assert days == sorted(days, reverse=True)
    ax = draw("days-vs-gpus", data, tmp_path / "d.png")["axes"][0]
    assert "dgx-a100-80gb" in ax["title"] and "global batch 64" in ax["title"] and "sequence 2,048" in ax["title"]
    assert ax["ylabel"] == "training days (10B tokens)" and ax["xlabel"] == "A100-SXM4-80GB GPUs"
    assert ax["legend"] == ["best plan at each size", "linear scaling from 8 GPUs"]
    assert ax["texts"] == [f"{d:.1f} d" for d in days]
    ax = draw("mfu-vs-gpus", data, tmp_path / "m.png")["axes"][0]
    first = 100 * data["points"][0]["mfu"]
    assert ax["legend"] == ["best plan at each size", f"perfect scaling: {first:.1f}% as at 8 GPUs"]
    assert ax["ylabel"] == "MFU (%)"


def test_parity_has_a_panel_for_every_validation_data_set(tmp_path):
    data = fd.parity_data()
    names = [s["name"] for s in data["sets"]]
    assert names[:6] == ["Table 5 and Sec. 6.3: iteration time", "Table 5 and abstract: MFU", "Table 4: one 22B layer",
                         "Figure 8: layer time shares", "Figure 7: activation memory", "Figure 1: memory per GPU"]
    assert "CPU reference runs: times" in names and "CPU reference runs: activations per layer" in names
    summary = draw("parity", data, tmp_path / "parity.png")
    assert [ax["title"] for ax in summary["axes"]] == names
    for ax, s in zip(summary["axes"], data["sets"]):
        assert ax["legend"][0].startswith(f"{len(s['points'])} points, mean |error| ")
        assert ax["legend"][1] == "predicted = measured"
        assert ax["xlabel"] == f"measured ({s['unit']})" and ax["ylabel"] == f"predicted ({s['unit']})"
    assert summary["axes"][0]["legend"][2] == "±8% (the tests' tolerance)"
    assert "Korthikanti 2022 on DGX A100 80GB, sequence 2,048, bf16, unfused attention" in summary["title"]
    # the reference loop's activation bytes are exact by construction
    cpu = data["sets"][names.index("CPU reference runs: activations per layer")]
    assert all(p == m for _, p, m in cpu["points"])


def test_parity_draws_every_data_set_a_registry_declares(monkeypatch):
    """Where the repository declares its measured data sets in ``simulator.measure.datasets``, each set the
    Korthikanti panels do not already draw gets a panel of its own."""
    import importlib
    import sys
    import types
    from dataclasses import dataclass

    @dataclass
    class Row:
        label: str
        predicted_s: float
        measured_s: float

    class Role:
        value = "held-out"

    fake = types.ModuleType("simulator.measure.datasets")
    fake.REGISTRY = (types.SimpleNamespace(key="korthikanti2022", title="already drawn", fitted=(), role=Role()),
                     types.SimpleNamespace(key="runs", title="Some runs (8 GPUs)", fitted=(), role=Role()))
    fake.evaluate = lambda ds, profile=None: types.SimpleNamespace(rows=(Row("a", 1.1, 1.0), Row("b", 1.9, 2.0)))
    monkeypatch.setitem(sys.modules, "simulator.measure.datasets", fake)
    monkeypatch.setattr(importlib.import_module("simulator.measure"), "datasets", fake, raising=False)  # where the real one loaded
    sets = fd._parity_data.__wrapped__(None, fd.CPU_VALIDATION)["sets"]
    assert [s["name"] for s in sets].count("Some runs") == 1 and "already drawn" not in [s["name"] for s in sets]
    extra = next(s for s in sets if s["name"] == "Some runs")
    assert extra["points"] == [["a", 1.1, 1.0], ["b", 1.9, 2.0]] and "held-out" in extra["source"]


def test_every_kind_is_drawable_from_a_plan_or_a_search():
    assert set(figures.KINDS) == set(figures.PLAN_KINDS) | set(figures.SEARCH_KINDS) | {"parity", "moe-ep"}
    assert set(figures.KINDS) == set(__import__("simulator.outputs.plots", fromlist=["FIGURES"]).FIGURES)


def test_pareto_says_its_best_plan_is_ranked_as_the_search_ranks(tmp_path, searched):
    """The star need not be the highest simulated point: its legend says what the search ranked by."""
    from simulator.outputs.plots import RANKED_BY

    req, result = searched
    data = fd.pareto_data(result, req)
    assert data["rank_by"] == req.rank_by.value == "upper"
    for rank_by in ("upper", "point", "expected-days"):
        legend = draw("pareto", {**data, "rank_by": rank_by}, tmp_path / "p.png")["axes"][0]["legend"]
        star = next(text for text in legend if text.startswith("best plan"))
        assert f"plans ranked by {RANKED_BY[rank_by]}" in star
    assert "slow end of their band" in RANKED_BY["upper"]
