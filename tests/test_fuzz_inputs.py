"""Property-based cases (hypothesis) for the input classes an outside fuzz broke: Hugging Face MoE configs
(absurd layer counts and layer lists included), the search's pinned dimensions and request-wide flags,
gradient bucket sizes, sequences shorter than the tensor- or expert-parallel groups, and launch scripts
(``--megatron-args``: nesting, variables that grow from themselves, huge words and lines, pipeline layouts
of absurd repeats, and devices, pipes, binary and oversized files in the script's place).

Every case ends in an answer or a refusal, as tests/test_fuzz.py states them (whose helpers run and check
each one): exit code 0 with strict JSON whose numbers hold the invariants, or exit code 2 with one sentence;
never a traceback, a NaN or a hang. And the search never answers where `plan` refuses: `plan` on the
search's best plan, with the search's own flags, gives the search's time.

`make test` runs a few dozen cases, the same on every machine; SIMULATOR_FUZZ_CASES=N scales them (new
random ones each run) as it does tests/test_fuzz.py's.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simulator.spec import limits
from simulator.spec.catalog import PRESETS
from tests import fuzz_tally
from tests.close import assert_close
from tests.test_fuzz import (
    CASES,
    DEADLINE,
    RANDOM,
    WEIRD_NUMBERS,
    Workdir,
    check_estimate,
    check_memory,
    check_ranked,
    invoke,
    job_flags,
    or_weird,
    strict_json,
)

# of SIMULATOR_FUZZ_CASES (400 in `make test`): these cases cost a search or a plan each
SHARES = {"hf moe": 0.06, "search pins": 0.03, "buckets": 0.03, "tiny sequences": 0.04, "launch scripts": 0.05}


def fuzz(name: str):
    return settings(max_examples=max(1, round(CASES * SHARES[name])), deadline=DEADLINE, derandomize=not RANDOM,
                    database=None, suppress_health_check=list(HealthCheck), print_blob=True)


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Workdir:
    return Workdir(tmp_path_factory.mktemp("fuzz-inputs"))


# A small mixture of experts, so a search over it takes a moment: 8 experts, top-2, every other layer MoE.
TINY_MOE = {"name": "tiny-moe", "num_layers": 4, "hidden_size": 256, "num_attention_heads": 8, "num_query_groups": 4,
            "ffn_hidden_size": 512, "vocab_size": 1024, "seq_length": 256, "swiglu": True, "normalization": "RMSNorm",
            "position_embedding_type": "rope", "untie_embeddings_and_output_weights": True,
            "add_bias_linear": False, "attention_dropout": 0.0, "hidden_dropout": 0.0, "num_experts": 8,
            "moe_router_topk": 2, "moe_ffn_hidden_size": 256, "moe_layer_freq": 2}


def _model(draw, work: Workdir, moe_only: bool = False) -> tuple[list[str], int]:
    """--model (a preset or the tiny MoE file) and the sequence length its answers have."""
    names = ["tiny", "tiny", "mixtral-8x7b", "qwen1.5-moe-a2.7b"] + ([] if moe_only else ["gpt3-125m", "gpt3-350m"])
    name = draw(st.sampled_from(names))
    if name == "tiny":
        return ["--model", work.file(".yaml", json.dumps(TINY_MOE))], TINY_MOE["seq_length"]
    return ["--model", name], PRESETS[name].seq_length


# --- Hugging Face MoE configs ---------------------------------------------------------------------

LAYER_COUNTS = [1, 2, 3, 24, 48, limits.MAX_LAYERS, limits.MAX_LAYERS + 1, 10**6, 10**12, 10**30, 10**400]


@st.composite
def hf_moe_configs(draw) -> dict:
    """A Mixtral, Qwen2-MoE or Qwen3-MoE config.json (or one whose names were dropped or say dense Llama),
    its layer count and layer lists often absurd, other keys now and then weird."""
    family = draw(st.sampled_from(["mixtral", "qwen2_moe", "qwen3_moe", "llama", "none"]))
    heads = draw(st.sampled_from([4, 8, 16]))
    layers = draw(or_weird(st.integers(1, 64), st.sampled_from(LAYER_COUNTS) | WEIRD_NUMBERS, p=3))
    doc = {"hidden_size": heads * draw(st.sampled_from([16, 64])), "num_attention_heads": heads,
           "num_key_value_heads": draw(st.sampled_from([heads, heads // 4, 1])),
           "intermediate_size": draw(st.sampled_from([256, 512, 5632])), "vocab_size": draw(st.sampled_from([1000,
                                                                                                              32000])),
           "max_position_embeddings": draw(st.sampled_from([128, 4096, 32768])), "num_hidden_layers": layers,
           "num_experts_per_tok": draw(or_weird(st.sampled_from([1, 2]), st.sampled_from([4, 9, 0]), p=4)),
           "hidden_act": "silu"}
    experts = draw(or_weird(st.sampled_from([2, 4, 8, 60]), WEIRD_NUMBERS | st.just(2**63), p=4))
    if family == "mixtral":
        doc.update(architectures=["MixtralForCausalLM"], model_type="mixtral", num_local_experts=experts)
    else:
        doc.update(num_experts=experts, moe_intermediate_size=draw(or_weird(st.sampled_from([128, 1408]), p=6)),
                   decoder_sparse_step=draw(or_weird(st.sampled_from([1, 2, 3]), st.just(10**9) | WEIRD_NUMBERS,
                                                     p=4)))
        n = layers if isinstance(layers, int) and not isinstance(layers, bool) and 0 < layers <= 64 else 24
        doc["mlp_only_layers"] = draw(or_weird(st.sampled_from([[], [0], [n - 1], [0, 1] * 50_000, None]),
                                               st.sampled_from([list(range(n)), [n], [-1], [10**12], [True], "0"]),
                                               p=4))
        if family != "qwen3_moe":
            doc["shared_expert_intermediate_size"] = draw(st.sampled_from([None, 512, 5632]))
        names = {"qwen2_moe": ("Qwen2MoeForCausalLM", "qwen2_moe"), "qwen3_moe": ("Qwen3MoeForCausalLM", "qwen3_moe"),
                 "llama": ("LlamaForCausalLM", "llama")}
        if family in names:
            doc.update(architectures=[names[family][0]], model_type=names[family][1])
        if family == "qwen3_moe":
            doc["head_dim"] = draw(st.sampled_from([32, 64, 128]))
    return doc


@pytest.mark.fuzz
@fuzz("hf moe")
@given(doc=hf_moe_configs(), plan=st.booleans(), data=st.data())
def test_hf_moe_configs_are_read_or_refused_at_once(work, doc, plan, data):
    path = work.file(".json", json.dumps(doc))
    result = invoke(["models", path, "--json"])
    fuzz_tally.count("fuzz inputs: hf moe config", f"exit {result.exit_code}")
    if result.exit_code:
        return
    listed = strict_json(result.stdout)
    assert listed, listed
    if not plan:
        return
    seq = data.draw(st.sampled_from(["64", "128"]))
    answer = invoke(["plan", "--model", path, "--seq-length", seq, "--gbs", "2", "--json"])
    fuzz_tally.count("fuzz inputs: hf moe plan", f"exit {answer.exit_code}")
    if answer.exit_code == 0:
        est = strict_json(answer.stdout)
        check_estimate(est, int(seq), 2, None)
        check_memory(est["memory"])


# --- the search's pins and settings ---------------------------------------------------------------

SEARCH_PINS = {"--tp": ["1", "2", "3", "4", "8", "16", "0"], "--pp": ["1", "2", "3", "4"], "--vpp": ["1", "2", "3"],
               "--mbs": ["1", "2", "3", "4"], "--cp": ["1", "2", "3", "4", "0", str(limits.MAX_GPUS + 1)],
               "--ep": ["1", "2", "4", "8", "3"], "--etp": ["1", "2", "4", "3"],
               "--recompute-granularity": ["none", "selective", "full"], "--precision": ["bf16", "fp16", "fp32"],
               "--fp8-format": ["hybrid", "e4m3"], "--attention-backend": ["auto", "flash", "fused", "unfused", "local"],
               "--seq-length": ["1", "2", "4", "12", "128", "4096"], "--moe-load-imbalance": ["1", "1.5", "0.5"],
               "--cluster": ["dgx-a100-80gb", "dgx-h100"]}
SEARCH_SWITCHES = ["--sp", "--no-sp", "--use-flash-attn", "--overlap-grad-reduce", "--use-distributed-optimizer",
                   "--no-distributed-optimizer"]
# the flags that set what every plan of the search takes, which `plan` must accept beside the best plan's
REQUEST_WIDE = ("--precision", "--fp8-format", "--attention-backend", "--moe-load-imbalance", "--cluster")


@pytest.mark.fuzz
@fuzz("search pins")
@given(gpus=st.sampled_from(["1", "2", "4", "8", "16"]), gbs=st.sampled_from(["4", "8", "16", "32"]),
       pins=st.dictionaries(st.sampled_from(sorted(SEARCH_PINS)), st.integers(0, 7), max_size=4),
       switches=st.lists(st.sampled_from(SEARCH_SWITCHES), max_size=3, unique=True), data=st.data())
def test_search_pins_answer_or_refuse_as_plan_does(work, gpus, gbs, pins, switches, data):
    model, seq_length = _model(data.draw, work)
    chosen = {flag: SEARCH_PINS[flag][i % len(SEARCH_PINS[flag])] for flag, i in pins.items()}
    if "--seq-length" in chosen:
        seq_length = int(chosen["--seq-length"])
    flags = [x for flag, value in chosen.items() for x in (flag, value)]
    result = invoke(["search", *model, "--gpus", gpus, "--gbs", gbs, "--top", "2", "--json", *flags, *switches])
    fuzz_tally.count("fuzz inputs: search pins", f"exit {result.exit_code}")
    if result.exit_code:
        return
    doc = strict_json(result.stdout)
    check_ranked(doc)
    for p in doc["plans"]:
        check_estimate(p, seq_length, int(gbs), None)
        assert p["memory"]["fits"]
    best = doc["plans"][0]
    # plan takes the best plan with every setting the search applied to all its plans, as the user gave them
    given_flags = [x for flag in REQUEST_WIDE if flag in chosen for x in (flag, chosen[flag])]
    given_flags += [s for s in switches if s == "--use-flash-attn"]
    seq = ["--seq-length", chosen["--seq-length"]] if "--seq-length" in chosen else []
    again = invoke(["plan", *model, *seq, "--gpus", gpus, *job_flags(best["plan"]), *given_flags, "--json"])
    assert again.exit_code == 0, (flags, switches, again.stderr)
    assert_close(strict_json(again.stdout)["iteration_time_s"], best["iteration_time_s"], hint=" ".join(flags))


# --- gradient buckets -----------------------------------------------------------------------------

BUCKETS = ["1", "2", "7", "1000", "1000000", "40000000", str(2**40), str(2**40 + 1), "0", "-1", "1e6", "x"]


@pytest.mark.fuzz
@fuzz("buckets")
@given(bucket=st.sampled_from(BUCKETS), model=st.sampled_from(["gpt3-125m", "gpt3-760m", "gpt3-1.3b", "mixtral-8x7b"]),
       layout=st.sampled_from([("1", "1", "8"), ("4", "2", "16"), ("2", "4", "32"), ("8", "1", "16"), ("1", "2", "4")]),
       extras=st.lists(st.sampled_from(["--use-distributed-optimizer", "--overlap-param-gather", "--trace",
                                        "--fsdp", "--vpp", "--megatron-args"]), max_size=3, unique=True))
def test_any_bucket_size_is_answered_at_once(work, bucket, model, layout, extras):
    tp, pp, gpus = layout
    parallel = ["--tp", tp, "--pp", pp, "--gbs", "16", "--overlap-grad-reduce"]
    if "--vpp" in extras and pp != "1":
        parallel += ["--vpp", "2"]
    if "--use-distributed-optimizer" in extras:
        parallel.append("--use-distributed-optimizer")
    if "--overlap-param-gather" in extras:
        parallel.append("--overlap-param-gather")
    if "--fsdp" in extras:
        parallel += ["--data-parallel-sharding-strategy", "optim_grads_params"]
    cluster = ["--cluster", "dgx-h100"] if model == "mixtral-8x7b" else []
    if model == "mixtral-8x7b" and tp != "1":
        parallel.append("--sp")  # EP beside TP needs it (Megatron's rule)
    if "--megatron-args" in extras:  # the same field from a launch file (which takes the plan flags' short names)
        launch = work.file(".sh", " ".join(["--ddp-bucket-size", bucket, "--bf16", *parallel]))
        args = ["plan", "--model", model, *cluster, "--gpus", gpus, "--megatron-args", launch, "--json"]
    else:
        args = ["plan", "--model", model, *cluster, "--gpus", gpus, *parallel, "--ddp-bucket-size", bucket, "--json"]
    if "--trace" in extras:
        args += ["--trace", work.output("file")]
    result = invoke(args)
    fuzz_tally.count("fuzz inputs: bucket sizes", f"exit {result.exit_code}")
    if result.exit_code == 0:
        est = strict_json(result.stdout)
        check_estimate(est, PRESETS[model].seq_length, 16, None)
        check_memory(est["memory"])


# --- sequences shorter than the parallel groups ---------------------------------------------------

@pytest.mark.fuzz
@fuzz("tiny sequences")
@given(seq=st.sampled_from(["1", "2", "3", "4", "6", "7", "8", "12", "16", "32"]),
       tp=st.sampled_from(["1", "2", "4", "8"]), ep=st.sampled_from([None, "1", "2", "4", "8"]),
       etp=st.sampled_from([None, "1", "2"]), cp=st.sampled_from([None, "2"]), mbs=st.sampled_from(["1", "2"]),
       command=st.sampled_from(["plan", "plan", "memory"]),
       switches=st.lists(st.sampled_from(["--sp", "--no-sp", "--moe-grouped-gemm", "--tp-comm-overlap"]), max_size=2,
                         unique=True),
       dispatcher=st.sampled_from([None, "alltoall", "allgather"]), imbalance=st.sampled_from([None, "1", "2.5"]),
       data=st.data())
def test_tiny_sequences_with_experts_and_sp_answer_or_refuse(work, seq, tp, ep, etp, cp, mbs, command, switches,
                                                             dispatcher, imbalance, data):
    model, _ = _model(data.draw, work, moe_only=True)
    args = [command, *model, "--cluster", "dgx-h100", "--seq-length", seq, "--tp", tp, "--mbs", mbs, "--gbs", "8",
            *switches, "--json"]
    for flag, value in (("--ep", ep), ("--etp", etp), ("--cp", cp), ("--moe-token-dispatcher-type", dispatcher),
                        ("--moe-load-imbalance", imbalance)):
        if value is not None:
            args += [flag, value]
    result = invoke(args)
    fuzz_tally.count(f"fuzz inputs: tiny sequences ({command})", f"exit {result.exit_code}")
    if result.exit_code:
        return
    doc = strict_json(result.stdout)
    if command == "memory":
        check_memory(doc)
        return
    check_estimate(doc, int(seq), 8, None)
    check_memory(doc["memory"])
    plan = doc["plan"]
    if plan["sequence_parallel"]:  # every TP rank holds whole tokens of each sequence
        assert int(seq) // plan["context_parallel_size"] % plan["tensor_parallel_size"] == 0, plan


# --- launch scripts -------------------------------------------------------------------------------

LAUNCH_FLAGS = "--num-layers 2 --hidden-size 64 --num-attention-heads 2 --seq-length 128 --bf16 --micro-batch-size 1"
NESTINGS = [0, 0, 1, 3, limits.MAX_SCRIPT_NESTING, limits.MAX_SCRIPT_NESTING + 1, 330]
STRAY_CONTROL = ["", "if ! ; then X=1; fi", "if [ 1 = 1 ]; then", "fi", "else", "if [[ -f /x ]]; then Y=2; fi",
                 "for i in 1 2; do Z=$i; done", "if [ 1 = 1 ]; then A=( --tp 1 ); fi", "case $X in a) ;; esac"]
LAYOUTS = [None, None, None, "t*2", "Et*2L", "t*99999999999", "(t*0)*99999999999", "(t*2|)*9999999999",
           "t*" + "9" * 5000]
SAVE_INTERVALS = [None, None, "10", "10", "0", "-3", "x", str(limits.MAX_SAVE_INTERVAL + 1), "9" * 5000]
WORD_CHARACTERS = "x$\"'({})=-# \n"


@st.composite
def launch_scripts(draw) -> str:
    """A script around a small launch, grown by the grammar the reader must bound: ifs and ${A:-...} defaults
    nested to and past the bound, a variable or array that doubles itself, a word or a line of $A megabytes long,
    a layout of absurd repeats, a save interval past Megatron's int, and stray control words."""
    flags = [LAUNCH_FLAGS]
    layout = draw(st.sampled_from(LAYOUTS))
    if layout is not None:
        flags.append(f"--pipeline-model-parallel-layout '{layout}'")
    interval = draw(st.sampled_from(SAVE_INTERVALS))
    if interval is not None:
        flags.append(f"--save-interval {interval}" + draw(st.sampled_from(["", " --async-save", " --save ckpt"])))
    lines = [draw(st.sampled_from(STRAY_CONTROL)), "A=x", "ARR=( a )"]
    doubling = draw(st.sampled_from([0, 3, 20, 40]))
    lines += [draw(st.sampled_from(["A=$A$A", 'ARR+=("${ARR[@]}" "${ARR[@]}")', "A+=$A", 'B="${ARR[*]}$B"']))
              for _ in range(doubling)]
    size = draw(st.sampled_from([0, 0, 1000, 100_000, 2_000_000]))
    if size:
        unit = draw(st.text(alphabet=WORD_CHARACTERS, min_size=1, max_size=6)) if draw(st.booleans()) else "$A "
        lines.append("W=" + (unit * (size // len(unit) + 1))[:size] if draw(st.booleans()) else
                     "torchrun pretrain_gpt.py " + (unit * (size // len(unit) + 1))[:size])
    depth, kind = draw(st.sampled_from(NESTINGS)), draw(st.sampled_from(["if", "default"]))
    launch = "torchrun pretrain_gpt.py " + " ".join(flags)
    if kind == "if":
        lines += ["if [ 1 = 1 ]; then"] * depth + [launch] + ["fi"] * depth
    else:
        lines += ["N=" + "${U:-" * depth + "2" + "}" * depth, launch.replace("--num-layers 2", "--num-layers $N")]
    return "\n".join(lines) + "\n"


def _read_or_refused(args: list[str], stdin: bytes | None = None):
    """Like ``invoke``, with standard input."""
    from click.testing import CliRunner

    from simulator.cli import cli
    from simulator.spec.errors import SimulatorError

    result = CliRunner().invoke(cli, args, input=stdin)
    assert result.exception is None or isinstance(result.exception, SystemExit), \
        f"{args}: {type(result.exception).__name__}: {result.exception}"
    assert result.exit_code in (0, 2), (args, result.exit_code, result.output[-2000:])
    if result.exit_code:
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), (args, result.stderr[-2000:])
        assert len(lines[0]) < 1000, lines[0][:200]  # one sentence, not the input echoed back
    return result


@pytest.mark.fuzz
@fuzz("launch scripts")
@given(script=launch_scripts(), source=st.sampled_from(["file", "file", "stdin", "device", "fifo", "folder", "large",
                                                         "binary", "nul"]))
def test_launch_scripts_are_read_or_refused_in_one_sentence(work, script, source):
    stdin = None
    if source == "file":
        path = work.file(".sh", script)
    elif source == "stdin":
        path, stdin = "-", script.encode()
    elif source in ("device", "fifo", "folder"):
        path = {"device": str(work.null), "fifo": str(work.fifo), "folder": str(work.root)}[source]
    elif source == "large":
        path = work.file(".sh", b"")
        with open(path, "wb") as f:
            f.truncate(limits.MAX_INPUT_FILE_BYTES + 1)
    else:
        path = work.file(".sh", bytes(range(256)) if source == "binary" else script.encode()[:100] + b"\0")
    result = _read_or_refused(["plan", "--megatron-args", path, "--json"], stdin)
    fuzz_tally.count(f"fuzz inputs: launch scripts ({source})", f"exit {result.exit_code}")
    if result.exit_code == 0:
        est = strict_json(result.stdout)
        check_estimate(est, 128, est["plan"]["global_batch_size"], None)
        check_memory(est["memory"])
