"""``ParallelPlan`` and ``RecomputePolicy``: how a model is laid out on GPUs, and ``Job`` that checks
a plan against a model and a cluster.

Rules that need only the plan are validators of ``ParallelPlan`` (``simulator.spec.parallel_plan``, its
enums and ``RecomputePolicy`` in ``simulator.spec.plan_types``); rules that need the model or the cluster
(heads, layers, GPUs per node) are validators of ``Job``, here. Each message names the values and the fix.
The package imports every name of the three from here, so no caller needs to know which holds what.
"""

from __future__ import annotations

from functools import cached_property, lru_cache

from pydantic import BaseModel, ConfigDict, model_validator

from simulator.spec.hardware import ClusterSpec
from simulator.spec.model import ModelSpec
from simulator.spec.parallel_plan import ParallelPlan
from simulator.spec.pipeline_split import chunk_layers
from simulator.spec.plan_types import (
    AttentionBackend,
    CpCommType,
    DataParallelSharding,
    Fp8Format,
    MoEDispatcher,
    PipelineSchedule,
    Precision,
    RecomputeGranularity,
    RecomputeMethod,
    RecomputePolicy,
    StateDtype,
)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _say_divisors(n: int, node: int | None = None) -> str:
    """'1, 2, 4 or 8': the divisors of ``n`` (those that also divide ``node``, the GPUs of a node, if given)."""
    d = [x for x in _divisors(n) if node is None or node % x == 0]
    return ", ".join(str(x) for x in d[:-1]) + f" or {d[-1]}" if len(d) > 1 else str(d[0])


class Job(BaseModel):
    """A plan checked against a model and a cluster: everything downstream takes one of these."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: ModelSpec
    cluster: ClusterSpec
    plan: ParallelPlan

    @model_validator(mode="after")
    def _tp_divides_heads(self) -> "Job":
        t, a = self.plan.tensor_parallel_size, self.model.num_attention_heads
        if a % t:
            raise ValueError(
                f"tensor_parallel_size={t} does not divide num_attention_heads={a}; use {_say_divisors(a)}"
            )
        g = self.model.query_groups
        if g % t and t % g:
            raise ValueError(
                f"tensor_parallel_size={t} and num_query_groups={g} must divide one another; use {_say_divisors(g)}"
            )
        if self.model.ffn_size % t:
            raise ValueError(
                f"tensor_parallel_size={t} does not divide ffn_hidden_size={self.model.ffn_size}; Megatron splits the "
                f"MLP evenly over TP ranks, so use a multiple of {t} or a TP size that divides it"
            )
        if self.model.vocab_size % t:
            raise ValueError(
                f"tensor_parallel_size={t} does not divide vocab_size={self.model.vocab_size}; pad the vocabulary "
                f"to a multiple of {t} (Megatron pads to a multiple of 128 x TP)"
            )
        return self

    @model_validator(mode="after")
    def _fp8_needs_fp8_tensor_cores(self) -> "Job":
        if self.plan.fp8_format is not None and self.cluster.gpu.peak_tflops.fp8 is None:
            raise ValueError(
                f"fp8_format={self.plan.fp8_format.value!r} needs FP8 tensor cores, which "
                f"{self.cluster.gpu.name} ({self.cluster.name}) does not have; drop the FP8 format or use a Hopper "
                "cluster such as dgx-h100 or dgx-h200"
            )
        return self

    @property
    def _nvlink_tier(self) -> tuple[int, str]:
        """The GPUs NVLink joins for a group of consecutive ranks, and how a message names them."""
        n = self.cluster.ranks_per_nvlink_domain
        return n, ("GPUs per node" if n == self.cluster.gpus_per_node else "GPUs a job takes of an NVLink domain")

    @model_validator(mode="after")
    def _tp_within_node(self) -> "Job":
        t, (n, where) = self.plan.tensor_parallel_size, self._nvlink_tier
        if t > n and not self.plan.allow_tp_across_nodes:
            raise ValueError(
                f"tensor_parallel_size={t} is more than the {n} {where} of {self.cluster.name}, so every layer "
                f"would talk over InfiniBand; use at most {n} or insist with allow_tp_across_nodes"
            )
        if t <= n and n % t:
            raise ValueError(f"tensor_parallel_size={t} must divide the {n} {where}; use {_say_divisors(n)}")
        return self

    @model_validator(mode="after")
    def _experts_need_a_moe_model(self) -> "Job":
        p = self.plan
        if self.model.is_moe:
            return self
        if p.expert_model_parallel_size > 1:
            raise ValueError(f"expert_model_parallel_size={p.expert_model_parallel_size} needs a model with experts; "
                             "set num_experts or use 1")
        if p.expert_tensor_parallel_size is not None:
            raise ValueError(f"expert_tensor_parallel_size={p.expert_tensor_parallel_size} needs a model with "
                             "experts; set num_experts or leave it unset")
        return self

    @model_validator(mode="after")
    def _expert_tp_within_node(self) -> "Job":
        e, (n, where) = self.plan.expert_tensor_parallel_size, self._nvlink_tier
        if e is None:
            return self  # it is TP, checked above
        if e > n and not self.plan.allow_tp_across_nodes:
            raise ValueError(
                f"expert_tensor_parallel_size={e} is more than the {n} {where} of {self.cluster.name}, so every "
                f"expert would talk over InfiniBand; use at most {n} or insist with allow_tp_across_nodes")
        if e <= n and n % e:
            raise ValueError(f"expert_tensor_parallel_size={e} must divide the {n} {where}; use "
                             f"{_say_divisors(n)}")
        return self

    @model_validator(mode="after")
    def _experts_tile_the_stage(self) -> "Job":
        m, p = self.model, self.plan
        if not m.is_moe:
            return self
        ep, etp, t = p.expert_model_parallel_size, p.expert_tp_size, p.tensor_parallel_size
        if m.num_experts % ep:
            raise ValueError(f"expert_model_parallel_size={ep} does not divide num_experts={m.num_experts}; use "
                             f"{_say_divisors(m.num_experts)}")
        # Megatron's expert rank generator lays ETP x EP x EDP over the same ranks as TP x CP x DP
        ranks = t * p.context_parallel_size * p.data_parallel_size
        if ranks % (ep * etp):
            raise ValueError(f"expert_model_parallel_size={ep} x expert_tensor_parallel_size={etp} does not "
                             f"divide the {ranks} TP x CP x DP ranks of a stage; pick sizes whose product "
                             f"divides {ranks}")
        if m.expert_ffn_size % etp:
            raise ValueError(f"expert_tensor_parallel_size={etp} does not divide the experts' "
                             f"moe_ffn_hidden_size={m.expert_ffn_size}; use "
                             f"{_say_divisors(m.expert_ffn_size, self.cluster.ranks_per_nvlink_domain)}")
        shared = m.moe_shared_expert_intermediate_size
        if shared and shared % t:
            raise ValueError(f"tensor_parallel_size={t} does not divide moe_shared_expert_intermediate_size={shared} "
                             f"(the shared experts are split over TP like a dense MLP); "
                             f"use {_say_divisors(shared, self.cluster.ranks_per_nvlink_domain)}")
        # Megatron's rule (validate_args asserts it for any model with experts, at EP 1 too: "When using MoE and
        # tensor parallelism, sequence parallelism must be used"): the dispatcher takes each TP rank's shard
        if t > 1 and not p.sequence_parallel:
            raise ValueError(f"expert_model_parallel_size={ep} with tensor_parallel_size={t} needs sequence_parallel "
                             "(Megatron's rule); turn sequence parallelism on")
        return self

    @model_validator(mode="after")
    def _pipeline_splits_layers(self) -> "Job":
        _ = self.chunk_layers  # raises the split's own ValueError
        return self

    @model_validator(mode="after")
    def _context_parallel_splits_the_sequence(self) -> "Job":
        cp, s = self.plan.context_parallel_size, self.model.seq_length
        if cp == 1:
            return self
        if s % (2 * cp):
            raise ValueError(f"context_parallel_size={cp} splits each sequence into 2 x {cp} load-balanced chunks, "
                             f"which seq_length={s} does not divide; use a sequence that is a multiple of {2 * cp}")
        heads = self.model.num_attention_heads // self.plan.tensor_parallel_size
        if self.plan.cp_comm_type is CpCommType.a2a and heads % cp:
            raise ValueError(f"cp_comm_type 'a2a' spreads the {heads} attention heads of each TP rank over "
                             f"context_parallel_size={cp}, which does not divide them; use p2p or a CP size that does")
        return self

    @model_validator(mode="after")
    def _sequence_parallel_splits_the_sequence(self) -> "Job":
        # Megatron scatters the [s / cp, b, h] activations over the TP ranks along the sequence and asserts the
        # split is even (``_split_along_first_dim``); an uneven one cannot run, and would leave ranks no tokens
        p, s = self.plan, self.model.seq_length
        t, cp = p.tensor_parallel_size, p.context_parallel_size
        if not p.sequence_parallel or (s // cp) % t == 0:
            return self
        tokens = (f"the seq_length={s} / context_parallel_size={cp} = {s // cp} tokens of each CP rank" if cp > 1
                  else f"the seq_length={s} tokens of each sequence")
        raise ValueError(f"sequence_parallel splits {tokens} over tensor_parallel_size={t} ranks, which Megatron can "
                         f"only do evenly; use a sequence that is a multiple of {t * cp}, a TP size that divides "
                         f"{s // cp}, or turn sequence parallelism off")

    @model_validator(mode="after")
    def _recompute_layers_fit_chunk(self) -> "Job":
        r = self.plan.recompute
        if r.granularity is RecomputeGranularity.full and r.num_layers > max(self.layers_per_chunk):
            raise ValueError(
                f"recompute num_layers={r.num_layers} is more than the {max(self.layers_per_chunk)} layers of a "
                "pipeline chunk; use at most that"
            )
        return self

    @property
    def num_gpus(self) -> int:
        return self.plan.num_gpus

    @property
    def num_nodes(self) -> int:
        return -(-self.num_gpus // self.cluster.gpus_per_node)

    @cached_property
    def chunk_layers(self) -> tuple[tuple[int, ...], ...]:
        """Transformer layers of each model chunk of each stage, ``[stage][chunk]``, as Megatron splits them."""
        plan = self.plan
        key = (self.model.num_layers, plan.pipeline_parallel_size, plan.virtual_pipeline_stages,
               plan.decoder_first_pipeline_num_layers, plan.decoder_last_pipeline_num_layers,
               plan.account_for_embedding_in_pipeline_split, plan.account_for_loss_in_pipeline_split,
               plan.pipeline_layer_split)
        return _split(*key)

    @cached_property
    def layers_per_stage(self) -> tuple[int, ...]:
        return tuple(sum(c) for c in self.chunk_layers)

    def chunk_first_layer(self, stage: int, chunk: int) -> int:
        """The global index of a chunk's first layer: model chunks in order, chunk-major (Megatron's
        ``get_transformer_layer_offset``), so uneven chunks shift every later one."""
        return _chunk_offsets(self.chunk_layers)[stage][chunk]

    def chunk_runs(self, stage: int, chunk: int) -> tuple[tuple[bool, int], ...]:
        """A chunk's layers in forward order as runs of (is an MoE layer, how many): ``((False, n),)`` for
        a dense model, so a chunk costs one step per run, whatever its layer count."""
        return self.layer_runs[stage][chunk]

    @cached_property
    def layer_runs(self) -> tuple[tuple[tuple[tuple[bool, int], ...], ...], ...]:
        """``chunk_runs`` of every chunk, ``[stage][chunk]``."""
        return _layer_runs(self.model, self.chunk_layers)

    @cached_property
    def moe_layers_per_stage(self) -> tuple[int, ...]:
        """MoE layers among each stage's transformer layers."""
        return _moe_layers_per_stage(self.model, self.chunk_layers)

    @cached_property
    def layers_per_chunk(self) -> tuple[int, ...]:
        """The largest model chunk of each stage (chunks differ only when the embedding or loss takes a slot)."""
        return tuple(max(c) for c in self.chunk_layers)


@lru_cache(maxsize=4096)
def _split(layers, p, v, first, last, embedding, loss, explicit) -> tuple[tuple[int, ...], ...]:
    return chunk_layers(layers, p, v, first=first, last=last, account_for_embedding=embedding,
                        account_for_loss=loss, explicit=explicit)


@lru_cache(maxsize=4096)
def _layer_runs(model: ModelSpec, split: tuple[tuple[int, ...], ...]):
    offsets = _chunk_offsets(split)
    return tuple(tuple(_runs(model, offsets[s][c], n) for c, n in enumerate(row)) for s, row in enumerate(split))


@lru_cache(maxsize=4096)
def _moe_layers_per_stage(model: ModelSpec, split: tuple[tuple[int, ...], ...]) -> tuple[int, ...]:
    if not model.is_moe:
        return (0,) * len(split)
    return tuple(sum(k for runs in row for moe, k in runs if moe) for row in _layer_runs(model, split))


@lru_cache(maxsize=65536)
def _runs(model: ModelSpec, first: int, n: int) -> tuple[tuple[bool, int], ...]:
    if not model.is_moe:
        return ((False, n),) if n else ()
    runs: list[list] = []
    for i in range(first, first + n):
        moe = model.is_moe_layer(i)
        if runs and runs[-1][0] == moe:
            runs[-1][1] += 1
        else:
            runs.append([moe, 1])
    return tuple((m, k) for m, k in runs)


@lru_cache(maxsize=4096)
def _chunk_offsets(split: tuple[tuple[int, ...], ...]) -> tuple[tuple[int, ...], ...]:
    p, v = len(split), len(split[0])
    first = [[0] * v for _ in range(p)]
    offset = 0
    for c in range(v):
        for s in range(p):
            first[s][c] = offset
            offset += split[s][c]
    return tuple(tuple(row) for row in first)


__all__ = [
    "AttentionBackend",
    "CpCommType",
    "DataParallelSharding",
    "Fp8Format",
    "Job",
    "MoEDispatcher",
    "ParallelPlan",
    "PipelineSchedule",
    "Precision",
    "RecomputeGranularity",
    "RecomputeMethod",
    "RecomputePolicy",
    "StateDtype",
]
