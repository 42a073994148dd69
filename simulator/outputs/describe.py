"""How a job is named in headers, figure titles and JSON: one place, so every output says the same.

Every output states what a plan's numbers depend on beyond its layout: the sequence length, the
precision (and FP8 recipe) and the attention backend (Megatron's --attention-backend: auto, flash and
fused run a fused kernel; unfused and local Megatron's own softmax path).
"""

from __future__ import annotations

from typing import Any

from simulator.spec.hardware import ClusterSpec
from simulator.spec.model import ModelSpec
from simulator.spec.plan import Job, ParallelPlan
from simulator.spec.plan_names import compact_plan_name, label_plan_name, plan_name


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
    """A plan's layout in one short line: 'TP 8, PP 16 x2, DP 8, mbs 1, SP, recompute selective,
    distributed optimizer (ZeRO-1)' (``simulator.spec.plan_names``, which every output names plans by)."""
    return plan_name(plan)


def compact_layout(plan: ParallelPlan) -> str:
    """The layout in a table column: 'TP8 PP16x2 DP8 mbs1 SP+ selective ZeRO-1'."""
    return compact_plan_name(plan)


def short_layout(plan: ParallelPlan) -> str:
    """The layout in a figure label's width: 'TP8 PP16x2 mbs1 SP sel ZeRO-1'."""
    return label_plan_name(plan)


def band_origin(validation_regime: str | None, outside_reasons: tuple[str, ...] | list[str],
                from_runs: tuple[str, ...] | list[str] = ()) -> str:
    """Where a plan's band comes from, in words: the runs a profile was fitted to (``calibrate --from-runs``), the
    measured regime the plan lies in, or why it lies outside every one (the band widened)."""
    if from_runs:
        n = len(from_runs)
        text = (f"the leave-one-run-out errors of the {n} run{'' if n == 1 else 's'} the profile was fitted to "
                "(calibrate --from-runs), which the plan is like")
        if validation_regime is None and outside_reasons:
            text += "; the repository's measured runs do not cover it: " + "; ".join(outside_reasons)
        return text
    if validation_regime is not None:
        return (f"the model's error on the measured runs of its regime ({validation_regime}), or the unpinned "
                "constants' spread where wider")
    return "widened, the plan is outside every measured regime: " + "; ".join(outside_reasons)
