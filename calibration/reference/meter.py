"""Measuring one layer: the bytes it saves for backward, and its forward/backward/recompute times.

Bytes: ``torch.autograd.graph.saved_tensors_hooks`` sees every tensor autograd keeps. Each
storage is counted once (q, k and v are views of one qkv output; the softmax output is saved by
both softmax and the context GEMM when there is no dropout) and parameters and buffers are left out. Tensors
a LayerNorm saves besides its input (its fp32 mean and 1/std per token) are counted apart as
``norm_statistics_bytes``: Korthikanti et al. and the simulator leave them out of the model.

Times: perf_counter on CPU, CUDA events on GPU. The backward time of a layer runs from the
moment the gradient of its output is ready to the moment the gradient of its input is; the
recompute replayed inside that window is timed on its own and subtracted.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from statistics import mean

import torch
from torch import nn


class SavedTensorMeter:
    """Counts the bytes saved for backward inside a ``with`` block, each storage once."""

    def __init__(self, module: nn.Module) -> None:
        self._module = module
        # parameters and buffers (the causal mask every layer and micro-batch shares) are not activations
        self._params = {p.untyped_storage().data_ptr() for p in (*module.parameters(), *module.buffers())}
        self._seen: dict[int, tuple[int, bool]] = {}  # storage -> (bytes, is a norm statistic)
        self._norm_input: int | None = None
        self._handles: list = []

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr not in self._params and ptr not in self._seen:
            statistic = self._norm_input is not None and ptr != self._norm_input
            self._seen[ptr] = (storage.nbytes(), statistic)
        return t

    def _norm_pre(self, module, args) -> None:
        self._norm_input = args[0].untyped_storage().data_ptr()

    def _norm_post(self, module, args, out) -> None:
        self._norm_input = None

    def __enter__(self) -> "SavedTensorMeter":
        self._seen.clear()
        for m in self._module.modules():
            if isinstance(m, nn.LayerNorm):
                self._handles += [m.register_forward_pre_hook(self._norm_pre), m.register_forward_hook(self._norm_post)]
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._hooks.__exit__(*exc)
        for h in self._handles:
            h.remove()
        self._handles.clear()

    @property
    def activation_bytes(self) -> int:
        return sum(n for n, statistic in self._seen.values() if not statistic)

    @property
    def norm_statistics_bytes(self) -> int:
        return sum(n for n, statistic in self._seen.values() if statistic)


class Clock:
    """Marks on the host clock (CPU) or CUDA events (GPU), resolved to seconds after a synchronize."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def now(self):
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def seconds(self, start, end) -> float:
        return start.elapsed_time(end) / 1e3 if self.cuda else end - start

    def synchronize(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()


@dataclass
class _Span:
    """One layer, one micro-batch: marks filled in by the forward call and the backward hooks."""

    forward: tuple = ()
    backward_start: object = None
    backward_end: object = None
    recompute: list = field(default_factory=list)


@dataclass
class LayerMeasurement:
    forward_s: list[float] = field(default_factory=list)
    backward_s: list[float] = field(default_factory=list)
    recompute_s: list[float] = field(default_factory=list)
    activation_bytes: int | None = None
    norm_statistics_bytes: int | None = None


class LayerProbe:
    """Wraps each layer call of a chunk: meters bytes when ``measure_bytes``, times when ``timing``."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.measure_bytes = False
        self.timing = False
        self.layers: dict[int, LayerMeasurement] = {}
        self._spans: list[tuple[int, _Span]] = []
        self.chunk: nn.Module | None = None

    def __call__(self, index: int, run, x: torch.Tensor) -> torch.Tensor:
        record = self.layers.setdefault(index, LayerMeasurement())
        if self.measure_bytes:
            with SavedTensorMeter(self.chunk.layers) as meter:
                out = run(x, None)
            record.activation_bytes, record.norm_statistics_bytes = meter.activation_bytes, meter.norm_statistics_bytes
            return out
        if not self.timing:
            return run(x, None)
        span = _Span()
        clock = self.clock

        def timer(fn, *args):
            start = clock.now()
            try:
                return fn(*args)
            finally:  # a non-reentrant checkpoint may stop its replay early with an exception
                span.recompute.append((start, clock.now()))

        def mark_start(grad):
            span.backward_start = clock.now()

        def mark_end(grad):
            span.backward_end = clock.now()

        start = clock.now()
        out = run(x, timer)
        span.forward = (start, clock.now())
        out.register_hook(mark_start)
        x.register_hook(mark_end)
        self._spans.append((index, span))
        return out

    def resolve(self) -> None:
        """Turn this iteration's marks into seconds (after a device synchronize)."""
        self.clock.synchronize()
        sec = self.clock.seconds
        for index, span in self._spans:
            record = self.layers[index]
            recompute = sum(sec(a, b) for a, b in span.recompute)
            record.forward_s.append(sec(*span.forward))
            if span.backward_start is not None and span.backward_end is not None:
                record.backward_s.append(sec(span.backward_start, span.backward_end) - recompute)
                record.recompute_s.append(recompute)
        self._spans.clear()

    def summary(self) -> dict[int, dict]:
        def avg(xs: list[float]) -> float | None:
            return mean(xs) if xs else None

        return {
            i: {"forward_s": avg(r.forward_s), "backward_s": avg(r.backward_s), "recompute_s": avg(r.recompute_s),
                "activation_bytes": r.activation_bytes, "norm_statistics_bytes": r.norm_statistics_bytes}
            for i, r in sorted(self.layers.items())
        }
