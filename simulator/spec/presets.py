"""The Llama presets: Llama 2 (Touvron et al. 2023b) and Llama 3 (Dubey et al. 2024), as published.

Each is the shape of the released Hugging Face ``config.json`` with Megatron-LM's names: RMSNorm,
a SwiGLU MLP, rotary position embeddings, no biases on the linear layers, no dropout, and an output
layer separate from the word embedding. Llama-2 70B and every Llama-3 model use grouped-query
attention with 8 key/value heads. Sequence lengths are the pre-training contexts (4,096 for Llama 2,
8,192 for Llama 3; the 128K of Llama 3.1 comes from a later long-context stage).

``simulator.spec.catalog`` gathers them in ``PRESETS``.
"""

from __future__ import annotations

from simulator.spec.model import ModelSpec, Normalization, PositionEmbedding


def _gpt(name: str, layers: int, hidden: int, heads: int) -> ModelSpec:
    return ModelSpec(name=name, num_layers=layers, hidden_size=hidden, num_attention_heads=heads)


# Brown et al. 2020, Table 2.1, with Megatron's padded vocabulary (51,200) and sequence 2,048.
# GPT-3 1.3B is listed with 24 heads of 128 (which does not give 2,048); Megatron uses 16 heads of 128.
# GPT-3 13B is listed with d_model 5,140; Megatron uses 5,120 so that 40 heads divide it.
# Korthikanti et al. 2022, Table 3 for 22B, 530B (MT-NLG) and 1T.
GPT_PRESETS: dict[str, ModelSpec] = {
    m.name: m
    for m in (
        _gpt("gpt3-125m", 12, 768, 12),
        _gpt("gpt3-350m", 24, 1024, 16),
        _gpt("gpt3-760m", 24, 1536, 16),
        _gpt("gpt3-1.3b", 24, 2048, 16),
        _gpt("gpt3-2.7b", 32, 2560, 32),
        _gpt("gpt3-6.7b", 32, 4096, 32),
        _gpt("gpt3-13b", 40, 5120, 40),
        _gpt("gpt3-175b", 96, 12288, 96),
        _gpt("megatron-22b", 48, 6144, 64),
        _gpt("mt-nlg-530b", 105, 20480, 128),
        _gpt("megatron-1t", 128, 25600, 160),
    )
}

LLAMA2_VOCAB = 32000  # SentencePiece vocabulary (a multiple of 128, so Megatron does not pad it)
LLAMA3_VOCAB = 128256  # tiktoken-based vocabulary, 1,002 x 128


def llama(name: str, *, layers: int, hidden: int, heads: int, kv_heads: int, ffn: int, vocab: int,
          seq: int, rotary_base: int = 10000) -> ModelSpec:
    """A Llama-style decoder: RMSNorm, SwiGLU, rope (``rotary_base``: its config's rope_theta), untied output
    layer, no biases, no dropout."""
    return ModelSpec(
        name=name, num_layers=layers, hidden_size=hidden, num_attention_heads=heads, num_query_groups=kv_heads,
        ffn_hidden_size=ffn, vocab_size=vocab, seq_length=seq, swiglu=True, normalization=Normalization.rmsnorm,
        position_embedding_type=PositionEmbedding.rope, untie_embeddings_and_output_weights=True,
        add_bias_linear=False, attention_dropout=0.0, hidden_dropout=0.0, rotary_base=rotary_base,
    )


# Parameter counts as published (model cards): 6.74B, 13.0B, 69.0B, 8.03B, 70.6B, 405.9B.
# rope_theta of the released configs: 10,000 for Llama 2, 500,000 for Llama 3 (and 3.1, whose long-context
# rope scaling belongs to the later stage these pre-training contexts leave out).
LLAMA3_ROTARY_BASE = 500_000
LLAMA_PRESETS: dict[str, ModelSpec] = {
    m.name: m
    for m in (
        llama("llama2-7b", layers=32, hidden=4096, heads=32, kv_heads=32, ffn=11008, vocab=LLAMA2_VOCAB, seq=4096),
        llama("llama2-13b", layers=40, hidden=5120, heads=40, kv_heads=40, ffn=13824, vocab=LLAMA2_VOCAB, seq=4096),
        llama("llama2-70b", layers=80, hidden=8192, heads=64, kv_heads=8, ffn=28672, vocab=LLAMA2_VOCAB, seq=4096),
        llama("llama3-8b", layers=32, hidden=4096, heads=32, kv_heads=8, ffn=14336, vocab=LLAMA3_VOCAB, seq=8192,
              rotary_base=LLAMA3_ROTARY_BASE),
        llama("llama3-70b", layers=80, hidden=8192, heads=64, kv_heads=8, ffn=28672, vocab=LLAMA3_VOCAB, seq=8192,
              rotary_base=LLAMA3_ROTARY_BASE),
        llama("llama3-405b", layers=126, hidden=16384, heads=128, kv_heads=8, ffn=53248, vocab=LLAMA3_VOCAB,
              seq=8192, rotary_base=LLAMA3_ROTARY_BASE),
    )
}


# --- mixture-of-experts models, from their Hugging Face configs -----------------------------------
# Published total / active parameters: Mixtral 8x7B 46.7B / 12.9B, 8x22B 141B / 39B (Mistral AI);
# Qwen1.5-MoE-A2.7B (Qwen2-MoE) 14.3B / 2.7B, Qwen2-57B-A14B 57.4B / 14.2B, Qwen3-30B-A3B 30.5B / 3.3B,
# Qwen3-235B-A22B 235B / 22B (Qwen model cards). Sequence lengths are the pre-training contexts.
QWEN_VOCAB = 151936
# rope_theta of the Mixtral and Qwen MoE configs; DeepSeek-V3 keeps 10,000 (with YaRN, not modelled)
MOE_ROTARY_BASE = 1_000_000


def moe(name: str, *, layers: int, hidden: int, heads: int, kv_heads: int, experts: int, topk: int, expert_ffn: int,
        vocab: int, seq: int, shared_ffn: int | None = None, head_dim: int | None = None,
        qk_layernorm: bool = False, dense_ffn: int | None = None, layer_freq: int | tuple[int, ...] = 1,
        rotary_base: int = 10000, qkv_bias: bool = False) -> ModelSpec:
    """A Llama-style decoder whose MLPs are routed experts (and shared experts where the model has them);
    ``dense_ffn`` is the MLP of the layers ``layer_freq`` leaves dense (default the expert size)."""
    base = llama(name, layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads, ffn=dense_ffn or expert_ffn,
                 vocab=vocab, seq=seq, rotary_base=rotary_base)
    return base.model_copy(update=dict(add_qkv_bias=qkv_bias,
        num_experts=experts, moe_router_topk=topk, moe_ffn_hidden_size=expert_ffn,
        moe_shared_expert_intermediate_size=shared_ffn, kv_channels=head_dim, qk_layernorm=qk_layernorm,
        moe_layer_freq=layer_freq))


# DeepSeek-V3 (DeepSeek-AI 2024, its config.json) has multi-head latent attention (MLA), which is not modelled:
# `deepseek-v3-style` keeps its expert layout (61 layers, the first 3 dense with an MLP of 18,432, then 256 routed
# experts of 2,048, top-8, one shared expert of 2,048) with standard attention in MLA's place: 128 heads of 128
# channels (query width 16,384) and grouped-query attention with 8 key/value groups, as Llama-3-405B has.
# Parameters: 674.8B total, 41.4B active, against the published 671B / 37B (which leave out the 14B
# multi-token-prediction module, as this does). MLA's low-rank projections (query rank 1,536, key/value rank 512,
# heads of 128 + 64 rotary channels) hold 187.1M parameters a layer; these projections hold 249.6M, 62.5M more in
# each of 61 layers (+3.8B, all of it active). With MLA's projections the same count gives 671.0B / 37.6B.
# Full multi-head attention (128 key/value groups) would hold 469.8M a layer: 688.3B / 54.8B, further from both.
# The attention core costs heads x 128 channels for the query-key product where MLA's heads have 192 (128 + 64
# rotary), so the score FLOPs are 2/3 of MLA's; the router's sigmoid scores, group-limited routing and
# aux-loss-free balancing are not modelled (its GEMM is the same).
DEEPSEEK_V3_VOCAB = 129280
DEEPSEEK_V3_DENSE_LAYERS = 3


MOE_PRESETS: dict[str, ModelSpec] = {
    m.name: ModelSpec.model_validate(m.model_dump())
    for m in (
        moe("mixtral-8x7b", layers=32, hidden=4096, heads=32, kv_heads=8, experts=8, topk=2, expert_ffn=14336,
            vocab=32000, seq=4096, rotary_base=MOE_ROTARY_BASE),
        moe("mixtral-8x22b", layers=56, hidden=6144, heads=48, kv_heads=8, experts=8, topk=2, expert_ffn=16384,
            vocab=32768, seq=4096, rotary_base=MOE_ROTARY_BASE),
        moe("qwen1.5-moe-a2.7b", layers=24, hidden=2048, heads=16, kv_heads=16, experts=60, topk=4, expert_ffn=1408,
            vocab=QWEN_VOCAB, seq=4096, shared_ffn=5632, rotary_base=MOE_ROTARY_BASE, qkv_bias=True),
        moe("qwen2-57b-a14b", layers=28, hidden=3584, heads=28, kv_heads=4, experts=64, topk=8, expert_ffn=2560,
            vocab=QWEN_VOCAB, seq=4096, shared_ffn=20480, rotary_base=MOE_ROTARY_BASE, qkv_bias=True),
        moe("qwen3-30b-a3b", layers=48, hidden=2048, heads=32, kv_heads=4, experts=128, topk=8, expert_ffn=768,
            vocab=QWEN_VOCAB, seq=4096, head_dim=128, qk_layernorm=True, rotary_base=MOE_ROTARY_BASE),
        moe("qwen3-235b-a22b", layers=94, hidden=4096, heads=64, kv_heads=4, experts=128, topk=8, expert_ffn=1536,
            vocab=QWEN_VOCAB, seq=4096, head_dim=128, qk_layernorm=True, rotary_base=MOE_ROTARY_BASE),
        moe("deepseek-v3-style", layers=61, hidden=7168, heads=128, kv_heads=8, experts=256, topk=8, expert_ffn=2048,
            vocab=DEEPSEEK_V3_VOCAB, seq=4096, shared_ffn=2048, head_dim=128, dense_ffn=18432,
            layer_freq=(0,) * DEEPSEEK_V3_DENSE_LAYERS + (1,) * (61 - DEEPSEEK_V3_DENSE_LAYERS)),
    )
}
