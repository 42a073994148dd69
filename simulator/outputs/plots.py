"""Figures for the CLI and the reports (matplotlib, Agg backend, deterministic output).

Each ``*_figure(data, path)`` draws one dict of ``simulator.outputs.figure_data`` and returns what it drew:
its titles, axis labels, legend entries and text labels, read back from the matplotlib figure
(``summarize``), so the tests check a figure by its labels and data, not by its pixels. Every
figure has a title naming the model, cluster, GPUs, batch and sequence length, units on its axes,
a legend, and reference lines that say what they are. matplotlib is imported inside the functions
so that importing the simulator stays light.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable

from simulator.outputs.plots_base import finish, pyplot

TIMELINE_STYLE = {  # kind -> (colour, legend label, row offset, row height)
    "forward": ("#8fb3e0", "forward", 0.0, 0.55),
    "backward": ("#1f4e8c", "backward (recompute included)", 0.0, 0.55),
    "optimizer": ("tab:red", "optimizer step", 0.0, 0.55),
    "send_forward": ("tab:green", "send activation (forward)", 0.6, 0.1),
    "send_backward": ("tab:olive", "send gradient (backward)", 0.72, 0.1),
    "dp": ("tab:purple", "DP gradient reduction", 0.84, 0.1),
}


# what the search orders its plans by (``RankBy``), as a figure or a report says it
RANKED_BY = {"upper": "the slow end of their band, not their predicted time",
             "point": "their predicted time", "expected-days": "their expected days with failures"}


def pareto_figure(data: dict, path: Path) -> dict[str, Any]:
    """Throughput vs peak memory of every plan that fits, the Pareto front labelled with its plans, the
    simulated plans and the GPU's memory; MFU on the right axis."""
    plt = pyplot()
    plans, front, sim = data["plans"], data["front"], data["simulated"]
    fig, (ax, key) = plt.subplots(1, 2, figsize=(11.5, 5.6), gridspec_kw={"width_ratios": [3.0, 1.25]})
    xs, ys = [p[0] for p in plans], [p[1] for p in plans]
    ax.scatter(xs, ys, s=6, alpha=0.35, color="tab:blue", label=f"plans that fit ({len(plans):,}, closed-form screen)")
    ax.plot([xs[i] for i in front], [ys[i] for i in front], "-o", ms=3, color="tab:orange",
            label=f"Pareto front ({len(front)} plans, numbered)")
    # the front's points carry a number; the key beside the plot gives each number's plan
    key.axis("off")
    key.set_title("Pareto front, least memory first", fontsize=8, loc="left")
    step = min(0.045, 0.98 / max(len(front), 1))
    for k, i in enumerate(front, 1):
        ax.annotate(str(k), (xs[i], ys[i]), xytext=(3, (-9, 3)[k % 2]), textcoords="offset points", fontsize=6,
                    color="tab:orange")
        key.text(0.0, 0.98 - (k - 1) * step, f"{k:>2}  {plans[i][4]}  {plans[i][0]:.0f} GiB, {plans[i][1]:,.0f} tok/s",
                 fontsize=6, family="monospace", va="top", transform=key.transAxes)
    if len(sim) > 1:
        ax.scatter([s[0] for s in sim[1:]], [s[1] for s in sim[1:]], marker="D", s=16, color="tab:green", zorder=4,
                   label=f"next best, simulated ({len(sim) - 1})")
    best = sim[0]
    # the search's order is not the plot's: a plan drawn above the star can have the shorter predicted time
    ax.scatter([best[0]], [best[1]], marker="*", s=160, color="tab:red", zorder=5,
               label=f"best plan (simulated): {best[4]}, {best[3]:.2f} s, MFU {best[2]:.1%}\n"
                     f"plans ranked by {RANKED_BY[data['rank_by']]}")
    ax.axvline(data["capacity_gib"], color="grey", ls="--", lw=1, label=f"GPU memory ({data['capacity_gib']:.0f} GiB)")
    ratio = plans[0][2] / plans[0][1]  # MFU per token/s: the same for every plan
    right = ax.secondary_yaxis("right", functions=(lambda y: 100 * y * ratio, lambda m: m / (100 * ratio)))
    right.set_ylabel("MFU (%)")
    ax.set_xlabel("peak memory per GPU (GiB)")
    ax.set_ylabel("throughput (tokens / s)")
    ax.yaxis.set_major_formatter(_thousands())
    ax.set_title(data["title"])
    ax.legend(loc="lower right", fontsize=7)
    ax.grid(alpha=0.3)
    return finish(plt, fig, path)


def timeline_figure(data: dict, path: Path) -> dict[str, Any]:
    """Each stage's compute stream (forward, backward, optimizer), its sends and DP reduction; idle time
    shows as the grey band. With a window, the steps are labelled with their micro-batch (and chunk)."""
    from matplotlib.patches import Patch

    plt = pyplot()
    p, T, window = data["stages"], data["iteration_time_s"], data["window"]
    fig, ax = plt.subplots(figsize=(11, 0.36 * p + 1.8))
    lo, hi = (window[0], window[1]) if window else (0.0, T)
    groups: dict[tuple[int, str], list[tuple[float, float]]] = {}
    labels = []
    multi_chunk = any(r[5] for r in data["intervals"] if r[5] is not None)
    for stage, kind, start, end, mb, chunk, phase in data["intervals"]:
        kind = phase if kind == "compute" else kind
        if end < lo or start > hi:
            continue
        groups.setdefault((stage, kind), []).append((start, end - start))
        if window and phase and (end - start) > 0.012 * (hi - lo):
            labels.append((start, end, stage + 0.28, f"{mb}" + (f".{chunk}" if multi_chunk else "")))
    ax.broken_barh([(lo, hi - lo)], (-0.02, p + 0.04), facecolors="#eeeeee", linewidth=0)
    for stage in range(p):
        ax.broken_barh([(lo, hi - lo)], (stage, 0.55), facecolors="#d9d9d9", linewidth=0)
    for (stage, kind), spans in sorted(groups.items()):
        color, _, offset, height = TIMELINE_STYLE[kind]
        ax.broken_barh(spans, (stage + offset, height), facecolors=color, linewidth=0)
    handles = [Patch(color=c, label=label) for c, label, _, _ in TIMELINE_STYLE.values()]
    handles.append(Patch(color="#d9d9d9", label="compute idle (pipeline bubble, waiting)"))
    if lo <= T <= hi:
        handles.append(ax.axvline(T, color="k", ls="--", lw=0.8, label=f"iteration end ({T:.2f} s)"))
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.12 if p > 4 else -0.25), ncol=4, fontsize=7)
    ax.set_xlim(lo, hi)
    ax.set_ylim(p, 0)
    ax.set_yticks([s + 0.3 for s in range(p)])
    ax.set_yticklabels([f"stage {s}" for s in range(p)], fontsize=7)
    ax.set_xlabel("time (s)")
    zoom = f", steps {window[2]}-{window[3] - 1} of each stage ({'micro-batch.chunk' if multi_chunk else 'micro-batch'} labelled)" \
        if window else ""
    ax.set_title(f"{data['title']}\n{data['plan']}: {T:.2f} s per iteration, {data['micro_batches']} micro-batches{zoom}")
    _label_steps(fig, ax, labels)
    return finish(plt, fig, path)


def _label_steps(fig, ax, labels: list[tuple[float, float, float, str]]) -> None:
    """Write each step's micro-batch (start, end, row, text) inside its bar where it fits there and clears the
    label before it; a step too short for its label goes unlabelled rather than run into its neighbours."""
    if not labels:
        return
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    placed: list = []
    lo, hi = ax.get_xlim()
    for start, end, y, text in sorted(labels, key=lambda q: (q[2], q[0])):
        start, end = max(start, lo), min(end, hi)  # the part of the step inside the window
        label = ax.text(start + (end - start) / 2, y, text, ha="center", va="center", fontsize=5, color="white")
        box = label.get_window_extent(renderer)
        x0, x1 = (ax.transData.transform([(start, y), (end, y)])[:, 0])
        if box.x0 < min(x0, x1) + 0.5 or box.x1 > max(x0, x1) - 0.5 or any(box.overlaps(b) for b in placed):
            label.remove()
            continue
        placed.append(box)


# where a point's label may go, in points from the point, in the order tried: (dx, dy, ha, va)
_LABEL_SPOTS = ((5, 6, "left", "bottom"), (-5, -6, "right", "top"), (5, -6, "left", "top"),
                (-5, 6, "right", "bottom"), (0, 9, "center", "bottom"), (0, -9, "center", "top"))


def _label_points(fig, ax, points: list[tuple[float, float, str]], fontsize: float) -> None:
    """Label each point where its text crosses no line of ``ax`` and no label placed before it: each spot of
    ``_LABEL_SPOTS`` is tried against the lines as drawn (so a label never sits on the curve it labels)."""
    from matplotlib.transforms import Bbox

    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    paths = []
    for line in ax.lines:
        xy = ax.transData.transform(line.get_xydata()) if line.get_transform() == ax.transData else \
            line.get_transform().transform(line.get_xydata())
        paths.append(xy)
    placed: list = []

    def clear(box) -> bool:
        grown = Bbox.from_extents(box.x0 - 1, box.y0 - 1, box.x1 + 1, box.y1 + 1)
        for xy in paths:
            for (x0, y0), (x1, y1) in zip(xy[:-1], xy[1:]):
                for k in range(33):  # the segment, sampled: finer than a label's height at these sizes
                    f = k / 32
                    if grown.contains(x0 + f * (x1 - x0), y0 + f * (y1 - y0)):
                        return False
        return not any(box.overlaps(other) for other in placed) and \
            ax.get_window_extent(renderer).contains(box.x0, box.y0) and \
            ax.get_window_extent(renderer).contains(box.x1, box.y1)

    for x, y, text in points:
        for dx, dy, ha, va in _LABEL_SPOTS:
            label = ax.annotate(text, (x, y), xytext=(dx, dy), textcoords="offset points", fontsize=fontsize,
                                ha=ha, va=va)
            box = label.get_window_extent(renderer)
            if clear(box) or (dx, dy, ha, va) == _LABEL_SPOTS[-1]:
                placed.append(box)
                break
            label.remove()


def _thousands():
    from matplotlib.ticker import FuncFormatter

    return FuncFormatter(lambda v, _: f"{v:,.0f}")


def _readable_log_axis(axis, decades: float = 1.0) -> None:
    """Ticks at 1, 2 and 5 of each decade over a short range, at each decade over a long one (``decades``),
    written short (20M, 500k) so that neighbours do not run into each other."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0) if decades <= 1.5 else (1.0,)))
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v / 1e6:g}M" if v >= 1e6 else f"{v / 1e3:g}k"
                                           if v >= 1e4 else f"{v:g}"))
    axis.set_minor_formatter(NullFormatter())


def days_vs_gpus_figure(data: dict, path: Path) -> dict[str, Any]:
    plt = pyplot()
    pts = data["points"]
    xs, ys = [q["gpus"] for q in pts], [q["days"] for q in pts]
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    ax.plot(xs, ys, "-o", color="tab:blue", label="best plan at each size")
    ax.plot(xs, [ys[0] * xs[0] / x for x in xs], "--", color="gray", label=f"linear scaling from {xs[0]:,} GPUs")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    _readable_log_axis(ax.yaxis)
    ax.set_xticks(xs)
    ax.set_xticklabels([f"{x:,}" for x in xs])
    ax.set_xlabel(f"{data['gpu']} GPUs")
    ax.set_ylabel(f"training days ({data['tokens'] / 1e9:g}B tokens)")
    ax.set_title(data["title"])
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, loc="lower left")
    _label_points(fig, ax, [(x, y, f"{y:.1f} d") for x, y in zip(xs, ys)], 7)
    return finish(plt, fig, path)


def mfu_vs_gpus_figure(data: dict, path: Path) -> dict[str, Any]:
    """MFU of the best plan at each GPU count, with the smallest count's MFU as perfect scaling."""
    plt = pyplot()
    pts = data["points"]
    xs, ys = [q["gpus"] for q in pts], [100 * q["mfu"] for q in pts]
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    ax.plot(xs, ys, "-o", color="tab:blue", label="best plan at each size")
    ax.axhline(ys[0], color="gray", ls="--", lw=1, label=f"perfect scaling: {ys[0]:.1f}% as at {xs[0]:,} GPUs")
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs)
    ax.set_xticklabels([f"{x:,}" for x in xs])
    ax.set_ylim(0, max(ys) * 1.15)
    ax.set_xlabel(f"{data['gpu']} GPUs")
    ax.set_ylabel("MFU (%)")
    ax.set_title(data["title"])
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower left")
    _label_points(fig, ax, [(x, y, f"{y:.1f}% ({y / ys[0]:.0%} efficient)") for x, y in zip(xs, ys)], 6)
    return finish(plt, fig, path)


def memory_breakdown_figure(data: dict, path: Path) -> dict[str, Any]:
    """Stacked bars per strategy, one panel per configuration (named in the panel's title)."""
    plt = pyplot()
    panels = data["panels"]
    # constrained layout keeps the two-line panel titles below the suptitle
    fig, axes = plt.subplots(1, len(panels), figsize=(3.2 * len(panels) + 2.4, 4.4), sharey=True, squeeze=False,
                             layout="constrained")
    colors = {"weights+grads+optimizer": "tab:blue", "activations": "tab:orange", "transient+reserve": "tab:gray"}
    cap = data["capacity_gib"]
    for ax, panel in zip(axes[0], panels):
        labels = list(panel["bars"])
        bottom = [0.0] * len(labels)
        for part, color in colors.items():
            values = [panel["bars"][label][part] for label in labels]
            ax.bar(range(len(labels)), values, bottom=bottom, color=color, label=f"{part} (GiB)")
            bottom = [b + v for b, v in zip(bottom, values)]
        ax.axhline(cap, color="k", ls="--", lw=1, label=f"GPU memory ({cap:.0f} GiB)")
        ax.set_xticks(range(len(labels)))
        ax.set_xticklabels(labels, rotation=90, fontsize=7)  # upright, a slanted label's box runs into the next
        ax.set_title(f"{panel['model']}\n{panel['config']}", fontsize=8)
        ax.set_xlabel("strategy")
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].set_ylabel("GiB per GPU (first pipeline stage)")
    # beside the last panel, not over its bars
    axes[0][-1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0)
    fig.suptitle(data["title"], fontsize=9)
    return finish(plt, fig, path)


def memory_vs_micro_batch_figure(data: dict, path: Path) -> dict[str, Any]:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    xs = data["micro_batch_sizes"]
    for (label, values), marker in zip(data["series"].items(), "osD^"):
        pts = [(x, y) for x, y in zip(xs, values) if y is not None]
        ax.plot([x for x, _ in pts], [y for _, y in pts], f"-{marker}", label=f"recompute: {label}")
    cap = data["capacity_gib"]
    ax.axhline(cap, color="k", ls="--", lw=1, label=f"GPU memory ({cap:.0f} GiB)")
    missing = [x for i, x in enumerate(xs) if all(v[i] is None for v in data["series"].values())]
    if missing:
        ax.text(0.02, 0.02, f"micro-batch {', '.join(map(str, missing))}: not allowed by the global batch "
                "(or the interleaved schedule)", transform=ax.transAxes, fontsize=6)
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs)
    ax.set_xticklabels([str(x) for x in xs])
    ax.set_xlabel("micro-batch size (sequences)")
    ax.set_ylabel("peak memory per GPU (GiB, largest stage)")
    ax.set_title(f"{data['title']}\n{data['layout']}")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    return finish(plt, fig, path)


def time_breakdown_figure(data: dict, path: Path) -> dict[str, Any]:
    """Where the iteration goes for each plan (its critical stage), stacked, fastest on top."""
    plt = pyplot()
    plans = data["plans"]
    fig, ax = plt.subplots(figsize=(8.0, 0.45 * len(plans) + 1.8))
    left = [0.0] * len(plans)
    from simulator.outputs.figure_data import breakdown_label

    for key in plans[0]["parts"]:
        label = breakdown_label(key)
        values = [q["parts"][key] for q in plans]
        ax.barh(range(len(plans)), values, left=left, label=label)
        left = [a + b for a, b in zip(left, values)]
    for i, q in enumerate(plans):
        ax.text(left[i], i, f" {q['iteration_time_s']:.2f} s, MFU {q['mfu']:.1%}", va="center", fontsize=7)
    ax.set_yticks(range(len(plans)))
    ax.set_yticklabels([q["plan"] for q in plans], fontsize=7)
    ax.set_ylim(len(plans) - 0.5, -0.5)
    ax.set_xlim(0, max(left) * 1.3)
    ax.set_xlabel("seconds per iteration (critical stage)")
    ax.set_title(data["title"])
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=3)
    ax.grid(axis="x", alpha=0.3)
    return finish(plt, fig, path)


def stage_memory_figure(data: dict, path: Path) -> dict[str, Any]:
    plt = pyplot()
    parts = data["parts"]
    p = len(data["peak_gib"])
    fig, ax = plt.subplots(figsize=(max(5.0, 0.4 * p + 3), 4.2))
    bottom = [0.0] * p
    colors = {"weights": "tab:blue", "gradients": "tab:cyan", "optimizer state": "tab:green",
              "activations": "tab:orange", "transient": "tab:pink", "reserve": "tab:gray"}
    for label, values in parts.items():
        ax.bar(range(p), values, bottom=bottom, label=label, color=colors.get(label))
        bottom = [a + b for a, b in zip(bottom, values)]
    cap = data["capacity_gib"]
    ax.axhline(cap, color="k", ls="--", lw=1, label=f"GPU memory ({cap:.0f} GiB)")
    worst = max(range(p), key=lambda i: data["peak_gib"][i])
    ax.annotate(f"peak {data['peak_gib'][worst]:.1f} GiB", (worst, data["peak_gib"][worst]), xytext=(0, 4),
                textcoords="offset points", ha="center", fontsize=7)
    ax.set_xticks(range(p))
    ax.set_xticklabels([str(i) for i in range(p)], fontsize=7)
    ax.set_xlabel("pipeline stage")
    ax.set_ylabel("GiB per GPU")
    ax.set_ylim(0, max(cap, max(bottom)) * 1.12)
    ax.set_title(f"{data['title']}\n{data['plan']}")
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=4)
    ax.grid(axis="y", alpha=0.3)
    return finish(plt, fig, path)


def parity_figure(data: dict, path: Path) -> dict[str, Any]:
    """Predicted against measured, one panel per data set, with the identity line and a tolerance band."""
    plt = pyplot()
    sets = data["sets"]
    cols = 4
    rows = math.ceil(len(sets) / cols)
    # constrained layout leaves room for every panel's tick labels and for the suptitle's source lines
    fig, axes = plt.subplots(rows, cols, figsize=(4.0 * cols, 3.8 * rows + 1.0), squeeze=False, layout="constrained")
    for ax in axes.flat[len(sets):]:
        ax.set_visible(False)
    for ax, s in zip(axes.flat, sets):
        measured = [q[2] for q in s["points"]]
        predicted = [q[1] for q in s["points"]]
        errors = [abs(p / m - 1) for p, m in zip(predicted, measured) if m]
        ax.scatter(measured, predicted, s=14, color="tab:blue", zorder=3,
                   label=f"{len(measured)} points, mean |error| {sum(errors) / len(errors):.1%}")
        lo, hi = min(measured + predicted), max(measured + predicted)
        log = lo > 0 and hi / lo > 20
        pad = (hi / lo) ** 0.05 if log else (hi - lo) * 0.05 or 1
        lo, hi = (lo / pad, hi * pad) if log else (lo - pad, hi + pad)
        ax.plot([lo, hi], [lo, hi], color="k", lw=1, label="predicted = measured")
        tol = s["tolerance"] or 0.10
        band = f"±{tol:.0%} (the tests' tolerance)" if s["tolerance"] else "±10%"
        ax.plot([lo, hi], [lo * (1 + tol), hi * (1 + tol)], color="tab:red", ls="--", lw=0.8, label=band)
        ax.plot([lo, hi], [lo * (1 - tol), hi * (1 - tol)], color="tab:red", ls="--", lw=0.8)
        if log:
            ax.set_xscale("log")
            ax.set_yscale("log")
            _readable_log_axis(ax.xaxis, math.log10(hi / lo))
            _readable_log_axis(ax.yaxis, math.log10(hi / lo))
        else:  # the lowest y tick would sit on the lowest x tick's label in the corner
            from matplotlib.ticker import MaxNLocator

            ax.yaxis.set_major_locator(MaxNLocator(nbins=6, prune="lower"))
            ax.xaxis.set_major_locator(MaxNLocator(nbins=5))
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
        ax.set_xlabel(f"measured ({s['unit']})")
        ax.set_ylabel(f"predicted ({s['unit']})")
        ax.set_title(s["name"], fontsize=8)
        ax.legend(fontsize=6, loc="upper left")
        ax.grid(alpha=0.3)
    sources = list(dict.fromkeys(s["source"] for s in sets))
    fig.suptitle(data["title"] + "\n" + "\n".join(sources), fontsize=9)
    return finish(plt, fig, path)


def tp_pp_heatmap_figure(data: dict, path: Path) -> dict[str, Any]:
    """Iteration time of the fastest plan in each (TP, PP) cell; grey where no plan fits."""
    import numpy as np
    from matplotlib.patches import Patch, Rectangle

    plt = pyplot()
    tps, pps, times = data["tensor_parallel_sizes"], data["pipeline_parallel_sizes"], data["iteration_time_s"]
    grid = np.ma.masked_invalid(np.array([[np.nan if t is None else t for t in row] for row in times], dtype=float))
    fig, ax = plt.subplots(figsize=(1.0 * len(pps) + 3, 0.7 * len(tps) + 2.2))
    ax.set_facecolor("#dddddd")
    image = ax.imshow(grid, cmap="viridis_r", aspect="auto")
    bar = fig.colorbar(image, ax=ax)
    bar.set_label("iteration time (s)")
    best = min(((t, i, j) for i, row in enumerate(times) for j, t in enumerate(row) if t is not None))
    for i, row in enumerate(times):
        for j, t in enumerate(row):
            ax.text(j, i, f"{t:.2f}" if t is not None else "-", ha="center", va="center", fontsize=7,
                    color=_ink_on(image.cmap(image.norm(t)) if t is not None else ax.get_facecolor()))
    ax.add_patch(Rectangle((best[2] - 0.5, best[1] - 0.5), 1, 1, fill=False, edgecolor="red", lw=2))
    ax.legend(handles=[Patch(edgecolor="red", fill=False, label=f"fastest: {data['plans'][best[1]][best[2]]}, "
                                                                  f"{best[0]:.2f} s"),
                       Patch(color="#dddddd", label="no plan fits")],
              loc="upper center", bbox_to_anchor=(0.5, -0.16), fontsize=7, ncol=2)
    ax.set_xticks(range(len(pps)))
    ax.set_xticklabels([str(p) for p in pps])
    ax.set_yticks(range(len(tps)))
    ax.set_yticklabels([str(t) for t in tps])
    ax.set_xlabel("pipeline-parallel size (PP)")
    ax.set_ylabel("tensor-parallel size (TP)")
    ax.set_title(data["title"] + "\nengine time of each cell's fastest plan (s)")
    return finish(plt, fig, path)


def _ink_on(rgba) -> str:
    """Black on a light cell, white on a dark one (the cell's relative luminance, ITU-R BT.709)."""
    r, g, b = rgba[:3]
    return "black" if 0.2126 * r + 0.7152 * g + 0.0722 * b > 0.45 else "white"


def moe_ep_figure(data: dict, path: Path) -> dict[str, Any]:
    """Iteration time (the all-to-all part apart) and peak memory (by kind) against the EP size."""
    plt = pyplot()
    pts = data["points"]
    xs = range(len(pts))
    # constrained layout keeps the three-line title (job, plan) above the panels rather than over them
    fig, (left, right) = plt.subplots(1, 2, figsize=(9.0, 4.2), layout="constrained")
    dispatch = [q["dispatch_s"] for q in pts]
    rest = [q["iteration_time_s"] - d for q, d in zip(pts, dispatch)]
    left.bar(xs, rest, color="tab:blue", label="rest of the iteration")
    left.bar(xs, dispatch, bottom=rest, color="tab:red", label="MoE dispatch + combine (all-to-all)")
    for i, q in enumerate(pts):
        left.text(i, q["iteration_time_s"], f"{q['iteration_time_s']:.2f} s\nMFU {q['mfu']:.0%}", ha="center",
                  va="bottom", fontsize=7)
    left.set_ylabel("seconds per iteration")
    left.set_ylim(0, max(q["iteration_time_s"] for q in pts) * 1.25)
    bottom = [0.0] * len(pts)
    for key, label, color in (("states_gib", "weights+grads+optimizer", "tab:blue"),
                              ("activations_gib", "activations", "tab:orange"),
                              ("other_gib", "transient+reserve", "tab:gray")):
        values = [q[key] for q in pts]
        right.bar(xs, values, bottom=bottom, color=color, label=f"{label} (GiB)")
        bottom = [b + v for b, v in zip(bottom, values)]
    cap = data["capacity_gib"]
    right.axhline(cap, color="k", ls="--", lw=1, label=f"GPU memory ({cap:.0f} GiB)")
    right.set_ylabel("peak GiB per GPU (largest stage)")
    for ax in (left, right):
        ax.set_xticks(list(xs))
        ax.set_xticklabels([f"EP {q['ep']}" for q in pts])
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=7, loc="upper right")
    fig.suptitle(data["title"], fontsize=8)
    return finish(plt, fig, path)


# kind -> (the figure_data kind it draws, the function)
FIGURES: dict[str, tuple[str, Callable[[dict, Path], dict]]] = {
    "pareto": ("pareto", pareto_figure),
    "timeline": ("timeline", timeline_figure),
    "days-vs-gpus": ("scaling", days_vs_gpus_figure),
    "mfu-vs-gpus": ("scaling", mfu_vs_gpus_figure),
    "memory-breakdown": ("memory-breakdown", memory_breakdown_figure),
    "memory-vs-micro-batch": ("memory-vs-micro-batch", memory_vs_micro_batch_figure),
    "time-breakdown": ("time-breakdown", time_breakdown_figure),
    "stage-memory": ("stage-memory", stage_memory_figure),
    "parity": ("parity", parity_figure),
    "tp-pp-heatmap": ("tp-pp-heatmap", tp_pp_heatmap_figure),
    "moe-ep": ("moe-ep", moe_ep_figure),
}


def draw(kind: str, data: dict, path: Path) -> dict[str, Any]:
    """Draw figure ``kind`` from its data into ``path``; return what it drew."""
    expected, function = FIGURES[kind]
    assert data["kind"] == expected, f"{kind} draws {expected} data, not {data['kind']}"
    return function(data, path)
