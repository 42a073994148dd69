"""Build the published hardware profiles (``calibration/profiles/*-published.json``) by fitting the
cost-model forms to microbenchmark numbers read from ``calibration/published/hardware.json``.

    python -m calibration.build_published_profiles [--out DIR]

Only microbenchmark-level data is used (GEMM, memory-bound kernels, FlashAttention, NCCL), except
for the host block: no microbenchmark pins the CPU time Megatron spends per op, so those constants
come from the measured A100 sets (``python -m calibration.fit_host_overhead``, which
records each set's errors before and after, and checks the fit with each set left out in turn)
and the profile says so. Beyond that block, the measured end-to-end runs (Korthikanti et al.'s
tables, the vTrain sets) set nothing here: they are what the simulator is checked against. Where the published
data does not pin a parameter, its ``sources`` entry says so and argues the value chosen.

The GEMM, memory-bound, sustained-clock and host blocks are fitted here; attention in
``calibration.published_attention``, NVLink and the network in ``calibration.published_links``, Blackwell's own
blocks in ``calibration.published_blackwell``, all from the numbers ``calibration.published_data`` reads.
"""

from __future__ import annotations

import argparse
import csv
import functools
import json
import statistics
from pathlib import Path
from types import SimpleNamespace

import numpy as np
from scipy.optimize import least_squares

from calibration import published_blackwell
from calibration.published_attention import attention_block, attention_kernels
from calibration.published_data import (
    GPUS,
    HERE,
    HOST_FIT,
    LAUNCH_OVERHEAD_S,
    LAUNCH_RANGE,
    LAUNCH_SOURCE,
    MD,
    measured_rows,
)
from calibration.published_links import links_block
from simulator.cost.gemm import gemm_efficiency, gemm_time_s
from simulator.cost.profile import (
    SCHEMA_VERSION,
    ElementwiseParams,
    FitRecord,
    GemmParams,
    HardwareProfile,
    HostParams,
    save_profile,
)
from simulator.measure.fitting import fit_achieved_fraction, fit_gemm
from simulator.spec.hardware import GpuSpec, load_gpu


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


def _a100_sustained_ratio() -> tuple[float, float]:
    """(sustained / burst, burst TFLOPS): the A100's sustained 8192^3 GEMM over what its GEMM block (MAMF's fastest
    iteration, a burst) gives that shape."""
    a100 = load_gpu(SUSTAINED_GEMM_GPU)
    gemm = _gemm(a100, measured_rows(), GPUS[a100.name][1])
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


def gemm_block(gpu_name: str, tile_choice: bool | None = None) -> GemmParams:
    """The GPU's published bf16 GEMM block, or with ``tile_choice`` set the block with or without the choice of
    tiles (what ``python -m calibration.residuals`` weighs)."""
    gpu = load_gpu(gpu_name)
    return _gemm(gpu, measured_rows(), GPUS[gpu.name][1], tile_choice)


def build_profile(gpu_name: str, host: bool = True) -> HardwareProfile:
    """The GPU's published profile; ``host=False`` leaves the host block out (what its fit starts from)."""
    gpu = load_gpu(gpu_name)
    nic_gbps, tiles = GPUS[gpu.name]
    rows = measured_rows()
    if gpu.architecture == "blackwell":  # its own blocks where Blackwell was measured, Hopper's forms elsewhere
        rows = published_blackwell.rows(gpu, rows)
    gemm = _gemm(gpu, rows, tiles)
    sustained, sustained_source, sustained_range = _sustained_clock_fraction(gpu)
    profile = HardwareProfile(
        schema_version=SCHEMA_VERSION, name=f"{gpu.name.lower()}-published", source="published", gpu=gpu.name,
        gemm=gemm, gemm_fp8=_gemm_fp8(gpu, rows, gemm), elementwise=_elementwise(gpu, rows), attention=attention_block(gpu),
        attention_kernels=attention_kernels(gpu),
        collectives=links_block(gpu, rows, nic_gbps), host=_host() if host else None,
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
