"""Sweeps: one search per grid point, the same rows from every executor, resumable, bad specs refused."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from simulator.cli import cli
from simulator.planner.sweep import SweepSpec, load_spec, run_sweep

REPO = Path(__file__).resolve().parents[2]
SPEC = SweepSpec(models=("gpt3-125m", "gpt3-350m"), gpus=(8, 16), global_batch_sizes=(32,), tokens=1e9)


def _strip(rows):
    return [{k: v for k, v in r.items()} for r in rows]


def test_rows_follow_the_grid_and_a_point_without_a_plan_says_why(tmp_path):
    spec = SweepSpec(models=("gpt3-125m",), gpus=(8, 11), global_batch_sizes=(32,))
    rows = run_sweep(spec, tmp_path, workers=1)
    assert [(r["model"], r["gpus"]) for r in rows] == [("gpt3-125m", 8), ("gpt3-125m", 11)]
    ok, none = rows
    assert ok["status"] == "ok" and ok["iteration_time_s_low"] <= ok["iteration_time_s"] <= ok["iteration_time_s_high"]
    assert none["status"] == "no plan" and none["message"].endswith(("GPU count or batch", "more memory"))
    header = (tmp_path / "results.csv").read_text().splitlines()[0]
    assert header.startswith("model,cluster,gpus,global_batch_size")


def test_processes_give_the_rows_of_one_process_and_reruns_skip_what_is_done(tmp_path):
    one = run_sweep(SPEC, tmp_path / "one", workers=1)
    two = run_sweep(SPEC, tmp_path / "two", workers=2)
    assert _strip(one) == _strip(two)
    calls = []
    again = run_sweep(SPEC, tmp_path / "one", workers=1, progress=lambda done, total: calls.append(total))
    assert again == one and calls == []  # every point was already there


@pytest.mark.slow  # starts a local Ray instance (about 20 s)
def test_local_ray_gives_the_rows_of_local_processes(tmp_path):
    pytest.importorskip("ray")
    local = run_sweep(SPEC, tmp_path / "local", workers=2)
    ray_rows = run_sweep(SPEC, tmp_path / "ray", ray_address="local", workers=2)
    assert _strip(ray_rows) == _strip(local)


def test_cli_writes_table_and_figures_and_refuses_a_bad_spec(tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text("models: [gpt3-125m]\ngpus: [8]\nglobal_batch_sizes: [16]\ntokens: 1e9\n")
    result = CliRunner().invoke(cli, ["sweep", str(spec), "--out", str(tmp_path / "out"), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)[0]["status"] == "ok"
    assert (tmp_path / "out" / "figures" / "days_vs_gpus.png").exists()
    bad = tmp_path / "bad.yaml"
    bad.write_text("models: [gpt3-125m]\ngpus: [0]\nglobal_batch_sizes: [16]\n")
    result = CliRunner().invoke(cli, ["sweep", str(bad), "--out", str(tmp_path / "o2")])
    assert result.exit_code == 2 and "Traceback" not in result.output


@pytest.mark.parametrize("line,field", [
    ("gpus: [true]", "gpus"),
    ("global_batch_sizes: [true]", "global_batch_sizes"),
    ("seq_lengths: [false]", "seq_lengths"),
    ("tokens: true", "tokens"),
    ('gpus: ["8"]', "gpus"),
    ("use_flash_attention: 1", "use_flash_attention"),
])
def test_a_flag_or_text_where_a_number_belongs_is_refused_naming_the_field(tmp_path, line, field):
    spec = tmp_path / "spec.yaml"
    lines = {"models": "models: [gpt3-125m]", "gpus": "gpus: [8]", "global_batch_sizes": "global_batch_sizes: [8]"}
    lines[line.split(":")[0]] = line
    spec.write_text("\n".join(lines.values()) + "\n")
    result = CliRunner().invoke(cli, ["sweep", str(spec), "--out", str(tmp_path / "out")])
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    message = result.stderr.strip()
    assert len(message.splitlines()) == 1 and f"field '{field}'" in message, message
    assert not (tmp_path / "out").exists()  # refused before any point is searched


def test_tokens_as_yaml_reads_them_still_count(tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text("models: [gpt3-125m]\ngpus: [8]\nglobal_batch_sizes: [8]\ntokens: 300e9\n")  # YAML 1.1: text
    assert load_spec(spec).tokens == 300e9


def _children(pid: int) -> set[int]:
    kids = set()
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        kids.update(int(k) for k in task.read_text().split())
    return kids


def _running(pid: int) -> bool:
    try:  # a zombie has exited: only its reaper has not read its status yet
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads a process's children from /proc")
def test_a_killed_sweep_takes_its_workers_with_it(tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text("models: [gpt3-1.3b, gpt3-2.7b]\ngpus: [8, 16, 32, 64]\nglobal_batch_sizes: [512]\n")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    sweep = subprocess.Popen([sys.executable, "-m", "simulator", "sweep", str(spec), "--out", str(tmp_path / "out"),
                              "--workers", "2"], cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    workers: set[int] = set()
    try:
        deadline = time.monotonic() + 120  # the workers start once the spec is read (an import or two)
        while len(workers) < 2 and sweep.poll() is None and time.monotonic() < deadline:
            workers |= _children(sweep.pid)
            time.sleep(0.05)
        assert len(workers) >= 2, "the sweep never started its workers"
        sweep.send_signal(signal.SIGKILL)
        sweep.wait()
        deadline = time.monotonic() + 30  # generous: a worker watching its parent notices within a second
        while any(map(_running, workers)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(map(_running, workers)), [w for w in workers if _running(w)]
    finally:
        if sweep.poll() is None:
            sweep.kill()
        for pid in workers:
            if _running(pid):
                os.kill(pid, signal.SIGKILL)


def test_rows_carry_expected_days_and_ettr_in_new_columns(tmp_path):
    from simulator.planner.sweep import COLUMNS

    spec = SweepSpec(models=("gpt3-125m",), gpus=(8,), global_batch_sizes=(32,), tokens=1e9)
    row, = run_sweep(spec, tmp_path / "with", workers=1)
    assert row["training_days"] <= row["expected_days"] <= row["expected_days_high"]
    assert row["expected_days_low"] <= row["expected_days"] and 0 < row["ettr"] <= 1
    header, line = (tmp_path / "with" / "results.csv").read_text().splitlines()
    # appended: every column that was there keeps its place
    assert header.split(",")[:20] == list(COLUMNS[:20]) and header.endswith(",expected_days,expected_days_low,"
                                                                            "expected_days_high,ettr")
    assert all(line.split(",")[-4:])
    assert json.loads((tmp_path / "with" / "results.json").read_text())[0]["ettr"] == row["ettr"]
    # without tokens there are no days to expect: the cells are empty
    untimed, = run_sweep(spec.model_copy(update=dict(tokens=None)), tmp_path / "without", workers=1)
    assert "expected_days" not in untimed
    assert (tmp_path / "without" / "results.csv").read_text().splitlines()[1].endswith(",,,,")
