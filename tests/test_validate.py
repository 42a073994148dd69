"""`simulator validate` without torch: records built from the memory model, their errors, and bad records -> exit 2."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from simulator.cli import cli
from simulator.errors import RunRecordError
from simulator.hardware import load_cluster
from simulator.layers import transformer_layer
from simulator.model import ModelSpec
from simulator.plan import Job, ParallelPlan, RecomputeGranularity
from simulator.run_record import (
    LayerRecord,
    RunRecord,
    load_run_record,
    write_run_record,
)
from simulator.validate import compare, validate

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
    pytest.importorskip("simulator.estimate")
    pytest.importorskip("simulator.timing")
    v = validate(make_record())
    assert v.iteration_time_s.predicted > 0 and v.iteration_time_s.relative_error is not None
    for layer in v.layers:
        assert layer.forward_s.predicted > 0 and layer.backward_s.predicted > 0
        assert layer.recompute_s.predicted > 0  # selective recompute replays the attention core
