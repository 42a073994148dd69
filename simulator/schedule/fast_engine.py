"""The engine's semantics without the event machinery: the same iteration time, far faster.

The simpy engine (``simulator.schedule.engine``) is the reference: it writes traces and timelines. Its
dynamics are a max-plus recurrence, because every resource is used in an order fixed by the
schedule: a stage's compute runs its steps in schedule order, and the link a stage sends on
carries that stage's sends in the same order. So a step starts at the later of its stage being
free and its input's arrival; a transfer starts at the later of its step's end and its link being
free. This module evaluates that recurrence directly, stage by stage, advancing each stage while
its next input is known, with the schedule compiled once into flat integer arrays. The tests
check it against the simpy engine on random schedules, stage times and transfer times.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from simulator.cost.jitter import clark_max
from simulator.schedule.engine import EngineResult, PipelineWork, StageResult, buckets_done_s, ready_time_s
from simulator.schedule.schedules import warmup_forwards


@dataclass(frozen=True)
class CompiledSchedule:
    """Per stage, per step: forward?, chunk, the arrival slot it waits for (-1: none), the slot its output
    fills (-1: none), and whether it is its chunk's last backward. A slot is the (phase, micro-batch,
    receiving stage, receiving chunk) of one activation or gradient, numbered densely."""

    stages: tuple[tuple[tuple[bool, int, int, int, bool], ...], ...]
    slots: int


def _order(k, p: int, v: int, forward):
    """(micro-batch, chunk) of a stage's k-th forward (``forward`` true) or backward, as ``schedules``
    orders them (arrays)."""
    if v == 1:
        return k, np.zeros_like(k)
    group, in_group = np.divmod(k, p * v)
    chunk = in_group // p
    return group * p + in_group % p, np.where(forward, chunk, v - 1 - chunk)


def _steps(p: int, m: int, v: int, kind: str):
    """Every stage's steps as arrays, [stage, position]: forward?, micro-batch, chunk, and the position of
    each chunk's last backward ([stage, chunk])."""
    total = m * v
    pos = np.arange(2 * total)[None, :]
    if kind == "gpipe":  # all forwards, then all backwards in reverse micro-batch order
        fwd = np.broadcast_to(pos < m, (p, 2 * m))
        mb = np.broadcast_to(np.where(pos < m, pos, 2 * m - 1 - pos), (p, 2 * m))
        return fwd, mb, np.zeros((p, 2 * m), dtype=np.int64), np.full((p, 1), 2 * m - 1)
    # per stage: its warm-up forwards, one forward and one backward at a time, then the cool-down backwards
    warm = np.array([warmup_forwards(s, p, m, v) for s in range(p)])[:, None]
    steady = pos < 2 * total - warm
    fwd = (pos < warm) | (steady & ((pos - warm) % 2 == 0))
    k = np.where(pos < warm, pos, np.where(steady, (pos - warm) // 2 + np.where(fwd, warm, 0), pos - total))
    mb, chunk = _order(k, p, v, fwd)
    # a chunk's last backward is the last k of its chunk, the same k on every stage
    ks = np.arange(total)
    last_k = np.array([ks[_order(ks, p, v, False)[1] == c][-1] for c in range(v)])[None, :]
    last = np.where(last_k < total - warm, warm + 2 * last_k + 1, last_k + total)
    return fwd, mb, chunk, last


@lru_cache(maxsize=64)
def compile_schedule(p: int, m: int, v: int, kind: str = "1f1b") -> CompiledSchedule:
    """``schedules.build_schedule``'s steps as flat data, computed from the schedule's formulas for every
    stage at once (the tests check the two agree step for step)."""
    rows = zip(*(a.tolist() for a in _schedule_arrays(p, m, v, kind)))
    return CompiledSchedule(tuple(tuple(zip(*row)) for row in rows), 2 * m * p * v)


@lru_cache(maxsize=64)
def _schedule_arrays(p: int, m: int, v: int, kind: str):
    """(is forward, chunk, slot waited for or -1, slot filled or -1, is the chunk's last backward), each
    (p, 2 m v): every stage plays the same number of steps."""
    fwd, mb, chunk, last_pos = _steps(p, m, v, kind)
    s = np.arange(p)[:, None]
    # the input a step waits for is keyed by its own coordinates; the output it sends by its consumer's
    waits = ~((fwd & (s == 0) & (chunk == 0)) | (~fwd & (s == p - 1) & (chunk == v - 1)))
    wait_slot = np.where(waits, _slot(~fwd, mb, s, chunk, m, p, v), -1)
    inner_f, inner_b = s < p - 1, s > 0  # else the send wraps to the next (previous) chunk's first (last) stage
    sends_f = inner_f | (chunk < v - 1)
    sends_b = inner_b | (chunk > 0)
    to_f = _slot(False, mb, np.where(inner_f, s + 1, 0), np.where(inner_f, chunk, chunk + 1), m, p, v)
    to_b = _slot(True, mb, np.where(inner_b, s - 1, p - 1), np.where(inner_b, chunk, chunk - 1), m, p, v)
    fill = np.where(fwd, np.where(sends_f, to_f, -1), np.where(sends_b, to_b, -1))
    last = np.zeros(fwd.shape, dtype=bool)
    np.put_along_axis(last, last_pos, True, axis=1)
    return fwd, np.broadcast_to(chunk, fwd.shape), wait_slot, fill, last


def _slot(backward, mb, stage, chunk, m: int, p: int, v: int):
    return ((np.asarray(backward, dtype=np.int64) * m + mb) * p + stage) * v + chunk


def evaluate(p: int, m: int, v: int, work: PipelineWork, kind: str = "1f1b") -> EngineResult:
    """The iteration ``simulator.schedule.engine.simulate`` would play for this schedule and work (no intervals)."""
    compiled = compile_schedule(p, m, v, kind)
    n = compiled.slots
    arrive_end = [0.0] * n
    arrive_start = [0.0] * n
    arrive_dur = [0.0] * n
    arrive_var = [0.0] * n
    known = [False] * n
    jitter = work.step_jitter
    variance = [0.0] * p
    now = [0.0] * p
    ptr = [0] * p
    busy, wait, transfer_wait, last_bwd_end = [0.0] * p, [0.0] * p, [0.0] * p, [0.0] * p
    grads_done = [0.0] * p
    dp_free = [0.0] * p
    link_free = [[0.0, 0.0] for _ in range(p)]  # per stage: forward link, backward link
    send = work.send_s
    blocking = not work.overlap_p2p
    overlap = work.overlap_grad_reduce
    durations = [(sw.forward_s, sw.backward_s) for sw in work.stages]
    results = [StageResult() for _ in range(p)]

    def reduce(s: int, chunk: int, ready_from: float, ready_to: float) -> float:
        sw = work.stages[s]
        nb = sw.grad_buckets[chunk] if sw.grad_buckets else 1
        dp_free[s] = buckets_done_s(dp_free[s], ready_from, ready_to, sw.grad_reduce_s[chunk], nb)
        return dp_free[s]

    remaining = p
    while remaining:
        progressed = False
        for s in range(p):
            steps = compiled.stages[s]
            i, count = ptr[s], len(steps)
            if i >= count:
                continue
            fwd_d, bwd_d = durations[s]
            send_f, send_b = send[s], send[(s - 1) % p]
            link = link_free[s]
            t, b_s, w_s, tw_s, lb = now[s], busy[s], wait[s], transfer_wait[s], last_bwd_end[s]
            var = variance[s]
            while i < count:
                forward, chunk, wait_slot, fill_slot, last_bwd = steps[i]
                if wait_slot >= 0:
                    if not known[wait_slot]:
                        break
                    end = arrive_end[wait_slot]
                    if end > t:
                        tw_s += min(end - t, end - max(arrive_start[wait_slot], t), arrive_dur[wait_slot])
                    if jitter:
                        mean, var = clark_max(end, arrive_var[wait_slot], t, var)[0], 0.0
                        w_s += mean - t
                        t = mean
                    elif end > t:
                        w_s += end - t
                        t = end
                duration = fwd_d[chunk] if forward else bwd_d[chunk]
                start = t
                t = start + duration
                if jitter:
                    var += (jitter * duration) ** 2
                b_s += duration
                if fill_slot >= 0:
                    li, dur = (0, send_f) if forward else (1, send_b)
                    begin = link[li]
                    if t > begin:
                        begin = t
                    done = begin + dur
                    link[li] = done
                    arrive_start[fill_slot], arrive_dur[fill_slot], arrive_end[fill_slot] = begin, dur, done
                    arrive_var[fill_slot] = var
                    known[fill_slot] = True
                    if blocking:
                        w_s += done - t
                        tw_s += done - t
                        t = done
                if not forward:
                    lb = t
                    if overlap and last_bwd:
                        grads_done[s] = max(grads_done[s], reduce(s, chunk, start, start + duration))
                i += 1
            progressed = progressed or i != ptr[s]
            ptr[s], now[s], busy[s], wait[s], transfer_wait[s], last_bwd_end[s] = i, t, b_s, w_s, tw_s, lb
            variance[s] = var
            if i == count:
                remaining -= 1
                sw, res = work.stages[s], results[s]
                if not overlap:
                    for c in range(len(sw.grad_reduce_s)):
                        grads_done[s] = max(grads_done[s], reduce(s, c, t, t))
                res.busy_s, res.wait_s, res.transfer_wait_s, res.last_backward_end_s = b_s, w_s, tw_s, lb
                res.grads_ready_s = t + (grads_done[s] - t) if grads_done[s] > t else t
                res.optimizer_s = sw.optimizer_s
        assert progressed, "the schedule deadlocked: a stage never finished its steps"
    ready = ready_time_s([(r.grads_ready_s, variance[s]) for s, r in enumerate(results)], work.replicas)
    return EngineResult(ready + max(r.optimizer_s for r in results), results, [])


# --- the same recurrence compiled with numba, when it is installed (the `fast` extra) ------------

# Importing and loading numba costs about half a second, more than a hundred evaluations in
# Python; it pays off for long schedules and for runs of many evaluations (sweeps, the bench),
# which switch it on. Both paths give the same result to the last bit.
COMPILED_ABOVE_STEPS = 200_000
_use_compiled: bool | None = None


def use_compiled(on: bool = True) -> bool:
    """Evaluate through numba from now on (if it is installed); returns whether it is."""
    global _use_compiled
    if on:
        try:
            import numba  # noqa: F401
        except ImportError:
            on = False
    _use_compiled = on
    return on


def run(p: int, m: int, v: int, work: PipelineWork, kind: str = "1f1b") -> EngineResult:
    """The iteration time of ``work`` under the schedule, by the fastest path at hand."""
    steps = 2 * p * m * v
    if _use_compiled is None and steps > COMPILED_ABOVE_STEPS:
        use_compiled(True)
    if _use_compiled:
        return evaluate_compiled(p, m, v, work, kind)
    return evaluate(p, m, v, work, kind)

@lru_cache(maxsize=64)
def _arrays(p: int, m: int, v: int, kind: str):
    import numpy as np

    columns = _schedule_arrays(p, m, v, kind)  # straight to the kernel's table, no Python tuples between
    steps = columns[0].shape[1]
    offsets = np.arange(p + 1, dtype=np.int64) * steps
    table = np.stack([np.asarray(c, dtype=np.int64) for c in columns], axis=-1).reshape(-1, 5)
    return offsets, table, 2 * m * p * v


def _numba_kernel():
    import numba
    import numpy as np

    clark = numba.njit(cache=True, nogil=True)(clark_max)
    queue = numba.njit(cache=True, nogil=True)(buckets_done_s)

    @numba.njit(cache=True, nogil=True)
    def run(offsets, table, slots, fwd_d, bwd_d, send, reduce_s, buckets, optimizer, blocking, overlap, jitter):
        p = offsets.shape[0] - 1
        arrive_end = np.zeros(slots)
        arrive_start = np.zeros(slots)
        arrive_dur = np.zeros(slots)
        arrive_var = np.zeros(slots)
        variance = np.zeros(p)
        known = np.zeros(slots, dtype=np.bool_)
        out = np.zeros((p, 6))  # busy, wait, transfer_wait, last_backward_end, grads_ready, optimizer
        now = np.zeros(p)
        ptr = offsets[:-1].copy()
        grads_done = np.zeros(p)
        dp_free = np.zeros(p)
        link = np.zeros((p, 2))
        remaining = p
        while remaining > 0:
            progressed = False
            for s in range(p):
                i, stop = ptr[s], offsets[s + 1]
                if i >= stop:
                    continue
                t = now[s]
                var = variance[s]
                first = i
                while i < stop:
                    forward, chunk, wait_slot, fill_slot, last_bwd = table[i, 0], table[i, 1], table[i, 2], table[i, 3], table[i, 4]
                    if wait_slot >= 0:
                        if not known[wait_slot]:
                            break
                        end = arrive_end[wait_slot]
                        if end > t:
                            out[s, 2] += min(end - t, end - max(arrive_start[wait_slot], t), arrive_dur[wait_slot])
                        if jitter > 0.0:
                            mean = clark(end, arrive_var[wait_slot], t, var)[0]
                            var = 0.0
                            out[s, 1] += mean - t
                            t = mean
                        elif end > t:
                            out[s, 1] += end - t
                            t = end
                    duration = fwd_d[s, chunk] if forward else bwd_d[s, chunk]
                    start = t
                    t = start + duration
                    var += (jitter * duration) ** 2
                    out[s, 0] += duration
                    if fill_slot >= 0:
                        li = 0 if forward else 1
                        dur = send[s] if forward else send[(s - 1) % p]
                        begin = link[s, li]
                        if t > begin:
                            begin = t
                        done = begin + dur
                        link[s, li] = done
                        arrive_start[fill_slot] = begin
                        arrive_dur[fill_slot] = dur
                        arrive_end[fill_slot] = done
                        arrive_var[fill_slot] = var
                        known[fill_slot] = True
                        if blocking:
                            out[s, 1] += done - t
                            out[s, 2] += done - t
                            t = done
                    if not forward:
                        out[s, 3] = t
                        if overlap and last_bwd:
                            free = queue(dp_free[s], start, start + duration, reduce_s[s, chunk], buckets[s, chunk])
                            dp_free[s] = free
                            grads_done[s] = max(grads_done[s], free)
                    i += 1
                if i != first:
                    progressed = True
                ptr[s] = i
                now[s] = t
                variance[s] = var
                if i == stop:
                    remaining -= 1
                    if not overlap:
                        for c in range(reduce_s.shape[1]):
                            free = queue(dp_free[s], t, t, reduce_s[s, c], buckets[s, c])
                            dp_free[s] = free
                            grads_done[s] = max(grads_done[s], free)
                    out[s, 4] = t + (grads_done[s] - t) if grads_done[s] > t else t
                    out[s, 5] = optimizer[s]
            if not progressed:
                return -1.0, out, variance
        return out[:, 4].max() + out[:, 5].max(), out, variance

    return run


_KERNEL = None


def evaluate_compiled(p: int, m: int, v: int, work: PipelineWork, kind: str = "1f1b") -> EngineResult:
    """``evaluate`` through numba; raises ImportError where numba is not installed."""
    global _KERNEL
    import numpy as np

    if _KERNEL is None:
        _KERNEL = _numba_kernel()
    offsets, table, slots = _arrays(p, m, v, kind)
    stages = work.stages
    total, out, variance = _KERNEL(offsets, table, slots, np.array([s.forward_s for s in stages]),
                         np.array([s.backward_s for s in stages]), np.array(work.send_s, dtype=float),
                         np.array([s.grad_reduce_s for s in stages]),
                         np.array([s.grad_buckets if s.grad_buckets else (1,) * v for s in stages], dtype=np.int64),
                         np.array([s.optimizer_s for s in stages]), not work.overlap_p2p, work.overlap_grad_reduce,
                         float(work.step_jitter))
    assert total >= 0, "the schedule deadlocked: a stage never finished its steps"
    results = [StageResult(*map(float, row)) for row in out]
    if work.step_jitter:
        ready = ready_time_s([(r.grads_ready_s, float(v)) for r, v in zip(results, variance)], work.replicas)
        total = ready + max(r.optimizer_s for r in results)
    return EngineResult(float(total), results, [])
