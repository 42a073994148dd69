"""How many parameters one GPU of each pipeline stage holds, dense and expert, as Megatron shards them.

The memory model counts their weights, gradients and optimizer state; the schedule sizes the
gradient buckets and the optimizer step from the same counts.
"""

from __future__ import annotations

from functools import lru_cache

from simulator.spec.model import ModelSpec, PositionEmbedding
from simulator.spec.plan import (
    Job,
    ParallelPlan,
)


@lru_cache(maxsize=4096)
def layer_parameters_per_rank(model: ModelSpec, tensor_parallel_size: int) -> int:
    """Parameters of one transformer layer on one TP rank.

    Column-parallel weights (QKV, fc1 and the SwiGLU gate) and their biases are split along the
    output dimension; row-parallel weights (attention projection, fc2) along the input dimension,
    with their biases replicated (added after the all-reduce); norms are replicated. Key/value heads
    are replicated when TP exceeds the query groups (grouped-query attention).
    """
    t, h = tensor_parallel_size, model.hidden_size
    f = model.ffn_size // t
    q = h // t
    kv = max(model.kv_size // t, model.head_dim)
    bias = model.add_bias_linear
    qkv = h * (q + 2 * kv) + ((q + 2 * kv) if bias or model.add_qkv_bias else 0)
    proj = q * h + (h if bias else 0)
    mlp_in = (2 if model.swiglu else 1) * (h * f + (f if bias else 0))
    mlp_out = f * h + (h if bias else 0)
    return qkv + proj + mlp_in + mlp_out + 2 * model.norm_parameters()


def moe_layer_parameters_per_rank(model: ModelSpec, plan: ParallelPlan) -> tuple[int, int]:
    """(dense, expert) parameters of one MoE layer on one rank.

    Dense: attention and the shared experts split over TP as a dense layer's, the norms, and the
    router (h x experts, replicated on every rank). Expert: the rank's ``num_experts / EP`` routed
    experts, each split over ETP as a column-parallel fc1 and a row-parallel fc2 (whose bias is
    replicated). Expert parameters are held by the expert-data-parallel ranks only, which is the
    group their gradients are reduced and their optimizer state sharded over.
    """
    return _moe_layer_parameters(model, *_expert_key(plan))


@lru_cache(maxsize=4096)
def _moe_layer_parameters(model: ModelSpec, t: int, ep: int, etp: int) -> tuple[int, int]:
    h = model.hidden_size
    attention = layer_parameters_per_rank(model, t) - _mlp_per_rank(model, model.ffn_size, t)
    dense = attention + h * model.num_experts
    if model.moe_shared_expert_intermediate_size:
        dense += _mlp_per_rank(model, model.moe_shared_expert_intermediate_size, t)
    expert = model.num_experts // ep * _mlp_per_rank(model, model.expert_ffn_size, etp)
    return dense, expert


def _mlp_per_rank(model: ModelSpec, ffn: int, t: int) -> int:
    f, h, bias = ffn // t, model.hidden_size, model.add_bias_linear
    return (2 if model.swiglu else 1) * (h * f + (f if bias else 0)) + f * h + (h if bias else 0)


def stage_moe_layers(job: Job, stage: int) -> int:
    """MoE layers among the stage's transformer layers."""
    return job.moe_layers_per_stage[stage]


def stage_expert_parameters(job: Job, stage: int) -> int:
    """Of ``stage_parameters``, the routed experts' (sharded over EP, replicated over EDP)."""
    n = stage_moe_layers(job, stage)
    return n * _moe_layer_parameters(job.model, *_expert_key(job.plan))[1] if n else 0


def _expert_key(plan: ParallelPlan) -> tuple[int, int, int]:
    return plan.tensor_parallel_size, plan.expert_model_parallel_size, plan.expert_tp_size


def stage_parameters(job: Job, stage: int) -> int:
    """Parameters one GPU of ``stage`` holds.

    The first stage also holds the vocabulary-parallel word embedding (v h / t) and the learned
    position table (replicated); the last stage the final norm and the output layer, which with tied
    embeddings and p > 1 is a second copy of the word embedding kept in sync by an all-reduce of its
    gradient (Megatron's embedding group); with p = 1 the two are one tensor.
    """
    model, plan = job.model, job.plan
    t, p = plan.tensor_parallel_size, plan.pipeline_parallel_size
    moe = stage_moe_layers(job, stage)
    n = (job.layers_per_stage[stage] - moe) * layer_parameters_per_rank(model, t)
    if moe:
        n += moe * sum(_moe_layer_parameters(model, *_expert_key(plan)))
    return n + sum(stage_outer_parameters(job, stage))


def stage_outer_parameters(job: Job, stage: int) -> tuple[int, int]:
    """Of ``stage_parameters``, those outside the transformer layers: (the embeddings the stage holds before its
    first layer, the final norm and output layer after its last); 0 where the stage holds none."""
    model, plan = job.model, job.plan
    p = plan.pipeline_parallel_size
    word = model.vocab_size * model.hidden_size // plan.tensor_parallel_size
    before = after = 0
    if stage == 0:
        before = word
        if model.position_embedding_type is PositionEmbedding.learned_absolute:
            before += model.seq_length * model.hidden_size
    if stage == p - 1:
        after = model.norm_parameters()
        if model.untie_embeddings_and_output_weights or p > 1:
            after += word
    return before, after


def _linear_weights(model: ModelSpec, ffn: int, t: int, attention: bool = True) -> int:
    """Weight matrices (no biases, norms or router) of one rank's attention (if ``attention``) and one MLP of
    inner size ``ffn``, split over ``t`` ranks: what Transformer Engine runs as FP8 GEMMs."""
    h, f = model.hidden_size, ffn // t
    mlp = (2 if model.swiglu else 1) * h * f + f * h
    if not attention:
        return mlp
    q, kv = model.q_size // t, max(model.kv_size // t, model.head_dim)
    return h * (q + 2 * kv) + q * h + mlp


def stage_fp8_parameters(job: Job, stage: int) -> tuple[int, int]:
    """(dense, expert) parameters of ``stage_parameters`` that are linear-layer weights, which
    ``fp8_param_gather`` keeps in FP8: every transformer layer's attention and MLP (or shared and routed
    experts') matrices; the embedding, output layer, norms, biases and router stay in the model's dtype."""
    model, plan = job.model, job.plan
    t = plan.tensor_parallel_size
    moe = stage_moe_layers(job, stage)
    dense = (job.layers_per_stage[stage] - moe) * _linear_weights(model, model.ffn_size, t)
    expert = 0
    if moe:
        shared = model.moe_shared_expert_intermediate_size
        attention = _linear_weights(model, 0, t)
        dense += moe * (attention + (_linear_weights(model, shared, t, attention=False) if shared else 0))
        per_rank = model.num_experts // plan.expert_model_parallel_size
        expert = moe * per_rank * _linear_weights(model, model.expert_ffn_size, plan.expert_tp_size, attention=False)
    return dense, expert
