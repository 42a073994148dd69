"""A collective the group issues with only memory-bound ops since its previous one finds the ranks still together:
it pays the share of its in-loop time a call alone takes, where the profile measured that share (gloo on a CPU),
and its in-loop time where it did not (NCCL's links, timed back to back)."""

from __future__ import annotations

from pathlib import Path

import pytest

from simulator.cost.profile import default_profile
from simulator.graph.layers import LayerKey, OpKind, _output_extras, transformer_layer
from simulator.measure.calibrate import fit_profile, read_raw
from simulator.measure.datasets import CPU_REFERENCE
from simulator.schedule.timing import _schedule, cost_model_for, play

RAW = Path(__file__).resolve().parents[2] / "reports" / "cpu-validation" / "cpu-profile-raw.json"


@pytest.fixture(scope="module")
def runs():
    return {run.label: run for run in CPU_REFERENCE.runs()}


@pytest.fixture(scope="module")
def measured():
    """The committed CPU measurement as a profile: its link has each kind's share alone."""
    return fit_profile(read_raw(RAW)).profile


def _together(graph) -> dict[str, bool]:
    return {op.name: together for op, _, _, _, together in _schedule(graph) if op.kind is OpKind.collective}


def test_sequence_parallel_all_gathers_follow_the_reduce_scatter_and_nothing_else_does(runs):
    sp = runs["tp2sp-selective"].job
    forward = _together(transformer_layer(sp.model, sp.plan).forward)
    # before each all-gather: the reduce-scatter, then a dropout-add and a layer norm (the first one's, the previous
    # layer's); before each reduce-scatter, the block's GEMMs
    assert forward == {name: "all_gather" in name for name in forward} and len(forward) == 4
    backward = _together(transformer_layer(sp.model, sp.plan).backward)
    assert backward and not any(backward.values())  # a GEMM lies before every backward collective
    tp = runs["tp2"].job
    assert not any(_together(transformer_layer(tp.model, tp.plan).forward).values())
    # the cross-entropy's reductions after the first: only the loss's elementwise ops since the last one
    loss = _together(_output_extras(tp.model, LayerKey.of(tp.plan)).forward)
    assert loss == {"cross_entropy.max_all_reduce": False, "cross_entropy.target_logit_all_reduce": True,
                    "cross_entropy.sum_exp_all_reduce": True}


def test_a_call_with_the_ranks_together_pays_its_measured_share_alone(runs, measured):
    job = runs["tp2sp-selective"].job
    graph = transformer_layer(job.model, job.plan).forward
    cost = cost_model_for(job, measured)
    unshared = measured.with_update("collectives.network", {"isolated_factors": None}).with_update(
        "collectives.nvlink", {"isolated_factors": None})
    plain = cost_model_for(job, unshared)
    saved = sum(plain.op_time_s(op) - cost.synchronised_op_time_s(op)
                for op, _, _, _, together in _schedule(graph) if together)
    assert saved > 0
    assert play([graph], plain).duration_s - play([graph], cost).duration_s == pytest.approx(saved, rel=1e-9)
    for op, _, _, _, together in _schedule(graph):
        if op.kind is OpKind.collective and not together:
            assert cost.step_op_time_s(op) == pytest.approx(plain.step_op_time_s(op), rel=1e-12)


def test_nccl_links_have_no_wait_to_take_out(runs):
    """A GPU profile's links are nccl-tests' back-to-back timings: a call with the ranks together costs what any
    call costs, so the rule moves no GPU prediction."""
    from simulator.cli.options import job_from_options

    job = job_from_options(model="gpt3-2.7b", cluster="dgx-a100-80gb", gpus=8, tensor_parallel_size=8,
                           micro_batch_size=1, global_batch_size=8, sequence_parallel=True)
    cost = cost_model_for(job, default_profile("A100-SXM4-80GB"))
    ops = [op for op, _, _, _, together in _schedule(transformer_layer(job.model, job.plan).forward) if together]
    assert ops and all(cost.synchronised_op_time_s(op) == cost.op_time_s(op) for op in ops)
