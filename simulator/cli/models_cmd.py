"""``simulator models``: the model presets (or the models read from files) as a table or JSON."""

from __future__ import annotations

import json
from typing import Any

import click

from simulator.spec.catalog import PRESETS, load_model
from simulator.spec.model import ModelSpec
from simulator.spec.units import text_table

EXAMPLES = """
\b
Examples:
  simulator models                                  # every preset
  simulator models llama3-70b gpt3-175b --json
  simulator models path/to/Llama-2-7b-hf/config.json  # how a Hugging Face config is read
"""

_COLUMNS = ("name", "layers", "hidden", "heads", "kv heads", "ffn", "vocab", "seq", "params", "arch")


def format_parameters(n: int) -> str:
    """6.74B, 124M: the way model cards write parameter counts."""
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.0f}M"


def _arch(m: ModelSpec) -> str:
    """A short tag of the layer style: GPT (LayerNorm, GeLU, learned positions) or Llama-like parts."""
    parts = ["rmsnorm" if m.normalization.value == "RMSNorm" else "layernorm",
             "swiglu" if m.swiglu else "gelu", m.position_embedding_type.value.replace("learned_absolute", "learned")]
    if m.query_groups != m.num_attention_heads:
        parts.append("gqa")
    if m.untie_embeddings_and_output_weights:
        parts.append("untied")
    if m.is_moe:  # ffn is then each expert's inner size
        shared = "+shared" if m.moe_shared_expert_intermediate_size else ""
        parts.append(f"moe {m.num_experts}x top-{m.moe_router_topk}{shared} "
                     f"({format_parameters(m.num_parameters(active=True))} active)")
    return "/".join(parts)


def model_row(m: ModelSpec) -> dict[str, Any]:
    """One model for ``--json``: its ModelSpec fields plus the derived sizes."""
    return {**m.model_dump(mode="json"), "ffn_size": m.ffn_size, "query_groups": m.query_groups,
            "num_parameters": m.num_parameters(), "active_parameters": m.num_parameters(active=True)}


def render_table(models: list[ModelSpec]) -> str:
    rows = [_COLUMNS] + [
        (m.name, str(m.num_layers), str(m.hidden_size), str(m.num_attention_heads), str(m.query_groups),
         str(m.expert_ffn_size if m.is_moe else m.ffn_size), str(m.vocab_size), str(m.seq_length), format_parameters(m.num_parameters()), _arch(m))
        for m in models
    ]
    return text_table(_COLUMNS, rows[1:], frozenset({0, len(_COLUMNS) - 1}))


@click.command("models", epilog=EXAMPLES)
@click.argument("names", nargs=-1, metavar="[NAME|FILE]...")
@click.option("--json", "as_json", is_flag=True, default=False, help="Print machine-readable JSON to stdout.")
def models_command(names: tuple[str, ...], as_json: bool) -> None:
    """List the model presets, or show how presets and files (ModelSpec YAML/JSON, Hugging Face
    config.json) are read: layers, hidden size, heads, key/value heads, MLP size, vocabulary,
    sequence length and parameters (a tied output layer counted once)."""
    models = [load_model(n) for n in names] if names else [PRESETS[n] for n in PRESETS]
    if as_json:
        click.echo(json.dumps([model_row(m) for m in models], indent=2))
        return
    click.echo(render_table(models))
