"""The Blackwell blocks of the published profiles (B200, GB200), for ``calibration.build_published_profiles``.

No measured training run on Blackwell is in this repository, so a plan on these GPUs lies outside every measured
regime and its band is widened by the declared rule (``simulator.estimator.regime.OUTSIDE_WIDENING``). What was
published at microbenchmark level ({md} sections 3a, 3d, 3e):

- GEMM: MAMF on B200 SXM, bf16 1,745 of 2,250 TFLOPS and fp8 3,432.5 of 4,500, each the best of a brute-force
  search over shapes [stas-acc]; the shape terms are Hopper's (no Blackwell shape sweep), scaled as for H200.
- NVLink: 8 B200 all-reducing 32 KiB-16 GiB (all_reduce_bench, NVLS from a few MiB) and the ring at 8 GiB,
  682.2 GB/s [stas-net].
- Attention: FlashAttention 4 on B200 against FlashAttention 3 on H200, 1.88x forward+backward at 8K tokens and
  1.95x at 32K [stas-perf].
- Memory-bound kernels: nothing published on Blackwell; the H100's fraction of HBM peak.
- The network: the same ConnectX-7 NDR NICs as Hopper's DGX; the one Blackwell inter-node sweep (4 AWS B200 nodes
  over EFA, about 36.5 GB/s per 400 Gb/s NIC [stas-net]) is the range's slow end.

The GB200 of an NVL72 rack has no microbenchmark of its own: it takes the B200's fractions of peak at its own
(11% higher) peaks, each range reaching down to the B200's absolute throughput.
"""

from __future__ import annotations

from calibration.published_attention import SIZE_TERMS, causal_ranges, hopper_attention_fit
from calibration.published_data import (
    LAUNCH_RANGE,
    LAUNCH_SOURCE,
    MD,
    NCCL_NVLINK_LL_STEP_US,
    NCCL_NVLINK_SIMPLE_US,
    NCCL_RING_LL_BASE_US,
    NCCL_SIMPLE_BASE_US,
)
from simulator.cost.profile import AttentionParams, HardwareProfile, LinkParams
from simulator.measure.fitting import fit_achieved_fraction, fit_collective, measured_ramp
from simulator.spec.hardware import GpuSpec, load_gpu

B200 = "B200-SXM-180GB"
GB200 = "GB200-186GB"
H200 = "H200-SXM-141GB"
FA4_SPEEDUP = (1.88, 1.95)  # FA4 on B200 over FA3 on H200, forward+backward, 8K and 32K tokens [stas-perf]
# A new memory system's streaming kernels reached 87% (A100 memcopy) to 90% (H100 QuACK) of HBM peak on the two
# generations measured; five points either side of that span
ELEMENTWISE_RANGE = (0.80, 0.95)
EFA_PER_NIC_GBPS = 36.5  # 4 AWS p6-b200 nodes, all_reduce_bench at 16 GiB, per 400 Gb/s EFA NIC [stas-net]

__doc__ = __doc__.format(md=MD)


def _peak_ratio(gpu: GpuSpec) -> float:
    """This GPU's bf16 peak over the B200's: how much faster it runs at the same fraction of peak."""
    return gpu.peak_tflops.bf16 / load_gpu(B200).peak_tflops.bf16


def rows(gpu: GpuSpec, measured: dict) -> dict:
    """The measured rows, with the GB200's MAMF rows stated as the B200's fraction of peak at the GB200's peak."""
    if gpu.name != GB200:
        return measured
    out = dict(measured)
    for dtype, peak in (("bf16", gpu.peak_tflops.bf16), ("fp8_e4m3", gpu.peak_tflops.fp8)):
        row = measured[f"mamf_b200_{dtype}"]
        out[f"mamf_gb200_{dtype}"] = {
            **row, "value": row["value"] / row["theoretical"] * peak, "theoretical": peak,
            "hardware": f"{row['hardware']}, its {row['efficiency_pct']}% of peak taken at the GB200's {peak:g} "
                        "TFLOPS (no GB200 MAMF was published)"}
    return out


def adapt(profile: HardwareProfile, gpu: GpuSpec, measured: dict) -> HardwareProfile:
    """The profile ``build_published_profiles`` made with Hopper's forms, given Blackwell's own blocks: NVLink and
    attention from Blackwell's measurements, the sources of what Hopper's data still sets, and the ranges."""
    slow = 1 / _peak_ratio(gpu)  # the B200's absolute throughput, as a fraction of this GPU's peak (1 on B200)
    gemm = profile.gemm.model_copy(update={
        "sources": {**profile.gemm.sources,
                    "misaligned_factor": (f"fitted to the H100 d_ff 10922 vs 10944/10848/11008 bmm timings ({MD} "
                                          "section 3d, [stas-perf]); not measured on Blackwell: the H100 value"),
                    "alignment_bytes": ("the H100 fit's 64 bytes (d_ff=10848 runs at full speed); not measured on "
                                        "Blackwell")},
        "ranges": {**profile.gemm.ranges, **({"max_efficiency": (profile.gemm.max_efficiency * slow,
                                                                 profile.gemm.max_efficiency)} if slow < 1 else {})}})
    gemm_fp8 = profile.gemm_fp8
    if gemm_fp8 is not None and slow < 1:
        gemm_fp8 = gemm_fp8.model_copy(update={"ranges": {
            **gemm_fp8.ranges, "max_efficiency": (gemm_fp8.max_efficiency * slow, gemm_fp8.max_efficiency)}})
    elementwise = profile.elementwise.model_copy(update={
        "sources": {**profile.elementwise.sources, "achieved_fraction": (
            f"fitted to QuACK RMSNorm/softmax/cross-entropy on H100 80GB, ~3 TB/s (~90% of 3.35) and 3.01 TB/s fp32 "
            f"softmax ({MD} section 3f); no memory-bound kernel was published on Blackwell, so the H100 fraction of "
            f"HBM peak is taken; range {ELEMENTWISE_RANGE[0]:.2f}-{ELEMENTWISE_RANGE[1]:.2f}: the A100's (87%) and "
            "H100's (90%) measured fractions, five points either side")},
        "ranges": {**profile.elementwise.ranges, "achieved_fraction": ELEMENTWISE_RANGE}})
    collectives = profile.collectives.model_copy(update={
        "nvlink": _nvlink(gpu, measured),
        "network": _network(profile.collectives.network)})
    name = "the B200's" if gpu.name == B200 else "the B200's, at the GB200's peaks"
    return profile.model_copy(update={
        "gemm": gemm, "gemm_fp8": gemm_fp8, "elementwise": elementwise, "attention": _attention(gpu),
        "collectives": collectives,
        "notes": (f"{profile.notes} Blackwell: GEMM, NVLink and attention from {name} published microbenchmarks "
                  f"(calibration/published_blackwell.py); no measured training run on Blackwell, so every plan lies "
                  f"outside the measured regimes and its band is widened by the declared rule.")})


# FA3's shape terms, which Blackwell's kernel takes as they are (FA4 was timed against FA3 on one shape)
SHAPE_TERMS = SIZE_TERMS + ("causal_efficiency", "causal_seq_half")


def _attention(gpu: GpuSpec) -> AttentionParams:
    """FA3's efficiencies on Hopper (H200's tensor peak is H100's), times FA4's speedup on B200 at the B200's
    peak: the same fraction of peak on GB200. Every backend runs it: no other kernel was measured on Blackwell."""
    h200 = load_gpu(H200)
    fa3 = hopper_attention_fit("fa3")
    f3 = fa3.params
    b200_peak = load_gpu(B200).peak_tflops.bf16
    low, high = (s * h200.peak_tflops.bf16 / b200_peak for s in FA4_SPEEDUP)
    slow = 1 / _peak_ratio(gpu)
    fwd, bwd = f3["forward_efficiency"] * low, f3["backward_efficiency"] * low
    measured = (f"FA4 on B200 runs forward+backward {FA4_SPEEDUP[0]}x (8K tokens) to {FA4_SPEEDUP[1]}x (32K) as fast "
                f"as FA3 on H200 on an 8B causal shape ({MD} section 3e, [stas-perf])")
    where = "" if slow == 1 else "; the B200's fraction of peak, not measured on GB200 (range down to its throughput)"
    return AttentionParams(
        forward_efficiency=fwd, backward_efficiency=bwd, launch_overhead_s=f3["launch_overhead_s"],
        **{k: f3[k] for k in SHAPE_TERMS},
        ranges={"launch_overhead_s": LAUNCH_RANGE, **{k: (0.0, 2 * f3[k]) for k in SIZE_TERMS},
                **causal_ranges(f3),
                "forward_efficiency": (fwd * slow, f3["forward_efficiency"] * high),
                "backward_efficiency": (bwd * slow, f3["backward_efficiency"] * high)},
        sources={
            "forward_efficiency": (f"FA3's forward efficiency on Hopper without the mask ({f3['forward_efficiency']:.3f} of "
                                   f"{h200.peak_tflops.bf16:g} TFLOPS, FA3 paper Fig. 5, head dim 128) x "
                                   f"{FA4_SPEEDUP[0]} x {h200.peak_tflops.bf16:g} / {b200_peak:g}: {measured}; range "
                                   f"up to the {FA4_SPEEDUP[1]}x{where}"),
            "backward_efficiency": (f"FA3's backward efficiency on Hopper ({f3['backward_efficiency']:.3f}, FA3 paper "
                                    f"Fig. 6) scaled as the forward: {measured}; range up to the "
                                    f"{FA4_SPEEDUP[1]}x{where}"),
            **{k: f"not pinned on Blackwell: FA3's on Hopper (FA3 paper Figs. 5-6); range up to twice it"
               for k in SHAPE_TERMS if k != "causal_efficiency"},
            "causal_efficiency": ("not pinned on Blackwell: FA3's on Hopper (FA3 paper Fig. 5), the causal backward "
                                  "taken to lose as the forward; range up to no loss beyond the skipped half"),
            "launch_overhead_s": LAUNCH_SOURCE,
        },
        fits=(fa3.record,))


def _nvlink(gpu: GpuSpec, measured: dict) -> LinkParams:
    """NVLink 5 from the 8x B200 all-reduce sweep and its ring at 8 GiB; a GB200's NVLink is the same link."""
    ring_latency_s = (NCCL_RING_LL_BASE_US + 2 * 7 * NCCL_NVLINK_LL_STEP_US) * 1e-6
    sweep = [(s, one_node) for s, one_node, _ in measured["b200_4node_allreduce_curve"]["curve"]]
    values = measured["b200_8gpu_allreduce"]["values"]
    fit = fit_collective(sweep, 8, metric="busbw_gbps", latency_s=ring_latency_s,
                         note="all_reduce_bench, 8x B200 (one node of the 4-node sweep), 32 KiB-16 GiB [stas-net]")
    best_nvls, ramp_curve = measured_ramp([(s, 1.75 * s / (b * 1e9)) for s, b in sweep], 8, latency_s=ring_latency_s)
    p2p = fit_achieved_fraction([374.0, 396.4], [450, 450], note="H100/H200 NVLink p2p over 450 GB/s")
    line = gpu.nvlink_bandwidth_gbps_per_direction
    sweep_source = (f"the 8x B200 all-reduce sweep, 32 KiB-16 GiB, NVLS at large sizes ({MD} section 3a, "
                    "[stas-net]: the single-node column of its 4-node comparison)")
    same = "" if gpu.name == B200 else "; not measured on GB200: its NVLink 5 is the B200's link, 900 GB/s a direction"
    return LinkParams(
        latency_s=ring_latency_s, max_busbw_gbps=values["8GiB_RING"],
        half_size_bytes=fit.params["half_size_bytes"], ramp_exponent=fit.params["ramp_exponent"],
        ramp_curve=ramp_curve, nvls_max_busbw_gbps=max(best_nvls, values["8GiB_NVLS"]),
        p2p_bandwidth_gbps=p2p.params["achieved_fraction"] * line,
        p2p_latency_s=(NCCL_SIMPLE_BASE_US + NCCL_NVLINK_SIMPLE_US) * 1e-6,
        ranges={"p2p_bandwidth_gbps": (371 / 450 * line, 396.4 / 450 * line)},
        sources={
            "latency_s": ("NCCL 2.30.7's latency model for an 8-GPU LL ring: baseLat 6.6 us + 14 steps x 0.6 us "
                          f"NVLink hwLat ({MD} section 2)"),
            "max_busbw_gbps": f"8x B200 ring all-reduce (NVLS off) at 8 GiB: {values['8GiB_RING']} GB/s busbw ({MD} "
                              f"section 3a, [stas-net]){same}",
            **{k: f"fitted to {sweep_source}; used only outside its sizes{same}"
               for k in ("half_size_bytes", "ramp_exponent")},
            "ramp_curve": (f"{sweep_source}: each point's busbw with the latency taken out, over the best; ring "
                           f"collectives take the same shape{same}"),
            "nvls_max_busbw_gbps": (f"the best of {sweep_source}, its latency taken out, and the 8 GiB NVLS point "
                                    f"({values['8GiB_NVLS']} GB/s){same}"),
            "p2p_bandwidth_gbps": ("no Blackwell p2p figure was published: the fraction of line rate measured on H100 "
                                   f"(371-377 of 450) and H200 (396.4 of 450) ({MD} section 3c), x {line:g} GB/s"),
            "p2p_latency_s": "NCCL 2.30.7 Simple protocol: baseLat 8.4 us + NVLink hwLat 3.4 us",
        },
        fits=(fit.record, p2p.record))


def _network(network: LinkParams) -> LinkParams:
    """Hopper's NDR network block (the same ConnectX-7 NICs), its bandwidth's range reaching the EFA sweep."""
    value = network.max_busbw_gbps
    return network.model_copy(update={
        "ranges": {**network.ranges, "max_busbw_gbps": (min(EFA_PER_NIC_GBPS, value), value)},
        "sources": {**network.sources, "max_busbw_gbps": (
            f"{network.sources['max_busbw_gbps']}: the same ConnectX-7 NDR NICs as a DGX H100's. Range down to "
            f"{EFA_PER_NIC_GBPS} GB/s per 400 Gb/s NIC, what 4 AWS B200 nodes all-reducing 16 GiB over EFA reached "
            f"({MD} section 3b, [stas-net]), the one inter-node sweep published on Blackwell")}})
