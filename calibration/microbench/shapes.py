"""The GEMM shapes of one GPT layer on one tensor-parallel rank, from plain numbers.

This mirrors the shapes ``simulator.graph.layers`` builds (Korthikanti et al. 2022, Table 1 notation:
s sequence, b micro-batch, h hidden, a heads, t tensor-parallel size) without importing it, since
that module needs pydantic, which the GPU machine lacks. A test checks the two agree.

Convention: C[m, n] = A[m, k] @ B[k, n], ``batch`` times. A linear layer's backward runs
dgrad = (m, k, n) and wgrad = (k, n, m) of its forward (m, n, k).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LayerDims:
    """A GPT layer and the plan bits that set its GEMM shapes."""

    hidden_size: int
    num_attention_heads: int
    ffn_hidden_size: int
    seq_length: int
    micro_batch_size: int = 1
    tensor_parallel_size: int = 1
    num_query_groups: int | None = None
    swiglu: bool = False
    vocab_size: int | None = None  # the output layer's GEMMs are measured too where it is given

    def __post_init__(self) -> None:
        t = self.tensor_parallel_size
        for name, value in (("hidden_size", self.hidden_size), ("num_attention_heads", self.num_attention_heads),
                            ("ffn_hidden_size", self.ffn_hidden_size), ("seq_length", self.seq_length),
                            ("micro_batch_size", self.micro_batch_size), ("tensor_parallel_size", t)):
            if value <= 0:
                raise ValueError(f"{name}={value} must be positive")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(f"num_attention_heads={self.num_attention_heads} does not divide hidden_size={self.hidden_size}")
        if self.num_attention_heads % t or self.ffn_hidden_size % t:
            raise ValueError(f"tensor_parallel_size={t} must divide num_attention_heads={self.num_attention_heads} "
                             f"and ffn_hidden_size={self.ffn_hidden_size}")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def tokens(self) -> int:
        return self.seq_length * self.micro_batch_size

    @property
    def local_heads(self) -> int:
        return self.num_attention_heads // self.tensor_parallel_size

    @property
    def local_kv_width(self) -> int:
        groups = self.num_query_groups or self.num_attention_heads
        return max(groups * self.head_dim // self.tensor_parallel_size, self.head_dim)


@dataclass(frozen=True)
class Gemm:
    """One matrix product C[m, n] = A[m, k] @ B[k, n], ``batch`` times; ``name`` says where it comes from."""

    name: str
    m: int
    n: int
    k: int
    batch: int = 1

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k * self.batch

    @property
    def key(self) -> tuple[int, int, int, int]:
        return (self.m, self.n, self.k, self.batch)


def forward_gemms(d: LayerDims, flash_attention: bool = False) -> list[Gemm]:
    """The forward GEMMs of one layer on one TP rank, in execution order."""
    tokens, h, hd = d.tokens, d.hidden_size, d.head_dim
    a, f = d.local_heads, d.ffn_hidden_size // d.tensor_parallel_size
    out = [Gemm("qkv", tokens, a * hd + 2 * d.local_kv_width, h)]
    if not flash_attention:
        bh = d.micro_batch_size * a
        out.append(Gemm("attention_scores", d.seq_length, d.seq_length, hd, bh))  # (b*a, s, d) @ (b*a, d, s)
        out.append(Gemm("attention_context", d.seq_length, hd, d.seq_length, bh))  # (b*a, s, s) @ (b*a, s, d)
    out.append(Gemm("attention_proj", tokens, h, a * hd))
    out.append(Gemm("fc1", tokens, 2 * f if d.swiglu else f, h))
    out.append(Gemm("fc2", tokens, h, f))
    return out


def backward_gemms(d: LayerDims, flash_attention: bool = False) -> list[Gemm]:
    """dgrad and wgrad of every weight GEMM, and the four batched GEMMs of unfused attention."""
    out: list[Gemm] = []
    for g in forward_gemms(d, flash_attention):
        if g.batch > 1:
            if g.name == "attention_context":
                out.append(Gemm(f"{g.name}.dgrad_probs", g.m, g.k, g.n, g.batch))
                out.append(Gemm(f"{g.name}.dgrad_v", g.k, g.n, g.m, g.batch))
            else:
                out.append(Gemm(f"{g.name}.dgrad_q", g.m, g.k, g.n, g.batch))
                out.append(Gemm(f"{g.name}.dgrad_k", g.n, g.k, g.m, g.batch))
        else:
            out.append(Gemm(f"{g.name}.dgrad", g.m, g.k, g.n))
            out.append(Gemm(f"{g.name}.wgrad", g.k, g.n, g.m))
    return out


def layer_gemms(d: LayerDims, flash_attention: bool = False) -> list[Gemm]:
    """Every GEMM of a layer's forward and backward pass (shapes may repeat)."""
    return forward_gemms(d, flash_attention) + backward_gemms(d, flash_attention)


def output_gemms(d: LayerDims) -> list[Gemm]:
    """The vocabulary-parallel output layer's logits GEMM, its dgrad and wgrad on one TP rank (none without a
    vocabulary): one of a step's largest GEMMs, and a shape no layer has."""
    if d.vocab_size is None:
        return []
    g = Gemm("output_layer", d.tokens, d.vocab_size // d.tensor_parallel_size, d.hidden_size)
    return [g, Gemm(f"{g.name}.dgrad", g.m, g.k, g.n), Gemm(f"{g.name}.wgrad", g.k, g.n, g.m)]


def unique_gemms(gemms: list[Gemm]) -> list[Gemm]:
    """One GEMM per distinct (m, n, k, batch), keeping the first name, in first-seen order."""
    seen: dict[tuple[int, int, int, int], Gemm] = {}
    for g in gemms:
        seen.setdefault(g.key, g)
    return list(seen.values())


def grid_gemms(quick: bool, device: str) -> list[Gemm]:
    """A grid of square and skinny GEMMs over sizes and alignments, to fit efficiency against shape.

    Alignment matters on tensor cores (Anthony et al. 2024: multiples of 64 fp16 elements on A100),
    so each size also appears off by one and off by a non-power-of-two multiple.
    """
    if device == "cpu":
        sizes = [128, 256, 512] if quick else [128, 256, 512, 1024, 1536]
        odd = [200, 384 + 1] if quick else [200, 384 + 1, 1000, 1024 + 8]
    else:
        sizes = [256, 512, 1024, 2048, 4096, 8192] if not quick else [512, 2048, 8192]
        odd = [1000, 2048 + 1, 4096 + 64, 6144 - 1, 10922, 10944] if not quick else [2048 + 1, 10922]
    out = [Gemm("grid.square", n, n, n) for n in sizes + odd]
    big = sizes[-1]
    for n in sizes[:-1]:
        out.append(Gemm("grid.skinny_m", n, big, big))
        out.append(Gemm("grid.skinny_k", big, big, n))
    return unique_gemms(out)
