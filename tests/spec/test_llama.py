"""The Llama presets: published parameter counts, and the Llama parts of the layer graph and the memory model."""

from __future__ import annotations

import pytest

from simulator.graph.layers import OpKind, transformer_layer
from simulator.graph.parameters import layer_parameters_per_rank, stage_parameters
from simulator.spec.catalog import PRESETS, load_model
from simulator.spec.hardware import load_cluster
from simulator.spec.model import Normalization, PositionEmbedding
from simulator.spec.plan import Job, ParallelPlan, RecomputeGranularity
from simulator.spec.presets import LLAMA_PRESETS

# Model cards / papers (Touvron et al. 2023b; Dubey et al. 2024), in billions.
PUBLISHED_BILLIONS = {
    "llama2-7b": 6.74, "llama2-13b": 13.0, "llama2-70b": 69.0,
    "llama3-8b": 8.03, "llama3-70b": 70.6, "llama3-405b": 405.9,
}


@pytest.mark.parametrize("name", sorted(PUBLISHED_BILLIONS))
def test_parameter_counts_match_the_published_within_one_percent(name):
    model = load_model(name)
    assert model.num_parameters() / 1e9 == pytest.approx(PUBLISHED_BILLIONS[name], rel=0.01)


def test_exact_counts_of_the_released_checkpoints():
    # The safetensors of Llama-2-7b-hf and Meta-Llama-3-8B hold exactly these many parameters.
    assert PRESETS["llama2-7b"].num_parameters() == 6_738_415_616
    assert PRESETS["llama3-8b"].num_parameters() == 8_030_261_248


def test_presets_are_registered_and_llama_style():
    assert set(LLAMA_PRESETS) <= set(PRESETS)
    for m in LLAMA_PRESETS.values():
        assert m.swiglu and m.normalization is Normalization.rmsnorm
        assert m.position_embedding_type is PositionEmbedding.rope
        assert m.untie_embeddings_and_output_weights and not m.add_bias_linear
        assert m.attention_dropout == 0 and m.hidden_dropout == 0
        assert m.vocab_size % 128 == 0  # Megatron would not pad them
    gqa = {n for n, m in LLAMA_PRESETS.items() if m.query_groups < m.num_attention_heads}
    assert gqa == {"llama2-70b", "llama3-8b", "llama3-70b", "llama3-405b"}


def _job(model_name: str, tp: int = 1, pp: int = 1, **plan) -> Job:
    model = PRESETS[model_name]
    return Job(model=model, cluster=load_cluster("dgx-h100"),
               plan=ParallelPlan(tensor_parallel_size=tp, pipeline_parallel_size=pp, **plan))


@pytest.mark.parametrize("name,tp", [("llama2-7b", 4), ("llama3-70b", 8), ("llama3-405b", 8)])
def test_tensor_parallel_ranks_split_the_layer_weights_exactly(name, tp):
    # No biases, so only the (replicated) norms are counted on every rank; with t <= groups
    # the key/value heads are split too.
    m = PRESETS[name]
    norms = 2 * m.norm_parameters()
    assert tp * (layer_parameters_per_rank(m, tp) - norms) == m.layer_parameters() - norms


def test_key_value_heads_are_replicated_when_tp_exceeds_the_groups():
    # 2 groups on 8 ranks: each rank still needs one whole K and V head, as with 8 groups.
    two = PRESETS["llama3-8b"].model_copy(update={"num_query_groups": 2})
    eight = PRESETS["llama3-8b"]
    assert layer_parameters_per_rank(two, 8) == layer_parameters_per_rank(eight, 8)
    norms = 2 * two.norm_parameters()
    replicated = 8 * (layer_parameters_per_rank(two, 8) - norms) - (two.layer_parameters() - norms)
    assert replicated == 2 * two.hidden_size * (8 - 2) * two.head_dim  # 6 extra copies of K and V heads


@pytest.mark.parametrize("name", ["llama2-13b", "llama3-8b"])
def test_pipeline_stages_hold_every_parameter_once(name):
    # Untied embeddings: the first stage has the word embedding, the last the output layer.
    job = _job(name, pp=4)
    assert sum(stage_parameters(job, s) for s in range(4)) == job.model.num_parameters()


@pytest.mark.parametrize("name,tp", [("llama2-70b", 8), ("llama3-8b", 2), ("llama3-8b", 1)])
def test_forward_gemm_flops_are_two_per_weight_per_token(name, tp):
    # With flash attention the only GEMMs are the four linear layers: 2 FLOPs per weight and token.
    job = _job(name, tp=tp, use_flash_attention=True)
    m = job.model
    layer = transformer_layer(m, job.plan)
    gemm_flops = sum(op.flops for op in layer.forward_ops() if op.kind is OpKind.gemm)
    weights = layer_parameters_per_rank(m, tp) - 2 * m.norm_parameters()
    assert gemm_flops == 2 * m.seq_length * weights


def test_llama_layer_has_rotary_swiglu_and_no_dropout_or_bias_ops():
    job = _job("llama3-8b", tp=2, sequence_parallel=True)
    layer = transformer_layer(job.model, job.plan)
    fwd = {op.name for op in layer.forward_ops()}
    bwd = set(layer.backward.nodes)
    assert {"rotary", "swiglu"} <= fwd and "gelu" not in fwd
    assert not any("dropout" in n and "add" not in n for n in fwd)
    assert not any(n.endswith("bias_grad") for n in bwd)
    assert not any(t.name.endswith(".mask") for t in layer.saved_tensors(RecomputeGranularity.none))
    fc1 = next(op for op in layer.forward_ops() if op.name == "fc1")
    assert fc1.gemm.n == 2 * job.model.ffn_size // 2  # gate and up projections, each split over TP 2
    qkv = next(op for op in layer.forward_ops() if op.name == "qkv")
    m = job.model
    assert qkv.gemm.n == (m.num_attention_heads + 2 * m.query_groups) * m.head_dim // 2


def test_grouped_query_attention_saves_smaller_keys_and_values():
    # Same shape but 8 key/value heads instead of 32: K and V activations shrink 4x.
    gqa = PRESETS["llama3-8b"]
    mha = gqa.model_copy(update={"num_query_groups": None})
    plan = ParallelPlan(use_flash_attention=True)

    def kv_bytes(model):
        saved = transformer_layer(model, plan).saved_tensors(RecomputeGranularity.none)
        return sum(t.bytes for t in saved if t.name in ("k", "v"))

    assert kv_bytes(mha) == 4 * kv_bytes(gqa)
