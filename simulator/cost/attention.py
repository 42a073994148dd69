"""Fused (flash) attention: FLOPs over a phase-dependent fraction of the tensor peak.

FA2 counts forward FLOPs as 4 * s^2 * d * heads (halved when causal) and the backward as 2.5x
that; its efficiency grows with sequence length as the per-block overhead amortises, and with the
head size, as each tile's matmuls grow against its softmax and bookkeeping (relative to head size
128, the size the efficiencies are stated at).
"""

from __future__ import annotations

import numpy as np

from simulator.cost.profile import AttentionParams


def attention_forward_flops(batch_heads: int, seq: int, head_dim: int, causal: bool) -> float:
    flops = 4.0 * batch_heads * seq * seq * head_dim
    return flops / 2 if causal else flops


REFERENCE_HEAD_DIM = 128  # the head size forward_efficiency and backward_efficiency are stated at


def attention_efficiency(p: AttentionParams, seq, backward, head_dim):
    base = np.where(np.asarray(backward, dtype=bool), p.backward_efficiency, p.forward_efficiency)
    seq = np.asarray(seq, dtype=float)
    if not p.head_dim_half:
        return base * seq / (seq + p.seq_half)
    d, half = np.asarray(head_dim, dtype=float), p.head_dim_half
    return base * seq / (seq + p.seq_half) * (d / (d + half)) * ((REFERENCE_HEAD_DIM + half) / REFERENCE_HEAD_DIM)


def attention_time_s(p: AttentionParams, peak_flops: float, flops, seq, backward, head_dim):
    return p.launch_overhead_s + np.asarray(flops, dtype=float) / (
        peak_flops * attention_efficiency(p, seq, backward, head_dim))
