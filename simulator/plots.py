"""Figures for the CLI and the reports (matplotlib, Agg backend, deterministic output).

matplotlib is imported inside each function so that importing the simulator stays light.
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Sequence

from simulator._io import write_output

GIB = 1024**3


def _pyplot():
    # Figures are always drawn off-screen (Agg); a backend named in the environment (MPLBACKEND)
    # is not consulted, so a bogus one cannot stop the import.
    backend = os.environ.pop("MPLBACKEND", None)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    finally:
        if backend is not None:
            os.environ["MPLBACKEND"] = backend

    plt.rcParams.update({"svg.hashsalt": "simulator", "figure.dpi": 110, "font.size": 9})
    return plt


def _save(fig, path: Path) -> None:
    """Render in memory in the format the suffix names, then write atomically (``write_output``)."""
    fmt = Path(path).suffix.lstrip(".").lower() or "png"
    buffer = io.BytesIO()
    # No timestamp in the metadata, so regenerating a figure gives the same bytes.
    metadata = {"Software": None} if fmt == "png" else {"Creator": None, "Date": None} if fmt == "svg" else \
        {"Creator": None, "Producer": None, "CreationDate": None}
    fig.savefig(buffer, format=fmt, metadata=metadata, bbox_inches="tight")
    write_output(path, buffer.getvalue(), "figure")


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point beats on both axes (less memory x, more throughput y)."""
    order = sorted(range(len(points)), key=lambda i: (points[i][0], -points[i][1]))
    front, best = [], float("-inf")
    for i in order:
        if points[i][1] > best:
            front.append(i)
            best = points[i][1]
    return front


def pareto_figure(result, capacity_bytes: int, title: str, path: Path) -> None:
    """Throughput vs peak memory of every plan that fits, with the Pareto front and the best plan."""
    plt = _pyplot()
    pts = [(s.peak_bytes / GIB, s.plan.global_batch_size / s.screen_time_s) for s in result.screened]
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    ax.scatter([p[0] for p in pts], [p[1] for p in pts], s=6, alpha=0.35, color="tab:blue",
               label=f"plans that fit ({len(pts)}, closed-form screen)")
    front = pareto_front(pts)
    ax.plot([pts[i][0] for i in front], [pts[i][1] for i in front], "-o", ms=3, color="tab:orange",
            label="Pareto front")
    best = result.best
    ax.scatter([best.estimate.memory.peak_bytes / GIB], [best.plan.global_batch_size / best.estimate.iteration_time_s],
               marker="*", s=140, color="tab:red", zorder=5, label="best plan (simulated)")
    ax.axvline(capacity_bytes / GIB, color="grey", ls="--", lw=1, label="GPU memory")
    ax.set_xlabel("peak memory per GPU (GiB)")
    ax.set_ylabel("throughput (sequences / s)")
    ax.set_title(title)
    ax.legend(loc="lower right", fontsize=7)
    ax.grid(alpha=0.3)
    _save(fig, path)
    plt.close(fig)


def memory_breakdown_figure(data: dict, capacity_gib: float, path: Path) -> None:
    """Stacked bars per strategy, one panel per model: weights+grads+optimizer, activations, the rest."""
    plt = _pyplot()
    models = list(data)
    fig, axes = plt.subplots(1, len(models), figsize=(3.0 * len(models), 3.6), sharey=True)
    colors = {"weights+grads+optimizer": "tab:blue", "activations": "tab:orange", "transient+reserve": "tab:gray"}
    for ax, name in zip(axes, models):
        labels = list(data[name])
        bottom = [0.0] * len(labels)
        for part, color in colors.items():
            values = [data[name][label][part] for label in labels]
            ax.bar(range(len(labels)), values, bottom=bottom, color=color, label=part)
            bottom = [b + v for b, v in zip(bottom, values)]
        ax.axhline(capacity_gib, color="k", ls="--", lw=1)
        ax.set_xticks(range(len(labels)))
        ax.set_xticklabels(labels, rotation=45, ha="right", fontsize=7)
        ax.set_title(name)
        ax.grid(axis="y", alpha=0.3)
    axes[0].set_ylabel("GiB per GPU (first stage)")
    axes[-1].legend(fontsize=7, loc="upper right")
    _save(fig, path)
    plt.close(fig)


def gantt_figure(intervals, num_stages: int, path: Path) -> None:
    """The engine's intervals: one row per stage (compute), with sends and DP reduction beneath."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(10, 0.32 * num_stages + 1.2))
    streams = {"compute": 0.0, "send_forward": 0.62, "send_backward": 0.74, "dp": 0.86}
    heights = {"compute": 0.55, "send_forward": 0.1, "send_backward": 0.1, "dp": 0.1}
    for iv in intervals:
        if iv.stream == "compute":
            color = "tab:red" if iv.name == "optimizer" else ("#8fb3e0" if iv.name.startswith("F") else "#1f4e8c")
        else:
            color = {"send_forward": "tab:green", "send_backward": "tab:olive", "dp": "tab:purple"}[iv.stream]
        y = iv.stage + streams[iv.stream]
        ax.broken_barh([(iv.start_s, iv.end_s - iv.start_s)], (y, heights[iv.stream]), facecolors=color, linewidth=0)
    ax.set_ylim(num_stages, 0)
    ax.set_yticks([s + 0.3 for s in range(num_stages)])
    ax.set_yticklabels([f"stage {s}" for s in range(num_stages)], fontsize=7)
    ax.set_xlabel("time (s)")
    ax.set_title("one iteration: forward (light), backward (dark), sends (green), DP reduction (purple), optimizer (red)",
                 fontsize=8)
    _save(fig, path)
    plt.close(fig)


def days_vs_gpus_figure(points, model_name: str, path: Path) -> None:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5.6, 3.6))
    xs, ys = zip(*points)
    ax.plot(xs, ys, "-o", color="tab:blue", label="best plan at each size")
    ideal = [ys[0] * xs[0] / x for x in xs]
    ax.plot(xs, ideal, "--", color="gray", label="linear scaling from the smallest")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(xs)
    ax.set_xticklabels([str(x) for x in xs])
    ax.set_xlabel("A100-80GB GPUs")
    ax.set_ylabel("training days (300B tokens)")
    ax.set_title(model_name)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    _save(fig, path)
    plt.close(fig)
