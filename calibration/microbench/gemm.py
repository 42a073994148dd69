"""GEMM timings: torch.matmul / torch.bmm over the layer's shapes and a grid of sizes and alignments."""

from __future__ import annotations

import torch

from calibration.microbench.shapes import Gemm
from calibration.microbench.timing import Budget, random_tensor, rotation_count, time_stable


def time_gemm(g: Gemm, dtype: torch.dtype, device: torch.device, *, warmup: int, repeats: int) -> dict:
    """Median time of C[m, n] = A[m, k] @ B[k, n] (``batch`` times), inputs rotated past the cache."""
    esize = torch.empty((), dtype=dtype).element_size()
    a_shape = (g.batch, g.m, g.k) if g.batch > 1 else (g.m, g.k)
    b_shape = (g.batch, g.k, g.n) if g.batch > 1 else (g.k, g.n)
    per_set = esize * g.batch * (g.m * g.k + g.k * g.n)
    sets = rotation_count(per_set, device)
    gen = torch.Generator(device=device).manual_seed(1234)
    a = [random_tensor(a_shape, dtype, device, gen) for _ in range(sets)]
    b = [random_tensor(b_shape, dtype, device, gen) for _ in range(sets)]
    out = torch.empty((g.batch, g.m, g.n) if g.batch > 1 else (g.m, g.n), dtype=dtype, device=device)
    mm = torch.bmm if g.batch > 1 else torch.mm
    timing = time_stable(lambda i: mm(a[i % sets], b[i % sets], out=out), device, warmup=warmup, repeats=repeats)
    t = timing.median_s
    return {
        "name": g.name, "m": g.m, "n": g.n, "k": g.k, "batch": g.batch,
        "dtype": str(dtype).removeprefix("torch."), "time_s": t, "spread": timing.spread,
        "flops": g.flops, "tflops": g.flops / t / 1e12 if t > 0 else 0.0, "repeats": repeats,
        "tries": timing.tries,
    }


def run_gemms(gemms: list[Gemm], dtype: torch.dtype, device: torch.device, budget: Budget, *,
              warmup: int, repeats: int, held_out: set[tuple[int, int, int, int]] = frozenset()) -> list[dict]:
    """Time each GEMM while the budget lasts; the estimate for the next one uses the rate seen so far."""
    points: list[dict] = []
    # time ~ floor + flops / rate: the fastest rate and the shortest time seen so far
    best_rate, floor_s, setup_s = 0.0, 0.0, 0.05
    for g in gemms:
        per_rep = floor_s + (g.flops / best_rate if best_rate else 0.0)
        if not budget.allows(setup_s + (warmup + repeats) * per_rep, f"gemm {g.name} {g.m}x{g.n}x{g.k}x{g.batch}"):
            continue
        point = time_gemm(g, dtype, device, warmup=warmup, repeats=repeats)
        point["held_out"] = g.key in held_out
        points.append(point)
        t = point["time_s"]
        best_rate = max(best_rate, g.flops / t) if t > 0 else best_rate
        floor_s = t if not floor_s else min(floor_s, t)
    return points


def held_out_keys(gemms: list[Gemm], every: int = 5, offset: int = 2) -> set[tuple[int, int, int, int]]:
    """A deterministic few (every ``every``-th, from ``offset``) kept out of the fit to test its predictions."""
    return {g.key for i, g in enumerate(gemms) if i % every == offset}
