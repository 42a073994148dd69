"""Reading a Megatron-LM launch (a ``pretrain_gpt.py`` command line) into the model and plan it runs.

The text is what a user has: a launch script (its variables, arrays and if-blocks expanded by
``simulator.spec.shell_script``, which never runs anything) or a shell line with backslash
continuations and comments, perhaps with environment assignments and a launcher (``torchrun --nnodes 2
--nproc-per-node 8``, ``python -m torch.distributed.run``) before the script. The flags after it are read as Megatron's ``argparse``
reads them (exact names, ``--flag value`` or ``--flag=value``), with Megatron's defaults and derived
values (the padded vocabulary, the SwiGLU MLP width, the global batch, virtual stages from
``--num-layers-per-virtual-pipeline-stage``). The simulator's own plan flags (``--tp``, ``--pp``,
``--precision`` ...) are read too, so one line may mix both.

Flags the simulator does not model are ignored and listed in a note (optimizer, data, checkpoint and
logging flags silently); a flag given twice with different values, or two that contradict, is
refused in one sentence, which names the script line that holds the flag. The launch's own
``--save-interval`` and ``--async-save`` are read for the expected days. The result is a ``Launch``:
ModelSpec fields and the plan options ``simulator.cli.options.job_from_options`` reads (what they
resolve to is ``simulator.spec.megatron_resolve``; the text-valued flags, ``simulator.spec.megatron_values``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable

from simulator.spec import limits
from simulator.spec._io import read_text as read_file
from simulator.spec._io import short_repr
from simulator.spec.errors import ConfigError
from simulator.spec.megatron_values import layer_freq, window_size

_RAW = "any text"  # a kind: the flag's value is kept as written, a shell variable in it included

# (names, key, kind). The key's prefix says where the value goes: "m." a ModelSpec field, "p." a plan
# option of job_from_options, "x." a value resolved after every flag is read. The kind is int, float, a
# tuple of choices, or a constant that the flag stores (True / False / a string) without a value.
_FLAGS: tuple[tuple[tuple[str, ...], str, Any], ...] = (
    (("--num-layers",), "m.num_layers", int),
    (("--hidden-size",), "m.hidden_size", int),
    (("--num-attention-heads",), "m.num_attention_heads", int),
    (("--ffn-hidden-size",), "m.ffn_hidden_size", int),
    (("--seq-length", "--encoder-seq-length"), "m.seq_length", int),
    (("--max-position-embeddings",), "x.max_position_embeddings", int),
    (("--kv-channels",), "x.kv_channels", int),
    (("--vocab-size",), "x.vocab_size", int),
    (("--make-vocab-size-divisible-by",), "x.vocab_multiple", int),
    (("--tokenizer-type",), "x.tokenizer_type", str),
    (("--tokenizer-model",), "x.tokenizer_model", _RAW),
    (("--group-query-attention",), "x.group_query_attention", True),
    (("--num-query-groups",), "x.num_query_groups", int),
    (("--swiglu",), "m.swiglu", True),
    (("--normalization",), "m.normalization", ("LayerNorm", "RMSNorm")),
    (("--position-embedding-type",), "m.position_embedding_type", ("learned_absolute", "rope")),
    (("--use-rotary-position-embeddings",), "m.position_embedding_type", "rope"),
    (("--untie-embeddings-and-output-weights",), "m.untie_embeddings_and_output_weights", True),
    (("--disable-bias-linear",), "m.add_bias_linear", False),
    (("--attention-dropout",), "m.attention_dropout", float),
    (("--hidden-dropout",), "m.hidden_dropout", float),
    (("--tensor-model-parallel-size", "--tp"), "p.tensor_parallel_size", int),
    (("--pipeline-model-parallel-size", "--pp"), "p.pipeline_parallel_size", int),
    (("--context-parallel-size", "--cp"), "p.context_parallel_size", int),
    (("--cp-comm-type",), "p.cp_comm_type", ("p2p", "a2a", "allgather")),
    (("--data-parallel-size", "--dp"), "p.data_parallel_size", int),
    (("--num-virtual-stages-per-pipeline-rank", "--virtual-pipeline-model-parallel-size", "--vpp"),
     "p.virtual_pipeline_stages", int),
    (("--num-layers-per-virtual-pipeline-stage",), "x.layers_per_virtual_stage", int),
    (("--decoder-first-pipeline-num-layers",), "p.decoder_first_pipeline_num_layers", int),
    (("--decoder-last-pipeline-num-layers",), "p.decoder_last_pipeline_num_layers", int),
    (("--account-for-embedding-in-pipeline-split",), "p.account_for_embedding_in_pipeline_split", True),
    (("--account-for-loss-in-pipeline-split",), "p.account_for_loss_in_pipeline_split", True),
    (("--pipeline-model-parallel-layout",), "x.layout", str),
    (("--sequence-parallel", "--sp"), "p.sequence_parallel", True),
    (("--no-sequence-parallel", "--no-sp"), "p.sequence_parallel", False),
    (("--tp-comm-overlap",), "p.tp_comm_overlap", True),
    (("--overlap-p2p-communication",), "p.overlap_p2p_comm", True),
    (("--no-overlap-p2p-communication",), "p.overlap_p2p_comm", False),
    (("--micro-batch-size", "--mbs"), "p.micro_batch_size", int),
    (("--global-batch-size", "--gbs"), "p.global_batch_size", int),
    (("--recompute-granularity",), "p.recompute_granularity", ("full", "selective", "none")),
    (("--recompute-activations",), "p.recompute_granularity", "selective"),
    (("--recompute-method",), "p.recompute_method", ("uniform", "block")),
    (("--recompute-num-layers",), "p.recompute_num_layers", int),
    (("--use-distributed-optimizer",), "p.use_distributed_optimizer", True),
    (("--use-megatron-fsdp", "--use-custom-fsdp"), "x.megatron_fsdp", True),
    (("--data-parallel-sharding-strategy",), "x.sharding",
     ("no_shard", "optim", "optim_grads", "optim_grads_params")),
    (("--overlap-grad-reduce",), "p.overlap_grad_reduce", True),
    (("--overlap-param-gather",), "p.overlap_param_gather", True),
    (("--ddp-bucket-size",), "p.ddp_bucket_size", int),
    (("--bf16",), "x.precision", "bf16"),
    (("--fp16",), "x.precision", "fp16"),
    (("--precision",), "x.precision", ("bf16", "fp16", "fp32")),
    (("--accumulate-allreduce-grads-in-fp32",), "p.accumulate_allreduce_grads_in_fp32", True),
    (("--fp8-format",), "p.fp8_format", ("hybrid", "e4m3")),
    (("--transformer-impl",), "x.transformer_impl", ("transformer_engine", "local")),
    (("--attention-backend",), "p.attention_backend", ("auto", "flash", "fused", "unfused", "local")),
    (("--use-flash-attn",), "p.use_flash_attention", True),
    (("--qk-layernorm",), "m.qk_layernorm", True),
    (("--add-qkv-bias",), "m.add_qkv_bias", True),
    (("--rotary-base",), "m.rotary_base", int),
    (("--use-rope-scaling",), "x.use_rope_scaling", True),
    (("--rope-scaling-factor",), "x.rope_scaling_factor", float),
    (("--window-size",), "x.window_size", str),
    # what the gradients, the optimizer state and the gathered parameters are stored in
    (("--grad-reduce-in-bf16",), "p.grad_reduce_in_bf16", True),
    (("--fp8-param-gather",), "p.fp8_param_gather", True),
    (("--use-precision-aware-optimizer",), "p.use_precision_aware_optimizer", True),
    (("--main-grads-dtype",), "p.main_grads_dtype", ("fp32", "bf16")),
    (("--main-params-dtype",), "p.main_params_dtype", ("fp32", "fp16")),
    (("--exp-avg-dtype",), "p.exp_avg_dtype", ("fp32", "fp16", "bf16", "fp8")),
    (("--exp-avg-sq-dtype",), "p.exp_avg_sq_dtype", ("fp32", "fp16", "bf16", "fp8")),
    (("--no-store-param-remainders",), "p.store_param_remainders", False),
    # mixture of experts: the experts, then their layout (--ep, --etp and the others are the simulator's names)
    (("--num-experts",), "m.num_experts", int),
    (("--moe-router-topk",), "m.moe_router_topk", int),
    (("--moe-ffn-hidden-size",), "m.moe_ffn_hidden_size", int),
    (("--moe-shared-expert-intermediate-size",), "m.moe_shared_expert_intermediate_size", int),
    (("--moe-layer-freq",), "x.moe_layer_freq", str),
    (("--moe-expert-capacity-factor",), "x.moe_expert_capacity_factor", float),
    (("--moe-load-imbalance",), "m.moe_load_imbalance", float),
    (("--expert-model-parallel-size", "--ep"), "p.expert_model_parallel_size", int),
    (("--expert-tensor-parallel-size", "--etp"), "p.expert_tensor_parallel_size", int),
    (("--moe-token-dispatcher-type",), "p.moe_token_dispatcher_type", ("alltoall", "allgather")),
    (("--moe-grouped-gemm",), "p.moe_grouped_gemm", True),
    (("--no-moe-grouped-gemm",), "p.moe_grouped_gemm", False),
)
FLAGS: dict[str, tuple[str, Any]] = {name: (key, kind) for names, key, kind in _FLAGS for name in names}
# How often and how the launch saves checkpoints: read for the expected days (``Launch.checkpointing``), not
# flags of the plan, so the command line's own --save-interval and --async-save stay the plan command's.
_CHECKPOINT_FLAGS: dict[str, tuple[str, Any]] = {"--save-interval": ("g.save_interval", int),
                                                  "--async-save": ("g.async_save", True)}

# Flags that change what is trained, not how fast nor how much memory: read and dropped without a note.
_SILENT = re.compile(
    r"--(lr|min-lr|lr-.*|weight-decay.*|adam-.*|sgd-.*|optimizer|clip-grad|init-method-std|train-iters|"
    r"train-samples|eval-.*|data-.*|split|vocab-file|merge-file|save|save-.*|load|"
    r"no-load-.*|log-.*|tensorboard-.*|wandb-.*|seed|exit-.*|ckpt-.*|distributed-backend|"
    r"distributed-timeout-minutes|mock-data|use-mcore-models|no-gradient-accumulation-fusion|norm-epsilon|"
    r"rotary-percent|fp8-amax-.*|fp8-recipe|fp8-margin|fp8-interval|timing-log-.*|"
    r"num-workers|no-create-attention-mask-in-dataloader|use-checkpoint-args|"
    r"apply-layernorm-1p|"
    r"moe-aux-loss-coeff|moe-z-loss-coeff|moe-router-load-balancing-type|moe-router-dtype|"
    r"moe-router-score-function|moe-router-pre-softmax|moe-router-topk-scaling-factor|moe-router-enable-expert-bias|"
    r"moe-router-bias-update-rate|moe-token-drop-policy|moe-input-jitter-eps|moe-per-layer-logging)")
# Flags for layouts the simulator does not model: refused rather than dropped.
_UNMODELLED = {
    "--num-layers-per-encoder": "encoder-decoder models", "--multi-latent-attention": "multi-latent attention",
}
_LAUNCHERS = {"torchrun", "python", "python3", "-m", "torch.distributed.run", "torch.distributed.launch", "-u"}
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


@dataclass
class Launch:
    """A launch as read: values by key (see ``_FLAGS``), the GPU count its launcher gives, and notes."""

    values: dict[str, Any] = field(default_factory=dict)
    flag_of: dict[str, str] = field(default_factory=dict)
    gpus: int | None = None
    notes: list[str] = field(default_factory=list)
    launcher_variables: list[str] = field(default_factory=list)
    gpus_per_node: int | None = None  # the launcher's --nproc-per-node, else the cluster's

    def get(self, key: str, default: Any = None) -> Any:
        return self.values.get(key, default)

    def checkpointing(self) -> dict[str, Any]:
        """The launch's own --save-interval and --async-save, as ``GoodputSettings`` fields (those it gives)."""
        return {k[2:]: v for k, v in self.values.items() if k.startswith("g.")}


def _shown(raw: str) -> str:
    """A value as written, or cut to a line's width when it is longer."""
    return raw if len(raw) <= 60 else short_repr(raw, 60)


def _value(flag: str, kind: Any, raw: str) -> Any:
    if kind is _RAW:
        return raw
    if "$" in raw:
        raise ConfigError(f"{flag} {_shown(raw)} uses a shell variable the script does not set (or a command's "
                          "output); set it in the script or expand it first (bash -x prints the expanded command)")
    if kind in (int, float):
        try:
            value = kind(raw)
        except ValueError:
            raise ConfigError(f"{flag} takes {'an integer' if kind is int else 'a number'}, not "
                              f"{short_repr(raw, 60)}") from None
        if kind is int and value < 1:
            raise ConfigError(f"{flag} takes a positive integer, not {_shown(raw)}")
        return value
    if isinstance(kind, tuple) and raw not in kind:
        raise ConfigError(f"{flag} {_shown(raw)} is not one of {', '.join(kind)}")
    return raw


def _launcher_gpus(words: list[str], gpus_per_node: int | None) -> tuple[int | None, int | None, list[str]]:
    """(GPUs, GPUs per node, the shell variables that hide a count) of torchrun's --nnodes / --nproc-per-node."""
    nodes, per_node, hidden = None, None, []
    it = iter(range(len(words)))
    for i in it:
        name, _, inline = words[i].partition("=")
        name = name.replace("_", "-")
        if name not in ("--nnodes", "--nproc-per-node"):
            if name == "--standalone":
                nodes = nodes or 1
            continue
        raw = inline if inline else (words[i + 1] if i + 1 < len(words) else "")
        if not inline:
            next(it, None)
        if "$" in raw:
            hidden.append(f"{name} {raw}")  # the command line's --gpus or --nnodes may stand in for it
        elif name == "--nproc-per-node" and raw == "gpu":
            if gpus_per_node is None:
                raise ConfigError("torchrun's --nproc-per-node gpu needs the cluster's GPUs per node; give --gpus")
            per_node = gpus_per_node
        elif re.fullmatch(r"[0-9]{1,12}", raw) and int(raw) > 0:
            nodes, per_node = (int(raw), per_node) if name == "--nnodes" else (nodes, int(raw))
        else:
            raise ConfigError(f"torchrun's {name} {short_repr(raw, 40)} is not a fixed count (elastic ranges cannot be "
                              "simulated); give a number or --gpus")
    if per_node is None or any(h.startswith("--nnodes") for h in hidden):
        return None, per_node, hidden
    return (nodes or 1) * per_node, per_node, hidden


class _Lines:
    """Names the script line of the word a refusal is about, where the launch has more than one line."""

    def __init__(self, text: str) -> None:
        self.lines = text.split("\n") if "\n" in text.strip() else None

    def line(self, span: tuple[int, int], token: str) -> int:
        """The first line of ``span`` that holds ``token`` (a word of a quoted string or variable that spans
        lines), else the span's first."""
        pattern = re.compile(rf"(?<![\w-]){re.escape(token)}(?![\w-])")
        for n in range(max(span[0], 1), min(span[1], len(self.lines or ())) + 1):
            text = self.lines[n - 1]
            if not text.lstrip().startswith("#") and pattern.search(text):
                return n
        return span[0]

    def located(self, exc: ConfigError, span: tuple[int, int] | None, token: str) -> ConfigError:
        if self.lines is None or span is None or span[0] < 1:
            return exc
        return ConfigError(f"line {self.line(span, token)} of the launch script: {exc}")


def _listed(words: list[str], sep: str = " ", most: int = 20) -> str:
    """Up to ``most`` words, each cut to a line's width, and how many more there are."""
    shown = sep.join(w if len(w) <= 60 else f"{w[:40]}...({len(w):,} characters)" for w in words[:most])
    return shown + (f" (and {len(words) - most:,} more)" if len(words) > most else "")


def parse_launch(text: str, gpus_per_node: int | None = None) -> Launch:
    """Read a launch: launcher, flags and values (see the module docstring); bad input is a ConfigError that
    names the script line of the word it is about."""
    from simulator.spec.shell_script import read_launch

    script = read_launch(text)
    where = _Lines(text)
    launch = Launch(notes=list(script.notes), gpus_per_node=gpus_per_node)
    queues = script.variables.get("CUDA_DEVICE_MAX_CONNECTIONS")
    if queues is not None:  # the CUDA work queues decide which TP overlaps happen
        try:
            launch.values["p.cuda_device_max_connections"] = _value("CUDA_DEVICE_MAX_CONNECTIONS", int, queues)
        except ConfigError as exc:
            raise where.located(exc, script.variable_spans.get("CUDA_DEVICE_MAX_CONNECTIONS"),
                                "CUDA_DEVICE_MAX_CONNECTIONS") from None
    words, spans = script.words, script.spans
    start = 0
    while start < len(words) and (words[start] == "export" or _ASSIGNMENT.match(words[start])):
        start += 1
    words, spans = words[start:], spans[start:]
    py = next((i for i, w in enumerate(words) if w.endswith(".py")), None)
    if py is not None:
        try:
            launch.gpus, per_node, hidden = _launcher_gpus(words[:py], gpus_per_node)
        except ConfigError as exc:
            raise where.located(exc, spans[0], words[0]) from None
        launch.gpus_per_node = per_node or gpus_per_node
        launch.launcher_variables = hidden + [w for w in words[:py] if "$" in w and not w.startswith("--")
                                              and all(w not in h for h in hidden)]
        words, spans = words[py + 1:], spans[py + 1:]
    elif words and not words[0].startswith("-"):
        if script.handover is not None:
            name, line = script.handover
            raise ConfigError(f"line {line} of the launch script hands the launch to {short_repr(name, 80)}, which "
                              "this reader does not follow (no command here runs pretrain_gpt.py); give that script "
                              "to --megatron-args")
        if words[0] not in _LAUNCHERS:
            raise where.located(ConfigError(
                f"the Megatron command line starts with {short_repr(words[0], 40)}, not a flag or a launcher with "
                "pretrain_gpt.py; give the pretrain_gpt.py command"), spans[0], words[0])
    if not any(w.startswith("--") for w in words):
        raise ConfigError("no Megatron flags found; give a pretrain_gpt.py command line")
    ignored, stray, saves = [], [], False
    i = 0
    while i < len(words):
        at = i
        try:
            i = _read_word(launch, words, i, ignored, stray)
        except ConfigError as exc:
            raise where.located(exc, spans[at], words[at].partition("=")[0]) from None
        saves = saves or words[at].partition("=")[0] == "--save"
    if ignored:
        launch.notes.append("flags the simulator does not model (they may change time or memory, which the "
                            "prediction leaves out): " + _listed(list(dict.fromkeys(ignored)), ", "))
    if stray:
        launch.notes.append("ignored words that are not flags: " + _listed(stray))
    if "g.save_interval" in launch.values and not saves:
        launch.notes.append(f"--save-interval {launch.values['g.save_interval']} without --save: Megatron writes no "
                            "checkpoint, where the expected days count one at that interval")
    return launch


def _read_word(launch: Launch, words: list[str], i: int, ignored: list[str], stray: list[str]) -> int:
    """Read the flag (and its value) or stray word at ``i``; returns the index past it."""
    word = words[i]
    i += 1
    if not word.startswith("--"):
        if "$" in word:
            raise ConfigError(f"the command line uses the shell variable {short_repr(word, 40)}; expand it first "
                              "(bash -x prints the expanded command)")
        stray.append(word)
        return i
    name, eq, inline = word.partition("=")
    if name in _UNMODELLED:
        raise ConfigError(f"{name}: the simulator models GPTs with standard attention (dense or mixture of "
                          f"experts), not {_UNMODELLED[name]}")
    known = FLAGS.get(name) or _CHECKPOINT_FLAGS.get(name)
    if known is None:
        while i < len(words) and not re.match(r"^-[-A-Za-z]", words[i]):
            i += 1  # its values
        if not _SILENT.fullmatch(name):
            ignored.append(name)
        return i
    key, kind = known
    if kind in (int, float, str, _RAW) or isinstance(kind, tuple):
        if eq:
            raw = inline
        elif i < len(words) and not re.match(r"^-[-A-Za-z]", words[i]):
            raw, i = words[i], i + 1
        else:
            raise ConfigError(f"{name} needs a value")
        value = _value(name, kind, raw)
        if key == "g.save_interval" and value > limits.MAX_SAVE_INTERVAL:
            raise ConfigError(f"--save-interval {value:,} is more than {limits.MAX_SAVE_INTERVAL:,} iterations "
                              "(Megatron reads it as a C int); use a smaller interval")
    else:
        if eq:
            raise ConfigError(f"{name} takes no value (got {short_repr(word, 40)})")
        value = kind
    _store(launch, key, value, name)
    return i

def _store(launch: Launch, key: str, value: Any, flag: str) -> None:
    if key in launch.values and launch.values[key] != value:
        before = launch.flag_of[key]
        raise ConfigError(f"{_say(flag, value)} conflicts with {_say(before, launch.values[key])}; give one of them")
    launch.values[key] = value
    launch.flag_of[key] = flag


def _say(flag: str, value: Any) -> str:
    return flag if isinstance(value, bool) or (FLAGS.get(flag, (None, None))[1] == value) else f"{flag} {value}"


def read_text(source: str, stdin: Callable[[], str | bytes]) -> str:
    """The launch text of ``--megatron-args``: a file (a regular file of at most ``MAX_INPUT_FILE_BYTES``), or
    standard input for '-' (``stdin`` returns what it read: at most one byte past the bound, so more is refused
    without reading it all); binary input is refused in one sentence."""
    if source == "-":
        data = stdin()
        size = len(data) if isinstance(data, bytes) else len(data.encode("utf-8", "surrogatepass"))
        if size > limits.MAX_INPUT_FILE_BYTES:
            raise ConfigError(f"standard input holds more than the {limits.MAX_INPUT_FILE_BYTES:,} bytes a Megatron "
                              "launch may have; give the launch script")
        if isinstance(data, bytes):
            try:
                data = data.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise ConfigError(f"standard input is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset "
                                  f"{exc.start}); give a shell script") from None
        where = "standard input"
    else:
        data = read_file(source, "Megatron launch", fix="check the path")
        where = f"Megatron launch file {source!r}"
    if "\0" in data:
        raise ConfigError(f"{where} holds a NUL byte (at offset {data.index(chr(0)):,}), which no shell script does; "
                          "give the launch script as text")
    return data


# what the values resolve to (kept importable from here, where the reader began)
from simulator.spec.megatron_resolve import MEGATRON_ROPE_SCALING_FACTOR, resolve, swiglu_ffn  # noqa: E402

__all__ = ["FLAGS", "Launch", "MEGATRON_ROPE_SCALING_FACTOR", "layer_freq", "parse_launch", "read_text", "resolve",
           "swiglu_ffn", "window_size"]
