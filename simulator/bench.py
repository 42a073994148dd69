"""Speed benchmarks: `python -m simulator.bench [evaluation|engine|search|sweep|goodput|capacity|log|all]` (another name
is refused in one sentence, exit code 2).

Speed is a feature of a planner (a search evaluates thousands of plans), so it is measured here,
not asserted in a timed test. Each figure is the median of several runs on this machine.
"""

from __future__ import annotations

import statistics
import sys
import time

from simulator.schedule.engine import simulate
from simulator.schedule.schedules import build_schedule
from simulator.schedule.stage_work import build_work
from simulator.schedule.timing import cost_model_for, extra_times, layer_times
from simulator.spec.catalog import load_model
from simulator.spec.hardware import load_cluster
from simulator.spec.plan import Job, ParallelPlan, RecomputePolicy


def _median_s(fn, repeats: int = 5) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def gpt3_job(pp: int = 16, vpp: int = 2, gbs: int = 1536, gpus: int = 1024) -> Job:
    plan = ParallelPlan(
        tensor_parallel_size=8, pipeline_parallel_size=pp, data_parallel_size=gpus // (8 * pp),
        virtual_pipeline_stages=vpp, sequence_parallel=True, micro_batch_size=1, global_batch_size=gbs,
        recompute=RecomputePolicy(granularity="selective"),
    )
    return Job(model=load_model("gpt3-175b"), cluster=load_cluster("dgx-a100-80gb"), plan=plan)


def clear_caches() -> None:
    """Forget every memoised graph, cost model, route and schedule: the next evaluation starts cold."""
    import functools

    from simulator.spec.value_cache import ValueCache

    # every loaded module of the package, wherever it lives: a list of names goes stale when modules move
    for name, module in list(sys.modules.items()):
        if module is None or not (name == "simulator" or name.startswith("simulator.")):
            continue
        for value in list(vars(module).values()):
            if isinstance(value, (functools._lru_cache_wrapper, ValueCache)):
                value.cache_clear()


def bench_evaluation() -> None:
    """One estimate (work built from the layer graph, then the schedule played) warm and cold, by engine path."""
    from simulator.estimator.prediction import estimate
    from simulator.schedule import fast_engine

    job = gpt3_job()
    m = job.plan.num_micro_batches
    print(f"evaluation: GPT-3 175B, 1,024 A100, TP 8 PP 16 DP 8, v=2, {m} micro-batches per pipeline")
    paths = [("python", False)] + ([("numba", True)] if fast_engine.use_compiled(True) else [])
    for label, compiled in paths:
        fast_engine.use_compiled(compiled)
        estimate(job)
        warm = _median_s(lambda: estimate(job), 9)

        def cold():
            clear_caches()
            estimate(job)

        print(f"  {label:6s}: {warm * 1e3:7.2f} ms warm, {_median_s(cold, 5) * 1e3:7.1f} ms cold")
    fast_engine.use_compiled(False)
    print("  cold by job size (same TP/PP, DP grows; global batch 1.5 x GPUs):")
    for gpus in (1024, 16384, 262144, 1048576):
        j = gpt3_job(gpus=gpus, gbs=1536 * gpus // 1024)

        def cold_at(j=j):
            clear_caches()
            estimate(j)

        print(f"    {gpus:9,d} GPUs: {_median_s(cold_at, 3) * 1e3:7.1f} ms")
    for gpus in (100_000, 1_000_000):  # TP 1: a stage is not whole nodes, nor its tied-embedding all-reduce's stride
        plan = ParallelPlan(tensor_parallel_size=1, pipeline_parallel_size=32, data_parallel_size=gpus // 32,
                            micro_batch_size=1, global_batch_size=gpus)
        j = Job(model=load_model("gpt3-2.7b"), cluster=job.cluster, plan=plan)
        print(f"    {gpus:9,d} GPUs, GPT-3 2.7B TP 1 PP 32: "
              f"{_median_s(lambda j=j: (clear_caches(), estimate(j)), 3) * 1e3:7.1f} ms")


def bench_engine() -> None:
    job = gpt3_job()
    cost = cost_model_for(job, None)
    work = build_work(job, cost, layer_times(job, cost=cost), extra_times(job, cost))
    p, m, v = job.plan.pipeline_parallel_size, job.plan.num_micro_batches, job.plan.virtual_pipeline_stages
    schedule = build_schedule(p, m, v)
    t = _median_s(lambda: simulate(schedule, work))
    print(f"engine: GPT-3 175B, 1,024 A100, TP 8 PP {p} DP {job.plan.data_parallel_size}, interleaved v={v}, "
          f"{m} micro-batches per pipeline: {t * 1e3:.1f} ms per simulated iteration (median of 5)")
    print("  growth with micro-batches (p=16, v=2):")
    for gbs in (384, 768, 1536, 3072):
        j = gpt3_job(gbs=gbs)
        w = build_work(j, cost, layer_times(j, cost=cost), extra_times(j, cost))
        s = build_schedule(16, j.plan.num_micro_batches, 2)
        print(f"    m={j.plan.num_micro_batches:5d}: {_median_s(lambda: simulate(s, w), 3) * 1e3:7.1f} ms")
    print("  growth with stages (m=192, v=1):")
    for pp in (4, 8, 16, 32):
        j = gpt3_job(pp=pp, vpp=1, gpus=8 * pp * 8)
        w = build_work(j, cost, layer_times(j, cost=cost), extra_times(j, cost))
        s = build_schedule(pp, j.plan.num_micro_batches, 1)
        print(f"    p={pp:3d}: {_median_s(lambda: simulate(s, w), 3) * 1e3:7.1f} ms")


def bench_search() -> None:
    """The search of dense models (GPT-3 175B on 1,024 A100, Llama 3 405B on 16,384 H100) and of
    mixtures of experts, whose space EP and ETP multiply; each cold, the first search of its model."""
    from simulator.spec.catalog import PRESETS
    from simulator.spec.hardware import load_cluster

    job = gpt3_job()
    result = _search("GPT-3 175B on 1,024 A100-80GB, global batch 1,536", job.model, job.cluster, 1024, 1536)
    best = result.best
    print(f"  best: {best.estimate.iteration_time_s:.2f} s/iteration, MFU {best.estimate.mfu * 100:.1f} %")
    h100 = load_cluster("dgx-h100")
    _search("Llama 3 405B on 16,384 H100, global batch 2,048, sequence 8,192", PRESETS["llama3-405b"], h100,
            16384, 2048)
    for name, gpus, batch in (("mixtral-8x7b", 64, 1024), ("mixtral-8x7b", 256, 1024),
                              ("deepseek-v3-style", 2048, 4096)):
        _search(f"{name} on {gpus:,} H100, global batch {batch:,}", PRESETS[name], h100, gpus, batch)


def _search(label: str, model, cluster, gpus: int, batch: int):
    """One search, timed, with its tiers' counts and how many plans it went through per second."""
    from simulator.planner.plan_search import SearchRequest, search

    req = SearchRequest(model=model, cluster=cluster, num_gpus=gpus, global_batch_size=batch)
    t0 = time.perf_counter()
    result = search(req)
    elapsed = time.perf_counter() - t0
    print(f"search: {label}: {result.enumerated:,} candidates enumerated, {result.pruned_memory:,} pruned by memory, "
          f"{len(result.screened):,} screened in closed form, {result.simulated} simulated; {elapsed:.2f} s wall "
          f"({result.enumerated / elapsed:,.0f} plans/s enumerated, {len(result.screened) / elapsed:,.0f} plans/s "
          "screened)")
    return result


def bench_sweep() -> None:
    """A 50-point sweep on local processes and on a local Ray cluster: wall time and whether the rows agree."""
    import tempfile
    from pathlib import Path

    from simulator.planner.sweep import SweepSpec, run_sweep

    spec = SweepSpec(models=("gpt3-125m", "gpt3-350m", "gpt3-760m", "gpt3-1.3b", "gpt3-2.7b"),
                     gpus=(8, 16, 32, 64, 128), global_batch_sizes=(128, 256), tokens=1e10)
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        local = run_sweep(spec, Path(tmp) / "local")
        t_local = time.perf_counter() - t0
        line = f"sweep: {len(local)} points on local processes in {t_local:.1f} s"
        try:
            import ray  # noqa: F401
        except ImportError:
            print(line + "; Ray not installed")
            return
        t0 = time.perf_counter()
        on_ray = run_sweep(spec, Path(tmp) / "ray", ray_address="local")
        print(line + f", on local Ray in {time.perf_counter() - t0:.1f} s; rows equal: {on_ray == local}")


def bench_goodput() -> None:
    """The simulation of a whole run with failures: 90 days of compute on 100,000 H100, every interruption played."""
    from simulator.estimator.goodput import GoodputSettings, Renewal, component_mix
    from simulator.estimator.goodput_sim import simulate_run

    cluster = load_cluster("dgx-h100")
    data, gpus, iteration_s = cluster.reliability, 100_000, 5.0
    r = Renewal(iteration_time_s=iteration_s, iterations=90 * 86400 / iteration_s,
                unplanned_per_s=data.rate_per_gpu_hour() * gpus / 3600,
                planned_per_s=data.rate_per_gpu_hour(planned=True) * gpus / 3600,
                blocking_save_s=10.0, durable_lag_s=0.0, restart_s=400.0)
    k = r.best_interval()
    for label, settings in (("default runs", GoodputSettings()), ("hot spares, 64 nodes", GoodputSettings(spare_nodes=64))):
        t0 = time.perf_counter()
        sim = simulate_run(r, k, component_mix(data), settings)
        elapsed = time.perf_counter() - t0
        print(f"goodput: 90 days on {gpus:,} H100, {label}: {sim.runs} runs of {sim.interruptions_per_run:,.0f} "
              f"interruptions in {elapsed:.2f} s ({elapsed / sim.runs * 1e3:.0f} ms per run); P10 / P50 / P90 "
              f"{sim.p10_days:.1f} / {sim.p50_days:.1f} / {sim.p90_days:.1f} days, closed form "
              f"{r.expected_s(k) / 86400:.1f}")


def bench_capacity() -> None:
    """A capacity question as a user asks it: GPT-3 175B on 300B tokens by 30 days at P90, on A100, H100 or H200
    (`simulator capacity --model gpt3-175b --tokens 300e9 --gbs 1536 --clusters dgx-a100-80gb,dgx-h100,dgx-h200
    --deadline-days 30`), on local processes as the command runs it; wall and CPU seconds, cold."""
    import os

    from simulator.planner import plan_search  # noqa: F401 - imported before the workers fork, as the command does
    from simulator.planner.capacity import CapacityRequest, plan_capacity
    from simulator.spec.economics import economics_for, load_economics

    clusters = tuple(load_cluster(c) for c in ("dgx-a100-80gb", "dgx-h100", "dgx-h200"))
    data = load_economics()
    req = CapacityRequest(model=load_model("gpt3-175b"), clusters=clusters,
                          economics=tuple(economics_for(c, data) for c in clusters), tokens=300e9,
                          global_batch_size=1536, deadline_days=30)
    workers = min(len(clusters), 2 * (os.cpu_count() or 1))
    clear_caches()
    t0, cpu0 = time.perf_counter(), os.times()
    result = plan_capacity(req, workers=workers)
    elapsed, cpu1 = time.perf_counter() - t0, os.times()
    cpu = (cpu1.user + cpu1.system + cpu1.children_user + cpu1.children_system
           - cpu0.user - cpu0.system - cpu0.children_user - cpu0.children_system)
    a = result.answer
    what = (f"{a.gpus:,} GPUs of {a.cluster}, {a.days:.1f} days at P90, ${a.cost_usd.value:,.0f}" if a is not None
            else f"no answer ({result.binding})")
    print(f"capacity: GPT-3 175B, 300B tokens, 30 days at P90 on 3 cluster kinds: {result.searches} searches on "
          f"{workers} processes in {elapsed:.1f} s wall ({cpu:.1f} s CPU, {os.cpu_count()} cores); answer {what}")


LOG_LINES = 1_000_000


def bench_log() -> None:
    """Reading a long run's Megatron-LM log: one iteration line per iteration (``--log-interval 1``), as
    ``validate`` and ``calibrate --from-runs`` read it, and its steady-state statistic."""
    import tempfile
    from pathlib import Path

    from simulator.measure.megatron_log import arguments_block, iteration_line, measured_time, read_log

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "train.log"
        arguments = {"tensor_model_parallel_size": 8, "pipeline_model_parallel_size": 4, "data_parallel_size": 16,
                     "micro_batch_size": 1, "global_batch_size": 512, "log_interval": 1, "train_iters": LOG_LINES}
        with open(path, "w", encoding="utf-8") as f:
            f.write("\n".join(arguments_block(arguments)) + "\n")
            for it in range(1, LOG_LINES + 1):
                f.write(iteration_line(it, LOG_LINES, it * 512, 1.85 + 0.01 * (it % 7), 1.5e-4, 512,
                                       {"lm loss": 2.0}) + "\n")
        size_mb = path.stat().st_size / 1e6

        def read() -> None:
            measured_time(read_log(path))

        t = _median_s(read, repeats=3)
    print(f"log: {LOG_LINES:,} iteration lines ({size_mb:.0f} MB) read and reduced to a steady-state time in "
          f"{t:.2f} s")


BENCHES = ("evaluation", "engine", "search", "sweep", "goodput", "capacity", "log", "all")


def main(argv: list[str]) -> None:
    from simulator.spec.errors import ConfigError

    what = argv[0] if argv else "all"
    if what not in BENCHES or len(argv) > 1:
        raise ConfigError(f"python -m simulator.bench takes one of {', '.join(BENCHES)}, not {' '.join(argv)!r}; "
                          "give one of those (or nothing, for all)")
    if what in ("evaluation", "all"):
        bench_evaluation()
    if what in ("engine", "all"):
        bench_engine()
    if what in ("search", "all"):
        bench_search()
    if what in ("sweep", "all"):
        bench_sweep()
    if what in ("goodput", "all"):
        bench_goodput()
    if what in ("capacity", "all"):
        bench_capacity()
    if what in ("log", "all"):
        bench_log()


def run(argv: list[str]) -> int:
    """``main`` with the command line's contract: bad input (a Ray cluster it cannot join, ...) is one sentence on
    stderr and exit code 2, never a traceback."""
    from simulator.spec.errors import SimulatorError

    try:
        main(argv)
    except SimulatorError as exc:
        print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
        return exc.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
