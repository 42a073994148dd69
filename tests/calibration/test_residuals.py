"""calibration/residuals.py states what the model misses in the units of a mechanism: a time it is told was
missed per all-reduce, or per iteration, comes back as that time."""

import re

import pytest

from calibration import residuals
from simulator.measure.datasets import VTRAIN_MULTI_NODE, VTRAIN_SINGLE_NODE


def test_a_fixed_time_per_all_reduce_is_found_as_that_time():
    runs = [r for r in VTRAIN_SINGLE_NODE.runs() if r.job.plan.tensor_parallel_size == 8][:12]
    missing_s = 150e-6
    rows = []
    for run in runs:
        p = run.job.plan
        calls = run.job.model.num_layers * p.global_batch_size // p.micro_batch_size * residuals.ALL_REDUCES_PER_LAYER
        rows.append((run, run.measured_s - missing_s * calls))
    table = residuals.single_node(rows)["tp8_missing_us_per_all_reduce"]
    assert table and sum(s["runs"] for s in table.values()) == len(runs)
    for stats in table.values():
        assert stats["min"] == pytest.approx(150.0) and stats["max"] == pytest.approx(150.0)


def test_errors_are_signed_as_predicted_over_measured():
    runs = VTRAIN_SINGLE_NODE.runs()[:40]
    table = residuals.single_node([(run, 1.1 * run.measured_s) for run in runs])
    for key in ("signed_error_by_tp_and_micro_batch", "signed_error_by_attention_batches"):
        assert sum(s["runs"] for s in table[key].values()) == len(runs)
        assert all(s["mean"] == pytest.approx(0.1) for s in table[key].values())


def test_missing_time_per_iteration_counts_single_stage_runs_only():
    runs = VTRAIN_MULTI_NODE.runs()
    table = residuals.multi_node([(run, run.measured_s - 0.25) for run in runs])
    per_key = table["missing_s_per_iteration_single_stage"]
    assert sum(s["runs"] for s in per_key.values()) == sum(r.job.plan.pipeline_parallel_size == 1 for r in runs)
    assert all(s["mean"] == pytest.approx(0.25) for s in per_key.values())
    # ordered by the numbers in the key: TP 2 before TP 16 for the same hidden size
    keys = list(per_key)
    assert keys == sorted(keys, key=lambda k: [int(n) for n in re.findall(r"\d+", k)])
