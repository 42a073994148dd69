"""The flags of failures and checkpoints that `plan` and `search` share, and how `plan` prints their answer."""

from __future__ import annotations

from typing import Any, Callable

import click

from simulator.cli.options import BoundedFloat, BoundedInt
from simulator.spec import limits

_GBPS = BoundedFloat(limits.GBPS_RANGE["ge"], limits.GBPS_RANGE["le"], closed=True)

_OPTIONS: tuple[tuple[tuple[str, ...], dict[str, Any]], ...] = (
    (("--mtbf-gpu-hours", "mtbf_gpu_hours"),
     dict(type=BoundedFloat(0, limits.MAX_MTBF_GPU_HOURS), default=None, metavar="HOURS",
          help="One GPU's mean time between unplanned interruptions, GPU-hours (the cluster's data: about 50,700, "
               "from Llama 3's 419 in 54 days on 16,384 H100); the mix of causes is kept.")),
    (("--storage-write-gbps-per-node", "write_gbps_per_node"),
     dict(type=_GBPS, default=None, metavar="GB/S", help="Checkpoint write bandwidth of one node, GB/s.")),
    (("--storage-write-gbps", "write_gbps"),
     dict(type=_GBPS, default=None, metavar="GB/S", help="Checkpoint write bandwidth of the whole file system, GB/s.")),
    (("--async-save", "async_save"),
     dict(is_flag=True, default=False, help="Megatron's asynchronous save: training waits only for the copy to "
                                            "host memory.")),
    (("--save-interval", "save_interval"),
     dict(type=BoundedInt(1, limits.MAX_SAVE_INTERVAL), default=None, metavar="ITERATIONS",
          help="Iterations between checkpoints. Default: the interval that maximises useful time.")),
    (("--spare-nodes", "spare_nodes"),
     dict(type=BoundedInt(0, limits.MAX_SPARE_NODES), default=None,
          help="Hot spare nodes: a failed node waits for repair when none is free (simulation only). Default: the "
               "pool always has a replacement.")),
    (("--failure-seed", "failure_seed"),
     dict(type=BoundedInt(0, limits.MAX_SEED), default=0, show_default=True,
          help="Seed of the simulated runs (the same seed gives the same percentiles).")),
)

GOODPUT_OPTION_NAMES = frozenset(decls[-1] for decls, _ in _OPTIONS)


def goodput_options(func: Callable[..., Any]) -> Callable[..., Any]:
    for decls, kwargs in reversed(_OPTIONS):
        func = click.option(*decls, **kwargs)(func)
    return func


def goodput_settings(kwargs: dict[str, Any], launch: dict[str, Any] | None = None, notes: list[str] | None = None):
    """The ``GoodputSettings`` of the flags (popped from ``kwargs``), over the ``--save-interval`` and
    ``--async-save`` a launch script gives (``launch``): a flag on the command line wins, and ``notes`` says
    which was read."""
    from simulator.estimator.goodput import GoodputSettings

    o = {name: kwargs.pop(name, None) for name in GOODPUT_OPTION_NAMES}
    seed = o.pop("failure_seed") or 0
    launch, notes = launch or {}, notes if notes is not None else []
    interval = launch.get("save_interval")
    if interval is not None and o["save_interval"] is None:
        o["save_interval"] = interval
        notes.append(f"checkpoints every {interval:,} iterations, the launch's --save-interval")
    elif interval is not None and o["save_interval"] != interval:
        notes.append(f"--save-interval {o['save_interval']:,} from the command line, not the launch's {interval:,}")
    if launch.get("async_save"):
        notes.append("asynchronous saves, the launch's --async-save")
        o["async_save"] = True
    return GoodputSettings(**{k: v for k, v in o.items() if v is not None}, seed=seed)


def optimal_beside(job, est, settings, given) -> Any:
    """The expected days at the interval that maximises useful time, beside ``given`` (the days at the interval
    the user chose); None when the user chose none, or no interval gives an answer."""
    from simulator.estimator.goodput import EndlessRunError, goodput

    if given is None or settings.save_interval is None:
        return None
    try:
        return goodput(job, est, settings.model_copy(update={"save_interval": None}), simulate=False)
    except EndlessRunError:
        return None


def render_goodput(g, optimal=None) -> list[str]:
    """`plan`'s lines on days with failures, checkpoints and restarts (and the best interval's days, ``optimal``,
    beside an interval the user chose)."""
    c = g.checkpoint
    lines = ["", f"ideal            {g.ideal_days:9.1f} days (no failure, no checkpoint)",
             f"expected         {g.expected_days:9.1f} days with failures, saves and restarts   "
             f"(band {g.expected_days_low:.1f} .. " + (f"{g.expected_days_high:.1f} days)" if g.expected_days_high
                                                        else "never finishing, at the ends of the declared ranges)")]
    if g.p90_days is not None:
        lines.append(f"  simulated      P10 {g.p10_days:.1f}, P50 {g.p50_days:.1f}, P90 {g.p90_days:.1f} days "
                     f"({g.simulated_runs} runs, seed {g.seed}"
                     + (f"; {g.spare_nodes} spare nodes, a failed node back after its repair, where the closed "
                        "form has a replacement at hand" if g.spare_nodes is not None else "") + ")")
    elif g.note:
        lines.append(f"  note: {g.note}")
    mtbf = f"one every {g.job_mtbf_hours:.2f} h" if g.job_mtbf_hours else "none unplanned"
    lines += [
        f"ETTR             {g.ettr * 100:8.1f} %   ({g.interruptions_per_day:.2f} interruptions/day, {mtbf})",
        f"checkpoint       every {g.save_interval:,} iterations ({g.save_interval_s / 60:.1f} min"
        + (", the interval that maximises useful time" if g.save_interval_optimal else ", as given") + "), "
        f"{c.save_bytes / 1e12:.3g} TB, {c.save_bytes_per_rank / 1e9:.3g} GB per rank",
        *([f"  optimal would be {optimal.save_interval:,} iterations, {optimal.expected_days:.1f} days"]
          if optimal is not None and optimal.save_interval != g.save_interval else []),
        f"  save           {c.blocking_s:9.1f} s blocking"
        + (f" + {c.durable_lag_s:.1f} s written behind (async)" if g.async_save else "")
        + f"   ({g.checkpoint_overhead * 100:.1f} % of compute); load {c.load_s:.1f} s, restart {g.restart_s:.0f} s",
        f"where time goes  compute {g.split.compute_days:.1f}, checkpoints {g.split.checkpoint_days:.1f}, "
        f"lost work {g.split.lost_work_days:.1f}, restarts {g.split.restart_days:.1f} days",
    ]
    return lines
