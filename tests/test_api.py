"""The documented Python API: the names import from the package, `import simulator` stays light, and
the example script runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_import_simulator_loads_nothing_heavy():
    code = ("import simulator, sys; print(sorted(m for m in ('numpy', 'scipy', 'pydantic', 'simpy', 'networkx', "
            "'matplotlib', 'torch', 'plotly') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == "[]"


# The public names of ``from simulator import ...``: a contract, so names are added, never dropped.
PUBLIC_NAMES = (
    "ClusterSpec", "ConfigError", "Estimate", "GoodputEstimate", "GoodputSettings", "InfeasiblePlanError", "Job",
    "ModelSpec", "ParallelPlan", "RecomputePolicy", "SearchPins", "SearchRequest", "SearchResult", "SimulatorError",
    "estimate", "goodput", "load_cluster", "load_model", "load_profile", "memory_plan", "search", "simulate_job",
    "write_trace",
)


def test_every_public_name_is_still_there():
    import simulator

    assert set(PUBLIC_NAMES) <= set(simulator.__all__)
    for name in PUBLIC_NAMES:
        assert getattr(simulator, name) is not None


def test_the_api_names_are_the_library_objects():
    import simulator
    from simulator import Job, ParallelPlan, estimate, load_cluster, load_model, search
    from simulator.estimator.prediction import estimate as estimate_function
    from simulator.planner.plan_search import search as search_function

    assert estimate is estimate_function and search is search_function
    assert simulator.estimate is estimate_function and simulator.search is search_function  # no module hides them
    assert set(simulator.__all__) <= set(dir(simulator))
    job = Job(model=load_model("gpt3-1.3b"), cluster=load_cluster("dgx-a100-80gb"),
              plan=ParallelPlan(tensor_parallel_size=2, global_batch_size=4))
    assert estimate(job).iteration_time_s > 0
    try:
        simulator.no_such_name  # noqa: B018
    except AttributeError as exc:
        assert "no_such_name" in str(exc)
    else:
        raise AssertionError("an unknown name must raise AttributeError")


def test_the_example_runs(tmp_path):
    out = subprocess.run([sys.executable, str(REPO / "examples" / "api.py"), str(tmp_path)], capture_output=True,
                         text=True, cwd=tmp_path, timeout=300)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "llama3-8b on 64 x H100-SXM5-80GB, sequence 8,192"
    assert lines[1].startswith("plan: iteration ") and "MFU" in lines[1]
    assert sum(line.startswith("  #") for line in lines) == 3
    assert {p.name for p in tmp_path.iterdir()} == {"timeline.png", "stage-memory.png", "trace.json"}
