"""Fused-style causal attention in PyTorch, and context parallelism's ring attention built from it.

Flash attention never keeps the s x s probabilities: it runs block by block, merging each block's
partial result with the running one through the rows' log-sum-exp (LSE), and keeps for the
backward pass only q, k, v, its output and the fp32 LSE of every row; the backward recomputes the
probabilities of each block from them (Dao 2023, FlashAttention-2, Algorithms 1 and 2).

Context parallelism (Megatron's ``--context-parallel-size`` with ``--cp-comm-type p2p``, Transformer
Engine's ``AttnFuncWithCPAndKVP2P``) splits every sequence over the cp ranks of a CP group. The
sequence is cut into 2 cp chunks and rank r holds chunks r and 2cp-1-r, so that under the causal
mask every rank has the same work. Keys and values travel around the ring: at step i rank r holds
the block of rank r - i, sends it on to rank r + 1 and receives the next one from rank r - 1 while
it computes. The backward pass sends the blocks around again, the other way, each with the
gradient of its keys and values, which every rank adds to and which is complete when the block
reaches its owner at the last step.

``RingAttention`` is one ``torch.autograd.Function``, so autograd keeps exactly what it saves:
q, one block of k and v, the output (which the projection keeps as its input anyway) and the fp32
LSE, ``b x heads-per-TP-rank x s/cp``. With CP 1 it is plain fused causal attention.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from calibration.reference.parallel import ParallelGroups, attention_scale


def context_parallel_positions(seq_length: int, cp_size: int, cp_rank: int) -> torch.Tensor:
    """Positions of this rank's tokens: chunks ``cp_rank`` and ``2 cp - 1 - cp_rank`` of 2 cp, in order."""
    n = seq_length // (2 * cp_size)
    late = 2 * cp_size - 1 - cp_rank
    return torch.cat([torch.arange(cp_rank * n, (cp_rank + 1) * n), torch.arange(late * n, (late + 1) * n)])


def _visible(rank: int, source: int, half: int) -> tuple[slice, slice, bool]:
    """Which of ``rank``'s query rows see which of ``source``'s key columns, and whether the causal mask applies.

    Rank r's rows are chunks (r, 2cp-1-r), the source's columns chunks (src, 2cp-1-src):
    - src = r: the same positions; causal within them (the two chunks are in sequence order);
    - src < r: chunk src precedes both of r's chunks, chunk 2cp-1-src follows both: every row sees the
      first half of the columns;
    - src > r: chunk r precedes both of the source's chunks, chunk 2cp-1-r follows both: the second half
      of the rows sees every column.
    """
    everything = slice(None)
    if source == rank:
        return everything, everything, True
    if source < rank:
        return everything, slice(0, half), False
    return slice(half, None), everything, False


def _scores(q: torch.Tensor, k: torch.Tensor, scale: float, causal: bool) -> torch.Tensor:
    """(b*np, sq, hn) x (b*np, sk, hn) -> scaled scores (b*np, sq, sk), -inf above the diagonal if causal."""
    scores = torch.bmm(q, k.transpose(1, 2)) * scale
    if causal:
        future = torch.ones(scores.shape[-2:], dtype=torch.bool, device=scores.device).triu(1)
        scores.masked_fill_(future, float("-inf"))
    return scores


def _block_forward(q, k, v, scale: float, causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """One block: its output (b*np, sq, hn), normalised over the block, and the rows' LSE (b*np, sq)."""
    scores = _scores(q, k, scale, causal)
    lse = torch.logsumexp(scores, dim=-1)
    return torch.bmm(torch.exp(scores - lse.unsqueeze(-1)), v), lse


def _merge(out: torch.Tensor, lse: torch.Tensor, rows: slice, block_out: torch.Tensor, block_lse: torch.Tensor) -> None:
    """Fold a block's partial result into the running (out, lse) of ``rows``, in place."""
    new = torch.logaddexp(lse[:, rows], block_lse)
    out[:, rows] = (out[:, rows] * torch.exp(lse[:, rows] - new).unsqueeze(-1)
                    + block_out * torch.exp(block_lse - new).unsqueeze(-1))
    lse[:, rows] = new


def _block_backward(q, k, v, grad_out, lse, delta, scale: float, causal: bool):
    """Gradients of one block from the saved LSE: P = exp(S - lse), dS = P * (dP - rowsum(dO * O))."""
    probs = torch.exp(_scores(q, k, scale, causal) - lse.unsqueeze(-1))  # (b*np, sq, sk), 0 where masked
    grad_v = torch.bmm(probs.transpose(1, 2), grad_out)
    grad_scores = probs * (torch.bmm(grad_out, v.transpose(1, 2)) - delta.unsqueeze(-1)) * scale
    return torch.bmm(grad_scores, k), torch.bmm(grad_scores.transpose(1, 2), q), grad_v


class _Ring:
    """Point-to-point exchanges around the CP group: to rank r + 1 from rank r - 1, or the other way round."""

    def __init__(self, groups: ParallelGroups, *, reverse: bool = False) -> None:
        r, ranks = groups.cp_rank, groups.cp_ranks
        after, before = ranks[(r + 1) % len(ranks)], ranks[(r - 1) % len(ranks)]
        self.group = groups.cp
        self.to, self.source = (before, after) if reverse else (after, before)

    def start(self, block: torch.Tensor, tag: int) -> tuple[torch.Tensor, list]:
        """Send ``block`` on and start receiving the next one; wait on the works before reading it."""
        incoming = torch.empty_like(block)
        works = [dist.isend(block, dst=self.to, group=self.group, tag=tag),
                 dist.irecv(incoming, src=self.source, group=self.group, tag=tag)]
        return incoming, works

    @staticmethod
    def finish(works: list) -> None:
        for work in works:
            work.wait()


def _heads_first(x: torch.Tensor) -> torch.Tensor:
    """(s, b, np, hn) -> (b*np, s, hn), the layout the batched GEMMs take (a view where it can be)."""
    s, b, n, d = x.shape
    return x.reshape(s, b * n, d).transpose(0, 1)


class RingAttention(torch.autograd.Function):
    """Causal attention of this rank's queries over the whole sequence's keys and values, held around the CP group.

    q, k, v (s/cp, b, np, hn) -> output (s/cp, b, np*hn). As Transformer Engine does, the forward
    ends holding the block of rank r + 1 and keeps it for the backward, which sends the blocks the
    other way round so that each block's key/value gradients reach its owner at the last step:
    cp - 1 exchanges each way. Saves q, that block of k and v, the output and the fp32 LSE: the
    bytes of q, k, v, the output and the LSE, nothing else.
    """

    @staticmethod
    def forward(ctx, q, k, v, groups: ParallelGroups):
        s, b, n, d = q.shape
        cp, rank, scale, half = groups.cp_size, groups.cp_rank, attention_scale(d), s // 2
        ring = _Ring(groups) if cp > 1 else None
        query = _heads_first(q).float()  # (b*np, s/cp, hn)
        # (2, b*np, s/cp, hn) in the activation dtype: the block that travels, rank r - step's at each step
        kv = torch.stack([_heads_first(k), _heads_first(v)])
        out = torch.zeros_like(query)
        lse = torch.full(query.shape[:2], float("-inf"), dtype=torch.float32, device=q.device)  # (b*np, s/cp)
        for step in range(cp):
            if step < cp - 1:  # the next block arrives while this one is computed
                incoming, works = ring.start(kv, tag=step)
            rows, cols, causal = _visible(rank, (rank - step) % cp, half)
            block_out, block_lse = _block_forward(query[:, rows], kv[0][:, cols].float(), kv[1][:, cols].float(),
                                                  scale, causal)
            _merge(out, lse, rows, block_out, block_lse)
            if step < cp - 1:
                ring.finish(works)
                kv = incoming
        out = out.transpose(0, 1).reshape(s, b, n * d).to(q.dtype)  # (s/cp, b, np*hn), a new tensor
        # q on its own (not a view that would keep the whole qkv output alive), rank r + 1's keys and values
        ctx.save_for_backward(q.clone(memory_format=torch.contiguous_format), kv, out, lse)
        ctx.groups = groups
        return out

    @staticmethod
    def backward(ctx, grad):
        q, kv, out, lse = ctx.saved_tensors
        groups = ctx.groups
        s, b, n, d = q.shape
        cp, rank, scale, half = groups.cp_size, groups.cp_rank, attention_scale(d), s // 2
        ring = _Ring(groups, reverse=True) if cp > 1 else None
        query = _heads_first(q).float()
        grad_out = _heads_first(grad.reshape(s, b, n, d)).float()  # (b*np, s/cp, hn)
        delta = (grad_out * _heads_first(out.view(s, b, n, d)).float()).sum(-1)  # rowsum(dO * O), (b*np, s/cp)
        grad_query = torch.zeros_like(query)
        grad_kv = torch.zeros_like(kv)  # travels with its block; complete when the block is back with its owner
        for step in range(cp):  # the blocks of ranks r + 1, r + 2, ..., r
            if step < cp - 1:
                incoming, works = ring.start(kv, tag=cp + step)  # tags apart from the forward's
            rows, cols, causal = _visible(rank, (rank + 1 + step) % cp, half)
            dq, dk, dv = _block_backward(query[:, rows], kv[0][:, cols].float(), kv[1][:, cols].float(),
                                         grad_out[:, rows], lse[:, rows], delta[:, rows], scale, causal)
            grad_query[:, rows] += dq
            grad_kv[0][:, cols] += dk.to(grad_kv.dtype)
            grad_kv[1][:, cols] += dv.to(grad_kv.dtype)
            if step < cp - 1:  # on to rank r - 1 with its block, which it computes next
                grad_kv, grad_works = ring.start(grad_kv, tag=2 * cp + step)
                ring.finish(grad_works + works)
                kv = incoming

        def back(x: torch.Tensor) -> torch.Tensor:  # (b*np, s/cp, hn) -> (s/cp, b, np, hn)
            return x.transpose(0, 1).reshape(s, b, n, d).to(q.dtype)

        return back(grad_query), back(grad_kv[0]), back(grad_kv[1]), None


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, groups: ParallelGroups) -> torch.Tensor:
    """q, k, v (s/cp, b, np, hn) -> context (s/cp, b, np*hn); see ``RingAttention``."""
    return RingAttention.apply(q, k, v, groups)
