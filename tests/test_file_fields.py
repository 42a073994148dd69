"""What a file can set is bounded and typed as the command line's flag for it is.

Every flag with a bound has a file field that refuses the value just past that bound (and takes the
bound itself), so a model, plan, run-record or profile file cannot say what the flag refuses. A file's
numbers are read strictly: ``true`` is not 1 and ``"12"`` is not 12 (a whole number may stand for a
number), while the flags still read text, as a command line holds nothing else.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated, Any, Callable

import click
import pytest
import yaml
from click.testing import CliRunner
from pydantic import TypeAdapter, ValidationError

from simulator.cli import COMMANDS, cli
from simulator.cli.options import BoundedFloat, BoundedInt
from simulator.cost.profile import DeviceInfo, load_profile
from simulator.measure.run_record import RunRecord, load_run_record
from simulator.spec import limits
from simulator.spec.catalog import PRESETS, load_model
from simulator.spec.errors import SimulatorError
from simulator.spec.hardware import load_cluster, load_gpu
from simulator.spec.model import ModelSpec
from simulator.spec.plan import ParallelPlan, RecomputePolicy

REPO = Path(__file__).resolve().parent.parent
RUN_RECORD = REPO / "reports" / "cpu-validation" / "run-tp1.json"
PROFILE = REPO / "calibration" / "profiles" / "a100-sxm4-80gb-published.json"


def _model_doc() -> dict:
    return {**PRESETS["mixtral-8x7b"].model_dump(mode="json"), "name": "moe"}


# The files a value can come from: (a sound document, suffix, its loader).
FILES: dict[str, tuple[Callable[[], dict], str, Callable[[str], Any]]] = {
    "model": (_model_doc, ".yaml", load_model),
    "run record": (lambda: json.loads(RUN_RECORD.read_text()), ".json", load_run_record),
    "profile": (lambda: json.loads(PROFILE.read_text()), ".json", load_profile),
}

# flag (its parameter name in any command) -> where a file sets the same number: (file, path, model, field).
# A field marked "length" bounds the number of entries of a list (one per iteration).
_PLAN = [("tensor_parallel_size", "tp"), ("pipeline_parallel_size", "pp"), ("data_parallel_size", None),
         ("context_parallel_size", "cp"), ("virtual_pipeline_stages", "vpp"),
         ("expert_model_parallel_size", "ep"), ("expert_tensor_parallel_size", "etp"),
         ("micro_batch_size", "mbs"), ("global_batch_size", None), ("decoder_first_pipeline_num_layers", None),
         ("decoder_last_pipeline_num_layers", None), ("ddp_bucket_size", None), ("cuda_device_max_connections", None)]
FILE_FIELDS: dict[str, list[tuple[str, tuple[str, ...], type, str]]] = {
    **{name: [("run record", ("plan", field), ParallelPlan, field)]
       for field, short in _PLAN for name in (field, short) if name},
    "seq_length": [("model", ("seq_length",), ModelSpec, "seq_length")],
    "moe_load_imbalance": [("model", ("moe_load_imbalance",), ModelSpec, "moe_load_imbalance")],
    "recompute_num_layers": [("run record", ("plan", "recompute", "num_layers"), RecomputePolicy, "num_layers")],
    "gpus": [("run record", ("world_size",), RunRecord, "world_size")],
    "seed": [("run record", ("seed",), RunRecord, "seed")],
    "threads": [("run record", ("threads_per_rank",), RunRecord, "threads_per_rank"),
                ("profile", ("device", "threads"), DeviceInfo, "threads")],
    "iterations": [("run record", ("iteration_times_s",), RunRecord, "length")],
}
# Flags no file holds: what to do, not what was run.
FLAG_ONLY = {"tokens", "top", "budget_s", "workers", "nnodes", "failure_seed", "save_interval", "spare_nodes",
             # a cluster file holds these as declared ranges in other units (rates per million GPU-hours; each
             # bandwidth's value, low and high), bounded there as the flags are (tests/spec/test_reliability.py)
             "mtbf_gpu_hours", "write_gbps_per_node", "write_gbps",
             # how a training log is read, which no file of the simulator's holds
             "warmup",
             # a capacity question's goal, grid and sampling; PUE and carbon intensity, which an economics file
             # holds as declared ranges (tests/spec/test_economics.py)
             "gpus_min", "gpus_max", "deadline_days", "budget_usd", "refine", "samples", "finalists", "pue",
             "grid_kg_co2e_per_kwh"}
# A bound a file field does not carry yet (the flag's is the only one).
NOT_YET: dict[tuple[str, str], str] = {}  # (flag parameter, side) -> why its file field does not share the bound yet


def _commands() -> list[click.Command]:
    ctx = click.Context(cli)
    return [cli.get_command(ctx, name) for name in sorted(COMMANDS)]


def _bounds(t: click.ParamType) -> list[tuple[str, float, float, float]]:
    """(side, just inside, just past) of each bound a flag's type has."""
    out = []
    if isinstance(t, (BoundedInt, click.IntRange)):
        low, high = (t.low, t.high) if isinstance(t, BoundedInt) else (t.min, t.max)
        low_open = isinstance(t, click.IntRange) and t.min_open
        high_open = isinstance(t, click.IntRange) and t.max_open
        if low is not None:
            out.append(("low", low + 1 if low_open else low, low if low_open else low - 1))
        if high is not None:
            out.append(("high", high - 1 if high_open else high, high if high_open else high + 1))
    elif isinstance(t, (BoundedFloat, click.FloatRange)):
        low, high = (t.low, t.high) if isinstance(t, BoundedFloat) else (t.min, t.max)
        low_open = not t.closed if isinstance(t, BoundedFloat) else t.min_open
        high_open = isinstance(t, click.FloatRange) and t.max_open
        if low is not None:
            out.append(("low", math.nextafter(low, math.inf) if low_open else low,
                        low if low_open else math.nextafter(low, -math.inf)))
        if high is not None:
            out.append(("high", math.nextafter(high, -math.inf) if high_open else high,
                        high if high_open else math.nextafter(high, math.inf)))
    return out


def _bounded_flags() -> list[tuple[str, str, str, float, float]]:
    """(command, parameter, side, inside, past) of every bound of every flag of every command."""
    out = []
    for command in _commands():
        for param in command.params:
            for side, inside, past in _bounds(param.type):
                out.append((command.name, param.name, side, inside, past))
    return out


BOUNDED = _bounded_flags()
CASES = sorted({(param, side, inside, past) for _, param, side, inside, past in BOUNDED if param not in FLAG_ONLY},
               key=str)


def test_every_bounded_flag_has_its_file_fields_named():
    names = {param for _, param, *_ in BOUNDED}
    assert names - FLAG_ONLY - set(FILE_FIELDS) == set(), "name the file fields of these flags (or FLAG_ONLY)"
    assert {"moe_load_imbalance", "seq_length", "threads", "seed"} <= names


def _set(doc: dict, path: tuple[str, ...], value: Any) -> dict:
    node = doc
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return doc


def _file(tmp_path: Path, kind: str, path: tuple[str, ...], value: Any, length: bool) -> str:
    sound, suffix, _ = FILES[kind]
    doc = sound()
    if length:  # that many iterations, each with its loss
        doc["losses"], doc["timers"], doc["warmup_iterations"] = [2.0] * int(value), None, 0
        value = [0.5] * int(value)
    out = tmp_path / f"f{suffix}"
    _set(doc, path, value)
    out.write_text(json.dumps(doc) if suffix == ".json" else yaml.safe_dump(doc))
    return str(out)


def _cases():
    for param, side, inside, past in CASES:
        for kind, path, model, field in FILE_FIELDS[param]:
            marks = [pytest.mark.xfail(reason=NOT_YET[param, side])] if (param, side) in NOT_YET else []
            yield pytest.param(param, side, inside, past, kind, path, model, field, marks=marks,
                               id=f"{param}-{side}-{kind}:{'.'.join(path)}")


@pytest.mark.parametrize("param, side, inside, past, kind, path, model, field", list(_cases()))
def test_a_file_refuses_what_the_flag_refuses(tmp_path, param, side, inside, past, kind, path, model, field):
    length = field == "length"
    with pytest.raises(SimulatorError) as refused:
        FILES[kind][2](_file(tmp_path, kind, path, past, length))
    message = str(refused.value)
    assert "\n" not in message and (path[-1] in message or "iteration" in message), message
    # and the bound itself is the field's own (the field is no narrower than the flag)
    info = model.model_fields["iteration_times_s" if length else field]
    adapter = TypeAdapter(Annotated[info.annotation, *info.metadata] if info.metadata else info.annotation)
    adapter.validate_python([0.5] * int(inside) if length else inside, strict=True)


def test_a_moe_load_imbalance_past_the_flags_bound_is_one_sentence(tmp_path):
    for value in (1e308, 1e30, 1e4):
        path = tmp_path / "moe.yaml"
        path.write_text(yaml.safe_dump({**_model_doc(), "moe_load_imbalance": value}))
        result = CliRunner().invoke(cli, ["plan", "--model", str(path), "--cluster", "dgx-h100", "--gpus", "64",
                                          "--tp", "2", "--pp", "4", "--ep", "8", "--sp", "--tokens", "1e12"])
        assert result.exit_code == 2, result.output
        assert result.stderr.count("\n") == 1 and "moe_load_imbalance" in result.stderr
        assert f"at most {limits.MAX_EXPERT_LOAD:g}" in result.stderr


# --- types --------------------------------------------------------------------------------------

def _gpu_file(tmp_path: Path, change: dict) -> str:
    path = tmp_path / "gpu.yaml"
    path.write_text(yaml.safe_dump({**load_gpu("H100-SXM5-80GB").model_dump(mode="json"), **change}))
    return str(path)


def _cluster_file(tmp_path: Path, change: dict) -> str:
    doc = yaml.safe_load((REPO / "hardware_specs" / "clusters" / "dgx-h100.yaml").read_text())
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump({**doc, **change}))
    return str(path)


WRONG_TYPES = [
    # (file, where, value, what the message says it should be)
    ("model", ("ffn_hidden_size",), True, "a whole number"),
    ("model", ("num_layers",), "12", "a whole number"),
    ("model", ("num_layers",), 12.5, "a whole number"),
    ("model", ("attention_dropout",), True, "a number"),
    ("model", ("attention_dropout",), "0.1", "a number"),
    ("model", ("swiglu",), 1, "true or false"),
    ("model", ("swiglu",), "yes", "true or false"),
    ("run record", ("world_size",), "1", "a whole number"),
    ("run record", ("plan", "micro_batch_size"), True, "a whole number"),
    ("run record", ("plan", "sequence_parallel"), 0, "true or false"),
    ("run record", ("iteration_times_s",), ["0.5"] * 8, "a number"),
    ("profile", ("gemm", "tile_m"), "128", "a whole number"),
    ("profile", ("gemm", "tile_choices"), [["128", 64]], "a whole number"),
    ("profile", ("gemm", "max_efficiency"), True, "a number"),
    ("profile", ("overlap_compute_slowdown",), "0.1", "a number"),
]


@pytest.mark.parametrize("kind, path, value, expected", WRONG_TYPES, ids=lambda x: str(x)[:20])
def test_a_file_value_of_the_wrong_type_is_refused_not_converted(tmp_path, kind, path, value, expected):
    with pytest.raises(SimulatorError) as refused:
        FILES[kind][2](_file(tmp_path, kind, path, value, False))
    message = str(refused.value)
    assert f"not {expected}" in message and path[-1] in message and "\n" not in message, message


@pytest.mark.parametrize("loader, change, field", [
    (lambda tmp, c: load_gpu(_gpu_file(tmp, c)), {"sm_count": "132"}, "sm_count"),
    (lambda tmp, c: load_gpu(_gpu_file(tmp, c)), {"hbm_capacity_gib": True}, "hbm_capacity_gib"),
    (lambda tmp, c: load_gpu(_gpu_file(tmp, c)), {"asynchronous": 1}, "asynchronous"),
    (lambda tmp, c: load_cluster(_cluster_file(tmp, c)), {"gpus_per_node": "8"}, "gpus_per_node"),
    (lambda tmp, c: load_cluster(_cluster_file(tmp, c)), {"nvswitch": 1}, "nvswitch"),
    (lambda tmp, c: load_cluster(_cluster_file(tmp, c)), {"nic_line_rate_gbit_s": "400"}, "nic_line_rate_gbit_s"),
])
def test_gpu_and_cluster_files_are_read_strictly(tmp_path, loader, change, field):
    with pytest.raises(SimulatorError, match=field):
        loader(tmp_path, change)


def test_a_whole_number_stands_for_a_number_in_a_file(tmp_path):
    model = load_model(_file(tmp_path, "model", ("attention_dropout",), 0, False))
    assert model.attention_dropout == 0.0 and isinstance(model.attention_dropout, float)
    profile = load_profile(_file(tmp_path, "profile", ("gemm", "k_half"), 128, False))
    assert profile.gemm.k_half == 128.0
    assert load_cluster(_cluster_file(tmp_path, {"nic_line_rate_gbit_s": 400})).nic_line_rate_gbit_s == 400.0


def test_the_flags_still_read_text():
    """A command line is text: click converts it before any model sees it, so the flags take what files refuse."""
    result = CliRunner().invoke(cli, ["plan", "--model", "mixtral-8x7b", "--cluster", "dgx-h100", "--gpus", "64",
                                      "--tp", "2", "--pp", "4", "--ep", "8", "--sp", "--moe-load-imbalance", "1.5",
                                      "--seq-length", "2048", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["plan"]["tensor_parallel_size"] == 2 and doc["moe_load_imbalance"] == 1.5
    result = CliRunner().invoke(cli, ["search", "--model", "gpt3-125m", "--gpus", "8", "--gbs", "16", "--top", "2",
                                      "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["plans"]


def test_a_model_built_in_python_still_converts_as_before():
    """Only files are strict: the library's own callers (the search, the presets) keep pydantic's usual reading."""
    assert ModelSpec(num_layers="4", hidden_size=256, num_attention_heads=8).num_layers == 4
    with pytest.raises(ValidationError):
        ModelSpec(num_layers=4, hidden_size=256, num_attention_heads=8, moe_load_imbalance=1e4)


@pytest.mark.parametrize("value", [1e308, 86_401.0, -1.0, "0.2", True])
def test_a_run_records_timers_are_plausible_times(tmp_path, value):
    """A timer's total of one iteration is a time a step of a run takes: finite, at least 0 (a timer that
    never ran), under a day like the iteration it is part of."""
    doc = json.loads(RUN_RECORD.read_text())
    assert doc["timers"]["forward-compute"][1]
    with pytest.raises(SimulatorError, match="timers.forward-compute.1.0"):
        load_run_record(_file(tmp_path, "run record", ("timers", "forward-compute", 1, 0), value, False))
