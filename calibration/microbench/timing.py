"""Timing the way a GPU engineer would: warm-up, device events, several repetitions, the median.

Inputs are rotated through enough copies that the working set outgrows the last-level cache, so a
repetition never finds its operands still cached from the one before; the data is random, never
zeros (tensor cores and memory compression run measurably faster on zeros).
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

DEFAULT_CPU_CACHE_BYTES = 32 * 2**20  # when sysfs does not say


@dataclass(frozen=True)
class Timing:
    """Per-repetition times of one benchmark, seconds."""

    samples_s: tuple[float, ...]
    tries: int = 1  # how many times the point was measured (noisy points are measured again)

    @property
    def median_s(self) -> float:
        return statistics.median(self.samples_s)

    @property
    def spread(self) -> float:
        """(max - min) / median: how noisy the repetitions were."""
        return (max(self.samples_s) - min(self.samples_s)) / self.median_s if self.median_s > 0 else 0.0


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def cache_bytes(device: torch.device) -> int:
    """The last-level cache that a rotated working set must outgrow."""
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        return int(getattr(props, "L2_cache_size", 0) or 64 * 2**20)
    best = 0
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            text = (index / "size").read_text().strip()
        except OSError:
            continue
        units = {"K": 2**10, "M": 2**20, "G": 2**30}
        value = int(text.rstrip("KMG")) * units.get(text[-1], 1) if text[-1] in units else int(text)
        best = max(best, value)
    return best or DEFAULT_CPU_CACHE_BYTES


def rotation_count(bytes_per_set: int, device: torch.device, max_sets: int = 64, max_bytes: int = 2**31) -> int:
    """How many copies of the inputs make the working set twice the cache (at least 1)."""
    if bytes_per_set <= 0:
        return 1
    want = math.ceil(2 * cache_bytes(device) / bytes_per_set)
    return max(1, min(want, max_sets, max(1, max_bytes // bytes_per_set)))


def random_tensor(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, generator: torch.Generator | None = None) -> torch.Tensor:
    """Normal random data (scaled so bf16/fp16 products stay finite)."""
    x = torch.randn(shape, dtype=torch.float32, device=device, generator=generator)
    return x.to(dtype)


def time_fn(fn: Callable[[int], object], device: torch.device, *, warmup: int = 3, repeats: int = 10) -> Timing:
    """Run ``fn(i)`` ``warmup`` times untimed, then ``repeats`` times timed one by one.

    ``fn`` gets the repetition index so it can rotate buffers. On CUDA each repetition is
    bracketed by events on the current stream (no host round-trip inside the timed region);
    on the CPU by ``perf_counter``.
    """
    if repeats < 1:
        raise ValueError(f"repeats={repeats} must be at least 1")
    for i in range(warmup):
        fn(i)
    synchronize(device)
    samples: list[float] = []
    if device.type == "cuda":
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
        for i in range(repeats):
            starts[i].record()
            fn(warmup + i)
            ends[i].record()
        torch.cuda.synchronize(device)
        samples = [s.elapsed_time(e) / 1e3 for s, e in zip(starts, ends)]
    else:
        for i in range(repeats):
            t0 = time.perf_counter()
            fn(warmup + i)
            samples.append(time.perf_counter() - t0)
    return Timing(tuple(samples))


NOISY_SPREAD = 0.5  # (max - min) / median past which a point is measured again
MAX_TRIES = 3


def time_stable(fn: Callable[[int], object], device: torch.device, *, warmup: int = 3, repeats: int = 10,
                noisy_spread: float = NOISY_SPREAD, max_tries: int = MAX_TRIES) -> Timing:
    """``time_fn``, measured again (up to ``max_tries`` times in all) while its repetitions spread by more
    than ``noisy_spread``; the samples of every try are pooled, so the median rests on more of them
    rather than on the luckiest try."""
    timing = time_fn(fn, device, warmup=warmup, repeats=repeats)
    samples, tries = list(timing.samples_s), 1
    while Timing(tuple(samples)).spread > noisy_spread and tries < max_tries:
        samples += time_fn(fn, device, warmup=1, repeats=repeats).samples_s
        tries += 1
    return Timing(tuple(samples), tries)


class Budget:
    """A wall-clock allowance for one section: skip what would overrun it, and say so."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.start = time.monotonic()
        self.skipped: list[str] = []

    def elapsed_s(self) -> float:
        return time.monotonic() - self.start

    def left_s(self) -> float:
        return self.seconds - self.elapsed_s()

    def allows(self, estimate_s: float, what: str) -> bool:
        """True if ``what``, expected to take ``estimate_s``, still fits; else records the skip."""
        if estimate_s <= self.left_s():
            return True
        self.skipped.append(what)
        return False
