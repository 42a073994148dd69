"""The time model against Korthikanti et al. 2022, Tables 4 and 5 (DGX A100 80GB, published profile).

Nothing in the profile was set from these tables: they are what the model is checked against.
"""

import pytest

from simulator.measure import korthikanti as k


@pytest.fixture(scope="module")
def table5():
    return k.table5()


def test_table5_each_iteration_time_within_8_percent(table5):
    assert len(table5) == 8
    for c in table5:
        assert abs(c.relative_error) <= 0.08, f"{c.label}: {c.predicted:.2f} s vs {c.published} s"


def test_table5_mean_error_at_most_4_percent(table5):
    assert k.mean_abs_error(table5) <= 0.04


def test_data_parallel_point_within_8_percent_and_the_mean_with_it_at_most_4():
    # The run's data-parallel step cost 2.2x what the model gives (reports/README.md section 2);
    # the point passes on the rest of the iteration, with little room.
    comparisons = k.table5() + [k.data_parallel_point()]
    assert abs(comparisons[-1].relative_error) <= 0.08
    assert k.mean_abs_error(comparisons) <= 0.04


def test_data_parallel_costs_time():
    """Adding 8-way data parallelism (with no overlap, as the paper ran it) can only slow the 530B iteration,
    and lowers its MFU (the same FLOPs per GPU take longer)."""
    assert all(step.predicted > 0 for step in k.data_parallel_steps())
    mfu = {c.label: c.predicted for c in k.table5_mfu()}
    assert k.data_parallel_mfu()[0].predicted < mfu["mt-nlg-530b MFU"]


def test_table4_each_phase_within_10_percent_and_the_order_holds():
    rows = k.table4()
    for fwd, bwd in rows:
        assert abs(fwd.relative_error) <= 0.10, fwd.label
        assert abs(bwd.relative_error) <= 0.10, bwd.label
    predicted = [f.predicted + b.predicted for f, b in rows]
    published = [f.published + b.published for f, b in rows]
    assert sorted(range(5), key=predicted.__getitem__) == sorted(range(5), key=published.__getitem__)


def test_selective_recompute_overhead_is_a_few_percent_and_full_about_a_third():
    """Section 6.2: full recompute costs ~39% of a 22B layer, selective ~7% (4% with SP)."""
    (base_f, base_b), _, (full_f, full_b), (sel_f, sel_b), _ = k.table4()
    base = base_f.predicted + base_b.predicted
    assert 0.30 <= (full_f.predicted + full_b.predicted) / base - 1 <= 0.45
    assert 0.0 < (sel_f.predicted + sel_b.predicted) / base - 1 <= 0.10


def test_figure8_digitized_rows_add_up_to_their_totals():
    # the table's last column is the bar's total; the reader takes the three segments
    shares = k.figure8_digitized()
    assert len(shares) == 8
    totals = {("megatron-22b", False): 140.7, ("megatron-22b", True): 104.2, ("gpt3-175b", False): 138.5,
              ("gpt3-175b", True): 103.4, ("mt-nlg-530b", False): 135.3, ("mt-nlg-530b", True): 101.6,
              ("megatron-1t", False): 136.4, ("megatron-1t", True): 102.7}
    for key, total in totals.items():
        assert sum(shares[key]) == pytest.approx(total, abs=0.15), key


def test_with_the_paper_layer_the_unpipelined_22b_rows_come_within_3_percent():
    """22B runs one stage and one micro-batch: with the layer the paper measured (Table 4's baseline, the
    same 22B configuration, in Figure 8's shares for each row's policy), what is left is the embedding,
    the output layer and the optimizer step, which the model must then get right. (The model's own
    layer is held to Table 4 above.)"""
    rows = [r for r in k.pipeline_residuals(measured_22b_layer=True) if r.label.startswith("megatron-22b")]
    assert len(rows) == 2
    for r in rows:
        assert abs(r.with_published_layer / r.published - 1) <= 0.03, r.label
