"""The closed-form screen: an iteration time from the engine's own per-step durations, without
playing the schedule. The search ranks thousands of plans with it and the band measures with it
how far each unpinned constant moves an answer; the engine has the last word on both.
"""

from __future__ import annotations

from simulator.schedule.engine import PipelineWork
from simulator.schedule.stage_work import build_work
from simulator.schedule.timing import cost_model_for, extra_times
from simulator.spec.plan import Job


def fast_iteration_time_s(work: PipelineWork, num_micro_batches: int) -> float:
    """Closed-form iteration time over the engine's own per-step durations.

    1F1B keeps the slowest stage busy for m micro-batches and pays (p - 1) / v of a mean stage's
    micro-batch work to fill and drain the pipeline (exact for uniform stages); the gradient
    reduction and the optimizer close the iteration. Blocking sends hold every step, so they are
    part of each micro-batch's work, fill and drain included; sends that run beside compute still
    put the p v - 1 crossings of the first activation and the last gradient on the critical path.
    """
    stages = work.stages
    p, v = len(stages), len(stages[0].forward_s)
    # the middle stages share one StageWork: each distinct one's step sums are taken once
    distinct = list({id(s): s for s in stages}.values())
    compute = {id(s): sum(s.forward_s) + sum(s.backward_s) for s in distinct}
    # with blocking sends every step also waits for its own send: forward to i + 1, backward to i - 1
    send = work.send_s
    blocking = [0.0 if work.overlap_p2p or p == 1 else v * (send[i] + send[i - 1]) for i in range(p)]
    per_mb = [compute[id(s)] + blocking[i] for i, s in enumerate(stages)]
    fill = (p - 1) / v * (sum(per_mb) / p)
    transfers = 2 * (p * v - 1) * sum(send) / p if p > 1 and work.overlap_p2p else 0.0
    if work.overlap_grad_reduce:  # chunk 0's buckets are reduced during the stage's last backward step
        def exposed(s) -> float:
            n = s.grad_buckets[0] if s.grad_buckets else 1
            return max(s.grad_reduce_s[0] / n, s.grad_reduce_s[0] - s.backward_s[0] * (n - 1) / n)
        reduce = max(exposed(s) for s in distinct)
    else:
        reduce = max(sum(s.grad_reduce_s) for s in distinct)
    optimizer = max(s.optimizer_s for s in distinct)
    return num_micro_batches * max(per_mb) + fill + transfers + reduce + optimizer


def screen(job: Job, profile=None) -> float:
    """The closed-form iteration time of ``job`` (the search's fast tier)."""
    cost = cost_model_for(job, profile)
    work = build_work(job, cost, None, extra_times(job, cost))  # the layer times of each kind the model has
    return fast_iteration_time_s(work, job.plan.num_micro_batches)
