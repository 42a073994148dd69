"""The per-rank sizes every part of a layer is built from, and the contract each part keeps. They sit
below the parts themselves (the dense ones, attention, the mixture of experts), so that each kind of part
builds on them alone and none needs another.

``Dims`` holds one layer's sizes on one tensor-parallel rank for a micro-batch (Korthikanti et al.
2022, Table 1: s sequence, b micro-batch, h hidden, a heads, t tensor-parallel size); ``Module`` is
what the layer graph asks of each part: its forward ops, and its backward's after a given op.
"""

from __future__ import annotations

from dataclasses import dataclass

from simulator.graph.ops import FP32_BYTES, CollectiveKind, GraphBuilder


@dataclass(frozen=True)
class Dims:
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
    tp_overlap: bool = False  # --tp-comm-overlap: SP collectives pipelined with their GEMMs in chunks
    cp: int = 1  # context-parallel ranks sharing each sequence (s / cp tokens each, t ranks apart)
    ordered_overlap: bool = True  # a collective issued before a GEMM starts before it (one CUDA work queue)

    @property
    def tokens(self) -> int:
        """Tokens of this rank's micro-batch: all of them, or s b / cp under context parallelism."""
        return self.s * self.b // self.cp

    @property
    def local_tokens(self) -> int:
        """Tokens a norm or dropout sees: all of them, or s/t of them under sequence parallelism."""
        return self.tokens // self.t if self.sp else self.tokens

    @property
    def full_activation_bytes(self) -> int:
        """One [s, b, h] activation of all tokens: what a tensor-parallel collective moves."""
        return self.tokens * self.h * self.ab

    @property
    def chunked(self) -> bool:
        """Whether SP's collectives run chunk by chunk beside their GEMMs (``--tp-comm-overlap``)."""
        return self.tp_overlap and self.sp and self.t > 1

    @property
    def tp_reduce(self) -> CollectiveKind:
        """Row-parallel outputs are all-reduced, or reduce-scattered over the sequence under SP."""
        return CollectiveKind.reduce_scatter if self.sp else CollectiveKind.all_reduce


class Module:
    """A part of the layer: ``forward`` adds its ops; ``backward`` adds its gradient's and returns the
    op its input gradient comes from."""

    def forward(self, g: GraphBuilder) -> None:
        raise NotImplementedError

    def backward(self, g: GraphBuilder, after: str) -> str:
        raise NotImplementedError
