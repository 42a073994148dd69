"""Pipeline schedules as pure data: the ordered steps each stage runs in one iteration.

A schedule is a tuple per stage of ``Step(stage, micro_batch, chunk, phase)``. The engine plays
it, the reference training loop plays the same data, and the tests check it directly
(warm-up counts, every forward before its backward, the closed-form bubble).

Chunk ``c`` of stage ``s`` holds model chunk ``c * p + s`` (Megatron's interleaved layout), so
a micro-batch's forward visits stage 0..p-1 on chunk 0, then stage 0..p-1 on chunk 1, and so on.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from functools import lru_cache


class Phase(str, Enum):
    forward = "forward"
    backward = "backward"


@dataclass(frozen=True, slots=True)
class Step:
    stage: int
    micro_batch: int
    chunk: int
    phase: Phase


Schedule = tuple[tuple[Step, ...], ...]


def gpipe(num_stages: int, num_micro_batches: int) -> Schedule:
    """All forwards, then all backwards (in reverse micro-batch order)."""
    p, m = num_stages, num_micro_batches
    return tuple(
        tuple(Step(s, i, 0, Phase.forward) for i in range(m))
        + tuple(Step(s, i, 0, Phase.backward) for i in reversed(range(m)))
        for s in range(p)
    )


def warmup_forwards(stage: int, num_stages: int, num_micro_batches: int, virtual_stages: int = 1) -> int:
    """Forwards a stage runs before its first backward (Megatron's warm-up count)."""
    p, m, v = num_stages, num_micro_batches, virtual_stages
    if v == 1:
        return min(p - stage - 1, m)
    return min((p - stage - 1) * 2 + (v - 1) * p, m * v)


def one_f_one_b(num_stages: int, num_micro_batches: int) -> Schedule:
    """PipeDream-flush 1F1B: warm-up forwards, one-forward-one-backward, cool-down backwards."""
    return interleaved_one_f_one_b(num_stages, num_micro_batches, 1)


def _chunk_order(k: int, p: int, v: int, forward: bool) -> tuple[int, int]:
    """The (micro_batch, chunk) of the k-th forward (or backward) of a stage, as Megatron orders them."""
    group, in_group = divmod(k, p * v)
    chunk = in_group // p
    if not forward:
        chunk = v - 1 - chunk
    return group * p + in_group % p, chunk


def interleaved_one_f_one_b(num_stages: int, num_micro_batches: int, virtual_stages: int) -> Schedule:
    """Interleaved 1F1B (Narayanan et al. 2021): each stage holds ``virtual_stages`` model chunks.

    With ``virtual_stages == 1`` this is plain 1F1B. For v > 1 the micro-batches must be a
    multiple of the stages (Megatron's rule), which ``ParallelPlan`` checks.
    """
    p, m, v = num_stages, num_micro_batches, virtual_stages
    total = m * v
    stages = []
    for s in range(p):
        if v == 1:
            order = lambda k, fwd: (k, 0)  # noqa: E731 - plain 1F1B keeps micro-batch order
        else:
            order = lambda k, fwd: _chunk_order(k, p, v, fwd)  # noqa: E731
        warm = warmup_forwards(s, p, m, v)
        steps: list[Step] = []
        f = b = 0
        for _ in range(warm):
            steps.append(Step(s, *order(f, True), Phase.forward))
            f += 1
        while f < total:
            steps.append(Step(s, *order(f, True), Phase.forward))
            f += 1
            steps.append(Step(s, *order(b, False), Phase.backward))
            b += 1
        while b < total:
            steps.append(Step(s, *order(b, False), Phase.backward))
            b += 1
        stages.append(tuple(steps))
    return tuple(stages)


@lru_cache(maxsize=64)
def build_schedule(num_stages: int, num_micro_batches: int, virtual_stages: int = 1, kind: str = "1f1b") -> Schedule:
    if kind == "gpipe":
        return gpipe(num_stages, num_micro_batches)
    return interleaved_one_f_one_b(num_stages, num_micro_batches, virtual_stages)


def peak_in_flight(stage_steps: tuple[Step, ...]) -> int:
    """Most (micro-batch, chunk) activations a stage holds at once: forwards done, backwards not yet."""
    live = peak = 0
    for step in stage_steps:
        live += 1 if step.phase is Phase.forward else -1
        peak = max(peak, live)
    return peak


def bubble_fraction(num_stages: int, num_micro_batches: int, virtual_stages: int = 1) -> float:
    """Closed-form idle fraction relative to ideal time: (p-1)/(v*m) (Narayanan et al. 2021)."""
    return (num_stages - 1) / (virtual_stages * num_micro_batches)
