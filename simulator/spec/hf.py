"""``ModelSpec`` from a Hugging Face ``config.json``, read offline (no ``transformers`` needed).

Three families are understood, each by the keys its ``transformers`` config class writes:

- GPT-2 (``GPT2LMHeadModel``): ``n_layer``, ``n_embd``, ``n_head``, ``n_positions``, ``n_inner``
  (null = 4 x n_embd), ``vocab_size``; LayerNorm, learned positions, biases, tied embeddings.
- GPT-NeoX (``GPTNeoXForCausalLM``, Pythia): rotary embeddings and an untied output layer. Its
  parallel residual (attention and MLP both read the layer input) is simulated as the sequential
  residual of Megatron's GPT: the two branches run one after the other on the GPU either way, and
  the FLOPs, weights and saved activations are the same; only the second norm's input differs. The
  partial rotary (``rotary_pct``) is costed as a full one (a memory-bound op of a few microseconds).
- Llama style (``LlamaForCausalLM``, ``MistralForCausalLM``, ``Qwen2ForCausalLM``):
  ``num_hidden_layers``, ``hidden_size``, ``num_attention_heads``, ``num_key_value_heads``,
  ``intermediate_size``, ``vocab_size``, ``max_position_embeddings``, ``tie_word_embeddings``;
  RMSNorm, SwiGLU, rope, no dropout. A config with ``attention_bias`` or ``mlp_bias`` turns biases on
  for every linear layer; Qwen2's built-in query/key/value bias (h + 2 kv_size parameters a layer) is
  ``add_qkv_bias``. Mistral's sliding window (``sliding_window``) is kept as ``window_size`` for the
  launch, but attention is costed as full causal attention over the whole sequence.
- Every rope family: ``rope_theta`` (GPT-NeoX: ``rotary_emb_base``) is ``rotary_base``; Llama 3.1's
  ``rope_scaling`` (``rope_type`` llama3) is ``rope_scaling_factor``; other scalings are noted, not exported.
- Mixture of experts, Llama style with Megatron's MoE fields:
  Mixtral (``MixtralForCausalLM``): ``num_local_experts``, ``num_experts_per_tok``, and
  ``intermediate_size`` is each expert's size (every layer is MoE). Qwen2-MoE
  (``Qwen2MoeForCausalLM``, Qwen1.5-MoE) and Qwen3-MoE (``Qwen3MoeForCausalLM``): ``num_experts``,
  ``num_experts_per_tok``, ``moe_intermediate_size`` (an expert), ``intermediate_size`` (the MLP of
  the dense layers), ``decoder_sparse_step`` and ``mlp_only_layers`` (which layers are MoE: layer i
  when it is not listed and (i + 1) is a multiple of the step, as ``transformers`` builds them; a
  0/1 ``moe_layer_freq`` per layer unless every layer is). Qwen2-MoE adds a shared expert
  (``shared_expert_intermediate_size``); its sigmoid gate (h parameters a layer) is left out; its
  query/key/value biases are kept, as for Qwen2. Qwen3-MoE has its own ``head_dim`` (``kv_channels``) and
  a norm on each head's query and key, and no shared expert. A config whose names were dropped or
  say a dense Llama/Mistral/Qwen2 while it lists experts (``num_local_experts``, ``num_experts``)
  is read as the MoE model the keys describe, never as a dense one.

DeepSeek-V2/V3 (``deepseek_v2``, ``deepseek_v3``, or any config with ``q_lora_rank`` /
``kv_lora_rank``) are refused: their multi-head latent attention is not modelled; the preset
``deepseek-v3-style`` keeps DeepSeek-V3's expert layout with standard attention.

The sequence length is the config's maximum positions unless the caller gives one. A vocabulary
that is not a multiple of 128 is padded up to one, as Megatron's ``--make-vocab-size-divisible-by
128`` does (GPT-2's 50,257 becomes 50,304), so that any tensor-parallel size up to 128 divides it.

Each approximation above that applies to a config, the padding, and a sequence length taken from
more than 8,192 declared positions (long-context models are pre-trained shorter) is issued as an
``ImportNote`` warning when the config is read: Python prints it, and the CLI shows it under its
header and in its JSON (``notes``).
"""

from __future__ import annotations

import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

from simulator.spec import limits
from simulator.spec._io import build, read_mapping, short_repr
from simulator.spec.errors import ConfigError
from simulator.spec.model import ModelSpec, Normalization, PositionEmbedding

VOCAB_DIVISOR = 128  # Megatron's default --make-vocab-size-divisible-by
# Declared positions past this are a long-context stage's, not the pre-training sequence (Llama 3: 8,192).
LONG_CONTEXT_TOKENS = 8192


class ImportNote(UserWarning):
    """An approximation or a choice made while reading a Hugging Face config (printed, never silent)."""

# architecture (the config's "architectures" entry) -> model_type, for the families understood here
SUPPORTED_ARCHITECTURES: dict[str, str] = {
    "GPT2LMHeadModel": "gpt2",
    "GPTNeoXForCausalLM": "gpt_neox",
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "MixtralForCausalLM": "mixtral",
    "Qwen2MoeForCausalLM": "qwen2_moe",
    "Qwen3MoeForCausalLM": "qwen3_moe",
}
# families that are multi-head latent attention (refused) and the preset closest to them
_LATENT_ATTENTION = {"DeepseekV2ForCausalLM": "deepseek_v2", "DeepseekV3ForCausalLM": "deepseek_v3"}
_LATENT_KEYS = ("q_lora_rank", "kv_lora_rank")
CLOSEST_TO_LATENT_ATTENTION = "deepseek-v3-style"
_MISSING = object()


class _Config:
    """Typed access to the config's keys; every failure names the file, the key, the value and the fix."""

    def __init__(self, data: Mapping[str, Any], where: str):
        self.data, self.where = data, where

    def _get(self, keys: tuple[str, ...], default: Any) -> tuple[str, Any, bool]:
        """(key, value, found): the first of ``keys`` present and not null, else the default."""
        for key in keys:
            if key in self.data and self.data[key] is not None:
                return key, self.data[key], True
        if default is _MISSING:
            raise ConfigError(f"Hugging Face config {self.where} has no {' or '.join(map(repr, keys))}; "
                              "add it or use the model's original config.json")
        return keys[0], default, False

    def int(self, *keys: str, default: Any = _MISSING) -> Any:
        key, value, found = self._get(keys, default)
        if not found:
            return value
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ConfigError(f"Hugging Face config {self.where} has {key}={value!r}; it must be a positive integer")
        return value

    def layers(self, key: str) -> int:
        """The layer count, bounded before anything is built per layer (an MoE config's layout is one entry a
        layer, which 10**12 layers would grow until memory runs out)."""
        layers = self.int(key)
        if layers > limits.MAX_LAYERS:
            raise ConfigError(f"Hugging Face config {self.where} has {key}={short_repr(layers)}; the simulator takes "
                              f"at most {limits.MAX_LAYERS:,} layers (published GPTs have about 130), so fix it")
        return layers

    def float(self, key: str, default: float) -> float:
        _, value, _ = self._get((key,), default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
            raise ConfigError(f"Hugging Face config {self.where} has {key}={value!r}; a dropout must be in [0, 1)")
        return float(value)

    def bool(self, key: str, default: bool) -> bool:
        _, value, _ = self._get((key,), default)
        if not isinstance(value, bool):
            raise ConfigError(f"Hugging Face config {self.where} has {key}={value!r}; it must be true or false")
        return value


def _pad_vocab(vocab: int) -> int:
    return -(-vocab // VOCAB_DIVISOR) * VOCAB_DIVISOR


def _gpt2(c: _Config) -> dict[str, Any]:
    return dict(
        num_layers=c.layers("n_layer"), hidden_size=c.int("n_embd"), num_attention_heads=c.int("n_head"),
        ffn_hidden_size=c.int("n_inner", default=None), vocab_size=c.int("vocab_size"),
        seq_length=c.int("n_positions", "n_ctx"),
        untie_embeddings_and_output_weights=not c.bool("tie_word_embeddings", True),
        attention_dropout=c.float("attn_pdrop", 0.1), hidden_dropout=c.float("resid_pdrop", 0.1),
    )


def _gpt_neox(c: _Config) -> dict[str, Any]:
    return dict(
        num_layers=c.layers("num_hidden_layers"), hidden_size=c.int("hidden_size"),
        num_attention_heads=c.int("num_attention_heads"), ffn_hidden_size=c.int("intermediate_size"),
        vocab_size=c.int("vocab_size"), seq_length=c.int("max_position_embeddings"),
        position_embedding_type=PositionEmbedding.rope,
        untie_embeddings_and_output_weights=not c.bool("tie_word_embeddings", False),
        add_bias_linear=c.bool("attention_bias", True),
        attention_dropout=c.float("attention_dropout", 0.0), hidden_dropout=c.float("hidden_dropout", 0.0),
    )


def _llama(c: _Config, *, own_head_dim: bool = False) -> dict[str, Any]:
    """``own_head_dim``: the family sizes its heads by ``head_dim`` (Qwen3), not by hidden / heads."""
    act = c.data.get("hidden_act", "silu")
    if act not in ("silu", "swish"):
        raise ConfigError(f"Hugging Face config {c.where} has hidden_act={act!r}; a Llama-style MLP is SwiGLU, "
                          "so only 'silu' is understood")
    hidden, heads = c.int("hidden_size"), c.int("num_attention_heads")
    head_dim = c.int("head_dim", default=None)
    if own_head_dim:
        pass
    elif head_dim is not None and head_dim * heads != hidden:
        raise ConfigError(f"Hugging Face config {c.where} has head_dim={head_dim}, but hidden_size={hidden} / "
                          f"num_attention_heads={heads} = {hidden / heads:g}; only head_dim = hidden_size / heads "
                          "is modelled, remove head_dim or fix it")
    return dict(
        num_layers=c.layers("num_hidden_layers"), hidden_size=hidden, num_attention_heads=heads,
        **({"kv_channels": head_dim} if own_head_dim and head_dim is not None else {}),
        num_query_groups=c.int("num_key_value_heads", default=heads), ffn_hidden_size=c.int("intermediate_size"),
        vocab_size=c.int("vocab_size"), seq_length=c.int("max_position_embeddings"), swiglu=True,
        normalization=Normalization.rmsnorm, position_embedding_type=PositionEmbedding.rope,
        untie_embeddings_and_output_weights=not c.bool("tie_word_embeddings", False),
        add_bias_linear=c.bool("attention_bias", False) or c.bool("mlp_bias", False),
        attention_dropout=c.float("attention_dropout", 0.0), hidden_dropout=0.0,
    )


def _mixtral(c: _Config) -> dict[str, Any]:
    fields = _llama(c)  # intermediate_size is each expert's; every layer is MoE
    return {**fields, "num_experts": c.int("num_local_experts"), "moe_router_topk": c.int("num_experts_per_tok"),
            "moe_ffn_hidden_size": fields["ffn_hidden_size"]}


def _moe_layers(c: _Config, layers: int) -> int | tuple[int, ...]:
    """Megatron's moe_layer_freq for ``transformers``' rule: layer i has experts unless it is in
    ``mlp_only_layers``, and when (i + 1) is a multiple of ``decoder_sparse_step``."""
    step = c.int("decoder_sparse_step", default=1)
    dense = c.data.get("mlp_only_layers") or []
    if not isinstance(dense, list) or not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < layers
                                              for i in dense):
        raise ConfigError(f"Hugging Face config {c.where} has mlp_only_layers={short_repr(dense)}; it must be a list "
                          f"of layer indices from 0 to {layers - 1}")
    dense = set(dense)
    pattern = tuple(0 if i in dense or (i + 1) % step else 1 for i in range(layers))
    if not any(pattern):
        raise ConfigError(f"Hugging Face config {c.where} has decoder_sparse_step={step} and mlp_only_layers that "
                          f"leave none of its {layers} layers with experts; fix them or drop the expert keys")
    return 1 if all(pattern) else pattern


def _qwen_moe(c: _Config, *, qwen3: bool) -> dict[str, Any]:
    fields = _llama(c, own_head_dim=qwen3)  # intermediate_size is the MLP of the dense layers
    fields.update(num_experts=c.int("num_experts"), moe_router_topk=c.int("num_experts_per_tok"),
                  moe_ffn_hidden_size=c.int("moe_intermediate_size"),
                  moe_layer_freq=_moe_layers(c, fields["num_layers"]))
    if qwen3:
        fields["qk_layernorm"] = True
    else:
        fields["moe_shared_expert_intermediate_size"] = c.int("shared_expert_intermediate_size", default=None)
    return fields


def _attention_extras(c: _Config, family: str, fields: Mapping[str, Any]) -> dict[str, Any]:
    """What changes the model beyond its shape: rope's base and Llama 3.1's scaling, Qwen2's query/key/value
    biases, Mistral's sliding window."""
    out: dict[str, Any] = {}
    if fields.get("position_embedding_type") is PositionEmbedding.rope:
        key = "rotary_emb_base" if family == "gpt_neox" else "rope_theta"
        theta = c.data.get(key)
        if theta is not None:
            if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not 0 < theta <= limits.MAX_ROTARY_BASE:
                raise ConfigError(f"Hugging Face config {c.where} has {key}={short_repr(theta)}; it must be a positive "
                                  f"number up to {limits.MAX_ROTARY_BASE:.0e}")
            out["rotary_base"] = round(theta)
        factor = _llama3_rope_scaling(c.data.get("rope_scaling"))
        if factor is not None:
            out["rope_scaling_factor"] = factor
    if family in ("qwen2", "qwen2_moe"):
        out["add_qkv_bias"] = True  # transformers builds Qwen2's q, k and v projections with bias=True
    window = _sliding_window(c.data, family)
    if window is not None:
        out["window_size"] = window
    return out


def _llama3_rope_scaling(scaling: Any) -> float | None:
    if not isinstance(scaling, Mapping) or scaling.get("rope_type", scaling.get("type")) != "llama3":
        return None
    factor = scaling.get("factor")
    ok = isinstance(factor, (int, float)) and not isinstance(factor, bool) and 0 < factor <= limits.MAX_ROPE_SCALING_FACTOR
    return float(factor) if ok else None


def _sliding_window(data: Mapping[str, Any], family: str) -> int | None:
    window = data.get("sliding_window")
    uses = data.get("use_sliding_window", family == "mistral") is True
    if uses and isinstance(window, int) and not isinstance(window, bool) and 0 < window <= limits.MAX_SEQ_LENGTH:
        return window
    return None


_FAMILIES: dict[str, Callable[[_Config], dict[str, Any]]] = {
    "gpt2": _gpt2, "gpt_neox": _gpt_neox, "llama": _llama, "mistral": _llama, "qwen2": _llama,
    "mixtral": _mixtral, "qwen2_moe": lambda c: _qwen_moe(c, qwen3=False),
    "qwen3_moe": lambda c: _qwen_moe(c, qwen3=True),
}
# a dense family whose config lists experts is the MoE family those keys belong to
_EXPERT_KEYS = {"num_local_experts": "mixtral", "num_experts": "qwen2_moe"}
_DENSE_KIN = ("llama", "mistral", "qwen2")


def _refuse_latent_attention(data: Mapping[str, Any], where: str) -> None:
    archs = data.get("architectures")
    # only names can be looked up; a malformed list is refused with its own sentence by _named_family
    named = ([_LATENT_ATTENTION[a] for a in archs if isinstance(a, str) and a in _LATENT_ATTENTION]
             if isinstance(archs, list) else [])
    model_type = data.get("model_type")
    if isinstance(model_type, str) and model_type in _LATENT_ATTENTION.values():
        named.append(model_type)
    keys = [k for k in _LATENT_KEYS if data.get(k) is not None]
    if named or keys:
        what = f"model_type {named[0]!r}" if named else " and ".join(keys)
        raise ConfigError(f"Hugging Face config {where} is a DeepSeek model ({what}) with multi-head latent "
                          f"attention, which this simulator does not model; use the preset "
                          f"{CLOSEST_TO_LATENT_ATTENTION!r} (DeepSeek-V3's experts with standard attention), the "
                          "closest model it has")


def _expert_key(data: Mapping[str, Any]) -> str | None:
    """The key that lists routed experts (more than one), if the config has one."""
    for key in _EXPERT_KEYS:
        value = data.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 1:
            return key
    return None


def _model_type(data: Mapping[str, Any], where: str) -> str:
    """The family, from ``architectures`` (what the weights are) or else ``model_type``, or else the keys
    that list experts; a dense family whose config lists experts is read as its MoE family."""
    _refuse_latent_attention(data, where)
    family = _named_family(data, where)
    experts = _expert_key(data)
    if family in _DENSE_KIN and experts is not None:
        return _EXPERT_KEYS[experts]
    return family


def _named_family(data: Mapping[str, Any], where: str) -> str:
    archs = data.get("architectures")
    if archs is not None:
        if not isinstance(archs, list) or not archs or not all(isinstance(a, str) for a in archs):
            raise ConfigError(f"Hugging Face config {where} has architectures={archs!r}; it must be a list of "
                              "class names such as [\"LlamaForCausalLM\"]")
        known = [a for a in archs if a in SUPPORTED_ARCHITECTURES]
        if not known:
            raise ConfigError(f"Hugging Face config {where} has architectures={archs!r}, which this simulator does "
                              f"not model; use a config of {', '.join(SUPPORTED_ARCHITECTURES)}, or write the shape "
                              "as a YAML file of ModelSpec fields")
        return SUPPORTED_ARCHITECTURES[known[0]]
    model_type = data.get("model_type")
    if model_type is None and _expert_key(data) is not None:
        return _EXPERT_KEYS[_expert_key(data)]  # neither name left: the expert keys say which reader
    if not isinstance(model_type, str) or model_type not in _FAMILIES:
        raise ConfigError(f"Hugging Face config {where} has model_type={model_type!r}, which this simulator does "
                          f"not model; use one of {', '.join(_FAMILIES)}, or write the shape as a YAML file of "
                          "ModelSpec fields")
    return model_type


def _name(data: Mapping[str, Any], path: Path) -> str:
    given = data.get("_name_or_path")
    if isinstance(given, str) and given.strip("/"):
        return given.strip("/").split("/")[-1]
    if path.stem == "config" and path.resolve().parent.name:
        return path.resolve().parent.name  # .../Llama-2-7b-hf/config.json
    return path.stem


def _fraction(data: Mapping[str, Any], key: str) -> float | None:
    value = data.get(key)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def import_notes(data: Mapping[str, Any], fields: Mapping[str, Any], *, seq_length: int | None = None) -> list[str]:
    """What reading ``data`` into ``fields`` approximated or chose, one sentence each."""
    family = _model_type(data, "config")
    notes = []
    declared = fields["seq_length"]
    if seq_length is None and declared > LONG_CONTEXT_TOKENS:
        notes.append(f"sequence length {declared:,} taken from the declared maximum positions; long-context models "
                     f"are usually pre-trained at {LONG_CONTEXT_TOKENS:,} or fewer, so pass --seq-length to simulate "
                     "the length you train at")
    if family == "gpt_neox":
        if data.get("use_parallel_residual", True) is not False:
            notes.append("parallel residual (attention and MLP both read the layer input) simulated as the "
                         "sequential residual of Megatron's GPT: same FLOPs, weights and saved activations")
        rotary = _fraction(data, "rotary_pct")
        if rotary is not None and rotary < 1:
            notes.append(f"partial rotary embedding (rotary_pct={rotary:g}) costed as a full one")
    rotary = _fraction(data, "partial_rotary_factor")
    if family != "gpt_neox" and rotary is not None and rotary < 1:
        notes.append(f"partial rotary embedding (partial_rotary_factor={rotary:g}) costed as a full one")
    window = _sliding_window(data, family)
    seq = seq_length if seq_length is not None else declared
    if window is not None and window < seq:
        notes.append(f"sliding-window attention (window {window:,} tokens) is in the launch (--window-size) but not "
                     f"in the time: attention is costed as full causal attention over all {seq:,} tokens, which "
                     "overstates it")
    scaling = data.get("rope_scaling")
    if isinstance(scaling, Mapping) and _llama3_rope_scaling(scaling) is None:
        kind = scaling.get("rope_type", scaling.get("type"))
        notes.append(f"rope scaling {kind!r} is not exported (Megatron's --use-rope-scaling is Llama 3.1's); it "
                     "changes neither time nor memory")
    if family == "qwen2_moe" and fields.get("moe_shared_expert_intermediate_size"):
        notes.append("the shared expert's sigmoid gate (one h-wide projection a layer) left out")
    named = _named_family(data, "config")
    if named != family:
        notes.append(f"read as {family} (the config lists {_expert_key(data)}={data[_expert_key(data)]}), not as "
                     f"the dense {named} its name says")
    if family in ("llama", "mistral") and fields.get("add_bias_linear"):
        notes.append("attention_bias/mlp_bias turns biases on for every linear layer")
    vocab = data.get("vocab_size")
    if isinstance(vocab, int) and fields["vocab_size"] != vocab:
        notes.append(f"vocabulary {vocab:,} padded to {fields['vocab_size']:,} (a multiple of {VOCAB_DIVISOR}, "
                     "as Megatron's --make-vocab-size-divisible-by does)")
    return notes


def model_from_hf_config(data: Mapping[str, Any], path: str | Path, *, seq_length: int | None = None) -> ModelSpec:
    """The ``ModelSpec`` of an already-parsed Hugging Face config; ``path`` is only for names and messages.

    Every approximation made (see the module docstring) is issued as an ``ImportNote`` warning.
    """
    path = Path(path)
    where = repr(str(path))
    family = _model_type(data, where)
    fields = _FAMILIES[family](_Config(data, where))
    fields.update(_attention_extras(_Config(data, where), family, fields))
    fields["vocab_size"] = _pad_vocab(fields["vocab_size"])
    notes = import_notes(data, fields, seq_length=seq_length)
    if seq_length is not None:
        fields["seq_length"] = seq_length
    fields["name"] = _name(data, path)
    what = f"Hugging Face config {where}"
    try:
        model = build(ModelSpec, fields, what)
    except ConfigError as exc:  # a rule's own sentence does not name the file; a field's bound already does
        raise ConfigError(str(exc) if str(exc).startswith(what) else f"{what}: {exc}") from None
    for note in notes:
        warnings.warn(f"{model.name}: {note}", ImportNote, stacklevel=2)
    return model


@contextmanager
def collected_notes() -> Iterator[list[str]]:
    """Collect the ``ImportNote`` warnings issued inside the block (the list fills when it ends); other
    warnings pass through as usual."""
    notes: list[str] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ImportNote)
        yield notes
    for w in caught:
        if issubclass(w.category, ImportNote):
            notes.append(str(w.message))
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)


def load_hf_config(path: str | Path, *, seq_length: int | None = None) -> ModelSpec:
    """Read a Hugging Face ``config.json`` (GPT-2, GPT-NeoX, Llama style or its MoE kin) into a ``ModelSpec``.

    ``seq_length`` overrides the config's maximum positions (a model trained at 8K tokens may
    declare 128K). Raises ``ConfigError`` naming the file, the key and the fix for anything else.
    """
    path = Path(path)
    data = read_mapping(path, "Hugging Face config")
    if "architectures" not in data and "model_type" not in data and _expert_key(data) is None:
        raise ConfigError(f"{str(path)!r} has neither 'architectures' nor 'model_type', so it is not a Hugging Face "
                          "config; pass the model's config.json, or load a ModelSpec file with --model")
    return model_from_hf_config(data, path, seq_length=seq_length)
