"""Memory-bound kernels (norms, dropout, activations, softmax, optimizer): HBM traffic over achieved bandwidth."""

from __future__ import annotations

import numpy as np

from simulator.cost.curves import interpolate_log_log_array
from simulator.cost.profile import ElementwiseParams


def elementwise_time_s(p: ElementwiseParams, hbm_bandwidth_gbps: float, nbytes, kernel: str = ""):
    """launch + bytes / (HBM bandwidth x the class's fraction): the fraction measured at this size where the
    class has a measured sweep (``kernel_curves``), else its single fitted value."""
    nbytes = np.asarray(nbytes, dtype=float)
    curve = p.curve(kernel)
    fraction = interpolate_log_log_array(curve, nbytes) if curve else p.fraction(kernel)
    return p.launch_overhead_s + nbytes / (hbm_bandwidth_gbps * 1e9 * fraction)
