"""A GPT in Megatron's layout, built from the simulator's own ``ModelSpec`` and ``ParallelPlan``.

``GPTChunk`` is one pipeline model chunk: the embedding on the first chunk, a run of
``TransformerLayer``s, and the final norm, output layer and loss on the last. The layer saves for
its backward pass exactly the tensors ``simulator.graph.layers.transformer_layer`` lists (Korthikanti
Table 2), which ``tests/calibration/test_reference_loop.py`` checks byte for byte:

- norm inputs, the (sharded under SP) inputs of the column-parallel GEMMs, q, k, v, the softmax
  output, the 1-byte attention-dropout mask and the dropout output, the projection input, the
  GeLU input, the fc2 input, and two 1-byte hidden-dropout masks;
- PyTorch's LayerNorm also keeps its per-token fp32 mean and 1/std, which the paper (and the
  simulator) leave out; the meter reports them apart as ``norm_statistics_bytes``.

A layer that ``model.is_moe_layer`` names has ``moe.MoELayer`` for its MLP (router, dispatcher over
the expert-parallel group, this rank's experts, shared experts).

Attention: ``unfused`` is Megatron's own path (QK^T, softmax, dropout, x V, keeping the s x s
probabilities); the fused backends (``auto``, ``flash``, ``fused``) run ``attention.RingAttention``,
flash attention's blockwise algorithm in PyTorch that keeps q, k, v and an fp32 log-sum-exp, and
under context parallelism passes keys and values around the CP group (ring attention).

Recompute: ``selective`` checkpoints the attention core (QK^T, softmax, dropout, attention over
values; Korthikanti Section 5) and keeps only q, k, v; ``full`` checkpoints whole layers and
keeps only their input. Both use ``torch.utils.checkpoint`` (non-reentrant), which restores the
RNG state, so dropout masks and the math are unchanged.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from calibration.reference.attention import context_parallel_positions, ring_attention
from calibration.reference.moe import MoELayer
from calibration.reference.parallel import (
    ColumnParallelLinear,
    ParallelGroups,
    RowParallelLinear,
    VocabParallelEmbedding,
    attention_scale,
    column_parallel_matmul,
    init_shard,
    reduce_from_tensor_parallel_region,
    reduce_scatter_to_sequence_parallel_region,
    vocab_parallel_cross_entropy,
)
from simulator.spec.model import ModelSpec
from simulator.spec.plan import Job, ParallelPlan, PipelineSchedule, RecomputeGranularity, RecomputeMethod

# A recompute timer: called as timer(fn, *args) when a checkpointed region is replayed in backward.
RecomputeTimer = Callable[..., torch.Tensor] | None


def dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """Dropout that keeps a 1-byte boolean mask, as Megatron's fused kernels do on GPU.

    ``F.dropout`` on CPU keeps a mask in the activation dtype (4 bytes in fp32);
    ``native_dropout`` keeps a ``bool`` mask on every device.
    """
    if p == 0.0 or not training:
        return x
    return torch.native_dropout(x, p, True)[0]


def replay_checkpoint(fn: Callable[..., torch.Tensor], timer: RecomputeTimer, *args: torch.Tensor) -> torch.Tensor:
    """``torch.utils.checkpoint`` whose replay in the backward pass goes through ``timer``."""
    calls = 0

    def run(*inner: torch.Tensor) -> torch.Tensor:
        nonlocal calls
        calls += 1
        if calls == 1 or timer is None:
            return fn(*inner)
        return timer(fn, *inner)

    return checkpoint(run, *args, use_reentrant=False)


def _layer_norm(hidden: int, name: str, sequence_parallel: bool, dtype, device) -> nn.LayerNorm:
    norm = nn.LayerNorm(hidden, eps=1e-5, dtype=dtype, device=device)
    for suffix, param in (("weight", norm.weight), ("bias", norm.bias)):
        param.global_name, param.partition_dim = f"{name}.{suffix}", None
        # under SP each rank sees a sequence shard, so these gradients are partial sums over TP
        param.sequence_parallel = sequence_parallel
    return norm


class TransformerLayer(nn.Module):
    """Pre-norm GPT layer on one TP rank: x + Attn(LN(x)), then x + MLP(LN(x)) (or the MoE layer); ``[s, b, h]``
    in and out.

    s is this rank's share of the sequence: s/cp tokens under context parallelism, and s/(cp t) for
    the norms, dropouts and residual adds under sequence parallelism.
    """

    def __init__(self, *, model: ModelSpec, plan: ParallelPlan, groups: ParallelGroups, index: int, seed: int,
                 dtype: torch.dtype, device) -> None:
        super().__init__()
        h, t, sp = model.hidden_size, groups.tp_size, plan.sequence_parallel
        name = f"layers.{index}"
        common = dict(groups=groups, sequence_parallel=sp, seed=seed, dtype=dtype, device=device, bias=True)
        self.index, self.groups = index, groups
        self.heads = model.num_attention_heads // t  # np: heads on this rank
        self.head_dim = model.head_dim  # hn
        self.attention_dropout, self.hidden_dropout = model.attention_dropout, model.hidden_dropout
        self.selective = plan.recompute.granularity is RecomputeGranularity.selective
        self.fused_attention = plan.use_flash_attention
        self.input_norm = _layer_norm(h, f"{name}.input_norm", sp, dtype, device)
        # qkv rows are laid out per head as [q_i, k_i, v_i], so a contiguous TP slice is whole heads
        self.qkv = ColumnParallelLinear(h, 3 * h, name=f"{name}.qkv", **common)
        self.proj = RowParallelLinear(h, h, name=f"{name}.proj", **common)
        self.pre_mlp_norm = _layer_norm(h, f"{name}.pre_mlp_norm", sp, dtype, device)
        self.moe = None
        if model.is_moe_layer(index):
            self.moe = MoELayer(model=model, plan=plan, groups=groups, index=index, seed=seed, dtype=dtype,
                                device=device)
        else:
            self.fc1 = ColumnParallelLinear(h, model.ffn_size, name=f"{name}.fc1", **common)
            self.fc2 = RowParallelLinear(model.ffn_size, h, name=f"{name}.fc2", **common)
        if not self.fused_attention:
            s = model.seq_length
            causal = torch.ones((s, s), dtype=torch.bool, device=device).triu(1)  # True: masked out
            self.register_buffer("causal_mask", causal, persistent=False)

    def core_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q, k, v (s, b, np, hn) -> context (s, b, np*hn): fused (ring) attention, or Megatron's unfused path."""
        if self.fused_attention:
            return ring_attention(q, k, v, self.groups)  # keeps q, k, v, its output and the fp32 LSE
        return self.unfused_attention(q, k, v)

    def unfused_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """softmax(mask(QK^T / sqrt(hn))) -> dropout -> x V; q, k, v (s, b, np, hn) -> (s, b, np*hn).

        As Megatron's ``DotProductAttention`` runs it: the scale goes into the GEMM (``baddbmm``'s
        alpha, beta 0), the causal mask is filled in place with -10000 (``attention_mask_func``), then
        the softmax; in fp32 the fused scale-mask-softmax kernel does not apply and these are PyTorch ops."""
        s, b, n, d = q.shape
        q = q.reshape(s, b * n, d).transpose(0, 1)  # (b*np, s, hn), still a view of the qkv output
        k = k.reshape(s, b * n, d).transpose(0, 1)
        v = v.reshape(s, b * n, d).transpose(0, 1)
        scores = torch.baddbmm(torch.empty(b * n, s, s, dtype=q.dtype, device=q.device), q, k.transpose(1, 2),
                               beta=0.0, alpha=attention_scale(d))  # (b*np, s, s)
        probs = torch.softmax(scores.masked_fill_(self.causal_mask, -10000.0), dim=-1)  # keeps its output
        probs = dropout(probs, self.attention_dropout, self.training)  # keeps a 1-byte mask
        context = torch.bmm(probs, v)  # (b*np, s, hn); keeps probs and v
        return context.transpose(0, 1).reshape(s, b, n * d)

    def forward(self, x: torch.Tensor, recompute_timer: RecomputeTimer = None) -> torch.Tensor:
        y = self.input_norm(x)  # (s/t or s, b, h); s = s/cp under context parallelism
        qkv = self.qkv(y)  # (s, b, 3 h/t)
        s, b, _ = qkv.shape
        q, k, v = qkv.view(s, b, self.heads, 3 * self.head_dim).split(self.head_dim, dim=-1)  # (s, b, np, hn)
        if self.selective:
            context = replay_checkpoint(self.core_attention, recompute_timer, q, k, v)
        else:
            context = self.core_attention(q, k, v)
        x = x + dropout(self.proj(context), self.hidden_dropout, self.training)
        y = self.pre_mlp_norm(x)
        y = self.moe(y) if self.moe is not None else self.fc2(F.gelu(self.fc1(y)))
        return x + dropout(y, self.hidden_dropout, self.training)


class Embedding(nn.Module):
    """Vocabulary-parallel word embedding plus a learned position table, then dropout.

    Under context parallelism the tokens are this rank's two chunks of the sequence, and the
    position table's rows are looked up at their positions.
    """

    def __init__(self, *, model: ModelSpec, plan: ParallelPlan, groups: ParallelGroups, seed: int, dtype, device):
        super().__init__()
        self.groups, self.sequence_parallel = groups, plan.sequence_parallel
        self.word = VocabParallelEmbedding(model.vocab_size, model.hidden_size, groups=groups,
                                           name="embedding.word", seed=seed, dtype=dtype, device=device)
        self.position = nn.Parameter(torch.empty(model.seq_length, model.hidden_size, dtype=dtype, device=device))
        init_shard(self.position, "embedding.position", tuple(self.position.shape), None, 0, 1, seed, "normal")
        self.position.sequence_parallel = plan.sequence_parallel
        self.hidden_dropout = model.hidden_dropout
        cp_positions = None  # this rank's positions in the sequence under context parallelism
        if groups.cp_size > 1:
            cp_positions = context_parallel_positions(model.seq_length, groups.cp_size, groups.cp_rank).to(device)
        self.register_buffer("cp_positions", cp_positions, persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens (b, s) -> hidden (s, b, h), or its sequence shard (s/t, b, h) under SP; s = s/cp under CP."""
        words = self.word(tokens.t())
        positions = self.position if self.cp_positions is None else self.position[self.cp_positions]  # (s, h)
        if self.sequence_parallel:
            words = reduce_scatter_to_sequence_parallel_region(words, self.groups.tp)
            n = words.shape[0]
            positions = positions[self.groups.tp_rank * n:(self.groups.tp_rank + 1) * n]
        else:
            words = reduce_from_tensor_parallel_region(words, self.groups.tp)
        return dropout(words + positions.unsqueeze(1), self.hidden_dropout, self.training)


class GPTChunk(nn.Module):
    """One pipeline model chunk: [embedding] -> layers -> [final norm, output layer, loss]."""

    def __init__(self, *, job: Job, groups: ParallelGroups, layer_ids: list[int], pre_process: bool,
                 post_process: bool, seed: int, dtype: torch.dtype, device) -> None:
        super().__init__()
        model, plan = job.model, job.plan
        self.groups, self.plan = groups, plan
        self.pre_process, self.post_process = pre_process, post_process
        common = dict(model=model, plan=plan, groups=groups, seed=seed, dtype=dtype, device=device)
        self.embedding = Embedding(**common) if pre_process else None
        self.layers = nn.ModuleList(TransformerLayer(index=i, **common) for i in layer_ids)
        self.full_recompute = _full_recompute_layers(plan, len(layer_ids))
        if post_process:
            self.final_norm = _layer_norm(model.hidden_size, "final_norm", plan.sequence_parallel, dtype, device)
            # the output layer reuses the word embedding; a later stage keeps its own copy whose
            # gradient is summed with the first stage's over the embedding group
            self.output_word = None if pre_process else VocabParallelEmbedding(
                model.vocab_size, model.hidden_size, groups=groups, name="embedding.word", seed=seed,
                dtype=dtype, device=device)
            if pre_process:  # one weight, two uses on this rank: the output layer's fused wgrad gives autograd zeros
                self.embedding.word.weight.zero_out_wgrad = True

    def output_weight(self) -> nn.Parameter:
        return self.embedding.word.weight if self.embedding is not None else self.output_word.weight

    def forward(self, hidden: torch.Tensor | None, tokens: torch.Tensor, targets: torch.Tensor,
                probe=None) -> torch.Tensor:
        """Hidden states (s_local, b, h) out, or on the last chunk the mean loss over this rank's tokens
        (under context parallelism the mean over its s/cp; the gradients' mean over DP x CP makes it
        the micro-batch's mean)."""
        if self.embedding is not None:
            hidden = self.embedding(tokens)
        for position, layer in enumerate(self.layers):
            full = position in self.full_recompute

            def run(x, timer, layer=layer, full=full):
                if full:
                    return replay_checkpoint(layer, timer, x)
                return layer(x, timer)

            hidden = probe(layer.index, run, hidden) if probe is not None else run(hidden, None)
        if not self.post_process:
            return hidden
        y = self.final_norm(hidden)
        logits = column_parallel_matmul(y, self.output_weight(), None, self.groups.tp, self.plan.sequence_parallel)
        vocab_start = self.groups.tp_rank * logits.shape[-1]
        return vocab_parallel_cross_entropy(logits, targets.t(), self.groups.tp, vocab_start).mean()


def _full_recompute_layers(plan: ParallelPlan, num_layers: int) -> set[int]:
    """Positions in the chunk that full recompute checkpoints (uniform: every layer; block: the first N)."""
    r = plan.recompute
    if r.granularity is not RecomputeGranularity.full:
        return set()
    if r.method is RecomputeMethod.block:
        return set(range(min(r.num_layers, num_layers)))
    return set(range(num_layers))


def recomputed_layer(plan: ParallelPlan, position_in_chunk: int) -> RecomputeGranularity:
    """The granularity that applies to one layer: block recompute leaves the later layers as 'none'."""
    r = plan.recompute
    if r.granularity is RecomputeGranularity.full and r.method is RecomputeMethod.block \
            and position_in_chunk >= r.num_layers:
        return RecomputeGranularity.none
    return r.granularity


def chunk_layer_ids(job: Job) -> dict[tuple[int, int], list[int]]:
    """(stage, chunk) -> global layer indices, as Megatron numbers them (``get_transformer_layer_offset``).

    Model chunk c*p + s (chunk c of stage s) holds consecutive layers, so the layers are dealt out in
    model-chunk order; how many each chunk builds is ``job.chunk_layers[s][c]``: even, or uneven with
    first/last-stage counts, or one fewer in the chunk that the embedding or the loss counts in.
    """
    p, v = job.plan.pipeline_parallel_size, job.plan.virtual_pipeline_stages
    out, start = {}, 0
    for model_chunk in range(p * v):
        c, s = divmod(model_chunk, p)
        n = job.chunk_layers[s][c]
        out[(s, c)] = list(range(start, start + n))
        start += n
    assert start == job.model.num_layers, (start, job.chunk_layers)
    return out


def schedule_kind(plan: ParallelPlan) -> str:
    return "gpipe" if plan.schedule is PipelineSchedule.gpipe else "1f1b"
