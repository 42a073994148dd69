"""Plays the simulator's pipeline schedule with point-to-point sends between stages.

The steps come from ``simulator.schedules`` (the same tuples the engine plays): stage ``s``
runs ``schedule[s]`` in order. Chunk ``c`` of stage ``s`` is model chunk ``c * p + s``, so its
input comes from stage ``s - 1`` (or, on stage 0, from stage ``p - 1``'s previous chunk) and its
output goes the other way round. Sends are non-blocking and waited for at the end of the
iteration; receives block. Each message has a tag of (micro-batch, chunk, direction) so that
activations and gradients travelling between the same two ranks never match the wrong receive
(gloo honours tags; NCCL delivers in order, which 1F1B respects).
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.distributed as dist

from calibration.reference.meter import LayerProbe
from calibration.reference.model import GPTChunk
from calibration.reference.parallel import ParallelGroups
from simulator.schedules import Phase, Schedule


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
) -> torch.Tensor:
    """Forward and backward of every micro-batch on this stage; returns the summed loss (last stage) or 0."""
    p, s = groups.pp_size, groups.pp_rank
    v = len(chunks)
    total_chunks = p * v
    inputs: dict[tuple[int, int], torch.Tensor] = {}
    outputs: dict[tuple[int, int], torch.Tensor] = {}
    pending: list = []
    loss_sum = torch.zeros((), device=device, dtype=torch.float32)
    for step in schedule[s]:
        mb, c = step.micro_batch, step.chunk
        model_chunk = c * p + s
        chunk = chunks[c]
        if step.phase is Phase.forward:
            tokens, targets = micro_batch(mb)
            hidden = None
            if model_chunk > 0:
                hidden = torch.empty(activation_shape, dtype=dtype, device=device)
                dist.recv(hidden, src=groups.stage_rank((s - 1) % p), tag=_tag(mb, model_chunk, False, total_chunks))
                hidden.requires_grad_(True)
            if probe is not None:
                probe.chunk = chunk
                probe.measure_bytes = measure_first_micro_batch and mb == 0
            out = chunk(hidden, tokens, targets, probe)
            if probe is not None:
                probe.measure_bytes = False
            inputs[(mb, c)] = hidden
            if model_chunk == total_chunks - 1:
                out = out / num_micro_batches
                loss_sum += out.detach().float()
            else:
                send = out.detach().contiguous()
                pending.append((dist.isend(send, dst=groups.stage_rank((s + 1) % p),
                                           tag=_tag(mb, model_chunk + 1, False, total_chunks)), send))
            outputs[(mb, c)] = out
        else:
            out = outputs.pop((mb, c))
            if model_chunk == total_chunks - 1:
                torch.autograd.backward(out)
            else:
                grad = torch.empty(activation_shape, dtype=dtype, device=device)
                dist.recv(grad, src=groups.stage_rank((s + 1) % p), tag=_tag(mb, model_chunk, True, total_chunks))
                torch.autograd.backward(out, grad)
            hidden = inputs.pop((mb, c))
            if model_chunk > 0:
                send = hidden.grad.contiguous()
                pending.append((dist.isend(send, dst=groups.stage_rank((s - 1) % p),
                                           tag=_tag(mb, model_chunk - 1, True, total_chunks)), send))
    for work, _ in pending:
        work.wait()
    assert not inputs and not outputs, "the schedule left forwards without their backward"
    return loss_sum
