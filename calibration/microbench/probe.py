"""A fixed piece of work, timed at each step of a validation session: how fast the machine is right then.

A virtual machine's cores do not run at one speed: the same kernel on this 2-core VM took 4.6 ms in a
calibration and 6.0-8.4 ms half an hour later, in one process, with the machine otherwise idle. A
profile measured at one moment then predicts a run at another with that drift in its error, and
nothing in either says so. The probe times the same work (one transformer layer's forward kernels at
the model's shapes, without autograd) around every calibration and every run, so a report can show
the machine's speed at each moment beside the errors, and tell drift from what the model gets wrong.
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.nn.functional as F


def layer_forward_kernels(hidden: int, heads: int, ffn: int, seq: int, dropout: float = 0.1):
    """A function running one layer's forward kernels on fixed random data (batch 1, unfused attention)."""
    gen = torch.Generator().manual_seed(7)
    d = hidden // heads
    x = torch.randn(seq, hidden, generator=gen)
    w_qkv, w_proj = torch.randn(hidden, 3 * hidden, generator=gen), torch.randn(hidden, hidden, generator=gen)
    w_fc1, w_fc2 = torch.randn(hidden, ffn, generator=gen), torch.randn(ffn, hidden, generator=gen)
    causal = torch.ones((seq, seq), dtype=torch.bool).triu(1)

    def run() -> torch.Tensor:
        y = F.layer_norm(x, (hidden,))
        q, k, v = (y @ w_qkv).view(seq, heads, 3 * d).transpose(0, 1).split(d, dim=-1)
        scores = torch.baddbmm(torch.empty(heads, seq, seq), q, k.transpose(1, 2), beta=0.0, alpha=d ** -0.5)
        probs = torch.softmax(scores.masked_fill_(causal, -10000.0), dim=-1)
        probs = torch.native_dropout(probs, dropout, True)[0]
        context = torch.bmm(probs, v).transpose(0, 1).reshape(seq, hidden)
        y = F.layer_norm(x + context @ w_proj, (hidden,))
        return F.gelu(y @ w_fc1) @ w_fc2

    return run


def speed_probe(hidden: int, heads: int, ffn: int, seq: int, *, seconds: float = 2.0, threads: int = 1) -> dict:
    """Median time of ``layer_forward_kernels`` over about ``seconds`` of repetitions, on ``threads`` threads
    (the reference loop's one per rank), with the repetitions' spread."""
    run = layer_forward_kernels(hidden, heads, ffn, seq)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for _ in range(2):
            run()
        samples: list[float] = []
        start = time.perf_counter()
        while len(samples) < 5 or (time.perf_counter() - start < seconds and len(samples) < 1000):
            t0 = time.perf_counter()
            run()
            samples.append(time.perf_counter() - t0)
    finally:
        torch.set_num_threads(before)
    median = statistics.median(samples)
    return {"median_s": median, "repetitions": len(samples), "spread": (max(samples) - min(samples)) / median}
