"""The operation graph of one GPT layer on one tensor-parallel rank, and of the stage extras.

A layer is a list of modules (``simulator.graph.modules``), each declared once with its forward ops,
their FLOPs, bytes and saved tensors, and its backward; recompute replays the forward ops of the
region the policy drops. The memory model sums the saved tensors and the time model costs the
same ops, so the two can never disagree.

Shapes follow Korthikanti et al. 2022 (Table 1): s sequence, b micro-batch, h hidden, a heads,
t tensor-parallel size.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

import networkx as nx

from simulator.graph.modules import (
    Activation,
    ColumnParallelLinear,
    ContextParallelAttention,
    CoreAttention,
    Dims,
    DropoutAdd,
    FlashAttention,
    Module,
    MoEMLP,
    Norm,
    Rotary,
    RowParallelLinear,
    build_backward,
    build_forward,
)
from simulator.graph.ops import (
    CORE_ATTENTION,
    FP32_BYTES,
    MASK_BYTES,
    CollectiveKind,
    CollectiveOp,
    GemmShape,
    GraphBuilder,
    Op,
    OpKind,
    SavedTensor,
    Stream,
    collective,
    elementwise,
    gemm,
    kernel_class,
    ordered_ops,
)
from simulator.spec.model import ModelSpec, PositionEmbedding
from simulator.spec.plan import CpCommType, ParallelPlan, Precision, RecomputeGranularity


@dataclass(frozen=True)
class LayerKey:
    """The parts of a plan a layer's graph depends on (so caches ignore PP, DP, batch, optimizer)."""

    tensor_parallel_size: int
    sequence_parallel: bool
    micro_batch_size: int
    precision: Precision
    use_flash_attention: bool
    granularity: RecomputeGranularity
    fp8: bool = False  # the four linear layers' GEMMs in FP8
    grad_bytes: int = 4  # element size of main_grad, which weight gradients accumulate into
    tp_comm_overlap: bool = False
    context_parallel_size: int = 1
    cp_comm_type: CpCommType = CpCommType.p2p
    ordered_overlap: bool = True  # collectives issued before a GEMM start before it (one CUDA work queue)
    moe: bool = False  # the layer's MLP is a mixture of experts
    expert_parallel_size: int = 1
    expert_tensor_parallel_size: int = 1
    dispatcher: str = "alltoall"
    grouped_gemm: bool = False
    # the fused kernel's --attention-backend (auto, flash, fused): on one GPU they run different kernels
    attention_backend: str = ""

    @staticmethod
    def of(plan: ParallelPlan, moe: bool = False) -> "LayerKey":
        common = (plan.tensor_parallel_size, plan.sequence_parallel, plan.micro_batch_size, plan.precision,
                  plan.use_flash_attention, plan.recompute.granularity, plan.fp8_format is not None,
                  plan.grad_bytes, plan.tp_comm_overlap, plan.context_parallel_size, plan.cp_comm_type,
                  # the order only matters to TP's collectives: one key (and graph) for every TP 1 plan
                  plan.collectives_issued_in_order or plan.tensor_parallel_size == 1)
        backend = plan.attention_backend.value if plan.use_flash_attention else ""
        if not moe:  # a dense layer does not depend on the expert layout: one graph for every EP
            return LayerKey(*common, attention_backend=backend)
        return LayerKey(*common, True, plan.expert_model_parallel_size, plan.expert_tp_size,
                        plan.moe_token_dispatcher_type.value, plan.moe_grouped_gemm, attention_backend=backend)


def _dims(model: ModelSpec, plan: LayerKey) -> Dims:
    t = plan.tensor_parallel_size
    f = model.ffn_size // t
    return Dims(
        s=model.seq_length,
        b=plan.micro_batch_size,
        h=model.hidden_size,
        a=model.num_attention_heads // t,
        kv=max(model.kv_size // t, model.head_dim),
        d=model.head_dim,
        f=f,
        t=t,
        sp=plan.sequence_parallel,
        ab=plan.precision.activation_bytes,
        mlp_in=2 * f if model.swiglu else f,
        gb=plan.grad_bytes,
        tp_overlap=plan.tp_comm_overlap,
        cp=plan.context_parallel_size,
        ordered_overlap=plan.ordered_overlap,
    )


@dataclass(frozen=True)
class LayerGraph:
    """One transformer layer's forward, backward and recompute graphs on one TP rank."""

    forward: nx.DiGraph
    backward: nx.DiGraph
    recompute: nx.DiGraph  # ops replayed at the start of the backward pass under the plan's policy
    input_bytes: int  # the layer input, what full recompute keeps

    def forward_ops(self) -> list[Op]:
        return ordered_ops(self.forward)

    def saved_tensors(self, granularity: RecomputeGranularity) -> list[SavedTensor]:
        """Tensors this layer keeps for its backward pass under a recompute granularity (per layer)."""
        saves = [t for op in self.forward_ops() for t in op.saves]
        if granularity is RecomputeGranularity.selective:
            return [t for t in saves if t.region_input or not _in_region(self.forward, t)]
        if granularity is RecomputeGranularity.full:
            return [SavedTensor("layer_input", self.input_bytes, 1)]
        return saves

    def activation_bytes(self, granularity: RecomputeGranularity) -> int:
        cache = self.forward.graph.setdefault("activation_bytes", {})
        if granularity not in cache:
            cache[granularity] = sum(t.bytes for t in self.saved_tensors(granularity))
        return cache[granularity]


def _in_region(graph: nx.DiGraph, tensor: SavedTensor) -> bool:
    for _, data in graph.nodes(data=True):
        if tensor in data["op"].saves:
            return data["op"].region == CORE_ATTENTION
    raise AssertionError(f"saved tensor {tensor.name} belongs to no op")


def fused_softmax_available(seq: int, attention_batches: int, half_precision: bool) -> bool:
    """Whether Megatron's fused causal scale-mask-softmax kernel takes the scores
    (``FusedScaleMaskSoftmax.is_kernel_available``): half-precision input, 16 < s <= 16384, s a
    multiple of 4, and the b x heads-per-rank score matrices a multiple of the kernel's batches per
    thread block (4 for s > 128; more for shorter rows). Otherwise PyTorch's ops run the softmax."""
    if not half_precision or not 16 < seq <= 16384 or seq % 4:
        return False
    warp = min(1 << (seq - 1).bit_length(), 32)
    per_block = (128 // warp) * (2 if seq <= 128 else 1)
    return attention_batches % 4 == 0 and attention_batches % per_block == 0


def _softmax_steps(dm: Dims, precision: Precision) -> tuple[tuple[str, float, float], ...]:
    """The softmax's kernels as (name, bytes read, bytes written) per score element.

    Fused: one kernel in the activation dtype. Otherwise Megatron's PyTorch path: the scores cast to
    fp32 (``attention_softmax_in_fp32``), scaled by 1 / layer number under fp16's query-key layer
    scaling, masked in place, the softmax, and the cast back; fp32 scores (the fused kernel takes
    only half precision) are masked in place and go through the softmax, with no casts.
    """
    ab = dm.ab
    half = precision is not Precision.fp32
    if not half:
        return (("softmax.mask", FP32_BYTES, FP32_BYTES), ("softmax", FP32_BYTES, FP32_BYTES))
    if fused_softmax_available(dm.s, dm.b * dm.a, half):
        return (("softmax", ab, ab),)
    steps = [("softmax.cast_fp32", ab, FP32_BYTES)]
    if precision is Precision.fp16:
        steps.append(("softmax.scale", FP32_BYTES, FP32_BYTES))
    steps += [("softmax.mask", FP32_BYTES, FP32_BYTES), ("softmax", FP32_BYTES, FP32_BYTES),
              ("softmax.cast_back", FP32_BYTES, ab)]
    return tuple(steps)


def layer_modules(model: ModelSpec, plan: LayerKey, dm: Dims) -> list[Module]:
    """The parts of one transformer layer in forward order (pre-norm GPT / Llama)."""
    bias, fp8 = model.add_bias_linear, plan.fp8  # FP8 runs the four linear layers; attention stays in bf16
    q = dm.a * dm.d
    attention: Module
    if dm.cp > 1:
        attention = ContextParallelAttention(dm, plan.cp_comm_type.value, plan.attention_backend or "auto")
    elif plan.use_flash_attention:
        attention = FlashAttention(dm, plan.attention_backend or "auto")
    else:
        attention = CoreAttention(dm, _softmax_steps(dm, plan.precision), model.attention_dropout)
    return [
        Norm("input_norm", dm),
        ColumnParallelLinear("qkv", dm, q + 2 * dm.kv, dm.h, "attention_all_gather", bias_add=bias, bias_grad=bias,
                             fp8=fp8, split_numel=dm.tokens * (q + 2 * dm.kv)),
        *([Rotary(dm)] if model.position_embedding_type is PositionEmbedding.rope else []),
        attention,
        RowParallelLinear("attention_proj", dm, dm.h, q, "attention", bias_grad=bias, fp8=fp8),
        DropoutAdd("attention_dropout_add", dm, model.hidden_dropout),
        Norm("pre_mlp_norm", dm),
        *(_moe_modules(model, plan, dm) if plan.moe else _mlp_modules(model, plan, dm, "", dm.f)),
        DropoutAdd("mlp_dropout_add", dm, model.hidden_dropout),
    ]


def _mlp_modules(model: ModelSpec, plan: LayerKey, dm: Dims, prefix: str, f: int,
                 input_saved_elsewhere: bool = False) -> list[Module]:
    """A tensor-parallel MLP of inner size ``f`` per rank: column-parallel fc1, the activation, row-parallel fc2."""
    bias, fp8 = model.add_bias_linear, plan.fp8
    mlp_in = 2 * f if model.swiglu else f
    sized = replace(dm, f=f, mlp_in=mlp_in)
    return [
        ColumnParallelLinear(f"{prefix}fc1", sized, mlp_in, dm.h, f"{prefix}all_gather" if prefix else "mlp_all_gather",
                             bias_grad=bias, fp8=fp8, input_saved_elsewhere=input_saved_elsewhere),
        Activation(f"{prefix}{'swiglu' if model.swiglu else 'gelu'}", sized),
        RowParallelLinear(f"{prefix}fc2", sized, dm.h, f, f"{prefix}mlp" if prefix else "mlp", bias_grad=bias, fp8=fp8),
    ]


def _moe_modules(model: ModelSpec, plan: LayerKey, dm: Dims) -> list[Module]:
    """The routed experts, and the shared experts every token also passes."""
    imbalance = model.moe_load_imbalance
    if model.moe_expert_capacity_factor is not None:  # tokens past the capacity are dropped
        imbalance = min(imbalance, model.moe_expert_capacity_factor)
    routed: list[Module] = [MoEMLP(dm, model.num_experts, model.moe_router_topk, model.expert_ffn_size, model.swiglu,
                                   plan.expert_parallel_size, plan.expert_tensor_parallel_size, plan.dispatcher,
                                   plan.grouped_gemm, imbalance, plan.expert_tensor_parallel_size)]
    shared = model.moe_shared_expert_intermediate_size
    # the shared experts read the router's input: one tensor, kept once
    return routed + (_mlp_modules(model, plan, dm, "shared_expert.", shared // dm.t, input_saved_elsewhere=True)
                     if shared else [])


def _recompute(fwd: nx.DiGraph, granularity: RecomputeGranularity) -> nx.DiGraph:
    if granularity is RecomputeGranularity.none:
        return nx.DiGraph()
    if granularity is RecomputeGranularity.full:
        keep = list(fwd.nodes)
    else:
        keep = [n for n, d in fwd.nodes(data=True) if d["op"].region == CORE_ATTENTION]
    sub = fwd.subgraph(keep)
    out = nx.DiGraph()
    for n in keep:
        op = fwd.nodes[n]["op"]
        out.add_node(f"recompute.{n}", op=replace(op, name=f"recompute.{n}", saves=()), index=fwd.nodes[n]["index"])
    out.add_edges_from((f"recompute.{u}", f"recompute.{v}") for u, v in sub.edges)
    return out


def transformer_layer(model: ModelSpec, plan: ParallelPlan, moe: bool = False) -> LayerGraph:
    """The layer graph for ``plan``'s TP size, SP, micro-batch, precision, attention and recompute; ``moe``:
    a layer whose MLP is the model's mixture of experts."""
    return layer_graph(model, LayerKey.of(plan, moe))


@lru_cache(maxsize=1024)
def layer_graph(model: ModelSpec, key: LayerKey) -> LayerGraph:
    # The forward is the same under every recompute granularity and whatever order the backward's
    # collectives take, and the backward is the same under every granularity (only the replay before it
    # differs): keys that differ only there share those graphs, built once.
    plain = replace(key, granularity=RecomputeGranularity.none)
    if key != plain:
        base = layer_graph(model, plain)
        return replace(base, recompute=_recompute(base.forward, key.granularity))
    dm = _dims(model, key)
    modules = layer_modules(model, key, dm)
    in_order = replace(key, ordered_overlap=True)
    fwd = layer_graph(model, in_order).forward if key != in_order else build_forward(modules).graph
    return LayerGraph(
        forward=fwd,
        backward=build_backward(modules).graph,
        recompute=nx.DiGraph(),
        input_bytes=dm.local_tokens * dm.h * dm.ab,
    )


@dataclass(frozen=True)
class StageExtras:
    """The first stage's embedding and the last stage's final norm, output layer and loss."""

    forward: nx.DiGraph
    backward: nx.DiGraph

    def saved_tensors(self) -> list[SavedTensor]:
        return [t for op in ordered_ops(self.forward) for t in op.saves]

    def activation_bytes(self) -> int:
        return sum(t.bytes for t in self.saved_tensors())


def embedding_extras(model: ModelSpec, plan: ParallelPlan) -> StageExtras:
    """Vocabulary-parallel embedding lookup (+ position table), its all-reduce/reduce-scatter, dropout."""
    return _embedding_extras(model, LayerKey.of(plan))


@lru_cache(maxsize=1024)
def _embedding_extras(model: ModelSpec, key: LayerKey) -> StageExtras:
    dm = _dims(model, key)
    f, b = GraphBuilder(), GraphBuilder()
    full_act = dm.full_activation_bytes
    learned = model.position_embedding_type is PositionEmbedding.learned_absolute
    f.add(elementwise("embedding", dm.tokens * dm.h, 1, 1, dm.ab))
    if dm.t > 1:
        kind = CollectiveKind.reduce_scatter if dm.sp else CollectiveKind.all_reduce
        f.add(collective(f"embedding_{kind.value}", kind, full_act, dm.t))
    n = dm.local_tokens * dm.h
    if learned:  # the position table's rows added to the token rows
        f.add(elementwise("embedding.position_add", n, 2, 1, dm.ab))
    f.add(elementwise("embedding.transpose", n, 1, 1, dm.ab))  # [b, s, h] -> [s, b, h], contiguous
    if model.hidden_dropout > 0:
        f.add(elementwise("embedding_dropout", n, 1, 1, dm.ab, mask=True,
                           saves=(SavedTensor("embedding_dropout.mask", n, MASK_BYTES),)))
        b.add(elementwise("embedding_dropout.backward", n, 1, 1, dm.ab, mask=True))
    if dm.t > 1 and dm.sp:
        b.add(collective("embedding.grad_all_gather", CollectiveKind.all_gather, full_act, dm.t))
    b.add(elementwise("embedding.transpose.backward", n, 1, 1, dm.ab))
    # The embedding's weight gradient is dense: a zeroed [vocab / t, h] tensor in the weights' dtype
    # that the token rows are scattered into, then added to main_grad by Megatron's
    # gradient-accumulation hook (reads both, writes main_grad: the one weight without a fused wgrad).
    tables = [("embedding", model.vocab_size // dm.t * dm.h, dm.tokens * dm.h)]
    if learned:  # the position table is not split over TP; under SP each rank has its own tokens' rows
        tables.append(("embedding.position", model.seq_length * dm.h, n))
    for name, table, rows in tables:
        b.add(elementwise(f"{name}.backward", rows, 1, 1, dm.ab))
        b.add(elementwise(f"{name}.grad_zero", table, 0, 1, dm.ab))
        b.add(elementwise(f"{name}.grad_accumulate", table, 1 + dm.gb / dm.ab, dm.gb / dm.ab, dm.ab))
    return StageExtras(f.graph, b.graph)


def output_extras(model: ModelSpec, plan: ParallelPlan) -> StageExtras:
    """Final norm, vocabulary-parallel output layer and cross-entropy (fp32 logits, Korthikanti 4.3)."""
    return _output_extras(model, LayerKey.of(plan))


@lru_cache(maxsize=1024)
def _output_extras(model: ModelSpec, key: LayerKey) -> StageExtras:
    dm = _dims(model, key)
    vocab = model.vocab_size // dm.t
    logits = dm.tokens * vocab
    # the output layer stays in the activation dtype under FP8, as Megatron keeps it
    modules = [Norm("final_norm", dm, residual=False),
               ColumnParallelLinear("output_layer", dm, vocab, dm.h, "output_all_gather")]
    f = build_forward(modules)
    # Megatron's vocabulary-parallel cross-entropy on fp32 logits, op by op as it runs them: the cast, the
    # max (all-reduced over TP), the subtraction in place, the target logit (all-reduced), exp in place, the
    # sum of exponentials (all-reduced) and the division in place, which leaves the softmax it keeps: five
    # reads and three writes of the fp32 logits in all, each pass over the logits alone
    fp32 = FP32_BYTES / dm.ab
    cast = dm.ab != FP32_BYTES
    if cast:
        f.add(elementwise("cross_entropy.cast", logits, 1, fp32, dm.ab))

    def reduced(name: str) -> None:  # one fp32 per token, over the vocabulary's shards
        if dm.t > 1:
            f.add(collective(f"cross_entropy.{name}_all_reduce", CollectiveKind.all_reduce,
                             dm.tokens * FP32_BYTES, dm.t))

    f.add(elementwise("cross_entropy.max", logits, fp32, 0, dm.ab))
    reduced("max")
    f.add(elementwise("cross_entropy.subtract", logits, fp32, fp32, dm.ab))
    reduced("target_logit")
    f.add(elementwise("cross_entropy.exp", logits, fp32, fp32, dm.ab))
    f.add(elementwise("cross_entropy.sum", logits, fp32, 0, dm.ab))
    reduced("sum_exp")
    f.add(elementwise("cross_entropy.divide", logits, fp32, fp32, dm.ab,
                      saves=(SavedTensor("cross_entropy.softmax", logits, FP32_BYTES),)))
    # the softmax scaled by the loss gradient in place, then cast back to the logits' dtype
    loss = elementwise("cross_entropy.backward", logits, fp32 * (2 if cast else 1), fp32 + (1 if cast else 0), dm.ab)
    b = build_backward(modules, first=loss)
    return StageExtras(f.graph, b.graph)
