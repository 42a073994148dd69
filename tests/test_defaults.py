"""One set of defaults: a setting the user leaves out means the same in `plan`, `search`, `sweep`, `plot`
and the Python API, so the same point gives the same answer through each of them."""

from __future__ import annotations

import json

import click
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator import Job, ParallelPlan, SearchRequest, estimate, load_cluster, load_model, search
from simulator.cli import cli
from simulator.cli.options import plan_fields
from simulator.planner.space import plan_template
from simulator.planner.sweep import SweepPoint, SweepSpec, run_point

# the settings every plan of a search shares (the rest is the layout the search varies)
SHARED = ("precision", "fp8_format", "attention_backend", "use_flash_attention", "overlap_grad_reduce",
          "overlap_param_gather", "tp_comm_overlap", "grad_reduce_in_bf16", "accumulate_allreduce_grads_in_fp32",
          "use_precision_aware_optimizer", "fp8_param_gather", "ddp_bucket_size", "cp_comm_type")
TOKENS = 1e9


def _defaults(name: str) -> dict:
    command = cli.get_command(click.Context(cli), name)
    return {p.name: p.default for p in command.params if isinstance(p, click.Option)}


def test_plan_flags_left_out_build_parallel_plans_defaults():
    plan = ParallelPlan.model_validate(plan_fields(_defaults("plan"), 1))
    default = ParallelPlan()
    assert {f: getattr(plan, f) for f in ParallelPlan.model_fields} == \
        {f: getattr(default, f) for f in ParallelPlan.model_fields}


@pytest.mark.parametrize("command", ["search", "plot"])
def test_search_and_plot_share_plans_defaults(command):
    """Each command's own defaults, as it hands them to the search, give plans with ParallelPlan's settings."""
    d = _defaults(command)
    backend = d.get("backend", d.get("attention_backend"))
    req = SearchRequest(model=load_model("gpt3-125m"), cluster=load_cluster("dgx-a100-80gb"), num_gpus=8,
                        global_batch_size=8, precision=d["precision"], attention_backend=backend,
                        overlap_grad_reduce=d.get("overlap", d.get("overlap_grad_reduce")))
    api = SearchRequest(model=req.model, cluster=req.cluster, num_gpus=8, global_batch_size=8)
    default = ParallelPlan()
    for r in (req, api):
        assert {f: getattr(plan_template(r), f) for f in SHARED} == {f: getattr(default, f) for f in SHARED}


def test_a_sweep_left_alone_searches_what_search_does():
    spec = SweepSpec(models=("gpt3-125m",), gpus=(8,), global_batch_sizes=(8,))
    assert spec.points()[0].attention_backend == ParallelPlan().attention_backend
    older = SweepSpec(models=("gpt3-125m",), gpus=(8,), global_batch_sizes=(8,), use_flash_attention=False)
    assert older.points()[0].attention_backend.value == "unfused"


def _plan_flags(plan: ParallelPlan) -> list[str]:
    r = plan.recompute
    flags = ["--tp", str(plan.tensor_parallel_size), "--pp", str(plan.pipeline_parallel_size),
             "--vpp", str(plan.virtual_pipeline_stages), "--mbs", str(plan.micro_batch_size),
             "--gbs", str(plan.global_batch_size), "--sp" if plan.sequence_parallel else "--no-sp",
             "--recompute-granularity", r.granularity.value]
    if r.granularity.value == "full":
        flags += ["--recompute-method", r.method.value, "--recompute-num-layers", str(r.num_layers)]
    if plan.sharding.value != "no_shard":
        flags += ["--data-parallel-sharding-strategy", plan.sharding.value]
    return flags


def _run(*args: str) -> dict:
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


@settings(max_examples=4, deadline=None, derandomize=True)
@given(model=st.sampled_from(["gpt3-125m", "gpt3-350m"]), gpus=st.sampled_from([8, 16]),
       batch=st.sampled_from([32, 64]))
def test_one_point_gives_one_answer_through_sweep_search_plan_and_the_api(model, gpus, batch):
    """The sweep's best plan is the search's (API) best; that plan, given to `plan`, pinned in `search` and
    estimated through the API, has one iteration time and one number of days."""
    row = run_point(SweepPoint(model=model, cluster="dgx-a100-80gb", gpus=gpus, global_batch_size=batch,
                               tokens=TOKENS))
    assert row["status"] == "ok", row
    plan = ParallelPlan.model_validate(row["plan_json"])
    m, c = load_model(model), load_cluster("dgx-a100-80gb")

    req = SearchRequest(model=m, cluster=c, num_gpus=gpus, global_batch_size=batch)
    for top in (1, 5, 10):  # the sweep keeps one plan, `search` five, the API ten: the same one comes first
        assert search(req, tokens=TOKENS, top=top).best.plan == plan
    api = estimate(Job(model=m, cluster=c, plan=plan), tokens=TOKENS)

    common = ["--model", model, "--gpus", str(gpus), "--tokens", str(TOKENS), "--json"]
    planned = _run("plan", *common, *_plan_flags(plan))
    pins = ["--tp", str(plan.tensor_parallel_size), "--pp", str(plan.pipeline_parallel_size),
            "--vpp", str(plan.virtual_pipeline_stages), "--mbs", str(plan.micro_batch_size),
            "--sp" if plan.sequence_parallel else "--no-sp", "--recompute-granularity", plan.recompute.granularity.value,
            "--use-distributed-optimizer" if plan.use_distributed_optimizer else "--no-distributed-optimizer"]
    searched = _run("search", *common, "--gbs", str(batch), "--top", "1", *pins)["plans"][0]

    for answer in (planned, searched):
        assert answer["iteration_time_s"] == pytest.approx(row["iteration_time_s"], rel=1e-9)
        assert answer["training_days"] == pytest.approx(row["training_days"], rel=1e-9)
        assert answer["attention_backend"] == row["attention_backend"] == planned["attention_backend"]
    assert api.iteration_time_s == pytest.approx(row["iteration_time_s"], rel=1e-9)
    assert api.training_days == pytest.approx(row["training_days"], rel=1e-9)
