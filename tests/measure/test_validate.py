"""`simulator validate` without torch: records built from the memory model, their errors, and bad records -> exit 2."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from simulator.cli import cli
from simulator.cost.profile import default_profile, save_profile
from simulator.graph.layers import transformer_layer
from simulator.measure.run_record import LayerRecord, RunRecord, load_run_record, write_run_record
from simulator.measure.validate import compare, job_of, validate
from simulator.spec.errors import RunRecordError
from simulator.spec.hardware import load_cluster
from simulator.spec.model import ModelSpec
from simulator.spec.plan import Job, ParallelPlan, RecomputeGranularity

MODEL = ModelSpec(name="tiny", num_layers=4, hidden_size=32, num_attention_heads=4, vocab_size=128, seq_length=16)


def make_record(granularity: str = "selective", byte_offset: int = 0, **plan) -> RunRecord:
    job = Job(model=MODEL, cluster=load_cluster("dgx-a100-80gb"),
              plan=ParallelPlan(precision="fp32", tensor_parallel_size=2, sequence_parallel=True,
                                recompute={"granularity": granularity}, **plan))
    g = RecomputeGranularity(granularity)
    modelled = transformer_layer(job.model, job.plan).activation_bytes(g)
    layers = [LayerRecord(index=i, stage=0, chunk=0, recompute_granularity=g, forward_s=1e-3, backward_s=2e-3,
                          recompute_s=0.5e-3 if g is not RecomputeGranularity.none else 0.0,
                          activation_bytes=modelled + byte_offset, norm_statistics_bytes=128)
              for i in range(MODEL.num_layers)]
    return RunRecord(model=job.model, plan=job.plan, cluster="dgx-a100-80gb", device="cpu (1 threads per rank)",
                     world_size=2, torch_version="test", warmup_iterations=1, iteration_times_s=[9.0, 0.1, 0.3],
                     losses=[4.9, 4.8, 4.7], layers=layers)


def test_relative_error_is_signed_against_the_measurement():
    assert compare(110.0, 100.0).relative_error == pytest.approx(0.1)
    assert compare(90.0, 100.0).relative_error == pytest.approx(-0.1)
    assert compare(None, 100.0).relative_error is None
    assert compare(0.0, 0.0).relative_error == 0.0


@pytest.mark.parametrize("granularity", ["none", "selective", "full"])
def test_a_run_that_saves_the_modelled_bytes_has_no_memory_error(granularity):
    v = validate(make_record(granularity), predict_times=False)
    assert v.activation_bytes_per_layer.relative_error == 0.0
    assert all(layer.activation_bytes.relative_error == 0.0 for layer in v.layers)
    # the warm-up iteration (9 s) is left out of the measured iteration time
    assert v.iteration_time_s.measured == pytest.approx(0.2)


def test_extra_saved_bytes_show_as_a_negative_error():
    v = validate(make_record("none", byte_offset=1000), predict_times=False)
    measured = v.activation_bytes_per_layer.measured
    assert v.activation_bytes_per_layer.relative_error == pytest.approx(-1000 / measured)


def test_record_round_trips_and_rejects_inconsistent_runs(tmp_path):
    record = make_record()
    path = tmp_path / "run.json"
    write_run_record(record, path)
    assert load_run_record(path) == record
    data = json.loads(path.read_text())
    data["losses"] = data["losses"][:1]  # a run that stopped early
    path.write_text(json.dumps(data))
    with pytest.raises(RunRecordError, match="losses"):
        load_run_record(path)


@pytest.mark.parametrize("content, phrase", [
    (None, "cannot read run record"),
    ("{not json", "is not valid JSON"),
    ("[1, 2]", "must hold a JSON object"),
    ('{"model": {}}', "is malformed"),
])
def test_missing_or_malformed_records_exit_2_with_one_sentence(tmp_path, content, phrase):
    path = tmp_path / "run.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(RunRecordError, match=phrase):
        load_run_record(path)
    result = CliRunner().invoke(cli, ["validate", str(path)])
    assert result.exit_code == 2
    assert phrase in result.output and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_json_has_the_headline_quantities_at_the_top_level(tmp_path):
    path = tmp_path / "run.json"
    write_run_record(make_record(), path)
    result = CliRunner().invoke(cli, ["validate", str(path), "--memory-only", "--json"])
    if result.exit_code != 0:
        pytest.fail(result.output)
    out = json.loads(result.output)
    for key in ("iteration_time_s", "activation_bytes_per_layer"):
        assert set(out[key]) == {"predicted", "measured", "relative_error"}
    assert out["activation_bytes_per_layer"]["relative_error"] == 0.0
    table = CliRunner().invoke(cli, ["validate", str(path), "--memory-only"])
    assert table.exit_code == 0 and "activation bytes per layer" in table.output


def test_time_predictions_from_the_engine(tmp_path):
    pytest.importorskip("simulator.estimator.prediction")
    pytest.importorskip("simulator.schedule.timing")
    v = validate(make_record())
    assert v.iteration_time_s.predicted > 0 and v.iteration_time_s.relative_error is not None
    for layer in v.layers:
        assert layer.forward_s.predicted > 0 and layer.backward_s.predicted > 0
        assert layer.recompute_s.predicted > 0  # selective recompute replays the attention core


# --- phases, spread, checks and the verdict

def _timed_record(scale: dict[str, float] | None = None, noise: float = 0.03, threads: int = 1) -> RunRecord:
    """A run whose Megatron timers are the engine's own phases (times ``scale[phase]``), iterations spread +-noise."""
    from calibration.reference.timers import TIMER_NAMES

    base = make_record()
    predicted = validate(base)
    by_phase = {ph.phase: ph.predicted for ph in predicted.phases}
    timers = {}
    for name in TIMER_NAMES:
        value = by_phase.get(name, 0.0) * (scale or {}).get(name, 1.0)
        timers[name] = [[value] * base.world_size for _ in base.iteration_times_s]
    total = sum(t[0][0] for t in timers.values())
    extra = total - sum(by_phase.values())
    iteration = predicted.iteration_time_s.predicted + extra
    timers["iteration"] = [[iteration] * base.world_size for _ in base.iteration_times_s]
    return base.model_copy(update={"timers": timers, "threads_per_rank": threads,
                                   "iteration_times_s": [9.0, iteration * (1 - noise), iteration * (1 + noise)]})


def test_the_engine_is_cut_into_megatrons_timer_phases():
    v = validate(make_record())  # a record without timers: the predicted column alone
    names = [ph.phase for ph in v.phases]
    # TP 2 with SP, no PP and no DP: compute, SP's gradient all-reduce and the optimizer
    assert names == ["forward-compute", "backward-compute", "layernorm-grads-all-reduce", "optimizer"]
    assert all(ph.measured is None and ph.predicted > 0 for ph in v.phases)
    # the phases are the engine's iteration cut up: they add up to it (one stage, nothing idle)
    assert sum(ph.predicted for ph in v.phases) == pytest.approx(v.iteration_time_s.predicted, rel=1e-9)
    record = _timed_record()
    v = validate(record)
    assert [ph.phase for ph in v.phases] == ["forward-compute", "backward-compute", "layernorm-grads-all-reduce",
                                             "optimizer"]
    assert all(ph.relative_error == pytest.approx(0.0, abs=1e-9) for ph in v.phases)
    fwd = v.phases[0]
    assert fwd.predicted > 0 and fwd.measured_min == fwd.measured_max == fwd.measured


def test_within_the_runs_noise():
    v = validate(_timed_record(noise=0.05))
    assert v.iteration_time_spread == pytest.approx(0.10, rel=1e-6)
    assert v.verdict.startswith("within the run's noise")


def test_the_verdict_says_where_the_error_lives():
    v = validate(_timed_record(scale={"backward-compute": 2.0}, noise=0.01))
    assert v.verdict.startswith("iteration time off by -") and "backward-compute" in v.verdict
    assert v.outside_layers_s is not None and v.outside_layers_s.measured is not None


def test_a_run_with_other_threads_than_the_profile_is_not_comparable(tmp_path):
    profile = default_profile("A100-SXM4-80GB")
    measured = profile.model_copy(update={"device": profile.device.model_copy(update={"kind": "cpu", "threads": 2})})
    path = tmp_path / "profile.json"
    save_profile(measured, path)
    record_path = tmp_path / "run.json"
    write_run_record(_timed_record(threads=1), record_path)
    v = validate(load_run_record(record_path), str(path))
    threads = next(c for c in v.checks if c.name == "threads")
    assert threads.ok is False and "--threads 2" in threads.detail
    assert v.verdict.startswith("not comparable")
    result = CliRunner().invoke(cli, ["validate", str(record_path), "--profile", str(path)])
    assert result.exit_code == 0 and "check threads: MISMATCH" in result.output and "verdict: not comparable" in result.output
    doc = json.loads(CliRunner().invoke(cli, ["validate", str(record_path), "--profile", str(path), "--json"]).output)
    assert {"phases", "checks", "verdict", "outside_layers_s", "iteration_time_spread"} <= doc.keys()


def test_timers_must_have_one_value_per_iteration_and_rank(tmp_path):
    record = _timed_record()
    data = json.loads(record.model_dump_json())
    data["timers"]["forward-compute"][1] = [0.1]  # one rank missing
    path = tmp_path / "run.json"
    path.write_text(json.dumps(data))
    with pytest.raises(RunRecordError, match="forward-compute"):
        load_run_record(path)


def test_each_stages_phases_add_up_to_the_iteration_under_a_pipeline():
    """PP 2 with a tied embedding: the phases of the later stage add up to the iteration; the earlier stage waits
    for it at the barrier before the embedding's all-reduce (Megatron's --barrier-with-L1-time), a wait no timer
    holds, so its phases fall short by exactly that wait and the all-reduce's own time is the same on both."""
    from simulator.estimator.prediction import simulate_job
    from simulator.measure.validate import _time_predictions

    base = make_record("none")
    plan = base.plan.model_copy(update={"pipeline_parallel_size": 2, "global_batch_size": 8})
    record = base.model_copy(update={"plan": plan, "world_size": 4})
    predicted, _ = _time_predictions(job_of(record), record, None)
    ready = [st.grads_ready_s for st in simulate_job(job_of(record), None).engine.stages]
    slowest_optimizer = max(ph["optimizer"] for ph in predicted.phases)
    for stage, phases in enumerate(predicted.phases):
        # the optimizer step of every stage starts together (the engine's global step); the slowest ends it
        total = sum(phases.values()) - phases["optimizer"] + slowest_optimizer
        wait = max(ready) - ready[stage]
        assert total + wait == pytest.approx(predicted.iteration_s, rel=1e-9), (stage, phases)
        assert phases["pipeline send/recv"] > 0 and phases["embedding-grads-all-reduce"] > 0
    assert max(ready) - min(ready) > 0
    assert predicted.phases[0]["embedding-grads-all-reduce"] == predicted.phases[1]["embedding-grads-all-reduce"]
