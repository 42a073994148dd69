"""Fitting the cost-model forms of ``simulator.cost`` to raw timing points (scipy least squares).

Every fit minimises relative errors, (model - data) / data, so a 10 us kernel counts as much as a
10 ms one, and returns the parameters with those residuals and a ``FitRecord`` of the raw points
to keep in the profile. Parameters the points cannot pin go in ``fixed``; the profile's
``sources`` must then say where their values come from. Discrete parameters (GEMM tile sizes,
alignment) are chosen by trying each candidate and keeping the best continuous fit.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np
from scipy.optimize import least_squares

from simulator.cost.attention import attention_forward_flops, attention_time_s
from simulator.cost.elementwise import elementwise_time_s
from simulator.cost.gemm import gemm_time_s
from simulator.cost.profile import AttentionParams, ElementwiseParams, FitRecord, GemmParams
from simulator.spec.errors import ProfileError

DTYPE_BYTES = {"fp8": 1, "bf16": 2, "fp16": 2, "tf32": 4, "fp32": 4}


@dataclass(frozen=True)
class Fit:
    """Fitted parameters, the relative residual per point, and the record to store in a profile."""

    params: dict[str, float]
    residuals: tuple[float, ...]
    record: FitRecord

    @property
    def max_abs_residual(self) -> float:
        return max((abs(r) for r in self.residuals), default=0.0)

    @property
    def rms_residual(self) -> float:
        return float(np.sqrt(np.mean(np.square(self.residuals)))) if self.residuals else 0.0


def _dtype_bytes(dtype) -> int:
    if isinstance(dtype, (int, np.integer)):
        return int(dtype)
    try:
        return DTYPE_BYTES[str(dtype).lower()]
    except KeyError:
        raise ProfileError(f"unknown dtype {dtype!r} in fit points; use one of {', '.join(DTYPE_BYTES)}") from None


def _least_squares(residual_fn, names: list[str], start: dict, lower: dict, upper: dict):
    x0 = np.array([start[n] for n in names], dtype=float)
    scale = np.where(x0 != 0, np.abs(x0), 1.0)  # fit in units of the starting values: seconds and FLOPs mix
    lo = np.array([lower[n] for n in names]) / scale
    hi = np.array([upper[n] for n in names]) / scale
    res = least_squares(lambda z: residual_fn(dict(zip(names, z * scale))), np.clip(x0 / scale, lo, hi),
                        bounds=(lo, hi), x_scale="jac", method="trf",
                        xtol=1e-13, ftol=1e-13, gtol=1e-13)  # converged to rounding: refits agree across BLAS builds
    return dict(zip(names, res.x * scale)), float(np.sum(res.fun**2))


def _check_points(points: Sequence, width: int, what: str) -> np.ndarray:
    if len(points) == 0:
        raise ProfileError(f"no {what} points to fit; measure at least one")
    if any(len(p) != width for p in points):
        raise ProfileError(f"each {what} point needs {width} values; got {[len(p) for p in points][:5]}")
    return np.asarray(points, dtype=object)


# --- GEMM -------------------------------------------------------------------------------------

GEMM_BOUNDS = {
    "max_efficiency": (0.05, 1.0),
    "k_half": (0.0, 8192.0),
    "misaligned_factor": (0.05, 1.0),
    "launch_overhead_s": (0.0, 1e-3),
}
GEMM_START = {"max_efficiency": 0.8, "k_half": 64.0, "misaligned_factor": 0.7, "launch_overhead_s": 2e-6}


def fit_gemm(points: Sequence[Sequence], peak_flops: float, sm_count: int, *, fixed: dict | None = None,
             tile_candidates: Iterable[int] = (64, 128, 256), alignment_candidates: Iterable[int] = (16, 32, 64, 128),
             note: str = "") -> Fit:
    """Fit ``GemmParams`` to points (m, n, k, batch, dtype, time_s); dtype is a name or bytes per element."""
    raw = _check_points(points, 6, "GEMM")
    m, n, k, batch = (raw[:, i].astype(float) for i in range(4))
    dtype_bytes = [_dtype_bytes(d) for d in raw[:, 4]]
    if len(set(dtype_bytes)) != 1:
        raise ProfileError("GEMM points mix data types; fit each data type separately")
    db = dtype_bytes[0]
    t = raw[:, 5].astype(float)
    fixed = dict(fixed or {})
    free = [p for p in GEMM_START if p not in fixed]
    tiles_m = [fixed["tile_m"]] if "tile_m" in fixed else list(tile_candidates)
    tiles_n = [fixed["tile_n"]] if "tile_n" in fixed else list(tile_candidates)
    aligns = [fixed["alignment_bytes"]] if "alignment_bytes" in fixed else sorted(alignment_candidates, reverse=True)
    lower = {p: b[0] for p, b in GEMM_BOUNDS.items()}
    upper = {p: b[1] for p, b in GEMM_BOUNDS.items()}
    best = None
    for tm, tn, al in itertools.product(tiles_m, tiles_n, aligns):
        def residuals(x, tm=tm, tn=tn, al=al):
            p = GemmParams.model_construct(**{**GEMM_START, **fixed, **x, "tile_m": tm, "tile_n": tn,
                                              "alignment_bytes": al})
            return gemm_time_s(p, peak_flops, sm_count, m, n, k, batch, db) / t - 1.0

        if free:
            x, cost = _least_squares(residuals, free, GEMM_START, lower, upper)
        else:
            x, cost = {}, float(np.sum(residuals({}) ** 2))
        # ties (several alignments explain the data) go to the first candidate: the largest alignment
        if best is None or cost < best[0] * (1 - 1e-9) - 1e-15:
            best = (cost, {**fixed, **x, "tile_m": tm, "tile_n": tn, "alignment_bytes": al}, residuals(x))
    _, params, res = best
    params = {k_: (int(v) if k_ in ("tile_m", "tile_n", "alignment_bytes") else
                   v if v is None or isinstance(v, tuple) else float(v)) for k_, v in params.items()}
    record = FitRecord(columns=("m", "n", "k", "batch", "dtype_bytes", "time_s"),
                       points=tuple((float(a), float(b), float(c), float(d), float(db), float(e))
                                    for a, b, c, d, e in zip(m, n, k, batch, t)),
                       residuals=tuple(float(r) for r in res), note=note)
    return Fit(params, record.residuals, record)


# --- memory-bound kernels ---------------------------------------------------------------------

def fit_elementwise(points: Sequence[Sequence], hbm_bandwidth_gbps: float, *, fixed: dict | None = None,
                    note: str = "") -> Fit:
    """Fit ``ElementwiseParams`` to points (bytes, time_s)."""
    raw = np.asarray(_check_points(points, 2, "memory-bound"), dtype=float)
    nbytes, t = raw[:, 0], raw[:, 1]
    fixed = dict(fixed or {})
    start = {"achieved_fraction": 0.8, "launch_overhead_s": 2e-6}
    free = [p for p in start if p not in fixed]

    def residuals(x):
        p = ElementwiseParams.model_construct(**{**start, **fixed, **x})
        return elementwise_time_s(p, hbm_bandwidth_gbps, nbytes) / t - 1.0

    x, _ = _least_squares(residuals, free, start, {"achieved_fraction": 0.01, "launch_overhead_s": 0.0},
                          {"achieved_fraction": 1.0, "launch_overhead_s": 1e-3}) if free else ({}, 0.0)
    res = residuals(x)
    record = FitRecord(columns=("bytes", "time_s"), points=tuple(map(tuple, raw.tolist())),
                       residuals=tuple(float(r) for r in res), note=note)
    return Fit({**fixed, **{k: float(v) for k, v in x.items()}}, record.residuals, record)


def fit_achieved_fraction(achieved_gbps: Sequence[float], peak_gbps: Sequence[float] | float, *,
                          note: str = "") -> Fit:
    """One bandwidth fraction for kernels whose sizes are unknown but large (launch overhead negligible)."""
    achieved = np.asarray(achieved_gbps, dtype=float)
    peak = np.broadcast_to(np.asarray(peak_gbps, dtype=float), achieved.shape)
    if achieved.size == 0:
        raise ProfileError("no bandwidth points to fit; give at least one")

    def residuals(x):
        return x["fraction"] * peak / achieved - 1.0

    x, _ = _least_squares(residuals, ["fraction"], {"fraction": 0.8}, {"fraction": 0.01}, {"fraction": 1.0})
    record = FitRecord(columns=("achieved_gbps", "peak_gbps"), points=tuple(zip(achieved.tolist(), peak.tolist())),
                       residuals=tuple(float(r) for r in residuals(x)), note=note)
    return Fit({"achieved_fraction": float(x["fraction"])}, record.residuals, record)


# --- attention --------------------------------------------------------------------------------

def fit_attention(points: Sequence[Sequence], peak_flops: float, *, fixed: dict | None = None, note: str = "",
                  backward_terms: bool = False) -> Fit:
    """Fit ``AttentionParams`` to points (batch_heads, seq, head_dim, causal, backward, time_s).

    FLOPs follow FA2: forward 4 s^2 d (batch x heads), halved when causal; backward 2.5x forward. The
    head-size term is fitted only where the points hold two head sizes, and the causal term only where
    they hold the kernel with and without the mask: one of each cannot tell the term from the efficiencies.
    ``backward_terms``: give the backward its own sequence and head-size terms (where both phases were swept in
    both).
    """
    raw = _check_points(points, 6, "attention")
    bh, seq, d = (raw[:, i].astype(float) for i in range(3))
    causal, backward = raw[:, 3].astype(bool), raw[:, 4].astype(bool)
    t = raw[:, 5].astype(float)
    fwd = np.array([attention_forward_flops(a, s, h, c) for a, s, h, c in zip(bh, seq, d, causal)])
    flops = np.where(backward, 2.5 * fwd, fwd)
    fixed = dict(fixed or {})
    start = {"forward_efficiency": 0.6, "backward_efficiency": 0.5, "seq_half": 128.0, "head_dim_half": 32.0,
             "causal_efficiency": 0.9, "causal_seq_half": 128.0, "launch_overhead_s": 2e-6}
    if len(set(d.tolist())) < 2:  # one head size cannot say how the efficiency moves with it: no such term
        del start["head_dim_half"]
    if causal.all() or not causal.any():
        del start["causal_efficiency"], start["causal_seq_half"]
    if backward_terms:
        start["backward_seq_half"] = start["seq_half"]
        if "head_dim_half" in start:
            start["backward_head_dim_half"] = start["head_dim_half"]
    lower = {"forward_efficiency": 0.01, "backward_efficiency": 0.01, "seq_half": 0.0, "head_dim_half": 0.0,
             "causal_efficiency": 0.05, "causal_seq_half": 0.0, "backward_seq_half": 0.0,
             "backward_head_dim_half": 0.0, "launch_overhead_s": 0.0}
    upper = {"forward_efficiency": 1.0, "backward_efficiency": 1.0, "seq_half": 1e5, "head_dim_half": 1e4,
             "causal_efficiency": 1.0, "causal_seq_half": 1e5, "backward_seq_half": 1e5,
             "backward_head_dim_half": 1e4, "launch_overhead_s": 1e-3}
    free = [p for p in start if p not in fixed]

    def residuals(x):
        p = AttentionParams.model_construct(**{**start, **fixed, **x})  # a term not fitted keeps its default: none
        return attention_time_s(p, peak_flops, flops, seq, backward, d, causal) / t - 1.0

    x, _ = _least_squares(residuals, free, start, lower, upper) if free else ({}, 0.0)
    record = FitRecord(columns=("batch_heads", "seq", "head_dim", "causal", "backward", "time_s"),
                       points=tuple((float(a), float(s), float(h), float(c), float(b), float(e))
                                    for a, s, h, c, b, e in zip(bh, seq, d, causal, backward, t)),
                       residuals=tuple(float(r) for r in residuals(x)), note=note)
    return Fit({**fixed, **{k: float(v) for k, v in x.items()}}, record.residuals, record)


# --- collectives ------------------------------------------------------------------------------

def algorithm_factor(kind: str, n_ranks: int) -> float:
    """nccl-tests' bus-bandwidth factor: 2(n-1)/n for all-reduce, (n-1)/n for all-gather/reduce-scatter."""
    return 2.0 * (n_ranks - 1) / n_ranks if kind == "all_reduce" else (n_ranks - 1) / n_ranks


def fit_collective(points: Sequence[Sequence], n_ranks: int, *, kind: str = "all_reduce", metric: str = "time_s",
                   latency_s: float | None = None, fixed: dict | None = None, note: str = "",
                   constrained: bool = False, cap_gbps: float | None = None) -> Fit:
    """Fit a link class to points (size_bytes, time_s), or (size_bytes, busbw_gbps) with ``metric="busbw_gbps"``.

    Model: time = latency + factor * S / busbw(S), busbw(S) = min(max, cap) * S^p / (S^p + half^p). With
    p = 1 the time is linear in S and latency trades off against half; pass ``latency_s`` (from
    small-message data or NCCL's latency model) or fix ``ramp_exponent`` only when the data allow.

    ``cap_gbps`` is the link's ceiling that the cost model applies (the cluster's link bandwidth): the
    fit uses it too, so its residuals are the cost model's. ``constrained`` keeps a fit to a few noisy
    points physical, as a measured calibration needs: the latency at least the smallest measured time
    (a collective never beats its fastest call), the ramp exponent at most 1 (a larger message never
    takes less time), the half-size inside the measured sizes (no extrapolated knee), the bandwidth
    at most the cap.
    """
    if n_ranks < 2:
        raise ProfileError(f"a collective fit needs at least 2 ranks, got n_ranks={n_ranks}")
    if metric not in ("time_s", "busbw_gbps"):
        raise ProfileError(f"metric={metric!r} is not known; use 'time_s' or 'busbw_gbps'")
    raw = np.asarray(_check_points(points, 2, "collective"), dtype=float)
    size = raw[:, 0]
    f = algorithm_factor(kind, n_ranks)
    t = raw[:, 1] if metric == "time_s" else f * size / (raw[:, 1] * 1e9)
    fixed = dict(fixed or {})
    if latency_s is not None:
        fixed["latency_s"] = latency_s
    cap = float(cap_gbps) if cap_gbps is not None else 1e5
    start = {"latency_s": float(np.min(t)) / 4, "max_busbw_gbps": min(float(np.max(f * size / t / 1e9)), cap),
             "half_size_bytes": float(np.median(size)), "ramp_exponent": 0.8}
    lower = {"latency_s": 0.0, "max_busbw_gbps": 1e-3, "half_size_bytes": 1.0, "ramp_exponent": 0.1}
    upper = {"latency_s": 1.0, "max_busbw_gbps": cap, "half_size_bytes": 1e12, "ramp_exponent": 3.0}
    if constrained:
        t_min = float(np.min(t))
        lower.update(latency_s=t_min, half_size_bytes=float(np.min(size)))
        upper.update(ramp_exponent=1.0, half_size_bytes=float(np.max(size)))
        start.update(latency_s=t_min, ramp_exponent=0.8)
        if np.min(size) == np.max(size):
            raise ProfileError("a constrained collective fit needs at least 2 message sizes; measure a size sweep")
    free = [p for p in start if p not in fixed]

    def model(x):
        q = {**start, **fixed, **x}
        return q["latency_s"] + f * size / (min(q["max_busbw_gbps"], cap) * 1e9) * (
            1.0 + (q["half_size_bytes"] / size) ** q["ramp_exponent"])

    x, _ = _least_squares(lambda x: model(x) / t - 1.0, free, start, lower, upper)
    record = FitRecord(columns=("size_bytes", "time_s"), points=tuple(zip(size.tolist(), t.tolist())),
                       residuals=tuple(float(r) for r in model(x) / t - 1.0), note=note)
    return Fit({**fixed, **{k: float(v) for k, v in x.items()}}, record.residuals, record)


def measured_ramp(points: Sequence[Sequence], n_ranks: int, *, kind: str = "all_reduce",
                  latency_s: float = 0.0) -> tuple[float, tuple[tuple[float, float], ...]]:
    """(max_busbw_gbps, ramp_curve) of a measured size sweep of (size_bytes, time_s) points.

    Each point's bus bandwidth is taken over its time less ``latency_s`` (the cost model adds the
    latency back), so the model reproduces every measured time; the curve is that bandwidth as a
    fraction of the sweep's best. Points not above the latency carry no bandwidth and are left out.
    """
    raw = np.asarray(_check_points(points, 2, "collective"), dtype=float)
    raw = raw[np.argsort(raw[:, 0])]
    f = algorithm_factor(kind, n_ranks)
    keep = raw[:, 1] > latency_s
    size, t = raw[keep, 0], raw[keep, 1]
    if size.size < 2 or np.any(np.diff(size) <= 0):
        raise ProfileError("a measured ramp needs at least 2 distinct sizes timed above the latency; "
                           "measure a wider size sweep")
    busbw = f * size / (t - latency_s) / 1e9
    best = float(np.max(busbw))
    return best, tuple((float(s), float(b / best)) for s, b in zip(size, busbw))


def fit_step_latency(times_s: Sequence[float], base_s: float, steps: float, *, note: str = "") -> Fit:
    """Per-step latency L of small-message collectives timed as base_s + steps * L."""
    t = np.asarray(times_s, dtype=float)
    if t.size == 0 or steps <= 0:
        raise ProfileError("a step-latency fit needs at least one time and steps > 0")
    if np.any(t <= base_s):
        raise ProfileError(f"small-message times {t.tolist()} are not above the base latency {base_s}; check the units")
    x, _ = _least_squares(lambda x: (base_s + steps * x["latency_s"]) / t - 1.0, ["latency_s"],
                          {"latency_s": float(np.mean(t) - base_s) / steps}, {"latency_s": 0.0}, {"latency_s": 1.0})
    res = (base_s + steps * x["latency_s"]) / t - 1.0
    record = FitRecord(columns=("time_s",), points=tuple((float(v),) for v in t),
                       residuals=tuple(float(r) for r in res), note=note)
    return Fit({"latency_s": float(x["latency_s"])}, record.residuals, record)


TORCH_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}


def _dtype(raw_name: str) -> str:
    short = TORCH_DTYPES.get(raw_name, raw_name)
    if short not in DTYPE_BYTES:
        raise ProfileError(f"raw points use dtype {raw_name!r}; use one of {', '.join(TORCH_DTYPES)}")
    return short


def _mode(row: dict) -> str:
    return row.get("mode", "isolated")  # raw points from before in-loop timing were all isolated
