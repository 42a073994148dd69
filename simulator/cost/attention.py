"""Fused (flash) attention: FLOPs over a phase-dependent fraction of the tensor peak.

FA2 counts forward FLOPs as 4 * s^2 * d * heads (halved when causal) and the backward as 2.5x
that; its efficiency grows with sequence length as the per-block overhead amortises, and with the
head size, as each tile's matmuls grow against its softmax and bookkeeping (relative to head size
128, the size the efficiencies are stated at). Under the causal mask a kernel loses more than the
skipped half: the diagonal tiles run half masked and the rows' work is unequal, a loss that weighs
most at short sequences (where diagonal tiles are a large share of those computed) and keeps a
residue at long ones (``causal_efficiency``), so counting only the executed half at the unmasked
rate is optimistic by 1.1x at 16k tokens and 1.6x at 512 on the kernels measured.
"""

from __future__ import annotations

import numpy as np

from simulator.cost.profile import AttentionParams


def attention_forward_flops(batch_heads: int, seq: int, head_dim: int, causal: bool) -> float:
    flops = 4.0 * batch_heads * seq * seq * head_dim
    return flops / 2 if causal else flops


REFERENCE_HEAD_DIM = 128  # the head size forward_efficiency and backward_efficiency are stated at


def causal_factor(p: AttentionParams, seq, causal):
    """The causal kernel's efficiency over the unmasked one's at ``seq`` (1 without the mask or the term)."""
    seq = np.asarray(seq, dtype=float)
    if p.causal_efficiency is None:
        return np.ones_like(seq)
    masked = p.causal_efficiency * seq / (seq + (p.causal_seq_half or 0.0))
    return np.where(np.asarray(causal, dtype=bool), masked, 1.0)


def _by_phase(backward, forward_value, backward_value):
    """A term for each phase: the backward's own where the profile has one, else the forward's."""
    return forward_value if backward_value is None else np.where(backward, backward_value, forward_value)


def attention_efficiency(p: AttentionParams, seq, backward, head_dim, causal):
    backward = np.asarray(backward, dtype=bool)
    base = np.where(backward, p.backward_efficiency, p.forward_efficiency)
    seq = np.asarray(seq, dtype=float)
    half = _by_phase(backward, p.seq_half, p.backward_seq_half)
    eff = base * seq / (seq + half) * causal_factor(p, seq, causal)
    if not p.head_dim_half:
        return eff
    d = np.asarray(head_dim, dtype=float)
    half = _by_phase(backward, p.head_dim_half, p.backward_head_dim_half)
    return eff * (d / (d + half)) * ((REFERENCE_HEAD_DIM + half) / REFERENCE_HEAD_DIM)


def attention_time_s(p: AttentionParams, peak_flops: float, flops, seq, backward, head_dim, causal):
    return p.launch_overhead_s + np.asarray(flops, dtype=float) / (
        peak_flops * attention_efficiency(p, seq, backward, head_dim, causal))
