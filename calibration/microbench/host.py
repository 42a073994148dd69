"""Host-side cost: the CPU time the training process spends issuing work, in loops of tiny ops.

A tiny op (64 elements) costs the device next to nothing, so a loop of them times the host: the
dispatcher, autograd recording and the kernel launch. Each is timed bare, as the kernel benchmarks
call it, and with autograd recording (the forward of a training step) and replayed by the autograd
engine (its backward). On CUDA each is timed without a synchronize (the host issuing ahead, what
the time model's host terms are) and with one after every op (issue, run and wait).

The per-micro-batch work outside the layers (slicing the batch, the receive buffer) and the
optimizer's per-iteration bookkeeping (Adam over a layer's worth of small tensors) are timed the
same way.
"""

from __future__ import annotations

import time

import torch

from calibration.microbench.timing import synchronize

TINY = 64  # elements: the device work is negligible, the host's is not


def _per_call(fn, calls: int, device: torch.device, sync_each: bool, rounds: int) -> float:
    """Median over ``rounds`` of the time per call of ``calls`` calls of ``fn``."""
    fn()
    synchronize(device)
    out = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
            if sync_each:
                synchronize(device)
        synchronize(device)
        out.append((time.perf_counter() - t0) / calls)
    out.sort()
    return out[len(out) // 2]


def run_host(device: torch.device, dtype: torch.dtype, *, calls: int = 200, rounds: int = 7,
             micro_batch_shape: tuple[int, int] = (1, 257), hidden: int = 256) -> list[dict]:
    """Rows of {what, synchronize, time_s, calls}: per op, per micro-batch or per iteration."""
    x = torch.randn(TINY, device=device).to(dtype)
    rows: list[dict] = []
    syncs = (False, True) if device.type == "cuda" else (False,)

    def add(what: str, sync: bool, t: float, n: int = calls) -> None:
        rows.append({"what": what, "synchronize": sync, "time_s": t, "calls": n})

    for sync in syncs:
        add("bare_op", sync, _per_call(lambda: x + 1, calls, device, sync, rounds))
        leaf = x.clone().requires_grad_(True)
        add("forward_op", sync, _per_call(lambda: leaf * 1.0001, calls, device, sync, rounds))

    # the backward of a chain of `calls` recorded ops, per op
    chain_len = calls

    def backward_chain() -> float:
        leaf = x.clone().requires_grad_(True)
        y = leaf
        for _ in range(chain_len):
            y = y * 1.0001
        loss = y.sum()
        synchronize(device)
        t0 = time.perf_counter()
        loss.backward()
        synchronize(device)
        return (time.perf_counter() - t0) / (chain_len + 1)

    samples = sorted(backward_chain() for _ in range(rounds))
    add("backward_op", False, samples[len(samples) // 2], chain_len)

    # one micro-batch's data, as the reference loop takes it: slice the rows, split tokens and
    # targets, transpose to [s, b], and the receive buffer of the activation
    b, s1 = micro_batch_shape
    batch = torch.randint(0, 1000, (4 * b, s1), device=device)

    def micro_batch() -> None:
        rows_ = batch[b:2 * b]
        tokens, targets = rows_[:, :-1], rows_[:, 1:]
        tokens.t(), targets.t()
        torch.empty((s1 - 1, b, hidden), dtype=dtype, device=device)

    add("micro_batch", False, _per_call(micro_batch, calls // 4, device, False, rounds), calls // 4)

    # the optimizer's bookkeeping: Adam over one GPT layer's 12 small tensors (weights, biases, norms)
    params = [torch.zeros(TINY, device=device, requires_grad=True) for _ in range(12)]
    for p in params:
        p.grad = torch.zeros_like(p)
    adam = torch.optim.Adam(params, lr=1e-3)
    add("optimizer_step_12_tensors", False, _per_call(adam.step, 20, device, False, rounds), 20)
    return rows
