"""The loop a user follows, end to end on this CPU: measure a profile, run three trial plans that write
Megatron-format logs, fit the profile to them (`calibrate --from-runs`), and check three other plans' logs
against it (`validate`). It measures this machine, so it asserts the contract (an answer for every run, or one
sentence that refuses), never a timing; the errors it prints are what a quiet machine is judged on."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from click.testing import CliRunner

pytest.importorskip("torch")

from simulator.cli import cli  # noqa: E402

MODEL = str(Path(__file__).resolve().parents[2] / "calibration" / "reference" / "gpt-small-cpu.yaml")
TRIALS = {"tp1": [], "tp2": ["--tp", "2"], "pp2": ["--pp", "2", "--gpus", "2"]}
OTHERS = {"dp2": ["--dp", "2", "--gpus", "2"], "tp2sp": ["--tp", "2", "--sp", "--recompute-granularity", "selective"],
          "tp2full": ["--tp", "2", "--recompute-granularity", "full"]}


def _refused_in_one_sentence(result) -> bool:
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: "), result.output
    assert "Traceback" not in result.output
    return True


@pytest.mark.slow
@pytest.mark.measures
def test_trial_runs_logs_calibrate_a_profile_that_validate_uses_for_other_runs(tmp_path):
    runner = CliRunner()
    cpu = tmp_path / "cpu.json"
    measured = runner.invoke(cli, ["calibrate", "--device", "cpu", "--quick", "--out", str(cpu)])
    if measured.exit_code != 0:  # a busy machine: the profile is refused, in one sentence
        assert _refused_in_one_sentence(measured)
        return
    # the trials and the others alternate, so that a machine whose speed drifts over the test's minutes slows
    # the runs the profile is fitted to as much as the runs it is judged on
    interleaved = [run for pair in zip(TRIALS.items(), OTHERS.items()) for run in pair]
    for name, flags in interleaved:
        ran = runner.invoke(cli, ["reference", "--model", MODEL, "--gbs", "4", "--iterations", "4", *flags,
                                  "--out", str(tmp_path / f"{name}.json"),
                                  "--megatron-log", str(tmp_path / f"{name}.log")])
        assert ran.exit_code == 0, ran.output
    common = ["--cluster", "local-cpu", "--model", MODEL, "--warmup-iterations", "1"]
    fitted = tmp_path / "fitted.json"
    fit = runner.invoke(cli, ["calibrate", *[a for n in TRIALS for a in ("--from-runs", str(tmp_path / f"{n}.log"))],
                              *common, "--profile", str(cpu), "--out", str(fitted), "--json"])
    assert fit.exit_code == 0, fit.output
    assert len(json.loads(fit.stdout)["fit"]["runs"]) == len(TRIALS)
    checked = runner.invoke(cli, ["validate", *[str(tmp_path / f"{n}.log") for n in OTHERS], *common,
                                  "--profile", str(fitted), "--json"])
    assert checked.exit_code == 0, checked.output
    runs = json.loads(checked.stdout)["runs"]
    assert len(runs) == len(OTHERS)
    for run in runs:
        it = run["iteration_time_s"]
        assert it["predicted"] > 0 and it["measured"] > 0 and math.isfinite(it["relative_error"])
    print("validate with the fitted profile: " + ", ".join(
        f"{run['run'].rsplit('/', 1)[-1]} {run['iteration_time_s']['relative_error']:+.1%}" for run in runs))
