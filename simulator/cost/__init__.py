"""How long each op, collective and transfer takes: GEMMs (``gemm``), attention (``attention``),
memory-bound kernels (``elementwise``), collectives over NVLink, NVSwitch and InfiniBand (``collectives``,
``network``), tied together by ``CostModel`` over a ``HardwareProfile`` (``profile``, its blocks in
``profile_blocks``: what the hardware achieves, measured or published) and the wait a jittery step adds (``jitter``).

``build_cost_model(cluster, profile, precision)`` ties the hardware spec (peaks, SM count, links)
to a ``HardwareProfile`` (what the hardware achieves) and returns a ``CostModel`` whose answers
are cached, since the plan search asks the same questions many times.

May import: ``spec``, ``graph``.
"""

from __future__ import annotations

from simulator.cost.attention import attention_time_s
from simulator.cost.collectives import CollectiveModel, Group
from simulator.cost.elementwise import elementwise_time_s
from simulator.cost.gemm import gemm_efficiency, gemm_time_s
from simulator.cost.jitter import expected_max_of_normals
from simulator.cost.profile import HardwareProfile
from simulator.graph.layers import CollectiveKind, GemmShape, Op, OpKind
from simulator.spec.errors import ConfigError, ProfileError
from simulator.spec.hardware import ClusterSpec
from simulator.spec.plan import Precision

FP8_BYTES = 1
TENSOR_CORE_KINDS = (OpKind.gemm, OpKind.batched_gemm, OpKind.flash_attention)  # run on the tensor cores

__all__ = ["TENSOR_CORE_KINDS", "CostModel", "Group", "build_cost_model", "gemm_efficiency", "gemm_time_s"]


def _peak_flops(cluster: ClusterSpec, precision: Precision) -> float:
    peaks = cluster.gpu.peak_tflops
    # fp32 runs on the CUDA cores: PyTorch leaves TF32 matmuls off by default
    return {Precision.bf16: peaks.bf16, Precision.fp16: peaks.fp16, Precision.fp32: peaks.fp32}[precision] * 1e12


class CostModel:
    """Times, in seconds, of the layer graph's ops, of DP/PP collectives and of pipeline transfers."""

    def __init__(self, cluster: ClusterSpec, profile: HardwareProfile, precision: Precision, busy_neighbours: int = 0,
                 devices: int = 1):
        self.cluster = cluster
        self.profile = profile
        self.precision = precision
        self.peak_flops = _peak_flops(cluster, precision)
        # the other devices of the machine computing beside this one: the profile's slowdown is for all of them
        others = cluster.devices_per_host - 1
        self.busy_neighbours = min(busy_neighbours, others)
        self.compute_scale = 1.0 + (profile.host_sharing_slowdown * self.busy_neighbours / others if others else 0.0)
        # a synchronous job of ``devices`` waits at each collective for its slowest device
        self.compute_scale *= 1.0 + profile.device_speed_spread * expected_max_of_normals(devices)
        self.overlap_compute_slowdown = profile.overlap_compute_slowdown
        # a step's ops one after another, not each alone (the optimizer's streaming kernels are timed as it runs them)
        self.in_step_scale = 1.0 + profile.sequence_slowdown
        # tensor-core kernels in a long run: the clock the device holds at its power limit, not a benchmark's burst
        self.tensor_core_scale = 1.0 / profile.sustained_clock_fraction
        self.collectives = CollectiveModel(cluster, profile)
        self._dtype_bytes = precision.activation_bytes
        self._ops: dict[Op, float] = {}
        self.host = profile.host
        self.asynchronous = cluster.gpu.asynchronous

    def host_time_s(self, op: Op, backward: bool = False) -> float:
        """CPU time to issue ``op``: a collective call, or one op of the forward (or of the autograd backward)."""
        h = self.host
        if h is None:
            return 0.0
        if op.kind is OpKind.collective:
            return h.collective_s
        return h.backward_op_s if backward else h.op_s

    def op_time_s(self, op: Op) -> float:
        t = self._ops.get(op)
        if t is None:
            t = self._op_time_s(op)
            if op.kind is not OpKind.collective:
                t *= self.compute_scale
            self._ops[op] = t
        return t

    def step_op_time_s(self, op: Op) -> float:
        """``op`` inside a training step's forward, backward or recompute, among the step's other ops."""
        t = self.op_time_s(op)
        return t if op.kind is OpKind.collective else t * self.in_step_scale

    def synchronised_op_time_s(self, op: Op) -> float:
        """A collective the group issues with only memory-bound ops since its previous one: the ranks are still
        together, so it pays the measured share of its in-loop time that is not waiting for them."""
        c = op.collective
        assert op.kind is OpKind.collective and c is not None, op.name
        return self.op_time_s(op) * self.collectives.isolated_share(c.kind, c.bytes, Group(c.group_size, c.stride))

    def _op_time_s(self, op: Op) -> float:
        t = self._kernel_time_s(op)
        return t * self.tensor_core_scale if op.kind in TENSOR_CORE_KINDS else t

    def _kernel_time_s(self, op: Op) -> float:
        p, gpu = self.profile, self.cluster.gpu
        if op.kind in (OpKind.gemm, OpKind.batched_gemm):
            assert op.gemm is not None, op.name
            s = op.gemm
            if not s.grouped and s.batch > 1:  # separate kernels, e.g. experts without the grouped GEMM
                return s.batch * self._kernel_time_s(Op(op.name, op.kind, flops=op.flops / s.batch,
                                                       gemm=GemmShape(s.m, s.n, s.k, 1, s.accumulate_bytes, s.fp8)))
            if s.fp8:
                return self._fp8_gemm_time_s(s)
            fitted = float(gemm_time_s(p.gemm, self.peak_flops, gpu.sm_count, s.m, s.n, s.k, s.batch,
                                       self._dtype_bytes, s.accumulate_bytes))
            measured = p.gemm.measured_time_s(s.m, s.n, s.k, s.batch, self._dtype_bytes)
            if measured is None:
                return fitted
            # timed writing C; accumulating into a gradient buffer costs what the fitted form adds for it
            plain = float(gemm_time_s(p.gemm, self.peak_flops, gpu.sm_count, s.m, s.n, s.k, s.batch,
                                      self._dtype_bytes)) if s.accumulate_bytes else fitted
            return measured + fitted - plain
        if op.kind is OpKind.elementwise:
            return (float(elementwise_time_s(p.elementwise, gpu.hbm_bandwidth_gbps, op.bytes_moved, op.kernel))
                    if op.bytes_moved else 0.0)
        if op.kind is OpKind.flash_attention:
            assert op.attention is not None, op.name
            _, seq, d, causal, backward = op.attention
            return float(attention_time_s(p.attention_for(op.kernel), self.peak_flops, op.flops, seq, backward, d,
                                          causal))
        if op.kind is OpKind.collective:
            assert op.collective is not None, op.name
            c = op.collective
            return self.collective_time_s(c.kind, c.bytes, Group(c.group_size, c.stride))
        raise AssertionError(f"no cost model for op kind {op.kind}")

    def _fp8_gemm_time_s(self, s: GemmShape) -> float:
        """An FP8 GEMM at the fp8 peak and the profile's fp8 efficiencies; C is written in the activation dtype."""
        gpu, params = self.cluster.gpu, self.profile.gemm_fp8
        if gpu.peak_tflops.fp8 is None:
            raise ConfigError(f"{gpu.name} has no FP8 tensor cores; drop the FP8 format or use a Hopper cluster")
        if params is None:
            raise ProfileError(f"profile {self.profile.name!r} has no FP8 GEMM block (gemm_fp8); use a profile that "
                               "has one, such as the published Hopper profiles, or drop the FP8 format")
        fp8_peak = gpu.peak_tflops.fp8 * 1e12
        t = float(gemm_time_s(params, fp8_peak, gpu.sm_count, s.m, s.n, s.k, s.batch, FP8_BYTES, s.accumulate_bytes,
                              output_dtype_bytes=self._dtype_bytes))
        # FP8 speeds up the tensor-core math and nothing else (launch, epilogue), so no GEMM can beat its
        # own bf16 time by more than the peak ratio; the two blocks' wave terms are fitted to different
        # best shapes and could otherwise claim it for shapes that bf16 tiles badly.
        unscaled = float(gemm_time_s(self.profile.gemm, self.peak_flops, gpu.sm_count, s.m, s.n, s.k, s.batch,
                                     self._dtype_bytes, s.accumulate_bytes))
        return max(t, unscaled * self.peak_flops / fp8_peak)

    def collective_time_s(self, kind: CollectiveKind, nbytes: int, group: Group) -> float:
        return self.collectives.time_s(kind, nbytes, group)

    def busbw_gbps(self, kind: CollectiveKind, nbytes: int, group: Group) -> float:
        return self.collectives.busbw_gbps(kind, nbytes, group)

    def p2p_time_s(self, nbytes: int, inter_node: bool, sharing: int = 1) -> float:
        return self.collectives.p2p_time_s(nbytes, inter_node, sharing)

    def gemm_efficiency(self, m: int, n: int, k: int, batch: int = 1) -> float:
        """Fraction of the dense peak the GEMM reaches in a long run (at the sustained clock)."""
        return float(gemm_efficiency(self.profile.gemm, self.cluster.gpu.sm_count, m, n, k, batch,
                                     self._dtype_bytes)) / self.tensor_core_scale


def busy_neighbours(cluster: ClusterSpec, world_size: int) -> int:
    """How many other devices of a rank's machine a job of ``world_size`` ranks keeps computing: ranks fill a
    machine's devices before the next machine's."""
    return max(0, min(world_size, cluster.devices_per_host) - 1)


def build_cost_model(cluster: ClusterSpec, profile: HardwareProfile, precision: Precision,
                     busy_neighbours: int = 0, devices: int = 1) -> CostModel:
    """The cost model of ``cluster`` running at the speeds of ``profile``, with ``busy_neighbours`` other
    devices of each machine computing beside each device, for a job of ``devices`` devices."""
    if profile.gpu.lower() != cluster.gpu.name.lower():
        raise ProfileError(
            f"profile {profile.name!r} describes GPU {profile.gpu!r} but cluster {cluster.name!r} has "
            f"{cluster.gpu.name!r}; use the profile of {cluster.gpu.name}"
        )
    return CostModel(cluster, profile, precision, busy_neighbours, devices)
