"""The operation graph of one GPT layer on one tensor-parallel rank, and of the stage extras.

Every operation carries its FLOPs, the HBM bytes it moves, its GEMM shape or collective, and
the tensors it saves for the backward pass. The memory model sums those saved tensors and the
time model costs the same operations, so the two can never disagree.

Shapes follow Korthikanti et al. 2022 (Table 1): s sequence, b micro-batch, h hidden, a heads,
t tensor-parallel size. With sequence parallelism the norms, dropouts and residual adds work on
s/t tokens; Megatron's ``ColumnParallelLinear`` then saves its *sharded* input and all-gathers
it again in the backward pass, which is what makes every activation divisible by t (Eq. 4).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import Enum
from functools import lru_cache

import networkx as nx

from simulator.model import ModelSpec, PositionEmbedding
from simulator.plan import ParallelPlan, Precision, RecomputeGranularity

CORE_ATTENTION = "core_attention"  # the region selective recompute replays (Korthikanti Section 5)
MASK_BYTES = 1  # Megatron keeps dropout masks as 1-byte booleans
FP32_BYTES = 4


class OpKind(str, Enum):
    gemm = "gemm"  # weight GEMM (cuBLAS)
    batched_gemm = "batched_gemm"  # attention's activation x activation products
    flash_attention = "flash_attention"  # fused attention kernel
    elementwise = "elementwise"  # memory-bound: norms, softmax, dropout, activations
    collective = "collective"  # tensor-parallel NCCL collective


class Stream(str, Enum):
    compute = "compute"
    tp_comm = "tp_comm"


class CollectiveKind(str, Enum):
    all_reduce = "all_reduce"
    all_gather = "all_gather"
    reduce_scatter = "reduce_scatter"
    send_recv = "send_recv"


@dataclass(frozen=True, slots=True)
class SavedTensor:
    """A tensor kept alive from the forward to the backward pass."""

    name: str
    numel: int
    dtype_bytes: int
    region_input: bool = False  # an input of the core-attention region: kept under selective recompute

    @property
    def bytes(self) -> int:
        return self.numel * self.dtype_bytes


@dataclass(frozen=True, slots=True)
class GemmShape:
    """C[m, n] = A[m, k] @ B[k, n], ``batch`` times."""

    m: int
    n: int
    k: int
    batch: int = 1
    accumulate_bytes: int = 0  # C += A @ B into a buffer of this element size (weight gradients into main_grad)
    fp8: bool = False  # FP8 inputs (Transformer Engine linear layers), output in the activation dtype

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k * self.batch


@dataclass(frozen=True, slots=True)
class CollectiveOp:
    kind: CollectiveKind
    bytes: int  # the full buffer: all-reduce size, all-gather output, reduce-scatter input
    group_size: int


@dataclass(frozen=True, slots=True)
class Op:
    name: str
    kind: OpKind
    flops: float = 0.0
    bytes_moved: float = 0.0  # HBM traffic of a memory-bound op
    gemm: GemmShape | None = None
    collective: CollectiveOp | None = None
    saves: tuple[SavedTensor, ...] = ()
    region: str = ""
    # flash attention: (batch x heads, sequence, head size, causal) for the attention cost model
    attention: tuple[int, int, int, bool] | None = None
    kernel: str = ""  # memory-bound ops: the calibration's kernel class (layer_norm, dropout, ...)

    @property
    def stream(self) -> Stream:
        return Stream.tp_comm if self.kind is OpKind.collective else Stream.compute


@dataclass
class _Builder:
    """Adds ops to a DiGraph; by default each op depends on the previous one."""

    graph: nx.DiGraph = field(default_factory=nx.DiGraph)
    last: str | None = None

    def add(self, op: Op, after: tuple[str, ...] | None = None) -> str:
        self.graph.add_node(op.name, op=op, index=self.graph.number_of_nodes())
        for dep in after if after is not None else (self.last,):
            if dep is not None:
                self.graph.add_edge(dep, op.name)
        self.last = op.name
        return op.name


@dataclass(frozen=True)
class _Dims:
    """Per-rank sizes of one layer for a micro-batch."""

    s: int
    b: int
    h: int
    a: int  # attention heads on this rank
    kv: int  # key/value width on this rank
    d: int  # head size
    f: int  # MLP inner width on this rank (per matrix)
    t: int
    sp: bool
    ab: int  # activation bytes per element
    mlp_in: int  # fc1 output width on this rank (2f with SwiGLU)
    gb: int = FP32_BYTES  # gradient buffer (main_grad) bytes per element

    @property
    def tokens(self) -> int:
        return self.s * self.b

    @property
    def local_tokens(self) -> int:
        """Tokens a norm or dropout sees: all of them, or s/t of them under sequence parallelism."""
        return self.tokens // self.t if self.sp else self.tokens


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

    @staticmethod
    def of(plan: ParallelPlan) -> "LayerKey":
        return LayerKey(plan.tensor_parallel_size, plan.sequence_parallel, plan.micro_batch_size, plan.precision,
                        plan.use_flash_attention, plan.recompute.granularity, plan.fp8_format is not None,
                        plan.grad_bytes)


def _dims(model: ModelSpec, plan: "LayerKey") -> _Dims:
    t = plan.tensor_parallel_size
    f = model.ffn_size // t
    return _Dims(
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
    )


# Which microbenchmarked kernel an elementwise op behaves like, by its name (first match wins). On a
# GPU they are all bandwidth-bound; on a CPU a dropout's random numbers or GeLU's tanh cost far more
# than their bytes, so a profile may give each class its own achieved bandwidth.
_KERNEL_CLASSES = (("residual_grad_add", "bias_add_residual"), ("bias_grad", "bias_add_residual"),
                   ("norm", "layer_norm"), ("softmax", "softmax"), ("cross_entropy", "softmax"),
                   ("gelu", "gelu"), ("swiglu", "gelu"))


def kernel_class(name: str) -> str:
    for key, kernel in _KERNEL_CLASSES:
        if key in name:
            return kernel
    if "dropout" in name:  # the forward draws random numbers; the backward only applies the mask
        return "bias_add_residual" if name.endswith(".backward") else "dropout"
    return "copy"


def _elementwise(name: str, numel: int, reads: float, writes: float, ab: int, saves=(), region="", mask=False) -> Op:
    """A memory-bound op reading ``reads`` and writing ``writes`` tensors of ``numel`` elements."""
    moved = numel * ab * (reads + writes) + (numel * MASK_BYTES if mask else 0)
    return Op(name, OpKind.elementwise, flops=0.0, bytes_moved=moved, saves=tuple(saves), region=region,
              kernel=kernel_class(name))


def _gemm(name: str, shape: GemmShape, saves=(), region="", kind=OpKind.gemm) -> Op:
    return Op(name, kind, flops=shape.flops, gemm=shape, saves=tuple(saves), region=region)


def _coll(name: str, kind: CollectiveKind, nbytes: int, t: int) -> Op:
    return Op(name, OpKind.collective, collective=CollectiveOp(kind, nbytes, t))


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


def ordered_ops(graph: nx.DiGraph) -> list[Op]:
    """Ops in a deterministic topological order (insertion order breaks ties).

    Graphs are never changed once built, so the order is kept on the graph itself: the search
    asks for it hundreds of thousands of times.
    """
    order = graph.graph.get("order")
    if order is None:
        index = nx.get_node_attributes(graph, "index")
        order = graph.graph["order"] = tuple(
            graph.nodes[n]["op"] for n in nx.lexicographical_topological_sort(graph, key=lambda n: index[n]))
    return list(order)


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


def _softmax_steps(dm: _Dims, precision: Precision) -> tuple[tuple[str, float, float], ...]:
    """The softmax's kernels as (name, bytes read, bytes written) per score element.

    Fused: one kernel in the activation dtype. Otherwise Megatron's PyTorch path: the scores cast to
    fp32 (``attention_softmax_in_fp32``), scaled by 1 / layer number under fp16's query-key layer
    scaling, masked in place, the softmax, and the cast back.
    """
    ab = dm.ab
    half = precision is not Precision.fp32
    if fused_softmax_available(dm.s, dm.b * dm.a, half) or not half:
        return (("softmax", ab, ab),)
    steps = [("softmax.cast_fp32", ab, FP32_BYTES)]
    if precision is Precision.fp16:
        steps.append(("softmax.scale", FP32_BYTES, FP32_BYTES))
    steps += [("softmax.mask", FP32_BYTES, FP32_BYTES), ("softmax", FP32_BYTES, FP32_BYTES),
              ("softmax.cast_back", FP32_BYTES, ab)]
    return tuple(steps)


def _norm(name: str, dm: _Dims, model: ModelSpec, saves: bool = True) -> Op:
    n = dm.local_tokens * dm.h
    saved = (SavedTensor(f"{name}.input", n, dm.ab),) if saves else ()
    return _elementwise(name, n, 1, 1, dm.ab, saves=saved)


def _norm_backward(name: str, numel: int, ab: int) -> Op:
    """A norm's backward: the input gradient reads x and dy and writes dx; the weight (and bias)
    gradients are a second reduction kernel that reads x and dy again (apex/Megatron fused norms)."""
    return _elementwise(f"{name}.backward", numel, 4, 1, ab)


def _dropout_add(name: str, dm: _Dims, dropout: float) -> Op:
    n = dm.local_tokens * dm.h
    if dropout > 0:
        return _elementwise(name, n, 2, 1, dm.ab, saves=(SavedTensor(f"{name}.mask", n, MASK_BYTES),), mask=True)
    return _elementwise(name, n, 2, 1, dm.ab)


def _forward(model: ModelSpec, plan: LayerKey, dm: _Dims) -> nx.DiGraph:
    g = _Builder()
    s, b, h, t, ab = dm.s, dm.b, dm.h, dm.t, dm.ab
    tokens, full_act = dm.tokens, dm.tokens * h * ab
    col_input_numel = dm.local_tokens * h  # what ColumnParallelLinear saves (sharded under SP)

    g.add(_norm("input_norm", dm, model))
    if t > 1 and dm.sp:
        g.add(_coll("attention_all_gather", CollectiveKind.all_gather, full_act, t))
    qkv_width = dm.a * dm.d + 2 * dm.kv
    fp8 = plan.fp8  # Transformer Engine runs the linear layers in FP8; attention and the output layer stay bf16
    g.add(_gemm("qkv", GemmShape(tokens, qkv_width, h, fp8=fp8),
                saves=(SavedTensor("qkv.input", col_input_numel, ab),)))
    if model.add_bias_linear:  # ColumnParallelLinear adds its bias after the GEMM (fc1's is fused into GeLU)
        g.add(_elementwise("qkv.bias_add", tokens * qkv_width, 1, 1, ab))
    if model.position_embedding_type is PositionEmbedding.rope:
        g.add(_elementwise("rotary", tokens * (dm.a * dm.d + dm.kv), 1, 1, ab))
    q_numel, kv_numel = tokens * dm.a * dm.d, tokens * dm.kv
    probs = b * dm.a * s * s
    if plan.use_flash_attention:
        region_inputs = (
            SavedTensor("q", q_numel, ab, region_input=True),
            SavedTensor("k", kv_numel, ab, region_input=True),
            SavedTensor("v", kv_numel, ab, region_input=True),
        )
        lse = SavedTensor("attention.logsumexp", b * dm.a * s, FP32_BYTES)
        causal_flops = 4.0 * b * dm.a * s * s * dm.d / 2  # causal mask skips half of QK^T and PV
        g.add(
            Op("attention", OpKind.flash_attention, flops=causal_flops, saves=region_inputs + (lse,),
               region=CORE_ATTENTION, attention=(b * dm.a, s, dm.d, True))
        )
    else:
        scores = GemmShape(s, s, dm.d, batch=b * dm.a)
        g.add(_gemm("attention_scores", scores, kind=OpKind.batched_gemm, region=CORE_ATTENTION, saves=(
            SavedTensor("q", q_numel, ab, region_input=True), SavedTensor("k", kv_numel, ab, region_input=True))))
        softmax = _softmax_steps(dm, plan.precision)
        for name, read, write in softmax:  # the softmax keeps its output, in the dtype it computes in
            saves = (SavedTensor("softmax.output", probs, int(write)),) if name == "softmax" else ()
            g.add(_elementwise(name, probs, read / ab, write / ab, ab, region=CORE_ATTENTION, saves=saves))
        context_saves = [SavedTensor("v", kv_numel, ab, region_input=True)]
        if len(softmax) > 1 and model.attention_dropout == 0:  # the context GEMM keeps the cast-back copy
            context_saves.append(SavedTensor("softmax.cast_back.output", probs, ab))
        if model.attention_dropout > 0:
            g.add(_elementwise("attention_dropout", probs, 1, 1, ab, region=CORE_ATTENTION, mask=True,
                               saves=(SavedTensor("attention_dropout.mask", probs, MASK_BYTES),)))
            context_saves.append(SavedTensor("attention_dropout.output", probs, ab))
        # without dropout the context GEMM keeps the softmax output, already counted once
        g.add(_gemm("attention_context", GemmShape(s, dm.d, s, batch=b * dm.a), kind=OpKind.batched_gemm,
                    region=CORE_ATTENTION, saves=tuple(context_saves)))
        # [b * heads, s, d] -> [s, b, heads * d] for the projection: permute(...).contiguous() copies
        g.add(_elementwise("attention_context.copy", q_numel, 1, 1, ab, region=CORE_ATTENTION))
    g.add(_gemm("attention_proj", GemmShape(tokens, h, dm.a * dm.d, fp8=fp8),
                saves=(SavedTensor("attention_proj.input", q_numel, ab),)))
    if t > 1:
        kind = CollectiveKind.reduce_scatter if dm.sp else CollectiveKind.all_reduce
        g.add(_coll(f"attention_{kind.value}", kind, full_act, t))
    g.add(_dropout_add("attention_dropout_add", dm, model.hidden_dropout))
    g.add(_norm("pre_mlp_norm", dm, model))
    if t > 1 and dm.sp:
        g.add(_coll("mlp_all_gather", CollectiveKind.all_gather, full_act, t))
    g.add(_gemm("fc1", GemmShape(tokens, dm.mlp_in, h, fp8=fp8),
                saves=(SavedTensor("fc1.input", col_input_numel, ab),)))
    act_name = "swiglu" if model.swiglu else "gelu"
    g.add(_elementwise(act_name, tokens * dm.mlp_in, 1, dm.f / dm.mlp_in, ab,
                       saves=(SavedTensor(f"{act_name}.input", tokens * dm.mlp_in, ab),)))
    g.add(_gemm("fc2", GemmShape(tokens, h, dm.f, fp8=fp8), saves=(SavedTensor("fc2.input", tokens * dm.f, ab),)))
    if t > 1:
        kind = CollectiveKind.reduce_scatter if dm.sp else CollectiveKind.all_reduce
        g.add(_coll(f"mlp_{kind.value}", kind, full_act, t))
    g.add(_dropout_add("mlp_dropout_add", dm, model.hidden_dropout))
    return g.graph


def _backward_linear(g: _Builder, name: str, shape: GemmShape, dm: _Dims, column_parallel: bool, after: str,
                     bias: bool = False) -> str:
    """dgrad and wgrad of one linear layer, with the TP collectives Megatron overlaps with them.

    Column-parallel (qkv, fc1): the input gradient needs an all-reduce (or, under SP, a
    reduce-scatter), launched as soon as dgrad is done and overlapped with wgrad; under SP the
    sharded saved input is all-gathered again for wgrad, overlapped with dgrad.
    """
    full_act = dm.tokens * dm.h * dm.ab
    gather = None
    if column_parallel and dm.t > 1 and dm.sp:
        gather = g.add(_coll(f"{name}.input_all_gather", CollectiveKind.all_gather, full_act, dm.t), after=(after,))
    dgrad = g.add(_gemm(f"{name}.dgrad", GemmShape(shape.m, shape.k, shape.n, fp8=shape.fp8)), after=(after,))
    reduce = None
    if column_parallel and dm.t > 1:
        kind = CollectiveKind.reduce_scatter if dm.sp else CollectiveKind.all_reduce
        reduce = g.add(_coll(f"{name}.dgrad_{kind.value}", kind, full_act, dm.t), after=(dgrad,))
    # Megatron's gradient-accumulation fusion: the weight gradient accumulates into main_grad
    wgrad_shape = GemmShape(shape.k, shape.n, shape.m, accumulate_bytes=dm.gb, fp8=shape.fp8)
    wgrad = g.add(_gemm(f"{name}.wgrad", wgrad_shape),
                  after=(dgrad,) + ((gather,) if gather else ()))
    if bias:  # grad_output.sum(0): one read of the output gradient (on s/t tokens after a reduce-scatter)
        tokens = shape.m if column_parallel else dm.local_tokens
        g.add(_elementwise(f"{name}.bias_grad", tokens * shape.n, 1, 0, dm.ab), after=(wgrad,))
    return reduce or dgrad


def _backward(model: ModelSpec, plan: LayerKey, dm: _Dims, fwd: nx.DiGraph) -> nx.DiGraph:
    g = _Builder()
    ops = {op.name: op for op in ordered_ops(fwd)}
    tokens, full_act, t, ab = dm.tokens, dm.tokens * dm.h * dm.ab, dm.t, dm.ab
    n_local = dm.local_tokens * dm.h

    def eltwise_bwd(name: str, numel: int, reads: float, writes: float, mask=False, region="") -> str:
        return g.add(_elementwise(f"{name}.backward", numel, reads, writes, ab, mask=mask, region=region))

    eltwise_bwd("mlp_dropout_add", n_local, 1, 1, mask=model.hidden_dropout > 0)
    if t > 1 and dm.sp:
        g.add(_coll("fc2.grad_all_gather", CollectiveKind.all_gather, full_act, t))
    last = _backward_linear(g, "fc2", ops["fc2"].gemm, dm, column_parallel=False, after=g.last,
                            bias=model.add_bias_linear)
    g.last = g.add(_elementwise(f"{'swiglu' if model.swiglu else 'gelu'}.backward", tokens * dm.mlp_in, 2, 1, ab),
                   after=("fc2.dgrad",))
    last = _backward_linear(g, "fc1", ops["fc1"].gemm, dm, column_parallel=True, after=g.last,
                            bias=model.add_bias_linear)
    g.add(_norm_backward("pre_mlp_norm", n_local, ab), after=(last,))
    # the norm's input is also the residual: autograd adds the two gradients
    g.add(_elementwise("pre_mlp_norm.residual_grad_add", n_local, 2, 1, ab))
    eltwise_bwd("attention_dropout_add", n_local, 1, 1, mask=model.hidden_dropout > 0)
    if t > 1 and dm.sp:
        g.add(_coll("attention_proj.grad_all_gather", CollectiveKind.all_gather, full_act, t))
    _backward_linear(g, "attention_proj", ops["attention_proj"].gemm, dm, column_parallel=False, after=g.last,
                            bias=model.add_bias_linear)
    g.last = "attention_proj.dgrad"
    if plan.use_flash_attention:
        att = ops["attention"]
        g.add(Op("attention.backward", OpKind.flash_attention, flops=2.5 * att.flops, region=CORE_ATTENTION,
                 attention=att.attention))
    else:
        probs = dm.b * dm.a * dm.s * dm.s
        ctx, sc = ops["attention_context"].gemm, ops["attention_scores"].gemm
        eltwise_bwd("attention_context.copy", tokens * dm.a * dm.d, 1, 1)  # back to [b * heads, s, d]
        g.add(_gemm("attention_context.dgrad_probs", GemmShape(ctx.m, ctx.k, ctx.n, ctx.batch), kind=OpKind.batched_gemm))
        g.add(_gemm("attention_context.dgrad_v", GemmShape(ctx.k, ctx.n, ctx.m, ctx.batch), kind=OpKind.batched_gemm))
        if model.attention_dropout > 0:
            eltwise_bwd("attention_dropout", probs, 1, 1, mask=True)
        for name, read, write in reversed(_softmax_steps(dm, plan.precision)):
            if name == "softmax":  # reads its output and the gradient, writes the input gradient
                eltwise_bwd(name, probs, 3 * write / ab - 1, 1)
            else:  # the gradient passes through: read in one dtype, written in the other
                eltwise_bwd(name, probs, write / ab, read / ab)
        g.add(_gemm("attention_scores.dgrad_q", GemmShape(sc.m, sc.k, sc.n, sc.batch), kind=OpKind.batched_gemm))
        g.add(_gemm("attention_scores.dgrad_k", GemmShape(sc.n, sc.k, sc.m, sc.batch), kind=OpKind.batched_gemm))
    if model.position_embedding_type is PositionEmbedding.rope:
        eltwise_bwd("rotary", tokens * (dm.a * dm.d + dm.kv), 1, 1)
    # q, k and v were views of the fused QKV output: autograd assembles their gradients into one tensor
    eltwise_bwd("qkv.split", tokens * (dm.a * dm.d + 2 * dm.kv), 1, 1)
    last = _backward_linear(g, "qkv", ops["qkv"].gemm, dm, column_parallel=True, after=g.last,
                            bias=model.add_bias_linear)
    g.add(_norm_backward("input_norm", n_local, ab), after=(last,))
    g.add(_elementwise("input_norm.residual_grad_add", n_local, 2, 1, ab))
    return g.graph


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


def transformer_layer(model: ModelSpec, plan: ParallelPlan) -> LayerGraph:
    """The layer graph for ``plan``'s TP size, SP, micro-batch, precision, attention and recompute."""
    return layer_graph(model, LayerKey.of(plan))


@lru_cache(maxsize=1024)
def layer_graph(model: ModelSpec, key: LayerKey) -> LayerGraph:
    dm = _dims(model, key)
    fwd = _forward(model, key, dm)
    layer_input = dm.local_tokens * dm.h * dm.ab
    return LayerGraph(
        forward=fwd,
        backward=_backward(model, key, dm, fwd),
        recompute=_recompute(fwd, key.granularity),
        input_bytes=layer_input,
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
    f, b = _Builder(), _Builder()
    full_act = dm.tokens * dm.h * dm.ab
    learned = model.position_embedding_type is PositionEmbedding.learned_absolute
    f.add(_elementwise("embedding", dm.tokens * dm.h, 1, 1, dm.ab))
    if dm.t > 1:
        kind = CollectiveKind.reduce_scatter if dm.sp else CollectiveKind.all_reduce
        f.add(_coll(f"embedding_{kind.value}", kind, full_act, dm.t))
    n = dm.local_tokens * dm.h
    if learned:  # the position table's rows added to the token rows
        f.add(_elementwise("embedding.position_add", n, 2, 1, dm.ab))
    f.add(_elementwise("embedding.transpose", n, 1, 1, dm.ab))  # [b, s, h] -> [s, b, h], contiguous
    if model.hidden_dropout > 0:
        f.add(_elementwise("embedding_dropout", n, 1, 1, dm.ab, mask=True,
                           saves=(SavedTensor("embedding_dropout.mask", n, MASK_BYTES),)))
        b.add(_elementwise("embedding_dropout.backward", n, 1, 1, dm.ab, mask=True))
    if dm.t > 1 and dm.sp:
        b.add(_coll("embedding.grad_all_gather", CollectiveKind.all_gather, full_act, dm.t))
    b.add(_elementwise("embedding.transpose.backward", n, 1, 1, dm.ab))
    # The embedding's weight gradient is dense: a zeroed [vocab / t, h] tensor in the weights' dtype
    # that the token rows are scattered into, then added to main_grad by Megatron's
    # gradient-accumulation hook (reads both, writes main_grad: the one weight without a fused wgrad).
    tables = [("embedding", model.vocab_size // dm.t * dm.h, dm.tokens * dm.h)]
    if learned:  # the position table is not split over TP; under SP each rank has its own tokens' rows
        tables.append(("embedding.position", model.seq_length * dm.h, n))
    for name, table, rows in tables:
        b.add(_elementwise(f"{name}.backward", rows, 1, 1, dm.ab))
        b.add(_elementwise(f"{name}.grad_zero", table, 0, 1, dm.ab))
        b.add(_elementwise(f"{name}.grad_accumulate", table, 1 + dm.gb / dm.ab, dm.gb / dm.ab, dm.ab))
    return StageExtras(f.graph, b.graph)


def output_extras(model: ModelSpec, plan: ParallelPlan) -> StageExtras:
    """Final norm, vocabulary-parallel output layer and cross-entropy (fp32 logits, Korthikanti 4.3)."""
    return _output_extras(model, LayerKey.of(plan))


@lru_cache(maxsize=1024)
def _output_extras(model: ModelSpec, key: LayerKey) -> StageExtras:
    dm = _dims(model, key)
    f, b = _Builder(), _Builder()
    vocab = model.vocab_size // dm.t
    full_act = dm.tokens * dm.h * dm.ab
    logits = dm.tokens * vocab
    f.add(_norm("final_norm", dm, model))
    if dm.t > 1 and dm.sp:
        f.add(_coll("output_all_gather", CollectiveKind.all_gather, full_act, dm.t))
    shape = GemmShape(dm.tokens, vocab, dm.h)
    f.add(_gemm("output_layer", shape, saves=(SavedTensor("output_layer.input", dm.local_tokens * dm.h, dm.ab),)))
    # Megatron's vocabulary-parallel cross-entropy on fp32 logits: the cast, then max, subtract,
    # exp, sum and divide in place (five reads and three writes of fp32), keeping the softmax
    fp32 = FP32_BYTES / dm.ab
    cast = dm.ab != FP32_BYTES
    if cast:
        f.add(_elementwise("cross_entropy.cast", logits, 1, fp32, dm.ab))
    f.add(_elementwise("cross_entropy", logits, 5 * fp32, 3 * fp32, dm.ab,
                       saves=(SavedTensor("cross_entropy.softmax", logits, FP32_BYTES),)))
    if dm.t > 1:  # max, sum of exponentials and target logit, one fp32 per token each
        f.add(_coll("cross_entropy_all_reduce", CollectiveKind.all_reduce, 3 * dm.tokens * FP32_BYTES, dm.t))
    # the softmax scaled by the loss gradient in place, then cast back to the logits' dtype
    b.add(_elementwise("cross_entropy.backward", logits, fp32 * (2 if cast else 1), fp32 + (1 if cast else 0), dm.ab))
    _backward_linear(b, "output_layer", shape, dm, column_parallel=True, after=b.last)
    b.add(_norm_backward("final_norm", dm.local_tokens * dm.h, dm.ab))
    return StageExtras(f.graph, b.graph)
