"""How every figure is drawn and written: matplotlib off-screen (Agg), what a drawn figure says read back from it
(``summarize``), and the bytes written atomically with no timestamp, so that a figure regenerates identically.
The figures themselves are ``simulator.outputs.plots``' (and ``plots_goodput``' and ``plots_capacity``').
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

from simulator.spec._io import write_output


def pyplot():
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

    plt.rcParams.update({"svg.hashsalt": "simulator", "figure.dpi": 110, "font.size": 8})
    return plt


def summarize(fig) -> dict[str, Any]:
    """What a figure says: its title and, per visible axes, title, axis labels, legend and texts."""
    legends = [t.get_text() for leg in fig.legends for t in leg.get_texts()]
    axes = []
    for ax in fig.axes:
        if not ax.get_visible():
            continue
        legend = ax.get_legend()
        axes.append({"title": ax.get_title(), "xlabel": ax.get_xlabel(), "ylabel": ax.get_ylabel(),
                     "ylabel_right": [child.get_ylabel() for child in ax.child_axes],
                     "legend": [t.get_text() for t in legend.get_texts()] if legend else [],
                     "texts": [t.get_text() for t in ax.texts]})
    return {"title": fig._suptitle.get_text() if fig._suptitle is not None else "", "legend": legends, "axes": axes}


# The formats a figure is written in, chosen by the file's suffix (no suffix: PNG): those matplotlib writes
# with its own backends or with Pillow, which it requires.
FIGURE_SUFFIXES = (".png", ".svg", ".pdf", ".eps", ".ps", ".jpg", ".jpeg", ".tif", ".tiff", ".webp")


def save(fig, path: Path) -> None:
    """Render in memory in the format the suffix names, then write atomically (``write_output``)."""
    fmt = Path(path).suffix.lstrip(".").lower() or "png"
    buffer = io.BytesIO()
    # No timestamp in the metadata, so regenerating a figure gives the same bytes.
    metadata = {"Software": None} if fmt == "png" else {"Creator": None, "Date": None} if fmt == "svg" else \
        {"Creator": None, "Producer": None, "CreationDate": None}
    fig.savefig(buffer, format=fmt, metadata=metadata, bbox_inches="tight")
    write_output(path, buffer.getvalue(), "figure")


def finish(plt, fig, path: Path) -> dict[str, Any]:
    summary = summarize(fig)
    try:
        save(fig, path)
    finally:
        plt.close(fig)
    return summary
