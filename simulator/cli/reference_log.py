"""A reference run written as Megatron-LM's training log: the arguments block of the launch the plan exports,
an iteration line per iteration and the timers after each, so that ``validate`` and ``calibrate --from-runs``
read a run of this machine exactly as they read a cluster's."""

from __future__ import annotations

import shlex

from simulator.measure.megatron_log import arguments_block, iteration_line, timers_block
from simulator.measure.run_record import RunRecord
from simulator.spec.plan import Job

# flags whose Megatron dest is not the flag's name, or which store the opposite of their name
_DESTS = {"--disable-bias-linear": ("add_bias_linear", False),
          "--no-store-param-remainders": ("store_param_remainders", False),
          "--no-overlap-p2p-communication": ("overlap_p2p_comm", False),
          "--overlap-p2p-communication": ("overlap_p2p_comm", True),
          "--recompute-activations": ("recompute_granularity", "selective"),
          "--fp8-format": ("fp8", None)}


def launch_arguments(job: Job) -> dict[str, object]:
    """The values Megatron's ``_print_args`` prints for the launch ``simulator plan --launch`` exports."""
    from simulator.outputs.export import megatron_args

    arguments: dict[str, object] = {}
    for entry in megatron_args(job):
        flag, *values = shlex.split(entry)
        dest, fixed = _DESTS.get(flag, (flag[2:].replace("-", "_"), None))
        if values:
            arguments[dest] = values[0] if len(values) == 1 else values
        else:
            arguments[dest] = True if fixed is None else fixed
    return arguments


def megatron_log_lines(job: Job, record: RunRecord, learning_rate: float = 1e-3) -> list[str]:
    """The run as Megatron-LM logs it with ``--log-interval 1 --timing-log-level 1``."""
    n = len(record.iteration_times_s)
    arguments = {**launch_arguments(job), "world_size": record.world_size, "rank": 0, "log_interval": 1,
                 "train_iters": n, "timing_log_level": 1}
    lines = arguments_block(arguments)
    gbs = job.plan.global_batch_size
    for i, elapsed in enumerate(record.iteration_times_s):
        lines.append(iteration_line(i + 1, n, (i + 1) * gbs, elapsed, learning_rate, gbs,
                                    {"lm loss": record.losses[i]}))
        timers = {name: (min(per_rank[i]) * 1e3, max(per_rank[i]) * 1e3)
                  for name, per_rank in (record.timers or {}).items()
                  if name != "iteration" and i < len(per_rank) and max(per_rank[i]) > 0}
        if timers:
            lines += timers_block(timers)
    return lines
