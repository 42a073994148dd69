"""`plan` and `search` with failures and checkpoints: expected days printed and in JSON, the launch's
--save-interval, and bad rates, bandwidths and intervals refused in one sentence with exit code 2."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from simulator.cli import cli
from tests.cli.test_bad_input import ok, refused

PLAN = ["plan", "--model", "gpt3-1.3b", "--gpus", "64", "--tp", "2", "--gbs", "512", "--tokens", "3e11"]


def test_plan_prints_ideal_and_expected_days_and_the_interval():
    out = ok(*PLAN, "--mtbf-gpu-hours", "5000", "--launch").output
    assert "ideal " in out and "expected " in out and "P90" in out and "ETTR" in out
    interval = next(line for line in out.splitlines() if line.startswith("checkpoint "))
    every = int(interval.split("every ")[1].split(" ")[0].replace(",", ""))
    assert f"--save-interval {every}" in out


def test_plan_json_has_a_goodput_object_and_keeps_its_keys():
    doc = json.loads(ok(*PLAN, "--json", "--async-save", "--save-interval", "300").output)
    g = doc["goodput"]
    assert g["save_interval"] == 300 and not g["save_interval_optimal"] and g["async_save"]
    assert g["ideal_days"] <= g["expected_days"] <= (g["expected_days_high"] or float("inf"))
    assert g["p10_days"] <= g["p50_days"] <= g["p90_days"]
    assert "--save-interval 300" in doc["megatron_args"] and "--async-save" in doc["megatron_args"]
    assert "training_days" in doc and "iteration_time_s" in doc  # the keys that were there stay
    no_tokens = json.loads(ok(*PLAN[:-2], "--json").output)
    assert no_tokens["goodput"] is None


@pytest.mark.parametrize("flag,value,needle", [
    ("--mtbf-gpu-hours", "0", "--mtbf-gpu-hours"),
    ("--mtbf-gpu-hours", "-5", "--mtbf-gpu-hours"),
    ("--mtbf-gpu-hours", "nan", "--mtbf-gpu-hours"),
    ("--storage-write-gbps", "0", "--storage-write-gbps"),
    ("--storage-write-gbps-per-node", "1e9", "--storage-write-gbps-per-node"),
    ("--save-interval", "0", "--save-interval"),
    ("--save-interval", "1.5", "--save-interval"),
    ("--spare-nodes", "-1", "--spare-nodes"),
])
def test_bad_rates_bandwidths_and_intervals_are_one_sentence(flag, value, needle):
    refused(*PLAN, flag, value, needle=needle)


def test_a_job_that_would_never_finish_is_refused():
    refused("plan", "--model", "gpt3-1.3b", "--gpus", "4096", "--tp", "2", "--gbs", "4096", "--tokens", "3e11",
            "--mtbf-gpu-hours", "1", needle="would take more than")


def test_search_ranks_by_expected_days():
    result = CliRunner().invoke(cli, ["search", "--model", "gpt3-1.3b", "--gpus", "64", "--gbs", "512", "--tokens",
                                      "3e11", "--rank-by", "expected-days", "--top", "3", "--tp", "2", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["rank_by"] == "expected-days"
    keys = [p["rank_key_s"] for p in doc["plans"]]
    assert keys == sorted(keys)
    assert all(p["goodput"]["expected_days"] >= p["goodput"]["ideal_days"] for p in doc["plans"])
    assert any(a.startswith("--save-interval ") for a in doc["megatron_args"])


def test_a_size_the_cluster_data_cannot_finish_still_gets_its_ideal_days():
    # a million GPUs fail every few minutes on the cluster's own rates: a note, not a refusal, unless a flag asked
    args = ["plan", "--model", "gpt3-1.3b", "--gpus", "1048576", "--gbs", "1048576", "--tokens", "3e11", "--json"]
    doc = json.loads(ok(*args).output)
    assert doc["goodput"] is None and doc["training_days"] > 0
    assert any(n.startswith("no expected days") for n in doc["notes"])
    refused(*args, "--async-save", needle="would take more than")


@pytest.mark.parametrize("command", ["plan", "search"])
def test_fewer_tokens_than_one_batch_are_refused_on_both_commands(command):
    refused(command, "--model", "gpt3-125m", "--gpus", "8", "--gbs", "8", "--tokens", "1e-12",
            needle="is fewer than one global batch")


def test_an_asynchronous_save_of_a_short_run_gets_its_expected_days():
    # the save takes longer than the run's compute: the run is long beside its compute, not one failures stretch
    doc = json.loads(ok("plan", "--model", "gpt3-125m", "--gbs", "8", "--tokens", "2e5", "--async-save",
                        "--json").output)
    assert doc["goodput"]["async_save"] and doc["goodput"]["expected_days"] > doc["goodput"]["ideal_days"]
