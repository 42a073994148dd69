"""Memory-bound kernels: the norms, activations, dropouts, softmax and residual adds of a layer.

Each point records the bytes the kernel must move through memory (the same accounting as
``simulator.graph.layers``: reads + writes of the activation, one byte per element for a dropout mask),
so the fit gives an achieved bandwidth and a fixed launch cost.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from calibration.microbench.timing import Budget, random_tensor, rotation_count, time_stable

MASK_BYTES = 1
DROPOUT = 0.1


@dataclass(frozen=True)
class Kernel:
    """One kernel class as the layer runs it: ``fn(x, y, aux)``, the activation tensors it reads and writes and
    the mask bytes per element (the layer graph's accounting), and ``prepare(x, y)`` making the saved
    tensors a backward kernel reads (untimed, once per rotated copy)."""

    fn: Callable
    reads: float
    writes: float
    mask_bytes: int = 0
    prepare: Callable | None = None


def _kernels(hidden: int, dtype: torch.dtype, device: torch.device) -> dict[str, Kernel]:
    """Each forward kernel class and, as autograd runs it, its backward (``<class>_backward``, costed as the
    forward class by a profile that did not time it)."""
    weight = torch.ones(hidden, dtype=dtype, device=device)
    bias = torch.zeros(hidden, dtype=dtype, device=device)
    return {
        "layer_norm": Kernel(lambda x, y, aux: F.layer_norm(x, (hidden,), weight, bias), 1, 1),
        "layer_norm_backward": Kernel(
            lambda x, y, aux: torch.ops.aten.native_layer_norm_backward(y, x, (hidden,), *aux, weight, bias,
                                                                        [True, True, True]), 4, 1,
            prepare=lambda x, y: torch.ops.aten.native_layer_norm(x, (hidden,), weight, bias, 1e-5)[1:]),
        # the reference loop's activation, Megatron's without bias-gelu fusion: the exact (erf) GeLU; on a CPU
        # the tanh approximation of the fused kernel ran 4x slower at the layer's size
        "gelu": Kernel(lambda x, y, aux: F.gelu(x), 1, 1),
        "gelu_backward": Kernel(lambda x, y, aux: torch.ops.aten.gelu_backward(y, x), 2, 1),
        # torch's native dropout writes the boolean mask it keeps for the backward pass ...
        "dropout": Kernel(lambda x, y, aux: torch.native_dropout(x, DROPOUT, True), 1, 1, MASK_BYTES),
        # ... which reads it back: the gradient times the mask, scaled
        "dropout_backward": Kernel(
            lambda x, y, aux: torch.ops.aten.native_dropout_backward(x, aux, 1.0 / (1.0 - DROPOUT)), 1, 1,
            MASK_BYTES, prepare=lambda x, y: torch.native_dropout(y, DROPOUT, True)[1]),
        "softmax": Kernel(lambda x, y, aux: torch.softmax(x, dim=-1), 1, 1),
        "softmax_backward": Kernel(lambda x, y, aux: torch.ops.aten._softmax_backward_data(y, aux, -1, x.dtype), 2, 1,
                                   prepare=lambda x, y: torch.softmax(x, dim=-1)),
        # the causal mask filled into the scores in place (Megatron's attention_mask_func), the [s, s] boolean
        # mask broadcast over the heads; its backward fills the gradient's masked places with 0
        "masked_fill": Kernel(lambda x, y, aux: x.view(-1, *aux.shape).masked_fill_(aux, -10000.0), 1, 1,
                              prepare=lambda x, y: _causal_mask(x)),
        "masked_fill_backward": Kernel(lambda x, y, aux: y.view(-1, *aux.shape).masked_fill(aux, 0.0), 1, 1,
                                       prepare=lambda x, y: _causal_mask(x)),
        "bias_add_residual": Kernel(lambda x, y, aux: torch.add(x + bias, y), 2, 1),
        "copy": Kernel(lambda x, y, aux: y.copy_(x), 1, 1),
    }


KERNELS = ("layer_norm", "layer_norm_backward", "gelu", "gelu_backward", "dropout", "dropout_backward", "softmax",
           "softmax_backward", "masked_fill", "masked_fill_backward", "bias_add_residual", "copy")


def _causal_mask(x: torch.Tensor) -> torch.Tensor:
    """A causal [s, s] mask over x's last dimension s, broadcast over its rows in blocks of s (fewer rows: one
    block of them)."""
    rows, s = x.shape
    block = s if rows % s == 0 else rows
    return torch.ones((block, s), dtype=torch.bool, device=x.device).triu(1)


def elementwise_sizes(quick: bool, device: str, layer_sizes: tuple[int, ...] = ()) -> list[int]:
    """Element counts from launch-bound to bandwidth-bound, and the layer's own (its [s, b, h] and
    [s, b, ffn/t] activations, its attention scores).

    On a CPU the sweep stops at 2^21 elements (8 MiB in fp32): past it every new tensor is a fresh
    mmap whose first touch page-faults, several times slower per byte, which a layer of a model small
    enough to train on a CPU never reaches; a larger model's own sizes are still measured.
    """
    if device == "cpu":
        exps = [14, 16, 18, 20] if quick else [14, 15, 16, 17, 18, 19, 20, 21]
    else:
        exps = [16, 20, 24, 27] if quick else [14, 16, 18, 20, 22, 24, 26, 28, 29]
    return sorted({2**e for e in exps} | {n for n in layer_sizes if n > 0})


def time_elementwise(kernel: str, numel: int, hidden: int, dtype: torch.dtype, device: torch.device, *,
                     warmup: int, repeats: int) -> dict:
    k = _kernels(hidden, dtype, device)[kernel]
    rows = max(1, numel // hidden)
    numel = rows * hidden
    esize = torch.empty((), dtype=dtype).element_size()
    # Enough copies that no repetition finds its operands in the last-level cache: a training step's
    # activations are not (its working set is the layers' saved tensors, weights, gradients and optimizer
    # state), and a virtual machine reports the host's whole cache while its share is smaller. With 8
    # copies a CPU's softmax and scalar multiply of 2 MiB ran 1.2-1.5x and 1.7x faster than from memory,
    # and the reference loop's own kernels ran at the slower speed. The copies are clones of one random
    # pair (drawing each anew would take seconds per point); their values do not change a kernel's time.
    sets = rotation_count(2 * numel * esize, device, max_sets=max(16, warmup + repeats))
    gen = torch.Generator(device=device).manual_seed(99)
    x0, y0 = random_tensor((rows, hidden), dtype, device, gen), random_tensor((rows, hidden), dtype, device, gen)
    xs = [x0] + [x0.clone() for _ in range(sets - 1)]
    ys = [y0] + [y0.clone() for _ in range(sets - 1)]
    aux = [k.prepare(x, y) for x, y in zip(xs, ys)] if k.prepare else [None] * sets
    timing = time_stable(lambda i: k.fn(xs[i % sets], ys[i % sets], aux[i % sets]), device, warmup=warmup,
                         repeats=repeats)
    moved = numel * (esize * (k.reads + k.writes) + k.mask_bytes)
    t = timing.median_s
    return {"kernel": kernel, "numel": numel, "hidden": hidden, "dtype": str(dtype).removeprefix("torch."),
            "bytes_moved": moved, "time_s": t, "spread": timing.spread, "gbps": moved / t / 1e9, "repeats": repeats,
            "tries": timing.tries}


def run_elementwise(sizes: list[int], hidden: int, dtype: torch.dtype, device: torch.device, budget: Budget, *,
                    warmup: int, repeats: int, kernels: tuple[str, ...] = KERNELS) -> list[dict]:
    points: list[dict] = []
    best_bw, floor_s = 0.0, 0.0  # time ~ floor + bytes / bandwidth, from what was seen so far
    for numel in sizes:
        for kernel in kernels:
            guess_bytes = 4 * numel * torch.empty((), dtype=dtype).element_size()
            per_rep = floor_s + (guess_bytes / best_bw if best_bw else 0.0)
            if not budget.allows(0.05 + (warmup + repeats) * per_rep, f"{kernel} numel={numel}"):
                continue
            p = time_elementwise(kernel, numel, hidden, dtype, device, warmup=warmup, repeats=repeats)
            points.append(p)
            best_bw = max(best_bw, p["bytes_moved"] / p["time_s"])
            floor_s = p["time_s"] if not floor_s else min(floor_s, p["time_s"])
    return points
