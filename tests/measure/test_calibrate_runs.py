"""A profile fitted to measured runs: it recovers a constant the runs can see, leaves one they cannot at its
prior, never leaves a declared range, and carries its provenance and band into every command."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from simulator.cli import cli
from simulator.cli.options import job_from_options
from simulator.cost.profile import default_profile, load_profile
from simulator.estimator.band import band, run_band
from simulator.estimator.prediction import estimate
from simulator.measure.calibrate_runs import BOUND_TOLERANCE, FIT_PARAMETERS, describe, fit_runs, fitted_profile
from simulator.measure.megatron_log import launch_of_arguments, read_log
from simulator.spec.errors import ConfigError
from tests.measure import log_fixtures as fx

BASE = default_profile("A100-SXM4-80GB")
PARTIAL = "partial-node communicator efficiency"


def _job(tp: int, gpus: int = 64, gbs: int = 64, distributed_optimizer: bool = False):
    """A small global batch: the data-parallel reduction is a large share of the iteration."""
    return job_from_options(model="gpt3-2.7b", cluster="dgx-a100-80gb", gpus=gpus, tensor_parallel_size=tp,
                            micro_batch_size=1, global_batch_size=gbs, sequence_parallel=tp > 1,
                            use_distributed_optimizer=distributed_optimizer)


def _measured(jobs, truth):
    return [(f"tp{j.plan.tensor_parallel_size}-dp{j.plan.data_parallel_size}", j, estimate(j, truth).iteration_time_s)
            for j in jobs]


@pytest.fixture(scope="module")
def recovered():
    """Runs timed with a slower partial-node path than the published profile's: TP 1, 2, 4 and 8 on 8 nodes."""
    truth = BASE.with_value("collectives.network.partial_node_efficiency", 0.6)
    jobs = [_job(tp, gbs=gbs) for tp in (1, 2, 4, 8) for gbs in (64, 128)]
    runs = _measured(jobs, truth)
    return runs, fit_runs(runs, BASE)


def test_a_constant_the_runs_see_is_recovered_and_pinned(recovered):
    runs, fit = recovered
    by_name = {p.name: p for p in fit.parameters}
    partial = by_name[PARTIAL]
    assert partial.pinned
    assert partial.value < 0.8  # moved from its prior of 1 most of the way to the truth's 0.6
    before = [abs(b / m - 1) for b, m in zip(fit.predicted_before_s, fit.measured_s)]
    after = [abs(a / m - 1) for a, m in zip(fit.predicted_after_s, fit.measured_s)]
    assert max(after) < max(before)


def test_every_fitted_value_stays_inside_its_declared_range(recovered):
    _, fit = recovered
    for p in fit.parameters:
        assert p.low <= p.value <= p.high, p


def test_runs_that_vary_only_dp_leave_the_partial_node_path_at_its_prior():
    """Whole-node data-parallel groups (TP 1) never use a partial-node ring: nothing pins its efficiency."""
    jobs = [_job(1, gpus) for gpus in (16, 32, 64)]
    runs = [(label, job, t * 1.15) for label, job, t in _measured(jobs, BASE)]
    fit = fit_runs(runs, BASE, leave_one_out=False)
    partial = {p.name: p for p in fit.parameters}[PARTIAL]
    assert partial.value == pytest.approx(partial.prior, abs=1e-3) and not partial.pinned
    assert any("one layout" in w for w in fit.warnings)


def test_absurd_runs_push_constants_to_their_range_ends_and_no_further():
    runs = [(label, job, t * 5) for label, job, t in _measured([_job(2), _job(4, 32)], BASE)]
    fit = fit_runs(runs, BASE, leave_one_out=False)
    for p in fit.parameters:
        assert p.low <= p.value <= p.high, p
    assert any(p.value in (p.low, p.high) for p in fit.parameters)


def test_the_table_says_which_constants_hit_their_range_end_and_names_each_run_apart():
    runs = [(f"logs/{name}/train.log", job, t * 5)
            for name, (_, job, t) in zip(("a", "b"), _measured([_job(2), _job(4, 32)], BASE))]
    fit = fit_runs(runs, BASE, leave_one_out=False)
    text = describe(fit)
    for p in fit.parameters:
        row = next(line for line in text if line.startswith(p.name + " "))
        assert ("at its range's end" in row) == p.at_range_end, row
        end = BOUND_TOLERANCE * (p.high - p.low)  # the solver starts, and may stop, this far short of a bound
        assert not p.at_range_end or min(abs(p.value - p.low), abs(p.value - p.high)) <= end, p
    assert any("at its range's end" in line for line in text)  # five times slower: some constant runs out
    # one file name for both runs: the table keeps the paths, which tell them apart
    assert any(line.startswith("logs/a/train.log") for line in text)
    assert any(line.startswith("logs/b/train.log") for line in text)


def test_a_constant_on_its_range_end_is_held_there_only_where_the_runs_push_it_past():
    """Runs faster than any constant allows push every constant they see to its fast end. The partial-node path,
    whose prior of 1 is its range's end too, sits there because TP 1's whole-node groups never use it: the runs do
    not ask for more of it, and the table does not say they do."""
    runs = [(label, job, t / 1.3) for label, job, t in _measured([_job(1, gpus) for gpus in (16, 32, 64)], BASE)]
    fit = fit_runs(runs, BASE, leave_one_out=False)
    by_name = {p.name: p for p in fit.parameters}
    assert by_name["sustained compute fraction"].at_range_end
    assert by_name["sustained compute fraction"].value == pytest.approx(1.0)
    partial = by_name[PARTIAL]
    assert abs(partial.value - partial.high) <= BOUND_TOLERANCE * (partial.high - partial.low)  # on its end
    assert not partial.at_range_end
    row = next(line for line in describe(fit) if line.startswith(PARTIAL))
    assert "stays near its prior" in row, row


def test_one_run_leaves_none_out_and_its_band_is_the_profile_error_before_the_fit():
    (label, job, t), = _measured([_job(2)], BASE)
    fit = fit_runs([(label, job, t / 1.12)], BASE)  # the run 12% faster than the profile says
    assert fit.leave_one_out_errors == (None,) and fit.band_source == "profile before the fit"
    assert fit.band_below == pytest.approx(0.12 / 1.12)  # the truth may lie that far below the prediction
    assert any("none left out" in w for w in fit.warnings)
    assert "before the fit" in describe(fit)[-len(fit.warnings) - 1]


def test_runs_on_another_gpu_than_the_profile_are_refused():
    job = job_from_options(model="gpt3-2.7b", cluster="dgx-h100", gpus=16, global_batch_size=64)
    with pytest.raises(ConfigError, match="profile"):
        fit_runs([("h100", job, 1.0)], BASE)


def test_the_fitted_profile_carries_its_runs_and_its_band_only_for_plans_like_them(recovered, tmp_path):
    runs, fit = recovered
    profile = fitted_profile(BASE, fit, [job for _, job, _ in runs], "mine")
    assert profile.run_calibration.runs == fit.runs
    assert profile.source == "measured" and "Calibrated from 8 measured run(s)" in profile.notes
    like = _job(2, 32)  # TP 2, unsharded: as the runs
    assert run_band(like, profile) == (fit.band_below, fit.band_above)
    unlike = _job(2, 32, distributed_optimizer=True)  # sharded optimizer state, which none of the runs had
    assert run_band(unlike, profile) is None
    b = band(like, profile)
    t = estimate(like, profile).iteration_time_s
    assert b.iteration_time_s_low <= t * (1 - fit.band_below) + 1e-12
    assert b.iteration_time_s_high >= t * (1 + fit.band_above) - 1e-12
    assert b.from_runs == fit.runs and band(unlike, profile).from_runs == ()  # the answer says whose band it is
    path = tmp_path / "mine.json"
    path.write_text(profile.model_dump_json())
    assert load_profile(path) == profile


def test_the_declared_parameters_are_data_with_ranges_and_sources():
    for p in FIT_PARAMETERS:
        assert p.low < p.high and p.prior_width > 0 and p.source
        for path in p.path.split("+"):
            assert p.low <= p.prior(BASE) <= p.high or p.scaled, p.name


def test_calibrate_from_runs_writes_a_profile_that_plan_and_validate_take(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    for tp, dp in ((2, 4), (4, 2)):
        args = dict(fx.ARGUMENTS, tensor_model_parallel_size=tp, data_parallel_size=dp)
        fx.write(logs / f"tp{tp}.log", fx.megatron_lm_log(arguments=args))
    out = tmp_path / "fitted.json"
    runner = CliRunner()
    result = runner.invoke(cli, ["calibrate", "--from-runs", str(logs), "--out", str(out), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert len(data["fit"]["runs"]) == 2 and load_profile(out).run_calibration is not None
    again = runner.invoke(cli, ["validate", str(logs), "--profile", str(out), "--json"])
    assert again.exit_code == 0, again.output
    checked = json.loads(again.stdout)
    assert all(run["band_from_runs"] == data["fit"]["runs"] for run in checked["runs"])
    # the runs it was fitted to are in sample, and say so; a run it did not see is not
    assert all(run["in_sample"] for run in checked["runs"]) and checked["summary"]["in_sample"] == 2
    other = tmp_path / "other.log"
    fx.write(other, fx.megatron_lm_log(iterations=300,  # another run of the same layout
                                       arguments=dict(fx.ARGUMENTS, tensor_model_parallel_size=2, data_parallel_size=4)))
    unseen = runner.invoke(cli, ["validate", str(other), "--profile", str(out), "--json"])
    assert json.loads(unseen.stdout)["runs"][0]["in_sample"] is False
    # a fitted run's log moved elsewhere is still the same run; its content is what names it
    moved = tmp_path / "moved" / "renamed.log"
    moved.parent.mkdir()
    moved.write_bytes((logs / "tp2.log").read_bytes())
    again = runner.invoke(cli, ["validate", str(moved), "--profile", str(out), "--json"])
    assert json.loads(again.stdout)["runs"][0]["in_sample"] is True
    plan = runner.invoke(cli, ["plan", "--model", "gpt3-2.7b", "--gpus", "16", "--gbs", "256", "--tp", "2",
                               "--profile", str(out)])
    assert plan.exit_code == 0, plan.output
    # a plan like the runs says its band is theirs, and lists no constants' ends, which that band did not play
    plan_json = runner.invoke(cli, ["plan", "--megatron-args", "-", "--profile", str(out), "--json"],
                              input=_launch_of(logs / "tp2.log"))
    assert plan_json.exit_code == 0, plan_json.output
    assert json.loads(plan_json.stdout)["band_from_runs"] == data["fit"]["runs"]
    text = runner.invoke(cli, ["plan", "--megatron-args", "-", "--profile", str(out)], input=_launch_of(logs / "tp2.log"))
    assert "band: the leave-one-run-out errors of the 2 runs" in text.output
    assert "unpinned constants at the ends" not in text.output


def _launch_of(log_path) -> str:
    """The torchrun launch of a logged run, from its arguments block."""
    log = read_log(str(log_path))
    flags, world = launch_of_arguments(log.arguments, log.tokenizer_vocab_size)
    return f"torchrun --nnodes 1 --nproc-per-node {world} {flags}\n"


def test_measuring_flags_do_not_mix_with_from_runs(tmp_path):
    result = CliRunner().invoke(cli, ["calibrate", "--from-runs", "x.log", "--device", "cpu", "--out",
                                      str(tmp_path / "p.json")])
    assert result.exit_code == 2 and "--from-runs fits to logged runs" in result.output


def test_a_fit_that_predicts_left_out_runs_worse_than_the_profile_is_not_kept():
    """One layout the constants cannot express (a run 30% slower than its like): fitted to it, they pull the
    other runs off, so the runs left out are predicted worse than by the profile as it is."""
    runs = _measured([_job(1, gbs=64), _job(1, gbs=128), _job(8, gbs=64)], BASE)
    runs[2] = (runs[2][0], runs[2][1], runs[2][2] * 1.3)
    fit = fit_runs(runs, BASE)
    assert fit.kept_profile and any("kept" in w for w in fit.warnings)
    assert all(p.value == p.prior and not p.pinned for p in fit.parameters)
    assert fit.predicted_after_s == fit.predicted_before_s
    assert fit.band_above >= 0.3 / 1.3 - 1e-9  # the profile's own error on the slow run
