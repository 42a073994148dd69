"""The CPU validation's report: the issue's targets judged from the numbers, the load said out loud.

The measuring itself (two calibrations, six reference runs) takes minutes and is the lead's quiet-machine
command; here the judging and the report run on a made-up session."""

from __future__ import annotations

from pathlib import Path

import pytest

from calibration.cpu_validation import PLANS, PlanResult, Session, _slug, main, render, targets


def _plan(label: str, predicted: float, repeat: float, measured: float, phase_error: float) -> PlanResult:
    phase = {"phase": "forward-compute", "stage": 0, "predicted": measured * 0.5 * (1 + phase_error),
             "measured": measured * 0.5, "relative_error": phase_error, "measured_min": measured * 0.45,
             "measured_max": measured * 0.55}
    tiny = {**phase, "phase": "optimizer", "predicted": measured * 0.001 * 3, "measured": measured * 0.001,
            "relative_error": 2.0}  # too short to judge
    layer = {"forward_s": {"relative_error": 0.01}, "backward_s": {"relative_error": -0.02},
             "activation_bytes": {"predicted": 100, "measured": 100}}
    validation = {"iteration_time_s": {"predicted": predicted, "measured": measured,
                                       "relative_error": predicted / measured - 1},
                  "phases": [phase, tiny], "layers": [layer], "checks": [], "verdict": "within the run's noise",
                  "outside_layers_s": {"predicted": 0.01, "measured": 0.011}}
    return PlanResult(label, f"run-{_slug(label)}.json", validation, repeat, [measured * 0.98, measured * 1.02],
                      (0.1, 0.1, 0.1))


def _session(load: float, iteration_error: float) -> Session:
    s = Session(started="now", machine="x86_64", cores=2, load_before=(load, load, load), load_after=(load,) * 3)
    s.calibrations = [{"path": "cpu-profile.json", "attempts": 1, "refusals": [], "load_at_start": (load,) * 3,
                       "load_at_end": (load,) * 3, "link": {"latency_s": 1e-4, "max_busbw_gbps": 1.5},
                       "host": {"op_s": 1e-6}, "notes": [], "fit_errors": [{"block": "gemm", "rms": 0.02,
                                                                             "max_abs": 0.05}]}]
    s.plans = [_plan(label, 0.4 * (1 + iteration_error), 0.41, 0.4, 0.1) for label in PLANS]
    return s


def test_targets_are_judged_and_short_phases_are_not():
    met = {what: ok for what, _, _, ok in targets(_session(0.1, 0.05))}
    assert all(met.values())  # the optimizer phase's +200% is under 2% of the iteration
    missed = {what: ok for what, _, _, ok in targets(_session(0.1, 0.35))}
    assert not missed["iteration time, predicted vs measured"]


def test_the_report_says_how_quiet_the_machine_was(tmp_path: Path):
    quiet = render(_session(0.1, 0.05), tmp_path)
    busy = render(_session(3.2, 0.05), tmp_path)
    assert "load average 0.10 before starting (quiet" in quiet
    assert "load average 3.20 before starting (busy" in busy
    assert all(label in quiet for label in PLANS) and "| met |" in quiet


def test_bad_arguments_exit_2(tmp_path: Path, capsys):
    assert main(["--out", str(tmp_path), "--plans", "tp3"]) == 2
    assert "tp3" in capsys.readouterr().err
    assert main(["--out", str(tmp_path), "--iterations", "1"]) == 2
    assert main(["--out", str(tmp_path), "--runs", "0"]) == 2


def test_each_plan_is_also_judged_relative_to_tp1(tmp_path: Path):
    """A machine 25% slower during the runs than while calibrating misses every absolute target; the
    ratios to TP 1 cancel it."""
    from calibration.cpu_validation import relative_to_tp1

    s = _session(0.1, 0.0)
    for p in s.plans:
        p.validation["iteration_time_s"]["measured"] *= 1.25
    rows = relative_to_tp1(s)
    assert len(rows) == len(PLANS) - 1 and all(m == pytest.approx(pr) for _, m, pr in rows)
    assert "## Relative to TP 1" in render(s, tmp_path)


def test_the_machine_s_measured_drift_is_reported_beside_the_error(tmp_path: Path):
    """Runs on a machine whose probe took 30% longer than at calibration, and took 30% longer themselves: the
    raw error is -23%, the error at the run's speed zero; the targets still judge the raw error."""
    s = _session(0.1, 0.0)
    s.calibrations[0]["probe_s"] = 0.010
    s.probes = [{"moment": "before cpu-profile.json", "time": "00:00:00", "median_s": 0.010, "load_average": None},
                {"moment": "before run 1 of run-tp1", "time": "00:01:00", "median_s": 0.013, "load_average": None}]
    for p in s.plans:
        p.validation["iteration_time_s"]["measured"] *= 1.3
        p.validation["iteration_time_s"]["relative_error"] = 1 / 1.3 - 1
        p.probe_s, p.calibration_probe_s = 0.013, 0.010
    assert all(p.machine_slowdown == pytest.approx(1.3) and p.error_at_run_speed == pytest.approx(0.0, abs=1e-12)
               for p in s.plans)
    assert not dict((w, ok) for w, _, _, ok in targets(s))["iteration time, predicted vs measured"]
    text = render(s, tmp_path)
    assert "## The machine's speed" in text and "| 1.30x |" in text and "1.30x | -23.1% | +0.0% |" in text


def test_a_plan_without_probes_has_no_drift_figure():
    p = _session(0.1, 0.0).plans[0]
    assert p.machine_slowdown is None and p.error_at_run_speed is None


def test_the_speed_probe_times_the_same_work_each_call():
    torch = pytest.importorskip("torch")
    from calibration.microbench.probe import layer_forward_kernels, speed_probe

    run = layer_forward_kernels(hidden=32, heads=4, ffn=64, seq=16)
    torch.manual_seed(0)
    first = run()
    torch.manual_seed(0)  # the dropout mask is the only random draw
    assert torch.equal(first, run()) and first.shape == (16, 32)
    result = speed_probe(32, 4, 64, 16, seconds=0.05)
    assert result["median_s"] > 0 and result["repetitions"] >= 5


def test_a_run_that_fails_once_is_run_again_and_said_so():
    from calibration.cpu_validation import _run_once_more_if_it_failed
    from simulator.spec.errors import RunRecordError

    calls, failures = [], []

    def flaky():
        calls.append(1)
        if len(calls) == 1:
            raise RunRecordError("the reference run failed (torchrun exit code 1): terminate called")
        return "record"

    assert _run_once_more_if_it_failed(flaky, lambda m: None, failures) == "record"
    assert len(calls) == 2 and failures == ["the reference run failed (torchrun exit code 1): terminate called"]

    def broken():
        raise RunRecordError("the plan is wrong")

    with pytest.raises(RunRecordError):
        _run_once_more_if_it_failed(broken, lambda m: None, [])


def test_a_rank_that_dies_in_native_code_is_named_in_the_one_line():
    from calibration.reference.launch import _first_error

    output = ("terminate called without an active exception\nW1201 Sending process 9181 closing signal SIGTERM\n"
              "Traceback (most recent call last):\n  File \"run.py\", line 1\n"
              "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n"
              "======================================================\n"
              "  traceback : Signal 15 (SIGTERM) received by PID 9181\n"
              "Root Cause (first observed failure):\n"
              "  traceback : Signal 6 (SIGABRT) received by PID 9182\n"
              "======================================================\n")
    line = _first_error(output)
    assert "terminate called" in line and "SIGABRT" in line and "=====" not in line


def test_plans_run_in_rounds_and_each_keeps_its_median_run(tmp_path: Path, monkeypatch):
    """Every round runs every plan once, so drift over the session falls on all plans alike; each plan keeps
    the run of median mean iteration, and the probes taken just before and just after that run."""
    from types import SimpleNamespace

    import simulator.measure.run_record
    from calibration.cpu_validation import _median_runs

    order, written = [], {}
    times = {"a": [0.3, 0.1, 0.2], "b": [0.5, 0.6, 0.4]}

    def run_reference(job, *, device, iterations, out):
        order.append(job)
        return SimpleNamespace(timed_iteration_times_s=[times[job][sum(1 for j in order if j == job) - 1]])

    monkeypatch.setattr(simulator.measure.run_record, "write_run_record", lambda r, p: written.__setitem__(p.name, r))
    probes = iter(range(1, 100))
    kept = _median_runs({"a": ("a", tmp_path / "run-a.json"), "b": ("b", tmp_path / "run-b.json")}, 3, 3,
                        run_reference, probe=lambda moment: float(next(probes)), log=lambda m: None)
    assert order == ["a", "b"] * 3
    assert kept["a"][1] == [0.3, 0.1, 0.2] and kept["a"][0].timed_iteration_times_s == [0.2]
    assert kept["b"][0].timed_iteration_times_s == [0.5] and written["run-b.json"] is kept["b"][0]
    # probes 1..6 precede the six runs, 7 follows the last: a's median is its third run (probes 5, 6),
    # b's its first (probes 2, 3)
    assert kept["a"][2] == 5.5 and kept["b"][2] == 2.5
