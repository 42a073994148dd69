"""Ops in sequence against ops alone: a stack of the reference loop's own transformer layers, forward and
backward as autograd runs them in a training step, against the sum of the same ops each repeated on its own.

Every other benchmark times one kernel repeated; a training step runs hundreds of different ones back to
back, each finding the caches, TLBs and allocator as the one before left them. On a 2-core CPU the stack
ran a quarter to a third slower than the sum of its ops alone. The model's per-op times come
from the kernel benchmarks, so their ratio is what the step adds on top.

The two are timed by turns (one pass of the stack, then each of its ops alone, per round), so that a slow
drift of the machine's speed falls on both and cancels from each round's ratio. The ops are recorded once,
below autograd (a ``TorchDispatchMode``), with the very tensors the pass used, and replayed alone under
``no_grad``.

Runs on a synchronous device only: on a GPU the host issues ahead and a kernel's start does not wait for
the previous one's bookkeeping, which the host block describes instead.
"""

from __future__ import annotations

import statistics
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from calibration.microbench.shapes import LayerDims
from calibration.microbench.timing import Budget

SEQUENCE_LAYERS = 4  # a stack, so each layer's input is another's output as in a model; more adds time only
ALONE_REPEATS = 3  # each op alone: one warm-up call, then the median of these
# passes of the stack per round, the first untimed: a step runs micro-batch after micro-batch, and the first
# pass after the replay finds the allocator and caches as the replay left them (it ran ~6% slower than the next)
PASSES_PER_ROUND = 3


class _Recorder(TorchDispatchMode):
    """Every aten op of a pass, with the tensors it was called on, and whether the backward ran it."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[tuple] = []
        self.backward = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        self.ops.append((func, args, kwargs, self.backward))
        return out


def _stack(layer: LayerDims, dtype: torch.dtype, device: torch.device):
    """The reference loop's layers at ``layer``'s shapes on one rank of its TP group (without the group's
    collectives: what a rank computes between them), with its fp32 main-gradient buffer."""
    from calibration.reference.grads import GradBuffer
    from calibration.reference.model import TransformerLayer
    from calibration.reference.parallel import ParallelGroups
    from simulator.spec.layout import RankLayout
    from simulator.spec.model import ModelSpec
    from simulator.spec.plan import ParallelPlan

    t = layer.tensor_parallel_size
    model = ModelSpec(name="sequence-benchmark", num_layers=SEQUENCE_LAYERS, hidden_size=layer.hidden_size,
                      num_attention_heads=layer.num_attention_heads, ffn_hidden_size=layer.ffn_hidden_size,
                      vocab_size=2 * t, seq_length=layer.seq_length)
    # unfused attention: the path the loop takes where no fused kernel applies (fp32, the CPU)
    plan = ParallelPlan(tensor_parallel_size=t, micro_batch_size=layer.micro_batch_size,
                        global_batch_size=layer.micro_batch_size, attention_backend="unfused")
    groups = ParallelGroups(RankLayout(t, 1, 1, 1, t), 0, 0, t, 0, 1, 0, 1, 0, 1, tp=None, cp=None, cp_ranks=(0,),
                            dp_cp=None, embedding=None)
    layers = [TransformerLayer(model=model, plan=plan, groups=groups, index=i, seed=1, dtype=dtype, device=device)
              for i in range(SEQUENCE_LAYERS)]
    buffer = GradBuffer([p for m in layers for p in m.parameters()], dp_group=None, dp_size=1, bucket_params=None,
                        overlap=False, device=device)
    return layers, buffer


def run_sequence(layer: LayerDims, dtype: torch.dtype, device: torch.device, budget: Budget, *,
                 rounds: int) -> dict:
    """Per round, the stack's forward and backward as a step runs them (the mean of the passes after the first)
    and the sum of their ops alone."""
    # the buffer is kept: the weight gradients accumulate into its main_grad views, as in the loop
    layers, _buffer = _stack(layer, dtype, device)
    shape = (layer.seq_length, layer.micro_batch_size, layer.hidden_size)
    gen = torch.Generator(device=device).manual_seed(0)

    def inputs() -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(shape, generator=gen, device=device, dtype=dtype).requires_grad_(True)
        return x, torch.randn(shape, generator=gen, device=device, dtype=dtype)

    def step(x: torch.Tensor, grad: torch.Tensor, recorder: _Recorder | None = None) -> tuple[float, float]:
        t0 = time.perf_counter()
        y = x
        for m in layers:
            y = m(y)
        t1 = time.perf_counter()
        if recorder is not None:
            recorder.backward = True
        y.backward(grad)
        t2 = time.perf_counter()
        return t1 - t0, t2 - t1

    def alone(ops: list[tuple]) -> tuple[float, float]:
        total = [0.0, 0.0]
        with torch.no_grad():
            for func, args, kwargs, backward in ops:
                func(*args, **kwargs)
                samples = []
                for _ in range(ALONE_REPEATS):
                    t0 = time.perf_counter()
                    func(*args, **kwargs)
                    samples.append(time.perf_counter() - t0)
                total[backward] += statistics.median(samples)
        return total[0], total[1]

    for _ in range(2):  # warm-up: first-call allocations and kernel selection
        step(*inputs())
    recorder = _Recorder()
    x, grad = inputs()
    with recorder:
        step(x, grad, recorder)
    ops = recorder.ops
    out = []
    t_start = time.monotonic()
    for r in range(rounds):
        if r and not budget.allows((time.monotonic() - t_start) / r, f"sequence round {r + 1} of {rounds}"):
            break
        passes = [step(*inputs()) for _ in range(PASSES_PER_ROUND)][1:]
        loop_f, loop_b = (sum(t[i] for t in passes) / len(passes) for i in (0, 1))
        alone_f, alone_b = alone(ops)
        out.append({"loop_forward_s": loop_f, "loop_backward_s": loop_b,
                    "alone_forward_s": alone_f, "alone_backward_s": alone_b})
    return {"layers": SEQUENCE_LAYERS, "passes": PASSES_PER_ROUND - 1,
            "layer": {k: getattr(layer, k) for k in layer.__dataclass_fields__},
            "ops_forward": sum(1 for op in ops if not op[3]), "ops_backward": sum(1 for op in ops if op[3]),
            "rounds": out}
