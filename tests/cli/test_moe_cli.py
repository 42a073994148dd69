"""Mixture-of-experts flags on the command line: the expert layout and load imbalance reach the plan and
every output states them; nonsense values are refused in one sentence with exit code 2, never a traceback."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simulator.cli import cli
from simulator.spec.catalog import load_model
from simulator.spec.hardware import load_cluster
from tests.cli.test_bad_input import ok, refused

MIXTRAL = ["--model", "mixtral-8x7b", "--cluster", "dgx-h100"]
EP8 = [*MIXTRAL, "--gpus", "16", "--tp", "2", "--sp", "--ep", "8", "--etp", "1", "--moe-token-dispatcher-type",
       "alltoall", "--moe-grouped-gemm", "--gbs", "16"]


@pytest.mark.parametrize("command", ["plan", "memory"])
@pytest.mark.parametrize("args, needle", [
    ([*MIXTRAL, "--gpus", "12", "--ep", "3"], "expert_model_parallel_size=3 does not divide num_experts=8; use 1, 2, 4 or 8"),
    ([*MIXTRAL, "--ep", "0"], "'--expert-model-parallel-size' / '--ep': 0 is out of range"),
    ([*MIXTRAL, "--ep", "two"], "'two' is not a whole number"),
    ([*MIXTRAL, "--moe-load-imbalance", "0.5"], "'--moe-load-imbalance': 0.5 is out of range; give a number from 1"),
    ([*MIXTRAL, "--moe-load-imbalance", "nan"], "'--moe-load-imbalance': nan is out of range"),
    ([*MIXTRAL, "--moe-load-imbalance", "1e999"], "'--moe-load-imbalance': 1e999 is out of range"),
    (["--model", "llama3-8b", "--gpus", "2", "--ep", "2"], "expert_model_parallel_size=2 needs a model with experts"),
    (["--model", "llama3-8b", "--etp", "1"], "expert_tensor_parallel_size=1 needs a model with experts"),
    (["--model", "llama3-8b", "--moe-load-imbalance", "1.2"], "--moe-load-imbalance 1.2 is for a mixture-of-experts "
                                                              "model; llama3-8b is dense"),
    ([*MIXTRAL, "--gpus", "6", "--etp", "3"], "expert_tensor_parallel_size=3 must divide the 8 GPUs per node"),
    ([*MIXTRAL, "--gpus", "16", "--etp", "16"], "expert_tensor_parallel_size=16 is more than the 8 GPUs per node"),
    ([*MIXTRAL, "--gpus", "2", "--ep", "4"], "does not divide the 2 TP x CP x DP ranks of a stage"),
    ([*MIXTRAL, "--gpus", "16", "--tp", "2", "--ep", "8", "--etp", "1"], "needs sequence_parallel (Megatron's rule)"),
    ([*MIXTRAL, "--moe-token-dispatcher-type", "flex"], "'flex' is not one of 'alltoall', 'allgather'"),
])
def test_nonsense_moe_values_are_one_sentence(command, args, needle):
    refused(command, *args, needle=needle)


@pytest.mark.parametrize("args, needle", [
    ([*MIXTRAL, "--gpus", "16", "--gbs", "16", "--ep", "3"], "expert_model_parallel_size=3 does not divide"),
    (["--model", "llama3-8b", "--gpus", "16", "--gbs", "16", "--ep", "2"], "needs a model with experts"),
    ([*MIXTRAL, "--gpus", "16", "--gbs", "16", "--moe-load-imbalance", "0.5"], "0.5 is out of range"),
    ([*MIXTRAL, "--gpus", "16", "--gbs", "16", "--tp", "2", "--no-sp", "--ep", "8"], "needs sequence_parallel"),
    ([*MIXTRAL, "--gpus", "16", "--gbs", "16", "--etp", "3"], "expert_tensor_parallel_size=3 must divide"),
])
def test_search_refuses_expert_pins_that_break_a_rule(args, needle):
    refused("search", *args, needle=needle)


def test_a_deepseek_config_is_refused_with_the_closest_preset(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
                                "hidden_size": 7168, "q_lora_rank": 1536, "kv_lora_rank": 512}))
    refused("plan", "--model", str(path), needle="multi-head latent attention, which this simulator does not "
                                                 "model; use the preset 'deepseek-v3-style'")


@pytest.mark.parametrize("line, needle", [
    ("--num-experts 8 --moe-layer-freq '[2,1]'", "--moe-layer-freq '[2,1]' is not a list pattern"),
    ("--num-experts 8 --moe-layer-freq '__import__(\"os\")'", "is neither a whole number nor a list pattern"),
    ("--num-experts 8 --multi-latent-attention", "--multi-latent-attention: the simulator models GPTs"),
    ("--num-experts 8 --expert-model-parallel-size 3", "expert_model_parallel_size=3 does not divide num_experts=8"),
    ("--num-experts 1", "num_experts"),
    ("--num-experts 8 --moe-router-topk 9", "moe_router_topk=9 is more than num_experts=8"),
    ("--num-experts 8 --moe-layer-freq '[1,0]'", "moe_layer_freq lists 2 entries"),
])
def test_megatron_lines_with_bad_experts_are_one_sentence(tmp_path, line, needle):
    path = tmp_path / "run.sh"
    path.write_text("torchrun --nproc-per-node 8 pretrain_gpt.py --num-layers 4 --hidden-size 256 "
                    f"--num-attention-heads 4 --seq-length 512 --bf16 {line}\n")
    refused("plan", "--megatron-args", str(path), needle=needle)


def test_plan_states_the_expert_layout_and_load_imbalance():
    text = ok("plan", *EP8, "--moe-load-imbalance", "1.25").output
    assert ("experts: 8 routed, top-2, dropless; EP 8, ETP 1, alltoall dispatcher, grouped GEMM; load imbalance 1.25 "
            "planned for (1 = balanced)") in text
    default = ok("memory", *MIXTRAL, "--gpus", "8", "--ep", "8", "--gbs", "8").output
    assert "EP 8, ETP 1 (= TP), allgather dispatcher, one GEMM per expert; load imbalance 1 planned for" in default
    dense = ok("plan", "--model", "gpt3-125m", "--gpus", "8", "--gbs", "8").output
    assert "experts" not in dense and "imbalance" not in dense


def test_json_carries_the_expert_plan_and_imbalance():
    doc = json.loads(ok("plan", *EP8, "--moe-load-imbalance", "1.25", "--json").output)
    plan = doc["plan"]
    assert (plan["expert_model_parallel_size"], plan["expert_tensor_parallel_size"]) == (8, 1)
    assert plan["moe_token_dispatcher_type"] == "alltoall" and plan["moe_grouped_gemm"] is True
    assert doc["moe_load_imbalance"] == 1.25
    assert "--expert-model-parallel-size 8" in doc["megatron_args"]
    assert doc["transformer_config"]["num_moe_experts"] == 8
    memory = json.loads(ok("memory", *EP8, "--json").output)
    assert memory["plan"]["expert_model_parallel_size"] == 8 and memory["moe_load_imbalance"] == 1.0
    dense = json.loads(ok("memory", "--model", "gpt3-125m", "--json").output)
    assert "moe_load_imbalance" not in dense


def test_megatron_args_with_experts_give_the_same_plan_as_the_flags(tmp_path):
    flags = json.loads(ok("plan", *EP8, "--json").output)
    path = tmp_path / "run.sh"
    path.write_text("\n".join(["#!/bin/bash", " \\\n  ".join(flags["megatron_args"]).replace(
        "--num-layers", "torchrun --nnodes 2 --nproc-per-node 8 pretrain_gpt.py --num-layers", 1)]))
    read = json.loads(ok("plan", *MIXTRAL, "--megatron-args", str(path), "--json").output)
    assert read["plan"] == flags["plan"] and read["iteration_time_s"] == flags["iteration_time_s"]
    # the simulator's own assumption may sit beside the file
    imbalanced = json.loads(ok("plan", *MIXTRAL, "--megatron-args", str(path), "--moe-load-imbalance", "1.5",
                               "--json").output)
    assert imbalanced["moe_load_imbalance"] == 1.5


def test_help_says_mfu_and_days_count_active_parameters():
    for command in ("plan", "search"):
        text = " ".join(ok(command, "--help").output.split())
        assert "count the active parameters" in text
        for flag in ("--expert-model-parallel-size", "--ep", "--expert-tensor-parallel-size", "--etp",
                     "--moe-load-imbalance"):
            assert flag in text
    memory = ok("memory", "--help").output
    assert "--moe-token-dispatcher-type" in memory and "--moe-grouped-gemm / --no-moe-grouped-gemm" in memory


VALUES = {
    "--ep": st.sampled_from(["1", "2", "3", "4", "8", "16", "0", "-1", "x", "1e3"]),
    "--etp": st.sampled_from(["1", "2", "3", "8", "16", "0"]),
    "--tp": st.sampled_from(["1", "2", "4", "8"]),
    "--gpus": st.sampled_from(["1", "2", "8", "12", "16"]),
    "--moe-load-imbalance": st.sampled_from(["1", "1.3", "0.99", "0", "-2", "inf", "nan", "abc", "1001"]),
    "--moe-token-dispatcher-type": st.sampled_from(["alltoall", "allgather", "flex", ""]),
}


@settings(max_examples=40, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
@given(model=st.sampled_from(["mixtral-8x7b", "qwen1.5-moe-a2.7b", "deepseek-v3-style", "gpt3-125m"]),
       flags=st.lists(st.sampled_from(sorted(VALUES)), max_size=4, unique=True), data=st.data(),
       switches=st.lists(st.sampled_from(["--sp", "--moe-grouped-gemm", "--no-moe-grouped-gemm"]), max_size=2,
                         unique=True))
def test_random_moe_flags_answer_or_refuse_in_one_sentence(model, flags, data, switches):
    args = ["memory", "--model", model, "--cluster", "dgx-h100", "--json"]
    for flag in flags:
        args += [flag, data.draw(VALUES[flag])]
    result = CliRunner().invoke(cli, args + switches)
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), (args, result.exception)
    if result.exit_code == 0:
        doc = json.loads(result.stdout)
        assert doc["plan"]["expert_model_parallel_size"] >= 1
    else:
        assert result.exit_code == 2, (args, result.output)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), (args, result.stderr)


def test_search_holds_the_pinned_expert_layout():
    from simulator.planner.plan_search import SearchPins, SearchRequest, search

    req = SearchRequest(model=load_model("mixtral-8x7b"), cluster=load_cluster("dgx-h100"), num_gpus=16,
                        global_batch_size=64, finalists=4,
                        pins=SearchPins(tensor_parallel_size=2, pipeline_parallel_size=1, context_parallel_size=1,
                                        expert_model_parallel_size=4, expert_tensor_parallel_size=1))
    result = search(req, top=3)
    assert result.plans
    for r in result.plans:
        assert (r.plan.expert_model_parallel_size, r.plan.expert_tp_size) == (4, 1)
        assert r.plan.sequence_parallel  # EP beside TP needs SP (Megatron's rule)


def test_the_moe_ep_figure_of_a_plan(tmp_path):
    out = tmp_path / "ep.png"
    ok("plot", "moe-ep", "--model", "mixtral-8x7b", "--cluster", "dgx-h100", "--gpus", "64", "--pp", "4",
       "--gbs", "256", "--recompute-granularity", "full", "--use-distributed-optimizer", "--out", str(out))
    assert out.stat().st_size > 10_000
    refused("plot", "moe-ep", "--gpus", "8", "--gbs", "8", "--out", str(tmp_path / "dense.png"), needle="dense")


@pytest.mark.parametrize("seq", ["1", "2", "4"])
@pytest.mark.parametrize("as_json", [[], ["--json"]])
def test_a_sequence_shorter_than_the_tp_group_under_sp_is_refused_not_nan(seq, as_json):
    """Under SP each TP rank holds seq / TP tokens: with 4 tokens over 8 ranks Megatron cannot split the
    sequence, and the simulator used to cost GEMMs of zero tokens (0/0: 'compute nan s', a JSON traceback)."""
    refused("plan", "--model", "mixtral-8x7b", "--seq-length", seq, "--tp", "8", "--ep", "2", "--etp", "1", "--sp",
            "--gbs", "8", *as_json, needle=f"seq_length={seq}")
    doc = json.loads(ok("plan", "--model", "mixtral-8x7b", "--seq-length", "8", "--tp", "8", "--ep", "2", "--etp",
                        "1", "--sp", "--gbs", "8", "--json").output)
    assert doc["breakdown"]["compute_s"] > 0


def test_the_search_never_splits_a_sequence_tp_does_not_divide():
    doc = json.loads(ok("search", "--model", "gpt3-350m", "--seq-length", "12", "--gpus", "8", "--gbs", "8", "--json",
                        "--all", "--top", "3").output)
    assert doc["plans"]
    for p in [*doc["plans"], *doc["screened_plans"]]:
        plan = p["plan"] if "plan" in p else p
        if plan.get("sequence_parallel"):
            assert 12 % plan["tensor_parallel_size"] == 0, plan
    refused("search", "--model", "gpt3-350m", "--seq-length", "12", "--gpus", "8", "--gbs", "8", "--tp", "8", "--sp",
            needle="seq_length=12")
