"""Megatron training logs as a cluster keeps them: the measured iteration time of a run a user already made.

Read from what Megatron-LM and Megatron-Bridge print (their ``training_log`` and ``_print_args``):

- the ``arguments`` block (``  name ..... value``, between ``--- arguments ---`` and ``--- end of arguments ---``),
  which Megatron-LM prints after ``validate_args``; Megatron-Bridge prints no such block, so its runs need the
  launch beside the log;
- the per-iteration lines (`` iteration  N/ M | consumed samples: .. | elapsed time per iteration (ms): .. |
  [throughput per GPU (TFLOP/s/GPU): .. |] learning rate: .. | global batch size: .. | ...``), each the mean
  over the ``--log-interval`` iterations before it;
- the timers' blocks after them (``(min, max) time across ranks (ms):`` or ``max time across ranks (ms):``,
  then ``    name .....: (min, max)``), printed where ``--timing-log-level`` reached them, per iteration;
- the lines that say an interval was not plain training: ``saving checkpoint at iteration``, ``successfully saved
  checkpoint from iteration``, an async save, ``validation loss at iteration``;
- ``> padded vocab (size: V) with ...`` (the tokenizer's vocabulary, which the arguments block leaves out) and the
  memory report ``(after N iterations) memory (MB) | ... | max allocated: ..``.

Which intervals count (the rule, stated once): an interval is dropped when it (1) reaches into the first
``warmup_iterations`` iterations after the run (re)started (CUDA and NCCL set-up, allocator growth, autotuning),
(2) holds a checkpoint save or an evaluation, or (3) ran at a global batch other than the run's last one
(a batch ramp-up). The measured time is the median of the intervals left, with their 10th and 90th percentiles as
its spread. A log is read line by line, so its size bounds neither memory nor the time per line.
"""

from __future__ import annotations

import math
import os
import re
import shlex
import stat
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from simulator.spec._io import check_name
from simulator.spec.errors import ConfigError

DEFAULT_WARMUP_ITERATIONS = 10
"""Iterations after a (re)start whose intervals are dropped: the first few iterations of a Megatron run carry
CUDA context and NCCL communicator set-up, the allocator's growth and kernel autotuning. Not pinned by a
measurement here; 10 covers the first logged interval at Megatron's default ``--log-interval 100`` only
partly, which is why any interval reaching into them is dropped whole."""

MAX_LINE_BYTES = 4 * 1024 * 1024
"""A longer line (a data-path list in the arguments, a stray binary dump) is not a line of the formats read."""

MAX_LOG_FILES = 10_000
"""Files one folder of logs may hand over: more is not a set of runs but the wrong folder."""

_ARGS_BEGIN = re.compile(r"-{3,} arguments -{3,}\s*$")
_ARGS_END = re.compile(r"-{3,} end of arguments -{3,}\s*$")
# Megatron pads the name with 48 - len(name) dots; a name of 48 characters or more has none
_ARG_LINE = re.compile(r"\s+([A-Za-z_][A-Za-z0-9_]*) (?:\.+ | )(.*?)\s*$")
_ITERATION = re.compile(r"iteration\s+(\d+)/\s*(\d+)\s*")
_TIMERS_HEAD = re.compile(r"(\(min, max\) time|max time) across ranks \(ms\):\s*$")
_TIMER_LINE = re.compile(r"\s+(\S+) \.*: (?:\(([\d.]+), ([\d.]+)\)|([\d.]+))\s*$")
_SAVE = re.compile(r"(?:(?:saving|saved) checkpoint (?:at|from) iteration|async checkpoint save at iteration)\s+(\d+)")
# Megatron-LM before its timers kept (min, max) per rank printed one line: "time (ms) | name: 12.34 | ..."
_OLD_TIMERS = re.compile(r"^\s*time \(ms\) \|")
_EVAL = re.compile(r"validation loss at iteration\s+(\d+)")
_VOCAB = re.compile(r"> padded vocab \(size: (\d+)\) with (\d+) dummy tokens \(new size: (\d+)\)")
_MEMORY = re.compile(r"\(after (\d+) iterations\) memory \(MB\).*?\| max allocated: ([\d.]+)")
_MEMORY_GB = re.compile(r"\(after (\d+) iterations\) memory \(GB\).*?\| mem-max-allocated-gigabytes: ([\d.]+)")
_BRIDGE_STEP = re.compile(r"Step Time : [\d.]+s GPU utilization:")
# what launchers put before each line: srun --label's "3: ", torchrun --tee's "[default3]:"
_PREFIX = re.compile(r"^(?:\[default\d+\]:|\d+: )")

_ELAPSED = "elapsed time per iteration (ms)"


@dataclass(slots=True)
class LoggedInterval:
    """One per-iteration line: the mean over the ``log_interval`` iterations that end at ``iteration``. A plain
    slotted record, not a pydantic model: a long run's log holds a million of them."""

    iteration: int
    line: int  # line number in the log, 1-based
    elapsed_per_iteration_s: float
    global_batch_size: int | None
    # the timers printed after the line: the slowest rank, ms per iteration (Megatron divides by --log-interval);
    # None until a timers block follows the line
    timers_max_ms: dict[str, float] | None = None


@dataclass
class MegatronLog:
    """One run's log as read, before any interval is dropped."""

    source: str
    # 'megatron-lm' (an arguments block), 'megatron-bridge' (Bridge's step line, no arguments block) or
    # 'megatron' (iteration lines only)
    flavour: str
    arguments: dict[str, str] | None  # the arguments block, name -> printed value
    intervals: list[LoggedInterval]
    saves: list[int] = field(default_factory=list)  # iterations at which a checkpoint was saved
    evaluations: list[int] = field(default_factory=list)
    # the positions in ``intervals`` of the first interval logged after each (re)start
    starts: list[int] = field(default_factory=list)
    tokenizer_vocab_size: int | None = None
    max_allocated_bytes: float | None = None  # the memory report's 'max allocated' (rank 0's)


class MeasuredTime(BaseModel):
    """The steady-state iteration time of a log, by the rule in the module docstring."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    iteration_time_s: float = Field(description="Median over the intervals kept.")
    p10_s: float
    p90_s: float
    intervals_kept: int
    iterations_kept: int
    dropped: dict[str, int] = Field(description="Intervals dropped, by reason.")
    global_batch_size: int | None
    timers_ms: dict[str, float] = Field(default_factory=dict,
                                        description="Median over the kept intervals of each timer (slowest rank).")

    @property
    def spread(self) -> float:
        """(p90 - p10) / median: how far the run itself moves."""
        return (self.p90_s - self.p10_s) / self.iteration_time_s


def _lines(path: Path):
    """(number, text) of each line, decoded leniently: a log holds what every library printed."""
    try:
        f = open(path, "rb")
    except OSError as exc:
        raise ConfigError(f"cannot read the training log {str(path)!r}: {exc.strerror}; check the path") from None
    with f:
        number = 0
        while True:
            raw = f.readline(MAX_LINE_BYTES)
            if not raw:
                return
            number += 1
            if len(raw) == MAX_LINE_BYTES and not raw.endswith(b"\n"):
                while raw and not raw.endswith(b"\n"):  # skip the rest of an over-long line
                    raw = f.readline(MAX_LINE_BYTES)
                continue
            yield number, raw.decode("utf-8", "replace").rstrip("\r\n")


def _field(text: str, name: str) -> str | None:
    """The value after ``name: `` up to the next ``|`` (a find, not a split: a log may hold a million lines)."""
    i = text.find(name)
    if i < 0:
        return None
    j = text.find("|", i)
    return text[i + len(name) + 1:j if j >= 0 else len(text)].strip()


def _number(text: str, name: str, kind, number: int, where: str):
    raw = _field(text, name)
    if raw is None:
        return None
    try:
        value = kind(raw)
    except ValueError:
        raise ConfigError(f"{where}: line {number} has {name} {raw!r}, not a number; the log is damaged there "
                          "(give the log as Megatron wrote it)") from None
    if not math.isfinite(value) or value < 0:
        raise ConfigError(f"{where}: line {number} has {name} {raw}; the log is damaged there")
    return value


def _interval(text: str, number: int, where: str) -> LoggedInterval:
    m = _ITERATION.search(text, 0, text.find("|"))
    if m is None:
        raise ConfigError(f"{where}: line {number} has Megatron's '{_ELAPSED}' but no 'iteration N/ M' before it; "
                          "the log is damaged there (give the log as Megatron wrote it)")
    elapsed_ms = _number(text, _ELAPSED, float, number, where)
    if elapsed_ms is None:
        raise ConfigError(f"{where}: line {number} has no value for '{_ELAPSED}'; the log is damaged there")
    return LoggedInterval(
        iteration=int(m.group(1)), line=number, elapsed_per_iteration_s=elapsed_ms / 1e3,
        global_batch_size=_number(text, "global batch size", int, number, where))


def _timers(item: LoggedInterval) -> dict[str, float]:
    if item.timers_max_ms is None:
        item.timers_max_ms = {}
    return item.timers_max_ms


def _check_file(path: Path, where: str) -> None:
    try:
        st = path.stat()
    except OSError as exc:
        raise ConfigError(f"cannot read the training log {where}: {exc.strerror}; check the path") from None
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(f"the training log {where} is not a regular file (a device, pipe or socket); "
                          "name the log file")


def read_log(path: str | os.PathLike) -> MegatronLog:
    """Read one run's log (see the module docstring); a log that is not one readable run is a ConfigError."""
    path = check_name(path, "training log")
    where = repr(str(path))
    _check_file(path, where)
    arguments: dict[str, str] | None = None
    in_args, args_line = False, 0
    intervals: list[LoggedInterval] = []
    saves, evaluations, starts = [], [], []
    pending_start = True
    vocab = None
    max_allocated = None
    bridge = False
    timers_open = False
    last_iteration = 0
    pending_args: dict[str, str] = {}
    for number, text in _lines(path):
        if text[:1] == "[" or text[:1].isdigit():
            text = _PREFIX.sub("", text, count=1)
        if in_args:
            if _ARGS_END.search(text):
                in_args = False
                if arguments is not None and _modelled(arguments) != _modelled(pending_args):
                    raise ConfigError(f"{where} holds two runs with different arguments (a second arguments block "
                                      f"at line {args_line} differs from the first); give one log per run")
                pending_start = True  # a relaunch prints its arguments again
                arguments = pending_args
                continue
            m = _ARG_LINE.match(text)
            if m is not None:
                pending_args[m.group(1)] = m.group(2)
            continue
        if _ELAPSED in text:
            timers_open = False
            item = _interval(text, number, where)
            iteration = item.iteration
            if pending_start or iteration < last_iteration:  # started, or resumed from an earlier checkpoint
                starts.append(len(intervals))
                pending_start = False
            last_iteration = iteration
            intervals.append(item)
            continue
        if _ARGS_BEGIN.search(text):
            in_args, args_line, pending_args = True, number, {}
            continue
        if _TIMERS_HEAD.search(text):
            timers_open = bool(intervals)  # the timers of the interval just logged
            continue
        if intervals and _OLD_TIMERS.match(text):
            for chunk in text.split("|")[1:]:
                name, colon, value = chunk.partition(":")
                try:
                    _timers(intervals[-1])[name.strip()] = float(value)
                except ValueError:
                    pass  # a timer line cut off: its timers are not the iteration's time
            continue
        if timers_open:
            m = _TIMER_LINE.match(text)
            if m is not None:
                name = m.group(1)
                value = float(m.group(3) if m.group(3) is not None else m.group(4))
                _timers(intervals[-1])[name] = value
                continue
            timers_open = False
        if "checkpoint" in text and (m := _SAVE.search(text)):
            saves.append(int(m.group(1)))
        elif "validation loss" in text and (m := _EVAL.search(text)):
            evaluations.append(int(m.group(1)))
        elif "padded vocab" in text and (m := _VOCAB.search(text)):
            vocab = int(m.group(1))
        elif "max allocated" in text and (m := _MEMORY.search(text)):
            max_allocated = float(m.group(2)) * 2**20  # Megatron-LM: torch's bytes / 2**20
        elif "mem-max-allocated" in text and (m := _MEMORY_GB.search(text)):
            max_allocated = float(m.group(2)) * 1e9  # Megatron-Bridge: bytes / 1e9
        elif "Step Time" in text and _BRIDGE_STEP.search(text):
            bridge = True
    if in_args:
        raise ConfigError(f"{where} is cut off inside its arguments block (begun at line {args_line}, never ended); "
                          "give the whole log")
    if not intervals:
        raise ConfigError(f"{where} has no iteration lines with '{_ELAPSED}' (is it a Megatron training log, and "
                          "did the run reach its first --log-interval?); give the log of a run that trained")
    flavour = "megatron-lm" if arguments is not None else ("megatron-bridge" if bridge else "megatron")
    return MegatronLog(source=str(path), flavour=flavour, arguments=arguments, intervals=intervals,
                       saves=sorted(set(saves)), evaluations=sorted(set(evaluations)),
                       starts=starts, tokenizer_vocab_size=vocab, max_allocated_bytes=max_allocated)


# the arguments that may differ between two launches of one run (a resume): paths, seeds, timing, ranks
_RUN_LOCAL = re.compile(r"(load|save|.*_path|.*dir|.*_file|rank|local_rank|seed|exit_.*|.*timeout.*|"
                        r"iteration|consumed_.*|.*wandb.*|.*tensorboard.*|train_iters|train_samples)")


def _modelled(arguments: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in arguments.items() if not _RUN_LOCAL.fullmatch(k)}


def log_interval_of(log: MegatronLog) -> int:
    """Iterations per logged line: the arguments' ``log_interval``, else the steps between lines."""
    if log.arguments is not None and log.arguments.get("log_interval", "").isdigit():
        return max(int(log.arguments["log_interval"]), 1)
    steps = [b.iteration - a.iteration for a, b in zip(log.intervals, log.intervals[1:])
             if b.iteration > a.iteration]
    return min(steps) if steps else 1


def measured_time(log: MegatronLog, warmup_iterations: int = DEFAULT_WARMUP_ITERATIONS) -> MeasuredTime:
    """The steady-state iteration time of ``log`` by the stated rule; a log with no interval left is refused."""
    if warmup_iterations < 0:
        raise ConfigError(f"--warmup-iterations {warmup_iterations} is negative; give 0 or more")
    interval = log_interval_of(log)
    final_batch = log.intervals[-1].global_batch_size
    busy = sorted(set(log.saves) | set(log.evaluations))
    dropped = {"warm-up": 0, "checkpoint save or evaluation": 0, "other global batch": 0}
    kept: list[LoggedInterval] = []
    start = 0
    for position, item in enumerate(log.intervals):
        if position in log.starts:  # the run (re)started an interval before the first iteration it logged
            start = item.iteration - interval
        first = max(item.iteration - interval + 1, start + 1)
        if first <= start + warmup_iterations:
            dropped["warm-up"] += 1
        elif any(first - 1 <= b <= item.iteration for b in busy):
            # a save or an evaluation at the interval's last iteration runs before the next interval starts; one
            # at the iteration before its first ran inside its timer in some versions: both are dropped
            dropped["checkpoint save or evaluation"] += 1
        elif item.global_batch_size != final_batch:
            dropped["other global batch"] += 1
        else:
            kept.append(item)
    if not kept:
        raise ConfigError(f"{log.source!r}: every one of its {len(log.intervals)} logged intervals is warm-up, a "
                          f"checkpoint save, an evaluation or another global batch "
                          f"({', '.join(f'{n} {k}' for k, n in dropped.items() if n)}); give a longer run's log or "
                          "a smaller --warmup-iterations")
    times = np.array([k.elapsed_per_iteration_s for k in kept])
    with_timers = [k.timers_max_ms for k in kept if k.timers_max_ms]
    names = sorted({n for t in with_timers for n in t})
    timers = {n: float(np.median([t[n] for t in with_timers if n in t])) for n in names}
    return MeasuredTime(
        iteration_time_s=float(np.median(times)), p10_s=float(np.percentile(times, 10)),
        p90_s=float(np.percentile(times, 90)), intervals_kept=len(kept), iterations_kept=len(kept) * interval,
        dropped={k: n for k, n in dropped.items() if n}, global_batch_size=final_batch, timers_ms=timers)


def log_files(paths: list[str]) -> list[Path]:
    """The logs named: files as given, and the ``*.log``, ``*.out``, ``*.txt`` files of a folder, sorted."""
    out: list[Path] = []
    for given in paths:
        path = check_name(given, "training log")
        if path.is_dir():
            found = sorted(p for p in path.iterdir() if p.suffix in (".log", ".out", ".txt") and p.is_file())
            if not found:
                raise ConfigError(f"the folder {given!r} holds no *.log, *.out or *.txt files; name the logs")
            out += found
        else:
            out.append(path)
        if len(out) > MAX_LOG_FILES:
            raise ConfigError(f"more than {MAX_LOG_FILES:,} logs given; name the runs' logs, not a whole file system")
    return out


# --- the arguments block as the launch that printed it ---------------------------------------------

# printed dests whose flag is not "--" + the dest with dashes, or that store the opposite of their flag:
# dest -> (flag when the value is True, flag when it is False)
_BOOL_DESTS = {
    "add_bias_linear": (None, "--disable-bias-linear"),
    "store_param_remainders": (None, "--no-store-param-remainders"),
    "overlap_p2p_comm": ("--overlap-p2p-communication", "--no-overlap-p2p-communication"),
    "use_custom_fsdp": ("--use-megatron-fsdp", None),
    "multi_latent_attention": ("--multi-latent-attention", None),
}
_VALUE_DESTS = {"fp8": "--fp8-format"}
# what the printed value holds that the flag does not: enums print with their class, dtypes as torch's
_DTYPES = {"torch.float32": "fp32", "torch.bfloat16": "bf16", "torch.float16": "fp16", "torch.uint8": "fp8"}
_NOT_READ = {"world_size", "rank", "local_rank", "padded_vocab_size"}


def _printed(value: str) -> str:
    value = value.strip()
    if value.startswith("[") and value.endswith("]") and "," not in value:  # a one-element nargs list
        value = value[1:-1].strip().strip("'\"")
    if "." in value and value.split(".", 1)[0] in ("AttnBackend", "AttnMaskType", "ModelType"):
        value = value.split(".", 1)[1]
    return _DTYPES.get(value, value)


def launch_of_arguments(arguments: dict[str, str], tokenizer_vocab_size: int | None = None) -> tuple[str, int | None]:
    """(the ``pretrain_gpt.py`` flags that print ``arguments``, the run's world size): the arguments block
    handed to the launch reader (``simulator.spec.megatron_args``), so that a log and a launch script of one run
    are read by one mapping. Values of None and false switches are left out; arguments the reader does not
    know are passed on, so that it lists them as not modelled (or refuses what it cannot express)."""
    from simulator.spec.megatron_args import FLAGS

    sharded = arguments.get("use_megatron_fsdp") == "True" or arguments.get("use_custom_fsdp") == "True"
    words: list[str] = []
    for dest, raw in arguments.items():
        value = _printed(raw)
        if dest in _NOT_READ or value in ("None", ""):
            continue
        if dest == "data_parallel_sharding_strategy" and not sharded:
            continue  # printed with its default even where Megatron-FSDP is off
        if dest == "vocab_size" and tokenizer_vocab_size is not None:
            continue
        if dest.startswith(("expert_", "moe_")) and arguments.get("num_experts", "None") == "None":
            continue  # validate_args fills the expert sizes in for dense models too
        if dest == "num_query_groups" and arguments.get("group_query_attention") != "True":
            continue  # printed as the head count where attention is not grouped
        if dest in _BOOL_DESTS:
            flag = _BOOL_DESTS[dest][0 if value == "True" else 1]
            if flag is not None and value in ("True", "False"):
                words.append(flag)
            continue
        flag = _VALUE_DESTS.get(dest, "--" + dest.replace("_", "-"))
        kind = FLAGS.get(flag, (None, None))[1]
        if value in ("True", "False"):
            if value == "True" and flag in FLAGS and kind is not False:
                words.append(flag)
            continue
        if flag in FLAGS and not (kind in (int, float, str) or isinstance(kind, tuple)):
            continue  # a switch printed with a value it does not take
        if flag in FLAGS:
            words += [flag, value]
    if tokenizer_vocab_size is not None:
        words += ["--vocab-size", str(tokenizer_vocab_size)]
    world = arguments.get("world_size", "")
    return "pretrain_gpt.py " + shlex.join(words), int(world) if world.isdigit() and int(world) > 0 else None


# --- writing the same format (the reference loop prints it, the tests build logs with it) -----------


def arguments_block(arguments: dict[str, object]) -> list[str]:
    """Megatron's ``_print_args("arguments", args)``: sorted, case-blind, each name dotted out to 48."""
    rows = ["  {} {} {}".format(name, "." * (48 - len(name)), value) for name, value in arguments.items()]
    return (["------------------------ arguments ------------------------"] + sorted(rows, key=lambda r: r.lower())
            + ["-------------------- end of arguments ---------------------"])


def iteration_line(iteration: int, train_iters: int, consumed_samples: int, elapsed_per_iteration_s: float,
                   learning_rate: float, global_batch_size: int, losses: dict[str, float], loss_scale: float = 1.0,
                   grad_norm: float | None = None, throughput_tflops_per_gpu: float | None = None,
                   timestamp: str | None = None, skipped: int = 0, nan: int = 0) -> str:
    """Megatron-LM's ``training_log`` line (a ``timestamp`` as ``%Y-%m-%d %H:%M:%S.%f`` where the version
    prints one; ``throughput_tflops_per_gpu`` where ``--log-throughput`` is on)."""
    line = f" [{timestamp}]" if timestamp is not None else ""
    line += " iteration {:8d}/{:8d} |".format(iteration, train_iters)
    line += " consumed samples: {:12d} |".format(consumed_samples)
    line += " elapsed time per iteration (ms): {:.1f} |".format(elapsed_per_iteration_s * 1000.0)
    if throughput_tflops_per_gpu is not None:
        line += f" throughput per GPU (TFLOP/s/GPU): {throughput_tflops_per_gpu:.1f} |"
    line += f" learning rate: {learning_rate:.6E} |"
    line += f" global batch size: {global_batch_size:5d} |"
    for name, value in losses.items():
        line += " {}: {:.6E} |".format(name, value)
    line += f" loss scale: {loss_scale:.1f} |"
    if grad_norm is not None:
        line += f" grad norm: {grad_norm:.3f} |"
    line += " number of skipped iterations: {:3d} |".format(skipped)
    line += " number of nan iterations: {:3d} |".format(nan)
    return line


def timers_block(timers_ms: dict[str, tuple[float, float]]) -> list[str]:
    """Megatron's ``Timers.log`` in its default (min, max) form, ms per iteration."""
    return ["(min, max) time across ranks (ms):"] + [
        "    {}: ({:.2f}, {:.2f})".format((name + " ").ljust(48, "."), low, high)
        for name, (low, high) in timers_ms.items()]
