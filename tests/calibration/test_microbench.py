"""The measuring side: shapes agree with the layer graph, timing returns medians, benchmarks measure
what they say, gloo collectives run on two processes, and the session script works on the CPU path."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch

from calibration.microbench import RAW_FORMAT
from calibration.microbench.attention import (
    fused_attention,
    time_attention,
    unfused_attention,
)
from calibration.microbench.collectives import bus_factor, run_collectives
from calibration.microbench.elementwise import KERNELS, time_elementwise
from calibration.microbench.gemm import held_out_keys, run_gemms, time_gemm, time_sustained_gemm
from calibration.microbench.shapes import (
    Gemm,
    LayerDims,
    grid_gemms,
    layer_gemms,
    output_gemms,
    unique_gemms,
)
from calibration.microbench.timing import Budget, Timing, rotation_count, time_fn
from simulator.graph.layers import ordered_ops, transformer_layer
from simulator.spec.catalog import PRESETS
from simulator.spec.model import ModelSpec
from simulator.spec.plan import ParallelPlan

REPO = Path(__file__).resolve().parents[2]
CPU = torch.device("cpu")


def _dims(model: ModelSpec, plan: ParallelPlan) -> LayerDims:
    return LayerDims(hidden_size=model.hidden_size, num_attention_heads=model.num_attention_heads,
                     ffn_hidden_size=model.ffn_size, seq_length=model.seq_length,
                     micro_batch_size=plan.micro_batch_size, tensor_parallel_size=plan.tensor_parallel_size,
                     num_query_groups=model.num_query_groups, swiglu=model.swiglu)


LLAMA_LIKE = ModelSpec(name="gqa", num_layers=2, hidden_size=4096, num_attention_heads=32, num_query_groups=8,
                       ffn_hidden_size=11008, swiglu=True, seq_length=4096)


@pytest.mark.parametrize("model,tp,mbs", [
    (PRESETS["gpt3-175b"], 8, 1), (PRESETS["gpt3-125m"], 1, 4), (PRESETS["megatron-22b"], 8, 2), (LLAMA_LIKE, 2, 1),
])
@pytest.mark.parametrize("flash", [False, True])
def test_layer_shapes_match_the_layer_graph(model, tp, mbs, flash):
    plan = ParallelPlan(tensor_parallel_size=tp, micro_batch_size=mbs, global_batch_size=mbs, use_flash_attention=flash)
    g = transformer_layer(model, plan)
    graph = {op.name: (op.gemm.m, op.gemm.n, op.gemm.k, op.gemm.batch)
             for op in ordered_ops(g.forward) + ordered_ops(g.backward) if op.gemm is not None}
    ours = {x.name: x.key for x in layer_gemms(_dims(model, plan), flash_attention=flash)}
    assert ours == graph


@pytest.mark.parametrize("model,tp,mbs", [(PRESETS["gpt3-175b"], 8, 1), (PRESETS["gpt3-125m"], 1, 4)])
def test_output_layer_shapes_match_the_output_extras(model, tp, mbs):
    from simulator.graph.layers import output_extras

    plan = ParallelPlan(tensor_parallel_size=tp, micro_batch_size=mbs, global_batch_size=mbs)
    g = output_extras(model, plan)
    graph = {op.name: (op.gemm.m, op.gemm.n, op.gemm.k, op.gemm.batch)
             for op in ordered_ops(g.forward) + ordered_ops(g.backward) if op.gemm is not None}
    dims = dataclasses.replace(_dims(model, plan), vocab_size=model.vocab_size)
    assert {x.name: x.key for x in output_gemms(dims)} == graph
    assert output_gemms(_dims(model, plan)) == []  # no vocabulary given: no output layer


def test_unique_gemms_drop_repeats_and_keep_first_names():
    gs = [Gemm("a", 1, 2, 3), Gemm("b", 1, 2, 3), Gemm("c", 3, 2, 1)]
    assert [g.name for g in unique_gemms(gs)] == ["a", "c"]
    assert Counter(g.key for g in grid_gemms(True, "cpu")).most_common(1)[0][1] == 1


def test_layer_dims_reject_tp_that_does_not_divide_heads():
    with pytest.raises(ValueError, match="tensor_parallel_size=5"):
        LayerDims(hidden_size=768, num_attention_heads=12, ffn_hidden_size=3072, seq_length=128, tensor_parallel_size=5)


def test_timing_is_the_median_not_the_mean(monkeypatch):
    """On a clock of our own (a sleep on a busy machine oversleeps by any amount): five timed calls after two
    untimed ones, and the median of them, not the mean the slow one would drag up."""
    import calibration.microbench.timing as timing

    assert Timing((1.0, 9.0, 2.0)).median_s == 2.0
    clock = type("Clock", (), {"now": 0.0, "perf_counter": lambda self: self.now})()
    monkeypatch.setattr(timing, "time", clock)
    durations = [0.030, 0.001, 0.002, 0.003, 0.004]  # one slow outlier
    calls = []

    def fn(i):
        calls.append(i)
        clock.now += 100.0 if i < 2 else durations[i - 2]  # the two warm-up calls are not timed

    t = time_fn(fn, CPU, warmup=2, repeats=5)
    assert calls == list(range(7)) and t.samples_s == pytest.approx(tuple(durations))
    assert t.median_s == pytest.approx(0.003)  # the mean would be 0.008


def test_rotation_outgrows_the_cache():
    n = rotation_count(1024 * 1024, CPU, max_sets=10**6, max_bytes=2**40)
    from calibration.microbench.timing import cache_bytes
    assert n * 2**20 >= 2 * cache_bytes(CPU) > (n - 1) * 2**20
    assert rotation_count(2**40, CPU) == 1


@pytest.mark.measures
def test_gemm_point_counts_flops_and_rotation_uses_random_data():
    p = time_gemm(Gemm("x", 64, 96, 32), torch.float32, CPU, warmup=1, repeats=3)
    assert p["flops"] == 2 * 64 * 96 * 32 and p["time_s"] > 0
    assert math.isclose(p["tflops"], p["flops"] / p["time_s"] / 1e12)


@pytest.mark.measures
def test_a_sustained_gemm_gives_its_burst_and_a_time_per_product_in_every_window():
    """The contract of the measurement, not its values: a burst, then as many windows as asked, each a
    positive time per product, the whole run about as long as asked (at least one product per window)."""
    p = time_sustained_gemm(64, torch.float32, CPU, seconds=0.2, windows=4, warmup=1, repeats=3)
    assert (p["m"], p["n"], p["k"], p["flops"]) == (64, 64, 64, 2 * 64**3)
    assert p["burst_s"] > 0 and len(p["window_s"]) == 4 and all(t > 0 for t in p["window_s"])
    assert p["seconds"] == 0.2 and p["dtype"] == "float32"
    # one device: its own times are the per-device ones
    assert p["device_burst_s"] == [p["burst_s"]] and p["device_window_s"] == [p["window_s"]]


def test_budget_skips_and_says_so():
    gs = [Gemm("a", 32, 32, 32), Gemm("b", 64, 64, 64)]
    budget = Budget(0.0)
    assert run_gemms(gs, torch.float32, CPU, budget, warmup=1, repeats=1) == []
    assert len(budget.skipped) == 2 and "32x32x32" in budget.skipped[0]


def test_held_out_is_a_deterministic_few():
    gs = grid_gemms(False, "cuda")
    assert held_out_keys(gs) == held_out_keys(gs)
    assert 0 < len(held_out_keys(gs)) <= len(gs) // 4


def test_unfused_attention_computes_what_the_fused_kernel_does():
    q, k, v = (torch.randn(2, 3, 16, 8) for _ in range(3))
    for causal in (False, True):
        torch.testing.assert_close(unfused_attention(q, k, v, causal, 0.0), fused_attention(q, k, v, causal, 0.0))


def test_attention_points_report_forward_and_backward_flops():
    fwd, bwd = time_attention("fused", 1, 2, 32, 16, torch.float32, CPU, warmup=1, repeats=2)
    assert (fwd["pass"], bwd["pass"]) == ("forward", "backward")
    assert fwd["flops"] == 4 * 2 * 32 * 32 * 16 / 2  # causal halves it (FlashAttention-2's count)
    assert bwd["flops"] == 2.5 * fwd["flops"]


@pytest.mark.parametrize("kernel", KERNELS)
def test_elementwise_bytes_follow_the_layer_graph_accounting(kernel):
    p = time_elementwise(kernel, 4096, 256, torch.float32, CPU, warmup=1, repeats=2)
    per_element = {"bias_add_residual": 3 * 4, "dropout": 2 * 4 + 1, "dropout_backward": 2 * 4 + 1,
                   "layer_norm_backward": 5 * 4, "gelu_backward": 3 * 4, "softmax_backward": 3 * 4}.get(kernel, 2 * 4)
    assert p["numel"] == 4096 and p["bytes_moved"] == 4096 * per_element and p["time_s"] > 0


def test_bus_factors_are_nccl_tests_conventions():
    assert bus_factor("all_reduce", 8) == 2 * 7 / 8
    assert bus_factor("all_gather", 4) == bus_factor("reduce_scatter", 4) == 3 / 4
    assert bus_factor("send_recv", 2) == 1.0


def test_the_points_a_link_needs_are_measured_first():
    """The smallest, middle and largest size in every mode before any other size, the kinds by turns at each: a
    budget cut short by a busy machine skips sizes between measured ones, never the whole in-loop sweep."""
    from calibration.microbench.collectives import KINDS, point_order

    sizes = [2**e for e in (10, 14, 18, 21, 24)]
    order = point_order(("isolated", "in_loop"), sizes, KINDS)
    assert len(order) == 5 * 4 + 5 * 3 and len(set(order)) == len(order)  # no send/recv in the loop
    core = {2**10, 2**18, 2**24}
    first = order[:3 * 4 + 3 * 3]
    assert {s for _, s, _ in first} == core and {s for _, s, _ in order[len(first):]} == {2**14, 2**21}
    assert [k for m, s, k in first if (m, s) == ("in_loop", 2**18)] == ["all_reduce", "all_gather", "reduce_scatter"]


@pytest.mark.measures
def test_gloo_collectives_on_two_processes():
    res = run_collectives(backend="gloo", world_size=2, sizes=[4096, 1 << 20], dtype=torch.float32,
                          warmup=1, repeats=3, budget_s=60)
    kinds = Counter(p["kind"] for p in res["points"])
    assert kinds == {"all_reduce": 2, "all_gather": 2, "reduce_scatter": 2, "send_recv": 2}
    for p in res["points"]:
        assert p["group_size"] == 2 and p["time_s"] > 0
        assert math.isclose(p["busbw_gbps"], p["bytes"] / p["time_s"] / 1e9 * bus_factor(p["kind"], 2))


@pytest.mark.measures
def test_in_loop_collectives_follow_a_tp_ranks_layer_blocks():
    """In the loop a collective follows the layer's own compute, the attention and the MLP block by turns (the
    kernels whose jitter from rank to rank makes the earlier rank wait), and the MLP's first GEMM is timed
    beside the other rank's."""
    from calibration.measure import _group_layer
    from calibration.microbench.shapes import LayerDims, forward_gemms

    layer = _group_layer(LayerDims(hidden_size=64, num_attention_heads=4, ffn_hidden_size=256, seq_length=32), 2)
    assert (layer.tensor_parallel_size, layer.local_heads) == (2, 2)
    assert _group_layer(layer, 3) == layer  # 3 ranks split neither the heads nor the FFN: left as it is
    fc1, fc2 = [(g.m, g.n, g.k) for g in forward_gemms(layer) if g.name in ("fc1", "fc2")]
    assert fc1 == (32, 128, 64)
    res = run_collectives(backend="gloo", world_size=2, sizes=[4096], dtype=torch.float32, warmup=1, repeats=2,
                          budget_s=60, kinds=("all_reduce",), modes=("in_loop",), compute_shapes=(fc1, fc2),
                          block=layer)
    (point,) = res["points"]
    assert point["mode"] == "in_loop" and point["time_s"] > 0 and point["compute_shape"] == list(fc1)
    assert point["compute_s"] > 0
    # the same blocks on one rank alone and on both at once, round by round
    shared = res["shared_compute"]
    assert shared["ranks"] == 2 and len(shared["alone_s"]) == len(shared["together_s"]) > 1
    assert all(t > 0 for t in shared["alone_s"] + shared["together_s"])


@pytest.mark.measures
def test_the_sequence_benchmark_times_the_loops_layers_and_replays_the_same_ops_alone():
    """One round is the reference layers' forward and backward as a step runs them, and every aten op they ran
    (the backward's apart) repeated alone: both positive, the op counts those of the recorded pass."""
    from calibration.microbench.sequence import SEQUENCE_LAYERS, run_sequence
    from calibration.microbench.shapes import LayerDims

    layer = LayerDims(64, 4, 256, 32, 2, 2)
    out = run_sequence(layer, torch.float32, torch.device("cpu"), Budget(30.0), rounds=2)
    assert out["layers"] == SEQUENCE_LAYERS and out["layer"]["tensor_parallel_size"] == 2
    # every layer's forward has its GEMMs, dropouts and norms; the backward replays more ops than that
    assert 10 * SEQUENCE_LAYERS < out["ops_forward"] < out["ops_backward"]
    assert len(out["rounds"]) == 2
    for r in out["rounds"]:
        assert all(r[k] > 0 for k in ("loop_forward_s", "loop_backward_s", "alone_forward_s", "alone_backward_s"))
    none = run_sequence(layer, torch.float32, torch.device("cpu"), Budget(0.0), rounds=3)
    assert len(none["rounds"]) == 1  # the first round always, then only what fits


@pytest.mark.measures
def test_measure_entry_point_on_cpu(tmp_path):
    out = tmp_path / "raw.json"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", "calibration.measure", "--device", "cpu", "--quick", "--budget-s",
                           "40", "--sections", "gemm,attention", "--out", str(out)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    raw = json.loads(out.read_text())
    assert raw["format"] == RAW_FORMAT and raw["device"]["kind"] == "cpu"
    assert {"name", "driver", "torch_version", "date", "host"} <= raw["device"].keys()
    assert all(raw["sections"][s]["status"] == "done" for s in ("gemm", "attention"))
    assert "elementwise" not in raw["sections"] and raw["elementwise"] == []
    assert any(p["held_out"] for p in raw["gemm"]) and not all(p["held_out"] for p in raw["gemm"])
    assert {p["impl"] for p in raw["attention"]} == {"fused", "unfused"}


@pytest.mark.slow  # the whole GPU session script, dry, on this CPU (about a minute)
@pytest.mark.measures
@pytest.mark.skipif(not Path("/bin/bash").exists(), reason="needs bash")
def test_gpu_session_script_dry_run_on_the_cpu(tmp_path):
    """The GPU session's steps on the CPU with a tiny model: measure for the model's shapes, the three
    reference runs, every record under the output folder, inside the script's own time limit. On a busy machine
    a step may find too little of that limit left: then the log says it was skipped for time and the exit code
    is 1, and every step that ran still did its work."""
    env = {**os.environ, "PYTHON": sys.executable, "PYTHONPATH": str(REPO), "SESSION_TOTAL_S": "120",
           "REFERENCE_S": "60"}
    proc = subprocess.run(["bash", str(REPO / "calibration" / "gpu_session.sh"), str(tmp_path / "out"), "--dry-run",
                           "--quick"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    out = tmp_path / "out"
    log = (out / "session.log").read_text()
    assert "== environment" in log and "== reference runs" in log and "== fit" in log
    # every step took its share of what was left: the script ends inside its own limit (120 s here)
    assert int(re.search(r"== done \(t=\d+ s, (-?\d+) s left\)", log).group(1)) >= 0
    assert "numpy" not in proc.stderr  # nothing asked for numpy
    skipped_for_time = "skipping measurement: only" in log or re.search(r"skipped: only -?\d+ s left", log)
    assert proc.returncode == 0 or (proc.returncode == 1 and skipped_for_time), proc.stdout[-3000:] + proc.stderr[-3000:]
    if (out / "raw.json").is_file():
        raw = json.loads((out / "raw.json").read_text())
        assert set(raw["sections"]) == {"sequence", "gemm", "attention", "elementwise", "collectives", "host",
                                       "sustained"}
        # every section ran; the collectives' ranks cut short by a busy machine say so and keep what they measured
        # every section ran; the collectives' ranks cut short by a busy machine say so and keep what they measured,
        # and the sustained run, last, may find no time left and say that
        assert all(info["status"] == "done" or (s == "collectives" and info["status"] == "cut short" and info["error"])
                   or (s == "sustained" and info["status"] == "skipped" and "no time left" in info["error"])
                   for s, info in raw["sections"].items()), raw["sections"]
        assert (raw["sections"]["sustained"]["status"] == "done") == bool(raw["sustained"])
        assert raw["settings"]["layer"]["hidden_size"] == 64  # the tiny model's shapes, not GPT-3's
        # every kind in both modes, but for a point the section lists as skipped to stay within its time
        measured = {(p["kind"], p["mode"]) for p in raw["collectives"]}
        skipped = raw["sections"]["collectives"]["skipped"]
        for kind, mode in [(k, m) for k in ("all_reduce", "all_gather", "reduce_scatter")
                           for m in ("isolated", "in_loop")] + [("send_recv", "isolated")]:
            assert (kind, mode) in measured or any(s.startswith(f"{kind} {mode} ") for s in skipped), (kind, mode)
        # the fit runs here (numpy and scipy are installed): a profile, or the one sentence of a refusal
        assert (out / "profile.json").is_file() or "so the profile was not written" in log or "skipping the fit" in log
    else:
        assert "skipping measurement: only" in log, log
    if not re.search(r"skipped: only -?\d+ s left", log):
        for granularity in ("none", "selective", "full"):
            record = json.loads((out / f"run-{granularity}.json").read_text())
            assert record["plan"]["recompute"]["granularity"] == granularity and record["threads_per_rank"] == 1


def test_gpu_session_script_rejects_bad_arguments(tmp_path):
    proc = subprocess.run(["bash", str(REPO / "calibration" / "gpu_session.sh"), str(tmp_path), "--modle", "x"],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2 and "usage" in proc.stderr
