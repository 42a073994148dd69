"""Megatron flags in and out of the CLI: `plan --megatron-args FILE|-`, Megatron's flags typed on the plan
line, `plan --launch`, the launch keys of `plan/search --json`, the new plan flags, and bad input -> exit 2."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from simulator.cli import cli

LLAMA_70B = ["--model", "llama3-70b", "--cluster", "dgx-h100", "--gpus", "64", "--tp", "8", "--pp", "4", "--vpp", "5",
             "--sp", "--gbs", "128", "--use-distributed-optimizer", "--overlap-grad-reduce"]

LAUNCH = r"""#!/bin/bash
# Llama-3-70B on 8 nodes
export CUDA_DEVICE_MAX_CONNECTIONS=1
NCCL_DEBUG=WARN torchrun --nnodes 8 --nproc_per_node=8 --master-addr node0 pretrain_gpt.py \
    --num-layers 80 --hidden-size 8192 --num-attention-heads 64 \
    --group-query-attention --num-query-groups 8 --swiglu --ffn-hidden-size 28672 \
    --normalization RMSNorm --position-embedding-type rope --untie-embeddings-and-output-weights \
    --disable-bias-linear --attention-dropout 0.0 --hidden-dropout 0.0 \
    --seq-length 8192 --max-position-embeddings 8192 --vocab-size 128256 --make-vocab-size-divisible-by 32 \
    --tensor-model-parallel-size 8 --pipeline-model-parallel-size 4 --num-layers-per-virtual-pipeline-stage 4 \
    --sequence-parallel --micro-batch-size 1 --global-batch-size 128 --bf16 \
    --use-distributed-optimizer --overlap-grad-reduce \
    --lr 1.5e-4 --train-iters 1000 --data-path $DATA --use-fancy-kernel 3
"""


def run(*args: str, input: str | None = None):
    return CliRunner().invoke(cli, list(args), input=input)


def _json(result) -> dict:
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


@pytest.fixture(scope="module")
def reference() -> dict:
    return _json(run("plan", *LLAMA_70B, "--json"))


def test_a_launch_file_predicts_the_job_it_runs(tmp_path, reference):
    path = tmp_path / "llama70b.sh"
    path.write_text(LAUNCH)
    doc = _json(run("plan", "--cluster", "dgx-h100", "--megatron-args", str(path), "--json"))
    assert doc["iteration_time_s"] == reference["iteration_time_s"]
    assert doc["memory"]["peak_bytes"] == reference["memory"]["peak_bytes"]
    assert doc["plan"]["virtual_pipeline_stages"] == 5 and doc["plan"]["data_parallel_size"] == 2
    assert doc["model"] == "llama70b"
    assert any("--use-fancy-kernel" in n for n in doc["notes"])
    assert not any("--lr" in n or "--data-path" in n for n in doc["notes"])  # known, and beside the speed


def test_standard_input_and_inline_flags_read_the_same(reference):
    from_stdin = _json(run("plan", "--cluster", "dgx-h100", "--megatron-args", "-", "--json", input=LAUNCH))
    flags = reference["megatron_args"]
    inline = _json(run("plan", "--cluster", "dgx-h100", "--gpus", "64", *" ".join(flags).split(), "--json"))
    for doc in (from_stdin, inline):
        assert doc["iteration_time_s"] == reference["iteration_time_s"]


def test_the_flags_plan_prints_are_flags_plan_accepts(reference):
    """`simulator plan --num-layers ...` used to end in "No such option"."""
    doc = _json(run("plan", "--model", "llama3-70b", "--cluster", "dgx-h100", "--gpus", "64",
                    *" ".join(reference["megatron_args"]).split(), "--json"))
    assert doc["iteration_time_s"] == reference["iteration_time_s"]
    mixed = _json(run("plan", "--cluster", "dgx-h100", "--gpus", "8", "--num-layers", "4", "--hidden-size", "1024",
                      "--num-attention-heads", "16", "--tp", "2", "--sp", "--bf16", "--json"))
    assert mixed["plan"]["tensor_parallel_size"] == 2 and mixed["plan"]["sequence_parallel"] is True
    assert mixed["plan"]["precision"] == "bf16" and mixed["model"] == "megatron-flags"


def test_plan_json_and_launch_text_carry_the_launch(reference):
    assert reference["megatron_env"] == {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    assert all(isinstance(a, str) for a in reference["megatron_args"])
    assert reference["transformer_config"]["num_query_groups"] == 8
    assert reference["ddp_config"]["use_distributed_optimizer"] is True
    assert "normalization: rmsnorm" in reference["nemo_yaml"]
    text = run("plan", *LLAMA_70B, "--launch")
    assert text.exit_code == 0, text.output
    assert "CUDA_DEVICE_MAX_CONNECTIONS=1 torchrun --nnodes 8 --nproc-per-node 8 pretrain_gpt.py" in text.output
    assert "--attention-dropout 0 \\" in text.output and "NeMo config fragment:" in text.output


def test_search_json_keeps_its_keys_and_adds_the_launch():
    doc = _json(run("search", "--model", "gpt3-1.3b", "--gpus", "8", "--gbs", "32", "--top", "1", "--json"))
    assert isinstance(doc["megatron_args"], list) and all(isinstance(a, str) for a in doc["megatron_args"])
    assert isinstance(doc["nemo_yaml"], str)
    assert {"megatron_env", "megatron_notes", "transformer_config", "ddp_config", "gpt_model"} <= set(doc)
    assert "--attention-dropout 0.1" in doc["megatron_args"]


def test_new_plan_flags_reach_the_plan():
    doc = _json(run("plan", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "32", "--tp", "2", "--cp", "2",
                    "--cp-comm-type", "a2a", "--pp", "2", "--sp", "--tp-comm-overlap", "--gbs", "32",
                    "--decoder-first-pipeline-num-layers", "15", "--use-distributed-optimizer",
                    "--overlap-grad-reduce", "--overlap-param-gather", "--ddp-bucket-size", "10000000", "--json"))
    p = doc["plan"]
    assert (p["context_parallel_size"], p["cp_comm_type"], p["data_parallel_size"]) == (2, "a2a", 4)
    assert p["decoder_first_pipeline_num_layers"] == 15 and p["tp_comm_overlap"] and p["overlap_param_gather"]
    assert p["ddp_bucket_size"] == 10_000_000
    fsdp = _json(run("plan", "--model", "gpt3-1.3b", "--gpus", "8", "--data-parallel-sharding-strategy",
                     "optim_grads_params", "--precision", "fp16", "--accumulate-allreduce-grads-in-fp32",
                     "--account-for-loss-in-pipeline-split", "--json"))
    assert fsdp["plan"]["data_parallel_sharding_strategy"] == "optim_grads_params"
    assert fsdp["plan"]["accumulate_allreduce_grads_in_fp32"] is True
    assert "--use-megatron-fsdp" in fsdp["megatron_args"]


@pytest.mark.parametrize("args,needle", [
    (["--gpus", "64", "--tp", "8", "--cp", "3"], "cp(3)"),
    (["--gpus", "64", "--tp", "8", "--cp", "2", "--pp", "2", "--dp", "3"], "Invalid parallel dims"),
    (["--gpus", "8", "--tp", "8", "--tp-comm-overlap"], "tp_comm_overlap"),
    (["--gpus", "8", "--overlap-param-gather"], "overlap_param_gather"),
    (["--gpus", "8", "--data-parallel-sharding-strategy", "no_shard", "--use-distributed-optimizer"], "no_shard"),
    (["--gpus", "8", "--decoder-first-pipeline-num-layers", "3"], "pipeline_parallel_size > 1"),
    (["--gpus", "8", "--pp", "2", "--decoder-first-pipeline-num-layers", "3",
      "--account-for-loss-in-pipeline-split"], "cannot be combined"),
    (["--gpus", "8", "--tp", "8", "--cp", "2"], "Invalid parallel dims"),
    (["--model", "gpt3-1.3b", "--seq-length", "2050", "--gpus", "8", "--cp", "2"], "2 x 2"),
    (["--gpus", "8", "--precision", "bf16", "--cp-comm-type", "ring"], "ring"),
])
def test_bad_plan_flags_are_one_sentence_and_exit_2(args, needle):
    result = run("plan", *args)
    assert result.exit_code == 2, result.output
    assert needle in result.output and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1


@pytest.mark.parametrize("text,extra,needle", [
    ("--num-layers 24 --num-layers 32", [], "--num-layers 32 conflicts with --num-layers 24"),
    ("--num-layers x", [], "takes an integer"),
    ("--num-layers 24 --bf16 --fp16", [], "--fp16 conflicts with --bf16"),
    ("--recompute-activations --recompute-granularity full", [], "conflicts with --recompute-activations"),
    ("--num-layers 24 --num-experts 8 --multi-latent-attention", [], "not multi-latent attention"),
    ("--num-layers 24 --num-experts 8 --expert-model-parallel-size 3", [], "does not divide num_experts=8"),
    ("torchrun --nnodes 1:4 --nproc-per-node 8 pretrain_gpt.py --num-layers 24", [], "elastic"),
    ("torchrun $DIST pretrain_gpt.py --num-layers 24", [], "shell variable"),
    ("--num-layers $L", [], "shell variable"),
    ("", [], "no Megatron flags"),
    ("echo hello", [], "not a flag"),
    ("--num-layers 24 --hidden-size", [], "needs a value"),
    ("--bf16=1", [], "takes no value"),
    ("--recompute-granularity full --num-layers 24", [], "needs --recompute-method"),
    ("--pp 4 --decoder-first-pipeline-num-layers 5 --num-layers-per-virtual-pipeline-stage 2", [],
     "--num-virtual-stages-per-pipeline-rank"),
    ("--num-layers 24 --position-embedding-type alibi", [], "not one of"),
    ("--num-layers 24 --kv-channels 0", [], "--kv-channels takes a positive integer"),
    ("--num-layers 24 --pipeline-model-parallel-layout 'E|t*24|L'", [], "layout"),
    ("--num-layers 24 'unclosed", [], "quotes"),
    ("--num-layers 24 --tp 8", ["--tp", "8"], "not both"),
])
def test_bad_megatron_args_are_one_sentence_and_exit_2(tmp_path, text, extra, needle):
    path = tmp_path / "launch.sh"
    path.write_text(text)
    result = run("plan", "--megatron-args", str(path), *extra)
    assert result.exit_code == 2, result.output
    assert needle in result.output and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_missing_file_and_both_sources_exit_2(tmp_path):
    for args in (["--megatron-args", str(tmp_path / "nope.sh")],
                 ["--megatron-args", "-", "--num-layers", "24"]):
        result = run("plan", *args, input="--num-layers 24")
        assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1, result.output
