"""NVLink domains larger than a node: collectives and the rank layout read the tier a group spans."""

from __future__ import annotations

import networkx as nx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.cost.collectives import CollectiveModel, Group
from simulator.cost.network import NETWORK, NVLINK, Network, _SiblingRings
from simulator.cost.profile import load_profile
from simulator.graph.layers import CollectiveKind as K
from simulator.spec.errors import ConfigError
from simulator.spec.hardware import ClusterSpec, load_cluster
from simulator.spec.layout import RankLayout

NVL72 = load_cluster("gb200-nvl72")
HGX = load_cluster("dgx-b200")
GIB = 2**30


def _model(cluster: ClusterSpec) -> CollectiveModel:
    return CollectiveModel(cluster, load_profile(f"{cluster.gpu.name.lower()}-published"))


def _with(cluster: ClusterSpec, **update) -> ClusterSpec:
    """The cluster with some numbers changed (their declared ranges dropped, each new number given a source)."""
    sources = {**cluster.sources, **{k: "changed for the test" for k in update}}
    return ClusterSpec.model_validate({**cluster.model_dump(), "ranges": {}, "sources": sources, **update})


def test_an_nvl72_job_fills_16_trays_of_each_rack():
    assert (NVL72.gpus_per_node, NVL72.nvlink_domain_gpus, NVL72.nodes_per_nvlink_domain) == (4, 72, 18)
    assert (NVL72.ranks_per_nvlink_domain, NVL72.nics_per_nvlink_domain) == (64, 64)
    assert NVL72.nvlink_domains_per_scalable_unit == 8
    assert (HGX.ranks_per_nvlink_domain, HGX.nvlink_domain_spans_nodes) == (8, False)


def test_tp16_all_reduce_runs_on_nvlink_in_an_nvl72_domain_and_crosses_infiniband_on_hgx():
    nvl, hgx = _model(NVL72).network.ring(16, 1), _model(HGX).network.ring(16, 1)
    assert (nvl.nodes, nvl.bottleneck_class, nvl.switch_hops) == (1, NVLINK, 0)
    assert (hgx.nodes, hgx.bottleneck_class) == (2, NETWORK) and hgx.switch_hops >= 1
    fast = _model(NVL72).time_s(K.all_reduce, GIB, Group(16))
    slow = _model(HGX).time_s(K.all_reduce, GIB, Group(16))
    # NVLink's measured ring against eight 400 Gb/s rails (nccl-tests: about 396 GB/s over two HGX H100 nodes)
    assert slow > 1.5 * fast


def test_ep64_all_to_all_inside_one_nvl72_domain_never_touches_a_nic():
    model = _model(NVL72)
    graph = model.network.graph(64)
    members = range(64)
    classes = {graph.edges[e]["link_class"] for a in members for b in members if a != b
               for e in zip(*(lambda p: (p, p[1:]))(nx.bidirectional_shortest_path(graph, ("gpu", a), ("gpu", b))))}
    assert classes == {NVLINK}
    assert model.network.ring(64, 1).nodes == 1
    # not a byte leaves through a NIC: the time does not move when the NICs are a thousand times slower
    crippled = _model(_with(NVL72, nic_line_rate_gbit_s=0.4))
    for nbytes in (4e3, 2**20, GIB):
        assert crippled.time_s(K.all_to_all, nbytes, Group(64)) == model.time_s(K.all_to_all, nbytes, Group(64))
    # an EP 64 group spread over domains (one member in each) sends all but 1/64 of its buffer through NICs
    assert crippled.time_s(K.all_to_all, GIB, Group(64, 64)) > 100 * model.time_s(K.all_to_all, GIB, Group(64))


def test_a_domain_is_routed_as_a_node_of_its_size():
    """The graph of a cluster whose NVLink domain spans nodes is the graph of one whose nodes are that domain."""
    big = _with(NVL72, gpus_per_node=64, nics_per_node=64, nvlink_domain_gpus=None, nvlink_segment_nodes=None,
                fabric=NVL72.fabric.model_copy(update={"nodes_per_scalable_unit": 8}))
    domain, node = _model(NVL72), _model(big)
    for size, stride in [(2, 1), (16, 1), (64, 1), (8, 8), (16, 64), (32, 4), (12, 3), (72, 1), (9, 64), (20, 48)]:
        assert domain.network.ring(size, stride) == node.network.ring(size, stride), (size, stride)
        for kind in (K.all_reduce, K.all_gather, K.all_to_all, K.send_recv):
            assert domain.time_s(kind, 3e8, Group(size, stride)) == node.time_s(kind, 3e8, Group(size, stride))


_DOMAINS = st.tuples(st.sampled_from([1, 2, 4]), st.integers(2, 4), st.integers(1, 4), st.integers(1, 3))


@settings(max_examples=40, deadline=None)
@given(shape=_DOMAINS, size=st.integers(2, 24), stride=st.integers(1, 9), efficiency=st.floats(0.3, 1.0))
def test_closed_form_rings_match_routing_every_gpu_over_domains_of_several_nodes(shape, size, stride, efficiency):
    gpn, nodes_per_domain, nics, domains_per_su = shape
    fabric = NVL72.fabric.model_copy(update={"nodes_per_scalable_unit": nodes_per_domain * domains_per_su})
    cluster = _with(NVL72, gpus_per_node=gpn, nics_per_node=min(nics, gpn), nvlink_domain_gpus=gpn * nodes_per_domain,
                    nvlink_segment_nodes=None, fabric=fabric)
    if size * stride <= cluster.ranks_per_nvlink_domain:
        return  # one domain: routed, not in closed form
    eff = {NVLINK: efficiency, NETWORK: efficiency * 0.9}
    assert _SiblingRings(cluster, eff, size, stride).shape() == Network(cluster, eff)._route_all(size, stride)


def test_a_cluster_file_without_a_domain_keeps_the_node_as_its_nvlink_tier():
    h100 = load_cluster("dgx-h100")
    assert h100.nvlink_domain_gpus is None and h100.ranks_per_nvlink_domain == h100.gpus_per_node == 8
    named = _with(h100, nvlink_domain_gpus=8)
    plain, same = _model(h100), _model(named)
    for size, stride in [(2, 1), (8, 1), (16, 1), (4, 8), (64, 8), (12, 2), (3, 8)]:
        for kind in K:
            assert same.time_s(kind, 2e6, Group(size, stride)) == plain.time_s(kind, 2e6, Group(size, stride))


@pytest.mark.parametrize("update,match", [
    (dict(nvlink_domain_gpus=70), "nvlink_domain_gpus=70 is not a whole number of nodes of 4 GPUs"),
    (dict(nvlink_segment_nodes=19), "nvlink_segment_nodes=19 must be at most the 18 nodes"),
    (dict(nvswitch=False, gpus_per_node=4), "needs NVLink switches"),
    (dict(fabric={"kind": "rail-optimized-fat-tree", "nodes_per_scalable_unit": 100,
                  "leaf_switches_per_scalable_unit": 8, "switch_latency_ns": 130}),
     "scalable unit of 100 nodes is not a whole number of NVLink domains of 18 nodes"),
])
def test_a_domain_that_does_not_fit_the_nodes_is_refused_in_one_sentence(tmp_path, update, match):
    from simulator.spec.hardware import GpuSpec  # noqa: F401  (the file names its GPU by name)
    import yaml
    data = {**NVL72.model_dump(mode="json", exclude={"gpu", "reliability", "storage"}), "gpu": "GB200-186GB", **update}
    data.pop("ranges")
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match=match):
        load_cluster(str(path))


def test_pipeline_sends_leave_only_where_stages_meet_across_domains():
    # TP 8 x DP 2 stages of 16 ranks: four stages share each domain of 64, so only every fourth boundary leaves it
    nvl = RankLayout(8, 1, 2, 8, 4, nvlink_domain=64)
    assert [nvl.pipeline_boundary(s, 4) for s in range(8)] == [(False, 1)] * 3 + [(True, 1)] + [(False, 1)] * 3 + [
        (True, 1)]
    hgx = RankLayout(8, 1, 2, 8, 8)  # the same stages on 8-GPU nodes: every boundary crosses InfiniBand
    assert all(hgx.pipeline_boundary(s, 8)[0] for s in range(8))
    assert nvl.within_nvlink_domain("tp") and nvl.within_nvlink_domain("dp") and not nvl.within_node("dp")


def test_the_layout_of_a_job_reads_the_domain_a_job_fills():
    from simulator.spec.catalog import load_model
    from simulator.spec.plan import Job, ParallelPlan

    def job(cluster, **plan):
        return Job(model=load_model("llama3-405b"), cluster=cluster, plan=ParallelPlan(**plan))

    layout = RankLayout.of(job(NVL72, tensor_parallel_size=16, data_parallel_size=8, sequence_parallel=True,
                               global_batch_size=8))
    assert (layout.gpus_per_node, layout.domain_size) == (4, 64)
    assert RankLayout.of(job(HGX, tensor_parallel_size=8, global_batch_size=1)).nvlink_domain is None
    with pytest.raises(ValueError, match="tensor_parallel_size=16 is more than the 8 GPUs per node of dgx-b200"):
        job(HGX, tensor_parallel_size=16, sequence_parallel=True, global_batch_size=1)
    with pytest.raises(ValueError, match="more than the 64 GPUs a job takes of an NVLink domain of gb200-nvl72"):
        job(NVL72, tensor_parallel_size=128, sequence_parallel=True, global_batch_size=1)
