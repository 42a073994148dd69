"""A mixture-of-experts MLP as Megatron-Core's ``MoELayer`` runs it, over the expert process groups.

router -> top-k -> permute -> dispatch -> experts -> combine -> unpermute (+ shared experts)

- **Router**: logits = x W_r^T (h -> num_experts, no bias); in fp32, the k largest logits of each token
  and a softmax over those k (Megatron's default ``moe_router_pre_softmax=False``), so a token's k
  probabilities sum to 1. Under sequence parallelism each TP rank routes its own s/t tokens.
- **Permute**: each token's k copies grouped by expert, tokens in order within an expert (Megatron's
  ``permute``), with each copy's probability.
- **Dispatch**, ``alltoall``: the copies per expert are exchanged over the EP group first, then the
  copies and their probabilities (``all_to_all_single`` with uneven splits); with expert tensor
  parallelism they are all-gathered over the ETP group, and sorted by local expert.
  ``allgather``: every rank of the ETP x EP group all-gathers the group's tokens, probabilities and
  choices and keeps the copies routed to its own experts.
- **Experts**: ``num_experts / EP`` on each rank, each an MLP (Megatron's ``SequentialMLP``) whose fc1
  is split along its output features and fc2 along its input features over ETP, with no
  communication inside (the dispatcher has gathered the tokens). The router probability scales the
  activation's output and fc2's bias (Megatron-Core's ``per_token_scale``), so the combine is a sum.
- **Combine**: the dispatch backwards: reduce-scatter over ETP, all-to-all back, and each token's k
  outputs added up (``allgather``: added up on the gathered tokens, then reduce-scattered over ETP x EP).
- **Shared experts**: a tensor-parallel MLP every token also passes, added to the routed output.

What the layer keeps for backward (``tests/calibration/test_reference_loop.py`` counts it): the router's
input (the norm output, one storage with the shared experts' fc1 input), the fp32 softmax output
(tokens x k), the top-k indices (int64, tokens x k), the permutation (int64, one entry per copy the
permute moves: tokens x k with ``alltoall``, the copies this rank's experts take with ``allgather``),
and for the copies this rank's experts compute on: fc1's input, the activation's input, the copies'
probabilities and fc2's input. The activation is one autograd function that keeps only its input and
the probabilities (Megatron's fused weighted activations), recomputing GeLU in the backward.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from calibration.reference.parallel import (
    ColumnParallelLinear,
    ParallelGroups,
    RowParallelLinear,
    all_gather_first_dim,
    gather_from_sequence_parallel_region,
    init_shard,
    reduce_scatter_to_sequence_parallel_region,
)
from simulator.spec.model import ModelSpec
from simulator.spec.plan import MoEDispatcher, ParallelPlan

# ---------------------------------------------------------------- communication with uneven splits


def all_to_all(x: torch.Tensor, output_splits: list[int], input_splits: list[int], group) -> torch.Tensor:
    """Rows ``input_splits[j]`` of ``x`` go to rank j of ``group``; ``output_splits[j]`` rows arrive from it."""
    out = x.new_empty((sum(output_splits),) + tuple(x.shape[1:]))
    dist.all_to_all_single(out, x.contiguous(), output_splits, input_splits, group=group)
    return out


def gather_v(x: torch.Tensor, sizes: list[int], group) -> torch.Tensor:
    """All-gather of shards of different lengths (``sizes[j]`` rows on rank j), as one all-to-all."""
    n = len(sizes)
    return all_to_all(torch.cat([x] * n), sizes, [x.shape[0]] * n, group)


def reduce_scatter_v(x: torch.Tensor, sizes: list[int], group) -> torch.Tensor:
    """Sum over ranks, rank j keeping rows of its ``sizes[j]``-long slice: one all-to-all and a local sum."""
    n, mine = len(sizes), sizes[dist.get_rank(group)]
    parts = all_to_all(x, [mine] * n, sizes, group)
    return parts.view((n, mine) + tuple(x.shape[1:])).sum(0)


class _AllToAll(torch.autograd.Function):
    """The dispatch or combine exchange over EP; the gradients travel back with the splits swapped."""

    @staticmethod
    def forward(ctx, x, output_splits, input_splits, group):
        ctx.splits, ctx.group = (output_splits, input_splits), group
        return all_to_all(x, output_splits, input_splits, group)

    @staticmethod
    def backward(ctx, grad):
        output_splits, input_splits = ctx.splits
        return all_to_all(grad, input_splits, output_splits, ctx.group), None, None, None


class _GatherV(torch.autograd.Function):
    """Every ETP rank's copies, concatenated in rank order; backward reduce-scatters."""

    @staticmethod
    def forward(ctx, x, sizes, group):
        ctx.sizes, ctx.group = sizes, group
        return gather_v(x, sizes, group)

    @staticmethod
    def backward(ctx, grad):
        return reduce_scatter_v(grad, ctx.sizes, ctx.group), None, None


class _ReduceScatterV(torch.autograd.Function):
    """The ETP ranks' partial expert outputs summed, each rank keeping its own copies; backward all-gathers."""

    @staticmethod
    def forward(ctx, x, sizes, group):
        ctx.sizes, ctx.group = sizes, group
        return reduce_scatter_v(x, sizes, group)

    @staticmethod
    def backward(ctx, grad):
        return gather_v(grad, ctx.sizes, ctx.group), None, None


def _sort_chunks(x: torch.Tensor, sizes: list[int], rows: int) -> torch.Tensor:
    """``x`` holds chunks in (row, column) order of a ``rows x len(sizes)/rows`` grid: put them in (column, row)
    order. Python splits and a concatenation, so nothing is saved for backward."""
    columns = len(sizes) // rows
    parts = x.split(sizes)
    return torch.cat([parts[r * columns + c] for c in range(columns) for r in range(rows)])


class _SortChunks(torch.autograd.Function):
    """Megatron's ``sort_chunks_by_idxs``: the arrived copies, ordered (source, local expert), sorted by expert."""

    @staticmethod
    def forward(ctx, x, sizes, rows):
        columns = len(sizes) // rows
        ctx.back = ([sizes[r * columns + c] for c in range(columns) for r in range(rows)], columns)
        return _sort_chunks(x, sizes, rows)

    @staticmethod
    def backward(ctx, grad):
        return _sort_chunks(grad, *ctx.back), None, None


def sort_chunks(x: torch.Tensor, sizes: list[int], rows: int) -> torch.Tensor:
    return _SortChunks.apply(x, sizes, rows) if rows > 1 and len(sizes) > rows else x


# ---------------------------------------------------------------- permutation


class _Permute(torch.autograd.Function):
    """The copies in expert order: ``tokens[order // k]`` and their probabilities ``probs.flatten()[order]``.

    ``order`` lists copies (token i's j-th choice is copy i k + j); it is all this keeps, and the
    combine's ``_Unpermute`` keeps the same tensor.
    """

    @staticmethod
    def forward(ctx, tokens, probs, order, topk):
        ctx.save_for_backward(order)
        ctx.topk, ctx.num_tokens = topk, tokens.shape[0]
        return tokens.index_select(0, order // topk), probs.reshape(-1).index_select(0, order)

    @staticmethod
    def backward(ctx, grad_tokens, grad_probs):
        (order,) = ctx.saved_tensors
        n, k = ctx.num_tokens, ctx.topk
        grad_input = grad_tokens.new_zeros((n,) + tuple(grad_tokens.shape[1:])).index_add_(0, order // k, grad_tokens)
        grad_p = grad_probs.new_zeros(n * k).index_copy_(0, order, grad_probs).view(n, k)
        return grad_input, grad_p, None, None


class _Unpermute(torch.autograd.Function):
    """Each token's output: the sum of its copies' (already probability-scaled) expert outputs."""

    @staticmethod
    def forward(ctx, copies, order, topk, num_tokens):
        ctx.save_for_backward(order)
        ctx.topk = topk
        return copies.new_zeros((num_tokens,) + tuple(copies.shape[1:])).index_add_(0, order // topk, copies)

    @staticmethod
    def backward(ctx, grad):
        (order,) = ctx.saved_tensors
        return grad.index_select(0, order // ctx.topk), None, None, None


class _WeightedGelu(torch.autograd.Function):
    """gelu(z) x p per copy, keeping z and p only: gelu(z) is recomputed for p's gradient (a fused kernel's way)."""

    @staticmethod
    def forward(ctx, z, probs):
        ctx.save_for_backward(z, probs)
        return F.gelu(z) * probs.unsqueeze(-1)

    @staticmethod
    def backward(ctx, grad):
        z, probs = ctx.saved_tensors
        grad_z = torch.ops.aten.gelu_backward(grad * probs.unsqueeze(-1), z)
        return grad_z, (grad * F.gelu(z)).sum(-1)


# ---------------------------------------------------------------- the layer


class Experts(nn.Module):
    """This rank's experts, global indices ``first .. first + E/EP - 1``: fc1 (split along its output features
    over ETP), gelu scaled by the router probability, fc2 (split along its input features)."""

    def __init__(self, *, model: ModelSpec, groups: ParallelGroups, name: str, seed: int, dtype, device) -> None:
        super().__init__()
        h, etp, r = model.hidden_size, groups.etp_size, groups.etp_rank
        f = model.expert_ffn_size
        self.local = model.num_experts // groups.ep_size
        self.first = groups.ep_rank * self.local
        self.adds_bias = r == 0  # fc2's output is a partial sum over ETP: one rank adds the bias
        self.params = nn.ParameterList()  # fc1 weight, fc1 bias, fc2 weight, fc2 bias of each local expert
        for e in range(self.first, self.first + self.local):
            prefix = f"{name}.{e}"
            for suffix, shape, full, dim, kind in (("fc1.weight", (f // etp, h), (f, h), 0, "normal"),
                                                   ("fc1.bias", (f // etp,), (f,), 0, "zeros"),
                                                   ("fc2.weight", (h, f // etp), (h, f), 1, "normal"),
                                                   ("fc2.bias", (h,), (h,), None, "zeros")):
                param = nn.Parameter(torch.empty(shape, dtype=dtype, device=device))
                init_shard(param, f"{prefix}.{suffix}", full, dim, r, etp, seed, kind)
                param.expert_parallel = True  # reduced over EDP, not DP x CP
                # only ETP rank 0 adds fc2's bias, so its gradient is summed over the ETP ranks
                param.expert_tensor_parallel_partial = suffix == "fc2.bias" and etp > 1
                self.params.append(param)

    def forward(self, copies: torch.Tensor, probs: torch.Tensor, tokens_per_expert: list[int]) -> torch.Tensor:
        """copies (n, h) sorted by local expert, probs (n,) -> (n, h), partial sums over ETP."""
        outs = []
        for e, (x, p) in enumerate(zip(copies.split(tokens_per_expert), probs.split(tokens_per_expert))):
            w1, b1, w2, b2 = self.params[4 * e:4 * e + 4]
            y = F.linear(_WeightedGelu.apply(F.linear(x, w1, b1), p), w2)  # (n_e, f/etp) -> (n_e, h)
            outs.append(y + b2 * p.unsqueeze(-1) if self.adds_bias else y)
        return torch.cat(outs)


class MoELayer(nn.Module):
    """Router, dispatcher, this rank's experts and the shared experts; ``[s, b, h]`` in and out (s/t tokens
    under sequence parallelism, s/cp under context parallelism)."""

    def __init__(self, *, model: ModelSpec, plan: ParallelPlan, groups: ParallelGroups, index: int, seed: int,
                 dtype, device) -> None:
        super().__init__()
        h, name = model.hidden_size, f"layers.{index}.mlp"
        self.groups, self.topk, self.num_experts = groups, model.moe_router_topk, model.num_experts
        self.alltoall = plan.moe_token_dispatcher_type is MoEDispatcher.alltoall
        self.router = nn.Parameter(torch.empty(self.num_experts, h, dtype=dtype, device=device))
        init_shard(self.router, f"{name}.router.weight", (self.num_experts, h), None, 0, 1, seed, "normal")
        self.router.sequence_parallel = plan.sequence_parallel  # each TP rank routes its own tokens
        self.experts = Experts(model=model, groups=groups, name=f"{name}.experts", seed=seed, dtype=dtype,
                               device=device)
        self.shared_fc1 = self.shared_fc2 = None
        if model.moe_shared_expert_intermediate_size:
            common = dict(groups=groups, sequence_parallel=plan.sequence_parallel, seed=seed, dtype=dtype,
                          device=device, bias=model.add_bias_linear)
            size = model.moe_shared_expert_intermediate_size
            self.shared_fc1 = ColumnParallelLinear(h, size, name=f"{name}.shared_experts.fc1", **common)
            self.shared_fc2 = RowParallelLinear(size, h, name=f"{name}.shared_experts.fc2", **common)
        # what the tests read: the copies this rank's experts took in the first forward (the metered
        # micro-batch), and the smallest gap between a chosen and an unchosen logit when tracked
        self.first_expert_tokens: int | None = None
        self.track_margin = False
        self.smallest_margin = float("inf")

    def route(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """tokens (t, h) -> probabilities (t, k) and chosen experts (t, k): the k largest fp32 logits, softmax over
        those k."""
        logits = F.linear(tokens, self.router).float()  # (t, E); keeps the router's input
        if self.track_margin and self.topk < self.num_experts:
            with torch.no_grad():
                top = torch.topk(logits, self.topk + 1, dim=-1).values
                self.smallest_margin = min(self.smallest_margin, (top[:, -2] - top[:, -1]).min().item())
        scores, chosen = torch.topk(logits, self.topk, dim=-1)  # keeps the int64 indices
        return torch.softmax(scores, dim=-1), chosen  # keeps its fp32 output

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s, b, h = x.shape
        tokens = x.reshape(s * b, h)  # a view: one storage with the shared experts' input
        probs, chosen = self.route(tokens)
        probs = probs.to(x.dtype)  # the copies carry them in the activation dtype (Megatron's type_as)
        combine = self._alltoall if self.alltoall else self._allgather
        out = combine(tokens, probs, chosen).view(s, b, h)
        if self.shared_fc1 is not None:
            out = out + self.shared_fc2(F.gelu(self.shared_fc1(x)))
        return out

    def _experts(self, copies, probs, tokens_per_expert: list[int]) -> torch.Tensor:
        if self.first_expert_tokens is None:
            self.first_expert_tokens = sum(tokens_per_expert)
        return self.experts(copies, probs, tokens_per_expert)

    def _alltoall(self, tokens: torch.Tensor, probs: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
        g, local = self.groups, self.experts.local
        flat = chosen.reshape(-1)
        order = torch.argsort(flat, stable=True)  # copies by expert, in token order within each
        copies, copy_probs = _Permute.apply(tokens, probs, order, self.topk)  # (t k, h), (t k,)
        # copies for each (EP rank, local expert) from here, and from each EP rank to my local experts
        sent = torch.bincount(flat, minlength=self.num_experts).view(g.ep_size, local)
        received = all_to_all(sent, [1] * g.ep_size, [1] * g.ep_size, g.ep) if g.ep_size > 1 else sent
        input_splits, output_splits = sent.sum(1).tolist(), received.sum(1).tolist()
        if g.ep_size > 1:
            copies = _AllToAll.apply(copies, output_splits, input_splits, g.ep)
            copy_probs = _AllToAll.apply(copy_probs, output_splits, input_splits, g.ep)
        arrived = received.view(1, g.ep_size, local)  # (ETP rank, source EP rank, local expert)
        if g.etp_size > 1:
            arrived = all_gather_first_dim(arrived, g.etp)
            sizes = arrived.sum((1, 2)).tolist()
            copies, copy_probs = _GatherV.apply(copies, sizes, g.etp), _GatherV.apply(copy_probs, sizes, g.etp)
        chunks = arrived.reshape(-1).tolist()
        sources = g.etp_size * g.ep_size
        copies, copy_probs = sort_chunks(copies, chunks, sources), sort_chunks(copy_probs, chunks, sources)
        out = self._experts(copies, copy_probs, arrived.sum((0, 1)).tolist())
        by_expert = [chunks[r * local + e] for e in range(local) for r in range(sources)]
        out = sort_chunks(out, by_expert, local)  # back to (source, local expert)
        if g.etp_size > 1:
            out = _ReduceScatterV.apply(out, sizes, g.etp)
        if g.ep_size > 1:
            out = _AllToAll.apply(out, input_splits, output_splits, g.ep)
        return _Unpermute.apply(out, order, self.topk, tokens.shape[0])

    def _allgather(self, tokens: torch.Tensor, probs: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
        group, first, local = self.groups.tp_ep, self.experts.first, self.experts.local
        everyone = gather_from_sequence_parallel_region(tokens, group)  # (n t, h)
        everyone_probs = gather_from_sequence_parallel_region(probs, group)  # (n t, k)
        flat = all_gather_first_dim(chosen, group).reshape(-1)
        mine = torch.nonzero((flat >= first) & (flat < first + local)).squeeze(1)
        order = mine[torch.argsort(flat[mine], stable=True)]  # my experts' copies, by expert
        copies, copy_probs = _Permute.apply(everyone, everyone_probs, order, self.topk)
        tokens_per_expert = torch.bincount(flat[mine] - first, minlength=local).tolist()
        out = _Unpermute.apply(self._experts(copies, copy_probs, tokens_per_expert), order, self.topk,
                               everyone.shape[0])
        return reduce_scatter_to_sequence_parallel_region(out, group)
