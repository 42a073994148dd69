"""calibration/residuals.py states what the model misses in the units of a mechanism: a time it is told was
missed per all-reduce, or per iteration, comes back as that time."""

import dataclasses
import re
from collections import defaultdict

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


def test_the_layer_sweep_recovers_the_terms_a_time_is_made_of():
    """Times built as a0 + a1 m + b0 L + b1 L m from each run's own layers L and micro-batches m come back as those
    four terms, for every (hidden size, TP, micro-batch) whose runs sweep both."""
    a0, a1, b0, b1 = 0.004, 0.006, 0.0009, 0.0031  # s
    rows = [(run, a0 + a1 * residuals._micro_batches(run.job) + b0 * run.job.model.num_layers
             + b1 * run.job.model.num_layers * residuals._micro_batches(run.job)) for run in VTRAIN_SINGLE_NODE.runs()]
    table = residuals.layer_sweep(rows)
    assert table and all(key.startswith("h") for key in table)
    assert {"h1024 tp8 mbs1", "h2048 tp1 mbs4"} <= set(table)
    for terms in table.values():
        for name, seconds in zip(residuals.SWEEP_TERMS, (a0, a1, b0, b1)):
            assert terms[name]["predicted"] == pytest.approx(seconds * 1e3, rel=1e-6)


def test_the_layer_sweeps_shares_are_what_each_term_adds_to_the_measured_time():
    """Measured times that are exactly a0 + a1 m + b0 L + b1 L m give each term its share of them: the shares add
    up to the whole, and the per-layer-per-micro-batch term's is b1 L m over the time, averaged over the runs."""
    a0, a1, b0, b1 = 0.004, 0.006, 0.0009, 0.0031
    runs = [r for r in VTRAIN_SINGLE_NODE.runs() if r.job.plan.pipeline_parallel_size == 1
            and r.job.plan.tensor_parallel_size == 2 and r.job.model.hidden_size == 1024
            and r.job.plan.micro_batch_size == 1]

    def time(run):
        m, L = residuals._micro_batches(run.job), run.job.model.num_layers
        return a0 + a1 * m + b0 * L + b1 * L * m

    rows = [(dataclasses.replace(run, measured_s=time(run)), time(run)) for run in runs]
    terms = residuals.layer_sweep(rows)["h1024 tp2 mbs1"]
    assert sum(terms[name]["share_of_measured"] for name in residuals.SWEEP_TERMS) == pytest.approx(1.0)
    by_dp = defaultdict(list)
    for run in runs:
        m, L = residuals._micro_batches(run.job), run.job.model.num_layers
        by_dp[run.job.plan.data_parallel_size].append(b1 * L * m / time(run))
    expected = sum(sum(v) / len(v) for v in by_dp.values()) / len(by_dp)
    assert terms["per_layer_per_micro_batch_ms"]["share_of_measured"] == pytest.approx(expected)


def test_the_layer_sweep_leaves_out_what_sweeps_one_dimension_only():
    """A group whose runs all have the same number of micro-batches cannot split a layer's time per micro-batch from
    its time per iteration: it is left out, not fitted by a rank-deficient design."""
    runs = [r for r in VTRAIN_SINGLE_NODE.runs() if r.job.plan.pipeline_parallel_size == 1]
    one_m = [r for r in runs if r.job.plan.micro_batch_size == 8]
    assert one_m and len({residuals._micro_batches(r.job) for r in one_m
                          if r.job.plan.tensor_parallel_size == 8}) == 1
    table = residuals.layer_sweep([(r, r.measured_s) for r in one_m if r.job.plan.tensor_parallel_size == 8])
    assert table == {}


def test_the_compute_floor_never_exceeds_the_models_own_layer_time():
    """The floor takes each tensor-core op at the ceiling no GEMM of the model passes and leaves out the host and
    the collectives, so the model's own time for one layer and micro-batch (the predicted b1 of the sweep) can
    never be below it; a measurement is flagged exactly where it lies below the floor."""
    from simulator.estimator.prediction import estimate

    rows = [(run, estimate(run.job).iteration_time_s) for run in VTRAIN_SINGLE_NODE.runs()
            if run.job.plan.pipeline_parallel_size == 1 and run.job.plan.tensor_parallel_size in (1, 8)]
    sweep = residuals.layer_sweep(rows)
    floors = residuals.compute_floors(rows, sweep)
    assert floors and set(floors) == set(sweep)
    for key, f in floors.items():
        assert 0 < f["compute_floor_ms"] <= f["predicted_ms"] * (1 + 1e-6), key
        assert f["measured_below_floor"] == (f["measured_ms"] < f["compute_floor_ms"])
