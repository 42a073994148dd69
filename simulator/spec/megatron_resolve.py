"""What a read launch (``simulator.spec.megatron_args.Launch``) runs: the ModelSpec fields and plan options
it sets, with the values Megatron derives (the padded vocabulary, the SwiGLU MLP width, the global batch,
virtual stages from ``--num-layers-per-virtual-pipeline-stage``, the layer split of a pipeline layout) and
a note for each value taken from the base model or dropped as Megatron drops it."""

from __future__ import annotations

from typing import Any

from simulator.spec.errors import ConfigError
from simulator.spec.megatron_values import layer_freq, layout_split, tokenizer_vocab, window_size

Launch = Any  # simulator.spec.megatron_args.Launch, which imports this module


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
    elif tokenizer_vocab(tokenizer, v.get("x.tokenizer_model")) is not None:
        model["vocab_size"] = _padded_vocab(tokenizer_vocab(tokenizer, v.get("x.tokenizer_model")), multiple)
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


def _resolve_experts(v: dict[str, Any], model: dict[str, Any], layers: int) -> None:
    factor = v.get("x.moe_expert_capacity_factor")
    if factor is not None:
        model["moe_expert_capacity_factor"] = factor if factor >= 0 else None  # Megatron: negative = dropless
    freq = v.get("x.moe_layer_freq")
    if freq is not None:
        model["moe_layer_freq"] = layer_freq(freq, layers)


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
        options["pipeline_layer_split"] = layout_split(layout, pp)
