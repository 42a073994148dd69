"""GEMM time: a roofline on the tensor peak, shaped by wave quantisation, reduction length and alignment.

cuBLAS splits C[m, n] into tile_m x tile_n output tiles, one thread block each; the SMs run
them in waves, so a GEMM whose tile count is just past a multiple of the SM count leaves most
SMs idle in its last wave. Each tile pays a fixed prologue/epilogue (pipeline fill, writing C)
that a long reduction dimension k amortises: hence k / (k + k_half). Tensor cores need every
dimension to be a multiple of ``alignment_bytes`` (128 bytes on A100, Anthony et al. 2024);
otherwise cuBLAS falls back to slower kernels.

cuBLAS does not run one tile for every shape: its heuristics pick among kernels, and a shape whose
output has fewer large tiles than SMs runs smaller ones. A profile that lists ``tile_choices``
gives each GEMM the fastest of them, each paying for the tiles it pads (tile quantisation), the
waves it leaves part-empty, and, below ``full_rate_intensity_elements``, the operand traffic a
small tile needs per flop.
"""

from __future__ import annotations

import numpy as np

from simulator.cost.profile import GemmParams


def wave_efficiency(m, n, batch, tile_m: int, tile_n: int, sm_count: int):
    """Fraction of SM-slots busy over the waves of thread blocks (works on numpy arrays)."""
    tiles = np.ceil(np.asarray(m) / tile_m) * np.ceil(np.asarray(n) / tile_n) * np.asarray(batch)
    return tiles / (np.ceil(tiles / sm_count) * sm_count)


def _tile_efficiency(m, n, batch, tile_m: int, tile_n: int, sm_count: int, full_rate_intensity: float | None):
    """Useful share of the SM-time one tile shape spends on a GEMM: its padded tiles over whole waves, times the
    main loop's rate, which falls below full where the tile reuses each operand too few times."""
    m, n, batch = np.asarray(m, dtype=float), np.asarray(n, dtype=float), np.asarray(batch, dtype=float)
    tiles = np.ceil(m / tile_m) * np.ceil(n / tile_n) * batch
    fill = m * n * batch / (np.ceil(tiles / sm_count) * sm_count * tile_m * tile_n)
    intensity = tile_m * tile_n / (tile_m + tile_n)
    reuse = 1.0 if not full_rate_intensity else min(1.0, intensity / full_rate_intensity)
    return fill * reuse


def is_misaligned(m, n, k, dtype_bytes: int, alignment_bytes: int):
    """True where any of m, n, k times the element size is not a multiple of the alignment."""
    return ((np.asarray(m) * dtype_bytes) % alignment_bytes != 0) | (
        (np.asarray(n) * dtype_bytes) % alignment_bytes != 0) | ((np.asarray(k) * dtype_bytes) % alignment_bytes != 0)


def gemm_efficiency(p: GemmParams, sm_count: int, m, n, k, batch=1, dtype_bytes: int = 2, accumulate_bytes: int = 0,
                    output_dtype_bytes: int | None = None):
    """Fraction of the dense tensor peak the GEMM reaches (never above ``max_efficiency`` or the ceiling).

    ``dtype_bytes`` is the input element size (alignment); ``output_dtype_bytes`` that of C when it
    differs (FP8 GEMMs write bf16), which sets the epilogue's traffic.
    """
    k = np.asarray(k, dtype=float)
    # k_half is fitted for an epilogue that writes C once in the output dtype; C += A @ B into a
    # buffer of ``accumulate_bytes`` elements (Megatron's gradient-accumulation fusion into
    # main_grad) reads and writes it, so the epilogue moves 2 accumulate_bytes / out_bytes times
    # as much and needs that much more k to amortise.
    out_bytes = output_dtype_bytes if output_dtype_bytes is not None else dtype_bytes
    k_half = p.k_half * (2 * accumulate_bytes / out_bytes if accumulate_bytes else 1.0)
    if p.tile_choices is None:
        shape = wave_efficiency(m, n, batch, p.tile_m, p.tile_n, sm_count)
    else:
        shape = np.maximum.reduce([_tile_efficiency(m, n, batch, tm, tn, sm_count, p.full_rate_intensity_elements)
                                   for tm, tn in p.tile_choices])
    eff = p.max_efficiency * shape * k / (k + k_half)
    if p.ceiling_efficiency is not None:
        # The formula's terms are fitted at a few shapes; no shape may beat the best one a
        # brute-force search over shapes found on the real device.
        eff = np.minimum(eff, p.ceiling_efficiency)
    return np.where(is_misaligned(m, n, k.astype(np.int64), dtype_bytes, p.alignment_bytes),
                    eff * p.misaligned_factor, eff)


def gemm_time_s(p: GemmParams, peak_flops: float, sm_count: int, m, n, k, batch=1, dtype_bytes: int = 2,
                accumulate_bytes: int = 0, output_dtype_bytes: int | None = None):
    flops = 2.0 * np.asarray(m, dtype=float) * np.asarray(n) * np.asarray(k) * np.asarray(batch)
    eff = gemm_efficiency(p, sm_count, m, n, k, batch, dtype_bytes, accumulate_bytes, output_dtype_bytes)
    return p.launch_overhead_s + flops / (peak_flops * eff)
