"""The layer graph: the ops Megatron runs, their bytes, and what does not depend on what."""

import pytest

from simulator.graph.layers import FP32_BYTES, OpKind, embedding_extras, ordered_ops, output_extras, transformer_layer
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
    """The memory model reads one granularity's graphs for all three, and the time model plays one
    forward and one backward for all three: each needs the rest of the layer to be the same under each."""
    model = PRESETS[name]
    moe = model.is_moe

    def layer(granularity):
        p = ParallelPlan(global_batch_size=8, recompute={"granularity": granularity}, **layout)
        return transformer_layer(model, p, moe), embedding_extras(model, p), output_extras(model, p)

    none, *others = (layer(g) for g in ("none", "selective", "full"))
    for other in others:
        for a, b in zip(none, other):
            for graph in ("forward", "backward"):
                ga, gb = getattr(a, graph), getattr(b, graph)
                assert ordered_ops(ga) == ordered_ops(gb) and set(ga.edges) == set(gb.edges)
        assert none[0].input_bytes == other[0].input_bytes
