"""`simulator calibrate`: raw points in, a measured profile out that `plan` accepts; clear errors on bad files."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from calibration.microbench import RAW_FORMAT, RAW_VERSION
from calibration.microbench.shapes import (
    LayerDims,
    grid_gemms,
    layer_gemms,
    unique_gemms,
)
from simulator.cli import cli
from simulator.cli.calibrate_cmd import calibrate_command
from simulator.cost.attention import attention_forward_flops, attention_time_s
from simulator.cost.elementwise import elementwise_time_s
from simulator.cost.gemm import gemm_time_s
from simulator.cost.profile import (
    AttentionParams,
    ElementwiseParams,
    GemmParams,
    default_profile,
    load_profile,
    save_profile,
)
from simulator.measure.calibrate import fit_profile, gpu_for_device, read_raw
from simulator.spec.errors import ProfileError
from simulator.spec.hardware import load_gpu


def _synthetic_raw(with_collectives: bool = False) -> dict:
    """Points an H200 would give if the published profile's model forms held exactly."""
    gpu, truth = load_gpu("h200-sxm-141gb"), default_profile("H200-SXM-141GB")
    peak = gpu.peak_tflops.bf16 * 1e12
    gemm_truth = truth.gemm.model_copy(update={"ceiling_efficiency": None})
    shapes = unique_gemms(layer_gemms(LayerDims(12288, 96, 49152, 2048, 1, 8)) + grid_gemms(False, "cuda"))
    gemm = [{"name": g.name, "m": g.m, "n": g.n, "k": g.k, "batch": g.batch, "dtype": "bfloat16",
             "time_s": float(gemm_time_s(gemm_truth, peak, gpu.sm_count, g.m, g.n, g.k, g.batch, 2)),
             "held_out": i % 5 == 2} for i, g in enumerate(shapes)]
    attention = []
    for seq in (512, 1024, 2048, 4096, 8192):
        bh = 12 * max(1, 2048 // seq)
        for backward in (False, True):
            flops = attention_forward_flops(bh, seq, 128, True) * (2.5 if backward else 1.0)
            t = float(attention_time_s(truth.attention, peak, flops, seq, backward, 128, True))
            attention.append({"impl": "fused", "pass": "backward" if backward else "forward", "batch_heads": bh,
                              "seq": seq, "head_dim": 128, "causal": True, "dtype": "bfloat16", "time_s": t})
    elementwise = [{"kernel": "copy", "bytes_moved": 2 ** e, "time_s":
                    float(elementwise_time_s(truth.elementwise, gpu.hbm_bandwidth_gbps, 2 ** e))} for e in range(16, 31, 2)]
    sections = {"collectives": {"status": "skipped", "error": "1 GPU(s): NCCL needs one GPU per rank"}}
    return {"format": RAW_FORMAT, "version": RAW_VERSION,
            "device": {"kind": "cuda", "name": "NVIDIA H200", "driver": "580.159.03", "torch_version": "2.11.0",
                       "cuda_version": "13.0", "date": "2026-11-30T00:00:00+00:00", "host": "gpu-1",
                       "memory_bytes": 143771 * 2**20},
            "settings": {}, "gemm": gemm, "attention": attention, "elementwise": elementwise, "collectives": [],
            "sections": sections}


def test_fit_recovers_a_known_profile_and_predicts_held_out_gemms():
    result = fit_profile(_synthetic_raw())
    truth = default_profile("H200-SXM-141GB")
    p = result.profile
    assert p.source == "measured" and p.gpu == "H200-SXM-141GB" and p.device.host == "gpu-1"
    assert result.held_out and max(abs(h.error) for h in result.held_out) < 0.02
    assert p.gemm.max_efficiency == pytest.approx(truth.gemm.max_efficiency, rel=0.02)
    assert p.elementwise.achieved_fraction == pytest.approx(truth.elementwise.achieved_fraction, rel=0.02)
    assert p.attention.forward_efficiency == pytest.approx(truth.attention.forward_efficiency, rel=0.02)
    # one GPU measures no collectives: they come from the published profile, and the notes say so
    assert p.collectives == truth.collectives
    assert any("collectives not measured" in n for n in result.notes)
    # the held-out points travel in the profile with their prediction errors
    held = [f for f in p.gemm.fits if "held out" in f.note]
    assert len(held) == 1 and len(held[0].points) == len(result.held_out)


def test_the_layer_gemms_are_given_back_as_timed_and_other_shapes_by_the_fit():
    """A CPU's small attention GEMMs run slower than any smooth form of shape gives them: the layer's own
    shapes keep their measured time, accumulating into a gradient buffer adds what the fit adds for it,
    and shapes the layer does not have (the grid) stay the fit's."""
    from simulator.cost import CostModel
    from simulator.graph.layers import GemmShape, Op, OpKind
    from simulator.spec.hardware import load_cluster
    from simulator.spec.plan import Precision

    raw = _cpu_raw()
    layer = [r for r in raw["gemm"] if not r["name"].startswith("grid.")]
    slow = next(r for r in layer if r["batch"] > 1)
    slow["time_s"] *= 1.6  # what no fitted shape term gives: the layer's batched GEMM off the form
    profile = fit_profile(raw, check=False).profile
    cost = CostModel(load_cluster("local-cpu"), profile, Precision.fp32)

    def op(r, accumulate=0):
        return Op("g", OpKind.batched_gemm if r["batch"] > 1 else OpKind.gemm,
                  gemm=GemmShape(r["m"], r["n"], r["k"], r["batch"], accumulate))

    for r in layer:
        assert cost.op_time_s(op(r)) == pytest.approx(r["time_s"], rel=1e-12)
    wgrad = next(r for r in layer if r["name"].endswith(".wgrad"))
    fit_only = CostModel(load_cluster("local-cpu"),
                         profile.model_copy(update={"gemm": profile.gemm.model_copy(update={"measured": None})}),
                         Precision.fp32)
    extra = fit_only.op_time_s(op(wgrad, 4)) - fit_only.op_time_s(op(wgrad))
    assert extra > 0 and cost.op_time_s(op(wgrad, 4)) == pytest.approx(wgrad["time_s"] + extra, rel=1e-12)
    for r in (r for r in raw["gemm"] if r["name"].startswith("grid.")):
        if (r["m"], r["n"], r["k"], r["batch"]) not in {(x["m"], x["n"], x["k"], x["batch"]) for x in layer}:
            assert cost.op_time_s(op(r)) == fit_only.op_time_s(op(r))
    with pytest.raises(ValueError, match="repeat a shape"):
        GemmParams.model_validate({**profile.gemm.model_dump(), "measured": (profile.gemm.measured[0],) * 2})


@pytest.mark.parametrize("ratios, slowdown", [((1.10, 1.04, 1.06), 0.06), ((0.95, 0.97, 1.01), 0.0)])
def test_ranks_sharing_the_machine_slow_each_others_compute_as_measured(ratios, slowdown):
    """The median round of (every rank at once / one rank alone) less 1, never below 0; the cost model scales
    a rank's compute (not its collectives) by it when the plan keeps the machine's other device busy."""
    from simulator.cost import CostModel, busy_neighbours
    from simulator.graph.ops import CollectiveKind, CollectiveOp, GemmShape, Op, OpKind
    from simulator.spec.hardware import load_cluster
    from simulator.spec.plan import Precision

    raw = _cpu_raw()
    raw["shared_compute"] = {"ranks": 2, "alone_s": [0.01] * len(ratios), "together_s": [0.01 * r for r in ratios]}
    profile = fit_profile(raw, check=False).profile
    assert profile.host_sharing_slowdown == pytest.approx(slowdown, abs=1e-12)
    assert profile.host_sharing_source.startswith("measured")
    assert fit_profile(_cpu_raw(), check=False).profile.host_sharing_slowdown == 0.0  # not measured: 0
    cpu = load_cluster("local-cpu")
    assert (busy_neighbours(cpu, 1), busy_neighbours(cpu, 2), busy_neighbours(cpu, 8)) == (0, 1, 1)
    gemm = Op("fc1", OpKind.gemm, gemm=GemmShape(256, 1024, 256, 1))
    comm = Op("ar", OpKind.collective, collective=CollectiveOp(CollectiveKind.all_reduce, 1 << 20, 2, 1))
    alone, shared = (CostModel(cpu, profile, Precision.fp32, n) for n in (0, 1))
    assert shared.op_time_s(gemm) == pytest.approx(alone.op_time_s(gemm) * (1 + slowdown), rel=1e-12)
    assert shared.op_time_s(comm) == alone.op_time_s(comm)
    # a GPU node's published profile measured none: eight busy GPUs cost as one
    a100 = load_cluster("dgx-a100-80gb")
    p = default_profile(a100.gpu.name)
    assert busy_neighbours(a100, 64) == 7
    assert CostModel(a100, p, Precision.bf16, 7).op_time_s(gemm) == CostModel(a100, p, Precision.bf16).op_time_s(gemm)


def test_a_ranks_own_spread_is_measured_apart_from_what_the_machine_does_to_all():
    """Ranks' times in each round of the shared blocks: a drift of every rank alike (round to round) is not a
    rank's jitter; a rank's gap to the round's mean is, as the normal spread with that mean gap."""
    rng = np.random.default_rng(0)
    drift = 1 + 0.3 * rng.random(400)  # the machine's speed, the same for both ranks in a round
    own = rng.normal(0.0, 0.1, (2, 400))
    raw = _cpu_raw()
    raw["shared_compute"] = {"ranks": 2, "passes": 8, "alone_s": list(0.01 * drift),
                             "together_s": list(0.01 * drift), "together_by_rank_s": (0.01 * (drift + own)).tolist()}
    profile = fit_profile(raw, check=False).profile
    assert profile.step_jitter == pytest.approx(0.1 / 1.15, rel=0.1) and profile.step_jitter_source.startswith("measured")
    assert fit_profile(_cpu_raw(), check=False).profile.step_jitter == 0.0


def _sequence_rounds(ratios, alone_forward_s=0.02, alone_backward_s=0.03) -> list[dict]:
    return [{"loop_forward_s": alone_forward_s * r, "loop_backward_s": alone_backward_s * r,
             "alone_forward_s": alone_forward_s, "alone_backward_s": alone_backward_s} for r in ratios]


@pytest.mark.parametrize("ratios, slowdown", [((1.30, 1.20, 1.35, 1.28, 1.9), 0.30), ((0.97, 0.99, 1.01), 0.0)])
def test_ops_in_a_step_are_slowed_as_measured_against_the_same_ops_alone(ratios, slowdown):
    """The median round of (the layers as a step runs them, less the host block's issue cost) over (their ops
    alone) less 1, never below 0; one slow round does not move it."""
    raw = _cpu_raw()
    raw["sequence"] = {"layers": 4, "ops_forward": 0, "ops_backward": 0, "rounds": _sequence_rounds(ratios)}
    profile = fit_profile(raw, check=False).profile
    assert profile.sequence_slowdown == pytest.approx(slowdown, abs=1e-12)
    assert profile.sequence_source.startswith("measured")
    assert fit_profile(_cpu_raw(), check=False).profile.sequence_slowdown == 0.0  # not measured: 0
    # what the host block charges for issuing the ops is not counted again
    raw["sequence"].update(ops_forward=1000, ops_backward=2000)
    host = fit_profile(raw, check=False).profile.host
    issue_s = 1000 * host.op_s + 2000 * host.backward_op_s
    assert issue_s > 0
    expected = sorted((0.05 * r - issue_s) / 0.05 for r in ratios)[len(ratios) // 2] - 1
    assert fit_profile(raw, check=False).profile.sequence_slowdown == pytest.approx(max(expected, 0.0), abs=1e-12)


def _sustained_point(burst_s: float, windows: list[float]) -> dict:
    return {"name": "sustained", "m": 8192, "n": 8192, "k": 8192, "batch": 1, "dtype": "bfloat16",
            "burst_s": burst_s, "window_s": windows, "seconds": 30.0}


def test_a_gpu_held_at_its_power_limit_gives_its_profile_the_clock_it_sustained():
    """The burst over the median of the run's later windows (the first half, before the limit binds, is
    not counted), held at 1; without the section the bursts stand; a CPU's point is kept, not applied."""
    raw = _synthetic_raw()
    assert fit_profile(raw, check=False).profile.sustained_clock_fraction == 1.0
    raw["sustained"] = [_sustained_point(0.0040, [0.0040, 0.0041, 0.0042, 0.00425, 0.0042, 0.0043])]
    profile = fit_profile(raw, check=False).profile
    assert profile.sustained_clock_fraction == pytest.approx(0.0040 / 0.00425, rel=1e-12)
    assert profile.sustained_clock_source.startswith("measured")
    raw["sustained"] = [_sustained_point(0.0040, [0.0039, 0.0038, 0.0039, 0.0038])]  # a boost, or noise
    assert fit_profile(raw, check=False).profile.sustained_clock_fraction == 1.0
    cpu = _cpu_raw()
    cpu["sustained"] = [_sustained_point(0.0040, [0.0050, 0.0050])]
    profile = fit_profile(cpu, check=False).profile
    assert profile.sustained_clock_fraction == 1.0 and "not applied on a CPU" in profile.sustained_clock_source


def test_gpus_run_at_once_give_the_clock_they_held_together_and_their_spread():
    """Every GPU of a machine in the sustained run at once: the clock is the devices' mean burst / settled
    ratio, the spread the sample standard deviation of their settled throughputs over its mean; one device
    measures no spread."""
    import statistics

    late = [0.0042, 0.0042, 0.0044, 0.0040]
    point = _sustained_point(0.0040, [0.0040, late[0], late[0]])
    point.update(device_burst_s=[0.0040] * 4, device_window_s=[[0.0040, t, t] for t in late])
    raw = _synthetic_raw()
    raw["sustained"] = [point]
    profile = fit_profile(raw, check=False).profile
    assert profile.sustained_clock_fraction == pytest.approx(statistics.fmean(0.0040 / t for t in late), rel=1e-12)
    speeds = [1 / t for t in late]
    assert profile.device_speed_spread == pytest.approx(statistics.stdev(speeds) / statistics.fmean(speeds),
                                                        rel=1e-12)
    assert profile.device_speed_spread_source.startswith("measured")
    raw["sustained"] = [_sustained_point(0.0040, [0.0040, 0.0042])]
    assert fit_profile(raw, check=False).profile.device_speed_spread == 0.0


def test_the_step_slowdown_scales_the_layers_compute_and_nothing_else():
    """A layer's forward and backward (and the embedding's, the loss's) scale by 1 + the slowdown on a device
    whose every op runs in turn; the collectives between them and the optimizer step do not."""
    from simulator.cost import CostModel
    from simulator.graph.layers import transformer_layer
    from simulator.graph.ops import CollectiveKind, CollectiveOp, GemmShape, Op, OpKind
    from simulator.schedule.timing import play
    from simulator.spec.hardware import load_cluster
    from simulator.spec.model import ModelSpec
    from simulator.spec.plan import ParallelPlan, Precision

    base = fit_profile(_cpu_raw(), check=False).profile.model_copy(update={"host": None})
    cpu = load_cluster("local-cpu")
    plain, slowed = (CostModel(cpu, base.model_copy(update={"sequence_slowdown": s}), Precision.fp32) for s in (0, 0.3))
    gemm = Op("fc1", OpKind.gemm, gemm=GemmShape(256, 1024, 256, 1))
    comm = Op("ar", OpKind.collective, collective=CollectiveOp(CollectiveKind.all_reduce, 1 << 20, 2, 1))
    optimizer = Op("optimizer", OpKind.elementwise, bytes_moved=1 << 24)
    assert slowed.step_op_time_s(gemm) == pytest.approx(1.3 * plain.step_op_time_s(gemm), rel=1e-12)
    assert slowed.step_op_time_s(comm) == plain.step_op_time_s(comm)
    assert slowed.op_time_s(optimizer) == plain.op_time_s(optimizer)
    layer = transformer_layer(ModelSpec(name="m", num_layers=2, hidden_size=256, num_attention_heads=8,
                                        vocab_size=2048, seq_length=256),
                              ParallelPlan(micro_batch_size=1, global_batch_size=1, precision="fp32",
                                           attention_backend="unfused"))
    for graph in (layer.forward, layer.backward):
        a, b = play([graph], plain), play([graph], slowed)
        assert b.duration_s == pytest.approx(1.3 * a.duration_s, rel=1e-9) and a.duration_s > 0


def _with_collectives(all_reduce_times_s: list[float]) -> dict:
    raw = _synthetic_raw()
    sizes = [2**e for e in range(12, 12 + 2 * len(all_reduce_times_s), 2)]
    rows = [{"kind": "all_reduce", "bytes": b, "group_size": 2, "backend": "gloo", "time_s": t}
            for b, t in zip(sizes, all_reduce_times_s)]
    rows += [{"kind": "send_recv", "bytes": b, "group_size": 2, "backend": "gloo", "time_s": 1e-4 + b / 2e9}
             for b in sizes]
    raw["collectives"] = rows
    raw["sections"] = {}
    return raw


def test_a_clean_all_reduce_sweep_becomes_the_bandwidth_curve():
    times = [1e-4 + 2**e / 1e9 for e in range(12, 24, 2)]  # grows with size
    result = fit_profile(_with_collectives(times))
    link = result.profile.collectives.nvlink  # GPUs of one machine: the measured link is NVLink
    # the latency is at least the smallest time, so that point carries no bandwidth and the curve starts above it
    assert link.ramp_curve is not None and len(link.ramp_curve) == len(times) - 1
    assert link.latency_s == pytest.approx(times[0], rel=1e-6)
    ar = next(e for e in result.fit_errors if e.block == "collectives.all_reduce")
    # the model gives back every measured time; the smallest with the fitted ramp's bandwidth term on top
    assert ar.max_abs < 0.10


def test_a_noisy_all_reduce_sweep_keeps_the_smooth_fit_and_says_so():
    times = [1e-4 + 2**e / 1e9 for e in range(12, 24, 2)]
    times[2] *= 3  # a smaller size three times slower than the next
    result = fit_profile(_with_collectives(times), check=False)
    assert result.profile.collectives.nvlink.ramp_curve is None
    assert any("noisy" in n for n in result.notes)


def test_devices_map_to_gpu_specs():
    assert gpu_for_device({"kind": "cpu"}).name == "CPU"
    assert gpu_for_device({"kind": "cuda", "name": "NVIDIA A100-SXM4-40GB", "memory_bytes": 40 * 2**30}).name == "A100-SXM4-40GB"
    assert gpu_for_device({"kind": "cuda", "name": "NVIDIA A100-SXM4-80GB", "memory_bytes": 80 * 2**30}).name == "A100-SXM4-80GB"
    with pytest.raises(ProfileError, match="--gpu"):
        gpu_for_device({"kind": "cuda", "name": "Tesla T4"})


@pytest.mark.parametrize("mutate,match", [
    (lambda r: r.update(format="something-else"), "not a raw points file"),
    (lambda r: r.update(version=99), "version 99"),
    (lambda r: r["gemm"][0].update(time_s=-1.0), "time_s=-1.0"),
    (lambda r: r["gemm"][0].pop("m"), "lacks \\['m'\\]"),
    (lambda r: r["gemm"][0].pop("name"), "lacks \\['name'\\]"),  # it used to raise KeyError when the fit read it
    (lambda r: r.update(elementwise=[]), "no elementwise points"),
    (lambda r: r.update(device={"kind": "tpu"}), "kind 'cuda' or 'cpu'"),
    (lambda r: r.update(sequence={"rounds": [{"loop_forward_s": 0.1}]}), "sequence round 0 has loop_backward_s=None"),
    (lambda r: r.update(sequence={"rounds": "fast"}), "'sequence' must be the mapping"),
    (lambda r: r.update(sequence={"ops_forward": -3, "rounds": []}), "sequence ops_forward=-3"),
    (lambda r: r.update(sustained=[{"burst_s": 0.004, "window_s": []}]), "sustained point 0 needs"),
    (lambda r: r.update(sustained=[{"burst_s": -1.0, "window_s": [0.004]}]), "sustained point 0 needs"),
    (lambda r: r.update(sustained="hot"), "'sustained' must be the list"),
    (lambda r: r.update(sustained=[{"burst_s": 0.004, "window_s": [0.004], "device_burst_s": [0.004, 0.004],
                                    "device_window_s": [[0.004]]}]), "one non-empty list of positive device_window_s"),
])
def test_bad_raw_files_are_one_profile_error(tmp_path, mutate, match):
    raw = _synthetic_raw()
    mutate(raw)
    path = tmp_path / "raw.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(ProfileError, match=match):
        read_raw(path)


def test_cli_fits_raw_points_and_reports_held_out(tmp_path):
    raw, out = tmp_path / "raw.json", tmp_path / "profile.json"
    raw.write_text(json.dumps(_synthetic_raw()))
    res = CliRunner().invoke(cli, ["calibrate", "--raw", str(raw), "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "held-out GEMMs" in res.output and "rms error" in res.output
    assert "tiles chosen among 8" in res.output  # H200: the published choice of tiles, held in the fit
    assert load_profile(out).source == "measured"
    res = CliRunner().invoke(cli, ["calibrate", "--raw", str(raw), "--out", str(out), "--json"])
    doc = json.loads(res.output)
    assert doc["held_out_gemms"] and doc["held_out_rms_error"] < 0.02


@pytest.mark.parametrize("content", ["{not json", json.dumps([1, 2]), json.dumps({"format": RAW_FORMAT, "version": 1})])
def test_cli_corrupt_raw_exits_2_with_one_line(tmp_path, content):
    raw = tmp_path / "raw.json"
    raw.write_text(content)
    res = CliRunner().invoke(cli, ["calibrate", "--raw", str(raw), "--out", str(tmp_path / "p.json")])
    assert res.exit_code == 2
    assert res.output.startswith("error: ") and len(res.output.strip().splitlines()) == 1
    assert not (tmp_path / "p.json").exists()


@pytest.mark.parametrize("args", [
    ["calibrate", "--out", "p.json"],  # neither --device nor --raw
    ["calibrate", "--raw", "raw.json", "--quick", "--out", "p.json"],
    ["calibrate", "--raw", "missing.json", "--out", "p.json"],
    ["calibrate", "--device", "tpu", "--out", "p.json"],
])
def test_cli_bad_flags_exit_2(tmp_path, monkeypatch, args):
    (tmp_path / "raw.json").write_text(json.dumps(_synthetic_raw()))
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 2 and res.output.startswith("error: ")


def test_cli_raw_from_another_device_is_refused(tmp_path):
    raw = tmp_path / "raw.json"
    raw.write_text(json.dumps(_synthetic_raw()))
    res = CliRunner().invoke(cli, ["calibrate", "--device", "cpu", "--raw", str(raw), "--out", str(tmp_path / "p.json")])
    assert res.exit_code == 2 and "measured on cuda" in res.output


def test_corrupt_profile_is_refused_by_plan(tmp_path):
    bad = tmp_path / "profile.json"
    bad.write_text('{"schema_version": 1, "name": "x"')
    res = CliRunner().invoke(cli, ["plan", "--cluster", "local-cpu", "--model", "gpt3-125m", "--precision", "fp32",
                                   "--profile", str(bad)])
    assert res.exit_code == 2 and "not valid JSON" in res.output


@pytest.mark.slow  # a whole quick calibration of this CPU (about a minute; test-loaded runs it too)
@pytest.mark.measures
def test_calibrate_cpu_quick_end_to_end(tmp_path):
    """Measure this CPU for real. Either outcome keeps its contract, however busy the machine is: a profile that
    plan accepts, fitted to the points kept; or one sentence naming the cause the points record (a point the fit
    cannot give back, with the load average; too few collective points, with the collectives section's own
    reason), exit 2, no profile, and the raw points kept."""
    out, raw = tmp_path / "cpu.json", tmp_path / "raw.json"
    res = CliRunner().invoke(cli, ["calibrate", "--device", "cpu", "--quick", "--out", str(out), "--keep-raw", str(raw)])
    points = read_raw(raw)  # kept whatever the outcome
    assert points["device"]["load_average"] is not None and points["gemm"] and points["elementwise"]
    section = points["sections"]["collectives"]
    if res.exit_code == 2:
        message = res.output
        assert message.startswith("error: ") and len(message.strip().splitlines()) == 1, message
        assert not out.exists()
        if message.startswith("error: profile block "):
            assert "load average" in message and "--quick" in message, message
        elif "the collectives section gave" in message:
            # the cause the measurement recorded, and a flag calibrate has
            assert "--budget-s" in message and any(p.opts == ["--budget-s"] for p in calibrate_command.params)
            cause = section["error"] or f"{len(section['skipped'])} points would not have ended"
            assert " ".join(cause.split()) in message, message
        else:
            assert "measure again on an idle machine" in message, message
        return
    assert res.exit_code == 0, res.output
    profile = load_profile(out)
    assert profile.source == "measured" and profile.gpu == "CPU" and profile.device.torch_version
    assert profile.device.threads == 1
    assert "held-out GEMMs" in res.output
    # a measured link: enough collective points in one mode, whatever the budget skipped
    modes = [p["mode"] for p in points["collectives"] if p["kind"] == "all_reduce"]
    assert max(modes.count("in_loop"), modes.count("isolated")) >= 3
    assert sum(p["kind"] == "send_recv" for p in points["collectives"]) >= 2
    # the raw points are kept in the profile with one residual each
    n_fitted = sum(1 for p in points["gemm"] if not p["held_out"])
    assert len(profile.gemm.fits[0].points) == n_fitted == len(profile.gemm.fits[0].residuals)
    assert np.isfinite(profile.gemm.fits[0].residuals).all()


@pytest.mark.parametrize("section, cause", [
    ({"status": "failed", "error": "TimeoutError: gloo collectives still running 36 s after start; ranks killed",
      "skipped": []}, "gloo collectives still running 36 s after start; ranks killed"),
    ({"status": "cut short", "error": "gloo collectives still running 61 s after start (budget 30 s); ranks killed",
      "skipped": []}, "gloo collectives still running 61 s after start (budget 30 s); ranks killed"),
    ({"status": "done", "error": None, "skipped": ["all_reduce in_loop 1024 bytes"] * 12, "budget_s": 29.0},
     "12 points would not have ended within the 29 s it was allowed"),
])
def test_too_few_collective_points_are_refused_with_the_cause_the_measurement_recorded(tmp_path, section, cause):
    """A busy machine's calibration that measured too few collectives says why, as the raw points record it, and
    names a flag calibrate has (not a section it cannot choose)."""
    raw = _cpu_raw()
    raw["collectives"] = [r for r in raw["collectives"] if r["kind"] == "all_reduce" and r["bytes"] == 2**10]
    raw["sections"] = {"collectives": section}
    path, out = tmp_path / "raw.json", tmp_path / "p.json"
    path.write_text(json.dumps(raw))
    res = CliRunner().invoke(cli, ["calibrate", "--raw", str(path), "--out", str(out)])
    assert res.exit_code == 2 and len(res.output.strip().splitlines()) == 1, res.output
    assert "gave 1 all-reduce and 0 send/recv points" in res.output and cause in res.output, res.output
    assert "--budget-s" in res.output and any(p.opts == ["--budget-s"] for p in calibrate_command.params)
    assert "collectives section" in res.output and not out.exists()


def test_plan_takes_a_measured_cpu_profile(tmp_path):
    out = tmp_path / "cpu.json"
    save_profile(fit_profile(_cpu_raw()).profile, out)
    res = CliRunner().invoke(cli, ["plan", "--cluster", "local-cpu", "--model", "gpt3-125m", "--precision", "fp32",
                                   "--dp", "2", "--gbs", "2", "--profile", str(out)])
    assert res.exit_code == 0, res.output
    assert "iteration time" in res.output


# --- a CPU calibration: in-loop collectives, host costs, and the refusal of a profile that misses its points

CPU_LINK = dict(latency_s=4e-4, busbw_gbps=1.5)  # what gloo on loopback gives, roughly


def _cpu_raw() -> dict:
    """Points a 2-rank CPU would give if the model forms held: GEMMs and kernels from the CPU spec, an
    in-loop all-reduce sweep slower than the isolated one (the wait for the other rank's GEMM)."""
    gpu = load_gpu("cpu")
    peak = gpu.peak_tflops.fp32 * 1e12
    truth = GemmParams.model_construct(max_efficiency=0.9, tile_m=64, tile_n=64, k_half=32.0, misaligned_factor=0.9,
                                       alignment_bytes=64, launch_overhead_s=5e-6, ceiling_efficiency=None)
    shapes = unique_gemms(layer_gemms(LayerDims(256, 8, 1024, 256)) + grid_gemms(True, "cpu"))
    gemm = [{"name": g.name, "m": g.m, "n": g.n, "k": g.k, "batch": g.batch, "dtype": "float32",
             "time_s": float(gemm_time_s(truth, peak, 1, g.m, g.n, g.k, g.batch, 4)), "held_out": i % 5 == 2}
            for i, g in enumerate(shapes)]
    ew = ElementwiseParams.model_construct(achieved_fraction=0.5, launch_overhead_s=3e-6)
    elementwise = [{"kernel": k, "bytes_moved": 8 * 2**e, "time_s": float(elementwise_time_s(ew, gpu.hbm_bandwidth_gbps,
                                                                                            8 * 2**e))}
                   for k in ("copy", "layer_norm") for e in (14, 16, 18, 20)]
    att = AttentionParams.model_construct(forward_efficiency=0.3, backward_efficiency=0.2, seq_half=64.0,
                                          launch_overhead_s=1e-5)
    attention = []
    for seq in (64, 128, 256, 512):
        for backward in (False, True):
            flops = attention_forward_flops(8, seq, 32, True) * (2.5 if backward else 1.0)
            attention.append({"impl": "fused", "pass": "backward" if backward else "forward", "batch_heads": 8,
                              "seq": seq, "head_dim": 32, "causal": True, "dtype": "float32",
                              "time_s": float(attention_time_s(att, peak, flops, seq, backward, 32, True))})
    f = 2 * (2 - 1) / 2
    collectives = []
    for mode, extra in (("isolated", 0.0), ("in_loop", 1e-3)):
        for kind, factor in (("all_reduce", f), ("all_gather", f / 2), ("reduce_scatter", f / 2)):
            for e in (10, 14, 18, 21, 24):
                t = extra + CPU_LINK["latency_s"] + factor * 2**e / (CPU_LINK["busbw_gbps"] * 1e9)
                collectives.append({"kind": kind, "mode": mode, "bytes": 2**e, "group_size": 2, "backend": "gloo",
                                    "time_s": t})
    collectives += [{"kind": "send_recv", "mode": "isolated", "bytes": 2**e, "group_size": 2, "backend": "gloo",
                     "time_s": 2e-4 + 2**e / 2e9} for e in (10, 14, 18, 21, 24)]
    host = [{"what": w, "synchronize": False, "time_s": t, "calls": 200} for w, t in (
        ("bare_op", 3e-6), ("forward_op", 4e-6), ("backward_op", 6e-6), ("micro_batch", 8e-6),
        ("optimizer_step_12_tensors", 5e-4))]
    return {"format": RAW_FORMAT, "version": RAW_VERSION,
            "device": {"kind": "cpu", "name": "test CPU", "driver": "n/a", "torch_version": "2.13.0",
                       "date": "2026-12-01T00:00:00+00:00", "host": "cpu-1", "cpu_threads": 1, "cpu_cores": 2,
                       "load_average": [0.1, 0.2, 0.3], "load_average_end": [0.2, 0.2, 0.3]},
            "settings": {"threads": 1}, "gemm": gemm, "attention": attention, "elementwise": elementwise,
            "collectives": collectives, "host": host, "sections": {}}


def test_a_cpu_profile_takes_its_link_from_the_in_loop_collectives_and_records_the_machine():
    result = fit_profile(_cpu_raw())
    p = result.profile
    link = p.collectives.network
    # the in-loop all-reduce of 1 KB took 1.4 ms: the link's latency (two inter-node steps) is that, not the 0.4 ms
    # of the isolated call
    assert 2 * link.latency_s == pytest.approx(1e-3 + CPU_LINK["latency_s"], rel=0.01)
    assert "right after the layer's MLP GEMMs" in link.sources["half_size_bytes"]
    assert any("isolated" in e.block for e in result.fit_errors)  # kept for comparison
    assert p.device.kind == "cpu" and p.device.threads == 1 and p.device.cores == 2
    assert p.device.load_average == (0.1, 0.2, 0.3)
    host = p.host
    assert host is not None and host.collective_s == 0.0  # inside the measured collective on a synchronous device
    assert host.op_s == pytest.approx(1e-6) and host.backward_op_s == pytest.approx(3e-6)
    assert host.iteration_s == pytest.approx(5e-4) and "iteration_s" in host.ranges


def test_a_broken_collective_fit_is_refused():
    """The profile of the issue: 30,609 GB/s, no latency, the half-size at the fit's bound."""
    from simulator.measure.profile_check import check_profile

    raw = _cpu_raw()
    good = fit_profile(raw).profile
    broken_link = good.collectives.network.model_copy(update={
        "latency_s": 0.0, "max_busbw_gbps": 30609.0, "half_size_bytes": 1e12, "ramp_exponent": 1.0,
        "ramp_curve": None})
    broken = good.model_copy(update={"collectives": good.collectives.model_copy(update={"network": broken_link})})
    with pytest.raises(ProfileError, match=r"collectives\.network .*all-reduce .*off through the cost model"):
        check_profile(broken, raw, load_gpu("cpu"))
    assert check_profile(good, raw, load_gpu("cpu")) == []


def test_calibrate_refuses_points_its_model_cannot_give_back(tmp_path):
    raw = _cpu_raw()
    for r in raw["collectives"]:  # one in-loop all-reduce 8x slower than its neighbours: no monotone link fits it
        if r["kind"] == "all_reduce" and r["mode"] == "in_loop" and r["bytes"] == 2**14:
            r["time_s"] *= 8
    path, out = tmp_path / "raw.json", tmp_path / "p.json"
    path.write_text(json.dumps(raw))
    res = CliRunner().invoke(cli, ["calibrate", "--raw", str(path), "--out", str(out)])
    assert res.exit_code == 2, res.output
    assert res.output.startswith("error: profile block collectives.network") and "quiet machine" in res.output
    assert len(res.output.strip().splitlines()) == 1 and not out.exists()


def test_raw_points_without_in_loop_or_host_rows_still_fit():
    """Raw files from before in-loop timing: the isolated sweep is the link, no host block."""
    raw = _cpu_raw()
    raw["collectives"] = [r for r in raw["collectives"] if r["mode"] == "isolated"]
    for r in raw["collectives"]:
        del r["mode"]
    raw["host"] = []
    result = fit_profile(raw)
    assert 2 * result.profile.collectives.network.latency_s == pytest.approx(CPU_LINK["latency_s"], rel=0.01)
    assert result.profile.host is None and any("host costs not measured" in n for n in result.notes)


def test_a_gpu_profile_takes_host_costs_issued_without_a_synchronize():
    """On CUDA the host runs ahead: each host term is the whole time to issue, not what a synchronous
    device adds to the kernel's own time; what one GPU cannot measure comes from the published profile."""
    raw = _synthetic_raw()
    raw["host"] = [{"what": w, "synchronize": sync, "time_s": t, "calls": 200} for w, sync, t in (
        ("bare_op", False, 4e-6), ("forward_op", False, 9e-6), ("forward_op", True, 2.5e-5), ("backward_op", False, 1.2e-5),
        ("micro_batch", False, 3e-5), ("optimizer_step_12_tensors", False, 2e-4))]
    raw["collective_host"] = {"collective_issue_s": 1.5e-5, "collective_synchronized_s": 4e-5, "calls": 200,
                              "group_size": 1}
    host = fit_profile(raw).profile.host
    published = default_profile("H200-SXM-141GB").host
    assert host.op_s == pytest.approx(9e-6) and host.backward_op_s == pytest.approx(1.2e-5)
    assert host.collective_s == pytest.approx(1.5e-5) and "over 1 GPU" in host.sources["collective_s"]
    assert host.pipeline_exchange_s == published.pipeline_exchange_s


def _with_cache_step(raw: dict, kernel: str = "copy", cache_bytes: float = 2**21, speedup: float = 2.7) -> dict:
    """A CPU's streaming kernel: ``speedup`` times faster while its working set fits the core's cache."""
    for r in raw["elementwise"]:
        if r["kernel"] == kernel and r["bytes_moved"] < cache_bytes:
            r["time_s"] /= speedup
    return raw


def test_a_kernel_sweep_across_the_cache_is_kept_as_measured_and_given_back():
    """One bandwidth per class cannot follow a 2.7x step at the cache size; the measured sweep can."""
    raw = _with_cache_step(_cpu_raw())
    result = fit_profile(raw)
    ew, gpu = result.profile.elementwise, load_gpu("cpu")
    assert ew.curve("copy") is not None and "copy" in ew.sources["kernel_curves"]
    for r in (r for r in raw["elementwise"] if r["kernel"] == "copy"):
        assert float(elementwise_time_s(ew, gpu.hbm_bandwidth_gbps, r["bytes_moved"], "copy")) == \
            pytest.approx(r["time_s"], rel=1e-9)
    # between two measured sizes the time lies between theirs; past the sweep the end rate holds
    sizes = sorted(p[0] for p in ew.curve("copy"))
    t = [float(elementwise_time_s(ew, gpu.hbm_bandwidth_gbps, s, "copy")) for s in sizes]
    mid = float(elementwise_time_s(ew, gpu.hbm_bandwidth_gbps, (sizes[0] * sizes[1]) ** 0.5, "copy"))
    assert t[0] < mid < t[1]
    big = float(elementwise_time_s(ew, gpu.hbm_bandwidth_gbps, 4 * sizes[-1], "copy"))
    assert big == pytest.approx(ew.launch_overhead_s + 4 * (t[-1] - ew.launch_overhead_s), rel=1e-9)
    assert any(e.block == "elementwise.copy (measured sweep)" and e.max_abs < 1e-9 for e in result.fit_errors)


def test_a_noisy_kernel_sweep_keeps_the_fitted_fraction():
    raw = _cpu_raw()
    rows = [r for r in raw["elementwise"] if r["kernel"] == "layer_norm"]
    rows[-1]["time_s"] = rows[-2]["time_s"] * 0.5  # a larger size twice as fast: noise, not a cache
    ew = fit_profile(raw, check=False).profile.elementwise
    assert ew.curve("layer_norm") is None and ew.curve("copy") is not None


def test_a_backward_kernel_is_costed_as_timed_or_as_the_class_it_stood_for():
    """A backward op's class is its forward's with _backward: a profile that timed it gives that time back; one
    that did not (a published GPU profile) costs it as before: its forward class, or for a dropout's (which
    only applies the mask) the residual add; the causal mask's fill, as the copy. A dropout of 0 is only the
    add."""
    from simulator.graph.ops import elementwise

    assert elementwise("input_norm.backward", 2048, 4, 1, 4).kernel == "layer_norm_backward"
    assert elementwise("softmax.mask.backward", 2048, 1, 1, 4).kernel == "masked_fill_backward"
    assert elementwise("qkv.split.backward", 2048, 1, 1, 4).kernel == "copy_backward"
    assert elementwise("attention_dropout.backward", 2048, 1, 1, 4, mask=True).kernel == "dropout_backward"
    assert elementwise("mlp_dropout_add", 2048, 2, 1, 4, mask=False).kernel == "bias_add_residual"
    assert elementwise("mlp_dropout_add.backward", 2048, 1, 1, 4, mask=False).kernel == "bias_add_residual_backward"
    raw = _cpu_raw()
    copies = [r for r in raw["elementwise"] if r["kernel"] == "copy"]
    raw["elementwise"] += [{**r, "kernel": "bias_add_residual"} for r in copies]
    timed = [{**r, "kernel": "dropout_backward", "time_s": 4 * r["time_s"]} for r in copies]  # mask convert, 2 muls
    raw["elementwise"] += timed
    gpu = load_gpu("cpu")
    ew = fit_profile(raw, check=False).profile.elementwise
    for r in timed:
        assert float(elementwise_time_s(ew, gpu.hbm_bandwidth_gbps, r["bytes_moved"], "dropout_backward")) == \
            pytest.approx(r["time_s"], rel=1e-9)
    untimed = fit_profile({**raw, "elementwise": [r for r in raw["elementwise"] if r["kernel"] != "dropout_backward"]},
                          check=False).profile.elementwise
    for n in (1e5, 1e7):
        assert float(elementwise_time_s(untimed, gpu.hbm_bandwidth_gbps, n, "dropout_backward")) == \
            float(elementwise_time_s(untimed, gpu.hbm_bandwidth_gbps, n, "bias_add_residual"))
        for kernel in ("layer_norm", "copy"):
            assert float(elementwise_time_s(untimed, gpu.hbm_bandwidth_gbps, n, f"{kernel}_backward")) == \
                float(elementwise_time_s(untimed, gpu.hbm_bandwidth_gbps, n, kernel))
        # an untimed masked fill, forward or backward, is the copy it was costed as
        for kernel in ("masked_fill", "masked_fill_backward"):
            assert float(elementwise_time_s(untimed, gpu.hbm_bandwidth_gbps, n, kernel)) == \
                float(elementwise_time_s(untimed, gpu.hbm_bandwidth_gbps, n, "copy"))


@pytest.mark.parametrize("curve, match", [
    (((1024.0, 0.5),), "at least 2 points"),
    (((1024.0, 0.5), (512.0, 0.4)), "increase strictly"),
    (((1024.0, 0.5), (2048.0, 150.0)), "fractions from 1e-06 to 100"),
])
def test_broken_kernel_curves_are_refused(curve, match):
    base = default_profile("A100-SXM4-80GB").elementwise.model_dump()
    with pytest.raises(ValueError, match=match):
        ElementwiseParams(**{**base, "kernel_curves": {"copy": curve}, "sources": {**base["sources"], "kernel_curves": "test"}})


def test_a_collective_kind_slower_than_its_link_is_measured_as_a_factor():
    """gloo's reduce-scatter ran 2.5x what the all-reduce-derived link gives it: the profile keeps that
    factor per size, so the cost model gives the measured reduce-scatter back."""
    from simulator.cost import CostModel, Group
    from simulator.graph.layers import CollectiveKind
    from simulator.spec.hardware import load_cluster
    from simulator.spec.plan import Precision

    raw = _cpu_raw()
    for r in raw["collectives"]:
        if r["kind"] == "reduce_scatter" and r["mode"] == "in_loop":
            r["time_s"] *= 2.5
    result, plain = fit_profile(raw), fit_profile(_cpu_raw()).profile.collectives.network
    link = result.profile.collectives.network
    assert set(link.kind_factors) == {"all_gather", "reduce_scatter"} and "kind_factors" in link.sources
    for (size, f), (plain_size, plain_f) in zip(link.kind_factors["reduce_scatter"], plain.kind_factors["reduce_scatter"]):
        assert size == plain_size and f == pytest.approx(2.5 * plain_f, rel=1e-9)
    gathered = [f for _, f in link.kind_factors["all_gather"]]
    assert gathered == pytest.approx([f for _, f in plain.kind_factors["all_gather"]], rel=1e-9)
    cost = CostModel(load_cluster("local-cpu"), result.profile, Precision.fp32)
    for r in (r for r in raw["collectives"] if r["kind"] == "reduce_scatter" and r["mode"] == "in_loop"):
        t = cost.collective_time_s(CollectiveKind.reduce_scatter, r["bytes"], Group(2, 1))
        assert t == pytest.approx(r["time_s"], rel=1e-6)
    assert any(e.block == "collectives.reduce_scatter (measured factor)" and e.max_abs < 1e-6
               for e in result.fit_errors)
    # the all-reduce is what the link was fitted to: slowing another kind leaves it as it was
    plain_cost = CostModel(load_cluster("local-cpu"), fit_profile(_cpu_raw()).profile, Precision.fp32)
    assert cost.collective_time_s(CollectiveKind.all_reduce, 2**18, Group(2, 1)) == pytest.approx(
        plain_cost.collective_time_s(CollectiveKind.all_reduce, 2**18, Group(2, 1)), rel=1e-9)


def test_kind_factors_of_the_all_reduce_itself_are_refused():
    base = default_profile("A100-SXM4-80GB").collectives.nvlink.model_dump()
    with pytest.raises(ValueError, match="use all_gather, reduce_scatter or all_to_all"):
        type(default_profile("A100-SXM4-80GB").collectives.nvlink)(
            **{**base, "kind_factors": {"all_reduce": ((1.0, 1.0), (2.0, 1.0))},
               "sources": {**base["sources"], "kind_factors": "test"}})


def test_one_noisy_size_does_not_make_a_kind_factor_but_a_trend_does():
    """A single in-loop point at twice its neighbours is the tail of a mean, not the backend: the factor there is
    its neighbours'; a factor that rises with size, or a level, passes through as measured."""
    from simulator.measure.calibrate_blocks import _kind_factors

    def rows(factors):
        return [{"bytes": 1024 * 4**i, "time_s": f} for i, f in enumerate(factors)]

    one = lambda kind, size: 1.0  # noqa: E731 - the link's time: factors are the times themselves
    spiked = _kind_factors({"all_gather": rows([2.0, 2.2, 4.5, 2.1, 2.3])}, one)["all_gather"]
    assert [f for _, f in spiked] == pytest.approx([2.0, 2.2, 2.2, 2.3, 2.3])
    rising = [1.5, 1.8, 2.2, 2.7, 3.2]
    assert [f for _, f in _kind_factors({"reduce_scatter": rows(rising)}, one)["reduce_scatter"]] == pytest.approx(rising)
    assert [s for s, _ in spiked] == [1024 * 4**i for i in range(5)]


def test_each_kind_keeps_its_share_alone_of_its_in_loop_time():
    """The committed CPU measurement timed every kind both alone (ranks entering together) and in the loop (right
    after the layer's compute): the profile keeps alone / in-loop per size, never above 1, where both were timed."""
    from pathlib import Path

    raw = read_raw(Path(__file__).resolve().parents[2] / "reports" / "cpu-validation" / "cpu-profile-raw.json")
    link = fit_profile(raw).profile.collectives.network
    assert set(link.isolated_factors) == {"all_reduce", "all_gather", "reduce_scatter"}
    assert "isolated_factors" in link.sources
    for kind, curve in link.isolated_factors.items():
        alone = {r["bytes"] for r in raw["collectives"] if r["kind"] == kind and r["mode"] == "isolated"}
        looped = {r["bytes"] for r in raw["collectives"] if r["kind"] == kind and r["mode"] == "in_loop"}
        assert [size for size, _ in curve] == sorted(alone & looped)
        assert all(0 < f <= 1 for _, f in curve)
        # small calls are mostly the wait for the other rank: alone they take well under their in-loop time
        assert curve[0][1] < 0.8


def test_isolated_factors_above_one_are_refused():
    base = default_profile("A100-SXM4-80GB").collectives.nvlink.model_dump()
    with pytest.raises(ValueError, match="factors from 0.01 to 1"):
        type(default_profile("A100-SXM4-80GB").collectives.nvlink)(
            **{**base, "isolated_factors": {"all_gather": ((1.0, 0.5), (2.0, 1.5))},
               "sources": {**base["sources"], "isolated_factors": "test"}})
