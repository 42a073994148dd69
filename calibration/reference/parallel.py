"""Process groups and Megatron's tensor-parallel building blocks, over explicit groups.

Rank layout: ``simulator.spec.layout.RankLayout``, Megatron's default order tp-cp-dp-pp, so
``rank = tp + TP * (cp + CP * (dp + DP * stage))`` and global rank 0 is stage 0 with every other
coordinate 0; the expert layers of a mixture-of-experts model decompose the same ranks of a stage
again as etp-ep-edp (Megatron's expert rank generator). Every group here is one the layout names.
Every function takes its process group as an argument; nothing lives in module globals.

Activations are laid out ``[s, b, h]`` (sequence first) as in Megatron, so a sequence-parallel
shard is a contiguous slice of the first dimension.
"""

from __future__ import annotations

import math
import warnings
import zlib
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from simulator.spec.layout import RankLayout


@dataclass(frozen=True)
class ParallelGroups:
    """This rank's coordinates and the groups it talks over."""

    layout: RankLayout
    rank: int
    tp_rank: int
    tp_size: int
    cp_rank: int
    cp_size: int
    dp_rank: int
    dp_size: int
    pp_rank: int
    pp_size: int
    tp: dist.ProcessGroup | None
    cp: dist.ProcessGroup | None  # the ring that passes keys and values around
    cp_ranks: tuple[int, ...]  # global ranks of the CP group, in CP order
    dp_cp: dist.ProcessGroup | None  # DP x CP: every rank with the same parameters (gradients reduce over it)
    embedding: dist.ProcessGroup | None  # first and last stage, for the tied word embedding
    # the expert layers' decomposition of a stage's ranks (etp x ep x edp = tp x cp x dp); a dense model has none
    etp_rank: int = 0
    etp_size: int = 1
    ep_rank: int = 0
    ep_size: int = 1
    edp_size: int = 1
    etp: dist.ProcessGroup | None = None  # the ranks one expert is split over
    ep: dist.ProcessGroup | None = None  # the ranks the experts are spread over: the all-to-all's group
    edp: dist.ProcessGroup | None = None  # the ranks holding the same experts: their gradients reduce over it
    tp_ep: dist.ProcessGroup | None = None  # etp x ep: the allgather dispatcher's group

    def stage_rank(self, stage: int) -> int:
        """Global rank of ``stage`` with this rank's TP, CP and DP coordinates."""
        return self.layout.rank(tp=self.tp_rank, cp=self.cp_rank, dp=self.dp_rank, pp=stage)


def build_groups(layout: RankLayout, experts: bool = False) -> ParallelGroups:
    """Create every group on every rank (``new_group`` is collective) and keep this rank's; ``experts``: the
    expert groups too."""
    world, rank = dist.get_world_size(), dist.get_rank()
    if layout.world != world:
        raise ValueError(f"Invalid parallel dims: tp({layout.tp}) * cp({layout.cp}) * dp({layout.dp}) * "
                         f"pp({layout.pp}) != world_size({world})")
    me = layout.coords(rank)
    # DP x CP: the ranks of one TP rank and stage hold the same parameters (Megatron's data-parallel
    # group with context parallelism), so their gradients are reduced together
    dp_cp = [tuple(r for r in range(world) if (layout.coords(r)["tp"], layout.coords(r)["pp"]) == (t, p))
             for p in range(layout.pp) for t in range(layout.tp)]
    # the tied word embedding: a first-stage rank and the last-stage rank with its TP, CP and DP coordinates
    last = (layout.pp - 1) * layout.stride("pp")
    embedding = [(r, r + last) for r in layout.stage_ranks(0)] if layout.pp > 1 else []
    wanted = [("tp", layout.groups("tp")), ("cp", layout.groups("cp")), ("dp_cp", dp_cp), ("embedding", embedding)]
    expert = {}
    if experts:
        # the ranks of one expert-data-parallel replica of a stage: every expert, each split over ETP
        place = [layout.coords(r, expert=True) for r in range(world)]
        tp_ep = [tuple(r for r in range(world) if (place[r]["edp"], place[r]["pp"]) == (d, p))
                 for p in range(layout.pp) for d in range(layout.size("edp"))]
        wanted += [("etp", layout.groups("etp")), ("ep", layout.groups("ep")), ("edp", layout.groups("edp")),
                   ("tp_ep", tp_ep)]
        mine_e = layout.coords(rank, expert=True)
        expert = dict(etp_rank=mine_e["etp"], etp_size=layout.size("etp"), ep_rank=mine_e["ep"],
                      ep_size=layout.size("ep"), edp_size=layout.size("edp"))
    mine: dict[str, dist.ProcessGroup | None] = {}
    for name, groups in wanted:
        mine[name] = None
        for ranks in groups:  # every rank creates every group, in the same order
            group = dist.new_group(list(ranks))
            if rank in ranks:
                mine[name] = group
    return ParallelGroups(layout, rank, me["tp"], layout.tp, me["cp"], layout.cp, me["dp"], layout.dp, me["pp"],
                          layout.pp, cp_ranks=layout.group("cp", rank), **expert, **mine)


# ---------------------------------------------------------------- collectives along the first dim


def _size(group) -> int:
    return dist.get_world_size(group) if group is not None else 1


# torch 2.13 names them *_single; older releases *_tensor. gloo has both since torch 2.x (checked on the
# installed build by tests/calibration/test_reference_loop.py); where a backend lacks them the
# list-based all-gather and an all-reduce plus slice give the same result.
_ALL_GATHER = getattr(dist, "all_gather_single", None) or getattr(dist, "all_gather_into_tensor", None)
_REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or getattr(dist, "reduce_scatter_tensor", None)
_UNSUPPORTED: set[tuple[str, str]] = set()  # (backend, collective) that raised once: use the fallback


def _backend(group) -> str:
    return str(dist.get_backend(group))


def _fall_back(group, collective: str) -> None:
    """Say once that this backend lacks the single-tensor call and the emulation runs instead."""
    _UNSUPPORTED.add((_backend(group), collective))
    warnings.warn(f"{_backend(group)} has no single-tensor {collective.replace('_', '-')} in torch "
                  f"{torch.__version__}; the reference loop emulates it, which moves more data than Megatron does")


def all_gather_first_dim(x: torch.Tensor, group) -> torch.Tensor:
    """Concatenate every rank's ``x`` along the first dimension: one ``all_gather_into_tensor`` call."""
    n = _size(group)
    if n == 1:
        return x
    x = x.contiguous()
    if _ALL_GATHER is not None and (_backend(group), "all_gather") not in _UNSUPPORTED:
        out = x.new_empty((x.shape[0] * n,) + tuple(x.shape[1:]))
        try:
            _ALL_GATHER(out, x, group=group)
            return out
        except (RuntimeError, NotImplementedError):
            _fall_back(group, "all_gather")
    parts = [torch.empty_like(x) for _ in range(n)]
    dist.all_gather(parts, x, group=group)
    return torch.cat(parts, dim=0)


def reduce_scatter_first_dim(x: torch.Tensor, group) -> torch.Tensor:
    """Sum over ranks and keep this rank's slice of the first dimension: one ``reduce_scatter_tensor`` call."""
    n = _size(group)
    if n == 1:
        return x
    x = x.contiguous()
    if _REDUCE_SCATTER is not None and (_backend(group), "reduce_scatter") not in _UNSUPPORTED:
        out = x.new_empty((x.shape[0] // n,) + tuple(x.shape[1:]))
        try:
            _REDUCE_SCATTER(out, x, group=group)
            return out
        except (RuntimeError, NotImplementedError):
            _fall_back(group, "reduce_scatter")
    # a backend without reduce-scatter: all-reduce and keep this rank's slice (same result, twice the traffic)
    total = x.clone()
    dist.all_reduce(total, group=group)
    return total.chunk(n, dim=0)[dist.get_rank(group)].contiguous()


def all_reduce(x: torch.Tensor, group) -> torch.Tensor:
    if _size(group) > 1:
        dist.all_reduce(x, group=group)
    return x


class _ReduceFromTP(torch.autograd.Function):
    """Sum the partial outputs of a row-parallel layer; the gradient passes through unchanged."""

    @staticmethod
    def forward(ctx, x, group):
        return all_reduce(x.clone(), group)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _ReduceScatterToSP(torch.autograd.Function):
    """Sequence parallel: sum partial outputs and keep this rank's sequence shard; backward all-gathers."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return reduce_scatter_first_dim(x, group)

    @staticmethod
    def backward(ctx, grad):
        return all_gather_first_dim(grad, ctx.group), None


class _GatherFromSP(torch.autograd.Function):
    """Concatenate every rank's sequence shard; backward reduce-scatters (Megatron's
    ``gather_from_sequence_parallel_region``)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return all_gather_first_dim(x, group)

    @staticmethod
    def backward(ctx, grad):
        return reduce_scatter_first_dim(grad, ctx.group), None


def gather_from_sequence_parallel_region(x, group):
    return _GatherFromSP.apply(x, group) if _size(group) > 1 else x


def reduce_from_tensor_parallel_region(x, group):
    return _ReduceFromTP.apply(x, group) if _size(group) > 1 else x


def reduce_scatter_to_sequence_parallel_region(x, group):
    return _ReduceScatterToSP.apply(x, group) if _size(group) > 1 else x


def weight_gradient(weight: nn.Parameter, grad2d: torch.Tensor, input2d: torch.Tensor) -> torch.Tensor:
    """A linear layer's weight gradient, grad^T @ input, as Megatron's gradient-accumulation fusion takes it:
    accumulated straight into the fp32 ``main_grad`` by the GEMM (``wgrad_gemm_accum_fp32``; on the CPU one
    ``addmm_``), autograd getting a placeholder (zeros where the weight has another use on this rank, the tied
    embedding) and the flag that tells the buffer's hook not to add it again. Where the GEMM cannot accumulate
    into fp32 (bf16 inputs without Megatron's extension) or there is no buffer, the gradient itself."""
    main = getattr(weight, "main_grad", None)
    if main is None or main.dtype != grad2d.dtype:
        return grad2d.t().matmul(input2d)
    main.addmm_(grad2d.t(), input2d)
    weight.grad_added_to_main_grad = True
    return (torch.zeros_like if getattr(weight, "zero_out_wgrad", False) else torch.empty_like)(weight)


class _LinearWithCommunication(torch.autograd.Function):
    """Column-parallel GEMM with its TP communication, saving the input it was given.

    Under sequence parallelism the input is a sequence shard: it is all-gathered for the GEMM,
    and the *shard* is what is saved; backward all-gathers it again for the weight gradient and
    reduce-scatters the input gradient (Korthikanti Section 4.2.2, Megatron's
    ``LinearWithGradAccumulationAndAsyncCommunication``). Without SP the input gradient is
    all-reduced (the backward of Megatron's ``copy_to_tensor_model_parallel_region``).
    """

    @staticmethod
    def forward(ctx, x, weight, bias, group, sequence_parallel):
        ctx.save_for_backward(x, weight)
        ctx.group, ctx.sequence_parallel, ctx.has_bias = group, sequence_parallel, bias is not None
        total = all_gather_first_dim(x, group) if sequence_parallel else x
        out = torch.matmul(total, weight.t())
        return out + bias if bias is not None else out

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        total = all_gather_first_dim(x, ctx.group) if ctx.sequence_parallel else x
        grad_input = torch.matmul(grad, weight)
        if ctx.sequence_parallel:
            grad_input = reduce_scatter_first_dim(grad_input, ctx.group)
        else:
            grad_input = all_reduce(grad_input, ctx.group)
        grad2d = grad.reshape(-1, grad.shape[-1])
        grad_weight = weight_gradient(weight, grad2d, total.reshape(-1, total.shape[-1]))
        grad_bias = grad2d.sum(0) if ctx.has_bias else None
        return grad_input, grad_weight, grad_bias, None, None


def column_parallel_matmul(x, weight, bias, group, sequence_parallel: bool):
    return _LinearWithCommunication.apply(x, weight, bias, group, sequence_parallel)


class _RowParallelMatmul(torch.autograd.Function):
    """A row-parallel layer's partial product X_i A_i^T, its weight gradient accumulated as ``weight_gradient``
    does (the reduction of the partial products is the caller's)."""

    @staticmethod
    def forward(ctx, x, weight):
        ctx.save_for_backward(x, weight)
        return torch.matmul(x, weight.t())

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        grad2d = grad.reshape(-1, grad.shape[-1])
        return torch.matmul(grad, weight), weight_gradient(weight, grad2d, x.reshape(-1, x.shape[-1]))


# ---------------------------------------------------------------- initialisation and layers


def init_shard(param: nn.Parameter, name: str, full_shape: tuple[int, ...], partition_dim: int | None,
               tp_rank: int, tp_size: int, seed: int, kind: str) -> None:
    """Fill ``param`` with this rank's slice of a full tensor drawn from a seed of (seed, name).

    Every layout draws the same full tensor, so TP/PP/DP runs start from the single-process
    weights exactly (Megatron's CPU initialisation does the same).
    """
    if kind == "zeros":
        full = torch.zeros(full_shape)
    elif kind == "ones":
        full = torch.ones(full_shape)
    else:
        gen = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
        full = torch.randn(full_shape, generator=gen) * 0.02
    if partition_dim is not None:
        full = full.chunk(tp_size, dim=partition_dim)[tp_rank]
    with torch.no_grad():
        param.copy_(full)
    param.global_name = name  # the same in every layout, for comparing gradients across layouts
    param.partition_dim = partition_dim
    param.shard_rank = tp_rank if partition_dim is not None else 0  # which slice of the full tensor this is


class ColumnParallelLinear(nn.Module):
    """Y = XA + b with A parallelized along its second dimension as A = [A_1, ..., A_p].

    Rank i holds A_i (stored transposed, ``[out/p, in]``) and b_i and computes Y_i = X A_i + b_i;
    the output stays split along its last dimension for the following RowParallelLinear. Under
    sequence parallelism X arrives as a sequence shard and is all-gathered first.
    """

    def __init__(self, in_features: int, out_features: int, *, bias: bool, groups: ParallelGroups,
                 sequence_parallel: bool, name: str, seed: int, dtype: torch.dtype, device) -> None:
        super().__init__()
        t = groups.tp_size
        self.group, self.sequence_parallel = groups.tp, sequence_parallel
        self.weight = nn.Parameter(torch.empty(out_features // t, in_features, dtype=dtype, device=device))
        init_shard(self.weight, f"{name}.weight", (out_features, in_features), 0, groups.tp_rank, t, seed, "normal")
        self.bias = None
        if bias:
            self.bias = nn.Parameter(torch.empty(out_features // t, dtype=dtype, device=device))
            init_shard(self.bias, f"{name}.bias", (out_features,), 0, groups.tp_rank, t, seed, "zeros")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return column_parallel_matmul(x, self.weight, self.bias, self.group, self.sequence_parallel)


class RowParallelLinear(nn.Module):
    """Y = XA + b with A parallelized along its first dimension and X along its second:

    A = [A_1; ...; A_p], X = [X_1, ..., X_p], Y = sum_i X_i A_i + b. Each rank's partial product
    is all-reduced, or under sequence parallelism reduce-scattered into sequence shards; the
    bias is added after the reduction (it is replicated, and a sequence-parallel parameter).
    """

    def __init__(self, in_features: int, out_features: int, *, bias: bool, groups: ParallelGroups,
                 sequence_parallel: bool, name: str, seed: int, dtype: torch.dtype, device) -> None:
        super().__init__()
        t = groups.tp_size
        self.group, self.sequence_parallel = groups.tp, sequence_parallel
        self.weight = nn.Parameter(torch.empty(out_features, in_features // t, dtype=dtype, device=device))
        init_shard(self.weight, f"{name}.weight", (out_features, in_features), 1, groups.tp_rank, t, seed, "normal")
        self.bias = None
        if bias:
            self.bias = nn.Parameter(torch.empty(out_features, dtype=dtype, device=device))
            init_shard(self.bias, f"{name}.bias", (out_features,), None, groups.tp_rank, t, seed, "zeros")
            self.bias.sequence_parallel = sequence_parallel

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        partial = _RowParallelMatmul.apply(x, self.weight)
        if self.sequence_parallel:
            out = reduce_scatter_to_sequence_parallel_region(partial, self.group)
        else:
            out = reduce_from_tensor_parallel_region(partial, self.group)
        return out + self.bias if self.bias is not None else out


class VocabParallelEmbedding(nn.Module):
    """The word embedding split along the vocabulary: rank i holds rows [i v/p, (i+1) v/p).

    Tokens outside a rank's range look up zeros, so the sum over ranks (all-reduce, or
    reduce-scatter under sequence parallelism) is the full lookup.
    """

    def __init__(self, vocab_size: int, hidden_size: int, *, groups: ParallelGroups, name: str, seed: int,
                 dtype: torch.dtype, device) -> None:
        super().__init__()
        t = groups.tp_size
        self.per_rank = vocab_size // t
        self.vocab_start = groups.tp_rank * self.per_rank
        self.weight = nn.Parameter(torch.empty(self.per_rank, hidden_size, dtype=dtype, device=device))
        init_shard(self.weight, f"{name}.weight", (vocab_size, hidden_size), 0, groups.tp_rank, t, seed, "normal")

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens (s, b) -> partial embeddings (s, b, h), zero rows for other ranks' tokens."""
        outside = (tokens < self.vocab_start) | (tokens >= self.vocab_start + self.per_rank)
        local = (tokens - self.vocab_start).masked_fill(outside, 0)
        return F.embedding(local, self.weight).masked_fill(outside.unsqueeze(-1), 0.0)


class _VocabParallelCrossEntropy(torch.autograd.Function):
    """Cross-entropy over logits split along the vocabulary (Megatron's, in fp32).

    Three all-reduces of one number per token (max, sum of exponentials, target logit) replace
    gathering the s x b x v logits.
    """

    @staticmethod
    def forward(ctx, logits, target, group, vocab_start):
        logits = logits.float()
        logits_max = logits.max(dim=-1).values
        all_reduce_max(logits_max, group)
        shifted = logits - logits_max.unsqueeze(-1)
        per_rank = shifted.shape[-1]
        outside = (target < vocab_start) | (target >= vocab_start + per_rank)
        local = (target - vocab_start).masked_fill(outside, 0)
        predicted = shifted.gather(-1, local.unsqueeze(-1)).squeeze(-1).masked_fill(outside, 0.0)
        all_reduce(predicted, group)
        exp = shifted.exp()
        sum_exp = exp.sum(dim=-1)
        all_reduce(sum_exp, group)
        softmax = exp.div_(sum_exp.unsqueeze(-1))
        ctx.save_for_backward(softmax, local, outside)
        return torch.log(sum_exp) - predicted

    @staticmethod
    def backward(ctx, grad):
        softmax, local, outside = ctx.saved_tensors
        grad_input = softmax.clone()
        hit = (~outside).to(grad_input.dtype)
        grad_input.scatter_add_(-1, local.unsqueeze(-1), -hit.unsqueeze(-1))
        return grad_input * grad.unsqueeze(-1), None, None, None


def all_reduce_max(x: torch.Tensor, group) -> torch.Tensor:
    if _size(group) > 1:
        dist.all_reduce(x, op=dist.ReduceOp.MAX, group=group)
    return x


def vocab_parallel_cross_entropy(logits, target, group, vocab_start: int) -> torch.Tensor:
    """Per-token loss (s, b) from local logits (s, b, v/p)."""
    return _VocabParallelCrossEntropy.apply(logits, target, group, vocab_start)


def attention_scale(head_dim: int) -> float:
    return 1.0 / math.sqrt(head_dim)
