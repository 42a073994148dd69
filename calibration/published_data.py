"""What the published profiles are fitted to: where the microbenchmark numbers live, the constants of NCCL's
latency model and of a kernel launch that several blocks share, and each GPU's NIC rate and GEMM tile.

``calibration.build_published_profiles`` assembles a profile from the blocks fitted in its own module,
``calibration.published_attention`` and ``calibration.published_links``; each of them reads its numbers here.
"""

from __future__ import annotations

import json
from pathlib import Path

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

GPUS = {  # GPU spec name -> (NIC line rate GB/s per NIC of its DGX, GEMM tile)
    "A100-SXM4-80GB": (25.0, (256, 128)),
    "A100-SXM4-40GB": (25.0, (256, 128)),
    "H100-SXM5-80GB": (50.0, (128, 256)),
    "H200-SXM-141GB": (50.0, (128, 256)),
    "B200-SXM-180GB": (50.0, (128, 256)),
    "GB200-186GB": (50.0, (128, 256)),
}


def measured_rows() -> dict[str, dict]:
    """The microbenchmark rows of ``hardware.json`` by id (an id measured on several GPUs: ``id#hardware``)."""
    data = json.loads(PUBLISHED.read_text())
    out: dict[str, dict] = {}
    for row in data["measured"]:
        key = row["id"] if row["id"] not in out else f"{row['id']}#{row['hardware']}"
        out[key] = row
    return out

