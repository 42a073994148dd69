"""The report's Blackwell section: one best plan per (cluster, model), each fitting in its GPU's memory with its
NVLink groups where the cluster's NVLink domain puts them, and a text whose numbers are the data's."""

from __future__ import annotations

import copy
import itertools

import pytest

from simulator.estimator.memory import memory_plan
from simulator.estimator.regime import OUTSIDE_WIDENING, band_table
from simulator.outputs.report import README_ORDER, steps
from simulator.outputs.report_blackwell import (
    CLUSTERS,
    NVL72,
    SCENARIOS,
    BlackwellScenario,
    blackwell_data,
    blackwell_lines,
    step_blackwell,
)
from simulator.planner.plan_search import SearchPins
from simulator.spec.catalog import PRESETS
from simulator.spec.hardware import load_cluster
from simulator.spec.layout import RankLayout
from simulator.spec.plan import Job, ParallelPlan

# small questions with the pipeline and micro-batch pinned, so that the search is seconds: a dense model, and an
# MoE model with experts enough for an EP group past an HGX node
SMALL = (BlackwellScenario("llama3-8b", 32, 32, 1e12), BlackwellScenario("qwen3-30b-a3b", 64, 64, 1e12))
PINS = SearchPins(pipeline_parallel_size=1, micro_batch_size=1)


@pytest.fixture(scope="module")
def data():
    return blackwell_data(SMALL, pins=PINS)


def _job(row) -> Job:
    return Job(model=PRESETS[row["model"]], cluster=load_cluster(row["cluster"]),
               plan=ParallelPlan.model_validate(row["plan"]))


def _check_rows(data, scenarios) -> None:
    rows = data["rows"]
    assert [(r["model"], r["cluster"]) for r in rows] == [(s.model, c) for s in scenarios for c in CLUSTERS]
    for row in rows:
        job = _job(row)
        cluster = job.cluster
        assert row["fits"] and memory_plan(job).fits and row["peak_gib"] <= row["capacity_gib"], row["layout"]
        layout = RankLayout.of(job)
        assert layout.within_nvlink_domain("tp"), row["layout"]  # the search never sends TP over a NIC
        groups = {g["name"]: g for g in row["groups"]}
        tp_cp = groups["TP x CP"]
        assert tp_cp["gpus"] == job.plan.tensor_parallel_size * job.plan.context_parallel_size
        assert tp_cp["in_nvlink_domain"] == layout.within_nvlink_domain("cp")
        if job.model.is_moe:
            etp_ep = groups["ETP x EP"]
            assert etp_ep["gpus"] == layout.size("etp") * job.plan.expert_model_parallel_size
            assert etp_ep["in_nvlink_domain"] == layout.within_nvlink_domain("ep")
        for g in row["groups"]:
            if g["in_nvlink_domain"] and g["gpus"] < job.num_gpus:
                assert cluster.ranks_per_nvlink_domain % g["gpus"] == 0, (row["layout"], g)
        assert row["largest_group"]["gpus"] == max(g["gpus"] for g in row["groups"])


def test_one_best_plan_per_cluster_and_model_fits_with_its_groups_where_nvlink_joins_them(data):
    _check_rows(data, SMALL)
    # the NVL72 lets the MoE model's experts spread past an HGX node and stay on NVLink; on HGX they cannot
    moe = {r["cluster"]: r for r in data["rows"] if r["model"] == "qwen3-30b-a3b"}
    for row in moe.values():
        g = row["largest_group"]
        if row["cluster"] == NVL72 and g["gpus"] > data["hgx_nvlink_gpus"]:
            assert g["in_nvlink_domain"]
        if row["cluster"] != NVL72 and g["gpus"] > data["hgx_nvlink_gpus"]:
            assert not g["in_nvlink_domain"]


def test_the_table_and_the_notes_state_the_datas_numbers(data):
    lines = blackwell_lines(data)
    text = "\n".join(lines)
    for row in data["rows"]:
        line, = [x for x in lines if x.startswith(f"| {row['cluster']} | {row['model']} |")]
        for value in (row["layout"], f"{row['iteration_time_s']:.2f} ({row['iteration_time_s_low']:.2f}-"
                      f"{row['iteration_time_s_high']:.2f})", f"{row['mfu'] * 100:.1f}%",
                      f"{row['training_days']:.1f} ({row['training_days_low']:.1f}-{row['training_days_high']:.1f})",
                      f"{row['peak_gib']:.1f} / {row['capacity_gib']:.1f}", f"{row['largest_group']['gpus']} ("):
            assert value in line, (value, line)
        for reason in row["outside_regime_reasons"]:
            assert reason in line
    nvl = load_cluster(NVL72)
    assert (f"books {nvl.nvlink_segment_nodes} of each rack's {nvl.nvlink_domain_gpus // nvl.gpus_per_node} trays"
            in text)
    assert f"{nvl.ranks_per_nvlink_domain} GPUs a rack" in text
    # no measured run on a Blackwell GPU: every row is outside, with the declared widening
    widest = max(g["half_width"] for g in band_table()["gpus"].values())
    assert all(r["outside_regime_reasons"] and r["half_width"] == pytest.approx(widest * OUTSIDE_WIDENING)
               for r in data["rows"])
    assert f"({widest * 100:.1f}%) times {OUTSIDE_WIDENING:g} on the fast side" in text
    for r in data["rows"]:  # the slow side by the declared rule, a step further for each feature no run had
        assert r["slow_half_width"] == pytest.approx(widest * (1 + (OUTSIDE_WIDENING - 1) * r["outside_steps"]))
        assert r["outside_steps"] == len(r["outside_regime_reasons"])
        assert f"-{r['half_width'] * 100:.0f}% / +{r['slow_half_width'] * 100:.0f}%" in text
    for row in data["rows"]:
        if row["cluster"] == NVL72:
            verdict, = [x for x in lines if x.startswith(f"- {row['model']} on {row['gpus']:,} GB200")]
            for s in (row["screen_s_within_node"], row["screen_s_beyond_node"]):
                if s is not None:
                    assert f"{s:.2f} s" in verdict


def test_the_verdict_on_larger_groups_is_read_from_the_screens(data):
    row = next(r for r in data["rows"] if r["cluster"] == NVL72 and r["model"] == "qwen3-30b-a3b")

    def verdict(within, beyond):
        d = copy.deepcopy(data)
        r = next(x for x in d["rows"] if x["cluster"] == NVL72 and x["model"] == row["model"])
        r["screen_s_within_node"], r["screen_s_beyond_node"] = within, beyond
        return next(x for x in blackwell_lines(d) if x.startswith(f"- {row['model']} on"))

    node = data["hgx_nvlink_gpus"]
    assert "larger groups win, 50.0% faster" in verdict(2.0, 1.0)
    assert f"groups within {node} win, the larger group 100.0% slower" in verdict(1.0, 2.0)
    assert "neither clearly wins" in verdict(1.0, 1.0 + data["screen_margin"] / 2)
    assert f"No plan that fits has a group larger than {node}" in verdict(1.0, None)


def test_a_plan_that_fits_only_at_the_top_of_the_memory_range_is_named(data):
    tight = any(r["fits"] and r["peak_gib"] > r["capacity_gib_low"] for r in data["rows"])
    assert any("Fits only near the top" in x for x in blackwell_lines(data)) == tight
    d = copy.deepcopy(data)
    row = d["rows"][0]
    row["peak_gib"] = (row["capacity_gib_low"] + row["capacity_gib"]) / 2
    text = "\n".join(blackwell_lines(d))
    assert "Fits only near the top" in text
    assert f"a peak of {row['peak_gib']:.1f} GiB" in text and f"over the range's {row['capacity_gib_low']:.1f}" in text


def test_the_report_runs_the_section_after_goodput():
    assert README_ORDER[README_ORDER.index("goodput") + 1] == "blackwell"
    assert "blackwell" in [s.name for s in steps()]


@pytest.mark.slow
def test_the_reports_blackwell_questions():
    """The section as the report computes it (six searches, about a minute on 2 cores)."""
    section = step_blackwell({})
    data = section["data"]["blackwell"]
    _check_rows(data, SCENARIOS)
    assert {(r["model"], r["cluster"]) for r in data["rows"]} == set(itertools.product(
        [s.model for s in SCENARIOS], CLUSTERS))
    assert section["lines"] == blackwell_lines(data)
