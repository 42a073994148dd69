"""The figure of days with failures: ETTR and days against the GPU count for a few checkpoint costs, and where
the time goes (the data: ``simulator.outputs.report_goodput.goodput_data``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from simulator.outputs.plots_base import finish, pyplot


def goodput_figure(data: dict, path: Path) -> dict[str, Any]:
    """ETTR and expected days against the GPU count for each checkpoint cost, and where the time goes."""
    assert data["kind"] == "goodput", f"goodput draws goodput data, not {data['kind']}"
    plt = pyplot()
    pts = data["points"]
    gpus = [q["gpus"] for q in pts]
    fig, (left, middle, right) = plt.subplots(1, 3, figsize=(13.0, 3.8))
    for i, save_s in enumerate(b["save_s"] for b in pts[0]["by_save_cost"]):
        left.plot(gpus, [q["by_save_cost"][i]["ettr"] * 100 for q in pts], marker="o", label=f"save {save_s:.0f} s")
        middle.plot(gpus, [q["by_save_cost"][i]["expected_days"] for q in pts], marker="o",
                    label=f"expected, save {save_s:.0f} s")
    middle.plot(gpus, [q["ideal_days"] for q in pts], "k--", label="ideal (no failure)")
    left.set_ylabel("ETTR (%)")
    middle.set_ylabel("days")
    middle.set_yscale("log")
    xs = range(len(pts))
    bottom = [0.0] * len(pts)
    for key, label, color in (("compute_days", "compute", "tab:blue"), ("checkpoint_days", "checkpoints", "tab:green"),
                              ("lost_work_days", "lost work", "tab:red"), ("restart_days", "restarts", "tab:gray")):
        values = [q["split"][key] / q["expected_days"] * 100 for q in pts]
        right.bar(xs, values, bottom=bottom, color=color, label=label)
        bottom = [b + v for b, v in zip(bottom, values)]
    right.set_xticks(list(xs))
    right.set_xticklabels([f"{g:,}" for g in gpus], fontsize=7)
    right.set_ylim(min(q["split"]["compute_days"] / q["expected_days"] * 100 for q in pts) - 5, 100)
    right.set_ylabel("% of the expected run")
    for ax in (left, middle):
        ax.set_xscale("log", base=2)
    for ax in (left, middle, right):
        ax.set_xlabel("GPUs")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(data["title"], fontsize=8)
    return finish(plt, fig, path)
