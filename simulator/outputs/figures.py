"""Which figures a plan or a search can draw, and drawing them: what ``simulator plot KIND`` and the
``--plots DIR`` option of ``plan`` and ``search`` call.

- A plan's figures: its pipeline timeline (optionally zoomed to a window of steps), per-stage
  memory, memory against micro-batch for each recompute policy, its memory under each strategy and
  its time breakdown.
- A search's figures: the Pareto front, the time breakdown of the top plans, the TP x PP heat map,
  MFU and training days against GPU count, and the best plan's figures.
- The parity of every validation data set, which does not depend on the plan.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

if TYPE_CHECKING:  # the engine and the search load when a figure is computed, not when the CLI starts
    from simulator.estimator.prediction import Simulation
    from simulator.planner.plan_search import SearchRequest, SearchResult
    from simulator.spec.plan import Job

PLAN_KINDS = ("timeline", "stage-memory", "memory-vs-micro-batch", "memory-breakdown", "time-breakdown")
SEARCH_KINDS = ("pareto", "time-breakdown", "tp-pp-heatmap", "days-vs-gpus", "mfu-vs-gpus")
# moe-ep: a plan's figure for mixture-of-experts models only, so not among every plan's figures
KINDS = ("pareto", "timeline", "days-vs-gpus", "mfu-vs-gpus", "memory-breakdown", "memory-vs-micro-batch",
         "time-breakdown", "stage-memory", "parity", "tp-pp-heatmap", "moe-ep")


def default_gpu_counts(num_gpus: int) -> list[int]:
    """A quarter to four times the request, by powers of two."""
    return [num_gpus // d for d in (4, 2) if num_gpus % d == 0] + [num_gpus * k for k in (1, 2, 4)]


def plan_data(kind: str, job: Job, sim: Simulation | None = None, profile=None,
              steps: tuple[int, int] | None = None) -> dict[str, Any]:
    """The data of one of a plan's figures."""
    from simulator.estimator.prediction import simulate_job
    from simulator.outputs import figure_data as fd

    if kind == "timeline":
        sim = sim if sim is not None and sim.engine.intervals else simulate_job(job, profile, record=True)
        return fd.timeline_data(sim, job, steps)
    if kind == "stage-memory":
        return fd.stage_memory_data(job)
    if kind == "memory-vs-micro-batch":
        return fd.memory_vs_micro_batch_data(job)
    if kind == "memory-breakdown":
        return fd.memory_breakdown_data([job], fd.job_title(job))
    if kind == "time-breakdown":
        est = sim.estimate if sim is not None else simulate_job(job, profile).estimate
        return fd.time_breakdown_data([(job.plan, est)], fd.job_title(job))
    if kind == "parity":
        return fd.parity_data(profile)
    if kind == "moe-ep":
        return fd.moe_ep_data(job, profile)
    raise ValueError(f"{kind!r} is not a figure of one plan")


def search_data(kind: str, result: SearchResult, req: SearchRequest, profile=None, tokens: float | None = None,
                gpu_counts: Iterable[int] | None = None) -> dict[str, Any]:
    """The data of one of a search's figures (``days-vs-gpus`` and ``mfu-vs-gpus`` search again at each count)."""
    from simulator.outputs import figure_data as fd

    if kind == "pareto":
        return fd.pareto_data(result, req)
    if kind == "time-breakdown":
        return fd.search_time_breakdown_data(result, req)
    if kind == "tp-pp-heatmap":
        return fd.tp_pp_heatmap_data(result, req, profile)
    if kind in ("days-vs-gpus", "mfu-vs-gpus"):
        counts = list(gpu_counts) if gpu_counts else default_gpu_counts(req.num_gpus)
        return fd.scaling_data(req, counts, tokens, profile)
    raise ValueError(f"{kind!r} is not a figure of a search")


def draw(kind: str, data: dict[str, Any], path: Path) -> dict[str, Any]:
    if kind == "goodput":  # the report's figure of days with failures, drawn in its own module
        from simulator.outputs.plots_goodput import goodput_figure

        return goodput_figure(data, path)
    if kind == "capacity":  # the report's capacity question, drawn as `capacity --plot` draws it
        from simulator.outputs.plots_capacity import capacity_figure
        from simulator.planner.capacity import CapacityResult

        # the report keeps no elapsed time, and the figure draws none
        return capacity_figure(CapacityResult.model_validate({**data, "elapsed_s": 0.0}), path)
    from simulator.outputs.plots import draw as draw_figure

    return draw_figure(kind, data, path)


def write_plan_figures(job: Job, out: Path, sim: Simulation | None = None, profile=None,
                       kinds: Iterable[str] | None = None) -> dict[str, str]:
    """The figures of one plan (and the parity figure; for an MoE model, moe-ep) into ``out``; returns
    kind -> path."""
    from simulator.estimator.prediction import simulate_job

    if kinds is None:
        kinds = PLAN_KINDS + ("parity",) + (("moe-ep",) if job.model.is_moe else ())
    sim = sim if sim is not None and sim.engine.intervals else simulate_job(job, profile, record=True)
    written = {}
    for kind in kinds:
        path = Path(out) / f"{kind}.png"
        draw(kind, plan_data(kind, job, sim, profile), path)
        written[kind] = str(path)
    return written


def write_search_figures(result: SearchResult, req: SearchRequest, out: Path, profile=None,
                         tokens: float | None = None) -> dict[str, str]:
    """Every figure of a search into ``out``: its own, then the best plan's; returns kind -> path.
    Training days need ``tokens``; without them ``days-vs-gpus`` is left out."""
    from simulator.spec.plan import Job

    written = {}
    scaling = None
    for kind in SEARCH_KINDS:
        if kind == "days-vs-gpus" and tokens is None:
            continue
        if kind in ("days-vs-gpus", "mfu-vs-gpus"):
            scaling = scaling or search_data(kind, result, req, profile, tokens)
            data = scaling
        else:
            data = search_data(kind, result, req, profile, tokens)
        path = Path(out) / f"{kind}.png"
        draw(kind, data, path)
        written[kind] = str(path)
    job = Job(model=req.model, cluster=req.cluster, plan=result.best.plan)
    # the top plans' time breakdown stays
    kinds = [k for k in PLAN_KINDS + ("parity",) + (("moe-ep",) if job.model.is_moe else ()) if k not in written]
    return written | write_plan_figures(job, out, profile=profile, kinds=kinds)
