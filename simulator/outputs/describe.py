"""How a job is named in headers, figure titles and JSON: one place, so every output says the same.

Every output states what a plan's numbers depend on beyond its layout: the sequence length, the
precision (and FP8 recipe) and the attention backend (Megatron's --attention-backend: auto, flash and
fused run a fused kernel; unfused and local Megatron's own softmax path).
"""

from __future__ import annotations

from typing import Any

from simulator.spec.hardware import ClusterSpec
from simulator.spec.model import ModelSpec
from simulator.spec.plan import Job, ParallelPlan, RecomputeGranularity


def attention_backend(plan: ParallelPlan) -> str:
    """Megatron's --attention-backend of the plan: auto, flash, fused (no s x s scores stored), unfused or local."""
    return plan.attention_backend.value


def precision_label(plan: ParallelPlan) -> str:
    return plan.precision.value + (f" + fp8 {plan.fp8_format.value}" if plan.fp8_format is not None else "")


def run_settings(seq_length: int, plan: ParallelPlan) -> str:
    """'sequence 2,048, bf16, unfused attention': the settings that change every number."""
    return f"sequence {seq_length:,}, {precision_label(plan)}, {attention_backend(plan)} attention"


def settings_json(model: ModelSpec, plan: ParallelPlan) -> dict[str, Any]:
    """The JSON keys every document carries: ``seq_length``, ``precision``, ``fp8_format``, ``attention_backend``."""
    return {"seq_length": model.seq_length, "precision": plan.precision.value,
            "fp8_format": plan.fp8_format.value if plan.fp8_format is not None else None,
            "attention_backend": attention_backend(plan)}


def title(model: ModelSpec, cluster: ClusterSpec, num_gpus: int, global_batch_size: int, plan: ParallelPlan) -> str:
    """A figure title: model, cluster, GPUs, global batch and the run settings."""
    return (f"{model.name} on {num_gpus:,} x {cluster.gpu.name} ({cluster.name}), global batch {global_batch_size:,}\n"
            + run_settings(model.seq_length, plan))


def job_title(job: Job) -> str:
    return title(job.model, job.cluster, job.num_gpus, job.plan.global_batch_size, job.plan)


def layout(plan: ParallelPlan) -> str:
    """A plan's layout in one short line: 'TP 8, PP 16 x2, DP 8, mbs 1, SP, selective, dist-opt'."""
    r = plan.recompute
    rec = r.granularity.value
    if r.granularity is RecomputeGranularity.full:
        rec += f" ({r.method.value} {r.num_layers})"
    parts = [f"TP {plan.tensor_parallel_size}",
             *([f"CP {plan.context_parallel_size}"] if plan.context_parallel_size > 1 else []),
             f"PP {plan.pipeline_parallel_size}" + (f" x{plan.virtual_pipeline_stages}" if plan.interleaved else ""),
             f"DP {plan.data_parallel_size}", f"mbs {plan.micro_batch_size}"]
    if plan.sequence_parallel:
        parts.append("SP")
    parts.append(f"recompute {rec}")
    if plan.use_distributed_optimizer:
        parts.append("dist-opt")
    return ", ".join(parts)


def short_layout(plan: ParallelPlan) -> str:
    """The layout in a figure label's width: 'TP8 PP16x2 mbs1 SP sel'."""
    rec = {"none": "", "selective": " sel", "full": " full"}[plan.recompute.granularity.value]
    if plan.recompute.granularity is RecomputeGranularity.full and plan.recompute.method.value == "block":
        rec += f"/b{plan.recompute.num_layers}"
    return (f"TP{plan.tensor_parallel_size} PP{plan.pipeline_parallel_size}"
            + (f"x{plan.virtual_pipeline_stages}" if plan.interleaved else "")
            + f" mbs{plan.micro_batch_size}" + (" SP" if plan.sequence_parallel else "") + rec
            + (" DO" if plan.use_distributed_optimizer else ""))
