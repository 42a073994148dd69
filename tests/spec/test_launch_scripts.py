"""Launch scripts as users write them: variables, arrays, if-blocks and defaults expanded without running
anything; Megatron-LM's own GPT-3 175B and Llama-3-8B FP8 examples (as fixtures) plan without edits, and the
command line's --gpus / --nnodes win over the launcher's count."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from simulator.cli import cli
from simulator.spec.errors import ConfigError
from simulator.spec.megatron_args import parse_launch, resolve
from simulator.spec.shell_script import launch_words
from simulator.spec.units import GIB

FIXTURES = Path(__file__).parent / "fixtures"
GPT3 = FIXTURES / "megatron_gpt3_175b_distributed.sh"
LLAMA3_FP8 = FIXTURES / "megatron_llama3_8b_h100_fp8.sh"


def run(*args: str):
    return CliRunner().invoke(cli, list(args))


def _json(result) -> dict:
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_arrays_defaults_arithmetic_and_quoting():
    text = """
N=${N:-4}  # a default
PER=$((N * 2))
A=( --num-layers $N "--hidden-size 256" )
A+=("--tp" 2)
B=()
torchrun --nproc_per_node $PER x.py ${A[@]} "${B[@]}" --note "two words" --dp "$UNSET" 2>&1 | tee log
"""
    words, notes = launch_words(text)
    assert words == ["torchrun", "--nproc_per_node", "8", "x.py", "--num-layers", "4", "--hidden-size", "256",
                     "--tp", "2", "--note", "two words", "--dp", "$UNSET"]
    assert notes == []


def test_if_blocks_take_the_branch_bash_would_and_skip_what_they_cannot_decide():
    text = """
MODE=fp8
F=()
if [[ "$MODE" == "fp8" ]] && [ -n "$MODE" ]; then
  F+=(--fp8-format hybrid)
elif [[ "$MODE" == "bf16" ]]; then
  F+=(--bf16)
else
  F+=(--fp16)
fi
if [ -f /etc/passwd ]; then F+=(--fp16); fi
torchrun x.py ${F[@]}
"""
    words, notes = launch_words(text)
    assert words == ["torchrun", "x.py", "--fp8-format", "hybrid"]
    assert len(notes) == 1 and "if-block" in notes[0]


def test_nothing_is_executed(tmp_path):
    marker = tmp_path / "ran"
    text = f'OUT=$(touch {marker})\nrm -rf "{tmp_path}"\ntorchrun x.py --num-layers 2 --save "$OUT"\n'
    words, _ = launch_words(text)
    assert not marker.exists() and tmp_path.exists()
    assert words[-1] == f"$(touch {marker})"  # kept as written


def test_a_modelled_flag_on_an_unset_variable_is_one_sentence():
    with pytest.raises(ConfigError, match=r"\$LAYERS.*shell variable"):
        parse_launch("torchrun --nproc_per_node 8 x.py --num-layers $LAYERS")


def test_the_command_lines_gpus_and_nodes_win_over_the_launcher():
    launch = parse_launch("torchrun --nnodes $NODES --nproc_per_node 8 pretrain_gpt.py --tp 8", 8)
    with pytest.raises(ConfigError, match="--nnodes"):
        resolve(launch, _base(), None)
    _, options, _ = resolve(launch, _base(), None, nnodes=4)
    assert options["gpus"] == 32
    fixed = parse_launch("torchrun --nnodes 2 --nproc_per_node 8 pretrain_gpt.py --tp 8", 8)
    _, options, notes = resolve(fixed, _base(), 64)
    assert options["gpus"] == 64 and any("not the launcher's 16" in n for n in notes)
    with pytest.raises(ConfigError, match="disagree"):
        resolve(fixed, _base(), 64, nnodes=2)


def _base():
    from simulator.spec.catalog import PRESETS

    return PRESETS["gpt3-175b"]


def test_megatron_gpt3_175b_example_plans_without_edits():
    doc = _json(run("plan", "--megatron-args", str(GPT3), "--nnodes", "16", "--json"))
    plan = doc["plan"]
    assert (plan["tensor_parallel_size"], plan["pipeline_parallel_size"], plan["data_parallel_size"]) == (8, 16, 1)
    assert plan["precision"] == "fp16" and plan["global_batch_size"] == 1536 and doc["iteration_time_s"] > 0
    assert any("--rampup-batch-size" in n for n in doc["notes"])  # changes time: said, not silently dropped
    wide = _json(run("plan", "--megatron-args", str(GPT3), "--gpus", "1024", "--json"))
    assert wide["plan"]["data_parallel_size"] == 8
    alone = run("plan", "--megatron-args", str(GPT3))  # the script's one node cannot hold TP 8 x PP 16
    assert alone.exit_code == 2 and "Traceback" not in alone.output


def test_megatron_llama3_8b_fp8_example_fits_with_bf16_gradients(tmp_path):
    doc = _json(run("plan", "--cluster", "dgx-h100", "--megatron-args", str(LLAMA3_FP8), "--json"))
    plan, memory = doc["plan"], doc["memory"]
    assert plan["fp8_format"] == "hybrid" and plan["grad_reduce_in_bf16"] and plan["fp8_param_gather"]
    assert plan["data_parallel_size"] == 8 and plan["use_distributed_optimizer"] and plan["overlap_param_gather"]
    assert memory["fits"] and memory["peak_bytes"] <= 80 * GIB
    stage = memory["stages"][0]
    assert stage["gradients_bytes"] == 2 * stage["parameters"]  # bf16, not fp32
    assert "--rotary-base 1000000" in doc["megatron_args"] and "--grad-reduce-in-bf16" in doc["megatron_args"]
    # the same script without the two memory flags: fp32 gradients and bf16 weights, as Megatron would run it
    plain = tmp_path / "fp32_grads.sh"
    plain.write_text(LLAMA3_FP8.read_text().replace("    --grad-reduce-in-bf16\n", "")
                     .replace('        "--fp8-param-gather"\n', ""))
    fp32 = _json(run("plan", "--cluster", "dgx-h100", "--megatron-args", str(plain), "--json"))
    before = fp32["memory"]["stages"][0]
    assert before["gradients_bytes"] == 2 * stage["gradients_bytes"]
    assert before["weights_bytes"] > stage["weights_bytes"]
    assert fp32["memory"]["peak_bytes"] - memory["peak_bytes"] > 16 * 10**9


# --- the launch's own checkpoints --------------------------------------------------------------------

def test_the_launch_save_interval_is_simulated_with_the_best_one_beside_it(tmp_path):
    doc = _json(run("plan", "--megatron-args", str(GPT3), "--gpus", "1024", "--tokens", "300e9", "--json"))
    g, best = doc["goodput"], doc["goodput_optimal"]
    assert g["save_interval"] == 10000 and not g["save_interval_optimal"] and not g["async_save"]
    assert best["save_interval"] != 10000 and best["expected_days"] < g["expected_days"]
    assert "--save-interval 10000" in doc["megatron_args"]
    assert any("the launch's --save-interval" in n for n in doc["notes"])
    text = run("plan", "--megatron-args", str(GPT3), "--gpus", "1024", "--tokens", "300e9")
    assert f"optimal would be {best['save_interval']:,} iterations, {best['expected_days']:.1f} days" in text.output
    # the command line's flag wins, and says so
    given = _json(run("plan", "--megatron-args", str(GPT3), "--gpus", "1024", "--tokens", "300e9",
                      "--save-interval", "500", "--json"))
    assert given["goodput"]["save_interval"] == 500
    assert any("--save-interval 500 from the command line, not the launch's 10,000" in n for n in given["notes"])
    # --async-save in the script is read too
    async_script = tmp_path / "async.sh"
    async_script.write_text(GPT3.read_text().replace("    --save-interval 10000\n",
                                                     "    --save-interval 10000\n    --async-save\n"))
    saved = _json(run("plan", "--megatron-args", str(async_script), "--gpus", "1024", "--tokens", "300e9", "--json"))
    assert saved["goodput"]["async_save"] and "--async-save" in saved["megatron_args"]


def test_a_save_interval_past_megatrons_int_is_one_sentence(tmp_path):
    path = tmp_path / "launch.sh"
    path.write_text("--num-layers 2 --save-interval 4294967296 --save ckpt")
    result = run("plan", "--megatron-args", str(path))
    assert result.exit_code == 2 and "C int" in result.output and len(result.output.strip().splitlines()) == 1


# --- the tokenizer's vocabulary, and the line a refusal names ----------------------------------------

MIXTRAL = FIXTURES / "megatron_mixtral_8x7b_distributed.sh"
DEEPSEEK_SLURM = FIXTURES / "megatron_deepseek_v3_slurm.sh"
DEEPSEEK_TRAIN = FIXTURES / "megatron_deepseek_v3_train.sh"


def test_megatron_mixtral_example_takes_its_tokenizers_vocabulary():
    doc = _json(run("plan", "--cluster", "dgx-h100", "--megatron-args", str(MIXTRAL), "--json"))
    assert "--vocab-size 32000" in doc["megatron_args"]  # Llama 2's, not GPT-3's 51,200 of the default --model
    assert not any("vocabulary" in n for n in doc["notes"])
    # a comment that ends in a backslash ends at its line: the flags after it are read
    words, _ = launch_words(MIXTRAL.read_text())
    assert "--eval-iters" in words and "--no-load-rng" in words and "--save-interval" not in words


@pytest.mark.parametrize("flags,vocab,note", [
    ("--tokenizer-type HuggingFaceTokenizer --tokenizer-model meta-llama/Meta-Llama-3-8B", 128256, False),
    ("--tokenizer-type HuggingFaceTokenizer --tokenizer-model $TOKENIZER", 51200, True),
    ("--tokenizer-type SentencePieceTokenizer --tokenizer-model /data/spm.model", 51200, True),
    ("--tokenizer-type GPT2BPETokenizer", 50304, False),
])
def test_a_vocabulary_is_the_tokenizers_where_known_and_said_to_be_the_defaults_where_not(flags, vocab, note):
    model, _, notes = resolve(parse_launch(f"pretrain_gpt.py --num-layers 2 {flags}"), _base(), None)
    assert model.get("vocab_size", _base().vocab_size) == vocab
    assert any("using 51,200 from --model gpt3-175b" in n for n in notes) == note


def test_a_launch_handed_to_another_script_is_refused_at_the_line_that_hands_it_over():
    result = run("plan", "--megatron-args", str(DEEPSEEK_SLURM))
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1
    line = next(n for n, text in enumerate(DEEPSEEK_SLURM.read_text().splitlines(), 1) if text.startswith("srun"))
    assert f"line {line} " in result.output and "train_deepseekv3.sh" in result.output
    assert "mkdir" not in result.output


def test_a_refusal_names_the_line_that_holds_its_flag(tmp_path):
    result = run("plan", "--megatron-args", str(DEEPSEEK_TRAIN))
    lines = DEEPSEEK_TRAIN.read_text().splitlines()
    mla = next(n for n, text in enumerate(lines, 1) if "--multi-latent-attention" in text)
    assert result.exit_code == 2 and f"line {mla} of the launch script: --multi-latent-attention" in result.output
    # a flag given twice: the line of the second, inside an array of one flag a line
    twice = tmp_path / "twice.sh"
    twice.write_text("A=(\n  --num-layers 2\n  --hidden-size 64\n)\nB=(\n  --bf16\n  --num-layers 3\n)\n"
                     "torchrun pretrain_gpt.py ${A[@]} ${B[@]}\n")
    result = run("plan", "--megatron-args", str(twice))
    assert result.exit_code == 2 and "line 7 of the launch script: --num-layers 3 conflicts" in result.output
    # a one-line command needs no line
    with pytest.raises(ConfigError) as info:
        parse_launch("pretrain_gpt.py --num-layers 2 --num-layers 3")
    assert "line" not in str(info.value)
