"""`simulator models` and `simulator clusters`: tables, JSON that matches the library, examples in --help,
Hugging Face configs through `--model`, and bad input -> exit 2 with one line."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from simulator.cli import cli
from simulator.spec.catalog import PRESETS
from simulator.spec.hardware import cluster_names, load_cluster

LLAMA3_8B = {
    "architectures": ["LlamaForCausalLM"], "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 14336,
    "max_position_embeddings": 8192, "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32,
    "num_key_value_heads": 8, "tie_word_embeddings": False, "vocab_size": 128256,
}


def run(*args: str):
    return CliRunner().invoke(cli, list(args))


def _table(output: str) -> tuple[list[str], list[list[str]]]:
    lines = output.splitlines()
    assert set(lines[1].replace(" ", "")) == {"-"}
    header = lines[0].split("  ")
    return [h.strip() for h in header if h.strip()], [line.split() for line in lines[2:] if line and line[0] != "N"]


def test_models_table_lists_every_preset_with_its_parameters():
    result = run("models")
    assert result.exit_code == 0, result.output
    header, rows = _table(result.output)
    assert header[:5] == ["name", "layers", "hidden", "heads", "kv heads"] and "params" in header
    by_name = {r[0]: r for r in rows}
    assert list(by_name) == list(PRESETS)
    assert by_name["llama3-405b"][header.index("params")] == "405.85B"
    assert by_name["gpt3-125m"][header.index("params")].endswith("M")
    assert by_name["llama2-70b"][header.index("kv heads")] == "8"


def test_models_json_is_the_library_view():
    result = run("models", "llama3-70b", "gpt3-175b", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert [d["name"] for d in doc] == ["llama3-70b", "gpt3-175b"]
    assert doc[0]["num_parameters"] == PRESETS["llama3-70b"].num_parameters()
    assert doc[0]["num_query_groups"] == 8 and doc[0]["swiglu"] is True


def test_models_shows_how_a_hugging_face_config_is_read(tmp_path):
    folder = tmp_path / "Meta-Llama-3-8B"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(LLAMA3_8B))
    result = run("models", str(folder / "config.json"), "--json")
    assert result.exit_code == 0, result.output
    (doc,) = json.loads(result.output)
    assert doc["name"] == "Meta-Llama-3-8B" and doc["num_parameters"] == PRESETS["llama3-8b"].num_parameters()


def test_clusters_table_and_json_agree_with_the_specs():
    table = run("clusters")
    assert table.exit_code == 0, table.output
    header, rows = _table(table.output)
    assert header[:4] == ["name", "GPU", "GPUs/node", "memory GiB"] and "NICs" in header and "NVLink GB/s" in header
    assert [r[0] for r in rows] == cluster_names()
    result = run("clusters", "--json")
    doc = {d["name"]: d for d in json.loads(result.output)}
    h200 = load_cluster("dgx-h200")
    assert doc["dgx-h200"]["memory_gib"] == h200.gpu.hbm_capacity_gib
    assert doc["dgx-h100"]["fp8"] is True and doc["dgx-a100-80gb"]["fp8"] is False
    assert doc["dgx-h100"]["nics_per_node"] == 8 and doc["dgx-h100"]["nic_line_rate_gbit_s"] == 400
    assert doc["dgx-a100-80gb"]["published_profile"] == "a100-sxm4-80gb-published"


@pytest.mark.parametrize("command", ["models", "clusters"])
def test_help_has_examples(command):
    result = run(command, "--help")
    assert result.exit_code == 0
    assert "Examples:" in result.output and f"simulator {command}" in result.output


@pytest.mark.parametrize("args,needle", [
    (("models", "gpt5"), "unknown model 'gpt5'"),
    (("clusters", "dgx-z100"), "unknown cluster 'dgx-z100'"),
])
def test_unknown_names_exit_2_with_one_line(args, needle):
    result = run(*args)
    assert result.exit_code == 2
    assert needle in result.output and len(result.output.strip().splitlines()) == 1


def test_plan_takes_a_hugging_face_config_and_fp8(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA3_8B))
    base = ("plan", "--model", str(path), "--cluster", "dgx-h100", "--tp", "2", "--sp", "--use-flash-attn", "--json")
    bf16 = run(*base)
    fp8 = run(*base, "--fp8-format", "hybrid")
    assert bf16.exit_code == 0 and fp8.exit_code == 0, bf16.output + fp8.output
    t_bf16, t_fp8 = (json.loads(r.output)["iteration_time_s"] for r in (bf16, fp8))
    assert t_fp8 < t_bf16


def test_bad_hugging_face_config_and_fp8_on_a100_exit_2(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**LLAMA3_8B, "architectures": ["BertForMaskedLM"]}))
    result = run("plan", "--model", str(path))
    assert result.exit_code == 2 and "BertForMaskedLM" in result.output and str(path) in result.output
    result = run("memory", "--model", "llama3-8b", "--fp8-format", "hybrid")
    assert result.exit_code == 2 and "FP8 tensor cores" in result.output
