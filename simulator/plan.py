"""``ParallelPlan`` and ``RecomputePolicy``: how a model is laid out on GPUs, and ``Job`` that checks
a plan against a model and a cluster.

Rules that need only the plan are validators here; rules that need the model or the cluster
(heads, layers, GPUs per node) are validators of ``Job``. Each message names the values and the fix.
"""

from __future__ import annotations

from enum import Enum

from pydantic import BaseModel, ConfigDict, Field, model_validator

from simulator import limits
from simulator.hardware import ClusterSpec
from simulator.model import ModelSpec


class RecomputeGranularity(str, Enum):
    none = "none"
    selective = "selective"  # the attention core only (Korthikanti Section 5)
    full = "full"  # whole layers, keeping only their inputs


class RecomputeMethod(str, Enum):
    uniform = "uniform"  # checkpoint every group of `num_layers` layers
    block = "block"  # checkpoint only the first `num_layers` layers of each stage (chunk)


class Precision(str, Enum):
    bf16 = "bf16"
    fp16 = "fp16"
    fp32 = "fp32"  # the reference loop on CPUs

    @property
    def activation_bytes(self) -> int:
        return 4 if self is Precision.fp32 else 2


class Fp8Format(str, Enum):
    """Transformer Engine's FP8 recipes (Megatron ``--fp8-format``); both run at the same tensor-core peak."""

    hybrid = "hybrid"  # e4m3 forward, e5m2 gradients
    e4m3 = "e4m3"  # e4m3 throughout


class PipelineSchedule(str, Enum):
    gpipe = "gpipe"
    one_f_one_b = "1f1b"  # interleaved when virtual_pipeline_stages > 1


class RecomputePolicy(BaseModel):
    """Megatron's --recompute-granularity / --recompute-method / --recompute-num-layers."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    granularity: RecomputeGranularity = RecomputeGranularity.none
    method: RecomputeMethod = RecomputeMethod.uniform
    num_layers: int = Field(
        1, gt=0, le=limits.MAX_LAYERS,
        description="full/uniform: layers per checkpointed group; full/block: checkpointed layers per chunk.",
    )


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _say_divisors(n: int) -> str:
    d = _divisors(n)
    return ", ".join(str(x) for x in d[:-1]) + f" or {d[-1]}" if len(d) > 1 else str(d[0])


class ParallelPlan(BaseModel):
    """One training layout: parallel sizes, batch, recompute, optimizer and precision."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tensor_parallel_size: int = Field(
        1, gt=0, le=limits.MAX_GPUS, description="TP ranks that split each layer (Megatron column/row parallel)."
    )
    pipeline_parallel_size: int = Field(1, gt=0, le=limits.MAX_GPUS, description="Pipeline stages.")
    data_parallel_size: int = Field(1, gt=0, le=limits.MAX_GPUS, description="Model replicas.")
    virtual_pipeline_stages: int = Field(
        1, gt=0, le=limits.MAX_LAYERS, description="Model chunks per pipeline stage (interleaved 1F1B)."
    )
    sequence_parallel: bool = Field(False, description="Split norms/dropouts along the sequence (Korthikanti Section 4.2.2).")
    micro_batch_size: int = Field(1, gt=0, le=limits.MAX_MICRO_BATCH_SIZE, description="Sequences per micro-batch, b.")
    global_batch_size: int = Field(
        1, gt=0, le=limits.MAX_GLOBAL_BATCH_SIZE, description="Sequences per iteration, all replicas together."
    )
    recompute: RecomputePolicy = RecomputePolicy()
    use_distributed_optimizer: bool = Field(False, description="Shard fp32 master weights and Adam state over DP (ZeRO-1).")
    precision: Precision = Precision.bf16
    fp8_format: Fp8Format | None = Field(
        None,
        description="Run the transformer layers' linear GEMMs (QKV, projection, fc1, fc2: forward, dgrad, wgrad) "
        "in FP8 on Hopper, as Transformer Engine does; attention, the output layer and every activation stay in "
        "`precision` (the memory model keeps bf16 activations). None = no FP8.",
    )
    use_flash_attention: bool = Field(False, description="Fused attention that never materialises the s x s scores.")
    overlap_grad_reduce: bool = Field(False, description="Overlap the DP gradient reduction with the backward pass.")
    overlap_p2p_comm: bool = Field(
        False, description="Pipeline sends run beside compute; off = Megatron's blocking send/receive exchange."
    )
    schedule: PipelineSchedule = PipelineSchedule.one_f_one_b
    allow_tp_across_nodes: bool = Field(False, description="Accept tensor parallelism wider than a node.")
    pipeline_layer_split: tuple[int, ...] | None = Field(
        None, max_length=limits.MAX_LAYERS,
        description="Layers per stage when they do not divide evenly (sums to num_layers).",
    )

    @property
    def num_gpus(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size * self.data_parallel_size

    @property
    def num_micro_batches(self) -> int:
        """Micro-batches each pipeline plays per iteration."""
        return self.global_batch_size // (self.micro_batch_size * self.data_parallel_size)

    @property
    def interleaved(self) -> bool:
        return self.virtual_pipeline_stages > 1

    @model_validator(mode="after")
    def _sequence_parallel_needs_tp(self) -> "ParallelPlan":
        if self.sequence_parallel and self.tensor_parallel_size == 1:
            raise ValueError("sequence_parallel needs tensor_parallel_size > 1; raise TP or turn sequence parallelism off")
        return self

    @model_validator(mode="after")
    def _batch_divides(self) -> "ParallelPlan":
        per_step = self.micro_batch_size * self.data_parallel_size
        if self.global_batch_size % per_step:
            raise ValueError(
                f"global_batch_size={self.global_batch_size} is not divisible by micro_batch_size={self.micro_batch_size} "
                f"x data_parallel_size={self.data_parallel_size} = {per_step}; use a multiple of {per_step}"
            )
        return self

    @model_validator(mode="after")
    def _gpus_and_steps_bounded(self) -> "ParallelPlan":
        if self.num_gpus > limits.MAX_GPUS:
            raise ValueError(
                f"tensor_parallel_size={self.tensor_parallel_size} x "
                f"pipeline_parallel_size={self.pipeline_parallel_size} x "
                f"data_parallel_size={self.data_parallel_size} = {self.num_gpus:,} GPUs, more than the "
                f"{limits.MAX_GPUS:,} the simulator takes; use fewer GPUs"
            )
        chunks = self.pipeline_parallel_size * self.virtual_pipeline_stages * self.num_micro_batches
        if chunks > limits.MAX_PIPELINE_CHUNKS:
            raise ValueError(
                f"each pipeline would play {self.num_micro_batches:,} micro-batches x "
                f"{self.pipeline_parallel_size} stages x {self.virtual_pipeline_stages} chunks = {chunks:,} "
                "forward steps per iteration, more than the "
                f"{limits.MAX_PIPELINE_CHUNKS:,} the simulator plays; raise the micro-batch size or the data-parallel "
                "size, or lower the global batch"
            )
        return self

    @model_validator(mode="after")
    def _interleaving_needs_pipeline(self) -> "ParallelPlan":
        if self.interleaved:
            p = self.pipeline_parallel_size
            if p == 1:
                raise ValueError(
                    f"virtual_pipeline_stages={self.virtual_pipeline_stages} needs pipeline_parallel_size > 1; "
                    "set it to 1 or add pipeline stages"
                )
            if self.schedule is PipelineSchedule.gpipe:
                raise ValueError("virtual_pipeline_stages > 1 needs the 1f1b schedule, not gpipe")
            if self.num_micro_batches % p:
                raise ValueError(
                    f"the interleaved schedule needs the micro-batches per pipeline ({self.num_micro_batches}) to be a "
                    f"multiple of pipeline_parallel_size={p}; change the global batch or the micro-batch size"
                )
        return self

    @model_validator(mode="after")
    def _fp8_needs_mixed_precision(self) -> "ParallelPlan":
        if self.fp8_format is not None and self.precision is Precision.fp32:
            raise ValueError(
                f"fp8_format={self.fp8_format.value!r} runs beside bf16/fp16 mixed precision, not fp32; "
                "use precision bf16 or drop the FP8 format"
            )
        return self

    @model_validator(mode="after")
    def _recompute_layers_only_for_full(self) -> "ParallelPlan":
        if self.recompute.granularity is not RecomputeGranularity.full and self.recompute.num_layers != 1:
            raise ValueError(
                f"recompute num_layers={self.recompute.num_layers} applies only to granularity 'full' "
                f"(got {self.recompute.granularity.value!r}); drop --recompute-num-layers or use full"
            )
        return self


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

    @model_validator(mode="after")
    def _tp_within_node(self) -> "Job":
        t, n = self.plan.tensor_parallel_size, self.cluster.gpus_per_node
        if t > n and not self.plan.allow_tp_across_nodes:
            raise ValueError(
                f"tensor_parallel_size={t} is more than the {n} GPUs per node of {self.cluster.name}, so every layer "
                f"would talk over InfiniBand; use at most {n} or insist with allow_tp_across_nodes"
            )
        if t <= n and n % t:
            raise ValueError(f"tensor_parallel_size={t} must divide the {n} GPUs per node; use {_say_divisors(n)}")
        return self

    @model_validator(mode="after")
    def _pipeline_splits_layers(self) -> "Job":
        p, v, L = self.plan.pipeline_parallel_size, self.plan.virtual_pipeline_stages, self.model.num_layers
        split = self.plan.pipeline_layer_split
        if split is not None:
            if len(split) != p or sum(split) != L or min(split) < 1:
                raise ValueError(
                    f"pipeline_layer_split={list(split)} must give {p} stages of at least one layer summing to "
                    f"num_layers={L}"
                )
            if v > 1:
                raise ValueError("pipeline_layer_split cannot be combined with virtual_pipeline_stages > 1")
            return self
        if L % (p * v):
            what = f"pipeline_parallel_size={p}" + (f" x virtual_pipeline_stages={v} = {p * v}" if v > 1 else "")
            raise ValueError(
                f"{what} does not divide num_layers={L}; use a divisor of {L} ({_say_divisors(L)}) "
                "or state the split with pipeline_layer_split"
            )
        return self

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

    @property
    def layers_per_stage(self) -> tuple[int, ...]:
        p = self.plan.pipeline_parallel_size
        if self.plan.pipeline_layer_split is not None:
            return self.plan.pipeline_layer_split
        return (self.model.num_layers // p,) * p

    @property
    def layers_per_chunk(self) -> tuple[int, ...]:
        """Layers of one model chunk on each stage (a stage holds virtual_pipeline_stages chunks)."""
        v = self.plan.virtual_pipeline_stages
        return tuple(n // v for n in self.layers_per_stage)
