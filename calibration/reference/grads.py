"""Gradients as Megatron-Core's DDP keeps and reduces them.

Every parameter's gradient accumulates into ``param.main_grad``, a view of one fp32 buffer per rank
(``_ParamAndGradBuffer``), whatever the parameters' dtype: a linear layer's weight gradient GEMM
accumulates into it directly (gradient-accumulation fusion, ``parallel.weight_gradient``); for every
other parameter a hook after autograd accumulates ``param.grad`` adds it to ``main_grad`` and frees
it. The buffer is laid out in reverse parameter order, so the backward fills it from the end, and
split into buckets of ``ddp_bucket_size`` parameters (Megatron's default max(40M, 1M x DP), one
bucket without ``overlap_grad_reduce``).
Data parallelism reduces each bucket with one collective; with ``overlap_grad_reduce`` a bucket's
all-reduce is issued (asynchronously) as soon as the last micro-batch has produced all of its
gradients, and waited for after the backward.

The experts of a mixture-of-experts layer live in buffers of their own (Megatron-Core's
``expert_parallel_buffers``), reduced over the expert-data-parallel group (the ranks holding the same
experts) but, like every other gradient, divided by DP x CP: each expert has summed the gradients of
the tokens every rank of its EP group sent it.

Sequence parallelism's replicated parameters (norms, row-parallel biases, the router) saw only their
rank's sequence shard, so their gradients are summed over TP, coalesced into one all-reduce
(``_allreduce_layernorm_grads``); the tied word embedding's over the first and last stage.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn


def default_bucket_params(dp_size: int) -> int:
    """Megatron-Core's bucket size in parameters when none is given: max(40M, 1M x DP)."""
    return max(40_000_000, 1_000_000 * dp_size)


class _Bucket:
    def __init__(self, params: list[nn.Parameter], data: torch.Tensor) -> None:
        self.params = params
        self.data = data  # a slice of the buffer
        self.pending: set[int] = set()
        self.work = None


class GradBuffer:
    """One fp32 ``main_grad`` buffer over ``params``, in buckets; sums over ``dp_group`` (of ``dp_size`` ranks) and
    divides by ``divisor`` (default ``dp_size``)."""

    def __init__(self, params: list[nn.Parameter], *, dp_group, dp_size: int, bucket_params: int | None,
                 overlap: bool, device: torch.device, divisor: int | None = None) -> None:
        self.params = list(reversed(params))  # the backward produces the last layers' gradients first
        self.dp_group, self.dp_size, self.overlap = dp_group, dp_size, overlap
        self.divisor = dp_size if divisor is None else divisor
        total = sum(p.numel() for p in self.params)
        self.buffer = torch.zeros(total, dtype=torch.float32, device=device)
        size = total if not overlap else (bucket_params or default_bucket_params(dp_size))
        self.buckets: list[_Bucket] = []
        offset, start, members = 0, 0, []
        for p in self.params:
            n = p.numel()
            p.main_grad = self.buffer[offset:offset + n].view(p.shape)
            members.append(p)
            offset += n
            if offset - start >= size:
                self.buckets.append(_Bucket(members, self.buffer[start:offset]))
                start, members = offset, []
        if members:
            self.buckets.append(_Bucket(members, self.buffer[start:offset]))
        self._bucket_of = {id(p): b for b in self.buckets for p in b.params}
        self.last_micro_batch = False
        self._hooks = [p.register_post_accumulate_grad_hook(self._accumulate) for p in self.params]

    @property
    def num_buckets(self) -> int:
        return len(self.buckets)

    def _accumulate(self, p: nn.Parameter) -> None:
        # a linear layer's weight gradient is already in main_grad (gradient-accumulation fusion): only a
        # weight with another use here (the tied embedding, its placeholder zeros) has more to add
        if not getattr(p, "grad_added_to_main_grad", False) or getattr(p, "zero_out_wgrad", False):
            p.main_grad.add_(p.grad)
        p.grad = None
        p.grad_added_to_main_grad = False
        if self.overlap and self.last_micro_batch and self.dp_size > 1:
            bucket = self._bucket_of[id(p)]
            bucket.pending.discard(id(p))
            if not bucket.pending and bucket.work is None:
                bucket.work = dist.all_reduce(bucket.data, group=self.dp_group, async_op=True)

    def start_last_micro_batch(self) -> None:
        """The next backward is the last of the iteration: buckets reduce as they fill (with overlap)."""
        self.last_micro_batch = True
        for b in self.buckets:
            b.pending = {id(p) for p in b.params}
            b.work = None

    def reduce(self) -> None:
        """Finish data parallelism's reduction: wait for the buckets already issued, issue the others, average."""
        if self.dp_size > 1:
            for b in self.buckets:
                if b.work is None:
                    dist.all_reduce(b.data, group=self.dp_group)
                else:
                    b.work.wait()
        if self.divisor > 1:
            self.buffer.div_(self.divisor)
        self.last_micro_batch = False

    def zero(self) -> None:
        self.buffer.zero_()


class ChunkGradients:
    """A model chunk's buffers: its dense parameters' over DP x CP, and its experts' (if any) over EDP."""

    def __init__(self, params: list[nn.Parameter], *, dp_group, expert_dp_group, dp_size: int, expert_dp_size: int,
                 bucket_params: int | None, overlap: bool, device: torch.device) -> None:
        dense = [p for p in params if not getattr(p, "expert_parallel", False)]
        experts = [p for p in params if getattr(p, "expert_parallel", False)]
        self.buffers = [GradBuffer(dense, dp_group=dp_group, dp_size=dp_size, bucket_params=bucket_params,
                                   overlap=overlap, device=device)]
        if experts:
            self.buffers.append(GradBuffer(experts, dp_group=expert_dp_group, dp_size=expert_dp_size,
                                           bucket_params=bucket_params, overlap=overlap, device=device,
                                           divisor=dp_size))

    def start_last_micro_batch(self) -> None:
        for b in self.buffers:
            b.start_last_micro_batch()

    def reduce(self) -> None:
        for b in self.buffers:
            b.reduce()

    def zero(self) -> None:
        for b in self.buffers:
            b.zero()


def all_reduce_coalesced(tensors: list[torch.Tensor], group) -> None:
    """Sum ``tensors`` over ``group`` with one collective: flatten, all-reduce, copy back (Megatron's
    ``_flatten_dense_tensors`` path)."""
    if not tensors or dist.get_world_size(group) == 1:
        return
    flat = torch.cat([t.reshape(-1) for t in tensors])
    dist.all_reduce(flat, group=group)
    offset = 0
    for t in tensors:
        n = t.numel()
        t.copy_(flat[offset:offset + n].view(t.shape))
        offset += n


# Megatron's default --clip-grad: the optimizer scales every gradient by max_norm / norm when the global
# norm exceeds it
CLIP_GRAD = 1.0


def gradient_copies(param: nn.Parameter, groups, tied: bool = False) -> int:
    """How many ranks of the world hold this gradient, identical after the reductions: a dense parameter's
    on every rank of DP x CP (and of TP unless it is split over TP), an expert's on every rank of its
    expert-data-parallel group (and of ETP unless split); ``tied``: the word embedding, also on the other
    end of the pipeline."""
    split = getattr(param, "partition_dim", None) is not None
    if getattr(param, "expert_parallel", False):
        copies = groups.edp_size * (1 if split else groups.etp_size)
    else:
        copies = groups.dp_size * groups.cp_size * (1 if split else groups.tp_size)
    return copies * (2 if tied else 1)


def clip_grad_norm_(params: list[nn.Parameter], groups, max_norm: float, device: torch.device,
                    tied: set[int] = frozenset()) -> float:
    """Megatron's ``clip_grad_norm_fp32`` on the reduced ``main_grad``: the L2 norm over every gradient of the
    model, each counted once (a rank weighs its copies by 1 / ``gradient_copies``, one all-reduce over the
    world sums them), then every gradient scaled by max_norm / norm when that is under 1. ``tied``: ids of
    the word-embedding parameters held by both ends of the pipeline. Returns the norm."""
    grads = [p.main_grad for p in params]
    if grads:
        norms = torch.stack(torch._foreach_norm(grads))
        weights = torch.tensor([1.0 / gradient_copies(p, groups, id(p) in tied) for p in params],
                               dtype=norms.dtype, device=device)
        total = (norms.square() * weights).sum().reshape(1)
    else:  # a pipeline stage without parameters still joins the sum
        total = torch.zeros(1, dtype=torch.float32, device=device)
    if dist.get_world_size() > 1:
        dist.all_reduce(total)
    norm = total.item() ** 0.5
    coefficient = max_norm / (norm + 1.0e-6)
    if grads and coefficient < 1.0:
        torch._foreach_mul_(grads, coefficient)
    return norm
