"""Megatron's per-rank timers: named stretches of each iteration, summed per iteration on every rank.

The names are Megatron-LM's (``megatron/training/training.py`` and the pipeline schedules), so a
record reads like a Megatron log: ``forward-compute`` and ``backward-compute`` around each step's
compute, ``forward-recv`` / ``forward-send`` / ``backward-recv`` / ``backward-send`` around the
pipeline transfers, ``layernorm-grads-all-reduce`` (sequence parallelism's replicated parameters
over TP), ``embedding-grads-all-reduce`` (the tied word embedding between the first and last
stage), ``grads-all-reduce`` (data parallelism's buckets) and ``optimizer``.

As Megatron's timers do, each start and stop synchronizes the device on CUDA, so a timer holds
the device work issued inside it; on a CPU every op runs on the issuing thread anyway. Megatron's
level-1 timers (the gradient reductions and the optimizer) start after a barrier of every rank
(``--barrier-with-L1-time``, its default): ``barrier=True`` does the same, so they hold the work
and not the wait for the slowest rank, which stays in the iteration's time.
"""

from __future__ import annotations

import time
from contextlib import contextmanager

import torch
import torch.distributed as dist

TIMER_NAMES = (
    "forward-compute", "backward-compute",
    "forward-recv", "forward-send", "backward-recv", "backward-send",
    "layernorm-grads-all-reduce", "embedding-grads-all-reduce", "grads-all-reduce",
    "optimizer",
)


class Timers:
    """``with timers("forward-compute"): ...`` adds the elapsed time to this iteration's total."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.device = device
        self._totals = dict.fromkeys(TIMER_NAMES, 0.0)
        self.iterations: list[dict[str, float]] = []

    def _sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    @contextmanager
    def __call__(self, name: str, barrier: bool = False):
        assert name in self._totals, f"unknown timer {name!r}"
        self._sync()
        if barrier and dist.is_initialized() and dist.get_world_size() > 1:
            dist.barrier()
        start = time.perf_counter()
        try:
            yield
        finally:
            self._sync()
            self._totals[name] += time.perf_counter() - start

    def end_iteration(self) -> None:
        """Close this iteration's totals and start the next."""
        self.iterations.append(self._totals)
        self._totals = dict.fromkeys(TIMER_NAMES, 0.0)
