"""`simulator reference` end to end on CPU: a run writes a record that `validate` reads with no
memory error; a crashing run or an unsupported plan exits 2 with one sentence and no record."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

pytest.importorskip("torch")

from calibration.reference import launch  # noqa: E402
from simulator.cli import cli
from simulator.measure.run_record import load_run_record

TINY = {"num_layers": 2, "hidden_size": 32, "num_attention_heads": 4, "vocab_size": 128, "seq_length": 16}
ARGS = ["--cluster", "dgx-a100-80gb", "--tp", "2", "--sp", "--recompute-granularity", "selective",
        "--gbs", "2", "--device", "cpu", "--iterations", "2"]


@pytest.fixture()
def tiny(tmp_path):
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(TINY))
    return str(path)


@pytest.mark.measures
def test_reference_writes_a_record_that_validate_matches(tmp_path, tiny):
    out = tmp_path / "run.json"
    result = CliRunner().invoke(cli, ["reference", "--model", tiny, *ARGS, "--out", str(out)])
    assert result.exit_code == 0, result.output
    record = load_run_record(out)
    assert record.world_size == 2 and record.plan.sequence_parallel and record.plan.precision.value == "fp32"
    assert len(record.losses) == 2 and record.cluster == "dgx-a100-80gb"
    checked = CliRunner().invoke(cli, ["validate", str(out), "--memory-only", "--json"])
    assert checked.exit_code == 0, checked.output
    report = json.loads(checked.output)
    assert report["activation_bytes_per_layer"]["relative_error"] == 0.0
    assert report["iteration_time_s"]["measured"] > 0


def test_a_crashing_run_exits_2_and_leaves_no_record(tmp_path, tiny, monkeypatch):
    crash = tmp_path / "crash.py"
    crash.write_text("raise RuntimeError('out of cheese on rank 0')\n")
    monkeypatch.setattr(launch, "TRAIN_SCRIPT", crash)
    out = tmp_path / "run.json"
    out.write_text("{}")  # a stale file from an earlier run must not survive
    result = CliRunner().invoke(cli, ["reference", "--model", tiny, *ARGS, "--out", str(out)])
    assert result.exit_code == 2
    assert "reference run failed" in result.output and "out of cheese" in result.output
    assert len(result.output.strip().splitlines()) == 1
    assert not out.exists() and (tmp_path / "run.json.log").exists()


def test_an_unsupported_plan_exits_2_before_starting_processes(tmp_path):
    path = tmp_path / "llama.json"
    path.write_text(json.dumps({**TINY, "swiglu": True}))
    result = CliRunner().invoke(cli, ["reference", "--model", str(path), *ARGS, "--out", str(tmp_path / "r.json")])
    assert result.exit_code == 2
    assert "does not implement swiglu" in result.output


def test_a_run_past_its_time_is_stopped_with_its_ranks(tmp_path):
    """A run stopped for time must not leave ranks behind (on a GPU they would hold the next run's memory)."""
    import os
    import time

    from simulator.spec.errors import RunRecordError

    slow = tmp_path / "slow.py"
    slow.write_text("import os, pathlib, time\n"
                    f"pathlib.Path({str(tmp_path)!r}, f'rank{{os.environ[\"RANK\"]}}.pid').write_text(str(os.getpid()))\n"
                    "time.sleep(120)\n")
    with pytest.raises(RunRecordError, match="was stopped"):
        launch.launch(2, [], tmp_path / "slow.log", slow, timeout_s=12)
    pids = [int(p.read_text()) for p in tmp_path.glob("rank*.pid")]
    assert pids  # the ranks had started
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(os.path.exists(f"/proc/{pid}") for pid in pids):
        time.sleep(0.2)
    assert not any(os.path.exists(f"/proc/{pid}") for pid in pids)


def test_fused_attention_with_attention_dropout_exits_2_before_starting_processes(tmp_path, tiny):
    """The loop's flash-style attention has no dropout on the probabilities; the tiny model has 0.1."""
    result = CliRunner().invoke(cli, ["reference", "--model", tiny, *ARGS, "--attention-backend", "flash",
                                      "--out", str(tmp_path / "r.json")])
    assert result.exit_code == 2
    assert "does not implement attention_dropout=0.1 with the fused 'flash' attention backend" in result.output
    assert len(result.output.strip().splitlines()) == 1 and not (tmp_path / "r.json").exists()


def test_cpu_ranks_keep_freed_memory_as_a_caching_allocator_does(tmp_path, monkeypatch):
    """On a CPU the launcher tells glibc to keep freed blocks (no fresh, page-faulting mapping per activation);
    a user's own setting wins, and a GPU run's environment is left alone."""
    from types import SimpleNamespace

    seen = []
    monkeypatch.setattr(launch.children, "run",
                        lambda cmd, env, timeout: seen.append(env) or SimpleNamespace(returncode=0, stdout="", stderr=""))
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "123")
    launch.launch(1, [], tmp_path / "log", device="cpu")
    launch.launch(1, [], tmp_path / "log", device="cuda")
    cpu, gpu = seen
    assert cpu["MALLOC_MMAP_THRESHOLD_"] == launch.CPU_ALLOCATOR_ENV["MALLOC_MMAP_THRESHOLD_"]
    assert cpu["MALLOC_TRIM_THRESHOLD_"] == gpu["MALLOC_TRIM_THRESHOLD_"] == "123"
    assert "MALLOC_MMAP_THRESHOLD_" not in gpu
