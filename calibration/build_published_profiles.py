"""Build the published hardware profiles (``calibration/profiles/*-published.json``) by fitting the
cost-model forms to microbenchmark numbers read from ``calibration/published/hardware.json``.

    python -m calibration.build_published_profiles [--out DIR]

Only microbenchmark-level data is used (GEMM, memory-bound kernels, FlashAttention, NCCL), except
for the host block: no microbenchmark pins the CPU time Megatron spends per op, so those constants
come from the measured A100 sets (``python -m calibration.fit_host_overhead``, which
records each set's errors before and after, and checks the fit with each set left out in turn)
and the profile says so. Beyond that block, the measured end-to-end runs (Korthikanti et al.'s
tables, the vTrain sets) set nothing here: they are what the simulator is checked against. Where the published data does not pin a parameter, its ``sources`` entry says so
and argues the value chosen.
"""

from __future__ import annotations

import argparse
import csv
import functools
import json
import math
import statistics
from pathlib import Path
from types import SimpleNamespace

import numpy as np
from scipy.optimize import brentq, least_squares

from simulator.cost.collectives import CollectiveModel, Group
from simulator.cost.gemm import gemm_efficiency, gemm_time_s
from simulator.cost.profile import (
    SCHEMA_VERSION,
    AttentionParams,
    CollectiveParams,
    ElementwiseParams,
    FitRecord,
    GemmParams,
    HardwareProfile,
    HostParams,
    LinkParams,
    save_profile,
)
from simulator.graph.layers import CollectiveKind
from simulator.measure.fitting import (
    fit_achieved_fraction,
    fit_attention,
    fit_collective,
    fit_gemm,
    fit_step_latency,
    measured_ramp,
)
from simulator.spec.hardware import GpuSpec, load_cluster, load_gpu

HERE = Path(__file__).resolve().parent
PUBLISHED = HERE / "published" / "hardware.json"
VTRAIN_NCCL = HERE / "published" / "vtrain-nccl-a100"
HOST_FIT = HERE / "published" / "host_overhead_fit.json"
MD = "calibration/published/hardware.md"

# NCCL 2.30.7 latency model (src/graph/tuning.cc, hardware.md section 2): ring, LL protocol.
NCCL_RING_LL_BASE_US = 6.6
NCCL_NVLINK_LL_STEP_US = 0.6
NCCL_SIMPLE_BASE_US = 8.4
NCCL_NVLINK_SIMPLE_US = 3.4
NCCL_NET_SIMPLE_US = 14.0

LAUNCH_OVERHEAD_S = 2e-6
LAUNCH_RANGE = (1e-6, 4e-6)
LAUNCH_SOURCE = ("not pinned by the published data (all points are large kernels): 2 us, the usual gap between "
                 "back-to-back CUDA kernels on one stream; range 1-4 us")
K_HALF = 128.0
K_HALF_RANGE = (64.0, 256.0)
K_HALF_SOURCE = ("not pinned by the published data (no k sweep was extracted from Anthony et al.): 128 elements, "
                 "about 4 k-steps of 32 for pipeline fill plus the epilogue that writes a tile of C; range 2-8 "
                 "k-steps")
# The threadblock tiles of CUTLASS's SM80 f16/bf16 tensor-op GEMMs, among which cuBLAS-style heuristics pick one per
# shape (NVIDIA/cutlass python/cutlass_library/generator.py, GenerateSM80_TensorOp_16816); Hopper's kernels offer the
# same output tiles.
TILE_CHOICES = ((256, 128), (128, 256), (256, 64), (64, 256), (128, 128), (128, 64), (64, 128), (64, 64))
TILE_SOURCE = ("the output tiles of CUTLASS's SM80 f16/bf16 tensor-op GEMMs (NVIDIA/cutlass cutlass_library/"
               "generator.py, GenerateSM80_TensorOp_16816): 256x128 down to 64x64; each GEMM takes the fastest, as "
               "cuBLAS's heuristics pick a kernel per shape. tile_m x tile_n is the largest, kept for profiles "
               "without a choice")
XLA_MATMUL = HERE / "published" / "xla-matmul-h100" / "matmul_sm90.csv"
XLA_GPU = "H100-SXM5-80GB"
XLA_SOURCE = ("XLA's measured H100 matmul table (calibration/published/xla-matmul-h100/, 375 bf16 shapes, batch 1-4, "
              "m, n, k 256-4096)")
OVERLAP_SLOWDOWN = 0.10
OVERLAP_RANGE = (0.07, 0.15)
OVERLAP_SOURCE = ("not measured in the published data: NCCL runs one thread block per channel, and an NVLink ring "
                  "uses 8-16 channels, 7-15% of 108 SMs, while its traffic competes for HBM; 0.10 is the middle "
                  "of that range, which bounds it")

# A GEMM held at an A100's 400 W limit: cuBLAS 8192 x 8192 x 8192 with normally distributed inputs,
# timed over a sustained run, 257 and 258 TFLOPS (the same GEMM on all-zero inputs, which switch
# fewer transistors and so stay under the limit, 295). He, "Strangely, Matrix Multiplications on
# GPUs Run Faster When Given 'Predictable' Data!", thonking.ai, 2024. MAMF, which the GEMM block
# is fitted to, reports the fastest of 100 iterations of each shape, a burst the power limit has
# yet to bind; a training step runs its GEMMs for hours with weights and activations that are
# anything but zeros.
SUSTAINED_GEMM_GPU = "A100-SXM4-80GB"
SUSTAINED_GEMM_SHAPE = (8192, 8192, 8192)
SUSTAINED_GEMM_TFLOPS = (257.0, 258.0)
SUSTAINED_GEMM_SOURCE = ("H. He, 'Strangely, Matrix Multiplications on GPUs Run Faster When Given \"Predictable\" "
                         "Data!' (thonking.ai, 2024): cuBLAS 8192^3 on A100 with normally distributed inputs, "
                         "257-258 TFLOPS sustained at the 400 W limit (295 with zeros, which draw less power)")


DEVICE_SPREAD_RANGE = (0.0, 0.02)
DEVICE_SPREAD_SOURCE = ("not measured for this GPU: 0, every device as fast as the one the benchmarks timed. Sinha et "
                        "al. (SC22, 'Not All GPUs Are Created Equal') timed the same kernels on most GPUs of several "
                        "large clusters of one SKU each (V100 and MI60 among them) and found about 8% performance "
                        "variation from device to device, with outliers slower still; read as the fastest-to-"
                        "slowest range of thousands of devices (6-8 standard deviations) that is a spread of about "
                        "1-1.3%, so the range is 0-2%. A GEMM loop at sustained clocks timed on every GPU of a few "
                        "nodes would pin it")


PARTIAL_NODE_RANGE = (0.5, 1.0)
PARTIAL_NODE_SOURCE = (
    "not measured on these nodes: 1, the routed rings' bandwidth. Range down to 0.5: nccl-tests all-reduce on 4 "
    "nodes gave about 45 GB/s bus bandwidth with 4 GPUs a node against about 90 with 8 (NVIDIA/nccl#1168, 256 MB), "
    "and on 2 A100 nodes 4 GPUs over 2 NICs gave 45 against 78 over 4 (NVIDIA/nccl-tests#277); NCCL before 2.18 "
    "could pick a NIC far from a partial node's GPUs (NVIDIA/nccl#820). nccl-tests all_reduce_perf on 2+ nodes with "
    "CUDA_VISIBLE_DEVICES=0,2,4,6 and 0,4, sibling groups at once, would pin it")


def _a100_sustained_ratio() -> tuple[float, float]:
    """(sustained / burst, burst TFLOPS): the A100's sustained 8192^3 GEMM over what its GEMM block (MAMF's fastest
    iteration, a burst) gives that shape."""
    a100 = load_gpu(SUSTAINED_GEMM_GPU)
    gemm = _gemm(a100, _measured(), GPUS[a100.name][1])
    burst_tflops = float(gemm_efficiency(gemm, a100.sm_count, *SUSTAINED_GEMM_SHAPE)) * a100.peak_tflops.bf16
    return statistics.fmean(SUSTAINED_GEMM_TFLOPS) / burst_tflops, burst_tflops


def _sustained_clock_fraction(gpu: GpuSpec) -> tuple[float, str, tuple[float, float]]:
    """(value, source, range) of the share of the GEMM block's burst throughput a long run sustains: an A100's
    measured ratio; elsewhere, not measured, the bursts, with the A100's ratio as the slow end."""
    ratio, burst_tflops = _a100_sustained_ratio()
    if gpu.architecture == "ampere":
        return ratio, (f"{SUSTAINED_GEMM_SOURCE}, against the {burst_tflops:.1f} TFLOPS the GEMM block (MAMF's "
                       f"fastest iteration, a burst) gives that shape: {ratio:.4f}. Range up to 1, the bursts: how "
                       "far a run's clock falls depends on its device's cooling and on how much of each step its "
                       "GEMMs fill, which nothing here measures"), (ratio, 1.0)
    return 1.0, (f"not measured for this GPU: 1, the benchmarks' bursts; the slow end is the A100's ratio "
                 f"({ratio:.4f}: {SUSTAINED_GEMM_SOURCE}), as a device held at its power limit would be"), (ratio, 1.0)


def _measured() -> dict[str, dict]:
    data = json.loads(PUBLISHED.read_text())
    out: dict[str, dict] = {}
    for row in data["measured"]:
        key = row["id"] if row["id"] not in out else f"{row['id']}#{row['hardware']}"
        out[key] = row
    return out


def _gemm_point(shape: str, tflops: float, batch: int = 1, dtype: str = "bf16") -> tuple:
    m, n, k = (int(x) for x in shape.split("x"))
    return (m, n, k, batch, dtype, 2.0 * m * n * k * batch / (tflops * 1e12))


def xla_matmul_rows(path: Path = XLA_MATMUL) -> list[tuple[int, int, int, int, float]]:
    """(m, n, k, batch, bf16 FLOP/s) of every shape of XLA's H100 matmul table."""
    with path.open() as f:
        rows = [(int(r["m"]), int(r["n"]), int(r["k"]), int(r["b"]), float(r["bf16_flops_per_s"]))
                for r in csv.DictReader(f)]
    if not rows or any(min(row) <= 0 for row in rows):
        raise ValueError(f"{path} needs positive shapes and throughputs in every row; copy the table again")
    return rows


@functools.lru_cache(maxsize=1)
def _xla_shape_terms() -> SimpleNamespace:
    """k_half and the full-rate tile intensity fitted to XLA's H100 table, with their standard errors.

    Fitted in log time, so every shape counts by its relative error. The table's harness takes 5-6 us for the
    smallest shapes whatever their size; that floor is fitted as the launch overhead and dropped, and the maximum
    efficiency is fitted and dropped too (MAMF's brute-force search sets each GPU's own).
    """
    m, n, k, b, flops_per_s = (np.array(col, dtype=float) for col in zip(*xla_matmul_rows()))
    time_s = 2 * m * n * k * b / flops_per_s
    gpu = load_gpu(XLA_GPU)
    names = ("max_efficiency", "k_half", "full_rate_intensity_elements", "launch_overhead_s")
    scale = np.array([1.0, 100.0, 100.0, 1e-6])

    def log_ratio(x):
        p = GemmParams.model_construct(**dict(zip(names, x * scale)), tile_m=TILE_CHOICES[0][0],
                                       tile_n=TILE_CHOICES[0][1], tile_choices=TILE_CHOICES, misaligned_factor=1.0,
                                       alignment_bytes=2, ceiling_efficiency=None)
        return np.log(gemm_time_s(p, gpu.peak_tflops.bf16 * 1e12, gpu.sm_count, m, n, k, b) / time_s)

    fit = least_squares(log_ratio, [0.85, 1.28, 0.5, 5.0], bounds=([0.05, 0, 0, 0], [1.0, 81.92, 100.0, 1000.0]),
                        x_scale="jac", xtol=1e-13, ftol=1e-13, gtol=1e-13)
    dof = len(time_s) - len(names)
    stderr = np.sqrt(np.diag(np.linalg.inv(fit.jac.T @ fit.jac)) * np.sum(fit.fun ** 2) / dof) * scale
    values = dict(zip(names, fit.x * scale))
    points = tuple((float(a), float(c), float(d), float(e), 2.0, float(t)) for a, c, d, e, t in zip(m, n, k, b, time_s))
    record = FitRecord(columns=("m", "n", "k", "batch", "dtype_bytes", "time_s"), points=points,
                       residuals=tuple(float(r) for r in np.expm1(fit.fun)),
                       note=(f"{XLA_SOURCE}: k_half and full_rate_intensity_elements kept; max_efficiency "
                             f"{values['max_efficiency']:.3f} and the harness floor {values['launch_overhead_s'] * 1e6:.1f} "
                             "us fitted beside them and dropped"))
    return SimpleNamespace(k_half=values["k_half"], k_half_stderr=stderr[1],
                           intensity=values["full_rate_intensity_elements"], intensity_stderr=stderr[2],
                           balance=gpu.peak_tflops.bf16 / gpu.hbm_bandwidth_gbps,
                           per_sm_tflops=gpu.peak_tflops.bf16 / gpu.sm_count, record=record)


def _shape_terms(gpu: GpuSpec) -> tuple[dict, dict, dict]:
    """(values, ranges, sources) of the GEMM block's shape terms for ``gpu``, from the XLA H100 fit.

    A tile's fixed cost is taken as its epilogue writing C to memory, against a main loop that runs at the tensor
    rate, so the reduction length that amortises it scales with the machine's balance, peak FLOP/s over memory
    bandwidth (the FP8 block's rule); a latency or a number of pipeline steps would carry otherwise, and bound the
    range. The full-rate intensity is carried in elements: a tile shape reuses its operands the same number of times
    on any GPU.
    """
    xla = _xla_shape_terms()
    ratio = gpu.peak_tflops.bf16 / gpu.hbm_bandwidth_gbps / xla.balance
    k_half = xla.k_half * ratio
    fitted = gpu.name == XLA_GPU
    two_se_k, two_se_i = 2 * xla.k_half_stderr, 2 * xla.intensity_stderr
    values = {"k_half": k_half, "full_rate_intensity_elements": xla.intensity, "tile_choices": TILE_CHOICES}
    if fitted:
        ranges = {"k_half": (k_half - two_se_k, k_half + two_se_k),
                  "full_rate_intensity_elements": (xla.intensity - two_se_i, xla.intensity + two_se_i)}
        sources = {
            "k_half": f"fitted to {XLA_SOURCE}: {k_half:.0f} elements; range two standard errors of the fit",
            "full_rate_intensity_elements": (f"fitted to {XLA_SOURCE}: {xla.intensity:.1f} elements (a 128x128 tile's "
                                             "64 runs at full rate, a 64x64 tile's 32 does not); range two standard "
                                             "errors of the fit"),
        }
    else:
        per_sm = (gpu.peak_tflops.bf16 / gpu.sm_count) / xla.per_sm_tflops
        carries = (k_half, xla.k_half * per_sm, xla.k_half)
        ranges = {"k_half": (min(carries), max(carries)),
                  "full_rate_intensity_elements": (xla.intensity / 2 if gpu.architecture == "ampere" else
                                                   xla.intensity - two_se_i, xla.intensity + two_se_i)}
        sources = {
            "k_half": (f"not measured on this GPU: the H100 value fitted to {XLA_SOURCE}, {xla.k_half:.0f} elements, "
                       f"times this GPU's balance over H100's (peak bf16 FLOP/s per byte/s of HBM, {ratio:.2f}): "
                       f"{k_half:.0f}. Range {min(carries):.0f}-{max(carries):.0f}: the same fixed time per tile "
                       f"(a latency) at this GPU's tensor rate per SM gives {carries[1]:.0f}, the same number of "
                       f"pipeline steps (the H100 value unscaled) {carries[2]:.0f}"),
            "full_rate_intensity_elements": (
                f"not measured on this GPU: the H100 value fitted to {XLA_SOURCE}, {xla.intensity:.1f} elements"
                + (". Range down to half: Hopper's tensor cores do twice Ampere's math per SM and clock from shared "
                   "memory of the same width, so an Ampere tile may need half the reuse" if gpu.architecture == "ampere"
                   else "; range two standard errors of the fit")),
        }
    sources["tile_choices"] = TILE_SOURCE
    return values, ranges, sources


def _mamf_key(gpu: GpuSpec, dtype: str) -> str:
    """The MAMF row a Hopper or Blackwell GPU's GEMM block is fitted to: Hopper's bf16 block takes the H100's (no
    H200 bf16 row was published), its FP8 block and every Blackwell block the GPU's own."""
    if gpu.architecture == "blackwell":
        return f"mamf_{gpu.name.split('-')[0].lower()}_{dtype}"
    return "mamf_h100_bf16" if dtype == "bf16" else f"mamf_{gpu.name[:4].lower()}_{dtype}"


def _gemm(gpu: GpuSpec, rows: dict, tiles: tuple[int, int], tile_choice: bool | None = None) -> GemmParams:
    """The bf16 GEMM block. ``tile_choice`` (default: Hopper only) gives each GEMM the fastest of CUTLASS's tiles with
    the shape terms of the XLA H100 fit; without it, one tile in strict waves.

    The A100 keeps one tile: carried there, the H100 form made the single-node set and Korthikanti's rows better and
    the multi-node set worse (more optimistic at TP 4-8), and left the host block's leave-one-set-out fit for the
    single-node set far off; no A100 shape sweep is published to settle it (``python -m calibration.residuals``
    shows the sets with it)."""
    peak = gpu.peak_tflops.bf16 * 1e12
    if tile_choice if tile_choice is not None else gpu.architecture != "ampere":
        shape_values, shape_ranges, shape_sources = _shape_terms(gpu)
        tile_source = TILE_SOURCE
    else:
        shape_values, shape_ranges, shape_sources = {"k_half": K_HALF}, {"k_half": K_HALF_RANGE}, {"k_half": K_HALF_SOURCE}
        tile_source = (f"not pinned (one best shape per GPU): {tiles[0]}x{tiles[1]}, the largest tensor-core tile of "
                       f"cuBLAS/CUTLASS bf16 kernels; waves over sm_count={gpu.sm_count} SMs follow Anthony et al. "
                       f"2024 ({MD} section 3d)")
    common = {"tile_m": tiles[0], "tile_n": tiles[1], "launch_overhead_s": LAUNCH_OVERHEAD_S, **shape_values}
    if gpu.architecture == "ampere":
        mamf = rows["mamf_a100_bf16"]  # the SXM row (the PCIe row has the same id)
        misaligned = {"misaligned_factor": 1 / 1.39, "alignment_bytes": 128}
        mis_source = ("Anthony et al. 2024: hardware-aligned shapes give up to 39% higher throughput, so 1/1.39 "
                      f"({MD} section 3d); no misaligned A100 timing was published")
        align_source = f"Anthony et al. 2024: A100 tensor cores need m, n, k multiples of 128 bytes ({MD} section 3d)"
        fits = []
    else:
        mamf = rows[_mamf_key(gpu, "bf16")]
        swiglu = rows["h100_swiglu_misalignment"]["values"]
        points = [_gemm_point(f"4096x{key.split('=')[1].split()[0]}x4096", v, batch=4, dtype="fp16")
                  for key, v in swiglu.items()]
        # The bench's absolute level (40% of peak) is far below MAMF's 80%, so only the ratio between its
        # aligned and misaligned shapes is used: max_efficiency is free here and discarded.
        shape_fit = fit_gemm(points, peak, gpu.sm_count, fixed=common,
                             note="H100 swiglu-maf-bench bmm [4,4096,4096]x[4,4096,d_ff]; only the misaligned/aligned "
                                  "ratio is kept (its absolute level is 40% of peak, unlike MAMF's 80%)")
        misaligned = {k: shape_fit.params[k] for k in ("misaligned_factor", "alignment_bytes")}
        mis_source = (f"fitted to the H100 d_ff 10922 vs 10944/10848/11008 bmm timings ({MD} section 3d, [stas-perf]); "
                      "the H100 value is used for H200 (same SM90 tensor cores)")
        align_source = ("fitted among 16/32/64/128 bytes: d_ff=10848 (64-byte multiple, not 128) runs at full speed, so "
                        "the largest alignment the H100 data allows is 64 bytes")
        fits = [shape_fit.record] + ([_xla_shape_terms().record] if gpu.name == XLA_GPU else [])
    best = fit_gemm([_gemm_point(mamf["best_shape_MxNxK"], mamf["value"])], peak, gpu.sm_count,
                    fixed={**common, **misaligned},
                    note=f"MAMF best shape, {mamf['hardware']} {mamf['dtype']} {mamf['value']} TFLOPS")
    params = {**best.params, "ceiling_efficiency": mamf["value"] / gpu.peak_tflops.bf16}
    ranges = {**shape_ranges, "launch_overhead_s": LAUNCH_RANGE}
    if gpu.architecture == "ampere":  # "up to 39%": anything from that slowdown to none
        ranges["misaligned_factor"] = (params["misaligned_factor"], 1.0)
    return GemmParams(
        **params, ranges=ranges,
        sources={
            "ceiling_efficiency": (f"MAMF {mamf['value']} / {gpu.peak_tflops.bf16} TFLOPS: the best of a brute-force "
                                   f"search over shapes on {mamf['hardware']} ({MD} section 3d), so no shape beats it"),
            "max_efficiency": (f"fitted to the MAMF maximum achievable {mamf['value']} TFLOPS at "
                               f"{mamf['best_shape_MxNxK']} on {mamf['hardware']} ({MD} section 3d), after its wave "
                               "and k terms"),
            "tile_m": tile_source, "tile_n": tile_source, **shape_sources,
            "misaligned_factor": mis_source,
            "alignment_bytes": align_source,
            "launch_overhead_s": LAUNCH_SOURCE,
        },
        fits=tuple(fits) + (best.record,),
    )


def _gemm_fp8(gpu: GpuSpec, rows: dict, bf16: GemmParams) -> GemmParams | None:
    """FP8 (e4m3) GEMMs on Hopper: the MAMF fp8 maximum against the fp8 dense peak; the shape terms of bf16."""
    if gpu.peak_tflops.fp8 is None:
        return None
    mamf = rows[_mamf_key(gpu, "fp8_e4m3")]
    peak = gpu.peak_tflops.fp8
    # Alignment is a count of elements, so it carries over from bf16 with the bytes halved; the main
    # loop runs twice as fast per k-step while the epilogue still writes bf16, so it takes twice the
    # reduction length to amortise. The tile is one, fitted, not bf16's choice: under every tile of
    # bf16's choice that runs at full rate the MAMF best shapes leave 13% (H100) and 19% (H200) or more
    # of their SM-slots idle (1280 x 4096 x 12032 on H200: 320 tiles of 128 x 128 for 3 waves of 132
    # SMs), which a brute-force search for the best shape would not have found best unless the FP8
    # kernels it ran quantise less; no FP8 shape sweep is published to say how.
    common = {"k_half": 2 * bf16.k_half, "launch_overhead_s": LAUNCH_OVERHEAD_S,
              "misaligned_factor": bf16.misaligned_factor, "alignment_bytes": bf16.alignment_bytes // 2}
    m, n, k = (int(x) for x in mamf["best_shape_MxNxK"].split("x"))
    point = (m, n, k, 1, 1, 2.0 * m * n * k / (mamf["value"] * 1e12))
    best = fit_gemm([point], peak * 1e12, gpu.sm_count, fixed=common,
                    note=f"MAMF best shape, {mamf['hardware']} {mamf['dtype']} {mamf['value']} TFLOPS")
    not_published = "no FP8 shape sweep was published (only the MAMF maximum)"
    return GemmParams(
        **best.params, ceiling_efficiency=mamf["value"] / peak,
        ranges={"k_half": (2 * bf16.ranges["k_half"][0], 2 * bf16.ranges["k_half"][1]),
                "launch_overhead_s": LAUNCH_RANGE},
        sources={
            "ceiling_efficiency": (f"MAMF {mamf['dtype']} {mamf['value']} / {peak} TFLOPS = "
                                   f"{mamf['efficiency_pct']}%: the best of a brute-force search over shapes on "
                                   f"{mamf['hardware']} ({MD} section 3d)"),
            "max_efficiency": (f"fitted to the MAMF maximum achievable {mamf['value']} TFLOPS at "
                               f"{mamf['best_shape_MxNxK']} on {mamf['hardware']} ({MD} section 3d), after its wave "
                               "and k terms"),
            **dict.fromkeys(("tile_m", "tile_n"), (
                f"fitted among 64/128/256 ({not_published}): the MAMF best shape is explained with max_efficiency "
                "<= 1 by several tiles and the first of them is kept; under bf16's tiles at full rate the best shape "
                "would leave 13% or more of its SM-slots idle, which a brute-force search would not have picked")),
            "k_half": (f"{not_published}: twice the bf16 value, since an FP8 k-step takes half the time while the "
                       "bf16 epilogue does not"),
            "misaligned_factor": f"{not_published}: the bf16 value",
            "alignment_bytes": (f"{not_published}: the bf16 alignment in elements "
                                f"({bf16.alignment_bytes} bytes of bf16 = {bf16.alignment_bytes // 2} bytes of fp8)"),
            "launch_overhead_s": LAUNCH_SOURCE,
        },
        fits=(best.record,),
    )


def _elementwise(gpu: GpuSpec, rows: dict) -> ElementwiseParams:
    if gpu.architecture == "ampere":
        olmo = rows["olmo_triton_layernorm_a100"]["values"]
        apex = rows["apex_fast_layernorm_ga100"]["values"]
        achieved = [rows["a100_40gb_memcopy"]["value"], olmo["affine_fwd_N8192"]["triton"],
                    olmo["noaffine_bwd_N8192"]["triton"], apex["fast_ln_fwd"], apex["fast_ln_bwd"]]
        peaks = [1555, 2039, 2039, 2039, 2039]
        source = ("fitted to A100 memory-bound kernels ({md} section 3f): memcopy 1355 GB/s of 1555 (A100 40GB); "
                  "Triton LayerNorm 1380/1524 GB/s (A100 80GB: 1524 is above a 40GB's peak); apex fast LayerNorm "
                  "1258/1163 GB/s (variant not stated; taken against the 80GB peak, the lower fraction). One "
                  "fraction for both A100 variants: a property of the kernels on GA100").format(md=MD)
    else:
        achieved, peaks = [3000.0, 3010.0], [3350, 3350]
        source = (f"fitted to QuACK RMSNorm/softmax/cross-entropy on H100 80GB, ~3 TB/s (~90% of 3.35) and 3.01 TB/s "
                  f"fp32 softmax ({MD} section 3f); the H100 fraction is used for H200 (same memory controller design)")
    fit = fit_achieved_fraction(achieved, peaks, note="achieved GB/s of large memory-bound kernels against HBM peak")
    sources = {"achieved_fraction": source, "launch_overhead_s": LAUNCH_SOURCE}
    fits, classes = (fit.record,), None
    if gpu.architecture == "ampere":
        # Streaming kernels (a copy, dropout, GeLU, a bias or residual add) read and write each element once,
        # as a memcopy does; norms and softmax reduce over a row first, as the LayerNorm benchmarks do.
        stream = fit_achieved_fraction(achieved[:1], peaks[:1], note="A100 40GB memcopy, 1355 of 1555 GB/s")
        rows_fit = fit_achieved_fraction(achieved[1:], peaks[1:], note="A100 LayerNorm forward/backward, Triton and apex")
        # Dropout is not a copy: it draws a Philox random number per element and writes a mask byte as
        # well. The measured torch kernel counts input and output only; the model also counts the mask,
        # so the same time is 9/8 of the counted bytes at the smallest correction (4-byte elements; the
        # benchmark's dtype is not stated: 2-byte ones would give 5/4).
        drop = rows["a100_torch_dropout"]["value"]
        dropout = fit_achieved_fraction([drop * 9 / 8], [2039],
                                        note=f"torch dropout on A100, {drop} GB/s counted on input and output, "
                                             "x 9/8 for its mask byte, against the 80GB peak")
        s, r = stream.params["achieved_fraction"], rows_fit.params["achieved_fraction"]
        classes = {"copy": s, "dropout": dropout.params["achieved_fraction"], "gelu": s, "bias_add_residual": s,
                   "layer_norm": r, "softmax": r}
        sources["kernel_fractions"] = (
            f"per kernel class ({MD} section 3f): streaming kernels (copy, gelu, bias/residual add) at the "
            "memcopy's fraction (1355 of 1555 GB/s); dropout at the measured torch dropout kernel's "
            f"({drop} GB/s on A100, flagos-ai/FlagGems#85; variant not stated, taken against the 80GB peak, the "
            "lower fraction, as for the LayerNorm rows; x 9/8 for the mask byte the benchmark does not count: "
            f"range {drop / 2039:.2f} without that correction to {drop * 5 / 4 / 1555:.2f} on a 40GB with "
            "2-byte elements); row reductions (layer_norm, softmax) at the LayerNorm benchmarks' (Triton "
            "1380/1524, apex 1258/1163 GB/s of 2039); achieved_fraction, the fit to all five, for any other class")
        fits += (stream.record, dropout.record, rows_fit.record)
    return ElementwiseParams(achieved_fraction=fit.params["achieved_fraction"], launch_overhead_s=LAUNCH_OVERHEAD_S,
                             kernel_fractions=classes, sources=sources, fits=fits,
                             ranges={"launch_overhead_s": LAUNCH_RANGE})


def _fa2_a100_fit():
    # FA2's benchmark: 16k tokens per batch, hidden 2048, head dim 128 (16 heads), non-causal.
    def point(seq: int, backward: bool, eff: float) -> tuple:
        bh = (16384 // seq) * 16
        fwd = 4.0 * bh * seq * seq * 128
        return (bh, seq, 128, False, backward, (2.5 if backward else 1.0) * fwd / (eff * A100_PEAK))

    points = [point(16384, False, 0.73), point(16384, True, 0.63), point(512, True, 0.50)]
    return fit_attention(points, A100_PEAK, fixed={"launch_overhead_s": LAUNCH_OVERHEAD_S},
                         note="FA2 on A100: 73% forward and 63% backward at long sequences; the 50% low end of "
                              "its 50-73% range taken at the shortest sequence (512), backward")


A100_PEAK = 312e12
H100_PEAK = 989.4e12
FA3_CURVES = "fa3_paper_h100_curves"
HOPPER_KERNELS = {"fa2": "FlashAttention-2", "cudnn": "cuDNN's fused attention", "fa3": "FlashAttention-3"}


@functools.lru_cache(maxsize=None)
def hopper_attention_fit(kernel: str):
    """One kernel of the FA3 paper's H100 curves (16k tokens a batch, hidden 2048, head dims 64 and 128): the
    forward with and without the causal mask and the backward (only timed without it), each at its measured
    TFLOPs/s, fitted as fractions of H100's peak; the causal term from the two forwards."""
    row = _measured()[FA3_CURVES]["values"]
    points = []
    for head_dim in (64, 128):
        curves = row[f"head_dim_{head_dim}"]
        for curve, causal, backward in (("forward_causal", True, False), ("forward_noncausal", False, False),
                                        ("backward_noncausal", False, True)):
            for seq, tflops in zip(row["seqlen"], curves[curve][kernel]):
                if tflops is None:  # not transcribed
                    continue
                bh = (16384 // seq) * (2048 // head_dim)
                fwd = 4.0 * bh * seq * seq * head_dim / (2 if causal else 1)
                points.append((bh, seq, head_dim, causal, backward,
                               (2.5 if backward else 1.0) * fwd / (tflops * 1e12)))
    return fit_attention(points, H100_PEAK, fixed={"launch_overhead_s": LAUNCH_OVERHEAD_S}, backward_terms=True,
                         note=f"{HOPPER_KERNELS[kernel]} on H100 SXM5, head dims 64 and 128: the forward with and "
                              "without the causal mask and the non-causal backward at 512-16k tokens (FA3 paper, "
                              "Figs. 5-6)")


# a fitted kernel's sequence and head-size terms, each ranging from no effect up to twice its fitted value
SIZE_TERMS = ("seq_half", "backward_seq_half", "head_dim_half", "backward_head_dim_half")


def _hopper_kernel(kernel: str, faster: str, why_faster: str) -> AttentionParams:
    """A Hopper kernel at its fitted fractions of peak (the same on H200: its tensor peak is H100's), with each
    efficiency's range up to ``faster``'s, the kernel the same backend runs where ``why_faster`` holds."""
    fit, fast = hopper_attention_fit(kernel), hopper_attention_fit(faster)
    name, fast_name = HOPPER_KERNELS[kernel], HOPPER_KERNELS[faster]
    p = fit.params
    ranges = {"launch_overhead_s": LAUNCH_RANGE, **{k: (0.0, 2 * p[k]) for k in SIZE_TERMS}}
    sources = {"launch_overhead_s": LAUNCH_SOURCE}
    for phase, prefix in (("forward", ""), ("backward", "backward_")):
        sources[f"{prefix}seq_half"] = (f"fitted with the efficiencies to {name}'s {phase} from 512 to 16k tokens; "
                                        "range: no size effect up to twice it")
        sources[f"{prefix}head_dim_half"] = (f"fitted with the efficiencies to {name}'s {phase} at head dims 64 and "
                                             "128 (none other was transcribed); range: no head-size effect up to "
                                             "twice it")
    for phase, curve in (("forward", "the forward without the mask"), ("backward", "the backward (timed without "
                                                                                    "the causal mask)")):
        key = f"{phase}_efficiency"
        ranges[key] = (p[key], max(p[key], fast.params[key]))
        sources[key] = (f"fitted to {name} on H100 SXM5, {curve}, stated at head dim 128, 512-16k tokens ({MD} section 3e, "
                        f"FA3 paper Figs. 5-6); range up to {fast_name}'s {fast.params[key]:.3f}, {why_faster}")
    ranges.update(causal_ranges(p))
    sources.update(causal_sources(f"{name}'s forward with and without the mask, H100 SXM5, head dims 64 and 128, "
                                  f"512-16k tokens ({MD} section 3e, FA3 paper Fig. 5)"))
    return AttentionParams(**p, ranges=ranges, sources=sources, fits=(fit.record,))


def causal_ranges(p: dict) -> dict:
    """The causal term's ranges: its loss is measured on the forward only, and the backward is taken to lose the
    same (it walks the same diagonal tiles); the range runs from no loss beyond the skipped half to twice the
    measured short-sequence loss."""
    return {"causal_efficiency": (p["causal_efficiency"], 1.0), "causal_seq_half": (0.0, 2 * p["causal_seq_half"])}


def causal_sources(measured: str) -> dict:
    return {"causal_efficiency": (f"fitted to {measured}; the causal backward, not timed there, taken to lose the "
                                  "same; range up to no loss beyond the skipped half"),
            "causal_seq_half": f"fitted with causal_efficiency; range: no short-sequence loss up to twice it"}


def _attention(gpu: GpuSpec) -> AttentionParams:
    """The kernel Megatron's --attention-backend auto runs: FA2 on Ampere; on Hopper, Transformer Engine gives
    cuDNN's fused attention preference over FlashAttention (its get_attention_backend, sm90 and later)."""
    a100_fit = _fa2_a100_fit()
    if gpu.architecture == "ampere":
        fa2 = hopper_attention_fit("fa2").params
        fa2_h100 = fa2["head_dim_half"]
        causal = {k: fa2[k] for k in ("causal_efficiency", "causal_seq_half")}
        return AttentionParams(
            **a100_fit.params, head_dim_half=0.0, **causal,
            ranges={"launch_overhead_s": LAUNCH_RANGE, "seq_half": (0.0, 2 * a100_fit.params["seq_half"]),
                    "head_dim_half": (0.0, fa2_h100), **causal_ranges(causal)},
            sources={
                **causal_sources("FlashAttention-2's forward with and without the mask on H100 SXM5 (FA3 paper "
                                 f"Fig. 5, {MD} section 3e), taken for FA2 on A100: the same kernel, whose tiles "
                                 "are the same on sm80 and sm90, and FA2's A100 curves were not transcribed"),
                "head_dim_half": ("not measured on A100 (FA2's per-head-size curves exist only as figures, not "
                                  "transcribed): 0, every head size at head size 128's efficiency; range up to "
                                  f"FA2's on H100 ({fa2_h100:.0f}, FA3 paper Fig. 5)"),
                "forward_efficiency": f"fitted to FA2 on A100 80GB: up to 73% of peak forward ({MD} section 3e, [FA2])",
                "backward_efficiency": f"fitted to FA2 on A100 80GB: up to 63% of peak backward ({MD} section 3e)",
                "seq_half": ("fitted: FA2's 50-73% range spans seqlen 512-16k; its low end is attributed to the "
                             "shortest sequence (an interpretation: the per-seqlen curves exist only as figures); "
                             "range: no size effect up to twice that"),
                "launch_overhead_s": LAUNCH_SOURCE,
            },
            fits=(a100_fit.record,))
    return _hopper_kernel("cudnn", "fa3", "which newer cuDNN releases approach")


def _attention_kernels(gpu: GpuSpec) -> dict[str, AttentionParams]:
    """Backends that run another kernel than auto's: on Hopper, --attention-backend flash runs the flash-attn
    package, FlashAttention-2 unless FlashAttention-3's is installed beside it."""
    if gpu.architecture != "hopper":
        return {}
    return {"flash": _hopper_kernel("fa2", "fa3", "which Transformer Engine runs instead where flash_attn_3 is "
                                                  "installed")}


# nccl-tests#119: all_reduce_perf -b 8 -e 128M -g 1 on 24 ranks (3 nodes x 8 A100, 4 HDR NICs each), whose
# default step is 1 MiB: sizes 8 B + k MiB up to 128 MiB; it reports the mean bus bandwidth over them.
SWEEP_CLUSTER = "a100-80gb-4x-hdr"
SWEEP_SIZES = tuple(8 + k * 2**20 for k in range(128))
SWEEP_RANKS = 24


def _sweep_model(nvlink: LinkParams, network: LinkParams) -> CollectiveModel:
    """The collective model of the nccl-tests#119 machines under trial links (no sources yet, so not a profile)."""
    return CollectiveModel(load_cluster(SWEEP_CLUSTER), SimpleNamespace(
        collectives=SimpleNamespace(nvlink=nvlink, network=network)))


def _sweep_busbw(model: CollectiveModel) -> list[float]:
    """The bus bandwidth ``model`` gives at each size of the nccl-tests#119 sweep."""
    return [model.busbw_gbps(CollectiveKind.all_reduce, s, Group(SWEEP_RANKS)) for s in SWEEP_SIZES]


def _network_ramp(rows: dict) -> dict:
    """The inter-node ramp, pinned by the one published inter-node size sweep: nccl-tests#119's mean bus
    bandwidth over its 128 sizes (8 B-128 MiB) on 3 nodes of 8 A100 with 4 HDR NICs each. Its half size
    is solved for with the exponent of the 8x A100 NVLink curve (one number pins one constant), at the
    bus bandwidth of that sweep's ring, so that rings of other bandwidths (8 NICs, NDR) read it as the
    same fill time. The sweep's peak is not fitted: it checks the fit."""
    a100 = load_gpu("A100-SXM4-80GB")
    nvlink, network = _links_borrowed(a100, rows, GPUS[a100.name][0])
    measured = rows["a100_3node_4hdr"]["values"]
    ring_gbps = _sweep_model(nvlink, network).network.ring(SWEEP_RANKS, 1).busbw_gbps

    def model(half_size: float) -> CollectiveModel:
        return _sweep_model(nvlink, network.model_copy(update={
            "half_size_bytes": half_size, "ramp_curve": None, "ramp_reference_busbw_gbps": ring_gbps}))

    half = brentq(lambda h: statistics.fmean(_sweep_busbw(model(h))) - measured["avg_busbw"], 1e3, 1e10, xtol=1e2)
    bw = _sweep_busbw(model(half))
    # the NVLink curve's ramp (what the network borrowed before an inter-node sweep was read) as a fill time here
    nvlink_half = nvlink.half_size_bytes * ring_gbps / nvlink.max_busbw_gbps
    record = FitRecord(columns=("mean_busbw_gbps", "peak_busbw_gbps"),
                       points=((measured["avg_busbw"], measured["peak_busbw"]),),
                       residuals=(statistics.fmean(bw) / measured["avg_busbw"] - 1,),
                       note="nccl-tests#119: all_reduce_perf 8 B-128 MiB in 1 MiB steps, 3 nodes x 8 A100, 4 HDR "
                            f"NICs per node: the mean bus bandwidth fitted; the peak, a check, comes out "
                            f"{max(bw) / measured['peak_busbw'] - 1:+.1%}")
    source = (f"solved so that the mean bus bandwidth over nccl-tests#119's sweep (8 B-128 MiB in 1 MiB steps, 3 nodes "
              f"x 8 A100, 4 HDR NICs each: {measured['avg_busbw']} GB/s, {MD} section 3b) comes out as measured, with "
              f"the 8x A100 NVLink curve's exponent; its peak, not fitted, comes out {max(bw):.1f} GB/s against "
              f"{measured['peak_busbw']}")
    return {"half_size_bytes": half, "ramp_exponent": nvlink.ramp_exponent, "ramp_reference_busbw_gbps": ring_gbps,
            "record": record, "source": source, "nvlink_half_size_bytes": nvlink_half}


def _links(gpu: GpuSpec, rows: dict, nic_gbps: float) -> CollectiveParams:
    """NVLink from the GPU's all-reduce curve; the network from its NICs and the inter-node sweep's ramp."""
    nvlink, network = _links_borrowed(gpu, rows, nic_gbps)
    fit = _network_ramp(rows)
    hdr = gpu.architecture == "ampere"
    sources = {**network.sources,
               "half_size_bytes": fit["source"] if hdr else (
                   f"not pinned on NDR (no inter-node sweep of it was published): the HDR sweep's fill time, "
                   f"{fit['source']}; range: that fill time up to the 8x A100 NVLink curve's"),
               "ramp_exponent": "the 8x A100 NVLink curve's, with which the half size was solved for",
               "ramp_reference_busbw_gbps": ("the ring bus bandwidth of nccl-tests#119's 24 ranks over 4 HDR NICs per "
                                             "node, as the network model routes it")}
    sources.pop("ramp_curve", None)
    ranges = {} if hdr else {"half_size_bytes": (fit["half_size_bytes"], fit["nvlink_half_size_bytes"])}
    sources["partial_node_efficiency"] = PARTIAL_NODE_SOURCE
    ranges["partial_node_efficiency"] = PARTIAL_NODE_RANGE
    network = LinkParams(**{**network.model_dump(exclude={"sources", "fits", "ranges"}),
                            "half_size_bytes": fit["half_size_bytes"], "ramp_exponent": fit["ramp_exponent"],
                            "ramp_curve": None, "ramp_reference_busbw_gbps": fit["ramp_reference_busbw_gbps"],
                            "partial_node_efficiency": 1.0},
                         sources=sources, fits=(*network.fits, fit["record"]), ranges=ranges)
    return CollectiveParams(nvlink=nvlink, network=network)


# The sizes (MiB) the measured 2-8 GPU all-reduce curves keep: about four per doubling, the measurements' own
# range (1 MiB-1 GiB in 1 MiB steps), so interpolating between them stays within the measurements' scatter.
NCCL_CURVE_MIB = (1, 2, 3, 4, 5, 6, 8, 10, 12, 14, 16, 20, 24, 28, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224,
                  256, 320, 384, 448, 512, 640, 768, 896, 1024)
NCCL_CURVE_WINDOW = 0.03  # each kept size: the median of the measured sizes within 3% of it


def vtrain_nccl_rows(path: Path) -> list[tuple[int, float]]:
    """(size_bytes, in-place time_s) of one of vTrain's nccl-tests all-reduce tables."""
    with path.open(newline="") as f:
        reader = csv.reader(f)
        header = next(reader)
        if len(header) != 7 or not header[0].startswith("size"):
            raise ValueError(f"{path}: expected nccl-tests' 7 columns (size, count, type, time, busbw, time, busbw)")
        return [(int(row[0]), float(row[5]) * 1e-9) for row in reader]


def vtrain_nccl_curves() -> dict[int, tuple[tuple[float, float], ...]]:
    """The measured all-reduce curve of each rank count (2-8 GPUs of one A100 node), on ``NCCL_CURVE_MIB``."""
    curves = {}
    for path in sorted(VTRAIN_NCCL.glob("allreduce_*gpu.csv")):
        ranks = int(path.stem.removeprefix("allreduce_").removesuffix("gpu"))
        rows = vtrain_nccl_rows(path)
        curve = []
        for mib in NCCL_CURVE_MIB:
            size = mib << 20
            near = [t for s, t in rows if abs(s / size - 1) <= NCCL_CURVE_WINDOW]
            curve.append((float(size), statistics.median(near)))
        curves[ranks] = tuple(curve)
    return curves


def _links_borrowed(gpu: GpuSpec, rows: dict, nic_gbps: float) -> tuple[LinkParams, LinkParams]:
    """NVLink from the GPU's curve, and the network's bandwidth and latency, its ramp borrowed from NVLink."""
    ring_latency_s = (NCCL_RING_LL_BASE_US + 2 * 7 * NCCL_NVLINK_LL_STEP_US) * 1e-6
    latency_source = ("NCCL 2.30.7's latency model for an 8-GPU LL ring: baseLat 6.6 us + 14 steps x 0.6 us NVLink "
                      f"hwLat ({MD} section 2); the curve alone cannot split latency from the bandwidth ramp")
    p2p_latency = (NCCL_SIMPLE_BASE_US + NCCL_NVLINK_SIMPLE_US) * 1e-6
    net_p2p_latency = (NCCL_SIMPLE_BASE_US + NCCL_NET_SIMPLE_US) * 1e-6
    if gpu.architecture == "ampere":
        curve = rows["a100_8gpu_allreduce_curve"]["curve"]
        points = [(s, t * 1e-6) for s, _, t in curve]
        fit = fit_collective(points, 8, latency_s=ring_latency_s,
                             note="nccl-tests all_reduce_perf, 8x A100 NVSwitch, 32 KiB-16 GiB [stas-net]")
        best_busbw, ramp_curve = measured_ramp(points, 8, latency_s=ring_latency_s)
        nvlink_p2p = fit_achieved_fraction([374.0, 396.4], [450, 450], note="H100/H200 NVLink p2p over 450 GB/s")
        curve_source = f"the 8x A100 all-reduce curve, 32 KiB-16 GiB ({MD} section 3a, [stas-net])"
        nvlink = LinkParams(
            latency_s=ring_latency_s, max_busbw_gbps=best_busbw,
            half_size_bytes=fit.params["half_size_bytes"], ramp_exponent=fit.params["ramp_exponent"],
            ramp_curve=ramp_curve, all_reduce_curves=vtrain_nccl_curves(),
            p2p_bandwidth_gbps=nvlink_p2p.params["achieved_fraction"] * gpu.nvlink_bandwidth_gbps_per_direction,
            p2p_latency_s=p2p_latency,
            ranges={"p2p_bandwidth_gbps": (371 / 450 * gpu.nvlink_bandwidth_gbps_per_direction,
                                           396.4 / 450 * gpu.nvlink_bandwidth_gbps_per_direction)},
            sources={
                "latency_s": latency_source,
                "max_busbw_gbps": f"the best point of {curve_source}, its latency taken out",
                "ramp_curve": f"{curve_source}: each point's busbw with the latency taken out, over the best",
                "all_reduce_curves": ("nccl-tests all_reduce_perf on 2-8 GPUs of one A100 node (NVSwitch), 1 MiB-1 "
                                      "GiB, in place: vTrain's A100 tables (calibration/published/vtrain-nccl-a100, "
                                      "measured on the machines of the vTrain development sets); each kept size the "
                                      "median of the measured sizes within 3% of it. They run faster than the "
                                      "[stas-net] curve at 8 GPUs from 16 to 256 MiB, and at 2-7 GPUs their 1-4 MiB "
                                      "floor is below what that curve's ramp gives; it is kept for other sizes and "
                                      "rank counts"),
                **{k: f"fitted to {curve_source}; used only outside its sizes"
                   for k in ("half_size_bytes", "ramp_exponent")},
                "p2p_bandwidth_gbps": ("no A100 p2p figure was published: the fraction of line rate measured on "
                                       f"H100 (371-377 of 450) and H200 (396.4 of 450) ({MD} section 3c), x 300 GB/s"),
                "p2p_latency_s": "NCCL 2.30.7 Simple protocol: baseLat 8.4 us + NVLink hwLat 3.4 us",
            },
            fits=(fit.record, nvlink_p2p.record))
        net_points, net_note = [192 / 8, 24.0], "DGX A100 all-reduce 192 GB/s over 8 HDR NICs; HDR per-NIC ceiling 24 GB/s"
        net_source = (f"NVIDIA/nccl#812 (192 GB/s busbw over 8x HDR) and nccl-tests#119 (24 GB/s per HDR NIC) "
                      f"({MD} section 3b)")
    else:
        curve = rows["h200_8gpu_allreduce_curve"]["curve"]
        fit = fit_collective([(s, b) for s, b in curve], 8, metric="busbw_gbps", latency_s=ring_latency_s,
                             note="all_reduce_bench, 8x H200, NVLS from 2 MiB [stas-net]")
        best_nvls, ramp_curve = measured_ramp([(s, 1.75 * s / (b * 1e9)) for s, b in curve], 8, latency_s=ring_latency_s)
        curve_source = f"the 8x H200 all-reduce curve, 32 KiB-16 GiB, NVLS from 2 MiB ({MD} section 3a, [stas-net])"
        ring = fit_achieved_fraction([367.2, 361.4, 362.9, 370.0, 367.5, 360.0, 350.0], [450] * 7,
                                     note="H200 ring all-reduce/all-gather/reduce-scatter at 16 GiB; H100 ring "
                                          "370, 365-370, 360, 350 GB/s busbw")
        nvlink = LinkParams(
            latency_s=ring_latency_s, max_busbw_gbps=ring.params["achieved_fraction"] * 450,
            half_size_bytes=fit.params["half_size_bytes"], ramp_exponent=fit.params["ramp_exponent"],
            ramp_curve=ramp_curve, nvls_max_busbw_gbps=best_nvls,
            p2p_bandwidth_gbps=374.0 if gpu.name.startswith("H100") else 396.4,
            p2p_latency_s=p2p_latency,
            sources={
                "latency_s": latency_source,
                "max_busbw_gbps": (f"fitted to ring busbw of H100/H200 (nccl-tests#212, nccl#1455, nccl#1281, "
                                   f"[stas-net] H200 16 GiB) ({MD} section 3a)"),
                **{k: f"fitted to {curve_source}; used only outside its sizes"
                   for k in ("half_size_bytes", "ramp_exponent")},
                "ramp_curve": (f"{curve_source}: each point's busbw with the latency taken out, over the best; "
                               "ring collectives take the same shape"),
                "nvls_max_busbw_gbps": f"the best point of {curve_source}, its latency taken out",
                "p2p_bandwidth_gbps": (f"H100 p2pBandwidthLatencyTest 371-377 GB/s (nccl#1264); H200 nvbandwidth "
                                       f"396.4 GB/s ({MD} section 3c)"),
                "p2p_latency_s": "NCCL 2.30.7 Simple protocol: baseLat 8.4 us + NVLink hwLat 3.4 us",
            },
            fits=(fit.record, ring.record))
        net_points, net_note = [47.0, 48.0, 396 / 8], "NDR per-NIC 46-48 GB/s; ~48 per CX7; 2-node H100 ring ~396 GB/s"
        net_source = f"nccl-tests#290 and #319 (46-48 GB/s per NDR NIC; 396 GB/s 2-node ring) ({MD} section 3b)"
    net_fit = fit_achieved_fraction(net_points, [nic_gbps] * len(net_points), note=net_note)
    base = ring_latency_s
    small = rows["a100_32node_small_msg_latency"]["values_us"]
    lat_fit = fit_step_latency([v * 1e-6 for k, v in small.items() if k != "0B"], base, 2 * math.log2(32),
                               note="4-128 B all-reduce on 32 A100 nodes (nccl#652), a tree of 2 log2(32) steps")
    max_busbw = net_fit.params["achieved_fraction"] * nic_gbps
    network = LinkParams(
        latency_s=lat_fit.params["latency_s"], max_busbw_gbps=max_busbw,
        half_size_bytes=nvlink.half_size_bytes, ramp_exponent=nvlink.ramp_exponent, ramp_curve=nvlink.ramp_curve,
        p2p_bandwidth_gbps=max_busbw, p2p_latency_s=net_p2p_latency,
        sources={
            "latency_s": (f"fitted to 62-71 us small-message all-reduce on 32 A100 nodes (nccl#652, {MD} section 3b) as "
                          "the intra-node latency + 2 log2(32) tree steps" +
                          ("" if gpu.architecture == "ampere" else "; no NDR figure was published, the HDR value is used")),
            "max_busbw_gbps": net_source + ", per NIC",
            "half_size_bytes": "not pinned: no inter-node size sweep was published; the NVLink curve's ramp is used",
            "ramp_exponent": "not pinned: no inter-node size sweep was published; the NVLink curve's ramp is used",
            **({"ramp_curve": "not measured: no inter-node size sweep was published; the NVLink curve's ramp is used"}
               if nvlink.ramp_curve else {}),
            "p2p_bandwidth_gbps": "one NIC's large-message bandwidth (max_busbw_gbps): a send uses one rail",
            "p2p_latency_s": "NCCL 2.30.7 Simple protocol: baseLat 8.4 us + NET hwLat 14 us",
        },
        fits=(net_fit.record, lat_fit.record))
    return nvlink, network


def _host() -> HostParams:
    """The host-side constants fitted to the measured A100 sets (``calibration.fit_host_overhead``).

    They describe the training process on the host CPU, not the GPU, so every GPU's profile takes
    the A100 fit; the ranges span the leaner software stacks (fewer, fused ops: Transformer
    Engine, CUDA graphs) down to the microbenchmark source's lower bound.
    """
    fit = json.loads(HOST_FIT.read_text())
    v = fit["parameters"]
    moved = "; ".join(f"{key} {one['before']['mean_abs_error']:.1%} -> {one['after']['mean_abs_error']:.1%} "
                      f"(bias {one['before']['bias']:+.1%} -> {one['after']['bias']:+.1%})"
                      for key, one in fit["sets"].items())
    where = (f"fitted to the {fit['runs']:,} runs of the measured A100 sets together, each set weighing the same "
             f"({', '.join(fit['data_sets'])}), by `{fit['command']}` (mean absolute error without the host block "
             f"-> with it: {moved}; its leave-one-set-out table: calibration/published/host_overhead_loso.json)")
    per_op = (f"{where}; one value for forward and backward ops, which full recompute leaves inseparable; it is per "
              f"op of the layer graph, so it also carries Megatron's views, module calls and extra kernels. "
              f"Range: 5 us, the low end of eager PyTorch's 5-25 us per op ({MD}, host-side cost), up to the fit")
    lean = f"{where}. Range: none of it (CUDA graphs, fused stacks) up to the fit"
    values = {"op_s": v["op_s"], "backward_op_s": v["op_s"], "collective_s": v["collective_s"],
              "pipeline_exchange_s": v["pipeline_exchange_s"], "micro_batch_s": v["micro_batch_s"],
              "iteration_s": v["iteration_s"]}
    ranges = {k: ((min(5e-6, x) if k.endswith("op_s") else 0.0), x) for k, x in values.items()}
    return HostParams(**values, ranges=ranges,
                      sources={k: per_op if k.endswith("op_s") else lean for k in values})


GPUS = {  # GPU spec name -> (NIC line rate GB/s per NIC of its DGX, GEMM tile)
    "A100-SXM4-80GB": (25.0, (256, 128)),
    "A100-SXM4-40GB": (25.0, (256, 128)),
    "H100-SXM5-80GB": (50.0, (128, 256)),
    "H200-SXM-141GB": (50.0, (128, 256)),
    "B200-SXM-180GB": (50.0, (128, 256)),
    "GB200-186GB": (50.0, (128, 256)),
}


def gemm_block(gpu_name: str, tile_choice: bool | None = None) -> GemmParams:
    """The GPU's published bf16 GEMM block, or with ``tile_choice`` set the block with or without the choice of
    tiles (what ``python -m calibration.residuals`` weighs)."""
    gpu = load_gpu(gpu_name)
    return _gemm(gpu, _measured(), GPUS[gpu.name][1], tile_choice)


def build_profile(gpu_name: str, host: bool = True) -> HardwareProfile:
    """The GPU's published profile; ``host=False`` leaves the host block out (what its fit starts from)."""
    gpu = load_gpu(gpu_name)
    nic_gbps, tiles = GPUS[gpu.name]
    rows = _measured()
    if gpu.architecture == "blackwell":  # its own blocks where Blackwell was measured, Hopper's forms elsewhere
        from calibration import published_blackwell
        rows = published_blackwell.rows(gpu, rows)
    gemm = _gemm(gpu, rows, tiles)
    sustained, sustained_source, sustained_range = _sustained_clock_fraction(gpu)
    profile = HardwareProfile(
        schema_version=SCHEMA_VERSION, name=f"{gpu.name.lower()}-published", source="published", gpu=gpu.name,
        gemm=gemm, gemm_fp8=_gemm_fp8(gpu, rows, gemm), elementwise=_elementwise(gpu, rows), attention=_attention(gpu),
        attention_kernels=_attention_kernels(gpu),
        collectives=_links(gpu, rows, nic_gbps), host=_host() if host else None,
        overlap_compute_slowdown=OVERLAP_SLOWDOWN, overlap_source=OVERLAP_SOURCE,
        sustained_clock_fraction=sustained, sustained_clock_source=sustained_source,
        device_speed_spread=0.0, device_speed_spread_source=DEVICE_SPREAD_SOURCE,
        ranges={"overlap_compute_slowdown": OVERLAP_RANGE, "sustained_clock_fraction": sustained_range,
                "device_speed_spread": DEVICE_SPREAD_RANGE},
        notes=f"Fitted to published microbenchmarks ({MD}) by calibration/build_published_profiles.py; the host "
              "block to the measured A100 sets together (python -m calibration.fit_host_overhead), checked with each "
              "left out in turn (calibration/published/host_overhead_loso.json).",
    )
    return published_blackwell.adapt(profile, gpu, rows) if gpu.architecture == "blackwell" else profile


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE / "profiles")
    args = parser.parse_args(argv)
    for name in GPUS:
        profile = build_profile(name)
        path = save_profile(profile, args.out / f"{profile.name}.json")
        fp8 = f", fp8 {profile.gemm_fp8.max_efficiency:.3f}" if profile.gemm_fp8 is not None else ""
        print(f"{path}: gemm max_efficiency={profile.gemm.max_efficiency:.3f}{fp8}, "
              f"elementwise {profile.elementwise.achieved_fraction:.3f}, "
              f"nvlink {profile.collectives.nvlink.max_busbw_gbps:.1f} GB/s, "
              f"network {profile.collectives.network.max_busbw_gbps:.1f} GB/s/NIC")


if __name__ == "__main__":
    main()
