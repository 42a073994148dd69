"""The mixture-of-experts MLP, kept apart from the dense parts: its sizes come from the routing (top-k,
the experts on each expert-parallel rank, the load imbalance planned for) and its collectives run over the
expert-parallel group rather than the tensor-parallel one, so a change to the router, the token dispatcher
or the experts' GEMMs stays here.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from simulator.graph.module_base import Dims, Module
from simulator.graph.ops import (
    FP32_BYTES,
    CollectiveKind,
    GemmShape,
    GraphBuilder,
    SavedTensor,
    collective,
    elementwise,
    gemm,
)

INDEX_BYTES = 8  # torch's int64 indices (top-k, sort)


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
