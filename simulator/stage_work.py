"""A stage's work as the engine plays it, put together from two parts that plans share separately: its
chunks' forward and backward steps (the layers' compute, which the micro-batch and the recompute policy
set) and its data-parallel part (gradient buckets and their reduction, Megatron-FSDP's gathers, the
optimizer step; which they do not). ``estimate.build_work`` computes both for one job; the search
computes each once for the candidates that have it alike (``simulator.search_memo``), and both put a
stage together here, with the same arithmetic.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Sequence

from simulator.engine import PipelineWork, StageWork
from simulator.plan import ParallelPlan
from simulator.timing import Span


@dataclass(frozen=True)
class OptimizerStep:
    """A stage's optimizer step, apart from the first forward step its parameter gather may hide behind."""

    step_s: float  # the optimizer kernels
    gather_s: float | None  # one bucket of the distributed optimizer's parameter all-gather (None: no gather)
    buckets: int
    overlap_param_gather: bool
    host_s: float | None  # the host's work once per iteration

    def time_s(self, first_forward_s: float) -> float:
        step = self.step_s
        if self.gather_s is not None:
            bucket, n = self.gather_s, self.buckets
            step += bucket + (max(0.0, (n - 1) * bucket - first_forward_s) if self.overlap_param_gather else 0.0)
        if self.host_s is not None:
            step += self.host_s
        return step


@dataclass(frozen=True)
class StageCommunication:
    """A stage's data-parallel work, per model chunk: gradient buckets and reduction, and under
    Megatron-FSDP the (gather, scatter) each micro-batch's steps wait on; and the optimizer step.
    It does not depend on the micro-batch or the recompute policy, so the search shares it
    (``estimate.stage_communication`` computes it)."""

    buckets: tuple[int, ...]
    reduce_s: tuple[float, ...]
    fsdp_s: tuple[tuple[float, float], ...] | None
    optimizer: OptimizerStep


@dataclass(frozen=True)
class StageSteps:
    """A stage's chunks' forward and backward steps, each from an empty queue, and of each the time the
    device waits for the host to issue its work."""

    forward_s: tuple[float, ...]
    backward_s: tuple[float, ...]
    forward_host_wait_s: tuple[float, ...]
    backward_host_wait_s: tuple[float, ...]

    @staticmethod
    def of(spans: tuple[tuple[Span, Span], ...]) -> "StageSteps":
        """From each chunk's (forward, backward) ``step_spans``."""
        return StageSteps(tuple(f.cold_s for f, _ in spans), tuple(b.cold_s for _, b in spans),
                          tuple(f.host_wait_s for f, _ in spans), tuple(b.host_wait_s for _, b in spans))


def stage_work(steps: StageSteps, comm: StageCommunication) -> StageWork:
    """A stage's work from its chunks' steps and its data-parallel part."""
    fwd, bwd = steps.forward_s, steps.backward_s
    if comm.fsdp_s is not None:
        fwd, bwd = list(fwd), list(bwd)
        for c, ((gather, scatter), nb) in enumerate(zip(comm.fsdp_s, comm.buckets)):
            fwd[c] += max(gather / nb, gather - fwd[c])
            bwd[c] += max(gather / nb, gather + scatter - bwd[c])
        fwd, bwd = tuple(fwd), tuple(bwd)
    return StageWork(fwd, bwd, comm.reduce_s, comm.optimizer.time_s(fwd[0]), steps.forward_host_wait_s,
                     steps.backward_host_wait_s, comm.buckets)


def pipeline_work(plan: ParallelPlan, kind_of: tuple[int, ...], works: Sequence[StageWork],
                  send: tuple[float, ...], step_jitter: float = 0.0) -> PipelineWork:
    """The engine's work of every stage: ``works`` holds one per kind of stage, ``kind_of`` each stage's
    kind (``stage_kinds``); ``step_jitter`` the profile's."""
    return PipelineWork(tuple(works[k] for k in kind_of), send, plan.overlap_grad_reduce, plan.overlap_p2p_comm,
                        step_jitter, plan.data_parallel_size)


@lru_cache(maxsize=4096)
def stage_kinds(stage_layers: tuple) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(the first stage of each kind, each stage's kind). A stage's work depends only on its layers
    (``stage_layers[stage]``: its chunks' layer counts, or for an MoE model their runs) and whether it
    holds the embedding or the loss: uneven splits aside, the middle stages are one and the same."""
    p = len(stage_layers)
    index: dict[tuple, int] = {}
    firsts, kind_of = [], []
    for s, layers in enumerate(stage_layers):
        key = (layers, s == 0, s == p - 1)
        if key not in index:
            index[key] = len(firsts)
            firsts.append(s)
        kind_of.append(index[key])
    return tuple(firsts), tuple(kind_of)
