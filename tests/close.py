"""Compare nested data whose floats come out of a fit or a BLAS reduction: equal structure, floats
within a relative tolerance (another machine's BLAS or scipy moves the last bits, not the physics)."""

from __future__ import annotations

import math

from pydantic import BaseModel

REL = 1e-9
ABS = 1e-12  # for values that are zero up to rounding
# A fit's residuals are already relative errors (predicted / measured - 1), often near zero, where a relative
# tolerance means nothing: two refits agree on them to about 1e-8 of the measurement, not to 1e-9 of the
# residual.
RESIDUAL_ABS = 1e-6


def differences(a, b, rel: float = REL, path: str = "") -> list[str]:
    """Where ``a`` and ``b`` differ beyond the tolerance (empty when they agree)."""
    if isinstance(a, BaseModel) and isinstance(b, BaseModel):
        a, b = a.model_dump(), b.model_dump()
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            return [f"{path}: keys {sorted(a.keys() ^ b.keys())} differ"]
        return [d for k in a for d in differences(a[k], b[k], rel, f"{path}.{k}")]
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            return [f"{path}: {len(a)} vs {len(b)} items"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, rel, f"{path}[{i}]")]
    if isinstance(a, float) or isinstance(b, float):
        tolerance = RESIDUAL_ABS if ".residuals[" in path else ABS
        if isinstance(a, (int, float)) and isinstance(b, (int, float)) and math.isclose(a, b, rel_tol=rel,
                                                                                       abs_tol=tolerance):
            return []
        return [f"{path}: {a!r} vs {b!r}"]
    return [] if a == b else [f"{path}: {a!r} vs {b!r}"]


def assert_close(a, b, rel: float = REL, hint: str = "") -> None:
    diff = differences(a, b, rel)
    assert not diff, f"{len(diff)} values differ{' (' + hint + ')' if hint else ''}: " + "; ".join(diff[:5])
