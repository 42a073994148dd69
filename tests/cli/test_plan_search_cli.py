"""`simulator plan` and `simulator search` from the command line: JSON contract, traces, exit codes."""

import json

import pytest
from click.testing import CliRunner

from simulator.cli import cli

PLAN_175B = ["--gpus", "1024", "--tp", "8", "--pp", "16", "--vpp", "2", "--sp", "--recompute-granularity", "selective",
             "--gbs", "1536"]


def run(*args):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def test_plan_json_has_the_public_keys(tmp_path):
    result = run("plan", *PLAN_175B, "--tokens", "300e9", "--json", "--trace", str(tmp_path / "t.json"))
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    for key in ("iteration_time_s", "mfu", "hfu", "tokens_per_s", "training_days", "breakdown"):
        assert key in doc
    assert doc["memory"]["fits"] is True and doc["memory"]["peak_bytes"] > 0
    assert 15 < doc["training_days"] < 35
    trace = json.loads((tmp_path / "t.json").read_text())
    assert {e["pid"] for e in trace["traceEvents"]} == set(range(16))


def test_plan_text_names_the_breakdown():
    result = run("plan", *PLAN_175B)
    assert result.exit_code == 0
    assert "pipeline bubble" in result.output and "MFU" in result.output


@pytest.mark.parametrize("args,needle", [
    (["plan", "--model", "nope"], "unknown model"),
    (["plan", "--tp", "16", "--gpus", "16"], "tensor_parallel_size=16"),
    (["plan", "--tp", "5", "--gpus", "5"], "tensor_parallel_size=5"),
    (["plan", "--gpus", "64", "--tp", "8", "--pp", "4", "--dp", "4"], "Invalid parallel dims"),
    (["plan", "--profile", "/nonexistent.json"], "profile"),
    (["search", "--gpus", "8", "--gbs", "8"], "GiB too many"),
    (["search", "--gpus", "1024", "--gbs", "1536", "--tp", "3"], "gpus(1024) is not divisible by tp(3)"),
])
def test_bad_input_is_one_line_and_exit_2(args, needle):
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2, result.output
    assert needle in result.output
    assert "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_search_json_and_pareto(tmp_path):
    png = tmp_path / "pareto.png"
    result = run("search", "--model", "gpt3-13b", "--gpus", "64", "--gbs", "128", "--top", "3", "--json",
                 "--pareto", str(png))
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert len(doc["plans"]) == 3
    times = [p["iteration_time_s"] for p in doc["plans"]]
    assert times == sorted(times)
    assert {"plan", "mfu", "memory", "breakdown"} <= set(doc["plans"][0])
    assert any(a.startswith("--tensor-model-parallel-size") for a in doc["megatron_args"])
    assert "tensor_model_parallel_size" in doc["nemo_yaml"]
    assert png.stat().st_size > 10_000


def test_seq_length_overrides_the_model():
    short = json.loads(run("plan", "--model", "gpt3-1.3b", "--seq-length", "1024", "--json").output)
    full = json.loads(run("plan", "--model", "gpt3-1.3b", "--json").output)
    assert short["iteration_time_s"] < full["iteration_time_s"]  # half the tokens per sequence
    assert short["memory"]["peak_bytes"] < full["memory"]["peak_bytes"]


@pytest.mark.parametrize("gpus", ["8", "16"])
def test_a_bucket_of_one_parameter_is_answered_at_once(tmp_path, gpus):
    """--ddp-bucket-size 1 splits every chunk's gradients into tens of millions of buckets; the engines queue
    them in closed form, so the answer (and its trace) comes as fast as for Megatron's default buckets."""
    import math
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(repo), os.environ.get("PYTHONPATH", "")])}
    args = ["plan", "--model", "gpt3-760m", "--tp", "4", "--pp", "2", "--gpus", gpus, "--gbs", "16",
            "--overlap-grad-reduce", "--json"]
    docs = []
    for extra in (["--ddp-bucket-size", "1", "--trace", str(tmp_path / "t.json")], []):
        run_ = subprocess.run([sys.executable, "-m", "simulator", *args, *extra], capture_output=True, text=True,
                              timeout=30, env=env)
        assert run_.returncode == 0, run_.stderr[-2000:]
        docs.append(json.loads(run_.stdout))
    tiny, default = docs
    assert math.isfinite(tiny["iteration_time_s"]) and tiny["iteration_time_s"] > 0
    if gpus == "16":  # over DP 2 every bucket pays a collective's latency: tens of millions take far longer
        assert tiny["breakdown"]["data_parallel_s"] > 10 * default["breakdown"]["data_parallel_s"]
    assert json.loads((tmp_path / "t.json").read_text())["traceEvents"]
