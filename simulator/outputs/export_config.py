"""A job as a config: the ``trainer``/``model`` fragment of NeMo's Megatron GPT config, and megatron-core's
``TransformerConfig``, ``DistributedDataParallelConfig`` and ``GPTModel`` arguments, each stating what the
simulation assumed under the names megatron-core 0.16 reads. The launch flags, the environment and what no
flag can say are ``simulator.outputs.export``'s, which this module reads.
"""

from __future__ import annotations

from typing import Any

from simulator.outputs.export import (
    _num,
    layout_string,
    megatron_notes,
    node_shape,
    uses_megatron_fsdp,
    vocab_multiple,
)
from simulator.spec.errors import ConfigError
from simulator.spec.model import Normalization, PositionEmbedding
from simulator.spec.plan import DataParallelSharding, Job, Precision, RecomputeGranularity


def _yaml(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def nemo_yaml(job: Job) -> str:
    """The ``trainer``/``model`` fragment of NeMo's Megatron GPT config (``megatron_gpt_config.yaml``) that,
    merged into the base config, trains the simulated model with the simulated layout. Keys that are
    megatron-core ``TransformerConfig`` fields (context parallelism, the uneven split) pass through
    NeMo to megatron-core under the same names."""
    m, p = job.model, job.plan
    g = p.recompute.granularity
    nodes, per_node = node_shape(job)
    notes = [n for n in megatron_notes(job) if "do not fill nodes" in n]
    precision = {"bf16": "bf16", "fp16": 16, "fp32": 32}[p.precision.value]
    activation = "fast-swiglu" if m.swiglu else "gelu"
    model = {
        "micro_batch_size": p.micro_batch_size,
        "global_batch_size": p.global_batch_size,
        "tensor_model_parallel_size": p.tensor_parallel_size,
        "pipeline_model_parallel_size": p.pipeline_parallel_size,
        "virtual_pipeline_model_parallel_size": p.virtual_pipeline_stages if p.interleaved else None,
        "context_parallel_size": p.context_parallel_size,
        "sequence_parallel": p.sequence_parallel,
        "encoder_seq_length": m.seq_length,
        "max_position_embeddings": m.seq_length,
        "num_layers": m.num_layers,
        "hidden_size": m.hidden_size,
        "ffn_hidden_size": m.ffn_size,
        "num_attention_heads": m.num_attention_heads,
        "num_query_groups": m.query_groups if m.query_groups != m.num_attention_heads else None,
        "normalization": "rmsnorm" if m.normalization is Normalization.rmsnorm else "layernorm",
        "activation": activation,
        "bias": m.add_bias_linear,
        "position_embedding_type": m.position_embedding_type.value,
        "share_embeddings_and_output_weights": not m.untie_embeddings_and_output_weights,
        "hidden_dropout": _num(m.hidden_dropout),
        "attention_dropout": _num(m.attention_dropout),
        "ffn_dropout": 0,
        "make_vocab_size_divisible_by": vocab_multiple(job),
        "use_flash_attention": p.use_flash_attention,
        "overlap_p2p_comm": p.overlap_p2p_comm and p.interleaved,
        "batch_p2p_comm": not (p.overlap_p2p_comm and p.interleaved),
        "activations_checkpoint_granularity": g.value if g is not RecomputeGranularity.none else None,
        "activations_checkpoint_method": p.recompute.method.value if g is RecomputeGranularity.full else None,
        "activations_checkpoint_num_layers": p.recompute.num_layers if g is RecomputeGranularity.full else None,
        "ub_tp_comm_overlap": p.tp_comm_overlap,
        "transformer_engine": True,
        "fp8": p.fp8_format is not None,
        "fp8_hybrid": p.fp8_format is not None and p.fp8_format.value == "hybrid",
        "fp8_e4m3": p.fp8_format is not None and p.fp8_format.value == "e4m3",
        "megatron_amp_O2": p.precision is not Precision.fp32,
    }
    if p.context_parallel_size > 1:
        model["cp_comm_type"] = p.cp_comm_type.value
    if m.kv_channels is not None and m.kv_channels * m.num_attention_heads != m.hidden_size:
        model["kv_channels"] = m.kv_channels
    if m.qk_layernorm:
        model["qk_layernorm"] = True
    model.update(_moe_config(job, nemo=True))
    for key, value in (("num_layers_in_first_pipeline_stage", p.decoder_first_pipeline_num_layers),
                       ("num_layers_in_last_pipeline_stage", p.decoder_last_pipeline_num_layers)):
        if value is not None:
            model[key] = value
    for key in ("account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split"):
        if getattr(p, key):
            model[key] = True
    if p.pipeline_layer_split is not None:
        model["pipeline_model_parallel_layout"] = layout_string(job)
    if m.position_embedding_type is PositionEmbedding.rope:
        model["rotary_base"] = m.rotary_base
    if m.add_qkv_bias:
        model["qkv_bias"] = True
    if m.window_size is not None:
        model["window_size"] = f"[{m.window_size}, 0]"
    if uses_megatron_fsdp(job):
        # NeMo 1.x's `fsdp: true` is PyTorch FSDP, not the Megatron-FSDP that was simulated: no key of this
        # config selects it, so the fragment says so instead of printing a key that runs another sharding
        notes.append(f"Megatron-FSDP ({p.sharding.value}) has no NeMo 1.x key (its `fsdp` is PyTorch FSDP, another "
                     "sharding): run this plan with the Megatron-LM launch or the Megatron-Bridge config "
                     "(--launch bridge)")
    optim = {"name": "mcore_distributed_optim" if p.sharding is DataParallelSharding.optim else "fused_adam",
             "overlap_grad_sync": p.overlap_grad_reduce, "overlap_param_sync": p.overlap_param_gather}
    lines = [f"# {n}" for n in notes] + [
        "trainer:",
        f"  num_nodes: {nodes}",
        f"  devices: {per_node}",
        f"  precision: {precision}",
        "model:",
        *(f"  {k}: {_yaml(v)}" for k, v in model.items()),
        "  optim:",
        *(f"    {k}: {_yaml(v)}" for k, v in optim.items()),
    ]
    if p.ddp_bucket_size is not None:
        lines.append(f"    bucket_cap_mb: {p.ddp_bucket_size * (4 if p.grad_bytes == 4 else 2) / 2**20:g}")
    return "\n".join(lines) + "\n"


def _moe_config(job: Job, nemo: bool = False) -> dict[str, Any]:
    """The experts and their layout under megatron-core's names (NeMo passes them through unchanged);
    empty for a dense model, whose outputs stay as they were."""
    m, p = job.model, job.plan
    if not m.is_moe:
        return {}
    freq = list(m.moe_layer_freq) if isinstance(m.moe_layer_freq, tuple) else m.moe_layer_freq
    return {
        "num_moe_experts": m.num_experts,
        "moe_router_topk": m.moe_router_topk,
        "moe_ffn_hidden_size": m.expert_ffn_size,
        "moe_shared_expert_intermediate_size": m.moe_shared_expert_intermediate_size,
        # a YAML flow list: NeMo reads it as the list megatron-core takes
        "moe_layer_freq": f"[{', '.join(map(str, freq))}]" if nemo and isinstance(freq, list) else freq,
        "moe_expert_capacity_factor": m.moe_expert_capacity_factor,
        "expert_model_parallel_size": p.expert_model_parallel_size,
        "expert_tensor_parallel_size": p.expert_tp_size,
        "moe_token_dispatcher_type": p.moe_token_dispatcher_type.value,
        "moe_grouped_gemm": p.moe_grouped_gemm,
    }


def transformer_config(job: Job) -> dict[str, Any]:
    """megatron-core ``TransformerConfig`` keyword arguments as JSON. Three values are Python objects in
    megatron-core and strings here: the dtypes ('bfloat16'), the activation ('gelu' or 'silu') and the
    attention backend ('auto', an ``AttnBackend`` name); ``megatron_core_kwargs`` turns them back."""
    m, p = job.model, job.plan
    g = p.recompute.granularity
    dtype = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}[p.precision.value]
    overlap = p.overlap_p2p_comm and p.interleaved
    extra = {"qk_layernorm": True} if m.qk_layernorm else {}
    if m.add_qkv_bias:
        extra["add_qkv_bias"] = True
    if m.window_size is not None:
        extra["window_size"] = [m.window_size, 0]  # a tuple in megatron-core; megatron_core_kwargs turns it back
    return {
        "num_layers": m.num_layers,
        "hidden_size": m.hidden_size,
        "num_attention_heads": m.num_attention_heads,
        "num_query_groups": m.query_groups,
        "ffn_hidden_size": m.ffn_size,
        "kv_channels": m.head_dim,
        "hidden_dropout": m.hidden_dropout,
        "attention_dropout": m.attention_dropout,
        "normalization": m.normalization.value,
        "add_bias_linear": m.add_bias_linear,
        "gated_linear_unit": m.swiglu,
        "activation_func": "silu" if m.swiglu else "gelu",
        "attention_backend": p.attention_backend.value,
        "tensor_model_parallel_size": p.tensor_parallel_size,
        "pipeline_model_parallel_size": p.pipeline_parallel_size,
        "virtual_pipeline_model_parallel_size": p.virtual_pipeline_stages if p.interleaved else None,
        "context_parallel_size": p.context_parallel_size,
        "cp_comm_type": p.cp_comm_type.value if p.context_parallel_size > 1 else None,
        "sequence_parallel": p.sequence_parallel,
        "tp_comm_overlap": p.tp_comm_overlap,
        "overlap_p2p_comm": overlap,
        "batch_p2p_comm": not overlap,
        "num_layers_in_first_pipeline_stage": p.decoder_first_pipeline_num_layers,
        "num_layers_in_last_pipeline_stage": p.decoder_last_pipeline_num_layers,
        "account_for_embedding_in_pipeline_split": p.account_for_embedding_in_pipeline_split,
        "account_for_loss_in_pipeline_split": p.account_for_loss_in_pipeline_split,
        "pipeline_model_parallel_layout": layout_string(job),
        "recompute_granularity": g.value if g is not RecomputeGranularity.none else None,
        "recompute_method": p.recompute.method.value if g is RecomputeGranularity.full else None,
        "recompute_num_layers": p.recompute.num_layers if g is RecomputeGranularity.full else None,
        "bf16": p.precision is Precision.bf16,
        "fp16": p.precision is Precision.fp16,
        "params_dtype": dtype,
        "pipeline_dtype": dtype,
        "fp8": p.fp8_format.value if p.fp8_format is not None else None,
        "transformer_impl": "transformer_engine",
        **extra,
        **_moe_config(job),
    }


def ddp_config(job: Job) -> dict[str, Any]:
    """megatron-core ``DistributedDataParallelConfig`` keyword arguments (all plain JSON)."""
    p = job.plan
    fsdp = uses_megatron_fsdp(job)
    return {
        "grad_reduce_in_fp32": p.grad_bytes == 4,
        "overlap_grad_reduce": p.overlap_grad_reduce,
        "overlap_param_gather": p.overlap_param_gather,
        "use_distributed_optimizer": p.shards_optimizer,
        "bucket_size": p.ddp_bucket_size,
        "use_megatron_fsdp": fsdp,
        "data_parallel_sharding_strategy": p.sharding.value if fsdp else "no_shard",
    }


def gpt_model_args(job: Job) -> dict[str, Any]:
    """The arguments of megatron-core's ``GPTModel`` beyond its ``TransformerConfig``."""
    m = job.model
    rope = {"rotary_base": m.rotary_base, "rope_scaling": m.rope_scaling_factor is not None,
            **({"rope_scaling_factor": m.rope_scaling_factor} if m.rope_scaling_factor is not None else {})}
    return {
        "vocab_size": m.vocab_size,
        "max_sequence_length": m.seq_length,
        "position_embedding_type": m.position_embedding_type.value,
        "share_embeddings_and_output_weights": not m.untie_embeddings_and_output_weights,
        **(rope if m.position_embedding_type is PositionEmbedding.rope else {}),
    }


def megatron_core_kwargs(config: dict[str, Any]) -> dict[str, Any]:
    """``transformer_config``'s JSON with megatron-core's Python values (torch dtypes, the activation
    function, ``AttnBackend``); needs torch and megatron-core (the ``megatron`` extra)."""
    try:
        import torch
        import torch.nn.functional as F
        from megatron.core.transformer.enums import AttnBackend
    except ImportError as exc:
        raise ConfigError(f"building a megatron-core config needs torch and megatron-core ({exc.name} is missing); "
                          "install the 'megatron' extra") from None
    out = dict(config)
    for key in ("params_dtype", "pipeline_dtype"):
        out[key] = getattr(torch, out[key])
    out["activation_func"] = {"gelu": F.gelu, "silu": F.silu}[out["activation_func"]]
    out["attention_backend"] = AttnBackend[out["attention_backend"]]
    if out.get("window_size") is not None:
        out["window_size"] = tuple(out["window_size"])
    return out
