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
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from simulator.graph.ops import (
    CORE_ATTENTION,
    FP32_BYTES,
    MASK_BYTES,
    CollectiveKind,
    GemmShape,
    GraphBuilder,
    Op,
    OpKind,
    SavedTensor,
    collective,
    elementwise,
    gemm,
)
from simulator.graph.module_base import Dims, Module

FP8_BYTES = 1
INDEX_BYTES = 8  # torch's int64 indices (top-k, sort)
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
    sharded saved input is all-gathered again for wgrad, overlapped with dgrad. Under FP8
    (Transformer Engine) the output gradient is cast (and transposed for wgrad) first.
    Row-parallel under SP: the output gradient is all-gathered (``grad_gather``) before dgrad.
    """
    gather = None
    if column_parallel and dm.t > 1 and dm.sp:
        gather = g.add(collective(f"{name}.input_all_gather", CollectiveKind.all_gather, dm.full_activation_bytes,
                                  dm.t), after=(after,))
    if shape.fp8:  # cast_transpose of the output gradient: read it, write fp8 and its transpose
        after = g.add(elementwise(f"{name}.grad_cast", shape.m * shape.n, 1, 2 * FP8_BYTES / dm.ab, dm.ab),
                      after=(after,))
    dgrad_shape = GemmShape(shape.m, shape.k, shape.n, fp8=shape.fp8)
    reduce = None
    if column_parallel:  # the reduction already runs beside wgrad (Transformer Engine's bulk overlap too)
        dgrad = g.add(gemm(f"{name}.dgrad", dgrad_shape), after=(after,))
        if dm.t > 1:
            reduce = g.add(collective(f"{name}.dgrad_{dm.tp_reduce.value}", dm.tp_reduce, dm.full_activation_bytes,
                                      dm.t), after=(dgrad,))
    elif grad_gather is not None:
        dgrad = _gather_into_gemm(g, grad_gather, f"{name}.dgrad", dgrad_shape, dm, after)
    else:
        dgrad = g.add(gemm(f"{name}.dgrad", dgrad_shape), after=(after,))
    # Megatron's gradient-accumulation fusion: the weight gradient accumulates into main_grad
    wgrad_shape = GemmShape(shape.k, shape.n, shape.m, accumulate_bytes=dm.gb, fp8=shape.fp8)
    wgrad = g.add(gemm(f"{name}.wgrad", wgrad_shape), after=(dgrad,) + ((gather,) if gather else ()))
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


@dataclass(frozen=True)
class FlashAttention(Module):
    """A fused causal attention kernel that never materialises the s x s scores; it keeps q, k, v and
    the per-row log-sum-exp. Its backward recomputes the scores: 2.5x the forward's FLOPs (FA2)."""

    dm: Dims

    def forward(self, g: GraphBuilder) -> None:
        dm = self.dm
        q, kv = dm.tokens * dm.a * dm.d, dm.tokens * dm.kv
        saves = (SavedTensor("q", q, dm.ab, region_input=True), SavedTensor("k", kv, dm.ab, region_input=True),
                 SavedTensor("v", kv, dm.ab, region_input=True),
                 SavedTensor("attention.logsumexp", dm.b * dm.a * dm.s, FP32_BYTES))
        g.add(Op("attention", OpKind.flash_attention, flops=self.flops, saves=saves, region=CORE_ATTENTION,
                 attention=(dm.b * dm.a, dm.s, dm.d, True)))

    @property
    def flops(self) -> float:
        dm = self.dm
        return 4.0 * dm.b * dm.a * dm.s * dm.s * dm.d / 2  # causal mask skips half of QK^T and PV

    def backward(self, g: GraphBuilder, after: str) -> str:
        dm = self.dm
        return g.add(Op("attention.backward", OpKind.flash_attention, flops=2.5 * self.flops, region=CORE_ATTENTION,
                        attention=(dm.b * dm.a, dm.s, dm.d, True)), after=(after,))


@dataclass(frozen=True)
class ContextParallelAttention(Module):
    """Fused causal attention over a sequence split across ``cp`` ranks (Transformer Engine's context
    parallelism), each holding 2 of 2 cp load-balanced chunks, so every rank does 1/cp of the work.

    ``p2p`` (ring attention): the cp blocks of keys and values travel around the CP group; block i's
    attention runs while block i + 1 arrives, and the backward passes the key/value gradients along too.
    ``a2a`` (Ulysses): all-to-alls turn the sequence split into a head split and back, and attention runs
    over the whole sequence for a / cp heads. ``allgather``: keys and values are all-gathered, their
    gradients reduce-scattered. Each keeps what flash attention keeps, for its own tokens.
    """

    dm: Dims
    comm: str

    @property
    def _flops(self) -> float:
        dm = self.dm
        return 4.0 * dm.b * dm.a * dm.s * dm.s * dm.d / 2 / dm.cp  # this rank's share of the causal product

    def _kv_bytes(self) -> int:
        return 2 * self.dm.tokens * self.dm.kv * self.dm.ab  # this rank's keys and values

    def _attention(self, name: str, flops: float, seq: int, saves=()) -> Op:
        dm = self.dm
        return Op(name, OpKind.flash_attention, flops=flops, saves=tuple(saves), region=CORE_ATTENTION,
                  attention=(dm.b * dm.a, seq, dm.d, True))

    def _comm(self, name: str, kind: CollectiveKind, nbytes: int):
        # inside the core-attention region: selective recompute replays the attention, and with it the
        # exchanges that bring its keys and values
        return collective(name, kind, nbytes, self.dm.cp, self.dm.t, region=CORE_ATTENTION)

    def forward(self, g: GraphBuilder) -> None:
        dm = self.dm
        q, kv = dm.tokens * dm.a * dm.d, dm.tokens * dm.kv
        saves = (SavedTensor("q", q, dm.ab, region_input=True), SavedTensor("k", kv, dm.ab, region_input=True),
                 SavedTensor("v", kv, dm.ab, region_input=True),
                 SavedTensor("attention.logsumexp", dm.b * dm.a * dm.s // dm.cp, FP32_BYTES))
        if self.comm == "p2p":
            self._ring(g, "attention", 1.0, self._kv_bytes(), saves)
        elif self.comm == "a2a":
            g.add(self._comm("attention.a2a_qkv", CollectiveKind.all_to_all, dm.tokens * (dm.a * dm.d + 2 * dm.kv) * dm.ab))
            g.add(self._attention("attention", self._flops, dm.s, saves))
            g.add(self._comm("attention.a2a_out", CollectiveKind.all_to_all, q * dm.ab))
        else:
            g.add(self._comm("attention.kv_all_gather", CollectiveKind.all_gather, self._kv_bytes() * dm.cp))
            g.add(self._attention("attention", self._flops, dm.s // dm.cp, saves))

    def _ring(self, g: GraphBuilder, name: str, scale: float, block_bytes: int, saves=(),
              after: str | None = None) -> str:
        """cp attention blocks, each after the previous one and after its keys and values arrived; the
        exchange that brings block i + 1 runs beside block i."""
        start = after if after is not None else g.last
        first = (start,) if start is not None else ()
        per_block = scale * self._flops / self.dm.cp
        compute = exchange = None
        for i in range(self.dm.cp):
            deps = first if i == 0 else tuple(d for d in (compute, exchange) if d is not None)
            compute = g.add(self._attention(f"{name}.block{i}", per_block, self.dm.s // self.dm.cp,
                                            saves if i == 0 else ()), after=deps)
            if i < self.dm.cp - 1:
                exchange = g.add(self._comm(f"{name}.kv_exchange{i}", CollectiveKind.send_recv, block_bytes),
                                 after=(exchange,) if exchange else first)
        g.last = compute
        return compute

    def backward(self, g: GraphBuilder, after: str) -> str:
        dm = self.dm
        if self.comm == "p2p":  # keys and values travel again, with their gradients
            return self._ring(g, "attention.backward", 2.5, 2 * self._kv_bytes(), after=after)
        if self.comm == "a2a":
            g.add(self._comm("attention.backward.a2a_out", CollectiveKind.all_to_all, dm.tokens * dm.a * dm.d * dm.ab),
                  after=(after,))
            g.add(self._attention("attention.backward", 2.5 * self._flops, dm.s))
            return g.add(self._comm("attention.backward.a2a_qkv", CollectiveKind.all_to_all,
                                    dm.tokens * (dm.a * dm.d + 2 * dm.kv) * dm.ab))
        g.add(self._comm("attention.backward.kv_all_gather", CollectiveKind.all_gather, self._kv_bytes() * dm.cp),
              after=(after,))
        g.add(self._attention("attention.backward", 2.5 * self._flops, dm.s // dm.cp))
        return g.add(self._comm("attention.backward.kv_reduce_scatter", CollectiveKind.reduce_scatter,
                                self._kv_bytes() * dm.cp))


@dataclass(frozen=True)
class CoreAttention(Module):
    """Megatron's unfused attention: QK^T, the softmax (``softmax``: its kernels as (name, bytes read,
    bytes written) per score element), dropout on the probabilities, the product with V, and the
    permute-copy of the context back to [s, b, heads x d]. The region selective recompute replays."""

    dm: Dims
    softmax: tuple[tuple[str, float, float], ...]
    dropout: float

    @property
    def probs(self) -> int:
        return self.dm.b * self.dm.a * self.dm.s * self.dm.s

    def _scores(self) -> GemmShape:
        return GemmShape(self.dm.s, self.dm.s, self.dm.d, batch=self.dm.b * self.dm.a)

    def _context(self) -> GemmShape:
        return GemmShape(self.dm.s, self.dm.d, self.dm.s, batch=self.dm.b * self.dm.a)

    def forward(self, g: GraphBuilder) -> None:
        dm, probs, ab = self.dm, self.probs, self.dm.ab
        q, kv = dm.tokens * dm.a * dm.d, dm.tokens * dm.kv
        g.add(gemm("attention_scores", self._scores(), kind=OpKind.batched_gemm, region=CORE_ATTENTION, saves=(
            SavedTensor("q", q, ab, region_input=True), SavedTensor("k", kv, ab, region_input=True))))
        for name, read, write in self.softmax:  # the softmax keeps its output, in the dtype it computes in
            saves = (SavedTensor("softmax.output", probs, int(write)),) if name == "softmax" else ()
            g.add(elementwise(name, probs, read / ab, write / ab, ab, region=CORE_ATTENTION, saves=saves))
        context_saves = [SavedTensor("v", kv, ab, region_input=True)]
        if any(name == "softmax.cast_back" for name, _, _ in self.softmax) and self.dropout == 0:
            # the context GEMM keeps the cast-back copy
            context_saves.append(SavedTensor("softmax.cast_back.output", probs, ab))
        if self.dropout > 0:
            g.add(elementwise("attention_dropout", probs, 1, 1, ab, region=CORE_ATTENTION, mask=True,
                              saves=(SavedTensor("attention_dropout.mask", probs, MASK_BYTES),)))
            context_saves.append(SavedTensor("attention_dropout.output", probs, ab))
        # without dropout the context GEMM keeps the softmax output, already counted once
        g.add(gemm("attention_context", self._context(), kind=OpKind.batched_gemm, region=CORE_ATTENTION,
                   saves=tuple(context_saves)))
        # [b * heads, s, d] -> [s, b, heads * d] for the projection: permute(...).contiguous() copies
        g.add(elementwise("attention_context.copy", q, 1, 1, ab, region=CORE_ATTENTION))

    def backward(self, g: GraphBuilder, after: str) -> str:
        dm, probs, ab = self.dm, self.probs, self.dm.ab
        ctx, sc = self._context(), self._scores()
        g.add(elementwise("attention_context.copy.backward", dm.tokens * dm.a * dm.d, 1, 1, ab), after=(after,))
        g.add(gemm("attention_context.dgrad_probs", GemmShape(ctx.m, ctx.k, ctx.n, ctx.batch), kind=OpKind.batched_gemm))
        g.add(gemm("attention_context.dgrad_v", GemmShape(ctx.k, ctx.n, ctx.m, ctx.batch), kind=OpKind.batched_gemm))
        if self.dropout > 0:
            g.add(elementwise("attention_dropout.backward", probs, 1, 1, ab, mask=True))
        for name, read, write in reversed(self.softmax):
            if name == "softmax":  # reads its output and the gradient, writes the input gradient
                g.add(elementwise("softmax.backward", probs, 3 * write / ab - 1, 1, ab))
            else:  # the gradient passes through: read in one dtype, written in the other
                g.add(elementwise(f"{name}.backward", probs, write / ab, read / ab, ab))
        g.add(gemm("attention_scores.dgrad_q", GemmShape(sc.m, sc.k, sc.n, sc.batch), kind=OpKind.batched_gemm))
        return g.add(gemm("attention_scores.dgrad_k", GemmShape(sc.n, sc.k, sc.m, sc.batch), kind=OpKind.batched_gemm))


@dataclass(frozen=True)
class MoEMLP(Module):
    """A mixture-of-experts MLP as Megatron-Core runs it (``MoELayer``): a router (a GEMM to the experts'
    scores, softmax and top-k in fp32), the token dispatcher, the local experts and the combine.

    ``alltoall``: the routed tokens are permuted by expert and exchanged over the EP group (and all-gathered
    over the expert-TP group when experts are split), computed, and sent back the same way. ``allgather``:
    every rank of the TP x EP group all-gathers the group's tokens, keeps those of its experts, and the
    outputs are reduce-scattered back. The experts of a rank run as one grouped GEMM (``grouped``) or one
    GEMM each. Each expert sees its share of the routed tokens times the load imbalance planned for (the
    busiest rank sets the pace), capped by the capacity factor where tokens beyond it are dropped.
    """

    dm: Dims
    experts: int
    topk: int
    expert_ffn: int  # one expert's inner size, all expert-TP ranks together
    swiglu: bool
    ep: int
    etp: int
    dispatcher: str
    grouped: bool
    imbalance: float
    ep_stride: int  # ranks between EP members (the expert-TP size)

    @property
    def _local_experts(self) -> int:
        return self.experts // self.ep

    @property
    def _routed(self) -> int:
        """Token copies this rank routes: its tokens times top-k."""
        return self.dm.local_tokens * self.topk

    @property
    def _expert_tokens(self) -> int:
        """Token copies this rank's experts compute on (the busiest rank)."""
        return max(1, round(self._routed * self.etp * self.imbalance))

    def _ffn(self) -> tuple[int, int]:
        f = self.expert_ffn // self.etp
        return (2 * f if self.swiglu else f), f

    def _expert_shape(self, n: int, k: int) -> GemmShape:
        per = max(1, -(-self._expert_tokens // self._local_experts))
        return GemmShape(per, n, k, batch=self._local_experts, grouped=self.grouped)

    def forward(self, g: GraphBuilder) -> None:
        dm, ab, h = self.dm, self.dm.ab, self.dm.h
        t_local, routed, tokens = dm.local_tokens, self._routed, self._expert_tokens
        fin, f = self._ffn()
        g.add(gemm("router", GemmShape(t_local, self.experts, h),
                   saves=(SavedTensor("router.input", t_local * h, ab),)))
        g.add(elementwise("router.topk", t_local * self.experts, FP32_BYTES / ab, FP32_BYTES / ab, ab,
                          saves=(SavedTensor("router.probs", t_local * self.topk, FP32_BYTES),
                                 SavedTensor("router.topk_indices", t_local * self.topk, INDEX_BYTES))))
        self._dispatch(g, routed, tokens)
        g.add(gemm("experts.fc1", self._expert_shape(fin, h), saves=(SavedTensor("experts.fc1.input", tokens * h, ab),)))
        # the activation is scaled by each copy's router probability, which it keeps for its backward
        g.add(elementwise("experts.activation", tokens * fin, 1, f / fin, ab,
                          saves=(SavedTensor("experts.activation.input", tokens * fin, ab),
                                 SavedTensor("experts.permuted_probs", tokens, ab))))
        g.add(gemm("experts.fc2", self._expert_shape(h, f), saves=(SavedTensor("experts.fc2.input", tokens * f, ab),)))
        self._combine(g, routed, tokens)

    def _tokens_per_expert(self, g: GraphBuilder) -> None:
        """The per-expert token counts copied to the host, which sizes the all-to-all's splits and the
        experts' GEMMs from them: the host waits for the device to drain here, once per MoE layer forward."""
        g.add(replace(elementwise("moe.tokens_per_expert", self.experts, 1, 1, INDEX_BYTES), host_sync=True))

    def _dispatch(self, g: GraphBuilder, routed: int, tokens: int) -> None:
        dm, ab, h = self.dm, self.dm.ab, self.dm.h
        self._tokens_per_expert(g)
        # the permutation's index map (int64), kept to unpermute: one per copy the permute moves, on
        # the routing side (alltoall) or on the experts' side (allgather)
        if self.dispatcher == "alltoall":
            g.add(elementwise("moe.permute", routed * h, 1, 1, ab,
                              saves=(SavedTensor("moe.permute.indices", routed, INDEX_BYTES),)))
            g.add(collective("moe.dispatch_all_to_all", CollectiveKind.all_to_all, routed * h * ab, self.ep,
                             self.ep_stride))
            if self.etp > 1:
                g.add(collective("moe.dispatch_all_gather", CollectiveKind.all_gather, tokens * h * ab, self.etp))
        else:
            group = self.ep * self.etp
            g.add(collective("moe.dispatch_all_gather", CollectiveKind.all_gather, dm.local_tokens * group * h * ab,
                             group))
            g.add(elementwise("moe.permute", tokens * h, 1, 1, ab,
                              saves=(SavedTensor("experts.sorted_indices", tokens, INDEX_BYTES),)))

    def _combine(self, g: GraphBuilder, routed: int, tokens: int) -> None:
        dm, ab, h = self.dm, self.dm.ab, self.dm.h
        if self.dispatcher == "alltoall":
            if self.etp > 1:
                g.add(collective("moe.combine_reduce_scatter", CollectiveKind.reduce_scatter, tokens * h * ab,
                                 self.etp))
            g.add(collective("moe.combine_all_to_all", CollectiveKind.all_to_all, routed * h * ab, self.ep,
                             self.ep_stride))
        else:
            group = self.ep * self.etp
            g.add(elementwise("moe.unpermute_local", tokens * h, 1, 1, ab))
            g.add(collective("moe.combine_reduce_scatter", CollectiveKind.reduce_scatter,
                             dm.local_tokens * group * h * ab, group))
        # unpermute and sum each token's top-k outputs weighted by its router probabilities
        g.add(elementwise("moe.unpermute", routed * h, 1, 1 / self.topk, ab))

    def backward(self, g: GraphBuilder, after: str) -> str:
        dm, ab, h = self.dm, self.dm.ab, self.dm.h
        t_local, routed, tokens = dm.local_tokens, self._routed, self._expert_tokens
        fin, f = self._ffn()
        g.add(elementwise("moe.unpermute.backward", routed * h, 1 / self.topk, 1, ab), after=(after,))
        if self.dispatcher == "alltoall":
            g.add(collective("moe.combine_all_to_all.backward", CollectiveKind.all_to_all, routed * h * ab, self.ep,
                             self.ep_stride))
            if self.etp > 1:
                g.add(collective("moe.combine_reduce_scatter.backward", CollectiveKind.all_gather, tokens * h * ab,
                                 self.etp))
        else:
            group = self.ep * self.etp
            g.add(collective("moe.combine_reduce_scatter.backward", CollectiveKind.all_gather,
                             t_local * group * h * ab, group))
        for name, shape, act in (("experts.fc2", self._expert_shape(h, f), True),
                                 ("experts.fc1", self._expert_shape(fin, h), False)):
            dgrad = g.add(gemm(f"{name}.dgrad", replace(shape, n=shape.k, k=shape.n)))
            g.add(gemm(f"{name}.wgrad", GemmShape(shape.k, shape.n, shape.m, batch=shape.batch, grouped=shape.grouped,
                                                   accumulate_bytes=dm.gb)), after=(dgrad,))
            g.last = dgrad
            if act:
                g.add(elementwise("experts.activation.backward", tokens * fin, 2, 1, ab))
        if self.dispatcher == "alltoall":
            if self.etp > 1:
                g.add(collective("moe.dispatch_all_gather.backward", CollectiveKind.reduce_scatter, tokens * h * ab,
                                 self.etp))
            g.add(collective("moe.dispatch_all_to_all.backward", CollectiveKind.all_to_all, routed * h * ab, self.ep,
                             self.ep_stride))
            g.add(elementwise("moe.permute.backward", routed * h, 1, 1 / self.topk, ab))
        else:
            group = self.ep * self.etp
            g.add(elementwise("moe.permute.backward", tokens * h, 1, 1, ab))
            g.add(collective("moe.dispatch_all_gather.backward", CollectiveKind.reduce_scatter,
                             t_local * group * h * ab, group))
        g.add(elementwise("router.topk.backward", t_local * self.experts, 2 * FP32_BYTES / ab, FP32_BYTES / ab, ab))
        dgrad = g.add(gemm("router.dgrad", GemmShape(t_local, h, self.experts)))
        g.add(gemm("router.wgrad", GemmShape(h, self.experts, t_local, accumulate_bytes=dm.gb)), after=(dgrad,))
        g.last = dgrad
        return dgrad


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
