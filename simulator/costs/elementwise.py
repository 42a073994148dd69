"""Memory-bound kernels (norms, dropout, activations, softmax, optimizer): HBM traffic over achieved bandwidth."""

from __future__ import annotations

import numpy as np

from simulator.profile import ElementwiseParams


def elementwise_time_s(p: ElementwiseParams, hbm_bandwidth_gbps: float, nbytes, kernel: str = ""):
    return p.launch_overhead_s + np.asarray(nbytes, dtype=float) / (hbm_bandwidth_gbps * 1e9 * p.fraction(kernel))
