"""A plan as the Megatron-LM flags and the NeMo config fragment that would run it."""

from __future__ import annotations

from simulator.plan import Job, RecomputeGranularity


def megatron_args(job: Job) -> list[str]:
    """`pretrain_gpt.py` arguments for the model and plan (Megatron-LM argument names)."""
    m, p = job.model, job.plan
    args = [
        f"--num-layers {m.num_layers}",
        f"--hidden-size {m.hidden_size}",
        f"--num-attention-heads {m.num_attention_heads}",
        f"--ffn-hidden-size {m.ffn_size}",
        f"--seq-length {m.seq_length}",
        f"--max-position-embeddings {m.seq_length}",
        f"--tensor-model-parallel-size {p.tensor_parallel_size}",
        f"--pipeline-model-parallel-size {p.pipeline_parallel_size}",
    ]
    if m.num_query_groups is not None and m.num_query_groups != m.num_attention_heads:
        args += ["--group-query-attention", f"--num-query-groups {m.num_query_groups}"]
    if m.swiglu:
        args.append("--swiglu")
    if m.normalization.value == "RMSNorm":
        args.append("--normalization RMSNorm")
    if m.position_embedding_type.value == "rope":
        args.append("--position-embedding-type rope")
    if m.untie_embeddings_and_output_weights:
        args.append("--untie-embeddings-and-output-weights")
    if not m.add_bias_linear:
        args.append("--disable-bias-linear")
    if p.interleaved:
        args.append(f"--num-layers-per-virtual-pipeline-stage {m.num_layers // (p.pipeline_parallel_size * p.virtual_pipeline_stages)}")
    if p.sequence_parallel:
        args.append("--sequence-parallel")
    args += [f"--micro-batch-size {p.micro_batch_size}", f"--global-batch-size {p.global_batch_size}"]
    g = p.recompute.granularity
    if g is not RecomputeGranularity.none:
        args.append(f"--recompute-granularity {g.value}")
    if g is RecomputeGranularity.full:
        args += [f"--recompute-method {p.recompute.method.value}", f"--recompute-num-layers {p.recompute.num_layers}"]
    if p.use_distributed_optimizer:
        args.append("--use-distributed-optimizer")
    if p.overlap_grad_reduce:
        args.append("--overlap-grad-reduce")
    if p.overlap_p2p_comm:
        args.append("--overlap-p2p-communication")
    if p.use_flash_attention:
        args.append("--use-flash-attn")
    args.append(f"--{p.precision.value}" if p.precision.value != "fp32" else "")
    return [a for a in args if a]


def nemo_layout(job: Job) -> tuple[int, int]:
    """(num_nodes, devices) for NeMo's Lightning trainer, which runs the same number of devices on every
    node, so nodes x devices must be the job's GPUs: whole nodes when the GPUs fill them, else the most
    devices per node that divide the GPUs and keep each tensor-parallel group inside one node."""
    n, per_node, t = job.num_gpus, job.cluster.gpus_per_node, job.plan.tensor_parallel_size
    devices = max(d for d in range(1, min(n, per_node) + 1) if n % d == 0 and (d % t == 0 or t > per_node))
    return n // devices, devices


def nemo_yaml(job: Job) -> str:
    """The `trainer`/`model` fragment of a NeMo Megatron GPT config."""
    m, p = job.model, job.plan
    g = p.recompute.granularity
    nodes, devices = nemo_layout(job)
    partial = []
    if nodes > 1 and devices != job.cluster.gpus_per_node:
        partial = [f"  # {job.num_gpus} GPUs do not fill {job.cluster.gpus_per_node}-GPU nodes: {nodes} nodes of {devices}"]
    lines = [
        "trainer:",
        *partial,
        f"  num_nodes: {nodes}",
        f"  devices: {devices}",
        f"  precision: {'bf16' if p.precision.value == 'bf16' else 16 if p.precision.value == 'fp16' else 32}",
        "model:",
        f"  micro_batch_size: {p.micro_batch_size}",
        f"  global_batch_size: {p.global_batch_size}",
        f"  tensor_model_parallel_size: {p.tensor_parallel_size}",
        f"  pipeline_model_parallel_size: {p.pipeline_parallel_size}",
        f"  virtual_pipeline_model_parallel_size: {p.virtual_pipeline_stages if p.interleaved else 'null'}",
        f"  sequence_parallel: {str(p.sequence_parallel).lower()}",
        f"  encoder_seq_length: {m.seq_length}",
        f"  num_layers: {m.num_layers}",
        f"  hidden_size: {m.hidden_size}",
        f"  ffn_hidden_size: {m.ffn_size}",
        f"  num_attention_heads: {m.num_attention_heads}",
        f"  activations_checkpoint_granularity: {g.value if g is not RecomputeGranularity.none else 'null'}",
        f"  activations_checkpoint_method: {p.recompute.method.value if g is RecomputeGranularity.full else 'null'}",
        f"  activations_checkpoint_num_layers: {p.recompute.num_layers if g is RecomputeGranularity.full else 'null'}",
        "  optim:",
        f"    name: {'distributed_fused_adam' if p.use_distributed_optimizer else 'fused_adam'}",
    ]
    return "\n".join(lines) + "\n"
