"""The parts of a GPT layer, each declared once: the ops it runs forward (with their FLOPs, bytes
and saved tensors) and, from the same declaration, the ops its backward runs.

A module adds its forward ops to a ``GraphBuilder`` one after another; its ``backward`` adds the
ops of its gradient after ``after`` (the op that produced its output's gradient) and returns the
op its input's gradient comes from, so a layer's backward graph is the modules' backwards in
reverse order. Recompute needs no declaration: it replays the forward ops (``simulator.graph.layers``).

Shapes follow Korthikanti et al. 2022 (Table 1): s sequence, b micro-batch, h hidden, a heads,
t tensor-parallel size. With sequence parallelism the norms, dropouts and residual adds work on
s/t tokens; Megatron's ``ColumnParallelLinear`` then saves its *sharded* input and all-gathers
it again in the backward pass, which is what makes every activation divisible by t (Eq. 4).

Here are the dense parts (norms, dropout-adds, the tensor-parallel linears, the activation, rotary
embedding) and the builders; attention is declared in ``simulator.graph.attention``, the mixture of
experts in ``simulator.graph.moe``, both on the sizes and contract of ``simulator.graph.module_base``,
and every part is offered from here.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from simulator.graph.attention import ContextParallelAttention, CoreAttention, FlashAttention
from simulator.graph.module_base import Dims, Module
from simulator.graph.moe import INDEX_BYTES, MoEMLP
from simulator.graph.ops import (
    MASK_BYTES,
    CollectiveKind,
    GemmShape,
    GraphBuilder,
    Op,
    SavedTensor,
    collective,
    elementwise,
    gemm,
)

FP8_BYTES = 1
# Transformer Engine's default userbuffers recipe: a GEMM feeding a reduce-scatter is pipelined in 4
# splits; an all-gather feeding a GEMM is a ring exchange of one chunk per TP rank.
REDUCE_SCATTER_SPLITS = 4


@dataclass(frozen=True)
class Norm(Module):
    """LayerNorm or RMSNorm (fused apex/TE kernel), saving its input. Its backward's input gradient
    reads x and dy and writes dx; the weight (and bias) gradients are a second reduction that reads
    them again. When the norm's input is also the residual stream, autograd adds the two gradients."""

    name: str
    dm: Dims
    residual: bool = True

    @property
    def numel(self) -> int:
        return self.dm.local_tokens * self.dm.h

    def forward(self, g: GraphBuilder) -> None:
        g.add(elementwise(self.name, self.numel, 1, 1, self.dm.ab,
                          saves=(SavedTensor(f"{self.name}.input", self.numel, self.dm.ab),)))

    def backward(self, g: GraphBuilder, after: str) -> str:
        last = g.add(elementwise(f"{self.name}.backward", self.numel, 4, 1, self.dm.ab), after=(after,))
        if self.residual:
            last = g.add(elementwise(f"{self.name}.residual_grad_add", self.numel, 2, 1, self.dm.ab))
        return last


@dataclass(frozen=True)
class DropoutAdd(Module):
    """Megatron's fused bias-dropout-add into the residual stream, keeping a 1-byte mask."""

    name: str
    dm: Dims
    dropout: float

    def forward(self, g: GraphBuilder) -> None:
        n = self.dm.local_tokens * self.dm.h
        saves = (SavedTensor(f"{self.name}.mask", n, MASK_BYTES),) if self.dropout > 0 else ()
        g.add(elementwise(self.name, n, 2, 1, self.dm.ab, saves=saves, mask=self.dropout > 0))

    def backward(self, g: GraphBuilder, after: str) -> str:
        n = self.dm.local_tokens * self.dm.h
        return g.add(elementwise(f"{self.name}.backward", n, 1, 1, self.dm.ab, mask=self.dropout > 0), after=(after,))


def _gather_into_gemm(g: GraphBuilder, gather: str, gemm_name: str, shape: GemmShape, dm: Dims, after: str | None,
                      saves=()) -> str:
    """An all-gather feeding a GEMM, pipelined as Transformer Engine's userbuffers run it under
    ``--tp-comm-overlap``: the GEMM of chunk i (m / t rows) runs while chunk i + 1 arrives, so only the
    first chunk's transfer and the last chunk's GEMM stay exposed. Otherwise the GEMM waits for all."""
    deps = (after,) if after is not None else None
    if not dm.chunked:
        g.add(collective(gather, CollectiveKind.all_gather, dm.full_activation_bytes, dm.t), after=deps)
        return g.add(gemm(gemm_name, shape, saves=saves))
    t, part = dm.t, GemmShape(shape.m // dm.t, shape.n, shape.k, accumulate_bytes=shape.accumulate_bytes, fp8=shape.fp8)
    first = g.add(collective(f"{gather}.chunk", CollectiveKind.all_gather, dm.full_activation_bytes // t, t), after=deps)
    rest = g.add(collective(gather, CollectiveKind.all_gather, dm.full_activation_bytes * (t - 1) // t, t),
                 after=(first,))
    early = g.add(gemm(f"{gemm_name}.chunks", replace(part, batch=t - 1)), after=(first,))
    return g.add(gemm(gemm_name, part, saves=saves), after=(early, rest))


def _gemm_into_reduce(g: GraphBuilder, gemm_name: str, shape: GemmShape, reduce: str, dm: Dims, after: str | None,
                      saves=()) -> tuple[str, str | None]:
    """A GEMM whose output is reduce-scattered (all-reduced without SP); under ``--tp-comm-overlap``
    the GEMM runs in ``REDUCE_SCATTER_SPLITS`` splits and split i's reduce-scatter beside split i + 1's
    GEMM. Returns (the GEMM, the reduction)."""
    deps = (after,) if after is not None else None
    if not dm.chunked:
        done = g.add(gemm(gemm_name, shape, saves=saves), after=deps)
        if dm.t == 1:
            return done, None
        return done, g.add(collective(reduce, dm.tp_reduce, dm.full_activation_bytes, dm.t), after=(done,))
    n = REDUCE_SCATTER_SPLITS
    part = GemmShape(shape.m // n, shape.n, shape.k, accumulate_bytes=shape.accumulate_bytes, fp8=shape.fp8)
    first = g.add(gemm(gemm_name, part, saves=saves), after=deps)
    early = g.add(collective(f"{reduce}.chunks", dm.tp_reduce, dm.full_activation_bytes * (n - 1) // n, dm.t),
                  after=(first,))
    rest = g.add(gemm(f"{gemm_name}.chunks", replace(part, batch=n - 1)), after=(first,))
    return rest, g.add(collective(reduce, dm.tp_reduce, dm.full_activation_bytes // n, dm.t), after=(rest, early))


def _linear_backward(g: GraphBuilder, name: str, shape: GemmShape, dm: Dims, column_parallel: bool, after: str,
                     bias: bool, grad_gather: str | None = None) -> str:
    """dgrad and wgrad of one linear layer, with the TP collectives Megatron overlaps with them.

    Column-parallel (qkv, fc1): the input gradient needs an all-reduce (or, under SP, a
    reduce-scatter), launched as soon as dgrad is done and overlapped with wgrad; under SP the
    sharded saved input is all-gathered again for wgrad, overlapped with dgrad. Both overlaps
    need the collective to start before the GEMM issued after it, which one CUDA work queue
    guarantees; from several (``Dims.ordered_overlap`` false) each runs after its GEMM. Under FP8
    (Transformer Engine) the output gradient is cast (and transposed for wgrad) first.
    Row-parallel under SP: the output gradient is all-gathered (``grad_gather``) before dgrad.
    """
    # Issued before the GEMM it overlaps, a collective starts first only from a single CUDA work queue; from
    # several, the GEMM can take every SM first and the collective runs after it (``Dims.ordered_overlap``)
    ordered = dm.ordered_overlap or dm.chunked
    gather = None
    if column_parallel and dm.t > 1 and dm.sp and ordered:
        gather = g.add(collective(f"{name}.input_all_gather", CollectiveKind.all_gather, dm.full_activation_bytes,
                                  dm.t), after=(after,))
    if shape.fp8:  # cast_transpose of the output gradient: read it, write fp8 and its transpose
        after = g.add(elementwise(f"{name}.grad_cast", shape.m * shape.n, 1, 2 * FP8_BYTES / dm.ab, dm.ab),
                      after=(after,))
    dgrad_shape = GemmShape(shape.m, shape.k, shape.n, fp8=shape.fp8)
    reduce = None
    if column_parallel:  # the reduction already runs beside wgrad (Transformer Engine's bulk overlap too)
        dgrad = g.add(gemm(f"{name}.dgrad", dgrad_shape), after=(after,))
        if dm.t > 1 and dm.sp and not ordered:
            gather = g.add(collective(f"{name}.input_all_gather", CollectiveKind.all_gather,
                                      dm.full_activation_bytes, dm.t), after=(dgrad,))
        if dm.t > 1 and ordered:
            reduce = g.add(collective(f"{name}.dgrad_{dm.tp_reduce.value}", dm.tp_reduce, dm.full_activation_bytes,
                                      dm.t), after=(dgrad,))
    elif grad_gather is not None:
        dgrad = _gather_into_gemm(g, grad_gather, f"{name}.dgrad", dgrad_shape, dm, after)
    else:
        dgrad = g.add(gemm(f"{name}.dgrad", dgrad_shape), after=(after,))
    # Megatron's gradient-accumulation fusion: the weight gradient accumulates into main_grad
    wgrad_shape = GemmShape(shape.k, shape.n, shape.m, accumulate_bytes=dm.gb, fp8=shape.fp8)
    wgrad = g.add(gemm(f"{name}.wgrad", wgrad_shape), after=(dgrad,) + ((gather,) if gather else ()))
    if column_parallel and dm.t > 1 and not ordered:
        reduce = g.add(collective(f"{name}.dgrad_{dm.tp_reduce.value}", dm.tp_reduce, dm.full_activation_bytes,
                                  dm.t), after=(wgrad,))
    if bias:  # grad_output.sum(0): one read of the output gradient (on s/t tokens after a reduce-scatter)
        tokens = shape.m if column_parallel else dm.local_tokens
        g.add(elementwise(f"{name}.bias_grad", tokens * shape.n, 1, 0, dm.ab), after=(wgrad,))
    return reduce or dgrad


def _input_cast(g: GraphBuilder, name: str, numel: int, dm: Dims) -> None:
    """Transformer Engine's cast_transpose of a linear layer's input to FP8 (kept for wgrad)."""
    g.add(elementwise(f"{name}.input_cast", numel, 1, 2 * FP8_BYTES / dm.ab, dm.ab))


@dataclass(frozen=True)
class ColumnParallelLinear(Module):
    """Y = X A, A split along its columns (output features) over the TP ranks: A = [A_1, ..., A_t].

    Under SP the input arrives sequence-sharded and is all-gathered first (``gather_name``); the
    GEMM saves the sharded input. ``bias_add``: Megatron adds the bias in a kernel of its own (QKV;
    fc1's is fused into the activation). ``split_numel``: the output is split into views (q, k, v)
    whose gradients autograd assembles into one tensor before this layer's backward.
    """

    name: str
    dm: Dims
    out_features: int  # per rank
    in_features: int
    gather_name: str
    bias_add: bool = False
    bias_grad: bool = False
    fp8: bool = False
    split_numel: int = 0
    input_saved_elsewhere: bool = False  # its input is a tensor another op already keeps (same storage)

    @property
    def shape(self) -> GemmShape:
        return GemmShape(self.dm.tokens, self.out_features, self.in_features, fp8=self.fp8)

    def forward(self, g: GraphBuilder) -> None:
        dm = self.dm
        saved = dm.local_tokens * self.in_features
        if self.fp8:
            _input_cast(g, self.name, saved, dm)
        saves = (() if self.input_saved_elsewhere and not self.fp8 else
                 (SavedTensor(f"{self.name}.input", saved, FP8_BYTES if self.fp8 else dm.ab),))
        if dm.t > 1 and dm.sp:
            _gather_into_gemm(g, self.gather_name, self.name, self.shape, dm, None, saves)
        else:
            g.add(gemm(self.name, self.shape, saves=saves))
        if self.bias_add:
            g.add(elementwise(f"{self.name}.bias_add", dm.tokens * self.out_features, 1, 1, dm.ab))

    def backward(self, g: GraphBuilder, after: str) -> str:
        if self.split_numel:
            after = g.add(elementwise(f"{self.name}.split.backward", self.split_numel, 1, 1, self.dm.ab),
                          after=(after,))
        return _linear_backward(g, self.name, self.shape, self.dm, True, after, self.bias_grad)


@dataclass(frozen=True)
class RowParallelLinear(Module):
    """Y = X A, A split along its rows (input features): X = [X_1, ..., X_t], Y = sum_i X_i A_i,
    the sum an all-reduce, or a reduce-scatter over the sequence under SP (``reduce_prefix``)."""

    name: str
    dm: Dims
    out_features: int
    in_features: int  # per rank
    reduce_prefix: str
    bias_grad: bool = False
    fp8: bool = False

    @property
    def shape(self) -> GemmShape:
        return GemmShape(self.dm.tokens, self.out_features, self.in_features, fp8=self.fp8)

    def forward(self, g: GraphBuilder) -> None:
        dm = self.dm
        saved = dm.tokens * self.in_features
        if self.fp8:
            _input_cast(g, self.name, saved, dm)
        _gemm_into_reduce(g, self.name, self.shape, f"{self.reduce_prefix}_{dm.tp_reduce.value}", dm, None,
                          saves=(SavedTensor(f"{self.name}.input", saved, FP8_BYTES if self.fp8 else dm.ab),))

    def backward(self, g: GraphBuilder, after: str) -> str:
        gather = f"{self.name}.grad_all_gather" if self.dm.t > 1 and self.dm.sp else None
        return _linear_backward(g, self.name, self.shape, self.dm, False, after, self.bias_grad, gather)


@dataclass(frozen=True)
class Activation(Module):
    """GeLU (fused with fc1's bias) or SwiGLU on fc1's output, saving its input."""

    name: str
    dm: Dims

    def forward(self, g: GraphBuilder) -> None:
        n = self.dm.tokens * self.dm.mlp_in
        g.add(elementwise(self.name, n, 1, self.dm.f / self.dm.mlp_in, self.dm.ab,
                          saves=(SavedTensor(f"{self.name}.input", n, self.dm.ab),)))

    def backward(self, g: GraphBuilder, after: str) -> str:
        return g.add(elementwise(f"{self.name}.backward", self.dm.tokens * self.dm.mlp_in, 2, 1, self.dm.ab),
                     after=(after,))


@dataclass(frozen=True)
class Rotary(Module):
    """Rotary position embedding applied to q and k."""

    dm: Dims

    @property
    def numel(self) -> int:
        return self.dm.tokens * (self.dm.a * self.dm.d + self.dm.kv)

    def forward(self, g: GraphBuilder) -> None:
        g.add(elementwise("rotary", self.numel, 1, 1, self.dm.ab))

    def backward(self, g: GraphBuilder, after: str) -> str:
        return g.add(elementwise("rotary.backward", self.numel, 1, 1, self.dm.ab), after=(after,))


def build_forward(modules: list[Module]) -> GraphBuilder:
    g = GraphBuilder()
    for m in modules:
        m.forward(g)
    return g


def build_backward(modules: list[Module], first: Op | None = None) -> GraphBuilder:
    """The modules' backwards in reverse order; ``first`` (e.g. the loss's backward) starts it."""
    g = GraphBuilder()
    after = g.add(first) if first is not None else None
    for m in reversed(modules):
        after = m.backward(g, after)
    return g


__all__ = [
    "FP8_BYTES",
    "INDEX_BYTES",
    "REDUCE_SCATTER_SPLITS",
    "Activation",
    "ColumnParallelLinear",
    "ContextParallelAttention",
    "CoreAttention",
    "Dims",
    "DropoutAdd",
    "FlashAttention",
    "MoEMLP",
    "Module",
    "Norm",
    "Rotary",
    "RowParallelLinear",
    "build_backward",
    "build_forward",
]
