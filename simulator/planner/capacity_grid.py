"""Where a capacity question looks, and in what order: the GPU counts of each cluster, and the walk over them.

The counts are whole nodes: powers of two of nodes between the ends of the range (the ends included). By default
the range starts at the memory floor (no plan of the job holds less than ``BYTES_PER_PARAMETER`` bytes per
parameter across its GPUs) and spans ``DEFAULT_SPAN`` times it. With a goal (a deadline or a budget) the walk
searches only where the answer can lie: a binary search over the counts for the boundary the goal draws (the
first count that meets the deadline, the first that costs more than the budget), then bisection of the nodes
between the two counts on either side of it. Without a goal, or asked to, it searches every count.

A walk is a generator: it yields the counts it wants searched next and is sent their options, so the walks of
several clusters advance together on one pool of processes (or on Ray), each point searched once.
"""

from __future__ import annotations

import math
import os
from contextlib import contextmanager
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from typing import Any, Callable, Generator, Iterator

from simulator.spec import limits
from simulator.spec.errors import ConfigError
from simulator.spec.hardware import ClusterSpec
from simulator.spec.model import ModelSpec

# bf16 weights and gradients, and the fp32 master weights and Adam's two moments, each held once across the job:
# sharding spreads them over the GPUs, never below this
BYTES_PER_PARAMETER = 16
DEFAULT_SPAN = 128  # the default range: from the memory floor to this many times it

Walk = Generator[tuple[int, ...], dict[int, Any], None]


def memory_floor_nodes(model: ModelSpec, cluster: ClusterSpec) -> int:
    """The fewest nodes, a power of two, whose GPUs' memory holds the model's weights, gradients and optimizer
    state once."""
    gpus = math.ceil(BYTES_PER_PARAMETER * model.num_parameters() / cluster.gpu.memory_bytes)
    nodes = max(1, math.ceil(gpus / cluster.gpus_per_node))
    return 1 << (nodes - 1).bit_length()


def cluster_counts(model: ModelSpec, cluster: ClusterSpec, gpus_min: int | None = None, gpus_max: int | None = None,
                   gpus: tuple[int, ...] | None = None) -> tuple[int, ...]:
    """The GPU counts searched on ``cluster``: ``gpus`` as given (whole nodes each), or the powers of two of nodes
    in [gpus_min, gpus_max] and its ends (see the module's docstring for the defaults)."""
    n = cluster.gpus_per_node
    if gpus is not None:
        bad = next((g for g in gpus if g % n), None)
        if bad is not None:
            raise ConfigError(f"--gpus {bad:,} is not whole nodes of {cluster.name} ({n} GPUs per node); give "
                              f"multiples of {n}")
        return tuple(sorted(set(gpus)))
    top = limits.MAX_GPUS // n
    low = -(-gpus_min // n) if gpus_min is not None else None
    high = gpus_max // n if gpus_max is not None else None
    if low is not None and high is not None and low > high:
        raise ConfigError(f"the GPU range {gpus_min:,}-{gpus_max:,} holds no whole node of {cluster.name} ({n} GPUs "
                          f"per node); widen it to span a multiple of {n}")
    floor = memory_floor_nodes(model, cluster)
    if low is None:
        low = min(floor, high) if high is not None else floor
    if high is None:
        high = max(low, floor) * DEFAULT_SPAN
    low, high = min(low, top), min(high, top)
    nodes = sorted({low, high} | {1 << i for i in range(high.bit_length()) if low < 1 << i < high})
    return tuple(k * n for k in nodes)


def boundary_walk(counts: tuple[int, ...], past: Callable[[Any], bool] | None, every: bool) -> Walk:
    """Yield the counts to search, receiving their options. ``past``: whether an option lies at or beyond the
    boundary the goal draws, which the walk takes to hold from some count on (None: no goal, every count);
    ``every``: search every count, not a binary search for the first count past the boundary."""
    if every or past is None:
        yield counts
        return
    lo, hi = 0, len(counts)
    while lo < hi:  # the first count past the boundary, len(counts) where none is
        mid = (lo + hi) // 2
        seen = yield (counts[mid],)
        if past(seen[counts[mid]]):
            hi = mid
        else:
            lo = mid + 1


def bracket(options: dict[int, Any], past: Callable[[Any], bool]) -> tuple[int, int] | None:
    """The counts either side of the boundary among those searched: the last one short of it and the first one
    past it; None where all searched lie on one side."""
    counts = sorted(options)
    first = next((i for i, c in enumerate(counts) if past(options[c])), len(counts))
    return None if first in (0, len(counts)) else (counts[first - 1], counts[first])


def bisection_walk(a: int, b: int, gpus_per_node: int, past: Callable[[Any], bool], steps: int) -> Walk:
    """Bisect the whole nodes between ``a`` (short of the boundary) and ``b`` (past it), ``steps`` times at most."""
    a, b = a // gpus_per_node, b // gpus_per_node
    for _ in range(steps):
        mid = (a + b) // 2
        if mid in (a, b):
            return
        seen = yield (mid * gpus_per_node,)
        if past(seen[mid * gpus_per_node]):
            b = mid
        else:
            a = mid


# --- running the walks --------------------------------------------------------------------------------------


class _Inline:
    """Each point searched in this process, when it is waited for."""

    def __init__(self, fn: Callable[[Any], Any]):
        self.fn, self.queue = fn, []

    def submit(self, key: Any, task: Any) -> None:
        self.queue.append((key, task))

    def next_done(self) -> tuple[Any, Any]:
        key, task = self.queue.pop(0)
        return key, self.fn(task)

    def close(self) -> None:
        pass


class _Pool(_Inline):
    """Local processes, each a lane of its own that the points of the same walks go to (so a cluster's searches
    share one process's caches of its cost model and layer graphs); they end with the question even when it is
    killed, as `sweep`'s do."""

    def __init__(self, fn: Callable[[Any], Any], workers: int, lanes: dict[str, int]):
        import multiprocessing

        from simulator.planner.sweep import _die_with_parent

        context = multiprocessing.get_context()
        self.fn, self.pending, self.lanes = fn, {}, lanes
        self.pools = [ProcessPoolExecutor(max_workers=1, mp_context=context, initializer=_die_with_parent,
                                          initargs=(os.getpid(), context.get_start_method() != "forkserver"))
                      for _ in range(workers)]

    def submit(self, key: Any, task: Any) -> None:
        pool = self.pools[self.lanes[key[0]] % len(self.pools)]
        self.pending[pool.submit(self.fn, task)] = key

    def next_done(self) -> tuple[Any, Any]:
        done, _ = wait(list(self.pending), return_when=FIRST_COMPLETED)
        future = min(done, key=lambda f: str(self.pending[f]))  # of several, the same one on every run
        return self.pending.pop(future), future.result()

    def close(self) -> None:
        for pool in self.pools:
            pool.shutdown(cancel_futures=True)


class _Ray(_Inline):
    def __init__(self, fn: Callable[[Any], Any], address: str, workers: int):
        try:
            import ray
        except ImportError:
            raise ConfigError("--ray-address needs Ray; install the ray extra (pip install 'megatron-perf-simulator"
                              "[ray]') or drop --ray-address to run on local processes") from None
        from simulator.planner.sweep import connect_ray

        self.ray, self.started, self.pending = ray, not ray.is_initialized(), {}
        if self.started:
            connect_ray(ray, address, workers)
        self.remote = ray.remote(fn)

    def submit(self, key: Any, task: Any) -> None:
        self.pending[self.remote.remote(task)] = key

    def next_done(self) -> tuple[Any, Any]:
        done, _ = self.ray.wait(list(self.pending), num_returns=1)
        return self.pending.pop(done[0]), self.ray.get(done[0])

    def close(self) -> None:
        if self.started:
            self.ray.shutdown()


@contextmanager
def runner(fn: Callable[[Any], Any], lanes: list[str], workers: int = 1,
           ray_address: str | None = None) -> Iterator[_Inline]:
    """Where the points are searched, with ``fn``: in this process (``workers`` 1), on local processes (one lane
    each for the walks ``lanes`` names, so a walk's points share one process however many phases ask for them),
    or on Ray."""
    if ray_address is not None and not ray_address.strip():
        raise ConfigError("--ray-address is empty; give local, HOST:PORT or ray://HOST:PORT, or drop it to run on "
                          "local processes")
    if ray_address is not None:
        run = _Ray(fn, ray_address, workers)
    elif workers > 1 and len(lanes) > 1:
        run = _Pool(fn, min(workers, len(lanes)), {name: i for i, name in enumerate(lanes)})
    else:
        run = _Inline(fn)
    try:
        yield run
    finally:
        run.close()


def run_walks(walks: dict[str, Walk], task_of: Callable[[str, int], Any], run: _Inline,
              progress: Callable[[int, int], None] | None = None) -> Iterator[tuple[str, int, Any]]:
    """Advance every walk until each ends, searching the points they ask for (``task_of(walk, count)``) on
    ``run``; yield (walk, count, result) as each point's search ends."""
    waiting: dict[str, set[int]] = {}
    got: dict[str, dict[int, Any]] = {}
    done = 0

    def ask(name: str, step: tuple[int, ...] | None) -> None:
        if step is None:
            return
        waiting[name], got[name] = set(step), {}
        for count in step:
            run.submit((name, count), task_of(name, count))

    for name, w in walks.items():
        ask(name, next(w, None))
    while any(waiting.values()):
        (name, count), result = run.next_done()
        done += 1
        if progress is not None:
            progress(done, done + sum(len(s) for s in waiting.values()) - 1)
        yield name, count, result
        waiting[name].discard(count)
        got[name][count] = result
        if not waiting[name]:
            try:
                ask(name, walks[name].send(got[name]))
            except StopIteration:
                pass
