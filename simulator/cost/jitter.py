"""The expected cost of waiting for the slower of two jittery ranks.

A stage that waits for another's output starts at the later of two times: its own readiness and the
input's arrival. Were both fixed, that is their maximum; when each rank's compute varies a little
from step to step, independently of the other's, the expected start is later than the maximum of
the expected times: the waiting stage loses whenever the input comes late and gains nothing when
it comes early. With both times normal, the expected maximum and its variance are Clark's (1961)
moments, which statistical timing analysis propagates through a graph as the engine does through a
schedule: each step adds its own variance, and each wait takes the expected maximum, after which
the stage's variance counts afresh (what both sides varied before lies behind both of them).
"""

from __future__ import annotations

import math
from functools import lru_cache

_SQRT2 = math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


def clark_max(mean_a: float, var_a: float, mean_b: float, var_b: float) -> tuple[float, float]:
    """Mean and variance of max(A, B) for independent normal A and B (Clark 1961); the plain maximum,
    variance carried, where neither varies."""
    theta2 = var_a + var_b
    if theta2 <= 0.0:
        return (mean_a, var_a) if mean_a >= mean_b else (mean_b, var_b)
    theta = math.sqrt(theta2)
    alpha = (mean_a - mean_b) / theta
    p = 0.5 * (1.0 + math.erf(alpha / _SQRT2))
    q = 1.0 - p
    density = _INV_SQRT_2PI * math.exp(-0.5 * alpha * alpha)
    mean = mean_a * p + mean_b * q + theta * density
    second = (mean_a * mean_a + var_a) * p + (mean_b * mean_b + var_b) * q + (mean_a + mean_b) * theta * density
    return max(mean, mean_a, mean_b), max(second - mean * mean, 0.0)


@lru_cache(maxsize=None)
def expected_max_of_normals(n: int) -> float:
    """E[max of n independent standard normals] (0 for one; 1/sqrt(pi) for two; about 1.54 for ten),
    by quadrature of the maximum's density n phi(x) Phi(x)^(n-1)."""
    if n <= 1:
        return 0.0
    step, total = 1e-3, 0.0
    for i in range(-9000, 9001):
        x = i * step
        phi = _INV_SQRT_2PI * math.exp(-0.5 * x * x)
        total += x * n * phi * (0.5 * (1.0 + math.erf(x / _SQRT2))) ** (n - 1)
    return total * step
