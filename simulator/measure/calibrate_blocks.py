"""The measured blocks of a profile fitted to their raw points (GEMM, elementwise kernels, attention,
collectives), each with how well it matches the points it was fitted to.

A few GEMM shapes are held out of the GEMM fit and predicted instead, which is the honest test of the GEMM
model: residuals on fitted points only say the form can bend that far. Where a block's points are missing,
the published profile of the same GPU stands in, and the block's ``sources`` say so.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import numpy as np

from simulator.cost.collectives import ramp
from simulator.cost.elementwise import elementwise_time_s
from simulator.cost.gemm import gemm_time_s
from simulator.cost.profile import (
    AttentionParams,
    CollectiveParams,
    ElementwiseParams,
    FitRecord,
    GemmParams,
    HardwareProfile,
    LinkParams,
    default_profile,
)
from simulator.measure.fitting import (
    DTYPE_BYTES,
    _dtype,
    _mode,
    algorithm_factor,
    fit_attention,
    fit_collective,
    fit_elementwise,
    fit_gemm,
    measured_ramp,
)
from simulator.spec.errors import ProfileError
from simulator.spec.hardware import GpuSpec
from simulator.spec.limits import CACHED_FRACTION_RANGE


@dataclass(frozen=True)
class HeldOutGemm:
    m: int
    n: int
    k: int
    batch: int
    measured_s: float
    predicted_s: float

    @property
    def error(self) -> float:
        """(predicted - measured) / measured."""
        return self.predicted_s / self.measured_s - 1.0


@dataclass(frozen=True)
class BlockError:
    """How well one fitted block matches its points: relative residuals."""

    block: str
    points: int
    rms: float
    max_abs: float
    typical_factor: float = 1.0  # exp(rms of log(model / measured)): 100 when the fit is 100x off either way


def _peak_flops(gpu: GpuSpec, dtype: str) -> float:
    value = getattr(gpu.peak_tflops, dtype, None)
    if value is None:
        raise ProfileError(f"GPU spec {gpu.name!r} has no {dtype} peak; measure in another dtype")
    return value * 1e12


def _error(block: str, residuals) -> BlockError:
    r = np.asarray(residuals, dtype=float)
    factor = float(np.exp(np.sqrt(np.mean(np.log1p(np.maximum(r, -1 + 1e-12)) ** 2))))
    return BlockError(block, int(r.size), float(np.sqrt(np.mean(r**2))), float(np.max(np.abs(r))), factor)


def _fit_gemm(raw: dict, gpu: GpuSpec, cpu: bool) -> tuple[GemmParams, BlockError, list[HeldOutGemm]]:
    rows = raw["gemm"]
    dtypes = {_dtype(r["dtype"]) for r in rows}
    if len(dtypes) != 1:
        raise ProfileError(f"GEMM points mix dtypes {sorted(dtypes)}; measure one dtype per profile")
    dtype = dtypes.pop()
    peak = _peak_flops(gpu, dtype)
    train = [r for r in rows if not r.get("held_out")]
    test = [r for r in rows if r.get("held_out")]
    if len(train) < 4:
        raise ProfileError(f"only {len(train)} GEMM points outside the held-out set; measure more shapes")
    pts = [(r["m"], r["n"], r["k"], r["batch"], dtype, r["time_s"]) for r in train]
    # a CPU core runs one tile at a time: no waves to quantise, so the tile size is moot
    fixed = {"tile_m": 64, "tile_n": 64} if cpu else _published_tiles(gpu)
    fit = fit_gemm(pts, peak, gpu.sm_count, fixed=fixed, note=f"measured {dtype} torch.mm/bmm, median times")
    params = {k: v for k, v in fit.params.items()}
    held = []
    for r in test:
        pred = float(gemm_time_s(GemmParams.model_construct(**params, ceiling_efficiency=None), peak, gpu.sm_count,
                                 r["m"], r["n"], r["k"], r["batch"], DTYPE_BYTES[dtype]))
        held.append(HeldOutGemm(r["m"], r["n"], r["k"], r["batch"], r["time_s"], pred))
    fits = [fit.record]
    if held:
        fits.append(FitRecord(
            columns=("m", "n", "k", "batch", "dtype_bytes", "time_s"),
            points=tuple((h.m, h.n, h.k, h.batch, DTYPE_BYTES[dtype], h.measured_s) for h in held),
            residuals=tuple(h.error for h in held),
            note="held out of the fit: residuals are prediction errors (predicted - measured) / measured"))
    src = f"fitted to {len(train)} measured GEMMs ({raw['device'].get('name')}, {dtype})"
    sources = {k: src for k in params}
    if cpu:
        sources["tile_m"] = sources["tile_n"] = "fixed: a CPU core (sm_count 1) has no waves, the tile size does not matter"
    elif "tile_choices" in fixed:
        for name in ("tile_m", "tile_n", "tile_choices", "full_rate_intensity_elements"):
            sources[name] = (f"from the published {gpu.name} profile: the tiles cuBLAS picks among and the reuse they "
                             "need, which a few dozen timed shapes do not pin")
    measured = _layer_gemm_table(rows, DTYPE_BYTES[dtype])
    if measured:
        sources["measured"] = (f"the {len(measured)} GEMM shapes of the measured layer (its forward, dgrad and wgrad), "
                               "each its median time; held-out ones included, as the fit's test stays the fit's")
    block = GemmParams(**params, measured=measured or None, sources=sources, fits=tuple(fits))
    return block, _error("gemm", fit.residuals), held


def _published_tiles(gpu: GpuSpec) -> dict:
    """The published profile's choice of tiles for ``gpu``, held fixed in a fit to its measured GEMMs; {} where none
    is published (the fit then finds one tile)."""
    try:
        published = default_profile(gpu.name).gemm
    except ProfileError:
        return {}
    if published.tile_choices is None:
        return {}
    return {"tile_m": published.tile_m, "tile_n": published.tile_n, "tile_choices": published.tile_choices,
            "full_rate_intensity_elements": published.full_rate_intensity_elements}


def _layer_gemm_table(rows: list[dict], dtype_bytes: int) -> tuple[tuple[int, int, int, int, int, float], ...]:
    """The layer's own GEMMs (not the grid that spans shapes for the fit), one median time per shape."""
    by_shape: dict[tuple[int, int, int, int], list[float]] = {}
    for r in rows:
        if not r["name"].startswith("grid."):
            by_shape.setdefault((r["m"], r["n"], r["k"], r["batch"]), []).append(float(r["time_s"]))
    return tuple((*shape, dtype_bytes, statistics.median(ts)) for shape, ts in sorted(by_shape.items()))


def _fit_elementwise(raw: dict, gpu: GpuSpec) -> tuple[ElementwiseParams, list[BlockError]]:
    rows = raw["elementwise"]
    fit = fit_elementwise([(r["bytes_moved"], r["time_s"]) for r in rows], gpu.hbm_bandwidth_gbps,
                          note="kernels: " + ", ".join(sorted({r["kernel"] for r in rows})))
    src = (f"fitted to {len(rows)} memory-bound kernels ({', '.join(sorted({r['kernel'] for r in rows}))}) against "
           f"the spec's {gpu.hbm_bandwidth_gbps} GB/s")
    errors = [_error("elementwise", fit.residuals)]
    # each kernel class its own achieved bandwidth (the launch overhead shared): on a GPU they agree,
    # on a CPU random numbers and transcendentals make some classes compute-bound
    fractions, records = {}, [fit.record]
    for kernel in sorted({r["kernel"] for r in rows}):
        own = [(r["bytes_moved"], r["time_s"]) for r in rows if r["kernel"] == kernel]
        if len(own) < 2:
            continue
        kfit = fit_elementwise(own, gpu.hbm_bandwidth_gbps, fixed={"launch_overhead_s": fit.params["launch_overhead_s"]},
                               note=f"kernel class {kernel}")
        fractions[kernel] = kfit.params["achieved_fraction"]
        records.append(kfit.record)
        errors.append(_error(f"elementwise.{kernel}", kfit.residuals))
    sources = {k: src for k in fit.params}
    if fractions:
        sources["kernel_fractions"] = f"fitted per kernel class ({', '.join(fractions)}), launch overhead shared"
    curves = _kernel_curves(rows, gpu.hbm_bandwidth_gbps, fit.params["launch_overhead_s"])
    if curves:
        sources["kernel_curves"] = (f"the measured sweeps of {', '.join(curves)}, the shared launch overhead taken "
                                    "out; the fitted fractions are used for the other classes")
    block = ElementwiseParams(**fit.params, kernel_fractions=fractions or None, kernel_curves=curves or None,
                              sources=sources, fits=tuple(records))
    for i, e in enumerate(errors):  # a class costed by its sweep: what the block gives back, not the unused fit
        kernel = e.block.removeprefix("elementwise.")
        if kernel in curves:
            own = [r for r in rows if r["kernel"] == kernel]
            given = elementwise_time_s(block, gpu.hbm_bandwidth_gbps, [r["bytes_moved"] for r in own], kernel)
            errors[i] = _error(f"elementwise.{kernel} (measured sweep)",
                               given / np.array([r["time_s"] for r in own]) - 1.0)
    return block, errors


def _kernel_curves(rows: list[dict], hbm_gbps: float, launch_s: float) -> dict[str, tuple[tuple[float, float], ...]]:
    """Each kernel class's sweep as (bytes, fraction of the HBM peak) where it is clean (time grows with size
    up to noise): the achieved bandwidth changes with the working set (a CPU core's private cache against
    the shared one), which one fraction per class cannot follow. A point at or under the launch overhead
    says nothing of bandwidth and is left out."""
    curves = {}
    for kernel in sorted({r["kernel"] for r in rows}):
        by_size: dict[float, list[float]] = {}
        for r in rows:
            if r["kernel"] == kernel:
                by_size.setdefault(float(r["bytes_moved"]), []).append(float(r["time_s"]))
        sweep = sorted((size, statistics.median(ts)) for size, ts in by_size.items())
        low, high = CACHED_FRACTION_RANGE["ge"], CACHED_FRACTION_RANGE["le"]
        points = tuple((size, min(high, max(low, size / ((t - launch_s) * hbm_gbps * 1e9))))
                       for size, t in sweep if t > launch_s)
        if len(points) >= 2 and _clean_sweep(sweep):
            curves[kernel] = points
    return curves


def _attention_points(rows: list[dict]) -> list[tuple]:
    return [(r["batch_heads"], r["seq"], r["head_dim"], bool(r["causal"]), r["pass"] == "backward", r["time_s"])
            for r in rows]


def _fit_attention(raw: dict, gpu: GpuSpec, base: HardwareProfile | None) -> tuple[AttentionParams, list[BlockError]]:
    fused = [r for r in raw.get("attention", []) if r["impl"] == "fused"]
    if not fused:
        if base is None:
            raise ProfileError("raw points hold no fused attention points and there is no published profile to "
                               "take them from; measure again with `python -m calibration.measure` (its --sections "
                               "include attention)")
        return base.attention, []
    peak = _peak_flops(gpu, _dtype(fused[0]["dtype"]))
    fit = fit_attention(_attention_points(fused), peak, note="torch scaled_dot_product_attention, median times")
    src = f"fitted to {len(fused)} fused attention timings (torch SDPA, forward and backward)"
    fits, errors = [fit.record], [_error("attention.fused", fit.residuals)]
    unfused = [r for r in raw.get("attention", []) if r["impl"] == "unfused"]
    if unfused:
        # kept for comparison; the cost model costs unfused attention as its batched GEMMs and softmax
        extra = fit_attention(_attention_points(unfused), peak,
                              note="unfused path (matmul, softmax, dropout, matmul): kept for comparison, not used")
        fits.append(extra.record)
        errors.append(_error("attention.unfused", extra.residuals))
    block = AttentionParams(**fit.params, sources={k: src for k in fit.params}, fits=tuple(fits))
    return block, errors


def _p2p(rows: list[dict]) -> tuple[float, float, np.ndarray]:
    """time = latency + S / bandwidth, least squares in relative error (linear in latency and 1/bandwidth)."""
    size = np.array([r["bytes"] for r in rows], dtype=float)
    t = np.array([r["time_s"] for r in rows], dtype=float)
    (lat, inv_bw), *_ = np.linalg.lstsq(np.stack([1 / t, size / t], axis=1), np.ones_like(t), rcond=None)
    lat, inv_bw = max(float(lat), 0.0), max(float(inv_bw), 1e-15)
    return lat, 1 / inv_bw / 1e9, (lat + size * inv_bw) / t - 1.0


def _link_cap_gbps(gpu: GpuSpec) -> float:
    """The ceiling the cost model puts on a measured link: the spec's per-direction link bandwidth (on a
    CPU, the shared-memory copy bandwidth that loopback cannot beat)."""
    return gpu.nvlink_bandwidth_gbps_per_direction


def _fit_collectives(raw: dict, base: HardwareProfile | None,
                     gpu: GpuSpec) -> tuple[CollectiveParams, list[BlockError], list[str]]:
    rows = raw.get("collectives", [])
    kinds = ("all_reduce", "all_gather", "reduce_scatter", "send_recv")
    by = {(k, m): [r for r in rows if r["kind"] == k and _mode(r) == m] for k in kinds for m in ("isolated", "in_loop")}
    # The training step issues its collectives right after compute, without a barrier: where they were
    # timed that way, those times are the link; the isolated ones are kept for comparison.
    mode = "in_loop" if len(by[("all_reduce", "in_loop")]) >= 3 else "isolated"
    sweep_rows = by[("all_reduce", mode)]
    p2p_rows = by[("send_recv", "isolated")]
    if len(sweep_rows) < 3 or len(p2p_rows) < 2:
        why = _collectives_shortfall(raw, len(sweep_rows), len(p2p_rows))
        if base is None:
            raise ProfileError(f"{why}, and no published profile of this device has them; measure again on a quieter "
                               "machine or give the measurement more time with --budget-s")
        return base.collectives, [], [f"collectives not measured ({why}): taken from profile {base.name!r}"]
    n = int(sweep_rows[0]["group_size"])
    backend = sweep_rows[0].get("backend", "?")
    cap = _link_cap_gbps(gpu)
    how = {"in_loop": "issued right after the layer's MLP GEMMs without a barrier, as the training step issues "
                      "it (the mean call)",
           "isolated": "each call alone, the ranks entering together"}
    fits, errors, notes = [], [], []
    ar = fit_collective([(r["bytes"], r["time_s"]) for r in sweep_rows], n, kind="all_reduce", constrained=True,
                        cap_gbps=cap, note=f"{backend} all-reduce, {n} ranks on one machine, {how[mode]}")
    fits.append(ar.record)
    for kind in ("all_reduce", "all_gather", "reduce_scatter"):
        for m in ("in_loop", "isolated"):
            pts = by[(kind, m)]
            if (kind, m) != ("all_reduce", mode) and len(pts) >= 3:
                f = fit_collective([(r["bytes"], r["time_s"]) for r in pts], n, kind=kind, constrained=True,
                                   cap_gbps=cap, note=f"{backend} {kind}, {how[m]}: kept for comparison, the link "
                                                      f"parameters are the {mode.replace('_', '-')} all-reduce's")
                fits.append(f.record)
    lat, bw, res = _p2p(p2p_rows)
    fits.append(FitRecord(columns=("size_bytes", "time_s"),
                          points=tuple((float(r["bytes"]), float(r["time_s"])) for r in p2p_rows),
                          residuals=tuple(float(x) for x in res), note=f"{backend} send/recv ring, latency + S / bandwidth"))
    src = (f"constrained fit to {len(sweep_rows)} {backend} all-reduce timings over {n} ranks on one machine, "
           f"{how[mode]}")
    p = ar.params
    sweep = sorted((r["bytes"], r["time_s"]) for r in sweep_rows)
    if _clean_sweep(sweep):
        # The measured sweep itself is the bandwidth curve between its sizes; the fit covers the rest.
        best_busbw, curve = measured_ramp(sweep, n, latency_s=p["latency_s"])
        if best_busbw > cap:  # the cost model caps the link: a curve over a faster best would not give the points back
            best_busbw, curve = p["max_busbw_gbps"], None
    else:
        best_busbw, curve = p["max_busbw_gbps"], None
    if curve is not None:
        sources = {k: src + "; used only outside the measured sizes" for k in ("half_size_bytes", "ramp_exponent")}
        sources["max_busbw_gbps"] = (f"the best of {len(sweep)} {backend} all-reduce timings ({how[mode]}), "
                                     "latency taken out")
        sources["ramp_curve"] = f"the {backend} all-reduce timings over {n} ranks, latency taken out, over the best"
    else:
        sources = {k: src for k in ("max_busbw_gbps", "half_size_bytes", "ramp_exponent")}
        notes.append(f"the {backend} all-reduce sweep is noisy (a larger size ran more than "
                     f"{SWEEP_NOISE:.0%} faster than a smaller one), so the smooth fit is used rather than the sweep")
    link = dict(max_busbw_gbps=best_busbw, half_size_bytes=p["half_size_bytes"], ramp_exponent=p["ramp_exponent"],
                ramp_curve=curve, p2p_bandwidth_gbps=bw, p2p_latency_s=lat)
    sources.update(p2p_bandwidth_gbps=f"fitted to {backend} send/recv", p2p_latency_s=f"fitted to {backend} send/recv")

    cpu = raw["device"]["kind"] == "cpu"
    # every rank of a CPU is its own node (one device per node), so the whole latency goes to the
    # inter-node steps: an all-reduce over 2 nodes takes 2 of them, and the intra-node part is 0
    ar_steps = 2 * (n - 1) if n > 2 else 2
    ramped = LinkParams.model_construct(**link)  # the ramp only: the factors below are measured against it

    def link_time_s(kind: str, nbytes: float) -> float:
        """The time the cost model gives a collective of ``kind`` over the measured group (before any factor):
        on a CPU the latency per inter-node step times the kind's steps (n - 1 for all-gather and
        reduce-scatter), on a GPU node the whole collective's latency."""
        latency = p["latency_s"] / ar_steps * (ar_steps if kind == "all_reduce" else n - 1) if cpu else p["latency_s"]
        return latency + algorithm_factor(kind, n) * nbytes / (ramp(ramped, nbytes) * min(best_busbw, cap) * 1e9)

    factors = _kind_factors({k: by[(k, mode)] for k in ("all_gather", "reduce_scatter")}, link_time_s)
    if factors:
        link["kind_factors"] = factors
        sources["kind_factors"] = (f"the {backend} {', '.join(factors)} timings ({how[mode]}) over the link's time for "
                                   "them: the backend's own cost of each kind (inner sizes: the median of three "
                                   "neighbouring sizes' factors)")
    if mode == "in_loop":
        isolated = _isolated_factors({k: (by[(k, "isolated")], by[(k, "in_loop")])
                                      for k in ("all_reduce", "all_gather", "reduce_scatter")})
        if isolated:
            link["isolated_factors"] = isolated
            sources["isolated_factors"] = (f"the {backend} {', '.join(isolated)} timings of each call alone, the ranks "
                                           "entering together, over the same call's in-loop timing at each size "
                                           "(inner sizes: the median of three neighbouring sizes' shares)")
    if cpu:
        network = LinkParams(latency_s=p["latency_s"] / ar_steps, **link, fits=tuple(fits),
                             sources={**sources, "latency_s": f"fitted all-reduce latency / {ar_steps} inter-node "
                                                              "steps"})
        nvlink = LinkParams(latency_s=0.0, **link, sources={**sources, "latency_s": "no intra-node peer: 0"})
        measured = network
    else:
        # the GPUs of one machine talk over NVLink: the measured link is the intra-node one, and the
        # network between nodes cannot be measured here
        nvlink = LinkParams(latency_s=p["latency_s"], **link, fits=tuple(fits),
                            sources={**sources, "latency_s": src})
        if base is not None:
            network = base.collectives.network
            notes.append(f"the inter-node network was not measured (one machine): taken from profile {base.name!r}")
        else:
            network = nvlink
            notes.append("the inter-node network was not measured (one machine) and no published profile has it: "
                         "the measured intra-node link stands in for it")
        measured = nvlink
    # The errors are the link model's (the all-reduce sweep and its latency, each kind's measured factor) on
    # every measured collective; the isolated ones were not used to build it.
    for kind in ("all_reduce", "all_gather", "reduce_scatter"):
        for m in ("in_loop", "isolated"):
            if by[(kind, m)]:
                label = f"collectives.{kind}" + ("" if m == mode else f" ({m.replace('_', '-')})")
                errors.append(_error(label + (" (measured factor)" if m == mode and kind in factors else ""), [
                    link_time_s(kind, r["bytes"]) * (measured.kind_factor(kind, r["bytes"]) if m == mode else 1.0)
                    / r["time_s"] - 1.0 for r in by[(kind, m)]]))
    errors.append(_error("collectives.send_recv", res))
    return CollectiveParams(nvlink=nvlink, network=network), errors, notes


def _collectives_shortfall(raw: dict, all_reduce: int, send_recv: int) -> str:
    """Why a link could not be fitted, as the measurement recorded it: the collectives section's own error (its
    ranks killed, a failure), or the points it skipped to stay within its time, or that it did not run."""
    info = raw.get("sections", {}).get("collectives")
    have = (f"the collectives section gave {all_reduce} all-reduce and {send_recv} send/recv points where a link "
            "needs 3 and 2")
    if info is None:
        return have + " (it was not run)"
    if info.get("error"):
        return f"{have}: {' '.join(str(info['error']).split())}"
    skipped = info.get("skipped") or []
    if skipped:
        allowed = info.get("budget_s")
        return (f"{have}: {len(skipped)} points would not have ended within the "
                + (f"{allowed:g} s it was allowed" if isinstance(allowed, (int, float)) else "time it was allowed"))
    return have


def _median_by_size(rows: list[dict]) -> dict[float, float]:
    """The median time of each size's points."""
    by_size: dict[float, list[float]] = {}
    for r in rows:
        by_size.setdefault(float(r["bytes"]), []).append(float(r["time_s"]))
    return {size: statistics.median(times) for size, times in by_size.items()}


def _neighbour_median(points: list[tuple[float, float]]) -> tuple[tuple[float, float], ...]:
    """(size, factor) points with each inner factor the median of its own and its two neighbours'."""
    return tuple((size, f if i in (0, len(points) - 1) else statistics.median(x for _, x in points[i - 1:i + 2]))
                 for i, (size, f) in enumerate(points))


def _kind_factors(rows_by_kind: dict[str, list[dict]], link_time_s) -> dict[str, tuple[tuple[float, float], ...]]:
    """Per kind, (size, measured time / the link's time) over its sweep, where it has at least two sizes; each
    inner size takes the median of its own factor and its two neighbours'.

    An in-loop point is a mean over a heavy tail (a waiting rank woken a scheduler tick late), so one size
    now and then comes out at twice its neighbours and the next calibration does not repeat it: gloo's
    all-gather of 256 KiB was 4.5x its link in one profile and 2.4x in the next, between neighbours at
    2.0-2.4x, and that one point moved a sequence-parallel plan's prediction by 35%. A tail is the same
    at every size, so the neighbours are a fair second and third measurement of it; a real trend (the
    factor rising or falling with size) passes a median of three unchanged."""
    factors = {}
    for kind, rows in rows_by_kind.items():
        times = _median_by_size(rows)
        if len(times) >= 2:
            factors[kind] = _neighbour_median([(size, min(100.0, max(0.01, times[size] / link_time_s(kind, size))))
                                               for size in sorted(times)])
    return factors


def _isolated_factors(rows_by_kind: dict[str, tuple[list[dict], list[dict]]]) -> dict[str, tuple[tuple[float, float], ...]]:
    """Per kind, (size, isolated time / in-loop time) at the sizes timed both ways, where there are at least two;
    at most 1 (a call cannot gain from waiting), each inner size the median of its own share and its neighbours'
    (the in-loop tail, as ``_kind_factors`` says)."""
    factors = {}
    for kind, (alone, in_loop) in rows_by_kind.items():
        a, b = _median_by_size(alone), _median_by_size(in_loop)
        sizes = sorted(set(a) & set(b))
        if len(sizes) >= 2:
            factors[kind] = _neighbour_median([(size, min(1.0, max(0.01, a[size] / b[size]))) for size in sizes])
    return factors


SWEEP_NOISE = 0.10


def _clean_sweep(sweep: list[tuple[float, float]]) -> bool:
    """Whether time grows with size up to noise: only then is interpolating between points better than the fit."""
    return all(t1 >= t0 * (1 - SWEEP_NOISE) for (_, t0), (_, t1) in zip(sweep, sweep[1:]))
