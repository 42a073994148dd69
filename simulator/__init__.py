"""Performance simulator and capacity planner for Megatron-style GPT training: the Python API.

    from simulator import Job, ParallelPlan, estimate, goodput, load_cluster, load_model, search, SearchRequest

    job = Job(model=load_model("llama3-70b"), cluster=load_cluster("dgx-h100"),
              plan=ParallelPlan(tensor_parallel_size=8, pipeline_parallel_size=4, data_parallel_size=8,
                                sequence_parallel=True, global_batch_size=512))
    est = estimate(job, tokens=15e12)          # iteration time, MFU, breakdown, memory, days
    days = goodput(job, est)                   # expected days with failures, checkpoints, restarts; P10-P90
    best = search(SearchRequest(model=job.model, cluster=job.cluster, num_gpus=256,
                                global_batch_size=512)).best

``examples/api.py`` runs the whole tour (estimate, search, figures, trace). The names below are
imported on first use, so ``import simulator`` stays light and the CLI starts fast.

The package is laid out as its data flows, each subpackage importing only those before it
(``docs/architecture.md`` draws it; ``tests/test_architecture.py`` keeps it so):

    spec -> graph -> cost -> schedule -> estimator -> planner | measure -> outputs -> cli
"""

from __future__ import annotations

import importlib

# name -> the module that defines it
_API: dict[str, str] = {
    "load_model": "simulator.spec.catalog", "ModelSpec": "simulator.spec.model",
    "load_cluster": "simulator.spec.hardware", "ClusterSpec": "simulator.spec.hardware",
    "load_profile": "simulator.cost.profile",
    "ParallelPlan": "simulator.spec.parallel_plan", "RecomputePolicy": "simulator.spec.plan_types",
    "Job": "simulator.spec.plan",
    "plan_name": "simulator.spec.plan_names",
    "estimate": "simulator.estimator.prediction", "simulate_job": "simulator.estimator.prediction",
    "Estimate": "simulator.estimator.prediction",
    "memory_plan": "simulator.estimator.memory",
    "goodput": "simulator.estimator.goodput", "GoodputSettings": "simulator.estimator.goodput",
    "GoodputEstimate": "simulator.estimator.goodput",
    "search": "simulator.planner.plan_search", "SearchRequest": "simulator.planner.plan_search",
    "SearchPins": "simulator.planner.plan_search", "SearchResult": "simulator.planner.plan_search",
    "write_trace": "simulator.outputs.trace",
    "SimulatorError": "simulator.spec.errors", "ConfigError": "simulator.spec.errors",
    "InfeasiblePlanError": "simulator.spec.errors",
}

__all__ = sorted(_API)


def __getattr__(name: str):
    module = _API.get(name)
    if module is None:
        raise AttributeError(f"module 'simulator' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_API))
