"""The report's two published Llama 3 405B layouts: each trained on 80 GB H100s; as Megatron's defaults run
it, it does not fit, and the setting of its own run that the report names makes it fit. The numbers the
report states are the memory model's and `simulator memory` with the flags it prints gives the same."""

from __future__ import annotations

import json
import shlex

import pytest
from click.testing import CliRunner

from simulator.cli import cli
from simulator.estimator.memory import memory_plan
from simulator.outputs.report_layouts import (
    CLUSTER,
    LAYOUTS,
    MODEL,
    layout_job,
    layouts_data,
    layouts_lines,
    nodes_reading_job,
)
from simulator.spec.units import gib


@pytest.fixture(scope="module")
def data():
    return layouts_data()


@pytest.mark.parametrize("index", range(len(LAYOUTS)))
def test_the_runs_setting_makes_the_published_layout_fit(index):
    lay = LAYOUTS[index]
    published, with_setting = memory_plan(layout_job(lay)), memory_plan(layout_job(lay, True))
    assert layout_job(lay).num_gpus == lay.gpus
    assert not published.fits and with_setting.fits
    # the setting moves the gradients alone: the activations the schedule holds are the same
    for a, b in zip(published.stages, with_setting.stages):
        assert b.gradients_bytes < a.gradients_bytes
        assert b.activations_bytes == a.activations_bytes and b.weights_bytes == a.weights_bytes


def test_the_report_states_the_memory_models_numbers(data):
    text = "\n".join(layouts_lines(data))
    for lay, d in zip(LAYOUTS, data["layouts"]):
        published, with_setting = memory_plan(layout_job(lay)), memory_plan(layout_job(lay, True))
        assert f"{gib(published.peak_bytes):.1f} (stage {published.overflowing_stage})" in text
        assert f"from {gib(published.peak_bytes):.1f} to {gib(with_setting.peak_bytes):.1f} GiB" in text
        assert lay.setting in text and lay.name in text
    # on eight times the GPUs the distributed optimizer's shard of the optimizer state is eight times smaller
    nodes = memory_plan(nodes_reading_job())
    small, large = memory_plan(layout_job(LAYOUTS[1])).stages[0], nodes.stages[0]
    assert large.optimizer_bytes * 8 == pytest.approx(small.optimizer_bytes, rel=1e-6)
    assert (f"the layout {'fits' if nodes.fits else 'does not fit'} with fp32 gradients, at "
            f"{gib(nodes.peak_bytes):.1f} GiB") in text


@pytest.mark.parametrize("index", range(len(LAYOUTS)))
def test_the_printed_commands_reproduce_the_rows(data, index):
    lay = LAYOUTS[index]
    base = ["memory", "--model", MODEL, "--cluster", CLUSTER, *shlex.split(lay.flags), "--json"]
    for extra, key in (([], "published"), (shlex.split(lay.setting_flags), "with_setting")):
        result = CliRunner().invoke(cli, base + extra)
        assert result.exit_code == 0, result.output
        doc = json.loads(result.output)
        assert gib(doc["peak_bytes"]) == pytest.approx(data["layouts"][index][key]["peak_gib"])
        assert doc["fits"] == data["layouts"][index][key]["fits"]
