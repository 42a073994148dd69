"""The report's check of two published Llama 3 405B layouts that trained on 80 GB H100s.

Each layout is predicted as Megatron runs it by default (bf16 weights, an fp32 gradient buffer the
distributed optimizer does not shard, Megatron's interleaved schedule) and again with the one setting of
the published run that those defaults leave out: where the layout does not fit as Megatron's defaults
run it, the memory model is not at fault, the run's own setting is, and the section says which and by
how much (``simulator memory`` with the flags named reproduces each row).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from simulator.estimator.memory import memory_plan
from simulator.outputs.report_scenarios import _table
from simulator.spec.catalog import PRESETS
from simulator.spec.hardware import load_cluster
from simulator.spec.plan import Job, ParallelPlan
from simulator.spec.units import gib

MODEL, CLUSTER = "llama3-405b", "dgx-h100"


@dataclass(frozen=True)
class PublishedLayout:
    """A layout as published, and the setting of its run that Megatron's defaults lack."""

    name: str
    gpus: int
    plan: dict[str, Any]  # ParallelPlan fields as published; Megatron's defaults for the rest
    flags: str  # the layout as `simulator memory` flags
    setting: str  # the run's setting the defaults leave out, in words
    setting_plan: dict[str, Any]  # the ParallelPlan fields that set it
    setting_flags: str


LAYOUTS = (
    # Dubey et al. 2024, section 3.3.2: TP 8, PP 16, DP 128, 16 sequences of 8,192 per replica, one layer fewer
    # on the first and the last stage (Megatron: the embedding and the loss counted as layers of the split), and
    # FSDP sharding the optimizer state and the gradients, reduced in fp32, the weights kept after the forward
    PublishedLayout(
        name="Meta, Llama 3 405B (TP 8, PP 16 x4 virtual, DP 128)", gpus=16384,
        plan=dict(tensor_parallel_size=8, pipeline_parallel_size=16, virtual_pipeline_stages=4, data_parallel_size=128,
                  sequence_parallel=True, micro_batch_size=1, global_batch_size=2048,
                  account_for_embedding_in_pipeline_split=True, account_for_loss_in_pipeline_split=True,
                  use_distributed_optimizer=True),
        flags="--gpus 16384 --tp 8 --pp 16 --vpp 4 --sp --gbs 2048 --account-for-embedding-in-pipeline-split "
              "--account-for-loss-in-pipeline-split --use-distributed-optimizer",
        setting="gradients sharded over the data-parallel ranks with the optimizer state (Meta's FSDP; Megatron's "
                "ZeRO-2 level)",
        setting_plan=dict(use_distributed_optimizer=False, data_parallel_sharding_strategy="optim_grads"),
        setting_flags="--data-parallel-sharding-strategy optim_grads"),
    # NeMo's Llama 3.1 405B training configuration (TP 8, PP 9 with 7 virtual stages, CP 2, SP, micro-batch 1,
    # global batch 2,016, the distributed optimizer) on 576 GPUs; NeMo's 405B performance recipe keeps the
    # gradients in bf16 (grad_reduce_in_fp32=False)
    PublishedLayout(
        name="NVIDIA, Llama 3.1 405B recipe (TP 8, PP 9 x7 virtual, CP 2, DP 4)", gpus=576,
        plan=dict(tensor_parallel_size=8, pipeline_parallel_size=9, virtual_pipeline_stages=7, context_parallel_size=2,
                  data_parallel_size=4, sequence_parallel=True, micro_batch_size=1, global_batch_size=2016,
                  use_distributed_optimizer=True),
        flags="--gpus 576 --tp 8 --pp 9 --vpp 7 --cp 2 --sp --gbs 2016 --use-distributed-optimizer",
        setting="gradient buffer and reduction in bf16 (NeMo's 405B performance setting, grad_reduce_in_fp32=False)",
        setting_plan=dict(grad_reduce_in_bf16=True), setting_flags="--grad-reduce-in-bf16"),
)


def layout_job(layout: PublishedLayout, with_setting: bool = False) -> Job:
    fields = {**layout.plan, **(layout.setting_plan if with_setting else {})}
    return Job(model=PRESETS[MODEL], cluster=load_cluster(CLUSTER), plan=ParallelPlan(**fields))


def _peak(job: Job) -> dict[str, Any]:
    mem = memory_plan(job)
    stage = max(mem.stages, key=lambda s: s.peak_bytes)
    return {"peak_gib": gib(mem.peak_bytes), "fits": mem.fits, "stage": stage.stage,
            "gradients_gib": gib(stage.gradients_bytes), "activations_gib": gib(stage.activations_bytes)}


# NeMo's launcher configuration of the same NVIDIA layout counts 576 nodes of 8 GPUs, not 576 GPUs
NODES_READING_GPUS = 576 * 8


def nodes_reading_job() -> Job:
    """The NVIDIA layout on 576 nodes: DP 32, the same global batch of 2,016."""
    lay = LAYOUTS[1]
    dp = NODES_READING_GPUS // lay.gpus * lay.plan["data_parallel_size"]
    return Job(model=PRESETS[MODEL], cluster=load_cluster(CLUSTER), plan=ParallelPlan(**{**lay.plan,
                                                                                        "data_parallel_size": dp}))


def layouts_data() -> dict[str, Any]:
    """Per layout: its heaviest stage as published under Megatron's defaults, and with the run's setting; and
    the NVIDIA layout on 576 nodes as published."""
    return {"layouts": [{"name": lay.name, "published": _peak(layout_job(lay)),
                         "with_setting": _peak(layout_job(lay, True))} for lay in LAYOUTS],
            "nvidia_on_576_nodes": _peak(nodes_reading_job())}


def layouts_lines(data: dict[str, Any]) -> list[str]:
    capacity = gib(load_cluster(CLUSTER).gpu.memory_bytes)
    lines = [f"### Two published 405B layouts in {capacity:.0f} GiB", "",
             "Both trained on H100-80GB. As Megatron runs them by default (an fp32 gradient buffer that the "
             "distributed optimizer leaves whole on every rank: 6 + 12/d bytes a parameter) neither fits; the "
             "setting of each run that the defaults leave out is what makes it fit:", ""]
    rows = []
    for lay, d in zip(LAYOUTS, data["layouts"]):
        p, s = d["published"], d["with_setting"]
        rows.append([lay.name, f"{lay.gpus:,}", f"{p['peak_gib']:.1f} (stage {p['stage']})",
                     "yes" if p["fits"] else "no", lay.setting, f"{s['peak_gib']:.1f}", "yes" if s["fits"] else "no"])
    lines += _table(["layout", "GPUs", "peak GiB, Megatron's defaults", "fits", "the run's setting",
                     "peak GiB with it", "fits"], rows)
    lines.append("")
    for lay, d in zip(LAYOUTS, data["layouts"]):
        p, s = d["published"], d["with_setting"]
        lines.append(f"- {lay.name}: the setting takes the heaviest stage's gradients from {p['gradients_gib']:.1f} "
                     f"to {s['gradients_gib']:.1f} GiB and its peak from {p['peak_gib']:.1f} to {s['peak_gib']:.1f} "
                     f"GiB, {capacity - s['peak_gib']:.1f} GiB under the GPU's {capacity:.0f}; activations stay "
                     f"{s['activations_gib']:.1f} GiB (`simulator memory --model {MODEL} --cluster {CLUSTER} "
                     f"{lay.flags} {lay.setting_flags}`).")
    n = data["nvidia_on_576_nodes"]
    lines.append(f"- NeMo's launcher configuration of the NVIDIA layout counts 576 nodes ({NODES_READING_GPUS:,} GPUs, "
                 f"DP 32): there the distributed optimizer's shard of the optimizer state is eight times smaller and "
                 f"the layout {'fits' if n['fits'] else 'does not fit'} with fp32 gradients, at {n['peak_gib']:.1f} GiB.")
    return lines + [""]
