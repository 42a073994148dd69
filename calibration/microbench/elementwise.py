"""Memory-bound kernels: the norms, activations, dropouts, softmax and residual adds of a layer.

Each point records the bytes the kernel must move through memory (the same accounting as
``simulator.layers``: reads + writes of the activation, one byte per element for a dropout mask),
so the fit gives an achieved bandwidth and a fixed launch cost.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from calibration.microbench.timing import Budget, random_tensor, rotation_count, time_stable

MASK_BYTES = 1


def _kernels(hidden: int, dtype: torch.dtype, device: torch.device) -> dict[str, tuple[Callable, int, int, int]]:
    """name -> (fn(x, y), activation reads, writes, mask bytes per element)."""
    weight = torch.ones(hidden, dtype=dtype, device=device)
    bias = torch.zeros(hidden, dtype=dtype, device=device)
    return {
        "layer_norm": (lambda x, y: F.layer_norm(x, (hidden,), weight, bias), 1, 1, 0),
        "gelu": (lambda x, y: F.gelu(x, approximate="tanh"), 1, 1, 0),
        # torch's native dropout writes the boolean mask it keeps for the backward pass
        "dropout": (lambda x, y: torch.native_dropout(x, 0.1, True), 1, 1, MASK_BYTES),
        "softmax": (lambda x, y: torch.softmax(x, dim=-1), 1, 1, 0),
        "bias_add_residual": (lambda x, y: torch.add(x + bias, y), 2, 1, 0),
        "copy": (lambda x, y: y.copy_(x), 1, 1, 0),
    }


KERNELS = ("layer_norm", "gelu", "dropout", "softmax", "bias_add_residual", "copy")


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
    fn, reads, writes, mask = _kernels(hidden, dtype, device)[kernel]
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
    timing = time_stable(lambda i: fn(xs[i % sets], ys[i % sets]), device, warmup=warmup, repeats=repeats)
    moved = numel * (esize * (reads + writes) + mask)
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
