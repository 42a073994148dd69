"""Hugging Face config.json files read offline: the released configs give the released parameter counts,
and anything malformed or unknown is one ConfigError naming the file, the value and the fix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from simulator.spec.catalog import PRESETS, load_model
from simulator.spec.errors import ConfigError
from simulator.spec.hf import SUPPORTED_ARCHITECTURES, load_hf_config, model_from_hf_config
from simulator.spec.model import Normalization, PositionEmbedding

# The config.json files as released on the Hugging Face Hub (keys that do not matter here trimmed).
GPT2 = {
    "activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"], "attn_pdrop": 0.1, "embd_pdrop": 0.1,
    "layer_norm_epsilon": 1e-05, "model_type": "gpt2", "n_ctx": 1024, "n_embd": 768, "n_head": 12, "n_inner": None,
    "n_layer": 12, "n_positions": 1024, "resid_pdrop": 0.1, "vocab_size": 50257,
}
PYTHIA_160M = {
    "architectures": ["GPTNeoXForCausalLM"], "hidden_act": "gelu", "hidden_size": 768, "intermediate_size": 3072,
    "layer_norm_eps": 1e-05, "max_position_embeddings": 2048, "model_type": "gpt_neox", "num_attention_heads": 12,
    "num_hidden_layers": 12, "rotary_emb_base": 10000, "rotary_pct": 0.25, "tie_word_embeddings": False,
    "use_parallel_residual": True, "vocab_size": 50304,
}
LLAMA2_7B = {
    "architectures": ["LlamaForCausalLM"], "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 11008,
    "max_position_embeddings": 4096, "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32,
    "num_key_value_heads": 32, "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_scaling": None,
    "tie_word_embeddings": False, "torch_dtype": "float16", "vocab_size": 32000,
}
LLAMA3_8B = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0, "hidden_act": "silu",
    "hidden_size": 4096, "intermediate_size": 14336, "max_position_embeddings": 8192, "model_type": "llama",
    "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
    "rope_theta": 500000.0, "tie_word_embeddings": False, "vocab_size": 128256,
}
MISTRAL_7B = {
    "architectures": ["MistralForCausalLM"], "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 14336,
    "max_position_embeddings": 32768, "model_type": "mistral", "num_attention_heads": 32, "num_hidden_layers": 32,
    "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "sliding_window": 4096, "tie_word_embeddings": False,
    "vocab_size": 32000,
}
QWEN2_05B = {
    "architectures": ["Qwen2ForCausalLM"], "hidden_act": "silu", "hidden_size": 896, "intermediate_size": 4864,
    "max_position_embeddings": 32768, "model_type": "qwen2", "num_attention_heads": 14, "num_hidden_layers": 24,
    "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "tie_word_embeddings": True, "vocab_size": 151936,
}


def write(tmp_path: Path, data, name: str = "config.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(data) if not isinstance(data, str) else data)
    return path


def test_gpt2_counts_its_released_parameters_plus_megatron_vocab_padding(tmp_path):
    m = load_hf_config(write(tmp_path, GPT2))
    assert (m.num_layers, m.hidden_size, m.num_attention_heads, m.ffn_size, m.seq_length) == (12, 768, 12, 3072, 1024)
    assert m.normalization is Normalization.layernorm and m.add_bias_linear
    assert not m.untie_embeddings_and_output_weights
    assert m.vocab_size == 50304  # 50,257 padded to a multiple of 128
    # HF's GPT-2 has 124,439,808 parameters; the padding adds 47 rows of the word embedding.
    assert m.num_parameters() == 124_439_808 + (50304 - 50257) * 768


def test_gpt_neox_pythia_160m_counts_exactly_its_released_parameters(tmp_path):
    m = load_hf_config(write(tmp_path, PYTHIA_160M))
    assert m.position_embedding_type is PositionEmbedding.rope and m.untie_embeddings_and_output_weights
    assert m.add_bias_linear and m.attention_dropout == 0 and m.hidden_dropout == 0
    assert m.num_parameters() == 162_322_944


@pytest.mark.parametrize("config,preset", [(LLAMA2_7B, "llama2-7b"), (LLAMA3_8B, "llama3-8b")])
def test_llama_configs_give_the_presets(tmp_path, config, preset):
    m = load_hf_config(write(tmp_path, config))
    assert m.model_copy(update={"name": preset}) == PRESETS[preset]


def test_mistral_counts_its_released_parameters_at_its_declared_context(tmp_path):
    m = load_hf_config(write(tmp_path, MISTRAL_7B))
    assert m.num_parameters() == 7_241_732_096
    assert m.seq_length == 32768 and m.query_groups == 8


def test_qwen2_counts_exactly_its_published_parameters(tmp_path):
    m = load_hf_config(write(tmp_path, QWEN2_05B))
    assert not m.untie_embeddings_and_output_weights and m.add_qkv_bias and not m.add_bias_linear
    assert m.num_parameters() == 494_032_768  # with its query/key/value biases, 24 x (896 + 2 x 2 x 64)


def test_rope_theta_and_llama31_scaling_are_read(tmp_path):
    assert load_hf_config(write(tmp_path, LLAMA3_8B)).rotary_base == 500_000
    scaled = {**LLAMA3_8B, "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0}}
    assert load_hf_config(write(tmp_path, scaled)).rope_scaling_factor == 8.0
    mistral = {**LLAMA3_8B, "architectures": ["MistralForCausalLM"], "model_type": "mistral", "sliding_window": 4096}
    assert load_hf_config(write(tmp_path, mistral)).window_size == 4096


def test_sequence_length_defaults_to_max_positions_unless_given(tmp_path):
    path = write(tmp_path, LLAMA3_8B)
    assert load_hf_config(path).seq_length == 8192
    assert load_hf_config(path, seq_length=2048).seq_length == 2048


def test_name_comes_from_name_or_path_then_the_folder(tmp_path):
    folder = tmp_path / "Meta-Llama-3-8B"
    folder.mkdir()
    assert load_hf_config(write(folder, LLAMA3_8B)).name == "Meta-Llama-3-8B"
    named = {**LLAMA3_8B, "_name_or_path": "meta-llama/Meta-Llama-3-8B-Instruct"}
    assert load_hf_config(write(tmp_path, named, "llama.json")).name == "Meta-Llama-3-8B-Instruct"


def test_load_model_routes_hugging_face_configs_and_keeps_modelspec_files(tmp_path):
    assert load_model(str(write(tmp_path, PYTHIA_160M))).num_parameters() == 162_322_944
    spec = write(tmp_path, {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4}, "tiny.json")
    assert load_model(str(spec)).name == "tiny"


def test_model_type_alone_is_enough(tmp_path):
    data = {k: v for k, v in LLAMA3_8B.items() if k != "architectures"}
    assert load_hf_config(write(tmp_path, data)).num_parameters() == PRESETS["llama3-8b"].num_parameters()


def _error(tmp_path, data) -> str:
    path = write(tmp_path, data)
    with pytest.raises(ConfigError) as info:
        load_hf_config(path)
    message = str(info.value)
    assert str(path) in message, message  # every message names the file
    return message


def test_unknown_architecture_names_it_and_the_supported_ones(tmp_path):
    msg = _error(tmp_path, {"architectures": ["T5ForConditionalGeneration"], "model_type": "t5", "d_model": 512})
    assert "T5ForConditionalGeneration" in msg and all(a in msg for a in SUPPORTED_ARCHITECTURES)
    msg = _error(tmp_path, {"model_type": "mamba", "hidden_size": 768})
    assert "'mamba'" in msg and "ModelSpec" in msg


@pytest.mark.parametrize("change,expected", [
    ({"hidden_size": None}, "'hidden_size'"),  # missing (null counts as missing)
    ({"hidden_size": "4096"}, "hidden_size='4096'"),
    ({"num_hidden_layers": 0}, "num_hidden_layers=0"),
    ({"num_key_value_heads": 4.0}, "num_key_value_heads=4.0"),
    ({"tie_word_embeddings": "no"}, "tie_word_embeddings='no'"),
    ({"attention_dropout": 1.5}, "attention_dropout=1.5"),
    ({"hidden_act": "gelu"}, "hidden_act='gelu'"),
    ({"head_dim": 96}, "head_dim=96"),
    ({"num_attention_heads": 48}, "num_attention_heads=48"),  # does not divide 4096
    ({"num_key_value_heads": 6}, "num_query_groups=6"),  # does not divide 32 heads
    ({"architectures": "LlamaForCausalLM"}, "architectures='LlamaForCausalLM'"),
    ({"architectures": [["LlamaForCausalLM"]]}, "architectures=[['LlamaForCausalLM']]"),  # a fuzz case's crash
    ({"architectures": None, "model_type": ["llama"]}, "model_type=['llama']"),
    ({"hidden_act": ["silu"]}, "hidden_act=['silu']"),
])
def test_malformed_values_name_the_key_and_value(tmp_path, change, expected):
    data = {**LLAMA3_8B, **change}
    if change.get("hidden_size", 1) is None:
        del data["hidden_size"]
    assert expected in _error(tmp_path, data)


def test_files_that_are_not_configs(tmp_path):
    assert "not valid JSON" in _error(tmp_path, '{"architectures": ["LlamaForCausalLM"],')
    assert "mapping" in _error(tmp_path, "[1, 2]")
    assert "not a Hugging Face config" in _error(tmp_path, {"hidden_size": 4096})
    with pytest.raises(ConfigError, match="cannot read"):
        load_hf_config(tmp_path / "missing" / "config.json")


@given(layers=st.integers(1, 128), heads=st.integers(1, 64), head_dim=st.sampled_from([32, 64, 128]),
       group_div=st.integers(1, 8), ffn=st.integers(1, 60000), vocab=st.integers(1, 200000), tied=st.booleans())
def test_llama_parameter_count_is_the_closed_form(layers, heads, head_dim, group_div, ffn, vocab, tied):
    groups = heads // group_div if heads % group_div == 0 else heads
    h, kv = heads * head_dim, groups * head_dim
    data = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": layers, "hidden_size": h,
            "num_attention_heads": heads, "num_key_value_heads": groups, "intermediate_size": ffn,
            "vocab_size": vocab, "max_position_embeddings": 4096, "tie_word_embeddings": tied}
    m = model_from_hf_config(data, "config.json")
    padded = -(-vocab // 128) * 128
    per_layer = h * (h + 2 * kv) + h * h + 3 * h * ffn + 2 * h  # q, k, v; o; gate, up, down; two RMSNorms
    assert m.num_parameters() == layers * per_layer + (1 if tied else 2) * padded * h + h


@given(st.dictionaries(st.sampled_from(sorted(LLAMA3_8B)), st.one_of(
    st.none(), st.booleans(), st.integers(-3, 3), st.floats(allow_nan=False), st.text(max_size=3),
    st.lists(st.integers(), max_size=2)), max_size=4))
def test_any_corruption_is_a_config_error_or_a_valid_model(corruption):
    data = {**LLAMA3_8B, **corruption}
    try:
        m = model_from_hf_config(data, "config.json")
    except ConfigError as exc:
        assert "'config.json'" in str(exc)
    else:
        assert m.num_parameters() > 0


def _notes(tmp_path, data, **kwargs) -> list[str]:
    from simulator.spec.hf import collected_notes

    with collected_notes() as notes:
        load_hf_config(write(tmp_path, data), **kwargs)
    return notes


def test_approximations_are_issued_as_notes(tmp_path):
    pythia = _notes(tmp_path, PYTHIA_160M)
    assert any("parallel residual" in n for n in pythia) and any("rotary_pct=0.25" in n for n in pythia)
    qwen = _notes(tmp_path, QWEN2_05B, seq_length=4096)
    assert not any("query/key/value biases" in n for n in qwen)  # modelled now (add_qkv_bias)
    assert not any("sliding" in n for n in qwen)  # Qwen2 declares a window but does not use it
    assert any("50,257 padded to 50,304" in n for n in _notes(tmp_path, GPT2))
    assert _notes(tmp_path, LLAMA3_8B) == []  # nothing approximated, and 8,192 is a pre-training length


def test_a_long_declared_context_says_which_length_it_used(tmp_path):
    notes = _notes(tmp_path, MISTRAL_7B)
    assert any("sequence length 32,768" in n and "--seq-length" in n for n in notes)
    assert any("sliding-window attention (window 4,096 tokens)" in n and "32,768 tokens" in n for n in notes)
    # a chosen length is not second-guessed, and a window as long as the sequence changes nothing
    assert _notes(tmp_path, MISTRAL_7B, seq_length=4096) == []
    with pytest.warns(UserWarning, match="sequence length 32,768"):
        load_model(str(write(tmp_path, MISTRAL_7B)))


def test_load_model_passes_the_sequence_length_to_the_config_reader(tmp_path):
    from simulator.spec.hf import collected_notes

    with collected_notes() as notes:
        model = load_model(str(write(tmp_path, MISTRAL_7B)), seq_length=8192)
    assert model.seq_length == 8192
    assert not any("sequence length" in n for n in notes)
    assert any("all 8,192 tokens" in n for n in notes)


def test_a_field_out_of_range_names_the_file_once(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**LLAMA3_8B, "hidden_size": 10**9}))
    with pytest.raises(ConfigError) as err:
        load_hf_config(path)
    message = str(err.value)
    assert message.count(str(path)) == 1 and "hidden_size" in message and "262,144" in message, message
