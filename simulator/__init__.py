"""Performance simulator and capacity planner for Megatron-style GPT training: the Python API.

    from simulator import Job, ParallelPlan, estimate, load_cluster, load_model, search, SearchRequest

    job = Job(model=load_model("llama3-70b"), cluster=load_cluster("dgx-h100"),
              plan=ParallelPlan(tensor_parallel_size=8, pipeline_parallel_size=4, data_parallel_size=8,
                                sequence_parallel=True, global_batch_size=512))
    est = estimate(job, tokens=15e12)          # iteration time, MFU, breakdown, memory, days
    best = search(SearchRequest(model=job.model, cluster=job.cluster, num_gpus=256,
                                global_batch_size=512)).best

``examples/api.py`` runs the whole tour (estimate, search, figures, trace). The names below are
imported on first use, so ``import simulator`` stays light and the CLI starts fast.

``simulator.estimate`` and ``simulator.search`` are the functions of the same names; their
modules are reached with ``from simulator.estimate import ...`` (or ``importlib.import_module``).
"""

from __future__ import annotations

import importlib
import sys
import types

# name -> the module that defines it
_API: dict[str, str] = {
    "load_model": "simulator.model", "ModelSpec": "simulator.model",
    "load_cluster": "simulator.hardware", "ClusterSpec": "simulator.hardware",
    "load_profile": "simulator.profile",
    "ParallelPlan": "simulator.plan", "RecomputePolicy": "simulator.plan", "Job": "simulator.plan",
    "estimate": "simulator.estimate", "simulate_job": "simulator.estimate", "Estimate": "simulator.estimate",
    "memory_plan": "simulator.memory",
    "search": "simulator.search", "SearchRequest": "simulator.search", "SearchPins": "simulator.search",
    "SearchResult": "simulator.search",
    "write_trace": "simulator.trace",
    "SimulatorError": "simulator.errors", "ConfigError": "simulator.errors",
    "InfeasiblePlanError": "simulator.errors",
}
# API functions named like the module that defines them
_SHADOWED = frozenset({"estimate", "search"})

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


class _Package(types.ModuleType):
    """The package, keeping ``estimate`` and ``search`` the functions: Python's import system binds a
    submodule to its package's attribute when it first loads (``simulator.estimate`` = the module),
    which would hide the function of the same name."""

    def __setattr__(self, name: str, value) -> None:
        if name in _SHADOWED and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
