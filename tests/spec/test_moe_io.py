"""Mixture-of-experts models at the boundary: the Job's expert rules, the Hugging Face import of MoE configs,
the deepseek-v3-style preset, and the exports and Megatron command lines that carry the experts."""

from __future__ import annotations

from pathlib import Path

import pytest

from simulator.spec._io import build
from simulator.spec.catalog import PRESETS
from simulator.spec.errors import ConfigError
from simulator.spec.hardware import load_cluster
from simulator.spec.model import ModelSpec
from simulator.spec.plan import Job

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
    (MIXTRAL.model_copy(update={"moe_ffn_hidden_size": 14334}), {"tensor_parallel_size": 4, "sequence_parallel": True},
     r"expert_tensor_parallel_size=4 does not divide the experts' moe_ffn_hidden_size=14334; use 1 or 2$"),
    (QWEN15.model_copy(update={"moe_shared_expert_intermediate_size": 5630}),
     {"tensor_parallel_size": 4, "sequence_parallel": True},
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
    # EP 1 with TP and SP; ETP across nodes when insisted on
    job(MIXTRAL, tensor_parallel_size=2, sequence_parallel=True)
    job(MIXTRAL, data_parallel_size=16, expert_tensor_parallel_size=16, allow_tp_across_nodes=True)


def test_experts_beside_tensor_parallelism_need_sequence_parallelism_at_ep_1_too():
    """megatron/training/arguments.py: 'When using MoE and tensor parallelism, sequence parallelism must be used',
    asserted whenever num_experts is set, whatever the expert-parallel size."""
    with pytest.raises(ConfigError, match=r"expert_model_parallel_size=1 with tensor_parallel_size=2 needs "
                                          r"sequence_parallel"):
        job(MIXTRAL, tensor_parallel_size=2)


# --- the deepseek-v3-style preset ----------------------------------------------------------------

def test_deepseek_v3_style_has_its_expert_layout_and_the_counts_its_comment_states():
    m = PRESETS["deepseek-v3-style"]
    assert (m.num_layers, m.hidden_size, m.num_experts, m.moe_router_topk, m.expert_ffn_size) == (61, 7168, 256, 8, 2048)
    assert m.moe_shared_expert_intermediate_size == 2048 and m.ffn_size == 18432
    assert [m.is_moe_layer(i) for i in range(5)] == [False, False, False, True, True] and m.num_moe_layers == 58
    assert (m.q_size, m.query_groups, m.kv_size, m.vocab_size) == (16384, 8, 1024, 129280)
    assert m.untie_embeddings_and_output_weights and not m.add_bias_linear and m.swiglu
    # the comment in simulator/spec/presets.py: 674.8B total, 41.4B active (published 671B / 37B with MLA)
    assert m.num_parameters() == pytest.approx(674.8e9, rel=0.01)
    assert m.num_parameters(active=True) == pytest.approx(41.4e9, rel=0.01)
    # with MLA's 187.1M attention parameters a layer in place of these, the published counts come back
    mla = 7168 * 1536 + 1536 + 1536 * 128 * 192 + 7168 * (512 + 64) + 512 + 512 * 128 * 256 + 128 * 128 * 7168
    extra = 61 * (m.attention_parameters() - mla)
    assert m.num_parameters() - extra == pytest.approx(671e9, rel=0.005)
    assert m.num_parameters(active=True) - extra == pytest.approx(37e9, rel=0.02)


# --- Hugging Face MoE configs ----------------------------------------------------------------------
# config.json as published (keys that do not matter here trimmed): mistralai/Mixtral-8x7B-v0.1,
# Qwen/Qwen1.5-MoE-A2.7B and Qwen/Qwen3-30B-A3B.
HF_MIXTRAL_8X7B = {
    "architectures": ["MixtralForCausalLM"], "attention_dropout": 0.0, "hidden_act": "silu", "hidden_size": 4096,
    "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mixtral", "num_attention_heads": 32,
    "num_experts_per_tok": 2, "num_hidden_layers": 32, "num_key_value_heads": 8, "num_local_experts": 8,
    "output_router_logits": False, "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.02,
    "sliding_window": None, "tie_word_embeddings": False, "vocab_size": 32000,
}
HF_QWEN15_MOE = {
    "architectures": ["Qwen2MoeForCausalLM"], "attention_dropout": 0.0, "hidden_act": "silu", "hidden_size": 2048,
    "intermediate_size": 5632, "max_position_embeddings": 8192, "max_window_layers": 21, "model_type": "qwen2_moe",
    "num_attention_heads": 16, "num_hidden_layers": 24, "num_key_value_heads": 16, "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0, "sliding_window": 32768, "tie_word_embeddings": False, "use_sliding_window": False,
    "vocab_size": 151936, "decoder_sparse_step": 1, "moe_intermediate_size": 1408,
    "shared_expert_intermediate_size": 5632, "num_experts_per_tok": 4, "num_experts": 60, "norm_topk_prob": False,
    "router_aux_loss_coef": 0.001,
}
HF_QWEN3_30B_A3B = {
    "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "decoder_sparse_step": 1, "head_dim": 128, "hidden_act": "silu", "hidden_size": 2048, "intermediate_size": 6144,
    "max_position_embeddings": 40960, "max_window_layers": 48, "mlp_only_layers": [], "model_type": "qwen3_moe",
    "moe_intermediate_size": 768, "norm_topk_prob": True, "num_attention_heads": 32, "num_experts": 128,
    "num_experts_per_tok": 8, "num_hidden_layers": 48, "num_key_value_heads": 4, "rms_norm_eps": 1e-06,
    "rope_scaling": None, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001, "sliding_window": None,
    "tie_word_embeddings": False, "use_sliding_window": False, "vocab_size": 151936,
}
# the fields that shape the time and memory of an MoE model (ffn_hidden_size is compared where a layer is dense)
MOE_FIELDS = ("num_layers", "hidden_size", "num_attention_heads", "num_query_groups", "head_dim", "vocab_size",
              "swiglu", "normalization", "position_embedding_type", "untie_embeddings_and_output_weights",
              "add_bias_linear", "qk_layernorm", "num_experts", "moe_router_topk", "expert_ffn_size",
              "moe_shared_expert_intermediate_size", "moe_layer_freq", "moe_expert_capacity_factor")


def hf_model(data: dict, **kwargs) -> ModelSpec:
    import warnings

    from simulator.spec.hf import model_from_hf_config

    with warnings.catch_warnings():  # the notes are checked apart
        warnings.simplefilter("ignore")
        return model_from_hf_config(data, "config.json", seq_length=4096, **kwargs)


@pytest.mark.parametrize("config, preset, total, active, active_rel", [
    (HF_MIXTRAL_8X7B, "mixtral-8x7b", 46.7e9, 12.9e9, 0.005),
    (HF_QWEN15_MOE, "qwen1.5-moe-a2.7b", 14.3e9, 2.7e9, 0.005),
    # the published "3.3B" is rounded down: 48 layers x 56.9M active + two 311M embeddings come to 3.35B
    (HF_QWEN3_30B_A3B, "qwen3-30b-a3b", 30.5e9, 3.3e9, 0.02),
])
def test_moe_configs_import_as_their_presets_with_the_published_counts(config, preset, total, active, active_rel):
    m, p = hf_model(config), PRESETS[preset]
    assert {f: getattr(m, f) for f in MOE_FIELDS} == {f: getattr(p, f) for f in MOE_FIELDS}
    assert m.num_parameters() == p.num_parameters()
    assert m.num_parameters(active=True) == p.num_parameters(active=True)
    assert m.num_parameters() == pytest.approx(total, rel=0.005)
    assert m.num_parameters(active=True) == pytest.approx(active, rel=active_rel)
    # the dense layers' MLP is intermediate_size (Mixtral: the expert's own size)
    assert m.ffn_size == config["intermediate_size"]


def test_a_mixtral_config_without_its_names_is_still_moe():
    dense_mistral = 7_241_732_096
    for drop in (("architectures",), ("architectures", "model_type")):
        data = {k: v for k, v in HF_MIXTRAL_8X7B.items() if k not in drop}
        m = hf_model(data)
        assert m.num_experts == 8 and m.num_parameters() != dense_mistral
        assert m.num_parameters() == PRESETS["mixtral-8x7b"].num_parameters()
    # a name that says dense Mistral while the keys list experts: the keys win, and a note says so
    from simulator.spec.hf import collected_notes, model_from_hf_config

    with collected_notes() as notes:
        m = model_from_hf_config({**HF_MIXTRAL_8X7B, "architectures": ["MistralForCausalLM"], "model_type": "mistral"},
                                 "config.json", seq_length=4096)
    assert m.num_experts == 8
    assert any("read as mixtral (the config lists num_local_experts=8), not as the dense mistral" in n for n in notes)


def test_a_mixtral_config_file_without_its_names_loads_as_moe(tmp_path):
    import json

    from simulator.spec.hf import load_hf_config

    path = tmp_path / "config.json"
    path.write_text(json.dumps({k: v for k, v in HF_MIXTRAL_8X7B.items() if k not in ("architectures", "model_type")}))
    assert load_hf_config(path, seq_length=4096).num_experts == 8


def test_qwen_moe_layers_follow_decoder_sparse_step_and_mlp_only_layers():
    m = hf_model({**HF_QWEN3_30B_A3B, "num_hidden_layers": 6, "decoder_sparse_step": 2, "mlp_only_layers": [5]})
    assert m.moe_layer_freq == (0, 1, 0, 1, 0, 0)  # transformers: layer i is MoE when (i + 1) % step == 0
    assert m.num_moe_layers == 2 and m.ffn_size == 6144
    m = hf_model({**HF_QWEN15_MOE, "mlp_only_layers": [0, 1]})
    assert m.moe_layer_freq == (0, 0) + (1,) * 22


def test_qwen2_moe_notes_its_biases_and_shared_expert_gate():
    from simulator.spec.hf import collected_notes, model_from_hf_config

    with collected_notes() as notes:
        model_from_hf_config(HF_QWEN15_MOE, "config.json", seq_length=4096)
    assert not any("query/key/value biases" in n for n in notes)  # modelled: add_qkv_bias
    assert any("shared expert's sigmoid gate" in n for n in notes)
    with collected_notes() as notes:
        model_from_hf_config(HF_QWEN3_30B_A3B, "config.json", seq_length=4096)
    assert notes == []


@pytest.mark.parametrize("data, message", [
    ({"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "q_lora_rank": 1536,
      "kv_lora_rank": 512}, r"is a DeepSeek model \(model_type 'deepseek_v3'\) with multi-head latent attention"),
    ({"model_type": "deepseek_v2", "kv_lora_rank": 512}, r"\(model_type 'deepseek_v2'\)"),
    ({**HF_MIXTRAL_8X7B, "kv_lora_rank": 512}, r"\(kv_lora_rank\)"),
    ({**HF_QWEN15_MOE, "mlp_only_layers": [30]}, r"mlp_only_layers=\[30\]; it must be a list of layer indices "
                                                 r"from 0 to 23$"),
    ({**HF_QWEN15_MOE, "decoder_sparse_step": 25}, r"leave none of its 24 layers with experts"),
    ({**HF_MIXTRAL_8X7B, "num_experts_per_tok": 9}, r"moe_router_topk=9 is more than num_experts=8"),
])
def test_moe_configs_the_simulator_cannot_read_are_one_sentence(data, message):
    from simulator.spec.hf import model_from_hf_config

    with pytest.raises(ConfigError, match=message) as info:
        model_from_hf_config(data, "config.json")
    if "DeepSeek" in message:
        assert "use the preset 'deepseek-v3-style'" in str(info.value)


@pytest.mark.parametrize("base", ["qwen2_moe", "qwen3_moe", "mixtral", "llama"])
@pytest.mark.parametrize("layers", [10**12, 10**6, 1025])
def test_a_layer_count_past_the_bound_is_refused_before_anything_is_built_per_layer(tmp_path, base, layers):
    """Qwen-MoE configs list which layers have experts, one entry a layer: 10**12 layers used to grow that list
    until memory ran out (16.7 GB). Every family is refused at once with the bound, in one sentence."""
    import json
    import os
    import subprocess
    import sys

    from simulator.spec import limits

    data = {"qwen2_moe": HF_QWEN15_MOE, "qwen3_moe": HF_QWEN3_30B_A3B, "mixtral": HF_MIXTRAL_8X7B,
            "llama": {**HF_MIXTRAL_8X7B, "architectures": ["LlamaForCausalLM"], "model_type": "llama",
                      "num_local_experts": 1}}[base]
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**data, "num_hidden_layers": layers}))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[2]),
                                                         os.environ.get("PYTHONPATH", "")])}
    for command in (["models", str(path)], ["memory", "--model", str(path)]):
        run = subprocess.run([sys.executable, "-m", "simulator", *command], capture_output=True, text=True, timeout=30,
                             env=env)
        assert run.returncode == 2, (run.returncode, run.stderr[-2000:])
        lines = run.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), run.stderr[-2000:]
        assert f"num_hidden_layers={layers}" in lines[0] and f"{limits.MAX_LAYERS:,}" in lines[0], lines[0]

