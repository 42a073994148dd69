"""Measured size sweeps used as measured: interpolation between their points."""

from __future__ import annotations

import bisect
import math

import numpy as np


def interpolate_log_log(curve: tuple[tuple[float, float], ...], x: float) -> float:
    """y at ``x`` on a curve of (x, y) points with x increasing: straight between points on log-log
    axes (bandwidth curves are close to that between sizes a factor 2 apart), held at the end
    points outside them."""
    if x <= curve[0][0]:
        return curve[0][1]
    if x >= curve[-1][0]:
        return curve[-1][1]
    i = bisect.bisect_left(curve, x, key=lambda point: point[0])
    if curve[i][0] == x:
        return curve[i][1]
    (x0, y0), (x1, y1) = curve[i - 1], curve[i]
    w = math.log(x / x0) / math.log(x1 / x0)
    return math.exp((1 - w) * math.log(y0) + w * math.log(y1))


def interpolate_log_log_array(curve: tuple[tuple[float, float], ...], x) -> np.ndarray:
    """``interpolate_log_log`` at every element of ``x``."""
    xs, ys = np.log([c[0] for c in curve]), np.log([c[1] for c in curve])
    return np.exp(np.interp(np.log(np.maximum(np.asarray(x, dtype=float), 1.0)), xs, ys))
