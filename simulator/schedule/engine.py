"""The discrete-event engine: one iteration of a pipeline, played in simpy.

Each pipeline stage is a representative GPU (TP ranks and DP replicas are symmetric) with
three streams: compute (a process walking the stage's schedule steps), pipeline send/receive
(a FIFO link per stage and direction: a transfer holds it for its duration) and
data-parallel gradient reduction (a ``Resource`` per stage). A step waits for its input to
arrive, occupies the compute stream for its duration, then hands its output to the link.

Gradient reduction runs after the stage's last backward, or, with ``overlap_grad_reduce``, in
buckets during the last backward of each model chunk (Megatron-Core's DDP: a bucket is reduced
as soon as the last micro-batch has produced all of its gradients, the chunk's last layers
first); the buckets of a stage queue on one data-parallel stream. The optimizer step waits for
every stage (Megatron's gradient clipping takes a global norm), so the iteration ends at the
slowest stage's ready time plus the slowest optimizer step.

Under a profile's ``step_jitter`` each step's duration varies, independently from stage to stage; a
step that waits for an input then starts at the expected later of the input's arrival and its own
readiness (``simulator.cost.jitter``), which is later than the later of the two means.

Event order depends only on the schedule data and the durations (simpy breaks ties by
insertion order), so the same input gives the same result, bit for bit.
"""

from __future__ import annotations

import gc
import math
from dataclasses import dataclass, field

import simpy

from simulator.cost.jitter import clark_max, expected_max_of_normals
from simulator.schedule.schedules import Phase, Schedule, Step


@dataclass(frozen=True)
class StageWork:
    """Durations for one stage; tuples are indexed by model chunk."""

    forward_s: tuple[float, ...]
    backward_s: tuple[float, ...]  # including the recompute replayed before each backward
    grad_reduce_s: tuple[float, ...]  # DP reduction of each chunk's gradients, all its buckets
    optimizer_s: float  # optimizer step (and, with the distributed optimizer, the parameter all-gather)
    # of forward_s / backward_s, the time the device waits for the host to issue work (for the breakdown)
    forward_host_wait_s: tuple[float, ...] = ()
    backward_host_wait_s: tuple[float, ...] = ()
    grad_buckets: tuple[int, ...] = ()  # buckets each chunk's reduction is split into (default one)


@dataclass(frozen=True)
class PipelineWork:
    stages: tuple[StageWork, ...]
    send_s: tuple[float, ...]  # transfer time from stage i to stage (i + 1) % p, one activation or gradient
    overlap_grad_reduce: bool = False
    # False: the sender's compute stream waits for its send to finish (Megatron's classic blocking
    # batch_isend_irecv + wait); True: sends run beside compute (--overlap-p2p-communication).
    overlap_p2p: bool = True
    # relative standard deviation of each step's duration, independent from stage to stage: a wait then
    # costs the expected maximum of the two jittery times (``simulator.cost.jitter``), not the maximum of the means.
    # A wait synchronises the two stages: what each varied before it lies behind both, so a stage's variance
    # counts from its last wait (against sampling every step, exact for two stages, 25-40% short for 4 to 8)
    step_jitter: float = 0.0
    replicas: int = 1  # data-parallel copies of each stage, each as jittery, all waited for by the optimizer


def ready_time_s(ready: list[tuple[float, float]], replicas: int = 1) -> float:
    """The expected time every rank is ready (the optimizer's global norm waits for all): per stage, the
    expected latest of its ``replicas`` independent copies (mean, variance), then the stages' maximum folded by
    Clark's moments; the plain maximum where nothing varies."""
    if all(v == 0.0 for _, v in ready):
        return max(m for m, _ in ready)
    spread = expected_max_of_normals(replicas)
    mean, var = ready[0][0] + spread * math.sqrt(ready[0][1]), ready[0][1]
    for m, v in ready[1:]:
        mean, var = clark_max(mean, var, m + spread * math.sqrt(v), v)
    return mean


# A trace shows a chunk's gradient reduction in at most this many slices: one a bucket up to it, else runs of
# consecutive buckets (a bucket of one parameter makes a chunk hundreds of millions of them).
MAX_TRACED_BUCKETS = 256


def buckets_done_s(free_s: float, ready_from_s: float, ready_to_s: float, total_s: float, n: int) -> float:
    """When the last of ``n`` buckets is reduced: bucket j is ready at ``ready_from_s`` + (j + 1) / n of the way to
    ``ready_to_s`` and takes ``total_s`` / n on one stream, free from ``free_s``.

    Unrolled, the queue ends at the latest of the stream's start plus all buckets and, for each j, bucket j's
    ready time plus the n - j buckets from it on; that is linear in j, so its largest is the first bucket's or
    the last's: O(1) for any number of buckets, which Megatron's --ddp-bucket-size does not bound."""
    return max(free_s + total_s, ready_from_s + (ready_to_s - ready_from_s) / n + total_s, ready_to_s + total_s / n)


def bucket_slices(free_s: float, ready_from_s: float, ready_to_s: float, total_s: float,
                  n: int) -> list[tuple[int, int, float, float]]:
    """The reduction's slices on the stream, as ``buckets_done_s`` queues them, for a trace: (first bucket, last
    bucket, start, end), a bucket each up to ``MAX_TRACED_BUCKETS``, else that many runs of consecutive buckets."""
    each = total_s / n

    def done(j: int) -> float:  # bucket j's end: the queue of buckets 0..j
        return buckets_done_s(free_s, ready_from_s, ready_from_s + (ready_to_s - ready_from_s) * (j + 1) / n,
                              each * (j + 1), j + 1)

    runs = min(n, MAX_TRACED_BUCKETS)
    bounds = [n * k // runs for k in range(runs + 1)]
    return [(a, b - 1, done(a) - each, done(b - 1)) for a, b in zip(bounds, bounds[1:])]


@dataclass(frozen=True, slots=True)
class Interval:
    stage: int
    stream: str  # "compute", "send_forward", "send_backward", "dp"
    name: str
    start_s: float
    end_s: float
    step: Step | None = None


@dataclass
class StageResult:
    busy_s: float = 0.0  # compute stream occupied
    wait_s: float = 0.0  # compute stream idle: waiting for an input, or for a blocking send
    transfer_wait_s: float = 0.0  # the part of the idle time spent while a transfer it needs was in flight
    last_backward_end_s: float = 0.0
    grads_ready_s: float = 0.0
    optimizer_s: float = 0.0


@dataclass
class EngineResult:
    iteration_time_s: float
    stages: list[StageResult]
    intervals: list[Interval] = field(default_factory=list)


def _source(step: Step, p: int, v: int) -> int | None:
    """The stage whose output this step consumes, or None (first forward / last backward)."""
    if step.phase is Phase.forward:
        if step.stage > 0:
            return step.stage - 1
        return p - 1 if step.chunk > 0 else None
    if step.stage < p - 1:
        return step.stage + 1
    return 0 if step.chunk < v - 1 else None


def _producer_key(step: Step, p: int, v: int) -> tuple | None:
    """Arrival key of this step's input: (phase, micro_batch, receiving stage, receiving chunk)."""
    if _source(step, p, v) is None:
        return None
    return (step.phase, step.micro_batch, step.stage, step.chunk)


def _consumer(step: Step, p: int, v: int) -> tuple[int, tuple] | None:
    """(receiving stage, arrival key) of this step's output, or None."""
    s, c = step.stage, step.chunk
    if step.phase is Phase.forward:
        if s < p - 1:
            return s + 1, (Phase.forward, step.micro_batch, s + 1, c)
        return (0, (Phase.forward, step.micro_batch, 0, c + 1)) if c < v - 1 else None
    if s > 0:
        return s - 1, (Phase.backward, step.micro_batch, s - 1, c)
    return (p - 1, (Phase.backward, step.micro_batch, p - 1, c - 1)) if c > 0 else None


def simulate(schedule: Schedule, work: PipelineWork, record: bool = False) -> EngineResult:
    """Play one iteration; with ``record`` keep every interval (for traces and timelines)."""
    p = len(schedule)
    v = len(work.stages[0].forward_s)
    env = simpy.Environment()
    arrivals: dict[tuple, simpy.Event] = {}
    sent_at: dict[tuple, tuple[float, float]] = {}  # key -> (transfer start, duration)
    sent_var: dict[tuple, float] = {}  # key -> the variance of the sender's time when it sent
    jitter = work.step_jitter
    final_var = [0.0] * p
    results = [StageResult() for _ in range(p)]
    intervals: list[Interval] = []

    def arrival(key: tuple) -> simpy.Event:
        ev = arrivals.get(key)
        if ev is None:
            ev = arrivals[key] = env.event()
        return ev

    # A link is a FIFO resource of capacity one. Transfers are requested in time order, so
    # holding a "free at" time per link gives exactly simpy.Resource's queueing without a
    # process per transfer (the engine plays tens of thousands of them per iteration).
    link_free_at = {(s, d): 0.0 for s in range(p) for d in (Phase.forward, Phase.backward)}

    def transfer(stage: int, direction: Phase, key: tuple, duration: float, var: float) -> simpy.Event:
        start = max(env.now, link_free_at[(stage, direction)])
        link_free_at[(stage, direction)] = start + duration
        sent_at[key] = (start, duration)
        sent_var[key] = var
        if record:
            intervals.append(Interval(stage, f"send_{direction.value}", f"send mb{key[1]}", start, start + duration))
        done = env.timeout(start + duration - env.now)
        waiting = arrivals.get(key)
        if waiting is None:
            arrivals[key] = done
        else:
            done.callbacks.append(lambda _ev: waiting.succeed())
        return done

    dp_free = [0.0] * p  # when each stage's data-parallel stream is next free

    def reduce(stage: int, chunk: int, ready_from: float, ready_to: float) -> float:
        """Queue a chunk's buckets on the stage's DP stream, bucket j ready at ready_from + (j + 1)/n of the
        way to ready_to; the time the last one is done."""
        sw = work.stages[stage]
        n = sw.grad_buckets[chunk] if sw.grad_buckets else 1
        total = sw.grad_reduce_s[chunk]
        if record and total > 0:
            for a, b, start, end in bucket_slices(dp_free[stage], ready_from, ready_to, total, n):
                name = f"bucket {a}" if a == b else f"buckets {a}-{b}"
                intervals.append(Interval(stage, "dp", f"grad reduce chunk {chunk} {name}", start, end))
        dp_free[stage] = buckets_done_s(dp_free[stage], ready_from, ready_to, total, n)
        return dp_free[stage]

    last_backward = {}
    for s, steps in enumerate(schedule):
        for i, step in enumerate(steps):
            if step.phase is Phase.backward:
                last_backward[(s, step.chunk)] = i

    def stage(s: int, steps: tuple[Step, ...]):
        res, sw = results[s], work.stages[s]
        grads_done = 0.0
        var = 0.0  # of this stage's time, under jitter
        for i, step in enumerate(steps):
            key = _producer_key(step, p, v)
            if key is not None:
                ev = arrival(key)
                waited_from = env.now
                if not ev.processed:
                    yield ev
                t_start, t_dur = sent_at[key]
                if env.now > waited_from:
                    res.transfer_wait_s += min(env.now - waited_from, env.now - max(t_start, waited_from), t_dur)
                    res.wait_s += env.now - waited_from
                if jitter:
                    mean, var = clark_max(t_start + t_dur, sent_var[key], waited_from, var)[0], 0.0
                    if mean > env.now:
                        res.wait_s += mean - env.now
                        yield env.timeout(mean - env.now)
            forward = step.phase is Phase.forward
            duration = sw.forward_s[step.chunk] if forward else sw.backward_s[step.chunk]
            start = env.now
            yield env.timeout(duration)
            if jitter:
                var += (jitter * duration) ** 2
            res.busy_s += duration
            if record:
                intervals.append(Interval(s, "compute", f"{'F' if forward else 'B'} mb{step.micro_batch} c{step.chunk}",
                                          start, env.now, step))
            out = _consumer(step, p, v)
            if out is not None:
                direction = step.phase
                link_stage = s
                send = work.send_s[s] if forward else work.send_s[(s - 1) % p]
                done = transfer(link_stage, direction, out[1], send, var)
                if not work.overlap_p2p:
                    blocked_from = env.now
                    yield done
                    res.wait_s += env.now - blocked_from
                    res.transfer_wait_s += env.now - blocked_from
            if not forward:
                res.last_backward_end_s = env.now
                if work.overlap_grad_reduce and last_backward[(s, step.chunk)] == i:
                    grads_done = max(grads_done, reduce(s, step.chunk, start, start + duration))
        if not work.overlap_grad_reduce:
            for c in range(len(sw.grad_reduce_s)):
                grads_done = max(grads_done, reduce(s, c, env.now, env.now))
        if grads_done > env.now:
            yield env.timeout(grads_done - env.now)
        res.grads_ready_s = env.now
        res.optimizer_s = sw.optimizer_s
        final_var[s] = var

    stages = [env.process(stage(s, steps)) for s, steps in enumerate(schedule)]
    # The run allocates tens of thousands of short-lived events and no reference cycles that
    # outlive it; the cyclic collector would only rescan the caller's long-lived data (cached
    # schedules and layer graphs) over and over, which made long pipelines superlinear.
    collecting = gc.isenabled()
    gc.disable()
    try:
        env.run()
    finally:
        if collecting:
            gc.enable()
    assert all(st.processed for st in stages), "the schedule deadlocked: a stage never finished its steps"
    ready = ready_time_s([(r.grads_ready_s, final_var[s]) for s, r in enumerate(results)], work.replicas)
    optimizer = max(r.optimizer_s for r in results)
    if record:
        for s, r in enumerate(results):
            intervals.append(Interval(s, "compute", "optimizer", ready, ready + r.optimizer_s))
    intervals.sort(key=lambda iv: (iv.stage, iv.start_s, iv.stream, iv.name))
    return EngineResult(ready + optimizer, results, intervals)
