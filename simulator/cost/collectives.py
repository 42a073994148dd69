"""NCCL collective and point-to-point times for a group of GPUs on the cluster graph.

A collective over S bytes (the full buffer: all-reduce size, all-gather output, reduce-scatter
input) on n ranks moves algorithm_factor * S through each rank: 2(n-1)/n for all-reduce, (n-1)/n
for all-gather and reduce-scatter (nccl-tests' bus-bandwidth convention), so

    time = latency + factor * S / busbw(S),   busbw(S) = busbw_max * ramp(S),

with ramp(S) the measured size sweep where there is one (``LinkParams.ramp_curve``), else
S^p / (S^p + half_size^p). A link whose ramp was measured on one ring and is used on others
(the network's: one inter-node sweep, every cluster's rings) states the bus bandwidth it was
measured at, and a ring of bus bandwidth B reads it at S x reference / B: what the ramp hides is a
fill time, which a faster ring covers with more bytes.

Where a profile holds measured all-reduce tables for a group's rank count on one node
(``LinkParams.all_reduce_curves``: nccl-tests on 2-8 A100 GPUs), a group of that size inside a node
reads its time from them instead: the link model's one 8-GPU curve, its latency and ramp scaled to
other ring sizes, misses how the small-message floor of 2-4 GPUs and the 16-256 MiB bandwidth of
8 GPUs were measured on the machines the development sets ran on.

busbw_max comes from routing the group's rings over the network graph; the latency grows with
the inter-node steps a ring (2(N-1) for all-reduce over N nodes) or a tree (2 log2 N) takes, and
with the IB switch hops of each step. Like NCCL, an all-reduce takes the faster of ring and tree,
the tree with log-depth latency and the ring's bandwidth bound. NCCL has no hierarchical
(reduce-scatter, inter-node all-reduce, all-gather) algorithm, and measured two-node all-reduces
stay at the ring's bound (91 GB/s over 4 HDR NICs at 1-8 GB, nccl-tests#100; its maintainers: on
8 NICs the tree "will struggle to get better performance than ring", nccl-tests#196), so a group
spread over nodes is costed as the ring it runs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from simulator.cost.curves import interpolate_log_log
from simulator.cost.network import NETWORK, NVLINK, Network, RingShape
from simulator.cost.profile import HardwareProfile, LinkParams
from simulator.graph.layers import CollectiveKind
from simulator.spec.hardware import ClusterSpec
from simulator.spec.value_cache import ValueCache


@dataclass(frozen=True, slots=True)
class Group:
    """A process group in Megatron's rank order (global rank = tp + t * (dp + d * pp)): ``size`` ranks,
    ``stride`` apart. TP groups have stride 1, DP groups stride t, PP groups stride t * d."""

    size: int
    stride: int = 1

    def __post_init__(self) -> None:
        assert self.size >= 1 and self.stride >= 1, self


def ramp(link: LinkParams, nbytes: float, busbw_gbps: float | None = None) -> float:
    """busbw(S) / busbw_max: the fraction of the large-message bus bandwidth a message of S bytes gets
    on a ring of bus bandwidth ``busbw_gbps`` (which moves the ramp only where the link states the
    bandwidth it was measured at)."""
    if busbw_gbps and link.ramp_reference_busbw_gbps:
        nbytes = nbytes * link.ramp_reference_busbw_gbps / busbw_gbps
    curve = link.ramp_curve
    if curve and curve[0][0] <= nbytes <= curve[-1][0]:
        return interpolate_log_log(curve, nbytes)
    p = link.ramp_exponent
    return 1.0 / (1.0 + (link.half_size_bytes / nbytes) ** p) if link.half_size_bytes > 0 else 1.0


# the kinds a measured all-reduce curve prices: NCCL's ring all-reduce is a reduce-scatter, then an all-gather
_RING_KINDS = (CollectiveKind.all_reduce, CollectiveKind.reduce_scatter, CollectiveKind.all_gather)


def _factor(kind: CollectiveKind, n: int) -> float:
    """Bytes through each rank per byte of the buffer (nccl-tests' bus-bandwidth factor); an all-to-all
    moves (n - 1) / n of its buffer, like an all-gather, but every pair at once: the ring's link bound
    is taken for it."""
    if kind is CollectiveKind.all_reduce:
        return 2.0 * (n - 1) / n
    return (n - 1) / n


_NETWORKS: ValueCache[Network] = ValueCache(maxsize=64)


def _network(cluster: ClusterSpec, nvlink_efficiency: float, network_efficiency: float) -> Network:
    """One routed network per cluster and link efficiencies, shared by every profile that has them
    (the band's variants of a profile change other numbers)."""
    return _NETWORKS.get((cluster.value_key(), nvlink_efficiency, network_efficiency),
                         lambda: Network(cluster, {NVLINK: nvlink_efficiency, NETWORK: network_efficiency}))


class CollectiveModel:
    def __init__(self, cluster: ClusterSpec, profile: HardwareProfile):
        self.cluster = cluster
        self.nvlink: LinkParams = profile.collectives.nvlink
        self.net: LinkParams = profile.collectives.network
        self.network = _network(cluster, min(self.nvlink.max_busbw_gbps / cluster.nvlink_bandwidth_gbps_per_direction, 1.0),
                                min(self.net.max_busbw_gbps / (cluster.nic_line_rate_gbit_s / 8), 1.0))
        self._cache: dict[tuple, float] = {}

    def _step_latency_s(self, shape: RingShape) -> float:
        """One inter-node step: the fitted step latency, plus the switch hops past the first leaf."""
        return self.net.latency_s + max(shape.switch_hops - 1, 0) * self.cluster.fabric.switch_latency_ns * 1e-9

    def _measured_in_node_s(self, kind: CollectiveKind, nbytes: float, group: Group, modelled_s: float) -> float | None:
        """The time a measured all-reduce curve of the group's rank count gives (None where there is none)."""
        curve = (self.nvlink.all_reduce_curves or {}).get(group.size)
        if curve is None or kind not in _RING_KINDS:
            return None
        share = 1.0 if kind is CollectiveKind.all_reduce else 0.5
        smallest_s = curve[0][1]
        if nbytes < curve[0][0]:  # the link model's latency-bound end, held under what the smallest size took
            return min(modelled_s, share * smallest_s)
        if nbytes > curve[-1][0]:  # bandwidth-bound: the last measured rate
            return share * curve[-1][1] * nbytes / curve[-1][0]
        return share * interpolate_log_log(curve, nbytes)

    def _flat(self, kind: CollectiveKind, nbytes: float, group: Group) -> float:
        modelled = self._modelled(kind, nbytes, group)
        if self.nvlink.all_reduce_curves and self.network.ring(group.size, group.stride).nodes == 1:
            measured = self._measured_in_node_s(kind, nbytes, group, modelled)
            if measured is not None:
                return measured
        return modelled

    def _modelled(self, kind: CollectiveKind, nbytes: float, group: Group) -> float:
        shape = self.network.ring(group.size, group.stride)
        params = self.nvlink if shape.bottleneck_class == NVLINK else self.net
        busbw = shape.busbw_gbps
        if shape.nodes > 1 and 1 < shape.per_node < self.cluster.ranks_per_nvlink_domain and params is self.net:
            busbw *= self.net.partial_node_efficiency or 1.0  # a partial-node communicator's NIC paths
        if (kind is CollectiveKind.all_reduce and shape.nodes == 1 and self.nvlink.nvls_max_busbw_gbps
                and group.size == self.cluster.ranks_per_nvlink_domain):
            busbw = self.nvlink.nvls_max_busbw_gbps  # NVLink SHARP reduces in the switch
        bandwidth_s = _factor(kind, group.size) * nbytes / (ramp(params, nbytes, busbw) * busbw * 1e9)
        # a backend whose kinds stray from its all-reduce-derived link (gloo's reduce-scatter) was measured so
        correction = params.kind_factor(kind.value, nbytes) if params.kind_factors else 1.0
        if shape.nodes == 1:
            return (self.nvlink.latency_s + bandwidth_s) * correction
        steps = shape.nodes - 1
        if kind is CollectiveKind.all_reduce:
            ring = 2 * steps
            tree = 2 * math.ceil(math.log2(shape.nodes))
            steps = min(ring, tree)  # NCCL's tree has the ring's bandwidth bound but log-depth latency
        return (self.nvlink.latency_s + steps * self._step_latency_s(shape) + bandwidth_s) * correction

    def time_s(self, kind: CollectiveKind, nbytes: float, group: Group) -> float:
        if group.size == 1 or nbytes <= 0:
            return 0.0
        if kind is CollectiveKind.send_recv:  # every member sends to its ring neighbour at once
            gpn = self.cluster.gpus_per_node
            inter = group.stride * group.size > self.cluster.ranks_per_nvlink_domain
            return self.p2p_time_s(nbytes, inter_node=inter,
                                   sharing=max(1, gpn // self.cluster.nics_per_node) if inter else 1)
        key = (kind, nbytes, group)
        if key not in self._cache:
            shape = self.network.ring(group.size, group.stride)
            if kind is CollectiveKind.all_to_all and shape.nodes > 1:
                self._cache[key] = self._all_to_all_s(nbytes, group, shape)
                return self._cache[key]
            self._cache[key] = self._flat(kind, nbytes, group)
        return self._cache[key]

    def _all_to_all_s(self, nbytes: float, group: Group, shape) -> float:
        """An all-to-all across nodes: every member sends 1/n of its buffer to each other member at once
        (NCCL's grouped sends), so no ring carries it. What is bound for other nodes leaves through the
        node's NICs, which every GPU of the node shares (sibling groups exchange at the same time); the
        rest crosses NVLink; the two run together and the slower sets the time."""
        n, g, c = group.size, shape.per_node, self.cluster
        nic_gbps = c.nic_bandwidth_gbps_per_gpu * min(self.net.max_busbw_gbps / (c.nic_line_rate_gbit_s / 8), 1.0)
        inter_s = nbytes * (n - g) / n / (ramp(self.net, nbytes, nic_gbps * c.ranks_per_nvlink_domain) * nic_gbps * 1e9)
        intra_s = 0.0
        if g > 1:
            local = self.network.ring(g, group.stride)
            intra_s = nbytes * (g - 1) / n / (ramp(self.nvlink, nbytes) * local.busbw_gbps * 1e9)
        return self.nvlink.latency_s + self._step_latency_s(shape) + max(inter_s, intra_s)

    def isolated_share(self, kind: CollectiveKind, nbytes: float, group: Group) -> float:
        """The share of its in-loop time a call takes when the group's ranks are still together from their previous
        call (``LinkParams.isolated_factors``; 1 where the link has none, as NCCL's have)."""
        if kind not in _RING_KINDS or group.size == 1:
            return 1.0
        shape = self.network.ring(group.size, group.stride)
        params = self.nvlink if shape.bottleneck_class == NVLINK else self.net
        return params.isolated_factor(kind.value, nbytes)

    def busbw_gbps(self, kind: CollectiveKind, nbytes: float, group: Group) -> float:
        """Bus bandwidth as nccl-tests reports it, for comparison with published curves."""
        return _factor(kind, group.size) * nbytes / self.time_s(kind, nbytes, group) / 1e9

    def p2p_time_s(self, nbytes: float, inter_node: bool, sharing: int = 1) -> float:
        """One send of ``nbytes``; ``sharing`` sends leave through the same NIC at once (inter-node)."""
        if nbytes <= 0:
            return 0.0
        link = self.net if inter_node else self.nvlink
        share = max(sharing, 1) if inter_node else 1
        return link.p2p_latency_s + nbytes * share / (link.p2p_bandwidth_gbps * 1e9)
