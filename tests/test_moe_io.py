"""Mixture-of-experts models at the boundary: the Job's expert rules, the Hugging Face import of MoE configs,
the deepseek-v3-style preset, and the exports and Megatron command lines that carry the experts."""

from __future__ import annotations

import pytest

from simulator._io import build
from simulator.errors import ConfigError
from simulator.hardware import load_cluster
from simulator.model import PRESETS, ModelSpec
from simulator.plan import Job

MIXTRAL = PRESETS["mixtral-8x7b"]
QWEN15 = PRESETS["qwen1.5-moe-a2.7b"]
DENSE = PRESETS["llama3-8b"]


def job(model: ModelSpec, cluster: str = "dgx-h100", **plan) -> Job:
    plan.setdefault("global_batch_size", plan.get("data_parallel_size", 1))
    return build(Job, {"model": model, "cluster": load_cluster(cluster), "plan": plan}, "job")


# --- the Job's expert rules ----------------------------------------------------------------------

@pytest.mark.parametrize("model, plan, message", [
    (DENSE, {"data_parallel_size": 2, "expert_model_parallel_size": 2},
     r"expert_model_parallel_size=2 needs a model with experts; set num_experts or use 1$"),
    (DENSE, {"tensor_parallel_size": 2, "expert_tensor_parallel_size": 1},
     r"expert_tensor_parallel_size=1 needs a model with experts; set num_experts or leave it unset$"),
    (MIXTRAL, {"data_parallel_size": 3, "expert_model_parallel_size": 3},
     r"expert_model_parallel_size=3 does not divide num_experts=8; use 1, 2, 4 or 8$"),
    (MIXTRAL, {"data_parallel_size": 2, "expert_model_parallel_size": 4},
     r"expert_model_parallel_size=4 x expert_tensor_parallel_size=1 does not divide the 2 TP x CP x DP ranks of "
     r"a stage; pick sizes whose product divides 2$"),
    (MIXTRAL, {"tensor_parallel_size": 4, "sequence_parallel": True, "expert_model_parallel_size": 2},
     r"expert_model_parallel_size=2 x expert_tensor_parallel_size=4 does not divide the 4 TP x CP x DP ranks"),
    (MIXTRAL.model_copy(update={"moe_ffn_hidden_size": 14334}), {"tensor_parallel_size": 4},
     r"expert_tensor_parallel_size=4 does not divide the experts' moe_ffn_hidden_size=14334; use 1 or 2$"),
    (QWEN15.model_copy(update={"moe_shared_expert_intermediate_size": 5630}), {"tensor_parallel_size": 4},
     r"tensor_parallel_size=4 does not divide moe_shared_expert_intermediate_size=5630 \(the shared experts"),
    (MIXTRAL, {"tensor_parallel_size": 2, "data_parallel_size": 4, "expert_model_parallel_size": 8,
               "expert_tensor_parallel_size": 1},
     r"expert_model_parallel_size=8 with tensor_parallel_size=2 needs sequence_parallel \(Megatron's rule\); turn "
     r"sequence parallelism on$"),
    (MIXTRAL, {"data_parallel_size": 16, "expert_tensor_parallel_size": 16},
     r"expert_tensor_parallel_size=16 is more than the 8 GPUs per node of dgx-h100"),
    (MIXTRAL, {"data_parallel_size": 6, "expert_tensor_parallel_size": 3},
     r"expert_tensor_parallel_size=3 must divide the 8 GPUs per node; use 1, 2, 4 or 8$"),
])
def test_the_job_refuses_expert_layouts_megatron_cannot_build(model, plan, message):
    with pytest.raises(ConfigError, match=message):
        job(model, **plan)


def test_the_job_takes_the_expert_layouts_megatron_builds():
    # EP over the DP ranks, experts whole (ETP 1) beside TP 2 with SP: Mixtral's usual layout
    j = job(MIXTRAL, tensor_parallel_size=2, sequence_parallel=True, data_parallel_size=8,
            expert_model_parallel_size=8, expert_tensor_parallel_size=1, moe_token_dispatcher_type="alltoall",
            moe_grouped_gemm=True)
    assert j.plan.expert_data_parallel_size == 2
    # EP over TP x DP together; a capacity factor with the allgather dispatcher is fine
    capped = MIXTRAL.model_copy(update={"moe_expert_capacity_factor": 1.25})
    assert job(capped, tensor_parallel_size=4, sequence_parallel=True, data_parallel_size=2,
               expert_model_parallel_size=8, expert_tensor_parallel_size=1).plan.expert_data_parallel_size == 1
    # EP 1 with TP needs no SP; ETP across nodes when insisted on
    job(MIXTRAL, tensor_parallel_size=2)
    job(MIXTRAL, data_parallel_size=16, expert_tensor_parallel_size=16, allow_tp_across_nodes=True)


# --- the deepseek-v3-style preset ----------------------------------------------------------------

def test_deepseek_v3_style_has_its_expert_layout_and_the_counts_its_comment_states():
    m = PRESETS["deepseek-v3-style"]
    assert (m.num_layers, m.hidden_size, m.num_experts, m.moe_router_topk, m.expert_ffn_size) == (61, 7168, 256, 8, 2048)
    assert m.moe_shared_expert_intermediate_size == 2048 and m.ffn_size == 18432
    assert [m.is_moe_layer(i) for i in range(5)] == [False, False, False, True, True] and m.num_moe_layers == 58
    assert (m.q_size, m.query_groups, m.kv_size, m.vocab_size) == (16384, 8, 1024, 129280)
    assert m.untie_embeddings_and_output_weights and not m.add_bias_linear and m.swiglu
    # the comment in simulator/presets.py: 674.8B total, 41.4B active (published 671B / 37B with MLA)
    assert m.num_parameters() == pytest.approx(674.8e9, rel=0.01)
    assert m.num_parameters(active=True) == pytest.approx(41.4e9, rel=0.01)
    # with MLA's 187.1M attention parameters a layer in place of these, the published counts come back
    mla = 7168 * 1536 + 1536 + 1536 * 128 * 192 + 7168 * (512 + 64) + 512 + 512 * 128 * 256 + 128 * 128 * 7168
    extra = 61 * (m.attention_parameters() - mla)
    assert m.num_parameters() - extra == pytest.approx(671e9, rel=0.005)
    assert m.num_parameters(active=True) - extra == pytest.approx(37e9, rel=0.02)
