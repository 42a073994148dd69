"""GEMM, memory-bound and attention cost models: physical invariants and published anchors."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.cost import build_cost_model
from simulator.cost.attention import attention_forward_flops
from simulator.cost.gemm import gemm_efficiency
from simulator.cost.profile import default_profile, load_profile
from simulator.graph.layers import GemmShape, Op, OpKind, transformer_layer
from simulator.spec.catalog import load_model
from simulator.spec.errors import ProfileError
from simulator.spec.hardware import load_cluster
from simulator.spec.plan import ParallelPlan, Precision

A100 = load_profile("a100-sxm4-80gb-published")
CLUSTER = load_cluster("dgx-a100-80gb")
COST = build_cost_model(CLUSTER, A100, Precision.bf16)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 20000), st.integers(1, 60000), st.integers(1, 20000), st.integers(1, 64))
def test_gemm_efficiency_never_exceeds_max(m, n, k, batch):
    eff = float(gemm_efficiency(A100.gemm, 108, m, n, k, batch, 2))
    assert 0 < eff <= A100.gemm.max_efficiency


@pytest.mark.parametrize("m,n,k", [(4096, 10922, 4096), (2048, 4096, 12287), (2049, 12288, 4096)])
def test_misaligned_shapes_are_slower_than_aligned_neighbours(m, n, k):
    aligned = [(-(-x // 64)) * 64 for x in (m, n, k)]  # round up to 64 elements = 128 bytes
    t_mis = COST.op_time_s(Op("g", OpKind.gemm, gemm=GemmShape(m, n, k)))
    t_al = COST.op_time_s(Op("g", OpKind.gemm, gemm=GemmShape(*aligned)))
    assert t_mis > t_al  # although the aligned GEMM does more FLOPs


def test_4096_cubed_bf16_lands_near_published_a100_efficiency():
    # The GEMM block holds the benchmarks' bursts. FA2: optimized GEMMs reach 80-90% of peak; MAMF's
    # fastest iteration at the best A100 shape 86.9%.
    assert 0.80 <= float(gemm_efficiency(A100.gemm, 108, 4096, 4096, 4096)) <= 0.87
    assert float(gemm_efficiency(A100.gemm, 108, 1024, 10240, 5120)) == pytest.approx(0.869, rel=0.01)


def test_a_device_held_at_its_power_limit_runs_its_gemms_at_the_measured_sustained_throughput():
    # He 2024: cuBLAS 8192^3 with normally distributed inputs, 257-258 of 312 TFLOPS held at 400 W. The
    # A100 profile takes that measurement as its value and the benchmarks' bursts as the range's fast end;
    # the clock slows tensor-core kernels only, not memory-bound ones.
    low, high = A100.ranges["sustained_clock_fraction"]
    assert (A100.sustained_clock_fraction, high) == (low, 1.0)
    assert 257 / 312 <= COST.gemm_efficiency(8192, 8192, 8192) <= 258 / 312
    burst = build_cost_model(CLUSTER, A100.with_value("sustained_clock_fraction", high), Precision.bf16)
    gemm = Op("g", OpKind.gemm, gemm=GemmShape(8192, 8192, 8192))
    copy = Op("e", OpKind.elementwise, bytes_moved=1e9)
    assert COST.op_time_s(gemm) == pytest.approx(burst.op_time_s(gemm) / low, rel=1e-12)
    assert COST.op_time_s(copy) == burst.op_time_s(copy)


def test_a_gpu_without_a_sustained_measurement_keeps_its_bursts_and_the_a100_ratio_as_its_slow_end():
    # the ratio, not the A100's TFLOPS: an H100's block bursts three times higher
    for gpu in ("H100-SXM5-80GB", "H200-SXM-141GB"):
        profile = default_profile(gpu)
        assert profile.sustained_clock_fraction == 1.0
        assert profile.ranges["sustained_clock_fraction"] == pytest.approx((A100.sustained_clock_fraction, 1.0),
                                                                          rel=1e-12)


def _xla_h100_table():
    """XLA's measured H100 bf16 matmul table: (batch, m, n, k, time_s) of its 375 shapes."""
    from calibration.build_published_profiles import xla_matmul_rows

    return [(b, m, n, k, 2 * b * m * n * k / flops_per_s) for m, n, k, b, flops_per_s in xla_matmul_rows()]


H100 = build_cost_model(load_cluster("dgx-h100"), default_profile("H100-SXM5-80GB"), Precision.bf16)


def _h100_time_s(b, m, n, k):
    return H100.op_time_s(Op("g", OpKind.batched_gemm if b > 1 else OpKind.gemm, gemm=GemmShape(m, n, k, b)))


def test_h100_gemms_that_fill_the_machine_run_at_the_throughput_xla_measured():
    """Where the output fills the SMs many times over (batch x m x n >= 8M) and the reduction is long
    (k >= 2048), the H100 block gives XLA's measured time within 5%."""
    filled = [row for row in _xla_h100_table() if row[0] * row[1] * row[2] >= 8 * 2**20 and row[3] >= 2048]
    assert len(filled) >= 30
    for b, m, n, k, time_s in filled:
        assert _h100_time_s(b, m, n, k) == pytest.approx(time_s, rel=0.05), (b, m, n, k)


def test_h100_gemms_of_every_shape_the_table_times_well_above_its_floor_run_at_the_measured_speed():
    """Shapes XLA timed at 50 us or more (its harness takes 5-6 us for the smallest, a floor the block
    leaves out) include outputs of fewer large tiles than SMs and reductions of 256: cuBLAS picks a
    smaller tile for those, and so does the block. Together they are given within 4% on average."""
    slow = [row for row in _xla_h100_table() if row[4] >= 50e-6]
    assert len(slow) >= 40
    errors = [abs(_h100_time_s(b, m, n, k) / time_s - 1) for b, m, n, k, time_s in slow]
    assert sum(errors) / len(errors) <= 0.04
    assert max(errors) <= 0.20


def test_an_output_of_fewer_large_tiles_than_sms_runs_smaller_tiles():
    # 2048 x 512 x 2048 on H100 makes 32 tiles of 128 x 256 for 132 SMs: one tile shape in strict waves
    # leaves three quarters of the machine idle. XLA timed it at 12.3 us (347.7 TFLOPS), 5-6 us of which
    # is its harness's floor: more than the block's time on its chosen tile, well under one tile's.
    measured_s = next(t for b, m, n, k, t in _xla_h100_table() if (b, m, n, k) == (1, 2048, 512, 2048))
    one_tile = H100.profile.gemm.model_copy(update={"tile_choices": None})
    flops = 2 * 2048 * 512 * 2048
    single_s = flops / (float(gemm_efficiency(one_tile, H100.cluster.gpu.sm_count, 2048, 512, 2048)) * H100.peak_flops)
    chosen_s = _h100_time_s(1, 2048, 512, 2048)
    assert chosen_s < 0.6 * single_s
    assert chosen_s < measured_s < single_s


_DIM = st.integers(1, 96).map(lambda x: 64 * x)


@settings(max_examples=200, deadline=None)
@given(_DIM, _DIM, _DIM, st.integers(1, 8), st.sampled_from(["m", "n", "k", "batch"]), st.integers(1, 40))
def test_a_gemm_never_takes_less_time_when_any_dimension_grows(m, n, k, batch, grown, by):
    # with the tile chosen per shape: every tile's padded waves only grow with the output, and its time
    # per tile with k, so the fastest of them does too
    shape = {"m": m, "n": n, "k": k, "batch": batch}
    bigger = {**shape, grown: shape[grown] + (by if grown == "batch" else 64 * by)}
    t = H100.op_time_s(Op("g", OpKind.batched_gemm, gemm=GemmShape(**shape)))
    assert H100.op_time_s(Op("g", OpKind.batched_gemm, gemm=GemmShape(**bigger))) >= t * (1 - 1e-12)


@pytest.mark.xfail(strict=True, reason="one tile in strict waves (the A100 block) counts a partial tile as whole work "
                                       "done; padding it without a choice of tile would make n < 128 GEMMs (the "
                                       "attention of 64-wide heads) pay for a tile cuBLAS does not run")
def test_with_one_tile_a_bigger_gemm_never_takes_less_time():
    small = COST.op_time_s(Op("g", OpKind.gemm, gemm=GemmShape(256, 64, 64)))
    assert COST.op_time_s(Op("g", OpKind.gemm, gemm=GemmShape(320, 64, 64))) >= small


def test_wave_quantisation_penalises_one_tile_too_many():
    # 108 tiles of 256x128 fill one wave on 108 SMs; 109 tiles need a second, nearly empty wave.
    full = COST.gemm_efficiency(256 * 9, 128 * 12, 4096)
    over = COST.gemm_efficiency(256 * 9 + 1, 128 * 12, 4096)
    assert over < 0.6 * full


def test_elementwise_time_grows_linearly_in_bytes():
    t = [COST.op_time_s(Op("e", OpKind.elementwise, bytes_moved=b)) for b in (1e8, 2e8, 4e8)]
    assert t[2] - t[1] == pytest.approx(2 * (t[1] - t[0]), rel=1e-9)
    slope = (t[1] - t[0]) / 1e8
    assert 1 / slope == pytest.approx(2039e9 * A100.elementwise.achieved_fraction, rel=1e-9)


def test_flash_attention_backward_is_slower_per_flop_than_forward():
    bh, s, d = 32, 2048, 128
    fwd = attention_forward_flops(bh, s, d, True)
    t_f = COST.op_time_s(Op("a", OpKind.flash_attention, flops=fwd, attention=(bh, s, d, True, False)))
    t_b = COST.op_time_s(Op("a.backward", OpKind.flash_attention, flops=2.5 * fwd,
                             attention=(bh, s, d, True, True)))
    assert t_b / t_f == pytest.approx(2.5 * A100.attention.forward_efficiency / A100.attention.backward_efficiency,
                                      rel=0.02)
    assert fwd / t_f / 312e12 <= 0.73  # never above FA2's published forward maximum


def _attention_s(cost, backend: str, seq: int, backward: bool) -> float:
    bh, d = (16384 // seq) * 16, 128  # the FA papers' benchmark: 16k tokens a batch, 16 heads of 128
    fwd = attention_forward_flops(bh, seq, d, True)
    return cost.op_time_s(Op("a", OpKind.flash_attention, flops=2.5 * fwd if backward else fwd,
                             attention=(bh, seq, d, True, backward), kernel=backend))


@pytest.mark.parametrize("cluster", ["dgx-h100", "dgx-h200"])
@given(seq=st.sampled_from([512, 1024, 2048, 4096, 8192, 16384]), backward=st.booleans())
@settings(max_examples=30, deadline=None)
def test_on_hopper_flash_runs_flashattention2_and_auto_runs_cudnn(cluster, seq, backward):
    """Transformer Engine prefers cuDNN's fused attention on sm90 (auto and fused run it) and --attention-backend
    flash runs the flash-attn package's FA2, which the FA3 paper times 1.4-1.8x slower on H100."""
    c = load_cluster(cluster)
    cost = build_cost_model(c, default_profile(c.gpu.name), Precision.bf16)
    auto, fused, flash = (_attention_s(cost, b, seq, backward) for b in ("auto", "fused", "flash"))
    assert auto == fused
    assert 1.3 < flash / auto < 2.0


@given(seq=st.sampled_from([512, 2048, 16384]), backward=st.booleans())
@settings(max_examples=12, deadline=None)
def test_on_ampere_every_fused_backend_runs_flashattention2(seq, backward):
    assert len({_attention_s(COST, b, seq, backward) for b in ("auto", "flash", "fused")}) == 1


@pytest.mark.parametrize("kernel,backend", [("cudnn", "auto"), ("fa2", "flash")])
def test_hopper_kernels_run_at_the_fa3_papers_measured_rates(kernel, backend):
    """Each H100 kernel lands within 10% of the rate the FA3 paper printed for it, at every sequence length and
    both head sizes (the forward with and without the causal mask; the backward as timed, without it)."""
    import json
    from pathlib import Path

    rows = {r["id"]: r for r in json.loads((Path(__file__).resolve().parents[2] / "calibration" / "published"
                                             / "hardware.json").read_text())["measured"]}
    values = rows["fa3_paper_h100_curves"]["values"]
    cost = build_cost_model(load_cluster("dgx-h100"), default_profile("H100-SXM5-80GB"), Precision.bf16)
    sustained = default_profile("H100-SXM5-80GB").sustained_clock_fraction
    for d in (64, 128):
        for curve, causal, backward in (("forward_causal", True, False), ("forward_noncausal", False, False),
                                        ("backward_noncausal", False, True)):
            for seq, tflops in zip(values["seqlen"], values[f"head_dim_{d}"][curve][kernel]):
                if tflops is None:
                    continue
                bh = (16384 // seq) * (2048 // d)
                fwd = attention_forward_flops(bh, seq, d, causal)
                t = cost.op_time_s(Op("a", OpKind.flash_attention, flops=2.5 * fwd if backward else fwd,
                                      attention=(bh, seq, d, causal, backward), kernel=backend)) * sustained
                assert (2.5 * fwd if backward else fwd) / t / 1e12 == pytest.approx(tflops, rel=0.10), (d, curve, seq)


@given(seq=st.sampled_from([512, 2048, 16384]), backward=st.booleans(),
       d=st.sampled_from([32, 64, 80, 96, 128, 160, 256]))
@settings(max_examples=40, deadline=None)
def test_attention_at_head_size_128_is_the_stated_efficiency_and_larger_heads_run_no_slower(seq, backward, d):
    """The efficiencies are stated at head size 128, so moving head_dim_half leaves it alone; a larger head
    does more matmul per tile of softmax and bookkeeping, so its FLOPs run at least as fast."""
    from simulator.cost.attention import attention_efficiency

    p = default_profile("H100-SXM5-80GB").attention
    q = p.model_copy(update={"head_dim_half": 0.0})
    q = q.model_copy(update={"backward_head_dim_half": 0.0})
    assert attention_efficiency(p, seq, backward, 128, True) == pytest.approx(
        attention_efficiency(q, seq, backward, 128, True))
    assert attention_efficiency(p, seq, backward, d, True) <= attention_efficiency(p, seq, backward, 2 * d, True)


@pytest.mark.parametrize("gpu", ["A100-SXM4-80GB", "H100-SXM5-80GB", "B200-SXM-180GB"])
@given(seq=st.sampled_from([256, 512, 1024, 2048, 4096, 8192, 16384, 65536]), backward=st.booleans())
@settings(max_examples=30, deadline=None)
def test_the_causal_mask_costs_more_than_the_half_it_skips_and_most_at_short_sequences(gpu, seq, backward):
    """Per executed FLOP a causal kernel runs slower than the unmasked one (its diagonal tiles are half masked and
    its rows unequal), by at most the declared loss, and the loss shrinks as the sequence grows."""
    from simulator.cost.attention import attention_efficiency

    p = default_profile(gpu).attention
    ratio = [attention_efficiency(p, s, backward, 128, True) / attention_efficiency(p, s, backward, 128, False)
             for s in (seq, 2 * seq)]
    assert p.causal_efficiency is not None
    assert ratio[0] < ratio[1] <= p.causal_efficiency < 1.0


@pytest.mark.parametrize("tp,sp,flash", [(1, False, False), (8, True, True), (4, False, True)])
def test_every_layer_op_has_a_finite_positive_time(tp, sp, flash):
    model = load_model("gpt3-175b")
    plan = ParallelPlan(tensor_parallel_size=tp, sequence_parallel=sp, use_flash_attention=flash, pipeline_parallel_size=1)
    layer = transformer_layer(model, plan)
    ops = [d["op"] for g in (layer.forward, layer.backward) for _, d in g.nodes(data=True)]
    times = [COST.op_time_s(op) for op in ops]
    assert all(0 < t < 1.0 for t in times)
    if tp == 1:
        assert not any(op.kind is OpKind.collective for op in ops)


def test_profile_for_another_gpu_is_refused():
    with pytest.raises(ProfileError, match="H100"):
        build_cost_model(CLUSTER, load_profile("h100-sxm5-80gb-published"), Precision.bf16)


@pytest.mark.parametrize("devices", [1, 2, 64, 1024])
def test_a_job_computes_at_the_pace_of_its_expected_slowest_device(devices):
    """With devices spread by sigma, every compute op of a job of N devices takes 1 + sigma E[max of N normals]
    times as long (none for one device, 1 / sqrt(pi) sigma for two), and no collective does."""
    from simulator.cost.jitter import expected_max_of_normals
    from simulator.graph.layers import CollectiveKind, CollectiveOp

    spread = A100.model_copy(update={"device_speed_spread": 0.02})
    slow = build_cost_model(CLUSTER, spread, Precision.bf16, devices=devices)
    factor = 1 + 0.02 * expected_max_of_normals(devices)
    assert expected_max_of_normals(2) == pytest.approx(1 / 3.141592653589793 ** 0.5, rel=1e-6)
    for op in (Op("g", OpKind.gemm, gemm=GemmShape(4096, 4096, 4096)), Op("e", OpKind.elementwise, bytes_moved=1e9)):
        assert slow.op_time_s(op) == pytest.approx(COST.op_time_s(op) * factor, rel=1e-12)
    ar = Op("c", OpKind.collective, collective=CollectiveOp(CollectiveKind.all_reduce, 2**26, 8))
    assert slow.op_time_s(ar) == COST.op_time_s(ar)
    # the published profiles keep every device as fast as the benchmarked one: the job's size changes nothing
    assert build_cost_model(CLUSTER, A100, Precision.bf16, devices=devices).op_time_s(
        Op("g", OpKind.gemm, gemm=GemmShape(4096, 4096, 4096))) == COST.op_time_s(Op("g", OpKind.gemm,
                                                                                     gemm=GemmShape(4096, 4096, 4096)))


def test_the_bands_slow_end_grows_with_the_devices_a_job_waits_for():
    """The declared spread (0, up to 2%) moves a 1,024-GPU job's slow corner more than an 8-GPU job's."""
    from simulator.estimator.band import corners
    from simulator.spec.plan import Job

    def change(gpus: int) -> float:
        plan = ParallelPlan(tensor_parallel_size=8, pipeline_parallel_size=1, data_parallel_size=gpus // 8,
                            micro_batch_size=1, global_batch_size=gpus // 8 * 4)
        job = Job(model=load_model("gpt3-1.3b"), cluster=CLUSTER, plan=plan)
        driver = next(d for d in corners(job, top=99).drivers if d.constant == "device_speed_spread")
        assert driver.change_at_low == 0.0 and driver.value == 0.0
        return driver.change_at_high

    small, large = change(8), change(1024)
    assert 0 < small < large
