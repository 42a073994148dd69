"""A job as the launch that runs it: Megatron-LM's ``pretrain_gpt.py`` flags and environment (the NeMo config
fragment and megatron-core's ``TransformerConfig`` / ``DistributedDataParallelConfig`` are
``simulator.outputs.export_config``'s).

Every output states everything the simulation assumed, with the names current Megatron-LM reads
(megatron-core 0.16 and its ``arguments.py``), so that a copied launch runs the simulated job:

- the architecture (Megatron's defaults are GPT-3's: LayerNorm, GeLU, learned positions, tied
  embeddings, biases and 0.1 dropout, so a Llama says each of its differences, and the dropouts are
  always printed);
- ``--attention-backend`` (``--use-flash-attn`` is only read by the legacy models);
- pipeline sends: the interleaved schedule overlaps them by default (``overlap_p2p_comm``), so a plan
  that blocks says ``--no-overlap-p2p-communication``; the non-interleaved schedule never overlaps
  them and has no flag (Megatron rejects the older ``--overlap-p2p-communication``);
- interleaving as ``--num-virtual-stages-per-pipeline-rank``, the one form valid with uneven splits;
- sharded data parallelism: ``optim`` is the distributed optimizer; ``optim_grads`` and
  ``optim_grads_params`` are Megatron-FSDP (``--use-megatron-fsdp``), which also needs the distributed
  optimizer and no gradient-accumulation fusion, and must not run with CUDA_DEVICE_MAX_CONNECTIONS=1;
- mixture of experts: the experts (``--num-experts``, ``--moe-router-topk``, ``--moe-ffn-hidden-size``,
  the shared experts, which layers have them as ``--moe-layer-freq``, an integer or Megatron's
  python-list pattern such as ``([0]*3+[1]*58)``, and the capacity factor when tokens are dropped)
  and their layout (``--expert-model-parallel-size``, ``--expert-tensor-parallel-size`` when it is not
  TP, the dispatcher, which Megatron defaults to allgather, and ``--moe-grouped-gemm``). The router's
  load balancing is Megatron's default (aux_loss) and is not printed; the load imbalance the plan
  assumes is the simulator's own and is stated in its output, not in the launch.

What no flag can say (the tokenizer, GPipe, a node that is not full) is in ``megatron_notes``.
"""

from __future__ import annotations

import shlex

from simulator.spec.model import PositionEmbedding
from simulator.spec.plan import Job, PipelineSchedule, Precision, RecomputeGranularity

MEGATRON_VOCAB_MULTIPLE = 128  # --make-vocab-size-divisible-by's default


def _num(x: float) -> str:
    return f"{x:g}"


def vocab_multiple(job: Job) -> int:
    """``--make-vocab-size-divisible-by``: the largest power of two up to Megatron's 128 whose multiple by
    TP divides the vocabulary, so Megatron pads a tokenizer of that size to exactly ``vocab_size``."""
    v, t = job.model.vocab_size, job.plan.tensor_parallel_size
    d = MEGATRON_VOCAB_MULTIPLE
    while d > 1 and v % (d * t):
        d //= 2
    return d


def uses_megatron_fsdp(job: Job) -> bool:
    return job.plan.sharding.megatron_fsdp


def layout_string(job: Job) -> str | None:
    """``--pipeline-model-parallel-layout`` for an explicit per-stage split ('Et*5|t*6|t*5L'), else None."""
    split = job.plan.pipeline_layer_split
    if split is None:
        return None
    stages = [f"t*{n}" for n in split]
    stages[0] = "E" + stages[0]
    stages[-1] += "L"
    return "|".join(stages)


def layer_freq_pattern(freq: tuple[int, ...]) -> str:
    """Megatron's python-list form of a per-layer 0/1 ``--moe-layer-freq``, as short as runs make it:
    (0, 0, 0, 1, ..., 1) -> '([0]*3+[1]*58)', (1, 0) x 12 -> '([1]+[0])*12'."""
    n = len(freq)
    period = next(p for p in range(1, n + 1) if n % p == 0 and freq == freq[:p] * (n // p))
    runs: list[list[int]] = []
    for x in freq[:period]:
        if runs and runs[-1][0] == x:
            runs[-1][1] += 1
        else:
            runs.append([x, 1])
    body = "+".join(f"[{x}]" + (f"*{k}" if k > 1 else "") for x, k in runs)
    return f"({body})" + (f"*{n // period}" if n // period > 1 else "")


def _moe_args(job: Job) -> list[str]:
    m, p = job.model, job.plan
    if not m.is_moe:
        return []
    args = [f"--num-experts {m.num_experts}", f"--moe-router-topk {m.moe_router_topk}",
            f"--moe-ffn-hidden-size {m.expert_ffn_size}"]
    if m.moe_shared_expert_intermediate_size:
        args.append(f"--moe-shared-expert-intermediate-size {m.moe_shared_expert_intermediate_size}")
    if isinstance(m.moe_layer_freq, tuple):
        args.append(f"--moe-layer-freq {shlex.quote(layer_freq_pattern(m.moe_layer_freq))}")
    elif m.moe_layer_freq != 1:
        args.append(f"--moe-layer-freq {m.moe_layer_freq}")
    if m.moe_expert_capacity_factor is not None:
        args.append(f"--moe-expert-capacity-factor {_num(m.moe_expert_capacity_factor)}")
    args.append(f"--expert-model-parallel-size {p.expert_model_parallel_size}")
    if p.expert_tensor_parallel_size is not None:
        args.append(f"--expert-tensor-parallel-size {p.expert_tensor_parallel_size}")
    args.append(f"--moe-token-dispatcher-type {p.moe_token_dispatcher_type.value}")
    if p.moe_grouped_gemm:
        args.append("--moe-grouped-gemm")
    return args


def _attention_variant_args(job: Job) -> list[str]:
    """What changes the model's attention beyond its shape: rope's base (Megatron's default is 10,000, so it is
    printed for every rope model), Llama 3.1's rope scaling, and a sliding window as (tokens before, after)."""
    m, args = job.model, []
    if m.position_embedding_type is PositionEmbedding.rope:
        args.append(f"--rotary-base {m.rotary_base}")
        if m.rope_scaling_factor is not None:
            args += ["--use-rope-scaling", f"--rope-scaling-factor {_num(m.rope_scaling_factor)}"]
    if m.window_size is not None:
        args.append(f"--window-size {shlex.quote(window_string(m.window_size))}")
    return args


def window_string(window: int) -> str:
    """``--window-size``'s tuple: tokens attended before each token and after it (none: causal)."""
    return f"({window},0)"


def megatron_args(job: Job, save_interval: int | None = None, async_save: bool = False) -> list[str]:
    """``pretrain_gpt.py`` arguments for the model and plan, one flag (with its value) per string; with
    ``save_interval``, the checkpoint interval in iterations (``simulator.estimator.goodput``), and with
    ``async_save`` Megatron's asynchronous save."""
    m, p = job.model, job.plan
    args = [
        f"--num-layers {m.num_layers}",
        f"--hidden-size {m.hidden_size}",
        f"--num-attention-heads {m.num_attention_heads}",
        f"--ffn-hidden-size {m.ffn_size}",
        f"--seq-length {m.seq_length}",
        f"--max-position-embeddings {m.seq_length}",
        f"--vocab-size {m.vocab_size}",
        f"--make-vocab-size-divisible-by {vocab_multiple(job)}",
    ]
    if m.query_groups != m.num_attention_heads:
        args += ["--group-query-attention", f"--num-query-groups {m.query_groups}"]
    if m.kv_channels is not None and m.kv_channels * m.num_attention_heads != m.hidden_size:
        args.append(f"--kv-channels {m.kv_channels}")
    if m.qk_layernorm:
        args.append("--qk-layernorm")
    args.append(f"--normalization {m.normalization.value}")
    if m.swiglu:
        args.append("--swiglu")
    args.append(f"--position-embedding-type {m.position_embedding_type.value}")
    if m.untie_embeddings_and_output_weights:
        args.append("--untie-embeddings-and-output-weights")
    if not m.add_bias_linear:
        args.append("--disable-bias-linear")
        if m.add_qkv_bias:
            args.append("--add-qkv-bias")
    args += _attention_variant_args(job)
    args += [f"--attention-dropout {_num(m.attention_dropout)}", f"--hidden-dropout {_num(m.hidden_dropout)}",
             f"--attention-backend {p.attention_backend.value}",
             f"--tensor-model-parallel-size {p.tensor_parallel_size}",
             f"--pipeline-model-parallel-size {p.pipeline_parallel_size}"]
    args += _moe_args(job)
    if p.context_parallel_size > 1:
        args += [f"--context-parallel-size {p.context_parallel_size}", f"--cp-comm-type {p.cp_comm_type.value}"]
    if p.interleaved:
        args.append(f"--num-virtual-stages-per-pipeline-rank {p.virtual_pipeline_stages}")
        if not p.overlap_p2p_comm:
            args.append("--no-overlap-p2p-communication")
    for flag, value in (("--decoder-first-pipeline-num-layers", p.decoder_first_pipeline_num_layers),
                        ("--decoder-last-pipeline-num-layers", p.decoder_last_pipeline_num_layers)):
        if value is not None:
            args.append(f"{flag} {value}")
    if p.account_for_embedding_in_pipeline_split:
        args.append("--account-for-embedding-in-pipeline-split")
    if p.account_for_loss_in_pipeline_split:
        args.append("--account-for-loss-in-pipeline-split")
    layout = layout_string(job)
    if layout is not None:
        args.append(f"--pipeline-model-parallel-layout {shlex.quote(layout)}")  # '|' and '*' are shell syntax
    if p.sequence_parallel:
        args.append("--sequence-parallel")
    if p.tp_comm_overlap:
        args.append("--tp-comm-overlap")
    args += [f"--micro-batch-size {p.micro_batch_size}", f"--global-batch-size {p.global_batch_size}"]
    g = p.recompute.granularity
    if g is not RecomputeGranularity.none:
        args.append(f"--recompute-granularity {g.value}")
    if g is RecomputeGranularity.full:
        args += [f"--recompute-method {p.recompute.method.value}", f"--recompute-num-layers {p.recompute.num_layers}"]
    if p.shards_optimizer:
        args.append("--use-distributed-optimizer")
    if uses_megatron_fsdp(job):
        # validate_args refuses Megatron-FSDP with any other checkpoint format ("Megatron FSDP only supports
        # fsdp_dtensor checkpoint format"), whether or not the job saves
        args += ["--use-megatron-fsdp", f"--data-parallel-sharding-strategy {p.sharding.value}",
                 "--no-gradient-accumulation-fusion", "--ckpt-format fsdp_dtensor"]
    if p.overlap_grad_reduce:
        args.append("--overlap-grad-reduce")
    if p.overlap_param_gather:
        args.append("--overlap-param-gather")
    if p.ddp_bucket_size is not None:
        args.append(f"--ddp-bucket-size {p.ddp_bucket_size}")
    if p.precision is not Precision.fp32:
        args.append(f"--{p.precision.value}")
    if p.accumulate_allreduce_grads_in_fp32:
        args.append("--accumulate-allreduce-grads-in-fp32")
    if p.fp8_format is not None:
        args += [f"--fp8-format {p.fp8_format.value}", "--transformer-impl transformer_engine"]
    args += _state_dtype_args(job)
    if save_interval is not None:
        args.append(f"--save-interval {save_interval}")
    if async_save:
        args.append("--async-save")
    return args


def _state_dtype_args(job: Job) -> list[str]:
    """What the gradients, the optimizer state and the gathered FP8 weights are kept in, where not Megatron's
    default: each changes the memory the plan was simulated with."""
    p, args = job.plan, []
    if p.grad_reduce_in_bf16:
        args.append("--grad-reduce-in-bf16")
    if p.use_precision_aware_optimizer:
        args.append("--use-precision-aware-optimizer")
        for name in ("main_grads_dtype", "main_params_dtype", "exp_avg_dtype", "exp_avg_sq_dtype"):
            if getattr(p, name).value != "fp32":
                args.append(f"--{name.replace('_', '-')} {getattr(p, name).value}")
        if not p.store_param_remainders:
            args.append("--no-store-param-remainders")
    if p.fp8_param_gather:
        args.append("--fp8-param-gather")
    return args


def megatron_env(job: Job) -> dict[str, str]:
    """Environment the launch needs. With TP or CP, Megatron wants one CUDA work queue
    (CUDA_DEVICE_MAX_CONNECTIONS=1) so each collective is issued before the GEMM it overlaps;
    sequence parallelism required it in Megatron's older releases. Megatron-FSDP asserts the opposite,
    so its jobs get CUDA's default of 8. A plan that names its queues runs with them, as simulated."""
    p = job.plan
    if (p.cuda_device_max_connections is not None or uses_megatron_fsdp(job) or p.tensor_parallel_size > 1
            or p.context_parallel_size > 1):
        return {"CUDA_DEVICE_MAX_CONNECTIONS": str(p.work_queues)}
    return {}


def node_shape(job: Job) -> tuple[int, int]:
    """(nodes, processes per node) for torchrun and NeMo, which start as many processes on every node.
    The simulation fills nodes in rank order; where the GPUs do not fill whole nodes this is the most
    GPUs per node that divides the count and keeps each tensor-parallel group inside a node."""
    n, per_node, t = job.num_gpus, job.cluster.gpus_per_node, job.plan.tensor_parallel_size
    if n <= per_node:
        return 1, n
    if n % per_node == 0:
        return n // per_node, per_node
    fits = [d for d in range(1, per_node + 1) if n % d == 0]
    d = max([d for d in fits if d % t == 0] or fits)
    return n // d, d


def megatron_notes(job: Job) -> list[str]:
    """What the flags and environment cannot say, one sentence each."""
    m, p = job.model, job.plan
    notes = [f"the padded vocabulary is {m.vocab_size:,}: Megatron takes it from the tokenizer padded to a "
             f"multiple of {vocab_multiple(job)} x TP; --vocab-size is read only by the NullTokenizer, which adds "
             f"an end-of-document token (give it {m.vocab_size - 1})"]
    nodes, per_node = node_shape(job)
    if nodes * per_node == job.num_gpus and per_node < job.cluster.gpus_per_node and nodes > 1:
        notes.append(f"{job.num_gpus} GPUs do not fill nodes of {job.cluster.gpus_per_node}: the launch runs "
                     f"{nodes} nodes of {per_node}, while the simulation packed full nodes first")
    c = job.cluster
    if c.nvlink_domain_spans_nodes and job.num_gpus > c.gpus_per_node:
        take = c.ranks_per_nvlink_domain // c.gpus_per_node
        notes.append(f"the simulation fills {take} nodes of each NVLink domain in rank order before the next: "
                     f"allocate them so (Slurm's topology/block plugin, --segment={take}), or groups it placed on "
                     "NVLink cross InfiniBand")
    if p.schedule is PipelineSchedule.gpipe:
        notes.append("Megatron has no GPipe schedule: it runs 1F1B, which the simulation did not")
    if p.overlap_p2p_comm and not p.interleaved and p.pipeline_parallel_size > 1:
        notes.append("Megatron overlaps pipeline sends only in the interleaved schedule; this plan's overlap has "
                     "no flag")
    if p.interleaved and not p.overlap_p2p_comm and p.pipeline_parallel_size <= 2:
        notes.append("Megatron refuses interleaving without overlapped pipeline sends at PP "
                     f"{p.pipeline_parallel_size}; drop --no-overlap-p2p-communication (and simulate with overlap)")
    if (p.tensor_parallel_size > 1 or p.context_parallel_size > 1) and not p.collectives_issued_in_order:
        why = "Megatron-FSDP asserts it" if uses_megatron_fsdp(job) else "as the plan says"
        notes.append(f"runs with CUDA_DEVICE_MAX_CONNECTIONS={p.work_queues} ({why}): the simulation has each "
                     "input-gradient all-reduce (SP: all-gather) run after the GEMM it would overlap; other TP/CP "
                     "overlaps may fall short of the simulated ones as well")
    if m.is_moe:
        notes += _moe_notes(job)
    return notes


def _moe_notes(job: Job) -> list[str]:
    m, p = job.model, job.plan
    notes = [f"the plan assumes the busiest expert rank gets {_num(m.moe_load_imbalance)} x its balanced share of "
             "tokens (the simulator's --moe-load-imbalance; no Megatron flag sets it, the router's training does)"]
    if m.add_bias_linear and p.expert_tp_size > 1:
        notes.append(f"megatron-core builds MoE layers with biases only at expert tensor-parallel size 1 (this plan "
                     f"has {p.expert_tp_size}); add --expert-tensor-parallel-size 1 or --disable-bias-linear")
    if p.expert_model_parallel_size > 1 and p.precision is Precision.fp16:
        notes.append("Megatron-LM refuses expert parallelism with --fp16; train in bf16")
    return notes


def launch_lines(job: Job, save_interval: int | None = None, async_save: bool = False) -> list[str]:
    """The launch as shell lines: the environment, then torchrun with every flag."""
    nodes, per_node = node_shape(job)
    env = " ".join(f"{k}={v}" for k, v in megatron_env(job).items())
    head = (f"{env} " if env else "") + f"torchrun --nnodes {nodes} --nproc-per-node {per_node} pretrain_gpt.py"
    return [head, *megatron_args(job, save_interval, async_save)]


def render_launch(job: Job, indent: str = "  ", save_interval: int | None = None, async_save: bool = False) -> str:
    """The launch for a person: comment lines for the notes, then the command with continuations."""
    notes = [f"{indent}# {n}" for n in megatron_notes(job)]
    return "\n".join(notes + [indent + f" \\\n{indent}  ".join(launch_lines(job, save_interval, async_save))])
