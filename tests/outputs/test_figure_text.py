"""The six figures whose text ran together are read back as drawn: no two text boxes overlap (titles,
panel titles, tick labels, legend texts, point and cell labels), memory_breakdown's legend covers no bar,
the TP x PP heat map's numbers contrast with their cells, mfu_vs_gpus' labels stay off its line, and
moe_ep's title stands above its panels."""

from __future__ import annotations

import itertools

import pytest

from simulator.cli.options import job_from_options
from simulator.estimator.prediction import simulate_job
from simulator.measure import korthikanti as k
from simulator.outputs import figure_data as fd
from simulator.outputs import plots, plots_base
from simulator.planner.plan_search import SearchRequest, search
from simulator.schedule.schedules import warmup_forwards
from simulator.spec.catalog import PRESETS
from simulator.spec.hardware import load_cluster


@pytest.fixture
def drawn(monkeypatch):
    """Draw a figure and hand back the matplotlib figure as it was saved (rendered, before it is closed)."""
    figures = []

    monkeypatch.setattr(plots_base, "save", lambda fig, path: figures.append(fig))

    def draw(kind, data, tmp_path):
        from matplotlib.backends.backend_agg import FigureCanvasAgg

        plots.draw(kind, data, tmp_path / f"{kind}.png")
        fig = figures[-1]
        FigureCanvasAgg(fig)  # closing the figure took its canvas
        fig.canvas.draw()
        return fig

    return draw


def _axis_texts(ax) -> list:
    """An axes' titles, axis labels, texts, legend and the tick labels it draws (an axis keeps ticks outside
    its limits that are never drawn)."""
    out = [ax.title, ax._left_title, ax._right_title, ax.xaxis.label, ax.yaxis.label, *ax.texts,
           ax.xaxis.get_offset_text(), ax.yaxis.get_offset_text()]
    legend = ax.get_legend()
    if legend is not None:
        out += [*legend.get_texts(), legend.get_title()]
    for axis in (ax.xaxis, ax.yaxis):
        lo, hi = sorted(axis.get_view_interval())
        for tick in axis.get_major_ticks() + axis.get_minor_ticks():
            if lo - 1e-9 * abs(hi - lo) <= tick.get_loc() <= hi + 1e-9 * abs(hi - lo):
                out += [tick.label1, tick.label2]
    for child in ax.child_axes:
        out += _axis_texts(child)
    return out


def _texts(fig):
    """Every visible, non-empty text the figure shows, with its box on the canvas."""
    renderer = fig.canvas.get_renderer()
    texts = [t for t in (fig._suptitle, *fig.texts) if t is not None]
    for legend in fig.legends:
        texts += legend.get_texts()
    for ax in fig.axes:
        if ax.get_visible():
            texts += _axis_texts(ax)
    out = []
    for text in dict.fromkeys(texts):  # the suptitle is also among the figure's texts
        if text.get_visible() and text.get_text().strip():
            out.append((text.get_text(), text.get_window_extent(renderer)))
    return out


def _overlaps(fig) -> list[tuple[str, str]]:
    texts = _texts(fig)
    return [(a, b) for (a, box_a), (b, box_b) in itertools.combinations(texts, 2)
            if box_a.width and box_b.width and box_a.overlaps(box_b)
            and min(box_a.x1, box_b.x1) - max(box_a.x0, box_b.x0) > 0.5
            and min(box_a.y1, box_b.y1) - max(box_a.y0, box_b.y0) > 0.5]


@pytest.fixture(scope="module")
def searched():
    req = SearchRequest(model=PRESETS["gpt3-1.3b"], cluster=load_cluster("dgx-a100-80gb"), num_gpus=16,
                        global_batch_size=32)
    return req, search(req, top=4)


def test_tp_pp_heatmap_numbers_are_legible(tmp_path, drawn, searched):
    req, result = searched
    fig = drawn("tp-pp-heatmap", fd.tp_pp_heatmap_data(result, req), tmp_path)
    assert _overlaps(fig) == []
    ax = fig.axes[0]
    image = ax.images[0]
    for text in ax.texts:
        if text.get_text() == "-":
            continue
        # the number's ink and its cell: one light and one dark
        r, g, b = image.cmap(image.norm(float(text.get_text())))[:3]
        light_cell = 0.2126 * r + 0.7152 * g + 0.0722 * b > 0.45
        assert text.get_color() == ("black" if light_cell else "white"), text.get_text()


def test_zoomed_timeline_labels_stand_apart(tmp_path, drawn):
    job = job_from_options(model="gpt3-1.3b", gpus=16, tensor_parallel_size=2, pipeline_parallel_size=4,
                           virtual_pipeline_stages=2, sequence_parallel=True, global_batch_size=64)
    sim = simulate_job(job, record=True)
    plan = job.plan
    m, v = plan.num_micro_batches, plan.virtual_pipeline_stages
    warm = warmup_forwards(0, plan.pipeline_parallel_size, m, v)
    for window in (None, (max(warm - 8, 0), min(warm + 16, 2 * m * v))):
        fig = drawn("timeline", fd.timeline_data(sim, job, window), tmp_path)
        assert _overlaps(fig) == []
    assert fig.axes[0].texts, "the zoomed timeline labels the steps that have room"


def test_memory_breakdown_titles_and_legend_clear(tmp_path, drawn):
    jobs = [k.table5_job(next(r for r in k.table5_rows() if k.MODELS[r["model"]["params_b"]] == name))
            for name in ("megatron-22b", "gpt3-175b", "mt-nlg-530b", "megatron-1t")]
    fig = drawn("memory-breakdown", fd.memory_breakdown_data(jobs, "Memory per GPU by strategy, first pipeline "
                                                             "stage, Table 3 configurations"), tmp_path)
    assert _overlaps(fig) == []
    renderer = fig.canvas.get_renderer()
    for ax in fig.axes:
        legend = ax.get_legend()
        if legend is None:
            continue
        box = legend.get_window_extent(renderer)
        for other in fig.axes:
            for bar in other.patches:
                assert not box.overlaps(bar.get_window_extent(renderer)), "the legend covers a bar"


def test_parity_tick_labels_stand_apart(tmp_path, drawn):
    fig = drawn("parity", fd.parity_data(), tmp_path)
    assert _overlaps(fig) == []


def test_scaling_labels_stay_off_the_lines(tmp_path, drawn):
    req = SearchRequest(model=PRESETS["gpt3-1.3b"], cluster=load_cluster("dgx-a100-80gb"), num_gpus=16,
                        global_batch_size=64)
    data = fd.scaling_data(req, (8, 16, 32, 64), 10e9)
    for kind in ("mfu-vs-gpus", "days-vs-gpus"):
        fig = drawn(kind, data, tmp_path)
        assert _overlaps(fig) == []
        ax = fig.axes[0]
        renderer = fig.canvas.get_renderer()
        assert len(ax.texts) == len(data["points"])
        for text in ax.texts:
            box = text.get_window_extent(renderer)
            for line in ax.lines:
                xy = line.get_transform().transform(line.get_xydata())
                for (x0, y0), (x1, y1) in zip(xy[:-1], xy[1:]):
                    assert not any(box.contains(x0 + f / 64 * (x1 - x0), y0 + f / 64 * (y1 - y0))
                                   for f in range(65)), (kind, text.get_text())


def test_moe_ep_title_stands_clear_of_its_panels(tmp_path, drawn):
    from simulator.outputs.report_moe import _job

    fig = drawn("moe-ep", fd.moe_ep_data(_job(1)), tmp_path)
    assert _overlaps(fig) == []
    renderer = fig.canvas.get_renderer()
    title = fig._suptitle.get_window_extent(renderer)
    for ax in fig.axes:
        # the title's lowest line sits above each panel: its frame and every text it draws
        top = max([ax.get_window_extent(renderer).y1]
                  + [t.get_window_extent(renderer).y1 for t in _axis_texts(ax) if t.get_visible() and t.get_text().strip()])
        assert title.y0 >= top, "the figure's title runs into a panel"

