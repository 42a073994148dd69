"""GEMM timings: torch.matmul / torch.bmm over the layer's shapes and a grid of sizes and alignments."""

from __future__ import annotations

import time

import torch

from calibration.microbench.shapes import Gemm
from calibration.microbench.timing import Budget, random_tensor, rotation_count, synchronize, time_stable


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


# The shape He (2024) held an A100 at its power limit with; a CPU times a smaller one so that a window
# holds many products.
SUSTAINED_SHAPE = {"cuda": 8192, "cpu": 512}
SUSTAINED_S = {("cuda", False): 30.0, ("cuda", True): 10.0, ("cpu", False): 3.0, ("cpu", True): 1.0}


def time_sustained_gemm(size: int, dtype: torch.dtype, device: torch.device, *, seconds: float, windows: int = 10,
                        warmup: int = 3, repeats: int = 10, others: tuple[torch.device, ...] = ()) -> dict:
    """One square GEMM first as the GEMM section times every shape (a burst: the median of a few
    repetitions), then back to back for ``seconds``, the mean time per product over each of
    ``windows`` equal stretches. A device that holds its clock gives the burst's time in every
    window; one that its power or heat limit slows gives longer times in the later windows, which
    is what a training run's GEMMs meet hours in. Inputs are normally distributed, as trained weights
    and activations roughly are (zeros draw less power and would hide the limit).

    ``others``: more GPUs of the machine, each given the same GEMM, bursts timed one device at a time
    and the run on all at once (as a job keeps them all busy, sharing the node's power and cooling);
    their per-device times (``device_*``, ``device`` first) say how far one device's speed lies from
    another's."""
    g = Gemm("sustained", size, size, size)
    devices = (device, *others)
    operands = []
    for d in devices:
        gen = torch.Generator(device=d).manual_seed(4321)
        operands.append((random_tensor((size, size), dtype, d, gen), random_tensor((size, size), dtype, d, gen),
                         torch.empty((size, size), dtype=dtype, device=d)))
    bursts = [time_stable(lambda i, a=a, b=b, out=out: torch.mm(a, b, out=out), d, warmup=warmup,
                          repeats=repeats).median_s for d, (a, b, out) in zip(devices, operands)]
    windows_s: list[list[float]] = [[] for _ in devices]
    per_window = max(seconds / windows, 1e-3)
    gpu = device.type == "cuda"
    for _ in range(windows):
        for d in devices:
            synchronize(d)
        starts = [torch.cuda.Event(enable_timing=True) for _ in devices] if gpu else []
        for d, e in zip(devices, starts):
            with torch.cuda.device(d):
                e.record()
        count, t0 = 0, time.perf_counter()
        while True:
            for d, (a, b, out) in zip(devices, operands):  # issued in turn: each device's queue stays full
                torch.mm(a, b, out=out)
            count += 1
            if count % 8 == 0 or not gpu:  # the host runs ahead on a GPU: check the clock in steps
                synchronize(device)
                if time.perf_counter() - t0 >= per_window:
                    break
        if gpu:
            ends = []
            for d in devices:
                with torch.cuda.device(d):
                    ends.append(torch.cuda.Event(enable_timing=True))
                    ends[-1].record()
            for d in devices:
                synchronize(d)
            for times, s, e in zip(windows_s, starts, ends):
                times.append(s.elapsed_time(e) / 1e3 / count)
        else:
            windows_s[0].append((time.perf_counter() - t0) / count)
    return {"name": g.name, "m": size, "n": size, "k": size, "batch": 1, "dtype": str(dtype).removeprefix("torch."),
            "burst_s": bursts[0], "window_s": windows_s[0], "seconds": seconds, "flops": g.flops,
            "device_burst_s": bursts, "device_window_s": windows_s}
