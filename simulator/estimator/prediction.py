"""``estimate(job)``: iteration time, its breakdown, MFU/HFU, tokens/s and training days.

The layer graph is costed op by op (simulator.schedule.timing), the pipeline is played by the
discrete-event engine (simulator.schedule.engine), and memory comes from simulator.estimator.memory. Nothing here
reads an end-to-end measurement.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from simulator.estimator.memory import MemoryPlan, memory_plan
from simulator.estimator.regime import band_table
from simulator.graph.layers import Stream
from simulator.schedule import fast_engine
from simulator.schedule.engine import EngineResult, simulate
from simulator.schedule.schedules import build_schedule
from simulator.schedule.stage_work import build_work, layer_kinds, recomputed_layers, replayed_runs
from simulator.schedule.timing import LayerTimes, StageExtraTimes, cost_model_for, extra_times
from simulator.spec.plan import Job, RecomputeGranularity

SECONDS_PER_DAY = 86400.0


# A NaN or an infinity in an answer is a bug upstream (a 0/0, a GEMM of no rows), never a time to print: the
# answer's models refuse one where they are made (an internal invariant, so its traceback stays).
FINITE = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class Breakdown(BaseModel):
    """Where the iteration goes on its critical (slowest) stage; the parts sum to the iteration time."""

    model_config = FINITE

    compute_s: float = Field(description="Compute kernels (GEMMs, attention, memory-bound ops), recompute included.")
    tp_communication_s: float = Field(description="Tensor-parallel collectives not hidden behind compute (and, for "
                                                  "an MoE model, the expert-parallel dispatch and combine).")
    pipeline_bubble_s: float = Field(description="Compute stream idle for want of work (warm-up, cool-down, imbalance).")
    pipeline_transfer_s: float = Field(description="Idle while an activation or gradient was in flight.")
    data_parallel_s: float = Field(description="Gradient reduction not hidden behind the backward pass.")
    optimizer_s: float = Field(description="Optimizer step (and the distributed optimizer's parameter all-gather).")
    host_overhead_s: float = Field(
        0.0, description="Device idle while the host issues work (Python, dispatch and launch of short ops, "
                         "per-micro-batch and per-exchange host work); part of the steps, apart from compute.")


class LayerTimesOut(BaseModel):
    model_config = FINITE

    forward_s: float
    backward_s: float
    recompute_s: float


class Estimate(BaseModel):
    """What `simulator plan` answers."""

    model_config = FINITE

    iteration_time_s: float
    mfu: float = Field(description="Model FLOPs utilisation, Korthikanti Appendix A (Eq. 7 FLOPs), against the dense "
                                   "peak of the plan's precision (bf16 for FP8 plans, as Megatron reports it); "
                                   "at most 1. Attention counts the full s x s product, as Megatron reports MFU, "
                                   "though a causal kernel runs about half of it (mfu_attention_count).")
    mfu_attention_count: Literal["full s x s"] = Field(
        "full s x s", description="How MFU, HFU and tflops_per_gpu count attention's score and context products: "
                                  "the full s x s, as Korthikanti's Eq. 7 and Megatron's reported MFU do, not the "
                                  "causal half a flash kernel executes.")
    hfu: float = Field(description="Hardware FLOPs utilisation: MFU's FLOPs plus those recompute replays (these "
                                   "counted op by op, as the kernels run them); at most 1.")
    utilisation_note: str | None = Field(
        None, description="Set when MFU or HFU came out above 1 and is shown as 1, with the values and why.")
    tokens_per_s: float
    tflops_per_gpu: float = Field(description="Model TFLOP/s achieved per GPU.")
    model_flops_per_iteration: float
    hardware_flops_per_iteration: float
    breakdown: Breakdown
    critical_stage: int
    layer: LayerTimesOut = Field(description="One transformer layer, one micro-batch, one TP rank (of an MoE model: "
                                             "the kind most of its layers are).")
    moe_layer: LayerTimesOut | None = Field(None, description="One MoE layer (router, dispatch, experts, combine), "
                                                              "for a mixture-of-experts model.")
    expert_dispatch_s: float | None = Field(
        None, description="Of the iteration, the critical stage's time in the MoE token dispatch and combine "
                          "collectives (all-to-all, or all-gather and reduce-scatter), on the communication stream; "
                          "the experts wait for them. None for a dense model.")
    moe_load_imbalance: float | None = Field(
        None, description="The busiest expert rank's tokens over the balanced share that the MoE layers were planned "
                          "for (the model's moe_load_imbalance). None for a dense model.")
    memory: MemoryPlan
    num_gpus: int
    tokens: float | None = None
    training_days: float | None = None
    gpu_hours: float | None = None
    iteration_time_s_low: float | None = Field(
        None, description="The band's fast end: the wider of the model's measured error in the plan's regime "
                          "and every unpinned profile constant at its fast end.")
    iteration_time_s_high: float | None = Field(None, description="... its slow end.")
    training_days_low: float | None = None
    training_days_high: float | None = None
    band_drivers: tuple[dict, ...] | None = Field(
        None, description="The unpinned constants that move the answer most, with their ranges and effects.")
    validation_regime: str | None = Field(
        None, description="The measured regime (GPU kind and the sets measured on it) the plan lies in; None "
                          "outside every one, or when no band was computed.")
    outside_regime_reasons: tuple[str, ...] = Field(
        (), description="Why the plan lies outside every measured regime (the band is widened for it).")
    band_from_runs: tuple[str, ...] = Field(
        (), description="The measured runs (a profile fitted by calibrate --from-runs) whose leave-one-run-out errors "
                        "give the band, where the plan has their regime features and TP size; empty where the "
                        "regime's band holds.")
    outside_validated_range: bool = Field(
        False, description="MFU above the best measured run on this GPU (its spec's best published run where the "
                              "repository holds none measured), or no published run on it at all.")
    validation_note: str = Field("", description="Why the answer is outside the validated range, if it is.")


def assert_finite(est: Estimate) -> Estimate:
    """``est``, after checking every number in it is finite: what validation checked when it was made, for an
    answer that reached the printer through a copy (``model_copy`` does not validate)."""
    def numbers(node, path: str):
        if isinstance(node, dict):
            for key, value in node.items():
                yield from numbers(value, f"{path}.{key}" if path else str(key))
        elif isinstance(node, (list, tuple)):
            for i, value in enumerate(node):
                yield from numbers(value, f"{path}[{i}]")
        elif isinstance(node, float):
            yield path, node

    bad = [(path, x) for path, x in numbers(est.model_dump(), "") if not math.isfinite(x)]
    assert not bad, f"the estimate holds numbers that are not finite: {bad[:3]}"
    return est


@dataclass(frozen=True)
class Simulation:
    """The estimate plus what produced it (for traces and timelines)."""

    estimate: Estimate
    engine: EngineResult
    layer: LayerTimes
    extras: StageExtraTimes
    moe_layer: LayerTimes | None = None

    def layer_of(self, moe: bool) -> LayerTimes:
        return self.moe_layer if moe and self.moe_layer is not None else self.layer


def model_flops_per_sequence(job: Job) -> float:
    """Forward + backward model FLOPs of one sequence (Korthikanti Eq. 7, generalised to GQA/SwiGLU and
    to mixture-of-experts layers, which count the parameters a token passes: the router, its top-k
    experts and the shared experts, not every expert).

    Attention scores and context count the full s x s product, as the paper does, even when a
    causal kernel skips half of it.
    """
    m = job.model
    s = m.seq_length

    def layer(moe: bool) -> float:
        return 2 * s * _matmul_parameters(m, moe) + 4 * s * s * m.q_size

    moe_layers = m.num_moe_layers
    logits = 2 * s * m.hidden_size * m.vocab_size
    return 3.0 * ((m.num_layers - moe_layers) * layer(False) + (moe_layers * layer(True) if moe_layers else 0)
                  + logits)


def _matmul_parameters(m, moe: bool) -> int:
    """A layer's weight-matrix parameters one token multiplies with (active ones for an MoE layer)."""
    def mlp_biases(ffn: int) -> int:
        return (2 if m.swiglu else 1) * ffn + m.hidden_size

    weights = m.layer_parameters(moe=moe, active=True) - 2 * m.norm_parameters() - (
        2 * m.head_dim if m.qk_layernorm else 0)
    if not m.add_bias_linear:  # Qwen2's query/key/value biases are no matrix
        return weights - (m.q_size + 2 * m.kv_size if m.add_qkv_bias else 0)
    biases = m.q_size + 2 * m.kv_size + m.hidden_size
    if moe:
        biases += m.moe_router_topk * mlp_biases(m.expert_ffn_size)
        if m.moe_shared_expert_intermediate_size:
            biases += mlp_biases(m.moe_shared_expert_intermediate_size)
    else:
        biases += mlp_biases(m.ffn_size)
    return weights - biases


def recompute_flops_per_iteration(job: Job) -> float:
    """FLOPs replayed by recompute in one iteration, all GPUs together."""
    from simulator.graph.layers import ordered_ops, transformer_layer

    plan = job.plan
    if plan.recompute.granularity is RecomputeGranularity.none:
        return 0.0
    per_rank = {moe: sum(op.flops for op in ordered_ops(transformer_layer(job.model, plan, moe).recompute))
                for moe in ((False, True) if job.model.is_moe else (False,))}
    flops = 0.0
    for stage, chunks in enumerate(job.chunk_layers):
        for c, n in enumerate(chunks):
            rec = recomputed_layers(job, n)
            for moe, _, replayed in replayed_runs(job.chunk_runs(stage, c), rec):
                flops += per_rank[moe] * replayed
    micro_batches = plan.global_batch_size // plan.micro_batch_size
    # each rank of a TP x CP group replays its part; expert work is per rank too (tokens x k copies)
    return flops * plan.tensor_parallel_size * plan.context_parallel_size * micro_batches


def executed_flops_by_stage(job: Job) -> tuple[float, ...]:
    """FLOPs one GPU of each pipeline stage executes in one iteration, counted op by op as its kernels run
    them: a causal flash kernel does half the s x s product (its backward 2.5x its forward, as it recomputes
    the scores) where Eq. 7 counts all of it, Megatron's unfused path does all of it, and recompute replays
    its ops. An MoE layer's experts are the busiest expert rank's."""
    from simulator.graph.layers import embedding_extras, ordered_ops, output_extras, transformer_layer

    def flops(*graphs) -> float:
        return sum(op.flops for g in graphs for op in ordered_ops(g))

    plan = job.plan
    layers = {moe: transformer_layer(job.model, plan, moe) for moe in ((False, True) if job.model.is_moe else (False,))}
    played = {moe: (flops(g.forward, g.backward), flops(g.recompute)) for moe, g in layers.items()}
    emb, out = embedding_extras(job.model, plan), output_extras(job.model, plan)
    p = plan.pipeline_parallel_size
    per_stage = []
    for stage, chunks in enumerate(job.chunk_layers):
        total = 0.0
        for c, n in enumerate(chunks):
            for moe, k, replayed in replayed_runs(job.chunk_runs(stage, c), recomputed_layers(job, n)):
                total += k * played[moe][0] + replayed * played[moe][1]
        if stage == 0:
            total += flops(emb.forward, emb.backward)
        if stage == p - 1:
            total += flops(out.forward, out.backward)
        per_stage.append(total * plan.num_micro_batches)
    return tuple(per_stage)


def simulate_job(job: Job, profile=None, tokens: float | None = None, record: bool = False,
                 layers: LayerTimes | None = None) -> Simulation:
    """Play one iteration of ``job``; ``layers`` replaces the cost model's per-layer times (e.g. by
    measured ones, to see what the rest of the model makes of them)."""
    cost = cost_model_for(job, profile)
    kinds = layer_kinds(job, cost, layers)
    lt = kinds.get(False, kinds.get(True))
    ext = extra_times(job, cost)
    mem = memory_plan(job)
    work = build_work(job, cost, kinds.get(False), ext, kinds.get(True))
    plan = job.plan
    p, m, v, kind = plan.pipeline_parallel_size, plan.num_micro_batches, plan.virtual_pipeline_stages, plan.schedule.value
    if record:  # the simpy engine keeps every interval for traces and timelines
        result = simulate(build_schedule(p, m, v, kind), work, record=True)
    else:  # the same recurrence without the event machinery (tests hold the two equal)
        result = fast_engine.run(p, m, v, work, kind)
    est = _summarise(job, cost, kinds, ext, work, result, mem, tokens)
    return Simulation(est, result, lt, ext, kinds.get(True))


def estimate(job: Job, profile=None, tokens: float | None = None) -> Estimate:
    """Predict one training iteration of ``job`` (and, with ``tokens``, the whole run)."""
    return simulate_job(job, profile, tokens).estimate


def _moe_dispatch_s(timeline) -> float:
    """Time a phase's MoE dispatch and combine collectives take on the communication stream."""
    return sum(iv.end_s - iv.start_s for iv in timeline.intervals
               if iv.stream is Stream.tp_comm and ".moe." in f".{iv.name}")


def _summarise(job, cost, layers, ext, work, result, mem, tokens) -> Estimate:
    plan = job.plan
    p, m = plan.pipeline_parallel_size, plan.num_micro_batches
    T = result.iteration_time_s
    ready = [r.grads_ready_s for r in result.stages]
    crit = max(range(p), key=lambda s: (ready[s], -s))
    r = result.stages[crit]
    compute = dispatch = 0.0
    for c, n in enumerate(job.chunk_layers[crit]):
        rec = recomputed_layers(job, n)
        for moe, k, rk in replayed_runs(job.chunk_runs(crit, c), rec):
            lt = layers[moe]
            compute += m * (k * lt.forward.compute_s + rk * lt.backward.compute_s + (k - rk) * lt.backward_only.compute_s)
            if moe:
                dispatch += m * (k * _moe_dispatch_s(lt.forward) + rk * _moe_dispatch_s(lt.backward)
                                 + (k - rk) * _moe_dispatch_s(lt.backward_only))
    if crit == 0:
        compute += m * (ext.embedding_forward.compute_s + ext.embedding_backward.compute_s)
    if crit == p - 1:
        compute += m * (ext.output_forward.compute_s + ext.output_backward.compute_s)
    compute = min(compute, r.busy_s)
    sw = work.stages[crit]
    host_wait = min(m * (sum(sw.forward_host_wait_s) + sum(sw.backward_host_wait_s)), r.busy_s - compute)
    exposed = r.busy_s - compute - host_wait
    if abs(exposed) <= 1e-9 * T:  # nothing but rounding left between the parts
        exposed = 0.0
    breakdown = Breakdown(
        compute_s=compute,
        tp_communication_s=exposed,
        pipeline_bubble_s=r.wait_s - r.transfer_wait_s + (max(ready) - ready[crit]),
        pipeline_transfer_s=r.transfer_wait_s,
        data_parallel_s=ready[crit] - r.last_backward_end_s,
        optimizer_s=T - max(ready),
        host_overhead_s=host_wait,
    )
    tokens_per_iter = plan.global_batch_size * job.model.seq_length
    model_flops = model_flops_per_sequence(job) * plan.global_batch_size
    hw_flops = model_flops + recompute_flops_per_iteration(job)
    peak = job.num_gpus * cost.peak_flops
    mfu, hfu = model_flops / (T * peak), hw_flops / (T * peak)
    note = None
    if hfu > 1:
        # Not an error in the time model: FP8 GEMMs run up to the fp8 peak (2x bf16 on Hopper), and Eq. 7
        # counts the whole s x s attention product while a causal kernel computes half of it. A
        # utilisation is at most 1, so it is capped and the rate stays in tflops_per_gpu.
        why = [why for cond, why in (
            (plan.fp8_format is not None, "the FP8 GEMMs run above that peak"),
            (plan.use_flash_attention, "Eq. 7 counts the whole s x s attention product that the causal kernel halves"),
        ) if cond] or ["the ops ran faster than that peak"]
        note = (f"MFU {mfu:.3f} and HFU {hfu:.3f} against the {plan.precision.value} dense peak are shown capped "
                f"at 1 ({' and '.join(why)}); tflops_per_gpu gives the rate")
        mfu, hfu = min(mfu, 1.0), 1.0
    tokens_per_s = tokens_per_iter / T
    days = hours = None
    if tokens is not None:
        seconds = tokens / tokens_per_s
        days = seconds / SECONDS_PER_DAY
        hours = seconds / 3600 * job.num_gpus
    validation = validation_note(job, model_flops / (T * peak))
    return Estimate(
        iteration_time_s=T,
        mfu=mfu,
        hfu=hfu,
        utilisation_note=note,
        tokens_per_s=tokens_per_s,
        tflops_per_gpu=model_flops / T / job.num_gpus / 1e12,
        model_flops_per_iteration=model_flops,
        hardware_flops_per_iteration=hw_flops,
        breakdown=breakdown,
        critical_stage=crit,
        layer=_times_out(layers[job.model.is_moe and 2 * job.model.num_moe_layers >= job.model.num_layers]),
        moe_layer=_times_out(layers[True]) if job.model.is_moe else None,
        expert_dispatch_s=dispatch if job.model.is_moe else None,
        moe_load_imbalance=job.model.moe_load_imbalance if job.model.is_moe else None,
        memory=mem,
        num_gpus=job.num_gpus,
        tokens=tokens,
        training_days=days,
        gpu_hours=hours,
        outside_validated_range=bool(validation),
        validation_note=validation,
    )


def _times_out(lt: LayerTimes) -> LayerTimesOut:
    return LayerTimesOut(forward_s=lt.forward_s, backward_s=lt.backward_s, recompute_s=lt.recompute_s)


def validation_note(job: Job, mfu: float) -> str:
    """Why a prediction lies outside the range the model was checked in ('' when it does not). The ceiling is
    the best MFU of the measured runs in the repository on this GPU, as the band's regime counts it (one number
    wherever it is printed); a GPU without measured runs falls back on its spec's best published run."""
    gpu = job.cluster.gpu
    measured = band_table()["gpus"].get(gpu.name)
    best = measured["max_measured_mfu"] if measured is not None else gpu.best_published_mfu
    if best is None:
        return (f"no published end-to-end run on {gpu.name} is in the repository, so this answer is not validated "
                "end to end; calibrate and validate a run before trusting it")
    if mfu > best:
        return (f"MFU {mfu:.1%} is above the best measured run on {gpu.name} ({best:.1%}): "
                "outside the range the model was validated in")
    return ""
