"""ModelSpec: presets with the published sizes, files, and validators whose messages name the values."""

from __future__ import annotations

import pytest

from simulator.spec.catalog import PRESETS, load_model
from simulator.spec.errors import ConfigError, SimulatorError
from simulator.spec.model import ModelSpec


@pytest.mark.parametrize("name,billions,tol", [
    ("gpt3-125m", 0.125, 0.10), ("gpt3-350m", 0.35, 0.05), ("gpt3-760m", 0.76, 0.05), ("gpt3-1.3b", 1.3, 0.05),
    ("gpt3-2.7b", 2.7, 0.05), ("gpt3-6.7b", 6.7, 0.05), ("gpt3-13b", 13.0, 0.05), ("gpt3-175b", 175.0, 0.02),
    ("megatron-22b", 22.0, 0.02), ("mt-nlg-530b", 530.0, 0.02), ("megatron-1t", 1000.0, 0.02),
])
def test_presets_have_their_published_size(name, billions, tol):
    """Brown et al. 2020 Table 2.1 and Korthikanti Table 3 sizes from 12 L h^2 + embeddings."""
    assert PRESETS[name].num_parameters() / 1e9 == pytest.approx(billions, rel=tol)


def test_gpt3_defaults_are_megatrons():
    m = PRESETS["gpt3-175b"]
    assert (m.vocab_size, m.seq_length, m.ffn_size, m.num_layers, m.hidden_size) == (51200, 2048, 4 * 12288, 96, 12288)


def test_layer_parameters_is_12h2_plus_13h_for_gpt():
    m = PRESETS["gpt3-175b"]
    h = m.hidden_size
    assert m.layer_parameters() == 12 * h * h + 13 * h


def test_load_from_yaml_and_json(tmp_path):
    y = tmp_path / "small.yaml"
    y.write_text("num_layers: 2\nhidden_size: 64\nnum_attention_heads: 4\n")
    j = tmp_path / "small2.json"
    j.write_text('{"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "swiglu": true}')
    assert load_model(str(y)).name == "small" and load_model(str(j)).swiglu


@pytest.mark.parametrize("text,needle", [
    ("num_layers: 2\nhidden_size: 65\nnum_attention_heads: 4\n", "num_attention_heads=4 does not divide hidden_size=65"),
    ("num_layers: 0\nhidden_size: 64\nnum_attention_heads: 4\n", "num_layers"),
    ("num_layers: 2\nhidden_size: 64\nnum_attention_heads: 4\nnum_query_groups: 3\n", "num_query_groups=3"),
    ("num_layers: 2\nhidden_size: 64\nnum_attention_heads: 4\nheads: 4\n", "'heads'"),
    ("num_layers: 2\nnum_attention_heads: 4\n", "'hidden_size'"),
    ("- 1\n- 2\n", "mapping"),
    ("num_layers: [2\n", "not valid YAML"),
])
def test_bad_model_files_are_config_errors_naming_the_value(tmp_path, text, needle):
    path = tmp_path / "m.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_model(str(path))
    assert needle in str(err.value)


def test_unknown_model_lists_the_presets():
    with pytest.raises(SimulatorError, match="unknown model 'gpt-5'.*gpt3-175b"):
        load_model("gpt-5")


def test_spec_is_frozen_and_strict():
    with pytest.raises(Exception):
        PRESETS["gpt3-175b"].num_layers = 3  # type: ignore[misc]
    with pytest.raises(ValueError):
        ModelSpec(num_layers=1, hidden_size=8, num_attention_heads=2, bogus=1)
