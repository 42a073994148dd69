"""The measured data sets in the repository, each declared once: where it comes from, what of the
model was set from it, and the job behind each of its rows.

A model is only as trustworthy as its errors on data it was not built against, so every set says
its role: ``checked`` (the model was compared with it while being built, nothing was fitted to
it), ``fitted`` (the named profile constants were set from it: its errors are in-sample for
those) or ``held-out`` (never looked at while building). ``simulator report`` shows each set's
mean absolute error, signed bias and worst rows side by side with its role, so in-sample and
out-of-sample errors are never read as one another.
"""

from __future__ import annotations

import csv
import statistics
from dataclasses import dataclass, field
from enum import Enum
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Callable

from simulator.spec.hardware import load_cluster
from simulator.spec.model import ModelSpec
from simulator.spec.plan import AttentionBackend, Job, ParallelPlan, Precision, RecomputeGranularity, RecomputePolicy


class Role(str, Enum):
    checked = "checked"  # compared with while the model was built; nothing fitted to it
    fitted = "fitted"  # named profile constants were set from it
    held_out = "held-out"  # not used while building


# The profile's host block is fitted to every measured A100 set together (calibration/fit_host_overhead.py)
HOST_FITTED = ("host.op_s", "host.backward_op_s", "host.collective_s", "host.pipeline_exchange_s",
               "host.micro_batch_s", "host.iteration_s")


@dataclass(frozen=True)
class MeasuredRun:
    """One measured iteration time and the job that produced it; ``tags`` name the subsets it belongs to."""

    label: str
    job: Job
    measured_s: float
    tags: dict[str, object] = field(default_factory=dict)
    profile: object = None  # the profile to predict it with (None: the GPU's published profile)


@dataclass(frozen=True)
class DataSet:
    key: str
    title: str
    source: str
    role: Role
    fitted: tuple[str, ...]  # profile constants set from this set (role fitted)
    runs: Callable[[], list[MeasuredRun]]
    subsets: tuple[str, ...] = ()  # tags to break the errors down by


@dataclass(frozen=True)
class RowError:
    label: str
    predicted_s: float
    measured_s: float

    @property
    def error(self) -> float:
        return (self.predicted_s - self.measured_s) / self.measured_s


@dataclass(frozen=True)
class SetErrors:
    """A data set's errors under one profile: mean absolute, signed bias, worst rows, per subset."""

    key: str
    rows: tuple[RowError, ...]
    subsets: dict[str, dict[object, tuple[float, float, int]]]  # tag -> value -> (mae, bias, n)

    @property
    def mean_abs_error(self) -> float:
        return statistics.fmean(abs(r.error) for r in self.rows)

    @property
    def bias(self) -> float:
        return statistics.fmean(r.error for r in self.rows)

    def worst(self, n: int = 3) -> list[RowError]:
        return sorted(self.rows, key=lambda r: -abs(r.error))[:n]


def evaluate(data: DataSet, profile=None) -> SetErrors:
    """Predict every run of ``data`` (with the run's own profile where it has one, else ``profile``, else
    its GPU's published one)."""
    from simulator.estimator.prediction import estimate

    rows, by_tag = [], {}
    for run in data.runs():
        # a run measured beside its own profile (the CPU loop's) is predicted with it, not with another device's
        predicted = estimate(run.job, run.profile if run.profile is not None else profile).iteration_time_s
        row = RowError(run.label, predicted, run.measured_s)
        rows.append(row)
        for tag in data.subsets:
            by_tag.setdefault(tag, {}).setdefault(run.tags[tag], []).append(row.error)
    subsets = {tag: {value: (statistics.fmean(map(abs, errs)), statistics.fmean(errs), len(errs))
                     for value, errs in sorted(values.items(), key=lambda kv: str(kv[0]))}
               for tag, values in by_tag.items()}
    return SetErrors(data.key, tuple(rows), subsets)


# --- Korthikanti et al. 2022, Table 5 and the 2,240-GPU point -------------------------------------


def _korthikanti_runs() -> list[MeasuredRun]:
    from simulator.measure import korthikanti as k

    runs = []
    for row in k.table5_rows():
        job = k.table5_job(row)
        label = f"{job.model.name} {'SP + selective' if row['parallel']['sp'] else 'full recompute'}"
        runs.append(MeasuredRun(label, job, row["measured"]["iteration_time_s"]))
    dp = k._data_parallel_job(True, k.DATA_PARALLEL_POINT["data_parallel_size"])
    runs.append(MeasuredRun("mt-nlg-530b SP + selective, DP 8", dp, k.DATA_PARALLEL_POINT["iteration_time_s"]))
    return runs


KORTHIKANTI = DataSet(
    key="korthikanti2022",
    title="Korthikanti et al. 2022, Table 5 and Section 6.3 (DGX A100 80GB, 8-2,240 GPUs)",
    source="calibration/published/korthikanti2022.md",
    role=Role.fitted,
    fitted=HOST_FITTED,
    runs=_korthikanti_runs,
)


# --- vTrain's single-node A100 runs (development set) ---------------------------------------------

VTRAIN_DIR = "vtrain-single-node"
GPT2_VOCAB = 50257
VTRAIN_CLUSTER = "a100-80gb-4x-hdr"  # the measured nodes: 8 A100 on NVSwitch, 4 HDR NICs; GPU memory not stated


@lru_cache(maxsize=1)
def _vtrain_cluster():
    return load_cluster(VTRAIN_CLUSTER)  # read once: its YAML, parsed per row, was most of the set's load time


def vtrain_job(gpus: int, global_batch: int, micro_batch: int, hidden: int, heads: int, layers: int, seq: int,
               tp: int, dp: int, pp: int) -> Job:
    """The job of one row as the set was measured (its README): Megatron-DeepSpeed, fp16, full
    recompute of every layer, 1F1B, no sequence parallelism, Megatron's unfused attention,
    GPT-2's vocabulary padded to a multiple of 128 x TP, FFN 4 x hidden. A TP group wider than a
    node (the multi-node set's TP 16) spans two nodes, as it was run; the work queues as below."""
    assert gpus == tp * dp * pp, (gpus, tp, dp, pp)
    multiple = 128 * tp
    model = ModelSpec(name=f"gpt-h{hidden}-l{layers}", num_layers=layers, hidden_size=hidden,
                      num_attention_heads=heads, vocab_size=-(-GPT2_VOCAB // multiple) * multiple, seq_length=seq)
    plan = ParallelPlan(tensor_parallel_size=tp, pipeline_parallel_size=pp, data_parallel_size=dp,
                        micro_batch_size=micro_batch, global_batch_size=global_batch, precision=Precision.fp16,
                        recompute=RecomputePolicy(granularity=RecomputeGranularity.full),
                        attention_backend=AttentionBackend.unfused, allow_tp_across_nodes=tp > 8,
                        # CUDA_DEVICE_MAX_CONNECTIONS=8, CUDA's default, where Megatron-LM's own launch (and so
                        # the CLI's default) sets 1 under TP. An assumption about how the sets were run, not a
                        # measurement: vTrain says only that its runs used Megatron-DeepSpeed, whose examples
                        # start training through DeepSpeed's launcher, and that launcher does not set the
                        # variable. Megatron-DeepSpeed then reduces a column-parallel layer's input gradient
                        # after the layer's whole backward (releases before the asynchronous all-reduce) or
                        # issues it asynchronously and only warns that the variable is not 1; either way the
                        # all-reduce runs after the weight-gradient GEMM, as 8 queues simulate it.
                        cuda_device_max_connections=8)
    return Job(model=model, cluster=_vtrain_cluster(), plan=plan)


@lru_cache(maxsize=2)
def _vtrain_rows(directory: str = VTRAIN_DIR, name: str = "ground_truth_single.csv",
                 first: int = 0) -> tuple[tuple[int, ...], ...]:
    """The set's rows as (GPUs, global batch, micro batch, hidden, heads, layers, sequence, TP, DP, PP, ms);
    ``first``: the column the GPU count is in (the multi-node file leads with the parameter count)."""
    path = Path(str(resources.files("calibration") / "published" / directory / name))
    with path.open(encoding="utf-8-sig") as f:
        reader = csv.reader(f)
        next(reader)  # header
        return tuple(tuple(int(x) for x in row[first:first + 10]) + (float(row[first + 10]),) for row in reader)


def _vtrain_runs(rows: tuple[tuple[int, ...], ...] | None = None) -> list[MeasuredRun]:
    runs = []
    for row in _vtrain_rows() if rows is None else rows:
        g, gbs, mbs, h, a, layers, s, t, d, p, ms = row
        label = f"h{h} L{layers} TP{t} PP{p} DP{d} mbs{mbs} gbs{gbs}"
        runs.append(MeasuredRun(label, vtrain_job(g, gbs, mbs, h, a, layers, s, t, d, p), ms / 1e3,
                                {"tp": t, "pp": p, "dp": d, "micro_batch": mbs, "hidden": h}))
    return runs


VTRAIN_SINGLE_NODE = DataSet(
    key="vtrain-single-node",
    title="vTrain single-node A100 runs (1,440 runs, 2-8 GPUs, Megatron-DeepSpeed, fp16)",
    source=f"calibration/published/{VTRAIN_DIR}/README.md (Bang et al., MICRO 2024; MIT license)",
    role=Role.fitted,
    fitted=HOST_FITTED,
    runs=_vtrain_runs,
    subsets=("tp", "micro_batch", "pp", "hidden"),
)


# --- vTrain's multi-node A100 runs (second development set) -----------------------------------------

VTRAIN_MULTI_DIR = "vtrain-multi-node-dev"


def _vtrain_multi_runs() -> list[MeasuredRun]:
    return _vtrain_runs(_vtrain_rows(VTRAIN_MULTI_DIR, "ground_truth_multi_dev.csv", first=1))


VTRAIN_MULTI_NODE = DataSet(
    key="vtrain-multi-node-dev",
    title="vTrain multi-node A100 runs (62 runs, 64-512 GPUs, 3.6B-175B, Megatron-DeepSpeed, fp16)",
    source=f"calibration/published/{VTRAIN_MULTI_DIR}/README.md (Bang et al., MICRO 2024; MIT license)",
    role=Role.fitted,
    fitted=HOST_FITTED,
    runs=_vtrain_multi_runs,
    subsets=("tp", "pp", "dp", "hidden"),
)


# --- the reference loop on this repository's CPU ---------------------------------------------------

CPU_VALIDATION = Path(__file__).resolve().parents[2] / "reports" / "cpu-validation"


def _cpu_runs() -> list[MeasuredRun]:
    """The six plans of ``python -m calibration.cpu_validation``, each predicted with the CPU profile
    calibrated minutes before it in the same session (none where the repository's reports are absent,
    as in an installed wheel)."""
    from simulator.measure.run_record import load_run_record
    from simulator.measure.validate import job_of

    profile = CPU_VALIDATION / "cpu-profile.json"
    if not profile.is_file():
        return []
    runs = []
    for path in sorted(CPU_VALIDATION.glob("run-*.json")):
        record = load_run_record(path)
        times = record.timed_iteration_times_s
        runs.append(MeasuredRun(path.stem.removeprefix("run-"), job_of(record), statistics.fmean(times),
                                {"plan": path.stem.removeprefix("run-")}, str(profile)))
    return runs


CPU_REFERENCE = DataSet(
    key="cpu-reference-loop",
    title="Reference loop on this repository's 2-core CPU (6 plans, gloo, fp32; the CPU profile measured beside them)",
    source="reports/cpu-validation/README.md (python -m calibration.cpu_validation)",
    role=Role.checked,
    fitted=(),
    runs=_cpu_runs,
)


REGISTRY: tuple[DataSet, ...] = (KORTHIKANTI, VTRAIN_SINGLE_NODE, VTRAIN_MULTI_NODE, CPU_REFERENCE)


def data_set(key: str) -> DataSet:
    for d in REGISTRY:
        if d.key == key:
            return d
    raise KeyError(key)
