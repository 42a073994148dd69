"""Every broken input refused: exit code 2 (3 for --require-fit) and one sentence on stderr, never a
traceback, a hang or a wrong answer. One test per case found by trying the tool as a new user and
by fuzzing it (see also tests/test_fuzz.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from simulator.cli import cli
from simulator.spec import limits
from simulator.spec.hardware import load_cluster
from tests.measure.test_calibrate import _synthetic_raw, _with_collectives

REPO = Path(__file__).resolve().parents[2]
SMALL = ["--model", "gpt3-125m", "--gpus", "8", "--gbs", "8"]


def refused(*args: str, code: int = 2, needle: str | None = None, env: dict | None = None) -> str:
    """Run the CLI; assert the exit code and one 'error: ' line on stderr with no traceback; return the line."""
    result = CliRunner().invoke(cli, list(args), env=env)
    assert result.exit_code == code, (result.exit_code, result.output, result.exception)
    assert "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    if needle is not None:
        assert needle in lines[0], lines[0]
    return lines[0]


def ok(*args: str, env: dict | None = None):
    result = CliRunner().invoke(cli, list(args), env=env)
    assert result.exit_code == 0, (result.output, result.exception)
    return result


# --- the before-stop checklist and the search's pinned values ------------------------------------

@pytest.mark.parametrize("args,needle", [
    (["--model", "gpt3-175b", "--gpus", "960", "--gbs", "1920", "--tp", "3"], "tensor_parallel_size=3 does not divide vocab"),
    (["--model", "gpt3-175b", "--gpus", "960", "--gbs", "1920", "--tp", "16"], "more than the 8 GPUs per node"),
    (["--model", "gpt3-125m", "--gpus", "8", "--gbs", "8", "--tp", "1", "--sp"], "sequence_parallel needs"),
    (["--model", "gpt3-125m", "--gpus", "8", "--gbs", "8", "--pp", "1", "--vpp", "2"], "virtual_pipeline_stages=2"),
    (["--model", "gpt3-125m", "--gpus", "8", "--gbs", "8", "--tp", "8"], "num_attention_heads=12"),
    (["--model", "gpt3-125m", "--gpus", "12", "--gbs", "12", "--tp", "8"], "gpus(12) is not divisible"),
])
def test_search_refuses_a_pin_that_breaks_a_rule(args, needle):
    refused("search", *args, needle=needle)


def test_search_with_sp_pinned_but_tp_free_only_tries_tp_above_1():
    doc = json.loads(ok("search", *SMALL, "--sp", "--json", "--top", "3").output)
    assert all(p["plan"]["sequence_parallel"] and p["plan"]["tensor_parallel_size"] > 1 for p in doc["plans"])


def test_search_with_vpp_pinned_but_pp_free_only_tries_pipelines():
    doc = json.loads(ok("search", "--model", "gpt3-125m", "--gpus", "8", "--gbs", "32", "--vpp", "2", "--json").output)
    assert all(p["plan"]["virtual_pipeline_stages"] == 2 and p["plan"]["pipeline_parallel_size"] > 1
               for p in doc["plans"])


def test_non_utf8_model_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(b"num_layers: \xff\n")
    refused("memory", "--model", str(bad), "--gpus", "8", "--gbs", "8", needle="not UTF-8")


def test_non_utf8_cluster_file(tmp_path):
    bad = tmp_path / "cluster.yaml"
    bad.write_bytes(b"name: \xe9t\xe9\ngpus_per_node: 8\n")
    refused("memory", "--model", "gpt3-125m", "--cluster", str(bad), needle="not UTF-8")


def test_the_search_progress_bar_never_reaches_a_stream_that_is_not_a_terminal():
    # long enough for the bar's half-second delay; a bar on stderr would break every one-sentence check
    result = CliRunner().invoke(cli, ["search", "--model", "gpt3-13b", "--gpus", "64", "--gbs", "128", "--top", "1"])
    assert result.exit_code == 0, result.output
    assert result.stderr == ""


# --- numbers on the command line -----------------------------------------------------------------

@pytest.mark.parametrize("flag,value", [
    ("--tokens", "-1"), ("--tokens", "0"), ("--tokens", "inf"), ("--tokens", "nan"), ("--tokens", "1e16"),
    ("--tokens", "1" * 1000), ("--tokens", "lots"),
    ("--gpus", "1" * 1000), ("--gpus", "1" * 5000), ("--gpus", "1000000000"), ("--gpus", "10000000"),
    ("--gpus", "0"), ("--gpus", "-8"), ("--gpus", "8.0"),
    ("--gbs", "1e30"), ("--gbs", "1" * 5000), ("--mbs", "100000"), ("--seq-length", "100000000"),
    ("--tp", "1" * 40), ("--vpp", "5000"), ("--recompute-num-layers", "100000"),
])
def test_out_of_range_numbers_are_one_sentence(flag, value):
    line = refused("plan", "--model", "gpt3-125m", flag, value)
    assert len(line) < 300  # a 5,000-digit value is not echoed back


@pytest.mark.parametrize("text,number", [("\u0661\u0662\u0668", 128), ("\uff18", 8), ("1_024", 1024), (" 64 ", 64)])
def test_a_number_python_reads_is_the_number_the_answer_uses(text, number):
    # The flags read whole numbers as Python's int() does; the JSON and the throughput then follow that number.
    result = CliRunner().invoke(cli, ["plan", "--model", "gpt3-125m", "--seq-length", text, "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["seq_length"] == number
    assert doc["tokens_per_s"] == pytest.approx(
        doc["plan"]["global_batch_size"] * number / doc["iteration_time_s"], rel=1e-12)


def test_huge_micro_batch_counts_are_refused_at_once(monkeypatch):
    # refused before the schedule is played (playing ten million micro-batches would take minutes): an engine
    # that fails if called proves it, on a machine however busy
    from simulator.estimator import prediction
    from simulator.schedule import fast_engine

    def played(*args, **kwargs):
        raise AssertionError("the engine played a schedule that should have been refused")

    monkeypatch.setattr(fast_engine, "run", played)
    monkeypatch.setattr(prediction, "simulate", played)
    refused("plan", "--model", "gpt3-125m", "--gbs", "10000000", needle="forward steps per iteration")
    refused("memory", "--model", "gpt3-125m", "--gbs", "16777216", needle="forward steps per iteration")
    refused("search", "--model", "gpt3-125m", "--gpus", "1", "--gbs", "16777216", needle="no plan")


def test_tokens_minus_one_is_refused_not_negative_days():
    refused("plan", "--model", "gpt3-125m", "--tokens", "-1", needle="--tokens")
    refused("search", *SMALL, "--tokens", "-1", needle="--tokens")


def test_search_top_is_bounded():
    refused("search", *SMALL, "--top", str(limits.MAX_TOP + 1), needle="--top")


# --- files read ----------------------------------------------------------------------------------

def _model_file(tmp_path, name: str, text: str | bytes) -> str:
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return str(path)


TINY_MODEL = "num_layers: 4\nhidden_size: 256\nnum_attention_heads: 8\nseq_length: 512\n"


@pytest.mark.parametrize("name,text,needle", [
    ("m.yaml", b"\xfe\xff: 1\n", "not UTF-8"),
    ("m.json", "[" * 100_000 + "]" * 100_000, "too deep"),
    ("m.yaml", "a: " + "[" * 100_000 + "]" * 100_000, "too deep"),
    ("m.yaml", "num_layers: " + "1" * 5000 + "\nhidden_size: 8\nnum_attention_heads: 1\n", "not valid YAML"),
    ("m.json", '{"num_layers": ' + "1" * 5000 + "}", "not valid JSON"),
    ("m.json", '{"num_layers": NaN, "hidden_size": 8, "num_attention_heads": 1}', "NaN"),
    ("m.yaml", "num_layers: !!python/object/apply:os.system ['true']\n", "not valid YAML"),
    ("m.yaml", "base: &b {x: 1}\nother: *b\n", "alias"),
    ("m.yaml", TINY_MODEL.replace("num_layers: 4", "num_layers: 100000"), "num_layers"),
    ("m.yaml", TINY_MODEL.replace("seq_length: 512", "seq_length: .inf"), "seq_length"),
    ("m.yaml", TINY_MODEL + "hidden_dropout: .nan\n", "hidden_dropout"),
    ("m.yaml", TINY_MODEL + "ffn_hidden_size: 1004\n", "ffn_hidden_size=1004"),  # with --tp 8 below
])
def test_broken_model_files(tmp_path, name, text, needle):
    refused("memory", "--model", _model_file(tmp_path, name, text), "--tp", "8", needle=needle)


def test_an_ffn_size_tp_does_not_divide_is_refused_not_rounded(tmp_path):
    path = _model_file(tmp_path, "m.yaml", TINY_MODEL + "ffn_hidden_size: 1002\n")
    refused("plan", "--model", path, "--tp", "4", needle="does not divide ffn_hidden_size=1002")
    ok("plan", "--model", path, "--tp", "2")  # 1002 = 2 x 501 splits evenly
    # the search never proposes what plan refuses
    doc = json.loads(ok("search", "--model", path, "--gpus", "8", "--gbs", "8", "--json", "--top", "20").output)
    assert {p["plan"]["tensor_parallel_size"] for p in doc["plans"]} <= {1, 2}


@pytest.mark.parametrize("what", ["model", "cluster", "profile"])
def test_names_longer_than_the_os_allows(what):
    name = "a" * 300 + (".json" if what == "profile" else ".yaml")
    refused("plan", f"--{what}", name, needle="more than the 255 a file name may have")


def test_a_nul_in_a_path_read_from_a_file(tmp_path):
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(CLUSTER.replace("gpu: A100-SXM4-80GB", 'gpu: "a\\0b.yaml"'))
    refused("plan", "--model", "gpt3-125m", "--cluster", str(cluster), needle="NUL")


def test_a_path_longer_than_the_os_allows():
    refused("plan", "--model", "/".join(["d" * 200] * 25) + ".yaml", needle="more than the 4,096")


@pytest.mark.parametrize("target", ["/dev/zero", "/proc", "fifo"])
def test_inputs_that_are_not_regular_files(tmp_path, target):
    if target == "fifo":
        import os

        target = str(tmp_path / "fifo.yaml")
        os.mkfifo(target)  # reading it would block forever
    refused("plan", "--model", target)


def test_an_input_file_over_the_size_bound(tmp_path):
    path = tmp_path / "big.yaml"
    with open(path, "wb") as f:
        f.truncate(limits.MAX_INPUT_FILE_BYTES + 1)
    refused("plan", "--model", str(path), needle="bytes, more than")


CLUSTER = (REPO / "hardware_specs" / "clusters" / "dgx-a100-80gb.yaml").read_text()


@pytest.mark.parametrize("old,new,needle", [
    ("gpus_per_node: 8", "gpus_per_node: 0", "gpus_per_node"),
    ("gpus_per_node: 8", "gpus_per_node: 100000000", "gpus_per_node"),
    ("nvswitch: true", "nvswitch: false\n# mesh", None),  # 8 GPUs without NVSwitch is fine (DGX-1)
    ("nics_per_node: 8", "nics_per_node: 0", "nics_per_node"),
    ("nic_line_rate_gbit_s: 200", "nic_line_rate_gbit_s: 0", "nic_line_rate_gbit_s"),
    ("nic_line_rate_gbit_s: 200", "nic_line_rate_gbit_s: 1e-300", "nic_line_rate_gbit_s"),
    ("nic_line_rate_gbit_s: 200", "nic_line_rate_gbit_s: .inf", "nic_line_rate_gbit_s"),
    ("nodes_per_scalable_unit: 20", "nodes_per_scalable_unit: 0", "nodes_per_scalable_unit"),
])
def test_broken_cluster_files(tmp_path, old, new, needle):
    assert old in CLUSTER
    path = tmp_path / "cluster.yaml"
    path.write_text(CLUSTER.replace(old, new))
    if needle is None:
        ok("plan", "--model", "gpt3-125m", "--cluster", str(path))
    else:
        refused("plan", "--model", "gpt3-125m", "--cluster", str(path), needle=needle)


def test_a_mesh_node_of_many_gpus_is_refused(tmp_path):
    path = tmp_path / "cluster.yaml"
    path.write_text(CLUSTER.replace("gpus_per_node: 8", "gpus_per_node: 64").replace("nvswitch: true", "nvswitch: false"))
    refused("plan", "--model", "gpt3-125m", "--cluster", str(path), needle="nvswitch")


def test_a_gpu_spec_with_a_tiny_memory_is_refused(tmp_path):
    gpu = (REPO / "hardware_specs" / "gpus" / "a100-sxm4-80gb.yaml").read_text()
    (tmp_path / "gpu.yaml").write_text(gpu.replace("hbm_capacity_gib: 80", "hbm_capacity_gib: 1e-12"))
    assert "hbm_capacity_gib: 80" in gpu
    cluster = CLUSTER.replace("gpu: A100-SXM4-80GB", f"gpu: {tmp_path / 'gpu.yaml'}")
    assert cluster != CLUSTER
    (tmp_path / "cluster.yaml").write_text(cluster)
    refused("plan", "--model", "gpt3-125m", "--cluster", str(tmp_path / "cluster.yaml"), needle="hbm_capacity_gib")


# --- profiles and run records --------------------------------------------------------------------

def _profile_with(tmp_path, change) -> str:
    data = json.loads((REPO / "calibration" / "profiles" / "a100-sxm4-80gb-published.json").read_text())
    change(data)
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(data))
    return str(path)


@pytest.mark.parametrize("change,needle", [
    (lambda d: d["gemm"].update(max_efficiency=float("inf")), "Infinity"),
    (lambda d: d["gemm"].update(launch_overhead_s=1e300), "launch_overhead_s"),
    (lambda d: d["collectives"]["network"].update(max_busbw_gbps=1e300), "max_busbw_gbps"),
    (lambda d: d["collectives"]["nvlink"].update(half_size_bytes=-5.0), "half_size_bytes"),
    (lambda d: d["elementwise"].update(kernel_fractions={"layer_norm": -0.5}), "kernel_fractions"),
    (lambda d: d["gemm"].update(tile_m=1e300), "tile_m"),
    (lambda d: d["gemm"].update(tile_choices=[[0, 128]]), "tile_choices"),
    (lambda d: d["gemm"].update(tile_choices=[]), "tile_choices"),
    (lambda d: d["gemm"].update(full_rate_intensity_elements=-1.0), "full_rate_intensity_elements"),
    (lambda d: d["collectives"]["nvlink"]["ramp_curve"].__setitem__(0, [32768.0, 5.0]), "ramp_curve"),
])
def test_corrupt_profile_numbers_are_refused(tmp_path, change, needle):
    refused("plan", "--model", "gpt3-125m", "--profile", _profile_with(tmp_path, change), needle=needle)


def test_non_utf8_and_deep_profiles(tmp_path):
    bad = tmp_path / "p.json"
    bad.write_bytes(b'{"schema_version": 1, "name": "\xff"}')
    refused("plan", "--profile", str(bad), needle="not UTF-8")
    bad.write_text("[" * 100_000 + "]" * 100_000)
    refused("plan", "--profile", str(bad), needle="too deep")


def test_a_gpu_name_with_dot_dot_loads_no_profile_from_elsewhere(tmp_path):
    # a profile planted outside the shipped folder, reachable by a relative name
    planted = tmp_path / "evil-published.json"
    planted.write_text((REPO / "calibration" / "profiles" / "a100-sxm4-80gb-published.json").read_text())
    from simulator.cost.profile import _profile_dir

    relative = Path("..", "..", "..", "..", "..", "..", "..", "..", *tmp_path.parts[1:], "evil")
    assert (_profile_dir() / f"{relative}-published.json").resolve() == planted.resolve()
    gpu = (REPO / "hardware_specs" / "gpus" / "a100-sxm4-80gb.yaml").read_text()
    (tmp_path / "gpu.yaml").write_text(gpu.replace("name: A100-SXM4-80GB", f"name: {relative}"))
    assert f"name: {relative}" in (tmp_path / "gpu.yaml").read_text()
    cluster = CLUSTER.replace("gpu: A100-SXM4-80GB", f"gpu: {tmp_path / 'gpu.yaml'}")
    (tmp_path / "cluster.yaml").write_text(cluster)
    refused("plan", "--model", "gpt3-125m", "--cluster", str(tmp_path / "cluster.yaml"), needle="no published profile")
    refused("plan", "--model", "gpt3-125m", "--profile", f"{relative}-published", needle="unknown profile")


RECORD = REPO / "reports" / "cpu-validation" / "run-tp1.json"


@pytest.mark.parametrize("change,needle", [
    (lambda d: d["iteration_times_s"].__setitem__(0, float("nan")), "NaN"),
    (lambda d: d["iteration_times_s"].__setitem__(0, -1.0), "iteration_times_s"),
    (lambda d: d["iteration_times_s"].__setitem__(0, 1e300), "iteration_times_s"),
    (lambda d: d["losses"].__setitem__(0, float("inf")), "Infinity"),
    (lambda d: d["layers"][0].update(backward_s=-0.5), "backward_s"),
    (lambda d: d["layers"][0].update(activation_bytes=10**40), "activation_bytes"),
])
def test_corrupt_run_records_are_refused(tmp_path, change, needle):
    data = json.loads(RECORD.read_text())
    change(data)
    path = tmp_path / "run.json"
    path.write_text(json.dumps(data))
    refused("validate", str(path), "--memory-only", needle=needle)


def test_a_sound_run_record_still_validates():
    ok("validate", str(RECORD), "--memory-only")


# --- raw calibration points ----------------------------------------------------------------------

@pytest.mark.parametrize("change,needle", [
    (lambda r: r["gemm"][0].update(m=0), "m=0"),
    (lambda r: r["gemm"][0].update(k=1e300), "k=1e+300"),
    (lambda r: r["elementwise"][0].update(bytes_moved=-4), "bytes_moved=-4"),
    (lambda r: r["gemm"][0].update(time_s=True), "time_s=True"),
    (lambda r: r["elementwise"][0].update(time_s=1e6), "time_s"),
])
def test_raw_points_that_no_fit_can_start_from(tmp_path, change, needle):
    raw = _synthetic_raw()
    change(raw)
    (tmp_path / "raw.json").write_text(json.dumps(raw))
    refused("calibrate", "--raw", str(tmp_path / "raw.json"), "--out", str(tmp_path / "p.json"), needle=needle)
    assert not (tmp_path / "p.json").exists()


def test_a_fit_the_profile_checks_would_refuse_is_not_written(tmp_path):
    raw = _with_collectives([1e-4 + 2**e / 1e9 for e in range(12, 24, 2)])
    for point in raw["collectives"]:
        if point["kind"] == "send_recv":
            point["time_s"] += 100.0  # a stalled machine: 100 s per message, a latency no link has
    (tmp_path / "raw.json").write_text(json.dumps(raw))
    refused("calibrate", "--raw", str(tmp_path / "raw.json"), "--out", str(tmp_path / "p.json"),
            needle="nothing was written")
    assert not (tmp_path / "p.json").exists()


def test_a_fit_far_off_its_points_is_refused(tmp_path):
    raw = _synthetic_raw()
    for i, point in enumerate(raw["gemm"]):
        point["time_s"] *= 100.0 if i % 2 else 1.0  # every other GEMM timed while something else ran
    (tmp_path / "raw.json").write_text(json.dumps(raw))
    refused("calibrate", "--raw", str(tmp_path / "raw.json"), "--out", str(tmp_path / "p.json"),
            needle="measure again on a quiet machine")
    assert not (tmp_path / "p.json").exists()


# --- --require-fit -------------------------------------------------------------------------------

def test_require_fit_exits_3_when_the_plan_does_not_fit():
    for command in ("plan", "memory"):
        result = CliRunner().invoke(cli, [command, "--model", "gpt3-175b", "--gpus", "8", "--tp", "8", "--require-fit"])
        assert result.exit_code == 3, result.output
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: the plan does not fit"), result.stderr
        assert "iteration time" in result.stdout or "does NOT fit" in result.stdout  # the answer is still printed
        # without the flag it is an answer, not an error
        assert CliRunner().invoke(cli, [command, "--model", "gpt3-175b", "--gpus", "8", "--tp", "8"]).exit_code == 0
    json_result = CliRunner().invoke(cli, ["memory", "--model", "gpt3-175b", "--gpus", "8", "--tp", "8", "--json",
                                           "--require-fit"])
    assert json_result.exit_code == 3 and json.loads(json_result.stdout)["fits"] is False


def test_require_fit_exits_0_when_the_plan_fits():
    ok("plan", "--model", "gpt3-125m", "--require-fit")
    ok("memory", "--model", "gpt3-125m", "--require-fit", "--json")


# --- answers that were wrong with exit 0 ---------------------------------------------------------

def test_fp8_mfu_is_capped_at_one_with_a_note():
    args = ["plan", "--model", "megatron-1t", "--cluster", "dgx-h100", "--tp", "8", "--mbs", "4", "--gbs", "32",
            "--use-flash-attn", "--fp8-format", "hybrid", "--json"]
    doc = json.loads(ok(*args).output)
    assert doc["mfu"] <= doc["hfu"] <= 1.0
    # the rate is kept: above the bf16 dense peak, which is why the ratio was capped
    peak = load_cluster("dgx-h100").gpu.peak_tflops.bf16
    assert doc["tflops_per_gpu"] > peak
    assert "capped at 1" in doc["utilisation_note"] and "FP8" in doc["utilisation_note"]
    assert "note: MFU" in ok(*args[:-1]).output
    plain = json.loads(ok("plan", "--model", "gpt3-125m", "--json").output)
    assert plain["utilisation_note"] is None and plain["mfu"] < 1


def test_nemo_fragment_for_12_gpus_has_12_devices():
    doc = json.loads(ok("search", "--model", "gpt3-125m", "--gpus", "12", "--gbs", "12", "--json", "--top", "1").output)
    yaml_text = doc["nemo_yaml"]
    nodes = int(next(line.split(":")[1] for line in yaml_text.splitlines() if "num_nodes:" in line))
    devices = int(next(line.split(":")[1] for line in yaml_text.splitlines() if "devices:" in line))
    assert nodes * devices == 12 and devices <= 8
    tp = doc["plans"][0]["plan"]["tensor_parallel_size"]
    assert devices % tp == 0  # each tensor-parallel group inside one node


def test_json_is_strict():
    for args in (["plan", "--model", "gpt3-125m", "--seq-length", "1", "--tokens", "1e9", "--json"],
                 ["memory", "--model", "gpt3-125m", "--json"],
                 ["search", *SMALL, "--tokens", "1e9", "--json", "--top", "2"]):
        json.loads(ok(*args).output, parse_constant=lambda name: pytest.fail(f"{name} in {args}"))


def test_mplbackend_bogus_still_draws_the_figure(tmp_path):
    png = tmp_path / "pareto.png"
    ok("search", *SMALL, "--pareto", str(png), env={"MPLBACKEND": "bogus"})
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# --- the search refuses what `plan` refuses, with the same sentence ----------------------------------

SEARCH_H100 = ["--model", "gpt3-1.3b", "--gpus", "8", "--gbs", "16", "--cluster", "dgx-h100"]


@pytest.mark.parametrize("flags", [
    ["--fp8-format", "hybrid", "--precision", "fp32"],
    ["--fp8-format", "e4m3", "--precision", "fp32"],
    ["--attention-backend", "local", "--use-flash-attn"],
    ["--attention-backend", "unfused", "--use-flash-attn"],
    ["--cp", "2", "--attention-backend", "unfused"],
    ["--cp", "3"],
    ["--fp8-format", "hybrid", "--cluster", "dgx-a100-80gb"],
    ["--tp", "8", "--sp", "--seq-length", "12"],
])
def test_search_refuses_flags_plan_refuses_with_the_same_sentence(flags):
    """Every setting the search pins or applies to all its plans goes through the checks `plan` makes; a pair
    plan refuses is never a pydantic traceback nor an answer from the search."""
    sentence = refused("plan", *SEARCH_H100, *flags)
    assert refused("search", *SEARCH_H100, *flags) == sentence


@pytest.mark.parametrize("flags, needle", [
    (["--cp", str(limits.MAX_GPUS + 1)], "--context-parallel-size"),
    (["--cp", "0"], "--context-parallel-size"),
])
def test_search_pins_are_bounded_like_plans(flags, needle):
    refused("search", *SEARCH_H100, *flags, needle=needle)


@pytest.mark.parametrize("command", ["sweep", "report"])
def test_an_output_folder_name_too_long_is_one_sentence(tmp_path, command):
    folder = tmp_path / ("o" * 300)
    if command == "sweep":
        spec = tmp_path / "spec.yaml"
        spec.write_text("models: [gpt3-125m]\ngpus: [8]\nglobal_batch_sizes: [8]\n")
        line = refused("sweep", str(spec), "--out", str(folder), "--workers", "1", needle="more than the 255")
        assert line.startswith("error: the sweep's results path has a name of 300 bytes"), line
    else:
        line = refused("report", "--out", str(folder), needle="more than the 255")
        assert line.startswith("error: the report path has a name of 300 bytes"), line
    assert folder.name not in {p.name for p in tmp_path.iterdir()}


def test_a_figure_suffix_no_format_has_is_one_sentence(tmp_path):
    # the format follows the suffix: one that names none is refused before the figure is computed, not by matplotlib
    line = refused("plot", "timeline", "--model", "gpt3-125m", "--gbs", "4", "--out", str(tmp_path / "t.txt"),
                   needle="names no figure format")
    assert "t.png" in line and not (tmp_path / "t.txt").exists()


@pytest.mark.parametrize("block", [
    "storage:\n  save_fixed_s: {value: 5, low: 6, high: 7, source: \"ours\"}\n",
    "storage:\n  read_gbps: {value: 0.0001, low: 0.0001, high: 1, source: \"ours\"}\n",
    "storage: fast\n",
])
def test_a_cluster_files_storage_block_is_refused_naming_the_file_and_the_field(tmp_path, block):
    cluster = tmp_path / "mine.yaml"
    cluster.write_text((REPO / "hardware_specs" / "clusters" / "dgx-h100.yaml").read_text() + block)
    line = refused("plan", *SMALL, "--cluster", str(cluster))
    assert str(cluster) in line and "field 'storage" in line, line
