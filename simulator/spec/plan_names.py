"""How a plan is named, in three widths, so that every output (the search's table, the sweep's rows, a
figure's labels, the report, the HTML page, the Python example) calls one plan by one name.

Each width says every dimension that tells two plans of the search apart: TP, CP, EP (and ETP where it
is not TP), PP with its split and virtual stages, DP, micro-batch, SP, recompute, and what DP shards,
named by its ZeRO stage (the distributed optimizer is ZeRO-1; Megatron-FSDP's optim_grads ZeRO-2, its
optim_grads_params ZeRO-3).
"""

from __future__ import annotations

from simulator.spec.plan import DataParallelSharding, ParallelPlan, RecomputeGranularity, RecomputeMethod

# what DP shards: (long, compact); no_shard is said by saying nothing
SHARDING_NAMES: dict[DataParallelSharding, tuple[str, str]] = {
    DataParallelSharding.optim: ("distributed optimizer (ZeRO-1)", "ZeRO-1"),
    DataParallelSharding.optim_grads: ("Megatron-FSDP optim_grads (ZeRO-2)", "ZeRO-2"),
    DataParallelSharding.optim_grads_params: ("Megatron-FSDP optim_grads_params (ZeRO-3)", "FSDP"),
}


def sharding_name(plan: ParallelPlan, compact: bool = False) -> str:
    """'distributed optimizer (ZeRO-1)' or 'ZeRO-1', ...; '' when DP shards nothing."""
    names = SHARDING_NAMES.get(plan.sharding)
    return "" if names is None else names[compact]


def _experts(plan: ParallelPlan, sep: str) -> list[str]:
    out = []
    if plan.expert_model_parallel_size > 1 or plan.expert_tensor_parallel_size is not None:
        out.append(f"EP{sep}{plan.expert_model_parallel_size}")
    if plan.expert_tensor_parallel_size is not None:
        out.append(f"ETP{sep}{plan.expert_tensor_parallel_size}")
    return out


def _split(plan: ParallelPlan) -> str:
    if plan.decoder_first_pipeline_num_layers or plan.decoder_last_pipeline_num_layers:
        return f"({plan.decoder_first_pipeline_num_layers}..{plan.decoder_last_pipeline_num_layers})"
    if plan.account_for_embedding_in_pipeline_split or plan.account_for_loss_in_pipeline_split:
        return "(e+l)"
    return ""


def _recompute(plan: ParallelPlan, compact: bool) -> str:
    r = plan.recompute
    if r.granularity is not RecomputeGranularity.full:
        return r.granularity.value
    return f"full/{r.method.value}:{r.num_layers}" if compact else f"full ({r.method.value}, {r.num_layers})"


def plan_name(plan: ParallelPlan) -> str:
    """The plan in words: 'TP 8, PP 16 x2, DP 8, mbs 1, SP, recompute selective, distributed optimizer (ZeRO-1)'."""
    parts = [f"TP {plan.tensor_parallel_size}",
             *([f"CP {plan.context_parallel_size}"] if plan.context_parallel_size > 1 else []),
             *_experts(plan, " "),
             f"PP {plan.pipeline_parallel_size}{_split(plan)}"
             + (f" x{plan.virtual_pipeline_stages}" if plan.interleaved else ""),
             f"DP {plan.data_parallel_size}", f"mbs {plan.micro_batch_size}"]
    if plan.sequence_parallel:
        parts.append("SP")
    parts.append(f"recompute {_recompute(plan, False)}")
    if sharding_name(plan):
        parts.append(sharding_name(plan))
    return ", ".join(parts)


def compact_plan_name(plan: ParallelPlan) -> str:
    """The plan in a table's column: 'TP8 PP16x2 DP8 mbs1 SP+ selective ZeRO-1'."""
    head = " ".join([f"TP{plan.tensor_parallel_size}",
                     *([f"CP{plan.context_parallel_size}"] if plan.context_parallel_size > 1 else []),
                     *_experts(plan, ""),
                     f"PP{plan.pipeline_parallel_size}{_split(plan)}"
                     + (f"x{plan.virtual_pipeline_stages}" if plan.interleaved else "")])
    tail = f" {sharding_name(plan, compact=True)}" if sharding_name(plan) else ""
    return (f"{head} DP{plan.data_parallel_size} mbs{plan.micro_batch_size} "
            f"SP{'+' if plan.sequence_parallel else '-'} {_recompute(plan, True)}{tail}")


def label_plan_name(plan: ParallelPlan) -> str:
    """The plan in a figure label's width (DP follows from the GPUs, a recompute of none goes unsaid):
    'TP8 PP16x2 mbs1 SP sel ZeRO-1'."""
    r = plan.recompute
    rec = {"none": "", "selective": " sel", "full": " full"}[r.granularity.value]
    if r.granularity is RecomputeGranularity.full and r.method is RecomputeMethod.block:
        rec += f"/b{r.num_layers}"
    return " ".join([f"TP{plan.tensor_parallel_size}",
                     *([f"CP{plan.context_parallel_size}"] if plan.context_parallel_size > 1 else []),
                     *_experts(plan, ""),
                     f"PP{plan.pipeline_parallel_size}" + (f"x{plan.virtual_pipeline_stages}" if plan.interleaved
                                                           else "")]) \
        + f" mbs{plan.micro_batch_size}" + (" SP" if plan.sequence_parallel else "") + rec \
        + (f" {sharding_name(plan, compact=True)}" if sharding_name(plan) else "")
