"""The cluster as a graph, and the bandwidth a ring collective gets when routed over it.

Vertices are GPUs, each node's NVSwitch, the compute NICs (one per rail), the rail-optimised leaf
switches of each scalable unit (one per rail: same-rail NICs of an SU are one switch apart) and
the spine. Edges are directed (links are full duplex) with capacities from the ``ClusterSpec``.

A ring collective is a set of rings (NCCL channels); each step every rank sends to its ring
successor over the shortest path. Every sibling group of the same shape (e.g. the TP=8 data-
parallel groups, one per TP rank) runs at the same time, so the flows of all of them are counted
on every edge; a channel gets the smallest (capacity x efficiency / flows) along its flows, and
the ring's bus bandwidth is the sum over its channels. The efficiency per link class is the
fitted large-message bus bandwidth over the line rate (NCCL protocol overheads).
"""

from __future__ import annotations

from dataclasses import dataclass

import networkx as nx

from simulator.hardware import ClusterSpec

NVLINK = "nvlink"
NETWORK = "network"


def _gpu(r: int) -> tuple:
    return ("gpu", r)


def build_network(cluster: ClusterSpec, num_gpus: int) -> nx.DiGraph:
    """The graph of the whole nodes holding ``num_gpus`` GPUs (GPU ranks are node-major)."""
    gpn = cluster.gpus_per_node
    nodes = -(-num_gpus // gpn)
    nic_gbps = cluster.nic_line_rate_gbit_s / 8
    su_size = cluster.fabric.nodes_per_scalable_unit
    g = nx.DiGraph()

    def link(a, b, cap: float, cls: str) -> None:
        g.add_edge(a, b, capacity_gbps=cap, link_class=cls)
        g.add_edge(b, a, capacity_gbps=cap, link_class=cls)

    g.add_node(("spine",), switch=True)
    for node in range(nodes):
        su = node // su_size
        if cluster.nvswitch:
            g.add_node(("nvswitch", node), switch=False)  # NVLink hops are not IB switch hops
        for local in range(gpn):
            r = node * gpn + local
            if cluster.nvswitch:
                link(_gpu(r), ("nvswitch", node), cluster.nvlink_bandwidth_gbps_per_direction, NVLINK)
            else:  # direct NVLink mesh: a GPU's links split evenly over its peers
                for peer in range(node * gpn, r):
                    link(_gpu(r), _gpu(peer), cluster.nvlink_bandwidth_gbps_per_direction / max(gpn - 1, 1), NVLINK)
            rail = local * cluster.nics_per_node // gpn
            nic = ("nic", node, rail)
            link(_gpu(r), nic, nic_gbps, NETWORK)
            leaf = ("leaf", su, rail)
            if leaf not in g:
                g.add_node(leaf, switch=True)
                # a non-blocking fat tree: a leaf's uplinks match its downlinks
                link(leaf, ("spine",), su_size * nic_gbps, NETWORK)
            if not g.has_edge(nic, leaf):
                link(nic, leaf, nic_gbps, NETWORK)
    return g


@dataclass(frozen=True)
class RingShape:
    """What routing a group's rings over the graph found."""

    busbw_gbps: float  # large-message bus bandwidth of one group with all its siblings running
    bottleneck_class: str  # link class of the edge that limits the ring
    nodes: int  # nodes the group spans
    per_node: int  # members on each node
    switch_hops: int  # IB switches on the longest inter-node hop (0 inside a node)


def group_members(size: int, stride: int, offset: int, block_start: int = 0) -> list[int]:
    """Megatron's rank order: a group is ``size`` ranks ``stride`` apart."""
    return [block_start + offset + i * stride for i in range(size)]


def _sibling_groups(size: int, stride: int, num_gpus: int) -> list[list[int]]:
    block = size * stride
    return [group_members(size, stride, o, b) for b in range(0, num_gpus - block + 1, block) for o in range(stride)]


def _channels(members: list[int], gpn: int) -> list[list[int]]:
    """NCCL-style rings: inside a node members go in order; across nodes, ring c leaves a node from
    its c-th member and enters the next on the same rail (alternate nodes reversed)."""
    by_node: dict[int, list[int]] = {}
    for r in members:
        by_node.setdefault(r // gpn, []).append(r)
    per_node = [by_node[n] for n in sorted(by_node)]
    g = len(per_node[0])
    if len(per_node) == 1 or g == 1:
        return [members]
    rings = []
    for c in range(g):
        ring = []
        for i, local in enumerate(per_node):
            rotated = local[c:] + local[:c]  # starts at member c, ends at member c - 1
            ring.extend(rotated if i % 2 == 0 else rotated[::-1])
        rings.append(ring)
    return rings


def _edges(path: list) -> list[tuple]:
    return list(zip(path[:-1], path[1:]))


class Network:
    """A cluster's graph plus cached ring evaluation per group shape."""

    def __init__(self, cluster: ClusterSpec, efficiency: dict[str, float]):
        self.cluster = cluster
        self.efficiency = dict(efficiency)
        self._graphs: dict[int, nx.DiGraph] = {}
        self._shapes: dict[tuple[int, int], RingShape] = {}
        self._routes: dict[tuple[int, int, int], tuple[tuple, ...]] = {}

    def route(self, graph: nx.DiGraph, src: int, dst: int) -> tuple[tuple, ...]:
        """The edges of the shortest path between two GPUs (deterministic: BFS in insertion order)."""
        key = (graph.number_of_nodes(), src, dst)
        if key not in self._routes:
            self._routes[key] = tuple(_edges(nx.bidirectional_shortest_path(graph, _gpu(src), _gpu(dst))))
        return self._routes[key]

    def graph(self, num_gpus: int) -> nx.DiGraph:
        nodes = -(-num_gpus // self.cluster.gpus_per_node)
        if nodes not in self._graphs:
            self._graphs[nodes] = build_network(self.cluster, nodes * self.cluster.gpus_per_node)
        return self._graphs[nodes]

    def ring(self, size: int, stride: int) -> RingShape:
        key = (size, stride)
        if key not in self._shapes:
            self._shapes[key] = self._evaluate(size, stride)
        return self._shapes[key]

    def _evaluate(self, size: int, stride: int) -> RingShape:
        """Route the group's rings; a group over more than two nodes is routed as its two-node image.

        In a rail-optimised fat tree whose leaf and spine are non-blocking, every node a ring visits
        sees the same traffic: each channel enters and leaves it once, on the rails of its members,
        and the sibling groups that share its nodes do the same. So a group of g members on each
        of N > 2 nodes gets the bandwidth of the same pattern on two nodes; only its latency
        depends on N and on whether it crosses scalable units, which is counted directly. The
        routing cost is then independent of the job's size.
        """
        assert size > 1 and stride > 0
        gpn = self.cluster.gpus_per_node
        if stride % gpn == 0 and (size, stride) != (2, gpn):
            image = self.ring(2, gpn)  # one member per node, every GPU of the node in a sibling group
            return RingShape(image.busbw_gbps, image.bottleneck_class, size, 1, self._hops(size, stride))
        if stride < gpn and gpn % stride == 0 and size * stride > 2 * gpn and (size * stride) % gpn == 0:
            per_node = gpn // stride
            image = self.ring(2 * per_node, stride)
            return RingShape(image.busbw_gbps, image.bottleneck_class, size // per_node, per_node,
                             self._hops(size, stride))
        return self._route_all(size, stride)

    def _hops(self, size: int, stride: int) -> int:
        """IB switches on the longest inter-node hop of the ring: the rail's leaf, or leaf-spine-leaf
        when the group's nodes span scalable units."""
        gpn, su = self.cluster.gpus_per_node, self.cluster.fabric.nodes_per_scalable_unit
        first, last = 0, (size - 1) * stride // gpn
        return 1 if first // su == last // su else 3

    def _route_all(self, size: int, stride: int) -> RingShape:
        gpn = self.cluster.gpus_per_node
        span = size * stride
        world = -(-span // gpn) * gpn  # whole nodes: sibling groups there run at the same time
        g = self.graph(world)
        groups = _sibling_groups(size, stride, world)
        flows: dict[tuple, int] = {}
        channel_edges: list[list[tuple]] = []
        for gi, members in enumerate(groups):
            for ring in _channels(members, gpn):
                edges = [e for a, b in zip(ring, ring[1:] + ring[:1]) for e in self.route(g, a, b)]
                for e in edges:
                    flows[e] = flows.get(e, 0) + 1
                if gi == 0:
                    channel_edges.append(edges)
        total, bottleneck, worst = 0.0, NVLINK, float("inf")
        for edges in channel_edges:
            share, cls = min(
                (g.edges[e]["capacity_gbps"] * self.efficiency[g.edges[e]["link_class"]] / flows[e],
                 g.edges[e]["link_class"]) for e in edges
            )
            total += share
            if share < worst:
                worst, bottleneck = share, cls
        members = groups[0]
        node_ids = sorted({r // gpn for r in members})
        hops = 0
        if len(node_ids) > 1:
            for a, b in zip(members, members[1:] + members[:1]):
                if a // gpn != b // gpn:
                    hops = max(hops, sum(1 for _, v in self.route(g, a, b) if g.nodes[v].get("switch")))
        return RingShape(total, bottleneck, len(node_ids), size // len(node_ids), hops)
