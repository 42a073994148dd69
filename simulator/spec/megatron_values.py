"""What Megatron-LM's text-valued flags mean: ``--moe-layer-freq``, ``--window-size``,
``--pipeline-model-parallel-layout`` and the vocabulary a ``--tokenizer-type`` (with its
``--tokenizer-model``) gives. Each is read without ``eval`` and with its size checked before anything
is built from it, so a launch line cannot ask for more memory than the model it describes."""

from __future__ import annotations

import ast
import re
from typing import Any

from simulator.spec import limits
from simulator.spec._io import short_repr
from simulator.spec.errors import ConfigError
from simulator.spec.presets import LLAMA2_VOCAB, LLAMA3_VOCAB, MOE_PRESETS

_MAX_DIGITS = 12  # a count past any model: longer numbers are refused before they are converted
_INTEGER = re.compile(rf"[-+]?[0-9]{{1,{_MAX_DIGITS}}}")

# --- vocabulary ------------------------------------------------------------------------------------

GPT2_VOCAB = 50257  # GPT-2's BPE vocabulary (Radford et al. 2019), before Megatron pads it

# Tokenizers whose vocabulary does not depend on the files they read: Megatron's GPT-2 BPE, and its
# Llama2Tokenizer, which reads Llama 2's SentencePiece model (Mixtral 8x7B ships the same 32,000 pieces).
_TOKENIZER_VOCAB = {"GPT2BPETokenizer": GPT2_VOCAB, "Llama2Tokenizer": LLAMA2_VOCAB}
# A Hugging Face tokenizer (``--tokenizer-model`` a hub name or a folder named after it) of a model the presets
# hold, where Megatron's vocabulary (the tokenizer's length) is the model's: Llama 2 and 3, Mixtral 8x7B.
_HF_TOKENIZER_VOCAB = (
    (re.compile(r"llama-?2", re.I), LLAMA2_VOCAB),
    (re.compile(r"llama-?3", re.I), LLAMA3_VOCAB),
    (re.compile(r"mixtral-8x7b", re.I), MOE_PRESETS["mixtral-8x7b"].vocab_size),
)


def tokenizer_vocab(tokenizer_type: str | None, tokenizer_model: str | None) -> int | None:
    """The vocabulary (before Megatron pads it) of ``--tokenizer-type`` with ``--tokenizer-model``, where it
    is known without reading the tokenizer's files; None where it is not."""
    if tokenizer_type in _TOKENIZER_VOCAB:
        return _TOKENIZER_VOCAB[tokenizer_type]
    if tokenizer_type in ("HuggingFaceTokenizer", "SentencePieceTokenizer", "GPTSentencePieceTokenizer") \
            and tokenizer_model and "$" not in tokenizer_model:
        return next((size for pattern, size in _HF_TOKENIZER_VOCAB if pattern.search(tokenizer_model)), None)
    return None


# --- --window-size ---------------------------------------------------------------------------------


def window_size(text: str) -> int:
    """The tokens before each token that ``--window-size`` lets it attend to: '(4096,0)', '4096,0' or '[4096, 0]'."""
    parts = [p for p in re.split(r"[\s,()\[\]]+", text) if p]
    if len(parts) == 2 and all(_INTEGER.fullmatch(p) for p in parts) and int(parts[0]) > 0 and int(parts[1]) == 0:
        return int(parts[0])
    raise ConfigError(f"--window-size {short_repr(text)} is not a causal sliding window the simulator reads; write "
                      "it as '(W,0)' with W tokens before each token")


# --- --moe-layer-freq ------------------------------------------------------------------------------


def layer_freq(text: str, layers: int) -> int | tuple[int, ...]:
    """``--moe-layer-freq`` as Megatron reads it: an integer k (every k-th layer, from the first), or a
    python-list expression such as '([0]*3+[1]*58)' or '[1,0,1,0]', evaluated here without ``eval``:
    list literals of 0 and 1, ``+`` between lists and ``*`` by a whole number."""
    if "[" not in text:
        if _INTEGER.fullmatch(text.strip()):
            return int(text)
        raise ConfigError(f"--moe-layer-freq {short_repr(text)} is neither a whole number nor a list pattern such "
                          "as '([0]*3+[1]*5)'")

    def value(node: ast.AST) -> Any:
        if isinstance(node, ast.List):
            return [value(e) for e in node.elts]
        if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
            return node.value
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mult)):
            left, right = value(node.left), value(node.right)
            if isinstance(node.op, ast.Add) and isinstance(left, list) and isinstance(right, list):
                return left + right
            if isinstance(node.op, ast.Mult) and {type(left), type(right)} == {list, int}:
                times = left if isinstance(left, int) else right
                if 0 <= times <= 10 * layers + 1000:  # a bound, so a pattern cannot fill the memory
                    return (left if isinstance(left, list) else right) * times
        raise ValueError

    try:
        pattern = value(ast.parse(text.strip(), mode="eval").body)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        pattern = None
    if not isinstance(pattern, list) or any(x not in (0, 1) or isinstance(x, list) for x in pattern):
        raise ConfigError(f"--moe-layer-freq {short_repr(text)} is not a list pattern of 0s and 1s the simulator "
                          "reads; write it as '([0]*3+[1]*5)' or '[0,1,1]'")
    return tuple(pattern)


# --- --pipeline-model-parallel-layout ---------------------------------------------------------------

# The symbols a layout spells out: each layer one 't', the embedding 'E' and the loss 'L', and one '|' between
# stages, of which there are at most one more than layers (a stage may hold only the embedding or the loss).
_MAX_LAYOUT_SYMBOLS = 2 * limits.MAX_LAYERS + 3
_REPEATS = (re.compile(r"\(([^)]+)\)\*(\d+)"), re.compile(r"(.)\*(\d+)"))


def _spelled_out(layout: str, text: str, pattern: re.Pattern, most: int) -> str:
    """``text`` with each ``X*n`` of ``pattern`` repeated, refused when that would exceed ``most`` characters."""
    size = len(text)
    for m in pattern.finditer(text):
        digits = m.group(2)
        times = int(digits) if len(digits) <= _MAX_DIGITS else most + 1
        size += len(m.group(1)) * times - len(m.group())
        if size > most and len(m.group(1)) * times > len(m.group()):
            count = f"{times:,}" if len(digits) <= _MAX_DIGITS else f"a {len(digits):,}-digit number of"
            raise ConfigError(f"--pipeline-model-parallel-layout {short_repr(layout)} repeats {m.group(1)!r} {count} "
                              f"times, more than a model of at most {limits.MAX_LAYERS:,} layers has; check its "
                              "repeat counts")
    return pattern.sub(lambda x: x.group(1) * int(x.group(2)), text)


def layout_split(layout: str, pp: int) -> tuple[int, ...]:
    """Transformer layers per stage of a ``--pipeline-model-parallel-layout`` with one chunk per stage."""
    text = layout.replace(",", "")
    # the repeats in parentheses first (their insides may repeat again): at most four characters a symbol
    text = _spelled_out(layout, text, _REPEATS[0], max(len(text), 4 * _MAX_LAYOUT_SYMBOLS))
    text = _spelled_out(layout, text, _REPEATS[1], max(len(text), _MAX_LAYOUT_SYMBOLS))
    stages = text.split("|")
    ok = (len(stages) == pp and set(text) <= set("EtL|") and stages[0].lstrip("E").count("E") == 0
          and all("E" not in s for s in stages[1:]) and all("L" not in s for s in stages[:-1])
          and stages[-1].rstrip("L").count("L") == 0)
    if not ok:
        raise ConfigError(f"--pipeline-model-parallel-layout {short_repr(layout)} is not one chunk of transformer "
                          f"layers per each of the {pp} stages with the embedding first and the loss last; the "
                          "simulator reads only that form")
    return tuple(s.count("t") for s in stages)
