"""The parameter blocks of a ``HardwareProfile`` (``simulator.cost.profile``): GEMM, memory-bound kernels,
attention, each link's collectives and the host, each with the sources, declared ranges and fit records of
its numbers. The formulas that read them live beside this module, in ``simulator.cost``.
"""

from __future__ import annotations

import math
import operator
from functools import lru_cache
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from simulator.cost.curves import interpolate_log_log
from simulator.spec import limits

# Every number of a profile is finite and in its physical range (simulator.spec.limits), so no time the
# cost models derive from it overflows or turns negative: a corrupt file is refused, not used.
_FRACTION, _SECONDS = limits.FRACTION_RANGE, limits.FIXED_SECONDS_RANGE
_GBPS, _SIZE = limits.GBPS_RANGE, limits.SIZE_RANGE
_MEASURED_S, _POINT = limits.MEASURED_SECONDS_RANGE, limits.FIT_VALUE_RANGE


class FitRecord(BaseModel):
    """The raw points a block was fitted to and the fit's relative residual at each, (model - data) / data."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    columns: tuple[str, ...]
    points: tuple[tuple[float, ...], ...]
    residuals: tuple[float, ...]
    note: str = ""

    @model_validator(mode="after")
    def _shapes_agree(self) -> "FitRecord":
        if any(len(p) != len(self.columns) for p in self.points):
            raise ValueError(f"fit points must each have {len(self.columns)} values ({', '.join(self.columns)})")
        if len(self.residuals) != len(self.points):
            raise ValueError(f"a fit has {len(self.points)} points but {len(self.residuals)} residuals; keep one per point")
        return self

    @model_validator(mode="after")
    def _points_are_measurements(self) -> "FitRecord":
        """Each value is what its column says it is: a time or a bandwidth is positive and in its physical
        range, every other value (a size, a count, a 0/1 flag) from 0 to the largest size."""
        for i, point in enumerate(self.points):
            for column, x in zip(self.columns, point):
                if column.endswith("_gbps"):
                    ok, say = _GBPS["ge"] <= x <= _GBPS["le"], f"from {_GBPS['ge']:g} to {_GBPS['le']:g} GB/s"
                elif column.endswith("_s"):
                    ok, say = 0 < x <= _MEASURED_S["le"], f"more than 0 and at most {_MEASURED_S['le']:g} s"
                else:
                    ok, say = _POINT["ge"] <= x <= _POINT["le"], f"from {_POINT['ge']:g} to {_POINT['le']:g}"
                if not ok:
                    raise ValueError(f"fit point {i} has {column}={x:g}; a measured {column} is {say}, so measure "
                                     "again or drop the point")
        return self

    @property
    def max_abs_residual(self) -> float:
        return max((abs(r) for r in self.residuals), default=0.0)


class _Block(BaseModel):
    """A parameter block: every numeric field needs a ``sources`` entry; one that no measurement
    pins also gives its plausible ``ranges`` entry (low, high), from which the band on every
    answer is computed."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    sources: dict[str, str]
    fits: tuple[FitRecord, ...] = ()
    ranges: dict[str, tuple[float, float]] = Field(
        default_factory=dict, description="Plausible (low, high) of each parameter no measurement pins.")

    @model_validator(mode="after")
    def _every_number_has_a_source(self) -> "_Block":
        missing = [
            name for name, value in self
            if name not in _BOOKKEEPING and value is not None and name not in self.sources
        ]
        if missing:
            raise ValueError(f"{type(self).__name__} parameters {missing} have no entry under 'sources'; add one each")
        return self

    @model_validator(mode="after")
    def _ranges_hold_their_values(self) -> "_Block":
        for name, (low, high) in self.ranges.items():
            value = getattr(self, name, None)
            if name in _BOOKKEEPING or not isinstance(value, (int, float)) or isinstance(value, bool):
                raise ValueError(f"{type(self).__name__} has a range for {name!r}, which is not one of its numbers; "
                                 "remove it or fix its name")
        return self  # the profile checks each range against its value, where it knows the value's path


_BOOKKEEPING = {"sources", "fits", "ranges"}


def _check_range(path: str, value: float, low: float, high: float, metadata: list[Any]) -> None:
    """A declared (low, high) is checked as its value is: both ends finite and inside the value's own
    bounds (the band moves the value to either end), and the value between them."""
    *block, name = path.split(".")
    where = ".".join([*block, "ranges", name])
    bounds = [(kind, getattr(m, kind)) for m in metadata for kind in _BOUNDS if hasattr(m, kind)]
    for end in (low, high):
        if not math.isfinite(end) or not all(_BOUNDS[kind][0](end, bound) for kind, bound in bounds):
            allowed = " and ".join(f"{_BOUNDS[kind][1]} {bound:g}" for kind, bound in bounds) or "finite"
            raise ValueError(f"{where} reaches {end:g}, but {path} must be {allowed}; give a range inside those "
                             "bounds")
    if not low <= value <= high:
        raise ValueError(f"{path}={value} lies outside its range [{low}, {high}]; widen the range or fix the value")


_BOUNDS = {"ge": (operator.ge, "at least"), "gt": (operator.gt, "more than"), "le": (operator.le, "at most"),
           "lt": (operator.lt, "less than")}


class GemmParams(_Block):
    """time = launch_overhead_s + flops / (peak_flops * eff), with

    eff = max_efficiency * wave_eff(m, n, batch) * k / (k + k_half) * (misaligned_factor if misaligned),
    wave_eff = tiles / (ceil(tiles / sm_count) * sm_count), tiles = ceil(m/tile_m) * ceil(n/tile_n) * batch.

    With ``tile_choices`` the GEMM runs at the fastest of those output tiles, as cuBLAS's heuristics pick one per
    shape: each tile's efficiency is max_efficiency * reuse * fill * k / (k + k_half), where fill is the share of the
    waves' SM-slots doing useful work (a partial tile costs a whole one) and reuse = min(1, intensity /
    full_rate_intensity_elements), intensity = tile_m * tile_n / (tile_m + tile_n): a small tile fetches more operand
    bytes per flop than shared memory feeds at full rate.
    """

    max_efficiency: float = Field(description="Fraction of the dense tensor peak the best shapes reach.", **_FRACTION)
    tile_m: int = Field(gt=0, le=65536, description="Output tile rows of one thread block (elements).")
    tile_n: int = Field(gt=0, le=65536, description="Output tile columns of one thread block (elements).")
    k_half: float = Field(description="Reduction length at which per-tile prologue/epilogue halve efficiency.", **_SIZE)
    misaligned_factor: float = Field(
        description="Slowdown when m, n or k is not a multiple of alignment_bytes.", **_FRACTION
    )
    alignment_bytes: int = Field(
        gt=0, le=65536, description="Tensor-core alignment of each dimension, bytes (Anthony et al. 2024)."
    )
    launch_overhead_s: float = Field(description="Fixed time per kernel, seconds.", **_SECONDS)
    tile_choices: tuple[tuple[int, int], ...] | None = Field(
        None, min_length=1, description="Output tiles (tile_m, tile_n) the library chooses among per shape; each GEMM "
                                        "takes the fastest. None: every GEMM runs tile_m x tile_n.")
    full_rate_intensity_elements: float | None = Field(
        None, **_SIZE, description="Tile intensity tile_m * tile_n / (tile_m + tile_n), elements, from which a tile's "
                                   "main loop runs at max_efficiency; smaller tiles run proportionally slower. Only "
                                   "read with tile_choices; None: every tile at full rate.")
    ceiling_efficiency: float | None = Field(
        None, **_FRACTION,
        description="Best efficiency any shape reaches (a brute-force shape search's maximum); caps the formula.",
    )
    measured: tuple[tuple[int, int, int, int, int, float], ...] | None = Field(
        None, description="The layer's own GEMMs as timed, (m, n, k, batch, dtype_bytes, time_s): the cost model "
                          "gives these shapes their measured time and the fitted form every other shape.")

    @model_validator(mode="after")
    def _tiles_are_tiles(self) -> "GemmParams":
        if any(not 1 <= t <= 65536 for tile in self.tile_choices or () for t in tile):
            raise ValueError(f"tile_choices {self.tile_choices} need tile sizes from 1 to 65536 elements; give "
                             "(tile_m, tile_n) pairs such as (128, 256)")
        return self

    @model_validator(mode="after")
    def _measured_shapes_are_shapes(self) -> "GemmParams":
        keys = [row[:5] for row in self.measured or ()]
        if any(min(row[:5]) < 1 or max(row[:5]) > _SIZE["le"] or not 0 < row[5] <= _SECONDS["le"]
               for row in self.measured or ()):
            raise ValueError(f"measured GEMMs need m, n, k, batch and dtype_bytes from 1 to {_SIZE['le']:g} and a "
                             f"time from 0 to {_SECONDS['le']:g} s; measure again or drop them")
        if len(set(keys)) != len(keys):
            raise ValueError("measured GEMMs repeat a shape; keep one time per (m, n, k, batch, dtype_bytes)")
        return self

    def measured_time_s(self, m: int, n: int, k: int, batch: int, dtype_bytes: int) -> float | None:
        """The timed GEMM of this shape, or None where the shape was not timed."""
        return _measured_times(self.measured).get((m, n, k, batch, dtype_bytes)) if self.measured else None


@lru_cache(maxsize=64)
def _measured_times(measured: tuple[tuple[int, int, int, int, int, float], ...]) -> dict[tuple, float]:
    # kept out of the model: a private table filled on first use would make a used profile unequal to an
    # unused copy of itself with the same hash, which every cache keyed by profiles relies on
    return {row[:5]: row[5] for row in measured}


# A backward kernel (``<class>_backward``) that a profile did not time is costed as its forward class, but for a
# dropout's: it only applies the kept mask, one pass like the residual add on a GPU (Megatron's fused
# bias-dropout-add backward). A masked fill untimed is the copy it is on a GPU. On a CPU torch runs each backward as its own kernels (the dropout's converts
# the boolean mask and multiplies twice, several times the add's time), which a profile that timed them keeps.
KERNEL_STAND_INS = {"dropout_backward": "bias_add_residual", "masked_fill": "copy"}
BACKWARD_SUFFIX = "_backward"


class ElementwiseParams(_Block):
    """Memory-bound kernels: time = launch_overhead_s + bytes / (hbm_bandwidth * fraction).

    The fraction is ``achieved_fraction``, or the kernel class's own (``kernel_fractions``). Where a
    class was measured over a sweep of sizes, ``kernel_curves`` keeps the sweep as measured, the
    launch overhead taken out, and the fraction is interpolated (log-log) between its points and
    held at the end points outside them: a CPU core streams a working set that fits its private
    cache two to three times faster than one from the shared cache or memory, which no single
    bandwidth describes (the curves of a GPU are flat past a few MiB).
    """

    achieved_fraction: float = Field(description="Fraction of peak HBM bandwidth a fused kernel reaches.", **_FRACTION)
    launch_overhead_s: float = Field(description="Fixed time per kernel, seconds.", **_SECONDS)
    kernel_fractions: dict[str, Annotated[float, Field(**_FRACTION)]] | None = Field(
        None, description="Achieved fraction per kernel class (layer_norm, gelu, dropout, softmax, bias_add_residual, "
                          "copy and each one's _backward; optimizer, the optimizer step's kernels) where measured; "
                          "the others use achieved_fraction.",
    )
    kernel_curves: dict[str, tuple[tuple[float, float], ...]] | None = Field(
        None, description="Per kernel class, measured (bytes_moved, fraction of peak HBM bandwidth) points, sizes "
                          "increasing; the fraction at other sizes is interpolated log-log, held at the ends. A "
                          "working set that stays in cache may stream faster than the peak (a fraction above 1).",
    )

    @model_validator(mode="after")
    def _curves_are_curves(self) -> "ElementwiseParams":
        for kernel, c in (self.kernel_curves or {}).items():
            low, high = limits.CACHED_FRACTION_RANGE["ge"], limits.CACHED_FRACTION_RANGE["le"]
            if len(c) < 2 or any(not (0 < size <= _SIZE["le"] and low <= frac <= high) for size, frac in c):
                raise ValueError(f"kernel_curves[{kernel!r}] needs at least 2 points of (bytes, fraction) with sizes "
                                 f"from 1 to 1e15 bytes and fractions from {low:g} to {high:g}; measure again or drop "
                                 "the curve")
            if any(b[0] <= a[0] for a, b in zip(c, c[1:])):
                raise ValueError(f"kernel_curves[{kernel!r}] sizes must increase strictly; sort the points and drop "
                                 "repeated sizes")
        return self

    def _measured_as(self, kernel: str) -> str:
        """The class whose figures stand for ``kernel``: its own where measured, else the class it was costed as
        before it had its own (a profile measured without it keeps its predictions)."""
        measured = {**(self.kernel_fractions or {}), **(self.kernel_curves or {})}
        while kernel not in measured:
            stand_in = KERNEL_STAND_INS.get(kernel, kernel.removesuffix(BACKWARD_SUFFIX))
            if stand_in == kernel:
                break
            kernel = stand_in
        return kernel

    def fraction(self, kernel: str) -> float:
        return (self.kernel_fractions or {}).get(self._measured_as(kernel), self.achieved_fraction)

    def curve(self, kernel: str) -> tuple[tuple[float, float], ...] | None:
        return (self.kernel_curves or {}).get(self._measured_as(kernel))


class AttentionParams(_Block):
    """Fused (flash) attention: eff = phase_efficiency * s / (s + seq_half), of the dense tensor peak, scaled by
    head size (``head_dim_half``) and, under the causal mask, by the mask's own loss (``causal_efficiency``)."""

    forward_efficiency: float = Field(description="Forward efficiency at long sequences [FA2].", **_FRACTION)
    backward_efficiency: float = Field(description="Backward efficiency at long sequences [FA2].", **_FRACTION)
    seq_half: float = Field(
        0.0, description="Sequence length at which the efficiency halves (0: no size term).", **_SIZE
    )
    backward_seq_half: float | None = Field(
        None, description="The backward's own seq_half where it was measured apart (None: seq_half for both "
                          "phases): its per-tile work beyond the matmuls is larger, so it reaches its long-sequence "
                          "rate later.", **_SIZE)
    backward_head_dim_half: float | None = Field(
        None, description="The backward's own head_dim_half where it was measured apart (None: head_dim_half for "
                          "both phases).", **_SIZE)
    head_dim_half: float | None = Field(
        None, description="Head size at which the efficiency would halve, the efficiencies being stated at head size "
                          "128: eff x d / (d + head_dim_half) x (128 + head_dim_half) / 128 (None or 0: no "
                          "head-size term, as where a profile was measured at one head size).",
        **_SIZE)
    causal_efficiency: float | None = Field(
        None, description="A causal kernel's efficiency relative to the unmasked one at long sequences: "
                          "eff x causal_efficiency x s / (s + causal_seq_half) under the causal mask (None: no "
                          "causal term, as where a profile was measured with one mask only).", **_FRACTION)
    causal_seq_half: float | None = Field(
        None, description="Sequence length at which the causal mask's extra loss would halve the efficiency "
                         "(its diagonal tiles, half masked, weigh most at short sequences; None: no such term).",
        **_SIZE)
    launch_overhead_s: float = Field(description="Fixed time per kernel, seconds.", **_SECONDS)


def _check_curve(name: str, curve, what: str, value_ok, value_range: str) -> None:
    """Refuse a measured curve that is not at least two (size_bytes, value) points, sizes strictly increasing."""
    if len(curve) < 2 or any(not (0 < size <= _SIZE["le"] and value_ok(v)) for size, v in curve):
        raise ValueError(f"{name} needs at least 2 points of (size_bytes, {what}) with sizes from 1 to 1e15 bytes and "
                         f"{value_range}; measure again or drop it")
    if any(b[0] <= a[0] for a, b in zip(curve, curve[1:])):
        raise ValueError(f"{name} sizes must increase strictly; sort the points and drop repeated sizes")


class LinkParams(_Block):
    """One link class of NCCL collectives: busbw(S) = max_busbw_gbps * ramp(S).

    Where a size sweep was measured, ``ramp_curve`` holds it as (size_bytes, busbw / max_busbw_gbps)
    points and ramp(S) is interpolated between them (log-log). NCCL's curve is not smooth: it
    changes channel count and protocol with the size, so the published 8x A100 curve has a plateau
    (172 GB/s at 64 MiB, 177 at 128 MiB) and then a jump (194 at 256 MiB); no three-parameter form
    follows it through 16-256 MiB, which is where tensor-parallel messages of GPT layers fall.
    Outside the measured sizes, and for links without a sweep, ramp(S) = S^p / (S^p + half_size_bytes^p)
    with p = ``ramp_exponent`` (p = 1 is the plain saturating form).

    A collective takes latency + algorithm_factor * S / busbw(S). For ``nvlink`` the latency is that
    of a whole intra-node collective; for ``network`` it is the cost of one inter-node step, so a
    collective's latency grows with the steps (ring) or tree levels it crosses.
    """

    latency_s: float = Field(**_SECONDS)
    max_busbw_gbps: float = Field(
        description="Ring bus bandwidth for large messages, GB/s (per GPU or per NIC).", **_GBPS
    )
    half_size_bytes: float = Field(description="Message size at which bus bandwidth is half its maximum.", **_SIZE)
    ramp_exponent: float = Field(
        1.0, ge=0.01, le=100, description="Steepness p of the bus-bandwidth ramp with message size."
    )
    ramp_curve: tuple[tuple[float, float], ...] | None = Field(
        None, description="Measured (size_bytes, fraction of max_busbw_gbps) points, sizes increasing; ramp(S) "
                          "is interpolated between them, the parametric form is used outside.",
    )
    ramp_reference_busbw_gbps: float | None = Field(
        None, **_GBPS,
        description="The ring bus bandwidth, GB/s, of the configuration the ramp was measured on. Where set, a ring "
                    "of another bus bandwidth B reaches the same fraction at B / this times the bytes: what fills "
                    "the pipeline is a time (a step's overhead), so a faster ring needs more bytes to hide it. "
                    "Unset: the ramp is in bytes whatever the ring (the NVLink curves, measured on the ring "
                    "they are used for).",
    )
    kind_factors: dict[str, tuple[tuple[float, float], ...]] | None = Field(
        None, description="Per collective kind other than all-reduce (all_gather, reduce_scatter), measured (size_bytes, "
                          "measured time over the link model's time of that kind) points, sizes increasing; that "
                          "kind's time is multiplied by the factor interpolated (log-log) at its size, held at the "
                          "ends. gloo on a CPU runs its reduce-scatter two to three times slower than the "
                          "all-reduce-derived link says; NCCL's kinds agree with it to a few percent.",
    )
    isolated_factors: dict[str, tuple[tuple[float, float], ...]] | None = Field(
        None, description="Where the link is the in-loop timing (a call right after the layer's compute, as the step "
                          "issues it), per kind (all_reduce, all_gather, reduce_scatter): measured (size_bytes, time of "
                          "the call issued alone with the ranks entering together over its in-loop time) points, "
                          "sizes increasing, at most 1. A collective the group issues with only memory-bound ops "
                          "since its previous one (sequence parallelism's all-gather after the reduce-scatter, a "
                          "layer norm between) finds the ranks still together and pays that share of its in-loop "
                          "time: the wait for the other ranks' compute, and for a sleeping rank to be woken, is what "
                          "the rest was. None: every call pays its in-loop time (NCCL's link is nccl-tests' "
                          "back-to-back timing, which has no such wait).",
    )
    nvls_max_busbw_gbps: float | None = Field(
        None, **_GBPS, description="All-reduce bus bandwidth with NVLink SHARP (Hopper and later), GB/s."
    )
    all_reduce_curves: dict[int, tuple[tuple[float, float], ...]] | None = Field(
        None, description="Measured all-reduce times on n ranks of one node, per n: (size_bytes, time_s) points, "
                          "sizes increasing. A group of n ranks inside one node reads its all-reduce from n's curve "
                          "(log-log) and its reduce-scatter and all-gather as half of it (NCCL's ring all-reduce is "
                          "a reduce-scatter, then an all-gather); below the curve's sizes the link model holds, never "
                          "above the smallest measured time; above them, the last point's bandwidth. A rank count "
                          "without a curve, and any group across nodes, uses the link model.",
    )
    p2p_bandwidth_gbps: float = Field(description="Send/recv bandwidth of one GPU pair, GB/s.", **_GBPS)
    p2p_latency_s: float = Field(**_SECONDS)
    partial_node_efficiency: float | None = Field(
        None, gt=0, le=1,
        description="The share of its routed bus bandwidth an inter-node ring keeps when its group holds more than "
                    "one but not every GPU of each node (the data-parallel groups of TP 2 and TP 4 on 8-GPU nodes): "
                    "NCCL's rings of such a communicator leave and enter a node through NICs its members do not "
                    "sit beside, while sibling groups use the same NICs at once. None: 1, not modelled.")

    @model_validator(mode="after")
    def _curves_are_curves(self) -> "LinkParams":
        if self.ramp_curve is not None:
            _check_curve("ramp_curve", self.ramp_curve, "fraction", lambda f: _FRACTION["ge"] <= f <= 1,
                         "fractions of the maximum from 1e-6 to 1")
        for kind, c in (self.kind_factors or {}).items():
            if kind not in ("all_gather", "reduce_scatter", "all_to_all"):
                raise ValueError(f"kind_factors has {kind!r}; use all_gather, reduce_scatter or all_to_all (the link "
                                 "itself is the all-reduce's)")
            _check_curve(f"kind_factors[{kind!r}]", c, "factor", lambda f: 0.01 <= f <= 100, "factors from 0.01 to 100")
        for kind, c in (self.isolated_factors or {}).items():
            if kind not in ("all_reduce", "all_gather", "reduce_scatter"):
                raise ValueError(f"isolated_factors has {kind!r}; use all_reduce, all_gather or reduce_scatter")
            _check_curve(f"isolated_factors[{kind!r}]", c, "factor", lambda f: 0.01 <= f <= 1, "factors from 0.01 to 1")
        for ranks, c in (self.all_reduce_curves or {}).items():
            if not 2 <= ranks <= 1024:
                raise ValueError(f"all_reduce_curves has a curve for {ranks} ranks; a curve is for 2 to 1024 ranks")
            _check_curve(f"all_reduce_curves[{ranks}]", c, "time_s", lambda t: 0 < t <= 1e3, "times from 0 to 1000 s")
        return self

    def kind_factor(self, kind: str, nbytes: float) -> float:
        """The measured correction of collectives of ``kind`` at ``nbytes`` (1 where none was measured)."""
        return _factor_at(self.kind_factors, kind, nbytes)

    def isolated_factor(self, kind: str, nbytes: float) -> float:
        """The share of its in-loop time a call of ``kind`` at ``nbytes`` takes with the ranks still together (1 where
        none was measured)."""
        return _factor_at(self.isolated_factors, kind, nbytes)


def _factor_at(curves: dict[str, tuple[tuple[float, float], ...]] | None, kind: str, nbytes: float) -> float:
    curve = (curves or {}).get(kind)
    return interpolate_log_log(curve, nbytes) if curve else 1.0


class HostParams(_Block):
    """CPU time the training process spends issuing work, which the device waits for when its own
    work is shorter (little work per GPU: small hidden sizes, micro-batch 1, wide TP).

    Each op of the layer graph costs the host ``op_s`` in the forward (Python module code,
    autograd recording, dispatch, the kernel launch) and ``backward_op_s`` when the autograd
    engine issues it; an NCCL (or gloo) collective costs ``collective_s``. On an asynchronous
    device (CUDA streams) the host runs ahead and a span takes the longer of its host and device
    times; a synchronous one (a CPU) pays both. Megatron drains the queue at every pipeline
    exchange (``torch.cuda.synchronize`` after the batched send/receive) and when each micro-batch's
    data is broadcast, so every pipeline step starts from an empty queue.
    """

    op_s: float = Field(description="Host time per forward op (recompute included), s.", **_SECONDS)
    backward_op_s: float = Field(
        description="Host time per op the autograd engine issues in the backward, s.", **_SECONDS)
    collective_s: float = Field(
        description="Host time per collective call (tensor-parallel, data-parallel), s.", **_SECONDS)
    pipeline_exchange_s: float = Field(description="Host time of one pipeline send/receive exchange, s.", **_SECONDS)
    micro_batch_s: float = Field(
        description="Host time per forward step outside the layers: the micro-batch's data, masks, loss, schedule, s.",
        **_SECONDS)
    iteration_s: float = Field(
        description="Host time per iteration outside the steps: optimizer bookkeeping, gradient-norm sync, s.",
        **_SECONDS)


class CollectiveParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    nvlink: LinkParams
    network: LinkParams
