"""The whole training run played in simpy: failures, checkpoints, lost work, restarts, spares and repairs.

Every component's failures are Poisson processes; together they are one Poisson process of the summed rate
whose events are drawn a component in proportion to its rate, so the run schedules one event per
interruption rather than one per component (a 90-day run on 100,000 GPUs is some 5,000 events). Between
interruptions the job's progress is counted, not played: k iterations and their save take a known time,
so how many checkpoints were made, and which of them had reached storage, follows from the time the
failure came. A failure loses the work after the last safe checkpoint and starts a restart, which a later
failure may cut short; a planned stop saves first and loses nothing. With hot spares (``spare_nodes``) a
failed node is swapped for a spare, when one is free, and goes to repair, coming back to the pool after
its component's repair time; with none free the job waits for the first repair.

A run longer than the event budget's fewest runs can play is played in chunks: each starts and ends at a
safe checkpoint, so the run is a sum of independent chunks, and its days are the chunk's mean and spread
scaled (the mean by the number of chunks, the spread by its square root, the percentiles from the normal
law the sum tends to). What the simulation costs is then bounded, whatever the run's length.

Each run draws from its own stream of a ``numpy`` SeedSequence, so the same seed gives the same days.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np
import simpy

from simulator.spec import limits

SECONDS_PER_DAY = 86400.0
_EVENT_BUDGET = 300_000  # interruptions the default number of runs plays: 1.5-2.5 s at 5-8 us each
_MIN_RUNS, _MAX_RUNS = 40, 400
# interruptions of one chunk of a long run: enough for its days to be near normal, few enough that the
# default chunks (_MIN_RUNS of them) cost a fraction of a second
_CHUNK_INTERRUPTIONS = 2_000
_BATCH = 4096  # random numbers drawn at once


@dataclass(frozen=True)
class SimulatedDays:
    p10_days: float
    p50_days: float
    p90_days: float
    mean_days: float
    runs: int
    interruptions_per_run: float
    chunks_per_run: float = 1.0  # > 1: each run played as chunks of this fraction of it, the days scaled


class _Draws:
    """Exponential gaps of the summed process and the component of each event, drawn in batches."""

    def __init__(self, rng: np.random.Generator, rate_per_s: float, cumulative: np.ndarray):
        self.rng, self.scale, self.cumulative = rng, 1.0 / rate_per_s, cumulative
        self._gaps: list[float] = []
        self._kinds: list[int] = []

    def gap(self) -> float:
        if not self._gaps:
            self._gaps = self.rng.exponential(self.scale, _BATCH).tolist()[::-1]
        return self._gaps.pop()

    def kind(self) -> int:
        if not self._kinds:
            u = self.rng.random(_BATCH)
            self._kinds = np.minimum(np.searchsorted(self.cumulative, u, side="right"),
                                     len(self.cumulative) - 1).tolist()[::-1]
        return self._kinds.pop()


def _job(env: simpy.Environment, r, k: float, parts, draws: _Draws | None, spares: simpy.Container | None,
         tally: dict) -> simpy.events.Event:
    """One run: segments of k iterations and a save, until every iteration is safe on storage."""
    T, n, lag = r.iteration_time_s, r.iterations, r.durable_lag_s
    segment = r.segment_s(k)
    done = 0.0  # iterations behind the last safe checkpoint
    while True:
        left = n - done
        full = int(left // k + 1e-12)
        rest = left - full * k
        if rest < 1e-9:
            rest = 0.0
        finish = full * segment + (r.segment_s(rest) if rest else 0.0)
        gap = draws.gap() if draws is not None else float("inf")
        if gap >= finish:
            yield env.timeout(finish)
            return
        yield env.timeout(gap)
        tally["interruptions"] += 1
        saved = min(int(gap // segment), full)  # checkpoints completed in this stretch
        since = gap - saved * segment
        planned, replaces, repair_s = parts[draws.kind()]
        if planned:  # told in advance: the job saves where it stands, then stops
            ran = min(since, k * T) / T if saved < full else min(since, rest * T) / T
            done += saved * k + ran
            yield env.timeout(r.blocking_save_s + lag)
        else:
            if saved and since < lag:  # the last checkpoint's write had not reached storage
                saved -= 1
            done += saved * k
        yield from _restart(env, r, draws, parts, spares, tally, replaces, repair_s)


def _restart(env, r, draws: _Draws, parts, spares, tally, replaces: bool, repair_s: float):
    """Swap the failed node if need be, then restart; a failure during the restart starts it again."""
    while True:
        if replaces and spares is not None:
            env.process(_repair(env, spares, repair_s))  # the failed node leaves for repair ...
            yield spares.get(1)  # ... and a spare takes its place, or the job waits for the first repair
        gap = draws.gap()
        if gap >= r.restart_s:
            yield env.timeout(r.restart_s)
            return
        yield env.timeout(gap)
        tally["interruptions"] += 1
        _, replaces, repair_s = parts[draws.kind()]


def _repair(env: simpy.Environment, spares: simpy.Container, repair_s: float):
    yield env.timeout(repair_s)
    yield spares.put(1)


def simulate_run(r, k: int, hardware: tuple[tuple[float, bool, bool, float], ...], settings) -> SimulatedDays | None:
    """Play the run ``settings.runs`` times (by default as many as the event budget allows); None when one
    run alone would see more interruptions than the simulator plays (``limits.MAX_SIMULATED_INTERRUPTIONS``).
    A run expected to see more interruptions than the budget's fewest runs allow is played as chunks of
    whole segments and scaled (see the module's docstring)."""
    rate = r.unplanned_per_s + r.planned_per_s
    # the closed form's days where saves or failures stretch the run past a fifth over its compute
    expected = rate * max(r.iterations * r.iteration_time_s * 1.2, r.expected_s(k)) + 1
    if expected > limits.MAX_SIMULATED_INTERRUPTIONS / 10:
        return None
    # a node's repair is a process of its own: with spares an interruption costs about four times as much
    cost = 4 if settings.spare_nodes is not None else 1
    budget = _EVENT_BUDGET // cost
    chunks = 1.0
    if expected > budget / _MIN_RUNS:
        chunk = _CHUNK_INTERRUPTIONS // cost
        segments = max(1, math.floor(r.iterations / k * chunk / expected))
        played = r.model_copy(update=dict(iterations=min(r.iterations, segments * k)))
        chunks = r.iterations / played.iterations
        runs = min(settings.runs or _MIN_RUNS, max(1, limits.MAX_SIMULATED_INTERRUPTIONS // chunk))
    else:
        played = r
        runs = settings.runs or int(min(_MAX_RUNS, max(_MIN_RUNS, budget // expected)))
        runs = min(runs, max(1, int(limits.MAX_SIMULATED_INTERRUPTIONS // expected)))
    days, events = _play(played, k, hardware, settings, runs, rate)
    if chunks == 1.0:
        p10, p50, p90 = np.percentile(days, [10, 50, 90]).tolist()
        mean = float(np.mean(days))
    else:
        mean = float(np.mean(days)) * chunks
        spread = float(np.std(days, ddof=1)) * math.sqrt(chunks) if runs > 1 else 0.0
        p10, p50, p90 = (mean + NormalDist().inv_cdf(q) * spread for q in (0.1, 0.5, 0.9))
    return SimulatedDays(p10_days=p10, p50_days=p50, p90_days=p90, mean_days=mean, runs=runs,
                         interruptions_per_run=events / runs * chunks, chunks_per_run=chunks)


def _play(r, k: int, hardware, settings, runs: int, rate: float) -> tuple[list[float], int]:
    """The days of ``runs`` seeded runs of ``r`` and the interruptions they saw together."""
    shares = np.array([h[0] for h in hardware]) if hardware else np.ones(1)
    cumulative = np.cumsum(shares) / shares.sum()
    parts = [(planned, replaces, repair) for _, planned, replaces, repair in hardware] or [(False, False, 0.0)]
    days, events = [], 0
    for stream in np.random.SeedSequence(settings.seed).spawn(runs):
        env = simpy.Environment()
        draws = _Draws(np.random.default_rng(stream), rate, cumulative) if rate > 0 else None
        spares = (simpy.Container(env, init=settings.spare_nodes, capacity=max(1, settings.spare_nodes))
                  if settings.spare_nodes is not None else None)
        tally = {"interruptions": 0}
        env.process(_job(env, r, k, parts, draws, spares, tally))
        env.run()
        days.append(env.now / SECONDS_PER_DAY)
        events += tally["interruptions"]
    return days, events
