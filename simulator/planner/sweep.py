"""Capacity studies: one search per point of a grid of models x GPU counts x global batches x clusters
(x sequence lengths), run on local processes or on a Ray cluster, written as a table and figures.

The grid is a YAML file (``SweepSpec``). Each point is a search; its row is the best plan with its
time, band, MFU, memory and training days, or the sentence saying why no plan fits. Rows are
keyed by their point, so a rerun skips the points already in the output (resumable), and every
executor returns the same rows: a point's row depends on nothing but the point.
"""

from __future__ import annotations

import ctypes
import io
import itertools
import json
import multiprocessing
import os
import signal
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Callable, Iterable

from pydantic import BaseModel, ConfigDict, Field, PositiveInt, ValidationInfo, field_validator, model_validator

from simulator.planner.space import plan_default
from simulator.spec._io import build, make_folder, read_mapping, write_output
from simulator.spec.errors import ConfigError, SimulatorError
from simulator.spec.plan import AttentionBackend
from simulator.spec.plan_names import compact_plan_name

MAX_POINTS = 100_000
RESULTS_JSON = "results.json"
RESULTS_CSV = "results.csv"
COLUMNS = ("model", "cluster", "gpus", "global_batch_size", "seq_length", "status", "plan", "iteration_time_s",
           "iteration_time_s_low", "iteration_time_s_high", "mfu", "tokens_per_s", "peak_gib", "training_days",
           "training_days_low", "training_days_high", "outside_validated_range", "message",
           # added later, so appended: what else sets every number of the row
           "attention_backend", "precision",
           # days as they are lived, with failures, checkpoints and restarts (`plan`'s expected days and ETTR)
           "expected_days", "expected_days_low", "expected_days_high", "ettr")


_EXAMPLES = {"gpus": "[256, 512]", "global_batch_sizes": "[1536]", "seq_lengths": "[2048, 4096]"}


def _as_written(x: object) -> str:
    """A value as the spec's YAML spells it (true, not Python's True)."""
    return json.dumps(x) if isinstance(x, (bool, str, int, float)) else repr(x)


class SweepSpec(BaseModel):
    """A grid of searches. Every list is one axis; the sweep is their product."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    models: tuple[str, ...] = Field(min_length=1, description="Presets or model files.")
    gpus: tuple[PositiveInt, ...] = Field(min_length=1, description="GPU counts.")
    global_batch_sizes: tuple[PositiveInt, ...] = Field(min_length=1, description="Sequences per iteration.")
    clusters: tuple[str, ...] = Field(("dgx-a100-80gb",), min_length=1, description="Cluster presets or files.")
    seq_lengths: tuple[PositiveInt | None, ...] = Field(
        (None,), min_length=1, description="Sequence lengths (None: the model's).")
    tokens: float | None = Field(None, gt=0, description="Training tokens, for days.")
    attention_backend: AttentionBackend | None = Field(
        None, description="Megatron's --attention-backend of every plan; None: the default `plan` and `search` "
                          "take (auto, a fused kernel).")
    use_flash_attention: bool | None = Field(
        None, description="Older spelling: false is the unfused backend, true a fused one; None: the default.")

    @field_validator("gpus", "global_batch_sizes", "seq_lengths", mode="before")
    @classmethod
    def _counts_are_whole_numbers(cls, value: object, info: ValidationInfo) -> object:
        # YAML reads `true` as a flag and `"8"` as text: neither stands for a count, as pydantic's lax mode takes them
        for x in value if isinstance(value, (list, tuple)) else ():
            if isinstance(x, (bool, str)):
                raise ValueError(f"{_as_written(x)} is not a whole number; write whole numbers, such as "
                                 f"{info.field_name}: {_EXAMPLES[info.field_name]}")
        return value

    @field_validator("tokens", mode="before")
    @classmethod
    def _tokens_are_a_number(cls, value: object) -> object:
        # text stays accepted: YAML 1.1 reads 300e9 (no dot) as text
        if isinstance(value, bool):
            raise ValueError(f"{_as_written(value)} is not a number of tokens; write a number, such as tokens: 300e9")
        return value

    @field_validator("use_flash_attention", mode="before")
    @classmethod
    def _flag_is_true_or_false(cls, value: object) -> object:
        if value is not None and not isinstance(value, bool):
            raise ValueError(f"{_as_written(value)} is not true or false; write use_flash_attention: true or false")
        return value

    @model_validator(mode="after")
    def _grid_is_bounded(self) -> "SweepSpec":
        n = len(self.models) * len(self.gpus) * len(self.global_batch_sizes) * len(self.clusters) * len(self.seq_lengths)
        if n > MAX_POINTS:
            raise ValueError(f"the grid has {n:,} points, more than {MAX_POINTS:,}; split it into several sweeps")
        if self.attention_backend is not None and self.use_flash_attention is not None \
                and self.attention_backend.fused_kernel != self.use_flash_attention:
            raise ValueError(f"attention_backend {self.attention_backend.value!r} and use_flash_attention "
                             f"{self.use_flash_attention} disagree; give one of them")
        return self

    def points(self) -> list["SweepPoint"]:
        backend = self.attention_backend
        if backend is None and self.use_flash_attention is not None:
            backend = AttentionBackend.auto if self.use_flash_attention else AttentionBackend.unfused
        return [SweepPoint(model=m, cluster=c, gpus=g, global_batch_size=b, seq_length=s, tokens=self.tokens,
                           attention_backend=backend or plan_default("attention_backend"))
                for m, c, g, b, s in itertools.product(self.models, self.clusters, self.gpus,
                                                       self.global_batch_sizes, self.seq_lengths)]


class SweepPoint(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str
    cluster: str
    gpus: int = Field(gt=0)
    global_batch_size: int = Field(gt=0)
    seq_length: int | None = Field(None, gt=0)
    tokens: float | None = None
    attention_backend: AttentionBackend = plan_default("attention_backend")

    @property
    def key(self) -> str:
        # the backend is part of the key: rows written when the sweep defaulted to unfused attention are
        # searched again rather than mixed with today's
        return (f"{self.model}|{self.cluster}|{self.gpus}|{self.global_batch_size}|{self.seq_length}|"
                f"{self.attention_backend.value}")


def load_spec(path: str | os.PathLike) -> SweepSpec:
    return build(SweepSpec, read_mapping(Path(path), "sweep spec"), f"sweep spec {str(path)!r}")


def run_point(point: SweepPoint) -> dict:
    """The row of one grid point: its best plan, or why there is none (never raises a user error)."""
    from simulator.estimator.band import with_band
    from simulator.planner.plan_search import SearchRequest, search
    from simulator.spec.catalog import load_model
    from simulator.spec.hardware import load_cluster
    from simulator.spec.plan import Job

    row: dict = {"key": point.key, "model": point.model, "cluster": point.cluster, "gpus": point.gpus,
                 "global_batch_size": point.global_batch_size, "seq_length": point.seq_length,
                 "attention_backend": point.attention_backend.value}
    try:
        model = load_model(point.model, point.seq_length)
        row["seq_length"] = model.seq_length
        req = SearchRequest(model=model, cluster=load_cluster(point.cluster), num_gpus=point.gpus,
                            global_batch_size=point.global_batch_size, attention_backend=point.attention_backend)
        best = search(req, tokens=point.tokens, top=1).best
        job = Job(model=req.model, cluster=req.cluster, plan=best.plan)
        est = with_band(job, best.estimate)
    except SimulatorError as exc:
        return {**row, "status": "no plan", "message": " ".join(str(exc).split())}
    row = {**row, "status": "ok", "plan": compact_plan_name(best.plan),
            "precision": best.plan.precision.value + (f"+fp8-{best.plan.fp8_format.value}" if best.plan.fp8_format else ""),
            "iteration_time_s": est.iteration_time_s,
            "iteration_time_s_low": est.iteration_time_s_low, "iteration_time_s_high": est.iteration_time_s_high,
            "mfu": est.mfu, "tokens_per_s": est.tokens_per_s, "peak_gib": est.memory.peak_bytes / 2**30,
            "training_days": est.training_days, "training_days_low": est.training_days_low,
            "training_days_high": est.training_days_high, "outside_validated_range": est.outside_validated_range,
            "message": est.validation_note, "plan_json": best.plan.model_dump(mode="json")}
    return {**row, **_expected_days(job, est)}


_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
_PARENT_POLL_S = 1.0


def _die_with_parent(parent_pid: int, direct_child: bool) -> None:
    """A worker's initializer: the worker ends when the sweep does, even killed by SIGKILL, which no handler
    sees (its pool would otherwise leave it searching, then waiting for work, for minutes). On Linux the kernel
    sends SIGKILL when the parent goes (prctl PR_SET_PDEATHSIG); everywhere a thread watches for the worker
    being handed to another parent."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass  # the watching thread below still ends the worker
    watched = os.getppid()
    if direct_child and watched != parent_pid:  # the sweep went before the signal was asked for
        os._exit(1)

    def watch() -> None:
        while os.getppid() == watched:
            time.sleep(_PARENT_POLL_S)
        os._exit(1)

    threading.Thread(target=watch, name="sweep-parent-watch", daemon=True).start()


def _expected_days(job, est) -> dict:
    """The row's expected days and ETTR, from the closed form (`plan` adds the simulated percentiles); none
    without tokens, or where the cluster's failure rates leave the run no expected days (then the message
    says why, as `plan`'s notes do)."""
    from simulator.estimator.goodput import EndlessRunError, goodput

    if est.tokens is None:
        return {}
    try:
        g = goodput(job, est, simulate=False)
    except EndlessRunError as exc:
        note = f"no expected days: {' '.join(str(exc).split())}"
        return {"message": "; ".join(m for m in (est.validation_note, note) if m)}
    return {"expected_days": g.expected_days, "expected_days_low": g.expected_days_low,
            "expected_days_high": g.expected_days_high, "ettr": g.ettr}


def _local(points: list[SweepPoint], workers: int) -> Iterable[dict]:
    if workers <= 1 or len(points) <= 1:
        yield from map(run_point, points)
        return
    context = multiprocessing.get_context()
    # under forkserver a worker's parent is the server, which itself ends with the sweep
    direct = context.get_start_method() != "forkserver"
    with ProcessPoolExecutor(max_workers=workers, mp_context=context, initializer=_die_with_parent,
                             initargs=(os.getpid(), direct)) as pool:
        yield from pool.map(run_point, points)


def _ray(points: list[SweepPoint], address: str, workers: int) -> Iterable[dict]:
    try:
        import ray
    except ImportError:
        raise ConfigError("--ray-address needs Ray; install the ray extra (pip install 'megatron-perf-simulator[ray]') "
                          "or drop --ray-address to run on local processes") from None
    started = not ray.is_initialized()
    if started:
        connect_ray(ray, address, workers)
    try:
        remote = ray.remote(run_point)
        pending = [remote.remote(p) for p in points]
        for ref in pending:  # in submission order, so every executor yields the same sequence
            yield ray.get(ref)
    finally:
        if started:
            ray.shutdown()


def connect_ray(ray, address: str, workers: int) -> None:
    """``ray.init`` for ``--ray-address``: ``local`` starts a Ray instance of ``workers`` CPUs for this sweep alone,
    even beside a cluster already running here (which a plain ``ray.init`` would join, refusing the CPU count);
    any other address joins that cluster. A cluster that cannot be joined (nothing listening, token
    authentication without the token, another Ray version) is one ConfigError naming the address."""
    try:
        if address == "local":
            ray.init(address="local", num_cpus=workers, include_dashboard=False, log_to_driver=False)
        else:
            ray.init(address=address, log_to_driver=False)
    except (ConnectionError, TimeoutError, RuntimeError, ValueError, OSError) as exc:
        if ray.is_initialized():
            ray.shutdown()
        first = " ".join(str(exc).split())[:300] or type(exc).__name__
        where = "start a local Ray instance" if address == "local" else f"connect to the Ray cluster at {address!r}"
        auth = ("" if address == "local" or os.environ.get("RAY_AUTH_MODE") == "token" else
                "; a cluster with token authentication (the default of `ray start` since Ray 2.59) is joined with "
                "RAY_AUTH_MODE=token set and its token in RAY_AUTH_TOKEN or ~/.ray/auth_token (`ray get-auth-token` "
                "on its head prints it)")
        raise ConfigError(f"could not {where} ({type(exc).__name__}: {first}){auth}; or drop --ray-address to run "
                          "on local processes") from None


def read_results(out: Path) -> list[dict]:
    path = out / RESULTS_JSON
    if not path.exists():
        return []
    try:
        rows = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"cannot resume from {str(path)!r} ({exc}); remove it or choose another --out") from None
    if not isinstance(rows, list) or not all(isinstance(r, dict) and "key" in r for r in rows):
        raise ConfigError(f"{str(path)!r} is not a sweep's results; remove it or choose another --out")
    return rows


def write_text(path: Path, text: str) -> None:
    """Write ``path`` as every output is written (``write_output``): atomically, one sentence when it cannot be."""
    write_output(path, text, "sweep results")


def write_results(out: Path, rows: list[dict]) -> None:
    make_folder(out, "the sweep's results")
    write_text(out / RESULTS_JSON, json.dumps(rows, indent=1, sort_keys=True) + "\n")
    lines = [",".join(COLUMNS)]
    for r in rows:
        lines.append(",".join(_csv_cell(r.get(c)) for c in COLUMNS))
    write_text(out / RESULTS_CSV, "\n".join(lines) + "\n")
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        return
    buffer = pa.BufferOutputStream()
    pq.write_table(pa.table({c: [r.get(c) for r in rows] for c in COLUMNS}), buffer)
    write_output(out / "results.parquet", buffer.getvalue().to_pybytes(), "sweep results")


def _csv_cell(value) -> str:
    if value is None:
        return ""
    text = f"{value:.6g}" if isinstance(value, float) else str(value)
    if any(ch in text for ch in ',"\n'):
        text = '"' + text.replace('"', '""') + '"'
    return text


def run_sweep(spec: SweepSpec, out: Path, ray_address: str | None = None, workers: int | None = None,
              progress: Callable[[int, int], None] | None = None) -> list[dict]:
    """Run every point not already in ``out``; write the table after each point (resumable); return all rows
    in grid order."""
    if ray_address is not None and not ray_address.strip():
        raise ConfigError("--ray-address is empty; give local, HOST:PORT or ray://HOST:PORT, or drop it to run on "
                          "local processes")
    points = spec.points()
    # a folder that cannot be made is refused before any point is searched, and before a resume reads it
    out = make_folder(out, "the sweep's results")
    done = {r["key"]: r for r in read_results(out)}
    todo = [p for p in points if p.key not in done]
    workers = workers or max(1, min(len(todo), os.cpu_count() or 1))
    rows_by_key = dict(done)
    runner = _ray(todo, ray_address, workers) if ray_address is not None else _local(todo, workers)
    for i, row in enumerate(runner, 1):
        rows_by_key[row["key"]] = row
        ordered = [rows_by_key[p.key] for p in points if p.key in rows_by_key]
        write_results(out, ordered)
        if progress is not None:
            progress(i, len(todo))
    rows = [rows_by_key[p.key] for p in points]
    write_results(out, rows)
    return rows


def sweep_figures(rows: list[dict], out: Path) -> list[Path]:
    """Days vs GPUs and MFU vs GPUs, one line per (model, cluster, batch, sequence)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, NullFormatter

    series: dict[tuple, list[dict]] = {}
    for r in rows:
        if r.get("status") == "ok":
            series.setdefault((r["model"], r["cluster"], r["global_batch_size"], r["seq_length"]), []).append(r)
    paths = []
    figdir = make_folder(out / "figures", "the sweep's figures")
    for metric, label, name in (("training_days", "training days", "days_vs_gpus.png"),
                                ("mfu", "MFU (%)", "mfu_vs_gpus.png")):
        if metric == "training_days" and not any(r.get(metric) for rs in series.values() for r in rs):
            continue
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for (model, cluster, gbs, seq), rs in sorted(series.items()):
            rs = sorted(rs, key=lambda r: r["gpus"])
            ys = [r[metric] * (100 if metric == "mfu" else 1) for r in rs]
            ax.plot([r["gpus"] for r in rs], ys, marker="o", label=f"{model}, {cluster}, batch {gbs}, seq {seq}")
            if metric == "training_days":
                ax.fill_between([r["gpus"] for r in rs], [r["training_days_low"] for r in rs],
                                [r["training_days_high"] for r in rs], alpha=0.15)
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted({r["gpus"] for rs in series.values() for r in rs}))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:,.0f}"))
        ax.xaxis.set_minor_formatter(NullFormatter())
        if metric == "training_days":
            ax.set_yscale("log")
            ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:g}"))
            ax.yaxis.set_minor_formatter(FuncFormatter(lambda y, _: f"{y:g}"))
        ax.set_xlabel("GPUs")
        ax.set_ylabel(label)
        ax.set_title(f"{label} vs GPU count, best plan at each point (band shaded)" if metric == "training_days"
                     else "MFU vs GPU count, best plan at each point")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        path = figdir / name
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", dpi=120)
        plt.close(fig)
        write_output(path, buffer.getvalue(), "figure")
        paths.append(path)
    return paths
