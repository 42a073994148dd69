"""`simulator memory` through click's CliRunner: the table, the JSON keys, and bad input -> exit 2, one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from simulator.cli import cli
from simulator.cli.options import job_from_options
from simulator.estimator.memory import memory_plan

DEMO = ["--model", "gpt3-175b", "--cluster", "dgx-a100-80gb", "--gpus", "1024", "--tp", "8", "--pp", "16", "--sp",
        "--recompute-granularity", "selective", "--mbs", "1", "--gbs", "1536"]


def run(*args: str):
    return CliRunner().invoke(cli, list(args))


def test_table_lists_every_stage_and_the_verdict():
    result = run("memory", *DEMO)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:2] == ["stage", "layers"])
    assert lines[header].split() == ["stage", "layers", "weights", "grads", "optimizer", "activations",
                                     "in-flight", "transient", "reserve", "peak", "fits"]
    rows = [line.split() for line in lines[header + 2: header + 2 + 16]]
    assert [int(r[0]) for r in rows] == list(range(16))
    assert [int(r[6]) for r in rows] == [16 - i for i in range(16)]  # 1F1B: stage i holds p - i
    assert lines[-1].startswith("fits:")


def test_json_keys_and_values_match_the_library():
    result = run("memory", *DEMO, "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    for key in ("weights_bytes", "gradients_bytes", "optimizer_bytes", "activations_bytes", "peak_bytes"):
        assert all(isinstance(s[key], int) for s in data["stages"])
    expected = memory_plan(job_from_options(gpus=1024, tensor_parallel_size=8, pipeline_parallel_size=16,
                                            sequence_parallel=True, recompute_granularity="selective",
                                            global_batch_size=1536))
    assert data["peak_bytes"] == expected.peak_bytes and data["fits"] is expected.fits is True
    assert len(data["stages"]) == 16 and data["plan"]["data_parallel_size"] == 8


def test_long_and_short_flags_are_the_same():
    long = run("memory", "--json", "--tensor-model-parallel-size", "8", "--pipeline-model-parallel-size", "4",
               "--virtual-pipeline-model-parallel-size", "2", "--sequence-parallel", "--micro-batch-size", "2",
               "--global-batch-size", "16", "--data-parallel-size", "2")
    short = run("memory", "--json", "--tp", "8", "--pp", "4", "--vpp", "2", "--sp", "--mbs", "2", "--gbs", "16",
                "--dp", "2")
    assert long.exit_code == short.exit_code == 0, long.output + short.output
    assert json.loads(long.output) == json.loads(short.output)


def test_help_lists_memory():
    result = run("--help")
    assert result.exit_code == 0 and "memory" in result.output
    assert run("memory", "--help").exit_code == 0


def test_python_dash_m_runs_the_same_cli():
    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(repo)}
    done = subprocess.run([sys.executable, "-m", "simulator", "memory", "--model", "nope"], cwd=repo, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and "unknown model 'nope'" in done.stderr


@pytest.fixture
def bad_yaml(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("num_layers: [1, 2\nhidden_size: 12\n")
    return str(path)


@pytest.fixture
def bad_cluster_yaml(tmp_path):
    path = tmp_path / "cluster.yaml"
    path.write_text("name: tiny\ngpu: A100-SXM4-80GB\ngpus_per_node: -8\n")
    return str(path)


BAD = {
    "unknown model": (["--model", "gpt-9"], "gpt-9"),
    "unknown cluster": (["--cluster", "dgx-z"], "dgx-z"),
    "zero size": (["--tp", "0"], "0"),
    "negative size": (["--mbs", "-4"], "-4"),
    "tp does not divide heads": (["--tp", "5"], "tensor_parallel_size=5"),
    "product is not gpus": (["--gpus", "64", "--tp", "8", "--pp", "4", "--dp", "4"], "gpus(64)"),
    "gpus not divisible": (["--gpus", "100", "--tp", "8"], "gpus(100)"),
    "sp without tp": (["--sp"], "sequence_parallel"),
    "recompute layers without full": (["--recompute-num-layers", "2"], "num_layers=2"),
    "interleaving does not divide layers": (["--pp", "8", "--vpp", "5", "--gbs", "8"], "num_layers=96"),
    "batch not divisible": (["--gbs", "3", "--mbs", "2"], "global_batch_size=3"),
    "unknown choice": (["--recompute-granularity", "some"], "some"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_is_one_line_and_exit_2(case):
    args, needle = BAD[case]
    result = run("memory", *args)
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()  # CliRunner mixes stderr into output
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize("which", ["model", "cluster"])
def test_malformed_yaml_is_one_line_and_exit_2(which, bad_yaml, bad_cluster_yaml):
    path = bad_yaml if which == "model" else bad_cluster_yaml
    result = run("memory", f"--{which}", path)
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and path in lines[0], result.output


def test_model_file_is_accepted(tmp_path):
    path = tmp_path / "tiny.yaml"
    path.write_text("num_layers: 4\nhidden_size: 256\nnum_attention_heads: 8\nseq_length: 512\n")
    result = run("memory", "--model", str(path), "--tp", "2", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["model"] == "tiny"


def test_stderr_carries_the_error_and_stdout_stays_clean():
    result = CliRunner().invoke(cli, ["memory", "--model", "gpt-9", "--json"])
    assert result.exit_code == 2 and result.stdout == "" and "gpt-9" in result.stderr
