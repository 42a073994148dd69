"""The layer graph: the ops Megatron runs, their bytes, and what does not depend on what."""

from simulator.layers import FP32_BYTES, embedding_extras, ordered_ops, output_extras, transformer_layer
from simulator.model import PRESETS
from simulator.plan import ParallelPlan, Precision

GPT3 = PRESETS["gpt3-175b"]


def plan(**kw) -> ParallelPlan:
    kw.setdefault("global_batch_size", kw.get("micro_batch_size", 1))
    return ParallelPlan(tensor_parallel_size=8, **kw)


def ops(graph) -> dict:
    return {op.name: op for op in ordered_ops(graph)}


def test_cross_entropy_casts_logits_to_fp32_only_when_they_are_not():
    bf16, fp32 = (ops(output_extras(GPT3, plan(precision=p)).forward) for p in (Precision.bf16, Precision.fp32))
    assert "cross_entropy.cast" in bf16 and "cross_entropy.cast" not in fp32
    logits = GPT3.seq_length * GPT3.vocab_size // 8
    # the fp32 passes (max, subtract, exp, sum, divide) move the same bytes in both
    assert bf16["cross_entropy"].bytes_moved == fp32["cross_entropy"].bytes_moved == 8 * FP32_BYTES * logits


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
