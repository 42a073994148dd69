"""The capacity figure: each cluster kind's days against its GPUs (P50, with the P10-P90 band) with the deadline
drawn, and every option's cost against its days with the frontier and the answer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from simulator.outputs.plots_base import finish, pyplot


def capacity_figure(result, path: Path) -> dict[str, Any]:
    """Draw ``result`` (a ``CapacityResult``) into ``path`` (PNG, SVG or PDF by its suffix); return what it says."""
    plt = pyplot()
    c = result.confidence.value
    fig, (left, right) = plt.subplots(1, 2, figsize=(12.0, 4.6))
    ok = [o for o in result.options if o.status == "ok" and o.days_p50 is not None]
    clusters = list(dict.fromkeys(o.cluster for o in result.options))
    colors = {name: f"C{i}" for i, name in enumerate(clusters)}
    for name in clusters:
        curve = sorted((o for o in ok if o.cluster == name), key=lambda o: o.gpus)
        if not curve:
            continue
        gpus = [o.gpus for o in curve]
        left.plot(gpus, [o.days_p50 for o in curve], marker="o", color=colors[name], label=f"{name}, P50")
        low = [o.days_p10 for o in curve]
        high = [o.days_p90 if o.days_p90 is not None else o.days_p50 for o in curve]
        left.fill_between(gpus, low, high, color=colors[name], alpha=0.15)
        priced = [o for o in curve if o.days is not None and o.cost_usd is not None]
        right.scatter([o.days for o in priced], [o.cost_usd.value for o in priced], color=colors[name], s=18,
                      label=name)
    if result.deadline_days is not None:
        left.axhline(result.deadline_days, color="k", ls="--", lw=1, label=f"deadline, {result.deadline_days:g} days")
        right.axvline(result.deadline_days, color="k", ls="--", lw=1, label="deadline")
    if result.budget_usd is not None:
        right.axhline(result.budget_usd, color="k", ls=":", lw=1, label="budget")
    front = sorted((o for o in ok if o.on_frontier), key=lambda o: o.days)
    if front:
        right.plot([o.days for o in front], [o.cost_usd.value for o in front], "-", color="tab:gray", lw=1,
                   label="frontier")
    a = result.answer
    if a is not None:
        left.scatter([a.gpus], [a.days], marker="*", s=160, color="k", zorder=5,
                     label=f"answer: {a.gpus:,} GPUs of {a.cluster}, {a.days:.1f} days at {c}")
        right.scatter([a.days], [a.cost_usd.value], marker="*", s=160, color="k", zorder=5, label="answer")
    from matplotlib.ticker import FuncFormatter, NullFormatter

    left.set_xscale("log", base=2)
    left.set_xticks(sorted({o.gpus for o in ok}) or [1])
    left.set_yscale("log")
    left.set_xlabel("GPUs")
    left.set_ylabel("days with failures, checkpoints and restarts")
    left.set_title("days against GPUs: P50, the band P10-P90 of one joint sample")
    right.set_xscale("log")
    right.set_yscale("log")
    right.set_xlabel(f"days at {c}")
    right.set_ylabel(f"cost at {c}, US dollars")
    right.set_title("cost against days: every option searched and the frontier")
    plain = FuncFormatter(lambda x, _: f"{x:,.0f}" if x >= 10 else f"{x:g}")
    dollars = FuncFormatter(lambda y, _: f"${y / 1e6:g}M" if y >= 1e6 else f"${y / 1e3:g}k" if y >= 1e3 else f"${y:g}")
    for ax, y in ((left, plain), (right, dollars)):
        ax.xaxis.set_major_formatter(plain)
        ax.xaxis.set_minor_formatter(NullFormatter() if ax is left else plain)
        ax.yaxis.set_major_formatter(y)
        ax.yaxis.set_minor_formatter(y)
        ax.tick_params(axis="both", which="minor", labelsize=6)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"capacity: {result.binding} binds; {result.binding_note}"[:180], fontsize=8)
    fig.tight_layout()
    return finish(plt, fig, path)
