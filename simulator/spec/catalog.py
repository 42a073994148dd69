"""The models a name or a file can give: every preset, a ``ModelSpec`` file, a Hugging Face ``config.json``."""

from __future__ import annotations

from pathlib import Path

from simulator.spec._io import build, exists, read_mapping
from simulator.spec.errors import ConfigError
from simulator.spec.model import ModelSpec
from simulator.spec.presets import GPT_PRESETS, LLAMA_PRESETS, MOE_PRESETS

PRESETS: dict[str, ModelSpec] = {**GPT_PRESETS, **LLAMA_PRESETS, **MOE_PRESETS}


def load_model(name_or_path: str, seq_length: int | None = None) -> ModelSpec:
    """A preset by name, a YAML/JSON file of ``ModelSpec`` fields, or a Hugging Face ``config.json``;
    ``seq_length`` overrides the sequence length (Megatron's --seq-length), e.g. a long-context
    config's 131,072 positions when training at 8,192."""
    model = _load_model(name_or_path, seq_length)
    if seq_length is None or seq_length == model.seq_length:
        return model
    return build(ModelSpec, {**model.model_dump(), "seq_length": seq_length}, f"model {model.name!r}")


def _load_model(name_or_path: str, seq_length: int | None = None) -> ModelSpec:
    if name_or_path in PRESETS:
        return PRESETS[name_or_path]
    path = Path(name_or_path)
    if path.suffix in {".yaml", ".yml", ".json"} or exists(path, "model"):
        data = read_mapping(path, "model")
        if "architectures" in data or "model_type" in data:  # a Hugging Face config.json
            from simulator.spec.hf import model_from_hf_config

            return model_from_hf_config(data, path, seq_length=seq_length)  # its notes depend on it
        data.setdefault("name", path.stem)
        return build(ModelSpec, data, f"model file {str(path)!r}", strict=True)
    raise ConfigError(
        f"unknown model {name_or_path!r}; use a preset ({', '.join(sorted(PRESETS))}), a YAML/JSON file "
        "or a Hugging Face config.json"
    )
