"""The layer graph: the ops Megatron runs, their bytes, and what does not depend on what."""

import pytest

import networkx as nx

from simulator.graph.layers import (
    FP32_BYTES,
    LayerKey,
    OpKind,
    _dims,
    embedding_extras,
    layer_graph,
    layer_modules,
    ordered_ops,
    output_extras,
    transformer_layer,
)
from simulator.graph.modules import build_backward, build_forward
from simulator.graph.ops import GraphBuilder, Op
from simulator.spec.catalog import PRESETS
from simulator.spec.model import ModelSpec
from simulator.spec.plan import ParallelPlan, Precision

GPT3 = PRESETS["gpt3-175b"]


def plan(**kw) -> ParallelPlan:
    """Korthikanti's GPT-3 175B layer: TP 8 and Megatron's own (unfused) attention unless asked."""
    kw.setdefault("global_batch_size", kw.get("micro_batch_size", 1))
    kw.setdefault("attention_backend", "unfused")
    return ParallelPlan(tensor_parallel_size=8, **kw)


def ops(graph) -> dict:
    return {op.name: op for op in ordered_ops(graph)}


def test_cross_entropy_casts_logits_to_fp32_only_when_they_are_not():
    bf16, fp32 = (ops(output_extras(GPT3, plan(precision=p)).forward) for p in (Precision.bf16, Precision.fp32))
    assert "cross_entropy.cast" in bf16 and "cross_entropy.cast" not in fp32
    logits = GPT3.seq_length * GPT3.vocab_size // 8
    # the fp32 passes (max, subtract, exp, sum, divide) move the same bytes in both: five reads, three writes
    passes = ("max", "subtract", "exp", "sum", "divide")
    for graph in (bf16, fp32):
        assert sum(graph[f"cross_entropy.{p}"].bytes_moved for p in passes) == 8 * FP32_BYTES * logits
    # and each of the max, the target logit and the sum of exponentials is all-reduced over TP, one fp32 a token
    reduces = [op for op in fp32.values() if op.kind is OpKind.collective and op.name.startswith("cross_entropy")]
    assert [op.collective.bytes for op in reduces] == [GPT3.seq_length * FP32_BYTES] * 3
    assert fp32["cross_entropy.divide"].saves[0].name == "cross_entropy.softmax"


def test_embedding_weight_gradient_walks_the_whole_table_whatever_the_tokens():
    # the dense gradient is zeroed and added to main_grad over vocab / t rows, however few tokens hit it
    one, four = (ops(embedding_extras(GPT3, plan(micro_batch_size=b)).backward) for b in (1, 4))
    for name in ("embedding.grad_zero", "embedding.grad_accumulate"):
        assert one[name].bytes_moved == four[name].bytes_moved > 0
    assert four["embedding.backward"].bytes_moved == 4 * one["embedding.backward"].bytes_moved


def test_selective_recompute_replays_the_context_copy_with_the_core_attention():
    layer = transformer_layer(GPT3, plan(recompute={"granularity": "selective"}))
    assert "recompute.attention_context.copy" in ops(layer.recompute)
    assert "recompute.qkv.bias_add" not in ops(layer.recompute)


@pytest.mark.parametrize("comm", ["p2p", "a2a", "allgather"])
def test_selective_recompute_under_context_parallelism_replays_the_exchanges_with_the_attention(comm):
    """Recomputing the attention needs its keys and values again: every CP exchange of the forward is
    replayed, and nothing else is added to the recompute."""
    p = plan(context_parallel_size=4, cp_comm_type=comm, attention_backend="auto",
             recompute={"granularity": "selective"}, data_parallel_size=1)
    layer = transformer_layer(GPT3, p)
    cp_group = (4, 8)  # four ranks, one TP group (eight ranks) apart
    forward = [o for o in ordered_ops(layer.forward)
               if o.collective is not None and (o.collective.group_size, o.collective.stride) == cp_group]
    replayed = [o for o in ordered_ops(layer.recompute) if o.collective is not None]
    assert forward and [o.collective for o in replayed] == [o.collective for o in forward]


@pytest.mark.parametrize("cp", [2, 4, 8])
def test_ring_attention_masks_only_the_diagonal_block_and_executes_the_causal_share(cp):
    """Under ring attention a rank's own block is the only one the causal mask cuts through; the blocks that
    visit are half squares run whole. Forward and backward each execute this rank's share of the causal
    product (the backward 2.5x), and each op says which phase it is, so its cost reads that phase's terms."""
    dm_s, a, d = GPT3.seq_length, GPT3.num_attention_heads // 8, GPT3.hidden_size // GPT3.num_attention_heads
    layer = transformer_layer(GPT3, plan(context_parallel_size=cp, cp_comm_type="p2p", attention_backend="auto",
                                         data_parallel_size=1))
    causal_share = 4.0 * a * dm_s * dm_s * d / 2 / cp  # micro-batch 1, this TP rank's heads
    for graph, backward, scale in ((layer.forward, False, 1.0), (layer.backward, True, 2.5)):
        blocks = [o for o in ordered_ops(graph) if o.kind is OpKind.flash_attention]
        assert len(blocks) == cp
        assert [o.attention[3] for o in blocks] == [True] + [False] * (cp - 1)
        assert {o.attention[4] for o in blocks} == {backward}
        assert sum(o.flops for o in blocks) == pytest.approx(scale * causal_share, rel=1e-12)


def _totals(graph) -> tuple[float, float, float]:
    o = ordered_ops(graph)
    return (sum(x.flops for x in o), sum(x.bytes_moved for x in o),
            sum(x.collective.bytes for x in o if x.collective is not None))


def test_tp_comm_overlap_only_reorders_the_work():
    """Chunking SP's collectives beside their GEMMs moves no FLOP, byte or saved tensor."""
    base = plan(sequence_parallel=True)
    over = base.model_copy(update={"tp_comm_overlap": True})
    a, b = transformer_layer(GPT3, base), transformer_layer(GPT3, over)
    assert _totals(a.forward) == _totals(b.forward) and _totals(a.backward) == _totals(b.backward)
    assert a.saved_tensors("none") == b.saved_tensors("none")


@pytest.mark.parametrize("sp", [False, True])
def test_several_work_queues_only_move_the_input_gradient_collectives_after_their_gemms(sp):
    """From one CUDA work queue the input-gradient all-reduce (SP: the saved input's all-gather too) starts
    beside the GEMM issued after it; from several it waits for that GEMM. Nothing else changes."""
    import networkx as nx

    one = transformer_layer(GPT3, plan(sequence_parallel=sp))
    eight = transformer_layer(GPT3, plan(sequence_parallel=sp, cuda_device_max_connections=8))
    assert _totals(one.forward) == _totals(eight.forward) and _totals(one.backward) == _totals(eight.backward)
    assert one.saved_tensors("none") == eight.saved_tensors("none")
    reduce = "reduce_scatter" if sp else "all_reduce"
    for name in ("qkv", "fc1"):
        after = nx.ancestors(eight.backward, f"{name}.dgrad_{reduce}")
        assert f"{name}.wgrad" in after and f"{name}.wgrad" not in nx.ancestors(one.backward, f"{name}.dgrad_{reduce}")
        if sp:  # the saved input's gather no longer runs beside dgrad but after it
            assert f"{name}.dgrad" in nx.ancestors(eight.backward, f"{name}.input_all_gather")
            assert f"{name}.dgrad" not in nx.ancestors(one.backward, f"{name}.input_all_gather")


def test_fused_softmax_needs_whole_blocks_of_score_matrices():
    from simulator.graph.layers import fused_softmax_available

    assert fused_softmax_available(2048, 12, True)  # GPT-3 175B on TP 8: 96 / 8 heads, b = 1
    assert not fused_softmax_available(1024, 2, True)  # 16 heads on TP 8, b = 1: Megatron's PyTorch path
    assert not fused_softmax_available(2048, 12, False)  # fp32 scores never take the kernel
    small = ModelSpec(num_layers=2, hidden_size=1024, num_attention_heads=16, seq_length=1024)
    torch_path = ops(transformer_layer(small, plan(precision=Precision.fp16)).forward)
    assert {"softmax.cast_fp32", "softmax.scale", "softmax.mask", "softmax.cast_back"} <= set(torch_path)
    assert torch_path["softmax"].saves[0].dtype_bytes == FP32_BYTES


@pytest.mark.parametrize("name,layout", [
    ("gpt3-175b", dict(tensor_parallel_size=8, sequence_parallel=True, micro_batch_size=2)),
    ("llama3-70b", dict(tensor_parallel_size=4, context_parallel_size=2, attention_backend="auto")),
    ("mixtral-8x7b", dict(tensor_parallel_size=2, sequence_parallel=True, expert_model_parallel_size=4,
                          expert_tensor_parallel_size=1, attention_backend="auto")),
])
def test_only_the_replayed_graph_depends_on_the_recompute_granularity(name, layout):
    """The memory model reads one granularity's graphs for all three, the time model plays one forward and
    one backward for all three, and ``layer_graph`` builds them once for all three: each needs the rest of
    the layer, built afresh from its modules, to be the same under each. The forward is also the same
    whatever order the backward's collectives take (CUDA's work queues)."""
    model = PRESETS[name]
    moe = model.is_moe

    def built(granularity, queues=None):
        p = ParallelPlan(global_batch_size=8, recompute={"granularity": granularity},
                         cuda_device_max_connections=queues, **layout)
        key = LayerKey.of(p, moe)
        modules = layer_modules(model, key, _dims(model, key))
        return (build_forward(modules).graph, build_backward(modules).graph), layer_graph(model, key), \
            embedding_extras(model, p), output_extras(model, p)

    def same(ga, gb):
        return ordered_ops(ga) == ordered_ops(gb) and set(ga.edges) == set(gb.edges)

    none, *others = (built(g) for g in ("none", "selective", "full"))
    queued = built("full", queues=8)
    for other in others:
        assert same(none[0][0], other[0][0]) and same(none[0][1], other[0][1])
        for a, b in zip(none[2:], other[2:]):
            assert same(a.forward, b.forward) and same(a.backward, b.backward)
        assert none[1].input_bytes == other[1].input_bytes
    assert same(none[0][0], queued[0][0])
    for fresh, cached, *_ in (none, *others, queued):  # the cached graphs are the built ones
        assert same(fresh[0], cached.forward) and same(fresh[1], cached.backward)


def test_ops_come_in_the_lexicographic_topological_order_of_their_indices():
    """``ordered_ops`` takes the order by index where every edge runs forward in it; that must be the
    order networkx's lexicographical topological sort gives, and a graph with an edge running backward
    in index order still gets that sort's order."""
    layer = transformer_layer(GPT3, plan(sequence_parallel=True, recompute={"granularity": "selective"}))
    for graph in (layer.forward, layer.backward, layer.recompute):
        index = nx.get_node_attributes(graph, "index")
        expected = [graph.nodes[n]["op"] for n in nx.lexicographical_topological_sort(graph, key=index.get)]
        assert ordered_ops(graph) == expected

    b = GraphBuilder()
    first, second, third = (Op(n, OpKind.elementwise) for n in ("first", "second", "third"))
    b.add(first, after=())
    b.add(second, after=())
    b.add(third, after=())
    b.graph.add_edge("third", "second")  # a dependency against the order the ops were added in
    assert [op.name for op in ordered_ops(b.graph)] == ["first", "third", "second"]
