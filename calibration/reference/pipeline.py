"""Plays the simulator's pipeline schedule with point-to-point sends between stages.

The steps come from ``simulator.schedule.schedules`` (the same tuples the engine plays): stage ``s``
runs ``schedule[s]`` in order. Chunk ``c`` of stage ``s`` is model chunk ``c * p + s``, so its
input comes from stage ``s - 1`` (or, on stage 0, from stage ``p - 1``'s previous chunk) and its
output goes the other way round. Sends are non-blocking and waited for at the end of the
iteration (gloo's and NCCL's sends wait for the matching receive, so blocking ones would deadlock
a 1F1B step that sends before it receives); receives block. Each message has a tag of (micro-batch, chunk, direction) so that
activations and gradients travelling between the same two ranks never match the wrong receive
(gloo honours tags; NCCL delivers in order, which 1F1B respects).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable

import torch
import torch.distributed as dist

from calibration.reference.grads import ChunkGradients
from calibration.reference.meter import LayerProbe
from calibration.reference.model import GPTChunk
from calibration.reference.parallel import ParallelGroups
from calibration.reference.timers import Timers
from simulator.schedule.schedules import Phase, Schedule


def _tag(micro_batch: int, model_chunk: int, gradient: bool, num_model_chunks: int) -> int:
    return 2 * (micro_batch * num_model_chunks + model_chunk) + int(gradient)


def run_schedule(
    *,
    chunks: list[GPTChunk],
    schedule: Schedule,
    groups: ParallelGroups,
    micro_batch: Callable[[int], tuple[torch.Tensor, torch.Tensor]],
    num_micro_batches: int,
    activation_shape: tuple[int, ...],
    dtype: torch.dtype,
    device: torch.device,
    probe: LayerProbe | None = None,
    measure_first_micro_batch: bool = False,
    timers: Timers | None = None,
    grads: list[ChunkGradients] | None = None,
) -> torch.Tensor:
    """Forward and backward of every micro-batch on this stage; returns the summed loss (last stage) or 0.

    ``timers`` get Megatron's compute and send/receive timers; ``grads[c]`` (chunk c's gradient
    buffer) is told before chunk c's last backward, so that its buckets can reduce as they fill.
    """
    p, s = groups.pp_size, groups.pp_rank
    v = len(chunks)
    total_chunks = p * v
    timed = timers if timers is not None else _untimed
    last_backward = {}
    for i, step in enumerate(schedule[s]):
        if step.phase is not Phase.forward:
            last_backward[step.chunk] = i
    inputs: dict[tuple[int, int], torch.Tensor] = {}
    outputs: dict[tuple[int, int], torch.Tensor] = {}
    pending: list = []  # (work, tensor, timer name)
    loss_sum = torch.zeros((), device=device, dtype=torch.float32)
    steps = schedule[s]

    def receives(j: int) -> bool:
        model_chunk = steps[j].chunk * p + s
        return model_chunk > 0 if steps[j].phase is Phase.forward else model_chunk != total_chunks - 1

    # Megatron's --overlap-p2p-communication: the receive of the next input is posted before this step's
    # compute, so the peer's send lands while it runs (a transport that moves data only once the receive is
    # posted, as gloo's and NCCL's do, would otherwise start it when the step asks for it)
    posted: dict[int, tuple] = {}

    def post(j: int) -> None:
        if j < len(steps) and j not in posted and receives(j):
            step = steps[j]
            model_chunk = step.chunk * p + s
            forward = step.phase is Phase.forward
            buf = torch.empty(activation_shape, dtype=dtype, device=device)
            src = groups.stage_rank((s - 1) % p if forward else (s + 1) % p)
            posted[j] = (dist.irecv(buf, src=src, tag=_tag(step.micro_batch, model_chunk, not forward, total_chunks)),
                         buf)

    def post_next(after: int) -> None:
        post(next((k for k in range(after + 1, len(steps)) if receives(k)), len(steps)))

    def received(j: int, timer: str) -> torch.Tensor:
        post(j)
        work, buf = posted.pop(j)
        with timed(timer):
            work.wait()
        post_next(j)
        return buf

    post_next(-1)
    for i, step in enumerate(steps):
        mb, c = step.micro_batch, step.chunk
        model_chunk = c * p + s
        chunk = chunks[c]
        if step.phase is Phase.forward:
            hidden = None
            if model_chunk > 0:
                hidden = received(i, "forward-recv")
                hidden.requires_grad_(True)
            with timed("forward-compute"):
                tokens, targets = micro_batch(mb)
                if probe is not None:
                    probe.chunk = chunk
                    probe.measure_bytes = measure_first_micro_batch and mb == 0
                out = chunk(hidden, tokens, targets, probe)
                if probe is not None:
                    probe.measure_bytes = False
                if model_chunk == total_chunks - 1:
                    out = out / num_micro_batches
                    loss_sum += out.detach().float()
            inputs[(mb, c)] = hidden
            if model_chunk != total_chunks - 1:
                with timed("forward-send"):
                    send = out.detach().contiguous()
                    pending.append((dist.isend(send, dst=groups.stage_rank((s + 1) % p),
                                               tag=_tag(mb, model_chunk + 1, False, total_chunks)), send,
                                    "forward-send"))
            outputs[(mb, c)] = out
        else:
            out = outputs.pop((mb, c))
            grad = None
            if model_chunk != total_chunks - 1:
                grad = received(i, "backward-recv")
            if grads is not None and last_backward[c] == i:
                grads[c].start_last_micro_batch()
            with timed("backward-compute"):
                torch.autograd.backward(out, grad)
            hidden = inputs.pop((mb, c))
            if model_chunk > 0:
                with timed("backward-send"):
                    send = hidden.grad.contiguous()
                    pending.append((dist.isend(send, dst=groups.stage_rank((s - 1) % p),
                                               tag=_tag(mb, model_chunk - 1, True, total_chunks)), send,
                                    "backward-send"))
    for work, _, name in pending:
        with timed(name):
            work.wait()
    assert not inputs and not outputs, "the schedule left forwards without their backward"
    return loss_sum


@contextmanager
def _untimed(name: str):
    yield
