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
refused in one sentence. The result is a ``Launch``: ModelSpec fields and the plan options
``simulator.cli.options.job_from_options`` reads.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable

from simulator.spec.errors import ConfigError

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

# Flags that change what is trained, not how fast nor how much memory: read and dropped without a note.
_SILENT = re.compile(
    r"--(lr|min-lr|lr-.*|weight-decay.*|adam-.*|sgd-.*|optimizer|clip-grad|init-method-std|train-iters|"
    r"train-samples|eval-.*|data-.*|split|vocab-file|merge-file|tokenizer-model|save|save-.*|load|"
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


def _value(flag: str, kind: Any, raw: str) -> Any:
    if "$" in raw:
        raise ConfigError(f"{flag} {raw} uses a shell variable the script does not set (or a command's output); set "
                          "it in the script or expand it first (bash -x prints the expanded command)")
    if kind in (int, float):
        try:
            value = kind(raw)
        except ValueError:
            raise ConfigError(f"{flag} takes {'an integer' if kind is int else 'a number'}, not {raw!r}") from None
        if kind is int and value < 1:
            raise ConfigError(f"{flag} takes a positive integer, not {raw}")
        return value
    if isinstance(kind, tuple) and raw not in kind:
        raise ConfigError(f"{flag} {raw} is not one of {', '.join(kind)}")
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
        elif raw.isdigit() and int(raw) > 0:
            nodes, per_node = (int(raw), per_node) if name == "--nnodes" else (nodes, int(raw))
        else:
            raise ConfigError(f"torchrun's {name} {raw!r} is not a fixed count (elastic ranges cannot be "
                              "simulated); give a number or --gpus")
    if per_node is None or any(h.startswith("--nnodes") for h in hidden):
        return None, per_node, hidden
    return (nodes or 1) * per_node, per_node, hidden


def parse_launch(text: str, gpus_per_node: int | None = None) -> Launch:
    """Read a launch: launcher, flags and values (see the module docstring); bad input is a ConfigError."""
    from simulator.spec.shell_script import launch_variable, launch_words

    words, script_notes = launch_words(text)
    launch = Launch(notes=list(script_notes), gpus_per_node=gpus_per_node)
    queues = launch_variable(text, "CUDA_DEVICE_MAX_CONNECTIONS")
    if queues is not None:  # the CUDA work queues decide which TP overlaps happen
        launch.values["p.cuda_device_max_connections"] = _value("CUDA_DEVICE_MAX_CONNECTIONS", int, queues)
    while words and (words[0] == "export" or _ASSIGNMENT.match(words[0])):
        words = words[1:]
    script = next((i for i, w in enumerate(words) if w.endswith(".py")), None)
    if script is not None:
        launch.gpus, per_node, hidden = _launcher_gpus(words[:script], gpus_per_node)
        launch.gpus_per_node = per_node or gpus_per_node
        launch.launcher_variables = hidden + [w for w in words[:script] if "$" in w and not w.startswith("--")
                                              and all(w not in h for h in hidden)]
        words = words[script + 1:]
    elif words and not words[0].startswith("-"):
        if words[0] not in _LAUNCHERS:
            raise ConfigError(f"the Megatron command line starts with {words[0]!r}, not a flag or a launcher "
                              "with pretrain_gpt.py; give the pretrain_gpt.py command")
    if not any(w.startswith("--") for w in words):
        raise ConfigError("no Megatron flags found; give a pretrain_gpt.py command line")
    ignored, stray = [], []
    i = 0
    while i < len(words):
        word = words[i]
        i += 1
        if not word.startswith("--"):
            if "$" in word:
                raise ConfigError(f"the command line uses the shell variable {word}; expand it first "
                                  "(bash -x prints the expanded command)")
            stray.append(word)
            continue
        name, eq, inline = word.partition("=")
        if name in _UNMODELLED:
            raise ConfigError(f"{name}: the simulator models GPTs with standard attention (dense or mixture of "
                              f"experts), not {_UNMODELLED[name]}")
        if name not in FLAGS:
            while i < len(words) and not re.match(r"^-[-A-Za-z]", words[i]):
                i += 1  # its values
            if not _SILENT.fullmatch(name):
                ignored.append(name)
            continue
        key, kind = FLAGS[name]
        if kind in (int, float, str) or isinstance(kind, tuple):
            if eq:
                raw = inline
            elif i < len(words) and not re.match(r"^-[-A-Za-z]", words[i]):
                raw, i = words[i], i + 1
            else:
                raise ConfigError(f"{name} needs a value")
            value = _value(name, kind, raw)
        else:
            if eq:
                raise ConfigError(f"{name} takes no value (got {word!r})")
            value = kind
        _store(launch, key, value, name)
    if ignored:
        launch.notes.append("flags the simulator does not model (they may change time or memory, which the "
                            "prediction leaves out): " + ", ".join(dict.fromkeys(ignored)))
    if stray:
        launch.notes.append("ignored words that are not flags: " + " ".join(stray))
    return launch


def _store(launch: Launch, key: str, value: Any, flag: str) -> None:
    if key in launch.values and launch.values[key] != value:
        before = launch.flag_of[key]
        raise ConfigError(f"{_say(flag, value)} conflicts with {_say(before, launch.values[key])}; give one of them")
    launch.values[key] = value
    launch.flag_of[key] = flag


def _say(flag: str, value: Any) -> str:
    return flag if isinstance(value, bool) or (FLAGS.get(flag, (None, None))[1] == value) else f"{flag} {value}"


def _padded_vocab(size: int, multiple: int) -> int:
    return -(-size // multiple) * multiple


def swiglu_ffn(hidden: int) -> int:
    """Megatron's MLP width for ``--swiglu`` without ``--ffn-hidden-size``: 2/3 of 4h, down to a multiple of 64."""
    return int((4 * hidden * 2 / 3) / 64) * 64


def resolve(launch: Launch, base: Any, gpus: int | None,
            nnodes: int | None = None) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
    """(ModelSpec overrides, plan options, notes) for ``job_from_options``, on the base model ``base``.

    ``gpus`` and ``nnodes`` are the simulator's ``--gpus`` and ``--nnodes`` (nodes of the launcher's, else the
    cluster's, GPUs per node): given, they replace the launcher's count, with a note when they differ.
    """
    v, notes = launch.values, list(launch.notes)
    model = {k[2:]: val for k, val in v.items() if k.startswith("m.")}
    options = {k[2:]: val for k, val in v.items() if k.startswith("p.")}
    if nnodes is not None:
        per_node = launch.gpus_per_node
        if per_node is None:
            raise ConfigError(f"--nnodes {nnodes} needs the GPUs per node (torchrun's --nproc-per-node or the "
                              "cluster's); give --gpus instead")
        if gpus is not None and gpus != nnodes * per_node:
            raise ConfigError(f"--gpus {gpus} and --nnodes {nnodes} x {per_node} GPUs per node disagree; give one "
                              "of them")
        gpus = nnodes * per_node
    if launch.gpus is not None and gpus is not None and launch.gpus != gpus:
        notes.append(f"{gpus} GPUs from the command line, not the launcher's {launch.gpus}")
    n_gpus = gpus if gpus is not None else launch.gpus
    if n_gpus is None and launch.launcher_variables:
        raise ConfigError(f"the launcher's GPU count may be in the shell variable {launch.launcher_variables[0]}, "
                          "which the script does not set; set it, or give --gpus or --nnodes")
    if n_gpus is not None:
        options["gpus"] = n_gpus
    elif "data_parallel_size" not in options:
        notes.append("no GPU count (--gpus, or torchrun's --nnodes and --nproc-per-node): one data-parallel replica")
    tp = options.get("tensor_parallel_size", 1)
    hidden = model.get("hidden_size", base.hidden_size)
    heads = model.get("num_attention_heads", base.num_attention_heads)
    layers = model.get("num_layers", base.num_layers)
    # architecture Megatron derives
    if model.get("swiglu") and "ffn_hidden_size" not in model and base.ffn_hidden_size is None:
        model["ffn_hidden_size"] = swiglu_ffn(hidden)
    if v.get("x.group_query_attention"):
        model["num_query_groups"] = v.get("x.num_query_groups", 1)
    elif "x.num_query_groups" in v:
        notes.append("--num-query-groups is ignored without --group-query-attention (as Megatron does)")
    kv = v.get("x.kv_channels")
    if kv is not None and kv * heads != hidden:
        model["kv_channels"] = kv  # heads of their own size (Qwen3); hidden / heads needs no field
    _resolve_experts(v, model, layers)
    _resolve_attention(v, model, notes)
    multiple = v.get("x.vocab_multiple", 128) * tp
    tokenizer = v.get("x.tokenizer_type")
    if "x.vocab_size" in v:
        size = v["x.vocab_size"] + (1 if tokenizer == "NullTokenizer" else 0)  # it adds an end-of-document token
        model["vocab_size"] = _padded_vocab(size, multiple)
    elif tokenizer == "GPT2BPETokenizer":
        model["vocab_size"] = _padded_vocab(50257, multiple)
    elif "x.vocab_multiple" in v and base.vocab_size % multiple:
        model["vocab_size"] = _padded_vocab(base.vocab_size, multiple)
    else:
        which = f"tokenizer {tokenizer}" if tokenizer else "no tokenizer"
        notes.append(f"the flags do not give the vocabulary ({which}); using {base.vocab_size:,} from --model "
                     f"{base.name}, or give --vocab-size")
    max_pos = v.get("x.max_position_embeddings")
    seq = model.get("seq_length", base.seq_length)
    if max_pos is not None and max_pos != seq and model.get("position_embedding_type", "") != "rope":
        notes.append(f"the learned position table is counted at seq_length {seq}, not --max-position-embeddings "
                     f"{max_pos}")
    # precision and Transformer Engine
    precision = v.get("x.precision")
    if precision is None:
        precision = "fp32"
        notes.append("neither --bf16 nor --fp16: Megatron trains in fp32")
    options["precision"] = precision
    if v.get("x.transformer_impl") == "local":
        for key, what in (("fp8_format", "FP8"), ("tp_comm_overlap", "--tp-comm-overlap")):
            if options.get(key):
                raise ConfigError(f"{what} needs Transformer Engine, which --transformer-impl local turns off")
        if options.get("attention_backend") not in (None, "local", "unfused"):
            raise ConfigError(f"--transformer-impl local runs Megatron's own attention, not --attention-backend "
                              f"{options['attention_backend']}; use local or drop one of them")
        options["attention_backend"] = "local"
    # sharding: Megatron reads the strategy only for Megatron-FSDP
    sharding = v.get("x.sharding")
    if v.get("x.megatron_fsdp"):
        options["data_parallel_sharding_strategy"] = sharding or "no_shard"
    elif sharding is not None and sharding != "no_shard":
        notes.append(f"--data-parallel-sharding-strategy {sharding} is ignored without --use-megatron-fsdp "
                     "(as Megatron does)")
    # pipeline
    _resolve_pipeline(launch, options, model, layers, notes)
    if options.get("sequence_parallel") and tp == 1:
        options["sequence_parallel"] = False
        notes.append("--sequence-parallel is dropped at TP 1 (as Megatron does)")
    if options.get("recompute_granularity") == "full":
        for flag, key in (("--recompute-method", "recompute_method"),
                          ("--recompute-num-layers", "recompute_num_layers")):
            if key not in options:
                raise ConfigError(f"--recompute-granularity full needs {flag} (Megatron's rule)")
    if "global_batch_size" not in options:
        cp, pp = options.get("context_parallel_size", 1), options.get("pipeline_parallel_size", 1)
        dp = options.get("data_parallel_size") or (n_gpus // (tp * cp * pp) if n_gpus else 1)
        options["global_batch_size"] = options.get("micro_batch_size", 1) * max(dp, 1)
    return model, options, notes


MEGATRON_ROPE_SCALING_FACTOR = 8.0  # --rope-scaling-factor's default


def _resolve_attention(v: dict[str, Any], model: dict[str, Any], notes: list[str]) -> None:
    if v.get("x.use_rope_scaling"):
        model["rope_scaling_factor"] = v.get("x.rope_scaling_factor", MEGATRON_ROPE_SCALING_FACTOR)
    elif "x.rope_scaling_factor" in v:
        notes.append("--rope-scaling-factor is ignored without --use-rope-scaling (as Megatron does)")
    window = v.get("x.window_size")
    if window is not None:
        model["window_size"] = window_size(window)


def window_size(text: str) -> int:
    """The tokens before each token that ``--window-size`` lets it attend to: '(4096,0)', '4096,0' or '[4096, 0]'."""
    parts = [p for p in re.split(r"[\s,()\[\]]+", text) if p]
    if len(parts) == 2 and all(p.lstrip("-").isdigit() for p in parts) and int(parts[0]) > 0 and int(parts[1]) == 0:
        return int(parts[0])
    raise ConfigError(f"--window-size {text!r} is not a causal sliding window the simulator reads; write it as "
                      "'(W,0)' with W tokens before each token")


def _resolve_experts(v: dict[str, Any], model: dict[str, Any], layers: int) -> None:
    factor = v.get("x.moe_expert_capacity_factor")
    if factor is not None:
        model["moe_expert_capacity_factor"] = factor if factor >= 0 else None  # Megatron: negative = dropless
    freq = v.get("x.moe_layer_freq")
    if freq is not None:
        model["moe_layer_freq"] = layer_freq(freq, layers)


def layer_freq(text: str, layers: int) -> int | tuple[int, ...]:
    """``--moe-layer-freq`` as Megatron reads it: an integer k (every k-th layer, from the first), or a
    python-list expression such as '([0]*3+[1]*58)' or '[1,0,1,0]', evaluated here without ``eval``:
    list literals of 0 and 1, ``+`` between lists and ``*`` by a whole number."""
    if "[" not in text:
        try:
            return int(text)
        except ValueError:
            raise ConfigError(f"--moe-layer-freq {text} is neither a whole number nor a list pattern such as "
                              "'([0]*3+[1]*5)'") from None
    import ast

    def value(node: ast.AST) -> Any:
        if isinstance(node, ast.List):
            return [value(e) for e in node.elts]
        if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
            return node.value
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mult)):
            left, right = value(node.left), value(node.right)
            if isinstance(node.op, ast.Add) and isinstance(left, list) and isinstance(right, list):
                return left + right
            if isinstance(node.op, ast.Mult) and {type(left), type(right)} == {list, int}:
                times = left if isinstance(left, int) else right
                if 0 <= times <= 10 * layers + 1000:  # a bound, so a pattern cannot fill the memory
                    return (left if isinstance(left, list) else right) * times
        raise ValueError

    try:
        pattern = value(ast.parse(text.strip(), mode="eval").body)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        pattern = None
    if not isinstance(pattern, list) or any(x not in (0, 1) or isinstance(x, list) for x in pattern):
        raise ConfigError(f"--moe-layer-freq {text!r} is not a list pattern of 0s and 1s the simulator reads; write "
                          "it as '([0]*3+[1]*5)' or '[0,1,1]'")
    return tuple(pattern)


def _resolve_pipeline(launch: Launch, options: dict[str, Any], model: dict[str, Any], layers: int,
                      notes: list[str]) -> None:
    v = launch.values
    pp = options.get("pipeline_parallel_size", 1)
    uneven = (options.get("decoder_first_pipeline_num_layers") is not None
              or options.get("decoder_last_pipeline_num_layers") is not None)
    per_chunk = v.get("x.layers_per_virtual_stage")
    if per_chunk is not None:
        if "virtual_pipeline_stages" in options:
            raise ConfigError("--num-layers-per-virtual-pipeline-stage and --num-virtual-stages-per-pipeline-rank "
                              "cannot both be given (Megatron's rule); give one of them")
        if uneven:
            raise ConfigError("uneven pipeline stages need --num-virtual-stages-per-pipeline-rank, not "
                              "--num-layers-per-virtual-pipeline-stage (Megatron's rule)")
        total = layers + bool(options.get("account_for_embedding_in_pipeline_split")) + bool(
            options.get("account_for_loss_in_pipeline_split"))
        if total % pp or (total // pp) % per_chunk:
            raise ConfigError(f"--num-layers-per-virtual-pipeline-stage {per_chunk} does not divide the "
                              f"{total} layers over {pp} pipeline stages evenly; use a divisor of {total // pp}")
        options["virtual_pipeline_stages"] = total // pp // per_chunk
    if options.get("virtual_pipeline_stages", 1) <= 1:
        if options.get("overlap_p2p_comm"):
            notes.append("pipeline sends overlap only in the interleaved schedule (Megatron turns it off)")
        options["overlap_p2p_comm"] = False
    layout = v.get("x.layout")
    if layout is not None:
        options["pipeline_layer_split"] = _layout_split(layout, pp)


def _layout_split(layout: str, pp: int) -> tuple[int, ...]:
    """Transformer layers per stage of a ``--pipeline-model-parallel-layout`` with one chunk per stage."""
    text = layout.replace(",", "")
    for pattern in (r"\(([^)]+)\)\*(\d+)", r"(.)\*(\d+)"):
        text = re.sub(pattern, lambda x: x.group(1) * int(x.group(2)), text)
    stages = text.split("|")
    ok = (len(stages) == pp and set(text) <= set("EtL|") and stages[0].lstrip("E").count("E") == 0
          and all("E" not in s for s in stages[1:]) and all("L" not in s for s in stages[:-1])
          and stages[-1].rstrip("L").count("L") == 0)
    if not ok:
        raise ConfigError(f"--pipeline-model-parallel-layout {layout!r} is not one chunk of transformer layers per "
                          f"each of the {pp} stages with the embedding first and the loss last; the simulator "
                          "reads only that form")
    return tuple(s.count("t") for s in stages)


def read_text(source: str, stdin: Callable[[], str]) -> str:
    """The launch text of ``--megatron-args``: a file, or standard input for '-'."""
    if source == "-":
        return stdin()
    try:
        with open(source, encoding="utf-8") as f:
            return f.read()
    except OSError as exc:
        raise ConfigError(f"cannot read the Megatron command line {source!r}: {exc.strerror}; "
                          "check the path") from None
    except UnicodeDecodeError:
        raise ConfigError(f"the Megatron command line {source!r} is not UTF-8 text; give a shell script") from None
