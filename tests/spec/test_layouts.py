"""The layouts teams run today: uneven pipeline splits, context parallelism and sharded data
parallelism, in the plan rules, the model and the search."""

from __future__ import annotations

import pytest

from simulator.estimator.memory import memory_plan
from simulator.estimator.prediction import estimate
from simulator.graph.layers import transformer_layer
from simulator.planner.plan_search import SearchPins, SearchRequest, enumerate_plans, pipeline_splits
from simulator.spec.catalog import PRESETS, load_model
from simulator.spec.hardware import load_cluster
from simulator.spec.layout import RankLayout
from simulator.spec.pipeline_split import chunk_layers
from simulator.spec.plan import Job, ParallelPlan

H100 = load_cluster("dgx-h100")


def test_megatron_splits_llama_405b_over_16_stages_with_lighter_ends():
    # 126 layers: with the embedding and the loss counted as layers, 128 / 16 = 8, so the ends hold 7
    assert chunk_layers(126, 16, account_for_embedding=True, account_for_loss=True) == ((7,),) + ((8,),) * 14 + ((7,),)
    assert chunk_layers(126, 16, first=7, last=7) == ((7,),) + ((8,),) * 14 + ((7,),)
    both = dict(account_for_embedding=True, account_for_loss=True)
    assert chunk_layers(94, 8, 2, **both) == ((5, 6),) + ((6, 6),) * 6 + ((6, 5),)
    with pytest.raises(ValueError, match="cannot share"):
        chunk_layers(126, 16, first=6, last=7)
    with pytest.raises(ValueError, match="does not divide"):
        chunk_layers(126, 16)


@pytest.mark.parametrize("layers,p,v", [(126, 16, 1), (126, 16, 2), (80, 6, 1), (96, 5, 1), (61, 8, 1), (32, 3, 2)])
def test_every_split_the_search_proposes_is_one_megatron_builds(layers, p, v):
    for split in pipeline_splits(layers, p, v):
        stages = chunk_layers(layers, p, v, first=split.get("decoder_first_pipeline_num_layers"),
                              last=split.get("decoder_last_pipeline_num_layers"),
                              account_for_embedding=split.get("account_for_embedding_in_pipeline_split", False),
                              account_for_loss=split.get("account_for_loss_in_pipeline_split", False))
        assert sum(map(sum, stages)) == layers and min(min(s) for s in stages) >= 1
        assert all(len(s) == v for s in stages)


def _405b(seq: int, **plan) -> Job:
    base = dict(tensor_parallel_size=8, pipeline_parallel_size=16, data_parallel_size=128, global_batch_size=2048,
                decoder_first_pipeline_num_layers=7, decoder_last_pipeline_num_layers=7, sequence_parallel=True,
                use_distributed_optimizer=True)
    return Job(model=load_model("llama3-405b", seq), cluster=H100, plan=ParallelPlan(**{**base, **plan}))


def test_llama_405b_as_meta_ran_it_and_at_128k_with_context_parallelism():
    short = _405b(8192)
    assert short.num_gpus == 16384 and short.layers_per_stage[0] == short.layers_per_stage[-1] == 7
    long = _405b(131072, context_parallel_size=16, data_parallel_size=8)
    assert long.num_gpus == 16384
    a, b = estimate(short), estimate(long)
    assert a.iteration_time_s > 0 and b.iteration_time_s > a.iteration_time_s
    # 131,072 tokens over 16 CP ranks keep 8,192 each: the same activations per GPU as the short run
    assert memory_plan(long).stages[0].activations_bytes == memory_plan(short).stages[0].activations_bytes


def test_context_parallelism_splits_every_activation_and_keeps_the_math():
    model = PRESETS["llama3-8b"]
    one = ParallelPlan(tensor_parallel_size=2, sequence_parallel=True, global_batch_size=8)
    for comm in ("p2p", "a2a", "allgather"):
        four = ParallelPlan.model_validate({**one.model_dump(), "context_parallel_size": 4, "cp_comm_type": comm})
        a, b = transformer_layer(model, one), transformer_layer(model, four)
        assert b.activation_bytes("none") * 4 == a.activation_bytes("none"), comm
        flops = [sum(op.flops for op in g.forward_ops()) for g in (a, b)]
        assert flops[1] * 4 == pytest.approx(flops[0], rel=1e-12), comm  # each rank does a quarter of the work


def test_cp_ranks_sit_next_to_tp_ranks_in_the_rank_order():
    layout = RankLayout(tp=2, cp=4, dp=2, pp=2, gpus_per_node=8)
    assert layout.group("cp", 0) == (0, 2, 4, 6) and layout.group("tp", 0) == (0, 1)
    assert layout.within_node("cp") and not layout.within_node("dp")
    assert layout.group("dp", 0) == (0, 8) and layout.group("pp", 0) == (0, 16)


@pytest.mark.parametrize("tp,cp,dp,pp,ep,etp", [(2, 1, 4, 2, 2, None), (2, 1, 4, 1, 4, 1), (1, 2, 4, 2, 8, 1),
                                                (4, 2, 2, 1, 2, 2), (8, 1, 1, 1, 1, None)])
def test_expert_groups_partition_each_stage_as_megatrons_expert_rank_generator(tp, cp, dp, pp, ep, etp):
    layout = RankLayout(tp, cp, dp, pp, 8, ep=ep, etp=etp)
    assert layout.size("etp") * layout.size("ep") * layout.size("edp") == tp * cp * dp
    for dim in ("etp", "ep", "edp"):
        groups = layout.groups(dim)
        assert sorted(r for g in groups for r in g) == list(range(layout.world))  # every rank once
        for g in groups:  # inside one pipeline stage, in rank order
            assert len({layout.coords(r)["pp"] for r in g}) == 1 and list(g) == sorted(g)
    # expert-TP fastest, then EP: with etp = tp an EP group is the ranks of one TP position across DP
    if etp is None and cp == 1:
        assert layout.group("ep", 0) == tuple(i * tp for i in range(ep))
        assert layout.group("etp", 0) == layout.group("tp", 0)


def test_sharding_levels_shard_what_they_say():
    job = lambda level: Job(model=PRESETS["gpt3-13b"], cluster=load_cluster("dgx-a100-80gb"),
                            plan=ParallelPlan(data_parallel_size=8, global_batch_size=8, use_distributed_optimizer=True,
                                              data_parallel_sharding_strategy=level))
    optim, grads, params = (memory_plan(job(level)).stages[0] for level in ("optim", "optim_grads", "optim_grads_params"))
    assert optim.optimizer_bytes == grads.optimizer_bytes == params.optimizer_bytes
    assert grads.gradients_bytes * 8 == pytest.approx(optim.gradients_bytes, rel=1e-6)
    assert params.weights_bytes * 8 == pytest.approx(optim.weights_bytes, rel=1e-6)
    assert params.peak_bytes < grads.peak_bytes < optim.peak_bytes


def test_the_search_space_holds_uneven_splits_and_context_parallelism_for_405b():
    req = SearchRequest(model=load_model("llama3-405b", 8192), cluster=H100, num_gpus=2048, global_batch_size=2048,
                        pins=SearchPins(tensor_parallel_size=8, micro_batch_size=1, sequence_parallel=True,
                                        recompute_granularity="none"))
    plans = list(enumerate_plans(req))
    assert any(p.pipeline_parallel_size == 16 and p.account_for_embedding_in_pipeline_split for p in plans)
    assert any(p.context_parallel_size > 1 for p in plans)
    for plan in plans[::50]:  # each candidate passes every rule when validated in full
        Job(model=req.model, cluster=req.cluster, plan=ParallelPlan.model_validate(plan.model_dump()))


@pytest.mark.parametrize("tp, dp, pp, gpn", [(1, 2, 4, 8), (2, 1, 4, 8), (1, 1, 8, 8), (2, 2, 2, 8), (8, 4, 4, 8),
                                              (2, 8, 4, 8), (1, 16, 2, 8)])
def test_the_embedding_group_pairs_the_first_stage_with_the_last_and_stays_where_they_are(tp, dp, pp, gpn):
    layout = RankLayout(tp=tp, cp=1, dp=dp, pp=pp, gpus_per_node=gpn)
    shape = layout.embedding_group()
    first, last = layout.stage_ranks(0), layout.stage_ranks(pp - 1)
    real = {(a, b) for a, b in zip(first, last)}
    if layout.world <= gpn:  # one node: the costed pairs stay inside it, as the real pairs do
        assert shape.size * shape.stride <= gpn
    else:  # the costed group is the real pairs, rank for rank
        assert shape.size == 2 and {(a, a + shape.stride) for a in first} == real
