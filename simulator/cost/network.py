"""The cluster as a graph, and the bandwidth a ring collective gets when routed over it.

Vertices are GPUs, each node's NVSwitch, the compute NICs (one per rail), the rail-optimised leaf
switches of each scalable unit (one per rail: same-rail NICs of an SU are one switch apart) and
the spine. Edges are directed (links are full duplex) with capacities from the ``ClusterSpec``.

A "node" of this graph is an NVLink domain as a job fills it (``ClusterSpec.ranks_per_nvlink_domain``):
an HGX board, or the trays of a GB200 NVL72 rack the job takes, whose GPUs reach each other through
the NVLink switches and leave it through their NICs. Where the domain is the node the two are the same.

A ring collective is a set of rings (NCCL channels); each step every rank sends to its ring
successor over the shortest path. Every sibling group of the same shape (e.g. the TP=8 data-
parallel groups, one per TP rank) runs at the same time, so the flows of all of them are counted
on every edge; a channel gets the smallest (capacity x efficiency / flows) along its flows, and
the ring's bus bandwidth is the sum over its channels. The efficiency per link class is the
fitted large-message bus bandwidth over the line rate (NCCL protocol overheads).

Routing the graph GPU by GPU (``Network._route_all``) is the definition; an estimate never does it
past one node. A group whose members are whole nodes apart, or share whole nodes, is costed from
its two-node image; any other (a stride neither a multiple nor a divisor of a node's GPUs, or a
last node the group only partly fills) from the same routes and flows in closed form
(``_SiblingRings``), which the tests compare with the graph field by field.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable
from dataclasses import dataclass

import networkx as nx

from simulator.spec.hardware import ClusterSpec

NVLINK = "nvlink"
NETWORK = "network"


def _gpu(r: int) -> tuple:
    return ("gpu", r)


def _tier(cluster: ClusterSpec) -> tuple[int, int, int]:
    """(GPUs, NICs, per scalable unit) of the graph's node: the NVLink domain as a job fills it."""
    return cluster.ranks_per_nvlink_domain, cluster.nics_per_nvlink_domain, cluster.nvlink_domains_per_scalable_unit


def build_network(cluster: ClusterSpec, num_gpus: int) -> nx.DiGraph:
    """The graph of the whole NVLink domains holding ``num_gpus`` GPUs (GPU ranks are domain-major)."""
    gpn, nics, su_size = _tier(cluster)
    nodes = -(-num_gpus // gpn)
    nic_gbps = cluster.nic_line_rate_gbit_s / 8
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
            rail = local * nics // gpn
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
        gpn = self.cluster.ranks_per_nvlink_domain
        nodes = -(-num_gpus // gpn)
        if nodes not in self._graphs:
            self._graphs[nodes] = build_network(self.cluster, nodes * gpn)
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
        depends on N and on whether it crosses scalable units, which is counted directly. Any other
        group over more than a node is evaluated in closed form from the nodes near its two ends and
        one period of its middle. The cost is then independent of the job's size.
        """
        assert size > 1 and stride > 0
        gpn = self.cluster.ranks_per_nvlink_domain
        if stride % gpn == 0 and (size, stride) != (2, gpn):
            image = self.ring(2, gpn)  # one member per node, every GPU of the node in a sibling group
            return RingShape(image.busbw_gbps, image.bottleneck_class, size, 1, self._hops(size, stride))
        if stride < gpn and gpn % stride == 0 and size * stride > 2 * gpn and (size * stride) % gpn == 0:
            per_node = gpn // stride
            image = self.ring(2 * per_node, stride)
            return RingShape(image.busbw_gbps, image.bottleneck_class, size // per_node, per_node,
                             self._hops(size, stride))
        if size * stride <= gpn:  # one node: its graph is the two-node image's size or less
            return self._route_all(size, stride)
        return _SiblingRings(self.cluster, self.efficiency, size, stride).shape()

    def _hops(self, size: int, stride: int) -> int:
        """IB switches on the longest inter-node hop of the ring: the rail's leaf, or leaf-spine-leaf
        when the group's nodes span scalable units."""
        gpn, _, su = _tier(self.cluster)
        first, last = 0, (size - 1) * stride // gpn
        return 1 if first // su == last // su else 3

    def _route_all(self, size: int, stride: int) -> RingShape:
        """Route every ring of every sibling group over the graph of the whole nodes they span: the
        reference ``_SiblingRings`` is tested against (about 0.1 ms and 5 KB per GPU spanned)."""
        gpn = self.cluster.ranks_per_nvlink_domain
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


class _SiblingRings:
    """A group of ``size`` ranks ``stride`` apart and all its siblings (ranks [0, size x stride); offset o
    holds o, o + stride, ...), with the flows their rings put on every link, in closed form: what
    ``Network._route_all`` finds by routing the whole job's graph GPU by GPU, at a cost set by the
    node and the scalable unit rather than by the job.

    - A path depends only on the two GPUs' rails, whether they share a node or a unit, and the unit's
      node count (``_path``).
    - A node's links carry only hops that start or end on it, a unit's uplinks only hops that leave or
      enter it, and a hop that does not wrap round its ring jumps at most ``reach`` nodes.
    - Away from where rings wrap (the first members of the groups, their last nodes) the flows on a
      node's links, relative to it, are those of any node with the same key: which members it holds
      and whether it is an odd node of its groups (both repeat every lcm(stride, 2 nodes) ranks),
      which of its ring neighbours share its unit, and how many nodes its unit has. Keys repeat every
      lcm(stride, unit, 2 nodes) ranks, so a ring's bottleneck is among the segments (group 0's hops
      off one of its nodes) of the two ends and one period, each distinct segment evaluated once.
    """

    def __init__(self, cluster: ClusterSpec, efficiency: dict[str, float], size: int, stride: int):
        self.gpn, self.nics, self.su_nodes = _tier(cluster)
        self.nvswitch = cluster.nvswitch
        self.size, self.stride = size, stride
        self.span = size * stride
        self.nodes = -(-self.span // self.gpn)
        self.wrap_node = (size - 1) * stride // self.gpn  # every group's last member is on this node or later
        self.reach = -(-stride // self.gpn)  # nodes a hop that does not wrap can jump
        self.deltas = tuple(sorted({stride // self.gpn, self.reach} - {0}))
        nic_gbps = cluster.nic_line_rate_gbit_s / 8
        nvlink_gbps = cluster.nvlink_bandwidth_gbps_per_direction
        # capacity x efficiency in build_network's operand order: a share equals the graph's to the bit
        self._nvswitch_gbps = nvlink_gbps * efficiency[NVLINK]
        self._mesh_gbps = nvlink_gbps / max(self.gpn - 1, 1) * efficiency[NVLINK]
        self._nic_gbps = nic_gbps * efficiency[NETWORK]
        self._spine_gbps = self.su_nodes * nic_gbps * efficiency[NETWORK]
        # a group closer than a node starts on node 0, with a ring per member there (``_channels``)
        self._rings = [self._ring_count(o) for o in range(stride)] if stride < self.gpn else None
        self._node_flows: dict[int, dict[tuple, int]] = {}
        self._su_flows: dict[int, dict[tuple, int]] = {}

    # --- the rings --------------------------------------------------------------------------------

    def _last_node(self, o: int) -> int:
        return (o + (self.size - 1) * self.stride) // self.gpn

    def _on_node(self, o: int, k: int) -> range:
        lo = k * self.gpn
        return range(lo + (o - lo) % self.stride, min(lo + self.gpn, o + (self.size - 1) * self.stride + 1),
                     self.stride)

    def _ring_count(self, o: int) -> int:
        g = len(self._on_node(o, 0))
        return g if g > 1 and self._last_node(o) > 0 else 1

    def _order(self, o: int, c: int, k: int) -> list[int]:
        """Ring c of group o on node k, its k-th node."""
        m = list(self._on_node(o, k))
        m = m[c:] + m[:c]
        return m if k % 2 == 0 else m[::-1]

    def _ring_hops(self, o: int, c: int, k: int) -> list[tuple[int, int]]:
        """The hops of ring c of group o that start on node k."""
        seq = self._order(o, c, k)
        following = self._order(o, c, k + 1 if k < self._last_node(o) else 0)[0]
        return list(zip(seq, seq[1:])) + [(seq[-1], following)]

    def _next(self, r: int) -> int:
        """r's successor in a group with one ring, in member order."""
        return r + self.stride if r + self.stride < self.span else r % self.stride

    def _hops_of(self, k: int) -> list[tuple[int, int]]:
        """Every hop of every ring that starts on node k, or ends there from another node."""
        gpn, s = self.gpn, self.stride
        hops, multi = [], set()
        for r in range(k * gpn, min(k * gpn + gpn, self.span)):
            if self._rings is not None and self._rings[r % s] > 1:
                multi.add(r % s)
                continue
            hops.append((r, self._next(r)))
            p = r - s if r >= s else r + (self.size - 1) * s
            if p // gpn != k:
                hops.append((p, r))
        for o in sorted(multi):
            for c in range(self._rings[o]):
                hops += self._ring_hops(o, c, k)
                hops.append((self._order(o, c, k - 1 if k > 0 else self._last_node(o))[-1], self._order(o, c, k)[0]))
        return hops

    # --- paths and flows --------------------------------------------------------------------------

    def _path(self, a: int, b: int) -> list[tuple]:
        """The path networkx's bidirectional BFS returns between two GPUs on ``build_network``'s graph."""
        gpn, nics, su = self.gpn, self.nics, self.su_nodes
        ka, kb = a // gpn, b // gpn
        if ka == kb:
            return [("gpu", a), ("nvswitch", ka), ("gpu", b)] if self.nvswitch else [("gpu", a), ("gpu", b)]
        ra, rb = a % gpn * nics // gpn, b % gpn * nics // gpn
        ua, ub = ka // su, kb // su
        if ra == rb or ua != ub:
            mid = [("leaf", ua, ra)] if ua == ub else [("leaf", ua, ra), ("spine",), ("leaf", ub, rb)]
            return [("gpu", a), ("nic", ka, ra), *mid, ("nic", kb, rb), ("gpu", b)]
        # Another rail in the same unit: NVLink to the first GPU on the other rail, at the source or at
        # the destination, whichever the search meets first. Through NVSwitches it grows the smaller
        # fringe, and the source's third (its other rails' NICs, the spine, its rail's NICs in the unit)
        # outgrows the destination's second (the node's GPUs and a leaf) when the unit has enough nodes;
        # over a mesh it crosses on the lower of the two rails.
        if self.nvswitch:
            at_source = min(nics, gpn) + min(su, self.nodes - ua * su) - 1 <= gpn
        else:
            at_source = ra > rb
        if at_source:
            x = ka * gpn + -(-rb * gpn // nics)  # the first GPU on rail rb
            via = [("nvswitch", ka)] if self.nvswitch else []
            return [("gpu", a), *via, ("gpu", x), ("nic", ka, rb), ("leaf", ua, rb), ("nic", kb, rb), ("gpu", b)]
        y = kb * gpn + -(-ra * gpn // nics)
        via = [("nvswitch", kb)] if self.nvswitch else []
        return [("gpu", a), ("nic", ka, ra), ("leaf", ua, ra), ("nic", kb, ra), ("gpu", y), *via, ("gpu", b)]

    def _owner(self, e: tuple) -> int | None:
        """The node whose links ``e`` is one of; None for a unit's uplink."""
        a, b = e
        if a[0] == "spine" or b[0] == "spine":
            return None
        v = b if a[0] == "leaf" else a
        return v[1] // self.gpn if v[0] == "gpu" else v[1]

    def _flows_node(self, k: int) -> dict[tuple, int]:
        if k not in self._node_flows:
            flows: dict[tuple, int] = {}
            for a, b in self._hops_of(k):
                path = self._path(a, b)
                for e in zip(path, path[1:]):
                    if self._owner(e) == k:
                        flows[e] = flows.get(e, 0) + 1
            self._node_flows[k] = flows
        return self._node_flows[k]

    def _flows_su(self, u: int) -> dict[tuple, int]:
        """A unit's uplinks; only its nodes within reach of its edges, or where rings wrap, send across."""
        if u not in self._su_flows:
            su, gpn, reach = self.su_nodes, self.gpn, self.reach
            first, last = u * su, min(u * su + su, self.nodes) - 1
            flows: dict[tuple, int] = {}
            for k in range(first, last + 1):
                if first + reach <= k <= last - reach and reach <= k < self.wrap_node:
                    continue
                for a, b in self._hops_of(k):
                    if a // gpn // su != u or b // gpn // su != u:
                        path = self._path(a, b)
                        for e in zip(path, path[1:]):
                            if self._owner(e) is None and (e[0][0] == "leaf" and e[0][1] == u
                                                           or e[1][0] == "leaf" and e[1][1] == u):
                                flows[e] = flows.get(e, 0) + 1
            self._su_flows[u] = flows
        return self._su_flows[u]

    def _share(self, e: tuple) -> tuple[float, str]:
        a, b = e
        k = self._owner(e)
        if k is None:
            return self._spine_gbps / self._flows_su((a if a[0] == "leaf" else b)[1])[e], NETWORK
        if a[0] == "nvswitch" or b[0] == "nvswitch":
            return self._nvswitch_gbps / self._flows_node(k)[e], NVLINK
        if a[0] == b[0] == "gpu":
            return self._mesh_gbps / self._flows_node(k)[e], NVLINK
        return self._nic_gbps / self._flows_node(k)[e], NETWORK

    # --- group 0's rings --------------------------------------------------------------------------

    def _node(self, j: int) -> int:
        """Group 0's j-th segment's node: its j-th node, or its j-th member's when they are a node apart."""
        return j if self._rings is not None else j * self.stride // self.gpn

    def _segment(self, j: int) -> list[tuple[float, str]]:
        """Per ring of group 0, the smallest share along its hops that start on the segment's node."""
        k = self._node(j)
        if self._rings is None or self._rings[0] == 1:
            rings = [[(r, self._next(r)) for r in self._on_node(0, k)]]
        else:
            rings = [self._ring_hops(0, c, k) for c in range(self._rings[0])]
        out = []
        for hops in rings:
            paths = [self._path(a, b) for a, b in hops]
            out.append(min(self._share(e) for path in paths for e in zip(path, path[1:])))
        return out

    def _bulk(self, k: int) -> bool:
        """No ring wraps on node k or on a node a hop from it reaches: its key describes its links."""
        return self.reach <= k <= self.wrap_node - 2

    def _node_key(self, k: int) -> tuple:
        su = self.su_nodes
        u = k // su
        phase = ((k * self.gpn) % self.stride, k % 2) if self._rings is not None else ()
        return (phase, min(su, self.nodes - u * su),
                tuple(((k + d) // su == u, (k - d) // su == u) for d in self.deltas))

    def _su_key(self, u: int) -> tuple:
        first = u * self.su_nodes
        if self._bulk(first) and self._bulk(first + self.su_nodes - 1):
            return ("bulk", self._node_key(first)[0])
        return ("at", u)

    def _segment_key(self, j: int) -> tuple:
        k = self._node(j)
        r = self._on_node(0, k)[-1]  # the member whose hop leaves the node (the only one, a node apart)
        d = k + 1 if self._rings is not None else (r + self.stride) // self.gpn
        if not (self._bulk(k) and self._bulk(d)):
            return ("at", j)
        key = (r % self.gpn, self._node_key(k), d - k, self._node_key(d))
        if k // self.su_nodes != d // self.su_nodes:
            key += (self._su_key(k // self.su_nodes), self._su_key(d // self.su_nodes))
        return key

    def _segments(self) -> Iterable[int]:
        """Group 0's segments that hold every key: those up to the first unit of bulk nodes, one period,
        and those after the last such unit."""
        gpn, su, s = self.gpn, self.su_nodes, self.stride
        count = self.wrap_node + 1 if self._rings is not None else self.size
        lo = -(-self.reach // su) * su
        hi = (self.wrap_node - 1) // su * su - 1 - self.reach  # a segment up to here ends in a unit of bulk nodes
        if self._rings is None:
            lo, hi = -(-lo * gpn // s), ((hi + 1) * gpn - 1) // s
        if hi < lo:
            return range(count)
        period = math.lcm(s, su * gpn, 2 * gpn) // (gpn if self._rings is not None else s)
        return itertools.chain(range(lo), range(lo, min(hi + 1, lo + period)), range(hi + 1, count))

    def shape(self) -> RingShape:
        best, seen = None, set()
        for j in self._segments():
            key = self._segment_key(j)
            if key not in seen:
                seen.add(key)
                seg = self._segment(j)
                best = seg if best is None else [min(x, y) for x, y in zip(best, seg)]
        total, bottleneck, worst = 0.0, NVLINK, float("inf")
        for share, cls in best:
            total += share
            if share < worst:
                worst, bottleneck = share, cls
        nodes = self.wrap_node + 1 if self._rings is not None else self.size
        hops = 0 if nodes == 1 else (3 if self.wrap_node >= self.su_nodes else 1)
        return RingShape(total, bottleneck, nodes, self.size // nodes, hops)
