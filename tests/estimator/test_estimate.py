"""Invariants of the time model and the estimate (physics, not snapshots)."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.cli.plan_cmd import plan_json
from simulator.estimator.prediction import estimate, model_flops_per_sequence, simulate_job
from simulator.graph.layers import OpKind, ordered_ops, transformer_layer
from simulator.spec.catalog import PRESETS
from simulator.spec.hardware import load_cluster
from simulator.spec.plan import Job, ParallelPlan, RecomputePolicy

CLUSTER = load_cluster("dgx-a100-80gb")


def job(model="gpt3-1.3b", **plan) -> Job:
    plan.setdefault("global_batch_size", plan.get("micro_batch_size", 1) * plan.get("data_parallel_size", 1)
                    * plan.get("pipeline_parallel_size", 1) * 2)
    return Job(model=PRESETS[model], cluster=CLUSTER, plan=ParallelPlan(**plan))


def test_model_flops_are_korthikanti_eq7():
    m = PRESETS["gpt3-175b"]
    B, L, s, h, v = 1, m.num_layers, m.seq_length, m.hidden_size, m.vocab_size
    eq7 = 72 * B * L * s * h * h * (1 + s / (6 * h) + v / (12 * h * L))
    assert model_flops_per_sequence(job("gpt3-175b", tensor_parallel_size=8)) == pytest.approx(eq7, rel=1e-12)


def test_tp1_has_no_tensor_parallel_communication():
    j = job(tensor_parallel_size=1)
    layer = transformer_layer(j.model, j.plan)
    assert not [op for g in (layer.forward, layer.backward) for op in ordered_ops(g) if op.kind is OpKind.collective]
    assert estimate(j).breakdown.tp_communication_s == 0.0


def test_breakdown_sums_to_the_iteration():
    e = estimate(job("gpt3-13b", tensor_parallel_size=4, pipeline_parallel_size=4, data_parallel_size=2,
                     virtual_pipeline_stages=2, sequence_parallel=True, global_batch_size=32,
                     recompute=RecomputePolicy(granularity="selective")))
    assert sum(e.breakdown.model_dump().values()) == pytest.approx(e.iteration_time_s, rel=1e-9)
    assert 0 < e.mfu <= e.hfu < 1


plans = st.fixed_dictionaries({
    "tensor_parallel_size": st.sampled_from([1, 2, 4, 8]),
    "pipeline_parallel_size": st.sampled_from([1, 2, 4]),
    "data_parallel_size": st.sampled_from([1, 2]),
    "micro_batch_size": st.sampled_from([1, 2]),
    "use_distributed_optimizer": st.booleans(),
    "overlap_grad_reduce": st.booleans(),
})


@given(plans, st.booleans())
@settings(max_examples=25, deadline=None)
def test_never_faster_than_compute_at_peak_and_recompute_never_helps(plan, sp):
    sp = sp and plan["tensor_parallel_size"] > 1
    times = []
    for granularity in ("none", "selective", "full"):
        j = job(sequence_parallel=sp, recompute=RecomputePolicy(granularity=granularity), **plan)
        e = estimate(j)
        per_gpu_flops = e.hardware_flops_per_iteration / j.num_gpus
        assert e.iteration_time_s >= per_gpu_flops / (CLUSTER.gpu.peak_tflops.bf16 * 1e12)
        times.append(e.iteration_time_s)
    assert times[0] <= times[1] <= times[2]


def test_same_input_gives_byte_identical_json():
    j = job("gpt3-6.7b", tensor_parallel_size=2, pipeline_parallel_size=4, virtual_pipeline_stages=2,
            global_batch_size=16)
    a = json.dumps(plan_json(j, estimate(j)), sort_keys=True)
    b = json.dumps(plan_json(j, estimate(j)), sort_keys=True)
    assert a == b


def test_a_plan_that_does_not_fit_still_gets_its_time():
    e = estimate(job("gpt3-175b", tensor_parallel_size=8, pipeline_parallel_size=2, global_batch_size=4))
    assert e.iteration_time_s > 0
    assert not e.memory.fits
    assert e.memory.overflowing_stage is not None


def test_overlapping_the_gradient_reduction_and_the_sends_never_hurts():
    base = dict(model="gpt3-13b", tensor_parallel_size=2, pipeline_parallel_size=4, data_parallel_size=4,
                virtual_pipeline_stages=2, global_batch_size=64)
    plain = estimate(job(**base)).iteration_time_s
    assert estimate(job(**base, overlap_grad_reduce=True)).iteration_time_s <= plain
    assert estimate(job(**base, overlap_p2p_comm=True)).iteration_time_s <= plain


def test_days_follow_from_tokens_per_second():
    e = estimate(job(tensor_parallel_size=2), tokens=1e9)
    assert e.training_days == pytest.approx(1e9 / e.tokens_per_s / 86400)
    assert e.gpu_hours == pytest.approx(e.training_days * 24 * 2)


def test_trace_has_one_process_per_stage_and_a_thread_per_stream(tmp_path):
    from simulator.outputs.trace import write_trace

    j = job(tensor_parallel_size=2, pipeline_parallel_size=4, virtual_pipeline_stages=2, global_batch_size=8)
    sim = simulate_job(j, record=True)
    path = tmp_path / "trace.json"
    write_trace(sim, j, path)
    events = json.loads(path.read_text())["traceEvents"]
    assert {e["pid"] for e in events} == set(range(4))
    assert {e["args"]["name"] for e in events if e.get("name") == "thread_name"} >= {"compute", "tp_comm"}
    assert any(e.get("cat") == "op" and e["name"].endswith("qkv") for e in events)


def test_given_layer_times_replace_the_cost_model_and_longer_layers_take_longer():
    j = job("gpt3-13b", tensor_parallel_size=4, pipeline_parallel_size=4, virtual_pipeline_stages=2,
            sequence_parallel=True, global_batch_size=16, recompute=RecomputePolicy(granularity="selective"))
    own = simulate_job(j)
    lt = own.layer
    same = simulate_job(j, layers=lt.with_durations(lt.forward_s, lt.backward_s, lt.recompute_s))
    assert same.estimate.iteration_time_s == pytest.approx(own.estimate.iteration_time_s, rel=1e-12)
    slower = simulate_job(j, layers=lt.with_durations(lt.forward_s * 1.1, lt.backward_s * 1.1, lt.recompute_s * 1.1))
    assert own.estimate.iteration_time_s < slower.estimate.iteration_time_s < 1.1 * own.estimate.iteration_time_s


def test_data_parallel_gradients_are_scaled_once_before_they_are_reduced():
    """Megatron's DDP multiplies each bucket by 1/DP in place (one read and one write of every gradient) before
    reducing it: the stage's reduction is the collectives plus that pass, and a job without DP has neither."""
    from simulator.cost import CostModel
    from simulator.cost.profile import default_profile
    from simulator.graph.layers import CollectiveKind, Op
    from simulator.graph.parameters import stage_parameters
    from simulator.schedule.stage_work import _dp_time, stage_communication

    for dp in (1, 4):
        j = job(data_parallel_size=dp)
        cost = CostModel(CLUSTER, default_profile(CLUSTER.gpu.name), j.plan.precision)
        comm = stage_communication(j, cost, 0)
        params = stage_parameters(j, 0)
        nb = comm.buckets[0]
        collectives = nb * (_dp_time(cost, j, CollectiveKind.all_reduce, params * j.plan.grad_bytes / nb)
                            + _dp_time(cost, j, CollectiveKind.all_reduce, 0.0, expert=True))
        scaling = cost.op_time_s(Op("gradient_scaling", OpKind.elementwise, bytes_moved=2 * params * j.plan.grad_bytes))
        assert scaling > 0
        assert comm.reduce_s[0] == pytest.approx(collectives + (scaling if dp > 1 else 0.0), rel=1e-12)


@pytest.mark.parametrize("where", [("iteration_time_s",), ("breakdown", "compute_s"), ("layer", "forward_s"),
                                   ("tokens_per_s",)])
@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_an_estimate_with_a_number_that_is_not_finite_is_never_made_nor_printed(where, value):
    """A NaN or an infinity is a bug upstream (a 0/0, an empty GEMM), never an answer: the Estimate refuses to
    hold one, and the text answer refuses to print one that reached it past validation (a copy)."""
    from pydantic import ValidationError

    from simulator.cli.plan_cmd import render
    from simulator.estimator.prediction import Estimate

    j = job(tensor_parallel_size=2)
    est = simulate_job(j).estimate
    doc = est.model_dump()
    node = doc
    for key in where[:-1]:
        node = node[key]
    node[where[-1]] = value
    with pytest.raises(ValidationError):
        Estimate.model_validate(doc)
    render(j, est)  # a finite answer prints
    with pytest.raises(AssertionError, match="not finite"):
        render(j, est.model_copy(update={"iteration_time_s_high": value}))


@pytest.mark.parametrize("pp,vpp", [(1, 1), (2, 1), (4, 2)])
@pytest.mark.parametrize("vocab", [32768, 262144])
def test_megatron_fsdp_gathers_the_root_once_a_step_and_exposes_one_layer_at_each_end(pp, vpp, vocab):
    """Megatron-FSDP gathers a micro-batch's first layer before any forward compute and reduce-scatters the
    first layer's and the root's gradients after all the backward; the root unit (embeddings, output layer)
    stays gathered from the step's first forward to its gradient sync, so its gather is paid once a step,
    not once a micro-batch: it grows with the vocabulary and leaves every micro-batch's forward alone.
    What a micro-batch exposes never exceeds what runs."""
    from simulator.cost import CostModel
    from simulator.cost.profile import default_profile
    from simulator.schedule.stage_work import stage_communication

    def job(v: int) -> Job:
        model = PRESETS["llama3-8b"].model_copy(update={"vocab_size": v})
        plan = ParallelPlan(data_parallel_size=16 // pp, pipeline_parallel_size=pp, virtual_pipeline_stages=vpp,
                            global_batch_size=64, data_parallel_sharding_strategy="optim_grads_params")
        return Job(model=model, cluster=CLUSTER, plan=plan)

    j = job(vocab)
    cost = CostModel(CLUSTER, default_profile(CLUSTER.gpu.name), j.plan.precision)
    for s in range(pp):
        comm = stage_communication(j, cost, s)
        ends = s in (0, pp - 1)
        assert (comm.optimizer.gather_s > 0) == ends  # the root lives on the first and last stages
        for c, f in enumerate(comm.fsdp_s):
            assert 0 < f.first_s <= f.forward_s and 0 < f.edges_s <= f.backward_s
            assert f.first_s == pytest.approx(f.forward_s / j.chunk_layers[s][c], rel=1e-9)  # one layer
    if vocab == 262144:  # 1.07B parameters a word table against 0.22B a layer
        small, big = (stage_communication(job(v), cost, 0) for v in (32768, 262144))
        layer = big.fsdp_s[0].first_s
        assert big.optimizer.gather_s > 2 * layer and big.optimizer.gather_s > 2 * small.optimizer.gather_s
        assert big.fsdp_s[0].first_s == pytest.approx(small.fsdp_s[0].first_s, rel=1e-9)
        assert big.fsdp_s[0].edges_s > small.fsdp_s[0].edges_s  # the root's reduce-scatter stays a micro-batch's
