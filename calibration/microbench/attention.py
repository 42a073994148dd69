"""Attention timings, forward and backward: PyTorch's fused scaled-dot-product attention and the
unfused path Megatron runs without flash attention (two batched GEMMs around softmax and dropout).

FLOPs follow the FlashAttention papers (Dao 2023, Section 4.1): forward 4 * b * a * s^2 * d, halved
with a causal mask, and backward 2.5 x forward. For the unfused path the FLOPs recorded are the ones
actually executed: it computes the full s x s scores whatever the mask.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from calibration.microbench.timing import Budget, random_tensor, rotation_count, time_stable


def attention_flops(batch_heads: int, seq: int, head_dim: int, causal: bool) -> float:
    """Forward FLOPs of QK^T and PV, counted as the FlashAttention papers do."""
    full = 4.0 * batch_heads * seq * seq * head_dim
    return full / 2 if causal else full


def unfused_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, dropout_p: float) -> torch.Tensor:
    """softmax(Q K^T / sqrt(d) + mask) V with dropout on the probabilities; q, k, v are (b, a, s, d)."""
    scores = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))  # (b, a, s, s)
    if causal:
        s = q.shape[-2]
        mask = torch.ones(s, s, dtype=torch.bool, device=q.device).triu_(1)
        scores = scores.masked_fill(mask, float("-inf"))
    probs = F.dropout(torch.softmax(scores, dim=-1), p=dropout_p, training=dropout_p > 0)
    return torch.matmul(probs, v)  # (b, a, s, d)


def fused_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, dropout_p: float) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=causal)


IMPLEMENTATIONS = {"fused": fused_attention, "unfused": unfused_attention}


def time_attention(impl: str, batch: int, heads: int, seq: int, head_dim: int, dtype: torch.dtype,
                   device: torch.device, *, causal: bool = True, dropout_p: float = 0.0,
                   warmup: int, repeats: int) -> list[dict]:
    """Forward and backward median times of one attention implementation on (batch, heads, seq, head_dim)."""
    fn = IMPLEMENTATIONS[impl]
    gen = torch.Generator(device=device).manual_seed(4321)
    shape = (batch, heads, seq, head_dim)
    esize = torch.empty((), dtype=dtype).element_size()
    sets = rotation_count(3 * esize * batch * heads * seq * head_dim, device, max_sets=4)
    qkv = [[random_tensor(shape, dtype, device, gen).requires_grad_() for _ in range(3)] for _ in range(sets)]
    grad = random_tensor(shape, dtype, device, gen)
    fwd = time_stable(lambda i: fn(*qkv[i % sets], causal, dropout_p), device, warmup=warmup, repeats=repeats)
    outs = [fn(*x, causal, dropout_p) for x in qkv]
    # retain_graph lets every repetition replay the same backward
    bwd = time_stable(lambda i: torch.autograd.grad(outs[i % sets], qkv[i % sets], grad, retain_graph=True), device,
                  warmup=warmup, repeats=repeats)
    flops = attention_flops(batch * heads, seq, head_dim, causal and impl == "fused")
    common = {"impl": impl, "batch": batch, "heads": heads, "batch_heads": batch * heads, "seq": seq,
              "head_dim": head_dim, "causal": causal, "dropout_p": dropout_p,
              "dtype": str(dtype).removeprefix("torch."), "repeats": repeats}
    return [
        {**common, "pass": "forward", "time_s": fwd.median_s, "spread": fwd.spread, "tries": fwd.tries, "flops": flops,
         "tflops": flops / fwd.median_s / 1e12},
        {**common, "pass": "backward", "time_s": bwd.median_s, "spread": bwd.spread, "tries": bwd.tries, "flops": 2.5 * flops,
         "tflops": 2.5 * flops / bwd.median_s / 1e12},
    ]


def attention_cases(quick: bool, device: str, heads: int, head_dim: int, batch: int, seq: int) -> list[tuple[int, int, int, int]]:
    """(batch, heads, seq, head_dim): the model's own case, then sequence lengths around it."""
    if device == "cpu":
        seqs = [64, 128, 512] if quick else [64, 128, 256, 512, 1024]
    else:
        seqs = [512, 2048, 4096] if quick else [512, 1024, 2048, 4096, 8192]
    cases = [(batch, heads, seq, head_dim)]
    # FlashAttention-2's sweep keeps batch x seq at 16k tokens; here at the model's token count
    tokens = batch * seq
    for s in seqs:
        if s != seq:
            cases.append((max(1, tokens // s), heads, s, head_dim))
    return cases


def run_attention(cases: list[tuple[int, int, int, int]], dtype: torch.dtype, device: torch.device, budget: Budget, *,
                  causal: bool, warmup: int, repeats: int, impls: tuple[str, ...] = ("fused", "unfused")) -> list[dict]:
    points: list[dict] = []
    best_rate, floor_s = 0.0, 0.0  # fwd+bwd: time ~ floor + work / rate, from what was seen so far
    for batch, heads, seq, head_dim in cases:
        for impl in impls:
            work = 3.5 * attention_flops(batch * heads, seq, head_dim, causal=False)
            per_rep = floor_s + (work / best_rate if best_rate else 0.0)
            if not budget.allows(0.1 + (warmup + repeats + 1) * per_rep,
                                 f"attention {impl} b={batch} a={heads} s={seq} d={head_dim}"):
                continue
            try:
                pts = time_attention(impl, batch, heads, seq, head_dim, dtype, device, causal=causal,
                                     warmup=warmup, repeats=repeats)
            except torch.OutOfMemoryError:
                budget.skipped.append(f"attention {impl} s={seq}: out of memory")
                continue
            points.extend(pts)
            t = pts[0]["time_s"] + pts[1]["time_s"]
            best_rate = max(best_rate, work / t)
            floor_s = t if not floor_s else min(floor_s, t)
    return points
