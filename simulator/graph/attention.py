"""Attention as a layer runs it, in the three forms the plan chooses between: a fused flash kernel,
the same split over a context-parallel group (ring, Ulysses or all-gathered keys and values), and
Megatron's unfused core attention. They are the ops whose work grows with the square of the sequence
and the region selective recompute replays, so they change together and apart from the linears around
them (``simulator.graph.modules``).
"""

from __future__ import annotations

from dataclasses import dataclass

from simulator.graph.module_base import Dims, Module
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


@dataclass(frozen=True)
class FlashAttention(Module):
    """A fused causal attention kernel that never materialises the s x s scores; it keeps q, k, v and
    the per-row log-sum-exp. Its backward recomputes the scores: 2.5x the forward's FLOPs (FA2).
    ``backend`` is Megatron's --attention-backend (auto, flash, fused): which kernel runs is the GPU's
    answer to it, so the op carries it as its kernel for the cost model to look up."""

    dm: Dims
    backend: str = "auto"

    def forward(self, g: GraphBuilder) -> None:
        dm = self.dm
        q, kv = dm.tokens * dm.a * dm.d, dm.tokens * dm.kv
        saves = (SavedTensor("q", q, dm.ab, region_input=True), SavedTensor("k", kv, dm.ab, region_input=True),
                 SavedTensor("v", kv, dm.ab, region_input=True),
                 SavedTensor("attention.logsumexp", dm.b * dm.a * dm.s, FP32_BYTES))
        g.add(Op("attention", OpKind.flash_attention, flops=self.flops, saves=saves, region=CORE_ATTENTION,
                 attention=(dm.b * dm.a, dm.s, dm.d, True, False), kernel=self.backend))

    @property
    def flops(self) -> float:
        dm = self.dm
        return 4.0 * dm.b * dm.a * dm.s * dm.s * dm.d / 2  # causal mask skips half of QK^T and PV

    def backward(self, g: GraphBuilder, after: str) -> str:
        dm = self.dm
        return g.add(Op("attention.backward", OpKind.flash_attention, flops=2.5 * self.flops, region=CORE_ATTENTION,
                        attention=(dm.b * dm.a, dm.s, dm.d, True, True), kernel=self.backend), after=(after,))


@dataclass(frozen=True)
class ContextParallelAttention(Module):
    """Fused causal attention over a sequence split across ``cp`` ranks (Transformer Engine's context
    parallelism), each holding 2 of 2 cp load-balanced chunks, so every rank does 1/cp of the work.

    ``p2p`` (ring attention): the cp blocks of keys and values travel around the CP group; block i's
    attention runs while block i + 1 arrives, and the backward passes the key/value gradients along too.
    Only a rank's own block sits on the diagonal and runs under the causal mask; with two load-balanced
    chunks per rank, every other block is half a square the mask leaves whole (all of the rank's queries
    against the first half of the visiting keys, or its second half of queries against all of them), so
    it runs as an unmasked kernel over the executed half (Transformer Engine's ring attention).
    ``a2a`` (Ulysses): all-to-alls turn the sequence split into a head split and back, and attention runs
    over the whole sequence for a / cp heads. ``allgather``: keys and values are all-gathered, their
    gradients reduce-scattered. Each keeps what flash attention keeps, for its own tokens.
    """

    dm: Dims
    comm: str
    backend: str = "auto"  # Megatron's --attention-backend, as for FlashAttention

    @property
    def _flops(self) -> float:
        dm = self.dm
        return 4.0 * dm.b * dm.a * dm.s * dm.s * dm.d / 2 / dm.cp  # this rank's share of the causal product

    def _kv_bytes(self) -> int:
        return 2 * self.dm.tokens * self.dm.kv * self.dm.ab  # this rank's keys and values

    def _attention(self, name: str, flops: float, seq: int, saves=(), *, backward: bool = False,
                   causal: bool = True) -> Op:
        dm = self.dm
        return Op(name, OpKind.flash_attention, flops=flops, saves=tuple(saves), region=CORE_ATTENTION,
                  attention=(dm.b * dm.a, seq, dm.d, causal, backward), kernel=self.backend)

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
            self._ring(g, "attention", False, self._kv_bytes(), saves)
        elif self.comm == "a2a":
            g.add(self._comm("attention.a2a_qkv", CollectiveKind.all_to_all, dm.tokens * (dm.a * dm.d + 2 * dm.kv) * dm.ab))
            g.add(self._attention("attention", self._flops, dm.s, saves))
            g.add(self._comm("attention.a2a_out", CollectiveKind.all_to_all, q * dm.ab))
        else:
            g.add(self._comm("attention.kv_all_gather", CollectiveKind.all_gather, self._kv_bytes() * dm.cp))
            g.add(self._attention("attention", self._flops, dm.s // dm.cp, saves))

    def _ring(self, g: GraphBuilder, name: str, backward: bool, block_bytes: int, saves=(),
              after: str | None = None) -> str:
        """cp attention blocks, each after the previous one and after its keys and values arrived; the
        exchange that brings block i + 1 runs beside block i. Block 0, the rank's own, is the diagonal."""
        start = after if after is not None else g.last
        first = (start,) if start is not None else ()
        per_block = (2.5 if backward else 1.0) * self._flops / self.dm.cp
        compute = exchange = None
        for i in range(self.dm.cp):
            deps = first if i == 0 else tuple(d for d in (compute, exchange) if d is not None)
            compute = g.add(self._attention(f"{name}.block{i}", per_block, self.dm.s // self.dm.cp,
                                            saves if i == 0 else (), backward=backward, causal=i == 0),
                            after=deps)
            if i < self.dm.cp - 1:
                exchange = g.add(self._comm(f"{name}.kv_exchange{i}", CollectiveKind.send_recv, block_bytes),
                                 after=(exchange,) if exchange else first)
        g.last = compute
        return compute

    def backward(self, g: GraphBuilder, after: str) -> str:
        dm = self.dm
        if self.comm == "p2p":  # keys and values travel again, with their gradients
            return self._ring(g, "attention.backward", True, 2 * self._kv_bytes(), after=after)
        if self.comm == "a2a":
            g.add(self._comm("attention.backward.a2a_out", CollectiveKind.all_to_all, dm.tokens * dm.a * dm.d * dm.ab),
                  after=(after,))
            g.add(self._attention("attention.backward", 2.5 * self._flops, dm.s, backward=True))
            return g.add(self._comm("attention.backward.a2a_qkv", CollectiveKind.all_to_all,
                                    dm.tokens * (dm.a * dm.d + 2 * dm.kv) * dm.ab))
        g.add(self._comm("attention.backward.kv_all_gather", CollectiveKind.all_gather, self._kv_bytes() * dm.cp),
              after=(after,))
        g.add(self._attention("attention.backward", 2.5 * self._flops, dm.s // dm.cp, backward=True))
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
