"""Mixture-of-experts layers in the time and memory model: what the physics says must hold."""

from __future__ import annotations

import pytest

from simulator.estimator.memory import memory_plan
from simulator.estimator.prediction import estimate, model_flops_per_sequence
from simulator.graph.parameters import stage_expert_parameters, stage_parameters
from simulator.schedule.timing import layer_times
from simulator.spec.catalog import PRESETS
from simulator.spec.hardware import load_cluster
from simulator.spec.model import ModelSpec
from simulator.spec.plan import Job, ParallelPlan

H100 = load_cluster("dgx-h100")
MIXTRAL = PRESETS["mixtral-8x7b"]


def job(model: ModelSpec = MIXTRAL, **plan) -> Job:
    fields = dict(pipeline_parallel_size=4, data_parallel_size=16, global_batch_size=256, micro_batch_size=1,
                  recompute={"granularity": "full"}, use_distributed_optimizer=True,
                  moe_token_dispatcher_type="alltoall", moe_grouped_gemm=True)
    fields.update(plan)
    return Job(model=model, cluster=H100, plan=ParallelPlan(**fields))


def small_moe(**fields) -> ModelSpec:
    base = dict(name="small-moe", num_layers=8, hidden_size=1024, num_attention_heads=16, ffn_hidden_size=2048,
                num_experts=4, moe_router_topk=2, seq_length=2048, add_bias_linear=False, swiglu=True,
                normalization="RMSNorm", position_embedding_type="rope")
    base.update(fields)
    return ModelSpec(**base)


def test_a_model_without_moe_layers_is_priced_as_the_dense_model():
    dense = small_moe(num_experts=None)
    none_moe = small_moe(moe_layer_freq=(0,) * 8)
    a = estimate(job(dense, data_parallel_size=8, global_batch_size=64))
    b = estimate(job(none_moe, data_parallel_size=8, global_batch_size=64))
    assert b.iteration_time_s == pytest.approx(a.iteration_time_s, rel=1e-12)
    assert b.memory.peak_bytes == a.memory.peak_bytes


def test_every_parameter_is_held_by_exactly_one_rank_of_a_replica():
    """With one pipeline stage and TP 1, a rank holds the dense parameters and 1/EP of the experts."""
    for ep in (1, 2, 4, 8):
        j = job(pipeline_parallel_size=1, data_parallel_size=64, expert_model_parallel_size=ep, global_batch_size=64)
        experts = stage_expert_parameters(j, 0)
        assert stage_parameters(j, 0) - experts + ep * experts == MIXTRAL.num_parameters()


def test_expert_state_shrinks_with_ep_and_the_sharded_optimizer_state_does_not():
    """EP splits the expert weights and gradients; the distributed optimizer already shards every
    expert's state over all the stage's ranks (EDP x EP = DP), so its total per rank stays put."""
    stages = [memory_plan(job(expert_model_parallel_size=ep)).stages[0] for ep in (1, 2, 4, 8)]
    weights = [s.weights_bytes for s in stages]
    assert weights == sorted(weights, reverse=True)
    for a, b in zip(stages, stages[1:]):
        assert b.optimizer_bytes == pytest.approx(a.optimizer_bytes, rel=1e-3)


def test_model_flops_count_the_active_parameters():
    """Routing every token to all its experts (top-k = experts) costs what a dense MLP k times as wide
    costs, plus the router's GEMM."""
    moe = small_moe(num_experts=2, moe_router_topk=2, moe_ffn_hidden_size=1024)
    dense = small_moe(num_experts=None, ffn_hidden_size=2048)
    s, h = moe.seq_length, moe.hidden_size
    router = 3 * 2 * s * h * moe.num_experts * moe.num_moe_layers
    assert model_flops_per_sequence(job(moe)) == pytest.approx(model_flops_per_sequence(job(dense)) + router)
    # eight experts, still two per token: only the router widens
    sparse = small_moe(num_experts=8, moe_router_topk=2, moe_ffn_hidden_size=1024)
    assert model_flops_per_sequence(job(sparse)) == pytest.approx(model_flops_per_sequence(job(dense)) + 4 * router)


def test_tokens_cross_the_ep_group_and_the_experts_wait_for_them():
    one = estimate(job(expert_model_parallel_size=1))
    assert one.expert_dispatch_s == 0.0
    shares = [estimate(job(expert_model_parallel_size=ep)).expert_dispatch_s for ep in (2, 4, 8)]
    assert all(x > 0 for x in shares)
    assert shares == sorted(shares)  # more of each token's copies leave the rank


def test_an_ep_group_across_nodes_pays_the_fabric():
    """EP 16 with ETP 1 spans two 8-GPU nodes: its all-to-alls cross InfiniBand, EP 8 stays on NVLink."""
    big = small_moe(num_experts=16, moe_router_topk=2)
    inside = estimate(job(big, expert_model_parallel_size=8)).expert_dispatch_s
    across = estimate(job(big, expert_model_parallel_size=16)).expert_dispatch_s
    assert across > 2 * inside


def test_the_host_waits_for_the_token_counts_once_per_moe_forward():
    j = job(expert_model_parallel_size=8)
    moe, dense = layer_times(j, moe=True), layer_times(job(small_moe(num_experts=None)))
    assert moe.forward.host_sync and not moe.backward_only.host_sync
    assert moe.backward.host_sync  # full recompute replays the forward, counts included
    assert not dense.forward.host_sync
    assert moe.forward.steady_s == moe.forward.cold_s >= moe.forward.duration_s


def test_planning_for_imbalance_costs_time_and_memory():
    balanced = estimate(job(expert_model_parallel_size=8, recompute={"granularity": "none"}))
    busy = estimate(job(MIXTRAL.model_copy(update={"moe_load_imbalance": 1.5}), expert_model_parallel_size=8,
                        recompute={"granularity": "none"}))
    assert busy.moe_load_imbalance == 1.5 and balanced.moe_load_imbalance == 1.0
    assert busy.iteration_time_s > balanced.iteration_time_s
    assert busy.memory.stages[0].activations_bytes > balanced.memory.stages[0].activations_bytes


def test_dense_first_layers_stay_on_the_first_stage():
    model = small_moe(moe_layer_freq=(0, 0, 1, 1, 1, 1, 1, 1))
    j = job(model, pipeline_parallel_size=2, data_parallel_size=8, global_batch_size=64)
    assert j.moe_layers_per_stage == (2, 4)
    assert sum(j.moe_layers_per_stage) == model.num_moe_layers
    assert j.chunk_runs(0, 0) == ((False, 2), (True, 2))
    interleaved = job(model, pipeline_parallel_size=2, virtual_pipeline_stages=2, data_parallel_size=8,
                      global_batch_size=64)
    # chunk-major: stage 0 holds layers 0-1 and 4-5, stage 1 layers 2-3 and 6-7
    assert interleaved.layer_runs == ((((False, 2),), ((True, 2),)), (((True, 2),), ((True, 2),)))


def test_an_all_to_all_across_nodes_is_bound_by_the_nics():
    """What leaves the node goes through the NICs the node's GPUs share: no faster than that line rate,
    whatever the ring bandwidth over NVLink and the rails would allow."""
    from simulator.cost import Group
    from simulator.graph.ops import CollectiveKind
    from simulator.schedule.timing import cost_model_for

    cost = cost_model_for(job(), None)
    nbytes = 256 << 20
    for size, stride in ((16, 1), (64, 1), (8, 8), (8, 2)):
        nodes = -(-size * stride // H100.gpus_per_node)
        remote = nbytes * (size - size // nodes) / size
        t = cost.collective_time_s(CollectiveKind.all_to_all, nbytes, Group(size, stride))
        assert t >= remote / (H100.nic_bandwidth_gbps_per_gpu * 1e9)
    inside = cost.collective_time_s(CollectiveKind.all_to_all, nbytes, Group(8, 1))
    assert inside < remote / (H100.nic_bandwidth_gbps_per_gpu * 1e9)
