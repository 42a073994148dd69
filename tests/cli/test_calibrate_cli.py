"""`simulator calibrate` as a person runs it: every option reaches the measurement, and a terminal sees each
section start and end (a pipe or a log never does). The measuring module is replaced by one that copies
known points, so nothing here depends on how busy the machine is."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

import simulator.measure.calibrate
from simulator.cli import cli
from simulator.cost.profile import load_profile
from tests.measure.test_calibrate import _cpu_raw

REPO = Path(__file__).resolve().parents[2]
COPY = "tests.cli.helpers.copy_measure"


@pytest.fixture
def copied(tmp_path, monkeypatch) -> Path:
    """The measurement replaced by a copy of a CPU's points; returns where the arguments it got are kept."""
    raw = tmp_path / "points.json"
    raw.write_text(json.dumps(_cpu_raw()))
    argv = tmp_path / "argv.json"
    monkeypatch.setattr(simulator.measure.calibrate, "MEASURE_MODULE", COPY)
    monkeypatch.setenv("SIMULATOR_TEST_RAW", str(raw))
    monkeypatch.setenv("SIMULATOR_TEST_ARGV", str(argv))
    return argv


def test_every_calibrate_option_reaches_the_measurement(tmp_path, copied):
    out, kept = tmp_path / "p.json", tmp_path / "kept.json"
    res = CliRunner().invoke(cli, ["calibrate", "--device", "cpu", "--quick", "--out", str(out), "--keep-raw", str(kept),
                                   "--gpu", "cpu", "--name", "mine", "--model", "gpt3-125m", "--tp", "2", "--mbs", "2",
                                   "--budget-s", "30", "--json"])
    assert res.exit_code == 0, res.output
    argv = json.loads(copied.read_text())
    # the model's layer (GPT-3 125M: hidden 768, 12 heads, FFN 3,072), its TP and micro-batch, the budget
    for flag, value in (("--hidden", "768"), ("--heads", "12"), ("--ffn", "3072"), ("--tp", "2"),
                        ("--micro-batch", "2"), ("--budget-s", "30.0"), ("--device", "cpu")):
        assert argv[argv.index(flag) + 1] == value, argv
    assert "--quick" in argv
    assert json.loads(res.output)["profile"] == "mine" and load_profile(out).name == "mine"
    assert json.loads(kept.read_text()) == _cpu_raw()
    assert "calibrate:" not in res.output  # no terminal, no progress


def test_a_model_calibrate_cannot_read_is_one_sentence(tmp_path, copied):
    res = CliRunner().invoke(cli, ["calibrate", "--device", "cpu", "--model", "gpt-nope", "--out", str(tmp_path / "p.json")])
    assert res.exit_code == 2 and res.output.startswith("error: ") and len(res.output.strip().splitlines()) == 1
    assert not copied.exists()  # refused before measuring


def test_a_terminal_sees_each_section_start_and_end(tmp_path):
    """stderr a terminal: one line per section as it starts and as it ends, while it measures; stdout keeps the
    answer alone."""
    raw = tmp_path / "points.json"
    raw.write_text(json.dumps(_cpu_raw()))
    primary, secondary = os.openpty()
    try:
        proc = subprocess.Popen([sys.executable, str(REPO / "tests" / "cli" / "helpers" / "run_cli.py"), COPY,
                                 "calibrate", "--device", "cpu", "--quick", "--out", str(tmp_path / "p.json")],
                                cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO), "SIMULATOR_TEST_RAW": str(raw)},
                                stdout=subprocess.PIPE, stderr=secondary, text=True)
        os.close(secondary)
        out, _ = proc.communicate(timeout=120)
        err = b""
        while True:
            try:
                chunk = os.read(primary, 4096)
            except OSError:  # the terminal's other end is closed: everything has been read
                break
            if not chunk:
                break
            err += chunk
    finally:
        os.close(primary)
    assert proc.returncode == 0, err
    lines = [line.strip() for line in err.decode().splitlines() if line.strip()]
    assert lines == ["calibrate: measuring test device (cpu)",
                     "calibrate: [gemm] measuring, 10 s allowed", "calibrate: [gemm] done: 3 points in 0.1 s of 10 s",
                     "calibrate: [collectives] measuring, 10 s allowed",
                     "calibrate: [collectives] done: 3 points in 0.1 s of 10 s"], lines
    assert out.startswith("wrote ") and "calibrate:" not in out


@pytest.mark.parametrize("flags", [["--cluster", "dgx-a100-80gb"], ["--cluster", "dgx-h100"]])
def test_a_from_runs_option_without_from_runs_is_refused_even_at_its_default(tmp_path, flags):
    res = CliRunner().invoke(cli, ["calibrate", "--device", "cpu", "--out", str(tmp_path / "p.json"), *flags])
    assert res.exit_code == 2 and "go with --from-runs" in res.output
    assert not (tmp_path / "p.json").exists()
