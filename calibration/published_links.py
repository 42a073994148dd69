"""The collective blocks of the published profiles: NVLink from each GPU's measured all-reduce curve (and the
2-8 GPU A100 tables the development sets' machines measured), the network from its NICs' measured bandwidth,
the small-message latency of 32 A100 nodes and the one published inter-node size sweep (``simulator.cost.
collectives`` reads them).
"""

from __future__ import annotations

import csv
import math
import statistics
from pathlib import Path
from types import SimpleNamespace

from scipy.optimize import brentq

from calibration.published_data import (
    GPUS,
    MD,
    NCCL_NET_SIMPLE_US,
    NCCL_NVLINK_LL_STEP_US,
    NCCL_NVLINK_SIMPLE_US,
    NCCL_RING_LL_BASE_US,
    NCCL_SIMPLE_BASE_US,
    VTRAIN_NCCL,
)
from simulator.cost.collectives import CollectiveModel, Group
from simulator.cost.profile import CollectiveParams, FitRecord, LinkParams
from simulator.graph.layers import CollectiveKind
from simulator.measure.fitting import fit_achieved_fraction, fit_collective, fit_step_latency, measured_ramp
from simulator.spec.hardware import GpuSpec, load_cluster, load_gpu

PARTIAL_NODE_RANGE = (0.5, 1.0)
PARTIAL_NODE_SOURCE = (
    "not measured on these nodes: 1, the routed rings' bandwidth. Range down to 0.5: nccl-tests all-reduce on 4 "
    "nodes gave about 45 GB/s bus bandwidth with 4 GPUs a node against about 90 with 8 (NVIDIA/nccl#1168, 256 MB), "
    "and on 2 A100 nodes 4 GPUs over 2 NICs gave 45 against 78 over 4 (NVIDIA/nccl-tests#277); NCCL before 2.18 "
    "could pick a NIC far from a partial node's GPUs (NVIDIA/nccl#820). nccl-tests all_reduce_perf on 2+ nodes with "
    "CUDA_VISIBLE_DEVICES=0,2,4,6 and 0,4, sibling groups at once, would pin it")


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


def links_block(gpu: GpuSpec, rows: dict, nic_gbps: float) -> CollectiveParams:
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

