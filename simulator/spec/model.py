"""``ModelSpec``: the shape of a GPT, with Megatron-LM's argument names (the presets are ``presets``)."""

from __future__ import annotations

from enum import Enum
from functools import cached_property

from pydantic import BaseModel, ConfigDict, Field, model_validator

from simulator.spec import limits


class Normalization(str, Enum):
    layernorm = "LayerNorm"
    rmsnorm = "RMSNorm"


class PositionEmbedding(str, Enum):
    learned_absolute = "learned_absolute"
    rope = "rope"


class ModelSpec(BaseModel):
    """A decoder-only transformer (GPT-2/GPT-3 style by default; Llama style with the extra fields)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    name: str = Field("custom", description="Label shown in reports.")
    num_layers: int = Field(gt=0, le=limits.MAX_LAYERS, description="Transformer layers, L (Korthikanti Table 1).")
    hidden_size: int = Field(gt=0, le=limits.MAX_HIDDEN_SIZE, description="Hidden size, h.")
    num_attention_heads: int = Field(gt=0, le=limits.MAX_HIDDEN_SIZE, description="Attention heads, a.")
    ffn_hidden_size: int | None = Field(
        None, gt=0, le=limits.MAX_FFN_HIDDEN_SIZE, description="MLP inner size; default 4 x hidden_size."
    )
    vocab_size: int = Field(
        51200, gt=0, le=limits.MAX_VOCAB_SIZE, description="Vocabulary, v (Megatron pads GPT-2's 50,257 to 51,200)."
    )
    seq_length: int = Field(2048, gt=0, le=limits.MAX_SEQ_LENGTH, description="Sequence length, s, in tokens.")
    num_query_groups: int | None = Field(
        None, gt=0, le=limits.MAX_HIDDEN_SIZE,
        description="Key/value heads for grouped-query attention; default = num_attention_heads.",
    )
    swiglu: bool = Field(False, description="Gated SiLU MLP (three weight matrices) instead of GeLU.")
    normalization: Normalization = Field(Normalization.layernorm, description="LayerNorm (weight+bias) or RMSNorm.")
    position_embedding_type: PositionEmbedding = Field(
        PositionEmbedding.learned_absolute, description="Learned absolute table (GPT) or rotary (Llama)."
    )
    untie_embeddings_and_output_weights: bool = Field(
        False, description="Separate output matrix instead of reusing the word embedding."
    )
    add_bias_linear: bool = Field(True, description="Biases on the linear layers (GPT yes, Llama no).")
    add_qkv_bias: bool = Field(
        False, description="Biases on the query/key/value projection alone (Qwen2; Megatron --add-qkv-bias); "
                           "add_bias_linear already includes them.")
    rotary_base: int = Field(
        10000, gt=0, le=limits.MAX_ROTARY_BASE,
        description="Rope's base period theta (Megatron --rotary-base, Hugging Face rope_theta; Llama 3: 500,000).")
    rope_scaling_factor: float | None = Field(
        None, gt=0, le=limits.MAX_ROPE_SCALING_FACTOR,
        description="Llama 3.1's rope frequency scaling by this factor (Megatron --use-rope-scaling "
                    "--rope-scaling-factor); None: none.")
    window_size: int | None = Field(
        None, gt=0, le=limits.MAX_SEQ_LENGTH,
        description="Sliding-window attention: each token attends to this many tokens before it (Mistral; "
                    "Megatron --window-size). Costed as full causal attention.")
    attention_dropout: float = Field(0.1, ge=0, lt=1, description="Dropout on attention probabilities (0 = none).")
    hidden_dropout: float = Field(0.1, ge=0, lt=1, description="Dropout before each residual add (0 = none).")
    kv_channels: int | None = Field(
        None, gt=0, le=limits.MAX_HIDDEN_SIZE, description="Head size (Megatron --kv-channels); default hidden_size / num_attention_heads.")
    qk_layernorm: bool = Field(False, description="A norm on each head's query and key (Qwen3).")
    # mixture of experts (Megatron's names); a model without num_experts is dense
    num_experts: int | None = Field(None, gt=1, le=limits.MAX_EXPERTS, description="Routed experts of each MoE layer (None: dense).")
    moe_router_topk: int = Field(2, gt=0, le=limits.MAX_EXPERTS, description="Experts each token is routed to.")
    moe_ffn_hidden_size: int | None = Field(
        None, gt=0, le=limits.MAX_FFN_HIDDEN_SIZE, description="Inner size of one routed expert; default ffn_hidden_size.")
    moe_shared_expert_intermediate_size: int | None = Field(
        None, gt=0, le=limits.MAX_FFN_HIDDEN_SIZE, description="Inner size of the shared experts every token also passes (None: none).")
    moe_layer_freq: int | tuple[int, ...] = Field(
        1, description="Which layers are MoE: every k-th (k), or one 0/1 per layer (Megatron's list form).")
    moe_expert_capacity_factor: float | None = Field(
        None, gt=0, le=limits.MAX_EXPERT_LOAD, description="Tokens an expert takes, as a multiple of the balanced share; past it tokens are "
                                "dropped. None: dropless.")
    moe_load_imbalance: float = Field(
        1.0, ge=1.0, le=limits.MAX_EXPERT_LOAD, description="Tokens of the busiest expert rank over the balanced share, to plan for (1 = "
                                 "perfectly balanced; every output states it).")

    @model_validator(mode="after")
    def _experts_are_consistent(self) -> "ModelSpec":
        if self.num_experts is None:
            return self
        if self.moe_router_topk > self.num_experts:
            raise ValueError(f"moe_router_topk={self.moe_router_topk} is more than num_experts={self.num_experts}; "
                             "route each token to at most that many experts")
        freq = self.moe_layer_freq
        if isinstance(freq, tuple):
            if len(freq) != self.num_layers or any(x not in (0, 1) for x in freq):
                raise ValueError(f"moe_layer_freq lists {len(freq)} entries; give one 0 (dense) or 1 (MoE) for each "
                                 f"of the {self.num_layers} layers")
        elif not 1 <= freq <= limits.MAX_LAYERS:
            raise ValueError(f"moe_layer_freq={freq} must be a layer interval from 1 to {limits.MAX_LAYERS:,} or a "
                             "0/1 list per layer")
        return self

    @model_validator(mode="after")
    def _heads_divide_hidden(self) -> "ModelSpec":
        if self.kv_channels is None and self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"num_attention_heads={self.num_attention_heads} does not divide hidden_size={self.hidden_size}; "
                "pick a head count whose head size is a whole number"
            )
        return self

    @model_validator(mode="after")
    def _groups_divide_heads(self) -> "ModelSpec":
        if self.num_query_groups is not None and self.num_attention_heads % self.num_query_groups:
            raise ValueError(
                f"num_query_groups={self.num_query_groups} does not divide "
                f"num_attention_heads={self.num_attention_heads}; use a divisor of the head count"
            )
        return self

    @property
    def ffn_size(self) -> int:
        return self.ffn_hidden_size if self.ffn_hidden_size is not None else 4 * self.hidden_size

    @property
    def head_dim(self) -> int:
        return self.kv_channels if self.kv_channels is not None else self.hidden_size // self.num_attention_heads

    @property
    def q_size(self) -> int:
        """Width of the query projection (and of the attention output): heads x head size."""
        return self.num_attention_heads * self.head_dim

    @property
    def is_moe(self) -> bool:
        return self.num_experts is not None

    @property
    def expert_ffn_size(self) -> int:
        return self.moe_ffn_hidden_size if self.moe_ffn_hidden_size is not None else self.ffn_size

    def is_moe_layer(self, index: int) -> bool:
        """Whether layer ``index`` (0-based) has experts (Megatron's --moe-layer-freq)."""
        if self.num_experts is None:
            return False
        freq = self.moe_layer_freq
        return bool(freq[index]) if isinstance(freq, tuple) else index % freq == 0

    @cached_property
    def num_moe_layers(self) -> int:
        return sum(self.is_moe_layer(i) for i in range(self.num_layers))

    @property
    def query_groups(self) -> int:
        return self.num_query_groups if self.num_query_groups is not None else self.num_attention_heads

    @property
    def kv_size(self) -> int:
        """Width of the key (or value) projection: groups x head size."""
        return self.query_groups * self.head_dim

    def mlp_parameters(self, ffn: int) -> int:
        """One MLP (or expert) of inner size ``ffn``: fc1 (two matrices with SwiGLU) and fc2, with biases."""
        h, bias = self.hidden_size, self.add_bias_linear
        return (2 if self.swiglu else 1) * (h * ffn + (ffn if bias else 0)) + ffn * h + (h if bias else 0)

    def attention_parameters(self) -> int:
        h, q, kv, bias = self.hidden_size, self.q_size, self.kv_size, self.add_bias_linear
        qkv = h * (q + 2 * kv) + (q + 2 * kv if bias or self.add_qkv_bias else 0)
        proj = q * h + (h if bias else 0)
        return qkv + proj + (2 * self.head_dim if self.qk_layernorm else 0)

    def layer_parameters(self, moe: bool = False, active: bool = False) -> int:
        """Parameters of one transformer layer (all ranks together): a dense layer, or an MoE layer with its
        router, every routed expert (``active``: the top-k a token passes) and the shared experts."""
        mlp = self.mlp_parameters(self.ffn_size)
        if moe:
            experts = self.moe_router_topk if active else self.num_experts
            mlp = self.hidden_size * self.num_experts + experts * self.mlp_parameters(self.expert_ffn_size)
            if self.moe_shared_expert_intermediate_size:
                mlp += self.mlp_parameters(self.moe_shared_expert_intermediate_size)
        return self.attention_parameters() + mlp + 2 * self.norm_parameters()

    def norm_parameters(self) -> int:
        return self.hidden_size * (2 if self.normalization is Normalization.layernorm else 1)

    def embedding_parameters(self) -> int:
        """Word embedding plus the learned position table where there is one."""
        pos = self.seq_length * self.hidden_size if self.position_embedding_type is PositionEmbedding.learned_absolute else 0
        return self.vocab_size * self.hidden_size + pos

    def num_parameters(self, active: bool = False) -> int:
        """Total parameters, counting a tied output layer once; ``active``: those one token passes through
        (the top-k routed experts of each MoE layer, not all of them)."""
        out = self.vocab_size * self.hidden_size if self.untie_embeddings_and_output_weights else 0
        moe = self.num_moe_layers
        layers = ((self.num_layers - moe) * self.layer_parameters()
                  + moe * (self.layer_parameters(moe=True, active=active) if moe else 0))
        return layers + self.embedding_parameters() + self.norm_parameters() + out
